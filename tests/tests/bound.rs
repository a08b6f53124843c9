//! A delivery acts only on its own source: a job row rewritten by plain SQL, an outbox row
//! inserted by hand, or a pushed remote another machine names cannot make a machine that
//! holds the token comment on, label or open a pull request anywhere else. Real `devpilot`
//! processes against the GitHub stand-in, on PostgreSQL and SQLite.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use devpilot_store::job::JobState;
use devpilot_store::queue::OutboxRow;
use devpilot_tests::github::IssueSeed;
use devpilot_tests::sources::{self, jobs, machine, WAIT};
use devpilot_tests::{git, write_config, Backend, GitHubStandIn, GitRemote, RecordingAgent, TestDb};
use sea_orm::ConnectionTrait;

devpilot_tests::on_both_backends!(
    a_rewritten_payload_and_a_hand_made_row_act_on_nothing,
    a_pull_request_opens_only_on_this_machines_remote,
);

const TOKEN: &str = "ghp_TESTSECRET_b0und0a1b2c3";
const REPO: &str = "acme/webapp";
const OTHER: &str = "other/private";

/// A home whose config names the GitHub source `gh` on `api` (`rest`: more TOML).
fn home(root: &Path, name: &str, orch: &str, api: &str, rest: &str) -> PathBuf {
    let home = root.join(name);
    std::fs::create_dir_all(&home).unwrap();
    write_config(
        &home,
        &format!(
            "orchestrator_id = \"{orch}\"\n[sources.gh]\nkind = \"github\"\nrepo = \"{REPO}\"\nlabel = \"agent\"\n\
             interval = \"15s\"\ntimeout = \"10s\"\napi_url = \"{api}\"\nno_repo = true\n{rest}\n"
        ),
    );
    home
}

/// The job's outbox rows, once every one is done (delivered, given up or refused).
async fn settled(db: &TestDb, job: i64) -> Vec<OutboxRow> {
    let done = || async { db.queue.outbox_of(job).await.unwrap().iter().all(|r| r.done_at.is_some()) };
    assert!(devpilot_tests::wait_for(WAIT, done).await, "the outbox settled: {:?}", db.queue.outbox_of(job).await);
    db.queue.outbox_of(job).await.unwrap()
}

/// Issue 37, finding 1: a job taken from `sources poll` whose payload is then pointed at
/// another repo's issue by plain SQL runs, but no comment or label reaches either issue:
/// each row ends `refused`, saying which repo it named. An outbox row inserted by hand for
/// the job's own issue, a copy of its real completion row but for the history row it names,
/// is refused too, since no state change of the job wrote it.
async fn a_rewritten_payload_and_a_hand_made_row_act_on_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("bound");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    gh.add_repo(OTHER);
    gh.open_issue(REPO, IssueSeed::new("Fix login", &["agent"]));
    for n in 1..=5 {
        gh.open_issue(OTHER, IssueSeed::new(&format!("private {n}"), &[]));
    }
    let home = home(db.dir.path(), "desktop", &orch, &gh.url(), "");
    let env = [("GITHUB_TOKEN", TOKEN)];
    let (code, out, err) = sources::cli(&home, &db, &env, &["sources", "poll", "--orchestrator", &orch]);
    assert_eq!(code, 0, "{out}{err}");
    let job = jobs(&db, &orch).await.pop().expect("the poll added the issue's job");
    let json_set = if backend.is_postgres() {
        "payload = jsonb_set(jsonb_set(payload::jsonb, '{source,repo}', '\"other/private\"'), '{source,number}', '5')::json"
    } else {
        "payload = json_set(payload, '$.source.repo', 'other/private', '$.source.number', 5)"
    };
    db.exec(&format!("UPDATE dispatch_queue SET {json_set} WHERE id = {}", job.id)).await;
    let agent = RecordingAgent::new(db.dir.path(), "echo done");
    let m = machine(&home, &db, &orch, "desktop", &agent.script, &env);
    let completed = || async { jobs(&db, &orch).await.iter().all(|j| j.state == JobState::Completed) };
    assert!(devpilot_tests::wait_for(WAIT, completed).await, "{}", std::fs::read_to_string(&m.log).unwrap());
    let rows = settled(&db, job.id).await;
    assert!(rows.len() >= 2, "a claim and a completion row at least: {rows:?}");
    for r in &rows {
        assert_eq!(r.outcome.as_deref(), Some("refused"), "{r:?}");
        assert!(r.last_error.as_deref().unwrap_or("").contains("other/private#5"), "{r:?}");
    }
    // A row made by hand, for the job's own issue (its payload put back), with no history.
    let own = if backend.is_postgres() {
        "payload = jsonb_set(jsonb_set(payload::jsonb, '{source,repo}', '\"acme/webapp\"'), '{source,number}', '1')::json"
    } else {
        "payload = json_set(payload, '$.source.repo', 'acme/webapp', '$.source.number', 1)"
    };
    db.exec(&format!("UPDATE dispatch_queue SET {own} WHERE id = {}", job.id)).await;
    // A copy of the real completion row, its time included (so the history has an event of
    // that kind, claim and moment), but written by no state change: it names no history row.
    let copy = |history: &str| {
        format!(
            "INSERT INTO outbox (orchestrator_id, job_id, source_id, event, machine, claim_token, detail, created_at,
                                 next_at, history_id)
             SELECT orchestrator_id, job_id, source_id, event, machine, claim_token, detail, created_at, 0, {history}
               FROM outbox WHERE job_id = {} AND event = 'completed'",
            job.id
        )
    };
    // Naming the real row's history row is refused by the database: one row per event.
    let dup = db.queue.connection().execute_unprepared(&copy("history_id")).await;
    assert!(dup.is_err(), "a second row for one history row: {dup:?}");
    db.exec(&copy("NULL")).await;
    let rows = settled(&db, job.id).await;
    let made = rows.last().unwrap();
    assert_eq!(made.outcome.as_deref(), Some("refused"), "{made:?}");
    assert!(made.last_error.as_deref().unwrap_or("").contains("no state change"), "{made:?}");
    assert!(gh.comments(OTHER, 5).is_empty(), "nothing reached the other repo: {:?}", gh.comments(OTHER, 5));
    assert!(gh.comments(REPO, 1).is_empty(), "nor the job's own issue: {:?}", gh.comments(REPO, 1));
    assert!(gh.recorded().iter().all(|r| !r.path.contains(OTHER)), "no call named {OTHER}");
    // The user is told: `devpilot sources` counts the refused rows and says the newest reason.
    let (code, out, err) = sources::cli(&home, &db, &env, &["sources", "--orchestrator", &orch]);
    assert_eq!(code, 0, "{out}{err}");
    let told = format!("refused: {} updates that acted on nothing; newest: ", rows.len());
    let line = out.lines().find(|l| l.trim_start().starts_with("refused:")).unwrap_or_default();
    assert!(line.trim_start().starts_with(&told) && line.contains("no state change"), "{out}");
}

/// A clone for `machine` whose `origin` says `url` on github.com, rewritten by the machine's
/// global git config to the real bare remote, so pushes land.
fn clone_as(remote: &GitRemote, root: &Path, machine: &str, url: &str) -> PathBuf {
    let clone = remote.clone_to(&root.join(format!("clone-{machine}")));
    git(&clone, &["remote", "set-url", "origin", url]);
    let global = root.join(machine).join("config").join("git");
    std::fs::create_dir_all(&global).unwrap();
    let key = format!("url.{}.insteadOf", remote.bare.display());
    git(&clone, &["config", "--file", &global.join("config").to_string_lossy(), &key, url]);
    clone
}

/// A machine whose clone pushes to `other/private` (a compromised or misconfigured one,
/// with no token) completes the job; the machine that delivers, whose own clone of the
/// repo pushes to acme/webapp, refuses the pull request row and opens no pull request on
/// either repository.
async fn a_pull_request_opens_only_on_this_machines_remote(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("bound-pr");
    let remote = GitRemote::new(db.dir.path());
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo_with_git(REPO, &remote.bare);
    gh.add_repo_with_git(OTHER, &remote.bare);
    gh.open_issue(REPO, IssueSeed::new("Fix login", &["agent"]));
    let repo_toml =
        |clone: &Path| format!("[repos.webapp]\npath = \"{}\"\npush = true\n", clone.display()).replace("\\", "/");
    let rogue = clone_as(&remote, db.dir.path(), "laptop", "https://github.com/other/private.git");
    let rest = format!("maps_to = \"webapp\"\n{}", repo_toml(&rogue));
    let laptop = home(db.dir.path(), "laptop", &orch, &gh.url(), &rest);
    let env = [("GITHUB_TOKEN", TOKEN), ("DEVPILOT_GITHUB_API_URL", &gh.url())];
    let (code, out, err) = sources::cli(&laptop, &db, &env, &["sources", "poll", "--orchestrator", &orch]);
    assert_eq!(code, 0, "{out}{err}");
    let agent = RecordingAgent::new(db.dir.path(), r#"echo "fixed" > fix.txt"#);
    let mut a = machine(&laptop, &db, &orch, "laptop", &agent.script, &[]);
    let completed = || async { jobs(&db, &orch).await.iter().all(|j| j.state == JobState::Completed) };
    assert!(devpilot_tests::wait_for(WAIT, completed).await, "{}", std::fs::read_to_string(&a.log).unwrap());
    devpilot_tests::signal_tree(a.pid(), libc::SIGTERM);
    assert!(a.wait_timeout(WAIT).is_some(), "the laptop stopped");
    let job = jobs(&db, &orch).await.pop().unwrap();
    assert!(job.pushed_remote.as_deref().is_some_and(|r| r.contains("other/private")), "{job:?}");
    let own = clone_as(&remote, db.dir.path(), "desktop", "https://github.com/acme/webapp.git");
    let rest = format!("maps_to = \"webapp\"\n{}", repo_toml(&own));
    let desktop = home(db.dir.path(), "desktop", &orch, &gh.url(), &rest);
    let b = machine(&desktop, &db, &orch, "desktop", &agent.script, &env);
    let rows = settled(&db, job.id).await;
    let pr = rows.iter().find(|r| r.event == "pull_request").expect("a pull request row");
    assert_eq!(pr.outcome.as_deref(), Some("refused"), "{pr:?}\n{}", std::fs::read_to_string(&b.log).unwrap());
    assert!(pr.last_error.as_deref().unwrap_or("").contains("other/private"), "{pr:?}");
    assert!(gh.pulls(OTHER).is_empty() && gh.pulls(REPO).is_empty(), "no pull request anywhere");
    assert!(rows.iter().filter(|r| r.event != "pull_request").all(|r| r.outcome.as_deref() == Some("delivered")));
}
