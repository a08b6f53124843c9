//! Shell completions and the manual page, both generated from the clap definition, so they
//! never drift from the flags. The Debian package runs these at package time
//! (scripts/package.sh); a user can run them too.

use std::io::Write;

use clap::CommandFactory;

use crate::cli::Cli;
use devpilot_store::error::{Error, Result};

/// The completion script for `shell`.
pub fn completions(shell: clap_complete::Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "devpilot", &mut out);
    out
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
The default of every \fB\-\-orchestrator\fR flag.
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
