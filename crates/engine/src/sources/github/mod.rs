//! GitHub: the requests DevPilot sends (and nothing else), the client that sends them, the
//! issues a turn reads, an issue as a job, a delivery's calls, and the pull request a
//! finished job opens.
//!
//! # Layout
//! - `calls.rs`: every request ([`Call`]), checked against GitHub's published description in
//!   a test of the harness.
//! - `client.rs`: [`GithubClient`], one bounded call each, the token as `Bearer`, `ETag`s,
//!   rate-limit headers, and errors that name the repo and what the token lacks.
//! - `approval.rs`: who applied the source's label (the `labeled` events), whether they may
//!   write, and whether the issue changed after.
//! - `issues.rs`: the query of a turn, every page of its answer (pull requests dropped).
//! - `map.rs`: an issue as a job: key, payload, priority, repo, requires, branch.
//! - `deliver.rs`: an outbox row's comment (its marker, signed for the comment's author and
//!   looked for before a retry posts again) and the "working" label.
//! - `pulls.rs`: which remotes are GitHub's, and the pull request a completion opens (an
//!   open one with the same head is reused).

mod approval;
pub mod calls;
mod client;
mod deliver;
mod issues;
mod map;
pub mod pulls;

pub use approval::{approval, Writers};
pub use calls::Call;
pub use client::{Answer, GithubClient, API_VERSION};
pub use deliver::{deliver, post_once, IssueRef, Try};
pub use issues::{query_of, read_changed, GhIssue, Read};
pub use map::{branch_of, key_of, payload_of, priority_of};
