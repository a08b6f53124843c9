//! What each preset's CLI needs inside DevPilot's sandbox, declared like its environment:
//! the state it keeps (its login, its conversations: writable, at their own paths, since
//! the runner restores and captures sessions there) and the hosts its model is reached at.
//!
//! The hosts are the CLI's documented API endpoints, plus every base URL the agent's own
//! environment or the CLI's config names (the user configured it, so the user allowed it).
//! A host the CLI also calls for telemetry or updates is left out: it is refused, and the
//! CLIs go on without it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::Preset;
use crate::sandbox::hosts::HostPort;

/// One piece of a preset's state in the home.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// A directory the CLI keeps its state in: made (0700) if missing, shown writable.
    Dir(PathBuf),
    /// A file of its own: shown writable when it exists.
    File(PathBuf),
    /// A file it only reads (its config): shown read-only when it exists.
    Config(PathBuf),
    /// A file in its state that the user's own CLI obeys when it starts outside DevPilot
    /// (its settings and hooks, its provider config, its memory): read-only, and when missing
    /// made first with `inert` content, so that a job can neither change nor plant it.
    Guarded { path: PathBuf, inert: &'static str },
    /// A file the CLI rewrites as it runs but that also says what it runs (claude's
    /// `~/.claude.json` lists MCP servers): the agent gets a copy of its own, when it exists.
    Copied(PathBuf),
}

impl Preset {
    /// The preset's state under `home`, given the agent's environment `env`.
    pub fn state(self, home: &Path, env: &BTreeMap<OsString, OsString>) -> Vec<State> {
        let var = |k: &str| env.get(&OsString::from(k)).map(PathBuf::from).filter(|p| p.is_absolute());
        match self {
            Preset::Claude => {
                let dir = var("CLAUDE_CONFIG_DIR").unwrap_or_else(|| home.join(".claude"));
                vec![
                    State::Dir(dir.clone()),
                    State::Guarded { path: dir.join("settings.json"), inert: "{}\n" },
                    State::Guarded { path: dir.join("settings.local.json"), inert: "{}\n" },
                    State::Guarded { path: dir.join("CLAUDE.md"), inert: "" },
                    State::Copied(home.join(".claude.json")),
                ]
            }
            Preset::Codex => {
                let dir = self.codex_home(home, env);
                vec![
                    State::Dir(dir.clone()),
                    State::Guarded { path: dir.join("config.toml"), inert: "" },
                    State::Guarded { path: dir.join("AGENTS.md"), inert: "" },
                ]
            }
            Preset::Gemini => {
                let dir = home.join(".gemini");
                vec![
                    State::Dir(dir.clone()),
                    State::Guarded { path: dir.join("settings.json"), inert: "{}\n" },
                    State::Guarded { path: dir.join("GEMINI.md"), inert: "" },
                ]
            }
            Preset::Aider => vec![
                State::Dir(home.join(".aider")),
                State::Config(home.join(".aider.conf.yml")),
                State::Config(home.join(".aider.model.settings.yml")),
                State::Config(home.join(".aider.model.metadata.json")),
            ],
        }
    }

    /// The hosts the preset's model is reached at, for this agent's environment.
    pub fn hosts(self, home: &Path, env: &BTreeMap<OsString, OsString>) -> Vec<HostPort> {
        let fixed: &[&str] = match self {
            // https://docs.anthropic.com/en/api/overview
            Preset::Claude => &["api.anthropic.com"],
            // https://developers.openai.com/codex/auth (API key and ChatGPT sign-in)
            Preset::Codex => &["api.openai.com", "chatgpt.com", "auth.openai.com"],
            // https://geminicli.com/docs/get-started/authentication/
            Preset::Gemini => &[
                "generativelanguage.googleapis.com",
                "cloudcode-pa.googleapis.com",
                "oauth2.googleapis.com",
                "www.googleapis.com",
            ],
            // The providers litellm calls for the models aider documents.
            Preset::Aider => &[
                "api.openai.com",
                "api.anthropic.com",
                "generativelanguage.googleapis.com",
                "openrouter.ai",
                "api.deepseek.com",
            ],
        };
        let mut hosts: Vec<HostPort> = fixed.iter().filter_map(|h| HostPort::parse(h).ok()).collect();
        // Every base URL this agent's environment names (ANTHROPIC_BASE_URL, OPENAI_BASE_URL,
        // OPENAI_API_BASE, GOOGLE_GEMINI_BASE_URL, …), among the variables it may see.
        for (k, v) in env {
            let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else { continue };
            let own = self.env_needs().iter().any(|p| crate::environ::matches(p, k));
            if (k.ends_with("_BASE_URL") || k.ends_with("_API_BASE")) && own {
                hosts.extend(HostPort::of_url(v));
            }
        }
        if self == Preset::Codex {
            hosts.extend(codex_providers(&self.codex_home(home, env)));
        }
        hosts
    }

    fn codex_home(self, home: &Path, env: &BTreeMap<OsString, OsString>) -> PathBuf {
        env.get(&OsString::from("CODEX_HOME"))
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| home.join(".codex"))
    }
}

/// The base URLs of the model providers codex's `config.toml` defines
/// (`[model_providers.<id>] base_url = …`). The file is the user's: a job sees it read-only
/// ([`State::Guarded`]), so no job can widen the next one's allowlist through it. Read without
/// following a link, and at most 64 KiB.
fn codex_providers(codex_home: &Path) -> Vec<HostPort> {
    let Ok(crate::safe_fs::Found::Read(bytes)) =
        crate::safe_fs::read_regular(&codex_home.join("config.toml"), 64 * 1024)
    else {
        return vec![];
    };
    let text = String::from_utf8_lossy(&bytes);
    let Ok(doc) = text.parse::<toml::Table>() else { return vec![] };
    let Some(providers) = doc.get("model_providers").and_then(|p| p.as_table()) else { return vec![] };
    providers.values().filter_map(|p| p.get("base_url").and_then(|u| u.as_str())).filter_map(HostPort::of_url).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<OsString, OsString> {
        pairs.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect()
    }

    /// A preset's hosts are its API's, plus the base URLs its own variables and config name,
    /// and never one from another CLI's variable.
    #[test]
    fn hosts_from_env_and_config() {
        let t = tempfile::tempdir().unwrap();
        let e = env(&[("ANTHROPIC_BASE_URL", "http://127.0.0.1:4100"), ("OPENAI_BASE_URL", "http://10.0.0.9:1")]);
        let claude: Vec<String> = Preset::Claude.hosts(t.path(), &e).iter().map(|h| h.to_string()).collect();
        assert_eq!(claude, ["api.anthropic.com:443", "127.0.0.1:4100"]);
        std::fs::create_dir_all(t.path().join(".codex")).unwrap();
        std::fs::write(
            t.path().join(".codex/config.toml"),
            "model_provider = \"mock\"\n[model_providers.mock]\nbase_url = \"http://127.0.0.1:4200/v1\"\n",
        )
        .unwrap();
        let codex: Vec<String> = Preset::Codex.hosts(t.path(), &env(&[])).iter().map(|h| h.to_string()).collect();
        assert!(codex.contains(&"127.0.0.1:4200".to_string()) && codex.contains(&"api.openai.com:443".to_string()));
    }
}
