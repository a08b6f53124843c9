//! Cleanup: after an attempt or a hand-off, and by retention, a worktree goes only when
//! nothing in it would be lost; otherwise it is kept and its record says why.

use std::path::Path;

use super::error::WorktreeError;
use super::handoff::{commit_all, push, unsaved};
use super::record::{HandOff, Record, Worktree};
use super::workspaces::{in_use, Workspaces, CLEANUP_BOUND, GIT_BOUND};
use crate::git::Git;

/// What a finish did: where the worktree is kept (if it is), the remote the completed job's
/// branch was pushed to (if it was), and the commits the branch had beyond the remote's
/// own branches (counted when the repo pushes; 0: the agent changed nothing, and nothing was
/// pushed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Finished {
    pub kept: Option<String>,
    pub pushed: Option<String>,
    pub commits: Option<i64>,
}

/// The commits on the worktree's HEAD that none of the remote's branches has, other than
/// DevPilot's own (`devpilot/*`, where a hand-off or an earlier attempt pushed this very
/// work): what a pull request would carry. `None`: git could not say.
async fn new_commits(git: &Git, wt: &Worktree) -> Option<i64> {
    let exclude = format!("--exclude={}/devpilot/*", wt.repo.remote);
    let remotes = format!("--remotes={}", wt.repo.remote);
    let out = git.run(&["rev-list", "--count", "HEAD", "--not", &exclude, &remotes], GIT_BOUND).await;
    match out {
        Ok(n) => n.trim().parse().ok(),
        Err(e) => {
            tracing::warn!(job = wt.job, error = %e, "could not count the branch's commits");
            None
        }
    }
}

/// A remote's URL with any user name and password taken out (`https://tok@github.com/…`);
/// an scp-like address (`git@github.com:acme/webapp.git`) names an SSH user, no secret.
fn without_credentials(remote: &str) -> String {
    match url::Url::parse(remote) {
        Ok(mut u) if u.has_authority() => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        _ => remote.to_string(),
    }
}

impl Workspaces {
    /// The cleanup after a hand-off's release: the worktree goes if nothing in it would be
    /// lost. Bounded, and after the release, so it never holds a job back.
    pub async fn after_hand_off(&self, wt: &Worktree, carried: &HandOff) {
        if carried.stayed.is_none() {
            let _ = tokio::time::timeout(CLEANUP_BOUND, self.remove_if_safe(wt)).await;
        }
        in_use().remove(&wt.path);
    }

    /// After the job's attempt ended: push the branch if the job completed and the repo says
    /// so, then remove the worktree if nothing in it would be lost. A failed attempt keeps its
    /// worktree (until retention) for the next attempt here.
    pub async fn finish(&self, wt: &Worktree, completed: bool) -> Finished {
        let (pushed, commits) = if completed { self.push_completed(wt).await } else { (None, None) };
        let kept = self.finish_inner(wt, completed).await;
        in_use().remove(&wt.path);
        Finished { kept, pushed, commits }
    }

    /// Commits what the agent left and pushes the branch, if the repo says so and the branch
    /// has anything the remote's own branches lack: the remote's URL (without credentials)
    /// when the push went through, and the commits counted.
    async fn push_completed(&self, wt: &Worktree) -> (Option<String>, Option<i64>) {
        if !wt.repo.push {
            return (None, None);
        }
        let Ok(Ok(_lock)) = tokio::time::timeout(CLEANUP_BOUND, self.lock(&wt.repo.path)).await else {
            return (None, None);
        };
        // An agent that leaves committing to us (aider with --no-auto-commits) still gets its
        // work onto the pushed branch.
        let message = format!("devpilot: job #{} completed on {}", wt.job, self.machine);
        let git = wt.git().await;
        if let Err(e) = commit_all(&git, wt, &message, GIT_BOUND).await {
            tracing::warn!(job = wt.job, error = %e, "could not commit the job's work");
            return (None, None);
        }
        let commits = new_commits(&git, wt).await;
        if commits == Some(0) {
            tracing::info!(job = wt.job, "the agent changed nothing: no branch is pushed");
            return (None, commits);
        }
        if let Err(e) = push(&git, wt, GIT_BOUND).await {
            tracing::warn!(job = wt.job, error = %e, "could not push the job's branch");
            return (None, commits);
        }
        let key = format!("remote.{}.url", wt.repo.remote);
        let url = match git.run(&["config", "--get", &key], GIT_BOUND).await {
            Ok(url) => without_credentials(url.trim()),
            // A remote named by URL rather than by name.
            Err(_) => without_credentials(&wt.repo.remote),
        };
        (Some(url), commits)
    }

    pub(super) async fn finish_inner(&self, wt: &Worktree, completed: bool) -> Option<String> {
        if !completed {
            let mut r = Self::record_of(wt);
            r.kept = Some("its attempt did not complete".into());
            self.save(&r);
            return None;
        }
        let removed = tokio::time::timeout(CLEANUP_BOUND + GIT_BOUND, self.remove_if_safe(wt)).await;
        match removed {
            Ok(kept) => kept.map(|why| format!("{}:{} ({why})", self.machine, wt.path.display())),
            Err(_) => Some(format!("{}:{} (cleanup timed out)", self.machine, wt.path.display())),
        }
    }

    /// Removes the worktree if nothing would be lost; else keeps it and says why.
    pub(super) async fn remove_if_safe(&self, wt: &Worktree) -> Option<String> {
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
        let removed = match std::fs::remove_dir_all(&wt.path) {
            Ok(()) => clone.run(&["worktree", "prune"], GIT_BOUND).await.map_err(WorktreeError::from),
            Err(e) => Err(WorktreeError::from(e)),
        };
        match removed {
            Ok(_) => {
                // Only a branch whose every commit is on the remote (the agent may have
                // switched branches in the worktree).
                let remotes = format!("--remotes={}", wt.repo.remote);
                let local = format!("refs/heads/{}", wt.branch);
                let left = clone.run(&["rev-list", "--count", &local, "--not", &remotes], GIT_BOUND).await;
                if matches!(left.as_deref(), Ok("0")) {
                    let _ = clone.run(&["branch", "-D", &wt.branch], GIT_BOUND).await;
                }
                let _ = std::fs::remove_file(self.record_path(wt.job));
                self.remove_store(wt);
                None
            }
            Err(e) => {
                tracing::warn!(job = wt.job, error = %e, "could not remove the worktree");
                Some(format!("it could not be removed ({e})"))
            }
        }
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

#[cfg(test)]
mod tests {
    /// A token in a remote's URL never leaves the clone; an SSH address stays as it is.
    #[test]
    fn remotes_lose_their_credentials() {
        assert_eq!(
            super::without_credentials("https://x:ghp_secret@github.com/acme/w.git"),
            "https://github.com/acme/w.git"
        );
        assert_eq!(super::without_credentials("git@github.com:acme/w.git"), "git@github.com:acme/w.git");
    }
}
