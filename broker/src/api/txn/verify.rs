//! KIP-890 part 1, the partition leader's side: before a transactional
//! batch opens a transaction at a partition, ask the transaction's
//! coordinator whether the partition was added to it (Kafka's
//! `AddPartitionsToTxnManager`).
//!
//! The coordinator is the `TxnCoordinator` of the transactional id's shard:
//! asked directly when this broker owns the shard, otherwise with an
//! AddPartitionsToTxn v4 `verify_only` request to the shard's owner over
//! the same peer client as WriteTxnMarkers (`crate::peer`). The answer is
//! mapped to the code the producer gets, as Kafka's `ReplicaManager` maps
//! it: INVALID_TXN_STATE when the partition is not in the transaction,
//! INVALID_PRODUCER_EPOCH for a fenced epoch, NOT_ENOUGH_REPLICAS
//! (retriable, no metadata refresh) when the coordinator could not answer.
//!
//! Only a transaction's first batch per partition is verified: the leader
//! admits the later ones from its producer state (see
//! `kaas_actors::partition::producers::TxnVerifications`).

use crate::state::Broker;
use kaas_actors::txn::messages::VerifyTxnPartitions;
use kaas_protocol::kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
};
use kaas_protocol::kafka_protocol::messages::{
    AddPartitionsToTxnRequest, ProducerId, TopicName, TransactionalId,
};
use kaas_protocol::kafka_protocol::protocol::StrBytes;
use kaas_protocol::kafka_protocol::ResponseError;

/// The AddPartitionsToTxn version of the broker-to-broker `verify_only`
/// form.
pub const VERIFY_VERSION: i16 = 4;

/// Whether `(topic, partition)` is in the ongoing transaction of
/// (`transactional_id`, `producer_id`, `producer_epoch`): `Ok(())`, or the
/// error the producer gets for that partition.
pub async fn verify(
    b: &Broker,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    topic: &str,
    partition: i32,
) -> Result<(), ResponseError> {
    let msg = || VerifyTxnPartitions {
        transactional_id: transactional_id.to_owned(),
        producer_id,
        producer_epoch,
        partitions: vec![(topic.to_owned(), partition)],
    };
    let code = match b.txn_coordinator(transactional_id) {
        Ok(_) => match super::ask(b, transactional_id, msg()).await {
            Ok(Ok(v)) if v.first() == Some(&true) => 0,
            Ok(Ok(_)) => ResponseError::InvalidTxnState.code(),
            Ok(Err(e)) => e.code(),
            Err(e) => e.code(),
        },
        Err(_) => {
            remote(
                b,
                transactional_id,
                producer_id,
                producer_epoch,
                topic,
                partition,
            )
            .await
        }
    };
    let out = for_producer(code);
    if out != 0 {
        tracing::debug!(
            transactional_id,
            producer_id,
            producer_epoch,
            topic,
            partition,
            coordinator_code = code,
            code = out,
            "transactional produce not verified"
        );
    }
    match ResponseError::try_from_code(out) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// Ask the shard's owner (another broker): the partition's error code.
async fn remote(
    b: &Broker,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    topic: &str,
    partition: i32,
) -> i16 {
    let Some(shards) = b.shard_count() else {
        return ResponseError::CoordinatorNotAvailable.code();
    };
    let shard = shards.shard_of(transactional_id);
    let a = b.assignment();
    let owner = a.coordinator(shard.0).map(|e| e.leader).unwrap_or(-1);
    let Some(peer) = a.brokers.iter().find(|x| x.id == owner && owner >= 0) else {
        return ResponseError::CoordinatorNotAvailable.code();
    };
    let req = request(
        transactional_id,
        producer_id,
        producer_epoch,
        topic,
        partition,
    );
    match b
        .peers
        .send(&peer.host, peer.port, VERIFY_VERSION, &req)
        .await
    {
        Ok(resp) if resp.error_code != 0 => resp.error_code,
        Ok(resp) => resp
            .results_by_transaction
            .iter()
            .filter(|t| t.transactional_id.0.as_str() == transactional_id)
            .flat_map(|t| t.topic_results.iter())
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| t.results_by_partition.iter())
            .find(|p| p.partition_index == partition)
            .map_or(ResponseError::InvalidTxnState.code(), |p| {
                p.partition_error_code
            }),
        Err(e) => {
            tracing::debug!(host = %peer.host, port = peer.port, error = %e, "transaction verification request failed");
            ResponseError::NetworkException.code()
        }
    }
}

/// The AddPartitionsToTxn v4 `verify_only` request for one partition.
pub fn request(
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    topic: &str,
    partition: i32,
) -> AddPartitionsToTxnRequest {
    let mut t = AddPartitionsToTxnTopic::default();
    t.name = TopicName(StrBytes::from_string(topic.to_owned()));
    t.partitions = vec![partition];
    let mut x = AddPartitionsToTxnTransaction::default();
    x.transactional_id = TransactionalId(StrBytes::from_string(transactional_id.to_owned()));
    x.producer_id = ProducerId(producer_id);
    x.producer_epoch = producer_epoch;
    x.verify_only = true;
    x.topics = vec![t];
    let mut r = AddPartitionsToTxnRequest::default();
    r.transactions = vec![x];
    r
}

/// The produce error for a coordinator's verification answer, as Kafka's
/// `AddPartitionsToTxnManager` and `ReplicaManager` translate it: a fenced
/// epoch is INVALID_PRODUCER_EPOCH (what producers expect here); "the
/// coordinator could not tell" (loading, moved, unreachable, deciding) is
/// NOT_ENOUGH_REPLICAS, which every producer retries without a metadata
/// refresh; anything else (INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING)
/// is passed on.
pub fn for_producer(code: i16) -> i16 {
    let e = match ResponseError::try_from_code(code) {
        None => return 0,
        Some(e) => e,
    };
    match e {
        ResponseError::ProducerFenced => ResponseError::InvalidProducerEpoch.code(),
        ResponseError::ClusterAuthorizationFailed => ResponseError::InvalidTxnState.code(),
        ResponseError::NetworkException
        | ResponseError::CoordinatorLoadInProgress
        | ResponseError::CoordinatorNotAvailable
        | ResponseError::NotCoordinator
        | ResponseError::ConcurrentTransactions
        | ResponseError::RequestTimedOut => ResponseError::NotEnoughReplicas.code(),
        _ => code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a coordinator's "cannot tell" surfacing to a producer as
    /// a fatal error instead of a retriable one, or a fenced epoch as
    /// PRODUCER_FENCED (which producers do not expect from Produce).
    #[test]
    fn coordinator_answers_map_to_what_producers_expect() {
        assert_eq!(for_producer(0), 0);
        assert_eq!(for_producer(48), 48, "INVALID_TXN_STATE passes");
        assert_eq!(for_producer(49), 49, "INVALID_PRODUCER_ID_MAPPING passes");
        assert_eq!(
            for_producer(90),
            47,
            "PRODUCER_FENCED -> INVALID_PRODUCER_EPOCH"
        );
        for c in [13, 14, 15, 16, 51] {
            assert_eq!(for_producer(c), 19, "{c} -> NOT_ENOUGH_REPLICAS");
        }
    }

    #[test]
    fn the_request_is_the_v4_verify_only_form() {
        let r = request("t", 7, 2, "a", 3);
        assert!(r.v3_and_below_topics.is_empty());
        let x = &r.transactions[0];
        assert!(x.verify_only);
        assert_eq!((x.producer_id.0, x.producer_epoch), (7, 2));
        assert_eq!(x.topics[0].partitions, vec![3]);
    }
}
