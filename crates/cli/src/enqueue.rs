//! `devpilot enqueue`: its flags, the payload they build, and the job options they ask for.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use devpilot_engine::config::Paths;
use devpilot_engine::span::parse_duration;
use devpilot_store::db::PoolSettings;
use devpilot_store::error::{Error, Result};
use devpilot_store::queue::{Backoff, JobOptions, Start};

use crate::exit::{Code, Out};
use crate::open::open_queue;
use crate::output::json;

#[derive(clap::Args, Debug)]
pub struct EnqueueArgs {
    /// The queue, from the global `--orchestrator` (see [`crate::open::queue_name`]).
    #[arg(skip)]
    pub orchestrator: String,
    /// Print `{"id", "added", "state"}`.
    #[arg(long)]
    pub json: bool,
    #[arg(long, conflicts_with = "payload_file")]
    pub payload: Option<String>,
    #[arg(long)]
    pub payload_file: Option<PathBuf>,
    /// Attempts before the job is dead (default: the settings' max_attempts, 3).
    #[arg(long)]
    pub max_attempts: Option<i32>,
    /// A dedupe key: while a job with this key is live (queued, waiting to retry, or running)
    /// on the orchestrator, nothing is added and the live job's id is printed.
    #[arg(long)]
    pub key: Option<String>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Not claimable before this time (RFC 3339, e.g. 2026-12-01T10:00:00Z).
    #[arg(long, conflicts_with = "delay")]
    pub run_at: Option<String>,
    /// Not claimable for this long (e.g. 10m), on the database's clock.
    #[arg(long)]
    pub delay: Option<String>,
    /// This job's retry backoff: attempt n waits this times 2^(n-1) (default: the runner's).
    #[arg(long)]
    pub retry_backoff: Option<String>,
    /// The cap of this job's retry backoff (default: the runner's, 1h).
    #[arg(long)]
    pub retry_backoff_max: Option<String>,
    /// The payload's title (a job label, and the first line of a preset's prompt).
    #[arg(long)]
    pub title: Option<String>,
    /// The payload's prompt: what the agent is asked to do.
    #[arg(long)]
    pub prompt: Option<String>,
    /// The repo the job runs in (a name machines configure with `run --repo NAME=PATH`).
    #[arg(long)]
    pub repo: Option<String>,
    /// The branch the job's worktree starts from (default: the remote's default branch).
    #[arg(long)]
    pub base: Option<String>,
    /// Labels the running machine must all have, e.g. gpu,linux.
    #[arg(long)]
    pub requires: Option<String>,
    /// Where the task comes from (an issue or ticket URL).
    #[arg(long)]
    pub url: Option<String>,
    /// After a usage limit, the job waits for a person (`devpilot requeue ID` lets it go)
    /// instead of resuming by itself when its account's hold ends.
    #[arg(long)]
    pub no_resume_after_limit: bool,
}

impl EnqueueArgs {
    fn builds_payload(&self) -> bool {
        self.title.is_some()
            || self.prompt.is_some()
            || self.repo.is_some()
            || self.base.is_some()
            || self.requires.is_some()
            || self.url.is_some()
    }

    /// The payload: --payload (or the file, or stdin) with the schema flags laid over it,
    /// or only the flags when no payload is given.
    fn payload(&self) -> Result<serde_json::Value> {
        let mut value = if self.builds_payload() && self.payload.is_none() && self.payload_file.is_none() {
            serde_json::json!({})
        } else {
            read_payload(self.payload.clone(), self.payload_file.clone())?
        };
        if !self.builds_payload() {
            return Ok(value);
        }
        let obj = value.as_object_mut().ok_or_else(|| {
            Error::Payload("--title, --prompt, --repo, --base, --requires and --url need an object payload".into())
        })?;
        for (k, v) in [
            ("title", &self.title),
            ("prompt", &self.prompt),
            ("repo", &self.repo),
            ("base", &self.base),
            ("url", &self.url),
        ] {
            if let Some(v) = v {
                obj.insert(k.into(), v.clone().into());
            }
        }
        if let Some(r) = &self.requires {
            obj.insert("requires".into(), devpilot_store::spec::parse_labels(r)?.into());
        }
        Ok(value)
    }
}

/// Reads the payload from --payload, --payload-file or stdin, as JSON. Never more than the
/// payload cap (and some room for white space) is read: a 200 MB file is refused after
/// reading 2 MiB of it, not after loading it all.
fn read_payload(payload: Option<String>, payload_file: Option<PathBuf>) -> Result<serde_json::Value> {
    let limit = 2 * devpilot_store::spec::MAX_PAYLOAD as u64;
    let capped = |r: &mut dyn Read, from: &str| -> Result<String> {
        let mut s = String::new();
        r.take(limit + 1).read_to_string(&mut s).map_err(|e| Error::Payload(format!("cannot read {from}: {e}")))?;
        Ok(s)
    };
    let text = match (payload, payload_file) {
        (Some(p), _) => p,
        (None, Some(path)) => {
            let mut f = std::fs::File::open(&path)
                .map_err(|e| Error::Payload(format!("cannot read {}: {e}", path.display())))?;
            capped(&mut f, &path.display().to_string())?
        }
        (None, None) => {
            if std::io::stdin().is_terminal() {
                return Err(Error::Payload(
                    "no payload: pass --payload JSON, --payload-file PATH, or pipe JSON on stdin".into(),
                ));
            }
            capped(&mut std::io::stdin(), "stdin")?
        }
    };
    if text.len() as u64 > limit {
        return Err(Error::Payload(format!(
            "the payload is larger than {limit} bytes; a payload may be at most {} bytes (1 MiB) of JSON",
            devpilot_store::spec::MAX_PAYLOAD
        )));
    }
    serde_json::from_str(&text).map_err(|e| Error::Payload(format!("not valid JSON ({e})")))
}

/// A backoff from `--retry-backoff` and `--retry-backoff-max`, each falling back to
/// `defaults`; a cap that is not given is raised to the base if need be.
fn backoff_flags(base: Option<&str>, max: Option<&str>, defaults: Backoff) -> Result<Backoff> {
    let base = base.map(parse_duration).transpose()?.unwrap_or(defaults.base);
    let max = max.map(parse_duration).transpose()?.unwrap_or(defaults.max.max(base));
    let b = Backoff { base, max };
    b.validate()?;
    Ok(b)
}

/// The job options the flags ask for, checked before anything is sent.
fn job_options(a: &EnqueueArgs, settings: &devpilot_engine::settings::Settings) -> Result<JobOptions> {
    let start = match (&a.run_at, &a.delay) {
        (Some(t), _) => {
            let ms = devpilot_engine::span::parse_time_ms(t).map_err(|e| {
                Error::Invalid(format!("--run-at '{t}' is not an RFC 3339 time ({e}); e.g. 2026-12-01T10:00:00Z"))
            })?;
            Start::At(ms)
        }
        (None, Some(d)) => Start::After(parse_duration(d)?),
        (None, None) => Start::Now,
    };
    let backoff = match (a.retry_backoff.as_deref(), a.retry_backoff_max.as_deref()) {
        (None, None) => None,
        (base, max) => Some(backoff_flags(base, max, settings.backoff())?),
    };
    if let Some(k) = &a.key {
        devpilot_store::queue::validate_key(k)?;
    }
    Ok(JobOptions {
        max_attempts: a.max_attempts.unwrap_or(settings.max_attempts),
        key: a.key.clone(),
        priority: a.priority,
        start,
        backoff,
        source: None,
    })
}

/// Adds the job; exits 4 ([`Code::Nothing`]) when `--key` found the live job instead.
pub async fn enqueue(a: EnqueueArgs) -> Out {
    devpilot_store::queue::validate_orchestrator(&a.orchestrator)?;
    let settings = Paths::for_app("devpilot")?.load()?;
    let opts = job_options(&a, &settings)?;
    let value = a.payload()?;
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let added = queue.enqueue_keyed(&a.orchestrator, &value, &opts).await?;
    if a.no_resume_after_limit && added.existing.is_none() {
        queue.set_resume_after_limit(&a.orchestrator, added.id, false).await?;
    }
    let state = added.existing.unwrap_or(devpilot_store::job::JobState::Queued);
    if a.json {
        json(&serde_json::json!({"id": added.id, "added": added.existing.is_none(), "state": state}));
    } else {
        println!("{}", added.id);
    }
    match added.existing {
        None => Ok(Code::Ok),
        Some(state) => {
            eprintln!(
                "job #{} with key '{}' is already live ({state}); nothing was added",
                added.id,
                opts.key.as_deref().unwrap_or_default()
            );
            Ok(Code::Nothing)
        }
    }
}
