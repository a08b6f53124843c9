//! The engine's one error type. It serialises as `{kind, message}` so the tray's commands can
//! hand it to the window unchanged, and its messages never carry a secret.

use serde::Serialize;

/// Everything the engine can report to a user.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid database URL: {0}")]
    BadUrl(String),
    #[error("cannot reach the database at {target}: {reason}")]
    Unreachable { target: String, reason: String },
    #[error("the database rejected the login for user '{user}': wrong password or unknown user")]
    Auth { user: String },
    #[error("database error: {0}")]
    Db(String),
    #[error("malformed payload: {0}")]
    Payload(String),
    #[error("agent program '{0}' was not found or is not executable")]
    AgentMissing(String),
    #[error("config file {path} is invalid: {reason}")]
    Config { path: String, reason: String },
    #[error("keychain: {0}")]
    Keychain(String),
    #[error("{0}")]
    Invalid(String),
    #[error("I/O error: {0}")]
    Io(String),
}

impl Error {
    /// A stable machine-readable name for the variant.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::BadUrl(_) => "bad_url",
            Error::Unreachable { .. } => "unreachable",
            Error::Auth { .. } => "auth",
            Error::Db(_) => "db",
            Error::Payload(_) => "payload",
            Error::AgentMissing(_) => "agent_missing",
            Error::Config { .. } => "config",
            Error::Keychain(_) => "keychain",
            Error::Invalid(_) => "invalid",
            Error::Io(_) => "io",
        }
    }
}

impl Serialize for Error {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Error", 2)?;
        st.serialize_field("kind", self.kind())?;
        st.serialize_field("message", &self.to_string())?;
        st.end()
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

impl From<sea_orm::DbErr> for Error {
    fn from(e: sea_orm::DbErr) -> Self {
        Error::Db(e.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
