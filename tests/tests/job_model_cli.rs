//! The job model through real processes: the `devpilot` CLI's contract (keys, schedules,
//! backoff flags, cancel, requeue, prune, status) and `devpilot run` machines that are told
//! to cancel, park on exit 75, keep results, and wake for a scheduled job when it is due.
//! Every test runs on PostgreSQL and on SQLite.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_tests::{run_cli, spawn_runner, wait_for, Backend, RecordingAgent, TestDb};
use serde_json::json;

devpilot_tests::on_both_backends!(
    enqueue_with_a_live_key_prints_that_job,
    bad_job_model_inputs_exit_non_zero_and_write_nothing,
    a_running_job_is_cancelled_from_another_machine,
    exit_75_parks_and_results_are_kept,
    a_scheduled_job_is_claimed_when_due_not_at_the_idle_poll,
    status_shows_backoffs_and_prune_deletes_old_work,
);

const DAY: Duration = Duration::from_secs(86_400);

fn fast_flags() -> Vec<&'static str> {
    vec!["--poll-interval", "50ms", "--max-poll-interval", "200ms", "--sweep-interval", "200ms", "--cancel-grace", "2s"]
}

/// `enqueue --key` while the key's job is live prints that job's id on stdout, says so on
/// stderr, exits 4 and adds nothing; once the job is cancelled the key gets a new job.
async fn enqueue_with_a_live_key_prints_that_job(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("key"));
    let args = ["enqueue", "--orchestrator", &orch, "--key", "linear:ENG-7", "--payload", "{\"title\":\"ENG-7\"}"];
    let (code, out, err) = run_cli(home, url, &args, None);
    assert_eq!((code, err.as_str()), (0, ""), "{err}");
    let id: i64 = out.trim().parse().unwrap();
    let (code, out, err) = run_cli(home, url, &args, None);
    assert_eq!(code, 4, "found, not added: status 4");
    assert_eq!(out.trim(), id.to_string(), "the live job's id on stdout");
    assert!(err.contains(&format!("job #{id} with key 'linear:ENG-7' is already live (queued)")), "{err}");
    assert_eq!(db.queue.counts(&orch).await.unwrap().queued, 1);

    let (code, out, _) = run_cli(home, url, &["cancel", &id.to_string()], None);
    assert_eq!((code, out.trim()), (0, format!("cancelled #{id}").as_str()));
    let (code, out, err) = run_cli(home, url, &args, None);
    assert_eq!((code, err.as_str()), (0, ""));
    assert_ne!(out.trim(), id.to_string(), "a finished job frees its key");

    // Priority, schedule and backoff flags are stored on the job.
    let args = [
        "enqueue",
        "--orchestrator",
        &orch,
        "--priority",
        "-2",
        "--delay",
        "10m",
        "--retry-backoff",
        "10s",
        "--retry-backoff-max",
        "1m",
        "--payload",
        "{}",
    ];
    let (code, out, err) = run_cli(home, url, &args, None);
    assert_eq!(code, 0, "{err}");
    let id: i64 = out.trim().parse().unwrap();
    let (row, _) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!(row.priority, -2);
    assert!((590_000..=600_000).contains(&(row.run_at - row.now)), "due in 10 m: {}", row.run_at - row.now);
    let col = |c: &str| format!("SELECT {c} FROM dispatch_queue WHERE id = {id}");
    assert_eq!(db.scalar(&col("retry_backoff_ms")).await, Some(10_000));
    assert_eq!(db.scalar(&col("retry_backoff_max_ms")).await, Some(60_000));
}

/// A 10,000-character key, a `--run-at` that does not parse, `--priority abc`, and
/// cancelling or requeueing a job that does not exist: a clear error, a non-zero exit, no row.
async fn bad_job_model_inputs_exit_non_zero_and_write_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("bad"));
    let long = "k".repeat(10_000);
    let enqueue = |extra: &[&str]| {
        let mut a = vec!["enqueue", "--orchestrator", orch.as_str(), "--payload", "{}"];
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (enqueue(&["--key", &long]), 1, "the key is 10000 bytes long; at most 512"),
        (enqueue(&["--run-at", "next tuesday"]), 1, "--run-at 'next tuesday' is not an RFC 3339 time"),
        (enqueue(&["--delay", "soon"]), 1, "'soon' is not a duration"),
        (enqueue(&["--priority", "abc"]), 2, "invalid value 'abc' for '--priority"),
        (enqueue(&["--retry-backoff", "0s"]), 1, "retry backoff must be between"),
        (vec!["cancel".into(), "999999".into()], 3, "there is no job #999999"),
        (vec!["requeue".into(), "999999".into()], 3, "there is no job #999999"),
        (vec!["cancel".into(), "abc".into()], 2, "invalid value 'abc'"),
    ];
    for (args, want, text) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, err) = run_cli(home, url, &args, None);
        assert_eq!(code, want, "{args:?}: {err}");
        assert!(err.contains(text), "{args:?}: {err}");
    }
    assert_eq!(db.queue.counts(&orch).await.unwrap(), Default::default(), "no row");
    // A job that is not in a state to be requeued says which state it is in.
    let id = db.queue.enqueue(&orch, &json!({})).await.unwrap();
    let (code, _, err) = run_cli(home, url, &["requeue", &id.to_string()], None);
    assert_eq!(code, 4, "nothing to do");
    let said = format!("#{id} is queued: only dead, failed or cancelled jobs, or jobs parked at a spend cap or on a usage limit, can be requeued");
    assert!(err.contains(&said), "{err}");
}

/// Machine "laptop" (a `devpilot run` process) runs a long agent; `devpilot cancel` from
/// another process asks for the cancel. The laptop stops the agent (SIGTERM) and the job
/// ends cancelled, never completed; history names who asked and who stopped it. On
/// PostgreSQL the heartbeat is 20 s, so a stop within seconds proves the NOTIFY path; on
/// SQLite the next renewal (every 300 ms) carries it.
async fn a_running_job_is_cancelled_from_another_machine(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("cancel"));
    let id = db.queue.enqueue(&orch, &json!({"title": "long"})).await.unwrap();
    let agent = RecordingAgent::new(home, "sleep 60 & wait");
    let mut flags = fast_flags();
    let heartbeat = if backend == Backend::Postgres { "20s" } else { "300ms" };
    flags.extend(["--heartbeat", heartbeat, "--claim-timeout", "2m"]);
    let _laptop = spawn_runner(home, url, &orch, "laptop", &flags, &agent.script, &[]);
    assert!(wait_for(Duration::from_secs(20), || async { agent.records().iter().any(|r| r.kind == "start") }).await);

    let asked_at = std::time::Instant::now();
    let (code, out, err) = run_cli(home, url, &["cancel", &id.to_string()], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("asked laptop to stop"), "{out}");
    let ended = wait_for(Duration::from_secs(15), || async {
        db.queue.job(id).await.unwrap().is_some_and(|(j, _)| j.state == JobState::Cancelled)
    })
    .await;
    assert!(ended, "the job ended cancelled");
    assert!(asked_at.elapsed() < Duration::from_secs(15), "well before the 20 s heartbeat on PostgreSQL");
    assert!(agent.records().iter().any(|r| r.kind == "term" && r.job == id), "the agent was stopped");
    assert!(!agent.records().iter().any(|r| r.kind == "end"), "and never finished");
    let h = db.queue.history(id).await.unwrap();
    let kinds: Vec<&str> = h.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["claimed", "cancel_requested", "cancelled"]);
    let asker = devpilot_engine::settings::default_machine_name();
    assert_eq!(h[1].machine.as_deref(), Some(asker.as_str()), "who asked");
    assert_eq!(h[2].machine.as_deref(), Some("laptop"), "who stopped the agent");
    assert_eq!(h[2].detail.as_deref(), Some(format!("agent stopped on laptop; cancel asked by {asker}").as_str()));
    let (code, out, _) = run_cli(home, url, &["cancel", &id.to_string()], None);
    assert_eq!((code, out.trim()), (4, format!("#{id} is already cancelled").as_str()));
    let (code, out, _) = run_cli(home, url, &["requeue", &id.to_string()], None);
    assert_eq!((code, out.trim()), (0, format!("requeued #{id}").as_str()));
}

/// An agent that exits 75 with `retry_after` in its result file is parked: queued, the
/// attempt not counted, claimable in an hour, history `parked`. One that writes a summary
/// and a link has them kept and shown by `status --json`; a malformed result file is
/// ignored and its job still completes.
async fn exit_75_parks_and_results_are_kept(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("park"));
    let park = db.queue.enqueue(&orch, &json!({"title": "limited", "do": "park"})).await.unwrap();
    let done = db.queue.enqueue(&orch, &json!({"title": "fix", "do": "summary"})).await.unwrap();
    let garbled = db.queue.enqueue(&orch, &json!({"title": "odd", "do": "garbage"})).await.unwrap();
    let body = r#"case "$payload" in
  *park*) echo '{"retry_after": 3600, "summary": "usage limit reached"}' > "$DEVPILOT_RESULT_FILE"; exit 75;;
  *summary*) echo '{"summary": "fixed the redirect", "url": "https://example.test/pr/1"}' > "$DEVPILOT_RESULT_FILE";;
  *garbage*) echo '{"summary": ' > "$DEVPILOT_RESULT_FILE";;
esac"#;
    let agent = RecordingAgent::new(home, body);
    let _m = spawn_runner(home, url, &orch, "m", &fast_flags(), &agent.script, &[]);
    let settled = wait_for(Duration::from_secs(30), || async {
        let c = db.queue.counts(&orch).await.unwrap();
        c.completed == 2 && c.queued == 1 && c.running == 0
    })
    .await;
    assert!(settled, "{:?}", db.queue.counts(&orch).await.unwrap());

    let (row, _) = db.queue.job(park).await.unwrap().unwrap();
    assert_eq!((row.state.as_str(), row.attempts), ("queued", 0), "parked, the attempt not counted");
    assert!((3_500_000..=3_600_000).contains(&(row.run_at - row.now)), "for an hour: {}", row.run_at - row.now);
    assert_eq!(row.summary.as_deref(), Some("usage limit reached"));
    let last = db.queue.history(park).await.unwrap().pop().unwrap();
    assert_eq!(last.kind, "parked");
    assert!(last.detail.unwrap().contains("claimable again at"));
    assert_eq!(
        db.queue.job(garbled).await.unwrap().unwrap().0.state,
        JobState::Completed,
        "a bad result file fails nothing"
    );

    let (code, out, err) = run_cli(home, url, &["status", "--orchestrator", &orch, "--json"], None);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let fixed = v["recent"].as_array().unwrap().iter().find(|j| j["id"] == done).unwrap();
    assert_eq!(
        (fixed["summary"].as_str(), fixed["url"].as_str()),
        (Some("fixed the redirect"), Some("https://example.test/pr/1"))
    );
    let waiting = v["waiting"].as_array().unwrap();
    assert_eq!(waiting.len(), 1);
    assert!(waiting[0]["waiting"].as_str().unwrap().starts_with("starts in 59m"), "{}", waiting[0]["waiting"]);
    let log = std::fs::read_to_string(home.join("runner-m.log")).unwrap();
    assert!(log.contains("ignoring the agent's result file"), "the malformed file is logged");
}

/// A machine polling every 5 minutes claims a job scheduled 2 s out within seconds of it
/// being due, never before. PostgreSQL: the machine is idle when the job is enqueued, and
/// the insert's NOTIFY carries the due time. SQLite: the job is there first, and the empty
/// poll's next-due time caps the timer.
async fn a_scheduled_job_is_claimed_when_due_not_at_the_idle_poll(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("due"));
    let agent = RecordingAgent::new(home, "true");
    let flags = ["--poll-interval", "5m", "--max-poll-interval", "5m"];
    let enqueue = || async {
        let (code, out, err) =
            run_cli(home, url, &["enqueue", "--orchestrator", &orch, "--delay", "2s", "--payload", "{}"], None);
        assert_eq!(code, 0, "{err}");
        out.trim().parse::<i64>().unwrap()
    };
    let (id, _m) = if backend == Backend::Postgres {
        let m = spawn_runner(home, url, &orch, "m", &flags, &agent.script, &[]);
        // Its first poll (which carries its presence row) has come and gone.
        assert!(
            wait_for(Duration::from_secs(20), || async { !db.queue.machines(&orch).await.unwrap().is_empty() }).await
        );
        tokio::time::sleep(Duration::from_millis(300)).await; // let the LISTEN connection settle
        (enqueue().await, m)
    } else {
        let id = enqueue().await;
        (id, spawn_runner(home, url, &orch, "m", &flags, &agent.script, &[]))
    };
    let done = wait_for(Duration::from_secs(30), || async {
        db.queue.job(id).await.unwrap().is_some_and(|(j, _)| j.state == JobState::Completed)
    })
    .await;
    assert!(done, "claimed when due, not at the next 5-minute poll");
    let (row, _) = db.queue.job(id).await.unwrap().unwrap();
    let claimed = db.queue.history(id).await.unwrap().into_iter().find(|e| e.kind == "claimed").unwrap();
    assert!(claimed.at >= row.run_at, "not before it was due: claimed {} due {}", claimed.at, row.run_at);
    assert!(claimed.at - row.run_at < 10_000, "soon after: {} ms late", claimed.at - row.run_at);
}

/// `devpilot status` says "retry in …" for a failed attempt waiting out its backoff, and
/// what a job's agent reported (preset, session, cost, tokens, resumed from), as text and
/// in `--json`; `devpilot prune` deletes finished jobs past the retention (or `--older-than`).
async fn status_shows_backoffs_and_prune_deletes_old_work(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("status"));
    let ids = db.queue.enqueue_many(&orch, &[json!({"title": "flaky"}), json!({}), json!({})]).await.unwrap();
    let claims = db.queue.claim_next(&orch, "m", 3).await.unwrap();
    db.queue.fail(&claims[0].fence, "m", "exit 1").await.unwrap();
    for c in &claims[1..] {
        db.queue.complete(&c.fence, "m").await.unwrap();
    }
    let (code, out, err) = run_cli(home, url, &["status", "--orchestrator", &orch], None);
    assert_eq!(code, 0, "{err}");
    let line = out.lines().find(|l| l.contains(&format!("#{}", ids[0]))).unwrap_or_default();
    assert!(line.contains("retry in ") && line.contains("after attempt 1 of 3: exit 1"), "{out}");

    // What a preset's CLI reported (written as the engine writes it: plain columns) is in
    // `status --json` under `agent`, and on a line under the job in `status`.
    db.exec(&format!(
        "UPDATE dispatch_queue SET agent = 'claude', agent_session = 'b5f7c2d1-9e4a-4f0b-8c3d-2a1e6f7b9c0d',
                cost_usd = 0.0997, tokens_in = 24693, tokens_out = 45, session_from = 'laptop' WHERE id = {}",
        ids[1]
    ))
    .await;
    db.exec(&format!("UPDATE dispatch_queue SET agent = 'codex' WHERE id = {}", ids[0])).await;
    let (code, out, err) = run_cli(home, url, &["status", "--orchestrator", &orch, "--json"], None);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let done = v["recent"].as_array().unwrap().iter().find(|j| j["id"] == ids[1]).unwrap();
    assert_eq!(
        done["agent"],
        json!({"agent": "claude", "agent_session": "b5f7c2d1-9e4a-4f0b-8c3d-2a1e6f7b9c0d", "cost_usd": 0.0997,
               "tokens_in": 24693, "tokens_out": 45, "session_from": "laptop"})
    );
    let (code, out, err) = run_cli(home, url, &["status", "--orchestrator", &orch], None);
    assert_eq!(code, 0, "{err}");
    let after = |id: i64| {
        let mut lines = out.lines().skip_while(|l| !l.contains(&format!("#{id} "))).skip(1);
        lines.next().unwrap_or_default().trim().to_string()
    };
    assert_eq!(
        after(ids[1]),
        "agent: claude · session b5f7c2d1… · $0.0997 · 24,693 in / 45 out tokens · resumed from laptop",
        "{out}"
    );
    assert_eq!(after(ids[0]), "agent: codex", "{out}");
    assert!(out.contains("recently finished:"), "{out}");

    db.age_finished(ids[1], 15 * DAY).await;
    db.age_finished(ids[2], Duration::from_secs(7200)).await;
    let (code, out, err) = run_cli(home, url, &["prune"], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("deleted 1 finished job(s) with their history"), "{out}");
    let (code, out, _) = run_cli(home, url, &["prune", "--older-than", "1h", "--orchestrator", &orch], None);
    assert_eq!(code, 0);
    assert!(out.starts_with("deleted 1 finished job(s)"), "{out}");
    assert!(db.queue.job(ids[1]).await.unwrap().is_none() && db.queue.job(ids[2]).await.unwrap().is_none());
    assert_eq!(db.queue.job(ids[0]).await.unwrap().unwrap().0.state, JobState::Failed, "live work is untouched");
}
