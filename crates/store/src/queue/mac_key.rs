//! Each orchestrator's MAC key (`orchestrator_keys`): 32 random bytes, made by the first
//! machine that needs one and shared through the database, where the machines already keep
//! what they share. It signs what machines leave on a tracker (a GitHub comment's marker, a
//! Linear comment's id), so that someone on the tracker, who cannot read the database,
//! cannot forge them. Anyone who can read the database can already add jobs.

use std::sync::Arc;

use sea_orm::FromQueryResult;

use super::dialect::Sql;
use super::pool::Queue;
use super::rows::decode_first;
use crate::error::{Error, Result};

use super::mac_key_type::MacKey;

/// Orchestrator $1's key is $2, unless it has one already.
static MAKE_KEY: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO orchestrator_keys (orchestrator_id, mac_key, created_at) VALUES ($1, $2, {now})
         ON CONFLICT (orchestrator_id) DO NOTHING",
        now = d.now
    )
});

/// Orchestrator $1's key.
static READ_KEY: Sql = Sql::new(|_| "SELECT mac_key FROM orchestrator_keys WHERE orchestrator_id = $1".to_string());

#[derive(FromQueryResult)]
struct KeyRow {
    mac_key: String,
}

impl Queue {
    /// Orchestrator `orchestrator_id`'s MAC key: read once per queue (and so per database),
    /// then kept in memory with it.
    pub async fn mac_key(&self, orchestrator_id: &str) -> Result<Arc<MacKey>> {
        let known = self.mac_keys.lock().ok().and_then(|k| k.get(orchestrator_id).cloned());
        if let Some(k) = known {
            return Ok(k);
        }
        let key = Arc::new(self.make_mac_key(orchestrator_id).await?);
        if let Ok(mut keys) = self.mac_keys.lock() {
            keys.insert(orchestrator_id.to_string(), key.clone());
        }
        Ok(key)
    }

    /// The key in the database, else a new random one put there first (two machines at once:
    /// the first insert wins, both read it).
    async fn make_mac_key(&self, orchestrator_id: &str) -> Result<MacKey> {
        if let Some(k) = self.read_mac_key(orchestrator_id).await? {
            return Ok(k);
        }
        let mut fresh = [0u8; 32];
        rand::Rng::fill(&mut rand::rng(), &mut fresh);
        let made = MacKey::from_bytes(fresh);
        self.exec(self.sql(&MAKE_KEY), vec![orchestrator_id.into(), made.hex().into()]).await?;
        self.read_mac_key(orchestrator_id)
            .await?
            .ok_or_else(|| Error::Invalid(format!("orchestrator '{orchestrator_id}' has no MAC key after making one")))
    }

    async fn read_mac_key(&self, orchestrator_id: &str) -> Result<Option<MacKey>> {
        let row: Option<KeyRow> = decode_first(&self.query(self.sql(&READ_KEY), vec![orchestrator_id.into()]).await?)?;
        match row {
            None => Ok(None),
            Some(r) => MacKey::from_hex(&r.mac_key).map(Some).ok_or_else(|| {
                Error::Invalid(format!(
                    "orchestrator '{orchestrator_id}''s MAC key in the database is not 32 bytes of hex"
                ))
            }),
        }
    }
}
