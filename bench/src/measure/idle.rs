//! (g) the idle cost of one machine: statements, transactions and connections at the
//! backoff ceiling, with every interval scaled down.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::orchestrator::{self, RunConfig, StopMode};
use devpilot_store::db::DbUrl;
use devpilot_store::Queue;
use serde_json::{json, Value};

use crate::common::{connect, exec, log, median, scalar, top_statements, Backend, Env, Plan, ORCH};

/// An idle machine (LISTEN on, nothing to do) with every interval scaled down 100x so its
/// backoff reaches the ceiling in seconds: poll 20 ms (2 s), ceiling 3 s (5 min), presence
/// 300 ms (30 s), sweep 600 ms (60 s). Every statement the machine sends in the window at the
/// ceiling is counted by pg_stat_statements; per poll, that is what the unscaled machine sends
/// every 5 minutes (presence and sweep intervals are shorter than the ceiling in both).
pub async fn idle(env: &Env, plan: &Plan) -> Value {
    let url = env.fresh(Backend::Pg).await;
    let dbname = Env::dbname(&url);
    let q = Queue::new(connect(&url, 1).await);
    let dir = env.tmp.join("idle");
    let mut cfg = RunConfig::new(ORCH, "idle", AgentSpec::NoOp, dir.clone());
    let scale = 100u32;
    cfg.poll_interval = Duration::from_secs(2) / scale;
    cfg.max_poll_interval = Duration::from_secs(300) / scale;
    cfg.presence_every = Duration::from_secs(30) / scale;
    cfg.sweep_every = Duration::from_secs(60) / scale;
    let hints = devpilot_store::listen::spawn(&DbUrl::parse(&url).unwrap(), ORCH, &q);
    let (h, _j) = orchestrator::spawn(q.clone(), cfg.clone(), hints);
    // Backoff 20 ms doubling to 3 s: at the ceiling after ~5.1 s; warm up past it.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let calls_sql = format!(
        "SELECT coalesce(sum(calls), 0)::bigint AS n FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = '{dbname}'"
    );
    let xact_sql =
        format!("SELECT (xact_commit + xact_rollback)::bigint AS n FROM pg_stat_database WHERE datname = '{dbname}'");
    let conns_sql = format!("SELECT count(*)::bigint AS n FROM pg_stat_activity WHERE datname = '{dbname}'");
    exec(&env.admin, "SELECT pg_stat_clear_snapshot()").await;
    let calls0 = scalar(&env.admin, &calls_sql).await;
    let xact0 = scalar(&env.admin, &xact_sql).await;
    let polls0 = h.stats().polls.load(Ordering::Relaxed);
    let claims0 = h.stats().claim_queries.load(Ordering::Relaxed);
    let pres0 = h.stats().presence_writes.load(Ordering::Relaxed);
    let sweeps0 = h.stats().sweeps.load(Ordering::Relaxed);
    let checks0 = h.stats().sweep_checks.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let mut conns = vec![];
    while t0.elapsed() < Duration::from_secs(plan.idle_window) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        conns.push(scalar(&env.admin, &conns_sql).await);
    }
    let window = t0.elapsed().as_secs_f64();
    // pg_stat_database is flushed lazily by idle backends; give it a moment.
    let calls = scalar(&env.admin, &calls_sql).await - calls0;
    let polls = h.stats().polls.load(Ordering::Relaxed) - polls0;
    let claims = h.stats().claim_queries.load(Ordering::Relaxed) - claims0;
    let presence = h.stats().presence_writes.load(Ordering::Relaxed) - pres0;
    let sweeps = h.stats().sweeps.load(Ordering::Relaxed) - sweeps0;
    let sweep_checks = h.stats().sweep_checks.load(Ordering::Relaxed) - checks0;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    exec(&env.admin, "SELECT pg_stat_clear_snapshot()").await;
    let xacts = scalar(&env.admin, &xact_sql).await - xact0;
    let breakdown = top_statements(env, &dbname).await;
    h.stop(StopMode::HandOff).await;
    q.connection().clone().close().await.ok();
    let _ = std::fs::remove_dir_all(dir);
    let per_poll = calls as f64 / polls.max(1) as f64;
    let v = json!({
        "scale": scale, "window_secs": window, "polls": polls, "claim_queries": claims,
        "presence_writes": presence, "sweeps": sweeps, "sweep_checks": sweep_checks,
        "statements": calls, "transactions": xacts,
        "statements_per_poll": per_poll,
        "claim_queries_per_poll": claims as f64 / polls.max(1) as f64,
        "unscaled_ceiling_secs": 300,
        "unscaled_statements_per_min": per_poll * 60.0 / 300.0,
        "connections_max": conns.iter().copied().max().unwrap_or(0),
        "connections_median": median(conns.iter().map(|c| *c as f64).collect()),
        "statements_breakdown": breakdown,
    });
    log(format!("  idle: {v}"));
    v
}
