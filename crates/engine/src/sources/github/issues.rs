//! Reading issues: the list a turn asks for (a first turn: open issues with the label; after
//! that, every issue of the repo changed since the cursor, so a closed issue or a removed
//! label is seen and cancels its job), every page of it, pull requests dropped, and the
//! `ETag` kept for the next turn's `If-None-Match`.

use serde::Deserialize;
use serde_json::Value;

use super::calls::{self, IssueQuery, PER_PAGE};
use super::client::GithubClient;
use crate::sources::error::TrackerError;
use crate::sources::linear::RateLimit;
use crate::sources::settings::SourceSettings;

/// The most pages one turn reads: a turn that finds more ends early, and the next goes on
/// from its cursor.
const MAX_PAGES: u32 = 10;
/// How far before the cursor a turn reads again (GitHub's times are whole seconds, and a
/// change may become visible late); reading an issue twice changes nothing.
const OVERLAP_MS: i64 = 10_000;

/// An issue, with what the intake needs of it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct GhIssue {
    pub number: u64,
    pub title: String,
    #[serde(default)]
    pub body: Option<String>,
    pub html_url: String,
    /// `open` or `closed`.
    pub state: String,
    #[serde(default)]
    pub labels: Vec<Label>,
    #[serde(default)]
    pub assignees: Vec<User>,
    /// RFC 3339, seconds.
    pub updated_at: String,
    /// Present on pull requests, which the issue list returns too.
    #[serde(default)]
    pub pull_request: Option<Value>,
}

/// A label: GitHub writes an object, or (in older shapes) its name.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Label {
    Named { name: String },
    Bare(String),
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct User {
    pub login: String,
}

impl GhIssue {
    /// The label names.
    pub fn label_names(&self) -> impl Iterator<Item = &str> {
        self.labels.iter().map(|l| match l {
            Label::Named { name } | Label::Bare(name) => name.as_str(),
        })
    }

    /// Open, with the source's label and (if asked) assigned to `me`.
    pub fn matches(&self, s: &SourceSettings, me: Option<&str>) -> bool {
        self.state == "open" && !self.left(s, me)
    }

    /// Closed, its label removed, or (with "assigned to me") no longer assigned to `me`.
    pub fn left(&self, s: &SourceSettings, me: Option<&str>) -> bool {
        let labelled = s.label.trim().is_empty() || self.label_names().any(|l| l.eq_ignore_ascii_case(s.label.trim()));
        let mine =
            !s.assigned_to_me || self.assignees.iter().any(|a| me.is_some_and(|m| a.login.eq_ignore_ascii_case(m)));
        self.state == "closed" || !labelled || !mine
    }
}

/// What a turn read.
#[derive(Debug, Default)]
pub struct Read {
    pub issues: Vec<GhIssue>,
    /// The newest `updated_at` among them (the next cursor).
    pub newest: Option<String>,
    /// The `ETag` to send next time: only for a read of one page.
    pub etag: Option<String>,
    /// GitHub said 304: nothing changed.
    pub not_modified: bool,
    pub rate: RateLimit,
    pub truncated: bool,
}

/// The query of a turn from `cursor` (`me`: the token's login, for "assigned to me").
pub fn query_of(s: &SourceSettings, cursor: Option<&str>, me: Option<&str>) -> IssueQuery {
    match cursor {
        None => IssueQuery {
            open_with_label: Some(s.label.trim().to_string()),
            assignee: me.filter(|_| s.assigned_to_me).map(str::to_string),
            ..Default::default()
        },
        Some(c) => IssueQuery { since: Some(overlap(c)), ..Default::default() },
    }
}

/// Every page of the turn's query. `etag`: the last one-page read's, sent with the first page.
pub async fn read_changed(
    client: &GithubClient,
    s: &SourceSettings,
    cursor: Option<&str>,
    etag: Option<&str>,
    me: Option<&str>,
) -> Result<Read, TrackerError> {
    let mut read = Read::default();
    let mut q = query_of(s, cursor, me);
    for page in 1..=MAX_PAGES {
        q.page = page;
        let answer = client.send(&calls::list_issues(&s.repo, &q), etag.filter(|_| page == 1)).await?;
        read.rate = answer.rate;
        if answer.not_modified() {
            read.not_modified = true;
            read.etag = etag.map(str::to_string);
            return Ok(read);
        }
        let items: Vec<GhIssue> = serde_json::from_value(answer.body).map_err(|e| {
            TrackerError::Server(crate::sources::settings::SourceKind::Github, 200).with_detail(&e.to_string())
        })?;
        let full = items.len() as u32 >= PER_PAGE;
        read.issues.extend(items.into_iter().filter(|i| i.pull_request.is_none()));
        if page == 1 && !answer.has_next {
            read.etag = answer.etag;
        }
        if !answer.has_next || !full {
            read.newest = newest(&read.issues);
            return Ok(read);
        }
    }
    // Oldest change first: what is left is newer than everything read, and the next turn
    // goes on from this turn's cursor.
    read.truncated = true;
    read.newest = newest(&read.issues);
    Ok(read)
}

fn newest(issues: &[GhIssue]) -> Option<String> {
    issues.iter().max_by_key(|i| crate::span::parse_time_ms(&i.updated_at).unwrap_or(0)).map(|i| i.updated_at.clone())
}

/// The cursor moved back by [`OVERLAP_MS`], as GitHub's `since` takes it (seconds, UTC).
fn overlap(cursor: &str) -> String {
    match crate::span::parse_time_ms(cursor) {
        Ok(ms) => {
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(((ms - OVERLAP_MS).max(0) / 1000) as u64);
            humantime::format_rfc3339_seconds(t).to_string()
        }
        Err(_) => cursor.to_string(),
    }
}
