//! The tray icon and its menu. Linux (libappindicator) never delivers clicks on the icon to
//! the app, so everything is in the menu. The menu is rebuilt only when what it shows
//! changes, plus once a minute while jobs run (their running time).

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use devpilot::app::{MachineState as S, Status};
use devpilot::orchestrator::StopMode;
use tauri::image::Image;
use tauri::menu::{CheckMenuItem, IsMenuItem, Menu, MenuItem, PredefinedMenuItem, Submenu};
use tauri::tray::TrayIconBuilder;
use tauri::{AppHandle, Manager, Runtime};

use crate::AppState;

pub const TRAY_ID: &str = "devpilot";

/// The five icon states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Icon {
    Idle,
    Working,
    Paused,
    Off,
    Offline,
}

impl Icon {
    pub fn of(st: &Status) -> Self {
        match st.state {
            S::Idle => Icon::Idle,
            S::Working => Icon::Working,
            S::Paused => Icon::Paused,
            S::Off | S::Stopped => Icon::Off,
            S::Starting => {
                if st.dispatch_enabled {
                    Icon::Idle
                } else {
                    Icon::Off
                }
            }
            S::Offline | S::Error | S::NeedsAgent => Icon::Offline,
        }
    }

    pub fn png(self) -> &'static [u8] {
        match self {
            Icon::Idle => include_bytes!("../icons/tray-idle.png"),
            Icon::Working => include_bytes!("../icons/tray-working.png"),
            Icon::Paused => include_bytes!("../icons/tray-paused.png"),
            Icon::Off => include_bytes!("../icons/tray-off.png"),
            Icon::Offline => include_bytes!("../icons/tray-offline.png"),
        }
    }

    pub fn image(self) -> Option<Image<'static>> {
        match Image::from_bytes(self.png()) {
            Ok(i) => Some(i),
            Err(e) => {
                tracing::warn!(error = %e, "cannot decode a tray icon");
                None
            }
        }
    }
}

/// One line for the state, as the menu and the tooltip show it.
pub fn state_line(st: &Status) -> String {
    let word = match st.state {
        S::Starting => "Starting…".to_string(),
        S::Idle => "Idle: waiting for jobs".to_string(),
        S::Working => format!("Working: {} job{}", st.running.len(), if st.running.len() == 1 { "" } else { "s" }),
        S::Paused => match st.paused_for_secs {
            Some(s) => format!("Paused: resumes in {}", human(Duration::from_secs(s))),
            None => "Paused until resumed".to_string(),
        },
        S::Off => "Dispatch off".to_string(),
        S::Offline => "Offline: database unreachable".to_string(),
        S::Error => match &st.message {
            // The first clause says what is wrong (the agent program, the keychain, …).
            Some(m) => {
                format!("Needs attention: {}", m.split(';').next().unwrap_or(m).chars().take(90).collect::<String>())
            }
            None => "Needs attention (see Settings)".to_string(),
        },
        S::NeedsAgent => "Set an agent command (Settings)".to_string(),
        S::Stopped => "Stopped".to_string(),
    };
    if st.orchestrator_id.is_empty() {
        word
    } else {
        format!("{word} — {}", st.orchestrator_id)
    }
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m", s / 60)
    } else {
        format!("{}h {}m", s / 3600, (s % 3600) / 60)
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The running-job lines: "Title (#12) · 3m".
pub fn job_lines(st: &Status) -> Vec<String> {
    let now = now_ms();
    st.running
        .iter()
        .map(|r| {
            let mut label = r.job.label();
            if label.chars().count() > 48 {
                label = label.chars().take(47).collect::<String>() + "…";
            }
            format!("▶ {label} · {}", human(Duration::from_millis(now.saturating_sub(r.started_unix_ms))))
        })
        .collect()
}

/// The menu, built once and then updated in place: replacing a tray menu while a tray host
/// reads it crashed hosts (and, with libappindicator, the app) under bursts of updates.
pub struct TrayMenu<R: Runtime> {
    menu: Menu<R>,
    status: MenuItem<R>,
    jobs_item: MenuItem<R>,
    dispatch: CheckMenuItem<R>,
    pause: Submenu<R>,
    resume: MenuItem<R>,
    handoff: MenuItem<R>,
}

/// What the tray last showed, to skip needless updates.
pub struct TrayCache<R: Runtime> {
    icon: Mutex<Option<Icon>>,
    key: Mutex<Option<String>>,
    menu: Mutex<Option<TrayMenu<R>>>,
}

/// Creates the tray icon. A missing tray host or appindicator library is logged and the app
/// carries on without a tray (the window and notifications still work).
pub fn install<R: Runtime>(app: &AppHandle<R>) {
    let st = app.state::<AppState>().engine.status();
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> tauri::Result<TrayMenu<R>> {
        let tm = build_menu(app)?;
        let mut b = TrayIconBuilder::with_id(TRAY_ID)
            .tooltip(format!("DevPilot — {}", state_line(&st)))
            .menu(&tm.menu)
            .show_menu_on_left_click(true)
            .on_menu_event(|app, event| on_menu(app, event.id().as_ref()));
        if let Some(img) = Icon::of(&st).image() {
            b = b.icon(img);
        }
        b.build(app)?;
        Ok(tm)
    }));
    let menu = match built {
        Ok(Ok(tm)) => {
            tracing::info!("tray icon created");
            Some(tm)
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot create the tray icon; running without it (open the window with a second launch of devpilot-tray)");
            None
        }
        Err(_) => {
            tracing::error!(
                "the tray icon could not be created (is libayatana-appindicator3 installed?); running without it"
            );
            None
        }
    };
    app.manage(TrayCache { icon: Mutex::new(Some(Icon::of(&st))), key: Mutex::new(None), menu: Mutex::new(menu) });
    refresh(app, &st);
    // While jobs run, refresh their running time once a minute.
    let app = app.clone();
    tauri::async_runtime::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(60)).await;
            let st = app.state::<AppState>().engine.status();
            if !st.running.is_empty() {
                refresh_inner(&app, &st, true);
            }
        }
    });
}

/// Brings the icon, tooltip and menu up to date.
pub fn refresh<R: Runtime>(app: &AppHandle<R>, st: &Status) {
    refresh_inner(app, st, false);
}

fn refresh_inner<R: Runtime>(app: &AppHandle<R>, st: &Status, force: bool) {
    let Some(tray) = app.tray_by_id(TRAY_ID) else { return };
    let Some(cache) = app.try_state::<TrayCache<R>>() else { return };
    let icon = Icon::of(st);
    if let Ok(mut last) = cache.icon.lock() {
        if *last != Some(icon) {
            if let Err(e) = tray.set_icon(icon.image()) {
                tracing::warn!(error = %e, "cannot update the tray icon");
            }
            *last = Some(icon);
        }
    }
    let key = format!(
        "{:?}|{}|{}|{:?}|{:?}|{:?}",
        st.state,
        st.dispatch_enabled,
        st.paused,
        st.paused_for_secs.map(|s| s / 60),
        st.running.iter().map(|r| r.job.id).collect::<Vec<_>>(),
        st.orchestrator_id
    );
    let changed = cache.key.lock().map(|mut k| {
        let changed = k.as_deref() != Some(key.as_str());
        *k = Some(key);
        changed
    });
    if !(force || changed.unwrap_or(true)) {
        return;
    }
    let _ = tray.set_tooltip(Some(format!("DevPilot — {}", state_line(st))));
    let Ok(mut guard) = cache.menu.lock() else { return };
    let Some(tm) = guard.as_mut() else { return };
    if let Err(e) = update_menu(app, tm, st) {
        tracing::warn!(error = %e, "cannot update the tray menu");
    }
}

fn build_menu<R: Runtime>(app: &AppHandle<R>) -> tauri::Result<TrayMenu<R>> {
    let status = MenuItem::with_id(app, "status", "Starting…", false, None::<&str>)?;
    let jobs_item = MenuItem::with_id(app, "jobs", "No jobs running here", false, None::<&str>)?;
    let dispatch = CheckMenuItem::with_id(app, "dispatch", "Dispatch enabled", true, false, None::<&str>)?;
    let p30 = MenuItem::with_id(app, "pause_30", "For 30 minutes", true, None::<&str>)?;
    let p60 = MenuItem::with_id(app, "pause_60", "For 1 hour", true, None::<&str>)?;
    let pin = MenuItem::with_id(app, "pause_indef", "Until resumed", true, None::<&str>)?;
    let pause = Submenu::with_id_and_items(app, "pause", "Pause", true, &[&p30, &p60, &pin])?;
    let resume = MenuItem::with_id(app, "resume", "Resume", false, None::<&str>)?;
    // GTK reads a single & as a mnemonic marker and hides it; && shows one.
    let handoff = MenuItem::with_id(
        app,
        "handoff",
        if cfg!(target_os = "linux") { "Hand off && pause" } else { "Hand off & pause" },
        true,
        None::<&str>,
    )?;
    let open = MenuItem::with_id(app, "open", "Open DevPilot", true, None::<&str>)?;
    let settings = MenuItem::with_id(app, "settings", "Settings…", true, None::<&str>)?;
    let logs = MenuItem::with_id(app, "logs", "View logs", true, None::<&str>)?;
    let quit = MenuItem::with_id(app, "quit", "Quit DevPilot", true, None::<&str>)?;
    let (s1, s2, s3) =
        (PredefinedMenuItem::separator(app)?, PredefinedMenuItem::separator(app)?, PredefinedMenuItem::separator(app)?);
    let items: [&dyn IsMenuItem<R>; 13] =
        [&status, &jobs_item, &s1, &dispatch, &pause, &resume, &handoff, &s2, &open, &settings, &logs, &s3, &quit];
    let menu = Menu::with_items(app, &items)?;
    Ok(TrayMenu { menu, status, jobs_item, dispatch, pause, resume, handoff })
}

fn update_menu<R: Runtime>(_app: &AppHandle<R>, tm: &mut TrayMenu<R>, st: &Status) -> tauri::Result<()> {
    tm.status.set_text(state_line(st))?;
    // One fixed item for the running jobs, one line per job: inserting and removing items
    // in a live appindicator menu left it unable to open on xfce4-panel.
    let lines = job_lines(st);
    tm.jobs_item.set_text(if lines.is_empty() { "No jobs running here".to_string() } else { lines.join("\n") })?;
    let can_dispatch = !matches!(st.state, S::NeedsAgent | S::Error | S::Starting | S::Stopped);
    tm.dispatch.set_checked(st.dispatch_enabled)?;
    tm.pause.set_enabled(can_dispatch && !st.paused)?;
    tm.resume.set_enabled(can_dispatch && st.paused)?;
    tm.handoff.set_enabled(can_dispatch)?;
    Ok(())
}

/// What each menu item does.
pub fn on_menu<R: Runtime>(app: &AppHandle<R>, id: &str) {
    tracing::info!(item = id, "tray menu");
    let engine = app.state::<AppState>().engine.clone();
    let log = |r: devpilot::Result<()>| {
        if let Err(e) = r {
            tracing::warn!(error = %e, "menu action failed");
        }
    };
    match id {
        "dispatch" => {
            let on = !engine.status().dispatch_enabled;
            tauri::async_runtime::spawn(async move {
                if let Err(e) = engine.set_dispatch(on).await {
                    tracing::warn!(error = %e, "cannot switch dispatch");
                }
            });
        }
        "pause_30" => log(engine.pause(Some(Duration::from_secs(30 * 60)))),
        "pause_60" => log(engine.pause(Some(Duration::from_secs(60 * 60)))),
        "pause_indef" => log(engine.pause(None)),
        "resume" => log(engine.resume()),
        "handoff" => {
            tauri::async_runtime::spawn(async move {
                match engine.hand_off(true).await {
                    Ok(_) => tracing::info!("handed off and paused"),
                    Err(e) => tracing::warn!(error = %e, "hand-off failed"),
                }
            });
        }
        "open" => crate::window::open(app, None),
        "settings" => crate::window::open(app, Some("settings")),
        "logs" => {
            if let Err(e) = crate::window::reveal(&engine.paths().log_dir) {
                tracing::warn!(error = %e, "cannot open the log folder");
            }
        }
        "quit" => {
            if engine.status().running.is_empty() {
                let app = app.clone();
                app.state::<AppState>().quitting.store(true, Ordering::SeqCst);
                tauri::async_runtime::spawn(async move {
                    engine.stop(StopMode::HandOff).await;
                    app.exit(0);
                });
            } else {
                // Never strand a claim silently: ask in the window.
                crate::window::open(app, Some("quit"));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every icon decodes, and they are five different pictures.
    #[test]
    fn five_distinct_icons() {
        let all = [Icon::Idle, Icon::Working, Icon::Paused, Icon::Off, Icon::Offline];
        for i in all {
            let img = i.image().unwrap();
            assert_eq!((img.width(), img.height()), (64, 64));
        }
        let mut pngs: Vec<&[u8]> = all.iter().map(|i| i.png()).collect();
        pngs.sort();
        pngs.dedup();
        assert_eq!(pngs.len(), 5);
    }
}
