//! The values shell completions offer beyond the flags: job ids of the queue, source and repo
//! names of the config, preset names. The completion scripts ([`crate::docs`]) call the
//! hidden `devpilot __complete WHAT`, which prints one value per line, prints nothing on any
//! error, never creates a database and gives up after two seconds.

use std::time::Duration;

use devpilot_engine::config::Paths;
use devpilot_engine::preset::Preset;
use devpilot_store::db::{self, PoolSettings};
use devpilot_store::queue::Queue;

/// What to complete.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum What {
    Jobs,
    Sources,
    Repos,
    Presets,
}

/// Prints the values, one per line; nothing when they cannot be read.
pub async fn print(what: What, flag: Option<&str>) {
    let values = match what {
        What::Presets => Preset::ALL.iter().map(|p| p.name().to_string()).collect(),
        What::Sources => config_names(|s| s.sources.keys().cloned().collect()),
        What::Repos => config_names(|s| s.repos.keys().cloned().collect()),
        What::Jobs => {
            tokio::time::timeout(Duration::from_secs(2), job_ids(flag)).await.ok().flatten().unwrap_or_default()
        }
    };
    for v in values {
        println!("{v}");
    }
}

fn config_names(of: impl Fn(&devpilot_engine::settings::Settings) -> Vec<String>) -> Vec<String> {
    Paths::for_app("devpilot").and_then(|p| p.load()).map(|s| of(&s)).unwrap_or_default()
}

/// The ids of the queue's newest jobs, live ones first.
async fn job_ids(flag: Option<&str>) -> Option<Vec<String>> {
    let paths = Paths::for_app("devpilot").ok()?;
    let settings = paths.load().ok()?;
    let queue_name = flag.map(str::to_string).unwrap_or(settings.orchestrator_id);
    let url = crate::open::database_url(None, false).await.ok()?;
    // A file that is not there yet stays not there: connecting would create it.
    if url.sqlite_path().is_some_and(|p| !p.exists()) {
        return Some(vec![]);
    }
    let conn = db::connect(&url, &PoolSettings::default()).await.ok()?;
    let queue = Queue::new(conn).pooled(true);
    let mut rows = queue.jobs(&queue_name, None, 200).await.ok()?;
    rows.sort_by_key(|j| (j.state.is_finished(), -j.id));
    Some(rows.iter().map(|j| j.id.to_string()).collect())
}
