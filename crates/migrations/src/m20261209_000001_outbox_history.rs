//! An outbox row names the history row that wrote it, and each orchestrator has a key that
//! signs what its machines leave on a tracker:
//!
//! - `outbox.history_id`: the `job_events` row the state change wrote in the same statement
//!   (or transaction) as the outbox row. A row is delivered only when that history row is
//!   there and is of the same job, event and claim: a row inserted by hand names none, and
//!   is never delivered. One history row writes at most one row per event (the unique
//!   index), so a copy of a real row is refused by the database itself. Undelivered rows
//!   from before this migration are linked to their history by job, kind, claim and time.
//! - `orchestrator_keys`: one random 32-byte key per orchestrator (hex), made by the first
//!   machine that needs it (`INSERT … ON CONFLICT DO NOTHING`, then read back). It keys the
//!   MAC of the marker a GitHub comment ends with and the id of a Linear comment, so that
//!   someone on the tracker, who cannot read the database, cannot forge either. Anyone who
//!   can read this table can already add jobs.

use sea_orm_migration::prelude::*;

use crate::run::run_all;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261209_000001_outbox_history"
    }
}

const UP: &str = "
ALTER TABLE outbox ADD COLUMN history_id BIGINT;
UPDATE outbox SET history_id = (
    SELECT MIN(e.id) FROM job_events e
     WHERE e.job_id = outbox.job_id
       AND e.kind = CASE WHEN outbox.event = 'pull_request' THEN 'completed' ELSE outbox.event END
       AND COALESCE(e.claim_token, -1) = COALESCE(outbox.claim_token, -1)
       AND e.at BETWEEN outbox.created_at - 5000 AND outbox.created_at + 5000)
 WHERE done_at IS NULL;
UPDATE outbox SET history_id = NULL
 WHERE history_id IS NOT NULL
   AND EXISTS (SELECT 1 FROM outbox p WHERE p.history_id = outbox.history_id AND p.event = outbox.event
                                        AND p.id < outbox.id);
CREATE UNIQUE INDEX outbox_history ON outbox (history_id, event) WHERE history_id IS NOT NULL;
CREATE TABLE orchestrator_keys (
    orchestrator_id TEXT PRIMARY KEY,
    mac_key TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
";

const DOWN: &str = "
DROP TABLE orchestrator_keys;
DROP INDEX outbox_history;
ALTER TABLE outbox DROP COLUMN history_id;
";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager.get_connection(), UP).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager.get_connection(), DOWN).await
    }
}
