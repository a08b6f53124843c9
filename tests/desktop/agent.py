#!/usr/bin/env python3
"""The e2e test's agent: prints its payload, sleeps payload["sleep"] seconds (default 1),
exits with payload["exit"] (default 0). SIGTERM ends it at once."""
import json, os, signal, sys, time

signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
payload = json.loads(sys.stdin.read() or "{}")
print("e2e agent got:", json.dumps(payload), "job", os.environ.get("DEVPILOT_JOB_ID"), flush=True)
time.sleep(float(payload.get("sleep", 1)))
print("e2e agent done", flush=True)
sys.exit(int(payload.get("exit", 0)))
