//! GitHub as a second kind of source, and the pull request a finished job opens:
//!
//! - `sources.etag`: the `ETag` of the last one-page read, kept with the cursor so that any
//!   machine's next turn (and `devpilot sources poll`) sends `If-None-Match`, and an idle
//!   fleet's reads are 304s that cost nothing against GitHub's budget. A multi-page read
//!   keeps none: its first page unchanged says nothing about the others.
//! - `dispatch_queue.pushed_remote`: the remote a completed job's branch was pushed to (as
//!   the clone names it, with any user name or password taken out), written fenced by the
//!   machine that pushed, before its completion. The pull request's outbox row reads it:
//!   whichever machine delivers the row, it opens the PR where the branch really is.

use sea_orm_migration::prelude::*;

use crate::run::run_all;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261207_000001_github"
    }
}

const UP: &str = "
ALTER TABLE sources ADD COLUMN etag TEXT;
ALTER TABLE dispatch_queue ADD COLUMN pushed_remote TEXT;
";

const DOWN: &str = "
ALTER TABLE dispatch_queue DROP COLUMN pushed_remote;
ALTER TABLE sources DROP COLUMN etag;
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
