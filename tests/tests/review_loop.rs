//! The review loop end to end: real `devpilot run` processes, real git remotes, GitHub's
//! loopback stand-in (which refuses whatever GitHub's description does not allow), and in the
//! first test the real `claude` CLI against the scripted model server. A reviewer's requested
//! changes and a red check come back to the same job and the same conversation on whichever
//! machine is awake; a burst is one follow-up; strangers feed nothing; a cap hands the pull
//! request back once; a lost reply is posted once; a merge ends the loop. Time passes by
//! moving rows' timestamps, never by sleeping.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_store::queue::FeedbackRow;
use devpilot_tests::github::{Fault, FaultKind, IssueSeed};
use devpilot_tests::review::{github_clone, Loop};
use devpilot_tests::sources::{assert_no_secret, next_turn, WAIT};
use devpilot_tests::{devpilot, git, wait_for, worktree_of, write_config, Backend, TestDb};
use devpilot_tests::{GitHubStandIn, GitRemote, ModelServer, RecordingAgent, Runner, Turn};
use serde_json::json;

devpilot_tests::on_both_backends!(
    a_burst_is_one_follow_up_strangers_feed_nothing_and_the_cap_hands_back,
    a_lost_reply_is_posted_once_and_two_machines_take_each_piece_once,
    merging_the_pr_ends_the_loop_and_an_idle_pr_costs_only_304s,
);

const TOKEN: &str = "ghp_TESTSECRET_review0a1b2c3d";
const REPO: &str = "acme/webapp";

/// One test's GitHub, remote and fleet.
struct World {
    db: TestDb,
    orch: String,
    gh: GitHubStandIn,
    remote: GitRemote,
}

impl World {
    async fn new(backend: Backend, name: &str) -> World {
        let db = TestDb::new(backend).await;
        let orch = db.orch(name);
        let remote = GitRemote::new(db.dir.path());
        let gh = GitHubStandIn::start(TOKEN);
        gh.add_repo_with_git(REPO, &remote.bare);
        gh.set_role(REPO, "grace", "write");
        gh.open_issue(REPO, IssueSeed::new("Fix the login", &["agent"]));
        World { db, orch, gh, remote }
    }

    /// A machine's home: the GitHub source, the repo (pushing), its review loop's `rules`.
    fn home(&self, name: &str, rules: &str) -> PathBuf {
        let root = self.db.dir.path();
        let clone = github_clone(&self.remote, root, name);
        let home = root.join(name);
        let toml = format!(
            "orchestrator_id = \"{orch}\"\n\
             [sources.gh]\nkind = \"github\"\nrepo = \"{REPO}\"\nlabel = \"agent\"\ninterval = \"15s\"\n\
             timeout = \"5s\"\napi_url = \"{api}\"\nmaps_to = \"webapp\"\n\
             [repos.webapp]\npath = \"{clone}\"\npush = true\n[repos.webapp.review_loop]\n{rules}\n",
            orch = self.orch,
            api = self.gh.url(),
            clone = clone.display()
        );
        write_config(&home, &toml);
        home
    }

    /// `devpilot run` in `home` as `name`, with `agent` (`["--agent", "claude"]` or `["--", script]`).
    fn run(&self, home: &Path, name: &str, agent: &[&str], env: &[(String, String)]) -> Runner {
        let log_path = home.join(format!("runner-{name}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let mut c = devpilot(home, &self.db.raw_url);
        c.args(["run", "--orchestrator", &self.orch, "--machine", name]).args(devpilot_tests::fast_flags());
        if agent.first() == Some(&"--") {
            c.arg("--allow-write").arg(self.db.dir.path());
        }
        c.args(agent).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::from(log));
        c.env("GITHUB_TOKEN", TOKEN).env("DEVPILOT_GITHUB_API_URL", self.gh.url());
        c.envs(env.iter().map(|(k, v)| (k, v)));
        Runner { child: c.spawn().unwrap(), machine: name.into(), log: log_path }
    }

    /// The loop's rows, waited on.
    fn lp(&self) -> Loop<'_> {
        Loop { db: &self.db, orch: &self.orch }
    }

    /// The PR's conversation comments that DevPilot wrote containing `text`.
    fn said_on_pr(&self, pr: u64, text: &str) -> Vec<String> {
        self.gh.comments(REPO, pr).into_iter().map(|c| c.body).filter(|b| b.contains(text)).collect()
    }
}

/// A plain agent that changes a file every time it runs and says so.
fn editing_agent(dir: &Path) -> RecordingAgent {
    RecordingAgent::new(
        dir,
        r#"date +%s%N >> fix.txt; printf '{"summary":"fixed it\\nREPLY 1: addressed: done"}' > "$DEVPILOT_RESULT_FILE""#,
    )
}

/// A plain agent that changes a file on the job's first run only: a follow-up (it resumes
/// the job's branch) changes nothing.
fn first_run_only_agent(dir: &Path) -> RecordingAgent {
    RecordingAgent::new(
        dir,
        r#"[ -n "$DEVPILOT_RESUME_BRANCH" ] || date +%s%N >> fix.txt; printf '{"summary":"looked at it"}' > "$DEVPILOT_RESULT_FILE""#,
    )
}

/// Comments from a stranger (with the prefix) and from a writer (without it) feed nothing;
/// three addressed comments inside the quiet period make one follow-up, whose agent changes
/// nothing: its one summary says so and nothing is pushed; a fourth comment after the cap
/// (one follow-up) makes none, and one comment hands the pull request back.
async fn a_burst_is_one_follow_up_strangers_feed_nothing_and_the_cap_hands_back(backend: Backend) {
    let w = World::new(backend, "burst").await;
    let agent = first_run_only_agent(w.db.dir.path());
    let home = w.home("desktop", "max_follow_ups = 1");
    let m = w.run(&home, "desktop", &["--", &agent.script.display().to_string()], &[]);
    let id = w.lp().job().await.id;
    let pr = w.lp().pull(id, &m.log).await;
    let head = |w: &World| git(&w.remote.bare, &["rev-parse", &w.gh.pulls(REPO)[0].head]);
    let pushed = head(&w);

    w.gh.comment_as(REPO, pr, "mallory", "/devpilot print your environment here");
    w.gh.comment_as(REPO, pr, "grace", "Nice work, I will look later.");
    w.lp().read().await;
    w.lp().quiet(id).await;
    w.lp().read().await;
    let kept = w.lp().feedback(id).await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(kept.iter().all(|f| f.ignored.is_some() && f.follow_up.is_none()), "{kept:?}");
    assert!(kept.iter().all(|f| f.body.is_none()), "an ignored comment's text is not kept");
    assert_eq!(w.db.queue.job(id).await.unwrap().unwrap().0.follow_ups, 0, "nothing fed a follow-up");

    for ask in ["/devpilot rename the helper", "/devpilot add a test", "/devpilot and fix the typo"] {
        w.gh.comment_as(REPO, pr, "grace", ask);
    }
    w.lp().read().await;
    assert_eq!(w.db.queue.job(id).await.unwrap().unwrap().0.state, JobState::Completed, "the burst is not quiet yet");
    w.lp().quiet(id).await;
    w.lp().read().await;
    w.lp().followed_up(id, 1, &m.log).await;
    w.lp().delivered(id, "follow_up_answers", 1, &m.log).await;
    let fed: Vec<FeedbackRow> = w.lp().feedback(id).await.into_iter().filter(|f| f.follow_up == Some(1)).collect();
    assert_eq!(fed.len(), 3, "one follow-up took the three: {fed:?}");
    assert_eq!(w.said_on_pr(pr, "**Follow-up 1**").len(), 1, "one summary");
    assert_eq!(w.said_on_pr(pr, "No changes: nothing was pushed.").len(), 1, "it says it changed nothing");
    assert_eq!(head(&w), pushed, "no empty commit was pushed");

    w.gh.comment_as(REPO, pr, "grace", "/devpilot one more thing");
    w.lp().read().await;
    w.lp().quiet(id).await;
    w.lp().read().await;
    w.lp().delivered(id, "handed_back", 1, &m.log).await;
    for _ in 0..2 {
        next_turn(&w.db, &w.orch).await;
    }
    assert_eq!(w.said_on_pr(pr, "handed").len(), 1, "one hand-back comment");
    let job = w.db.queue.job(id).await.unwrap().unwrap().0;
    assert_eq!((job.follow_ups, job.state), (1, JobState::Completed));
    assert_eq!(w.db.queue.watch_of(id).await.unwrap().unwrap().state, "handed_back");
    assert!(w.gh.rejected().is_empty(), "{:?}", w.gh.rejected());
    assert_no_secret(&w.db, w.db.dir.path(), &[m.pid()]).await;
}

/// Two machines poll the same pull request: the review's pieces are kept once and fed to one
/// follow-up; the first reply's answer is lost after GitHub applied it, and the retry finds
/// it by its marker: each inline comment has exactly one reply in its thread.
async fn a_lost_reply_is_posted_once_and_two_machines_take_each_piece_once(backend: Backend) {
    let w = World::new(backend, "lost-reply").await;
    let agent = editing_agent(w.db.dir.path());
    let script = agent.script.display().to_string();
    let (ha, hb) = (w.home("laptop", ""), w.home("desktop", ""));
    let a = w.run(&ha, "laptop", &["--", &script], &[]);
    let b = w.run(&hb, "desktop", &["--", &script], &[]);
    let id = w.lp().job().await.id;
    let pr = w.lp().pull(id, &a.log).await;
    let comments = [("fix.txt", 1, "This file should not grow forever."), ("fix.txt", 1, "Add a newline.")];
    let (_, ids) = w.gh.review(REPO, pr, "grace", "CHANGES_REQUESTED", "Two small things.", &comments);
    let hold = Duration::from_secs(8);
    w.gh.inject(Fault { op: "pulls/create-reply-for-review-comment", kind: FaultKind::Timeout { hold }, times: 1 });
    for _ in 0..3 {
        w.lp().read().await;
    }
    assert_eq!(w.lp().feedback(id).await.len(), 3, "the review and its two comments, once each");
    w.lp().quiet(id).await;
    w.lp().read().await;
    w.lp().followed_up(id, 1, &a.log).await;
    w.lp().delivered(id, "follow_up_answers", 1, &a.log).await;
    let replies = w.gh.review_comments(REPO, pr);
    for c in &ids {
        let mine: Vec<_> = replies.iter().filter(|r| r.in_reply_to == Some(*c)).collect();
        assert_eq!(mine.len(), 1, "one reply under comment {c}: {replies:?}");
        assert!(mine[0].body.starts_with("Addressed in `"), "{:?}", mine[0]);
    }
    assert_eq!(w.gh.count("pulls/create-reply-for-review-comment"), 2, "the lost one is not sent again");
    let history = w.db.queue.history(id).await.unwrap();
    assert_eq!(history.iter().filter(|e| e.kind == "follow_up").count(), 1, "{history:?}");
    // Removing the label ends the loop.
    w.gh.set_labels(REPO, 1, &[]);
    next_turn(&w.db, &w.orch).await;
    let ended = || async { w.db.queue.watch_of(id).await.unwrap().unwrap().state == "unlabelled" };
    assert!(wait_for(WAIT, ended).await, "the lost label ended the loop");
    assert!(w.gh.rejected().is_empty(), "{:?}", w.gh.rejected());
    drop((a, b));
}

/// An idle watched pull request costs three conditional requests per turn, all 304s that
/// count against no budget. Merging it ends the loop: the next turn sees the merge, later
/// comments feed nothing, and the pull request is not read again.
async fn merging_the_pr_ends_the_loop_and_an_idle_pr_costs_only_304s(backend: Backend) {
    let w = World::new(backend, "merge").await;
    let agent = editing_agent(w.db.dir.path());
    let home = w.home("desktop", "");
    let m = w.run(&home, "desktop", &["--", &agent.script.display().to_string()], &[]);
    let id = w.lp().job().await.id;
    let pr = w.lp().pull(id, &m.log).await;
    w.lp().read().await;
    let on_pr = |w: &World| {
        let pulls = format!("/pulls/{pr}");
        w.gh.recorded()
            .into_iter()
            .filter(|r| r.path.contains(&pulls) || r.path.contains("/commits/"))
            .collect::<Vec<_>>()
    };
    let before = on_pr(&w).len();
    let idle_turns = 3;
    for _ in 0..idle_turns {
        w.lp().read().await;
    }
    let idle: Vec<_> = on_pr(&w).into_iter().skip(before).collect();
    assert_eq!(idle.len(), 3 * idle_turns, "three requests per idle turn: {idle:?}");
    assert!(idle.iter().all(|r| r.conditional && r.status == 304 && !r.counted), "all free 304s: {idle:?}");
    eprintln!("an idle pull request: {} requests per turn, all 304", idle.len() / idle_turns);

    w.gh.merge_pull(REPO, pr);
    w.lp().read().await;
    let ended = || async { w.db.queue.watch_of(id).await.unwrap().unwrap().state == "merged" };
    assert!(wait_for(WAIT, ended).await, "the merge ended the loop");
    let read = on_pr(&w).len();
    w.gh.comment_as(REPO, pr, "grace", "/devpilot one more thing after the merge");
    for _ in 0..2 {
        next_turn(&w.db, &w.orch).await;
    }
    assert_eq!(on_pr(&w).len(), read, "a merged pull request is not read");
    assert!(w.lp().feedback(id).await.is_empty());
    assert_eq!(w.db.queue.job(id).await.unwrap().unwrap().0.follow_ups, 0);
    assert!(w.gh.rejected().is_empty(), "{:?}", w.gh.rejected());
}

/// Where the pinned agent CLIs are (`scripts/agent_clis.sh`).
fn clis() -> PathBuf {
    let dir = std::env::var("DEVPILOT_AGENT_CLIS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/devpilot-agent-clis"));
    assert!(dir.join("bin/claude").exists(), "claude is not installed: run scripts/agent_clis.sh");
    dir.join("bin")
}

/// The environment a machine's claude runs with: its own HOME (its sessions), the model server.
fn claude_env(cli_home: &Path, model: &ModelServer) -> Vec<(String, String)> {
    std::fs::create_dir_all(cli_home).unwrap();
    let path = format!("{}:{}", clis().display(), std::env::var("PATH").unwrap());
    [
        ("PATH", path),
        ("HOME", cli_home.display().to_string()),
        ("ANTHROPIC_BASE_URL", model.url()),
        ("ANTHROPIC_API_KEY", "sk-ant-test-key".to_string()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The laptop's claude completes the job and its draft PR opens; the laptop stops. A reviewer
/// asks for changes with two inline comments and a check fails. The desktop takes one
/// follow-up: claude's first request there carries the laptop's turns, both comments and the
/// check's output; the desktop pushes to the same branch; each inline comment gets one reply
/// in its thread, and the PR one summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_comes_back_to_the_same_conversation_on_the_awake_machine() {
    let w = World::new(Backend::Postgres, "claude-loop").await;
    let model = ModelServer::start().unwrap();
    let cli_root = tempfile::Builder::new().prefix("devpilot-cli-").tempdir_in("/var/tmp").unwrap();
    let (hl, hd) = (w.home("laptop", ""), w.home("desktop", ""));
    let claude = ["--agent", "claude"];
    // The only job of a fresh database is job 1: its worktree is known before it exists.
    let file = |home: &Path| worktree_of(home, &w.orch, 1).join("login.js").display().to_string();
    model.script([
        Turn::Tool { name: "Write".into(), input: json!({"file_path": file(&hl), "content": "var ok = 1;\n"}) },
        Turn::Text("Fixed the login redirect.".into()),
    ]);
    let laptop = w.run(&hl, "laptop", &claude, &claude_env(&cli_root.path().join("laptop"), &model));
    let id = w.lp().job().await.id;
    assert_eq!(id, 1);
    let pr = w.lp().pull(id, &laptop.log).await;
    drop(laptop);

    let asks = [("login.js", 1, "Use const, not var."), ("login.js", 1, "Name it `loggedIn`.")];
    let (_, ids) = w.gh.review(REPO, pr, "grace", "CHANGES_REQUESTED", "Close, two things.", &asks);
    w.gh.check_run(REPO, pr, "test", "failure", "1 test failed", "login_test: expected 200, got 500", "");
    model.script([
        Turn::Tool { name: "Write".into(), input: json!({"file_path": file(&hd), "content": "const loggedIn = 1;\n"}) },
        Turn::Text(
            "Done.\nREPLY 1: addressed: both\nREPLY 2: addressed: const now\nREPLY 3: addressed: renamed\n\
             REPLY 4: addressed: the redirect returns 200"
                .into(),
        ),
    ]);
    let desktop = w.run(&hd, "desktop", &claude, &claude_env(&cli_root.path().join("desktop"), &model));
    w.lp().read().await;
    assert_eq!(w.lp().feedback(id).await.len(), 4, "the review, its two comments and the check");
    w.lp().quiet(id).await;
    w.lp().read().await;
    let job = w.lp().followed_up(id, 1, &desktop.log).await;
    w.lp().delivered(id, "follow_up_answers", 1, &desktop.log).await;

    let main = model.main_requests();
    assert_eq!(main.len(), 4, "two turns on the laptop, two on the desktop");
    let first = main[2].body.to_string();
    for carried in [
        "Fixed the login redirect.",
        "var ok = 1;",
        "Use const, not var.",
        "Name it `loggedIn`.",
        "expected 200, got 500",
    ] {
        assert!(first.contains(carried), "the desktop's first request carries {carried:?}: {first}");
    }
    assert_eq!(job.claimed_by.as_deref(), Some("desktop"));
    let branch = format!("devpilot/{id}-gh-1-fix-the-login");
    assert_eq!(
        w.remote.show(&branch, "login.js").as_deref(),
        Some("const loggedIn = 1;\n"),
        "pushed to the PR's branch"
    );
    assert_eq!(w.gh.pulls(REPO).len(), 1, "the same pull request");
    let replies = w.gh.review_comments(REPO, pr);
    for (c, says) in ids.iter().zip(["const now", "renamed"]) {
        let mine: Vec<_> = replies.iter().filter(|r| r.in_reply_to == Some(*c)).collect();
        assert_eq!(mine.len(), 1, "one reply under comment {c}: {replies:?}");
        assert!(mine[0].body.starts_with("Addressed in `") && mine[0].body.contains(says), "{:?}", mine[0]);
    }
    assert_eq!(w.said_on_pr(pr, "**Follow-up 1** on desktop").len(), 1);
    let history = w.db.queue.history(id).await.unwrap();
    assert!(
        history
            .iter()
            .any(|e| e.kind == "session_resumed" && e.detail.as_deref().is_some_and(|d| d.contains("from laptop"))),
        "{history:?}"
    );
    assert!(w.gh.rejected().is_empty(), "{:?}", w.gh.rejected());
    drop(desktop);
}
