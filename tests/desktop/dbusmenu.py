#!/usr/bin/python3
"""Reads a tray item's menu the way a tray host does: over D-Bus, from the item's
com.canonical.dbusmenu object (GetLayout), on the session bus. Prints the layout as JSON:
{"id", "label", "enabled", "visible", "type", "toggle_state", "children": [...]} (dbusmenu's defaults filled in:
enabled and visible true, type "standard").

Needs python3-gi (Debian), so run it with /usr/bin/python3.
Usage: dbusmenu.py BUS_NAME MENU_PATH
"""
import json
import sys

from gi.repository import Gio, GLib


def node(item):
    ident, props, children = item
    return {
        "id": ident,
        "label": props.get("label", ""),
        "enabled": props.get("enabled", True),
        "visible": props.get("visible", True),
        "type": props.get("type", "standard"),
        # A check item's state: 1 checked, 0 not, -1 not a check item.
        "toggle_state": props.get("toggle-state", -1) if props.get("toggle-type") else -1,
        "children": [node(c) for c in children],
    }


def main():
    name, path = sys.argv[1], sys.argv[2]
    bus = Gio.bus_get_sync(Gio.BusType.SESSION, None)
    reply = bus.call_sync(name, path, "com.canonical.dbusmenu", "GetLayout",
                          GLib.Variant("(iias)", (0, -1, [])), GLib.VariantType("(u(ia{sv}av))"),
                          Gio.DBusCallFlags.NONE, 10000, None)
    _revision, layout = reply.unpack()
    print(json.dumps(node(layout)))


if __name__ == "__main__":
    main()
