//! The [`Machine`]'s presence: when it is due, what the row says ([`PresenceFields`]) and
//! its writes.

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::machine::{unix_ms, Machine, Paused};
use super::status::{MachineState, PresenceFields};
use devpilot_store::queue::MachineStatus;

impl Machine {
    pub(super) fn presence_due(&self) -> bool {
        self.last_presence.is_none_or(|t| t.elapsed() >= self.cfg.presence_every)
    }

    pub(super) fn maybe_presence(&mut self) {
        if self.presence_due() {
            self.write_presence();
        }
    }

    /// What this machine reports about itself now; also marks presence as written.
    pub(super) fn presence_fields(&mut self) -> PresenceFields {
        self.last_presence = Some(Instant::now());
        self.presence_order.seq += 1;
        self.stats.presence_writes.fetch_add(1, Ordering::Relaxed);
        let status = match self.state() {
            _ if self.stop.is_some() => MachineStatus::HandingOff,
            MachineState::Paused => MachineStatus::Paused,
            MachineState::Off => MachineStatus::Off,
            MachineState::Error => MachineStatus::Blocked,
            MachineState::Stopped => MachineStatus::Stopped,
            _ => MachineStatus::Online,
        };
        let paused_until = match self.wishes.paused {
            Some(Paused::Until(t)) => {
                Some(unix_ms() as i64 + t.saturating_duration_since(Instant::now()).as_millis() as i64)
            }
            _ => None,
        };
        PresenceFields {
            status,
            dispatch_enabled: self.wishes.enabled,
            paused_until,
            running: self.slots.len() as i32,
            concurrency: self.cfg.concurrency as i32,
            order: self.presence_order,
        }
    }

    pub(super) fn write_presence(&mut self) {
        let f = self.presence_fields();
        let problem = self.problem.as_ref().map(|p| p.message.clone());
        let store = self.store.clone();
        let route = self.cfg.route();
        // A task of the current epoch: the final 'stopped' write goes after it.
        self.work.spawn(async move {
            let mut p = f.presence(store.orchestrator_id(), store.machine(), &route);
            p.problem = problem.as_deref();
            if let Err(e) = store.queue().heartbeat_machine(&p).await {
                tracing::debug!(error = %e, "presence update failed");
            }
        });
    }
}
