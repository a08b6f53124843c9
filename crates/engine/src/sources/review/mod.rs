//! The review loop: review comments, requested changes and red checks on the pull request a
//! job opened come back to the same job, and the same conversation answers them.
//!
//! - Watching is part of the job's source's turn ([`watch::pass`]): each open pull request
//!   DevPilot opened is read with conditional requests (an unchanged one costs three 304s,
//!   which GitHub does not count against the rate limit), every piece of feedback is kept
//!   once per key, and a burst whose quiet period has passed reopens the completed job as a
//!   follow-up (the store's conditional UPDATE), or hands the pull request back at a cap.
//! - What counts ([`classify`]): a "changes requested" review and its inline comments, a
//!   comment from someone with write access that addresses DevPilot (or any such comment
//!   when the repo says so), a failing check run or commit status on the head; for a Linear
//!   job, a comment on its Linear issue after the pull request opened, from a member of the
//!   workspace, that addresses DevPilot the same way ([`linear`]). Nobody else's words reach
//!   an agent: they are kept as ignored, without their text.
//! - The follow-up is a new attempt of the same job: its runner takes the feedback fenced by
//!   its claim and asks the resumed conversation to answer it ([`prompt`]).
//! - Its completion's outbox row answers where the feedback was given ([`answer`]): a reply
//!   in each inline comment's thread and one summary comment, each posted once.
//!
//! # Layout
//! - `settings.rs`: a repo's `[repos.NAME.review_loop]`.
//! - `classify.rs`: GitHub's reviews, comments and checks as feedback, or as ignored.
//! - `read.rs`: one conditional read of a pull request.
//! - `linear.rs`: a Linear job's issue comments as feedback, or as ignored.
//! - `watch.rs`: the turn's pass over its source's open pull requests.
//! - `prompt.rs`: the follow-up's prompt, the feedback quoted as data.
//! - `answer.rs`: the replies, the summary and the hand-back comment.

pub(super) mod answer;
mod classify;
mod linear;
pub mod prompt;
mod read;
pub mod settings;
pub mod watch;

pub use settings::ReviewLoop;
