//! Files DevPilot writes where an agent can reach: into a worktree (the repo's `copy` files),
//! next to it (payload, prompt and result files), and the agent logs.
//!
//! An agent, or the base branch it started from, can plant a symlink where DevPilot is about
//! to write (`.env -> ~/.bashrc`), a FIFO where DevPilot is about to read, or a hard link to
//! a file of the user's. So:
//! - a write below a root walks the path one directory at a time with `O_NOFOLLOW` from the
//!   root's real path, refuses a symlink at any step, and creates the file new (`O_EXCL`)
//!   after unlinking a regular file in its place: nothing is written through a link, and
//!   nothing lands outside the root ([`write_beneath`]); what another machine sent is only
//!   ever created, never put in place of a file that is there ([`create_beneath`]);
//! - a file of DevPilot's own is created new, private and without following links
//!   ([`create_private`]), in a directory only this user can enter ([`private_dir`]);
//! - a file an agent wrote is read only if it is a regular file, opened without following
//!   links and without blocking (a FIFO cannot wedge the reader), and only up to a cap
//!   ([`read_regular`]).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};

/// The directories below a root to walk, and the file's name, of a relative path. Refuses an
/// absolute path and any `..`.
fn split_relative(rel: &Path) -> io::Result<(Vec<&std::ffi::OsStr>, &std::ffi::OsStr)> {
    let mut parts = vec![];
    for c in rel.components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::CurDir => {}
            _ => return Err(refused(format!("{} is not a path inside the worktree", rel.display()))),
        }
    }
    let name = parts.pop().ok_or_else(|| refused(format!("{} names no file", rel.display())))?;
    Ok((parts, name))
}

fn refused(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why)
}

/// Opens `dir` (a path of DevPilot's own, e.g. a worktree it created) as a directory.
fn open_root(dir: &Path) -> io::Result<OwnedFd> {
    let real = dir.canonicalize()?;
    Ok(rustix::fs::open(&real, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?)
}

/// Opens (creating with `mode` if `create`) the directory `name` in `parent`, never through
/// a symlink.
fn open_dir_in(parent: &OwnedFd, name: &std::ffi::OsStr, create: bool, shown: &Path) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(parent, name, flags, Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(rustix::io::Errno::NOENT) if create => {
            match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
            Ok(rustix::fs::openat(parent, name, flags, Mode::empty())?)
        }
        // ELOOP: the last component is a symlink; ENOTDIR: it is something else.
        Err(rustix::io::Errno::LOOP) | Err(rustix::io::Errno::NOTDIR) => {
            Err(refused(format!("{} is a symlink or not a directory; nothing is written through it", shown.display())))
        }
        Err(e) => Err(e.into()),
    }
}

/// Walks `dirs` below `root` without following a symlink, creating missing directories when
/// `create`. The directory the file goes in.
fn walk(root: &Path, dirs: &[&std::ffi::OsStr], create: bool) -> io::Result<OwnedFd> {
    let mut fd = open_root(root)?;
    let mut shown = PathBuf::new();
    for d in dirs {
        shown.push(d);
        fd = open_dir_in(&fd, d, create, &shown)?;
    }
    Ok(fd)
}

/// Writes `from` (read to its end) to `rel` below `root`, with `mode`. Refuses a symlink (or
/// anything but a regular file) where the file or any directory on its way is; a regular
/// file there is replaced, never written through (it may be a hard link to another file).
pub fn write_beneath(root: &Path, rel: &Path, from: &mut dyn Read, mode: u32) -> io::Result<u64> {
    let (dirs, name) = split_relative(rel)?;
    let dir = walk(root, &dirs, true)?;
    match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => rustix::fs::unlinkat(&dir, name, AtFlags::empty())?,
            FileType::Symlink => return Err(refused(format!("{} is a symlink; it is not written", rel.display()))),
            _ => return Err(refused(format!("{} is not a regular file; it is not written", rel.display()))),
        },
        Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    create_in(&dir, name, from, mode)
}

/// Writes `from` (read to its end) to `rel` below `root`, with `mode`, as a new file: if
/// anything is there already (a file, a symlink, a directory), the error is `AlreadyExists`
/// and nothing is replaced or written. For what another machine sent (a carried session),
/// which must never overwrite a file of this one.
pub fn create_beneath(root: &Path, rel: &Path, from: &mut dyn Read, mode: u32) -> io::Result<u64> {
    let (dirs, name) = split_relative(rel)?;
    let dir = walk(root, &dirs, true)?;
    create_in(&dir, name, from, mode).map_err(|e| match e.kind() {
        io::ErrorKind::AlreadyExists => {
            io::Error::new(io::ErrorKind::AlreadyExists, format!("{} exists; it is not replaced", rel.display()))
        }
        _ => e,
    })
}

/// Creates `name` in `dir` new (`O_EXCL`, never through a symlink) and copies `from` into it.
fn create_in(dir: &OwnedFd, name: &std::ffi::OsStr, from: &mut dyn Read, mode: u32) -> io::Result<u64> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut file = File::from(rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(mode))?);
    let n = io::copy(from, &mut file)?;
    file.flush()?;
    Ok(n)
}

/// Removes the regular file `rel` below `root`, as [`write_beneath`] wrote it, never through
/// a symlinked directory. Anything else there (a symlink the branch tracks, say) was never
/// written by it and is left alone, as is a missing file.
pub fn remove_beneath(root: &Path, rel: &Path) -> io::Result<()> {
    let (dirs, name) = split_relative(rel)?;
    let dir = match walk(root, &dirs, false) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {}
        Ok(_) | Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Creates `path` new, readable and writable only by this user, never through a link: what
/// is at `path` already (a stale file, or a symlink or FIFO an agent planted) is unlinked
/// first.
pub fn create_private(path: &Path) -> io::Result<File> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(File::from(rustix::fs::openat(CWD, path, flags, Mode::from_raw_mode(0o600))?))
}

/// Opens `path` for appending, creating it private (0600) if missing; refuses a symlink or
/// anything but a regular file there.
pub fn append_private(path: &Path) -> io::Result<File> {
    let flags =
        OFlags::WRONLY | OFlags::CREATE | OFlags::APPEND | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(CWD, path, flags, Mode::from_raw_mode(0o600)).map_err(|e| match e {
        rustix::io::Errno::LOOP => refused(format!("{} is a symlink; it is not written", path.display())),
        e => e.into(),
    })?;
    if FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) != FileType::RegularFile {
        return Err(refused(format!("{} is not a regular file; it is not written", path.display())));
    }
    // Blocking again for the writes: O_NONBLOCK only kept a FIFO from wedging the open.
    let flags = rustix::fs::fcntl_getfl(&fd)? - OFlags::NONBLOCK;
    rustix::fs::fcntl_setfl(&fd, flags)?;
    Ok(File::from(fd))
}

/// Opens `path` for reading if it is a regular file, without following a symlink and without
/// blocking on a FIFO; `None` if there is nothing there or something else.
pub fn open_regular(path: &Path) -> io::Result<Option<File>> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(CWD, path, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP | rustix::io::Errno::NXIO) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) != FileType::RegularFile {
        return Ok(None);
    }
    Ok(Some(File::from(fd)))
}

/// Creates `dir` (and its parents) and makes `dir` itself private to this user (0700).
pub fn private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(refused(format!("{} is not a directory", dir.display())));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// What [`read_regular`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// Nothing at the path.
    Missing,
    Read(Vec<u8>),
    /// Something that is not read, and why (a symlink, a FIFO, a device, too large).
    Refused(String),
}

/// Reads `path` if it is a regular file of at most `cap` bytes: opened without following a
/// symlink and without blocking (a FIFO or a device is refused, not waited on). Blocking
/// I/O: call it off the async runtime.
pub fn read_regular(path: &Path, cap: u64) -> io::Result<Found> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(CWD, path, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(Found::Missing),
        Err(rustix::io::Errno::LOOP) => return Ok(Found::Refused("it is a symlink".into())),
        // An unopenable FIFO (no writer, on some systems) or a socket.
        Err(rustix::io::Errno::NXIO) => return Ok(Found::Refused("it is not a regular file".into())),
        Err(e) => return Err(e.into()),
    };
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Ok(Found::Refused("it is not a regular file".into()));
    }
    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    if size > cap {
        return Ok(Found::Refused(format!("it is {size} bytes, more than the {cap} read")));
    }
    let mut buf = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    // `take`: a file that grows while it is read still stops at the cap.
    File::from(fd).take(cap + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > cap {
        return Ok(Found::Refused(format!("it grew past the {cap} bytes read")));
    }
    Ok(Found::Read(buf))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    /// A write below a root never follows a symlink, at the file or at a directory on its
    /// way, and never leaves the root; a regular file is replaced, not written through.
    #[test]
    fn writes_never_follow_links_or_leave_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("wt");
        std::fs::create_dir(&root).unwrap();
        let victim = tmp.path().join("victim.txt");
        std::fs::write(&victim, "mine\n").unwrap();
        let mut data: &[u8] = b"API_KEY=1\n";
        symlink(&victim, root.join(".envrc")).unwrap();
        let e = write_beneath(&root, Path::new(".envrc"), &mut data, 0o600).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        symlink(tmp.path(), root.join("conf")).unwrap();
        assert!(write_beneath(&root, Path::new("conf/victim.txt"), &mut data, 0o600).is_err());
        assert!(write_beneath(&root, Path::new("../victim.txt"), &mut data, 0o600).is_err());
        assert!(write_beneath(&root, Path::new("/etc/x"), &mut data, 0o600).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine\n", "the victim is untouched");
        // A hard link in the worktree is replaced, so the file it shared is untouched.
        std::fs::hard_link(&victim, root.join(".env")).unwrap();
        write_beneath(&root, Path::new(".env"), &mut data, 0o600).unwrap();
        assert_eq!(std::fs::read_to_string(root.join(".env")).unwrap(), "API_KEY=1\n");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine\n");
        let mut more: &[u8] = b"x";
        write_beneath(&root, Path::new("deep/er/file"), &mut more, 0o600).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("deep/er/file")).unwrap(), "x");
        remove_beneath(&root, Path::new(".envrc")).unwrap();
        assert!(victim.exists() && std::fs::symlink_metadata(root.join(".envrc")).is_ok(), "a link is not ours");
        remove_beneath(&root, Path::new(".env")).unwrap();
        assert!(!root.join(".env").exists(), "the file it wrote is removed");
        assert!(remove_beneath(&root, Path::new("conf/victim.txt")).is_err(), "not through a symlinked dir");
        assert!(victim.exists());
    }

    /// What another machine sent is only created: a file, a hard link or a symlink already at
    /// the path is left as it is, and the write says so.
    #[test]
    fn a_create_never_replaces_what_is_there() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim.jsonl");
        std::fs::write(&victim, "mine\n").unwrap();
        let root = tmp.path().join("cli");
        std::fs::create_dir_all(root.join("sessions")).unwrap();
        std::fs::write(root.join("sessions/other.jsonl"), "theirs\n").unwrap();
        std::fs::hard_link(&victim, root.join("sessions/linked.jsonl")).unwrap();
        symlink(&victim, root.join("sessions/link.jsonl")).unwrap();
        for name in ["other.jsonl", "linked.jsonl", "link.jsonl"] {
            let mut data: &[u8] = b"carried\n";
            let e = create_beneath(&root, &Path::new("sessions").join(name), &mut data, 0o600).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{name}: {e}");
        }
        assert_eq!(std::fs::read_to_string(root.join("sessions/other.jsonl")).unwrap(), "theirs\n");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine\n");
        let mut data: &[u8] = b"carried\n";
        assert_eq!(create_beneath(&root, Path::new("sessions/new/s.jsonl"), &mut data, 0o600).unwrap(), 8);
    }

    /// A FIFO, a symlink to /dev/zero and an oversized file are refused, without blocking.
    #[test]
    fn reads_refuse_what_is_not_a_small_regular_file() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("fifo");
        rustix::fs::mknodat(CWD, &fifo, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
        assert!(matches!(read_regular(&fifo, 64).unwrap(), Found::Refused(_)));
        let zero = tmp.path().join("zero");
        symlink("/dev/zero", &zero).unwrap();
        assert_eq!(read_regular(&zero, 64).unwrap(), Found::Refused("it is a symlink".into()));
        let big = tmp.path().join("big");
        std::fs::write(&big, vec![b'x'; 65]).unwrap();
        assert!(matches!(read_regular(&big, 64).unwrap(), Found::Refused(_)));
        std::fs::write(&big, b"{}").unwrap();
        assert_eq!(read_regular(&big, 64).unwrap(), Found::Read(b"{}".to_vec()));
        assert_eq!(read_regular(&tmp.path().join("none"), 64).unwrap(), Found::Missing);
    }

    /// DevPilot's own files are created new and private, replacing a planted symlink rather
    /// than writing through it; private dirs are 0700.
    #[test]
    fn private_files_replace_planted_links() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("payloads");
        private_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "mine").unwrap();
        let p = dir.join("job-1-1.json");
        symlink(&victim, &p).unwrap();
        create_private(&p).unwrap().write_all(b"{}").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        let log = dir.join("job-1.log");
        symlink(&victim, &log).unwrap();
        assert!(append_private(&log).is_err());
    }
}
