//! (v) Issue 25's comparisons, in alternated rounds: in each round ours and the other side
//! (Graphile Worker, or the machine's own spawn limit) run one after the other, A B A B, so a
//! noisy stretch of this shared machine hits both; each compared figure is the median of
//! `plan.repeats` rounds, and every run is kept.
//!
//! - The spawn limit: 32 threads, each starting `/bin/true` and waiting for it, as fast as they
//!   can, through std's spawn (`posix_spawn`: a `CLONE_VM` child, `execve`, `wait`); and, for
//!   reference, `xargs -P 32 -n 1 /bin/true`.
//! - The confined spawn limit: 32 tasks, each making the sandbox the runner makes for a plain
//!   command (the engine's own [`sandbox::Plan`]: its mounts, its egress proxy, bubblewrap and
//!   DevPilot's init) around `/bin/true`, starting it and waiting for it, as fast as they can.
//! - The agent path: `devpilot run -c 32 -- /bin/true` (one process) and 4 × `-c 8`, confined
//!   (the default) against the confined spawn limit; and `-c 32 --sandbox off` against the
//!   spawn limit and against Graphile Worker running `execFile('/bin/true')` per job (which
//!   confines nothing) in its default and localQueue modes.
//! - The no-op drains at 32 workers, with PostgreSQL's CPU per 1,000 jobs: batched against
//!   Graphile's localQueue, one job per fetch against its default.
//! - Pickup p50 with NOTIFY, against Graphile's LISTEN.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use devpilot_engine::sandbox;
use serde_json::{json, Value};

use crate::agent_path;
use crate::common::{log, median, Backend, Env, Plan};
use crate::measure::{drain, latency};
use crate::peers::run_peer;

/// Workers on every side: our slots, Graphile's concurrentJobs, the spawner's threads.
pub const WORKERS: usize = 32;

/// The rounds of a full run: Graphile's own rate swings by a factor of two between runs, so
/// each ratio is reported with its spread over five.
pub const ROUNDS: usize = 5;

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
    let how = "32 threads × std::process::Command(\"/bin/true\").status()";
    spawned(jobs, failed, secs, how)
}

/// `jobs` runs of `/bin/true` by `WORKERS` tasks, each confined as the runner confines a
/// plain command: the engine's [`sandbox::Plan`] for it (the system, the home's toolchains,
/// its own directory, an egress proxy with nothing allowed), bubblewrap and the init, then a
/// wait, then the sandbox's directory removed. What the queue adds is all that differs.
async fn spawn_limit_confined(dir: &Path, jobs: i64) -> Value {
    let bwrap = match sandbox::confinement() {
        sandbox::Confinement::Confined { bwrap, .. } => bwrap.clone(),
        sandbox::Confinement::Unconfined { why } => return json!({ "jobs": 0, "skipped": why }),
    };
    let left = Arc::new(AtomicI64::new(jobs));
    let start = Instant::now();
    let tasks: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (left, bwrap, dir) = (left.clone(), bwrap.clone(), dir.join(format!("w{w}")));
            tokio::spawn(async move {
                std::fs::create_dir_all(dir.join("cwd")).unwrap();
                let mut failed = 0;
                for n in 0.. {
                    if left.fetch_sub(1, Ordering::Relaxed) <= 0 {
                        break;
                    }
                    failed += usize::from(!confined_true(&bwrap, &dir, n).await);
                }
                failed
            })
        })
        .collect();
    let mut failed = 0;
    for t in tasks {
        failed += t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    spawned(jobs, failed, secs, "32 tasks × the runner's sandbox::Plan::command(\"/bin/true\"), spawned and waited")
}

/// A spawn limit's run: only the spawns that ran `/bin/true` to a zero exit count (a failed
/// spawn returns early, and would make the limit look higher).
fn spawned(jobs: i64, failed: usize, secs: f64, how: &str) -> Value {
    if failed > 0 {
        log(format!("  {failed} of {jobs} spawns failed ({how})"));
    }
    let ok = jobs - failed as i64;
    json!({ "jobs": jobs, "failed": failed, "secs": secs, "jobs_per_s": ok as f64 / secs, "how": how })
}

/// One confined `/bin/true`, its sandbox in `dir`/`n`: whether it exited 0.
async fn confined_true(bwrap: &Path, dir: &Path, n: usize) -> bool {
    let plan = sandbox::Plan {
        bwrap: bwrap.to_path_buf(),
        git: None,
        allow: vec![],
        read_only: vec![],
        read_write: vec![],
        private: dir.join(format!("jail-{n}")),
        identity: ("bench".into(), "bench@example.invalid".into()),
    };
    let mut vars: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
    let Ok((jail, program, args)) = plan.command(Path::new("/bin/true"), vec![], &mut vars, &dir.join("cwd")) else {
        plan.done();
        return false;
    };
    let status = tokio::process::Command::new(program)
        .args(args)
        .env_clear()
        .envs(vars)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .await;
    drop(jail);
    plan.done();
    status.is_ok_and(|s| s.success())
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
/// few minutes; `=agent`: only the unconfined agent path and its spawn limit, for a profile
/// of it (`perf record -a` beside it). A full run never sets it.
fn only(part: &str) -> bool {
    std::env::var("DEVPILOT_BENCH_VERSUS").as_deref() == Ok(part)
}

/// Every figure, [`ROUNDS`] alternated rounds (a quick run: its plan's):
/// `{ runs: {name: [...]}, medians: {...} }`.
pub async fn measure(env: &Env, plan: &Plan) -> Value {
    let session = agent_path::session_dir();
    let rt = Some(session.as_path());
    let mut runs: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    let true_agent: &[&str] = &["/bin/true"];
    let off: &[&str] = &["--sandbox", "off"];
    let rounds = if plan.repeats == 1 { 1 } else { ROUNDS };
    for round in 1..=rounds {
        log(format!("  round {round} of {rounds}"));
        let mut push = |k, v: Value| runs.entry(k).or_default().push(v);
        if only("agent") {
            push("spawn_limit", spawn_limit(plan.agent_jobs));
            push(
                "ours_cli_1x32_off",
                agent_path::once(env, (1, WORKERS), (true_agent, off), plan.agent_jobs, rt).await,
            );
            continue;
        }
        if only("drains") {
            let jobs = plan.drain_jobs_pg;
            push("ours_batched", drain::drain(env, Backend::Pg, WORKERS, 1, true, "noop", jobs, true).await);
            push("graphile_batched", graphile(env, jobs, true, false).await);
            push("ours_single", drain::drain(env, Backend::Pg, WORKERS, 1, false, "noop", jobs, true).await);
            push("graphile_single", graphile(env, jobs, false, false).await);
            continue;
        }
        let jobs = plan.agent_jobs;
        push("spawn_limit", spawn_limit(jobs));
        push("ours_cli_1x32_off", agent_path::once(env, (1, WORKERS), (true_agent, off), jobs, rt).await);
        push("graphile_exec_default", graphile(env, jobs, false, true).await);
        push("spawn_limit_confined", spawn_limit_confined(&env.tmp.join(format!("spawn{}", env.next())), jobs).await);
        push("ours_cli_1x32", agent_path::once(env, (1, WORKERS), (true_agent, &[]), jobs, rt).await);
        push("xargs", xargs(jobs));
        push("ours_cli_4x8", agent_path::once(env, (4, WORKERS / 4), (true_agent, &[]), jobs, rt).await);
        push("graphile_exec_local", graphile(env, jobs, true, true).await);
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
        let xs: Vec<f64> =
            runs.get(k).into_iter().flatten().filter_map(|r| r.pointer(field).and_then(Value::as_f64)).collect();
        medians[format!("{k}_pg_cpu")] = json!(if xs.is_empty() { f64::NAN } else { median(xs) });
    }
    log(format!("  medians: {medians}"));
    json!({ "rounds": rounds, "workers": WORKERS, "node": crate::peers::node_version(), "runs": runs, "medians": medians })
}
