//! The DevPilot dispatch store: every statement that touches the queue tables, on a shared
//! PostgreSQL or an embedded SQLite file. If anyone asks "where is the claim?", the answer is
//! in here.
//!
//! # Layout
//! - [`queue`]: every statement that touches the queue tables. The claim is there, and
//!   the job model's decisions: dedupe by key, the pick's order, backoff, park, cancel,
//!   retention.
//! - [`job`]: the job lifecycle ([`job::JobState`]: which states are claimable, live,
//!   finished) and the names of history events.
//! - [`spec`]: the payload schema (title, prompt, repo, base, requires, url) and its caps.
//! - [`listen`]: LISTEN/NOTIFY hints on PostgreSQL (work now, work due in N ms, a cancel);
//!   polling stays the fallback. Its probe tells a direct connection from a transaction
//!   pooler's, where nothing may be prepared ([`Queue::pooled`]).
//! - [`db`]: URLs (with redaction, TLS files, pooled mode), pools, migrations, the
//!   unprepared statements of pooled mode, and driver errors in plain words.
//! - [`error`]: the one error type, with database errors classified by SQLSTATE.
//! - [`retry`]: the one retry policy (backoff for transient errors only).
//! - [`redact`]: the values of a machine's secrets, replaced in text before it is stored.

pub mod db;
pub mod error;
pub mod job;
pub mod listen;
pub mod queue;
pub mod redact;
pub mod retry;
pub mod spec;

pub use error::{Error, Result};
pub use queue::Queue;
