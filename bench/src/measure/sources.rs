//! (k) the idle cost of a tracker source: one Linear source (the harness's loopback
//! stand-in, with no issues), and 1 or 20 idle machines that all have it configured. What
//! PostgreSQL receives per minute (all statements, and those on `sources` and `outbox`),
//! and how many requests reach the tracker per minute: the fleet's intake turn keeps that
//! at one per interval, however many machines there are.

use std::time::{Duration, Instant};

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::orchestrator::{self, RunConfig, StopMode};
use devpilot_engine::sources::{KeyStore, ApiKey, SourceSettings};
use devpilot_engine::span::Span;
use devpilot_store::Queue;
use devpilot_tests::LinearStandIn;
use serde_json::{json, Value};

use crate::common::{connect, exec, log, scalar, Backend, Env, Plan, ORCH};

/// Every interval is scaled down this much: the source's 60 s interval becomes 3 s.
const SCALE: u32 = 20;
const KEY: &str = "lin_api_bench_key";

/// The fleet sizes measured.
const FLEETS: [usize; 2] = [1, 20];

pub async fn sources(env: &Env, plan: &Plan) -> Value {
    let mut out = vec![];
    for n in FLEETS {
        out.push(fleet(env, plan, n).await);
    }
    json!({ "scale": SCALE, "interval_secs": 60, "fleets": out })
}

/// A machine of the idle fleet, with every interval scaled down and the source configured.
fn machine_cfg(i: usize, api_url: &str, dir: &std::path::Path) -> RunConfig {
    let mut cfg = RunConfig::new(ORCH, &format!("m{i}"), AgentSpec::NoOp, dir.join(format!("m{i}")));
    cfg.poll_interval = Duration::from_secs(2) / SCALE;
    cfg.max_poll_interval = Duration::from_secs(300) / SCALE;
    cfg.presence_every = Duration::from_secs(30) / SCALE;
    cfg.sweep_every = Duration::from_secs(60) / SCALE;
    let source = SourceSettings {
        teams: vec!["ENG".into()],
        api_url: Some(api_url.into()),
        interval: Span::from(Duration::from_secs(60) / SCALE),
        ..SourceSettings::default()
    };
    cfg.sources = [("eng".to_string(), source)].into_iter().collect();
    cfg.keys = KeyStore::Given(ApiKey::given(KEY));
    cfg
}

async fn fleet(env: &Env, plan: &Plan, n: usize) -> Value {
    let url = env.fresh(Backend::Pg).await;
    let dbname = Env::dbname(&url);
    let standin = LinearStandIn::start(KEY);
    let dir = env.tmp.join(format!("sources-{n}"));
    let mut machines = vec![];
    for i in 0..n {
        let q = Queue::new(connect(&url, 1).await);
        let (h, _j) = orchestrator::spawn(q.clone(), machine_cfg(i, &standin.url(), &dir), None);
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
    let source_calls_sql =
        format!("{calls_sql} AND s.query ~* '^\\s*(with taken as \\(\\s*)?(update|insert into|select .* from) (sources|outbox)'");
    exec(&env.admin, "SELECT pg_stat_clear_snapshot()").await;
    let (all0, src0, req0) =
        (scalar(&env.admin, &calls_sql).await, scalar(&env.admin, &source_calls_sql).await, standin.requests().len());
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(plan.idle_window.max(30))).await;
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    let all = (scalar(&env.admin, &calls_sql).await - all0) as f64;
    let src = (scalar(&env.admin, &source_calls_sql).await - src0) as f64;
    let requests = (standin.requests().len() - req0) as f64;
    for (h, q) in machines {
        h.stop(StopMode::HandOff).await;
        q.connection().clone().close().await.ok();
    }
    let _ = std::fs::remove_dir_all(&dir);
    // Per unscaled minute: the scaled fleet lives SCALE minutes in each of ours.
    let per_min = |x: f64| x / minutes / f64::from(SCALE);
    let v = json!({
        "machines": n, "window_secs": minutes * 60.0,
        "statements_per_min": per_min(all),
        "source_statements_per_min": per_min(src),
        "tracker_requests_per_min": per_min(requests),
        "rejected_requests": standin.rejected().len(),
    });
    log(format!("  sources, {n} machines: {v}"));
    v
}
