//! Linear issues in and results back, through real `devpilot run` processes and the CLI,
//! against the harness's loopback stand-in for Linear (which refuses any document its
//! published schema does not allow). Every test runs on PostgreSQL and on SQLite. Time
//! passes by moving the source's and the outbox's timestamps, never by sleeping.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_store::queue::JobRow;
use devpilot_tests::linear::{Fault, IssueSeed};
use devpilot_tests::sources::{self, age_source, assert_no_secret, jobs, next_turn, turns};
use devpilot_tests::{write_config, Backend, LinearStandIn, RecordingAgent, Runner, TestDb};
use serde_json::json;

devpilot_tests::on_both_backends!(
    two_machines_add_each_issue_once_and_call_linear_once_per_turn,
    a_comment_applied_before_its_answer_was_lost_is_posted_once,
    a_machine_killed_after_completing_leaves_its_report_to_another,
    an_issue_that_leaves_the_filter_cancels_its_queued_and_running_jobs,
    sources_poll_adds_updates_and_cancels_by_key,
    a_wrong_key_is_said_and_the_machine_works_on,
    a_source_that_names_no_repo_takes_no_issue,
    a_rate_limit_holds_the_source_until_its_reset,
    a_source_never_cancels_another_sources_job,
    sources_add_tests_the_source_and_never_replaces_one,
);

const KEY: &str = "lin_api_TESTSECRET_9f8e7d6c5b4a";
const WAIT: Duration = Duration::from_secs(60);

/// A machine's home with a config naming the source `eng` on the stand-in, plus `report`
/// TOML lines inside `[sources.eng]`'s report table.
fn home_with_source(root: &Path, name: &str, orch: &str, api_url: &str, report: &str) -> PathBuf {
    home_with(root, name, orch, api_url, "", report)
}

/// [`home_with_source`] with `extra` TOML lines in `[sources.eng]` itself. Calls time out
/// after 10 s unless `extra` sets `timeout`: long enough that a loaded machine's slow answer
/// is not taken for a lost one.
fn home_with(root: &Path, name: &str, orch: &str, api_url: &str, extra: &str, report: &str) -> PathBuf {
    let timeout = if extra.contains("timeout") { "" } else { "timeout = \"10s\"\n" };
    // Repo-less jobs on purpose, unless `extra` says where they run.
    let no_repo = if extra.contains("no_repo") || extra.contains("maps_to") { "" } else { "no_repo = true\n" };
    let home = root.join(name);
    std::fs::create_dir_all(&home).unwrap();
    write_config(
        &home,
        &format!(
            "orchestrator_id = \"{orch}\"\n\
             [sources.eng]\nkind = \"linear\"\nteams = [\"ENG\"]\nlabel = \"agent\"\ninterval = \"15s\"\n\
             {no_repo}{timeout}api_url = \"{api_url}\"\n{extra}\n\
             [sources.eng.report]\n{report}\n"
        ),
    );
    home
}

/// `devpilot run` for `orch` as `machine` in `home`, with `key` as `LINEAR_API_KEY` (for the
/// runner only: no agent is given it).
fn machine(home: &Path, db: &TestDb, orch: &str, name: &str, agent: &Path, key: Option<&str>) -> Runner {
    let env: Vec<(&str, &str)> = key.map(|k| ("LINEAR_API_KEY", k)).into_iter().collect();
    sources::machine(home, db, orch, name, agent, &env)
}

/// The CLI in `home` with the key: (exit code, stdout, stderr).
fn cli(home: &Path, db: &TestDb, key: &str, args: &[&str]) -> (i32, String, String) {
    sources::cli(home, db, &[("LINEAR_API_KEY", key)], args)
}

async fn job_of(db: &TestDb, orch: &str, identifier: &str) -> Option<JobRow> {
    let key = format!("linear:{identifier}");
    jobs(db, orch).await.into_iter().find(|j| j.unique_key.as_deref() == Some(key.as_str()))
}

/// An agent that says what it did (its result file) and succeeds.
fn summarising_agent(dir: &Path) -> RecordingAgent {
    RecordingAgent::new(dir, r#"printf '{"summary":"fixed the redirect"}' > "$DEVPILOT_RESULT_FILE""#)
}

/// Two machines with one source: each labelled issue becomes exactly one job (an unlabelled
/// one none), the fleet calls Linear once per intake turn however often both machines tick,
/// every claim and completion reaches its issue exactly once, and the key reaches no file,
/// row, log line, argv or agent.
async fn two_machines_add_each_issue_once_and_call_linear_once_per_turn(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("lin");
    let linear = LinearStandIn::start(KEY);
    for t in ["Fix login", "Add dark mode", "Speed up search"] {
        linear.add_issue(IssueSeed::new(t, &["agent"]));
    }
    linear.add_issue(IssueSeed::new("Not for agents", &[]));
    let agent =
        RecordingAgent::new(db.dir.path(), r#"env > "$(dirname "$DEVPILOT_PAYLOAD_FILE")/env-$DEVPILOT_JOB_ID""#);
    let homes: Vec<PathBuf> =
        ["laptop", "desktop"].iter().map(|m| home_with_source(db.dir.path(), m, &orch, &linear.url(), "")).collect();
    let _a = machine(&homes[0], &db, &orch, "laptop", &agent.script, Some(KEY));
    let _b = machine(&homes[1], &db, &orch, "desktop", &agent.script, Some(KEY));
    assert!(devpilot_tests::wait_for(WAIT, || async { jobs(&db, &orch).await.len() >= 3 }).await);
    for _ in 0..3 {
        next_turn(&db, &orch).await;
    }
    let all = jobs(&db, &orch).await;
    let mut keys: Vec<&str> = all.iter().filter_map(|j| j.unique_key.as_deref()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["linear:ENG-1", "linear:ENG-2", "linear:ENG-3"], "one job per labelled issue");
    assert_eq!(linear.calls("DevpilotIssues") as i64, turns(&db, &orch).await, "one read per turn, not per machine");
    // Counted only once every outbox row is done: a row still in flight could post again.
    let done = || async {
        let all = jobs(&db, &orch).await;
        let mut settled = true;
        for j in &all {
            settled &= db.queue.outbox_of(j.id).await.unwrap().iter().all(|r| r.done_at.is_some());
        }
        settled && all.iter().all(|j| j.state == JobState::Completed)
    };
    assert!(devpilot_tests::wait_for(WAIT, done).await, "every job completed and reported");
    for n in 1..=3 {
        let issue = format!("ENG-{n}");
        let bodies: Vec<String> = linear.comments(&issue).into_iter().map(|c| c.body).collect();
        assert_eq!(bodies.len(), 2, "one claim and one completion comment: {bodies:?}");
        assert!(bodies[0].starts_with("Started on "), "{bodies:?}");
        assert!(bodies[1].starts_with("Completed on ") && bodies[1].contains("devpilot/"), "{bodies:?}");
        assert_eq!(linear.issue(&issue).state_name, "In Progress", "moved to the team's first started state");
    }
    assert!(linear.rejected().is_empty(), "nothing the schema refuses: {:?}", linear.rejected());
    assert_no_secret(&db, db.dir.path(), &[_a.pid(), _b.pid()]).await;
}

/// The completion's comment is posted, Linear applies it and the answer never comes back:
/// the retry looks for the comment by its id, finds it and posts nothing, so the issue has
/// it once and the outbox row ends delivered on its second try.
async fn a_comment_applied_before_its_answer_was_lost_is_posted_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("lost");
    let linear = LinearStandIn::start(KEY);
    linear.add_issue(IssueSeed::new("Fix login", &["agent"]));
    linear.inject(Fault::Timeout(Duration::from_secs(15)), 1, Some("DevpilotPostComment"));
    let home = home_with(db.dir.path(), "desktop", &orch, &linear.url(), "timeout = \"5s\"", "claimed = false");
    let agent = summarising_agent(db.dir.path());
    let _m = machine(&home, &db, &orch, "desktop", &agent.script, Some(KEY));
    let delivered = || async {
        let Some(job) = job_of(&db, &orch, "ENG-1").await else { return false };
        let rows = db.queue.outbox_of(job.id).await.unwrap();
        rows.iter().any(|r| r.event == "completed" && r.outcome.as_deref() == Some("delivered"))
    };
    assert!(devpilot_tests::wait_for(WAIT * 2, delivered).await, "the completion was delivered in the end");
    let comments = linear.comments("ENG-1");
    assert_eq!(comments.len(), 1, "posted once: {comments:?}");
    assert!(comments[0].body.contains("fixed the redirect"), "the summary: {}", comments[0].body);
    let job = job_of(&db, &orch, "ENG-1").await.unwrap();
    let row = db.queue.outbox_of(job.id).await.unwrap().into_iter().find(|r| r.event == "completed").unwrap();
    assert_eq!(row.tries, 2, "the lost answer, then the look that found it");
    assert!(linear.calls("DevpilotFindComment") >= 1);
}

/// The laptop completes a job and dies (kill -9) before any report went out (Linear was
/// answering 502): the desktop, started afterwards, delivers the completion, once.
async fn a_machine_killed_after_completing_leaves_its_report_to_another(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("kill");
    let linear = LinearStandIn::start(KEY);
    linear.add_issue(IssueSeed::new("Fix login", &["agent"]));
    linear.inject(Fault::ServerError(502), 1000, Some("DevpilotPostComment"));
    let agent = summarising_agent(db.dir.path());
    let laptop_home = home_with_source(db.dir.path(), "laptop", &orch, &linear.url(), "claimed = false");
    let mut laptop = machine(&laptop_home, &db, &orch, "laptop", &agent.script, Some(KEY));
    // Tried and recorded: the 502 is on the outbox row, so the laptop holds no lease on it.
    let tried = || async {
        let Some(job) = job_of(&db, &orch, "ENG-1").await.filter(|j| j.state == JobState::Completed) else {
            return false;
        };
        let rows = db.queue.outbox_of(job.id).await.unwrap();
        rows.iter().any(|r| r.event == "completed" && r.done_at.is_none() && r.last_error.is_some())
    };
    assert!(devpilot_tests::wait_for(WAIT, tried).await, "the laptop completed the job and tried to report it");
    laptop.child.kill().unwrap();
    laptop.child.wait().unwrap();
    linear.clear_faults();
    // Ages the row past its backoff, and past the lease of a retry the laptop may have begun
    // in the moments before the kill.
    db.exec(&format!(
        "UPDATE outbox SET next_at = 0, claimed_at = claimed_at - 600000 WHERE job_id = {}",
        job_of(&db, &orch, "ENG-1").await.unwrap().id
    ))
    .await;
    assert!(linear.comments("ENG-1").is_empty(), "nothing reached the issue from the laptop");
    let desktop_home = home_with_source(db.dir.path(), "desktop", &orch, &linear.url(), "claimed = false");
    let _desktop = machine(&desktop_home, &db, &orch, "desktop", &agent.script, Some(KEY));
    assert!(devpilot_tests::wait_for(WAIT, || async { !linear.comments("ENG-1").is_empty() }).await);
    let job = job_of(&db, &orch, "ENG-1").await.unwrap();
    let by_desktop = format!(
        "SELECT COUNT(*) FROM outbox WHERE job_id = {} AND event = 'completed' AND claimed_by = 'desktop'",
        job.id
    );
    assert!(devpilot_tests::wait_for(WAIT, || async { db.scalar(&by_desktop).await == Some(1) }).await);
    assert_eq!(linear.comments("ENG-1").len(), 1, "once");
}

/// The first claim moves its issue to a `started` state, outside a source that takes only
/// `unstarted` issues: that does not cancel the job. Removing the label does: the issue's
/// queued job (no machine can take it: it needs a gpu) is cancelled, and the holder of the
/// running one is asked to stop its agent, which ends cancelled.
async fn an_issue_that_leaves_the_filter_cancels_its_queued_and_running_jobs(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("leave");
    let linear = LinearStandIn::start(KEY);
    linear.add_issue(IssueSeed::new("Train the model", &["agent", "needs:gpu"]));
    linear.add_issue(IssueSeed::new("Fix login", &["agent"]));
    let agent = RecordingAgent::new(db.dir.path(), "sleep 120");
    let home = home_with(db.dir.path(), "desktop", &orch, &linear.url(), "states = [\"unstarted\"]", "");
    let _m = machine(&home, &db, &orch, "desktop", &agent.script, Some(KEY));
    let placed = || async {
        let queued = job_of(&db, &orch, "ENG-1").await.is_some_and(|j| j.state == JobState::Queued);
        queued && agent.records().iter().any(|r| r.kind == "start") && linear.issue("ENG-2").state_type == "started"
    };
    assert!(devpilot_tests::wait_for(WAIT, placed).await, "ENG-1 waits for a gpu, ENG-2 runs, moved to started");
    next_turn(&db, &orch).await;
    let running = job_of(&db, &orch, "ENG-2").await.unwrap();
    // A cancel of a running job is first only asked for: the state stays Running until the
    // agent has stopped, so the history is what says whether the turn asked.
    let asked = db.queue.history(running.id).await.unwrap().into_iter().any(|e| e.kind == "cancel_requested");
    assert!(running.state == JobState::Running && !asked, "our own move to a started state cancels nothing");
    linear.set_labels("ENG-1", &["needs:gpu"]);
    linear.set_labels("ENG-2", &[]);
    age_source(&db, &orch).await;
    let cancelled = || async {
        let a = job_of(&db, &orch, "ENG-1").await.unwrap().state == JobState::Cancelled;
        a && job_of(&db, &orch, "ENG-2").await.unwrap().state == JobState::Cancelled
    };
    assert!(devpilot_tests::wait_for(WAIT, cancelled).await, "both cancelled");
    let stopped = || async { agent.records().iter().any(|r| r.kind == "term" && r.job == running.id) };
    assert!(devpilot_tests::wait_for(WAIT, stopped).await, "the agent was stopped");
    let history = db.queue.history(running.id).await.unwrap();
    assert!(history.iter().any(|e| e.kind == "cancel_requested" && e.machine.as_deref() == Some("intake:eng")));
}

/// `devpilot sources poll` adds a job per matching issue and prints its key, updates a
/// waiting job when its issue's description changes and the label is applied again (the
/// label approves the text: `approval.rs`), cancels it when the issue is done, and adds
/// nothing when nothing changed. It needs no running machine.
async fn sources_poll_adds_updates_and_cancels_by_key(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("poll");
    let linear = LinearStandIn::start(KEY);
    let issue =
        linear.add_issue(IssueSeed { description: Some("first".into()), ..IssueSeed::new("Fix login", &["agent"]) });
    let home = home_with_source(db.dir.path(), "cli", &orch, &linear.url(), "");
    let (code, out, err) = cli(&home, &db, KEY, &["sources", "poll"]);
    assert_eq!(code, 0, "{err}");
    let job = job_of(&db, &orch, "ENG-1").await.unwrap();
    assert!(out.contains(&format!("added linear:ENG-1 as job #{}", job.id)), "{out}");
    let (_, payload) = db.queue.job(job.id).await.unwrap().unwrap();
    assert_eq!(payload["title"], json!("ENG-1 Fix login"));
    assert_eq!(payload["url"], json!(issue.url));
    let last = issue.branch_name.rsplit('/').next().unwrap();
    assert_eq!(payload["branch"], json!(last), "Linear's branch name, after devpilot/<id>-");
    let (_, out, _) = cli(&home, &db, KEY, &["sources", "poll"]);
    assert!(!out.contains("added linear:") && !out.contains("updated linear:"), "nothing changed: {out}");
    linear.set_description("ENG-1", Some("second, with more detail"));
    linear.set_labels("ENG-1", &[]);
    linear.set_labels("ENG-1", &["agent"]);
    let (_, out, _) = cli(&home, &db, KEY, &["sources", "poll", "eng"]);
    assert!(out.contains(&format!("updated linear:ENG-1 as job #{}", job.id)), "{out}");
    let (_, payload) = db.queue.job(job.id).await.unwrap().unwrap();
    assert_eq!(payload["prompt"], json!("second, with more detail"));
    linear.set_state("ENG-1", "Done");
    let (_, out, _) = cli(&home, &db, KEY, &["sources", "poll"]);
    assert!(out.contains(&format!("cancelled linear:ENG-1 as job #{}", job.id)), "{out}");
    assert_eq!(db.queue.job(job.id).await.unwrap().unwrap().0.state, JobState::Cancelled);
    let (code, out, _) = cli(&home, &db, KEY, &["sources"]);
    assert_eq!(code, 0);
    assert!(out.contains("eng (linear)") && out.contains("last poll") && out.contains("by "), "{out}");
}

/// A key Linear refuses: the CLI says so (and exits 1); a machine with it keeps running its
/// jobs, records the problem on the source's row and `devpilot sources` shows it.
async fn a_wrong_key_is_said_and_the_machine_works_on(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("wrong");
    let linear = LinearStandIn::start(KEY);
    linear.add_issue(IssueSeed::new("Fix login", &["agent"]));
    let home = home_with_source(db.dir.path(), "desktop", &orch, &linear.url(), "");
    let (code, _, err) = cli(&home, &db, "lin_api_wrong", &["sources", "poll"]);
    assert_eq!(code, 1);
    assert!(err.contains("Linear refused the API key") && err.contains("devpilot login --linear"), "{err}");
    // The CLI's own try left its error on the row: clear it, so the machine must say it too.
    db.exec(&format!("UPDATE sources SET last_error = NULL WHERE orchestrator_id = '{orch}'")).await;
    let agent = RecordingAgent::new(db.dir.path(), "true");
    let _m = machine(&home, &db, &orch, "desktop", &agent.script, Some("lin_api_wrong"));
    let id = devpilot_tests::enqueue(&home, &db, &orch, &["--title", "plain work"]);
    let done = || async { db.queue.job(id).await.unwrap().unwrap().0.state == JobState::Completed };
    assert!(devpilot_tests::wait_for(WAIT, done).await, "the machine works on");
    let recorded = || async {
        db.queue
            .sources(&orch)
            .await
            .unwrap()
            .first()
            .and_then(|s| s.last_error.clone())
            .is_some_and(|e| e.contains("refused"))
    };
    assert!(devpilot_tests::wait_for(WAIT, recorded).await, "the source's row says what is wrong");
    let (_, out, _) = cli(&home, &db, KEY, &["sources"]);
    assert!(out.contains("last error") && out.contains("Linear refused the API key"), "{out}");
    assert!(job_of(&db, &orch, "ENG-1").await.is_none(), "nothing was read with the wrong key");
}

/// A Linear source whose jobs would name no repo (no `maps_to`, no mapping, no `no_repo`)
/// takes no issue: its work would run in a scratch directory and be thrown away. The machine
/// works on, and `devpilot sources` says why the source waits.
async fn a_source_that_names_no_repo_takes_no_issue(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("norepo");
    let linear = LinearStandIn::start(KEY);
    linear.add_issue(IssueSeed::new("Fix login", &["agent"]));
    let home = home_with(db.dir.path(), "desktop", &orch, &linear.url(), "no_repo = false\n", "");
    let agent = RecordingAgent::new(db.dir.path(), "true");
    let _m = machine(&home, &db, &orch, "desktop", &agent.script, Some(KEY));
    let id = devpilot_tests::enqueue(&home, &db, &orch, &["--title", "plain work"]);
    let done = || async { db.queue.job(id).await.unwrap().unwrap().0.state == JobState::Completed };
    assert!(devpilot_tests::wait_for(WAIT, done).await, "the machine works on");
    assert!(job_of(&db, &orch, "ENG-1").await.is_none(), "the issue did not become a repo-less job");
    let (_, out, _) = cli(&home, &db, KEY, &["sources"]);
    assert!(out.contains("takes no issue until it names one"), "{out}");
    // `sources poll` holds it too, and says why (exit 1): the same turn a machine would take.
    let (code, _, err) = cli(&home, &db, KEY, &["sources", "poll"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("eng: not polled: its jobs would name no repo"), "{err}");
    assert!(job_of(&db, &orch, "ENG-1").await.is_none());
    // Once it says where its jobs run, the same poll takes the issue: the wait above was
    // the missing repo, not a machine that had not polled yet.
    let mut text = std::fs::read_to_string(home.join("config/devpilot/config.toml")).unwrap();
    text = text.replace("no_repo = false", "no_repo = true");
    std::fs::write(home.join("config/devpilot/config.toml"), text).unwrap();
    let (code, _, err) = cli(&home, &db, KEY, &["sources", "poll"]);
    assert_eq!(code, 0, "{err}");
    assert!(job_of(&db, &orch, "ENG-1").await.is_some(), "taken once it names where its jobs run");
}

/// Slowing down before the limit: a turn whose answer says fewer than 100 requests are
/// left holds the source until the reset the headers name, with no error. And when Linear
/// answers `RATELIMITED`, the turn holds the source until the reset and says why. Once the
/// reset is past, the next turn reads. (That no turn is taken while a hold lasts, however
/// long ago the last poll was, is proven statement by statement in `sources_store.rs`.)
async fn a_rate_limit_holds_the_source_until_its_reset(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("rate");
    let linear = LinearStandIn::start(KEY);
    linear.add_issue(IssueSeed::new("Fix login", &["agent"]));
    linear.set_rate_limit(50, Duration::from_secs(3600));
    let home = home_with_source(db.dir.path(), "desktop", &orch, &linear.url(), "");
    let agent = RecordingAgent::new(db.dir.path(), "true");
    let _m = machine(&home, &db, &orch, "desktop", &agent.script, Some(KEY));
    let held = |error: bool| {
        let (db, orch) = (&db, &orch);
        move || async move {
            let s = db.queue.sources(orch).await.unwrap();
            s.first()
                .is_some_and(|s| s.hold_until.is_some_and(|h| h > s.now + 3_000_000) && s.last_error.is_some() == error)
        }
    };
    assert!(devpilot_tests::wait_for(WAIT, held(false)).await, "a low budget holds the source, no error");
    assert!(job_of(&db, &orch, "ENG-1").await.is_some(), "that turn still read");
    let (_, out, _) = cli(&home, &db, KEY, &["sources"]);
    assert!(out.contains("49 requests left") && out.contains("next turn in"), "{out}");
    linear.add_issue(IssueSeed::new("Add dark mode", &["agent"]));
    linear.set_rate_limit(0, Duration::from_secs(3600));
    // The machine may already have planned its next try from the hold, an hour out, and
    // moving the row's timestamps does not reach that plan: so the CLI takes these turns.
    db.exec(&format!("UPDATE sources SET hold_until = 0, polled_at = 0 WHERE orchestrator_id = '{orch}'")).await;
    cli(&home, &db, KEY, &["sources", "poll"]);
    assert!(devpilot_tests::wait_for(WAIT, held(true)).await, "RATELIMITED holds the source until the reset");
    let s = db.queue.sources(&orch).await.unwrap().remove(0);
    assert!(s.last_error.unwrap().contains("rate limit"));
    assert!(job_of(&db, &orch, "ENG-2").await.is_none());
    linear.set_rate_limit(1400, Duration::from_secs(3600));
    db.exec(&format!("UPDATE sources SET hold_until = 0, polled_at = 0 WHERE orchestrator_id = '{orch}'")).await;
    cli(&home, &db, KEY, &["sources", "poll"]);
    assert!(devpilot_tests::wait_for(WAIT, || async { job_of(&db, &orch, "ENG-2").await.is_some() }).await);
}

/// Two sources read the same team with different labels. When the issue of `eng`'s job
/// changes, `ops` reads it too (a turn with a cursor reads every change of its teams) and
/// finds it outside its own filter: that is not `ops`'s job to cancel. `eng` updates it (the
/// edit is labelled again, so the new text is approved).
async fn a_source_never_cancels_another_sources_job(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("two");
    let linear = LinearStandIn::start(KEY);
    linear.add_issue(IssueSeed { description: Some("first".into()), ..IssueSeed::new("Fix login", &["agent"]) });
    // Gives `ops` an issue of its own, so its first turn leaves it a cursor.
    linear.add_issue(IssueSeed::new("Rotate certificates", &["ops"]));
    let home = db.dir.path().join("cli");
    let source = |name: &str, label: &str| {
        format!(
            "[sources.{name}]\nkind = \"linear\"\nteams = [\"ENG\"]\nlabel = \"{label}\"\n\
             interval = \"15s\"\ntimeout = \"10s\"\napi_url = \"{}\"\nno_repo = true\n",
            linear.url()
        )
    };
    write_config(&home, &format!("orchestrator_id = \"{orch}\"\n{}{}", source("eng", "agent"), source("ops", "ops")));
    let (code, _, err) = cli(&home, &db, KEY, &["sources", "poll"]);
    assert_eq!(code, 0, "{err}");
    let job = job_of(&db, &orch, "ENG-1").await.expect("eng added the issue");
    linear.set_description("ENG-1", Some("second"));
    linear.set_labels("ENG-1", &[]);
    linear.set_labels("ENG-1", &["agent"]);
    let (code, out, err) = cli(&home, &db, KEY, &["sources", "poll"]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("cancelled"), "{out}");
    // `ops` did read the changed issue (outside its filter) in that turn: else this proves nothing.
    let read = |source: &str| {
        let line = out.lines().find(|l| l.starts_with(&format!("{source}: "))).unwrap_or_default();
        line.split_whitespace().nth(1).and_then(|n| n.parse::<usize>().ok()).unwrap_or(0)
    };
    assert!(read("ops") >= 1, "ops read the edited issue: {out}");
    let (row, payload) = db.queue.job(job.id).await.unwrap().unwrap();
    assert_eq!(row.state, JobState::Queued, "ops did not cancel eng's job");
    assert_eq!(payload["prompt"], json!("second"), "eng brought it up to date");
    let history = db.queue.history(job.id).await.unwrap();
    assert!(history.iter().all(|e| e.machine.as_deref() != Some("intake:ops")), "ops wrote nothing: {history:?}");
}

/// `devpilot sources add linear` checks the key and the team against Linear, says what it
/// found and saves the source; a second add of the same name is refused with a way out and
/// leaves the file as it was (what it says beyond the flags is not lost); `sources remove`
/// takes it out.
async fn sources_add_tests_the_source_and_never_replaces_one(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("add");
    let linear = LinearStandIn::start(KEY);
    let home = db.dir.path().join("cli");
    write_config(&home, &format!("orchestrator_id = \"{orch}\"\n"));
    let file = home.join("config/devpilot/config.toml");
    let add = ["sources", "add", "linear", "--team", "eng", "--label", "agent", "--api-url", &linear.url()];
    // A key Linear refuses, and a team it does not have, are refused and save nothing.
    let (code, out, err) = cli(&home, &db, "lin_api_not_the_right_key_000", &add);
    assert_ne!(code, 0, "a wrong key is refused: {out}{err}");
    let no_team = ["sources", "add", "linear", "--team", "nope", "--label", "agent", "--api-url", &linear.url()];
    let (code, out, err) = cli(&home, &db, KEY, &no_team);
    assert_ne!(code, 0, "a team Linear does not have is refused: {out}{err}");
    assert!(err.to_lowercase().contains("nope"), "the refusal names the team: {err}");
    assert!(!std::fs::read_to_string(&file).unwrap().contains("[sources."), "nothing was saved");
    let (code, out, err) = cli(&home, &db, KEY, &add);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("source 'eng' saved"), "{out}");
    assert!(linear.calls("DevpilotViewer") + linear.calls("DevpilotTeams") >= 1, "it asked Linear first");
    let saved = std::fs::read_to_string(&file).unwrap();
    let mine = saved.replace("claimed = true\nmove_to_started", "claimed = false\nmove_to_started");
    assert_ne!(mine, saved, "the report's claimed line is where the test expects it");
    std::fs::write(&file, &mine).unwrap();
    let (code, _, err) = cli(&home, &db, KEY, &add);
    assert_ne!(code, 0, "a second 'eng' is refused");
    assert!(err.contains("already in the settings") && err.contains("sources remove eng"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), mine, "the file is as it was");
    let (code, out, err) = cli(&home, &db, KEY, &["sources", "remove", "eng"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("source 'eng' removed"), "{out}");
    assert!(!std::fs::read_to_string(&file).unwrap().contains("[sources.eng]"));
}
