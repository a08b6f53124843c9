//! What Tauri manages for the whole app: [`AppState`], and in it the tray host's presence
//! ([`TrayHost`]) that [`crate::tray_host`] keeps current.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use devpilot_app::Engine;
use tokio::sync::watch;

use crate::notify::Notifier;

/// Shared state, managed by Tauri.
pub struct AppState {
    pub engine: Arc<Engine>,
    pub notifier: Notifier,
    /// Set once the user chose to quit, so closing the last window is not mistaken for it.
    pub quitting: AtomicBool,
    pub tray_host: TrayHost,
}

impl AppState {
    /// The state around `engine`: its notifier, not quitting, a tray host taken as present.
    pub fn new(engine: Arc<Engine>) -> Self {
        let notifier = Notifier::new(engine.clone());
        Self { engine, notifier, quitting: AtomicBool::new(false), tray_host: TrayHost::default() }
    }
}

/// A second close within this of the first goes through without asking again.
const ASK_AGAIN: Duration = Duration::from_secs(10);

/// Whether a tray host shows the icon, as last seen. Starts as "yes" so nothing asks before
/// the first check has answered.
pub struct TrayHost {
    tx: watch::Sender<bool>,
    /// When closing the window last asked (see [`TrayHost::asked_recently`]).
    asked: std::sync::Mutex<Option<Instant>>,
}

impl Default for TrayHost {
    fn default() -> Self {
        Self { tx: watch::Sender::new(true), asked: std::sync::Mutex::new(None) }
    }
}

impl TrayHost {
    /// Whether a tray host showed the icon at the last check.
    pub fn present(&self) -> bool {
        *self.tx.borrow()
    }

    /// Records what the last check found.
    pub fn set(&self, present: bool) {
        self.tx.send_replace(present);
    }

    /// A close is being asked about now: true when one was asked within [`ASK_AGAIN`]
    /// before (then this one goes through), else it is remembered and false.
    pub fn asked_recently(&self) -> bool {
        let Ok(mut last) = self.asked.lock() else { return false };
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < ASK_AGAIN) {
            *last = None;
            return true;
        }
        *last = Some(now);
        false
    }
}
