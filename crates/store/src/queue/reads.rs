//! Listings and counts, for status and the UI.

use sea_orm::{FromQueryResult, Value};

use super::dialect::{Dialect, Sql};
use super::pool::Queue;
use super::route::Route;
use super::rows::{decode, decode_first, decode_one, Counts, IdState, JobRow, LogTail, OpenWork, JOB_COLUMNS};
use crate::error::Result;
use crate::job::JobState;

/// A job listing: [`JOB_COLUMNS`], when its last attempt started and the database clock, of
/// the rows that `rest` (its WHERE and ORDER BY) selects.
fn listing(d: &Dialect, rest: &str) -> String {
    format!(
        "SELECT {JOB_COLUMNS}, {issue}, {STARTED_AT}, {now} AS now FROM dispatch_queue {rest}",
        issue = d.issue_columns,
        now = d.now
    )
}

/// When the job's last attempt was claimed: its `claimed_at` while it is held, and from its
/// history once that is cleared (a job ends), so that a finished job's duration runs from
/// here to `finished_at`. On SQLite the history row is written by the transaction's next
/// statement, a millisecond or so after `claimed_at`: the column is the exact one.
const STARTED_AT: &str = "COALESCE(claimed_at, (SELECT MAX(e.at) FROM job_events e
                            WHERE e.job_id = dispatch_queue.id AND e.kind = 'claimed')) AS started_at";

/// The jobs of orchestrator $1, newest first, at most $2: of every state, and of state $3.
static JOBS: [Sql; 2] = [
    Sql::new(|d| listing(d, "WHERE orchestrator_id = $1 ORDER BY id DESC LIMIT $2")),
    Sql::new(|d| listing(d, "WHERE orchestrator_id = $1 AND state = $3 ORDER BY id DESC LIMIT $2")),
];

/// The running jobs of orchestrator $1, oldest claim first.
static RUNNING: Sql =
    Sql::new(|d| listing(d, &format!("WHERE orchestrator_id = $1 AND {} ORDER BY claimed_at, id", d.running)));

/// The claimable jobs of orchestrator $1 that wait for a time, soonest first, at most $2.
static WAITING: Sql = Sql::new(|d| {
    let rest = format!(
        "WHERE orchestrator_id = $1 AND claimed_at IS NULL AND {claimable} AND run_at > {now}
          ORDER BY run_at, id LIMIT $2",
        claimable = d.claimable,
        now = d.now
    );
    listing(d, &rest)
});

/// The claimable jobs of orchestrator $1 no machine holds, in the pick's order, at most $2.
static UNCLAIMED: Sql = Sql::new(|d| {
    let rest = format!(
        "WHERE orchestrator_id = $1 AND claimed_at IS NULL AND {claimable}
          ORDER BY priority DESC, run_at, id LIMIT $2",
        claimable = d.claimable
    );
    listing(d, &rest)
});

/// The jobs of orchestrator $1 that ended completed or dead after $2 (database ms), oldest
/// end first, at most $3: what other machines finished, for a tray that tells them.
static FINISHED_SINCE: Sql = Sql::new(|d| {
    listing(
        d,
        "WHERE orchestrator_id = $1 AND finished_at > $2 AND state IN ('completed', 'dead')
          ORDER BY finished_at, id LIMIT $3",
    )
});

/// Job $1 with its payload.
static JOB: Sql = Sql::new(|d| {
    format!(
        "SELECT {JOB_COLUMNS}, {issue}, {STARTED_AT}, payload, {now} AS now FROM dispatch_queue WHERE id = $1",
        issue = d.issue_columns,
        now = d.now
    )
});

/// The stored log tail of job $1.
static LOG_TAIL: Sql = Sql::new(|d| {
    format!("SELECT machine, claim_token, tail, updated_at, {now} AS now FROM job_logs WHERE job_id = $1", now = d.now)
});

/// What a job listing keeps (`devpilot jobs`): each field that is set must match.
#[derive(Clone, Debug, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub repo: Option<String>,
    /// The tracker source that added it (`payload.source.name`).
    pub source: Option<String>,
    /// The machine that holds it now, or, when none does, the one that claimed it last.
    pub machine: Option<String>,
}

/// The machine that holds a job now, else the one its history says claimed it last.
const LAST_MACHINE: &str = "COALESCE(claimed_by, (SELECT e.machine FROM job_events e
                             WHERE e.job_id = dispatch_queue.id AND e.kind = 'claimed'
                             ORDER BY e.at DESC, e.id DESC LIMIT 1))";

/// Jobs by state, as a count each.
#[derive(FromQueryResult)]
struct StateCount {
    state: JobState,
    n: i64,
}

/// A job with its payload.
#[derive(FromQueryResult)]
struct WithPayload {
    #[sea_orm(nested)]
    job: JobRow,
    payload: serde_json::Value,
}

impl Queue {
    /// Job counts by state.
    pub async fn counts(&self, orchestrator_id: &str) -> Result<Counts> {
        /// The jobs of orchestrator $1, counted by state.
        static COUNTS: Sql = Sql::new(|_| {
            "SELECT state, COUNT(*) AS n FROM dispatch_queue
                  WHERE orchestrator_id = $1 GROUP BY state"
                .to_string()
        });
        let rows = self.query(self.sql(&COUNTS), vec![orchestrator_id.into()]).await?;
        let mut c = Counts::default();
        for StateCount { state, n } in decode::<StateCount>(&rows)? {
            *match state {
                JobState::Queued => &mut c.queued,
                JobState::Running => &mut c.running,
                JobState::Failed => &mut c.failed,
                JobState::Completed => &mut c.completed,
                JobState::Dead => &mut c.dead,
                JobState::Cancelled => &mut c.cancelled,
            } = n;
        }
        Ok(c)
    }

    /// The orchestrator's open work as a machine with `route` sees it: what it may still
    /// get (running anywhere, or claimable and routable to it), and what only another
    /// machine can take.
    pub async fn open_work(&self, orchestrator_id: &str, route: &Route) -> Result<OpenWork> {
        let d = self.dialect();
        let mut values: Vec<Value> = vec![orchestrator_id.into()];
        let mine = format!("({} OR ({}))", d.running, route.sql(d, &mut values));
        let rows = self
            .query(
                &format!(
                    "SELECT COALESCE(SUM(CASE WHEN {mine} THEN 1 ELSE 0 END), 0) AS open,
                            COALESCE(SUM(CASE WHEN {mine} THEN 0 ELSE 1 END), 0) AS unroutable
                       FROM dispatch_queue
                      WHERE orchestrator_id = {o} AND ({running} OR (claimed_at IS NULL AND {claimable}))",
                    o = d.p(1),
                    running = d.running,
                    claimable = d.claimable
                ),
                values,
            )
            .await?;
        decode_one(&rows)
    }

    /// Jobs of an orchestrator, newest first, optionally of one state.
    pub async fn jobs(&self, orchestrator_id: &str, state: Option<&str>, limit: u32) -> Result<Vec<JobRow>> {
        let mut values: Vec<Value> = vec![orchestrator_id.into(), i64::from(limit).into()];
        values.extend(state.map(Value::from));
        decode(&self.query(self.sql(&JOBS[usize::from(state.is_some())]), values).await?)
    }

    /// The jobs of an orchestrator that match `f`, newest first, at most `limit`.
    pub async fn jobs_matching(&self, orchestrator_id: &str, f: &JobFilter, limit: u32) -> Result<Vec<JobRow>> {
        let d = self.dialect();
        let mut values: Vec<Value> = vec![orchestrator_id.into(), i64::from(limit).into()];
        let mut conds = vec![format!("orchestrator_id = {}", d.p(1))];
        let wanted = [
            ("state", f.state.map(|s| s.as_str().to_string())),
            ("repo", f.repo.clone()),
            ("payload -> 'source' ->> 'name'", f.source.clone()),
            (LAST_MACHINE, f.machine.clone()),
        ];
        for (column, value) in wanted {
            if let Some(v) = value {
                values.push(v.into());
                conds.push(format!("{column} = {}", d.p(values.len())));
            }
        }
        let sql = listing(d, &format!("WHERE {} ORDER BY id DESC LIMIT {}", conds.join(" AND "), d.p(2)));
        decode(&self.query(&sql, values).await?)
    }

    /// The running jobs of an orchestrator, oldest claim first.
    pub async fn running(&self, orchestrator_id: &str) -> Result<Vec<JobRow>> {
        decode(&self.query(self.sql(&RUNNING), vec![orchestrator_id.into()]).await?)
    }

    /// The jobs that ended completed or dead after `since_ms` (database time), oldest end
    /// first, at most `limit`: a machine reads what the others finished from here.
    pub async fn finished_since(&self, orchestrator_id: &str, since_ms: i64, limit: u32) -> Result<Vec<JobRow>> {
        let values = vec![orchestrator_id.into(), since_ms.into(), i64::from(limit).into()];
        decode(&self.query(self.sql(&FINISHED_SINCE), values).await?)
    }

    /// The claimable jobs that wait for a time (backoff, schedule, park), soonest first.
    pub async fn waiting(&self, orchestrator_id: &str, limit: u32) -> Result<Vec<JobRow>> {
        let values = vec![orchestrator_id.into(), i64::from(limit).into()];
        decode(&self.query(self.sql(&WAITING), values).await?)
    }

    /// The claimable jobs no machine holds, in the order the pick takes them.
    pub async fn unclaimed(&self, orchestrator_id: &str, limit: u32) -> Result<Vec<JobRow>> {
        let values = vec![orchestrator_id.into(), i64::from(limit).into()];
        decode(&self.query(self.sql(&UNCLAIMED), values).await?)
    }

    /// One job with its payload.
    pub async fn job(&self, id: i64) -> Result<Option<(JobRow, serde_json::Value)>> {
        let rows = self.query(self.sql(&JOB), vec![id.into()]).await?;
        Ok(decode_first::<WithPayload>(&rows)?.map(|j| (j.job, j.payload)))
    }

    /// The stored tail of a job's agent log, if its holder stored one.
    pub async fn log_tail(&self, id: i64) -> Result<Option<LogTail>> {
        decode_first(&self.query(self.sql(&LOG_TAIL), vec![id.into()]).await?)
    }

    /// The states of jobs `ids` (a job that is gone is missing from the answer).
    pub async fn job_states(&self, ids: &[i64]) -> Result<Vec<(i64, JobState)>> {
        let d = self.dialect();
        let mut out = vec![];
        for chunk in ids.chunks(500) {
            let list: Vec<String> = (1..=chunk.len()).map(|i| d.p(i)).collect();
            let values = chunk.iter().map(|i| Value::from(*i)).collect();
            let sql = format!("SELECT id, state FROM dispatch_queue WHERE id IN ({})", list.join(", "));
            out.extend(decode::<IdState>(&self.query(&sql, values).await?)?.into_iter().map(|r| (r.id, r.state)));
        }
        Ok(out)
    }
}
