//! What the window reads and sends about jobs: [`JobDetail`], [`NewJob`], [`Fleet`].

use serde::Serialize;

use devpilot_store::queue::{Counts, JobEvent, JobRow, MachineRow, OutboxRow};

/// One job with everything the detail view shows.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct JobDetail {
    pub job: JobRow,
    pub payload: serde_json::Value,
    pub history: Vec<JobEvent>,
    /// The agent's output: this machine's full local log when it ran the job here, else
    /// the tail its holder stores in the database (live while it runs).
    pub log_tail: String,
    /// Where `log_tail` comes from: `"local"`, or the machine that stored it.
    pub log_from: Option<String>,
    /// Why no online machine can take this queued job, if none can.
    pub unroutable: Option<String>,
    /// The job's branch (a job with a repo), as every machine names it.
    pub branch: Option<String>,
    /// Its reports to the tracker, oldest first: what each is, and whether it got there.
    pub deliveries: Vec<OutboxRow>,
    /// Its worktree is on this machine (Open worktree).
    pub worktree_here: bool,
    /// This machine's full log of it exists (Open the full log).
    pub log_path: Option<String>,
    /// Its pull request's review loop, if DevPilot opened one.
    pub review_loop: Option<crate::review::ReviewLoopView>,
    /// What each attempt spent, against the job's cap.
    pub spend: Option<crate::limits::JobSpend>,
}

/// A job as the window's New job form sends it.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct NewJob {
    pub title: String,
    pub prompt: String,
    pub repo: Option<String>,
    /// Comma-separated labels the running machine must have.
    pub labels: String,
    pub priority: i32,
    pub key: Option<String>,
}

/// The fleet view.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Fleet {
    pub machines: Vec<MachineRow>,
    pub running: Vec<JobRow>,
    pub counts: Counts,
}
