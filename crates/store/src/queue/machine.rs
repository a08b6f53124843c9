//! [`MachineStore`]: the queue as one machine of one orchestrator writes it. Every text a
//! machine writes about a job (an error, a summary, a log tail, a history note) goes through
//! here, so here is where the values of its secrets are taken out ([`Redactor`]).

use std::sync::Arc;
use std::time::Duration;

use super::fence::Fence;
use super::governor::GovernedPark;
use super::options::{Backoff, Retention, RetryAfter};
use super::pool::Queue;
use super::presence::PollExtras;
use super::route::Route;
use super::rows::{Claim, FailOutcome, OpenWork, Polled, Pruned, Renewed, Swept};
use super::session::{NewSession, SavedSession, Usage};
use crate::error::Result;
use crate::job::JobState;
use crate::redact::Redactor;

/// The queue bound to one orchestrator and one machine, which are fixed for the life of a
/// machine: its calls name only what changes, the job ([`Fence`] after a claim). Every
/// statement is still [`Queue`]'s; this only carries the two names to it, and redacts the
/// text it writes.
#[derive(Clone, Debug)]
pub struct MachineStore {
    queue: Queue,
    orchestrator_id: Arc<str>,
    machine: Arc<str>,
    redactor: Redactor,
}

impl MachineStore {
    pub fn new(queue: Queue, orchestrator_id: &str, machine: &str) -> Self {
        Self { queue, orchestrator_id: orchestrator_id.into(), machine: machine.into(), redactor: Redactor::default() }
    }

    /// The same store, taking `redactor`'s values out of every text it writes.
    pub fn with_redactor(self, redactor: Redactor) -> Self {
        Self { redactor, ..self }
    }

    /// The values this store takes out of what it writes.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// The queue underneath, for what is not one machine's (the tray's window, presence).
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    pub fn orchestrator_id(&self) -> &str {
        &self.orchestrator_id
    }

    pub fn machine(&self) -> &str {
        &self.machine
    }

    /// The same store with every call bounded by `bound` ([`Queue::with_call_timeout`]).
    pub fn with_call_timeout(self, bound: Duration) -> Self {
        Self { queue: self.queue.with_call_timeout(bound), ..self }
    }

    /// The pick-and-claim of up to `limit` jobs, with a poll's housekeeping
    /// ([`Queue::claim_next_with`]).
    pub async fn poll(&self, limit: u32, extras: &PollExtras<'_>) -> Result<Polled> {
        self.queue.claim_next_with(&self.orchestrator_id, &self.machine, limit, extras).await
    }

    /// Claimable ids `route` may take, for the claim by id ([`Queue::candidates_for`]).
    pub async fn candidates(&self, limit: u32, route: &Route) -> Result<Vec<i64>> {
        self.queue.candidates_for(&self.orchestrator_id, limit, route).await
    }

    /// The conditional claim of job `id` ([`Queue::claim_by_id`]).
    pub async fn claim(&self, id: i64) -> Result<Option<Claim>> {
        self.queue.claim_by_id(id, &self.orchestrator_id, &self.machine).await
    }

    pub async fn renew(&self, held: &[Fence]) -> Result<Renewed> {
        self.queue.renew_leases(held).await
    }

    pub async fn complete(&self, done: &[Fence]) -> Result<Vec<(Fence, JobState)>> {
        self.queue.complete_many(done, &self.machine).await
    }

    pub async fn fail(&self, fence: &Fence, error: &str, defaults: Backoff) -> Result<Option<FailOutcome>> {
        self.queue.fail_with(fence, &self.machine, &self.redactor.redact(error), defaults).await
    }

    pub async fn park(
        &self,
        fence: &Fence,
        after: RetryAfter,
        defaults: Backoff,
        reason: Option<&str>,
    ) -> Result<Option<(JobState, i64)>> {
        let reason = self.redactor.redact_opt(reason);
        self.queue.park_because(fence, &self.machine, after, defaults, reason.as_deref()).await
    }

    pub async fn record_result(&self, fence: &Fence, summary: Option<&str>, url: Option<&str>) -> Result<bool> {
        let (summary, url) = (self.redactor.redact_opt(summary), self.redactor.redact_opt(url));
        self.queue.record_result(fence, summary.as_deref(), url.as_deref()).await
    }

    pub async fn record_worktree(&self, fence: &Fence, worktree: &str) -> Result<bool> {
        self.queue.record_worktree(fence, worktree).await
    }

    pub async fn record_agent_start(
        &self,
        fence: &Fence,
        agent: &str,
        session_from: Option<&str>,
        account: Option<&str>,
    ) -> Result<bool> {
        self.queue.record_agent_start(fence, agent, session_from, account).await
    }

    /// Parks claim `fence` for the governor, with the hold it names ([`Queue::park_governed`]).
    pub async fn park_governed(&self, fence: &Fence, park: &GovernedPark<'_>) -> Result<Option<(JobState, i64)>> {
        let reason = self.redactor.redact(park.reason);
        let park = GovernedPark { reason: &reason, ..park.clone() };
        self.queue.park_governed(fence, &self.machine, &park).await
    }

    /// Ends the hold on `account` ([`Queue::end_hold`]).
    pub async fn end_hold(&self, account: &str) -> Result<bool> {
        self.queue.end_hold(&self.orchestrator_id, account).await
    }

    /// The spend since `day_start_ms`, the fleet's or `account`'s ([`Queue::spent_since`]).
    pub async fn spent_since(&self, day_start_ms: i64, account: Option<&str>) -> Result<f64> {
        self.queue.spent_since(&self.orchestrator_id, day_start_ms, account).await
    }

    /// The 80 % warning of claim `fence`'s cap, once per job ([`Queue::warn_spend_once`]).
    pub async fn warn_spend_once(&self, fence: &Fence, detail: &str) -> Result<bool> {
        self.queue.warn_spend_once(fence, &self.machine, &self.redactor.redact(detail)).await
    }

    /// The day's 80 % warning, once per fleet ([`Queue::warn_day_once`]).
    pub async fn warn_day_once(&self, day_start_ms: i64) -> Result<bool> {
        self.queue.warn_day_once(&self.orchestrator_id, day_start_ms).await
    }

    pub async fn record_agent_usage(&self, fence: &Fence, usage: &Usage) -> Result<bool> {
        self.queue.record_agent_usage(fence, usage).await
    }

    pub async fn save_session(&self, fence: &Fence, session: &NewSession<'_>) -> Result<bool> {
        self.queue.save_session(fence, &self.machine, session).await
    }

    pub async fn load_session(&self, job: i64) -> Result<Option<SavedSession>> {
        self.queue.load_session(job).await
    }

    /// A history note about the agent of claim `fence` (a session resumed, or why not).
    pub async fn note_agent(&self, fence: &Fence, kind: &str, detail: &str) {
        self.queue.note_now(fence.job, kind, &self.machine, Some(fence.token), &self.redactor.redact(detail)).await
    }

    pub async fn record_branch(&self, fence: &Fence, remote: Option<&str>, commits: Option<i64>) -> Result<bool> {
        let remote = remote.map(|r| self.redactor.redact(r));
        self.queue.record_branch(fence, remote.as_deref(), commits).await
    }

    pub async fn store_log_tail(&self, fence: &Fence, tail: &str) -> Result<bool> {
        self.queue.store_log_tail(fence, &self.machine, &self.redactor.redact(tail)).await
    }

    pub async fn finish_cancel(&self, fence: &Fence) -> Result<bool> {
        self.queue.finish_cancel(fence, &self.machine).await
    }

    pub async fn release(&self, fence: &Fence, reason: &str, resume: Option<&str>) -> Result<bool> {
        self.queue.release_with(fence, &self.machine, &self.redactor.redact(reason), resume).await
    }

    /// Names `branch` as where job `id`'s work went, after a hand-off pushed it late.
    pub async fn resume_later(&self, id: i64, branch: &str) -> Result<bool> {
        self.queue.resume_later(id, branch, &self.machine).await
    }

    /// A history note about this machine's claim of a job (never fails; logged).
    pub async fn note(&self, fence: &Fence, kind: &str, detail: &str) {
        self.queue.note(fence.job, kind, &self.machine, Some(fence.token), &self.redactor.redact(detail)).await
    }

    /// What is left for a machine with `route` that drains until empty.
    pub async fn open_work(&self, route: &Route) -> Result<OpenWork> {
        self.queue.open_work(&self.orchestrator_id, route).await
    }

    /// The sweep of this orchestrator's stale claims ([`Queue::sweep`]).
    pub async fn sweep(&self, claim_timeout: Duration) -> Result<Vec<Swept>> {
        self.queue.sweep(Some(&self.orchestrator_id), claim_timeout).await
    }

    /// Retention of this orchestrator's finished work ([`Queue::prune`]).
    pub async fn prune(&self, r: &Retention, batch: u32) -> Result<Pruned> {
        self.queue.prune(Some(&self.orchestrator_id), r, batch).await
    }
}
