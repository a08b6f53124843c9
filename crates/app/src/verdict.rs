//! What became of an edit of the settings file ([`ConfigNote`]), and a hand-off's verdict
//! (built in the engine, [`devpilot_engine::orchestrator::verdict`], so that the control
//! socket answers `devpilot handoff` with the same words the tray shows).

use serde::Serialize;

pub use devpilot_engine::orchestrator::verdict::{HandOffVerdict, HandedOff};

/// What became of the last edit of the settings file.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ConfigNote {
    /// Applied; else the settings before it stay in force.
    pub ok: bool,
    pub text: String,
}
