//! The DevPilot tray app. It embeds the engine ([`devpilot_app::Engine`]) in this process and
//! adds the parts a person sees: the tray icon and its menu, the window, notifications, the
//! sleep hook and start-at-login. Every one of those OS integrations is optional: when one is
//! missing (no tray host, no notification daemon, no logind, no keychain) it is logged and the
//! rest keeps working.
//!
//! - [`commands`]: everything the window may ask for (Tauri commands; the UI has no other way in).
//! - [`tray`]: the icon (five states), the menu and the hover text, kept current from the engine's status.
//! - [`tray_host`]: whether a tray host shows the icon at all; without one the window is the face.
//! - [`tray_text`]: what the tray says (state line, job lines, hover text), as pure functions.
//! - [`notify`]: notifications per event, coalesced, sent off the async worker threads.
//! - [`sleep`]: logind's PrepareForSleep: hand off (or pause) before sleep, re-check after wake.
//! - [`awake`]: with `keep_awake` on, a logind idle-sleep block inhibitor while agents run.
//! - [`logind`]: the logind D-Bus calls both use.
//! - [`window`]: opening the window, and what closing it does.
//! - [`display`]: whether there is a graphical session at all, asked before the toolkit is.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use devpilot_app::config::Paths;
use devpilot_app::orchestrator::StopMode;
use devpilot_app::{Engine, Overrides};
use tauri::{AppHandle, Emitter, Manager, RunEvent, Runtime};

pub mod awake;
pub mod commands;
pub mod display;
pub mod logind;
pub mod notify;
pub mod sleep;
pub mod tray;
pub mod tray_host;
pub mod tray_text;
pub mod window;

/// The profile name: its config, data, logs and keychain entries. Debug builds use their own,
/// so development never touches a user's real profile or credentials.
pub const PROFILE: &str = if cfg!(debug_assertions) { "devpilot-dev" } else { "devpilot" };

/// Shared state, managed by Tauri.
pub struct AppState {
    pub engine: Arc<Engine>,
    pub notifier: notify::Notifier,
    /// Set once the user chose to quit, so closing the last window is not mistaken for it.
    pub quitting: AtomicBool,
    pub tray_host: tray_host::TrayHost,
}

impl AppState {
    pub fn new(engine: Arc<Engine>) -> Self {
        let notifier = notify::Notifier::new(engine.clone());
        Self { engine, notifier, quitting: AtomicBool::new(false), tray_host: tray_host::TrayHost::default() }
    }
}

/// Log to a daily-rotated file under the platform log dir (7 kept), and to stderr.
fn init_logging(paths: &Paths) -> Option<tracing_appender::non_blocking::WorkerGuard> {
    use tracing_subscriber::prelude::*;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("DEVPILOT_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,devpilot=info,devpilot_tray=info"))
    };
    let file = tracing_appender::rolling::Builder::new()
        .rotation(tracing_appender::rolling::Rotation::DAILY)
        .filename_prefix("devpilot-tray")
        .filename_suffix("log")
        .max_log_files(7)
        .build(&paths.log_dir);
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter());
    match file {
        Ok(appender) => {
            let (w, guard) = tracing_appender::non_blocking(appender);
            let layer = tracing_subscriber::fmt::layer().with_ansi(false).with_writer(w).with_filter(filter());
            let _ = tracing_subscriber::registry().with(stderr).with(layer).try_init();
            Some(guard)
        }
        Err(e) => {
            let _ = tracing_subscriber::registry().with(stderr).try_init();
            tracing::warn!(error = %e, dir = %paths.log_dir.display(), "cannot open the log file; logging to stderr only");
            None
        }
    }
}

/// Runs the app until the user quits.
pub fn run() -> std::process::ExitCode {
    // Before any thread: the database URL leaves the environment an agent could read, and
    // the process is not dumpable (see devpilot_app::seal).
    devpilot_app::seal::seal();
    window::tune_webkit_env();
    // Before anything is written or started: with no display there is nothing to show.
    if let Err(why) = display::check() {
        eprintln!("{why}");
        return std::process::ExitCode::FAILURE;
    }
    let paths = match Paths::for_app(PROFILE) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("devpilot-tray: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let _log_guard = init_logging(&paths);
    tracing::info!(profile = PROFILE, config = %paths.config_file().display(), "starting");
    let mut ctx = tauri::generate_context!();
    if cfg!(debug_assertions) {
        // A development build is another app as far as the OS is concerned.
        ctx.config_mut().identifier = "dev.devpilot.tray.dev".into();
    }
    let engine = Engine::new(paths, PROFILE, Overrides::from_env());
    // The first start opens on the guide; --show opens the window whatever else is true.
    let show_at_start = engine.guide().needed || std::env::args().any(|a| a == "--show");
    let built = tauri::Builder::default()
        // First: a second launch only opens the first instance's window.
        .plugin(tauri_plugin_single_instance::init(|app, _argv, _cwd| {
            window::open(app, None);
        }))
        .plugin(tauri_plugin_autostart::init(tauri_plugin_autostart::MacosLauncher::LaunchAgent, None))
        .manage(AppState::new(engine))
        .invoke_handler(commands::handler())
        .on_window_event(window::on_event)
        .setup(move |app| {
            setup(app.handle(), show_at_start);
            Ok(())
        })
        .build(ctx);
    let app = match built {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the app");
            eprintln!("devpilot-tray: cannot start: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    app.run(|app, event| match event {
        // The last window closed: DevPilot lives in the tray.
        RunEvent::ExitRequested { code: None, api, .. } if !app.state::<AppState>().quitting.load(Ordering::SeqCst) => {
            api.prevent_exit();
        }
        RunEvent::Exit => {
            // Whatever ends us, never leave a claim to the sweep when it can be handed off.
            let engine = app.state::<AppState>().engine.clone();
            if !engine.status().running.is_empty() {
                tracing::info!("exiting with running jobs: handing them off");
            }
            tauri::async_runtime::block_on(async move {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(15), engine.stop(StopMode::HandOff)).await;
            });
        }
        _ => {}
    });
    std::process::ExitCode::SUCCESS
}

/// Everything that starts with the app. Generic over the runtime so tests can use the mock.
pub fn setup<R: Runtime>(app: &AppHandle<R>, show_window: bool) {
    let state = app.state::<AppState>();
    let engine = state.engine.clone();
    // Listening first, so nothing the first start says is missed.
    state.notifier.start();
    {
        let engine = engine.clone();
        tauri::async_runtime::spawn(async move { engine.start().await });
    }
    {
        // A finished job's "Open": its result URL in the browser, else the job in the window.
        let app = app.clone();
        state.notifier.set_on_open(std::sync::Arc::new(move |target| match target {
            notify::Open::Url(url) => {
                if let Err(e) = window::open_url(&url) {
                    tracing::warn!(error = %e, "cannot open the job's link");
                }
            }
            notify::Open::Job(id) => window::open(&app, Some(&format!("job-{id}"))),
            notify::Open::Settings => window::open(&app, Some("settings")),
        }));
    }
    tray::install(app);
    // No host to show the icon: the window is the only way in, so it opens.
    let show_window = !tray_host::start(app) || show_window;
    spawn_status_forwarder(app);
    spawn_set_aside_forwarder(app);
    sleep::spawn(engine.clone());
    awake::spawn(engine.clone());
    sync_autostart(app);
    spawn_signal_handler(app);
    if show_window {
        window::open(app, engine.guide().needed.then_some("guide"));
    } else {
        window::page_out_when_idle(app);
    }
}

/// Pushes every status change to the tray and to the window (if open).
fn spawn_status_forwarder<R: Runtime>(app: &AppHandle<R>) {
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
fn spawn_set_aside_forwarder<R: Runtime>(app: &AppHandle<R>) {
    let app = app.clone();
    let mut set_aside = app.state::<AppState>().engine.watch_set_aside();
    tauri::async_runtime::spawn(async move {
        while set_aside.changed().await.is_ok() {
            let now = set_aside.borrow_and_update().clone();
            let _ = app.emit("config-set-aside", &now);
        }
    });
}

/// Makes the OS's start-at-login entry match the setting. Failures are logged only. A
/// settings file that cannot be read leaves the entry as the user last set it.
fn sync_autostart<R: Runtime>(app: &AppHandle<R>) {
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

/// SIGTERM/SIGINT (logout, `kill`, Ctrl-C): hand off running jobs, then exit.
fn spawn_signal_handler<R: Runtime>(app: &AppHandle<R>) {
    #[cfg(unix)]
    {
        let app = app.clone();
        tauri::async_runtime::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
                tracing::warn!("cannot listen for SIGTERM/SIGINT");
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("signal received: handing off and quitting");
            let state = app.state::<AppState>();
            state.quitting.store(true, Ordering::SeqCst);
            state.engine.stop(StopMode::HandOff).await;
            app.exit(0);
        });
    }
}
