//! Trackers in, results back: issues from a tracker (Linear) become jobs exactly once, and
//! every reportable outcome reaches the issue, whichever machine is awake.
//!
//! The fleet polls the tracker the way it sweeps: a laptop has no inbound address, and a
//! webhook missed while it slept is gone. Any online machine with the source configured may
//! take the source's intake turn (one conditional UPDATE on its `sources` row: zero rows
//! means another machine has it), so the whole fleet polls once per interval. Each issue
//! becomes a job through the keyed insert (`linear:ENG-7`), so two machines that poll at
//! once add one job. Each reportable state change writes its outbox row with itself (see
//! the store's `Queue::change`), and any machine with the source's key delivers it.
//!
//! # Layout
//! - [`settings`]: a source as the settings file holds it (`[sources.NAME]`), checked.
//! - [`keys`]: where the API key comes from (`LINEAR_API_KEY`, else the keychain).
//! - [`linear`]: Linear's documents, client, issues, mapping and delivery calls.
//! - [`intake`]: one intake turn: take it, read, add/update/cancel jobs, end it fenced.
//! - [`deliver`]: the outbox, row by row, fenced by each delivery's token.
//! - `render`: what each event says on the issue.
//! - `health`: how a source is doing on a machine ([`SourceHealth`]), and [`SourcesCfg`].
//! - [`connection`]: the connection test Settings → Sources runs.
//!
//! The machine's sources service (the intake turns and deliveries on a task of their own,
//! asked by the poll path) is `orchestrator::sources`: it is part of the machine, and
//! nothing here knows the machine.

pub mod connection;
pub mod deliver;
mod ending;
mod error;
pub mod github;
mod health;
pub mod intake;
pub mod keys;
pub mod linear;
mod pull;
mod render;
pub mod settings;
#[cfg(test)]
mod tests;
pub mod tracker;

pub use deliver::DELIVERY_LEASE;
pub use error::TrackerError;
pub use health::{HealthState, SourceHealth, SourcesCfg};
pub use intake::{poll, Bound, IntakeError, PollReport, Tried};
pub use keys::{ApiKey, KeyStore};
pub use settings::{ReportSettings, SourceKind, SourceSettings};
pub use tracker::TrackerClient;
