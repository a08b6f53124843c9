//! Shared by the migrations: running a script of several SQL statements.

use sea_orm_migration::prelude::*;

/// Runs `sql` one statement at a time (SQLite's driver takes one per call).
pub(crate) async fn run_all(db: &SchemaManagerConnection<'_>, sql: &str) -> Result<(), DbErr> {
    for stmt in sql.split(";\n").map(str::trim).filter(|s| !s.is_empty()) {
        db.execute_unprepared(stmt).await?;
    }
    Ok(())
}
