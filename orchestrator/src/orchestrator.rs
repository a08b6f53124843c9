//! The orchestrator loop: polls, claims, runs agents, heartbeats, sweeps, and obeys the user.
//!
//! One task owns all state; everything that talks to the database runs in tasks it spawns and
//! reports back over channels, so a slow or unreachable database never stops the loop from
//! answering a pause, a hand-off or a stop.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use serde::Serialize;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::agent::{AgentEnv, AgentExit, AgentSpec};
use crate::error::{Error, Result};
use crate::queue::{Claim, FailOutcome, PollExtras, Presence, Queue};

/// How the orchestrator picks work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ClaimMode {
    /// One statement picks and claims up to k jobs, skipping rows others hold.
    #[default]
    Pick,
    /// The article's path: read candidate ids, then conditionally claim each by id.
    ById,
}

/// Everything the loop needs to know.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub orchestrator_id: String,
    pub machine: String,
    pub concurrency: u32,
    pub claim_timeout: Duration,
    pub heartbeat: Duration,
    pub max_attempts: i32,
    pub poll_interval: Duration,
    /// The idle backoff ceiling.
    pub max_poll_interval: Duration,
    /// The opportunistic sweep runs at most this often per process.
    pub sweep_every: Duration,
    pub presence_every: Duration,
    /// SIGTERM to SIGKILL.
    pub cancel_grace: Duration,
    pub until_empty: bool,
    pub claim_mode: ClaimMode,
    pub agent: AgentSpec,
    pub log_dir: PathBuf,
    pub payload_dir: PathBuf,
    pub start_enabled: bool,
}

impl RunConfig {
    pub fn new(orchestrator_id: &str, machine: &str, agent: AgentSpec, data_dir: PathBuf) -> Self {
        Self {
            orchestrator_id: orchestrator_id.into(),
            machine: machine.into(),
            concurrency: 1,
            claim_timeout: Duration::from_secs(30 * 60),
            heartbeat: Duration::from_secs(30),
            max_attempts: 3,
            poll_interval: Duration::from_secs(2),
            max_poll_interval: Duration::from_secs(300),
            sweep_every: Duration::from_secs(60),
            presence_every: Duration::from_secs(30),
            cancel_grace: Duration::from_secs(10),
            until_empty: false,
            claim_mode: ClaimMode::Pick,
            agent,
            log_dir: data_dir.join("logs").join("jobs"),
            payload_dir: data_dir.join("payloads"),
            start_enabled: true,
        }
    }
}

/// A job, as events and the status name it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct JobRef {
    pub id: i64,
    pub title: Option<String>,
    pub attempt: i32,
    pub token: i64,
}

impl JobRef {
    fn of(c: &Claim) -> Self {
        Self { id: c.id, title: c.title.clone(), attempt: c.attempt, token: c.token }
    }

    /// "title (#id)" or "#id".
    pub fn label(&self) -> String {
        match &self.title {
            Some(t) => format!("{t} (#{})", self.id),
            None => format!("#{}", self.id),
        }
    }
}

/// Why this machine lost a job.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LossReason {
    /// A heartbeat found the lease gone (swept and maybe re-claimed elsewhere).
    LeaseExpired,
    /// The agent finished but the fenced completion was rejected.
    CompletionRejected,
}

/// What the orchestrator tells the tray, the notifications and the CLI.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Claimed { job: JobRef },
    LostRace { job_id: i64 },
    HeartbeatFailed { error: String },
    LeaseLost { job: JobRef, reason: LossReason },
    Completed { job: JobRef },
    Failed { job: JobRef, error: String, dead: bool },
    Released { job: JobRef },
    AgentError { job: JobRef, error: String },
    Swept { released: usize, dead: usize },
    SweepFailed { error: String },
    DatabaseOffline { error: String },
    DatabaseOnline,
    StateChanged { state: MachineState },
    Stopped,
}

/// What this machine is doing, in one word.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MachineState {
    Idle,
    Working,
    Paused,
    Off,
    Offline,
    Stopped,
}

impl MachineState {
    pub fn as_str(self) -> &'static str {
        match self {
            MachineState::Idle => "idle",
            MachineState::Working => "working",
            MachineState::Paused => "paused",
            MachineState::Off => "off",
            MachineState::Offline => "offline",
            MachineState::Stopped => "stopped",
        }
    }
}

/// A job running here.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunningJob {
    pub job: JobRef,
    /// Local wall clock, for display only; leases use the database clock.
    pub started_unix_ms: u64,
}

/// A snapshot for the tray and the window.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Status {
    pub state: MachineState,
    pub enabled: bool,
    pub paused: bool,
    /// Seconds until an automatic resume; `None` while paused means "until resumed".
    pub paused_for_secs: Option<u64>,
    pub running: Vec<RunningJob>,
    pub db_online: bool,
    pub last_error: Option<String>,
}

/// How to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopMode {
    /// Stop the agents and release their claims now.
    HandOff,
    /// Claim nothing more, let running jobs finish for up to `grace`, then hand off the rest.
    Drain { grace: Duration },
}

enum Command {
    SetEnabled(bool),
    Pause(Option<Duration>),
    Resume,
    HandOff { pause: bool, done: oneshot::Sender<Vec<i64>> },
    Recheck(oneshot::Sender<Vec<i64>>),
    Wake,
    Stop { mode: StopMode, done: oneshot::Sender<()> },
}

/// Counters that tests and the benchmark read.
#[derive(Debug, Default)]
pub struct Stats {
    pub polls: AtomicU64,
    pub claim_queries: AtomicU64,
    /// Times the throttled sweep was due: a sweep statement, or (PostgreSQL) a stale-lease
    /// test folded into a poll that decides whether a sweep statement follows.
    pub sweep_checks: AtomicU64,
    /// Sweep statements sent.
    pub sweeps: AtomicU64,
    pub sweep_failures: AtomicU64,
    pub presence_writes: AtomicU64,
    pub heartbeats: AtomicU64,
    pub lost_races: AtomicU64,
}

/// The way in: clone it freely.
#[derive(Clone)]
pub struct Handle {
    cmd: mpsc::UnboundedSender<Command>,
    events: broadcast::Sender<Event>,
    status: watch::Receiver<Status>,
    stats: Arc<Stats>,
}

impl Handle {
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    pub fn watch_status(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Switches dispatch on or off. Off claims nothing; running jobs finish.
    pub fn set_enabled(&self, on: bool) {
        let _ = self.cmd.send(Command::SetEnabled(on));
    }

    /// Pauses claiming for `for_` (or until resumed). Running jobs finish.
    pub fn pause(&self, for_: Option<Duration>) {
        let _ = self.cmd.send(Command::Pause(for_));
    }

    pub fn resume(&self) {
        let _ = self.cmd.send(Command::Resume);
    }

    /// Polls now (a hint: work was just enqueued).
    pub fn wake(&self) {
        let _ = self.cmd.send(Command::Wake);
    }

    /// Stops every running agent and releases its claim at once; with `pause`, claims nothing
    /// new afterwards. Returns the ids handed off.
    pub async fn hand_off(&self, pause: bool) -> Vec<i64> {
        let (tx, rx) = oneshot::channel();
        let _ = self.cmd.send(Command::HandOff { pause, done: tx });
        rx.await.unwrap_or_default()
    }

    /// Re-checks every lease now (after a wake from sleep). Returns the ids that were lost.
    pub async fn recheck_leases(&self) -> Vec<i64> {
        let (tx, rx) = oneshot::channel();
        let _ = self.cmd.send(Command::Recheck(tx));
        rx.await.unwrap_or_default()
    }

    /// Stops the loop; returns once it has stopped.
    pub async fn stop(&self, mode: StopMode) {
        let (tx, rx) = oneshot::channel();
        if self.cmd.send(Command::Stop { mode, done: tx }).is_ok() {
            let _ = rx.await;
        }
    }
}

/// Starts the orchestrator. `hints` carries LISTEN/NOTIFY wake-ups (see [`crate::listen`]).
pub fn spawn(queue: Queue, cfg: RunConfig, hints: Option<mpsc::Receiver<()>>) -> (Handle, tokio::task::JoinHandle<()>) {
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (events, _) = broadcast::channel(1024);
    let initial = Status {
        state: if cfg.start_enabled { MachineState::Idle } else { MachineState::Off },
        enabled: cfg.start_enabled,
        paused: false,
        paused_for_secs: None,
        running: vec![],
        db_online: true,
        last_error: None,
    };
    let (status_tx, status_rx) = watch::channel(initial);
    let stats = Arc::new(Stats::default());
    let handle = Handle { cmd: cmd_tx, events: events.clone(), status: status_rx, stats: stats.clone() };
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let (net_tx, net_rx) = mpsc::unbounded_channel();
    let completer = Completer::spawn(queue.clone(), cfg.machine.clone());
    let lp = Loop {
        enabled: cfg.start_enabled,
        backoff: cfg.poll_interval,
        queue,
        cfg,
        events,
        status_tx,
        stats,
        running: HashMap::new(),
        zombies: Default::default(),
        done_tx,
        net_tx,
        completer,
        paused: None,
        db_online: true,
        last_error: None,
        last_sweep: None,
        sweep_in_flight: false,
        last_presence: None,
        presence_writes: vec![],
        poll_in_flight: false,
        poll_wait: None,
        poll_abandoned: false,
        renew_in_flight: false,
        next_poll: Instant::now(),
        next_heartbeat: Instant::now(),
        stopping: None,
        handoff_waiters: vec![],
        recheck_waiters: vec![],
        finished: false,
    };
    let join = tokio::spawn(lp.run(cmd_rx, done_rx, net_rx, hints));
    (handle, join)
}

#[derive(Clone, Copy)]
enum Paused {
    Until(Instant),
    Indefinitely,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CancelReason {
    HandOff,
    LeaseLost,
}

struct Slot {
    job: JobRef,
    started: u64,
    cancel: Option<oneshot::Sender<CancelReason>>,
}

/// Results of database work the loop spawned.
/// A presence row without its names, so it can travel into a spawned task.
#[derive(Clone, Copy, Debug)]
struct PresenceFields {
    status: &'static str,
    dispatch_enabled: bool,
    paused_until: Option<i64>,
    running: i32,
    concurrency: i32,
}

impl PresenceFields {
    fn presence<'a>(&self, orchestrator_id: &'a str, machine: &'a str) -> Presence<'a> {
        Presence {
            orchestrator_id,
            machine,
            status: self.status,
            dispatch_enabled: self.dispatch_enabled,
            paused_until: self.paused_until,
            running: self.running,
            concurrency: self.concurrency,
        }
    }
}

enum Net {
    /// Claims, how many were asked for, and whether a lease looked stale.
    Polled(Result<(Vec<Claim>, bool)>, u64),
    OpenWork(Result<i64>),
    Renewed {
        asked: Vec<i64>,
        result: Result<Vec<i64>>,
    },
    Swept(Result<(usize, usize)>),
}

struct Loop {
    queue: Queue,
    cfg: RunConfig,
    events: broadcast::Sender<Event>,
    status_tx: watch::Sender<Status>,
    stats: Arc<Stats>,
    running: HashMap<i64, Slot>,
    done_tx: mpsc::UnboundedSender<(i64, i64)>,
    /// Old claims of a job this machine has since re-claimed: still stopping, no longer ours.
    zombies: std::collections::HashSet<(i64, i64)>,
    net_tx: mpsc::UnboundedSender<Net>,
    completer: Completer,
    enabled: bool,
    paused: Option<Paused>,
    db_online: bool,
    last_error: Option<String>,
    backoff: Duration,
    last_sweep: Option<Instant>,
    sweep_in_flight: bool,
    last_presence: Option<Instant>,
    /// Presence upserts still running, so the last one ('stopped') can go after them.
    presence_writes: Vec<tokio::task::JoinHandle<()>>,
    poll_in_flight: bool,
    /// While stopping or handing off: how long to wait for an in-flight poll's answer, whose
    /// claims must be handed back. Past it the answer is given up on (see `poll_pending`).
    poll_wait: Option<Instant>,
    poll_abandoned: bool,
    renew_in_flight: bool,
    next_poll: Instant,
    next_heartbeat: Instant,
    stopping: Option<(StopMode, Instant, Vec<oneshot::Sender<()>>)>,
    handoff_waiters: Vec<oneshot::Sender<Vec<i64>>>,
    recheck_waiters: Vec<oneshot::Sender<Vec<i64>>>,
    finished: bool,
}

const FAR: Duration = Duration::from_secs(86_400);

/// How long a stop or a hand-off waits for the answer to a poll already in flight. A healthy
/// database answers in milliseconds; one that does not (unreachable, a pool timeout of 30 s)
/// is unlikely to have claimed anything, and must not hold up Quit or a settings change.
const POLL_ANSWER_WAIT: Duration = Duration::from_secs(5);

impl Loop {
    async fn run(
        mut self,
        mut cmd_rx: mpsc::UnboundedReceiver<Command>,
        mut done_rx: mpsc::UnboundedReceiver<(i64, i64)>,
        mut net_rx: mpsc::UnboundedReceiver<Net>,
        hints: Option<mpsc::Receiver<()>>,
    ) {
        let (_keep, dummy) = mpsc::channel(1);
        let mut hints = hints.unwrap_or(dummy);
        let mut hints_open = true;
        self.publish();
        while !self.finished {
            let pause_deadline = match self.paused {
                Some(Paused::Until(t)) => t,
                _ => Instant::now() + FAR,
            };
            let stop_deadline = match &self.stopping {
                Some((StopMode::Drain { .. }, deadline, _)) => *deadline,
                _ => Instant::now() + FAR,
            };
            let heartbeat_due = !self.running.is_empty() && !self.renew_in_flight;
            let poll_due = !self.poll_in_flight;
            tokio::select! {
                biased;
                Some(cmd) = cmd_rx.recv() => self.command(cmd),
                Some((id, token)) = done_rx.recv() => self.job_done(id, token),
                Some(net) = net_rx.recv() => self.net(net),
                _ = tokio::time::sleep_until(stop_deadline), if matches!(self.stopping, Some((StopMode::Drain { .. }, _, _))) => {
                    // The soft stop's grace is over: hard stop.
                    if let Some((mode, _, _)) = &mut self.stopping {
                        *mode = StopMode::HandOff;
                    }
                    self.cancel_all(CancelReason::HandOff);
                }
                _ = tokio::time::sleep_until(pause_deadline), if matches!(self.paused, Some(Paused::Until(_))) => {
                    self.paused = None;
                    self.next_poll = Instant::now();
                    self.state_changed();
                }
                _ = tokio::time::sleep_until(self.next_heartbeat), if heartbeat_due => self.renew(),
                _ = tokio::time::sleep_until(self.poll_wait.unwrap_or_else(|| Instant::now() + FAR)), if self.poll_wait.is_some() => {
                    self.poll_wait = None;
                    if self.poll_in_flight {
                        tracing::warn!("no answer to the last poll yet; not waiting for it (a claim it made, if any, goes back with the sweep)");
                        self.poll_abandoned = true;
                    }
                }
                hint = hints.recv(), if hints_open => {
                    match hint {
                        Some(()) => { self.backoff = self.cfg.poll_interval; self.next_poll = Instant::now(); }
                        None => hints_open = false,
                    }
                }
                _ = tokio::time::sleep_until(self.next_poll), if poll_due => self.poll(),
            }
            self.maybe_finish_handoff();
            self.maybe_finish_stop();
        }
        // Awaited (briefly), not spawned: the process may exit the moment the stop returns, and
        // the fleet should see this machine as stopped rather than as gone silent. Earlier
        // upserts still running (the stop command itself sends one) go first, or one of them
        // could land after this and say 'online' again.
        let earlier = std::mem::take(&mut self.presence_writes);
        let _ = tokio::time::timeout(Duration::from_secs(3), async {
            for w in earlier {
                let _ = w.await;
            }
        })
        .await;
        let mut f = self.presence_fields();
        f.status = "stopped";
        let presence = f.presence(&self.cfg.orchestrator_id, &self.cfg.machine);
        match tokio::time::timeout(Duration::from_secs(3), self.queue.heartbeat_machine(&presence)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "could not record this machine as stopped"),
            Err(_) => tracing::debug!("no answer recording this machine as stopped"),
        }
        let _ = self.events.send(Event::Stopped);
        if let Some((_, _, waiters)) = self.stopping.take() {
            for w in waiters {
                let _ = w.send(());
            }
        }
    }

    fn emit(&self, e: Event) {
        let _ = self.events.send(e);
    }

    fn accepting(&self) -> bool {
        self.enabled && self.paused.is_none() && self.stopping.is_none()
    }

    fn state(&self) -> MachineState {
        if self.finished {
            MachineState::Stopped
        } else if !self.db_online {
            MachineState::Offline
        } else if !self.running.is_empty() {
            MachineState::Working
        } else if !self.enabled {
            MachineState::Off
        } else if self.paused.is_some() {
            MachineState::Paused
        } else {
            MachineState::Idle
        }
    }

    fn publish(&self) {
        let mut running: Vec<RunningJob> =
            self.running.values().map(|s| RunningJob { job: s.job.clone(), started_unix_ms: s.started }).collect();
        running.sort_by_key(|r| r.job.id);
        let paused_for_secs = match self.paused {
            Some(Paused::Until(t)) => Some(t.saturating_duration_since(Instant::now()).as_secs()),
            _ => None,
        };
        let st = Status {
            state: self.state(),
            enabled: self.enabled,
            paused: self.paused.is_some(),
            paused_for_secs,
            running,
            db_online: self.db_online,
            last_error: self.last_error.clone(),
        };
        let changed = self.status_tx.borrow().state != st.state;
        self.status_tx.send_replace(st);
        if changed {
            self.emit(Event::StateChanged { state: self.state() });
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
                self.enabled = on;
                self.next_poll = Instant::now();
                self.state_changed();
            }
            Command::Pause(d) => {
                self.paused = Some(match d {
                    Some(d) => Paused::Until(Instant::now() + d),
                    None => Paused::Indefinitely,
                });
                self.state_changed();
            }
            Command::Resume => {
                self.paused = None;
                self.next_poll = Instant::now();
                self.state_changed();
            }
            Command::Wake => {
                self.backoff = self.cfg.poll_interval;
                self.next_poll = Instant::now();
            }
            Command::HandOff { pause, done } => {
                if pause {
                    self.paused = Some(Paused::Indefinitely);
                }
                self.wait_for_poll_answer();
                self.handoff_waiters.push(done);
                self.cancel_all(CancelReason::HandOff);
                self.state_changed();
            }
            Command::Recheck(done) => {
                if self.running.is_empty() {
                    let _ = done.send(vec![]);
                } else {
                    self.recheck_waiters.push(done);
                    self.renew_in_flight = false;
                    self.renew();
                }
            }
            Command::Stop { mode, done } => {
                self.wait_for_poll_answer();
                match &mut self.stopping {
                    Some((_, _, waiters)) => waiters.push(done),
                    None => {
                        let grace = match mode {
                            StopMode::Drain { grace } => grace,
                            StopMode::HandOff => Duration::ZERO,
                        };
                        self.stopping = Some((mode, Instant::now() + grace, vec![done]));
                        if mode == StopMode::HandOff {
                            self.cancel_all(CancelReason::HandOff);
                        }
                    }
                }
                self.state_changed();
            }
        }
    }

    fn cancel_all(&mut self, why: CancelReason) {
        for slot in self.running.values_mut() {
            if let Some(c) = slot.cancel.take() {
                let _ = c.send(why);
            }
        }
    }

    fn wait_for_poll_answer(&mut self) {
        if self.poll_in_flight && self.poll_wait.is_none() {
            self.poll_wait = Some(Instant::now() + POLL_ANSWER_WAIT);
        }
    }

    /// A poll is in flight and we still wait for its answer.
    fn poll_pending(&self) -> bool {
        self.poll_in_flight && !self.poll_abandoned
    }

    /// Nothing this machine claimed is still being stopped or handed back, and no poll whose
    /// claims would be unwanted is still in flight.
    fn handed_off(&self) -> bool {
        self.running.values().all(|s| s.cancel.is_some())
            && self.zombies.is_empty()
            && (self.accepting() || !self.poll_pending())
    }

    fn maybe_finish_handoff(&mut self) {
        if !self.handoff_waiters.is_empty() && self.handed_off() {
            for w in self.handoff_waiters.drain(..) {
                let _ = w.send(vec![]);
            }
        }
    }

    fn maybe_finish_stop(&mut self) {
        // A poll still in flight may yet land a claim; it must be handed back before we go,
        // or the claim would sit stranded until a sweep.
        if self.stopping.is_some() && self.running.is_empty() && self.zombies.is_empty() && !self.poll_pending() {
            self.finished = true;
        }
    }

    fn job_done(&mut self, id: i64, token: i64) {
        if self.running.get(&id).is_some_and(|s| s.job.token == token) {
            self.running.remove(&id);
        } else {
            self.zombies.remove(&(id, token));
        }
        // A slot freed up: look for more work now.
        self.next_poll = Instant::now();
        self.publish();
    }

    fn set_online(&mut self, online: bool, error: Option<String>) {
        if online != self.db_online {
            self.db_online = online;
            if online {
                self.emit(Event::DatabaseOnline);
            } else {
                self.emit(Event::DatabaseOffline { error: error.clone().unwrap_or_default() });
            }
            self.last_error = error;
            self.state_changed();
        }
    }

    // ------------------------------------------------------------ polling

    fn poll(&mut self) {
        self.stats.polls.fetch_add(1, Ordering::Relaxed);
        let free = self.cfg.concurrency.saturating_sub(self.running.len() as u32);
        if !self.accepting() || free == 0 {
            self.maybe_sweep();
            self.maybe_presence();
            // Nothing to claim; a command or a finished job wakes us.
            self.next_poll = Instant::now() + self.cfg.presence_every;
            return;
        }
        self.poll_in_flight = true;
        let q = self.queue.clone();
        let tx = self.net_tx.clone();
        let (orch, machine, mode) = (self.cfg.orchestrator_id.clone(), self.cfg.machine.clone(), self.cfg.claim_mode);
        let stats = self.stats.clone();
        let events = self.events.clone();
        if mode == ClaimMode::ById {
            self.maybe_sweep();
            self.maybe_presence();
            tokio::spawn(async move {
                stats.claim_queries.fetch_add(1, Ordering::Relaxed);
                let res = claim_by_ids(&q, &orch, &machine, free, &stats, &events).await;
                let _ = tx.send(Net::Polled(res.map(|c| (c, false)), u64::from(free)));
            });
            return;
        }
        // The herd-free pick carries the housekeeping that is due, so that an idle machine
        // sends one statement per poll: presence in the same statement, and a read-only
        // stale-lease test whose answer decides whether a sweep is worth a statement.
        let presence = self.presence_due().then(|| self.presence_fields());
        let stale_after = self.sweep_due().then_some(self.cfg.claim_timeout);
        if stale_after.is_some() {
            self.last_sweep = Some(Instant::now());
            self.stats.sweep_checks.fetch_add(1, Ordering::Relaxed);
        }
        tokio::spawn(async move {
            stats.claim_queries.fetch_add(1, Ordering::Relaxed);
            let extras = PollExtras { presence: presence.as_ref().map(|f| f.presence(&orch, &machine)), stale_after };
            let res = q.claim_next_with(&orch, &machine, free, &extras).await;
            let _ = tx.send(Net::Polled(res.map(|p| (p.claims, p.stale)), u64::from(free)));
        });
    }

    fn net(&mut self, net: Net) {
        match net {
            Net::Polled(res, asked) => {
                self.poll_in_flight = false;
                self.poll_abandoned = false;
                self.poll_wait = None;
                match res {
                    Ok((claims, stale)) => {
                        self.set_online(true, None);
                        if stale && !self.sweep_in_flight {
                            self.start_sweep();
                        }
                        if !self.accepting() {
                            // Dispatch went off, a pause began or a stop started while this
                            // poll was in flight: these claims are not wanted here.
                            self.hand_back(claims);
                            self.publish();
                            return;
                        }
                        let got = claims.len() as u64;
                        for c in claims {
                            self.start_job(c);
                        }
                        if got > 0 {
                            self.backoff = self.cfg.poll_interval;
                            let busy = self.running.len() as u32 >= self.cfg.concurrency;
                            self.next_poll = if got >= asked && busy {
                                Instant::now() + FAR // all slots busy; a finished job wakes us
                            } else if got >= asked {
                                // Slots freed while this poll was in flight: fill them now.
                                Instant::now()
                            } else {
                                Instant::now() + jitter(self.cfg.poll_interval)
                            };
                        } else {
                            let ceiling = if self.cfg.until_empty {
                                self.cfg.max_poll_interval.min(Duration::from_millis(500))
                            } else {
                                self.cfg.max_poll_interval
                            };
                            self.next_poll = Instant::now() + jitter(self.backoff);
                            self.backoff = (self.backoff * 2).min(ceiling).max(self.cfg.poll_interval.min(ceiling));
                            if self.cfg.until_empty && self.running.is_empty() {
                                self.check_open_work();
                            }
                        }
                        self.publish();
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "poll failed");
                        self.set_online(false, Some(e.to_string()));
                        self.backoff = (self.backoff * 2).min(Duration::from_secs(10));
                        self.next_poll = Instant::now() + jitter(self.backoff);
                    }
                }
            }
            Net::OpenWork(res) => {
                if let Ok(0) = res {
                    if self.running.is_empty() {
                        self.finished = true;
                    }
                }
            }
            Net::Renewed { asked, result } => {
                self.renew_in_flight = false;
                self.next_heartbeat = Instant::now() + self.cfg.heartbeat;
                match result {
                    Ok(kept) => {
                        self.set_online(true, None);
                        let lost: Vec<i64> = asked.iter().copied().filter(|id| !kept.contains(id)).collect();
                        for id in &lost {
                            if let Some(slot) = self.running.get_mut(id) {
                                if let Some(c) = slot.cancel.take() {
                                    let _ = c.send(CancelReason::LeaseLost);
                                }
                            }
                        }
                        for w in self.recheck_waiters.drain(..) {
                            let _ = w.send(lost.clone());
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "heartbeat failed");
                        self.emit(Event::HeartbeatFailed { error: e.to_string() });
                        self.set_online(false, Some(e.to_string()));
                        // Retry sooner than a full interval: the lease is ticking.
                        self.next_heartbeat = Instant::now() + self.cfg.heartbeat.min(Duration::from_secs(5));
                        for w in self.recheck_waiters.drain(..) {
                            let _ = w.send(vec![]);
                        }
                    }
                }
            }
            Net::Swept(res) => {
                self.sweep_in_flight = false;
                match res {
                    Ok((released, dead)) => {
                        if released + dead > 0 {
                            self.emit(Event::Swept { released, dead });
                            self.next_poll = Instant::now();
                        }
                    }
                    Err(e) => {
                        // Housekeeping never fails a poll: log it and carry on.
                        self.stats.sweep_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, "sweep failed");
                        self.emit(Event::SweepFailed { error: e.to_string() });
                    }
                }
            }
        }
    }

    fn check_open_work(&self) {
        let q = self.queue.clone();
        let tx = self.net_tx.clone();
        let orch = self.cfg.orchestrator_id.clone();
        tokio::spawn(async move {
            let res = q.counts(&orch).await.map(|c| c.open());
            let _ = tx.send(Net::OpenWork(res));
        });
    }

    fn sweep_due(&self) -> bool {
        !self.sweep_in_flight && self.last_sweep.is_none_or(|t| t.elapsed() >= self.cfg.sweep_every)
    }

    fn presence_due(&self) -> bool {
        self.last_presence.is_none_or(|t| t.elapsed() >= self.cfg.presence_every)
    }

    /// The opportunistic sweep: throttled, spawned, never awaited by the poll.
    fn maybe_sweep(&mut self) {
        if self.sweep_due() {
            self.stats.sweep_checks.fetch_add(1, Ordering::Relaxed);
            self.start_sweep();
        }
    }

    fn start_sweep(&mut self) {
        self.last_sweep = Some(Instant::now());
        self.sweep_in_flight = true;
        self.stats.sweeps.fetch_add(1, Ordering::Relaxed);
        let q = self.queue.clone();
        let tx = self.net_tx.clone();
        let (orch, timeout, max) = (self.cfg.orchestrator_id.clone(), self.cfg.claim_timeout, self.cfg.max_attempts);
        tokio::spawn(async move {
            let res = q.sweep(Some(&orch), timeout, max).await.map(|s| {
                let dead = s.iter().filter(|x| x.dead).count();
                (s.len() - dead, dead)
            });
            let _ = tx.send(Net::Swept(res));
        });
    }

    fn maybe_presence(&mut self) {
        if self.presence_due() {
            self.write_presence();
        }
    }

    /// What this machine reports about itself now; also marks presence as written.
    fn presence_fields(&mut self) -> PresenceFields {
        self.last_presence = Some(Instant::now());
        self.stats.presence_writes.fetch_add(1, Ordering::Relaxed);
        let status = match self.state() {
            MachineState::Idle | MachineState::Working | MachineState::Offline => "online",
            MachineState::Paused => "paused",
            MachineState::Off => "off",
            MachineState::Stopped => "stopped",
        };
        let paused_until = match self.paused {
            Some(Paused::Until(t)) => {
                Some(unix_ms() as i64 + t.saturating_duration_since(Instant::now()).as_millis() as i64)
            }
            _ => None,
        };
        PresenceFields {
            status,
            dispatch_enabled: self.enabled,
            paused_until,
            running: self.running.len() as i32,
            concurrency: self.cfg.concurrency as i32,
        }
    }

    fn write_presence(&mut self) {
        let f = self.presence_fields();
        let q = self.queue.clone();
        let (orch, machine) = (self.cfg.orchestrator_id.clone(), self.cfg.machine.clone());
        self.presence_writes.retain(|w| !w.is_finished());
        self.presence_writes.push(tokio::spawn(async move {
            if let Err(e) = q.heartbeat_machine(&f.presence(&orch, &machine)).await {
                tracing::debug!(error = %e, "presence update failed");
            }
        }));
    }

    fn renew(&mut self) {
        if self.running.is_empty() {
            return;
        }
        self.renew_in_flight = true;
        self.stats.heartbeats.fetch_add(1, Ordering::Relaxed);
        let held: Vec<(i64, i64)> = self.running.values().map(|s| (s.job.id, s.job.token)).collect();
        let asked: Vec<i64> = held.iter().map(|(id, _)| *id).collect();
        let q = self.queue.clone();
        let tx = self.net_tx.clone();
        tokio::spawn(async move {
            let result = q.renew(&held).await;
            let _ = tx.send(Net::Renewed { asked, result });
        });
    }

    /// Releases claims that landed after this machine stopped claiming, without running them
    /// or burning an attempt. They count as zombies until released, so a stop or a hand-off
    /// waits for them.
    fn hand_back(&mut self, claims: Vec<Claim>) {
        for c in claims {
            tracing::info!(job = c.id, "a claim landed after claiming stopped; handing it back");
            self.zombies.insert((c.id, c.token));
            let (q, machine, done) = (self.queue.clone(), self.cfg.machine.clone(), self.done_tx.clone());
            tokio::spawn(async move {
                let reason = "claimed just as this machine stopped claiming; handed back unrun";
                let _ = retry(&cancel_never(), || q.release(c.id, c.token, &machine, reason)).await;
                let _ = done.send((c.id, c.token));
            });
        }
    }

    fn start_job(&mut self, claim: Claim) {
        let job = JobRef::of(&claim);
        let (cancel_tx, cancel_rx) = oneshot::channel();
        if let Some(mut old) = self.running.remove(&claim.id) {
            // We re-claimed a job whose earlier claim of ours was swept (say, this machine
            // stalled past the timeout). That old run is no longer ours: stop it.
            if let Some(c) = old.cancel.take() {
                let _ = c.send(CancelReason::LeaseLost);
            }
            self.zombies.insert((claim.id, old.job.token));
        }
        if self.running.is_empty() {
            self.next_heartbeat = Instant::now() + self.cfg.heartbeat;
        }
        self.running.insert(claim.id, Slot { job: job.clone(), started: unix_ms(), cancel: Some(cancel_tx) });
        self.emit(Event::Claimed { job });
        let ctx = JobCtx {
            queue: self.queue.clone(),
            agent: self.cfg.agent.clone(),
            env: AgentEnv {
                log_dir: self.cfg.log_dir.clone(),
                payload_dir: self.cfg.payload_dir.clone(),
                machine: self.cfg.machine.clone(),
            },
            machine: self.cfg.machine.clone(),
            max_attempts: self.cfg.max_attempts,
            grace: self.cfg.cancel_grace,
            events: self.events.clone(),
            completer: self.completer.clone(),
            done: self.done_tx.clone(),
        };
        tokio::spawn(run_job(ctx, claim, cancel_rx));
    }
}

/// The article's path, for comparison: read candidates, claim each by id, count lost races.
async fn claim_by_ids(
    q: &Queue,
    orch: &str,
    machine: &str,
    free: u32,
    stats: &Stats,
    events: &broadcast::Sender<Event>,
) -> Result<Vec<Claim>> {
    let ids = q.candidates(orch, free.saturating_mul(4).max(1)).await?;
    let mut claims = vec![];
    for id in ids {
        if claims.len() as u32 >= free {
            break;
        }
        match q.claim_by_id(id, orch, machine).await? {
            Some(c) => claims.push(c),
            None => {
                // Another machine won this one; not an error. Next candidate.
                stats.lost_races.fetch_add(1, Ordering::Relaxed);
                let _ = events.send(Event::LostRace { job_id: id });
            }
        }
    }
    Ok(claims)
}

struct JobCtx {
    queue: Queue,
    agent: AgentSpec,
    env: AgentEnv,
    machine: String,
    max_attempts: i32,
    grace: Duration,
    events: broadcast::Sender<Event>,
    completer: Completer,
    done: mpsc::UnboundedSender<(i64, i64)>,
}

enum Outcome {
    Exited(AgentExit),
    Cancelled(CancelReason),
}

async fn run_job(ctx: JobCtx, claim: Claim, mut cancel: oneshot::Receiver<CancelReason>) {
    let job = JobRef::of(&claim);
    let (id, token) = (claim.id, claim.token);
    let mut agent = match ctx.agent.start(&claim, &ctx.env).await {
        Ok(a) => a,
        Err(e) => {
            // A broken agent is this machine's problem, not the job's: hand it back unharmed.
            tracing::error!(job = id, error = %e, "agent could not start");
            let _ = ctx.events.send(Event::AgentError { job: job.clone(), error: e.to_string() });
            let reason = format!("agent could not start: {e}");
            let _ = retry(&cancel_never(), || ctx.queue.release(id, token, &ctx.machine, &reason)).await;
            let _ = ctx.done.send((id, token));
            return;
        }
    };
    let outcome = tokio::select! {
        biased;
        exit = agent.wait() => Outcome::Exited(exit),
        why = &mut cancel => {
            match agent.try_exit() {
                // It finished just as we were told to stop: report the outcome (fenced).
                Some(exit) => Outcome::Exited(exit),
                None => {
                    agent.terminate(ctx.grace).await;
                    Outcome::Cancelled(why.unwrap_or(CancelReason::HandOff))
                }
            }
        }
    };
    drop(agent);
    let ev = match outcome {
        Outcome::Exited(AgentExit::Success) => {
            match retry(&cancel_never(), || ctx.completer.complete(id, token)).await {
                Some(true) => Some(Event::Completed { job }),
                Some(false) => Some(Event::LeaseLost { job, reason: LossReason::CompletionRejected }),
                None => None,
            }
        }
        Outcome::Exited(AgentExit::Failed(msg)) => {
            match retry(&cancel_never(), || ctx.queue.fail(id, token, &ctx.machine, &msg, ctx.max_attempts)).await {
                Some(Some(o)) => Some(Event::Failed { job, error: msg, dead: o == FailOutcome::Dead }),
                Some(None) => Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired }),
                None => None,
            }
        }
        Outcome::Cancelled(CancelReason::HandOff) => {
            match retry(&cancel_never(), || ctx.queue.release(id, token, &ctx.machine, "handed off by its machine"))
                .await
            {
                Some(true) => Some(Event::Released { job }),
                Some(false) => Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired }),
                None => None,
            }
        }
        Outcome::Cancelled(CancelReason::LeaseLost) => {
            ctx.queue
                .note(id, "lease_lost", &ctx.machine, Some(token), "heartbeat found the lease gone; agent stopped")
                .await;
            Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired })
        }
    };
    if let Some(ev) = ev {
        let _ = ctx.events.send(ev);
    }
    let _ = ctx.done.send((id, token));
}

fn cancel_never() -> Duration {
    Duration::from_secs(120)
}

/// Retries a write while the database is unreachable, for up to `budget`. The write is
/// fenced, so retrying it is always safe.
async fn retry<T, F, Fut>(budget: &Duration, mut op: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let start = Instant::now();
    let mut wait = Duration::from_millis(100);
    loop {
        match op().await {
            Ok(v) => return Some(v),
            Err(e) => {
                if start.elapsed() >= *budget {
                    tracing::error!(error = %e, "giving up on a write; the sweep will recover the job");
                    return None;
                }
                tracing::warn!(error = %e, "write failed, retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Batches completions from one process into one fenced statement per flush. Under load
/// each flush carries whatever queued up during the previous one; idle, it adds no delay.
#[derive(Clone)]
struct Completer {
    tx: mpsc::UnboundedSender<(i64, i64, oneshot::Sender<Result<bool>>)>,
}

impl Completer {
    fn spawn(queue: Queue, machine: String) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<(i64, i64, oneshot::Sender<Result<bool>>)>();
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
                            let _ = reply.send(Ok(accepted.contains(&(id, token))));
                        }
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        for (_, _, reply) in batch {
                            let _ = reply.send(Err(Error::Db(msg.clone())));
                        }
                    }
                }
            }
        });
        Self { tx }
    }

    async fn complete(&self, id: i64, token: i64) -> Result<bool> {
        let (tx, rx) = oneshot::channel();
        self.tx.send((id, token, tx)).map_err(|_| Error::Invalid("the completer has stopped".into()))?;
        rx.await.map_err(|_| Error::Invalid("the completer has stopped".into()))?
    }
}

fn jitter(d: Duration) -> Duration {
    let f: f64 = rand::rng().random_range(0.8..1.2);
    d.mul_f64(f)
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
