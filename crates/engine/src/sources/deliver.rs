//! Delivering the outbox: take a due row (a conditional UPDATE: another machine may have
//! it), say what its event says on the issue, and finish the row fenced by the delivery's
//! token. A tracker that is down ends the pass and the rows wait, retried with backoff.

use std::time::Duration;

use super::bind::{self, Target};
use super::ending::{backoff, ending, refused};
use super::error::TrackerError;
use super::github;
use super::health::SourcesCfg;
use super::intake::Bound;
use super::linear;
use super::mac;
use super::render;
use super::tracker::TrackerClient;
use devpilot_store::job::event;
use devpilot_store::queue::{Delivery, DeliveryEnd, Queue};
use devpilot_store::spec::JobSpec;

/// How long a machine holds a row it is delivering before another may take it, at least: a
/// delivery makes up to seven calls, so the lease is also at least eight call timeouts.
pub const DELIVERY_LEASE: Duration = Duration::from_secs(120);

/// The lease of a delivery pass over sources whose calls may take up to `timeout` each.
fn lease_for(timeout: Duration) -> Duration {
    DELIVERY_LEASE.max(timeout * 8)
}
/// The most rows one pass delivers: the rest go on the next.
const PER_PASS: usize = 50;

pub use super::keys::GithubTokens;

/// Delivers the due rows of the `ready` sources (those this machine has a client for);
/// `github`: this machine's GitHub tokens by API host, for the pull requests. `Ok`: how
/// long until the next row can be taken, if one waits (a retry, or another machine's
/// lease). A failure of the tracker itself (a refused key, no answer, a rate limit) ends
/// the pass, with the source it happened on.
pub async fn deliver_pending(
    queue: &Queue,
    cfg: &SourcesCfg,
    ready: &[(Bound, TrackerClient)],
    github: &GithubTokens,
) -> Result<Option<Duration>, (String, TrackerError)> {
    let ids: Vec<i64> = ready.iter().map(|(b, _)| b.id).collect();
    let slowest = ready.iter().map(|(b, _)| b.settings.timeout.get()).max().unwrap_or_default();
    let lease = lease_for(slowest);
    for _ in 0..PER_PASS {
        let d = match queue.take_delivery(&cfg.orchestrator_id, &ids, &cfg.machine, lease).await {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(next_due(queue, cfg, &ids, lease).await),
            Err(e) => {
                tracing::warn!(error = %e, "could not take an outbox row");
                return Ok(None);
            }
        };
        let Some((source, client)) = ready.iter().find(|(b, _)| b.id == d.source_id) else { continue };
        let (end, stop) = deliver_one(queue, cfg, source, client, &d, github).await;
        match queue.finish_delivery(&d, &end).await {
            Ok(true) => tracing::info!(job = d.job_id, event = %d.event, outcome = ?outcome(&end), "outbox row"),
            Ok(false) => tracing::info!(job = d.job_id, "another machine took this outbox row meanwhile"),
            Err(e) => tracing::warn!(error = %e, job = d.job_id, "could not finish an outbox row; it is retried"),
        }
        if let Some(e) = stop {
            return Err((source.name.clone(), e));
        }
    }
    // A full pass: the rest go on the next, at once.
    Ok(Some(Duration::ZERO))
}

/// When the pass that found nothing to take should look again; `None`: nothing waits, or
/// the database could not say (the next interval's pass looks anyway).
async fn next_due(queue: &Queue, cfg: &SourcesCfg, ids: &[i64], lease: Duration) -> Option<Duration> {
    match queue.next_delivery_in(&cfg.orchestrator_id, ids, lease).await {
        // A row due now that this pass could not take was taken (or locked) by another
        // machine this instant, or fell due since: a second's rest, not a spin.
        Ok(due) => due.map(|d| d.max(Duration::from_secs(1))),
        Err(e) => {
            tracing::warn!(error = %e, "could not read when the next outbox row is due");
            None
        }
    }
}

/// One row: what to do with it next, and the tracker's error if it should end the pass.
async fn deliver_one(
    queue: &Queue,
    cfg: &SourcesCfg,
    source: &Bound,
    client: &TrackerClient,
    d: &Delivery,
    github: &GithubTokens,
) -> (DeliveryEnd, Option<TrackerError>) {
    let (job, payload) = match queue.job(d.job_id).await {
        Ok(Some(j)) => j,
        Ok(None) => {
            return (DeliveryEnd::GiveUp { error: "the job was deleted before its report went out".into() }, None)
        }
        Err(e) => return (DeliveryEnd::Retry { after: backoff(d.tries), error: e.to_string() }, None),
    };
    let target = match target(queue, source, client, d, &payload).await {
        Ok(t) => t,
        Err(end) => return end,
    };
    if d.event == event::FOLLOW_UP_ANSWERS || d.event == event::HANDED_BACK {
        let a = super::review::answer::Answering {
            queue,
            orchestrator_id: &cfg.orchestrator_id,
            machine: &cfg.machine,
            tokens: github,
            timeout: source.settings.timeout.get(),
        };
        let (end, stop) = super::review::answer::deliver(&a, d, &job).await;
        // GitHub's trouble ends the pass only for a GitHub source.
        return (end, stop.filter(|_| source.settings.kind == super::settings::SourceKind::Github));
    }
    if d.event == event::PULL_REQUEST {
        return super::pull::deliver(queue, cfg, source, client, d, (&job, &payload, &target), github).await;
    }
    let branch = JobSpec::parse(&payload).map(|s| s.branch(job.id)).unwrap_or_default();
    let report = render::report(d, &job, &branch, &source.settings);
    if report == render::Report::default() {
        return (DeliveryEnd::Delivered, None);
    }
    let first = d.tries <= 1;
    let key = match queue.mac_key(&cfg.orchestrator_id).await {
        Ok(k) => k,
        Err(e) => return (DeliveryEnd::Retry { after: backoff(d.tries), error: e.to_string() }, None),
    };
    let orch = &cfg.orchestrator_id;
    let done = match (client, &target) {
        (TrackerClient::Linear(c), Target::Linear(issue)) => {
            let id = mac::comment_id(&key, orch, &issue.id, d);
            linear::deliver(c, issue, &report, &id, first).await
        }
        (TrackerClient::Github(c), Target::Github(issue)) => {
            let marker = mac::CommentMarker::new(&key, orch, &issue.repo, issue.number, d);
            github::deliver(c, issue, &report, &marker, github::Try::of(d), &source.settings.report.working_label).await
        }
        _ => return refused(format!("source '{}' has no client for the job's tracker", source.name)),
    };
    ending(done, d)
}

/// The issue row `d` may act on: a state change of its job wrote the row, and the issue is
/// the source's own ([`bind`]); else how the row ends, acting on nothing.
async fn target(
    queue: &Queue,
    source: &Bound,
    client: &TrackerClient,
    d: &Delivery,
    payload: &serde_json::Value,
) -> Result<Target, (DeliveryEnd, Option<TrackerError>)> {
    match queue.witnessed(d).await {
        Ok(true) => {}
        Ok(false) => return Err(refused(format!("no state change of job #{} wrote this outbox row", d.job_id))),
        Err(e) => return Err((DeliveryEnd::Retry { after: backoff(d.tries), error: e.to_string() }, None)),
    }
    let named = bind::issue_of(&source.name, &source.settings, payload).map_err(refused)?;
    let (Target::Linear(issue), TrackerClient::Linear(c)) = (&named, client) else { return Ok(named) };
    match linear::own_issue(c, issue, &source.settings.teams).await {
        Ok(Ok(own)) => Ok(Target::Linear(own)),
        Ok(Err(why)) => Err(refused(why)),
        Err(e) => Err(ending(Err(e), d)),
    }
}

fn outcome(end: &DeliveryEnd) -> &'static str {
    match end {
        DeliveryEnd::Delivered => "delivered",
        DeliveryEnd::Retry { .. } => "retry",
        DeliveryEnd::GiveUp { .. } => "gave up",
        DeliveryEnd::Refused { .. } => "refused",
    }
}
