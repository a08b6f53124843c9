//! A machine's presence writes land in the order it made them. Each run of a machine picks a
//! random `run_id` and numbers its writes (`seq`); the upsert overwrites a row only with a
//! later write of the same run, or with any write of another run (a restart). Without it,
//! a write that timed out on the machine's side but still committed on the server (through
//! a transaction-mode pooler, say) could land after the final `stopped` and leave a stopped
//! machine looking as if it were still handing off.

use sea_orm_migration::prelude::*;

use crate::run::run_all;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261205_000002_presence_order"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(
            manager.get_connection(),
            "ALTER TABLE machines ADD COLUMN run_id BIGINT;\nALTER TABLE machines ADD COLUMN seq BIGINT;\n",
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(
            manager.get_connection(),
            "ALTER TABLE machines DROP COLUMN seq;\nALTER TABLE machines DROP COLUMN run_id;\n",
        )
        .await
    }
}
