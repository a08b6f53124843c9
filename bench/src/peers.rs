//! The peers: Graphile Worker and pg-boss, driven by `bench/peers/peer.js` (Node) against
//! the same throwaway cluster, with the same settings, worker counts and no-op task as our
//! own drains. `scripts/bench.sh` installs Node and the pinned packages; each measurement
//! gets an empty database of its own, and the script prints one JSON line.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{log, median, Env, Plan};

pub const PEERS: [&str; 2] = ["graphile", "pgboss"];

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peers/peer.js")
}

/// The node the peers run on: npm's `node` package, pinned beside them (Graphile Worker 0.18
/// and pg-boss 12 need node 22; Debian 12 has 18).
pub fn node() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peers/node_modules/node/bin/node")
}

/// What `node --version` says of [`node`].
pub fn node_version() -> String {
    let out = std::process::Command::new(node()).arg("--version").output().map(|o| o.stdout).unwrap_or_default();
    String::from_utf8_lossy(&out).trim().to_string()
}

/// Runs one measurement of one peer in a new, empty database. The URL (with the cluster's
/// password) goes through the environment, never the argument list.
pub async fn run_peer(env: &Env, peer: &str, measure: &str, args: &[String], limit: Duration) -> Value {
    let url = env.empty_db(&format!("peer_{peer}")).await;
    let child = tokio::process::Command::new(node())
        .arg(script())
        .args([peer, measure])
        .args(args)
        .env("PEER_DATABASE_URL", &url)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node 22: run scripts/bench.sh, which installs it in bench/peers");
    let out = match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return json!({ "error": e.to_string() }),
        Err(_) => return json!({ "error": format!("timed out after {limit:?}") }),
    };
    let line = String::from_utf8_lossy(&out.stdout);
    match (out.status.success(), serde_json::from_str::<Value>(line.trim())) {
        (true, Ok(v)) => v,
        _ => json!({ "error": format!("{peer} {measure} exited with {}: {}", out.status, line.trim()) }),
    }
}

/// Every peer figure: drains one job per fetch and batched at 8 and 32 workers (medians of
/// `plan.repeats` at 32, like ours), pickup with LISTEN where the peer has it, and an idle
/// worker's statements per minute (both peers at once, each in its own database).
pub async fn all(env: &Env, plan: &Plan) -> Value {
    let mut out = json!({});
    for peer in PEERS {
        let mut drains = vec![];
        for mode in ["single", "batched"] {
            for workers in [8usize, 32] {
                let reps = if workers == 32 { plan.repeats } else { 1 };
                let jobs = plan.drain_jobs_pg;
                let mut runs = vec![];
                for _ in 0..reps {
                    let args = [
                        "--mode".into(),
                        mode.into(),
                        "--workers".into(),
                        workers.to_string(),
                        "--jobs".into(),
                        jobs.to_string(),
                    ];
                    runs.push(run_peer(env, peer, "drain", &args, Duration::from_secs(300)).await);
                }
                let rates: Vec<f64> = runs.iter().filter_map(|r| r["jobs_per_s"].as_f64()).collect();
                let rate = if rates.is_empty() { f64::NAN } else { median(rates) };
                log(format!("  {peer} drain {workers} workers, {mode}: {rate:.0} jobs/s"));
                drains.push(json!({
                    "workers": workers, "batched": mode == "batched", "jobs_per_s": rate,
                    "config": runs[0]["config"], "connections": runs[0]["connections"], "runs": runs,
                }));
            }
        }
        out[peer] = json!({ "drain": drains });
        // pg-boss by default does not LISTEN (useListenNotify is off): its pickup is its polling interval (2 s), so fewer samples
        // say it, and gaps of up to 2 s so that jobs arrive at random points of the interval
        // (5-30 ms after the last pickup would always wait almost a whole interval).
        let (samples, gap) =
            if peer == "pgboss" { ((plan.latency_samples / 10).max(10), 2000) } else { (plan.latency_samples, 30) };
        let args = ["--samples".into(), samples.to_string(), "--max-gap-ms".into(), gap.to_string()];
        let pickup = run_peer(env, peer, "pickup", &args, Duration::from_secs(600)).await;
        log(format!("  {peer} pickup: p50 {} ms", pickup["p50_ms"]));
        out[peer]["pickup"] = pickup;
    }
    let window = plan.peer_idle_window.to_string();
    let idle_args = ["--window-secs".to_string(), window];
    let limit = Duration::from_secs(plan.peer_idle_window + 120);
    let (g, b) = tokio::join!(
        run_peer(env, "graphile", "idle", &idle_args, limit),
        run_peer(env, "pgboss", "idle", &idle_args, limit)
    );
    log(format!("  idle statements/min: graphile {}, pg-boss {}", g["statements_per_min"], b["statements_per_min"]));
    out["graphile"]["idle"] = g;
    out["pgboss"]["idle"] = b;
    out["versions"] = json!({ "node": node_version() });
    out
}
