//! The DevPilot dispatch engine: a shared queue of coding-agent jobs that a developer's
//! machines claim exactly once, with leases that expire, heartbeats that renew them, and a
//! fencing token on every write after the claim. No Tauri in here: the tray app and the
//! headless `devpilot` CLI both embed this crate.
//!
//! # Layout
//! - [`queue`]: every statement that touches the queue tables. The claim is there, and
//!   the job model's decisions: dedupe by key, the pick's order, backoff, park, cancel,
//!   retention.
//! - [`job`]: the job lifecycle ([`job::JobState`]: which states are claimable, live,
//!   finished) and the names of history events.
//! - [`orchestrator`]: the loop that polls, claims, heartbeats, sweeps, prunes and obeys the
//!   user (on/off, pause, hand-off, cancel, soft then hard stop), and publishes
//!   [`orchestrator::Event`]s.
//! - [`agent`]: starts an agent process per job (argv, payload on stdin and in a file),
//!   reads what it says back (exit status, result file) and stops it (SIGTERM, then SIGKILL).
//! - [`spec`]: the payload schema (title, prompt, repo, base, requires, url).
//! - [`preset`]: the built-in agents (claude, codex, aider, gemini) and their argv.
//! - [`worktree`]: a git worktree per job, and the hand-off that commits and pushes its work.
//! - [`git`]: DevPilot's own git calls, which run nothing an agent planted (hooks, fsmonitor,
//!   programs named in the repository's config) and name each worktree's gitdir.
//! - [`safe_fs`]: files written where an agent can reach (never through a link, never outside
//!   the worktree) and files an agent wrote (only small regular files, read without blocking).
//! - [`environ`]: the allowlists of what the processes DevPilot starts see of its environment.
//! - [`listen`]: LISTEN/NOTIFY hints on PostgreSQL (work now, work due in N ms, a cancel);
//!   polling stays the fallback. Its probe tells a direct connection from a transaction
//!   pooler's, where nothing may be prepared ([`Queue::pooled`]).
//! - [`db`]: URLs (with redaction, TLS files, pooled mode), pools, migrations, the
//!   unprepared statements of pooled mode, and driver errors in plain words.
//! - [`config`]: settings file, paths, durations.
//! - [`secrets`]: the database password in the OS keychain.
//! - [`seal`]: a runner takes its secrets out of its environment at start and is not
//!   dumpable, so a same-user agent cannot read them from `/proc`.
//! - [`cli`]: the `devpilot` command line.
//! - [`error`]: the one error type, with database errors classified by SQLSTATE.
//! - [`retry`]: the one retry policy (backoff for transient errors only).

pub mod agent;
pub mod app;
pub mod cli;
pub mod config;
pub mod db;
pub mod entity;
pub mod environ;
pub mod error;
pub mod git;
pub mod job;
pub mod listen;
pub mod orchestrator;
pub mod preset;
pub mod queue;
pub mod retry;
pub mod safe_fs;
pub mod seal;
pub mod secrets;
pub mod spec;
pub mod worktree;

pub use error::{Error, Result};
pub use queue::Queue;
