//! Whether this machine can confine agents, found once at start by trying: bubblewrap must be
//! installed and able to make the namespaces the sandbox uses (a kernel or distribution
//! can disable unprivileged user namespaces; a container may not allow them at all).

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Whether agents on this machine run confined, and if not, why not (in words a person can
/// act on).
#[derive(Clone, Debug, PartialEq)]
pub enum Confinement {
    Confined { bwrap: PathBuf, version: String },
    Unconfined { why: String },
}

impl Confinement {
    pub fn is_confined(&self) -> bool {
        matches!(self, Confinement::Confined { .. })
    }

    /// One line for `status`, `doctor` and the tray.
    pub fn describe(&self) -> String {
        match self {
            Confinement::Confined { version, .. } => format!("agents run confined ({version})"),
            Confinement::Unconfined { why } => format!("agents run unconfined here, because {why}"),
        }
    }
}

/// Where bubblewrap is looked for: `PATH`, then Debian's place.
fn find_bwrap() -> Option<PathBuf> {
    crate::environ::which("bwrap").or_else(|| crate::environ::which("/usr/bin/bwrap"))
}

/// Tries a sandbox of the same kind every agent gets (every namespace, no capability) around
/// `true`. Blocking; it takes a few milliseconds.
pub fn probe() -> Confinement {
    let Some(bwrap) = find_bwrap() else {
        return Confinement::Unconfined {
            why: "bubblewrap (bwrap) is not installed; install the bubblewrap package".into(),
        };
    };
    let version = Command::new(&bwrap)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "bubblewrap".into());
    let mut cmd = Command::new(&bwrap);
    cmd.args(["--unshare-all", "--unshare-user", "--die-with-parent", "--cap-drop", "ALL"]);
    if let Some(uid) = inner_uid() {
        cmd.args(["--uid", &uid.to_string(), "--gid", &uid.to_string()]);
    }
    cmd.args(["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--", "true"]);
    match cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).output() {
        Ok(o) if o.status.success() => Confinement::Confined { bwrap, version },
        Ok(o) => {
            let said = String::from_utf8_lossy(&o.stderr);
            let last = said.lines().last().unwrap_or("it failed without a message").trim().to_string();
            Confinement::Unconfined {
                why: format!(
                    "bubblewrap cannot make a sandbox here ({last}); unprivileged user namespaces may be \
                     disabled (sysctl kernel.unprivileged_userns_clone, or AppArmor's \
                     apparmor_restrict_unprivileged_userns)"
                ),
            }
        }
        Err(e) => Confinement::Unconfined { why: format!("bubblewrap ({}) cannot run: {e}", bwrap.display()) },
    }
}

/// This machine's confinement, probed once per process (a bubblewrap run of a few
/// milliseconds) the first time it is asked.
pub fn confinement() -> &'static Confinement {
    static PROBED: std::sync::OnceLock<Confinement> = std::sync::OnceLock::new();
    PROBED.get_or_init(probe)
}

/// The uid an agent has inside when the runner is root: root's files are then not its
/// own by capability (it has none), and a CLI's own nested sandbox can still map a user.
pub(crate) fn inner_uid() -> Option<u32> {
    // SAFETY: getuid(2) cannot fail and touches no memory.
    (unsafe { libc::getuid() } == 0).then_some(1000)
}
