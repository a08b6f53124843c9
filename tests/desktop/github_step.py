"""Step 8e of the desktop e2e (e2e.py): a GitHub source through Settings → Sources, against the
GitHub stand-in (tests/src/bin/github-standin.rs, which e2e.sh builds: GitHub's REST API on
loopback, plus /_admin/ endpoints to make issues and read what DevPilot did).

The app reaches the stand-in through DEVPILOT_GITHUB_API_URL, which must be in its environment
from the start (the pull request of a job pushed to a github.com remote goes to that API): so
`start()` runs before the app does, and `run()` after the Linear step. A repo whose clone's
`origin` is https://github.com/acme/webapp.git (rewritten by `url.<bare>.insteadOf`, in the
session's global git config, to a local bare repository whose branches the stand-in serves) is pushed to when its job completes; the
pull request the outbox then opens becomes the job's result link, and the completion
notification's Open, clicked after that (dunstctl action), opens the pull request. The URL
the app opens is recorded by a stand-in `xdg-open` on the app's PATH.

It uses e2e.py's helpers: `run(t)` takes the e2e script's module as `t`."""
import json
import os
import re
import select
import subprocess
import threading
import urllib.request

t = None  # the e2e script's module, set by start()

STANDIN = os.environ.get("E2E_GITHUB_STANDIN_BIN") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR", "/root/.cache/devpilot-target"), "debug", "github-standin")
# The token the stand-in accepts: made up per run, and checked below to be in no file.
TOKEN = f"ghp_e2e{os.urandom(12).hex()}"
GITHUB_ACCOUNT = "github-token"  # the keychain account of the GitHub token (engine: sources/keys.rs)
REPO = "acme/webapp"
REMOTE = "https://github.com/acme/webapp.git"
URL = None  # the stand-in's address, once started


def opened_log():
    return os.path.join(t.WORK, "opened-urls.log")


def fake_bin():
    """A folder with an `xdg-open` that records the URL it is given (one a line): first on the
    app's PATH, so what the app opens is known, and no browser starts."""
    d = os.path.join(t.WORK, "fake-bin")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "xdg-open")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nprintf "%s\\n" "$1" >> "{opened_log()}"\n')
    os.chmod(path, 0o755)
    return d


def start(e2e):
    """Starts the stand-in (before the app: its address goes in the app's environment); returns
    its URL, from the one line it prints."""
    global t, URL
    t = e2e
    env = dict(os.environ, GITHUB_STANDIN_TOKEN=TOKEN)
    log = open(os.path.join(t.WORK, "github-standin.log"), "w")
    p = subprocess.Popen([STANDIN], env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    t.STARTED.append(("github-standin", p))
    ready, _, _ = select.select([p.stdout], [], [], 30)
    first = p.stdout.readline() if ready else ""
    m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", first)
    t.check("the GitHub stand-in starts and says where it listens", m, first)

    def drain():  # the rest of its output, so it never blocks on a full pipe
        with open(os.path.join(t.WORK, "github-standin.out"), "w") as out:
            for line in p.stdout:
                out.write(line)
    threading.Thread(target=drain, daemon=True).start()
    URL = m.group(1)
    return URL


def admin(method, path, body=None):
    """One request to the stand-in's admin endpoints (`/_admin/...`); the JSON it answers."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as r:
        return json.loads(r.read() or b"null")


def github_repo():
    """A bare repository with one commit on main (the stand-in's branches), and a clone whose
    `origin` says github.com while its fetches and pushes go to the bare one; returns both.
    The rewrite (`url.<bare>.insteadOf`) is in the session user's global git config
    ($XDG_CONFIG_HOME/git/config): DevPilot refuses to run git in a clone whose own config
    rewrites URLs (it could send a push elsewhere)."""
    bare, clone = t.make_repo(os.path.join(t.WORK, "github"))
    g = lambda *a: subprocess.run(["git", *a], cwd=clone, check=True, capture_output=True, text=True).stdout
    g("remote", "set-url", "origin", REMOTE)
    global_config = os.path.join(t.ENV["XDG_CONFIG_HOME"], "git", "config")
    os.makedirs(os.path.dirname(global_config), exist_ok=True)
    g("config", "--file", global_config, f"url.{bare}.insteadOf", REMOTE)
    t.check("the clone's origin is GitHub's, and reaches the local bare repository",
            g("config", "--get", "remote.origin.url").strip() == REMOTE and "refs/heads/main" in g("ls-remote", "origin"))
    return bare, clone


def add_pushing_repo(clone):
    """Adds the clone as repo `acme-webapp` in Settings, as a window user does: a new repo
    pushes on completion and opens a draft pull request by default, and its row says so (no
    edit of the settings file). The Push switch then turns off and on again from the row."""
    t.wd_exec("location.hash = '#settings';")
    t.wait("settings form loaded", lambda: t.wd_exec("return document.querySelector('#s-orchestrator_id').value") != "", timeout=10)
    t.wd_set("#repo-name", "acme-webapp")
    t.wd_set("#repo-path", clone)
    t.wd_click("#repo-add")
    row = "#repos tr[data-repo='acme-webapp']"
    t.wait("the GitHub repo's clone is added", lambda: t.wd_text("#repo-msg").startswith("Added acme-webapp")
           and t.wd_exec(f"return !!document.querySelector(`{row}`)"), timeout=15)
    text = t.config_text()
    t.check("a repo added in the window pushes its jobs' branches",
            re.search(r"\[repos\.acme-webapp\][^\[]*push = true", text), text)
    health = lambda: t.wd_exec(f"return document.querySelector(`{row} td.health`).textContent")
    t.check("its health line says a finished job opens a draft PR on acme/webapp",
            "draft pull request on acme/webapp" in health(), health())
    t.wd_click(f"{row} input.push")
    t.wait("the Push switch turns push off", lambda: re.search(r"\[repos\.acme-webapp\][^\[]*push = false", t.config_text())
           and "does not push" in health(), timeout=15)
    t.wd_click(f"{row} input.push")
    t.wait("and on again", lambda: re.search(r"\[repos\.acme-webapp\][^\[]*push = true", t.config_text())
           and "draft pull request" in health(), timeout=15)
    t.wd_exec("loadSources();")


def fill_form():
    """The Sources form, set to GitHub: its fields shown, Linear's hidden."""
    t.wd_set("#source-kind", "github")
    shown = lambda css: t.DRIVER.visible(css)
    t.check("GitHub's fields show and Linear's hide",
            shown("#source-gh-repo") and shown("#source-gh-import") and not shown("#source-teams")
            and not shown("#source-state-unstarted") and shown("#source-assigned")
            and t.wd_text("#source-key-name") == "Token")
    t.wd_set("#source-name", "")
    t.wd_set("#source-gh-repo", REPO)
    t.wd_set("#source-label", "agent")
    t.wd_set("#source-interval", "15s")
    t.wd_set("#source-repo", "acme-webapp")
    # No API address: the app's DEVPILOT_GITHUB_API_URL names the stand-in.
    t.wd_set("#source-api-url", "")
    t.check("the form offers the repo to run in", t.wd_exec("return document.querySelector('#source-repo').value") == "acme-webapp")


def test_and_save():
    """A wrong token is refused by Test connection, the right one connects, the source is
    saved with the token in the keychain (under the GitHub account) and in no file."""
    t.wd_set("#source-key", "ghp_not_the_right_one")
    t.wd_click("#source-test")
    msg = t.wait("a wrong token is refused by the test", lambda: t.wd_exec("return document.querySelector('#source-msg').className") == "err"
                 and t.wd_text("#source-msg"), timeout=30)
    t.check("the refusal names GitHub and the token, without the token", "GitHub refused the token" in msg and "ghp_not_the_right_one" not in msg, msg)
    t.wd_set("#source-key", TOKEN)
    t.wd_click("#source-test")
    line = t.wait("Test connection says whose token it is", lambda: (x := t.wd_text("#source-msg") or "").startswith("Connected as") and x, timeout=30)
    t.check("it names the repository and the label", f"repo {REPO}" in line and "label agent" in line, line)
    # Only the completion's notification is on screen when Open is clicked below.
    subprocess.run(["dunstctl", "close-all"], check=False)
    t.wd_set("#source-key", TOKEN)
    t.wd_click("#source-save")
    msg = t.wait("the GitHub source's save finishes", lambda: (x := t.wd_text("#source-msg")) not in (None, "", "Saving…") and x, timeout=30)
    t.check("the GitHub source is saved", msg.startswith("Saved."), msg)
    text = t.config_text()
    t.check("the settings file has the GitHub source, and not its token",
            "[sources.webapp]" in text and 'kind = "github"' in text and f'repo = "{REPO}"' in text
            and 'maps_to = "acme-webapp"' in text and TOKEN not in text, text)
    r = subprocess.run(["secret-tool", "search", "--unlock", "service", t.PROFILE_NAME], capture_output=True, text=True)
    t.check("the token is in the Secret Service, under the GitHub account",
            f"secret = {TOKEN}" in r.stdout and GITHUB_ACCOUNT in r.stdout, r.stderr)
    t.wait("Sources says where the GitHub token comes from", lambda: "GitHub token comes from the OS keychain." in (t.wd_text("#sources-key") or ""), timeout=10)


def job_of(issue):
    """The job the issue became, from the jobs list's link to the issue."""
    t.wd_exec("location.hash = '#queue';")
    return int(t.wait("the jobs list links a job to the GitHub issue",
                      lambda: t.wd_exec("refreshJobs(); const a = [...document.querySelectorAll('#jobs a.issue')]"
                                        ".find(a => a.getAttribute('href') === arguments[0]);"
                                        "return a ? a.closest('tr').dataset.id : null", [issue["html_url"]]), timeout=90, every=1))


def of_job(action, jid):
    """Whether a notification's action is Open on finished job `jid` ({"result": {"job": …}})."""
    return isinstance(action, dict) and isinstance(action.get("result"), dict) and action["result"].get("job") == jid


def open_from_the_notification(jid, issue, pr_url):
    """Clicks Open on the completion's notification (its default action, as dunst does on a
    click), after the pull request became the job's result link: the PR is what opens."""
    sent = t.wait("the completion's notification offers Open",
                  lambda: [x for x in t.wd_invoke("recent_notifications") if of_job(x.get("action"), jid)], timeout=20)
    t.check("its Open, when sent, would have fallen back to the issue",
            sent[-1]["action"]["result"]["otherwise"] == {"url": issue["html_url"]} and sent[-1]["error"] is None, sent[-1])
    displayed = subprocess.run(["dunstctl", "count", "displayed"], capture_output=True, text=True).stdout.strip()
    t.log(f"notifications on screen: {displayed}")
    t.shot("15-github-notification")
    before = open(opened_log()).read() if os.path.exists(opened_log()) else ""
    r = subprocess.run(["dunstctl", "action", "0"], capture_output=True, text=True)
    t.check("dunst took the click on Open", r.returncode == 0, r.stderr)
    opened = t.wait("the app opened a link", lambda: (x := open(opened_log()).read()[len(before):] if os.path.exists(opened_log()) else "").strip() and x, timeout=20)
    t.check("Open opened the pull request (the job's result link now), not the issue", opened.strip().splitlines()[-1] == pr_url, opened)


def job_page(jid, pr_url):
    """The finished job's page leads with its result: the verdict, the PR as a button that
    opens it through the app, the branch, and every report to the issue, done."""
    t.wd_exec("location.hash = '#queue'; showJob(arguments[0]);", [jid])
    verdict = t.wait("the job page says it completed", lambda: (x := t.wd_text("#detail-verdict") or "").startswith("Completed") and x, timeout=15)
    t.log(f"job page verdict: {verdict!r}")
    # Each look reads the page and asks it to load again for the next one.
    lines = t.wait("every report to the issue is done, the PR opened",
                   lambda: (x := t.wd_exec("const l = [...document.querySelectorAll('#detail-deliveries li')]"
                                           ".map((l) => l.className + ' ' + l.textContent); showJob(arguments[0]); return l;", [jid]))
                   and all(l.startswith("ok ") for l in x) and any(pr_url in l for l in x) and x, timeout=60)
    t.log(f"deliveries: {lines}")
    facts = t.wd_text("#detail-facts") or ""
    t.check("the page names the job's branch, when it started and how long it took", f"devpilot/{jid}-" in facts and "Started" in facts and "Duration" in facts, facts)
    t.shot("15b-github-job-page")
    before = open(opened_log()).read() if os.path.exists(opened_log()) else ""
    t.wd_click("#detail-links button.pr")
    opened = t.wait("the PR button opened a link", lambda: (x := open(opened_log()).read()[len(before):] if os.path.exists(opened_log()) else "").strip() and x, timeout=20)
    t.check("it opened the pull request, in the browser", opened.strip().splitlines()[-1] == pr_url, opened)


def red_hand_off(bare):
    """A hand-off whose push cannot reach the remote: the window's verdict is red and names
    the job whose work stayed on this machine, and why."""
    global_config = os.path.join(t.ENV["XDG_CONFIG_HOME"], "git", "config")
    g = lambda *a: subprocess.run(["git", "config", "--file", global_config, *a], check=True, capture_output=True, text=True)
    payload = {"title": "Keep the draft", "sleep": 120, "write": "draft.txt"}
    jid = int(t.cli("enqueue", "--orchestrator", t.ORCH, "--repo", "acme-webapp", "--payload", json.dumps(payload)).strip())
    t.wait("the job runs here and wrote its draft",
           lambda: "e2e agent wrote draft.txt" in t.wd_invoke("job_detail", {"id": jid})["log_tail"], timeout=60)
    g("--unset", f"url.{bare}.insteadOf")
    g(f"url.{os.path.join(t.WORK, 'unreachable.git')}.insteadOf", REMOTE)
    try:
        t.wd_exec("location.hash = '#queue';")
        t.wd_click("#handoff-btn")
        verdict = t.wait("the red verdict", lambda: (x := t.wd_exec("const n = document.getElementById('handoff-notice'); return !n.hidden && n.textContent"))
                         and "Work stayed on this machine" in x and x, timeout=30)
        t.log(f"red verdict: {verdict!r}")
        t.check("it names the job, says its work stayed here and why",
                f"#{jid} Keep the draft: its work stayed on this machine (the push failed" in verdict and "Safe to close" not in verdict, verdict)
        told = [x for x in t.wd_invoke("recent_notifications") if "hand_off" in x["kinds"]]
        t.check("the notification says it too", told and told[-1]["summary"] == "DevPilot: Work stayed on this machine", told[-1:])
        t.check("the reason is git's own, not its advice", "Could not read from remote repository" in verdict, verdict)
        t.wd_exec("window.scrollTo(0, 0);")
        t.shot("17-handoff-work-stayed")
    finally:
        g("--unset", f"url.{os.path.join(t.WORK, 'unreachable.git')}.insteadOf")
        g(f"url.{bare}.insteadOf", REMOTE)
    t.cli("cancel", str(jid))
    t.wd_invoke("resume")
    t.wait("the verdict goes once claiming resumes", lambda: t.wd_exec("return document.getElementById('handoff-notice').hidden"), timeout=10)


def run(e2e):
    """Settings → Sources with a GitHub source against the stand-in; an issue becomes a job
    that runs in a clone of a github.com remote, pushes its branch, gets its pull request, and
    the completion notification's Open opens that pull request."""
    global t
    t = e2e
    bare, clone = github_repo()
    admin("POST", "/_admin/repos", {"repo": REPO, "git": bare})
    add_pushing_repo(clone)
    # The issue comes first: the connection test finds its label.
    issue = admin("POST", "/_admin/issues", {"repo": REPO, "title": "Fix the signup redirect", "body": "After signup, users land on /. (For the e2e agent, write: fix.txt)", "labels": ["agent"]})
    t.log(f"issue made in the stand-in: #{issue['number']} {issue['html_url']}")
    t.wd_exec("location.hash = '#settings';")
    t.wait("Settings → Sources loaded", lambda: "No GitHub token yet" in (t.wd_text("#sources-key") or ""), timeout=15)
    fill_form()
    test_and_save()
    jid = job_of(issue)
    d = t.wait("the GitHub issue's job completes", lambda: (d := t.wd_invoke("job_detail", {"id": jid}))["job"]["state"] == "completed" and d, timeout=90)
    t.check("the job is the issue's, in the mapped repo", d["payload"]["source"]["kind"] == "github"
            and d["payload"]["source"]["url"] == issue["html_url"] and d["job"]["repo"] == "acme-webapp", d["job"])
    pulls = t.wait("the stand-in has the job's pull request", lambda: admin("GET", f"/_admin/pulls?repo={REPO}"), timeout=60, every=1)
    pr = pulls[-1]
    t.log(f"pull request: {json.dumps(pr)[:400]}")
    pushed = subprocess.run(["git", "-C", bare, "for-each-ref", "--format=%(refname:short)", f"refs/heads/devpilot/{jid}-*"],
                            capture_output=True, text=True, check=True).stdout.split()
    t.check("the PR's head is exactly the job's one pushed branch", len(pushed) == 1 and pr.get("head") == pushed[0], (pr.get("head"), pushed))
    t.wait("the PR is the job's result link", lambda: t.wd_invoke("job_detail", {"id": jid})["job"]["url"] == pr["html_url"], timeout=30)
    open_from_the_notification(jid, issue, pr["html_url"])
    job_page(jid, pr["html_url"])
    comments = t.wait("DevPilot linked the PR on the issue",
                      lambda: (c := admin("GET", f"/_admin/comments?repo={REPO}&number={issue['number']}")) and any(pr["html_url"] in x.get("body", "") for x in c) and c, timeout=60, every=1)
    t.log(f"comments on #{issue['number']}: {json.dumps(comments)[:400]}")
    t.wd_exec("location.hash = '#settings';")
    line = t.wait("Sources shows the GitHub source healthy, polled here, with where its token comes from",
                  lambda: (x := t.wd_text("#sources-list li[data-source='webapp'] .line") or "").startswith("webapp (github): OK — last poll")
                  and x.endswith("· token from keychain") and x, timeout=30)
    t.log(f"GitHub source line: {line!r}")
    t.wd_exec("document.getElementById('sources').scrollIntoView();")
    t.shot("16-sources-github")
    red_hand_off(bare)
    rejected = admin("GET", "/_admin/rejected")
    t.check("the GitHub stand-in refused no request DevPilot sent (its published description allows each)", rejected == [], rejected)
    leaked = t.files_holding(TOKEN, t.ENV["XDG_CONFIG_HOME"], t.ENV["XDG_DATA_HOME"])
    t.check("the GitHub token is in no file under the config and data dirs (logs included)", leaked.strip() == "", leaked)
