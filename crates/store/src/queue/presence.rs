//! Machines' presence rows, and what a machine says it is doing ([`MachineStatus`]).

use std::time::Duration;

use sea_orm::FromQueryResult;
use sea_orm::{ColIdx, QueryResult, TryGetError, TryGetable, Value};
use serde::{Deserialize, Serialize};

use super::dialect::Sql;
use super::fence::Fence;
use super::pool::Queue;
use super::route::{names_json, Names, Route};
use super::rows::decode;
use crate::error::Result;

/// A machine's presence row, $1..$12 in the order of [`presence_values`]. A write replaces
/// the row only if it is a later write of the same run of the machine (`seq`), or a write of
/// another run (a restart): a write that timed out here but committed late can never undo
/// a later one, such as the final `stopped`.
pub(super) static PRESENCE_UPSERT: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO machines
                 (orchestrator_id, machine, last_seen_at, status, dispatch_enabled, paused_until,
                  running, concurrency, problem, repos, labels, run_id, seq)
             VALUES ($1, $2, {now}, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
             ON CONFLICT (orchestrator_id, machine) DO UPDATE SET
                 last_seen_at = excluded.last_seen_at, status = excluded.status,
                 dispatch_enabled = excluded.dispatch_enabled,
                 paused_until = excluded.paused_until, running = excluded.running,
                 concurrency = excluded.concurrency, problem = excluded.problem,
                 repos = excluded.repos, labels = excluded.labels,
                 run_id = excluded.run_id, seq = excluded.seq
             WHERE excluded.run_id IS NULL OR machines.run_id IS NULL OR machines.seq IS NULL
                OR machines.run_id <> excluded.run_id OR machines.seq < excluded.seq",
        now = d.now
    )
});

/// The machines of orchestrator $1.
static MACHINES: Sql = Sql::new(|d| {
    format!(
        "SELECT machine, status, last_seen_at, dispatch_enabled, paused_until, running,
                        concurrency, problem, repos, labels, {now} AS now
                   FROM machines WHERE orchestrator_id = $1 ORDER BY machine",
        now = d.now
    )
});

/// What a machine says it is doing, in its presence row (`machines.status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MachineStatus {
    /// Claiming, or working, or ready to.
    Online,
    /// Stopping: handing off what it holds.
    HandingOff,
    Paused,
    /// Dispatch switched off.
    Off,
    /// Something the user must fix keeps it from claiming.
    Blocked,
    Stopped,
    /// A status this version does not know (written by another version); never written.
    #[serde(other)]
    Unknown,
}

impl MachineStatus {
    pub const ALL: [MachineStatus; 7] = [
        MachineStatus::Online,
        MachineStatus::HandingOff,
        MachineStatus::Paused,
        MachineStatus::Off,
        MachineStatus::Blocked,
        MachineStatus::Stopped,
        MachineStatus::Unknown,
    ];

    /// The name stored in `machines.status` (and serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            MachineStatus::Online => "online",
            MachineStatus::HandingOff => "handing_off",
            MachineStatus::Paused => "paused",
            MachineStatus::Off => "off",
            MachineStatus::Blocked => "blocked",
            MachineStatus::Stopped => "stopped",
            MachineStatus::Unknown => "unknown",
        }
    }

    /// The status named `s` ([`MachineStatus::Unknown`] for a name this version does not know).
    pub fn parse(s: &str) -> MachineStatus {
        Self::ALL.into_iter().find(|st| st.as_str() == s).unwrap_or(MachineStatus::Unknown)
    }
}

impl std::fmt::Display for MachineStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryGetable for MachineStatus {
    fn try_get_by<I: ColIdx>(res: &QueryResult, index: I) -> std::result::Result<Self, TryGetError> {
        Ok(Self::parse(&String::try_get_by(res, index)?))
    }
}

impl From<MachineStatus> for Value {
    fn from(s: MachineStatus) -> Value {
        s.as_str().into()
    }
}

pub(super) fn presence_values(p: &Presence<'_>) -> Vec<Value> {
    vec![
        p.orchestrator_id.into(),
        p.machine.into(),
        p.status.into(),
        p.dispatch_enabled.into(),
        p.paused_until.into(),
        p.running.into(),
        p.concurrency.into(),
        p.problem.map(str::to_string).into(),
        p.route.and_then(|r| names_json(&r.repos)).into(),
        p.route.and_then(|r| names_json(&r.labels)).into(),
        p.order.map(|o| o.run).into(),
        p.order.map(|o| o.seq).into(),
    ]
}

/// What a machine reports about itself.
#[derive(Clone, Debug)]
pub struct Presence<'a> {
    pub orchestrator_id: &'a str,
    pub machine: &'a str,
    pub status: MachineStatus,
    pub dispatch_enabled: bool,
    pub paused_until: Option<i64>,
    pub running: i32,
    pub concurrency: i32,
    /// Why this machine is not claiming (e.g. its agent program is missing).
    pub problem: Option<&'a str>,
    /// What it can take (for `status`: which queued jobs no online machine can run).
    pub route: Option<&'a Route>,
    /// This run of the machine and the number of this write in it: a write lands only
    /// after the earlier ones of its run (see `PRESENCE_UPSERT`). `None`: always lands.
    pub order: Option<PresenceOrder>,
}

/// Where a presence write stands among a machine's writes: its run (one per start of the
/// machine) and its number in that run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PresenceOrder {
    /// This run of the machine (random at each start).
    pub run: i64,
    /// The number of this write in the run.
    pub seq: i64,
}

/// What a poll does besides claiming; see [`Queue::claim_next_with`].
#[derive(Clone, Debug, Default)]
pub struct PollExtras<'a> {
    /// Write this machine's presence row in the same statement.
    pub presence: Option<Presence<'a>>,
    /// Ask whether any of the orchestrator's leases is older than this.
    pub stale_after: Option<Duration>,
    /// What this machine may pick (none: only jobs with no repo and no labels).
    pub route: Option<&'a Route>,
    /// This machine's claims whose agents succeeded: completed in the same statement as
    /// the claim that takes their slots ([`Polled::completed`](super::Polled::completed)).
    pub done: &'a [Fence],
}

impl Queue {
    /// Upserts this machine's presence row.
    pub async fn heartbeat_machine(&self, p: &Presence<'_>) -> Result<()> {
        self.exec(self.sql(&PRESENCE_UPSERT), presence_values(p)).await?;
        Ok(())
    }

    /// The machines of an orchestrator.
    pub async fn machines(&self, orchestrator_id: &str) -> Result<Vec<MachineRow>> {
        decode(&self.query(self.sql(&MACHINES), vec![orchestrator_id.into()]).await?)
    }
}

/// A machine's presence row.
#[derive(Clone, Debug, Serialize, PartialEq, FromQueryResult)]
pub struct MachineRow {
    pub machine: String,
    pub status: MachineStatus,
    pub last_seen_at: i64,
    pub dispatch_enabled: bool,
    pub paused_until: Option<i64>,
    pub running: i32,
    pub concurrency: i32,
    /// Why this machine is not claiming, if something keeps it from it.
    pub problem: Option<String>,
    pub repos: Names,
    pub labels: Names,
    pub now: i64,
}

impl MachineRow {
    /// What this machine said it can take.
    pub fn route(&self) -> Route {
        Route {
            repos: self.repos.to_vec(),
            labels: self.labels.to_vec(),
            tracker_repos: None,
            governor: Default::default(),
        }
    }

    /// Whether it is there to take work: seen in the last 15 minutes and not stopped.
    pub fn online(&self) -> bool {
        self.status != MachineStatus::Stopped && self.now - self.last_seen_at < 15 * 60 * 1000
    }
}

impl Queue {
    /// Why no online machine can take `job` now, if it waits to be claimed and none can.
    pub async fn why_unroutable(&self, job: &super::rows::JobRow) -> Result<Option<String>> {
        if job.claimed_at.is_some() || !crate::job::JobState::CLAIMABLE.contains(&job.state) {
            return Ok(None);
        }
        let machines = self.machines(&job.orchestrator_id).await?;
        Ok(unroutable(job.repo.as_deref(), &job.requires, &machines))
    }
}

/// Why no online machine can take a job of `repo` needing `requires` (`None`: one can).
pub fn unroutable(repo: Option<&str>, requires: &[String], machines: &[MachineRow]) -> Option<String> {
    let online: Vec<&MachineRow> = machines.iter().filter(|m| m.online()).collect();
    if online.is_empty() {
        return (repo.is_some() || !requires.is_empty()).then(|| "no machine is online".to_string());
    }
    let reasons: Vec<String> = online.iter().filter_map(|m| m.route().refuses(repo, requires)).collect();
    if reasons.len() < online.len() {
        return None;
    }
    // Name the first reason: every online machine refuses it for one.
    Some(format!("no online machine has {}", reasons[0]))
}
