//! Is anyone showing our icon? libappindicator creates it whether or not a tray host exists
//! (it logs nothing), so on stock GNOME or a bare tiling window manager the icon is nowhere
//! and the app would be unreachable once its window closed. A host is either:
//! - a StatusNotifierWatcher on the session bus with a host registered (KDE, xfce4-panel,
//!   GNOME with the AppIndicator extension, waybar...), or
//! - on X11, an XEmbed system tray: the owner of `_NET_SYSTEM_TRAY_S<screen>` (trayer,
//!   older panels), which libappindicator falls back to.
//!
//! Checked at start (the answer decides whether the window opens), then kept current: the
//! watcher's name and host signals on the bus, plus a slow poll for XEmbed (it has no bus
//! signal), in [`crate::state::TrayHost`]. Without a host the window is the app's face
//! ([`crate::window`]).

use std::time::Duration;

use futures_util::StreamExt;
use tauri::{AppHandle, Emitter, Manager, Runtime};

use crate::state::AppState;

const WATCHER: &str = "org.kde.StatusNotifierWatcher";
/// How long the check at start may take before we assume there is no host.
const START_CHECK: Duration = Duration::from_secs(3);
/// XEmbed has no signal on the bus; while no tray shows the icon, one is looked for this
/// often (the window is open meanwhile, so an appearing tray is taken up soon).
const XEMBED_POLL: Duration = Duration::from_secs(5);
/// While a tray shows the icon, it is looked at this often: each look is a D-Bus round trip
/// and an Xlib call on the main thread, most of an idle tray's wake-ups at 5 s. The bus's
/// signals still say at once when a StatusNotifier host goes; an XEmbed tray that goes is
/// noticed within this, and the window opens then.
const XEMBED_PRESENT_POLL: Duration = Duration::from_secs(30);
/// With only the bus to watch, a poll this slow is a safety net for a missed signal.
const BUS_POLL: Duration = Duration::from_secs(30);
/// A host that restarts (a panel reloading) comes back within this; do not react before.
const SETTLE: Duration = Duration::from_millis(1500);

#[zbus::proxy(
    interface = "org.kde.StatusNotifierWatcher",
    default_service = "org.kde.StatusNotifierWatcher",
    default_path = "/StatusNotifierWatcher"
)]
trait StatusNotifierWatcher {
    #[zbus(property)]
    fn is_status_notifier_host_registered(&self) -> zbus::Result<bool>;
}

/// Where the checks look: the session bus (if any) and, when GTK talks X11, the X server.
struct Probe {
    bus: Option<zbus::Connection>,
    x11: bool,
}

impl Probe {
    async fn new(x11: bool) -> Self {
        let bus = match zbus::Connection::session().await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::info!(error = %e, "no session bus: only an XEmbed tray can show the icon");
                None
            }
        };
        Self { bus, x11 }
    }

    /// On the main thread (at start): the XEmbed check may talk Xlib here.
    async fn present_here(&self) -> bool {
        self.sni_host().await || (self.x11 && xembed_tray())
    }

    /// From a background task: the XEmbed check runs on the main thread, where GTK's own
    /// Xlib calls are (Xlib was not initialised for threads).
    async fn present<R: Runtime>(&self, app: &AppHandle<R>) -> bool {
        if self.sni_host().await {
            return true;
        }
        if !self.x11 {
            return false;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        if let Err(e) = app.run_on_main_thread(move || {
            let _ = tx.send(xembed_tray());
        }) {
            tracing::debug!(error = %e, "cannot look for an XEmbed tray");
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// The watcher exists and says a host registered with it.
    async fn sni_host(&self) -> bool {
        let Some(bus) = &self.bus else { return false };
        let (Ok(dbus), Ok(name)) = (zbus::fdo::DBusProxy::new(bus).await, zbus::names::BusName::try_from(WATCHER))
        else {
            tracing::debug!("cannot ask the session bus about the StatusNotifierWatcher");
            return false;
        };
        let owned = dbus.name_has_owner(name).await.unwrap_or_else(|e| {
            tracing::debug!(error = %e, "NameHasOwner failed");
            false
        });
        if !owned {
            return false;
        }
        let watcher =
            StatusNotifierWatcherProxy::builder(bus).cache_properties(zbus::proxy::CacheProperties::No).build().await;
        match watcher {
            // A watcher that cannot say is taken at its word that it exists.
            Ok(w) => w.is_status_notifier_host_registered().await.unwrap_or_else(|e| {
                tracing::debug!(error = %e, "the StatusNotifierWatcher cannot say whether a host registered");
                true
            }),
            Err(e) => {
                tracing::debug!(error = %e, "no proxy for the StatusNotifierWatcher");
                true
            }
        }
    }

    /// The watcher's name changing hands, and its host signals: a stream that yields on each.
    async fn changes(&self) -> Option<futures_util::stream::BoxStream<'static, ()>> {
        let bus = self.bus.as_ref()?;
        let owner = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender("org.freedesktop.DBus")
            .ok()?
            .member("NameOwnerChanged")
            .ok()?
            .add_arg(WATCHER)
            .ok()?
            .build();
        let hosts = zbus::MatchRule::builder().msg_type(zbus::message::Type::Signal).interface(WATCHER).ok()?.build();
        let a = zbus::MessageStream::for_match_rule(owner, bus, Some(8)).await.ok()?;
        let b = zbus::MessageStream::for_match_rule(hosts, bus, Some(8)).await.ok()?;
        Some(futures_util::stream::select(a, b).map(|_| ()).boxed())
    }
}

/// Whether GDK's display is an X11 one (only there can an XEmbed tray show the icon).
/// Main thread only, after GTK is initialised.
pub fn gdk_is_x11() -> bool {
    #[cfg(target_os = "linux")]
    {
        use gtk::prelude::*;
        gtk::gdk::Display::default().is_some_and(|d| d.type_().name() == "GdkX11Display")
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// The XEmbed system tray of the default screen has an owner.
fn xembed_tray() -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::sync::OnceLock;
        static XLIB: OnceLock<Option<x11_dl::xlib::Xlib>> = OnceLock::new();
        let xlib = XLIB.get_or_init(|| {
            x11_dl::xlib::Xlib::open()
                .inspect_err(|e| tracing::info!(error = %e, "cannot load libX11: no XEmbed tray check"))
                .ok()
        });
        let Some(x) = xlib else { return false };
        // SAFETY: a private connection of our own, opened, asked two questions and closed
        // here; every pointer passed is either it or a NUL-terminated string that outlives
        // the call.
        unsafe {
            let d = (x.XOpenDisplay)(std::ptr::null());
            if d.is_null() {
                tracing::debug!("cannot open the X display to look for an XEmbed tray");
                return false;
            }
            let atom = match std::ffi::CString::new(format!("_NET_SYSTEM_TRAY_S{}", (x.XDefaultScreen)(d))) {
                Ok(name) => (x.XInternAtom)(d, name.as_ptr(), 1),
                Err(_) => 0,
            };
            let owner = if atom == 0 { 0 } else { (x.XGetSelectionOwner)(d, atom) };
            (x.XCloseDisplay)(d);
            owner != 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// The check at start: blocks (at most [`START_CHECK`]) so the caller knows whether the
/// window must open. Then keeps the answer current in the background: the window is told
/// (`tray-host`), and when the host goes away the window opens, since it is the only way
/// left to reach the app.
pub fn start<R: Runtime>(app: &AppHandle<R>) -> bool {
    let x11 = gdk_is_x11();
    // All of it under the limit: a session bus that does not answer must not hold up the
    // start (the GTK main thread waits here).
    let checked = tauri::async_runtime::block_on(async move {
        tokio::time::timeout(START_CHECK, async move {
            let probe = Probe::new(x11).await;
            let present = probe.present_here().await;
            (probe, present)
        })
        .await
    });
    let (probe, present) = match checked {
        Ok(found) => found,
        Err(_) => {
            tracing::warn!("the tray host check did not answer within {START_CHECK:?}; taking it there is none");
            (Probe { bus: None, x11 }, false)
        }
    };
    set(app, present);
    if present {
        tracing::info!(x11, "a tray host shows the icon");
    } else {
        tracing::warn!(x11, "no tray host on this desktop (no StatusNotifierWatcher with a host, no XEmbed tray): the window is the app's face");
    }
    let app = app.clone();
    tauri::async_runtime::spawn(async move { follow(app, probe, present).await });
    present
}

async fn follow<R: Runtime>(app: AppHandle<R>, probe: Probe, mut present: bool) {
    let mut changes = probe.changes().await;
    if changes.is_none() {
        tracing::info!(
            "not following the tray host's bus signals; looking again every {:?}",
            if probe.x11 { (XEMBED_POLL, XEMBED_PRESENT_POLL) } else { (BUS_POLL, BUS_POLL) }
        );
    }
    loop {
        let poll = match (probe.x11, present) {
            (true, false) => XEMBED_POLL,
            (true, true) => XEMBED_PRESENT_POLL,
            (false, _) => BUS_POLL,
        };
        tokio::select! {
            Some(()) = async { match changes.as_mut() { Some(s) => s.next().await, None => std::future::pending().await } } => {
                tokio::time::sleep(SETTLE).await;
            }
            () = devpilot_app::timer::sleep(poll) => {}
        }
        let now = probe.present(&app).await;
        if now == present {
            continue;
        }
        present = now;
        set(&app, now);
        if now {
            tracing::info!("a tray host appeared: the icon is shown there");
        } else {
            tracing::warn!("the tray host went away: showing the window, the only way left to reach the app");
            crate::window::raise(&app);
        }
    }
}

fn set<R: Runtime>(app: &AppHandle<R>, present: bool) {
    app.state::<AppState>().tray_host.set(present);
    let _ = app.emit("tray-host", present);
}
