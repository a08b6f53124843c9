#!/usr/bin/python3
"""A TEST DOUBLE of systemd-logind's Manager, for the sleep-hook test (sleep_test.py).

This is not logind. There is no logind in the test VM, so this small service takes the
well-known name org.freedesktop.login1 on a PRIVATE dbus-daemon that the test passes to the
app as its "system bus" (DBUS_SYSTEM_BUS_ADDRESS, for the app only). It implements only what
the app uses, the way logind documents it
(https://www.freedesktop.org/wiki/Software/systemd/inhibit/):

- org.freedesktop.login1.Manager.Inhibit(what, who, why, mode) -> h: returns a real file
  descriptor (the write end of a pipe). The inhibitor is held until every copy of that fd is
  closed; we see that as EOF/HUP on the read end we keep, exactly how logind notices it.
- the signal org.freedesktop.login1.Manager.PrepareForSleep(b).

And a control interface for the test (dev.devpilot.test.FakeLogind):
- Sleep(): a lid close. Like logind with its default LidSwitchIgnoreInhibited=yes, it goes
  ahead whatever "block" inhibitors are held (only a "handle-lid-switch" lock would stop it;
  it counts them in "block_held"); emits PrepareForSleep(true), then, as logind does with
  delay inhibitors, waits for those to be released, at most 5 s (logind's default
  InhibitDelayMaxSec). Returns a JSON string
  {"released_after_ms": n or null, "held_before": k, "block_held": b, "lid_blocked": false}.
- Wake(): emits PrepareForSleep(false).
- Events(): JSON list of everything that happened (inhibit taken/released, signals sent).
- Held(): JSON list of the inhibitors held now ({"what", "who", "why", "mode", "sender",
  "held_ms"}), as logind's ListInhibitors would show them.

Needs python3-gi (Debian), so run it with /usr/bin/python3.
Usage: fake_logind.py ADDRESS
"""
import json
import os
import sys
import time

from gi.repository import Gio, GLib

XML = """
<node>
  <interface name="org.freedesktop.login1.Manager">
    <method name="Inhibit">
      <arg type="s" direction="in"/><arg type="s" direction="in"/>
      <arg type="s" direction="in"/><arg type="s" direction="in"/>
      <arg type="h" direction="out"/>
    </method>
    <signal name="PrepareForSleep"><arg type="b"/></signal>
  </interface>
  <interface name="dev.devpilot.test.FakeLogind">
    <method name="Sleep"><arg type="s" direction="out"/></method>
    <method name="Wake"/>
    <method name="Events"><arg type="s" direction="out"/></method>
    <method name="Held"><arg type="s" direction="out"/></method>
  </interface>
</node>
"""
PATH = "/org/freedesktop/login1"
DELAY_MAX_S = 5.0

EVENTS = []
INHIBITORS = {}  # read fd -> {"who", "what", "mode", "sender", "taken"}
T0 = time.monotonic()


def note(kind, **kw):
    ev = {"t_ms": round((time.monotonic() - T0) * 1000), "kind": kind, **kw}
    EVENTS.append(ev)
    print("fake-logind:", json.dumps(ev), flush=True)


def sleep_inhibitors(mode):
    return [r for r, i in INHIBITORS.items() if i["mode"] == mode and "sleep" in i["what"].split(":")]


def delay_inhibitors():
    return sleep_inhibitors("delay")


def held():
    now = time.monotonic()
    return [{"what": i["what"], "who": i["who"], "why": i["why"], "mode": i["mode"], "sender": i["sender"],
             "held_ms": round((now - i["taken"]) * 1000)} for i in INHIBITORS.values()]


def on_fd_closed(rfd, _cond):
    info = INHIBITORS.pop(rfd, None)
    os.close(rfd)
    if info:
        note("inhibitor_released", who=info["who"], what=info["what"], mode=info["mode"], sender=info["sender"],
             held_ms=round((time.monotonic() - info["taken"]) * 1000))
    return GLib.SOURCE_REMOVE


def main():
    address = sys.argv[1]
    conn = Gio.DBusConnection.new_for_address_sync(
        address, Gio.DBusConnectionFlags.AUTHENTICATION_CLIENT | Gio.DBusConnectionFlags.MESSAGE_BUS_CONNECTION,
        None, None)
    node = Gio.DBusNodeInfo.new_for_xml(XML)
    loop = GLib.MainLoop()

    def emit(start):
        conn.emit_signal(None, PATH, "org.freedesktop.login1.Manager", "PrepareForSleep", GLib.Variant("(b)", (start,)))
        note("prepare_for_sleep_sent", start=start)

    def call(_c, sender, _path, iface, method, params, inv):
        if iface == "org.freedesktop.login1.Manager" and method == "Inhibit":
            what, who, why, mode = params.unpack()
            r, w = os.pipe()
            INHIBITORS[r] = {"who": who, "what": what, "why": why, "mode": mode, "sender": sender, "taken": time.monotonic()}
            GLib.unix_fd_add_full(GLib.PRIORITY_DEFAULT, r, GLib.IOCondition.HUP | GLib.IOCondition.IN | GLib.IOCondition.ERR,
                                  on_fd_closed)
            fds = Gio.UnixFDList.new()
            idx = fds.append(w)
            os.close(w)  # the fd list holds its own copy; after sending, only the app's copy is left
            inv.return_value_with_unix_fd_list(GLib.Variant("(h)", (idx,)), fds)
            note("inhibitor_taken", who=who, what=what, why=why, mode=mode, sender=sender)
        elif method == "Sleep":
            n_delay = len(delay_inhibitors())
            # The lid: "block" locks on sleep do not stop it (LidSwitchIgnoreInhibited=yes);
            # only a "handle-lid-switch" block would, and then logind would not suspend.
            n_block = len(sleep_inhibitors("block"))
            lid_blocked = any(i["mode"] == "block" and "handle-lid-switch" in i["what"].split(":")
                              for i in INHIBITORS.values())
            if lid_blocked:
                note("lid_switch_blocked")
                inv.return_value(GLib.Variant("(s)", (json.dumps({"released_after_ms": None, "held_before": n_delay,
                                                                  "block_held": n_block, "lid_blocked": True}),)))
                return
            emit(True)
            start = time.monotonic()

            def poll():
                if not delay_inhibitors():
                    ms = round((time.monotonic() - start) * 1000)
                    note("sleep_allowed", released_after_ms=ms)
                    inv.return_value(GLib.Variant("(s)", (json.dumps({"released_after_ms": ms, "held_before": n_delay,
                                                                      "block_held": n_block, "lid_blocked": False}),)))
                    return GLib.SOURCE_REMOVE
                if time.monotonic() - start > DELAY_MAX_S:
                    note("sleep_forced_after_delay_max")
                    inv.return_value(GLib.Variant("(s)", (json.dumps({"released_after_ms": None, "held_before": n_delay,
                                                                      "block_held": n_block, "lid_blocked": False}),)))
                    return GLib.SOURCE_REMOVE
                return GLib.SOURCE_CONTINUE

            GLib.timeout_add(20, poll)
        elif method == "Wake":
            emit(False)
            inv.return_value(None)
        elif method == "Events":
            inv.return_value(GLib.Variant("(s)", (json.dumps(EVENTS),)))
        elif method == "Held":
            inv.return_value(GLib.Variant("(s)", (json.dumps(held()),)))
        else:
            inv.return_dbus_error("org.freedesktop.DBus.Error.UnknownMethod", method)

    for iface in node.interfaces:
        conn.register_object(PATH, iface, call, None, None)
    Gio.bus_own_name_on_connection(conn, "org.freedesktop.login1", Gio.BusNameOwnerFlags.NONE,
                                   lambda *_: note("name_acquired"), lambda *_: (note("name_lost"), loop.quit()))
    loop.run()


if __name__ == "__main__":
    main()
