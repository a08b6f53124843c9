"""The e2e's live-transcript step: a real claude job (the CLI from the registry, its model the
scripted `model-server`, which answers each turn a few seconds late) runs on another machine,
"desktop", a `devpilot run` of its own. The window's job page shows its transcript, at least
three lines, while the job still runs, then the job completes with the model's last words.

Called from e2e.py with that module, whose helpers it uses (`t.wd_exec`, `t.wait`, …).
"""

import json
import os
import shutil
import subprocess
import tempfile

LABEL = "claude-box"


def clis():
    """Where scripts/agent_clis.sh installed the agent CLIs."""
    d = os.environ.get("DEVPILOT_AGENT_CLIS") or os.path.join(os.path.expanduser("~"), ".cache", "devpilot-agent-clis")
    return os.path.join(d, "bin")


def model_server(t, script):
    """The scripted model server, started with `script`; its process and base URL."""
    exe = os.environ["E2E_MODEL_SERVER_BIN"]
    path = os.path.join(t.WORK, "model-script.json")
    with open(path, "w") as f:
        json.dump(script, f)
    p = subprocess.Popen([exe, path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return p, p.stdout.readline().strip()


def run(t):
    claude = os.path.join(clis(), "claude")
    t.check("the real claude CLI is installed (scripts/agent_clis.sh)", os.access(claude, os.X_OK), claude)
    jid = int(t.cli("enqueue", "--orchestrator", t.ORCH, "--title", "Write the release notes", "--repo", "webapp",
                    "--requires", LABEL, "--prompt", "Write NOTES.md with the release notes, then check it.").strip())
    # Its worktree, as every machine sharing these settings names it: the tool calls' paths.
    wt = os.path.join(t.ENV["XDG_DATA_HOME"], t.PROFILE_NAME, "worktrees", t.ORCH, str(jid))
    notes = os.path.join(wt, "NOTES.md")
    # A write, a read, then the final words, each answered 2.5 s late: a job that runs ~8 s,
    # long enough to watch.
    script = [
        {"wait_ms": 2500}, {"tool": "Write", "input": {"file_path": notes, "content": "# Release notes\n\n- Fix the login redirect.\n"}},
        {"wait_ms": 2500}, {"tool": "Read", "input": {"file_path": notes}},
        {"wait_ms": 2500}, {"text": "Wrote NOTES.md with the release notes."},
    ]
    server, url = model_server(t, script)
    home = tempfile.mkdtemp(prefix="devpilot-claude-home-", dir="/var/tmp")
    env = t.app_env()
    env.update({
        "HOME": home, "PATH": f"{clis()}:{env['PATH']}",
        "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "sk-ant-test-key",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    })
    env.pop("DEVPILOT_AGENT", None)
    desktop = subprocess.Popen([t.CLI, "run", "--orchestrator", t.ORCH, "--machine", "desktop", "--labels", LABEL,
                                "--until-empty", "--poll-interval", "300ms", "--heartbeat", "1s", "--agent", "claude"],
                               env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(t.ART, "desktop-run.log"), "w"))
    try:
        t.wd_exec("location.hash = '#queue'; showJob(arguments[0]);", [jid])

        def live():
            # The CLI's own events (not DevPilot's plain lines about the worktree).
            lines = t.wd_exec("showJob(arguments[0]); return [...document.querySelectorAll('#detail-transcript .t-line:not(.plain)')]"
                              ".map((l) => l.textContent.split('\\n')[0]);", [jid]) or []
            state = t.wd_invoke("job_detail", {"id": jid})["job"]["state"]
            return len(lines) >= 3 and state == "running" and lines
        lines = t.wait("the job page shows three transcript lines while claude still runs on desktop", live, timeout=60, every=0.5)
        t.log(f"transcript so far: {lines}")
        t.check("they are the CLI's own start and tool call", any(l.startswith("Started with") for l in lines)
                and any(l.startswith("▸ Write ") and "NOTES.md" in l for l in lines), lines)
        t.shot("18-live-transcript-from-desktop")
        d = t.wait("the job completes on desktop", lambda: (d := t.wd_invoke("job_detail", {"id": jid}))["job"]["state"] == "completed" and d, timeout=60)
        t.check("with the model's last words as its summary, from desktop",
                d["job"]["summary"] == "Wrote NOTES.md with the release notes." and d["job"]["claimed_by"] == "desktop", d["job"])
        # The holder stores its log's tail with each heartbeat: the last one, with the result
        # event, may land a moment after the job completes. Wait for it, not for any line.
        done = t.wait("the transcript ends with Done", lambda: (x := t.wd_exec(
            "showJob(arguments[0]); const l = [...document.querySelectorAll('#detail-transcript .t-line')]; return l.length && l[l.length - 1].textContent", [jid]))
            and x.startswith("✓ Done") and x, timeout=30)
        t.check("its last line says it is done", done.startswith("✓ Done"), done)
        t.shot("18b-transcript-done")
        desktop.wait(timeout=60)
    finally:
        if desktop.poll() is None:
            desktop.kill()
        server.kill()
        shutil.rmtree(home, ignore_errors=True)
