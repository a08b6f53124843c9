//! The review loop's part of a source's turn: each open pull request of the source's jobs is
//! read once, its new feedback kept, and a job whose burst of feedback is over is reopened as
//! a follow-up (or its pull request handed back at a cap). Every read it records (and a
//! watch it ends) names the turn, so a machine that stalled past it records nothing over a
//! newer turn's reads; the feedback it keeps is idempotent, and a follow-up is guarded by
//! the job's state. A Linear source's
//! job also has the comments on its Linear issue read ([`super::linear`]).

use std::collections::BTreeMap;
use std::time::Duration;

use super::linear::{self, Reading};
use super::read;
use super::settings::ReviewLoop;
use crate::sources::error::TrackerError;
use crate::sources::github::GithubClient;
use crate::sources::keys::{self, GithubTokens};
use crate::sources::settings::SourceSettings;
use crate::sources::tracker::TrackerClient;
use devpilot_store::error::Result;
use devpilot_store::queue::{FollowUp, NewFeedback, Queue, WatchRow};
use devpilot_store::spec::JobSpec;

/// What a pass over one source's pull requests needs.
pub struct Watching<'a> {
    pub queue: &'a Queue,
    pub machine: &'a str,
    /// The source and the turn this machine holds.
    pub source: i64,
    pub turn: i64,
    /// Each repo's loop, by repo name (a repo not named: the defaults).
    pub loops: &'a BTreeMap<String, ReviewLoop>,
    /// This machine's GitHub tokens, by API host.
    pub tokens: &'a GithubTokens,
    /// Each call's bound.
    pub timeout: Duration,
    /// The orchestrator (its key gave DevPilot's own Linear comments their ids).
    pub orchestrator_id: &'a str,
    /// The source's name and settings.
    pub name: &'a str,
    pub settings: &'a SourceSettings,
    /// The source's tracker client: a Linear source's jobs have their issue's comments read
    /// with it (`None`: only the pull requests are read).
    pub tracker: Option<&'a TrackerClient>,
}

/// What a pass did, for the log and the measurement of an idle pull request's cost.
#[derive(Debug, Default, PartialEq)]
pub struct Watched {
    pub pulls: u32,
    pub requests: u32,
    pub not_modified: u32,
    pub new_feedback: usize,
    pub follow_ups: Vec<(i64, i32)>,
    pub handed_back: Vec<i64>,
    pub ended: Vec<i64>,
    /// Linear issues whose comments were read.
    pub linear_reads: u32,
    /// Linear refused the key or ran out of budget: no more of its issues this pass.
    pub linear_stopped: Option<String>,
}

/// Reads each open pull request of the source once. GitHub's trouble with one pull request
/// is logged and the next is read; a rate limit or a refused token ends the pass.
pub async fn pass(w: &Watching<'_>) -> Result<Watched> {
    let mut done = Watched::default();
    for watch in w.queue.open_watches(w.source).await? {
        let rules = watch.job_repo.as_ref().and_then(|r| w.loops.get(r)).cloned().unwrap_or_default();
        if !rules.enabled {
            continue;
        }
        match one(w, &watch, &rules, &mut done).await {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                tracing::warn!(job = watch.job_id, pull = %watch.url, error = %e, "could not read the pull request's review");
                if matches!(e, TrackerError::Auth(..)) || e.reset_at_ms().is_some() {
                    break;
                }
            }
        }
    }
    Ok(done)
}

/// One pull request; `Ok(false)`: a newer turn began, so the pass ends.
async fn one(
    w: &Watching<'_>,
    watch: &WatchRow,
    rules: &ReviewLoop,
    done: &mut Watched,
) -> std::result::Result<bool, TrackerError> {
    let Some(gh) = client(w, watch)? else { return Ok(true) };
    let mut found = read::pull(&gh, watch, rules).await?;
    done.pulls += 1;
    done.requests += found.requests;
    done.not_modified += found.not_modified;
    let q = w.queue;
    if let Some(end) = found.ended {
        if q.end_watch(watch.job_id, Some(w.turn), end).await.map_err(store)? {
            tracing::info!(job = watch.job_id, pull = %watch.url, state = end.as_str(), "the review loop ended");
            done.ended.push(watch.job_id);
        }
        return Ok(true);
    }
    found.feedback.extend(on_linear(w, watch, rules, done).await);
    let added = q.add_feedback(watch.job_id, &found.feedback).await.map_err(store)?;
    done.new_feedback += added;
    if !q.record_read(watch.job_id, w.turn, &found.read).await.map_err(store)? {
        return Ok(false);
    }
    if (added > 0 || watch.waiting > 0) && watch.job_state == "completed" {
        follow_up(w, watch, rules, done).await.map_err(store)?;
    }
    Ok(true)
}

/// The feedback on the job's Linear issue, for a Linear source's job. Linear's trouble costs
/// only this part of the read (the pull request's feedback is kept, and the issue is read
/// again next turn); a refused key or a rate limit skips the rest of the pass's issues.
async fn on_linear(w: &Watching<'_>, watch: &WatchRow, rules: &ReviewLoop, done: &mut Watched) -> Vec<NewFeedback> {
    let Some(TrackerClient::Linear(client)) = w.tracker else { return vec![] };
    if done.linear_stopped.is_some() {
        return vec![];
    }
    let r = Reading { queue: w.queue, orchestrator_id: w.orchestrator_id, client, name: w.name, settings: w.settings };
    match linear::feedback(&r, watch, rules).await {
        Ok(found) => {
            done.linear_reads += 1;
            found
        }
        Err(e) => {
            tracing::warn!(job = watch.job_id, error = %e, "could not read the Linear issue's comments");
            if matches!(e, TrackerError::Auth(..)) || e.reset_at_ms().is_some() {
                done.linear_stopped = Some(e.to_string());
            }
            vec![]
        }
    }
}

/// Reopens the job as its next follow-up if its burst is over, or hands its PR back.
async fn follow_up(w: &Watching<'_>, watch: &WatchRow, rules: &ReviewLoop, done: &mut Watched) -> Result<()> {
    let Some((job, payload)) = w.queue.job(watch.job_id).await? else { return Ok(()) };
    let branch = JobSpec::parse(&payload).map(|s| s.branch(job.id)).unwrap_or_else(|_| format!("devpilot/{}", job.id));
    match w.queue.follow_up(job.id, &branch, &rules.rules(), w.machine).await? {
        FollowUp::Queued(n) => {
            tracing::info!(job = job.id, follow_up = n, pull = %watch.url, "review feedback reopened the job");
            done.follow_ups.push((job.id, n));
        }
        FollowUp::HandedBack => {
            tracing::info!(job = job.id, pull = %watch.url, "the review loop's cap: the pull request is handed back");
            done.handed_back.push(job.id);
        }
        FollowUp::Waiting | FollowUp::Nothing => {}
    }
    Ok(())
}

/// A client of the pull request's API with this machine's token for its host; `None` (and a
/// log line) when this machine has none: another machine's turn reads it.
fn client(w: &Watching<'_>, watch: &WatchRow) -> std::result::Result<Option<GithubClient>, TrackerError> {
    let host = keys::host_of(&watch.api).unwrap_or_default();
    let Some(token) = w.tokens.get(&host) else {
        tracing::info!(job = watch.job_id, %host, "no GitHub token for the pull request's host here: its review is not read");
        return Ok(None);
    };
    GithubClient::new(&watch.api, token.secret(), w.timeout).map(Some)
}

fn store(e: devpilot_store::error::Error) -> TrackerError {
    TrackerError::Unreachable(crate::sources::settings::SourceKind::Github, format!("the database: {e}"))
}
