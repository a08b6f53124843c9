//! The Linear stand-in's listener: the shared std-only HTTP/1.1 server
//! ([`crate::http_server`]) with [`handle`] as its handler, and Linear's error shape for a
//! request that is not valid HTTP.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::json;

use super::handler::handle;
use super::shared::Shared;
use super::wire::WireAnswer;

/// The listening server; dropping it stops it.
pub(crate) struct Server(crate::http_server::Server);

impl Server {
    /// Listens on `127.0.0.1:port` (0: any free port) and serves in a background thread.
    pub(crate) fn start(shared: Arc<Shared>, port: u16) -> io::Result<Self> {
        let handler = Box::new(move |request: &_| handle(&shared, request));
        crate::http_server::Server::start("linear-standin", port, handler, malformed).map(Self)
    }

    /// Where it listens.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.0.addr()
    }
}

/// Linear's answer to a request that is not HTTP it can read.
fn malformed(message: &str) -> WireAnswer {
    WireAnswer::json(400, &json!({ "errors": [{ "message": message }] }))
}
