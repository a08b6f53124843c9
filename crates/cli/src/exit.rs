//! Exit statuses, a contract for scripts (documented in the man page's EXIT STATUS), and the
//! error every command ends with: one line that says what is wrong, and one with the fix
//! when there is one.

use std::fmt;

use devpilot_store::error::Error;

/// How `devpilot` exits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Ok = 0,
    /// Something failed: the database, the config, the operation.
    Error = 1,
    /// Bad flags or arguments (clap's own status).
    Usage = 2,
    /// No such job, source or stored key.
    NotFound = 3,
    /// Nothing to do, or it already exists: `enqueue --key` found the live job, a cancel of a
    /// finished job, a resume of a machine that is not paused (or of the fleet's limits switch
    /// that is off), a logout with nothing stored.
    Nothing = 4,
    /// No tray or `devpilot run` serves the queue on this computer.
    NotRunning = 5,
    /// `watch`: the job ended failed or dead.
    JobFailed = 6,
    /// `watch`: the job ended cancelled.
    JobCancelled = 7,
}

/// Every status with what it means, for the man page and `docs/cli.md`.
pub const DOCUMENTED: [(Code, &str); 8] = [
    (Code::Ok, "success"),
    (Code::Error, "an error: the database, the config or the operation failed"),
    (Code::Usage, "a usage error: an unknown flag, a missing or bad argument"),
    (Code::NotFound, "not found: no such job, source or stored key"),
    (Code::Nothing, "nothing to do or already there: enqueue --key found the live job, cancel of a finished job, requeue of a job that is neither finished nor parked by the governor, resume when not paused (resume --limits when the fleet's switch is off), logout with nothing stored"),
    (Code::NotRunning, "no tray or `devpilot run` is running for this queue on this computer (pause, resume, handoff)"),
    (Code::JobFailed, "watch: the job ended failed or dead"),
    (Code::JobCancelled, "watch: the job ended cancelled"),
];

/// A command's failure: its status, what is wrong, and what to do.
#[derive(Debug)]
pub struct Fail {
    pub code: Code,
    pub message: String,
    pub fix: Option<String>,
}

impl Fail {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), fix: None }
    }

    pub fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }

    pub fn not_found_job(id: i64) -> Self {
        Self::new(Code::NotFound, format!("there is no job #{id}")).fix("`devpilot jobs` lists the jobs of this queue")
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error: {}", self.message)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n  fix: {fix}")?;
        }
        Ok(())
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        if let Error::NoJob(id) = e {
            return Self::not_found_job(id);
        }
        let fix = match &e {
            Error::Keychain(_) => Some("`devpilot doctor` checks the keychain; a desktop session runs one (gnome-keyring or KWallet)"),
            Error::BadUrl(_) => Some("a database URL looks like postgres://USER@HOST:5432/DB (the password goes in the keychain: `devpilot login --database-url URL`)"),
            Error::Timeout(_) => Some("is the database up and reachable from here? `devpilot doctor` checks it"),
            Error::Db(_) if e.is_transient() => Some("is the database up and reachable from here? `devpilot doctor` checks it"),
            _ => None,
        };
        Self { code: Code::Error, message: e.to_string(), fix: fix.map(str::to_string) }
    }
}

impl From<std::io::Error> for Fail {
    fn from(e: std::io::Error) -> Self {
        Self::new(Code::Error, e.to_string())
    }
}

/// What a command returns: the status to exit with, or why it failed.
pub type Out = std::result::Result<Code, Fail>;

/// A command that returns `Result<()>` ends with status 0 when it succeeds.
pub fn done(r: devpilot_store::error::Result<()>) -> Out {
    r.map(|()| Code::Ok).map_err(Fail::from)
}
