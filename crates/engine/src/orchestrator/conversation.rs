//! A preset's conversation across attempts and machines, around the runner: before the
//! agent starts, a carried session is restored (or the history says why not) and the job
//! says which preset runs it; while it runs, the API watchdog ends an attempt whose CLI only
//! retries a model call it cannot make; after it ends, the CLI's own report decides the
//! outcome and its usage is kept; and a hand-off, a stop at the lease deadline or a park
//! saves the session, fenced, for the next claimer.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::agent::{AgentEnv, AgentExit, AgentSpec, LogSpan};
use crate::preset::outcome::{Printed, RunReport};
use crate::preset::session::{SessionError, SessionPlace, AIDER_SESSION};
use crate::preset::{Conversation, Preset, PresetSettings};
use devpilot_store::job::event;
use devpilot_store::queue::{Claim, Fence, MachineStore, NewSession, SavedSession, SESSION_BUNDLE_CAP};
use devpilot_store::retry::{self, Budget};

/// One attempt's conversation.
pub(super) struct Talk {
    pub(super) preset: Preset,
    api_timeout: Duration,
    place: Option<SessionPlace>,
    pub(super) conversation: Conversation,
    /// The values of the keys the CLI was given, blanked out of a carried session.
    secrets: Vec<String>,
    /// The machine whose conversation this attempt resumed, when not this one.
    pub(super) moved_from: Option<String>,
}

/// Where an agent runs, and who for: what [`begin`] needs besides the claim.
pub(super) struct Runs<'a> {
    pub(super) store: &'a MachineStore,
    pub(super) agent: &'a AgentSpec,
    pub(super) env: &'a AgentEnv,
    pub(super) cwd: &'a Path,
    /// The account the preset runs as ([`super::governed`]).
    pub(super) account: Option<&'a str>,
}

/// Before a preset's agent starts: its conversation, restored from a carried session when
/// one may be resumed here (the history says it was, or why not), and the job says which
/// preset runs it. `None` for an agent that is not a preset.
pub(super) async fn begin(runs: Runs<'_>, claim: &Claim) -> Option<Talk> {
    let AgentSpec::Preset { preset, settings } = runs.agent else { return None };
    let (preset, fence) = (*preset, claim.fence);
    let place = SessionPlace::of(preset, runs.cwd, &|k| var_of(settings, k));
    let saved = match runs.store.load_session(fence.job).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(job = fence.job, error = %e, "could not read a carried session; starting fresh");
            None
        }
    };
    let (conversation, moved_from) = match (saved, &place) {
        (Some(saved), Some(place)) => resume(runs.store, claim, preset, place, saved, &runs.env.machine).await,
        _ => (fresh(preset), None),
    };
    let from = match &conversation {
        Conversation::Resume { .. } => moved_from.clone().or(Some(runs.env.machine.clone())),
        Conversation::New { .. } => None,
    };
    let write = || runs.store.record_agent_start(&fence, preset.name(), from.as_deref(), runs.account);
    if let Err(e) = retry::transient("recording the agent", Budget::NOTE, write).await {
        tracing::warn!(job = fence.job, error = %e, "could not record which agent runs the job");
    }
    let secrets = secrets_of(preset, settings, &runs.env.pass_env);
    Some(Talk { preset, api_timeout: settings.api_timeout(), place, conversation, secrets, moved_from })
}

/// Restores `saved` for this claim if it may be resumed here, and says so in the history
/// (or why not). It may when it is this preset's, from the claim just before this one, and
/// its work is here: saved on this machine, or handed off (and pushed) by the machine that
/// saved it. A park or a deadline elsewhere left its work on that machine.
async fn resume(
    store: &MachineStore,
    claim: &Claim,
    preset: Preset,
    place: &SessionPlace,
    saved: SavedSession,
    here: &str,
) -> (Conversation, Option<String>) {
    let fence = claim.fence;
    let handed_off = claim.resumed_from.as_deref() == Some(saved.machine.as_str()) && claim.resume_branch.is_some();
    let started = Instant::now();
    let why_not = if saved.agent != preset.name() {
        Some(SessionError::OtherAgent { saved: saved.agent.clone(), here: preset }.to_string())
    } else if saved.claim_token != fence.token - 1 {
        Some("it is from an earlier attempt than the last one".to_string())
    } else if saved.machine != here && !handed_off {
        Some(format!("it was saved on {} at a park or a deadline, and its work stayed there", saved.machine))
    } else if saved.bundle.is_none() {
        Some(format!("it is stored as more than the {SESSION_BUNDLE_CAP} bytes a session may be, so it was not read"))
    } else {
        None
    };
    let restored = match why_not {
        Some(why) => Err(why),
        None => restore(preset, place, &saved, here).await,
    };
    match restored {
        Ok((talk, bytes)) => {
            let took = started.elapsed().as_millis();
            let kib = bytes as f64 / 1024.0;
            let how = match bytes {
                0 => "its file was still here".to_string(),
                _ => format!("{kib:.1} KiB restored in {took} ms"),
            };
            let detail = format!("{preset} session {} from {} resumed: {how}", saved.session_id, saved.machine);
            tracing::info!(job = fence.job, "{detail}");
            store.note_agent(&fence, event::SESSION_RESUMED, &detail).await;
            let moved = (saved.machine != here).then_some(saved.machine);
            (talk, moved)
        }
        Err(why) => {
            let detail = format!("the carried {} session was not resumed: {why}; starting fresh", saved.agent);
            tracing::warn!(job = fence.job, "{detail}");
            store.note_agent(&fence, event::SESSION_FRESH, &detail).await;
            (fresh(preset), None)
        }
    }
}

/// Puts `saved` back for `preset` on this machine, off the async runtime. Back on the machine
/// that saved it (after a park or a deadline), the CLI's own file is still where the restore
/// would put it: that one is resumed as it is, never replaced.
async fn restore(
    preset: Preset,
    place: &SessionPlace,
    saved: &SavedSession,
    here: &str,
) -> Result<(Conversation, usize), String> {
    let (place, s, here_too) = (place.clone(), saved.clone(), saved.machine == here);
    let work = move || {
        let put = || preset.restore(&place, &s.session_id, &s.cwd, s.bundle.as_deref().unwrap_or_default());
        match put() {
            // Back on a machine that ran this conversation before it moved on (laptop,
            // desktop, laptop): its own copy is older than the one carried here. It is set
            // aside, never written over, and the carried one is restored.
            Err(SessionError::Exists(old)) if !here_too => set_aside(&old).and_then(|()| put()),
            other => other,
        }
    };
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(SessionError::Exists(file))) if saved.machine == here => {
            let file = (preset == Preset::Gemini).then_some(file);
            Ok((Conversation::Resume { id: saved.session_id.clone(), file }, 0))
        }
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(format!("the restore stopped: {e}")),
    }
}

/// Renames an older copy of the session's file to `<name>.superseded-<ms>` beside it: a
/// capture takes only the exact name, so it is never carried again.
fn set_aside(old: &std::path::Path) -> Result<(), SessionError> {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let mut aside = old.as_os_str().to_owned();
    aside.push(format!(".superseded-{ms}"));
    std::fs::rename(old, &aside).map_err(|source| SessionError::Io { what: "set aside", path: old.into(), source })
}

/// The values of the variables the agent is given (the allowlist, its preset's variables,
/// `pass_env`, the settings' env) whose names say they are secret: a key, a token, a
/// password.
fn secrets_of(preset: Preset, settings: &PresetSettings, pass_env: &[String]) -> Vec<String> {
    let secret =
        |name: &str| ["KEY", "TOKEN", "SECRET", "PASSWORD"].iter().any(|w| name.to_ascii_uppercase().contains(w));
    let given = crate::environ::allowed(&[crate::environ::BASE, preset.env_needs()], pass_env)
        .into_iter()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()));
    let from_settings = settings.env.iter().map(|(k, v)| (k.clone(), v.clone()));
    let mut out: Vec<String> =
        given.chain(from_settings).filter(|(k, v)| secret(k) && v.len() >= 8).map(|(_, v)| v).collect();
    // And by value, every secret this machine knows ([`crate::redact`]); the longest first,
    // so one that contains another goes whole.
    out.extend(crate::redact::known().values().iter().cloned());
    out.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    out.dedup();
    out
}

/// A variable of the agent's environment: the settings' own, else the runner's.
fn var_of(settings: &PresetSettings, name: &str) -> Option<String> {
    settings.env.get(name).cloned().or_else(|| std::env::var(name).ok()).filter(|v| !v.is_empty())
}

/// A new conversation, with its id chosen up front where the CLI lets us.
fn fresh(preset: Preset) -> Conversation {
    let id = matches!(preset, Preset::Claude | Preset::Gemini).then(|| uuid::Uuid::new_v4().to_string());
    Conversation::New { id }
}

impl Talk {
    /// How the run ended, by what the CLI printed.
    pub(super) fn read(&self, span: Option<&LogSpan>, exit: &AgentExit) -> RunReport {
        let Some(span) = span else { return RunReport::default() };
        let (head, tail) = printed(span);
        self.preset.report(&Printed { head: &head, tail: &tail }, exit)
    }

    /// The session this attempt ran: chosen up front, resumed, reported, or (codex) named
    /// in the first lines it printed.
    fn session_id(&self, span: Option<&LogSpan>) -> Option<String> {
        match (&self.conversation, self.preset) {
            (_, Preset::Aider) => Some(AIDER_SESSION.into()),
            (Conversation::New { id: Some(id) }, _) | (Conversation::Resume { id, .. }, _) => Some(id.clone()),
            (Conversation::New { id: None }, _) => self.read(span, &AgentExit::Success).usage.session,
        }
    }

    /// Saves the session for the next claimer (a hand-off, a stop at the deadline, a park):
    /// fenced, so a machine that lost the claim saves nothing. Failing is logged: the next
    /// machine then starts fresh, as before.
    pub(super) async fn carry(&self, store: &MachineStore, fence: Fence, span: Option<&LogSpan>) {
        let (Some(place), Some(id)) = (self.place.clone(), self.session_id(span)) else { return };
        let (preset, started) = (self.preset, Instant::now());
        let file = match &self.conversation {
            Conversation::Resume { file, .. } => file.clone(),
            Conversation::New { .. } => None,
        };
        let work = {
            let (id, secrets) = (id.clone(), self.secrets.clone());
            move || preset.capture(&place, &preset.continued_as(&place, &id, file.as_deref()), &secrets)
        };
        let captured = match tokio::task::spawn_blocking(work).await {
            Ok(Ok(c)) => c,
            Ok(Err(why)) => return tracing::warn!(job = fence.job, "the {preset} session is not carried: {why}"),
            Err(e) => return tracing::warn!(job = fence.job, error = %e, "the session capture stopped"),
        };
        let took_ms = started.elapsed().as_millis() as u64;
        let cwd = self.place.as_ref().map(|p| p.cwd.to_string_lossy().into_owned()).unwrap_or_default();
        let session = NewSession {
            agent: preset.name(),
            session_id: &captured.session_id,
            cwd: &cwd,
            bundle: &captured.bundle,
            raw_size: captured.raw_size,
            took_ms,
        };
        match retry::transient("saving the session", Budget::NOTE, || store.save_session(&fence, &session)).await {
            Ok(true) => tracing::info!(
                job = fence.job,
                raw = captured.raw_size,
                stored = captured.bundle.len(),
                took_ms,
                "carried the {preset} session {}",
                captured.session_id
            ),
            Ok(false) => tracing::info!(job = fence.job, "the claim is gone; the session is not carried"),
            Err(e) => tracing::warn!(job = fence.job, error = %e, "could not save the session"),
        }
    }

    /// Resolves, with the outcome, when the last thing the CLI printed has been a retry of a
    /// model call it cannot make for the preset's `api_timeout` (codex's "waiting for
    /// network" loop never ends on its own, and prints ever more rarely): failed, or parked
    /// when this machine has no network at all.
    pub(super) async fn api_stalled(&self, span: Option<LogSpan>) -> (AgentExit, String) {
        let Some(span) = span else { return std::future::pending().await };
        let mut since: Option<tokio::time::Instant> = None;
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let last = crate::agent::last_lines(&span.path, span.start, 1);
            if last.is_empty() || !self.preset.is_retry_line(&last) {
                since = None;
                continue;
            }
            let began = *since.get_or_insert_with(tokio::time::Instant::now);
            if began.elapsed() < self.api_timeout {
                continue;
            }
            let bound = humantime::format_duration(self.api_timeout);
            let line: String = last.chars().take(300).collect();
            let why = format!(
                "{} could not reach its model API for {bound} (api_timeout) and was stopped: {line}",
                self.preset
            );
            return if offline() {
                (AgentExit::TryLater, format!("{why}; this machine is offline, so the job waits"))
            } else {
                (AgentExit::Failed(why.clone()), why)
            };
        }
    }
}

/// Whether this machine has no route off itself (no network): a UDP "connect" sends
/// nothing, and fails at once when no interface can reach a public address.
fn offline() -> bool {
    let socket = std::net::UdpSocket::bind(("0.0.0.0", 0));
    socket.and_then(|s| s.connect(("192.0.2.1", 9))).is_err()
}

/// The first 64 KiB and the last 256 KiB of what the agent printed.
fn printed(span: &LogSpan) -> (String, String) {
    use std::io::{Read, Seek, SeekFrom};
    let read = |from: u64, max: u64| -> String {
        let Ok(Some(mut f)) = crate::safe_fs::open_regular(&span.path) else { return String::new() };
        let mut buf = vec![];
        if f.seek(SeekFrom::Start(from)).is_err() || f.take(max).read_to_end(&mut buf).is_err() {
            return String::new();
        }
        String::from_utf8_lossy(&buf).into_owned()
    };
    let len = std::fs::metadata(&span.path).map(|m| m.len()).unwrap_or(0);
    let tail_from = span.start.max(len.saturating_sub(256 * 1024));
    (read(span.start, 64 * 1024), read(tail_from, 256 * 1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0f6c1d2e-3b4a-4c5d-8e6f-7a8b9c0d1e2f";

    /// A claude session for a worktree at `cwd` saying `text`, in a fresh CLI directory.
    fn session(cwd: &str, text: &str) -> (tempfile::TempDir, SessionPlace, std::path::PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let place = SessionPlace { root: root.path().to_path_buf(), cwd: cwd.into() };
        let dir = root.path().join("projects").join(cwd.replace(|c: char| !c.is_ascii_alphanumeric(), "-"));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{ID}.jsonl"));
        std::fs::write(&file, format!("{{\"cwd\":\"{cwd}\",\"text\":\"{text}\"}}\n")).unwrap();
        (root, place, file)
    }

    /// Laptop, desktop, laptop: back on the laptop, its own older copy of the conversation is
    /// set aside (kept, never written over) and the desktop's is restored, so the agent goes
    /// on where the desktop stopped; on the machine that saved it, after a park, the CLI's
    /// own file is resumed as it is.
    #[tokio::test]
    async fn back_on_the_first_machine_the_carried_session_wins() {
        let cwd = "/data/worktrees/team/7";
        let (_desk, desk, _) = session(cwd, "part 2 on the desktop");
        let carried = Preset::Claude.capture(&desk, ID, &[]).unwrap();
        let saved = |machine: &str| SavedSession {
            job_id: 7,
            claim_token: 2,
            machine: machine.into(),
            agent: "claude".into(),
            session_id: ID.into(),
            cwd: cwd.into(),
            bundle: Some(carried.bundle.clone()),
            raw_size: carried.raw_size as i64,
            saved_at: 0,
        };
        let (_lap, laptop, file) = session(cwd, "part 1 on the laptop");
        let (talk, bytes) = restore(Preset::Claude, &laptop, &saved("desktop"), "laptop").await.unwrap();
        assert_eq!(talk, Conversation::Resume { id: ID.into(), file: None });
        assert!(bytes > 0);
        assert!(std::fs::read_to_string(&file).unwrap().contains("part 2 on the desktop"));
        let kept: Vec<String> = std::fs::read_dir(file.parent().unwrap())
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
            .filter(|t| t.contains("part 1 on the laptop"))
            .collect();
        assert_eq!(kept.len(), 1, "the laptop's own copy is set aside, not lost");
        let (_same, same, file) = session(cwd, "parked here");
        let (_, bytes) = restore(Preset::Claude, &same, &saved("laptop"), "laptop").await.unwrap();
        assert_eq!(bytes, 0);
        assert!(std::fs::read_to_string(&file).unwrap().contains("parked here"));
    }
}
