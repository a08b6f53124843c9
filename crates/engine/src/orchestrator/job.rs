//! What a job's task runs with and how it ends: its context ([`JobCtx`]), its stop switch
//! ([`Cancel`]), its outcome, what it tells the machine ([`JobDone`], [`Rider`]) and the
//! batching of completions ([`Completer`]). Apart from the runner, so that the runner and
//! the outcome's report (`report.rs`) share them without needing each other.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::lease::Order;
use super::status::Event;
use super::watchdog::Watchdog;
use crate::agent::{AgentEnv, AgentExit, AgentResult, AgentSpec};
use crate::worktree::Workspaces;
use devpilot_store::error::{Error, Result};
use devpilot_store::job::JobState;
use devpilot_store::queue::{Backoff, Fence, MachineStore};

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
    pub(super) token: CancellationToken,
    reason: Arc<Mutex<Option<CancelReason>>>,
}

impl Cancel {
    /// A child of `parent`: cancelling the parent (a hard stop) stops this job as a hand-off.
    pub fn child_of(parent: &CancellationToken) -> Self {
        Self { token: parent.child_token(), reason: Arc::default() }
    }

    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    pub fn cancel(&self, why: CancelReason) {
        if let Ok(mut r) = self.reason.lock() {
            r.get_or_insert(why);
        }
        self.token.cancel();
    }

    pub(super) fn reason(&self) -> CancelReason {
        self.reason.lock().ok().and_then(|r| *r).unwrap_or(CancelReason::HandOff)
    }
}

/// What a job's task tells the machine when it ends, and earlier when its agent succeeded:
/// then the slot takes its next job while the completion is written.
#[derive(Debug)]
pub struct JobDone {
    pub fence: Fence,
    /// The agent could not start: the machine must stop claiming until it can.
    pub agent_error: Option<Error>,
    /// The agent succeeded: the slot is free now, and the completion may ride the poll
    /// that fills it.
    pub rider: Option<Rider>,
    /// A rider went earlier, so the slot is free already: only the lease is let go.
    pub slot_freed: bool,
}

/// A completion offered to the poll that fills its slot, so that a machine with both to do
/// sends one statement. The machine answers with the state the poll ended the claim in, or
/// drops the offer (no poll was about to go, the poll failed, or it did not end the claim),
/// and then the job's task completes on its own through the [`Completer`], which also says
/// whether the claim was fenced off.
#[derive(Debug)]
pub struct Rider {
    pub fence: Fence,
    pub reply: oneshot::Sender<JobState>,
}

/// Everything a job's task needs; shared by every job started under the same settings.
pub struct JobCtx {
    pub store: MachineStore,
    /// The repos' worktrees, when this machine has repos.
    pub workspaces: Option<Arc<Workspaces>>,
    pub watchdog: Watchdog,
    /// How often the tail of a running agent's log is stored (the heartbeat).
    pub log_every: Duration,
    pub agent: AgentSpec,
    pub env: AgentEnv,
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
    /// The longest a park may wait, whatever the agent asked for.
    pub max_park: Duration,
    /// Where a job with no repo gets a scratch directory of its own to run in.
    pub scratch_root: std::path::PathBuf,
    /// How this machine confines its agents.
    pub confining: Arc<super::confine::Confining>,
    /// The governor of usage limits and spend, as this machine runs it.
    pub governed: Arc<super::governed::Governed>,
}

pub(super) enum Outcome {
    Exited(AgentExit, Option<AgentResult>),
    /// A watchdog stopped the agent, and its verdict stands (the CLI's own report is not
    /// asked: it would only describe the stop).
    Stopped(AgentExit, Option<AgentResult>),
    Cancelled(CancelReason),
    /// A spend cap stopped the agent: its work and conversation go on as after a hand-off,
    /// and the job is parked with the reason.
    Capped(super::governed::CapStop),
}

/// One completion waiting for its batch: the claim, and where its ending goes.
struct Completion {
    fence: Fence,
    reply: oneshot::Sender<Result<Option<JobState>>>,
}

/// Batches completions from one process into one fenced statement per flush. Under load
/// each flush carries whatever queued up during the previous one; idle, it adds no delay.
#[derive(Clone)]
pub struct Completer {
    tx: mpsc::UnboundedSender<Completion>,
}

impl Completer {
    /// Runs until every clone of the returned completer is dropped.
    pub fn spawn(store: MachineStore) -> Self {
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
                let fences: Vec<Fence> = batch.iter().map(|c| c.fence).collect();
                match store.complete(&fences).await {
                    Ok(accepted) => {
                        for c in batch {
                            let ended = accepted.iter().find(|(f, _)| *f == c.fence).map(|(_, s)| *s);
                            let _ = c.reply.send(Ok(ended));
                        }
                    }
                    Err(e) => {
                        for c in batch {
                            let _ = c.reply.send(Err(e.clone()));
                        }
                    }
                }
            }
        });
        Self { tx }
    }

    /// The state the claim ended in (`completed`, or `cancelled` after a cancel), or `None`
    /// when the completion was fenced off.
    pub async fn complete(&self, fence: Fence) -> Result<Option<JobState>> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Completion { fence, reply }).map_err(|_| Error::Invalid("the completer has stopped".into()))?;
        rx.await.map_err(|_| Error::Invalid("the completer has stopped".into()))?
    }
}
