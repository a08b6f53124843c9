//! [`Workspaces`]: the worktrees of one machine and orchestrator, their records, and the
//! per-repo lock that serialises git on a repository.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::record::{records_in, Record, StartedFrom, Worktree};
use super::repo::Repo;
use devpilot_store::error::{Error, Result};

/// The worktrees of one machine and orchestrator.
pub struct Workspaces {
    pub root: PathBuf,
    pub repos: BTreeMap<String, Repo>,
    pub machine: String,
    /// The bound on a hand-off's push (the sleep inhibitor gives a few seconds).
    pub push_bound: Duration,
    /// What a setup command may see of the environment besides the allowlist.
    pub pass_env: Vec<String>,
}

/// The in-process half of the per-repo lock, shared by every [`Workspaces`] of the process
/// (a settings change builds new ones while jobs of the old ones still run).
pub(super) fn repo_mutex(repo: &Path) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
    let mut locks = LOCKS.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner());
    locks.entry(repo.to_path_buf()).or_default().clone()
}

/// The worktrees a job of this process is using now: a later push of pending work or a
/// prune never removes one of them.
pub(super) fn in_use() -> std::sync::MutexGuard<'static, HashSet<PathBuf>> {
    static IN_USE: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    IN_USE.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// The lock wait of a cleanup that runs after the job's outcome is written.
pub(super) const CLEANUP_BOUND: Duration = Duration::from_secs(10);

/// The bound on a repo's setup command.
pub(super) const SETUP_BOUND: Duration = Duration::from_secs(30 * 60);

/// The bound on a fetch, a setup-less git step or a push at completion.
pub(super) const GIT_BOUND: Duration = Duration::from_secs(120);

impl Workspaces {
    pub fn new(root: PathBuf, repos: BTreeMap<String, Repo>, machine: &str, push_bound: Duration) -> Self {
        Self { root, repos, machine: machine.into(), push_bound, pass_env: vec![] }
    }

    /// The same, with the settings' `pass_env` for setup commands.
    pub fn with_pass_env(mut self, pass_env: Vec<String>) -> Self {
        self.pass_env = pass_env;
        self
    }

    /// Serialises git on `repo`: in this process, then across processes.
    pub(super) async fn lock(&self, repo: &Path) -> Result<RepoLock> {
        let guard = repo_mutex(repo).lock_owned().await;
        let dir = self.root.parent().unwrap_or(&self.root).join(".locks");
        std::fs::create_dir_all(&dir)?;
        let name: String =
            repo.to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(name))?;
        let file = tokio::task::spawn_blocking(move || {
            use std::os::fd::AsRawFd;
            // SAFETY: flock on a descriptor we own; released when the file is closed.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            file
        })
        .await
        .map_err(|e| Error::from(std::io::Error::other(e)))?;
        Ok(RepoLock { _guard: guard, _file: file })
    }

    pub(super) fn record_path(&self, job: i64) -> PathBuf {
        self.root.join(format!("{job}.json"))
    }

    pub(super) fn save(&self, r: &Record) {
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.root)?;
            let tmp = self.record_path(r.job).with_extension("json.tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(r).unwrap_or_default())?;
            std::fs::rename(tmp, self.record_path(r.job))
        };
        if let Err(e) = write() {
            tracing::warn!(job = r.job, error = %e, "could not write the worktree's record");
        }
    }

    pub(super) fn record_of(wt: &Worktree) -> Record {
        Record {
            job: wt.job,
            repo: wt.repo.name.clone(),
            repo_path: wt.repo.path.clone(),
            remote: wt.repo.remote.clone(),
            branch: wt.branch.clone(),
            path: wt.path.clone(),
            gitdir: Some(wt.git_dir.clone()),
            ..Record::default()
        }
    }

    /// The worktree a record describes; its repo as configured, else as recorded (a repo
    /// removed from the settings since).
    pub(super) fn worktree_of(&self, r: &Record) -> Worktree {
        let repo = self.repos.get(&r.repo).cloned().unwrap_or(Repo {
            name: r.repo.clone(),
            path: r.repo_path.clone(),
            remote: r.remote.clone(),
            copy: vec![],
            setup: vec![],
            push: false,
            setup_on_resume: false,
            pull_request: Default::default(),
            sandbox: Default::default(),
            allow_hosts: vec![],
            read_only: vec![],
            review_loop: Default::default(),
        });
        // A record of an older version has no gitdir: the one git would make for this path.
        // A worktree whose gitdir is not there fails its git calls; it is kept, never lost.
        let git_dir = r.gitdir.clone().unwrap_or_else(|| {
            let name = r.path.file_name().map(PathBuf::from).unwrap_or_default();
            r.repo_path.join(".git").join("worktrees").join(name)
        });
        let start = StartedFrom::AgentWork(format!("the worktree at {}", r.path.display()));
        Worktree { job: r.job, repo, path: r.path.clone(), branch: r.branch.clone(), git_dir, start }
    }

    /// The records of this machine's worktrees.
    pub fn records(&self) -> Vec<Record> {
        records_in(&self.root)
    }
}

pub(super) struct RepoLock {
    pub(super) _guard: tokio::sync::OwnedMutexGuard<()>,
    pub(super) _file: std::fs::File,
}
