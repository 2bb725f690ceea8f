//! Messages of the [`TxnCoordinator`](super::coordinator::TxnCoordinator).
//!
//! Answers are [`CoordReply`]s as the group coordinator's: the outer error
//! says the coordinator cannot answer (loading, not the owner, failed), the
//! inner one is the request's Kafka error, decided by the state machine.

use super::state::TxnMeta;
pub use crate::group::messages::{CoordReply, CoordinatorError};
use crate::telemetry::MessageName;
use actix::Message;
use kaas_protocol::kafka_protocol::ResponseError;

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

/// InitProducerId with a transactional id.
#[derive(Debug)]
pub struct InitTxnProducer {
    /// The transactional id.
    pub transactional_id: String,
    /// `transaction.timeout.ms`.
    pub timeout_ms: i32,
    /// KIP-360: the (producer id, epoch) the client names; (-1, -1): none.
    pub given: (i64, i16),
    /// A freshly allocated producer id, when the last answer asked for one.
    pub fresh: Option<i64>,
}

/// What an InitTxnProducer got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitAnswer {
    /// (producer id, epoch), durable.
    Ready(i64, i16),
    /// Allocate a producer id and ask again with it.
    NeedProducerId,
}
message!(InitTxnProducer => Result<InitAnswer, ResponseError>, "init_txn_producer");

/// AddPartitionsToTxn (and AddOffsetsToTxn, as the group's shard entry).
#[derive(Debug)]
pub struct AddTxnPartitions {
    /// The transactional id.
    pub transactional_id: String,
    /// Producer id.
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// (topic, partition) to add.
    pub partitions: Vec<(String, i32)>,
}
message!(AddTxnPartitions => Result<(), ResponseError>, "add_txn_partitions");

/// AddPartitionsToTxn v4 `verify_only` (KIP-890 part 1): whether each
/// partition is in the producer's ongoing transaction. Answered once the
/// state it read is durable; writes nothing.
#[derive(Debug)]
pub struct VerifyTxnPartitions {
    /// The transactional id.
    pub transactional_id: String,
    /// Producer id.
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// (topic, partition) to check.
    pub partitions: Vec<(String, i32)>,
}
message!(VerifyTxnPartitions => Result<Vec<bool>, ResponseError>, "verify_txn_partitions");

/// EndTxn: answered once the Prepare* decision is durable.
#[derive(Debug)]
pub struct EndTxn {
    /// The transactional id.
    pub transactional_id: String,
    /// Producer id.
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// Commit (true) or abort.
    pub commit: bool,
}
message!(EndTxn => Result<(), ResponseError>, "end_txn");

/// DescribeTransactions of ids in this shard (`None`: unknown id).
#[derive(Debug)]
pub struct DescribeTxns(pub Vec<String>);
message!(DescribeTxns => Vec<(String, Option<TxnMeta>)>, "describe_txns");

/// ListTransactions of this shard.
#[derive(Debug)]
pub struct ListTxns;
message!(ListTxns => Vec<TxnMeta>, "list_txns");

/// Stop for good: resolves once the shard's files are synced and closed.
#[derive(Debug)]
pub struct StopTxnCoordinator;
impl Message for StopTxnCoordinator {
    type Result = ();
}
impl MessageName for StopTxnCoordinator {
    const NAME: &'static str = "stop_txn_coordinator";
}
