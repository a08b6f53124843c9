//! (k) the idle cost of a tracker source: one Linear source and one GitHub source (the
//! harness's loopback stand-ins), each on 1 or 20 idle machines that all have it configured.
//! Each tracker has one labelled issue, taken in the warm-up; its job is for a repo no machine
//! has, so it waits, and the source has a cursor: every turn measured is a steady state's
//! "what changed since" read. What PostgreSQL receives per minute (all statements, and those on
//! `sources` and `outbox`), and how many requests reach the tracker per hour: the fleet's
//! intake turn keeps that at one per interval, however many machines there are. For GitHub,
//! also how many of them were `304 Not Modified` (the stored `ETag` sent as `If-None-Match`
//! by whichever machine has the turn), which GitHub does not count against the rate limit.

use std::time::{Duration, Instant};

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::orchestrator::{self, RunConfig, StopMode};
use devpilot_engine::sources::{ApiKey, KeyStore, SourceKind, SourceSettings};
use devpilot_engine::span::Span;
use devpilot_store::Queue;
use devpilot_tests::{github, linear, GitHubStandIn, LinearStandIn};
use serde_json::{json, Value};

use crate::common::{connect, exec, log, scalar, Backend, Env, Plan, ORCH};

/// Every interval is scaled down this much: the source's 60 s interval becomes 3 s.
const SCALE: u32 = 20;
const KEY: &str = "lin_api_bench_key";
const TOKEN: &str = "ghp_bench_token";
/// The GitHub source's repository, and both sources' label.
const REPO: &str = "acme/webapp";
const LABEL: &str = "agent";
/// The DevPilot repo the sources' jobs are for: no machine of the fleet has it.
const MAPS_TO: &str = "webapp";

/// The fleet sizes measured.
const FLEETS: [usize; 2] = [1, 20];

pub async fn sources(env: &Env, plan: &Plan) -> Value {
    let mut out = vec![];
    for kind in [SourceKind::Linear, SourceKind::Github] {
        for n in FLEETS {
            out.push(fleet(env, plan, kind, n).await);
        }
    }
    json!({ "scale": SCALE, "interval_secs": 60, "fleets": out })
}

/// The tracker's stand-in.
enum StandIn {
    Linear(LinearStandIn),
    Github(GitHubStandIn),
}

/// What the stand-in saw from one point on.
#[derive(Default)]
struct Seen {
    requests: usize,
    /// Answered `304 Not Modified`.
    not_modified: usize,
    /// Sent `If-None-Match`.
    conditional: usize,
    /// Counted against the rate limit.
    counted: usize,
    /// Asked for what changed since the cursor (a `since`).
    since_cursor: usize,
}

impl StandIn {
    fn start(kind: SourceKind) -> Self {
        match kind {
            SourceKind::Linear => {
                let s = LinearStandIn::start(KEY);
                s.add_issue(linear::IssueSeed::new("Fix the login redirect", &[LABEL]));
                StandIn::Linear(s)
            }
            SourceKind::Github => {
                let s = GitHubStandIn::start(TOKEN);
                s.add_repo(REPO);
                s.open_issue(REPO, github::IssueSeed::new("Fix the login redirect", &[LABEL]));
                StandIn::Github(s)
            }
        }
    }

    fn url(&self) -> String {
        match self {
            StandIn::Linear(s) => s.url(),
            StandIn::Github(s) => s.url(),
        }
    }

    /// How many requests so far (the mark to count from).
    fn mark(&self) -> usize {
        match self {
            StandIn::Linear(s) => s.requests().len(),
            StandIn::Github(s) => s.recorded().len(),
        }
    }

    /// The requests after `mark`. A Linear request always counts (its API has no 304).
    fn since(&self, mark: usize) -> Seen {
        match self {
            StandIn::Linear(s) => {
                let requests = s.requests().len() - mark;
                Seen { requests, counted: requests, ..Default::default() }
            }
            StandIn::Github(s) => {
                let all = s.recorded();
                let recent = &all[mark.min(all.len())..];
                Seen {
                    requests: recent.len(),
                    not_modified: recent.iter().filter(|r| r.status == 304).count(),
                    conditional: recent.iter().filter(|r| r.conditional).count(),
                    counted: recent.iter().filter(|r| r.counted).count(),
                    since_cursor: recent.iter().filter(|r| r.query.iter().any(|(k, _)| k == "since")).count(),
                }
            }
        }
    }

    fn rejected(&self) -> usize {
        match self {
            StandIn::Linear(s) => s.rejected().len(),
            StandIn::Github(s) => s.rejected().len(),
        }
    }
}

/// The source each machine has: Linear's team ENG, or GitHub's `acme/webapp` with the label
/// `agent`; at the stand-in's address, its interval scaled down.
fn source_of(kind: SourceKind, api_url: &str) -> (String, SourceSettings) {
    let base = SourceSettings {
        kind,
        api_url: Some(api_url.into()),
        interval: Span::from(Duration::from_secs(60) / SCALE),
        ..SourceSettings::default()
    };
    match kind {
        SourceKind::Linear => {
            let repo_by_team = [("ENG".to_string(), MAPS_TO.to_string())].into_iter().collect();
            ("eng".into(), SourceSettings { teams: vec!["ENG".into()], label: LABEL.into(), repo_by_team, ..base })
        }
        SourceKind::Github => (
            "webapp".into(),
            SourceSettings { repo: REPO.into(), label: LABEL.into(), maps_to: MAPS_TO.into(), ..base },
        ),
    }
}

/// A machine of the idle fleet, with every interval scaled down and the source configured.
fn machine_cfg(i: usize, kind: SourceKind, api_url: &str, dir: &std::path::Path) -> RunConfig {
    let mut cfg = RunConfig::new(ORCH, &format!("m{i}"), AgentSpec::NoOp, dir.join(format!("m{i}")));
    cfg.poll_interval = Duration::from_secs(2) / SCALE;
    cfg.max_poll_interval = Duration::from_secs(300) / SCALE;
    cfg.presence_every = Duration::from_secs(30) / SCALE;
    cfg.sweep_every = Duration::from_secs(60) / SCALE;
    cfg.sources = [source_of(kind, api_url)].into_iter().collect();
    cfg.keys = KeyStore::Given(ApiKey::given(match kind {
        SourceKind::Linear => KEY,
        SourceKind::Github => TOKEN,
    }));
    cfg
}

async fn fleet(env: &Env, plan: &Plan, kind: SourceKind, n: usize) -> Value {
    let url = env.fresh(Backend::Pg).await;
    let dbname = Env::dbname(&url);
    let standin = StandIn::start(kind);
    let dir = env.tmp.join(format!("sources-{}-{n}", kind.as_str()));
    let mut machines = vec![];
    for i in 0..n {
        let q = Queue::new(connect(&url, 1).await);
        let (h, _j) = orchestrator::spawn(q.clone(), machine_cfg(i, kind, &standin.url(), &dir), None);
        machines.push((h, q));
    }
    // Past the idle backoff's ceiling (15 s scaled) and the first turns.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let calls_sql = format!(
        "SELECT coalesce(sum(calls), 0)::bigint AS n FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
          WHERE d.datname = '{dbname}'"
    );
    // The statements on the sources' own tables (every machine's claim also carries an
    // outbox CTE, which must not count here): a turn's try and end, a delivery's take.
    let source_calls_sql = format!(
        "{calls_sql} AND s.query ~* '^\\s*(with taken as \\(\\s*)?(update|insert into|select .* from) (sources|outbox)'"
    );
    exec(&env.admin, "SELECT pg_stat_clear_snapshot()").await;
    let (all0, src0, mark) =
        (scalar(&env.admin, &calls_sql).await, scalar(&env.admin, &source_calls_sql).await, standin.mark());
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(plan.idle_window.max(30))).await;
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    let all = (scalar(&env.admin, &calls_sql).await - all0) as f64;
    let src = (scalar(&env.admin, &source_calls_sql).await - src0) as f64;
    let seen = standin.since(mark);
    // The labelled issue's job, waiting for a machine with its repo.
    let jobs = match machines.first() {
        Some((_, q)) => scalar(q.connection(), "SELECT count(*) AS n FROM dispatch_queue WHERE state = 'queued'").await,
        None => 0,
    };
    for (h, q) in machines {
        h.stop(StopMode::HandOff).await;
        q.connection().clone().close().await.ok();
    }
    let _ = std::fs::remove_dir_all(&dir);
    // Per unscaled minute (hour): the scaled fleet lives SCALE minutes in each of ours.
    let per_min = |x: f64| x / minutes / f64::from(SCALE);
    let per_hour = |x: usize| per_min(x as f64) * 60.0;
    let github = kind == SourceKind::Github;
    let v = json!({
        "tracker": kind.as_str(),
        "machines": n, "window_secs": minutes * 60.0,
        "statements_per_min": per_min(all),
        "source_statements_per_min": per_min(src),
        "tracker_requests_per_min": per_min(seen.requests as f64),
        "tracker_requests_per_hour": per_hour(seen.requests),
        "tracker_requests_in_window": seen.requests,
        "not_modified_per_hour": github.then(|| per_hour(seen.not_modified)),
        "not_modified_in_window": github.then_some(seen.not_modified),
        "conditional_in_window": github.then_some(seen.conditional),
        "since_cursor_in_window": github.then_some(seen.since_cursor),
        "jobs_waiting": jobs,
        "counted_per_hour": per_hour(seen.counted),
        "rejected_requests": standin.rejected(),
    });
    log(format!("  sources, {} on {n} machines: {v}", kind.tracker()));
    v
}
