//! One job's sandbox, from the runner's [`Plan`] and the agent it starts: the system and
//! home ([`super::view`]), the preset's state and hosts ([`crate::preset::confined`]), the
//! job's directory and files, git ([`crate::worktree::confine::GitView`]) and what the settings add.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::hosts::{Allowlist, HostPort};
use super::jail::{Jail, JailSpec};
use super::mounts::{Mount, Mounts};
use super::view;
use crate::preset::confined::State;
use crate::preset::Preset;

/// How one job's agent is confined, as the runner decided it before starting it.
#[derive(Clone, Debug)]
pub struct Plan {
    pub bwrap: PathBuf,
    /// The agent's git, for a job with a worktree.
    pub git: Option<crate::worktree::confine::GitView>,
    /// Hosts the settings add (the repo's and the machine's `allow_hosts`).
    pub allow: Vec<HostPort>,
    /// Paths the settings show read-only, and writable.
    pub read_only: Vec<PathBuf>,
    pub read_write: Vec<PathBuf>,
    /// The job's private directory outside the sandbox (its egress socket goes there).
    pub private: PathBuf,
    /// The name and email the agent's commits carry (the user's own, read outside: the
    /// user's git config is not shown inside).
    pub identity: (String, String),
}

/// What the agent is, for its sandbox.
pub struct Agent<'a> {
    pub preset: Option<Preset>,
    pub program: &'a Path,
    /// The arguments a person configured (a plain command's, a setup's): each that names a
    /// file is shown read-only, with its directory. Never a preset's (they hold the prompt).
    pub args: &'a [OsString],
    /// Its environment (before the sandbox's changes).
    pub env: &'a BTreeMap<OsString, OsString>,
    /// The attempt's own directory of files (payload, result, prompt); none for a setup
    /// command.
    pub files: Option<&'a Path>,
    pub cwd: &'a Path,
}

impl Plan {
    /// The sandbox for `agent`, its egress proxy serving.
    pub fn jail(&self, agent: &Agent) -> std::io::Result<Jail> {
        let home = agent.env.get(&OsString::from("HOME")).map(PathBuf::from).filter(|h| h.is_absolute());
        let mut m = view::base(home.as_deref(), agent.env.get(&OsString::from("PATH")).map(OsString::as_os_str));
        let mut hosts = self.allow.clone();
        match &home {
            Some(h) => {
                view::program(&mut m, h, agent.program);
                for a in agent.args.iter().map(Path::new).filter(|a| a.is_absolute() && a.is_file()) {
                    view::program(&mut m, h, a);
                }
                if let Some(p) = agent.preset {
                    preset_state(&mut m, p.state(h, agent.env), &self.private)?;
                    hosts.extend(p.hosts(h, agent.env));
                }
            }
            None => {
                if let Some(dir) = agent.program.parent() {
                    m.read_only(dir);
                }
            }
        }
        for p in &self.read_only {
            m.read_only(p);
        }
        for p in &self.read_write {
            m.writable(p);
        }
        if let Some(f) = agent.files {
            m.set(f, Mount::ReadWrite);
        }
        m.set(agent.cwd, Mount::ReadWrite);
        if let Some(g) = &self.git {
            g.mount(&mut m);
        }
        // The user's git config is not shown: the agent's git gets one of its own, with the
        // user's name (a CLI such as aider writes one into the repository when none is set).
        let config = self.private.join("gitconfig");
        crate::safe_fs::private_dir(&self.private)?;
        std::io::Write::write_all(&mut crate::safe_fs::create_private(&config)?, self.git_config().as_bytes())?;
        m.set(&config, Mount::ReadOnly);
        Jail::new(JailSpec {
            bwrap: self.bwrap.clone(),
            mounts: m,
            allow: Allowlist::new(hosts),
            private: self.private.clone(),
            cwd: agent.cwd.to_path_buf(),
        })
    }

    /// A command (a repo's setup) run confined like an agent with no preset: `program args`
    /// in `cwd`, with `vars` changed for the sandbox. The jail must live while it runs.
    pub fn command(
        &self,
        program: &Path,
        args: Vec<OsString>,
        vars: &mut BTreeMap<OsString, OsString>,
        cwd: &Path,
    ) -> std::io::Result<(Jail, PathBuf, Vec<OsString>)> {
        let jail = self.jail(&Agent { preset: None, program, args: &args, env: vars, files: None, cwd })?;
        jail.env(vars);
        vars.extend(self.git_env().into_iter().map(|(k, v)| (k.into(), v.into())));
        let (p, a) = jail.wrap(program, args);
        Ok((jail, p, a))
    }

    /// Removes the job's private directory (its egress socket, its git config), after the
    /// agent.
    pub fn done(&self) {
        if let Err(e) = std::fs::remove_dir_all(&self.private) {
            tracing::debug!(dir = %self.private.display(), error = %e, "could not remove a sandbox's private dir");
        }
    }

    /// The agent's own global git config: who it commits as.
    fn git_config(&self) -> String {
        let quoted = |v: &str| {
            let v: String = v.chars().filter(|c| !c.is_control()).collect();
            format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
        };
        let (name, email) = &self.identity;
        format!("[user]\n\tname = {}\n\temail = {}\n", quoted(name), quoted(email))
    }

    /// The agent's variables for git inside: where its objects go, its own global config,
    /// and who it commits as.
    pub fn git_env(&self) -> Vec<(String, String)> {
        let mut vars = self.git.as_ref().map(|g| g.env()).unwrap_or_default();
        vars.push(("GIT_CONFIG_GLOBAL".into(), self.private.join("gitconfig").to_string_lossy().into_owned()));
        vars.push(("GIT_CONFIG_NOSYSTEM".into(), "1".into()));
        let (name, email) = &self.identity;
        for who in ["AUTHOR", "COMMITTER"] {
            vars.push((format!("GIT_{who}_NAME"), name.clone()));
            vars.push((format!("GIT_{who}_EMAIL"), email.clone()));
        }
        vars
    }
}

/// The preset's state: its directories made (0700) when missing and shown writable, its
/// files shown writable and its config read-only when they exist, the files the user's own
/// CLI obeys read-only (made first, inert, when missing), and a copy of its own (in the
/// job's `private` directory) of a file that both changes and says what the CLI runs.
fn preset_state(m: &mut Mounts, state: Vec<State>, private: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    for s in state {
        match s {
            State::Dir(d) => {
                std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&d)?;
                m.set(d, Mount::ReadWrite);
            }
            State::File(f) => {
                m.writable(&f);
            }
            State::Config(f) => {
                m.read_only(&f);
            }
            State::Guarded { path, inert } => {
                if path.symlink_metadata().is_err() {
                    std::io::Write::write_all(&mut crate::safe_fs::create_private(&path)?, inert.as_bytes())?;
                }
                m.set(path, Mount::ReadOnly);
            }
            State::Copied(f) => {
                let Ok(crate::safe_fs::Found::Read(bytes)) = crate::safe_fs::read_regular(&f, 64 << 20) else {
                    continue;
                };
                crate::safe_fs::private_dir(private)?;
                let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let copy = private.join(format!("copy{name}"));
                std::io::Write::write_all(&mut crate::safe_fs::create_private(&copy)?, &bytes)?;
                m.set(f, Mount::FromWritable(copy));
            }
        }
    }
    Ok(())
}
