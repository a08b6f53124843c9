//! `devpilot`: the headless command line over the DevPilot engine. Its names, flags, exit
//! codes and output are a contract.
//!
//! # Layout
//! - this file: the entry point, logging, and which function runs each command.
//! - [`cli`]: the commands and their flags (the clap definition).
//! - [`enqueue`]: `devpilot enqueue`: its flags, the payload and the job options they make.
//! - [`run`]: `devpilot run`: its flags over the settings, the machine it runs, how it stops.
//! - [`status`]: `devpilot status`, as text or JSON.
//! - [`jobs`]: cancel, requeue, prune, sweep, release, worktrees and the hidden claim.
//! - [`login`]: `devpilot login`: a PostgreSQL password (or a Linear key) into the keychain.
//! - [`sources`]: `devpilot sources`: list, poll now, add and remove tracker sources.
//! - [`config_cmd`]: `devpilot config show`.
//! - [`docs`]: man page and shell completions, generated from the flags.
//! - [`open`]: which database the commands use, opening the queue on it, and `migrate`.
//! - [`output`]: text helpers for what the commands print.

mod cli;
mod config_cmd;
mod docs;
mod enqueue;
mod jobs;
mod login;
mod open;
mod output;
mod run;
mod sources;
mod status;

use std::io::IsTerminal;

use clap::Parser;

use cli::{AddKind, Cli, Cmd, ConfigCmd, SourcesCmd};
use devpilot_engine::config::Paths;
use devpilot_engine::span::parse_duration;
use devpilot_store::error::Result;

/// Entry point: parses, runs, and maps every error to a message and exit code 1.
fn main() -> std::process::ExitCode {
    // Before any thread: the database URL leaves the environment an agent could read.
    devpilot_engine::seal::seal();
    let cli = Cli::parse();
    init_logging();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(dispatch(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DEVPILOT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,devpilot=info"));
    // Colours only for a terminal: a runner's log is often a file or the journal.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

async fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Cmd::Migrate => open::migrate().await,
        Cmd::Enqueue(args) => enqueue::enqueue(args).await,
        Cmd::Run(args) => run::run(args).await,
        Cmd::Status { orchestrator, json } => status::status(&orchestrator, json).await,
        Cmd::Sweep { claim_timeout, orchestrator } => jobs::sweep(&claim_timeout, orchestrator.as_deref()).await,
        Cmd::Release { orchestrator, machine, wait } => {
            let machine = machine.unwrap_or_else(devpilot_engine::settings::default_machine_name);
            jobs::release(&orchestrator, &machine, parse_duration(&wait)?).await
        }
        Cmd::Worktrees { orchestrator, prune } => jobs::worktrees(&orchestrator, prune).await,
        Cmd::Cancel { id } => jobs::cancel(id).await,
        Cmd::Requeue { id } => jobs::requeue(id).await,
        Cmd::Prune { older_than, dead_older_than, orchestrator } => {
            jobs::prune(older_than.as_deref(), dead_older_than.as_deref(), orchestrator.as_deref()).await
        }
        Cmd::Login { linear: true, .. } => login::login_linear().await,
        Cmd::Login { github: true, from_gh, api_url, .. } => login::login_github(from_gh, api_url).await,
        Cmd::Login { database_url, .. } => login::login(database_url.as_deref().unwrap_or_default()).await,
        Cmd::Sources { command: None, orchestrator, json } => sources::list(orchestrator, json).await,
        Cmd::Sources { command: Some(SourcesCmd::Poll { name }), orchestrator, .. } => {
            sources::poll(name, orchestrator).await
        }
        Cmd::Sources { command: Some(SourcesCmd::Add { kind: AddKind::Github(a) }), .. } => {
            sources::add_github(a).await
        }
        Cmd::Sources { command: Some(SourcesCmd::Add { kind: AddKind::Linear(a) }), .. } => {
            sources::add_linear(a).await
        }
        Cmd::Sources { command: Some(SourcesCmd::Remove { name }), .. } => sources::remove(&name),
        Cmd::Config { command: ConfigCmd::Path } => {
            println!("{}", Paths::for_app("devpilot")?.config_file().display());
            Ok(())
        }
        Cmd::Config { command: ConfigCmd::Show } => config_cmd::show().await,
        Cmd::Completions { shell } => docs::print(&docs::completions(shell)),
        Cmd::Man => docs::print(&docs::man_page()?),
        Cmd::Claim { orchestrator, machine, wait_stdin, id } => {
            jobs::claim(&orchestrator, &machine, wait_stdin, id).await
        }
    }
}
