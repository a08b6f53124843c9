//! The window follows the desktop's dark or light preference (the XDG desktop portal's
//! `color-scheme`), and costs nothing while it is closed.
//!
//! tao can follow the portal itself (tauri's `dbus` feature), but it does so with a thread
//! that wakes every 5 s for as long as the app lives: a fifth of the idle tray's wake-ups
//! budget, spent for a window that is closed almost all the time. So the feature is off, and
//! this unit does the same work only while a window exists: it reads the preference when the
//! app starts and again when a window is built, then waits on the portal's `SettingChanged`
//! signal (a socket read, no timer) until the window is gone. No portal (a bare window
//! manager, the tests' session) leaves GTK's own theme, as tao did.

use std::sync::Mutex;

use futures_util::StreamExt;
use tauri::{AppHandle, Manager, Runtime, Theme};
use zbus::zvariant::{OwnedValue, Value};

const PORTAL: &str = "org.freedesktop.portal.Desktop";
const PATH: &str = "/org/freedesktop/portal/desktop";
const SETTINGS: &str = "org.freedesktop.portal.Settings";
const NAMESPACE: &str = "org.freedesktop.appearance";
const KEY: &str = "color-scheme";

/// The task following the portal for the open window, if any.
static FOLLOWING: Mutex<Option<tauri::async_runtime::JoinHandle<()>>> = Mutex::new(None);
/// The preference as last read (`None`: none, or not read yet): a window starts with it.
static LAST: Mutex<Option<Theme>> = Mutex::new(None);

/// The portal's `color-scheme` as a window theme: 1 prefers dark, 2 prefers light, and 0 (no
/// preference) or anything else leaves the choice to GTK.
pub fn of_scheme(scheme: u32) -> Option<Theme> {
    match scheme {
        1 => Some(Theme::Dark),
        2 => Some(Theme::Light),
        _ => None,
    }
}

/// What a window about to be built starts with: the preference as last read.
pub fn last() -> Option<Theme> {
    LAST.lock().ok().and_then(|t| *t)
}

/// Reads the preference once in the background (at start), so the first window starts in it.
pub fn warm() {
    tauri::async_runtime::spawn(async {
        if let Ok(bus) = zbus::Connection::session().await {
            remember(read(&bus).await);
        }
    });
}

/// Keeps the window `label` in step with the desktop until it is destroyed ([`stop`]): the
/// preference read again now, then each change the portal signals.
pub fn follow<R: Runtime>(app: &AppHandle<R>, label: &'static str) {
    let app = app.clone();
    let task = tauri::async_runtime::spawn(async move {
        if let Err(e) = changes(&app, label).await {
            tracing::debug!(error = %e, "not following the desktop's dark or light preference");
        }
    });
    if let Some(old) = FOLLOWING.lock().ok().and_then(|mut f| f.replace(task)) {
        old.abort();
    }
}

/// The window is gone: nothing to keep in step, and the bus connection goes with the task.
pub fn stop() {
    if let Some(task) = FOLLOWING.lock().ok().and_then(|mut f| f.take()) {
        task.abort();
    }
}

fn remember(theme: Option<Theme>) {
    if let Ok(mut last) = LAST.lock() {
        *last = theme;
    }
}

/// Sets `theme` on window `label` (always when `first`, else if it changed); `false` when
/// the window is gone. On Linux a theme given to the window's builder is not applied (tao
/// reads only its own portal thread's answer there), so the first read is always set.
fn apply<R: Runtime>(app: &AppHandle<R>, label: &str, theme: Option<Theme>, first: bool) -> bool {
    let before = last();
    remember(theme);
    let Some(window) = app.get_webview_window(label) else { return false };
    if first || theme != before {
        tracing::info!(?theme, "the window follows the desktop's dark or light preference");
        if let Err(e) = window.set_theme(theme) {
            tracing::warn!(error = %e, "cannot change the window's theme");
        }
    }
    true
}

async fn changes<R: Runtime>(app: &AppHandle<R>, label: &str) -> zbus::Result<()> {
    let bus = zbus::Connection::session().await?;
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender(PORTAL)?
        .interface(SETTINGS)?
        .member("SettingChanged")?
        .path(PATH)?
        .build();
    // Subscribed before the read, so a change between the two is not lost.
    let mut signals = zbus::MessageStream::for_match_rule(rule, &bus, None).await?;
    if !apply(app, label, read(&bus).await, true) {
        return Ok(());
    }
    while let Some(msg) = signals.next().await {
        let Ok(msg) = msg else { continue };
        let body = msg.body();
        let Ok((ns, key, value)) = body.deserialize::<(String, String, OwnedValue)>() else { continue };
        if ns == NAMESPACE && key == KEY && !apply(app, label, scheme_of(&value).and_then(of_scheme), false) {
            break;
        }
    }
    Ok(())
}

/// Reads the preference: `ReadOne` (portal version 2), else `Read` (its answer wrapped in one
/// more variant). `None` also when there is no portal.
async fn read(bus: &zbus::Connection) -> Option<Theme> {
    let ask = |method: &'static str| async move {
        let reply = bus.call_method(Some(PORTAL), PATH, Some(SETTINGS), method, &(NAMESPACE, KEY)).await?;
        reply.body().deserialize::<OwnedValue>()
    };
    let value = match ask("ReadOne").await {
        Ok(v) => v,
        Err(_) => ask("Read").await.ok()?,
    };
    scheme_of(&value).and_then(of_scheme)
}

/// The number in a portal answer, however many variants wrap it.
fn scheme_of(v: &Value<'_>) -> Option<u32> {
    match v {
        Value::U32(n) => Some(*n),
        Value::Value(inner) => scheme_of(inner),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The portal's three documented values: dark, light, and no preference (GTK decides).
    #[test]
    fn the_portals_values_are_read_as_the_spec_says() {
        assert_eq!(of_scheme(1), Some(Theme::Dark));
        assert_eq!(of_scheme(2), Some(Theme::Light));
        assert_eq!(of_scheme(0), None);
        assert_eq!(of_scheme(7), None);
    }

    /// `ReadOne` answers the number in a variant, `Read` in a variant in a variant.
    #[test]
    fn the_number_is_found_in_either_answer() {
        assert_eq!(scheme_of(&Value::U32(1)), Some(1));
        assert_eq!(scheme_of(&Value::Value(Box::new(Value::U32(2)))), Some(2));
        assert_eq!(scheme_of(&Value::from("dark")), None);
    }
}
