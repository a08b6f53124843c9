//! [`Queue`]: the statements' way to the database, over one sea-orm connection pool.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sea_orm::{DatabaseConnection, DbBackend};

#[cfg(doc)]
use crate::error::Error;

/// The queue, over one sea-orm connection pool (PostgreSQL or SQLite).
#[derive(Clone, Debug)]
pub struct Queue {
    pub(super) db: DatabaseConnection,
    pub(super) backend: DbBackend,
    /// The bound on every call (see [`Queue::with_call_timeout`]).
    pub(super) bound: Duration,
    /// A reconnect is under way in the background (see [`Queue::reconnect_in_background`]).
    pub(super) reconnecting: Arc<AtomicBool>,
    /// Behind a transaction-mode pooler: statements go over the simple protocol (see
    /// [`Queue::pooled`]). Shared by the clones, so what one call learns all of them know.
    pub(super) pooled: Arc<AtomicBool>,
    /// The MAC keys read from this database, by orchestrator (see [`Queue::mac_key`]): kept
    /// with the connection, so a queue on another database never sees them.
    pub(super) mac_keys: super::mac_key_type::Keys,
    /// Round trips this queue and its clones have sent ([`Queue::round_trips`]).
    pub(super) sent: Arc<AtomicU64>,
}

impl Queue {
    pub fn new(db: DatabaseConnection) -> Self {
        let backend = db.get_database_backend();
        Self {
            db,
            backend,
            bound: Duration::from_secs(30),
            reconnecting: Arc::default(),
            pooled: Arc::default(),
            mac_keys: Arc::default(),
            sent: Arc::default(),
        }
    }

    /// How many round trips this queue and its clones have asked for: each statement, and on
    /// SQLite a transaction's BEGIN and COMMIT too. What an idle machine costs the database
    /// (and, on SQLite, the wake-ups of the connection's thread) is counted in these. Not
    /// counted: what the driver adds (sqlx's ping when a connection returns to the pool, a
    /// statement sent again in pooled mode after a pooler's symptom).
    pub fn round_trips(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Counts `n` more round trips ([`Queue::round_trips`]).
    pub(super) fn sending(&self, n: u64) {
        self.sent.fetch_add(n, Ordering::Relaxed);
    }

    /// The same queue in pooled mode (or not): for PostgreSQL behind a transaction-mode pooler
    /// (PgBouncer 1.18, Supabase's or Neon's pooled endpoints), which may give each
    /// transaction another server connection. Nothing is prepared then: each statement goes
    /// over the simple query protocol with its values written inline as escaped literals,
    /// one round trip, as drivers do for such poolers (pgx's simple protocol, libpq's
    /// PQexec). Every statement of this module is one statement on PostgreSQL (history rides
    /// in a CTE), so none needs a transaction across round trips.
    ///
    /// Unprepared is the safe side: through a transaction pooler a prepared statement's Bind
    /// may reach a server where another client prepared a statement of the same name, and run
    /// that. So the CLI's commands and a machine start this way, and a machine prepares only
    /// once its LISTEN has heard its own probe ([`crate::listen::Hint::Direct`]). A queue that
    /// prepares and still meets a pooler's symptom (a prepared statement that already exists,
    /// or has vanished) switches back, and says so in the log. No-op on SQLite.
    pub fn pooled(self, on: bool) -> Self {
        self.set_pooled(on);
        self
    }

    /// Switches this queue and its clones to pooled mode (or back).
    pub fn set_pooled(&self, on: bool) {
        self.pooled.store(on && self.backend == DbBackend::Postgres, Ordering::SeqCst);
    }

    /// Whether statements go unprepared (see [`Queue::pooled`]).
    pub fn is_pooled(&self) -> bool {
        self.pooled.load(Ordering::Relaxed)
    }

    /// The same queue with every call bounded by `bound`: a statement (or a transaction on
    /// SQLite) that has not answered by then fails with [`Error::Timeout`]. A machine sets this
    /// below its heartbeat, so a silent network (no RST, every query just hangs) is noticed
    /// within one heartbeat.
    pub fn with_call_timeout(mut self, bound: Duration) -> Self {
        self.bound = bound;
        self
    }

    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    pub fn backend(&self) -> DbBackend {
        self.backend
    }
}
