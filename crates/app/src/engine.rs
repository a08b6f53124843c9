//! The [`Engine`] itself: its state, its constructors and its read-only accessors. What it
//! does lives in the sibling modules (`lifecycle`, `jobs`, `configure`, `sleep`, `guide`),
//! each adding an `impl Engine` block.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::config::{Paths, SetAside};
use devpilot_engine::orchestrator::{Event, Handle, RunConfig, Status};
use devpilot_engine::settings::Settings;
use devpilot_store::error::{Error, Result};
use devpilot_store::queue::Queue;

use crate::overrides::Overrides;

/// How long the demo agent takes.
pub const DEMO_DURATION: Duration = Duration::from_secs(4);

/// The background tasks of the current start (connecting, forwarding).
pub(crate) struct Current {
    pub(crate) tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The engine, as the tray embeds it. Cheap to share behind an `Arc`.
pub struct Engine {
    pub(crate) paths: Paths,
    pub(crate) service: String,
    pub(crate) overrides: Overrides,
    pub(crate) demo_duration: Duration,
    /// Every orchestrator's events, across restarts: each one sends into this channel.
    pub(crate) events: broadcast::Sender<Event>,
    /// The one status channel, across restarts.
    pub(crate) status_tx: watch::Sender<Status>,
    /// The queue the window reads (present even when nothing is claimed).
    pub(crate) queue: RwLock<Option<Queue>>,
    pub(crate) handle: RwLock<Option<Handle>>,
    /// Effective settings (file + environment), watched by the parts that follow a setting
    /// live (the tray's keep-awake).
    pub(crate) effective: watch::Sender<Settings>,
    /// A corrupt config file this engine set aside at a start, until the user dismisses it.
    pub(crate) set_aside: watch::Sender<Option<SetAside>>,
    /// The settings file as this app last wrote it (the watch skips its own writes).
    pub(crate) written: Mutex<Option<Settings>>,
    /// What became of the last edit of the settings file (by hand or by the CLI).
    pub(crate) config_note: watch::Sender<Option<crate::verdict::ConfigNote>>,
    /// The last hand-off's verdict, until claiming resumes.
    pub(crate) hand_off_tx: watch::Sender<Option<crate::verdict::HandOffVerdict>>,
    pub(crate) lifecycle: tokio::sync::Mutex<Option<Current>>,
    pub(crate) generation: AtomicU64,
    pub(crate) woke_at: Mutex<Option<Instant>>,
    pub(crate) paused_for_sleep: AtomicBool,
    /// A hand-off of this app is under way (its releases are its own verdict's).
    pub(crate) handing_off: AtomicBool,
    /// The jobs this app's hand-offs released lately, and when.
    pub(crate) own_releases: Mutex<std::collections::HashMap<i64, std::time::Instant>>,
    /// No settings file when this engine was made: the window's first-run guide may show.
    pub(crate) first_run: bool,
    /// The control socket served now (`devpilot pause`, `resume`, `handoff`), and its stop.
    pub(crate) control: Mutex<Option<(std::path::PathBuf, devpilot_engine::control::CancellationToken)>>,
    /// This engine, for the control socket's requests (which must not keep it alive).
    pub(crate) me: std::sync::Weak<Engine>,
}

fn lock_err<T>(_: T) -> Error {
    Error::Invalid("internal state is unavailable".into())
}

impl Engine {
    /// A new engine; nothing runs until [`Engine::start`].
    pub fn new(paths: Paths, service: &str, overrides: Overrides) -> Arc<Self> {
        let (events, _) = broadcast::channel(1024);
        let status_tx = watch::Sender::new(Status::default());
        Arc::new_cyclic(|me| Self {
            control: Mutex::new(None),
            me: me.clone(),
            service: service.to_string(),
            overrides,
            demo_duration: DEMO_DURATION,
            events,
            status_tx,
            queue: RwLock::new(None),
            handle: RwLock::new(None),
            effective: watch::Sender::new(Settings::default()),
            set_aside: watch::Sender::new(None),
            written: Mutex::new(None),
            config_note: watch::Sender::new(None),
            hand_off_tx: watch::Sender::new(None),
            lifecycle: tokio::sync::Mutex::new(None),
            generation: AtomicU64::new(0),
            woke_at: Mutex::new(None),
            paused_for_sleep: AtomicBool::new(false),
            handing_off: AtomicBool::new(false),
            own_releases: Mutex::default(),
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

    pub(crate) fn queue(&self) -> Result<Queue> {
        self.queue.read().map_err(lock_err)?.clone().ok_or_else(|| {
            let st = self.status();
            Error::Unreachable {
                target: if st.database.is_empty() { "the database".into() } else { st.database },
                reason: st.message.unwrap_or_else(|| "not connected yet".into()),
            }
        })
    }

    pub(crate) fn orchestrator(&self) -> Option<Handle> {
        self.handle.read().ok().and_then(|h| h.clone())
    }
}

/// The orchestrator's run configuration for these settings and this agent. Its trackers' keys
/// come from this app's keychain service (`service`), where Settings → Sources stores them.
pub(crate) fn run_config(s: &Settings, agent: AgentSpec, paths: &Paths, service: &str) -> Result<RunConfig> {
    let mut cfg = RunConfig::from_settings(s, agent, &paths.data_dir)?;
    cfg.keys = devpilot_engine::sources::KeyStore::Keychain { service: service.into() };
    Ok(cfg)
}
