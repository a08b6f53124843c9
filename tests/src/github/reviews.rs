//! The review loop's data: a pull request's head commit (and a push that moves it), its merge,
//! its reviews and inline comments (and replies in their threads), the check runs and statuses
//! on its head, and how each author is related to the repository (`author_association`). The
//! rows are in `state`; the operations that read them in `routes`, their shapes in `render`.
//!
//! GitHub's rules as documented: a review is `APPROVED`, `CHANGES_REQUESTED` or `COMMENTED`,
//! and a pull request's author may neither approve it nor request changes on it. A single
//! inline comment is submitted as a `COMMENTED` review of its own, and so is each reply. A
//! reply goes to a thread's first comment ("Replies to replies are not supported"). A review or
//! an inline comment bumps the pull request's `updated_at`; a check run or a status does not
//! (they belong to the commit, not to the pull request).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::process::{Command, Stdio};

use super::model::{Issue, ReviewComment};
use super::state::{CheckRunRow, EventRow, Item, PullRow, Repo, ReviewCommentRow, ReviewRow, State, StatusRow, VIEWER};

/// The states a submitted review has.
const REVIEW_STATES: [&str; 3] = ["APPROVED", "CHANGES_REQUESTED", "COMMENTED"];
/// A completed check run's conclusions.
const CONCLUSIONS: [&str; 7] =
    ["success", "failure", "neutral", "cancelled", "skipped", "timed_out", "action_required"];
/// A commit status's states.
const STATUS_STATES: [&str; 4] = ["error", "failure", "pending", "success"];

impl Repo {
    /// How `login` is related to the repository, as `author_association` says: the owner (the
    /// main token's user, or the owner part of the name), a collaborator (a role above `read`),
    /// or none.
    pub(crate) fn association(&self, login: &str) -> &'static str {
        if login.eq_ignore_ascii_case(VIEWER) || login.eq_ignore_ascii_case(self.owner()) {
            "OWNER"
        } else if self.role(login) != "read" {
            "COLLABORATOR"
        } else {
            "NONE"
        }
    }

    /// Pull request `number`: its item and what makes it one.
    pub(crate) fn pull_of(&self, number: u64) -> Option<(&Item, &PullRow)> {
        self.item(number).and_then(|item| Some((item, item.pull.as_ref()?)))
    }

    /// The commit the pull request's head is at now: the branch in the git directory (so a push
    /// there moves it), else a made-up sha that each [`State::push_head`] changes.
    pub(crate) fn head_sha(&self, pull: &PullRow) -> String {
        self.branch_sha(&pull.head, pull.pushes)
    }

    /// The commit the pull request's base is at now.
    pub(crate) fn base_sha(&self, pull: &PullRow) -> String {
        self.branch_sha(&pull.base, 0)
    }

    /// Branch `name`'s commit: in the git directory, else made up from its name and pushes.
    fn branch_sha(&self, name: &str, pushes: u64) -> String {
        self.git_sha(&format!("refs/heads/{name}")).unwrap_or_else(|| made_up_sha(&self.full_name, name, pushes))
    }

    /// The commit `rev` names in the git directory (`None` without one, or if it names none).
    fn git_sha(&self, rev: &str) -> Option<String> {
        let git = self.git.as_ref().filter(|_| !rev.starts_with('-'))?;
        let out = Command::new("git")
            .arg(format!("--git-dir={}", git.display()))
            .args(["rev-parse", "--quiet", "--verify", &format!("{rev}^{{commit}}")])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The commit a `{ref}` path parameter names (a sha, a branch, `heads/<branch>`), if the
    /// repository has it. Without a git directory the commits are the made-up ones: every head
    /// a pull request has had, and the branches' current ones.
    pub(crate) fn resolve_ref(&self, reference: &str) -> Option<String> {
        if self.git.is_some() {
            return self.git_sha(reference);
        }
        let pulls = self.items.iter().filter_map(|i| i.pull.as_ref());
        let mut known = pulls.flat_map(|p| (0..=p.pushes).map(|n| made_up_sha(&self.full_name, &p.head, n)));
        if known.any(|sha| sha == reference) {
            return Some(reference.to_string());
        }
        // A sha it does not have is no branch name (without a git directory, any name is one).
        if reference.len() == 40 && reference.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let branch = reference.strip_prefix("heads/").unwrap_or(reference);
        let latest = self.items.iter().rev().filter_map(|i| i.pull.as_ref()).find(|p| p.head == branch);
        match latest {
            Some(pull) => Some(self.head_sha(pull)),
            None => self.has_branch(branch).then(|| self.branch_sha(branch, 0)),
        }
    }

    /// The snapshot of pull request `item`'s inline comments, oldest first.
    pub(crate) fn review_comments(&self, item: &Item) -> Vec<ReviewComment> {
        let rows = item.pull.iter().flat_map(|p| &p.review_comments);
        rows.map(|c| ReviewComment {
            id: c.id,
            user: c.user.clone(),
            body: c.body.clone(),
            path: c.path.clone(),
            line: c.line,
            in_reply_to: c.in_reply_to,
            review_id: Some(c.review_id),
        })
        .collect()
    }
}

/// A made-up 40-hex commit sha for `branch` of `repo` after `pushes` pushes: the same inputs
/// give the same sha, so a test can ask for it again.
pub(crate) fn made_up_sha(repo: &str, branch: &str, pushes: u64) -> String {
    let part = |salt: u8| {
        let mut hasher = DefaultHasher::new();
        (salt, repo.to_lowercase(), branch, pushes).hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    };
    let mut sha = format!("{}{}{}", part(0), part(1), part(2));
    sha.truncate(40);
    sha
}

/// What a new inline comment says before it gets its ids and time.
pub(crate) struct Draft<'a> {
    pub path: &'a str,
    pub line: u64,
    pub body: &'a str,
    /// The thread's first comment, for a reply.
    pub in_reply_to: Option<u64>,
    /// The commit it is on.
    pub commit_id: String,
}

impl State {
    /// Submits a review of pull request `number` by `login` with inline `comments`, refused as
    /// GitHub refuses it; bumps its `updated_at`. The review's id and its comments' ids.
    pub(crate) fn review(
        &mut self,
        repo: &str,
        number: u64,
        login: &str,
        (state, body): (&str, &str),
        comments: &[(&str, u64, &str)],
    ) -> Result<(u64, Vec<u64>), String> {
        if !REVIEW_STATES.contains(&state) {
            return Err(format!("no review state {state:?} (one of {REVIEW_STATES:?})"));
        }
        let r = self.repo(repo)?;
        let (item, pull) = r.pull_of(number).ok_or_else(|| format!("{} has no pull request #{number}", r.full_name))?;
        if state != "COMMENTED" && item.user.eq_ignore_ascii_case(login) {
            return Err(format!("{login} wrote #{number}: GitHub refuses {state} from a pull request's author"));
        }
        if let Some((path, line, _)) = comments.iter().find(|(path, line, _)| path.is_empty() || *line == 0) {
            return Err(format!("an inline comment is on a file and a line from 1, not {path:?} line {line}"));
        }
        let sha = r.head_sha(pull);
        let drafts = comments
            .iter()
            .map(|(path, line, body)| Draft { path, line: *line, body, in_reply_to: None, commit_id: sha.clone() })
            .collect();
        self.submit(repo, number, login, (state, body), drafts)
    }

    /// Replies as `login` in the thread of inline comment `to` of pull request `number` (a
    /// `COMMENTED` review of its own); bumps its `updated_at`. The reply's id; `None` when `to`
    /// is not the first comment of a thread on that pull request.
    pub(crate) fn reply(
        &mut self,
        repo: &str,
        number: u64,
        login: &str,
        to: u64,
        body: &str,
    ) -> Result<Option<u64>, String> {
        let r = self.repo(repo)?;
        let parent = r.pull_of(number).and_then(|(_, p)| p.review_comments.iter().find(|c| c.id == to));
        let Some(parent) = parent.filter(|c| c.in_reply_to.is_none()) else { return Ok(None) };
        let (path, line, commit_id) = (parent.path.clone(), parent.line, parent.commit_id.clone());
        let draft = Draft { path: &path, line, body, in_reply_to: Some(to), commit_id };
        let (_, ids) = self.submit(repo, number, login, ("COMMENTED", ""), vec![draft])?;
        Ok(ids.first().copied())
    }

    /// Records a review with its comments (ids given here, both timed by the bump).
    fn submit(
        &mut self,
        repo: &str,
        number: u64,
        login: &str,
        (state, body): (&str, &str),
        drafts: Vec<Draft>,
    ) -> Result<(u64, Vec<u64>), String> {
        let r = self.repo(repo)?;
        let sha = r.pull_of(number).map(|(_, p)| r.head_sha(p)).ok_or_else(|| format!("no pull request #{number}"))?;
        let review_id = self.id();
        let rows: Vec<ReviewCommentRow> = drafts
            .into_iter()
            .map(|d| ReviewCommentRow {
                id: self.id(),
                review_id,
                user: login.into(),
                body: d.body.into(),
                path: d.path.into(),
                line: d.line,
                in_reply_to: d.in_reply_to,
                commit_id: d.commit_id,
                created: 0,
            })
            .collect();
        let ids = rows.iter().map(|c| c.id).collect();
        self.edit(repo, number, |item| {
            let at = item.updated;
            let Some(pull) = item.pull.as_mut() else { return };
            let (user, body, state) = (login.into(), body.into(), state.into());
            pull.reviews.push(ReviewRow { id: review_id, user, body, state, commit_id: sha, submitted: at });
            pull.review_comments.extend(rows.into_iter().map(|c| ReviewCommentRow { created: at, ..c }));
        })?;
        Ok((review_id, ids))
    }

    /// Merges open pull request `number` as the main token's user: closed and merged at the
    /// same second (a `merged` and a `closed` event).
    pub(crate) fn merge_pull(&mut self, repo: &str, number: u64) -> Result<Issue, String> {
        let r = self.repo(repo)?;
        let (item, _) = r.pull_of(number).ok_or_else(|| format!("{} has no pull request #{number}", r.full_name))?;
        if !item.open {
            return Err(format!("{} #{number} is closed: GitHub merges only an open pull request", r.full_name));
        }
        let event = self.id();
        self.edit(repo, number, |item| {
            let at = item.updated;
            item.open = false;
            if let Some(pull) = item.pull.as_mut() {
                pull.merged = Some(at);
            }
            let merged = EventRow { id: event, event: "merged", actor: VIEWER.into(), label: None, created: at };
            item.events.push(merged);
        })
    }

    /// A new commit on pull request `number`'s head (a repository without a git directory):
    /// its made-up sha changes, and so does the pull request's `updated_at`.
    pub(crate) fn push_head(&mut self, repo: &str, number: u64) -> Result<Issue, String> {
        let r = self.repo(repo)?;
        if r.git.is_some() {
            return Err(format!("{} has a git directory: push to the branch there", r.full_name));
        }
        r.pull_of(number).ok_or_else(|| format!("{} has no pull request #{number}", r.full_name))?;
        self.edit(repo, number, |item| {
            if let Some(pull) = item.pull.as_mut() {
                pull.pushes += 1;
            }
        })
    }

    /// The head sha of pull request `number` now, and the time of a change on it.
    fn head_now(&mut self, repo: &str, number: u64) -> Result<(String, u64, i64), String> {
        let r = self.repo(repo)?;
        let (_, pull) = r.pull_of(number).ok_or_else(|| format!("{} has no pull request #{number}", r.full_name))?;
        let sha = r.head_sha(pull);
        Ok((sha, self.id(), self.tick()))
    }

    /// A completed check run `name` on pull request `number`'s head commit; its id.
    pub(crate) fn check_run(
        &mut self,
        repo: &str,
        number: u64,
        (name, conclusion): (&str, &str),
        (title, summary, text): (&str, &str, &str),
    ) -> Result<u64, String> {
        if !CONCLUSIONS.contains(&conclusion) {
            return Err(format!("no check run conclusion {conclusion:?} (one of {CONCLUSIONS:?})"));
        }
        let (sha, id, completed) = self.head_now(repo, number)?;
        self.repo_mut(repo)?.check_runs.push(CheckRunRow {
            id,
            sha,
            name: name.into(),
            conclusion: conclusion.into(),
            title: title.into(),
            summary: summary.into(),
            text: text.into(),
            completed,
        });
        Ok(id)
    }

    /// A status of `context` on pull request `number`'s head commit; its id.
    pub(crate) fn commit_status(
        &mut self,
        repo: &str,
        number: u64,
        context: &str,
        (state, description): (&str, &str),
    ) -> Result<u64, String> {
        if !STATUS_STATES.contains(&state) {
            return Err(format!("no commit status state {state:?} (one of {STATUS_STATES:?})"));
        }
        let (sha, id, created) = self.head_now(repo, number)?;
        let status = StatusRow {
            id,
            sha,
            context: context.into(),
            state: state.into(),
            description: description.into(),
            created,
        };
        self.repo_mut(repo)?.statuses.push(status);
        Ok(id)
    }
}
