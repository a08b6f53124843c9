#!/usr/bin/env python3
"""The sleep hook (src-tauri/src/sleep.rs), end to end, in the e2e's headless session.

There is no logind here. The test starts a PRIVATE dbus-daemon and gives its address to the
app alone as DBUS_SYSTEM_BUS_ADDRESS; on it, fake_logind.py plays org.freedesktop.login1.
That peer is a test double of the OS service (it implements Inhibit with a real fd and emits
PrepareForSleep the way logind documents it); what is real is the app: its zbus client, its
inhibitor handling, the engine's hand-off, the queue file and the notifications.

Observed, not assumed:
- at start the app takes a "delay" sleep inhibitor (the fd arrives at the fake);
- PrepareForSleep(true) with a job running (default setting: hand off): the app releases the
  inhibitor fd within logind's delay window, and by then the job is back to `queued`, not
  held by anyone, with a `handed_off` history entry, and its agent process is gone; while
  "asleep" nothing is claimed;
- PrepareForSleep(false): the app takes a new inhibitor, logs that it re-checks the leases,
  resumes and claims the job again; no "offline" notification is sent after the wake.

Keep awake (src-tauri/src/awake.rs), with `keep_awake = true` in this app's settings file:
- while nothing runs, no "block" inhibitor is held;
- when the job starts running, the app takes Inhibit("idle:sleep", "DevPilot", "Agents are
  running", "block");
- it does not stop a lid close: the fake, like logind with LidSwitchIgnoreInhibited=yes, goes
  ahead with it held, and the hand-off above happens all the same; the hand-off stops the
  agent, and that closes the block inhibitor's fd;
- after the wake the job runs again and the block is taken again; when the job ends (its
  agent exits), the fd is closed, while the app and its delay inhibitor stay.
"""
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time

import desk  # tests/desktop/desk.py (the script's folder is on sys.path)

ENV = os.environ
HERE = os.path.dirname(os.path.abspath(__file__))
WORK = tempfile.mkdtemp(prefix="sleep-", dir=ENV["E2E_WORK"])
ART = ENV["E2E_ARTIFACTS"]
TRAY = ENV["E2E_TRAY_BIN"]
CLI = ENV["E2E_CLI_BIN"]
ORCH = "sleep"
DB = os.path.join(WORK, "queue.sqlite")
AGENT = f"python3 {os.path.join(HERE, 'agent.py')}"
SYSBUS = f"unix:path={WORK}/system_bus_socket"
STARTED = []


CHECKS = desk.Checks("sleep: ")
log, check, wait = CHECKS.log, CHECKS.check, CHECKS.wait


def base_env():
    e = dict(ENV)
    e.pop("DEVPILOT_NO_SLEEP_HOOK", None)
    e.update({
        "XDG_CONFIG_HOME": os.path.join(WORK, "config"),
        "XDG_DATA_HOME": os.path.join(WORK, "data"),
        "DEVPILOT_DATABASE_URL": f"sqlite://{DB}",
        "DEVPILOT_ORCHESTRATOR": ORCH,
        "DEVPILOT_AGENT": AGENT,
        "DEVPILOT_LOG": "info,devpilot=debug",
        "NO_AT_BRIDGE": "1",
    })
    return e


def cli(*args):
    r = subprocess.run([CLI, *args], env=base_env(), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"devpilot {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def fake(method):
    r = subprocess.run(["gdbus", "call", "--address", SYSBUS, "--dest", "org.freedesktop.login1",
                        "--object-path", "/org/freedesktop/login1", "--timeout", "20",
                        "--method", f"dev.devpilot.test.FakeLogind.{method}"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"fake logind {method}: {r.stderr.strip()}")
    out = r.stdout.strip()
    if out.startswith("('"):
        return json.loads(out[2:-3].replace("\\'", "'"))
    return None


def events(kind=None):
    return [e for e in fake("Events") if kind is None or e["kind"] == kind]


def is_keep_awake(e):
    return e.get("what") == "idle:sleep" and e.get("mode") == "block"


def keep_awake_events(kind):
    return [e for e in events(kind) if is_keep_awake(e)]


def held_blocks():
    return [i for i in fake("Held") if i["mode"] == "block"]


# Where the test's flag for the agent is: the only directory of the test's its sandbox shows.
FLAGS = os.path.join(WORK, "flags")


def write_settings():
    """This app's settings file: keep awake on (the default is off), and the directory of the
    flag that lets the agent end shown to it (read-only) in its sandbox."""
    profile = "devpilot-dev" if ENV.get("E2E_PROFILE", "debug") == "debug" else "devpilot"
    d = os.path.join(WORK, "config", profile)
    os.makedirs(d, exist_ok=True)
    os.makedirs(FLAGS, exist_ok=True)
    with open(os.path.join(d, "config.toml"), "w") as f:
        f.write(f'keep_awake = true\n[sandbox]\nread_only = ["{FLAGS}"]\n')


def job(jid):
    with sqlite3.connect(f"file:{DB}?mode=ro", uri=True, timeout=5) as c:
        row = c.execute("SELECT state, claimed_by, claimed_at FROM dispatch_queue WHERE id = ?", (jid,)).fetchone()
        hist = [r[0] for r in c.execute("SELECT kind FROM job_events WHERE job_id = ? ORDER BY id", (jid,))]
    # claimed_by keeps the last holder after a release (by design); claimed_at is the claim.
    return {"state": row[0], "last_holder": row[1], "claimed_at": row[2], "history": hist}


def agent_pids(jid):
    out = subprocess.run(["pgrep", "-f", "tests/desktop/agent.py"], capture_output=True, text=True).stdout.split()
    pids = []
    for p in out:
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"DEVPILOT_JOB_ID={jid}".encode() in env and f"DEVPILOT_ORCHESTRATOR_ID={ORCH}".encode() in env:
            pids.append(int(p))
    return pids


def notify_log():
    with open(os.path.join(ENV["E2E_WORK"], "notify-monitor.log"), errors="replace") as f:
        return f.read()


def app_log():
    with open(os.path.join(WORK, "tray.log"), errors="replace") as f:
        return f.read()


def main():
    # The private "system bus" and the logind test double on it.
    bus = subprocess.Popen(["dbus-daemon", "--session", "--nofork", f"--address={SYSBUS}"],
                           stdout=subprocess.DEVNULL, stderr=open(os.path.join(WORK, "sysbus.log"), "w"))
    STARTED.append(bus)
    wait("private system bus is up", lambda: os.path.exists(f"{WORK}/system_bus_socket"), timeout=10)
    flog = open(os.path.join(WORK, "fake-logind.log"), "w")
    fk = subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "fake_logind.py"), SYSBUS], stdout=flog, stderr=subprocess.STDOUT)
    STARTED.append(fk)
    wait("the logind test double owns org.freedesktop.login1", lambda: events("name_acquired"), timeout=10)

    # The app, with the private bus as its system bus (and only the app).
    write_settings()
    env = base_env()
    env["DBUS_SYSTEM_BUS_ADDRESS"] = SYSBUS
    tlog = open(os.path.join(WORK, "tray.log"), "w")
    app = subprocess.Popen([TRAY], env=env, stdout=tlog, stderr=subprocess.STDOUT)
    STARTED.append(app)
    taken = wait("the app takes a delay sleep inhibitor at start",
                 lambda: [e for e in events("inhibitor_taken") if e["mode"] == "delay" and "sleep" in e["what"]], timeout=40)
    check("the inhibitor names DevPilot", taken[0]["who"] == "DevPilot", taken)
    wait("the app logs that the sleep hook is ready", lambda: "sleep hook ready" in app_log(), timeout=10)
    wait("the app logs that keep awake is on (from its settings file)", lambda: "keep awake while agents run: on" in app_log(), timeout=10)
    check("keep awake: no block inhibitor while nothing runs", not held_blocks(), fake("Held"))

    done_file = os.path.join(FLAGS, "job-may-end")
    payload = {"title": "running at sleep", "sleep": 300, "until": done_file}
    jid = int(cli("enqueue", "--orchestrator", ORCH, "--payload", json.dumps(payload)).strip())
    wait("the app runs the job", lambda: job(jid)["state"] == "running", timeout=30)
    wait("its agent process is alive", lambda: agent_pids(jid), timeout=10)
    blocks = wait("keep awake: an idle:sleep block inhibitor is taken while the job runs",
                  lambda: keep_awake_events("inhibitor_taken"), timeout=10)
    check("it says who and why", blocks[0]["who"] == "DevPilot" and blocks[0]["why"] == "Agents are running", blocks)
    check("logind holds it (and no lid-switch lock)",
          [(i["what"], i["mode"]) for i in held_blocks()] == [("idle:sleep", "block")], fake("Held"))
    check("the inhibitor is still held while awake", not events("inhibitor_released"))

    # Sleep. The fake returns once the delay inhibitor is released (or after 5 s, as logind).
    res = fake("Sleep")
    log(f"sleep: fake logind says {res}")
    check("the app released its inhibitor within logind's delay window", res["released_after_ms"] is not None and res["held_before"] >= 1, res)
    check("keep awake did not stop the lid: sleep went ahead with the block held", res["block_held"] == 1 and not res["lid_blocked"], res)
    # By the time the inhibitor is released, the hand-off is done: look at once.
    j = job(jid)
    check("before sleep the job went back to queued, claimed by nobody", j["state"] == "queued" and j["claimed_at"] is None, j)
    check("the job's history records the hand-off", "handed_off" in j["history"], j["history"])
    wait("the job's agent process has stopped", lambda: not agent_pids(jid), timeout=5)
    wait("keep awake: the hand-off stopped the agent, and its fd is closed",
         lambda: keep_awake_events("inhibitor_released") and not held_blocks(), timeout=10)
    time.sleep(3)
    check("nothing is claimed while asleep", job(jid)["state"] == "queued", job(jid))

    # Wake.
    mark = len(notify_log())
    fake("Wake")
    wait("after the wake the app takes a new inhibitor", lambda: len(events("inhibitor_taken")) >= 2, timeout=10)
    wait("after the wake the app re-checks its leases", lambda: "woke up: re-checking leases" in app_log(), timeout=10)
    wait("after the wake the app resumes and claims the job again", lambda: job(jid)["state"] == "running", timeout=30)
    wait("keep awake: the block is taken again while the job runs again",
         lambda: len(keep_awake_events("inhibitor_taken")) == 2 and held_blocks(), timeout=10)
    time.sleep(5)
    after = notify_log()[mark:]
    check("no 'offline' notification after the wake", "offline" not in after.lower(), after[-2000:])

    # The job ends (its agent exits 0): the block goes; the app and its delay inhibitor stay.
    with open(done_file, "w"):
        pass
    wait("the job completes", lambda: job(jid)["state"] == "completed", timeout=30)
    wait("keep awake: the fd is closed when the job ends", lambda: len(keep_awake_events("inhibitor_released")) == 2, timeout=10)
    held = fake("Held")
    check("only the sleep delay inhibitor is left, the app still running",
          [(i["what"], i["mode"]) for i in held] == [("sleep", "delay")] and app.poll() is None, held)

    # Quit: SIGTERM hands off; the inhibitor goes with the process.
    app.terminate()
    app.wait(30)
    wait("the inhibitor is released when the app exits",
         lambda: len([e for e in events("inhibitor_released") if e["mode"] == "delay"]) >= 2 and not fake("Held"), timeout=10)
    with open(os.path.join(ART, "sleep-events.json"), "w") as f:
        json.dump(events(), f, indent=1)
    log("sleep: ALL CHECKS PASSED")


def finish():
    for p in reversed(STARTED):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
    for name in ("tray.log", "fake-logind.log"):
        try:
            subprocess.run(["cp", os.path.join(WORK, name), os.path.join(ART, f"sleep-{name}")], check=False)
        except Exception:  # noqa: BLE001
            pass


if __name__ == "__main__":
    try:
        main()
    finally:
        finish()
