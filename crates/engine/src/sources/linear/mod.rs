//! Linear: the documents DevPilot sends (and nothing else), the client that sends them, the
//! issues a turn reads, an issue as a job, and a delivery's calls.
//!
//! # Layout
//! - `documents.rs`: every GraphQL document, validated against Linear's published schema
//!   in a unit test.
//! - `client.rs`: [`LinearClient`], one bounded POST per call, rate-limit headers read, and
//!   errors sorted by what to do next ([`TrackerError`]).
//! - `issues.rs`: the filter of a turn, every page of its answer, [`Issue`].
//! - `map.rs`: an issue as a job: key, payload, priority, repo, requires, branch.
//! - `deliver.rs`: an outbox row's calls: comment (once), state moves, link.
//! - `approval.rs`: who applied the source's label, from the issue's history, and whether the
//!   text changed after.
//! - `comments.rs`: an issue's comments since a time, with who wrote each (the review loop's
//!   read of a Linear job's issue).

mod approval;
mod client;
mod comments;
mod deliver;
pub mod documents;
mod issues;
mod map;

pub use crate::sources::text::prompt_of;
pub use approval::approval;
pub use client::{install_crypto_provider, LinearClient, RateLimit, TrackerError};
pub use comments::{comments_since, BotActor, CommentUser, Comments, ExternalUser, IssueComment};
pub use deliver::{attach, deliver, own_issue, IssueRef};
pub use issues::{filter, read_changed, Issue, Read};
pub use map::{branch_of, key_of, payload_of, priority_of, repo_of, requires_of, same_task, version_of};
