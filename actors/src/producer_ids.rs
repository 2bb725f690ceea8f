//! Producer-id blocks: `<cluster>/producer-ids/block-<n>.json`, claimed with
//! O_CREAT|O_EXCL so no two brokers — and no two incarnations of one broker —
//! ever hand out the same producer id. A restarted broker claims a fresh
//! block instead of resuming an old one, so an id is never reissued onto a
//! dead producer's sequence history (names are not identities).

use crate::fs::SharedFs;
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

/// Hands out producer ids from the block this broker claimed.
pub struct ProducerIdAllocator {
    fs: SharedFs,
    dir: PathBuf,
    broker_id: i32,
    next: i64,
    end: i64,
}

fn block_name(n: i64) -> String {
    format!("block-{n:012}.json")
}

impl ProducerIdAllocator {
    /// An allocator that claims its first block on first use.
    pub fn new(fs: SharedFs, cluster_dir: &Path, broker_id: i32) -> Self {
        Self {
            fs,
            dir: cluster_dir.join("producer-ids"),
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
            .filter_map(|s| {
                s.strip_prefix("block-")?
                    .strip_suffix(".json")?
                    .parse::<i64>()
                    .ok()
            })
            .max()
            .map(|m| m + 1)
            .unwrap_or(0);
        for _ in 0..1000 {
            let claim = BlockClaim {
                block: n,
                broker_id: self.broker_id,
                nonce: rand::random(),
            };
            let path = self.dir.join(block_name(n));
            match self.fs.create_exclusive(&path) {
                Ok(f) => {
                    f.write_all_at(&serde_json::to_vec(&claim).expect("serializes"), 0)?;
                    f.sync_data()?;
                    self.fs.sync_dir(&self.dir)?;
                    self.next = n * BLOCK_SIZE;
                    self.end = self.next + BLOCK_SIZE;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => n += 1,
                Err(e) => return Err(e),
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
    use crate::fs::RealFs;
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
}
