//! The pull request a finished job opens: which remotes are GitHub's (`github.com` over
//! HTTPS or SSH, and any host an `api_url` names, for GitHub Enterprise), which API serves
//! each, and opening the PR once: an open PR with the same head is reused, so a create whose
//! answer was lost is never made twice.

use serde_json::Value;

use super::calls::{self, NewPull};
use super::client::GithubClient;
use crate::sources::error::TrackerError;
use crate::sources::settings::GITHUB_API_URL;

/// A repository on a GitHub host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GithubRemote {
    pub host: String,
    pub owner: String,
    pub name: String,
}

impl GithubRemote {
    /// `https://github.com/acme/webapp.git`, `git@github.com:acme/webapp.git`,
    /// `ssh://git@github.com/acme/webapp`, with any user name and password ignored. Any
    /// host: whether it is GitHub's is [`api_for`]'s question.
    pub fn parse(remote: &str) -> Option<Self> {
        let remote = remote.trim();
        let (host, path) = if let Ok(url) = url::Url::parse(remote) {
            if !matches!(url.scheme(), "https" | "http" | "ssh" | "git+ssh") {
                return None;
            }
            let host = match url.port() {
                Some(p) => format!("{}:{p}", url.host_str()?),
                None => url.host_str()?.to_string(),
            };
            (host, url.path().trim_start_matches('/').to_string())
        } else {
            // scp-like: [user@]host:owner/repo
            let (left, path) = remote.split_once(':')?;
            let host = left.rsplit('@').next()?.to_string();
            (host, path.trim_start_matches('/').to_string())
        };
        let path = path.trim_end_matches('/').trim_end_matches(".git");
        let (owner, name) = path.split_once('/')?;
        // As GitHub names them: never `.` or `..`, which a URL built from them would resolve.
        let ok = |p: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.len() <= 100
                && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        (ok(owner) && ok(name) && !host.is_empty()).then(|| Self {
            host: host.to_lowercase(),
            owner: owner.into(),
            name: name.into(),
        })
    }

    /// `owner/repo`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.owner, self.name)
    }
}

/// The API that serves `remote`, if it is on GitHub: the first of `apis` (the configured
/// GitHub sources' addresses and `DEVPILOT_GITHUB_API_URL`) on the remote's host, else for
/// `github.com` the default (`DEVPILOT_GITHUB_API_URL` when set, else GitHub's own).
pub fn api_for(remote: &GithubRemote, apis: &[String]) -> Option<String> {
    let host_of = |api: &str| {
        url::Url::parse(api).ok().and_then(|u| {
            let h = u.host_str()?.to_lowercase();
            Some(match u.port() {
                Some(p) => format!("{h}:{p}"),
                None => h,
            })
        })
    };
    if let Some(api) = apis.iter().find(|a| host_of(a).as_deref() == Some(remote.host.as_str())) {
        return Some(api.clone());
    }
    (remote.host == "github.com").then(|| {
        std::env::var("DEVPILOT_GITHUB_API_URL")
            .ok()
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| GITHUB_API_URL.to_string())
    })
}

/// What to open.
#[derive(Clone, Debug)]
pub struct PullAsk {
    pub remote: GithubRemote,
    pub branch: String,
    /// The base branch; `None`: the repository's default.
    pub base: Option<String>,
    pub title: String,
    pub body: String,
    pub draft: bool,
}

/// The URL of the open pull request from `ask.branch`: an existing one, else a new one.
pub async fn open_or_reuse(client: &GithubClient, ask: &PullAsk) -> Result<String, TrackerError> {
    let repo = ask.remote.full_name();
    if let Some(url) = find(client, &repo, &ask.remote.owner, &ask.branch).await? {
        return Ok(url);
    }
    let base = match &ask.base {
        Some(b) => b.clone(),
        None => {
            let answer = client.send(&calls::get_repo(&repo), None).await?;
            answer.body.get("default_branch").and_then(Value::as_str).unwrap_or("main").to_string()
        }
    };
    let new =
        NewPull { title: ask.title.clone(), head: ask.branch.clone(), base, body: ask.body.clone(), draft: ask.draft };
    match client.send(&calls::create_pull(&repo, &new), None).await {
        Ok(answer) => html_url(&answer.body),
        // Opened meanwhile (by another deliverer, or by a try whose answer was lost).
        Err(TrackerError::Refused(k, why)) if why.contains("already exists") => {
            find(client, &repo, &ask.remote.owner, &ask.branch).await?.ok_or(TrackerError::Refused(k, why))
        }
        Err(e) => Err(e),
    }
}

/// The open pull request from `owner:branch`, if there is one.
async fn find(client: &GithubClient, repo: &str, owner: &str, branch: &str) -> Result<Option<String>, TrackerError> {
    let answer = client.send(&calls::find_pulls(repo, &format!("{owner}:{branch}")), None).await?;
    let first = answer.body.as_array().and_then(|l| l.first()).cloned();
    first.map(|p| html_url(&p)).transpose()
}

fn html_url(pull: &Value) -> Result<String, TrackerError> {
    pull.get("html_url").and_then(Value::as_str).map(str::to_string).ok_or_else(|| {
        TrackerError::Server(crate::sources::settings::SourceKind::Github, 200)
            .with_detail("a pull request with no html_url")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HTTPS, SSH and scp-like remotes parse, credentials are ignored, other hosts parse
    /// but are GitHub's only when an `api_url` names their host.
    #[test]
    fn remotes() {
        let want = |host: &str| GithubRemote { host: host.into(), owner: "acme".into(), name: "webapp".into() };
        assert_eq!(GithubRemote::parse("https://github.com/acme/webapp.git"), Some(want("github.com")));
        assert_eq!(GithubRemote::parse("https://x:tok@github.com/acme/webapp"), Some(want("github.com")));
        assert_eq!(GithubRemote::parse("git@github.com:acme/webapp.git"), Some(want("github.com")));
        assert_eq!(GithubRemote::parse("ssh://git@github.com/acme/webapp.git"), Some(want("github.com")));
        assert_eq!(GithubRemote::parse("/srv/git/webapp.git"), None);
        let ghe = GithubRemote::parse("https://ghe.corp/acme/webapp.git").unwrap();
        assert_eq!(api_for(&ghe, &[]), None);
        assert_eq!(api_for(&ghe, &["https://ghe.corp/api/v3".into()]).as_deref(), Some("https://ghe.corp/api/v3"));
        let local = GithubRemote::parse("http://127.0.0.1:4100/acme/webapp.git").unwrap();
        assert_eq!(api_for(&local, &["http://127.0.0.1:4100".into()]).as_deref(), Some("http://127.0.0.1:4100"));
    }
}
