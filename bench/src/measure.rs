//! Measurements a to h. Every figure is collected into one JSON value that the report renders.
//!
//! - `pgbench`: (a) the claim statement alone, (a') the previous pick, and both picks' plans.
//! - `claims`: (b) the article's naive path and (c) `claim_next`.
//! - `drain`: (d) the full job cycle and (e) the same with `/bin/true` as the agent.
//! - `latency`: (f) pickup latency. `idle`: (g) the idle cost of one machine.
//!
//! The agent path as a user runs it, the peers, the fleet, (v) and (l) are in
//! [`crate::agent_path`], [`crate::peers`], [`crate::fleet`], [`crate::versus`] and
//! [`crate::governor`]; (h) repeats b to f on SQLite.

mod claims;
pub(crate) mod drain;
mod idle;
pub(crate) mod latency;
mod pgbench;
mod sources;

use std::path::PathBuf;
use std::time::Instant;

use devpilot_store::db::{self, DbUrl};
use sea_orm::{ConnectionTrait, Statement};
use serde_json::{json, Value};

use crate::cluster;
use crate::common::{connect, exec, log, now_utc, Backend, Env, Plan};
use claims::{claim_matrix, Mode};
use drain::{drain, drain_matrix};
use latency::latency;
use pgbench::{pgbench_all, pgbench_script, pick_plans, previous_pick_script, PREVIOUS_PICK_INDEX};

const QUICK: Plan = Plan {
    secs: 1,
    repeats: 1,
    pgbench_prefill: 30_000,
    drain_jobs_pg: 2_000,
    drain_jobs_sqlite: 1_000,
    agent_jobs: 300,
    latency_samples: 20,
    poll_samples: 5,
    idle_window: 8,
    peer_idle_window: 20,
};

const FULL: Plan = Plan {
    secs: 3,
    repeats: 3,
    pgbench_prefill: 120_000,
    drain_jobs_pg: 12_000,
    drain_jobs_sqlite: 6_000,
    agent_jobs: 4_000,
    latency_samples: 200,
    poll_samples: 30,
    idle_window: 30,
    peer_idle_window: 130,
};

/// Runs everything; returns the figures and the directories to delete once they are saved.
pub async fn run_all(quick: bool) -> (Value, Vec<PathBuf>) {
    let plan = if quick { QUICK } else { FULL };
    let started = Instant::now();
    let (env, version) = start().await;
    let mut out = header(&plan, quick, version);

    if std::env::var("DEVPILOT_BENCH_ONLY").as_deref() == Ok("sources") {
        // For working on the sources measurement alone (a partial report).
        out["k"] = sources::sources(&env, &plan).await;
        env.pg.stop();
        return (out, vec![env.pg.dir.clone(), env.tmp.clone()]);
    }
    if std::env::var("DEVPILOT_BENCH_ONLY").as_deref() == Ok("versus") {
        // For working on section (v) alone (a partial report).
        out["versus"] = crate::versus::measure(&env, &plan).await;
        out["versus"]["date"] = json!(now_utc());
        env.pg.stop();
        return (out, vec![env.pg.dir.clone(), env.tmp.clone()]);
    }
    if std::env::var("DEVPILOT_BENCH_ONLY").as_deref() == Ok("fleet") {
        // For working on the fleet measurements alone (a partial report).
        let fleet_plan = if quick { &crate::fleet::QUICK } else { &crate::fleet::FULL };
        out["fleet_idle"] = crate::fleet::idle(&env, fleet_plan).await;
        out["fleet_listening"] = crate::fleet::listening(&env, fleet_plan).await;
        env.pg.stop();
        return (out, vec![env.pg.dir.clone(), env.tmp.clone()]);
    }
    claims_on_postgres(&env, &plan, &mut out).await;
    log("(l) the claim with the governor: on against off, alternated rounds");
    out["governor"] = crate::governor::measure(&env, &plan).await;
    drains_on_postgres(&env, &plan, &mut out).await;
    log("(f) pickup latency");
    out["f"] = json!({
        "notify": latency(&env, Backend::Pg, true, plan.latency_samples).await,
        "poll_only": latency(&env, Backend::Pg, false, plan.poll_samples).await,
    });
    log("(g) idle cost");
    out["g"] = idle::idle(&env, &plan).await;
    log("(k) the idle cost of a tracker source: 1 and 20 machines");
    out["k"] = sources::sources(&env, &plan).await;
    log("(p) the peers: Graphile Worker and pg-boss on the same cluster");
    out["peers"] = crate::peers::all(&env, &plan).await;
    log("(v) issue 25: alternated rounds against Graphile Worker and the machine's spawn limit");
    out["versus"] = crate::versus::measure(&env, &plan).await;
    out["versus"]["date"] = json!(now_utc());
    log("(s) the agent sandbox's cost: confined against --sandbox off, alternated rounds");
    out["sandbox"] = crate::sandbox::measure(&env, &plan).await;
    log("(w) what a user feels: label to agent, agent to comment and PR, two machines");
    out["user_latency"] = crate::user_latency::measure(&env, quick).await;
    out["user_latency"]["date"] = json!(now_utc());
    log("(x) the hand-off under load: a 200 MB repository over a 10 Mbit/s link");
    out["handoff_load"] = crate::handoff_load::measure(&env, quick).await;
    out["handoff_load"]["date"] = json!(now_utc());
    let fleet_plan = if quick { &crate::fleet::QUICK } else { &crate::fleet::FULL };
    log("(i) one PostgreSQL, thousands of machines: an idle pooled fleet");
    out["fleet_idle"] = crate::fleet::idle(&env, fleet_plan).await;
    log("(j) a listening fleet: pickup and the cost of one NOTIFY");
    out["fleet_listening"] = crate::fleet::listening(&env, fleet_plan).await;
    log("(h) SQLite");
    out["h"] = json!({
        "c_single": claim_matrix(&env, Backend::Sqlite, Mode::Pick(1), &plan).await,
        "c_batched": claim_matrix(&env, Backend::Sqlite, Mode::Pick(16), &plan).await,
        "d": drain_matrix(&env, Backend::Sqlite, plan.drain_jobs_sqlite, &plan).await,
        "f": { "poll_only": latency(&env, Backend::Sqlite, false, plan.poll_samples).await },
    });
    out["total_secs"] = json!(started.elapsed().as_secs_f64());
    out["loadavg_at_end"] = json!(std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
    env.admin.clone().close().await.ok();
    env.pg.stop();
    (out, vec![env.pg.dir.clone(), env.tmp.clone()])
}

/// Starts the cluster, with pg_stat_statements and the migrated template `bench_tmpl`;
/// returns the run's environment and the server's version.
/// (s) alone, on a cluster of its own: the `sandbox` subcommand. Returns the section and the
/// directories to remove.
pub async fn sandbox_only(quick: bool) -> (Value, Vec<PathBuf>) {
    let plan = if quick { QUICK } else { FULL };
    let (env, _) = start().await;
    log("(s) the agent sandbox's cost: confined against --sandbox off, alternated rounds");
    let mut s = crate::sandbox::measure(&env, &plan).await;
    s["date"] = json!(now_utc());
    env.pg.stop();
    (s, vec![env.pg.dir.clone(), env.tmp.clone()])
}

/// (w) alone, on a cluster of its own: the `latency` subcommand. Returns the section and the
/// directories to remove.
pub async fn latency_only(quick: bool) -> (Value, Vec<PathBuf>) {
    let (env, version) = start().await;
    let started = Instant::now();
    let mut w = crate::user_latency::measure(&env, quick).await;
    w["date"] = json!(now_utc());
    w["postgres"] = json!(version);
    w["secs"] = json!(started.elapsed().as_secs_f64());
    env.admin.clone().close().await.ok();
    env.pg.stop();
    (w, vec![env.pg.dir.clone(), env.tmp.clone()])
}

/// (x) alone, on a cluster of its own: the `handoff` subcommand. Returns the section and the
/// directories to remove.
pub async fn handoff_only(quick: bool) -> (Value, Vec<PathBuf>) {
    let (env, version) = start().await;
    let started = Instant::now();
    log("(x) the hand-off under load: a 200 MB repository over a 10 Mbit/s link");
    let mut x = crate::handoff_load::measure(&env, quick).await;
    x["date"] = json!(now_utc());
    x["postgres"] = json!(version);
    x["secs"] = json!(started.elapsed().as_secs_f64());
    env.admin.clone().close().await.ok();
    env.pg.stop();
    (x, vec![env.pg.dir.clone(), env.tmp.clone()])
}

/// (l) alone, on a cluster of its own: the `governor` subcommand. Returns the section and
/// the directories to remove.
pub async fn governor_only(quick: bool) -> (Value, Vec<PathBuf>) {
    let plan = if quick { QUICK } else { FULL };
    let started = Instant::now();
    let (env, version) = start().await;
    log("(l) the claim with the governor: on against off, alternated rounds");
    let mut l = crate::governor::measure(&env, &plan).await;
    l["date"] = json!(now_utc());
    l["postgres"] = json!(version);
    l["secs"] = json!(started.elapsed().as_secs_f64());
    l["loadavg"] = json!(std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
    env.admin.clone().close().await.ok();
    env.pg.stop();
    (l, vec![env.pg.dir.clone(), env.tmp.clone()])
}

async fn start() -> (Env, String) {
    let pg = cluster::start();
    log(format!("PostgreSQL on port {} in {}", pg.port, pg.dir.display()));
    let admin = connect(&pg.url("postgres"), 1).await;
    exec(&admin, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await;
    exec(&admin, "CREATE DATABASE bench_tmpl").await;
    {
        let url = pg.url("bench_tmpl");
        let c = connect(&url, 1).await;
        db::migrate(&DbUrl::parse(&url).unwrap(), &c).await.unwrap();
        c.close().await.unwrap();
    }
    let version = {
        let r = admin
            .query_one_raw(Statement::from_string(sea_orm::DbBackend::Postgres, "SELECT version() AS v"))
            .await
            .unwrap()
            .unwrap();
        r.try_get::<String>("", "v").unwrap()
    };
    let tmp = tempfile::Builder::new().prefix("devpilot-bench-").tempdir().unwrap().keep();
    (Env::new(pg, admin, tmp), version)
}

/// The run's description: when, on what machine, which server and settings, which plan.
fn header(plan: &Plan, quick: bool, version: String) -> Value {
    json!({
        "date": now_utc(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": cpu_model(),
        "loadavg_at_start": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "postgres": version,
        "pg_settings": cluster::SETTINGS.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "plan": { "claim_secs": plan.secs, "repeats": plan.repeats, "quick": quick },
    })
}

/// (a), (a'), the pick's plans, (b) and (c) on PostgreSQL.
async fn claims_on_postgres(env: &Env, plan: &Plan, out: &mut Value) {
    log("(a) pgbench: the SKIP LOCKED claim statement alone");
    out["a"] = pgbench_all(env, plan, &pgbench_script(), &[]).await;
    log("(a') pgbench: the previous pick (FIFO by created_at, on its own index), for an A/B in this run");
    out["a_previous"] = pgbench_all(env, plan, &previous_pick_script(), PREVIOUS_PICK_INDEX).await;
    log("the pick's plan: EXPLAIN (ANALYZE, BUFFERS) after some claims");
    out["pick_plan"] = pick_plans(env, plan).await;
    log("(b) the article's naive path");
    out["b"] = claim_matrix(env, Backend::Pg, Mode::Naive, plan).await;
    log("(c) claim_next single and batched");
    out["c_single"] = claim_matrix(env, Backend::Pg, Mode::Pick(1), plan).await;
    out["c_batched"] = claim_matrix(env, Backend::Pg, Mode::Pick(16), plan).await;
}

/// (d), (e) and (e) as a user runs it, on PostgreSQL.
async fn drains_on_postgres(env: &Env, plan: &Plan, out: &mut Value) {
    log("(d) full job cycle through the orchestrator loop");
    out["d"] = drain_matrix(env, Backend::Pg, plan.drain_jobs_pg, plan).await;
    log("(e) the same drain with /bin/true as the agent");
    let mut e = vec![];
    for procs in [1, 4] {
        for batched in [false, true] {
            e.push(drain(env, Backend::Pg, 32, procs, batched, "/bin/true", plan.agent_jobs, false).await);
        }
    }
    out["e"] = json!(e);
    log("(e) as a user runs it: 4 `devpilot run` processes x concurrency 8, a /bin/sh agent per job");
    out["e_cli"] = crate::agent_path::measure(env, plan).await;
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default()
}
