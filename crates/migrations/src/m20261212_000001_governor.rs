//! The governor of usage limits and spend across the fleet.
//!
//! - `account_holds`: one row per account (`claude:work`, `claude:key-3f9a1c2b7d4e`) that hit
//!   a usage limit: no machine whose agent runs as it claims until `until_at` (plus the
//!   machine's skew). Written in the same statement as the park of the job that hit it;
//!   deleted early when an attempt under the account succeeds.
//! - `spend`: one row per attempt that reported a cost (the CLI's, or tokens × the price
//!   table), with its account. The day's spend is the sum since the start of the user's day:
//!   no foreign key, so the spend of a job that retention deleted still counts today.
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
CREATE TABLE governor (
    orchestrator_id TEXT PRIMARY KEY,
    limits_paused_at BIGINT,
    limits_paused_by TEXT,
    warned_day BIGINT
)";

const DOWN: &str = "DROP TABLE governor;
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
        run_all(manager.get_connection(), &UP.replace("{id}", id)).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager.get_connection(), DOWN).await
    }
}
