//! Every statement that touches the queue tables lives here, and only here.
//!
//! "Where is the claim?" [`Queue::claim_by_id`] (the article's conditional UPDATE) and
//! [`Queue::claim_next`] (the herd-free pick-and-claim the orchestrator uses).
//!
//! Rules every statement in this module keeps:
//! - One statement per decision. The precondition lives in the WHERE clause and a zero-row
//!   result means "lost the race" or "you no longer own this"; neither is an error.
//! - A state change and its history row commit together: one statement on PostgreSQL (a
//!   data-modifying CTE), one short transaction on SQLite (no network round trip inside it).
//!   See [`Queue::change`].
//! - No transaction is held open across a round trip to the application.
//! - Every lease time comes from the database clock (`{NOW}`), never from this machine.
//! - Every write after a claim names the job's `claim_token` (the fencing token), which every
//!   claim increments, so a machine that slept through losing its lease cannot write.
//! - State predicates come from [`JobState`]'s sets (`{CLAIMABLE}`, `{RUNNING}`), never
//!   spelled out by hand.
//! - Every call is bounded ([`Queue::with_call_timeout`]): no answer in time is
//!   [`Error::Timeout`], never a hang.
//!
//! # Layout
//! - `mod.rs`: the [`Queue`] itself (its pool, call bound and pooled mode) and the re-exports.
//! - `dialect.rs`: the SQL dialect (`$n`, `{NOW}`, the state sets, `{SKIP_LOCKED}`) and its
//!   substitution per backend; the SQL fragments the state changes share (backoff, cancel).
//! - `call.rs`: how every statement is sent: bounded, prepared or inlined (pooled mode),
//!   never with a NUL; [`Queue::change`], a state change with its history; clock and NOTIFY.
//! - `history.rs`: a job's history: the row a state change writes with itself, notes, reads.
//! - `route.rs`: [`Route`], what a machine may pick, and why no machine can take a job.
//! - `rows.rs`: what the statements return (claims, job rows, events, machines, counts,
//!   outcomes) and the decoders of their rows.
//! - `options.rs`: what callers hand in: job options, backoff, retry-after, retention, and the
//!   checks of keys and orchestrator ids.
//! - `enqueue.rs`: adding jobs, deduped by key (the producer's INSERT).
//! - `claim.rs`: the claims: by id, the herd-free pick-and-claim, a poll with its
//!   housekeeping, and when the next waiting job is due.
//! - `fenced.rs`: a holder's writes, fenced by claim token: renew, complete, fail, park,
//!   release, and what it records on the job (result, worktree, log tail).
//! - `admin.rs`: what a user does from anywhere: release a machine's claims, requeue, cancel.
//! - `maintenance.rs`: the sweep of expired leases, and the pruning of finished work.
//! - `presence.rs`: machines' presence rows.
//! - `reads.rs`: listings and counts, for status and the UI.

mod admin;
mod call;
mod claim;
mod dialect;
mod enqueue;
mod fenced;
mod history;
mod maintenance;
mod options;
mod presence;
mod reads;
mod route;
mod rows;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sea_orm::{DatabaseConnection, DbBackend};

pub use claim::{claim_next_sql, claim_next_sql_postgres};
pub use options::{
    title_of, validate_key, validate_orchestrator, Backoff, JobOptions, Retention, RetryAfter, Start, MAX_KEY_LEN,
};
pub use presence::{PollExtras, Presence};
pub use route::{unroutable, Route};
pub use rows::{
    CancelOutcome, Claim, Counts, Enqueued, FailOutcome, JobEvent, JobRow, LogTail, MachineRow, OpenWork, Polled,
    Pruned, Renewed, Swept,
};

// Only for the links of the docs above and below.
#[cfg(doc)]
use crate::{error::Error, job::JobState};

/// The queue, over one sea-orm connection pool (PostgreSQL or SQLite).
#[derive(Clone, Debug)]
pub struct Queue {
    db: DatabaseConnection,
    backend: DbBackend,
    /// The bound on every call (see [`Queue::with_call_timeout`]).
    bound: Duration,
    /// A reconnect is under way in the background (see [`Queue::reconnect_in_background`]).
    reconnecting: Arc<AtomicBool>,
    /// Behind a transaction-mode pooler: statements go over the simple protocol (see
    /// [`Queue::pooled`]). Shared by the clones, so what one call learns all of them know.
    pooled: Arc<AtomicBool>,
}

impl Queue {
    pub fn new(db: DatabaseConnection) -> Self {
        let backend = db.get_database_backend();
        Self { db, backend, bound: Duration::from_secs(30), reconnecting: Arc::default(), pooled: Arc::default() }
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
