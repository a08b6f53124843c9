//! How the app ends: never when its last window closes (it lives in the tray), and never
//! leaving a claim to the sweep when it can be handed off (at exit, or on SIGTERM/SIGINT).

use std::sync::atomic::Ordering;

use devpilot_app::orchestrator::StopMode;
use tauri::{AppHandle, Manager, RunEvent, Runtime};

use crate::state::AppState;

/// The app's run loop events: keeps it up without windows, and hands off at exit.
pub fn on_run_event<R: Runtime>(app: &AppHandle<R>, event: RunEvent) {
    match event {
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
    }
}

/// SIGTERM/SIGINT (logout, `kill`, Ctrl-C): hand off running jobs, then exit.
pub fn spawn_signal_handler<R: Runtime>(app: &AppHandle<R>) {
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
