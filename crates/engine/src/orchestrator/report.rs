//! Writing a job's outcome, fenced by its claim, and saying what happened: a completion
//! (offered to the next poll first), a failure, a park (a governed one through
//! [`super::governed`]), a cancel or a hand-off; and with a worktree, what becomes of the work
//! in progress first.

use super::bounds;
use super::job::{CancelReason, JobCtx, JobDone, Outcome, Rider};
use super::status::{Carried, Event, JobRef, LossReason};
use crate::agent::{AgentExit, AgentResult};
use crate::worktree::{Workspaces, Worktree};
use devpilot_store::error::Error;
use devpilot_store::job::{event, JobState};
use devpilot_store::queue::{FailOutcome, Fence, RetryAfter};
use devpilot_store::retry::{self, Budget};
use tokio::sync::oneshot;

/// The outcome of a job with a worktree: a hand-off carries the work in progress (commit,
/// push within the bound, and the branch named in the fenced release); a completion pushes
/// if the repo says so and removes the worktree when nothing would be lost (else the job
/// says where it is kept); anything else keeps it for the next attempt here. `carry` (the
/// conversation's save) runs beside a hand-off's push, and before anything else's end.
pub(super) async fn report_with_worktree(
    ctx: &JobCtx,
    ws: &Workspaces,
    wt: &Worktree,
    job: JobRef,
    outcome: Outcome,
    carry: impl std::future::Future<Output = ()>,
) -> Option<Event> {
    match outcome {
        // A hand-off, a cap's stop and a usage limit's park carry the work in progress: the
        // job goes on from the pushed branch on whichever machine claims it next.
        outcome @ (Outcome::Cancelled(CancelReason::HandOff) | Outcome::Capped(_)) => {
            let (carried, ()) = tokio::join!(ws.hand_off(wt), carry);
            tracing::info!(job = job.id, took_ms = carried.took.as_millis() as u64, "{}", carried.detail);
            let ev = report(ctx, job, outcome, Some(carried.clone())).await;
            ws.after_hand_off(wt, &carried).await;
            ev
        }
        Outcome::Exited(AgentExit::TryLater, Some(r)) if r.limited => {
            let (carried, ()) = tokio::join!(ws.hand_off(wt), carry);
            tracing::info!(job = job.id, "a usage limit: {}", carried.detail);
            let ev = report(ctx, job, Outcome::Exited(AgentExit::TryLater, Some(r)), Some(carried.clone())).await;
            ws.after_hand_off(wt, &carried).await;
            ev
        }
        Outcome::Exited(AgentExit::Success, result) => {
            carry.await;
            let finished = ws.finish(wt, true).await;
            let fence = job.fence();
            if let Some(kept) = &finished.kept {
                let write = || ctx.store.record_worktree(&fence, kept);
                if let Err(e) = retry::transient("recording the worktree", Budget::NOTE, write).await {
                    tracing::warn!(job = job.id, error = %e, "could not record where the worktree is kept");
                }
            }
            // Before the completion: its pull request row reads where the branch went.
            if finished.pushed.is_some() || finished.commits.is_some() {
                let write = || ctx.store.record_branch(&fence, finished.pushed.as_deref(), finished.commits);
                if let Err(e) = retry::transient("recording the push", Budget::NOTE, write).await {
                    tracing::warn!(job = job.id, error = %e, "could not record where the branch was pushed");
                }
            }
            report(ctx, job, Outcome::Exited(AgentExit::Success, result), None).await
        }
        other => {
            carry.await;
            ws.finish(wt, false).await;
            report(ctx, job, other, None).await
        }
    }
}

/// Keeps the agent's summary and link on the job (fenced). Failing to is logged: the
/// outcome matters more than its description.
async fn keep_result(ctx: &JobCtx, fence: Fence, r: &AgentResult) {
    if r.summary.is_none() && r.url.is_none() {
        return;
    }
    let write = || ctx.store.record_result(&fence, r.summary.as_deref(), r.url.as_deref());
    if let Err(e) = retry::transient("recording the result", Budget::NOTE, write).await {
        tracing::warn!(job = fence.job, error = %e, "could not record the agent's result");
    }
}

/// Writes the outcome (fenced) and says what happened. `carried`: what a hand-off did with
/// the work in progress.
pub(super) async fn report(
    ctx: &JobCtx,
    job: JobRef,
    outcome: Outcome,
    carried: Option<crate::worktree::HandOff>,
) -> Option<Event> {
    let (fence, id) = (job.fence(), job.id);
    match outcome {
        Outcome::Exited(exit, result) | Outcome::Stopped(exit, result) => {
            let (exit, result) = bounds::redacted(ctx.store.redactor(), exit, result.unwrap_or_default());
            keep_result(ctx, fence, &result).await;
            let pushed = carried.as_ref().and_then(|c| c.pushed.as_deref());
            report_exit(ctx, job, exit, result, pushed).await
        }
        Outcome::Capped(stop) => super::governed::park_capped(&ctx.store, job, &stop, carried.as_ref()).await,
        Outcome::Cancelled(CancelReason::Cancelled) => {
            match retry::transient("cancelling", Budget::WRITE, || ctx.store.finish_cancel(&fence)).await {
                Ok(true) => Some(Event::Cancelled { job }),
                Ok(false) => Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired }),
                Err(e) => gave_up(id, "the cancel", e),
            }
        }
        Outcome::Cancelled(CancelReason::HandOff) => {
            let reason = match &carried {
                Some(c) => format!("handed off by its machine; {}", c.detail),
                None => "handed off by its machine".to_string(),
            };
            let resume = carried.as_ref().and_then(|c| c.pushed.as_deref());
            match retry::transient("handing off", Budget::WRITE, || ctx.store.release(&fence, &reason, resume)).await {
                Ok(true) => Some(Event::Released { job, carried: Carried::of(carried.as_ref()) }),
                Ok(false) => Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired }),
                Err(e) => gave_up(id, "the hand-off", e),
            }
        }
        Outcome::Cancelled(CancelReason::LeaseLost) => {
            note_later(ctx, fence, event::LEASE_LOST, "a renewal found the lease gone; agent stopped");
            Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired })
        }
        Outcome::Cancelled(CancelReason::LeaseExpired) => {
            // The outcome is never written: the sweep hands the job to the next machine.
            let detail = "no renewal confirmed before the local deadline; agent stopped";
            note_later(ctx, fence, event::LEASE_EXPIRED, detail);
            Some(Event::LeaseLost { job, reason: LossReason::DeadlinePassed })
        }
    }
}

/// Writes the outcome of an agent that exited.
pub(super) async fn report_exit(
    ctx: &JobCtx,
    job: JobRef,
    exit: AgentExit,
    result: AgentResult,
    pushed: Option<&str>,
) -> Option<Event> {
    let (fence, id) = (job.fence(), job.id);
    match exit {
        AgentExit::Success => {
            let ended = match ride(ctx, fence).await {
                Some(state) => Ok(Some(state)),
                None => retry::transient("completing", Budget::WRITE, || ctx.completer.complete(fence)).await,
            };
            match ended {
                Ok(Some(JobState::Cancelled)) => Some(Event::Cancelled { job }),
                Ok(Some(_)) => {
                    super::governed::success_under(&ctx.store, ctx.governed.known_account().as_deref(), id).await;
                    Some(Event::Completed { job, summary: result.summary, url: result.url })
                }
                Ok(None) => Some(Event::LeaseLost { job, reason: LossReason::CompletionRejected }),
                Err(e) => gave_up(id, "the completion", e),
            }
        }
        AgentExit::Failed(msg) => {
            let fail = || ctx.store.fail(&fence, &msg, ctx.backoff);
            match retry::transient("failing", Budget::WRITE, fail).await {
                Ok(Some(FailOutcome::Cancelled)) => Some(Event::Cancelled { job }),
                Ok(Some(o)) => Some(Event::Failed { job, error: msg, dead: o == FailOutcome::Dead }),
                Ok(None) => Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired }),
                Err(e) => gave_up(id, "the failure", e),
            }
        }
        AgentExit::TryLater if result.limited => {
            let by = (&ctx.store, &*ctx.governed, ctx.max_park);
            super::governed::park_limited(by, job, result, pushed).await
        }
        AgentExit::TryLater => {
            let asked = result.retry_after.unwrap_or(RetryAfter::Backoff);
            let (after, cap_note) = bounds::capped(asked, ctx.max_park, bounds::now_ms());
            let why = bounds::park_reason(result.parked_why, cap_note);
            let park = || ctx.store.park(&fence, after, ctx.backoff, why.as_deref());
            match retry::transient("parking", Budget::WRITE, park).await {
                Ok(Some((JobState::Cancelled, _))) => Some(Event::Cancelled { job }),
                Ok(Some((_, until))) => Some(Event::Parked { job, until_unix_ms: until }),
                Ok(None) => Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired }),
                Err(e) => gave_up(id, "the park", e),
            }
        }
    }
}

/// Offers the completion of claim `fence` to the poll that fills its slot ([`Rider`]): the
/// slot is free from now on. `None`: the machine did not carry it.
async fn ride(ctx: &JobCtx, fence: Fence) -> Option<JobState> {
    let (reply, answer) = oneshot::channel();
    let rider = Some(Rider { fence, reply });
    ctx.done.send(JobDone { fence, agent_error: None, rider, slot_freed: false }).ok()?;
    answer.await.ok()
}

/// Records a loss once the database answers again, on a task of its own: the job's task ends
/// as soon as its agent is dead, so no stop or hand-off waits on a database that is gone.
fn note_later(ctx: &JobCtx, fence: Fence, kind: &'static str, detail: &'static str) {
    let store = ctx.store.clone();
    tokio::spawn(async move { store.note(&fence, kind, detail).await });
}

/// A write that could not be made within its budget: the sweep recovers the job.
fn gave_up(id: i64, what: &str, e: Error) -> Option<Event> {
    tracing::error!(job = id, error = %e, "giving up on {what}; the sweep will recover the job");
    None
}
