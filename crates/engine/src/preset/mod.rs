//! Built-in agent presets: each maps a job to its CLI's one-shot, non-interactive
//! invocation. The prompt is always ONE argv element (never a shell string), put where the
//! CLI's parser cannot mistake it for a flag.
//!
//! Each machine may add arguments (a model, a permission mode) and environment variables
//! per preset in its settings (`[agents.claude] args = ["--model", "opus"]`); they come
//! after the preset's own arguments, so a later flag of the same name wins where the CLI
//! lets it.

use std::collections::BTreeMap;
use std::time::Duration;

pub mod confined;
pub mod login;
pub mod outcome;
pub mod session;
pub mod trust;

use serde::{Deserialize, Serialize};

use devpilot_store::error::{Error, Result};

// # Layout
// - `mod.rs`: the presets, their argv (new or resumed conversation) and their environment.
// - `confined.rs`: what each CLI needs inside the sandbox: its state and its model's hosts.
// - `outcome.rs`: how a run ended, read from the CLI's structured output or error lines.
// - `session.rs`: where each CLI keeps its conversation; capturing and restoring it.
// - `trust.rs`: what each CLI may load of the project's own configuration, and where.

/// A built-in agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    Claude,
    Codex,
    Aider,
    Gemini,
}

/// A machine's own additions to a preset.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PresetSettings {
    /// Extra arguments, after the preset's own (e.g. `["--model", "opus"]`).
    pub args: Vec<String>,
    /// Extra environment variables for the agent. They live in the config file, which holds
    /// no secret: an API key stays in the CLI's own login or the user's environment.
    pub env: BTreeMap<String, String>,
    /// How long the CLI may go on only retrying a model call it cannot make (a dead API, no
    /// network) before its attempt ends: failed, or parked when this machine is offline.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub api_timeout: Option<Duration>,
    /// The account this preset runs as here, shared by name across machines, e.g.
    /// `[agents.claude] account = "work"`; default: the API key's fingerprint or the CLI's
    /// login (see [`crate::governor::account`]). A usage limit holds every machine of the
    /// same account, and the account's day cap counts them together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

/// The default [`PresetSettings::api_timeout`].
pub const API_TIMEOUT: Duration = Duration::from_secs(120);

impl PresetSettings {
    /// [`PresetSettings::api_timeout`], or the default.
    pub fn api_timeout(&self) -> Duration {
        self.api_timeout.unwrap_or(API_TIMEOUT).max(Duration::from_secs(1))
    }
}

impl Preset {
    pub const ALL: [Preset; 4] = [Preset::Claude, Preset::Codex, Preset::Aider, Preset::Gemini];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Claude => "claude",
            Preset::Codex => "codex",
            Preset::Aider => "aider",
            Preset::Gemini => "gemini",
        }
    }

    /// The preset called `name`, if there is one.
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name.trim())
    }

    /// [`Preset::named`], or an error listing the presets.
    pub fn parse(name: &str) -> Result<Self> {
        Self::named(name).ok_or_else(|| {
            Error::Invalid(format!(
                "there is no agent preset '{name}'; the presets are claude, codex, aider and gemini"
            ))
        })
    }

    /// The program the preset runs.
    pub fn program(self) -> &'static str {
        self.name()
    }

    /// The variables of the user's environment this preset's CLI reads (its API keys, base
    /// URLs and settings), as names or `PREFIX*` patterns: they reach the agent besides the
    /// base allowlist of [`crate::environ`]. Anything else needs `pass_env`.
    pub fn env_needs(self) -> &'static [&'static str] {
        match self {
            // https://code.claude.com/docs/en/settings#environment-variables
            // (and API_TIMEOUT_MS, its bound on one model request)
            Preset::Claude => &["ANTHROPIC_*", "CLAUDE_CODE_*", "CLAUDE_CONFIG_DIR", "API_TIMEOUT_MS"],
            // https://developers.openai.com/codex/config-reference (OPENAI_API_KEY,
            // OPENAI_BASE_URL, CODEX_HOME)
            Preset::Codex => &["OPENAI_*", "CODEX_*"],
            // https://geminicli.com/docs/get-started/authentication/ (GEMINI_API_KEY,
            // GOOGLE_API_KEY, GOOGLE_CLOUD_PROJECT, GOOGLE_APPLICATION_CREDENTIALS)
            Preset::Gemini => &["GEMINI_*", "GOOGLE_*"],
            // Aider's own AIDER_* options, and the provider keys litellm reads:
            // https://aider.chat/docs/config/dotenv.html, https://aider.chat/docs/llms.html
            Preset::Aider => &[
                "AIDER_*",
                "OPENAI_*",
                "ANTHROPIC_*",
                "GEMINI_*",
                "VERTEXAI_*",
                "DEEPSEEK_*",
                "OPENROUTER_*",
                "GROQ_*",
                "MISTRAL_*",
                "XAI_*",
                "COHERE_*",
                "AZURE_*",
                "OLLAMA_*",
                "FIREWORKS_*",
                "TOGETHERAI_*",
                "LITELLM_*",
            ],
        }
    }

    /// Variables this preset's CLI gets unless the user's environment or the settings set
    /// them: claude's own bound on its retries, so a dead API ends its attempt within
    /// `api_timeout` (it otherwise retries for about three minutes).
    pub fn default_env(self, api_timeout: Duration) -> Vec<(String, String)> {
        match self {
            // Three tries in all, each bounded by a third of the timeout.
            Preset::Claude => vec![
                ("CLAUDE_CODE_MAX_RETRIES".into(), "2".into()),
                ("API_TIMEOUT_MS".into(), (api_timeout.as_millis() / 3).max(1000).to_string()),
            ],
            _ => vec![],
        }
    }

    /// The argv for one job, and how its prompt travels: as one argv element while it fits
    /// well within Linux's limit on one argument (128 KiB), else on stdin (claude, codex,
    /// gemini) or in a private prompt file (aider's `--message-file`, added by the caller).
    /// `talk` says whether the CLI starts a new conversation or resumes a carried one.
    pub fn invocation(self, prompt: &str, extra: &[String], talk: &Conversation) -> (Vec<String>, PromptVia) {
        let via = match (prompt.len() <= ARGV_PROMPT_MAX, self) {
            (true, _) => PromptVia::Argv,
            (false, Preset::Aider) => PromptVia::File(()),
            (false, _) => PromptVia::Stdin(()),
        };
        let inline = (via == PromptVia::Argv).then_some(prompt);
        (self.command(inline, extra, talk), via)
    }

    /// The full argv for one new conversation: the preset's invocation with `prompt` as one
    /// element, then the machine's extra arguments.
    pub fn argv(self, prompt: &str, extra: &[String]) -> Vec<String> {
        self.command(Some(prompt), extra, &Conversation::New { id: None })
    }

    /// The argv, with the prompt inline (`Some`) or read from stdin or a file (`None`), then
    /// the machine's extra arguments (codex: before its `--`).
    fn command(self, prompt: Option<&str>, extra: &[String], talk: &Conversation) -> Vec<String> {
        let mut argv = match self {
            Preset::Claude => claude_argv(prompt, talk),
            Preset::Codex => return codex_argv(prompt, extra, talk),
            Preset::Aider => aider_argv(prompt, talk),
            Preset::Gemini => gemini_argv(prompt, talk),
        };
        argv.extend(extra.iter().cloned());
        argv
    }
}

fn s(x: &str) -> String {
    x.to_string()
}

/// Claude Code, headless mode: `-p` prints the answer and exits; the prompt is the
/// positional argument right after it (none: read from stdin, up to 10 MB). `acceptEdits`
/// lets it edit files without asking (in -p nothing can be asked); `--output-format
/// stream-json` (which `-p` takes only with `--verbose`) prints one JSON event per line as it
/// works (its messages, each tool call and result), so the job's log is a live transcript,
/// and ends with the same result object `json` prints alone (is_error, result, session_id,
/// total_cost_usd, usage).
/// `--session-id` names a new conversation up front, so a hand-off can carry it even if the
/// run never printed its result; `--resume` continues one.
/// Source: https://code.claude.com/docs/en/headless and
/// https://code.claude.com/docs/en/cli-reference.
fn claude_argv(prompt: Option<&str>, talk: &Conversation) -> Vec<String> {
    let mut argv = vec![s("claude"), s("-p")];
    argv.extend(prompt.map(s));
    argv.extend([s("--permission-mode"), s("acceptEdits"), s("--output-format"), s("stream-json"), s("--verbose")]);
    match talk {
        Conversation::New { id: Some(id) } => argv.extend([s("--session-id"), id.clone()]),
        Conversation::Resume { id, .. } => argv.extend([s("--resume"), id.clone()]),
        Conversation::New { id: None } => {}
    }
    argv
}

/// Codex CLI: `codex exec` runs non-interactively and never asks for approval; `--json`
/// prints its events as JSON lines (thread.started with the session id, item.completed,
/// turn.completed with usage, turn.failed); `--sandbox workspace-write` lets it edit the
/// worktree. `exec resume <id>` continues a session and takes no `--sandbox`: the same mode
/// goes in as `-c sandbox_mode`. `--` ends the options, so a prompt may start with '-'; `-`
/// reads it from stdin. The machine's extra args go before the `--`.
/// Source: https://developers.openai.com/codex/noninteractive and
/// https://developers.openai.com/codex/cli/reference.
fn codex_argv(prompt: Option<&str>, extra: &[String], talk: &Conversation) -> Vec<String> {
    let mut argv = vec![s("codex"), s("exec")];
    match talk {
        Conversation::Resume { id, .. } => {
            argv.extend([s("resume"), s("--json"), s("-c"), s("sandbox_mode=\"workspace-write\"")]);
            argv.extend(extra.iter().cloned());
            argv.extend([s("--"), id.clone()]);
        }
        Conversation::New { .. } => {
            argv.extend([s("--json"), s("--sandbox"), s("workspace-write")]);
            argv.extend(extra.iter().cloned());
            argv.push(s("--"));
        }
    }
    argv.push(prompt.map_or_else(|| s("-"), s));
    argv
}

/// Aider: `--message` sends one instruction, applies the edits and exits; `--yes-always`
/// answers its questions; `--no-auto-commits` leaves committing to DevPilot. It must not
/// edit the repo's `.gitignore` (`--no-gitignore`), check for an update or show release
/// notes at every start, or send analytics. Its files (`.aider*`) are kept out of DevPilot's
/// commits by the clone's `info/exclude`. `--restore-chat-history` reads the carried
/// `.aider.chat.history.md`. `--message=` keeps a leading '-' a value; a long prompt goes by
/// `--message-file`.
/// Source: https://aider.chat/docs/scripting.html and
/// https://aider.chat/docs/config/options.html.
fn aider_argv(prompt: Option<&str>, talk: &Conversation) -> Vec<String> {
    let mut argv = vec![s("aider")];
    argv.extend(prompt.map(|p| format!("--message={p}")));
    let quiet = ["--no-check-update", "--no-show-release-notes", "--analytics-disable"];
    argv.extend(["--yes-always", "--no-auto-commits", "--no-gitignore"].into_iter().chain(quiet).map(s));
    if let Conversation::Resume { .. } = talk {
        argv.push(s("--restore-chat-history"));
    }
    argv
}

/// Gemini CLI: `--prompt` runs headless (none, with stdin not a terminal: the prompt is
/// read from stdin); `-o stream-json` prints one event per line as it works (`init`,
/// `message`, `tool_use`, `tool_result`, `error`, and a closing `result` with the stats), so
/// its log is a live transcript (gemini 0.61, `JsonStreamEventType`); `--approval-mode
/// auto_edit` allows edits; `--skip-trust`, because every new worktree is a folder it has
/// not been told to trust. `--session-id` names a new session; `--session-file` loads a
/// carried one, from any directory.
/// Source: https://geminicli.com/docs/cli/headless/ and
/// https://github.com/google-gemini/gemini-cli/blob/main/docs/cli/cli-reference.md.
fn gemini_argv(prompt: Option<&str>, talk: &Conversation) -> Vec<String> {
    let mut argv = vec![s("gemini")];
    argv.extend(prompt.map(|p| format!("--prompt={p}")));
    argv.extend([s("-o"), s("stream-json"), s("--approval-mode"), s("auto_edit"), s("--skip-trust")]);
    match talk {
        Conversation::New { id: Some(id) } => argv.extend([s("--session-id"), id.clone()]),
        Conversation::Resume { file: Some(f), .. } => argv.extend([s("--session-file"), f.display().to_string()]),
        Conversation::Resume { id, file: None } => argv.extend([s("--resume"), id.clone()]),
        Conversation::New { id: None } => {}
    }
    argv
}

/// How an attempt's CLI conversation starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Conversation {
    /// A new conversation; `id` where the CLI lets the caller choose it (claude, gemini).
    New { id: Option<String> },
    /// Continues the CLI's session `id`, restored where the CLI looks for it (gemini's from
    /// `file`).
    Resume { id: String, file: Option<std::path::PathBuf> },
}

/// How a preset's prompt travels (see [`Preset::invocation`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PromptVia<T = ()> {
    /// In the argv (a plain command agent has none): stdin carries the payload.
    #[default]
    Argv,
    /// On stdin (read from its private file), instead of the payload.
    Stdin(T),
    /// In a private file the CLI is pointed at (aider's `--message-file`).
    File(T),
}

impl PromptVia {
    /// The same way, carrying the prompt's text.
    pub(crate) fn with(self, prompt: String) -> PromptVia<String> {
        match self {
            PromptVia::Argv => PromptVia::Argv,
            PromptVia::Stdin(()) => PromptVia::Stdin(prompt),
            PromptVia::File(()) => PromptVia::File(prompt),
        }
    }
}

/// The longest prompt passed as an argument; a longer one goes by stdin or a file. Linux
/// refuses a single argument over 128 KiB (MAX_ARG_STRLEN), whatever the total.
/// (The CLIs' stdin modes were each checked with a 209 KB prompt: claude 2.1, codex 0.171,
/// gemini 0.61 on stdin, aider 0.86 with `--message-file`.)
pub const ARGV_PROMPT_MAX: usize = 96 * 1024;

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each preset puts the whole prompt in one argv element, wherever its CLI expects it.
    #[test]
    fn the_prompt_is_one_element() {
        let prompt = "Fix it; rm -rf / $(whoami) `id` \"q\"\n--model evil";
        for p in Preset::ALL {
            let argv = p.argv(prompt, &["--model".into(), "x".into()]);
            assert_eq!(argv[0], p.program());
            let hits = argv.iter().filter(|a| a.contains(prompt)).count();
            assert_eq!(hits, 1, "{p}: {argv:?}");
            // The extras reach the CLI as options, never after its `--`.
            let extras = argv.iter().position(|a| a == "--model").unwrap();
            assert_eq!(argv[extras + 1], "x", "{p}");
            assert!(argv.iter().position(|a| a == "--").is_none_or(|end| extras < end), "{p}: {argv:?}");
        }
        assert_eq!(Preset::named("codex"), Some(Preset::Codex));
        // A prompt too long for one argument goes by stdin or a file, never in the argv.
        let long = "x".repeat(ARGV_PROMPT_MAX + 1);
        for p in Preset::ALL {
            let (argv, via) = p.invocation(&long, &["--model".into(), "x".into()], &Conversation::New { id: None });
            assert!(argv.iter().all(|a| a.len() < 100), "{p}: {argv:?}");
            assert_ne!(via, PromptVia::Argv, "{p}");
            assert!(argv.iter().any(|a| a == "--model"), "{p}: the machine's args stay");
        }
        assert_eq!(Preset::Claude.invocation("short", &[], &Conversation::New { id: None }).1, PromptVia::Argv);
        assert!(Preset::parse("cursor").unwrap_err().to_string().contains("claude, codex, aider and gemini"));
    }
}
