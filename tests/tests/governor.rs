//! The governor of usage limits across the fleet, with real `devpilot run` processes running
//! the real claude CLI against the scripted model server: a usage limit hit on one machine
//! holds its account on every machine that runs as it, while a machine under another
//! account goes on claiming; when the hold ends, the parked job resumes its work and its
//! conversation on another machine. A job's cap stops its running agent at the usage it
//! streams; the day's cap stops every machine's claims until the next day. Time passes by
//! moving the hold's, the job's and the spend's timestamps.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_store::queue::{JobOptions, MachineStatus, PollExtras, Route, SourceSpec, Usage};
use devpilot_tests::clis::{cli_root, job, wait_state, Machine};
use devpilot_tests::model_server::TurnGate;
use devpilot_tests::*;
use serde_json::json;

/// The model the capped machines run claude with (priced at $3 a million input tokens).
const SONNET: &str = "claude-sonnet-4-5";

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

/// A job from a tracker (a registered GitHub source's issue) on repo `webapp`: its
/// reportable events write outbox rows, as the comments.
async fn tracker_job(db: &TestDb, orch: &str, title: &str, prompt: &str) -> i64 {
    let spec = SourceSpec { name: "gh", kind: "github", filter: "{}", interval: Duration::from_secs(60) };
    let sid = db.queue.register_source(orch, &spec).await.unwrap();
    let opts = JobOptions {
        key: Some("github:acme/webapp#7".into()),
        source: Some(sid),
        max_attempts: 1,
        ..Default::default()
    };
    let payload = json!({"title": title, "prompt": prompt, "repo": "webapp"});
    db.queue.enqueue_keyed(orch, &payload, &opts).await.unwrap().id
}

/// Now, in ms since the epoch, by this host's clock.
fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Whether job `id`'s history has an entry of `kind`.
async fn has(db: &TestDb, id: i64, kind: &str) -> bool {
    db.queue.history(id).await.unwrap().iter().any(|e| e.kind == kind)
}

/// The accounts held now.
async fn held(db: &TestDb, orch: &str) -> Vec<String> {
    db.queue.governor_view(orch, 0).await.unwrap().holds.into_iter().map(|h| h.account).collect()
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

/// A job's $0.05 cap stops its running claude once the usage claude streams passes it: the
/// 80 % warning is given once (in the job's history and on its issue), the agent is stopped
/// as a hand-off stops it (its work pushed, its conversation kept), the job is parked for a
/// person with what the attempt spent recorded, and no machine claims it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cap_stops_a_running_claude_at_the_usage_it_streams() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (orch, root, model) = (db.orch("job-cap"), cli_root(), ModelServer::start().unwrap());
    let remote = GitRemote::new(db.dir.path());
    let src = remote.clone_to(&db.dir.path().join("laptop-src/webapp"));
    let extra = format!(
        "[limits]\njob_usd = 0.05\n[agents.claude]\nargs = [\"--model\", \"{SONNET}\"]\n\
         [agents.claude.env]\nCLAUDE_CODE_MAX_RETRIES = \"0\"\n"
    );
    let laptop = Machine::new(&db, root.path(), "laptop", &src, &model, &extra);
    // 7,500 input tokens a turn at $3 a million is $0.0225: two turns (and their few output
    // tokens) are 90-95 % of the cap, the third passes it.
    model.set_input_tokens(Some(7_500));
    let id = tracker_job(&db, &orch, "Write the parts", "Write part1.txt, part2.txt and part3.txt.").await;
    let wt = worktree_of(&laptop.home, &orch, id);
    let write = |n: u32| Turn::Tool {
        name: "Write".into(),
        input: json!({"file_path": wt.join(format!("part{n}.txt")), "content": format!("part {n}\n")}),
    };
    // The third answer waits until the second's usage has been read (the warning), so the
    // meter sees the job at 80 % before it passes the cap.
    let gate = TurnGate::default();
    model.script([write(1), write(2), Turn::Gated(gate.clone()), write(3), Turn::Hold(Duration::from_secs(600))]);
    let a = laptop.run(&db, &orch, "claude", &[]);
    assert!(wait_for(Duration::from_secs(60), || has(&db, id, "spend_warning")).await, "80 % of the cap warns");
    gate.open();
    assert!(wait_for(Duration::from_secs(60), || has(&db, id, "parked")).await, "the cap stops the job");

    let row = job(&db, id).await;
    assert_eq!((row.state, row.attempts), (JobState::Queued, 0), "parked, the attempt not counted: {row:?}");
    let error = row.last_error.clone().unwrap_or_default();
    assert!(error.starts_with("spend cap:") && error.contains("of its $0.05 cap"), "{error}");
    let history = db.queue.history(id).await.unwrap();
    let warnings: Vec<_> = history.iter().filter(|e| e.kind == "spend_warning").collect();
    assert_eq!(warnings.len(), 1, "warned once: {history:?}");
    let detail = warnings[0].detail.clone().unwrap_or_default();
    let share: u32 = detail.split(' ').next().and_then(|p| p.parse().ok()).unwrap_or(0);
    assert!((80..100).contains(&share) && detail.contains("of this job's $0.05 cap"), "{detail}");
    assert!(history.iter().any(|e| e.kind == "session_carried"), "the conversation was kept: {history:?}");
    let branch = row.resume_branch.clone().expect("the work in progress was pushed");
    assert_eq!(remote.show(&branch, "part1.txt").as_deref(), Some("part 1\n"));
    assert_eq!(remote.show(&branch, "part2.txt").as_deref(), Some("part 2\n"));
    let spend = db.queue.job_spend(id).await.unwrap();
    assert_eq!(spend.len(), 1, "{spend:?}");
    assert!(spend[0].cost_usd >= 0.05 && spend[0].machine.as_deref() == Some("laptop"), "{spend:?}");
    let sql = format!("SELECT COUNT(*) FROM outbox WHERE job_id = {id} AND event = 'spend_warning'");
    assert_eq!(db.scalar(&sql).await, Some(1), "the warning goes to the issue once");
    let mains = model.main_requests();
    assert!(mains.len() >= 3, "three tool turns (and the held one, if it was sent): {}", mains.len());
    for r in &mains {
        assert!(r.body["model"].as_str().is_some_and(|m| m.starts_with(SONNET)), "{}", r.body["model"]);
    }

    // A later job runs on the same machine; the capped one waits for a person. (The held
    // turn is left if claude was stopped before it asked for it.)
    assert!(model.clear_script() <= 1);
    model.script([Turn::Text("Done.".into())]);
    let next = add_job(&db, &orch, "ENG-12 Next", "Say done.");
    wait_state(&db, next, &[JobState::Completed], Duration::from_secs(90)).await;
    drop(a);
    assert_eq!(claimers(&db, next).await, ["laptop"]);
    assert_eq!(claimers(&db, id).await, ["laptop"], "no machine claims a job past its cap");
    assert_eq!(job(&db, id).await.state, JobState::Queued);
}

/// The fleet's $0.10 day cap, reached by the day's completed jobs (a claude run's own
/// reported cost, then another machine's job), stops the next claim on both machines;
/// the next day (the spend moved a day back) the job is claimed and completes. On
/// PostgreSQL, where a machine's presence rides its claim in one statement: a presence
/// written after the job was added is a claim that saw it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_cap_stops_every_machine_until_the_next_day() {
    let db = TestDb::new(Backend::Postgres).await;
    let (orch, root, model) = (db.orch("day-cap"), cli_root(), ModelServer::start().unwrap());
    let remote = GitRemote::new(db.dir.path());
    let clone = |m: &str| remote.clone_to(&db.dir.path().join(format!("{m}-src/webapp")));
    let extra = format!(
        "[limits]\nday_usd = 0.10\ntime_zone = \"UTC\"\n[agents.claude]\nargs = [\"--model\", \"{SONNET}\"]\n\
         [agents.claude.env]\nCLAUDE_CODE_MAX_RETRIES = \"0\"\n"
    );
    let laptop = Machine::new(&db, root.path(), "laptop", &clone("laptop"), &model, &extra);
    let desktop = Machine::new(&db, root.path(), "desktop", &clone("desktop"), &model, &extra);
    // 20,000 input tokens at $3 a million: claude reports about $0.06, below the 80 % warning.
    model.set_input_tokens(Some(20_000));
    model.script([Turn::Text("Hi.".into())]);
    let first = add_job(&db, &orch, "ENG-13 Say hi", "Say hi.");
    let l = laptop.run(&db, &orch, "claude", &[]);
    let d = desktop.run(&db, &orch, "claude", &[]);
    wait_state(&db, first, &[JobState::Completed], Duration::from_secs(90)).await;
    let spend = db.queue.job_spend(first).await.unwrap();
    assert_eq!(spend.len(), 1, "{spend:?}");
    assert!((0.05..0.08).contains(&spend[0].cost_usd), "claude's own cost: {spend:?}");

    // Another machine's job completes with $0.05 more: the day's spend passes the cap.
    let phone = json!({"title": "On the phone", "requires": ["phone"]});
    let other = db.queue.enqueue(&orch, &phone).await.unwrap();
    let route = Route { labels: vec!["phone".into()], ..Default::default() };
    let extras = PollExtras { route: Some(&route), ..Default::default() };
    let c = db.queue.claim_next_with(&orch, "phone", 1, &extras).await.unwrap().claims.remove(0);
    assert_eq!(c.fence.job, other);
    let usage = Usage { cost_usd: Some(0.05), ..Default::default() };
    assert!(db.queue.record_agent_usage(&c.fence, &usage).await.unwrap());
    assert!(db.queue.complete(&c.fence, "phone").await.unwrap());
    let day = db.queue.governor_view(&orch, 0).await.unwrap().day_spent_usd;
    assert!(day >= 0.10, "{day}");

    // Both machines poll past the new job and take none: their presence (every 30 s) rides
    // a claim, in the same statement, that began after the job was added (the database's
    // clock is this host's; its milliseconds are rounded, hence the one to spare).
    let next = add_job(&db, &orch, "ENG-14 Say bye", "Say bye.");
    let added = now_ms() + 1;
    let polled = || async {
        let m = db.queue.machines(&orch).await.unwrap();
        m.len() == 2 && m.iter().all(|m| m.last_seen_at > added && m.status == MachineStatus::Online)
    };
    assert!(wait_for(Duration::from_secs(90), polled).await, "both machines polled after the job was added");
    let row = job(&db, next).await;
    assert_eq!((row.state, row.attempts), (JobState::Queued, 0), "{row:?}");
    assert!(claimers(&db, next).await.is_empty(), "past the day's cap, no machine claims");

    // The next day: yesterday's spend no longer counts.
    model.script([Turn::Text("Bye.".into())]);
    db.exec("UPDATE spend SET at = at - 86400000").await;
    let row = wait_state(&db, next, &[JobState::Completed], Duration::from_secs(90)).await;
    drop((l, d));
    assert_eq!(row.summary.as_deref(), Some("Bye."));
    let by = claimers(&db, next).await;
    assert!(by == ["laptop"] || by == ["desktop"], "{by:?}");
}

/// Two accounts on claude, "work" on the laptop and "home" on the desktop, are held apart: a
/// 429 under work holds only claude:work (the desktop takes the next job), a 429 under home
/// then holds claude:home too, and when work's hold ends the laptop resumes work's parked job
/// and claims again while home stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_accounts_on_one_preset_are_held_independently() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (orch, root, model) = (db.orch("accounts"), cli_root(), ModelServer::start().unwrap());
    let remote = GitRemote::new(db.dir.path());
    let clone = |m: &str| remote.clone_to(&db.dir.path().join(format!("{m}-src/webapp")));
    let extra = |account: &str| {
        format!("[agents.claude]\naccount = \"{account}\"\n[agents.claude.env]\nCLAUDE_CODE_MAX_RETRIES = \"0\"\n")
    };
    let laptop = Machine::new(&db, root.path(), "laptop", &clone("laptop"), &model, &extra("work"));
    let desktop = Machine::new(&db, root.path(), "desktop", &clone("desktop"), &model, &extra("home"));

    // A 429 under work: the laptop parks its job and holds claude:work only.
    model.script([limited()]);
    let a = add_job(&db, &orch, "ENG-15 Work", "Say something.");
    let l = laptop.run(&db, &orch, "claude", &[]);
    assert!(wait_for(Duration::from_secs(60), || has(&db, a, "parked")).await, "the 429 parks the job");
    assert_eq!(held(&db, &orch).await, ["claude:work"]);

    // The desktop, under home, takes the next job.
    model.script([Turn::Text("Home.".into())]);
    let b = add_job(&db, &orch, "ENG-16 Home", "Say home.");
    let d = desktop.run(&db, &orch, "claude", &[]);
    wait_state(&db, b, &[JobState::Completed], Duration::from_secs(90)).await;
    assert_eq!(claimers(&db, b).await, ["desktop"]);

    // A 429 under home: claude:home is held too.
    model.script([limited()]);
    let c = add_job(&db, &orch, "ENG-17 Home again", "Say something.");
    assert!(wait_for(Duration::from_secs(60), || has(&db, c, "parked")).await, "the 429 parks the job");
    assert_eq!(claimers(&db, c).await, ["desktop"]);
    assert_eq!(held(&db, &orch).await, ["claude:home", "claude:work"]);

    // Work's hold ends: the laptop resumes the job parked on it at once (not at its reset)
    // and claims the next one; home stays held, with its job.
    assert!(db.queue.end_hold(&orch, "claude:work").await.unwrap());
    model.script([Turn::Text("Work again.".into()), Turn::Text("Work again.".into())]);
    let e = add_job(&db, &orch, "ENG-18 Work again", "Say work.");
    for j in [a, e] {
        wait_state(&db, j, &[JobState::Completed], Duration::from_secs(90)).await;
    }
    drop((l, d));
    assert_eq!(claimers(&db, e).await, ["laptop"]);
    assert_eq!(held(&db, &orch).await, ["claude:home"]);
    assert_eq!(
        (claimers(&db, a).await, claimers(&db, c).await),
        (vec!["laptop".to_string(), "laptop".to_string()], vec!["desktop".to_string()])
    );
    assert_eq!(job(&db, c).await.state, JobState::Queued, "home's job waits for home's reset");
}
