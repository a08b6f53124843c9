//! The governor of usage limits across the fleet, with real `devpilot run` processes running
//! the real claude CLI against the scripted model server: a usage limit hit on one machine
//! holds its account on every machine that runs as it, while a machine under another
//! account goes on claiming; when the hold ends, the parked job resumes its work and its
//! conversation on another machine. Time passes by moving the hold's and the job's
//! timestamps.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_store::queue::JobRow;
use devpilot_tests::clis::{cli_root, Machine};
use devpilot_tests::*;
use serde_json::json;

async fn job(db: &TestDb, id: i64) -> JobRow {
    db.queue.job(id).await.unwrap().unwrap().0
}

async fn wait_state(db: &TestDb, id: i64, states: &[JobState], limit: Duration) -> JobRow {
    let done = wait_for(limit, || async { states.contains(&job(db, id).await.state) }).await;
    let row = job(db, id).await;
    assert!(done, "job {id} is {:?}, not one of {states:?}: {:?}", row.state, row.last_error);
    row
}

/// A job on repo `webapp` with `prompt`, added by a producer.
fn add_job(db: &TestDb, orch: &str, title: &str, prompt: &str) -> i64 {
    let home = db.dir.path().join("producer");
    write_config(&home, "");
    enqueue(&home, db, orch, &["--title", title, "--prompt", prompt, "--repo", "webapp", "--max-attempts", "1"])
}

/// Which machine took the claim of each attempt of job `id`.
async fn claimers(db: &TestDb, id: i64) -> Vec<String> {
    let h = db.queue.history(id).await.unwrap();
    h.iter().filter(|e| e.kind == "claimed").filter_map(|e| e.machine.clone()).collect()
}

/// A 429 as Anthropic sends one, with its reset an hour away.
fn limited() -> Turn {
    Turn::Error {
        status: 429,
        headers: vec![("retry-after".into(), "3600".into())],
        body: json!({"type": "error", "error": {"type": "rate_limit_error", "message": "usage limit"}}),
    }
}

/// The laptop and the desktop run claude under one API key, the tablet under another. The
/// laptop's job meets a 429: it is parked, its work pushed and its conversation saved, and
/// its account is held in the same statement. While the hold lasts the desktop claims
/// nothing, and the tablet takes both new jobs one after the other. When the hold ends (its
/// timestamp moved back), the desktop resumes the parked job from the laptop's branch and
/// conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_holds_the_account_on_every_machine_and_the_job_resumes_elsewhere() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (orch, root, model) = (db.orch("held"), cli_root(), ModelServer::start().unwrap());
    let remote = GitRemote::new(db.dir.path());
    let clone = |m: &str| remote.clone_to(&db.dir.path().join(format!("{m}-src/webapp")));
    let extra = "[agents.claude.env]\nCLAUDE_CODE_MAX_RETRIES = \"0\"\n";
    let laptop = Machine::new(&db, root.path(), "laptop", &clone("laptop"), &model, extra);
    let desktop = Machine::new(&db, root.path(), "desktop", &clone("desktop"), &model, extra);
    let mut tablet = Machine::new(&db, root.path(), "tablet", &clone("tablet"), &model, extra);
    for (k, v) in tablet.env.iter_mut() {
        if k == "ANTHROPIC_API_KEY" {
            *v = "sk-ant-another-account".into();
        }
    }
    let id = add_job(&db, &orch, "ENG-1 Write the parts", "Write part1.txt, then finish.");
    let wt: PathBuf = worktree_of(&laptop.home, &orch, id);
    model.script([
        Turn::Tool { name: "Write".into(), input: json!({"file_path": wt.join("part1.txt"), "content": "part 1\n"}) },
        limited(),
    ]);
    let a = laptop.run(&db, &orch, "claude", &[]);
    let parked = || async { db.queue.history(id).await.unwrap().iter().any(|e| e.kind == "parked") };
    assert!(wait_for(Duration::from_secs(60), parked).await, "the 429 parks the job");
    drop(a);

    let row = job(&db, id).await;
    assert_eq!((row.state, row.attempts), (JobState::Queued, 0), "parked, the attempt not counted");
    let error = row.last_error.clone().unwrap_or_default();
    assert!(error.contains("usage limit") && error.contains("held on every machine"), "{error}");
    let branch = row.resume_branch.clone().expect("the work in progress was pushed");
    assert_eq!(row.resumed_from.as_deref(), Some("laptop"));
    assert_eq!(remote.show(&branch, "part1.txt").as_deref(), Some("part 1\n"));
    let view = db.queue.governor_view(&orch, 0).await.unwrap();
    assert_eq!(view.holds.len(), 1, "{view:?}");
    let hold = &view.holds[0];
    assert!(hold.account.starts_with("claude:key-") && !hold.account.contains("sk-ant"), "{hold:?}");
    assert_eq!((hold.machine.as_str(), hold.job_id), ("laptop", Some(id)));

    // Two new jobs: the desktop is held with the laptop's account, the tablet takes both.
    let b = add_job(&db, &orch, "ENG-2 Say hi", "Say hi.");
    let c = add_job(&db, &orch, "ENG-3 Say bye", "Say bye.");
    model.script([Turn::Text("Hi.".into()), Turn::Text("Bye.".into())]);
    let d = desktop.run(&db, &orch, "claude", &[]);
    let t = tablet.run(&db, &orch, "claude", &[]);
    for j in [b, c] {
        wait_state(&db, j, &[JobState::Completed], Duration::from_secs(90)).await;
        assert_eq!(claimers(&db, j).await, ["tablet"], "job {j}: the desktop's account is held");
    }
    assert_eq!(claimers(&db, id).await, ["laptop"], "the parked job waits for its reset");
    drop(t);

    // The reset passes: the desktop resumes the job, its work and its conversation.
    model.script([Turn::Text("Resumed and finished.".into())]);
    db.exec(&format!("UPDATE account_holds SET until_at = until_at - {}", 2 * 3_600_000)).await;
    db.age_wait(id, Duration::from_secs(2 * 3600)).await;
    let row = wait_state(&db, id, &[JobState::Completed], Duration::from_secs(90)).await;
    drop(d);
    assert_eq!(claimers(&db, id).await, ["laptop", "desktop"]);
    assert_eq!(row.summary.as_deref(), Some("Resumed and finished."));
    let history = db.queue.history(id).await.unwrap();
    let resumed = history.iter().find(|e| e.kind == "session_resumed").expect("the conversation resumed");
    assert!(resumed.detail.as_deref().is_some_and(|d| d.contains("from laptop")), "{resumed:?}");
    let last = model.main_requests().last().unwrap().body.to_string();
    assert!(last.contains("part1.txt") && last.contains("part 1"), "the laptop's turns went with the job");
    let dwt = worktree_of(&desktop.home, &orch, id);
    assert!(!dwt.exists() || std::fs::read_to_string(dwt.join("part1.txt")).is_ok_and(|t| t == "part 1\n"));
    assert!(db.queue.governor_view(&orch, 0).await.unwrap().holds.is_empty());
}

/// A job that must not resume after a limit stays parked when the hold ends: the machine
/// takes the job added after it, and never the parked one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_must_not_resume_stays_parked_after_the_hold() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (orch, root, model) = (db.orch("no-resume"), cli_root(), ModelServer::start().unwrap());
    let remote = GitRemote::new(db.dir.path());
    let src = remote.clone_to(&db.dir.path().join("laptop-src/webapp"));
    let extra = "[agents.claude.env]\nCLAUDE_CODE_MAX_RETRIES = \"0\"\n";
    let laptop = Machine::new(&db, root.path(), "laptop", &src, &model, extra);
    let id = add_job(&db, &orch, "ENG-4 Try", "Say something.");
    assert!(db.queue.set_resume_after_limit(&orch, id, false).await.unwrap());
    model.script([limited()]);
    let _a = laptop.run(&db, &orch, "claude", &[]);
    let parked = || async { db.queue.history(id).await.unwrap().iter().any(|e| e.kind == "parked") };
    assert!(wait_for(Duration::from_secs(60), parked).await, "the 429 parks the job");
    db.exec(&format!("UPDATE account_holds SET until_at = until_at - {}", 2 * 3_600_000)).await;
    db.age_wait(id, Duration::from_secs(2 * 3600)).await;
    model.script([Turn::Text("Later.".into())]);
    let next = add_job(&db, &orch, "ENG-5 Next", "Say later.");
    wait_state(&db, next, &[JobState::Completed], Duration::from_secs(90)).await;
    let row = job(&db, id).await;
    assert_eq!((row.state, row.attempts), (JobState::Queued, 0), "still parked for a person: {row:?}");
    assert_eq!(claimers(&db, id).await, ["laptop"]);
    assert!(db.queue.let_go(&orch, id, "me").await.unwrap(), "a person lets it go");
    model.script([Turn::Text("Now.".into())]);
    wait_state(&db, id, &[JobState::Completed], Duration::from_secs(90)).await;
}
