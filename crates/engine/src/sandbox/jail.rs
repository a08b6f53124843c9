//! One agent's sandbox: its mounts, its egress proxy and the bubblewrap command line that
//! starts the agent (through the init) inside.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::egress::Egress;
use super::hosts::Allowlist;
use super::init;
use super::mounts::{Mount, Mounts};
use super::probe::inner_uid;

/// Where the init's binary appears inside every sandbox.
pub const INIT: &str = "/.devpilot/init";
/// Where the egress socket appears inside every sandbox.
pub const EGRESS: &str = "/.devpilot/egress.sock";
/// The loopback port inside the sandbox that `HTTP(S)_PROXY` names.
pub const PROXY_PORT: u16 = 3128;

/// The binary that is the sandbox's init ([`init`]): this one when it is DevPilot's (`devpilot`
/// or the tray app, whose `main` hands [`init::ARG`] over first); else (a test binary that
/// embeds the engine) the `devpilot` built beside it.
fn init_exe() -> std::io::Result<PathBuf> {
    static FOUND: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(p) = FOUND.get() {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe()?;
    let ours = exe.file_name().is_some_and(|n| n == "devpilot" || n == "devpilot-tray");
    let found = if ours {
        exe
    } else {
        let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        [dir.join("devpilot"), dir.join("../devpilot")]
            .into_iter()
            .find_map(|p| p.canonicalize().ok().filter(|p| p.is_file()))
            .unwrap_or(exe)
    };
    Ok(FOUND.get_or_init(|| found).clone())
}

/// One agent's sandbox, its proxy serving, ready to wrap the agent's command line.
pub struct Jail {
    bwrap: PathBuf,
    mounts: Mounts,
    /// An empty read-only file laid over hidden files.
    empty: PathBuf,
    egress: Egress,
    forwards: Vec<u16>,
    cwd: PathBuf,
}

/// What a [`Jail`] is made from.
pub struct JailSpec {
    pub bwrap: PathBuf,
    /// The sandbox's filesystem (the system, home and the job's paths).
    pub mounts: Mounts,
    pub allow: Allowlist,
    /// The job's private directory outside: the egress socket and the empty file go there.
    pub private: PathBuf,
    pub cwd: PathBuf,
}

impl Jail {
    /// Starts the job's egress proxy and lays the init and its socket into the mounts.
    pub fn new(spec: JailSpec) -> std::io::Result<Jail> {
        crate::safe_fs::private_dir(&spec.private)?;
        let empty = spec.private.join("empty");
        if !empty.exists() {
            std::fs::write(&empty, b"")?;
        }
        let socket = spec.private.join("egress.sock");
        let forwards: Vec<u16> = spec.allow.loopback().map(|h| h.port()).collect();
        let egress = Egress::serve(&socket, spec.allow)?;
        let mut mounts = spec.mounts;
        mounts.set(INIT, Mount::From(init_exe()?));
        mounts.set(EGRESS, Mount::FromWritable(socket));
        Ok(Jail { bwrap: spec.bwrap, mounts, empty, egress, forwards, cwd: spec.cwd })
    }

    /// The program and arguments that run `program args` inside.
    pub fn wrap(&self, program: &Path, args: Vec<OsString>) -> (PathBuf, Vec<OsString>) {
        let mut a: Vec<OsString> = ["--unshare-all", "--unshare-user", "--die-with-parent", "--cap-drop", "ALL"]
            .iter()
            .map(OsString::from)
            .collect();
        if let Some(uid) = inner_uid() {
            a.extend(["--uid", &uid.to_string(), "--gid", &uid.to_string()].map(OsString::from));
        }
        a.extend(["--proc", "/proc", "--dev", "/dev"].map(OsString::from));
        a.extend(self.mounts.args(&self.empty));
        a.extend([OsString::from("--chdir"), self.cwd.clone().into_os_string()]);
        a.extend(["--", INIT, init::ARG, "--egress", EGRESS, "--proxy-port"].map(OsString::from));
        a.push(PROXY_PORT.to_string().into());
        for p in &self.forwards {
            a.extend([OsString::from("--forward"), p.to_string().into()]);
        }
        a.push("--".into());
        a.push(program.as_os_str().to_os_string());
        a.extend(args);
        (self.bwrap.clone(), a)
    }

    /// The agent's environment, changed for the sandbox: its proxy, its own `/tmp`, and no
    /// variable naming a socket or directory it cannot reach.
    pub fn env(&self, vars: &mut BTreeMap<OsString, OsString>) {
        for gone in ["ALL_PROXY", "all_proxy", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS", "SSH_AUTH_SOCK"] {
            vars.remove(&OsString::from(gone));
        }
        let proxy = format!("http://127.0.0.1:{PROXY_PORT}");
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            vars.insert(k.into(), proxy.clone().into());
        }
        for k in ["NO_PROXY", "no_proxy"] {
            vars.insert(k.into(), "localhost,127.0.0.1,::1".into());
        }
        vars.insert("TMPDIR".into(), "/tmp".into());
        vars.insert("DEVPILOT_SANDBOX".into(), "bwrap".into());
    }

    /// The hosts the proxy refused so far, each with a count.
    pub fn refused(&self) -> Vec<(String, u32)> {
        self.egress.refused()
    }
}

/// What the job's history says of the hosts a sandbox refused (`host:port`, each with a
/// count), if it refused any.
pub fn refusals(refused: &[(String, u32)]) -> Option<String> {
    let list: Vec<String> =
        refused.iter().map(|(h, n)| if *n > 1 { format!("{h} ({n}×)") } else { h.clone() }).collect();
    (!list.is_empty()).then(|| format!("the sandbox refused connections to {}", list.join(", ")))
}

/// An agent's exit status as the runner reads it: bubblewrap reports an agent killed by
/// signal N as exit code 128 + N, which is turned back into that signal.
pub fn unwrap_status(status: std::process::ExitStatus, jailed: bool) -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    match status.code() {
        Some(c) if jailed && (129..=128 + 64).contains(&c) => std::process::ExitStatus::from_raw(c - 128),
        _ => status,
    }
}
