//! Names of a coordinator shard's files in the cluster directory.
//!
//! TODO(groups): move these into `kaas_volume::layout` (with the rest of the
//! volume's names) once the shard files are wired to an actor; they live
//! here for now so this module does not touch files other sessions edit.
//!
//! ```text
//! <cluster>/groups/<shard:04>/<base:020>-e<E>.log   a shard state file of epoch E
//! <cluster>/groups/<shard:04>/.tmp-…                 a compaction in progress
//! ```
//!
//! `base` is the file's number within the shard, one above the highest
//! number the writer found (of any epoch), so no two files ever share a name
//! even when one epoch compacts several times.

use super::shard::ShardId;
use std::path::{Path, PathBuf};

/// Directory of every shard, inside the cluster directory.
pub const GROUPS_DIR: &str = "groups";

/// `<cluster>/groups/<shard:04>`.
pub fn shard_dir(cluster: &Path, shard: ShardId) -> PathBuf {
    cluster.join(GROUPS_DIR).join(format!("{:04}", shard.0))
}

/// `<base:020>-e<E>.log`: a shard state file.
pub fn shard_log(base: u64, epoch: i32) -> String {
    format!("{base:020}-e{epoch}.log")
}

/// Inverse of [`shard_log`].
pub fn parse_shard_log(name: &str) -> Option<(u64, i32)> {
    let stem = name.strip_suffix(".log")?;
    let (base, epoch) = stem.split_once("-e")?;
    if base.len() != 20 || !base.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((base.parse().ok()?, epoch.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (b, e) in [(0u64, 0i32), (1, 7), (u64::MAX, i32::MAX)] {
            assert_eq!(parse_shard_log(&shard_log(b, e)), Some((b, e)));
        }
        assert_eq!(parse_shard_log("1-e2.log"), None);
        assert_eq!(parse_shard_log(".tmp-00000000000000000001-e2.log-ab"), None);
        assert_eq!(parse_shard_log("00000000000000000001-e2.index"), None);
        assert_eq!(
            shard_dir(Path::new("/c"), ShardId(7)),
            PathBuf::from("/c/groups/0007")
        );
    }
}
