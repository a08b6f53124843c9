//! Changes made as a given user (a label applied by a maintainer or a triager, an edit by the
//! author, a close and a reopen), collaborators' roles, and who GitHub knows. The roles and
//! the events a change records are in `state`; the two operations that read them
//! (`issues/list-events`, `repos/get-collaborator-permission-level`) in `routes`.
//!
//! GitHub's rules as documented: applying or removing a label needs triage access; the author
//! (or anyone with write access) may edit the title and body, and close or reopen the issue.
//! The permission answer maps `maintain` to `write` and `triage` to `read`; a user GitHub does
//! not know is a 404. An edit of the text records no event, as on GitHub.

use super::state::{Repo, State, ROLES, TRIAGE, WRITE};

impl Repo {
    /// Whether GitHub knows `login`: a collaborator, or someone who wrote or did something here.
    pub(crate) fn knows(&self, login: &str) -> bool {
        let is = |l: &str| l.eq_ignore_ascii_case(login);
        self.collaborators.contains_key(&login.to_lowercase())
            || self.items.iter().any(|i| {
                is(&i.user)
                    || i.comments.iter().any(|c| is(&c.user))
                    || i.events.iter().any(|e| is(&e.actor))
                    || i.assignee.as_deref().is_some_and(is)
                    || i.pull.as_ref().is_some_and(|p| p.reviews.iter().any(|r| is(&r.user)))
            })
    }
}

impl State {
    /// Gives `login` a role on `repo` (`admin`, `maintain`, `write`, `triage` or `read`).
    pub(crate) fn set_role(&mut self, repo: &str, login: &str, role: &str) -> Result<(), String> {
        if !ROLES.contains(&role) {
            return Err(format!("no role {role:?} (one of {ROLES:?})"));
        }
        self.repo_mut(repo)?.collaborators.insert(login.to_lowercase(), role.to_string());
        Ok(())
    }

    /// Applies (`on`) or removes a label as `login`, who needs triage access. Applying a label
    /// the issue has already changes nothing and records nothing, as on GitHub.
    pub(crate) fn label_as(
        &mut self,
        repo: &str,
        number: u64,
        label: &str,
        login: &str,
        on: bool,
    ) -> Result<(), String> {
        self.repo(repo)?.may(login, TRIAGE)?;
        let name = self.ensure_label(repo, label)?;
        let has = self.repo(repo)?.item(number).is_some_and(|i| i.labels.contains(&name));
        if has == on {
            return Ok(());
        }
        self.edit_by(repo, number, login, |i| {
            i.labels.retain(|l| *l != name);
            if on {
                i.labels.push(name);
            }
        })
        .map(drop)
    }

    /// Edits the title and body as `login`: the author, or someone with write access.
    pub(crate) fn edit_as(
        &mut self,
        repo: &str,
        number: u64,
        login: &str,
        title: Option<String>,
        body: Option<String>,
    ) -> Result<(), String> {
        self.author_or(repo, number, login, WRITE)?;
        self.edit_by(repo, number, login, |i| {
            if let Some(t) = title {
                i.title = t;
            }
            if body.is_some() {
                i.body = body;
            }
        })
        .map(drop)
    }

    /// Closes (or reopens) the issue as `login`: the author, or someone with triage access.
    pub(crate) fn set_open_as(&mut self, repo: &str, number: u64, login: &str, open: bool) -> Result<(), String> {
        self.author_or(repo, number, login, TRIAGE)?;
        self.edit_by(repo, number, login, |i| i.open = open).map(drop)
    }

    /// `login` wrote issue `number`, or has at least `role`.
    fn author_or(&self, repo: &str, number: u64, login: &str, role: &str) -> Result<(), String> {
        let r = self.repo(repo)?;
        let item = r.item(number).ok_or_else(|| format!("{} has no issue #{number}", r.full_name))?;
        if item.user.eq_ignore_ascii_case(login) {
            return Ok(());
        }
        r.may(login, role)
    }
}
