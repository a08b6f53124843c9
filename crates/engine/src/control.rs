//! The control socket: how `devpilot pause`, `resume` and `handoff` reach the tray or the
//! `devpilot run` that serves a queue on this computer, without a PID to guess or a signal to
//! send. One unix socket per queue in the data dir (`control/<queue>.sock`, in a 0700
//! directory), one JSON line asked and one answered, passed to the machine's [`Handle`] as the
//! same wishes the tray's menu sends. A hand-off is the serving process's own ([`Machine`]):
//! the tray's publishes its verdict as every tray hand-off does, and the answer carries that
//! verdict, so the terminal and the tray say the same words.
//!
//! The socket is this user's alone (the directory's mode), a non-socket at its path is never
//! removed, and a process removes only the socket it bound (checked by inode), so a second
//! machine for the same queue leaves the first one's socket alone.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::Digest;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
pub use tokio_util::sync::CancellationToken;

use crate::orchestrator::verdict::HandOffVerdict;
use crate::orchestrator::{Handle, MachineState, Status};

/// The longest pause a request may ask for: a year (a longer one is "until resumed").
pub const MAX_PAUSE_SECS: u64 = 365 * 86_400;

/// How long a request may take to arrive, and a hand-off to answer.
const READ_BOUND: Duration = Duration::from_secs(5);
const HANDOFF_BOUND: Duration = Duration::from_secs(120);

/// What a client asks.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Status,
    /// Claim nothing for `for_secs` (or until resumed); running jobs go on.
    Pause {
        for_secs: Option<u64>,
    },
    Resume,
    /// Stop the agents, push their work, release their jobs and pause claiming.
    HandOff,
}

/// What the machine answers: its status after the wish, and a hand-off's verdict.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    /// Why not, when not `ok`.
    pub error: Option<String>,
    /// Not `ok` because there was nothing to do (a resume of a machine that is not paused).
    #[serde(default)]
    pub nothing: bool,
    pub machine: Option<MachineView>,
    /// What a hand-off did, in the words the tray shows.
    #[serde(default)]
    pub verdict: Option<HandOffVerdict>,
}

/// The machine as a reply shows it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MachineView {
    #[serde(rename = "machine")]
    pub name: String,
    pub state: MachineState,
    pub paused: bool,
    /// When an automatic resume is due (ms since the epoch), if one is.
    pub paused_until_unix_ms: Option<u64>,
    /// The jobs it runs now.
    pub running: Vec<i64>,
}

impl MachineView {
    fn of(s: &Status) -> Self {
        Self {
            name: s.machine.clone(),
            state: s.state,
            paused: s.paused,
            paused_until_unix_ms: s.paused_until_unix_ms,
            running: s.running.iter().map(|r| r.job.id).collect(),
        }
    }
}

/// What a control socket serves: the running machine, and its own way to hand off.
pub trait Machine: Send + Sync + 'static {
    /// The machine now (the tray's changes when its settings do); None before it starts.
    fn handle(&self) -> Option<Handle>;

    /// Hands every job off and pauses: what it did, in words.
    fn hand_off(&self) -> impl std::future::Future<Output = Option<HandOffVerdict>> + Send;
}

/// `devpilot run`: the machine itself.
impl Machine for Handle {
    fn handle(&self) -> Option<Handle> {
        Some(self.clone())
    }

    async fn hand_off(&self) -> Option<HandOffVerdict> {
        Some(crate::orchestrator::verdict::hand_off(self, true, false, |_| {}).await)
    }
}

/// Where the socket of queue `orchestrator` is under `data_dir`. A name that is not a plain
/// file name (or is long: a socket path has ~100 bytes) is hashed.
pub fn socket_path(data_dir: &Path, orchestrator: &str) -> PathBuf {
    let plain = orchestrator.len() <= 40
        && !orchestrator.starts_with('.')
        && orchestrator.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let name = if plain {
        orchestrator.to_string()
    } else {
        let digest = sha2::Sha256::digest(orchestrator.as_bytes());
        digest.iter().take(12).map(|b| format!("{b:02x}")).collect()
    };
    data_dir.join("control").join(format!("{name}.sock"))
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// No tray or `devpilot run` serves this queue here.
    #[error("no DevPilot machine is running for this queue on this computer")]
    NotRunning,
    #[error("the running machine did not answer: {0}")]
    Io(#[from] io::Error),
    #[error("the running machine answered something unreadable: {0}")]
    Garbled(#[from] serde_json::Error),
}

/// Asks the machine serving `path`.
pub async fn ask(path: &Path, req: &Request) -> Result<Reply, AskError> {
    let stream = match UnixStream::connect(path).await {
        Ok(s) => s,
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused) => {
            return Err(AskError::NotRunning)
        }
        Err(e) => return Err(e.into()),
    };
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    write.write_all(line.as_bytes()).await?;
    let bound = if *req == Request::HandOff { HANDOFF_BOUND + READ_BOUND } else { READ_BOUND * 2 };
    let mut answer = String::new();
    let mut reader = BufReader::new(read).take(1 << 20);
    match tokio::time::timeout(bound, reader.read_line(&mut answer)).await {
        Ok(r) => r?,
        Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time").into()),
    };
    Ok(serde_json::from_str(&answer)?)
}

/// A bound socket, removed when dropped if it is still the one bound.
pub struct Server {
    path: PathBuf,
    identity: Identity,
}

/// Which file a path names: its inode and when it was made (an inode number is reused as soon
/// as a file is removed, so a socket bound after ours may have ours).
#[derive(PartialEq, Eq)]
struct Identity(u64, u64, i64, i64);

impl Identity {
    fn of(path: &Path) -> Option<Identity> {
        let m = std::fs::symlink_metadata(path).ok().filter(|m| m.file_type().is_socket())?;
        Some(Identity(m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if Identity::of(&self.path).is_some_and(|i| i == self.identity) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds `path` and answers requests with `machine` until `stop`. Non-fatal: a failure is
/// logged and nothing serves.
pub fn spawn(path: PathBuf, machine: impl Machine, stop: CancellationToken) {
    let listener = match bind(&path) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "no control socket: `devpilot pause`, `resume` and `handoff` cannot reach this machine");
            return;
        }
    };
    tokio::spawn(async move {
        let (listener, _server) = listener;
        let machine = std::sync::Arc::new(machine);
        loop {
            let stream = tokio::select! {
                _ = stop.cancelled() => break,
                a = listener.accept() => match a {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "control socket: accept failed");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                },
            };
            let machine = machine.clone();
            tokio::spawn(async move {
                if let Err(e) = answer(stream, machine.as_ref()).await {
                    tracing::debug!(error = %e, "control socket: a request failed");
                }
            });
        }
    });
}

fn bind(path: &Path) -> io::Result<(UnixListener, Server)> {
    let dir = path.parent().ok_or_else(|| io::Error::other("a socket path needs a directory"))?;
    crate::safe_fs::private_dir(dir)?;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::other(format!("{} exists and is not a socket; not touching it", path.display())));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(io::ErrorKind::AddrInUse, "another DevPilot machine serves this queue here"));
        }
        // A socket nobody listens on: a machine that ended without removing it.
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let identity = Identity::of(path).ok_or_else(|| io::Error::other("the socket vanished as it was bound"))?;
    Ok((listener, Server { path: path.to_path_buf(), identity }))
}

async fn answer(stream: UnixStream, machine: &impl Machine) -> Result<(), AskError> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read).take(4096);
    tokio::time::timeout(READ_BOUND, reader.read_line(&mut line))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request in time"))??;
    let reply = match serde_json::from_str::<Request>(&line) {
        Err(e) => refusal(format!("unreadable request: {e}"), None),
        Ok(req) => match machine.handle() {
            None => refusal("the machine is not started (no database yet?)".into(), None),
            Some(h) => obey(machine, &h, req).await,
        },
    };
    let mut out = serde_json::to_string(&reply)?;
    out.push('\n');
    write.write_all(out.as_bytes()).await?;
    Ok(())
}

fn refusal(error: String, status: Option<Status>) -> Reply {
    Reply {
        ok: false,
        error: Some(error),
        nothing: false,
        machine: status.as_ref().map(MachineView::of),
        verdict: None,
    }
}

/// Passes `req` to the machine and waits (bounded) until its status shows it.
async fn obey(machine: &impl Machine, h: &Handle, req: Request) -> Reply {
    let mut verdict = None;
    match req {
        Request::Status => {}
        Request::Pause { for_secs } => {
            h.pause(for_secs.filter(|s| *s > 0 && *s <= MAX_PAUSE_SECS).map(Duration::from_secs));
            settle(h, |s| s.paused).await;
        }
        Request::Resume => {
            if !h.status().paused {
                return Reply { nothing: true, ..refusal("not paused".into(), Some(h.status())) };
            }
            h.resume();
            settle(h, |s| !s.paused).await;
        }
        Request::HandOff => {
            match tokio::time::timeout(HANDOFF_BOUND, machine.hand_off()).await {
                Ok(Some(v)) => verdict = Some(v),
                Ok(None) => return refusal("the machine is not started".into(), Some(h.status())),
                Err(_) => return refusal("the hand-off did not finish in time".into(), Some(h.status())),
            }
            settle(h, |s| s.paused).await;
        }
    }
    Reply { ok: true, error: None, nothing: false, machine: Some(MachineView::of(&h.status())), verdict }
}

/// Waits up to two seconds for the published status to satisfy `done`.
async fn settle(h: &Handle, done: impl Fn(&Status) -> bool) {
    let mut rx = h.watch_status();
    let _ = tokio::time::timeout(Duration::from_secs(2), rx.wait_for(|s| done(s))).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names that are plain file names are kept; others are hashed to a short fixed name.
    #[test]
    fn socket_names_are_safe() {
        let d = Path::new("/d");
        assert_eq!(socket_path(d, "personal"), Path::new("/d/control/personal.sock"));
        let odd = socket_path(d, "../team one/x");
        assert_eq!(odd.parent(), Some(Path::new("/d/control")));
        assert_eq!(odd.file_name().unwrap().len(), 24 + 5);
        assert_ne!(socket_path(d, ".."), Path::new("/d/control/...sock"));
    }

    /// A file that is not a socket is never removed or replaced; a stale socket is; a
    /// machine that stops removes only its own socket.
    #[tokio::test]
    async fn only_its_own_socket_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control").join("q.sock");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"keep").unwrap();
        assert!(bind(&path).is_err(), "a regular file is refused");
        assert_eq!(std::fs::read(&path).unwrap(), b"keep");
        std::fs::remove_file(&path).unwrap();

        let (l1, s1) = bind(&path).unwrap();
        assert!(bind(&path).is_err(), "a live socket is another machine's");
        drop(l1);
        // Now stale: the next machine replaces it, and the first one's drop leaves it.
        let (_l2, s2) = bind(&path).unwrap();
        drop(s1);
        assert!(path.exists(), "the first server removed a socket that was not its own");
        drop(s2);
        assert!(!path.exists());
        assert!(matches!(ask(&path, &Request::Status).await, Err(AskError::NotRunning)));
    }
}
