//! The engine as an app embeds it: one [`Engine`] owns the settings, the database connection
//! and the orchestrator, restarts the orchestrator when settings change, and decides which
//! agent runs jobs. The tray app (and anything else with a UI) talks to this, never to SQL.
//!
//! Which agent:
//! - an agent command (settings, or `DEVPILOT_AGENT`): that command;
//! - none, on the embedded SQLite default: the built-in demo agent, so a new user sees the loop;
//! - none, on PostgreSQL (shared, real jobs): nothing is claimed and the state is
//!   [`MachineState::NeedsAgent`]. Real jobs are never completed by the demo.
//!
//! Environment overrides (for scripts and several profiles): `DEVPILOT_DATABASE_URL`,
//! `DEVPILOT_ORCHESTRATOR`, `DEVPILOT_AGENT` (split like a shell splits words).
//!
//! # Layout
//!
//! This file only declares the modules and re-exports their public items.
//!
//! - `engine`: the [`Engine`] struct, its constructors and accessors, [`DEMO_DURATION`].
//! - `lifecycle`: start, stop and restart; connecting in the background; the orchestrator.
//! - `jobs`: the user's commands (dispatch, pause, hand off, enqueue, job lists, cancel).
//! - `repos`: Settings → Repos: add (pushing, with a draft PR, by default), switches, health,
//!   a push check, remove; [`RepoView`].
//! - `handoff`: every hand-off, its verdict returned and published to the tray and window.
//! - `verdict`: [`HandOffVerdict`], in words: "Safe to close the lid", or which job's work
//!   stayed here and why.
//! - `configure`: applying settings from the window, the stored password, checking a login.
//! - `sleep`: what the engine does before the machine sleeps and after it wakes.
//! - `sources`: Settings → Sources: the tracker sources listed with their health, tested,
//!   saved (the API key to the keychain) and removed; [`SourceForm`], [`SourcesView`].
//! - [`guide`]: what the window's first-run guide asks the engine.
//! - `db_form`: [`DbForm`], the database part of the settings form, to and from a URL; [`DbMode`].
//! - `overrides`: [`Overrides`], the `DEVPILOT_*` variables that override the settings file.
//! - [`limits`]: the governor as the tray, the window and `devpilot status` tell it: each
//!   account's state, the day's spend against its cap, a job's spend by attempt.
//! - [`review`]: a job's review loop as its page and `devpilot show` tell it.
//! - `views`: [`JobDetail`], [`NewJob`] and [`Fleet`], what the window reads and sends.
//! - `keychain`: keychain calls, off the async workers and bounded in time.
//! - `tests`: the engine's and the database form's tests (the guide's stay in `guide`).

pub mod agent_health;
mod config_watch;
mod configure;
mod db_form;
mod engine;
pub mod guide;
mod handoff;
mod jobs;
mod keychain;
mod lifecycle;
pub mod limits;
mod outcome;
mod overrides;
mod repos;
pub mod review;
mod sleep;
mod sources;
mod verdict;
mod views;

#[cfg(test)]
mod tests;

// What the tray needs from the layers below, so `src-tauri` depends on this crate alone.
pub use devpilot_engine::{config, orchestrator, sandbox, seal, settings, span, timer};
pub use devpilot_store::error::{Error, Result};
pub use devpilot_store::{job, queue};

/// The app's status is the machine's: one [`Status`] in one `watch` channel, written by the
/// orchestrator while one runs, and by the engine for what only it knows (names, the database,
/// the agent kind) and while none runs.
pub use devpilot_engine::orchestrator::{AgentKind, Backend, MachineState, Status};

pub use db_form::{DbForm, DbMode};
/// How a tracker source is doing on this machine, as the status, the tray and the
/// notifications say it.
pub use devpilot_engine::sources::{HealthState, SourceHealth};
pub use engine::{Engine, DEMO_DURATION};
pub use jobs::Claiming;
pub use outcome::{outcome_line, Board, FleetWatch, Outcome, PR_WAIT};
pub use overrides::Overrides;
pub use repos::{RepoSwitches, RepoView};
pub use sources::{SourceForm, SourceView, SourcesView};
pub use verdict::{ConfigNote, HandOffVerdict, HandedOff};
pub use views::{Fleet, JobDetail, NewJob};
