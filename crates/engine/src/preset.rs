//! Built-in agent presets: each maps a job to its CLI's one-shot, non-interactive
//! invocation. The prompt is always ONE argv element (never a shell string), put where the
//! CLI's parser cannot mistake it for a flag.
//!
//! Each machine may add arguments (a model, a permission mode) and environment variables
//! per preset in its settings (`[agents.claude] args = ["--model", "opus"]`); they come
//! after the preset's own arguments, so a later flag of the same name wins where the CLI
//! lets it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use devpilot_store::error::{Error, Result};

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
            Preset::Claude => &["ANTHROPIC_*", "CLAUDE_CODE_*", "CLAUDE_CONFIG_DIR"],
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

    /// The argv for one job, and how its prompt travels: as one argv element while it fits
    /// well within Linux's limit on one argument (128 KiB), else on stdin (claude, codex,
    /// gemini) or in a private prompt file (aider's `--message-file`, added by the caller).
    pub fn invocation(self, prompt: &str, extra: &[String]) -> (Vec<String>, PromptVia) {
        if prompt.len() <= ARGV_PROMPT_MAX {
            return (self.argv(prompt, extra), PromptVia::Argv);
        }
        let s = |x: &str| x.to_string();
        let (mut argv, via) = match self {
            // `claude -p` with no prompt argument reads the prompt from stdin (up to 10 MB).
            Preset::Claude => {
                (vec![s("claude"), s("-p"), s("--permission-mode"), s("acceptEdits")], PromptVia::Stdin(()))
            }
            // `codex exec -`: "If not provided as an argument (or if `-` is used), instructions
            // are read from stdin."
            Preset::Codex => {
                let mut argv = vec![s("codex"), s("exec"), s("--sandbox"), s("workspace-write")];
                argv.extend(extra.iter().cloned());
                argv.push(s("-"));
                return (argv, PromptVia::Stdin(()));
            }
            // `--message-file FILE`: "Specify a file containing the message to send the LLM,
            // process reply, then exit".
            Preset::Aider => (vec![s("aider"), s("--yes-always"), s("--no-auto-commits")], PromptVia::File(())),
            // With no `--prompt` and stdin not a terminal, gemini runs headless on stdin (up
            // to 8 MB). (Its own `--sandbox` mode passes stdin on as an argument again.)
            Preset::Gemini => {
                (vec![s("gemini"), s("--approval-mode"), s("auto_edit"), s("--skip-trust")], PromptVia::Stdin(()))
            }
        };
        argv.extend(extra.iter().cloned());
        (argv, via)
    }

    /// The full argv for one job: the preset's invocation with `prompt` as one element, then
    /// the machine's extra arguments.
    pub fn argv(self, prompt: &str, extra: &[String]) -> Vec<String> {
        let s = |x: &str| x.to_string();
        let mut argv = match self {
            // Claude Code, headless mode: `-p` prints the answer and exits; the prompt is the
            // positional argument right after it, before any flag that takes several values.
            // `acceptEdits` lets it edit files without asking (in -p nothing can be asked).
            // Source: https://code.claude.com/docs/en/headless and
            // https://code.claude.com/docs/en/cli-reference (--permission-mode).
            Preset::Claude => vec![s("claude"), s("-p"), s(prompt), s("--permission-mode"), s("acceptEdits")],
            // Codex CLI: `codex exec [OPTIONS] [PROMPT]` runs non-interactively and never
            // asks for approval; `--sandbox workspace-write` lets it edit the worktree (the
            // default is read-only). `--` ends the options, so a prompt may start with '-'.
            // Source: https://developers.openai.com/codex/noninteractive and
            // https://developers.openai.com/codex/cli/reference.
            // The machine's extra args go before the `--`.
            Preset::Codex => {
                let mut argv = vec![s("codex"), s("exec"), s("--sandbox"), s("workspace-write")];
                argv.extend(extra.iter().cloned());
                argv.extend([s("--"), s(prompt)]);
                return argv;
            }
            // Aider: `--message` sends one instruction, applies the edits and exits;
            // `--yes-always` answers its questions; `--no-auto-commits` leaves committing to
            // DevPilot's hand-off and to the user. `--message=` keeps a leading '-' a value.
            // Source: https://aider.chat/docs/scripting.html and
            // https://aider.chat/docs/config/options.html.
            Preset::Aider => vec![s("aider"), format!("--message={prompt}"), s("--yes-always"), s("--no-auto-commits")],
            // Gemini CLI: `--prompt` runs headless; `--approval-mode auto_edit` allows edits
            // (anything needing a prompt is denied headless); `--skip-trust`, because every
            // new worktree is a folder it has not been told to trust and headless mode stops
            // on an untrusted folder.
            // Source: https://geminicli.com/docs/cli/headless/ and
            // https://github.com/google-gemini/gemini-cli/blob/main/docs/cli/cli-reference.md,
            // https://geminicli.com/docs/cli/trusted-folders/.
            Preset::Gemini => {
                vec![s("gemini"), format!("--prompt={prompt}"), s("--approval-mode"), s("auto_edit"), s("--skip-trust")]
            }
        };
        argv.extend(extra.iter().cloned());
        argv
    }
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
            let (argv, via) = p.invocation(&long, &["--model".into(), "x".into()]);
            assert!(argv.iter().all(|a| a.len() < 100), "{p}: {argv:?}");
            assert_ne!(via, PromptVia::Argv, "{p}");
            assert!(argv.iter().any(|a| a == "--model"), "{p}: the machine's args stay");
        }
        assert_eq!(Preset::Claude.invocation("short", &[]).1, PromptVia::Argv);
        assert!(Preset::parse("cursor").unwrap_err().to_string().contains("claude, codex, aider and gemini"));
    }
}
