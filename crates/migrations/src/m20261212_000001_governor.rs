//! The governor of usage limits and spend across the fleet.
//!
//! - `account_holds`: one row per account (`claude:work`, `claude:key-3f9a1c2b7d4e`) that hit
//!   a usage limit: no machine whose agent runs as it claims until `until_at` (plus the
//!   machine's skew). Written in the same statement as the park of the job that hit it;
//!   deleted early when an attempt under the account succeeds.
//! - `spend`: one row per attempt that reported a cost (the CLI's, or tokens × the price
//!   table), with its account. The day's spend is the sum since the start of the user's day:
//!   no foreign key, so the spend of a job that retention deleted still counts today.
//! - `spend_quarters`: the running totals of `spend` per quarter hour, the fleet's under
//!   account `*` and each account's under its name (`''`: none), kept by triggers on `spend`
//!   (so a plain SQL write keeps them too). The claim's check of a day's cap sums at most 96
//!   of them, whatever the day's number of attempts; a quarter hour divides every time zone's
//!   midnight.
//! - `governor`: one row per orchestrator, for what the fleet decided together: whether jobs
//!   parked on a usage limit wait for a person (`limits_paused_at`), and the day whose 80 %
//!   warning was given (`warned_day`, so it is given once).
//! - `dispatch_queue.account`: the account its latest attempt ran as; `parked_for`: why a
//!   park holds it (`limit`, `day_cap`, `job_cap`; NULL for any other park);
//!   `resume_after_limit`: 0 leaves a job parked on a limit for a person; `spend_warned`: the
//!   job's 80 % warning was given; `cap_base_usd`: its spend when a person last let it go on
//!   past its cap, from which its cap counts again.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

use crate::run::run_all;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261212_000001_governor"
    }
}

const UP: &str = "ALTER TABLE dispatch_queue ADD COLUMN account TEXT;
ALTER TABLE dispatch_queue ADD COLUMN parked_for TEXT;
ALTER TABLE dispatch_queue ADD COLUMN resume_after_limit INTEGER NOT NULL DEFAULT 1;
ALTER TABLE dispatch_queue ADD COLUMN spend_warned INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dispatch_queue ADD COLUMN cap_base_usd DOUBLE PRECISION NOT NULL DEFAULT 0;
CREATE TABLE account_holds (
    orchestrator_id TEXT NOT NULL,
    account TEXT NOT NULL,
    until_at BIGINT NOT NULL,
    reason TEXT,
    machine TEXT NOT NULL,
    job_id BIGINT,
    held_at BIGINT NOT NULL,
    PRIMARY KEY (orchestrator_id, account)
);
CREATE TABLE spend (
    id {id},
    orchestrator_id TEXT NOT NULL,
    job_id BIGINT NOT NULL,
    claim_token BIGINT NOT NULL,
    machine TEXT,
    account TEXT,
    cost_usd DOUBLE PRECISION NOT NULL,
    at BIGINT NOT NULL
);
CREATE INDEX spend_day ON spend (orchestrator_id, at);
CREATE INDEX spend_job ON spend (job_id, id);
CREATE TABLE spend_quarters (
    orchestrator_id TEXT NOT NULL,
    account TEXT NOT NULL,
    quarter_at BIGINT NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (orchestrator_id, account, quarter_at)
);
CREATE TABLE governor (
    orchestrator_id TEXT PRIMARY KEY,
    limits_paused_at BIGINT,
    limits_paused_by TEXT,
    warned_day BIGINT
)";

/// PostgreSQL's trigger: a spend row's cost leaves its old quarter (an update, a delete) and
/// joins its new one (an insert, an update), under `*` and under its account.
const PG_TRIGGER: &str = r#"
CREATE FUNCTION devpilot_spend_quarters() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        UPDATE spend_quarters SET cost_usd = cost_usd - OLD.cost_usd
         WHERE orchestrator_id = OLD.orchestrator_id AND account IN ('*', COALESCE(OLD.account, ''))
           AND quarter_at = OLD.at - OLD.at % 900000;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO spend_quarters (orchestrator_id, account, quarter_at, cost_usd)
        VALUES (NEW.orchestrator_id, '*', NEW.at - NEW.at % 900000, NEW.cost_usd),
               (NEW.orchestrator_id, COALESCE(NEW.account, ''), NEW.at - NEW.at % 900000, NEW.cost_usd)
        ON CONFLICT (orchestrator_id, account, quarter_at)
        DO UPDATE SET cost_usd = spend_quarters.cost_usd + excluded.cost_usd;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER spend_quarters_kept AFTER INSERT OR UPDATE OR DELETE ON spend
    FOR EACH ROW EXECUTE FUNCTION devpilot_spend_quarters();
"#;

/// SQLite's triggers' statements: `{row}`'s cost, `{sign}`ed, into its quarter under `*` and
/// under its account (a row made first at zero, then added to).
const SQLITE_KEEP: &str = "
    INSERT OR IGNORE INTO spend_quarters (orchestrator_id, account, quarter_at, cost_usd)
    VALUES ({row}.orchestrator_id, '*', {row}.at - {row}.at % 900000, 0),
           ({row}.orchestrator_id, COALESCE({row}.account, ''), {row}.at - {row}.at % 900000, 0);
    UPDATE spend_quarters SET cost_usd = cost_usd {sign} {row}.cost_usd
     WHERE orchestrator_id = {row}.orchestrator_id AND account IN ('*', COALESCE({row}.account, ''))
       AND quarter_at = {row}.at - {row}.at % 900000;
";

/// The statements SQLite's triggers run: `(name, when, body)`.
fn sqlite_triggers() -> [(&'static str, &'static str, String); 3] {
    let keep = |row: &str, sign: &str| SQLITE_KEEP.replace("{row}", row).replace("{sign}", sign);
    [
        ("spend_quarters_insert", "AFTER INSERT", keep("NEW", "+")),
        ("spend_quarters_delete", "AFTER DELETE", keep("OLD", "-")),
        ("spend_quarters_update", "AFTER UPDATE", keep("OLD", "-") + &keep("NEW", "+")),
    ]
}

const DOWN: &str = "DROP TABLE governor;
DROP TABLE spend_quarters;
DROP TABLE spend;
DROP TABLE account_holds;
ALTER TABLE dispatch_queue DROP COLUMN cap_base_usd;
ALTER TABLE dispatch_queue DROP COLUMN spend_warned;
ALTER TABLE dispatch_queue DROP COLUMN resume_after_limit;
ALTER TABLE dispatch_queue DROP COLUMN parked_for;
ALTER TABLE dispatch_queue DROP COLUMN account";

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
        let db = manager.get_connection();
        run_all(db, &UP.replace("{id}", id)).await?;
        if manager.get_database_backend() == DbBackend::Postgres {
            return db.execute_unprepared(PG_TRIGGER).await.map(drop);
        }
        for (name, when, body) in sqlite_triggers() {
            db.execute_unprepared(&format!("CREATE TRIGGER {name} {when} ON spend BEGIN {body} END")).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        if manager.get_database_backend() == DbBackend::Postgres {
            db.execute_unprepared(
                "DROP TRIGGER spend_quarters_kept ON spend; DROP FUNCTION devpilot_spend_quarters();",
            )
            .await?;
        } else {
            for (name, ..) in sqlite_triggers() {
                db.execute_unprepared(&format!("DROP TRIGGER {name}")).await?;
            }
        }
        run_all(db, DOWN).await
    }
}
