//! Leader-epoch claims: `leader-e<E>.claim` in a partition directory,
//! created with O_CREAT|O_EXCL by the one leader that may write epoch `E`.
//!
//! The epoch in a segment's name is the fencing token of the whole log
//! (substrate contract, rule 3) — but only if no two leaders ever write
//! under the same epoch. The controller's assignment is what hands epochs
//! out, and a deposed controller's late write of it cannot be prevented
//! (the substrate has no compare-and-swap). So the storage enforces it too:
//! before a leader writes anything of epoch `E` it wins the exclusive create
//! of `leader-e<E>.claim` (guarantee 2), with its broker id and incarnation
//! inside. A second leader granted the same epoch finds the claim, is fenced,
//! and reports the owner, so the controller can release that owner first
//! and grant a higher epoch.
//!
//! Lost replies (DESIGN §11): an EEXIST for a create that in fact succeeded
//! leaves an empty file. Only a claim whose content names us is ours; an
//! empty or foreign one is not, and the grant moves to a higher epoch — one
//! wasted epoch, never two writers.
//!
//! Four questions: (1) one exclusive create, then write + fsync of its
//! content; (2) a crash between create and write leaves an empty claim
//! that nobody treats as theirs (re-driven by a grant at epoch + 1);
//! (3) the claim is the single-writer fence itself; (4) the name carries the
//! epoch, the content the owner's identity.

use crate::fs::Fs;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::Path;

/// Re-reads of an empty claim (5, 10, 20, 40, 80 ms apart: 155 ms in all)
/// before it is taken for one whose writer crashed.
const EMPTY_REREADS: u32 = 5;

/// Who claims an epoch: a broker process's life, not just its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimOwner {
    /// Broker id.
    pub broker_id: i32,
    /// That broker process's incarnation.
    pub incarnation: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Claim {
    epoch: i32,
    #[serde(flatten)]
    owner: ClaimOwner,
}

/// Outcome of [`claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// The epoch is ours (just created, or created by us before).
    Ours,
    /// Somebody else holds it; `None` if its content is empty or unreadable
    /// (a claimant that crashed, or a lost reply).
    Taken(Option<ClaimOwner>),
}

/// File name of the claim on `epoch`.
pub fn claim_name(epoch: i32) -> String {
    format!("leader-e{epoch}.claim")
}

/// Inverse of [`claim_name`].
pub fn parse_claim_name(name: &str) -> Option<i32> {
    name.strip_prefix("leader-e")?
        .strip_suffix(".claim")?
        .parse()
        .ok()
}

/// Read the owner of the claim on `epoch` in `dir`: `Ok(None)` if there is
/// no claim, `Ok(Some(None))` if it is empty or unreadable.
pub fn owner_of(fs: &dyn Fs, dir: &Path, epoch: i32) -> io::Result<Option<Option<ClaimOwner>>> {
    match fs.read(&dir.join(claim_name(epoch))) {
        Ok(b) => Ok(Some(
            serde_json::from_slice::<Claim>(&b)
                .ok()
                .filter(|c| c.epoch == epoch)
                .map(|c| c.owner),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Claim `epoch` of the partition in `dir` (which must exist) for `owner`.
/// `Ours` only once the claim is durable.
pub fn claim(fs: &dyn Fs, dir: &Path, epoch: i32, owner: ClaimOwner) -> io::Result<Claimed> {
    let path = dir.join(claim_name(epoch));
    match fs.create_exclusive(&path) {
        Ok(f) => {
            let body = serde_json::to_vec(&Claim { epoch, owner }).expect("claim serializes");
            f.write_all_at(&body, 0)?;
            f.sync_data()?;
            fs.sync_dir(dir)?;
            Ok(Claimed::Ours)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            // The winner may be between its create and its write: an empty
            // claim is read again for a little while before it counts as
            // owner-less (which lets the controller re-grant without
            // releasing anyone).
            let mut found = owner_of(fs, dir, epoch)?;
            for i in 0..EMPTY_REREADS {
                if !matches!(found, Some(None)) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5 << i));
                found = owner_of(fs, dir, epoch)?;
            }
            match found {
                Some(Some(o)) if o == owner => {
                    // Ours from an earlier attempt of this same process (a
                    // supervisor restart): make sure it is durable.
                    fs.open_write(&path)?.sync_data()?;
                    fs.sync_dir(dir)?;
                    Ok(Claimed::Ours)
                }
                Some(o) => Ok(Claimed::Taken(o)),
                // Removed between our create and our read (the sweep of a
                // much later leader): certainly not ours to write.
                None => Ok(Claimed::Taken(None)),
            }
        }
        Err(e) => Err(e),
    }
}
