//! A comment's marker cannot be forged, and a retry never posts twice: the marker carries a
//! MAC keyed by the orchestrator's key (which nobody on the tracker can read) over the row and
//! the comment's author, so only a comment whose marker was signed for its own author counts,
//! whichever machine's user that is; and a lookup that cannot read every comment gives up,
//! saying why, rather than post again. Real `devpilot` processes against the GitHub
//! stand-in, on PostgreSQL and SQLite.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use devpilot_engine::sources::mac;
use devpilot_store::queue::{Delivery, OutboxRow};
use devpilot_tests::github::{Fault, FaultKind, IssueSeed};
use devpilot_tests::sources::{jobs, machine, WAIT};
use devpilot_tests::{write_config, Backend, GitHubStandIn, RecordingAgent, TestDb};

devpilot_tests::on_both_backends!(
    a_strangers_marker_does_not_stop_the_comment,
    a_retry_on_another_users_machine_finds_the_first_comment,
    a_lookup_past_the_page_cap_gives_up_and_never_posts_twice,
    each_database_keeps_its_own_key,
    a_retry_finds_its_comment_past_an_issues_long_history,
);

const TOKEN: &str = "ghp_TESTSECRET_m4rk3r0a1b2c3";
const REPO: &str = "acme/webapp";

/// A home whose config names the GitHub source `gh` on `api`, with no claim comment.
fn home(root: &Path, orch: &str, api: &str) -> PathBuf {
    let home = root.join("desktop");
    std::fs::create_dir_all(&home).unwrap();
    write_config(
        &home,
        &format!(
            "orchestrator_id = \"{orch}\"\n[sources.gh]\nkind = \"github\"\nrepo = \"{REPO}\"\nlabel = \"agent\"\n\
             interval = \"15s\"\ntimeout = \"5s\"\napi_url = \"{api}\"\nno_repo = true\n[sources.gh.report]\nclaimed = false\n"
        ),
    );
    home
}

/// The job's `completed` row, once `ok` holds of it.
async fn completed_row(db: &TestDb, job: i64, ok: impl Fn(&OutboxRow) -> bool) -> OutboxRow {
    let row = || async {
        db.queue.outbox_of(job).await.unwrap().into_iter().find(|r| r.event == "completed").filter(|r| ok(r))
    };
    assert!(devpilot_tests::wait_for(WAIT * 2, || async { row().await.is_some() }).await, "the completed row");
    row().await.unwrap()
}

/// The bot's completion comments on issue 1.
fn completions(gh: &GitHubStandIn) -> Vec<String> {
    gh.comments(REPO, 1).into_iter().map(|c| c.body).filter(|b| b.starts_with("Completed on ")).collect()
}

/// Issue 37, finding 5: the completion's first try fails (GitHub answers 502, nothing
/// posted); before the retry a stranger posts the old, unkeyed marker of the row, and then
/// the row's exact marker as the bot would sign it (as if it were copied): neither is signed
/// for its author, mallory, so the retry posts the comment, once.
async fn a_strangers_marker_does_not_stop_the_comment(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("forged");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    gh.open_issue(REPO, IssueSeed::new("Fix login", &["agent"]));
    let home = home(db.dir.path(), &orch, &gh.url());
    gh.inject(Fault { op: "issues/create-comment", kind: FaultKind::Server(502), times: 1 });
    let agent = RecordingAgent::new(db.dir.path(), "echo done");
    let _m = machine(&home, &db, &orch, "desktop", &agent.script, &[("GITHUB_TOKEN", TOKEN)]);
    assert!(devpilot_tests::wait_for(WAIT, || async { !jobs(&db, &orch).await.is_empty() }).await, "the job");
    let job = jobs(&db, &orch).await.pop().unwrap();
    let failed = completed_row(&db, job.id, |r| r.tries == 1 && r.last_error.is_some()).await;
    // Hold the row while the stranger writes: it is not taken again until released below.
    db.exec(&format!("UPDATE outbox SET next_at = next_at + 600000 WHERE id = {}", failed.id)).await;
    let held = format!(
        "SELECT COUNT(*) FROM outbox WHERE id = {} AND tries = 1 AND claimed_at IS NULL AND done_at IS NULL",
        failed.id
    );
    assert_eq!(db.scalar(&held).await, Some(1), "the retry had not started: {failed:?}");
    let token = failed.claim_token.unwrap_or(0);
    let old = format!("<!-- devpilot:job/{}/completed/{token} -->", job.id);
    gh.comment_as(REPO, 1, "mallory", &format!("Completed on nothing.\n\n{old}"));
    let key = db.queue.mac_key(&orch).await.unwrap();
    let d = Delivery {
        id: failed.id,
        token: 0,
        job_id: job.id,
        source_id: failed.source_id,
        event: "completed".into(),
        machine: None,
        claim_token: failed.claim_token,
        detail: None,
        tries: 1,
        created_at: 0,
    };
    let signed = mac::CommentMarker::new(&key, &orch, REPO, 1, &d).by("ada");
    gh.comment_as(REPO, 1, "mallory", &format!("Completed on nothing.\n\n{signed}"));
    db.exec(&format!("UPDATE outbox SET next_at = 0 WHERE id = {}", failed.id)).await;
    let done = completed_row(&db, job.id, |r| r.done_at.is_some()).await;
    assert_eq!(done.outcome.as_deref(), Some("delivered"), "{done:?}");
    let mine: Vec<String> = gh
        .comments(REPO, 1)
        .into_iter()
        .filter(|c| c.user != "mallory" && c.body.starts_with("Completed on "))
        .map(|c| c.body)
        .collect();
    assert_eq!(mine.len(), 1, "the bot's comment, once: {:?}", gh.comments(REPO, 1));
    assert!(mine[0].ends_with(&signed), "it carries the row's signed marker: {mine:?}");
    assert!(gh.count("issues/list-comments") >= 1, "the retry looked for its marker");
    assert!(gh.rejected().is_empty(), "{:?}", gh.rejected());
}

/// A fleet whose machines hold different users' tokens: the completion's comment is posted
/// by machine A (ada's token) but its answer is lost; A stops, and the retry runs on machine
/// B, whose token is bob's. B finds A's comment (its marker is signed for ada, its author)
/// and posts nothing more. Before, a retry counted only its own user's comments, and posted
/// the completion a second time.
async fn a_retry_on_another_users_machine_finds_the_first_comment(backend: Backend) {
    const BOB: &str = "ghp_TESTSECRET_b0b0b0b0b0b0";
    let db = TestDb::new(backend).await;
    let orch = db.orch("fleet");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_token_of(BOB, devpilot_tests::github::Access::Full, "bob");
    gh.add_repo(REPO);
    gh.open_issue(REPO, IssueSeed::new("Fix login", &["agent"]));
    gh.inject(Fault {
        op: "issues/create-comment",
        kind: FaultKind::Timeout { hold: Duration::from_secs(15) },
        times: 1,
    });
    let agent = RecordingAgent::new(db.dir.path(), "echo done");
    let a_home = home(&db.dir.path().join("a"), &orch, &gh.url());
    let a = machine(&a_home, &db, &orch, "laptop", &agent.script, &[("GITHUB_TOKEN", TOKEN)]);
    assert!(devpilot_tests::wait_for(WAIT, || async { !jobs(&db, &orch).await.is_empty() }).await, "the job");
    let job = jobs(&db, &orch).await.pop().unwrap();
    let failed = completed_row(&db, job.id, |r| r.tries == 1 && r.last_error.is_some()).await;
    db.exec(&format!("UPDATE outbox SET next_at = next_at + 600000 WHERE id = {}", failed.id)).await;
    drop(a);
    let held = format!(
        "SELECT COUNT(*) FROM outbox WHERE id = {} AND tries = 1 AND claimed_at IS NULL AND done_at IS NULL",
        failed.id
    );
    assert_eq!(db.scalar(&held).await, Some(1), "machine A never retried: {failed:?}");
    let posted = gh.comments(REPO, 1);
    assert!(
        posted.iter().any(|c| c.user == "ada" && c.body.starts_with("Completed on ")),
        "A's first try posted the comment although its answer was lost: {posted:?}"
    );
    let b_home = home(&db.dir.path().join("b"), &orch, &gh.url());
    let _b = machine(&b_home, &db, &orch, "desktop", &agent.script, &[("GITHUB_TOKEN", BOB)]);
    db.exec(&format!("UPDATE outbox SET next_at = 0 WHERE id = {}", failed.id)).await;
    let done = completed_row(&db, job.id, |r| r.done_at.is_some()).await;
    assert_eq!(done.outcome.as_deref(), Some("delivered"), "{done:?}");
    assert_eq!(done.tries, 2, "B's retry delivered it: {done:?}");
    let bodies: Vec<(String, String)> = gh
        .comments(REPO, 1)
        .into_iter()
        .filter(|c| c.body.starts_with("Completed on "))
        .map(|c| (c.user, c.body))
        .collect();
    assert_eq!(bodies.len(), 1, "the completion, once, by A: {bodies:?}");
    assert_eq!(bodies[0].0, "ada", "{bodies:?}");
    assert!(gh.count("issues/list-comments") >= 1, "B looked for the comment");
    assert!(gh.rejected().is_empty(), "{:?}", gh.rejected());
}

/// Finding 5's other half: an issue with more comments than the lookup reads (30 pages of
/// 100), and a completion whose comment was posted but whose answer was lost: the retry
/// cannot see its own comment, so it gives up with that reason instead of posting again.
async fn a_lookup_past_the_page_cap_gives_up_and_never_posts_twice(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("pages");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    // The comments come before the label: an issue that changed after its label is not run.
    gh.open_issue(REPO, IssueSeed::new("Fix login", &[]));
    for n in 0..3000 {
        gh.comment_as(REPO, 1, "chatty", &format!("+1 ({n})"));
    }
    gh.label_as(REPO, 1, "agent", "ada").unwrap();
    let home = home(db.dir.path(), &orch, &gh.url());
    gh.inject(Fault {
        op: "issues/create-comment",
        kind: FaultKind::Timeout { hold: Duration::from_secs(15) },
        times: 1,
    });
    let agent = RecordingAgent::new(db.dir.path(), "echo done");
    let _m = machine(&home, &db, &orch, "desktop", &agent.script, &[("GITHUB_TOKEN", TOKEN)]);
    assert!(devpilot_tests::wait_for(WAIT, || async { !jobs(&db, &orch).await.is_empty() }).await, "the job");
    let job = jobs(&db, &orch).await.pop().unwrap();
    let done = completed_row(&db, job.id, |r| r.done_at.is_some()).await;
    assert_eq!(completions(&gh).len(), 1, "posted once, by the first try");
    assert_eq!(done.outcome.as_deref(), Some("gave_up"), "{done:?}");
    assert!(done.last_error.as_deref().unwrap_or("").contains("more than 3000 comments"), "{done:?}");
    assert_eq!(gh.count("issues/list-comments"), 30, "the lookup read every page it may, and no more");
}

/// An issue with a long past (3,000 comments from hours ago) and a completion whose comment
/// was posted but whose answer was lost: the retry reads only the comments written since its
/// row was made (less an hour for the clocks), finds its own and posts nothing more.
async fn a_retry_finds_its_comment_past_an_issues_long_history(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("since");
    let gh = GitHubStandIn::start(TOKEN);
    gh.rewind_clock(Duration::from_secs(3 * 3600));
    gh.add_repo(REPO);
    gh.open_issue(REPO, IssueSeed::new("Fix login", &[]));
    for n in 0..3000 {
        gh.comment_as(REPO, 1, "chatty", &format!("+1 ({n})"));
    }
    gh.advance_clock(Duration::from_secs(3 * 3600));
    gh.label_as(REPO, 1, "agent", "ada").unwrap();
    let home = home(db.dir.path(), &orch, &gh.url());
    gh.inject(Fault {
        op: "issues/create-comment",
        kind: FaultKind::Timeout { hold: Duration::from_secs(15) },
        times: 1,
    });
    let agent = RecordingAgent::new(db.dir.path(), "echo done");
    let _m = machine(&home, &db, &orch, "desktop", &agent.script, &[("GITHUB_TOKEN", TOKEN)]);
    assert!(devpilot_tests::wait_for(WAIT, || async { !jobs(&db, &orch).await.is_empty() }).await, "the job");
    let job = jobs(&db, &orch).await.pop().unwrap();
    let done = completed_row(&db, job.id, |r| r.done_at.is_some()).await;
    assert_eq!(done.outcome.as_deref(), Some("delivered"), "{done:?}");
    assert!(done.tries >= 2, "the first try's answer was lost: {done:?}");
    assert_eq!(completions(&gh).len(), 1, "posted once, by the first try");
    assert_eq!(gh.count("issues/list-comments"), 1, "one page since the row was made");
    let windowed = |r: &devpilot_tests::github::Recorded| {
        r.op == "issues/list-comments" && r.query.iter().any(|(k, _)| k == "since")
    };
    assert!(gh.recorded().iter().any(windowed), "the lookup asked for its window: {:?}", gh.recorded());
    assert!(gh.rejected().is_empty(), "{:?}", gh.rejected());
}

/// The key belongs to the database: a process that talks to two databases (the app after
/// its settings name another) signs with each one's own key for the same orchestrator name,
/// and a second connection to the same database reads the same key.
async fn each_database_keeps_its_own_key(backend: Backend) {
    let (one, two) = (TestDb::new(backend).await, TestDb::new(backend).await);
    let first = one.queue.mac_key("shared-name").await.unwrap();
    let other = two.queue.mac_key("shared-name").await.unwrap();
    assert_ne!(first.bytes(), other.bytes(), "another database, another key");
    assert_eq!(first.bytes(), one.queue.mac_key("shared-name").await.unwrap().bytes(), "kept");
    let again = devpilot_store::db::connect(&one.url, &Default::default()).await.unwrap();
    let read = devpilot_store::Queue::new(again).mac_key("shared-name").await.unwrap();
    assert_eq!(first.bytes(), read.bytes(), "read back from the database, not made again");
}
