//! A git worktree per job, and the hand-off that carries its work to the next machine.
//!
//! For a job with a `repo`, the runner fetches the base (or the branch a hand-off pushed),
//! creates a worktree at `<data dir>/worktrees/<orchestrator>/<job id>` on the job's branch
//! `devpilot/<id>-<slug>`, copies the repo's `copy` files in, runs its `setup` argv there and
//! starts the agent in it. When the agent is stopped by a hand-off, everything in the worktree
//! is committed and the branch pushed within a time bound; the release then names the branch.
//!
//! What is trusted, and what is not (the README's security model says the same):
//! - `base` resolves only from the remote's refs (freshly fetched, or the last fetched copy),
//!   never from a local branch, which may be private.
//! - `setup` runs only in a worktree created from the remote's base, which is not a branch
//!   of DevPilot's own (`devpilot/…`, pushed by agents): never again on a reused or resumed
//!   worktree, whose code an agent wrote, unless the repo says `setup_on_resume = true`.
//! - The `copy` files are written without following a symlink anywhere on their way and
//!   never outside the worktree ([`crate::safe_fs`]).
//! - Every git call of DevPilot's own names the gitdir it recorded when it created the
//!   worktree, and runs nothing the agent could have planted ([`crate::git`]).
//!
//! Cleanup never destroys work: a worktree is removed only when it has no uncommitted changes
//! and no commit that is not on the remote; otherwise it is kept and the job says where.
//!
//! Git operations on one repository are serialised (a mutex in this process and a `flock`
//! across processes), so `index.lock` never collides. Every git call is bounded, and git is
//! never allowed to prompt.
//!
//! Each worktree has a record next to it (`<job id>.json`), so `devpilot worktrees` can list
//! them and a push that failed during a hand-off is retried later.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::git::redact_credentials;
use crate::git::Git;

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
}

impl Repo {
    pub fn from_settings(name: &str, s: &RepoSettings) -> Result<Self> {
        crate::spec::validate_name("repo", name)?;
        if s.path.trim().is_empty() {
            return Err(Error::Invalid(format!("repo '{name}' has no path")));
        }
        for f in &s.copy {
            let p = Path::new(f);
            if p.is_absolute() || p.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
                return Err(Error::Invalid(format!("repo '{name}': copy '{f}' must be a path inside the repo")));
            }
        }
        Ok(Self {
            name: name.into(),
            path: expand_home(s.path.trim()),
            remote: s.remote.clone().filter(|r| !r.trim().is_empty()).unwrap_or_else(|| "origin".into()),
            copy: s.copy.clone(),
            setup: s.setup.clone(),
            push: s.push,
            setup_on_resume: s.setup_on_resume,
        })
    }

    /// `NAME=PATH` (from `devpilot run --repo`).
    pub fn from_flag(flag: &str) -> Result<Self> {
        let (name, path) = flag
            .split_once('=')
            .ok_or_else(|| Error::Invalid(format!("--repo '{flag}' must be NAME=PATH, e.g. webapp=~/src/webapp")))?;
        Self::from_settings(name.trim(), &RepoSettings { path: path.into(), ..RepoSettings::default() })
    }
}

/// `~/x` as this user's home + `x`.
pub fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ if p == "~" => std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(p)),
        _ => PathBuf::from(p),
    }
}

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

    /// Git in this worktree, with its gitdir named.
    async fn git(&self) -> Git {
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
    fn describe(&self) -> Option<String> {
        match self {
            Unsaved::Nothing => None,
            Unsaved::Changes => Some("it has uncommitted changes".into()),
            Unsaved::Commits(n) => Some(format!("it has {n} commit(s) that are not on the remote")),
        }
    }
}

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
fn repo_mutex(repo: &Path) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
    let mut locks = LOCKS.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner());
    locks.entry(repo.to_path_buf()).or_default().clone()
}

/// The worktrees a job of this process is using now: a later push of pending work or a
/// prune never removes one of them.
fn in_use() -> std::sync::MutexGuard<'static, HashSet<PathBuf>> {
    static IN_USE: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    IN_USE.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// The lock wait of a cleanup that runs after the job's outcome is written.
const CLEANUP_BOUND: Duration = Duration::from_secs(10);

/// The bound on a repo's setup command.
const SETUP_BOUND: Duration = Duration::from_secs(30 * 60);

/// The bound on a fetch, a setup-less git step or a push at completion.
const GIT_BOUND: Duration = Duration::from_secs(120);

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
    async fn lock(&self, repo: &Path) -> Result<RepoLock> {
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
        .map_err(|e| Error::Io(e.to_string()))?;
        Ok(RepoLock { _guard: guard, _file: file })
    }

    fn record_path(&self, job: i64) -> PathBuf {
        self.root.join(format!("{job}.json"))
    }

    fn save(&self, r: &Record) {
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

    fn record_of(wt: &Worktree) -> Record {
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

    /// Creates (or, for a job that ran here before, reuses) the job's worktree, starting from
    /// `resume` (a branch a hand-off pushed) or `base`. Progress goes to `log`.
    pub async fn prepare(
        &self,
        job: i64,
        repo_name: &str,
        branch: &str,
        base: Option<&str>,
        resume: Option<&str>,
        log: &mut std::fs::File,
    ) -> std::result::Result<Worktree, String> {
        let repo = self
            .repos
            .get(repo_name)
            .cloned()
            .ok_or_else(|| format!("this machine has no repo '{repo_name}' configured"))?;
        if !repo.path.join(".git").exists() {
            return Err(format!("repo '{}': {} is not a git clone", repo.name, repo.path.display()));
        }
        if let Some(r) = resume {
            crate::spec::validate_base(r).map_err(|_| format!("the handed-off branch {r:?} is not a branch name"))?;
        }
        let path = self.root.join(job.to_string());
        let _lock = self.lock(&repo.path).await.map_err(|e| e.to_string())?;
        in_use().insert(path.clone());
        let clone = Git::clone_at(&repo.path).await;
        if let Some(wt) = self.reusable(job, &repo, branch, &path, &clone).await {
            say(log, &format!("reusing the worktree of an earlier attempt at {}", path.display()));
            if let Some(r) = resume {
                // Work handed off by another machine since: bring it in (fast-forward only).
                let theirs = format!("{}/{r}", repo.remote);
                let ff = fetch(&clone, &repo, r, log).await
                    && wt.git().await.run(&["merge", "--ff-only", "--no-stat", &theirs], GIT_BOUND).await.is_ok();
                if !ff {
                    say(log, &format!("could not bring in {r} (fast-forward only); this worktree keeps its own work"));
                }
            }
            self.save(&Self::record_of(&wt));
            return Ok(wt);
        }
        if path.exists() {
            // Left half-made by an attempt that was stopped while creating it.
            say(log, "removing a half-made worktree of an earlier attempt");
            let _ = std::fs::remove_dir_all(&path);
        }
        let start = match resume {
            Some(r) if fetch(&clone, &repo, r, log).await => StartedFrom::AgentWork(format!("{}/{r}", repo.remote)),
            Some(r) => return Err(format!("cannot fetch the handed-off branch {r} from {}", repo.remote)),
            // The job's branch is on the remote already (pushed by an earlier attempt, or
            // later than its hand-off): go on from it rather than from the base.
            None if fetch_quiet(&clone, &repo, branch).await => {
                StartedFrom::AgentWork(format!("{}/{branch}", repo.remote))
            }
            None => start_point(&clone, &repo, base, log).await?,
        };
        let from = match &start {
            StartedFrom::Base(r) | StartedFrom::AgentWork(r) => r.clone(),
        };
        crate::safe_fs::private_dir(&self.root).map_err(|e| e.to_string())?;
        let _ = clone.run(&["worktree", "prune"], GIT_BOUND).await;
        let p = path.to_string_lossy().to_string();
        let local = format!("refs/heads/{branch}");
        let exists = clone.run(&["rev-parse", "--verify", "--quiet", &local], GIT_BOUND).await.is_ok();
        let (args, start): (Vec<&str>, StartedFrom) = if !exists {
            (vec!["worktree", "add", "-b", branch, &p, &from], start)
        } else if clone.run(&["merge-base", "--is-ancestor", branch, &from], GIT_BOUND).await.is_ok() {
            (vec!["worktree", "add", "-B", branch, &p, &from], start)
        } else {
            // The local branch has commits the start point lacks: never reset them away.
            say(log, &format!("branch {branch} has local commits; keeping them"));
            (vec!["worktree", "add", &p, branch], StartedFrom::AgentWork(local.clone()))
        };
        clone.run(&args, GIT_BOUND).await.map_err(|e| format!("cannot create the worktree: {e}"))?;
        // Read now, before any agent has run in it, and named in every later git call.
        let git_dir = crate::git::worktree_gitdir(&clone, &path).await?;
        say(log, &format!("worktree {} on branch {branch} from {from}", path.display()));
        let wt = Worktree { job, repo: repo.clone(), path: path.clone(), branch: branch.into(), git_dir, start };
        self.save(&Self::record_of(&wt));
        drop(_lock);
        copy_files(&repo, &path, log);
        Ok(wt)
    }

    /// The worktree an earlier attempt of this job left here, if it is still a checkout with
    /// the gitdir DevPilot recorded for it (an older record's is derived and checked against
    /// the clone's own worktree list).
    async fn reusable(&self, job: i64, repo: &Repo, branch: &str, path: &Path, clone: &Git) -> Option<Worktree> {
        if !path.is_dir() {
            return None;
        }
        let recorded = records_in(&self.root).into_iter().find(|r| r.job == job).and_then(|r| r.gitdir);
        let git_dir = match recorded {
            Some(g) => g,
            None => crate::git::worktree_gitdir(clone, path).await.ok()?,
        };
        let start = StartedFrom::AgentWork(format!("the worktree of an earlier attempt at {}", path.display()));
        let wt = Worktree { job, repo: repo.clone(), path: path.to_path_buf(), branch: branch.into(), git_dir, start };
        wt.git().await.run(&["rev-parse", "--verify", "HEAD"], GIT_BOUND).await.ok()?;
        Some(wt)
    }

    /// Runs the repo's setup argv in the worktree, its output into `log`, if it may run there
    /// ([`Worktree::setup_allowed`]; else it says why not). The error carries the last lines
    /// of that output. The setup sees only the allowlisted environment (and `pass_env`).
    pub async fn setup(
        &self,
        wt: &Worktree,
        log: &mut std::fs::File,
        log_path: &Path,
    ) -> std::result::Result<(), String> {
        let Some((prog, args)) = wt.repo.setup.split_first() else { return Ok(()) };
        if !wt.setup_allowed() {
            let StartedFrom::AgentWork(from) = &wt.start else { return Ok(()) };
            say(
                log,
                &format!(
                    "setup `{}` not run: this worktree holds an agent's work ({from}), not the remote's base; \
                     set setup_on_resume = true in the repo's settings to run it anyway",
                    wt.repo.setup.join(" ")
                ),
            );
            return Ok(());
        }
        let before = log.metadata().map(|m| m.len()).unwrap_or(0);
        let out = log.try_clone().map_err(|e| e.to_string())?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let mut child = tokio::process::Command::new(prog)
            .args(args)
            .current_dir(&wt.path)
            .env_clear()
            .envs(crate::environ::allowed(&[crate::environ::BASE], &self.pass_env))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("setup `{}` could not start: {e}", wt.repo.setup.join(" ")))?;
        // Stopped (the job's hand-off) or timed out: the whole group goes, not only the child.
        let group = GroupKill(child.id());
        let status = match tokio::time::timeout(SETUP_BOUND, child.wait()).await {
            Ok(s) => s.map_err(|e| format!("setup `{}`: {e}", wt.repo.setup.join(" ")))?,
            Err(_) => {
                return Err(format!(
                    "setup `{}` took longer than {}",
                    wt.repo.setup.join(" "),
                    humantime::format_duration(SETUP_BOUND)
                ))
            }
        };
        std::mem::forget(group);
        if status.success() {
            return Ok(());
        }
        let tail = crate::agent::last_lines(log_path, before, 5);
        Err(format!("setup `{}` failed ({status}): {tail}", wt.repo.setup.join(" ")))
    }

    /// The hand-off: commit everything in the worktree, push the branch within the bound,
    /// and say what happened. A push that fails leaves the worktree and marks it for a later
    /// push; it never holds up the release.
    pub async fn hand_off(&self, wt: &Worktree) -> HandOff {
        let started = Instant::now();
        let deadline = started + self.push_bound;
        let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        let result = async {
            let _lock = tokio::time::timeout(left(), self.lock(&wt.repo.path))
                .await
                .map_err(|_| "another git operation on the repo held it past the bound".to_string())?
                .map_err(|e| e.to_string())?;
            let message = format!("devpilot: work in progress handed off by {}", self.machine);
            let git = wt.git().await;
            commit_all(&git, wt, &message, left()).await?;
            if unsaved(&git, wt, left()).await? == Unsaved::Nothing && !on_remote(&git, wt, left()).await {
                return Ok(None);
            }
            push(&git, wt, left()).await?;
            Ok::<_, String>(Some(wt.branch.clone()))
        }
        .await;
        let took = started.elapsed();
        let secs = format!("{:.1} s", took.as_secs_f64());
        let mut record = Self::record_of(wt);
        let out = match result {
            Ok(Some(branch)) => HandOff {
                detail: format!("work in progress pushed to {}/{branch} in {secs}", wt.repo.remote),
                pushed: Some(branch),
                took,
            },
            Ok(None) => HandOff { pushed: None, detail: format!("no work in progress to carry ({secs})"), took },
            Err(e) => {
                record.pending_push = true;
                record.kept = Some("its hand-off could not push".into());
                HandOff {
                    pushed: None,
                    detail: format!(
                        "work in progress stayed on {} at {} (push failed: {e}); it is pushed when this machine can",
                        self.machine,
                        wt.path.display()
                    ),
                    took,
                }
            }
        };
        if record.pending_push {
            self.save(&record);
        }
        out
    }

    /// The cleanup after a hand-off's release: the worktree goes if nothing in it would be
    /// lost. Bounded, and after the release, so it never holds a job back.
    pub async fn after_hand_off(&self, wt: &Worktree, carried: &HandOff) {
        if carried.pushed.is_some() || !carried.detail.contains("stayed on") {
            let _ = tokio::time::timeout(CLEANUP_BOUND, self.remove_if_safe(wt)).await;
        }
        in_use().remove(&wt.path);
    }

    /// After the job's attempt ended: push the branch if the job completed and the repo says
    /// so, then remove the worktree if nothing in it would be lost. `Some(where)` when it is
    /// kept. A failed attempt keeps its worktree (until retention) for the next attempt here.
    pub async fn finish(&self, wt: &Worktree, completed: bool) -> Option<String> {
        let kept = self.finish_inner(wt, completed).await;
        in_use().remove(&wt.path);
        kept
    }

    async fn finish_inner(&self, wt: &Worktree, completed: bool) -> Option<String> {
        if !completed {
            let mut r = Self::record_of(wt);
            r.kept = Some("its attempt did not complete".into());
            self.save(&r);
            return None;
        }
        if wt.repo.push {
            if let Ok(Ok(_lock)) = tokio::time::timeout(CLEANUP_BOUND, self.lock(&wt.repo.path)).await {
                // An agent that leaves committing to us (aider with --no-auto-commits) still
                // gets its work onto the pushed branch.
                let message = format!("devpilot: job #{} completed on {}", wt.job, self.machine);
                let pushed = async {
                    let git = wt.git().await;
                    commit_all(&git, wt, &message, GIT_BOUND).await?;
                    push(&git, wt, GIT_BOUND).await
                };
                if let Err(e) = pushed.await {
                    tracing::warn!(job = wt.job, error = %e, "could not push the job's branch");
                }
            }
        }
        let removed = tokio::time::timeout(CLEANUP_BOUND + GIT_BOUND, self.remove_if_safe(wt)).await;
        match removed {
            Ok(kept) => kept.map(|why| format!("{}:{} ({why})", self.machine, wt.path.display())),
            Err(_) => Some(format!("{}:{} (cleanup timed out)", self.machine, wt.path.display())),
        }
    }

    /// Removes the worktree if nothing would be lost; else keeps it and says why.
    async fn remove_if_safe(&self, wt: &Worktree) -> Option<String> {
        let why = match unsaved(&wt.git().await, wt, GIT_BOUND).await {
            Ok(u) => u.describe(),
            Err(e) => Some(format!("its state could not be read ({e})")),
        };
        if let Some(why) = why {
            let mut r = Self::record_of(wt);
            r.kept = Some(why.clone());
            self.save(&r);
            return Some(why);
        }
        let _lock = self.lock(&wt.repo.path).await.ok();
        // The files copied in from the clone are ours to remove (never through a symlinked
        // directory); anything else untracked has kept the worktree above.
        for f in &wt.repo.copy {
            let _ = crate::safe_fs::remove_beneath(&wt.path, Path::new(f));
        }
        // Nothing in it is unsaved: the directory goes (without following a link out of it),
        // and git forgets it. (`git worktree remove` would run a status inside the worktree,
        // reading what the agent left there.)
        let clone = Git::clone_at(&wt.repo.path).await;
        let removed = std::fs::remove_dir_all(&wt.path).map_err(|e| e.to_string());
        let removed = match removed {
            Ok(()) => clone.run(&["worktree", "prune"], GIT_BOUND).await,
            Err(e) => Err(e),
        };
        match removed {
            Ok(_) => {
                // Only a branch whose every commit is on the remote (the agent may have
                // switched branches in the worktree).
                let remotes = format!("--remotes={}", wt.repo.remote);
                let local = format!("refs/heads/{}", wt.branch);
                let left = clone.run(&["rev-list", "--count", &local, "--not", &remotes], GIT_BOUND).await;
                if left.as_deref() == Ok("0") {
                    let _ = clone.run(&["branch", "-D", &wt.branch], GIT_BOUND).await;
                }
                let _ = std::fs::remove_file(self.record_path(wt.job));
                None
            }
            Err(e) => {
                tracing::warn!(job = wt.job, error = %e, "could not remove the worktree");
                Some(format!("it could not be removed ({e})"))
            }
        }
    }

    /// The worktree a record describes; its repo as configured, else as recorded (a repo
    /// removed from the settings since).
    fn worktree_of(&self, r: &Record) -> Worktree {
        let repo = self.repos.get(&r.repo).cloned().unwrap_or(Repo {
            name: r.repo.clone(),
            path: r.repo_path.clone(),
            remote: r.remote.clone(),
            copy: vec![],
            setup: vec![],
            push: false,
            setup_on_resume: false,
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

    /// Pushes the branches whose hand-off could not push. Returns (job, branch) of each
    /// pushed now; the caller records it on the job.
    pub async fn push_pending(&self) -> Vec<(i64, String)> {
        let mut pushed = vec![];
        for r in self.records().into_iter().filter(|r| r.pending_push) {
            let wt = self.worktree_of(&r);
            let Ok(_lock) = self.lock(&wt.repo.path).await else { continue };
            // Looked at again under the lock: this machine may have claimed the job again.
            let still = records_in(&self.root).into_iter().any(|x| x.job == r.job && x.pending_push);
            if !still || in_use().contains(&wt.path) {
                continue;
            }
            let bound = self.push_bound.max(Duration::from_secs(10));
            let message = format!("devpilot: work in progress handed off by {}", self.machine);
            let git = wt.git().await;
            if commit_all(&git, &wt, &message, bound).await.is_ok() && push(&git, &wt, bound).await.is_ok() {
                drop(_lock);
                tracing::info!(job = r.job, branch = %r.branch, "pushed the work in progress a hand-off left here");
                let mut done = r.clone();
                done.pending_push = false;
                self.save(&done);
                self.remove_if_safe(&wt).await;
                pushed.push((r.job, r.branch));
            }
        }
        pushed
    }

    /// Removes the worktrees of jobs in `finished` that have nothing unsaved; returns the
    /// removed and the kept ones (with why).
    pub async fn prune(&self, finished: &(dyn Fn(i64) -> bool + Sync)) -> (Vec<Record>, Vec<Record>) {
        let (mut removed, mut kept) = (vec![], vec![]);
        for r in self.records().into_iter().filter(|r| finished(r.job) && !r.pending_push) {
            let wt = self.worktree_of(&r);
            if in_use().contains(&wt.path) {
                continue;
            }
            match self.remove_if_safe(&wt).await {
                None => removed.push(r),
                Some(why) => kept.push(Record { kept: Some(why), ..r }),
            }
        }
        (removed, kept)
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

/// Kills a process group when dropped (a setup that was stopped or timed out).
struct GroupKill(Option<u32>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            // SAFETY: plain kill(2) on the setup's own process group.
            unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
        }
    }
}

struct RepoLock {
    _guard: tokio::sync::OwnedMutexGuard<()>,
    _file: std::fs::File,
}

fn say(log: &mut std::fs::File, line: &str) {
    use std::io::Write;
    let _ = writeln!(log, "devpilot: {line}");
}

/// [`fetch`] that logs nothing: whether branch `b` is on the remote (and now fetched).
async fn fetch_quiet(clone: &Git, repo: &Repo, b: &str) -> bool {
    let spec = format!("+refs/heads/{b}:refs/remotes/{}/{b}", repo.remote);
    clone.run(&["fetch", "--quiet", "--no-tags", &repo.remote, &spec], GIT_BOUND).await.is_ok()
}

/// Fetches branch `b` of the repo's remote into `refs/remotes/<remote>/<b>`.
async fn fetch(clone: &Git, repo: &Repo, b: &str, log: &mut std::fs::File) -> bool {
    let spec = format!("+refs/heads/{b}:refs/remotes/{}/{b}", repo.remote);
    match clone.run(&["fetch", "--quiet", "--no-tags", &repo.remote, &spec], GIT_BOUND).await {
        Ok(_) => true,
        Err(e) => {
            say(log, &format!("fetching {b} from {}: {e}", repo.remote));
            false
        }
    }
}

/// Where a new worktree starts: the remote's `base` (default: its default branch), freshly
/// fetched; offline, the last fetched copy of it. Never a local branch: it may be private,
/// and the job's branch is pushed to the remote. A base under `devpilot/` is a branch an
/// agent pushed: its code is an agent's.
async fn start_point(
    clone: &Git,
    repo: &Repo,
    base: Option<&str>,
    log: &mut std::fs::File,
) -> std::result::Result<StartedFrom, String> {
    let base = match base {
        Some(b) => b.to_string(),
        None => default_branch(clone, repo).await,
    };
    let remote_ref = format!("refs/remotes/{}/{base}", repo.remote);
    let fetched = fetch(clone, repo, &base, log).await;
    if !fetched {
        if clone.run(&["rev-parse", "--verify", "--quiet", &remote_ref], GIT_BOUND).await.is_err() {
            return Err(format!(
                "repo '{}' has no branch '{base}' on {} (a base is taken only from the remote)",
                repo.name, repo.remote
            ));
        }
        say(log, &format!("starting from the last fetched copy {remote_ref}"));
    }
    let from = format!("{}/{base}", repo.remote);
    Ok(if base.starts_with("devpilot/") { StartedFrom::AgentWork(from) } else { StartedFrom::Base(from) })
}

/// The remote's default branch (what its HEAD points at); `main` if it cannot be told.
async fn default_branch(clone: &Git, repo: &Repo) -> String {
    if let Ok(out) = clone.run(&["ls-remote", "--symref", &repo.remote, "HEAD"], GIT_BOUND).await {
        if let Some(b) = out.lines().find_map(|l| l.strip_prefix("ref: refs/heads/")?.split('\t').next()) {
            return b.to_string();
        }
    }
    let head = format!("refs/remotes/{}/HEAD", repo.remote);
    if let Ok(out) = clone.run(&["symbolic-ref", "--short", &head], GIT_BOUND).await {
        if let Some(b) = out.split_once('/').map(|(_, b)| b.to_string()) {
            return b;
        }
    }
    "main".into()
}

/// Copies the repo's `copy` files from the clone into the new worktree, never through a
/// symlink the base branch tracks (`.env -> leaked.txt` would put the secret into a file
/// that is committed; `.envrc -> /elsewhere` would write outside the worktree).
fn copy_files(repo: &Repo, wt: &Path, log: &mut std::fs::File) {
    for f in &repo.copy {
        let copied = std::fs::File::open(repo.path.join(f))
            .and_then(|mut from| crate::safe_fs::write_beneath(wt, Path::new(f), &mut from, 0o600));
        match copied {
            Ok(_) => say(log, &format!("copied {f}")),
            Err(e) => say(log, &format!("did not copy {f} from {}: {e}", repo.path.display())),
        }
    }
}

/// Pathspecs of everything in the worktree but the files copied in from the clone (a
/// `.env` is never committed, pushed, or counted as unsaved work).
fn pathspecs(wt: &Worktree) -> Vec<String> {
    let mut specs = vec!["--".to_string(), ".".to_string()];
    specs.extend(wt.repo.copy.iter().map(|f| format!(":(exclude){f}")));
    specs
}

/// Commits everything in the worktree (a fallback identity when git has none). No hook runs:
/// `--no-verify`, and [`Git`]'s `core.hooksPath=/dev/null` for the others.
async fn commit_all(git: &Git, wt: &Worktree, message: &str, bound: Duration) -> std::result::Result<(), String> {
    let specs = pathspecs(wt);
    let with = |base: &[&'static str]| -> Vec<String> {
        base.iter().map(|s| s.to_string()).chain(specs.iter().cloned()).collect()
    };
    let add = with(&["add", "-A"]);
    git.run(&add.iter().map(String::as_str).collect::<Vec<_>>(), bound).await?;
    if git.run(&["diff", "--cached", "--quiet", "--no-ext-diff", "--no-textconv"], bound).await.is_ok() {
        return Ok(());
    }
    let mut args = vec![];
    if git.run(&["config", "user.email"], bound).await.unwrap_or_default().is_empty() {
        args.extend(["-c", "user.name=DevPilot", "-c", "user.email=devpilot@localhost"]);
    }
    args.extend(["commit", "--quiet", "--no-verify", "-m", message]);
    git.run(&args, bound).await.map(|_| ())
}

/// What in the worktree is not safe on the remote.
async fn unsaved(git: &Git, wt: &Worktree, bound: Duration) -> std::result::Result<Unsaved, String> {
    if !wt.path.exists() {
        return Ok(Unsaved::Nothing);
    }
    // Every untracked file, whatever `status.showUntrackedFiles` the repository sets.
    let status: Vec<String> = ["status", "--porcelain", "-uall", "--ignore-submodules=all"]
        .iter()
        .map(|s| s.to_string())
        .chain(pathspecs(wt))
        .collect();
    if !git.run(&status.iter().map(String::as_str).collect::<Vec<_>>(), bound).await?.is_empty() {
        return Ok(Unsaved::Changes);
    }
    let remotes = format!("--remotes={}", wt.repo.remote);
    let n: u32 = git
        .run(&["rev-list", "--count", "HEAD", "--not", &remotes], bound)
        .await?
        .parse()
        .map_err(|e| format!("unexpected rev-list output: {e}"))?;
    Ok(if n == 0 { Unsaved::Nothing } else { Unsaved::Commits(n) })
}

/// Whether the job's branch is on the remote already (pushed by an earlier hand-off).
async fn on_remote(git: &Git, wt: &Worktree, bound: Duration) -> bool {
    let r = format!("refs/remotes/{}/{}", wt.repo.remote, wt.branch);
    git.run(&["rev-parse", "--verify", "--quiet", &r], bound).await.is_ok()
}

async fn push(git: &Git, wt: &Worktree, bound: Duration) -> std::result::Result<(), String> {
    let spec = format!("HEAD:refs/heads/{}", wt.branch);
    git.run(&["push", "--quiet", "--no-verify", &wt.repo.remote, &spec], bound).await?;
    // So `unsaved` sees the pushed commits as on the remote.
    let track = format!("refs/remotes/{}/{}", wt.repo.remote, wt.branch);
    git.run(&["update-ref", &track, "HEAD"], bound).await.map(|_| ())
}
