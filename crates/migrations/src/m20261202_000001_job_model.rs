//! The job model of a real queue: unique keys, priority, scheduled starts, retry backoff,
//! results, cancelling running jobs, and retention.
//!
//! - `unique_key`: at most one *live* job (queued, waiting to retry, or running) per key and
//!   orchestrator, enforced by the partial unique index `dispatch_queue_live_key`, so a
//!   producer's `INSERT … ON CONFLICT DO NOTHING` dedupes without reading first.
//! - `priority` (higher first) and `run_at` (the database time from which the job may be
//!   claimed). The pick orders by `(priority DESC, run_at, id)`: `run_at` is when the job
//!   became claimable (enqueue, a scheduled start, or the end of a retry backoff), so FIFO
//!   within a priority is kept. `dispatch_queue_pick` is rebuilt on those keys.
//! - `retry_backoff_ms` / `retry_backoff_max_ms`: the job's own backoff; NULL means "the
//!   runner's setting".
//! - `summary` / `result_url`: what the agent said it did (its result file).
//! - `cancel_requested_at` / `cancel_requested_by`: a cancel of a running job, seen by its
//!   holder at its next renewal (or at once through NOTIFY).
//! - `finished_at`: when the job became completed, dead or cancelled; retention deletes by
//!   it, through the partial index `dispatch_queue_finished`.
//!
//! An old cancelled job has no timestamp of its cancel: its `finished_at` is its last
//! history entry, so retention does not take a job cancelled yesterday for an old one.
//!
//! SQLite cannot add a column whose default is an expression, so `run_at` defaults to 0 there
//! and a trigger stamps a plain INSERT's `run_at` with its `created_at`; PostgreSQL takes the
//! database clock as the column default. Either way a producer's plain INSERT is claimable at
//! once and keeps its place in line.
//!
//! The NOTIFY trigger now tells listeners *when* a job is claimable: `orch` means now,
//! `orch due MS` in MS milliseconds (so a listener sets its timer instead of polling for
//! nothing), and `orch cancel` that a running job's cancel was asked for.

use sea_orm_migration::prelude::*;

use crate::run::run_all;
use sea_orm_migration::sea_orm::DbBackend;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261202_000001_job_model"
    }
}

const PG_NOW: &str = "((extract(epoch from now()) * 1000)::bigint)";

const COLUMNS: &str = "
ALTER TABLE dispatch_queue ADD COLUMN unique_key TEXT;
ALTER TABLE dispatch_queue ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dispatch_queue ADD COLUMN run_at BIGINT NOT NULL DEFAULT {RUN_AT_DEFAULT};
ALTER TABLE dispatch_queue ADD COLUMN retry_backoff_ms BIGINT;
ALTER TABLE dispatch_queue ADD COLUMN retry_backoff_max_ms BIGINT;
ALTER TABLE dispatch_queue ADD COLUMN summary TEXT;
ALTER TABLE dispatch_queue ADD COLUMN result_url TEXT;
ALTER TABLE dispatch_queue ADD COLUMN cancel_requested_at BIGINT;
ALTER TABLE dispatch_queue ADD COLUMN cancel_requested_by TEXT;
ALTER TABLE dispatch_queue ADD COLUMN finished_at BIGINT;
UPDATE dispatch_queue SET run_at = created_at;
UPDATE dispatch_queue SET finished_at = COALESCE(completed_at, dead_at,
        (SELECT MAX(e.at) FROM job_events e WHERE e.job_id = dispatch_queue.id), created_at)
 WHERE state IN ('completed','dead','cancelled');
DROP INDEX dispatch_queue_pick;
CREATE INDEX dispatch_queue_pick ON dispatch_queue (orchestrator_id, priority DESC, run_at, id)
    WHERE claimed_at IS NULL AND state IN ('queued','failed');
CREATE UNIQUE INDEX dispatch_queue_live_key ON dispatch_queue (orchestrator_id, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('queued','failed','running');
CREATE INDEX dispatch_queue_finished ON dispatch_queue (finished_at)
    WHERE state IN ('completed','dead','cancelled');
CREATE INDEX machines_last_seen ON machines (last_seen_at);
";

/// SQLite: a plain INSERT that names no `run_at` is claimable from its `created_at`.
const SQLITE_RUN_AT: &str = "
CREATE TRIGGER dispatch_queue_run_at AFTER INSERT ON dispatch_queue
    FOR EACH ROW WHEN NEW.run_at = 0
BEGIN
    UPDATE dispatch_queue SET run_at = NEW.created_at WHERE id = NEW.id;
END;
";

const PG_NOTIFY: &str = r#"
CREATE OR REPLACE FUNCTION devpilot_notify_claimable() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wait_ms BIGINT := NEW.run_at - {NOW};
BEGIN
    IF wait_ms > 0 THEN
        PERFORM pg_notify('devpilot_dispatch', NEW.orchestrator_id || ' due ' || wait_ms);
    ELSE
        PERFORM pg_notify('devpilot_dispatch', NEW.orchestrator_id);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER dispatch_queue_claimable_notify ON dispatch_queue;
CREATE TRIGGER dispatch_queue_claimable_notify
    AFTER INSERT OR UPDATE OF state, run_at ON dispatch_queue
    FOR EACH ROW WHEN (NEW.state IN ('queued','failed') AND NEW.claimed_at IS NULL)
    EXECUTE FUNCTION devpilot_notify_claimable();

CREATE FUNCTION devpilot_notify_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('devpilot_dispatch', NEW.orchestrator_id || ' cancel');
    RETURN NULL;
END $$;

CREATE TRIGGER dispatch_queue_cancel_notify
    AFTER UPDATE OF cancel_requested_at ON dispatch_queue
    FOR EACH ROW WHEN (NEW.state = 'running' AND NEW.cancel_requested_at IS NOT NULL
                       AND OLD.cancel_requested_at IS NULL)
    EXECUTE FUNCTION devpilot_notify_cancel();
"#;

const PG_NOTIFY_DOWN: &str = r#"
DROP TRIGGER dispatch_queue_cancel_notify ON dispatch_queue;
DROP FUNCTION devpilot_notify_cancel();
CREATE OR REPLACE FUNCTION devpilot_notify_claimable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('devpilot_dispatch', NEW.orchestrator_id);
    RETURN NULL;
END $$;
DROP TRIGGER dispatch_queue_claimable_notify ON dispatch_queue;
CREATE TRIGGER dispatch_queue_claimable_notify
    AFTER INSERT OR UPDATE OF state ON dispatch_queue
    FOR EACH ROW WHEN (NEW.state IN ('queued','failed'))
    EXECUTE FUNCTION devpilot_notify_claimable();
"#;

const DOWN: &str = "
DROP INDEX machines_last_seen;
DROP INDEX dispatch_queue_finished;
DROP INDEX dispatch_queue_live_key;
DROP INDEX dispatch_queue_pick;
CREATE INDEX dispatch_queue_pick ON dispatch_queue (orchestrator_id, created_at, id)
    WHERE claimed_at IS NULL AND state IN ('queued','failed');
ALTER TABLE dispatch_queue DROP COLUMN finished_at;
ALTER TABLE dispatch_queue DROP COLUMN cancel_requested_by;
ALTER TABLE dispatch_queue DROP COLUMN cancel_requested_at;
ALTER TABLE dispatch_queue DROP COLUMN result_url;
ALTER TABLE dispatch_queue DROP COLUMN summary;
ALTER TABLE dispatch_queue DROP COLUMN retry_backoff_max_ms;
ALTER TABLE dispatch_queue DROP COLUMN retry_backoff_ms;
ALTER TABLE dispatch_queue DROP COLUMN run_at;
ALTER TABLE dispatch_queue DROP COLUMN priority;
ALTER TABLE dispatch_queue DROP COLUMN unique_key;
";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// On SQLite too: the columns, the index swap and the trigger land together or not at
    /// all, on one connection (a pool's statements could otherwise go to different ones).
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        let db = manager.get_connection();
        if backend == DbBackend::Postgres {
            run_all(db, &COLUMNS.replace("{RUN_AT_DEFAULT}", PG_NOW)).await?;
            db.execute_unprepared(&PG_NOTIFY.replace("{NOW}", PG_NOW)).await?;
        } else {
            run_all(db, &COLUMNS.replace("{RUN_AT_DEFAULT}", "0")).await?;
            db.execute_unprepared(SQLITE_RUN_AT).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        let db = manager.get_connection();
        if backend == DbBackend::Postgres {
            db.execute_unprepared(PG_NOTIFY_DOWN).await?;
        } else {
            db.execute_unprepared("DROP TRIGGER dispatch_queue_run_at").await?;
        }
        run_all(db, DOWN).await
    }
}
