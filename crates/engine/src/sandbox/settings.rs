//! The settings of the sandbox: the machine's `[sandbox]` table and the mode a repo can set.

use super::hosts;

/// Whether the settings want agents confined (per machine, and per repo on top).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    #[default]
    On,
    Off,
}

impl SandboxMode {
    pub fn is_on(&self) -> bool {
        *self == SandboxMode::On
    }
}

/// The machine's `[sandbox]` settings.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SandboxSettings {
    /// `"off"` runs every agent of this machine unconfined, on purpose.
    #[serde(skip_serializing_if = "SandboxMode::is_on")]
    pub mode: SandboxMode,
    /// Hosts every agent here may reach besides its model's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_hosts: Vec<String>,
    /// Paths every agent here may read, and write, besides its own (`~` is the home).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub read_write: Vec<String>,
}

impl SandboxSettings {
    /// Whether there is nothing to write (the defaults).
    pub fn is_default(&self) -> bool {
        *self == SandboxSettings::default()
    }

    /// Every host entry parses, and every path is absolute (or starts at `~`).
    pub fn validate(&self) -> Result<(), String> {
        for h in &self.allow_hosts {
            hosts::HostPort::parse(h).map_err(|e| format!("[sandbox] allow_hosts: {e}"))?;
        }
        for p in self.read_only.iter().chain(&self.read_write) {
            check_path(p).map_err(|e| format!("[sandbox] {e}"))?;
        }
        Ok(())
    }
}

/// A path the settings show to agents: absolute or under `~`, and never the home itself
/// or the root.
pub fn check_path(p: &str) -> Result<(), String> {
    let t = p.trim();
    if !(t.starts_with('/') || t.starts_with("~/")) {
        return Err(format!("'{p}' must be an absolute path or start with ~/"));
    }
    if matches!(t.trim_end_matches('/'), "" | "~") {
        return Err(format!("'{p}' would show everything; name a directory in it"));
    }
    Ok(())
}
