#!/usr/bin/env python3
"""The window follows the desktop's dark or light style.

In the e2e's headless session, against the real app and a test double of the XDG desktop
portal's Settings interface (fake_portal.py, on the session bus):
- the desktop prefers dark: devpilot-tray --show opens a dark window (the page's dark
  background, #1e1e20, fills it);
- the user flips the desktop to light (the portal's SettingChanged): the open window turns
  light (#f7f7f8) without being reopened;
- the window closed, the desktop flips to dark again: the reopened window is dark.
tao used to do this with a thread that woke every 5 s for the life of the app; the app now
listens only while a window exists (src-tauri/src/theme.rs), and the idle cost is measured by
scripts/tray-footprint.sh.
"""
import os
import subprocess
import tempfile

import desk  # tests/desktop/desk.py (the script's folder is on sys.path)

ENV = os.environ
WORK = tempfile.mkdtemp(prefix="theme-", dir=ENV["E2E_WORK"])
ART = ENV["E2E_ARTIFACTS"]
TRAY = ENV["E2E_TRAY_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
DARK, LIGHT = (0x1E, 0x1E, 0x20), (0xF7, 0xF7, 0xF8)

CHECKS = desk.Checks("theme: ")
log, check, wait = CHECKS.log, CHECKS.check, CHECKS.wait


def env():
    return desk.tray_env(ENV, WORK, "theme")


def portal(method, *args):
    cmd = ["gdbus", "call", "--session", "--dest", "org.freedesktop.portal.Desktop", "--object-path",
           "/org/freedesktop/portal/desktop", "--method", f"dev.devpilot.test.FakePortal.{method}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout


def shade(name):
    """'dark' or 'light' when that background fills most of the window's screenshot (it is
    saved as an artifact), else None."""
    wid = (desk.window_ids(visible=True) or [None])[0]
    if wid is None:
        return None
    shot = os.path.join(ART, f"theme-{name}.png")
    subprocess.run(["import", "-window", wid, shot], check=False, env=ENV)
    if not os.path.exists(shot):
        return None
    # Below the header: the page's background, wherever the content leaves it bare.
    region = (0, 120, 900, 500)
    dark = desk.find_color(shot, DARK, region, tol=12)
    light = desk.find_color(shot, LIGHT, region, tol=12)
    n_dark, n_light = (dark or (0, 0, 0))[2], (light or (0, 0, 0))[2]
    if n_dark > 10 * max(n_light, 1):
        return "dark"
    if n_light > 10 * max(n_dark, 1):
        return "light"
    return None


def main():
    e = env()
    portal_log = os.path.join(ART, "theme-portal.log")
    fake = subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "fake_portal.py"), "1"],
                            stdout=open(portal_log, "w"), stderr=subprocess.STDOUT)
    app = None
    try:
        wait("the portal double owns its name", lambda: "ready" in open(portal_log).read(), timeout=20)
        wait("the session's tray host is up", lambda: desk.bus_name_owned("org.kde.StatusNotifierWatcher"), timeout=30)
        logf = open(os.path.join(ART, "theme-app.log"), "w")
        app = subprocess.Popen([TRAY, "--show"], env=e, stdout=logf, stderr=subprocess.STDOUT)
        wait("the window is on screen", desk.window_exists, timeout=60)
        wait("the desktop prefers dark: the window is dark", lambda: shade("dark") == "dark", timeout=30, every=1)

        portal("SetScheme", "2")
        wait("flipped to light, the open window turns light", lambda: shade("light") == "light", timeout=20, every=1)

        check("WM_DELETE_WINDOW sent", desk.close_window() >= 1)
        wait("the window is gone", lambda: not desk.window_exists(), timeout=20)
        portal("SetScheme", "1")
        subprocess.run([TRAY], env=e, timeout=30, stdout=logf, stderr=subprocess.STDOUT)
        wait("the window is back", lambda: desk.window_ids(visible=True), timeout=30)
        wait("flipped to dark while closed, the reopened window is dark", lambda: shade("reopened") == "dark",
             timeout=20, every=1)
        check("the app is still up", app.poll() is None)
        code = desk.sigterm_code(app)
        check("SIGTERM ends the app cleanly", code == 0, code)
        log("theme: ALL CHECKS PASSED")
    finally:
        if app is not None and app.poll() is None:
            app.kill()
        fake.kill()


if __name__ == "__main__":
    main()
