//! One NOTIFY channel per orchestrator. The hints used to go to one channel,
//! `devpilot_dispatch`, that every listener of the database heard; each machine then threw
//! away the other orchestrators' hints. Now each goes to `devpilot_dispatch_<md5 of the
//! orchestrator id>` (md5 only keeps the name under PostgreSQL's 63 bytes), so only that
//! orchestrator's machines wake for it: `bench/REPORT.md` measures a hint at 300 listeners
//! on 30 orchestrators both ways.
//!
//! The payloads are unchanged. A machine of this version LISTENs on both channels, so it is
//! woken by a database migrated or not; a machine of an older version, on a migrated
//! database, hears nothing and finds its work by polling, as it would without LISTEN.
//! SQLite has no NOTIFY: nothing to do there.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000001_channels"
    }
}

const PG_NOW: &str = "((extract(epoch from now()) * 1000)::bigint)";

/// The three notifying functions, on `{CHANNEL}` (an SQL expression).
const FUNCTIONS: &str = r#"
CREATE OR REPLACE FUNCTION devpilot_notify_claimable() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wait_ms BIGINT := NEW.run_at - {NOW};
BEGIN
    IF wait_ms > 0 THEN
        PERFORM pg_notify({CHANNEL}, NEW.orchestrator_id || ' due ' || wait_ms);
    ELSE
        PERFORM pg_notify({CHANNEL}, NEW.orchestrator_id);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION devpilot_notify_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({CHANNEL}, NEW.orchestrator_id || ' cancel');
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION devpilot_notify_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({CHANNEL}, NEW.orchestrator_id || ' release');
    RETURN NULL;
END $$;
"#;

/// The channel's name, in one place for the triggers (and `devpilot::listen::channel_of`).
const CHANNEL_FN: &str = "
CREATE FUNCTION devpilot_channel(orchestrator_id TEXT) RETURNS TEXT
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 'devpilot_dispatch_' || md5(orchestrator_id) $$;
";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let db = manager.get_connection();
        db.execute_unprepared(CHANNEL_FN).await?;
        let sql = FUNCTIONS.replace("{NOW}", PG_NOW).replace("{CHANNEL}", "devpilot_channel(NEW.orchestrator_id)");
        db.execute_unprepared(&sql).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let db = manager.get_connection();
        db.execute_unprepared(&FUNCTIONS.replace("{NOW}", PG_NOW).replace("{CHANNEL}", "'devpilot_dispatch'")).await?;
        db.execute_unprepared("DROP FUNCTION devpilot_channel(TEXT)").await?;
        Ok(())
    }
}
