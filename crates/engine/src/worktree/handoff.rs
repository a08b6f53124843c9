//! The hand-off: committing the work in progress and pushing the job's branch, now or (when
//! a hand-off could not) later.

use std::time::{Duration, Instant};

use super::error::WorktreeError;
use super::record::{records_in, HandOff, Unsaved, Worktree};
use super::workspaces::{in_use, Workspaces};
use crate::git::{Git, GitError};

impl Workspaces {
    /// The hand-off: commit everything in the worktree, push the branch within the bound,
    /// and say what happened. A push that fails leaves the worktree and marks it for a later
    /// push; it never holds up the release.
    pub async fn hand_off(&self, wt: &Worktree) -> HandOff {
        let started = Instant::now();
        let deadline = started + self.push_bound;
        let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        let result = async {
            let _lock =
                tokio::time::timeout(left(), self.lock(&wt.repo.path)).await.map_err(|_| WorktreeError::LockBusy)??;
            let message = format!("devpilot: work in progress handed off by {}", self.machine);
            let git = wt.git().await;
            commit_all(&git, wt, &message, left()).await?;
            if unsaved(&git, wt, left()).await? == Unsaved::Nothing && !on_remote(&git, wt, left()).await {
                return Ok(None);
            }
            push(&git, wt, left()).await?;
            Ok::<_, WorktreeError>(Some(wt.branch.clone()))
        }
        .await;
        let took = started.elapsed();
        let secs = format!("{:.1} s", took.as_secs_f64());
        let mut record = Self::record_of(wt);
        let out = match result {
            Ok(Some(branch)) => HandOff {
                detail: format!("work in progress pushed to {}/{branch} in {secs}", wt.repo.remote),
                pushed: Some(branch),
                stayed: None,
                took,
            },
            Ok(None) => {
                HandOff { pushed: None, stayed: None, detail: format!("no work in progress to carry ({secs})"), took }
            }
            Err(e) => {
                record.pending_push = true;
                record.kept = Some("its hand-off could not push".into());
                HandOff {
                    pushed: None,
                    stayed: Some(format!("the push failed: {e}")),
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
}

/// Pathspecs of everything in the worktree but the files copied in from the clone (a
/// `.env` is never committed, pushed, or counted as unsaved work).
pub(super) fn pathspecs(wt: &Worktree) -> Vec<String> {
    let mut specs = vec!["--".to_string(), ".".to_string()];
    specs.extend(wt.repo.copy.iter().map(|f| format!(":(exclude){f}")));
    specs
}

/// Commits everything in the worktree (a fallback identity when git has none). No hook runs:
/// `--no-verify`, and [`Git`]'s `core.hooksPath=/dev/null` for the others.
pub(super) async fn commit_all(git: &Git, wt: &Worktree, message: &str, bound: Duration) -> Result<(), GitError> {
    // Everything, then the copied files back out of the index. Excluding them in the add's
    // pathspec instead fails the add when one is ignored (git names it as an ignored path
    // given on the command line), and a `.env` that `copy` brings in usually is.
    git.run(&["add", "-A", "--", "."], bound).await?;
    if !wt.repo.copy.is_empty() {
        let reset: Vec<&str> =
            ["reset", "-q", "--"].into_iter().chain(wt.repo.copy.iter().map(String::as_str)).collect();
        git.run(&reset, bound).await?;
    }
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
pub(super) async fn unsaved(git: &Git, wt: &Worktree, bound: Duration) -> Result<Unsaved, WorktreeError> {
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
        .map_err(WorktreeError::RevList)?;
    Ok(if n == 0 { Unsaved::Nothing } else { Unsaved::Commits(n) })
}

/// Whether the job's branch is on the remote already (pushed by an earlier hand-off).
pub(super) async fn on_remote(git: &Git, wt: &Worktree, bound: Duration) -> bool {
    let r = format!("refs/remotes/{}/{}", wt.repo.remote, wt.branch);
    git.run(&["rev-parse", "--verify", "--quiet", &r], bound).await.is_ok()
}

pub(super) async fn push(git: &Git, wt: &Worktree, bound: Duration) -> Result<(), GitError> {
    let spec = format!("HEAD:refs/heads/{}", wt.branch);
    git.run(&["push", "--quiet", "--no-verify", &wt.repo.remote, &spec], bound).await?;
    // So `unsaved` sees the pushed commits as on the remote.
    let track = format!("refs/remotes/{}/{}", wt.repo.remote, wt.branch);
    git.run(&["update-ref", &track, "HEAD"], bound).await.map(|_| ())
}
