//! DevPilot's own git calls, made so that nothing an agent can write runs inside them.
//!
//! An agent works in a worktree, and git reads a lot from places an agent can write: the
//! worktree's `.git` file says where the repository is (an agent can point it at a gitdir of
//! its own), and `git config` run in a worktree writes the clone's shared `.git/config`,
//! where a key can name a program (`core.fsmonitor`, `core.sshCommand`, a filter, a
//! credential helper…), and the clone's hooks directory. A program planted there would run
//! in DevPilot's commit at hand-off, outside the agent's own sandbox. So every call here:
//!
//! - runs in an environment reduced to what git needs ([`crate::environ::GIT`]): no database
//!   URL, no password, no token;
//! - is told where the repository is: a worktree's calls name its gitdir (the one DevPilot
//!   recorded when it created the worktree) and its work tree explicitly, so the `.git` file
//!   in the worktree is never read;
//! - runs no hook (`core.hooksPath=/dev/null`), no fsmonitor, no submodule, no background
//!   gc, and no `ext::` transport, whatever the repository's config says;
//! - overrides every key of the repository's own config (its `local` and `worktree` scopes)
//!   that would run a program with the user's own value (from the system or global config,
//!   which the user's own git trusts) or a harmless one ([`neutral`]); a key that cannot be
//!   neutralised this way (a URL rewrite, a remote helper) makes the call refuse to run;
//! - pushes to or fetches from a remote on this machine (a path or `file://`) with a
//!   receive-pack or upload-pack that runs no hook of that repository either;
//! - never prompts, is bounded in time, and has no terminal (ssh cannot stop to ask).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

/// Why one of DevPilot's git calls gave no output. `command` is git's subcommand (`push`).
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("cannot run git: {0}")]
    Spawn(#[source] std::io::Error),
    /// Git ran and failed: its last `fatal:` line on stderr (else its last line), with any
    /// credentials in a URL redacted.
    #[error("git {command} failed: {stderr}")]
    Failed { command: String, stderr: String },
    #[error("git {command} took longer than {}", humantime::format_duration(*.bound))]
    TimedOut { command: String, bound: Duration },
    /// The place's config cannot be made safe, so nothing was run.
    #[error("git {command} refused: {reason}")]
    Refused { command: String, reason: Refusal },
    /// A file of a worktree's gitdir that [`worktree_gitdir`] could not read or resolve.
    #[error("{what}: {source}")]
    Io { what: &'static str, source: std::io::Error },
    #[error("the worktree's .git names no gitdir")]
    NoGitdir,
    #[error("the worktree's gitdir {} is not one of the clone's", .0.display())]
    ForeignGitdir(PathBuf),
}

/// Why a repository's config cannot be made safe (see the module doc): every call there is
/// refused.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Refusal {
    /// What cannot be read cannot be neutralised (git before 2.26 has no `--show-scope`; a
    /// gitdir that is gone has no config).
    #[error("the repository's config could not be read ({0})")]
    Unreadable(#[source] Arc<GitError>),
    /// A key a `-c` cannot take back, or that names a program to run some other way.
    #[error(
        "the repository's own config sets {key}, which DevPilot does not follow (it could run a \
         program or send the push elsewhere); move it to your global config, or remove it with \
         `git config --local --unset-all {key}`"
    )]
    Unfollowed { key: String },
}

/// What every call passes, whatever the repository says. (Each was checked against a marker
/// script with git 2.47: hooks, fsmonitor, background gc and `ext::` stay silent.)
const FIXED: &[&str] = &[
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "submodule.recurse=false",
    "fetch.recurseSubmodules=false",
    "push.recurseSubmodules=no",
    // A nested repository an agent made (a gitlink after `add -A`) is never looked into: a
    // status inside it would read its own config, filters and all.
    "diff.ignoreSubmodules=all",
    "status.submoduleSummary=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "protocol.ext.allow=never",
];

/// The transports DevPilot's git may use unless the user's environment says otherwise
/// (`GIT_ALLOW_PROTOCOL`): no `ext::`, and no remote helper an agent could name in a URL.
const PROTOCOLS: &str = "file:git:http:https:ssh";

/// The receive-pack of a push to a repository on this machine: its hooks do not run.
const LOCAL_RECEIVE_PACK: &str =
    "git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.alternateRefsCommand= receive-pack";
/// The upload-pack of a fetch from a repository on this machine.
const LOCAL_UPLOAD_PACK: &str =
    "git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.alternateRefsCommand= upload-pack";

/// Where a call runs.
#[derive(Clone, Debug)]
enum Place {
    /// The user's clone (`git -C <clone>`).
    Clone(PathBuf),
    /// A job's worktree: its gitdir and work tree, both named.
    Worktree { git_dir: PathBuf, work_tree: PathBuf },
}

/// A hardened git for one repository place; see the module doc.
#[derive(Clone, Debug)]
pub struct Git {
    place: Place,
    /// `-c key=value` of this place: [`FIXED`], then what its own config calls for.
    overrides: Vec<String>,
    /// Why this place's config cannot be made safe, if it cannot.
    refused: Option<Refusal>,
    /// The repository's own config names an upload-pack: a partial clone's lazy fetch (which
    /// would run it, and takes no `--upload-pack`) is off.
    no_lazy_fetch: bool,
}

impl Git {
    /// Git in the user's clone at `dir`.
    pub async fn clone_at(dir: &Path) -> Self {
        Self::at(Place::Clone(dir.to_path_buf())).await
    }

    /// Git in a job's worktree, with its gitdir named: the worktree's `.git` file is not read.
    pub async fn worktree(git_dir: &Path, work_tree: &Path) -> Self {
        Self::at(Place::Worktree { git_dir: git_dir.to_path_buf(), work_tree: work_tree.to_path_buf() }).await
    }

    async fn at(place: Place) -> Self {
        let mut git = Self {
            place,
            overrides: FIXED.iter().map(|s| s.to_string()).collect(),
            refused: None,
            no_lazy_fetch: false,
        };
        // Reading config runs nothing (a `config --list` executes no program).
        match git.raw(&["config", "--list", "--show-scope", "-z"], Duration::from_secs(30)).await {
            Ok(listing) => {
                let entries = parse_listing(&listing);
                git.no_lazy_fetch = entries.iter().any(|e| {
                    let (section, sub, var) = split_key(&e.key);
                    matches!(e.scope.as_str(), "local" | "worktree")
                        && section == "remote"
                        && sub.is_some()
                        && var == "uploadpack"
                });
                match overrides_for(&entries) {
                    Ok(extra) => git.overrides.extend(extra),
                    Err(why) => git.refused = Some(why),
                }
            }
            // Fail closed.
            Err(e) => git.refused = Some(Refusal::Unreadable(Arc::new(e))),
        }
        git
    }

    /// Runs `git args…`, bounded by `bound`: its stdout, trimmed.
    pub async fn run(&self, args: &[&str], bound: Duration) -> Result<String, GitError> {
        if let Some(why) = &self.refused {
            let command = args.first().copied().unwrap_or_default().to_string();
            return Err(GitError::Refused { command, reason: why.clone() });
        }
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        if let Some(pack) = self.local_pack(&args).await {
            args.insert(1, pack);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.raw(&args, bound).await
    }

    /// The receive-pack or upload-pack of a push or fetch, named on the command line (the
    /// repository's `remote.*.receivepack` cannot be overridden by `-c`): git's own, and for
    /// a remote on this machine one that runs none of that repository's hooks either.
    async fn local_pack(&self, args: &[String]) -> Option<String> {
        let (cmd, remote) = (args.first()?.as_str(), args.iter().skip(1).find(|a| !a.starts_with('-'))?);
        let (flag, local, plain, push) = match cmd {
            "push" => ("--receive-pack", LOCAL_RECEIVE_PACK, "git-receive-pack", true),
            "fetch" | "ls-remote" => ("--upload-pack", LOCAL_UPLOAD_PACK, "git-upload-pack", false),
            _ => return None,
        };
        let mut get = vec!["remote", "get-url"];
        if push {
            get.push("--push");
        }
        get.push(remote);
        // The URL git will use (after any rewriting), or the argument itself if it is a URL.
        let url = self.raw(&get, Duration::from_secs(10)).await.unwrap_or_else(|_| remote.clone());
        Some(format!("{flag}={}", if is_local_url(&url) { local } else { plain }))
    }

    /// Runs git with this place's overrides, in the reduced environment.
    async fn raw(&self, args: &[&str], bound: Duration) -> Result<String, GitError> {
        let mut cmd = tokio::process::Command::new("git");
        cmd.env_clear()
            .envs(crate::environ::allowed(&[crate::environ::BASE, crate::environ::GIT], &[]))
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_EDITOR", ":")
            .env("GIT_SEQUENCE_EDITOR", ":")
            .env("GIT_PAGER", "cat")
            .env("GIT_OPTIONAL_LOCKS", "0")
            .env("GCM_INTERACTIVE", "never")
            .arg("--no-pager")
            .arg("--no-replace-objects");
        if std::env::var_os("GIT_ALLOW_PROTOCOL").is_none() {
            cmd.env("GIT_ALLOW_PROTOCOL", PROTOCOLS);
        }
        if self.no_lazy_fetch {
            cmd.env("GIT_NO_LAZY_FETCH", "1");
        }
        match &self.place {
            Place::Clone(dir) => {
                cmd.arg("-C").arg(dir);
            }
            Place::Worktree { git_dir, work_tree } => {
                cmd.arg("--git-dir").arg(git_dir).arg("--work-tree").arg(work_tree).current_dir(work_tree);
            }
        }
        for o in &self.overrides {
            cmd.arg("-c").arg(o);
        }
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        // A session of its own has no controlling terminal, so ssh cannot stop to ask for a
        // passphrase or a host key: it fails instead of hanging (and the user's own ssh
        // settings, a deploy key say, still apply).
        // SAFETY: setsid is async-signal-safe and touches only the child being exec'd.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let command = args.first().copied().unwrap_or_default().to_string();
        let out = match tokio::time::timeout(bound, cmd.output()).await {
            Err(_) => return Err(GitError::TimedOut { command, bound }),
            Ok(Err(e)) => return Err(GitError::Spawn(e)),
            Ok(Ok(o)) => o,
        };
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).trim().to_string());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        // Git's own verdict (its last `fatal:` line) over the advice it prints after it
        // ("Please make sure you have the correct access rights / and the repository exists.").
        let lines = || err.lines().rev().map(str::trim).filter(|l| !l.is_empty());
        let line = lines().find(|l| l.starts_with("fatal:")).or_else(|| lines().next()).unwrap_or("");
        Err(GitError::Failed { command, stderr: redact_credentials(line) })
    }
}

/// Whether git reaches `url` by running receive-pack or upload-pack on this machine: a path,
/// or `file://`.
fn is_local_url(url: &str) -> bool {
    let url = url.trim();
    if url.starts_with("file://") {
        return true;
    }
    if url.contains("://") {
        return false;
    }
    // scp-like `host:path` (a colon before any slash) is ssh; everything else is a path.
    match (url.find(':'), url.find('/')) {
        (Some(colon), Some(slash)) => slash < colon,
        (Some(_), None) => false,
        _ => true,
    }
}

/// One entry of `git config --list --show-scope -z`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    scope: String,
    key: String,
    value: Option<String>,
}

/// Parses `git config --list --show-scope -z`: entries of `scope\0key\nvalue\0`, or
/// `scope\0key\0` for a key with no value.
fn parse_listing(text: &str) -> Vec<Entry> {
    let mut out = vec![];
    let mut fields = text.split('\0');
    while let (Some(scope), Some(kv)) = (fields.next(), fields.next()) {
        if scope.is_empty() {
            break;
        }
        let (key, value) = match kv.split_once('\n') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (kv, None),
        };
        out.push(Entry { scope: scope.to_string(), key: key.to_string(), value });
    }
    out
}

/// A config key split as git writes it in a listing: the section and the variable
/// lower-cased, the subsection (between them) as it was written.
fn split_key(key: &str) -> (String, Option<&str>, String) {
    let (section, rest) = key.split_once('.').unwrap_or((key, ""));
    match rest.rsplit_once('.') {
        Some((sub, var)) => (section.to_ascii_lowercase(), Some(sub), var.to_ascii_lowercase()),
        None => (section.to_ascii_lowercase(), None, rest.to_ascii_lowercase()),
    }
}

/// What a key of the repository's own config that runs a program is overridden with when the
/// user's own config does not set it. `Err`: a key that cannot be overridden this way (the
/// call is refused).
fn neutral(key: &str) -> Option<Result<&'static str, Refusal>> {
    let (section, sub, var) = split_key(key);
    let harmless = match (section.as_str(), sub, var.as_str()) {
        // Covered whatever the value: the fixed overrides (hooks, fsmonitor, submodules),
        // the environment (editor, pager), `--no-ext-diff --no-textconv --no-stat` on the
        // calls that could diff, and the protocol allowlist.
        ("core", None, "fsmonitor" | "hookspath" | "editor" | "pager") => return None,
        ("core", None, "sshcommand") => "ssh",
        ("core", None, "askpass") => "",
        ("filter", Some(_), "clean" | "smudge" | "process") => "",
        ("filter", Some(_), "required") => "false",
        ("gpg", None, "program") => "gpg",
        ("gpg", Some("x509"), "program") => "gpgsm",
        ("gpg", Some("ssh"), "program") => "ssh-keygen",
        ("gpg", Some(_), "program") => "gpg",
        ("gpg", Some("ssh"), "defaultkeycommand") => "",
        ("commit" | "tag" | "push", None, "gpgsign") => "false",
        ("merge", None, "verifysignatures") => "false",
        ("credential", _, "helper") => "",
        // Keys a `-c` cannot take back (the first value wins, or a rewrite of equal length
        // beats ours), or that name a program to run some other way: refuse instead.
        // Named on the command line of every push and fetch instead (`--receive-pack`,
        // `--upload-pack`, which win); and no lazy fetch of a partial clone may run one.
        ("remote", Some(_), "uploadpack" | "receivepack") => return None,
        ("core", None, "gitproxy" | "alternaterefscommand")
        | ("url", Some(_), _)
        | ("remote", Some(_), "vcs")
        | ("hook", Some(_), _) => return Some(Err(Refusal::Unfollowed { key: key.to_string() })),
        _ => return None,
    };
    Some(Ok(harmless))
}

/// The `-c` overrides the repository's own config (`local` and `worktree` scopes) calls for:
/// each key there that runs a program gets the user's own (system or global) value, or a
/// harmless one. Credential helpers are reset and the user's own re-added, in order.
fn overrides_for(entries: &[Entry]) -> Result<Vec<String>, Refusal> {
    let trusted = |e: &&Entry| e.scope == "system" || e.scope == "global";
    let untrusted: Vec<&Entry> = entries.iter().filter(|e| e.scope == "local" || e.scope == "worktree").collect();
    let mut out = vec![];
    let mut seen: Vec<String> = vec![];
    for e in untrusted {
        let Some(harmless) = neutral(&e.key) else { continue };
        let harmless = harmless?;
        let lower = e.key.to_ascii_lowercase();
        if seen.contains(&lower) {
            continue;
        }
        seen.push(lower.clone());
        let (section, _, var) = split_key(&e.key);
        if section == "credential" && var == "helper" {
            // An empty helper resets the list; then the user's own helpers, as they were.
            out.push("credential.helper=".to_string());
            for t in entries.iter().filter(trusted) {
                let (s, _, v) = split_key(&t.key);
                if s == "credential" && v == "helper" {
                    out.push(format!("{}={}", t.key, t.value.clone().unwrap_or_default()));
                }
            }
            continue;
        }
        let own = entries.iter().filter(trusted).rfind(|t| t.key.to_ascii_lowercase() == lower);
        let value = match own {
            Some(t) => t.value.clone().unwrap_or_else(|| "true".into()),
            None => harmless.to_string(),
        };
        out.push(format!("{}={value}", e.key));
    }
    Ok(out)
}

/// The gitdir a worktree's `.git` file names (`gitdir: …`), resolved, if it is one of the
/// clone's worktree gitdirs (`<clone's common dir>/worktrees/<name>`).
pub async fn worktree_gitdir(clone: &Git, work_tree: &Path) -> Result<PathBuf, GitError> {
    let io = |what: &'static str| move |source| GitError::Io { what, source };
    let common =
        clone.run(&["rev-parse", "--path-format=absolute", "--git-common-dir"], Duration::from_secs(30)).await?;
    let common = PathBuf::from(common).canonicalize().map_err(io("the clone's git dir"))?;
    let file = std::fs::read_to_string(work_tree.join(".git")).map_err(io("the worktree's .git"))?;
    let named = file.trim().strip_prefix("gitdir:").map(str::trim).ok_or(GitError::NoGitdir)?;
    let named = work_tree.join(named).canonicalize().map_err(io("the worktree's gitdir"))?;
    if named.parent() != Some(&common.join("worktrees")) {
        return Err(GitError::ForeignGitdir(named));
    }
    Ok(named)
}

/// `https://user:token@host/…` as `https://***@host/…`: git's messages name remote URLs, and
/// they end up in job history that every machine reads.
pub fn redact_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail.find(|c: char| c.is_whitespace() || c == '/' || c == '\'' || c == '"').unwrap_or(tail.len());
        match tail[..end].rfind('@') {
            Some(at) => {
                out.push_str("***");
                rest = &tail[at..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(scope: &str, key: &str, value: &str) -> Entry {
        Entry { scope: scope.into(), key: key.into(), value: Some(value.into()) }
    }

    /// The listing's `scope\0key\nvalue\0` entries parse, a key without a value too.
    #[test]
    fn listings_parse() {
        let got = parse_listing("global\0user.name\nA B\0local\0core.bare\nfalse\0local\0x.flag\0");
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], entry("global", "user.name", "A B"));
        assert_eq!(got[2], Entry { scope: "local".into(), key: "x.flag".into(), value: None });
        assert_eq!(split_key("filter.LFS.clean"), ("filter".into(), Some("LFS"), "clean".into()));
        assert_eq!(split_key("credential.https://h.example/x.helper").1, Some("https://h.example/x"));
    }

    /// A program the repository's own config names is overridden by the user's own value, or
    /// a harmless one; credential helpers are reset and the user's re-added; a URL rewrite
    /// refuses the call.
    #[test]
    fn repository_programs_are_overridden() {
        let entries = vec![
            entry("global", "core.sshcommand", "ssh -i ~/.ssh/deploy"),
            entry("global", "credential.helper", "store"),
            entry("global", "filter.lfs.clean", "git-lfs clean -- %f"),
            entry("local", "core.sshcommand", "sh -c evil"),
            entry("local", "filter.lfs.clean", "sh -c evil"),
            entry("local", "filter.evil.smudge", "sh -c evil"),
            entry("local", "credential.https://x.example.helper", "!evil"),
            entry("local", "remote.origin.url", "/tmp/x"),
            entry("worktree", "core.fsmonitor", "./evil"),
        ];
        let o = overrides_for(&entries).unwrap();
        assert!(o.contains(&"core.sshcommand=ssh -i ~/.ssh/deploy".to_string()), "{o:?}");
        assert!(o.contains(&"filter.lfs.clean=git-lfs clean -- %f".to_string()), "{o:?}");
        assert!(o.contains(&"filter.evil.smudge=".to_string()), "{o:?}");

        let reset = o.iter().position(|x| x == "credential.helper=").unwrap();
        assert_eq!(o[reset + 1], "credential.helper=store", "{o:?}");
        assert!(!o.iter().any(|x| x.contains("sh -c") || x.contains("!evil") || x.contains("./evil")), "{o:?}");
        for key in ["url./tmp/evil.pushinsteadof", "remote.origin.vcs", "core.gitproxy", "hook.x.command"] {
            let refused = overrides_for(&[entry("local", key, "sh -c evil")]).unwrap_err().to_string();
            assert!(refused.contains(key), "{refused}");
            assert!(overrides_for(&[entry("global", key, "mine")]).unwrap().is_empty(), "the user's own is trusted");
        }
    }

    /// Paths and `file://` are local transports; URLs and scp-like addresses are not.
    #[test]
    fn local_urls() {
        for local in ["/srv/git/x.git", "../x.git", "file:///srv/x.git", "x.git"] {
            assert!(is_local_url(local), "{local}");
        }
        for remote in ["https://github.com/a/b", "ssh://git@h/x", "git@github.com:a/b.git", "host:x"] {
            assert!(!is_local_url(remote), "{remote}");
        }
    }
}
