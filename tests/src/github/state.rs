//! The GitHub stand-in's data: repositories with their labels, branches and items (issues and
//! pull requests share one number sequence per repository, as on GitHub), and every change the
//! tests or the API make to it. A change to an issue (state, body, labels, a comment) bumps its
//! `updated_at`, as GitHub does, and a change of its labels or state is an issue event
//! (`labeled`, `unlabeled`, `closed`, `reopened`) naming who made it. An edit of the text is
//! no event: GitHub records none. A pull request also holds its reviews and inline comments;
//! check runs and statuses belong to the repository's commits (the review loop: `reviews`).
//!
//! # Time
//! GitHub writes timestamps in whole seconds and compares `since` at seconds precision, so the
//! stand-in's clock counts whole seconds: wall time plus an offset the tests can advance, and
//! each change gets a second strictly after the previous change's (it runs ahead of the wall
//! clock when changes come faster than one a second). So two changes never share an
//! `updated_at`, and `since=<an item's updated_at>` returns that item and everything changed
//! after it, never an item changed earlier.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::model::{Comment, Issue, IssueSeed, Pull};

/// The login of the main token's user.
pub(crate) const VIEWER: &str = "ada";

/// A label of a repository.
pub(crate) struct LabelRow {
    pub id: u64,
    pub name: String,
    pub color: String,
}

/// A comment on an item.
pub(crate) struct CommentRow {
    pub id: u64,
    pub body: String,
    pub user: String,
    pub created: i64,
}

/// An issue event: who applied or removed which label, or closed or reopened the issue.
pub(crate) struct EventRow {
    pub id: u64,
    /// `labeled`, `unlabeled`, `closed` or `reopened`.
    pub event: &'static str,
    pub actor: String,
    pub label: Option<String>,
    pub created: i64,
}

/// What makes an item a pull request.
pub(crate) struct PullRow {
    pub head: String,
    pub base: String,
    pub draft: bool,
    /// When it was merged (it was closed then too).
    pub merged: Option<i64>,
    /// Commits pushed to the head since it was opened: what its made-up sha is made of, for a
    /// repository without a git directory.
    pub pushes: u64,
    /// Its reviews, oldest first.
    pub reviews: Vec<ReviewRow>,
    /// Its inline comments and their replies, oldest first.
    pub review_comments: Vec<ReviewCommentRow>,
}

impl PullRow {
    /// A pull request just opened from `head` into `base`.
    pub(crate) fn new(head: String, base: String, draft: bool) -> Self {
        Self { head, base, draft, merged: None, pushes: 0, reviews: Vec::new(), review_comments: Vec::new() }
    }
}

/// A submitted review of a pull request.
pub(crate) struct ReviewRow {
    pub id: u64,
    pub user: String,
    pub body: String,
    /// `APPROVED`, `CHANGES_REQUESTED` or `COMMENTED`.
    pub state: String,
    /// The head's sha when it was submitted.
    pub commit_id: String,
    pub submitted: i64,
}

/// An inline comment on a pull request's diff, or a reply in its thread.
pub(crate) struct ReviewCommentRow {
    pub id: u64,
    /// The review it was submitted with (a reply is a review of its own, as on GitHub).
    pub review_id: u64,
    pub user: String,
    pub body: String,
    pub path: String,
    pub line: u64,
    /// The thread's first comment, for a reply.
    pub in_reply_to: Option<u64>,
    /// The head's sha when the thread was started.
    pub commit_id: String,
    pub created: i64,
}

/// A completed check run on a commit.
pub(crate) struct CheckRunRow {
    pub id: u64,
    pub sha: String,
    pub name: String,
    /// `success`, `failure`, `neutral`, …
    pub conclusion: String,
    pub title: String,
    pub summary: String,
    pub text: String,
    pub completed: i64,
}

/// A commit status (one context's state on a commit).
pub(crate) struct StatusRow {
    pub id: u64,
    pub sha: String,
    pub context: String,
    /// `error`, `failure`, `pending` or `success`.
    pub state: String,
    pub description: String,
    pub created: i64,
}

/// An issue or a pull request.
pub(crate) struct Item {
    pub id: u64,
    pub number: u64,
    pub title: String,
    pub body: Option<String>,
    pub open: bool,
    pub labels: Vec<String>,
    pub assignee: Option<String>,
    pub user: String,
    pub created: i64,
    pub updated: i64,
    pub closed: Option<i64>,
    pub comments: Vec<CommentRow>,
    pub pull: Option<PullRow>,
    /// Its issue events, oldest first.
    pub events: Vec<EventRow>,
}

/// A repository.
pub(crate) struct Repo {
    pub id: u64,
    /// `acme/webapp`, as added.
    pub full_name: String,
    pub default_branch: String,
    /// A bare git repository whose `refs/heads/*` are the branches.
    pub git: Option<PathBuf>,
    /// Without `git`: the branches that do not exist (all others do).
    pub deleted_branches: BTreeSet<String>,
    pub labels: Vec<LabelRow>,
    /// By number - 1.
    pub items: Vec<Item>,
    /// Each collaborator's role (`admin`, `maintain`, `write`, `triage`, `read`), by
    /// lowercase login; the main token's user is `admin`.
    pub collaborators: BTreeMap<String, String>,
    /// Check runs on its commits, oldest first.
    pub check_runs: Vec<CheckRunRow>,
    /// Statuses on its commits, oldest first.
    pub statuses: Vec<StatusRow>,
}

impl Repo {
    /// The owner part of the full name.
    pub(crate) fn owner(&self) -> &str {
        self.full_name.split('/').next().unwrap_or_default()
    }

    /// `https://github.com/acme/webapp`.
    pub(crate) fn html_url(&self) -> String {
        format!("https://github.com/{}", self.full_name)
    }

    /// Whether branch `name` exists.
    pub(crate) fn has_branch(&self, name: &str) -> bool {
        match &self.git {
            Some(git) => Command::new("git")
                .arg(format!("--git-dir={}", git.display()))
                .args(["rev-parse", "--quiet", "--verify", &format!("refs/heads/{name}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
            None => !name.is_empty() && !self.deleted_branches.contains(name),
        }
    }

    /// A label by name (case-insensitive, as GitHub matches them).
    pub(crate) fn label(&self, name: &str) -> Option<&LabelRow> {
        self.labels.iter().find(|l| l.name.eq_ignore_ascii_case(name))
    }

    /// An item by number.
    pub(crate) fn item(&self, number: u64) -> Option<&Item> {
        usize::try_from(number).ok().and_then(|n| n.checked_sub(1)).and_then(|i| self.items.get(i))
    }

    /// An item by number, to change.
    pub(crate) fn item_mut(&mut self, number: u64) -> Option<&mut Item> {
        usize::try_from(number).ok().and_then(|n| n.checked_sub(1)).and_then(|i| self.items.get_mut(i))
    }

    /// The item's snapshot.
    pub(crate) fn issue(&self, item: &Item) -> Issue {
        let kind = if item.pull.is_some() { "pull" } else { "issues" };
        Issue {
            number: item.number,
            title: item.title.clone(),
            body: item.body.clone(),
            state: state_name(item.open).into(),
            labels: item.labels.clone(),
            assignee: item.assignee.clone(),
            html_url: format!("{}/{kind}/{}", self.html_url(), item.number),
            created_at: rfc3339(item.created),
            updated_at: rfc3339(item.updated),
            comments: item.comments.len(),
            is_pull: item.pull.is_some(),
        }
    }

    /// The pull request's snapshot (`None` for an issue).
    pub(crate) fn pull(&self, item: &Item) -> Option<Pull> {
        let pull = item.pull.as_ref()?;
        Some(Pull {
            id: item.id,
            number: item.number,
            title: item.title.clone(),
            body: item.body.clone(),
            head: pull.head.clone(),
            base: pull.base.clone(),
            draft: pull.draft,
            state: state_name(item.open).into(),
            html_url: format!("{}/pull/{}", self.html_url(), item.number),
            merged: pull.merged.is_some(),
            head_sha: self.head_sha(pull),
        })
    }

    /// A comment's snapshot.
    pub(crate) fn comment(&self, item: &Item, comment: &CommentRow) -> Comment {
        Comment {
            id: comment.id,
            body: comment.body.clone(),
            user: comment.user.clone(),
            html_url: format!("{}/issues/{}#issuecomment-{}", self.html_url(), item.number, comment.id),
            created_at: rfc3339(comment.created),
        }
    }
}

/// `open` or `closed`.
pub(crate) fn state_name(open: bool) -> &'static str {
    if open {
        "open"
    } else {
        "closed"
    }
}

/// Everything the stand-in holds.
#[derive(Default)]
pub(crate) struct State {
    /// Seconds added to the wall clock.
    offset_s: i64,
    /// The last second a change was given.
    last_s: i64,
    next_id: u64,
    /// By lowercase full name (GitHub's names are case-insensitive).
    pub repos: BTreeMap<String, Repo>,
}

impl State {
    /// The stand-in's current time, in epoch seconds.
    pub(crate) fn now(&self) -> i64 {
        wall_s() + self.offset_s
    }

    /// The time of a change: now, or one second after the previous change.
    pub(crate) fn tick(&mut self) -> i64 {
        self.last_s = self.now().max(self.last_s + 1);
        self.last_s
    }

    /// Moves the clock forward.
    pub(crate) fn advance(&mut self, by: Duration) {
        self.offset_s += i64::try_from(by.as_secs()).unwrap_or(0);
    }

    /// Moves the clock back, before any change was given a time (after one, changes could
    /// not go back: each is strictly after the previous).
    pub(crate) fn rewind(&mut self, by: Duration) -> Result<(), String> {
        if self.last_s != 0 {
            return Err("the clock goes back only before the first change".into());
        }
        self.offset_s -= i64::try_from(by.as_secs()).unwrap_or(0);
        Ok(())
    }

    /// A fresh id (issues, pulls, comments and labels share one sequence).
    pub(crate) fn id(&mut self) -> u64 {
        self.next_id += 1;
        1000 + self.next_id
    }

    /// Adds a repository (`owner/name`); adding it again changes nothing but the git path.
    pub(crate) fn add_repo(&mut self, full_name: &str, git: Option<PathBuf>) -> Result<(), String> {
        let valid = full_name.split('/').count() == 2 && full_name.split('/').all(|p| !p.is_empty());
        if !valid {
            return Err(format!("a repository is owner/name, not {full_name:?}"));
        }
        let id = self.id();
        let repo = self.repos.entry(full_name.to_lowercase()).or_insert_with(|| Repo {
            id,
            full_name: full_name.into(),
            default_branch: "main".into(),
            git: None,
            deleted_branches: BTreeSet::new(),
            labels: Vec::new(),
            items: Vec::new(),
            collaborators: BTreeMap::from([(VIEWER.to_string(), "admin".to_string())]),
            check_runs: Vec::new(),
            statuses: Vec::new(),
        });
        if git.is_some() {
            repo.git = git;
        }
        Ok(())
    }

    /// A repository by full name.
    pub(crate) fn repo(&self, full_name: &str) -> Result<&Repo, String> {
        self.repos.get(&full_name.to_lowercase()).ok_or_else(|| format!("the stand-in has no repository {full_name}"))
    }

    /// A repository by full name, to change.
    pub(crate) fn repo_mut(&mut self, full_name: &str) -> Result<&mut Repo, String> {
        self.repos
            .get_mut(&full_name.to_lowercase())
            .ok_or_else(|| format!("the stand-in has no repository {full_name}"))
    }

    /// The label's name as the repository spells it, creating it if it is new.
    pub(crate) fn ensure_label(&mut self, repo: &str, name: &str) -> Result<String, String> {
        let id = self.id();
        let repo = self.repo_mut(repo)?;
        if let Some(label) = repo.label(name) {
            return Ok(label.name.clone());
        }
        repo.labels.push(LabelRow { id, name: name.into(), color: "ededed".into() });
        Ok(name.into())
    }

    /// Opens an issue (or, with `pull`, a pull request) as `seed.user` (default: the main
    /// token's user); its number. Its labels are applied by its author, who must be allowed to.
    pub(crate) fn open_item(&mut self, repo: &str, seed: &IssueSeed, pull: Option<PullRow>) -> Result<u64, String> {
        let author = seed.user.clone().unwrap_or_else(|| VIEWER.to_string());
        if !seed.labels.is_empty() {
            self.repo(repo)?.may(&author, TRIAGE)?;
        }
        let mut labels = Vec::new();
        for name in &seed.labels {
            let name = self.ensure_label(repo, name)?;
            if !labels.contains(&name) {
                labels.push(name);
            }
        }
        let (id, at) = (self.id(), self.tick());
        let events: Vec<EventRow> = labels
            .iter()
            .map(|l| EventRow { id: 0, event: "labeled", actor: author.clone(), label: Some(l.clone()), created: at })
            .collect();
        let events = events.into_iter().map(|e| EventRow { id: self.id(), ..e }).collect();
        let repo = self.repo_mut(repo)?;
        let number = repo.items.len() as u64 + 1;
        repo.items.push(Item {
            id,
            number,
            title: seed.title.clone(),
            body: seed.body.clone(),
            open: true,
            labels,
            assignee: seed.assignee.clone(),
            user: author,
            created: at,
            updated: at,
            closed: None,
            comments: Vec::new(),
            pull,
            events,
        });
        Ok(number)
    }

    /// Changes item `number` as the main token's user and bumps its `updated_at`.
    pub(crate) fn edit(&mut self, repo: &str, number: u64, change: impl FnOnce(&mut Item)) -> Result<Issue, String> {
        self.edit_by(repo, number, VIEWER, change)
    }

    /// Changes item `number` as `actor`, bumps its `updated_at`, and records the events of
    /// the change (labels applied or removed, closed, reopened).
    pub(crate) fn edit_by(
        &mut self,
        repo: &str,
        number: u64,
        actor: &str,
        change: impl FnOnce(&mut Item),
    ) -> Result<Issue, String> {
        let at = self.tick();
        self.repo(repo)?;
        let State { next_id, repos, .. } = self;
        let repo = repos.get_mut(&repo.to_lowercase()).ok_or("vanished")?;
        let full_name = repo.full_name.clone();
        let item = repo.item_mut(number).ok_or_else(|| format!("{full_name} has no issue #{number}"))?;
        let (labels, open) = (item.labels.clone(), item.open);
        // Before the change, so what it adds (a comment, a review) is timed by the same bump.
        item.updated = at;
        change(item);
        for e in events_of_change(&labels, open, item, actor, at) {
            *next_id += 1;
            item.events.push(EventRow { id: 1000 + *next_id, ..e });
        }
        if !item.open && item.closed.is_none() {
            item.closed = Some(at);
        } else if item.open {
            item.closed = None;
        }
        let repo = &*repo;
        Ok(repo.issue(repo.item(number).ok_or("vanished")?))
    }

    /// Replaces an item's labels (creating unknown ones).
    pub(crate) fn set_labels(&mut self, repo: &str, number: u64, labels: &[&str]) -> Result<Issue, String> {
        let mut names = Vec::new();
        for label in labels {
            let name = self.ensure_label(repo, label)?;
            if !names.contains(&name) {
                names.push(name);
            }
        }
        self.edit(repo, number, |item| item.labels = names)
    }

    /// Adds a comment by `user`; it bumps the item's `updated_at`.
    pub(crate) fn add_comment(&mut self, repo: &str, number: u64, user: &str, body: &str) -> Result<Comment, String> {
        let id = self.id();
        let mut created = 0;
        self.edit(repo, number, |item| {
            created = item.updated;
            item.comments.push(CommentRow { id, body: body.into(), user: user.into(), created });
        })?;
        let repo = self.repo(repo)?;
        let item = repo.item(number).ok_or("vanished")?;
        let comment = item.comments.last().ok_or("vanished")?;
        Ok(repo.comment(item, comment))
    }
}

/// The roles, weakest first.
pub(crate) const ROLES: [&str; 5] = ["read", "triage", "write", "maintain", "admin"];
/// What applying a label needs.
pub(crate) const TRIAGE: &str = "triage";
/// What editing someone else's issue needs.
pub(crate) const WRITE: &str = "write";

impl Repo {
    /// `login`'s role here (`read` for anyone else: a public repository).
    pub(crate) fn role(&self, login: &str) -> &str {
        self.collaborators.get(&login.to_lowercase()).map_or("read", String::as_str)
    }

    /// Whether `login` has at least `role`; an error saying what they lack otherwise.
    pub(crate) fn may(&self, login: &str, role: &str) -> Result<(), String> {
        let rank = |r: &str| ROLES.iter().position(|x| *x == r).unwrap_or(0);
        if rank(self.role(login)) >= rank(role) {
            Ok(())
        } else {
            Err(format!("{login} has {} access to {}; this needs {role}", self.role(login), self.full_name))
        }
    }
}

/// The events a change of `item` by `actor` at `at` records: each label removed and applied
/// (against `labels` before), and a close or reopen (against `open` before). Ids come later.
pub(crate) fn events_of_change(labels: &[String], open: bool, item: &Item, actor: &str, at: i64) -> Vec<EventRow> {
    let event = |event: &'static str, label: Option<&String>| EventRow {
        id: 0,
        event,
        actor: actor.to_string(),
        label: label.cloned(),
        created: at,
    };
    let mut out: Vec<EventRow> =
        labels.iter().filter(|l| !item.labels.contains(l)).map(|l| event("unlabeled", Some(l))).collect();
    out.extend(item.labels.iter().filter(|l| !labels.contains(l)).map(|l| event("labeled", Some(l))));
    if open != item.open {
        out.push(event(if item.open { "reopened" } else { "closed" }, None));
    }
    out
}

/// The wall clock in epoch seconds.
fn wall_s() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_secs()).unwrap_or(0)
}

/// `2026-12-02T10:00:00Z`: how GitHub writes a timestamp.
pub(crate) fn rfc3339(s: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_secs(u64::try_from(s).unwrap_or(0));
    humantime::format_rfc3339_seconds(at).to_string()
}

/// A `since` value as epoch seconds (a fraction is dropped: GitHub compares whole seconds).
pub(crate) fn parse_rfc3339(text: &str) -> Result<i64, String> {
    let at = humantime::parse_rfc3339(text).map_err(|e| format!("{text:?} is not a timestamp: {e}"))?;
    let since = at.duration_since(UNIX_EPOCH).map_err(|_| format!("{text:?} is before 1970"))?;
    i64::try_from(since.as_secs()).map_err(|_| format!("{text:?} is out of range"))
}
