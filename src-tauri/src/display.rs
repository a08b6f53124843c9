//! Is there a graphical session to start in? Asked before the GUI toolkit is: tao's event
//! loop panics (exit 101, with a backtrace) when GTK cannot open a display, which tells a user
//! on SSH or a server nothing about what to do instead.

/// What the rest of the message says, whatever the reason: the headless way in.
const HEADLESS: &str = "On a headless machine (a server, or over SSH), run the engine on its own: `devpilot run`, \
or the systemd user unit the package installs (`systemctl --user enable --now devpilot`; see contrib/systemd). \
It is the same engine: it claims, runs and hands off jobs just as the tray app does.";

/// Why the tray app cannot start here; its text is the paragraph to print.
#[derive(Debug)]
pub enum NoDisplay {
    /// Neither DISPLAY nor WAYLAND_DISPLAY (nor WAYLAND_SOCKET) is set.
    Unset,
    /// GTK could not open the session `session` names, for the toolkit's reason `why`.
    Unopenable { session: String, why: String },
}

impl std::fmt::Display for NoDisplay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoDisplay::Unset => write!(
                f,
                "devpilot-tray: there is no graphical session here (neither DISPLAY nor WAYLAND_DISPLAY is set), \
                 so the tray app cannot start. {HEADLESS}"
            ),
            NoDisplay::Unopenable { session, why } => write!(
                f,
                "devpilot-tray: cannot open the graphical session ({session}: {why}), so the tray app cannot start. \
                 {HEADLESS}"
            ),
        }
    }
}

/// Ok when GTK can open the session's display (Wayland or X11). GTK decides (it also finds
/// a Wayland socket through WAYLAND_SOCKET or the default `wayland-0`); the variables only
/// word the message. Call on the main thread, before the app is built: GTK stays
/// initialised on it, and tao then reuses that.
pub fn check() -> Result<(), NoDisplay> {
    let Some(why) = toolkit_refusal() else { return Ok(()) };
    let set = |v: &str| std::env::var_os(v).is_some_and(|s| !s.is_empty());
    if !set("DISPLAY") && !set("WAYLAND_DISPLAY") && !set("WAYLAND_SOCKET") {
        return Err(NoDisplay::Unset);
    }
    Err(NoDisplay::Unopenable { session: session(), why })
}

/// Which session GTK was pointed at, for the message.
fn session() -> String {
    let var = |v: &str| std::env::var(v).ok().filter(|s| !s.is_empty());
    match (var("WAYLAND_DISPLAY"), var("DISPLAY")) {
        (Some(w), Some(d)) => format!("WAYLAND_DISPLAY={w}, DISPLAY={d}"),
        (Some(w), None) => format!("WAYLAND_DISPLAY={w}"),
        (None, Some(d)) => format!("DISPLAY={d}"),
        (None, None) => "no display".into(),
    }
}

/// The toolkit's reason it cannot start, if it cannot.
#[cfg(target_os = "linux")]
fn toolkit_refusal() -> Option<String> {
    gtk::init().err().map(|e| e.message.to_string())
}

#[cfg(not(target_os = "linux"))]
fn toolkit_refusal() -> Option<String> {
    None
}
