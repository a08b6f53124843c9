//! Real agents: routing by repo and label, hand-offs that carry work in progress, and the
//! agent's log visible from any machine.
//!
//! - `repo` and `requires` (a JSON array of labels) are copied from the payload at enqueue,
//!   so the pick can test them in its WHERE: a machine picks only jobs of repos it has, and
//!   only jobs whose labels it has. NULL means "any machine".
//! - `resume_branch` / `resumed_from`: the branch a hand-off pushed the work in progress to,
//!   and the machine it came from, written in the same fenced statement as the release. The
//!   next claimer checks the branch out instead of starting from the base.
//! - `release_requested_at` / `release_requested_by`: `devpilot release --machine M` run
//!   elsewhere asks the holder to hand off (it learns it at its next renewal, or at once
//!   through NOTIFY `orch release`), so the job is never claimable before its work is pushed.
//! - `worktree`: where a kept worktree is (`machine:path`), when cleanup left it in place.
//! - `machines.repos` / `machines.labels`: what each machine can take, so `status` can say
//!   which queued jobs no online machine can run, and why.
//! - A producer's plain SQL INSERT (the README's) names no routing columns: a trigger fills
//!   them from the payload, as `devpilot enqueue` does, and existing rows are backfilled.
//!   Only a string `repo` and a non-empty array `requires` count.
//! - `job_logs`: the last 16 KiB of a running job's agent output, one row per job, written
//!   by its holder with the heartbeat and fenced by claim token. A table of its own keeps
//!   the queue's rows (and the pick's index pages) from churning with log text.

use sea_orm_migration::prelude::*;

use crate::run::run_all;
use sea_orm_migration::sea_orm::DbBackend;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261203_000001_agents"
    }
}

const UP: &str = "
ALTER TABLE dispatch_queue ADD COLUMN repo TEXT;
ALTER TABLE dispatch_queue ADD COLUMN requires TEXT;
ALTER TABLE dispatch_queue ADD COLUMN resume_branch TEXT;
ALTER TABLE dispatch_queue ADD COLUMN resumed_from TEXT;
ALTER TABLE dispatch_queue ADD COLUMN release_requested_at BIGINT;
ALTER TABLE dispatch_queue ADD COLUMN release_requested_by TEXT;
ALTER TABLE dispatch_queue ADD COLUMN worktree TEXT;
ALTER TABLE machines ADD COLUMN repos TEXT;
ALTER TABLE machines ADD COLUMN labels TEXT;
CREATE TABLE job_logs (
    job_id BIGINT PRIMARY KEY,
    orchestrator_id TEXT NOT NULL,
    claim_token BIGINT NOT NULL,
    machine TEXT NOT NULL,
    tail TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);
";

const DOWN: &str = "
DROP TABLE job_logs;
ALTER TABLE machines DROP COLUMN labels;
ALTER TABLE machines DROP COLUMN repos;
ALTER TABLE dispatch_queue DROP COLUMN worktree;
ALTER TABLE dispatch_queue DROP COLUMN release_requested_by;
ALTER TABLE dispatch_queue DROP COLUMN release_requested_at;
ALTER TABLE dispatch_queue DROP COLUMN resumed_from;
ALTER TABLE dispatch_queue DROP COLUMN resume_branch;
ALTER TABLE dispatch_queue DROP COLUMN requires;
ALTER TABLE dispatch_queue DROP COLUMN repo;
";

/// The routing columns from the payload, for inserts that do not set them.
const PG_ROUTE: &str = r#"
CREATE FUNCTION devpilot_route_columns() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.repo IS NULL AND jsonb_typeof(NEW.payload->'repo') = 'string' THEN
        NEW.repo := NEW.payload->>'repo';
    END IF;
    IF NEW.requires IS NULL AND jsonb_typeof(NEW.payload->'requires') = 'array'
       AND jsonb_array_length(NEW.payload->'requires') > 0 THEN
        NEW.requires := (NEW.payload->'requires')::text;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER dispatch_queue_route_columns BEFORE INSERT ON dispatch_queue
    FOR EACH ROW WHEN (NEW.payload ? 'repo' OR NEW.payload ? 'requires')
    EXECUTE FUNCTION devpilot_route_columns();

UPDATE dispatch_queue SET repo = payload->>'repo' WHERE jsonb_typeof(payload->'repo') = 'string';
UPDATE dispatch_queue SET requires = (payload->'requires')::text
 WHERE jsonb_typeof(payload->'requires') = 'array' AND jsonb_array_length(payload->'requires') > 0;
"#;

const SQLITE_ROUTE_SET: &str = "repo = COALESCE(repo, CASE WHEN json_type(payload, '$.repo') = 'text'
                                      THEN json_extract(payload, '$.repo') END),
        requires = COALESCE(requires, CASE WHEN json_type(payload, '$.requires') = 'array'
                                           AND json_array_length(payload, '$.requires') > 0
                                      THEN json_extract(payload, '$.requires') END)";

/// A release asked of a running job's holder wakes it through LISTEN.
const PG_NOTIFY: &str = r#"
CREATE FUNCTION devpilot_notify_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('devpilot_dispatch', NEW.orchestrator_id || ' release');
    RETURN NULL;
END $$;

CREATE TRIGGER dispatch_queue_release_notify
    AFTER UPDATE OF release_requested_at ON dispatch_queue
    FOR EACH ROW WHEN (NEW.state = 'running' AND NEW.release_requested_at IS NOT NULL
                       AND OLD.release_requested_at IS NULL)
    EXECUTE FUNCTION devpilot_notify_release();
"#;

const PG_NOTIFY_DOWN: &str = "
DROP TRIGGER dispatch_queue_release_notify ON dispatch_queue;
DROP FUNCTION devpilot_notify_release();
DROP TRIGGER dispatch_queue_route_columns ON dispatch_queue;
DROP FUNCTION devpilot_route_columns();
";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        run_all(db, UP).await?;
        if manager.get_database_backend() == DbBackend::Postgres {
            db.execute_unprepared(PG_NOTIFY).await?;
            db.execute_unprepared(PG_ROUTE).await?;
        } else {
            db.execute_unprepared(&format!(
                "CREATE TRIGGER dispatch_queue_route_columns AFTER INSERT ON dispatch_queue
                     FOR EACH ROW WHEN (NEW.repo IS NULL OR NEW.requires IS NULL)
                                   AND json_valid(NEW.payload)
                                   AND (json_type(NEW.payload, '$.repo') IS NOT NULL
                                        OR json_type(NEW.payload, '$.requires') IS NOT NULL)
                 BEGIN
                     UPDATE dispatch_queue SET {SQLITE_ROUTE_SET} WHERE id = NEW.id;
                 END"
            ))
            .await?;
            db.execute_unprepared(&format!("UPDATE dispatch_queue SET {SQLITE_ROUTE_SET} WHERE json_valid(payload)"))
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        if manager.get_database_backend() == DbBackend::Postgres {
            db.execute_unprepared(PG_NOTIFY_DOWN).await?;
        } else {
            db.execute_unprepared("DROP TRIGGER dispatch_queue_route_columns").await?;
        }
        run_all(db, DOWN).await
    }
}
