//! (s) What the agent sandbox costs a job: the agent path as a user runs it, `devpilot run
//! --concurrency 32 -- /bin/true`, with its agents confined (the default) and with
//! `--sandbox off`, in alternated rounds (confined first in odd rounds, unconfined first in
//! even ones) so that drift on a shared machine falls on both alike. The figure is the
//! ratio of the medians.

use serde_json::{json, Value};

use crate::agent_path::{drop_session_dir, once, session_dir};
use crate::common::{log, median, Env, Plan};

/// The rounds of each mode.
const ROUNDS: usize = 3;
/// The processes and concurrency of each drain: the issue's `devpilot run -c 32`.
const SHAPE: (usize, usize) = (1, 32);
/// The target: confined runs at least this share of the unconfined rate.
pub const TARGET: f64 = 0.8;

pub async fn measure(env: &Env, plan: &Plan) -> Value {
    let session = session_dir();
    let agent: &[&str] = &["/bin/true"];
    let (mut on, mut off) = (vec![], vec![]);
    for round in 0..ROUNDS {
        let order: [&str; 2] = if round % 2 == 0 { ["on", "off"] } else { ["off", "on"] };
        for mode in order {
            let r = once(env, SHAPE, (agent, &["--sandbox", mode]), plan.agent_jobs, Some(&session)).await;
            let rate = r["jobs_per_s"].as_f64().unwrap_or(0.0);
            log(format!("  (s) round {} sandbox {mode}: {rate:.0} jobs/s", round + 1));
            if mode == "on" {
                on.push(r)
            } else {
                off.push(r)
            }
        }
    }
    drop_session_dir(&session);
    let rate = |runs: &[Value]| median(runs.iter().filter_map(|r| r["jobs_per_s"].as_f64()).collect());
    let cpu = |runs: &[Value]| {
        median(runs.iter().filter_map(|r| r["cpu_ms_per_job"]["devpilot_and_agents"].as_f64()).collect())
    };
    let (confined, unconfined) = (rate(&on), rate(&off));
    json!({
        "shape": { "processes": SHAPE.0, "concurrency": SHAPE.1, "agent": "/bin/true", "jobs": plan.agent_jobs, "rounds": ROUNDS },
        "confined": { "jobs_per_s": confined, "cpu_ms_per_job": cpu(&on), "runs": on },
        "unconfined": { "jobs_per_s": unconfined, "cpu_ms_per_job": cpu(&off), "runs": off },
        "ratio": if unconfined > 0.0 { confined / unconfined } else { 0.0 },
        "target": TARGET,
    })
}
