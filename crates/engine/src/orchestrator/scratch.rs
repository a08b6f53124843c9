//! The scratch directory of a job with no repo.

use devpilot_store::error::Result;
use devpilot_store::queue::Claim;

/// The scratch directory of a job with no repo: `<scratch root>/<id>-<token>` ([`super::scratch_root`]),
/// private, made new for each attempt and removed (without following links) when dropped.
pub(super) struct Scratch(pub(super) std::path::PathBuf);

impl Scratch {
    pub(super) fn new(root: &std::path::Path, claim: &Claim) -> Result<Self> {
        crate::safe_fs::private_dir(root)?;
        let dir = root.join(format!("{}-{}", claim.fence.job, claim.fence.token));
        if std::fs::symlink_metadata(&dir).is_ok() {
            let _ = std::fs::remove_dir_all(&dir);
            let _ = std::fs::remove_file(&dir);
        }
        crate::safe_fs::private_dir(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // remove_dir_all does not follow symlinks out of the directory.
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::debug!(dir = %self.0.display(), error = %e, "could not remove a job's scratch dir");
        }
    }
}
