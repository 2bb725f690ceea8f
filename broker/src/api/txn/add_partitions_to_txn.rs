//! AddPartitionsToTxn (key 24), v0-v4: the client adds partitions to its
//! open transaction before producing to them. Every partition must exist;
//! if one does not, it gets UNKNOWN_TOPIC_OR_PARTITION and the others
//! OPERATION_NOT_ATTEMPTED (nothing is added), as Kafka answers. The answer
//! waits until the new transaction state is durable. PRODUCER_FENCED from
//! v2 on (INVALID_PRODUCER_EPOCH before).
//!
//! v4 is the broker-to-broker batched form of KIP-890 part 1: several
//! transactions per request, each either added as above or, with
//! `verify_only`, checked without a write (a partition leader asking
//! whether a partition is in the transaction before it writes the
//! transaction's first batch there: INVALID_TXN_STATE if not; see
//! `super::verify`). v5 (KIP-890 part 2, TRANSACTION_ABORTABLE) is not
//! advertised.

use super::super::Reply;
use super::{ask, code_of};
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::txn::messages::{AddTxnPartitions, VerifyTxnPartitions};
use kaas_protocol::kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kaas_protocol::kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Forward to the coordinator; the answer waits for the fsync.
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: AddPartitionsToTxnRequest,
) -> Reply<AddPartitionsToTxnResponse> {
    let b = b.clone();
    Reply::Later(async move { add(&b, v, r).await }.boxed())
}

async fn add(b: &Broker, v: i16, r: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse {
    if v >= 4 {
        return batched(b, v, r).await;
    }
    let parts: Vec<(String, i32)> = r
        .v3_and_below_topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.0.to_string(), *p)))
        .collect();
    let unknown = |t: &str, p: i32| b.topic(t).is_none() || b.entry(t, p).is_none();
    let any_unknown = parts.iter().any(|(t, p)| unknown(t, *p));
    let code = if any_unknown {
        None
    } else {
        let id = r.v3_and_below_transactional_id.0.to_string();
        let msg = AddTxnPartitions {
            transactional_id: id.clone(),
            producer_id: r.v3_and_below_producer_id.0,
            producer_epoch: r.v3_and_below_producer_epoch,
            partitions: parts,
        };
        Some(code_of(ask(b, &id, msg).await, v, 2))
    };
    let mut resp = AddPartitionsToTxnResponse::default();
    resp.results_by_topic_v3_and_below =
        topic_results(&r.v3_and_below_topics, |name, p| match code {
            Some(c) => c,
            None if unknown(name, p) => ResponseError::UnknownTopicOrPartition.code(),
            None => ResponseError::OperationNotAttempted.code(),
        });
    resp
}

/// v4: each transaction of the batch, verified or added, answered per
/// partition.
async fn batched(b: &Broker, v: i16, r: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse {
    let results = futures::future::join_all(r.transactions.into_iter().map(|x| async move {
        let id = x.transactional_id.0.to_string();
        let parts: Vec<(String, i32)> = x
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (t.name.0.to_string(), *p)))
            .collect();
        let codes: Vec<i16> = if x.verify_only {
            let msg = VerifyTxnPartitions {
                transactional_id: id.clone(),
                producer_id: x.producer_id.0,
                producer_epoch: x.producer_epoch,
                partitions: parts.clone(),
            };
            match ask(b, &id, msg).await {
                Ok(Ok(v)) => v
                    .into_iter()
                    .map(|ok| {
                        if ok {
                            0
                        } else {
                            ResponseError::InvalidTxnState.code()
                        }
                    })
                    .collect(),
                Ok(Err(e)) => vec![e.code(); parts.len()],
                Err(e) => vec![e.code(); parts.len()],
            }
        } else {
            let unknown = |t: &str, p: i32| b.topic(t).is_none() || b.entry(t, p).is_none();
            if parts.iter().any(|(t, p)| unknown(t, *p)) {
                parts
                    .iter()
                    .map(|(t, p)| {
                        if unknown(t, *p) {
                            ResponseError::UnknownTopicOrPartition.code()
                        } else {
                            ResponseError::OperationNotAttempted.code()
                        }
                    })
                    .collect()
            } else {
                let msg = AddTxnPartitions {
                    transactional_id: id.clone(),
                    producer_id: x.producer_id.0,
                    producer_epoch: x.producer_epoch,
                    partitions: parts.clone(),
                };
                vec![code_of(ask(b, &id, msg).await, v, 2); parts.len()]
            }
        };
        let mut out = AddPartitionsToTxnResult::default();
        out.transactional_id = x.transactional_id.clone();
        let mut codes = codes.into_iter();
        out.topic_results = topic_results(&x.topics, |_, _| codes.next().unwrap_or_default());
        out
    }))
    .await;
    let mut resp = AddPartitionsToTxnResponse::default();
    resp.results_by_transaction = results;
    resp
}

/// One result per requested topic and partition, in request order, each
/// with `code(topic, partition)` (both the v3 and the batched v4 answers).
fn topic_results(
    topics: &[kaas_protocol::kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic],
    mut code: impl FnMut(&str, i32) -> i16,
) -> Vec<AddPartitionsToTxnTopicResult> {
    topics
        .iter()
        .map(|t| {
            let mut rt = AddPartitionsToTxnTopicResult::default();
            rt.name = t.name.clone();
            rt.results_by_partition = t
                .partitions
                .iter()
                .map(|p| {
                    let mut rp = AddPartitionsToTxnPartitionResult::default();
                    rp.partition_index = *p;
                    rp.partition_error_code = code(&t.name.0, *p);
                    rp
                })
                .collect();
            rt
        })
        .collect()
}
