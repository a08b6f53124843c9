//! A slow link for the harness: loopback TCP proxies that share one shaped connection, as a
//! laptop on café Wi-Fi shares its uplink between the database and the git remote.
//!
//! A [`Link`] has a rate (bits a second) and a one-way delay. Each direction of the link is a
//! queue of its own: a chunk of bytes leaves the queue when the link has sent the chunks
//! before it (its serialization at the rate), and arrives the delay after. Every proxy of
//! the link ([`Shaper::start`]) and every connection through it shares those two queues, so
//! a push and a database write at the same moment split the bandwidth. Latency is per chunk,
//! not per connection: a round trip costs twice the delay, as on a real path.
//!
//! Bytes are read eagerly from the sender into a bounded buffer (the router's queue, a few
//! hundred kilobytes); a sender that outruns the link waits on its socket once it is full.
//! Everything runs on the caller's tokio runtime, on 127.0.0.1 only.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The largest chunk read at once (a few TCP segments).
const CHUNK: usize = 16 * 1024;
/// Chunks queued per connection and direction before the sender waits: 512 KiB.
const QUEUED: usize = 32;

/// One direction of the link: when it is next free to start sending.
#[derive(Default)]
struct Wire {
    free_at: Mutex<Option<Instant>>,
}

impl Wire {
    /// Takes the wire for `bytes` at `rate`: when they have all left.
    fn send(&self, bytes: usize, rate_bps: u64) -> Instant {
        let mut free = self.free_at.lock().unwrap_or_else(|p| p.into_inner());
        let start = free.map_or_else(Instant::now, |f| f.max(Instant::now()));
        let done = start + Duration::from_secs_f64(bytes as f64 * 8.0 / rate_bps as f64);
        *free = Some(done);
        done
    }
}

/// A shaped link: its rate, its one-way delay, and what is on each direction's wire.
pub struct Link {
    pub rate_bps: u64,
    pub delay: Duration,
    up: Wire,
    down: Wire,
}

impl Link {
    /// A link of `rate_bps` bits a second each way, with `delay` each way.
    pub fn new(rate_bps: u64, delay: Duration) -> Arc<Link> {
        Arc::new(Link { rate_bps, delay, up: Wire::default(), down: Wire::default() })
    }
}

/// A proxy on a free loopback port to `target`, over `link`. Dropped, it accepts no more
/// connections; those open run until their peers close them (it is not a cut: see
/// [`crate::Forwarder`] for that).
pub struct Shaper {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Shaper {
    /// Listens on 127.0.0.1 (a free port) and forwards every connection to `target` over `link`.
    pub async fn start(target: SocketAddr, link: Arc<Link>) -> std::io::Result<Shaper> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let link = link.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else { return };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = tokio::spawn(pump(cr, sw, link.clone(), true));
                    let down = tokio::spawn(pump(sr, cw, link, false));
                    let _ = tokio::join!(up, down);
                });
            }
        });
        Ok(Shaper { port, task })
    }
}

impl Drop for Shaper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One direction of one connection: read, take the wire, deliver after the delay; the end
/// of the stream is passed on after the last chunk.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: Arc<Link>,
    up: bool,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUED);
    let deliver = tokio::spawn(async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let wire = if up { &link.up } else { &link.down };
        let left = wire.send(n, link.rate_bps);
        if tx.send((left + link.delay, buf[..n].to_vec())).await.is_err() {
            break;
        }
    }
    drop(tx);
    let _ = deliver.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A megabyte through a 10 Mbit/s link takes its serialization time plus the delay, and
    /// two transfers at once share the rate rather than each getting it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_link_holds_its_rate_and_delay_across_connections() {
        let sink = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = sink.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = sink.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut total = 0usize;
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        total += n;
                    }
                    let _ = s.write_all(&(total as u64).to_be_bytes()).await;
                });
            }
        });
        let link = Link::new(10_000_000, Duration::from_millis(50));
        let shaper = Shaper::start(target, link).await.unwrap();
        let port = shaper.port;
        let send = |bytes: usize| async move {
            let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            s.write_all(&vec![7u8; bytes]).await.unwrap();
            s.shutdown().await.unwrap();
            let mut n = [0u8; 8];
            s.read_exact(&mut n).await.unwrap();
            u64::from_be_bytes(n)
        };
        let t = std::time::Instant::now();
        assert_eq!(send(1_250_000).await, 1_250_000);
        let one = t.elapsed();
        // 1.25 MB at 10 Mbit/s is 1 s, plus 50 ms each way. The floor is the proof; the
        // ceiling only says the link is not stuck (a busy CI machine may be late).
        assert!(one >= Duration::from_millis(1_100) && one < Duration::from_secs(5), "{one:?}");
        let t = std::time::Instant::now();
        let (a, b) = tokio::join!(send(625_000), send(625_000));
        assert_eq!((a, b), (625_000, 625_000));
        let two = t.elapsed();
        // Each at the full rate would take 0.6 s: the floor says they shared it.
        assert!(two >= Duration::from_millis(1_100) && two < Duration::from_secs(5), "shared: {two:?}");
    }
}
