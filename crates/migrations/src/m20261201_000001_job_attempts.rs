//! Each job carries its own attempt budget, and each machine can say why it is not claiming.
//!
//! `max_attempts` used to come from whoever ran the statement: a cron `devpilot sweep` with
//! the default of 3 killed jobs that the runners allowed 10. Stored on the row at enqueue, the
//! sweep and the fail path read it from the job itself. Existing rows get the old default.
//!
//! `machines.problem` is what keeps a machine from claiming (an agent program that is missing,
//! say), so `devpilot status` on any machine can show it.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261201_000001_job_attempts"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("ALTER TABLE dispatch_queue ADD COLUMN max_attempts INTEGER NOT NULL DEFAULT 3").await?;
        db.execute_unprepared("ALTER TABLE machines ADD COLUMN problem TEXT").await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("ALTER TABLE machines DROP COLUMN problem").await?;
        db.execute_unprepared("ALTER TABLE dispatch_queue DROP COLUMN max_attempts").await?;
        Ok(())
    }
}
