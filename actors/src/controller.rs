//! Controller epochs: `<cluster>/controller/epoch-<n>.json`, each created
//! with O_CREAT|O_EXCL so exactly one broker wins each epoch.
//!
//! A standalone broker claims the next epoch at every start and leads every
//! partition under it, so a restart always writes into new, higher-epoch
//! segment files and never appends to a file a previous incarnation (or a
//! zombie of it) may still hold. The multi-broker election, leases and the
//! assignment file build on the same primitive.

use crate::fs::SharedFs;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::Path;

/// Contents of an epoch file: the creator's identity, so that an EEXIST
/// caused by a lost reply to our own create can be recognised as ours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochClaim {
    /// The epoch.
    pub epoch: i32,
    /// Broker that created it.
    pub broker_id: i32,
    /// Random nonce of this claim attempt.
    pub nonce: u64,
}

fn epoch_name(e: i32) -> String {
    format!("epoch-{e:010}.json")
}

fn parse_epoch(name: &str) -> Option<i32> {
    name.strip_prefix("epoch-")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// Claim the next controller epoch for `broker_id`. The listing only
/// suggests where to start; exclusivity comes from O_EXCL, so a stale
/// listing costs a retry, never a duplicate epoch.
pub fn claim_epoch(fs: &SharedFs, cluster_dir: &Path, broker_id: i32) -> io::Result<i32> {
    let dir = cluster_dir.join("controller");
    fs.create_dir_all(&dir)?;
    let mut next = fs
        .list(&dir)?
        .iter()
        .filter_map(|n| parse_epoch(n))
        .max()
        .unwrap_or(0)
        + 1;
    for _ in 0..1000 {
        let claim = EpochClaim {
            epoch: next,
            broker_id,
            nonce: rand::random(),
        };
        let path = dir.join(epoch_name(next));
        let body = serde_json::to_vec(&claim).expect("claim serializes");
        match fs.create_exclusive(&path) {
            Ok(f) => {
                f.write_all_at(&body, 0)?;
                f.sync_data()?;
                fs.sync_dir(&dir)?;
                // Epoch files are never deleted: a deleted one could be
                // claimed again through a stale listing, reissuing an epoch.
                return Ok(next);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Ours if a retried create already succeeded (lost reply).
                if let Ok(b) = fs.read(&path) {
                    if serde_json::from_slice::<EpochClaim>(&b).ok().as_ref() == Some(&claim) {
                        return Ok(next);
                    }
                }
                next += 1;
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("could not claim a controller epoch"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::RealFs;
    use std::sync::Arc;

    #[test]
    fn epochs_rise_and_racers_never_share_one() {
        let d = tempfile::tempdir().unwrap();
        let fs: SharedFs = Arc::new(RealFs);
        assert_eq!(claim_epoch(&fs, d.path(), 0).unwrap(), 1);
        assert_eq!(claim_epoch(&fs, d.path(), 0).unwrap(), 2);
        let handles: Vec<_> = (0..8)
            .map(|b| {
                let fs = fs.clone();
                let p = d.path().to_path_buf();
                std::thread::spawn(move || claim_epoch(&fs, &p, b).unwrap())
            })
            .collect();
        let mut got: Vec<i32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 8, "every racer got a distinct epoch: {got:?}");
    }
}
