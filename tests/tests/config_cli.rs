//! `devpilot config path` and `devpilot config show`, through the real binary: where the file
//! is, what it says, and that a database password is never printed, whether it sits in the
//! keychain, in the config file's URL, or in `DEVPILOT_DATABASE_URL`, and whether or not the
//! keychain can be reached.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};

use devpilot_tests::devpilot_bin;

/// A D-Bus address nothing listens on: the keychain is unreachable, and no test ever touches
/// the keychain of the user running it.
const NO_BUS: &str = "unix:path=/nonexistent/devpilot-test-bus";

/// Gives `c` its own home, config and data dirs, no database URL in the environment and no
/// reachable keychain.
fn isolated<'a>(c: &'a mut Command, home: &Path) -> &'a mut Command {
    c.env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env("DBUS_SESSION_BUS_ADDRESS", NO_BUS)
        .env("DEVPILOT_LOG", "warn,devpilot=debug")
        .env_remove("DEVPILOT_DATABASE_URL")
        .env_remove("DEVPILOT_ORCHESTRATOR")
        .stdin(Stdio::null())
}

/// `devpilot ARGS`, isolated.
fn devpilot(home: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(devpilot_bin());
    isolated(&mut c, home).args(args);
    c
}

/// Runs it to its end: (exit code, stdout, stderr). A panic is a failure.
fn run(mut c: Command) -> (i32, String, String) {
    let out = c.output().expect("run devpilot");
    let (o, e) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(!e.contains("panicked") && !e.contains("RUST_BACKTRACE"), "no panic: {e}");
    (out.status.code().unwrap_or(-1), o, e)
}

fn write_config(home: &Path, text: &str) -> std::path::PathBuf {
    let dir = home.join("config/devpilot");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("config.toml");
    std::fs::write(&file, text).unwrap();
    file
}

/// `config path` prints the file under `$XDG_CONFIG_HOME`, whether or not it exists yet.
#[test]
fn config_path_prints_the_file_under_xdg_config_home() {
    let home = tempfile::tempdir().unwrap();
    let want = format!("{}\n", home.path().join("config/devpilot/config.toml").display());
    let (code, out, err) = run(devpilot(home.path(), &["config", "path"]));
    assert_eq!((code, out.as_str(), err.as_str()), (0, want.as_str(), ""));
    write_config(home.path(), "orchestrator_id = \"work\"\n");
    let (code, out, _) = run(devpilot(home.path(), &["config", "path"]));
    assert_eq!((code, out.as_str()), (0, want.as_str()));
}

/// With no file, `config show` says so and prints the defaults as TOML that parses.
#[test]
fn config_show_without_a_file_prints_the_defaults() {
    let home = tempfile::tempdir().unwrap();
    let (code, out, err) = run(devpilot(home.path(), &["config", "show"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("(not created yet: these are the defaults)"), "{out}");
    assert!(out.contains("# database: the embedded SQLite file "), "{out}");
    assert!(out.contains("# database password: none"), "{out}");
    let v: toml::Value = toml::from_str(&out).unwrap_or_else(|e| panic!("not TOML ({e}): {out}"));
    assert_eq!(v["orchestrator_id"].as_str(), Some("personal"), "{out}");
}

/// A password written into the config file's URL (in the user info and in the query), or into
/// `DEVPILOT_DATABASE_URL`, never reaches the output, in any spelling; what is shown says
/// where it is, and the rest of the settings are shown as they are.
#[test]
fn config_show_never_prints_a_password_in_a_url() {
    let home = tempfile::tempdir().unwrap();
    write_config(
        home.path(),
        "database_url = \"postgres://alice:Url-S3cr3t%21@127.0.0.1:1/queue?sslmode=disable&password=Query-S3cr3t\"\n\
         orchestrator_id = \"work\"\n\
         [agents.claude]\n\
         env = { ANTHROPIC_API_KEY = \"Env-S3cr3t\", CLAUDE_MODEL = \"opus\" }\n",
    );
    let mut c = devpilot(home.path(), &["config", "show"]);
    c.env("DEVPILOT_DATABASE_URL", "postgres://bob:Env-Url-S3cr3t@db.example/other");
    let (code, out, err) = run(c);
    assert_eq!(code, 0, "{err}");
    for secret in ["Url-S3cr3t", "Query-S3cr3t", "Env-S3cr3t", "Env-Url-S3cr3t"] {
        assert!(!out.contains(secret) && !err.contains(secret), "{secret} was printed:\n{out}\n{err}");
    }
    assert!(out.contains("# database: postgres://alice:***@127.0.0.1:1/queue?sslmode=disable&password=***"), "{out}");
    assert!(out.contains("# database password: in the config file's URL (hidden here)"), "{out}");
    assert!(out.contains("DEVPILOT_DATABASE_URL is set, so devpilot commands use postgres://bob:***@db.example/other"));
    let v: toml::Value = toml::from_str(&out).unwrap_or_else(|e| panic!("not TOML ({e}): {out}"));
    assert_eq!(v["orchestrator_id"].as_str(), Some("work"));
    assert_eq!(v["agents"]["claude"]["env"]["CLAUDE_MODEL"].as_str(), Some("opus"));
    assert_eq!(v["agents"]["claude"]["env"]["ANTHROPIC_API_KEY"].as_str(), Some("***"));
}

/// A keychain that cannot be reached is a line saying so and why, not a failure.
#[test]
fn config_show_says_when_the_keychain_is_unavailable() {
    let home = tempfile::tempdir().unwrap();
    write_config(home.path(), "database_url = \"postgres://alice@127.0.0.1:1/queue\"\n");
    let (code, out, err) = run(devpilot(home.path(), &["config", "show"]));
    assert_eq!(code, 0, "{err}");
    let line = out.lines().find(|l| l.starts_with("# database password: ")).unwrap_or_else(|| panic!("{out}"));
    let why = line.strip_prefix("# database password: keychain unavailable: ").unwrap_or_else(|| panic!("{line}"));
    assert!(why.len() > 10, "a reason: {line}");
    assert!(out.contains("# database: postgres://alice@127.0.0.1:1/queue"), "{out}");
}

/// With a Secret Service (a throwaway gnome-keyring on a private D-Bus session, its files in
/// the test's home): "none" before the password is stored, "stored in keychain" after, and the
/// password itself never printed.
#[test]
fn config_show_finds_a_password_in_the_keychain() {
    for tool in ["dbus-run-session", "gnome-keyring-daemon", "secret-tool"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().unwrap();
        assert!(
            found.status.success(),
            "{tool} is missing: install the apt packages dbus, gnome-keyring and libsecret-tools (scripts/setup.sh)"
        );
    }
    let home = tempfile::tempdir().unwrap();
    write_config(home.path(), "database_url = \"postgres://alice@127.0.0.1:1/queue\"\n");
    let run_dir = home.path().join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    std::fs::set_permissions(&run_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    // The password goes to secret-tool on stdin (printf is a shell builtin): never an argument.
    let script = r#"
        set -e
        eval "$(printf 'unlock-pw' | gnome-keyring-daemon --unlock --components=secrets --daemonize)"
        trap 'kill "$GNOME_KEYRING_PID" 2>/dev/null || true' EXIT
        echo "== before"
        "$DEVPILOT" config show
        printf '%s' "$TEST_DB_PASSWORD" | secret-tool store --label='DevPilot test' service devpilot username 'alice@127.0.0.1:1/queue'
        echo "== after"
        "$DEVPILOT" config show
    "#;
    let mut c = Command::new("dbus-run-session");
    isolated(&mut c, home.path())
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env_remove("GNOME_KEYRING_CONTROL")
        .env("XDG_RUNTIME_DIR", &run_dir)
        .env("DEVPILOT", devpilot_bin())
        .env("TEST_DB_PASSWORD", "Keychain-S3cr3t")
        .args(["--", "bash", "-c", script]);
    let (code, out, err) = run(c);
    assert_eq!(code, 0, "{out}\n{err}");
    let (before, after) = out.split_once("== after").unwrap_or_else(|| panic!("{out}\n{err}"));
    assert!(before.contains("# database password: none\n"), "{before}\n{err}");
    assert!(after.contains("# database password: stored in keychain\n"), "{after}\n{err}");
    assert!(!out.contains("Keychain-S3cr3t") && !err.contains("Keychain-S3cr3t"), "the password was printed");
}
