//! Messages of the [`super::leader::PartitionLeader`] actor.

use crate::telemetry::MessageName;
use actix::Message;
use bytes::Bytes;
use kaas_protocol::batch::BatchInfo;
use tokio::sync::oneshot;

/// Why a partition operation failed. The broker maps each to a Kafka code.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PartitionError {
    /// The volume failed (KAFKA_STORAGE_ERROR); the leader is recovering.
    #[error("storage error: {0}")]
    Storage(String),
    /// Another epoch owns the partition (NOT_LEADER_OR_FOLLOWER).
    #[error("not leader: {0}")]
    NotLeader(String),
    /// The append would overflow offsets or a segment (RECORD_LIST_TOO_LARGE).
    #[error("append too large")]
    TooLarge,
    /// An idempotent batch does not follow its producer's last sequence
    /// (OUT_OF_ORDER_SEQUENCE_NUMBER); nothing was written.
    #[error("{0}")]
    OutOfOrderSequence(String),
    /// An idempotent batch carries an epoch older than its producer's
    /// (INVALID_PRODUCER_EPOCH); nothing was written.
    #[error("{0}")]
    InvalidProducerEpoch(String),
    /// A non-transactional batch from a producer whose transaction is open
    /// here (INVALID_TXN_STATE); nothing was written.
    #[error("{0}")]
    InvalidTxnState(String),
    /// A transaction marker from a coordinator epoch older than the one
    /// last accepted for its producer (TRANSACTION_COORDINATOR_FENCED);
    /// nothing was written.
    #[error("{0}")]
    CoordinatorFenced(String),
    /// A transactional batch would open a transaction here: the caller
    /// asks the transaction coordinator whether the partition is in the
    /// producer's transaction (KIP-890 part 1) and appends again with
    /// `token` in [`AppendBatches::verified`]. Nothing was written.
    #[error("producer {producer_id} epoch {producer_epoch}: transaction to be verified")]
    TxnUnverified {
        /// The producer opening a transaction.
        producer_id: i64,
        /// The epoch its batch carries.
        producer_epoch: i16,
        /// The verification's token.
        token: u64,
    },
}

/// Append validated batches. Replies once the bytes are written (not yet
/// durable); `durable` resolves after the fsync that covers them.
#[derive(Message)]
#[rtype(result = "Result<AppendTicket, PartitionError>")]
pub struct AppendBatches {
    /// The produce request's records for this partition.
    pub records: Bytes,
    /// Batches within `records`, already CRC-checked.
    pub infos: Vec<BatchInfo>,
    /// Whether the caller wants a durability notification (acks != 0).
    pub wait_durable: bool,
    /// The token of a transaction verification the caller completed for
    /// these batches (after [`PartitionError::TxnUnverified`]); `None` on
    /// a first attempt.
    pub verified: Option<u64>,
}

impl MessageName for AppendBatches {
    const NAME: &'static str = "append_batches";
}

/// Reply to [`AppendBatches`].
#[derive(Debug)]
pub struct AppendTicket {
    /// Offset assigned to the first record.
    pub base_offset: i64,
    /// Log start offset at the time of the append.
    pub log_start_offset: i64,
    /// Resolves with the new high watermark once durable.
    pub durable: Option<oneshot::Receiver<Result<i64, PartitionError>>>,
}

/// Where an append handed over to the partition's writer loop landed
/// (see [`super::leader::PartitionHandle::hand_over`]): told with its
/// durability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// Offset assigned to the first record.
    pub base_offset: i64,
    /// Log start offset at the time of the append.
    pub log_start_offset: i64,
}

/// Append a COMMIT (`commit`) or ABORT transaction marker (WriteTxnMarkers)
/// through the same path as an append: replies once written, `durable`
/// resolves after the fsync that covers it, when the last stable offset
/// has moved past the transaction it closed.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<AppendTicket, PartitionError>")]
pub struct WriteTxnMarker {
    /// The producer whose transaction ends.
    pub producer_id: i64,
    /// Its epoch (INVALID_PRODUCER_EPOCH if older than the one known here).
    pub producer_epoch: i16,
    /// The coordinator's epoch, written into the marker.
    pub coordinator_epoch: i32,
    /// COMMIT (true) or ABORT.
    pub commit: bool,
}

impl MessageName for WriteTxnMarker {
    const NAME: &'static str = "write_txn_marker";
}

/// The producers known at this partition (DescribeProducers).
#[derive(Message)]
#[rtype(result = "Result<Vec<ProducerInfo>, PartitionError>")]
pub struct GetProducers;

impl MessageName for GetProducers {
    const NAME: &'static str = "get_producers";
}

/// One producer's state at a partition, as DescribeProducers reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerInfo {
    /// Producer id.
    pub producer_id: i64,
    /// Current epoch.
    pub producer_epoch: i16,
    /// Sequence of its last record written here (-1: none).
    pub last_sequence: i32,
    /// Max timestamp of its last batch (-1: none).
    pub last_timestamp: i64,
    /// Coordinator epoch of its last marker (-1: none).
    pub coordinator_epoch: i32,
    /// First offset of its open transaction (-1: none).
    pub current_txn_start_offset: i64,
}

/// Run retention now (tests and the periodic timer).
#[derive(Message)]
#[rtype(result = "Result<usize, PartitionError>")]
pub struct EnforceRetention;

impl MessageName for EnforceRetention {
    const NAME: &'static str = "enforce_retention";
}

/// DeleteRecords: move the log start offset up to `offset` (the caller
/// checked it is not above the high watermark); replies with the new log
/// start offset once the manifest recording it is written.
#[derive(Message)]
#[rtype(result = "Result<i64, PartitionError>")]
pub struct DeleteRecordsBefore {
    /// The new log start offset.
    pub offset: i64,
}

impl MessageName for DeleteRecordsBefore {
    const NAME: &'static str = "delete_records_before";
}

/// A topic's configs changed (AlterConfigs, seen in a newer assignment):
/// the leader uses `cfg` from now on (and across its restarts) and runs
/// retention at once, so a lowered retention takes effect without waiting
/// for the periodic pass.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetLogConfig {
    /// The new storage settings.
    pub cfg: crate::partition::log::LogConfig,
}

impl MessageName for SetLogConfig {
    const NAME: &'static str = "set_log_config";
}

/// Flush, checkpoint and stop for good (topic deletion, shutdown).
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopLeader;

impl MessageName for StopLeader {
    const NAME: &'static str = "stop_leader";
}
