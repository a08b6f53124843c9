#!/usr/bin/env python3
"""Closing the window gives its memory back, and the window still comes back whole.

In the e2e's headless session, against the real app (no WebDriver: the window is closed the
way a window manager's close button does, WM_DELETE_WINDOW):
- start devpilot-tray with its window shown (once the tray host is up) and wait until the
  window is on screen and the app has seen the host;
- read how much of the window-only libraries (WebKitGTK, JavaScriptCore, Mesa, LLVM, ...) is
  resident in the app, by kind (/proc/PID/smaps);
- close the window: the app stays up in the tray, logs that it paged those libraries out, and
  their resident size falls by over a quarter;
- launch the app again (single instance: the running one opens its window): the window is
  back and painted (many colours, not a blank surface);
- SIGTERM: the app exits cleanly.
"""
import glob
import os
import re
import subprocess
import tempfile
import time

import desk  # tests/desktop/desk.py (the script's folder is on sys.path)

ENV = os.environ
WORK = tempfile.mkdtemp(prefix="window-", dir=ENV["E2E_WORK"])
ART = ENV["E2E_ARTIFACTS"]
TRAY = ENV["E2E_TRAY_BIN"]
# Must match WINDOW_ONLY in src-tauri/src/window.rs.
WINDOW_ONLY = re.compile(r"libwebkit2gtk|libjavascriptcoregtk|libicu|libflite|libgst|libLLVM|/dri/|libEGL|libGLX|libGLESv2|libgbm|libepoxy")


CHECKS = desk.Checks("window: ")
log, check, wait = CHECKS.log, CHECKS.check, CHECKS.wait


def env():
    e = desk.tray_env(ENV, WORK, "window-cycle")
    e.pop("DEVPILOT_WEBKIT_DEFAULTS", None)
    return e


def window_only_kb(pid):
    """Resident kB of the window-only libraries, by kind (from /proc/PID/smaps)."""
    kinds = ("Rss", "Pss", "Private_Clean", "Private_Dirty", "Shared_Clean")
    total, lib = dict.fromkeys(kinds, 0), False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                lib = len(head) > 5 and bool(WINDOW_ONLY.search(head[5]))
            elif lib and head[0].rstrip(":") in total:
                total[head[0].rstrip(":")] += int(head[1])
    return total


def mb(kinds):
    return ", ".join(f"{k} {v / 1024:.1f} MB" for k, v in kinds.items())


def app_log():
    text = ""
    for p in glob.glob(os.path.join(WORK, "data", "*", "logs", "*")):
        with open(p, errors="replace") as f:
            text += f.read()
    return text


def main():
    e = env()
    # This is the life of a window with a tray: without a host, closing would ask instead.
    wait("the session's tray host is up", lambda: desk.bus_name_owned("org.kde.StatusNotifierWatcher"), timeout=30)
    logf = open(os.path.join(ART, "window-cycle-app.log"), "w")
    app = subprocess.Popen([TRAY, "--show"], env=e, stdout=logf, stderr=subprocess.STDOUT)
    try:
        wait("the window is on screen", desk.window_exists, timeout=60)
        wait("the app logged the window open", lambda: "window opened" in app_log(), timeout=20)
        wait("the app sees the tray host",
             lambda: "a tray host shows the icon" in app_log() or "a tray host appeared" in app_log(), timeout=30)
        time.sleep(2)  # let the page paint once, so the GL stack is really in use
        before = window_only_kb(app.pid)
        log(f"window-only libraries with the window open: {mb(before)}")
        check("the window's libraries are resident while it is open", before["Rss"] > 20 * 1024, before)

        check("WM_DELETE_WINDOW sent", desk.close_window() >= 1)
        wait("the window is gone", lambda: not desk.window_exists(), timeout=20)
        wait("the app paged the window's libraries out",
             lambda: "paged out the window's libraries" in app_log(), timeout=40)
        after = window_only_kb(app.pid)
        log(f"window-only libraries with the window closed: {mb(after)}")
        # Resident pages do not leave a process that keeps them mapped unless memory runs
        # short, so without the page-out this stays where it was. Its clean pages go; pages
        # other processes still map, and relocated (dirty) pages with no swap, stay.
        check("their resident size fell by over a quarter", after["Rss"] < before["Rss"] * 0.75, (before, after))
        check("the app is still up in the tray", app.poll() is None)

        # A second launch hands over to the running app, which opens its window again.
        subprocess.run([TRAY], env=e, timeout=30, stdout=logf, stderr=subprocess.STDOUT)
        wid = wait("the window is back", lambda: (desk.window_ids(visible=True) or [None])[0], timeout=30)
        shot = os.path.join(ART, "window-cycle-reopened.png")

        def painted():
            subprocess.run(["import", "-window", wid, shot], check=False, env=ENV)
            n = desk.colours(shot)
            return n if n > 50 else None
        n = wait("the reopened window is painted", painted, timeout=30, every=1)
        log(f"reopened window: {n} colours")
        check("the app is still up after reopening", app.poll() is None)

        code = desk.sigterm_code(app)
        check("SIGTERM ends the app cleanly", code == 0, code)
        log("window: ALL CHECKS PASSED")
    finally:
        if app.poll() is None:
            app.kill()


if __name__ == "__main__":
    main()
