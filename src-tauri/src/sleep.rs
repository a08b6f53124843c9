//! Lid and sleep on Linux: logind's `PrepareForSleep` on the system bus. We hold a "delay"
//! inhibitor while awake; when sleep is announced we hand off (or pause) and then release
//! it, so the machine sleeps only after the claims are released (logind waits at most
//! InhibitDelayMaxSec). After the wake we re-check every lease before anything else.
//!
//! No system bus, no logind, or a refused inhibitor: logged, and the app runs without it.
//!
//! Keep-awake ([`crate::awake`]) may hold an idle-sleep *block* inhibitor at the same time;
//! it never blocks the lid switch, so closing the lid still arrives here as PrepareForSleep.

use std::sync::Arc;
use std::time::Duration;

use devpilot_app::Engine;

use crate::logind::Login1ManagerProxy;

/// Starts the sleep hook in the background. Never fails.
pub fn spawn(engine: Arc<Engine>) {
    if std::env::var_os("DEVPILOT_NO_SLEEP_HOOK").is_some() {
        return;
    }
    tauri::async_runtime::spawn(async move {
        if let Err(e) = watch(engine).await {
            tracing::warn!(error = %e, "no sleep hook (cannot reach logind on the system bus); hand off manually before closing the lid");
        }
    });
}

async fn take_inhibitor(m: &Login1ManagerProxy<'_>) -> Option<zbus::zvariant::OwnedFd> {
    match m.inhibit("sleep", "DevPilot", "Handing off running jobs before sleep", "delay").await {
        Ok(fd) => Some(fd),
        Err(e) => {
            tracing::warn!(error = %e, "logind refused a sleep delay inhibitor; hand-off before sleep is best effort");
            None
        }
    }
}

async fn watch(engine: Arc<Engine>) -> zbus::Result<()> {
    use futures_util::StreamExt;
    let conn = zbus::Connection::system().await?;
    let m = Login1ManagerProxy::new(&conn).await?;
    let mut signals = m.receive_prepare_for_sleep().await?;
    let mut inhibitor = take_inhibitor(&m).await;
    tracing::info!("sleep hook ready (logind PrepareForSleep)");
    while let Some(sig) = signals.next().await {
        let Ok(args) = sig.args() else { continue };
        if args.start {
            tracing::info!("going to sleep: handing off");
            // Within logind's default 5 s delay; past it, a red verdict says what stayed.
            match engine.prepare_for_sleep_within(Duration::from_secs(4)).await {
                Some(ids) => tracing::info!(count = ids.len(), handed_off = ?ids, "ready for sleep"),
                None => tracing::warn!("hand-off before sleep took too long; sleeping anyway (it finishes at wake)"),
            }
            // Let the machine sleep.
            drop(inhibitor.take());
        } else {
            tracing::info!("woke up: re-checking leases");
            inhibitor = take_inhibitor(&m).await;
            let lost = engine.woke().await;
            if !lost.is_empty() {
                tracing::warn!(?lost, "leases lost while asleep");
            }
        }
    }
    Ok(())
}
