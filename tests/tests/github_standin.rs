//! The GitHub stand-in enforces GitHub's contract: the vendored OpenAPI description on every
//! request, GitHub's headers, tokens, rate limit, ETags, pagination, filters, 422 shapes and
//! injected faults, so the engine's GitHub source can be tested against it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use devpilot_tests::github::{Access, Fault, FaultKind, IssueSeed};
use devpilot_tests::GitHubStandIn;
use serde_json::{json, Value};

#[path = "github_standin/reviews.rs"]
mod reviews;

/// The main token.
const TOKEN: &str = "ghp_standin_0123456789abcdef";
/// The repository most tests use.
const REPO: &str = "acme/webapp";

/// One HTTP answer.
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answer {
    /// A header's text.
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).unwrap_or_else(|| panic!("no {name} header")).to_str().unwrap()
    }

    /// A header as a number.
    fn number(&self, name: &str) -> i64 {
        self.header(name).parse().unwrap()
    }

    /// The error message.
    fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or_else(|| panic!("no message in {}", self.body))
    }

    /// The `Link` target for `rel`, if any.
    fn link(&self, rel: &str) -> Option<String> {
        let link = self.headers.get("link")?.to_str().unwrap().to_string();
        link.split(", ").find(|l| l.ends_with(&format!("rel=\"{rel}\""))).map(|l| {
            let start = l.find('<').unwrap() + 1;
            l[start..l.find('>').unwrap()].to_string()
        })
    }
}

/// A plain HTTP client for one stand-in, sending GitHub's required headers.
struct Client {
    http: reqwest::blocking::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    /// A client with the main token and a 10 s timeout.
    fn new(standin: &GitHubStandIn) -> Self {
        Self::with(standin, Some(TOKEN), Duration::from_secs(10))
    }

    /// A client with this token (none: no `Authorization`) and timeout.
    fn with(standin: &GitHubStandIn, token: Option<&str>, timeout: Duration) -> Self {
        devpilot_engine::sources::linear::install_crypto_provider();
        let http = reqwest::blocking::Client::builder().timeout(timeout).build().unwrap();
        Self { http, base: standin.url(), token: token.map(str::to_string) }
    }

    /// Sends a request with extra headers (which replace the defaults of the same name).
    fn try_send(
        &self,
        method: &str,
        target: &str,
        body: Option<Value>,
        extra: &[(&str, &str)],
    ) -> reqwest::Result<Answer> {
        let url = if target.starts_with("http") { target.to_string() } else { format!("{}{target}", self.base) };
        let mut request = self.http.request(method.parse().unwrap(), url);
        let mut headers = vec![("User-Agent", "devpilot-test"), ("X-GitHub-Api-Version", "2022-11-28")];
        headers.retain(|(n, _)| !extra.iter().any(|(e, _)| e.eq_ignore_ascii_case(n)));
        let bearer = self.token.as_ref().map(|t| format!("Bearer {t}"));
        for (name, value) in headers.iter().chain(extra) {
            if !value.is_empty() {
                request = request.header(*name, *value);
            }
        }
        if let (Some(bearer), false) = (&bearer, extra.iter().any(|(n, _)| n.eq_ignore_ascii_case("authorization"))) {
            request = request.header("Authorization", bearer);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send()?;
        let (status, headers) = (response.status().as_u16(), response.headers().clone());
        let text = response.text()?;
        let body = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap() };
        Ok(Answer { status, headers, body })
    }

    /// Sends a request with extra headers.
    fn send(&self, method: &str, target: &str, body: Option<Value>, extra: &[(&str, &str)]) -> Answer {
        self.try_send(method, target, body, extra).unwrap()
    }

    /// GET.
    fn get(&self, target: &str) -> Answer {
        self.send("GET", target, None, &[])
    }

    /// POST a JSON body.
    fn post(&self, target: &str, body: Value) -> Answer {
        self.send("POST", target, Some(body), &[])
    }
}

/// A stand-in with [`REPO`].
fn standin() -> GitHubStandIn {
    let standin = GitHubStandIn::start(TOKEN);
    standin.add_repo(REPO);
    standin
}

/// The numbers of a list answer's items.
fn numbers(answer: &Answer) -> Vec<u64> {
    answer.body.as_array().unwrap().iter().map(|i| i["number"].as_u64().unwrap()).collect()
}

/// `GET /user` and `GET /repos/{o}/{r}` answer GitHub's shapes; an unknown repository is 404.
#[test]
fn user_and_repository_are_answered() {
    let standin = standin();
    let client = Client::new(&standin);
    let user = client.get("/user");
    assert_eq!(
        (user.status, &user.body["login"], &user.body["id"], &user.body["name"]),
        (200, &json!("ada"), &json!(1), &json!("Ada"))
    );
    let repo = client.get("/repos/acme/webapp");
    assert_eq!(repo.status, 200);
    assert_eq!(repo.body["full_name"], "acme/webapp");
    assert_eq!(repo.body["html_url"], "https://github.com/acme/webapp");
    assert_eq!(repo.body["default_branch"], "main");
    assert_eq!(repo.body["private"], false);
    assert_eq!(repo.body["permissions"]["push"], true);
    let missing = client.get("/repos/acme/nothing");
    assert_eq!((missing.status, missing.message()), (404, "Not Found"));
    assert_eq!(missing.body["documentation_url"], "https://docs.github.com/rest");
    assert!(standin.rejected().is_empty(), "{:?}", standin.rejected());
}

/// Every answer carries the `x-ratelimit-*` headers and each request uses one; an exhausted
/// budget is 403 with remaining 0.
#[test]
fn rate_limit_headers_count_down_and_exhaust() {
    let standin = standin();
    let client = Client::new(&standin);
    let first = client.get("/user");
    let second = client.get("/user");
    assert_eq!(first.number("x-ratelimit-limit"), 5000);
    assert_eq!(first.number("x-ratelimit-remaining"), 4999);
    assert_eq!(second.number("x-ratelimit-remaining"), 4998);
    assert_eq!(second.number("x-ratelimit-used"), 2);
    assert_eq!(second.header("x-ratelimit-resource"), "core");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((now..=now + 3600).contains(&second.number("x-ratelimit-reset")));
    standin.set_rate(0, now + 600);
    let refused = client.get("/repos/acme/webapp");
    assert_eq!((refused.status, refused.message()), (403, "API rate limit exceeded for user ID 1."));
    assert_eq!(refused.number("x-ratelimit-remaining"), 0);
    assert_eq!(refused.number("x-ratelimit-reset"), now + 600);
    standin.set_rate(1, now + 600);
    assert_eq!(client.get("/user").status, 200);
}

/// A 200 GET carries a weak ETag; sending it back gets a bodiless 304 that does not count
/// against the rate limit, until the data changes.
#[test]
fn etag_gives_a_304_that_does_not_count() {
    let standin = standin();
    let n = standin.open_issue(REPO, IssueSeed::new("Task", &["agent"]));
    let client = Client::new(&standin);
    let first = client.get("/repos/acme/webapp/issues?labels=agent");
    let etag = first.header("etag").to_string();
    assert!(etag.starts_with("W/\"") && etag.ends_with('"'), "{etag}");
    let remaining = first.number("x-ratelimit-remaining");
    let again = client.send("GET", "/repos/acme/webapp/issues?labels=agent", None, &[("If-None-Match", &etag)]);
    assert_eq!(again.status, 304);
    assert_eq!(again.body, Value::Null);
    assert_eq!(again.number("x-ratelimit-remaining"), remaining, "an authorised 304 does not count");
    let recorded = standin.recorded();
    let last = recorded.last().unwrap();
    assert!(last.conditional && !last.counted && last.status == 304 && last.auth_ok);
    standin.set_labels(REPO, n, &["agent", "urgent"]);
    let changed = client.send("GET", "/repos/acme/webapp/issues?labels=agent", None, &[("If-None-Match", &etag)]);
    assert_eq!(changed.status, 200);
    assert_ne!(changed.header("etag"), etag);
    assert_eq!(changed.number("x-ratelimit-remaining"), remaining - 1);
}

/// 250 issues at per_page=100 come in pages of 100, 100 and 50, linked by `Link` next/last.
#[test]
fn pagination_follows_link_over_250_issues() {
    let standin = standin();
    for i in 0..250 {
        standin.open_issue(REPO, IssueSeed::new(&format!("Task {i}"), &["agent"]));
    }
    let client = Client::new(&standin);
    let mut target = "/repos/acme/webapp/issues?labels=agent&per_page=100".to_string();
    let (mut seen, mut sizes) = (Vec::new(), Vec::new());
    loop {
        let page = client.get(&target);
        assert_eq!(page.status, 200);
        sizes.push(page.body.as_array().unwrap().len());
        seen.extend(numbers(&page));
        if sizes.len() == 1 {
            let last = page.link("last").unwrap();
            assert!(last.starts_with(&format!("{}/repos/acme/webapp/issues?", standin.url())), "{last}");
            assert!(last.contains("per_page=100") && last.contains("labels=agent") && last.ends_with("page=3"));
        }
        match page.link("next") {
            Some(next) => target = next,
            None => break,
        }
    }
    assert_eq!(sizes, [100, 100, 50]);
    assert_eq!(seen, (1..=250).rev().collect::<Vec<u64>>(), "created, newest first, each once");
    assert!(standin.rejected().is_empty());
}

/// Pull requests appear in the issue list with a `pull_request` key; issues have none.
#[test]
fn pull_requests_appear_in_the_issue_list() {
    let standin = standin();
    let issue = standin.open_issue(REPO, IssueSeed::new("Task", &[]));
    let client = Client::new(&standin);
    let created =
        client.post("/repos/acme/webapp/pulls", json!({ "title": "Fix", "head": "agent/fix", "base": "main" }));
    assert_eq!(created.status, 201, "{}", created.body);
    let list = client.get("/repos/acme/webapp/issues?state=all&sort=created&direction=asc");
    let items = list.body.as_array().unwrap();
    assert_eq!(numbers(&list), [issue, 2]);
    assert!(items[0].get("pull_request").is_none());
    assert_eq!(items[1]["pull_request"]["html_url"], "https://github.com/acme/webapp/pull/2");
    assert_eq!(items[1]["html_url"], "https://github.com/acme/webapp/pull/2");
    assert_eq!(items[0]["html_url"], "https://github.com/acme/webapp/issues/1");
}

/// `labels` needs every named label (case-insensitive), including one with a space and an emoji,
/// percent-encoded; such a label is removed by its encoded name.
#[test]
fn labels_filter_and_remove_with_space_and_emoji() {
    let standin = standin();
    let both = standin.open_issue(REPO, IssueSeed::new("Both", &["agent 🤖", "Ready"]));
    standin.open_issue(REPO, IssueSeed::new("One", &["agent 🤖"]));
    standin.open_issue(REPO, IssueSeed::new("Other", &["ready"]));
    let client = Client::new(&standin);
    let list = client.get("/repos/acme/webapp/issues?labels=AGENT%20%F0%9F%A4%96,ready");
    assert_eq!(numbers(&list), [both]);
    assert_eq!(list.body[0]["labels"][0]["name"], "agent 🤖");
    let label = client.get("/repos/acme/webapp/labels/agent%20%F0%9F%A4%96");
    assert_eq!((label.status, &label.body["name"]), (200, &json!("agent 🤖")));
    assert_eq!(client.get("/repos/acme/webapp/labels/nope").status, 404);
    let removed = client.send("DELETE", "/repos/acme/webapp/issues/1/labels/agent%20%F0%9F%A4%96", None, &[]);
    assert_eq!(removed.status, 200, "{}", removed.body);
    assert_eq!(removed.body, json!([removed.body[0].clone()]));
    assert_eq!(standin.labels_of(REPO, both), ["Ready"]);
    let again = client.send("DELETE", "/repos/acme/webapp/issues/1/labels/agent%20%F0%9F%A4%96", None, &[]);
    assert_eq!(again.status, 404);
    let added = client.post("/repos/acme/webapp/issues/1/labels", json!({ "labels": ["agent 🤖", "new one"] }));
    assert_eq!(added.status, 200);
    assert_eq!(standin.labels_of(REPO, both), ["Ready", "agent 🤖", "new one"]);
    assert!(standin.rejected().is_empty(), "{:?}", standin.rejected());
}

/// `since` returns what changed at or after it (whole seconds; every change gets its own
/// second), and a new comment or a label change bumps an issue's `updated_at`.
#[test]
fn since_returns_what_changed_at_or_after_it() {
    let standin = standin();
    let (a, b, c) = (
        standin.open_issue(REPO, IssueSeed::new("A", &[])),
        standin.open_issue(REPO, IssueSeed::new("B", &[])),
        standin.open_issue(REPO, IssueSeed::new("C", &[])),
    );
    let since = standin.issue(REPO, b).updated_at;
    assert!(since.ends_with('Z') && since.len() == 20, "{since}");
    let client = Client::new(&standin);
    let target = format!("/repos/acme/webapp/issues?since={since}&sort=updated&direction=asc");
    assert_eq!(numbers(&client.get(&target)), [b, c]);
    let comment = client.post("/repos/acme/webapp/issues/1/comments", json!({ "body": "hello" }));
    assert_eq!(comment.status, 201);
    assert_eq!(numbers(&client.get(&target)), [b, c, a]);
    let bumped = standin.issue(REPO, a);
    assert!(bumped.updated_at > standin.issue(REPO, c).updated_at);
    standin.set_labels(REPO, b, &["later"]);
    assert_eq!(numbers(&client.get(&target)), [c, a, b]);
    standin.close_issue(REPO, c);
    assert_eq!(numbers(&client.get(&format!("{target}&state=closed"))), [c]);
}

/// A request the description does not allow is 400 and recorded as rejected, naming why.
#[test]
fn a_contract_violation_is_400_and_rejected() {
    let standin = standin();
    let client = Client::new(&standin);
    let too_many = client.get("/repos/acme/webapp/issues?per_page=101");
    assert_eq!(too_many.status, 400);
    assert!(too_many.message().contains("per_page"), "{}", too_many.message());
    let unknown = client.get("/repos/acme/webapp/issues?label=agent");
    assert_eq!(unknown.status, 400);
    let extra = client.post("/repos/acme/webapp/pulls", json!({ "title": "t", "head": "h", "base": "main", "x": 1 }));
    assert_eq!(extra.status, 400);
    let rejected = standin.rejected();
    assert_eq!(rejected.len(), 3);
    assert_eq!(rejected[0].op, "");
    assert!(rejected[2].message.as_deref().unwrap().contains("`x`"));
    assert!(standin.pulls(REPO).is_empty(), "nothing rejected is applied");
}

/// No Bearer token (or an unknown one) is 401 Bad credentials; no User-Agent is 403; another
/// API version is 400; the token never appears in the record.
#[test]
fn auth_and_required_headers_are_enforced() {
    let standin = standin();
    let anonymous = Client::with(&standin, None, Duration::from_secs(10));
    let refused = anonymous.get("/user");
    assert_eq!(refused.status, 401);
    assert_eq!(
        refused.body,
        json!({ "message": "Bad credentials", "documentation_url": "https://docs.github.com/rest" })
    );
    let client = Client::new(&standin);
    let token_scheme = client.send("GET", "/user", None, &[("Authorization", &format!("token {TOKEN}"))]);
    assert_eq!(token_scheme.status, 401, "the stand-in takes only Bearer, which the engine sends");
    assert_eq!(Client::with(&standin, Some("ghp_wrong"), Duration::from_secs(10)).get("/user").status, 401);
    assert_eq!(client.send("GET", "/user", None, &[("User-Agent", "")]).status, 403);
    assert_eq!(client.send("GET", "/user", None, &[("X-GitHub-Api-Version", "2021-01-01")]).status, 400);
    assert_eq!(client.send("GET", "/user", None, &[("X-GitHub-Api-Version", "")]).status, 400);
    assert_eq!(standin.rejected().len(), 3, "missing headers are the client's mistakes");
    let log = format!("{:?}", standin.recorded());
    assert!(!log.contains(TOKEN), "no token in the record");
    assert_eq!(standin.recorded().iter().filter(|r| r.auth_ok).count(), 0);
}

/// A token that sees no repository gets 404s; a read-only one reads but gets 403 with the
/// permission it lacks on writes.
#[test]
fn limited_tokens_get_404_and_403() {
    let standin = standin();
    let n = standin.open_issue(REPO, IssueSeed::new("Task", &[]));
    standin.add_token("ghp_norepo", Access::NoRepo);
    standin.add_token("ghp_readonly", Access::ReadOnly);
    let blind = Client::with(&standin, Some("ghp_norepo"), Duration::from_secs(10));
    assert_eq!(blind.get("/repos/acme/webapp").status, 404);
    assert_eq!(blind.get("/repos/acme/webapp/issues").status, 404);
    assert_eq!(blind.get("/user").status, 200);
    let reader = Client::with(&standin, Some("ghp_readonly"), Duration::from_secs(10));
    assert_eq!(reader.get("/repos/acme/webapp/issues").status, 200);
    assert_eq!(reader.get("/repos/acme/webapp").body["permissions"]["push"], false);
    let comment = reader.post("/repos/acme/webapp/issues/1/comments", json!({ "body": "hi" }));
    assert_eq!((comment.status, comment.message()), (403, "Resource not accessible by personal access token"));
    assert_eq!(comment.header("x-accepted-github-permissions"), "issues=write");
    let pull = reader.post("/repos/acme/webapp/pulls", json!({ "title": "t", "head": "h", "base": "main" }));
    assert_eq!((pull.status, pull.header("x-accepted-github-permissions")), (403, "pull_requests=write"));
    assert!(standin.comments(REPO, n).is_empty() && standin.pulls(REPO).is_empty());
}

/// Comments: 65,536 characters are taken (201, GitHub's URL), 65,537 are 422 with GitHub's
/// error; the list pages.
#[test]
fn comments_are_created_listed_and_limited() {
    let standin = standin();
    let n = standin.open_issue(REPO, IssueSeed::new("Task", &[]));
    let client = Client::new(&standin);
    let ok = client.post("/repos/acme/webapp/issues/1/comments", json!({ "body": "é".repeat(65_536) }));
    assert_eq!(ok.status, 201);
    let id = ok.body["id"].as_u64().unwrap();
    assert_eq!(ok.body["html_url"], format!("https://github.com/acme/webapp/issues/1#issuecomment-{id}"));
    assert_eq!(ok.body["user"]["login"], "ada");
    let long = client.post("/repos/acme/webapp/issues/1/comments", json!({ "body": "x".repeat(65_537) }));
    assert_eq!(long.status, 422);
    assert_eq!(
        long.body["errors"],
        json!([{ "resource": "IssueComment", "code": "custom", "field": "body", "message": "body is too long (maximum is 65536 characters)" }])
    );
    assert_eq!(long.message(), "Validation Failed");
    client.post("/repos/acme/webapp/issues/1/comments", json!({ "body": "second" }));
    let page = client.get("/repos/acme/webapp/issues/1/comments?per_page=1&page=2");
    assert_eq!(page.body[0]["body"], "second");
    assert!(page.link("prev").is_some() && page.link("next").is_none());
    assert_eq!(standin.comments(REPO, n).len(), 2);
    assert_eq!(client.get("/repos/acme/webapp/issues/99/comments").status, 404);
}

/// pulls/create: 201 with GitHub's fields; the same head again is 422 "already exists"; a
/// missing base or head is 422 invalid; pulls/list filters by head and base.
#[test]
fn pulls_are_created_once_per_head() {
    let standin = standin();
    let client = Client::new(&standin);
    let body = json!({ "title": "Fix", "head": "acme:agent/fix", "base": "main", "body": "Closes #1", "draft": true });
    let created = client.post("/repos/acme/webapp/pulls", body.clone());
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["html_url"], "https://github.com/acme/webapp/pull/1");
    assert_eq!(
        (&created.body["head"]["ref"], &created.body["head"]["label"]),
        (&json!("agent/fix"), &json!("acme:agent/fix"))
    );
    assert_eq!(
        (&created.body["base"]["ref"], &created.body["draft"], &created.body["state"]),
        (&json!("main"), &json!(true), &json!("open"))
    );
    let twice = client.post("/repos/acme/webapp/pulls", body);
    assert_eq!(twice.status, 422);
    assert_eq!(twice.body["errors"][0]["message"], "A pull request already exists for acme:agent/fix.");
    standin.delete_branch(REPO, "release");
    let no_base = client.post("/repos/acme/webapp/pulls", json!({ "title": "t", "head": "other", "base": "release" }));
    assert_eq!((no_base.status, &no_base.body["errors"][0]["field"]), (422, &json!("base")));
    assert_eq!(no_base.body["errors"][0]["code"], "invalid");
    let no_head = client.post("/repos/acme/webapp/pulls", json!({ "title": "t", "head": "release", "base": "main" }));
    assert_eq!((no_head.status, &no_head.body["errors"][0]["field"]), (422, &json!("head")));
    assert_eq!(numbers(&client.get("/repos/acme/webapp/pulls?head=acme:agent/fix&base=main")), [1]);
    assert!(numbers(&client.get("/repos/acme/webapp/pulls?head=acme:other")).is_empty());
    assert_eq!(standin.pulls(REPO).len(), 1);
}

/// With a real bare git repository, head and base must be branches in it.
#[test]
fn pulls_check_branches_in_a_real_git_repository() {
    let dir = tempfile::tempdir().unwrap();
    let git = |args: &[&str], cwd: &Path| {
        let ok = Command::new("git").args(args).current_dir(cwd).stdout(Stdio::null()).status().unwrap().success();
        assert!(ok, "git {args:?}");
    };
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    git(&["init", "-q", "-b", "main"], &work);
    git(&["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "init"], &work);
    git(&["branch", "agent/eng-1"], &work);
    git(&["clone", "-q", "--bare", "work", "bare.git"], dir.path());
    let standin = GitHubStandIn::start(TOKEN);
    standin.add_repo_with_git(REPO, &dir.path().join("bare.git"));
    let client = Client::new(&standin);
    let missing =
        client.post("/repos/acme/webapp/pulls", json!({ "title": "t", "head": "agent/eng-2", "base": "main" }));
    assert_eq!((missing.status, &missing.body["errors"][0]["field"]), (422, &json!("head")));
    let created =
        client.post("/repos/acme/webapp/pulls", json!({ "title": "t", "head": "agent/eng-1", "base": "main" }));
    assert_eq!(created.status, 201, "{}", created.body);
}

/// A Timeout fault applies the create, then holds the answer: the client times out although
/// the pull request exists.
#[test]
fn a_timeout_fault_applies_then_withholds_the_answer() {
    let standin = standin();
    standin.inject(Fault { op: "pulls/create", kind: FaultKind::Timeout { hold: Duration::from_secs(3) }, times: 1 });
    let client = Client::with(&standin, Some(TOKEN), Duration::from_millis(800));
    let started = Instant::now();
    let lost = client.try_send(
        "POST",
        "/repos/acme/webapp/pulls",
        Some(json!({ "title": "t", "head": "h", "base": "main" })),
        &[],
    );
    assert!(lost.is_err_and(|e| e.is_timeout()), "the client times out");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(standin.pulls(REPO).len(), 1, "the stand-in applied it");
    let recorded = standin.recorded();
    assert_eq!((recorded[0].status, recorded[0].op.as_str()), (0, "pulls/create"));
    let retry =
        Client::new(&standin).post("/repos/acme/webapp/pulls", json!({ "title": "t", "head": "h", "base": "main" }));
    assert_eq!(retry.status, 422, "the retry finds it already exists");
}

/// SecondaryLimit is 403 with `retry-after` and GitHub's message; Server and Unauthorized
/// answer their status; none applies anything, and the fault runs out.
#[test]
fn secondary_limit_server_and_unauthorized_faults() {
    let standin = standin();
    standin.open_issue(REPO, IssueSeed::new("Task", &[]));
    standin.inject(Fault {
        op: "issues/create-comment",
        kind: FaultKind::SecondaryLimit { retry_after_s: 60 },
        times: 1,
    });
    standin.inject(Fault { op: "issues/create-comment", kind: FaultKind::Server(502), times: 1 });
    standin.inject(Fault { op: "issues/create-comment", kind: FaultKind::Unauthorized, times: 1 });
    let client = Client::new(&standin);
    let post = || client.post("/repos/acme/webapp/issues/1/comments", json!({ "body": "hi" }));
    let limited = post();
    assert_eq!(limited.status, 403);
    assert_eq!(limited.header("retry-after"), "60");
    assert_eq!(
        limited.message(),
        "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."
    );
    assert_eq!(post().status, 502);
    assert_eq!(post().message(), "Bad credentials");
    assert!(standin.comments(REPO, 1).is_empty());
    assert_eq!(post().status, 201);
    assert_eq!(standin.count("issues/create-comment"), 4);
}

/// The `github-standin` binary prints one line and serves the API and `/_admin/`.
#[test]
fn the_binary_serves_the_api_and_admin() {
    let bin = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("github-standin");
    assert!(bin.exists(), "{} is missing: cargo build -p devpilot-tests --bins", bin.display());
    let mut child = Command::new(&bin)
        .env("GITHUB_STANDIN_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let base = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("{line}")).to_string();
    let http = reqwest::blocking::Client::new();
    let admin = |method: &str, path: &str, body: Option<Value>| -> Value {
        let mut request = http.request(method.parse().unwrap(), format!("{base}/_admin/{path}"));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().unwrap();
        assert_eq!(response.status().as_u16(), 200);
        response.json().unwrap()
    };
    admin("POST", "repos", Some(json!({ "repo": REPO })));
    let issue = admin("POST", "issues", Some(json!({ "repo": REPO, "title": "T", "body": "B", "labels": ["agent"] })));
    assert_eq!(issue["number"], 1);
    let response = http
        .get(format!("{base}/repos/acme/webapp/issues?labels=agent"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .header("User-Agent", "t")
        .header("X-GitHub-Api-Version", "2022-11-28")
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    admin("POST", "close", Some(json!({ "repo": REPO, "number": 1 })));
    assert_eq!(admin("GET", "comments?repo=acme/webapp&number=1", None), json!([]));
    assert_eq!(admin("GET", "pulls?repo=acme/webapp", None), json!([]));
    assert_eq!(admin("GET", "recorded", None)[0]["op"], "issues/list-for-repo");
    let _ = child.kill();
    let _ = child.wait();
}
