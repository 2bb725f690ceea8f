//! Producer-id blocks: `<cluster>/producer-ids/block-<n>.json`, claimed with
//! O_CREAT|O_EXCL so no two brokers — and no two incarnations of one broker —
//! ever hand out the same producer id. A restarted broker claims a fresh
//! block instead of resuming an old one, so an id is never reissued onto a
//! dead producer's sequence history (names are not identities).

use kaas_volume::fs::SharedFs;
use kaas_volume::identity::{create_with_identity, Claimed, CreateError, JsonIdentity, Policy};
use kaas_volume::layout;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};

/// Producer ids per block.
pub const BLOCK_SIZE: i64 = 1000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct BlockClaim {
    block: i64,
    broker_id: i32,
    nonce: u64,
}

impl JsonIdentity for BlockClaim {}

/// Hands out producer ids from the block this broker claimed.
pub struct ProducerIdAllocator {
    fs: SharedFs,
    dir: PathBuf,
    broker_id: i32,
    next: i64,
    end: i64,
}

impl ProducerIdAllocator {
    /// An allocator that claims its first block on first use.
    pub fn new(fs: SharedFs, cluster_dir: &Path, broker_id: i32) -> Self {
        Self {
            fs,
            dir: cluster_dir.join(layout::PRODUCER_IDS_DIR),
            broker_id,
            next: 0,
            end: 0,
        }
    }

    fn claim_block(&mut self) -> io::Result<()> {
        self.fs.create_dir_all(&self.dir)?;
        let mut n = self
            .fs
            .list(&self.dir)?
            .iter()
            .filter_map(|s| layout::parse_producer_id_block(s))
            .max()
            .map(|m| m + 1)
            .unwrap_or(0);
        for _ in 0..1000 {
            let claim = BlockClaim {
                block: n,
                broker_id: self.broker_id,
                nonce: rand::random(),
            };
            let path = self.dir.join(layout::producer_id_block(n));
            // The nonce makes every attempt's identity unique, so `Ours` can
            // only be this very attempt (a reply lost after our write). A
            // block someone else holds, or one that stays empty (a crashed
            // claimant, or our own create whose reply was lost), is skipped:
            // block numbers are plentiful, reissued ids are not allowed.
            match create_with_identity(self.fs.as_ref(), &path, &claim, Policy::DURABLE) {
                Ok(Claimed::Won | Claimed::Ours) => {
                    self.next = n * BLOCK_SIZE;
                    self.end = self.next + BLOCK_SIZE;
                    return Ok(());
                }
                Ok(Claimed::Taken(_) | Claimed::Indeterminate(_))
                | Err(CreateError::Read { .. }) => n += 1,
                Err(e) => return Err(e.into()),
            }
        }
        Err(io::Error::other("could not claim a producer-id block"))
    }

    /// The next producer id (durably reserved before it is returned).
    pub fn allocate(&mut self) -> io::Result<i64> {
        if self.next >= self.end {
            self.claim_block()?;
        }
        let id = self.next;
        self.next += 1;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_volume::fs::{Fs, RealFs};
    use std::sync::Arc;

    #[test]
    fn restart_never_reissues_an_id() {
        let d = tempfile::tempdir().unwrap();
        let fs: SharedFs = Arc::new(RealFs);
        let mut a = ProducerIdAllocator::new(fs.clone(), d.path(), 0);
        let first = a.allocate().unwrap();
        assert_eq!(a.allocate().unwrap(), first + 1);
        let mut b = ProducerIdAllocator::new(fs, d.path(), 0);
        assert!(b.allocate().unwrap() >= first + BLOCK_SIZE);
    }

    /// Catches: ids reissued after every broker of a cluster restarts (no
    /// one left who remembers what was handed out): each restarted broker
    /// claims a block above every block on the volume.
    #[test]
    fn a_whole_cluster_restart_issues_only_ids_above_every_earlier_one() {
        let d = tempfile::tempdir().unwrap();
        let fs: SharedFs = Arc::new(RealFs);
        let mut before = Vec::new();
        for broker in 0..3 {
            let mut a = ProducerIdAllocator::new(fs.clone(), d.path(), broker);
            before.push(a.allocate().unwrap());
            before.push(a.allocate().unwrap());
        }
        let max_before = *before.iter().max().unwrap();
        for round in 0..2 {
            let mut after = Vec::new();
            for broker in (0..3).rev() {
                let mut a = ProducerIdAllocator::new(fs.clone(), d.path(), broker);
                after.push(a.allocate().unwrap());
            }
            assert!(
                after.iter().all(|id| *id > max_before),
                "round {round}: {after:?} reissues one of {before:?}"
            );
            before.extend(after);
        }
        let mut unique = before.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), before.len(), "{before:?}");
    }

    /// Catches: a lost reply to the exclusive create of a block (the file
    /// exists, empty) being taken as ours or as fatal: the allocator skips
    /// to the next block, and that block is durably named by us.
    #[test]
    fn a_lost_reply_to_a_block_create_takes_the_next_block() {
        let d = tempfile::tempdir().unwrap();
        let ffs = kaas_volume::fs::fault::FaultFs::new();
        ffs.lose_create_reply(1);
        let mut a = ProducerIdAllocator::new(Arc::new(ffs), d.path(), 7);
        assert_eq!(a.allocate().unwrap(), BLOCK_SIZE, "block 0 is skipped");
        let dir = d.path().join(layout::PRODUCER_IDS_DIR);
        assert_eq!(
            RealFs
                .read(&dir.join(layout::producer_id_block(0)))
                .unwrap(),
            b""
        );
        let b1: BlockClaim = serde_json::from_slice(
            &RealFs
                .read(&dir.join(layout::producer_id_block(1)))
                .unwrap(),
        )
        .unwrap();
        assert_eq!((b1.block, b1.broker_id), (1, 7));
    }
}
