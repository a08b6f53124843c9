//! A loopback TCP forwarder for fault injection: a runner connects to the forwarder instead of
//! the database, and the test switches the path between them at any time.
//!
//! - [`Forwarder::open`]: bytes flow both ways.
//! - [`Forwarder::silence`]: a silent partition, like a dropped VPN. Every connection stays
//!   open and nothing is closed or reset, but no byte moves in either direction; new
//!   connections are accepted and get nothing either. Every query simply hangs. Bytes sent
//!   meanwhile wait in the sockets' buffers and are delivered on [`open`](Forwarder::open),
//!   as after a real partition heals (connections accepted while silent reach the target only
//!   then). Unlike a real partition, the peers' own kernels still answer TCP keepalives, so a
//!   client can only notice the silence through its own timeouts.
//! - [`Forwarder::refuse`]: existing connections are reset (RST) and new connection attempts
//!   are refused: the port stops listening, as when the server's host is up but the database
//!   is gone. [`open`](Forwarder::open) listens on the same port again.
//!
//! Everything runs on plain threads inside the test process, on 127.0.0.1 only.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a pump or the accept loop looks up from a blocking call to check the mode.
const TICK: Duration = Duration::from_millis(20);
/// How long a mode switch waits for the pumps to obey before declaring the harness broken.
const OBEY_LIMIT: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Open,
    Silent,
    Refusing,
}

struct State {
    mode: Mode,
    /// Bumped by every `refuse()` (and by drop): a connection from an older epoch is reset.
    epoch: u64,
    /// Set by drop: the accept loop ends.
    stopped: bool,
    listener: Option<TcpListener>,
    /// Pumps between "may write" and "wrote": `silence()` waits for them, so once it returns
    /// not one more byte is forwarded.
    writing: usize,
    /// Clones of every live connection's sockets, so `refuse()` can reset them.
    conns: HashMap<u64, Vec<TcpStream>>,
    next_conn: u64,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    target: SocketAddr,
    port: u16,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks while the path is silent. None once the connection must be reset (its epoch
    /// is over or its other direction failed); otherwise the lock, with the path open.
    fn wait_open(&self, epoch: u64, dead: &AtomicBool) -> Option<MutexGuard<'_, State>> {
        let mut st = self.lock();
        while st.mode == Mode::Silent && st.epoch == epoch && !dead.load(Ordering::SeqCst) {
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        (st.epoch == epoch && !dead.load(Ordering::SeqCst)).then_some(st)
    }

    /// Waits up to [`OBEY_LIMIT`] for `done`; panics if the pumps do not obey.
    fn wait_until(&self, what: &str, done: impl Fn(&State) -> bool) {
        let st = self.lock();
        let (st, _) =
            self.changed.wait_timeout_while(st, OBEY_LIMIT, |st| !done(st)).unwrap_or_else(|e| e.into_inner());
        assert!(done(&st), "forwarder: {what} did not happen within {OBEY_LIMIT:?}");
    }

    /// Ends every connection of the current epoch (with RST) and stops listening.
    fn reset_all(&self, st: &mut State) {
        st.mode = Mode::Refusing;
        st.epoch += 1;
        // Dropping the listener is what makes connect() fail with ECONNREFUSED; connections
        // still in its backlog are reset with it.
        st.listener = None;
        for socks in st.conns.values() {
            socks.iter().for_each(set_linger_zero);
        }
        self.changed.notify_all();
    }
}

/// A loopback TCP forwarder from `127.0.0.1:port()` to a target, with switchable faults.
/// See the [module docs](self) for what each mode does to the bytes.
pub struct Forwarder {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Forwarder {
    /// Listens on 127.0.0.1 on a free port and forwards every connection to `target`.
    pub fn start(target: SocketAddr) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").expect("forwarder: bind a free port");
        let port = listener.local_addr().expect("forwarder: local addr").port();
        listener.set_nonblocking(true).expect("forwarder: nonblocking listener");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                mode: Mode::Open,
                epoch: 0,
                stopped: false,
                listener: Some(listener),
                writing: 0,
                conns: HashMap::new(),
                next_conn: 0,
            }),
            changed: Condvar::new(),
            target,
            port,
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name(format!("forwarder-{port}"))
            .spawn(move || accept_loop(&s))
            .expect("forwarder: spawn accept thread");
        Forwarder { shared, accept: Some(accept) }
    }

    /// The port to connect to instead of the target's.
    pub fn port(&self) -> u16 {
        self.shared.port
    }

    /// Forwards bytes both ways again. After [`silence`](Self::silence), held bytes are
    /// delivered and the connections carry on; after [`refuse`](Self::refuse), the port
    /// listens again (the old connections are gone).
    pub fn open(&self) {
        let mut st = self.shared.lock();
        if st.listener.is_none() {
            st.listener = Some(rebind(self.shared.port));
        }
        st.mode = Mode::Open;
        self.shared.changed.notify_all();
    }

    /// A silent partition: from when this returns, no byte is forwarded either way, and
    /// nothing is closed or reset.
    pub fn silence(&self) {
        {
            let mut st = self.shared.lock();
            st.mode = Mode::Silent;
            self.shared.changed.notify_all();
        }
        // A pump that was already writing finishes that write; none starts another.
        self.shared.wait_until("in-flight writes finishing", |st| st.writing == 0);
    }

    /// Resets every connection and stops listening, so connection attempts are refused.
    /// When this returns, every connection has been reset.
    pub fn refuse(&self) {
        self.shared.reset_all(&mut self.shared.lock());
        // A pump notices the new epoch within a tick and drops its sockets: with linger 0,
        // the last close sends RST.
        self.shared.wait_until("resetting every connection", |st| st.conns.is_empty());
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.stopped = true;
            self.shared.reset_all(&mut st);
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

/// Binds the same port again after `refuse()`. Another socket may briefly hold it (an
/// outgoing connection can be given it as its source port), so this retries for a while.
fn rebind(port: u16) -> TcpListener {
    let start = Instant::now();
    loop {
        match TcpListener::bind(("127.0.0.1", port)) {
            Ok(l) => {
                l.set_nonblocking(true).expect("forwarder: nonblocking listener");
                return l;
            }
            Err(e) if start.elapsed() >= OBEY_LIMIT => {
                panic!("forwarder: cannot listen on 127.0.0.1:{port} again: {e}")
            }
            Err(_) => std::thread::sleep(TICK),
        }
    }
}

fn set_linger_zero(s: &TcpStream) {
    let l = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt on an open socket, with a correctly sized `linger`.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::from_ref(&l).cast::<libc::c_void>(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Accepts on the (nonblocking) listener whenever there is one; a refusing forwarder has none.
fn accept_loop(shared: &Arc<Shared>) {
    loop {
        let accepted = {
            let mut st = shared.lock();
            if st.stopped {
                return;
            }
            let got = st.listener.as_ref().and_then(|l| l.accept().ok()).map(|(s, _)| s);
            // Registered under the same lock as the accept, so a refuse() that follows
            // resets this connection before it returns.
            got.and_then(|client| {
                let copy = client.try_clone().ok()?;
                let id = st.next_conn;
                st.next_conn += 1;
                st.conns.insert(id, vec![copy]);
                Some((client, id, st.epoch))
            })
        };
        match accepted {
            Some((client, id, epoch)) => {
                let s = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("forwarder-{}-conn", shared.port))
                    .spawn(move || connection(&s, client, id, epoch));
                if spawned.is_err() {
                    forget(shared, id);
                }
            }
            None => std::thread::sleep(TICK),
        }
    }
}

fn forget(shared: &Shared, id: u64) {
    let mut st = shared.lock();
    st.conns.remove(&id);
    shared.changed.notify_all();
}

/// One client connection: waits for the path to be open, connects to the target, then pumps
/// both directions until both are finished or the connection is reset.
fn connection(shared: &Arc<Shared>, client: TcpStream, id: u64, epoch: u64) {
    let dead = Arc::new(AtomicBool::new(false));
    let _ = client.set_nonblocking(false);
    // Accepted while silent: the target hears of it only once the path opens.
    let upstream = match shared.wait_open(epoch, &dead) {
        Some(st) => {
            drop(st);
            TcpStream::connect_timeout(&shared.target, OBEY_LIMIT).ok()
        }
        None => None,
    };
    let streams =
        upstream.and_then(|up| Some((client.try_clone().ok()?, up.try_clone().ok()?, up.try_clone().ok()?, up)));
    let Some((client_w, upstream_r, upstream_reg, upstream)) = streams else {
        set_linger_zero(&client);
        drop(client);
        return forget(shared, id);
    };
    {
        let mut st = shared.lock();
        if st.epoch != epoch {
            set_linger_zero(&upstream_reg);
        }
        if let Some(v) = st.conns.get_mut(&id) {
            v.push(upstream_reg);
        }
    }
    let (s, d) = (shared.clone(), dead.clone());
    let back = std::thread::Builder::new()
        .name(format!("forwarder-{}-back", shared.port))
        .spawn(move || pump(&s, epoch, &d, upstream_r, client_w));
    if back.is_err() {
        dead.store(true, Ordering::SeqCst);
    }
    pump(shared, epoch, &dead, client, upstream);
    if let Ok(h) = back {
        let _ = h.join();
    }
    forget(shared, id);
}

/// Copies `src` to `dst` while the path is open. Returns when `src` ends (after passing the
/// end on), when either side fails (then the connection is reset both ways), or when the
/// connection's epoch is over (reset).
fn pump(shared: &Shared, epoch: u64, dead: &AtomicBool, mut src: TcpStream, mut dst: TcpStream) {
    let _ = src.set_read_timeout(Some(TICK));
    let mut buf = vec![0u8; 64 * 1024];
    let reset = |src: &TcpStream, dst: &TcpStream| {
        set_linger_zero(src);
        set_linger_zero(dst);
        dead.store(true, Ordering::SeqCst);
        // Under the lock, so a sibling between its check and its wait cannot miss this.
        let _st = shared.lock();
        shared.changed.notify_all();
    };
    loop {
        // While silent, nothing is read either: what the peer sends waits in the socket.
        if shared.wait_open(epoch, dead).is_none() {
            return reset(&src, &dst);
        }
        let n = match src.read(&mut buf) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                continue
            }
            Err(_) => return reset(&src, &dst),
        };
        // Read just before a silence(): hold the bytes until the path opens again.
        let Some(mut st) = shared.wait_open(epoch, dead) else {
            return reset(&src, &dst);
        };
        if n == 0 {
            drop(st);
            let _ = dst.shutdown(Shutdown::Write);
            return;
        }
        st.writing += 1;
        drop(st);
        let wrote = dst.write_all(&buf[..n]);
        {
            let mut st = shared.lock();
            st.writing -= 1;
            shared.changed.notify_all();
        }
        if wrote.is_err() {
            return reset(&src, &dst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free loopback port, for the forwarder to forward to.
    fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind echo");
        let addr = l.local_addr().expect("echo addr");
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut s = s;
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    fn echo(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        s.write_all(msg)?;
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got)?;
        Ok(got)
    }

    fn connect(port: u16) -> std::io::Result<TcpStream> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(s)
    }

    /// Silence makes a read time out without EOF or reset, on old and new connections alike,
    /// and open() delivers what was sent meanwhile.
    #[test]
    fn silence_hangs_reads_and_open_resumes_them() {
        let fwd = Forwarder::start(echo_server());
        let mut old = connect(fwd.port()).expect("connect");
        assert_eq!(echo(&mut old, b"ping").expect("echo while open"), b"ping");

        fwd.silence();
        old.write_all(b"held").expect("a silent path still takes writes");
        let mut new = connect(fwd.port()).expect("a silent forwarder still accepts");
        new.write_all(b"new").expect("write on a new connection");
        // The absence of an answer can only be shown by waiting for one: 300 ms is plenty
        // for a loopback echo.
        for s in [&mut old, &mut new] {
            s.set_read_timeout(Some(Duration::from_millis(300))).expect("read timeout");
            let mut byte = [0u8; 1];
            match s.read(&mut byte) {
                Err(e) => {
                    assert!(matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "not a timeout: {e}")
                }
                Ok(n) => panic!("a silenced connection read {n} bytes (0 = EOF)"),
            }
            s.set_read_timeout(Some(Duration::from_secs(5))).expect("read timeout");
        }

        fwd.open();
        let mut got = [0u8; 4];
        old.read_exact(&mut got).expect("the held bytes arrive on open");
        assert_eq!(&got, b"held");
        let mut got = [0u8; 3];
        new.read_exact(&mut got).expect("the new connection reaches the target on open");
        assert_eq!(&got, b"new");
        assert_eq!(echo(&mut old, b"again").expect("echo after open"), b"again");
    }

    /// Refuse resets existing connections and makes connect fail; open() listens again.
    #[test]
    fn refuse_resets_and_refuses_then_open_accepts() {
        let fwd = Forwarder::start(echo_server());
        let mut old = connect(fwd.port()).expect("connect");
        assert_eq!(echo(&mut old, b"ping").expect("echo while open"), b"ping");

        fwd.refuse();
        let mut byte = [0u8; 1];
        let err = old.read(&mut byte).expect_err("a refused connection is reset, not closed or kept");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
        let err = TcpStream::connect(("127.0.0.1", fwd.port())).expect_err("connect must fail while refusing");
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");

        fwd.open();
        let mut new = connect(fwd.port()).expect("connect after open");
        assert_eq!(echo(&mut new, b"back").expect("echo after open"), b"back");
    }
}
