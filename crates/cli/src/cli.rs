//! The headless `devpilot` command line: its commands and their flags, the clap definition
//! the man page and completions are generated from. Its names and flags are a contract.

use clap::{Parser, Subcommand};
use devpilot_store::job::JobState;

use crate::enqueue::EnqueueArgs;
use crate::limits::LimitsCmd;
use crate::run::RunArgs;

#[derive(Parser, Debug)]
#[command(
    name = "devpilot",
    version,
    about = "DevPilot dispatch: one shared queue of coding-agent jobs, each run on exactly one machine."
)]
pub struct Cli {
    /// The queue (orchestrator) to use. Default: the config's `orchestrator_id`, else
    /// `personal` (the window's default too).
    #[arg(long, env = "DEVPILOT_ORCHESTRATOR", global = true, value_name = "QUEUE")]
    pub orchestrator: Option<String>,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Create or upgrade the schema.
    Migrate,
    /// Add a job. The payload (JSON) comes from --payload, --payload-file or stdin. Prints
    /// the job's id; with --key, the id of the live job with that key if there is one.
    Enqueue(EnqueueArgs),
    /// Claim and run jobs until interrupted (SIGINT/SIGTERM hand off cleanly).
    Run(Box<RunArgs>),
    /// Jobs by state, who holds what and for how long, and machines.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// List jobs, newest first (like `gh run list`).
    Jobs(JobsArgs),
    /// Everything about one job: its result, pull request, issue, branch, machine, times,
    /// cost, deliveries, history and the last lines of its log.
    Show {
        #[arg(value_name = "JOB")]
        id: i64,
        #[arg(long)]
        json: bool,
    },
    /// Print a job's agent log: this machine's file, or the tail its holder stores in the
    /// database; with -f, follow it until the job ends, on whichever machine runs it.
    Logs {
        #[arg(value_name = "JOB")]
        id: i64,
        /// Keep printing new output until the job ends.
        #[arg(short, long)]
        follow: bool,
    },
    /// Print each change of a job's state until it ends. Exit 0 completed, 6 failed or
    /// dead, 7 cancelled.
    Watch {
        #[arg(value_name = "JOB")]
        id: i64,
        /// How often to look.
        #[arg(long, default_value = "1s")]
        interval: String,
        #[arg(long)]
        json: bool,
    },
    /// Open a job's pull request in the browser, else its issue.
    Open {
        #[arg(value_name = "JOB")]
        id: i64,
        /// Print the link instead of opening it.
        #[arg(long)]
        print: bool,
    },
    /// Ask this computer's running tray or `devpilot run` to claim nothing new, for a while
    /// or until `devpilot resume`. Running jobs go on. With --limits: the fleet's switch
    /// instead, in the database (no running machine needed).
    Pause {
        /// How long (e.g. 30m, 2h). Default: until resumed.
        #[arg(long = "for", value_name = "DURATION")]
        for_: Option<String>,
        /// Jobs parked on a usage limit wait for a person, on every machine, instead of
        /// resuming by themselves when their account's hold ends.
        #[arg(long, conflicts_with = "for_")]
        limits: bool,
        #[arg(long)]
        json: bool,
    },
    /// Ask this computer's running tray or `devpilot run` to claim again. With --limits: turn
    /// the fleet's switch off instead, in the database.
    Resume {
        /// Jobs parked on a usage limit resume by themselves again, on every machine.
        #[arg(long)]
        limits: bool,
        #[arg(long)]
        json: bool,
    },
    /// Before closing the lid: this computer's running machine stops its agents, pushes their
    /// work, releases their jobs for another machine and pauses; prints the verdict.
    Handoff {
        #[arg(long)]
        json: bool,
    },
    /// Check the whole setup: config, database, schema, keychain, repos, the agent CLI and
    /// its login, sources, the sleep hook and the desktop. Exit 1 if something must be fixed.
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Release stale claims once (the cron / systemd-timer backstop), of every queue, or of
    /// the --orchestrator one when one is given.
    Sweep {
        #[arg(long, default_value = "30m")]
        claim_timeout: String,
        #[arg(long)]
        json: bool,
    },
    /// Cancel a job, from any machine: a waiting job at once; a running one is stopped by its
    /// holder at its next renewal (or at once, through NOTIFY).
    Cancel {
        /// The job's id.
        #[arg(value_name = "JOB")]
        id: i64,
        #[arg(long)]
        json: bool,
    },
    /// Put a dead, failed or cancelled job back in the queue, with a fresh attempt budget;
    /// or let a job parked at its spend cap or on a usage limit go on now.
    Requeue {
        /// The job's id.
        #[arg(value_name = "JOB")]
        id: i64,
        #[arg(long)]
        json: bool,
    },
    /// Delete finished jobs (with their history), old machines and old agent files now (the
    /// backstop of the retention that running machines do on their own), of every queue, or
    /// of the --orchestrator one when one is given.
    Prune {
        /// Completed and cancelled jobs finished longer ago than this (default: the settings'
        /// retention, 14d).
        #[arg(long)]
        older_than: Option<String>,
        /// Dead jobs finished longer ago than this (default: the settings' dead_retention, 30d).
        #[arg(long)]
        dead_older_than: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Hand off everything a machine holds, so another machine takes it now. Run from any
    /// machine, it asks the holder to hand off (it commits and pushes each job's work in
    /// progress first) and waits for it; a holder that does not answer within --wait is
    /// released directly, and its work in progress stays on it.
    Release {
        /// The holder (default: this machine).
        #[arg(long)]
        machine: Option<String>,
        /// How long to wait for the holder to hand off. A holder renews at least once a
        /// heartbeat (30s by default), and at once through NOTIFY on PostgreSQL.
        #[arg(long, default_value = "45s")]
        wait: String,
        #[arg(long)]
        json: bool,
    },
    /// List this machine's job worktrees (kept ones say why), or remove the finished ones.
    Worktrees {
        /// Remove the worktrees of finished jobs that hold nothing unsaved.
        #[arg(long)]
        prune: bool,
        #[arg(long)]
        json: bool,
    },
    /// Store a PostgreSQL password in the OS keychain and the URL (without it) in the config;
    /// or, with --linear, a Linear API key, or with --github a GitHub token, in the keychain.
    /// With no flag, asks which.
    Login {
        /// postgres://USER@HOST:PORT/DB, with no password.
        #[arg(long, conflicts_with_all = ["linear", "github"])]
        database_url: Option<String>,
        /// Store a Linear API key (asked for, or one line on stdin; never an argument).
        #[arg(long, conflicts_with = "github")]
        linear: bool,
        /// Store a GitHub token (asked for, or one line on stdin; never an argument). If the
        /// GitHub CLI is logged in, its token is offered as an import.
        #[arg(long)]
        github: bool,
        /// With --github: import the GitHub CLI's token (`gh auth token`) without asking.
        #[arg(long, requires = "github")]
        from_gh: bool,
        /// With --github: the token is for the GitHub API at this address (GitHub Enterprise,
        /// `https://ghe.example/api/v3`); github.com's token is never sent to another host.
        #[arg(long, requires = "github")]
        api_url: Option<String>,
    },
    /// Forget a stored secret: the database password, the Linear key or the GitHub token.
    /// With no flag, asks which.
    Logout {
        /// The configured database's password.
        #[arg(long, conflicts_with_all = ["linear", "github"])]
        database: bool,
        #[arg(long, conflicts_with = "github")]
        linear: bool,
        #[arg(long)]
        github: bool,
        #[arg(long)]
        json: bool,
    },
    /// Tracker sources whose issues become jobs: each one's last poll, next turn, cursor,
    /// outbox backlog, rate limit and last error.
    Sources {
        #[command(subcommand)]
        command: Option<SourcesCmd>,
        #[arg(long, global = true)]
        json: bool,
    },
    /// The fleet's usage limits and spend today: each account held or near its cap, the day's
    /// spend against its cap, and each hold's machine, job and reason. Its sub-verbs set the
    /// caps, end a hold early and keep a job from resuming by itself after a limit.
    Limits {
        #[command(subcommand)]
        command: Option<LimitsCmd>,
        #[arg(long, global = true)]
        json: bool,
    },
    /// The config file: where it is, and what it says.
    Config {
        #[command(subcommand)]
        command: ConfigCmd,
    },
    /// Print a shell's completion script.
    ///
    /// E.g. `devpilot completions bash > ~/.local/share/bash-completion/completions/devpilot`
    /// (the Debian package installs them for bash, zsh and fish).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `devpilot man | man -l -`.
    #[command(hide = true)]
    Man,
    /// The values a completion offers: job ids, source, repo or preset names, one per line.
    #[command(hide = true, name = "__complete")]
    Complete {
        #[arg(value_enum)]
        what: crate::complete::What,
    },
    /// The claim of job ID, once, as "Claiming work exactly once, with one UPDATE" writes it: for races and
    /// diagnostics.
    #[command(hide = true)]
    Claim {
        #[arg(long)]
        machine: String,
        /// Open the queue, print `ready`, and claim only once a line arrives on stdin (at the
        /// instant it names in ns since the epoch, if it names one).
        #[arg(long)]
        wait_stdin: bool,
        /// The job's id.
        id: i64,
    },
}

impl Cmd {
    /// Whether the command only reads and prints (a closed pipe may end it at once).
    pub fn only_prints(&self) -> bool {
        matches!(
            self,
            Cmd::Status { .. }
                | Cmd::Jobs(_)
                | Cmd::Show { .. }
                | Cmd::Logs { .. }
                | Cmd::Watch { .. }
                | Cmd::Doctor { .. }
                | Cmd::Completions { .. }
                | Cmd::Man
                | Cmd::Complete { .. }
                | Cmd::Config { .. }
                | Cmd::Limits { command: None, .. }
        )
    }
}

#[derive(Subcommand, Debug)]
pub enum SourcesCmd {
    /// Poll now, ignoring the interval; prints each job it added, updated or cancelled.
    Poll {
        /// One source (default: all of this machine's).
        #[arg(value_name = "SOURCE")]
        name: Option<String>,
    },
    /// Add a source to this machine's settings, after testing the key, teams and label.
    Add {
        #[command(subcommand)]
        kind: AddKind,
    },
    /// Remove a source from this machine's settings.
    Remove {
        #[arg(value_name = "SOURCE")]
        name: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum AddKind {
    /// A Linear source: e.g. `devpilot sources add linear --team ENG --label agent`.
    Linear(AddLinear),
    /// A GitHub source: e.g. `devpilot sources add github --repo acme/webapp --label agent`.
    Github(AddGithub),
}

#[derive(clap::Args, Debug)]
pub struct AddGithub {
    /// The repository whose issues become jobs: OWNER/REPO.
    #[arg(long, value_name = "OWNER/REPO")]
    pub repo: String,
    /// The label an issue must carry (default `agent`; "" for any open issue).
    #[arg(long)]
    pub label: Option<String>,
    /// The DevPilot repo its issues run in.
    #[arg(long, value_name = "REPO")]
    pub maps_to: Option<String>,
    /// The source's name (default: the repository's name, lower-case).
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub common: AddCommon,
}

#[derive(clap::Args, Debug)]
pub struct AddLinear {
    /// A team key (repeat, or separate with commas).
    #[arg(long, required = true, value_delimiter = ',')]
    pub team: Vec<String>,
    /// The label an issue must carry (default `agent`; "" for any).
    #[arg(long)]
    pub label: Option<String>,
    /// A workflow state type an issue must be in (repeat; default unstarted and started).
    #[arg(long, value_delimiter = ',')]
    pub state: Vec<String>,
    /// The DevPilot repo its issues run in (by team).
    #[arg(long, value_name = "REPO")]
    pub maps_to: Option<String>,
    /// The source's name (default: the first team key, lower-case).
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub common: AddCommon,
}

/// What every kind of source takes.
#[derive(clap::Args, Debug)]
pub struct AddCommon {
    /// Only issues assigned to the key's owner.
    #[arg(long)]
    pub assigned_to_me: bool,
    /// How often the fleet polls it (default 60s, at least 15s).
    #[arg(long)]
    pub interval: Option<String>,
    /// Another API address (GitHub Enterprise, a proxy; tests).
    #[arg(long)]
    pub api_url: Option<String>,
    /// Save without testing the connection.
    #[arg(long)]
    pub no_test: bool,
}

#[derive(Subcommand, Debug)]
pub enum ConfigCmd {
    /// Print the config file's path (it may not exist yet: then the defaults apply).
    Path,
    /// Print the settings as TOML, with where the database password is (never the password).
    Show,
}

/// `devpilot jobs`: its filters.
#[derive(clap::Args, Debug)]
pub struct JobsArgs {
    /// Only jobs in this state.
    #[arg(long, short, value_parser = job_state())]
    pub state: Option<JobState>,
    /// Only jobs of this repo.
    #[arg(long, value_name = "REPO")]
    pub repo: Option<String>,
    /// Only jobs from this tracker source.
    #[arg(long, value_name = "SOURCE")]
    pub source: Option<String>,
    /// Only jobs this machine holds now or ran last.
    #[arg(long)]
    pub machine: Option<String>,
    /// At most this many.
    #[arg(long, short = 'L', default_value_t = 30)]
    pub limit: u32,
    #[arg(long)]
    pub json: bool,
}

/// A job state's name, as `JobState` spells it (clap lists them in `--help` and completions).
fn job_state() -> impl clap::builder::TypedValueParser<Value = JobState> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(JobState::ALL.map(JobState::as_str))
        .try_map(|s: String| JobState::parse(&s).ok_or("not a job state"))
}
