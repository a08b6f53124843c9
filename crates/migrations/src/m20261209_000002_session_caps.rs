//! Caps on a carried session that a plain SQL INSERT cannot bypass. The engine never bundles
//! more (`preset::session`, `SESSION_BUNDLE_CAP` in the store); another machine's SQL meets
//! the same caps here, in a trigger:
//!
//! - `bundle`: at most 16 MiB (16,777,216 bytes) of base64 text. The restore decodes it on
//!   every claim of the job, and the next machine's claim would fetch whatever is there.
//! - `cwd`: at most 4,096 bytes (the longest path Linux takes); `session_id` at most 200.
//!
//! The statement that loads a session (`LOAD_SESSION`) also leaves a longer bundle unread,
//! so a row from before this migration is never fetched either. Rows already in the table
//! are left as they are.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261209_000002_session_caps"
    }
}

const PG_UP: &str = r#"
CREATE FUNCTION devpilot_session_caps() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF octet_length(NEW.bundle) > 16777216 THEN
        RAISE EXCEPTION 'the session bundle is % bytes; at most 16777216 (16 MiB) are stored',
            octet_length(NEW.bundle) USING ERRCODE = 'check_violation';
    END IF;
    IF octet_length(NEW.cwd) > 4096 THEN
        RAISE EXCEPTION 'the session''s cwd is % bytes; at most 4096 are stored', octet_length(NEW.cwd)
            USING ERRCODE = 'check_violation';
    END IF;
    IF octet_length(NEW.session_id) > 200 THEN
        RAISE EXCEPTION 'the session id is % bytes; at most 200 are stored', octet_length(NEW.session_id)
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER job_sessions_caps BEFORE INSERT OR UPDATE OF bundle, cwd, session_id ON job_sessions
    FOR EACH ROW EXECUTE FUNCTION devpilot_session_caps();
"#;

const PG_DOWN: &str = "
DROP TRIGGER job_sessions_caps ON job_sessions;
DROP FUNCTION devpilot_session_caps();
";

/// The body of SQLite's two triggers (insert, and update of the capped columns).
const SQLITE_CHECKS: &str = "
    SELECT RAISE(ABORT, 'the session bundle is more than 16777216 bytes (16 MiB); it is not stored')
     WHERE octet_length(NEW.bundle) > 16777216;
    SELECT RAISE(ABORT, 'the session''s cwd is more than 4096 bytes; it is not stored')
     WHERE octet_length(NEW.cwd) > 4096;
    SELECT RAISE(ABORT, 'the session id is more than 200 bytes; it is not stored')
     WHERE octet_length(NEW.session_id) > 200;
";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        if manager.get_database_backend() == DbBackend::Postgres {
            db.execute_unprepared(PG_UP).await?;
            return Ok(());
        }
        for (name, when) in [
            ("job_sessions_caps", "BEFORE INSERT"),
            ("job_sessions_caps_update", "BEFORE UPDATE OF bundle, cwd, session_id"),
        ] {
            db.execute_unprepared(&format!("CREATE TRIGGER {name} {when} ON job_sessions BEGIN {SQLITE_CHECKS} END"))
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        if manager.get_database_backend() == DbBackend::Postgres {
            return db.execute_unprepared(PG_DOWN).await.map(drop);
        }
        db.execute_unprepared("DROP TRIGGER job_sessions_caps").await?;
        db.execute_unprepared("DROP TRIGGER job_sessions_caps_update").await?;
        Ok(())
    }
}
