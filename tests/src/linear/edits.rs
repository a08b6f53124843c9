//! Changes to issues, whether a test makes them (a person editing the issue in Linear) or a
//! mutation does (the engine): each real change bumps the issue's `updatedAt`; setting what is
//! already there changes nothing, as in Linear.

use super::model::Comment;
use super::state::{new_id, AttachmentRow, CommentRow, State, VIEWER};

impl State {
    /// Replaces the issue's labels (names; unknown ones are created).
    pub(crate) fn set_labels(&mut self, issue: usize, names: &[&str]) {
        let labels: Vec<usize> = names.iter().map(|name| self.label(name)).collect();
        if self.issues[issue].labels != labels {
            self.issues[issue].labels = labels;
            self.bump(issue);
        }
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

    /// Replaces the description (`None`: null).
    pub(crate) fn set_description(&mut self, issue: usize, description: Option<&str>) {
        if self.issues[issue].description.as_deref() != description {
            self.issues[issue].description = description.map(str::to_string);
            self.bump(issue);
        }
    }

    /// Renames the issue (its URL's slug and branch name follow).
    pub(crate) fn set_title(&mut self, issue: usize, title: &str) {
        if self.issues[issue].title != title {
            self.issues[issue].title = title.into();
            self.bump(issue);
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
        rows.map(|c| Comment { id: c.id.clone(), body: c.body.clone() }).collect()
    }

    /// The issue's linked URLs and their titles, oldest first.
    pub(crate) fn attachments_of(&self, issue: usize) -> Vec<(String, String)> {
        let rows = self.attachments.iter().filter(|a| a.issue == issue);
        rows.map(|a| (a.url.clone(), a.title.clone())).collect()
    }
}
