//! The DevPilot dispatch schema, as sea-orm migrations.
//!
//! # Layout
//! - [`Migrator`]: the ordered list of migrations, applied by `devpilot migrate` and on first
//!   use of the embedded SQLite default.
//! - `m20261129_000001_dispatch`: the queue (`dispatch_queue`), fleet presence (`machines`) and
//!   the per-job history (`job_events`), with the partial indexes that keep the claim and sweep
//!   paths index-only.
//! - `m20261130_000001_claim_order`: the pick's index keyed `(orchestrator_id, created_at,
//!   id)`, so the planner cannot serve the pick from the primary key (profiled in the file).
//! - `m20261201_000001_job_attempts`: `max_attempts` on each job (set at enqueue, read by the
//!   sweep and the fail path) and `machines.problem` (why a machine is not claiming).
//! - `m20261202_000001_job_model`: unique keys, priority, `run_at`, retry backoff, results,
//!   cancel requests and `finished_at` for retention; the pick's index on
//!   `(orchestrator_id, priority DESC, run_at, id)`; NOTIFY that says when a job is due.
//! - `m20261203_000001_agents`: routing columns (`repo`, `requires`, and each machine's
//!   `repos` and `labels`), hand-off columns (`resume_branch`, `resumed_from`, release
//!   requests, a kept `worktree`) and `job_logs`, the tail of each running agent's output.
//! - `m20261204_000001_channels`: each orchestrator's NOTIFY hints on a channel of its own
//!   (`devpilot_channel()`), so a listener wakes only for its orchestrator.
//! - `m20261204_000002_hot_renewals`: no index holds `heartbeat_at`, so a renewal is a HOT
//!   update that touches no index.
//! - `m20261205_000001_caps`: the payload, label, title and prompt caps, in a trigger, so a
//!   plain SQL INSERT meets them too.
//! - `m20261205_000002_presence_order`: each machine run numbers its presence writes, so a
//!   late one never overwrites a later one (a stopped machine stays stopped).
//! - `m20261206_000001_sources`: tracker sources (the intake turn and cursor), each job's
//!   `source_id`, and the `outbox` of what each reportable state change owes the tracker.
//! - `m20261207_000001_github`: each source's `etag` (GitHub's conditional reads), and the
//!   remote a completed job's branch was pushed to (`pushed_remote`), for its pull request.
//! - `m20261208_000001_sessions`: what the agent CLI reported (`agent`, `agent_session`,
//!   cost and tokens, `session_from`), and `job_sessions`, the conversation a hand-off carries.
//! - `m20261209_000001_outbox_history`: each outbox row names the history row that wrote it
//!   (`history_id`), and `orchestrator_keys`, the key that signs what machines leave on a tracker.
//! - `m20261209_000002_session_caps`: a carried session's bundle, path and id capped, in a
//!   trigger, so a plain SQL INSERT meets the caps too.
//! - `m20261210_000001_commits`: the commits a completed job's branch had beyond its start
//!   (`commits`; 0: the agent changed nothing, so no branch and no pull request).
//! - `m20261211_000001_review_loop`: the review loop: watched pull requests, their feedback
//!   (taken once per review, comment and check), and each job's follow-ups
//! - `m20261212_000001_governor`: the governor: accounts held on a usage limit, each
//!   attempt's spend, the fleet's limit switch, and why a park holds a job
//! - `run`: `run_all`, which the migrations use to run a script one statement at a time.
//!
//! Every time column is a BIGINT of milliseconds since the epoch, written from the database's
//! clock (`now()` on PostgreSQL, `julianday('now')` on SQLite). One integer type on both
//! backends keeps the lease arithmetic in the statements identical, and no machine's clock
//! ever enters a lease decision.

pub use sea_orm_migration::prelude::*;

mod m20261129_000001_dispatch;
mod m20261130_000001_claim_order;
mod m20261201_000001_job_attempts;
mod m20261202_000001_job_model;
mod m20261203_000001_agents;
mod m20261204_000001_channels;
mod m20261204_000002_hot_renewals;
mod m20261205_000001_caps;
mod m20261205_000002_presence_order;
mod m20261206_000001_sources;
mod m20261207_000001_github;
mod m20261208_000001_sessions;
mod m20261209_000001_outbox_history;
mod m20261209_000002_session_caps;
mod m20261210_000001_commits;
mod m20261211_000001_review_loop;
mod m20261212_000001_governor;
mod run;

/// Applies the dispatch schema.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261129_000001_dispatch::Migration),
            Box::new(m20261130_000001_claim_order::Migration),
            Box::new(m20261201_000001_job_attempts::Migration),
            Box::new(m20261202_000001_job_model::Migration),
            Box::new(m20261203_000001_agents::Migration),
            Box::new(m20261204_000001_channels::Migration),
            Box::new(m20261204_000002_hot_renewals::Migration),
            Box::new(m20261205_000001_caps::Migration),
            Box::new(m20261205_000002_presence_order::Migration),
            Box::new(m20261206_000001_sources::Migration),
            Box::new(m20261207_000001_github::Migration),
            Box::new(m20261208_000001_sessions::Migration),
            Box::new(m20261209_000001_outbox_history::Migration),
            Box::new(m20261209_000002_session_caps::Migration),
            Box::new(m20261210_000001_commits::Migration),
            Box::new(m20261211_000001_review_loop::Migration),
            Box::new(m20261212_000001_governor::Migration),
        ]
    }
}
