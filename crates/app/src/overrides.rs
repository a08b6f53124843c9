//! [`Overrides`]: the `DEVPILOT_*` environment variables that override the settings file.

/// Values from the environment that override the settings file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    pub database_url: Option<String>,
    pub orchestrator: Option<String>,
    pub agent: Option<String>,
}

impl Overrides {
    pub fn from_env() -> Self {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Self {
            database_url: devpilot_engine::seal::env_database_url(),
            orchestrator: get("DEVPILOT_ORCHESTRATOR"),
            agent: get("DEVPILOT_AGENT"),
        }
    }

    /// The names of the variables in force, for the window to show.
    pub fn active(&self) -> Vec<&'static str> {
        let mut v = vec![];
        if self.database_url.is_some() {
            v.push("DEVPILOT_DATABASE_URL");
        }
        if self.orchestrator.is_some() {
            v.push("DEVPILOT_ORCHESTRATOR");
        }
        if self.agent.is_some() {
            v.push("DEVPILOT_AGENT");
        }
        v
    }
}
