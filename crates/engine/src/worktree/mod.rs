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

mod cleanup;
pub mod confine;
mod create;
mod error;
mod handoff;
mod record;
mod repo;
mod workspaces;

pub use self::cleanup::Finished;
pub use self::confine::GitView;
pub use self::error::WorktreeError;
pub use self::record::{records_in, HandOff, Record, StartedFrom, Unsaved, Worktree};
pub use self::repo::{expand_home, overlay_repo_flag, PrMode, Repo, RepoSettings};
pub use self::workspaces::Workspaces;
pub use crate::git::redact_credentials;
