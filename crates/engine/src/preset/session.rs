//! The agent's conversation, carried across machines: where each CLI keeps a session, how it
//! is bundled (its files, as text, gzip-compressed, base64) and how the next machine puts it
//! back where its own CLI looks, with the old worktree path rewritten to the new one.
//!
//! - claude: `$CLAUDE_CONFIG_DIR` (or `~/.claude`) `/projects/<cwd, every character that is
//!   not a letter or a digit made '-'>/<session>.jsonl`, resumed with `--resume <session>`.
//! - codex: `$CODEX_HOME` (or `~/.codex`) `/sessions/YYYY/MM/DD/rollout-<time>-<session>.jsonl`,
//!   resumed with `codex exec resume <session>`.
//! - gemini: `~/.gemini/tmp/<slug of the cwd's name>/chats/session-<date>-<id8>.jsonl`,
//!   loaded with `--session-file` (from any directory).
//! - aider: `.aider.chat.history.md` in the worktree, read with `--restore-chat-history`.
//!
//! What comes back from the database was written by another machine, and a hostile agent
//! there could have shaped its files: a restored file goes only below the CLI's own
//! directory, by a relative path of plain names, never through a symlink, within the size
//! cap, and only for the preset that wrote it.

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::{Conversation, Preset};

/// The most of a session carried (uncompressed): a longer conversation starts fresh.
pub const SESSION_CAP: usize = 16 << 20;

/// Why a conversation is not carried or resumed; the history says so, and the agent starts
/// fresh.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{0}'s session file was not found")]
    Missing(Preset),
    #[error("the session is {0} bytes, more than the {SESSION_CAP} carried")]
    TooLarge(usize),
    #[error("the session was {saved}'s, and this machine runs {here}")]
    OtherAgent { saved: String, here: Preset },
    #[error("the session bundle is unreadable ({0})")]
    Unreadable(String),
    #[error("the session names a file outside {0}'s directory: {1}")]
    Outside(Preset, String),
    #[error("the worktree path is longer than claude's 200-character project name")]
    PathTooLong,
    #[error("cannot {what} {}: {source}", .path.display())]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
}

/// Where a preset's CLI keeps its state, as the agent's environment says.
#[derive(Clone, Debug)]
pub struct SessionPlace {
    /// The CLI's directory (`~/.claude`, `~/.codex`, `~/.gemini`; aider's: the worktree).
    pub root: PathBuf,
    /// The directory the agent runs in.
    pub cwd: PathBuf,
}

impl SessionPlace {
    /// Where `preset` keeps its state for an agent in `cwd`, given a variable of the agent's
    /// environment (`var`: the settings' own env first, then the runner's).
    pub fn of(preset: Preset, cwd: &Path, var: &dyn Fn(&str) -> Option<String>) -> Option<Self> {
        let home = || var("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
        let root = match preset {
            Preset::Claude => var("CLAUDE_CONFIG_DIR").map(PathBuf::from).or_else(|| Some(home()?.join(".claude"))),
            Preset::Codex => var("CODEX_HOME").map(PathBuf::from).or_else(|| Some(home()?.join(".codex"))),
            Preset::Gemini => Some(home()?.join(".gemini")),
            Preset::Aider => Some(cwd.to_path_buf()),
        }?;
        Some(Self { root, cwd: cwd.to_path_buf() })
    }
}

/// A session's files, relative to the CLI's directory, as text.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Bundle {
    files: Vec<BundleFile>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct BundleFile {
    path: String,
    text: String,
}

/// A captured session, ready to store.
#[derive(Clone, Debug)]
pub struct Captured {
    pub session_id: String,
    /// gzip, then base64.
    pub bundle: String,
    pub raw_size: usize,
}

/// The aider chat history's name, in the worktree.
const AIDER_HISTORY: &str = ".aider.chat.history.md";

impl Preset {
    /// Bundles the session `id` this preset's CLI wrote while running in `place.cwd`, with
    /// every one of `secrets` (the values of the API keys its CLI was given) blanked out:
    /// a key the CLI wrote into its own files never reaches the table.
    pub fn capture(self, place: &SessionPlace, id: &str, secrets: &[String]) -> Result<Captured, SessionError> {
        let files = self.session_files(place, id)?;
        let mut bundle = Bundle::default();
        let mut raw = 0;
        for rel in files {
            let path = place.root.join(&rel);
            let text = match crate::safe_fs::read_regular(&path, SESSION_CAP as u64) {
                Ok(crate::safe_fs::Found::Read(b)) => String::from_utf8_lossy(&b).into_owned(),
                Ok(crate::safe_fs::Found::Refused(why)) if why.contains("bytes") => {
                    return Err(SessionError::TooLarge(SESSION_CAP + 1))
                }
                Ok(_) => continue,
                Err(source) => return Err(SessionError::Io { what: "read", path, source }),
            };
            let text = secrets.iter().filter(|s| s.len() >= 8).fold(text, |t, s| t.replace(s.as_str(), "[redacted]"));
            raw += text.len();
            bundle.files.push(BundleFile { path: rel.to_string_lossy().into_owned(), text });
        }
        if bundle.files.is_empty() {
            return Err(SessionError::Missing(self));
        }
        if raw > SESSION_CAP {
            return Err(SessionError::TooLarge(raw));
        }
        let json = serde_json::to_vec(&bundle).map_err(|e| SessionError::Unreadable(e.to_string()))?;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let io = |source| SessionError::Io { what: "compress", path: place.root.clone(), source };
        gz.write_all(&json).map_err(io)?;
        let packed = gz.finish().map_err(io)?;
        let bundle = base64::engine::general_purpose::STANDARD.encode(packed);
        Ok(Captured { session_id: id.to_string(), bundle, raw_size: raw })
    }

    /// Puts a carried session back where this preset's CLI looks for it on this machine,
    /// with the worktree path it was written under (`old_cwd`) rewritten to `place.cwd`, and
    /// says how the CLI resumes it. Returns the bytes written.
    pub fn restore(
        self,
        place: &SessionPlace,
        id: &str,
        old_cwd: &str,
        bundle: &str,
    ) -> Result<(Conversation, usize), SessionError> {
        // The id goes into the CLI's argv: a plain name, never something it reads as a flag.
        plain_id(id)?;
        let bundle = unpack(bundle)?;
        let new_cwd = place.cwd.to_string_lossy();
        // A machine whose CLI never ran yet has no directory for it.
        std::fs::create_dir_all(&place.root).map_err(|source| SessionError::Io {
            what: "create",
            path: place.root.clone(),
            source,
        })?;
        let mut written = 0;
        let mut file = None;
        for f in &bundle.files {
            let rel = self.placed(&f.path, old_cwd, &new_cwd)?;
            // An empty path would "match" between every character.
            let text = match old_cwd.len() > 1 && old_cwd != new_cwd {
                true => f.text.replace(old_cwd, &new_cwd),
                false => f.text.clone(),
            };
            crate::safe_fs::write_beneath(&place.root, &rel, &mut text.as_bytes(), 0o600)
                .map_err(|source| SessionError::Io { what: "write", path: place.root.join(&rel), source })?;
            written += text.len();
            file.get_or_insert(place.root.join(&rel));
        }
        let file = match self {
            Preset::Gemini => file,
            _ => None,
        };
        Ok((Conversation::Resume { id: id.to_string(), file }, written))
    }

    /// The session an attempt that resumed session `id` continued as, which is the one to
    /// carry on: gemini (0.61) imports the file given by `--session-file` into a new session
    /// with a new id, whose first message names that file; the others keep the id.
    pub fn continued_as(self, place: &SessionPlace, id: &str, file: Option<&Path>) -> String {
        match (self, file) {
            (Preset::Gemini, Some(file)) => gemini_import(place, file).unwrap_or_else(|| id.to_string()),
            _ => id.to_string(),
        }
    }

    /// The files of session `id`, relative to the CLI's directory.
    fn session_files(self, place: &SessionPlace, id: &str) -> Result<Vec<PathBuf>, SessionError> {
        plain_id(id)?;
        Ok(match self {
            Preset::Claude => {
                vec![PathBuf::from("projects")
                    .join(claude_project(&place.cwd.to_string_lossy())?)
                    .join(format!("{id}.jsonl"))]
            }
            Preset::Codex => find(&place.root, Path::new("sessions"), 4, &|name, _| {
                name.starts_with("rollout-") && name.ends_with(&format!("{id}.jsonl"))
            }),
            Preset::Gemini => find(&place.root, Path::new("tmp"), 3, &|name, path| {
                // `session-<date>-<first 8 of the id>.jsonl` (0.61), holding the whole id.
                name.starts_with("session-") && name.contains(id.get(..8).unwrap_or(id)) && file_mentions(path, id)
            }),
            Preset::Aider => vec![PathBuf::from(AIDER_HISTORY)],
        })
    }

    /// Where a carried file goes on this machine: checked to stay below the CLI's directory
    /// and within its own part of it; claude's project directory renamed for the new path.
    fn placed(self, rel: &str, old_cwd: &str, new_cwd: &str) -> Result<PathBuf, SessionError> {
        let path = Path::new(rel);
        let outside = || SessionError::Outside(self, rel.to_string());
        if !path.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(outside());
        }
        let first = path.components().next().map(|c| c.as_os_str().to_string_lossy().into_owned());
        match (self, first.as_deref()) {
            (Preset::Claude, Some("projects")) => {
                let name = path.file_name().ok_or_else(outside)?;
                let old = claude_project(old_cwd)?;
                if path != Path::new("projects").join(&old).join(name) {
                    return Err(outside());
                }
                Ok(PathBuf::from("projects").join(claude_project(new_cwd)?).join(name))
            }
            // Only the shapes `session_files` finds: `sessions/…/rollout-*.jsonl`,
            // `tmp/<project>/chats/session-*`, the history file itself.
            (Preset::Codex, Some("sessions")) if named(path, "rollout-", ".jsonl") => Ok(path.to_path_buf()),
            (Preset::Gemini, Some("tmp"))
                if path.components().count() == 4 && path.parent().is_some_and(|p| p.ends_with("chats")) =>
            {
                named(path, "session-", "").then(|| path.to_path_buf()).ok_or_else(outside)
            }
            (Preset::Aider, _) if path == Path::new(AIDER_HISTORY) => Ok(path.to_path_buf()),
            _ => Err(outside()),
        }
    }
}

/// Whether the file name of `path` starts with `prefix` and ends with `suffix`.
fn named(path: &Path, prefix: &str, suffix: &str) -> bool {
    path.file_name().map(|n| n.to_string_lossy()).is_some_and(|n| n.starts_with(prefix) && n.ends_with(suffix))
}

/// `id` if it is a plain session id: letters, digits, '-' and '_', not starting with '-'.
fn plain_id(id: &str) -> Result<(), SessionError> {
    let plain = id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    match plain && !id.is_empty() && !id.starts_with('-') && id.len() <= 200 {
        true => Ok(()),
        false => Err(SessionError::Unreadable(format!("'{}' is not a session id", id.escape_debug()))),
    }
}

/// claude's project directory for `cwd`: every character that is not an ASCII letter or
/// digit becomes '-' (claude hashes a longer name; that is not carried).
fn claude_project(cwd: &str) -> Result<String, SessionError> {
    let name: String = cwd.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    if name.len() > 200 {
        return Err(SessionError::PathTooLong);
    }
    Ok(name)
}

/// The files below `root/dir` (at most `depth` levels, never through a symlink) whose name
/// and path `keep` accepts, relative to `root`.
fn find(root: &Path, dir: &Path, depth: usize, keep: &dyn Fn(&str, &Path) -> bool) -> Vec<PathBuf> {
    let mut found = vec![];
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else { return found };
    for e in entries.flatten() {
        let Ok(kind) = e.file_type() else { continue };
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = dir.join(&name);
        if kind.is_dir() && depth > 0 {
            found.extend(find(root, &rel, depth - 1, keep));
        } else if kind.is_file() && keep(&name, &e.path()) {
            found.push(rel);
        }
    }
    found.sort();
    found
}

/// The newest gemini session that imported `from` ("Imported session from <file>" is its
/// first message): its id, from its first line.
fn gemini_import(place: &SessionPlace, from: &Path) -> Option<String> {
    let mark = format!("Imported session from {}", from.display());
    let mut found = find(&place.root, Path::new("tmp"), 3, &|name, path| {
        name.starts_with("session-") && file_mentions(path, &mark)
    });
    // `session-<unix ms>-<id8>.jsonl`: by name is by time.
    found.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    found.iter().rev().find_map(|rel| {
        let Ok(crate::safe_fs::Found::Read(b)) =
            crate::safe_fs::read_regular(&place.root.join(rel), SESSION_CAP as u64)
        else {
            return None;
        };
        let first = b.split(|c| *c == b'\n').next()?;
        let meta: serde_json::Value = serde_json::from_slice(first).ok()?;
        let id = meta.get("sessionId")?.as_str()?;
        plain_id(id).ok().map(|()| id.to_string())
    })
}

/// Whether the small file at `path` mentions `id` (gemini names its files by time).
fn file_mentions(path: &Path, id: &str) -> bool {
    match crate::safe_fs::read_regular(path, SESSION_CAP as u64) {
        Ok(crate::safe_fs::Found::Read(b)) => String::from_utf8_lossy(&b).contains(id),
        _ => false,
    }
}

/// A stored bundle, back to its files.
fn unpack(bundle: &str) -> Result<Bundle, SessionError> {
    let bad = |e: &dyn std::fmt::Display| SessionError::Unreadable(e.to_string());
    let packed = base64::engine::general_purpose::STANDARD.decode(bundle.trim()).map_err(|e| bad(&e))?;
    let mut json = vec![];
    let gz = flate2::read::GzDecoder::new(packed.as_slice());
    gz.take(SESSION_CAP as u64 + 1024 * 1024).read_to_end(&mut json).map_err(|e| bad(&e))?;
    serde_json::from_slice(&json).map_err(|e| bad(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claude session written under one worktree comes back under another: the project
    /// directory renamed and the old path rewritten inside; a hostile path is refused.
    #[test]
    fn a_session_moves_between_worktrees() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (old_cwd, new_cwd) = ("/home/ann/wt/job-7", "/srv/bob/worktrees/job-7");
        let here = SessionPlace { root: a.path().to_path_buf(), cwd: old_cwd.into() };
        let dir = a.path().join("projects").join(claude_project(old_cwd).unwrap());
        std::fs::create_dir_all(&dir).unwrap();
        let line = format!("{{\"cwd\":\"{old_cwd}\",\"text\":\"part 1\",\"key\":\"sk-ant-secret-1\"}}\n");
        std::fs::write(dir.join("abc-1.jsonl"), line).unwrap();
        let c = Preset::Claude.capture(&here, "abc-1", &["sk-ant-secret-1".into()]).unwrap();
        assert!(c.raw_size > 20);
        let there = SessionPlace { root: b.path().to_path_buf(), cwd: new_cwd.into() };
        let (talk, n) = Preset::Claude.restore(&there, "abc-1", old_cwd, &c.bundle).unwrap();
        assert_eq!(talk, Conversation::Resume { id: "abc-1".into(), file: None });
        let back =
            std::fs::read_to_string(b.path().join("projects").join("-srv-bob-worktrees-job-7").join("abc-1.jsonl"))
                .unwrap();
        assert_eq!((back.contains(new_cwd), back.contains(old_cwd), n), (true, false, back.len()));
        assert!(!back.contains("sk-ant-secret-1") && back.contains("[redacted]"), "{back}");
        // Another preset's bundle, or a path that climbs out, is refused.
        assert!(matches!(Preset::Codex.restore(&there, "abc-1", old_cwd, &c.bundle), Err(SessionError::Outside(..))));
        assert!(Preset::Claude.placed("projects/../../.ssh/x", old_cwd, new_cwd).is_err());
        assert!(Preset::Aider.placed(".aider.chat.history.md/x", old_cwd, new_cwd).is_err());
        assert!(Preset::Codex.placed("sessions/2026/12/03/notes.txt", old_cwd, new_cwd).is_err());
        assert!(Preset::Gemini.placed("tmp/p/chats/session-1.jsonl", old_cwd, new_cwd).is_ok());
        assert!(Preset::Gemini.placed("tmp/settings.json", old_cwd, new_cwd).is_err());
        assert!(Preset::Claude.restore(&there, "--help", old_cwd, &c.bundle).is_err(), "an id is never a flag");
        assert!(Preset::Claude.capture(&here, "../x", &[]).is_err());
        assert!(matches!(Preset::Claude.capture(&there, "nope", &[]), Err(SessionError::Missing(_))));
    }

    /// A gemini session resumed with `--session-file` goes on under a new id (its first
    /// message names the file it imported): that session is the one carried next, not the
    /// copy it was given; the other presets keep their id.
    #[test]
    fn a_resumed_gemini_session_is_carried_under_its_new_id() {
        let home = tempfile::tempdir().unwrap();
        let place = SessionPlace { root: home.path().to_path_buf(), cwd: "/w/job-7".into() };
        let chats = home.path().join("tmp/job-7/chats");
        std::fs::create_dir_all(&chats).unwrap();
        let given = chats.join("session-2026-12-03T08-00-aaaaaaaa.jsonl");
        std::fs::write(&given, "{\"sessionId\":\"aaaaaaaa-1\"}\n{\"type\":\"user\",\"content\":\"part 1\"}\n").unwrap();
        let imported = |ms: u64, id: &str| {
            let info = format!("{{\"type\":\"info\",\"content\":\"Imported session from {}\"}}", given.display());
            let text = format!("{{\"sessionId\":\"{id}\"}}\n{info}\n{{\"type\":\"gemini\",\"content\":\"part 2\"}}\n");
            std::fs::write(chats.join(format!("session-{ms}-{}.jsonl", &id[..8])), text).unwrap();
        };
        assert_eq!(Preset::Gemini.continued_as(&place, "aaaaaaaa-1", Some(&given)), "aaaaaaaa-1", "none yet");
        imported(1_764_000_000_000, "bbbbbbbb-2");
        imported(1_764_000_000_500, "cccccccc-3");
        assert_eq!(Preset::Gemini.continued_as(&place, "aaaaaaaa-1", Some(&given)), "cccccccc-3", "the newest");
        let c = Preset::Gemini.capture(&place, "cccccccc-3", &[]).unwrap();
        assert_eq!(c.session_id, "cccccccc-3");
        assert_eq!(Preset::Claude.continued_as(&place, "aaaaaaaa-1", Some(&given)), "aaaaaaaa-1");
    }
}
