//! A loopback stand-in for GitHub's REST API, so the engine's GitHub source is tested against
//! GitHub's contract rather than against a mock that agrees with whatever the client sends.
//!
//! Every request is checked against GitHub's published OpenAPI description (the vendored subset
//! in `contracts/github`, [`contract::check`]) before anything runs: a path, method, query
//! parameter or body field the description does not allow is refused with HTTP 400 and recorded
//! as rejected ([`GitHubStandIn::rejected`]; tests assert it stays empty), as is a request
//! without `User-Agent` or `X-GitHub-Api-Version: 2022-11-28`. What the description allows is
//! run over the stand-in's data with GitHub's documented behaviour: Bearer tokens (and tokens
//! that see no repository or may only read), the primary rate limit and its headers, weak ETags
//! with 304s that do not count, `Link` pagination, pull requests in the issue list, 422
//! `Validation Failed` shapes. Faults (a lost answer after the change was applied, a 5xx, a
//! secondary rate limit, a revoked token) can be injected per operation.
//!
//! # Layout
//! - `crate::http_server` (std-only HTTP/1.1, one thread per connection) → `handler` (contract,
//!   headers, token, faults, rate limit, access, ETag, recording) → `routes` (the operations)
//!   → `render` (GitHub's JSON shapes).
//! - `approvals` (roles, changes made as a given user, issue events and the permission
//!   answer), `reviews` (the review loop: head commits and pushes, merges, reviews, inline
//!   comments and replies, check runs, statuses, `author_association`), `contract` (the
//!   validator), `state` (the data, its changes and its clock), `shared` (what the threads
//!   share), `model` (the public types), `admin` (the binary's `/_admin/`).

mod admin;
mod approvals;
pub mod contract;
mod handler;
mod model;
mod render;
mod reviews;
mod routes;
mod shared;
mod state;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

pub use handler::API_VERSION;
pub use model::{Access, Comment, Fault, FaultKind, Issue, IssueSeed, Pull, Recorded, ReviewComment};
use serde_json::json;

use crate::http_server::{Server, WireAnswer};

/// How to start a stand-in beyond its token.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// The port on 127.0.0.1 (0: any free one).
    pub port: u16,
    /// Serve the `/_admin/` endpoints (the binary does, for the Python end-to-end test).
    pub admin: bool,
}

/// A running stand-in for `https://api.github.com`. Cheap to clone (all clones share one server
/// and its data); the server stops when the last clone is dropped.
///
/// The main token belongs to `ada` (id 1, name "Ada") and may do everything. No repository
/// exists until [`add_repo`](Self::add_repo). Methods naming a repository or an issue the
/// stand-in does not have panic: this is harness code, where a wrong name is the test's bug.
#[derive(Clone)]
pub struct GitHubStandIn {
    shared: Arc<shared::Shared>,
    server: Arc<Server>,
}

impl fmt::Debug for GitHubStandIn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never a token.
        f.debug_struct("GitHubStandIn").field("url", &self.url()).finish_non_exhaustive()
    }
}

impl GitHubStandIn {
    /// Starts a stand-in on a free loopback port that accepts `token` as `Authorization: Bearer
    /// <token>`.
    pub fn start(token: &str) -> Self {
        Self::start_with(token, Options::default()).expect("start the GitHub stand-in")
    }

    /// Starts a stand-in with [`Options`].
    pub fn start_with(token: &str, options: Options) -> io::Result<Self> {
        let shared = Arc::new(shared::Shared::new(token, options.admin));
        // Parse the contract now rather than inside the first request's timeout.
        let _ = contract::operation_ids();
        let serving = shared.clone();
        let handler = Box::new(move |request: &_| handler::handle(&serving, request));
        let server = Server::start("github-standin", options.port, handler, malformed)?;
        let _ = shared.addr.set(server.addr());
        Ok(Self { shared, server: Arc::new(server) })
    }

    /// `http://127.0.0.1:PORT`: the API base URL (what the engine's GitHub endpoint takes in
    /// place of `https://api.github.com`).
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// Accepts another token of the main user with this access from now on.
    pub fn add_token(&self, token: &str, access: Access) {
        self.add_token_of(token, access, state::VIEWER);
    }

    /// Accepts another token, of user `login`, with this access from now on: what it writes
    /// is written by `login`, and `GET /user` names `login`.
    pub fn add_token_of(&self, token: &str, access: Access, login: &str) {
        let mut control = self.shared.control();
        control.tokens.retain(|h| h.token != token);
        control.tokens.push(shared::Holder { token: token.into(), access, login: login.to_lowercase() });
    }

    /// Stops accepting `token` (as after a revocation).
    pub fn revoke_token(&self, token: &str) {
        self.shared.control().tokens.retain(|h| h.token != token);
    }

    /// Adds a repository `owner/name` (default branch `main`; every branch exists except those
    /// [`delete_branch`](Self::delete_branch) removes).
    pub fn add_repo(&self, repo: &str) {
        self.shared.state().add_repo(repo, None).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Adds a repository whose branches are those of the bare git repository at `git_dir`
    /// (`pulls/create` checks `head` and `base` there).
    pub fn add_repo_with_git(&self, repo: &str, git_dir: &Path) {
        self.shared.state().add_repo(repo, Some(git_dir.to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Makes a branch not exist (for a repository without a git directory).
    pub fn delete_branch(&self, repo: &str, branch: &str) {
        let mut state = self.shared.state();
        let repo = state.repo_mut(repo).unwrap_or_else(|e| panic!("{e}"));
        assert!(repo.git.is_none(), "{} has a git directory: delete the branch there", repo.full_name);
        repo.deleted_branches.insert(branch.into());
    }

    /// Adds a label to a repository (if it is new).
    pub fn add_label(&self, repo: &str, name: &str) {
        self.shared.state().ensure_label(repo, name).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Opens an issue, as a person would on GitHub; its number (shared with pull requests).
    pub fn open_issue(&self, repo: &str, seed: IssueSeed) -> u64 {
        self.shared.state().open_item(repo, &seed, None).unwrap_or_else(|e| panic!("{e}"))
    }

    /// An issue (or a pull request's issue side) as it is now.
    pub fn issue(&self, repo: &str, number: u64) -> Issue {
        let state = self.shared.state();
        let repo = state.repo(repo).unwrap_or_else(|e| panic!("{e}"));
        let item = repo.item(number).unwrap_or_else(|| panic!("{} has no issue #{number}", repo.full_name));
        repo.issue(item)
    }

    /// Closes an issue, or a pull request without merging it (bumps `updated_at`).
    pub fn close_issue(&self, repo: &str, number: u64) -> Issue {
        self.edit(repo, number, |i| i.open = false)
    }

    /// Reopens an issue (bumps `updated_at`).
    pub fn reopen_issue(&self, repo: &str, number: u64) -> Issue {
        self.edit(repo, number, |i| i.open = true)
    }

    /// Replaces an issue's labels, creating unknown ones (bumps `updated_at`).
    pub fn set_labels(&self, repo: &str, number: u64, labels: &[&str]) -> Issue {
        self.shared.state().set_labels(repo, number, labels).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Replaces an issue's body (bumps `updated_at`).
    pub fn edit_body(&self, repo: &str, number: u64, body: Option<&str>) -> Issue {
        let body = body.map(str::to_string);
        self.edit(repo, number, |i| i.body = body)
    }

    /// Gives `login` a role on `repo`: `admin`, `maintain`, `write`, `triage` or `read` (anyone
    /// not given one has `read`, as on a public repository).
    pub fn set_role(&self, repo: &str, login: &str, role: &str) {
        self.shared.state().set_role(repo, login, role).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Applies `label` as `login` (a `labeled` event naming them); refused, as GitHub refuses
    /// it, unless they have triage access.
    pub fn label_as(&self, repo: &str, number: u64, label: &str, login: &str) -> Result<(), String> {
        self.shared.state().label_as(repo, number, label, login, true)
    }

    /// Removes `label` as `login` (an `unlabeled` event); needs triage access.
    pub fn unlabel_as(&self, repo: &str, number: u64, label: &str, login: &str) -> Result<(), String> {
        self.shared.state().label_as(repo, number, label, login, false)
    }

    /// Replaces the body as `login`, who must be the author or have write access (no event:
    /// GitHub records none for an edit).
    pub fn edit_as(&self, repo: &str, number: u64, login: &str, body: &str) -> Result<(), String> {
        self.shared.state().edit_as(repo, number, login, None, Some(body.to_string()))
    }

    /// Closes (`open` false) or reopens the issue as `login`: the author, or triage access.
    pub fn set_open_as(&self, repo: &str, number: u64, login: &str, open: bool) -> Result<(), String> {
        self.shared.state().set_open_as(repo, number, login, open)
    }

    /// Comments on an issue as another user, `login` (bumps `updated_at`).
    pub fn comment_as(&self, repo: &str, number: u64, login: &str, body: &str) -> Comment {
        self.shared.state().add_comment(repo, number, login, body).unwrap_or_else(|e| panic!("{e}"))
    }

    /// One change to an item; bumps its `updated_at`.
    fn edit(&self, repo: &str, number: u64, change: impl FnOnce(&mut state::Item)) -> Issue {
        self.shared.state().edit(repo, number, change).unwrap_or_else(|e| panic!("{e}"))
    }

    /// An issue's comments, oldest first.
    pub fn comments(&self, repo: &str, number: u64) -> Vec<Comment> {
        let state = self.shared.state();
        let repo = state.repo(repo).unwrap_or_else(|e| panic!("{e}"));
        let item = repo.item(number).unwrap_or_else(|| panic!("{} has no issue #{number}", repo.full_name));
        item.comments.iter().map(|c| repo.comment(item, c)).collect()
    }

    /// An issue's label names, in the order they were added.
    pub fn labels_of(&self, repo: &str, number: u64) -> Vec<String> {
        self.issue(repo, number).labels
    }

    /// A repository's pull requests, oldest first.
    pub fn pulls(&self, repo: &str) -> Vec<Pull> {
        let state = self.shared.state();
        let repo = state.repo(repo).unwrap_or_else(|e| panic!("{e}"));
        repo.items.iter().filter_map(|i| repo.pull(i)).collect()
    }

    /// Merges pull request `number` as the main token's user: `closed`, `merged` true,
    /// `merged_at` set, `merged` and `closed` events (bumps `updated_at`). Panics if it is not
    /// open. ([`close_issue`](Self::close_issue) closes a pull request without merging it.)
    pub fn merge_pull(&self, repo: &str, number: u64) {
        self.shared.state().merge_pull(repo, number).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Pushes a new commit to pull request `number`'s head: its made-up `head.sha` changes
    /// (bumps `updated_at`). For a repository added with a git directory, push to the branch
    /// there instead: `head.sha` is read from it.
    pub fn push_head(&self, repo: &str, number: u64) {
        self.shared.state().push_head(repo, number).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Submits a review of pull request `number` as `login`: `state` is `CHANGES_REQUESTED`,
    /// `COMMENTED` or `APPROVED` (its author may only comment, as on GitHub), with inline
    /// `comments` as `(path, line, body)` on the head commit (bumps `updated_at`). The review's
    /// id and its comments' ids, in order.
    pub fn review(
        &self,
        repo: &str,
        number: u64,
        login: &str,
        state: &str,
        body: &str,
        comments: &[(&str, u64, &str)],
    ) -> (u64, Vec<u64>) {
        self.shared.state().review(repo, number, login, (state, body), comments).unwrap_or_else(|e| panic!("{e}"))
    }

    /// One inline comment by `login` on `path` at `line` of pull request `number`'s head: as
    /// on GitHub, a `COMMENTED` review of its own with an empty body (bumps `updated_at`). The
    /// comment's id.
    pub fn review_comment(&self, repo: &str, number: u64, login: &str, path: &str, line: u64, body: &str) -> u64 {
        let (_, ids) = self.review(repo, number, login, "COMMENTED", "", &[(path, line, body)]);
        ids[0]
    }

    /// Pull request `number`'s inline comments and their replies, oldest first.
    pub fn review_comments(&self, repo: &str, number: u64) -> Vec<ReviewComment> {
        let state = self.shared.state();
        let repo = state.repo(repo).unwrap_or_else(|e| panic!("{e}"));
        let (item, _) =
            repo.pull_of(number).unwrap_or_else(|| panic!("{} has no pull request #{number}", repo.full_name));
        repo.review_comments(item)
    }

    /// A completed check run `name` on pull request `number`'s head commit, with `conclusion`
    /// (`success`, `failure`, `neutral`, `cancelled`, `skipped`, `timed_out` or
    /// `action_required`) and its output. Its id. A check run belongs to the commit: it does
    /// not bump the pull request's `updated_at`, and a new head does not have it.
    #[allow(clippy::too_many_arguments)] // The check run's own fields, named at the call.
    pub fn check_run(
        &self,
        repo: &str,
        number: u64,
        name: &str,
        conclusion: &str,
        title: &str,
        summary: &str,
        text: &str,
    ) -> u64 {
        let output = (title, summary, text);
        self.shared.state().check_run(repo, number, (name, conclusion), output).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A commit status of `context` on pull request `number`'s head commit: `state` is
    /// `error`, `failure`, `pending` or `success`. Its id. Like a check run, it belongs to the
    /// commit.
    pub fn commit_status(&self, repo: &str, number: u64, context: &str, state: &str, description: &str) -> u64 {
        let status = (state, description);
        self.shared.state().commit_status(repo, number, context, status).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Plays `fault` for the next `fault.times` requests of `fault.op`, in injection order.
    pub fn inject(&self, fault: Fault) {
        assert!(contract::operation_ids().contains(&fault.op), "no operation {} in the contract", fault.op);
        if fault.times > 0 {
            self.shared.control().faults.push(fault);
        }
    }

    /// Holds the next request of operation `op` at a gate, answered once the test opens it
    /// (see [`crate::gate`]): the test changes the data between two calls of the client.
    pub fn gate(&self, op: &'static str) -> Arc<crate::gate::Gate> {
        assert!(contract::operation_ids().contains(&op), "no operation {op} in the contract");
        let gate = Arc::new(crate::gate::Gate::default());
        self.shared.control().gates.push((op, gate.clone()));
        gate
    }

    /// Disarms every injected fault.
    pub fn clear_faults(&self) {
        self.shared.control().faults.clear();
    }

    /// Sets the primary rate limit's remaining requests and its reset (epoch seconds).
    pub fn set_rate(&self, remaining: u64, reset_at_epoch_s: i64) {
        let mut control = self.shared.control();
        control.rate.remaining = remaining.min(shared::RATE_LIMIT);
        control.rate.reset = reset_at_epoch_s;
    }

    /// The primary rate limit's remaining requests.
    pub fn rate_remaining(&self) -> u64 {
        self.shared.control().rate.remaining
    }

    /// Moves the stand-in's clock forward (later changes get later `updated_at`s).
    pub fn advance_clock(&self, by: std::time::Duration) {
        self.shared.state().advance(by);
    }

    /// Starts the stand-in's clock `by` in the past, before anything is added: what a test
    /// adds then has a long past, and [`GitHubStandIn::advance_clock`] brings it back.
    pub fn rewind_clock(&self, by: std::time::Duration) {
        self.shared.state().rewind(by).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Every request so far, oldest first.
    pub fn recorded(&self) -> Vec<Recorded> {
        self.shared.control().log.clone()
    }

    /// How many requests of operation `op` arrived (answered, refused or faulted).
    pub fn count(&self, op: &str) -> usize {
        self.shared.control().log.iter().filter(|r| r.op == op).count()
    }

    /// The requests refused because GitHub's description (or its required headers) does not
    /// allow them: what the engine sent that GitHub would refuse. Tests assert this is empty.
    pub fn rejected(&self) -> Vec<Recorded> {
        self.shared.control().log.iter().filter(|r| r.rejected).cloned().collect()
    }
}

/// GitHub's answer to a request that is not HTTP it can read.
fn malformed(message: &str) -> WireAnswer {
    WireAnswer::json(400, &json!({ "message": message }))
}
