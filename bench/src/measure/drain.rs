//! (d) the full job cycle through the orchestrator loop, and (e) the same with `/bin/true` as
//! the agent: pre-filled jobs drained by worker processes, with their CPU and statements.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sea_orm::DatabaseConnection;
use serde_json::{json, Value};

use crate::cluster;
use crate::common::{connect, exec, log, median, prefill, scalar, top_statements, Backend, Env, Plan, ORCH};

/// 1 while any job is queued or running, else 0; served by the pick and running indexes.
/// (Written for both backends: bigint so it decodes as i64 on PostgreSQL.)
const OPEN_JOBS: &str = "SELECT CASE WHEN EXISTS (SELECT 1 FROM dispatch_queue WHERE claimed_at IS NULL AND state IN ('queued','failed'))
    OR EXISTS (SELECT 1 FROM dispatch_queue WHERE state = 'running') THEN CAST(1 AS BIGINT) ELSE CAST(0 AS BIGINT) END AS n";

pub async fn drain_matrix(env: &Env, backend: Backend, jobs: i64, plan: &Plan) -> Value {
    let mut rows = vec![];
    for claimers in [8usize, 32, 128] {
        for procs in [1usize, 4] {
            for batched in [false, true] {
                // The targets are read at 32 claimers: repeat those.
                let reps = if claimers == 32 { plan.repeats } else { 1 };
                let mut runs = vec![];
                for r in 0..reps {
                    let profile = backend == Backend::Pg && claimers == 32 && procs == 1 && r == 0;
                    runs.push(drain(env, backend, claimers, procs, batched, "noop", jobs, profile).await);
                }
                let rate = median(runs.iter().map(|r| r["jobs_per_s"].as_f64().unwrap()).collect());
                log(format!(
                    "  {} drain {claimers} claimers, {procs} proc, {}: {rate:.0} jobs/s",
                    backend.name(),
                    if batched { "batched" } else { "single" }
                ));
                rows.push(json!({
                    "claimers": claimers, "processes": procs, "batched": batched,
                    "jobs_per_s": rate, "runs": runs,
                }));
            }
        }
    }
    json!(rows)
}

/// Drains `jobs` pre-filled jobs with `claimers` slots spread over `procs` OS processes.
/// Single: one machine per slot (concurrency 1, so every claim statement claims one job).
/// Batched: machines of up to 16 slots, so a claim statement takes every free slot's job.
#[allow(clippy::too_many_arguments)]
pub async fn drain(
    env: &Env,
    backend: Backend,
    claimers: usize,
    procs: usize,
    batched: bool,
    agent: &str,
    jobs: i64,
    profile: bool,
) -> Value {
    let url = env.fresh(backend).await;
    let mon = connect(&url, 1).await;
    prefill(&mon, jobs).await;
    let per_proc = claimers / procs;
    let conc = if batched { per_proc.min(16) } else { 1 };
    let machines = per_proc / conc;
    let mut children = spawn_workers(env, &url, procs, machines, conc, agent).await;
    let pids: Vec<u32> = children.iter().map(|(c, _)| c.pid()).collect();
    if profile {
        exec(&env.admin, "SELECT pg_stat_statements_reset()").await;
    }
    let pg_cpu0 = if backend == Backend::Pg { cluster::postgres_cpu_ms() } else { 0.0 };
    let cli_cpu0: f64 = pids.iter().filter_map(|p| cluster::proc_cpu(*p)).map(|(_, ms)| ms).sum();
    let start = Instant::now();
    for (c, _) in children.iter_mut() {
        c.go().await;
    }
    let done = wait_drained(&mon, jobs, start).await;
    let elapsed = start.elapsed().as_secs_f64();
    let pg_cpu = if backend == Backend::Pg { cluster::postgres_cpu_ms() - pg_cpu0 } else { 0.0 };
    let cli_cpu: f64 = pids.iter().filter_map(|p| cluster::proc_cpu(*p)).map(|(_, ms)| ms).sum::<f64>() - cli_cpu0;
    let statements = if profile { top_statements(env, &Env::dbname(&url)).await } else { json!(null) };
    let mut stats = vec![];
    for (c, dir) in children {
        stats.push(c.stop().await);
        let _ = std::fs::remove_dir_all(dir);
    }
    let sum = |k: &str| stats.iter().filter_map(|s| s[k].as_u64()).sum::<u64>();
    mon.close().await.ok();
    json!({
        "jobs": jobs, "completed": done, "secs": elapsed, "jobs_per_s": done as f64 / elapsed,
        "claimers": claimers, "processes": procs, "machines_per_process": machines, "concurrency": conc,
        "agent": agent, "batched": batched,
        "claim_queries": sum("claim_queries"), "polls": sum("polls"), "heartbeats": sum("heartbeats"),
        "jobs_per_claim_query": done as f64 / sum("claim_queries").max(1) as f64,
        "cpu_ms_per_1k_jobs": { "postgres": pg_cpu / done.max(1) as f64 * 1000.0, "clients": cli_cpu / done.max(1) as f64 * 1000.0 },
        "cpu_busy_fraction": (pg_cpu + cli_cpu) / 1000.0 / elapsed / std::thread::available_parallelism().map(|n| n.get() as f64).unwrap_or(1.0),
        "top_statements": statements,
    })
}

/// Spawns `procs` worker processes (`devpilot-bench worker`), each running `machines`
/// machines of `conc` slots with `agent`; returns them with their data dirs.
async fn spawn_workers(
    env: &Env,
    url: &str,
    procs: usize,
    machines: usize,
    conc: usize,
    agent: &str,
) -> Vec<(crate::worker::Proc, PathBuf)> {
    let n = env.next();
    let mut children = vec![];
    for p in 0..procs {
        let dir = env.tmp.join(format!("drain{n}-p{p}"));
        let args: Vec<String> = [
            "--orch",
            ORCH,
            "--name",
            &format!("p{p}"),
            "--machines",
            &machines.to_string(),
            "--concurrency",
            &conc.to_string(),
            "--agent",
            agent,
            "--data-dir",
            &dir.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        children.push((crate::worker::Proc::spawn(url, &args).await, dir));
    }
    children
}

/// Waits (up to 180 s from `start`) until `jobs` jobs are completed; returns how many are.
async fn wait_drained(mon: &DatabaseConnection, jobs: i64, start: Instant) -> i64 {
    let limit = Duration::from_secs(180);
    let mut done = 0;
    while start.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The monitor shares the server with what it measures, so it asks the cheap question
        // every 10 ms (is any job still open? two partial-index probes) and counts the
        // completed jobs only when the answer is no. Counting every 10 ms was a full scan each
        // time: 22-30 % of the statement time in the drain profiles, charged to the drain.
        if scalar(mon, OPEN_JOBS).await > 0 {
            continue;
        }
        done = scalar(mon, "SELECT count(*) AS n FROM dispatch_queue WHERE state = 'completed'").await;
        if done >= jobs {
            break;
        }
    }
    done
}
