//! Transaction APIs, coordinator side (KIP-98, KIP-447): AddPartitionsToTxn,
//! AddOffsetsToTxn, EndTxn, TxnOffsetCommit, DescribeTransactions,
//! ListTransactions (InitProducerId with a transactional id is in
//! `init_producer_id`). Each handler finds the transactional id's
//! coordinator shard (`Broker::txn_coordinator`, the groups' hash and
//! shards), sends the `TxnCoordinator` one message and maps the answer; the
//! answers that change state resolve once the change is durable.
//!
//! The partition side (WriteTxnMarkers, control batches, read_committed)
//! has its own modules here, and `verify` the partition leader's question
//! to the coordinator before a transaction's first batch (KIP-890 part 1).

pub mod add_offsets_to_txn;
pub mod add_partitions_to_txn;
pub mod describe_producers;
pub mod describe_transactions;
pub mod end_txn;
pub mod list_transactions;
pub mod txn_offset_commit;
pub mod verify;
pub mod write_txn_markers;

use super::error::ApiError;
use crate::state::Broker;
use kaas_actors::telemetry::{MessageName, Traced};
use kaas_actors::txn::coordinator::TxnCoordinator;
use kaas_actors::txn::messages::CoordReply;
use kaas_protocol::kafka_protocol::ResponseError;

/// Send `msg` to the coordinator of `transactional_id` and await its
/// answer; any reason it cannot answer is a Kafka error code.
pub(crate) async fn ask<M, T>(b: &Broker, transactional_id: &str, msg: M) -> Result<T, ApiError>
where
    M: actix::Message<Result = CoordReply<T>> + MessageName + Send + 'static,
    T: Send + 'static,
    TxnCoordinator: actix::Handler<Traced<M>>,
    <TxnCoordinator as actix::Actor>::Context: actix::dev::ToEnvelope<TxnCoordinator, Traced<M>>,
{
    let h = b
        .txn_coordinator(transactional_id)
        .map_err(ApiError::from)?;
    match h.addr.send(msg).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(_) => Err(ApiError::coordinator_gone()),
    }
}

/// KIP-588: PRODUCER_FENCED is only understood from `since` on; older
/// request versions get INVALID_PRODUCER_EPOCH, as Kafka answers them.
pub(crate) fn fenced_for(e: ResponseError, v: i16, since: i16) -> ResponseError {
    if e == ResponseError::ProducerFenced && v < since {
        ResponseError::InvalidProducerEpoch
    } else {
        e
    }
}

/// The code of a state-machine answer at request version `v`.
pub(crate) fn code_of(r: Result<Result<(), ResponseError>, ApiError>, v: i16, since: i16) -> i16 {
    match r {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => fenced_for(e, v, since).code(),
        Err(e) => e.code(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producer_fenced_is_mapped_for_old_versions() {
        assert_eq!(
            fenced_for(ResponseError::ProducerFenced, 1, 2),
            ResponseError::InvalidProducerEpoch
        );
        assert_eq!(
            fenced_for(ResponseError::ProducerFenced, 2, 2),
            ResponseError::ProducerFenced
        );
        assert_eq!(
            fenced_for(ResponseError::ConcurrentTransactions, 0, 2),
            ResponseError::ConcurrentTransactions
        );
        assert_eq!(code_of(Ok(Ok(())), 0, 2), 0);
        assert_eq!(code_of(Ok(Err(ResponseError::ProducerFenced)), 3, 2), 90);
        assert_eq!(code_of(Ok(Err(ResponseError::ProducerFenced)), 1, 2), 47);
    }
}
