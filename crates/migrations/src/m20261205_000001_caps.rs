//! Caps that a plain SQL INSERT cannot bypass. `devpilot enqueue`, the window's form and
//! the engine's API refuse an oversized job with a clear error before anything is sent
//! (`devpilot::spec::check_payload`); a producer's own SQL meets the same caps here, in a
//! trigger, with the same words:
//!
//! - the payload: at most 1 MiB (1,048,576 bytes) of JSON (a 200 MB payload once cost the
//!   enqueue 1.18 GB and the runner 779 MB);
//! - `requires`: at most 32 labels, each a string of at most 64 bytes (200,000 labels made
//!   the pick's routing predicate take 10 s), in the payload and in the column;
//! - `title` at most 1,024 bytes (in the payload and in the column), `prompt` at most
//!   262,144 (256 KiB), `url` at most 2,048.
//!
//! PostgreSQL's `jsonb` already refuses a NUL character (`\u0000`) in a payload; on SQLite
//! the runner refuses to run a job whose title, prompt or URL holds one.
//!
//! Rows already in the table are left as they are: the caps apply to what is written from
//! now on.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261205_000001_caps"
    }
}

const PG_UP: &str = r#"
CREATE FUNCTION devpilot_job_caps() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
    f text;
    cap int;
BEGIN
    n := octet_length(NEW.payload::text);
    IF n > 1048576 THEN
        RAISE EXCEPTION 'the payload is % bytes of JSON; at most 1048576 (1 MiB) are allowed', n
            USING ERRCODE = 'check_violation';
    END IF;
    IF jsonb_typeof(NEW.payload->'requires') = 'array' THEN
        IF jsonb_array_length(NEW.payload->'requires') > 32 THEN
            RAISE EXCEPTION 'requires names % labels; at most 32 are allowed',
                jsonb_array_length(NEW.payload->'requires') USING ERRCODE = 'check_violation';
        END IF;
        IF EXISTS (SELECT 1 FROM jsonb_array_elements(NEW.payload->'requires') AS r(v)
                    WHERE jsonb_typeof(v) <> 'string' OR octet_length(v #>> '{}') > 64) THEN
            RAISE EXCEPTION 'each label in requires must be a string of at most 64 bytes'
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    IF NEW.requires IS NOT NULL THEN
        IF json_typeof(NEW.requires::json) <> 'array' OR json_array_length(NEW.requires::json) > 32
           OR EXISTS (SELECT 1 FROM json_array_elements(NEW.requires::json) AS r(v)
                       WHERE json_typeof(v) <> 'string' OR octet_length(v #>> '{}') > 64) THEN
            RAISE EXCEPTION 'the requires column must be a JSON array of at most 32 labels of at most 64 bytes'
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    FOREACH f IN ARRAY ARRAY['title', 'prompt', 'url'] LOOP
        cap := CASE f WHEN 'title' THEN 1024 WHEN 'prompt' THEN 262144 ELSE 2048 END;
        IF jsonb_typeof(NEW.payload->f) = 'string' AND octet_length(NEW.payload->>f) > cap THEN
            RAISE EXCEPTION '% is % bytes long; at most % are allowed', f, octet_length(NEW.payload->>f), cap
                USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;
    IF octet_length(NEW.title) > 1024 THEN
        RAISE EXCEPTION 'the title column is % bytes long; at most 1024 are allowed', octet_length(NEW.title)
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER dispatch_queue_caps BEFORE INSERT OR UPDATE OF payload, requires, title ON dispatch_queue
    FOR EACH ROW EXECUTE FUNCTION devpilot_job_caps();
"#;

const PG_DOWN: &str = "
DROP TRIGGER dispatch_queue_caps ON dispatch_queue;
DROP FUNCTION devpilot_job_caps();
";

/// The body of SQLite's two triggers (insert, and update of the capped columns).
const SQLITE_CHECKS: &str = "
    SELECT RAISE(ABORT, 'the payload is not valid JSON') WHERE NOT json_valid(NEW.payload);
    SELECT RAISE(ABORT, 'the payload is more than 1048576 bytes (1 MiB) of JSON')
     WHERE length(CAST(NEW.payload AS BLOB)) > 1048576;
    SELECT RAISE(ABORT, 'requires names more than 32 labels; at most 32 are allowed')
     WHERE json_type(NEW.payload, '$.requires') = 'array' AND json_array_length(NEW.payload, '$.requires') > 32;
    SELECT RAISE(ABORT, 'each label in requires must be a string of at most 64 bytes')
     WHERE json_type(NEW.payload, '$.requires') = 'array'
       AND EXISTS (SELECT 1 FROM json_each(NEW.payload, '$.requires')
                    WHERE type <> 'text' OR length(CAST(value AS BLOB)) > 64);
    SELECT RAISE(ABORT, 'the requires column must be a JSON array of at most 32 labels of at most 64 bytes')
     WHERE NEW.requires IS NOT NULL
       AND (NOT json_valid(NEW.requires) OR json_type(NEW.requires) <> 'array'
            OR json_array_length(NEW.requires) > 32
            OR EXISTS (SELECT 1 FROM json_each(NEW.requires) WHERE type <> 'text' OR length(CAST(value AS BLOB)) > 64));
    SELECT RAISE(ABORT, 'title is more than 1024 bytes long')
     WHERE (json_type(NEW.payload, '$.title') = 'text' AND length(CAST(json_extract(NEW.payload, '$.title') AS BLOB)) > 1024)
        OR length(CAST(NEW.title AS BLOB)) > 1024;
    SELECT RAISE(ABORT, 'prompt is more than 262144 bytes long')
     WHERE json_type(NEW.payload, '$.prompt') = 'text' AND length(CAST(json_extract(NEW.payload, '$.prompt') AS BLOB)) > 262144;
    SELECT RAISE(ABORT, 'url is more than 2048 bytes long')
     WHERE json_type(NEW.payload, '$.url') = 'text' AND length(CAST(json_extract(NEW.payload, '$.url') AS BLOB)) > 2048;
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
            ("dispatch_queue_caps", "BEFORE INSERT"),
            ("dispatch_queue_caps_update", "BEFORE UPDATE OF payload, requires, title"),
        ] {
            db.execute_unprepared(&format!("CREATE TRIGGER {name} {when} ON dispatch_queue BEGIN {SQLITE_CHECKS} END"))
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        if manager.get_database_backend() == DbBackend::Postgres {
            return db.execute_unprepared(PG_DOWN).await.map(drop);
        }
        db.execute_unprepared("DROP TRIGGER dispatch_queue_caps").await?;
        db.execute_unprepared("DROP TRIGGER dispatch_queue_caps_update").await?;
        Ok(())
    }
}
