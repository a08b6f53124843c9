"""Helpers shared by the desktop tests (e2e.py, sleep_test.py, window_cycle_test.py) and the
footprint benchmark: PASS/FAIL checks and polling waits, and X11 window handling (find the
app's window, close it the way a window manager's close button does)."""
import ctypes
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
