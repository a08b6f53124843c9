//! The MAC key's type, apart from the statements that read and make it (`mac_key.rs`), so
//! that the queue can keep the keys it has read without depending on those statements.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A MAC key. Never printed: not by `Debug`, not in an error.
#[derive(Clone, PartialEq, Eq)]
pub struct MacKey([u8; 32]);

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MacKey(redacted)")
    }
}

impl MacKey {
    /// A key from its bytes (tests; the machine reads its own with [`Queue::mac_key`](super::Queue::mac_key)).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The key itself, for the MAC and nothing else.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub(super) fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub(super) fn from_hex(hex: &str) -> Option<Self> {
        let hex = hex.trim();
        if hex.len() != 64 || !hex.is_ascii() {
            return None;
        }
        let mut key = [0u8; 32];
        for (i, b) in key.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(key))
    }
}

/// The keys a queue has read, by orchestrator: a key never changes once made.
pub(super) type Keys = Arc<Mutex<HashMap<String, Arc<MacKey>>>>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A key survives its hex form; anything that is not 64 hex digits is refused.
    #[test]
    fn hex_round_trip() {
        let k = MacKey([0xab; 32]);
        assert_eq!(MacKey::from_hex(&k.hex()), Some(k.clone()));
        assert_eq!(MacKey::from_hex("abcd"), None);
        assert_eq!(MacKey::from_hex(&"zz".repeat(32)), None);
        assert_eq!(format!("{k:?}"), "MacKey(redacted)");
    }
}
