//! The operations, run over the stand-in's data once the handler has let a request through:
//! each one GitHub's behaviour as documented (filters, sort orders, pagination with `Link`,
//! 404s, 422 `Validation Failed` shapes). A parameter the description allows but the stand-in
//! does not implement is answered 501 naming it, never silently ignored.

use serde_json::{json, Value};

use super::model::{Access, IssueSeed};
use super::render;
use super::state::{parse_rfc3339, CheckRunRow, Item, PullRow, Repo, ReviewCommentRow, State, StatusRow};

/// The longest comment body GitHub takes, in characters.
const MAX_COMMENT: usize = 65_536;

/// One request's inputs, already checked against the contract.
pub(crate) struct Ctx<'a> {
    pub op: &'static str,
    /// The decoded path segments (`repos`, owner, repo, …).
    pub segments: Vec<String>,
    pub query: &'a [(String, String)],
    pub body: Option<&'a Value>,
    /// `http://127.0.0.1:PORT/repos/…` without the query: where `Link`s point.
    pub link_base: String,
    pub access: Access,
    /// The token's user: who writes what the request writes.
    pub login: String,
}

impl Ctx<'_> {
    /// A query parameter.
    fn param(&self, name: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// `owner/repo` from the path.
    fn repo_name(&self) -> String {
        format!("{}/{}", self.segments.get(1).map_or("", |s| s), self.segments.get(2).map_or("", |s| s))
    }

    /// The issue number in the path (the contract checked it is an integer).
    pub(crate) fn number(&self) -> u64 {
        self.segments.get(4).and_then(|n| n.parse().ok()).unwrap_or(0)
    }

    /// A body field as text.
    fn text(&self, field: &str) -> Option<&str> {
        self.body.and_then(|b| b.get(field)).and_then(Value::as_str)
    }
}

/// An answer before the handler adds its headers.
pub(crate) struct Reply {
    pub status: u16,
    pub body: Value,
    pub headers: Vec<(String, String)>,
}

impl Reply {
    /// A JSON answer.
    pub(crate) fn new(status: u16, body: Value) -> Self {
        Self { status, body, headers: Vec::new() }
    }

    /// GitHub's `{"message": …}` error.
    pub(crate) fn error(status: u16, message: &str) -> Self {
        Self::new(status, render::error(message))
    }
}

/// Runs operation `ctx.op`.
pub(crate) fn route(state: &mut State, ctx: &Ctx) -> Reply {
    if ctx.op == "users/get-authenticated" {
        return Reply::new(200, render::viewer(&ctx.login));
    }
    let name = ctx.repo_name();
    if state.repo(&name).is_err() {
        return Reply::error(404, "Not Found");
    }
    let result = match ctx.op {
        "repos/get" => state.repo(&name).map(|r| Reply::new(200, render::repo(r, ctx.access))),
        "issues/list-for-repo" => state.repo(&name).map(|r| list_issues(r, ctx)),
        "issues/get" => state.repo(&name).map(|r| get_issue(r, ctx)),
        "issues/get-label" => state.repo(&name).map(|r| get_label(r, ctx)),
        "issues/list-comments" => state.repo(&name).map(|r| list_comments(r, ctx)),
        "issues/create-comment" => create_comment(state, &name, ctx),
        "issues/add-labels" => add_labels(state, &name, ctx),
        "issues/remove-label" => remove_label(state, &name, ctx),
        "pulls/list" => state.repo(&name).map(|r| list_pulls(r, ctx)),
        "pulls/create" => create_pull(state, &name, ctx),
        "issues/list-events" => state.repo(&name).map(|r| list_events(r, ctx)),
        "repos/get-collaborator-permission-level" => state.repo(&name).map(|r| permission(r, ctx)),
        "pulls/get" => state.repo(&name).map(|r| get_pull(r, ctx)),
        "pulls/list-reviews" => state.repo(&name).map(|r| list_reviews(r, ctx)),
        "pulls/list-review-comments" => state.repo(&name).map(|r| list_review_comments(r, ctx)),
        "pulls/create-reply-for-review-comment" => reply(state, &name, ctx),
        "checks/list-for-ref" => state.repo(&name).map(|r| list_check_runs(r, ctx)),
        "repos/get-combined-status-for-ref" => state.repo(&name).map(|r| combined_status(r, ctx)),
        other => Ok(Reply::error(501, &format!("the GitHub stand-in does not implement {other}"))),
    };
    result.unwrap_or_else(|e| Reply::error(404, &e))
}

/// Refuses the parameters the stand-in does not implement.
fn unimplemented(ctx: &Ctx, names: &[&str]) -> Option<Reply> {
    let name = names.iter().find(|n| ctx.param(n).is_some())?;
    Some(Reply::error(501, &format!("the GitHub stand-in does not implement the `{name}` parameter of {}", ctx.op)))
}

/// `per_page` (default 30) and `page` (default 1).
fn paging(ctx: &Ctx) -> (usize, usize) {
    let per_page = ctx.param("per_page").and_then(|p| p.parse().ok()).filter(|p| *p > 0).unwrap_or(30);
    let page = ctx.param("page").and_then(|p| p.parse().ok()).filter(|p| *p > 0).unwrap_or(1);
    (per_page, page)
}

/// One page of `all` with GitHub's `Link` header (`prev`, `next`, `last`, `first`).
fn paginate(ctx: &Ctx, all: Vec<Value>) -> Reply {
    let (per_page, page) = paging(ctx);
    let last = all.len().div_ceil(per_page).max(1);
    let items: Vec<Value> = all.into_iter().skip((page - 1).saturating_mul(per_page)).take(per_page).collect();
    let mut reply = Reply::new(200, Value::Array(items));
    let link = |to: usize, rel: &str| {
        let mut pairs: Vec<String> = ctx
            .query
            .iter()
            .filter(|(k, _)| k != "page")
            .map(|(k, v)| format!("{}={}", render::encode(k), render::encode(v)))
            .collect();
        pairs.push(format!("page={to}"));
        format!("<{}?{}>; rel=\"{rel}\"", ctx.link_base, pairs.join("&"))
    };
    let mut links = Vec::new();
    if page > 1 {
        links.push(link(page - 1, "prev"));
    }
    if page < last {
        links.push(link(page + 1, "next"));
        links.push(link(last, "last"));
    }
    if page > 1 {
        links.push(link(1, "first"));
    }
    if !links.is_empty() {
        reply.headers.push(("link".into(), links.join(", ")));
    }
    reply
}

/// Whether `item` passes the `issues/list-for-repo` filters.
fn issue_matches(item: &Item, ctx: &Ctx, since: Option<i64>) -> bool {
    let state_ok = match ctx.param("state").unwrap_or("open") {
        "all" => true,
        "closed" => !item.open,
        _ => item.open,
    };
    let labels_ok = ctx.param("labels").is_none_or(|wanted| {
        wanted
            .split(',')
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .all(|w| item.labels.iter().any(|l| l.eq_ignore_ascii_case(w)))
    });
    let assignee_ok = match ctx.param("assignee") {
        None => true,
        Some("none") => item.assignee.is_none(),
        Some("*") => item.assignee.is_some(),
        Some(login) => item.assignee.as_deref().is_some_and(|a| a.eq_ignore_ascii_case(login)),
    };
    state_ok && labels_ok && assignee_ok && since.is_none_or(|s| item.updated >= s)
}

/// `issues/list-for-repo`: issues and pull requests (with `pull_request`), filtered, sorted,
/// one page.
fn list_issues(repo: &Repo, ctx: &Ctx) -> Reply {
    if let Some(reply) = unimplemented(ctx, &["milestone", "type", "creator", "mentioned", "issue_field_values"]) {
        return reply;
    }
    let since = match ctx.param("since").map(parse_rfc3339).transpose() {
        Ok(since) => since,
        Err(e) => return Reply::error(422, &e),
    };
    let mut items: Vec<&Item> = repo.items.iter().filter(|i| issue_matches(i, ctx, since)).collect();
    let key = |i: &Item| match ctx.param("sort").unwrap_or("created") {
        "updated" => i.updated,
        "comments" => i.comments.len() as i64,
        _ => i.created,
    };
    items.sort_by_key(|i| (key(i), i.number));
    if ctx.param("direction").unwrap_or("desc") == "desc" {
        items.reverse();
    }
    paginate(ctx, items.into_iter().map(|i| render::issue(repo, i)).collect())
}

/// `issues/get`: one issue (or pull request) as it is now.
fn get_issue(repo: &Repo, ctx: &Ctx) -> Reply {
    repo.item(ctx.number()).map_or_else(|| Reply::error(404, "Not Found"), |i| Reply::new(200, render::issue(repo, i)))
}

/// `issues/get-label`.
fn get_label(repo: &Repo, ctx: &Ctx) -> Reply {
    let name = ctx.segments.get(4).map_or("", |s| s);
    repo.label(name).map_or_else(|| Reply::error(404, "Not Found"), |l| Reply::new(200, render::label(repo, l)))
}

/// `issues/list-comments`: oldest first, `since` on their update time.
fn list_comments(repo: &Repo, ctx: &Ctx) -> Reply {
    let Some(item) = repo.item(ctx.number()) else { return Reply::error(404, "Not Found") };
    let since = match ctx.param("since").map(parse_rfc3339).transpose() {
        Ok(since) => since,
        Err(e) => return Reply::error(422, &e),
    };
    let comments = item.comments.iter().filter(|c| since.is_none_or(|s| c.created >= s));
    paginate(ctx, comments.map(|c| render::comment(repo, item, c)).collect())
}

/// `issues/create-comment`: 201 with the comment; bumps the issue's `updated_at`.
fn create_comment(state: &mut State, name: &str, ctx: &Ctx) -> Result<Reply, String> {
    let number = ctx.number();
    if state.repo(name)?.item(number).is_none() {
        return Ok(Reply::error(404, "Not Found"));
    }
    let body = ctx.text("body").unwrap_or_default();
    if let Some(refused) = too_long("IssueComment", body) {
        return Ok(refused);
    }
    let comment = state.add_comment(name, number, &ctx.login, body)?;
    let repo = state.repo(name)?;
    let item = repo.item(number).ok_or("vanished")?;
    let row = item.comments.iter().find(|c| c.id == comment.id).ok_or("vanished")?;
    Ok(Reply::new(201, render::comment(repo, item, row)))
}

/// GitHub's 422 for a comment body over [`MAX_COMMENT`] characters (`resource` names its kind).
fn too_long(resource: &str, body: &str) -> Option<Reply> {
    if body.chars().count() <= MAX_COMMENT {
        return None;
    }
    let error = json!([{
        "resource": resource,
        "code": "custom",
        "field": "body",
        "message": format!("body is too long (maximum is {MAX_COMMENT} characters)"),
    }]);
    Some(Reply::new(422, render::validation_failed(error)))
}

/// `issues/add-labels`: adds (creating unknown labels); 200 with the issue's labels.
fn add_labels(state: &mut State, name: &str, ctx: &Ctx) -> Result<Reply, String> {
    let number = ctx.number();
    if state.repo(name)?.item(number).is_none() {
        return Ok(Reply::error(404, "Not Found"));
    }
    let wanted: Vec<String> = ctx
        .body
        .and_then(|b| b.get("labels"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|l| l.as_str().or_else(|| l.get("name").and_then(Value::as_str)))
        .map(str::to_string)
        .collect();
    if wanted.is_empty() {
        let error = json!([{ "resource": "Label", "code": "missing_field", "field": "labels" }]);
        return Ok(Reply::new(422, render::validation_failed(error)));
    }
    let mut names = Vec::new();
    for label in &wanted {
        names.push(state.ensure_label(name, label)?);
    }
    let current = state.repo(name)?.item(number).map(|i| i.labels.clone()).unwrap_or_default();
    if names.iter().any(|n| !current.contains(n)) {
        state.edit(name, number, |item| {
            for n in names {
                if !item.labels.contains(&n) {
                    item.labels.push(n);
                }
            }
        })?;
    }
    let repo = state.repo(name)?;
    Ok(Reply::new(200, render::labels_of(repo, repo.item(number).ok_or("vanished")?)))
}

/// `issues/remove-label`: 200 with the remaining labels; 404 when it is not on the issue.
fn remove_label(state: &mut State, name: &str, ctx: &Ctx) -> Result<Reply, String> {
    let number = ctx.number();
    let label = ctx.segments.get(6).cloned().unwrap_or_default();
    let Some(item) = state.repo(name)?.item(number) else { return Ok(Reply::error(404, "Not Found")) };
    if !item.labels.iter().any(|l| l.eq_ignore_ascii_case(&label)) {
        return Ok(Reply::error(404, "Label does not exist"));
    }
    state.edit(name, number, |item| item.labels.retain(|l| !l.eq_ignore_ascii_case(&label)))?;
    let repo = state.repo(name)?;
    Ok(Reply::new(200, render::labels_of(repo, repo.item(number).ok_or("vanished")?)))
}

/// The branch of a `head` (`owner:branch` or `branch`).
fn head_branch(head: &str) -> &str {
    head.split_once(':').map_or(head, |(_, branch)| branch)
}

/// `pulls/list`: `state`, `head` (`owner:branch`), `base`, sorted by creation (or update).
fn list_pulls(repo: &Repo, ctx: &Ctx) -> Reply {
    let sort = ctx.param("sort").unwrap_or("created");
    if sort != "created" && sort != "updated" {
        return Reply::error(501, &format!("the GitHub stand-in does not implement sort={sort} for pulls/list"));
    }
    let mut pulls: Vec<&Item> = repo
        .items
        .iter()
        .filter(|i| {
            let Some(pull) = &i.pull else { return false };
            let state_ok = match ctx.param("state").unwrap_or("open") {
                "all" => true,
                "closed" => !i.open,
                _ => i.open,
            };
            let head_ok = ctx.param("head").is_none_or(|h| {
                h.split_once(':').is_some_and(|(owner, b)| owner.eq_ignore_ascii_case(repo.owner()) && b == pull.head)
            });
            state_ok && head_ok && ctx.param("base").is_none_or(|b| b == pull.base)
        })
        .collect();
    pulls.sort_by_key(|i| (if sort == "updated" { i.updated } else { i.created }, i.number));
    if ctx.param("direction").unwrap_or("desc") == "desc" {
        pulls.reverse();
    }
    paginate(ctx, pulls.into_iter().map(|i| render::pull(repo, i)).collect())
}

/// `pulls/create`: 201, or GitHub's 422s for a missing base or head and a duplicate.
fn create_pull(state: &mut State, name: &str, ctx: &Ctx) -> Result<Reply, String> {
    if ctx.body.and_then(|b| b.get("issue")).is_some() || ctx.text("head_repo").is_some() {
        return Ok(Reply::error(501, "the GitHub stand-in does not implement `issue` or `head_repo` in pulls/create"));
    }
    let (head, base) = (ctx.text("head").unwrap_or_default(), ctx.text("base").unwrap_or_default());
    let branch = head_branch(head).to_string();
    let repo = state.repo(name)?;
    let invalid = |field: &str| {
        let error = json!([{ "resource": "PullRequest", "field": field, "code": "invalid" }]);
        Ok(Reply::new(422, render::validation_failed(error)))
    };
    if !repo.has_branch(base) {
        return invalid("base");
    }
    if !repo.has_branch(&branch) {
        return invalid("head");
    }
    if repo.items.iter().any(|i| i.open && i.pull.as_ref().is_some_and(|p| p.head == branch)) {
        let message = format!("A pull request already exists for {}:{branch}.", repo.owner());
        let error = json!([{ "resource": "PullRequest", "code": "custom", "message": message }]);
        return Ok(Reply::new(422, render::validation_failed(error)));
    }
    let seed = IssueSeed {
        title: ctx.text("title").unwrap_or_default().into(),
        body: ctx.text("body").map(str::to_string),
        labels: Vec::new(),
        assignee: None,
        user: None,
    };
    let draft = ctx.body.and_then(|b| b.get("draft")).and_then(Value::as_bool).unwrap_or(false);
    let number = state.open_item(name, &seed, Some(PullRow::new(branch, base.into(), draft)))?;
    let repo = state.repo(name)?;
    Ok(Reply::new(201, render::pull_full(repo, repo.item(number).ok_or("vanished")?)))
}

/// `issues/list-events`: the issue's events, oldest first, paginated.
fn list_events(repo: &Repo, ctx: &Ctx) -> Reply {
    let Some(item) = repo.item(ctx.number()) else { return Reply::error(404, "Not Found") };
    paginate(ctx, item.events.iter().map(|e| render::event(repo, e)).collect())
}

/// `repos/get-collaborator-permission-level`: `permission` (`maintain` answered as `write`,
/// `triage` as `read`), `role_name` and the user; 404 for a login GitHub does not know.
fn permission(repo: &Repo, ctx: &Ctx) -> Reply {
    let login = ctx.segments.get(4).map_or("", |s| s.as_str());
    if !repo.knows(login) {
        return Reply::error(404, &format!("{login} is not a user"));
    }
    let role = repo.role(login);
    let permission = match role {
        "maintain" => "write",
        "triage" => "read",
        other => other,
    };
    Reply::new(200, json!({ "permission": permission, "role_name": role, "user": render::user(login) }))
}

/// The pull request the path names (`None`: an issue, or nothing, which GitHub answers 404).
fn pull_in<'r>(repo: &'r Repo, ctx: &Ctx) -> Option<(&'r Item, &'r PullRow)> {
    repo.pull_of(ctx.number())
}

/// `pulls/get`: the pull request as it is now (merged or not, its head's sha now).
fn get_pull(repo: &Repo, ctx: &Ctx) -> Reply {
    pull_in(repo, ctx)
        .map_or_else(|| Reply::error(404, "Not Found"), |(i, _)| Reply::new(200, render::pull_full(repo, i)))
}

/// `pulls/list-reviews`: in the order they were submitted, paginated.
fn list_reviews(repo: &Repo, ctx: &Ctx) -> Reply {
    let Some((item, pull)) = pull_in(repo, ctx) else { return Reply::error(404, "Not Found") };
    paginate(ctx, pull.reviews.iter().map(|r| render::review(repo, item, r)).collect())
}

/// `pulls/list-review-comments`: by id (oldest first) unless `sort` is given (`direction`
/// counts only then, as documented); `since` on their update time. They are never edited,
/// so created and updated are one time.
fn list_review_comments(repo: &Repo, ctx: &Ctx) -> Reply {
    let Some((item, pull)) = pull_in(repo, ctx) else { return Reply::error(404, "Not Found") };
    let since = match ctx.param("since").map(parse_rfc3339).transpose() {
        Ok(since) => since,
        Err(e) => return Reply::error(422, &e),
    };
    let mut comments: Vec<&ReviewCommentRow> =
        pull.review_comments.iter().filter(|c| since.is_none_or(|s| c.created >= s)).collect();
    if ctx.param("sort").is_some() && ctx.param("direction") == Some("desc") {
        comments.sort_by_key(|c| std::cmp::Reverse((c.created, c.id)));
    }
    paginate(ctx, comments.into_iter().map(|c| render::review_comment(repo, item, c)).collect())
}

/// `pulls/create-reply-for-review-comment`: 201 with the reply, by the token's user, in the
/// thread of `comment_id`; 404 unless that is the first comment of a thread on this pull
/// request (GitHub: "Replies to replies are not supported", and documents no other error).
fn reply(state: &mut State, name: &str, ctx: &Ctx) -> Result<Reply, String> {
    let (number, body) = (ctx.number(), ctx.text("body").unwrap_or_default());
    let to = ctx.segments.get(6).and_then(|id| id.parse().ok()).unwrap_or(0);
    if let Some(refused) = too_long("PullRequestReviewComment", body) {
        return Ok(refused);
    }
    let Some(id) = state.reply(name, number, &ctx.login, to, body)? else { return Ok(Reply::error(404, "Not Found")) };
    let repo = state.repo(name)?;
    let (item, pull) = repo.pull_of(number).ok_or("vanished")?;
    let row = pull.review_comments.iter().find(|c| c.id == id).ok_or("vanished")?;
    Ok(Reply::new(201, render::review_comment(repo, item, row)))
}

/// The commit the `{ref}` in the path names, if the repository has it.
fn commit_of(repo: &Repo, ctx: &Ctx) -> Option<String> {
    ctx.segments.get(4).and_then(|r| repo.resolve_ref(r))
}

/// `checks/list-for-ref`: the commit's check runs, newest first (with `filter=latest`, the
/// default, only each name's latest), `{total_count, check_runs}` with one page of them.
fn list_check_runs(repo: &Repo, ctx: &Ctx) -> Reply {
    if let Some(reply) = unimplemented(ctx, &["app_id"]) {
        return reply;
    }
    let Some(sha) = commit_of(repo, ctx) else { return Reply::error(404, "Not Found") };
    let latest = ctx.param("filter").unwrap_or("latest") == "latest";
    // Every run the stand-in holds is completed.
    let status_ok = ctx.param("status").is_none_or(|s| s == "completed");
    let mut runs: Vec<&CheckRunRow> = repo
        .check_runs
        .iter()
        .filter(|r| status_ok && r.sha == sha && ctx.param("check_name").is_none_or(|n| n == r.name))
        .filter(|r| !latest || !repo.check_runs.iter().any(|o| o.sha == r.sha && o.name == r.name && o.id > r.id))
        .collect();
    runs.reverse();
    let total = runs.len();
    let mut reply = paginate(ctx, runs.into_iter().map(|r| render::check_run(repo, r)).collect());
    reply.body = json!({ "total_count": total, "check_runs": reply.body });
    reply
}

/// `repos/get-combined-status-for-ref`: each context's latest status (newest first, one page
/// of them) and their combined state: `failure` if any is `error` or `failure`, else `pending`
/// if there are none or any is `pending`, else `success`.
fn combined_status(repo: &Repo, ctx: &Ctx) -> Reply {
    let Some(sha) = commit_of(repo, ctx) else { return Reply::error(404, "Not Found") };
    let mut latest: Vec<&StatusRow> = repo
        .statuses
        .iter()
        .filter(|s| s.sha == sha)
        .filter(|s| !repo.statuses.iter().any(|o| o.sha == s.sha && o.context == s.context && o.id > s.id))
        .collect();
    latest.reverse();
    let state = if latest.iter().any(|s| s.state == "error" || s.state == "failure") {
        "failure"
    } else if latest.is_empty() || latest.iter().any(|s| s.state == "pending") {
        "pending"
    } else {
        "success"
    };
    let total = latest.len();
    let mut reply = paginate(ctx, latest.into_iter().map(|s| render::status(repo, s)).collect());
    let page = std::mem::take(&mut reply.body);
    reply.body = render::combined_status(repo, &sha, state, (page, total));
    reply
}
