//! The tray app on a machine with no graphical session (SSH, a server): the real binary, in
//! its own process, with the display variables taken away or pointing nowhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

/// Runs devpilot-tray with `env` on top of a copy of ours minus every display variable, its
/// config and data dirs in a fresh temp dir; returns what it did and that dir.
fn run(env: &[(&str, &str)]) -> (Output, tempfile::TempDir) {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_devpilot-tray"));
    cmd.env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("WAYLAND_SOCKET")
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .env("XDG_DATA_HOME", home.path().join("data"))
        .env("XDG_RUNTIME_DIR", home.path())
        // Whatever the user has set, there is no panic to show a backtrace of.
        .env("RUST_BACKTRACE", "full")
        .envs(env.iter().copied());
    (cmd.output().unwrap(), home)
}

/// The paragraph's promises: exit 1, what is missing, the headless way in, no panic, nothing
/// written.
fn assert_explains(out: &Output, home: &tempfile::TempDir, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "exit code; stderr: {err}");
    assert!(err.contains(what), "names what is missing ({what}): {err}");
    for promise in ["so the tray app cannot start", "`devpilot run`", "systemd user unit", "same engine"] {
        assert!(err.contains(promise), "says {promise:?}: {err}");
    }
    for panic in ["panicked", "backtrace", "RUST_BACKTRACE", "tao"] {
        assert!(!err.contains(panic), "no panic ({panic:?}): {err}");
    }
    assert_eq!(err.trim_end().lines().count(), 1, "one paragraph: {err}");
    assert!(out.stdout.is_empty(), "nothing on stdout");
    assert!(!home.path().join("config").exists() && !home.path().join("data").exists(), "nothing was written");
}

/// No DISPLAY and no WAYLAND_DISPLAY: one clear paragraph, exit 1, no panic.
#[test]
fn no_display_variable_explains_itself() {
    let (out, home) = run(&[]);
    assert_explains(&out, &home, "there is no graphical session here");
}

/// A DISPLAY naming no X server is caught too: GTK itself is asked, not only the variable.
#[test]
fn unreachable_x_display_explains_itself() {
    let (out, home) = run(&[("DISPLAY", ":59321")]);
    assert_explains(&out, &home, "cannot open the graphical session (DISPLAY=:59321");
}

/// The same for a Wayland socket that is not there.
#[test]
fn missing_wayland_socket_explains_itself() {
    let (out, home) = run(&[("WAYLAND_DISPLAY", "devpilot-no-such-socket")]);
    assert_explains(&out, &home, "cannot open the graphical session (WAYLAND_DISPLAY=devpilot-no-such-socket");
}
