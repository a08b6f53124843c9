//! The HTTP side of GitHub: each [`Call`] sent with the token as `Authorization: Bearer`, the
//! API version pinned (`X-GitHub-Api-Version`), every call bounded, conditional reads
//! (`If-None-Match`), and every answer read for its rate-limit headers and sorted into what
//! the caller does next ([`TrackerError`]), naming the repository and what the token lacks.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, ETAG, IF_NONE_MATCH, LINK};
use serde_json::Value;

use super::calls::Call;
use crate::sources::error::TrackerError;
use crate::sources::linear::RateLimit;
use crate::sources::settings::{check_api_url, SourceKind, SourceSettings};

const G: SourceKind = SourceKind::Github;
/// The REST API version every call names.
pub const API_VERSION: &str = "2022-11-28";

/// What came back.
#[derive(Debug)]
pub struct Answer {
    /// 200, 201, 204 or 304.
    pub status: u16,
    /// The JSON body (`Null` for a 304 or a 204).
    pub body: Value,
    pub etag: Option<String>,
    /// A `Link` header with `rel="next"`: there is another page.
    pub has_next: bool,
    pub rate: RateLimit,
}

impl Answer {
    /// `304 Not Modified`: nothing changed since the `ETag` sent.
    pub fn not_modified(&self) -> bool {
        self.status == 304
    }
}

/// A GitHub client for one token and one API address. The token is never printed: not by
/// `Debug`, not in an error.
#[derive(Clone)]
pub struct GithubClient {
    http: reqwest::Client,
    base: url::Url,
    /// The token's login, asked once (for "assigned to me", and the author a comment's
    /// marker is signed for).
    login: std::sync::Arc<tokio::sync::OnceCell<String>>,
}

impl std::fmt::Debug for GithubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GithubClient").field("base", &self.base.as_str()).finish_non_exhaustive()
    }
}

impl GithubClient {
    /// A client for `api_url` with `token`, each call bounded by `timeout`.
    pub fn new(api_url: &str, token: &str, timeout: Duration) -> Result<Self, TrackerError> {
        check_api_url(api_url).map_err(|e| TrackerError::Refused(G, e.to_string()))?;
        let base = url::Url::parse(&format!("{}/", api_url.trim().trim_end_matches('/')))
            .map_err(|e| TrackerError::Refused(G, format!("the API address: {e}")))?;
        let headers = [
            (ACCEPT, HeaderValue::from_static("application/vnd.github+json")),
            (HeaderName::from_static("x-github-api-version"), HeaderValue::from_static(API_VERSION)),
        ];
        let http = crate::sources::http::client(G, &format!("Bearer {}", token.trim()), &headers, timeout)?;
        Ok(Self { http, base, login: Default::default() })
    }

    /// A client for source `s`'s API address and timeout, with `token`.
    pub fn for_source(s: &SourceSettings, token: &str) -> Result<Self, TrackerError> {
        Self::new(&s.api_url(), token, s.timeout.get())
    }

    /// The API's host (`api.github.com`, or a GitHub Enterprise server's).
    pub fn host(&self) -> Option<&str> {
        self.base.host_str()
    }

    /// The API's host and port, as [`crate::sources::keys::host_of`] writes them: the host the
    /// token belongs to.
    pub fn api_host(&self) -> Option<String> {
        crate::sources::keys::host_of(self.base.as_str())
    }

    /// Whose token it is (`GET /user`, asked once per client).
    pub async fn login(&self) -> Result<String, TrackerError> {
        let login = self
            .login
            .get_or_try_init(|| async {
                let answer = self.send(&super::calls::get_user(), None).await?;
                let login = answer.body.get("login").and_then(Value::as_str).unwrap_or_default().to_string();
                Ok::<_, TrackerError>(login)
            })
            .await?;
        Ok(login.clone())
    }

    /// Sends `call`, with `If-None-Match: etag` when given.
    pub async fn send(&self, call: &Call, etag: Option<&str>) -> Result<Answer, TrackerError> {
        let mut url = self.base.clone();
        let path = format!("{}{}", self.base.path().trim_end_matches('/'), call.path());
        url.set_path(&path);
        if !call.query.is_empty() {
            url.query_pairs_mut().extend_pairs(&call.query);
        }
        let mut req = self.http.request(call.method.clone(), url);
        if let Some(body) = &call.body {
            req = req.json(body);
        }
        if let Some(tag) = etag.and_then(|t| HeaderValue::from_str(t).ok()) {
            req = req.header(IF_NONE_MATCH, tag);
        }
        let answer = req.send().await.map_err(|e| TrackerError::unreachable(G, &e))?;
        let status = answer.status().as_u16();
        let headers = answer.headers().clone();
        let rate = rate_of(&headers);
        let text = answer.text().await.map_err(|e| TrackerError::unreachable(G, &e))?;
        let body: Value =
            if text.trim().is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::Null) };
        if matches!(status, 200..=299 | 304) {
            let etag = headers.get(ETAG).and_then(|v| v.to_str().ok()).map(str::to_string);
            let has_next = headers.get(LINK).and_then(|v| v.to_str().ok()).is_some_and(|l| l.contains("rel=\"next\""));
            return Ok(Answer { status, body, etag, has_next, rate });
        }
        Err(sort(call, status, &headers, &body, rate))
    }
}

/// The budget an answer's headers state (`x-ratelimit-reset` is in seconds).
fn rate_of(h: &HeaderMap) -> RateLimit {
    let num = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<i64>().ok());
    RateLimit {
        remaining: num("x-ratelimit-remaining"),
        reset_at_ms: num("x-ratelimit-reset").map(|s| s * 1000),
        ..Default::default()
    }
}

/// An answer that is not a success, as what to do next.
fn sort(call: &Call, status: u16, h: &HeaderMap, body: &Value, rate: RateLimit) -> TrackerError {
    let message = body.get("message").and_then(Value::as_str).unwrap_or("").to_string();
    let header = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let repo = call.repo.as_deref().unwrap_or("the repository");
    match status {
        401 => TrackerError::Auth(G, if message.is_empty() { "HTTP 401".into() } else { message }),
        403 | 429 => {
            if let Some(after) = header("retry-after").and_then(|s| s.trim().parse::<i64>().ok()) {
                return TrackerError::RateLimited { tracker: G, reset_at_ms: Some(now_ms() + after * 1000) };
            }
            if rate.remaining == Some(0) || status == 429 || message.to_lowercase().contains("rate limit") {
                return TrackerError::RateLimited { tracker: G, reset_at_ms: rate.reset_at_ms };
            }
            TrackerError::Refused(G, lacks(repo, call, &message, h))
        }
        404 => TrackerError::Refused(
            G,
            format!(
                "{repo} {NOT_FOUND}, or this token cannot see it ({}); a private repository needs a token \
                 with the `repo` scope, or a fine-grained token with access to {repo} and {}",
                call.op,
                needed(call)
            ),
        ),
        422 => TrackerError::Refused(G, validation(&message, body)),
        500..=599 => TrackerError::Server(G, status),
        _ => TrackerError::Refused(G, format!("HTTP {status} on {}: {message}", call.op)),
    }
}

/// What a 404's error says after the repository's name.
const NOT_FOUND: &str = "was not found";

/// Whether `e` is a 404 (a lookup of something GitHub does not have, or cannot show).
pub fn is_not_found(e: &TrackerError) -> bool {
    matches!(e, TrackerError::Refused(G, m) if m.contains(&format!(" {NOT_FOUND}, or this token")))
}

/// A 403 that is not a rate limit: what the token may not do, and what it would need.
fn lacks(repo: &str, call: &Call, message: &str, h: &HeaderMap) -> String {
    let header = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let wanted = header("x-accepted-github-permissions")
        .map(|p| format!("the permission {p}"))
        .or_else(|| header("x-accepted-oauth-scopes").filter(|s| !s.is_empty()).map(|s| format!("the scope {s}")))
        .unwrap_or_else(|| needed(call).to_string());
    format!("this token may not {} on {repo} (\"{message}\"); it needs {wanted}", call.op)
}

/// The fine-grained permission an operation needs, as GitHub names it.
fn needed(call: &Call) -> &'static str {
    let write = call.method != reqwest::Method::GET;
    match (call.op.split_once('/').map_or("", |(area, _)| area), write) {
        ("pulls", true) => "Pull requests: write",
        ("pulls", false) => "Pull requests: read",
        ("checks", true) => "Checks: write",
        ("checks", false) => "Checks: read",
        // Filed under `repos/`, but statuses have a fine-grained permission of their own.
        _ if call.op == "repos/get-combined-status-for-ref" => "Commit statuses: read",
        (_, true) => "Issues: write",
        (_, false) => "Issues: read",
    }
}

/// A 422's message with the errors GitHub listed.
fn validation(message: &str, body: &Value) -> String {
    let errors: Vec<String> = body
        .get("errors")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|e| {
                    let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                    let m = text("message");
                    if m.is_empty() {
                        format!("{} {} is {}", text("resource"), text("field"), text("code")).trim().to_string()
                    } else {
                        m
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    if errors.is_empty() {
        message.to_string()
    } else {
        format!("{message}: {}", errors.join("; "))
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::github::calls;

    /// Checks and statuses name their own fine-grained permissions, not the issues' ones.
    #[test]
    fn needed_names_checks_and_statuses() {
        let sha = "6dcb09b5b57875f334f61aebed695e2e4193db5e";
        assert_eq!(needed(&calls::list_check_runs("acme/webapp", sha, 1)), "Checks: read");
        assert_eq!(needed(&calls::combined_status("acme/webapp", sha, 1)), "Commit statuses: read");
        assert_eq!(needed(&calls::reply_to_review_comment("acme/webapp", 7, 9, "ok")), "Pull requests: write");
        assert_eq!(needed(&calls::list_reviews("acme/webapp", 7, 1)), "Pull requests: read");
        assert_eq!(needed(&calls::get_issue("acme/webapp", 7)), "Issues: read");
    }
}
