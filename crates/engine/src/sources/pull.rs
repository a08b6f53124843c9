//! The pull request row a completion of a tracker's job leaves after its `completed` row:
//! when the completing machine pushed the job's branch to a GitHub remote, open the pull
//! request from it (or find the open one), make its URL the job's result link, and link it
//! on the issue: a comment on GitHub, an attachment on Linear.
//!
//! A pull request GitHub refuses (its base branch was deleted, nothing to merge) ends the
//! row with GitHub's error; the job stays completed. A machine with no GitHub token leaves
//! the row for one that has one.

use serde_json::Value;

use super::bind::{self, Target};
use super::ending::{backoff, ending, refused};
use super::error::TrackerError;
use super::github::pulls::{api_for, open_or_reuse, GithubRemote, PullAsk};
use super::github::{self, GithubClient};
use super::health::SourcesCfg;
use super::intake::Bound;
use super::keys::{self, GithubTokens};
use super::linear;
use super::mac;
use super::settings::SourceKind;
use super::tracker::TrackerClient;
use crate::worktree::PrMode;
use devpilot_store::queue::{Delivery, DeliveryEnd, JobRow, MacKey, Queue};
use devpilot_store::spec::JobSpec;

/// Delivers pull request row `d` of `job` (from `source`, whose tracker `client` links it).
pub(super) async fn deliver(
    queue: &Queue,
    cfg: &SourcesCfg,
    source: &Bound,
    client: &TrackerClient,
    d: &Delivery,
    (job, payload, issue): (&JobRow, &Value, &Target),
    tokens: &GithubTokens,
) -> (DeliveryEnd, Option<TrackerError>) {
    let Some((remote, api)) = target(cfg, job) else { return (DeliveryEnd::Delivered, None) };
    if let Err(end) = own_remote(cfg, job, &remote, d).await {
        return end;
    }
    // Only the token of the API's own host: github.com's never goes to another.
    let host = keys::host_of(&api).unwrap_or_default();
    let Some(token) = tokens.get(&host) else {
        let error = format!(
            "no GitHub token for {host} on {} to open the pull request: `devpilot login --github` \
             (with --api-url for a host other than github.com), or GITHUB_TOKEN for github.com",
            cfg.machine
        );
        return (DeliveryEnd::Retry { after: backoff(d.tries), error }, None);
    };
    let gh = match GithubClient::new(&api, token.secret(), source.settings.timeout.get()) {
        Ok(c) => c,
        Err(e) => return (DeliveryEnd::GiveUp { error: e.to_string() }, None),
    };
    let ask = ask_of(cfg, job, payload, remote);
    let url = match open_or_reuse(&gh, &ask).await {
        Ok(url) => url,
        // GitHub's trouble ends the pass only for a GitHub source: a Linear source's other
        // rows go on.
        Err(e) => {
            let (end, stop) = ending(Err(e), d);
            return (end, stop.filter(|_| source.settings.kind == SourceKind::Github));
        }
    };
    tracing::info!(job = job.id, %url, "the job's pull request");
    if let Err(e) = queue.set_result_url(job.id, &url).await {
        return (DeliveryEnd::Retry { after: backoff(d.tries), error: e.to_string() }, None);
    }
    // From now on its review comes back to the job (see `review`): watched in its source's turns.
    if let Some(number) = number_of(&url) {
        if let Err(e) = queue.watch_pull(job.id, d.source_id, &api, &ask.remote.full_name(), number, &url).await {
            return (DeliveryEnd::Retry { after: backoff(d.tries), error: e.to_string() }, None);
        }
    }
    let key = match queue.mac_key(&cfg.orchestrator_id).await {
        Ok(k) => k,
        Err(e) => return (DeliveryEnd::Retry { after: backoff(d.tries), error: e.to_string() }, None),
    };
    ending(link(client, d, issue, &url, (&key, &cfg.orchestrator_id)).await, d)
}

/// Whether `pushed` is where this machine's clone of the job's repo pushes: a pull request
/// is opened only on the remote the delivering machine has configured for that repo, never
/// on one the job row names. A machine without the repo leaves the row for one that has it.
async fn own_remote(
    cfg: &SourcesCfg,
    job: &JobRow,
    pushed: &GithubRemote,
    d: &Delivery,
) -> Result<(), (DeliveryEnd, Option<TrackerError>)> {
    let Some(repo) = job.repo.as_deref() else {
        return Err(refused("the job has no repo, so no remote of this machine's to open a pull request on".into()));
    };
    let Some(here) = cfg.remotes.get(repo) else {
        let error =
            format!("repo '{repo}' is not configured on {}: another machine opens its pull request", cfg.machine);
        return Err((DeliveryEnd::Retry { after: backoff(d.tries), error }, None));
    };
    // A remote git cannot read is compared as named (a remote named by its URL is its own).
    let url = super::maps::remote_url(here).await.unwrap_or_else(|| here.remote.clone());
    bind::same_remote(pushed, &url).map_err(refused)
}

/// Where the PR goes: the remote the branch was pushed to, if it is GitHub's and the repo
/// wants pull requests, with the API that serves it.
fn target(cfg: &SourcesCfg, job: &JobRow) -> Option<(GithubRemote, String)> {
    let pushed = job.pushed_remote.as_deref()?;
    let mode = job.repo.as_ref().and_then(|r| cfg.pull_requests.get(r)).copied().unwrap_or_default();
    if mode == PrMode::Off {
        return None;
    }
    let remote = GithubRemote::parse(pushed)?;
    let mut apis: Vec<String> =
        cfg.sources.values().filter(|s| s.kind == SourceKind::Github).map(|s| s.api_url()).collect();
    if let Ok(env) = std::env::var("DEVPILOT_GITHUB_API_URL") {
        apis.push(env);
    }
    let api = api_for(&remote, &apis);
    if api.is_none() {
        tracing::info!(job = job.id, host = %remote.host, "the job's remote is not on GitHub: no pull request");
    }
    Some((remote, api?))
}

/// The pull request: the job's branch onto its base, the issue's title, the summary (inert:
/// a `Fixes #2` in it closes nothing), and DevPilot's own line that closes or names the issue.
fn ask_of(cfg: &SourcesCfg, job: &JobRow, payload: &Value, remote: GithubRemote) -> PullAsk {
    let spec = JobSpec::parse(payload).ok();
    let branch = spec.as_ref().map(|s| s.branch(job.id)).unwrap_or_else(|| format!("devpilot/{}", job.id));
    let base = spec.and_then(|s| s.base);
    let mode = job.repo.as_ref().and_then(|r| cfg.pull_requests.get(r)).copied().unwrap_or_default();
    let summary = job.summary.as_deref().filter(|s| !s.trim().is_empty());
    let mut body = summary.map(super::render::inert).unwrap_or_default();
    if let Some(issue) = github::IssueRef::of(payload) {
        let same = issue.repo.eq_ignore_ascii_case(&remote.full_name());
        let closes =
            if same { format!("Closes #{}", issue.number) } else { format!("Closes {}#{}", issue.repo, issue.number) };
        body = format!("{body}\n\n{closes}");
    } else if let Some(url) = payload.pointer("/source/url").and_then(Value::as_str) {
        body = format!("{body}\n\nLinear issue: {url}");
    }
    body.push_str(&format!("\n\nOpened by DevPilot for job #{} ({}).", job.id, cfg.machine));
    PullAsk {
        remote,
        branch,
        base,
        title: job.title.clone().unwrap_or_else(|| format!("DevPilot job #{}", job.id)),
        body: body.trim().to_string(),
        draft: mode != PrMode::Ready,
    }
}

/// The number of the pull request at `url` (`…/pull/8`).
fn number_of(url: &str) -> Option<i64> {
    url.trim_end_matches('/').rsplit_once("/pull/")?.1.parse().ok()
}

/// Links the PR on the source's issue (bound to the source: [`bind`]), the comment's marker
/// signed with the orchestrator's key.
async fn link(
    client: &TrackerClient,
    d: &Delivery,
    issue: &Target,
    url: &str,
    (key, orch): (&MacKey, &str),
) -> Result<(), TrackerError> {
    match (client, issue) {
        (TrackerClient::Linear(c), Target::Linear(issue)) => linear::attach(c, issue, url, "Pull request").await,
        (TrackerClient::Github(c), Target::Github(issue)) => {
            let marker = mac::CommentMarker::new(key, orch, &issue.repo, issue.number, d);
            let body = format!("Opened a pull request: {url}");
            github::post_once(c, issue, &body, &marker, github::Try::of(d)).await
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::keys::{ApiKey, KeyStore};
    use super::*;

    /// Closing keywords in the summary sit in its inert block and close nothing; the one
    /// `Closes` line outside it is DevPilot's, for the job's own issue.
    #[test]
    fn only_devpilots_own_line_closes_an_issue() {
        let cfg = SourcesCfg {
            orchestrator_id: "o".into(),
            machine: "m".into(),
            sources: Default::default(),
            max_attempts: 3,
            keys: KeyStore::Given(ApiKey::given("k")),
            pull_requests: Default::default(),
            review_loops: Default::default(),
            remotes: Default::default(),
        };
        let summary = "Fixes #2, closes acme/webapp#3\r# Resolves #4 @acme/owners";
        let job = JobRow { summary: Some(summary.into()), ..super::super::render::tests::job_row() };
        let payload = serde_json::json!({"source": {"kind": "github", "repo": "acme/webapp", "number": 1}});
        let remote = GithubRemote::parse("https://github.com/acme/webapp.git").unwrap();
        let body = ask_of(&cfg, &job, &payload, remote).body;
        let mut blocks = body.split("```");
        let (before, inside, after) = (blocks.next().unwrap(), blocks.next().unwrap(), blocks.next().unwrap());
        assert!(before.is_empty() && blocks.next().is_none(), "one block, first: {body}");
        assert!(inside.contains("Fixes #2") && inside.contains("# Resolves #4") && !inside.contains('\r'), "{body}");
        assert_eq!(after.matches('#').count(), 2, "only DevPilot's line and job number: {body}");
        assert!(after.contains("\n\nCloses #1\n\nOpened by DevPilot for job #7 (m)."), "{body}");
    }
}
