//! What the engine says, passed on: its status to the tray and the window, its job events
//! a config file set aside to the window, and each hand-off's verdict to the window, the
//! tray's menu and a notification.

use tauri::{AppHandle, Emitter, Manager, Runtime};

use crate::state::AppState;
use crate::tray;

/// Pushes every status change to the tray and to the window (if open).
pub fn spawn_status_forwarder<R: Runtime>(app: &AppHandle<R>) {
    let app = app.clone();
    let mut rx = app.state::<AppState>().engine.watch_status();
    let mut events = app.state::<AppState>().engine.subscribe();
    let app2 = app.clone();
    tauri::async_runtime::spawn(async move {
        loop {
            let st = rx.borrow_and_update().clone();
            tray::refresh(&app, &st);
            let _ = app.emit("status", &st);
            if rx.changed().await.is_err() {
                break;
            }
            // Calm: a burst of changes (jobs failing fast) becomes one update. Rebuilding the
            // tray menu many times a second also upsets some tray hosts.
            tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        }
    });
    // Job events reach the window so it refreshes lists only when something happened.
    tauri::async_runtime::spawn(async move {
        loop {
            match events.recv().await {
                Ok(ev) => {
                    let _ = app2.emit("engine-event", &ev);
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => break,
            }
        }
    });
}

/// A config file set aside at a start: the window (if open) shows, or drops, its notice.
pub fn spawn_set_aside_forwarder<R: Runtime>(app: &AppHandle<R>) {
    let app = app.clone();
    let mut set_aside = app.state::<AppState>().engine.watch_set_aside();
    tauri::async_runtime::spawn(async move {
        while set_aside.changed().await.is_ok() {
            let now = set_aside.borrow_and_update().clone();
            let _ = app.emit("config-set-aside", &now);
        }
    });
}

/// What became of each edit of the settings file: the window says it (and reloads Settings);
/// the tray's menu follows the status as always.
pub fn spawn_config_note_forwarder<R: Runtime>(app: &AppHandle<R>) {
    let app = app.clone();
    let mut notes = app.state::<AppState>().engine.watch_config_note();
    tauri::async_runtime::spawn(async move {
        while notes.changed().await.is_ok() {
            let now = notes.borrow_and_update().clone();
            let _ = app.emit("config-note", &now);
        }
    });
}

/// Each hand-off's verdict (the window's, the tray's, the sleep hook's): a notification, the
/// tray's menu line and the window's notice. A cleared verdict (claiming resumed) takes the
/// line and the notice away.
pub fn spawn_hand_off_forwarder<R: Runtime>(app: &AppHandle<R>) {
    let app = app.clone();
    let mut verdicts = app.state::<AppState>().engine.watch_hand_off();
    tauri::async_runtime::spawn(async move {
        while verdicts.changed().await.is_ok() {
            let now = verdicts.borrow_and_update().clone();
            let state = app.state::<AppState>();
            if let Some(v) = &now {
                state.notifier.hand_off(v);
            }
            tray::refresh_now(&app);
            let _ = app.emit("hand-off", &now);
        }
    });
}
