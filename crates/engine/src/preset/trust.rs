//! What a preset's CLI may load of the project's own configuration, by what the directory it
//! starts in came from. The rule is the one `setup` follows ([`StartedFrom`]).
//!
//! In a worktree made from the remote's base, the repository's CLI configuration is the
//! team's, committed on purpose: each CLI reads it as usual. In a worktree that holds an
//! agent's work (resumed from the job's own branch after a hand-off or a park, reused from an
//! earlier attempt, or made from a `devpilot/…` base), such a file may have been written by
//! the agent, so the CLI never loads it:
//! - claude: `--setting-sources user`. No project or local settings (`.claude/settings.json`,
//!   `.claude/settings.local.json`: hooks, `apiKeyHelper`, `env`, permissions), and no
//!   `.mcp.json` server, which is project scoped. The user's own settings still apply.
//! - codex: nothing to do. It reads a project's `.codex/config.toml` only for a path its user
//!   marked trusted (a new worktree never is), and takes no model provider from it.
//! - aider and gemini have no switch for it: aider always reads `.aider.conf.yml`,
//!   `.aider.model.settings.yml` and `.env` in the git root (an explicit `--config` or
//!   `--env-file` is read besides them), and gemini runs headless only in a folder it trusts,
//!   whose `.gemini/` (settings, policies, agents, `.env`) and `.env` it loads. The attempt is
//!   refused, with the reason, while such a file is in the worktree (a repo's `copy` file,
//!   byte for byte the user's own, does not count).
//!
//! (Checked against claude 2.1.332, codex 0.171.0, gemini 0.61.0 and aider 0.86.2.)

use super::Preset;
use crate::worktree::{StartedFrom, Worktree};

/// Whether a CLI may load the project configuration of the directory it starts in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ProjectConfig {
    /// A worktree made from the remote's base, or a scratch directory DevPilot made empty.
    #[default]
    Trusted,
    /// A worktree that holds an agent's work; says what it came from.
    AgentWritten(String),
}

impl From<&StartedFrom> for ProjectConfig {
    fn from(start: &StartedFrom) -> Self {
        match start {
            StartedFrom::Base(_) => ProjectConfig::Trusted,
            StartedFrom::AgentWork(from) => ProjectConfig::AgentWritten(from.clone()),
        }
    }
}

impl Preset {
    /// Arguments that keep the CLI from loading the project's configuration where it may not
    /// (they go before the machine's own).
    pub fn config_args(self, config: &ProjectConfig) -> Vec<String> {
        match (self, config) {
            (Preset::Claude, ProjectConfig::AgentWritten(_)) => vec!["--setting-sources".into(), "user".into()],
            _ => vec![],
        }
    }

    /// Variables the CLI gets for the project's configuration: gemini trusts a base's
    /// worktree from the start (`--skip-trust` alone trusts it only after its settings were
    /// read, so the team's `.gemini/settings.json` would be left out).
    pub fn config_env(self, config: &ProjectConfig) -> Vec<(String, String)> {
        match (self, config) {
            (Preset::Gemini, ProjectConfig::Trusted) => vec![("GEMINI_CLI_TRUST_WORKSPACE".into(), "true".into())],
            _ => vec![],
        }
    }

    /// The project files (relative to the directory the CLI starts in) that the CLI loads
    /// with no switch to stop it.
    pub fn unswitchable_config(self) -> &'static [&'static str] {
        match self {
            Preset::Aider => &[".aider.conf.yml", ".aider.model.settings.yml", ".env"],
            Preset::Gemini => &[".gemini", ".env"],
            Preset::Claude | Preset::Codex => &[],
        }
    }

    /// Why the CLI may not start in `wt`, if it may not: the worktree holds an agent's work
    /// and one of [`Preset::unswitchable_config`].
    pub fn refusal(self, wt: &Worktree) -> Option<String> {
        self.refused(&ProjectConfig::from(&wt.start), wt.holds_any(self.unswitchable_config()).as_deref())
    }

    /// Why the CLI may not start in a directory that holds `found` (the first of
    /// [`Preset::unswitchable_config`] there), if it may not.
    fn refused(self, config: &ProjectConfig, found: Option<&str>) -> Option<String> {
        let (ProjectConfig::AgentWritten(from), Some(file)) = (config, found) else { return None };
        Some(format!(
            "the {self} preset was not started: this worktree holds an agent's work ({from}), and {self} \
             would load its {file}, which it has no switch to ignore; DevPilot runs a CLI's project \
             configuration only from the remote's base. Remove {file} from the job's branch, or run the \
             job again from the base"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only an agent's worktree changes a CLI's invocation, and a refusal names the file.
    #[test]
    fn only_an_agents_worktree_is_held_back() {
        let agent = ProjectConfig::AgentWritten("origin/devpilot/7-x".into());
        assert_eq!(Preset::Claude.config_args(&agent), ["--setting-sources", "user"]);
        for p in Preset::ALL {
            assert!(p.config_args(&ProjectConfig::Trusted).is_empty(), "{p}");
            assert_eq!(p.refused(&ProjectConfig::Trusted, Some(".env")), None, "{p}");
            assert_eq!(p.refused(&agent, None), None, "{p}");
        }
        let why = Preset::Aider.refused(&agent, Some(".aider.conf.yml")).unwrap();
        assert!(why.contains(".aider.conf.yml") && why.contains("origin/devpilot/7-x"), "{why}");
        assert_eq!(Preset::Gemini.config_env(&ProjectConfig::Trusted)[0].0, "GEMINI_CLI_TRUST_WORKSPACE");
        assert!(Preset::Gemini.config_env(&agent).is_empty());
    }
}
