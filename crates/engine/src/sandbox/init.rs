//! The first process inside a sandbox, before the agent: DevPilot's own binary, entered as
//! `<exe> __sandbox-init …` (both the `devpilot` CLI and the tray app hand that argument
//! here before anything else starts).
//!
//! bubblewrap forwards no signal, so this process stands between the runner and the agent:
//! - It starts the agent in a session of its own (no controlling terminal, so no `TIOCSTI`
//!   into the user's), and passes on the SIGTERM, SIGINT and SIGHUP the runner sends to the
//!   sandbox's process group, to the agent's whole group. (The runner's SIGKILL ends this
//!   process and bubblewrap's init with it, and the kernel then kills the namespace.)
//! - It bridges the agent's loopback, which is the namespace's own, to the egress proxy's
//!   unix socket: a proxy port for `HTTP(S)_PROXY`, and one port per allowed loopback host
//!   (a model server on `127.0.0.1:8080` answers on the same address inside), tunnelled by
//!   CONNECT so the proxy checks each one.
//! - It ends as the agent ended: the same exit code, or the same signal.

use std::ffi::OsString;
use std::path::PathBuf;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::signal::unix::{signal, SignalKind};

/// The argument that sends a process here.
pub const ARG: &str = "__sandbox-init";

/// What the runner tells the init, on its command line.
#[derive(Debug, PartialEq)]
struct Init {
    egress: Option<PathBuf>,
    proxy_port: u16,
    forwards: Vec<u16>,
    program: OsString,
    args: Vec<OsString>,
}

impl Init {
    /// `--egress SOCK --proxy-port N [--forward PORT]… -- PROGRAM ARGS…` (after [`ARG`]).
    fn parse(args: &[OsString]) -> Result<Init, String> {
        let mut it = args.iter();
        let mut init = Init { egress: None, proxy_port: 0, forwards: vec![], program: OsString::new(), args: vec![] };
        let number = |v: Option<&OsString>, what: &str| -> Result<u16, String> {
            v.and_then(|v| v.to_str()).and_then(|v| v.parse().ok()).ok_or_else(|| format!("{what} needs a port"))
        };
        while let Some(a) = it.next() {
            match a.to_str() {
                Some("--egress") => init.egress = Some(it.next().ok_or("--egress needs a path")?.into()),
                Some("--proxy-port") => init.proxy_port = number(it.next(), "--proxy-port")?,
                Some("--forward") => init.forwards.push(number(it.next(), "--forward")?),
                Some("--") => {
                    init.program = it.next().ok_or("no program after --")?.clone();
                    init.args = it.cloned().collect();
                    return Ok(init);
                }
                _ => return Err(format!("unknown argument {a:?}")),
            }
        }
        Err("no program to run (expected -- PROGRAM ARGS…)".into())
    }
}

/// Becomes the init when this process was started as one (`<exe> __sandbox-init …`): the
/// first line of every binary's `main`, before any thread or setting.
pub fn enter_if_asked() {
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == ARG) {
        let rest: Vec<OsString> = args.collect();
        main(&rest);
    }
}

/// Runs the init with the arguments after [`ARG`]; never returns (it exits as the agent
/// did).
pub fn main(args: &[OsString]) -> ! {
    let init = match Init::parse(args) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("devpilot sandbox: {e}");
            std::process::exit(126);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let status = match runtime {
        Ok(rt) => rt.block_on(supervise(init)),
        Err(e) => Err(e),
    };
    match status {
        Ok(s) => end_as(s),
        Err(e) => {
            eprintln!("devpilot sandbox: cannot start the agent: {e}");
            // 127 when the program is missing, as a shell says it.
            std::process::exit(if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 });
        }
    }
}

/// Starts the bridges and the agent, passes signals on, and waits for the agent.
async fn supervise(init: Init) -> std::io::Result<std::process::ExitStatus> {
    // The agent may not read or trace the process that stands between it and its runner.
    // SAFETY: prctl(PR_SET_DUMPABLE) changes only this process's own flag.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    // The lifeline: a connection to the runner's egress proxy that only the runner's end (or
    // its death) closes. bubblewrap's own --die-with-parent leaves a window at its start.
    let mut lifeline = match &init.egress {
        Some(sock) => {
            let mut s = UnixStream::connect(sock).await?;
            s.write_all(super::egress::LIFELINE).await?;
            Some(s)
        }
        None => None,
    };
    if let Some(sock) = &init.egress {
        let proxy = TcpListener::bind(("127.0.0.1", init.proxy_port)).await?;
        tokio::spawn(bridge(proxy, sock.clone(), None));
        for port in &init.forwards {
            let l = TcpListener::bind(("127.0.0.1", *port)).await?;
            tokio::spawn(bridge(l, sock.clone(), Some(format!("127.0.0.1:{port}"))));
        }
    }
    let (mut term, mut int, mut hup) =
        (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?, signal(SignalKind::hangup())?);
    let mut cmd = tokio::process::Command::new(&init.program);
    cmd.args(&init.args);
    // SAFETY: setsid(2) is async-signal-safe and touches no memory of this process.
    unsafe {
        cmd.pre_exec(|| if libc::setsid() < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) });
    }
    let mut child = cmd.spawn()?;
    let group = child.id().map(|p| p as libc::pid_t);
    // The runner sends SIGTERM again until the sandbox ends (one sent while the sandbox was
    // being made is lost): the agent gets each signal once.
    let mut passed: Vec<libc::c_int> = vec![];
    loop {
        let sig = tokio::select! {
            status = child.wait() => return status,
            _ = term.recv() => libc::SIGTERM,
            _ = int.recv() => libc::SIGINT,
            _ = hup.recv() => libc::SIGHUP,
            _ = runner_gone(&mut lifeline) => {
                lifeline = None;
                libc::SIGKILL
            }
        };
        if passed.contains(&sig) && sig != libc::SIGKILL {
            continue;
        }
        passed.push(sig);
        if let Some(g) = group {
            // SAFETY: kill(2) of the agent's own process group, which this process leads
            // into being (setsid made the agent's pid its group id).
            unsafe { libc::kill(-g, sig) };
        }
    }
}

/// Resolves when the runner is gone: its end of the lifeline closed (never without one).
async fn runner_gone(lifeline: &mut Option<UnixStream>) {
    let Some(s) = lifeline else { return std::future::pending().await };
    let mut byte = [0u8; 1];
    while matches!(s.read(&mut byte).await, Ok(n) if n > 0) {}
}

/// Accepts on `listener` and joins each connection to the egress socket; with `tunnel`,
/// through a CONNECT to that host first.
async fn bridge(listener: TcpListener, sock: PathBuf, tunnel: Option<String>) {
    while let Ok((tcp, _)) = listener.accept().await {
        let (sock, tunnel) = (sock.clone(), tunnel.clone());
        tokio::spawn(async move {
            let _ = join(tcp, &sock, tunnel.as_deref()).await;
        });
    }
}

async fn join(mut tcp: TcpStream, sock: &std::path::Path, tunnel: Option<&str>) -> std::io::Result<()> {
    let mut up = UnixStream::connect(sock).await?;
    if let Some(target) = tunnel {
        up.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).await?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        // Byte by byte up to the end of the proxy's answer, so nothing after it is eaten.
        while !head.ends_with(b"\r\n\r\n") {
            if up.read(&mut byte).await? == 0 || head.len() > 8192 {
                return Ok(());
            }
            head.push(byte[0]);
        }
        if !head.starts_with(b"HTTP/1.1 200") && !head.starts_with(b"HTTP/1.0 200") {
            // Refused or unreachable outside: reset, as a refused connection would be seen.
            // (A zero linger never blocks the drop: the socket is reset at once.)
            #[allow(deprecated)]
            let _ = tcp.set_linger(Some(std::time::Duration::ZERO));
            return Ok(());
        }
    }
    tokio::io::copy_bidirectional(&mut tcp, &mut up).await?;
    Ok(())
}

/// Exits with the agent's code, or dies of the signal that killed it.
fn end_as(status: std::process::ExitStatus) -> ! {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        // SAFETY: resetting one signal to its default and raising it in this process.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
    std::process::exit(status.code().unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    /// The runner's arguments parse, and the agent's own arguments are never read as ours.
    #[test]
    fn arguments() {
        let i = Init::parse(&os(&[
            "--egress",
            "/s",
            "--proxy-port",
            "3128",
            "--forward",
            "8080",
            "--",
            "claude",
            "--",
            "-p",
        ]))
        .unwrap();
        assert_eq!(i.egress.as_deref(), Some(std::path::Path::new("/s")));
        assert_eq!((i.proxy_port, i.forwards.clone()), (3128, vec![8080]));
        assert_eq!((i.program.clone(), i.args.clone()), (OsString::from("claude"), os(&["--", "-p"])));
        assert!(Init::parse(&os(&["--forward", "x", "--", "a"])).is_err());
        assert!(Init::parse(&os(&["--egress", "/s"])).is_err());
        assert!(Init::parse(&os(&["--bogus", "--", "a"])).is_err());
    }
}
