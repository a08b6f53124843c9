//! The tray icon and its menu. Linux (libappindicator) never delivers clicks on the icon to
//! the app, so everything is in the menu. The menu is rebuilt only when what it shows
//! changes, plus once a minute while jobs run (their running time).

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use devpilot_app::orchestrator::StopMode;
use devpilot_app::{MachineState as S, Status};
use tauri::image::Image;
use tauri::menu::{CheckMenuItem, IsMenuItem, Menu, MenuItem, PredefinedMenuItem, Submenu};
use tauri::tray::{TrayIcon, TrayIconBuilder};
use tauri::{AppHandle, Manager, Runtime};

use crate::state::AppState;
use crate::tray_text::{hover_text, job_lines, source_lines, state_line};

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
            .tooltip(hover_text(&st))
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

/// [`refresh`] with the engine's status now, whatever the cache says (a hand-off's verdict
/// came or went).
pub fn refresh_now<R: Runtime>(app: &AppHandle<R>) {
    let st = app.state::<AppState>().engine.status();
    refresh_inner(app, &st, true);
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
    // Everything the texts show except running times (the minute tick forces those): the
    // pause's end to the minute, as the menu says "until 14:30".
    let key = format!(
        "{:?}|{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}",
        st.state,
        st.dispatch_enabled,
        st.paused,
        st.paused_until_unix_ms.map(|ms| ms / 60_000),
        st.running.iter().map(|r| r.job.id).collect::<Vec<_>>(),
        st.orchestrator_id,
        st.message,
        source_lines(st),
    );
    let changed = cache.key.lock().map(|mut k| {
        let changed = k.as_deref() != Some(key.as_str());
        *k = Some(key);
        changed
    });
    if !(force || changed.unwrap_or(true)) {
        return;
    }
    set_hover_text(&tray, hover_text(st));
    let Ok(mut guard) = cache.menu.lock() else { return };
    let Some(tm) = guard.as_mut() else { return };
    if let Err(e) = update_menu(app, tm, st) {
        tracing::warn!(error = %e, "cannot update the tray menu");
    }
}

/// What a tray host shows when the pointer rests on the icon.
///
/// On Linux, Tauri's tray (the `tray-icon` crate over libayatana-appindicator) drops the
/// tooltip: `set_tooltip` is a no-op there (tray-icon 0.25, `platform_impl/gtk`), and its
/// `set_title` sets the indicator's *label* (`XAyatanaLabel`, text beside the icon, which
/// neither xfce4-panel nor trayer shows). libayatana-appindicator's StatusNotifierItem has no
/// `ToolTip` property at all; its `Title` property is what hosts fall back to for the tooltip
/// (xfce4-panel's `sn_item_get_tooltip`, KDE's SNI host). So on Linux the text goes to
/// `Title` through the indicator itself, and to the icon's accessible description, which
/// screen readers read and which xfce4-panel shows under the title unless the two are equal
/// (tray-icon sets it to "tray icon"). `set_tooltip` is still called for the hosts and
/// platforms that have a tooltip (Windows, macOS, a future tray-icon).
fn set_hover_text<R: Runtime>(tray: &TrayIcon<R>, text: String) {
    if let Err(e) = tray.set_tooltip(Some(&text)) {
        tracing::debug!(error = %e, "cannot set the tray tooltip");
    }
    #[cfg(target_os = "linux")]
    sni_title::set(tray, text);
}

#[cfg(target_os = "linux")]
mod sni_title {
    use std::ffi::{c_void, CString};

    use tauri::tray::TrayIcon;
    use tauri::Runtime;

    // `libappindicator::AppIndicator` is a struct with one field, the `AppIndicator*` GObject
    // pointer (libappindicator 0.9, src/lib.rs), and no accessor for it. Its size being one
    // pointer means that field is all of it, at offset 0, so reading a pointer from the
    // wrapper's address is reading that field. If the crate ever grows, this stops compiling.
    const _: () = assert!(std::mem::size_of::<libappindicator::AppIndicator>() == std::mem::size_of::<*mut c_void>());

    /// Sets the StatusNotifierItem's `Title` and `IconAccessibleDesc`. A failure is logged
    /// (once), never fatal.
    pub fn set<R: Runtime>(tray: &TrayIcon<R>, text: String) {
        let Ok(title) = CString::new(text.replace('\0', "")) else { return };
        // On the main thread: the indicator is a GObject of the GTK loop.
        let done = tray.with_inner_tray_icon(move |inner| {
            // SAFETY: tray-icon hands out the address of its live wrapper (it lives as long as
            // `inner`, which we hold); we only read the wrapper's one field (see above).
            let wrapper: *const libappindicator::AppIndicator = unsafe { inner.app_indicator() };
            let raw =
                if wrapper.is_null() { std::ptr::null_mut() } else { unsafe { wrapper.cast::<*mut c_void>().read() } };
            if raw.is_null() {
                return Err("the tray indicator is gone".to_string());
            }
            // The symbol lookup panics if the loaded library lacks it (appindicator < 0.5).
            std::panic::catch_unwind(|| {
                // SAFETY: `raw` is the indicator's GObject, alive while `inner` is; `title` is
                // a NUL-terminated string that outlives the calls (the library copies it);
                // the icon name is the indicator's own, re-set unchanged with the description.
                unsafe {
                    libappindicator::app_indicator_set_title(raw.cast(), title.as_ptr());
                    let icon = libappindicator::app_indicator_get_icon(raw.cast());
                    if !icon.is_null() {
                        libappindicator::app_indicator_set_icon_full(raw.cast(), icon, title.as_ptr());
                    }
                }
            })
            .map_err(|_| "this appindicator library has no app_indicator_set_title".to_string())
        });
        let err = match done {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e,
            Err(e) => e.to_string(),
        };
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(error = %err, "cannot set the tray's hover text (StatusNotifierItem Title)");
        }
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

fn update_menu<R: Runtime>(app: &AppHandle<R>, tm: &mut TrayMenu<R>, st: &Status) -> tauri::Result<()> {
    tm.status.set_text(state_line(st))?;
    // One fixed item for the running jobs, one line per job, then a line per source that does
    // not work here: inserting and removing items in a live appindicator menu left it unable
    // to open on xfce4-panel.
    let mut lines = job_lines(st);
    if lines.is_empty() {
        lines.push("No jobs running here".to_string());
    }
    lines.extend(source_lines(st));
    if let Some(v) = app.state::<AppState>().engine.last_hand_off() {
        lines.push(crate::tray_text::verdict_line(&v));
    }
    tm.jobs_item.set_text(lines.join("\n"))?;
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
    let log = |r: devpilot_app::Result<()>| {
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
                    Ok(v) => tracing::info!(safe = v.safe, "tray hand-off: {}", v.text),
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
