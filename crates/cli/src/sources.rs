//! `devpilot sources`: the tracker sources (each one's last poll, by whom, its next turn,
//! cursor, outbox backlog, rate limit and last error); `sources poll` polls now, ignoring
//! the interval; `sources add linear` and `sources add github` add one to the settings after
//! testing it.

use devpilot_engine::config::Paths;
use devpilot_engine::secrets;
use devpilot_engine::sources::{self, connection, ApiKey, KeyStore, SourceKind, SourceSettings, TrackerClient};
use devpilot_engine::span::Span;
use devpilot_store::db::PoolSettings;
use devpilot_store::error::{Error, Result};
use devpilot_store::queue::{Queue, SourceRow, SourceSpec};

use crate::cli::{AddCommon, AddGithub, AddLinear};
use crate::exit::{Code, Fail, Out};
use crate::open::open_queue;
use crate::output::{human, ms, shown};

/// This machine's key for `kind`, as its machine finds it: the tracker's variable
/// (`LINEAR_API_KEY`, `GITHUB_TOKEN`), else the keychain.
async fn machine_key(kind: SourceKind) -> Option<ApiKey> {
    KeyStore::Keychain { service: secrets::SERVICE.into() }.key(kind).await
}

/// This machine's credential for source `s`, as its machine finds it: Linear's key, or the
/// GitHub token of the source's API host (github.com's only for github.com).
async fn source_key(s: &SourceSettings) -> Option<ApiKey> {
    KeyStore::Keychain { service: secrets::SERVICE.into() }.for_source(s).await
}

/// `devpilot sources`: every source of the orchestrator, as its row says.
pub async fn list(orchestrator: Option<String>, json: bool) -> Result<()> {
    let paths = Paths::for_app("devpilot")?;
    let settings = paths.load()?;
    let orchestrator = orchestrator.unwrap_or_else(|| settings.orchestrator_id.clone());
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let rows = queue.sources(&orchestrator).await?;
    let keys = credentials(&settings.sources).await;
    if json {
        let from = |k: SourceKind| {
            keys.iter().find(|c| c.kind == k && c.host.is_none()).and_then(|c| c.key.as_ref().map(|k| k.from()))
        };
        let hosts: std::collections::BTreeMap<&str, Option<&str>> =
            keys.iter().filter_map(|c| Some((c.host.as_deref()?, c.key.as_ref().map(ApiKey::from)))).collect();
        let v = serde_json::json!({
            "orchestrator": orchestrator,
            "sources": rows,
            "configured_here": settings.sources.keys().collect::<Vec<_>>(),
            "key_from": from(SourceKind::Linear),
            "github_token_from": from(SourceKind::Github),
            "github_tokens_from_by_host": hosts,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(());
    }
    if rows.is_empty() && settings.sources.is_empty() {
        println!(
            "no sources: add one with `devpilot sources add github --repo OWNER/REPO --label agent` \
             or `devpilot sources add linear --team ENG --label agent`"
        );
        return Ok(());
    }
    for r in &rows {
        print_row(r, settings.sources.contains_key(&r.name));
    }
    for (name, s) in settings.sources.iter().filter(|(n, _)| !rows.iter().any(|r| &r.name == *n)) {
        match s.names_no_repo() {
            Some(why) => println!("{name}: configured here, and waits: {why}"),
            None => println!("{name}: configured here; registered when a machine starts with it"),
        }
    }
    for c in &keys {
        println!("{}", c.line());
    }
    Ok(())
}

/// One credential this machine needs: Linear's key, github.com's token, or the token of
/// another GitHub host (`host`), and what this machine holds for it.
struct Credential {
    kind: SourceKind,
    host: Option<String>,
    api_url: String,
    key: Option<ApiKey>,
}

impl Credential {
    /// `GitHub token for ghe.corp:8443 on this machine: from GITHUB_TOKEN_<HOST>`, or where
    /// to put one.
    fn line(&self) -> String {
        let (kind, what) = (self.kind, format!("{} {}", self.kind.tracker(), self.kind.credential()));
        let (what, fix) = match &self.host {
            Some(host) => (
                format!("{what} for {host}"),
                format!(
                    "`devpilot login --github --api-url {}` or {}",
                    self.api_url,
                    devpilot_engine::seal::github_token_var(host)
                ),
            ),
            None => (what, format!("`devpilot login --{}` or {}", kind.as_str(), kind.env_var())),
        };
        match &self.key {
            Some(k) => format!("{what} on this machine: from {}", k.from()),
            None => format!("{what} on this machine: none ({fix})"),
        }
    }
}

/// What this machine holds for each tracker host the sources use (Linear's key when there
/// are none): a GitHub source on another host needs that host's own token.
async fn credentials(sources: &std::collections::BTreeMap<String, SourceSettings>) -> Vec<Credential> {
    let mut out: Vec<Credential> = vec![];
    let mut all: Vec<&SourceSettings> = sources.values().collect();
    all.sort_by_key(|s| s.kind.as_str());
    let linear = SourceSettings::default();
    if all.is_empty() {
        all.push(&linear);
    }
    for s in all {
        let api_url = s.api_url();
        let host = match s.kind {
            SourceKind::Github if !sources::keys::is_github_com(&api_url) => sources::keys::host_of(&api_url),
            _ => None,
        };
        if out.iter().any(|c| c.kind == s.kind && c.host == host) {
            continue;
        }
        let key = if host.is_some() { source_key(s).await } else { machine_key(s.kind).await };
        out.push(Credential { kind: s.kind, host, api_url, key });
    }
    out
}

fn print_row(r: &SourceRow, here: bool) {
    let ago = |at: Option<i64>| at.map(|t| format!("{} ago", human(ms(r.now - t)))).unwrap_or_else(|| "never".into());
    let next = r.next_turn_at() - r.now;
    let next = if next <= 0 { "now".to_string() } else { format!("in {}", human(ms(next))) };
    println!("{} ({}){}", r.name, r.kind, if here { "" } else { " — not configured on this machine" });
    println!(
        "  last poll: {} by {}; next turn {next}; every {}",
        ago(r.polled_at),
        shown(r.polled_by.as_deref().or(Some("nobody"))),
        human(ms(r.interval_ms))
    );
    println!("  cursor: {}", shown(r.cursor.as_deref().or(Some("none (the first turn reads every match)"))));
    let rate = match (r.rate_remaining, r.rate_reset_at) {
        (Some(left), Some(reset)) => format!("{left} requests left, reset in {}", human(ms(reset - r.now))),
        (Some(left), None) => format!("{left} requests left"),
        _ => "not seen yet".into(),
    };
    println!("  outbox backlog: {}; rate limit: {rate}", r.backlog);
    if let Some(e) = &r.last_error {
        println!("  last error ({}): {}", ago(r.last_error_at), shown(Some(e)));
    }
    if let Some(n) = &r.notice {
        println!("  {}", shown(Some(n)));
    }
    if r.refused > 0 {
        let s = if r.refused == 1 { "" } else { "s" };
        println!("  refused: {} update{s} that acted on nothing; newest: {}", r.refused, shown(r.refusal.as_deref()));
    }
}

/// `devpilot sources poll [NAME]`: a turn of each (or the named) source now, whatever the
/// interval; prints the key of each job it added, updated or cancelled.
pub async fn poll(name: Option<String>, orchestrator: Option<String>, as_json: bool) -> Result<()> {
    let paths = Paths::for_app("devpilot")?;
    let settings = paths.load()?;
    let orchestrator = orchestrator.unwrap_or_else(|| settings.orchestrator_id.clone());
    let chosen: Vec<(&String, &SourceSettings)> =
        settings.sources.iter().filter(|(n, _)| name.as_deref().is_none_or(|want| want == n.as_str())).collect();
    if chosen.is_empty() {
        return Err(Error::Invalid(match name {
            Some(n) => format!("no source named '{n}' in the settings (`devpilot sources` lists them)"),
            None => "no sources in the settings: add one with `devpilot sources add linear --team ENG`".into(),
        }));
    }
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let machine = settings.machine_name();
    // One source's trouble (no key here, its tracker refusing) does not keep the others from
    // their turn: each says what went wrong, and the exit code says that something did.
    let mut failed = 0;
    let mut polled = vec![];
    let remotes = sources::maps::remotes_of(&settings.repos);
    for (n, s) in &chosen {
        // Its jobs would run repo-less and be thrown away: it waits, as a machine's does.
        if let Some(why) = s.names_no_repo() {
            eprintln!("{n}: not polled: {why}");
            polled.push(serde_json::json!({"source": n, "polled": false, "error": why}));
            failed += 1;
            continue;
        }
        let s = &sources::maps::mapped((*s).clone(), &remotes).await;
        match poll_one(&queue, (&orchestrator, &machine), n, s, settings.max_attempts, as_json).await {
            Ok(v) => polled.push(v),
            Err(e) => {
                eprintln!("{n}: {e}");
                polled.push(serde_json::json!({"source": n, "polled": false, "error": e.to_string()}));
                failed += 1;
            }
        }
    }
    if as_json {
        crate::output::json(&serde_json::json!({"orchestrator": orchestrator, "sources": polled}));
    }
    if failed > 0 {
        return Err(Error::Invalid(format!("{failed} of {} sources could not be polled", chosen.len())));
    }
    Ok(())
}

/// One turn of source `n` now, its report printed.
async fn poll_one(
    queue: &Queue,
    (orchestrator, machine): (&str, &str),
    n: &str,
    s: &SourceSettings,
    max_attempts: i32,
    as_json: bool,
) -> Result<serde_json::Value> {
    let key = source_key(s).await.ok_or_else(|| Error::Invalid(sources::keys::no_key_here(s)))?;
    let bound = bind(queue, orchestrator, n, s).await?;
    let client = TrackerClient::for_source(s, key.secret()).map_err(tracker)?;
    let taker = sources::Taker { queue, orchestrator_id: orchestrator, machine, max_attempts, wrote: None };
    match sources::poll(&taker, &bound, &client, true).await {
        Ok(sources::Tried { report: Some(report), .. }) => {
            if !as_json {
                for line in report.lines() {
                    println!("{line}");
                }
                println!("{n}: {} issues read, {} jobs added", report.seen, report.added.len());
            }
            Ok(
                serde_json::json!({"source": n, "polled": true, "seen": report.seen, "added": report.added, "lines": report.lines()}),
            )
        }
        Ok(sources::Tried { report: None, .. }) => {
            if !as_json {
                println!("{n}: another machine is polling it right now");
            }
            Ok(serde_json::json!({"source": n, "polled": false, "busy": true}))
        }
        Err(sources::IntakeError::Tracker(e)) => Err(tracker(e)),
        Err(sources::IntakeError::Store(e)) => Err(e),
    }
}

async fn bind(queue: &Queue, orchestrator: &str, name: &str, s: &SourceSettings) -> Result<sources::Bound> {
    let filter = s.filter_text();
    let spec = SourceSpec { name, kind: s.kind.as_str(), filter: &filter, interval: s.interval.get() };
    let id = queue.register_source(orchestrator, &spec).await?;
    Ok(sources::Bound { name: name.to_string(), id, settings: s.clone() })
}

fn tracker(e: sources::TrackerError) -> Error {
    Error::Invalid(e.to_string())
}

/// `devpilot sources add linear`: tests the source (the key, the teams, the label), then
/// saves it in the settings, refusing a name the settings already have. A running machine takes it at its next start or settings change.
pub async fn add_linear(a: AddLinear, as_json: bool) -> Result<()> {
    let mut s =
        SourceSettings { teams: a.team.iter().map(|t| t.trim().to_uppercase()).collect(), ..Default::default() };
    if let Some(l) = a.label {
        s.label = l.trim().to_string();
    }
    if !a.state.is_empty() {
        s.states = a.state;
    }
    if let Some(repo) = a.maps_to {
        for t in &s.teams {
            s.repo_by_team.insert(t.clone(), repo.clone());
        }
    }
    let name = a.name.unwrap_or_else(|| s.teams.first().map(|t| t.to_lowercase()).unwrap_or_default());
    save_tested(name, s, a.common, as_json).await
}

/// `devpilot sources add github`: tests the source (the token, the repository, the label),
/// then saves it in the settings, refusing a name the settings already have.
pub async fn add_github(a: AddGithub, as_json: bool) -> Result<()> {
    let mut s = SourceSettings { kind: SourceKind::Github, repo: a.repo.trim().to_string(), ..Default::default() };
    if let Some(l) = a.label {
        s.label = l.trim().to_string();
    }
    s.maps_to = a.maps_to.unwrap_or_default();
    let default_name = s.repo.rsplit('/').next().unwrap_or_default().to_lowercase().replace('.', "-");
    save_tested(a.name.unwrap_or(default_name), s, a.common, as_json).await
}

/// Saves source `s` as `name` with the flags every kind takes, after its connection test
/// (unless `--no-test`).
async fn save_tested(name: String, mut s: SourceSettings, common: AddCommon, as_json: bool) -> Result<()> {
    s.assigned_to_me = common.assigned_to_me;
    if let Some(i) = common.interval {
        s.interval = Span::parse(&i)?;
    }
    s.api_url = common.api_url;
    let paths = Paths::for_app("devpilot")?;
    let mut settings = paths.load()?;
    // Replacing it would start from defaults and silently drop what the file says beyond
    // these flags (its report, mappings, `enabled`).
    if settings.sources.contains_key(&name) {
        return Err(Error::Invalid(format!(
            "a source named '{name}' is already in the settings: change [sources.{name}] in {}, \
             or `devpilot sources remove {name}` first (or add this one with --name)",
            paths.config_file().display()
        )));
    }
    s.validate(&name)?;
    let mut tested = None;
    if !common.no_test {
        let Some(key) = source_key(&s).await else {
            return Err(Error::Invalid(format!(
                "no {} {} to test with: `devpilot login --{}` first (or --no-test)",
                s.kind.tracker(),
                s.kind.credential(),
                s.kind.as_str()
            )));
        };
        let found = connection::test(&s, key.secret()).await.map_err(|e| Error::Invalid(e.to_string()))?;
        tested = Some(found.line());
    }
    let runs = sources::maps::where_jobs_run(&s, &settings.repos).await;
    let kind = s.kind.as_str();
    settings.sources.insert(name.clone(), s);
    settings.validate()?;
    paths.save(&settings)?;
    if as_json {
        crate::output::json(&serde_json::json!({
            "name": name, "kind": kind, "added": true, "tested": tested, "runs_in": runs.line, "warning": runs.warn,
        }));
        return Ok(());
    }
    if let Some(line) = tested {
        println!("{line}");
    }
    println!("source '{name}' saved to {}", paths.config_file().display());
    if runs.warn {
        eprintln!("warning: {name}: {}", runs.line);
    } else {
        println!("{name}: {}", runs.line);
    }
    Ok(())
}

/// `devpilot sources remove NAME`: out of the settings (its row and outbox stay for the
/// other machines that have it).
pub fn remove(name: &str, as_json: bool) -> Out {
    let paths = Paths::for_app("devpilot")?;
    let mut settings = paths.load()?;
    let Some(s) = settings.sources.remove(name) else {
        let known: Vec<&str> = settings.sources.keys().map(String::as_str).collect();
        return Err(Fail::new(Code::NotFound, format!("no source named '{name}' in the settings")).fix(format!(
            "the sources here are: {}",
            if known.is_empty() { "none".into() } else { known.join(", ") }
        )));
    };
    paths.save(&settings)?;
    if as_json {
        crate::output::json(&serde_json::json!({"name": name, "kind": s.kind.as_str(), "removed": true}));
    } else {
        println!("source '{name}' removed from {}", paths.config_file().display());
    }
    Ok(Code::Ok)
}
