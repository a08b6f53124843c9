//! The orchestrator: one machine's side of the queue, built from parts that each have one
//! job and explicit states:
//!
//! - the **poller** ([`poller`]) claims work into free slots, waking on NOTIFY or its timer;
//! - the **lease keeper** ([`lease`]) renews with (id, token), keeps a local deadline per
//!   job on a clock that counts suspended time, and declares losses;
//! - the **runner** ([`runner`]) starts and stops agents and reports their outcomes;
//! - **maintenance** ([`maintenance`]) runs the throttled sweep and retention off the poll
//!   path.
//!
//! Around them: [`handle`] (the way in), [`status`] (what a machine says about itself) and
//! [`clock`] (the suspend-aware clock of the deadlines).
//!
//! The [`Machine`] task in this file owns the user's wishes (on/off, pause, hand-off, stop),
//! the running slots and the published [`Status`], and wires the parts together. Everything
//! that talks to the database runs in tasks it spawns and reports back over channels, so a
//! slow or unreachable database never stops it from answering a pause, a hand-off or a stop.
//!
//! Stopping is structured: every job, poll and presence write is a task of a
//! [`TaskTracker`]; a hard stop cancels the root [`CancellationToken`] that every job's
//! cancel descends from; and a stop (or a hand-off) is over when its tracker has no task left.

mod clock;
mod handle;
mod lease;
mod maintenance;
mod poller;
mod runner;
mod status;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

pub use self::clock::{BootClock, Clock};
use self::handle::Command;
pub use self::handle::{Handle, Stats};
pub use self::lease::Timing;
use self::lease::{Keeper, News, Order, Pair};
pub use self::maintenance::{file_retention, prune_files};
use self::maintenance::{Maintenance, SweepCfg};
use self::poller::{ClaimRequest, Poller, FAR};
pub use self::runner::Watchdog;
use self::runner::{run_job, Cancel, CancelReason, Completer, JobCtx, JobDone};
pub use self::status::{AgentKind, Event, JobRef, LossReason, MachineState, RunningJob, Status};
use crate::agent::{AgentEnv, AgentSpec};
use crate::error::{Error, Result};
use crate::listen::Hint;
use crate::queue::{Backoff, Claim, Polled, Presence, Queue, Retention, Route};
use crate::worktree::{Repo, Workspaces};

/// How the orchestrator picks work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ClaimMode {
    /// One statement picks and claims up to k jobs, skipping rows others hold.
    #[default]
    Pick,
    /// The article's path: read candidate ids, then conditionally claim each by id.
    ById,
}

/// Everything the loop needs to know. All of it but the orchestrator and the machine can be
/// changed while jobs run ([`Handle::reconfigure`]).
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub orchestrator_id: String,
    pub machine: String,
    pub concurrency: u32,
    pub claim_timeout: Duration,
    pub heartbeat: Duration,
    pub poll_interval: Duration,
    /// The idle backoff ceiling.
    pub max_poll_interval: Duration,
    /// The opportunistic sweep runs at most this often per process.
    pub sweep_every: Duration,
    /// Retention runs at most this often per process.
    pub prune_every: Duration,
    pub retention: Retention,
    /// The retry backoff of jobs that carry none of their own.
    pub backoff: Backoff,
    pub presence_every: Duration,
    /// SIGTERM to SIGKILL on a hand-off.
    pub cancel_grace: Duration,
    pub until_empty: bool,
    pub claim_mode: ClaimMode,
    pub agent: AgentSpec,
    pub log_dir: PathBuf,
    pub payload_dir: PathBuf,
    pub start_enabled: bool,
    /// The repos this machine can work on, by name: jobs of these run in a git worktree.
    pub repos: BTreeMap<String, Repo>,
    /// This machine's labels: it picks only jobs whose `requires` are all among them.
    pub labels: Vec<String>,
    /// Where job worktrees go: `<data dir>/worktrees/<orchestrator>`.
    pub worktree_root: PathBuf,
    /// Where a job with no repo gets a scratch dir: `<data dir>/scratch/<orchestrator>`.
    pub scratch_root: PathBuf,
    /// Variables of this process's environment that agents and setup commands get besides
    /// the allowlist ([`crate::environ`]): names or `PREFIX*` patterns.
    pub pass_env: Vec<String>,
    /// The bound on a hand-off's push of the work in progress.
    pub push_bound: Duration,
    pub watchdog: Watchdog,
}

impl RunConfig {
    /// The poller's base interval. A drain that ends when the queue is empty
    /// (`until_empty`) looks again within 50 ms: its last jobs, or another process's, may
    /// still be finishing, and it should exit then, not a whole poll interval later (that
    /// was 2 s of every `devpilot run --until-empty`, most of a 2,000-job drain's time).
    pub fn poll_base(&self) -> Duration {
        if self.until_empty {
            self.poll_interval.min(Duration::from_millis(50))
        } else {
            self.poll_interval
        }
    }

    pub fn new(orchestrator_id: &str, machine: &str, agent: AgentSpec, data_dir: PathBuf) -> Self {
        Self {
            orchestrator_id: orchestrator_id.into(),
            machine: machine.into(),
            concurrency: 1,
            claim_timeout: Duration::from_secs(30 * 60),
            heartbeat: Duration::from_secs(30),
            poll_interval: Duration::from_secs(2),
            max_poll_interval: Duration::from_secs(300),
            sweep_every: Duration::from_secs(60),
            prune_every: Duration::from_secs(3600),
            retention: Retention::default(),
            backoff: Backoff::DEFAULT,
            presence_every: Duration::from_secs(30),
            cancel_grace: Duration::from_secs(10),
            until_empty: false,
            claim_mode: ClaimMode::Pick,
            agent,
            log_dir: data_dir.join("logs").join("jobs"),
            payload_dir: payload_dir(&data_dir),
            start_enabled: true,
            repos: BTreeMap::new(),
            labels: vec![],
            worktree_root: worktree_root(&data_dir, orchestrator_id),
            scratch_root: data_dir.join("scratch").join(safe_name(orchestrator_id)),
            pass_env: vec![],
            push_bound: Duration::from_secs(4),
            watchdog: Watchdog::default(),
        }
    }

    /// What this machine may pick.
    pub fn route(&self) -> Route {
        Route { repos: self.repos.keys().cloned().collect(), labels: self.labels.clone() }
    }

    /// The lease keeper's timing. The kill grace after a lost lease is at most one
    /// heartbeat: it is part of the margin the local deadline keeps before the database
    /// could hand the job to someone else.
    pub fn timing(&self) -> Timing {
        Timing {
            heartbeat: self.heartbeat,
            claim_timeout: self.claim_timeout,
            kill_grace: self.cancel_grace.min(self.heartbeat),
        }
    }

    /// How often a machine whose agent cannot run looks again: as often as an idle machine
    /// polls, and at least every 30 s. Looking is a stat of the program, not a query.
    pub fn problem_recheck(&self) -> Duration {
        self.max_poll_interval.min(Duration::from_secs(30))
    }

    /// Refuses timings the local deadline cannot work with.
    pub fn check(&self) -> Result<()> {
        if self.heartbeat.is_zero() || self.claim_timeout < self.heartbeat * 3 {
            return Err(Error::Invalid(format!(
                "the claim timeout ({}) must be at least three heartbeats ({} each): a machine gives up its lease \
                 one heartbeat and a kill grace before the claim timeout, and needs renewals in between",
                humantime::format_duration(self.claim_timeout),
                humantime::format_duration(self.heartbeat)
            )));
        }
        Ok(())
    }
}

/// `<data dir>/worktrees/<orchestrator>`, the orchestrator's name made safe for a path.
pub fn worktree_root(data_dir: &std::path::Path, orchestrator_id: &str) -> PathBuf {
    data_dir.join("worktrees").join(safe_name(orchestrator_id))
}

/// An orchestrator's name as one path component: a separator, `.` or `..` cannot leave the
/// directory it is joined to.
fn safe_name(orchestrator_id: &str) -> String {
    let safe: String =
        orchestrator_id.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    if safe.chars().all(|c| c == '.') {
        safe.replace('.', "_")
    } else {
        safe
    }
}

/// Where the agents' payload files go: the session's runtime dir (`XDG_RUNTIME_DIR`, a
/// tmpfs private to the user) when there is one, else `<data dir>/payloads`. A payload file
/// lives only while its agent runs. Written and deleted once per job on ext4, its inode
/// churn was the largest cost of a short job besides the agent itself (ext4 scans past
/// recently deleted inodes to allocate a new one; `bench/NOTES.md`), and on tmpfs the
/// payload never reaches a disk. One dir per data dir, so two setups never share one.
pub fn payload_dir(data_dir: &std::path::Path) -> PathBuf {
    use md5::{Digest, Md5};
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(rt) if rt.is_absolute() && rt.is_dir() => {
            let digest = Md5::digest(data_dir.as_os_str().as_encoded_bytes());
            let tag: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
            rt.join("devpilot").join(format!("payloads-{tag}"))
        }
        _ => data_dir.join("payloads"),
    }
}

/// The bound on every database call of a machine with this heartbeat: shorter than the
/// heartbeat, so a silent network is noticed within one.
pub fn call_bound(heartbeat: Duration) -> Duration {
    (heartbeat * 3 / 4).clamp(Duration::from_millis(100), Duration::from_secs(10))
}

/// How to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopMode {
    /// Stop the agents and release their claims now.
    HandOff,
    /// Claim nothing more, let running jobs finish for up to `grace`, then hand off the rest.
    Drain { grace: Duration },
}

/// Starts the orchestrator with a status channel of its own. `hints` carries LISTEN/NOTIFY
/// wake-ups (see [`crate::listen`]).
pub fn spawn(
    queue: Queue,
    cfg: RunConfig,
    hints: Option<mpsc::Receiver<Hint>>,
) -> (Handle, tokio::task::JoinHandle<()>) {
    let status = watch::Sender::new(Status {
        orchestrator_id: cfg.orchestrator_id.clone(),
        machine: cfg.machine.clone(),
        ..Status::default()
    });
    let (events, _) = broadcast::channel(1024);
    spawn_into(queue, cfg, hints, status, events, Arc::new(BootClock))
}

/// Starts the orchestrator publishing into `status` and `events` (an app's channels, which
/// outlive restarts), with the lease deadlines on `clock`.
pub fn spawn_into(
    queue: Queue,
    cfg: RunConfig,
    hints: Option<mpsc::Receiver<Hint>>,
    status: watch::Sender<Status>,
    events: broadcast::Sender<Event>,
    clock: Arc<dyn Clock>,
) -> (Handle, tokio::task::JoinHandle<()>) {
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let stats = Arc::new(Stats::default());
    let handle = Handle { cmd: cmd_tx, events: events.clone(), status: status.subscribe(), stats: stats.clone() };
    let queue = queue.with_call_timeout(call_bound(cfg.heartbeat));
    let (news_tx, news_rx) = mpsc::unbounded_channel();
    let (orders, orders_rx) = mpsc::unbounded_channel();
    tokio::spawn(
        Keeper::new(queue.clone(), clock.clone(), cfg.timing(), news_tx).counting(stats.clone()).run(orders_rx),
    );
    let (swept_tx, swept_rx) = mpsc::unbounded_channel();
    let every = (cfg.sweep_every, cfg.prune_every);
    let (maintenance, sweep_cfg) =
        Maintenance::spawn(sweep_cfg(&queue, &cfg), every, events.clone(), stats.clone(), swept_tx);
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let (net_tx, net_rx) = mpsc::unbounded_channel();
    let problem = cfg.agent.check().err().map(|e| Problem::new(&e, cfg.problem_recheck()));
    let m = Machine {
        wishes: Wishes { enabled: cfg.start_enabled, paused: None },
        poller: Poller::new(cfg.poll_base(), cfg.max_poll_interval),
        ctx: Arc::new(job_ctx(&queue, &cfg, &events, done_tx.clone(), orders.clone())),
        queue,
        cfg,
        events,
        status,
        stats,
        slots: HashMap::new(),
        keeper: orders,
        maintenance,
        sweep_cfg,
        last_presence: None,
        presence_order: (rand::random::<i64>(), 0),
        db: Health { online: true, error: None },
        problem,
        work: TaskTracker::new(),
        hard_stop: CancellationToken::new(),
        stop: None,
        clock,
        net_tx,
        done_tx,
    };
    let join =
        tokio::spawn(m.run(Inbox { cmd: cmd_rx, done: done_rx, news: news_rx, net: net_rx, swept: swept_rx }, hints));
    (handle, join)
}

fn sweep_cfg(queue: &Queue, cfg: &RunConfig) -> SweepCfg {
    SweepCfg {
        queue: queue.clone(),
        orchestrator_id: cfg.orchestrator_id.clone(),
        claim_timeout: cfg.claim_timeout,
        retention: cfg.retention,
        file_dirs: vec![cfg.log_dir.clone(), cfg.payload_dir.clone()],
        workspaces: workspaces(cfg),
    }
}

/// The machine's worktrees, when it has repos.
fn workspaces(cfg: &RunConfig) -> Option<Arc<Workspaces>> {
    (!cfg.repos.is_empty()).then(|| {
        Arc::new(
            Workspaces::new(cfg.worktree_root.clone(), cfg.repos.clone(), &cfg.machine, cfg.push_bound)
                .with_pass_env(cfg.pass_env.clone()),
        )
    })
}

fn job_ctx(
    queue: &Queue,
    cfg: &RunConfig,
    events: &broadcast::Sender<Event>,
    done: mpsc::UnboundedSender<JobDone>,
    keeper: mpsc::UnboundedSender<Order>,
) -> JobCtx {
    JobCtx {
        queue: queue.clone(),
        workspaces: workspaces(cfg),
        watchdog: cfg.watchdog,
        log_every: cfg.heartbeat,
        agent: cfg.agent.clone(),
        env: AgentEnv {
            log_dir: cfg.log_dir.clone(),
            payload_dir: cfg.payload_dir.clone(),
            machine: cfg.machine.clone(),
            pass_env: cfg.pass_env.clone(),
        },
        machine: cfg.machine.clone(),
        grace: cfg.cancel_grace,
        kill_grace: cfg.timing().kill_grace,
        events: events.clone(),
        completer: Completer::spawn(queue.clone(), cfg.machine.clone()),
        done,
        keeper,
        backoff: cfg.backoff,
        scratch_root: cfg.scratch_root.clone(),
    }
}

/// What the user wants: dispatch on or off, and a pause.
#[derive(Clone, Copy)]
struct Wishes {
    enabled: bool,
    paused: Option<Paused>,
}

#[derive(Clone, Copy)]
enum Paused {
    Until(Instant),
    Indefinitely,
}

/// The database as this machine last found it.
struct Health {
    online: bool,
    error: Option<String>,
}

/// Something that keeps this machine from claiming until it is fixed (the agent program is
/// missing or cannot start), and when to look again.
struct Problem {
    message: String,
    recheck_at: Instant,
}

impl Problem {
    fn new(e: &Error, every: Duration) -> Self {
        let every_text = humantime::format_duration(Duration::from_secs(every.as_secs().max(1)));
        Self {
            message: format!("{e}; claiming nothing until it can run (checking again every {every_text})"),
            recheck_at: Instant::now() + every,
        }
    }
}

/// A stop under way.
struct Stopping {
    mode: StopMode,
    /// When a soft stop turns hard.
    deadline: Instant,
    waiters: Vec<oneshot::Sender<()>>,
}

/// A job running here.
struct Slot {
    job: JobRef,
    started: u64,
    cancel: Cancel,
}

/// A presence row without its names, so it can travel into a spawned task.
#[derive(Clone, Copy, Debug)]
pub struct PresenceFields {
    status: &'static str,
    dispatch_enabled: bool,
    paused_until: Option<i64>,
    running: i32,
    concurrency: i32,
    /// (run, seq): see [`Presence::order`].
    order: (i64, i64),
}

impl PresenceFields {
    fn presence<'a>(&self, orchestrator_id: &'a str, machine: &'a str, route: &'a Route) -> Presence<'a> {
        Presence {
            route: Some(route),
            orchestrator_id,
            machine,
            status: self.status,
            dispatch_enabled: self.dispatch_enabled,
            paused_until: self.paused_until,
            running: self.running,
            concurrency: self.concurrency,
            problem: None,
            order: Some(self.order),
        }
    }
}

/// Answers of database work the machine spawned.
enum Net {
    /// A poll's answer. `hold` keeps the poll's tracker busy until its claims are started
    /// or handed back, so no stop or hand-off can end in between.
    Polled {
        result: Result<Polled>,
        asked: u32,
        sent: Duration,
        hold: TaskTrackerToken,
    },
    OpenWork(Result<crate::queue::OpenWork>),
}

/// The machine's mailboxes.
struct Inbox {
    cmd: mpsc::UnboundedReceiver<Command>,
    done: mpsc::UnboundedReceiver<JobDone>,
    news: mpsc::UnboundedReceiver<News>,
    net: mpsc::UnboundedReceiver<Net>,
    swept: mpsc::UnboundedReceiver<()>,
}

struct Machine {
    cfg: RunConfig,
    queue: Queue,
    /// What jobs claimed from now on run with.
    ctx: Arc<JobCtx>,
    events: broadcast::Sender<Event>,
    status: watch::Sender<Status>,
    stats: Arc<Stats>,
    wishes: Wishes,
    slots: HashMap<i64, Slot>,
    poller: Poller,
    keeper: mpsc::UnboundedSender<Order>,
    maintenance: Maintenance,
    sweep_cfg: mpsc::UnboundedSender<SweepCfg>,
    last_presence: Option<Instant>,
    /// This run's id and the number of its last presence write (see [`Presence::order`]).
    presence_order: (i64, i64),
    db: Health,
    problem: Option<Problem>,
    /// Every job, poll and presence write of the current epoch (a hand-off starts a new one).
    work: TaskTracker,
    /// Cancelling it stops every agent as a hand-off.
    hard_stop: CancellationToken,
    stop: Option<Stopping>,
    clock: Arc<dyn Clock>,
    net_tx: mpsc::UnboundedSender<Net>,
    done_tx: mpsc::UnboundedSender<JobDone>,
}

impl Machine {
    async fn run(mut self, mut inbox: Inbox, hints: Option<mpsc::Receiver<Hint>>) {
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
        tokio::spawn(runner::push_pending(ws, self.queue.clone(), self.cfg.sweep_every, pushes.clone()));
        let _stop_pushes = pushes.drop_guard();
        self.publish();
        loop {
            let never = Instant::now() + FAR;
            let pause_ends = match self.wishes.paused {
                Some(Paused::Until(t)) => Some(t),
                _ => None,
            };
            let soft_stop_ends =
                self.stop.as_ref().filter(|s| matches!(s.mode, StopMode::Drain { .. })).map(|s| s.deadline);
            let recheck = self.problem.as_ref().map(|p| p.recheck_at);
            let poll_due = self.poller.due();
            tokio::select! {
                biased;
                Some(cmd) = inbox.cmd.recv() => self.command(cmd),
                Some(done) = inbox.done.recv() => self.job_done(done),
                Some(news) = inbox.news.recv() => self.lease_news(news),
                Some(net) = inbox.net.recv() => self.net(net),
                Some(()) = inbox.swept.recv() => self.poller.now(),
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
                _ = tokio::time::sleep_until(poll_due.unwrap_or(never)), if poll_due.is_some() && self.stop.is_none() => self.poll(),
                _ = self.work.wait(), if self.stop.is_some() => break,
            }
        }
        self.finish().await;
    }

    /// The last presence write says 'stopped', after every earlier one has landed (they were
    /// tasks of the tracker that just emptied), so the fleet sees this machine as stopped
    /// rather than as gone silent. Awaited, briefly: the process may exit the moment the stop
    /// returns.
    async fn finish(mut self) {
        let mut f = self.presence_fields();
        f.status = "stopped";
        let route = self.cfg.route();
        let presence = f.presence(&self.cfg.orchestrator_id, &self.cfg.machine, &route);
        if let Err(e) = self.queue.heartbeat_machine(&presence).await {
            tracing::debug!(error = %e, "could not record this machine as stopped");
        }
        self.slots.clear();
        self.publish();
        let _ = self.events.send(Event::Stopped);
        for w in self.stop.take().map(|s| s.waiters).unwrap_or_default() {
            let _ = w.send(());
        }
    }

    fn hint(&mut self, h: Hint) {
        match h {
            Hint::Work => self.poller.now(),
            Hint::DueIn(d) => self.poller.cap(d),
            Hint::Cancel | Hint::Release if !self.slots.is_empty() => {
                let _ = self.keeper.send(Order::RenewNow);
            }
            Hint::Cancel | Hint::Release => {}
            Hint::Deaf => {
                tracing::info!("pooled mode: polling only, statements unprepared");
                self.queue.set_pooled(true);
            }
            Hint::Direct => self.queue.set_pooled(false),
            Hint::Resync => {
                self.poller.now();
                if !self.slots.is_empty() {
                    let _ = self.keeper.send(Order::RenewNow);
                }
            }
        }
    }

    fn emit(&self, e: Event) {
        let _ = self.events.send(e);
    }

    /// Whether a poll may claim now.
    fn accepting(&self) -> bool {
        self.wishes.enabled && self.wishes.paused.is_none() && self.stop.is_none() && self.problem.is_none()
    }

    fn state(&self) -> MachineState {
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

    fn publish(&self) {
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

    fn state_changed(&mut self) {
        self.publish();
        self.last_presence = None;
        self.maybe_presence();
    }

    fn command(&mut self, cmd: Command) {
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

    fn begin_stop(&mut self, mode: StopMode, done: Option<oneshot::Sender<()>>) {
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
    fn hand_off(&mut self, done: oneshot::Sender<Vec<i64>>) {
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

    fn recheck(&mut self, done: oneshot::Sender<Vec<i64>>) {
        let (tx, rx) = oneshot::channel();
        if self.keeper.send(Order::Recheck(tx)).is_err() {
            let _ = done.send(vec![]);
            return;
        }
        tokio::spawn(async move {
            let lost = rx.await.unwrap_or_default();
            let _ = done.send(lost.into_iter().map(|(id, _)| id).collect());
        });
    }

    fn reconfigure(&mut self, new: RunConfig) {
        let keep = (self.cfg.orchestrator_id.clone(), self.cfg.machine.clone(), self.cfg.start_enabled);
        self.cfg = RunConfig { orchestrator_id: keep.0, machine: keep.1, start_enabled: keep.2, ..new };
        self.queue = self.queue.clone().with_call_timeout(call_bound(self.cfg.heartbeat));
        let _ = self.keeper.send(Order::Retime(self.cfg.timing()));
        let _ = self.sweep_cfg.send(sweep_cfg(&self.queue, &self.cfg));
        self.maintenance.set_every(self.cfg.sweep_every, self.cfg.prune_every);
        self.ctx = Arc::new(job_ctx(&self.queue, &self.cfg, &self.events, self.done_tx.clone(), self.keeper.clone()));
        self.poller.retime(self.cfg.poll_base(), self.cfg.max_poll_interval);
        if self.problem.is_some() {
            self.recheck_problem();
        }
        tracing::info!("settings applied; running jobs carry on");
        self.state_changed();
    }

    fn recheck_problem(&mut self) {
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

    fn set_problem(&mut self, e: &Error) {
        if self.problem.is_none() {
            tracing::error!(error = %e, "the agent cannot run; claiming nothing until it can");
            self.emit(Event::AgentUnavailable { error: e.to_string() });
        }
        self.problem = Some(Problem::new(e, self.cfg.problem_recheck()));
        self.state_changed();
    }

    fn job_done(&mut self, done: JobDone) {
        if self.slots.get(&done.id).is_some_and(|s| s.job.token == done.token) {
            self.slots.remove(&done.id);
        }
        let _ = self.keeper.send(Order::Forget((done.id, done.token)));
        if let Some(e) = &done.agent_error {
            self.set_problem(e);
        }
        // A slot freed up: look for more work now.
        self.poller.now();
        self.publish();
    }

    fn lease_news(&mut self, news: News) {
        let cancel = |m: &Self, (id, token): Pair, why| {
            if let Some(s) = m.slots.get(&id).filter(|s| s.job.token == token) {
                s.cancel.cancel(why);
            }
        };
        match news {
            News::Lost(pair) => cancel(self, pair, CancelReason::LeaseLost),
            News::Expired(pair) => cancel(self, pair, CancelReason::LeaseExpired),
            News::CancelAsked(pair) => {
                if self.slots.get(&pair.0).is_some_and(|s| s.job.token == pair.1) {
                    tracing::info!(job = pair.0, "a cancel was asked for; stopping the agent");
                }
                cancel(self, pair, CancelReason::Cancelled)
            }
            News::ReleaseAsked(pair) => self.release_asked(pair),
            News::Reached => self.set_online(true, None),
            News::Unreachable(e) => {
                tracing::warn!(error = %e, "heartbeat failed");
                self.emit(Event::HeartbeatFailed { error: e.to_string() });
                self.set_online(false, Some(e.to_string()));
            }
        }
    }

    /// Someone asked this machine to hand off what it holds (`devpilot release --machine`
    /// from another machine): hand off everything, pushing the work in progress, and pause,
    /// so that this machine does not claim the jobs straight back. Resuming is the user's.
    fn release_asked(&mut self, pair: Pair) {
        if !self.slots.get(&pair.0).is_some_and(|s| s.job.token == pair.1 && !s.cancel.is_cancelled()) {
            return;
        }
        tracing::info!(job = pair.0, "a hand-off was asked of this machine; handing off and pausing");
        self.wishes.paused = Some(Paused::Indefinitely);
        let (done, _) = oneshot::channel();
        self.hand_off(done);
        self.state_changed();
    }

    fn set_online(&mut self, online: bool, error: Option<String>) {
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

    // ------------------------------------------------------------ polling

    fn poll(&mut self) {
        self.stats.polls.fetch_add(1, Ordering::Relaxed);
        let free = self.cfg.concurrency.saturating_sub(self.slots.len() as u32);
        self.maintenance.prune_tick();
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
        let presence = (!by_id && self.presence_due()).then(|| self.presence_fields());
        let stale_after = (!by_id && self.maintenance.take_due()).then_some(self.cfg.claim_timeout);
        if by_id {
            self.maintenance.tick();
            self.maybe_presence();
        }
        let req = ClaimRequest {
            queue: self.queue.clone(),
            mode: self.cfg.claim_mode,
            orchestrator_id: self.cfg.orchestrator_id.clone(),
            machine: self.cfg.machine.clone(),
            free,
            presence,
            stale_after,
            route: Arc::new(self.cfg.route()),
            stats: self.stats.clone(),
            events: self.events.clone(),
        };
        let (tx, hold, sent) = (self.net_tx.clone(), self.work.token(), self.clock.now());
        tokio::spawn(async move {
            let result = req.run().await;
            let _ = tx.send(Net::Polled { result, asked: free, sent, hold });
        });
    }

    fn net(&mut self, net: Net) {
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

    fn polled(&mut self, result: Result<Polled>, asked: u32, sent: Duration, hold: TaskTrackerToken) {
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
    fn hand_back(&self, c: Claim, on: &TaskTracker) {
        tracing::info!(job = c.id, "a claim landed after claiming stopped; handing it back");
        let (q, machine) = (self.queue.clone(), self.cfg.machine.clone());
        on.spawn(async move {
            let reason = "claimed just as this machine stopped claiming; handed back unrun";
            let release = || q.release(c.id, c.token, &machine, reason);
            if let Err(e) = crate::retry::transient("handing back", crate::retry::Budget::WRITE, release).await {
                tracing::warn!(job = c.id, error = %e, "could not hand a claim back; the sweep will");
            }
        });
    }

    fn start_job(&mut self, claim: Claim, sent: Duration) {
        let job = JobRef::of(&claim);
        if let Some(old) = self.slots.remove(&claim.id) {
            // We re-claimed a job whose earlier claim of ours was swept (say, this machine
            // stalled past the timeout). That old run is no longer ours: stop it.
            old.cancel.cancel(CancelReason::LeaseLost);
            let _ = self.keeper.send(Order::Forget((claim.id, old.job.token)));
        }
        let _ = self.keeper.send(Order::Hold { pair: (claim.id, claim.token), sent });
        let cancel = Cancel::child_of(&self.hard_stop);
        self.slots.insert(claim.id, Slot { job: job.clone(), started: unix_ms(), cancel: cancel.clone() });
        self.emit(Event::Claimed { job });
        self.work.spawn(run_job(self.ctx.clone(), claim, cancel));
    }

    fn check_open_work(&self) {
        let (q, tx, orch) = (self.queue.clone(), self.net_tx.clone(), self.cfg.orchestrator_id.clone());
        let route = self.cfg.route();
        self.work.spawn(async move {
            let res = q.open_work(&orch, &route).await;
            let _ = tx.send(Net::OpenWork(res));
        });
    }

    // ------------------------------------------------------------ presence

    fn presence_due(&self) -> bool {
        self.last_presence.is_none_or(|t| t.elapsed() >= self.cfg.presence_every)
    }

    fn maybe_presence(&mut self) {
        if self.presence_due() {
            self.write_presence();
        }
    }

    /// What this machine reports about itself now; also marks presence as written.
    fn presence_fields(&mut self) -> PresenceFields {
        self.last_presence = Some(Instant::now());
        self.presence_order.1 += 1;
        self.stats.presence_writes.fetch_add(1, Ordering::Relaxed);
        let status = match self.state() {
            _ if self.stop.is_some() => "handing_off",
            MachineState::Paused => "paused",
            MachineState::Off => "off",
            MachineState::Error => "blocked",
            MachineState::Stopped => "stopped",
            _ => "online",
        };
        let paused_until = match self.wishes.paused {
            Some(Paused::Until(t)) => {
                Some(unix_ms() as i64 + t.saturating_duration_since(Instant::now()).as_millis() as i64)
            }
            _ => None,
        };
        PresenceFields {
            status,
            dispatch_enabled: self.wishes.enabled,
            paused_until,
            running: self.slots.len() as i32,
            concurrency: self.cfg.concurrency as i32,
            order: self.presence_order,
        }
    }

    fn write_presence(&mut self) {
        let f = self.presence_fields();
        let problem = self.problem.as_ref().map(|p| p.message.clone());
        let q = self.queue.clone();
        let (orch, machine) = (self.cfg.orchestrator_id.clone(), self.cfg.machine.clone());
        let route = self.cfg.route();
        // A task of the current epoch: the final 'stopped' write goes after it.
        self.work.spawn(async move {
            let mut p = f.presence(&orch, &machine, &route);
            p.problem = problem.as_deref();
            if let Err(e) = q.heartbeat_machine(&p).await {
                tracing::debug!(error = %e, "presence update failed");
            }
        });
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
