//! Housekeeping: the sweep of expired leases, and the pruning of finished work.

use std::time::Duration;

use sea_orm::{ConnectionTrait, FromQueryResult, TransactionTrait, Value};

use super::dialect::{kind_of_end, unless_cancelled, Dialect, Sql};
use super::history::{Detail, History};
use super::options::{millis, Retention};
use super::pool::Queue;
use super::rows::{decode, first_i64, Pruned, Swept};
use crate::error::Result;
use crate::job::{event, JobState};

/// Narrows a statement of every orchestrator to one, whose id is parameter $2.
const SCOPE_2: &str = "AND orchestrator_id = $2";
/// Likewise, with the id as parameter $5.
const SCOPE_5: &str = "AND orchestrator_id = $5";

/// The sweep of the leases with no sign of life for $1 ms, of every orchestrator or of the
/// one `scope` names.
fn sweep_sql(d: &Dialect, scope: &str) -> String {
    let finished = "(cancel_requested_at IS NOT NULL OR attempts >= max_attempts)";
    let dead = "(cancel_requested_at IS NULL AND attempts >= max_attempts)";
    format!(
        "UPDATE dispatch_queue
            SET state = {ends},
                dead_at = CASE WHEN {dead} THEN {now} ELSE NULL END,
                finished_at = CASE WHEN {finished} THEN {now} ELSE NULL END,
                claimed_at = NULL,
                last_error = 'lease expired: no heartbeat from ' || COALESCE(claimed_by, '?')
          WHERE {running}
            AND COALESCE(heartbeat_at, claimed_at) < {now} - $1
            {scope}
         RETURNING id, orchestrator_id, claimed_by, claim_token, state, {now} AS at",
        ends = unless_cancelled("CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'queued' END"),
        now = d.now,
        running = d.running,
    )
}

/// [`sweep_sql`] of every orchestrator, and of orchestrator $2.
static SWEEP: [Sql; 2] = [Sql::new(|d| sweep_sql(d, "")), Sql::new(|d| sweep_sql(d, SCOPE_2))];

/// The machines not seen for $1 ms, of every orchestrator, and of orchestrator $2.
static PRUNE_MACHINES: [Sql; 2] =
    [Sql::new(|d| prune_machines_sql(d, "")), Sql::new(|d| prune_machines_sql(d, SCOPE_2))];

fn prune_machines_sql(d: &Dialect, scope: &str) -> String {
    format!("DELETE FROM machines WHERE last_seen_at < {now} - $1 {scope}", now = d.now)
}

/// One batch of the prune's pick: finished jobs, completed and cancelled ones finished more
/// than $1 ms ago and dead ones more than $2 ms ago ($3 is the smaller), at most $4, of every
/// orchestrator or of the one `scope` names. `{finished} AND finished_at < now - $3` lets
/// `dispatch_queue_finished` find them. A tracker's job (`source_id`) is kept: it is the
/// intake's memory that its issue was taken, so the issue is never dispatched twice, and its
/// outbox rows (deleted with it) may still be waiting for a deliverer.
fn prune_pick(d: &Dialect, scope: &str) -> String {
    format!(
        "SELECT id FROM dispatch_queue
          WHERE {finished} AND finished_at < {now} - $3 AND source_id IS NULL {scope}
            AND ((state = 'dead' AND finished_at < {now} - $2)
                 OR (state <> 'dead' AND finished_at < {now} - $1))
          ORDER BY finished_at, id LIMIT $4",
        finished = d.finished,
        now = d.now,
    )
}

/// One batch of the prune on PostgreSQL: the jobs of [`prune_pick`], their history and log
/// tails, in one statement.
fn prune_postgres_sql(d: &Dialect, scope: &str) -> String {
    format!(
        "WITH gone AS (DELETE FROM dispatch_queue
                        WHERE id IN ({pick} FOR UPDATE SKIP LOCKED) AND {finished}
                       RETURNING id),
              events AS (DELETE FROM job_events WHERE job_id IN (SELECT id FROM gone)),
              logs AS (DELETE FROM job_logs WHERE job_id IN (SELECT id FROM gone))
         SELECT COUNT(*) AS n FROM gone",
        pick = prune_pick(d, scope),
        finished = d.finished,
    )
}

/// [`prune_postgres_sql`] of every orchestrator, and of orchestrator $5.
static PRUNE_POSTGRES: [Sql; 2] =
    [Sql::new(|d| prune_postgres_sql(d, "")), Sql::new(|d| prune_postgres_sql(d, SCOPE_5))];

/// One batch of the prune on SQLite: three deletes over the same pick (history, log tails,
/// then the jobs), of every orchestrator, and of orchestrator $5.
static PRUNE_SQLITE: [[Sql; 3]; 2] = [
    [
        Sql::new(|d| format!("DELETE FROM job_events WHERE job_id IN ({})", prune_pick(d, ""))),
        Sql::new(|d| format!("DELETE FROM job_logs WHERE job_id IN ({})", prune_pick(d, ""))),
        Sql::new(|d| format!("DELETE FROM dispatch_queue WHERE id IN ({}) AND {}", prune_pick(d, ""), d.finished)),
    ],
    [
        Sql::new(|d| format!("DELETE FROM job_events WHERE job_id IN ({})", prune_pick(d, SCOPE_5))),
        Sql::new(|d| format!("DELETE FROM job_logs WHERE job_id IN ({})", prune_pick(d, SCOPE_5))),
        Sql::new(|d| format!("DELETE FROM dispatch_queue WHERE id IN ({}) AND {}", prune_pick(d, SCOPE_5), d.finished)),
    ],
];

/// A claim the sweep ended, as its row says.
#[derive(FromQueryResult)]
struct SweptRow {
    id: i64,
    orchestrator_id: String,
    claimed_by: Option<String>,
    claim_token: i64,
    state: JobState,
    at: i64,
}

impl From<SweptRow> for Swept {
    fn from(r: SweptRow) -> Self {
        Swept {
            id: r.id,
            orchestrator_id: r.orchestrator_id,
            previous_holder: r.claimed_by,
            token: r.claim_token,
            dead: r.state == JobState::Dead,
            at: r.at,
        }
    }
}

impl Queue {
    /// Releases every claim whose last sign of life is older than `claim_timeout`; a job that
    /// has used its own `max_attempts` becomes dead instead, and one whose cancel was asked
    /// for becomes cancelled. The staleness test is in this same statement's WHERE, so a
    /// sweep can never touch a fresh claim or a finished job. `orchestrator_id = None` sweeps
    /// every orchestrator (the backstop command).
    pub async fn sweep(&self, orchestrator_id: Option<&str>, claim_timeout: Duration) -> Result<Vec<Swept>> {
        let mut values: Vec<Value> = vec![millis(claim_timeout).into()];
        values.extend(orchestrator_id.map(Value::from));
        let detail = format!("no heartbeat for {}", humantime::format_duration(claim_timeout));
        let rows = self
            .change(
                self.sql(&SWEEP[usize::from(orchestrator_id.is_some())]),
                values,
                &History { kind: &kind_of_end(event::SWEPT), machine: None, detail: Detail::Text(detail) },
            )
            .await?;
        let mut swept: Vec<Swept> = decode::<SweptRow>(&rows)?.into_iter().map(Swept::from).collect();
        swept.sort_by_key(|s| s.id);
        Ok(swept)
    }

    /// Deletes, in batches of at most `batch` jobs (one short statement each, so no lock is
    /// held long), the completed and cancelled jobs finished longer than `r.finished` ago and
    /// the dead ones finished longer than `r.dead` ago, each with its history; then the
    /// machines not seen for `r.machines`. Only finished jobs are touched, so a live job's
    /// history is never deleted. `orchestrator_id = None` prunes every orchestrator.
    pub async fn prune(&self, orchestrator_id: Option<&str>, r: &Retention, batch: u32) -> Result<Pruned> {
        let mut pruned = Pruned::default();
        loop {
            let batch = Ord::max(batch, 1);
            let n = self.prune_batch(orchestrator_id, r, batch).await?;
            pruned.jobs += n;
            if n < u64::from(batch) {
                break;
            }
        }
        let mut values: Vec<Value> = vec![millis(r.machines).into()];
        values.extend(orchestrator_id.map(Value::from));
        let sql = self.sql(&PRUNE_MACHINES[usize::from(orchestrator_id.is_some())]);
        pruned.machines = self.exec(sql, values).await?;
        Ok(pruned)
    }

    /// One batch of [`Queue::prune`]: how many jobs it deleted.
    async fn prune_batch(&self, orchestrator_id: Option<&str>, r: &Retention, batch: u32) -> Result<u64> {
        let (finished, dead) = (millis(r.finished), millis(r.dead));
        let mut values: Vec<Value> =
            vec![finished.into(), dead.into(), Ord::min(finished, dead).into(), i64::from(batch).into()];
        values.extend(orchestrator_id.map(Value::from));
        let scoped = usize::from(orchestrator_id.is_some());
        if self.dialect().postgres {
            let rows = self.query(self.sql(&PRUNE_POSTGRES[scoped]), values).await?;
            return Ok(u64::try_from(first_i64(&rows, "n")?).unwrap_or(0));
        }
        // SQLite: two DELETEs over the same pick in one transaction. Writing first (rather
        // than reading the ids, then deleting) takes the write lock at once, so a writer
        // committing in between cannot make the transaction's upgrade fail.
        let [events, logs, jobs] = &PRUNE_SQLITE[scoped];
        self.sending(5);
        self.bounded(async {
            let txn = self.db.begin().await?;
            txn.execute_raw(self.stmt(self.sql(events), values.clone())).await?;
            txn.execute_raw(self.stmt(self.sql(logs), values.clone())).await?;
            let n = txn.execute_raw(self.stmt(self.sql(jobs), values)).await?.rows_affected();
            txn.commit().await?;
            Ok(n)
        })
        .await
    }
}
