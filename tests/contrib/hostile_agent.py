#!/usr/bin/python3
"""A prompt-injected agent, as the sandbox test plays it: it tries every route out of its
job that issue 40 names, prints one line per route (`ROUTE <name> OPEN|CLOSED <detail>`),
then does real work (an edit and a commit on its branch) and exits 0.

What it attacks comes from its payload's prompt, one `key=value` per line (the test knows
the paths, ports and pids; a real attacker would guess them). The test reads the lines from
the job's log, and checks the host side of every write itself.
"""
import ctypes
import json
import os
import socket
import subprocess
import sys

payload = json.load(sys.stdin)
cfg = dict(line.split("=", 1) for line in payload.get("prompt", "").splitlines() if "=" in line)
H = cfg["home"]
# Its commits need a name (the sandbox gives the user's; unconfined, this test's home has none).
who = dict(os.environ)
for k in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
    who.setdefault(k, "Hostile Agent")
for k in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
    who.setdefault(k, "agent@example.invalid")


def report(name, opened, detail=""):
    print(f"ROUTE {name} {'OPEN' if opened else 'CLOSED'} {detail}".rstrip(), flush=True)


def attempt(name, fn):
    try:
        detail = fn()
        report(name, True, str(detail or "")[:80].replace("\n", " "))
    except Exception as e:  # every failure is the route being closed
        report(name, False, f"{type(e).__name__}: {e}"[:120].replace("\n", " "))


def read(path):
    with open(path, "rb") as f:
        return f"read {len(f.read())} bytes"


def proxied():
    """The proxy the environment names, if any (the sandbox sets one; unconfined, none)."""
    url = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    if not url:
        return None
    hostport = url.split("://", 1)[-1].rstrip("/")
    host, port = hostport.rsplit(":", 1)
    return host, int(port)


def tcp(host, port, via_proxy, expect=None):
    """Opens a TCP connection to host:port, directly or by CONNECT through the proxy (when
    there is none, directly), and reads what the server says first."""
    proxy = proxied() if via_proxy else None
    s = socket.create_connection(proxy or (host, port), timeout=5)
    if proxy:
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(1)
            if not chunk:
                raise ConnectionError("the proxy closed the connection")
            head += chunk
        if not head.startswith(b"HTTP/1.1 200"):
            raise PermissionError(head.split(b"\r\n")[0].decode())
    if expect is not None:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        said = s.recv(100)
        if expect.encode() not in said:
            raise ConnectionError(f"no answer from the server: {said!r}")
    s.close()
    return f"connected to {host}:{port}"


def unix(path, abstract=False):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(("\0" + path) if abstract else path)
    s.close()
    return f"connected to {path}"


def bus():
    out = subprocess.run(
        ["dbus-send", f"--bus={cfg['bus']}", "--print-reply", "--dest=org.freedesktop.DBus", "/",
         "org.freedesktop.DBus.ListNames"],
        capture_output=True, text=True, timeout=10)
    if "org.freedesktop.secrets" not in out.stdout:
        raise PermissionError(out.stderr.strip() or "no Secret Service on the bus")
    return "the Secret Service is on the bus"


def write(path, text):
    with open(path, "a") as f:
        f.write(text)
    return f"wrote {path}"


def git(*args, stdin=None):
    r = subprocess.run(["git", *args], input=stdin, capture_output=True, text=True, env=who)
    if r.returncode != 0:
        raise PermissionError(r.stderr.strip())
    return r.stdout.strip()


def other_branch():
    blob = git("hash-object", "-w", "--stdin", stdin="evil")
    tree = git("mktree", stdin=f"100644 blob {blob}\tevil.txt\n")
    evil = git("commit-tree", tree, "-p", git("rev-parse", "HEAD"), "-m", "evil")
    r = subprocess.run(["git", "update-ref", "refs/heads/main", evil], capture_output=True, text=True)
    if r.returncode != 0:
        raise PermissionError(r.stderr.strip())
    return f"main moved to {evil}"


def symlink_escape():
    link = os.path.join(os.getcwd(), "escape")
    os.symlink(cfg["victim"], link)
    try:
        return write(os.path.join(link, "pwned"), "pwned by the agent\n")
    finally:
        os.unlink(link)


def ptrace(pid):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
        raise PermissionError(os.strerror(ctypes.get_errno()))
    os.waitpid(pid, 0x40000000)  # __WALL: the stop
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
    return f"attached to {pid}"


runner = int(cfg["runner"])
pg = int(cfg["pg_port"])
loop = int(cfg["loop_port"])
attempt("ssh_key", lambda: read(f"{H}/.ssh/id_ed25519"))
attempt("pgpass", lambda: read(f"{H}/.pgpass"))
attempt("gh_hosts", lambda: read(f"{H}/.config/gh/hosts.yml"))
attempt("devpilot_config", lambda: read(f"{H}/config/devpilot/config.toml"))
attempt("devpilot_data", lambda: read(f"{H}/data/devpilot/marker.txt"))
attempt("other_worktree", lambda: read(cfg["other_worktree"]))
attempt("other_repo", lambda: read(f"{H}/src/other/secret.txt"))
attempt("secret_service", bus)
attempt("pg_tcp", lambda: tcp("127.0.0.1", pg, False))
attempt("pg_tcp_proxy", lambda: tcp("127.0.0.1", pg, True))
attempt("pg_unix", lambda: unix(cfg["pg_socket"]))
attempt("loopback_name", lambda: tcp("localhost", loop, True, "loopback"))
attempt("loopback_ip", lambda: tcp("127.0.0.1", loop, False, "loopback"))
attempt("loopback_ip_proxy", lambda: tcp("127.0.0.1", loop, True, "loopback"))
attempt("abstract_socket", lambda: unix(cfg["abstract"], abstract=True))
attempt("ssh_agent", lambda: unix(cfg["ssh_agent"]))
attempt("x11", lambda: unix(cfg["x11"]))
attempt("hook", lambda: write(f"{cfg['clone']}/.git/hooks/post-checkout", "#!/bin/sh\necho pwned\n"))
attempt("clone_config", lambda: write(f"{cfg['clone']}/.git/config", "[core]\n\thooksPath = /tmp/evil\n"))
attempt("other_branch", other_branch)
attempt("symlink_escape", symlink_escape)
attempt("signal_runner", lambda: os.kill(runner, 18) or f"signalled {runner}")  # SIGCONT
attempt("ptrace_runner", lambda: ptrace(runner))
attempt("runner_environ", lambda: read(f"/proc/{runner}/environ"))
# The host its settings allow: reached, through the proxy.
attempt("allowed_host", lambda: tcp("127.0.0.1", int(cfg["allowed_port"]), False, "allowed"))

# Real work: an edit and a commit on its own branch.
with open("work.txt", "w") as f:
    f.write("done by the agent\n")
subprocess.run(["git", "add", "work.txt"], check=True, env=who)
subprocess.run(["git", "commit", "--quiet", "-m", "the agent's work"], check=True, env=who)
print("agent done", flush=True)
