//! The repos a machine can work on: [`RepoSettings`] as the settings say them, and [`Repo`]
//! as checked and resolved.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use devpilot_store::error::{Error, Result};

/// How a repo is configured in the settings (`[repos.webapp]`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RepoSettings {
    /// The local clone (`~` is this user's home).
    pub path: String,
    /// The remote to fetch from and push to (default `origin`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// Files copied from the clone into each worktree (e.g. `.env`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub copy: Vec<String>,
    /// An argv run in each new worktree before the agent (e.g. `["npm", "ci"]`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub setup: Vec<String>,
    /// Push the job's branch when the job completes.
    pub push: bool,
    /// Run `setup` also in a reused or resumed worktree, whose code an agent wrote (by
    /// default it runs only in a worktree created from the remote's base).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub setup_on_resume: bool,
    /// The pull request a tracker's job opens when it completes with its branch pushed to a
    /// GitHub remote: a draft (the default), ready for review, or none.
    #[serde(skip_serializing_if = "PrMode::is_default")]
    pub pull_request: PrMode,
    /// `"off"` runs this repo's agents unconfined, on purpose (and lets a machine that
    /// cannot confine take this repo's tracker jobs).
    #[serde(skip_serializing_if = "crate::sandbox::settings::SandboxMode::is_on")]
    pub sandbox: crate::sandbox::settings::SandboxMode,
    /// Hosts this repo's agents may reach besides their model's (a package registry, say):
    /// `host`, `host:port` or `*.domain`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_hosts: Vec<String>,
    /// Paths this repo's agents may read besides the system and toolchains (`~` is the home).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<String>,
    /// What review feedback on this repo's pull requests does (`[repos.NAME.review_loop]`).
    #[serde(skip_serializing_if = "crate::sources::review::ReviewLoop::is_default")]
    pub review_loop: crate::sources::review::ReviewLoop,
}

/// Which pull request a finished job opens (`pull_request = "draft" | "ready" | "off"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrMode {
    #[default]
    Draft,
    Ready,
    Off,
}

impl PrMode {
    fn is_default(&self) -> bool {
        *self == PrMode::Draft
    }
}

/// A repo this machine can work on.
#[derive(Clone, Debug, PartialEq)]
pub struct Repo {
    pub name: String,
    pub path: PathBuf,
    pub remote: String,
    pub copy: Vec<String>,
    pub setup: Vec<String>,
    pub push: bool,
    pub setup_on_resume: bool,
    pub pull_request: PrMode,
    pub sandbox: crate::sandbox::settings::SandboxMode,
    pub allow_hosts: Vec<crate::sandbox::hosts::HostPort>,
    pub read_only: Vec<PathBuf>,
    pub review_loop: crate::sources::review::ReviewLoop,
}

impl Repo {
    pub fn from_settings(name: &str, s: &RepoSettings) -> Result<Self> {
        devpilot_store::spec::validate_name("repo", name)?;
        if s.path.trim().is_empty() {
            return Err(Error::Invalid(format!("repo '{name}' has no path")));
        }
        for f in &s.copy {
            let p = Path::new(f);
            if p.is_absolute() || p.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
                return Err(Error::Invalid(format!("repo '{name}': copy '{f}' must be a path inside the repo")));
            }
        }
        s.review_loop.check().map_err(|e| Error::Invalid(format!("repo '{name}': {e}")))?;
        Ok(Self {
            name: name.into(),
            path: expand_home(s.path.trim()),
            remote: s.remote.clone().filter(|r| !r.trim().is_empty()).unwrap_or_else(|| "origin".into()),
            copy: s.copy.clone(),
            setup: s.setup.clone(),
            push: s.push,
            setup_on_resume: s.setup_on_resume,
            pull_request: s.pull_request,
            sandbox: s.sandbox,
            allow_hosts: s
                .allow_hosts
                .iter()
                .map(|h| crate::sandbox::hosts::HostPort::parse(h))
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Error::Invalid(format!("repo '{name}': allow_hosts: {e}")))?,
            read_only: s
                .read_only
                .iter()
                .map(|p| crate::sandbox::settings::check_path(p).map(|_| expand_home(p.trim())))
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Error::Invalid(format!("repo '{name}': read_only: {e}")))?,
            review_loop: s.review_loop.clone(),
        })
    }
}

/// Lays `devpilot run --repo NAME=PATH` over the settings' repos: the repo gets the flag's
/// path and keeps the rest of its `[repos.NAME]` (remote, copy, setup, push); a repo the
/// settings do not name is added with the defaults.
pub fn overlay_repo_flag(repos: &mut BTreeMap<String, RepoSettings>, flag: &str) -> Result<()> {
    let (name, path) = flag
        .split_once('=')
        .ok_or_else(|| Error::Invalid(format!("--repo '{flag}' must be NAME=PATH, e.g. webapp=~/src/webapp")))?;
    let name = name.trim();
    devpilot_store::spec::validate_name("repo", name)?;
    repos.entry(name.to_string()).or_default().path = path.to_string();
    Ok(())
}

/// `~/x` as this user's home + `x`.
pub fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ if p == "~" => std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(p)),
        _ => PathBuf::from(p),
    }
}
