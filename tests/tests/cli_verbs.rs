//! The `devpilot` verbs of the command line, through real processes: `show` (the job page as
//! text and JSON), `logs -f` following a job that runs on another machine, `watch` and its
//! exit codes, `pause`/`resume`/`handoff` reaching a running `devpilot run` through its
//! control socket, `doctor` naming what is wrong, `jobs` filters, and `logout` removing a key
//! from a keychain of the test's own. Machines are `devpilot run` OS processes; agents are
//! scripts. Every test that uses a database runs on PostgreSQL and on SQLite.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use devpilot_store::job::JobState;
use devpilot_tests::{
    devpilot, enqueue, fast_flags, run_cli, run_to_end, spawn_runner, wait_for, write_config, Backend, GitRemote,
    LinearStandIn, RecordingAgent, SecretService, TestDb,
};
use serde_json::Value;

devpilot_tests::on_both_backends!(
    show_prints_the_job_page_and_a_missing_job_exits_3,
    logs_follow_a_job_running_on_another_machine_until_it_ends,
    watch_exits_by_how_the_job_ended,
    pause_and_resume_change_what_the_running_machine_does,
    handoff_releases_the_running_job_and_says_it_is_safe,
    doctor_names_a_missing_repo_and_a_missing_agent_cli,
    jobs_filters_by_state_repo_and_machine,
);

/// How long a test waits for a machine to do something.
const WAIT: Duration = Duration::from_secs(60);

/// A `devpilot` process the test reads while it runs: its stdout and stderr are collected by
/// threads of their own as they come. Killed (it is our child) if the test forgets it.
struct Live {
    child: Child,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Live {
    /// Starts `devpilot ARGS` in `home`.
    fn start(home: &Path, url: &str, args: &[&str]) -> Live {
        let mut child = devpilot(home, url)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn devpilot");
        let out = Arc::new(Mutex::new(String::new()));
        let err = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect(child.stdout.take().expect("stdout"), out.clone()),
            collect(child.stderr.take().expect("stderr"), err.clone()),
        ];
        Live { child, out, err, readers }
    }

    /// What it printed on stdout so far.
    fn stdout(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    fn stderr(&self) -> String {
        self.err.lock().unwrap().clone()
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `limit` for it to exit: its exit code (all its output is then collected),
    /// or `None` while it still runs.
    async fn exit(&mut self, limit: Duration) -> Option<i32> {
        let child = &mut self.child;
        let mut code = None;
        wait_for(limit, || {
            if let Ok(Some(st)) = child.try_wait() {
                code = Some(st.code().unwrap_or(-1));
            }
            let done = code.is_some();
            async move { done }
        })
        .await;
        if code.is_some() {
            for r in self.readers.drain(..) {
                let _ = r.join();
            }
            let err = self.stderr();
            assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "no panic: {err}");
        }
        code
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A thread that appends everything `from` says to `into`, line by line, as it comes.
fn collect(from: impl Read + Send + 'static, into: Arc<Mutex<String>>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => into.lock().unwrap().push_str(&String::from_utf8_lossy(&line)),
            }
        }
    })
}

async fn state_is(db: &TestDb, id: i64, state: JobState) -> bool {
    db.queue.job(id).await.unwrap().is_some_and(|(j, _)| j.state == state)
}

/// Whether the agent's record says it started job `id`.
fn started(agent: &RecordingAgent, id: i64) -> bool {
    agent.records().iter().any(|r| r.kind == "start" && r.job == id)
}

/// Where `devpilot run` in `home` listens for `pause`, `resume` and `handoff` of `orch`.
fn control_socket(home: &Path, orch: &str) -> PathBuf {
    home.join("data").join("devpilot").join("control").join(format!("{orch}.sock"))
}

fn parse(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn ids_of(v: &Value) -> BTreeSet<i64> {
    v.as_array().unwrap_or_else(|| panic!("an array: {v}")).iter().map(|j| j["id"].as_i64().unwrap()).collect()
}

fn unix_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A job with a repo runs to the end on "laptop" (its agent commits a fix and says so);
/// `show ID` prints its title, its state, its branch, the machine and the agent's last line;
/// `show ID --json` has the documented fields with those values; `show` of a job that does
/// not exist exits 3 naming it, as text and as JSON.
async fn show_prints_the_job_page_and_a_missing_job_exits_3(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (root, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("show"));
    let remote = GitRemote::new(root);
    let clone = remote.clone_to(&root.join("src/webapp"));
    // Not named after the machine: `show` may print paths under it.
    let home = root.join("m1");
    write_config(&home, &format!("[repos.webapp]\npath = \"{}\"\npush = true\n", clone.display()));
    let agent = RecordingAgent::new(
        root,
        "echo fixed > fix.txt\n\
         git add fix.txt && git -c user.name=Agent -c user.email=agent@example.invalid commit -qm fix\n\
         echo 'the redirect is fixed'",
    );
    let id = enqueue(&home, &db, &orch, &["--title", "Fix the login redirect", "--repo", "webapp"]);
    let branch = format!("devpilot/{id}-fix-the-login-redirect");
    let mut flags = fast_flags();
    flags.push("--until-empty");
    let mut r = spawn_runner(&home, url, &orch, "laptop", &flags, &agent.script, &[]);
    assert_eq!(r.wait_timeout(WAIT), Some(0), "the machine ran the job and exited");
    assert!(state_is(&db, id, JobState::Completed).await);

    let (code, out, err) = run_cli(&home, url, &["show", &id.to_string()], None);
    assert_eq!(code, 0, "{err}");
    for want in ["Fix the login redirect", "completed", branch.as_str(), "laptop", "the redirect is fixed"] {
        assert!(out.contains(want), "`show` prints {want:?}:\n{out}");
    }
    assert!(out.contains(&format!("#{id}")) || out.contains(&id.to_string()), "names the job: {out}");

    let (code, out, err) = run_cli(&home, url, &["show", &id.to_string(), "--json"], None);
    assert_eq!(code, 0, "{err}");
    let v = parse(&out);
    for field in ["job", "branch", "issue", "pull_request", "history", "deliveries", "log", "unroutable"] {
        assert!(v.get(field).is_some(), "`show --json` has {field}: {v}");
    }
    assert_eq!(v["job"]["id"].as_i64(), Some(id));
    assert_eq!(v["job"]["state"].as_str(), Some("completed"));
    assert_eq!(v["job"]["title"].as_str(), Some("Fix the login redirect"));
    assert!(v["branch"].to_string().contains(&branch), "the branch: {}", v["branch"]);
    let history = v["history"].as_array().unwrap_or_else(|| panic!("history is an array: {v}"));
    assert!(history.iter().any(|e| e.to_string().contains("claimed")), "{history:?}");
    assert!(history.iter().any(|e| e.to_string().contains("completed")), "{history:?}");
    assert!(v["deliveries"].as_array().is_some_and(Vec::is_empty), "no tracker, no deliveries: {v}");
    assert!(v["issue"].is_null() && v["pull_request"].is_null(), "no issue and no pull request: {v}");
    assert!(v["log"].get("from").is_some(), "{v}");
    assert!(v["log"]["tail"].as_str().is_some_and(|t| t.contains("the redirect is fixed")), "{}", v["log"]);

    for args in [vec!["show", "999999"], vec!["show", "999999", "--json"]] {
        let (code, out, err) = run_cli(&home, url, &args, None);
        assert_eq!(code, 3, "{args:?}: {out}{err}");
        assert!(err.lines().any(|l| l.starts_with("error: ") && l.contains("999999")), "{args:?}: {err}");
    }
}

/// The job runs on "laptop" (a `devpilot run` with its own home, so the follower has no log
/// file of it); `devpilot logs ID -f` on "desktop" prints the agent's first line while the
/// agent waits, then its second line once the test lets it go on (the job still running),
/// each once and with the control characters the agent printed stripped; it ends, exit 0,
/// when the job does. `logs ID` without -f prints the stored tail.
async fn logs_follow_a_job_running_on_another_machine_until_it_ends(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (root, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("follow"));
    let (laptop, desktop) = (root.join("laptop"), root.join("desktop"));
    write_config(&laptop, "");
    write_config(&desktop, "");
    let (go_on, finish) = (root.join("go-on"), root.join("finish"));
    let agent = RecordingAgent::new(
        root,
        &format!(
            "printf 'ring \\007 clear \\033[2J end\\n'\n\
             echo 'first line from the agent'\n\
             while [ ! -f {go_on} ]; do sleep 0.1; done\n\
             echo 'second line from the agent'\n\
             while [ ! -f {finish} ]; do sleep 0.1; done",
            go_on = go_on.display(),
            finish = finish.display()
        ),
    );
    let id = enqueue(&desktop, &db, &orch, &["--title", "follow me"]);
    let _m = spawn_runner(&laptop, url, &orch, "laptop", &fast_flags(), &agent.script, &[]);
    assert!(wait_for(WAIT, || async { started(&agent, id) }).await, "the laptop runs the job");

    let mut follower = Live::start(&desktop, url, &["logs", &id.to_string(), "-f"]);
    assert!(
        wait_for(WAIT, || async { follower.stdout().contains("first line from the agent") }).await,
        "the follower prints the first line while the agent runs: {:?} {}",
        follower.stdout(),
        follower.stderr()
    );
    assert!(!follower.stdout().contains("second line from the agent"), "not yet printed by the agent");
    let local = desktop.join("data/devpilot/logs/jobs").join(format!("job-{id}.log"));
    assert!(!local.exists(), "the desktop has no log file of it: it follows the database");
    let (code, out, err) = run_cli(&desktop, url, &["logs", &id.to_string()], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("first line from the agent"), "the stored tail: {out}");

    std::fs::write(&go_on, "").unwrap();
    assert!(
        wait_for(WAIT, || async { follower.stdout().contains("second line from the agent") }).await,
        "the follower prints the second line: {:?}",
        follower.stdout()
    );
    assert!(follower.running(), "it follows on while the job runs");
    assert!(state_is(&db, id, JobState::Running).await, "the job still runs");

    std::fs::write(&finish, "").unwrap();
    assert!(wait_for(WAIT, || async { state_is(&db, id, JobState::Completed).await }).await);
    assert_eq!(follower.exit(WAIT).await, Some(0), "it ends when the job ends: {}", follower.stderr());
    let out = follower.stdout();
    for line in ["first line from the agent", "second line from the agent"] {
        assert_eq!(out.matches(line).count(), 1, "{line:?} printed once: {out}");
    }
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "inert output: {out:?}");
    assert!(out.contains("ring") && out.contains("end"), "the rest of that line is kept: {out:?}");
}

/// Three jobs watched from before a machine starts: `watch` exits 0 for the one that
/// completes, 6 for the one whose agent exits 1 with no attempt left (dead), and 7 for the
/// one cancelled while it runs; each prints the state it ended in.
async fn watch_exits_by_how_the_job_ended(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("watch"));
    let agent = RecordingAgent::new(
        home,
        r#"case "$payload" in
  *fail*) echo "giving up"; exit 1;;
  *hold*) sleep 60 & wait;;
esac
echo done"#,
    );
    let ok = enqueue(home, &db, &orch, &["--title", "a job that completes", "--payload", r#"{"do":"ok"}"#]);
    let dies = enqueue(
        home,
        &db,
        &orch,
        &["--title", "a job that dies", "--payload", r#"{"do":"fail"}"#, "--max-attempts", "1"],
    );
    let held = enqueue(home, &db, &orch, &["--title", "a job to cancel", "--payload", r#"{"do":"hold"}"#]);
    let watch = |id: i64| Live::start(home, url, &["watch", &id.to_string(), "--interval", "1s"]);
    let (mut w_ok, mut w_dies, mut w_held) = (watch(ok), watch(dies), watch(held));
    let mut flags = fast_flags();
    flags.extend(["--concurrency", "3"]);
    let _m = spawn_runner(home, url, &orch, "m", &flags, &agent.script, &[]);

    assert_eq!(w_ok.exit(WAIT).await, Some(0), "completed: {} {}", w_ok.stdout(), w_ok.stderr());
    assert!(w_ok.stdout().contains("completed"), "{}", w_ok.stdout());
    assert_eq!(w_dies.exit(WAIT).await, Some(6), "dead: {} {}", w_dies.stdout(), w_dies.stderr());
    assert!(w_dies.stdout().contains("dead"), "{}", w_dies.stdout());
    assert!(state_is(&db, dies, JobState::Dead).await);

    assert!(wait_for(WAIT, || async { started(&agent, held) }).await, "the job to cancel runs");
    assert!(w_held.running(), "watch waits while the job runs");
    let (code, _, err) = run_cli(home, url, &["cancel", &held.to_string()], None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(w_held.exit(WAIT).await, Some(7), "cancelled: {} {}", w_held.stdout(), w_held.stderr());
    assert!(w_held.stdout().contains("cancelled"), "{}", w_held.stdout());
    assert!(state_is(&db, held, JobState::Cancelled).await);
}

/// `pause` with no machine running here exits 5. With `devpilot run` up, `pause --for 30m`
/// pauses it (its answer and its stored presence say so); a job enqueued meanwhile stays
/// queued through a whole presence cycle of the paused machine; `resume` makes it claim and
/// run the job.
async fn pause_and_resume_change_what_the_running_machine_does(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("pause"));
    let (code, out, err) = run_cli(home, url, &["pause", "--orchestrator", &orch, "--for", "30m"], None);
    assert_eq!(code, 5, "nothing runs here yet: {out}{err}");
    assert!(err.lines().any(|l| l.starts_with("error: ")), "{err}");

    let agent = RecordingAgent::new(home, "echo ran");
    let _m = spawn_runner(home, url, &orch, "laptop", &fast_flags(), &agent.script, &[]);
    let sock = control_socket(home, &orch);
    assert!(wait_for(WAIT, || async { sock.exists() }).await, "the machine listens on {}", sock.display());
    assert!(wait_for(WAIT, || async { !db.queue.machines(&orch).await.unwrap().is_empty() }).await);

    let asked = unix_ms();
    let (code, out, err) = run_cli(home, url, &["pause", "--orchestrator", &orch, "--for", "30m", "--json"], None);
    assert_eq!(code, 0, "{err}");
    let v = parse(&out);
    assert_eq!((v["machine"].as_str(), v["paused"].as_bool()), (Some("laptop"), Some(true)), "{v}");
    assert_eq!(v["state"].as_str(), Some("paused"), "{v}");
    let until = v["paused_until_unix_ms"].as_i64().unwrap_or_else(|| panic!("a resume time: {v}"));
    let thirty = 30 * 60 * 1000;
    assert!((asked + thirty - 60_000..=unix_ms() + thirty + 60_000).contains(&until), "in 30 minutes: {until}");

    let id = enqueue(home, &db, &orch, &["--title", "while paused"]);
    let (job, _) = db.queue.job(id).await.unwrap().unwrap();
    // The paused machine writes its presence every 30 s: one written after the job was there
    // (and claimable for a second) still says paused, and the job is still queued.
    let after = job.created_at + 1_000;
    let paused_after = wait_for(WAIT, || async {
        db.queue.machines(&orch).await.unwrap().iter().any(|m| m.status.as_str() == "paused" && m.last_seen_at > after)
    })
    .await;
    assert!(paused_after, "a presence written after the enqueue says paused: {:?}", db.queue.machines(&orch).await);
    let (job, _) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!((job.state, job.attempts, job.claimed_by), (JobState::Queued, 0, None), "not claimed while paused");
    assert!(!started(&agent, id));
    let (code, out, err) = run_cli(home, url, &["status", "--orchestrator", &orch, "--json"], None);
    assert_eq!(code, 0, "{err}");
    let machines = parse(&out)["machines"].clone();
    assert_eq!(machines[0]["status"].as_str(), Some("paused"), "`status --json` says so: {machines}");

    let (code, out, err) = run_cli(home, url, &["resume", "--orchestrator", &orch], None);
    assert_eq!(code, 0, "{out}{err}");
    assert!(wait_for(WAIT, || async { state_is(&db, id, JobState::Completed).await }).await, "claimed on resume");
    assert!(started(&agent, id));
    assert!(
        wait_for(WAIT, || async {
            db.queue.machines(&orch).await.unwrap().iter().all(|m| m.status.as_str() == "online")
        })
        .await,
        "its presence says online again"
    );
}

/// A machine runs a repo-less job; `devpilot handoff` on its computer makes it stop the
/// agent and release the job, and prints the verdict: handed off, claiming paused, safe to
/// close the lid. The job is queued again with no holder and no attempt burned, and the
/// machine claims nothing (paused).
async fn handoff_releases_the_running_job_and_says_it_is_safe(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("handoff"));
    let agent = RecordingAgent::new(home, "echo working; sleep 60 & wait");
    let id = enqueue(home, &db, &orch, &["--title", "long work"]);
    let _m = spawn_runner(home, url, &orch, "laptop", &fast_flags(), &agent.script, &[]);
    assert!(wait_for(WAIT, || async { started(&agent, id) }).await, "the job runs");
    let sock = control_socket(home, &orch);
    assert!(wait_for(WAIT, || async { sock.exists() }).await, "the machine listens on {}", sock.display());

    let (code, out, err) = run_cli(home, url, &["handoff", "--orchestrator", &orch], None);
    assert_eq!(code, 0, "{out}{err}");
    for want in [format!("Handed off #{id}"), "Claiming is paused".into(), "Safe to close the lid".into()] {
        assert!(out.contains(&want), "the verdict says {want:?}: {out}");
    }
    let (job, _) = db.queue.job(id).await.unwrap().unwrap();
    // Released: queued, held by nobody (`claimed_by` keeps the last holder, as every release
    // in the store does; `claimed_at` is the hold).
    assert_eq!((job.state, job.claimed_at), (JobState::Queued, None), "released");
    assert!(db.queue.running(&orch).await.unwrap().is_empty(), "nothing is held");
    assert_eq!(job.attempts, 0, "the hand-off burned no attempt");
    assert!(agent.records().iter().any(|r| r.kind == "term" && r.job == id), "the agent was stopped");
    let history = db.queue.history(id).await.unwrap();
    assert!(history.iter().any(|e| e.kind == "handed_off"), "{history:?}");
    assert!(
        wait_for(WAIT, || async {
            db.queue.machines(&orch).await.unwrap().iter().any(|m| m.status.as_str() == "paused")
        })
        .await,
        "the machine is paused"
    );
    let (job, _) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Queued, "and does not take the job back");
}

/// A config naming a repo whose path does not exist and an agent CLI that is not on PATH:
/// `doctor` says both (the repo's path on a FAIL or warn line, the CLI not found on PATH),
/// ends with the count of problems and warnings, and exits 1; `doctor --json` says the same.
async fn doctor_names_a_missing_repo_and_a_missing_agent_cli(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (root, url) = (db.dir.path(), db.raw_url.as_str());
    let home = root.join("doctor");
    let missing = root.join("nowhere/webapp");
    write_config(&home, &format!("agent = \"some-missing-cli\"\n[repos.webapp]\npath = \"{}\"\n", missing.display()));
    let path = missing.display().to_string();

    let (code, out, err) = run_cli(&home, url, &["doctor"], None);
    assert_eq!(code, 1, "a FAIL exits 1: {out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.iter().any(|l| l.contains(&path) && (l.contains("FAIL") || l.contains("warn"))),
        "a FAIL or warn line names the repo's path {path}:\n{out}"
    );
    assert!(
        lines.iter().any(|l| l.contains("some-missing-cli") && l.contains("not found")),
        "a line says the CLI is not on PATH:\n{out}"
    );
    assert!(lines.iter().any(|l| l.contains("FAIL")), "{out}");
    let last = lines.iter().rev().find(|l| !l.trim().is_empty()).copied().unwrap_or_default();
    assert!(last.contains("problem") && last.contains("warning"), "ends with the counts: {last}");

    let (code, out, err) = run_cli(&home, url, &["doctor", "--json"], None);
    assert_eq!(code, 1, "{out}{err}");
    let v = parse(&out);
    assert_eq!(v["ok"].as_bool(), Some(false), "{v}");
    assert!(v["problems"].as_u64().is_some_and(|n| n >= 1), "{v}");
    assert!(v["warnings"].as_u64().is_some(), "{v}");
    let checks = v["checks"].as_array().unwrap_or_else(|| panic!("checks: {v}"));
    let bad = |c: &&Value| matches!(c["status"].as_str(), Some("fail" | "warn"));
    assert!(checks.iter().filter(bad).any(|c| c.to_string().contains(&path)), "the repo: {checks:?}");
    assert!(checks.iter().filter(bad).any(|c| c.to_string().contains("some-missing-cli")), "the CLI: {checks:?}");
    assert!(checks.iter().any(|c| c["status"] == "fail"), "{checks:?}");
    for c in checks {
        assert!(matches!(c["status"].as_str(), Some("ok" | "warn" | "fail")), "{c}");
    }
}

/// `jobs` lists only what the filters ask for: `--state queued --repo alpha` one job, and
/// each of --state, --repo, --machine and --limit alone; never another queue's job. The text
/// table has its documented header.
async fn jobs_filters_by_state_repo_and_machine(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("jobs"));
    let alpha = enqueue(home, &db, &orch, &["--title", "alpha one", "--repo", "alpha"]);
    let beta = enqueue(home, &db, &orch, &["--title", "beta one", "--repo", "beta"]);
    let gone = enqueue(home, &db, &orch, &["--title", "alpha two", "--repo", "alpha"]);
    db.queue.cancel(gone, "test").await.unwrap();
    let held = enqueue(home, &db, &orch, &["--title", "no repo"]);
    let claims = db.queue.claim_next(&orch, "box", 1).await.unwrap();
    assert_eq!(claims.iter().map(|c| c.fence.job).collect::<Vec<_>>(), vec![held], "box holds the repo-less job");
    let other = db.orch("other");
    enqueue(home, &db, &other, &["--title", "elsewhere", "--repo", "alpha"]);

    let jobs = |extra: &[&str]| {
        let mut args = vec!["jobs", "--orchestrator", orch.as_str(), "--json"];
        args.extend_from_slice(extra);
        let (code, out, err) = run_cli(home, url, &args, None);
        assert_eq!(code, 0, "{args:?}: {err}");
        ids_of(&parse(&out))
    };
    assert_eq!(jobs(&["--state", "queued", "--repo", "alpha"]), BTreeSet::from([alpha]));
    assert_eq!(jobs(&["--state", "queued"]), BTreeSet::from([alpha, beta]));
    assert_eq!(jobs(&["--repo", "alpha"]), BTreeSet::from([alpha, gone]));
    assert_eq!(jobs(&["--state", "cancelled"]), BTreeSet::from([gone]));
    assert_eq!(jobs(&["--machine", "box"]), BTreeSet::from([held]));
    assert_eq!(jobs(&[]), BTreeSet::from([alpha, beta, gone, held]), "never another queue's job");
    assert_eq!(jobs(&["--limit", "1"]).len(), 1);

    let (code, out, err) =
        run_cli(home, url, &["jobs", "--orchestrator", &orch, "--state", "queued", "--repo", "alpha", "--json"], None);
    assert_eq!(code, 0, "{err}");
    let v = parse(&out);
    let job = &v[0];
    assert_eq!(
        (job["state"].as_str(), job["repo"].as_str(), job["title"].as_str()),
        (Some("queued"), Some("alpha"), Some("alpha one")),
        "{v}"
    );

    let (code, out, err) = run_cli(home, url, &["jobs", "--orchestrator", &orch, "--repo", "alpha"], None);
    assert_eq!(code, 0, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["ID", "STATE", "REPO", "MACHINE", "AGE", "TITLE"], "{out}");
    assert!(out.lines().any(|l| l.contains(&alpha.to_string()) && l.contains("alpha one")), "{out}");
    assert!(!out.contains("beta one"), "{out}");
}

const KEY: &str = "lin_api_TESTSECRET_logout_5e4d3c2b1a";

/// `devpilot` in `home` with the private keychain `keys`, run to its end with `stdin`.
fn with_keychain(keys: &SecretService, home: &Path, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let url = format!("sqlite://{}", home.join("unused.sqlite").display());
    let mut c: Command = devpilot(home, &url);
    keys.apply(&mut c).env_remove("LINEAR_API_KEY").env_remove("GITHUB_TOKEN").env_remove("DEVPILOT_LINEAR_API_URL");
    c.args(args);
    run_to_end(c, stdin)
}

/// In a keychain of the test's own: `login --linear` stores the key (checked with Linear's
/// stand-in), `logout --linear` removes it from the keychain, and a second `logout --linear`
/// exits 4 (nothing stored). Without a terminal, `logout` and `login` with no flag exit 2
/// naming the flags. No database is involved, so this runs once.
#[test]
fn logout_removes_the_stored_linear_key() {
    let dir = tempfile::Builder::new().prefix("devpilot-test-").tempdir().unwrap();
    let keys = SecretService::start(&dir.path().join("keychain"));
    let linear = LinearStandIn::start(KEY);
    let home = dir.path().join("home");
    write_config(
        &home,
        &format!(
            "[sources.eng]\nkind = \"linear\"\nteams = [\"ENG\"]\nlabel = \"agent\"\nno_repo = true\napi_url = \"{}\"\n",
            linear.url()
        ),
    );
    let account = devpilot_engine::sources::keys::LINEAR_ACCOUNT;
    let service = devpilot_engine::secrets::SERVICE;
    assert_eq!(keys.lookup(service, account), None, "an empty keychain");

    let (code, out, err) = with_keychain(&keys, &home, &["login", "--linear"], Some(&format!("{KEY}\n")));
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(keys.lookup(service, account).as_deref().map(str::trim_end), Some(KEY), "stored: {out}");

    let (code, out, err) = with_keychain(&keys, &home, &["logout", "--linear"], None);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(keys.lookup(service, account), None, "removed from the keychain");
    let (code, out, err) = with_keychain(&keys, &home, &["logout", "--linear"], None);
    assert_eq!(code, 4, "nothing stored any more: {out}{err}");

    for verb in ["logout", "login"] {
        let (code, out, err) = with_keychain(&keys, &home, &[verb], None);
        assert_eq!(code, 2, "`{verb}` with no flag and no terminal: {out}{err}");
        assert!(err.contains("--linear") && err.contains("--github"), "names the flags: {err}");
    }
}
