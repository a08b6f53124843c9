//! The runner keeps no secret where its agent can read it.
//!
//! An agent runs as the same user as its runner, so it can read the runner's
//! `/proc/<pid>/environ` (where `DEVPILOT_DATABASE_URL`, with its password, would be) and,
//! while the process is dumpable, its memory through `/proc/<pid>/mem` or ptrace. So at
//! start, before any thread exists, [`seal`]:
//! - takes the secret variables (`DEVPILOT_DATABASE_URL`, `PGPASSWORD`, `LINEAR_API_KEY`,
//!   `GITHUB_TOKEN`, and each host's `GITHUB_TOKEN_<HOST>`) out of the process's
//!   environment: their values are kept in memory for this process, their bytes in the
//!   original environment block (what `/proc/<pid>/environ` shows) are overwritten, and the
//!   variables are removed, so no child inherits them either;
//! - marks the process non-dumpable (`PR_SET_DUMPABLE` 0): `/proc/<pid>/environ`, `mem`
//!   and `maps` then belong to root, and a process of the same user can no longer attach.
//!
//! What a same-user agent can still reach is the user's: the keychain, `~/.pgpass`, files.
//! The README's security model says so; the agent CLI's own sandbox is what confines that.

use std::collections::BTreeMap;
use std::sync::OnceLock;

/// The variables taken out of the environment.
const SECRET_VARS: [&str; 4] = ["DEVPILOT_DATABASE_URL", "PGPASSWORD", "LINEAR_API_KEY", "GITHUB_TOKEN"];

/// What [`seal`] took, by variable (in the order of [`SECRET_VARS`]).
static TAKEN: OnceLock<[Option<String>; 4]> = OnceLock::new();

/// The prefix of a GitHub token for one host other than github.com (GitHub Enterprise).
const HOST_TOKEN_PREFIX: &str = "GITHUB_TOKEN_";

/// The per-host GitHub tokens [`seal`] took, by variable name.
static TAKEN_HOSTS: OnceLock<BTreeMap<String, String>> = OnceLock::new();

/// Takes the secrets out of this process's environment and makes it non-dumpable. Call it
/// first thing in `main`, before any thread is started (the environment is not thread-safe).
/// Idempotent.
pub fn seal() {
    TAKEN.get_or_init(|| {
        let taken = SECRET_VARS.map(take);
        let names: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| k.starts_with(HOST_TOKEN_PREFIX))
            .collect();
        let hosts = names.into_iter().filter_map(|n| take(&n).map(|v| (n, v))).collect();
        let _ = TAKEN_HOSTS.set(hosts);
        #[cfg(target_os = "linux")]
        // SAFETY: prctl(PR_SET_DUMPABLE) changes only this process's own flag.
        unsafe {
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        }
        taken
    });
}

/// Reads `name`, overwrites its value's bytes where the environment holds them, and removes
/// it. The value, if it was set.
fn take(name: &str) -> Option<String> {
    let value = std::env::var(name).ok();
    scrub(name);
    // SAFETY (edition 2024 marks this unsafe): called from `seal`, before any thread exists.
    #[allow(unused_unsafe)]
    unsafe {
        std::env::remove_var(name);
    }
    value
}

/// Zeroes the value of `name` in place in `environ` (for the variables set at exec, the
/// block the kernel shows as `/proc/<pid>/environ`).
fn scrub(name: &str) {
    extern "C" {
        static mut environ: *mut *mut libc::c_char;
    }
    let prefix = format!("{name}=");
    // SAFETY: `environ` is a NULL-terminated array of NUL-terminated strings that this
    // single-threaded process owns; each write stays within one string's own bytes.
    unsafe {
        let mut entry = environ;
        while !entry.is_null() && !(*entry).is_null() {
            let s = std::ffi::CStr::from_ptr(*entry);
            let bytes = s.to_bytes();
            if bytes.starts_with(prefix.as_bytes()) {
                let value = (*entry).add(prefix.len()).cast::<u8>();
                std::ptr::write_bytes(value, 0, bytes.len() - prefix.len());
            }
            entry = entry.add(1);
        }
    }
}

/// `DEVPILOT_DATABASE_URL` as the process started with it: what [`seal`] took, or (in a
/// process that did not seal, such as a test) the variable itself.
pub fn env_database_url() -> Option<String> {
    taken_or_env(0).filter(|u| !u.trim().is_empty())
}

/// `PGPASSWORD` as the process started with it (see [`env_database_url`]).
pub fn env_pgpassword() -> Option<String> {
    taken_or_env(1).filter(|p| !p.is_empty())
}

/// `LINEAR_API_KEY` as the process started with it (see [`env_database_url`]).
pub fn env_linear_api_key() -> Option<String> {
    taken_or_env(2).map(|k| k.trim().to_string()).filter(|k| !k.is_empty())
}

/// `GITHUB_TOKEN` as the process started with it (see [`env_database_url`]).
pub fn env_github_token() -> Option<String> {
    taken_or_env(3).map(|k| k.trim().to_string()).filter(|k| !k.is_empty())
}

/// The variable that holds the GitHub token for `host` (host and port, as
/// `sources::keys::host_of` writes them): `GITHUB_TOKEN_` and the host, uppercase, with
/// every character that is not a letter or a digit written `_` (`ghe.corp:8443` →
/// `GITHUB_TOKEN_GHE_CORP_8443`).
pub fn github_token_var(host: &str) -> String {
    let host: String =
        host.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    format!("{HOST_TOKEN_PREFIX}{host}")
}

/// The GitHub token for `host` ([`github_token_var`]) as the process started with it (see
/// [`env_database_url`]).
pub fn env_github_token_at(host: &str) -> Option<String> {
    let var = github_token_var(host);
    let value = match TAKEN_HOSTS.get() {
        Some(taken) => taken.get(&var).cloned(),
        None => std::env::var(&var).ok(),
    };
    value.map(|k| k.trim().to_string()).filter(|k| !k.is_empty())
}

fn taken_or_env(i: usize) -> Option<String> {
    match TAKEN.get() {
        Some(taken) => taken[i].clone(),
        None => std::env::var(SECRET_VARS[i]).ok(),
    }
}

#[cfg(test)]
mod tests {
    /// A sealed process is non-dumpable and its secret variables are gone from the
    /// environment (children do not inherit them), while the values stay readable to it.
    /// Run in a child process of its own, since sealing cannot be undone.
    #[test]
    fn sealing_takes_the_secrets_and_the_dumpable_flag() {
        if std::env::var("DEVPILOT_SEAL_CHILD").is_ok() {
            super::seal();
            assert_eq!(super::env_database_url().as_deref(), Some("postgres://u:hunter2@h/d"));
            assert!(std::env::var("DEVPILOT_DATABASE_URL").is_err());
            assert_eq!(super::env_github_token_at("ghe.corp").as_deref(), Some("ghp_hunter3"));
            assert!(std::env::var("GITHUB_TOKEN_GHE_CORP").is_err(), "a host's token is taken too");
            let environ = std::fs::read("/proc/self/environ").unwrap();
            assert!(!environ.windows(7).any(|w| w == b"hunter2"), "scrubbed in place");
            assert!(!environ.windows(7).any(|w| w == b"hunter3"), "a host's token scrubbed in place");
            // SAFETY: reads this process's own flag.
            assert_eq!(unsafe { libc::prctl(libc::PR_GET_DUMPABLE) }, 0);
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args(["--exact", "seal::tests::sealing_takes_the_secrets_and_the_dumpable_flag", "--nocapture"])
            .env("DEVPILOT_SEAL_CHILD", "1")
            .env("DEVPILOT_DATABASE_URL", "postgres://u:hunter2@h/d")
            .env("GITHUB_TOKEN_GHE_CORP", "ghp_hunter3")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "the child ran the test");
    }
}
