//! Settings' line for the agent: whether its CLI is found here, which version, and whether it
//! is logged in ("claude 2.1.332 · logged in (~/.claude/.credentials.json)"), or what is wrong
//! and what to do.

use std::path::Path;
use std::time::Duration;

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::preset::login::Login;
use devpilot_engine::settings::Settings;
use serde::Serialize;

/// The agent's health line.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct AgentHealth {
    pub ok: bool,
    pub line: String,
}

/// How long `--version` may take.
const VERSION_WAIT: Duration = Duration::from_secs(5);

/// The health of agent `line` (a preset's name or a command), as this machine would run it.
pub async fn agent_health(line: &str) -> AgentHealth {
    let bad = |line: String| AgentHealth { ok: false, line };
    let path = match crate::guide::find_agent(line) {
        Ok(p) => p,
        Err(e) => return bad(e.to_string()),
    };
    let settings = Settings { agent: Some(line.trim().to_string()), ..Settings::default() };
    let preset = match settings.agent_spec() {
        Ok(Some(AgentSpec::Preset { preset, .. })) => preset,
        // A command of the user's own: found is all that can be said without running it.
        _ => return AgentHealth { ok: true, line: format!("found: {path}") },
    };
    // "claude 2.1.332 (Claude Code)": the preset's name first, whatever its CLI prints.
    let name = match version_of(&path).await {
        Some(v) if v.to_lowercase().starts_with(preset.name()) => v,
        Some(v) => format!("{} {v}", preset.name()),
        None => preset.name().to_string(),
    };
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from).unwrap_or_default();
    match preset.login(&|k| std::env::var(k).ok(), &home) {
        Login::Key(var) => AgentHealth { ok: true, line: format!("{name} · API key from {var}") },
        Login::File(f) => AgentHealth { ok: true, line: format!("{name} · logged in ({})", tilde(&f, &home)) },
        Login::Missing(what) => bad(format!("{name} · {what}")),
    }
}

/// The first line `path --version` prints, unless it fails or takes too long.
async fn version_of(path: &str) -> Option<String> {
    let run = tokio::process::Command::new(path)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(VERSION_WAIT, run).await.ok()?.ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    out.status.success().then(|| first.chars().take(80).collect())
}

/// `path` with the home folder written `~`.
fn tilde(path: &Path, home: &Path) -> String {
    match path.strip_prefix(home) {
        Ok(rest) if !home.as_os_str().is_empty() => format!("~/{}", rest.display()),
        _ => path.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command not found says so; a command found is found; a path under home reads `~`.
    #[tokio::test]
    async fn the_agent_line_says_what_is_wrong() {
        let missing = agent_health("no-such-agent-cli --flag").await;
        assert!(!missing.ok && missing.line.contains("no-such-agent-cli"), "{missing:?}");
        let found = agent_health("true").await;
        assert!(found.ok && found.line.starts_with("found: /"), "{found:?}");
        assert_eq!(tilde(Path::new("/home/a/.claude/x"), Path::new("/home/a")), "~/.claude/x");
    }
}
