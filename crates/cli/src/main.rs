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
//! - [`login`]: `devpilot login` and `logout`: the keychain's secrets.
//! - [`sources`]: `devpilot sources`: list, poll now, add and remove tracker sources.
//! - [`config_cmd`]: `devpilot config show`.
//! - [`limits`]: `devpilot limits`, its release and resume verbs, and `pause`/`resume --limits`.
//! - [`limits_set`]: `devpilot limits set`: this machine's `[limits]` caps.
//! - [`docs`]: man page and shell completions, generated from the flags.
//! - [`open`]: which database and which queue the commands use, and `migrate`.
//! - [`output`]: text and JSON helpers for what the commands print.
//! - [`exit`]: the exit statuses (a contract) and the error every command ends with.
//! - [`view`]: `jobs`, `show`, `watch` and `open`: reading one job or many.
//! - [`logs`]: `devpilot logs [-f]`, from this machine's file or the holder's stored tail.
//! - [`ask`]: `pause`, `resume` and `handoff`, asked of this computer's running machine.
//! - [`doctor`]: `devpilot doctor`, one line per part of the setup.
//! - [`complete`]: the values completions offer (job ids, sources, repos, presets).

mod ask;
mod cli;
mod complete;
mod config_cmd;
mod docs;
mod doctor;
mod enqueue;
mod exit;
mod jobs;
mod limits;
mod limits_set;
mod login;
mod logs;
mod open;
mod output;
mod run;
mod sources;
mod status;
mod view;

use std::io::IsTerminal;

use clap::Parser;

use cli::{AddKind, Cli, Cmd, ConfigCmd, SourcesCmd};
use devpilot_engine::config::Paths;
use devpilot_engine::span::parse_duration;
use exit::{done, Code, Fail, Out};
use limits::LimitsCmd;
use open::queue_name;

/// Entry point: parses, runs, and maps the outcome to an exit status (see [`exit::Code`]).
fn main() -> std::process::ExitCode {
    // Inside an agent's sandbox this binary is its first process (the sandbox's init).
    devpilot_engine::sandbox::init::enter_if_asked();
    // Before any thread: the database URL leaves the environment an agent could read.
    devpilot_engine::seal::seal();
    let cli = Cli::parse();
    if cli.command.only_prints() {
        // `devpilot jobs | head` ends quietly, as `ls | head` does, instead of an error about
        // a broken pipe; commands that change something keep Rust's default and finish.
        // SAFETY: before any thread; SIG_DFL is a valid disposition for SIGPIPE.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    init_logging();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = match rt.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(fail) => {
            eprintln!("{fail}");
            fail.code
        }
    };
    // Nothing a command left running (a blocked stdin read) holds the exit up.
    rt.shutdown_background();
    std::process::ExitCode::from(code as u8)
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

async fn dispatch(cli: Cli) -> Out {
    let flag = cli.orchestrator.as_deref();
    match cli.command {
        Cmd::Migrate => done(open::migrate().await),
        Cmd::Enqueue(mut args) => {
            args.orchestrator = queue_name(flag)?;
            enqueue::enqueue(args).await
        }
        Cmd::Run(mut args) => {
            args.orchestrator = queue_name(flag)?;
            done(run::run(*args).await)
        }
        Cmd::Status { json } => done(status::status(&queue_name(flag)?, json).await),
        Cmd::Jobs(args) => view::jobs(&queue_name(flag)?, args).await,
        Cmd::Show { id, json } => view::show(id, json).await,
        Cmd::Logs { id, follow } => logs::logs(id, follow).await,
        Cmd::Watch { id, interval, json } => view::watch(id, parse_duration(&interval)?, json).await,
        Cmd::Open { id, print } => view::open(id, print).await,
        Cmd::Pause { limits: true, json, .. } => limits::switch(&queue_name(flag)?, true, json).await,
        Cmd::Pause { for_, json, .. } => {
            let for_ = for_.as_deref().map(parse_duration).transpose()?;
            ask::pause(&queue_name(flag)?, for_, json).await
        }
        Cmd::Resume { limits: true, json } => limits::switch(&queue_name(flag)?, false, json).await,
        Cmd::Resume { json, .. } => ask::resume(&queue_name(flag)?, json).await,
        Cmd::Handoff { json } => ask::handoff(&queue_name(flag)?, json).await,
        Cmd::Doctor { json } => doctor::doctor(flag, json).await,
        Cmd::Sweep { claim_timeout, json } => jobs::sweep(&claim_timeout, flag, json).await,
        Cmd::Release { machine, wait, json } => {
            let machine = machine.unwrap_or_else(devpilot_engine::settings::default_machine_name);
            jobs::release(&queue_name(flag)?, &machine, parse_duration(&wait)?, json).await
        }
        Cmd::Worktrees { prune, json } => jobs::worktrees(&queue_name(flag)?, prune, json).await,
        Cmd::Cancel { id, json } => jobs::cancel(id, json).await,
        Cmd::Requeue { id, json } => jobs::requeue(id, json).await,
        Cmd::Prune { older_than, dead_older_than, json } => {
            jobs::prune(older_than.as_deref(), dead_older_than.as_deref(), flag, json).await
        }
        Cmd::Login { linear: true, .. } => done(login::login_linear().await),
        Cmd::Login { github: true, from_gh, api_url, .. } => done(login::login_github(from_gh, api_url).await),
        Cmd::Login { database_url: Some(url), .. } => done(login::login(&url).await),
        Cmd::Login { .. } => login::login_asked().await,
        Cmd::Logout { database, linear, github, json } => {
            login::logout(login::which(database, linear, github), json).await
        }
        Cmd::Sources { command: None, json } => done(sources::list(Some(queue_name(flag)?), json).await),
        Cmd::Sources { command: Some(SourcesCmd::Poll { name }), json } => {
            done(sources::poll(name, Some(queue_name(flag)?), json).await)
        }
        Cmd::Sources { command: Some(SourcesCmd::Add { kind: AddKind::Github(a) }), json } => {
            done(sources::add_github(a, json).await)
        }
        Cmd::Sources { command: Some(SourcesCmd::Add { kind: AddKind::Linear(a) }), json } => {
            done(sources::add_linear(a, json).await)
        }
        Cmd::Sources { command: Some(SourcesCmd::Remove { name }), json } => sources::remove(&name, json),
        Cmd::Limits { command, json } => limits_cmd(command, flag, json).await,
        Cmd::Config { command: ConfigCmd::Path } => {
            println!("{}", Paths::for_app("devpilot").map_err(Fail::from)?.config_file().display());
            Ok(Code::Ok)
        }
        Cmd::Config { command: ConfigCmd::Show } => done(config_cmd::show().await),
        Cmd::Completions { shell } => done(docs::print(&docs::completions(shell))),
        Cmd::Man => done(docs::print(&docs::man_page()?)),
        Cmd::Complete { what } => {
            complete::print(what, flag).await;
            Ok(Code::Ok)
        }
        Cmd::Claim { machine, wait_stdin, id } => done(jobs::claim(&queue_name(flag)?, &machine, wait_stdin, id).await),
    }
}

/// `devpilot limits` and its sub-verbs.
async fn limits_cmd(command: Option<LimitsCmd>, flag: Option<&str>, json: bool) -> Out {
    match command {
        None => limits::list(&queue_name(flag)?, json).await,
        Some(LimitsCmd::Set(args)) => limits_set::set(args, json),
        Some(LimitsCmd::Release { account }) => limits::release(&queue_name(flag)?, &account, json).await,
        Some(LimitsCmd::NoResume { id }) => limits::resume_after(id, false, json).await,
        Some(LimitsCmd::AutoResume { id }) => limits::resume_after(id, true, json).await,
    }
}
