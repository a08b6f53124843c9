//! Settings → Sources: the tracker sources (Linear teams, GitHub repositories) this machine
//! has configured, as the window lists, tests and edits them. Each source shows the machine's
//! health for it, where its key comes from and the fleet's row (last poll, by whom, backlog),
//! so a user sees at a glance why issues do not arrive.
//!
//! The credential (a Linear API key, a GitHub token) goes to the OS keychain under its kind's
//! account (the service this app's machine reads, see `engine::run_config`), never to the
//! settings file, a log line or an error; the form that carries it redacts it when printed and
//! wipes it when dropped. A GitHub token may also be imported from the GitHub CLI
//! (`gh auth token`). Saving or removing a source goes through the same save-and-apply path as
//! every other settings change, so the running machine takes it at once, without a restart.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use devpilot_engine::sources::connection::{self, ConnectionError};
use devpilot_engine::sources::linear::TrackerError;
use devpilot_engine::sources::maps::WhereJobsRun;
use devpilot_engine::sources::settings::STATE_TYPES;
use devpilot_engine::sources::{keys, ApiKey, HealthState, KeyStore, SourceHealth, SourceKind, SourceSettings};
use devpilot_engine::span::Span;
use devpilot_store::error::{Error, Result};
use devpilot_store::queue::SourceRow;

use crate::engine::Engine;
use crate::keychain::{bounded, keychain};

/// What to do when there is no Linear key, said wherever one is missing.
const NO_KEY: &str = "no Linear API key on this machine: type one in the API key field (it is kept in the OS \
                      keychain), run `devpilot login --linear`, or set LINEAR_API_KEY";
/// What to do when there is no GitHub token.
const NO_TOKEN: &str = "no GitHub token on this machine: type one in the token field (it is kept in the OS \
                        keychain), use Import from gh, run `devpilot login --github`, or set GITHUB_TOKEN";

/// What to do when `kind` has no credential here.
fn no_key(kind: SourceKind) -> &'static str {
    match kind {
        SourceKind::Linear => NO_KEY,
        SourceKind::Github => NO_TOKEN,
    }
}

/// A source as the window's form has it: text fields as typed, checked only by
/// [`SourceForm::to_settings`]. The key is a new API key for the keychain (empty or absent:
/// keep the stored one); it is never sent back, never printed, and wiped when the form goes.
// Each field has its own default: a container default would move fields out of a value
// that has a `Drop`.
#[derive(Default, Serialize, Deserialize, PartialEq)]
pub struct SourceForm {
    /// Which tracker: `linear` (the default) or `github`.
    #[serde(default)]
    pub kind: SourceKind,
    /// The source's name in the settings (`[sources.NAME]`); empty: the first team (Linear) or
    /// the repository's name (GitHub), lowercased.
    #[serde(default)]
    pub name: String,
    /// Linear: team keys, separated by commas (or spaces): "ENG, OPS".
    #[serde(default)]
    pub teams: String,
    /// GitHub: the repository whose issues it takes, `OWNER/REPO`.
    #[serde(default)]
    pub repo: String,
    /// The label an issue must carry; empty: any.
    #[serde(default)]
    pub label: String,
    /// Linear: the workflow state types an issue must be in (unstarted, started, …).
    #[serde(default)]
    pub states: Vec<String>,
    /// Only issues assigned to the key's owner.
    #[serde(default)]
    pub assigned_to_me: bool,
    /// How often the fleet polls it ("60s"); empty: the default (or the source's current one).
    #[serde(default)]
    pub interval: String,
    /// The API address; empty: the tracker's (or `DEVPILOT_LINEAR_API_URL`,
    /// `DEVPILOT_GITHUB_API_URL`).
    #[serde(default)]
    pub api_url: String,
    /// A configured repo every issue runs in (Linear: every team's); empty: none.
    #[serde(default)]
    pub maps_to: String,
    /// A new API key or token for the keychain; empty or absent: keep the stored one.
    #[serde(default, skip_serializing)]
    pub key: Option<String>,
}

/// Never the key, whoever prints the form.
impl std::fmt::Debug for SourceForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceForm")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("teams", &self.teams)
            .field("repo", &self.repo)
            .field("label", &self.label)
            .field("states", &self.states)
            .field("assigned_to_me", &self.assigned_to_me)
            .field("interval", &self.interval)
            .field("api_url", &self.api_url)
            .field("maps_to", &self.maps_to)
            .field("key", &self.key.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Drop for SourceForm {
    fn drop(&mut self) {
        wipe(self.key.take());
    }
}

/// Best effort: do not leave a key lying around in freed memory longer than needed.
pub(crate) fn wipe(secret: Option<String>) {
    if let Some(s) = secret {
        let mut bytes = s.into_bytes();
        bytes.iter_mut().for_each(|b| *b = 0);
        std::hint::black_box(&bytes);
    }
}

impl SourceForm {
    /// The form of a configured source. The key is never in it.
    pub fn of(name: &str, s: &SourceSettings) -> Self {
        let mut repos = s.teams.iter().map(|t| s.repo_by_team.get(t));
        let first = repos.next().flatten();
        // One repo for every team is what the form can show; anything else shows as none.
        let maps_to = match first {
            _ if s.kind == SourceKind::Github => s.maps_to.clone(),
            Some(r) if repos.all(|x| x == Some(r)) => r.clone(),
            _ => String::new(),
        };
        Self {
            kind: s.kind,
            name: name.to_string(),
            teams: s.teams.join(", "),
            repo: s.repo.clone(),
            label: s.label.clone(),
            states: s.states.clone(),
            assigned_to_me: s.assigned_to_me,
            interval: s.interval.to_string(),
            api_url: s.api_url.clone().unwrap_or_default(),
            maps_to,
            key: None,
        }
    }

    /// The source's name: as typed, else the first team's key (Linear) or the repository's
    /// name (GitHub) in lower case ("eng", "webapp").
    pub(crate) fn source_name(&self) -> String {
        let typed = self.name.trim();
        if !typed.is_empty() {
            return typed.to_string();
        }
        match self.kind {
            SourceKind::Linear => team_keys(&self.teams).first().map(|t| t.to_lowercase()).unwrap_or_default(),
            SourceKind::Github => {
                let repo = self.repo.trim().trim_end_matches('/');
                repo.split_once('/').map(|(_, n)| n.to_lowercase().replace('.', "-")).unwrap_or_default()
            }
        }
    }

    /// The source this form describes, checked, with its name. What the form does not show
    /// (the report, the requires prefix, repos by label or project, priority labels, on or
    /// off) is kept from the source of that name and kind in `configured`, if there is one.
    pub fn to_settings(&self, configured: &BTreeMap<String, SourceSettings>) -> Result<(String, SourceSettings)> {
        let name = self.source_name();
        if name.is_empty() {
            return Err(Error::Invalid(match self.kind {
                SourceKind::Linear => "give the source a name (e.g. eng), or at least one team key".into(),
                SourceKind::Github => "give the source a name (e.g. webapp), or its repository as OWNER/REPO".into(),
            }));
        }
        let mut s = configured.get(&name).filter(|c| c.kind == self.kind).cloned().unwrap_or_default();
        s.label = self.label.trim().to_string();
        s.assigned_to_me = self.assigned_to_me;
        if !self.interval.trim().is_empty() {
            s.interval = Span::parse(&self.interval)?;
        }
        s.api_url = Some(self.api_url.trim().to_string()).filter(|u| !u.is_empty());
        if self.kind == SourceKind::Github {
            s.kind = SourceKind::Github;
            s.repo = self.repo.trim().to_string();
            s.teams = vec![];
            s.maps_to = self.maps_to.trim().to_string();
            s.validate(&name)?;
            return Ok((name, s));
        }
        s.teams = team_keys(&self.teams);
        s.states = dedup(self.states.iter().map(|x| x.trim().to_lowercase()).filter(|x| !x.is_empty()));
        let repo = self.maps_to.trim();
        s.repo_by_team = if repo.is_empty() {
            BTreeMap::new()
        } else {
            s.teams.iter().map(|t| (t.clone(), repo.to_string())).collect()
        };
        s.validate(&name)?;
        if s.states.is_empty() {
            return Err(Error::Invalid(format!(
                "source '{name}': choose at least one state type ({})",
                STATE_TYPES.join(", ")
            )));
        }
        Ok((name, s))
    }
}

/// "eng, ops platform" → ["ENG", "OPS", "PLATFORM"]: split on commas and spaces, upper case,
/// each once.
fn team_keys(text: &str) -> Vec<String> {
    dedup(text.split(|c: char| c == ',' || c.is_whitespace()).filter(|t| !t.is_empty()).map(str::to_uppercase))
}

fn dedup(items: impl Iterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

/// One configured source, as Settings → Sources lists it.
#[derive(Debug, Serialize)]
pub struct SourceView {
    pub name: String,
    pub kind: String,
    /// Off: this machine neither polls it nor reports to it (`enabled = false` in the file).
    pub enabled: bool,
    /// Its settings as the form shows them (never a key).
    pub form: SourceForm,
    /// How it is doing on this machine, while the machine runs.
    pub health: Option<SourceHealth>,
    /// The fleet's row for it (last poll, by whom, backlog), once a machine registered it.
    pub row: Option<SourceRow>,
    /// "eng (linear): OK — last poll 20s ago by desktop, 3 jobs added · API key from keychain".
    pub line: String,
    /// Whether the line is good news (for the window's colour).
    pub ok: bool,
    /// Where its jobs run on this machine: "its jobs run in repo 'webapp' (~/src/webapp), which
    /// pushes on completion and opens a draft pull request", or what keeps them from it.
    pub runs_in: String,
    /// Whether `runs_in` is a warning (no pushed branch here, or waiting for another machine).
    pub runs_in_warn: bool,
}

/// Everything Settings → Sources shows.
#[derive(Debug, Serialize)]
pub struct SourcesView {
    pub sources: Vec<SourceView>,
    /// Where this machine's Linear key comes from: `keychain` or `LINEAR_API_KEY`; `None`: no key.
    pub key_from: Option<String>,
    /// Where this machine's GitHub token comes from: `keychain`, `keychain (imported from gh)`
    /// or `GITHUB_TOKEN`; `None`: no token.
    pub github_key_from: Option<String>,
    /// Why the keychain could not be asked, if it could not.
    pub key_error: Option<String>,
    /// Why the fleet's rows could not be read (the sources are listed anyway).
    pub db_error: Option<String>,
    /// The repos configured here, for the form's "repo" choice.
    pub repos: Vec<String>,
}

impl Engine {
    /// Every configured source with its health here, where its key comes from and its row in
    /// the database, and where this machine's keys come from. A database or keychain that
    /// cannot be read is shown in the view, not an error: the list is what the user needs to
    /// fix it.
    pub async fn sources_view(&self) -> Result<SourcesView> {
        let file = self.file_settings()?;
        let status = self.status();
        let (rows, db_error) = match self.queue() {
            Ok(q) => match q.sources(&self.settings().orchestrator_id).await {
                Ok(rows) => (rows, None),
                Err(e) => (vec![], Some(e.to_string())),
            },
            Err(e) => (vec![], Some(e.to_string())),
        };
        let (linear, github) = tokio::join!(self.machine_key(SourceKind::Linear), self.machine_key(SourceKind::Github));
        let key_error = [&linear, &github].iter().find_map(|k| k.as_ref().err().map(|e| e.to_string()));
        let from = |k: Result<Option<ApiKey>>| k.ok().flatten().map(|k| k.from().to_string());
        let (key_from, github_key_from) = (from(linear), from(github));
        // A GitHub source on another host has its own token: github.com's is not its.
        let mut own_host: BTreeMap<&str, Option<String>> = BTreeMap::new();
        for (name, s) in file.sources.iter().filter(|(_, s)| on_another_host(s)) {
            own_host.insert(name, from(self.source_key(s).await));
        }
        let mut runs = BTreeMap::new();
        for (name, s) in &file.sources {
            runs.insert(name.as_str(), devpilot_engine::sources::maps::where_jobs_run(s, &file.repos).await);
        }
        let sources = file
            .sources
            .iter()
            .map(|(name, s)| {
                let runs_in =
                    runs.remove(name.as_str()).unwrap_or_else(|| WhereJobsRun { line: String::new(), warn: false });
                let health = status.sources.iter().find(|h| &h.name == name).cloned();
                let row = rows.iter().find(|r| &r.name == name).cloned();
                let (mut line, ok) = health_line(name, s, health.as_ref(), row.as_ref(), &status.machine);
                let machine_key = match (s.kind, own_host.get(name.as_str())) {
                    (_, Some(own)) => own.as_deref(),
                    (SourceKind::Linear, None) => key_from.as_deref(),
                    (SourceKind::Github, None) => github_key_from.as_deref(),
                };
                // What the running machine took, else what it would take now.
                let used = health.as_ref().and_then(|h| h.key_from.as_deref()).or(machine_key);
                line.push_str(&key_note(s, health.as_ref(), used));
                SourceView {
                    name: name.clone(),
                    kind: s.kind.as_str().into(),
                    enabled: s.enabled,
                    form: SourceForm::of(name, s),
                    health,
                    row,
                    line,
                    ok,
                    runs_in: runs_in.line,
                    runs_in_warn: runs_in.warn,
                }
            })
            .collect();
        let repos = file.repos.keys().cloned().collect();
        Ok(SourcesView { sources, key_from, github_key_from, key_error, db_error, repos })
    }

    /// Settings → Sources' "Test connection": the form as a source, with the form's key or
    /// the stored one of its kind; "Connected as Ada: team ENG (Engineering), label agent"
    /// (or "repo acme/webapp (can push)"), or what is wrong. Nothing is saved.
    pub async fn test_source(&self, mut form: SourceForm) -> Result<String> {
        let typed = typed_key(&mut form);
        let (_, s) = form.to_settings(&self.file_settings()?.sources)?;
        let key = match typed {
            Some(k) => k,
            None => match self.source_key(&s).await? {
                Some(k) => k.secret().to_string(),
                None => return Err(Error::Invalid(no_key(s.kind).into())),
            },
        };
        let found = connection::test(&s, &key).await;
        wipe(Some(key));
        found.map(|f| f.line()).map_err(|e| connection_error(&s, e))
    }

    /// Adds or replaces a source from the form: checked, its key (if the form has one) into
    /// the keychain under its kind's account, then saved and applied as any settings change
    /// (the machine takes it at once). Nothing is saved if the check or the keychain fails. A
    /// key stored before a failed file write stays stored: it is this machine's key for every
    /// source of that kind.
    pub async fn save_source(self: &Arc<Self>, mut form: SourceForm) -> Result<SourcesView> {
        let key = typed_key(&mut form);
        let old = self.file_settings()?;
        let (name, s) = form.to_settings(&old.sources)?;
        let (kind, api) = (s.kind, s.api_url());
        let mut new = old.clone();
        new.sources.insert(name, s);
        new.validate()?;
        if let Some(key) = key {
            let service = self.service.clone();
            keychain(move || {
                // A GitHub token under its host's account: github.com's is never another host's.
                let stored = match kind {
                    SourceKind::Github => keys::store_github_token_at(&service, &api, &key, false),
                    SourceKind::Linear => keys::store_key(&service, kind, &key, false),
                };
                wipe(Some(key));
                stored
            })
            .await?;
        }
        self.save_file(&new)?;
        self.apply(&old, new, false).await?;
        self.sources_view().await
    }

    /// Removes a source from this machine's settings (its row and its undelivered reports stay
    /// for the other machines that have it), and applies that at once. The key stays: every
    /// source of its kind on this machine uses it.
    pub async fn remove_source(self: &Arc<Self>, name: &str) -> Result<SourcesView> {
        let old = self.file_settings()?;
        let mut new = old.clone();
        if new.sources.remove(name.trim()).is_none() {
            return Err(Error::Invalid(format!("there is no source named '{}' in the settings", name.trim())));
        }
        self.save_file(&new)?;
        self.apply(&old, new, false).await?;
        self.sources_view().await
    }

    /// Settings → Sources' "Import from gh": the token the GitHub CLI is logged in with
    /// (`gh auth token`) into the keychain as this machine's GitHub token, marked as imported;
    /// what was imported and which token this machine now uses (`GITHUB_TOKEN` comes first).
    /// A missing or logged-out `gh` is said as such, and nothing changes. A source that had no
    /// token takes it at its next turn; Test connection uses it at once.
    pub async fn import_gh_token(&self) -> Result<String> {
        let Some(token) = keys::gh_token().await else {
            let installed = on_path("gh", std::env::var_os("PATH").as_deref());
            return Err(Error::Invalid(gh_gave_nothing(installed).into()));
        };
        let service = self.service.clone();
        keychain(move || {
            let stored = keys::store_key(&service, SourceKind::Github, &token, true);
            wipe(Some(token));
            stored
        })
        .await?;
        let used = self.machine_key(SourceKind::Github).await?;
        Ok(imported(used.as_ref().map(ApiKey::from)))
    }

    /// This machine's key for source `s` as its machine finds it (the tracker's variable, else
    /// the keychain of this app's service; a GitHub token of the source's own host), bounded in
    /// time: a locked keychain must not hang the window.
    async fn source_key(&self, s: &SourceSettings) -> Result<Option<ApiKey>> {
        let store = KeyStore::Keychain { service: self.service.clone() };
        bounded(store.for_source(s)).await
    }

    /// [`Self::source_key`] for `kind` on its tracker's own host (github.com for GitHub).
    async fn machine_key(&self, kind: SourceKind) -> Result<Option<ApiKey>> {
        let store = KeyStore::Keychain { service: self.service.clone() };
        bounded(store.key(kind)).await
    }
}

/// A GitHub source whose API is not github.com's: it needs that host's own token.
fn on_another_host(s: &SourceSettings) -> bool {
    s.kind == SourceKind::Github && !keys::is_github_com(&s.api_url())
}

/// Why "Import from gh" imported nothing: `gh` is not installed (not on `PATH`), or it gave
/// no token (not logged in).
pub(crate) fn gh_gave_nothing(installed: bool) -> &'static str {
    if installed {
        "the GitHub CLI (gh) is not logged in: `gh auth token` gave no token. Run `gh auth login`, or type a \
         token in the token field; nothing was imported"
    } else {
        "the GitHub CLI (gh) is not installed here (no gh on PATH). Install it and run `gh auth login`, or type a \
         token in the token field; nothing was imported"
    }
}

/// What "Import from gh" says it did, given where this machine's GitHub token now comes from.
pub(crate) fn imported(used: Option<&str>) -> String {
    let done = "Imported the GitHub CLI's token (gh auth token) into the OS keychain";
    match used {
        Some("GITHUB_TOKEN") => format!("{done}, but this machine uses GITHUB_TOKEN while that is set."),
        Some(from) => format!("{done}: GitHub sources and pull requests use it (token from {from})."),
        None => format!("{done}, but it cannot be read back from the keychain."),
    }
}

/// Whether `program` is a file in one of `path`'s folders.
pub(crate) fn on_path(program: &str, path: Option<&std::ffi::OsStr>) -> bool {
    let Some(path) = path else { return false };
    std::env::split_paths(path).any(|dir| dir.join(program).is_file() || dir.join(format!("{program}.exe")).is_file())
}

/// " · token from keychain (imported from gh)": where the source's key comes from, for its
/// line; nothing for a source that is off, or whose line already says it has no key.
pub(crate) fn key_note(s: &SourceSettings, health: Option<&SourceHealth>, used: Option<&str>) -> String {
    if !s.enabled || health.is_some_and(|h| h.state == HealthState::NoKey) {
        return String::new();
    }
    let host = keys::host_of(&s.api_url()).filter(|_| on_another_host(s));
    match (used, host) {
        (Some(from), _) => format!(" · {} from {from}", s.kind.credential()),
        (None, Some(host)) => format!(" · no GitHub token for {host} on this machine"),
        (None, None) => format!(" · no {} {} on this machine", s.kind.tracker(), s.kind.credential()),
    }
}

/// The form's key, taken out of it, trimmed; `None` when it is empty (keep the stored one).
fn typed_key(form: &mut SourceForm) -> Option<String> {
    let raw = form.key.take()?;
    let key = Some(raw.trim().to_string()).filter(|k| !k.is_empty());
    wipe(Some(raw));
    key
}

/// A failed connection test, as the window says it: what is wrong, and what to do.
fn connection_error(s: &SourceSettings, e: ConnectionError) -> Error {
    let api_url = s.api_url();
    match (s.kind, e) {
        (SourceKind::Linear, ConnectionError::Tracker(TrackerError::Auth(_, why))) => Error::Invalid(format!(
            "Linear refused the API key ({why}); type the right key in the API key field (Linear → Settings → API)"
        )),
        (SourceKind::Github, ConnectionError::Tracker(TrackerError::Auth(_, why))) => Error::Invalid(format!(
            "GitHub refused the token ({why}); type the right token in the token field (one that can read {}), \
             or use Import from gh",
            s.repo
        )),
        (kind, ConnectionError::Tracker(TrackerError::Unreachable(_, why))) => Error::Invalid(format!(
            "cannot reach {} at {api_url}: {why}; check the API address and the network",
            kind.tracker()
        )),
        (_, other) => Error::Invalid(other.to_string()),
    }
}

/// One line for a source: its name and kind, how it is doing here, and the fleet's last poll.
/// `machine` is this machine's name (the jobs of "its" last turn are counted only when the
/// fleet's last poll was its own). The flag says whether all is well.
pub(crate) fn health_line(
    name: &str,
    s: &SourceSettings,
    health: Option<&SourceHealth>,
    row: Option<&SourceRow>,
    machine: &str,
) -> (String, bool) {
    let state = match health {
        _ if !s.enabled => "off on this machine".to_string(),
        None => "not running here".to_string(),
        Some(h) => {
            let word = match h.state {
                HealthState::Starting => "starting",
                HealthState::Ok => "OK",
                HealthState::NoKey => "no key",
                HealthState::WrongKey => "wrong key",
                HealthState::Offline => "offline",
                HealthState::RateLimited => "rate limited",
                HealthState::Error => "error",
            };
            match h.message.as_deref().filter(|m| !m.is_empty() && h.state != HealthState::Ok) {
                Some(m) => format!("{word}: {m}"),
                None => word.to_string(),
            }
        }
    };
    let ok = s.enabled && health.is_some_and(|h| matches!(h.state, HealthState::Ok | HealthState::Starting));
    let mut line = format!("{name} ({}): {state}", s.kind.as_str());
    match row {
        Some(r) => match (r.polled_at, r.polled_by.as_deref()) {
            (Some(at), by) => {
                line.push_str(&format!(" — last poll {} ago by {}", ago(r.now - at), by.unwrap_or("?")));
                let mine = by == Some(machine);
                if let Some(report) = health.and_then(|h| h.last_poll.as_ref()).filter(|_| mine) {
                    let n = report.added.len();
                    line.push_str(&format!(", {n} job{} added", plural(n as i64)));
                }
            }
            (None, _) => line.push_str(" — not polled yet"),
        },
        None if s.enabled => line.push_str(" — not registered yet"),
        None => {}
    }
    if let Some(r) = row {
        if r.backlog > 0 {
            line.push_str(&format!(" · {} update{} waiting to reach the issues", r.backlog, plural(r.backlog)));
        }
        if let Some(n) = &r.notice {
            line.push_str(&format!(" · {n}"));
        }
        if r.refused > 0 {
            let why = r.refusal.as_deref().unwrap_or("?");
            line.push_str(&format!(" · {} update{} refused, acting on nothing: {why}", r.refused, plural(r.refused)));
        }
        // A trouble here already says what is wrong; otherwise the fleet's last error may.
        if let Some(e) = r.last_error.as_deref().filter(|_| ok || health.is_none()) {
            line.push_str(&format!(" · last error: {e}"));
        }
    }
    (line, ok)
}

fn plural(n: i64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// "20s", "3m", "1h 5m", "2d", as the window says how long ago.
fn ago(ms: i64) -> String {
    let s = Duration::from_millis(ms.max(0) as u64).as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d", s / 86400),
    }
}
