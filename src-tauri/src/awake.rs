//! Keep awake while agents run: with the `keep_awake` setting on (it is off by default), the
//! app holds a logind inhibitor `Inhibit("idle:sleep", "DevPilot", "Agents are running",
//! "block")` exactly while at least one agent runs here, and closes its file descriptor (which
//! releases it) as soon as none does, or the setting goes off.
//!
//! What it blocks: suspend on idle, and a suspend someone asks for while agents run (logind
//! refuses it, or the desktop asks first). What it never blocks: the lid. It takes no
//! "handle-lid-switch" lock, and logind's `LidSwitchIgnoreInhibited=yes` (the default in
//! logind.conf) makes logind's own lid handling ignore "idle" and "sleep" block inhibitors. So
//! closing the lid still suspends, logind still announces PrepareForSleep, and the sleep hook
//! ([`crate::sleep`]) still hands off (or pauses) under its delay inhibitor; the hand-off stops
//! the agents, and that releases this inhibitor too.
//!
//! Its own small state (the connection and the held fd); no system bus or no logind is
//! logged (a warning once, then quietly at debug level) and the app runs as before.

use std::sync::Arc;

use devpilot_app::settings::Settings;
use devpilot_app::{Engine, Status};
use zbus::zvariant::OwnedFd;

use crate::logind::Login1ManagerProxy;

/// Whether the machine should be kept awake now.
pub fn wanted(settings: &Settings, status: &Status) -> bool {
    settings.keep_awake && !status.running.is_empty()
}

/// Starts following the engine's status and settings in the background. Never fails.
pub fn spawn(engine: Arc<Engine>) {
    tauri::async_runtime::spawn(async move {
        let mut status = engine.watch_status();
        let mut settings = engine.watch_settings();
        let mut awake = KeepAwake::default();
        let mut setting = None;
        loop {
            // The watch guards are dropped before any await.
            let (on, set) = {
                let s = settings.borrow_and_update();
                (wanted(&s, &status.borrow_and_update()), s.keep_awake)
            };
            if setting.replace(set) != Some(set) {
                tracing::info!("keep awake while agents run: {}", if set { "on" } else { "off" });
            }
            awake.want(on).await;
            tokio::select! {
                r = status.changed() => if r.is_err() { break },
                r = settings.changed() => if r.is_err() { break },
            }
        }
    });
}

/// The inhibitor, when held, and the system bus connection it came through.
#[derive(Default)]
struct KeepAwake {
    conn: Option<zbus::Connection>,
    held: Option<OwnedFd>,
    warned: bool,
}

impl KeepAwake {
    async fn want(&mut self, on: bool) {
        if on && self.held.is_none() {
            self.take().await;
        } else if !on && self.held.is_some() {
            // Closing our only copy of the fd is what releases it.
            self.held = None;
            tracing::info!("no agent runs: idle sleep is allowed again (logind inhibitor released)");
        }
    }

    async fn take(&mut self) {
        match self.inhibit().await {
            Ok(fd) => {
                self.held = Some(fd);
                tracing::info!("agents are running: keeping the machine awake (logind idle:sleep block inhibitor)");
            }
            Err(e) => {
                // Reconnect next time: the bus may come back (or this connection was lost).
                self.conn = None;
                if !std::mem::replace(&mut self.warned, true) {
                    tracing::warn!(error = %e, "cannot keep the machine awake while agents run (no logind on the system bus?); it may sleep when idle");
                } else {
                    tracing::debug!(error = %e, "still cannot keep the machine awake");
                }
            }
        }
    }

    async fn inhibit(&mut self) -> zbus::Result<OwnedFd> {
        let conn = match &self.conn {
            Some(c) => c.clone(),
            None => {
                let c = zbus::Connection::system().await?;
                self.conn = Some(c.clone());
                c
            }
        };
        let m = Login1ManagerProxy::new(&conn).await?;
        m.inhibit("idle:sleep", "DevPilot", "Agents are running", "block").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devpilot_app::orchestrator::{JobRef, RunningJob};

    /// Only with the setting on, and only while something runs.
    #[test]
    fn wanted_only_while_agents_run_with_the_setting_on() {
        let on = Settings { keep_awake: true, ..Settings::default() };
        let idle = Status::default();
        let busy = Status {
            running: vec![RunningJob {
                job: JobRef { id: 1, title: None, attempt: 1, token: 1, issue_url: None },
                started_unix_ms: 0,
            }],
            ..Status::default()
        };
        assert!(!Settings::default().keep_awake, "off by default");
        assert!(!wanted(&Settings::default(), &busy));
        assert!(!wanted(&on, &idle));
        assert!(wanted(&on, &busy));
    }
}
