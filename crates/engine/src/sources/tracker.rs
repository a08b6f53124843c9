//! A source's tracker, whichever kind: its client, and what one intake turn reads from it,
//! as [`Item`]s the intake treats alike (a key, a version, whether the source takes the
//! issue or it has left, and the job it would be).

use serde_json::Value;

use super::approval::Verdict;
use super::error::TrackerError;
use super::github::{self, GithubClient};
use super::linear::{self, LinearClient, RateLimit};
use super::settings::{SourceKind, SourceSettings};

/// A source's client.
#[derive(Clone, Debug)]
pub enum TrackerClient {
    Linear(LinearClient),
    Github(GithubClient),
}

impl TrackerClient {
    /// The client of source `s` with `key`.
    pub fn for_source(s: &SourceSettings, key: &str) -> Result<Self, TrackerError> {
        Ok(match s.kind {
            SourceKind::Linear => TrackerClient::Linear(LinearClient::for_source(s, key)?),
            SourceKind::Github => TrackerClient::Github(GithubClient::for_source(s, key)?),
        })
    }

    /// The API host (and port) a GitHub source's client sends its token to.
    pub fn github_host(&self) -> Option<String> {
        match self {
            TrackerClient::Github(c) => c.api_host(),
            TrackerClient::Linear(_) => None,
        }
    }
}

/// An issue as the intake sees it.
#[derive(Clone, Debug)]
pub struct Item {
    /// The job's unique key (`linear:ENG-7`, `github:acme/webapp#7`).
    pub key: String,
    /// When the issue last changed (RFC 3339), as the payload's `source.updated_at` says it.
    pub version: String,
    /// The source takes it.
    pub matches: bool,
    /// It left the source in a way that cancels its job.
    pub left: bool,
    pub payload: Value,
    pub priority: i32,
}

/// What a turn read.
#[derive(Debug, Default)]
pub struct TurnRead {
    pub items: Vec<Item>,
    /// The next cursor (`None` keeps the current one).
    pub newest: Option<String>,
    /// The `ETag` to send next turn.
    pub etag: Option<String>,
    pub rate: RateLimit,
    /// More was left for the next turn.
    pub truncated: bool,
}

/// Reads what changed since `cursor` (`etag`: the last read's, where the tracker has them).
pub async fn read(
    client: &TrackerClient,
    source: &str,
    s: &SourceSettings,
    cursor: Option<&str>,
    etag: Option<&str>,
) -> Result<TurnRead, TrackerError> {
    match client {
        TrackerClient::Linear(c) => {
            let r = linear::read_changed(c, s, cursor).await?;
            let items = r.issues.iter().map(|i| linear_item(i, source, s)).collect();
            Ok(TurnRead { items, newest: r.newest, etag: None, rate: r.rate, truncated: r.truncated })
        }
        TrackerClient::Github(c) => {
            let me = if s.assigned_to_me { Some(c.login().await?) } else { None };
            let r = github::read_changed(c, s, cursor, etag, me.as_deref()).await?;
            let items = r.issues.iter().map(|i| github_item(i, source, s, me.as_deref())).collect();
            Ok(TurnRead { items, newest: r.newest, etag: r.etag, rate: r.rate, truncated: r.truncated })
        }
    }
}

fn linear_item(i: &linear::Issue, source: &str, s: &SourceSettings) -> Item {
    Item {
        key: linear::key_of(&i.identifier),
        version: i.updated_at.clone(),
        matches: i.matches(s),
        left: i.left(s),
        payload: linear::payload_of(i, source, s),
        priority: linear::priority_of(i.priority),
    }
}

fn github_item(i: &github::GhIssue, source: &str, s: &SourceSettings, me: Option<&str>) -> Item {
    Item {
        key: github::key_of(&s.repo, i.number),
        version: i.updated_at.clone(),
        matches: i.matches(s, me),
        left: i.left(s, me),
        payload: github::payload_of(i, source, s),
        priority: github::priority_of(i, s),
    }
}

/// Who approved `item` (applied the source's label with write access: on Linear, a member)
/// and whether it changed after. `None`: no label to approve (a source without one takes
/// every issue). `writers` keeps GitHub's access answers for the turn.
pub async fn approval(
    client: &TrackerClient,
    s: &SourceSettings,
    item: &Item,
    writers: &mut github::Writers,
) -> Result<Option<Verdict>, TrackerError> {
    if s.label.trim().is_empty() {
        return Ok(None);
    }
    match client {
        TrackerClient::Linear(c) => {
            let id = item.payload.pointer("/source/id").and_then(Value::as_str).unwrap_or_default();
            linear::approval(c, id, &item.version, s).await.map(Some)
        }
        TrackerClient::Github(c) => {
            let number = item.payload.pointer("/source/number").and_then(Value::as_u64).unwrap_or(0);
            github::approval(c, &s.repo, &s.label, number, &item.version, writers).await.map(Some)
        }
    }
}
