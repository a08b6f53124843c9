//! The DevPilot tray app. It embeds the engine ([`devpilot_app::Engine`]) in this process and
//! adds the parts a person sees: the tray icon and its menu, the window, notifications, the
//! sleep hook and start-at-login. Every one of those OS integrations is optional: when one is
//! missing (no tray host, no notification daemon, no logind, no keychain) it is logged and the
//! rest keeps working.
//!
//! # Layout
//! - [`state`]: [`AppState`], what Tauri manages (the engine, the notifier, the tray host seen).
//! - [`commands`]: everything the window may ask for (Tauri commands; the UI has no other way in);
//!   [`commands_limits`], those about the governor's limits and budgets.
//! - [`tray`]: the icon (five states), the menu and the hover text, kept current from the engine's status.
//! - [`tray_host`]: whether a tray host shows the icon at all; without one the window is the face.
//! - [`tray_text`]: what the tray says (state line, job lines, hover text), as pure functions.
//! - [`tray_limits`]: the menu's Limits part (accounts held or near a cap, the day's spend, the
//!   fleet's switch), shown only when it has something to say.
//! - [`notify`]: notifications per event, coalesced, sent off the async worker threads.
//! - [`sleep`]: logind's PrepareForSleep: hand off (or pause) before sleep, re-check after wake.
//! - [`awake`]: with `keep_awake` on, a logind idle-sleep block inhibitor while agents run.
//! - [`logind`]: the logind D-Bus calls both use.
//! - [`window`]: opening the window, and what closing it does.
//! - [`display`]: whether there is a graphical session at all, asked before the toolkit is.
//! - [`forward`]: the engine's status and events, passed on to the tray and the window.
//! - [`exit`]: how the app ends: never with its last window, and handing off at exit or a signal.
//! - [`autostart`]: start at login, made to match the setting.
//! - [`logging`]: the log file and stderr.
//!
//! This file only declares the modules, re-exports and wires them: [`run`] and [`setup`].

use devpilot_app::config::Paths;
use devpilot_app::{Engine, Overrides};
use tauri::{AppHandle, Manager, Runtime};

pub mod autostart;
pub mod awake;
pub mod commands;
pub mod commands_limits;
pub mod display;
pub mod exit;
pub mod forward;
pub mod logging;
pub mod logind;
pub mod notice;
pub mod notify;
pub mod notify_job;
pub mod sleep;
pub mod state;
pub mod theme;
pub mod tray;
pub mod tray_host;
pub mod tray_limits;
pub mod tray_text;
pub mod window;

pub use autostart::set_autostart;
pub use state::AppState;

/// The profile name: its config, data, logs and keychain entries. Debug builds use their own,
/// so development never touches a user's real profile or credentials.
pub const PROFILE: &str = if cfg!(debug_assertions) { "devpilot-dev" } else { "devpilot" };

/// Runs the app until the user quits.
pub fn run() -> std::process::ExitCode {
    // Inside an agent's sandbox this binary is its first process (the sandbox's init).
    devpilot_app::sandbox::init::enter_if_asked();
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
    let _log_guard = logging::init(&paths);
    tracing::info!(profile = PROFILE, config = %paths.config_file().display(), "starting");
    let mut ctx = tauri::generate_context!();
    if cfg!(debug_assertions) {
        // A development build is another app as far as the OS is concerned.
        ctx.config_mut().identifier = "dev.devpilot.tray.dev".into();
    }
    let _runtime = one_worker_runtime();
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
    app.run(exit::on_run_event);
    std::process::ExitCode::SUCCESS
}

/// The runtime the app's tasks run on (tauri's, the engine's and the sources'), with one
/// worker thread where tauri's default has one per core. An idle tray's work is a statement
/// or a request now and then, and with two workers each of them woke both: the one that took
/// the wake-up woke the other to look for more (measured with strace: about ten eventfd
/// writes between the two per intake turn). The agents are processes of their own, and
/// SQLite, blocking reads and the keychain have threads of their own. Kept for the life of
/// the app; `None` (tauri's default) if it cannot be built.
fn one_worker_runtime() -> Option<tokio::runtime::Runtime> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("devpilot-rt")
        .enable_all()
        .build()
        .inspect_err(|e| tracing::warn!(error = %e, "cannot build the app's runtime; using tauri's default"))
        .ok()?;
    tauri::async_runtime::set(rt.handle().clone());
    Some(rt)
}

/// Everything that starts with the app. Generic over the runtime so tests can use the mock.
pub fn setup<R: Runtime>(app: &AppHandle<R>, show_window: bool) {
    // The desktop's dark or light preference, read now so the first window starts in it.
    theme::warm();
    let state = app.state::<AppState>();
    let engine = state.engine.clone();
    // Listening first, so nothing the first start says is missed.
    state.notifier.start();
    {
        let engine = engine.clone();
        tauri::async_runtime::spawn(async move { engine.start().await });
    }
    // An edit of the settings file, by hand or by the CLI, is applied as the window's save is.
    if let Some(watch) = engine.clone().watch_config_file() {
        tauri::async_runtime::spawn(watch);
    }
    // A hand-off another machine asked for gets its verdict here too.
    tauri::async_runtime::spawn(engine.clone().watch_requested_releases());
    {
        let app = app.clone();
        state.notifier.set_on_open(std::sync::Arc::new(move |target| open_target(&app, target)));
    }
    tray::install(app);
    // No host to show the icon: the window is the only way in, so it opens.
    let show_window = !tray_host::start(app) || show_window;
    forward::spawn_status_forwarder(app);
    forward::spawn_set_aside_forwarder(app);
    forward::spawn_config_note_forwarder(app);
    forward::spawn_hand_off_forwarder(app);
    sleep::spawn(engine.clone());
    awake::spawn(engine.clone());
    autostart::sync(app);
    exit::spawn_signal_handler(app);
    if show_window {
        window::open(app, engine.guide().needed.then_some("guide"));
    } else {
        window::page_out_when_idle(app);
    }
}

/// A notification's "Open": a link in the browser, a job or Settings in the window. A finished
/// job's opens its result link as the queue has it now (its pull request, opened after the
/// notification was sent), else what was known when it finished.
fn open_target<R: Runtime>(app: &AppHandle<R>, target: notify::Open) {
    match target {
        notify::Open::Url(url) => {
            if let Err(e) = window::open_url(&url) {
                tracing::warn!(error = %e, "cannot open the job's link");
            }
        }
        notify::Open::Job(id) => window::open(app, Some(&format!("job-{id}"))),
        notify::Open::Settings => window::open(app, Some("settings")),
        notify::Open::Log(id) => window::open(app, Some(&format!("job-{id}-log"))),
        notify::Open::Retry(id) => {
            let (app, engine) = (app.clone(), app.state::<AppState>().engine.clone());
            tauri::async_runtime::spawn(async move {
                match engine.requeue(id).await {
                    Ok(true) => tracing::info!(job = id, "retried from its notification"),
                    Ok(false) => tracing::info!(job = id, "not retried: it is not failed or dead any more"),
                    Err(e) => tracing::warn!(job = id, error = %e, "cannot retry the job"),
                }
                // Its page says where it stands now.
                window::open(&app, Some(&format!("job-{id}")));
            });
        }
        notify::Open::Result { job, otherwise } => {
            let (app, engine) = (app.clone(), app.state::<AppState>().engine.clone());
            tauri::async_runtime::spawn(async move {
                let now = engine.result_link(job).await;
                tracing::info!(job, link = ?now, "opening the finished job's result");
                open_target(&app, now.map(notify::Open::Url).unwrap_or(*otherwise));
            });
        }
    }
}
