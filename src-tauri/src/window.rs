//! The window: created on demand, destroyed when closed (its WebKit processes go with it, so
//! a tray app that nobody is looking at stays cheap).

use std::path::Path;

use tauri::{AppHandle, Emitter, Manager, Runtime, WebviewUrl, WebviewWindowBuilder, Window, WindowEvent};

pub const LABEL: &str = "main";

/// Before the first webview exists: WebKitGTK's UI-process memory-pressure monitor wakes every
/// 5 s for as long as the app lives (window closed or not) and re-reads /proc/meminfo and the
/// cgroup files byte by byte (measured: about 1,500 read() calls a cycle, its own thread). A
/// tray app with one small page gains nothing from it, so it is off unless the user set the
/// variable. Call while the process is still single-threaded.
pub fn tune_webkit_env() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("WEBKIT_DISABLE_MEMORY_PRESSURE_MONITOR").is_none()
        && std::env::var_os("DEVPILOT_WEBKIT_DEFAULTS").is_none()
    {
        // First thing in `run`, before any other thread exists (set_var is not thread-safe).
        std::env::set_var("WEBKIT_DISABLE_MEMORY_PRESSURE_MONITOR", "1");
    }
}

/// Window events. Closing with no tray host asks first (the window is the only way back in);
/// when the last window is gone, WebKit's network helper ends too.
pub fn on_event<R: Runtime>(window: &Window<R>, event: &WindowEvent) {
    if let WindowEvent::CloseRequested { api, .. } = event {
        let state = window.app_handle().state::<crate::state::AppState>();
        if !state.tray_host.present() && !state.quitting.load(std::sync::atomic::Ordering::SeqCst) {
            // A second close soon after the first goes through (the app keeps running): a
            // page that cannot answer (hung, crashed) must not make the window unclosable.
            if state.tray_host.asked_recently() {
                tracing::info!("closed again while asked: the window closes, the app keeps running in the background");
                return;
            }
            api.prevent_close();
            tracing::info!("close asked with no tray host: asking whether to quit or keep running");
            if let Err(e) = window.emit("navigate", "close") {
                tracing::warn!(error = %e, "cannot ask the page; a second close closes the window");
            }
        }
        return;
    }
    if let WindowEvent::Destroyed = event {
        crate::theme::stop();
        #[cfg(target_os = "linux")]
        {
            let app = window.app_handle().clone();
            tracing::debug!(label = window.label(), "window destroyed");
            // Off the main thread: give WebKit time to end the page's web process first.
            std::thread::spawn(move || {
                for _ in 0..20 {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                    if !app.webview_windows().is_empty() {
                        return; // a window is open again
                    }
                    if end_idle_network_process() {
                        // The page's memory is freed but glibc keeps the pages; hand them back.
                        std::thread::sleep(std::time::Duration::from_secs(1));
                        give_back_freed_memory();
                        if app.webview_windows().is_empty() {
                            page_out_window_stack();
                        }
                        return;
                    }
                }
                tracing::debug!("WebKit's web process is still alive; leaving its network process");
            });
        }
        #[cfg(not(target_os = "linux"))]
        let _ = window;
    }
}

/// WebKitGTK ends a page's WebKitWebProcess with its window, but keeps the
/// WebKitNetworkProcess for as long as the app lives (measured: about 30 MB PSS, closed
/// window or not). With no page left it holds nothing we need (the UI is served from the
/// binary; no cookies, no cache), and WebKit starts a new one when a window opens again. So
/// when no window and no web process is left, ask it to exit (SIGTERM, by pid, only our own
/// child). `DEVPILOT_WEBKIT_DEFAULTS=1` keeps WebKit's defaults (for measuring).
/// Returns false while a web process is still alive (try again later).
#[cfg(target_os = "linux")]
fn end_idle_network_process() -> bool {
    if std::env::var_os("DEVPILOT_WEBKIT_DEFAULTS").is_some() {
        return true;
    }
    let me = std::process::id();
    let mut network = vec![];
    let Ok(dir) = std::fs::read_dir("/proc") else { return true };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // pid (comm) state ppid ...: comm may hold spaces, so parse after the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let comm = &stat[open + 1..close];
        let ppid = stat[close + 1..].split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(me) {
            continue;
        }
        if comm.starts_with("WebKitWebProces") {
            return false; // a page is still alive (or starting): leave WebKit alone
        }
        if comm.starts_with("WebKitNetworkPr") {
            network.push(pid);
        }
    }
    for pid in network {
        match std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status() {
            Ok(s) if s.success() => tracing::info!(pid, "window closed: ended WebKit's idle network process"),
            Ok(s) => tracing::debug!(pid, status = %s, "could not end WebKit's network process"),
            Err(e) => tracing::debug!(pid, error = %e, "could not run kill"),
        }
    }
    true
}

/// Returns the heap that the destroyed window's WebKit and GTK objects freed to the system.
/// glibc keeps freed memory in its arenas for reuse, and a tray app whose window is closed
/// will not reuse it for hours. Measured: under 2 MB of the closed app's PSS (most of what
/// an open/close cycle adds stays live inside WebKitGTK; see bench/TRAY_FOOTPRINT.md).
#[cfg(target_os = "linux")]
fn give_back_freed_memory() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim only walks glibc's own arenas; it is thread-safe.
        let released = unsafe { libc::malloc_trim(0) };
        tracing::debug!(released = released != 0, "window closed: returned freed heap to the system");
    }
}

/// Libraries that only the window uses: the webview (WebKitGTK, JavaScriptCore, ICU, flite for
/// WebKit's speech synthesis, GStreamer) and the GL stack it renders with (Mesa's EGL/GLX, the
/// DRI driver and the LLVM it JIT-compiles shaders with). They stay linked for the app's life.
#[cfg(target_os = "linux")]
const WINDOW_ONLY: &[&str] = &[
    "libwebkit2gtk",
    "libjavascriptcoregtk",
    "libicu",
    "libflite",
    "libgst",
    "libLLVM",
    "/dri/",
    "libEGL",
    "libGLX",
    "libGLESv2",
    "libgbm",
    "libepoxy",
];

/// With no window open, tells the kernel that the window-only libraries' pages can go
/// (MADV_PAGEOUT). Clean file pages are dropped at once and read back from the file (or the
/// page cache) on their next use, which is the next time a window opens; private dirty pages
/// (relocations) would go to swap if there is any and otherwise stay. Nothing changes in the
/// mapping's contents, so this is safe whatever else is running. Measured in
/// bench/TRAY_FOOTPRINT.md: it is most of the gap between a closed window and the
/// < 100 MB target. `DEVPILOT_WEBKIT_DEFAULTS=1` skips it (for measuring).
#[cfg(target_os = "linux")]
fn page_out_window_stack() {
    if std::env::var_os("DEVPILOT_WEBKIT_DEFAULTS").is_some() {
        return;
    }
    let maps = match std::fs::read_to_string("/proc/self/maps") {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!(error = %e, "cannot read /proc/self/maps");
            return;
        }
    };
    let (mut advised, mut bytes, mut failed) = (0u32, 0usize, 0u32);
    for line in maps.lines() {
        // start-end perms offset dev inode path
        let mut f = line.split_whitespace();
        let (Some(range), Some(path)) = (f.next(), f.nth(4)) else { continue };
        if !WINDOW_ONLY.iter().any(|lib| path.contains(lib)) {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16)) else { continue };
        // SAFETY: advice only. MADV_PAGEOUT never changes what a page holds; the next access
        // faults it back in. A range unmapped since we read the maps fails with ENOMEM.
        let rc = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT) };
        if rc == 0 {
            advised += 1;
            bytes += end - start;
        } else {
            failed += 1;
        }
    }
    tracing::info!(
        mappings = advised,
        mapped_mb = bytes / (1 << 20),
        failed,
        "no window open: paged out the window's libraries"
    );
}

/// At a start with no window (autostart at login), the same: the GL stack is initialised with
/// the toolkit even though no page is ever shown.
pub fn page_out_when_idle<R: Runtime>(app: &AppHandle<R>) {
    #[cfg(target_os = "linux")]
    {
        let app = app.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs(15));
            if app.webview_windows().is_empty() {
                page_out_window_stack();
            }
        });
    }
    #[cfg(not(target_os = "linux"))]
    let _ = app;
}

/// Shows the window (creating it if needed) at `section`: fleet, queue, new, settings, quit,
/// or `job-ID` (the queue with that job's detail open).
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
        // Where the builder's theme is honoured; on Linux `theme::follow` sets it.
        .theme(crate::theme::last())
        .build()
    {
        Ok(_) => {
            tracing::info!(section, "window opened");
            crate::theme::follow(app, LABEL);
        }
        Err(e) => tracing::warn!(error = %e, "cannot open the window"),
    }
}

/// Brings the window to the front as it is (no navigation: whatever the user was doing
/// stays), or opens it.
pub fn raise<R: Runtime>(app: &AppHandle<R>) {
    match app.get_webview_window(LABEL) {
        Some(w) => {
            let _ = w.unminimize();
            let _ = w.show();
            let _ = w.set_focus();
        }
        None => open(app, None),
    }
}

/// Closes the window, the app staying up (with no tray host, "keep running in the
/// background": a second launch of devpilot-tray brings the window back).
pub fn close<R: Runtime>(app: &AppHandle<R>) {
    if let Some(w) = app.get_webview_window(LABEL) {
        // destroy, not close: close would ask again.
        match w.destroy() {
            Ok(()) => {
                tracing::info!("window closed; still running in the background (run devpilot-tray again to open it)")
            }
            Err(e) => tracing::warn!(error = %e, "cannot close the window"),
        }
    }
}

/// Opens an http(s) link in the user's browser (one argv element; never a shell).
pub fn open_url(url: &str) -> devpilot_app::Result<()> {
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(devpilot_app::Error::Invalid(format!("not opening '{url}': only http(s) links are opened")));
    }
    let opener = if cfg!(target_os = "macos") { "open" } else { "xdg-open" };
    spawn_opener(opener, url.as_ref()).map_err(|e| devpilot_app::Error::io(format!("cannot run {opener}"), e))
}

/// Opens a folder in the file manager.
pub fn reveal(dir: &Path) -> devpilot_app::Result<()> {
    std::fs::create_dir_all(dir)?;
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else if cfg!(windows) {
        "explorer"
    } else {
        "xdg-open"
    };
    spawn_opener(opener, dir.as_os_str()).map_err(|e| {
        // Where the logs are goes after the error's own words, as the window shows it.
        let e = std::io::Error::new(e.kind(), format!("{e}; the logs are in {}", dir.display()));
        devpilot_app::Error::io(format!("cannot run {opener}"), e)
    })
}

/// Starts the desktop's opener on `arg`, detached from our stdio.
fn spawn_opener(opener: &str, arg: &std::ffi::OsStr) -> std::io::Result<()> {
    std::process::Command::new(opener)
        .arg(arg)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(|_| ())
}
