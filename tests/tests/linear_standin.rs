//! The Linear stand-in enforces Linear's contract: the published schema on every document and
//! variable, Linear's authentication, filters, pagination, comment ids, rate limits and error
//! shapes, and injected faults. The engine's own documents are answered without a single
//! rejection.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use devpilot_engine::sources::linear::documents;
use devpilot_tests::linear::{Fault, IssueSeed};
use devpilot_tests::LinearStandIn;
use serde_json::{json, Value};

/// The key the stand-ins accept.
const KEY: &str = "lin_api_standin_0123456789";

/// ISSUES with a variable page size, to page one node at a time.
const ISSUES_PAGED: &str = "query PagedIssues($filter: IssueFilter, $first: Int, $after: String) {
  issues(filter: $filter, first: $first, after: $after, orderBy: updatedAt) {
    nodes { id identifier updatedAt }
    pageInfo { hasNextPage endCursor }
  }
}";

/// An issue's comments after a time, one a page.
const COMMENTS_PAGED: &str = "query PagedComments($id: String!, $since: DateTimeOrDuration, $after: String) {
  issue(id: $id) {
    comments(filter: { createdAt: { gt: $since } }, first: 1, after: $after) {
      nodes { id body user { name guest isMe } }
      pageInfo { hasNextPage endCursor }
    }
  }
}";

/// One HTTP answer.
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answer {
    /// A header as a number.
    fn number(&self, name: &str) -> i64 {
        self.headers.get(name).unwrap_or_else(|| panic!("no {name} header")).to_str().unwrap().parse().unwrap()
    }

    /// The first error's `extensions.code`.
    fn code(&self) -> &str {
        self.body["errors"][0]["extensions"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("no error code in {}", self.body))
    }

    /// The first error's message.
    fn message(&self) -> &str {
        self.body["errors"][0]["message"].as_str().unwrap_or_else(|| panic!("no error in {}", self.body))
    }
}

/// A plain HTTP client for one stand-in.
struct Client {
    http: reqwest::blocking::Client,
    url: String,
}

impl Client {
    /// A client with a 10 s timeout.
    fn new(standin: &LinearStandIn) -> Self {
        Self { http: http_client(), url: standin.url() }
    }

    /// POSTs a document with this `Authorization` header (none when `None`).
    fn try_send(&self, auth: Option<&str>, document: &str, variables: Value) -> reqwest::Result<Answer> {
        let mut request = self.http.post(&self.url).json(&json!({ "query": document, "variables": variables }));
        if let Some(auth) = auth {
            request = request.header("Authorization", auth);
        }
        let response = request.send()?;
        let (status, headers) = (response.status().as_u16(), response.headers().clone());
        Ok(Answer { status, headers, body: response.json()? })
    }

    /// POSTs a document with the right key.
    fn send(&self, document: &str, variables: Value) -> Answer {
        self.try_send(Some(KEY), document, variables).unwrap()
    }

    /// POSTs a document with the right key; its `data`, asserting HTTP 200 and no errors.
    fn data(&self, document: &str, variables: Value) -> Value {
        let answer = self.send(document, variables);
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(answer.body.get("errors").is_none(), "errors: {}", answer.body);
        answer.body["data"].clone()
    }
}

/// A blocking reqwest client with a 10 s timeout. The workspace builds reqwest without a TLS
/// crypto provider (the engine installs ring), so this installs it too.
fn http_client() -> reqwest::blocking::Client {
    devpilot_engine::sources::linear::install_crypto_provider();
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build().unwrap()
}

/// The identifiers of an `issues` connection's nodes.
fn identifiers(issues: &Value) -> Vec<String> {
    issues["nodes"].as_array().unwrap().iter().map(|n| n["identifier"].as_str().unwrap().to_string()).collect()
}

/// The ENG/agent/(unstarted or backlog) filter the engine's poll uses.
fn intake_filter() -> Value {
    json!({
        "team": { "key": { "in": ["ENG"] } },
        "labels": { "some": { "name": { "eqIgnoreCase": "AGENT" } } },
        "state": { "type": { "in": ["unstarted", "backlog"] } },
    })
}

/// A valid VIEWER query with the right key is answered with the viewer.
#[test]
fn viewer_query_with_the_right_key_is_answered() {
    let standin = LinearStandIn::start(KEY);
    let data = Client::new(&standin).data(documents::VIEWER, json!({}));
    assert_eq!(data["viewer"]["name"], "Ada");
    assert!(uuid_like(data["viewer"]["id"].as_str().unwrap()));
    assert_eq!(standin.calls("DevpilotViewer"), 1);
    assert!(standin.rejected().is_empty());
}

/// Whether a string looks like Linear's UUID ids.
fn uuid_like(id: &str) -> bool {
    id.len() == 36 && id.chars().filter(|c| *c == '-').count() == 4
}

/// A document with a field Linear's schema lacks is refused (400, GRAPHQL_VALIDATION_FAILED)
/// and recorded as rejected.
#[test]
fn a_field_the_schema_lacks_is_refused_and_recorded_as_rejected() {
    let standin = LinearStandIn::start(KEY);
    let answer = Client::new(&standin).send("query Bad { viewer { id nosuchfield } }", json!({}));
    assert_eq!(answer.status, 400);
    assert_eq!(answer.code(), "GRAPHQL_VALIDATION_FAILED");
    assert!(answer.message().contains("nosuchfield"), "{}", answer.body);
    let rejected = standin.rejected();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].operation.as_deref(), Some("Bad"));
    assert!(rejected[0].diagnostics[0].contains("nosuchfield"));
}

/// Variables the schema does not allow (a filter key `IssueFilter` lacks) are refused too.
#[test]
fn variables_the_schema_lacks_are_refused() {
    let standin = LinearStandIn::start(KEY);
    let filter = json!({ "lables": { "some": { "name": { "eq": "agent" } } } });
    let answer = Client::new(&standin).send(documents::ISSUES, json!({ "filter": filter }));
    assert_eq!(answer.status, 400);
    assert_eq!(answer.code(), "GRAPHQL_VALIDATION_FAILED");
    assert!(answer.message().contains("lables"), "{}", answer.body);
    assert_eq!(standin.rejected().len(), 1);
}

/// A wrong key, a `Bearer` key and no key are refused with Linear's AUTHENTICATION_ERROR.
#[test]
fn a_wrong_key_or_a_bearer_key_is_refused() {
    let standin = LinearStandIn::start(KEY);
    let client = Client::new(&standin);
    let bearer = format!("Bearer {KEY}");
    for auth in [Some("lin_api_wrong"), Some(bearer.as_str()), None] {
        let answer = client.try_send(auth, documents::VIEWER, json!({})).unwrap();
        assert_eq!(answer.status, 400, "{auth:?}");
        let expected = json!({ "errors": [{
            "message": "Authentication required, not authenticated",
            "extensions": {
                "code": "AUTHENTICATION_ERROR",
                "type": "authentication error",
                "userPresentableMessage": "You need to authenticate to access this operation.",
            },
        }] });
        assert_eq!(answer.body, expected);
    }
    let requests = standin.requests();
    assert_eq!(requests.len(), 3);
    assert!(requests.iter().all(|r| !r.key_matched && !r.rejected));
    // A rotated key: the old one is refused, the new one accepted.
    standin.set_key("lin_api_rotated");
    assert_eq!(client.send(documents::VIEWER, json!({})).code(), "AUTHENTICATION_ERROR");
    assert_eq!(client.try_send(Some("lin_api_rotated"), documents::VIEWER, json!({})).unwrap().status, 200);
}

/// ISSUES with a team + label + state-type filter returns only the matching issues, oldest
/// change first (its `sort`), and `orderBy: updatedAt` newest first, one page at a time
/// with `first: 1` and `after`.
#[test]
fn issues_filter_and_paginate() {
    let standin = LinearStandIn::start(KEY);
    standin.add_team("OPS", "Operations");
    let older = standin.add_issue(IssueSeed::new("Older agent task", &["agent"]));
    standin.add_issue(IssueSeed { state_name: "In Progress".into(), ..IssueSeed::new("Started", &["agent"]) });
    standin.add_issue(IssueSeed::new("No label", &[]));
    standin.add_issue(IssueSeed { team: "OPS".into(), ..IssueSeed::new("Other team", &["agent"]) });
    let newer = standin.add_issue(IssueSeed {
        state_name: "Backlog".into(),
        ..IssueSeed::new("Backlog agent task", &["Agent", "frontend"])
    });
    let client = Client::new(&standin);

    // The engine's ISSUES sorts by `updatedAt` ascending: oldest change first.
    let all = client.data(documents::ISSUES, json!({ "filter": intake_filter() }));
    assert_eq!(identifiers(&all["issues"]), [older.identifier.clone(), newer.identifier.clone()]);
    assert_eq!(all["issues"]["pageInfo"]["hasNextPage"], false);

    // A change moves an issue to the front of `orderBy: updatedAt`.
    standin.set_description(&older.identifier, Some("edited"));
    let mut seen = Vec::new();
    let mut after = Value::Null;
    loop {
        let page = client.data(ISSUES_PAGED, json!({ "filter": intake_filter(), "first": 1, "after": after }));
        let issues = &page["issues"];
        assert_eq!(issues["nodes"].as_array().unwrap().len(), 1);
        seen.extend(identifiers(issues));
        if issues["pageInfo"]["hasNextPage"] == false {
            break;
        }
        after = issues["pageInfo"]["endCursor"].clone();
    }
    assert_eq!(seen, [older.identifier, newer.identifier]);
    assert!(standin.rejected().is_empty());
}

/// An issue's comments written after a time, one page at a time, each with its writer: a
/// member's, a guest's and the viewer's (what the engine posts), and nothing from before.
#[test]
fn issue_comments_filter_by_time_and_page() {
    let standin = LinearStandIn::start(KEY);
    let issue = standin.add_issue(IssueSeed::new("Task", &["agent"]));
    let client = Client::new(&standin);
    client.data(documents::POST_COMMENT, json!({ "input": { "issueId": issue.id, "body": "before" } }));
    let since = standin.now();
    standin.advance_clock(Duration::from_millis(5));
    standin.add_user("Mallory", true);
    let ids = [
        standin.comment_as("ENG-1", "Grace", "one"),
        standin.comment_as("ENG-1", "Mallory", "two"),
        standin.comment_as(&issue.id, "Ada", "three"),
    ];
    let mut seen = Vec::new();
    let mut after = Value::Null;
    loop {
        let page = client.data(COMMENTS_PAGED, json!({ "id": issue.identifier, "since": since, "after": after }));
        let comments = &page["issue"]["comments"];
        for n in comments["nodes"].as_array().unwrap() {
            let who = &n["user"];
            seen.push((
                n["id"].as_str().unwrap().to_string(),
                who["name"].clone(),
                who["guest"].clone(),
                who["isMe"].clone(),
            ));
        }
        if comments["pageInfo"]["hasNextPage"] == false {
            break;
        }
        after = comments["pageInfo"]["endCursor"].clone();
    }
    let expected = [("Grace", false, false), ("Mallory", true, false), ("Ada", false, true)];
    assert_eq!(seen.len(), 3, "{seen:?}");
    for ((id, name, guest, me), (want, (n, g, m))) in seen.iter().zip(ids.iter().zip(expected)) {
        assert_eq!((id, name, guest, me), (want, &json!(n), &json!(g), &json!(m)));
    }
    let engine = client.data(documents::ISSUE_COMMENTS, json!({ "id": issue.id, "since": since }))["issue"].clone();
    assert_eq!(engine["team"]["key"], "ENG");
    let nodes = engine["comments"]["nodes"].as_array().unwrap().clone();
    assert_eq!(nodes.len(), 3);
    assert!(nodes
        .iter()
        .all(|n| n["botActor"].is_null() && n["externalUser"].is_null() && n["user"]["active"] == true));
    let authors: Vec<String> = standin.comments("ENG-1").into_iter().map(|c| c.user).collect();
    assert_eq!(authors, ["Ada", "Grace", "Mallory", "Ada"]);
    assert!(standin.rejected().is_empty());
}

/// A filter key the schema allows but the stand-in does not implement is a GraphQL error
/// (INVALID_INPUT, naming the key), never silently ignored.
#[test]
fn an_unimplemented_filter_key_is_an_error() {
    let standin = LinearStandIn::start(KEY);
    standin.add_issue(IssueSeed::new("Task", &["agent"]));
    let answer = Client::new(&standin).send(documents::ISSUES, json!({ "filter": { "priority": { "eq": 1 } } }));
    assert_eq!(answer.status, 200);
    assert_eq!(answer.code(), "INVALID_INPUT");
    assert!(
        answer.message().contains("priority") && answer.message().contains("not implemented"),
        "{}",
        answer.message()
    );
    assert!(answer.body["data"].is_null());
    assert!(standin.rejected().is_empty(), "allowed by the schema: an error, not a rejection");
}

/// POST_COMMENT with the same client-chosen id twice: the second is "Entity already exists"
/// and only one comment exists; FIND_COMMENT finds it, and an unknown id is not found.
#[test]
fn a_comment_id_is_used_once_and_can_be_found() {
    let standin = LinearStandIn::start(KEY);
    let issue = standin.add_issue(IssueSeed::new("Task", &["agent"]));
    let client = Client::new(&standin);
    let id = "6f1c2a4e-3b5d-4c7e-9f80-a1b2c3d4e5f6";
    let input = json!({ "input": { "id": id, "issueId": issue.id, "body": "Claimed by DevPilot" } });

    let first = client.data(documents::POST_COMMENT, input.clone());
    assert_eq!(first["commentCreate"], json!({ "success": true, "comment": { "id": id } }));
    let second = client.send(documents::POST_COMMENT, input);
    assert_eq!(second.message(), "Entity already exists");
    assert_eq!(second.code(), "INVALID_INPUT");
    assert_eq!(standin.comments(&issue.identifier).len(), 1);
    assert!(standin.issue(&issue.identifier).updated_at > issue.updated_at, "a comment bumps updatedAt");

    let found = client.data(documents::FIND_COMMENT, json!({ "id": id }));
    assert_eq!(found["comment"]["id"], id);
    let missing = client.send(documents::FIND_COMMENT, json!({ "id": "00000000-0000-4000-8000-000000000000" }));
    assert_eq!((missing.message(), missing.code()), ("Entity not found: Comment", "INVALID_INPUT"));
    assert!(missing.body["data"].is_null());
    assert!(standin.rejected().is_empty());
}

/// Every answer carries Linear's rate-limit headers, and the remaining budgets decrease.
#[test]
fn rate_limit_headers_are_present_and_decrease() {
    let standin = LinearStandIn::start(KEY);
    let client = Client::new(&standin);
    let first = client.send(documents::ISSUES, json!({ "filter": intake_filter() }));
    let second = client.send(documents::ISSUES, json!({ "filter": intake_filter() }));
    assert_eq!(first.number("X-RateLimit-Requests-Limit"), 1500);
    assert_eq!(first.number("X-RateLimit-Complexity-Limit"), 250_000);
    assert_eq!(second.number("X-RateLimit-Requests-Remaining"), first.number("X-RateLimit-Requests-Remaining") - 1);
    let cost = second.number("X-Complexity");
    assert!(cost > 50, "a page of 50 issues costs more than 50 points, got {cost}");
    assert_eq!(
        second.number("X-RateLimit-Complexity-Remaining"),
        first.number("X-RateLimit-Complexity-Remaining") - cost
    );
    let now_ms =
        i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap();
    assert!(first.number("X-RateLimit-Requests-Reset") > now_ms);
    assert!(first.number("X-RateLimit-Complexity-Reset") > now_ms);
}

/// An exhausted request budget gives RATELIMITED (HTTP 400, with the headers) until it resets.
#[test]
fn an_exhausted_budget_is_ratelimited_until_reset() {
    let standin = LinearStandIn::start(KEY);
    let client = Client::new(&standin);
    standin.set_rate_limit(1, Duration::from_secs(60));
    assert_eq!(client.send(documents::VIEWER, json!({})).status, 200);
    let limited = client.send(documents::VIEWER, json!({}));
    assert_eq!(limited.status, 400);
    assert_eq!(
        limited.body,
        json!({ "errors": [{ "message": "Rate limit exceeded", "extensions": { "code": "RATELIMITED" } }] })
    );
    assert_eq!(limited.number("X-RateLimit-Requests-Remaining"), 0);
    standin.advance_clock(Duration::from_secs(61));
    let again = client.send(documents::VIEWER, json!({}));
    assert_eq!(again.status, 200);
    assert_eq!(again.number("X-RateLimit-Requests-Remaining"), 1499);
    // The injected fault answers the same way without touching the budget.
    standin.inject(Fault::RateLimited, 1, None);
    assert_eq!(client.send(documents::VIEWER, json!({})).code(), "RATELIMITED");
}

/// An injected Timeout applies the mutation but gives no answer; the next request is answered.
#[test]
fn an_injected_timeout_applies_the_mutation_without_an_answer() {
    let standin = LinearStandIn::start(KEY);
    let issue = standin.add_issue(IssueSeed::new("Task", &["agent"]));
    let in_progress = standin.workflow_states("ENG").into_iter().find(|s| s.name == "In Progress").unwrap();
    standin.inject(Fault::Timeout(Duration::from_millis(800)), 1, Some("DevpilotMoveIssue"));
    let client = Client::new(&standin);
    // Another operation is not affected by a fault armed for DevpilotMoveIssue.
    client.data(documents::VIEWER, json!({}));

    let started = Instant::now();
    let lost = client.try_send(Some(KEY), documents::MOVE_ISSUE, json!({ "id": issue.id, "stateId": in_progress.id }));
    assert!(lost.is_err(), "no answer expected");
    assert!(started.elapsed() >= Duration::from_millis(700), "held before closing");
    assert_eq!(standin.issue(&issue.identifier).state_name, "In Progress", "applied all the same");
    let recorded =
        standin.requests().into_iter().find(|r| r.operation.as_deref() == Some("DevpilotMoveIssue")).unwrap();
    assert_eq!(recorded.status, None);

    let retry = client.data(documents::MOVE_ISSUE, json!({ "id": issue.identifier, "stateId": in_progress.id }));
    assert_eq!(retry["issueUpdate"]["success"], true);
}

/// An injected server error answers 5xx and applies nothing.
#[test]
fn an_injected_server_error_applies_nothing() {
    let standin = LinearStandIn::start(KEY);
    let issue = standin.add_issue(IssueSeed::new("Task", &["agent"]));
    standin.inject(Fault::ServerError(503), 1, None);
    let input = json!({ "input": { "issueId": issue.id, "body": "hello" } });
    let answer = Client::new(&standin).send(documents::POST_COMMENT, input);
    assert_eq!(answer.status, 503);
    assert!(standin.comments(&issue.identifier).is_empty());
}

/// A fault armed for an operation DevPilot never sends is refused (it would never fire, and
/// the test that armed it would pass without its fault); one armed for DevPilot's own fires.
#[test]
fn a_fault_for_an_operation_devpilot_never_sends_is_refused() {
    let standin = LinearStandIn::start(KEY);
    let issue = standin.add_issue(IssueSeed::new("Task", &["agent"]));
    let misspelt =
        std::panic::AssertUnwindSafe(|| standin.inject(Fault::ServerError(503), 1, Some("DevpilotPostComent")));
    let refused = std::panic::catch_unwind(misspelt).expect_err("an unknown operation is refused");
    let why = refused.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(why.contains("\"DevpilotPostComent\"") && why.contains("DevpilotPostComment"), "{why}");
    standin.inject(Fault::ServerError(503), 1, Some("DevpilotPostComment"));
    let input = json!({ "input": { "issueId": issue.id, "body": "hello" } });
    assert_eq!(Client::new(&standin).send(documents::POST_COMMENT, input).status, 503, "the known one fires");
}

/// Every document the engine sends is answered from the stand-in's state, with no errors and
/// no rejection; linking a URL twice keeps one attachment.
#[test]
fn every_engine_document_is_answered() {
    let standin = LinearStandIn::start(KEY);
    let issue = standin.add_issue(IssueSeed {
        description: Some("Do it".into()),
        priority: 2,
        project: Some("Agents".into()),
        assignee_me: true,
        ..IssueSeed::new("Fix the login bug", &["agent"])
    });
    let client = Client::new(&standin);
    let team = client.data(documents::TEAMS, json!({ "keys": ["ENG"] }))["teams"]["nodes"][0].clone();
    assert_eq!(team["key"], "ENG");
    assert_eq!(
        client.data(documents::LABELS, json!({ "name": "NEEDS:GPU" }))["issueLabels"]["nodes"][0]["name"],
        "needs:gpu"
    );
    let node = client.data(documents::ISSUES, json!({ "filter": intake_filter() }))["issues"]["nodes"][0].clone();
    assert_eq!(node["identifier"], "ENG-1");
    assert_eq!(node["url"], format!("https://linear.app/standin/issue/ENG-1/fix-the-login-bug"));
    assert_eq!(node["branchName"], "ada/eng-1-fix-the-login-bug");
    assert_eq!(
        (node["priority"].as_f64(), &node["project"]["name"], &node["assignee"]["isMe"]),
        (Some(2.0), &json!("Agents"), &json!(true))
    );
    let states = client.data(documents::STATES, json!({ "team": team["id"] }))["workflowStates"]["nodes"].clone();
    let started = states.as_array().unwrap().iter().find(|s| s["type"] == "started").unwrap();
    assert_eq!(started["name"], "In Progress");
    client.data(documents::MOVE_ISSUE, json!({ "id": issue.id, "stateId": started["id"] }));
    for _ in 0..2 {
        let link = json!({ "issueId": "ENG-1", "url": "https://github.com/o/r/pull/1", "title": "PR #1" });
        assert_eq!(client.data(documents::LINK_URL, link)["attachmentLinkURL"]["success"], true);
    }
    assert_eq!(standin.attachments("ENG-1"), [("https://github.com/o/r/pull/1".to_string(), "PR #1".to_string())]);
    let comment = client.data(documents::POST_COMMENT, json!({ "input": { "issueId": issue.id, "body": "hi" } }));
    client.data(documents::FIND_COMMENT, json!({ "id": comment["commentCreate"]["comment"]["id"] }));
    client.data(documents::VIEWER, json!({}));
    let own = client.data(documents::ISSUE_TEAM, json!({ "id": issue.id }))["issue"]["team"].clone();
    assert_eq!((&own["id"], &own["key"]), (&team["id"], &json!("ENG")), "the issue's team, as a delivery checks it");
    standin.add_user("Mallory", true);
    standin.label_as("ENG-1", "needs:gpu", "Grace");
    standin.describe_as("ENG-1", "Mallory", "Do something else");
    let history = client.data(documents::ISSUE_HISTORY, json!({ "id": issue.id }))["issue"].clone();
    assert_eq!((&history["creator"]["name"], &history["creator"]["guest"]), (&json!("Ada"), &json!(false)));
    let entries = history["history"]["nodes"].as_array().unwrap().clone();
    let who = |e: &serde_json::Value| (e["actor"]["name"].clone(), e["actor"]["guest"].clone());
    assert_eq!(entries.len(), 2, "one entry per change: {entries:?}");
    assert_eq!(
        (who(&entries[0]), &entries[0]["addedLabels"][0]["name"]),
        ((json!("Grace"), json!(false)), &json!("needs:gpu"))
    );
    assert_eq!((who(&entries[1]), &entries[1]["updatedDescription"]), ((json!("Mallory"), json!(true)), &json!(true)));
    let since = standin.now();
    standin.advance_clock(Duration::from_millis(5));
    standin.comment_as("ENG-1", "Mallory", "/devpilot hello");
    let read = client.data(documents::ISSUE_COMMENTS, json!({ "id": issue.id, "since": since }))["issue"].clone();
    let said = read["comments"]["nodes"].as_array().unwrap().clone();
    assert_eq!(said.len(), 1, "only the comment after the time: {said:?}");
    assert_eq!((&said[0]["user"]["name"], &said[0]["user"]["guest"]), (&json!("Mallory"), &json!(true)));
    let names: Vec<&str> = documents::ALL.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names.len(),
        standin.call_counts().len(),
        "each of {names:?} sent once or more: {:?}",
        standin.call_counts()
    );
    assert!(standin.rejected().is_empty());
    assert!(standin.requests().iter().all(|r| r.errors.is_empty()));
}

/// The `linear-standin` process, killed when the test ends (even by a failed assertion).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `linear-standin` binary prints its URL, serves `/graphql` with the key from the
/// environment, and its admin endpoints file issues and count calls.
#[test]
fn the_binary_serves_graphql_and_admin_endpoints() {
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_linear-standin"))
            .env("LINEAR_STANDIN_KEY", KEY)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    let base = url.trim_end_matches("/graphql").to_string();
    let http = http_client();
    let created: Value = http
        .post(format!("{base}/_admin/issues"))
        .json(&json!({ "title": "From Python", "description": "d", "labels": ["agent"] }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(created["identifier"], "ENG-1");
    let body = json!({ "query": documents::ISSUES, "variables": { "filter": intake_filter() } });
    let answer: Value = http.post(&url).header("Authorization", KEY).json(&body).send().unwrap().json().unwrap();
    assert_eq!(answer["data"]["issues"]["nodes"][0]["title"], "From Python");
    let calls: Value = http.get(format!("{base}/_admin/calls")).send().unwrap().json().unwrap();
    assert_eq!(calls, json!({ "DevpilotIssues": 1 }));
    let comments: Value = http.get(format!("{base}/_admin/comments?issue=ENG-1")).send().unwrap().json().unwrap();
    assert_eq!(comments, json!([]));
    let fault = json!({ "fault": "server_error", "operation": "DevpilotPostComent" });
    let armed = http.post(format!("{base}/_admin/faults")).json(&fault).send().unwrap();
    assert_eq!(armed.status(), 400, "a fault for an operation DevPilot never sends is refused");
    // A guest, and an edit made as them: the issue's history names who made it.
    let guest = http.post(format!("{base}/_admin/users")).json(&json!({ "name": "Mallory", "guest": true }));
    assert_eq!(guest.send().unwrap().status(), 200);
    let edit = json!({ "by": "Mallory", "description": "edited" });
    assert_eq!(http.post(format!("{base}/_admin/issues/ENG-1")).json(&edit).send().unwrap().status(), 200);
    let body = json!({ "query": documents::ISSUE_HISTORY, "variables": { "id": "ENG-1" } });
    let answer: Value = http.post(&url).header("Authorization", KEY).json(&body).send().unwrap().json().unwrap();
    let entry = &answer["data"]["issue"]["history"]["nodes"][0];
    assert_eq!((&entry["actor"]["name"], &entry["actor"]["guest"]), (&json!("Mallory"), &json!(true)), "{answer}");
    // A comment as them, and one as the viewer.
    for said in [json!({ "by": "Mallory", "body": "/devpilot hi" }), json!({ "body": "mine" })] {
        let posted = http.post(format!("{base}/_admin/comments?issue=ENG-1")).json(&said).send().unwrap();
        assert_eq!(posted.status(), 200);
    }
    let comments: Value = http.get(format!("{base}/_admin/comments?issue=ENG-1")).send().unwrap().json().unwrap();
    let by: Vec<&Value> = comments.as_array().unwrap().iter().map(|c| &c["user"]).collect();
    assert_eq!(by, [&json!("Mallory"), &json!("Ada")], "{comments}");
}
