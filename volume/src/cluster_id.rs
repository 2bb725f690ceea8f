//! `<cluster>/cluster-id`: created once with the exclusive-create primitive
//! ([`crate::identity`]); the first broker wins and everyone reads the
//! winner's. The file holds the id as plain text (not JSON), as it always has.
//!
//! Four questions: (1) one exclusive create, then write + fsync; (2) a
//! creator that died between create and write leaves an empty file, which
//! readers wait out and, after `abandon_after` of seeing it empty, replace
//! (temp → fsync → rename, then read back whichever replacement won);
//! (3) several brokers may race the replacement, but every one of them reads
//! the file back and uses what it finds, so all agree once it is non-empty;
//! (4) the id is random per cluster.

use crate::fs::{write_atomic, Fs};
use crate::identity::{create_with_identity, Claimed, Identity, Policy};
use crate::layout;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// A cluster id, as stored in `cluster-id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterId(pub String);

impl Identity for ClusterId {
    fn encode(&self) -> Vec<u8> {
        self.0.as_bytes().to_vec()
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        let id = String::from_utf8_lossy(bytes).trim().to_owned();
        (!id.is_empty()).then_some(ClusterId(id))
    }
}

fn fresh() -> ClusterId {
    ClusterId(uuid::Uuid::new_v4().simple().to_string())
}

/// The cluster id in `cluster_dir`, creating it if there is none. An empty
/// file (a creator that died before its write) is re-read every 100 ms and
/// replaced after `abandon_after`.
pub fn read_or_create(
    fs: &dyn Fs,
    cluster_dir: &Path,
    abandon_after: Duration,
) -> io::Result<String> {
    let path = cluster_dir.join(layout::CLUSTER_ID);
    let started = Instant::now();
    loop {
        match fs.read(&path) {
            Ok(b) => {
                if let Some(ClusterId(id)) = ClusterId::decode(&b) {
                    return Ok(id);
                }
                if started.elapsed() > abandon_after {
                    write_atomic(fs, &path, &fresh().encode())?;
                    continue; // read back whichever replacement won
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let me = fresh();
                match create_with_identity(fs, &path, &me, Policy::DURABLE)? {
                    Claimed::Won | Claimed::Ours => return Ok(me.0),
                    Claimed::Taken(ClusterId(id)) => return Ok(id),
                    // Empty (a creator between create and write, or our own
                    // create whose reply was lost) or gone: read again.
                    Claimed::Indeterminate(_) => {}
                }
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::fault::FaultFs;
    use crate::fs::RealFs;

    /// Catches: a crash between the exclusive create and the fsynced write
    /// of `cluster-id` leaving every later start stuck on an empty file, or
    /// two reads of one cluster disagreeing on its id.
    #[test]
    fn crash_at_every_step_of_cluster_id_creation_converges() {
        let mut crashed_somewhere = false;
        for n in 1..=10 {
            let d = tempfile::tempdir().unwrap();
            let ffs = FaultFs::new();
            ffs.crash_at(ffs.ops() + n);
            let first = read_or_create(&ffs, d.path(), Duration::from_millis(50));
            let crashed = ffs.crashed();
            ffs.power_loss();
            let id = read_or_create(&RealFs, d.path(), Duration::from_millis(50))
                .unwrap_or_else(|e| panic!("step {n}: no cluster id after the crash: {e}"));
            assert!(!id.is_empty());
            assert_eq!(
                read_or_create(&RealFs, d.path(), Duration::from_millis(50)).unwrap(),
                id,
                "step {n}: the id changed between two starts"
            );
            if !crashed {
                assert_eq!(first.unwrap(), id, "an uncrashed creation is durable");
                assert!(
                    crashed_somewhere,
                    "no step crashed: the test checks nothing"
                );
                return;
            }
            crashed_somewhere = true;
        }
        panic!("cluster id creation took more than 10 steps");
    }

    /// Catches: a lost reply to our own create (an empty file we made)
    /// blocking the start for ever, or two ids for one cluster.
    #[test]
    fn a_lost_reply_to_the_create_is_replaced_and_read_back() {
        let d = tempfile::tempdir().unwrap();
        let ffs = FaultFs::new();
        ffs.lose_create_reply(1);
        let id = read_or_create(&ffs, d.path(), Duration::from_millis(50)).unwrap();
        assert_eq!(
            read_or_create(&RealFs, d.path(), Duration::from_millis(50)).unwrap(),
            id
        );
    }
}
