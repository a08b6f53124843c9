//! The `dispatch_queue` entity, for the statements expressed through sea-orm's builder.

pub mod dispatch_queue {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
    #[sea_orm(table_name = "dispatch_queue")]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub orchestrator_id: String,
        pub payload: Json,
        pub title: Option<String>,
        pub state: String,
        pub created_at: i64,
        pub claimed_at: Option<i64>,
        pub claimed_by: Option<String>,
        pub claim_token: i64,
        pub heartbeat_at: Option<i64>,
        pub attempts: i32,
        pub completed_at: Option<i64>,
        pub failed_at: Option<i64>,
        pub dead_at: Option<i64>,
        pub last_error: Option<String>,
        pub max_attempts: i32,
        pub unique_key: Option<String>,
        pub priority: i32,
        pub run_at: i64,
        pub retry_backoff_ms: Option<i64>,
        pub retry_backoff_max_ms: Option<i64>,
        pub summary: Option<String>,
        pub result_url: Option<String>,
        pub cancel_requested_at: Option<i64>,
        pub cancel_requested_by: Option<String>,
        pub finished_at: Option<i64>,
        pub repo: Option<String>,
        pub requires: Option<String>,
        pub resume_branch: Option<String>,
        pub resumed_from: Option<String>,
        pub release_requested_at: Option<i64>,
        pub release_requested_by: Option<String>,
        pub worktree: Option<String>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
