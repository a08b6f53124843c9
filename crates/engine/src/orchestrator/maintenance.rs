//! Maintenance: the opportunistic sweep of stale claims and the retention of finished work,
//! as their own service. The poll path only asks it (never awaits it): at most once per sweep
//! interval the poll carries a read-only stale-lease test (PostgreSQL) or simply asks for a
//! sweep (SQLite, or a machine that is not claiming), and at most once per prune interval it
//! asks for a prune; the service runs the statements on its own task. Its failures are
//! logged and counted, never propagated: housekeeping must never fail a poll.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::stats::Stats;
use super::status::Event;
use devpilot_store::queue::{MachineStore, Queue, Retention};

/// How many jobs one prune statement deletes at most: small enough that no lock is held long.
const PRUNE_BATCH: u32 = 500;

/// One throttle the poll path consults.
#[derive(Debug)]
struct Throttle {
    every: Duration,
    last: Option<Instant>,
}

impl Throttle {
    fn new(every: Duration) -> Self {
        Self { every, last: None }
    }

    /// Whether it is due; if so it counts as taken now.
    fn take(&mut self) -> bool {
        if self.last.is_some_and(|l| l.elapsed() < self.every) {
            return false;
        }
        self.last = Some(Instant::now());
        true
    }
}

#[derive(Debug)]
struct Throttles {
    sweep: Throttle,
    prune: Throttle,
}

/// What the service is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Task {
    Sweep,
    Prune,
}

/// The poll path's side of the service. Cheap to clone.
#[derive(Clone)]
pub struct Maintenance {
    throttles: Arc<Mutex<Throttles>>,
    sweeps: mpsc::Sender<Task>,
    prunes: mpsc::Sender<Task>,
    stats: Arc<Stats>,
}

/// What the service needs.
pub struct SweepCfg {
    pub store: MachineStore,
    pub claim_timeout: Duration,
    pub retention: Retention,
    /// Agent logs and payload files older than the retention are deleted from these.
    pub file_dirs: Vec<PathBuf>,
    /// Job worktrees: one whose job retention has deleted goes too, if nothing in it would
    /// be lost (failed and dead jobs keep theirs until then).
    pub workspaces: Option<std::sync::Arc<crate::worktree::Workspaces>>,
}

impl Maintenance {
    /// Starts the service. It ends when every [`Maintenance`] clone is dropped. `swept`
    /// is told when a sweep released something, so the machine can poll at once.
    pub fn spawn(
        cfg: SweepCfg,
        (sweep_every, prune_every): (Duration, Duration),
        events: broadcast::Sender<Event>,
        stats: Arc<Stats>,
        swept: mpsc::UnboundedSender<()>,
    ) -> (Self, mpsc::UnboundedSender<SweepCfg>) {
        // One slot per task: an ask while one is pending is absorbed by it.
        let (sweeps, mut sweep_rx) = mpsc::channel::<Task>(1);
        let (prunes, mut prune_rx) = mpsc::channel::<Task>(1);
        let (cfg_tx, mut cfgs) = mpsc::unbounded_channel::<SweepCfg>();
        // The first prune waits one interval: a machine that starts (or restarts) often
        // should not prune at every start, and a short `run --until-empty` never needs to.
        let first_prune = Throttle { every: prune_every, last: Some(Instant::now()) };
        let throttles = Throttles { sweep: Throttle::new(sweep_every), prune: first_prune };
        let me = Self { throttles: Arc::new(Mutex::new(throttles)), sweeps, prunes, stats: stats.clone() };
        tokio::spawn(async move {
            let mut cfg = cfg;
            loop {
                let task = tokio::select! {
                    biased;
                    Some(t) = sweep_rx.recv() => t,
                    Some(t) = prune_rx.recv() => t,
                    else => return,
                };
                while let Ok(c) = cfgs.try_recv() {
                    cfg = c;
                }
                match task {
                    Task::Sweep => sweep(&cfg, &events, &stats, &swept).await,
                    Task::Prune => prune(&cfg).await,
                }
            }
        });
        (me, cfg_tx)
    }

    /// Whether a sweep check is due; if so it counts as taken now (one per interval).
    pub fn take_due(&self) -> bool {
        let Ok(mut t) = self.throttles.lock() else { return false };
        let due = t.sweep.take();
        if due {
            self.stats.sweep_checks.fetch_add(1, Ordering::Relaxed);
        }
        due
    }

    /// Asks for a sweep. A sweep already running or asked for absorbs this one.
    pub fn sweep(&self) {
        let _ = self.sweeps.try_send(Task::Sweep);
    }

    /// The check and the sweep together, for a poll that carries no stale test.
    pub fn tick(&self) {
        if self.take_due() {
            self.sweep();
        }
    }

    /// Asks for a prune if one is due (one per prune interval).
    pub fn prune_tick(&self) {
        let due = self.throttles.lock().map(|mut t| t.prune.take()).unwrap_or(false);
        if due {
            let _ = self.prunes.try_send(Task::Prune);
        }
    }

    pub fn set_every(&self, sweep_every: Duration, prune_every: Duration) {
        if let Ok(mut t) = self.throttles.lock() {
            t.sweep.every = sweep_every;
            t.prune.every = prune_every;
        }
    }
}

async fn sweep(cfg: &SweepCfg, events: &broadcast::Sender<Event>, stats: &Stats, swept: &mpsc::UnboundedSender<()>) {
    stats.sweeps.fetch_add(1, Ordering::Relaxed);
    match cfg.store.sweep(cfg.claim_timeout).await {
        Ok(s) => {
            let dead = s.iter().filter(|x| x.dead).count();
            if !s.is_empty() {
                let _ = events.send(Event::Swept { released: s.len() - dead, dead });
                let _ = swept.send(());
            }
        }
        Err(e) => {
            stats.sweep_failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "sweep failed");
            let _ = events.send(Event::SweepFailed { error: e.to_string() });
        }
    }
}

async fn prune(cfg: &SweepCfg) {
    match cfg.store.prune(&cfg.retention, PRUNE_BATCH).await {
        Ok(p) if p.jobs > 0 || p.machines > 0 => {
            tracing::info!(jobs = p.jobs, machines = p.machines, "retention: deleted finished jobs and old machines")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "retention failed"),
    }
    let (dirs, older_than) = (cfg.file_dirs.clone(), file_retention(&cfg.retention));
    match tokio::task::spawn_blocking(move || prune_files(&dirs, older_than)).await {
        Ok(n) if n > 0 => tracing::info!(files = n, "retention: deleted old agent logs and payload files"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "retention of files failed"),
    }
    if let Some(ws) = &cfg.workspaces {
        prune_worktrees(cfg.store.queue(), ws).await;
    }
}

/// Removes the worktrees of jobs that retention deleted, when they hold nothing unsaved.
async fn prune_worktrees(queue: &Queue, ws: &crate::worktree::Workspaces) {
    let ids: Vec<i64> = ws.records().iter().map(|r| r.job).collect();
    if ids.is_empty() {
        return;
    }
    let present: std::collections::HashSet<i64> = match queue.job_states(&ids).await {
        Ok(states) => states.into_iter().map(|(id, _)| id).collect(),
        Err(e) => return tracing::warn!(error = %e, "retention of worktrees failed"),
    };
    let (removed, kept) = ws.prune(&|id| !present.contains(&id)).await;
    if !removed.is_empty() {
        tracing::info!(worktrees = removed.len(), "retention: removed the worktrees of deleted jobs");
    }
    for r in kept {
        tracing::info!(job = r.job, path = %r.path.display(), "retention kept a worktree: {}", r.kept.unwrap_or_default());
    }
}

/// How old an agent log or payload file must be to go: the jobs' retention, but never less
/// than a day, so that a short `--older-than` cannot take the payload file or the log of an
/// agent that is still running.
pub fn file_retention(r: &Retention) -> Duration {
    r.finished.max(Duration::from_secs(86_400))
}

/// Deletes the regular files directly in `dirs` last modified longer than `older_than` ago;
/// how many. A file that cannot be read or deleted is logged and skipped.
pub fn prune_files(dirs: &[PathBuf], older_than: Duration) -> usize {
    let Some(cutoff) = SystemTime::now().checked_sub(older_than) else { return 0 };
    dirs.iter().map(|d| prune_dir(d, cutoff)).sum()
}

fn prune_dir(dir: &Path, cutoff: SystemTime) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut n = 0;
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() || meta.modified().map_or(true, |m| m >= cutoff) {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => n += 1,
            Err(e) => tracing::debug!(path = %entry.path().display(), error = %e, "could not delete an old file"),
        }
    }
    n
}
