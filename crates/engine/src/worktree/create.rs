//! Creating (or reusing) a job's worktree, copying the repo's files in and running its
//! setup.

use std::path::Path;
use std::process::Stdio;

use super::error::WorktreeError;
use super::record::{records_in, StartedFrom, Worktree};
use super::repo::Repo;
use super::workspaces::{in_use, Workspaces, GIT_BOUND, SETUP_BOUND};
use crate::git::Git;

impl Workspaces {
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
    ) -> Result<Worktree, WorktreeError> {
        let repo = self.repos.get(repo_name).cloned().ok_or_else(|| WorktreeError::NoRepo(repo_name.into()))?;
        if !repo.path.join(".git").exists() {
            return Err(WorktreeError::NotAClone { repo: repo.name, path: repo.path });
        }
        if let Some(r) = resume {
            devpilot_store::spec::validate_base(r).map_err(|_| WorktreeError::BadResumeBranch(r.into()))?;
        }
        let path = self.root.join(job.to_string());
        let _lock = self.lock(&repo.path).await?;
        exclude_tool_litter(&repo.path, log);
        in_use().insert(path.clone());
        let clone = Git::clone_at(&repo.path).await;
        if let Some(wt) = self.reusable(job, &repo, branch, &path, &clone).await {
            say(log, &format!("reusing the worktree of an earlier attempt at {}", path.display()));
            if let Some(r) = resume {
                bring_in(&clone, &repo, &wt, r, log).await;
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
            Some(r) => return Err(WorktreeError::ResumeFetch { branch: r.into(), remote: repo.remote.clone() }),
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
        crate::safe_fs::private_dir(&self.root)?;
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
        clone.run(&args, GIT_BOUND).await.map_err(WorktreeError::Create)?;
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
        sandbox: Option<&crate::sandbox::Plan>,
    ) -> Result<(), WorktreeError> {
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
        let out = log.try_clone()?;
        let err = log.try_clone()?;
        let argv = || wt.repo.setup.join(" ");
        // Confined like the agent: a setup runs what the repo says (`npm ci` runs its
        // packages' scripts), and the repo may hold an agent's work.
        let mut vars: std::collections::BTreeMap<_, _> =
            crate::environ::allowed(&[crate::environ::BASE], &self.pass_env).into_iter().collect();
        let args: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        let (_jail, prog, args) = match sandbox {
            Some(plan) => {
                let (j, p, a) = plan.command(Path::new(prog), args, &mut vars, &wt.path)?;
                (Some(j), p, a)
            }
            None => (None, prog.into(), args),
        };
        let mut child = tokio::process::Command::new(&prog)
            .args(args)
            .current_dir(&wt.path)
            .env_clear()
            .envs(vars)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .map_err(|source| WorktreeError::SetupStart { argv: argv(), source })?;
        // Stopped (the job's hand-off) or timed out: the whole group goes, not only the child.
        let group = GroupKill(child.id());
        let status = match tokio::time::timeout(SETUP_BOUND, child.wait()).await {
            Ok(s) => s.map_err(|source| WorktreeError::SetupWait { argv: argv(), source })?,
            Err(_) => return Err(WorktreeError::SetupTimedOut { argv: argv(), bound: SETUP_BOUND }),
        };
        std::mem::forget(group);
        if status.success() {
            return Ok(());
        }
        let tail = crate::agent::last_lines(log_path, before, 5);
        Err(WorktreeError::SetupFailed { argv: argv(), status, tail })
    }
}

/// Work handed off by another machine since an earlier attempt here: brought into the
/// reused worktree `wt` from branch `r` (fast-forward only).
async fn bring_in(clone: &Git, repo: &Repo, wt: &Worktree, r: &str, log: &mut std::fs::File) {
    let theirs = format!("{}/{r}", repo.remote);
    let ff = fetch(clone, repo, r, log).await
        && wt.git().await.run(&["merge", "--ff-only", "--no-stat", &theirs], GIT_BOUND).await.is_ok();
    if !ff {
        say(log, &format!("could not bring in {r} (fast-forward only); this worktree keeps its own work"));
    }
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
) -> Result<StartedFrom, WorktreeError> {
    let base = match base {
        Some(b) => b.to_string(),
        None => default_branch(clone, repo).await,
    };
    let remote_ref = format!("refs/remotes/{}/{base}", repo.remote);
    let fetched = fetch(clone, repo, &base, log).await;
    if !fetched {
        if clone.run(&["rev-parse", "--verify", "--quiet", &remote_ref], GIT_BOUND).await.is_err() {
            return Err(WorktreeError::NoBase { repo: repo.name.clone(), base, remote: repo.remote.clone() });
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

/// What agent CLIs write into a worktree for themselves (aider's chat and input history and
/// tags cache), kept out of every hand-off and completion commit and out of the unsaved-work
/// count by the clone's `info/exclude`: never by the user's `.gitignore`, which would be a
/// change to their repo.
pub const TOOL_LITTER: [&str; 1] = [".aider*"];

/// Adds [`TOOL_LITTER`] to the clone's `.git/info/exclude` where it is missing (the
/// worktrees share it). Written anew, never through a symlink; a failure is logged.
fn exclude_tool_litter(clone: &Path, log: &mut std::fs::File) {
    let git = clone.join(".git");
    if !git.is_dir() {
        return;
    }
    let path = git.join("info").join("exclude");
    let now = std::fs::read_to_string(&path).unwrap_or_default();
    let missing: Vec<&str> = TOOL_LITTER.iter().copied().filter(|p| !now.lines().any(|l| l.trim() == *p)).collect();
    if missing.is_empty() {
        return;
    }
    let mut text = now.clone();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("# devpilot: agent CLIs' own files, never part of a job's commits\n");
    for p in missing {
        text.push_str(p);
        text.push('\n');
    }
    if let Err(e) = crate::safe_fs::write_beneath(&git, Path::new("info/exclude"), &mut text.as_bytes(), 0o644) {
        say(log, &format!("could not add the agents' own files to {}: {e}", path.display()));
    }
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
