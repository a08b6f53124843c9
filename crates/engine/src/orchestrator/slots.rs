//! The [`Machine`]'s slots: polling for claims, starting jobs into free slots, and what the
//! lease keeper and finished jobs report about them.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

use super::config::ClaimMode;
use super::handle::StopMode;
use super::lease::{News, Order};
use super::machine::{unix_ms, Machine, Net, Slot};
use super::poller::ClaimRequest;
use super::runner::{run_job, Cancel, CancelReason, JobDone};
use super::status::{Event, JobRef};
use devpilot_store::error::Result;
use devpilot_store::queue::Fence;
use devpilot_store::queue::{Claim, Polled};

impl Machine {
    pub(super) fn job_done(&mut self, done: JobDone) {
        if done.slot_freed {
            // The end of a job whose rider freed its slot: its completion is written.
            let _ = self.keeper.send(Order::Forget(done.fence));
            return;
        }
        if self.slots.get(&done.fence.job).is_some_and(|s| s.job.fence() == done.fence) {
            self.slots.remove(&done.fence.job);
        }
        match done.rider {
            // The lease is kept until the completion is written: the job's end lets it go.
            Some(rider) => self.riders.push(rider),
            None => {
                let _ = self.keeper.send(Order::Forget(done.fence));
            }
        }
        if let Some(e) = &done.agent_error {
            self.set_problem(e);
        }
        // A slot freed up: look for more work now.
        self.poller.now();
        self.publish();
    }

    pub(super) fn lease_news(&mut self, news: News) {
        let cancel = |m: &Self, fence: Fence, why| {
            if let Some(s) = m.slots.get(&fence.job).filter(|s| s.job.fence() == fence) {
                s.cancel.cancel(why);
            }
        };
        match news {
            News::Lost(fence) => cancel(self, fence, CancelReason::LeaseLost),
            News::Expired(fence) => cancel(self, fence, CancelReason::LeaseExpired),
            News::CancelAsked(fence) => {
                if self.slots.get(&fence.job).is_some_and(|s| s.job.fence() == fence) {
                    tracing::info!(job = fence.job, "a cancel was asked for; stopping the agent");
                }
                cancel(self, fence, CancelReason::Cancelled)
            }
            News::ReleaseAsked(fence) => self.release_asked(fence),
            News::Reached => self.set_online(true, None),
            News::Unreachable(e) => {
                tracing::warn!(error = %e, "heartbeat failed");
                self.emit(Event::HeartbeatFailed { error: e.to_string() });
                self.set_online(false, Some(e.to_string()));
            }
        }
    }

    /// Whether completions can ride the next poll: one is about to go (none in flight) and it
    /// will claim. Otherwise they are dropped at once, and their tasks complete on their own
    /// (see [`super::runner::Rider`]): a completion never waits for a poll that may not come.
    pub(super) fn can_carry(&self) -> bool {
        self.cfg.claim_mode == ClaimMode::Pick
            && self.accepting()
            && self.poller.due().is_some()
            && (self.slots.len() as u32) < self.cfg.concurrency
    }

    pub(super) fn poll(&mut self) {
        self.stats.polls.fetch_add(1, Ordering::Relaxed);
        let free = self.cfg.concurrency.saturating_sub(self.slots.len() as u32);
        let riders = std::mem::take(&mut self.riders);
        self.maintenance.prune_tick();
        self.sources.tick();
        if !self.accepting() || free == 0 {
            self.maintenance.tick();
            self.maybe_presence();
            // Nothing to claim; a command or a finished job wakes us.
            self.poller.rest(self.cfg.presence_every);
            return;
        }
        self.poller.started();
        // The herd-free pick carries the housekeeping that is due, so that an idle machine
        // sends one statement per poll: presence in the same statement, and a read-only
        // stale-lease test whose answer decides whether a sweep is worth a statement.
        let by_id = self.cfg.claim_mode == ClaimMode::ById;
        // The claim by id carries nothing (`can_carry` says so too): its riders go back now.
        let riders = if by_id { Vec::new() } else { riders };
        let presence = (!by_id && self.presence_due()).then(|| self.presence_fields());
        let stale_after = (!by_id && self.maintenance.take_due()).then_some(self.cfg.claim_timeout);
        if by_id {
            self.maintenance.tick();
            self.maybe_presence();
        }
        let req = ClaimRequest {
            store: self.store.clone(),
            mode: self.cfg.claim_mode,
            free,
            presence,
            stale_after,
            route: Arc::new(self.cfg.route()),
            governed: self.ctx.governed.clone(),
            stats: self.stats.clone(),
            events: self.events.clone(),
            done: riders.iter().map(|r| r.fence).collect(),
        };
        let (tx, hold, sent) = (self.net_tx.clone(), self.work.token(), self.clock.now());
        let stats = self.stats.clone();
        tokio::spawn(async move {
            let result = req.run().await;
            if let Ok(p) = &result {
                for r in riders {
                    // A rider the poll did not end is dropped: its task completes on its own.
                    if let Some((_, state)) = p.completed.iter().find(|(f, _)| *f == r.fence) {
                        stats.completions_carried.fetch_add(1, Ordering::Relaxed);
                        let _ = r.reply.send(*state);
                    }
                }
            }
            let _ = tx.send(Net::Polled { result, asked: free, sent, hold });
        });
    }

    pub(super) fn net(&mut self, net: Net) {
        match net {
            Net::Polled { result, asked, sent, hold } => self.polled(result, asked, sent, hold),
            Net::OpenWork(Ok(w)) if w.open == 0 && self.slots.is_empty() && self.stop.is_none() => {
                if w.unroutable > 0 {
                    tracing::warn!(
                        "no work this machine can take is left; {} queued job(s) wait for a machine with other \
                         repos or labels (`devpilot status` says which, and why)",
                        w.unroutable
                    );
                }
                self.begin_stop(StopMode::HandOff, None);
                self.publish();
            }
            Net::OpenWork(_) => {}
        }
    }

    pub(super) fn polled(&mut self, result: Result<Polled>, asked: u32, sent: Duration, hold: TaskTrackerToken) {
        let polled = match result {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "poll failed");
                self.set_online(false, Some(e.to_string()));
                self.poller.failed();
                return;
            }
        };
        self.set_online(true, None);
        if polled.stale {
            self.maintenance.sweep();
        }
        if !self.accepting() || !TaskTracker::ptr_eq(hold.task_tracker(), &self.work) {
            // Dispatch went off, a pause, a hand-off or a stop began, or the agent went
            // missing, while this poll was in flight: these claims are not wanted here (a
            // hand-off that goes on claiming still gives back what was asked for before it).
            // They go back on the poll's own tracker, so whatever waits for it waits for them.
            for c in polled.claims {
                self.hand_back(c, hold.task_tracker());
            }
            self.poller.answered(0, asked, false, self.cfg.until_empty);
            self.publish();
            return;
        }
        let got = polled.claims.len();
        for c in polled.claims {
            self.start_job(c, sent);
        }
        let busy = self.slots.len() as u32 >= self.cfg.concurrency;
        self.poller.answered(got, asked, busy, self.cfg.until_empty);
        if let Some(d) = polled.next_due {
            // A job waits for a time (scheduled, or backing off): poll when it is due, not
            // at the idle ceiling.
            self.poller.cap(d);
        }
        if got == 0 && self.cfg.until_empty && self.slots.is_empty() {
            self.check_open_work();
        }
        self.publish();
    }

    /// Releases a claim that landed after this machine stopped claiming, unrun and without
    /// burning an attempt.
    pub(super) fn hand_back(&self, c: Claim, on: &TaskTracker) {
        tracing::info!(job = c.fence.job, "a claim landed after claiming stopped; handing it back");
        let store = self.store.clone();
        on.spawn(async move {
            let reason = "claimed just as this machine stopped claiming; handed back unrun";
            let release = || store.release(&c.fence, reason, None);
            if let Err(e) =
                devpilot_store::retry::transient("handing back", devpilot_store::retry::Budget::WRITE, release).await
            {
                tracing::warn!(job = c.fence.job, error = %e, "could not hand a claim back; the sweep will");
            }
        });
    }

    pub(super) fn start_job(&mut self, claim: Claim, sent: Duration) {
        let job = JobRef::of(&claim);
        if let Some(old) = self.slots.remove(&claim.fence.job) {
            // We re-claimed a job whose earlier claim of ours was swept (say, this machine
            // stalled past the timeout). That old run is no longer ours: stop it.
            old.cancel.cancel(CancelReason::LeaseLost);
            let _ = self.keeper.send(Order::Forget(old.job.fence()));
        }
        let _ = self.keeper.send(Order::Hold { fence: claim.fence, sent });
        let cancel = Cancel::child_of(&self.hard_stop);
        self.slots.insert(claim.fence.job, Slot { job: job.clone(), started: unix_ms(), cancel: cancel.clone() });
        self.emit(Event::Claimed { job });
        self.work.spawn(run_job(self.ctx.clone(), claim, cancel));
    }

    pub(super) fn check_open_work(&self) {
        let (store, tx) = (self.store.clone(), self.net_tx.clone());
        let route = self.cfg.route();
        self.work.spawn(async move {
            let res = store.open_work(&route).await;
            let _ = tx.send(Net::OpenWork(res));
        });
    }
}
