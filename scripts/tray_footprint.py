#!/usr/bin/env python3
"""Idle footprint of the release tray app, measured from /proc (called by tray-footprint.sh,
inside the headless session it sets up).

For each run: start devpilot-tray (a fresh temp SQLite profile, demo agent, empty queue) with
its window shown, let it settle, close the window the way a user does (WM_DELETE_WINDOW, the
message a window manager's close button sends), settle, measure for FOOTPRINT_SECS; then open
the window again with a second launch (single-instance hands it to the first), settle, measure
again. Measured over the app and every descendant process (WebKitWebProcess,
WebKitNetworkProcess, ...):

- PSS (smaps_rollup) and RSS (status VmRSS), sampled every 5 s, median per process;
- CPU %: delta of utime+stime (/proc/PID/stat, all threads, dead ones included) over wall time;
- wakeups/s: delta of voluntary context switches summed over every thread
  (/proc/PID/task/*/status), over wall time. A thread is woken only after it blocked, and each
  block is a voluntary switch, so this counts the wake-ups. A nonvoluntary switch is a thread
  that was running and was preempted (on two cores, mostly by the thread it had just woken):
  no wake-up, but a switch all the same, so all switches are reported too (switches/s, the
  figure this script called wake-ups up to 2026-12-07). Threads that exit inside the window
  take their counts with them; the number of threads seen appearing is reported.

Writes FOOTPRINT_OUT.json and FOOTPRINT_OUT.md (default bench/TRAY_FOOTPRINT.*).
"""
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "desktop"))
from desk import close_window, window_exists  # noqa: E402  (shared with the desktop tests)

ENV = os.environ
TRAY = ENV["FOOTPRINT_TRAY_BIN"]
WORK = ENV["FOOTPRINT_WORK"]
OUT = ENV.get("FOOTPRINT_OUT", "bench/TRAY_FOOTPRINT")
SECS = float(ENV.get("FOOTPRINT_SECS", "60"))
# The window-open state's own length (default: FOOTPRINT_SECS); the targets are the closed one's.
OPEN_SECS = float(ENV.get("FOOTPRINT_OPEN_SECS", SECS))
RUNS = int(ENV.get("FOOTPRINT_RUNS", "3"))
SETTLE = float(ENV.get("FOOTPRINT_SETTLE", "10"))
TICK = os.sysconf("SC_CLK_TCK")
TARGETS = {"pss_mb": 100.0, "cpu_pct": 0.2, "wakeups_per_s": 1.0}
# FOOTPRINT_SOURCES=1: a GitHub and a Linear source configured, on the harness's stand-ins
# (tests/src/bin, built by tray-footprint.sh), at their default interval, so the idle tray
# also runs its intake turns, its outbox and its tracker clients.
SOURCES = ENV.get("FOOTPRINT_SOURCES") == "1"
STANDINS = {}  # kind -> (process, url, secret), started once for every run


def log(msg):
    print(f"[footprint] {msg}", flush=True)


# ------------------------------------------------------------------ /proc

def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def stat_fields(pid, tid=None):
    p = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    s = read(p)
    if s is None:
        return None
    # comm may contain spaces: split after the closing parenthesis.
    rest = s[s.rindex(")") + 2:].split()
    return rest  # rest[0] is field 3 (state)


def ppid(pid):
    f = stat_fields(pid)
    return int(f[1]) if f else None


def comm(pid, tid=None):
    p = f"/proc/{pid}/task/{tid}/comm" if tid else f"/proc/{pid}/comm"
    return (read(p) or "?").strip()


def descendants(root):
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            pp = ppid(int(d))
            if pp is not None:
                kids.setdefault(pp, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cpu_ticks(pid):
    f = stat_fields(pid)
    return int(f[11]) + int(f[12]) if f else None  # utime, stime (fields 14, 15)


def threads(pid):
    """{tid: (comm, voluntary, nonvoluntary)}"""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        s = read(f"/proc/{pid}/task/{t}/status")
        if not s:
            continue
        v = nv = 0
        for line in s.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                v = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                nv = int(line.split()[1])
        out[int(t)] = (comm(pid, t), v, nv)
    return out


def mem_kb(pid):
    pss = rss = None
    s = read(f"/proc/{pid}/smaps_rollup")
    for line in (s or "").splitlines():
        if line.startswith("Pss:"):
            pss = int(line.split()[1])
    s = read(f"/proc/{pid}/status")
    for line in (s or "").splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return pss, rss


def snapshot(root):
    snap = {}
    for pid in descendants(root):
        snap[pid] = {"comm": comm(pid), "cpu": cpu_ticks(pid), "threads": threads(pid)}
    return snap


def measure(root, label, secs=SECS):
    log(f"measuring '{label}' for {secs:.0f}s")
    t0 = time.monotonic()
    a = snapshot(root)
    mem = {}
    seen_threads = {pid: set(v["threads"]) for pid, v in a.items()}
    next_sample = t0
    while True:
        now = time.monotonic()
        if now >= next_sample:
            for pid in descendants(root):
                pss, rss = mem_kb(pid)
                if pss is not None:
                    mem.setdefault(pid, []).append((pss, rss))
                seen_threads.setdefault(pid, set()).update(int(t) for t in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task"))
            next_sample += 5
        if now - t0 >= secs:
            break
        time.sleep(min(1.0, max(0.05, t0 + secs - now)))
    b = snapshot(root)
    wall = time.monotonic() - t0
    procs, thread_rows = [], []
    for pid in sorted(set(a) | set(b)):
        pa, pb = a.get(pid), b.get(pid)
        name = (pb or pa)["comm"]
        cpu = None
        if pb and pb["cpu"] is not None:
            cpu = (pb["cpu"] - (pa["cpu"] if pa and pa["cpu"] is not None else 0)) / TICK / wall * 100
        wake, switches = 0, 0
        for tid, (tc, v, nv) in (pb["threads"] if pb else {}).items():
            v0, nv0 = 0, 0
            if pa and tid in pa["threads"]:
                _, v0, nv0 = pa["threads"][tid]
            d = (v - v0) + (nv - nv0)
            wake += v - v0
            switches += d
            if d:
                thread_rows.append({"pid": pid, "process": name, "tid": tid, "thread": tc,
                                    "voluntary": v - v0, "nonvoluntary": nv - nv0,
                                    "per_s": round(d / wall, 3)})
        ms = mem.get(pid, [])
        procs.append({
            "pid": pid, "process": name,
            "alive_whole_window": bool(pa and pb),
            "pss_mb": round(statistics.median(m[0] for m in ms) / 1024, 1) if ms else None,
            "rss_mb": round(statistics.median(m[1] for m in ms) / 1024, 1) if ms else None,
            "cpu_pct": round(cpu, 3) if cpu is not None else None,
            "wakeups_per_s": round(wake / wall, 3),
            "switches_per_s": round(switches / wall, 3),
            "threads_now": len(pb["threads"]) if pb else 0,
            "threads_appeared": len(seen_threads.get(pid, set()) - set(pa["threads"] if pa else {})),
        })
    thread_rows.sort(key=lambda r: -r["per_s"])
    total = {
        "pss_mb": round(sum(p["pss_mb"] or 0 for p in procs), 1),
        "rss_mb": round(sum(p["rss_mb"] or 0 for p in procs), 1),
        "cpu_pct": round(sum(p["cpu_pct"] or 0 for p in procs), 3),
        "wakeups_per_s": round(sum(p["wakeups_per_s"] for p in procs), 3),
        "switches_per_s": round(sum(p["switches_per_s"] for p in procs), 3),
    }
    log(f"  {label}: {total} over {len(procs)} processes")
    return {"label": label, "seconds": round(wall, 1), "total": total, "processes": procs,
            "top_threads": thread_rows[:12]}


def sni_registered():
    r = subprocess.run(["gdbus", "call", "--session", "--dest", "org.kde.StatusNotifierWatcher", "--object-path",
                        "/StatusNotifierWatcher", "--method", "org.freedesktop.DBus.Properties.Get",
                        "org.kde.StatusNotifierWatcher", "RegisteredStatusNotifierItems"],
                       capture_output=True, text=True, timeout=10)
    return r.returncode == 0 and "/" in r.stdout


def wait_for(what, fn, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if fn():
            return True
        time.sleep(0.5)
    raise SystemExit(f"footprint: timed out waiting for {what}")


# ------------------------------------------------------------------ runs

def standin(kind, binary, var, secret, pattern):
    """Starts a tracker stand-in; its URL, from the one line it prints."""
    import re
    p = subprocess.Popen([binary], env=dict(ENV, **{var: secret}), stdout=subprocess.PIPE,
                         stderr=open(os.path.join(WORK, f"{kind}-standin.log"), "w"), text=True)
    m = re.search(pattern, p.stdout.readline())
    if not m:
        raise SystemExit(f"footprint: the {kind} stand-in did not start")
    STANDINS[kind] = (p, m.group(1), secret)
    return m.group(1)


def start_standins():
    """The GitHub and Linear stand-ins, with a repository and Linear's default team, and
    their credentials made up for this run (given to the app in its environment)."""
    import urllib.request
    bins = os.path.join(ENV.get("CARGO_TARGET_DIR", "/root/.cache/devpilot-target"), "debug")
    gh = standin("github", os.path.join(bins, "github-standin"), "GITHUB_STANDIN_TOKEN",
                 "ghp_footprint" + os.urandom(8).hex(), r"listening on (http://127\.0\.0\.1:\d+)")
    standin("linear", os.path.join(bins, "linear-standin"), "LINEAR_STANDIN_KEY",
            "lin_api_footprint" + os.urandom(8).hex(), r"listening on (http://127\.0\.0\.1:\d+/graphql)")
    req = urllib.request.Request(gh + "/_admin/repos", data=json.dumps({"repo": "acme/webapp"}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=20).read()
    log(f"stand-ins: {', '.join(k + ' ' + v[1] for k, v in STANDINS.items())}")


def sources_config(base):
    """The settings file naming both sources (their default interval, 60 s)."""
    d = os.path.join(base, "config", "devpilot")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.toml"), "w") as f:
        f.write('orchestrator_id = "footprint"\n'
                f'[sources.gh]\nkind = "github"\nrepo = "acme/webapp"\nlabel = "agent"\n'
                f'api_url = "{STANDINS["github"][1]}"\nno_repo = true\n'
                f'[sources.eng]\nkind = "linear"\nteams = ["ENG"]\nlabel = "agent"\n'
                f'api_url = "{STANDINS["linear"][1]}"\nno_repo = true\n')


def app_env(run):
    e = dict(ENV)
    base = os.path.join(WORK, f"run{run}")
    os.makedirs(base, exist_ok=True)
    e.update({
        "XDG_CONFIG_HOME": os.path.join(base, "config"),
        "XDG_DATA_HOME": os.path.join(base, "data"),
        "DEVPILOT_DATABASE_URL": f"sqlite://{os.path.join(base, 'queue.sqlite')}",
        "DEVPILOT_ORCHESTRATOR": "footprint",
        "NO_AT_BRIDGE": "1",
    })
    e.pop("DEVPILOT_AGENT", None)
    if SOURCES:
        sources_config(base)
        e.update({"GITHUB_TOKEN": STANDINS["github"][2], "LINEAR_API_KEY": STANDINS["linear"][2],
                  "DEVPILOT_GITHUB_API_URL": STANDINS["github"][1]})
    return e


def trace(pid, run):
    """With FOOTPRINT_TRACE_SECS, an `strace -f` of the closed tray after its measurement (a
    traced process wakes more, so never during it): which thread woke, on which call."""
    secs = int(os.environ.get("FOOTPRINT_TRACE_SECS", "0"))
    if secs <= 0:
        return
    out = os.path.join(WORK, f"strace-run{run}.txt")
    log(f"run {run}: strace -f for {secs}s into {out}")
    subprocess.run(["timeout", "-s", "INT", str(secs), "strace", "-f", "-tt", "-o", out, "-p", str(pid)],
                   check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def one_run(run):
    env = app_env(run)
    logf = open(os.path.join(WORK, f"tray-run{run}.log"), "w")
    app = subprocess.Popen([TRAY, "--show"], env=env, stdout=logf, stderr=subprocess.STDOUT)
    try:
        wait_for("the window", window_exists)
        wait_for("the tray item", sni_registered)
        time.sleep(SETTLE)
        n = close_window()
        log(f"run {run}: sent WM_DELETE_WINDOW to {n} window(s)")
        wait_for("the window to close", lambda: not window_exists(), timeout=20)
        time.sleep(SETTLE)
        closed = measure(app.pid, "window closed")
        trace(app.pid, run)
        # A second launch opens the first instance's window (single instance).
        subprocess.run([TRAY], env=env, timeout=30, stdout=logf, stderr=subprocess.STDOUT)
        wait_for("the window to reopen", window_exists)
        time.sleep(SETTLE)
        subprocess.run(["import", "-window", "root", os.path.join(WORK, f"run{run}-open.png")], check=False)
        opened = measure(app.pid, "window open", OPEN_SECS)
        if app.poll() is not None:
            raise SystemExit(f"footprint: the app exited early ({app.returncode})")
        return {"run": run, "closed": closed, "open": opened}
    finally:
        family = [p for p in descendants(app.pid) if p != app.pid]
        app.terminate()
        try:
            app.wait(20)
        except subprocess.TimeoutExpired:
            app.kill()
        # A WebKitNetworkProcess can outlive its app: end what this app left, by pid.
        time.sleep(1)
        for p in family:
            try:
                os.kill(p, 15)
            except OSError:
                pass


def median_total(runs, state, key):
    return round(statistics.median(r[state]["total"][key] for r in runs), 3)


def main():
    try:
        if SOURCES:
            start_standins()
        runs = [one_run(i + 1) for i in range(RUNS)]
    finally:
        for p, _, _ in STANDINS.values():
            p.terminate()
    summary = {}
    for state in ("closed", "open"):
        summary[state] = {k: median_total(runs, state, k) for k in ("pss_mb", "rss_mb", "cpu_pct", "wakeups_per_s", "switches_per_s")}
    verdict = {
        "pss_mb": summary["closed"]["pss_mb"] < TARGETS["pss_mb"],
        "cpu_pct": summary["closed"]["cpu_pct"] < TARGETS["cpu_pct"],
        "wakeups_per_s": summary["closed"]["wakeups_per_s"] <= TARGETS["wakeups_per_s"],
    }
    data = {"binary": TRAY, "seconds": SECS, "sources": SOURCES, "runs": RUNS, "cores": os.cpu_count(),
            "load_avg_at_end": os.getloadavg(), "summary_median": summary, "targets_closed": TARGETS,
            "met": verdict, "detail": runs}
    with open(OUT + ".json", "w") as f:
        json.dump(data, f, indent=1)
    write_md(data)
    log(f"wrote {OUT}.json and {OUT}.md")
    log(json.dumps(summary))


SOURCES_NOTE = (", a GitHub and a Linear source configured on the harness's stand-ins at their default "
                "interval (60 s), no issue labelled, so the outbox is empty (`FOOTPRINT_SOURCES=1`)")


def write_md(d):
    s, met = d["summary_median"], d["met"]
    L = []
    L.append("# Tray app idle footprint\n")
    build = "release" if "/release/" in d["binary"] else "DEBUG (not the release build; see the analysis)"
    variant = " with WebKit's defaults (DEVPILOT_WEBKIT_DEFAULTS=1: the fixes below off)" if os.environ.get("DEVPILOT_WEBKIT_DEFAULTS") else ""
    L.append(f"Binary: `{d['binary']}`, {build} build{variant}.\n")
    L.append(f"Generated by `scripts/tray-footprint.sh` (headless Xvfb + xfce4-panel tray host + dunst + "
             f"gnome-keyring session, fresh temp SQLite profile with the demo agent and an empty queue"
             f"{SOURCES_NOTE if d.get('sources') else ''}). "
             f"{d['runs']} run(s) of {d['seconds']:.0f} s per state on a {d['cores']}-core machine; figures are the median "
             f"over runs of the totals over the app and all its WebKit helper processes. Load average at the end: "
             f"{', '.join(f'{x:.1f}' for x in d['load_avg_at_end'])} (other benchmarks share the machine; CPU % is this "
             f"app's own CPU time, so contention inflates it little).\n")
    L.append("| state | PSS total | RSS total | CPU avg | wake-ups/s | all switches/s |")
    L.append("|---|---|---|---|---|---|")
    for st, name in (("closed", "window closed"), ("open", "window open, idle")):
        x = s[st]
        L.append(f"| {name} | {x['pss_mb']:.1f} MB | {x['rss_mb']:.1f} MB | {x['cpu_pct']:.3f} % | "
                 f"{x['wakeups_per_s']:.2f} | {x['switches_per_s']:.2f} |")
    L.append("")
    L.append("Wake-ups are voluntary context switches (a thread blocked, to be woken later); all "
             "switches add the preemptions of threads already running, which this file called "
             "wake-ups before 2026-12-07.")
    L.append("")
    L.append("## Targets (window closed)\n")
    L.append("| target | value | measured | |")
    L.append("|---|---|---|---|")
    L.append(f"| total PSS | < 100 MB | {s['closed']['pss_mb']:.1f} MB | {'met' if met['pss_mb'] else 'MISSED'} |")
    L.append(f"| average CPU | < 0.2 % | {s['closed']['cpu_pct']:.3f} % | {'met' if met['cpu_pct'] else 'MISSED'} |")
    L.append(f"| wake-ups | ≤ 1 /s | {s['closed']['wakeups_per_s']:.2f} /s | {'met' if met['wakeups_per_s'] else 'MISSED'} |")
    L.append(f"| all switches (no target) | | {s['closed']['switches_per_s']:.2f} /s | |")
    L.append("")
    base = ENV.get("FOOTPRINT_BASELINE")
    if base and not read(base):
        log(f"cannot read the baseline {base}: no comparison")
    if base and read(base):
        b = baseline_closed(json.loads(read(base)))
        shown_as = ENV.get("FOOTPRINT_BASELINE_AS", os.path.relpath(base))
        L.append(f"## Against the last measurement (`{shown_as}`, window closed)\n")
        L.append("| figure | last | now | now ÷ last |")
        L.append("|---|---|---|---|")
        for k, name, unit in (("pss_mb", "PSS total", " MB"), ("rss_mb", "RSS total", " MB"),
                              ("cpu_pct", "CPU avg", " %"), ("wakeups_per_s", "wake-ups", " /s"),
                              ("switches_per_s", "all switches", " /s")):
            was, now = b.get(k), s["closed"][k]
            ratio = f"{now / was:.2f}" if was else "n/a"
            shown = lambda x: "–" if x is None else f"{x:.3g}"
            L.append(f"| {name} | {shown(was)}{unit} | {shown(now)}{unit} | {ratio} |")
        L.append("")
    L.append("## Per process (last run)\n")
    last = d["detail"][-1]
    for st in ("closed", "open"):
        m = last[st]
        L.append(f"**{m['label']}** ({m['seconds']} s)\n")
        L.append("| pid | process | PSS | RSS | CPU | wake-ups/s | all switches/s | threads | threads started in window |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for p in m["processes"]:
            L.append(f"| {p['pid']} | {p['process']} | {p['pss_mb']} MB | {p['rss_mb']} MB | {p['cpu_pct']} % | "
                     f"{p['wakeups_per_s']} | {p.get('switches_per_s', '–')} | {p['threads_now']} | {p['threads_appeared']} |")
        L.append("")
        L.append("Threads that woke (context switches in the window):\n")
        L.append("| process | thread | voluntary | nonvoluntary | switches per s |")
        L.append("|---|---|---|---|---|")
        for t in m["top_threads"]:
            L.append(f"| {t['process']} | {t['thread']} | {t['voluntary']} | {t['nonvoluntary']} | {t['per_s']} |")
        L.append("")
    L.append("## All runs\n")
    L.append("| run | state | PSS | RSS | CPU | wake-ups/s | all switches/s |")
    L.append("|---|---|---|---|---|---|---|")
    for r in d["detail"]:
        for st in ("closed", "open"):
            t = r[st]["total"]
            L.append(f"| {r['run']} | {st} | {t['pss_mb']} MB | {t['rss_mb']} MB | {t['cpu_pct']} % | "
                     f"{t['wakeups_per_s']} | {t['switches_per_s']} |")
    L.append("")
    # The hand-written analysis (why a target is missed, what was changed) survives re-runs.
    old = read(d_out(".md")) or ""
    if "\n## Analysis" in old:
        L.append(old[old.index("\n## Analysis") + 1:].rstrip("\n"))
    with open(d_out(".md"), "w") as f:
        f.write("\n".join(L) + "\n")


def baseline_closed(d):
    """A former measurement's closed-window medians. One from before 2026-12-07 counted all
    switches as wake-ups: its wake-ups are then re-counted, run by run, from its threads'
    voluntary switches (the busiest twelve of each run, which hold nearly all of them; a
    run that lists twelve may have left some out, and is said to), and their median taken."""
    b = dict(d["summary_median"]["closed"])
    if "switches_per_s" not in b:
        b["switches_per_s"] = b.get("wakeups_per_s")
        per_run = []
        for r in d["detail"]:
            closed = r["closed"]
            if len(closed["top_threads"]) >= 12:
                log(f"baseline run {r['run']}: twelve threads listed; its wake-ups may be undercounted")
            per_run.append(sum(t["voluntary"] for t in closed["top_threads"]) / closed["seconds"])
        b["wakeups_per_s"] = round(statistics.median(per_run), 3)
    return b


def d_out(ext):
    return OUT + ext


if __name__ == "__main__":
    sys.exit(main())
