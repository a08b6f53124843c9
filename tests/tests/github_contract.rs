//! Every request the engine builds for GitHub (`devpilot_engine::sources::github::calls`) is
//! one GitHub's published description (`contracts/github`) allows: method, path, query and
//! body, with awkward inputs (a label with a space and an emoji, a later page, a `since`).

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use devpilot_engine::sources::github::calls;
use devpilot_tests::github::contract::{check, operation_ids, Call};

/// Each example call passes the description's check as the operation it names, and together
/// they cover every operation vendored (nothing is vendored that the code does not use).
#[test]
fn every_request_the_engine_builds_is_allowed() {
    let mut seen = vec![];
    for c in calls::examples() {
        let path = c.path();
        let call = Call { method: c.method.as_str(), path: &path, query: &c.query, body: c.body.as_ref() };
        let op = check(&call).unwrap_or_else(|why| panic!("{} {path} {:?}: {why}", c.method, c.query));
        assert_eq!(op, c.op, "{} {path} is {op}, not {}", c.method, c.op);
        seen.push(op);
    }
    let mut vendored = operation_ids();
    vendored.sort_unstable();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, vendored, "the vendored operations are exactly the ones the code uses");
}

/// The check can fail: a page size GitHub does not allow, and a field the description does
/// not name, are refused.
#[test]
fn the_check_refuses_what_github_would() {
    let mut c = calls::list_issues("acme/webapp", &calls::IssueQuery::default());
    for (k, v) in &mut c.query {
        if k == "per_page" {
            *v = "101".into();
        }
    }
    let path = c.path();
    assert!(check(&Call { method: "GET", path: &path, query: &c.query, body: None }).is_err());
    let pull = calls::create_pull(
        "acme/webapp",
        &calls::NewPull { title: "t".into(), head: "h".into(), base: "main".into(), body: String::new(), draft: true },
    );
    let mut body = pull.body.clone().unwrap();
    body["maintainer_can_modify_everything"] = true.into();
    let path = pull.path();
    assert!(check(&Call { method: "POST", path: &path, query: &[], body: Some(&body) }).is_err());
}
