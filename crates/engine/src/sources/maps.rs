//! Which repo a GitHub source's jobs run in when its settings name none: the repo of this
//! machine whose remote is that very GitHub repository, else a repo named after it, which
//! no machine has yet, so the job waits (and says why) rather than running in a scratch
//! directory whose work is thrown away.
//!
//! `maps_to` and the label mappings always win, and `no_repo = true` keeps the jobs
//! repo-less (an agent whose answer is its comment): the user said so.

use std::collections::BTreeMap;
use std::time::Duration;

use super::github::pulls::GithubRemote;
use super::health::RepoRemote;
use super::keys::{host_of, is_github_com};
use super::settings::{SourceKind, SourceSettings};
use crate::git::Git;
use crate::worktree::{Repo, RepoSettings};

/// Where an unmapped GitHub source's jobs go, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mapped {
    /// The settings name the repo (`maps_to`), or it is a Linear source.
    AsConfigured,
    /// This machine's repo `0`, whose remote is the source's repository.
    Found(String),
    /// No repo here has that remote: jobs carry repo `0` (the repository's name) and wait
    /// for a machine that has a repo of that name.
    Named(String),
}

impl Mapped {
    /// The repo the source's jobs carry, when it is not the settings' own.
    pub fn repo(&self) -> Option<&str> {
        match self {
            Mapped::AsConfigured => None,
            Mapped::Found(r) | Mapped::Named(r) => Some(r),
        }
    }
}

/// The web host of a GitHub source's API: `github.com` for GitHub's own API (or the address
/// `DEVPILOT_GITHUB_API_URL` puts in its place), else the API's own host (GitHub Enterprise).
pub fn web_host(s: &SourceSettings) -> String {
    let api = s.api_url();
    if is_github_com(&api) {
        "github.com".into()
    } else {
        host_of(&api).unwrap_or_default()
    }
}

/// The repo this machine's settings give source `s`'s jobs when the settings name none.
pub async fn map(s: &SourceSettings, remotes: &BTreeMap<String, RepoRemote>) -> Mapped {
    if s.kind != SourceKind::Github || !s.maps_to.trim().is_empty() || s.no_repo {
        return Mapped::AsConfigured;
    }
    match repo_with_remote(s, remotes).await {
        Some(name) => Mapped::Found(name),
        None => Mapped::Named(named_after(&s.repo)),
    }
}

/// `s` with its jobs' repo filled in (see [`map`]).
pub async fn mapped(mut s: SourceSettings, remotes: &BTreeMap<String, RepoRemote>) -> SourceSettings {
    if let Some(r) = map(&s, remotes).await.repo() {
        s.maps_to = r.to_string();
        s.repo_from_remote = true;
    }
    s
}

/// The first repo (by name) whose remote is GitHub repository `s.repo` on the source's host.
pub async fn repo_with_remote(s: &SourceSettings, remotes: &BTreeMap<String, RepoRemote>) -> Option<String> {
    let host = web_host(s);
    for (name, r) in remotes {
        let Some(url) = remote_url(r).await else { continue };
        let Some(remote) = GithubRemote::parse(&url) else { continue };
        if remote.host == host && remote.full_name().eq_ignore_ascii_case(s.repo.trim()) {
            return Some(name.clone());
        }
    }
    None
}

/// The URL of a repo's remote (a remote given as a URL is its own).
pub async fn remote_url(r: &RepoRemote) -> Option<String> {
    let git = Git::clone_at(&r.clone).await;
    let key = format!("remote.{}.url", r.remote);
    match git.run(&["config", "--get", &key], Duration::from_secs(10)).await {
        Ok(url) => Some(url.trim().to_string()).filter(|u| !u.is_empty()),
        Err(_) if r.remote.contains(['/', ':']) => Some(r.remote.clone()),
        Err(_) => None,
    }
}

/// Where a source's jobs run, in a sentence for `sources add` and Settings → Sources;
/// `warn`: they would not end in a pushed branch here, or wait for another machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WhereJobsRun {
    pub line: String,
    pub warn: bool,
}

/// Where source `s`'s jobs run, as this machine's `repos` say.
pub async fn where_jobs_run(s: &SourceSettings, repos: &BTreeMap<String, RepoSettings>) -> WhereJobsRun {
    let mapped = map(s, &remotes_of(repos)).await;
    let repo = match (&mapped, s.kind) {
        (Mapped::Found(r) | Mapped::Named(r), _) => r.clone(),
        (Mapped::AsConfigured, SourceKind::Github) if s.no_repo => {
            let line = "its jobs run with no repo (no_repo = true), in a scratch directory: nothing the agent \
                        writes is kept; its answer is the comment";
            return WhereJobsRun { line: line.into(), warn: false };
        }
        (Mapped::AsConfigured, SourceKind::Github) => s.maps_to.trim().to_string(),
        (Mapped::AsConfigured, SourceKind::Linear) => {
            let mut named: Vec<&String> = s.repo_by_team.values().chain(Some(&s.maps_to)).collect();
            named.retain(|r| !r.trim().is_empty());
            named.dedup();
            match named.as_slice() {
                [] if s.no_repo => {
                    let line = "its jobs run with no repo (no_repo = true), in a scratch directory: nothing the agent \
                                writes is kept; its answer is the comment";
                    return WhereJobsRun { line: line.into(), warn: false };
                }
                [] => {
                    return WhereJobsRun {
                        line: "its jobs would name no repo: it takes no issue until it names one (--maps-to, or \"Runs in repo\"), or says no_repo = true"
                            .into(),
                        warn: true,
                    }
                }
                [one] => one.to_string(),
                _ => return WhereJobsRun { line: "its jobs run in the repo of their team".into(), warn: false },
            }
        }
    };
    let why = match &mapped {
        Mapped::Found(_) => format!(", whose remote is {}", s.repo),
        _ => String::new(),
    };
    let Some(r) = repos.get(&repo) else {
        let line = match &mapped {
            Mapped::Named(_) => format!(
                "no repo on this machine has {} as its remote: its jobs carry repo '{repo}' and wait for a machine that has a repo of that name (add your clone in Settings → Repos, or [repos.{repo}] in the settings)",
                s.repo
            ),
            _ => format!(
                "its jobs run in repo '{repo}', which is not configured on this machine: they wait for a machine that has it"
            ),
        };
        return WhereJobsRun { line, warn: true };
    };
    if !r.push {
        let line = format!(
            "its jobs run in repo '{repo}' ({}){why}, which does not push on completion here: a finished job leaves no branch and no pull request (switch Push on in Settings → Repos, or push = true in [repos.{repo}])",
            r.path
        );
        return WhereJobsRun { line, warn: true };
    }
    let pr = match r.pull_request {
        crate::worktree::PrMode::Draft => "and opens a draft pull request",
        crate::worktree::PrMode::Ready => "and opens a pull request",
        crate::worktree::PrMode::Off => "and opens no pull request",
    };
    WhereJobsRun {
        line: format!("its jobs run in repo '{repo}' ({}){why}, which pushes on completion {pr}", r.path),
        warn: false,
    }
}

/// The clones and remotes of the repos `settings` names (those it cannot read are left out:
/// the settings' own check says why).
pub fn remotes_of(repos: &BTreeMap<String, RepoSettings>) -> BTreeMap<String, RepoRemote> {
    repos
        .iter()
        .filter_map(|(n, r)| Repo::from_settings(n, r).ok())
        .map(|r| (r.name, RepoRemote { clone: r.path, remote: r.remote }))
        .collect()
}

/// A repo name for GitHub repository `owner/name`: its name where that is a valid repo
/// name (`webapp`), else `github-<owner>-<name>` with the other characters as `-`.
pub fn named_after(full_name: &str) -> String {
    let name = full_name.rsplit('/').next().unwrap_or_default().trim();
    if devpilot_store::spec::validate_name("repo", name).is_ok() {
        return name.to_string();
    }
    let clean: String =
        full_name.chars().map(|c| if c.is_ascii_alphanumeric() || "._".contains(c) { c } else { '-' }).collect();
    let mut out = format!("github-{}", clean.trim_matches('-'));
    out.truncate(100);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository's own name is the repo's name when it can be one; anything else is
    /// made into one, never into a name the settings would refuse.
    #[test]
    fn names_after_the_repository() {
        assert_eq!(named_after("acme/webapp"), "webapp");
        assert_eq!(named_after("acme/web.app"), "web.app");
        assert_eq!(named_after("acme/-dash"), "github-acme--dash");
        for r in ["acme/webapp", "acme/-dash", "a/.", "x/\u{e9}t\u{e9}"] {
            devpilot_store::spec::validate_name("repo", &named_after(r)).unwrap();
        }
    }

    /// A Linear source, and a GitHub source whose settings name a repo, keep their own.
    #[tokio::test]
    async fn configured_mappings_win() {
        let mut s = SourceSettings { kind: SourceKind::Github, repo: "acme/webapp".into(), ..Default::default() };
        s.maps_to = "web".into();
        assert_eq!(map(&s, &BTreeMap::new()).await, Mapped::AsConfigured);
        let linear = SourceSettings { teams: vec!["ENG".into()], ..Default::default() };
        assert_eq!(map(&linear, &BTreeMap::new()).await, Mapped::AsConfigured);
        s.maps_to.clear();
        assert_eq!(map(&s, &BTreeMap::new()).await, Mapped::Named("webapp".into()));
    }
}
