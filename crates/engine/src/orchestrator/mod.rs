//! The orchestrator: one machine's side of the queue, built from parts that each have one
//! job and explicit states:
//!
//! - the **poller** ([`poller`]) claims work into free slots, waking on NOTIFY or its timer;
//! - the **lease keeper** ([`lease`]) renews by [`Fence`](devpilot_store::queue::Fence), keeps a local deadline per
//!   job on a clock that counts suspended time, and declares losses;
//! - the **runner** ([`runner`]) starts and stops agents and reports their outcomes;
//! - **maintenance** ([`maintenance`]) runs the throttled sweep and retention off the poll
//!   path;
//! - the **sources service** ([`sources`]) takes the tracker sources' intake turns and
//!   delivers their outbox, asked by the poll path (see [`crate::sources`]).
//!
//! Around them: [`handle`] (the way in), [`status`] (what a machine says about itself),
//! [`stats`] (its counters), [`config`] (what it runs with), [`clock`] (the
//! suspend-aware clock of the deadlines), [`confine`] (whether a job's agent runs confined), [`governed`] (the governor
//! of usage limits and spend on this machine)
//! and [`verdict`] (what a hand-off did, in words).
//!
//! The `Machine` task ([`machine`]) owns the user's wishes (on/off, pause, hand-off, stop),
//! the running slots and the published [`Status`]; [`spawn`](mod@spawn) wires the parts
//! together around it ([`start`] connects and starts a machine, for the tray and the CLI alike), and its handlers live in [`wishes`], [`slots`] and [`presence`].
//! Everything that talks to the database runs in tasks it spawns and reports back over
//! channels, so a slow or unreachable database never stops it from answering a pause, a
//! hand-off or a stop.
//!
//! Stopping is structured: every job, poll and presence write is a task of a
//! [`TaskTracker`](tokio_util::task::TaskTracker); a hard stop cancels the root
//! [`CancellationToken`](tokio_util::sync::CancellationToken) that every job's cancel
//! descends from; and a stop (or a hand-off) is over when its tracker has no task left.

mod bounds;
mod clock;
mod config;
pub mod confine;
mod conversation;
mod follow_up;
pub mod governed;
mod handle;
mod job;
mod lease;
mod machine;
mod maintenance;
mod poller;
mod presence;
mod report;
mod runner;
mod scratch;
mod slots;
mod sources;
mod spawn;
mod start;
mod stats;
mod status;
pub mod verdict;
mod watchdog;
mod wishes;

pub use self::clock::{BootClock, Clock};
pub use self::config::{payload_dir, scratch_root, worktree_root, ClaimMode, RunConfig, CANCEL_GRACE, SWEEP_EVERY};
pub use self::handle::{Handle, StopMode};
pub use self::lease::{call_bound, Timing};
pub use self::maintenance::{file_retention, prune_files};
pub use self::spawn::{spawn, spawn_into};
pub use self::start::{connect, machine_pool, start_machine, Wiring};
pub use self::stats::Stats;
pub use self::status::{
    AgentKind, Backend, Carried, Event, JobRef, LossReason, MachineState, PresenceFields, RunningJob, Status,
};
pub use self::watchdog::Watchdog;
