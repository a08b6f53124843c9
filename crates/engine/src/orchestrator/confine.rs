//! The runner's side of the sandbox: whether one job's agent runs confined, and the
//! [`Plan`] that confines it.
//!
//! Confined unless the settings say `sandbox = "off"` (for the machine, or the job's repo).
//! A machine that cannot confine ([`Confinement::Unconfined`]) runs the user's own jobs
//! unconfined and says so in each job's history, but never a tracker's job (a stranger's
//! issue) unless its repo is `sandbox = "off"` on purpose: the claim does not pick those,
//! and one that arrives anyway is handed back.

use std::path::PathBuf;

use crate::sandbox::hosts::HostPort;
use crate::sandbox::{Confinement, Plan, SandboxMode, SandboxSettings};
use crate::worktree::{Repo, Workspaces, Worktree};

/// Why agents run unconfined on a machine whose settings turn the sandbox off.
const OFF: &str = "this machine's settings say [sandbox] mode = \"off\"";

/// A machine's confinement: what the probe found, and what its settings add.
#[derive(Clone, Debug)]
pub struct Confining {
    pub confinement: Confinement,
    pub mode: SandboxMode,
    pub allow: Vec<HostPort>,
    pub read_only: Vec<PathBuf>,
    pub read_write: Vec<PathBuf>,
}

/// What the tray and the window warn about: agents on this machine (or of one repo) run
/// unconfined. `line` is short, for the tray; `text` says why and what it means.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Warning {
    pub line: String,
    pub text: String,
}

/// The warnings of `settings` on this machine: none when every agent runs confined.
pub fn warnings(settings: &crate::settings::Settings) -> Vec<Warning> {
    let here = Confining::new(&settings.sandbox);
    let mut out = vec![];
    match (&here.confinement, here.mode) {
        (Confinement::Confined { .. }, _) => {}
        (_, SandboxMode::Off) => out.push(Warning {
            line: "Agents run unconfined (sandbox off)".into(),
            text: format!(
                "{}. Every agent here reaches what you can, strangers' issues included.",
                capital(&here.describe())
            ),
        }),
        (Confinement::Unconfined { .. }, _) => out.push(Warning {
            line: "Agents run unconfined here".into(),
            text: format!("{}. Jobs from tracker sources are not claimed here.", capital(&here.describe())),
        }),
    }
    for (name, r) in &settings.repos {
        if r.sandbox == SandboxMode::Off {
            out.push(Warning {
                line: format!("Repo {name}: sandbox off"),
                text: format!(
                    "Repo {name} says sandbox = \"off\": its agents run unconfined, strangers' issues included."
                ),
            });
        }
    }
    out
}

fn capital(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

/// How one job's agent runs.
pub enum Decision {
    Confined(Box<Plan>),
    /// Unconfined, and why (said in the job's history).
    Unconfined(String),
    /// Not run here, and why: a tracker's job on a machine that cannot confine.
    Refused(String),
    /// The sandbox could not be made for this job (its git could not be set up): the
    /// attempt fails with this.
    Failed(String),
}

impl Confining {
    /// From the settings (validated: [`SandboxSettings::validate`]) and this machine's
    /// probe, which runs once per process ([`crate::sandbox::confinement`]) and only when
    /// the settings want agents confined.
    pub fn new(s: &SandboxSettings) -> Self {
        let confinement = match s.mode {
            SandboxMode::On => crate::sandbox::confinement().clone(),
            SandboxMode::Off => Confinement::Unconfined { why: OFF.into() },
        };
        Self::with(confinement, s)
    }

    /// From the settings and a given confinement (a test's degraded machine).
    pub fn with(confinement: Confinement, s: &SandboxSettings) -> Self {
        let paths = |v: &[String]| v.iter().map(|p| crate::worktree::expand_home(p.trim())).collect();
        Confining {
            confinement,
            mode: s.mode,
            allow: s.allow_hosts.iter().filter_map(|h| HostPort::parse(h).ok()).collect(),
            read_only: paths(&s.read_only),
            read_write: paths(&s.read_write),
        }
    }

    /// The repos whose tracker jobs this machine takes, when not all of them: a machine
    /// that should confine and cannot takes only those of repos that say
    /// `sandbox = "off"`.
    pub fn tracker_repos(&self, repos: &std::collections::BTreeMap<String, Repo>) -> Option<Vec<String>> {
        if self.mode == SandboxMode::Off || self.confinement.is_confined() {
            return None;
        }
        Some(repos.iter().filter(|(_, r)| r.sandbox == SandboxMode::Off).map(|(n, _)| n.clone()).collect())
    }

    /// One line for `status`, `doctor` and the tray.
    pub fn describe(&self) -> String {
        self.confinement.describe()
    }

    /// Whether a tracker's job for `repo` may run on this machine.
    pub fn takes_strangers(&self, repo: Option<&Repo>) -> bool {
        self.confinement.is_confined() || self.off_on_purpose(repo).is_some()
    }

    /// Why agents of `repo` run unconfined by the settings, if they do.
    fn off_on_purpose(&self, repo: Option<&Repo>) -> Option<String> {
        if self.mode == SandboxMode::Off {
            return Some(OFF.into());
        }
        let r = repo.filter(|r| r.sandbox == SandboxMode::Off)?;
        Some(format!("repo '{}' says sandbox = \"off\"", r.name))
    }

    /// How the agent of a job (`from_tracker`: its issue came from a tracker) runs, in
    /// `wt` (when it has a repo) or `cwd`.
    pub async fn decide(
        &self,
        ws: Option<&Workspaces>,
        wt: Option<&Worktree>,
        from_tracker: bool,
        private: PathBuf,
    ) -> Decision {
        let repo = wt.map(|w| &w.repo);
        if let Some(why) = self.off_on_purpose(repo) {
            return Decision::Unconfined(why);
        }
        let bwrap = match &self.confinement {
            Confinement::Confined { bwrap, .. } => bwrap.clone(),
            Confinement::Unconfined { why } if from_tracker => {
                return Decision::Refused(format!(
                    "this machine cannot confine agents ({why}), and the job came from a tracker; set \
                     sandbox = \"off\" for its repo to run such jobs unconfined on purpose"
                ))
            }
            Confinement::Unconfined { why } => return Decision::Unconfined(why.clone()),
        };
        let git = match (ws, wt) {
            (Some(ws), Some(wt)) => match ws.confine_git(wt).await {
                Ok(v) => Some(v),
                Err(e) => return Decision::Failed(format!("the agent's sandbox could not be set up: {e}")),
            },
            _ => None,
        };
        let mut allow = self.allow.clone();
        let mut read_only = self.read_only.clone();
        if let Some(r) = repo {
            allow.extend(r.allow_hosts.iter().cloned());
            read_only.extend(r.read_only.iter().cloned());
        }
        Decision::Confined(Box::new(Plan {
            bwrap,
            git,
            allow,
            read_only,
            read_write: self.read_write.clone(),
            private,
            identity: git_identity().clone(),
        }))
    }
}

/// The user's git identity (`user.name`, `user.email` from the global config), read once
/// per process outside the sandbox; DevPilot's own when unset.
pub fn git_identity() -> &'static (String, String) {
    static IDENTITY: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    IDENTITY.get_or_init(read_identity)
}

fn read_identity() -> (String, String) {
    let get = |key: &str| {
        std::process::Command::new("git")
            .args(["config", "--global", "--get", key])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let name = get("user.name").unwrap_or_else(|| "DevPilot".into());
    let email = get("user.email").unwrap_or_else(|| "devpilot@localhost.invalid".into());
    (name, email)
}
