//! GitHub's JSON shapes for the stand-in's data: the fields of GitHub's issue, pull request,
//! comment, label, repository and user objects that a client can reasonably read, with GitHub's
//! URLs (`https://github.com/…` for people, `https://api.github.com/…` for the API).

use serde_json::{json, Value};

use super::model::Access;
use super::state::{rfc3339, state_name, CommentRow, EventRow, Item, LabelRow, Repo, VIEWER};

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
        "author_association": "OWNER",
    });
    if item.pull.is_some() {
        value["pull_request"] = json!({
            "url": format!("{}/pulls/{}", api_url(repo), item.number),
            "html_url": format!("{}/pull/{}", repo.html_url(), item.number),
            "merged_at": null,
        });
        value["draft"] = json!(item.pull.as_ref().is_some_and(|p| p.draft));
    }
    value
}

/// A pull request object (`pulls/list`, `pulls/create`).
pub(crate) fn pull(repo: &Repo, item: &Item) -> Value {
    let (head, base, draft) = item.pull.as_ref().map_or(("", "", false), |p| (&p.head[..], &p.base[..], p.draft));
    json!({
        "id": item.id,
        "node_id": format!("PR_{}", item.id),
        "number": item.number,
        "url": format!("{}/pulls/{}", api_url(repo), item.number),
        "html_url": format!("{}/pull/{}", repo.html_url(), item.number),
        "issue_url": format!("{}/issues/{}", api_url(repo), item.number),
        "state": state_name(item.open),
        "locked": false,
        "draft": draft,
        "title": item.title,
        "body": item.body,
        "user": user(&item.user),
        "labels": labels_of(repo, item),
        "head": { "ref": head, "label": format!("{}:{head}", repo.owner()), "repo": { "full_name": repo.full_name } },
        "base": { "ref": base, "label": format!("{}:{base}", repo.owner()), "repo": { "full_name": repo.full_name } },
        "created_at": rfc3339(item.created),
        "updated_at": rfc3339(item.updated),
        "closed_at": item.closed.map(rfc3339),
        "merged_at": null,
        "author_association": "OWNER",
    })
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
        "author_association": "OWNER",
    })
}

/// A repository object, with the permissions of the token that asked.
pub(crate) fn repo(repo: &Repo, access: Access) -> Value {
    let push = access == Access::Full;
    json!({
        "id": repo.id,
        "node_id": format!("R_{}", repo.id),
        "name": repo.full_name.split('/').nth(1).unwrap_or_default(),
        "full_name": repo.full_name,
        "owner": user(repo.owner()),
        "private": false,
        "html_url": repo.html_url(),
        "url": api_url(repo),
        "default_branch": repo.default_branch,
        "has_issues": true,
        "archived": false,
        "disabled": false,
        "visibility": "public",
        "permissions": { "admin": push, "maintain": push, "push": push, "triage": push, "pull": true },
    })
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
