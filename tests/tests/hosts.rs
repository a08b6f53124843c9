//! Tracker tokens are per host: github.com's token goes only to github.com's API (here the
//! stand-in `DEVPILOT_GITHUB_API_URL` names), never to a source on another host (GitHub
//! Enterprise), which needs a token of its own. Real `devpilot` processes against two GitHub
//! stand-ins, on PostgreSQL and SQLite.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use devpilot_store::job::JobState;
use devpilot_tests::github::IssueSeed;
use devpilot_tests::sources::{self, jobs, machine, WAIT};
use devpilot_tests::{write_config, Backend, GitHubStandIn, RecordingAgent, TestDb};

devpilot_tests::on_both_backends!(
    a_source_on_another_host_never_receives_the_github_com_token,
    a_source_on_another_host_uses_that_hosts_own_token,
);

const TOKEN: &str = "ghp_TESTSECRET_h0st0a1b2c3d";
/// The token of the other host (the second stand-in knows only this one).
const GHE_TOKEN: &str = "ghp_TESTSECRET_gh3h0st9z8y7";

/// github.com's stand-in with `acme/webapp#1` and another host's (which accepts
/// `ghe_token`) with `corp/tools#1`, both labelled; a home whose sources `gh` and `corp`
/// read them (`corp` first: the settings keep sources in name order).
fn two_hosts(db: &TestDb, orch: &str, ghe_token: &str) -> (GitHubStandIn, GitHubStandIn, std::path::PathBuf) {
    let (gh, ghe) = (GitHubStandIn::start(TOKEN), GitHubStandIn::start(ghe_token));
    gh.add_repo("acme/webapp");
    gh.open_issue("acme/webapp", IssueSeed::new("Fix login", &["agent"]));
    ghe.add_repo("corp/tools");
    ghe.open_issue("corp/tools", IssueSeed::new("Fix the build", &["agent"]));
    let home = db.dir.path().join("desktop");
    let source = |name: &str, repo: &str, api: &str| {
        format!(
            "[sources.{name}]\nkind = \"github\"\nrepo = \"{repo}\"\nlabel = \"agent\"\ninterval = \"15s\"\n\
             timeout = \"10s\"\napi_url = \"{api}\"\nno_repo = true\n"
        )
    };
    write_config(
        &home,
        &format!(
            "orchestrator_id = \"{orch}\"\n{}{}",
            source("gh", "acme/webapp", &gh.url()),
            source("corp", "corp/tools", &ghe.url())
        ),
    );
    (gh, ghe, home)
}

/// Issue 37, finding 9: `gh` reads github.com (the first stand-in) and `corp` another host
/// (the second stand-in, which would accept the same token). `sources poll` and a machine
/// that polls and delivers send the token to github.com only: the second stand-in sees no
/// request at all, and the source says it has no token for its host and how to give it one
/// (`sources poll` goes on to `gh` after `corp` fails, and exits non-zero). `login --from-gh` (which
/// would import github.com's token) is refused for that host.
async fn a_source_on_another_host_never_receives_the_github_com_token(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("hosts");
    let (gh, ghe, home) = two_hosts(&db, &orch, TOKEN);
    let env = [("GITHUB_TOKEN", TOKEN), ("DEVPILOT_GITHUB_API_URL", &gh.url())];
    let (code, out, err) = sources::cli(&home, &db, &env, &["sources", "poll", "--orchestrator", &orch]);
    assert_ne!(code, 0, "the corp source has no token here: {out}{err}");
    assert!(out.contains("added github:acme/webapp#1"), "github.com's source was polled after corp: {out}{err}");
    let var = format!("GITHUB_TOKEN_127_0_0_1_{}", ghe.addr().port());
    let hint = format!("--api-url {}", ghe.url());
    assert!(err.contains("corp: no GitHub token for") && err.contains(&var) && err.contains(&hint), "{err}");
    assert!(err.contains("1 of 2 sources could not be polled"), "{err}");
    let agent = RecordingAgent::new(db.dir.path(), "echo done");
    let m = machine(&home, &db, &orch, "desktop", &agent.script, &env);
    let delivered = || async {
        let Some(job) = jobs(&db, &orch).await.pop() else { return false };
        let rows = db.queue.outbox_of(job.id).await.unwrap();
        job.state == JobState::Completed && rows.iter().any(|r| r.event == "completed" && r.done_at.is_some())
    };
    assert!(devpilot_tests::wait_for(WAIT, delivered).await, "{}", std::fs::read_to_string(&m.log).unwrap());
    let log = || std::fs::read_to_string(&m.log).unwrap();
    let host = ghe.url().trim_start_matches("http://").to_string();
    let said = || async { log().contains(&format!("source corp: no GitHub token for {host}")) };
    assert!(devpilot_tests::wait_for(WAIT, said).await, "the source says why: {}", log());
    assert_eq!(jobs(&db, &orch).await.len(), 1, "only github.com's issue became a job");
    assert!(gh.comments("acme/webapp", 1).len() >= 2, "github.com's issue was reported on");
    assert!(ghe.recorded().is_empty(), "the other host saw no request: {:?}", ghe.recorded());
    assert!(gh.rejected().is_empty(), "github.com's stand-in refused nothing: {:?}", gh.rejected());
    // `devpilot sources` says which host has no token, and how to give it one: not that
    // github.com's token is there.
    let (code, out, err) = sources::cli(&home, &db, &env, &["sources", "--orchestrator", &orch]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("GitHub token on this machine: from GITHUB_TOKEN"), "{out}");
    assert!(out.contains(&format!("GitHub token for {host} on this machine: none (")) && out.contains(&var), "{out}");
    // `gh auth token` gives github.com's token: it is not imported as another host's.
    let login = ["login", "--github", "--from-gh", "--api-url", &ghe.url()];
    let (code, out, err) = sources::cli(&home, &db, &[], &login);
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("never sent to another host"), "{out}{err}");
}

/// Issue 37, finding 9: with a token of its own host (`GITHUB_TOKEN_<HOST>`), the source on
/// the other host works, and every request it sends there carries that token, never
/// github.com's: the second stand-in knows only its own token, refuses any other (401) and
/// keeps the refusal, and it refused nothing.
async fn a_source_on_another_host_uses_that_hosts_own_token(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("hosts-own");
    let (gh, ghe, home) = two_hosts(&db, &orch, GHE_TOKEN);
    let var = format!("GITHUB_TOKEN_127_0_0_1_{}", ghe.addr().port());
    let env = [("GITHUB_TOKEN", TOKEN), ("DEVPILOT_GITHUB_API_URL", &gh.url()), (&var, GHE_TOKEN)];
    let (code, out, err) = sources::cli(&home, &db, &env, &["sources", "poll", "--orchestrator", &orch]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("added github:acme/webapp#1"), "{out}{err}");
    assert!(out.contains("added github:corp/tools#1"), "the other host was polled with its token: {out}{err}");
    let agent = RecordingAgent::new(db.dir.path(), "echo done");
    let m = machine(&home, &db, &orch, "desktop", &agent.script, &env);
    let delivered = || async {
        let all = jobs(&db, &orch).await;
        let mut done = all.len() == 2;
        for job in &all {
            let rows = db.queue.outbox_of(job.id).await.unwrap();
            done &=
                job.state == JobState::Completed && rows.iter().any(|r| r.event == "completed" && r.done_at.is_some());
        }
        done
    };
    assert!(devpilot_tests::wait_for(WAIT, delivered).await, "{}", std::fs::read_to_string(&m.log).unwrap());
    assert!(!ghe.comments("corp/tools", 1).is_empty(), "the other host's issue was reported on");
    assert!(!ghe.recorded().is_empty(), "the other host was asked");
    assert!(ghe.rejected().is_empty(), "the other host was never sent another token: {:?}", ghe.rejected());
    assert!(ghe.recorded().iter().all(|r| r.auth_ok), "{:?}", ghe.recorded());
    assert!(gh.rejected().is_empty(), "{:?}", gh.rejected());
    let (code, out, err) = sources::cli(&home, &db, &env, &["sources", "--orchestrator", &orch]);
    assert_eq!(code, 0, "{out}{err}");
    let host = ghe.url().trim_start_matches("http://").to_string();
    assert!(out.contains(&format!("GitHub token for {host} on this machine: from GITHUB_TOKEN_<HOST>")), "{out}");
}
