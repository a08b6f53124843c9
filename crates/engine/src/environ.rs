//! What the processes DevPilot starts may see of its environment: allowlists, never
//! denylists. A runner's environment can hold a database URL with its password, a
//! `GITHUB_TOKEN`, cloud keys; none of that is an agent's business, and a new secret that
//! appears in the user's shell next year must not reach an agent either. So every child gets
//! only the variables named here (exact names, or `PREFIX*` patterns), plus what the user's
//! settings add (`pass_env`), plus the job's own `DEVPILOT_*` variables, which the caller
//! sets.
//!
//! - [`BASE`]: what any program needs to run as this user (PATH, HOME, the locale, the temp
//!   dir, the XDG base dirs, proxies and CA bundles to reach an API).
//! - [`crate::preset::Preset::env_needs`]: what each agent CLI reads (its API keys and base
//!   URLs), so a key in the user's environment still reaches its CLI.
//! - [`GIT`]: what DevPilot's own git calls need to fetch and push over https and ssh, and
//!   the user's own identity and config location.

use std::ffi::OsString;

/// Variables every child gets, when set.
pub const BASE: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TERM",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
];

/// What DevPilot's own git calls get besides [`BASE`]: ssh and its agent, askpass programs
/// the user chose, the user's git identity and config location, and CA settings.
pub const GIT: &[&str] = &[
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "SSH_ASKPASS",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_SSH_VARIANT",
    "GIT_ASKPASS",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_CONFIG_NOSYSTEM",
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "GIT_ALLOW_PROTOCOL",
    "CURL_CA_BUNDLE",
    "GNUPGHOME",
    "DISPLAY",
    "DBUS_SESSION_BUS_ADDRESS",
];

/// Whether `name` is allowed by `pattern`: equal, or a `PREFIX*` pattern it starts with.
pub fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// A `pass_env` entry: a variable name, or a `PREFIX*` pattern with a non-empty prefix.
pub fn validate_pattern(p: &str) -> devpilot_store::Result<()> {
    let name = p.strip_suffix('*').unwrap_or(p);
    let ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(devpilot_store::Error::Invalid(format!(
            "pass_env '{p}' is not a variable name or a PREFIX* pattern (letters, digits and '_')"
        )))
    }
}

/// The variables of this process's environment that one of `lists` allows, in a stable
/// order. Never a `DEVPILOT_*` variable of the runner's own (its database URL, its settings):
/// the job's are set by the caller.
pub fn allowed(lists: &[&[&str]], extra: &[String]) -> Vec<(OsString, OsString)> {
    let ok = |name: &str| {
        !name.starts_with("DEVPILOT_")
            && (lists.iter().any(|l| l.iter().any(|p| matches(p, name))) || extra.iter().any(|p| matches(p, name)))
    };
    let mut vars: Vec<(OsString, OsString)> = std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(ok)).collect();
    vars.sort();
    vars
}

/// `prog` as this process would run it: a path, or the first executable file of that name
/// on `PATH`.
pub fn which(prog: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable =
        |p: &std::path::Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if prog.contains('/') {
        let p = std::path::PathBuf::from(prog);
        return executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join(prog)).find(|p| executable(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Patterns match by name or prefix; a bad pass_env entry is refused by name.
    #[test]
    fn patterns() {
        assert!(matches("LC_*", "LC_ALL") && matches("PATH", "PATH") && !matches("PATH", "PATHX"));
        assert!(!matches("ANTHROPIC_*", "OPENAI_API_KEY"));
        assert!(validate_pattern("AWS_*").is_ok() && validate_pattern("MY_TOKEN").is_ok());
        assert!(validate_pattern("*").is_err() && validate_pattern("A B").is_err() && validate_pattern("").is_err());
    }
}
