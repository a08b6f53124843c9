//! What a confined agent's filesystem is made of, and the bubblewrap arguments that make it.
//!
//! The root is empty (bubblewrap's tmpfs); only what is listed here appears in it, each at
//! the same path as outside (the runner restores and reads a preset's session files at
//! their host paths, and claude names its project directory after the working directory).
//! An allowlist, not a denylist: a new secret file next year is not visible either.
//!
//! Entries apply parent first, so a deeper entry wins over the one it sits in: a read-only
//! `.git` file inside a writable worktree, a hidden credentials file inside a read-only
//! toolchain directory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// What appears at one path inside the sandbox.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mount {
    /// An empty, writable, private directory (the home, `/tmp`).
    Tmpfs,
    /// The same path of the host, read-only.
    ReadOnly,
    /// The same path of the host, writable.
    ReadWrite,
    /// A host path somewhere else, read-only (the init's binary).
    From(PathBuf),
    /// A host socket or file somewhere else, writable (the egress socket).
    FromWritable(PathBuf),
    /// A symbolic link to this target (`/bin` -> `usr/bin` on a merged-/usr system).
    Symlink(PathBuf),
    /// Nothing readable: an empty read-only directory or an empty file over what is there.
    Hidden,
}

/// The filesystem of one sandbox.
#[derive(Clone, Debug, Default)]
pub struct Mounts {
    list: Vec<(PathBuf, Mount)>,
}

impl Mounts {
    /// Adds (or replaces) what appears at `path`.
    pub fn set(&mut self, path: impl Into<PathBuf>, m: Mount) -> &mut Self {
        let path = path.into();
        self.list.retain(|(p, _)| p != &path);
        self.list.push((path, m));
        self
    }

    /// A host path, read-only, if it exists.
    pub fn read_only(&mut self, path: &Path) -> &mut Self {
        if path.exists() {
            self.set(path, Mount::ReadOnly);
        }
        self
    }

    /// A host path, writable, if it exists.
    pub fn writable(&mut self, path: &Path) -> &mut Self {
        if path.exists() {
            self.set(path, Mount::ReadWrite);
        }
        self
    }

    /// Hides what is at `path`, if anything is.
    pub fn hide(&mut self, path: &Path) -> &mut Self {
        if path.symlink_metadata().is_ok() {
            self.set(path, Mount::Hidden);
        }
        self
    }

    pub fn get(&self, path: &Path) -> Option<&Mount> {
        self.list.iter().find(|(p, _)| p == path).map(|(_, m)| m)
    }

    /// The bubblewrap arguments, parents first. `empty` is an empty read-only file to lay
    /// over a hidden file (bubblewrap binds it; `/dev/null` would be a device).
    pub fn args(&self, empty: &Path) -> Vec<OsString> {
        let mut sorted: Vec<&(PathBuf, Mount)> = self.list.iter().collect();
        sorted.sort_by(|(a, ma), (b, mb)| {
            a.components().count().cmp(&b.components().count()).then(a.cmp(b)).then(ma.cmp(mb))
        });
        let mut out: Vec<OsString> = vec![];
        let mut push = |items: &[&std::ffi::OsStr]| out.extend(items.iter().map(|s| s.to_os_string()));
        for (path, m) in sorted {
            let p = path.as_os_str();
            match m {
                Mount::Tmpfs => push(&["--tmpfs".as_ref(), p]),
                Mount::ReadOnly => push(&["--ro-bind".as_ref(), p, p]),
                Mount::ReadWrite => push(&["--bind".as_ref(), p, p]),
                Mount::From(src) => push(&["--ro-bind".as_ref(), src.as_os_str(), p]),
                Mount::FromWritable(src) => push(&["--bind".as_ref(), src.as_os_str(), p]),
                Mount::Symlink(target) => push(&["--symlink".as_ref(), target.as_os_str(), p]),
                Mount::Hidden if path.is_dir() => {
                    push(&["--perms".as_ref(), "0000".as_ref(), "--tmpfs".as_ref(), p, "--remount-ro".as_ref(), p])
                }
                Mount::Hidden => push(&["--ro-bind".as_ref(), empty.as_os_str(), p]),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(args: &[OsString]) -> String {
        args.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
    }

    /// Parents come before what sits in them, whatever order they were added in, and a
    /// later setting of a path replaces the earlier one.
    #[test]
    fn parents_first() {
        let mut m = Mounts::default();
        m.set("/home/u/wt/.git", Mount::ReadOnly)
            .set("/home/u/wt", Mount::ReadWrite)
            .set("/home/u", Mount::Tmpfs)
            .set("/tmp", Mount::ReadOnly)
            .set("/tmp", Mount::Tmpfs)
            .set("/bin", Mount::Symlink("usr/bin".into()));
        assert_eq!(
            text(&m.args(Path::new("/e"))),
            "--symlink usr/bin /bin --tmpfs /tmp --tmpfs /home/u --bind /home/u/wt /home/u/wt \
             --ro-bind /home/u/wt/.git /home/u/wt/.git"
        );
    }

    /// A hidden directory becomes an empty unreadable one; a hidden file, an empty file.
    #[test]
    fn hidden_paths() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("credentials.toml");
        std::fs::write(&file, "token").unwrap();
        let mut m = Mounts::default();
        m.hide(dir.path()).hide(&file).hide(&dir.path().join("missing"));
        let args = text(&m.args(Path::new("/e")));
        let d = dir.path().display();
        assert_eq!(args, format!("--perms 0000 --tmpfs {d} --remount-ro {d} --ro-bind /e {d}/credentials.toml"));
    }
}
