//! How a source is doing on one machine, as the machine's status shows it, and what the
//! machine's sources service runs with.

use std::collections::BTreeMap;

use serde::Serialize;

use super::intake::PollReport;
use super::keys::KeyStore;
use super::settings::SourceSettings;
use crate::worktree::PrMode;

/// What the service runs with; sent again when the settings change.
#[derive(Clone, Debug)]
pub struct SourcesCfg {
    pub orchestrator_id: String,
    pub machine: String,
    pub sources: BTreeMap<String, SourceSettings>,
    /// The attempts a job added by the intake gets.
    pub max_attempts: i32,
    pub keys: KeyStore,
    /// Each repo's pull request mode, by repo name (a repo not named: draft).
    pub pull_requests: BTreeMap<String, PrMode>,
    /// Each repo's review loop, by repo name (a repo not named: the defaults).
    pub review_loops: BTreeMap<String, super::review::ReviewLoop>,
    /// Each repo's clone and remote on this machine, by repo name: a pull request is opened
    /// only where that remote points.
    pub remotes: BTreeMap<String, RepoRemote>,
}

/// A repo's clone on this machine and the remote its pushes go to (a name, or a URL).
#[derive(Clone, Debug)]
pub struct RepoRemote {
    pub clone: std::path::PathBuf,
    pub remote: String,
}

/// How a source is doing on this machine.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Not polled yet.
    #[default]
    Starting,
    Ok,
    /// No API key here: neither the keychain nor the tracker's variable has one.
    NoKey,
    /// The key was refused: this machine stopped using the source until the key changes.
    WrongKey,
    /// The tracker could not be reached; its outbox waits.
    Offline,
    /// Over the tracker's budget: resting until the reset.
    RateLimited,
    /// Something else went wrong (the message says what).
    Error,
}

/// One source on this machine, for the tray, the window and `devpilot status`.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct SourceHealth {
    pub name: String,
    pub kind: String,
    pub state: HealthState,
    pub message: Option<String>,
    /// Where the key came from: `keychain`, `keychain (imported from gh)`, `LINEAR_API_KEY`
    /// or `GITHUB_TOKEN`.
    pub key_from: Option<String>,
    /// What this machine's last turn did.
    pub last_poll: Option<PollReport>,
}
