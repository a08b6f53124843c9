//! Starting a machine on its database: the one way the tray and `devpilot run` both go.
//! Connect ([`connect`]: wait out a database that is not up yet, with a pool whose calls are
//! bounded below the heartbeat), then [`start_machine`] (LISTEN unless pooled, and the
//! machine's task).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use super::clock::{BootClock, Clock};
use super::config::RunConfig;
use super::handle::Handle;
use super::lease::call_bound;
use super::spawn::spawn_into;
use super::status::{Event, Status};
use devpilot_store::db::{self, DbUrl, PoolSettings};
use devpilot_store::error::{Error, Result};
use devpilot_store::queue::Queue;
use devpilot_store::retry::{self, Budget};

/// The pool of a machine with this heartbeat: `connections` pooled connections (LISTEN
/// takes one more on PostgreSQL), every call bounded below the heartbeat.
pub fn machine_pool(heartbeat: Duration, connections: u32) -> PoolSettings {
    PoolSettings { max_connections: connections.max(1), call_timeout: call_bound(heartbeat), ..PoolSettings::default() }
}

/// Opens `url` for a machine, retrying while the database is only unreachable (a wrong
/// password or a missing database is an answer at once). `before` runs before every try
/// and may end the wait with its error (the tray's restart superseded this start);
/// `failed` hears every failure. The queue starts unprepared ([`Queue::pooled`]) until the
/// machine's LISTEN probe proves no pooler is in between.
pub async fn connect(
    url: &DbUrl,
    pool: &PoolSettings,
    before: impl Fn() -> Result<()>,
    failed: impl Fn(&Error),
) -> Result<Queue> {
    let open = || async {
        before()?;
        let r = db::open(url, pool).await;
        if let Err(e) = &r {
            failed(e);
        }
        r
    };
    Ok(Queue::new(retry::transient("opening the database", Budget::CONNECT, open).await?).pooled(true))
}

/// Where a machine publishes: its status and events (an app's channels outlive restarts),
/// and the clock of its lease deadlines.
pub struct Wiring {
    pub status: watch::Sender<Status>,
    pub events: broadcast::Sender<Event>,
    pub clock: Arc<dyn Clock>,
}

impl Wiring {
    /// Channels of the machine's own, on the boot clock (`devpilot run`).
    pub fn own(cfg: &RunConfig) -> Self {
        let status =
            Status { orchestrator_id: cfg.orchestrator_id.clone(), machine: cfg.machine.clone(), ..Status::default() };
        Self { status: watch::Sender::new(status), events: broadcast::channel(1024).0, clock: Arc::new(BootClock) }
    }
}

/// Starts LISTEN on `url` (unless it is pooled: through a transaction pooler it would hear
/// nothing) and the machine `cfg` describes on `queue`.
pub fn start_machine(
    queue: Queue,
    url: &DbUrl,
    cfg: RunConfig,
    wiring: Wiring,
) -> (Handle, tokio::task::JoinHandle<()>) {
    crate::redact::known().learn_all(url.password());
    let hints = if url.pooled() { None } else { devpilot_store::listen::spawn(url, &cfg.orchestrator_id, &queue) };
    spawn_into(queue, cfg, hints, wiring.status, wiring.events, wiring.clock)
}
