//! The two cluster files brokers exchange, and how they are read and written.
//!
//! * `<cluster>/brokers/<id>.json` — a broker's liveness record, rewritten
//!   (temp → fsync → rename) every heartbeat by that broker alone.
//! * The assignment — partition → (leader, incarnation, leader epoch) — as a
//!   linear history written by the elected controller alone (see
//!   [`super::history`]): `<cluster>/assignment/v-<n>.json` holds version
//!   `n` as an [`AssignmentDelta`] on version `n - 1`, each created with
//!   O_CREAT|O_EXCL; `<cluster>/assignment.json` is a checkpoint, the whole
//!   [`Assignment`] as of the version it carries. Versions rise across
//!   controllers; every number names one content forever.
//!
//! All are fixed names read by exact open (close-to-open freshness), never
//! discovered through a listing. The only listing is of `brokers/`, used to
//! discover brokers that joined; a stale listing delays a join, nothing else.

use crate::partition::claim::ClaimOwner;
use kaas_volume::fs::{write_atomic, Fs};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io;
use std::path::Path;

pub use kaas_volume::layout::{broker_record_path, ASSIGNMENT, BROKERS_DIR};

/// One broker's liveness record. Only `seq` changing means "alive"; the
/// reader times that change on its own monotonic clock, so no two hosts'
/// clocks are ever compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRecord {
    /// Broker id.
    pub broker_id: i32,
    /// Random id of this broker process's current life. A new incarnation
    /// is written only once every earlier one is known to be fenced (its
    /// lease lapsed, or it exited cleanly), so leadership granted to an
    /// earlier incarnation may be moved at once.
    pub incarnation: u64,
    /// Rises with every heartbeat.
    pub seq: u64,
    /// Advertised Kafka listener.
    pub host: String,
    /// Advertised Kafka port.
    pub port: i32,
    /// The newest assignment this incarnation has fully applied (leaders
    /// it no longer owns are stopped and their files closed): its
    /// controller epoch and version. Versions rise across controllers, but
    /// a deposed controller's late write can repeat a number, so a release
    /// is judged on the pair.
    #[serde(default)]
    pub applied_controller_epoch: i32,
    /// See `applied_controller_epoch`.
    #[serde(default)]
    pub applied_version: u64,
    /// Asked to leave (SIGTERM): the controller moves its partitions away.
    #[serde(default)]
    pub shutting_down: bool,
    /// Exited cleanly: leads nothing, holds nothing.
    #[serde(default)]
    pub clean_exit: bool,
    /// Controller epoch this broker has given up (it will never write the
    /// assignment under it again), so a successor need not wait a lease.
    #[serde(default)]
    pub controller_released: Option<i32>,
    /// Partitions granted to this broker whose leader was fenced at open:
    /// its epoch was claimed by another leader, or a higher epoch was on
    /// disk. The controller re-grants them above the epoch found, after
    /// releasing the other leader if it is alive.
    #[serde(default)]
    pub fenced: Vec<FencedAt>,
}

/// The `topic` of a [`FencedAt`] that names a coordinator shard (its
/// `partition` is the shard): no topic can have an empty name.
pub const COORDINATOR_SHARDS: &str = "";

/// A grant found fenced at open (see [`BrokerRecord::fenced`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedAt {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The epoch found claimed or on disk.
    pub found: i32,
    /// The leader that claimed it, if that is what fenced us and its claim
    /// is readable.
    #[serde(default)]
    pub owner: Option<ClaimOwner>,
}

impl BrokerRecord {
    /// Whether this record shows the assignment (controller epoch
    /// `epoch`, `version`) — or a later one — applied.
    pub fn has_applied(&self, epoch: i32, version: u64) -> bool {
        (self.applied_controller_epoch, self.applied_version) >= (epoch, version)
    }
}

/// One partition's entry in the assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionAssignment {
    /// Leader broker id, or -1 while no broker leads it.
    pub leader: i32,
    /// The leader's incarnation the grant is for.
    pub incarnation: u64,
    /// Leader epoch: rises on every grant, never reused.
    pub epoch: i32,
    /// Two-phase move: the partition was taken from this (broker,
    /// incarnation) at this assignment version; it may be granted again
    /// once that broker has applied the version (or is fenced).
    #[serde(default)]
    pub releasing: Option<(i32, u64, u64)>,
}

impl PartitionAssignment {
    /// Not led by anyone yet.
    pub fn vacant(epoch: i32) -> Self {
        Self {
            leader: -1,
            incarnation: 0,
            epoch,
            releasing: None,
        }
    }
}

/// A topic in the assignment (its identity stamp, as the controller read it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicAssignment {
    /// KIP-516 topic id.
    pub topic_id: uuid::Uuid,
    /// Topic configs.
    pub configs: BTreeMap<String, String>,
    /// One entry per partition index.
    pub partitions: Vec<PartitionAssignment>,
    /// Being deleted: no partition is granted again, every holder lets go
    /// (two-phase), and once none holds one the controller removes the
    /// directory. Brokers serve it as unknown from this version on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
}

impl TopicAssignment {
    /// Being deleted, and no partition held or still being let go of: the
    /// directory may be renamed aside.
    pub fn vacated(&self) -> bool {
        self.deleting
            && self
                .partitions
                .iter()
                .all(|e| e.leader < 0 && e.releasing.is_none())
    }
}

/// A live broker as advertised in Metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerEndpoint {
    /// Broker id.
    pub id: i32,
    /// Host.
    pub host: String,
    /// Port.
    pub port: i32,
}

/// The assignment file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Epoch of the controller that wrote it.
    pub controller_epoch: i32,
    /// Broker id of that controller.
    pub controller_id: i32,
    /// Rises with every write, across controllers.
    pub version: u64,
    /// Live brokers.
    pub brokers: Vec<BrokerEndpoint>,
    /// Topics by name.
    pub topics: BTreeMap<String, TopicAssignment>,
    /// Consumer-group coordinator shards, by shard index: granted like
    /// partitions (epochs, two-phase moves). Empty in files written before
    /// shards existed.
    #[serde(default)]
    pub coordinators: Vec<PartitionAssignment>,
}

impl Assignment {
    /// Every broker this assignment names — endpoints, leaders, owners of a
    /// release — sorted, without duplicates or the vacant `-1`: the brokers
    /// whose records a controller (or a candidate) must read by exact name,
    /// whatever a listing shows.
    pub fn named_brokers(&self) -> Vec<i32> {
        let mut named: Vec<i32> = self.brokers.iter().map(|b| b.id).collect();
        for e in self
            .topics
            .values()
            .flat_map(|t| t.partitions.iter())
            .chain(self.coordinators.iter())
        {
            named.push(e.leader);
            if let Some((b, _, _)) = e.releasing {
                named.push(b);
            }
        }
        named.retain(|id| *id >= 0);
        named.sort_unstable();
        named.dedup();
        named
    }

    /// Whether `self` is newer than an assignment stamped (epoch, version).
    pub fn newer_than(&self, epoch: i32, version: u64) -> bool {
        (self.controller_epoch, self.version) > (epoch, version)
    }

    /// The entry of coordinator shard `shard`.
    pub fn coordinator(&self, shard: u32) -> Option<&PartitionAssignment> {
        self.coordinators.get(shard as usize)
    }

    /// The entry of (topic, partition).
    pub fn entry(&self, topic: &str, partition: i32) -> Option<&PartitionAssignment> {
        let t = self.topics.get(topic)?;
        usize::try_from(partition)
            .ok()
            .and_then(|p| t.partitions.get(p))
    }
}

/// One version of the assignment history: what changed from the version
/// before it. Topics are carried whole (a topic's entry is replaced), so a
/// version costs what changed, not the whole map: creating N topics one
/// per version writes O(N) bytes in all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignmentDelta {
    /// Epoch of the controller that wrote it.
    pub controller_epoch: i32,
    /// Broker id of that controller.
    pub controller_id: i32,
    /// This version's number (one more than the version it applies to).
    pub version: u64,
    /// The live brokers, when they changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brokers: Option<Vec<BrokerEndpoint>>,
    /// Topics added or changed, whole.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub topics: BTreeMap<String, TopicAssignment>,
    /// Topics that left the assignment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// The coordinator shards, when any changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinators: Option<Vec<PartitionAssignment>>,
}

impl AssignmentDelta {
    /// What turns `prev` into `next` (`next.version` is the delta's).
    pub fn between(prev: &Assignment, next: &Assignment) -> Self {
        let topics = next
            .topics
            .iter()
            .filter(|(n, t)| prev.topics.get(*n) != Some(*t))
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        let removed = prev
            .topics
            .keys()
            .filter(|n| !next.topics.contains_key(*n))
            .cloned()
            .collect();
        Self {
            controller_epoch: next.controller_epoch,
            controller_id: next.controller_id,
            version: next.version,
            brokers: (prev.brokers != next.brokers).then(|| next.brokers.clone()),
            topics,
            removed,
            coordinators: (prev.coordinators != next.coordinators)
                .then(|| next.coordinators.clone()),
        }
    }

    /// Apply to `a` (the version before this one) in place.
    pub fn apply_to(&self, a: &mut Assignment) {
        a.controller_epoch = self.controller_epoch;
        a.controller_id = self.controller_id;
        a.version = self.version;
        if let Some(b) = &self.brokers {
            a.brokers = b.clone();
        }
        for n in &self.removed {
            a.topics.remove(n);
        }
        for (n, t) in &self.topics {
            a.topics.insert(n.clone(), t.clone());
        }
        if let Some(c) = &self.coordinators {
            a.coordinators = c.clone();
        }
    }
}

/// Read a JSON file by exact name ([`Fs::read`]); `Ok(None)` if it does
/// not exist.
pub fn read_json<T: serde::de::DeserializeOwned>(
    fs: &dyn Fs,
    path: &Path,
) -> io::Result<Option<T>> {
    match fs.read(path) {
        Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Write a JSON file with [`write_atomic`].
pub fn write_json<T: Serialize>(fs: &dyn Fs, path: &Path, v: &T) -> io::Result<()> {
    write_atomic(fs, path, &serde_json::to_vec(v).expect("serializes"))
}
