//! A job's [`Worktree`], the [`Record`] kept next to it, and what a hand-off or a cleanup
//! found in it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::repo::Repo;
use crate::git::Git;

/// The worktree of one job.
#[derive(Clone, Debug, PartialEq)]
pub struct Worktree {
    pub job: i64,
    pub repo: Repo,
    pub path: PathBuf,
    pub branch: String,
    /// Its gitdir (`<clone>/.git/worktrees/<name>`), as DevPilot found it when it created
    /// the worktree: every git call names it, so the worktree's `.git` file is never read.
    pub git_dir: PathBuf,
    /// What its code came from.
    pub start: StartedFrom,
}

/// What a worktree's code came from, which decides whether the repo's `setup` may run in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartedFrom {
    /// Created from the remote's base branch: code people pushed.
    Base(String),
    /// Created from a branch an agent pushed or committed (a hand-off's, an earlier
    /// attempt's, or a base under `devpilot/`), or reused from an earlier attempt here.
    AgentWork(String),
}

impl Worktree {
    /// Whether the repo's setup may run here: only on the remote's base, unless the repo
    /// says `setup_on_resume`.
    pub fn setup_allowed(&self) -> bool {
        matches!(self.start, StartedFrom::Base(_)) || self.repo.setup_on_resume
    }

    /// The first of `names` (paths relative to the worktree) that is in it, a link or a
    /// directory included, unless it is a byte-for-byte copy of the repo's `copy` file of that
    /// name: DevPilot put that one there, from the user's own clone.
    pub fn holds_any(&self, names: &[&str]) -> Option<String> {
        let own = |n: &str| {
            self.repo.copy.iter().any(|c| c == n)
                && std::fs::symlink_metadata(self.path.join(n)).is_ok_and(|m| m.is_file())
                && std::fs::read(self.path.join(n)).ok() == std::fs::read(self.repo.path.join(n)).ok()
        };
        names.iter().find(|n| std::fs::symlink_metadata(self.path.join(n)).is_ok() && !own(n)).map(|n| n.to_string())
    }

    /// Git in this worktree, with its gitdir named.
    pub(super) async fn git(&self) -> Git {
        Git::worktree(&self.git_dir, &self.path).await
    }
}

/// What a worktree's record says (`<root>/<job>.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub job: i64,
    pub repo: String,
    pub repo_path: PathBuf,
    pub remote: String,
    pub branch: String,
    pub path: PathBuf,
    /// A hand-off could not push: a later run pushes it.
    pub pending_push: bool,
    /// Why the worktree was kept, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
    /// Its gitdir, as found when it was created (records of older versions have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitdir: Option<PathBuf>,
}

/// What a hand-off did with the work in progress.
#[derive(Clone, Debug, PartialEq)]
pub struct HandOff {
    /// The branch the work is on, on the remote; `None` when it could not be pushed.
    pub pushed: Option<String>,
    /// Why the work stayed on this machine, when its push failed (it is pushed later).
    pub stayed: Option<String>,
    /// One sentence for the history.
    pub detail: String,
    pub took: Duration,
}

/// What is left in a worktree that is not safe on the remote.
#[derive(Clone, Debug, PartialEq)]
pub enum Unsaved {
    Nothing,
    Changes,
    Commits(u32),
}

impl Unsaved {
    pub(super) fn describe(&self) -> Option<String> {
        match self {
            Unsaved::Nothing => None,
            Unsaved::Changes => Some("it has uncommitted changes".into()),
            Unsaved::Commits(n) => Some(format!("it has {n} commit(s) that are not on the remote")),
        }
    }
}

/// The records under `root`, by job id.
pub fn records_in(root: &Path) -> Vec<Record> {
    let Ok(dir) = std::fs::read_dir(root) else { return vec![] };
    let mut out: Vec<Record> = dir
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect();
    out.sort_by_key(|r: &Record| r.job);
    out
}
