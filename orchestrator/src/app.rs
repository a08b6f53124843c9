//! The engine as an app embeds it: one [`Engine`] owns the settings, the database connection
//! and the orchestrator, restarts the orchestrator when settings change, and decides which
//! agent runs jobs. The tray app (and anything else with a UI) talks to this, never to SQL.
//!
//! Which agent:
//! - an agent command (settings, or `DEVPILOT_AGENT`): that command;
//! - none, on the embedded SQLite default: the built-in demo agent, so a new user sees the loop;
//! - none, on PostgreSQL (shared, real jobs): nothing is claimed and the state is
//!   [`MachineState::NeedsAgent`]. Real jobs are never completed by the demo.
//!
//! Environment overrides (for scripts and several profiles): `DEVPILOT_DATABASE_URL`,
//! `DEVPILOT_ORCHESTRATOR`, `DEVPILOT_AGENT` (split like a shell splits words).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use crate::agent::AgentSpec;
use crate::config::{parse_duration, split_command, Paths, SetAside, Settings, SleepAction};
use crate::db::{self, DbUrl, PoolSettings};
use crate::error::{Error, Result};
use crate::orchestrator::{self, BootClock, Event, Handle, RunConfig, StopMode};
use crate::queue::{Counts, JobEvent, JobRow, MachineRow, Queue};
use crate::retry::{self, Budget};
use crate::secrets;

pub mod guide;

/// How long the demo agent takes.
pub const DEMO_DURATION: Duration = Duration::from_secs(4);

/// How long a keychain call may take.
const KEYCHAIN_TIMEOUT: Duration = Duration::from_secs(10);

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
            database_url: crate::seal::env_database_url(),
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

/// The app's status is the machine's: one [`Status`] in one `watch` channel, written by the
/// orchestrator while one runs, and by the engine for what only it knows (names, the database,
/// the agent kind) and while none runs.
pub use crate::orchestrator::{AgentKind, MachineState, Status};

/// One job with everything the detail view shows.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct JobDetail {
    pub job: JobRow,
    pub payload: serde_json::Value,
    pub history: Vec<JobEvent>,
    /// The agent's output: this machine's full local log when it ran the job here, else
    /// the tail its holder stores in the database (live while it runs).
    pub log_tail: String,
    /// Where `log_tail` comes from: `"local"`, or the machine that stored it.
    pub log_from: Option<String>,
    /// Why no online machine can take this queued job, if none can.
    pub unroutable: Option<String>,
}

/// A job as the window's New job form sends it.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct NewJob {
    pub title: String,
    pub prompt: String,
    pub repo: Option<String>,
    /// Comma-separated labels the running machine must have.
    pub labels: String,
    pub priority: i32,
    pub key: Option<String>,
}

/// The fleet view.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Fleet {
    pub machines: Vec<MachineRow>,
    pub running: Vec<JobRow>,
    pub counts: Counts,
}

/// The database part of the settings form. The password never travels back.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
#[serde(default)]
pub struct DbForm {
    /// "embedded" (the SQLite default), "postgres", or "url" (a sqlite:// URL in `url`).
    pub mode: String,
    pub host: String,
    pub port: Option<u16>,
    pub database: String,
    pub user: String,
    pub sslmode: String,
    /// The CA file the server's certificate must chain to (PostgreSQL's `sslrootcert`),
    /// checked with sslmode verify-ca or verify-full. Kept in the URL: a path, not a secret.
    pub sslrootcert: String,
    pub url: String,
}

impl DbForm {
    /// The form for a stored URL.
    pub fn of(url: Option<&str>) -> Self {
        let Some(raw) = url.filter(|u| !u.trim().is_empty()) else {
            return Self { mode: "embedded".into(), ..Self::default() };
        };
        match url::Url::parse(raw) {
            Ok(u) if u.scheme().starts_with("postgres") => Self {
                mode: "postgres".into(),
                host: u.host_str().unwrap_or("").to_string(),
                port: u.port(),
                database: percent_decode(u.path().trim_start_matches('/')),
                user: u.username().to_string(),
                sslmode: query_value(&u, "sslmode"),
                sslrootcert: query_value(&u, "sslrootcert"),
                url: String::new(),
            },
            _ => Self { mode: "url".into(), url: raw.to_string(), ..Self::default() },
        }
    }

    /// The URL to store (never with a password), or `None` for the embedded default.
    pub fn to_url(&self) -> Result<Option<DbUrl>> {
        match self.mode.as_str() {
            "" | "embedded" => Ok(None),
            "url" => {
                let u = DbUrl::parse(&self.url)?;
                if u.password().is_some() {
                    return Err(Error::Invalid(
                        "do not put the password in the URL; type it in the password field and it goes to the keychain"
                            .into(),
                    ));
                }
                Ok(Some(u))
            }
            "postgres" => {
                let host = self.host.trim();
                if host.is_empty() {
                    return Err(Error::Invalid("the database host must not be empty".into()));
                }
                if host.chars().any(|c| c.is_whitespace() || "/@?#".contains(c)) {
                    return Err(Error::Invalid(format!("'{host}' is not a host name")));
                }
                let user = self.user.trim();
                if user.is_empty() {
                    return Err(Error::Invalid("the database user must not be empty".into()));
                }
                let dbname = self.database.trim();
                if dbname.is_empty() {
                    return Err(Error::Invalid("the database name must not be empty".into()));
                }
                let mut u = url::Url::parse(&format!("postgres://{host}"))
                    .map_err(|e| Error::BadUrl(format!("host '{host}': {e}")))?;
                u.set_username(user).map_err(|_| Error::BadUrl("the user name cannot be used".into()))?;
                u.set_port(Some(self.port.unwrap_or(5432)))
                    .map_err(|_| Error::BadUrl("the port cannot be used".into()))?;
                u.path_segments_mut()
                    .map_err(|_| Error::BadUrl("the database name cannot be used".into()))?
                    .push(dbname);
                for (key, value) in self.tls_params()? {
                    u.query_pairs_mut().append_pair(key, &value);
                }
                Ok(Some(DbUrl::parse(u.as_str())?))
            }
            other => Err(Error::Invalid(format!("unknown database mode '{other}'"))),
        }
    }

    /// `sslmode` and `sslrootcert`, checked. A root certificate with no mode means
    /// verify-full; with a mode that does not verify the server it is refused, since it
    /// would be silently unused.
    fn tls_params(&self) -> Result<Vec<(&'static str, String)>> {
        const MODES: [&str; 6] = ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"];
        let cert = self.sslrootcert.trim();
        let mode = match self.sslmode.trim() {
            "" if !cert.is_empty() => "verify-full",
            m => m,
        };
        let mut params = vec![];
        if !mode.is_empty() {
            if !MODES.contains(&mode) {
                return Err(Error::Invalid(format!("sslmode '{mode}' is not one of {}", MODES.join(", "))));
            }
            params.push(("sslmode", mode.to_string()));
        }
        if !cert.is_empty() {
            if !matches!(mode, "verify-ca" | "verify-full") {
                return Err(Error::Invalid(format!(
                    "a root certificate is only checked with sslmode verify-ca or verify-full, not {mode}; choose one of those, or clear the certificate"
                )));
            }
            params.push(("sslrootcert", root_cert_path(cert)?));
        }
        Ok(params)
    }
}

/// The root certificate's full path (a leading `~/` is the home directory): it must be an
/// existing file, since the driver reads it at every connection, from whatever directory.
fn root_cert_path(raw: &str) -> Result<String> {
    let path = crate::worktree::expand_home(raw);
    if !path.is_absolute() {
        return Err(Error::Invalid(format!("give the root certificate's full path, not '{raw}'")));
    }
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => Ok(path.display().to_string()),
        Ok(_) => Err(Error::Invalid(format!("the root certificate {} is not a file", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::Invalid(format!("the root certificate {} does not exist", path.display())))
        }
        Err(e) => Err(Error::Invalid(format!("cannot read the root certificate {}: {e}", path.display()))),
    }
}

fn query_value(u: &url::Url, key: &str) -> String {
    u.query_pairs().find(|(k, _)| k == key).map(|(_, v)| v.into_owned()).unwrap_or_default()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() && s.is_char_boundary(i + 3) {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The background tasks of the current start (connecting, forwarding).
struct Current {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The engine, as the tray embeds it. Cheap to share behind an `Arc`.
pub struct Engine {
    paths: Paths,
    service: String,
    overrides: Overrides,
    demo_duration: Duration,
    /// Every orchestrator's events, across restarts: each one sends into this channel.
    events: broadcast::Sender<Event>,
    /// The one status channel, across restarts.
    status_tx: watch::Sender<Status>,
    /// The queue the window reads (present even when nothing is claimed).
    queue: RwLock<Option<Queue>>,
    handle: RwLock<Option<Handle>>,
    /// Effective settings (file + environment), watched by the parts that follow a setting
    /// live (the tray's keep-awake).
    effective: watch::Sender<Settings>,
    /// A corrupt config file this engine set aside at a start, until the user dismisses it.
    set_aside: watch::Sender<Option<SetAside>>,
    lifecycle: tokio::sync::Mutex<Option<Current>>,
    generation: AtomicU64,
    woke_at: Mutex<Option<Instant>>,
    paused_for_sleep: AtomicBool,
    /// No settings file when this engine was made: the window's first-run guide may show.
    first_run: bool,
}

fn lock_err<T>(_: T) -> Error {
    Error::Invalid("internal state is unavailable".into())
}

impl Engine {
    /// A new engine; nothing runs until [`Engine::start`].
    pub fn new(paths: Paths, service: &str, overrides: Overrides) -> Arc<Self> {
        let (events, _) = broadcast::channel(1024);
        let status_tx = watch::Sender::new(Status::default());
        Arc::new(Self {
            service: service.to_string(),
            overrides,
            demo_duration: DEMO_DURATION,
            events,
            status_tx,
            queue: RwLock::new(None),
            handle: RwLock::new(None),
            effective: watch::Sender::new(Settings::default()),
            set_aside: watch::Sender::new(None),
            lifecycle: tokio::sync::Mutex::new(None),
            generation: AtomicU64::new(0),
            woke_at: Mutex::new(None),
            paused_for_sleep: AtomicBool::new(false),
            // Not a first run either: a user who never saved settings but has run on the
            // embedded default (its database file is there).
            first_run: !paths.config_file().exists() && !paths.default_db().exists(),
            paths,
        })
    }

    /// The same, with a demo agent of another length (tests).
    pub fn with_demo_duration(paths: Paths, service: &str, overrides: Overrides, d: Duration) -> Arc<Self> {
        let mut e = Self::new(paths, service, overrides);
        if let Some(m) = Arc::get_mut(&mut e) {
            m.demo_duration = d;
        }
        e
    }

    pub fn paths(&self) -> &Paths {
        &self.paths
    }

    pub fn service(&self) -> &str {
        &self.service
    }

    pub fn overrides(&self) -> &Overrides {
        &self.overrides
    }

    /// Every orchestrator event, across restarts, plus the engine's own offline/online.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn status(&self) -> Status {
        self.status_tx.borrow().clone()
    }

    pub fn watch_status(&self) -> watch::Receiver<Status> {
        self.status_tx.subscribe()
    }

    /// The settings in force (file + environment).
    pub fn settings(&self) -> Settings {
        self.effective.borrow().clone()
    }

    /// The settings in force, as they change.
    pub fn watch_settings(&self) -> watch::Receiver<Settings> {
        self.effective.subscribe()
    }

    /// The settings file as saved (without the environment's overrides).
    pub fn file_settings(&self) -> Result<Settings> {
        self.paths.load()
    }

    /// The corrupt config file set aside at a start (the window's notice), as it changes.
    pub fn watch_set_aside(&self) -> watch::Receiver<Option<SetAside>> {
        self.set_aside.subscribe()
    }

    pub fn set_aside_config(&self) -> Option<SetAside> {
        self.set_aside.borrow().clone()
    }

    /// The user has read the notice. (The file stays where it was kept.)
    pub fn dismiss_set_aside(&self) {
        self.set_aside.send_replace(None);
    }

    fn queue(&self) -> Result<Queue> {
        self.queue.read().map_err(lock_err)?.clone().ok_or_else(|| {
            let st = self.status();
            Error::Unreachable {
                target: if st.database.is_empty() { "the database".into() } else { st.database },
                reason: st.message.unwrap_or_else(|| "not connected yet".into()),
            }
        })
    }

    fn orchestrator(&self) -> Option<Handle> {
        self.handle.read().ok().and_then(|h| h.clone())
    }

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
        if let Err(e) = crate::queue::validate_orchestrator(&settings.orchestrator_id) {
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
            s.backend = if url.is_sqlite() { "sqlite".into() } else { "postgres".into() };
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
        self.status_tx.send_modify(|s| {
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
    fn with_overrides(&self, mut settings: Settings) -> Settings {
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
    fn agent_for(&self, settings: &Settings, sqlite: bool) -> Result<Option<AgentSpec>> {
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
        let task = tokio::spawn(async move {
            let cfg = match agent.map(|a| run_config(&settings, a, &me.paths)).transpose() {
                Ok(c) => c,
                Err(e) => {
                    me.set_problem(MachineState::Error, e.to_string());
                    return;
                }
            };
            let heartbeat = cfg.as_ref().map(|c| c.heartbeat).unwrap_or(Duration::from_secs(30));
            // One pooled connection on PostgreSQL (plus LISTEN's own): a machine holds at
            // most two. The local SQLite file can afford a second reader for the window.
            let pool = PoolSettings {
                max_connections: if url.is_sqlite() { 2 } else { 1 },
                call_timeout: orchestrator::call_bound(heartbeat),
                ..PoolSettings::default()
            };
            let mut named = url.with_application_name(&format!("devpilot:{}", settings.machine_name()));
            if settings.poll_only {
                named = named.with_pooled();
            }
            let announced = std::sync::atomic::AtomicBool::new(false);
            let open = || async {
                if me.generation.load(Ordering::SeqCst) != gen {
                    return Err(Error::Invalid("superseded by a restart".into()));
                }
                let r = db::open(&named, &pool).await;
                if let Err(e) = &r {
                    me.offline(e, &announced);
                }
                r
            };
            let conn = match retry::transient("opening the database", Budget::CONNECT, open).await {
                // Unprepared until the LISTEN probe proves no pooler is in between.
                Ok(c) => Queue::new(c).pooled(true),
                Err(e) => {
                    if me.generation.load(Ordering::SeqCst) == gen {
                        me.set_problem(MachineState::Error, format!("{e}. Fix the database settings."));
                    }
                    return;
                }
            };
            if me.generation.load(Ordering::SeqCst) != gen {
                return;
            }
            if announced.load(Ordering::SeqCst) {
                let _ = me.events.send(Event::DatabaseOnline);
            }
            if let Ok(mut q) = me.queue.write() {
                *q = Some(conn.clone());
            }
            me.status_tx.send_modify(|s| {
                s.db_online = true;
                if s.state == MachineState::Offline {
                    s.state = MachineState::Starting;
                    s.message = None;
                }
            });
            let Some(cfg) = cfg else { return };
            // Checked under the lock that `shutdown` takes, so a restart can never miss an
            // orchestrator that is starting.
            let Ok(mut slot) = me.handle.write() else { return };
            if me.generation.load(Ordering::SeqCst) != gen {
                return;
            }
            // Pooled mode needs no LISTEN connection: through a pooler it would hear nothing.
            let hints =
                if named.pooled() { None } else { crate::listen::spawn(&named, &settings.orchestrator_id, &conn) };
            let (handle, _join) = orchestrator::spawn_into(
                conn,
                cfg,
                hints,
                me.status_tx.clone(),
                me.events.clone(),
                Arc::new(BootClock),
            );
            *slot = Some(handle);
        });
        current.tasks.push(task);
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

    // ------------------------------------------------------------ user commands

    /// Switches dispatch on or off, and remembers it across restarts.
    pub async fn set_dispatch(&self, on: bool) -> Result<()> {
        let mut file = self.paths.load()?;
        file.dispatch_enabled = on;
        self.paths.save(&file)?;
        self.effective.send_modify(|eff| eff.dispatch_enabled = on);
        if let Some(h) = self.orchestrator() {
            h.set_enabled(on);
        }
        // Show the choice at once; the orchestrator's own snapshot follows.
        self.status_tx.send_modify(|s| s.dispatch_enabled = on);
        Ok(())
    }

    pub fn pause(&self, for_: Option<Duration>) -> Result<()> {
        self.paused_for_sleep.store(false, Ordering::SeqCst);
        self.running_orchestrator()?.pause(for_);
        Ok(())
    }

    pub fn resume(&self) -> Result<()> {
        self.paused_for_sleep.store(false, Ordering::SeqCst);
        self.running_orchestrator()?.resume();
        Ok(())
    }

    /// Releases every claim of this machine now; with `pause`, claims nothing new after.
    pub async fn hand_off(&self, pause: bool) -> Result<Vec<i64>> {
        Ok(self.running_orchestrator()?.hand_off(pause).await)
    }

    fn running_orchestrator(&self) -> Result<Handle> {
        self.orchestrator().ok_or_else(|| {
            let st = self.status();
            Error::Invalid(match st.message {
                Some(m) => format!("dispatch is not running: {m}"),
                None => "dispatch is not running yet".into(),
            })
        })
    }

    /// Enqueues a demo job on this orchestrator and wakes the loop.
    pub async fn enqueue_demo(&self) -> Result<i64> {
        Ok(self.enqueue_demo_keyed(None).await?.id)
    }

    /// Enqueues a demo job with an optional dedupe key: while a job with that key is live,
    /// nothing is added and the answer names the live job.
    pub async fn enqueue_demo_keyed(&self, key: Option<&str>) -> Result<crate::queue::Enqueued> {
        let key = key.map(str::trim).filter(|k| !k.is_empty());
        let s = self.settings();
        let q = self.queue()?;
        let n = q.counts(&s.orchestrator_id).await.map(|c| c.queued + c.running + c.completed + 1).unwrap_or(1);
        let payload = serde_json::json!({
            "title": format!("Demo job {n}"),
            "source": "devpilot-tray",
            "machine": s.machine_name(),
            "note": "The demo agent logs this payload and succeeds after a few seconds.",
        });
        let opts = crate::queue::JobOptions {
            max_attempts: s.max_attempts.max(1),
            key: key.map(str::to_string),
            ..Default::default()
        };
        let added = q.enqueue_keyed(&s.orchestrator_id, &payload, &opts).await?;
        if let Some(h) = self.orchestrator() {
            h.wake();
        }
        Ok(added)
    }

    pub async fn jobs(&self, state: Option<&str>, limit: u32) -> Result<(Vec<JobRow>, Counts)> {
        let s = self.settings();
        let q = self.queue()?;
        let jobs = q.jobs(&s.orchestrator_id, state, limit.clamp(1, 500)).await?;
        let counts = q.counts(&s.orchestrator_id).await?;
        Ok((jobs, counts))
    }

    /// Of `jobs`, the queued ones no online machine can take, with why.
    pub async fn unroutable(&self, jobs: &[JobRow]) -> Result<std::collections::BTreeMap<i64, String>> {
        let waiting: Vec<&JobRow> = jobs
            .iter()
            .filter(|j| j.claimed_at.is_none() && matches!(j.state.as_str(), "queued" | "failed"))
            .filter(|j| j.repo.is_some() || !j.requires.is_empty())
            .collect();
        if waiting.is_empty() {
            return Ok(Default::default());
        }
        let machines = self.queue()?.machines(&self.settings().orchestrator_id).await?;
        Ok(waiting
            .into_iter()
            .filter_map(|j| crate::queue::unroutable(j.repo.as_deref(), &j.requires, &machines).map(|w| (j.id, w)))
            .collect())
    }

    pub async fn fleet(&self) -> Result<Fleet> {
        let s = self.settings();
        let q = self.queue()?;
        Ok(Fleet {
            machines: q.machines(&s.orchestrator_id).await?,
            running: q.running(&s.orchestrator_id).await?,
            counts: q.counts(&s.orchestrator_id).await?,
        })
    }

    pub async fn job_detail(&self, id: i64) -> Result<JobDetail> {
        let q = self.queue()?;
        let (job, payload) = q.job(id).await?.ok_or_else(|| Error::Invalid(format!("there is no job #{id}")))?;
        let history = q.history(id).await?;
        let me = self.settings().machine_name();
        let held_elsewhere = job.state == "running" && job.claimed_by.as_deref() != Some(me.as_str());
        let local = self.log_tail(id, 256 * 1024);
        let (log_tail, log_from) = if !held_elsewhere && !local.is_empty() {
            (local, Some("local".to_string()))
        } else {
            match q.log_tail(id).await? {
                Some(t) => (t.tail, Some(t.machine)),
                // Its holder stores a tail once the agent prints something: until then the
                // log is the holder's, and empty, so the window keeps following it.
                None if held_elsewhere => (String::new(), job.claimed_by.clone()),
                None => (local, None),
            }
        };
        let unroutable = if job.claimed_at.is_none() && matches!(job.state.as_str(), "queued" | "failed") {
            crate::queue::unroutable(job.repo.as_deref(), &job.requires, &q.machines(&job.orchestrator_id).await?)
        } else {
            None
        };
        Ok(JobDetail { job, payload, history, log_tail, log_from, unroutable })
    }

    /// Enqueues a job from the New job form and wakes the loop.
    pub async fn enqueue_job(&self, form: NewJob) -> Result<crate::queue::Enqueued> {
        let title = form.title.trim();
        if title.is_empty() {
            return Err(Error::Invalid("a job needs a title".into()));
        }
        let spec = crate::spec::JobSpec {
            title: Some(title.to_string()),
            prompt: Some(form.prompt.trim().to_string()).filter(|p| !p.is_empty()),
            repo: form.repo.map(|r| r.trim().to_string()).filter(|r| !r.is_empty()),
            requires: crate::spec::parse_labels(&form.labels)?,
            ..Default::default()
        };
        let s = self.settings();
        let key = form.key.map(|k| k.trim().to_string()).filter(|k| !k.is_empty());
        if let Some(k) = &key {
            crate::queue::validate_key(k)?;
        }
        let opts = crate::queue::JobOptions {
            max_attempts: s.max_attempts.max(1),
            key,
            priority: form.priority,
            ..Default::default()
        };
        let added = self.queue()?.enqueue_keyed(&s.orchestrator_id, &spec.to_payload(), &opts).await?;
        if let Some(h) = self.orchestrator() {
            h.wake();
        }
        Ok(added)
    }

    /// The repos this machine has configured, by name.
    pub fn repos(&self) -> Vec<(String, crate::worktree::RepoSettings)> {
        self.settings().repos.into_iter().collect()
    }

    /// Adds (or replaces) a repo in the settings, after checking it is a git clone.
    pub async fn add_repo(self: &Arc<Self>, name: &str, path: &str) -> Result<()> {
        let name = name.trim();
        let repo = crate::worktree::Repo::from_settings(
            name,
            &crate::worktree::RepoSettings { path: path.trim().into(), ..Default::default() },
        )?;
        if !repo.path.join(".git").exists() {
            return Err(Error::Invalid(format!("{} is not a git clone (no .git in it)", repo.path.display())));
        }
        let old = self.file_settings()?;
        let mut new = old.clone();
        let entry = new.repos.entry(name.to_string()).or_default();
        entry.path = path.trim().to_string();
        self.paths.save(&new)?;
        self.apply(&old, new, false).await
    }

    /// The last `max` bytes of this machine's agent log for job `id` (empty if none).
    pub fn log_tail(&self, id: i64, max: u64) -> String {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.job_log(id);
        let Ok(mut f) = std::fs::File::open(&path) else { return String::new() };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
        let mut buf = vec![];
        let _ = f.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }

    pub fn job_log(&self, id: i64) -> PathBuf {
        self.paths.job_log_dir().join(format!("job-{id}.log"))
    }

    pub async fn requeue(&self, id: i64) -> Result<bool> {
        let by = self.settings().machine_name();
        self.queue()?.requeue(id, &by).await
    }

    /// Cancels a job from this machine, wherever it runs. `None`: it was finished already.
    /// When this machine holds it, its leases are renewed at once, so the agent stops now
    /// rather than at the next heartbeat (SQLite has no NOTIFY to say so).
    pub async fn cancel(&self, id: i64) -> Result<Option<crate::queue::CancelOutcome>> {
        let by = self.settings().machine_name();
        let outcome = self.queue()?.cancel(id, &by).await?;
        if let Some(crate::queue::CancelOutcome::Requested { holder: Some(h) }) = &outcome {
            if *h == by {
                if let Some(o) = self.orchestrator() {
                    tokio::spawn(async move { o.recheck_leases().await });
                }
            }
        }
        Ok(outcome)
    }

    // ------------------------------------------------------------ settings

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
        self.paths.save(&new)?;
        self.apply(&old, new, new_login).await
    }

    /// Applies saved settings as a delta. Only a change of database (or its password),
    /// orchestrator, machine name or LISTEN restarts the engine (handing off what runs);
    /// everything else applies live and running agents keep running.
    async fn apply(self: &Arc<Self>, old: &Settings, new: Settings, new_login: bool) -> Result<()> {
        let (old, new) = (self.with_overrides(old.clone()), self.with_overrides(new));
        let identity =
            |s: &Settings| (s.database_url.clone(), s.orchestrator_id.clone(), s.machine_name(), s.poll_only);
        let agent = self.agent_for(&new, self.status().backend == "sqlite")?;
        // No orchestrator runs (no agent on a shared queue, or an error at start), or the
        // agent was removed on a shared queue, or who or where changed: start anew.
        let live = self.orchestrator().filter(|_| !new_login && identity(&old) == identity(&new));
        let (Some(handle), Some(agent)) = (live, agent) else {
            self.start().await;
            return Ok(());
        };
        handle.reconfigure(run_config(&new, agent.clone(), &self.paths)?);
        self.status_tx.send_modify(|s| {
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
    async fn connect_with(&self, url: &DbUrl, password: Option<&str>) -> Result<(DbUrl, sea_orm::DatabaseConnection)> {
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

    // ------------------------------------------------------------ sleep

    /// Before the machine sleeps: hand off (default) or pause, as the user chose.
    /// Returns the ids handed off.
    pub async fn prepare_for_sleep(&self) -> Vec<i64> {
        let Some(h) = self.orchestrator() else { return vec![] };
        let st = h.status();
        if st.paused || !st.dispatch_enabled {
            // Already not claiming: only release what runs, if the user wants hand-off.
            if self.settings().sleep_action == SleepAction::HandOff && !st.running.is_empty() {
                return h.hand_off(false).await;
            }
            return vec![];
        }
        self.paused_for_sleep.store(true, Ordering::SeqCst);
        match self.settings().sleep_action {
            SleepAction::HandOff => h.hand_off(true).await,
            SleepAction::Pause => {
                h.pause(None);
                vec![]
            }
        }
    }

    /// After a wake: re-check every lease first, then resume what sleep paused.
    /// Returns the ids whose lease was lost while asleep.
    pub async fn woke(&self) -> Vec<i64> {
        if let Ok(mut w) = self.woke_at.lock() {
            *w = Some(Instant::now());
        }
        let Some(h) = self.orchestrator() else { return vec![] };
        let lost = h.recheck_leases().await;
        if self.paused_for_sleep.swap(false, Ordering::SeqCst) {
            h.resume();
        }
        lost
    }

    /// Time since the last wake from sleep, if there was one.
    pub fn since_wake(&self) -> Option<Duration> {
        self.woke_at.lock().ok().and_then(|w| w.map(|t| t.elapsed()))
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

/// Runs a blocking keychain call off the async workers, with a time limit: a keychain that
/// waits for an unlock prompt nobody answers must not hang the app.
async fn keychain<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    match tokio::time::timeout(KEYCHAIN_TIMEOUT, tokio::task::spawn_blocking(f)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(Error::Keychain(format!("the keychain call failed: {e}"))),
        Err(_) => Err(Error::Keychain(format!(
            "the keychain did not answer within {}s; it may be locked and waiting for a password prompt: unlock it, then try again",
            KEYCHAIN_TIMEOUT.as_secs()
        ))),
    }
}

/// The one rule for which database, shared with the CLI.
fn resolve(paths: &Paths, service: &str, env_url: Option<&str>) -> Result<DbUrl> {
    crate::cli::resolve_database_with(paths, service, env_url)
}

fn run_config(s: &Settings, agent: AgentSpec, paths: &Paths) -> Result<RunConfig> {
    let mut cfg = RunConfig::new(&s.orchestrator_id, &s.machine_name(), agent, paths.data_dir.clone());
    cfg.concurrency = s.concurrency.max(1);
    cfg.claim_timeout = parse_duration(&s.claim_timeout)?;
    cfg.heartbeat = parse_duration(&s.heartbeat)?;
    cfg.poll_interval = parse_duration(&s.poll_interval)?;
    cfg.max_poll_interval = parse_duration(&s.max_poll_interval)?.max(cfg.poll_interval);
    cfg.start_enabled = s.dispatch_enabled;
    cfg.backoff = s.backoff()?;
    cfg.retention = s.retention()?;
    cfg.log_dir = paths.job_log_dir();
    cfg.repos = s.repos()?;
    cfg.labels = s.labels.clone();
    cfg.watchdog = s.watchdog()?;
    cfg.push_bound = parse_duration(&s.handoff_push_timeout)?;
    cfg.pass_env = s.pass_env.clone();
    cfg.check()?;
    Ok(cfg)
}

/// Splits an agent command line (re-exported for the UI's validation).
pub fn check_agent_line(line: &str) -> Result<Vec<String>> {
    split_command(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(dir: &std::path::Path) -> Paths {
        Paths { config_dir: dir.join("config"), data_dir: dir.join("data"), log_dir: dir.join("data").join("logs") }
    }

    async fn wait_for<F: Fn(&Status) -> bool>(e: &Engine, what: &str, f: F) -> Status {
        let mut rx = e.watch_status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = rx.borrow_and_update().clone();
            if f(&s) {
                return s;
            }
            if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
                panic!("timed out waiting for {what}; last status {s:?}");
            }
        }
    }

    async fn wait_event<F: Fn(&Event) -> bool>(rx: &mut broadcast::Receiver<Event>, f: F) -> Event {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Ok(ev)) if f(&ev) => return ev,
                Ok(Ok(_)) => {}
                other => panic!("no matching event: {other:?}"),
            }
        }
    }

    fn fast(p: &Paths) {
        let s = Settings {
            poll_interval: "200ms".into(),
            max_poll_interval: "1s".into(),
            orchestrator_id: "unit".into(),
            ..Settings::default()
        };
        p.save(&s).unwrap();
    }

    /// With no agent on the embedded SQLite default, the demo agent runs a demo job to the end,
    /// and its log and history are readable.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn demo_job_runs_on_the_sqlite_default() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        fast(&p);
        let e =
            Engine::with_demo_duration(p.clone(), "devpilot-test", Overrides::default(), Duration::from_millis(300));
        let mut ev = e.subscribe();
        e.start().await;
        let st = wait_for(&e, "idle", |s| s.state == MachineState::Idle).await;
        assert_eq!(st.agent, AgentKind::Demo);
        assert_eq!(st.backend, "sqlite");
        assert!(p.default_db().exists(), "the embedded database is created on first use");
        let id = e.enqueue_demo().await.unwrap();
        wait_event(&mut ev, |x| matches!(x, Event::Claimed { job } if job.id == id)).await;
        wait_event(&mut ev, |x| matches!(x, Event::Completed { job, .. } if job.id == id)).await;
        let d = e.job_detail(id).await.unwrap();
        assert_eq!(d.job.state, "completed");
        assert!(d.log_tail.contains("demo agent: done"), "{}", d.log_tail);
        assert!(d.history.iter().any(|h| h.kind == "claimed"));
        assert_eq!(d.payload["source"], "devpilot-tray");
        e.stop(StopMode::HandOff).await;
    }

    /// Dispatch off claims nothing (the loop polled after the job was enqueued, and rested
    /// without claiming) and is remembered in the config file: a fresh engine on the same
    /// files starts off, claims once switched on, and a third one starts on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dispatch_toggle_persists_and_gates_claims() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        fast(&p);
        let engine =
            || Engine::with_demo_duration(p.clone(), "devpilot-test", Overrides::default(), Duration::from_millis(100));
        let e = engine();
        e.start().await;
        wait_for(&e, "idle", |s| s.state == MachineState::Idle).await;
        e.set_dispatch(false).await.unwrap();
        wait_for(&e, "off", |s| s.state == MachineState::Off).await;
        assert!(!p.load().unwrap().dispatch_enabled);
        let h = e.orchestrator().unwrap();
        let polls = h.stats().polls.load(Ordering::SeqCst);
        // The enqueue wakes the loop, which polls while off. A poll that claimed would leave it
        // polling again within a second (the idle ceiling); an off machine rests until its
        // next presence write, 30 s away.
        let id = e.enqueue_demo().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while h.stats().polls.load(Ordering::SeqCst) == polls
            || h.next_poll().await.is_none_or(|d| d <= Duration::from_secs(10))
        {
            assert!(Instant::now() < deadline, "the loop polled after the enqueue and rested, claiming nothing");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(e.job_detail(id).await.unwrap().job.state, "queued");
        e.stop(StopMode::HandOff).await;
        drop(e);

        // A new engine (as after a restart of the app) reads it from the file: off.
        let e = engine();
        e.start().await;
        let st = wait_for(&e, "off after restart", |s| s.state == MachineState::Off).await;
        assert!(!st.dispatch_enabled);
        e.set_dispatch(true).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        while e.job_detail(id).await.unwrap().job.state != "completed" {
            assert!(Instant::now() < deadline, "job was not run after dispatch was switched on");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(p.load().unwrap().dispatch_enabled);
        e.stop(StopMode::HandOff).await;
        drop(e);

        // And on is remembered too.
        let e = engine();
        e.start().await;
        let st = wait_for(&e, "idle after the second restart", |s| s.state == MachineState::Idle).await;
        assert!(st.dispatch_enabled);
        e.stop(StopMode::HandOff).await;
    }

    /// On PostgreSQL with no agent, nothing is claimed and the state says what to do. (The
    /// host is unreachable here; the agent decision comes first and does not need it.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_without_agent_needs_agent() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        let o = Overrides { database_url: Some("postgres://u@127.0.0.1:1/db".into()), ..Overrides::default() };
        let e = Engine::new(p, "devpilot-test", o);
        e.start().await;
        let st = wait_for(&e, "needs_agent", |s| s.state == MachineState::NeedsAgent).await;
        assert_eq!(st.agent, AgentKind::None);
        assert!(st.message.unwrap().contains("agent command"));
        assert!(e.hand_off(true).await.is_err(), "no orchestrator runs, so there is nothing to hand off");
        e.stop(StopMode::HandOff).await;
    }

    /// Environment overrides win over the file, and an agent that does not exist is an error
    /// state, not a crash.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn overrides_and_missing_agent() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        fast(&p);
        let db = dir.path().join("other.sqlite");
        let o = Overrides {
            database_url: Some(format!("sqlite://{}", db.display())),
            orchestrator: Some("from-env".into()),
            agent: Some("/nonexistent/agent --flag 'two words'".into()),
        };
        let e = Engine::new(p, "devpilot-test", o);
        e.start().await;
        let st = wait_for(&e, "error", |s| s.state == MachineState::Error).await;
        assert_eq!(st.orchestrator_id, "from-env");
        assert!(st.message.unwrap().contains("/nonexistent/agent"));
        assert_eq!(st.overrides.len(), 3);
        // The window can still read the queue: the engine connects anyway.
        let deadline = Instant::now() + Duration::from_secs(10);
        while e.jobs(None, 10).await.is_err() {
            assert!(Instant::now() < deadline, "the queue never became readable");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(db.exists());
        e.stop(StopMode::HandOff).await;
    }

    /// Bad settings are refused with a clear message and nothing is saved; an unreachable
    /// database is reported as such before anything is saved.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_settings_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        fast(&p);
        let before = std::fs::read_to_string(p.config_file()).unwrap();
        let e = Engine::new(p.clone(), "devpilot-test", Overrides::default());
        let mut s = p.load().unwrap();
        s.orchestrator_id = "  ".into();
        let err = e.apply_settings(s, &DbForm::of(None), None).await.unwrap_err();
        assert!(err.to_string().contains("orchestrator id"), "{err}");
        let s = p.load().unwrap();
        let form = DbForm {
            mode: "postgres".into(),
            host: "127.0.0.1".into(),
            port: Some(1),
            database: "d".into(),
            user: "u".into(),
            ..DbForm::default()
        };
        let err = e.apply_settings(s.clone(), &form, Some("pw-not-stored".into())).await.unwrap_err();
        assert_eq!(err.kind(), "unreachable", "{err}");
        assert!(err.to_string().contains("127.0.0.1:1/d"), "{err}");
        assert!(!err.to_string().contains("pw-not-stored"));
        let form = DbForm { host: "".into(), ..form };
        assert!(e.apply_settings(s, &form, None).await.unwrap_err().to_string().contains("host"));
        assert_eq!(std::fs::read_to_string(p.config_file()).unwrap(), before);
    }

    /// An agent script that records its pid and whether it was stopped.
    fn long_agent(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let script = dir.join(name);
        let text = format!(
            "#!/bin/sh\necho \"start $DEVPILOT_JOB_ID {name}\" >> {rec}\ntrap 'echo \"term $DEVPILOT_JOB_ID\" >> {rec}; exit 143' TERM\nsleep 60 & wait\n",
            rec = dir.join("agent.log").display()
        );
        std::fs::write(&script, text).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script
    }

    /// Every live setting, changed while an agent runs, applies without stopping it:
    /// concurrency (proven by more jobs running at once), the lease timings, the poll
    /// intervals, notifications, attempts and the agent command. A change of orchestrator,
    /// by contrast, restarts the engine and hands the agent off (so the check can fail).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn live_settings_leave_running_agents_alone() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        fast(&p);
        let mut s = p.load().unwrap();
        s.agent = Some(long_agent(dir.path(), "agent-a.sh").display().to_string());
        p.save(&s).unwrap();
        let e = Engine::new(p.clone(), "devpilot-test", Overrides::default());
        e.start().await;
        wait_for(&e, "idle", |s| s.state == MachineState::Idle).await;
        let id = e.enqueue_demo().await.unwrap();
        let st = wait_for(&e, "working", |s| s.running.iter().any(|r| r.job.id == id)).await;
        let token = st.running[0].job.token;
        let log = dir.path().join("agent.log");
        type Change = (&'static str, fn(&mut Settings));
        let changes: Vec<Change> = vec![
            ("concurrency", |s| s.concurrency = 3),
            ("claim timeout", |s| s.claim_timeout = "20m".into()),
            ("heartbeat", |s| s.heartbeat = "5s".into()),
            ("poll interval", |s| s.poll_interval = "300ms".into()),
            ("idle ceiling", |s| s.max_poll_interval = "2s".into()),
            ("notifications", |s| s.notify.completed = false),
            ("attempts", |s| s.max_attempts = 5),
            ("sleep action", |s| s.sleep_action = SleepAction::Pause),
            ("agent", |s| s.agent = Some(s.agent.clone().unwrap().replace("agent-a.sh", "agent-b.sh"))),
        ];
        long_agent(dir.path(), "agent-b.sh");
        for (what, change) in changes {
            let mut s = p.load().unwrap();
            change(&mut s);
            e.apply_settings(s, &DbForm::of(None), None).await.unwrap_or_else(|err| panic!("{what}: {err}"));
            let st = e.status();
            assert!(st.running.iter().any(|r| r.job.id == id && r.job.token == token), "{what}: {st:?}");
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(!text.contains("term"), "{what} stopped the agent: {text}");
        }
        assert_eq!(e.settings().concurrency, 3);
        let more = [e.enqueue_demo().await.unwrap(), e.enqueue_demo().await.unwrap()];
        wait_for(&e, "three at once", |s| s.running.len() == 3).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        let started =
            |m: i64| std::fs::read_to_string(&log).unwrap_or_default().contains(&format!("start {m} agent-b.sh"));
        while !more.iter().all(|m| started(*m)) {
            assert!(Instant::now() < deadline, "the new agent (b) ran both new jobs");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut s = p.load().unwrap();
        s.orchestrator_id = "elsewhere".into();
        e.apply_settings(s, &DbForm::of(None), None).await.unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains(&format!("term {id}")), "a new orchestrator hands the running job off: {text}");
        e.stop(StopMode::HandOff).await;
    }

    /// A config file that cannot be parsed is kept aside, the engine runs on the defaults and
    /// remembers it for the window; a later save writes a new file and leaves the kept one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn corrupt_config_is_kept_aside_and_the_engine_starts() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        std::fs::create_dir_all(&p.config_dir).unwrap();
        std::fs::write(p.config_file(), "orchestrator_id = [unterminated").unwrap();
        let e =
            Engine::with_demo_duration(p.clone(), "devpilot-test", Overrides::default(), Duration::from_millis(100));
        let mut notice = e.watch_set_aside();
        e.start().await;
        let st = wait_for(&e, "idle on defaults", |s| s.state == MachineState::Idle).await;
        assert_eq!(st.orchestrator_id, Settings::default().orchestrator_id);
        let kept = e.set_aside_config().expect("the engine remembers what it set aside");
        assert!(notice.has_changed().unwrap(), "watchers learn of it");
        assert!(notice.borrow_and_update().is_some());
        assert!(kept.kept_as.contains("config.toml.bad-"), "{kept:?}");
        assert_eq!(std::fs::read_to_string(&kept.kept_as).unwrap(), "orchestrator_id = [unterminated");
        e.set_dispatch(false).await.unwrap();
        assert!(!p.load().unwrap().dispatch_enabled, "a new file is written");
        assert_eq!(std::fs::read_to_string(&kept.kept_as).unwrap(), "orchestrator_id = [unterminated");
        // A restart finds the good file: nothing new is set aside, and the notice stays until dismissed.
        e.start().await;
        wait_for(&e, "off after restart", |s| s.state == MachineState::Off).await;
        assert_eq!(e.set_aside_config(), Some(kept));
        e.dismiss_set_aside();
        assert_eq!(e.set_aside_config(), None);
        let kept_files = std::fs::read_dir(&p.config_dir)
            .unwrap()
            .filter(|f| f.as_ref().unwrap().file_name().to_string_lossy().contains(".bad-"));
        assert_eq!(kept_files.count(), 1);
        e.stop(StopMode::HandOff).await;
    }

    /// The database form builds a URL without a password and reads one back.
    #[test]
    fn db_form_round_trip() {
        let f = DbForm {
            mode: "postgres".into(),
            host: "db.example".into(),
            port: Some(6543),
            database: "dev pilot".into(),
            user: "alice".into(),
            sslmode: "require".into(),
            sslrootcert: String::new(),
            url: String::new(),
        };
        let u = f.to_url().unwrap().unwrap();
        assert_eq!(u.target(), "db.example:6543/dev%20pilot");
        assert_eq!(DbForm::of(Some(&u.to_string())), f.clone());
        let bad = DbForm { sslmode: "maybe".into(), ..f };
        assert!(bad.to_url().unwrap_err().to_string().contains("sslmode"));
        assert_eq!(DbForm::of(None).mode, "embedded");
    }

    /// A root certificate goes into the URL as `sslrootcert` (with a verifying sslmode), and
    /// comes back in the form; a missing file, a relative path or a mode that would not use
    /// it are refused, each with its reason.
    #[test]
    fn db_form_root_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("root ca.crt");
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").unwrap();
        let f = DbForm {
            mode: "postgres".into(),
            host: "db.example".into(),
            database: "devpilot".into(),
            user: "alice".into(),
            sslmode: "verify-full".into(),
            sslrootcert: ca.display().to_string(),
            ..DbForm::default()
        };
        let u = f.to_url().unwrap().unwrap();
        assert!(u.to_string().contains("sslmode=verify-full&sslrootcert="), "{u}");
        assert_eq!(u.password(), None);
        assert_eq!(DbForm::of(Some(&u.to_string())), DbForm { port: Some(5432), ..f.clone() });
        let no_mode = DbForm { sslmode: String::new(), ..f.clone() };
        assert_eq!(DbForm::of(Some(&no_mode.to_url().unwrap().unwrap().to_string())).sslmode, "verify-full");
        let err = |g: DbForm| g.to_url().unwrap_err().to_string();
        let missing = dir.path().join("nope.crt").display().to_string();
        assert_eq!(
            err(DbForm { sslrootcert: missing.clone(), ..f.clone() }),
            format!("the root certificate {missing} does not exist")
        );
        assert!(err(DbForm { sslrootcert: "ca.crt".into(), ..f.clone() }).contains("full path"));
        assert!(err(DbForm { sslrootcert: dir.path().display().to_string(), ..f.clone() }).contains("not a file"));
        assert!(err(DbForm { sslmode: "require".into(), ..f }).contains("verify-ca or verify-full"));
    }
}
