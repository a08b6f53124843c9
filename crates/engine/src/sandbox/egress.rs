//! The one way out of a confined agent's network namespace: an HTTP proxy on a unix socket
//! that only this job's sandbox can see, which connects to the hosts of the job's
//! [`Allowlist`] and refuses every other one (the database, the trackers, the git remote,
//! the user's other loopback services, cloud metadata), saying so to the agent in a 403 and
//! to the runner in [`Egress::refused`].
//!
//! It speaks what the agents' HTTP clients send to a proxy: `CONNECT host:port` (every
//! https request, and undici's plain http too), and an absolute-form request
//! (`POST http://host:port/path`, reqwest's and httpx's plain http). A connection is bound
//! to the target its first request named: the proxy rewrites that request to origin form
//! with `Connection: close` and then only copies bytes, so whatever follows on the same
//! connection can only reach the host that was allowed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::hosts::Allowlist;

/// What the sandbox's init sends to hold its lifeline to the runner ([`super::init`]).
pub const LIFELINE: &[u8] = b"DEVPILOT-LIFELINE\r\n\r\n";

/// The longest request head the proxy reads before giving up on a connection.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client has to send its first request head, and the proxy to connect.
const HEAD_BOUND: Duration = Duration::from_secs(30);
const CONNECT_BOUND: Duration = Duration::from_secs(15);

/// A running egress proxy for one job; it stops (and its socket goes) when dropped.
pub struct Egress {
    socket: PathBuf,
    stop: CancellationToken,
    refused: Arc<Mutex<BTreeMap<String, u32>>>,
}

impl Egress {
    /// Serves the proxy on a new unix socket at `socket` (replacing a stale one), readable
    /// and writable by this user only.
    pub fn serve(socket: &Path, allow: Allowlist) -> std::io::Result<Egress> {
        use std::os::unix::fs::PermissionsExt;
        match std::fs::remove_file(socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(socket)?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
        let stop = CancellationToken::new();
        let refused = Arc::new(Mutex::new(BTreeMap::new()));
        let allow = Arc::new(allow);
        let (until, seen) = (stop.clone(), refused.clone());
        tokio::spawn(async move {
            loop {
                let conn = tokio::select! {
                    _ = until.cancelled() => break,
                    c = listener.accept() => c,
                };
                let Ok((stream, _)) = conn else { continue };
                let (allow, seen, until) = (allow.clone(), seen.clone(), until.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        _ = until.cancelled() => {}
                        r = serve_one(stream, &allow, &seen) => {
                            if let Err(e) = r {
                                tracing::debug!(error = %e, "an agent's proxied connection ended");
                            }
                        }
                    }
                });
            }
        });
        Ok(Egress { socket: socket.to_path_buf(), stop, refused })
    }

    /// The hosts refused so far (`host:port`), each with how many times.
    pub fn refused(&self) -> Vec<(String, u32)> {
        self.refused.lock().map(|m| m.iter().map(|(k, v)| (k.clone(), *v)).collect()).unwrap_or_default()
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Where one proxied connection goes, and what to send there first.
struct Target {
    host: String,
    port: u16,
    /// The rewritten request for an absolute-form request; None for a CONNECT tunnel.
    first: Option<Vec<u8>>,
}

async fn serve_one(
    mut client: UnixStream,
    allow: &Allowlist,
    refused: &Mutex<BTreeMap<String, u32>>,
) -> std::io::Result<()> {
    let (head, rest) = match tokio::time::timeout(HEAD_BOUND, read_head(&mut client)).await {
        Ok(r) => r?,
        Err(_) => return Ok(()),
    };
    if head.starts_with(LIFELINE) {
        // The sandbox's init holds this open while its agent runs: when the runner dies, the
        // kernel closes it, and the init ends the agent. It waits for the client's end.
        let mut byte = [0u8; 1];
        while client.read(&mut byte).await? > 0 {}
        return Ok(());
    }
    let target = match parse_target(&head) {
        Ok(t) => t,
        Err(why) => return answer(&mut client, "400 Bad Request", why).await,
    };
    let named = if target.host.contains(':') {
        format!("[{}]:{}", target.host, target.port)
    } else {
        format!("{}:{}", target.host, target.port)
    };
    if !allow.allows(&target.host, target.port) {
        if let Ok(mut m) = refused.lock() {
            *m.entry(named.clone()).or_insert(0) += 1;
        }
        tracing::info!(host = %named, "the sandbox refused an agent's connection");
        let why =
            format!("DevPilot's sandbox does not let this agent reach {named}; add it to allow_hosts to allow it");
        return answer(&mut client, "403 Forbidden", &why).await;
    }
    let upstream = tokio::time::timeout(CONNECT_BOUND, TcpStream::connect((target.host.as_str(), target.port))).await;
    let mut upstream = match upstream {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return answer(&mut client, "502 Bad Gateway", &format!("cannot reach {named}: {e}")).await,
        Err(_) => return answer(&mut client, "504 Gateway Timeout", &format!("{named} did not answer")).await,
    };
    match target.first {
        None => client.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n").await?,
        Some(first) => upstream.write_all(&first).await?,
    }
    upstream.write_all(&rest).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// Reads up to the end of the first request head: (the head, what came after it).
async fn read_head(client: &mut UnixStream) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "request head too long"));
        }
    }
}

/// The target of a request head: a CONNECT's authority, or an absolute-form http URL (whose
/// request is rewritten to origin form, hop-by-hop headers dropped, `Connection: close`).
fn parse_target(head: &[u8]) -> Result<Target, &'static str> {
    let mut headers = [httparse::EMPTY_HEADER; 96];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err("not an HTTP request"),
    }
    let (method, path) = (req.method.ok_or("no method")?, req.path.ok_or("no target")?);
    if method.eq_ignore_ascii_case("CONNECT") {
        let hp = super::hosts::HostPort::parse(path).map_err(|_| "CONNECT needs host:port")?;
        if !path.contains(':') || hp.host().starts_with("*.") {
            return Err("CONNECT needs host:port");
        }
        return Ok(Target { host: hp.host().to_string(), port: hp.port(), first: None });
    }
    let url = url::Url::parse(path).map_err(|_| "a proxy request needs an absolute http:// URL")?;
    if url.scheme() != "http" {
        return Err("only http:// is proxied as a request; https goes through CONNECT");
    }
    let host = match url.host().ok_or("the URL names no host")? {
        url::Host::Domain(d) => d.to_ascii_lowercase(),
        url::Host::Ipv4(a) => a.to_string(),
        url::Host::Ipv6(a) => a.to_string(),
    };
    let port = url.port_or_known_default().ok_or("the URL names no port")?;
    let mut first = format!("{method} {}", &url[url::Position::BeforePath..url::Position::AfterQuery]).into_bytes();
    first.extend_from_slice(b" HTTP/1.1\r\n");
    for h in req.headers.iter() {
        let hop = ["connection", "proxy-connection", "proxy-authorization", "keep-alive"];
        if hop.iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
            continue;
        }
        first.extend_from_slice(h.name.as_bytes());
        first.extend_from_slice(b": ");
        first.extend_from_slice(h.value);
        first.extend_from_slice(b"\r\n");
    }
    first.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Target { host, port, first: Some(first) })
}

/// Answers the client with a status and a one-line plain-text reason, and closes.
async fn answer(client: &mut UnixStream, status: &str, why: &str) -> std::io::Result<()> {
    let body = format!("{why}\n");
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(reply.as_bytes()).await?;
    client.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CONNECT names its target; a wildcard or a missing port is not one.
    #[test]
    fn connect_targets() {
        let t = parse_target(b"CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n\r\n").unwrap();
        assert_eq!((t.host.as_str(), t.port, t.first.is_none()), ("api.openai.com", 443, true));
        assert!(parse_target(b"CONNECT api.openai.com HTTP/1.1\r\n\r\n").is_err());
        assert!(parse_target(b"CONNECT *.x.com:443 HTTP/1.1\r\n\r\n").is_err());
    }

    /// An absolute-form request goes out in origin form, with its connection closed after
    /// one answer and no proxy credentials.
    #[test]
    fn absolute_requests_are_rewritten() {
        let head = b"POST http://127.0.0.1:8080/v1/messages?beta=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
                     Proxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n";
        let t = parse_target(head).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 8080));
        let first = String::from_utf8(t.first.unwrap()).unwrap();
        assert!(first.starts_with("POST /v1/messages?beta=1 HTTP/1.1\r\n"), "{first}");
        assert!(first.contains("Content-Length: 2\r\n") && first.ends_with("Connection: close\r\n\r\n"), "{first}");
        assert!(!first.to_ascii_lowercase().contains("proxy-authorization") && !first.contains("keep-alive"));
        assert!(parse_target(b"GET /relative HTTP/1.1\r\n\r\n").is_err());
        assert!(parse_target(b"GET ftp://x/ HTTP/1.1\r\n\r\n").is_err());
    }

    /// Through a real socket: an allowed host is reached, another is refused with a 403 and
    /// counted.
    #[tokio::test]
    async fn allowed_hosts_only() {
        let dir = tempfile::tempdir().unwrap();
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = server.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = server.accept().await.unwrap();
            s.write_all(b"hello").await.unwrap();
        });
        let allowed = super::super::hosts::HostPort::parse(&format!("127.0.0.1:{port}")).unwrap();
        let egress = Egress::serve(&dir.path().join("egress.sock"), Allowlist::new(vec![allowed])).unwrap();
        let mut c = UnixStream::connect(egress.socket()).await.unwrap();
        c.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
        let mut got = String::new();
        c.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "HTTP/1.1 200 Connection Established\r\n\r\nhello");
        let mut c = UnixStream::connect(egress.socket()).await.unwrap();
        c.write_all(b"CONNECT 127.0.0.1:5432 HTTP/1.1\r\n\r\n").await.unwrap();
        let mut got = String::new();
        c.read_to_string(&mut got).await.unwrap();
        assert!(got.starts_with("HTTP/1.1 403 Forbidden") && got.contains("127.0.0.1:5432"), "{got}");
        assert_eq!(egress.refused(), vec![("127.0.0.1:5432".to_string(), 1)]);
    }
}
