//! Cleaning up after the test process: servers and temp dirs that outlive a panicking or
//! killed test binary are stopped and removed by a detached shell.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs the shell command `then` once this test process is gone, from a detached shell: a
/// test binary that panics or is killed still stops the servers it started.
pub(crate) fn when_gone(then: &str) {
    let script = format!("while kill -0 {} 2>/dev/null; do sleep 0.5; done; {then}", std::process::id());
    let _ = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
}

/// Removes `dir` once this test process is gone.
pub(crate) fn remove_when_gone(dir: &Path) {
    when_gone(&format!("rm -rf {}", dir.display()));
}
