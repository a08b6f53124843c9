//! (v) Issue 25's comparisons, in alternated rounds: in each round ours and the other side
//! (Graphile Worker, or the machine's own spawn limit) run one after the other, A B A B, so a
//! noisy stretch of this shared machine hits both; each compared figure is the median of
//! `plan.repeats` rounds, and every run is kept.
//!
//! - The spawn limit: 32 threads, each starting `/bin/true` and waiting for it, as fast as they
//!   can, through std's spawn (`posix_spawn`: a `CLONE_VM` child, `execve`, `wait`); and, for
//!   reference, `xargs -P 32 -n 1 /bin/true`.
//! - The agent path: `devpilot run -c 32 -- /bin/true` (one process) and 4 × `-c 8`, against
//!   Graphile Worker running `execFile('/bin/true')` per job in its default and localQueue modes.
//! - The no-op drains at 32 workers, with PostgreSQL's CPU per 1,000 jobs: batched against
//!   Graphile's localQueue, one job per fetch against its default.
//! - Pickup p50 with NOTIFY, against Graphile's LISTEN.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::agent_path;
use crate::common::{log, median, Backend, Env, Plan};
use crate::measure::{drain, latency};
use crate::peers::run_peer;

/// Workers on every side: our slots, Graphile's concurrentJobs, the spawner's threads.
pub const WORKERS: usize = 32;

/// `jobs` runs of `/bin/true` by `WORKERS` threads, each spawning and waiting in a loop.
fn spawn_limit(jobs: i64) -> Value {
    let left = Arc::new(AtomicI64::new(jobs));
    let start = Instant::now();
    let threads: Vec<_> = (0..WORKERS)
        .map(|_| {
            let left = left.clone();
            std::thread::spawn(move || {
                let mut failed = 0;
                while left.fetch_sub(1, Ordering::Relaxed) > 0 {
                    let ok = std::process::Command::new("/bin/true").status().map(|s| s.success()).unwrap_or(false);
                    failed += usize::from(!ok);
                }
                failed
            })
        })
        .collect();
    let failed: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let secs = start.elapsed().as_secs_f64();
    json!({ "jobs": jobs, "failed": failed, "secs": secs, "jobs_per_s": jobs as f64 / secs, "how": "32 threads × std::process::Command(\"/bin/true\").status()" })
}

/// `seq jobs | xargs -P 32 -n 1 /bin/true`.
fn xargs(jobs: i64) -> Value {
    let start = Instant::now();
    let ok = std::process::Command::new("sh")
        .args(["-c", &format!("seq {jobs} | xargs -P {WORKERS} -n 1 /bin/true")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let secs = start.elapsed().as_secs_f64();
    json!({ "jobs": jobs, "ok": ok, "secs": secs, "jobs_per_s": jobs as f64 / secs, "how": "seq N | xargs -P 32 -n 1 /bin/true" })
}

/// One Graphile Worker drain of `jobs` at 32 workers: `batched` is its localQueue mode, else
/// its default (one job per fetch); `exec` runs `/bin/true` per job.
async fn graphile(env: &Env, jobs: i64, batched: bool, exec: bool) -> Value {
    let args: Vec<String> = [
        "--mode",
        if batched { "batched" } else { "single" },
        "--workers",
        &WORKERS.to_string(),
        "--jobs",
        &jobs.to_string(),
        "--task",
        if exec { "exec" } else { "noop" },
    ]
    .map(String::from)
    .into();
    run_peer(env, "graphile", "drain", &args, Duration::from_secs(600)).await
}

/// `DEVPILOT_BENCH_VERSUS=drains`: only the no-op drains, for trying a store change in a
/// few minutes. A full run never sets it.
fn drains_only() -> bool {
    std::env::var("DEVPILOT_BENCH_VERSUS").as_deref() == Ok("drains")
}

/// Every figure, `plan.repeats` alternated rounds: `{ runs: {name: [...]}, medians: {...} }`.
pub async fn measure(env: &Env, plan: &Plan) -> Value {
    let session = agent_path::session_dir();
    let rt = Some(session.as_path());
    let mut runs: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    let true_agent: &[&str] = &["/bin/true"];
    for round in 1..=plan.repeats {
        log(format!("  round {round} of {}", plan.repeats));
        let mut push = |k, v: Value| runs.entry(k).or_default().push(v);
        if drains_only() {
            let jobs = plan.drain_jobs_pg;
            push("ours_batched", drain::drain(env, Backend::Pg, WORKERS, 1, true, "noop", jobs, true).await);
            push("graphile_batched", graphile(env, jobs, true, false).await);
            push("ours_single", drain::drain(env, Backend::Pg, WORKERS, 1, false, "noop", jobs, true).await);
            push("graphile_single", graphile(env, jobs, false, false).await);
            continue;
        }
        push("spawn_limit", spawn_limit(plan.agent_jobs));
        push("xargs", xargs(plan.agent_jobs));
        push("ours_cli_1x32", agent_path::once(env, (1, WORKERS), (true_agent, &[]), plan.agent_jobs, rt).await);
        push("graphile_exec_default", graphile(env, plan.agent_jobs, false, true).await);
        push("ours_cli_4x8", agent_path::once(env, (4, WORKERS / 4), (true_agent, &[]), plan.agent_jobs, rt).await);
        push("graphile_exec_local", graphile(env, plan.agent_jobs, true, true).await);
        let jobs = plan.drain_jobs_pg;
        push("ours_batched", drain::drain(env, Backend::Pg, WORKERS, 1, true, "noop", jobs, true).await);
        push("graphile_batched", graphile(env, jobs, true, false).await);
        push("ours_single", drain::drain(env, Backend::Pg, WORKERS, 1, false, "noop", jobs, true).await);
        push("graphile_single", graphile(env, jobs, false, false).await);
        push("ours_pickup", latency::latency(env, Backend::Pg, true, plan.latency_samples).await);
        let args = ["--samples".to_string(), plan.latency_samples.to_string(), "--max-gap-ms".into(), "30".into()];
        push("graphile_pickup", run_peer(env, "graphile", "pickup", &args, Duration::from_secs(600)).await);
    }
    agent_path::drop_session_dir(&session);
    let med = |k: &str, field: &str| {
        let xs: Vec<f64> = runs.get(k).into_iter().flatten().filter_map(|r| r[field].as_f64()).collect();
        if xs.is_empty() {
            f64::NAN
        } else {
            median(xs)
        }
    };
    let mut medians = json!({});
    for k in runs.keys() {
        let field = if k.ends_with("pickup") { "p50_ms" } else { "jobs_per_s" };
        medians[*k] = json!(med(k, field));
    }
    for (k, field) in [
        ("ours_batched", "/cpu_ms_per_1k_jobs/postgres"),
        ("ours_single", "/cpu_ms_per_1k_jobs/postgres"),
        ("graphile_batched", "/postgres_cpu_ms_per_1k_jobs"),
        ("graphile_single", "/postgres_cpu_ms_per_1k_jobs"),
    ] {
        let xs: Vec<f64> = runs[k].iter().filter_map(|r| r.pointer(field).and_then(Value::as_f64)).collect();
        medians[format!("{k}_pg_cpu")] = json!(if xs.is_empty() { f64::NAN } else { median(xs) });
    }
    log(format!("  medians: {medians}"));
    json!({ "rounds": plan.repeats, "workers": WORKERS, "node": crate::peers::node_version(), "runs": runs, "medians": medians })
}
