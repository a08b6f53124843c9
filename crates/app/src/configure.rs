//! Settings from the window: the stored password, applying new settings (live or by a
//! restart), checking a login, and forgetting the password.

use std::sync::Arc;
use std::time::Duration;

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::orchestrator::AgentKind;
use devpilot_engine::secrets;
use devpilot_engine::settings::Settings;
use devpilot_store::db::{self, DbUrl, PoolSettings};
use devpilot_store::error::{Error, Result};

use crate::db_form::DbForm;
use crate::engine::{run_config, Engine};
use crate::keychain::keychain;

impl Engine {
    /// Whether a password is stored for the configured PostgreSQL URL (never the password).
    pub async fn password_stored(&self) -> Result<bool> {
        let file = self.paths.load()?;
        let Some(raw) = file.database_url.filter(|u| !u.trim().is_empty()) else { return Ok(false) };
        let url = DbUrl::parse(&raw)?;
        if url.is_sqlite() {
            return Ok(false);
        }
        let service = self.service.clone();
        keychain(move || secrets::load_password(&service, &url).map(|p| p.is_some())).await
    }

    /// Checks new settings, verifies a changed database connection (and a new password) by
    /// connecting, stores the password in the keychain, saves the file, and restarts.
    /// Nothing is saved if any step fails.
    pub async fn apply_settings(
        self: &Arc<Self>,
        mut new: Settings,
        db: &DbForm,
        password: Option<String>,
    ) -> Result<()> {
        let url = db.to_url()?;
        new.database_url = url.as_ref().map(|u| u.without_password().to_string());
        new.orchestrator_id = new.orchestrator_id.trim().to_string();
        new.agent = new.agent.filter(|a| !a.trim().is_empty());
        new.machine = new.machine.filter(|m| !m.trim().is_empty());
        new.validate()?;
        let old = self.paths.load()?;
        let password = password.filter(|p| !p.is_empty());
        // A new password (a rotation) must reach the pool: that takes a restart.
        let new_login = password.is_some();
        if let Some(url) = url.as_ref().filter(|u| !u.is_sqlite()) {
            let changed = old.database_url != new.database_url || password.is_some();
            if changed {
                self.verify_login(url, password.as_deref()).await?;
            }
            if let Some(pw) = password {
                let (service, u) = (self.service.clone(), url.clone());
                keychain(move || secrets::store_password(&service, &u, &pw)).await?;
            }
        } else if password.is_some() {
            return Err(Error::Invalid("a password is only used with a PostgreSQL database".into()));
        }
        if let Some(spec) = new.agent_spec()? {
            spec.check()?;
        }
        self.save_file(&new)?;
        self.apply(&old, new, new_login).await
    }

    /// Applies saved settings as a delta. Only a change of database (or its password),
    /// orchestrator, machine name or LISTEN restarts the engine (handing off what runs);
    /// everything else applies live and running agents keep running.
    pub(crate) async fn apply(self: &Arc<Self>, old: &Settings, new: Settings, new_login: bool) -> Result<()> {
        let (old, new) = (self.with_overrides(old.clone()), self.with_overrides(new));
        let identity =
            |s: &Settings| (s.database_url.clone(), s.orchestrator_id.clone(), s.machine_name(), s.poll_only);
        let agent = self.agent_for(&new, self.status().backend.is_some_and(|b| b.is_sqlite()))?;
        // No orchestrator runs (no agent on a shared queue, or an error at start), or the
        // agent was removed on a shared queue, or who or where changed: start anew.
        let live = self.orchestrator().filter(|_| !new_login && identity(&old) == identity(&new));
        let (Some(handle), Some(agent)) = (live, agent) else {
            self.start().await;
            return Ok(());
        };
        handle.reconfigure(run_config(&new, agent.clone(), &self.paths, &self.service)?);
        let sandbox = crate::lifecycle::sandbox_warnings(&new, Some(&agent));
        self.status_tx.send_modify(|s| {
            s.sandbox = sandbox;
            s.agent = match agent {
                AgentSpec::Command(_) => AgentKind::Command,
                AgentSpec::Preset { .. } => AgentKind::Preset,
                _ => AgentKind::Demo,
            };
        });
        let dispatch_changed = self.settings().dispatch_enabled != new.dispatch_enabled;
        self.effective.send_replace(new.clone());
        if dispatch_changed {
            self.set_dispatch(new.dispatch_enabled).await?;
        }
        Ok(())
    }

    /// Connects to `url` with `password`, or the one stored for it, or none: the errors are
    /// the CLI's (unreachable, refused login, missing database, TLS).
    async fn verify_login(&self, url: &DbUrl, password: Option<&str>) -> Result<()> {
        drop(self.connect_with(url, password).await?);
        Ok(())
    }

    /// A connection to `url` as [`Engine::verify_login`] makes it, and the URL it used.
    pub(crate) async fn connect_with(
        &self,
        url: &DbUrl,
        password: Option<&str>,
    ) -> Result<(DbUrl, sea_orm::DatabaseConnection)> {
        let full = match password {
            Some(pw) => url.with_password(pw)?,
            None => {
                let (service, u) = (self.service.clone(), url.clone());
                match keychain(move || secrets::load_password(&service, &u)).await? {
                    Some(pw) => url.with_password(&pw)?,
                    None => url.clone(),
                }
            }
        };
        probe(&full).await?;
        let conn = db::connect(&full, &PoolSettings::default()).await?;
        Ok((full, conn))
    }

    /// Forgets the stored password for the configured PostgreSQL URL.
    pub async fn forget_password(&self) -> Result<()> {
        let file = self.paths.load()?;
        let Some(raw) = file.database_url.filter(|u| !u.trim().is_empty()) else { return Ok(()) };
        let url = DbUrl::parse(&raw)?;
        let service = self.service.clone();
        keychain(move || secrets::delete_password(&service, &url)).await
    }
}

/// A quick TCP check, so an unreachable host is reported in seconds (the pool would retry
/// for its whole acquire timeout first).
async fn probe(url: &DbUrl) -> Result<()> {
    let target = url.target();
    let hostport = target.split('/').next().unwrap_or_default().to_string();
    match tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(hostport.as_str())).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Error::Unreachable { target, reason: e.to_string() }),
        Err(_) => Err(Error::Unreachable { target, reason: "no answer within 5s".into() }),
    }
}
