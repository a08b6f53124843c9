//! Starting, restarting and stopping: settings and environment, the database URL and its
//! password, the agent, then connecting in the background and spawning the orchestrator.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::config::Paths;
use devpilot_engine::orchestrator::{
    self, AgentKind, BootClock, Event, MachineState, RunConfig, Status, StopMode, Wiring,
};
use devpilot_engine::settings::Settings;
use devpilot_store::db::{DbUrl, PoolSettings};
use devpilot_store::error::{Error, Result};
use devpilot_store::queue::Queue;

use crate::engine::{run_config, Current, Engine};
use crate::keychain::keychain;

impl Engine {
    /// Starts (or restarts) everything from the settings file and the environment.
    /// Never fails: problems become the status' state and message, and an unreachable
    /// database is retried in the background.
    pub async fn start(self: &Arc<Self>) {
        let mut cur = self.lifecycle.lock().await;
        let gen = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        self.shutdown(cur.take(), StopMode::HandOff).await;
        *cur = Some(self.launch(gen).await);
    }

    /// Stops the orchestrator (hand off: releases every claim now; drain: lets running jobs
    /// finish for up to the grace, then hands off the rest).
    pub async fn stop(&self, mode: StopMode) {
        if mode == StopMode::HandOff {
            // A stop already under way (a drain holding the lifecycle lock) turns hard now,
            // instead of this one waiting out the drain's grace for the lock.
            if let Some(h) = self.orchestrator() {
                tokio::spawn(async move { h.stop(StopMode::HandOff).await });
            }
        }
        let mut cur = self.lifecycle.lock().await;
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.shutdown(cur.take(), mode).await;
        self.status_tx.send_modify(|s| {
            s.state = MachineState::Stopped;
            s.running.clear();
        });
    }

    /// Stops the running orchestrator (the generation has already moved on, so no
    /// background task can start another), then lets the old tasks end.
    async fn shutdown(&self, cur: Option<Current>, mode: StopMode) {
        // The handle stays reachable while it stops, so a hard stop can overtake a soft one.
        if let Some(h) = self.orchestrator() {
            h.stop(mode).await;
        }
        if let Ok(mut h) = self.handle.write() {
            h.take();
        }
        if let Some(c) = cur {
            for t in c.tasks {
                // Forwarders end on their own once the old orchestrator's channel closes.
                let abort = t.abort_handle();
                if tokio::time::timeout(Duration::from_secs(2), t).await.is_err() {
                    abort.abort();
                }
            }
        }
        if let Ok(mut q) = self.queue.write() {
            *q = None;
        }
    }

    async fn launch(self: &Arc<Self>, gen: u64) -> Current {
        let mut current = Current { tasks: vec![] };
        // 1. Settings: file (a corrupt one set aside, for defaults), then environment.
        let Some(settings) = self.start_settings() else { return current };
        self.effective.send_replace(settings.clone());
        let machine = settings.machine_name();
        self.status_tx.send_modify(|s| {
            *s = Status::default();
            s.orchestrator_id = settings.orchestrator_id.clone();
            s.machine = machine.clone();
            s.dispatch_enabled = settings.dispatch_enabled;
            s.overrides = self.overrides.active().iter().map(|v| v.to_string()).collect();
        });
        if let Err(e) = devpilot_store::queue::validate_orchestrator(&settings.orchestrator_id) {
            self.set_problem(MachineState::Error, e.to_string());
            return current;
        }
        // 2. The database URL, with its password from the keychain (blocking: D-Bus).
        let paths = self.paths.clone();
        let service = self.service.clone();
        let env_url = self.overrides.database_url.clone();
        let url = match keychain(move || resolve(&paths, &service, env_url.as_deref())).await {
            Ok(u) => u,
            Err(e) => {
                self.set_problem(MachineState::Error, e.to_string());
                return current;
            }
        };
        self.status_tx.send_modify(|s| {
            s.database = url.target();
            s.backend = Some((&url).into());
        });
        // 3. The agent. A missing program does not stop the start: the orchestrator says so,
        // claims nothing, and looks again until it is there.
        let agent = match self.agent_for(&settings, url.is_sqlite()) {
            Ok(a) => a,
            Err(e) => {
                self.set_problem(MachineState::Error, e.to_string());
                return current;
            }
        };
        let sandbox = sandbox_warnings(&settings, agent.as_ref());
        self.status_tx.send_modify(|s| {
            s.sandbox = sandbox;
            s.agent = match &agent {
                Some(AgentSpec::Command(_)) => AgentKind::Command,
                Some(AgentSpec::Preset { .. }) => AgentKind::Preset,
                Some(_) => AgentKind::Demo,
                None => AgentKind::None,
            };
        });
        if agent.is_none() {
            self.set_problem(
                MachineState::NeedsAgent,
                "This is a shared PostgreSQL queue and no agent command is set, so this machine claims nothing. Set an agent command in Settings (or DEVPILOT_AGENT).".into(),
            );
        }
        self.connect_in_background(&mut current, gen, url, settings, agent);
        current
    }

    /// The settings a start runs with: the file's, or the defaults when the file could not be
    /// parsed (it is kept aside, and remembered for the window), with the environment's
    /// overrides. `None`, with the problem in the status, when the file cannot be read.
    fn start_settings(&self) -> Option<Settings> {
        match self.paths.load_or_set_aside() {
            Ok(loaded) => {
                if let Some(kept) = loaded.set_aside {
                    tracing::warn!(kept_as = %kept.kept_as, reason = %kept.reason, "the config file could not be parsed; kept it aside and started on default settings");
                    self.set_aside.send_replace(Some(kept));
                }
                Some(self.with_overrides(loaded.settings))
            }
            Err(e) => {
                self.set_problem(MachineState::Error, format!("{e}. Fix or delete the file, then restart DevPilot."));
                None
            }
        }
    }

    /// The file's settings with the environment's overrides applied.
    pub(crate) fn with_overrides(&self, mut settings: Settings) -> Settings {
        if let Some(o) = &self.overrides.orchestrator {
            settings.orchestrator_id = o.clone();
        }
        if let Some(a) = &self.overrides.agent {
            settings.agent = Some(a.clone());
        }
        if let Some(u) = &self.overrides.database_url {
            settings.database_url = Some(u.clone());
        }
        settings
    }

    /// Which agent runs jobs: the configured command; else the demo on the embedded SQLite
    /// default; else none (a shared PostgreSQL never gets the demo).
    pub(crate) fn agent_for(&self, settings: &Settings, sqlite: bool) -> Result<Option<AgentSpec>> {
        Ok(match settings.agent_spec()? {
            Some(spec) => Some(spec),
            None if sqlite => Some(AgentSpec::Demo { duration: self.demo_duration }),
            None => None,
        })
    }

    /// Connects (retrying while the database is only unreachable; a wrong password or a
    /// missing database is reported at once), then starts the orchestrator if there is an
    /// agent.
    fn connect_in_background(
        self: &Arc<Self>,
        current: &mut Current,
        gen: u64,
        url: DbUrl,
        settings: Settings,
        agent: Option<AgentSpec>,
    ) {
        let me = Arc::clone(self);
        let task = tokio::spawn(async move { me.connect_and_run(gen, url, settings, agent).await });
        current.tasks.push(task);
    }

    /// The task [`Engine::connect_in_background`] spawns: the agent's run config and the pool,
    /// then the queue, then (with an agent) the orchestrator.
    async fn connect_and_run(self: Arc<Self>, gen: u64, url: DbUrl, settings: Settings, agent: Option<AgentSpec>) {
        let cfg = match agent.map(|a| run_config(&settings, a, &self.paths, &self.service)).transpose() {
            Ok(c) => c,
            Err(e) => {
                self.set_problem(MachineState::Error, e.to_string());
                return;
            }
        };
        let heartbeat = cfg.as_ref().map_or(settings.heartbeat.get(), |c| c.heartbeat);
        // One pooled connection on PostgreSQL (plus LISTEN's own): a machine holds at
        // most two. The local SQLite file can afford a second reader for the window.
        let pool = orchestrator::machine_pool(heartbeat, if url.is_sqlite() { 2 } else { 1 });
        let mut named = url.with_application_name(&format!("devpilot:{}", settings.machine_name()));
        if settings.poll_only {
            named = named.with_pooled();
        }
        let Some(conn) = self.open_queue(gen, &named, &pool).await else { return };
        let Some(cfg) = cfg else { return };
        self.spawn_orchestrator(gen, conn, cfg, &named);
    }

    /// Opens the database, retrying while it is only unreachable (and saying so), and makes
    /// it the window's queue. `None` when it failed (the status says why) or a restart
    /// superseded this start.
    async fn open_queue(&self, gen: u64, named: &DbUrl, pool: &PoolSettings) -> Option<Queue> {
        let announced = std::sync::atomic::AtomicBool::new(false);
        let current = || match self.generation.load(Ordering::SeqCst) == gen {
            true => Ok(()),
            false => Err(Error::Invalid("superseded by a restart".into())),
        };
        let conn = match orchestrator::connect(named, pool, current, |e| self.offline(e, &announced)).await {
            Ok(q) => q,
            Err(e) => {
                if self.generation.load(Ordering::SeqCst) == gen {
                    self.set_problem(MachineState::Error, format!("{e}. Fix the database settings."));
                }
                return None;
            }
        };
        if self.generation.load(Ordering::SeqCst) != gen {
            return None;
        }
        if announced.load(Ordering::SeqCst) {
            let _ = self.events.send(Event::DatabaseOnline);
        }
        if let Ok(mut q) = self.queue.write() {
            *q = Some(conn.clone());
        }
        self.status_tx.send_modify(|s| {
            s.db_online = true;
            if s.state == MachineState::Offline {
                s.state = MachineState::Starting;
                s.message = None;
            }
        });
        Some(conn)
    }

    /// Starts the orchestrator on the queue, unless a restart superseded this start.
    fn spawn_orchestrator(&self, gen: u64, conn: Queue, cfg: RunConfig, named: &DbUrl) {
        // Checked under the lock that `shutdown` takes, so a restart can never miss an
        // orchestrator that is starting.
        let Ok(mut slot) = self.handle.write() else { return };
        if self.generation.load(Ordering::SeqCst) != gen {
            return;
        }
        let wiring = Wiring { status: self.status_tx.clone(), events: self.events.clone(), clock: Arc::new(BootClock) };
        let socket = devpilot_engine::control::socket_path(&self.paths.data_dir, &cfg.orchestrator_id);
        let (handle, _join) = orchestrator::start_machine(conn, named, cfg, wiring);
        *slot = Some(handle);
        self.serve_control(socket);
    }

    /// Serves the control socket of the queue now run (once per queue: a restart on the
    /// same queue keeps it, one on another queue moves it).
    fn serve_control(&self, socket: std::path::PathBuf) {
        let Ok(mut control) = self.control.lock() else { return };
        if control.as_ref().is_some_and(|(p, _)| *p == socket) {
            return;
        }
        if let Some((_, old)) = control.take() {
            old.cancel();
        }
        let stop = devpilot_engine::control::CancellationToken::new();
        devpilot_engine::control::spawn(socket.clone(), Tray(self.me.clone()), stop.clone());
        *control = Some((socket, stop));
    }

    /// The database cannot be reached (yet): say so, once as an event, always in the status.
    fn offline(&self, e: &Error, announced: &std::sync::atomic::AtomicBool) {
        tracing::warn!(error = %e, "cannot open the database");
        if e.is_transient() && !announced.swap(true, Ordering::SeqCst) {
            let _ = self.events.send(Event::DatabaseOffline { error: e.to_string() });
        }
        self.status_tx.send_modify(|s| {
            s.db_online = false;
            if e.is_transient() && s.state != MachineState::NeedsAgent && s.state != MachineState::Error {
                s.state = MachineState::Offline;
                s.message = Some(format!("{e}. Retrying."));
            }
        });
    }

    fn set_problem(&self, state: MachineState, message: String) {
        tracing::warn!(state = ?state, "{message}");
        self.status_tx.send_modify(|s| {
            s.state = state;
            s.message = Some(message);
        });
    }
}

/// The one rule for which database, shared with the CLI.
fn resolve(paths: &Paths, service: &str, env_url: Option<&str>) -> Result<DbUrl> {
    devpilot_engine::database::resolve_database_with(paths, service, env_url)
}

/// The tray as its control socket sees it: its machine now (a settings change starts a new
/// one), and its own hand-off, which marks the releases as this app's and publishes the
/// verdict, so `devpilot handoff` is told on the tray as any of its hand-offs is.
struct Tray(std::sync::Weak<Engine>);

impl devpilot_engine::control::Machine for Tray {
    fn handle(&self) -> Option<orchestrator::Handle> {
        self.0.upgrade()?.orchestrator()
    }

    async fn hand_off(&self) -> Option<crate::verdict::HandOffVerdict> {
        self.0.upgrade()?.hand_off(true).await.ok()
    }
}

/// Where agents would run unconfined here, for the tray and the window: none while no agent
/// process runs (none set, or the demo).
pub(crate) fn sandbox_warnings(
    settings: &Settings,
    agent: Option<&AgentSpec>,
) -> Vec<devpilot_engine::orchestrator::confine::Warning> {
    match agent {
        Some(a) if a.is_process() => devpilot_engine::orchestrator::confine::warnings(settings),
        _ => vec![],
    }
}
