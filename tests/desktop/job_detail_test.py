#!/usr/bin/env python3
"""A job's detail says what its agent CLI reported: the preset, the session (shortened, the
whole id on hover), the cost, the tokens, and the machine whose conversation it resumed.

In the e2e's headless session, against the real app on a SQLite queue of its own:
- the app (through tauri-driver) runs a job with the e2e agent (tests/desktop/agent.py);
- the job's agent columns are then set with a plain UPDATE, as the engine writes them after a
  preset's attempt that resumed a conversation carried from "laptop" (the e2e has no model
  CLI: what is tested here is that the window and the CLI show what the row says);
- the window's job detail shows them, and is screenshotted (job-detail-resumed.png, an
  artifact; docs/ shows a job page from docs_shots.py instead, with realistic data);
- `devpilot status --json` carries them under "agent", and `devpilot status` prints the line.

Run alone: E2E_ONLY=job_detail_test bash tests/desktop/e2e.sh
"""
import json
import os
import sqlite3
import subprocess
import tempfile

import desk  # tests/desktop/desk.py (the script's folder is on sys.path)

ENV = os.environ
WORK = tempfile.mkdtemp(prefix="job-detail-", dir=ENV["E2E_WORK"])
ART = ENV["E2E_ARTIFACTS"]
TRAY = ENV["E2E_TRAY_BIN"]
CLI = ENV["E2E_CLI_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
DB = os.path.join(WORK, "queue.sqlite")
ORCH = "job-detail"
SESSION_ID = "b5f7c2d1-9e4a-4f0b-8c3d-2a1e6f7b9c0d"

CHECKS = desk.Checks("job detail: ")
log, check, wait = CHECKS.log, CHECKS.check, CHECKS.wait
D = desk.WebDriver(log=log)
STARTED = []
# The app's pids (started by WebKitWebDriver under tauri-driver), found by its binary and this
# test's XDG_CONFIG_HOME: it is ended by them, never by a name.
APP_MARKER = f"XDG_CONFIG_HOME={os.path.join(WORK, 'config')}"
APP_PIDS = []


def app_env():
    e = {k: v for k, v in ENV.items() if not k.startswith("DEVPILOT_")}
    e.update({
        "XDG_CONFIG_HOME": os.path.join(WORK, "config"),
        "XDG_DATA_HOME": os.path.join(WORK, "data"),
        "DEVPILOT_DATABASE_URL": f"sqlite://{DB}",
        "DEVPILOT_ORCHESTRATOR": ORCH,
        "DEVPILOT_AGENT": f"python3 {os.path.join(HERE, 'agent.py')}",
        "DEVPILOT_LOG": "info",
        "DEVPILOT_NO_SLEEP_HOOK": "1",
        "NO_AT_BRIDGE": "1",
        "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={WORK}/no-system-bus",
    })
    return e


def cli(*args):
    r = subprocess.run([CLI, *args], env=app_env(), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"devpilot {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def detail_agent():
    """The detail's agent line, once it is shown; else None."""
    return D.visible("#detail-agent") and D.text("#detail-agent")


def main():
    drv = subprocess.Popen(["tauri-driver"], env=app_env(), stdout=subprocess.DEVNULL,
                           stderr=open(os.path.join(WORK, "tauri-driver.log"), "w"))
    STARTED.append(drv)
    wait("tauri-driver listens", lambda: D.request("GET", "/status") is not None, timeout=20)
    D.start(TRAY, ["--show"])
    APP_PIDS.extend(wait("the app's pid is known", lambda: desk.app_pids(TRAY, APP_MARKER), timeout=20))
    wait("the engine is idle on its own queue", lambda: D.invoke("get_status")["state"] == "idle", timeout=40)

    payload = {"title": "ENG-7 Fix the login redirect", "prompt": "Keep the page the user asked for.", "sleep": 0}
    jid = int(cli("enqueue", "--orchestrator", ORCH, "--payload", json.dumps(payload)).strip())
    wait("the job completes", lambda: D.invoke("job_detail", {"id": jid})["job"]["state"] == "completed", timeout=60)
    check("a plain command reports no agent run", D.invoke("job_detail", {"id": jid})["job"]["agent"]["agent"] is None)
    with sqlite3.connect(DB, timeout=10) as c:
        c.execute("UPDATE dispatch_queue SET agent = 'claude', agent_session = ?, cost_usd = 0.0997, tokens_in = 24693,"
                  " tokens_out = 45, session_from = 'laptop',"
                  " summary = 'Kept the page the user asked for through the login redirect, with a test.'"
                  " WHERE id = ?", (SESSION_ID, jid))

    D.exec("location.hash = '#queue'; showJob(arguments[0]);", jid)
    text = wait("the detail shows the agent run", lambda: (t := detail_agent()) and "resumed from laptop" in t and t, timeout=15)
    log(f"agent line: {text!r}")
    check("it names the preset, the session (short), the cost, the tokens and the machine",
          text == "claude · session b5f7c2d1… · $0.10 · 24,693 in / 45 out tokens · resumed from laptop", text)
    hover = D.exec("return document.querySelector('#detail-agent .agent-session')?.title")
    check("the whole session id is on hover", hover == f"claude session {SESSION_ID}", hover)
    D.exec("document.getElementById('jobs').closest('table').scrollIntoView({block: 'start'});")
    D.painted()
    log(f"screenshot: {D.screenshot(os.path.join(ART, 'job-detail-resumed.png'))}")

    v = json.loads(cli("status", "--orchestrator", ORCH, "--json"))
    job = next((j for j in v["recent"] if j["id"] == jid), {})
    check("`devpilot status --json` carries the agent run",
          job.get("agent") == {"agent": "claude", "agent_session": SESSION_ID, "cost_usd": 0.0997, "tokens_in": 24693,
                               "tokens_out": 45, "session_from": "laptop"}, job.get("agent"))
    out = cli("status", "--orchestrator", ORCH)
    check("`devpilot status` prints it under the job",
          "agent: claude · session b5f7c2d1… · $0.0997 · 24,693 in / 45 out tokens · resumed from laptop" in out, out)
    log(f"job detail: ALL {len(CHECKS.results)} CHECKS PASSED")


if __name__ == "__main__":
    try:
        main()
    finally:
        D.end()
        desk.end_started(STARTED)
        desk.end_pids([p for p in desk.app_pids(TRAY, APP_MARKER) if p in APP_PIDS])
