//! The review loop: a completed job's pull request is watched (`pr_watch`), the feedback read
//! from it is kept once per review, comment or check (`pr_feedback`, unique per key), and the
//! job's follow-ups are counted on the job (`dispatch_queue.follow_ups`).
//!
//! - `pr_watch`: one row per job whose pull request DevPilot opened, written by the pull
//!   request's delivery. `state` is `open` while feedback is read, then `merged`, `closed`,
//!   `unlabelled` or `handed_back`, and nothing is read any more. The `etag_*` columns hold
//!   the last `ETag` of each read, so an unchanged PR costs only 304s. `cost_base` is the
//!   job's spend when its PR opened: what the follow-ups spent is the job's spend beyond it.
//!   `follow_sha` is the PR's head when the newest follow-up was queued, so its answer can say
//!   whether it changed anything. `ignored` counts comments no agent was fed.
//! - `pr_feedback`: one row per piece of feedback (`key`: `github:review:ID`,
//!   `github:review_comment:ID`, `github:comment:ID`, `github:check_run:ID`,
//!   `github:status:SHA:CONTEXT`, `linear:comment:ID`). The unique index is what makes each
//!   piece taken once, by whichever machine reads it first. `follow_up` is the follow-up it
//!   fed (NULL: not yet taken); `ignored` says why it feeds nothing (then no body is kept);
//!   `reply` is what the follow-up's answer said of it (in its thread, or in the summary).

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

use crate::run::run_all;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261211_000001_review_loop"
    }
}

const UP: &str = "ALTER TABLE dispatch_queue ADD COLUMN follow_ups INTEGER NOT NULL DEFAULT 0;
CREATE TABLE pr_watch (
    job_id BIGINT PRIMARY KEY REFERENCES dispatch_queue (id) ON DELETE CASCADE,
    orchestrator_id TEXT NOT NULL,
    source_id BIGINT REFERENCES sources (id) ON DELETE SET NULL,
    api TEXT NOT NULL,
    repo TEXT NOT NULL,
    number BIGINT NOT NULL,
    url TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'open',
    head_sha TEXT,
    follow_sha TEXT,
    etag_pull TEXT,
    etag_reviews TEXT,
    etag_review_comments TEXT,
    etag_comments TEXT,
    etag_checks TEXT,
    etag_status TEXT,
    cost_base DOUBLE PRECISION NOT NULL DEFAULT 0,
    ignored INTEGER NOT NULL DEFAULT 0,
    opened_at BIGINT NOT NULL,
    read_at BIGINT,
    ended_at BIGINT
);
CREATE INDEX pr_watch_open ON pr_watch (orchestrator_id, source_id) WHERE state = 'open';
CREATE TABLE pr_feedback (
    id {id},
    orchestrator_id TEXT NOT NULL,
    job_id BIGINT NOT NULL REFERENCES dispatch_queue (id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    kind TEXT NOT NULL,
    author TEXT NOT NULL,
    path TEXT,
    line BIGINT,
    thread BIGINT,
    body TEXT,
    url TEXT,
    ignored TEXT,
    follow_up INTEGER,
    reply TEXT,
    received_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX pr_feedback_key ON pr_feedback (orchestrator_id, key);
CREATE INDEX pr_feedback_job ON pr_feedback (job_id, id)";

const DOWN: &str = "DROP TABLE pr_feedback;
DROP TABLE pr_watch;
ALTER TABLE dispatch_queue DROP COLUMN follow_ups";

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
