#!/usr/bin/env python3
"""The desktop test's core checks under Wayland, in a headless Weston.

In the e2e's D-Bus session: Weston's headless backend (pixman renderer, --debug so its
screenshooter may capture the output), and the real app as a Wayland client (no DISPLAY,
GDK_BACKEND=wayland), started through tauri-driver:
- the app starts, and GTK runs on Wayland (the app logs x11=false);
- the window paints: Weston's own capture of its output has many colours (and WebKit's
  snapshot of the page shows the state pill);
- the tray registers where a host exists: xfce4-panel (an X11 client on the session's Xvfb;
  a StatusNotifierItem host is a D-Bus service, whatever the display) lists the icon;
- the engine runs a demo job to the end, and its notification is sent.
"""
import glob
import os
import subprocess
import tempfile
import time

import desk  # tests/desktop/desk.py (the script's folder is on sys.path)

ENV = os.environ
WORK = tempfile.mkdtemp(prefix="wayland-", dir=ENV["E2E_WORK"])
ART = ENV["E2E_ARTIFACTS"]
TRAY = ENV["E2E_TRAY_BIN"]
SOCKET = "devpilot-e2e-wayland"
ITEM = "tray_icon_tray_app_devpilot"

CHECKS = desk.Checks("wayland: ")
log, check, wait = CHECKS.log, CHECKS.check, CHECKS.wait
D = desk.WebDriver(log=log)
STARTED = []
# The app's pids (started by WebKitWebDriver under tauri-driver), found by its binary and this
# test's XDG_CONFIG_HOME: it is ended by them, never by a name.
APP_MARKER = f"XDG_CONFIG_HOME={os.path.join(WORK, 'config')}"
APP_PIDS = []


def app_env():
    """A Wayland client: no X display at all, so nothing can fall back to X11 unnoticed."""
    e = {k: v for k, v in ENV.items() if not k.startswith("DEVPILOT_") and k != "DISPLAY"}
    e.update({
        "WAYLAND_DISPLAY": SOCKET,
        "GDK_BACKEND": "wayland",
        "XDG_CONFIG_HOME": os.path.join(WORK, "config"),
        "XDG_DATA_HOME": os.path.join(WORK, "data"),
        "DEVPILOT_DATABASE_URL": f"sqlite://{os.path.join(WORK, 'queue.sqlite')}",
        "DEVPILOT_ORCHESTRATOR": "wayland",
        "DEVPILOT_LOG": "info",
        "DEVPILOT_NO_SLEEP_HOOK": "1",
        "NO_AT_BRIDGE": "1",
        "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={WORK}/no-system-bus",
    })
    return e


def app_log():
    return desk.app_log(os.path.join(WORK, "data"))


def start(name, argv, env, cwd=None):
    p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                         stderr=open(os.path.join(WORK, f"{name}.log"), "w"))
    STARTED.append(p)
    return p


def weston_capture():
    """Weston's own screenshot of its output (what reached the compositor, not the page's
    snapshot); returns its colour count once the capture shows a painted window."""
    for old in glob.glob(os.path.join(WORK, "wayland-screenshot-*.png")):
        os.remove(old)
    subprocess.run(["weston-screenshooter"], env=dict(app_env()), cwd=WORK, timeout=20, capture_output=True)
    shots = glob.glob(os.path.join(WORK, "wayland-screenshot-*.png"))
    if not shots:
        return None
    os.replace(shots[0], os.path.join(ART, "wayland-weston-output.png"))
    n = desk.colours(os.path.join(ART, "wayland-weston-output.png"))
    return n if n > 200 else None


def notifications():
    with open(os.path.join(ENV["E2E_WORK"], "notify-monitor.log"), errors="replace") as f:
        return f.read()


def main():
    weston_env = dict(ENV)
    weston_env.pop("DISPLAY", None)
    start("weston", ["weston", "--backend=headless-backend.so", f"--socket={SOCKET}", "--width=1280",
                     "--height=800", "--idle-time=0", "--use-pixman", "--debug"], weston_env)
    wait("Weston listens", lambda: os.path.exists(os.path.join(ENV["XDG_RUNTIME_DIR"], SOCKET)), timeout=20)
    # A tray host on the session bus (drawn on the session's Xvfb).
    start("panel", ["xfce4-panel", "--disable-wm-check"], ENV)
    wait("a tray host is up", lambda: desk.bus_name_owned("org.kde.StatusNotifierWatcher"), timeout=30)
    start("tauri-driver", ["tauri-driver"], app_env())
    wait("tauri-driver listens", lambda: D.request("GET", "/status") is not None, timeout=20)

    D.start(TRAY, ["--show"])
    APP_PIDS.extend(wait("the app's pid is known", lambda: desk.app_pids(TRAY, APP_MARKER), timeout=20))
    wait("the app starts and its window opens", lambda: "window opened" in app_log(), timeout=30)
    check("GTK runs on Wayland, not X11", "x11=false" in app_log(), [ln for ln in app_log().splitlines() if "x11=" in ln])
    state = wait("the page shows the state pill", lambda: (t := D.text("#state") or "").startswith("Idle") and t, timeout=30)
    log(f"state pill: {state}")
    D.painted()
    page = D.screenshot(os.path.join(ART, "wayland-page.png"))
    check("WebKit's snapshot of the page is painted", desk.colours(page) > 200, desk.colours(page))
    n = wait("Weston's own capture of its output shows the painted window", weston_capture, timeout=30, every=1)
    log(f"Weston output: {n} colours")

    wait("the icon registers with the tray host", lambda: ITEM in desk.sni_items(), timeout=30)

    added = D.invoke("enqueue_demo", {"key": None})
    wait("the engine runs a demo job to the end",
         lambda: D.invoke("job_detail", {"id": added["id"]})["job"]["state"] == "completed", timeout=60)
    # Titled with the job; its body says it finished, naming the job's id.
    wait("its notification is sent", lambda: f"(#{added['id']})" in notifications() and "Finished Demo job" in notifications(), timeout=30)
    D.end()
    log(f"wayland: ALL {len(CHECKS.results)} CHECKS PASSED")


if __name__ == "__main__":
    try:
        main()
    finally:
        D.end()
        desk.end_pids([p for p in desk.app_pids(TRAY, APP_MARKER) if p in APP_PIDS])
        desk.end_started(STARTED)
