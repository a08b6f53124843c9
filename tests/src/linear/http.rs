//! A minimal HTTP/1.1 server on the standard library, one thread per connection, so it never
//! touches the tests' tokio runtime and can do what a real outage does: hold a request and
//! close the connection without an answer. Every answer carries `Connection: close`. Request
//! bodies come with `Content-Length` or chunked; at most 16 MiB.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::handler::handle;
use super::shared::Shared;
use super::wire::{WireAnswer, WireRequest};

/// The largest request body accepted.
const MAX_BODY: usize = 16 << 20;

/// The listening server; dropping it stops it.
pub(crate) struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Listens on `127.0.0.1:port` (0: any free port) and serves in a background thread.
    pub(crate) fn start(shared: Arc<Shared>, port: u16) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", port))?;
        let addr = listener.local_addr()?;
        let serving = shared.clone();
        let thread = std::thread::Builder::new()
            .name("linear-standin".into())
            .spawn(move || accept_loop(&listener, &serving))?;
        Ok(Self { addr, shared, thread: Some(thread) })
    }

    /// Where it listens.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept so the loop sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Accepts connections until stopped, each on its own thread.
fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let shared = shared.clone();
        let _ = std::thread::Builder::new().name("linear-standin-conn".into()).spawn(move || serve(stream, &shared));
    }
}

/// Serves one request on one connection.
fn serve(mut stream: TcpStream, shared: &Shared) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let request = match read_request(&stream) {
        Ok(request) => request,
        Err(e) => {
            let body = serde_json::json!({ "errors": [{ "message": format!("bad HTTP request: {e}") }] });
            let _ = write_answer(&mut stream, &WireAnswer::json(400, &body));
            return;
        }
    };
    let answer = handle(shared, &request);
    match answer.hold {
        Some(hold) => {
            let until = Instant::now() + hold;
            while Instant::now() < until && !shared.stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20).min(until.saturating_duration_since(Instant::now())));
            }
            let _ = stream.shutdown(Shutdown::Both);
        }
        None => {
            let _ = write_answer(&mut stream, &answer);
            let _ = stream.shutdown(Shutdown::Write);
        }
    }
}

/// Reads the request line, the headers and the body.
fn read_request(stream: &TcpStream) -> io::Result<WireRequest> {
    let mut reader = BufReader::new(stream);
    let line = read_line(&mut reader)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or_default().to_string(), parts.next().unwrap_or("/").to_string());
    let mut headers = Vec::new();
    loop {
        let line = read_line(&mut reader)?;
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').ok_or_else(|| invalid("header without a colon"))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        if headers.len() > 100 {
            return Err(invalid("too many headers"));
        }
    }
    let (path, query) = target.split_once('?').map_or((target.clone(), String::new()), |(p, q)| (p.into(), q.into()));
    let mut request = WireRequest { method, path, query, headers, body: Vec::new() };
    request.body = if request.header("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        read_chunked(&mut reader)?
    } else {
        let length: usize =
            request.header("content-length").unwrap_or("0").parse().map_err(|_| invalid("bad Content-Length"))?;
        if length > MAX_BODY {
            return Err(invalid("body too large"));
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        body
    };
    Ok(request)
}

/// A chunked body.
fn read_chunked(reader: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let size = read_line(reader)?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| invalid("bad chunk size"))?;
        if size == 0 {
            while !read_line(reader)?.is_empty() {}
            return Ok(body);
        }
        if body.len() + size > MAX_BODY {
            return Err(invalid("body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        read_line(reader)?;
    }
}

/// One CRLF-terminated line, without the terminator.
fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.by_ref().take(16 * 1024).read_line(&mut line)? == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed mid-request"));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// An `InvalidData` error.
fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

/// Writes a complete answer.
fn write_answer(stream: &mut TcpStream, answer: &WireAnswer) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {} {}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n", answer.status, reason(answer.status), answer.body.len());
    for (name, value) in &answer.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(&answer.body)?;
    stream.flush()
}

/// The reason phrase of a status.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}
