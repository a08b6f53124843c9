//! The window: created on demand, destroyed when closed (its WebKit processes go with it, so
//! a tray app that nobody is looking at stays cheap).

use std::path::Path;

use tauri::{AppHandle, Emitter, Manager, Runtime, WebviewUrl, WebviewWindowBuilder};

pub const LABEL: &str = "main";

/// Shows the window (creating it if needed) at `section`: fleet, queue, settings or quit.
pub fn open<R: Runtime>(app: &AppHandle<R>, section: Option<&str>) {
    let section = section.unwrap_or("fleet");
    if let Some(w) = app.get_webview_window(LABEL) {
        let _ = w.unminimize();
        let _ = w.show();
        let _ = w.set_focus();
        let _ = w.emit("navigate", section);
        return;
    }
    let url = WebviewUrl::App(format!("index.html#{section}").into());
    match WebviewWindowBuilder::new(app, LABEL, url)
        .title("DevPilot")
        .inner_size(920.0, 660.0)
        .min_inner_size(640.0, 420.0)
        .build()
    {
        Ok(_) => tracing::info!(section, "window opened"),
        Err(e) => tracing::warn!(error = %e, "cannot open the window"),
    }
}

/// Opens a folder in the file manager.
pub fn reveal(dir: &Path) -> devpilot::Result<()> {
    std::fs::create_dir_all(dir)?;
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else if cfg!(windows) {
        "explorer"
    } else {
        "xdg-open"
    };
    std::process::Command::new(opener)
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| devpilot::Error::Io(format!("cannot run {opener}: {e}; the logs are in {}", dir.display())))?;
    Ok(())
}
