//! The review loop's operations on the stand-in: a pull request read back (merged or not, its
//! head's sha), its reviews and inline comments (and a reply in a thread), the check runs and
//! statuses on its head, and `author_association`, each answer in GitHub's documented shape.

use std::path::Path;
use std::process::{Command, Stdio};

use devpilot_tests::GitHubStandIn;
use serde_json::{json, Value};

use super::{standin, Answer, Client, REPO, TOKEN};

/// The vendored description, for the shape of each answer.
fn described() -> Value {
    serde_json::from_str(include_str!("../../../contracts/github/api.github.com.2022-11-28.subset.json")).unwrap()
}

/// Whether `value` is of the description's `type`.
fn fits(ty: &str, value: &Value) -> bool {
    match ty {
        "integer" => value.is_i64() || value.is_u64(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => true,
    }
}

/// `answer` is operation `op`'s answer as GitHub's description has it: the status is one it
/// lists, and the body (each item of a list) has every required field, each field of the
/// described type (null only where nullable), and each object field its own required fields.
fn assert_described(op: &str, answer: &Answer) {
    let contract = described();
    let operation = contract["operations"].as_array().unwrap().iter().find(|o| o["operationId"] == op).unwrap();
    let schema = &operation["responses"][answer.status.to_string()];
    assert!(schema.is_object(), "{op} does not answer {}", answer.status);
    let (schema, items) = match &answer.body {
        Value::Array(items) => (&schema["items"], items.iter().collect()),
        one => (schema, vec![one]),
    };
    for item in items {
        for name in schema["required"].as_array().into_iter().flatten().map(|n| n.as_str().unwrap()) {
            assert!(item.get(name).is_some(), "{op}: no `{name}` in {item}");
        }
        for (name, field) in schema["properties"].as_object().into_iter().flatten() {
            let Some(value) = item.get(name) else { continue };
            if value.is_null() {
                assert_eq!(field["nullable"], true, "{op}: `{name}` is null");
                continue;
            }
            assert!(fits(field["type"].as_str().unwrap_or_default(), value), "{op}: `{name}` is {value}");
            for inner in field["required"].as_array().into_iter().flatten().map(|n| n.as_str().unwrap()) {
                assert!(value.get(inner).is_some(), "{op}: no `{name}.{inner}` in {value}");
            }
        }
    }
}

/// Every field GitHub's description requires of `value` among `names` (for the parts the
/// vendored subset does not spell out: a check run, a status).
fn assert_has(value: &Value, names: &[&str]) {
    for name in names {
        assert!(value.get(name).is_some(), "no `{name}` in {value}");
    }
}

/// Opens a pull request from `head` through the API (as the main token's user); its number.
fn open_pull(client: &Client, head: &str) -> u64 {
    let created = client.post("/repos/acme/webapp/pulls", json!({ "title": "Fix", "head": head, "base": "main" }));
    assert_eq!(created.status, 201, "{}", created.body);
    assert_described("pulls/create", &created);
    created.body["number"].as_u64().unwrap()
}

/// `GET /repos/acme/webapp/{tail}`.
fn get(client: &Client, tail: &str) -> Answer {
    client.get(&format!("/repos/acme/webapp/{tail}"))
}

/// A review with two inline comments is listed by `pulls/list-reviews` and
/// `pulls/list-review-comments` in GitHub's shapes, and bumps the pull request's `updated_at`.
#[test]
fn a_review_with_inline_comments_is_listed_by_both_operations() {
    let standin = standin();
    let client = Client::new(&standin);
    let n = open_pull(&client, "agent/fix");
    let before = get(&client, &format!("pulls/{n}")).body["updated_at"].clone();
    let comments = [("src/app.rs", 12, "This unwrap can panic."), ("README.md", 3, "Typo.")];
    let (review, ids) = standin.review(REPO, n, "grace", "CHANGES_REQUESTED", "Two things.", &comments);
    let pull = get(&client, &format!("pulls/{n}"));
    assert_described("pulls/get", &pull);
    assert!(pull.body["updated_at"].as_str() > before.as_str(), "a review bumps updated_at");
    let head = pull.body["head"]["sha"].clone();
    let reviews = get(&client, &format!("pulls/{n}/reviews?per_page=100"));
    assert_described("pulls/list-reviews", &reviews);
    let r = &reviews.body[0];
    assert_eq!(
        (r["id"].as_u64(), &r["state"], &r["body"]),
        (Some(review), &json!("CHANGES_REQUESTED"), &json!("Two things."))
    );
    assert_eq!((&r["user"]["login"], &r["commit_id"]), (&json!("grace"), &head));
    assert_eq!(r["html_url"], format!("https://github.com/acme/webapp/pull/{n}#pullrequestreview-{review}"));
    let listed = get(&client, &format!("pulls/{n}/comments"));
    assert_described("pulls/list-review-comments", &listed);
    let listed = listed.body.as_array().unwrap().clone();
    let seen: Vec<(u64, &str, u64, &str)> = listed
        .iter()
        .map(|c| {
            (
                c["id"].as_u64().unwrap(),
                c["path"].as_str().unwrap(),
                c["line"].as_u64().unwrap(),
                c["body"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(seen, [(ids[0], "src/app.rs", 12, "This unwrap can panic."), (ids[1], "README.md", 3, "Typo.")]);
    assert!(listed.iter().all(|c| c["pull_request_review_id"] == review && c.get("in_reply_to_id").is_none()));
    assert_eq!(standin.review_comments(REPO, n)[1].review_id, Some(review));
    assert_eq!(get(&client, "pulls/99/reviews").status, 404);
    assert_eq!(get(&client, "pulls/99").status, 404);
    assert!(standin.rejected().is_empty(), "{:?}", standin.rejected());
}

/// A reply by the token's user lands in the thread with `in_reply_to_id` on the same path and
/// line; a reply to a reply, or to a comment of another pull request, is 404.
#[test]
fn a_reply_lands_in_the_thread_with_in_reply_to_id() {
    let standin = standin();
    let client = Client::new(&standin);
    let (n, other) = (open_pull(&client, "agent/fix"), open_pull(&client, "agent/other"));
    let first = standin.review_comment(REPO, n, "grace", "src/app.rs", 12, "This unwrap can panic.");
    let reply =
        client.post(&format!("/repos/acme/webapp/pulls/{n}/comments/{first}/replies"), json!({ "body": "Fixed." }));
    assert_eq!(reply.status, 201, "{}", reply.body);
    assert_described("pulls/create-reply-for-review-comment", &reply);
    assert_eq!((&reply.body["in_reply_to_id"], &reply.body["user"]["login"]), (&json!(first), &json!("ada")));
    assert_eq!((&reply.body["path"], &reply.body["line"]), (&json!("src/app.rs"), &json!(12)));
    let thread = standin.review_comments(REPO, n);
    assert_eq!(thread.len(), 2);
    assert_eq!((thread[1].in_reply_to, thread[1].body.as_str()), (Some(first), "Fixed."));
    assert_ne!(thread[0].review_id, thread[1].review_id, "a reply is a review of its own");
    let listed = get(&client, &format!("pulls/{n}/comments"));
    assert_eq!(listed.body[1]["in_reply_to_id"], first);
    let reviews = get(&client, &format!("pulls/{n}/reviews")).body;
    assert_eq!((reviews[0]["state"].as_str(), reviews[1]["state"].as_str()), (Some("COMMENTED"), Some("COMMENTED")));
    let second = reply.body["id"].as_u64().unwrap();
    for (pull, to) in [(n, second), (other, first), (n, 1)] {
        let refused =
            client.post(&format!("/repos/acme/webapp/pulls/{pull}/comments/{to}/replies"), json!({ "body": "x" }));
        assert_eq!(refused.status, 404, "a reply to {to} on #{pull}");
    }
    assert_eq!(standin.review_comments(REPO, n).len(), 2);
    assert!(standin.rejected().is_empty(), "{:?}", standin.rejected());
}

/// A check run and a status on the head are listed for its sha; a push moves the head, and the
/// new sha has neither (the old one keeps both); an unknown sha is 404.
#[test]
fn check_runs_and_statuses_follow_the_head() {
    let standin = standin();
    let client = Client::new(&standin);
    let n = open_pull(&client, "agent/fix");
    let run = standin.check_run(REPO, n, "test", "failure", "2 failed", "Tests failed", "assertion failed: ok");
    standin.commit_status(REPO, n, "ci/lint", "pending", "Linting");
    standin.commit_status(REPO, n, "ci/lint", "success", "Clean");
    let old = get(&client, &format!("pulls/{n}")).body["head"]["sha"].as_str().unwrap().to_string();
    assert_eq!((old.len(), standin.pulls(REPO)[0].head_sha.as_str()), (40, old.as_str()));
    let runs = get(&client, &format!("commits/{old}/check-runs?filter=latest&per_page=100"));
    assert_described("checks/list-for-ref", &runs);
    assert_eq!(runs.body["total_count"], 1);
    let r = &runs.body["check_runs"][0];
    let required = ["id", "node_id", "head_sha", "name", "url", "html_url", "details_url", "status", "conclusion"];
    assert_has(r, &required);
    assert_has(r, &["started_at", "completed_at", "external_id", "check_suite", "output", "app", "pull_requests"]);
    assert_eq!(
        (r["id"].as_u64(), &r["head_sha"], &r["status"], &r["conclusion"]),
        (Some(run), &json!(old), &json!("completed"), &json!("failure"))
    );
    assert_eq!(r["output"]["text"], "assertion failed: ok");
    assert_eq!(r["pull_requests"][0]["number"], n);
    let status = get(&client, &format!("commits/{old}/status"));
    assert_described("repos/get-combined-status-for-ref", &status);
    assert_eq!(
        (&status.body["state"], &status.body["total_count"], &status.body["sha"]),
        (&json!("success"), &json!(1), &json!(old))
    );
    let s = &status.body["statuses"][0];
    assert_has(
        s,
        &[
            "description",
            "id",
            "node_id",
            "state",
            "context",
            "target_url",
            "avatar_url",
            "url",
            "created_at",
            "updated_at",
        ],
    );
    assert_eq!((&s["context"], &s["description"]), (&json!("ci/lint"), &json!("Clean")));
    standin.push_head(REPO, n);
    let new = get(&client, &format!("pulls/{n}")).body["head"]["sha"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    assert_eq!(get(&client, &format!("commits/{new}/check-runs")).body["total_count"], 0);
    let pending = get(&client, &format!("commits/{new}/status")).body;
    assert_eq!((&pending["state"], &pending["total_count"]), (&json!("pending"), &json!(0)));
    let kept = get(&client, &format!("commits/{old}/check-runs")).body;
    assert_eq!((&kept["total_count"], &kept["check_runs"][0]["pull_requests"]), (&json!(1), &json!([])));
    assert_eq!(get(&client, &format!("commits/{}/status", "0".repeat(40))).status, 404);
    assert_eq!(get(&client, &format!("commits/{}/check-runs", "0".repeat(40))).status, 404);
    assert!(standin.rejected().is_empty(), "{:?}", standin.rejected());
}

/// `git` in `cwd`, which must succeed; its output.
fn git(args: &[&str], cwd: &Path) -> String {
    let out = Command::new("git").args(args).current_dir(cwd).stderr(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "git {args:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// With a git directory, `head.sha` is the branch's commit there, and a real push moves it.
#[test]
fn the_head_sha_follows_a_real_git_push() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let commit = ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "c"];
    git(&["init", "-q", "-b", "main"], &work);
    git(&commit, &work);
    git(&["checkout", "-q", "-b", "agent/fix"], &work);
    git(&["clone", "-q", "--bare", "work", "bare.git"], dir.path());
    let standin = GitHubStandIn::start(TOKEN);
    standin.add_repo_with_git(REPO, &dir.path().join("bare.git"));
    let client = Client::new(&standin);
    let n = open_pull(&client, "agent/fix");
    let first = git(&["rev-parse", "HEAD"], &work);
    assert_eq!(get(&client, &format!("pulls/{n}")).body["head"]["sha"], first);
    standin.check_run(REPO, n, "test", "success", "ok", "ok", "");
    git(&commit, &work);
    git(&["push", "-q", "../bare.git", "agent/fix"], &work);
    let second = git(&["rev-parse", "HEAD"], &work);
    assert_ne!(first, second);
    assert_eq!(get(&client, &format!("pulls/{n}")).body["head"]["sha"], second);
    assert_eq!(get(&client, &format!("commits/{second}/check-runs")).body["total_count"], 0);
    assert_eq!(get(&client, &format!("commits/{first}/check-runs")).body["total_count"], 1);
    assert!(standin.rejected().is_empty(), "{:?}", standin.rejected());
}

/// A merge shows `merged` true with `merged_at` (also on the issue side); a close without one
/// shows `closed` and `merged` false.
#[test]
fn a_merge_shows_merged_and_a_close_does_not() {
    let standin = standin();
    let client = Client::new(&standin);
    let (merged, closed) = (open_pull(&client, "agent/one"), open_pull(&client, "agent/two"));
    standin.merge_pull(REPO, merged);
    standin.close_issue(REPO, closed);
    let m = get(&client, &format!("pulls/{merged}")).body;
    assert_eq!((&m["state"], &m["merged"], &m["merged_by"]["login"]), (&json!("closed"), &json!(true), &json!("ada")));
    assert!(m["merged_at"].is_string() && m["merged_at"] == m["closed_at"], "{m}");
    assert!(m["merge_commit_sha"].is_string());
    let c = get(&client, &format!("pulls/{closed}")).body;
    assert_eq!((&c["state"], &c["merged"], &c["merged_at"]), (&json!("closed"), &json!(false), &Value::Null));
    let issue = get(&client, &format!("issues/{merged}")).body;
    assert_eq!(issue["pull_request"]["merged_at"], m["merged_at"]);
    let pulls = standin.pulls(REPO);
    assert_eq!((pulls[0].merged, pulls[1].merged), (true, false));
    let events = get(&client, &format!("issues/{merged}/events")).body;
    let kinds: Vec<&str> = events.as_array().unwrap().iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["merged", "closed"]);
    assert!(standin.rejected().is_empty(), "{:?}", standin.rejected());
}

/// A repeated GET of the new operations with its ETag is a 304 that does not count; a new
/// review changes the list's ETag.
#[test]
fn a_repeated_get_with_the_etag_is_304_and_not_counted() {
    let standin = standin();
    let client = Client::new(&standin);
    let n = open_pull(&client, "agent/fix");
    standin.check_run(REPO, n, "test", "success", "ok", "ok", "");
    let sha = standin.pulls(REPO)[0].head_sha.clone();
    let targets = [
        format!("pulls/{n}"),
        format!("pulls/{n}/reviews"),
        format!("pulls/{n}/comments"),
        format!("commits/{sha}/check-runs"),
        format!("commits/{sha}/status"),
    ];
    for target in &targets {
        let first = get(&client, target);
        let etag = first.header("etag").to_string();
        let again = client.send("GET", &format!("/repos/acme/webapp/{target}"), None, &[("If-None-Match", &etag)]);
        assert_eq!((again.status, &again.body), (304, &Value::Null), "{target}");
        assert_eq!(again.number("x-ratelimit-remaining"), first.number("x-ratelimit-remaining"), "{target}");
        let last = standin.recorded().pop().unwrap();
        assert!(last.conditional && !last.counted, "{target}: {last:?}");
    }
    let etag = get(&client, &targets[1]).header("etag").to_string();
    standin.review(REPO, n, "grace", "APPROVED", "", &[]);
    let changed = client.send("GET", &format!("/repos/acme/webapp/{}", targets[1]), None, &[("If-None-Match", &etag)]);
    assert_eq!(changed.status, 200);
    assert!(standin.rejected().is_empty(), "{:?}", standin.rejected());
}

/// `author_association` is OWNER for the main user, COLLABORATOR for a writer and NONE for a
/// stranger, on issues, comments, pull requests, reviews and inline comments alike.
#[test]
fn author_association_follows_the_role() {
    let standin = standin();
    standin.set_role(REPO, "grace", "write");
    let client = Client::new(&standin);
    let n = open_pull(&client, "agent/fix");
    let issue = standin
        .open_issue(REPO, devpilot_tests::github::IssueSeed { user: Some("mallory".into()), ..Default::default() });
    standin.comment_as(REPO, issue, "grace", "Seen.");
    standin.review(REPO, n, "mallory", "COMMENTED", "Drive-by.", &[("a.rs", 1, "Hm.")]);
    standin.review(REPO, n, "grace", "APPROVED", "", &[]);
    standin.review_comment(REPO, n, "grace", "a.rs", 2, "Nit.");
    let of = |v: &Value| v["author_association"].as_str().unwrap().to_string();
    assert_eq!(of(&get(&client, &format!("pulls/{n}")).body), "OWNER");
    assert_eq!(of(&get(&client, &format!("issues/{issue}")).body), "NONE");
    assert_eq!(of(&get(&client, &format!("issues/{issue}/comments")).body[0]), "COLLABORATOR");
    let reviews = get(&client, &format!("pulls/{n}/reviews")).body;
    assert_eq!((of(&reviews[0]), of(&reviews[1])), ("NONE".into(), "COLLABORATOR".into()));
    let comments = get(&client, &format!("pulls/{n}/comments")).body;
    assert_eq!((of(&comments[0]), of(&comments[1])), ("NONE".into(), "COLLABORATOR".into()));
    assert!(standin.rejected().is_empty(), "{:?}", standin.rejected());
}

/// A pull request's author may comment on it but not approve it or request changes, as on
/// GitHub.
#[test]
fn the_author_may_not_approve_their_own_pull_request() {
    let standin = standin();
    let n = open_pull(&Client::new(&standin), "agent/fix");
    let own =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| standin.review(REPO, n, "ada", "APPROVED", "", &[])));
    assert!(own.is_err());
    standin.review(REPO, n, "ada", "COMMENTED", "Notes.", &[]);
}
