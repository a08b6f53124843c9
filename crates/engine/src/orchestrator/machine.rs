//! The [`Machine`] task: it owns the user's wishes (on/off, pause, hand-off, stop), the
//! running slots and the published [`Status`], and answers its mailboxes in one loop. Its
//! handlers live next door: [`super::wishes`] (commands, stops, state and status),
//! [`super::slots`] (polling, claims and finished jobs) and [`super::presence`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

use super::clock::Clock;
use super::config::RunConfig;
use super::handle::{Command, StopMode};
use super::lease::{News, Order};
use super::maintenance::{Maintenance, SweepCfg};
use super::poller::{Poller, FAR};
use super::runner::{self, Cancel, JobCtx, JobDone};
use super::stats::Stats;
use super::status::{Event, JobRef, Status};
use crate::worktree::Workspaces;
use devpilot_store::error::{Error, Result};
use devpilot_store::listen::Hint;
use devpilot_store::queue::{MachineStatus, MachineStore, Polled, PresenceOrder};

/// What the user wants: dispatch on or off, and a pause.
#[derive(Clone, Copy)]
pub(super) struct Wishes {
    pub(super) enabled: bool,
    pub(super) paused: Option<Paused>,
}

#[derive(Clone, Copy)]
pub(super) enum Paused {
    Until(Instant),
    Indefinitely,
}

/// The database as this machine last found it.
pub(super) struct Health {
    pub(super) online: bool,
    pub(super) error: Option<String>,
}

/// Something that keeps this machine from claiming until it is fixed (the agent program is
/// missing or cannot start), and when to look again.
pub(super) struct Problem {
    pub(super) message: String,
    pub(super) recheck_at: Instant,
}

impl Problem {
    pub(super) fn new(e: &Error, every: Duration) -> Self {
        let every_text = humantime::format_duration(Duration::from_secs(every.as_secs().max(1)));
        Self {
            message: format!("{e}; claiming nothing until it can run (checking again every {every_text})"),
            recheck_at: Instant::now() + every,
        }
    }
}

/// A stop under way.
pub(super) struct Stopping {
    pub(super) mode: StopMode,
    /// When a soft stop turns hard.
    pub(super) deadline: Instant,
    pub(super) waiters: Vec<oneshot::Sender<()>>,
}

/// A job running here.
pub(super) struct Slot {
    pub(super) job: JobRef,
    pub(super) started: u64,
    pub(super) cancel: Cancel,
}

/// Answers of database work the machine spawned.
pub(super) enum Net {
    /// A poll's answer. `hold` keeps the poll's tracker busy until its claims are started
    /// or handed back, so no stop or hand-off can end in between.
    Polled {
        result: Result<Polled>,
        asked: u32,
        sent: Duration,
        hold: TaskTrackerToken,
    },
    OpenWork(Result<devpilot_store::queue::OpenWork>),
}

/// The machine's mailboxes.
pub(super) struct Inbox {
    pub(super) cmd: mpsc::UnboundedReceiver<Command>,
    pub(super) done: mpsc::UnboundedReceiver<JobDone>,
    pub(super) news: mpsc::UnboundedReceiver<News>,
    pub(super) net: mpsc::UnboundedReceiver<Net>,
    /// Poll now: a sweep released claims, or this machine's intake wrote jobs.
    pub(super) poll_now: mpsc::UnboundedReceiver<()>,
}

pub(super) struct Machine {
    pub(super) cfg: RunConfig,
    pub(super) store: MachineStore,
    /// What jobs claimed from now on run with.
    pub(super) ctx: Arc<JobCtx>,
    pub(super) events: broadcast::Sender<Event>,
    pub(super) status: watch::Sender<Status>,
    pub(super) stats: Arc<Stats>,
    pub(super) wishes: Wishes,
    pub(super) slots: HashMap<i64, Slot>,
    /// Completions offered to the next poll ([`runner::Rider`]).
    pub(super) riders: Vec<runner::Rider>,
    pub(super) poller: Poller,
    pub(super) keeper: mpsc::UnboundedSender<Order>,
    pub(super) maintenance: Maintenance,
    pub(super) sweep_cfg: mpsc::UnboundedSender<SweepCfg>,
    /// The tracker sources' service: asked by the poll path, never awaited.
    pub(super) sources: super::sources::Sources,
    pub(super) last_presence: Option<Instant>,
    /// This run's id and the number of its last presence write (see [`Presence::order`](devpilot_store::queue::Presence::order)).
    pub(super) presence_order: PresenceOrder,
    pub(super) db: Health,
    pub(super) problem: Option<Problem>,
    /// Every job, poll and presence write of the current epoch (a hand-off starts a new one).
    pub(super) work: TaskTracker,
    /// Cancelling it stops every agent as a hand-off.
    pub(super) hard_stop: CancellationToken,
    pub(super) stop: Option<Stopping>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) net_tx: mpsc::UnboundedSender<Net>,
    pub(super) done_tx: mpsc::UnboundedSender<JobDone>,
}

impl Machine {
    pub(super) async fn run(mut self, mut inbox: Inbox, hints: Option<mpsc::Receiver<Hint>>) {
        let (_keep, none) = mpsc::channel(1);
        let mut hints = hints.unwrap_or(none);
        let mut hints_open = true;
        if let Some(p) = &self.problem {
            self.emit(Event::AgentUnavailable { error: p.message.clone() });
        }
        // Work in progress a hand-off could not push is pushed when it can, even by a
        // machine that no longer has the repo configured (the records say where it is).
        let pushes = CancellationToken::new();
        let ws = self.ctx.workspaces.clone().unwrap_or_else(|| {
            Arc::new(Workspaces::new(
                self.cfg.worktree_root.clone(),
                BTreeMap::new(),
                &self.cfg.machine,
                self.cfg.push_bound,
            ))
        });
        tokio::spawn(runner::push_pending(ws, self.store.clone(), self.cfg.sweep_every, pushes.clone()));
        let _stop_pushes = pushes.drop_guard();
        self.publish();
        loop {
            if !self.riders.is_empty() && !self.can_carry() {
                // No poll is about to carry them: their tasks complete on their own, now.
                self.riders.clear();
            }
            let never = Instant::now() + FAR;
            let pause_ends = match self.wishes.paused {
                Some(Paused::Until(t)) => Some(t),
                _ => None,
            };
            let soft_stop_ends =
                self.stop.as_ref().filter(|s| matches!(s.mode, StopMode::Drain { .. })).map(|s| s.deadline);
            let recheck = self.problem.as_ref().map(|p| p.recheck_at);
            let poll_due = self.poller.due();
            // An idle machine polls the moment its poll is due: a timer would first wait for
            // tokio's next 1 ms tick, most of a NOTIFY's pickup. A busy one keeps the tick,
            // which gathers the slots that free up meanwhile into one claim.
            let poll_now =
                poll_due.is_some_and(|t| t <= Instant::now()) && self.slots.is_empty() && self.stop.is_none();
            tokio::select! {
                biased;
                Some(cmd) = inbox.cmd.recv() => self.command(cmd),
                Some(done) = inbox.done.recv() => self.job_done(done),
                Some(news) = inbox.news.recv() => self.lease_news(news),
                Some(net) = inbox.net.recv() => self.net(net),
                Some(()) = inbox.poll_now.recv() => self.poller.now(),
                _ = tokio::time::sleep_until(soft_stop_ends.unwrap_or(never)), if soft_stop_ends.is_some() => {
                    // The soft stop's grace is over: hard stop.
                    if let Some(s) = &mut self.stop {
                        s.mode = StopMode::HandOff;
                    }
                    self.hard_stop.cancel();
                }
                _ = tokio::time::sleep_until(pause_ends.unwrap_or(never)), if pause_ends.is_some() => {
                    self.wishes.paused = None;
                    self.poller.now();
                    self.state_changed();
                }
                _ = tokio::time::sleep_until(recheck.unwrap_or(never)), if recheck.is_some() => self.recheck_problem(),
                hint = hints.recv(), if hints_open => match hint {
                    Some(h) => self.hint(h),
                    None => hints_open = false,
                },
                _ = std::future::ready(()), if poll_now => self.poll(),
                _ = crate::timer::sleep_until(poll_due.unwrap_or(never)), if poll_due.is_some() && self.stop.is_none() => self.poll(),
                _ = self.work.wait(), if self.stop.is_some() => break,
            }
        }
        self.finish().await;
    }

    /// The last presence write says 'stopped', after every earlier one has landed (they were
    /// tasks of the tracker that just emptied), so the fleet sees this machine as stopped
    /// rather than as gone silent. Awaited, briefly: the process may exit the moment the stop
    /// returns.
    pub(super) async fn finish(mut self) {
        let mut f = self.presence_fields();
        f.status = MachineStatus::Stopped;
        let route = self.cfg.route();
        let presence = f.presence(&self.cfg.orchestrator_id, &self.cfg.machine, &route);
        if let Err(e) = self.store.queue().heartbeat_machine(&presence).await {
            tracing::debug!(error = %e, "could not record this machine as stopped");
        }
        self.slots.clear();
        self.publish();
        let _ = self.events.send(Event::Stopped);
        for w in self.stop.take().map(|s| s.waiters).unwrap_or_default() {
            let _ = w.send(());
        }
    }

    pub(super) fn hint(&mut self, h: Hint) {
        match h {
            Hint::Work => self.poller.now(),
            Hint::DueIn(d) => self.poller.cap(d),
            Hint::Cancel | Hint::Release if !self.slots.is_empty() => {
                let _ = self.keeper.send(Order::RenewNow);
            }
            Hint::Cancel | Hint::Release => {}
            Hint::Deaf => {
                tracing::info!("pooled mode: polling only, statements unprepared");
                self.store.queue().set_pooled(true);
            }
            Hint::Direct => self.store.queue().set_pooled(false),
            Hint::Resync => {
                self.poller.now();
                if !self.slots.is_empty() {
                    let _ = self.keeper.send(Order::RenewNow);
                }
            }
        }
    }

    pub(super) fn emit(&self, e: Event) {
        let _ = self.events.send(e);
    }
}

pub(super) fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
