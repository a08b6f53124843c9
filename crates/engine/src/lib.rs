//! The DevPilot engine: the machine that polls, claims, heartbeats, runs agents in git
//! worktrees and hands off, over the store in `devpilot-store`. No Tauri in here: the tray
//! app (through `devpilot-app`) and the headless `devpilot` CLI both start it.
//!
//! # Layout
//! - [`orchestrator`]: the loop that polls, claims, heartbeats, sweeps, prunes and obeys the
//!   user (on/off, pause, hand-off, cancel, soft then hard stop), and publishes
//!   [`orchestrator::Event`]s.
//! - [`agent`]: starts an agent process per job (argv, payload on stdin and in a file),
//!   reads what it says back (exit status, result file) and stops it (SIGTERM, then SIGKILL).
//! - [`spawner`]: starts an agent process without copying the runner (a `CLONE_VM` child
//!   that dies with its runner), and waits for it through a pidfd.
//! - [`governor`]: what the fleet may spend on its agents and which account a usage limit
//!   holds: the `[limits]` settings, accounts, prices, a run's metered spend, the verdicts.
//! - [`preset`]: the built-in agents (claude, codex, aider, gemini) and their argv.
//! - [`worktree`]: a git worktree per job, and the hand-off that commits and pushes its work.
//! - [`git`]: DevPilot's own git calls, which run nothing an agent planted (hooks, fsmonitor,
//!   programs named in the repository's config) and name each worktree's gitdir.
//! - [`safe_fs`]: files written where an agent can reach (never through a link, never outside
//!   the worktree) and files an agent wrote (only small regular files, read without blocking).
//! - [`sandbox`]: every agent runs confined (bubblewrap): its worktree, its model's hosts
//!   and nothing else; the egress proxy, the init inside, and why a machine cannot confine.
//! - [`environ`]: the allowlists of what the processes DevPilot starts see of its environment.
//! - [`sources`]: trackers in, results back: Linear issues become jobs once (the fleet's
//!   intake turn), and each outcome reaches the issue through the outbox.
//! - [`settings`]: everything a user can set, its one table of defaults and its one check.
//! - [`control`]: the control socket through which `devpilot pause`, `resume` and `handoff`
//!   reach the machine running on this computer.
//! - [`span`]: durations and times as people type them.
//! - [`timer`]: an idle machine's long waits, each waking its thread once (a timerfd on Linux).
//! - [`config`]: where the app keeps its files, and the settings file (read, set aside, saved).
//! - [`database`]: which database this machine uses (environment, settings, keychain, default).
//! - [`secrets`]: the database password in the OS keychain.
//! - [`redact`]: the secrets this process knows, taken out of agent text before it leaves.
//! - [`seal`]: a runner takes its secrets out of its environment at start and is not
//!   dumpable, so a same-user agent cannot read them from `/proc`.

pub mod agent;
pub mod config;
pub mod control;
pub mod database;
pub mod environ;
pub mod git;
pub mod governor;
pub mod orchestrator;
pub mod preset;
pub mod redact;
pub mod safe_fs;
pub mod sandbox;
pub mod seal;
pub mod secrets;
pub mod settings;
pub mod sources;
pub mod span;
pub mod spawner;
pub mod timer;
pub mod worktree;
