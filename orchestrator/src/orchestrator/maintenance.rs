//! Maintenance: the opportunistic sweep of stale claims, as its own service. The poll path
//! only asks it (never awaits it): at most once per sweep interval the poll carries a
//! read-only stale-lease test (PostgreSQL) or simply asks for a sweep (SQLite, or a machine
//! that is not claiming), and the service runs the sweep statement on its own task. Its
//! failures are logged and counted, never propagated: housekeeping must never fail a poll.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::{Event, Stats};
use crate::queue::Queue;

/// The throttle the poll path consults.
#[derive(Debug)]
struct Throttle {
    every: Duration,
    last: Option<Instant>,
}

/// The poll path's side of the service. Cheap to clone.
#[derive(Clone)]
pub struct Maintenance {
    throttle: Arc<Mutex<Throttle>>,
    ask: mpsc::Sender<()>,
    stats: Arc<Stats>,
}

/// What the service needs to sweep.
pub struct SweepCfg {
    pub queue: Queue,
    pub orchestrator_id: String,
    pub claim_timeout: Duration,
}

impl Maintenance {
    /// Starts the service. It ends when every [`Maintenance`] clone is dropped. `swept`
    /// is told when a sweep released something, so the machine can poll at once.
    pub fn spawn(
        cfg: SweepCfg,
        every: Duration,
        events: broadcast::Sender<Event>,
        stats: Arc<Stats>,
        swept: mpsc::UnboundedSender<()>,
    ) -> (Self, mpsc::UnboundedSender<SweepCfg>) {
        let (ask, mut asks) = mpsc::channel::<()>(1);
        let (cfg_tx, mut cfgs) = mpsc::unbounded_channel::<SweepCfg>();
        let me = Self { throttle: Arc::new(Mutex::new(Throttle { every, last: None })), ask, stats: stats.clone() };
        tokio::spawn(async move {
            let mut cfg = cfg;
            while asks.recv().await.is_some() {
                while let Ok(c) = cfgs.try_recv() {
                    cfg = c;
                }
                stats.sweeps.fetch_add(1, Ordering::Relaxed);
                match cfg.queue.sweep(Some(&cfg.orchestrator_id), cfg.claim_timeout).await {
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
        });
        (me, cfg_tx)
    }

    /// Whether a sweep check is due; if so it counts as taken now (one per interval).
    pub fn take_due(&self) -> bool {
        let Ok(mut t) = self.throttle.lock() else { return false };
        if t.last.is_some_and(|l| l.elapsed() < t.every) {
            return false;
        }
        t.last = Some(Instant::now());
        self.stats.sweep_checks.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Asks for a sweep. A sweep already running or asked for absorbs this one.
    pub fn sweep(&self) {
        let _ = self.ask.try_send(());
    }

    /// The check and the sweep together, for a poll that carries no stale test.
    pub fn tick(&self) {
        if self.take_due() {
            self.sweep();
        }
    }

    pub fn set_every(&self, every: Duration) {
        if let Ok(mut t) = self.throttle.lock() {
            t.every = every;
        }
    }
}
