//! A keychain of the test's own: a private D-Bus session bus with an unlocked gnome-keyring
//! (Secret Service) on it, under a temp dir, so that a test can store and remove keys
//! through the `devpilot` binary without ever touching the keychain of the user running it.
//! Needs `dbus-daemon`, `gnome-keyring-daemon` and `secret-tool` (scripts/setup.sh installs
//! them: dbus-x11, gnome-keyring, libsecret-tools).

// Harness code says "this must hold" by unwrapping: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A running private Secret Service. Its bus (and with it the keyring daemon, which leaves
/// with its bus) is stopped when this is dropped, or once the test process is gone.
pub struct SecretService {
    /// The bus's address: `DBUS_SESSION_BUS_ADDRESS` of the processes that use it.
    pub address: String,
    /// Where its bus socket, runtime dir and keyrings are.
    pub dir: PathBuf,
    bus_pid: u32,
}

impl SecretService {
    /// Starts a bus under `dir` (created) and an unlocked keyring daemon on it.
    pub fn start(dir: &Path) -> SecretService {
        let run = dir.join("run");
        let data = dir.join("data");
        std::fs::create_dir_all(&run).expect("runtime dir");
        std::fs::create_dir_all(&data).expect("data dir");
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).expect("private runtime dir");
        let out = Command::new("dbus-daemon")
            .args(["--session", "--fork", "--print-address=1", "--print-pid=1"])
            .arg(format!("--address=unix:path={}", run.join("bus").display()))
            .env("HOME", dir)
            .env("XDG_RUNTIME_DIR", &run)
            .env("XDG_DATA_HOME", &data)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("run dbus-daemon (install it: scripts/setup.sh)");
        assert!(out.status.success(), "dbus-daemon: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let address = lines.next().expect("the bus's address").to_string();
        let bus_pid: u32 = lines.next().and_then(|p| p.parse().ok()).expect("the bus's pid");
        crate::watchdog::when_gone(&format!("kill {bus_pid} 2>/dev/null"));
        let service = SecretService { address, dir: dir.to_path_buf(), bus_pid };

        // Unlocks (creating) the login keyring with a password on stdin, as a desktop login does.
        let mut keyring = Command::new("gnome-keyring-daemon")
            .args(["--unlock", "--components=secrets", "--daemonize"])
            .env("DBUS_SESSION_BUS_ADDRESS", &service.address)
            .env("HOME", dir)
            .env("XDG_RUNTIME_DIR", &run)
            .env("XDG_DATA_HOME", &data)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run gnome-keyring-daemon (install it: scripts/setup.sh)");
        keyring.stdin.take().expect("stdin").write_all(b"devpilot-test-keyring").expect("the keyring's password");
        let out = keyring.wait_with_output().expect("gnome-keyring-daemon");
        assert!(out.status.success(), "gnome-keyring-daemon: {}", String::from_utf8_lossy(&out.stderr));
        service
    }

    /// Gives `c` this keychain (and only this one).
    pub fn apply<'a>(&self, c: &'a mut Command) -> &'a mut Command {
        c.env("DBUS_SESSION_BUS_ADDRESS", &self.address)
    }

    /// The secret stored under `service` and `account` (the keyring crate's `service` and
    /// `username` attributes), read with `secret-tool`; `None` when there is none.
    pub fn lookup(&self, service: &str, account: &str) -> Option<String> {
        let mut c = Command::new("secret-tool");
        c.args(["lookup", "service", service, "username", account]).stdin(Stdio::null());
        let out = self.apply(&mut c).output().expect("run secret-tool (install libsecret-tools: scripts/setup.sh)");
        let secret = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && !secret.is_empty()).then_some(secret)
    }
}

impl Drop for SecretService {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) of the bus this harness started (the keyring daemon leaves
        // with its bus).
        unsafe { libc::kill(self.bus_pid as libc::pid_t, libc::SIGTERM) };
    }
}
