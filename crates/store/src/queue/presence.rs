//! Machines' presence rows.

use std::time::Duration;

use sea_orm::Value;

use super::route::{names_json, names_of, Route};
use super::rows::MachineRow;
use super::Queue;
use crate::error::Result;

/// A machine's presence row, $1..$12 in the order of [`presence_values`]. A write replaces
/// the row only if it is a later write of the same run of the machine (`seq`), or a write of
/// another run (a restart): a write that timed out here but committed late can never undo
/// a later one, such as the final `stopped`.
pub(super) const PRESENCE_UPSERT: &str = "INSERT INTO machines
                 (orchestrator_id, machine, last_seen_at, status, dispatch_enabled, paused_until,
                  running, concurrency, problem, repos, labels, run_id, seq)
             VALUES ($1, $2, {NOW}, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
             ON CONFLICT (orchestrator_id, machine) DO UPDATE SET
                 last_seen_at = excluded.last_seen_at, status = excluded.status,
                 dispatch_enabled = excluded.dispatch_enabled,
                 paused_until = excluded.paused_until, running = excluded.running,
                 concurrency = excluded.concurrency, problem = excluded.problem,
                 repos = excluded.repos, labels = excluded.labels,
                 run_id = excluded.run_id, seq = excluded.seq
             WHERE excluded.run_id IS NULL OR machines.run_id IS NULL OR machines.seq IS NULL
                OR machines.run_id <> excluded.run_id OR machines.seq < excluded.seq";

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
        p.order.map(|(run, _)| run).into(),
        p.order.map(|(_, seq)| seq).into(),
    ]
}

/// What a machine reports about itself.
#[derive(Clone, Debug)]
pub struct Presence<'a> {
    pub orchestrator_id: &'a str,
    pub machine: &'a str,
    pub status: &'a str,
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
    pub order: Option<(i64, i64)>,
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
}

impl Queue {
    /// Upserts this machine's presence row.
    pub async fn heartbeat_machine(&self, p: &Presence<'_>) -> Result<()> {
        self.exec(PRESENCE_UPSERT, presence_values(p)).await?;
        Ok(())
    }

    /// The machines of an orchestrator.
    pub async fn machines(&self, orchestrator_id: &str) -> Result<Vec<MachineRow>> {
        let rows = self
            .query(
                "SELECT machine, status, last_seen_at, dispatch_enabled, paused_until, running,
                        concurrency, problem, repos, labels, {NOW} AS now
                   FROM machines WHERE orchestrator_id = $1 ORDER BY machine",
                vec![orchestrator_id.into()],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(MachineRow {
                    machine: r.try_get("", "machine")?,
                    status: r.try_get("", "status")?,
                    last_seen_at: r.try_get("", "last_seen_at")?,
                    dispatch_enabled: r.try_get("", "dispatch_enabled")?,
                    paused_until: r.try_get("", "paused_until")?,
                    running: r.try_get("", "running")?,
                    concurrency: r.try_get("", "concurrency")?,
                    problem: r.try_get("", "problem")?,
                    repos: names_of(r.try_get("", "repos")?),
                    labels: names_of(r.try_get("", "labels")?),
                    now: r.try_get("", "now")?,
                })
            })
            .collect()
    }
}
