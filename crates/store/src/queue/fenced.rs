//! A holder's writes, each fenced by its claim ([`Fence`]: the job and its claim token):
//! renew, complete, fail, park, release, and what it records on the job.

use sea_orm::{FromQueryResult, Value};

use super::dialect::{backoff_ms, kind_of_end, unless_cancelled, Dialect, Sql};
use super::fence::{pair_list, Fence};
use super::history::{Detail, History};
use super::options::{jitter, millis, truncate, Backoff, RetryAfter};
use super::pool::Queue;
use super::rows::{decode, decode_first, ended_of, FailOutcome, Renewed, Stated};
use crate::error::Result;
use crate::job::{event, JobState};

/// The fenced completion of the claims in `pairs` (`(id, claim_token)` parameters, see
/// [`pair_list`]): each ends `completed`, or `cancelled` when a cancel was asked for. It
/// returns what [`Queue::change`] needs. Also the completions that ride a poll.
pub(super) fn completion_sql(d: &Dialect, pairs: &str) -> String {
    format!(
        "UPDATE dispatch_queue
            SET state = {ends}, finished_at = {now}, claimed_at = NULL,
                completed_at = CASE WHEN cancel_requested_at IS NULL THEN {now} ELSE NULL END,
                last_error = CASE WHEN cancel_requested_at IS NULL THEN NULL
                                  ELSE 'cancelled by ' || COALESCE(cancel_requested_by, '?') END
          WHERE (id, claim_token) IN ({pairs}) AND {running}
         RETURNING id, claim_token, orchestrator_id, claimed_by, state",
        ends = unless_cancelled("'completed'"),
        now = d.now,
        running = d.running
    )
}

/// A renewed claim, and whether a cancel or a release was asked of it.
#[derive(FromQueryResult)]
struct RenewedRow {
    #[sea_orm(nested)]
    fence: Fence,
    cancel_requested_at: Option<i64>,
    release_requested_at: Option<i64>,
}

/// What a park left: the state, and from when the job is claimable again.
#[derive(FromQueryResult)]
struct Parked {
    state: JobState,
    run_at: i64,
}

/// A kind of history event.
#[derive(FromQueryResult)]
struct Kind {
    kind: String,
}

impl Queue {
    /// Renews the leases of the jobs this machine holds, in one statement. Returns the
    /// fences whose lease is still ours; every fence missing from the answer has been lost.
    /// Matching by fence (id and token) matters: a late answer about an old claim of a job
    /// must never be read as news about a newer claim of the same job.
    pub async fn renew(&self, held: &[Fence]) -> Result<Vec<Fence>> {
        Ok(self.renew_leases(held).await?.kept)
    }

    /// [`Queue::renew`], also naming the held jobs whose cancel a user asked for: the holder
    /// learns it from the renewal it sends anyway, with no extra statement.
    pub async fn renew_leases(&self, held: &[Fence]) -> Result<Renewed> {
        if held.is_empty() {
            return Ok(Renewed::default());
        }
        let d = self.dialect();
        let (pairs, values) = pair_list(d, held, 0);
        let rows = self
            .query(
                &format!(
                    "UPDATE dispatch_queue SET heartbeat_at = {now}
                      WHERE (id, claim_token) IN ({pairs}) AND {running}
                     RETURNING id, claim_token, cancel_requested_at, release_requested_at",
                    now = d.now,
                    running = d.running
                ),
                values,
            )
            .await?;
        let mut out = Renewed::default();
        for r in decode::<RenewedRow>(&rows)? {
            out.kept.push(r.fence);
            if r.cancel_requested_at.is_some() {
                out.cancel.push(r.fence);
            } else if r.release_requested_at.is_some() {
                out.release.push(r.fence);
            }
        }
        Ok(out)
    }

    /// Completes one job if we still own it. `Ok(false)` means the lease was lost and the
    /// completion was rejected (and recorded as such). A job whose cancel was accepted first
    /// ends cancelled, not completed (still `Ok(true)`: the claim ended as it should).
    pub async fn complete(&self, fence: &Fence, machine: &str) -> Result<bool> {
        Ok(self.complete_many(std::slice::from_ref(fence), machine).await?.iter().any(|(f, _)| f == fence))
    }

    /// Completes many claims in one fenced statement; returns the fences accepted, each with
    /// the state it ended in (`completed`, or `cancelled` when a cancel had been asked for).
    /// Rejected ones (lease lost) get a `completion_rejected` history entry. One batch may
    /// name the same job twice, under an old claim and a new one: only the current one wins.
    pub async fn complete_many(&self, done: &[Fence], machine: &str) -> Result<Vec<(Fence, JobState)>> {
        if done.is_empty() {
            return Ok(vec![]);
        }
        let accepted = self.complete_fenced(done, machine).await?;
        self.settle_completions(done, accepted, machine).await
    }

    /// The fenced UPDATE of [`Queue::complete_many`] alone, with its history: the claims it
    /// ended, and no word on the others.
    pub(super) async fn complete_fenced(&self, done: &[Fence], machine: &str) -> Result<Vec<(Fence, JobState)>> {
        let d = self.dialect();
        let (pairs, values) = pair_list(d, done, 0);
        let history = History { kind: &kind_of_end(event::COMPLETED), machine: Some(machine), detail: Detail::None };
        let rows = self.change(&completion_sql(d, &pairs), values, &history).await?;
        ended_of(&rows)
    }

    /// The answer to completions `done` of which `accepted` were written: each of the others
    /// is either this machine's own earlier completion (a retry after a lost reply) or fenced
    /// off, and then noted as such.
    async fn settle_completions(
        &self,
        done: &[Fence],
        mut accepted: Vec<(Fence, JobState)>,
        machine: &str,
    ) -> Result<Vec<(Fence, JobState)>> {
        let d = self.dialect();
        let mut rejected: Vec<Fence> = done.iter().copied().filter(|p| !accepted.iter().any(|(a, _)| a == p)).collect();
        if !rejected.is_empty() {
            // A retry after a lost reply (say, the server restarted just after committing)
            // finds its own earlier completion: same token, already ended. That is ours.
            let (pairs, values) = pair_list(d, &rejected, 0);
            let rows = self
                .query(
                    &format!(
                        "SELECT id, claim_token, state FROM dispatch_queue
                          WHERE (id, claim_token) IN ({pairs}) AND state IN ('completed','cancelled')
                            AND claimed_by = {}",
                        d.p(2 * rejected.len() + 1)
                    ),
                    values.into_iter().chain([Value::from(machine)]).collect(),
                )
                .await?;
            let ours = ended_of(&rows)?;
            rejected.retain(|p| !ours.iter().any(|(o, _)| o == p));
            accepted.extend(ours);
        }
        for f in rejected {
            // Not a state change: the only trace of a fenced completion. One try, so that the
            // batch of completions behind this one is not held up by a database that is gone.
            self.note_now(
                f.job,
                event::COMPLETION_REJECTED,
                machine,
                Some(f.token),
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
    pub async fn fail(&self, fence: &Fence, machine: &str, error: &str) -> Result<Option<FailOutcome>> {
        self.fail_with(fence, machine, error, Backoff::DEFAULT).await
    }

    /// [`Queue::fail`] with the runner's backoff for jobs that carry none.
    pub async fn fail_with(
        &self,
        fence: &Fence,
        machine: &str,
        error: &str,
        defaults: Backoff,
    ) -> Result<Option<FailOutcome>> {
        /// The failure of claim ($1, $2) with error $3; $4..$6 are the runner's backoff and
        /// the jitter.
        static FAIL: Sql = Sql::new(|d| {
            let finished = "(cancel_requested_at IS NOT NULL OR attempts >= max_attempts)";
            let dead = "(cancel_requested_at IS NULL AND attempts >= max_attempts)";
            format!(
                "UPDATE dispatch_queue
                    SET state = {ends},
                        dead_at = CASE WHEN {dead} THEN {now} ELSE NULL END,
                        finished_at = CASE WHEN {finished} THEN {now} ELSE NULL END,
                        run_at = CASE WHEN {finished} THEN run_at ELSE {now} + {backoff} END,
                        failed_at = {now}, claimed_at = NULL, last_error = $3
                  WHERE id = $1 AND claim_token = $2 AND {running}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                ends = unless_cancelled("CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'failed' END"),
                backoff = backoff_ms("$4", "$5", "$6"),
                now = d.now,
                running = d.running,
            )
        });
        let [base, max] = defaults.ms();
        let Fence { job: id, token } = *fence;
        let rows = self
            .change(
                self.sql(&FAIL),
                vec![id.into(), token.into(), truncate(error, 2000).into(), base.into(), max.into(), jitter().into()],
                &History {
                    kind: &kind_of_end(event::FAILED),
                    machine: Some(machine),
                    detail: Detail::Text(truncate(error, 500)),
                },
            )
            .await?;
        let Some(row) = decode_first::<Stated>(&rows)? else {
            // A retry whose first try committed but lost its answer finds its own event.
            let kinds = [event::FAILED, event::DEAD, event::CANCELLED];
            if let Some(kind) = self.own_event(fence, machine, &kinds).await? {
                return Ok(Some(FailOutcome::of_event(&kind)));
            }
            self.note_now(id, event::LEASE_LOST, machine, Some(token), "failure not recorded: lease lost").await;
            return Ok(None);
        };
        Ok(Some(FailOutcome::of_state(row.state)))
    }

    /// Parks the current attempt (the agent exited 75, "try later"): handed back without
    /// counting the attempt, claimable again at `after`. A job whose cancel was asked for ends
    /// cancelled instead. `Ok(None)` means the lease was lost. On success, the database time
    /// (ms) from which the job is claimable again.
    pub async fn park(
        &self,
        fence: &Fence,
        machine: &str,
        after: RetryAfter,
        defaults: Backoff,
    ) -> Result<Option<(JobState, i64)>> {
        self.park_because(fence, machine, after, defaults, None).await
    }

    /// [`Queue::park`], saying why (a preset's usage limit, an API it cannot reach) instead
    /// of the exit-75 sentence. The reason is the job's `last_error` and its history's detail.
    pub async fn park_because(
        &self,
        fence: &Fence,
        machine: &str,
        after: RetryAfter,
        defaults: Backoff,
        reason: Option<&str>,
    ) -> Result<Option<(JobState, i64)>> {
        /// The park of claim ($1, $2) until $3 (ms), else for $4 ms, else for the backoff
        /// ($5..$7, as in the failure); $8 is why.
        static PARK: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue
                    SET state = {ends},
                        finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN {now} ELSE NULL END,
                        run_at = CASE WHEN cancel_requested_at IS NOT NULL THEN run_at
                                      WHEN COALESCE($3, {now} + COALESCE($4, {backoff})) < {now} THEN {now}
                                      ELSE COALESCE($3, {now} + COALESCE($4, {backoff})) END,
                        claimed_at = NULL, attempts = attempts - 1, last_error = $8
                  WHERE id = $1 AND claim_token = $2 AND {running}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state, run_at, last_error",
                ends = unless_cancelled("'queued'"),
                backoff = backoff_ms("$5", "$6", "$7"),
                now = d.now,
                running = d.running,
            )
        });
        let [base, max] = defaults.ms();
        let (at, wait): (Option<i64>, Option<i64>) = match after {
            RetryAfter::At(ms) => (Some(ms), None),
            RetryAfter::In(d) => (None, Some(millis(d))),
            RetryAfter::Backoff => (None, None),
        };
        let why = match after {
            RetryAfter::At(_) | RetryAfter::In(_) => "the agent asked to be tried later (exit 75, retry_after)",
            RetryAfter::Backoff => "the agent asked to be tried later (exit 75; no retry_after, so the retry backoff)",
        };
        let why = reason.map_or_else(|| why.to_string(), |r| truncate(r, 2000));
        let Fence { job: id, token } = *fence;
        let values =
            vec![id.into(), token.into(), at.into(), wait.into(), base.into(), max.into(), jitter().into(), why.into()];
        // The reason is read back from the row (`last_error`), never written into the SQL.
        let detail = Detail::Expr(format!(
            "CASE WHEN state = 'cancelled' THEN 'cancelled: a cancel was asked for' \
             ELSE last_error || '; claimable again at ' || {} END",
            self.dialect().run_at_iso
        ));
        let history = History { kind: &kind_of_end(event::PARKED), machine: Some(machine), detail };
        let rows = self.change(self.sql(&PARK), values, &history).await?;
        let Some(row) = decode_first::<Parked>(&rows)? else {
            self.note_now(id, event::LEASE_LOST, machine, Some(token), "park not recorded: lease lost").await;
            return Ok(None);
        };
        Ok(Some((row.state, row.run_at)))
    }

    /// Keeps what the agent said it did (its result file) on the job, if we still hold it.
    pub async fn record_result(&self, fence: &Fence, summary: Option<&str>, url: Option<&str>) -> Result<bool> {
        /// The summary $3 and link $4 of claim ($1, $2).
        static RESULT: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue
                    SET summary = $3, result_url = COALESCE($4, (SELECT w.url FROM pr_watch w WHERE w.job_id = $1))
                  WHERE id = $1 AND claim_token = $2 AND {running}",
                running = d.running
            )
        });
        let n = self
            .exec(
                self.sql(&RESULT),
                vec![
                    fence.job.into(),
                    fence.token.into(),
                    summary.map(|s| truncate(s, 4000)).into(),
                    url.map(|s| truncate(s, 2000)).into(),
                ],
            )
            .await?;
        Ok(n > 0)
    }

    /// Says where the job's kept worktree is (`machine:path (why)`), if we still hold it.
    pub async fn record_worktree(&self, fence: &Fence, worktree: &str) -> Result<bool> {
        /// The worktree $3 of claim ($1, $2).
        static WORKTREE: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue SET worktree = $3 WHERE id = $1 AND claim_token = $2 AND {running}",
                running = d.running
            )
        });
        let values = vec![fence.job.into(), fence.token.into(), truncate(worktree, 1000).into()];
        Ok(self.exec(self.sql(&WORKTREE), values).await? > 0)
    }

    /// What claim `fence`'s completion left: where it pushed the job's branch (`remote`, a
    /// URL without credentials; `None`: not pushed) and how many commits the branch had beyond
    /// its start (0: no changes). Written before the completion: the pull request's outbox row
    /// opens the PR where the branch went, and asks for none when nothing changed.
    pub async fn record_branch(&self, fence: &Fence, remote: Option<&str>, commits: Option<i64>) -> Result<bool> {
        /// The pushed remote $3 and the commits $4 of claim ($1, $2).
        static BRANCH: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue SET pushed_remote = $3, commits = $4 \
                 WHERE id = $1 AND claim_token = $2 AND {running}",
                running = d.running
            )
        });
        let commits = commits.map(|c| i32::try_from(c).unwrap_or(i32::MAX));
        let values =
            vec![fence.job.into(), fence.token.into(), remote.map(|r| truncate(r, 1000)).into(), commits.into()];
        Ok(self.exec(self.sql(&BRANCH), values).await? > 0)
    }

    /// A branch pushed after its hand-off could not push: the job resumes from it, if it is
    /// still waiting for a machine and names no newer branch. History says so either way.
    pub async fn resume_later(&self, id: i64, branch: &str, machine: &str) -> Result<bool> {
        /// Job $1 resumes from branch $2, pushed by machine $3.
        static RESUME_LATER: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue SET resume_branch = $2, resumed_from = $3
                  WHERE id = $1 AND claimed_at IS NULL AND {claimable} AND resume_branch IS NULL
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                claimable = d.claimable
            )
        });
        let rows = self
            .change(
                self.sql(&RESUME_LATER),
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
    pub async fn store_log_tail(&self, fence: &Fence, machine: &str, tail: &str) -> Result<bool> {
        /// The log tail $4 of claim ($1, $2) on machine $3.
        static LOG_TAIL: Sql = Sql::new(|d| {
            format!(
                "INSERT INTO job_logs (job_id, orchestrator_id, claim_token, machine, tail, updated_at)
                 SELECT id, orchestrator_id, claim_token, $3, $4, {now} FROM dispatch_queue
                  WHERE id = $1 AND claim_token = $2 AND {running}
                 ON CONFLICT (job_id) DO UPDATE SET
                     claim_token = excluded.claim_token, machine = excluded.machine,
                     tail = excluded.tail, updated_at = excluded.updated_at",
                now = d.now,
                running = d.running
            )
        });
        let values = vec![fence.job.into(), fence.token.into(), machine.into(), tail.into()];
        Ok(self.exec(self.sql(&LOG_TAIL), values).await? > 0)
    }

    /// Ends a claim whose cancel was asked for, after its holder stopped the agent. History
    /// names the holder (who stopped it) and, in the detail, who asked.
    pub async fn finish_cancel(&self, fence: &Fence, machine: &str) -> Result<bool> {
        /// The end of claim ($1, $2), cancelled as asked.
        static FINISH_CANCEL: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue
                    SET state = 'cancelled', finished_at = {now}, claimed_at = NULL,
                        last_error = 'cancelled by ' || COALESCE(cancel_requested_by, '?')
                  WHERE id = $1 AND claim_token = $2 AND {running} AND cancel_requested_at IS NOT NULL
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state, cancel_requested_by",
                now = d.now,
                running = d.running
            )
        });
        let rows = self
            .change(
                self.sql(&FINISH_CANCEL),
                vec![fence.job.into(), fence.token.into()],
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
            return Ok(self.own_event(fence, machine, &[event::CANCELLED]).await?.is_some());
        }
        Ok(true)
    }

    /// Hands a job back so another machine can take it at once. The attempt is not counted
    /// against the job: handing off is a choice, not a failure. A job whose cancel was asked
    /// for ends cancelled instead.
    pub async fn release(&self, fence: &Fence, machine: &str, reason: &str) -> Result<bool> {
        self.release_with(fence, machine, reason, None).await
    }

    /// [`Queue::release`] that also names the branch the work in progress was pushed to
    /// (`resume`), in the same fenced statement: the job is claimable only once its work is
    /// on the remote, and the next claimer resumes from it.
    pub async fn release_with(&self, fence: &Fence, machine: &str, reason: &str, resume: Option<&str>) -> Result<bool> {
        /// The hand-off of claim ($1, $2), resuming from branch $3 if it is set.
        static RELEASE: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue
                    SET state = {ends}, claimed_at = NULL, attempts = attempts - 1,
                        finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN {now} ELSE NULL END,
                        resume_branch = COALESCE($3, resume_branch),
                        resumed_from = CASE WHEN $3 IS NULL THEN resumed_from ELSE claimed_by END,
                        release_requested_at = NULL
                  WHERE id = $1 AND claim_token = $2 AND {running}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                ends = unless_cancelled("'queued'"),
                now = d.now,
                running = d.running,
            )
        });
        let rows = self
            .change(
                self.sql(&RELEASE),
                vec![fence.job.into(), fence.token.into(), resume.map(str::to_string).into()],
                &History {
                    kind: &kind_of_end(event::HANDED_OFF),
                    machine: Some(machine),
                    detail: Detail::Text(reason.to_string()),
                },
            )
            .await?;
        if rows.is_empty() {
            // A retry whose first try committed but lost its answer finds its own hand-off.
            if self.own_event(fence, machine, &[event::HANDED_OFF, event::CANCELLED]).await?.is_some() {
                return Ok(true);
            }
            let detail = format!("release not needed: lease already lost ({reason})");
            self.note_now(fence.job, event::LEASE_LOST, machine, Some(fence.token), &detail).await;
            return Ok(false);
        }
        Ok(true)
    }

    /// The kind of this machine's own history event for claim `fence` among `kinds`, if
    /// there is one. History commits with its state change, so this is exact.
    async fn own_event(&self, fence: &Fence, machine: &str, kinds: &[&str]) -> Result<Option<String>> {
        let d = self.dialect();
        let list: Vec<String> = kinds.iter().map(|k| format!("'{k}'")).collect();
        let [job, token, by] = d.params(1);
        let rows = self
            .query(
                &format!(
                    "SELECT kind FROM job_events
                      WHERE job_id = {job} AND claim_token = {token} AND machine = {by} AND kind IN ({})
                      ORDER BY id DESC LIMIT 1",
                    list.join(",")
                ),
                vec![fence.job.into(), fence.token.into(), machine.into()],
            )
            .await?;
        Ok(decode_first::<Kind>(&rows)?.map(|k| k.kind))
    }
}
