//! The runner: starts one agent per claim, stops it when told (and why), and reports the
//! outcome with fenced writes. A job's task never decides *whether* to stop; the machine does
//! (a hand-off, a lost or expired lease, a user's cancel) through the job's [`Cancel`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::lease::{Order, Standing};
use super::{Event, JobRef, LossReason};
use crate::agent::{AgentEnv, AgentExit, AgentResult, AgentSpec, RunningAgent};
use crate::error::{Error, Result};
use crate::job::{event, JobState};
use crate::queue::{Backoff, Claim, FailOutcome, Queue, RetryAfter};
use crate::retry::{self, Budget};

/// Why a job's agent is being stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelReason {
    /// The user or the machine hands the job back: release it, attempt not counted.
    HandOff,
    /// A renewal found the lease gone.
    LeaseLost,
    /// The local deadline passed with no confirmed renewal.
    LeaseExpired,
    /// A user cancelled the job (seen at a renewal): stop the agent, end the claim cancelled.
    Cancelled,
}

/// A job's stop switch: the first reason given wins.
#[derive(Clone)]
pub struct Cancel {
    token: CancellationToken,
    reason: Arc<Mutex<Option<CancelReason>>>,
}

impl Cancel {
    /// A child of `parent`: cancelling the parent (a hard stop) stops this job as a hand-off.
    pub fn child_of(parent: &CancellationToken) -> Self {
        Self { token: parent.child_token(), reason: Arc::default() }
    }

    pub fn cancel(&self, why: CancelReason) {
        if let Ok(mut r) = self.reason.lock() {
            r.get_or_insert(why);
        }
        self.token.cancel();
    }

    fn reason(&self) -> CancelReason {
        self.reason.lock().ok().and_then(|r| *r).unwrap_or(CancelReason::HandOff)
    }
}

/// What a job's task tells the machine when it ends.
#[derive(Debug)]
pub struct JobDone {
    pub id: i64,
    pub token: i64,
    /// The agent could not start: the machine must stop claiming until it can.
    pub agent_error: Option<Error>,
}

/// Everything a job's task needs; shared by every job started under the same settings.
pub struct JobCtx {
    pub queue: Queue,
    pub agent: AgentSpec,
    pub env: AgentEnv,
    pub machine: String,
    /// SIGTERM to SIGKILL on a hand-off.
    pub grace: Duration,
    /// SIGTERM to SIGKILL when the lease is gone: short, the other machine may start soon.
    pub kill_grace: Duration,
    pub events: broadcast::Sender<Event>,
    pub completer: Completer,
    pub done: mpsc::UnboundedSender<JobDone>,
    /// The lease keeper, asked before an outcome is written.
    pub keeper: mpsc::UnboundedSender<Order>,
    /// The retry backoff of jobs that carry none of their own.
    pub backoff: Backoff,
}

enum Outcome {
    Exited(AgentExit, Option<AgentResult>),
    Cancelled(CancelReason),
}

/// Runs `claim` to its end and reports it.
pub async fn run_job(ctx: Arc<JobCtx>, claim: Claim, cancel: Cancel) {
    let job = JobRef::of(&claim);
    let (id, token) = (claim.id, claim.token);
    let mut agent = match ctx.agent.start(&claim, &ctx.env).await {
        Ok(a) => a,
        Err(e) => {
            // A broken agent is this machine's problem, not the job's: hand it back unharmed,
            // and tell the machine, which stops claiming until the agent is back.
            tracing::error!(job = id, error = %e, "agent could not start");
            let _ = ctx.events.send(Event::AgentError { job: job.clone(), error: e.to_string() });
            let reason = format!("not run here: {e}");
            let _ =
                retry::transient("handing back", Budget::WRITE, || ctx.queue.release(id, token, &ctx.machine, &reason))
                    .await;
            let _ = ctx.done.send(JobDone { id, token, agent_error: Some(e) });
            return;
        }
    };
    let outcome = tokio::select! {
        biased;
        exit = agent.wait() => Outcome::Exited(exit, result_of(&agent, id)),
        _ = cancel.token.cancelled() => {
            let why = cancel.reason();
            match agent.try_exit() {
                // It finished just as we were told to stop by a hand-off: report the outcome
                // (fenced). After a lost or expired lease the outcome is not ours to write.
                Some(exit) if why == CancelReason::HandOff => Outcome::Exited(exit, result_of(&agent, id)),
                _ => {
                    let grace = if why == CancelReason::HandOff { ctx.grace } else { ctx.kill_grace };
                    agent.terminate(grace).await;
                    Outcome::Cancelled(why)
                }
            }
        }
    };
    drop(agent);
    let outcome = match outcome {
        Outcome::Exited(exit, result) => match standing(&ctx, (id, token)).await {
            Standing::Held => Outcome::Exited(exit, result),
            // Past the deadline (say the runner was frozen while its agent finished) the
            // outcome is not ours to write, even if the agent did the work.
            Standing::Expired => Outcome::Cancelled(CancelReason::LeaseExpired),
            Standing::Lost => Outcome::Cancelled(CancelReason::LeaseLost),
        },
        cancelled => cancelled,
    };
    if let Some(ev) = report(&ctx, job, outcome).await {
        let _ = ctx.events.send(ev);
    }
    let _ = ctx.done.send(JobDone { id, token, agent_error: None });
}

/// Asks the lease keeper where this claim stands. No keeper (the machine is going away):
/// held, and the fenced write decides.
async fn standing(ctx: &JobCtx, pair: (i64, i64)) -> Standing {
    let (tx, rx) = oneshot::channel();
    if ctx.keeper.send(Order::Standing { pair, reply: tx }).is_err() {
        return Standing::Held;
    }
    rx.await.unwrap_or(Standing::Held)
}

/// What the agent wrote to its result file; a malformed file is logged and ignored.
fn result_of(agent: &RunningAgent, id: i64) -> Option<AgentResult> {
    match agent.result() {
        Ok(r) => r,
        Err(why) => {
            tracing::warn!(job = id, "ignoring the agent's result file: {why}");
            None
        }
    }
}

/// Keeps the agent's summary and link on the job (fenced). Failing to is logged: the
/// outcome matters more than its description.
async fn keep_result(ctx: &JobCtx, (id, token): (i64, i64), r: &AgentResult) {
    if r.summary.is_none() && r.url.is_none() {
        return;
    }
    let write = || ctx.queue.record_result(id, token, r.summary.as_deref(), r.url.as_deref());
    if let Err(e) = retry::transient("recording the result", Budget::NOTE, write).await {
        tracing::warn!(job = id, error = %e, "could not record the agent's result");
    }
}

/// Writes the outcome (fenced) and says what happened.
async fn report(ctx: &JobCtx, job: JobRef, outcome: Outcome) -> Option<Event> {
    let (id, token, m) = (job.id, job.token, ctx.machine.as_str());
    match outcome {
        Outcome::Exited(exit, result) => {
            let result = result.unwrap_or_default();
            keep_result(ctx, (id, token), &result).await;
            report_exit(ctx, job, exit, result).await
        }
        Outcome::Cancelled(CancelReason::Cancelled) => {
            match retry::transient("cancelling", Budget::WRITE, || ctx.queue.finish_cancel(id, token, m)).await {
                Ok(true) => Some(Event::Cancelled { job }),
                Ok(false) => Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired }),
                Err(e) => gave_up(id, "the cancel", e),
            }
        }
        Outcome::Cancelled(CancelReason::HandOff) => {
            match retry::transient("handing off", Budget::WRITE, || {
                ctx.queue.release(id, token, m, "handed off by its machine")
            })
            .await
            {
                Ok(true) => Some(Event::Released { job }),
                Ok(false) => Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired }),
                Err(e) => gave_up(id, "the hand-off", e),
            }
        }
        Outcome::Cancelled(CancelReason::LeaseLost) => {
            note_later(ctx, (id, token), event::LEASE_LOST, "a renewal found the lease gone; agent stopped");
            Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired })
        }
        Outcome::Cancelled(CancelReason::LeaseExpired) => {
            // The outcome is never written: the sweep hands the job to the next machine.
            let detail = "no renewal confirmed before the local deadline; agent stopped";
            note_later(ctx, (id, token), event::LEASE_EXPIRED, detail);
            Some(Event::LeaseLost { job, reason: LossReason::DeadlinePassed })
        }
    }
}

/// Writes the outcome of an agent that exited.
async fn report_exit(ctx: &JobCtx, job: JobRef, exit: AgentExit, result: AgentResult) -> Option<Event> {
    let (id, token, m) = (job.id, job.token, ctx.machine.as_str());
    match exit {
        AgentExit::Success => {
            match retry::transient("completing", Budget::WRITE, || ctx.completer.complete(id, token)).await {
                Ok(Some(JobState::Cancelled)) => Some(Event::Cancelled { job }),
                Ok(Some(_)) => Some(Event::Completed { job, summary: result.summary, url: result.url }),
                Ok(None) => Some(Event::LeaseLost { job, reason: LossReason::CompletionRejected }),
                Err(e) => gave_up(id, "the completion", e),
            }
        }
        AgentExit::Failed(msg) => {
            let fail = || ctx.queue.fail_with(id, token, m, &msg, ctx.backoff);
            match retry::transient("failing", Budget::WRITE, fail).await {
                Ok(Some(FailOutcome::Cancelled)) => Some(Event::Cancelled { job }),
                Ok(Some(o)) => Some(Event::Failed { job, error: msg, dead: o == FailOutcome::Dead }),
                Ok(None) => Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired }),
                Err(e) => gave_up(id, "the failure", e),
            }
        }
        AgentExit::TryLater => {
            let after = result.retry_after.unwrap_or(RetryAfter::Backoff);
            let park = || ctx.queue.park(id, token, m, after, ctx.backoff);
            match retry::transient("parking", Budget::WRITE, park).await {
                Ok(Some((JobState::Cancelled, _))) => Some(Event::Cancelled { job }),
                Ok(Some((_, until))) => Some(Event::Parked { job, until_unix_ms: until }),
                Ok(None) => Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired }),
                Err(e) => gave_up(id, "the park", e),
            }
        }
    }
}

/// Records a loss once the database answers again, on a task of its own: the job's task ends
/// as soon as its agent is dead, so no stop or hand-off waits on a database that is gone.
fn note_later(ctx: &JobCtx, (id, token): (i64, i64), kind: &'static str, detail: &'static str) {
    let (q, machine) = (ctx.queue.clone(), ctx.machine.clone());
    tokio::spawn(async move { q.note(id, kind, &machine, Some(token), detail).await });
}

/// A write that could not be made within its budget: the sweep recovers the job.
fn gave_up(id: i64, what: &str, e: Error) -> Option<Event> {
    tracing::error!(job = id, error = %e, "giving up on {what}; the sweep will recover the job");
    None
}

/// One completion waiting for its batch: the claim, and where its ending goes.
type Completion = (i64, i64, oneshot::Sender<Result<Option<JobState>>>);

/// Batches completions from one process into one fenced statement per flush. Under load
/// each flush carries whatever queued up during the previous one; idle, it adds no delay.
#[derive(Clone)]
pub struct Completer {
    tx: mpsc::UnboundedSender<Completion>,
}

impl Completer {
    /// Runs until every clone of the returned completer is dropped.
    pub fn spawn(queue: Queue, machine: String) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Completion>();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < 256 {
                    match rx.try_recv() {
                        Ok(x) => batch.push(x),
                        Err(_) => break,
                    }
                }
                let pairs: Vec<(i64, i64)> = batch.iter().map(|(i, t, _)| (*i, *t)).collect();
                match queue.complete_many(&pairs, &machine).await {
                    Ok(accepted) => {
                        for (id, token, reply) in batch {
                            let ended = accepted.iter().find(|(p, _)| *p == (id, token)).map(|(_, s)| *s);
                            let _ = reply.send(Ok(ended));
                        }
                    }
                    Err(e) => {
                        for (_, _, reply) in batch {
                            let _ = reply.send(Err(e.clone()));
                        }
                    }
                }
            }
        });
        Self { tx }
    }

    /// The state the claim ended in (`completed`, or `cancelled` after a cancel), or `None`
    /// when the completion was fenced off.
    pub async fn complete(&self, id: i64, token: i64) -> Result<Option<JobState>> {
        let (tx, rx) = oneshot::channel();
        self.tx.send((id, token, tx)).map_err(|_| Error::Invalid("the completer has stopped".into()))?;
        rx.await.map_err(|_| Error::Invalid("the completer has stopped".into()))?
    }
}
