//! One HTTP exchange as the handler sees it: the request (method, path, query string, headers,
//! body) and the answer (status, headers, JSON body), or no answer at all after a hold (the
//! [`Timeout`](super::model::Fault::Timeout) fault). The types are the shared server's
//! ([`crate::http_server`]), which the GitHub stand-in uses too.

pub(crate) use crate::http_server::{WireAnswer, WireRequest};
