//! What a machine leaves on a tracker is signed with its orchestrator's key (kept in the
//! shared database, see the store's `MacKey`): the hidden marker at the end of a GitHub
//! comment, and the id of a Linear comment. A retry trusts a marker only with a valid MAC,
//! so a stranger on the tracker, who cannot read the database, cannot write one that stops a
//! real comment, and cannot take a Linear comment's id first. Anyone who can read the
//! database can already add jobs. The key is read once per connection to the database
//! (`Queue::mac_key`) and kept in memory with it; it is never printed.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use devpilot_store::queue::{Delivery, MacKey};

/// HMAC-SHA256 (RFC 2104) of `msg` under `key`.
#[allow(clippy::expect_used, reason = "HMAC takes a key of any length: new_from_slice cannot fail")]
fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(msg);
    mac.finalize().into_bytes().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What one outbox row's marker and comment id are bound to: the orchestrator, the issue,
/// the job, the event, the claim and the row.
fn fields(orchestrator_id: &str, issue: &str, d: &Delivery) -> String {
    let token = d.claim_token.unwrap_or(0);
    format!("{orchestrator_id}|{issue}|{}|{}|{token}|{}", d.job_id, d.event, d.id)
}

/// Row `d`'s hidden markers on one GitHub issue. A marker also names, in its MAC, the user
/// whose comment carries it: a machine signs for its own token's user, and a retry counts a
/// comment only if its marker is the one signed for the comment's author. So machines whose
/// tokens belong to different users find each other's comments, and a copy posted under
/// another name (a stranger's) is no marker at all.
pub struct CommentMarker<'a> {
    key: &'a MacKey,
    fields: String,
    d: &'a Delivery,
}

impl<'a> CommentMarker<'a> {
    /// The markers of row `d` on `repo#number` under the orchestrator's key.
    pub fn new(key: &'a MacKey, orchestrator_id: &str, repo: &str, number: u64, d: &'a Delivery) -> Self {
        Self { key, fields: fields(orchestrator_id, &format!("{repo}#{number}"), d), d }
    }

    /// The marker a comment by `author` ends with: `<!-- devpilot:job/N/EVENT/T/MAC -->`, the
    /// MAC (HMAC-SHA256, its first 128 bits) over the orchestrator, the issue, the job, the
    /// event, the claim token, the outbox row and the author's login (GitHub's logins are
    /// case-insensitive, so it is lowercased).
    pub fn by(&self, author: &str) -> String {
        let msg = format!("{}|by:{}", self.fields, author.to_lowercase());
        let mac = hmac_sha256(self.key.bytes(), msg.as_bytes());
        let d = self.d;
        format!("<!-- devpilot:job/{}/{}/{}/{} -->", d.job_id, d.event, d.claim_token.unwrap_or(0), hex(&mac[..16]))
    }
}

/// The id of row `d`'s Linear comment on issue `issue`: a UUID in version-4 form (as
/// `CommentCreateInput.id` asks), keyed, so every delivery of one row names the same comment,
/// no two rows share one, and nobody without the key can take it first.
pub fn comment_id(key: &MacKey, orchestrator_id: &str, issue: &str, d: &Delivery) -> String {
    let mac = hmac_sha256(key.bytes(), fields(orchestrator_id, issue, d).as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&mac[..16]);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex(&b);
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, event: &str, token: i64) -> Delivery {
        Delivery {
            id,
            token: 1,
            job_id: 7,
            source_id: 1,
            event: event.into(),
            machine: None,
            claim_token: Some(token),
            detail: None,
            tries: 1,
            created_at: 0,
        }
    }

    /// RFC 4231's test cases 1 and 6 (a key longer than a block).
    #[test]
    fn hmac_matches_rfc_4231() {
        let one = hmac_sha256(&[0x0b; 20], b"Hi There");
        assert_eq!(hex(&one), "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
        let six = hmac_sha256(&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First");
        assert_eq!(hex(&six), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    }

    /// The marker keeps the readable part and adds a 128-bit MAC that changes with the key,
    /// the issue, the claim, the row and the author: a copy from another job, issue or row,
    /// or under another user's name, is not it.
    #[test]
    fn markers_are_keyed_and_bound_to_the_row_and_author() {
        let key = MacKey::from_bytes([1; 32]);
        let at = |key: &MacKey, orch: &str, number: u64, d: &Delivery, who: &str| {
            CommentMarker::new(key, orch, "acme/webapp", number, d).by(who)
        };
        let (r40, r41) = (row(40, "completed", 2), row(41, "completed", 2));
        let m = at(&key, "o", 1, &r40, "ada");
        assert!(m.starts_with("<!-- devpilot:job/7/completed/2/") && m.ends_with(" -->"), "{m}");
        assert_eq!(m.len(), "<!-- devpilot:job/7/completed/2/ -->".len() + 32, "{m}");
        assert_eq!(m, at(&key, "o", 1, &r40, "ada"));
        assert_eq!(m, at(&key, "o", 1, &r40, "Ada"), "logins are case-insensitive");
        assert_ne!(m, at(&MacKey::from_bytes([2; 32]), "o", 1, &r40, "ada"));
        assert_ne!(m, at(&key, "o", 2, &r40, "ada"));
        assert_ne!(m, at(&key, "o", 1, &r41, "ada"));
        assert_ne!(m, at(&key, "p", 1, &r40, "ada"));
        assert_ne!(m, at(&key, "o", 1, &r40, "mallory"));
    }

    /// A Linear comment id is a stable, keyed UUID v4 per row.
    #[test]
    fn comment_ids_are_keyed_uuid_v4() {
        let key = MacKey::from_bytes([1; 32]);
        let a = comment_id(&key, "o", "issue-1", &row(40, "completed", 2));
        assert_eq!(a, comment_id(&key, "o", "issue-1", &row(40, "completed", 2)));
        assert_ne!(a, comment_id(&MacKey::from_bytes([2; 32]), "o", "issue-1", &row(40, "completed", 2)));
        assert_ne!(a, comment_id(&key, "o", "issue-1", &row(40, "completed", 3)));
        assert_ne!(a, comment_id(&key, "o", "issue-1", &row(41, "completed", 2)));
        assert_eq!((a.len(), &a[14..15]), (36, "4"));
        assert!("89ab".contains(&a[19..20]), "{a}");
    }
}
