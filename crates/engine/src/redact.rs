//! The secrets this process knows, for redaction by value ([`Redactor`]): every text an
//! agent (or a repo's setup) produced is cleaned of them before it leaves the process, in
//! the one place each kind of text goes out: the machine's store (log tail, summary, last
//! error, history), the tracker comments and pull request bodies ([`crate::sources`]), and
//! the carried sessions.
//!
//! What it knows: the variables [`crate::seal`] took (the database URL's password,
//! `PGPASSWORD`, `LINEAR_API_KEY`, `GITHUB_TOKEN`), a tracker key read from the keychain, the
//! database password a machine connects with, and what its agents are given: every
//! `pass_env` value (whatever its name: the user passes it because an agent needs it), and
//! the variables the presets' CLIs read whose names say they are secret (a key, a token, a
//! password), from the environment or a preset's settings.

use std::sync::LazyLock;

pub use devpilot_store::redact::{Redactor, REDACTED};

use crate::agent::AgentSpec;
use crate::preset::Preset;

static KNOWN: LazyLock<Redactor> = LazyLock::new(|| {
    let r = Redactor::default();
    let url_password = crate::seal::env_database_url()
        .and_then(|u| devpilot_store::db::DbUrl::parse(&u).ok())
        .and_then(|u| u.password());
    let taken = [
        url_password,
        crate::seal::env_pgpassword(),
        crate::seal::env_linear_api_key(),
        crate::seal::env_github_token(),
    ];
    r.learn_all(taken.into_iter().flatten());
    r
});

/// The secrets this process knows: one set, shared by every machine it runs.
pub fn known() -> &'static Redactor {
    &KNOWN
}

/// Whether a variable's name says its value is a secret.
pub fn secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL"].iter().any(|w| upper.contains(w))
}

/// Learns what a machine's agents are given ([`agent_secrets`] of this environment).
pub fn learn_agent_env(agent: &AgentSpec, pass_env: &[String]) {
    let vars: Vec<(String, String)> =
        std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect();
    known().learn_all(agent_secrets(&vars, agent, pass_env));
}

/// The values of `vars` an agent is given that are secrets: every `pass_env` one (any name),
/// and the presets' variables whose names say so; and those of `agent`'s settings.
fn agent_secrets(vars: &[(String, String)], agent: &AgentSpec, pass_env: &[String]) -> Vec<String> {
    use crate::environ::matches;
    let passed = |k: &str| pass_env.iter().any(|p| matches(p, k));
    let provider = |k: &str| secret_name(k) && Preset::ALL.iter().any(|p| p.env_needs().iter().any(|n| matches(n, k)));
    let mut out: Vec<String> = vars
        .iter()
        .filter(|(k, _)| !k.starts_with("DEVPILOT_") && (passed(k) || provider(k)))
        .map(|(_, v)| v.clone())
        .collect();
    if let AgentSpec::Preset { settings, .. } = agent {
        out.extend(settings.env.iter().filter(|(k, _)| secret_name(k)).map(|(_, v)| v.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `pass_env` value is a secret whatever its name; a preset's variable only when its
    /// name says so (a key, not a base URL); nothing else of the environment is.
    #[test]
    fn agent_env_values_are_secrets_by_what_they_are() {
        let vars: Vec<(String, String)> = [
            ("MY_SETTING", "passed-value-1234"),
            ("OPENAI_API_KEY", "sk-openai-5678"),
            ("GEMINI_API_KEY", "gem-key-9012"),
            ("OPENAI_BASE_URL", "https://api.example/v1"),
            ("HOME", "/home/someone"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        let mut got = agent_secrets(&vars, &AgentSpec::NoOp, &["MY_*".into()]);
        got.sort();
        assert_eq!(got, ["gem-key-9012", "passed-value-1234", "sk-openai-5678"]);
        assert!(secret_name("GEMINI_API_KEY") && secret_name("github_token") && !secret_name("ANTHROPIC_BASE_URL"));
    }
}
