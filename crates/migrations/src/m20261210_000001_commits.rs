//! `dispatch_queue.commits`: how many commits a completed job's branch had beyond what its
//! worktree started from, as the completing machine counted them, written fenced with
//! `pushed_remote` before the completion. `0` says the agent changed nothing: no branch is
//! pushed, no pull request is asked for, and the issue and the job's page say "no changes".
//! NULL: the job ran without a worktree, or before this migration.

use sea_orm_migration::prelude::*;

use crate::run::run_all;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261210_000001_commits"
    }
}

const UP: &str = "ALTER TABLE dispatch_queue ADD COLUMN commits INTEGER;";

const DOWN: &str = "ALTER TABLE dispatch_queue DROP COLUMN commits;";

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
