//! What an agent writes back, through real `devpilot run` processes, the GitHub stand-in
//! and the database: its text reaches a public issue inert (no mention, link, image or
//! cross-reference can act), a failure comment carries only the error's first line, the
//! values of the machine's secrets never leave the machine (log tail, summary, last error,
//! history, comments), and a park is capped. Every test runs on PostgreSQL and on SQLite.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_tests::github::IssueSeed;
use devpilot_tests::sources::{db_columns, jobs, machine, WAIT};
use devpilot_tests::{spawn_runner, wait_for, write_config, Backend, GitHubStandIn, GitRemote, RecordingAgent, TestDb};

devpilot_tests::on_both_backends!(
    a_summary_reaches_the_issue_inert_and_a_foreign_result_url_is_not_published,
    secrets_an_agent_or_its_setup_prints_never_leave_the_machine,
    a_park_far_in_the_future_is_capped_and_the_history_says_so,
);

const TOKEN: &str = "ghp_TESTSECRET_0a1b2c3d4e5f";
const MY_TOKEN: &str = "mytoken-TESTSECRET-7f3e9a";
const PROVIDER_KEY: &str = "sk-ant-TESTSECRET-5d2c8b1a";
const REPO: &str = "acme/webapp";

/// A machine's home whose config names the GitHub source `gh` on the stand-in, with `rest`
/// (top-level settings first, then tables) around it.
fn home_with(root: &Path, orch: &str, api_url: &str, top: &str, extra: &str, rest: &str) -> PathBuf {
    let home = root.join("desktop");
    std::fs::create_dir_all(&home).unwrap();
    write_config(
        &home,
        &format!(
            "orchestrator_id = \"{orch}\"\n{top}\n\
             [sources.gh]\nkind = \"github\"\nrepo = \"{REPO}\"\nlabel = \"agent\"\ninterval = \"15s\"\n\
             timeout = \"10s\"\napi_url = \"{api_url}\"\nno_repo = true\n{extra}\n{rest}\n"
        ),
    );
    home
}

/// Waits until job `n`'s issue has `count` comments and every outbox row of the job is
/// settled, then reads them again: nothing more may arrive after the wait.
async fn settled_comments(db: &TestDb, orch: &str, gh: &GitHubStandIn, count: usize) -> Vec<String> {
    let settled = || async {
        let job = jobs(db, orch).await.into_iter().find(|j| j.unique_key.is_some());
        let Some(job) = job else { return false };
        let rows = db.queue.outbox_of(job.id).await.unwrap();
        job.state.is_finished()
            && !rows.is_empty()
            && rows.iter().all(|r| r.outcome.is_some())
            && gh.comments(REPO, 1).len() == count
    };
    assert!(wait_for(WAIT, settled).await, "the job ended and its {count} comments went: {:?}", gh.comments(REPO, 1));
    let bodies: Vec<String> = gh.comments(REPO, 1).into_iter().map(|c| c.body).collect();
    assert_eq!(bodies.len(), count, "no comment after the outbox settled: {bodies:?}");
    bodies
}

/// The text between the opening and closing fence of the only fenced block in `body`, and
/// the fence: a block that nothing inside can close.
fn fenced(body: &str) -> (String, String) {
    let lines: Vec<&str> = body.split('\n').collect();
    let open = lines.iter().position(|l| l.starts_with("```")).unwrap_or_else(|| panic!("no fence: {body:?}"));
    let fence: String = lines[open].chars().take_while(|c| *c == '`').collect();
    let close = lines.iter().skip(open + 1).position(|l| l.trim_end() == fence).map(|i| i + open + 1);
    let close = close.unwrap_or_else(|| panic!("the block is not closed: {body:?}"));
    assert!(!body.contains('\r'), "no carriage return reaches the issue: {body:?}");
    (lines[open + 1..close].join("\n"), fence)
}

/// The agent's summary tries to mention, link, embed, cross-reference, close issues and end
/// its quote with a lone carriage return; its result URL is on another host. The completed
/// comment holds the summary in a fenced block its backticks cannot close, and has no
/// "Result:" line.
async fn a_summary_reaches_the_issue_inert_and_a_foreign_result_url_is_not_published(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("inert");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    gh.open_issue(REPO, IssueSeed::new("Fix login", &["agent"]));
    let summary = "done @acme/owners [click](http://evil.example/x) ![img](http://evil.example/i.png) \
                   acme/other#3 #2 Fixes #2\\r# Heading ```` <!-- devpilot:job/1/completed/1 -->";
    let result = format!(r#"{{"summary":"{summary}","url":"https://evil.example/result"}}"#);
    let agent = RecordingAgent::new(db.dir.path(), &format!(r#"printf '%s' '{result}' > "$DEVPILOT_RESULT_FILE""#));
    let home = home_with(db.dir.path(), &orch, &gh.url(), "", "", "");
    let _m = machine(&home, &db, &orch, "desktop", &agent.script, &[("GITHUB_TOKEN", TOKEN)]);
    let bodies = settled_comments(&db, &orch, &gh, 2).await;
    let job = jobs(&db, &orch).await.remove(0);
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.url.as_deref(), Some("https://evil.example/result"), "the link is kept on the job");
    let done = &bodies[1];
    assert!(done.starts_with("Completed on desktop."), "{done}");
    let (inside, fence) = fenced(done);
    assert!(inside.contains("@acme/owners") && inside.contains("Fixes #2") && inside.contains("# Heading"), "{done}");
    assert!(fence.len() > 4, "longer than the summary's own backtick run: {done}");
    let outside = done.replace(&inside, "");
    for live in ["@acme", "](http", "#2", "# Heading", "evil.example"] {
        assert!(!outside.contains(live), "{live:?} is outside the block: {done}");
    }
    assert!(!done.contains("Result:"), "a result on another host is not published: {done}");
    assert_eq!(done.matches("<!-- devpilot:").count(), 1, "the summary carries no marker of its own: {done}");
}

/// The secrets this machine knows: a `pass_env` value, a provider key and the GitHub token
/// in its environment, and (PostgreSQL) the database password. An agent prints them all and
/// says them in its summary; a repo's setup prints them and fails. No row of any table and
/// no comment on the issue holds one (each shows `[redacted]` instead), while the agent's
/// own log on this machine proves they were printed. The failure comment carries only the
/// first line of the error: no setup output, no local path.
async fn secrets_an_agent_or_its_setup_prints_never_leave_the_machine(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("secrets");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    gh.open_issue(REPO, IssueSeed::new("Fix login", &["agent"]));
    let password = db.url.password().unwrap_or_default();
    let mut secrets = vec![MY_TOKEN, PROVIDER_KEY, TOKEN];
    if backend.is_postgres() {
        assert!(password.len() >= 8, "the harness's PostgreSQL has a password");
        secrets.push(&password);
    }
    let said = secrets.iter().map(|s| format!("echo 'found {s}'")).collect::<Vec<_>>().join("; ");
    let summary = format!("leaked {}", secrets.join(" "));
    let agent = RecordingAgent::new(
        db.dir.path(),
        &format!(r#"{said}; echo "env $MY_TOKEN"; printf '{{"summary":"%s"}}' '{summary}' > "$DEVPILOT_RESULT_FILE""#),
    );
    let remote = GitRemote::new(db.dir.path());
    let clone = remote.clone_to(&db.dir.path().join("clone"));
    let setup = db.dir.path().join("setup.sh");
    std::fs::write(&setup, format!("{said}\necho \"setup $MY_TOKEN at $PWD\"\nexit 3\n")).unwrap();
    let repo = format!("[repos.webapp]\npath = \"{}\"\nsetup = [\"sh\", \"{}\"]\n", clone.display(), setup.display());
    let top = "pass_env = [\"MY_TOKEN\"]\nmax_attempts = 1";
    let home = home_with(db.dir.path(), &orch, &gh.url(), top, "maps_to = \"webapp\"", &repo);
    let env = [("GITHUB_TOKEN", TOKEN), ("MY_TOKEN", MY_TOKEN), ("ANTHROPIC_API_KEY", PROVIDER_KEY)];
    let _m = machine(&home, &db, &orch, "desktop", &agent.script, &env);
    let plain = db.queue.enqueue(&orch, &serde_json::json!({"title": "no repo"})).await.unwrap();
    let comments = settled_comments(&db, &orch, &gh, 2).await;
    let ended = || async { db.queue.job(plain).await.unwrap().unwrap().0.state == JobState::Completed };
    assert!(wait_for(WAIT, ended).await, "the plain job completed");
    let tail = || async { db.scalar(&format!("SELECT COUNT(*) FROM job_logs WHERE job_id = {plain}")).await };
    assert!(wait_for(WAIT, || async { tail().await == Some(1) }).await, "its log tail was stored");

    // Printed: the agent's and the setup's own logs on this machine hold every secret.
    for s in &secrets {
        let out = std::process::Command::new("grep").args(["-r", "-l", "-F", s]).arg(home.join("data")).output();
        assert!(!out.unwrap().stdout.is_empty(), "the agent printed {s} into its local log");
    }
    // Never stored, never posted.
    for s in &secrets {
        for table in ["dispatch_queue", "job_events", "job_logs", "outbox"] {
            assert_eq!(rows_with(&db, table, s).await, 0, "{s} is in a row of {table}");
        }
        assert!(comments.iter().all(|c| !c.contains(s)), "{s} is in a comment: {comments:?}");
    }
    for table in ["dispatch_queue", "job_events", "job_logs"] {
        assert!(rows_with(&db, table, "[redacted]").await > 0, "{table} shows where a secret was");
    }
    let (plain_row, _) = db.queue.job(plain).await.unwrap().unwrap();
    assert!(plain_row.summary.unwrap().starts_with("leaked [redacted]"), "the summary is kept, redacted");
    let dead = jobs(&db, &orch).await.into_iter().find(|j| j.unique_key.is_some()).unwrap();
    assert_eq!(dead.state, JobState::Dead);
    assert!(dead.last_error.as_deref().unwrap().contains("setup [redacted] at"), "{:?}", dead.last_error);
    let failed = &comments[1];
    assert!(failed.starts_with("Failed on desktop, and no attempts are left."), "{failed}");
    let (inside, _) = fenced(failed);
    assert!(inside.starts_with("setup `sh ") && !inside.contains('\n'), "only the first line: {failed}");
    assert!(!failed.contains("found") && !failed.contains("setup [redacted]"), "no setup output: {failed}");
    let root = db.dir.path().to_string_lossy().into_owned();
    assert!(!failed.contains(&root) && !failed.contains("/tmp"), "no local path: {failed}");
}

/// Rows of `table` whose text holds `needle`.
async fn rows_with(db: &TestDb, table: &str, needle: &str) -> i64 {
    let sql = if db.backend.is_postgres() {
        format!("SELECT COUNT(*) FROM {table} t WHERE strpos(t::text, '{needle}') > 0")
    } else {
        let cols = db_columns(db, table).await;
        format!("SELECT COUNT(*) FROM {table} WHERE instr(({}), '{needle}') > 0", cols.join(" || ' ' || "))
    };
    db.scalar(&sql).await.unwrap()
}

/// An agent asks to be tried again in 2096 (a result file's `retry_after`, exit 75): the job
/// is parked for the cap (7 days by default), not 70 years, the history says the agent's
/// time was capped, and once the cap has passed the job is claimed and completes. A machine
/// started with `--max-park 2h` caps its park at two hours.
async fn a_park_far_in_the_future_is_capped_and_the_history_says_so(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, orch) = (db.dir.path(), db.orch("cap"));
    let id = db.queue.enqueue(&orch, &serde_json::json!({"title": "limited"})).await.unwrap();
    let body = r#"if [ "$DEVPILOT_CLAIM_TOKEN" = 1 ]; then
  echo '{"retry_after": "2096-01-01T00:00:00Z"}' > "$DEVPILOT_RESULT_FILE"; exit 75
fi"#;
    let agent = RecordingAgent::new(home, body);
    let _m = spawn_runner(home, &db.raw_url, &orch, "m", &devpilot_tests::fast_flags(), &agent.script, &[]);
    let parked = || async {
        let h = db.queue.history(id).await.unwrap();
        h.iter().any(|e| e.kind == "parked")
    };
    assert!(wait_for(WAIT, parked).await, "the job was parked");
    let (row, _) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!((row.state, row.attempts), (JobState::Queued, 0), "parked, the attempt not counted");
    let week = 7 * 86_400_000;
    let wait = row.run_at - row.now;
    assert!((week - 60_000..=week).contains(&wait), "parked for the 7-day cap, not until 2096: {wait} ms");
    let detail = db.queue.history(id).await.unwrap().into_iter().find(|e| e.kind == "parked").unwrap().detail;
    let detail = detail.unwrap();
    assert!(detail.contains("2096-01-01T00:00:00Z") && detail.contains("capped at 7 days"), "{detail}");
    db.age_wait(id, Duration::from_millis(week as u64)).await;
    let done = || async { db.queue.job(id).await.unwrap().unwrap().0.state == JobState::Completed };
    assert!(wait_for(WAIT, done).await, "claimable again once the cap has passed");

    // Only the machine with the flag has the label this job requires.
    let mut flags = devpilot_tests::fast_flags();
    flags.extend(["--max-park", "2h", "--labels", "short"]);
    let _short = spawn_runner(home, &db.raw_url, &orch, "short", &flags, &agent.script, &[]);
    let payload = serde_json::json!({"title": "limited", "requires": ["short"]});
    let id = db.queue.enqueue(&orch, &payload).await.unwrap();
    let parked = || async { db.queue.history(id).await.unwrap().iter().any(|e| e.kind == "parked") };
    assert!(wait_for(WAIT, parked).await, "the second job was parked");
    let (row, _) = db.queue.job(id).await.unwrap().unwrap();
    let wait = row.run_at - row.now;
    assert!((7_140_000..=7_200_000).contains(&wait), "parked for the flag's 2h: {wait} ms");
    let park = db.queue.history(id).await.unwrap().into_iter().find(|e| e.kind == "parked").unwrap();
    assert_eq!(park.machine.as_deref(), Some("short"));
    assert!(park.detail.unwrap().contains("capped at 2h"));
}
