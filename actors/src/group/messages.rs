//! Messages of the [`GroupCoordinator`](super::coordinator::GroupCoordinator).
//!
//! Every answer is a [`CoordReply`]: the request's own result (Kafka's
//! protocol errors, which the state machine decides, travel inside it), or a
//! [`CoordinatorError`] when this coordinator cannot answer at all (still
//! loading, not the owner, failed) and the client must look again.

use super::classic::{
    GroupState, Heartbeat, JoinGroup, JoinResponse, LeaveResponse, Leaving, SyncGroup, SyncResponse,
};
use super::offsets::{GroupMetadata, OffsetValue};
use crate::telemetry::MessageName;
use actix::Message;
use kaas_protocol::kafka_protocol::ResponseError;

/// Why a coordinator cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CoordinatorError {
    /// The shard's files are being read (COORDINATOR_LOAD_IN_PROGRESS).
    #[error("coordinator shard is loading")]
    Loading,
    /// This coordinator does not own the shard (any more): fenced, lease
    /// lapsed, or stopping (NOT_COORDINATOR).
    #[error("not the coordinator of this shard")]
    NotCoordinator,
    /// A write failed and the shard is being reopened, or the answer was
    /// lost with it (COORDINATOR_NOT_AVAILABLE).
    #[error("coordinator unavailable")]
    Unavailable,
}

/// A coordinator's answer.
pub type CoordReply<T> = Result<T, CoordinatorError>;

macro_rules! message {
    ($name:ident => $res:ty, $label:literal) => {
        impl Message for $name {
            type Result = CoordReply<$res>;
        }
        impl MessageName for $name {
            const NAME: &'static str = $label;
        }
    };
}

/// JoinGroup.
#[derive(Debug)]
pub struct JoinGroupRequest(pub JoinGroup);
message!(JoinGroupRequest => JoinResponse, "join_group");

/// SyncGroup.
#[derive(Debug)]
pub struct SyncGroupRequest(pub SyncGroup);
message!(SyncGroupRequest => SyncResponse, "sync_group");

/// Heartbeat.
#[derive(Debug)]
pub struct HeartbeatRequest(pub Heartbeat);
message!(HeartbeatRequest => Result<(), ResponseError>, "heartbeat");

/// LeaveGroup (batched).
#[derive(Debug)]
pub struct LeaveGroupRequest {
    /// The group.
    pub group_id: String,
    /// Who leaves.
    pub members: Vec<Leaving>,
}
message!(LeaveGroupRequest => LeaveResponse, "leave_group");

/// One partition's offset to commit.
#[derive(Debug, Clone)]
pub struct CommitOffset {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Leader epoch the consumer saw (-1 unknown).
    pub leader_epoch: i32,
    /// Client metadata.
    pub metadata: Option<String>,
}

/// OffsetCommit: answered once the commit is durable. The inner result is
/// the request-level validation (one error for every partition).
#[derive(Debug)]
pub struct CommitOffsets {
    /// The group.
    pub group_id: String,
    /// Committing member ("" for a standalone consumer).
    pub member_id: String,
    /// Static member id.
    pub instance_id: Option<String>,
    /// Generation (-1 for a standalone consumer).
    pub generation_id: i32,
    /// Explicit retention (OffsetCommit v2-v4), in ms; `None` for the default.
    pub retention_ms: Option<i64>,
    /// What to commit.
    pub offsets: Vec<CommitOffset>,
}
message!(CommitOffsets => Result<(), ResponseError>, "commit_offsets");

/// A committed offset as fetched: `None` when nothing is committed.
#[derive(Debug, Clone)]
pub struct FetchedOffset {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// What is committed, if anything.
    pub value: Option<OffsetValue>,
    /// Whether a transaction holds a pending offset for it (OffsetFetch
    /// with `require_stable` answers UNSTABLE_OFFSET_COMMIT).
    pub pending: bool,
}

/// OffsetFetch of one group: the durable committed offsets of the named
/// partitions, or of every partition when `topics` is `None`.
#[derive(Debug)]
pub struct FetchOffsets {
    /// The group.
    pub group_id: String,
    /// (topic, partitions) asked for; `None` for all.
    pub topics: Option<Vec<(String, Vec<i32>)>>,
}
message!(FetchOffsets => Vec<FetchedOffset>, "fetch_offsets");

/// TxnOffsetCommit: the producer's offsets, pending until its
/// transaction's marker ([`CompleteTxnOffsets`]); answered once durable.
/// The inner result is the request-level validation.
#[derive(Debug)]
pub struct TxnCommitOffsets {
    /// The group.
    pub group_id: String,
    /// The transactional producer.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i16,
    /// Committing member ("" before v3 or for a standalone consumer).
    pub member_id: String,
    /// Static member id.
    pub instance_id: Option<String>,
    /// Generation (-1 when not given).
    pub generation_id: i32,
    /// What to commit.
    pub offsets: Vec<CommitOffset>,
}
message!(TxnCommitOffsets => Result<(), ResponseError>, "txn_commit_offsets");

/// A transaction marker for this shard's `__consumer_offsets` entry:
/// commit or drop the producer's pending offsets; answered once durable.
/// Idempotent: a producer with nothing pending is answered at once.
#[derive(Debug)]
pub struct CompleteTxnOffsets {
    /// The transactional producer.
    pub producer_id: i64,
    /// The marker's producer epoch.
    pub producer_epoch: i16,
    /// Commit (true) or abort.
    pub commit: bool,
}
message!(CompleteTxnOffsets => (), "complete_txn_offsets");

/// One group in a ListGroups answer.
#[derive(Debug, Clone)]
pub struct GroupListing {
    /// The group.
    pub group_id: String,
    /// Protocol type ("" for a group that only stores offsets).
    pub protocol_type: String,
    /// State.
    pub state: GroupState,
}

/// ListGroups of this shard.
#[derive(Debug)]
pub struct ListGroupsRequest;
message!(ListGroupsRequest => Vec<GroupListing>, "list_groups");

/// DescribeGroups of groups in this shard: each group's state and its
/// membership (`None` state: the group does not exist, Kafka's `Dead`).
#[derive(Debug)]
pub struct DescribeGroupsRequest(pub Vec<String>);
message!(DescribeGroupsRequest => Vec<(String, GroupState, Option<GroupMetadata>)>, "describe_groups");

/// DeleteGroups of one group: answered once its tombstones are durable.
/// The inner result: GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, or success.
#[derive(Debug)]
pub struct DeleteGroupRequest(pub String);
message!(DeleteGroupRequest => Result<(), ResponseError>, "delete_group");

/// OffsetDelete: remove a group's committed offsets of some partitions,
/// answered once the tombstones are durable. The inner result: a
/// group-level error, or one optional error per partition asked for.
#[derive(Debug)]
pub struct DeleteOffsetsRequest {
    /// The group.
    pub group_id: String,
    /// (topic, partition) to delete.
    pub partitions: Vec<(String, i32)>,
}
message!(DeleteOffsetsRequest => Result<Vec<(String, i32, Option<ResponseError>)>, ResponseError>, "delete_offsets");

/// Stop for good: resolves once the shard's files are synced and closed.
#[derive(Debug)]
pub struct StopCoordinator;
impl Message for StopCoordinator {
    type Result = ();
}
impl MessageName for StopCoordinator {
    const NAME: &'static str = "stop_coordinator";
}

// ------------------------------------------------ KIP-848 consumer protocol

/// ConsumerGroupHeartbeat: answered once the records it caused are durable.
#[derive(Debug)]
pub struct ConsumerHeartbeatRequest(pub super::consumer::ConsumerHeartbeat);
message!(ConsumerHeartbeatRequest => Result<super::consumer::HeartbeatAnswer, super::consumer::HeartbeatError>, "consumer_heartbeat");

/// What ConsumerGroupDescribe finds under a group id.
#[derive(Debug, Clone)]
pub enum ConsumerDescribed {
    /// A consumer-protocol group.
    Consumer(super::consumer::DescribedGroup),
    /// A classic group (Kafka: GROUP_ID_NOT_FOUND, "not a consumer group").
    Classic,
    /// No such group.
    Unknown,
}

/// ConsumerGroupDescribe of groups in this shard.
#[derive(Debug)]
pub struct DescribeConsumerGroups(pub Vec<String>);
message!(DescribeConsumerGroups => Vec<(String, ConsumerDescribed)>, "describe_consumer_groups");

/// The consumer-protocol groups of this shard: (group id, Kafka state).
#[derive(Debug)]
pub struct ListConsumerGroups;
message!(ListConsumerGroups => Vec<(String, &'static str)>, "list_consumer_groups");

/// OffsetFetch v9+ member check of a consumer-protocol group
/// (UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH); classic groups pass.
#[derive(Debug)]
pub struct ValidateConsumerFetch {
    /// The group.
    pub group_id: String,
    /// The member (`None`: an admin fetch).
    pub member_id: Option<String>,
    /// Its member epoch.
    pub member_epoch: i32,
}
message!(ValidateConsumerFetch => Result<(), ResponseError>, "validate_consumer_fetch");
