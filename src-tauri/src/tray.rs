//! The tray icon and its menu. Linux (libappindicator) never delivers clicks on the icon to
//! the app, so everything is in the menu. The menu is rebuilt only when what it shows
//! changes, plus once a minute while jobs run (their running time). Its Limits part
//! (tray_limits.rs) is read from the database when a job moves and every few minutes.

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
use crate::tray_limits;
use crate::tray_text::{hover_text, job_lines, source_lines, state_line};

pub const TRAY_ID: &str = "devpilot";

/// The six icon states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Icon {
    Idle,
    Working,
    Paused,
    Off,
    /// The database cannot be reached.
    Offline,
    /// Something the user must fix: the agent cannot run, a source has no usable key, or
    /// the last hand-off left work on this machine.
    Attention,
}

impl Icon {
    /// The icon for `st`, and `red` when the last hand-off left work here.
    pub fn of(st: &Status, red: bool) -> Self {
        let trouble = red || !source_lines(st).is_empty();
        match st.state {
            S::Offline => Icon::Offline,
            S::Error | S::NeedsAgent => Icon::Attention,
            _ if trouble => Icon::Attention,
            _ => Self::of_state(st),
        }
    }

    fn of_state(st: &Status) -> Self {
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
            S::Offline => Icon::Offline,
            S::Error | S::NeedsAgent => Icon::Attention,
        }
    }

    pub fn png(self) -> &'static [u8] {
        match self {
            Icon::Idle => include_bytes!("../icons/tray-idle.png"),
            Icon::Working => include_bytes!("../icons/tray-working.png"),
            Icon::Paused => include_bytes!("../icons/tray-paused.png"),
            Icon::Off => include_bytes!("../icons/tray-off.png"),
            Icon::Offline => include_bytes!("../icons/tray-offline.png"),
            Icon::Attention => include_bytes!("../icons/tray-attention.png"),
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

/// How many running jobs and recent results the menu lists: fixed slots, each updated in
/// place (an unused one says so, disabled).
const RUN_SLOTS: usize = 4;
const RECENT_SLOTS: usize = 3;

/// The claiming control's items, in menu order: what each sets.
const CLAIM_ITEMS: [(&str, &str); 5] = [
    ("claim_on", "On"),
    ("claim_30", "Pause for 30 minutes"),
    ("claim_60", "Pause for 1 hour"),
    ("claim_indef", "Pause until resumed"),
    ("claim_off", "Off"),
];

/// Where the Limits part is in the menu (its lines, its switch, a separator), of how many
/// top-level items: hidden while it has nothing to say.
const LIMITS_PART: std::ops::Range<usize> = 5..8;
const MENU_ITEMS: usize = 16;

/// How often the Limits part is read with nothing moving here (another machine's hold, the
/// end of one, a new day): a database read every five minutes, never more often.
const LIMITS_EVERY: Duration = Duration::from_secs(300);

/// The menu, built once and then updated in place: replacing a tray menu while a tray host
/// reads it crashed hosts (and, with libappindicator, the app) under bursts of updates.
pub struct TrayMenu<R: Runtime> {
    menu: Menu<R>,
    status: MenuItem<R>,
    jobs_item: MenuItem<R>,
    /// The Jobs submenu's first line: what runs here and what is queued. (Submenu labels stay
    /// fixed: a changed one did not reach the tray host over dbusmenu.)
    jobs_head: MenuItem<R>,
    run_slots: Vec<MenuItem<R>>,
    recent_slots: Vec<MenuItem<R>>,
    claiming: Submenu<R>,
    /// The claiming submenu's first line: "Now: on", "Now: paused until 14:30", "Now: off".
    claim_head: MenuItem<R>,
    claim_items: Vec<CheckMenuItem<R>>,
    handoff: MenuItem<R>,
    /// The Limits part's lines, and the fleet's switch.
    limits: MenuItem<R>,
    limits_resume: CheckMenuItem<R>,
}

/// Which job each slot shows, for its click.
#[derive(Default)]
struct Slots {
    run: Vec<i64>,
    recent: Vec<i64>,
}

/// What the tray last showed, to skip needless updates.
pub struct TrayCache<R: Runtime> {
    icon: Mutex<Option<Icon>>,
    key: Mutex<Option<String>>,
    menu: Mutex<Option<TrayMenu<R>>>,
    slots: Mutex<Slots>,
    /// The queue at a glance, read when jobs move (never on a timer: an idle tray reads
    /// nothing).
    board: Mutex<Option<devpilot_app::Board>>,
    /// The fleet's limits, read when jobs move and every [`LIMITS_EVERY`].
    limits: Mutex<Option<devpilot_app::limits::LimitsView>>,
    /// Whether the Limits part shows now (`None`: not yet set since it was built).
    limits_shown: Mutex<Option<bool>>,
    /// Read the limits again now (the window changed them: [`reread_limits`]).
    limits_poke: std::sync::Arc<tokio::sync::Notify>,
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
        if let Some(img) = Icon::of(&st, false).image() {
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
    app.manage(TrayCache {
        icon: Mutex::new(Some(Icon::of(&st, false))),
        key: Mutex::new(None),
        menu: Mutex::new(menu),
        slots: Mutex::default(),
        board: Mutex::new(None),
        limits: Mutex::new(None),
        limits_shown: Mutex::new(None),
        limits_poke: std::sync::Arc::default(),
    });
    refresh(app, &st);
    spawn_board_reader(app);
    spawn_limits_reader(app);
    // While jobs run, refresh their running time once a minute.
    let app = app.clone();
    tauri::async_runtime::spawn(async move {
        loop {
            devpilot_app::timer::sleep(Duration::from_secs(60)).await;
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

/// What of the board the menu shows, to tell when it changed.
fn board_key(b: &devpilot_app::Board) -> String {
    let recent: Vec<String> = b.recent.iter().map(|o| format!("{}:{:?}:{}", o.job.id, o.job.state, o.line)).collect();
    format!("{}/{}/{}", b.queued, b.running, recent.join(","))
}

/// Reads the board at start and whenever a job moves (a burst of events is read once), then
/// refreshes the menu. A read that fails leaves the last board shown.
fn spawn_board_reader<R: Runtime>(app: &AppHandle<R>) {
    let app = app.clone();
    let engine = app.state::<AppState>().engine.clone();
    let mut events = engine.subscribe();
    tauri::async_runtime::spawn(async move {
        loop {
            let read = match engine.board().await {
                Ok(b) => {
                    if let Some(cache) = app.try_state::<TrayCache<R>>() {
                        if let Ok(mut slot) = cache.board.lock() {
                            *slot = Some(b);
                        }
                    }
                    refresh_now(&app);
                    true
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read the queue for the tray");
                    false
                }
            };
            // The next job movement, then a moment for its burst. Until a first read worked
            // (the database is still opening), again after a few seconds as well.
            loop {
                use devpilot_app::orchestrator::Event as E;
                let next = events.recv();
                let ev = if read { Ok(next.await) } else { tokio::time::timeout(Duration::from_secs(5), next).await };
                match ev {
                    Err(_) => break,
                    Ok(Ok(E::Claimed { .. } | E::Completed { .. } | E::Failed { .. } | E::Cancelled { .. }))
                    | Ok(Ok(E::Released { .. } | E::Parked { .. } | E::DatabaseOnline)) => break,
                    Ok(Ok(_)) => {}
                    Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => break,
                    Ok(Err(_)) => return,
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            while events.try_recv().is_ok() {}
        }
    });
}

/// Reads the fleet's limits at start, when a job moves here, a spend warning is given or the
/// settings file changes (a burst is read once), just after a hold it shows ends, and every
/// [`LIMITS_EVERY`] otherwise; then refreshes the menu. A read that fails leaves the last one
/// shown (until a first read works, it is tried again every few seconds). With no tray menu
/// it reads nothing.
fn spawn_limits_reader<R: Runtime>(app: &AppHandle<R>) {
    let Some(poke) = app
        .try_state::<TrayCache<R>>()
        .filter(|c| c.menu.lock().is_ok_and(|m| m.is_some()))
        .map(|c| c.limits_poke.clone())
    else {
        return;
    };
    let app = app.clone();
    let engine = app.state::<AppState>().engine.clone();
    let mut events = engine.subscribe();
    let mut notes = engine.watch_config_note();
    tauri::async_runtime::spawn(async move {
        let mut read_once = false;
        loop {
            let next = match engine.limits().await {
                Ok(v) => {
                    read_once = true;
                    let next = next_limits_read(&v, crate::tray_text::now_ms() as i64);
                    // The menu changes only when what it shows does (a timed read mostly finds
                    // the same).
                    let changed = app.try_state::<TrayCache<R>>().is_some_and(|cache| {
                        cache.limits.lock().is_ok_and(|mut slot| {
                            let changed = slot.as_ref() != Some(&v);
                            *slot = Some(v);
                            changed
                        })
                    });
                    if changed {
                        refresh_now(&app);
                    }
                    next
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read the fleet's limits for the tray");
                    Duration::from_secs(if read_once { 60 } else { 5 })
                }
            };
            let timer = devpilot_app::timer::sleep(next);
            tokio::pin!(timer);
            loop {
                use devpilot_app::orchestrator::Event as E;
                tokio::select! {
                    _ = &mut timer => break,
                    _ = poke.notified() => break,
                    changed = notes.changed() => match changed {
                        Ok(()) => break,
                        Err(_) => return,
                    },
                    ev = events.recv() => match ev {
                        Ok(E::Claimed { .. } | E::Completed { .. } | E::Parked { .. } | E::Released { .. })
                        | Ok(E::SpendWarning { .. } | E::Failed { .. } | E::DatabaseOnline) => break,
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(_) => return,
                    },
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            while events.try_recv().is_ok() {}
            notes.borrow_and_update();
        }
    });
}

/// Has the Limits part read again now: the window changed what it shows (the fleet's
/// switch, a hold ended by hand).
pub fn reread_limits<R: Runtime>(app: &AppHandle<R>) {
    if let Some(cache) = app.try_state::<TrayCache<R>>() {
        cache.limits_poke.notify_one();
    }
}

/// When to read the limits again with nothing moving: just after the first hold shown ends
/// (its line goes then), at most [`LIMITS_EVERY`] from `now_ms`.
fn next_limits_read(v: &devpilot_app::limits::LimitsView, now_ms: i64) -> Duration {
    let ends = v.accounts.iter().filter_map(|a| a.held_until).filter(|&t| t > now_ms).min();
    let until_end = ends.map(|t| Duration::from_millis((t - now_ms) as u64) + Duration::from_secs(5));
    until_end.map_or(LIMITS_EVERY, |w| w.min(LIMITS_EVERY))
}

/// Sets the fleet's switch from the menu: checked, jobs parked on a usage limit resume by
/// themselves. The item shows what was read back (a refused change is put back).
fn set_resume_after_limits<R: Runtime>(app: &AppHandle<R>) {
    let app = app.clone();
    let engine = app.state::<AppState>().engine.clone();
    // What the item showed before the click is what the user turned around.
    let was_paused = app
        .try_state::<TrayCache<R>>()
        .and_then(|c| c.limits.lock().ok().and_then(|l| l.as_ref().map(|v| v.limits_paused)))
        .unwrap_or(false);
    tauri::async_runtime::spawn(async move {
        match engine.set_limits_paused(!was_paused).await {
            Ok(()) if was_paused => tracing::info!("tray: jobs parked on a usage limit resume by themselves"),
            Ok(()) => tracing::info!("tray: jobs parked on a usage limit wait for a person"),
            Err(e) => tracing::warn!(error = %e, "cannot set the fleet's limit switch"),
        }
        match engine.limits().await {
            Ok(v) => {
                if let Some(cache) = app.try_state::<TrayCache<R>>() {
                    if let Ok(mut slot) = cache.limits.lock() {
                        *slot = Some(v);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the fleet's limits back"),
        }
        refresh_now(&app);
    });
}

/// [`refresh`] with the engine's status now, whatever the cache says (a hand-off's verdict
/// came or went).
pub fn refresh_now<R: Runtime>(app: &AppHandle<R>) {
    let st = app.state::<AppState>().engine.status();
    refresh_inner(app, &st, true);
}

/// Every change to the icon and the menu is made on the main thread: queued from a task,
/// never waited for. A tray or menu call from a task blocks its tokio worker until the main
/// thread runs it; two such waits at start (the board and the limits read back before the
/// event loop ran) took both workers of a 2-core machine while setup's tray-host check waited
/// on them, and the tray hung before its icon registered.
fn refresh_inner<R: Runtime>(app: &AppHandle<R>, st: &Status, force: bool) {
    let (here, st) = (app.clone(), st.clone());
    if let Err(e) = app.run_on_main_thread(move || refresh_here(&here, &st, force)) {
        tracing::debug!(error = %e, "cannot queue a tray refresh (the app is quitting?)");
    }
}

/// [`refresh_inner`], on the main thread.
fn refresh_here<R: Runtime>(app: &AppHandle<R>, st: &Status, force: bool) {
    let Some(tray) = app.tray_by_id(TRAY_ID) else { return };
    let Some(cache) = app.try_state::<TrayCache<R>>() else { return };
    let red = app.state::<AppState>().engine.last_hand_off().is_some_and(|v| !v.safe);
    let icon = Icon::of(st, red);
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
    let board = cache.board.lock().ok().and_then(|b| b.as_ref().map(board_key));
    let key = format!(
        "{:?}|{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{board:?}",
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
    let item = |id: String, text: &str, on: bool| MenuItem::with_id(app, id, text, on, None::<&str>);
    let status = item("status".into(), "Starting…", false)?;
    let jobs_item = item("jobs".into(), "No jobs running here", false)?;
    let run_slots = (0..RUN_SLOTS).map(|i| item(format!("run_{i}"), "", false)).collect::<tauri::Result<Vec<_>>>()?;
    let open_queue = item("queue".into(), "Open the queue", true)?;
    let jobs_head = item("jobs_head".into(), "Nothing running here", false)?;
    let sep = PredefinedMenuItem::separator(app)?;
    let mut children: Vec<&dyn IsMenuItem<R>> = vec![&jobs_head];
    children.extend(run_slots.iter().map(|m| m as &dyn IsMenuItem<R>));
    children.extend([&sep as &dyn IsMenuItem<R>, &open_queue]);
    let jobs = Submenu::with_id_and_items(app, "jobs_menu", "Jobs", true, &children)?;
    let recent_slots =
        (0..RECENT_SLOTS).map(|i| item(format!("recent_{i}"), "", false)).collect::<tauri::Result<Vec<_>>>()?;
    let children: Vec<&dyn IsMenuItem<R>> = recent_slots.iter().map(|m| m as &dyn IsMenuItem<R>).collect();
    let recent = Submenu::with_id_and_items(app, "recent", "Recent results", true, &children)?;
    let claim_items = CLAIM_ITEMS
        .iter()
        .map(|(id, text)| CheckMenuItem::with_id(app, *id, *text, true, false, None::<&str>))
        .collect::<tauri::Result<Vec<_>>>()?;
    let claim_head = item("claim_head".into(), "Now: on", false)?;
    let mut children: Vec<&dyn IsMenuItem<R>> = vec![&claim_head];
    children.extend(claim_items.iter().map(|m| m as &dyn IsMenuItem<R>));
    let claiming = Submenu::with_id_and_items(app, "claiming", "Claiming", true, &children)?;
    // GTK reads a single & as a mnemonic marker and hides it; && shows one.
    let handoff =
        item("handoff".into(), if cfg!(target_os = "linux") { "Hand off && pause" } else { "Hand off & pause" }, true)?;
    // The Limits part: hidden until it has something to say (update_menu).
    let limits = item("limits".into(), "Limits", false)?;
    let limits_resume =
        CheckMenuItem::with_id(app, "limits_resume", tray_limits::RESUME_TEXT, true, true, None::<&str>)?;
    let s_limits = PredefinedMenuItem::separator(app)?;
    let open = item("open".into(), "Open DevPilot", true)?;
    let settings = item("settings".into(), "Settings…", true)?;
    let logs = item("logs".into(), "View logs", true)?;
    let quit = item("quit".into(), "Quit DevPilot", true)?;
    let (s1, s2, s3) =
        (PredefinedMenuItem::separator(app)?, PredefinedMenuItem::separator(app)?, PredefinedMenuItem::separator(app)?);
    let items: [&dyn IsMenuItem<R>; MENU_ITEMS] = [
        &status,
        &jobs_item,
        &jobs,
        &recent,
        &s1,
        &limits,
        &limits_resume,
        &s_limits,
        &claiming,
        &handoff,
        &s2,
        &open,
        &settings,
        &logs,
        &s3,
        &quit,
    ];
    let menu = Menu::with_items(app, &items)?;
    Ok(TrayMenu {
        menu,
        status,
        jobs_item,
        jobs_head,
        run_slots,
        recent_slots,
        claiming,
        claim_head,
        claim_items,
        handoff,
        limits,
        limits_resume,
    })
}

fn update_menu<R: Runtime>(app: &AppHandle<R>, tm: &mut TrayMenu<R>, st: &Status) -> tauri::Result<()> {
    tm.status.set_text(state_line(st))?;
    // One fixed item for the running jobs' summary, then a line per source that does not
    // work here: inserting and removing items in a live appindicator menu left it unable to
    // open on xfce4-panel.
    let mut lines = job_lines(st);
    if lines.is_empty() {
        lines.push("No jobs running here".to_string());
    }
    lines.extend(source_lines(st));
    let engine = app.state::<AppState>().engine.clone();
    if let Some(v) = engine.last_hand_off() {
        lines.push(crate::tray_text::verdict_line(&v));
    }
    tm.jobs_item.set_text(lines.join("\n"))?;
    let Some(cache) = app.try_state::<TrayCache<R>>() else { return Ok(()) };
    let board = cache.board.lock().ok().and_then(|b| b.clone());
    let mut slots = Slots::default();
    // Running here, each opening its page.
    let running = job_lines(st);
    tm.jobs_head.set_text(crate::tray_text::jobs_title(st.running.len(), board.as_ref()))?;
    for (i, slot) in tm.run_slots.iter().enumerate() {
        match (running.get(i), st.running.get(i)) {
            (Some(line), Some(r)) => {
                slot.set_text(line)?;
                slot.set_enabled(true)?;
                slots.run.push(r.job.id);
            }
            _ => {
                slot.set_text("—")?;
                slot.set_enabled(false)?;
            }
        }
    }
    let recent = board.map(|b| b.recent).unwrap_or_default();
    for (i, slot) in tm.recent_slots.iter().enumerate() {
        match recent.get(i) {
            Some(o) => {
                slot.set_text(crate::tray_text::result_line(o))?;
                slot.set_enabled(true)?;
                slots.recent.push(o.job.id);
            }
            None => {
                slot.set_text(if i == 0 { "No results yet" } else { "—" })?;
                slot.set_enabled(false)?;
            }
        }
    }
    if let Ok(mut s) = cache.slots.lock() {
        *s = slots;
    }
    let can_dispatch = !matches!(st.state, S::NeedsAgent | S::Error | S::Starting | S::Stopped);
    tm.claim_head.set_text(crate::tray_text::claiming_title(st))?;
    tm.claiming.set_enabled(can_dispatch)?;
    let now = claim_item_of(st);
    for (m, (id, _)) in tm.claim_items.iter().zip(CLAIM_ITEMS) {
        m.set_checked(id == now)?;
    }
    tm.handoff.set_enabled(can_dispatch)?;
    update_limits(app, tm, &cache)
}

/// The Limits part: its lines and switch from the last read, shown only when it has something
/// to say.
fn update_limits<R: Runtime>(app: &AppHandle<R>, tm: &TrayMenu<R>, cache: &TrayCache<R>) -> tauri::Result<()> {
    let view = cache.limits.lock().ok().and_then(|l| l.clone());
    let part = view.as_ref().filter(|v| tray_limits::worth_showing(v));
    if let Some(v) = part {
        tm.limits.set_text(tray_limits::text(v))?;
        tm.limits_resume.set_checked(!v.limits_paused)?;
    }
    let show = part.is_some();
    let changed = cache.limits_shown.lock().map(|mut s| s.replace(show) != Some(show)).unwrap_or(true);
    if changed {
        if let Some(tray) = app.tray_by_id(TRAY_ID) {
            tray_limits::set_visible(&tray, LIMITS_PART, MENU_ITEMS, show);
        }
    }
    Ok(())
}

/// Which claiming item is checked: on, off, or the pause in force (a timed pause of another
/// length checks "30 minutes" or "1 hour" by its remaining time).
fn claim_item_of(st: &Status) -> &'static str {
    match (st.dispatch_enabled, st.paused, st.paused_until_unix_ms) {
        (false, _, _) => "claim_off",
        (true, false, _) => "claim_on",
        (true, true, None) => "claim_indef",
        (true, true, Some(until)) => {
            let left = until.saturating_sub(crate::tray_text::now_ms());
            if left > 30 * 60 * 1000 {
                "claim_60"
            } else {
                "claim_30"
            }
        }
    }
}

/// Sets the claiming control from the menu; the menu shows the outcome (its check marks are
/// set from the status, so a refused change is put back).
fn set_claiming<R: Runtime>(app: &AppHandle<R>, c: devpilot_app::Claiming) {
    let app = app.clone();
    let engine = app.state::<AppState>().engine.clone();
    tauri::async_runtime::spawn(async move {
        if let Err(e) = engine.set_claiming(c).await {
            tracing::warn!(error = %e, "cannot set claiming");
        }
        refresh_now(&app);
    });
}

/// What each menu item does.
pub fn on_menu<R: Runtime>(app: &AppHandle<R>, id: &str) {
    tracing::info!(item = id, "tray menu");
    let engine = app.state::<AppState>().engine.clone();
    match id {
        "claim_on" => set_claiming(app, devpilot_app::Claiming::On),
        "claim_30" => set_claiming(app, devpilot_app::Claiming::Paused { minutes: Some(30) }),
        "claim_60" => set_claiming(app, devpilot_app::Claiming::Paused { minutes: Some(60) }),
        "claim_indef" => set_claiming(app, devpilot_app::Claiming::Paused { minutes: None }),
        "claim_off" => set_claiming(app, devpilot_app::Claiming::Off),
        "queue" => crate::window::open(app, Some("queue")),
        "limits_resume" => set_resume_after_limits(app),
        slot if slot.starts_with("run_") || slot.starts_with("recent_") => {
            let job = app.try_state::<TrayCache<R>>().and_then(|c| {
                let s = c.slots.lock().ok()?;
                let (list, i) = match slot.strip_prefix("run_") {
                    Some(i) => (&s.run, i),
                    None => (&s.recent, slot.trim_start_matches("recent_")),
                };
                list.get(i.parse::<usize>().ok()?).copied()
            });
            if let Some(id) = job {
                crate::window::open(app, Some(&format!("job-{id}")));
            }
        }
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

    /// Every icon decodes, and they are six different pictures.
    #[test]
    fn six_distinct_icons() {
        let all = [Icon::Idle, Icon::Working, Icon::Paused, Icon::Off, Icon::Offline, Icon::Attention];
        for i in all {
            let img = i.image().unwrap();
            assert_eq!((img.width(), img.height()), (64, 64));
        }
        let mut pngs: Vec<&[u8]> = all.iter().map(|i| i.png()).collect();
        pngs.sort();
        pngs.dedup();
        assert_eq!(pngs.len(), 6);
    }
}
