//! Start at login: the OS's entry (through the autostart plugin) made to match the setting.

use tauri::{AppHandle, Manager, Runtime};

use crate::state::AppState;

/// Makes the OS's start-at-login entry match the setting. Failures are logged only. A
/// settings file that cannot be read leaves the entry as the user last set it.
pub fn sync<R: Runtime>(app: &AppHandle<R>) {
    match app.state::<AppState>().engine.file_settings() {
        Ok(s) => set_autostart(app, s.autostart),
        Err(e) => tracing::info!(error = %e, "start at login left as it is (the settings file cannot be read)"),
    }
}

/// Turns start-at-login on or off (no-op where the plugin is absent, as in tests).
pub fn set_autostart<R: Runtime>(app: &AppHandle<R>, want: bool) {
    let Some(al) = app.try_state::<tauri_plugin_autostart::AutoLaunchManager>() else {
        return;
    };
    let now = al.is_enabled().unwrap_or(false);
    if now != want {
        let res = if want { al.enable() } else { al.disable() };
        match res {
            Ok(()) => tracing::info!(enabled = want, "start at login updated"),
            Err(e) => tracing::warn!(error = %e, "cannot change start at login"),
        }
    }
}
