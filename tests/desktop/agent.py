#!/usr/bin/env python3
"""The e2e test's agent: prints its payload (and where it runs), sleeps payload["sleep"]
seconds (default 1), or until the file payload["until"] exists, printing a line every half
second when payload["chatter"] is set, and exits with payload["exit"] (default 0). With
payload["write"], or a "write: FILE" in its prompt (a tracker issue's text), it first writes
that file where it runs: a change for a hand-off to carry, or for a pull request (a job that
changes nothing opens none). SIGTERM ends it at once."""
import json, os, re, signal, sys, time

signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
payload = json.loads(sys.stdin.read() or "{}")
print("e2e agent got:", json.dumps(payload), "job", os.environ.get("DEVPILOT_JOB_ID"), flush=True)
print("e2e agent runs in", os.getcwd(), "on branch", os.environ.get("DEVPILOT_BRANCH", "(none)"), flush=True)
asked = re.search(r"\bwrite: ([\w.-]+)", str(payload.get("prompt", "")))
write = payload.get("write") or (asked and asked.group(1))
if write:
    with open(write, "w") as f:
        f.write("work in progress\n")
    print("e2e agent wrote", write, flush=True)
end = time.time() + float(payload.get("sleep", 1))
until = payload.get("until")
step = 0
while time.time() < end and not (until and os.path.exists(until)):
    if payload.get("chatter"):
        step += 1
        print(f"e2e agent step {step}: still working on {payload.get('title', 'it')}", flush=True)
    time.sleep(min(0.5, max(0.0, end - time.time())))
print("e2e agent done", flush=True)
sys.exit(int(payload.get("exit", 0)))
