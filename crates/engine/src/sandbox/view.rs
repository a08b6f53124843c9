//! The part of a sandbox's filesystem that does not depend on the job: the system, a
//! private home, and the toolchains a command on `PATH` needs.
//!
//! The home is an empty tmpfs at the home's own path. Into it come, read-only, the toolchain
//! homes that exist (`~/.cargo`, `~/.rustup`, `~/.nvm`, …, minus their credential files),
//! each `PATH` directory under the home, the install directory of each program linked from
//! one, and the agent's own program. What is under [`NEVER`] is not shown even when `PATH`
//! names a directory in it.

use std::path::{Path, PathBuf};

use super::mounts::{Mount, Mounts};

/// System files hidden although `/etc` is shown: password hashes, host keys, service
/// credentials.
const SYSTEM_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/pgbouncer",
    "/etc/postgresql",
    "/etc/postgresql-common",
    "/etc/NetworkManager/system-connections",
    "/etc/wpa_supplicant",
    "/etc/krb5.keytab",
    "/etc/docker",
    "/etc/containers",
    "/etc/sudoers",
    "/etc/sudoers.d",
];

/// Toolchain homes shown read-only when they exist.
const TOOLCHAINS: &[&str] = &[
    ".cargo",
    ".rustup",
    ".nvm",
    ".pyenv",
    ".rbenv",
    ".volta",
    ".bun",
    ".deno",
    ".asdf",
    ".sdkman",
    "go",
    ".npm-global",
    ".local/share/pnpm",
    ".local/share/mise",
    ".local/share/fnm",
];

/// Credential files inside toolchain homes, hidden.
const TOOLCHAIN_SECRETS: &[&str] = &[".cargo/credentials", ".cargo/credentials.toml", ".pyenv/.netrc"];

/// Never shown, whatever `PATH` or a link says: keys, credentials, keyrings, browser
/// profiles, every app's config (DevPilot's and `gh`'s among them) and data.
pub const NEVER: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".pgpass",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".docker",
    ".kube",
    ".aws",
    ".azure",
    ".config",
    ".password-store",
    ".mozilla",
    ".thunderbird",
    ".pki",
    ".local/share/keyrings",
    ".local/share/devpilot",
    ".local/share/devpilot-dev",
    ".local/state",
];

/// How long a made view is reused: a toolchain installed since shows up within a minute.
const REUSE: std::time::Duration = std::time::Duration::from_secs(60);

/// The system and, with a `home`, a private home with what `path` needs: made once a minute
/// for each pair and copied for each job (looking at every `PATH` directory is the largest
/// part of making a sandbox).
pub fn base(home: Option<&Path>, path: Option<&std::ffi::OsStr>) -> Mounts {
    type Key = (Option<PathBuf>, Option<std::ffi::OsString>);
    type Made = std::collections::HashMap<Key, (std::time::Instant, Mounts)>;
    static MADE: std::sync::OnceLock<std::sync::Mutex<Made>> = std::sync::OnceLock::new();
    let key = (home.map(Path::to_path_buf), path.map(std::ffi::OsStr::to_os_string));
    let mut made = MADE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, m)) = made.get(&key).filter(|(at, _)| at.elapsed() < REUSE) {
        return m.clone();
    }
    let mut m = Mounts::default();
    system(&mut m);
    if let Some(h) = home {
        self::home(&mut m, h, path);
    }
    made.retain(|_, (at, _)| at.elapsed() < REUSE);
    made.insert(key, (std::time::Instant::now(), m.clone()));
    m
}

/// The system, read-only, with its secrets hidden; a private `/tmp`.
pub fn system(m: &mut Mounts) {
    m.read_only(Path::new("/usr")).read_only(Path::new("/etc")).read_only(Path::new("/opt"));
    for top in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
        let p = Path::new(top);
        match std::fs::read_link(p) {
            Ok(target) => {
                m.set(p, Mount::Symlink(target));
            }
            Err(_) => {
                m.read_only(p);
            }
        }
    }
    for s in SYSTEM_SECRETS {
        m.hide(Path::new(s));
    }
    m.set("/tmp", Mount::Tmpfs);
    m.set("/var/tmp", Mount::Tmpfs);
}

/// Whether `p` is (in) something under `home` that is never shown.
pub fn never(home: &Path, p: &Path) -> bool {
    p == home || NEVER.iter().any(|n| p.starts_with(home.join(n)))
}

/// The homes a sandbox keeps secret: the agent's (`HOME` in its environment) and the
/// runner's own, when they differ.
struct Homes<'a>(Vec<&'a Path>);

impl Homes<'_> {
    /// Whether `p` is a home, holds one, or is in something never shown.
    fn hidden(&self, p: &Path) -> bool {
        self.0.iter().any(|h| h.starts_with(p) || never(h, p))
    }
}

/// A private home at `home`'s path, the toolchains in it (and in the runner's own home)
/// read-only, and what `path` (the agent's `PATH`) needs.
pub fn home(m: &mut Mounts, home: &Path, path: Option<&std::ffi::OsStr>) {
    m.set(home, Mount::Tmpfs);
    let runner = home_dir();
    let mut homes = vec![home];
    homes.extend(runner.as_deref().filter(|r| *r != home));
    for h in &homes {
        for t in TOOLCHAINS {
            m.read_only(&h.join(t));
        }
        for s in TOOLCHAIN_SECRETS {
            m.hide(&h.join(s));
        }
    }
    let homes = Homes(homes);
    for dir in path.map(|p| std::env::split_paths(p).collect::<Vec<_>>()).unwrap_or_default() {
        path_dir(m, &homes, &dir);
    }
}

/// One `PATH` directory: shown read-only, with its install root when it is a `bin`
/// (`~/.cache/tools/bin` shows `~/.cache/tools`, never a home or `~/.local`), and the
/// install directory of each program linked from it.
fn path_dir(m: &mut Mounts, homes: &Homes, dir: &Path) {
    if !dir.is_absolute() || !dir.is_dir() || homes.hidden(dir) {
        return;
    }
    if !covered(dir) {
        m.read_only(dir);
    }
    let root = dir.parent().filter(|r| {
        dir.ends_with("bin") && !covered(r) && !homes.hidden(r) && !homes.0.iter().any(|h| *r == h.join(".local"))
    });
    if let Some(root) = root.filter(|r| r.components().count() > 2) {
        m.read_only(root);
    }
    // What the system's own directories link to is the system's (or its alternatives').
    if covered(dir) {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten().take(2000) {
        if e.file_type().is_ok_and(|t| t.is_symlink()) {
            linked(m, homes, &e.path());
        }
    }
}

/// The directory a program really is in (after its links), read-only, unless it is in
/// something never shown.
pub fn program(m: &mut Mounts, home: &Path, prog: &Path) {
    let runner = home_dir();
    let mut homes = vec![home];
    homes.extend(runner.as_deref().filter(|r| *r != home));
    linked(m, &Homes(homes), prog);
}

fn linked(m: &mut Mounts, homes: &Homes, prog: &Path) {
    let Ok(real) = prog.canonicalize() else { return };
    let Some(dir) = real.parent() else { return };
    if covered(dir) || homes.hidden(dir) {
        return;
    }
    m.read_only(dir);
}

/// Whether the system part already shows `dir`.
fn covered(dir: &Path) -> bool {
    ["/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib64"].iter().any(|s| dir.starts_with(s))
}

/// The home directory of the runner.
pub fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from).filter(|h| h.is_absolute())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PATH directory in the home is shown with its install root and the install
    /// directories of the programs linked from it; one under a secret directory is not.
    #[test]
    fn path_directories_and_links() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("home");
        let tool = home.join(".cache/tools");
        std::fs::create_dir_all(tool.join("bin")).unwrap();
        std::fs::create_dir_all(tool.join("lib/pkg")).unwrap();
        std::fs::write(tool.join("lib/pkg/cli.js"), "").unwrap();
        std::os::unix::fs::symlink(tool.join("lib/pkg/cli.js"), tool.join("bin/cli")).unwrap();
        std::fs::create_dir_all(home.join(".ssh/bin")).unwrap();
        std::fs::create_dir_all(home.join(".local/bin")).unwrap();
        let path = std::env::join_paths([tool.join("bin"), home.join(".ssh/bin"), home.join(".local/bin")]).unwrap();
        let mut m = Mounts::default();
        self::home(&mut m, &home, Some(&path));
        assert_eq!(m.get(&home), Some(&Mount::Tmpfs));
        assert_eq!(m.get(&tool.join("bin")), Some(&Mount::ReadOnly));
        assert_eq!(m.get(&tool), Some(&Mount::ReadOnly), "the install root of a bin in the home");
        let real = tool.join("lib/pkg").canonicalize().unwrap();
        assert_eq!(m.get(&real), Some(&Mount::ReadOnly), "a linked program's directory");
        assert_eq!(m.get(&home.join(".ssh/bin")), None);
        assert_eq!(m.get(&home.join(".local/bin")), Some(&Mount::ReadOnly));
        assert_eq!(m.get(&home.join(".local")), None, "~/.local holds data too: only its bin");
    }
}
