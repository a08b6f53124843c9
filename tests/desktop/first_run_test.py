#!/usr/bin/env python3
"""A first start on a desktop with no tray host, then a host arriving.

In the e2e's headless session, with its xfce4-panel stopped (so no StatusNotifierWatcher and
no XEmbed tray), against the real app with no settings file:
- the window opens at start by itself, on the first-run guide, and its header says there is
  no tray and how to get one;
- the guide, step by step (a screenshot of each, the ones in docs/):
  1. a shared PostgreSQL: a wrong password and a missing database get the CLI's errors, and
     the right ones connect;
  2. the agent: a missing program is named, a command on PATH is found;
  3. a real first job; finishing saves the settings (the password in the keychain, in no
     file) and the job runs to the end on that PostgreSQL;
- closing the window asks; "keep running in the background" closes it and the app stays up;
  a second launch of devpilot-tray brings the window back;
- starting xfce4-panel registers the icon, the app notices, and closing no longer asks;
- a start with settings present does not show the guide again.
"""
import os
import signal
import subprocess
import tempfile

import desk  # tests/desktop/desk.py (the script's folder is on sys.path)

ENV = os.environ
WORK = tempfile.mkdtemp(prefix="first-run-", dir=ENV["E2E_WORK"])
ART = ENV["E2E_ARTIFACTS"]
TRAY = ENV["E2E_TRAY_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
PROFILE_NAME = desk.PROFILE_NAME
CFG = os.path.join(WORK, "config", PROFILE_NAME, "config.toml")
PGPORT = ENV["E2E_PGPORT"]
with open(ENV["E2E_PGPW_FILE"]) as f:
    PGPW = f.read().strip()
WATCHER = "org.kde.StatusNotifierWatcher"
ITEM = "tray_icon_tray_app_devpilot"

CHECKS = desk.Checks("first run: ")
log, check, wait = CHECKS.log, CHECKS.check, CHECKS.wait
D = desk.WebDriver(log=log)
STARTED = []
# The app's pids (started by WebKitWebDriver under tauri-driver), found by its binary and this
# test's XDG_CONFIG_HOME as soon as it runs: it is ended by them, never by a name.
APP_MARKER = f"XDG_CONFIG_HOME={os.path.join(WORK, 'config')}"
APP_PIDS = []


def app_env():
    """A new user's app: its own config and data dirs, no DEVPILOT_* overrides."""
    e = {k: v for k, v in ENV.items() if not k.startswith("DEVPILOT_")}
    e.update({
        "XDG_CONFIG_HOME": os.path.join(WORK, "config"),
        "XDG_DATA_HOME": os.path.join(WORK, "data"),
        "DEVPILOT_LOG": "info",
        "DEVPILOT_NO_SLEEP_HOOK": "1",
        "NO_AT_BRIDGE": "1",
        "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={WORK}/no-system-bus",
    })
    return e


def app_log():
    return desk.app_log(os.path.join(WORK, "data"))


def shot(name):
    """The page as it is now, into the artifacts (docs/ holds copies of the guide's)."""
    D.painted()
    return D.screenshot(os.path.join(ART, f"{name}.png"))


def message(css, timeout=30):
    """Waits for a status line to say something other than "Connecting…"; (class, text)."""
    def said():
        cls, text = D.exec("const e = document.querySelector(arguments[0]); return [e.className, e.textContent];", css)
        return (cls, text) if cls in ("ok", "err", "warn") else None
    return wait(f"{css} answers", said, timeout=timeout)


def psql(sql):
    env = dict(ENV, PGPASSWORD=PGPW)
    subprocess.run([os.path.join(ENV["E2E_PGBIN"], "psql"), "-h", "127.0.0.1", "-p", PGPORT, "-U", "postgres",
                    "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-c", sql], env=env, check=True, capture_output=True)


def start_app(args=()):
    """Starts the app through tauri-driver and notes its pid."""
    D.start(TRAY, args)
    pids = wait("the app's pid is known", lambda: desk.app_pids(TRAY, APP_MARKER), timeout=20)
    APP_PIDS.extend(p for p in pids if p not in APP_PIDS)
    log(f"app pid(s): {pids}")


def tray_running():
    return any(desk.alive(p) for p in APP_PIDS)


def stop_session_panel():
    """Ends the session's xfce4-panel, by the pid session.sh started it with."""
    pid = int(ENV["SESSION_PANEL_PID"])
    left = desk.end_pids([pid])
    check("the session's panel ended on SIGTERM", not left, left)
    wait("the session's tray host is gone", lambda: not desk.bus_name_owned(WATCHER) and not desk.alive(pid), timeout=20)


def guide_database():
    check("the guide opens on step 1", D.visible("#g-step-1") and not D.visible("#g-step-2"))
    check("it offers this machine only, with the embedded file's path",
          (D.text("#g-embedded-path") or "").endswith("devpilot.sqlite"), D.text("#g-embedded-path"))
    D.click("input[name=g-db][value=postgres]")
    check("choosing PostgreSQL shows its fields", D.visible("#g-pg"))
    for css, value in (("#g-host", "127.0.0.1"), ("#g-port", PGPORT), ("#g-name", "guide"), ("#g-user", "postgres"),
                       ("#g-password", "not-the-password")):
        D.set(css, value)
    D.click("#g-test")
    cls, text = message("#g-db-msg")
    check("a wrong password gets the CLI's words", cls == "err" and "rejected the login for user 'postgres'" in text, text)
    D.set("#g-password", PGPW)
    D.click("#g-test")
    cls, text = message("#g-db-msg")
    check("a missing database is named", cls == "err" and "does not exist" in text and "guide" in text, text)
    psql("CREATE DATABASE guide")
    D.click("#g-test")
    cls, text = message("#g-db-msg")
    check("a new database connects, and the guide says it has no DevPilot tables yet",
          cls == "warn" and f"127.0.0.1:{PGPORT}/guide" in text and "no DevPilot tables yet" in text, text)
    check("and offers to set them up", D.visible("#g-setup"))
    D.click("#g-next")
    cls, text = message("#g-db-msg")
    check("Next tests again and waits for the tables",
          cls == "warn" and D.visible("#g-step-1") and not D.visible("#g-step-2"), text)
    D.click("#g-setup")
    cls, text = message("#g-db-msg")
    check("setting up creates them (devpilot migrate)", cls == "ok" and "tables are set up" in text, text)
    D.click("#g-test")
    cls, text = message("#g-db-msg")
    check("the right password and database connect", cls == "ok" and f"connected to 127.0.0.1:{PGPORT}/guide" in text, text)
    check("the test saved nothing", not os.path.exists(CFG))
    shot("first-run-1-where-jobs-live")
    D.click("#g-next")
    wait("Next goes to step 2 (after testing again)", lambda: D.visible("#g-step-2"), timeout=30)


def guide_agent():
    check("on a shared queue the demo agent is not offered",
          D.exec("return document.querySelector('input[name=g-agent][value=demo]').disabled"))
    D.click("input[name=g-agent][value=command]")
    D.set("#g-command", "devpilot-no-such-agent --go")
    D.click("#g-check")
    cls, text = message("#g-agent-msg")
    check("a missing program is named", cls == "err" and "'devpilot-no-such-agent' was not found" in text, text)
    D.click("#g-next")
    cls, text = message("#g-agent-msg")
    check("and Next checks again and stays on step 2", cls == "err" and D.visible("#g-step-2") and not D.visible("#g-step-3"), text)
    D.set("#g-command", f"python3 {os.path.join(HERE, 'agent.py')}")
    D.click("#g-check")
    cls, text = message("#g-agent-msg")
    check("a command on PATH is found, with its path", cls == "ok" and text.startswith("Found: /") and "python3" in text, text)
    shot("first-run-2-which-agent")
    D.click("#g-next")
    wait("Next goes to step 3", lambda: D.visible("#g-step-3"), timeout=20)
    check("step 3 offers GitHub and Linear, and 'Not now' is chosen",
          D.exec("return document.querySelector('input[name=g-tracker][value=none]').checked") and not D.visible("#g-connect"))
    D.click("input[name=g-tracker][value=github]")
    wait("GitHub's fields show", lambda: D.visible("#g-gh-repo") and D.visible("#g-gh-import") and not D.visible("#g-teams"), timeout=10)
    D.set("#g-gh-repo", "not a repository")
    D.click("#g-next")
    cls, text = message("#g-source-msg")
    check("a repository not named OWNER/REPO is said, and the guide stays", cls == "err" and "OWNER/REPO" in text
          and D.visible("#g-step-3"), text)
    D.set("#g-gh-repo", "acme/webapp")
    D.set("#g-clone", "~/src/webapp")
    shot("first-run-3-connect")
    D.click("input[name=g-tracker][value=none]")
    D.click("#g-next")
    wait("Not now goes to step 4", lambda: D.visible("#g-step-4"), timeout=20)


def guide_first_job():
    check("with a real agent the demo job is not offered, a real one is chosen",
          D.exec("return document.querySelector('input[name=g-job][value=demo]').disabled"
                 " && document.querySelector('input[name=g-job][value=real]').checked"))
    D.set("#g-title", "First job from the guide")
    D.set("#g-prompt", "Say hello from the first-run guide.")
    shot("first-run-4-first-job")
    D.click("#g-next")
    def opened():
        h = D.exec("return location.hash")
        if not h.startswith("#job-"):
            raise RuntimeError(f"at {h}, the guide says {D.text('#g-msg')!r}")
        return h
    hash_ = wait("Finish saves and opens the job", opened, timeout=60)
    jid = int(hash_[len("#job-"):])
    job = wait("the first job runs to the end on the shared PostgreSQL",
               lambda: (j := D.invoke("job_detail", {"id": jid})["job"])["state"] == "completed" and j, timeout=60)
    log(f"first job: {job['id']} {job['state']} on {job['claimed_by']}")
    with open(CFG) as f:
        cfg = f.read()
    check("the settings file holds the database URL, without the password",
          f"postgres://postgres@127.0.0.1:{PGPORT}/guide" in cfg and PGPW not in cfg, cfg)
    check("and the agent", "agent.py" in cfg, cfg)
    leaked = CHECKS.files_holding(PGPW, os.path.join(WORK, "config"), os.path.join(WORK, "data"))
    check("the password is in no file", leaked.strip() == "", leaked)
    found = subprocess.run(["secret-tool", "search", "--all", "service", PROFILE_NAME], capture_output=True, text=True)
    check("the password is in the keychain", f"secret = {PGPW}" in found.stdout, found.stdout + found.stderr)


def no_tray_close_asks():
    check("the window says there is no tray, and how to get one",
          D.visible("#tray-notice") and "No tray on this desktop" in D.text("#tray-notice")
          and "AppIndicator extension" in D.text("#tray-notice"), D.text("#tray-notice"))
    check("WM_DELETE_WINDOW sent", desk.close_window() >= 1)
    wait("closing asks whether to quit or keep running", lambda: D.visible("#close"), timeout=20)
    check("the window is still there", desk.window_exists())
    check("the question offers both", "Quit (hand off first)" in D.text("#close") and
          "Keep running in the background" in D.text("#close"), D.text("#close"))
    shot("no-tray-close-asks")
    check("keep running is clicked", D.click_soon("#close-background"))
    wait("keep running closes the window", lambda: not desk.window_exists(), timeout=20)
    wait("the app says it runs on in the background", lambda: "still running in the background" in app_log(), timeout=10)
    check("the app is still up", tray_running())
    subprocess.run([TRAY], env=app_env(), timeout=30, capture_output=True)
    wait("a second launch brings the window back", desk.window_exists, timeout=30)


def host_arrives():
    panel = subprocess.Popen(["xfce4-panel", "--disable-wm-check"], env=ENV, stdout=subprocess.DEVNULL,
                             stderr=open(os.path.join(WORK, "panel.log"), "w"))
    STARTED.append(panel)
    wait("with xfce4-panel started, the icon registers", lambda: ITEM in desk.sni_items(), timeout=40)
    wait("the app sees the host", lambda: "a tray host appeared" in app_log(), timeout=40)
    check("WM_DELETE_WINDOW sent", desk.close_window() >= 1)
    wait("with a tray, closing closes the window without asking", lambda: not desk.window_exists(), timeout=20)
    check("the app is still up, in the tray", tray_running())
    D.end()
    check("the app's pid is known", APP_PIDS, APP_PIDS)
    for p in APP_PIDS:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    wait("SIGTERM ends it", lambda: not tray_running(), timeout=30)


def no_guide_again():
    start_app(["--show"])
    wait("the window opens (--show)", lambda: D.visible("#fleet") or D.visible("#guide"), timeout=30)
    check("with settings present, the guide does not show", D.visible("#fleet") and not D.visible("#guide"))
    check("and the app says it is not needed", D.invoke("guide_state")["needed"] is False)
    check("with a tray, no notice", not D.visible("#tray-notice"))
    D.end()


def main():
    stop_session_panel()
    drv = subprocess.Popen(["tauri-driver"], env=app_env(), stdout=subprocess.DEVNULL,
                           stderr=open(os.path.join(WORK, "tauri-driver.log"), "w"))
    STARTED.append(drv)
    wait("tauri-driver listens", lambda: D.request("GET", "/status") is not None, timeout=20)
    # No --show: with no tray host the window must open by itself, or there is no session.
    start_app()
    wait("no tray host: the window opened at start", lambda: "window opened" in app_log(), timeout=30)
    check("the app logged why", "no tray host on this desktop" in app_log())
    wait("the first start opens on the guide", lambda: D.visible("#guide"), timeout=20)
    guide_database()
    guide_agent()
    guide_first_job()
    no_tray_close_asks()
    host_arrives()
    no_guide_again()
    log(f"first run: ALL {len(CHECKS.results)} CHECKS PASSED")


if __name__ == "__main__":
    try:
        main()
    finally:
        D.end()
        desk.end_started(STARTED)
        desk.end_pids([p for p in desk.app_pids(TRAY, APP_MARKER) if p in APP_PIDS])
