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
//! - Every lease time comes from the database clock (the dialect's `now`), never from this
//!   machine.
//! - Every write after a claim names its [`Fence`]: the job and its `claim_token` (the fencing
//!   token), which every claim increments, so a machine that slept through losing its lease
//!   cannot write.
//! - State predicates come from [`JobState`]'s sets (the dialect's `claimable`, `running`, …),
//!   never spelled out by hand.
//! - Every call is bounded ([`Queue::with_call_timeout`]): no answer in time is
//!   [`Error::Timeout`], never a hang.
//!
//! # How a statement is written
//! Each backend has one `Dialect` (`dialect.rs`): its clock expression (`now`), its
//! `skip_locked` clause, `run_at` as ISO text, the table of a job's required labels, the
//! state predicates of [`JobState`]'s sets, and how it writes parameter n (`$n` on
//! PostgreSQL, `?n` on SQLite). A statement whose text depends on the backend only is a
//! `Sql`: a render function over the dialect, written with `format!` and named arguments
//! (`now = d.now`) and `$n` parameters, rendered once per backend at first use (SQLite's
//! `?n` written then) and handed out as `&'static str` by `Queue::sql`. A statement whose
//! text depends on the call (a route's names, a list of fences or ids, a multi-row insert,
//! the poll's optional presence CTE, the history CTE of [`Queue::change`]) is built per call
//! with `format!` from the dialect's fields (parameters by `Dialect::p`) and those
//! pre-rendered parts. No text is substituted into afterwards: what `query`, `exec` and
//! `change` receive is already in the backend's dialect, and pooled mode writes the values
//! into PostgreSQL's text as it is.
//!
//! # Layout
//! - `mod.rs`: the re-exports.
//! - `pool.rs`: the [`Queue`] itself (its pool, call bound and pooled mode).
//! - `dialect.rs`: the SQL dialect of each backend (parameters, clock, state sets, SKIP
//!   LOCKED), the statements rendered once per backend (`Sql`), and the SQL fragments the
//!   state changes share (backoff, cancel).
//! - `call.rs`: how every statement is sent: bounded, prepared or inlined (pooled mode),
//!   never with a NUL; [`Queue::change`], a state change with its history; clock and NOTIFY.
//! - `history.rs`: a job's history: the row a state change writes with itself, notes, reads.
//! - `route.rs`: [`Route`], what a machine may pick, and why no machine can take a job.
//! - `rows.rs`: what the statements return (claims, job rows, events, machines, counts,
//!   outcomes), decoded by `FromQueryResult`.
//! - `fence.rs`: [`Fence`], a claim (job and claim token), and lists of fences as SQL.
//! - `options.rs`: what callers hand in: job options, backoff, retry-after, retention, and the
//!   checks of keys and orchestrator ids.
//! - `enqueue.rs`: adding jobs, deduped by key (the producer's INSERT).
//! - `claim.rs`: the claims: by id, the herd-free pick-and-claim, a poll with its
//!   housekeeping and the completions it carries, and when the next waiting job is due.
//! - `fenced.rs`: a holder's writes, fenced by [`Fence`]: renew, complete, fail, park,
//!   release, and what it records on the job (result, worktree, log tail).
//! - `machine.rs`: [`MachineStore`], the queue bound to one orchestrator and one machine:
//!   the engine's hot path names only the job.
//! - `admin.rs`: what a user does from anywhere: release a machine's claims, requeue, cancel.
//! - `maintenance.rs`: the sweep of expired leases, and the pruning of finished work.
//! - `presence.rs`: machines' presence rows and their [`MachineStatus`].
//! - `reads.rs`: listings and counts, for status and the UI.
//! - `governor.rs`: the governor of usage limits and spend: an account held fleet-wide
//!   (written with the park of the job that hit it), each attempt's spend, the fleet's limit
//!   switch, and the claim's part ([`Governor`]).
//! - `review.rs`: the review loop: watched pull requests, their feedback kept once per piece,
//!   and the conditional UPDATE that reopens a completed job as a follow-up.
//! - `session.rs`: what an agent CLI reported (preset, session, cost, tokens), and the
//!   conversation a hand-off carries (`job_sessions`), saved fenced and read by the next claimer.
//! - `sources.rs`: tracker sources: registering them, the intake turn and its fenced end,
//!   and a source's jobs by key (updated while they wait).
//! - `mac_key_type.rs`: the key's type, which never prints itself, and the queue's cache.
//! - `mac_key.rs`: each orchestrator's MAC key ([`MacKey`]), made once and shared, that signs
//!   what machines leave on a tracker.
//! - `outbox.rs`: delivering the outbox rows [`Queue::change`] writes: taken with a
//!   conditional UPDATE, finished fenced by the row's token, oldest first per job.

mod admin;
mod call;
mod claim;
mod dialect;
mod enqueue;
mod fence;
mod fenced;
mod governor;
mod history;
mod mac_key;
mod mac_key_type;
mod machine;
mod maintenance;
mod options;
mod outbox;
mod pool;
mod presence;
mod reads;
mod review;
mod route;
mod rows;
mod session;
mod sources;

pub use claim::claim_next_sql_postgres;
pub use fence::Fence;
pub use governor::{AccountSpend, GovernedPark, Governor, GovernorView, HoldRow, ParkedFor, SpendRow};
pub use mac_key_type::MacKey;
pub use machine::MachineStore;
pub use options::{
    title_of, validate_key, validate_orchestrator, Backoff, JobOptions, Retention, RetryAfter, Start, MAX_KEY_LEN,
};
pub use outbox::{Delivery, DeliveryEnd, OutboxRow};
pub use pool::Queue;
pub use presence::{unroutable, MachineRow, MachineStatus, PollExtras, Presence, PresenceOrder};
pub use reads::JobFilter;
pub use review::{FeedbackRow, FollowUp, LoopRules, NewFeedback, WatchRead, WatchRow, WatchState, FEEDBACK_BODY_CAP};
pub use route::{Names, Route};
pub use rows::{
    AgentRun, CancelOutcome, Claim, Counts, Enqueued, FailOutcome, JobEvent, JobRow, LogTail, OpenWork, Polled, Pruned,
    Renewed, Swept,
};
pub use session::{NewSession, SavedSession, Usage, SESSION_BUNDLE_CAP, SESSION_CWD_CAP};
pub use sources::{Holds, KeyedJob, SourceRow, SourceSpec, Turn, TurnEnd, TurnTry};

// Only for the links of the docs above and below.
#[cfg(doc)]
use crate::{error::Error, job::JobState};
