//! A job's lifecycle, defined once. Every statement in [`crate::queue`] builds its state
//! predicates from these sets instead of spelling out `state IN (…)` by hand.
//!
//! ```text
//! queued ─claim→ running ─exit 0→ completed
//!   ↑  ↖           │ └─exit ≠ 0→ failed ─(backoff)─claim→ running …   (or dead, out of attempts)
//!   │   └─release/sweep/park (exit 75)─┘
//!   │              └─cancel asked, agent stopped→ cancelled
//!   └─requeue─ dead | failed | cancelled          queued ─cancel→ cancelled
//! ```
//!
//! A claimable job may also wait: it is not claimable before its `run_at` (a scheduled start,
//! a retry backoff, or a park until the agent's usage limit resets).

use sea_orm::{ColIdx, DbErr, QueryResult, TryGetError, TryGetable};
use serde::{Deserialize, Serialize};

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for a machine.
    Queued,
    /// Claimed: a machine holds its lease.
    Running,
    /// An attempt failed; claimable again for the next attempt once its backoff is over.
    Failed,
    Completed,
    /// Out of attempts.
    Dead,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 6] = [
        JobState::Queued,
        JobState::Running,
        JobState::Failed,
        JobState::Completed,
        JobState::Dead,
        JobState::Cancelled,
    ];
    /// A machine may claim it.
    pub const CLAIMABLE: [JobState; 2] = [JobState::Queued, JobState::Failed];
    /// Not finished: claimable or held.
    pub const LIVE: [JobState; 3] = [JobState::Queued, JobState::Failed, JobState::Running];
    /// Nothing more happens to it unless a user requeues it.
    pub const FINISHED: [JobState; 3] = [JobState::Completed, JobState::Dead, JobState::Cancelled];
    /// A user may put it back with a fresh attempt budget.
    pub const REQUEUEABLE: [JobState; 3] = [JobState::Dead, JobState::Failed, JobState::Cancelled];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Failed => "failed",
            JobState::Completed => "completed",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub fn is_finished(self) -> bool {
        Self::FINISHED.contains(&self)
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `state` column, read by its name; a name that is no state is an error that says so.
impl TryGetable for JobState {
    fn try_get_by<I: ColIdx>(res: &QueryResult, index: I) -> Result<Self, TryGetError> {
        let name = String::try_get_by(res, index)?;
        JobState::parse(&name)
            .ok_or_else(|| TryGetError::DbErr(DbErr::Type(format!("unknown job state '{name}' in column {index:?}"))))
    }
}

/// `state IN ('a','b')` for a set of states (the SQL the statements share).
pub fn state_in(states: &[JobState]) -> String {
    let list: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
    format!("state IN ({})", list.join(","))
}

/// Why a job moved, as recorded in `job_events.kind`.
pub mod event {
    pub const CLAIMED: &str = "claimed";
    pub const COMPLETED: &str = "completed";
    pub const FAILED: &str = "failed";
    pub const DEAD: &str = "dead";
    pub const SWEPT: &str = "swept";
    pub const HANDED_OFF: &str = "handed_off";
    pub const REQUEUED: &str = "requeued";
    pub const CANCELLED: &str = "cancelled";
    /// A user asked to cancel a running job; its holder stops the agent.
    pub const CANCEL_REQUESTED: &str = "cancel_requested";
    /// The agent said "try later" (exit 75): handed back without counting the attempt.
    pub const PARKED: &str = "parked";
    /// A renewal found the lease gone (swept, and maybe claimed elsewhere).
    pub const LEASE_LOST: &str = "lease_lost";
    /// This machine's local deadline passed with no renewal confirmed: it stopped the agent.
    pub const LEASE_EXPIRED: &str = "lease_expired";
    pub const COMPLETION_REJECTED: &str = "completion_rejected";
    /// Someone asked the holder to hand the job off (`devpilot release --machine`).
    pub const RELEASE_REQUESTED: &str = "release_requested";
    /// A hand-off's work in progress reached the remote after the hand-off itself.
    pub const WORK_PUSHED: &str = "work_pushed";
    /// The agent's conversation was saved for the next claimer (a hand-off, a deadline, a park).
    pub const SESSION_CARRIED: &str = "session_carried";
    /// The agent resumed a carried conversation.
    pub const SESSION_RESUMED: &str = "session_resumed";
    /// A carried conversation could not be resumed: the agent started fresh (the detail says why).
    pub const SESSION_FRESH: &str = "session_fresh";
    /// The agent ran unconfined (the detail says why: the settings, or the machine cannot).
    pub const UNCONFINED: &str = "unconfined";
    /// The agent's sandbox refused hosts it tried to reach (the detail names them).
    pub const EGRESS_REFUSED: &str = "egress_refused";
    /// Something about the agent's sandbox the job's history should say (its commits could
    /// not be taken back, say).
    pub const SANDBOX: &str = "sandbox";
    /// A waiting job took its tracker issue's new text.
    pub const UPDATED: &str = "updated";
    /// The tracker's issue changed after its label approved it: the job keeps (or, before
    /// it was added, was refused with) the approved text. Reported once per approval.
    pub const EDITED_AFTER_APPROVAL: &str = "edited_after_approval";
    /// Review feedback on the job's pull request reopened the completed job (the detail
    /// names the follow-up).
    pub const FOLLOW_UP: &str = "follow_up";
    /// The review loop reached a cap: the pull request is handed back to its reviewer (one
    /// comment on the pull request says so).
    pub const HANDED_BACK: &str = "handed_back";
    /// A running job passed the warning share (80 %) of its spend cap: said once per job.
    pub const SPEND_WARNING: &str = "spend_warning";
    /// The events a job from a tracker source reports back to it (through the outbox).
    pub const REPORTABLE: [&str; 11] = [
        CLAIMED,
        HANDED_OFF,
        COMPLETED,
        FAILED,
        DEAD,
        CANCELLED,
        PARKED,
        SWEPT,
        EDITED_AFTER_APPROVAL,
        HANDED_BACK,
        SPEND_WARNING,
    ];
    /// Not a history kind: the outbox row a completion of a tracker's job writes after its
    /// `completed` row, whose delivery opens (or finds) the job's pull request.
    pub const PULL_REQUEST: &str = "pull_request";
    /// Not a history kind: the outbox row a follow-up's completion writes in place of
    /// [`PULL_REQUEST`], whose delivery answers the feedback that fed it: a reply in each
    /// inline comment's thread and one summary comment on the pull request.
    pub const FOLLOW_UP_ANSWERS: &str = "follow_up_answers";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sets partition the states as the lifecycle says, and names round-trip.
    #[test]
    fn sets_and_names() {
        for s in JobState::ALL {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
            assert_ne!(JobState::LIVE.contains(&s), s.is_finished(), "{s} is live xor finished");
        }
        assert!(JobState::CLAIMABLE.iter().all(|s| JobState::LIVE.contains(s)));
        assert_eq!(state_in(&JobState::CLAIMABLE), "state IN ('queued','failed')");
    }
}
