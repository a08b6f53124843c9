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
//! signal). Without a host the window is the app's face ([`crate::window`]).

use std::time::Duration;

use futures_util::StreamExt;
use tauri::{AppHandle, Emitter, Manager, Runtime};
use tokio::sync::watch;

use crate::AppState;

const WATCHER: &str = "org.kde.StatusNotifierWatcher";
/// How long the check at start may take before we assume there is no host.
const START_CHECK: Duration = Duration::from_secs(3);
/// XEmbed has no signal on the bus; its tray is looked for this often.
const XEMBED_POLL: Duration = Duration::from_secs(5);
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

/// Whether a tray host shows the icon, as last seen. Starts as "yes" so nothing asks before
/// the first check has answered.
pub struct TrayHost {
    tx: watch::Sender<bool>,
}

impl Default for TrayHost {
    fn default() -> Self {
        Self { tx: watch::Sender::new(true) }
    }
}

impl TrayHost {
    pub fn present(&self) -> bool {
        *self.tx.borrow()
    }
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

    async fn present(&self) -> bool {
        self.sni_host().await || (self.x11 && xembed_tray())
    }

    /// The watcher exists and says a host registered with it.
    async fn sni_host(&self) -> bool {
        let Some(bus) = &self.bus else { return false };
        let (Ok(dbus), Ok(name)) = (zbus::fdo::DBusProxy::new(bus).await, zbus::names::BusName::try_from(WATCHER))
        else {
            return false;
        };
        let owned = dbus.name_has_owner(name).await.unwrap_or(false);
        if !owned {
            return false;
        }
        let watcher =
            StatusNotifierWatcherProxy::builder(bus).cache_properties(zbus::proxy::CacheProperties::No).build().await;
        match watcher {
            // A watcher that cannot say is taken at its word that it exists.
            Ok(w) => w.is_status_notifier_host_registered().await.unwrap_or(true),
            Err(_) => true,
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
        let Some(x) = XLIB.get_or_init(|| x11_dl::xlib::Xlib::open().ok()) else { return false };
        // SAFETY: a private connection of our own, opened, asked two questions and closed
        // here; every pointer passed is either it or a NUL-terminated string that outlives
        // the call.
        unsafe {
            let d = (x.XOpenDisplay)(std::ptr::null());
            if d.is_null() {
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
    let (probe, present) = tauri::async_runtime::block_on(async move {
        let probe = Probe::new(x11).await;
        let present = tokio::time::timeout(START_CHECK, probe.present()).await.unwrap_or(false);
        (probe, present)
    });
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
    let poll = if probe.x11 { XEMBED_POLL } else { BUS_POLL };
    loop {
        tokio::select! {
            Some(()) = async { match changes.as_mut() { Some(s) => s.next().await, None => std::future::pending().await } } => {
                tokio::time::sleep(SETTLE).await;
            }
            () = tokio::time::sleep(poll) => {}
        }
        let now = probe.present().await;
        if now == present {
            continue;
        }
        present = now;
        set(&app, now);
        if now {
            tracing::info!("a tray host appeared: the icon is shown there");
        } else {
            tracing::warn!("the tray host went away: opening the window, the only way left to reach the app");
            crate::window::open(&app, None);
        }
    }
}

fn set<R: Runtime>(app: &AppHandle<R>, present: bool) {
    app.state::<AppState>().tray_host.tx.send_replace(present);
    let _ = app.emit("tray-host", present);
}
