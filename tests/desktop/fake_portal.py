#!/usr/bin/python3
"""A TEST DOUBLE of the XDG desktop portal's Settings interface, for theme_test.py.

This is not xdg-desktop-portal. There is none in the test session, so this small service
takes the well-known name org.freedesktop.portal.Desktop on the session bus and implements
only what the app reads, the way the portal documents it
(https://flatpak.github.io/xdg-desktop-portal/docs/doc-org.freedesktop.portal.Settings.html):

- org.freedesktop.portal.Settings.ReadOne(namespace, key) -> v (version 2), and the older
  Read(namespace, key) -> v, whose answer is the value wrapped in one more variant. Only
  org.freedesktop.appearance color-scheme is known (a u32: 0 no preference, 1 prefer dark,
  2 prefer light); any other key is the portal's error org.freedesktop.portal.Error.NotFound.
- the signal SettingChanged(namespace, key, value).

And a control interface for the test (dev.devpilot.test.FakePortal):
- SetScheme(u): changes color-scheme and emits SettingChanged, as the portal does when the
  user flips the desktop's dark style.
- Reads() -> u: how many Read/ReadOne calls were answered.

Needs python3-gi (Debian), so run it with /usr/bin/python3.
Usage: fake_portal.py SCHEME (prints "ready" once it owns the name)
"""
import sys

from gi.repository import Gio, GLib

XML = """
<node>
  <interface name="org.freedesktop.portal.Settings">
    <method name="ReadOne">
      <arg type="s" direction="in"/><arg type="s" direction="in"/><arg type="v" direction="out"/>
    </method>
    <method name="Read">
      <arg type="s" direction="in"/><arg type="s" direction="in"/><arg type="v" direction="out"/>
    </method>
    <signal name="SettingChanged"><arg type="s"/><arg type="s"/><arg type="v"/></signal>
    <property name="version" type="u" access="read"/>
  </interface>
  <interface name="dev.devpilot.test.FakePortal">
    <method name="SetScheme"><arg type="u" direction="in"/></method>
    <method name="Reads"><arg type="u" direction="out"/></method>
  </interface>
</node>
"""
NAME = "org.freedesktop.portal.Desktop"
PATH = "/org/freedesktop/portal/desktop"
SETTINGS = "org.freedesktop.portal.Settings"
NAMESPACE, KEY = "org.freedesktop.appearance", "color-scheme"


def main():
    state = {"scheme": int(sys.argv[1]), "reads": 0}
    node = Gio.DBusNodeInfo.new_for_xml(XML)
    loop = GLib.MainLoop()

    def call(conn, _sender, _path, iface, method, params, inv):
        if iface == SETTINGS and method in ("ReadOne", "Read"):
            ns, key = params.unpack()
            if (ns, key) != (NAMESPACE, KEY):
                inv.return_dbus_error("org.freedesktop.portal.Error.NotFound", "Requested setting not found")
                return
            state["reads"] += 1
            value = GLib.Variant("u", state["scheme"])
            if method == "Read":
                value = GLib.Variant("v", value)
            inv.return_value(GLib.Variant("(v)", (value,)))
            print(f"fake-portal: {method} -> {state['scheme']}", flush=True)
        elif method == "SetScheme":
            (state["scheme"],) = params.unpack()
            conn.emit_signal(None, PATH, SETTINGS, "SettingChanged",
                             GLib.Variant("(ssv)", (NAMESPACE, KEY, GLib.Variant("u", state["scheme"]))))
            print(f"fake-portal: SettingChanged -> {state['scheme']}", flush=True)
            inv.return_value(None)
        elif method == "Reads":
            inv.return_value(GLib.Variant("(u)", (state["reads"],)))

    def get_property(_conn, _sender, _path, _iface, name):
        return GLib.Variant("u", 2) if name == "version" else None

    def on_bus(conn, _name):
        for iface in node.interfaces:
            conn.register_object(PATH, iface, call, get_property, None)

    def on_name(_conn, _name):
        print("ready", flush=True)

    def on_lost(_conn, _name):
        print(f"fake-portal: cannot own {NAME} (a real portal runs here?)", file=sys.stderr, flush=True)
        loop.quit()

    Gio.bus_own_name(Gio.BusType.SESSION, NAME, Gio.BusNameOwnerFlags.NONE, on_bus, on_name, on_lost)
    loop.run()
    sys.exit(1)


if __name__ == "__main__":
    main()
