//! GitHub's JSON shapes for the stand-in's data: the fields of GitHub's issue, pull request,
//! comment, label, repository and user objects that a client can reasonably read, with GitHub's
//! URLs (`https://github.com/…` for people, `https://api.github.com/…` for the API).

use serde_json::{json, Value};

use super::model::Access;
use super::reviews::made_up_sha;
use super::state::{
    rfc3339, state_name, CheckRunRow, CommentRow, EventRow, Item, LabelRow, PullRow, Repo, ReviewCommentRow, ReviewRow,
    StatusRow, VIEWER,
};

/// The API URL of a repository.
fn api_url(repo: &Repo) -> String {
    format!("https://api.github.com/repos/{}", repo.full_name)
}

/// A user object (`ada` is id 1, the main token's user).
pub(crate) fn user(login: &str) -> Value {
    let id = if login == VIEWER { 1 } else { 2 + login.bytes().map(u64::from).sum::<u64>() };
    json!({
        "login": login,
        "id": id,
        "node_id": format!("U_{id}"),
        "type": "User",
        "html_url": format!("https://github.com/{login}"),
        "url": format!("https://api.github.com/users/{login}"),
        "site_admin": false,
        "avatar_url": format!("https://avatars.githubusercontent.com/u/{id}?v=4"),
        "gravatar_id": "",
        "events_url": format!("https://api.github.com/users/{login}/events{{/privacy}}"),
        "followers_url": format!("https://api.github.com/users/{login}/followers"),
        "following_url": format!("https://api.github.com/users/{login}/following{{/other_user}}"),
        "gists_url": format!("https://api.github.com/users/{login}/gists{{/gist_id}}"),
        "organizations_url": format!("https://api.github.com/users/{login}/orgs"),
        "received_events_url": format!("https://api.github.com/users/{login}/received_events"),
        "repos_url": format!("https://api.github.com/users/{login}/repos"),
        "starred_url": format!("https://api.github.com/users/{login}/starred{{/owner}}{{/repo}}"),
        "subscriptions_url": format!("https://api.github.com/users/{login}/subscriptions"),
    })
}

/// `GET /user` for a token of `login` (`ada`, Ada, for the main token).
pub(crate) fn viewer(login: &str) -> Value {
    let mut user = user(login);
    user["name"] = json!(if login == VIEWER { "Ada" } else { login });
    user
}

/// A label object.
pub(crate) fn label(repo: &Repo, label: &LabelRow) -> Value {
    json!({
        "id": label.id,
        "node_id": format!("LA_{}", label.id),
        "url": format!("{}/labels/{}", api_url(repo), encode(&label.name)),
        "name": label.name,
        "color": label.color,
        "default": false,
        "description": null,
    })
}

/// An item's labels as objects.
pub(crate) fn labels_of(repo: &Repo, item: &Item) -> Value {
    let labels = item.labels.iter().filter_map(|name| repo.label(name)).map(|l| label(repo, l));
    Value::Array(labels.collect())
}

/// An issue object; a pull request's has a `pull_request` key, as in GitHub's issue lists.
pub(crate) fn issue(repo: &Repo, item: &Item) -> Value {
    let kind = if item.pull.is_some() { "pull" } else { "issues" };
    let assignees: Vec<Value> = item.assignee.iter().map(|a| user(a)).collect();
    let mut value = json!({
        "id": item.id,
        "node_id": format!("I_{}", item.id),
        "number": item.number,
        "url": format!("{}/issues/{}", api_url(repo), item.number),
        "html_url": format!("{}/{kind}/{}", repo.html_url(), item.number),
        "title": item.title,
        "body": item.body,
        "state": state_name(item.open),
        "state_reason": if item.open { Value::Null } else { json!("completed") },
        "locked": false,
        "labels": labels_of(repo, item),
        "assignee": assignees.first().cloned().unwrap_or(Value::Null),
        "assignees": assignees,
        "user": user(&item.user),
        "comments": item.comments.len(),
        "created_at": rfc3339(item.created),
        "updated_at": rfc3339(item.updated),
        "closed_at": item.closed.map(rfc3339),
        "author_association": repo.association(&item.user),
    });
    if let Some(pull) = &item.pull {
        value["pull_request"] = json!({
            "url": format!("{}/pulls/{}", api_url(repo), item.number),
            "html_url": format!("{}/pull/{}", repo.html_url(), item.number),
            "diff_url": format!("{}/pull/{}.diff", repo.html_url(), item.number),
            "patch_url": format!("{}/pull/{}.patch", repo.html_url(), item.number),
            "merged_at": pull.merged.map(rfc3339),
        });
        value["draft"] = json!(item.pull.as_ref().is_some_and(|p| p.draft));
    }
    value
}

/// A pull request as `pulls/list` lists it (GitHub's "Pull Request Simple").
pub(crate) fn pull(repo: &Repo, item: &Item) -> Value {
    let Some(pull) = &item.pull else { return issue(repo, item) };
    let (api, html) =
        (format!("{}/pulls/{}", api_url(repo), item.number), format!("{}/pull/{}", repo.html_url(), item.number));
    let issue_api = format!("{}/issues/{}", api_url(repo), item.number);
    let head_sha = repo.head_sha(pull);
    let statuses = format!("{}/statuses/{head_sha}", api_url(repo));
    let assignees: Vec<Value> = item.assignee.iter().map(|a| user(a)).collect();
    let link = |href: &str| json!({ "href": href });
    json!({
        "id": item.id,
        "node_id": format!("PR_{}", item.id),
        "number": item.number,
        "url": api,
        "html_url": html,
        "diff_url": format!("{html}.diff"),
        "patch_url": format!("{html}.patch"),
        "issue_url": issue_api,
        "commits_url": format!("{api}/commits"),
        "review_comments_url": format!("{api}/comments"),
        "review_comment_url": format!("{}/pulls/comments{{/number}}", api_url(repo)),
        "comments_url": format!("{issue_api}/comments"),
        "statuses_url": statuses,
        "state": state_name(item.open),
        "locked": false,
        "active_lock_reason": null,
        "draft": pull.draft,
        "title": item.title,
        "body": item.body,
        "user": user(&item.user),
        "labels": labels_of(repo, item),
        "milestone": null,
        "assignee": assignees.first().cloned().unwrap_or(Value::Null),
        "assignees": assignees,
        "requested_reviewers": [],
        "requested_teams": [],
        "head": branch(repo, &pull.head, &head_sha),
        "base": branch(repo, &pull.base, &repo.base_sha(pull)),
        "_links": {
            "self": link(&api),
            "html": link(&html),
            "issue": link(&issue_api),
            "comments": link(&format!("{issue_api}/comments")),
            "review_comments": link(&format!("{api}/comments")),
            "review_comment": link(&format!("{}/pulls/comments{{/number}}", api_url(repo))),
            "commits": link(&format!("{api}/commits")),
            "statuses": link(&statuses),
        },
        "created_at": rfc3339(item.created),
        "updated_at": rfc3339(item.updated),
        "closed_at": item.closed.map(rfc3339),
        "merged_at": pull.merged.map(rfc3339),
        "merge_commit_sha": merge_commit(repo, item, pull),
        "auto_merge": null,
        "author_association": repo.association(&item.user),
    })
}

/// A pull request as `pulls/get` and `pulls/create` answer it (GitHub's "Pull Request"): the
/// listed fields, whether it is merged and mergeable, and its counts. The stand-in keeps no
/// diff, so additions, deletions and changed files are 0.
pub(crate) fn pull_full(repo: &Repo, item: &Item) -> Value {
    let mut value = pull(repo, item);
    let Some(p) = &item.pull else { return value };
    let (mergeable, mergeable_state) = match (item.open, p.draft) {
        (false, _) => (Value::Null, "unknown"),
        (true, true) => (json!(true), "draft"),
        (true, false) => (json!(true), "clean"),
    };
    let fields = json!({
        "merged": p.merged.is_some(),
        "mergeable": mergeable,
        "rebaseable": mergeable,
        "mergeable_state": mergeable_state,
        "merged_by": if p.merged.is_some() { user(VIEWER) } else { Value::Null },
        "comments": item.comments.len(),
        "review_comments": p.review_comments.len(),
        "maintainer_can_modify": false,
        "commits": p.pushes + 1,
        "additions": 0,
        "deletions": 0,
        "changed_files": 0,
    });
    if let (Some(object), Value::Object(extra)) = (value.as_object_mut(), fields) {
        object.extend(extra);
    }
    value
}

/// A pull request's `head` or `base`: the branch, its commit, and the repository.
fn branch(repo: &Repo, name: &str, sha: &str) -> Value {
    json!({
        "label": format!("{}:{name}", repo.owner()),
        "ref": name,
        "sha": sha,
        "user": user(repo.owner()),
        "repo": repository(repo),
    })
}

/// A merged pull request's merge commit (made up: the stand-in merges nothing); `null` before.
fn merge_commit(repo: &Repo, item: &Item, pull: &PullRow) -> Value {
    pull.merged.map_or(Value::Null, |_| json!(made_up_sha(&repo.full_name, &format!("merge #{}", item.number), 0)))
}

/// A comment object.
pub(crate) fn comment(repo: &Repo, item: &Item, comment: &CommentRow) -> Value {
    json!({
        "id": comment.id,
        "node_id": format!("IC_{}", comment.id),
        "url": format!("{}/issues/comments/{}", api_url(repo), comment.id),
        "html_url": format!("{}/issues/{}#issuecomment-{}", repo.html_url(), item.number, comment.id),
        "issue_url": format!("{}/issues/{}", api_url(repo), item.number),
        "body": comment.body,
        "user": user(&comment.user),
        "created_at": rfc3339(comment.created),
        "updated_at": rfc3339(comment.created),
        "author_association": repo.association(&comment.user),
    })
}

/// A repository object, with the permissions of the token that asked.
pub(crate) fn repo(repo: &Repo, access: Access) -> Value {
    let push = access == Access::Full;
    let mut value = repository(repo);
    value["permissions"] = json!({ "admin": push, "maintain": push, "push": push, "triage": push, "pull": true });
    value
}

/// The `*_url` fields of a repository object: each its API URL and this tail.
const REPO_URLS: [(&str, &str); 36] = [
    ("archive_url", "/{archive_format}{/ref}"),
    ("assignees_url", "/assignees{/user}"),
    ("blobs_url", "/git/blobs{/sha}"),
    ("branches_url", "/branches{/branch}"),
    ("collaborators_url", "/collaborators{/collaborator}"),
    ("comments_url", "/comments{/number}"),
    ("commits_url", "/commits{/sha}"),
    ("compare_url", "/compare/{base}...{head}"),
    ("contents_url", "/contents/{+path}"),
    ("contributors_url", "/contributors"),
    ("deployments_url", "/deployments"),
    ("downloads_url", "/downloads"),
    ("events_url", "/events"),
    ("forks_url", "/forks"),
    ("git_commits_url", "/git/commits{/sha}"),
    ("git_refs_url", "/git/refs{/sha}"),
    ("git_tags_url", "/git/tags{/sha}"),
    ("hooks_url", "/hooks"),
    ("issue_comment_url", "/issues/comments{/number}"),
    ("issue_events_url", "/issues/events{/number}"),
    ("issues_url", "/issues{/number}"),
    ("keys_url", "/keys{/key_id}"),
    ("labels_url", "/labels{/name}"),
    ("languages_url", "/languages"),
    ("merges_url", "/merges"),
    ("milestones_url", "/milestones{/number}"),
    ("notifications_url", "/notifications{?since,all,participating}"),
    ("pulls_url", "/pulls{/number}"),
    ("releases_url", "/releases{/id}"),
    ("stargazers_url", "/stargazers"),
    ("statuses_url", "/statuses/{sha}"),
    ("subscribers_url", "/subscribers"),
    ("subscription_url", "/subscription"),
    ("tags_url", "/tags"),
    ("teams_url", "/teams"),
    ("trees_url", "/git/trees{/sha}"),
];

/// A repository object without the asker's permissions (a pull request's `head.repo`, a
/// combined status's `repository`). The stand-in keeps no repository times: they are `null`.
pub(crate) fn repository(repo: &Repo) -> Value {
    let (api, html) = (api_url(repo), repo.html_url());
    let open = repo.items.iter().filter(|i| i.open).count();
    let mut value = json!({
        "id": repo.id,
        "node_id": format!("R_{}", repo.id),
        "name": repo.full_name.split('/').nth(1).unwrap_or_default(),
        "full_name": repo.full_name,
        "owner": user(repo.owner()),
        "private": false,
        "html_url": html,
        "description": null,
        "fork": false,
        "url": api,
        "git_url": format!("git://github.com/{}.git", repo.full_name),
        "ssh_url": format!("git@github.com:{}.git", repo.full_name),
        "clone_url": format!("{html}.git"),
        "svn_url": html,
        "mirror_url": null,
        "homepage": null,
        "language": null,
        "forks": 0,
        "forks_count": 0,
        "stargazers_count": 0,
        "watchers": 0,
        "watchers_count": 0,
        "size": 0,
        "open_issues": open,
        "open_issues_count": open,
        "default_branch": repo.default_branch,
        "topics": [],
        "is_template": false,
        "has_issues": true,
        "has_projects": true,
        "has_wiki": true,
        "has_pages": false,
        "has_downloads": true,
        "has_discussions": false,
        "archived": false,
        "disabled": false,
        "visibility": "public",
        "license": null,
        "pushed_at": null,
        "created_at": null,
        "updated_at": null,
    });
    for (key, tail) in REPO_URLS {
        value[key] = json!(format!("{}{tail}", api_url(repo)));
    }
    value
}

/// GitHub's `{"message": …, "documentation_url": …}` error body.
pub(crate) fn error(message: &str) -> Value {
    json!({ "message": message, "documentation_url": "https://docs.github.com/rest" })
}

/// GitHub's 422 `Validation Failed` body with these `errors`.
pub(crate) fn validation_failed(errors: Value) -> Value {
    json!({
        "message": "Validation Failed",
        "errors": errors,
        "documentation_url": "https://docs.github.com/rest",
    })
}

/// Percent-encodes everything but RFC 3986's unreserved characters (a path segment or a
/// query value).
pub(crate) fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// An issue event object (GitHub's "Issue Event for Issue" shapes for these four kinds).
pub(crate) fn event(repo: &Repo, e: &EventRow) -> Value {
    let mut v = json!({
        "id": e.id,
        "node_id": format!("IE_{}", e.id),
        "url": format!("https://api.github.com/repos/{}/issues/events/{}", repo.full_name, e.id),
        "actor": user(&e.actor),
        "event": e.event,
        "commit_id": null,
        "commit_url": null,
        "created_at": rfc3339(e.created),
        "performed_via_github_app": null,
    });
    if let Some(name) = &e.label {
        let color = repo.label(name).map_or("ededed", |l| l.color.as_str());
        v["label"] = json!({ "name": name, "color": color });
    }
    v
}

/// A pull request's API URL and its page.
fn pull_urls(repo: &Repo, item: &Item) -> (String, String) {
    (format!("{}/pulls/{}", api_url(repo), item.number), format!("{}/pull/{}", repo.html_url(), item.number))
}

/// A review object.
pub(crate) fn review(repo: &Repo, item: &Item, r: &ReviewRow) -> Value {
    let (api, html) = pull_urls(repo, item);
    let html_url = format!("{html}#pullrequestreview-{}", r.id);
    json!({
        "id": r.id,
        "node_id": format!("PRR_{}", r.id),
        "user": user(&r.user),
        "body": r.body,
        "state": r.state,
        "html_url": html_url,
        "pull_request_url": api,
        "_links": { "html": { "href": html_url }, "pull_request": { "href": api } },
        "submitted_at": rfc3339(r.submitted),
        "commit_id": r.commit_id,
        "author_association": repo.association(&r.user),
    })
}

/// An inline (review) comment object; a reply has `in_reply_to_id`. The stand-in keeps no
/// diff: the hunk is the commented line's header, and a comment stays on the commit it was
/// made on (on GitHub, `commit_id` follows the head while the line is unchanged).
pub(crate) fn review_comment(repo: &Repo, item: &Item, c: &ReviewCommentRow) -> Value {
    let (pull_api, html) = pull_urls(repo, item);
    let api = format!("{}/pulls/comments/{}", api_url(repo), c.id);
    let html_url = format!("{html}#discussion_r{}", c.id);
    let mut value = json!({
        "url": api,
        "pull_request_review_id": c.review_id,
        "id": c.id,
        "node_id": format!("PRRC_{}", c.id),
        "diff_hunk": format!("@@ -{0},1 +{0},1 @@", c.line),
        "path": c.path,
        "commit_id": c.commit_id,
        "original_commit_id": c.commit_id,
        "user": user(&c.user),
        "body": c.body,
        "created_at": rfc3339(c.created),
        "updated_at": rfc3339(c.created),
        "html_url": html_url,
        "pull_request_url": pull_api,
        "author_association": repo.association(&c.user),
        "_links": { "self": { "href": api }, "html": { "href": html_url }, "pull_request": { "href": pull_api } },
        "start_line": null,
        "original_start_line": null,
        "start_side": null,
        "line": c.line,
        "original_line": c.line,
        "side": "RIGHT",
        "subject_type": "line",
        "reactions": reactions(&format!("{api}/reactions")),
    });
    if let Some(to) = c.in_reply_to {
        value["in_reply_to_id"] = json!(to);
    }
    value
}

/// No reactions yet.
fn reactions(url: &str) -> Value {
    json!({
        "url": url, "total_count": 0, "+1": 0, "-1": 0, "laugh": 0, "confused": 0, "heart": 0, "hooray": 0,
        "eyes": 0, "rocket": 0,
    })
}

/// The app every check run is from: GitHub Actions.
fn actions_app() -> Value {
    let mut owner = user("github");
    owner["type"] = json!("Organization");
    json!({
        "id": 15368,
        "slug": "github-actions",
        "node_id": "MDM6QXBwMTUzNjg=",
        "owner": owner,
        "name": "GitHub Actions",
        "description": "Automate your workflow from idea to production",
        "external_url": "https://help.github.com/en/actions",
        "html_url": "https://github.com/apps/github-actions",
        "created_at": "2018-07-30T09:30:17Z",
        "updated_at": "2019-12-10T19:04:12Z",
        "permissions": { "checks": "write", "contents": "write", "metadata": "read", "pull_requests": "write" },
        "events": ["check_run", "check_suite", "pull_request", "push"],
    })
}

/// A check run object; `pull_requests` are the open ones whose head is its commit.
pub(crate) fn check_run(repo: &Repo, run: &CheckRunRow) -> Value {
    let api = format!("{}/check-runs/{}", api_url(repo), run.id);
    let html_url = format!("{}/runs/{}", repo.html_url(), run.id);
    let suite = repo.check_runs.iter().filter(|r| r.sha == run.sha).map(|r| r.id).min().unwrap_or(run.id);
    let pulls: Vec<Value> = repo
        .items
        .iter()
        .filter(|i| i.open)
        .filter_map(|i| Some((i, i.pull.as_ref()?)))
        .filter(|(_, p)| repo.head_sha(p) == run.sha)
        .map(|(i, p)| pull_minimal(repo, i, p))
        .collect();
    json!({
        "id": run.id,
        "head_sha": run.sha,
        "node_id": format!("CR_{}", run.id),
        "external_id": "",
        "url": api,
        "html_url": html_url,
        "details_url": html_url,
        "status": "completed",
        "conclusion": run.conclusion,
        "started_at": rfc3339(run.completed),
        "completed_at": rfc3339(run.completed),
        "output": {
            "title": run.title,
            "summary": run.summary,
            "text": run.text,
            "annotations_count": 0,
            "annotations_url": format!("{api}/annotations"),
        },
        "name": run.name,
        "check_suite": { "id": suite },
        "app": actions_app(),
        "pull_requests": pulls,
    })
}

/// A pull request as a check run names it (GitHub's "Pull Request Minimal").
fn pull_minimal(repo: &Repo, item: &Item, pull: &PullRow) -> Value {
    let name = repo.full_name.split('/').nth(1).unwrap_or_default();
    let small = json!({ "id": repo.id, "url": api_url(repo), "name": name });
    json!({
        "id": item.id,
        "number": item.number,
        "url": pull_urls(repo, item).0,
        "head": { "ref": pull.head, "sha": repo.head_sha(pull), "repo": small },
        "base": { "ref": pull.base, "sha": repo.base_sha(pull), "repo": small },
    })
}

/// A commit status object.
pub(crate) fn status(repo: &Repo, s: &StatusRow) -> Value {
    json!({
        "url": format!("{}/statuses/{}", api_url(repo), s.sha),
        "avatar_url": "https://avatars.githubusercontent.com/u/1?v=4",
        "id": s.id,
        "node_id": format!("SC_{}", s.id),
        "state": s.state,
        "description": s.description,
        "target_url": null,
        "context": s.context,
        "created_at": rfc3339(s.created),
        "updated_at": rfc3339(s.created),
    })
}

/// The combined status of commit `sha`: `state` over every context's latest status (`total`
/// of them), with one page of them as `statuses`.
pub(crate) fn combined_status(repo: &Repo, sha: &str, state: &str, (page, total): (Value, usize)) -> Value {
    json!({
        "state": state,
        "statuses": page,
        "sha": sha,
        "total_count": total,
        "repository": repository(repo),
        "commit_url": format!("{}/commits/{sha}", api_url(repo)),
        "url": format!("{}/commits/{sha}/status", api_url(repo)),
    })
}
