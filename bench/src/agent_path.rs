//! (e) The real agent-process path, as a user runs it: `devpilot run` OS processes, each
//! spawning a trivial `/bin/sh` agent per job (payload file, log file, stdin pipe, wait,
//! result check, fenced completion). Timed from spawning the processes until every one has
//! exited on `--until-empty`; their CPU (and their agents', which they wait for) comes from
//! `getrusage(RUSAGE_CHILDREN)`.

use std::path::PathBuf;
use std::time::Instant;

use serde_json::{json, Value};

use crate::common::{completed, log, median, prefill_url, Backend, Env, Plan, ORCH};

fn devpilot_bin() -> PathBuf {
    std::env::current_exe().unwrap().with_file_name("devpilot")
}

/// CPU (user + system, ms) of every child this process has waited for.
fn children_cpu_ms() -> f64 {
    // SAFETY: getrusage writes into the struct we pass and has no other effect.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    ms(u.ru_utime) + ms(u.ru_stime)
}

/// The agent of (e): a shell that exits 0.
pub const SHELL_AGENT: &[&str] = &["/bin/sh", "-c", "exit 0"];

/// One drain of `jobs` by `procs` × `devpilot run --concurrency conc FLAGS -- agent…`.
/// `runtime_dir`: the processes' `XDG_RUNTIME_DIR` (a login session's tmpfs), or none.
pub async fn once(
    env: &Env,
    (procs, conc): (usize, usize),
    (agent, flags): (&[&str], &[&str]),
    jobs: i64,
    runtime_dir: Option<&std::path::Path>,
) -> Value {
    let url = env.fresh(Backend::Pg).await;
    prefill_url(&url, jobs).await;
    let home = env.tmp.join(format!("cli{}", env.next()));
    let pg0 = crate::cluster::postgres_cpu_ms();
    let cpu0 = children_cpu_ms();
    let start = Instant::now();
    let mut children = vec![];
    for p in 0..procs {
        let h = home.join(format!("p{p}"));
        children.push(
            tokio::process::Command::new(devpilot_bin())
                .args(["run", "--until-empty", "--orchestrator", ORCH, "--machine", &format!("cli-{p}")])
                .args(["--concurrency", &conc.to_string()])
                .args(flags)
                .arg("--")
                .args(agent)
                .env("DEVPILOT_DATABASE_URL", &url)
                .env("XDG_CONFIG_HOME", h.join("config"))
                .env("XDG_DATA_HOME", h.join("data"))
                .env("DEVPILOT_LOG", "warn")
                .env_remove("XDG_RUNTIME_DIR")
                .envs(runtime_dir.map(|d| ("XDG_RUNTIME_DIR", d)))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("devpilot: scripts/bench.sh builds it next to devpilot-bench"),
        );
    }
    let mut failed = 0;
    for mut c in children {
        if !c.wait().await.map(|s| s.success()).unwrap_or(false) {
            failed += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = children_cpu_ms() - cpu0;
    let pg = crate::cluster::postgres_cpu_ms() - pg0;
    let done = completed(&url).await;
    // The data dirs stay until the run ends: thousands of files deleted now would slow the
    // next drain's file creation (ext4 scans past recently deleted inodes).
    json!({
        "jobs": jobs, "completed": done, "failed_processes": failed, "secs": secs,
        "jobs_per_s": done as f64 / secs, "processes": procs, "concurrency": conc, "agent": agent.join(" "),
        "cpu_ms_per_job": { "devpilot_and_agents": cpu / done.max(1) as f64, "postgres": pg / done.max(1) as f64 },
    })
}

/// The target's configuration: 4 processes × concurrency 8, medians of `plan.repeats` runs,
/// as in a login session (payload files in `XDG_RUNTIME_DIR`, a tmpfs; the bench makes one
/// in /dev/shm when it runs without) and without one (payload files in the data dir).
pub async fn measure(env: &Env, plan: &Plan) -> Value {
    let session = session_dir();
    let mut out = json!({ "processes": 4, "concurrency": 8, "agent": "/bin/sh -c 'exit 0'" });
    for (key, rt) in [("session", Some(session.as_path())), ("no_runtime_dir", None)] {
        let mut runs = vec![];
        for _ in 0..plan.repeats {
            runs.push(once(env, (4, 8), (SHELL_AGENT, &[]), plan.agent_jobs, rt).await);
        }
        let rate = median(runs.iter().filter_map(|r| r["jobs_per_s"].as_f64()).collect());
        log(format!("  devpilot run ×4, concurrency 8, /bin/sh agent ({key}): {rate:.0} jobs/s"));
        out[key] = json!({ "jobs_per_s": rate, "runs": runs });
    }
    drop_session_dir(&session);
    out
}

/// A login session's runtime dir: `XDG_RUNTIME_DIR`, or a private tmpfs dir made like one.
pub fn session_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let d = tempfile::Builder::new().prefix("devpilot-bench-rt-").tempdir_in("/dev/shm").unwrap().keep();
            std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
            d
        }
    }
}

/// Removes a runtime dir [`session_dir`] made (never the user's own).
pub fn drop_session_dir(d: &std::path::Path) {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let _ = std::fs::remove_dir_all(d);
    }
}
