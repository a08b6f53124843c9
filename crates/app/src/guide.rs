//! What the window's first-run guide asks the engine: is this a first start, does the
//! database answer (with the errors the CLI gives), is the agent's program on PATH, and
//! "skip" (settings exist from then on, so the guide never comes back).

use serde::Serialize;

use devpilot_engine::agent::{resolve_preset, resolve_program, AgentSpec};
use devpilot_engine::settings::Settings;
use devpilot_store::error::{Error, Result};

use crate::db_form::DbForm;
use crate::engine::Engine;

/// What the guide shows on its first step.
#[derive(Clone, Debug, Serialize)]
pub struct GuideState {
    /// No settings file existed at this start and none has been written since.
    pub needed: bool,
    /// Where the embedded database lives.
    pub embedded_path: String,
    /// The agent presets, by name.
    pub presets: Vec<&'static str>,
}

impl Engine {
    /// Whether the first-run guide should show: no settings file at this start (a corrupt one
    /// set aside is not a first start: the user had settings) and none since, and no
    /// DEVPILOT_* variable deciding in the file's place (its answers would not apply).
    pub fn guide(&self) -> GuideState {
        GuideState {
            needed: self.first_run && !self.paths.config_file().exists() && self.overrides.active().is_empty(),
            embedded_path: self.paths.default_db().display().to_string(),
            presets: devpilot_engine::preset::Preset::ALL.iter().map(|p| p.name()).collect(),
        }
    }

    /// The guide skipped: the defaults are written, so it does not come back.
    pub fn skip_guide(&self) -> Result<()> {
        if self.paths.config_file().exists() {
            return Ok(());
        }
        self.save_file(&Settings::default())?;
        tracing::info!(config = %self.paths.config_file().display(), "first-run guide skipped; default settings saved");
        Ok(())
    }

    /// Connects to the form's database as saving would (the password given, else the one in
    /// the keychain), and says what answered and whether DevPilot's tables are there yet.
    /// Nothing is saved.
    pub async fn test_connection(&self, db: &DbForm, password: Option<String>) -> Result<Tested> {
        let Some(url) = db.to_url()? else {
            return Ok(Tested::ready(format!("the embedded database, {}", self.paths.default_db().display())));
        };
        if url.is_sqlite() {
            return Ok(Tested::ready(format!("the SQLite file {}", url.sqlite_path().unwrap_or_default().display())));
        }
        let (full, conn) = self.connect_with(&url, password.filter(|p| !p.is_empty()).as_deref()).await?;
        let needs_schema = !devpilot_store::db::schema_present(&full, &conn).await?;
        Ok(Tested {
            text: format!("connected to {} as {}", url.target(), devpilot_engine::secrets::account(&url)),
            needs_schema,
        })
    }

    /// Creates DevPilot's tables in the form's PostgreSQL (what `devpilot migrate` does), for
    /// a first machine on a new database.
    pub async fn set_up_database(&self, db: &DbForm, password: Option<String>) -> Result<Tested> {
        let url = db.to_url()?.filter(|u| !u.is_sqlite()).ok_or_else(|| {
            Error::Invalid("only a PostgreSQL database needs setting up; the embedded one sets itself up".into())
        })?;
        let (full, conn) = self.connect_with(&url, password.filter(|p| !p.is_empty()).as_deref()).await?;
        devpilot_store::db::migrate(&full, &conn).await?;
        tracing::info!(target = %url.target(), "first-run guide: DevPilot's tables created");
        Ok(Tested::ready(format!("DevPilot's tables are set up in {}", url.target())))
    }
}

/// What a connection test found.
#[derive(Clone, Debug, Serialize)]
pub struct Tested {
    /// What answered, in words.
    pub text: String,
    /// Connected, but DevPilot's tables are not there yet (a new database).
    pub needs_schema: bool,
}

impl Tested {
    fn ready(text: String) -> Self {
        Self { text, needs_schema: false }
    }
}

/// Finds the program an agent line would run: a preset's CLI or the command's first word.
/// Returns the path found, or the error saving the setting would give.
pub fn find_agent(line: &str) -> Result<String> {
    let line = line.trim();
    if line.is_empty() {
        return Err(Error::Invalid("choose a preset or type the agent's command".into()));
    }
    let settings = Settings { agent: Some(line.to_string()), ..Settings::default() };
    let path = match settings.agent_spec()? {
        Some(AgentSpec::Preset { preset, .. }) => resolve_preset(preset)?,
        Some(AgentSpec::Command(argv)) => resolve_program(argv.first().map(String::as_str).unwrap_or_default())?,
        _ => return Err(Error::Invalid("choose a preset or type the agent's command".into())),
    };
    Ok(path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db_form::DbMode;
    use crate::overrides::Overrides;
    use devpilot_engine::config::Paths;

    fn paths(dir: &std::path::Path) -> Paths {
        Paths { config_dir: dir.join("config"), data_dir: dir.join("data"), log_dir: dir.join("data").join("logs") }
    }

    /// The guide shows on a first start only: not once settings exist (skipping writes the
    /// defaults), not when a corrupt file was there (the user had settings), not while
    /// DEVPILOT_* variables decide in the file's place.
    #[test]
    fn guide_shows_on_a_first_start_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        let e = Engine::new(p.clone(), "devpilot-test", Overrides::default());
        assert!(e.guide().needed, "no settings file: a first start");
        assert!(e.guide().embedded_path.ends_with("devpilot.sqlite"));
        e.skip_guide().unwrap();
        assert!(p.config_file().exists(), "skipping writes the defaults");
        assert!(!e.guide().needed, "and the guide is done");
        assert_eq!(p.load().unwrap(), Settings::default());
        assert!(!Engine::new(p.clone(), "devpilot-test", Overrides::default()).guide().needed, "not at the next start");

        let other = tempfile::tempdir().unwrap();
        let p2 = paths(other.path());
        std::fs::create_dir_all(&p2.config_dir).unwrap();
        std::fs::write(p2.config_file(), "not = [toml").unwrap();
        assert!(
            !Engine::new(p2, "devpilot-test", Overrides::default()).guide().needed,
            "a corrupt file is not a first start"
        );

        let third = tempfile::tempdir().unwrap();
        let env = Overrides { database_url: Some("sqlite:///tmp/x.sqlite".into()), ..Overrides::default() };
        assert!(
            !Engine::new(paths(third.path()), "devpilot-test", env).guide().needed,
            "DEVPILOT_DATABASE_URL decides"
        );
    }

    /// The embedded choice needs no connection and no tables; a PostgreSQL URL nobody
    /// listens on gets the CLI's "cannot reach" error, naming the target.
    #[tokio::test]
    async fn connection_tests_answer_like_the_cli() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::new(paths(dir.path()), "devpilot-test", Overrides::default());
        let t = e.test_connection(&DbForm { mode: DbMode::Embedded, ..DbForm::default() }, None).await.unwrap();
        assert!(t.text.starts_with("the embedded database") && !t.needs_schema, "{t:?}");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let form = DbForm {
            mode: DbMode::Postgres,
            host: "127.0.0.1".into(),
            port: Some(port),
            database: "devpilot".into(),
            user: "devpilot".into(),
            ..DbForm::default()
        };
        let err = e.test_connection(&form, Some("pw".into())).await.unwrap_err().to_string();
        assert!(err.starts_with(&format!("cannot reach the database at 127.0.0.1:{port}/devpilot")), "{err}");
        let err = e.set_up_database(&DbForm { mode: DbMode::Embedded, ..DbForm::default() }, None).await.unwrap_err();
        assert!(err.to_string().contains("only a PostgreSQL database needs setting up"), "{err}");
    }

    /// A preset or command found on PATH gives its path; a missing one gives the error that
    /// saving it would, naming the program.
    #[test]
    fn agents_are_found_or_named() {
        assert!(find_agent("sh -c true").unwrap().ends_with("/sh"));
        let err = find_agent("devpilot-no-such-agent --flag").unwrap_err().to_string();
        assert!(err.contains("devpilot-no-such-agent"), "{err}");
        assert!(find_agent("  ").is_err());
    }
}
