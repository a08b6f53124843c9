"""Step 8d of the desktop e2e (e2e.py): a Linear source through Settings → Sources, against
the Linear stand-in (tests/src/bin/linear-standin.rs, which e2e.sh builds: Linear's GraphQL
API with its schema enforced, on loopback, plus admin endpoints to make issues and read what
DevPilot did to them).

It runs inside e2e.py's session and uses its helpers: `run(t)` takes the e2e script's module
as `t` (its checks and waits, its WebDriver calls, its paths and the processes it ends)."""
import json
import os
import re
import subprocess

t = None  # the e2e script's module, set by run()

# tests/src/bin/linear-standin.rs: Linear's GraphQL API (its schema enforced) on loopback, with
# admin endpoints to make issues and read what DevPilot did to them. e2e.sh builds it.
STANDIN = os.environ.get("E2E_STANDIN_BIN") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR", "/root/.cache/devpilot-target"), "debug", "linear-standin")
# The API key the stand-in accepts: made up per run, and checked below to be in no file.
LINEAR_KEY = f"lin_api_e2e{os.urandom(12).hex()}"
LINEAR_ACCOUNT = "linear-api-key"  # the keychain account of the Linear key (engine: sources/keys.rs)


def standin_start():
    """Starts the stand-in; returns its GraphQL URL, from the first line it prints."""
    import select
    import threading
    env = dict(t.ENV, LINEAR_STANDIN_KEY=LINEAR_KEY)
    p = subprocess.Popen([STANDIN], env=env, stdout=subprocess.PIPE, stderr=open(os.path.join(t.WORK, "linear-standin.log"), "w"), text=True)
    t.STARTED.append(("linear-standin", p))
    ready, _, _ = select.select([p.stdout], [], [], 30)
    first = p.stdout.readline() if ready else ""
    m = re.search(r"listening on (http://127\.0\.0\.1:\d+/graphql)", first)
    t.check("the Linear stand-in starts and says where it listens", m, first)

    def drain():  # the rest of its output, so it never blocks on a full pipe
        with open(os.path.join(t.WORK, "linear-standin.out"), "w") as out:
            for line in p.stdout:
                out.write(line)
    threading.Thread(target=drain, daemon=True).start()
    return m.group(1)


def standin_admin(graphql_url, method, path, body=None):
    """One request to the stand-in's admin endpoints (`/_admin/...`); the JSON it answers."""
    import urllib.request
    base = graphql_url.rsplit("/graphql", 1)[0]
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as r:
        return json.loads(r.read() or b"null")


def age_source_turn(name):
    """Makes the source's next intake turn due now (as if its interval had passed): a
    machine that tries then takes it rather than finding it taken a moment ago."""
    import sqlite3
    with sqlite3.connect(t.DB, timeout=10) as c:
        c.execute("UPDATE sources SET polled_at = polled_at - interval_ms WHERE orchestrator_id = ? AND name = ?", (t.ORCH, name))


def source_line(name):
    return t.wd_text(f"#sources-list li[data-source='{name}'] .line") or ""


def save_source_through_the_window(key):
    """Types `key` in the form's API key field, saves, and returns what the form says."""
    t.wd_set("#source-key", key)
    t.wd_click("#source-save")
    return t.wait("the source's save finishes", lambda: (x := t.wd_text("#source-msg")) not in (None, "", "Saving…") and x, timeout=30)


def run(e2e):
    """Settings → Sources against the stand-in: a wrong key is refused by the test, the right
    one connects; the source is saved (its key in the keychain and in no file); an issue made
    in "Linear" becomes a job whose row links to the issue; a refused key later is told by a
    notification and the tray, and the right key mends it."""
    global t
    t = e2e
    url = standin_start()
    t.wd_exec("location.hash = '#settings';")
    t.wait("Settings → Sources loaded", lambda: "No Linear API key" in (t.wd_text("#sources-key") or ""), timeout=15)
    t.check("no source yet", t.wd_exec("return document.querySelectorAll('#sources-list li').length") == 0)
    t.wd_set("#source-teams", "ENG")
    t.wd_set("#source-label", "agent")
    t.wd_set("#source-api-url", url)
    t.check("the form's defaults: unstarted and started, every 60s",
          t.wd_exec("return [...document.querySelectorAll('#source-states input:checked')].map(c => c.id).join(' ')")
          == "source-state-unstarted source-state-started" and t.wd_exec("return document.querySelector('#source-interval').value") == "60s")
    # The shortest interval a source may have: each machine tries the next turn when it is
    # due, so this bounds how long the steps below wait for a poll.
    t.wd_set("#source-interval", "15s")
    # Its jobs run in repo webapp: a Linear source that names no repo takes no issue.
    t.wd_exec("loadSources();")
    t.wait("the form offers repo webapp", lambda: t.wd_exec("return [...document.querySelectorAll('#source-repo option')].some((o) => o.value === 'webapp')"), timeout=10)
    t.wd_set("#source-repo", "webapp")
    t.wd_set("#source-key", "lin_api_not_the_right_one")
    t.wd_click("#source-test")
    msg = t.wait("a wrong key is refused by the test", lambda: t.wd_exec("return document.querySelector('#source-msg').className") == "err" and t.wd_text("#source-msg"), timeout=30)
    t.check("the refusal says what is wrong, without the key", "refused" in msg and "lin_api_not_the_right_one" not in msg, msg)
    t.wd_set("#source-key", LINEAR_KEY)
    t.wd_click("#source-test")
    line = t.wait("Test connection says who the key is", lambda: (x := t.wd_text("#source-msg") or "").startswith("Connected as") and x, timeout=30)
    t.check("it names the team and the label", "team ENG" in line and "label agent" in line, line)
    t.wd_exec("document.getElementById('source-advanced').open = true; document.getElementById('sources').scrollIntoView();")
    t.shot("11-sources-tested")
    msg = save_source_through_the_window(LINEAR_KEY)
    t.check("the source is saved", msg.startswith("Saved."), msg)
    t.check("the form forgets the key once saved", t.wd_exec("return document.querySelector('#source-key').value") == "")
    text = t.config_text()
    t.check("the settings file has the source, with its address", "[sources.eng]" in text and url in text and LINEAR_KEY not in text, text)
    r = subprocess.run(["secret-tool", "search", "--unlock", "service", t.PROFILE_NAME], capture_output=True, text=True)
    check_in = f"secret = {LINEAR_KEY}" in r.stdout and LINEAR_ACCOUNT in r.stdout
    t.check("the key is in the Secret Service, under the app's own service", check_in, r.stderr)
    t.wait("Sources says where the key comes from", lambda: "comes from the OS keychain" in (t.wd_text("#sources-key") or ""), timeout=10)

    issue = standin_admin(url, "POST", "/_admin/issues", {"title": "Fix the flaky login test", "description": "It fails one run in ten on CI.", "labels": ["agent"]})
    issue = issue.get("issue", issue)
    t.log(f"issue made in the stand-in: {issue['identifier']} {issue['url']}")
    age_source_turn("eng")
    t.wd_exec("location.hash = '#queue';")
    href = t.wait("the jobs list links a job to the issue",
                lambda: t.wd_exec("refreshJobs(); const a = [...document.querySelectorAll('#jobs a.issue')].find(a => a.textContent === arguments[0]);"
                                "return a ? a.getAttribute('href') : null", [issue["identifier"]]), timeout=60, every=1)
    t.check("the link is the issue's URL", href == issue["url"], href)
    jid = int(t.wd_exec("return document.querySelector('#jobs a.issue').closest('tr').dataset.id"))
    d = t.wait("the issue's job completes", lambda: (d := t.wd_invoke("job_detail", {"id": jid}))["job"]["state"] == "completed" and d, timeout=60)
    t.check("the job is the issue's", d["job"]["issue"] == issue["identifier"] and d["payload"]["source"]["url"] == issue["url"], d["job"])
    comments = t.wait("DevPilot reported back on the issue", lambda: (c := standin_admin(url, "GET", f"/_admin/comments?issue={issue['identifier']}")) and (c.get("comments", c) if isinstance(c, dict) else c), timeout=60, every=1)
    t.log(f"comments on {issue['identifier']}: {json.dumps(comments)[:400]}")
    rejected = standin_admin(url, "GET", "/_admin/rejected")
    t.check("the Linear stand-in refused no request DevPilot sent (the schema allows each)", rejected == [], rejected)
    t.wd_exec("document.querySelector('#jobs a.issue').scrollIntoView({block: 'center'});")
    t.shot("12-job-from-a-linear-issue")
    t.wd_exec("location.hash = '#settings';")
    line = t.wait("Sources shows the source healthy, polled by this machine",
                lambda: (x := source_line("eng")).startswith("eng (linear): OK — last poll") and f"by {t.MACHINE}" in x and x, timeout=30)
    t.log(f"source line: {line!r}")
    t.wd_exec("document.getElementById('sources').scrollIntoView();")
    t.shot("13-sources-ok")

    # A key Linear refuses: said once by a notification, and by the tray, until the right one is back.
    msg = save_source_through_the_window("lin_api_revoked_e2e")
    t.check("a new key is saved", msg.startswith("Saved."), msg)
    age_source_turn("eng")
    t.wait("Sources says the key is wrong", lambda: source_line("eng").startswith("eng (linear): wrong key"), timeout=60, every=1)
    sent = t.wait("a notification tells of the refused key",
                lambda: [x for x in t.wd_invoke("recent_notifications") if "source_trouble" in x["kinds"]], timeout=20)
    t.check("it names the source and opens Settings", "Source eng: Linear" in sent[-1]["body"] and sent[-1]["error"] is None, sent[-1])
    t.wait("the tray menu says so", lambda: any("Linear eng: wrong key" in label for label in t.tray_menu_labels()), timeout=10)
    t.wait("and the hover text", lambda: "Linear eng: wrong key" in t.sni_prop("Title"), timeout=10)
    t.shot("14-source-wrong-key")
    msg = save_source_through_the_window(LINEAR_KEY)
    t.check("the right key is saved again", msg.startswith("Saved."), msg)
    age_source_turn("eng")
    t.wait("the source is healthy again", lambda: source_line("eng").startswith("eng (linear): OK"), timeout=60, every=1)
    t.wait("the tray no longer speaks of it", lambda: not any("Linear eng" in label for label in t.tray_menu_labels()), timeout=10)
    leaked = t.files_holding(LINEAR_KEY, t.ENV["XDG_CONFIG_HOME"], t.ENV["XDG_DATA_HOME"])
    t.check("the Linear key is in no file under the config and data dirs (logs included)", leaked.strip() == "", leaked)


