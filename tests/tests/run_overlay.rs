//! `devpilot run`'s flags are laid over the settings file, through real processes: a flag
//! replaces the one setting it names and keeps everything else. `--repo web=PATH` keeps the
//! settings' `[repos.web]` copy, setup and push (it once replaced the whole repo and dropped
//! them), and the durations, the machine's name, its labels, `--pass-env` and the watchdog
//! combine the same way. Every test runs on PostgreSQL and on SQLite.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use devpilot_store::job::JobState;
use devpilot_tests::{
    devpilot, enqueue, fast_flags, spawn_runner, write_config, Backend, GitRemote, RecordingAgent, TestDb,
};

devpilot_tests::on_both_backends!(
    a_repo_flag_keeps_the_settings_copy_setup_and_push,
    three_flags_overlay_the_settings_and_the_rest_stays,
);

/// `devpilot run --until-empty` with `flags` and no `--machine`, and `env` in its
/// environment, to its end (at most 60 s): its exit code and what it logged.
fn run_to_end(
    home: &Path,
    db: &TestDb,
    orch: &str,
    flags: &[&str],
    agent: &Path,
    env: &[(&str, &str)],
) -> (Option<i32>, String) {
    let log = home.join(format!("run-{}.log", rand::random::<u32>()));
    let mut c = devpilot(home, &db.raw_url);
    c.args(["run", "--orchestrator", orch, "--until-empty", "--poll-interval", "50ms", "--max-poll-interval", "200ms"]);
    // The agents record what they did beside their scripts, outside their sandbox.
    c.args(flags).arg("--allow-write").arg(agent.parent().unwrap()).arg("--").arg(agent).envs(env.iter().copied());
    let mut child = c.stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).spawn().unwrap();
    let start = Instant::now();
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (code, std::fs::read_to_string(&log).unwrap_or_default())
}

/// The settings name `web` at a path that does not exist, with `copy`, `setup` and `push`;
/// `--repo web=CLONE` points it at the real clone. The agent sees the copied `.env` and the
/// setup's file, and its work reaches the remote: the flag replaced the path, nothing else.
async fn a_repo_flag_keeps_the_settings_copy_setup_and_push(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("overlay-repo");
    let dir = db.dir.path();
    let remote = GitRemote::new(dir);
    let clone = remote.clone_to(&dir.join("src/web"));
    std::fs::write(clone.join(".env"), "SECRET=from-clone\n").unwrap();
    let home = dir.join("m");
    write_config(
        &home,
        "[repos.web]\npath = \"/nonexistent/elsewhere\"\npush = true\ncopy = [\".env\"]\n\
         setup = [\"sh\", \"-c\", \"echo setup-ran > setup.txt\"]\n",
    );
    let seen = dir.join("seen");
    std::fs::create_dir_all(&seen).unwrap();
    let agent = RecordingAgent::new(
        dir,
        &format!("cat .env > {s}/env.txt; cat setup.txt > {s}/setup.txt; echo work > work.txt", s = seen.display()),
    );
    let id = enqueue(&home, &db, &orch, &["--title", "t", "--repo", "web"]);
    let repo_flag = format!("web={}", clone.display());
    let mut flags = fast_flags();
    flags.extend(["--until-empty", "--repo", &repo_flag]);
    let mut r = spawn_runner(&home, &db.raw_url, &orch, "m", &flags, &agent.script, &[]);
    let code = r.wait_timeout(Duration::from_secs(60));
    let log = std::fs::read_to_string(&r.log).unwrap_or_default();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(db.queue.job(id).await.unwrap().unwrap().0.state, JobState::Completed, "{log}");
    let read = |f: &str| std::fs::read_to_string(seen.join(f)).unwrap_or_default();
    assert_eq!(read("env.txt"), "SECRET=from-clone\n", "the settings' copy was kept");
    assert_eq!(read("setup.txt"), "setup-ran\n", "the settings' setup was kept");
    let pushed = remote.show(&format!("devpilot/{id}-t"), "work.txt");
    assert_eq!(pushed.as_deref(), Some("work\n"), "the settings' push was kept");
}

/// The settings say: heartbeat 1m, claim timeout 5m, machine `from-settings`, label `gpu`,
/// pass `FROM_SETTINGS`, and stop an agent silent for 1s. Each flag replaces the one value it
/// names: `--claim-timeout 2m` meets the settings' heartbeat (and is refused, naming both);
/// `--pass-env FROM_FLAG` adds to the list; `--idle-timeout 1h` lets a silent agent finish.
/// What no flag names comes from the settings: the machine's name, its label, and, in the
/// last run, the 1 s watchdog.
async fn three_flags_overlay_the_settings_and_the_rest_stays(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("overlay-flags");
    let dir = db.dir.path();
    let home = dir.join("m");
    write_config(
        &home,
        "heartbeat = \"1m\"\nclaim_timeout = \"5m\"\nmachine = \"from-settings\"\nlabels = [\"gpu\"]\n\
         pass_env = [\"FROM_SETTINGS\"]\nidle_timeout = \"1s\"\n",
    );
    let seen = dir.join("env.txt");
    let agent = RecordingAgent::new(dir, &format!("echo \"$FROM_SETTINGS $FROM_FLAG\" > {}; sleep 3", seen.display()));

    let (code, log) = run_to_end(&home, &db, &orch, &["--claim-timeout", "2m"], &agent.script, &[]);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("claim timeout (2m)") && log.contains("three heartbeats (1m each)"), "{log}");

    let id = enqueue(&home, &db, &orch, &["--title", "gpu", "--requires", "gpu", "--max-attempts", "1"]);
    let flags = ["--pass-env", "FROM_FLAG", "--idle-timeout", "1h"];
    let env = [("FROM_SETTINGS", "s"), ("FROM_FLAG", "f")];
    let (code, log) = run_to_end(&home, &db, &orch, &flags, &agent.script, &env);
    assert_eq!(code, Some(0), "{log}");
    let j = db.queue.job(id).await.unwrap().unwrap().0;
    assert_eq!(j.state, JobState::Completed, "the flag's idle timeout replaced the settings' 1s: {log}");
    assert_eq!(j.claimed_by.as_deref(), Some("from-settings"), "the settings' machine name");
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "s f\n", "the flag's pass-env adds to the settings'");

    let id = enqueue(&home, &db, &orch, &["--title", "quiet", "--requires", "gpu", "--max-attempts", "1"]);
    let (code, log) = run_to_end(&home, &db, &orch, &[], &agent.script, &[]);
    assert_eq!(code, Some(0), "{log}");
    let j = db.queue.job(id).await.unwrap().unwrap().0;
    assert_eq!(j.state, JobState::Dead, "{log}");
    assert!(j.last_error.unwrap_or_default().contains("no output for 1s"), "the settings' watchdog: {log}");
}
