//! One HTTP exchange as the handler sees it: the request (method, path, query string, headers,
//! body) and the answer (status, headers, JSON body), or no answer at all after a hold (the
//! [`Timeout`](super::model::Fault::Timeout) fault).

use std::time::Duration;

/// An HTTP request.
pub(crate) struct WireRequest {
    pub method: String,
    pub path: String,
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
        let pair = self.query.split('&').filter_map(|p| p.split_once('=')).find(|(k, _)| *k == name);
        pair.map(|(_, v)| percent_decode(v))
    }
}

/// `%XX` and `+` decoded.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let (mut out, mut i) = (Vec::with_capacity(bytes.len()), 0);
    while i < bytes.len() {
        let hex = text.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What to send back.
pub(crate) struct WireAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Hold the connection this long, then close it without answering.
    pub hold: Option<Duration>,
}

impl WireAnswer {
    /// A JSON answer.
    pub(crate) fn json(status: u16, body: &serde_json::Value) -> Self {
        Self { status, headers: Vec::new(), body: body.to_string().into_bytes(), hold: None }
    }
}
