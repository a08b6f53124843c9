//! Trackers in, results back: `sources` (one row per orchestrator and configured tracker
//! source, holding the intake turn and the cursor) and `outbox` (what each reportable state
//! change owes the tracker, written in the same statement or transaction as the change).
//!
//! - `sources.turn` numbers intake turns. A machine takes a turn with one conditional UPDATE
//!   (`polled_at` older than `interval_ms`, and no rate-limit hold), and every write the turn
//!   makes after that (the cursor, the last error) is fenced by the turn it took.
//! - `sources.filter` is the configured filter as text; registering a different one resets
//!   the cursor, so a widened filter sees the issues it now matches.
//! - `dispatch_queue.source_id` names the source a job came from. A job with one writes an
//!   outbox row with each reportable history event; one without writes nothing.
//! - `outbox` rows are delivered oldest first per job, each claimed with a conditional UPDATE
//!   that bumps `token`; the finish is fenced by it. `done_at` is set when the row was
//!   delivered or given up on (`outcome` says which, `last_error` why).

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

use crate::run::run_all;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261206_000001_sources"
    }
}

/// The tables, with `{id}` the backend's auto-increment key.
const UP: &str = "
CREATE TABLE sources (
    id {id},
    orchestrator_id TEXT NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    filter TEXT NOT NULL,
    interval_ms BIGINT NOT NULL,
    cursor TEXT,
    turn BIGINT NOT NULL DEFAULT 0,
    polled_at BIGINT,
    polled_by TEXT,
    hold_until BIGINT,
    last_ok_at BIGINT,
    last_error TEXT,
    last_error_at BIGINT,
    rate_remaining BIGINT,
    rate_reset_at BIGINT,
    created_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX sources_name ON sources (orchestrator_id, name);
CREATE TABLE outbox (
    id {id},
    orchestrator_id TEXT NOT NULL,
    job_id BIGINT NOT NULL REFERENCES dispatch_queue (id) ON DELETE CASCADE,
    source_id BIGINT NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    event TEXT NOT NULL,
    machine TEXT,
    claim_token BIGINT,
    detail TEXT,
    created_at BIGINT NOT NULL,
    next_at BIGINT NOT NULL,
    tries INTEGER NOT NULL DEFAULT 0,
    token BIGINT NOT NULL DEFAULT 0,
    claimed_by TEXT,
    claimed_at BIGINT,
    done_at BIGINT,
    outcome TEXT,
    last_error TEXT
);
CREATE INDEX outbox_pending ON outbox (orchestrator_id, id) WHERE done_at IS NULL;
CREATE INDEX outbox_job ON outbox (job_id, id);
ALTER TABLE dispatch_queue ADD COLUMN source_id BIGINT;
CREATE INDEX dispatch_queue_key ON dispatch_queue (orchestrator_id, unique_key) WHERE unique_key IS NOT NULL;
";

const DOWN: &str = "
DROP INDEX dispatch_queue_key;
ALTER TABLE dispatch_queue DROP COLUMN source_id;
DROP TABLE outbox;
DROP TABLE sources;
";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let id = match manager.get_database_backend() {
            DbBackend::Postgres => "BIGSERIAL PRIMARY KEY",
            _ => "INTEGER PRIMARY KEY AUTOINCREMENT",
        };
        run_all(manager.get_connection(), &UP.replace("{id}", id)).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager.get_connection(), DOWN).await
    }
}
