//! Trackers in, results back: issues from a tracker (Linear, GitHub) become jobs exactly
//! once, every reportable outcome reaches the issue, whichever machine is awake, and a
//! finished job's pushed branch becomes its pull request.
//!
//! The fleet polls the tracker the way it sweeps: a laptop has no inbound address, and a
//! webhook missed while it slept is gone. Any online machine with the source configured may
//! take the source's intake turn (one conditional UPDATE on its `sources` row: zero rows
//! means another machine has it), so the whole fleet polls once per interval. Each issue
//! becomes a job through the keyed insert (`linear:ENG-7`, `github:acme/webapp#7`), so two machines that poll at
//! once add one job. Each reportable state change writes its outbox row with itself (see
//! the store's `Queue::change`), and any machine with the source's key delivers it.
//!
//! # Layout
//! - [`settings`]: a source as the settings file holds it (`[sources.NAME]`), checked.
//! - [`keys`]: where a key or token comes from (its variable, else the keychain; gh's).
//! - [`linear`], [`github`]: each tracker's requests, client, issues, mapping and delivery.
//! - [`tracker`]: a source's client whichever the kind, and a turn's read as [`tracker::Item`]s.
//! - [`approval`]: the label pins the text: who applied it, when, and whether the issue
//!   changed after it.
//! - [`intake`]: one intake turn: take it, read, add/update/cancel jobs, end it fenced.
//! - `bind`: a delivery acts only on its own source's issue, repo and remote.
//! - [`deliver`]: the outbox, row by row, fenced by each delivery's token; `ending`: how a
//!   row ends; `pull`: the pull request row a completion leaves.
//! - [`maps`]: which repo an unmapped GitHub source's jobs run in (the clone whose remote
//!   is the repository, else one named after it, which the job waits for).
//! - `mac`: the orchestrator's key signs what a machine leaves on a tracker (a comment's
//!   marker, a Linear comment's id), so nobody on the tracker can forge either.
//! - `http`: the one HTTP client builder (bounded, no redirects, the credential sensitive).
//! - `error`: [`TrackerError`], sorted by what the caller does next, naming the tracker.
//! - `render`: what each event says on the issue.
//! - [`review`]: the review loop: a completed job's pull request watched in its source's
//!   turn, feedback reopening the same job as a follow-up, and the answers on the PR.
//! - `health`: how a source is doing on a machine ([`SourceHealth`]), and [`SourcesCfg`].
//! - `text`: an issue's title, prompt and `requires`, alike for every tracker.
//! - [`connection`]: the connection test Settings → Sources runs.
//!
//! The machine's sources service (the intake turns and deliveries on a task of their own,
//! asked by the poll path) is `orchestrator::sources`: it is part of the machine, and
//! nothing here knows the machine.

pub mod approval;
mod bind;
pub mod connection;
pub mod deliver;
mod ending;
mod error;
pub mod github;
mod health;
mod http;
pub mod intake;
pub mod keys;
pub mod linear;
pub mod mac;
pub mod maps;
mod pull;
mod render;
pub mod review;
pub mod settings;
#[cfg(test)]
mod tests;
mod text;
pub mod tracker;

pub use deliver::DELIVERY_LEASE;
pub use error::TrackerError;
pub use health::{HealthState, RepoRemote, SourceHealth, SourcesCfg};
pub use intake::{poll, Bound, IntakeError, PollReport, Taker, Tried};
pub use keys::{ApiKey, KeyStore};
pub use settings::{ReportSettings, SourceKind, SourceSettings};
pub use tracker::TrackerClient;
