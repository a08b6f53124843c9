//! Housekeeping: the sweep of expired leases, and the pruning of finished work.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, TransactionTrait, Value};

use super::dialect::{kind_of_end, unless_cancelled};
use super::history::{Detail, History};
use super::options::{millis, Retention};
use super::rows::{first_i64, Pruned, Swept};
use super::Queue;
use crate::error::Result;
use crate::job::{event, JobState};

impl Queue {
    /// Releases every claim whose last sign of life is older than `claim_timeout`; a job that
    /// has used its own `max_attempts` becomes dead instead, and one whose cancel was asked
    /// for becomes cancelled. The staleness test is in this same statement's WHERE, so a
    /// sweep can never touch a fresh claim or a finished job. `orchestrator_id = None` sweeps
    /// every orchestrator (the backstop command).
    pub async fn sweep(&self, orchestrator_id: Option<&str>, claim_timeout: Duration) -> Result<Vec<Swept>> {
        let mut values: Vec<Value> = vec![millis(claim_timeout).into()];
        let scope = match orchestrator_id {
            Some(o) => {
                values.push(o.into());
                "AND orchestrator_id = $2"
            }
            None => "",
        };
        let detail = format!("no heartbeat for {}", humantime::format_duration(claim_timeout));
        let ends = unless_cancelled("CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'queued' END");
        let finished = "(cancel_requested_at IS NOT NULL OR attempts >= max_attempts)";
        let dead = "(cancel_requested_at IS NULL AND attempts >= max_attempts)";
        let rows = self
            .change(
                &format!(
                    "UPDATE dispatch_queue
                        SET state = {ends},
                            dead_at = CASE WHEN {dead} THEN {{NOW}} ELSE NULL END,
                            finished_at = CASE WHEN {finished} THEN {{NOW}} ELSE NULL END,
                            claimed_at = NULL,
                            last_error = 'lease expired: no heartbeat from ' || COALESCE(claimed_by, '?')
                      WHERE {{RUNNING}}
                        AND COALESCE(heartbeat_at, claimed_at) < {{NOW}} - $1
                        {scope}
                     RETURNING id, orchestrator_id, claimed_by, claim_token, state, {{NOW}} AS at"
                ),
                values,
                &History { kind: &kind_of_end(event::SWEPT), machine: None, detail: Detail::Text(detail) },
            )
            .await?;
        let mut swept = Vec::with_capacity(rows.len());
        for r in &rows {
            swept.push(Swept {
                id: r.try_get("", "id")?,
                orchestrator_id: r.try_get("", "orchestrator_id")?,
                previous_holder: r.try_get("", "claimed_by")?,
                token: r.try_get("", "claim_token")?,
                dead: r.try_get::<String>("", "state")? == JobState::Dead.as_str(),
                at: r.try_get("", "at")?,
            });
        }
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
        let scope = match orchestrator_id {
            Some(o) => {
                values.push(o.into());
                "AND orchestrator_id = $2"
            }
            None => "",
        };
        pruned.machines =
            self.exec(&format!("DELETE FROM machines WHERE last_seen_at < {{NOW}} - $1 {scope}"), values).await?;
        Ok(pruned)
    }

    /// One batch of [`Queue::prune`]: how many jobs it deleted.
    async fn prune_batch(&self, orchestrator_id: Option<&str>, r: &Retention, batch: u32) -> Result<u64> {
        let (finished, dead) = (millis(r.finished), millis(r.dead));
        let mut values: Vec<Value> =
            vec![finished.into(), dead.into(), Ord::min(finished, dead).into(), i64::from(batch).into()];
        let scope = match orchestrator_id {
            Some(o) => {
                values.push(o.into());
                "AND orchestrator_id = $5"
            }
            None => "",
        };
        // `{FINISHED} AND finished_at < now - min` lets `dispatch_queue_finished` find them.
        let pick = format!(
            "SELECT id FROM dispatch_queue
              WHERE {{FINISHED}} AND finished_at < {{NOW}} - $3 {scope}
                AND ((state = 'dead' AND finished_at < {{NOW}} - $2)
                     OR (state <> 'dead' AND finished_at < {{NOW}} - $1))
              ORDER BY finished_at, id LIMIT $4"
        );
        if self.backend == DbBackend::Postgres {
            let sql = format!(
                "WITH gone AS (DELETE FROM dispatch_queue
                                WHERE id IN ({pick} FOR UPDATE SKIP LOCKED) AND {{FINISHED}}
                               RETURNING id),
                      events AS (DELETE FROM job_events WHERE job_id IN (SELECT id FROM gone)),
                      logs AS (DELETE FROM job_logs WHERE job_id IN (SELECT id FROM gone))
                 SELECT COUNT(*) AS n FROM gone"
            );
            let rows = self.query(&sql, values).await?;
            return Ok(u64::try_from(first_i64(&rows, "n")?).unwrap_or(0));
        }
        // SQLite: two DELETEs over the same pick in one transaction. Writing first (rather
        // than reading the ids, then deleting) takes the write lock at once, so a writer
        // committing in between cannot make the transaction's upgrade fail.
        self.bounded(async {
            let txn = self.db.begin().await?;
            txn.execute_raw(self.stmt(&format!("DELETE FROM job_events WHERE job_id IN ({pick})"), values.clone()))
                .await?;
            txn.execute_raw(self.stmt(&format!("DELETE FROM job_logs WHERE job_id IN ({pick})"), values.clone()))
                .await?;
            let n = txn
                .execute_raw(
                    self.stmt(&format!("DELETE FROM dispatch_queue WHERE id IN ({pick}) AND {{FINISHED}}"), values),
                )
                .await?
                .rows_affected();
            txn.commit().await?;
            Ok(n)
        })
        .await
    }
}
