//! (f) pickup latency: enqueue to the agent's start on an idle machine, with NOTIFY or by
//! polling alone.

use std::time::{Duration, Instant};

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::orchestrator::{self, Event, RunConfig, StopMode};
use devpilot_store::db::DbUrl;
use devpilot_store::Queue;
use rand::Rng;
use serde_json::{json, Value};

use crate::common::{connect, log, pct, Backend, Env, ORCH};

/// Enqueue one job at a time into an idle machine; time enqueue -> the loop starting its agent
/// (the `Claimed` event, emitted right before the agent starts).
pub async fn latency(env: &Env, backend: Backend, notify: bool, samples: usize) -> Value {
    let url = env.fresh(backend).await;
    let producer = Queue::new(connect(&url, 1).await);
    let machine_q = Queue::new(connect(&url, 1).await);
    let dir = env.tmp.join(format!("lat{}", env.next()));
    let mut cfg = RunConfig::new(ORCH, "lat", AgentSpec::NoOp, dir.clone());
    let hints = if notify {
        // The CLI defaults: poll every 2 s, idle backoff up to 5 min. NOTIFY does the work.
        devpilot_store::listen::spawn(&DbUrl::parse(&url).unwrap(), ORCH, &machine_q)
    } else {
        cfg.poll_interval = Duration::from_millis(200);
        cfg.max_poll_interval = Duration::from_millis(200);
        None
    };
    let (cfg_poll, cfg_max) = (cfg.poll_interval, cfg.max_poll_interval);
    let (h, _j) = orchestrator::spawn(machine_q.clone(), cfg, hints);
    let mut events = h.subscribe();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut lat = vec![];
    for i in 0..samples {
        let gap = rand::rng().random_range(5..if notify { 30 } else { 200 });
        tokio::time::sleep(Duration::from_millis(gap)).await;
        let t0 = Instant::now();
        let id = producer.enqueue(ORCH, &json!({ "title": format!("lat {i}") })).await.unwrap();
        let mut claimed = None;
        let mut completed = false;
        let wait_until = Instant::now() + Duration::from_secs(10);
        while !(claimed.is_some() && completed) {
            let Ok(ev) = tokio::time::timeout_at(wait_until.into(), events.recv()).await else { break };
            match ev {
                Ok(Event::Claimed { job }) if job.id == id => claimed = Some(t0.elapsed()),
                Ok(Event::Completed { job, .. }) if job.id == id => completed = true,
                _ => {}
            }
        }
        if let Some(d) = claimed {
            lat.push(d.as_secs_f64() * 1000.0);
        }
    }
    h.stop(StopMode::HandOff).await;
    producer.connection().clone().close().await.ok();
    machine_q.connection().clone().close().await.ok();
    let _ = std::fs::remove_dir_all(dir);
    let mut sorted = lat.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let v = json!({
        "samples": sorted.len(), "asked": samples,
        "p50_ms": pct(&sorted, 50.0), "p95_ms": pct(&sorted, 95.0), "p99_ms": pct(&sorted, 99.0),
        "max_ms": sorted.last().copied().unwrap_or(f64::NAN),
        "poll_interval_ms": cfg_poll.as_millis() as u64, "max_poll_interval_ms": cfg_max.as_millis() as u64,
    });
    log(format!("  {} {}: {v}", backend.name(), if notify { "notify" } else { "poll-only" }));
    v
}
