//! The dispatch queue, machine presence and job history.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261129_000001_dispatch"
    }
}

/// Backend-neutral DDL. `{ID}`, `{JSON}`, `{BOOL}`, `{TRUE}` and `{NOW_MS}` are filled in per
/// backend, so both schemas are visibly the same schema.
const UP: &str = r#"
CREATE TABLE dispatch_queue (
    id              {ID},
    orchestrator_id TEXT    NOT NULL,
    payload         {JSON}  NOT NULL,
    -- A short human label (the payload's title or identifier) for the tray and the window.
    title           TEXT,
    -- queued -> running -> completed; running -> failed (retry) -> running ...; -> dead; queued -> cancelled
    state           TEXT    NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued','running','failed','completed','dead','cancelled')),
    created_at      BIGINT  NOT NULL DEFAULT {NOW_MS},
    claimed_at      BIGINT,
    -- The machine holding the claim while running; afterwards, the last holder.
    claimed_by      TEXT,
    -- Fencing token: incremented by every claim. Every write after a claim names it.
    claim_token     BIGINT  NOT NULL DEFAULT 0,
    heartbeat_at    BIGINT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    completed_at    BIGINT,
    failed_at       BIGINT,
    dead_at         BIGINT,
    last_error      TEXT
);

-- The claim path: claimable rows of one orchestrator, oldest first. Partial, so finished
-- history never bloats it.
CREATE INDEX dispatch_queue_claimable ON dispatch_queue (orchestrator_id, id)
    WHERE claimed_at IS NULL AND state IN ('queued','failed');

-- The sweep path: running rows by last sign of life.
CREATE INDEX dispatch_queue_running ON dispatch_queue (heartbeat_at) WHERE state = 'running';

-- Status and hand-off: who holds what.
CREATE INDEX dispatch_queue_holder ON dispatch_queue (orchestrator_id, claimed_by) WHERE state = 'running';

-- Status counts by state.
CREATE INDEX dispatch_queue_state ON dispatch_queue (orchestrator_id, state);

CREATE TABLE machines (
    orchestrator_id  TEXT    NOT NULL,
    machine          TEXT    NOT NULL,
    last_seen_at     BIGINT  NOT NULL,
    -- online | paused | off | handing_off | stopped
    status           TEXT    NOT NULL DEFAULT 'online',
    dispatch_enabled {BOOL}  NOT NULL DEFAULT {TRUE},
    paused_until     BIGINT,
    running          INTEGER NOT NULL DEFAULT 0,
    concurrency      INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (orchestrator_id, machine)
);

CREATE TABLE job_events (
    id              {ID},
    job_id          BIGINT  NOT NULL,
    orchestrator_id TEXT    NOT NULL,
    at              BIGINT  NOT NULL DEFAULT {NOW_MS},
    -- enqueued | claimed | completed | failed | dead | swept | handed_off | lease_lost
    -- | completion_rejected | requeued | cancelled
    kind            TEXT    NOT NULL,
    machine         TEXT,
    claim_token     BIGINT,
    detail          TEXT
);
CREATE INDEX job_events_job ON job_events (job_id, id);
"#;

/// PostgreSQL only: a hint to LISTENing orchestrators whenever a row becomes claimable. The
/// payload is the orchestrator id, so identical hints within one transaction collapse into one.
const PG_NOTIFY: &str = r#"
CREATE FUNCTION devpilot_notify_claimable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('devpilot_dispatch', NEW.orchestrator_id);
    RETURN NULL;
END $$;

CREATE TRIGGER dispatch_queue_claimable_notify
    AFTER INSERT OR UPDATE OF state ON dispatch_queue
    FOR EACH ROW WHEN (NEW.state IN ('queued','failed'))
    EXECUTE FUNCTION devpilot_notify_claimable();
"#;

const DOWN: &str = r#"
DROP TABLE IF EXISTS job_events;
DROP TABLE IF EXISTS machines;
DROP TABLE IF EXISTS dispatch_queue;
"#;

fn render(backend: DbBackend, sql: &str) -> String {
    let (id, json, boolean, truth, now) = match backend {
        DbBackend::Postgres => {
            ("BIGSERIAL PRIMARY KEY", "JSONB", "BOOLEAN", "TRUE", "((extract(epoch from now()) * 1000)::bigint)")
        }
        _ => (
            "INTEGER PRIMARY KEY AUTOINCREMENT",
            "TEXT",
            "INTEGER",
            "1",
            "(CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))",
        ),
    };
    sql.replace("{ID}", id)
        .replace("{JSON}", json)
        .replace("{BOOL}", boolean)
        .replace("{TRUE}", truth)
        .replace("{NOW_MS}", now)
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        let db = manager.get_connection();
        db.execute_unprepared(&render(backend, UP)).await?;
        if backend == DbBackend::Postgres {
            db.execute_unprepared(PG_NOTIFY).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        let db = manager.get_connection();
        if backend == DbBackend::Postgres {
            db.execute_unprepared("DROP FUNCTION IF EXISTS devpilot_notify_claimable() CASCADE").await?;
        }
        db.execute_unprepared(DOWN).await?;
        Ok(())
    }
}
