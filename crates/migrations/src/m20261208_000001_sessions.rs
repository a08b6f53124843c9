//! What an agent CLI said about its run, and its conversation carried across machines:
//!
//! - `dispatch_queue.agent`, `agent_session`, `cost_usd`, `tokens_in`, `tokens_out`,
//!   `session_from`: the preset that ran the job's last attempt, the CLI's session id, the
//!   cost and tokens its structured output reported (summed over attempts), and the machine
//!   whose conversation the last attempt resumed. Written fenced by the holder.
//! - `job_sessions`: one row per job, the agent's conversation at its last hand-off, stop at
//!   the lease deadline or park: the CLI's session files, compressed, as base64 text (text
//!   travels through every mode, a pooler's inlined statements too), with the worktree path
//!   they were written under, so the next machine can rewrite it. Written fenced by the
//!   claim token, read by the next claimer. Never part of the job's branch. Dropped with its
//!   job.

use sea_orm_migration::prelude::*;

use crate::run::run_all;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261208_000001_sessions"
    }
}

const UP: &str = "
ALTER TABLE dispatch_queue ADD COLUMN agent TEXT;
ALTER TABLE dispatch_queue ADD COLUMN agent_session TEXT;
ALTER TABLE dispatch_queue ADD COLUMN cost_usd DOUBLE PRECISION;
ALTER TABLE dispatch_queue ADD COLUMN tokens_in BIGINT;
ALTER TABLE dispatch_queue ADD COLUMN tokens_out BIGINT;
ALTER TABLE dispatch_queue ADD COLUMN session_from TEXT;
CREATE TABLE job_sessions (
    job_id BIGINT PRIMARY KEY REFERENCES dispatch_queue (id) ON DELETE CASCADE,
    orchestrator_id TEXT NOT NULL,
    claim_token BIGINT NOT NULL,
    machine TEXT NOT NULL,
    agent TEXT NOT NULL,
    session_id TEXT NOT NULL,
    cwd TEXT NOT NULL,
    bundle TEXT NOT NULL,
    raw_size BIGINT NOT NULL,
    saved_at BIGINT NOT NULL
)
";

const DOWN: &str = "
DROP TABLE job_sessions;
ALTER TABLE dispatch_queue DROP COLUMN session_from;
ALTER TABLE dispatch_queue DROP COLUMN tokens_out;
ALTER TABLE dispatch_queue DROP COLUMN tokens_in;
ALTER TABLE dispatch_queue DROP COLUMN cost_usd;
ALTER TABLE dispatch_queue DROP COLUMN agent_session;
ALTER TABLE dispatch_queue DROP COLUMN agent;
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
