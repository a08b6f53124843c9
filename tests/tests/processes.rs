//! Real machines are real processes: `devpilot run` OS processes racing, freezing, handing
//! off, and the CLI's answers to bad input. Every test runs on PostgreSQL and on SQLite.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use devpilot_store::job::JobState;
use devpilot_tests::{devpilot, run_cli, spawn_runner, wait_for, Backend, RecordingAgent, TestDb};
use serde_json::json;

devpilot_tests::on_both_backends!(
    four_runners_drain_2000_jobs_exactly_once,
    frozen_runner_cannot_complete_a_taken_job,
    hung_runner_writes_no_outcome_after_its_deadline,
    release_lets_another_runner_start_within_seconds,
    sigterm_hands_off_to_another_runner,
    bad_inputs_get_clear_messages,
    a_missing_agent_stops_claiming_until_it_is_back,
    a_killed_runner_takes_its_agent_with_it,
);

fn fast_flags() -> Vec<&'static str> {
    vec!["--poll-interval", "50ms", "--max-poll-interval", "200ms", "--sweep-interval", "200ms", "--cancel-grace", "2s"]
}

/// Four `devpilot run` processes (concurrency 2 each) drain 2,000 jobs. Every job executes
/// exactly once, and every runner exits 0 with --until-empty.
async fn four_runners_drain_2000_jobs_exactly_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("drain");
    let payloads: Vec<_> = (0..2000).map(|i| json!({"n": i})).collect();
    let ids = db.queue.enqueue_many(&orch, &payloads).await.unwrap();
    let agent = RecordingAgent::new(db.dir.path(), "true");
    let mut flags = fast_flags();
    flags.extend(["--concurrency", "2", "--until-empty"]);
    let mut runners: Vec<_> = (0..4)
        .map(|i| spawn_runner(db.dir.path(), &db.raw_url, &orch, &format!("m{i}"), &flags, &agent.script, &[]))
        .collect();
    for r in &mut runners {
        let code = r.wait_timeout(Duration::from_secs(600));
        assert_eq!(code, Some(0), "runner {} exits 0 once the queue is empty", r.machine);
    }
    let recs = agent.records();
    let mut starts: HashMap<i64, usize> = HashMap::new();
    for r in recs.iter().filter(|r| r.kind == "start") {
        *starts.entry(r.job).or_default() += 1;
    }
    assert_eq!(starts.len(), 2000, "every job executed");
    assert!(starts.values().all(|&n| n == 1), "no job executed twice");
    assert!(ids.iter().all(|id| starts.contains_key(id)));
    let machines: std::collections::HashSet<_> = recs.iter().map(|r| r.machine.clone()).collect();
    assert!(machines.len() >= 2, "the work was shared: {machines:?}");
    let c = db.queue.counts(&orch).await.unwrap();
    assert_eq!((c.completed, c.open()), (2000, 0));
    assert_eq!(db.queue.events_of_kind(&orch, "completed").await.unwrap().len(), 2000);
}

/// The lid closes: runner A and its agent are SIGSTOPped past the claim timeout; runner B
/// sweeps and takes the job. On SIGCONT, A's local deadline (on the boot clock) has passed:
/// A stops its agent without asking the database and records `lease_expired`; the job
/// completes exactly once, by B.
async fn frozen_runner_cannot_complete_a_taken_job(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("lid");
    let id = db.queue.enqueue(&orch, &json!({"title": "lid"})).await.unwrap();
    let agent = RecordingAgent::new(db.dir.path(), "sleep \"$AGENT_SLEEP\"");
    let mut flags = fast_flags();
    flags.extend(["--claim-timeout", "1500ms", "--heartbeat", "200ms"]);
    let a = spawn_runner(db.dir.path(), &db.raw_url, &orch, "laptop", &flags, &agent.script, &[("AGENT_SLEEP", "8")]);
    assert!(wait_for(Duration::from_secs(20), || async { agent.records().iter().any(|r| r.kind == "start") }).await);
    devpilot_tests::signal_tree(a.pid(), libc::SIGSTOP);
    let b = spawn_runner(db.dir.path(), &db.raw_url, &orch, "desktop", &flags, &agent.script, &[("AGENT_SLEEP", "1")]);
    assert!(
        wait_for(Duration::from_secs(20), || async {
            agent.records().iter().any(|r| r.kind == "start" && r.machine == "desktop")
        })
        .await,
        "desktop took the job over"
    );
    devpilot_tests::signal_tree(a.pid(), libc::SIGCONT);
    let q = db.queue.clone();
    assert!(
        wait_for(Duration::from_secs(20), || {
            let q = q.clone();
            async move { q.job(id).await.unwrap().unwrap().0.state == JobState::Completed }
        })
        .await
    );
    assert!(
        wait_for(Duration::from_secs(10), || async {
            agent.records().iter().any(|r| r.kind == "term" && r.machine == "laptop")
        })
        .await,
        "the laptop stopped its stale agent"
    );
    let recs = agent.records();
    assert!(!recs.iter().any(|r| r.kind == "end" && r.machine == "laptop"), "the stale agent never finished");
    let history = db.queue.history(id).await.unwrap();
    let kinds: Vec<(&str, Option<&str>)> = history.iter().map(|e| (e.kind.as_str(), e.machine.as_deref())).collect();
    assert_eq!(kinds.iter().filter(|k| k.0 == "completed").count(), 1, "{kinds:?}");
    assert!(kinds.contains(&("completed", Some("desktop"))), "{kinds:?}");
    assert!(kinds.contains(&("swept", Some("laptop"))), "{kinds:?}");
    assert!(kinds.contains(&("lease_expired", Some("laptop"))), "{kinds:?}");
    drop((a, b));
}

/// The runner hangs but its agent keeps going and finishes; another machine has meanwhile
/// taken the job. When the runner resumes, its local deadline has passed, so it writes no
/// outcome for the finished agent and records `lease_expired`; the job completes exactly
/// once, by the other machine.
async fn hung_runner_writes_no_outcome_after_its_deadline(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("hung");
    let id = db.queue.enqueue(&orch, &json!({})).await.unwrap();
    let agent = RecordingAgent::new(db.dir.path(), "sleep \"$AGENT_SLEEP\"");
    let mut flags = fast_flags();
    flags.extend(["--claim-timeout", "1500ms", "--heartbeat", "200ms"]);
    let a = spawn_runner(db.dir.path(), &db.raw_url, &orch, "hung", &flags, &agent.script, &[("AGENT_SLEEP", "1")]);
    assert!(wait_for(Duration::from_secs(20), || async { agent.records().iter().any(|r| r.kind == "start") }).await);
    // Only the runner stops; its agent runs on and finishes.
    unsafe { libc::kill(a.pid() as i32, libc::SIGSTOP) };
    let b = spawn_runner(db.dir.path(), &db.raw_url, &orch, "healthy", &flags, &agent.script, &[("AGENT_SLEEP", "0")]);
    let q = db.queue.clone();
    assert!(
        wait_for(Duration::from_secs(20), || {
            let q = q.clone();
            async move { q.job(id).await.unwrap().unwrap().0.state == JobState::Completed }
        })
        .await
    );
    assert!(agent.records().iter().any(|r| r.kind == "end" && r.machine == "hung"), "the hung runner's agent finished");
    unsafe { libc::kill(a.pid() as i32, libc::SIGCONT) };
    let q = db.queue.clone();
    assert!(
        wait_for(Duration::from_secs(10), || {
            let q = q.clone();
            async move {
                q.history(id)
                    .await
                    .unwrap()
                    .iter()
                    .any(|e| e.kind == "lease_expired" && e.machine.as_deref() == Some("hung"))
            }
        })
        .await,
        "the expired lease was recorded"
    );
    let history = db.queue.history(id).await.unwrap();
    assert!(!history.iter().any(|e| e.machine.as_deref() == Some("hung") && e.kind.starts_with("completion")));
    assert_eq!(history.iter().filter(|e| e.kind == "completed").count(), 1);
    assert_eq!(history.iter().find(|e| e.kind == "completed").unwrap().machine.as_deref(), Some("healthy"));
    drop((a, b));
}

/// The laptop's lid is closed with a job on it; `devpilot release --machine laptop`, run
/// from elsewhere, asks it to hand off, gets no answer within its bound, releases the job
/// directly (saying its work stayed on the laptop); an idle runner starts it within seconds,
/// and when the laptop wakes it stops its stale agent.
async fn release_lets_another_runner_start_within_seconds(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("release");
    let id = db.queue.enqueue(&orch, &json!({})).await.unwrap();
    let agent = RecordingAgent::new(db.dir.path(), "sleep \"$AGENT_SLEEP\"");
    let mut flags = fast_flags();
    flags.extend(["--heartbeat", "300ms"]);
    let a = spawn_runner(db.dir.path(), &db.raw_url, &orch, "laptop", &flags, &agent.script, &[("AGENT_SLEEP", "30")]);
    assert!(wait_for(Duration::from_secs(20), || async { agent.records().iter().any(|r| r.kind == "start") }).await);
    let b = spawn_runner(db.dir.path(), &db.raw_url, &orch, "desktop", &flags, &agent.script, &[("AGENT_SLEEP", "0")]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    devpilot_tests::signal_tree(a.pid(), libc::SIGSTOP);
    let released_at = Instant::now();
    let out = devpilot(db.dir.path(), &db.raw_url)
        .args(["release", "--orchestrator", &orch, "--machine", "laptop", "--wait", "2s"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    // The frozen laptop cannot answer the request (it renews every 300 ms when awake).
    assert!(said.contains(&format!("#{id}")) && said.contains("did not answer within 2s"), "{said}");
    assert!(said.contains("stayed on laptop"), "{said}");
    let q = db.queue.clone();
    assert!(
        wait_for(Duration::from_secs(10), || {
            let q = q.clone();
            async move { q.job(id).await.unwrap().unwrap().0.state == JobState::Completed }
        })
        .await
    );
    assert!(released_at.elapsed() < Duration::from_secs(10));
    devpilot_tests::signal_tree(a.pid(), libc::SIGCONT);
    assert!(
        wait_for(Duration::from_secs(10), || async {
            agent.records().iter().any(|r| r.kind == "term" && r.machine == "laptop")
        })
        .await,
        "the laptop's agent was stopped"
    );
    let history = db.queue.history(id).await.unwrap();
    assert!(history.iter().any(|e| e.kind == "handed_off"));
    assert_eq!(history.iter().find(|e| e.kind == "completed").unwrap().machine.as_deref(), Some("desktop"));
    drop((a, b));
}

/// SIGTERM makes a runner hand off cleanly: its agent stops, its claim is released, it
/// exits 0, and another runner finishes the job within seconds.
async fn sigterm_hands_off_to_another_runner(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("term");
    let id = db.queue.enqueue(&orch, &json!({})).await.unwrap();
    let agent = RecordingAgent::new(db.dir.path(), "sleep \"$AGENT_SLEEP\"");
    let flags = fast_flags();
    let mut a =
        spawn_runner(db.dir.path(), &db.raw_url, &orch, "laptop", &flags, &agent.script, &[("AGENT_SLEEP", "30")]);
    assert!(wait_for(Duration::from_secs(20), || async { agent.records().iter().any(|r| r.kind == "start") }).await);
    let b = spawn_runner(db.dir.path(), &db.raw_url, &orch, "desktop", &flags, &agent.script, &[("AGENT_SLEEP", "0")]);
    let t0 = Instant::now();
    unsafe { libc::kill(a.pid() as i32, libc::SIGTERM) };
    assert_eq!(a.wait_timeout(Duration::from_secs(10)), Some(0), "runner exits cleanly");
    let q = db.queue.clone();
    assert!(
        wait_for(Duration::from_secs(10), || {
            let q = q.clone();
            async move { q.job(id).await.unwrap().unwrap().0.state == JobState::Completed }
        })
        .await
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(agent.records().iter().any(|r| r.kind == "term" && r.machine == "laptop"));
    let (row, _) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!(row.attempts, 1, "the hand-off did not burn an attempt");
    drop(b);
}

/// kill -9 of a runner (the runner alone, not its process group) takes its agent with it
/// (PR_SET_PDEATHSIG, which the spawner sets in the agent before it execs), so that a dead
/// machine never leaves an agent working on a job the sweep hands to another.
async fn a_killed_runner_takes_its_agent_with_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("orphan");
    db.queue.enqueue(&orch, &json!({})).await.unwrap();
    let agent = RecordingAgent::new(db.dir.path(), "exec sleep 60");
    let mut a = spawn_runner(db.dir.path(), &db.raw_url, &orch, "laptop", &fast_flags(), &agent.script, &[]);
    assert!(wait_for(Duration::from_secs(20), || async { agent.records().iter().any(|r| r.kind == "start") }).await);
    // The agent as this machine sees it (in its sandbox, `$$` is its pid inside): the
    // runner's descendant that is the `sleep` it became.
    let is_sleep = |p: &u32| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep\0"));
    let sleeping = || devpilot_tests::descendants(a.pid()).into_iter().find(is_sleep);
    assert!(wait_for(Duration::from_secs(20), || async { sleeping().is_some() }).await, "the agent sleeps");
    let pid = sleeping().expect("the agent's process") as libc::pid_t;
    // A pidfd of the agent (not our child) becomes readable when it exits: the signal waited on.
    // SAFETY: pidfd_open returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as libc::c_int;
    assert!(fd >= 0, "the agent {pid} runs: {}", std::io::Error::last_os_error());
    // SAFETY: plain kill(2) of our own child, the runner alone.
    unsafe { libc::kill(a.pid() as i32, libc::SIGKILL) };
    assert!(a.wait_timeout(Duration::from_secs(10)).is_some(), "the runner died");
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: poll(2) on one descriptor we own, then close(2) of it.
    let ready = unsafe { libc::poll(&mut p, 1, 10_000) };
    unsafe { libc::close(fd) };
    assert_eq!(ready, 1, "the agent {pid} outlived its killed runner");
}

/// The agent program disappears while a runner is up: the runner hands the job it just
/// claimed back (no attempt burned), stops claiming, says why in `devpilot status`, and does
/// not claim and release in a loop while it keeps checking; once the program is back, it
/// claims again and the job completes.
async fn a_missing_agent_stops_claiming_until_it_is_back(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("noagent");
    let agent = RecordingAgent::new(db.dir.path(), "true");
    let hidden = agent.script.with_extension("away");
    let r = spawn_runner(db.dir.path(), &db.raw_url, &orch, "box", &fast_flags(), &agent.script, &[]);
    let first = db.queue.enqueue(&orch, &json!({})).await.unwrap();
    let q = db.queue.clone();
    let state = |id: i64| {
        let q = q.clone();
        async move { q.job(id).await.unwrap().unwrap().0 }
    };
    assert!(wait_for(Duration::from_secs(20), || async { state(first).await.state == JobState::Completed }).await);

    std::fs::rename(&agent.script, &hidden).unwrap();
    let second = db.queue.enqueue(&orch, &json!({})).await.unwrap();
    let home = db.dir.path();
    assert!(
        wait_for(Duration::from_secs(20), || async {
            run_cli(home, &db.raw_url, &["status", "--orchestrator", &orch], None).1.contains("not claiming")
        })
        .await,
        "status says why the machine is not claiming"
    );
    let (_, out, _) = run_cli(home, &db.raw_url, &["status", "--orchestrator", &orch], None);
    assert!(out.contains(agent.script.to_str().unwrap()), "names the program: {out}");
    // Several rechecks later (the runner logs each), still one claim and one hand-back.
    assert!(
        wait_for(Duration::from_secs(20), || async {
            std::fs::read_to_string(&r.log).unwrap_or_default().matches("the agent still cannot run").count() >= 3
        })
        .await
    );
    let kinds = |id: i64| {
        let q = q.clone();
        async move { q.history(id).await.unwrap().into_iter().map(|e| e.kind).collect::<Vec<_>>() }
    };
    assert_eq!(kinds(second).await, ["claimed", "handed_off"], "no claim-and-release loop");
    let row = state(second).await;
    assert_eq!((row.state.as_str(), row.attempts), ("queued", 0), "unharmed");

    std::fs::rename(&hidden, &agent.script).unwrap();
    assert!(wait_for(Duration::from_secs(20), || async { state(second).await.state == JobState::Completed }).await);
    assert_eq!(kinds(second).await, ["claimed", "handed_off", "claimed", "completed"]);
    drop(r);
}

/// Malformed JSON, an unknown flag, bad and unreachable URLs, a wrong password and a missing
/// agent each get a clear message and a non-zero exit; nothing is written.
async fn bad_inputs_get_clear_messages(backend: Backend) {
    let db = TestDb::new(backend).await;
    let home = db.dir.path();
    let url = db.raw_url.as_str();
    let orch = db.orch("bad");

    let (code, _, err) =
        run_cli(home, url, &["enqueue", "--orchestrator", &orch, "--payload", "{\"title\": oops"], None);
    assert_eq!(code, 1);
    assert!(err.contains("malformed payload: not valid JSON"), "{err}");
    let (code, _, err) = run_cli(home, url, &["enqueue", "--orchestrator", &orch], Some("not json"));
    assert_eq!(code, 1);
    assert!(err.contains("malformed payload"), "{err}");
    let (code, _, err) =
        run_cli(home, url, &["enqueue", "--orchestrator", &orch, "--payload-file", "/nonexistent/p.json"], None);
    assert_eq!(code, 1);
    assert!(err.contains("cannot read /nonexistent/p.json"), "{err}");
    assert_eq!(db.queue.counts(&orch).await.unwrap(), Default::default(), "nothing was written");

    let (code, _, err) = run_cli(home, url, &["enqueue", "--orchestrator", &orch, "--bogus"], None);
    assert_eq!(code, 2);
    assert!(err.contains("unexpected argument '--bogus'"), "{err}");

    let (code, _, err) = run_cli(home, "mysql://u:hunter2@h/d", &["status", "--orchestrator", &orch], None);
    assert_eq!(code, 1);
    assert!(err.contains("invalid database URL") && err.contains("unsupported scheme"), "{err}");
    assert!(!err.contains("hunter2"), "no password in messages: {err}");

    let (code, _, err) =
        run_cli(home, "postgres://u:hunter2@127.0.0.1:1/d", &["status", "--orchestrator", &orch], None);
    assert_eq!(code, 1);
    assert!(err.contains("cannot reach the database at 127.0.0.1:1/d"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");

    let pg = devpilot_tests::shared_pg();
    let (code, _, err) =
        run_cli(home, &pg.url_with_wrong_password("postgres"), &["status", "--orchestrator", &orch], None);
    assert_eq!(code, 1);
    assert!(err.contains("rejected the login for user 'postgres'"), "{err}");
    assert!(!err.contains("wrong-"), "the attempted password is not echoed: {err}");

    let (code, out, _) =
        run_cli(home, url, &["enqueue", "--orchestrator", &orch, "--payload", "{\"title\": \"ok\"}"], None);
    assert_eq!(code, 0);
    let id: i64 = out.trim().parse().unwrap();
    let (code, _, err) = run_cli(home, url, &["run", "--orchestrator", &orch, "--", "/no/such/agent-binary"], None);
    assert_eq!(code, 1);
    assert!(err.contains("agent program '/no/such/agent-binary' was not found"), "{err}");
    let (code, _, err) = run_cli(home, url, &["run", "--orchestrator", &orch, "--", "no-such-agent-on-path"], None);
    assert_eq!(code, 1);
    assert!(err.contains("'no-such-agent-on-path' was not found"), "{err}");
    let (row, _) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!((row.state.as_str(), row.attempts), ("queued", 0), "a bad agent claims nothing");

    let (code, out, _) = run_cli(home, url, &["status", "--orchestrator", &orch, "--json"], None);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["counts"]["queued"], 1);
}

/// Processes that open a fresh SQLite file at the same moment (the tray, `devpilot run`, a
/// `devpilot jobs` typed meanwhile) all succeed: they take turns to migrate it. Without the
/// turn, two add the same column and one fails with "duplicate column name".
#[test]
fn processes_opening_a_fresh_sqlite_file_at_once_all_succeed() {
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("fresh.sqlite").display());
        let children: Vec<_> = (0..6)
            .map(|_| {
                devpilot(dir.path(), &url)
                    .args(["jobs", "--orchestrator", "race", "--json"])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "round {round}: {err}");
        }
    }
}
