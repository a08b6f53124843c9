//! A holder's writes, each fenced by its claim token: renew, complete, fail, park, release,
//! and what it records on the job.

use sea_orm::Value;

use super::dialect::{backoff_ms, kind_of_end, unless_cancelled};
use super::history::{Detail, History};
use super::options::{jitter, millis, truncate, Backoff, RetryAfter};
use super::rows::{ended_of, pairs_of, FailOutcome, Renewed};
use super::Queue;
use crate::error::{Error, Result};
use crate::job::{event, JobState};

impl Queue {
    /// Renews the leases of the jobs this machine holds, in one statement. Returns the
    /// (id, token) pairs whose lease is still ours; every pair missing from the answer has
    /// been lost. Matching by pair matters: a late answer about an old claim of a job must
    /// never be read as news about a newer claim of the same job.
    pub async fn renew(&self, held: &[(i64, i64)]) -> Result<Vec<(i64, i64)>> {
        Ok(self.renew_leases(held).await?.kept)
    }

    /// [`Queue::renew`], also naming the held jobs whose cancel a user asked for: the holder
    /// learns it from the renewal it sends anyway, with no extra statement.
    pub async fn renew_leases(&self, held: &[(i64, i64)]) -> Result<Renewed> {
        if held.is_empty() {
            return Ok(Renewed::default());
        }
        let (pairs, values) = pair_list(held, 0);
        let rows = self
            .query(
                &format!(
                    "UPDATE dispatch_queue SET heartbeat_at = {{NOW}}
                      WHERE (id, claim_token) IN ({pairs}) AND {{RUNNING}}
                     RETURNING id, claim_token, cancel_requested_at, release_requested_at"
                ),
                values,
            )
            .await?;
        let mut out = Renewed { kept: pairs_of(&rows)?, ..Renewed::default() };
        for r in &rows {
            let pair = (r.try_get("", "id")?, r.try_get("", "claim_token")?);
            if r.try_get::<Option<i64>>("", "cancel_requested_at")?.is_some() {
                out.cancel.push(pair);
            } else if r.try_get::<Option<i64>>("", "release_requested_at")?.is_some() {
                out.release.push(pair);
            }
        }
        Ok(out)
    }

    /// Completes one job if we still own it. `Ok(false)` means the lease was lost and the
    /// completion was rejected (and recorded as such). A job whose cancel was accepted first
    /// ends cancelled, not completed (still `Ok(true)`: the claim ended as it should).
    pub async fn complete(&self, id: i64, token: i64, machine: &str) -> Result<bool> {
        Ok(self.complete_many(&[(id, token)], machine).await?.iter().any(|(p, _)| *p == (id, token)))
    }

    /// Completes many claims in one fenced statement; returns the (id, token) pairs accepted,
    /// each with the state it ended in (`completed`, or `cancelled` when a cancel had been
    /// asked for). Rejected ones (lease lost) get a `completion_rejected` history entry. One
    /// batch may name the same job twice, under an old claim and a new one: only the current
    /// one wins.
    pub async fn complete_many(&self, done: &[(i64, i64)], machine: &str) -> Result<Vec<((i64, i64), JobState)>> {
        if done.is_empty() {
            return Ok(vec![]);
        }
        let (pairs, values) = pair_list(done, 0);
        let update = format!(
            "UPDATE dispatch_queue
                SET state = {ends}, finished_at = {{NOW}}, claimed_at = NULL,
                    completed_at = CASE WHEN cancel_requested_at IS NULL THEN {{NOW}} ELSE NULL END,
                    last_error = CASE WHEN cancel_requested_at IS NULL THEN NULL
                                      ELSE 'cancelled by ' || COALESCE(cancel_requested_by, '?') END
              WHERE (id, claim_token) IN ({pairs}) AND {{RUNNING}}
             RETURNING id, claim_token, orchestrator_id, claimed_by, state",
            ends = unless_cancelled("'completed'")
        );
        let history = History { kind: &kind_of_end(event::COMPLETED), machine: Some(machine), detail: Detail::None };
        let rows = self.change(&update, values, &history).await?;
        let mut accepted = ended_of(&rows)?;
        let mut rejected: Vec<(i64, i64)> =
            done.iter().copied().filter(|p| !accepted.iter().any(|(a, _)| a == p)).collect();
        if !rejected.is_empty() {
            // A retry after a lost reply (say, the server restarted just after committing)
            // finds its own earlier completion: same token, already ended. That is ours.
            let (pairs, values) = pair_list(&rejected, 0);
            let rows = self
                .query(
                    &format!(
                        "SELECT id, claim_token, state FROM dispatch_queue
                          WHERE (id, claim_token) IN ({pairs}) AND state IN ('completed','cancelled')
                            AND claimed_by = ${}",
                        2 * rejected.len() + 1
                    ),
                    values.into_iter().chain([Value::from(machine)]).collect(),
                )
                .await?;
            let ours = ended_of(&rows)?;
            rejected.retain(|p| !ours.iter().any(|(o, _)| o == p));
            accepted.extend(ours);
        }
        for (id, token) in rejected {
            // Not a state change: the only trace of a fenced completion. One try, so that the
            // batch of completions behind this one is not held up by a database that is gone.
            self.note_now(
                id,
                event::COMPLETION_REJECTED,
                machine,
                Some(token),
                "completion fenced: this machine no longer held the lease",
            )
            .await;
        }
        Ok(accepted)
    }

    /// Fails the current attempt if we still own it: claimable again after the retry backoff
    /// (the job's own, else `defaults`), or dead once it has used the job's own
    /// `max_attempts`, or cancelled if a cancel was asked for. `Ok(None)` means the lease was
    /// lost; nothing was written but a note.
    pub async fn fail(&self, id: i64, token: i64, machine: &str, error: &str) -> Result<Option<FailOutcome>> {
        self.fail_with(id, token, machine, error, Backoff::DEFAULT).await
    }

    /// [`Queue::fail`] with the runner's backoff for jobs that carry none.
    pub async fn fail_with(
        &self,
        id: i64,
        token: i64,
        machine: &str,
        error: &str,
        defaults: Backoff,
    ) -> Result<Option<FailOutcome>> {
        let (base, max) = defaults.ms();
        let ends = unless_cancelled("CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'failed' END");
        let finished = "(cancel_requested_at IS NOT NULL OR attempts >= max_attempts)";
        let dead = "(cancel_requested_at IS NULL AND attempts >= max_attempts)";
        let rows = self
            .change(
                &format!(
                    "UPDATE dispatch_queue
                        SET state = {ends},
                            dead_at = CASE WHEN {dead} THEN {{NOW}} ELSE NULL END,
                            finished_at = CASE WHEN {finished} THEN {{NOW}} ELSE NULL END,
                            run_at = CASE WHEN {finished} THEN run_at ELSE {{NOW}} + {backoff} END,
                            failed_at = {{NOW}}, claimed_at = NULL, last_error = $3
                      WHERE id = $1 AND claim_token = $2 AND {{RUNNING}}
                     RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                    backoff = backoff_ms("$4", "$5", "$6")
                ),
                vec![id.into(), token.into(), truncate(error, 2000).into(), base.into(), max.into(), jitter().into()],
                &History {
                    kind: &kind_of_end(event::FAILED),
                    machine: Some(machine),
                    detail: Detail::Text(truncate(error, 500)),
                },
            )
            .await?;
        let Some(row) = rows.first() else {
            // A retry whose first try committed but lost its answer finds its own event.
            let kinds = [event::FAILED, event::DEAD, event::CANCELLED];
            if let Some(kind) = self.own_event(id, token, machine, &kinds).await? {
                return Ok(Some(FailOutcome::of_event(&kind)));
            }
            self.note_now(id, event::LEASE_LOST, machine, Some(token), "failure not recorded: lease lost").await;
            return Ok(None);
        };
        Ok(Some(FailOutcome::of_state(&row.try_get::<String>("", "state")?)))
    }

    /// Parks the current attempt (the agent exited 75, "try later"): handed back without
    /// counting the attempt, claimable again at `after`. A job whose cancel was asked for ends
    /// cancelled instead. `Ok(None)` means the lease was lost. On success, the database time
    /// (ms) from which the job is claimable again.
    pub async fn park(
        &self,
        id: i64,
        token: i64,
        machine: &str,
        after: RetryAfter,
        defaults: Backoff,
    ) -> Result<Option<(JobState, i64)>> {
        let (base, max) = defaults.ms();
        let (at, wait): (Option<i64>, Option<i64>) = match after {
            RetryAfter::At(ms) => (Some(ms), None),
            RetryAfter::In(d) => (None, Some(millis(d))),
            RetryAfter::Backoff => (None, None),
        };
        let why = match after {
            RetryAfter::At(_) | RetryAfter::In(_) => "the agent asked to be tried later (exit 75, retry_after)",
            RetryAfter::Backoff => "the agent asked to be tried later (exit 75; no retry_after, so the retry backoff)",
        };
        let rows = self
            .change(
                &format!(
                    "UPDATE dispatch_queue
                        SET state = {ends},
                            finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN {{NOW}} ELSE NULL END,
                            run_at = CASE WHEN cancel_requested_at IS NOT NULL THEN run_at
                                          WHEN COALESCE($3, {{NOW}} + COALESCE($4, {backoff})) < {{NOW}} THEN {{NOW}}
                                          ELSE COALESCE($3, {{NOW}} + COALESCE($4, {backoff})) END,
                            claimed_at = NULL, attempts = attempts - 1, last_error = $8
                      WHERE id = $1 AND claim_token = $2 AND {{RUNNING}}
                     RETURNING id, orchestrator_id, claim_token, claimed_by, state, run_at",
                    ends = unless_cancelled("'queued'"),
                    backoff = backoff_ms("$5", "$6", "$7"),
                ),
                vec![
                    id.into(),
                    token.into(),
                    at.into(),
                    wait.into(),
                    base.into(),
                    max.into(),
                    jitter().into(),
                    why.into(),
                ],
                &History {
                    kind: &kind_of_end(event::PARKED),
                    machine: Some(machine),
                    detail: Detail::Expr(format!(
                        "CASE WHEN state = 'cancelled' THEN 'cancelled: a cancel was asked for' \
                         ELSE '{why}; claimable again at ' || {{RUN_AT_ISO}} END"
                    )),
                },
            )
            .await?;
        let Some(row) = rows.first() else {
            self.note_now(id, event::LEASE_LOST, machine, Some(token), "park not recorded: lease lost").await;
            return Ok(None);
        };
        let state = JobState::parse(&row.try_get::<String>("", "state")?).unwrap_or(JobState::Queued);
        Ok(Some((state, row.try_get("", "run_at")?)))
    }

    /// Keeps what the agent said it did (its result file) on the job, if we still hold it.
    pub async fn record_result(&self, id: i64, token: i64, summary: Option<&str>, url: Option<&str>) -> Result<bool> {
        let n = self
            .exec(
                "UPDATE dispatch_queue SET summary = $3, result_url = $4
                  WHERE id = $1 AND claim_token = $2 AND {RUNNING}",
                vec![
                    id.into(),
                    token.into(),
                    summary.map(|s| truncate(s, 4000)).into(),
                    url.map(|s| truncate(s, 2000)).into(),
                ],
            )
            .await?;
        Ok(n > 0)
    }

    /// Says where the job's kept worktree is (`machine:path (why)`), if we still hold it.
    pub async fn record_worktree(&self, id: i64, token: i64, worktree: &str) -> Result<bool> {
        let n = self
            .exec(
                "UPDATE dispatch_queue SET worktree = $3 WHERE id = $1 AND claim_token = $2 AND {RUNNING}",
                vec![id.into(), token.into(), truncate(worktree, 1000).into()],
            )
            .await?;
        Ok(n > 0)
    }

    /// A branch pushed after its hand-off could not push: the job resumes from it, if it is
    /// still waiting for a machine and names no newer branch. History says so either way.
    pub async fn resume_later(&self, id: i64, branch: &str, machine: &str) -> Result<bool> {
        let rows = self
            .change(
                "UPDATE dispatch_queue SET resume_branch = $2, resumed_from = $3
                  WHERE id = $1 AND claimed_at IS NULL AND {CLAIMABLE} AND resume_branch IS NULL
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                vec![id.into(), branch.into(), machine.into()],
                &History {
                    kind: &format!("'{}'", event::WORK_PUSHED),
                    machine: Some(machine),
                    detail: Detail::Text(format!(
                        "work in progress pushed later to {branch}; the next claim resumes it"
                    )),
                },
            )
            .await?;
        if rows.is_empty() {
            let detail = format!("work in progress pushed later to {branch}");
            self.note(id, event::WORK_PUSHED, machine, None, &detail).await;
        }
        Ok(!rows.is_empty())
    }

    /// Stores the tail of a running job's agent log, fenced by claim token: a machine that
    /// lost the claim cannot overwrite the new holder's log.
    pub async fn store_log_tail(&self, id: i64, token: i64, machine: &str, tail: &str) -> Result<bool> {
        let n = self
            .exec(
                "INSERT INTO job_logs (job_id, orchestrator_id, claim_token, machine, tail, updated_at)
                 SELECT id, orchestrator_id, claim_token, $3, $4, {NOW} FROM dispatch_queue
                  WHERE id = $1 AND claim_token = $2 AND {RUNNING}
                 ON CONFLICT (job_id) DO UPDATE SET
                     claim_token = excluded.claim_token, machine = excluded.machine,
                     tail = excluded.tail, updated_at = excluded.updated_at",
                vec![id.into(), token.into(), machine.into(), tail.into()],
            )
            .await?;
        Ok(n > 0)
    }

    /// Ends a claim whose cancel was asked for, after its holder stopped the agent. History
    /// names the holder (who stopped it) and, in the detail, who asked.
    pub async fn finish_cancel(&self, id: i64, token: i64, machine: &str) -> Result<bool> {
        let rows = self
            .change(
                "UPDATE dispatch_queue
                    SET state = 'cancelled', finished_at = {NOW}, claimed_at = NULL,
                        last_error = 'cancelled by ' || COALESCE(cancel_requested_by, '?')
                  WHERE id = $1 AND claim_token = $2 AND {RUNNING} AND cancel_requested_at IS NOT NULL
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state, cancel_requested_by",
                vec![id.into(), token.into()],
                &History {
                    kind: "'cancelled'",
                    machine: Some(machine),
                    detail: Detail::Expr(
                        "'agent stopped on ' || COALESCE(claimed_by, '?') || '; cancel asked by ' \
                         || COALESCE(cancel_requested_by, '?')"
                            .into(),
                    ),
                },
            )
            .await?;
        if rows.is_empty() {
            return Ok(self.own_event(id, token, machine, &[event::CANCELLED]).await?.is_some());
        }
        Ok(true)
    }

    /// Hands a job back so another machine can take it at once. The attempt is not counted
    /// against the job: handing off is a choice, not a failure. A job whose cancel was asked
    /// for ends cancelled instead.
    pub async fn release(&self, id: i64, token: i64, machine: &str, reason: &str) -> Result<bool> {
        self.release_with(id, token, machine, reason, None).await
    }

    /// [`Queue::release`] that also names the branch the work in progress was pushed to
    /// (`resume`), in the same fenced statement: the job is claimable only once its work is
    /// on the remote, and the next claimer resumes from it.
    pub async fn release_with(
        &self,
        id: i64,
        token: i64,
        machine: &str,
        reason: &str,
        resume: Option<&str>,
    ) -> Result<bool> {
        let rows = self
            .change(
                &format!(
                    "UPDATE dispatch_queue
                        SET state = {ends}, claimed_at = NULL, attempts = attempts - 1,
                            finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN {{NOW}} ELSE NULL END,
                            resume_branch = COALESCE($3, resume_branch),
                            resumed_from = CASE WHEN $3 IS NULL THEN resumed_from ELSE claimed_by END,
                            release_requested_at = NULL
                      WHERE id = $1 AND claim_token = $2 AND {{RUNNING}}
                     RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                    ends = unless_cancelled("'queued'")
                ),
                vec![id.into(), token.into(), resume.map(str::to_string).into()],
                &History {
                    kind: &kind_of_end(event::HANDED_OFF),
                    machine: Some(machine),
                    detail: Detail::Text(reason.to_string()),
                },
            )
            .await?;
        if rows.is_empty() {
            // A retry whose first try committed but lost its answer finds its own hand-off.
            if self.own_event(id, token, machine, &[event::HANDED_OFF, event::CANCELLED]).await?.is_some() {
                return Ok(true);
            }
            let detail = format!("release not needed: lease already lost ({reason})");
            self.note_now(id, event::LEASE_LOST, machine, Some(token), &detail).await;
            return Ok(false);
        }
        Ok(true)
    }

    /// The kind of this machine's own history event for claim (id, token) among `kinds`, if
    /// there is one. History commits with its state change, so this is exact.
    async fn own_event(&self, id: i64, token: i64, machine: &str, kinds: &[&str]) -> Result<Option<String>> {
        let list: Vec<String> = kinds.iter().map(|k| format!("'{k}'")).collect();
        let rows = self
            .query(
                &format!(
                    "SELECT kind FROM job_events
                      WHERE job_id = $1 AND claim_token = $2 AND machine = $3 AND kind IN ({})
                      ORDER BY id DESC LIMIT 1",
                    list.join(",")
                ),
                vec![id.into(), token.into(), machine.into()],
            )
            .await?;
        rows.first().map(|r| r.try_get::<String>("", "kind")).transpose().map_err(Error::from)
    }
}

/// `($1, $2), ($3, $4), …` for a list of (id, token) pairs.
pub(super) fn pair_list(pairs: &[(i64, i64)], offset: usize) -> (String, Vec<Value>) {
    let mut sql = String::with_capacity(pairs.len() * 12);
    let mut values = Vec::with_capacity(pairs.len() * 2);
    for (i, (id, token)) in pairs.iter().enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        let n = offset + values.len();
        sql.push_str(&format!("(${}, ${})", n + 1, n + 2));
        values.push((*id).into());
        values.push((*token).into());
    }
    (sql, values)
}
