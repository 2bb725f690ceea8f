//! Controller epochs: `<cluster>/controller/epoch-<n>.json`, each created
//! with O_CREAT|O_EXCL so exactly one broker wins each epoch.
//!
//! The election ([`crate::cluster::controller`]) claims exactly the epoch
//! after the highest one it can see, and only once that epoch's holder is
//! provably fenced; losing the race is an EEXIST and a re-read.
//!
//! Winning an epoch is the only way to a [`ControllerTerm`], the capability
//! the controller writes `assignment.json` through: not `Clone`, minted only
//! here ([`win_controller_term`]), its seam guarded by the broker lease of
//! the incarnation that won.

use super::lease::LeaseGuard;
use kaas_volume::fs::{Fs, SharedFs};
use kaas_volume::identity::{create_with_identity, Claimed, CreateError, JsonIdentity, Policy};
use kaas_volume::layout;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::Path;

/// Contents of an epoch file: the creator's identity, so that an EEXIST
/// caused by a lost reply to our own create can be recognised as ours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerEpoch {
    /// The epoch.
    pub epoch: i32,
    /// Broker that created it.
    pub broker_id: i32,
    /// Random nonce of this claim attempt.
    pub nonce: u64,
    /// The claimant's incarnation (0 in files from before leases).
    #[serde(default)]
    pub incarnation: u64,
}

impl JsonIdentity for ControllerEpoch {}

use layout::{controller_epoch as epoch_name, parse_controller_epoch as parse_epoch};

/// The highest controller epoch claim. The listing suggests a start; exact
/// opens of the following epochs (close-to-open) find claims a stale
/// listing misses.
pub fn highest_controller_epoch(
    fs: &SharedFs,
    cluster_dir: &Path,
) -> io::Result<Option<ControllerEpoch>> {
    let dir = cluster_dir.join(layout::CONTROLLER_DIR);
    fs.create_dir_all(&dir)?;
    let mut best = fs
        .list(&dir)?
        .iter()
        .filter_map(|n| parse_epoch(n))
        .max()
        .unwrap_or(0);
    for _ in 0..1000 {
        if !kaas_volume::fs::exists(fs.as_ref(), &dir.join(epoch_name(best + 1)))? {
            break;
        }
        best += 1;
    }
    if best == 0 {
        return Ok(None);
    }
    let b = fs.read(&dir.join(epoch_name(best)))?;
    // A claim created but not yet written (or its writer crashed between
    // create and write) has no owner: report broker -1, which candidates
    // treat as gone only after lease + grace of observing it.
    Ok(Some(serde_json::from_slice(&b).unwrap_or(
        ControllerEpoch {
            epoch: best,
            broker_id: -1,
            nonce: 0,
            incarnation: 0,
        },
    )))
}

/// Whether a claim file for `epoch` exists (exact open).
pub fn controller_epoch_exists(fs: &SharedFs, cluster_dir: &Path, epoch: i32) -> bool {
    fs.open_read(
        &cluster_dir
            .join(layout::CONTROLLER_DIR)
            .join(epoch_name(epoch)),
    )
    .is_ok()
}

/// Try to claim exactly `epoch` (O_CREAT|O_EXCL). `Ok(false)` if another
/// broker holds it; an EEXIST for a claim that is ours (a lost reply to our
/// own create) counts as won. A claim that stays empty (a crashed creator,
/// or a lost reply to our own create: indistinguishable) is not won: it is
/// waited out like a dead holder (one lease + grace without a controller,
/// never two winners). A failure to read the claim after EEXIST is not a win
/// either.
pub fn try_win_controller_epoch(
    fs: &SharedFs,
    cluster_dir: &Path,
    epoch: i32,
    broker_id: i32,
    incarnation: u64,
) -> io::Result<bool> {
    let dir = cluster_dir.join(layout::CONTROLLER_DIR);
    fs.create_dir_all(&dir)?;
    let claim = ControllerEpoch {
        epoch,
        broker_id,
        nonce: rand::random(),
        incarnation,
    };
    let path = dir.join(epoch_name(epoch));
    match create_with_identity(fs.as_ref(), &path, &claim, Policy::DURABLE) {
        Ok(Claimed::Won | Claimed::Ours) => Ok(true),
        Ok(Claimed::Taken(_) | Claimed::Indeterminate(_)) => Ok(false),
        Err(CreateError::Read { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The right to write as controller of one epoch (see module docs).
pub struct ControllerTerm {
    fs: SharedFs,
    epoch: i32,
    incarnation: u64,
}

impl ControllerTerm {
    /// The guarded seam the controller writes through: every write is
    /// refused once the lease of [`Self::incarnation`] lapsed.
    pub(crate) fn fs(&self) -> &dyn Fs {
        self.fs.as_ref()
    }
    /// The controller epoch won.
    pub fn epoch(&self) -> i32 {
        self.epoch
    }
    /// The incarnation that won it.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }
}

impl std::fmt::Debug for ControllerTerm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ControllerTerm(e{}, inc {})",
            self.epoch, self.incarnation
        )
    }
}

/// Claim exactly `epoch` ([`try_win_controller_epoch`]) through the seam
/// guarded by `guard` (so a lapsed lease claims nothing), and on a win hand
/// out the term. `claimed` is a claim already read back as ours (a lost
/// reply to our own create): no create, just the term.
pub(crate) fn win_controller_term(
    fs: &SharedFs,
    guard: LeaseGuard,
    cluster_dir: &Path,
    epoch: i32,
    broker_id: i32,
    claimed: Option<&ControllerEpoch>,
) -> io::Result<Option<ControllerTerm>> {
    let incarnation = guard.incarnation();
    let fs = guard.guard(fs);
    let won = match claimed {
        Some(c) => c.epoch == epoch && c.broker_id == broker_id && c.incarnation == incarnation,
        None => try_win_controller_epoch(&fs, cluster_dir, epoch, broker_id, incarnation)?,
    };
    Ok(won.then_some(ControllerTerm {
        fs,
        epoch,
        incarnation,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_volume::fs::RealFs;
    use std::sync::Arc;

    #[test]
    fn racers_for_one_epoch_have_exactly_one_winner() {
        let d = tempfile::tempdir().unwrap();
        let fs: SharedFs = Arc::new(RealFs);
        for epoch in 1..=3 {
            let handles: Vec<_> = (0..8)
                .map(|b| {
                    let fs = fs.clone();
                    let p = d.path().to_path_buf();
                    std::thread::spawn(move || {
                        try_win_controller_epoch(&fs, &p, epoch, b, 100 + b as u64).unwrap()
                    })
                })
                .collect();
            let winners: Vec<usize> = handles
                .into_iter()
                .enumerate()
                .filter_map(|(i, h)| h.join().unwrap().then_some(i))
                .collect();
            assert_eq!(winners.len(), 1, "epoch {epoch}: winners {winners:?}");
            let h = highest_controller_epoch(&fs, d.path()).unwrap().unwrap();
            assert_eq!((h.epoch, h.broker_id), (epoch, winners[0] as i32));
        }
    }

    /// The term's seam refuses every write once the lease lapsed, even on
    /// a path that forgot to check it: nothing reaches the volume.
    #[test]
    fn a_controller_term_writes_nothing_after_the_lease_lapsed() {
        use crate::clock::{Clock, FakeClock};
        use crate::cluster::lease::Lease;
        use kaas_volume::fs::{fault::FaultFs, is_fenced, write_atomic};
        let d = tempfile::tempdir().unwrap();
        let clock = FakeClock::new();
        let lease = Arc::new(Lease::with_clock(
            std::time::Duration::from_secs(3),
            7,
            clock.clone(),
        ));
        assert!(lease.renewed(7, clock.now(), clock.now()));
        let ffs = FaultFs::new();
        let fs: SharedFs = Arc::new(ffs.clone());
        let guard = LeaseGuard::new(lease.clone(), 7);
        let term = win_controller_term(&fs, guard, d.path(), 1, 0, None)
            .unwrap()
            .expect("won epoch 1");
        let target = d.path().join("assignment.json");
        write_atomic(term.fs(), &target, b"v1").unwrap();
        clock.advance(std::time::Duration::from_secs(3));
        let ops = ffs.ops();
        let e = write_atomic(term.fs(), &target, b"v2").unwrap_err();
        assert!(is_fenced(&e), "{e}");
        assert_eq!(ffs.ops(), ops, "{:?}", &ffs.log()[ops as usize..]);
        assert_eq!(std::fs::read(&target).unwrap(), b"v1");
        // Nor can a lapsed lease win the next epoch.
        let guard = LeaseGuard::new(lease, 7);
        let r = win_controller_term(&fs, guard, d.path(), 2, 0, None);
        assert!(r.is_err_and(|e| is_fenced(&e)));
        assert_eq!(ffs.ops(), ops);
    }
}
