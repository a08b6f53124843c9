//! `devpilot doctor`: the whole setup, one line per part (like `gh auth status`, `flutter
//! doctor`): the config, the database and its schema, the keychain, each repo, the agent CLI
//! and its login, each source's key, the sleep hook, the desktop, and whether a machine runs
//! here. Each line is ok, or says what is wrong and what to do. Nothing is created or changed.

use std::path::Path;
use std::time::Duration;

use devpilot_engine::config::Paths;
use devpilot_engine::settings::Settings;
use devpilot_engine::sources::{maps, RepoRemote};
use devpilot_engine::{control, secrets};
use devpilot_store::db::{self, PoolSettings};

use crate::exit::{Code, Out};
use crate::output::json;

/// How bad a check's finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, serde::Serialize)]
struct Check {
    name: String,
    status: Status,
    detail: String,
    fix: Option<String>,
}

fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
    Check { name: name.into(), status: Status::Ok, detail: detail.into(), fix: None }
}

fn bad(status: Status, name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check { name: name.into(), status, detail: detail.into(), fix: Some(fix.into()) }
}

/// A check that must not hold the whole report up.
const BOUND: Duration = Duration::from_secs(5);

pub async fn doctor(flag: Option<&str>, as_json: bool) -> Out {
    let paths = Paths::for_app("devpilot")?;
    let mut checks = vec![];
    let settings = match paths.load() {
        Ok(s) => {
            let shown = if paths.config_file().exists() {
                paths.config_file().display().to_string()
            } else {
                "none yet: the defaults apply".into()
            };
            checks.push(ok("config", shown));
            Some(s)
        }
        Err(e) => {
            let fix = format!("fix or move {} (`devpilot config show` reads it)", paths.config_file().display());
            checks.push(bad(Status::Fail, "config", e.to_string(), fix));
            None
        }
    };
    let queue = flag.map(str::to_string).or_else(|| settings.as_ref().map(|s| s.orchestrator_id.clone()));
    checks.extend(database_checks().await);
    checks.push(keychain_check().await);
    if let Some(s) = &settings {
        checks.extend(repo_checks(s).await);
        checks.push(agent_check(s).await);
        checks.extend(sandbox_checks(s));
        checks.extend(source_checks(s).await);
    }
    checks.push(sleep_check());
    checks.push(desktop_check());
    if let Some(q) = queue {
        checks.push(machine_check(&paths, &q).await);
    }
    report(&checks, as_json)
}

fn report(checks: &[Check], as_json: bool) -> Out {
    let problems = checks.iter().filter(|c| c.status == Status::Fail).count();
    let warnings = checks.iter().filter(|c| c.status == Status::Warn).count();
    if as_json {
        json(&serde_json::json!({"ok": problems == 0, "problems": problems, "warnings": warnings, "checks": checks}));
    } else {
        for c in checks {
            let mark = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            println!("{mark}  {:<10} {}", c.name, crate::output::shown(Some(&c.detail)));
            if let Some(fix) = &c.fix {
                println!("            fix: {fix}");
            }
        }
        println!("{problems} problem(s), {warnings} warning(s)");
    }
    Ok(if problems == 0 { Code::Ok } else { Code::Error })
}

/// The database: reachable, and its schema there. The embedded file is not created.
async fn database_checks() -> Vec<Check> {
    let url = match crate::open::database_url(None, false).await {
        Ok(u) => u,
        Err(e) => {
            return vec![bad(
                Status::Fail,
                "database",
                e.to_string(),
                "`devpilot login --database-url URL` stores the password; `devpilot config show` says which database",
            )]
        }
    };
    if url.sqlite_path().is_some_and(|p| !p.exists()) {
        return vec![ok("database", format!("{} (embedded; created at first use)", url.target()))];
    }
    let conn = match tokio::time::timeout(BOUND, db::connect(&url, &PoolSettings::default())).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return vec![bad(
            Status::Fail,
            "database",
            format!("{}: {e}", url.target()),
            "is it up and reachable from here? is the password in the keychain (`devpilot login --database-url URL`)?",
        )]
        }
        Err(_) => {
            return vec![bad(
                Status::Fail,
                "database",
                format!("{}: no answer within {}s", url.target(), BOUND.as_secs()),
                "is it up and reachable from here?",
            )]
        }
    };
    let mut out = vec![ok("database", url.target())];
    // `schema_present` asks PostgreSQL's catalog; on SQLite a read of the queue says it.
    let present = if url.is_sqlite() {
        Ok(devpilot_store::queue::Queue::new(conn).counts("").await.is_ok())
    } else {
        db::schema_present(&url, &conn).await
    };
    out.push(match present {
        Ok(true) => ok("schema", "present"),
        Ok(false) => bad(Status::Fail, "schema", "no DevPilot tables", "`devpilot migrate` creates them"),
        Err(e) => bad(Status::Fail, "schema", e.to_string(), "`devpilot migrate`"),
    });
    out
}

async fn keychain_check() -> Check {
    match tokio::time::timeout(BOUND, tokio::task::spawn_blocking(secrets::available)).await {
        Ok(Ok(Ok(()))) => ok("keychain", "the Secret Service answers"),
        Ok(Ok(Err(e))) => bad(
            Status::Warn,
            "keychain",
            e.to_string(),
            "passwords and tracker keys need one: a desktop session runs gnome-keyring or KWallet",
        ),
        _ => bad(Status::Warn, "keychain", "no answer", "a desktop session runs gnome-keyring or KWallet"),
    }
}

/// Each repo: its path, a git clone there, and the remote that hand-offs push to.
async fn repo_checks(s: &Settings) -> Vec<Check> {
    let repos = match s.repos() {
        Ok(r) => r,
        Err(e) => return vec![bad(Status::Fail, "repos", e.to_string(), "fix [repos] in the config")],
    };
    if repos.is_empty() {
        return vec![bad(
            Status::Warn,
            "repos",
            "none configured: jobs with a repo are not claimed here",
            "Settings → Repos, or [repos.NAME] path = \"~/src/NAME\" in the config",
        )];
    }
    let mut checks = vec![];
    for r in repos.values() {
        checks.push(repo_check(r).await);
    }
    checks
}

/// One repo: its path, a git clone there, and its remote's URL (read through DevPilot's
/// own git, which runs nothing the clone's config names).
async fn repo_check(r: &devpilot_engine::worktree::Repo) -> Check {
    let name = format!("repo {}", r.name);
    if !r.path.is_dir() {
        return bad(
            Status::Fail,
            name,
            format!("{} does not exist", r.path.display()),
            "clone it there, or fix its path in the config",
        );
    }
    if !r.path.join(".git").exists() {
        return bad(
            Status::Fail,
            name,
            format!("{} is not a git clone", r.path.display()),
            "point it at a clone (git clone URL PATH)",
        );
    }
    let remote = RepoRemote { clone: r.path.clone(), remote: r.remote.clone() };
    match maps::remote_url(&remote).await {
        Some(u) => ok(
            name,
            format!("{} (remote {} {})", r.path.display(), r.remote, devpilot_engine::git::redact_credentials(&u)),
        ),
        None => bad(
            Status::Warn,
            name,
            format!("{}: no remote '{}'", r.path.display(), r.remote),
            "hand-offs push there: `git remote add` it, or set remote = \"...\"",
        ),
    }
}

async fn agent_check(s: &Settings) -> Check {
    let Some(line) = s.agent.as_deref().filter(|a| !a.trim().is_empty()) else {
        return bad(
            Status::Warn,
            "agent",
            "none chosen: the demo agent runs",
            "agent = \"claude\" (or codex, aider, gemini, or a command) in the config",
        );
    };
    let h = devpilot_app::agent_health::agent_health(line).await;
    if h.ok {
        ok("agent", h.line)
    } else {
        bad(Status::Fail, "agent", h.line, "install it or log it in, or choose another agent in the config")
    }
}

async fn source_checks(s: &Settings) -> Vec<Check> {
    let store = devpilot_engine::sources::KeyStore::Keychain { service: secrets::SERVICE.into() };
    let mut out = vec![];
    for (name, src) in &s.sources {
        let found = tokio::time::timeout(BOUND, store.for_source(src)).await.ok().flatten();
        out.push(match found {
            Some(k) => ok(format!("source {name}"), format!("{}, key from {}", src.kind.tracker(), k.from())),
            None => bad(
                Status::Fail,
                format!("source {name}"),
                devpilot_engine::sources::keys::no_key_here(src),
                "store the key, then restart the machine",
            ),
        });
    }
    out
}

/// Whether agents run confined here ([`devpilot_engine::sandbox`]), and each repo whose
/// settings turn that off.
fn sandbox_checks(s: &Settings) -> Vec<Check> {
    use devpilot_engine::orchestrator::confine::Confining;
    use devpilot_engine::sandbox::{Confinement, SandboxMode};
    let here = Confining::new(&s.sandbox);
    let mut out = vec![match (&here.confinement, s.sandbox.mode) {
        (Confinement::Confined { .. }, _) => ok("sandbox", here.describe()),
        (_, SandboxMode::Off) => bad(
            Status::Warn,
            "sandbox",
            here.describe(),
            "remove `mode = \"off\"` from [sandbox] to confine agents again",
        ),
        (Confinement::Unconfined { .. }, _) => bad(
            Status::Warn,
            "sandbox",
            format!("{}; jobs from tracker sources are not claimed here", here.describe()),
            "install bubblewrap (apt install bubblewrap) and allow unprivileged user namespaces",
        ),
    }];
    for (name, _) in s.repos.iter().filter(|(_, r)| r.sandbox == SandboxMode::Off) {
        out.push(bad(
            Status::Warn,
            format!("repo {name}"),
            "sandbox = \"off\": this repo's agents run unconfined, strangers' issues included",
            format!("remove `sandbox = \"off\"` from [repos.{name}]"),
        ));
    }
    out
}

/// The hand-off before sleep needs systemd-logind on the system bus.
fn sleep_check() -> Check {
    if Path::new("/run/systemd/system").exists() && Path::new("/run/dbus/system_bus_socket").exists() {
        ok("sleep", "systemd-logind: the tray hands off before the machine sleeps")
    } else {
        bad(
            Status::Warn,
            "sleep",
            "no systemd-logind here: nothing hands off before sleep",
            "run `devpilot handoff` before closing the lid",
        )
    }
}

fn desktop_check() -> Check {
    let display =
        std::env::var("WAYLAND_DISPLAY").ok().or_else(|| std::env::var("DISPLAY").ok()).filter(|d| !d.is_empty());
    match display {
        Some(d) => ok("desktop", format!("display {d}: the tray app can run")),
        None => bad(
            Status::Warn,
            "desktop",
            "no display",
            "headless: `devpilot run` (or the systemd user unit) is the same engine",
        ),
    }
}

/// Whether a tray or `devpilot run` serves the queue here, and what it does.
async fn machine_check(paths: &Paths, queue: &str) -> Check {
    let path = control::socket_path(&paths.data_dir, queue);
    match control::ask(&path, &control::Request::Status).await {
        Ok(r) => match r.machine {
            Some(m) => ok("machine", format!("{} serves queue '{queue}' here: {}", m.name, m.state.as_str())),
            None => bad(Status::Warn, "machine", r.error.unwrap_or_default(), "see the tray's window"),
        },
        Err(_) => bad(
            Status::Warn,
            "machine",
            format!("nothing serves queue '{queue}' on this computer"),
            "start the tray app or `devpilot run`",
        ),
    }
}
