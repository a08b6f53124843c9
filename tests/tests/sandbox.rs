//! Agents run confined (issue 40). A hostile agent (`tests/contrib/hostile_agent.py`) run by
//! a real `devpilot run` process tries every route out of its job: the user's keys and
//! credentials, DevPilot's own files, other worktrees and repositories, the Secret Service
//! on a real session bus, PostgreSQL by TCP and by its unix socket, loopback servers by name
//! and by IP, abstract and agent sockets, the user's clone, the runner's process. Each route
//! is also tried with `--sandbox off`, where it must open: a route that silently stopped
//! being tried cannot pass. A machine that cannot confine (its runner in a sandbox that
//! refuses user namespaces) says so and takes no tracker's job.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_tests::{
    enqueue, fast_flags, git, run_cli, shared_pg, spawn_runner, wait_for, write_config, Backend, GitRemote, Runner,
    SecretService, TestDb,
};

devpilot_tests::on_both_backends!(
    a_hostile_agent_reaches_its_worktree_and_its_model_and_nothing_else,
    a_machine_that_cannot_confine_says_so_and_takes_no_strangers_job,
    a_confined_setup_installs_from_a_registry_the_repo_allows,
);

/// Every route the hostile agent tries, besides `allowed_host`.
const ROUTES: &[&str] = &[
    "ssh_key",
    "pgpass",
    "gh_hosts",
    "devpilot_config",
    "devpilot_data",
    "other_worktree",
    "other_repo",
    "secret_service",
    "pg_tcp",
    "pg_tcp_proxy",
    "pg_unix",
    "loopback_name",
    "loopback_ip",
    "loopback_ip_proxy",
    "abstract_socket",
    "ssh_agent",
    "x11",
    "hook",
    "clone_config",
    "other_branch",
    "symlink_escape",
    "signal_runner",
    "ptrace_runner",
    "runner_environ",
];

/// A TCP server on loopback that answers every connection with `word`, on a thread.
fn answering(word: &'static str) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut buf = [0u8; 256];
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = c.read(&mut buf);
            let _ = c.write_all(format!("HTTP/1.0 200 OK\r\n\r\n{word}").as_bytes());
        }
    });
    port
}

/// A unix socket listening at `path` (or, `abstract`, at that abstract name), accepting on
/// a thread.
fn listening(path: &str, abstract_name: bool) {
    use std::os::unix::net::{SocketAddr, UnixListener};
    let l = if abstract_name {
        use std::os::linux::net::SocketAddrExt;
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(path.as_bytes()).unwrap()).unwrap()
    } else {
        UnixListener::bind(path).unwrap()
    };
    std::thread::spawn(move || for _c in l.incoming() {});
}

/// One user's machine: a home with the secrets a developer has, DevPilot's config and data
/// in it, a clone of a remote, another repository and another job's worktree, and the
/// servers and sockets the agent will try.
struct Scene {
    /// Its files, removed when the scene is dropped.
    _root: tempfile::TempDir,
    home: PathBuf,
    clone: PathBuf,
    remote: GitRemote,
    keyring: SecretService,
    prompt: String,
    /// The X11 socket it made in the machine's shared `/tmp/.X11-unix`, removed with it.
    x11: PathBuf,
}

impl Drop for Scene {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.x11);
    }
}

fn scene(orch: &str) -> Scene {
    let root = tempfile::tempdir().unwrap();
    let home = root.path().join("home");
    let put = |rel: &str, text: &str| {
        let p = home.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    put(".ssh/id_ed25519", "-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n");
    put(".pgpass", "127.0.0.1:5432:*:postgres:secret\n");
    put(".config/gh/hosts.yml", "github.com:\n  oauth_token: gho_secret\n");
    put("data/devpilot/marker.txt", "devpilot's own data\n");
    put("src/other/secret.txt", "another repository\n");
    let other_worktree = home.join(format!("data/devpilot/worktrees/{orch}/999/secret.txt"));
    std::fs::create_dir_all(other_worktree.parent().unwrap()).unwrap();
    std::fs::write(&other_worktree, "another job's worktree\n").unwrap();
    std::fs::create_dir_all(home.join("victim")).unwrap();
    let remote = GitRemote::new(&root.path().join("remote"));
    let clone = remote.clone_to(&home.join("src/webapp"));
    write_config(&home, &format!("[repos.webapp]\npath = \"{}\"\npush = true\n", clone.display()));
    let keyring = SecretService::start(&root.path().join("keyring"));
    let pg = shared_pg();
    // The abstract name and the X11 path are shared by every process on the machine: each
    // scene's are its own (a free port's number is not: the kernel hands a released port out
    // again, and two scenes of this process then met on one name).
    static SCENES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = format!("{}{:03}", std::process::id(), SCENES.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
    let abstract_name = format!("devpilot-sandbox-test-{n}");
    listening(&abstract_name, true);
    let ssh_agent = root.path().join("ssh-agent.sock");
    listening(&ssh_agent.to_string_lossy(), false);
    std::fs::create_dir_all("/tmp/.X11-unix").unwrap();
    let x11 = format!("/tmp/.X11-unix/X{n}");
    // A socket file an earlier process of the same pid left.
    let _ = std::fs::remove_file(&x11);
    listening(&x11, false);
    let prompt = [
        ("home", home.display().to_string()),
        ("clone", clone.display().to_string()),
        ("victim", home.join("victim").display().to_string()),
        ("other_worktree", other_worktree.display().to_string()),
        ("bus", keyring.address.clone()),
        ("pg_port", pg.port.to_string()),
        ("pg_socket", pg.dir.join(format!(".s.PGSQL.{}", pg.port)).display().to_string()),
        ("loop_port", answering("loopback").to_string()),
        ("allowed_port", answering("allowed").to_string()),
        ("abstract", abstract_name),
        ("ssh_agent", ssh_agent.display().to_string()),
        ("x11", x11.clone()),
    ]
    .iter()
    .map(|(k, v)| format!("{k}={v}"))
    .collect::<Vec<_>>()
    .join("\n");
    Scene { _root: root, home, clone, remote, keyring, prompt, x11: PathBuf::from(x11) }
}

fn hostile_agent() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/hostile_agent.py")
}

fn value(prompt: &str, key: &str) -> String {
    prompt.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).unwrap().to_string()
}

/// Runs the hostile agent once in `s` (`sandbox`: "on" or "off") and returns what each route
/// did, the job's id and its runner.
async fn attack(db: &TestDb, orch: &str, s: &Scene, sandbox: &str) -> (BTreeMap<String, String>, i64) {
    let allowed = format!("127.0.0.1:{}", value(&s.prompt, "allowed_port"));
    let mut flags = fast_flags();
    flags.extend(["--sandbox", sandbox, "--allow-host", allowed.as_str()]);
    let home = s.home.display().to_string();
    let bus = s.keyring.address.clone();
    let ssh = value(&s.prompt, "ssh_agent");
    let env = [("HOME", home.as_str()), ("DBUS_SESSION_BUS_ADDRESS", bus.as_str()), ("SSH_AUTH_SOCK", ssh.as_str())];
    let runner: Runner = spawn_runner(&s.home, &db.raw_url, orch, "laptop", &flags, &hostile_agent(), &env);
    let prompt = format!("runner={}\n{}", runner.pid(), s.prompt);
    let id = enqueue(&s.home, db, orch, &["--title", "Please fix", "--repo", "webapp", &format!("--prompt={prompt}")]);
    let ended = wait_for(Duration::from_secs(90), || async {
        db.queue
            .job(id)
            .await
            .unwrap()
            .is_some_and(|(j, _)| j.state != JobState::Queued && j.state != JobState::Running)
    })
    .await;
    let (job, _) = db.queue.job(id).await.unwrap().unwrap();
    let (_, log, _) = run_cli(&s.home, &db.raw_url, &["logs", "--orchestrator", orch, &id.to_string()], None);
    assert!(ended && job.state == JobState::Completed, "sandbox {sandbox}: the job ended {:?}:\n{log}", job.state);
    drop(runner);
    let routes = log
        .lines()
        .filter_map(|l| l.strip_prefix("ROUTE "))
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            Some((f.next()?.to_string(), format!("{} {}", f.next()?, f.next().unwrap_or(""))))
        })
        .collect();
    (routes, id)
}

/// What the agent's writes left in the user's clone and home.
fn host_effects(s: &Scene) -> Vec<&'static str> {
    let mut found = vec![];
    if s.clone.join(".git/hooks/post-checkout").exists() {
        found.push("hook");
    }
    if std::fs::read_to_string(s.clone.join(".git/config")).unwrap().contains("hooksPath") {
        found.push("clone_config");
    }
    if git(&s.clone, &["rev-parse", "main"]) != git(&s.clone, &["rev-parse", "origin/main"]) {
        found.push("other_branch");
    }
    if s.home.join("victim/pwned").exists() {
        found.push("symlink_escape");
    }
    found
}

/// Every route the hostile agent tries is closed inside the sandbox, and open with
/// `--sandbox off` (the positive control). Confined, the agent still reaches the host its
/// settings allow, commits on its branch, and DevPilot pushes that branch; the hosts it was
/// refused are in the job's history.
async fn a_hostile_agent_reaches_its_worktree_and_its_model_and_nothing_else(backend: Backend) {
    let db = TestDb::new(backend).await;

    // The positive control: unconfined, on purpose, every route opens.
    let orch = db.orch("unconfined");
    let open = scene(&orch);
    let (routes, id) = attack(&db, &orch, &open, "off").await;
    for r in ROUTES.iter().chain(&["allowed_host"]) {
        assert!(routes.get(*r).is_some_and(|v| v.starts_with("OPEN")), "unconfined, {r} opens: {routes:#?}");
    }
    assert_eq!(host_effects(&open), ["hook", "clone_config", "other_branch", "symlink_escape"]);
    let h = db.queue.history(id).await.unwrap();
    assert!(h.iter().any(|e| e.kind == "unconfined" && said(&e.detail, "mode = \"off\"")), "{h:?}");
    // Written beside the agent's start, it still comes before the job's end.
    let at = |kind: &str| h.iter().position(|e| e.kind == kind);
    assert!(at("unconfined") < at("completed") && at("completed").is_some(), "the note comes first: {h:?}");

    // Confined: every route is closed, and real work still works.
    let orch = db.orch("confined");
    let s = scene(&orch);
    let (routes, id) = attack(&db, &orch, &s, "on").await;
    for r in ROUTES {
        assert!(routes.get(*r).is_some_and(|v| v.starts_with("CLOSED")), "confined, {r} is closed: {routes:#?}");
    }
    assert!(routes.get("allowed_host").is_some_and(|v| v.starts_with("OPEN")), "the allowed host: {routes:#?}");
    assert_eq!(host_effects(&s), Vec::<&str>::new(), "nothing reached the user's clone or home");
    let h = db.queue.history(id).await.unwrap();
    assert!(!h.iter().any(|e| e.kind == "unconfined"), "{h:?}");
    let refused: Vec<&str> =
        h.iter().filter(|e| e.kind == "egress_refused").filter_map(|e| e.detail.as_deref()).collect();
    let (pg, lp) = (value(&s.prompt, "pg_port"), value(&s.prompt, "loop_port"));
    assert!(
        refused.iter().any(|d| d.contains(&format!("127.0.0.1:{pg}")) && d.contains(&format!("localhost:{lp}"))),
        "the refused hosts are in the history: {h:?}"
    );
    let (job, payload) = db.queue.job(id).await.unwrap().unwrap();
    let branch = job.branch(&payload).expect("the job's branch");
    assert_eq!(s.remote.show(&branch, "work.txt").as_deref(), Some("done by the agent\n"), "DevPilot pushed the work");
    drop(s);
}

/// A machine whose runner cannot make user namespaces (run inside a sandbox that refuses
/// them) says "agents run unconfined here, because …" in `status` and `doctor`, runs the
/// user's own job unconfined and says so in its history, and never claims a tracker's job.
async fn a_machine_that_cannot_confine_says_so_and_takes_no_strangers_job(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("degraded");
    let root = tempfile::tempdir().unwrap();
    let home = root.path().join("home");
    write_config(&home, "");
    let agent = root.path().join("agent.sh");
    std::fs::write(&agent, "#!/bin/sh\necho ran\n").unwrap();
    std::process::Command::new("chmod").arg("+x").arg(&agent).status().unwrap();
    let source = db
        .queue
        .register_source(
            &orch,
            &devpilot_store::queue::SourceSpec {
                name: "gh",
                kind: "github",
                filter: "{}",
                interval: Duration::from_secs(60),
            },
        )
        .await
        .unwrap();
    let strangers = enqueue(&home, &db, &orch, &["--title", "A stranger's issue"]);
    db.exec(&format!("UPDATE dispatch_queue SET source_id = {source} WHERE id = {strangers}")).await;
    let own = enqueue(&home, &db, &orch, &["--title", "My own job"]);
    let degraded = |args: &[&str]| {
        let mut c = std::process::Command::new("bwrap");
        c.args(["--unshare-user", "--disable-userns", "--dev-bind", "/", "/", "--"])
            .arg(devpilot_tests::devpilot_bin());
        c.args(args)
            .env("DEVPILOT_DATABASE_URL", &db.raw_url)
            .env("XDG_CONFIG_HOME", home.join("config"))
            .env("XDG_DATA_HOME", home.join("data"))
            .env_remove("DEVPILOT_ORCHESTRATOR");
        c
    };
    let (code, out, err) = devpilot_tests::run_to_end(degraded(&["status", "--orchestrator", &orch]), None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("agents run unconfined here, because"), "status says so: {out}");
    let (_, out, _) = devpilot_tests::run_to_end(degraded(&["doctor", "--orchestrator", &orch]), None);
    assert!(out.contains("agents run unconfined here, because"), "doctor says so: {out}");
    let mut c = degraded(&["run", "--orchestrator", &orch, "--machine", "old-laptop"]);
    c.args(fast_flags()).arg("--").arg(&agent);
    c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let runner = KillTree(c.spawn().unwrap());
    let done = wait_for(Duration::from_secs(30), || async {
        db.queue.job(own).await.unwrap().is_some_and(|(j, _)| j.state == JobState::Completed)
    })
    .await;
    drop(runner);
    assert!(done, "the user's own job ran");
    let h = db.queue.history(own).await.unwrap();
    assert!(
        h.iter().any(|e| e.kind == "unconfined" && said(&e.detail, "bubblewrap cannot make a sandbox here")),
        "its history says it ran unconfined, and why: {h:?}"
    );
    let (job, _) = db.queue.job(strangers).await.unwrap().unwrap();
    // The own job was added after the stranger's and still claimed first: the pick passed
    // the stranger's job over.
    assert!(job.state == JobState::Queued && job.claimed_at.is_none(), "the stranger's job waits: {job:?}");
}

fn said(detail: &Option<String>, what: &str) -> bool {
    detail.as_deref().is_some_and(|d| d.contains(what))
}

/// A process whose whole tree is killed when dropped: bubblewrap's child outlives a kill of
/// bubblewrap alone.
struct KillTree(std::process::Child);

impl Drop for KillTree {
    fn drop(&mut self) {
        devpilot_tests::signal_tree(self.0.id(), libc::SIGKILL);
        let _ = self.0.wait();
    }
}

/// A registry stand-in on loopback: serves `tarball` at `path`, and counts what it served.
fn registry(path: &'static str, tarball: Vec<u8>) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let served = std::sync::Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && c.read(&mut byte).map(|n| n == 1).unwrap_or(false) {
                head.push(byte[0]);
            }
            let line = String::from_utf8_lossy(&head).lines().next().unwrap_or_default().to_string();
            let (status, body) = if line.starts_with(&format!("GET {path} ")) {
                count.fetch_add(1, Ordering::SeqCst);
                ("200 OK", tarball.clone())
            } else {
                ("404 Not Found", b"{}".to_vec())
            };
            let _ = c.write_all(
                format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).as_bytes(),
            );
            let _ = c.write_all(&body);
        }
    });
    (port, served)
}

/// A repo's `setup` runs confined too, and still works: `npm ci` installs the locked
/// package from a registry stand-in that the repo's `allow_hosts` names, the agent finds it
/// installed, and the job completes. Without the host in `allow_hosts`, the same setup
/// fails, and says why.
async fn a_confined_setup_installs_from_a_registry_the_repo_allows(backend: Backend) {
    let db = TestDb::new(backend).await;
    let root = tempfile::tempdir().unwrap();
    let pkg = root.path().join("pkg/package");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("package.json"), r#"{"name":"tiny-pkg","version":"1.0.0","main":"index.js"}"#).unwrap();
    std::fs::write(pkg.join("index.js"), "module.exports = 'tiny';\n").unwrap();
    let tgz = root.path().join("tiny-pkg-1.0.0.tgz");
    let made = std::process::Command::new("tar")
        .args(["czf"])
        .arg(&tgz)
        .arg("-C")
        .arg(root.path().join("pkg"))
        .arg("package")
        .status()
        .unwrap();
    assert!(made.success());
    let sha = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("openssl dgst -sha512 -binary {} | base64 -w0", tgz.display()))
        .output()
        .unwrap();
    let integrity = format!("sha512-{}", String::from_utf8_lossy(&sha.stdout).trim());
    let (port, served) = registry("/tiny-pkg/-/tiny-pkg-1.0.0.tgz", std::fs::read(&tgz).unwrap());
    let remote = GitRemote::new(&root.path().join("remote"));
    let seed = root.path().join("remote/seed");
    let lock = serde_json::json!({
        "name": "app", "version": "1.0.0", "lockfileVersion": 3, "requires": true,
        "packages": {
            "": {"name": "app", "version": "1.0.0", "dependencies": {"tiny-pkg": "1.0.0"}},
            "node_modules/tiny-pkg": {
                "version": "1.0.0",
                "resolved": format!("http://127.0.0.1:{port}/tiny-pkg/-/tiny-pkg-1.0.0.tgz"),
                "integrity": integrity,
            }
        }
    });
    std::fs::write(
        seed.join("package.json"),
        r#"{"name":"app","version":"1.0.0","dependencies":{"tiny-pkg":"1.0.0"}}"#,
    )
    .unwrap();
    std::fs::write(seed.join("package-lock.json"), lock.to_string()).unwrap();
    std::fs::write(seed.join(".gitignore"), ".env\nsetup.txt\nnode_modules/\n").unwrap();
    git(&seed, &["add", "-A"]);
    git(&seed, &["commit", "--quiet", "-m", "a package"]);
    git(&seed, &["push", "--quiet", "origin", "main"]);
    let agent = root.path().join("agent/agent.sh");
    std::fs::create_dir_all(agent.parent().unwrap()).unwrap();
    std::fs::write(&agent, "#!/bin/sh\ncat node_modules/tiny-pkg/index.js\ntest -f node_modules/tiny-pkg/index.js\n")
        .unwrap();
    std::process::Command::new("chmod").arg("+x").arg(&agent).status().unwrap();
    for (allowed, ends) in [(false, JobState::Dead), (true, JobState::Completed)] {
        let orch = db.orch(if allowed { "registry" } else { "no-registry" });
        let home = root.path().join(&orch);
        let clone = remote.clone_to(&home.join("src/app"));
        let hosts = if allowed { format!("allow_hosts = [\"127.0.0.1:{port}\"]\n") } else { String::new() };
        write_config(
            &home,
            &format!(
                "[repos.app]\npath = \"{}\"\nsetup = [\"npm\", \"ci\", \"--no-audit\", \"--no-fund\", \"--no-update-notifier\", \"--fetch-retries=0\"]\n{hosts}",
                clone.display()
            ),
        );
        let id = enqueue(&home, &db, &orch, &["--title", "Use the package", "--repo", "app", "--max-attempts", "1"]);
        let mut flags = fast_flags();
        flags.push("--until-empty");
        let mut r = spawn_runner(&home, &db.raw_url, &orch, "m", &flags, &agent, &[]);
        assert!(r.wait_timeout(Duration::from_secs(120)).is_some(), "the runner ended");
        let (job, _) = db.queue.job(id).await.unwrap().unwrap();
        let error = job.last_error.clone().unwrap_or_default();
        assert_eq!(job.state, ends, "allowed {allowed}: {error}");
        if !allowed {
            assert!(error.contains("setup `npm ci"), "the setup failed, and says so: {error}");
        }
    }
    assert!(served.load(std::sync::atomic::Ordering::SeqCst) >= 1, "the tarball came from the registry stand-in");
}

/// The runner keeps its database password from its agent: an agent (the same user, not
/// root) finds it neither in `/proc/$PPID/environ` nor in `cmdline` nor in `mem`, run
/// unconfined (its parent is the runner, which is not dumpable) and confined (its parent is
/// the sandbox's init, not dumpable either; the runner is not even in its view). The agent
/// proves each probe works by finding its own marker in its own `/proc/self` first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_keeps_its_password_from_its_agent() {
    let db = TestDb::new(Backend::Postgres).await;
    for sandbox in ["off", "on"] {
        let got = probe_the_parent(&db, sandbox).await;
        assert_eq!(got["self_environ_works"], true, "the environ probe works: {got}");
        assert_eq!(got["self_mem_works"], true, "the memory probe works: {got}");
        for source in ["environ", "cmdline", "mem"] {
            assert_eq!(
                got[source]["found"], false,
                "sandbox {sandbox}: the password is in the parent's {source}: {got}"
            );
        }
        assert_ne!(got["mem"]["read"], true, "sandbox {sandbox}: the parent's memory is not readable: {got}");
    }
}

/// Runs [`PROBE`] as the unprivileged user under `devpilot run --sandbox SANDBOX`: its report.
async fn probe_the_parent(db: &TestDb, sandbox: &str) -> serde_json::Value {
    let orch = db.orch("proc");
    let password = devpilot_tests::shared_pg().password.clone();
    // A directory the unprivileged user can use (tests run as root in CI).
    let shared = tempfile::Builder::new().prefix("devpilot-proc-").tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(
        shared.path(),
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o777),
    )
    .unwrap();
    let bin = shared.path().join("devpilot");
    std::fs::copy(devpilot_tests::devpilot_bin(), &bin).unwrap();
    let report = shared.path().join("report.json");
    let probe = shared.path().join("probe.py");
    std::fs::write(&probe, PROBE).unwrap();
    std::fs::set_permissions(&probe, <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755))
        .unwrap();
    let needle: String = password.chars().rev().collect();
    db.queue
        .enqueue(&orch, &serde_json::json!({"title": "probe", "needle_reversed": needle, "report": report}))
        .await
        .unwrap();
    let mut c = if devpilot_tests::is_root() {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(&bin);
        c
    } else {
        std::process::Command::new(&bin)
    };
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("HOME", shared.path())
        .env("XDG_CONFIG_HOME", shared.path().join("config"))
        .env("XDG_DATA_HOME", shared.path().join("data"))
        .env("DEVPILOT_DATABASE_URL", db.raw_url.as_str())
        .args(["run", "--orchestrator", &orch, "--machine", "m", "--until-empty"])
        .args(fast_flags())
        .args(["--sandbox", sandbox, "--allow-write", &shared.path().display().to_string()])
        .arg("--")
        .arg(&probe)
        .current_dir(shared.path());
    let (code, _, log) = devpilot_tests::run_to_end(c, None);
    assert_eq!(code, 0, "{log}");
    serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap()
}

/// The probe agent of [`the_runner_keeps_its_password_from_its_agent`].
const PROBE: &str = r#"#!/usr/bin/python3
import json, os, re, sys
payload = json.load(sys.stdin)
needle = payload["needle_reversed"][::-1].encode()
ppid = os.getppid()
def scan_file(path):
    try:
        with open(path, "rb") as f:
            return {"read": True, "found": needle in f.read()}
    except OSError as e:
        return {"read": False, "found": False, "error": str(e)}
def scan_mem(pid, target):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", 0)
    except OSError as e:
        return {"read": False, "found": False, "error": str(e)}
    read = found = False
    for line in maps:
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
        if not m:
            continue
        start, end = int(m.group(1), 16), int(m.group(2), 16)
        if end - start > 256 * 1024 * 1024:
            continue
        try:
            mem.seek(start)
            chunk = mem.read(end - start)
        except (OSError, ValueError, OverflowError):
            continue
        read = True
        if target in chunk:
            found = True
            break
    return {"read": read, "found": found}
marker = b"probe-marker-" + str(os.getpid()).encode() * 3
report = {
    "environ": scan_file(f"/proc/{ppid}/environ"),
    "cmdline": scan_file(f"/proc/{ppid}/cmdline"),
    "mem": scan_mem(ppid, needle),
    "self_environ_works": b"DEVPILOT_JOB_ID=" in open("/proc/self/environ", "rb").read(),
    "self_mem_works": scan_mem(os.getpid(), marker)["found"],
}
with open(payload["report"], "w") as f:
    json.dump(report, f)
print("probed")
"#;
