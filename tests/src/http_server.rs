//! A minimal HTTP/1.1 server on the standard library, one thread per connection, shared by the
//! tracker stand-ins (Linear's, GitHub's). It never touches the tests' tokio runtime and can do
//! what a real outage does: hold a request and close the connection without an answer. Every
//! answer carries `Connection: close`. Request bodies come with `Content-Length` or chunked; at
//! most 16 MiB. What a request means is the stand-in's business: it passes a handler.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The largest request body accepted.
const MAX_BODY: usize = 16 << 20;

/// An HTTP request.
pub(crate) struct WireRequest {
    pub method: String,
    /// The path as sent (still percent-encoded).
    pub path: String,
    /// The raw query string (without `?`).
    pub query: String,
    /// Header names in lowercase.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl WireRequest {
    /// A header's value (the first, if repeated).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// A query-string parameter, percent-decoded.
    pub(crate) fn param(&self, name: &str) -> Option<String> {
        self.params().into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// Every query-string parameter, in order, names and values percent-decoded (`+` is a
    /// space); a parameter without `=` has an empty value.
    pub(crate) fn params(&self) -> Vec<(String, String)> {
        let pairs = self.query.split('&').filter(|p| !p.is_empty());
        pairs
            .map(|p| p.split_once('=').unwrap_or((p, "")))
            .map(|(k, v)| (percent_decode(k), percent_decode(v)))
            .collect()
    }
}

/// `%XX` and `+` decoded (invalid UTF-8 replaced).
pub(crate) fn percent_decode(text: &str) -> String {
    String::from_utf8_lossy(&decode_bytes(text, true)).into_owned()
}

/// `%XX` decoded; `+` is a space only when `plus` (query strings, not paths).
pub(crate) fn decode_bytes(text: &str, plus: bool) -> Vec<u8> {
    let bytes = text.as_bytes();
    let (mut out, mut i) = (Vec::with_capacity(bytes.len()), 0);
    while i < bytes.len() {
        let hex = text.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) if plus => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

/// What to send back.
pub(crate) struct WireAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Hold the connection this long, then close it without answering.
    pub hold: Option<Duration>,
    /// Answer only after this long.
    pub delay: Option<Duration>,
}

impl WireAnswer {
    /// A JSON answer.
    pub(crate) fn json(status: u16, body: &serde_json::Value) -> Self {
        Self { status, headers: Vec::new(), body: body.to_string().into_bytes(), hold: None, delay: None }
    }
}

/// Answers one request.
pub(crate) type Handler = dyn Fn(&WireRequest) -> WireAnswer + Send + Sync;
/// The answer to a request that is not valid HTTP, given why.
pub(crate) type Malformed = fn(&str) -> WireAnswer;

/// The listening server; dropping it stops it (held connections give up).
pub(crate) struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What every connection thread shares.
struct Serving {
    name: String,
    handler: Box<Handler>,
    malformed: Malformed,
    stop: Arc<AtomicBool>,
}

impl Server {
    /// Listens on `127.0.0.1:port` (0: any free port) and serves in a background thread named
    /// `name`, answering each request with `handler`.
    pub(crate) fn start(name: &str, port: u16, handler: Box<Handler>, malformed: Malformed) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", port))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let serving = Arc::new(Serving { name: name.to_string(), handler, malformed, stop: stop.clone() });
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || accept_loop(&listener, &serving))?;
        Ok(Self { addr, stop, thread: Some(thread) })
    }

    /// Where it listens.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept so the loop sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Accepts connections until stopped, each on its own thread.
fn accept_loop(listener: &TcpListener, serving: &Arc<Serving>) {
    for stream in listener.incoming() {
        if serving.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let serving = serving.clone();
        let name = format!("{}-conn", serving.name);
        let _ = std::thread::Builder::new().name(name).spawn(move || serve(stream, &serving));
    }
}

/// Serves one request on one connection.
fn serve(mut stream: TcpStream, serving: &Serving) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let request = match read_request(&stream) {
        Ok(request) => request,
        Err(e) => {
            let _ = write_answer(&mut stream, &(serving.malformed)(&format!("bad HTTP request: {e}")));
            return;
        }
    };
    let answer = (serving.handler)(&request);
    if let Some(delay) = answer.delay {
        let until = Instant::now() + delay;
        while Instant::now() < until && !serving.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20).min(until.saturating_duration_since(Instant::now())));
        }
    }
    match answer.hold {
        Some(hold) => {
            let until = Instant::now() + hold;
            while Instant::now() < until && !serving.stop.load(Ordering::SeqCst) {
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

/// Writes a complete answer (a 304 without a body, as HTTP requires).
fn write_answer(stream: &mut TcpStream, answer: &WireAnswer) -> io::Result<()> {
    let body: &[u8] = if answer.status == 304 { &[] } else { &answer.body };
    let mut head = format!("HTTP/1.1 {} {}\r\n", answer.status, reason(answer.status));
    if answer.status != 304 {
        // A handler's own Content-Type (an event stream) replaces the JSON default.
        if !answer.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("content-type")) {
            head.push_str("Content-Type: application/json; charset=utf-8\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("Connection: close\r\n");
    for (name, value) in &answer.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

/// The reason phrase of a status.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}
