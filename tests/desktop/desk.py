"""Helpers shared by the desktop tests (e2e.py, sleep_test.py, window_cycle_test.py) and the
footprint benchmark: PASS/FAIL checks and polling waits, X11 window handling (find the
app's window, close it the way a window manager's close button does), and the processes a
test started, found and ended by pid."""
import ctypes
import glob
import os
import signal
import subprocess
import time


class Checks:
    """Prints each check as PASS or FAIL (with `prefix`), stops the test at the first FAIL,
    and keeps the results for the summary line."""

    def __init__(self, prefix=""):
        self.prefix = prefix
        self.results = []

    @staticmethod
    def log(msg):
        print(msg, flush=True)

    def check(self, name, cond, detail=""):
        self.results.append((name, bool(cond)))
        self.log(f"{'PASS' if cond else 'FAIL'}: {self.prefix}{name}{(' — ' + repr(detail)) if not cond else ''}")
        if not cond:
            raise SystemExit(1)

    def files_holding(self, secret, *dirs):
        """The files under `dirs` that hold `secret`, by grep. grep's own failure (exit 2: a
        directory that is not there, a file it cannot read) fails the check: an empty answer
        from a grep that searched nothing is not "clean"."""
        r = subprocess.run(["grep", "-rlF", secret, *dirs], capture_output=True, text=True)
        self.check(f"grep could search {', '.join(dirs)}", r.returncode in (0, 1), r.stderr)
        return r.stdout

    def wait(self, what, fn, timeout=30, every=0.3):
        """Polls `fn` until it returns something true (returned) or `timeout` passes (FAIL).
        An exception from `fn` counts as "not yet" and is reported if it is the last."""
        end = time.time() + timeout
        last = None
        while time.time() < end:
            try:
                last = fn()
                if last:
                    self.results.append((what, True))
                    self.log(f"PASS: {self.prefix}{what}")
                    return last
            except Exception as e:  # noqa: BLE001 (keep polling; report the last error)
                last = e
            time.sleep(every)
        self.check(what, False, f"timed out after {timeout}s; last: {last!r}")


class XClientMessageEvent(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("serial", ctypes.c_ulong), ("send_event", ctypes.c_int),
                ("display", ctypes.c_void_p), ("window", ctypes.c_ulong), ("message_type", ctypes.c_ulong),
                ("format", ctypes.c_int), ("data", ctypes.c_long * 5)]


class XEvent(ctypes.Union):
    _fields_ = [("xclient", XClientMessageEvent), ("pad", ctypes.c_long * 24)]


def window_ids(name="DevPilot", visible=False):
    args = ["xdotool", "search"] + (["--onlyvisible"] if visible else []) + ["--name", f"^{name}$"]
    return subprocess.run(args, capture_output=True, text=True).stdout.split()


def window_exists(name="DevPilot"):
    return bool(window_ids(name, visible=True))


def close_window(name="DevPilot"):
    """Sends WM_DELETE_WINDOW to every top-level named `name` (what a WM's close button does).
    Returns how many windows it was sent to."""
    ids = window_ids(name)
    if not ids:
        return 0
    x = ctypes.cdll.LoadLibrary("libX11.so.6")
    x.XOpenDisplay.restype = ctypes.c_void_p
    x.XOpenDisplay.argtypes = [ctypes.c_char_p]
    x.XInternAtom.restype = ctypes.c_ulong
    x.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    x.XSendEvent.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_long, ctypes.POINTER(XEvent)]
    x.XFlush.argtypes = [ctypes.c_void_p]
    x.XCloseDisplay.argtypes = [ctypes.c_void_p]
    d = x.XOpenDisplay(None)
    protocols = x.XInternAtom(d, b"WM_PROTOCOLS", 0)
    delete = x.XInternAtom(d, b"WM_DELETE_WINDOW", 0)
    for wid in ids:
        ev = XEvent()
        ev.xclient.type = 33  # ClientMessage
        ev.xclient.window = int(wid)
        ev.xclient.message_type = protocols
        ev.xclient.format = 32
        ev.xclient.data[0] = delete
        ev.xclient.data[1] = 0  # CurrentTime
        x.XSendEvent(d, int(wid), 0, 0, ctypes.byref(ev))
    x.XFlush(d)
    x.XCloseDisplay(d)
    return len(ids)


class WebDriver:
    """A small WebDriver client for tauri-driver (which starts the app and hands the session
    to WebKitWebDriver): raw requests, retried when the connection drops, plus the few
    commands the desktop tests use on the app's page."""

    def __init__(self, url="http://127.0.0.1:4444", log=print):
        self.url, self.log, self.session = url, log, None

    def request(self, method, path, body=None):
        """One request, sent again when the connection drops. The drop seen here is
        tauri-driver's pooled connection to WebKitWebDriver going stale while a test waited on
        something else (tauri-driver logs `client error (SendRequest) ... Connection reset by
        peer`): the request never reached the browser, so sending it again is safe."""
        import http.client
        import json
        import urllib.request
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(3):
            req = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return json.loads(r.read() or b"{}").get("value")
            except (ConnectionError, http.client.HTTPException) as e:
                if attempt == 2:
                    raise
                self.log(f"webdriver {method} {path} dropped ({e!r}); sending it again")
                time.sleep(2)

    def start(self, app, args=()):
        """Starts the app through tauri-driver; returns once its window's page is there."""
        caps = {"capabilities": {"alwaysMatch": {"tauri:options": {"application": app, "args": list(args)}}}}
        self.session = self.request("POST", "/session", caps)["sessionId"]
        return self.session

    def exec(self, script, *args):
        return self.request("POST", f"/session/{self.session}/execute/sync", {"script": script, "args": list(args)})

    def invoke(self, cmd, args=None):
        """Calls a Tauri command from inside the page; raises with the command's error."""
        r = self.request("POST", f"/session/{self.session}/execute/async", {
            "script": "const [c, a, done] = arguments;"
                      "window.__TAURI__.core.invoke(c, a).then(v => done({ok: v}), e => done({err: e}));",
            "args": [cmd, args or {}],
        })
        if "err" in r:
            raise RuntimeError(f"{cmd}: {r['err']}")
        return r["ok"]

    def text(self, css):
        return self.exec("const e = document.querySelector(arguments[0]); return e ? e.textContent : null;", css)

    def visible(self, css):
        return self.exec("const e = document.querySelector(arguments[0]);"
                         "return !!e && !e.hidden && e.offsetHeight > 0;", css)

    def click(self, css):
        return self.exec("const e = document.querySelector(arguments[0]); if (!e) return false; e.click(); return true;", css)

    def click_soon(self, css):
        """Clicks `css` just after this request has returned: for a click that ends the page
        (closing the window), which would otherwise fail the request it came in."""
        return self.exec("const e = document.querySelector(arguments[0]); if (!e) return false;"
                         "setTimeout(() => e.click(), 100); return true;", css)

    def set(self, css, value):
        self.exec("const e = document.querySelector(arguments[0]); e.value = arguments[1];"
                  "e.dispatchEvent(new Event('change', {bubbles: true}));", css, value)

    def painted(self):
        """Waits until the page has rendered two more frames, so a screenshot shows the DOM as
        it is now (under load, WebKit's software compositing can paint a second or more late)."""
        try:
            self.request("POST", f"/session/{self.session}/execute/async", {
                "script": "const done = arguments[0]; requestAnimationFrame(() => requestAnimationFrame(() => done(true)));",
                "args": []})
        except Exception:  # noqa: BLE001 (no page any more: just take the shot)
            pass
        time.sleep(0.5)

    def screenshot(self, path):
        """The page as WebKit rendered it (a snapshot of the web view, whatever the display)."""
        import base64
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.request("GET", f"/session/{self.session}/screenshot")))
        return path

    def end(self):
        if self.session:
            try:
                self.request("DELETE", f"/session/{self.session}")
            except Exception:  # noqa: BLE001 (the app may be gone already)
                pass
            self.session = None


def tray_env(base, work, orchestrator):
    """A fresh profile for one tray app under `work`: its own config, data and SQLite queue,
    the demo agent, info logs."""
    e = dict(base)
    e.update({
        "XDG_CONFIG_HOME": os.path.join(work, "config"),
        "XDG_DATA_HOME": os.path.join(work, "data"),
        "DEVPILOT_DATABASE_URL": f"sqlite://{os.path.join(work, 'queue.sqlite')}",
        "DEVPILOT_ORCHESTRATOR": orchestrator,
        "DEVPILOT_LOG": "info",
        "NO_AT_BRIDGE": "1",
    })
    e.pop("DEVPILOT_AGENT", None)
    return e


def sigterm_code(proc, timeout=30):
    """Sends SIGTERM to `proc` and returns its exit code, or None if it is still up after
    `timeout` seconds."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def colours(png):
    """How many distinct colours a PNG has: a painted window has many, a blank surface few."""
    out = subprocess.run(["convert", png, "-format", "%k", "info:"], capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


def sni_items():
    """The StatusNotifierWatcher's registered items, as gdbus prints them ('' if none)."""
    r = subprocess.run(
        ["gdbus", "call", "--session", "--dest", "org.kde.StatusNotifierWatcher", "--object-path",
         "/StatusNotifierWatcher", "--method", "org.freedesktop.DBus.Properties.Get",
         "org.kde.StatusNotifierWatcher", "RegisteredStatusNotifierItems"],
        capture_output=True, text=True, timeout=10)
    return r.stdout if r.returncode == 0 else ""


def bus_name_owned(name):
    r = subprocess.run(["gdbus", "call", "--session", "--dest", "org.freedesktop.DBus", "--object-path",
                        "/org/freedesktop/DBus", "--method", "org.freedesktop.DBus.NameHasOwner", name],
                       capture_output=True, text=True, timeout=10)
    return "true" in r.stdout


# ------------------------------------------------------------------ the tray, as a user sees it

# The six icons' main colour, and the panel's strip of the screen (xfce4-panel.xml).
ICON_RGB = {"idle": (46, 158, 79), "working": (31, 111, 209), "paused": (217, 142, 4),
            "off": (138, 138, 138), "attention": (198, 40, 40), "offline": (111, 66, 193)}
PANEL = (0, 0, 1280, 40)


def find_color(png, rgb, region, tol=40):
    """Pixels of about `rgb` within region (x, y, w, h) of a screenshot; returns their centre
    and count, or None."""
    import re
    x0, y0, w, h = region
    txt = subprocess.run(["convert", png, "-crop", f"{w}x{h}+{x0}+{y0}", "+repage", "txt:-"],
                         capture_output=True, text=True, check=True).stdout
    xs, ys = [], []
    for line in txt.splitlines()[1:]:
        m = re.match(r"(\d+),(\d+): \((\d+),(\d+),(\d+)", line)
        if not m:
            continue
        x, y, r, g, b = map(int, m.groups())
        if abs(r - rgb[0]) < tol and abs(g - rgb[1]) < tol and abs(b - rgb[2]) < tol:
            xs.append(x)
            ys.append(y)
    if len(xs) < 6:
        return None
    return (x0 + sum(xs) // len(xs), y0 + sum(ys) // len(ys), len(xs))


def root_shot(path):
    """The whole X screen, as a PNG at `path`."""
    subprocess.run(["import", "-window", "root", path], check=True)
    return path


def tray_icon_at(scratch):
    """Where DevPilot's icon is on the panel (its centre), whichever picture it shows; None if
    it is not there. `scratch` is a PNG path to screenshot into."""
    shot = root_shot(scratch)
    return next((p for rgb in ICON_RGB.values() if (p := find_color(shot, rgb, PANEL))), None)


def open_tray_menu(at, before, after, log=print):
    """Opens the tray menu with a real click on the icon at `at` (x, y), screenshotting the
    screen before and after (PNG paths); retries a click the host missed. Returns how many
    pixels the menu changed (more than 2000: it is open). Leave it with Escape."""
    import time
    changed = 0
    for attempt in range(3):
        root_shot(before)
        subprocess.run(["xdotool", "mousemove", str(at[0]), str(at[1]), "click", "1"], check=True)
        time.sleep(1.5)
        root_shot(after)
        diff = subprocess.run(["compare", "-metric", "AE", "-fuzz", "5%", before, after, "null:"],
                              capture_output=True, text=True).stderr.strip()
        changed = float(diff.split()[0]) if diff else 0
        if changed > 2000:
            break
        log(f"the tray menu did not open on attempt {attempt + 1} ({changed} pixels changed); retrying")
        subprocess.run(["xdotool", "key", "Escape"], check=False)
        time.sleep(1.0)
    return changed


def sni_item():
    """(bus name, object path) of DevPilot's StatusNotifierItem, from the watcher's list."""
    import re
    for entry in re.findall(r"'([^']+)'", sni_items()):
        name, _, path = entry.partition("/")
        if "tray_icon_tray_app_devpilot" in path:
            return name, "/" + path
    raise RuntimeError(f"no DevPilot item registered: {sni_items()!r}")


def tray_menu_layout():
    """The tray menu as the host reads it (com.canonical.dbusmenu GetLayout, via dbusmenu.py):
    {"label", "enabled", "visible", "type", "children"} per item."""
    import json
    import re
    name, path = sni_item()
    menu = subprocess.run(["gdbus", "call", "--session", "--dest", name, "--object-path", path, "--method",
                           "org.freedesktop.DBus.Properties.Get", "org.kde.StatusNotifierItem", "Menu"],
                          capture_output=True, text=True, timeout=10, check=True).stdout
    menu_path = re.search(r"objectpath '([^']+)'", menu).group(1)
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(["/usr/bin/python3", os.path.join(here, "dbusmenu.py"), name, menu_path],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    return json.loads(out)


def tray_menu_shown():
    """The tray menu's top-level items a user sees (visible), as (label, toggle state): the
    state 1 for a checked item, 0 for an unchecked one, -1 for any other."""
    return [(c["label"], c.get("toggle_state", -1)) for c in tray_menu_layout()["children"]
            if c["visible"] and c["type"] != "separator"]


# The app's profile (its config, data and keychain names): debug builds use their own.
PROFILE_NAME = "devpilot-dev" if os.environ.get("E2E_PROFILE", "debug") == "debug" else "devpilot"


def app_log(data_home):
    """The app's own log files (daily-rotated) under `data_home`, as one text."""
    text = ""
    for p in sorted(glob.glob(os.path.join(data_home, PROFILE_NAME, "logs", "devpilot-tray*"))):
        with open(p, errors="replace") as f:
            text += f.read()
    return text


# ------------------------------------------------------------------ processes, by pid

def alive(pid):
    """Whether process `pid` is running (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def app_pids(exe, marker):
    """The pids of the processes running the binary `exe` that this test started: whose
    environment holds `marker` ("NAME=value", e.g. the XDG_CONFIG_HOME of the test that
    started it), whether it started the app itself or through tauri-driver and
    WebKitWebDriver, and no other copy. The app makes itself non-dumpable (its environment
    may have held a database password), so a test that is not root cannot read its `exe` or
    `environ`: then the app's command line names the binary, and the app must descend from
    this test's own process."""
    want, mark, found = os.path.realpath(exe), marker.encode(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        try:
            binary = os.readlink(f"/proc/{d}/exe")
        except OSError:
            binary = None
        if (binary or os.path.realpath(argv0)) != want:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                ours = mark in f.read().split(b"\0")
        except OSError:
            ours = descends_from(int(d), os.getpid())
        if ours and alive(int(d)):
            found.append(int(d))
    return sorted(found)


def descends_from(pid, ancestor):
    """Whether `pid` is `ancestor` or one of its descendants (by the parent ids in /proc)."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


def end_pids(pids, sig=signal.SIGTERM, timeout=10):
    """Sends `sig` to each of `pids` that is still running, waits up to `timeout` s for them
    to go, then SIGKILLs what is left. Returns the pids that needed the SIGKILL."""
    pids = [p for p in pids if alive(p)]
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
    end = time.time() + timeout
    while time.time() < end and any(alive(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def end_started(procs, timeout=10):
    """Ends the Popen objects a test started, newest first: SIGTERM to each one's pid, SIGKILL
    after `timeout` s."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
