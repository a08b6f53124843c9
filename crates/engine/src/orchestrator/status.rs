//! What a machine says about itself: the one [`Status`] of its `watch` channel, and the
//! [`Event`]s it broadcasts to the tray, the notifications and the CLI.

use serde::Serialize;

use devpilot_store::db::DbUrl;
use devpilot_store::queue::{Claim, Fence, MachineStatus, Presence, PresenceOrder, Route};

/// A job, as events and the status name it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct JobRef {
    pub id: i64,
    pub title: Option<String>,
    pub attempt: i32,
    pub token: i64,
    /// The tracker issue it came from (the payload's `source.url`), if any: the completion
    /// notification opens it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issue_url: Option<String>,
}

impl JobRef {
    pub(super) fn of(c: &Claim) -> Self {
        let issue_url = c.payload.pointer("/source/url").and_then(|u| u.as_str()).map(str::to_string);
        Self { id: c.fence.job, title: c.title.clone(), attempt: c.attempt, token: c.fence.token, issue_url }
    }

    /// The claim this names.
    pub fn fence(&self) -> Fence {
        Fence { job: self.id, token: self.token }
    }

    /// "title (#id)" or "#id".
    pub fn label(&self) -> String {
        match &self.title {
            Some(t) => format!("{t} (#{})", self.id),
            None => format!("#{}", self.id),
        }
    }
}

/// What a hand-off did with a job's work in progress: what its verdict says.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Carried {
    /// Pushed to `branch` on the remote: the next machine starts from it.
    Pushed { branch: String },
    /// Nothing to carry: no worktree, or nothing in it the remote lacks.
    Nothing,
    /// Not pushed (`why`): the work stays on this machine, pushed when it can.
    Stayed { why: String },
}

impl Carried {
    pub fn of(h: Option<&crate::worktree::HandOff>) -> Self {
        match h {
            Some(crate::worktree::HandOff { pushed: Some(branch), .. }) => Carried::Pushed { branch: branch.clone() },
            Some(crate::worktree::HandOff { stayed: Some(why), .. }) => Carried::Stayed { why: why.clone() },
            _ => Carried::Nothing,
        }
    }
}

/// Why this machine lost a job.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LossReason {
    /// A renewal found the lease gone (swept and maybe re-claimed elsewhere).
    LeaseExpired,
    /// No renewal was confirmed before the local deadline (the network is gone, or the
    /// machine slept): the agent was stopped before anyone else could start one.
    DeadlinePassed,
    /// The agent finished but the fenced completion was rejected.
    CompletionRejected,
}

/// What the orchestrator tells the tray, the notifications and the CLI.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Claimed {
        job: JobRef,
    },
    LostRace {
        job_id: i64,
    },
    HeartbeatFailed {
        error: String,
    },
    LeaseLost {
        job: JobRef,
        reason: LossReason,
    },
    Completed {
        job: JobRef,
        /// What the agent said it did, and a link (its result file).
        summary: Option<String>,
        url: Option<String>,
    },
    /// A user cancelled the job while it ran here; the agent was stopped.
    Cancelled {
        job: JobRef,
    },
    /// A running job passed the warning share of a spend cap (said once).
    SpendWarning {
        job: JobRef,
        text: String,
    },
    /// The agent asked to be tried later (exit 75); the attempt did not count.
    Parked {
        job: JobRef,
        /// Claimable again from this database time.
        until_unix_ms: i64,
    },
    Failed {
        job: JobRef,
        error: String,
        dead: bool,
    },
    /// Handed off: the claim released, with what became of the work in progress.
    Released {
        job: JobRef,
        carried: Carried,
    },
    AgentError {
        job: JobRef,
        error: String,
    },
    /// The agent cannot run here: the machine stopped claiming (said once).
    AgentUnavailable {
        error: String,
    },
    /// The agent is back: the machine claims again.
    AgentAvailable,
    Swept {
        released: usize,
        dead: usize,
    },
    SweepFailed {
        error: String,
    },
    DatabaseOffline {
        error: String,
    },
    /// A tracker source went wrong on this machine (a refused or missing key, the tracker
    /// unreachable, a rate limit): said once, on the way in.
    SourceTrouble {
        source: String,
        state: crate::sources::HealthState,
        message: String,
    },
    /// The source works again.
    SourceOk {
        source: String,
    },
    DatabaseOnline,
    StateChanged {
        state: MachineState,
    },
    Stopped,
}

/// What this machine (and the app around it) is doing, in one word.
#[derive(Clone, Copy, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MachineState {
    /// The app is still connecting.
    #[default]
    Starting,
    Idle,
    Working,
    Paused,
    Off,
    Offline,
    /// Something the user must fix: the agent program, the keychain, the config file.
    Error,
    /// PostgreSQL with no agent command: nothing is claimed.
    NeedsAgent,
    Stopped,
}

impl MachineState {
    pub fn as_str(self) -> &'static str {
        match self {
            MachineState::Starting => "starting",
            MachineState::Idle => "idle",
            MachineState::Working => "working",
            MachineState::Paused => "paused",
            MachineState::Off => "off",
            MachineState::Offline => "offline",
            MachineState::Error => "error",
            MachineState::NeedsAgent => "needs_agent",
            MachineState::Stopped => "stopped",
        }
    }
}

/// Which agent runs jobs here.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum AgentKind {
    Demo,
    Command,
    /// A built-in preset (claude, codex, aider, gemini).
    Preset,
    #[default]
    None,
}

/// Which kind of database the queue is in, as [`Status::backend`] says it: "sqlite" or "postgres".
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The embedded default, or a sqlite:// file.
    Sqlite,
    /// A PostgreSQL server, which machines may share.
    Postgres,
}

impl Backend {
    /// The JSON name: "sqlite" or "postgres".
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }

    /// The embedded or file database rather than a PostgreSQL server.
    pub fn is_sqlite(self) -> bool {
        self == Backend::Sqlite
    }
}

impl From<&DbUrl> for Backend {
    fn from(url: &DbUrl) -> Self {
        if url.is_sqlite() {
            Backend::Sqlite
        } else {
            Backend::Postgres
        }
    }
}

/// [`Status::backend`] in JSON: the backend's name, or "" while no database URL is known.
fn backend_or_empty<S: serde::Serializer>(backend: &Option<Backend>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(backend.map_or("", Backend::as_str))
}

/// A job running here.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunningJob {
    pub job: JobRef,
    /// Local wall clock, for display only; leases use the database clock.
    pub started_unix_ms: u64,
}

/// The one status of a machine, in one `watch` channel. The orchestrator writes what it
/// knows (state, dispatch, pause, running jobs, the database's health, a problem); the app
/// that embeds it writes who and where (names, database, agent kind, overrides) and the
/// state while no orchestrator runs.
#[derive(Clone, Debug, Serialize, PartialEq, Default)]
pub struct Status {
    pub state: MachineState,
    /// What is wrong and what to do, when the state needs explaining.
    pub message: Option<String>,
    pub orchestrator_id: String,
    pub machine: String,
    /// `host:port/db` or the SQLite path; never a password.
    pub database: String,
    /// `None` until the database URL is known; "" in JSON then, as before it was typed.
    #[serde(serialize_with = "backend_or_empty")]
    pub backend: Option<Backend>,
    pub agent: AgentKind,
    pub dispatch_enabled: bool,
    pub paused: bool,
    /// Seconds until an automatic resume; `None` while paused means "until resumed".
    pub paused_for_secs: Option<u64>,
    /// When that automatic resume is due, by this machine's wall clock (ms since the epoch,
    /// whole seconds), for "paused until 14:30". Derived from the remaining time at each
    /// publish, so it follows the pause's real end (the timer is monotonic: it does not run
    /// while the machine sleeps) and changes only when the pause does.
    pub paused_until_unix_ms: Option<u64>,
    pub running: Vec<RunningJob>,
    pub db_online: bool,
    /// How each tracker source is doing on this machine (a refused key, offline, …).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<crate::sources::SourceHealth>,
    /// The environment variables overriding the settings file.
    pub overrides: Vec<String>,
    /// Where agents run unconfined here ([`super::confine::warnings`]): none when every
    /// agent runs confined.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sandbox: Vec<super::confine::Warning>,
}

/// A presence row without its names, so it can travel into a spawned task.
#[derive(Clone, Copy, Debug)]
pub struct PresenceFields {
    pub(super) status: MachineStatus,
    pub(super) dispatch_enabled: bool,
    pub(super) paused_until: Option<i64>,
    pub(super) running: i32,
    pub(super) concurrency: i32,
    /// See [`Presence::order`].
    pub(super) order: PresenceOrder,
}

impl PresenceFields {
    pub(super) fn presence<'a>(&self, orchestrator_id: &'a str, machine: &'a str, route: &'a Route) -> Presence<'a> {
        Presence {
            route: Some(route),
            orchestrator_id,
            machine,
            status: self.status,
            dispatch_enabled: self.dispatch_enabled,
            paused_until: self.paused_until,
            running: self.running,
            concurrency: self.concurrency,
            problem: None,
            order: Some(self.order),
        }
    }
}
