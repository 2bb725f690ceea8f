//! Every name on the shared volume, and its parser. Nothing else in kaas
//! spells a file or directory name: a name is part of the on-disk format
//! (other brokers, older versions and the operator read it), so it is defined
//! once, next to its inverse, with a round-trip test.
//!
//! ```text
//! <data>/
//!   <topic>/.topic-id.json                 topic stamp (KIP-516 id)
//!   <topic>/.topic-config.json             altered topic configs {topic_id, configs}
//!   <topic>/<p>/<base:020>-e<E>.log        segment (and .index, .timeindex)
//!   <topic>/<p>/manifest-e<E>.json         partition manifest of epoch E
//!   <topic>/<p>/leader-e<E>.claim          leader-epoch claim (O_EXCL)
//!   <topic>/<p>/<off:020>-e<E>.producers   producer-state snapshot as of offset `off`
//!   .creating-<id>/                        a topic being created
//!   .deleted-<id>/                         a deleted topic being removed
//!   __cluster/                             (or KAAS_CLUSTER_DIR)
//!     cluster-id
//!     assignment.json                      assignment checkpoint (the whole map at its version)
//!     assignment/v-<n:012>.json            assignment version n: a delta (O_EXCL, CRC-headed)
//!     assignment/head                      the newest version number (a hint; temp → rename)
//!     brokers/<id>.json
//!     controller/epoch-<n:010>.json
//!     producer-ids/block-<n:012>.json
//! ```
//!
//! Scratch and trash directories are named by topic id only (the stamp
//! inside carries the name): a topic name may be 249 characters, and with
//! the name in them they would pass the 255-byte file-name limit. Older
//! versions wrote `.deleted-<topic>-<id>` / `.creating-<topic>-<id>`; those
//! are still recognised (by prefix) and removed.
//!
//! Any directory may also hold `.tmp-<name>-<hex>` files of an interrupted
//! [`crate::fs::write_atomic`]; the data and cluster directories may hold a
//! `.kaas-substrate-check-…` scratch directory of the substrate checker.

use std::path::{Path, PathBuf};

/// Default name of the cluster directory inside the data directory.
pub const CLUSTER_DIR: &str = "__cluster";
/// The topic identity stamp inside a topic directory.
pub const TOPIC_STAMP: &str = ".topic-id.json";
/// Prefix of the delete request inside a topic directory:
/// `.delete-requested-<topic id>` (see [`delete_request`]).
pub const DELETE_REQUEST_PREFIX: &str = ".delete-requested-";
/// A topic's altered configs inside its directory (AlterConfigs /
/// IncrementalAlterConfigs); carries the topic id it belongs to.
pub const TOPIC_CONFIG: &str = ".topic-config.json";
/// A topic's versioned state (partition count and altered configs, with
/// its topic id) inside its directory: `v-<n>.json` files (see
/// [`crate::topic_config`]); replaces [`TOPIC_CONFIG`] and the stamp's
/// count once written.
pub const TOPIC_STATE_DIR: &str = ".topic-state";
/// Prefix of a topic directory renamed aside for deletion.
pub const DELETED_PREFIX: &str = ".deleted-";
/// Prefix of a topic directory being built by a create.
pub const CREATING_PREFIX: &str = ".creating-";
/// Prefix of every temp file written by [`crate::fs::write_atomic`].
pub const TEMP_PREFIX: &str = ".tmp-";
/// Prefix of the substrate checker's scratch directories (in the data and
/// cluster directories while a check runs; stale ones are removed).
pub const SUBSTRATE_SCRATCH_PREFIX: &str = ".kaas-substrate-check-";
/// The cluster id, inside the cluster directory.
pub const CLUSTER_ID: &str = "cluster-id";
/// The data directory's binding to one cluster, inside the data directory:
/// `{"cluster_id": …}`, created once (see [`crate::binding`]).
pub const DATA_STAMP: &str = ".cluster-id.json";
/// The assignment checkpoint, inside the cluster directory: the whole map
/// as of the version it carries (written temp → rename; before the history
/// existed, the only assignment file).
pub const ASSIGNMENT: &str = "assignment.json";
/// The assignment history, inside the cluster directory: one
/// `v-<n:012>.json` per version ([`assignment_version`]).
pub const ASSIGNMENT_HISTORY_DIR: &str = "assignment";
/// Directory of liveness records, inside the cluster directory.
pub const BROKERS_DIR: &str = "brokers";
/// Directory of controller epoch claims, inside the cluster directory.
pub const CONTROLLER_DIR: &str = "controller";
/// Directory of producer-id blocks, inside the cluster directory.
pub const PRODUCER_IDS_DIR: &str = "producer-ids";
/// Client quotas, one file per version (see [`crate::quotas`]).
pub const QUOTAS_DIR: &str = "quotas";

/// Which file of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SegmentKind {
    /// `.log`: RecordBatch bytes.
    Log,
    /// `.index`: offset index, written at seal.
    Index,
    /// `.timeindex`: time index, written at seal.
    TimeIndex,
    /// `.txnindex`: the aborted transactions whose ABORT marker lies in the
    /// segment, written at seal when it holds markers (rebuilt from the
    /// segment's own bytes when missing).
    TxnIndex,
}

impl SegmentKind {
    /// The extension, without the dot.
    pub fn ext(self) -> &'static str {
        match self {
            SegmentKind::Log => "log",
            SegmentKind::Index => "index",
            SegmentKind::TimeIndex => "timeindex",
            SegmentKind::TxnIndex => "txnindex",
        }
    }

    fn from_ext(ext: &str) -> Option<Self> {
        match ext {
            "log" => Some(SegmentKind::Log),
            "index" => Some(SegmentKind::Index),
            "timeindex" => Some(SegmentKind::TimeIndex),
            "txnindex" => Some(SegmentKind::TxnIndex),
            _ => None,
        }
    }
}

/// Stem shared by a segment's `.log`, `.index` and `.timeindex` files.
pub fn segment_stem(base: i64, epoch: i32) -> String {
    format!("{base:020}-e{epoch}")
}

/// A segment file name.
pub fn segment_file(base: i64, epoch: i32, kind: SegmentKind) -> String {
    format!("{}.{}", segment_stem(base, epoch), kind.ext())
}

/// `<base>-e<E>.log`.
pub fn segment_log(base: i64, epoch: i32) -> String {
    segment_file(base, epoch, SegmentKind::Log)
}

/// `<base>-e<E>.index`.
pub fn segment_index(base: i64, epoch: i32) -> String {
    segment_file(base, epoch, SegmentKind::Index)
}

/// `<base>-e<E>.timeindex`.
pub fn segment_timeindex(base: i64, epoch: i32) -> String {
    segment_file(base, epoch, SegmentKind::TimeIndex)
}

/// `<base>-e<E>.txnindex`.
pub fn segment_txnindex(base: i64, epoch: i32) -> String {
    segment_file(base, epoch, SegmentKind::TxnIndex)
}

/// (base, epoch, extension) of anything shaped like a segment file, whatever
/// its extension: the controller counts every such epoch when it picks the
/// next one, so an unknown extension must not hide an epoch.
pub fn parse_segment_any(name: &str) -> Option<(i64, i32, &str)> {
    let (stem, ext) = name.split_once('.')?;
    let (base, epoch) = stem.split_once("-e")?;
    Some((base.parse().ok()?, epoch.parse().ok()?, ext))
}

/// Inverse of [`segment_file`].
pub fn parse_segment(name: &str) -> Option<(i64, i32, SegmentKind)> {
    let (base, epoch, ext) = parse_segment_any(name)?;
    Some((base, epoch, SegmentKind::from_ext(ext)?))
}

/// `<offset:020>-e<E>.producers`: the idempotent-producer state of a
/// partition as of `offset` (every batch below it), written by the leader
/// of epoch `E`. Shaped like a segment name on purpose: the controller's
/// scan for used epochs ([`parse_segment_any`]) counts it too.
pub fn producer_snapshot(offset: i64, epoch: i32) -> String {
    format!("{}.{PRODUCER_SNAPSHOT_EXT}", segment_stem(offset, epoch))
}

/// Inverse of [`producer_snapshot`]: `(offset, epoch)`.
pub fn parse_producer_snapshot(name: &str) -> Option<(i64, i32)> {
    match parse_segment_any(name)? {
        (offset, epoch, PRODUCER_SNAPSHOT_EXT) => Some((offset, epoch)),
        _ => None,
    }
}

const PRODUCER_SNAPSHOT_EXT: &str = "producers";

/// `manifest-e<E>.json`: the manifest written by epoch `E`.
pub fn manifest(epoch: i32) -> String {
    format!("manifest-e{epoch}.json")
}

/// Inverse of [`manifest`].
pub fn parse_manifest(name: &str) -> Option<i32> {
    name.strip_prefix("manifest-e")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// `leader-e<E>.claim`: the leader-epoch claim of epoch `E`.
pub fn leader_claim(epoch: i32) -> String {
    format!("leader-e{epoch}.claim")
}

/// Inverse of [`leader_claim`].
pub fn parse_leader_claim(name: &str) -> Option<i32> {
    name.strip_prefix("leader-e")?
        .strip_suffix(".claim")?
        .parse()
        .ok()
}

/// `epoch-<n:010>.json`: a controller epoch claim (in [`CONTROLLER_DIR`]).
pub fn controller_epoch(epoch: i32) -> String {
    format!("epoch-{epoch:010}.json")
}

/// Inverse of [`controller_epoch`].
pub fn parse_controller_epoch(name: &str) -> Option<i32> {
    name.strip_prefix("epoch-")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// `block-<n:012>.json`: a producer-id block (in [`PRODUCER_IDS_DIR`]).
pub fn producer_id_block(block: i64) -> String {
    format!("block-{block:012}.json")
}

/// Inverse of [`producer_id_block`].
pub fn parse_producer_id_block(name: &str) -> Option<i64> {
    name.strip_prefix("block-")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// `v-<n:012>.json`: version `n` of a versioned document (see
/// [`crate::versioned`]): the client quotas in [`QUOTAS_DIR`], a topic's
/// state in [`TOPIC_STATE_DIR`].
pub fn doc_version(n: u64) -> String {
    format!("v-{n:012}.json")
}

/// Inverse of [`doc_version`] (exactly twelve digits).
pub fn parse_doc_version(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("v-")?.strip_suffix(".json")?;
    if digits.len() != 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The assignment history's head, inside [`ASSIGNMENT_HISTORY_DIR`]: the
/// newest version number, rewritten (temp → rename) after each version is
/// durable. A hint for readers on NFS (a fixed name is close-to-open fresh;
/// a new name can hide behind a cached "no such file"), never the truth.
pub const ASSIGNMENT_HEAD: &str = "head";

/// `v-<n:012>.json`: version `n` of the assignment history (in
/// [`ASSIGNMENT_HISTORY_DIR`]).
pub fn assignment_version(n: u64) -> String {
    doc_version(n)
}

/// Inverse of [`assignment_version`].
pub fn parse_assignment_version(name: &str) -> Option<u64> {
    parse_doc_version(name)
}

/// `v-<n:012>.json`: version `n` of the client quotas (in [`QUOTAS_DIR`]).
pub fn quotas_version(n: u64) -> String {
    doc_version(n)
}

/// Inverse of [`quotas_version`].
pub fn parse_quotas_version(name: &str) -> Option<u64> {
    parse_doc_version(name)
}

/// `<id>.json`: a broker's liveness record (in [`BROKERS_DIR`]).
pub fn broker_record(id: i32) -> String {
    format!("{id}.json")
}

/// Inverse of [`broker_record`].
pub fn parse_broker_record(name: &str) -> Option<i32> {
    name.strip_suffix(".json")?.parse().ok()
}

/// `<p>`: a partition directory inside its topic directory.
pub fn partition(p: i32) -> String {
    p.to_string()
}

/// Inverse of [`partition`].
pub fn parse_partition(name: &str) -> Option<i32> {
    name.parse().ok()
}

/// `.deleted-<id>`: a topic renamed aside for removal.
pub fn deleted_topic(id: impl std::fmt::Display) -> String {
    format!("{DELETED_PREFIX}{id}")
}

/// Whether `name` is a topic renamed aside for removal (either form,
/// `.deleted-<id>` or an older version's `.deleted-<topic>-<id>`).
pub fn is_deleted_topic(name: &str) -> bool {
    name.starts_with(DELETED_PREFIX)
}

/// `.delete-requested-<id>`: inside a topic directory, the request that
/// incarnation `id` be deleted. The id is in the name, so a request can
/// only ever delete the incarnation it names: an empty file is a whole
/// request, and one left in a directory re-created under the same name
/// (which it cannot be: it moves aside with its directory) would name
/// another id and be ignored.
pub fn delete_request(id: impl std::fmt::Display) -> String {
    format!("{DELETE_REQUEST_PREFIX}{id}")
}

/// `.creating-<id>`: a topic directory being built.
pub fn creating_topic(id: impl std::fmt::Display) -> String {
    format!("{CREATING_PREFIX}{id}")
}

/// Whether `name` is a topic directory being built (or abandoned), in
/// either form (see [`is_deleted_topic`]).
pub fn is_creating_topic(name: &str) -> bool {
    name.starts_with(CREATING_PREFIX)
}

/// `.tmp-<target>-<nonce:016x>`: a temp file of [`crate::fs::write_atomic`].
pub fn temp(target: &str, nonce: u64) -> String {
    format!("{TEMP_PREFIX}{target}-{nonce:016x}")
}

/// Whether `name` is a temp file of [`crate::fs::write_atomic`].
pub fn is_temp(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX)
}

/// Whether `name` is a temp file that [`crate::fs::write_atomic`] made for
/// `target` (exactly: `.tmp-<target>-` and a 16-digit hex nonce), so a
/// writer can sweep its own leftovers in a directory others write too.
pub fn is_temp_of(name: &str, target: &str) -> bool {
    name.strip_prefix(TEMP_PREFIX)
        .and_then(|rest| rest.strip_prefix(target))
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|nonce| nonce.len() == 16 && nonce.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether `name` can never be a topic directory (our own scratch, trash and
/// cluster names).
pub fn is_reserved_topic_name(name: &str) -> bool {
    name.starts_with('.') || name == CLUSTER_DIR
}

/// The two roots: the data directory (topics) and the cluster directory
/// (coordination), which may be a separate volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Data directory: one directory per topic.
    pub data: PathBuf,
    /// Cluster directory (`<data>/__cluster` unless configured).
    pub cluster: PathBuf,
}

impl Layout {
    /// A layout; `cluster` defaults to `<data>/__cluster`.
    pub fn new(data: impl Into<PathBuf>, cluster: Option<PathBuf>) -> Self {
        let data = data.into();
        let cluster = cluster.unwrap_or_else(|| default_cluster_dir(&data));
        Self { data, cluster }
    }

    /// `<data>/<topic>`.
    pub fn topic_dir(&self, topic: &str) -> PathBuf {
        self.data.join(topic)
    }

    /// `<data>/<topic>/.topic-id.json`.
    pub fn topic_stamp(&self, topic: &str) -> PathBuf {
        self.topic_dir(topic).join(TOPIC_STAMP)
    }

    /// `<data>/<topic>/.topic-config.json`.
    pub fn topic_config(&self, topic: &str) -> PathBuf {
        self.topic_dir(topic).join(TOPIC_CONFIG)
    }

    /// `<data>/<topic>/<p>`.
    pub fn partition_dir(&self, topic: &str, p: i32) -> PathBuf {
        partition_dir(&self.data, topic, p)
    }

    /// `<cluster>/cluster-id`.
    pub fn cluster_id(&self) -> PathBuf {
        self.cluster.join(CLUSTER_ID)
    }

    /// `<cluster>/assignment.json`.
    pub fn assignment(&self) -> PathBuf {
        self.cluster.join(ASSIGNMENT)
    }

    /// `<cluster>/assignment/v-<n:012>.json`.
    pub fn assignment_version(&self, n: u64) -> PathBuf {
        self.cluster
            .join(ASSIGNMENT_HISTORY_DIR)
            .join(assignment_version(n))
    }

    /// `<cluster>/brokers`.
    pub fn brokers_dir(&self) -> PathBuf {
        self.cluster.join(BROKERS_DIR)
    }

    /// `<cluster>/brokers/<id>.json`.
    pub fn broker_record(&self, id: i32) -> PathBuf {
        broker_record_path(&self.cluster, id)
    }

    /// `<cluster>/controller`.
    pub fn controller_dir(&self) -> PathBuf {
        self.cluster.join(CONTROLLER_DIR)
    }

    /// `<cluster>/controller/epoch-<n>.json`.
    pub fn controller_epoch(&self, epoch: i32) -> PathBuf {
        self.controller_dir().join(controller_epoch(epoch))
    }

    /// `<cluster>/producer-ids`.
    pub fn producer_ids_dir(&self) -> PathBuf {
        self.cluster.join(PRODUCER_IDS_DIR)
    }

    /// `<cluster>/producer-ids/block-<n>.json`.
    pub fn producer_id_block(&self, block: i64) -> PathBuf {
        self.producer_ids_dir().join(producer_id_block(block))
    }
}

/// Directory of every consumer-group coordinator shard, inside the cluster
/// directory: `<cluster>/groups/<shard:04>/`.
pub const GROUPS_DIR: &str = "groups";

/// Directory of every transaction coordinator shard, inside the cluster
/// directory: `<cluster>/txns/<shard:04>/` (same shards and file names as
/// `groups/`).
pub const TXNS_DIR: &str = "txns";

/// The cluster's coordinator-shard count, created once by exclusive create.
pub const GROUP_SHARDS_FILE: &str = "group-shards.json";

/// `<cluster>/groups/<shard:04>`: one coordinator shard's files (its state
/// files and its `leader-e<E>.claim`s).
pub fn shard_dir(cluster: &Path, shard: u32) -> PathBuf {
    cluster.join(GROUPS_DIR).join(format!("{shard:04}"))
}

/// `<base:020>-e<E>.log`: a shard state file of epoch E. `base` is one above
/// every number its writer found, so no two files ever share a name.
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

/// `<data>/__cluster`: where the cluster directory lives unless configured.
pub fn default_cluster_dir(data: &Path) -> PathBuf {
    data.join(CLUSTER_DIR)
}

/// `<data>/<topic>/<p>`.
pub fn partition_dir(data: &Path, topic: &str, p: i32) -> PathBuf {
    data.join(topic).join(partition(p))
}

/// `<cluster>/brokers/<id>.json`, for code that holds only the cluster dir.
pub fn broker_record_path(cluster: &Path, id: i32) -> PathBuf {
    cluster.join(BROKERS_DIR).join(broker_record(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temp_is_matched_to_its_exact_target() {
        let t = temp("1.json", 0xab);
        assert!(is_temp_of(&t, "1.json"), "{t}");
        // Another writer's target that shares a prefix is not ours.
        assert!(!is_temp_of(&temp("11.json", 0xab), "1.json"));
        assert!(!is_temp_of(&temp("1.json.bak", 0xab), "1.json"));
        assert!(!is_temp_of("1.json", "1.json"));
        assert!(!is_temp_of(".tmp-1.json-xyz", "1.json"));
        assert!(!is_temp_of(&format!("{t}0"), "1.json"));
    }

    #[test]
    fn segment_names_round_trip() {
        assert_eq!(segment_log(42, 3), "00000000000000000042-e3.log");
        for kind in [
            SegmentKind::Log,
            SegmentKind::Index,
            SegmentKind::TimeIndex,
            SegmentKind::TxnIndex,
        ] {
            let n = segment_file(42, 3, kind);
            assert_eq!(parse_segment(&n), Some((42, 3, kind)), "{n}");
        }
        assert_eq!(
            segment_timeindex(i64::MAX, i32::MAX),
            format!("{}.timeindex", segment_stem(i64::MAX, i32::MAX))
        );
        assert_eq!(
            parse_segment(&segment_index(0, 0)),
            Some((0, 0, SegmentKind::Index))
        );
        // Not segments, or not a kind we write.
        assert_eq!(parse_segment("manifest-e1.json"), None);
        assert_eq!(parse_segment(&leader_claim(1)), None);
        assert_eq!(parse_segment("00000000000000000042-e3.swp"), None);
        assert_eq!(
            parse_segment_any("00000000000000000042-e3.swp"),
            Some((42, 3, "swp"))
        );
        assert_eq!(parse_segment(&temp(&segment_log(1, 1), 7)), None);
    }

    #[test]
    fn producer_snapshot_names_round_trip() {
        let n = producer_snapshot(1234, 7);
        assert_eq!(n, "00000000000000001234-e7.producers");
        assert_eq!(parse_producer_snapshot(&n), Some((1234, 7)));
        assert_eq!(
            parse_producer_snapshot(&producer_snapshot(i64::MAX, i32::MAX)),
            Some((i64::MAX, i32::MAX))
        );
        // Neither a segment nor anything else is a snapshot, and a snapshot
        // is no segment (the log's sweep must not take it for one).
        assert_eq!(parse_producer_snapshot(&segment_log(1234, 7)), None);
        assert_eq!(parse_producer_snapshot(&manifest(7)), None);
        assert_eq!(parse_producer_snapshot(&temp(&n, 3)), None);
        assert_eq!(parse_segment(&n), None);
    }

    #[test]
    fn epoch_names_round_trip() {
        for e in [0, 1, 7, i32::MAX] {
            assert_eq!(parse_manifest(&manifest(e)), Some(e));
            assert_eq!(parse_leader_claim(&leader_claim(e)), Some(e));
            assert_eq!(parse_controller_epoch(&controller_epoch(e)), Some(e));
        }
        assert_eq!(controller_epoch(2), "epoch-0000000002.json");
        assert_eq!(leader_claim(2), "leader-e2.claim");
        assert_eq!(manifest(2), "manifest-e2.json");
        assert_eq!(parse_manifest(&leader_claim(2)), None);
        assert_eq!(parse_leader_claim(&manifest(2)), None);
        assert_eq!(parse_manifest(&temp(&manifest(2), 1)), None);
    }

    #[test]
    fn cluster_names_round_trip() {
        for b in [0, 3, i64::MAX] {
            assert_eq!(parse_producer_id_block(&producer_id_block(b)), Some(b));
        }
        assert_eq!(producer_id_block(3), "block-000000000003.json");
        for id in [0, 1, 42] {
            assert_eq!(parse_broker_record(&broker_record(id)), Some(id));
        }
        assert_eq!(parse_broker_record(&temp(&broker_record(1), 9)), None);
        assert_eq!(parse_partition(&partition(12)), Some(12));
        for n in [0, 7, 999_999_999_999] {
            assert_eq!(parse_doc_version(&doc_version(n)), Some(n));
        }
        assert_eq!(doc_version(7), "v-000000000007.json");
        assert_eq!(parse_doc_version("v-7.json"), None);
        assert_eq!(parse_doc_version(&temp(&doc_version(1), 9)), None);
    }

    #[test]
    fn topic_names_are_recognised() {
        let id = "00000000-0000-0000-0000-000000000001";
        assert!(is_deleted_topic(&deleted_topic(id)));
        assert!(is_creating_topic(&creating_topic(id)));
        assert!(!is_deleted_topic(&creating_topic(id)));
        // An older version's forms, with the name in them.
        assert!(is_deleted_topic(&format!(".deleted-t-{id}")));
        assert!(is_creating_topic(&format!(".creating-t-{id}")));
        // The longest valid topic name still fits in a file name when
        // renamed aside or built: the name is not part of these.
        assert!(deleted_topic(id).len() + 249 > 255);
        assert!(deleted_topic(id).len() < 64 && creating_topic(id).len() < 64);
        assert!(is_temp(&temp(TOPIC_STAMP, 1)));
        for n in [TOPIC_STAMP, CLUSTER_DIR, ".x"] {
            assert!(is_reserved_topic_name(n), "{n}");
        }
        assert!(!is_reserved_topic_name("orders"));
    }

    #[test]
    fn layout_paths() {
        let l = Layout::new("/d", None);
        assert_eq!(l.cluster, Path::new("/d/__cluster"));
        assert_eq!(l.partition_dir("t", 3), Path::new("/d/t/3"));
        assert_eq!(l.topic_stamp("t"), Path::new("/d/t/.topic-id.json"));
        assert_eq!(l.topic_config("t"), Path::new("/d/t/.topic-config.json"));
        assert_eq!(l.broker_record(4), Path::new("/d/__cluster/brokers/4.json"));
        assert_eq!(
            l.controller_epoch(2),
            Path::new("/d/__cluster/controller/epoch-0000000002.json")
        );
        assert_eq!(
            l.producer_id_block(3),
            Path::new("/d/__cluster/producer-ids/block-000000000003.json")
        );
        assert_eq!(l.cluster_id(), Path::new("/d/__cluster/cluster-id"));
        assert_eq!(l.assignment(), Path::new("/d/__cluster/assignment.json"));
        let sep = Layout::new("/d", Some("/c".into()));
        assert_eq!(sep.assignment(), Path::new("/c/assignment.json"));
        assert_eq!(
            sep.assignment_version(7),
            Path::new("/c/assignment/v-000000000007.json")
        );
        assert_eq!(parse_assignment_version(&assignment_version(9)), Some(9));
    }
}
