#!/usr/bin/env python3
"""The screenshots docs/ and the README show, taken with realistic data: a user "alex" whose
laptop runs the tray app on the embedded SQLite queue with the real claude CLI, a GitHub
repository acme/webapp (the GitHub stand-in) with labelled issues, a second machine
"desktop" (a `devpilot run` of its own, user "sam"), and claude's model the scripted
`model-server`. Nothing in them is a test name, a /tmp path or a test banner.

Each screen is asserted as it is taken (this is a test too), then saved to the artifacts as
docs-*.png; `scripts/docs_shots.sh` runs it and copies them into docs/.

Run alone: E2E_ONLY=docs_shots E2E_PROFILE=release bash tests/desktop/e2e.sh
"""
import json
import os
import re
import shutil
import sqlite3
import subprocess
import time
import urllib.request

import desk  # tests/desktop/desk.py

ENV = os.environ
ART = ENV["E2E_ARTIFACTS"]
TRAY, CLI = ENV["E2E_TRAY_BIN"], ENV["E2E_CLI_BIN"]
WORK = ENV["E2E_WORK"]
HOME, SAM = "/home/alex", "/home/sam"
REMOTE = "https://github.com/acme/webapp.git"
TOKEN = f"ghp_docs{os.urandom(12).hex()}"
# A debug build of the tray is the "devpilot-dev" profile (its own config and data); the CLI
# and a release tray are "devpilot".
TRAY_APP = "devpilot-dev" if ENV.get("E2E_PROFILE", "debug") == "debug" else "devpilot"
CLIS = os.path.join(ENV.get("DEVPILOT_AGENT_CLIS") or "/root/.cache/devpilot-agent-clis", "bin")

CHECKS = desk.Checks("docs: ")
log, check, wait = CHECKS.log, CHECKS.check, CHECKS.wait
D = desk.WebDriver(log=log)
STARTED = []
APP_MARKER = f"HOME={HOME}"


def git(*args, cwd=None, home=HOME):
    env = dict(ENV, HOME=home, XDG_CONFIG_HOME=os.path.join(home, ".config"))
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def repos():
    """acme/webapp: a bare repository (the stand-in's git), alex's and sam's clones of it, each
    with `origin` at github.com, which their git config sends to the bare one."""
    bare, seed = os.path.join(WORK, "webapp.git"), os.path.join(WORK, "seed")
    git("init", "--quiet", "--bare", "--initial-branch=main", bare)
    os.makedirs(os.path.join(seed, "src"))
    files = {"README.md": "# webapp\n\nThe Acme web app.\n",
             "src/login.js": "export function afterLogin(user, next) {\n  return redirect(next || '/login');\n}\n",
             "src/signup.js": "export function signup(form) {\n  return post('/api/signup', form);\n}\n"}
    for name, text in files.items():
        with open(os.path.join(seed, name), "w") as f:
            f.write(text)
    git("init", "--quiet", "--initial-branch=main", cwd=seed)
    git("-c", "user.name=Alex", "-c", "user.email=alex@acme.dev", "add", "-A", cwd=seed)
    git("-c", "user.name=Alex", "-c", "user.email=alex@acme.dev", "commit", "--quiet", "-m", "webapp", cwd=seed)
    git("push", "--quiet", bare, "main", cwd=seed)
    for home, name in [(HOME, "Alex"), (SAM, "Sam")]:
        cfg = os.path.join(home, ".config", "git", "config")
        os.makedirs(os.path.dirname(cfg), exist_ok=True)
        with open(cfg, "w") as f:
            f.write(f'[user]\n\tname = {name}\n\temail = {name.lower()}@acme.dev\n[url "{bare}"]\n\tinsteadOf = {REMOTE}\n')
        clone = os.path.join(home, "src", "webapp")
        git("clone", "--quiet", REMOTE, clone, home=home)
    return bare


def standin(bare):
    """The GitHub stand-in with acme/webapp; its URL."""
    p = subprocess.Popen([ENV["E2E_GITHUB_STANDIN_BIN"]], env=dict(ENV, GITHUB_STANDIN_TOKEN=TOKEN),
                         stdout=subprocess.PIPE, stderr=open(os.path.join(WORK, "docs-standin.log"), "w"), text=True)
    STARTED.append(p)
    url = re.search(r"listening on (http://127\.0\.0\.1:\d+)", p.stdout.readline()).group(1)
    admin(url, "/_admin/repos", {"repo": "acme/webapp", "git": bare})
    return url


def admin(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as r:
        return json.loads(r.read() or b"null")


def model_server(script):
    path = os.path.join(WORK, "docs-model.json")
    with open(path, "w") as f:
        json.dump(script, f)
    p = subprocess.Popen([ENV["E2E_MODEL_SERVER_BIN"], path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    STARTED.append(p)
    return p.stdout.readline().strip()


def settings(home, machine, top="", tables="", app="devpilot"):
    d = os.path.join(home, ".config", app)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.toml"), "w") as f:
        f.write(f'orchestrator_id = "team"\nmachine = "{machine}"\nagent = "claude"\npoll_interval = "1s"\n'
                f'heartbeat = "2s"\n{top}\n[repos.webapp]\npath = "~/src/webapp"\npush = true\n{tables}')


def env_of(home, model, standin_url):
    e = {k: v for k, v in ENV.items() if not k.startswith(("DEVPILOT_", "XDG_CONFIG_HOME", "XDG_DATA_HOME"))}
    e.update({
        "HOME": home, "PATH": f"{CLIS}:{ENV['PATH']}",
        "DEVPILOT_GITHUB_API_URL": standin_url, "GITHUB_TOKEN": TOKEN,
        "ANTHROPIC_BASE_URL": model, "ANTHROPIC_API_KEY": "sk-ant-docs",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DEVPILOT_NO_SLEEP_HOOK": "1", "NO_AT_BRIDGE": "1",
        "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={WORK}/no-system-bus", "DEVPILOT_LOG": "info",
    })
    return e


LOGIN_V2 = ("export function afterLogin(user, next) {\n"
            "  // A `next` back to the login page would loop: signed-in users go home instead.\n"
            "  const to = next && new URL(next, 'http://x').pathname !== '/login' ? next : '/';\n"
            "  return redirect(to);\n}\n")
DB = os.path.join(HOME, f".local/share/{TRAY_APP}/devpilot.sqlite")


def sql(statement):
    """One statement on the laptop's SQLite queue (the stand-in's time passes by moving rows)."""
    with sqlite3.connect(DB, timeout=10) as c:
        return c.execute(statement).fetchall()


def review_loop(url):
    """#1's pull request gets a review asking for changes and a red check; the laptop's claude
    answers them in the same conversation; the job's page shows the follow-up and its replies."""
    pr = int(job(1)["job"]["url"].rstrip("/").rsplit("/", 1)[1])
    admin(url, "/_admin/roles", {"repo": "acme/webapp", "user": "grace", "role": "write"})
    admin(url, "/_admin/review", {"repo": "acme/webapp", "number": pr, "user": "grace", "state": "CHANGES_REQUESTED",
                                  "body": "Close! Two things before this goes in.", "comments": [
                                      {"path": "src/login.js", "line": 3, "body": "`/login?next=/` is the login page too."},
                                      {"path": "src/login.js", "line": 2, "body": "Say why in the comment, not what."}]})
    admin(url, "/_admin/check_run", {"repo": "acme/webapp", "number": pr, "name": "test", "conclusion": "failure",
                                     "title": "1 test failed", "summary": "login.test.js › from /login?next=/login: expected /, got /login"})
    D.invoke("set_claiming", {"claiming": {"mode": "on"}})

    def read():
        sql("UPDATE sources SET polled_at = polled_at - 15000")
        return sql("SELECT COUNT(*) FROM pr_feedback WHERE job_id = 1")[0][0] >= 4
    wait("the laptop's turn read the review and the check", read, timeout=90, every=2)
    sql("UPDATE pr_feedback SET received_at = received_at - 121000 WHERE job_id = 1")

    def answered():
        sql("UPDATE sources SET polled_at = polled_at - 15000")
        d = job(1)
        done = [x for x in d["deliveries"] if x["event"] == "follow_up_answers" and x["outcome"] == "delivered"]
        return d["job"]["follow_ups"] == 1 and d["job"]["state"] == "completed" and done and d
    d = wait("#1's follow-up ran on the laptop and its answers are on the PR", answered, timeout=180, every=2)
    replies = [c for c in admin_get(url, f"/_admin/review_comments?repo=acme/webapp&number={pr}") if c.get("in_reply_to")]
    check("each inline comment got one reply", len(replies) == 2 and all(r["body"].startswith("Addressed in `") for r in replies), replies)
    check("the page's loop lists what fed it", len(d["review_loop"]["follow_ups"][0]["fed"]) == 4, d["review_loop"])
    D.exec("location.hash = '#queue'; showJob(1);")
    wait("#1's page shows the review loop", lambda: "Follow-up 1" in (D.text("#detail-review") or ""), timeout=20)
    D.exec("document.getElementById('detail-review').scrollIntoView({block: 'center'});")
    shot("review-loop")


# The team's claude account, named alike on both machines, and the fleet's caps.
GOVERNED = ('\n[agents.claude]\naccount = "work"\n'
            '\n[limits]\njob_usd = 2.0\nday_usd = 20.0\naccount_day_usd = 10.0\n')


def limits(url):
    """A usage limit the desktop's claude hit holds the team's account "work" on every machine:
    the laptop's tray menu says until when, with the day's spend against the fleet's cap; the
    laptop claims none of its jobs meanwhile. Then a job stopped at its spend cap, let go from
    its page."""
    now = int(time.time() * 1000)
    until = (now // 60000 + 65) * 60000
    spent = sql("SELECT account, COUNT(*), SUM(cost_usd) FROM spend GROUP BY account")
    log(f"spend so far: {spent}")
    # The morning's work on the desktop, before this session (the day's spend is the fleet's).
    for job_id, token, cost, hours in [(2, 1, 3.12, 3), (2, 2, 2.47, 2)]:
        sql(f"INSERT INTO spend (orchestrator_id, job_id, claim_token, machine, account, cost_usd, at) "
            f"VALUES ('team', {job_id}, {token}, 'desktop', 'claude:work', {cost}, {now - hours * 3600000})")
    sql("INSERT INTO account_holds (orchestrator_id, account, until_at, reason, machine, job_id, held_at) "
        f"VALUES ('team', 'claude:work', {until}, 'Claude usage limit reached', 'desktop', 2, {now})")
    t = time.localtime(until / 1000)
    hhmm = time.strftime("%H:%M" if time.strftime("%Y%m%d", t) == time.strftime("%Y%m%d") else "%a %H:%M", t)
    # The window's switch (already on) has the tray read the limits again at once.
    v = D.invoke("set_resume_after_limits", {"resume": True})
    check("the account is held until its reset", any(a["account"] == "claude:work" and a["state"] == "limited" for a in v["accounts"]), v)
    line = f"claude · work: limited until {hhmm}"
    shown = wait("the tray menu shows the Limits part with the held account", lambda: (x := desk.tray_menu_shown())
                 and any(line in l for l, _ in x) and x, timeout=20)
    log(f"tray menu: {shown}")
    check("and the fleet's switch, checked", ("Resume jobs after usage limits", 1) in shown, shown)
    # No machine under the held account claims: the laptop, claiming again, leaves #3 queued.
    D.invoke("set_claiming", {"claiming": {"mode": "on"}})
    time.sleep(6)
    check("the laptop claims nothing under the held account", job(3)["job"]["state"] == "queued", job(3)["job"]["state"])
    D.exec("location.hash = '#fleet'; refreshFleet();")
    wait("the Fleet tab's Limits card says it", lambda: line.split(': ', 1)[1] in (D.text("#limits") or "") and D.visible("#limits"), timeout=20)
    D.painted()
    D.screenshot(os.path.join(ART, "limits-card.png"))
    # The window beside the menu (the icon is at the panel's left), both in the picture.
    subprocess.run(["xdotool", "search", "--name", "^DevPilot$", "windowmove", "%@", "300", "44"], capture_output=True)
    D.painted()
    at = wait("the tray icon is on the panel", lambda: desk.tray_icon_at(os.path.join(ART, "limits-panel.png")), timeout=20)
    screen = os.path.join(ART, "limits-screen.png")
    changed = desk.open_tray_menu(at, os.path.join(ART, "limits-before.png"), screen, log=log)
    check("the tray menu opened for the screenshot", changed > 2000, changed)
    subprocess.run(["xdotool", "key", "Escape"], check=False)
    subprocess.run(["xdotool", "mousemove", "1200", "780"], check=False)
    subprocess.run(["xdotool", "search", "--name", "^DevPilot$", "windowmove", "%@", "0", "60"], capture_output=True)
    # The panel, the menu and the window's top half: the screen's black edges cut off.
    png = os.path.join(ART, "docs-limits.png")
    subprocess.run(["convert", screen, "-crop", "1224x500+0+0", "+repage", png], check=True)
    check("docs-limits.png was taken", os.path.getsize(png) > 20000 and desk.colours(png) > 200, png)
    log(f"screenshot: {png}")
    D.invoke("set_claiming", {"claiming": {"mode": "paused", "minutes": None}})

    # A job stopped at its own cap waits for a person: its page says so and lets it go on.
    jid = int(subprocess.run([CLI, "enqueue", "--orchestrator", "team", "--title", "Upgrade the tests to Node 22", "--repo", "webapp",
                              "--prompt", "Move the test suite to Node 22 and fix what breaks."],
                             env=env_of(HOME, "http://127.0.0.1:9", url), capture_output=True, text=True, check=True).stdout.strip())
    sql(f"UPDATE dispatch_queue SET last_error = 'spend cap: this job spent $2.04 of its $2.00 cap', parked_for = 'job_cap', "
        f"account = 'claude:work' WHERE id = {jid}")
    for token, cost, machine in [(1, 1.21, "desktop"), (2, 0.83, "laptop")]:
        sql(f"INSERT INTO spend (orchestrator_id, job_id, claim_token, machine, account, cost_usd, at) "
            f"VALUES ('team', {jid}, {token}, '{machine}', 'claude:work', {cost}, {now - (3 - token) * 1200000})")
    D.exec(f"location.hash = '#queue'; showJob({jid});")
    wait("its page says it stopped at its spend cap", lambda: (D.text("#detail-verdict") or "").startswith("Stopped at its spend cap"), timeout=20)
    check("its Spend section lists both attempts against the cap", "$2.04 of this job's $2.00 cap" in (D.text("#detail-spend") or "")
          and len(D.exec("return [...document.querySelectorAll('#detail-spend-rows tr')]") or []) == 2, D.text("#detail-spend"))
    D.click("#detail-no-resume")
    wait("Don't resume after a usage limit is the job's", lambda: sql(f"SELECT resume_after_limit FROM dispatch_queue WHERE id = {jid}")[0][0] == 0, timeout=10)
    D.exec("document.getElementById('detail-spend').scrollIntoView({block: 'center'});")
    D.painted()
    D.screenshot(os.path.join(ART, "limits-job-capped.png"))
    D.click("#detail-actions button.let-go")
    wait("Let it go on: claimable again", lambda: sql(f"SELECT parked_for FROM dispatch_queue WHERE id = {jid}")[0][0] is None, timeout=10)
    wait("and the page no longer offers it", lambda: not D.exec("return !!document.querySelector('#detail-actions button.let-go')"), timeout=10)


def admin_get(url, path):
    with urllib.request.urlopen(url + path, timeout=20) as r:
        return json.loads(r.read() or b"null")


def shot(name):
    D.painted()
    log(f"screenshot: {D.screenshot(os.path.join(ART, f'docs-{name}.png'))}")


def job(jid):
    return D.invoke("job_detail", {"id": jid})


def main():
    for h in (HOME, SAM):
        shutil.rmtree(h, ignore_errors=True)
    bare = repos()
    url = standin(bare)
    wt = lambda home, jid: os.path.join(home, f".local/share/{TRAY_APP if home == HOME else 'devpilot'}/worktrees/team", str(jid))
    # The model's turns, in the order the three jobs take them: #1 on the laptop, #2 on the
    # desktop (watched live), #3 on the laptop (held, and handed off).
    turns = [
        {"wait_ms": 1500}, {"tool": "Read", "input": {"file_path": os.path.join(wt(HOME, 1), "src/login.js")}},
        {"wait_ms": 1500}, {"tool": "Write", "input": {"file_path": os.path.join(wt(HOME, 1), "src/login.js"),
                            "content": "export function afterLogin(user, next) {\n  // Never send a signed-in user back to /login.\n  const to = next && next !== '/login' ? next : '/';\n  return redirect(to);\n}\n"}},
        {"wait_ms": 1500}, {"text": "Fixed the redirect loop: after login, a `next` of /login now goes to / instead."},
        {"wait_ms": 3000}, {"tool": "Read", "input": {"file_path": os.path.join(wt(SAM, 2), "src/signup.js")}},
        {"wait_ms": 3000}, {"tool": "Write", "input": {"file_path": os.path.join(wt(SAM, 2), "src/signup.js"),
                            "content": "import { limit } from './limit.js';\n\nexport function signup(form) {\n  return limit('signup', 5, () => post('/api/signup', form));\n}\n"}},
        {"wait_ms": 3000}, {"text": "Added rate limiting to the signup form: 5 tries a minute per address."},
        # #1's follow-up, on the laptop, in the same conversation: the review's answers.
        {"wait_ms": 1500}, {"tool": "Write", "input": {"file_path": os.path.join(wt(HOME, 1), "src/login.js"),
                            "content": LOGIN_V2}},
        {"wait_ms": 1500}, {"text": "Addressed the review.\nREPLY 1: addressed: both points\n"
                            "REPLY 2: addressed: /login with a query string now counts as /login\n"
                            "REPLY 3: addressed: the comment says why\nREPLY 4: addressed: the test passes now"},
        {"tool": "Write", "input": {"file_path": os.path.join(wt(HOME, 3), "NOTES.md"), "content": "# Release notes\n\n- Login no longer loops.\n"}},
        {"hold_ms": 120000},
    ]
    model = model_server([t if "hold_ms" not in t else {"wait_ms": t["hold_ms"]} for t in turns])
    source = '\n[sources.webapp]\nkind = "github"\nrepo = "acme/webapp"\nlabel = "agent"\nmaps_to = "webapp"\ninterval = "15s"\n'
    # Both machines run claude as the team's account "work", under the fleet's budgets.
    source += GOVERNED
    settings(HOME, "laptop", tables=source, app=TRAY_APP)
    if TRAY_APP != "devpilot":
        # The laptop's CLI (it enqueues #3) reads the release profile's file: the same queue.
        settings(HOME, "laptop", top=f'database_url = "sqlite://{DB}"\n', tables=source)
    # The desktop shares the laptop's queue (on one host here: its SQLite file).
    settings(SAM, "desktop", top=f'database_url = "sqlite://{DB}"\n', tables=source)
    alex = env_of(HOME, model, url)
    drv = subprocess.Popen(["tauri-driver"], env=alex, stdout=subprocess.DEVNULL,
                           stderr=open(os.path.join(WORK, "docs-tauri-driver.log"), "w"))
    STARTED.append(drv)
    wait("tauri-driver listens", lambda: D.request("GET", "/status") is not None, timeout=20)
    D.start(TRAY, ["--show"])
    subprocess.run(["xdotool", "search", "--name", "^DevPilot$", "windowmove", "%@", "0", "60"], capture_output=True)
    wait("the laptop is idle on team", lambda: ((s := D.invoke("get_status"))["state"] == "idle" and s["machine"] == "laptop")
         or log(f"status: {s['state']} on {s['machine']}: {s.get('detail') or s.get('error') or ''}"), timeout=60, every=5)

    # 1. An issue labelled `agent` becomes a job; claude fixes it on the laptop; a draft PR.
    #    The guide's last step waits for that first issue (guide.js gAwaitFirstIssue), as it
    #    does after "Connect GitHub or Linear": its banner, then the job's page.
    D.exec("gSourceName = 'webapp'; gAwaitFirstIssue('Connected. Label an issue of acme/webapp with \"agent\".');")
    check("the banner waits for the first issue", "Waiting for the first one" in (D.text("#first-issue") or ""), D.text("#first-issue"))
    admin(url, "/_admin/issues", {"repo": "acme/webapp", "title": "Fix the login redirect loop",
                                  "body": "After signing in, users who came from /login are sent back to /login.", "labels": ["agent"]})
    said = wait("the banner says which job the issue became, and its page opens", lambda: (x := D.text("#first-issue") or "")
                .startswith("#1 Fix the login redirect loop became job #1.") and D.exec("return location.hash") == "#job-1" and x, timeout=60, every=1)
    log(f"first issue: {said!r}")
    d = wait("#1 completes with a draft PR", lambda: (d := job(1))["job"]["state"] == "completed" and "/pull/" in (d["job"]["url"] or "") and d, timeout=120, every=1)
    wait("every delivery to the issue is done", lambda: all(x["outcome"] == "delivered" for x in job(1)["deliveries"]) and job(1)["deliveries"], timeout=60, every=1)

    # 2. The laptop pauses; the next issue runs on the desktop, watched from the laptop.
    D.invoke("set_claiming", {"claiming": {"mode": "paused", "minutes": None}})
    desktop = subprocess.Popen([CLI, "run", "--orchestrator", "team", "--machine", "desktop", "--poll-interval", "500ms",
                                "--heartbeat", "1s"], env=env_of(SAM, model, url),
                               stdout=subprocess.DEVNULL, stderr=open(os.path.join(WORK, "docs-desktop.log"), "w"))
    STARTED.append(desktop)
    admin(url, "/_admin/issues", {"repo": "acme/webapp", "title": "Rate-limit the signup form",
                                  "body": "Bots hammer /api/signup. Allow 5 tries a minute per address.", "labels": ["agent"]})
    wait("#2 runs on the desktop", lambda: job(2)["job"]["claimed_by"] == "desktop" and job(2)["job"]["state"] == "running", timeout=90, every=1)
    D.exec("location.hash = '#queue'; showJob(2);")
    lines = wait("its transcript shows while it runs", lambda: (x := D.exec(
        "showJob(2); return [...document.querySelectorAll('#detail-transcript .t-line')].map((l) => l.textContent.split('\\n')[0]);"))
        and any(l.startswith("▸ Write") for l in x) and job(2)["job"]["state"] == "running" and x, timeout=60, every=0.5)
    log(f"live transcript: {lines}")
    D.exec("document.getElementById('detail-log-title').scrollIntoView({block: 'center'});")
    shot("live-transcript-from-the-desktop")
    # The fleet while the desktop works: each machine, what it holds, its repos.
    D.exec("location.hash = '#fleet';")
    wait("the fleet lists both machines, the desktop holding #2", lambda: "#2" in (D.text("#fleet") or "") and "laptop" in (D.text("#fleet") or ""), timeout=20)
    shot("fleet")
    wait("#2 completes on the desktop", lambda: job(2)["job"]["state"] == "completed", timeout=60, every=1)
    # The desktop goes to sleep (a hand-off: it holds nothing now), so #3 is the laptop's.
    desktop.terminate()
    desktop.wait(timeout=60)

    # 3. The queue and a job's page.
    D.exec("location.hash = '#queue'; refreshJobs();")
    wait("the queue lists both jobs with their PRs", lambda: len(D.exec("return [...document.querySelectorAll('#jobs a.pr')]") or []) >= 2, timeout=30)
    shot("queue")
    D.exec("showJob(1);")
    wait("#1's page leads with its result", lambda: (D.text("#detail-verdict") or "").startswith("Completed"), timeout=15)
    D.exec("document.getElementById('detail').scrollIntoView({block: 'start'});")
    shot("job-page")
    review_loop(url)

    # 4. A job runs on the laptop; Hand off & pause before closing the lid: the verdict.
    D.invoke("set_claiming", {"claiming": {"mode": "on"}})
    jid = int(subprocess.run([CLI, "enqueue", "--orchestrator", "team", "--title", "Write the release notes", "--repo", "webapp",
                              "--prompt", "Write NOTES.md with what changed since the last release."],
                             env=alex, capture_output=True, text=True, check=True).stdout.strip())
    check("it is job #3", jid == 3, jid)
    wait("#3 runs on the laptop and has written NOTES.md", lambda: os.path.exists(os.path.join(wt(HOME, 3), "NOTES.md")), timeout=60, every=0.5)
    D.exec("location.hash = '#fleet';")
    D.click("#handoff-btn")
    verdict = wait("the window says it is safe to close the lid", lambda: D.exec(
        "const n = document.getElementById('handoff-notice'); return !n.hidden && n.textContent"), timeout=30)
    check("naming the job and its pushed branch", "Handed off #3 (pushed devpilot/3-write-the-release-notes)" in verdict, verdict)
    shot("handoff-verdict")

    # 5. Settings: the agent's line, the repo row, the source.
    D.exec("location.hash = '#settings';")
    wait("the agent's health line", lambda: "claude" in (D.text("#agent-health") or ""), timeout=20)
    wait("the repo's health line", lambda: "draft pull request on acme/webapp" in (D.text("#repos") or ""), timeout=20)
    D.exec("document.getElementById('fs-machine').scrollIntoView({block: 'start'});")
    shot("settings")

    # 6. The New job form, filled in (not sent).
    D.exec("location.hash = '#new';")
    wait("the New job form shows", lambda: D.visible("#nj-title"), timeout=10)
    D.set("#nj-title", "Add a /health endpoint")
    D.set("#nj-prompt", "Return 200 with the build's version when the database answers, else 503.")
    D.exec("const r = document.getElementById('nj-repo'); if ([...r.options || []].some((o) => o.value === 'webapp') || r.tagName === 'INPUT') r.value = 'webapp';")
    D.set("#nj-labels", "linux")
    D.set("#nj-key", "GH-57")
    shot("new-job-form")

    # 7. The governor: a held account in the tray menu, and a job stopped at its cap.
    limits(url)
    log(f"docs: ALL {len(CHECKS.results)} CHECKS PASSED")


if __name__ == "__main__":
    try:
        main()
    finally:
        D.end()
        desk.end_started(STARTED)
        desk.end_pids(desk.app_pids(TRAY, APP_MARKER))
        logs = os.path.join(HOME, f".local/share/{TRAY_APP}/logs")
        if os.path.isdir(logs):
            shutil.copytree(logs, os.path.join(ART, "docs-app-logs"), dirs_exist_ok=True)
        for h in (HOME, SAM):
            shutil.rmtree(h, ignore_errors=True)
