//! What a user does from anywhere: release a machine's claims (at once, or asked of the
//! holder), requeue, cancel.

use sea_orm::{FromQueryResult, Value};

use super::dialect::{kind_of_end, unless_cancelled, Dialect, Sql};
use super::fence::{pair_list, Fence};
use super::history::{Detail, History};
use super::pool::Queue;
use super::rows::{decode_first, ids_of, pairs_of, CancelOutcome};
use crate::error::{Error, Result};
use crate::job::{event, JobState};

/// The hand-back, without the holder, of the running jobs that `filter` selects (see
/// [`Queue::hand_back`]).
fn hand_back_sql(d: &Dialect, filter: &str) -> String {
    format!(
        "UPDATE dispatch_queue
            SET state = {ends}, claimed_at = NULL, attempts = attempts - 1,
                finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN {now} ELSE NULL END,
                release_requested_at = NULL
          WHERE {filter} AND {running}
         RETURNING id, orchestrator_id, claim_token, claimed_by, state",
        ends = unless_cancelled("'queued'"),
        now = d.now,
        running = d.running,
    )
}

/// The hand-back of what machine $2 holds of orchestrator $1.
static RELEASE_MACHINE: Sql = Sql::new(|d| hand_back_sql(d, "orchestrator_id = $1 AND claimed_by = $2"));

/// What a cancel found: the state it left, and who holds the job.
#[derive(FromQueryResult)]
struct Cancelled {
    state: JobState,
    claimed_by: Option<String>,
}

impl Queue {
    /// Administrative hand-off of everything `machine` holds (for `devpilot release` when
    /// the machine itself cannot do it). The holder's later writes fail its fencing check.
    pub async fn release_machine(&self, orchestrator_id: &str, machine: &str) -> Result<Vec<i64>> {
        self.release_machine_because(orchestrator_id, machine, "released by `devpilot release`").await
    }

    /// Asks `machine` to hand off what it holds (`devpilot release --machine`, from anywhere):
    /// the holder learns it at its next renewal (at once through NOTIFY), pushes the work in
    /// progress and releases. Returns the fences of the claims asked about.
    pub async fn request_release(&self, orchestrator_id: &str, machine: &str, by: &str) -> Result<Vec<Fence>> {
        /// Asks machine $2 of orchestrator $1 to hand off what it holds, for $3.
        static REQUEST_RELEASE: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue SET release_requested_at = {now}, release_requested_by = $3
                  WHERE orchestrator_id = $1 AND claimed_by = $2 AND {running}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state, release_requested_by",
                now = d.now,
                running = d.running
            )
        });
        let rows = self
            .change(
                self.sql(&REQUEST_RELEASE),
                vec![orchestrator_id.into(), machine.into(), by.into()],
                &History {
                    kind: &format!("'{}'", event::RELEASE_REQUESTED),
                    machine: Some(by),
                    detail: Detail::Expr("'hand-off asked of ' || claimed_by || ' by ' || release_requested_by".into()),
                },
            )
            .await?;
        let mut fences = pairs_of(&rows)?;
        fences.sort_unstable();
        Ok(fences)
    }

    /// Releases the claims `fences` whose holder has not renewed since a release was asked
    /// of it: a holder that renewed is handing off (pushing its work in progress), and
    /// releasing under it would make the job claimable before the push. The ids released.
    pub async fn release_unanswered(&self, fences: &[Fence], machine: &str, why: &str) -> Result<Vec<i64>> {
        if fences.is_empty() {
            return Ok(vec![]);
        }
        let d = self.dialect();
        let (list, values) = pair_list(d, fences, 0);
        let unanswered = format!(
            "(id, claim_token) IN ({list}) AND release_requested_at IS NOT NULL
             AND COALESCE(heartbeat_at, claimed_at) <= release_requested_at"
        );
        self.hand_back(&hand_back_sql(d, &unanswered), values, machine, why).await
    }

    /// [`Queue::release_machine`] with the history's reason.
    async fn release_machine_because(&self, orchestrator_id: &str, machine: &str, why: &str) -> Result<Vec<i64>> {
        let values = vec![orchestrator_id.into(), machine.into()];
        self.hand_back(self.sql(&RELEASE_MACHINE), values, machine, why).await
    }

    /// Hands back, without the holder, the running jobs that `update` (a [`hand_back_sql`])
    /// selects: the attempt is not counted, and a job whose cancel was asked for ends
    /// cancelled. The ids, sorted.
    async fn hand_back(&self, update: &str, values: Vec<Value>, machine: &str, why: &str) -> Result<Vec<i64>> {
        let rows = self
            .change(
                update,
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
    /// live again (a newer job with the same key) is refused with a clear error. A job that
    /// was cancelled while parked by the governor is let go as [`Queue::let_go`] does: its
    /// park is over and its own cap counts from what it has spent (else no machine would ever
    /// claim it again).
    pub async fn requeue(&self, id: i64, by: &str) -> Result<bool> {
        /// Job $1 back in the queue.
        static REQUEUE: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue
                    SET state = 'queued', attempts = 0, claimed_at = NULL, dead_at = NULL, finished_at = NULL,
                        run_at = {now}, cancel_requested_at = NULL, cancel_requested_by = NULL,
                        parked_for = NULL, cap_base_usd = COALESCE(cost_usd, 0), spend_warned = 0
                  WHERE id = $1 AND {requeueable}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                now = d.now,
                requeueable = d.requeueable
            )
        });
        let result = self
            .change(
                self.sql(&REQUEUE),
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
        /// The cancel of job $1, asked by $2.
        static CANCEL: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue
                    SET state = CASE WHEN {running} THEN state ELSE 'cancelled' END,
                        finished_at = CASE WHEN {running} THEN finished_at ELSE {now} END,
                        cancel_requested_at = {now}, cancel_requested_by = $2
                  WHERE id = $1
                    AND (({claimable} AND claimed_at IS NULL) OR ({running} AND cancel_requested_at IS NULL))
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state, cancel_requested_by",
                now = d.now,
                running = d.running,
                claimable = d.claimable
            )
        });
        let rows = self
            .change(
                self.sql(&CANCEL),
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
        let Some(r) = decode_first::<Cancelled>(&rows)? else { return Ok(None) };
        Ok(Some(if r.state == JobState::Running {
            CancelOutcome::Requested { holder: r.claimed_by }
        } else {
            CancelOutcome::Cancelled
        }))
    }
}
