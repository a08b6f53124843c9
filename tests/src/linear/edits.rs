//! Changes to issues, whether a test makes them (a person editing the issue in Linear) or a
//! mutation does (the engine): each real change bumps the issue's `updatedAt`; setting what is
//! already there changes nothing, as in Linear. A change of labels, description or title is
//! an entry in the issue's history, by the user who made it (the viewer, unless a test names
//! another), one entry per change: the stand-in never folds two changes into one entry.

use super::model::Comment;
use super::state::{new_id, AttachmentRow, CommentRow, HistoryRow, State, VIEWER};

impl State {
    /// Replaces the issue's labels (names; unknown ones are created), as the viewer.
    pub(crate) fn set_labels(&mut self, issue: usize, names: &[&str]) {
        self.set_labels_by(issue, names, VIEWER);
    }

    /// Replaces the issue's labels as user `actor`.
    pub(crate) fn set_labels_by(&mut self, issue: usize, names: &[&str], actor: usize) {
        let labels: Vec<usize> = names.iter().map(|name| self.label(name)).collect();
        let old = self.issues[issue].labels.clone();
        if old != labels {
            let added = labels.iter().filter(|l| !old.contains(l)).copied().collect();
            let removed = old.iter().filter(|l| !labels.contains(l)).copied().collect();
            self.issues[issue].labels = labels;
            self.bump(issue);
            self.record(issue, actor, |h| {
                h.added_labels = added;
                h.removed_labels = removed;
            });
        }
    }

    /// Adds (`on`) or removes one label as user `actor`.
    pub(crate) fn label_by(&mut self, issue: usize, name: &str, on: bool, actor: usize) {
        let label = self.label(name);
        let mut names: Vec<String> =
            self.issues[issue].labels.iter().filter(|l| **l != label).map(|l| self.labels[*l].name.clone()).collect();
        if on {
            names.push(name.to_string());
        }
        self.set_labels_by(issue, &names.iter().map(String::as_str).collect::<Vec<_>>(), actor);
    }

    /// Records a history entry of the change just made to `issue` (at its new `updatedAt`).
    fn record(&mut self, issue: usize, actor: usize, change: impl FnOnce(&mut HistoryRow)) {
        let mut row = HistoryRow {
            id: new_id(),
            issue,
            actor: Some(actor),
            created_ms: self.issues[issue].updated_ms,
            added_labels: Vec::new(),
            removed_labels: Vec::new(),
            updated_description: false,
            title: None,
        };
        change(&mut row);
        self.history.push(row);
    }

    /// Moves the issue to a state; whether it moved.
    pub(crate) fn set_state(&mut self, issue: usize, state: usize) -> bool {
        if self.issues[issue].state == state {
            return false;
        }
        self.issues[issue].state = state;
        self.bump(issue);
        true
    }

    /// Replaces the description (`None`: null), as the viewer.
    pub(crate) fn set_description(&mut self, issue: usize, description: Option<&str>) {
        self.set_description_by(issue, description, VIEWER);
    }

    /// Replaces the description as user `actor`.
    pub(crate) fn set_description_by(&mut self, issue: usize, description: Option<&str>, actor: usize) {
        if self.issues[issue].description.as_deref() != description {
            self.issues[issue].description = description.map(str::to_string);
            self.bump(issue);
            self.record(issue, actor, |h| h.updated_description = true);
        }
    }

    /// Renames the issue (its URL's slug and branch name follow), as the viewer.
    pub(crate) fn set_title(&mut self, issue: usize, title: &str) {
        self.set_title_by(issue, title, VIEWER);
    }

    /// Renames the issue as user `actor`.
    pub(crate) fn set_title_by(&mut self, issue: usize, title: &str, actor: usize) {
        if self.issues[issue].title != title {
            let old = std::mem::replace(&mut self.issues[issue].title, title.into());
            self.bump(issue);
            self.record(issue, actor, |h| h.title = Some((old, title.into())));
        }
    }

    /// Assigns the issue to the viewer (`me`), or unassigns it.
    pub(crate) fn set_assignee_me(&mut self, issue: usize, me: bool) {
        let assignee = me.then_some(VIEWER);
        if self.issues[issue].assignee != assignee {
            self.issues[issue].assignee = assignee;
            self.bump(issue);
        }
    }

    /// Assigns the issue to the other user (not the viewer).
    pub(crate) fn set_assignee_other(&mut self, issue: usize) {
        if self.issues[issue].assignee != Some(VIEWER + 1) {
            self.issues[issue].assignee = Some(VIEWER + 1);
            self.bump(issue);
        }
    }

    /// Posts a comment as the viewer, with the client's id if it chose one (a UUID, unique:
    /// a second comment with the same id is refused, as Linear refuses it).
    pub(crate) fn add_comment(&mut self, issue: usize, id: Option<&str>, body: &str) -> Result<usize, String> {
        let id = match id {
            Some(id) => {
                let parsed = uuid::Uuid::try_parse(id)
                    .map_err(|_| format!("Argument Validation Error: id must be a UUID, got {id:?}"))?;
                let id = parsed.hyphenated().to_string();
                if self.comments.iter().any(|c| c.id == id) {
                    return Err("Entity already exists".into());
                }
                id
            }
            None => new_id(),
        };
        let created_ms = self.clock.tick();
        self.comments.push(CommentRow { id, issue, body: body.into(), user: VIEWER, created_ms });
        self.bump(issue);
        Ok(self.comments.len() - 1)
    }

    /// Posts a comment as user `user` (a person writing on the issue in Linear).
    pub(crate) fn comment_by(&mut self, issue: usize, user: usize, body: &str) -> usize {
        let created_ms = self.clock.tick();
        self.comments.push(CommentRow { id: new_id(), issue, body: body.into(), user, created_ms });
        self.bump(issue);
        self.comments.len() - 1
    }

    /// Links a URL on the issue; Linear keeps one attachment per (issue, URL), so a second
    /// link of the same URL returns the first (and changes nothing).
    pub(crate) fn link_url(&mut self, issue: usize, url: &str, title: Option<&str>) -> usize {
        if let Some(found) = self.attachments.iter().position(|a| a.issue == issue && a.url == url) {
            return found;
        }
        let title = title.unwrap_or(url).to_string();
        let created_ms = self.clock.tick();
        self.attachments.push(AttachmentRow { id: new_id(), issue, url: url.into(), title, created_ms });
        self.bump(issue);
        self.attachments.len() - 1
    }

    /// The issue's comments, oldest first.
    pub(crate) fn comments_of(&self, issue: usize) -> Vec<Comment> {
        let rows = self.comments.iter().filter(|c| c.issue == issue);
        rows.map(|c| Comment { id: c.id.clone(), body: c.body.clone(), user: self.users[c.user].name.clone() })
            .collect()
    }

    /// The issue's linked URLs and their titles, oldest first.
    pub(crate) fn attachments_of(&self, issue: usize) -> Vec<(String, String)> {
        let rows = self.attachments.iter().filter(|a| a.issue == issue);
        rows.map(|a| (a.url.clone(), a.title.clone())).collect()
    }
}
