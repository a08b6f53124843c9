//! Whether a preset's CLI can reach its model here: an API key in the environment, or the
//! file its own login writes. Read without running the CLI (a login check of its own would
//! call the model). Where each CLI keeps its login:
//! - claude: `~/.claude/.credentials.json` on Linux (`CLAUDE_CONFIG_DIR` moves `~/.claude`),
//!   or `ANTHROPIC_API_KEY`, `ANTHROPIC_AUTH_TOKEN`, `CLAUDE_CODE_OAUTH_TOKEN`
//!   (https://docs.anthropic.com/en/docs/claude-code/iam, settings);
//! - codex: `$CODEX_HOME/auth.json` (default `~/.codex`), or `OPENAI_API_KEY`
//!   (https://github.com/openai/codex/blob/main/docs/authentication.md);
//! - gemini: `~/.gemini/oauth_creds.json`, or `GEMINI_API_KEY`, `GOOGLE_API_KEY`, Vertex AI's
//!   `GOOGLE_APPLICATION_CREDENTIALS` (https://geminicli.com/docs/get-started/authentication/);
//! - aider: a provider's key in the environment, or `~/.aider.conf.yml`
//!   (https://aider.chat/docs/config/api-keys.html).

use std::path::{Path, PathBuf};

use super::Preset;

/// How a preset's CLI would log in here, if it can.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Login {
    /// An API key or token from this environment variable.
    Key(&'static str),
    /// The CLI's own login file.
    File(PathBuf),
    /// Neither: what to do about it.
    Missing(String),
}

impl Preset {
    /// The variables that hold this preset's API key or token, in the order its CLI prefers
    /// them (aider: the providers' keys it is most often run with).
    pub fn key_vars(self) -> &'static [&'static str] {
        match self {
            Preset::Claude => &["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"],
            Preset::Codex => &["OPENAI_API_KEY"],
            Preset::Gemini => &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
            Preset::Aider => {
                &["ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "DEEPSEEK_API_KEY", "OPENROUTER_API_KEY"]
            }
        }
    }

    /// How this preset's CLI would log in, reading `env` and files under `home`.
    pub fn login(self, env: &dyn Fn(&str) -> Option<String>, home: &Path) -> Login {
        let set = |k: &str| env(k).is_some_and(|v| !v.trim().is_empty());
        let dir = |var: &str, default: &str| env(var).map(PathBuf::from).unwrap_or_else(|| home.join(default));
        let (keys, files, how): (&[&'static str], Vec<PathBuf>, &str) = match self {
            Preset::Claude => (
                self.key_vars(),
                vec![dir("CLAUDE_CONFIG_DIR", ".claude").join(".credentials.json")],
                "run `claude` once and /login, or set ANTHROPIC_API_KEY",
            ),
            Preset::Codex => (
                self.key_vars(),
                vec![dir("CODEX_HOME", ".codex").join("auth.json")],
                "run `codex login`, or set OPENAI_API_KEY",
            ),
            Preset::Gemini => (
                // Vertex AI's credentials file is a login too, though no key.
                &["GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_APPLICATION_CREDENTIALS"],
                vec![home.join(".gemini/oauth_creds.json")],
                "run `gemini` once and log in with Google, or set GEMINI_API_KEY",
            ),
            Preset::Aider => (
                self.key_vars(),
                vec![home.join(".aider.conf.yml")],
                "set your model provider's key (OPENAI_API_KEY, ANTHROPIC_API_KEY, …) or write ~/.aider.conf.yml",
            ),
        };
        if let Some(k) = keys.iter().find(|k| set(k)) {
            return Login::Key(k);
        }
        match files.into_iter().find(|f| f.is_file()) {
            Some(f) => Login::File(f),
            None => Login::Missing(format!("not logged in: {how}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key in the environment first, then the CLI's login file (where its own variable moves
    /// it), else what to do.
    #[test]
    fn each_cli_says_how_it_logs_in() {
        let home = tempfile::tempdir().unwrap();
        let none = |_: &str| None;
        match Preset::Claude.login(&none, home.path()) {
            Login::Missing(m) => assert!(m.contains("/login") && m.contains("ANTHROPIC_API_KEY"), "{m}"),
            other => panic!("{other:?}"),
        }
        let key = |k: &str| (k == "ANTHROPIC_AUTH_TOKEN").then(|| "t".to_string());
        assert_eq!(Preset::Claude.login(&key, home.path()), Login::Key("ANTHROPIC_AUTH_TOKEN"));
        let blank = |k: &str| (k == "OPENAI_API_KEY").then(|| " ".to_string());
        assert!(matches!(Preset::Codex.login(&blank, home.path()), Login::Missing(_)), "a blank key is no key");
        let codex_home = home.path().join("elsewhere");
        std::fs::create_dir_all(&codex_home).unwrap();
        std::fs::write(codex_home.join("auth.json"), "{}").unwrap();
        let moved = |k: &str| (k == "CODEX_HOME").then(|| codex_home.display().to_string());
        assert_eq!(Preset::Codex.login(&moved, home.path()), Login::File(codex_home.join("auth.json")));
        std::fs::create_dir_all(home.path().join(".gemini")).unwrap();
        std::fs::write(home.path().join(".gemini/oauth_creds.json"), "{}").unwrap();
        assert_eq!(Preset::Gemini.login(&none, home.path()), Login::File(home.path().join(".gemini/oauth_creds.json")));
    }
}
