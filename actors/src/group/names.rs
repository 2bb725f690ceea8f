//! Names of a coordinator shard's files, typed by [`ShardId`]. The names
//! themselves are defined with every other name on the volume, in
//! `kaas_volume::layout`:
//!
//! ```text
//! <cluster>/groups/<shard:04>/<base:020>-e<E>.log   a shard state file of epoch E
//! <cluster>/groups/<shard:04>/leader-e<E>.claim      the epoch's owner
//! <cluster>/groups/<shard:04>/.tmp-…                 a compaction in progress
//! ```

use super::shard::ShardId;
use std::path::{Path, PathBuf};

pub use kaas_volume::layout::{parse_shard_log, shard_log, GROUPS_DIR};

/// `<cluster>/groups/<shard:04>`.
pub fn shard_dir(cluster: &Path, shard: ShardId) -> PathBuf {
    kaas_volume::layout::shard_dir(cluster, shard.0)
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
