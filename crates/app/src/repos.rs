//! Settings → Repos: this machine's clones, each with its switches (push on completion, the
//! pull request it opens), a health line that says what would keep a finished job from
//! reaching a pull request, a connection check, and Remove.
//!
//! A repo added in the window pushes and opens a draft pull request by default: a window
//! user's tracker job then ends in a pull request with no edit of the settings file.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use devpilot_engine::git::{redact_credentials, Git};
use devpilot_engine::sources::github::pulls::GithubRemote;
use devpilot_engine::sources::maps::remote_url;
use devpilot_engine::sources::RepoRemote;
use devpilot_engine::worktree::{PrMode, Repo, RepoSettings};
use devpilot_store::error::{Error, Result};

use crate::engine::Engine;

/// How long the connection check waits for the remote.
const CHECK_BOUND: Duration = Duration::from_secs(20);

/// A repo as the window lists it, with its health.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RepoView {
    pub name: String,
    pub path: String,
    pub push: bool,
    pub pull_request: PrMode,
    pub setup: Vec<String>,
    /// The remote's URL, without credentials.
    pub remote_url: Option<String>,
    /// `owner/name` when the remote is a GitHub repository.
    pub github: Option<String>,
    /// What keeps this repo's finished jobs from a pushed branch or a pull request; empty
    /// when nothing does.
    pub problems: Vec<String>,
    /// One line: what a finished job here ends in, or the first problem.
    pub line: String,
}

/// The switches of one repo row.
#[derive(Clone, Copy, Debug, Deserialize)]
pub struct RepoSwitches {
    pub push: bool,
    pub pull_request: PrMode,
}

impl Engine {
    /// The repos this machine has configured, by name.
    pub fn repos(&self) -> Vec<(String, RepoSettings)> {
        self.settings().repos.into_iter().collect()
    }

    /// The repos with their health (read from each clone; no network).
    pub async fn repo_views(&self) -> Vec<RepoView> {
        let mut out = vec![];
        for (name, r) in self.repos() {
            out.push(view_of(&name, &r).await);
        }
        out
    }

    /// Adds a repo (or gives an existing one a new path), after checking it is a git clone.
    /// A new repo pushes on completion and opens a draft pull request.
    pub async fn add_repo(self: &Arc<Self>, name: &str, path: &str) -> Result<()> {
        let name = name.trim();
        let settings = RepoSettings { path: path.trim().into(), push: true, ..Default::default() };
        let repo = Repo::from_settings(name, &settings)?;
        if !repo.path.join(".git").exists() {
            return Err(Error::Invalid(format!("{} is not a git clone (no .git in it)", repo.path.display())));
        }
        self.change_repos(|repos| {
            repos.entry(name.to_string()).or_insert(settings).path = path.trim().to_string();
            Ok(())
        })
        .await
    }

    /// Sets a repo's push and pull request switches.
    pub async fn set_repo(self: &Arc<Self>, name: &str, switches: RepoSwitches) -> Result<()> {
        self.change_repos(|repos| {
            let r = repos.get_mut(name).ok_or_else(|| no_repo(name))?;
            r.push = switches.push;
            r.pull_request = switches.pull_request;
            Ok(())
        })
        .await
    }

    /// Removes a repo from this machine's settings (the clone stays). Refused while a source
    /// sends its jobs there: the source would make jobs this machine no longer runs.
    pub async fn remove_repo(self: &Arc<Self>, name: &str) -> Result<()> {
        let file = self.file_settings()?;
        if let Some((source, _)) = file.sources.iter().find(|(_, s)| s.names_repo(name)) {
            return Err(Error::Invalid(format!(
                "source '{source}' runs its jobs in repo '{name}': change or remove the source first"
            )));
        }
        self.change_repos(|repos| repos.remove(name).map(drop).ok_or_else(|| no_repo(name))).await
    }

    /// Reaches the repo's remote as a push would (`git push --dry-run`, bounded): whether a
    /// finished job's branch could be pushed from here now.
    pub async fn check_repo(&self, name: &str) -> Result<String> {
        let r = self.settings().repos.get(name).cloned().ok_or_else(|| no_repo(name))?;
        let repo = Repo::from_settings(name, &r)?;
        let git = Git::clone_at(&repo.path).await;
        let target = "HEAD:refs/heads/devpilot/push-check";
        match git.run(&["push", "--dry-run", "--no-verify", "--quiet", &repo.remote, target], CHECK_BOUND).await {
            Ok(_) => Ok(format!("{name}: the remote '{}' takes a push from this machine", repo.remote)),
            Err(e) => Err(Error::Invalid(format!(
                "{name}: a push to '{}' would fail: {}",
                repo.remote,
                redact_credentials(&e.to_string())
            ))),
        }
    }

    /// Applies `change` to the settings file's repos, saves and applies the result.
    async fn change_repos(
        self: &Arc<Self>,
        change: impl FnOnce(&mut std::collections::BTreeMap<String, RepoSettings>) -> Result<()>,
    ) -> Result<()> {
        let old = self.file_settings()?;
        let mut new = old.clone();
        change(&mut new.repos)?;
        new.validate()?;
        self.save_file(&new)?;
        self.apply(&old, new, false).await
    }
}

fn no_repo(name: &str) -> Error {
    Error::Invalid(format!("there is no repo '{name}' on this machine"))
}

/// Repo `name` as the window shows it, its health read from its clone.
pub async fn view_of(name: &str, r: &RepoSettings) -> RepoView {
    let mut problems = vec![];
    let mut remote = None;
    match Repo::from_settings(name, r) {
        Err(e) => problems.push(e.to_string()),
        Ok(repo) if !repo.path.join(".git").exists() => {
            problems.push(format!("{} is not a git clone here", repo.path.display()));
        }
        Ok(repo) => {
            remote = remote_url(&RepoRemote { clone: repo.path.clone(), remote: repo.remote.clone() }).await;
            if remote.is_none() {
                problems.push(format!("the clone has no remote '{}' to push to", repo.remote));
            }
        }
    }
    let github = remote.as_deref().and_then(GithubRemote::parse).map(|g| g.full_name());
    if !r.push {
        problems.push("does not push on completion: a finished job leaves no branch and no pull request".into());
    } else if remote.is_some() && github.is_none() && r.pull_request != PrMode::Off {
        problems.push("its remote is not on GitHub: a finished job's branch is pushed, but no pull request".into());
    }
    let line = match problems.first() {
        Some(p) => p.clone(),
        None => {
            let pr = match r.pull_request {
                PrMode::Draft => "a draft pull request",
                PrMode::Ready => "a pull request, ready for review",
                PrMode::Off => "no pull request",
            };
            let on = github.as_deref().map(|g| format!(" on {g}")).unwrap_or_default();
            format!("a finished job pushes its branch and opens {pr}{on}")
        }
    };
    RepoView {
        name: name.to_string(),
        path: r.path.clone(),
        push: r.push,
        pull_request: r.pull_request,
        setup: r.setup.clone(),
        remote_url: remote.map(|u| redact_credentials(&u)),
        github,
        problems,
        line,
    }
}
