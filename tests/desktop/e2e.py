#!/usr/bin/env python3
"""Drives the real devpilot-tray inside the headless session that e2e.sh set up, and
asserts on what it observes: D-Bus, the X screen, the window's DOM (WebDriver), the queue
(the `devpilot` CLI on the same SQLite file), the keychain (secret-tool) and the files.

Every check prints PASS/FAIL; the first failure ends the run with exit code 1.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse

import desk  # tests/desktop/desk.py (the script's folder is on sys.path)
import sources_step  # tests/desktop/sources_step.py
import github_step  # tests/desktop/github_step.py
import transcript_step  # tests/desktop/transcript_step.py

ENV = os.environ
WORK = ENV["E2E_WORK"]
ART = ENV["E2E_ARTIFACTS"]
TRAY = ENV["E2E_TRAY_BIN"]
CLI = ENV["E2E_CLI_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
PROFILE_NAME = "devpilot-dev" if ENV.get("E2E_PROFILE", "debug") == "debug" else "devpilot"
ORCH = "e2e"
DB = os.path.join(WORK, "queue.sqlite")
AGENT = f"python3 {os.path.join(HERE, 'agent.py')}"
MACHINE = os.uname().nodename
WD = "http://127.0.0.1:4444"
CFG_DIR = os.path.join(ENV["XDG_CONFIG_HOME"], PROFILE_NAME)
CFG = os.path.join(CFG_DIR, "config.toml")
# Not this machine's zone (UTC here), so "paused until HH:MM" proves local time is used; the
# test reads the clock in the same zone.
TZ = "Asia/Kolkata"
os.environ["TZ"] = TZ
time.tzset()

STARTED = []  # (name, Popen) we started, ended by pid at exit
# The app is started by WebKitWebDriver (under tauri-driver): its pid is looked up once it
# runs, by its binary and this run's XDG_CONFIG_HOME, and kept here to end it by.
APP_MARKER = f"XDG_CONFIG_HOME={ENV['XDG_CONFIG_HOME']}"
APP_PIDS = []
CHECKS = desk.Checks()
DRIVER = desk.WebDriver(WD, log=CHECKS.log)
RESULTS = CHECKS.results
log, check, wait = CHECKS.log, CHECKS.check, CHECKS.wait
files_holding = CHECKS.files_holding


def app_env():
    e = dict(ENV)
    e.update({
        "DEVPILOT_DATABASE_URL": f"sqlite://{DB}",
        "DEVPILOT_ORCHESTRATOR": ORCH,
        "DEVPILOT_AGENT": AGENT,
        "DEVPILOT_LOG": "info,devpilot=debug",
        "DEVPILOT_NO_SLEEP_HOOK": "1",
        "NO_AT_BRIDGE": "1",
        "TZ": TZ,
        # No logind here, for certain: keep awake must say so and carry on.
        "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={WORK}/no-system-bus",
    })
    if github_step.URL:
        # GitHub is the stand-in (github_step.py), and a link the app opens is recorded.
        e["DEVPILOT_GITHUB_API_URL"] = github_step.URL
        e["PATH"] = f"{github_step.fake_bin()}:{e['PATH']}"
    return e


def cli(*args, machine_env=None):
    r = subprocess.run([CLI, *args], env=app_env(), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"devpilot {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def status():
    return json.loads(cli("status", "--orchestrator", ORCH, "--json"))


def enqueue(payload, *flags):
    return int(cli("enqueue", "--orchestrator", ORCH, "--payload", json.dumps(payload), *flags).strip())


def job_state(jid):
    s = status()
    for j in s["running"]:
        if j["id"] == jid:
            return "running", j
    return None, None


def make_repo(root):
    """A bare remote with one commit on main, and a clone of it; returns (remote, clone)."""
    remote, seed, clone = (os.path.join(root, n) for n in ("webapp.git", "seed", "webapp"))
    g = lambda *a, cwd=root: subprocess.run(["git", "-c", "user.name=e2e", "-c", "user.email=e2e@example.invalid", *a],
                                            cwd=cwd, check=True, capture_output=True)
    os.makedirs(seed, exist_ok=True)
    g("init", "--quiet", "--bare", "--initial-branch=main", remote)
    g("init", "--quiet", "--initial-branch=main", cwd=seed)
    with open(os.path.join(seed, "README.md"), "w") as f:
        f.write("webapp\n")
    g("add", "-A", cwd=seed)
    g("commit", "--quiet", "-m", "seed", cwd=seed)
    g("push", "--quiet", remote, "main", cwd=seed)
    g("clone", "--quiet", remote, clone)
    return remote, clone


def sqlite_job(jid):
    # The CLI has no per-job query; read through the window's command instead when needed.
    return wd_invoke("job_detail", {"id": jid})


def painted():
    """Waits until the page has rendered two more frames, so a screenshot shows the DOM as it
    is now (under load, WebKit's software compositing can paint a second or more late)."""
    try:
        wd("POST", f"/session/{SESSION}/execute/async", {
            "script": "const done = arguments[0]; requestAnimationFrame(() => requestAnimationFrame(() => done(true)));",
            "args": []})
    except Exception:  # noqa: BLE001 (no session yet, or the page is gone: just take the shot)
        pass
    time.sleep(0.5)


def shot(name):
    if SESSION:
        painted()
    path = os.path.join(ART, f"{name}.png")
    subprocess.run(["import", "-window", "root", path], check=True, env=ENV)
    return path


def notify_log():
    with open(os.path.join(WORK, "notify-monitor.log"), errors="replace") as f:
        return f.read()


def app_log():
    """The app's own log files (daily-rotated) under its data dir."""
    d = os.path.join(ENV["XDG_DATA_HOME"], PROFILE_NAME, "logs")
    text = ""
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if name.startswith("devpilot-tray"):
            with open(os.path.join(d, name), errors="replace") as f:
                text += f.read()
    return text


def config_text():
    with open(CFG) as f:
        return f.read()


def saved_message():
    """Waits for the settings form's save to finish and returns what it says."""
    return wait("the save finishes", lambda: (t := wd_text("#settings-msg")) not in (None, "", "Checking…") and t, timeout=30)


# ------------------------------------------------------------------ WebDriver

SESSION = None


def wd(method, path, body=None, idempotent=False):
    """One WebDriver request (desk.WebDriver.request: sent again when the connection drops).
    `idempotent` is kept as documentation."""
    return DRIVER.request(method, path, body)


# The page's commands, through desk.WebDriver on this run's session (set in main).
def wd_exec(script, args=None, idempotent=False):
    return DRIVER.exec(script, *(args or []))


def wd_invoke(cmd, args=None):
    """Calls a Tauri command from inside the page; raises with the command's error."""
    return DRIVER.invoke(cmd, args)


wd_text, wd_click, wd_set = DRIVER.text, DRIVER.click, DRIVER.set


# ------------------------------------------------------------------ tray

sni_items = desk.sni_items


def sni_item():
    """(bus name, object path) of DevPilot's StatusNotifierItem, from the watcher's list."""
    for entry in re.findall(r"'([^']+)'", sni_items()):
        name, _, path = entry.partition("/")
        if "tray_icon_tray_app_devpilot" in path:
            return name, "/" + path
    raise RuntimeError(f"no DevPilot item registered: {sni_items()!r}")


def sni_prop(prop):
    """One StatusNotifierItem property, read over D-Bus as a tray host reads it (gdbus), as a
    string; raises with gdbus's words when there is no such property."""
    name, path = sni_item()
    r = subprocess.run(["gdbus", "call", "--session", "--dest", name, "--object-path", path, "--method",
                        "org.freedesktop.DBus.Properties.Get", "org.kde.StatusNotifierItem", prop],
                       capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip())
    m = re.fullmatch(r"\(<(['\"])(.*)\1>,\)", r.stdout.strip(), re.S)
    if not m:
        raise RuntimeError(f"not a string property: {r.stdout!r}")
    return re.sub(r"\\(.)", r"\1", m.group(2))


def tray_menu_layout():
    """The tray menu as the host reads it (com.canonical.dbusmenu GetLayout), via dbusmenu.py."""
    name, path = sni_item()
    menu = subprocess.run(["gdbus", "call", "--session", "--dest", name, "--object-path", path, "--method",
                           "org.freedesktop.DBus.Properties.Get", "org.kde.StatusNotifierItem", "Menu"],
                          capture_output=True, text=True, timeout=10, check=True).stdout
    menu_path = re.search(r"objectpath '([^']+)'", menu).group(1)
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "dbusmenu.py"), name, menu_path],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    return json.loads(out)


def tray_menu_labels():
    return [c["label"] for c in tray_menu_layout()["children"] if c["type"] != "separator" and c["visible"]]


def claiming_now():
    """What the tray's claiming control says it is set to ("Now: on"), its first line."""
    return tray_submenu("Claiming")[1][0][0]


def tray_submenu(label_prefix):
    """The labels (and whether enabled) of the tray submenu whose label starts so."""
    sub = next(c for c in tray_menu_layout()["children"] if c.get("label", "").startswith(label_prefix))
    return sub["label"], [(c["label"], c["enabled"]) for c in sub["children"] if c["type"] != "separator"]


def menu_keys(labels):
    """The keys that reach the item at `labels` (["Pause", "For 30 minutes"]) in the open
    menu and activate it, counted from the live layout: GTK's arrow keys skip separators and
    disabled items; the first Down selects the first item; Right opens a submenu on its first."""
    items, keys = tray_menu_layout()["children"], []
    for depth, label in enumerate(labels):
        nav = [c for c in items if c["type"] != "separator" and c["enabled"] and c["visible"]]
        idx = [c["label"] for c in nav].index(label)
        keys += ["Down"] * (idx + (1 if depth == 0 else 0))
        if depth < len(labels) - 1:
            keys.append("Right")
            items = nav[idx]["children"]
    return keys + ["Return"]


def hhmm(unix_s):
    """As the app shows a time: "14:30" today, "Wed 14:30" another day (local zone)."""
    t = time.localtime(unix_s)
    same_day = time.strftime("%Y%m%d", t) == time.strftime("%Y%m%d")
    return time.strftime("%H:%M" if same_day else "%a %H:%M", t)


# Pixels of about a colour in a region of a screenshot: desk.py's, shared with the docs shots.
find_color = desk.find_color


ICON_RGB, PANEL = desk.ICON_RGB, desk.PANEL


def tray_icon(state, timeout=20):
    def look():
        p = shot(f"panel-{state}")
        return find_color(p, ICON_RGB[state], PANEL)
    return wait(f"tray icon shows the '{state}' picture", look, timeout=timeout, every=1)


def tray_menu(keys, name):
    """Opens the tray menu with a real click on the icon, screenshots it, then presses keys."""
    pos = None
    for st in ICON_RGB:
        pos = find_color(shot("panel-find"), ICON_RGB[st], PANEL)
        if pos:
            break
    check("tray icon found on the panel", pos)
    changed = 0
    for attempt in range(3):
        before = os.path.join(ART, f"{name}-before.png")
        subprocess.run(["import", "-window", "root", before], check=True)
        subprocess.run(["xdotool", "mousemove", str(pos[0]), str(pos[1]), "click", "1"], check=True)
        time.sleep(1.0)
        after = shot(f"{name}-menu-open")
        diff = subprocess.run(["compare", "-metric", "AE", "-fuzz", "5%", before, after, "null:"],
                              capture_output=True, text=True).stderr.strip()
        changed = float(diff.split()[0]) if diff else 0
        if changed > 2000:
            break
        log(f"menu did not open on attempt {attempt + 1} ({changed} pixels changed); retrying")
        subprocess.run(["xdotool", "key", "Escape"], check=False)
        time.sleep(1.0)
    check(f"tray menu opens on click ({name})", changed > 2000, f"{changed} pixels changed")
    for k in keys:
        subprocess.run(["xdotool", "key", k], check=True)
        time.sleep(0.15)
    time.sleep(0.8)
    # Off the icon, so its tooltip does not cover the window in later screenshots.
    subprocess.run(["xdotool", "mousemove", "1200", "780"], check=False)


def hover_tray(name):
    """Rests the pointer on the tray icon until the host's tooltip shows (the screen around
    the icon changes), and screenshots it. For the record: which text a host shows is the
    host's business; what the app sets is checked over D-Bus (sni_prop)."""
    pos = next((p for st in ICON_RGB if (p := find_color(shot("panel-find"), ICON_RGB[st], PANEL))), None)
    if not pos:
        return log("hover: no tray icon found")
    before = shot(f"{name}-before")
    subprocess.run(["xdotool", "mousemove", str(pos[0] + 4), str(pos[1]), "mousemove", str(pos[0]), str(pos[1])], check=True)
    end, changed = time.time() + 10, 0
    while time.time() < end and changed < 500:
        after = shot(name)
        diff = subprocess.run(["compare", "-metric", "AE", "-fuzz", "5%", before, after, "null:"],
                              capture_output=True, text=True).stderr.strip()
        changed = float(diff.split()[0]) if diff else 0
    log(f"hover: {changed} pixels changed near the icon; see {name}.png")
    subprocess.run(["xdotool", "mousemove", "1200", "780"], check=False)


# ------------------------------------------------------------------ main

# What a damaged settings file looks like: the app must keep it, byte for byte.
CORRUPT = 'orchestrator_id = "e2e\nconcurrency = [1,\n# half-saved by an editor that crashed\n'


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    # 0. A settings file that cannot be parsed, before the first start.
    os.makedirs(CFG_DIR, exist_ok=True)
    with open(CFG, "w") as f:
        f.write(CORRUPT)
    # The GitHub stand-in first: the app is started with its address (github_step.py).
    github_step.start(sys.modules[__name__])
    env = app_env()
    # The window (WebDriver) starts the app itself: tauri-driver -> WebKitWebDriver -> devpilot-tray.
    drv_log = open(os.path.join(WORK, "tauri-driver.log"), "w")
    drv = subprocess.Popen(["tauri-driver"], env=env, stdout=drv_log, stderr=subprocess.STDOUT)
    STARTED.append(("tauri-driver", drv))
    wait("tauri-driver listens", lambda: wd("GET", "/status") is not None, timeout=20)
    global SESSION
    caps = {"capabilities": {"alwaysMatch": {"tauri:options": {"application": TRAY, "args": ["--show"]}}}}
    # Starting WebKitWebDriver and the app can fail once on a loaded machine (seen: the driver
    # drops the first connection). Retry the session, not the assertions.
    for attempt in range(3):
        try:
            SESSION = wd("POST", "/session", caps)["sessionId"]
            break
        except Exception as e:  # noqa: BLE001 - any transport failure
            if attempt == 2:
                raise
            log(f"webdriver session failed ({e!r}); retrying")
            # The failed attempt's app, if it started: this run's copy, by pid.
            desk.end_pids(desk.app_pids(TRAY, APP_MARKER))
            time.sleep(3)
    DRIVER.session = SESSION
    log(f"webdriver session {SESSION}")
    APP_PIDS.extend(wait("the app's pid is known", lambda: desk.app_pids(TRAY, APP_MARKER), timeout=20))
    log(f"app pid(s): {APP_PIDS}")

    # 1. The app starts, the window renders, the engine is idle on the e2e queue.
    st = wait("engine idle with the e2e agent", lambda: (s := wd_invoke("get_status"))["state"] == "idle" and s, timeout=40)
    check("environment overrides in force", st["orchestrator_id"] == ORCH and st["backend"] == "sqlite" and st["agent"] == "command", st)
    wait("window shows the state pill", lambda: (wd_text("#state") or "").startswith("Idle"), timeout=10)
    # There is no window manager: move the window below the panel so the tray is visible.
    subprocess.run(["xdotool", "search", "--name", "^DevPilot$", "windowmove", "%@", "0", "60"], capture_output=True)
    time.sleep(1.5)

    # 1b. The corrupt file was kept aside (not overwritten, not deleted), the app runs on the
    #     defaults, and the window says so.
    kept = [n for n in os.listdir(CFG_DIR) if n.startswith("config.toml.bad-")]
    check("the corrupt settings file is kept as config.toml.bad-<time>", len(kept) == 1, os.listdir(CFG_DIR))
    with open(os.path.join(CFG_DIR, kept[0])) as f:
        check("it is kept byte for byte", f.read() == CORRUPT)
    check("nothing was written in its place yet", not os.path.exists(CFG), os.listdir(CFG_DIR))
    check("the app runs on the default settings", wd_invoke("get_settings")["settings"]["orchestrator_id"] == "personal")
    text = wait("the window shows a notice about it",
                lambda: wd_exec("const n = document.getElementById('config-notice');"
                                "return n && !n.hidden && n.offsetHeight > 0 ? n.textContent : null"), timeout=10)
    check("the notice names the kept file and says defaults are in force",
          kept[0] in text and "default settings" in text and "nothing was overwritten" in text, text)
    shot("00-corrupt-config-notice")
    wait("a notification about it reached the daemon", lambda: kept[0] in notify_log(), timeout=15)
    shot("01-window-idle")

    # 2. The tray icon is hosted (StatusNotifierWatcher) and its menu opens on a click.
    items = wait("tray item registered with StatusNotifierWatcher", lambda: (s := sni_items()) and "/" in s and s, timeout=20)
    log(f"registered items: {items.strip()}")
    tray_icon("idle")
    labels = tray_menu_labels()
    check("a new user's tray menu has no Limits part (nothing held, spent or capped)",
          not any(l.startswith("Limits") or l == "Resume jobs after usage limits" for l in labels), labels)

    # 3. Switch claiming OFF from the tray menu's one claiming control.
    check("the claiming control says on", claiming_now() == "Now: on", tray_submenu("Claiming"))
    tray_menu(menu_keys(["Claiming", "Off"]), "02-dispatch-off")
    wait("the tray's claiming control says off", lambda: claiming_now() == "Now: off", timeout=10)
    wait("dispatch off after the tray click", lambda: wd_invoke("get_status")["state"] == "off", timeout=10)
    cfg = os.path.join(ENV["XDG_CONFIG_HOME"], PROFILE_NAME, "config.toml")
    with open(cfg) as f:
        check("dispatch off persisted in the config file", "dispatch_enabled = false" in f.read())
    tray_icon("off")
    jid = enqueue({"title": "enqueued while off", "sleep": 1})
    # The window lasts until the machine has polled while off, twice after the enqueue: an off
    # machine still wakes on its timer (the 30 s presence interval), skips the claim and writes
    # its presence row, so each new last_seen_at is one such poll, and the second came a whole
    # rest after the first, strictly after the enqueue. Had dispatch not gated it, that poll
    # would have claimed the job.
    def presence():
        return next((m for m in status()["machines"] if m["machine"] == MACHINE), None)
    writes = [wait("the machine's presence row", presence, timeout=10)["last_seen_at"]]

    def polled_twice_while_off():
        m = presence()
        if m["last_seen_at"] != writes[-1]:
            check("each poll while off writes the presence 'off', dispatch disabled",
                  m["status"] == "off" and m["dispatch_enabled"] is False, m)
            writes.append(m["last_seen_at"])
        return len(writes) >= 3
    wait("the machine polled twice while off, after the enqueue", polled_twice_while_off, timeout=100, every=1)
    log(f"presence writes while off (ms): {writes}")
    check("nothing is claimed while dispatch is off", wd_invoke("job_detail", {"id": jid})["job"]["state"] == "queued")

    # 4. Switch it back ON from the window; the job runs and shows in the window.
    wd_exec("location.hash = '#queue';")
    wd_exec("const s = document.getElementById('claiming'); s.value = 'on'; s.dispatchEvent(new Event('change'));")
    wait("job completes after dispatch is switched on",
         lambda: wd_invoke("job_detail", {"id": jid})["job"]["state"] == "completed", timeout=30)
    wait("the window's queue lists the completed job",
         lambda: wd_exec("return document.querySelector(`#jobs tr[data-id='%d']`)?.dataset.state" % jid) == "completed",
         timeout=10)
    check("CLI sees it completed", status()["counts"]["completed"] >= 1)
    wd_exec("document.querySelector(`#jobs tr[data-id='%d']`).click();" % jid)
    wait("job detail shows payload and log tail",
         lambda: "enqueued while off" in (wd_exec("return document.getElementById('detail-payload').textContent") or "")
         and "e2e agent done" in (wd_text("#detail-log") or ""),
         timeout=10)
    # The header's status pill is truthful: once the job is done it no longer says Working.
    pill = wait("the window's status pill says Idle once the job is done",
                lambda: (t := wd_text("#state") or "").startswith("Idle") and t, timeout=10)
    log(f"status pill: {pill!r}")
    shot("03-window-job-detail")

    # 4b. A timed pause from the tray menu: the menu (as the host reads it over dbusmenu),
    #     the hover text and the window say until when, on the local clock; resuming early
    #     from the menu works, and dispatch claims again.
    tray_menu(menu_keys(["Claiming", "Pause for 30 minutes"]), "02b-pause-30-minutes")
    st = wait("paused from the tray menu's 'For 30 minutes'",
              lambda: (s := wd_invoke("get_status"))["paused"] and s["paused_until_unix_ms"] and s, timeout=10)
    until = st["paused_until_unix_ms"] / 1000
    check("the pause ends about 30 minutes from now", abs(until - (time.time() + 1800)) < 90, until - time.time())
    label = wait("the tray menu says until when",
                 lambda: (l := tray_menu_labels()[0]).startswith(f"Paused until {hhmm(until)}") and l, timeout=10)
    log(f"menu: {label!r} ({TZ})")
    check("the hover text (StatusNotifierItem Title) says it too", sni_prop("Title") == f"DevPilot — paused until {hhmm(until)}",
          sni_prop("Title"))
    wait("the window's pill says it too", lambda: wd_text("#state") == f"Paused until {hhmm(until)}", timeout=10)
    check("and the window's claiming control", wd_exec("const s = document.getElementById('claiming'); return s.options[s.selectedIndex].text")
          == f"Paused until {hhmm(until)}")
    check("and the tray's", claiming_now() == f"Now: paused until {hhmm(until)}", claiming_now())
    tray_icon("paused")
    tray_menu(menu_keys(["Claiming", "On"]), "02c-resume-early")
    wait("resumed early from the tray menu", lambda: not wd_invoke("get_status")["paused"], timeout=10)
    wait("the menu no longer says paused", lambda: tray_menu_labels()[0].startswith("Idle"), timeout=10)
    again = enqueue({"title": "after resuming early", "sleep": 0})
    wait("dispatch runs a job again", lambda: wd_invoke("job_detail", {"id": again})["job"]["state"] == "completed", timeout=30)
    wait("and the hover text says nothing runs", lambda: sni_prop("Title") == "DevPilot — dispatching · nothing running", timeout=10)

    # 5. Notifications reached the notification daemon over D-Bus.
    wait("a 'job finished' notification on D-Bus, titled with the job", lambda: "after resuming early" in notify_log()
         and "Finished after resuming early" in notify_log(), timeout=15)
    wait("the app recorded the notification as accepted by the daemon",
         lambda: any(s["error"] is None for s in wd_invoke("recent_notifications")), timeout=10)
    # A burst of three failures coalesces into one notification. (One attempt each: a retry
    # would wait out its backoff and keep work open for the `--until-empty` runner below.)
    for i in range(3):
        enqueue({"title": f"burst {i}", "sleep": 0, "exit": 3}, "--max-attempts", "1")
    wait("a coalesced notification for the burst",
         lambda: any(len(s["kinds"]) >= 2 for s in wd_invoke("recent_notifications")), timeout=30)
    # One job that fails three times (a short backoff) is one notification, at its last
    # failure, with its log and Retry; its retries are not told.
    thrice = enqueue({"title": "fails three times", "sleep": 0, "exit": 3}, "--max-attempts", "3", "--retry-backoff", "100ms")
    wait("the job dies after its third attempt", lambda: wd_invoke("job_detail", {"id": thrice})["job"]["state"] == "dead", timeout=60)
    # Had a retry been told, it would have gone out before the last failure, alone or in
    # the same notification (its kinds would say so).
    about = wait("its notification", lambda: [x for x in wd_invoke("recent_notifications") if "fails three times" in x["summary"] + x["body"]], timeout=30)
    check("three failed attempts make one notification, dead, with View log and Retry",
          len(about) == 1 and about[0]["kinds"] == ["dead"] and about[0]["buttons"] == ["View log", "Retry"]
          and "Gave up after 3 attempts" in about[0]["body"], about)
    # By now several notifications went out: the set-aside file was told in exactly one.
    check("exactly one notification told of the kept settings file", notify_log().count(kept[0]) == 1,
          notify_log().count(kept[0]))
    told = [x for x in wd_invoke("recent_notifications") if "config_set_aside" in x["kinds"]]
    check("the app sent it once, and it offers to open Settings",
          len(told) == 1 and "settings file could not be read" in told[0]["summary"] and told[0]["error"] is None
          and told[0]["action"] == "settings", told)
    wd_click("#config-notice-dismiss")
    wait("the notice goes when dismissed", lambda: wd_exec("return document.getElementById('config-notice').hidden"), timeout=10)
    check("and stays gone", wd_invoke("set_aside_config") is None)

    # 6. Bad settings give clear errors and are not saved.
    wd_exec("location.hash = '#settings';")
    wait("settings form loaded", lambda: wd_exec("return document.querySelector('#s-orchestrator_id').value") != "", timeout=10)
    health = wait("the agent's health line says its command is found",
                  lambda: (x := wd_text("#agent-health") or "").startswith("found: /") and x, timeout=10)
    log(f"agent health: {health!r}")
    typed = wd_exec("return document.getElementById('s-agent').value")
    wd_set("#s-agent", "no-such-agent-cli")
    wd_exec("document.getElementById('s-agent').dispatchEvent(new Event('input'));")
    wait("an agent that is not here is said, in the line and in Problems",
         lambda: "no-such-agent-cli" in (wd_text("#agent-health") or "") and "Agent:" in (wd_text("#problems-list") or ""), timeout=10)
    wd_set("#s-agent", typed)
    wd_exec("document.getElementById('s-agent').dispatchEvent(new Event('input'));")
    wait("and no longer once it is back", lambda: (wd_text("#agent-health") or "").startswith("found: /"), timeout=10)
    # 6a. Agents unconfined on purpose ([sandbox] mode = "off", a hand edit of the file) is a
    # warning in Problems and in the tray, and goes when the edit is undone.
    cfg = os.path.join(ENV["XDG_CONFIG_HOME"], PROFILE_NAME, "config.toml")
    with open(cfg) as f:
        kept = f.read()
    check("agents run confined here: no sandbox warning", "unconfined" not in (wd_text("#problems-list") or "") and "unconfined" not in (sni_prop("Title") or ""))
    with open(cfg, "a") as f:
        f.write('\n[sandbox]\nmode = "off"\n')
    wait("sandbox off is a problem in the window, saying why",
         lambda: 'Agents run unconfined here, because this machine\'s settings say [sandbox] mode = "off"' in (wd_text("#problems-list") or ""), timeout=15)
    wait("and in the tray's hover text", lambda: "Agents run unconfined (sandbox off)" in (sni_prop("Title") or ""), timeout=10)
    wd_exec("document.getElementById('problems').scrollIntoView({block: 'start'});")
    shot("04a-settings-sandbox-off")
    with open(cfg, "w") as f:
        f.write(kept)
    wait("the warning goes with the edit", lambda: "unconfined" not in (wd_text("#problems-list") or "") and "unconfined" not in (sni_prop("Title") or ""), timeout=15)
    wd_set("#s-orchestrator_id", "")
    wd_click("#save-settings")
    wait("empty orchestrator id is refused with a clear message",
         lambda: "orchestrator id" in (wd_text("#settings-msg") or "") and wd_exec("return document.querySelector('#settings-msg').className") == "err",
         timeout=10)
    shot("04-settings-bad-orchestrator")
    wd_set("#s-orchestrator_id", ORCH)
    wd_set("#db-mode", "postgres")
    wd_set("#db-host", "127.0.0.1")
    wd_set("#db-port", "1")
    wd_set("#db-name", "postgres")
    wd_set("#db-user", "postgres")
    wd_click("#save-settings")
    msg = wait("the save of an unreachable database finishes",
               lambda: (t := wd_text("#settings-msg")) not in (None, "", "Checking…") and t, timeout=30)
    check("an unreachable host is refused with a clear message",
          "cannot reach the database at 127.0.0.1:1/postgres" in msg, msg)
    shot("05-settings-unreachable")

    # 7. The password goes to the Secret Service, round-trips, and is in no file.
    with open(ENV["E2E_PGPW_FILE"]) as f:
        pw = f.read().strip()
    wd_set("#db-port", ENV["E2E_PGPORT"])
    wd_set("#db-password", pw)
    wd_click("#save-settings")
    msg = wait("the save with a password finishes",
               lambda: (t := wd_text("#settings-msg")) not in (None, "", "Checking…") and t, timeout=30)
    check("settings with a verified PostgreSQL password saved", msg == "Saved.", msg)
    account = f"postgres@127.0.0.1:{ENV['E2E_PGPORT']}/postgres"
    r = subprocess.run(["secret-tool", "lookup", "service", PROFILE_NAME, "username", account], capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout:
        r = subprocess.run(["secret-tool", "search", "--unlock", "service", PROFILE_NAME], capture_output=True, text=True)
        found = pw in r.stdout
    else:
        found = r.stdout.strip() == pw
    check("the password is in the Secret Service", found, r.stdout + r.stderr)
    leaked = files_holding(pw, ENV["XDG_CONFIG_HOME"], ENV["XDG_DATA_HOME"])
    check("the password is in no file under the config and data dirs", leaked.strip() == "", leaked)
    with open(cfg) as f:
        text = f.read()
    check("the config file holds the URL without a password", f"postgres://postgres@127.0.0.1:{ENV['E2E_PGPORT']}/postgres" in text and pw not in text, text)
    check("the form never shows the password back", wd_exec("return document.querySelector('#db-password').value") == "")
    check("the form says a password is stored", "stored in the OS keychain" in (wd_text("#pw-state") or ""))
    shot("06-settings-saved")

    # 7b. A root certificate (TLS, sslmode verify-full): a path that does not exist is refused;
    #     a CA that did not sign the server's certificate fails the connection; the right one
    #     is saved as sslrootcert in the URL, and the password is still only in the keychain.
    before = config_text()
    wd_set("#db-sslmode", "verify-full")
    wd_set("#db-sslrootcert", "/nonexistent/root.crt")
    wd_set("#db-password", pw)
    wd_click("#save-settings")
    msg = saved_message()
    check("a root certificate that does not exist is refused, by name", msg == "the root certificate /nonexistent/root.crt does not exist", msg)
    wd_set("#db-sslrootcert", ENV["E2E_OTHER_CA_CERT"])
    wd_set("#db-password", pw)
    wd_click("#save-settings")
    msg = saved_message()
    check("a CA that did not sign the server's certificate is refused (verify-full checks it)",
          "the server's certificate was refused: it is not signed by a CA" in msg
          and f"127.0.0.1:{ENV['E2E_PGPORT']}" in msg and "cannot reach" not in msg, msg)
    check("nothing was saved by the refused attempts", config_text() == before)
    wd_set("#db-sslrootcert", ENV["E2E_CA_CERT"])
    wd_set("#db-password", pw)
    wd_click("#save-settings")
    msg = saved_message()
    check("the right CA verifies the server, and the settings are saved", msg == "Saved.", msg)
    text = config_text()
    want = urllib.parse.urlencode({"sslmode": "verify-full", "sslrootcert": ENV["E2E_CA_CERT"]})
    check("the config file's URL keeps sslmode and sslrootcert, and no password",
          f"postgres://postgres@127.0.0.1:{ENV['E2E_PGPORT']}/postgres?{want}" in text and pw not in text, text)
    r = subprocess.run(["secret-tool", "search", "--unlock", "service", PROFILE_NAME], capture_output=True, text=True)
    check("the password is in the Secret Service (secret-tool search)", f"secret = {pw}" in r.stdout, r.stdout + r.stderr)
    leaked = files_holding(pw, ENV["XDG_CONFIG_HOME"], ENV["XDG_DATA_HOME"])
    check("the password is still in no file", leaked.strip() == "", leaked)
    check("the form shows the certificate back", wd_exec("return document.querySelector('#db-sslrootcert').value") == ENV["E2E_CA_CERT"])
    wd_exec("document.getElementById('db-sslrootcert').scrollIntoView({block: 'center'});")
    shot("07-settings-root-certificate")

    # 7c. Keep awake while agents run: a setting of its own, off until switched on here.
    check("keep awake is off by default", "keep_awake = false" in config_text())
    wd_exec("document.getElementById('s-keep_awake').checked = true;")
    wd_click("#save-settings")
    check("keep awake saved", saved_message() == "Saved.")
    check("keep awake is on in the config file", "keep_awake = true" in config_text())

    # 8. Hand off & pause: a second `devpilot run` finishes the job, and with "a job from my
    #    sources finishes on another machine" on, this machine hears of it.
    wd_exec("document.getElementById('n-any_machine').checked = true;")
    wd_click("#save-settings")
    check("the option is saved", saved_message() == "Saved." and "any_machine = true" in config_text(), config_text())
    wait("engine back to idle", lambda: wd_invoke("get_status")["state"] == "idle", timeout=20)
    long_id = enqueue({"title": "long job", "sleep": 120})
    wait("the tray app is working on the long job",
         lambda: any(r["job"]["id"] == long_id for r in wd_invoke("get_status")["running"]), timeout=20)
    tray_icon("working")
    head, slots = wait("the tray's Jobs menu lists the running job, enabled (it opens its page)",
                       lambda: (x := tray_submenu("Jobs")) and any(l.startswith("\u25b6 long job") and on for l, on in x[1]) and x, timeout=10)
    log(f"tray Jobs menu: {head}: {slots}")
    check("its first line counts what runs here and what is queued", slots[0][0].startswith("1 running here · ") and slots[0][0].endswith(" queued"), slots)
    title = wait("while it runs, the hover text (StatusNotifierItem Title) says so",
                 lambda: (t := sni_prop("Title")) == f"DevPilot — dispatching · 1 running: #{long_id} long job" and t, timeout=10)
    log(f"Title: {title!r}")
    try:
        tooltip = sni_prop("ToolTip")
    except RuntimeError as e:
        tooltip = f"(none: {e})"
    log(f"ToolTip: {tooltip}")
    hover_tray("08-tray-hover-text")
    wait("with no logind, keeping awake is logged as unavailable, and the job runs on",
         lambda: "cannot keep the machine awake while agents run" in app_log()
         and wd_invoke("job_detail", {"id": long_id})["job"]["state"] == "running", timeout=10)
    # Hand off & pause from the tray menu, opened again now that the icon shows "working".
    # (That used to miss: xfce's default panels were up, whose blue menu logo passed for this
    # icon, and the click landed between the two; see session.sh.)
    tray_menu(menu_keys(["Hand off & pause"]), "07d-handoff-from-the-tray")
    wait("the claim is released at once", lambda: wd_invoke("job_detail", {"id": long_id})["job"]["state"] != "running", timeout=15)
    wait("this machine is paused", lambda: wd_invoke("get_status")["state"] == "paused", timeout=10)
    tray_icon("paused")
    wait("after the job, the hover text says paused, and nothing running",
         lambda: sni_prop("Title") == "DevPilot — paused until resumed", timeout=10)
    hist = [h["kind"] for h in wd_invoke("job_detail", {"id": long_id})["history"]]
    check("history records the hand-off", "handed_off" in hist, hist)
    verdict = wait("the window says it: safe to close the lid",
                   lambda: wd_exec("const n = document.getElementById('handoff-notice'); return !n.hidden && n.textContent"), timeout=10)
    check("naming the job, that claiming is paused, and that it is safe",
          f"Handed off #{long_id}." in verdict and "Claiming is paused" in verdict and "Safe to close the lid" in verdict, verdict)
    told = wait("a notification says it", lambda: [x for x in wd_invoke("recent_notifications") if "hand_off" in x["kinds"]], timeout=10)
    check("titled with the verdict", told[-1]["summary"] == "DevPilot: Safe to close the lid" and f"#{long_id}" in told[-1]["body"], told[-1])
    labels = wait("and a line in the tray menu", lambda: (x := tray_menu_labels()) and any("Safe to close the lid" in l for l in x) and x, timeout=10)
    log(f"tray menu after the hand-off: {labels}")
    shot("07e-handoff-verdict")
    runner = subprocess.run([CLI, "run", "--orchestrator", ORCH, "--machine", "e2e-runner", "--until-empty",
                             "--poll-interval", "300ms", "--", "true"],
                            env=app_env(), capture_output=True, text=True, timeout=60)
    check("a second `devpilot run` exits cleanly", runner.returncode == 0, runner.stderr)
    d = wd_invoke("job_detail", {"id": long_id})
    check("the second machine finished the handed-off job", d["job"]["state"] == "completed" and d["job"]["claimed_by"] == "e2e-runner", d["job"])
    told = wait("the other machine's finish is notified here",
                lambda: [x for x in wd_invoke("recent_notifications") if x["summary"] == "long job" and "Finished on e2e-runner" in x["body"]], timeout=40)
    check("it says how long and where, and offers the log", " on e2e-runner" in told[-1]["body"].splitlines()[0]
          and told[-1]["buttons"] == ["View log"], told[-1])
    shot("08-after-handoff")

    # 8b. The window cancels a running job, and shows a failed attempt's backoff.
    wd_invoke("resume")
    wd_exec("location.hash = '#queue';")
    cancel_id = enqueue({"title": "cancel me", "sleep": 120})
    wait("the tray app runs the job to cancel",
         lambda: any(r["job"]["id"] == cancel_id for r in wd_invoke("get_status")["running"]), timeout=20)
    wd_exec("refreshJobs();")
    wait("the running job's row has a Cancel button",
         lambda: wd_exec("return !!document.querySelector(`#jobs tr[data-id='%d'] button.cancel`)" % cancel_id), timeout=10)
    wd_exec("document.querySelector(`#jobs tr[data-id='%d'] button.cancel`).click();" % cancel_id)
    wait("the running job ends cancelled", lambda: wd_invoke("job_detail", {"id": cancel_id})["job"]["state"] == "cancelled", timeout=15)
    hist = [(h["kind"], h["machine"]) for h in wd_invoke("job_detail", {"id": cancel_id})["history"]]
    check("history says who asked and who stopped the agent",
          ("cancel_requested", MACHINE) in hist and ("cancelled", MACHINE) in hist and not any(k == "completed" for k, _ in hist), hist)
    retry_id = enqueue({"title": "retry later", "sleep": 0, "exit": 3}, "--retry-backoff", "1h")
    wait("the failing job waits out its backoff", lambda: wd_invoke("job_detail", {"id": retry_id})["job"]["state"] == "failed", timeout=20)
    wd_exec("refreshJobs();")
    text = wait("the window says when the retry is",
                lambda: (t := wd_exec("return document.querySelector(`#jobs tr[data-id='%d'] td.state`)?.textContent" % retry_id) or "") .startswith("failed · retry in") and t,
                timeout=10)
    log(f"retry text: {text!r}")
    shot("08b-cancel-and-retry")
    cli("cancel", str(retry_id))

    # 8c. A real job: a repo added in Settings, a job from the New job form runs in a git
    #     worktree of it; then a job running on another machine shows its live log here.
    remote, clone = make_repo(os.path.join(WORK, "git"))
    wd_exec("location.hash = '#settings';")
    wait("settings form loaded again", lambda: wd_exec("return document.querySelector('#s-orchestrator_id').value") != "", timeout=10)
    wd_set("#repo-name", "webapp")
    wd_set("#repo-path", "/nonexistent/webapp")
    wd_click("#repo-add")
    wait("a path that is not a git clone is refused", lambda: "not a git clone" in (wd_text("#repo-msg") or ""), timeout=10)
    wd_set("#repo-path", clone)
    wd_click("#repo-add")
    wait("the repo is added and listed", lambda: (wd_text("#repo-msg") or "").startswith("Added webapp: a finished job pushes its branch") and wd_exec("return !!document.querySelector(`#repos tr[data-repo='webapp']`)"), timeout=15)
    with open(cfg) as f:
        check("the repo is in the config file", "[repos.webapp]" in f.read())
    wd_exec("location.hash = '#new';")
    wait("the New job form offers the repo",
         lambda: "webapp" in wd_exec("return [...document.querySelectorAll('#nj-repo option')].map(o => o.value)"), timeout=10)
    wd_set("#nj-title", "ENG-7 Fix the login redirect")
    wd_set("#nj-prompt", "After login, users land on /home instead of the page they asked for. Keep the original URL.")
    wd_set("#nj-repo", "webapp")
    wd_set("#nj-labels", "")
    wd_set("#nj-priority", "5")
    wd_set("#nj-key", "ENG-7")
    wd_exec("document.getElementById('notice').hidden = true;")
    shot("09-new-job-form")
    wd_click("#nj-submit")
    real_id = int(wait("the form says which job it added",
                       lambda: (m := re.search(r"Added job #(\d+)", wd_text("#nj-msg") or "")) and m.group(1), timeout=15))
    d = wait("the job from the form completes", lambda: (d := wd_invoke("job_detail", {"id": real_id}))["job"]["state"] == "completed" and d, timeout=60)
    check("it carries the form's fields", d["job"]["repo"] == "webapp" and d["job"]["priority"] == 5 and d["job"]["unique_key"] == "ENG-7"
          and d["payload"].get("prompt", "").startswith("After login"), d["job"])
    branch = f"devpilot/{real_id}-eng-7-fix-the-login-redirect"
    check("the agent ran in the job's worktree, on its branch",
          f"/worktrees/{ORCH}/{real_id} on branch {branch}" in d["log_tail"], d["log_tail"][-600:])
    wt = os.path.join(ENV["XDG_DATA_HOME"], PROFILE_NAME, "worktrees", ORCH, str(real_id))
    check("the clean worktree was removed after the job", not os.path.exists(wt), wt)
    sent = wait("the completion notification offers Open",
                lambda: [x for x in wd_invoke("recent_notifications")
                         if x.get("action") == {"result": {"job": real_id, "otherwise": {"job": real_id}}}], timeout=20)
    log(f"notification: {sent[-1]['summary']}: {sent[-1]['body']}")
    recent = wait("the tray's Recent results lists it first, with a mark and what came of it",
                  lambda: (x := tray_submenu("Recent results")[1]) and x[0][0].startswith(f"\u2713 ") and f"(#{real_id})" in x[0][0] and x, timeout=15)
    log(f"tray recent results: {recent}")

    stuck = int(cli("enqueue", "--orchestrator", ORCH, "--title", "needs a repo nobody has", "--repo", "nowhere").strip())
    wd_exec("location.hash = '#queue'; refreshJobs();")
    wait("the queue flags a job no online machine can take, and says why",
         lambda: "no online machine has repo nowhere" in (wd_text(f"#jobs tr[data-id='{stuck}'] td.state") or ""), timeout=15)
    cli("cancel", str(stuck))

    wd_invoke("pause")
    live_id = enqueue({"title": "watch me from the laptop", "sleep": 90, "chatter": True})
    other = subprocess.Popen([CLI, "run", "--orchestrator", ORCH, "--machine", "e2e-desktop", "--heartbeat", "1s",
                              "--claim-timeout", "30s", "--poll-interval", "300ms", "--", "python3", os.path.join(HERE, "agent.py")],
                             env=app_env(), stdout=subprocess.DEVNULL, stderr=open(os.path.join(WORK, "e2e-desktop.log"), "w"))
    STARTED.append(("devpilot run e2e-desktop", other))
    wait("the other machine runs the job",
         lambda: wd_invoke("job_detail", {"id": live_id})["job"]["claimed_by"] == "e2e-desktop", timeout=30)
    wd_exec("location.hash = '#queue'; showJob(%d);" % live_id)
    wait("the job detail shows the other machine's live log",
         lambda: "from e2e-desktop" in (wd_text("#detail-log-title") or "") and "e2e agent step 3" in (wd_text("#detail-log") or ""), timeout=30)
    wait("the live log follows the agent", lambda: "e2e agent step 9" in (wd_text("#detail-log") or ""), timeout=30)
    wd_exec("document.getElementById('detail-log').scrollIntoView({block: 'end'});")
    shot("10-live-log-from-another-machine")
    cli("cancel", str(live_id))
    wait("the other machine stops it", lambda: wd_invoke("job_detail", {"id": live_id})["job"]["state"] == "cancelled", timeout=20)
    other.terminate()
    other.wait(20)
    wd_invoke("resume")

    # 8d. A Linear source, through Settings → Sources, against the stand-in (sources_step.py).
    sources_step.run(sys.modules[__name__])
    # 8e. A GitHub source, its job's pull request, and the notification's Open (github_step.py).
    github_step.run(sys.modules[__name__])
    # 8f. A real claude job on another machine: its live transcript in the job page
    #     (transcript_step.py).
    transcript_step.run(sys.modules[__name__])

    # 9. Quit with nothing running hands off nothing and exits; the machine row says stopped.
    try:
        wd_invoke("quit", {"mode": "check"})
    except Exception:  # noqa: BLE001 (the app exits under the call)
        pass
    m = wait("the app stopped and says so in the machines table",
             lambda: [x for x in status()["machines"] if x["machine"] == MACHINE and x["status"] == "stopped"], timeout=20)
    log(f"machines: {m}")
    log(f"\nALL {len(RESULTS)} CHECKS PASSED")


def finish():
    try:
        shot("zz-final")
    except Exception:  # noqa: BLE001
        pass
    try:
        if SESSION:
            wd("DELETE", f"/session/{SESSION}")
    except Exception:  # noqa: BLE001
        pass
    desk.end_started([p for _, p in STARTED], timeout=5)
    # The app quits at the end of the run; if a failure stopped the run first, end it by pid.
    desk.end_pids([p for p in desk.app_pids(TRAY, APP_MARKER) if p in APP_PIDS])


if __name__ == "__main__":
    try:
        main()
    finally:
        finish()
