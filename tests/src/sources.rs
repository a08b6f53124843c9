//! What the tracker-source tests share: turning the fleet's intake by aging its source row
//! (never by sleeping), reading the jobs, and proving a secret reached no file, row or argv.

// Harness code says "this must hold" by unwrapping: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use devpilot_store::queue::JobRow;

use crate::{devpilot, Runner, TestDb};

/// The variables a tracker's credentials and addresses come in: a test names the ones it
/// gives, and no other reaches the process from the test's own environment.
const TRACKER_VARS: [&str; 4] =
    ["GITHUB_TOKEN", "LINEAR_API_KEY", "DEVPILOT_GITHUB_API_URL", "DEVPILOT_LINEAR_API_URL"];

/// In these tests the GitHub stand-in plays github.com, whose token (`GITHUB_TOKEN`) is sent
/// only to github.com's API or to what `DEVPILOT_GITHUB_API_URL` names. A test that gives the
/// token and no such address gets the one loopback `api_url` its home's GitHub sources name;
/// a test with GitHub sources on two hosts names github.com's itself. A CLI call's own
/// `--api-url` (`sources add github`) counts as a source's.
fn github_com_env(home: &Path, env: &[(&str, &str)], args: &[&str]) -> Option<String> {
    let names = |v: &str| env.iter().any(|(k, _)| *k == v);
    if !names("GITHUB_TOKEN") || names("DEVPILOT_GITHUB_API_URL") {
        return None;
    }
    let given = args.windows(2).find(|w| w[0] == "--api-url").map(|w| w[1].to_string());
    if let Some(url) = given.filter(|u| u.starts_with("http://127.0.0.1:")) {
        return Some(url);
    }
    let text = std::fs::read_to_string(home.join("config").join("devpilot").join("config.toml")).ok()?;
    let config: toml::Value = toml::from_str(&text).ok()?;
    let mut urls: Vec<String> = config
        .get("sources")?
        .as_table()?
        .values()
        .filter(|s| s.get("kind").and_then(toml::Value::as_str) == Some("github"))
        .filter_map(|s| s.get("api_url").and_then(toml::Value::as_str).map(str::to_string))
        .filter(|u| u.starts_with("http://127.0.0.1:"))
        .collect();
    urls.dedup();
    (urls.len() == 1).then(|| urls.remove(0))
}

/// A machine's home whose config names the GitHub source `gh` for `acme/webapp` on the
/// stand-in at `api_url` (plus `extra` TOML lines in `[sources.gh]` and `rest` after it):
/// repo-less jobs, every 15 s and calls timing out after 10 s unless `extra` says otherwise.
pub fn github_home(root: &Path, name: &str, orch: &str, api_url: &str, extra: &str, rest: &str) -> PathBuf {
    let timeout = if extra.contains("timeout") { "" } else { "timeout = \"10s\"\n" };
    let interval = if extra.contains("interval") { "" } else { "interval = \"15s\"\n" };
    let home = root.join(name);
    std::fs::create_dir_all(&home).unwrap();
    crate::write_config(
        &home,
        &format!(
            "orchestrator_id = \"{orch}\"\n\
             [sources.gh]\nkind = \"github\"\nrepo = \"acme/webapp\"\nlabel = \"agent\"\n\
             {interval}{timeout}api_url = \"{api_url}\"\nno_repo = true\n{extra}\n{rest}\n"
        ),
    );
    home
}

/// `devpilot run` for `orch` as `name` in `home` with `agent`, and `env` (the credentials,
/// for the runner only: no agent is given them). Its log is the runner's `log`.
pub fn machine(home: &Path, db: &TestDb, orch: &str, name: &str, agent: &Path, env: &[(&str, &str)]) -> Runner {
    machine_with(home, db, orch, name, agent, env, &crate::fast_flags())
}

/// [`machine`] with these `flags` in place of the tests' fast intervals (a test of what a
/// user waits for at the default poll intervals).
pub fn machine_with(
    home: &Path,
    db: &TestDb,
    orch: &str,
    name: &str,
    agent: &Path,
    env: &[(&str, &str)],
    flags: &[&str],
) -> Runner {
    let log_path = home.join(format!("runner-{name}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut c = devpilot(home, &db.raw_url);
    c.args(["run", "--orchestrator", orch, "--machine", name]).args(flags);
    // The tests' agents record what they did next to their script: theirs to write.
    if let Some(dir) = agent.parent() {
        c.arg("--allow-write").arg(dir);
    }
    c.arg("--").arg(agent).stdout(Stdio::null()).stderr(Stdio::from(log));
    for v in TRACKER_VARS {
        c.env_remove(v);
    }
    c.envs(env.iter().copied());
    if let Some(url) = github_com_env(home, env, &[]) {
        c.env("DEVPILOT_GITHUB_API_URL", url);
    }
    Runner { child: c.spawn().unwrap(), machine: name.into(), log: log_path }
}

/// The CLI in `home` with `env`: (exit code, stdout, stderr). A panic is a failure.
pub fn cli(home: &Path, db: &TestDb, env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    cli_at(home, &db.raw_url, env, args)
}

/// `devpilot sources poll --orchestrator orch` with `env`, on a thread of its own: the test
/// goes on while the turn runs (to change the tracker at a gate it holds), then joins it.
pub fn poll_on_a_thread(
    home: &Path,
    db: &TestDb,
    orch: &str,
    env: (&'static str, &'static str),
) -> std::thread::JoinHandle<(i32, String, String)> {
    let (home, db_url, orch) = (home.to_path_buf(), db.raw_url.clone(), orch.to_string());
    std::thread::spawn(move || cli_at(&home, &db_url, &[env], &["sources", "poll", "--orchestrator", &orch]))
}

/// [`cli`] on the database at `db_url`.
fn cli_at(home: &Path, db_url: &str, env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let mut c = devpilot(home, db_url);
    for v in TRACKER_VARS {
        c.env_remove(v);
    }
    if let Some(url) = github_com_env(home, env, args) {
        c.env("DEVPILOT_GITHUB_API_URL", url);
    }
    let out = c.envs(env.iter().copied()).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).output().unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(!e.contains("panicked"), "{e}");
    (out.status.code().unwrap_or(-1), o, e)
}

/// How long a source test waits for the fleet.
pub const WAIT: Duration = Duration::from_secs(60);

/// Moves the source's last poll back one interval: the next tick of any machine takes a turn.
pub async fn age_source(db: &TestDb, orch: &str) {
    db.exec(&format!("UPDATE sources SET polled_at = polled_at - 15000 WHERE orchestrator_id = '{orch}'")).await;
}

/// Ages the source and waits until a machine has taken the next turn and ended it, so what
/// the turn read and wrote is all in by the time the caller looks.
pub async fn next_turn(db: &TestDb, orch: &str) {
    let before = turns(db, orch).await;
    age_source(db, orch).await;
    let ended = format!(
        "SELECT COUNT(*) FROM sources WHERE orchestrator_id = '{orch}' AND turn > {before}
            AND (last_ok_at >= polled_at OR last_error_at >= polled_at)"
    );
    let done = || async { db.scalar(&ended).await.unwrap_or(0) > 0 };
    assert!(crate::wait_for(WAIT, done).await, "a machine took turn {} and ended it", before + 1);
}

pub async fn turns(db: &TestDb, orch: &str) -> i64 {
    db.scalar(&format!("SELECT COALESCE(MAX(turn), 0) FROM sources WHERE orchestrator_id = '{orch}'"))
        .await
        .unwrap_or(0)
}

pub async fn jobs(db: &TestDb, orch: &str) -> Vec<JobRow> {
    db.queue.jobs(orch, None, 100).await.unwrap()
}

/// The key is in no file under the test's dirs (configs, data, logs, payloads, the agents'
/// recorded environments), no row of any table, and no argv of a machine.
pub async fn assert_no_secret(db: &TestDb, root: &Path, pids: &[u32]) {
    let out = Command::new("grep").args(["-r", "-l", "TESTSECRET"]).arg(root).output().unwrap();
    assert!(out.stdout.is_empty(), "the key is in: {}", String::from_utf8_lossy(&out.stdout));
    let runtime = std::env::var("XDG_RUNTIME_DIR").unwrap_or_else(|_| "/nonexistent".into());
    let out = Command::new("grep").args(["-r", "-l", "TESTSECRET"]).arg(runtime).output().unwrap();
    assert!(out.stdout.is_empty(), "the key is in: {}", String::from_utf8_lossy(&out.stdout));
    for table in ["dispatch_queue", "job_events", "job_logs", "machines", "sources", "outbox"] {
        let hit = if db.backend.is_postgres() {
            format!("SELECT COUNT(*) FROM {table} t WHERE t::text LIKE '%TESTSECRET%'")
        } else {
            let cols = db_columns(db, table).await;
            format!("SELECT COUNT(*) FROM {table} WHERE ({}) LIKE '%TESTSECRET%'", cols.join(" || ' ' || "))
        };
        assert_eq!(db.scalar(&hit).await, Some(0), "the key is in a row of {table}");
    }
    for pid in pids {
        let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&argv).contains("TESTSECRET"), "the key is in an argv");
    }
}

/// SQLite's columns of `table`, each as text that is never NULL.
pub async fn db_columns(db: &TestDb, table: &str) -> Vec<String> {
    use sea_orm::ConnectionTrait;
    let rows = db
        .admin()
        .query_all_raw(sea_orm::Statement::from_string(db.queue.backend(), format!("PRAGMA table_info({table})")))
        .await
        .unwrap();
    rows.iter().map(|r| format!("COALESCE(CAST({} AS TEXT), '')", r.try_get::<String>("", "name").unwrap())).collect()
}
