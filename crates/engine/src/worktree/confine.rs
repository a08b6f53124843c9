//! What a confined agent sees of git: it can commit on its own branch, and nothing it can
//! write is something the user's own git would run or read as configuration.
//!
//! A commit in a linked worktree writes four things: the worktree's own `HEAD` and `index`
//! (in its admin dir, `<clone>/.git/worktrees/<name>`), new objects, the branch's ref, and
//! that ref's log. Everything else it reads. So inside the sandbox:
//! - the clone's git dir is read-only: its config, hooks, `info/`, other worktrees' admin
//!   dirs, other branches and its objects;
//! - this worktree's admin dir is writable, but its `commondir` and `gitdir` (which say
//!   where the repository is, for the user's git too) are not;
//! - new objects go to the job's own store (`GIT_OBJECT_DIRECTORY`), a bare repository next
//!   to the worktree that borrows the clone's objects read-only (`objects/info/alternates`,
//!   itself read-only);
//! - `refs/heads/devpilot/` and its logs are the store's, laid over the clone's: the agent
//!   sees and moves only its own branch.
//!
//! After the agent, DevPilot takes the branch back ([`Workspaces::absorb`]): a fetch from
//! the store, which checks every object, moves the clone's branch. The store's config and
//! hooks were never visible to the agent, so that fetch runs nothing the agent wrote.

use std::path::{Path, PathBuf};

use super::error::WorktreeError;
use super::record::Worktree;
use super::workspaces::{Workspaces, GIT_BOUND};
use crate::sandbox::mounts::{Mount, Mounts};

/// The directory under `refs/heads/` that every job's branch is in.
const BRANCHES: &str = "devpilot";

/// What a confined agent's git is made of, for one worktree.
#[derive(Clone, Debug)]
pub struct GitView {
    /// The clone's common git dir (`<clone>/.git`).
    common: PathBuf,
    /// This worktree's admin dir.
    admin: PathBuf,
    /// The job's own store (a bare repository).
    store: PathBuf,
    worktree: PathBuf,
    branch: String,
    /// The branch's commit when the agent started.
    start: String,
}

impl GitView {
    /// Lays the view over `m` (see the module doc).
    pub fn mount(&self, m: &mut Mounts) {
        m.set(&self.common, Mount::ReadOnly);
        m.set(&self.admin, Mount::ReadWrite);
        for f in ["commondir", "gitdir"] {
            m.read_only(&self.admin.join(f));
        }
        for part in ["refs/heads", "logs/refs/heads"] {
            let ours = self.store.join(part).join(BRANCHES);
            m.set(self.common.join(part).join(BRANCHES), Mount::FromWritable(ours));
        }
        m.set(self.store.join("objects"), Mount::ReadWrite);
        m.set(self.store.join("objects/info"), Mount::ReadOnly);
        m.set(&self.worktree, Mount::ReadWrite);
        m.set(self.worktree.join(".git"), Mount::ReadOnly);
    }

    /// The agent's git variables: its objects go to the store.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![("GIT_OBJECT_DIRECTORY".into(), self.store.join("objects").to_string_lossy().into_owned())]
    }
}

impl Workspaces {
    /// The job's store (`<root>/<job>.git`), next to its worktree.
    fn store_of(&self, wt: &Worktree) -> PathBuf {
        self.root.join(format!("{}.git", wt.job))
    }

    /// Makes (or refreshes) the job's store for a confined agent and says what it sees.
    pub async fn confine_git(&self, wt: &Worktree) -> Result<GitView, WorktreeError> {
        let Some(rest) = wt.branch.strip_prefix(&format!("{BRANCHES}/")) else {
            return Err(WorktreeError::Confine(format!("the branch {} is not under {BRANCHES}/", wt.branch)));
        };
        let git = wt.git().await;
        let common = git.run(&["rev-parse", "--path-format=absolute", "--git-common-dir"], GIT_BOUND).await?;
        let common = PathBuf::from(common).canonicalize()?;
        let format = git.run(&["rev-parse", "--show-object-format"], GIT_BOUND).await?;
        let local = format!("refs/heads/{}", wt.branch);
        let start = git.run(&["rev-parse", "--verify", &local], GIT_BOUND).await?;
        let store = self.store_of(wt);
        write_store(&store, &common, &format)?;
        // The ref and its log, in the store: the agent's branch, and nothing else.
        for part in ["refs/heads", "logs/refs/heads"] {
            let ours = store.join(part).join(BRANCHES);
            let _ = std::fs::remove_dir_all(&ours);
            std::fs::create_dir_all(ours.join(rest).parent().unwrap_or(&ours))?;
            // The mount point in the clone (git makes it with the first ref there anyway).
            std::fs::create_dir_all(common.join(part).join(BRANCHES))?;
        }
        std::fs::write(store.join("refs/heads").join(&wt.branch), format!("{start}\n"))?;
        let _ = std::fs::File::create(store.join("logs/refs/heads").join(&wt.branch))?;
        Ok(GitView {
            common,
            admin: wt.git_dir.clone(),
            store,
            worktree: wt.path.clone(),
            branch: wt.branch.clone(),
            start,
        })
    }

    /// After a confined agent: moves the clone's branch to where the agent left it, with its
    /// objects fetched (and so checked) from the store. The worktree's `HEAD` is put back on
    /// the branch if the agent moved it. Returns the branch's new commit, when it moved.
    pub async fn absorb(&self, wt: &Worktree, view: &GitView) -> Result<Option<String>, WorktreeError> {
        let ref_file = view.store.join("refs/heads").join(&view.branch);
        let head_file = view.admin.join("HEAD");
        let on_branch = format!("ref: refs/heads/{}", view.branch);
        let head = small_text(&head_file);
        // Where the agent's work is: its branch, or a commit it detached HEAD at.
        let tip = match head.as_deref() {
            Some(h) if is_object_id(h) => Some(h.to_string()),
            _ => small_text(&ref_file),
        };
        let tip = tip.filter(|t| is_object_id(t));
        // What git in this worktree would read besides HEAD and the index is the agent's to
        // write no more: a per-worktree config (read when the clone enables it) and locks.
        for f in ["config.worktree", "index.lock", "HEAD.lock"] {
            let _ = std::fs::remove_file(view.admin.join(f));
        }
        let git = wt.git().await;
        if head.as_deref() != Some(on_branch.as_str()) {
            git.run(&["symbolic-ref", "HEAD", &format!("refs/heads/{}", view.branch)], GIT_BOUND).await?;
        }
        let moved = match tip.filter(|t| *t != view.start) {
            Some(tip) => {
                let store = view.store.to_string_lossy().into_owned();
                let local = format!("refs/heads/{}", view.branch);
                git.run(&["fetch", "--quiet", "--no-tags", "--update-head-ok", &store, &tip], GIT_BOUND).await?;
                git.run(&["update-ref", &local, &tip], GIT_BOUND).await?;
                Some(tip)
            }
            None => None,
        };
        // The index names objects the agent wrote to its store (files it added and did not
        // commit): it is made again from the branch, whose objects the fetch checked, and
        // what the agent had staged is staged again from the working tree (ignored files
        // it added on purpose too), for DevPilot's own commit.
        let staged = git.run(&["diff", "--cached", "--name-only", "--no-renames", "-z"], GIT_BOUND).await;
        if git.run(&["reset", "--quiet", "--mixed"], GIT_BOUND).await.is_err() {
            let _ = std::fs::remove_file(view.admin.join("index"));
            git.run(&["reset", "--quiet", "--mixed"], GIT_BOUND).await?;
        }
        let staged: Vec<String> = staged
            .unwrap_or_default()
            .split('\0')
            .filter(|p| !p.is_empty())
            .map(|p| format!(":(literal){p}"))
            .collect();
        for chunk in staged.chunks(200) {
            let mut args = vec!["add", "--force", "--all", "--"];
            args.extend(chunk.iter().map(String::as_str));
            git.run(&args, GIT_BOUND).await?;
        }
        Ok(moved)
    }

    /// Removes the job's store, if it has one.
    pub(super) fn remove_store(&self, wt: &Worktree) {
        let _ = std::fs::remove_dir_all(self.store_of(wt));
    }
}

/// A bare repository at `store` that borrows `common`'s objects, written by hand so that no
/// template (hooks included) is copied in. Its config lets a fetch ask for any commit (the
/// agent may have left its work on a detached HEAD).
fn write_store(store: &Path, common: &Path, format: &str) -> std::io::Result<()> {
    for d in ["objects/info", "objects/pack", "refs/heads", "refs/tags", "logs/refs/heads"] {
        std::fs::create_dir_all(store.join(d))?;
    }
    let (version, ext) = match format {
        "sha1" => (0, String::new()),
        other => (1, format!("[extensions]\n\tobjectformat = {other}\n")),
    };
    let config = format!(
        "[core]\n\trepositoryformatversion = {version}\n\tbare = true\n{ext}[uploadpack]\n\tallowAnySHA1InWant = true\n"
    );
    std::fs::write(store.join("config"), config)?;
    std::fs::write(store.join("HEAD"), format!("ref: refs/heads/{BRANCHES}\n"))?;
    std::fs::write(store.join("objects/info/alternates"), format!("{}\n", common.join("objects").display()))
}

/// A full object id (sha1 or sha256), lowercase hex.
fn is_object_id(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A small file an agent could have written, trimmed: only a regular file, never through a
/// link, never more than a line's worth.
fn small_text(path: &Path) -> Option<String> {
    match crate::safe_fs::read_regular(path, 4096) {
        Ok(crate::safe_fs::Found::Read(b)) => String::from_utf8(b).ok().map(|s| s.trim().to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only full lowercase object ids are taken from files an agent could write.
    #[test]
    fn object_ids() {
        assert!(is_object_id(&"a".repeat(40)) && is_object_id(&"0".repeat(64)));
        assert!(!is_object_id(&"A".repeat(40)) && !is_object_id("ref: refs/heads/x") && !is_object_id(&"a".repeat(41)));
    }
}
