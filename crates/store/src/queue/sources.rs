//! Tracker sources: a machine registers the sources it has configured, takes the fleet's
//! intake turn with one conditional UPDATE, and ends the turn with a write fenced by it. The
//! jobs a source added are found again by their unique key.
//!
//! The turn is the article's claim, applied to "poll this tracker now": whichever online
//! machine has the source configured may take it, and zero rows means another machine has
//! this interval's turn. Every later write of the turn names it (`turn`), so a machine that
//! stalled past the interval cannot move the cursor back over a newer turn's.

use std::time::Duration;

use sea_orm::{FromQueryResult, Value};
use serde::Serialize;

use super::dialect::Sql;
use super::history::{Detail, History};
use super::options::{millis, truncate, validate_orchestrator};
use super::pool::Queue;
use super::rows::{decode, decode_first, first_i64};
use crate::error::Result;
use crate::job::JobState;

/// A source as a machine has it configured.
#[derive(Clone, Debug)]
pub struct SourceSpec<'a> {
    /// The name in the settings (`[sources.NAME]`): unique per orchestrator.
    pub name: &'a str,
    /// `linear` or `github`.
    pub kind: &'a str,
    /// The filter as text: registering a different one resets the cursor.
    pub filter: &'a str,
    /// How often the fleet polls it, all machines together.
    pub interval: Duration,
}

/// A source's row, for status and for the intake.
#[derive(Clone, Debug, Serialize, FromQueryResult)]
pub struct SourceRow {
    pub id: i64,
    pub name: String,
    pub kind: String,
    pub filter: String,
    pub interval_ms: i64,
    /// The `updatedAt` watermark of the last turn that ended well.
    pub cursor: Option<String>,
    /// The `ETag` of that turn's read, if it was one page (GitHub).
    pub etag: Option<String>,
    pub turn: i64,
    pub polled_at: Option<i64>,
    pub polled_by: Option<String>,
    /// No turn before this (a rate limit said so).
    pub hold_until: Option<i64>,
    pub last_ok_at: Option<i64>,
    pub last_error: Option<String>,
    pub last_error_at: Option<i64>,
    /// Requests left in the tracker's window, and when it resets (ms), as last seen.
    pub rate_remaining: Option<i64>,
    pub rate_reset_at: Option<i64>,
    /// Outbox rows not yet delivered or given up.
    pub backlog: i64,
    /// The newest issue of the source edited after its label approved it and not labelled
    /// again since: `github:acme/webapp#7: edited after approval; …`.
    pub notice: Option<String>,
    /// Outbox rows that named another issue, repo or team than the source's own, or that no
    /// state change wrote: ended `refused`, acting on nothing.
    pub refused: i64,
    /// The newest refused row's reason.
    pub refusal: Option<String>,
    /// The database clock when the row was read.
    pub now: i64,
}

impl SourceRow {
    /// When the next turn may be taken (ms, database clock).
    pub fn next_turn_at(&self) -> i64 {
        let after_interval = self.polled_at.map_or(self.now, |p| p + self.interval_ms);
        after_interval.max(self.hold_until.unwrap_or(0))
    }
}

/// An intake turn this machine holds: every write it makes names it.
#[derive(Clone, Debug, PartialEq, Eq, FromQueryResult)]
pub struct Turn {
    #[sea_orm(alias = "id")]
    pub source: i64,
    pub turn: i64,
    pub cursor: Option<String>,
    /// The `ETag` of the read that set the cursor (GitHub), for `If-None-Match`.
    pub etag: Option<String>,
}

/// What a try at the turn found: the turn, or when the next one is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnTry {
    /// The turn, if this machine took it.
    pub turn: Option<Turn>,
    /// Milliseconds until the next turn may be taken (after this one, if it was taken; 0 or
    /// less: due now). A machine that lost tries again then, not at every tick.
    pub next_in_ms: i64,
    /// What the source holds beside its turn, read by the same statement: an idle machine
    /// skips the reads and the delivery pass these say are empty.
    pub holds: Holds,
}

/// What a source holds, as a try at its turn saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromQueryResult)]
pub struct Holds {
    /// An open watched pull request: the turn's review pass has something to read.
    pub watched: bool,
    /// An undelivered outbox row: a delivery pass has something to look at (now, or when
    /// another machine's lease on it ends).
    pub backlog: bool,
}

/// The columns of [`Holds`], for source `s` (`s.id`).
fn holds(s: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM pr_watch w WHERE w.source_id = {s}.id AND w.state = 'open') AS watched,
         EXISTS (SELECT 1 FROM outbox o WHERE o.source_id = {s}.id AND o.done_at IS NULL) AS backlog"
    )
}

/// When the next turn of a source is due, as SQL over its row (`s`) before any change.
const NEXT_DUE: &str = "CASE WHEN COALESCE(s.polled_at, 0) + s.interval_ms > COALESCE(s.hold_until, 0)
                             THEN COALESCE(s.polled_at, 0) + s.interval_ms ELSE COALESCE(s.hold_until, 0) END";

/// The row a try reads: its id, turn and cursor if it took the turn, and how long until the
/// next one.
#[derive(FromQueryResult)]
struct TryRow {
    taken: Option<i64>,
    turn: Option<i64>,
    cursor: Option<String>,
    etag: Option<String>,
    interval_ms: i64,
    next_in_ms: i64,
    watched: bool,
    backlog: bool,
}

/// A source's interval, as a won turn returns it.
#[derive(FromQueryResult)]
struct Interval {
    interval_ms: i64,
}

/// How a turn ended well: the new cursor (`None` keeps it), the `ETag` of its read (`None`:
/// none to send next time), and what the tracker said of its rate limit.
#[derive(Clone, Debug, Default)]
pub struct TurnEnd {
    pub cursor: Option<String>,
    pub etag: Option<String>,
    /// No turn before this (ms): set when the tracker's budget runs low.
    pub hold_until: Option<i64>,
    pub rate_remaining: Option<i64>,
    pub rate_reset_at: Option<i64>,
}

/// A job a source added, found by its key.
#[derive(Clone, Debug, FromQueryResult)]
pub struct KeyedJob {
    pub id: i64,
    pub unique_key: String,
    pub state: JobState,
    pub claimed_at: Option<i64>,
    pub title: Option<String>,
    pub payload: serde_json::Value,
    /// Who asked for its cancel, if anyone did.
    #[sea_orm(alias = "cancel_requested_by")]
    pub cancelled_by: Option<String>,
    /// The source that added it (none: a job with the same key from elsewhere).
    pub source_id: Option<i64>,
}

impl KeyedJob {
    /// Waiting for a machine (queued, or failed and waiting to retry).
    pub fn waiting(&self) -> bool {
        JobState::CLAIMABLE.contains(&self.state) && self.claimed_at.is_none()
    }

    /// Queued, waiting or running.
    pub fn live(&self) -> bool {
        JobState::LIVE.contains(&self.state)
    }
}

/// Source NAME of orchestrator $1 (as $2), of kind $3 with filter $4 and interval $5 (ms):
/// added, or brought up to date. A changed filter resets the cursor and ends the turn under
/// way (its fenced writes then change nothing).
static REGISTER: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO sources (orchestrator_id, name, kind, filter, interval_ms, created_at)
         VALUES ($1, $2, $3, $4, $5, {now})
         ON CONFLICT (orchestrator_id, name) DO UPDATE SET
             kind = excluded.kind, interval_ms = excluded.interval_ms, filter = excluded.filter,
             cursor = CASE WHEN sources.filter = excluded.filter AND sources.kind = excluded.kind
                           THEN sources.cursor ELSE NULL END,
             etag = CASE WHEN sources.filter = excluded.filter AND sources.kind = excluded.kind
                         THEN sources.etag ELSE NULL END,
             turn = CASE WHEN sources.filter = excluded.filter AND sources.kind = excluded.kind
                         THEN sources.turn ELSE sources.turn + 1 END
         RETURNING id",
        now = d.now
    )
});

/// The intake turn of source $1 for machine $2: due once per interval, and not while a rate
/// limit holds it, unless $3 (a user's `sources poll`) forces it.
static TAKE_TURN: Sql = Sql::new(|d| {
    format!(
        "UPDATE sources SET polled_at = {now}, polled_by = $2, turn = turn + 1
          WHERE id = $1
            AND ($3 OR ((polled_at IS NULL OR polled_at <= {now} - interval_ms)
                        AND (hold_until IS NULL OR hold_until <= {now})))
         RETURNING id, turn, cursor, etag, interval_ms",
        now = d.now
    )
});

/// [`TAKE_TURN`] saying what the source holds too (SQLite's won try, one statement).
static TAKE_TURN_HOLDS: Sql = Sql::new(|d| format!("{}, {}", TAKE_TURN.of(d), holds("sources")));

/// [`TAKE_TURN`] and, in the same statement, when the next turn is due and what the source
/// holds (PostgreSQL).
static TRY_TURN: Sql = Sql::new(|d| {
    format!(
        "WITH taken AS ({take})
         SELECT t.id AS taken, t.turn, t.cursor, t.etag, s.interval_ms, {NEXT_DUE} - {now} AS next_in_ms, {holds}
           FROM sources s LEFT JOIN taken t ON t.id = s.id WHERE s.id = $1",
        holds = holds("s"),
        take = TAKE_TURN.of(d),
        now = d.now
    )
});

/// When the next turn of source $1 is due (SQLite's second half of a lost try).
static NEXT_TURN: Sql = Sql::new(|d| {
    format!(
        "SELECT NULL AS taken, NULL AS turn, NULL AS cursor, NULL AS etag, s.interval_ms, {NEXT_DUE} - {now} AS next_in_ms,
                {holds}
           FROM sources s WHERE s.id = $1",
        holds = holds("s"),
        now = d.now
    )
});

/// Turn ($1, $2) ended well: cursor $3 (NULL keeps it), hold until $4, rate left $5 until $6,
/// ETag $7.
static END_TURN: Sql = Sql::new(|d| {
    format!(
        "UPDATE sources SET cursor = COALESCE($3, cursor), etag = $7, last_ok_at = {now}, last_error = NULL,
                            hold_until = $4, rate_remaining = $5, rate_reset_at = $6
          WHERE id = $1 AND turn = $2",
        now = d.now
    )
});

/// Turn ($1, $2) failed with error $3; no turn before $4 (ms) if it is set.
static TURN_FAILED: Sql = Sql::new(|d| {
    format!(
        "UPDATE sources SET last_error = $3, last_error_at = {now}, hold_until = $4
          WHERE id = $1 AND turn = $2",
        now = d.now
    )
});

/// A problem with source $1 seen outside a turn (a delivery, a machine's own key): $2.
static SOURCE_ERROR: Sql =
    Sql::new(|d| format!("UPDATE sources SET last_error = $2, last_error_at = {now} WHERE id = $1", now = d.now));

/// The sources of orchestrator $1, with each one's outbox backlog, notice and refused rows.
static SOURCES: Sql = Sql::new(|d| {
    format!(
        "SELECT s.id, s.name, s.kind, s.filter, s.interval_ms, s.cursor, s.etag, s.turn, s.polled_at, s.polled_by,
                s.hold_until, s.last_ok_at, s.last_error, s.last_error_at, s.rate_remaining, s.rate_reset_at,
                (SELECT COUNT(*) FROM outbox o WHERE o.source_id = s.id AND o.done_at IS NULL) AS backlog,
                ({NOTICE}) AS notice,
                (SELECT COUNT(*) FROM outbox o WHERE o.source_id = s.id AND o.outcome = 'refused') AS refused,
                (SELECT o.last_error FROM outbox o WHERE o.source_id = s.id AND o.outcome = 'refused'
                  ORDER BY o.id DESC LIMIT 1) AS refusal,
                {now} AS now
           FROM sources s WHERE s.orchestrator_id = $1 ORDER BY s.name",
        now = d.now
    )
});

/// A source's notice, over its row `s`: the newest `edited_after_approval` of its jobs that
/// nothing has answered since (a new label's update, the job's end), on the newest job of its
/// key (a new label adds a new one).
const NOTICE: &str =
    "SELECT q.unique_key || ': ' || e.detail FROM job_events e JOIN dispatch_queue q ON q.id = e.job_id
     WHERE q.source_id = s.id AND e.kind = 'edited_after_approval'
       AND NOT EXISTS (SELECT 1 FROM job_events l WHERE l.job_id = e.job_id AND l.id > e.id
                          AND l.kind IN ('updated', 'completed', 'dead', 'cancelled'))
       AND NOT EXISTS (SELECT 1 FROM dispatch_queue n
                        WHERE n.orchestrator_id = q.orchestrator_id AND n.unique_key = q.unique_key AND n.id > q.id)
     ORDER BY e.id DESC LIMIT 1";

/// Live job $1's issue changed after its approval: a history row (and so one outbox row)
/// once per approval, that is unless one was written since the job last took new text.
static EDITED_LIVE: Sql = Sql::new(|_| {
    format!(
        "UPDATE dispatch_queue SET title = title
          WHERE id = $1 AND {live}
            AND NOT EXISTS (SELECT 1 FROM job_events e WHERE e.job_id = $1 AND e.kind = '{edited}'
                               AND e.id > COALESCE((SELECT MAX(u.id) FROM job_events u
                                                     WHERE u.job_id = $1 AND u.kind = '{updated}'), 0))
         RETURNING id, orchestrator_id, claim_token, claimed_by, state",
        live = crate::job::state_in(&JobState::LIVE),
        edited = crate::job::event::EDITED_AFTER_APPROVAL,
        updated = crate::job::event::UPDATED,
    )
});

/// Job $1, just added for an issue that changed after its approval, is cancelled by $2
/// before any machine could claim it (it was added to start in a year).
static REFUSE: Sql = Sql::new(|d| {
    format!(
        "UPDATE dispatch_queue SET state = 'cancelled', finished_at = {now}, cancel_requested_at = {now},
                                   cancel_requested_by = $2
          WHERE id = $1 AND claimed_at IS NULL AND {claimable}
         RETURNING id, orchestrator_id, claim_token, claimed_by, state",
        now = d.now,
        claimable = d.claimable
    )
});

/// Waiting job $1 takes payload $2, title $3, repo $4 and requires $5 (the tracker's issue
/// was edited); a claimed or finished job is left alone.
static UPDATE_WAITING: Sql = Sql::new(|d| {
    format!(
        "UPDATE dispatch_queue SET payload = $2, title = $3, repo = $4, requires = $5
          WHERE id = $1 AND claimed_at IS NULL AND {claimable}
         RETURNING id, orchestrator_id, claim_token, claimed_by, state",
        claimable = d.claimable
    )
});

impl Queue {
    /// Adds the source, or brings its kind, filter and interval up to date; its id.
    pub async fn register_source(&self, orchestrator_id: &str, spec: &SourceSpec<'_>) -> Result<i64> {
        validate_orchestrator(orchestrator_id)?;
        let values = vec![
            orchestrator_id.into(),
            spec.name.into(),
            spec.kind.into(),
            spec.filter.into(),
            millis(spec.interval).into(),
        ];
        first_i64(&self.query(self.sql(&REGISTER), values).await?, "id")
    }

    /// Takes the intake turn of `source`, if it is due (or `force`). `Ok(None)`: another
    /// machine has this interval's turn, or a rate limit holds it; not an error.
    pub async fn take_turn(&self, source: i64, machine: &str, force: bool) -> Result<Option<Turn>> {
        Ok(self.try_turn(source, machine, force).await?.turn)
    }

    /// [`Queue::take_turn`], also saying when the next turn is due, so a machine that lost
    /// does not try again before then. One statement on PostgreSQL; on SQLite a lost try
    /// reads the row after its UPDATE (a local file: no round trip to save).
    pub async fn try_turn(&self, source: i64, machine: &str, force: bool) -> Result<TurnTry> {
        let values = vec![source.into(), machine.into(), force.into()];
        let row = if self.dialect().postgres {
            decode_first::<TryRow>(&self.query(self.sql(&TRY_TURN), values).await?)?
        } else {
            let rows = self.query(self.sql(&TAKE_TURN_HOLDS), values).await?;
            match (decode_first::<Turn>(&rows)?, decode_first::<Interval>(&rows)?, decode_first::<Holds>(&rows)?) {
                (Some(t), Some(i), Some(holds)) => {
                    return Ok(TurnTry { turn: Some(t), next_in_ms: i.interval_ms, holds })
                }
                _ => decode_first::<TryRow>(&self.query(self.sql(&NEXT_TURN), vec![source.into()]).await?)?,
            }
        };
        let Some(row) = row else {
            return Err(crate::error::Error::Invalid(format!("source {source} is not registered")));
        };
        let turn = match (row.taken, row.turn) {
            (Some(source), Some(turn)) => Some(Turn { source, turn, cursor: row.cursor, etag: row.etag }),
            _ => None,
        };
        let next_in_ms = if turn.is_some() { row.interval_ms } else { row.next_in_ms };
        Ok(TurnTry { turn, next_in_ms, holds: Holds { watched: row.watched, backlog: row.backlog } })
    }

    /// Ends `turn` well. `Ok(false)`: a newer turn was taken meanwhile, and its cursor stands.
    pub async fn end_turn(&self, turn: &Turn, end: &TurnEnd) -> Result<bool> {
        let values = vec![
            turn.source.into(),
            turn.turn.into(),
            end.cursor.clone().into(),
            end.hold_until.into(),
            end.rate_remaining.into(),
            end.rate_reset_at.into(),
            end.etag.clone().into(),
        ];
        Ok(self.exec(self.sql(&END_TURN), values).await? > 0)
    }

    /// Ends `turn` with an error (kept on the row for status), and holds the source until
    /// `hold_until` (ms) when it is set.
    pub async fn turn_failed(&self, turn: &Turn, error: &str, hold_until: Option<i64>) -> Result<bool> {
        let values = vec![turn.source.into(), turn.turn.into(), truncate(error, 1000).into(), hold_until.into()];
        Ok(self.exec(self.sql(&TURN_FAILED), values).await? > 0)
    }

    /// Records a problem with `source` seen outside a turn.
    pub async fn source_error(&self, source: i64, error: &str) -> Result<()> {
        self.exec(self.sql(&SOURCE_ERROR), vec![source.into(), truncate(error, 1000).into()]).await.map(drop)
    }

    /// The sources of an orchestrator, by name, with their outbox backlogs.
    pub async fn sources(&self, orchestrator_id: &str) -> Result<Vec<SourceRow>> {
        decode(&self.query(self.sql(&SOURCES), vec![orchestrator_id.into()]).await?)
    }

    /// Every job of the orchestrator with one of `keys`, newest first.
    pub async fn jobs_by_key(&self, orchestrator_id: &str, keys: &[String]) -> Result<Vec<KeyedJob>> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let d = self.dialect();
        let mut values: Vec<Value> = vec![orchestrator_id.into()];
        let list: Vec<String> = keys
            .iter()
            .map(|k| {
                values.push(k.clone().into());
                d.p(values.len())
            })
            .collect();
        let sql = format!(
            "SELECT id, unique_key, state, claimed_at, title, payload, cancel_requested_by, source_id FROM dispatch_queue
              WHERE orchestrator_id = {o} AND unique_key IN ({list}) ORDER BY id DESC",
            o = d.p(1),
            list = list.join(", ")
        );
        decode(&self.query(&sql, values).await?)
    }

    /// Live job `id`'s issue changed after its label approved it: it keeps its text, and its
    /// history (and so the issue, through the outbox) says so once per approval. `Ok(false)`:
    /// said already, or the job is no longer live.
    pub async fn edited_after_approval(&self, id: i64, by: &str, detail: &str) -> Result<bool> {
        let history = edited_history(by, detail);
        Ok(!self.change(self.sql(&EDITED_LIVE), vec![id.into()], &history).await?.is_empty())
    }

    /// Job `id`, added to start far ahead for an issue that changed after its approval, is
    /// cancelled by `by` with the reason in its history (and on the issue, once).
    pub async fn refuse_edited(&self, id: i64, by: &str, detail: &str) -> Result<bool> {
        let history = edited_history(by, detail);
        Ok(!self.change(self.sql(&REFUSE), vec![id.into(), by.into()], &history).await?.is_empty())
    }

    /// A waiting job takes its tracker issue's new text (checked as an enqueue checks it).
    /// `Ok(false)`: it was claimed or finished meanwhile, and keeps what it had.
    pub async fn update_waiting(&self, id: i64, payload: &serde_json::Value, by: &str) -> Result<bool> {
        let spec = crate::spec::check_payload(payload)?;
        let (repo, requires) = spec.route_columns();
        let values = vec![
            id.into(),
            Value::from(payload.clone()),
            super::options::title_of(payload).into(),
            repo.into(),
            requires.into(),
        ];
        let history = History {
            kind: &format!("'{}'", crate::job::event::UPDATED),
            machine: Some(by),
            detail: Detail::Text("the tracker's issue changed: the waiting job took its new text".into()),
        };
        Ok(!self.change(self.sql(&UPDATE_WAITING), values, &history).await?.is_empty())
    }
}

/// The history of an edit after approval.
fn edited_history<'a>(by: &'a str, detail: &str) -> History<'a> {
    History { kind: "'edited_after_approval'", machine: Some(by), detail: Detail::Text(detail.to_string()) }
}
