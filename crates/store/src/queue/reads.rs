//! Listings and counts, for status and the UI.

use sea_orm::Value;

use super::route::Route;
use super::rows::{first_i64, job_from_row, Counts, JobRow, LogTail, OpenWork, JOB_COLUMNS};
use super::Queue;
use crate::error::Result;
use crate::job::JobState;

impl Queue {
    /// Job counts by state.
    pub async fn counts(&self, orchestrator_id: &str) -> Result<Counts> {
        let rows = self
            .query(
                "SELECT state, COUNT(*) AS n FROM dispatch_queue
                  WHERE orchestrator_id = $1 GROUP BY state",
                vec![orchestrator_id.into()],
            )
            .await?;
        let mut c = Counts::default();
        for r in &rows {
            let n: i64 = r.try_get("", "n")?;
            let Some(state) = JobState::parse(&r.try_get::<String>("", "state")?) else { continue };
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
        let mut values: Vec<Value> = vec![orchestrator_id.into()];
        let mine = format!("({{RUNNING}} OR ({}))", route.sql(&mut values));
        let rows = self
            .query(
                &format!(
                    "SELECT COALESCE(SUM(CASE WHEN {mine} THEN 1 ELSE 0 END), 0) AS open,
                            COALESCE(SUM(CASE WHEN {mine} THEN 0 ELSE 1 END), 0) AS unroutable
                       FROM dispatch_queue
                      WHERE orchestrator_id = $1 AND ({{RUNNING}} OR (claimed_at IS NULL AND {{CLAIMABLE}}))"
                ),
                values,
            )
            .await?;
        Ok(OpenWork { open: first_i64(&rows, "open")?, unroutable: first_i64(&rows, "unroutable")? })
    }

    /// Jobs of an orchestrator, newest first, optionally of one state.
    pub async fn jobs(&self, orchestrator_id: &str, state: Option<&str>, limit: u32) -> Result<Vec<JobRow>> {
        let mut values: Vec<Value> = vec![orchestrator_id.into(), i64::from(limit).into()];
        let filter = match state {
            Some(s) => {
                values.push(s.into());
                "AND state = $3"
            }
            None => "",
        };
        let rows = self
            .query(
                &format!(
                    "SELECT {JOB_COLUMNS}, {{NOW}} AS now FROM dispatch_queue
                      WHERE orchestrator_id = $1 {filter}
                      ORDER BY id DESC LIMIT $2"
                ),
                values,
            )
            .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// The running jobs of an orchestrator, oldest claim first.
    pub async fn running(&self, orchestrator_id: &str) -> Result<Vec<JobRow>> {
        let rows = self
            .query(
                &format!(
                    "SELECT {JOB_COLUMNS}, {{NOW}} AS now FROM dispatch_queue
                      WHERE orchestrator_id = $1 AND {{RUNNING}} ORDER BY claimed_at, id"
                ),
                vec![orchestrator_id.into()],
            )
            .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// The claimable jobs that wait for a time (backoff, schedule, park), soonest first.
    pub async fn waiting(&self, orchestrator_id: &str, limit: u32) -> Result<Vec<JobRow>> {
        let rows = self
            .query(
                &format!(
                    "SELECT {JOB_COLUMNS}, {{NOW}} AS now FROM dispatch_queue
                      WHERE orchestrator_id = $1 AND claimed_at IS NULL AND {{CLAIMABLE}} AND run_at > {{NOW}}
                      ORDER BY run_at, id LIMIT $2"
                ),
                vec![orchestrator_id.into(), i64::from(limit).into()],
            )
            .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// The claimable jobs no machine holds, in the order the pick takes them.
    pub async fn unclaimed(&self, orchestrator_id: &str, limit: u32) -> Result<Vec<JobRow>> {
        let rows = self
            .query(
                &format!(
                    "SELECT {JOB_COLUMNS}, {{NOW}} AS now FROM dispatch_queue
                      WHERE orchestrator_id = $1 AND claimed_at IS NULL AND {{CLAIMABLE}}
                      ORDER BY priority DESC, run_at, id LIMIT $2"
                ),
                vec![orchestrator_id.into(), i64::from(limit).into()],
            )
            .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// One job with its payload.
    pub async fn job(&self, id: i64) -> Result<Option<(JobRow, serde_json::Value)>> {
        let rows = self
            .query(
                &format!("SELECT {JOB_COLUMNS}, payload, {{NOW}} AS now FROM dispatch_queue WHERE id = $1"),
                vec![id.into()],
            )
            .await?;
        match rows.first() {
            Some(r) => Ok(Some((job_from_row(r)?, r.try_get("", "payload")?))),
            None => Ok(None),
        }
    }

    /// The stored tail of a job's agent log, if its holder stored one.
    pub async fn log_tail(&self, id: i64) -> Result<Option<LogTail>> {
        let rows = self
            .query(
                "SELECT machine, claim_token, tail, updated_at, {NOW} AS now FROM job_logs WHERE job_id = $1",
                vec![id.into()],
            )
            .await?;
        let Some(r) = rows.first() else { return Ok(None) };
        Ok(Some(LogTail {
            machine: r.try_get("", "machine")?,
            claim_token: r.try_get("", "claim_token")?,
            tail: r.try_get("", "tail")?,
            updated_at: r.try_get("", "updated_at")?,
            now: r.try_get("", "now")?,
        }))
    }

    /// The states of jobs `ids` (a job that is gone is missing from the answer).
    pub async fn job_states(&self, ids: &[i64]) -> Result<Vec<(i64, JobState)>> {
        let mut out = vec![];
        for chunk in ids.chunks(500) {
            let list: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
            let values = chunk.iter().map(|i| Value::from(*i)).collect();
            let sql = format!("SELECT id, state FROM dispatch_queue WHERE id IN ({})", list.join(", "));
            for r in self.query(&sql, values).await? {
                let state = JobState::parse(&r.try_get::<String>("", "state")?).unwrap_or(JobState::Queued);
                out.push((r.try_get("", "id")?, state));
            }
        }
        Ok(out)
    }
}
