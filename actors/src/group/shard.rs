//! Group → coordinator shard: which shard's state files hold a group.
//!
//! The shard count is fixed when the cluster is created (like the partition
//! count of Kafka's `__consumer_offsets`, default 50) and never changes
//! afterwards: a group's offsets live in exactly one shard's files, and a
//! different count would send the group to a shard that has never heard of
//! it. The mapping is Kafka's own, `Utils.abs(groupId.hashCode()) %
//! numPartitions` with Java's `String.hashCode`, so a group lands on the
//! same shard number it would in Apache Kafka (handy when comparing a
//! migrated cluster, and documented once, here).

use std::fmt;

/// Kafka's default `offsets.topic.num.partitions`.
pub const DEFAULT_SHARDS: u32 = 50;

/// A number of coordinator shards, at least 1. Fixed at cluster creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShardCount(u32);

/// A shard number in `0..count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(pub u32);

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl ShardCount {
    /// A shard count; `None` for zero (no group could be placed) and for
    /// counts above `i32::MAX` (Kafka's partition counts are `int`).
    pub fn new(n: u32) -> Option<Self> {
        (n >= 1 && n <= i32::MAX as u32).then_some(Self(n))
    }

    /// The count.
    pub fn get(self) -> u32 {
        self.0
    }

    /// The shard that owns `group_id`.
    pub fn shard_of(self, group_id: &str) -> ShardId {
        // Kafka's Utils.abs maps Integer.MIN_VALUE (whose Math.abs is itself)
        // to 0 rather than to a negative index.
        let h = java_string_hash(group_id);
        let abs = if h == i32::MIN { 0 } else { h.unsigned_abs() };
        ShardId(abs % self.0)
    }
}

impl Default for ShardCount {
    fn default() -> Self {
        Self(DEFAULT_SHARDS)
    }
}

/// Java's `String.hashCode`: `s[0]*31^(n-1) + … + s[n-1]` over the UTF-16
/// code units, in wrapping 32-bit arithmetic. Characters outside the BMP
/// count as their two surrogates, as in Java.
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, u| h.wrapping_mul(31).wrapping_add(i32::from(u)))
}

/// File name of the shard count in the cluster directory.
pub const SHARD_COUNT_FILE: &str = kaas_volume::layout::GROUP_SHARDS_FILE;

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct StoredCount {
    shards: u32,
}

impl kaas_volume::identity::JsonIdentity for StoredCount {}

/// The shard count recorded in `cluster_dir`, if any (the controller reads
/// it; a broker records it at start, before it runs a controller).
pub fn read_count(
    fs: &dyn kaas_volume::fs::Fs,
    cluster_dir: &std::path::Path,
) -> std::io::Result<Option<ShardCount>> {
    use kaas_volume::identity::{read_identity, Found};
    Ok(
        match read_identity::<StoredCount>(fs, &cluster_dir.join(SHARD_COUNT_FILE))? {
            Found::Identity(c) => ShardCount::new(c.shards),
            Found::Absent | Found::Empty => None,
        },
    )
}

/// The cluster's shard count: `<cluster>/group-shards.json`, created once
/// (exclusive create, then write + fsync) by the first broker with its
/// configured `default`; every later reader uses what the winner wrote, so
/// the count is immutable after cluster creation (a group's shard is a
/// function of it).
///
/// Four questions: (1) one exclusive create; (2) a creator that died between
/// create and write leaves an empty file, re-read every 100 ms and replaced
/// after `abandon_after` (temp → fsync → rename), then read back; (3) racers
/// all read back and agree once it is non-empty; (4) the count is the
/// identity itself, never reused with another meaning.
pub fn read_or_create_count(
    fs: &dyn kaas_volume::fs::Fs,
    cluster_dir: &std::path::Path,
    default: ShardCount,
    abandon_after: std::time::Duration,
) -> std::io::Result<ShardCount> {
    use kaas_volume::identity::{create_with_identity, read_identity, Claimed, Found, Policy};
    let path = cluster_dir.join(SHARD_COUNT_FILE);
    let started = std::time::Instant::now();
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "bad shard count");
    loop {
        match read_identity::<StoredCount>(fs, &path)? {
            Found::Identity(c) => return ShardCount::new(c.shards).ok_or_else(bad),
            Found::Empty if started.elapsed() > abandon_after => {
                let me = StoredCount {
                    shards: default.get(),
                };
                kaas_volume::fs::write_atomic(fs, &path, &serde_json::to_vec(&me)?)?;
            }
            Found::Empty => std::thread::sleep(std::time::Duration::from_millis(100)),
            Found::Absent => {
                let me = StoredCount {
                    shards: default.get(),
                };
                match create_with_identity(fs, &path, &me, Policy::DURABLE)? {
                    Claimed::Won | Claimed::Ours => return Ok(default),
                    Claimed::Taken(c) => return ShardCount::new(c.shards).ok_or_else(bad),
                    Claimed::Indeterminate(_) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by `String.hashCode()` on OpenJDK 17, and
    /// `Utils.abs(hash) % 50` for the shard.
    const JAVA: &[(&str, i32, u32)] = &[
        ("", 0, 0),
        ("a", 97, 47),
        ("hello", 99162322, 22),
        ("polygenelubricants", i32::MIN, 0),
        ("my-group", -1906497762, 12),
        ("console-consumer-12345", 158455506, 6),
        ("kaas", 3283976, 26),
        ("\u{1F600}", 1772899, 49),
        ("Aa", 2112, 12),
        ("BB", 2112, 12),
        ("test-consumer-group", -1793216381, 31),
        ("group-with-a-negative-hash-0", -2123356124, 24),
    ];

    #[test]
    fn the_hash_is_javas_string_hash_code() {
        for &(s, h, _) in JAVA {
            assert_eq!(java_string_hash(s), h, "{s:?}");
        }
    }

    #[test]
    fn groups_map_to_the_shard_kafka_would_pick() {
        let count = ShardCount::new(50).unwrap();
        assert_eq!(count, ShardCount::default());
        for &(s, _, shard) in JAVA {
            assert_eq!(count.shard_of(s), ShardId(shard), "{s:?}");
        }
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // a temp dir for the fixture
    fn the_shard_count_is_fixed_by_the_first_creator() {
        let d = tempfile::tempdir().unwrap();
        let fs = kaas_volume::fs::RealFs;
        let ten = ShardCount::new(10).unwrap();
        let first = read_or_create_count(&fs, d.path(), ten, std::time::Duration::ZERO).unwrap();
        assert_eq!(first, ten);
        let again = read_or_create_count(
            &fs,
            d.path(),
            ShardCount::default(),
            std::time::Duration::ZERO,
        )
        .unwrap();
        assert_eq!(again, ten, "a later default does not change it");
    }

    #[test]
    fn every_shard_is_in_range_and_counts_are_checked() {
        assert_eq!(ShardCount::new(0), None);
        assert_eq!(ShardCount::new(u32::MAX), None);
        let one = ShardCount::new(1).unwrap();
        assert_eq!(one.shard_of("anything"), ShardId(0));
        let seven = ShardCount::new(7).unwrap();
        for i in 0..1000 {
            assert!(seven.shard_of(&format!("g{i}")).0 < 7);
        }
    }
}
