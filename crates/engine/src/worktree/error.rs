//! [`WorktreeError`]: why a job's worktree could not be made, set up, or handed off. Its
//! words end up in the job's history, which every machine reads.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use crate::git::GitError;

#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    #[error("this machine has no repo '{0}' configured")]
    NoRepo(String),
    #[error("repo '{repo}': {} is not a git clone", .path.display())]
    NotAClone { repo: String, path: PathBuf },
    #[error("the handed-off branch {0:?} is not a branch name")]
    BadResumeBranch(String),
    #[error("cannot fetch the handed-off branch {branch} from {remote}")]
    ResumeFetch { branch: String, remote: String },
    /// A base is taken only from the remote, never from a local branch.
    #[error("repo '{repo}' has no branch '{base}' on {remote} (a base is taken only from the remote)")]
    NoBase { repo: String, base: String, remote: String },
    #[error("cannot create the worktree: {0}")]
    Create(#[source] GitError),
    /// The per-repo lock was not had within the hand-off's bound.
    #[error("another git operation on the repo held it past the bound")]
    LockBusy,
    #[error("unexpected rev-list output: {0}")]
    RevList(#[source] std::num::ParseIntError),
    /// `argv` is the repo's setup command line, as its settings give it.
    #[error("setup `{argv}` could not start: {source}")]
    SetupStart { argv: String, source: std::io::Error },
    #[error("setup `{argv}`: {source}")]
    SetupWait { argv: String, source: std::io::Error },
    #[error("setup `{argv}` took longer than {}", humantime::format_duration(*.bound))]
    SetupTimedOut { argv: String, bound: Duration },
    /// `tail`: the last lines the setup printed, on a line of their own: the first line is
    /// what a tracker's issue is told.
    #[error("setup `{argv}` failed ({status}); its last lines:\n{tail}")]
    SetupFailed { argv: String, status: ExitStatus, tail: String },
    /// A confined agent's view of git could not be made.
    #[error("cannot confine the agent's git: {0}")]
    Confine(String),
    #[error(transparent)]
    Git(#[from] GitError),
    /// The repo lock's file, say.
    #[error(transparent)]
    Store(#[from] devpilot_store::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
