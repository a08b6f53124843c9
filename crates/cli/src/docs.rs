//! Shell completions and the manual page, both generated from the clap definition, so they
//! never drift from the flags. The Debian package runs these at package time
//! (scripts/package.sh); a user can run them too.

use std::io::Write;

use clap::CommandFactory;

use crate::cli::Cli;
use devpilot_store::error::{Error, Result};

/// The completion script for `shell`: clap's (commands and flags), and values read when
/// the user presses TAB (job ids, source, repo and preset names) from `devpilot __complete`.
pub fn completions(shell: clap_complete::Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "devpilot", &mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let text = match shell {
        clap_complete::Shell::Bash => format!("{text}\n{BASH_VALUES}"),
        clap_complete::Shell::Fish => format!("{text}\n{FISH_VALUES}"),
        clap_complete::Shell::Zsh => zsh_values(&text),
        _ => text,
    };
    text.into_bytes()
}

/// Bash: the values a word takes, else clap's `_devpilot`.
const BASH_VALUES: &str = r#"# Values read at TAB: job ids of the queue, source, repo and preset names (devpilot __complete).
_devpilot_values() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" what="" i w
    local words=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        case "$w" in
            --orchestrator) ((i++)) ;;
            -*) ;;
            *) words+=("$w") ;;
        esac
    done
    case "$prev" in
        --repo|--maps-to) what=repos ;;
        --source) what=sources ;;
        --agent) what=presets ;;
    esac
    if [[ -z "$what" && "$cur" != -* && ${#words[@]} -eq 1 ]]; then
        case "${words[0]}" in
            show|logs|watch|open|cancel|requeue) [[ "$prev" == --interval ]] || what=jobs ;;
        esac
    fi
    if [[ -z "$what" && "$cur" != -* && ${#words[@]} -eq 2 && "${words[0]}" == sources ]]; then
        case "${words[1]}" in poll|remove) what=sources ;; esac
    fi
    if [[ -z "$what" && "$cur" != -* && ${#words[@]} -eq 2 && "${words[0]}" == limits ]]; then
        case "${words[1]}" in no-resume|auto-resume) what=jobs ;; esac
    fi
    if [[ -n "$what" ]]; then
        COMPREPLY=( $(compgen -W "$(devpilot __complete "$what" 2>/dev/null)" -- "$cur") )
        return 0
    fi
    _devpilot "$@"
}
if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _devpilot_values -o nosort -o bashdefault -o default devpilot
else
    complete -F _devpilot_values -o bashdefault -o default devpilot
fi
"#;

/// Fish: the same values, as more `complete` lines.
const FISH_VALUES: &str = r#"# Values read at TAB (devpilot __complete).
complete -c devpilot -n "__fish_seen_subcommand_from show logs watch open cancel requeue" -f -a "(devpilot __complete jobs 2>/dev/null)"
complete -c devpilot -n "__fish_seen_subcommand_from sources; and __fish_seen_subcommand_from poll remove" -f -a "(devpilot __complete sources 2>/dev/null)"
complete -c devpilot -n "__fish_seen_subcommand_from limits; and __fish_seen_subcommand_from no-resume auto-resume" -f -a "(devpilot __complete jobs 2>/dev/null)"
complete -c devpilot -l repo -x -a "(devpilot __complete repos 2>/dev/null)"
complete -c devpilot -l maps-to -x -a "(devpilot __complete repos 2>/dev/null)"
complete -c devpilot -l source -x -a "(devpilot __complete sources 2>/dev/null)"
complete -c devpilot -l agent -x -a "(devpilot __complete presets 2>/dev/null)"
"#;

/// Zsh: clap's `_default` action of each value the queue or the config knows becomes a
/// function that asks `devpilot __complete`.
fn zsh_values(text: &str) -> String {
    let helpers = r#"
(( $+functions[_devpilot_from] )) ||
_devpilot_from() {
    local -a values
    values=(${(f)"$(devpilot __complete $1 2>/dev/null)"})
    compadd -a values
}
"#;
    let mut out = String::new();
    for line in text.lines() {
        // Positionals are named by their id (`:id`, `:name`), options by their value name.
        let what = [
            ("':id", "jobs"),
            ("':name", "sources"),
            ("'::name", "sources"),
            (":REPO:", "repos"),
            (":SOURCE:", "sources"),
        ]
        .into_iter()
        .find(|(mark, _)| if mark.starts_with('\'') { line.starts_with(mark) } else { line.contains(mark) })
        .or_else(|| (line.starts_with("'--agent=") && line.contains(":NAME:")).then_some(("", "presets")));
        match what {
            Some((_, what)) if line.contains(":_default'") => {
                out.push_str(&line.replacen(":_default'", &format!(":_devpilot_from {what}'"), 1));
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    match out.rfind("\nif [ \"$funcstack[1]\" = \"_devpilot\" ]") {
        Some(at) => format!("{}{helpers}{}", &out[..at], &out[at..]),
        None => format!("{out}{helpers}"),
    }
}

/// Writes a generated document to stdout. Rendered into memory first: a reader that goes away
/// (`| head`) is an error message, not a panic half-way through a generator.
pub fn print(bytes: &[u8]) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(bytes).and_then(|()| stdout.flush())?;
    Ok(())
}

/// One page for `devpilot` and every command: clap_mangen's sections for the top level, then
/// a COMMANDS section with each command's synopsis, description and options (clap_mangen on
/// its own would point at a page per command, `devpilot-enqueue(1)`, that nobody installs).
pub fn man_page() -> Result<Vec<u8>> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let man = clap_mangen::Man::new(cmd.clone()).manual("DevPilot");
    let mut out = Vec::new();
    let io = |e: std::io::Error| Error::io("cannot render the manual page", e);
    man.render_title(&mut out).map_err(io)?;
    man.render_name_section(&mut out).map_err(io)?;
    man.render_synopsis_section(&mut out).map_err(io)?;
    man.render_description_section(&mut out).map_err(io)?;
    man.render_options_section(&mut out).map_err(io)?;
    out.extend_from_slice(b".SH COMMANDS\n");
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        command_section(sub, &mut out).map_err(io)?;
    }
    out.extend_from_slice(exit_status().as_bytes());
    out.extend_from_slice(json_fields().as_bytes());
    out.extend_from_slice(FILES_AND_ENVIRONMENT.as_bytes());
    man.render_version_section(&mut out).map_err(io)?;
    // Every rendered part starts with roff's apostrophe preamble; once is enough.
    let text = String::from_utf8_lossy(&out);
    let (first, rest) = text.split_at(text.find(PREAMBLE).map_or(0, |i| i + PREAMBLE.len()));
    Ok(format!("{first}{}", rest.replace(PREAMBLE, "")).into_bytes())
}

/// What `roff` puts at the top of each rendering.
const PREAMBLE: &str = ".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n";

/// One command (and its own subcommands) as `.SS` entries of the COMMANDS section.
fn command_section(cmd: &clap::Command, out: &mut Vec<u8>) -> std::io::Result<()> {
    if cmd.has_subcommands() {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            command_section(sub, out)?;
        }
        return Ok(());
    }
    let name = cmd.get_bin_name().unwrap_or_else(|| cmd.get_name());
    writeln!(out, ".SS \"{}\"", name.replace('-', "\\-"))?;
    let man = clap_mangen::Man::new(cmd.clone());
    let mut section = |render: &dyn Fn(&mut Vec<u8>) -> std::io::Result<()>, heading: &str| {
        let mut buf = Vec::new();
        render(&mut buf)?;
        let text = String::from_utf8_lossy(&buf);
        // Each rendered section opens with its own `.SH`; here they are parts of one `.SS`.
        let body: String = text.lines().filter(|l| *l != heading).map(|l| format!("{l}\n")).collect();
        out.extend_from_slice(body.as_bytes());
        out.extend_from_slice(b".PP\n");
        Ok::<(), std::io::Error>(())
    };
    section(&|b| man.render_synopsis_section(b), ".SH SYNOPSIS")?;
    section(&|b| man.render_description_section(b), ".SH DESCRIPTION")?;
    section(&|b| man.render_options_section(b), ".SH OPTIONS")?;
    Ok(())
}

/// The EXIT STATUS section, from [`crate::exit::DOCUMENTED`].
fn exit_status() -> String {
    let mut s = String::from(".SH \"EXIT STATUS\"\n");
    for (code, meaning) in crate::exit::DOCUMENTED {
        s.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", code as u8, roff(meaning)));
    }
    s
}

/// The fields each command's `--json` prints: a contract (tests/tests/cli_contract.rs fails
/// when one disappears).
pub const JSON_FIELDS: [(&str, &str); 18] = [
    ("jobs", "an array of jobs: id, orchestrator_id, title, state, attempts, max_attempts, claimed_by, created_at, started_at, finished_at, last_error, repo, source, issue, issue_url, url, pull_request, summary, agent, waiting"),
    ("show", "job (as in jobs), payload, branch, issue, issue_url, pull_request, unroutable, history (id, at, kind, machine, detail), deliveries (event, tries, outcome, last_error), log (from, tail)"),
    ("watch", "the job as it ended (as in jobs)"),
    ("status", "orchestrator, counts, running, waiting, recent, unroutable, machines"),
    ("enqueue", "id, added (false: --key found the live job), state"),
    ("cancel", "id, outcome (cancelled, requested, already), holder"),
    ("requeue", "id, requeued"),
    ("release", "machine, handed_off, released, handing_off"),
    ("handoff", "machine, jobs (id, title, branch, pushed, stayed, ended), safe, paused, text"),
    ("pause", "machine, state, paused, paused_until_unix_ms, running"),
    ("resume", "machine, state, paused, paused_until_unix_ms, running"),
    ("sweep", "released, dead"),
    ("prune", "jobs, machines, files"),
    ("worktrees", "an array: id, path, branch, repo, state, kept, why, pending_push, removed"),
    ("sources", "orchestrator, sources (each source's row and health)"),
    ("sources add, sources remove", "name, kind, added or removed"),
    ("sources poll", "orchestrator, sources (source, polled, seen, added, lines, error)"),
    ("doctor, logout", "doctor: ok, problems, warnings, checks (name, status, detail, fix); logout: secret, removed"),
];

fn json_fields() -> String {
    let mut s = String::from(".SH \"JSON FIELDS\"\nWith \\fB\\-\\-json\\fR, a command prints one JSON document. These field names are stable; new fields may be added.\n");
    for (cmd, fields) in JSON_FIELDS {
        s.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", roff(cmd), roff(fields)));
    }
    s
}

/// Text as roff shows it: dashes are hyphens, and no line starts a request.
fn roff(text: &str) -> String {
    text.replace('\\', "\\\\").replace('-', "\\-").replace('`', "")
}

const FILES_AND_ENVIRONMENT: &str = r#".SH FILES
.TP
\fI~/.config/devpilot/config.toml\fR
The settings (\fBdevpilot config path\fR prints where, \fBdevpilot config show\fR what they say). The file holds no secret: a PostgreSQL password lives in the OS keychain (\fBdevpilot login\fR).
.TP
\fI~/.local/share/devpilot/devpilot.sqlite\fR
The embedded default database, used when no database is configured.
.SH ENVIRONMENT
.TP
\fBDEVPILOT_DATABASE_URL\fR
The database to use, instead of the config file's.
.TP
\fBDEVPILOT_ORCHESTRATOR\fR
The queue to use when \fB\-\-orchestrator\fR is not given (before the config's \fIorchestrator_id\fR, then \fIpersonal\fR).
.TP
\fBDEVPILOT_LOG\fR
What to log on stderr, e.g. \fIinfo,devpilot=debug\fR.
"#;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The page covers every visible command, its flags, and nothing half-rendered.
    #[test]
    fn man_page_covers_every_command() {
        let page = String::from_utf8(man_page().unwrap()).unwrap();
        assert!(page.starts_with(PREAMBLE) && page.matches(PREAMBLE).count() == 1, "{page}");
        assert!(page.contains(".TH devpilot 1"), "{page}");
        for c in ["enqueue", "run", "status", "config show", "config path", "completions", "login"] {
            assert!(page.contains(&format!(".SS \"devpilot {c}\"")), "no section for {c}");
        }
        assert!(page.contains("\\-\\-payload\\-file"), "enqueue's flags");
        assert!(!page.contains(".SS \"devpilot man\""), "man is hidden");
        assert!(!page.contains("devpilot\\-enqueue(1)"), "no reference to a page that is not installed");
    }

    #[test]
    fn completions_name_the_commands() {
        let bash = String::from_utf8(completions(clap_complete::Shell::Bash)).unwrap();
        assert!(bash.contains("enqueue") && bash.contains("complete -F"), "{bash}");
    }
}
