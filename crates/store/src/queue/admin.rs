//! What a user does from anywhere: release a machine's claims (at once, or asked of the
//! holder), requeue, cancel.

use sea_orm::Value;

use super::dialect::{kind_of_end, unless_cancelled};
use super::fenced::pair_list;
use super::history::{Detail, History};
use super::rows::{ids_of, pairs_of, CancelOutcome};
use super::Queue;
use crate::error::{Error, Result};
use crate::job::{event, JobState};

impl Queue {
    /// Administrative hand-off of everything `machine` holds (for `devpilot release` when
    /// the machine itself cannot do it). The holder's later writes fail its fencing check.
    pub async fn release_machine(&self, orchestrator_id: &str, machine: &str) -> Result<Vec<i64>> {
        self.release_machine_because(orchestrator_id, machine, "released by `devpilot release`").await
    }

    /// Asks `machine` to hand off what it holds (`devpilot release --machine`, from anywhere):
    /// the holder learns it at its next renewal (at once through NOTIFY), pushes the work in
    /// progress and releases. Returns the (id, token) of the claims asked about.
    pub async fn request_release(&self, orchestrator_id: &str, machine: &str, by: &str) -> Result<Vec<(i64, i64)>> {
        let rows = self
            .change(
                "UPDATE dispatch_queue SET release_requested_at = {NOW}, release_requested_by = $3
                  WHERE orchestrator_id = $1 AND claimed_by = $2 AND {RUNNING}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state, release_requested_by",
                vec![orchestrator_id.into(), machine.into(), by.into()],
                &History {
                    kind: &format!("'{}'", event::RELEASE_REQUESTED),
                    machine: Some(by),
                    detail: Detail::Expr("'hand-off asked of ' || claimed_by || ' by ' || release_requested_by".into()),
                },
            )
            .await?;
        let mut pairs = pairs_of(&rows)?;
        pairs.sort_unstable();
        Ok(pairs)
    }

    /// Releases the claims `pairs` (fenced by token) whose holder has not renewed since a
    /// release was asked of it: a holder that renewed is handing off (pushing its work in
    /// progress), and releasing under it would make the job claimable before the push. The
    /// ids released.
    pub async fn release_unanswered(&self, pairs: &[(i64, i64)], machine: &str, why: &str) -> Result<Vec<i64>> {
        if pairs.is_empty() {
            return Ok(vec![]);
        }
        let (list, values) = pair_list(pairs, 0);
        let unanswered = format!(
            "(id, claim_token) IN ({list}) AND release_requested_at IS NOT NULL
             AND COALESCE(heartbeat_at, claimed_at) <= release_requested_at"
        );
        self.hand_back(&unanswered, values, machine, why).await
    }

    /// [`Queue::release_machine`] with the history's reason.
    async fn release_machine_because(&self, orchestrator_id: &str, machine: &str, why: &str) -> Result<Vec<i64>> {
        let values = vec![orchestrator_id.into(), machine.into()];
        self.hand_back("orchestrator_id = $1 AND claimed_by = $2", values, machine, why).await
    }

    /// Hands back, without the holder, the running jobs that `filter` selects: the attempt is
    /// not counted, and a job whose cancel was asked for ends cancelled. The ids, sorted.
    async fn hand_back(&self, filter: &str, values: Vec<Value>, machine: &str, why: &str) -> Result<Vec<i64>> {
        let rows = self
            .change(
                &format!(
                    "UPDATE dispatch_queue
                        SET state = {ends}, claimed_at = NULL, attempts = attempts - 1,
                            finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN {{NOW}} ELSE NULL END,
                            release_requested_at = NULL
                      WHERE {filter} AND {{RUNNING}}
                     RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                    ends = unless_cancelled("'queued'")
                ),
                values,
                &History {
                    kind: &kind_of_end(event::HANDED_OFF),
                    machine: Some(machine),
                    detail: Detail::Text(why.into()),
                },
            )
            .await?;
        let mut ids = ids_of(&rows)?;
        ids.sort_unstable();
        Ok(ids)
    }

    /// Puts a dead, failed or cancelled job back in the queue with a fresh attempt budget,
    /// claimable now. `Ok(false)`: the job is in no state to be requeued. A job whose key is
    /// live again (a newer job with the same key) is refused with a clear error.
    pub async fn requeue(&self, id: i64, by: &str) -> Result<bool> {
        let result = self
            .change(
                "UPDATE dispatch_queue
                    SET state = 'queued', attempts = 0, claimed_at = NULL, dead_at = NULL, finished_at = NULL,
                        run_at = {NOW}, cancel_requested_at = NULL, cancel_requested_by = NULL
                  WHERE id = $1 AND {REQUEUEABLE}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                vec![id.into()],
                &History { kind: "'requeued'", machine: Some(by), detail: Detail::Text("requeued by the user".into()) },
            )
            .await;
        match result {
            Ok(rows) => Ok(!rows.is_empty()),
            Err(e) if e.is_unique_violation() => Err(Error::Invalid(format!(
                "job #{id} cannot be requeued: another job with the same key is live; cancel that one first"
            ))),
            Err(e) => Err(e),
        }
    }

    /// Cancels a job, from any machine. A waiting job is cancelled at once. For a running
    /// job the cancel is *asked for*, in the same statement: its holder sees it at its next
    /// renewal (or at once, through NOTIFY), stops the agent, and ends the claim cancelled;
    /// from now on no completion, retry or hand-off of it can end it otherwise. `Ok(None)`:
    /// the job is finished, or its cancel was asked for already.
    pub async fn cancel(&self, id: i64, by: &str) -> Result<Option<CancelOutcome>> {
        let rows = self
            .change(
                "UPDATE dispatch_queue
                    SET state = CASE WHEN {RUNNING} THEN state ELSE 'cancelled' END,
                        finished_at = CASE WHEN {RUNNING} THEN finished_at ELSE {NOW} END,
                        cancel_requested_at = {NOW}, cancel_requested_by = $2
                  WHERE id = $1
                    AND (({CLAIMABLE} AND claimed_at IS NULL) OR ({RUNNING} AND cancel_requested_at IS NULL))
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state, cancel_requested_by",
                vec![id.into(), by.into()],
                &History {
                    kind: "CASE WHEN state = 'running' THEN 'cancel_requested' ELSE 'cancelled' END",
                    machine: Some(by),
                    detail: Detail::Expr(
                        "CASE WHEN state = 'running' THEN 'cancel asked by ' || cancel_requested_by || \
                         '; ' || COALESCE(claimed_by, '?') || ' stops the agent' \
                         ELSE 'cancelled by ' || cancel_requested_by END"
                            .into(),
                    ),
                },
            )
            .await?;
        let Some(r) = rows.first() else { return Ok(None) };
        Ok(Some(if r.try_get::<String>("", "state")? == JobState::Running.as_str() {
            CancelOutcome::Requested { holder: r.try_get("", "claimed_by")? }
        } else {
            CancelOutcome::Cancelled
        }))
    }
}
