//! Agents run confined: a prompt-injected agent reaches its worktree, its model and nothing
//! else. Every agent process (a preset or a plain command, in the tray or in `devpilot
//! run`) starts inside a bubblewrap sandbox unless the settings turn it off on purpose.
//!
//! - **Files** ([`mounts`], [`view`]): an empty root with, at their own paths, the system
//!   read-only (`/usr`, `/etc` without its secrets), the toolchains on `PATH` read-only, a
//!   private `/tmp` and home, the preset's own state (`~/.claude`, …) writable, the job's
//!   worktree and files writable, and git as [`crate::worktree::GitView`] says. Nothing
//!   else of the user's home or disk exists in there: no `~/.ssh`, no keyrings, no other
//!   repository, no DevPilot config or data.
//! - **Network** ([`egress`], [`hosts`]): a network namespace of its own, whose only way out
//!   is the job's egress proxy on a unix socket, which reaches the hosts of the job's
//!   allowlist (the preset's model API, the base URL configured, what the settings add)
//!   and refuses the rest.
//! - **IPC and processes**: its own PID, IPC and network namespaces (so no D-Bus, no X11 or
//!   Wayland socket, no abstract unix socket of the host's, no signal or ptrace to a
//!   process outside), no capability, `no_new_privs`, and a session of its own.
//! - **Processes** ([`init`]): DevPilot's own binary starts first inside, passes the
//!   runner's signals on and bridges the loopback to the egress socket.
//! - **Where it cannot be had** ([`probe`]): the machine says why, once, and runs agents
//!   unconfined only for work the user gave it directly.
//!
//! # Layout
//! - [`probe`]: whether this machine can confine, and why not.
//! - [`mounts`]: the sandbox's filesystem as a list, and its bubblewrap arguments.
//! - [`view`]: the system, home and toolchain part of that list.
//! - [`hosts`]: allowlist entries (`host:port`, `*.domain`).
//! - [`egress`]: the proxy outside the sandbox.
//! - [`settings`]: the `[sandbox]` table, and the mode a repo can set.
//! - [`jail`]: one agent's sandbox and its bubblewrap command line.
//! - [`job`]: one job's sandbox, from the runner's [`Plan`].
//! - [`init`]: the first process inside.

pub mod egress;
pub mod hosts;
pub mod init;
mod jail;
pub mod job;
pub mod mounts;
mod probe;
pub mod settings;
pub mod view;

pub use self::jail::{refusals, unwrap_status, Jail, JailSpec, EGRESS, INIT, PROXY_PORT};
pub use self::job::{Agent, Plan};
pub use self::probe::{confinement, probe, Confinement};
pub use self::settings::{check_path, SandboxMode, SandboxSettings};
