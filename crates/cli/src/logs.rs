//! `devpilot logs ID [-f]`: a job's agent output, from this machine's log file when it ran
//! here, else from the tail its holder stores in the database with each heartbeat, so a job
//! running on another machine can be followed from this one (`kubectl logs -f`).
//!
//! The output is an agent's, that is a stranger's: it is read only from a regular file (never
//! through a link) and printed inert (no escape sequence reaches the terminal).

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::time::Duration;

use devpilot_engine::config::Paths;
use devpilot_store::db::PoolSettings;
use devpilot_store::error::Result;
use devpilot_store::job::JobState;
use devpilot_store::queue::{JobRow, Queue};

use crate::exit::{Code, Fail, Out};
use crate::open::open_queue;
use crate::output::{inert, shown};

/// How often `-f` looks for more in this machine's log file, and in the tail another
/// machine stores (which it renews only at its heartbeat, so a faster look at the shared
/// database would only repeat a read).
const FOLLOW_EVERY: Duration = Duration::from_millis(300);
const FOLLOW_STORED_EVERY: Duration = Duration::from_secs(2);

/// Where a job's output is read from now.
#[derive(Clone, Debug, PartialEq, Eq)]
enum From {
    /// This machine's log file.
    Local(PathBuf),
    /// The tail stored by the machine that holds (or last held) the job.
    Stored,
}

/// A job's output as `show` prints its end: the text, and where it came from.
#[derive(Debug, Default)]
pub struct Tail {
    /// `local`, or the machine that stored it.
    pub from: Option<String>,
    pub text: String,
}

fn log_file(id: i64) -> Option<PathBuf> {
    let path = Paths::for_app("devpilot").ok()?.job_log(id);
    path.exists().then_some(path)
}

fn this_machine() -> String {
    Paths::for_app("devpilot")
        .and_then(|p| p.load())
        .map(|s| s.machine_name())
        .unwrap_or_else(|_| devpilot_engine::settings::default_machine_name())
}

/// This machine's file, unless another machine runs the job now.
fn source_of(job: &JobRow, me: &str) -> From {
    let elsewhere = job.state == JobState::Running && job.claimed_by.as_deref() != Some(me);
    match log_file(job.id) {
        Some(path) if !elsewhere => From::Local(path),
        _ => From::Stored,
    }
}

/// Reads a regular file from `offset` on, at most `max` bytes of its end; its new length.
fn read_from(path: &std::path::Path, offset: u64, max: u64) -> (String, u64) {
    let Ok(Some(mut f)) = devpilot_engine::safe_fs::open_regular(path) else { return (String::new(), offset) };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = if len < offset { 0 } else { offset.max(len.saturating_sub(max)) };
    let mut buf = vec![];
    let _ = f.seek(SeekFrom::Start(start)).and_then(|_| f.take(len - start).read_to_end(&mut buf));
    (String::from_utf8_lossy(&buf).into_owned(), len)
}

/// The end of a job's output, at most `max` bytes.
pub async fn tail(queue: &Queue, job: &JobRow, max: u64) -> Result<Tail> {
    match source_of(job, &this_machine()) {
        From::Local(path) => {
            let text = tokio::task::spawn_blocking(move || read_from(&path, 0, max).0).await.unwrap_or_default();
            Ok(Tail { from: Some("local".into()), text })
        }
        From::Stored => Ok(match queue.log_tail(job.id).await? {
            Some(t) => Tail { from: Some(t.machine), text: t.tail },
            None => Tail::default(),
        }),
    }
}

/// What `now` adds to the stored window `before` (both the last bytes of one log, `now` the
/// later): the window drops bytes from its front and gains new ones at its end, so the new
/// part follows the longest end of `before` that `now` starts with; all of `now` when none.
fn delta<'a>(before: &str, now: &'a str) -> &'a str {
    before.char_indices().find_map(|(k, _)| now.strip_prefix(&before[k..])).unwrap_or(now)
}

/// `devpilot logs ID [-f]`.
pub async fn logs(id: i64, follow: bool) -> Out {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let me = this_machine();
    let mut out = std::io::stdout().lock();
    let (mut seen, mut offset, mut last_source, mut token) = (String::new(), 0u64, None::<From>, None::<i64>);
    let mut ended_with_newline = true;
    loop {
        let (job, _) = queue.job(id).await?.ok_or(Fail::not_found_job(id))?;
        let source = source_of(&job, &me);
        if last_source.as_ref().is_some_and(|s| *s != source) {
            (seen, offset, token) = (String::new(), 0, None);
            eprintln!("-- #{id} now runs on {} --", shown(job.claimed_by.as_deref().or(Some("another machine"))));
        }
        let text = match &source {
            From::Local(path) => {
                let (path, at) = (path.clone(), offset);
                let (text, len) =
                    tokio::task::spawn_blocking(move || read_from(&path, at, 1 << 20)).await.unwrap_or_default();
                offset = len;
                text
            }
            From::Stored => match queue.log_tail(id).await? {
                Some(t) => {
                    if token.is_some_and(|k| k != t.claim_token) {
                        seen.clear();
                    }
                    token = Some(t.claim_token);
                    let new = delta(&seen, &t.tail).to_string();
                    seen = t.tail;
                    new
                }
                None => String::new(),
            },
        };
        let every = if source == From::Stored { FOLLOW_STORED_EVERY } else { FOLLOW_EVERY };
        last_source = Some(source);
        if !text.is_empty() {
            ended_with_newline = text.ends_with('\n');
            out.write_all(inert(&text).as_bytes())?;
            out.flush()?;
        }
        if !follow || job.state.is_finished() {
            break;
        }
        tokio::time::sleep(every).await;
    }
    if !ended_with_newline {
        writeln!(out)?;
    }
    Ok(Code::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored window that grew, slid, or was replaced yields only what is new.
    #[test]
    fn delta_is_what_the_window_adds() {
        assert_eq!(delta("", "a\nb\n"), "a\nb\n");
        assert_eq!(delta("a\nb\n", "a\nb\nc\n"), "c\n");
        assert_eq!(delta("xxa\nb\n", "a\nb\nc\n"), "c\n", "the window slid");
        assert_eq!(delta("old\n", "new\n"), "new\n", "nothing in common: all of it");
        assert_eq!(delta("ééé", "éééz"), "z");
    }
}
