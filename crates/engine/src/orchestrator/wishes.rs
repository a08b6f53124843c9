//! The [`Machine`]'s answers to the user's wishes: commands, stops and hand-offs, settings,
//! the agent's problems, and the state and [`Status`](super::Status) it publishes.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::config::RunConfig;
use super::handle::{Command, StopMode};
use super::lease::{call_bound, Order};
use super::machine::{unix_ms, Machine, Paused, Problem, Stopping};
use super::runner::CancelReason;
use super::spawn::{job_ctx, sweep_cfg};
use super::status::{Event, MachineState, RunningJob};
use devpilot_store::error::Error;
use devpilot_store::queue::Fence;

impl Machine {
    /// Whether a poll may claim now.
    pub(super) fn accepting(&self) -> bool {
        self.wishes.enabled && self.wishes.paused.is_none() && self.stop.is_none() && self.problem.is_none()
    }

    pub(super) fn state(&self) -> MachineState {
        if self.stop.is_some() && self.work.is_closed() && self.slots.is_empty() {
            MachineState::Stopped
        } else if !self.db.online {
            MachineState::Offline
        } else if !self.slots.is_empty() {
            MachineState::Working
        } else if self.problem.is_some() {
            MachineState::Error
        } else if !self.wishes.enabled {
            MachineState::Off
        } else if self.wishes.paused.is_some() {
            MachineState::Paused
        } else {
            MachineState::Idle
        }
    }

    pub(super) fn publish(&self) {
        let mut running: Vec<RunningJob> =
            self.slots.values().map(|s| RunningJob { job: s.job.clone(), started_unix_ms: s.started }).collect();
        running.sort_by_key(|r| r.job.id);
        let left = match self.wishes.paused {
            Some(Paused::Until(t)) => Some(t.saturating_duration_since(Instant::now())),
            _ => None,
        };
        let paused_for_secs = left.map(|d| d.as_secs());
        let paused_until_unix_ms = left.map(|d| (unix_ms() + d.as_millis() as u64 + 500) / 1000 * 1000);
        let state = self.state();
        let message = match (&self.problem, self.db.online) {
            (_, false) => self.db.error.clone(),
            (Some(p), true) => Some(p.message.clone()),
            (None, true) => None,
        };
        let mut changed = false;
        self.status.send_if_modified(|s| {
            changed = s.state != state;
            let before = s.clone();
            s.state = state;
            s.message = message;
            s.dispatch_enabled = self.wishes.enabled;
            s.paused = self.wishes.paused.is_some();
            s.paused_for_secs = paused_for_secs;
            s.paused_until_unix_ms = paused_until_unix_ms;
            s.running = running;
            s.db_online = self.db.online;
            *s != before
        });
        if changed {
            self.emit(Event::StateChanged { state });
        }
    }

    pub(super) fn state_changed(&mut self) {
        self.publish();
        self.last_presence = None;
        self.maybe_presence();
    }

    pub(super) fn command(&mut self, cmd: Command) {
        match cmd {
            Command::SetEnabled(on) => {
                self.wishes.enabled = on;
                self.poller.now();
                self.state_changed();
            }
            Command::Pause(d) => {
                self.wishes.paused = Some(match d {
                    Some(d) => Paused::Until(Instant::now() + d),
                    None => Paused::Indefinitely,
                });
                self.state_changed();
            }
            Command::Resume => {
                self.wishes.paused = None;
                self.poller.now();
                self.state_changed();
            }
            Command::Wake => self.poller.now(),
            Command::NextPoll(tx) => {
                let _ = tx.send(self.poller.due().map(|t| t.saturating_duration_since(Instant::now())));
            }
            Command::HandOff { pause, done } => {
                if pause {
                    self.wishes.paused = Some(Paused::Indefinitely);
                }
                self.hand_off(done);
                self.state_changed();
            }
            Command::Recheck(done) => self.recheck(done),
            Command::Reconfigure(cfg) => self.reconfigure(*cfg),
            Command::Stop { mode, done } => {
                match &mut self.stop {
                    Some(s) => {
                        s.waiters.push(done);
                        // A hard stop asked for during a soft one (Quit during a drain): now.
                        if mode == StopMode::HandOff && s.mode != StopMode::HandOff {
                            s.mode = StopMode::HandOff;
                            self.hard_stop.cancel();
                        }
                    }
                    None => self.begin_stop(mode, Some(done)),
                }
                self.state_changed();
            }
        }
    }

    pub(super) fn begin_stop(&mut self, mode: StopMode, done: Option<oneshot::Sender<()>>) {
        let grace = match mode {
            StopMode::Drain { grace } => grace,
            StopMode::HandOff => Duration::ZERO,
        };
        self.stop = Some(Stopping { mode, deadline: Instant::now() + grace, waiters: done.into_iter().collect() });
        // Nothing new joins the current epoch's work except what its own tasks hand over.
        self.work.close();
        if mode == StopMode::HandOff {
            self.hard_stop.cancel();
        }
    }

    /// Stops every agent as a hand-off. The answer waits until every task of the epoch
    /// that was current until now has ended (the jobs' releases, and the hand-back of any
    /// claim a poll already in flight brings in); new work goes to a new epoch.
    pub(super) fn hand_off(&mut self, done: oneshot::Sender<Vec<i64>>) {
        let mut ids: Vec<i64> = self.slots.keys().copied().collect();
        ids.sort_unstable();
        for s in self.slots.values() {
            s.cancel.cancel(CancelReason::HandOff);
        }
        let old = std::mem::take(&mut self.work);
        old.close();
        if self.stop.is_some() {
            self.work.close();
        }
        self.work.spawn(async move {
            old.wait().await;
            let _ = done.send(ids);
        });
    }

    pub(super) fn recheck(&mut self, done: oneshot::Sender<Vec<i64>>) {
        let (tx, rx) = oneshot::channel();
        if self.keeper.send(Order::Recheck(tx)).is_err() {
            let _ = done.send(vec![]);
            return;
        }
        tokio::spawn(async move {
            let lost = rx.await.unwrap_or_default();
            let _ = done.send(lost.into_iter().map(|f| f.job).collect());
        });
    }

    pub(super) fn reconfigure(&mut self, new: RunConfig) {
        let keep = (self.cfg.orchestrator_id.clone(), self.cfg.machine.clone(), self.cfg.start_enabled);
        self.cfg = RunConfig { orchestrator_id: keep.0, machine: keep.1, start_enabled: keep.2, ..new };
        self.store = self.store.clone().with_call_timeout(call_bound(self.cfg.heartbeat));
        let _ = self.keeper.send(Order::Retime(self.cfg.timing()));
        let _ = self.sweep_cfg.send(sweep_cfg(&self.store, &self.cfg));
        self.sources.reconfigure(self.cfg.sources_cfg());
        self.maintenance.set_every(self.cfg.sweep_every, self.cfg.prune_every);
        self.ctx = Arc::new(job_ctx(&self.store, &self.cfg, &self.events, self.done_tx.clone(), self.keeper.clone()));
        self.poller.retime(self.cfg.poll_base(), self.cfg.max_poll_interval);
        if self.problem.is_some() {
            self.recheck_problem();
        }
        tracing::info!("settings applied; running jobs carry on");
        self.state_changed();
    }

    pub(super) fn recheck_problem(&mut self) {
        match self.cfg.agent.check() {
            Ok(()) => {
                if self.problem.take().is_some() {
                    tracing::info!("the agent can run again; claiming");
                    self.emit(Event::AgentAvailable);
                    self.poller.now();
                    self.state_changed();
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "the agent still cannot run");
                match &mut self.problem {
                    Some(p) => p.recheck_at = Instant::now() + self.cfg.problem_recheck(),
                    None => self.set_problem(&e),
                }
            }
        }
    }

    pub(super) fn set_problem(&mut self, e: &Error) {
        if self.problem.is_none() {
            tracing::error!(error = %e, "the agent cannot run; claiming nothing until it can");
            self.emit(Event::AgentUnavailable { error: e.to_string() });
        }
        self.problem = Some(Problem::new(e, self.cfg.problem_recheck()));
        self.state_changed();
    }

    /// Someone asked this machine to hand off what it holds (`devpilot release --machine`
    /// from another machine): hand off everything, pushing the work in progress, and pause,
    /// so that this machine does not claim the jobs straight back. Resuming is the user's.
    pub(super) fn release_asked(&mut self, fence: Fence) {
        if !self.slots.get(&fence.job).is_some_and(|s| s.job.fence() == fence && !s.cancel.is_cancelled()) {
            return;
        }
        tracing::info!(job = fence.job, "a hand-off was asked of this machine; handing off and pausing");
        self.wishes.paused = Some(Paused::Indefinitely);
        let (done, _) = oneshot::channel();
        self.hand_off(done);
        self.state_changed();
    }

    pub(super) fn set_online(&mut self, online: bool, error: Option<String>) {
        if online != self.db.online {
            self.db.online = online;
            if online {
                self.emit(Event::DatabaseOnline);
            } else {
                self.emit(Event::DatabaseOffline { error: error.clone().unwrap_or_default() });
            }
            self.db.error = error;
            self.state_changed();
        }
    }
}
