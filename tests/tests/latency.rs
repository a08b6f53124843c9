//! What a user waits for, between a labelled issue and its agent, and between the agent's end
//! and its comment: real `devpilot run` processes at the default poll intervals (where a
//! machine's own intake must wake it), and a finishing machine killed with its comment on the
//! wire (where the other must deliver it when the lease ends, not a source interval later),
//! and a turn's slow review-loop reads (which must not hold a comment back).
//! Every test runs on PostgreSQL and on SQLite; time passes by moving timestamps.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use devpilot_engine::sources::DELIVERY_LEASE;
use devpilot_store::job::JobState;
use devpilot_tests::github::IssueSeed;
use devpilot_tests::sources::{github_home, jobs, machine, machine_with, next_turn, turns, WAIT};
use devpilot_tests::{wait_for, Backend, GitHubStandIn, RecordingAgent, TestDb};

devpilot_tests::on_both_backends!(
    a_job_the_intake_writes_is_claimed_at_once_not_at_the_next_backed_off_poll,
    a_comment_whose_deliverer_died_goes_out_when_its_lease_ends,
    a_comment_does_not_wait_behind_the_review_loops_reads,
    a_turn_that_writes_several_jobs_lets_the_first_run_while_it_reads_the_next,
    a_slow_turn_does_not_push_the_next_one_back,
);

const TOKEN: &str = "ghp_TESTSECRET_5c6d7e8f9a0b";
const REPO: &str = "acme/webapp";

/// A machine's home with the GitHub source `gh` on the stand-in at `interval`; its calls
/// time out after 10 s, so its delivery lease is [`DELIVERY_LEASE`].
fn home(root: &Path, name: &str, orch: &str, api_url: &str, interval: &str) -> PathBuf {
    github_home(root, name, orch, api_url, &format!("interval = \"{interval}\""), "")
}

/// The one job of issue #`number`, if the intake wrote it.
async fn job_of(db: &TestDb, orch: &str, number: u64) -> Option<devpilot_store::queue::JobRow> {
    let key = format!("github:{REPO}#{number}");
    jobs(db, orch).await.into_iter().find(|j| j.unique_key.as_deref() == Some(key.as_str()))
}

/// An idle machine's poll backs off from the default 2 s (here it polls once a minute);
/// its own intake turn then writes a job. The machine claims it within seconds of the turn, as
/// PostgreSQL's NOTIFY would have it, on SQLite too: the sources service tells its machine
/// "poll now". Before, a SQLite machine waited for its backed-off poll (here a minute).
async fn a_job_the_intake_writes_is_claimed_at_once_not_at_the_next_backed_off_poll(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("poll-now");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    let agent = RecordingAgent::new(db.dir.path(), "true");
    let home = home(db.dir.path(), "laptop", &orch, &gh.url(), "15s");
    // A minute between polls stands for a poll that has backed off from the default 2 s:
    // the first poll (at start) finds nothing, the next is 48–72 s later.
    let flags = ["--poll-interval", "60s", "--sweep-interval", "200ms", "--heartbeat", "300ms"];
    let _m = machine_with(&home, &db, &orch, "laptop", &agent.script, &[("GITHUB_TOKEN", TOKEN)], &flags);
    assert!(wait_for(WAIT, || async { turns(&db, &orch).await >= 1 }).await, "the first turn");
    let number = gh.open_issue(REPO, IssueSeed::new("Fix login", &["agent"]));
    next_turn(&db, &orch).await;
    let job = job_of(&db, &orch, number).await.expect("the turn wrote the issue's job");
    let claimed = || async { job_of(&db, &orch, number).await.is_some_and(|j| j.state != JobState::Queued) };
    assert!(
        wait_for(Duration::from_secs(10), claimed).await,
        "job #{} was not claimed within 10 s of the turn that wrote it: {:?}",
        job.id,
        job_of(&db, &orch, number).await,
    );
}

/// Two machines; the one that finished a job is killed while its completion comment is on
/// the wire (the stand-in holds the request, then drops it unapplied). The other machine's
/// pass, run for its own work while the dead machine's delivery lease held, learnt when
/// it ends and comes back then: the comment goes out at the lease's end. The source's
/// interval is ten minutes, so no interval pass can stand in for that wake-up. Before, the
/// row waited for the next interval pass.
async fn a_comment_whose_deliverer_died_goes_out_when_its_lease_ends(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("lease-end");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    let number = gh.open_issue(REPO, IssueSeed::new("Fix login", &["agent"]));
    let go = db.dir.path().join("go");
    let agent = RecordingAgent::new(db.dir.path(), &format!("while [ ! -e '{}' ]; do sleep 0.05; done", go.display()));
    let env = [("GITHUB_TOKEN", TOKEN)];
    let names = ["laptop", "desktop"];
    let mut runners: Vec<Option<devpilot_tests::Runner>> = names
        .iter()
        .map(|m| {
            let h = home(db.dir.path(), m, &orch, &gh.url(), "10m");
            Some(machine(&h, &db, &orch, m, &agent.script, &env))
        })
        .collect();
    // The agent runs and the claim's comment is on the issue: hold the next comment.
    let started = || async {
        job_of(&db, &orch, number).await.is_some_and(|j| j.state == JobState::Running)
            && !gh.comments(REPO, number).is_empty()
    };
    assert!(wait_for(WAIT, started).await, "the job started and its claim was commented");
    let id = job_of(&db, &orch, number).await.unwrap().id;
    let gate = gh.gate("issues/create-comment");
    std::fs::write(&go, "").unwrap();
    assert!(wait_for(WAIT, || async { gate.arrived() }).await, "the completion comment came");
    let holder = db
        .text(&format!("SELECT claimed_by FROM outbox WHERE job_id = {id} AND done_at IS NULL ORDER BY id LIMIT 1"))
        .await
        .expect("the undelivered row's holder");
    let dead = names.iter().position(|m| *m == holder).unwrap();
    let mut runner = runners[dead].take().unwrap();
    runner.child.kill().unwrap();
    runner.child.wait().unwrap();
    gate.drop_request();
    // Its lease ends 20 s from its take, not 120 s: the row ages, the clocks do not.
    let left = Duration::from_secs(20);
    let aged = (DELIVERY_LEASE - left).as_millis();
    db.exec(&format!("UPDATE outbox SET claimed_at = claimed_at - {aged} WHERE job_id = {id} AND done_at IS NULL"))
        .await;
    let ends = std::time::Instant::now() + left;
    // The survivor's own work runs a pass now, which finds the row held.
    let nudge = db.queue.enqueue(&orch, &serde_json::json!({"title": "nudge"})).await.unwrap();
    let finished = || async { jobs(&db, &orch).await.iter().any(|j| j.id == nudge && j.state == JobState::Completed) };
    assert!(wait_for(WAIT, finished).await, "the survivor ran its own job");
    let commented = || async { gh.comments(REPO, number).iter().any(|c| c.body.starts_with("Completed on ")) };
    // The passes of its own job came while the lease held: what delivers the comment later
    // is the wake-up they learnt, not one of them.
    assert!(std::time::Instant::now() < ends, "the survivor's own job ended after the lease did: no test");
    assert!(!commented().await, "the comment went out while {holder}'s lease held");
    assert!(
        wait_for(left + Duration::from_secs(20), commented).await,
        "the completion comment did not go out when {holder}'s lease ended"
    );
    let bodies: Vec<String> = gh.comments(REPO, number).into_iter().map(|c| c.body).collect();
    assert_eq!(bodies.len(), 2, "one claim and one completion, the dropped one never applied: {bodies:?}");
    assert!(gh.rejected().is_empty(), "nothing the description refuses: {:?}", gh.rejected());
}

/// A turn's review-loop reads (one of them held at the stand-in's gate, as a slow GitHub
/// would) do not hold the machine's deliveries back: the job that turn wrote runs and ends
/// while the read is held, and its completion comment goes out within seconds. Before, the
/// sources service read every watched pull request before it delivered anything.
async fn a_comment_does_not_wait_behind_the_review_loops_reads(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("review-reads");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    let agent = RecordingAgent::new(db.dir.path(), "true");
    // Calls time out after a minute: the held read is let through by the gate (30 s), not
    // given up by the client.
    let extra = "interval = \"15s\"\ntimeout = \"60s\"";
    let home = github_home(db.dir.path(), "laptop", &orch, &gh.url(), extra, "");
    let _m = machine(&home, &db, &orch, "laptop", &agent.script, &[("GITHUB_TOKEN", TOKEN)]);
    // A turn just ended: the next is 15 s away, and all that follows is in place before it.
    next_turn(&db, &orch).await;
    let source = db.scalar(&format!("SELECT id FROM sources WHERE orchestrator_id = '{orch}'")).await.unwrap();
    let watched = db.queue.enqueue(&orch, &serde_json::json!({"title": "an earlier job"})).await.unwrap();
    let url = format!("https://github.com/{REPO}/pull/7");
    assert!(db.queue.watch_pull(watched, source, &gh.url(), REPO, 7, &url).await.unwrap(), "a watched pull request");
    let gate = gh.gate("pulls/get");
    let number = gh.open_issue(REPO, IssueSeed::new("Fix login", &["agent"]));
    assert!(wait_for(WAIT, || async { gate.arrived() }).await, "the next turn's review pass read the pull request");
    let job = job_of(&db, &orch, number).await.expect("the turn wrote the issue's job before its review reads");
    let done = || async { job_of(&db, &orch, number).await.is_some_and(|j| j.state == JobState::Completed) };
    assert!(wait_for(WAIT, done).await, "job #{} ran while the review read was held", job.id);
    let commented = || async { gh.comments(REPO, number).iter().any(|c| c.body.starts_with("Completed on ")) };
    let out = wait_for(Duration::from_secs(10), commented).await;
    gate.open();
    assert!(out, "job #{}'s completion comment waited behind the review loop's read", job.id);
    assert!(gh.rejected().is_empty(), "nothing the description refuses: {:?}", gh.rejected());
}

/// A turn that takes two labelled issues tells its machine of the first job as soon as it is
/// written: the machine (its poll backed off to a minute) claims it while the turn still
/// reads the second issue's approval (held at the stand-in's gate). Before, the machine
/// heard only at the turn's end, so with many labels at once the first job waited for the
/// last one's reads (the benchmark's (w): about a second at the median). PostgreSQL's
/// NOTIFY says it too; on SQLite this word is the only one.
async fn a_turn_that_writes_several_jobs_lets_the_first_run_while_it_reads_the_next(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("first-job");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    let agent = RecordingAgent::new(db.dir.path(), "true");
    // Calls time out after a minute: the held read is let through by the gate, not given up.
    let extra = "interval = \"15s\"\ntimeout = \"60s\"";
    let home = github_home(db.dir.path(), "laptop", &orch, &gh.url(), extra, "");
    let flags = ["--poll-interval", "60s", "--sweep-interval", "200ms", "--heartbeat", "300ms"];
    let _m = machine_with(&home, &db, &orch, "laptop", &agent.script, &[("GITHUB_TOKEN", TOKEN)], &flags);
    next_turn(&db, &orch).await;
    // The first issue's approval read goes through; the second one's is held.
    gh.gate("issues/list-events").open();
    let second = gh.gate("issues/list-events");
    let first = gh.open_issue(REPO, IssueSeed::new("Fix login", &["agent"]));
    let next = gh.open_issue(REPO, IssueSeed::new("Fix logout", &["agent"]));
    assert!(first < next, "the turn reads the issues in this order");
    devpilot_tests::sources::age_source(&db, &orch).await;
    assert!(wait_for(WAIT, || async { second.arrived() }).await, "the turn reads the second issue's approval");
    let job = job_of(&db, &orch, first).await.expect("the turn wrote the first job before the second read");
    let claimed = || async { job_of(&db, &orch, first).await.is_some_and(|j| j.state != JobState::Queued) };
    let out = wait_for(Duration::from_secs(10), claimed).await;
    let held = job_of(&db, &orch, next).await.is_none();
    second.open();
    assert!(held, "the turn was still reading the second issue");
    assert!(out, "job #{} waited for the end of the turn that wrote it", job.id);
    let both = || async { job_of(&db, &orch, next).await.is_some_and(|j| j.state != JobState::Queued) };
    assert!(wait_for(WAIT, both).await, "the second job is claimed once the turn has written it");
    assert!(gh.rejected().is_empty(), "nothing the description refuses: {:?}", gh.rejected());
}

/// A slow turn does not push its source's next turn back, and a turn that takes most of
/// its interval still rests before the next. With the first turn's issue list held 6 s at
/// the stand-in, the next list comes one interval (15 s, and the tries' spread of at most a
/// second) after the held one arrived, not an interval after that turn ended. Before, every
/// turn's own time was added to its source's period, so a label waited for the turns' work
/// too (the benchmark's (w): a turn that writes many jobs takes a second or two). With the
/// second turn's list held 13 s, the third comes a tick (a quarter of the interval) after
/// that turn ended, not at once.
async fn a_slow_turn_does_not_push_the_next_one_back(backend: Backend) {
    const INTERVAL: Duration = Duration::from_secs(15);
    const TICK: Duration = Duration::from_millis(3_750);
    let db = TestDb::new(backend).await;
    let orch = db.orch("period");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    let agent = RecordingAgent::new(db.dir.path(), "true");
    // Calls time out after a minute: a held list is let through by the test, not given up.
    let extra = "interval = \"15s\"\ntimeout = \"60s\"";
    let home = github_home(db.dir.path(), "laptop", &orch, &gh.url(), extra, "");
    let mut held = gh.gate("issues/list-for-repo");
    let _m = machine_with(&home, &db, &orch, "laptop", &agent.script, &[("GITHUB_TOKEN", TOKEN)], &[]);
    let mut periods = vec![];
    let mut arrived_at = None;
    // Each turn's list is held as long as the tracker is slow; the next one's arrival is timed.
    for hold in [Duration::from_secs(6), Duration::from_secs(13), Duration::ZERO] {
        let g = held.clone();
        assert!(wait_for(INTERVAL * 3, || async { g.arrived() }).await, "a turn lists the issues");
        let now = Instant::now();
        if let Some(before) = arrived_at.replace(now) {
            periods.push(now - before);
        }
        let next = gh.gate("issues/list-for-repo");
        tokio::time::sleep(hold).await;
        held.open();
        held = next;
    }
    held.open();
    let (slow, slower) = (periods[0], periods[1]);
    // The test sees each arrival within 50 ms; the turn's own work is milliseconds here.
    assert!(slow >= INTERVAL - Duration::from_millis(500), "the next turn came early: {slow:?}");
    assert!(slow < INTERVAL + Duration::from_secs(4), "the slow turn pushed the next one back: {slow:?}");
    let rested = Duration::from_secs(13) + TICK;
    assert!(slower >= rested - Duration::from_millis(400), "no rest after a turn of 13 s: {slower:?}");
    assert!(slower < rested + Duration::from_secs(4), "{slower:?} between the lists");
    assert!(gh.rejected().is_empty(), "nothing the description refuses: {:?}", gh.rejected());
}
