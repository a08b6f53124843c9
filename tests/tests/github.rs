//! GitHub issues in, results and pull requests back, through real `devpilot run` processes,
//! real git remotes and the CLI, against the harness's loopback stand-in for GitHub (which
//! refuses any request GitHub's published description does not allow). Every test runs on
//! PostgreSQL and on SQLite. Time passes by moving the source's timestamps, never by sleeping.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_store::queue::JobRow;
use devpilot_tests::github::{Access, Fault, FaultKind, IssueSeed};
use devpilot_tests::linear::IssueSeed as LinearSeed;
use devpilot_tests::review::github_clone;
use devpilot_tests::sources::{self, assert_no_secret, jobs, machine, next_turn, turns, WAIT};
use devpilot_tests::{
    git, wait_for, write_config, Backend, GitHubStandIn, GitRemote, LinearStandIn, RecordingAgent, TestDb,
};

devpilot_tests::on_both_backends!(
    two_machines_add_each_issue_once_and_an_idle_poll_is_a_304,
    a_completed_job_opens_its_draft_pr_once_and_links_it_on_the_issue,
    closing_the_issue_or_removing_its_label_cancels_its_job,
    a_job_from_linear_opens_its_pr_and_attaches_it_on_linear,
    a_deleted_base_leaves_the_job_completed_and_the_row_with_its_error,
    bad_input_is_said_clearly_and_nothing_is_lost,
    a_comment_whose_answer_was_lost_is_posted_once_and_the_working_label_comes_and_goes,
    rate_limits_hold_the_source_and_a_refused_token_is_said,
    an_unmapped_source_runs_in_the_clone_of_its_repository_and_no_changes_open_no_pr,
    an_unmapped_source_with_no_clone_anywhere_waits_and_says_why,
    a_refused_token_leaves_the_machine_idle_not_spinning,
);

const TOKEN: &str = "ghp_TESTSECRET_0a1b2c3d4e5f";
const LINEAR_KEY: &str = "lin_api_TESTSECRET_9f8e7d6c5b4a";
const REPO: &str = "acme/webapp";

/// A machine's home with the GitHub source `gh` (see [`sources::github_home`]).
fn home_with(root: &Path, name: &str, orch: &str, api_url: &str, extra: &str, rest: &str) -> PathBuf {
    sources::github_home(root, name, orch, api_url, extra, rest)
}

/// The CLI in `home` with `GITHUB_TOKEN`: (exit code, stdout, stderr).
fn cli(home: &Path, db: &TestDb, token: &str, args: &[&str]) -> (i32, String, String) {
    sources::cli(home, db, &[("GITHUB_TOKEN", token)], args)
}

async fn job_of(db: &TestDb, orch: &str, number: u64) -> Option<JobRow> {
    let key = format!("github:{REPO}#{number}");
    jobs(db, orch).await.into_iter().find(|j| j.unique_key.as_deref() == Some(key.as_str()))
}

/// `[repos.webapp]` at `clone`, pushing completed jobs, with `extra` lines.
fn repo_toml(clone: &Path, extra: &str) -> String {
    format!("[repos.webapp]\npath = \"{}\"\npush = true\n{extra}\n", clone.display())
}

/// An agent that changes a file and says what it did.
fn editing_agent(dir: &Path) -> RecordingAgent {
    RecordingAgent::new(
        dir,
        r#"echo "fixed" > fix.txt; printf '{"summary":"fixed the redirect"}' > "$DEVPILOT_RESULT_FILE""#,
    )
}

/// The list calls, in order.
fn list_calls(gh: &GitHubStandIn) -> Vec<devpilot_tests::github::Recorded> {
    gh.recorded().into_iter().filter(|r| r.op == "issues/list-for-repo").collect()
}

/// Two machines poll one repo: each labelled issue (not the unlabelled one, not a pull
/// request, which the list returns too) becomes exactly one job, the fleet lists once per
/// intake turn, a turn with nothing new sends the stored ETag and gets a 304 that costs no
/// budget, every claim and completion is commented once with its marker, and the token
/// reaches no file, row, log line or argv.
async fn two_machines_add_each_issue_once_and_an_idle_poll_is_a_304(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("gh");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    for t in ["Fix login", "Add dark mode", "Speed up search"] {
        gh.open_issue(REPO, IssueSeed::new(t, &["agent"]));
    }
    gh.open_issue(REPO, IssueSeed::new("Not for agents", &[]));
    open_pull_item(&gh);
    let agent =
        RecordingAgent::new(db.dir.path(), r#"env > "$(dirname "$DEVPILOT_PAYLOAD_FILE")/env-$DEVPILOT_JOB_ID""#);
    let homes: Vec<PathBuf> =
        ["laptop", "desktop"].iter().map(|m| home_with(db.dir.path(), m, &orch, &gh.url(), "", "")).collect();
    let env = [("GITHUB_TOKEN", TOKEN)];
    let a = machine(&homes[0], &db, &orch, "laptop", &agent.script, &env);
    let b = machine(&homes[1], &db, &orch, "desktop", &agent.script, &env);
    assert!(devpilot_tests::wait_for(WAIT, || async { jobs(&db, &orch).await.len() >= 3 }).await);
    let done = || async {
        jobs(&db, &orch).await.iter().all(|j| j.state == JobState::Completed)
            && (1..=3).all(|n| gh.comments(REPO, n).len() == 2)
    };
    assert!(devpilot_tests::wait_for(WAIT, done).await, "every job completed and reported");
    // Two idle turns: the first reads what the comments changed, the second nothing.
    next_turn(&db, &orch).await;
    next_turn(&db, &orch).await;
    let mut keys: Vec<String> = jobs(&db, &orch).await.iter().filter_map(|j| j.unique_key.clone()).collect();
    keys.sort_unstable();
    assert_eq!(keys, [1, 2, 3].map(|n| format!("github:{REPO}#{n}")), "one job per labelled issue");
    let lists = list_calls(&gh);
    assert_eq!(lists.len() as i64, turns(&db, &orch).await, "one list per turn, not per machine");
    let last = lists.last().unwrap();
    assert!(last.conditional && last.status == 304 && !last.counted, "an idle turn is a free 304: {last:?}");
    assert!(lists.iter().all(|r| !r.query.iter().any(|(k, v)| k == "per_page" && v != "100")));
    for n in 1..=3 {
        let bodies: Vec<String> = gh.comments(REPO, n).into_iter().map(|c| c.body).collect();
        assert_eq!(bodies.len(), 2, "still one claim and one completion, after the idle turns: {bodies:?}");
        assert!(bodies[0].starts_with("Started on ") && bodies[0].contains("<!-- devpilot:job/"), "{bodies:?}");
        assert!(bodies[1].starts_with("Completed on ") && bodies[1].contains("/completed/"), "{bodies:?}");
    }
    assert!(gh.rejected().is_empty(), "nothing the description refuses: {:?}", gh.rejected());
    assert_no_secret(&db, db.dir.path(), &[a.pid(), b.pid()]).await;
}

/// A pull request in the repo (with the label): the issue list returns it, and it must not
/// become a job.
fn open_pull_item(gh: &GitHubStandIn) {
    let body = serde_json::json!({ "title": "A PR", "head": "feature", "base": "main", "body": "" });
    let url = format!("{}/repos/{REPO}/pulls", gh.url());
    // The blocking client runs a runtime of its own: not on the test's.
    devpilot_engine::sources::linear::install_crypto_provider();
    let answer = std::thread::spawn(move || {
        let answer = reqwest::blocking::Client::new()
            .post(url)
            .bearer_auth(TOKEN)
            .header("x-github-api-version", "2022-11-28")
            .header("user-agent", "test")
            .json(&body)
            .send()
            .unwrap();
        (answer.status().as_u16(), answer.json::<serde_json::Value>().unwrap())
    })
    .join()
    .unwrap();
    assert_eq!(answer.0, 201, "{}", answer.1);
    let number = answer.1["number"].as_u64().unwrap();
    gh.set_labels(REPO, number, &["agent"]);
}

/// A job completes with its branch pushed to a github.com remote (a real bare repository
/// behind git's `insteadOf`): its draft PR is opened once even though the first create
/// timed out after GitHub applied it (the retry finds it by its head), the PR closes the
/// issue, its URL becomes the job's result link, and it is linked on the issue once.
async fn a_completed_job_opens_its_draft_pr_once_and_links_it_on_the_issue(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("pr");
    let remote = GitRemote::new(db.dir.path());
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo_with_git(REPO, &remote.bare);
    gh.open_issue(REPO, IssueSeed::new("Fix the login", &["agent"]));
    gh.inject(Fault { op: "pulls/create", kind: FaultKind::Timeout { hold: Duration::from_secs(15) }, times: 1 });
    let clone = github_clone(&remote, db.dir.path(), "desktop");
    let rest = repo_toml(&clone, "");
    let home = home_with(db.dir.path(), "desktop", &orch, &gh.url(), "timeout = \"5s\"\nmaps_to = \"webapp\"", &rest);
    let agent = editing_agent(db.dir.path());
    let env = [("GITHUB_TOKEN", TOKEN), ("DEVPILOT_GITHUB_API_URL", &gh.url())];
    let m = machine(&home, &db, &orch, "desktop", &agent.script, &env);
    let linked = || async {
        let Some(job) = job_of(&db, &orch, 1).await else { return false };
        let rows = db.queue.outbox_of(job.id).await.unwrap();
        rows.iter().any(|r| r.event == "pull_request" && r.outcome.as_deref() == Some("delivered"))
    };
    let said = || std::fs::read_to_string(&m.log).unwrap_or_default();
    assert!(devpilot_tests::wait_for(WAIT * 2, linked).await, "the pull request row was delivered: {}", said());
    let job = job_of(&db, &orch, 1).await.unwrap();
    assert_eq!(job.state, JobState::Completed);
    let pulls = gh.pulls(REPO);
    assert_eq!(pulls.len(), 1, "opened once: {pulls:?}");
    let pr = &pulls[0];
    assert!(pr.draft, "draft by default");
    assert_eq!(
        (pr.head.as_str(), pr.base.as_str()),
        (format!("devpilot/{}-gh-1-fix-the-login", job.id).as_str(), "main")
    );
    assert_eq!(pr.title, "#1 Fix the login");
    let body = pr.body.clone().unwrap_or_default();
    assert!(body.contains("fixed the redirect") && body.contains("Closes #1"), "{body}");
    assert!(remote.show(&pr.head, "fix.txt").is_some(), "the branch is really on the remote");
    assert_eq!(job.url.as_deref(), Some(pr.html_url.as_str()), "the PR is the job's result link");
    assert_eq!(gh.count("pulls/create"), 1, "the retry found the PR instead of creating another");
    let links: Vec<String> =
        gh.comments(REPO, 1).into_iter().map(|c| c.body).filter(|b| b.contains(&pr.html_url)).collect();
    assert_eq!(links.len(), 1, "linked on the issue once: {links:?}");
    assert!(job.pushed_remote.as_deref().is_some_and(|r| r.contains("github.com/acme/webapp")));
    assert!(gh.rejected().is_empty(), "{:?}", gh.rejected());
    assert_no_secret(&db, db.dir.path(), &[m.pid()]).await;
}

/// Through `devpilot sources poll`: a closed issue cancels its queued job, and so does one
/// whose label was removed; a poll with nothing new is a 304 (the CLI uses the ETag the
/// database keeps, like any machine); an issue labelled with spaces and an emoji is taken.
async fn closing_the_issue_or_removing_its_label_cancels_its_job(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("close");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    let label = "agent 🤖 ready";
    let one = gh.open_issue(REPO, IssueSeed::new("Fix login", &[label]));
    let two = gh.open_issue(REPO, IssueSeed::new("Add dark mode", &[label, "docs"]));
    let home = home_with(db.dir.path(), "desktop", &orch, &gh.url(), "", "");
    let config = home.join("config").join("devpilot").join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap().replace("label = \"agent\"", &format!("label = \"{label}\""));
    std::fs::write(&config, text).unwrap();
    let poll = || cli(&home, &db, TOKEN, &["sources", "poll", "--orchestrator", &orch]);
    let (code, out, err) = poll();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("added github:{REPO}#{one}")) && out.contains(&format!("#{two}")), "{out}");
    let (code, out, _) = poll();
    assert_eq!(code, 0);
    assert!(out.contains("0 issues read"), "{out}");
    assert_eq!(list_calls(&gh).last().unwrap().status, 304, "nothing new: a 304");
    gh.close_issue(REPO, one);
    gh.set_labels(REPO, two, &["docs"]);
    let (code, out, err) = poll();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("cancelled github:{REPO}#{one}")), "{out}");
    assert!(out.contains(&format!("cancelled github:{REPO}#{two}")), "{out}");
    for n in [one, two] {
        assert_eq!(job_of(&db, &orch, n).await.unwrap().state, JobState::Cancelled);
    }
    assert!(gh.rejected().is_empty(), "{:?}", gh.rejected());
}

/// A job from a Linear issue, in a repo whose remote is on GitHub, opens its PR (naming the
/// Linear issue) and the PR is attached to the Linear issue.
async fn a_job_from_linear_opens_its_pr_and_attaches_it_on_linear(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("linpr");
    let remote = GitRemote::new(db.dir.path());
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo_with_git(REPO, &remote.bare);
    let linear = LinearStandIn::start(LINEAR_KEY);
    linear.add_issue(LinearSeed::new("Fix login", &["agent"]));
    let clone = github_clone(&remote, db.dir.path(), "desktop");
    let home = db.dir.path().join("desktop");
    write_config(
        &home,
        &format!(
            "orchestrator_id = \"{orch}\"\n[sources.eng]\nkind = \"linear\"\nteams = [\"ENG\"]\nlabel = \"agent\"\n\
             interval = \"15s\"\ntimeout = \"10s\"\napi_url = \"{}\"\nmaps_to = \"webapp\"\n{}",
            linear.url(),
            repo_toml(&clone, "pull_request = \"ready\"")
        ),
    );
    let agent = editing_agent(db.dir.path());
    let env = [("GITHUB_TOKEN", TOKEN), ("LINEAR_API_KEY", LINEAR_KEY), ("DEVPILOT_GITHUB_API_URL", &gh.url())];
    let m = machine(&home, &db, &orch, "desktop", &agent.script, &env);
    let attached = || async { !gh.pulls(REPO).is_empty() && !linear.attachments("ENG-1").is_empty() };
    let said = || std::fs::read_to_string(&m.log).unwrap_or_default();
    assert!(devpilot_tests::wait_for(WAIT * 2, attached).await, "the PR was opened and attached: {}", said());
    let pr = gh.pulls(REPO).remove(0);
    assert!(!pr.draft, "the repo asked for ready PRs");
    assert!(pr.body.clone().unwrap_or_default().contains("linear.app"), "{:?}", pr.body);
    let urls: Vec<String> = linear.attachments("ENG-1").into_iter().map(|(url, _)| url).collect();
    assert!(urls.contains(&pr.html_url), "{urls:?}");
    assert!(gh.rejected().is_empty() && linear.rejected().is_empty());
    assert_no_secret(&db, db.dir.path(), &[m.pid()]).await;
}

/// The PR's base branch was deleted: GitHub refuses the PR, the job stays completed, and its
/// pull request row ends given up with GitHub's error; the completion was still commented.
async fn a_deleted_base_leaves_the_job_completed_and_the_row_with_its_error(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("nobase");
    let remote = GitRemote::new(db.dir.path());
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    gh.delete_branch(REPO, "main");
    gh.open_issue(REPO, IssueSeed::new("Fix login", &["agent"]));
    let clone = github_clone(&remote, db.dir.path(), "desktop");
    let home = home_with(db.dir.path(), "desktop", &orch, &gh.url(), "maps_to = \"webapp\"", &repo_toml(&clone, ""));
    let agent = editing_agent(db.dir.path());
    let env = [("GITHUB_TOKEN", TOKEN), ("DEVPILOT_GITHUB_API_URL", &gh.url())];
    let _m = machine(&home, &db, &orch, "desktop", &agent.script, &env);
    let ended = || async {
        let job = job_of(&db, &orch, 1).await?;
        let rows = db.queue.outbox_of(job.id).await.unwrap();
        rows.into_iter().find(|r| r.event == "pull_request" && r.done_at.is_some())
    };
    assert!(devpilot_tests::wait_for(WAIT * 2, || async { ended().await.is_some() }).await, "the PR row ended");
    let row = ended().await.unwrap();
    assert_eq!(row.outcome.as_deref(), Some("gave_up"));
    assert!(row.last_error.as_deref().unwrap_or("").contains("base"), "{:?}", row.last_error);
    assert_eq!(job_of(&db, &orch, 1).await.unwrap().state, JobState::Completed);
    assert!(gh.pulls(REPO).is_empty());
    assert!(gh.comments(REPO, 1).iter().any(|c| c.body.starts_with("Completed on ")));
}

/// Bad input, each with a clear message and nothing lost: a token that cannot see the repo
/// (404 naming the repo and what the token needs), a repo that does not exist, a 65,536-
/// character body (capped into the prompt), and GitHub unreachable (the source is offline
/// while a plain job still runs).
async fn bad_input_is_said_clearly_and_nothing_is_lost(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("bad");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    gh.add_label(REPO, "agent");
    gh.add_token("ghp_TESTSECRET_noaccess", Access::NoRepo);
    let home = db.dir.path().join("desktop");
    write_config(&home, &format!("orchestrator_id = \"{orch}\"\n"));
    let add = |repo: &str, token: &str| {
        cli(&home, &db, token, &["sources", "add", "github", "--repo", repo, "--api-url", &gh.url(), "--name", "x"])
    };
    let (code, _, err) = add(REPO, "ghp_TESTSECRET_noaccess");
    assert_ne!(code, 0);
    assert!(err.contains("acme/webapp") && err.contains("repo` scope") && err.contains("Issues: read"), "{err}");
    let (code, _, err) = add("acme/nothere", TOKEN);
    assert_ne!(code, 0);
    assert!(err.contains("acme/nothere was not found"), "{err}");
    let (code, out, err) = add(REPO, TOKEN);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Connected as ") && out.contains("acme/webapp"), "{out}");
    let long = "x".repeat(65_536);
    let n = gh.open_issue(REPO, IssueSeed { body: Some(long), ..IssueSeed::new("Huge", &["agent"]) });
    let (code, out, err) = cli(&home, &db, TOKEN, &["sources", "poll", "--orchestrator", &orch]);
    assert_eq!(code, 0, "{out}{err}");
    let (_, payload) = db.queue.job(job_of(&db, &orch, n).await.unwrap().id).await.unwrap().unwrap();
    let prompt = payload["prompt"].as_str().unwrap();
    assert!(prompt.len() <= 32 * 1024 && prompt.contains("was cut here"), "{}", prompt.len());

    // GitHub unreachable: the source says so, and a plain job runs all the same.
    let dead = format!("http://127.0.0.1:{}", devpilot_tests::free_port());
    let offline = home_with(db.dir.path(), "laptop", &orch, &dead, "", "");
    let agent = RecordingAgent::new(db.dir.path(), "true");
    let _m = machine(&offline, &db, &orch, "laptop", &agent.script, &[("GITHUB_TOKEN", TOKEN)]);
    let id = devpilot_tests::enqueue(&offline, &db, &orch, &["--title", "plain work"]);
    let ran = || async { db.queue.job(id).await.unwrap().is_some_and(|(j, _)| j.state == JobState::Completed) };
    assert!(devpilot_tests::wait_for(WAIT, ran).await, "the plain job ran while GitHub was down");
    let offline_said = || async {
        db.queue
            .sources(&orch)
            .await
            .unwrap()
            .iter()
            .any(|s| s.last_error.as_deref().is_some_and(|e| e.contains("GitHub could not be reached")))
    };
    assert!(devpilot_tests::wait_for(WAIT, offline_said).await, "the source says GitHub is unreachable");
    assert!(gh.rejected().is_empty(), "{:?}", gh.rejected());
}

/// The completion's comment is applied and its answer lost: the retry finds the comment by
/// its hidden marker and posts nothing, so the issue has it once. The "working" label is on
/// the issue while the job runs and off once it completed.
async fn a_comment_whose_answer_was_lost_is_posted_once_and_the_working_label_comes_and_goes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("lost");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    gh.open_issue(REPO, IssueSeed::new("Fix login", &["agent"]));
    let extra = "timeout = \"5s\"";
    let home = home_with(
        db.dir.path(),
        "desktop",
        &orch,
        &gh.url(),
        extra,
        "[sources.gh.report]\nclaimed = false\nworking_label = \"devpilot: working\"",
    );
    // The agent waits until the label is on the issue, so the test sees it while it runs.
    let marker = db.dir.path().join("labelled");
    let agent = RecordingAgent::new(
        db.dir.path(),
        &format!(
            "while [ ! -f {m} ]; do sleep 0.1; done; printf '{{\"summary\":\"fixed\"}}' > \"$DEVPILOT_RESULT_FILE\"",
            m = marker.display()
        ),
    );
    gh.inject(Fault {
        op: "issues/create-comment",
        kind: FaultKind::Timeout { hold: Duration::from_secs(15) },
        times: 1,
    });
    let _m = machine(&home, &db, &orch, "desktop", &agent.script, &[("GITHUB_TOKEN", TOKEN)]);
    let labelled = || async { gh.labels_of(REPO, 1).iter().any(|l| l == "devpilot: working") };
    assert!(devpilot_tests::wait_for(WAIT, labelled).await, "the working label while the job runs");
    std::fs::write(&marker, "").unwrap();
    let delivered = || async {
        let Some(job) = job_of(&db, &orch, 1).await else { return false };
        let rows = db.queue.outbox_of(job.id).await.unwrap();
        rows.iter().any(|r| r.event == "completed" && r.outcome.as_deref() == Some("delivered"))
    };
    assert!(devpilot_tests::wait_for(WAIT * 2, delivered).await, "the completion was delivered in the end");
    let comments: Vec<String> = gh.comments(REPO, 1).into_iter().map(|c| c.body).collect();
    assert_eq!(comments.iter().filter(|b| b.starts_with("Completed on ")).count(), 1, "posted once: {comments:?}");
    assert!(gh.count("issues/list-comments") >= 1, "the retry looked for its marker");
    assert!(!gh.labels_of(REPO, 1).iter().any(|l| l == "devpilot: working"), "the label is off once it completed");
    assert!(gh.rejected().is_empty(), "{:?}", gh.rejected());
}

/// GitHub's secondary rate limit (403 with `retry-after`) holds the source until then and
/// the CLI says so; a rate limit spent (`x-ratelimit-remaining: 0`) holds it until the
/// reset; a revoked token (401) is said as a refused token, naming how to set a new one.
async fn rate_limits_hold_the_source_and_a_refused_token_is_said(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("limits");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    gh.open_issue(REPO, IssueSeed::new("Fix login", &["agent"]));
    let home = home_with(db.dir.path(), "desktop", &orch, &gh.url(), "", "");
    let poll = || cli(&home, &db, TOKEN, &["sources", "poll", "--orchestrator", &orch]);
    let hold = || async {
        db.scalar(&format!("SELECT MAX(hold_until - polled_at) FROM sources WHERE orchestrator_id = '{orch}'"))
            .await
            .unwrap_or(0)
    };

    gh.inject(Fault { op: "issues/list-for-repo", kind: FaultKind::SecondaryLimit { retry_after_s: 120 }, times: 1 });
    let (code, _, err) = poll();
    assert_ne!(code, 0);
    assert!(err.contains("GitHub's rate limit was reached"), "{err}");
    let held = hold().await;
    assert!((100_000..=140_000).contains(&held), "held for retry-after's 120 s: {held} ms");

    let reset = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64 + 3600;
    gh.set_rate(0, reset);
    let (code, _, err) = poll();
    assert_ne!(code, 0);
    assert!(err.contains("rate limit"), "{err}");
    assert!(hold().await > 3_000_000, "held until the reset an hour away");

    gh.set_rate(5000, reset);
    gh.inject(Fault { op: "issues/list-for-repo", kind: FaultKind::Unauthorized, times: 1 });
    let (code, _, err) = poll();
    assert_ne!(code, 0);
    assert!(err.contains("GitHub refused the token") && err.contains("devpilot login --github"), "{err}");
    assert!(!err.contains("TESTSECRET"), "{err}");
    let (code, out, err) = poll();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("added github:{REPO}#1")), "nothing was lost: {out}");
    assert!(gh.rejected().is_empty(), "{:?}", gh.rejected());
}

/// `sources add github` as a new user types it (no `--maps-to`) on a machine whose repo `web`
/// is a clone of acme/webapp: the CLI says the jobs run there, and they do (not in a scratch
/// directory). The issue whose agent edits a file gets its branch and draft PR; the one
/// whose agent changes nothing gets no branch, no PR request, and "No changes" on the issue.
async fn an_unmapped_source_runs_in_the_clone_of_its_repository_and_no_changes_open_no_pr(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("map");
    let remote = GitRemote::new(db.dir.path());
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo_with_git(REPO, &remote.bare);
    gh.open_issue(REPO, IssueSeed::new("Fix the login", &["agent"]));
    gh.open_issue(REPO, IssueSeed::new("Explain the cache", &["agent"]));
    let clone = github_clone(&remote, db.dir.path(), "desktop");
    // Named `web`, not after the repository: only its remote says which repository it is.
    let home = db.dir.path().join("desktop");
    let repo = format!("[repos.web]\npath = \"{}\"\npush = true\n", clone.display());
    write_config(&home, &format!("orchestrator_id = \"{orch}\"\n{repo}"));
    let add = ["sources", "add", "github", "--repo", REPO, "--label", "agent", "--interval", "15s"];
    let (code, out, err) = cli(&home, &db, TOKEN, &[&add[..], &["--api-url", &gh.url()]].concat());
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("webapp: its jobs run in repo 'web'")
            && out.contains("whose remote is acme/webapp")
            && out.contains("opens a draft pull request"),
        "the CLI says where its jobs run: {out}"
    );
    let agent = RecordingAgent::new(
        db.dir.path(),
        r#"if grep -q 'Fix the login' "$DEVPILOT_PAYLOAD_FILE"; then echo fixed > fix.txt; fi
printf '{"summary":"done"}' > "$DEVPILOT_RESULT_FILE""#,
    );
    let m = machine(&home, &db, &orch, "desktop", &agent.script, &[("GITHUB_TOKEN", TOKEN)]);
    let delivered = |n: u64, event: &'static str| {
        let (db, orch) = (&db, &orch);
        async move {
            let Some(job) = job_of(db, orch, n).await else { return false };
            let rows = db.queue.outbox_of(job.id).await.unwrap();
            rows.iter().any(|r| r.event == event && r.outcome.as_deref() == Some("delivered"))
        }
    };
    let done = || async {
        delivered(1, "pull_request").await && delivered(2, "completed").await && delivered(2, "pull_request").await
    };
    let said = || std::fs::read_to_string(&m.log).unwrap_or_default();
    assert!(devpilot_tests::wait_for(WAIT * 2, done).await, "both jobs reported: {}", said());
    let (fixed, explained) = (job_of(&db, &orch, 1).await.unwrap(), job_of(&db, &orch, 2).await.unwrap());
    assert_eq!((fixed.repo.as_deref(), explained.repo.as_deref()), (Some("web"), Some("web")), "mapped by remote");
    assert_eq!((fixed.state, explained.state), (JobState::Completed, JobState::Completed));
    let pulls = gh.pulls(REPO);
    assert_eq!(pulls.len(), 1, "one PR, for the job that changed a file: {pulls:?}");
    assert!(pulls[0].head.starts_with(&format!("devpilot/{}-", fixed.id)), "{pulls:?}");
    assert!(remote.show(&pulls[0].head, "fix.txt").is_some(), "its branch is on the remote");
    assert_eq!(gh.count("pulls/create"), 1, "no PR was asked for the job that changed nothing");
    assert_eq!((fixed.commits, explained.commits), (Some(1), Some(0)));
    assert_eq!(explained.pushed_remote, None, "nothing pushed for no changes");
    let branches = git(&remote.bare, &["for-each-ref", "--format=%(refname)", "refs/heads/devpilot/"]);
    assert_eq!(branches.lines().count(), 1, "one branch on the remote: {branches}");
    let completed: Vec<String> =
        gh.comments(REPO, 2).into_iter().map(|c| c.body).filter(|b| b.starts_with("Completed on ")).collect();
    assert!(completed.len() == 1 && completed[0].contains("No changes"), "{completed:?}");
    assert!(!completed[0].contains("Branch:"), "{completed:?}");
    assert!(gh.rejected().is_empty(), "{:?}", gh.rejected());
}

/// An unmapped source on a machine with no clone of its repository: `sources add` warns, and
/// the job carries repo `webapp` (the repository's name) and waits for a machine that has
/// it, saying so, instead of running in a scratch directory whose work is thrown away.
async fn an_unmapped_source_with_no_clone_anywhere_waits_and_says_why(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("nomap");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    gh.open_issue(REPO, IssueSeed::new("Fix the login", &["agent"]));
    let home = db.dir.path().join("laptop");
    write_config(&home, &format!("orchestrator_id = \"{orch}\"\n"));
    let add = ["sources", "add", "github", "--repo", REPO, "--label", "agent", "--interval", "15s", "--api-url"];
    let (code, out, err) = cli(&home, &db, TOKEN, &[&add[..], &[&gh.url()]].concat());
    assert_eq!(code, 0, "saved all the same: {out}{err}");
    assert!(
        err.contains("warning: webapp: no repo on this machine has acme/webapp as its remote")
            && err.contains("repo 'webapp'"),
        "{err}"
    );
    let (code, out, err) = cli(&home, &db, TOKEN, &["sources", "poll", "--orchestrator", &orch]);
    assert_eq!(code, 0, "{out}{err}");
    let job = job_of(&db, &orch, 1).await.unwrap();
    assert_eq!(job.repo.as_deref(), Some("webapp"));
    assert_eq!(job.state, JobState::Queued);
    // The desktop, whose clone of acme/webapp is named `web`, takes the next turn after the
    // issue changed (a comment): the job keeps its repo, and nothing calls it edited.
    let remote = GitRemote::new(db.dir.path());
    let clone = github_clone(&remote, db.dir.path(), "desktop");
    let desktop = db.dir.path().join("desktop");
    let laptop_config = std::fs::read_to_string(home.join("config").join("devpilot").join("config.toml")).unwrap();
    write_config(&desktop, &format!("{laptop_config}\n[repos.web]\npath = \"{}\"\npush = true\n", clone.display()));
    gh.comment_as(REPO, 1, "ada", "Any news?");
    let (code, out, err) = cli(&desktop, &db, TOKEN, &["sources", "poll", "--orchestrator", &orch]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 issues read") && !out.contains("edited"), "{out}");
    let again = job_of(&db, &orch, 1).await.unwrap();
    assert_eq!(again.repo.as_deref(), Some("webapp"), "the job keeps the repo it was added with");
    let history = db.queue.history(job.id).await.unwrap();
    assert!(!history.iter().any(|h| h.kind == "edited_after_approval"), "{history:?}");
    let agent = RecordingAgent::new(db.dir.path(), "exit 0");
    let _m = machine(&home, &db, &orch, "laptop", &agent.script, &[("GITHUB_TOKEN", TOKEN)]);
    let online = || async { db.queue.machines(&orch).await.unwrap().iter().any(|m| m.online()) };
    assert!(devpilot_tests::wait_for(WAIT, online).await, "the machine came online");
    let machines = db.queue.machines(&orch).await.unwrap();
    let why = devpilot_store::queue::unroutable(job.repo.as_deref(), &job.requires, &machines);
    assert_eq!(why.as_deref(), Some("no online machine has repo webapp"));
    assert!(gh.rejected().is_empty(), "{:?}", gh.rejected());
}

/// This process's CPU time so far (user and system), from /proc.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    // utime and stime, fields 14 and 15, in clock ticks of 10 ms.
    let ticks: u64 = rest.get(11..13).map(|t| t.iter().filter_map(|v| v.parse::<u64>().ok()).sum()).unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// A token GitHub refuses stops the source on that machine until the key changes, and the
/// machine then waits quietly: its sources service no longer wakes for the source's due turn
/// (a due time left in the past woke it again at once, for ever: a core spent reading the key
/// again and again). The turn's due time lives in the process, so this test lets it pass
/// (15 s) rather than moving a timestamp.
async fn a_refused_token_leaves_the_machine_idle_not_spinning(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("refused");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    let home = home_with(db.dir.path(), "desktop", &orch, &gh.url(), "", "");
    let agent = RecordingAgent::new(db.dir.path(), "true");
    // Unhurried intervals: the machine's own idle work stays far below what is measured.
    let flags = ["--max-poll-interval", "2s", "--sweep-interval", "5s", "--heartbeat", "2s"];
    let env = [("GITHUB_TOKEN", "ghp_TESTSECRET_revoked")];
    let mut m = sources::machine_with(&home, &db, &orch, "desktop", &agent.script, &env, &flags);
    let refused =
        format!("SELECT COUNT(*) FROM sources WHERE orchestrator_id = '{orch}' AND last_error_at IS NOT NULL");
    assert!(wait_for(WAIT, || async { db.scalar(&refused).await.unwrap_or(0) > 0 }).await, "the token was refused");
    let before = cpu_time(m.pid());
    assert!(before > Duration::ZERO, "the machine's CPU time is read from /proc");
    // The source's next turn falls due within 16 s; a spinning service spends a core from then.
    let spent = || async { cpu_time(m.pid()).saturating_sub(before) > Duration::from_secs(3) };
    assert!(
        !wait_for(Duration::from_secs(30), spent).await,
        "the machine spent {:?} of CPU in 30 s while idle",
        cpu_time(m.pid()) - before
    );
    assert!(matches!(m.child.try_wait(), Ok(None)), "the machine is still up");
}

/// Calls PostgreSQL counted (`pg_stat_statements`) in this test's database, of statements
/// whose text has `like` in it.
async fn calls(db: &TestDb, like: &str) -> i64 {
    let sql = format!(
        "SELECT COALESCE(SUM(calls), 0)::bigint FROM pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query LIKE '%{like}%'"
    );
    db.scalar(&sql).await.unwrap_or(-1)
}

/// An idle machine's intake turn is its try and its end: with no pull request watched and no
/// outbox row waiting, it sends no review read and no delivery pass (three statements more
/// a turn before; on SQLite each is two wake-ups of a thread and of the runtime). A row left
/// undelivered (here held by a machine that went away) brings the pass back at the next
/// turn, so a dead machine's comment still goes out. PostgreSQL only: it counts statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_turn_sends_only_its_own_statements() {
    const TAKE_TURN: &str = "UPDATE sources SET polled_at";
    const OPEN_WATCHES: &str = "WHERE w.source_id = $1 AND w.state = ";
    const TAKE_DELIVERY: &str = "UPDATE outbox SET token = token +";
    const NEXT_DELIVERY: &str = "SELECT MIN(CASE WHEN o.claimed_at IS NOT NULL";
    let db = TestDb::new(Backend::Postgres).await;
    db.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await;
    let orch = db.orch("idle-turn");
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo(REPO);
    let home = home_with(db.dir.path(), "desktop", &orch, &gh.url(), "", "");
    let agent = RecordingAgent::new(db.dir.path(), "true");
    let _m = machine(&home, &db, &orch, "desktop", &agent.script, &[("GITHUB_TOKEN", TOKEN)]);
    // The machine's first pass (at its start) looks at the outbox whatever it holds.
    next_turn(&db, &orch).await;
    let counted = [TAKE_TURN, OPEN_WATCHES, TAKE_DELIVERY, NEXT_DELIVERY];
    let snapshot = || async {
        let mut n = vec![];
        for s in counted {
            n.push(calls(&db, s).await);
        }
        n
    };
    let before = snapshot().await;
    assert!(before[0] >= 1, "pg_stat_statements counts the machine's statements: {before:?}");
    // Two turns come on their own, 15 s apart: longer than the interval an old delivery pass
    // waited for.
    let at = turns(&db, &orch).await;
    assert!(wait_for(WAIT * 2, || async { turns(&db, &orch).await >= at + 2 }).await, "two more turns");
    let idle: Vec<i64> = snapshot().await.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(idle[0] >= 2, "the turns were tried: {idle:?}");
    assert_eq!(idle[1..], [0, 0, 0], "no review read, no delivery pass (in order) while idle: {idle:?}");

    // A job's row held by a machine that went away: the next turn sees it, and the pass
    // looks.
    let sid = db.scalar(&format!("SELECT id FROM sources WHERE orchestrator_id = '{orch}'")).await.unwrap();
    let opts = devpilot_store::queue::JobOptions {
        key: Some(format!("github:{REPO}#99")),
        source: Some(sid),
        start: devpilot_store::queue::Start::After(Duration::from_secs(3600)),
        ..Default::default()
    };
    let job = db.queue.enqueue_keyed(&orch, &serde_json::json!({"title": "held"}), &opts).await.unwrap().id;
    db.exec(&format!(
        "INSERT INTO outbox (orchestrator_id, job_id, source_id, event, created_at, next_at, claimed_by, claimed_at)
         VALUES ('{orch}', {job}, {sid}, 'claimed', 0, 0, 'gone', (EXTRACT(EPOCH FROM now()) * 1000)::bigint)"
    ))
    .await;
    // And a pull request watched: the next turn reads it.
    let url = format!("https://github.com/{REPO}/pull/99");
    assert!(db.queue.watch_pull(job, sid, &gh.url(), REPO, 99, &url).await.unwrap());
    let before = snapshot().await;
    next_turn(&db, &orch).await;
    let looked = || async { calls(&db, NEXT_DELIVERY).await > before[3] };
    assert!(wait_for(WAIT, looked).await, "the turn saw the row and the pass looked: {:?}", snapshot().await);
    let after = snapshot().await;
    assert!(after[1] > before[1], "the turn read its watched pull request: {before:?} then {after:?}");
    assert!(after[2] > before[2], "the pass tried to take the row: {before:?} then {after:?}");
}
