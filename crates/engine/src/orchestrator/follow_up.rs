//! A follow-up's attempt (the review loop reopened a completed job): the feedback that fed it,
//! taken fenced by this claim, as the words the agent gets (see
//! [`crate::sources::review::prompt`]).

use devpilot_store::queue::{Claim, MachineStore};

use crate::sources::review::prompt::follow_up_prompt;

/// The prompt of the follow-up `claim` is, if it is one; `resumed`: its conversation goes on.
/// A follow-up whose feedback cannot be read runs with none (the history says so) rather than
/// not at all: the reviewer's words are on the pull request, and its summary says what ran.
pub(super) async fn prompt_of(store: &MachineStore, claim: &Claim, resumed: bool) -> Option<String> {
    let n = claim.follow_ups;
    if n == 0 {
        return None;
    }
    let queue = store.queue();
    let taken = queue.take_feedback(&claim.fence, n).await;
    let url = queue.watch_of(claim.fence.job).await.ok().flatten().map(|w| w.url).unwrap_or_default();
    match taken {
        Ok(feedback) => {
            tracing::info!(job = claim.fence.job, follow_up = n, pieces = feedback.len(), "the follow-up's feedback");
            Some(follow_up_prompt(n, &url, &feedback, resumed))
        }
        Err(e) => {
            tracing::warn!(job = claim.fence.job, error = %e, "could not take the follow-up's feedback");
            Some(follow_up_prompt(n, &url, &[], resumed))
        }
    }
}
