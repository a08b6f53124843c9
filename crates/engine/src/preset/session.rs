//! The agent's conversation, carried across machines: where each CLI keeps a session, how it
//! is bundled (its file, as text, zstd-compressed, base64) and how the next machine puts it
//! back where its own CLI looks, with the old worktree path rewritten to the new one.
//!
//! - claude: `$CLAUDE_CONFIG_DIR` (or `~/.claude`) `/projects/<cwd, every character that is
//!   not a letter or a digit made '-'>/<session>.jsonl`, resumed with `--resume <session>`.
//! - codex: `$CODEX_HOME` (or `~/.codex`)
//!   `/sessions/YYYY/MM/DD/rollout-YYYY-MM-DDThh-mm-ss-<session>.jsonl`, resumed with
//!   `codex exec resume <session>`.
//! - gemini: `~/.gemini/tmp/<project>/chats/session-<time>-<first 8 of the id>.jsonl` (the
//!   time as `YYYY-MM-DDThh-mm`, or in ms for an imported one), whose first line names the
//!   whole id; loaded with `--session-file` (from any directory).
//! - aider: `.aider.chat.history.md` in the worktree, read with `--restore-chat-history`.
//!
//! Each CLI keeps a session in one file, named for its id (a UUID; aider has none). What comes
//! back from the database was written by another machine, and a hostile agent or a plain SQL
//! writer there could have shaped it. So the restore takes one file, only by the exact name
//! of the job's own session for the preset that wrote it, below the CLI's own directory,
//! never through a symlink and never in place of a file that is there; it counts the bytes
//! it writes (the old path rewritten to the new one, from an absolute old path of at most
//! 4096 bytes) against the cap before writing any, and unpacks at most twice that. Capture
//! takes only that same exact name.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use devpilot_store::queue::{SESSION_BUNDLE_CAP, SESSION_CWD_CAP};
use serde::{Deserialize, Serialize};

use super::{Conversation, Preset};

/// The most of a session carried (uncompressed): a longer conversation starts fresh. The
/// restore writes no more either, the worktree path rewritten.
pub const SESSION_CAP: usize = 16 << 20;

/// The most files a bundle holds: each CLI keeps a session in one.
pub const SESSION_FILES: usize = 1;

/// The most JSON a bundle unpacks to: the text, escaped (a session of JSON lines is full of
/// quotes), is at most twice as long.
const BUNDLE_JSON_CAP: usize = 2 * SESSION_CAP;

/// The id aider's chat history is carried under (it has no session id).
pub const AIDER_SESSION: &str = "chat-history";

/// Why a conversation is not carried or resumed; the history says so, and the agent starts
/// fresh.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{0}'s session file was not found")]
    Missing(Preset),
    #[error("the session is {0} bytes, more than the {SESSION_CAP} carried")]
    TooLarge(usize),
    #[error("the session's {what} is more than the {cap} bytes it may be")]
    OverCap { what: &'static str, cap: usize },
    #[error(
        "the restored session would be {0} bytes with the worktree path rewritten, more than the {SESSION_CAP} written"
    )]
    Expands(usize),
    #[error("the session bundle holds {0} files; {1} keeps a session in {SESSION_FILES}")]
    TooManyFiles(usize, Preset),
    #[error("{0} files of {1}'s session {2} were found; one is carried")]
    Ambiguous(usize, Preset, String),
    #[error("{} is already on this machine; a carried session never replaces a file", .0.display())]
    Exists(PathBuf),
    #[error("'{0}' is not the absolute path of a worktree (at least two names, at most {SESSION_CWD_CAP} bytes)")]
    BadCwd(String),
    #[error("'{id}' is not a {preset} session id ({want})")]
    BadId { id: String, preset: Preset, want: &'static str },
    #[error("the session was {saved}'s, and this machine runs {here}")]
    OtherAgent { saved: String, here: Preset },
    #[error("the session bundle is unreadable ({0})")]
    Unreadable(String),
    #[error("the session names a file that is not {0}'s session {2}: {1}")]
    Outside(Preset, String, String),
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
    /// zstd, then base64.
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
        let rel = self.session_file(place, id)?;
        let path = place.root.join(&rel);
        let text = match crate::safe_fs::read_regular(&path, SESSION_CAP as u64) {
            Ok(crate::safe_fs::Found::Read(b)) => String::from_utf8_lossy(&b).into_owned(),
            Ok(crate::safe_fs::Found::Refused(why)) if why.contains("bytes") => {
                return Err(SessionError::TooLarge(SESSION_CAP + 1))
            }
            Ok(_) => return Err(SessionError::Missing(self)),
            Err(source) => return Err(SessionError::Io { what: "read", path, source }),
        };
        let text = secrets.iter().filter(|s| s.len() >= 8).fold(text, |t, s| t.replace(s.as_str(), "[redacted]"));
        let raw = text.len();
        if raw > SESSION_CAP {
            return Err(SessionError::TooLarge(raw));
        }
        let bundle = Bundle { files: vec![BundleFile { path: rel.to_string_lossy().into_owned(), text }] };
        let bundle = pack(&bundle).map_err(|e| match e {
            SessionError::Io { what, source, .. } => SessionError::Io { what, path: place.root.clone(), source },
            e => e,
        })?;
        Ok(Captured { session_id: id.to_string(), bundle, raw_size: raw })
    }

    /// Puts a carried session back where this preset's CLI looks for it on this machine,
    /// with the worktree path it was written under (`old_cwd`) rewritten to `place.cwd`, and
    /// says how the CLI resumes it. Returns the bytes written. Everything is checked before
    /// the first byte is written: nothing is written for a bundle that is refused.
    pub fn restore(
        self,
        place: &SessionPlace,
        id: &str,
        old_cwd: &str,
        bundle: &str,
    ) -> Result<(Conversation, usize), SessionError> {
        // The id goes into the CLI's argv and names its file.
        self.check_id(id)?;
        check_cwd(old_cwd)?;
        let new_cwd = place.cwd.to_string_lossy();
        let planned = self.plan(&unpack(bundle)?, id, old_cwd, &new_cwd)?;
        if let Some((rel, _)) = planned.iter().find(|(rel, _)| std::fs::symlink_metadata(place.root.join(rel)).is_ok())
        {
            return Err(SessionError::Exists(place.root.join(rel)));
        }
        // A machine whose CLI never ran yet has no directory for it.
        std::fs::create_dir_all(&place.root).map_err(|source| SessionError::Io {
            what: "create",
            path: place.root.clone(),
            source,
        })?;
        let mut written = 0;
        let mut file = None;
        for (rel, text) in &planned {
            let path = place.root.join(rel);
            crate::safe_fs::create_beneath(&place.root, rel, &mut text.as_bytes(), 0o600).map_err(
                |source| match source.kind() {
                    std::io::ErrorKind::AlreadyExists => SessionError::Exists(path.clone()),
                    _ => SessionError::Io { what: "write", path: path.clone(), source },
                },
            )?;
            written += text.len();
            file.get_or_insert(path);
        }
        let file = match self {
            Preset::Gemini => file,
            _ => None,
        };
        Ok((Conversation::Resume { id: id.to_string(), file }, written))
    }

    /// What a restore writes: each file's place and its text, the old path rewritten. Refuses
    /// more files than the CLI keeps, a name that is not the session's own, and more bytes
    /// than the cap, counted before anything is rewritten.
    fn plan(
        self,
        bundle: &Bundle,
        id: &str,
        old_cwd: &str,
        new_cwd: &str,
    ) -> Result<Vec<(PathBuf, String)>, SessionError> {
        match bundle.files.len() {
            0 => return Err(SessionError::Missing(self)),
            n if n > SESSION_FILES => return Err(SessionError::TooManyFiles(n, self)),
            _ => {}
        }
        let rewrite = old_cwd != new_cwd;
        let mut total = 0usize;
        let mut planned = vec![];
        for f in &bundle.files {
            let rel = self.placed(&f.path, id, old_cwd, new_cwd)?;
            if self == Preset::Gemini && !names_session(&f.text, id) {
                return Err(SessionError::Outside(self, f.path.clone(), id.to_string()));
            }
            total = total.saturating_add(if rewrite { rewritten_len(&f.text, old_cwd, new_cwd) } else { f.text.len() });
            if total > SESSION_CAP {
                return Err(SessionError::Expands(total));
            }
            planned.push((rel, if rewrite { f.text.replace(old_cwd, new_cwd) } else { f.text.clone() }));
        }
        Ok(planned)
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

    /// Whether `id` is exactly a session id of this preset's CLI: a UUID in its usual form
    /// (claude, codex and gemini all name sessions so), or aider's fixed name.
    fn check_id(self, id: &str) -> Result<(), SessionError> {
        let (ok, want) = match self {
            Preset::Aider => (id == AIDER_SESSION, "aider's is 'chat-history'"),
            _ => (uuid::Uuid::try_parse(id).is_ok_and(|u| u.hyphenated().to_string() == id), "a UUID"),
        };
        match ok {
            true => Ok(()),
            false => Err(SessionError::BadId { id: shown(id), preset: self, want }),
        }
    }

    /// The one file of session `id`, relative to the CLI's directory, found by its exact name
    /// (gemini's also by the id its first line names).
    fn session_file(self, place: &SessionPlace, id: &str) -> Result<PathBuf, SessionError> {
        self.check_id(id)?;
        let cwd = place.cwd.to_string_lossy();
        let (dir, depth) = match self {
            Preset::Claude => return claude_file(&cwd, id),
            Preset::Aider => return Ok(PathBuf::from(AIDER_HISTORY)),
            Preset::Codex => ("sessions", 4),
            Preset::Gemini => ("tmp", 3),
        };
        let mut found = find(&place.root, Path::new(dir), depth, &|rel, path| {
            self.is_session_file(rel, id, &cwd) && (self != Preset::Gemini || file_names_session(path, id))
        });
        // gemini (0.61) goes on with an imported session in the file it imported it to
        // (`session-<ms>-…`), and also starts one by the time under the same id that holds only
        // its setup: the imported one is the conversation.
        if self == Preset::Gemini && found.iter().any(|f| gemini_imported(f, id)) {
            found.retain(|f| gemini_imported(f, id));
        }
        match found.as_slice() {
            [] => Err(SessionError::Missing(self)),
            [one] => Ok(one.clone()),
            more => Err(SessionError::Ambiguous(more.len(), self, id.to_string())),
        }
    }

    /// Whether `rel` (below the CLI's directory) is exactly where this preset's CLI keeps
    /// session `id` for an agent in `cwd`.
    fn is_session_file(self, rel: &Path, id: &str, cwd: &str) -> bool {
        let parts: Vec<&str> = rel.components().map(|c| c.as_os_str().to_str().unwrap_or("\0")).collect();
        match (self, parts.as_slice()) {
            (Preset::Claude, _) => claude_file(cwd, id).is_ok_and(|f| f == rel),
            (Preset::Codex, ["sessions", y, m, d, name]) => {
                let stamp = name.strip_prefix("rollout-").and_then(|n| n.strip_suffix(&format!("-{id}.jsonl")));
                shaped(y, "dddd")
                    && shaped(m, "dd")
                    && shaped(d, "dd")
                    && stamp.is_some_and(|t| shaped(t, "dddd-dd-ddTdd-dd-dd"))
            }
            (Preset::Gemini, ["tmp", project, "chats", name]) => {
                let short = id.get(..8).unwrap_or(id);
                let stamp = name.strip_prefix("session-").and_then(|n| n.strip_suffix(&format!("-{short}.jsonl")));
                plain_name(project) && stamp.is_some_and(|t| shaped(t, "dddd-dd-ddTdd-dd") || in_ms(t))
            }
            (Preset::Aider, [name]) => *name == AIDER_HISTORY,
            _ => false,
        }
    }

    /// Where a carried file goes on this machine: only the exact place of session `id`
    /// (checked against the path it was written under); claude's project directory renamed
    /// for the new path.
    fn placed(self, rel: &str, id: &str, old_cwd: &str, new_cwd: &str) -> Result<PathBuf, SessionError> {
        let path = Path::new(rel);
        let outside = || SessionError::Outside(self, shown(rel), id.to_string());
        if !path.components().all(|c| matches!(c, Component::Normal(_))) || !self.is_session_file(path, id, old_cwd) {
            return Err(outside());
        }
        match self {
            Preset::Claude => claude_file(new_cwd, id),
            _ => Ok(path.to_path_buf()),
        }
    }
}

/// Whether `stamp` is a time in ms, as gemini names an imported session's file.
fn in_ms(stamp: &str) -> bool {
    (1..=16).contains(&stamp.len()) && stamp.bytes().all(|b| b.is_ascii_digit())
}

/// Whether gemini's file `rel` of session `id` is named as an imported session's.
fn gemini_imported(rel: &Path, id: &str) -> bool {
    let name = rel.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    let short = id.get(..8).unwrap_or(id);
    name.strip_prefix("session-").and_then(|n| n.strip_suffix(&format!("-{short}.jsonl"))).is_some_and(in_ms)
}

/// Whether `text` has the shape `pattern`: a 'd' is any ASCII digit, anything else itself.
fn shaped(text: &str, pattern: &str) -> bool {
    text.len() == pattern.len()
        && text.bytes().zip(pattern.bytes()).all(|(t, p)| if p == b'd' { t.is_ascii_digit() } else { t == p })
}

/// A directory name a CLI made: not empty, no '/', not `.` or `..`.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/')
}

/// `text`, cut to 100 characters and escaped, to show in an error.
fn shown(text: &str) -> String {
    let cut: String = text.chars().take(100).collect();
    cut.escape_debug().to_string()
}

/// The old worktree path a session was stored with, as another machine wrote it: an absolute
/// path of plain names in its usual form (no `//`, no trailing `/`), at least two of them (a
/// shorter one would rewrite text that is not a path) and at most [`SESSION_CWD_CAP`] bytes.
fn check_cwd(cwd: &str) -> Result<(), SessionError> {
    let path = Path::new(cwd);
    let mut parts = path.components();
    let ok = cwd.len() <= SESSION_CWD_CAP
        && parts.next() == Some(Component::RootDir)
        && parts.clone().all(|c| matches!(c, Component::Normal(_)))
        && parts.count() >= 2
        && path.components().collect::<PathBuf>().as_os_str() == cwd;
    match ok {
        true => Ok(()),
        false => Err(SessionError::BadCwd(shown(cwd))),
    }
}

/// How long `text` is once every `old` in it is `new`, without rewriting it.
fn rewritten_len(text: &str, old: &str, new: &str) -> usize {
    let n = text.matches(old).count();
    (text.len() - n * old.len()).saturating_add(n.saturating_mul(new.len()))
}

/// claude's file of session `id` for an agent in `cwd`: `projects/<project>/<id>.jsonl`,
/// where the project is `cwd` with every character that is not an ASCII letter or digit
/// made '-' (claude hashes a name over 200 characters; that is not carried).
fn claude_file(cwd: &str, id: &str) -> Result<PathBuf, SessionError> {
    let name: String = cwd.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    if name.len() > 200 {
        return Err(SessionError::PathTooLong);
    }
    Ok(PathBuf::from("projects").join(name).join(format!("{id}.jsonl")))
}

/// The files below `root/dir` (at most `depth` levels, never through a symlink) whose path
/// relative to `root`, and full path, `keep` accepts; relative to `root`.
fn find(root: &Path, dir: &Path, depth: usize, keep: &dyn Fn(&Path, &Path) -> bool) -> Vec<PathBuf> {
    let mut found = vec![];
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else { return found };
    for e in entries.flatten() {
        let Ok(kind) = e.file_type() else { continue };
        let rel = dir.join(e.file_name());
        if kind.is_dir() && depth > 0 {
            found.extend(find(root, &rel, depth - 1, keep));
        } else if kind.is_file() && keep(&rel, &e.path()) {
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
    let mut found = find(&place.root, Path::new("tmp"), 3, &|rel, path| {
        rel.file_name().is_some_and(|n| n.to_string_lossy().starts_with("session-")) && file_mentions(path, &mark)
    });
    // `session-<unix ms>-<id8>.jsonl`: by name is by time.
    found.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    found.iter().rev().find_map(|rel| {
        let text = read_small(&place.root.join(rel))?;
        let id = first_session_id(&text)?;
        Preset::Gemini.check_id(&id).ok().map(|()| id)
    })
}

/// The file at `path`, if it is a regular file within the cap.
fn read_small(path: &Path) -> Option<String> {
    match crate::safe_fs::read_regular(path, SESSION_CAP as u64) {
        Ok(crate::safe_fs::Found::Read(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
        _ => None,
    }
}

/// Whether the small file at `path` mentions `text`.
fn file_mentions(path: &Path, text: &str) -> bool {
    read_small(path).is_some_and(|t| t.contains(text))
}

/// Whether the file at `path` is gemini's session `id` by its first line.
fn file_names_session(path: &Path, id: &str) -> bool {
    read_small(path).is_some_and(|t| names_session(&t, id))
}

/// Whether a gemini session file's first line (its metadata) names exactly session `id`.
fn names_session(text: &str, id: &str) -> bool {
    first_session_id(text).is_some_and(|s| s == id)
}

/// The `sessionId` of a gemini session file's first line.
fn first_session_id(text: &str) -> Option<String> {
    let meta: serde_json::Value = serde_json::from_str(text.lines().next()?).ok()?;
    Some(meta.get("sessionId")?.as_str()?.to_string())
}

/// How hard a bundle is compressed: zstd's level 6 packs a 6 MB claude session to 1.2 MB
/// in about 80 ms (gzip's default: 1.9 MB in 250 ms), and on a slow link every megabyte
/// is most of a second of the hand-off. Its window (2 MB at this level) finds the same text
/// twice in a session (claude keeps each file it read in the message and in the tool's
/// result) where gzip's 32 KB do not.
const ZSTD_LEVEL: i32 = 6;
/// The largest window a stored bundle may ask its decoder for (16 MB): another machine wrote
/// it, and the window is memory.
const ZSTD_WINDOW_LOG_MAX: u32 = 24;
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// A bundle, as it is stored: its JSON zstd-compressed, as base64. Refuses one over the caps
/// a restore reads.
fn pack(bundle: &Bundle) -> Result<String, SessionError> {
    let json = serde_json::to_vec(bundle).map_err(|e| SessionError::Unreadable(e.to_string()))?;
    if json.len() > BUNDLE_JSON_CAP {
        return Err(SessionError::OverCap { what: "bundle, unpacked", cap: BUNDLE_JSON_CAP });
    }
    let io = |source| SessionError::Io { what: "compress", path: PathBuf::new(), source };
    let packed = base64::engine::general_purpose::STANDARD.encode(zstd::bulk::compress(&json, ZSTD_LEVEL).map_err(io)?);
    if packed.len() > SESSION_BUNDLE_CAP {
        return Err(SessionError::OverCap { what: "bundle", cap: SESSION_BUNDLE_CAP });
    }
    Ok(packed)
}

/// A stored bundle, back to its files: decoded only within the stored cap, and unpacked
/// only up to [`BUNDLE_JSON_CAP`] (the decompression stops there; it never runs on). A
/// bundle is zstd, or gzip as machines before zstd stored it.
fn unpack(bundle: &str) -> Result<Bundle, SessionError> {
    let bad = |e: &dyn std::fmt::Display| SessionError::Unreadable(e.to_string());
    let bundle = bundle.trim();
    if bundle.len() > SESSION_BUNDLE_CAP {
        return Err(SessionError::OverCap { what: "bundle", cap: SESSION_BUNDLE_CAP });
    }
    let packed = base64::engine::general_purpose::STANDARD.decode(bundle).map_err(|e| bad(&e))?;
    let cap = BUNDLE_JSON_CAP as u64 + 1;
    let mut json = vec![];
    if packed.starts_with(&ZSTD_MAGIC) {
        // One frame: a second (a legacy one, say) is never read, so the window cap holds.
        let mut z = zstd::stream::read::Decoder::new(packed.as_slice()).map_err(|e| bad(&e))?.single_frame();
        z.window_log_max(ZSTD_WINDOW_LOG_MAX).map_err(|e| bad(&e))?;
        z.take(cap).read_to_end(&mut json).map_err(|e| bad(&e))?;
    } else if packed.starts_with(&GZIP_MAGIC) {
        flate2::read::GzDecoder::new(packed.as_slice()).take(cap).read_to_end(&mut json).map_err(|e| bad(&e))?;
    } else {
        return Err(bad(&"neither zstd nor gzip"));
    }
    if json.len() > BUNDLE_JSON_CAP {
        return Err(SessionError::OverCap { what: "bundle, unpacked", cap: BUNDLE_JSON_CAP });
    }
    serde_json::from_slice(&json).map_err(|e| bad(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// The session id of these tests, and another session's whose id ends like it and
    /// starts with the same 8 characters.
    const ID: &str = "0b6c3a8e-3d1f-4a2b-9c8d-7e6f5a4b3c21";
    const OTHER: &str = "0b6c3a8e-0000-4000-8000-000000000021";

    /// A bundle as another machine may store it: these files, as JSON, gzip, base64.
    fn bundle_of(files: &[(&str, &str)]) -> String {
        let files: Vec<_> = files.iter().map(|(p, t)| serde_json::json!({"path": p, "text": t})).collect();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(serde_json::json!({ "files": files }).to_string().as_bytes()).unwrap();
        base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap())
    }

    /// Every file below `dir`.
    fn files_below(dir: &Path) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
        entries
            .flatten()
            .flat_map(|e| match e.file_type().unwrap().is_dir() {
                true => files_below(&e.path()),
                false => vec![e.path()],
            })
            .collect()
    }

    /// codex's file of session `id`, started at `time` (`hh-mm-ss`).
    fn rollout(time: &str, id: &str) -> String {
        format!("sessions/2026/12/03/rollout-2026-12-03T{time}-{id}.jsonl")
    }

    /// A claude session written under one worktree comes back under another: the project
    /// directory renamed and the old path rewritten inside; a hostile path is refused.
    #[test]
    fn a_session_moves_between_worktrees() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (old_cwd, new_cwd) = ("/home/ann/wt/job-7", "/srv/bob/worktrees/job-7");
        let here = SessionPlace { root: a.path().to_path_buf(), cwd: old_cwd.into() };
        let dir = a.path().join("projects").join("-home-ann-wt-job-7");
        std::fs::create_dir_all(&dir).unwrap();
        let line = format!("{{\"cwd\":\"{old_cwd}\",\"text\":\"part 1\",\"key\":\"sk-ant-secret-1\"}}\n");
        std::fs::write(dir.join(format!("{ID}.jsonl")), line).unwrap();
        let c = Preset::Claude.capture(&here, ID, &["sk-ant-secret-1".into()]).unwrap();
        assert!(c.raw_size > 20);
        let there = SessionPlace { root: b.path().to_path_buf(), cwd: new_cwd.into() };
        let (talk, n) = Preset::Claude.restore(&there, ID, old_cwd, &c.bundle).unwrap();
        assert_eq!(talk, Conversation::Resume { id: ID.into(), file: None });
        let back = b.path().join("projects").join("-srv-bob-worktrees-job-7").join(format!("{ID}.jsonl"));
        let back = std::fs::read_to_string(back).unwrap();
        assert_eq!((back.contains(new_cwd), back.contains(old_cwd), n), (true, false, back.len()));
        assert!(!back.contains("sk-ant-secret-1") && back.contains("[redacted]"), "{back}");
        // Another preset's bundle, or a path that climbs out, is refused.
        assert!(matches!(Preset::Codex.restore(&there, ID, old_cwd, &c.bundle), Err(SessionError::Outside(..))));
        assert!(Preset::Claude.placed(&format!("projects/../../.ssh/{ID}.jsonl"), ID, old_cwd, new_cwd).is_err());
        assert!(Preset::Aider.placed(".aider.chat.history.md/x", AIDER_SESSION, old_cwd, new_cwd).is_err());
        assert!(Preset::Codex.placed("sessions/2026/12/03/notes.txt", ID, old_cwd, new_cwd).is_err());
        let gemini = format!("tmp/p/chats/session-1764000000000-{}.jsonl", &ID[..8]);
        assert!(Preset::Gemini.placed(&gemini, ID, old_cwd, new_cwd).is_ok());
        assert!(Preset::Gemini.placed("tmp/settings.json", ID, old_cwd, new_cwd).is_err());
        assert!(Preset::Claude.restore(&there, "--help", old_cwd, &c.bundle).is_err(), "an id is never a flag");
        assert!(Preset::Claude.capture(&here, "../x", &[]).is_err());
        let none = "11111111-2222-4333-8444-555555555555";
        assert!(matches!(Preset::Claude.capture(&there, none, &[]), Err(SessionError::Missing(_))));
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
        let (first, second, third) =
            (ID, "bbbbbbbb-2222-4333-8444-555555555555", "cccccccc-2222-4333-8444-555555555555");
        let given = chats.join(format!("session-2026-12-03T08-00-{}.jsonl", &first[..8]));
        std::fs::write(
            &given,
            format!("{{\"sessionId\":\"{first}\"}}\n{{\"type\":\"user\",\"content\":\"part 1\"}}\n"),
        )
        .unwrap();
        let imported = |ms: u64, id: &str| {
            let info = format!("{{\"type\":\"info\",\"content\":\"Imported session from {}\"}}", given.display());
            let text = format!("{{\"sessionId\":\"{id}\"}}\n{info}\n{{\"type\":\"gemini\",\"content\":\"part 2\"}}\n");
            std::fs::write(chats.join(format!("session-{ms}-{}.jsonl", &id[..8])), &text).unwrap();
            text.len()
        };
        assert_eq!(Preset::Gemini.continued_as(&place, first, Some(&given)), first, "none yet");
        imported(1_764_000_000_000, second);
        let size = imported(1_764_000_000_500, third);
        assert_eq!(Preset::Gemini.continued_as(&place, first, Some(&given)), third, "the newest");
        // gemini also starts a file by the time under the new id, holding only its setup.
        let setup = format!("{{\"sessionId\":\"{third}\"}}\n{{\"$set\":{{\"messages\":[]}}}}\n");
        std::fs::write(chats.join(format!("session-2026-12-05T00-40-{}.jsonl", &third[..8])), setup).unwrap();
        let c = Preset::Gemini.capture(&place, third, &[]).unwrap();
        assert_eq!((c.session_id.as_str(), c.raw_size), (third, size), "the imported file, alone");
        assert_eq!(Preset::Claude.continued_as(&place, first, Some(&given)), first);
    }

    /// The rewrite of the old path cannot make a small bundle a large file: a two-byte old
    /// path is refused, and a longer one whose rewrite grows 400 KB of text past the 16 MiB
    /// cap is refused before anything is written (before, `/a` and a 20 KB bundle wrote
    /// about 0.5 GB). The same text, shorter, is restored with the path rewritten.
    #[test]
    fn a_rewritten_path_cannot_blow_up_the_restore() {
        let home = tempfile::tempdir().unwrap();
        let new_cwd = format!("/srv/{}/job-7", "w".repeat(200));
        let place = SessionPlace { root: home.path().join("codex"), cwd: new_cwd.clone().into() };
        let name = rollout("08-00-00", ID);
        let small = bundle_of(&[(&name, &"/a".repeat(100_000))]);
        assert!(small.len() < 20_000, "{} bytes stored", small.len());
        let e = Preset::Codex.restore(&place, ID, "/a", &small).unwrap_err().to_string();
        assert!(e.contains("not the absolute path of a worktree"), "{e}");
        let paths = bundle_of(&[(&name, &"/a/b".repeat(100_000))]);
        let e = Preset::Codex.restore(&place, ID, "/a/b", &paths).unwrap_err().to_string();
        assert!(e.contains("with the worktree path rewritten, more than the 16777216 written"), "{e}");
        assert_eq!(files_below(home.path()), Vec::<PathBuf>::new(), "nothing written");
        for bad in ["a/b", "/a//b", "/a/b/", "/a/../b", &format!("/a/{}", "b".repeat(4096))] {
            assert!(Preset::Codex.restore(&place, ID, bad, &paths).is_err(), "{bad}");
        }
        let fits = bundle_of(&[(&name, &"/a/b\n".repeat(1000))]);
        let (_, n) = Preset::Codex.restore(&place, ID, "/a/b", &fits).unwrap();
        let back = std::fs::read_to_string(place.root.join(&name)).unwrap();
        assert_eq!((n, back.matches(new_cwd.as_str()).count()), (1000 * (new_cwd.len() + 1), 1000));
    }

    /// A bundle holds the one file of the job's own session, by its exact name, and never
    /// replaces a file: more files, another session's codex or gemini file, a gemini file
    /// that names another session inside, an id that is not a UUID, or a file already there
    /// are each refused with the reason, and nothing is written.
    #[test]
    fn a_bundle_holds_only_the_sessions_own_file() {
        let home = tempfile::tempdir().unwrap();
        let place = |cli: &str| SessionPlace { root: home.path().join(cli), cwd: "/srv/w/job-7".into() };
        let (codex, gemini) = (place("codex"), place("gemini"));
        let cwd = "/home/ann/wt/job-7";
        let many: Vec<String> =
            (0..1000).map(|i| rollout(&format!("08-{:02}-{:02}", i / 60 % 60, i % 60), ID)).collect();
        let many: Vec<(&str, &str)> = many.iter().map(|p| (p.as_str(), "{}\n")).collect();
        let e = Preset::Codex.restore(&codex, ID, cwd, &bundle_of(&many)).unwrap_err().to_string();
        assert!(e.contains("holds 1000 files"), "{e}");
        let e = Preset::Codex.restore(&codex, ID, cwd, &bundle_of(&many[..2])).unwrap_err().to_string();
        assert!(e.contains("holds 2 files"), "{e}");
        let theirs = bundle_of(&[(&rollout("08-00-00", OTHER), "{}\n")]);
        let e = Preset::Codex.restore(&codex, ID, cwd, &theirs).unwrap_err().to_string();
        assert!(e.contains("not codex's session"), "{e}");
        let chats = format!("tmp/other-project/chats/session-2026-12-03T08-00-{}.jsonl", &OTHER[..8]);
        let their_gemini = bundle_of(&[(&chats.replace(&OTHER[..8], "ffffffff"), "{}\n")]);
        let e = Preset::Gemini.restore(&gemini, ID, cwd, &their_gemini).unwrap_err().to_string();
        assert!(e.contains("not gemini's session"), "{e}");
        let inside = format!("{{\"sessionId\":\"{OTHER}\"}}\n");
        let e = Preset::Gemini.restore(&gemini, ID, cwd, &bundle_of(&[(&chats, &inside)])).unwrap_err().to_string();
        assert!(e.contains("not gemini's session"), "{e}");
        let claude = bundle_of(&[("projects/-home-ann-wt-job-7/a.jsonl", "{}\n")]);
        for id in ["a", "abc-1", "0B6C3A8E-3D1F-4A2B-9C8D-7E6F5A4B3C21"] {
            let e = Preset::Claude.restore(&place("claude"), id, cwd, &claude).unwrap_err().to_string();
            assert!(e.contains("is not a claude session id (a UUID)"), "{e}");
        }
        assert_eq!(files_below(home.path()), Vec::<PathBuf>::new(), "nothing written");
        // A file already there (another project's, or this machine's own) stays as it is.
        let mine = codex.root.join(rollout("08-00-00", ID));
        std::fs::create_dir_all(mine.parent().unwrap()).unwrap();
        std::fs::write(&mine, "mine\n").unwrap();
        let carried = bundle_of(&[(&rollout("08-00-00", ID), "carried\n")]);
        let e = Preset::Codex.restore(&codex, ID, cwd, &carried).unwrap_err();
        assert!(matches!(&e, SessionError::Exists(p) if *p == mine), "{e}");
        assert_eq!(std::fs::read_to_string(&mine).unwrap(), "mine\n");
        let ours = format!("{{\"sessionId\":\"{ID}\"}}\n");
        let chats = chats.replace(&OTHER[..8], &ID[..8]);
        let (talk, _) = Preset::Gemini.restore(&gemini, ID, cwd, &bundle_of(&[(&chats, &ours)])).unwrap();
        assert_eq!(talk, Conversation::Resume { id: ID.into(), file: Some(gemini.root.join(&chats)) });
    }

    /// Capture takes the one file named for the session: a one-character or non-UUID id
    /// takes nothing (before, "1" took every codex rollout and gemini file holding a "1"),
    /// and a file of another session whose name or text shares part of the id is left out.
    #[test]
    fn capture_takes_only_the_sessions_own_file() {
        let home = tempfile::tempdir().unwrap();
        let codex = SessionPlace { root: home.path().join("codex"), cwd: "/srv/w/job-7".into() };
        let write = |root: &Path, rel: &str, text: &str| {
            std::fs::create_dir_all(root.join(rel).parent().unwrap()).unwrap();
            std::fs::write(root.join(rel), text).unwrap();
        };
        write(&codex.root, &rollout("08-00-00", ID), "ours\n");
        write(&codex.root, &rollout("09-00-00", &format!("x{ID}")), "another session's, longer\n");
        write(&codex.root, &rollout("10-00-00", OTHER), "another session's, ending in 1\n");
        for id in ["1", "21", "c21"] {
            let e = Preset::Codex.capture(&codex, id, &[]).unwrap_err().to_string();
            assert!(e.contains("is not a codex session id"), "{id}: {e}");
        }
        assert_eq!(Preset::Codex.capture(&codex, ID, &[]).unwrap().raw_size, "ours\n".len());
        let gemini = SessionPlace { root: home.path().join("gemini"), cwd: "/srv/w/job-7".into() };
        let ours = format!("{{\"sessionId\":\"{ID}\"}}\n{{\"content\":\"part 1\"}}\n");
        write(&gemini.root, &format!("tmp/job-7/chats/session-2026-12-03T08-00-{}.jsonl", &ID[..8]), &ours);
        let theirs = format!("{{\"sessionId\":\"{OTHER}\"}}\n{{\"content\":\"about {ID}\"}}\n");
        write(&gemini.root, &format!("tmp/other/chats/session-2026-12-03T09-00-{}.jsonl", &OTHER[..8]), &theirs);
        let e = Preset::Gemini.capture(&gemini, "1", &[]).unwrap_err().to_string();
        assert!(e.contains("is not a gemini session id"), "{e}");
        assert_eq!(Preset::Gemini.capture(&gemini, ID, &[]).unwrap().raw_size, ours.len());
    }

    /// A captured session is stored as zstd, under half the size gzip made of claude's
    /// doubled file text, and comes back whole; a bundle an older machine stored as gzip still
    /// restores.
    #[test]
    fn a_session_is_stored_as_zstd_and_a_gzip_one_still_restores() {
        let home = tempfile::tempdir().unwrap();
        let place = SessionPlace { root: home.path().join("codex"), cwd: "/srv/w/job-7".into() };
        let name = rollout("08-00-00", ID);
        // A read file's text twice, 200 KB apart (claude's message and its tool's result).
        let read: String = (0..4000).map(|i| format!("let v{i} = load_{}({i});\n", i * 7919 % 1000)).collect();
        let text = format!("{{\"message\":{read:?}}}\n{}\n{{\"toolUseResult\":{read:?}}}\n", "x".repeat(200_000));
        std::fs::create_dir_all(place.root.join(&name).parent().unwrap()).unwrap();
        std::fs::write(place.root.join(&name), &text).unwrap();
        let captured = Preset::Codex.capture(&place, ID, &[]).unwrap();
        let bytes = base64::engine::general_purpose::STANDARD.decode(&captured.bundle).unwrap();
        assert!(bytes.starts_with(&ZSTD_MAGIC), "stored as zstd");
        let gzip = bundle_of(&[(&name, &text)]);
        assert!(captured.bundle.len() * 2 < gzip.len(), "zstd {} against gzip {}", captured.bundle.len(), gzip.len());
        for (bundle, dir) in [(&captured.bundle, "zstd"), (&gzip, "gzip")] {
            let back = SessionPlace { root: home.path().join(dir), cwd: "/srv/w/job-7".into() };
            Preset::Codex.restore(&back, ID, "/srv/w/job-7", bundle).unwrap();
            assert_eq!(std::fs::read_to_string(back.root.join(&name)).unwrap(), text, "{dir}");
        }
    }

    /// A zstd bundle that unpacks past the cap stops there, one whose frame asks for a
    /// window over 16 MB (memory another machine would make this one spend) is refused, and
    /// only its first frame is read: a frame after it (a legacy one, which sizes its own
    /// buffers) never reaches a decoder.
    #[test]
    fn a_zstd_bundle_cannot_ask_for_more_than_the_caps() {
        let b64 = |b: Vec<u8>| base64::engine::general_purpose::STANDARD.encode(b);
        let bomb = zstd::bulk::compress(&vec![b' '; BUNDLE_JSON_CAP + 10], 3).unwrap();
        let e = unpack(&b64(bomb)).unwrap_err().to_string();
        assert!(e.contains("bundle, unpacked"), "{e}");
        let mut wide = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        wide.window_log(27).unwrap();
        wide.write_all(b"{\"files\":[]}").unwrap();
        let e = unpack(&b64(wide.finish().unwrap())).unwrap_err().to_string();
        assert!(e.contains("unreadable") || e.contains("memory") || e.contains("window"), "{e}");
        assert!(unpack(&b64(b"plain".to_vec())).is_err(), "neither zstd nor gzip");
        let mut two = zstd::bulk::compress(b"{\"files\":[]}", 3).unwrap();
        two.extend(zstd::bulk::compress(b" and more", 3).unwrap());
        assert!(unpack(&b64(two)).unwrap().files.is_empty(), "the first frame alone");
    }
}
