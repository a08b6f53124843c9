//! Starting an agent without copying its runner (Linux).
//!
//! A runner is a large, multi-threaded process. `fork` copies its page tables, and after it
//! every page the runner touches faults once (copy-on-write): on the benchmark's agent path
//! that cost more than the rest of a job. std's `Command` avoids `fork` through
//! `posix_spawn`, but only when no `pre_exec` hook is set, and an agent needs one:
//! `PR_SET_PDEATHSIG`, so that it dies with its runner and can never work on a job the sweep
//! has handed to another machine.
//!
//! So this module does what glibc's `posix_spawn` does, plus that one `prctl`: a
//! `clone(CLONE_VM | CLONE_VFORK)` child on a stack of its own shares the runner's memory
//! until it calls `execve`, while the calling thread waits. The child therefore runs only
//! async-signal-safe system calls on values prepared before the clone: it never allocates,
//! takes a lock or unwinds, and it reports a failure by writing `errno` where the parent
//! reads it.
//!
//! [`AgentChild`] is the handle: a pidfd, readable once the agent has exited, waited on with
//! `waitid(P_PIDFD)`, so only this handle can reap it. The agent gets its own process group
//! (so that stopping it reaches its whole tree), an empty signal mask and default handlers
//! (SIGPIPE included, which Rust programs ignore), and only the descriptors it is given on
//! 0, 1 and 2: every other one is closed before `execve`.

use std::collections::BTreeMap;
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;

/// The child's stack: it runs a handful of system calls, nothing deep.
const STACK: usize = 64 * 1024;

/// The write end of an agent's stdin pipe.
pub type StdinWriter = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// Where an agent's stdin comes from.
#[derive(Debug)]
pub enum Stdin {
    Null,
    File(std::fs::File),
    /// A pipe whose write end [`Spawn::start`] returns.
    Pipe,
}

/// One agent process to start: its program (a path, already resolved), arguments,
/// environment (nothing else is inherited), directory and standard streams.
#[derive(Debug)]
pub struct Spawn {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: BTreeMap<OsString, OsString>,
    pub cwd: PathBuf,
    pub stdin: Stdin,
    pub stdout: std::fs::File,
    pub stderr: std::fs::File,
    /// The program ignores SIGTERM, SIGINT and SIGHUP (it is bubblewrap, which would die of
    /// them and take the sandbox down with a SIGKILL; the init inside it handles them).
    pub shield: bool,
}

#[cfg(target_os = "linux")]
/// What the child needs, laid out before the clone: raw pointers into `_owned`.
struct Prepared {
    path: CString,
    cwd: CString,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    fds: [RawFd; 3],
    parent: libc::pid_t,
    shield: bool,
    /// Written by the child before it exits, when a step failed: its errno.
    err: libc::c_int,
    _owned: Vec<CString>,
}

#[cfg(target_os = "linux")]
fn cstring(bytes: Vec<u8>) -> io::Result<CString> {
    CString::new(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a nul byte in an argument or variable"))
}

#[cfg(target_os = "linux")]
fn path_cstring(p: &Path) -> io::Result<CString> {
    cstring(p.as_os_str().to_owned().into_vec())
}

impl Spawn {
    /// Starts the agent. Returns its handle, and the write end of its stdin pipe when
    /// [`Stdin::Pipe`] was asked for. Must be called within a tokio runtime.
    #[cfg(target_os = "linux")]
    pub fn start(self) -> io::Result<(AgentChild, Option<StdinWriter>)> {
        let (stdin, writer) = match self.stdin {
            Stdin::Null => (OwnedFd::from(std::fs::File::open("/dev/null")?), None),
            Stdin::File(f) => (OwnedFd::from(f), None),
            Stdin::Pipe => {
                let mut fds = [0; 2];
                // SAFETY: pipe2 fills in two new descriptors, which we own from here.
                let (r, w) = unsafe {
                    if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
                };
                (r, Some(w))
            }
        };
        let mut owned = Vec::with_capacity(1 + self.args.len() + self.env.len());
        owned.push(path_cstring(&self.program)?);
        for a in self.args {
            owned.push(cstring(a.into_vec())?);
        }
        let argc = owned.len();
        for (k, v) in self.env {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend(v.into_vec());
            owned.push(cstring(kv)?);
        }
        let ptrs = |s: &[CString]| s.iter().map(|c| c.as_ptr()).chain([std::ptr::null()]).collect::<Vec<_>>();
        let mut prepared = Prepared {
            path: owned[0].clone(),
            cwd: path_cstring(&self.cwd)?,
            argv: ptrs(&owned[..argc]),
            envp: ptrs(&owned[argc..]),
            fds: [stdin.as_raw_fd(), self.stdout.as_raw_fd(), self.stderr.as_raw_fd()],
            // SAFETY: getpid has no preconditions.
            parent: unsafe { libc::getpid() },
            shield: self.shield,
            err: 0,
            _owned: owned,
        };
        let pid = clone_and_exec(&mut prepared)?;
        // The child has exec'd or exited: its copies of the descriptors are its own now.
        drop((stdin, self.stdout, self.stderr));
        let child = AgentChild::adopt(pid)?;
        let writer = match writer {
            Some(w) => Some(Box::new(tokio::net::unix::pipe::Sender::from_owned_fd(w)?) as StdinWriter),
            None => None,
        };
        Ok((child, writer))
    }
}

#[cfg(target_os = "linux")]
/// Clones a child that shares this process's memory and runs [`child_main`] until it execs;
/// the calling thread waits until then. Returns the child's pid, or the errno of the step
/// that failed (the child is reaped then).
fn clone_and_exec(p: &mut Prepared) -> io::Result<libc::pid_t> {
    let mut stack = vec![0u8; STACK];
    // SAFETY: the top of our own allocation, aligned down to 16 bytes as the ABI wants.
    let top = unsafe { stack.as_mut_ptr().add(STACK) };
    let top = (top as usize & !15) as *mut libc::c_void;
    // No handler of the runner's may run in the child while it shares the runner's memory:
    // every signal is blocked across the clone (the child unblocks them before execve).
    // SAFETY: sigset_t is plain data; the calls only read and write the sets we pass.
    let (pid, clone_err) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (p as *mut Prepared).cast(),
        );
        let clone_err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        (pid, clone_err)
    };
    drop(stack);
    if pid < 0 {
        return Err(clone_err);
    }
    // SAFETY: the child wrote `err` (if at all) before it exited, and CLONE_VFORK kept us
    // waiting until then; the volatile read keeps the compiler from assuming it unchanged.
    let err = unsafe { std::ptr::read_volatile(&p.err) };
    if err != 0 {
        let mut status = 0;
        // SAFETY: reaping our own child, which has exited.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(io::Error::from_raw_os_error(err));
    }
    Ok(pid)
}

#[cfg(target_os = "linux")]
/// The child, between `clone` and `execve`. It shares the runner's memory, so it only makes
/// system calls on what [`Prepared`] holds, and leaves by `execve` or `_exit`.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `Prepared`, alive and untouched while the parent waits
    // (CLONE_VFORK). Every call below is async-signal-safe.
    unsafe {
        let p = arg.cast::<Prepared>();
        // Default dispositions: a runner's handler must never run here, and an ignored
        // SIGPIPE (Rust's default) must not reach the agent. Other ignored signals stay so.
        for sig in 1..65 {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 || old.sa_sigaction == libc::SIG_DFL {
                continue;
            }
            if old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        if (*p).shield {
            for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                let mut ign: libc::sigaction = std::mem::zeroed();
                ign.sa_sigaction = libc::SIG_IGN;
                libc::sigaction(sig, &ign, std::ptr::null_mut());
            }
        }
        // The agent dies with the thread that started it. If the runner died before this
        // line, nobody would kill the agent: stop here instead.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            fail(p);
        }
        if libc::getppid() != (*p).parent {
            *libc::__errno_location() = libc::ESRCH;
            fail(p);
        }
        if libc::setpgid(0, 0) != 0 {
            fail(p);
        }
        // Each source above 2 first (close-on-exec), so one dup2 cannot overwrite the source
        // of another; dup2 clears close-on-exec on 0, 1 and 2.
        let mut high = [0; 3];
        for (i, fd) in (*p).fds.iter().enumerate() {
            high[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 3);
            if high[i] < 0 {
                fail(p);
            }
        }
        for (target, fd) in high.iter().enumerate() {
            if libc::dup2(*fd, target as libc::c_int) < 0 {
                fail(p);
            }
        }
        // Nothing else reaches the agent, even a descriptor someone opened without
        // close-on-exec (a jobserver's pipe, a library's file). Linux 5.9; on an older kernel
        // close-on-exec alone holds for ours.
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
        if libc::chdir((*p).cwd.as_ptr()) != 0 {
            fail(p);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::execve((*p).path.as_ptr(), (*p).argv.as_ptr(), (*p).envp.as_ptr());
        fail(p)
    }
}

#[cfg(target_os = "linux")]
/// Leaves the child with its errno where the parent reads it.
///
/// # Safety
/// Only from [`child_main`], with its `Prepared`.
unsafe fn fail(p: *mut Prepared) -> ! {
    std::ptr::write_volatile(std::ptr::addr_of_mut!((*p).err), *libc::__errno_location());
    libc::_exit(127)
}

#[cfg(target_os = "linux")]
/// A started agent: waited on through its pidfd. Dropping it before it was reaped kills the
/// process (not its group) and reaps it in the background.
#[derive(Debug)]
pub struct AgentChild {
    pid: libc::pid_t,
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

#[cfg(target_os = "linux")]
impl AgentChild {
    fn adopt(pid: libc::pid_t) -> io::Result<Self> {
        // SAFETY: pidfd_open on our own unreaped child (a zombie at worst) returns a new fd.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            // SAFETY: our own child; it must not outlive a handle we could not make.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            return Err(e);
        }
        // SAFETY: a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        // SAFETY: the AsyncFd owns the descriptor, which nothing replaces or closes meanwhile.
        let pidfd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)? };
        Ok(Self { pid, pidfd: Some(pidfd), status: None })
    }

    /// The agent's pid, until it has been reaped (then its pid and group may be reused).
    pub fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid as u32)
    }

    /// Its exit status, if it has exited (without waiting).
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            let Some(fd) = &self.pidfd else { return Ok(None) };
            self.status = reap(fd.get_ref().as_raw_fd(), libc::WNOHANG)?;
        }
        Ok(self.status)
    }

    /// Waits for it to exit. Cancel-safe.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(s) = self.try_wait()? {
                return Ok(s);
            }
            let Some(fd) = &self.pidfd else { return Err(io::ErrorKind::NotFound.into()) };
            fd.readable().await?.clear_ready();
        }
    }
}

#[cfg(target_os = "linux")]
impl Drop for AgentChild {
    fn drop(&mut self) {
        if matches!(self.try_wait(), Ok(Some(_))) {
            return;
        }
        let Some(fd) = self.pidfd.take() else { return };
        // SAFETY: pidfd_send_signal to the process the fd names, which is not reaped yet.
        unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd.get_ref().as_raw_fd(), libc::SIGKILL, 0, 0) };
        // The kill takes effect at once, but the exit is asynchronous: reap off this thread.
        let fd = fd.into_inner();
        std::thread::spawn(move || reap(fd.as_raw_fd(), 0));
    }
}

#[cfg(target_os = "linux")]
/// `waitid(P_PIDFD)` with `flags` (WNOHANG or 0): the status, once the process has exited.
fn reap(pidfd: RawFd, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
    loop {
        // SAFETY: siginfo_t is plain data that waitid fills in.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::waitid(libc::P_PIDFD, pidfd as libc::id_t, &mut info, libc::WEXITED | flags) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // SAFETY: waitid filled in a SIGCHLD siginfo (or left it zeroed with WNOHANG).
        let (pid, status, code) = unsafe { (info.si_pid(), info.si_status(), info.si_code) };
        if pid == 0 {
            return Ok(None);
        }
        let raw = match code {
            libc::CLD_EXITED => (status & 0xff) << 8,
            libc::CLD_DUMPED => status | 0x80,
            _ => status,
        };
        return Ok(Some(ExitStatus::from_raw(raw)));
    }
}

/// Elsewhere: std's spawn, with the agent in its own process group. (No PDEATHSIG there:
/// a killed runner's agent lives on until its lease's next holder's hand-off stops it.)
#[cfg(not(target_os = "linux"))]
impl Spawn {
    pub fn start(self) -> io::Result<(AgentChild, Option<StdinWriter>)> {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .env_clear()
            .envs(&self.env)
            .current_dir(&self.cwd)
            .stdout(self.stdout)
            .stderr(self.stderr)
            .kill_on_drop(true)
            .process_group(0);
        match self.stdin {
            Stdin::Null => cmd.stdin(std::process::Stdio::null()),
            Stdin::File(f) => cmd.stdin(f),
            Stdin::Pipe => cmd.stdin(std::process::Stdio::piped()),
        };
        let mut child = cmd.spawn()?;
        let writer = child.stdin.take().map(|w| Box::new(w) as StdinWriter);
        Ok((child, writer))
    }
}

/// Elsewhere, tokio's child is the handle.
#[cfg(not(target_os = "linux"))]
pub type AgentChild = tokio::process::Child;

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::{Read, Seek};

    #[allow(clippy::unwrap_used)] // a test's helper: a panic is the failure report
    fn spawn(argv: &[&str], stdin: Stdin) -> (io::Result<(AgentChild, Option<StdinWriter>)>, std::fs::File) {
        let out = tempfile::tempfile().unwrap();
        let s = Spawn {
            program: PathBuf::from(argv[0]),
            args: argv[1..].iter().map(OsString::from).collect(),
            env: [("PATH".into(), "/usr/bin:/bin".into()), ("MARK".into(), "m1".into())].into_iter().collect(),
            cwd: std::env::temp_dir(),
            stdin,
            stdout: out.try_clone().unwrap(),
            stderr: out.try_clone().unwrap(),
            shield: false,
        };
        (s.start(), out)
    }

    #[allow(clippy::unwrap_used)]
    fn output(mut f: std::fs::File) -> String {
        let mut s = String::new();
        f.rewind().unwrap();
        f.read_to_string(&mut s).unwrap();
        s
    }

    /// The agent gets exactly the environment, directory, stdin and output it was given, an
    /// empty signal mask, SIGPIPE at its default, its own process group and no descriptor
    /// beyond 0, 1 and 2; its exit code comes back.
    #[tokio::test]
    async fn the_agent_starts_clean() {
        let script = "env; pwd; cat; grep -E '^(SigBlk|SigIgn)' /proc/self/status; \
                      ls /proc/self/fd; cut -d' ' -f5 /proc/$$/stat; echo pid $$; exit 3";
        let (started, out) = spawn(&["/bin/sh", "-c", script], Stdin::Pipe);
        let (mut child, writer) = started.unwrap();
        let pid = child.id().unwrap();
        let mut writer = writer.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut writer, b"from stdin\n").await.unwrap();
        drop(writer);
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(3));
        assert_eq!(child.id(), None, "no pid once reaped");
        let text = output(out);
        assert!(text.contains("MARK=m1") && text.contains("from stdin"), "{text}");
        assert!(!text.contains("HOME="), "nothing inherited: {text}");
        assert!(text.contains(&format!("{}\n", std::env::temp_dir().display())), "{text}");
        assert!(text.contains("SigBlk:\t0000000000000000"), "{text}");
        let ign = text.lines().find(|l| l.starts_with("SigIgn:")).unwrap();
        let ign = u64::from_str_radix(ign.trim_start_matches("SigIgn:").trim(), 16).unwrap();
        assert_eq!(ign & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE at its default: {text}");
        assert!(text.contains(&format!("{pid}\npid {pid}")), "its own process group: {text}");
        // ls itself opens one descriptor (3, its directory listing); nothing else leaks.
        let fds: Vec<&str> = text.lines().filter(|l| l.parse::<u32>().is_ok() && l.len() < 3).collect();
        assert!(fds.iter().all(|f| ["0", "1", "2", "3"].contains(f)), "{fds:?} in {text}");
    }

    /// A program that is not there, a directory that is not there and a nul byte are errors
    /// from `start`, with the errno of the step that failed.
    #[tokio::test]
    async fn a_failed_start_says_why() {
        let (r, _) = spawn(&["/nonexistent/agent"], Stdin::Null);
        assert_eq!(r.err().unwrap().raw_os_error(), Some(libc::ENOENT));
        let (r, _) = spawn(&["/bin/sh", "-c", "a\0b"], Stdin::Null);
        assert_eq!(r.err().unwrap().kind(), io::ErrorKind::InvalidInput);
        let s = Spawn {
            program: "/bin/true".into(),
            args: vec![],
            env: BTreeMap::new(),
            cwd: "/nonexistent/dir".into(),
            stdin: Stdin::Null,
            stdout: tempfile::tempfile().unwrap(),
            stderr: tempfile::tempfile().unwrap(),
            shield: false,
        };
        assert_eq!(s.start().err().unwrap().raw_os_error(), Some(libc::ENOENT));
    }

    /// A signal's death is reported as such, and `try_wait` sees it without blocking.
    #[tokio::test]
    async fn a_killed_agent_says_by_what() {
        let (r, _) = spawn(&["/bin/sleep", "30"], Stdin::Null);
        let (mut child, _) = r.unwrap();
        assert_eq!(child.try_wait().unwrap(), None);
        // SAFETY: kill(2) to our own child.
        unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
        assert_eq!(child.wait().await.unwrap().signal(), Some(libc::SIGTERM));
    }

    /// The agent dies with the thread that started it (PR_SET_PDEATHSIG): started from a
    /// thread that then ends, it is killed by SIGKILL.
    #[test]
    fn the_agent_dies_with_its_starter() {
        let (pid, pidfd) = std::thread::spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let (r, _) = spawn(&["/bin/sleep", "30"], Stdin::Null);
                let (mut child, _) = r.unwrap();
                let pid = child.id().unwrap() as i32;
                // The test thread reaps it: without its pidfd, the handle lets it be.
                (pid, child.pidfd.take().unwrap().into_inner())
            })
        })
        .join()
        .unwrap();
        let status = reap(pidfd.as_raw_fd(), 0).unwrap().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "agent {pid} ended with {status:?}");
    }
}
