//! Starting a machine: [`spawn`] and [`spawn_into`] wire the lease keeper, maintenance and
//! the runner's context around a [`Machine`] task.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::clock::{BootClock, Clock};
use super::config::RunConfig;
use super::handle::Handle;
use super::lease::{call_bound, Keeper, Order};
use super::machine::{Health, Inbox, Machine, Problem, Wishes};
use super::maintenance::{Maintenance, SweepCfg};
use super::poller::Poller;
use super::runner::{Completer, JobCtx, JobDone};
use super::sources::Sources;
use super::stats::Stats;
use super::status::{Event, Status};
use crate::agent::AgentEnv;
use crate::worktree::Workspaces;
use devpilot_store::listen::Hint;
use devpilot_store::queue::{MachineStore, PresenceOrder, Queue};

/// Starts the orchestrator with a status channel of its own. `hints` carries LISTEN/NOTIFY
/// wake-ups (see [`devpilot_store::listen`]).
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
    // What its agents are given is known before any of them runs: the store redacts it.
    crate::redact::learn_agent_env(&cfg.agent, &cfg.pass_env);
    let store =
        MachineStore::new(queue.with_call_timeout(call_bound(cfg.heartbeat)), &cfg.orchestrator_id, &cfg.machine)
            .with_redactor(crate::redact::known().clone());
    let (news_tx, news_rx) = mpsc::unbounded_channel();
    let (orders, orders_rx) = mpsc::unbounded_channel();
    tokio::spawn(
        Keeper::new(store.clone(), clock.clone(), cfg.timing(), news_tx).counting(stats.clone()).run(orders_rx),
    );
    // "Poll now": a sweep released claims, or an intake turn wrote jobs. Without it a machine
    // whose own sources service added a job waits for its backed-off poll (no NOTIFY on
    // SQLite or through a pooler).
    let (poll_now_tx, poll_now_rx) = mpsc::unbounded_channel();
    let every = (cfg.sweep_every, cfg.prune_every);
    let (maintenance, sweep_cfg) =
        Maintenance::spawn(sweep_cfg(&store, &cfg), every, events.clone(), stats.clone(), poll_now_tx.clone());
    let sources = Sources::spawn(store.queue().clone(), cfg.sources_cfg(), events.clone(), status.clone(), poll_now_tx);
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let (net_tx, net_rx) = mpsc::unbounded_channel();
    let problem = cfg.agent.check().err().map(|e| Problem::new(&e, cfg.problem_recheck()));
    let m = Machine {
        wishes: Wishes { enabled: cfg.start_enabled, paused: None },
        poller: Poller::new(cfg.poll_base(), cfg.max_poll_interval),
        ctx: Arc::new(job_ctx(&store, &cfg, &events, done_tx.clone(), orders.clone())),
        store,
        cfg,
        events,
        status,
        stats,
        slots: HashMap::new(),
        riders: Vec::new(),
        keeper: orders,
        maintenance,
        sweep_cfg,
        sources,
        last_presence: None,
        presence_order: PresenceOrder { run: rand::random::<i64>(), seq: 0 },
        db: Health { online: true, error: None },
        problem,
        work: TaskTracker::new(),
        hard_stop: CancellationToken::new(),
        stop: None,
        clock,
        net_tx,
        done_tx,
    };
    let join = tokio::spawn(
        m.run(Inbox { cmd: cmd_rx, done: done_rx, news: news_rx, net: net_rx, poll_now: poll_now_rx }, hints),
    );
    (handle, join)
}

pub(super) fn sweep_cfg(store: &MachineStore, cfg: &RunConfig) -> SweepCfg {
    SweepCfg {
        store: store.clone(),
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

pub(super) fn job_ctx(
    store: &MachineStore,
    cfg: &RunConfig,
    events: &broadcast::Sender<Event>,
    done: mpsc::UnboundedSender<JobDone>,
    keeper: mpsc::UnboundedSender<Order>,
) -> JobCtx {
    JobCtx {
        store: store.clone(),
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
        grace: cfg.cancel_grace,
        kill_grace: cfg.timing().kill_grace,
        events: events.clone(),
        completer: Completer::spawn(store.clone()),
        done,
        keeper,
        backoff: cfg.backoff,
        max_park: cfg.max_park,
        scratch_root: cfg.scratch_root.clone(),
        confining: cfg.confining.clone(),
        governed: Arc::new(super::governed::Governed::new(cfg.limits.clone(), &cfg.agent, &cfg.machine)),
    }
}
