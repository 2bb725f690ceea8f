//! WriteTxnMarkers (key 27, v1): the transaction coordinator asks the leader
//! of each partition of a transaction to write its COMMIT or ABORT marker.
//!
//! Markers are enqueued on the partitions' leaders in request order in the
//! dispatch phase; each partition is answered NONE only once its control
//! batch is fsynced (and with it the last stable offset moved), under a
//! valid lease, through the leader's one acknowledging path. Otherwise:
//! NOT_LEADER_OR_FOLLOWER (not led here), UNKNOWN_TOPIC_OR_PARTITION,
//! INVALID_PRODUCER_EPOCH (the marker's epoch is below the producer's at the
//! partition), KAFKA_STORAGE_ERROR (the write failed), REQUEST_TIMED_OUT
//! (not durable within [`DURABLE_WAIT`]). The coordinator re-sends until
//! every partition answered NONE, so a marker may arrive twice: a marker
//! for a producer with no open transaction is written again and changes
//! nothing a reader sees, as in Kafka.
//!
//! The pseudo-topic `__consumer_offsets`, partition = coordinator shard,
//! means the producer's pending transactional offset commits of that shard:
//! routed to [`crate::api::group::txn_offsets::complete_markers`].
//!
//! Version rules handled here: none (v1 only: v0 is not in the protocol
//! crate, and Kafka 4 removed it as well).

use super::super::error::{ApiError, NONE};
use super::super::{locate, Reply, TopicRef};
use crate::state::Broker;
use futures::future::BoxFuture;
use futures::FutureExt;
use kaas_actors::partition::messages::WriteTxnMarker;
use kaas_protocol::kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kaas_protocol::kafka_protocol::messages::{WriteTxnMarkersRequest, WriteTxnMarkersResponse};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;
use std::time::Duration;

/// The internal topic that names group offsets in a marker request.
pub const GROUP_OFFSETS_TOPIC: &str = "__consumer_offsets";

/// How long one marker may wait for its fsync before the partition is
/// answered REQUEST_TIMED_OUT (the coordinator re-sends).
pub const DURABLE_WAIT: Duration = Duration::from_secs(30);

/// Dispatch every marker now, in request order; answer once each is durable.
pub async fn handle(
    b: &Arc<Broker>,
    _v: i16,
    r: WriteTxnMarkersRequest,
) -> Reply<WriteTxnMarkersResponse> {
    // (producer id, per topic: (name, per partition: its answer to come)).
    type Parts = Vec<(i32, BoxFuture<'static, i16>)>;
    let mut pending: Vec<(
        i64,
        Vec<(kaas_protocol::kafka_protocol::messages::TopicName, Parts)>,
    )> = Vec::new();
    for m in r.markers {
        let pid = m.producer_id.0;
        let mut topics = Vec::new();
        for t in m.topics {
            let mut parts: Parts = Vec::new();
            for p in t.partition_indexes {
                let answer: BoxFuture<'static, i16> = if t.name.0.as_str() == GROUP_OFFSETS_TOPIC {
                    crate::api::group::txn_offsets::complete_markers(
                        b,
                        p,
                        pid,
                        m.producer_epoch,
                        m.transaction_result,
                    )
                } else {
                    let msg = WriteTxnMarker {
                        producer_id: pid,
                        producer_epoch: m.producer_epoch,
                        coordinator_epoch: m.coordinator_epoch,
                        commit: m.transaction_result,
                    };
                    write_one(b, &t.name.0, p, msg).await
                };
                parts.push((p, answer));
            }
            topics.push((t.name, parts));
        }
        pending.push((pid, topics));
    }
    Reply::Later(
        async move {
            let mut resp = WriteTxnMarkersResponse::default();
            for (pid, topics) in pending {
                let mut mr = WritableTxnMarkerResult::default();
                mr.producer_id = pid.into();
                for (name, parts) in topics {
                    let mut tr = WritableTxnMarkerTopicResult::default();
                    tr.name = name;
                    for (p, answer) in parts {
                        let mut pr = WritableTxnMarkerPartitionResult::default();
                        pr.partition_index = p;
                        pr.error_code = answer.await;
                        tr.partitions.push(pr);
                    }
                    mr.topics.push(tr);
                }
                resp.markers.push(mr);
            }
            resp
        }
        .boxed(),
    )
}

/// Enqueue one data partition's marker on its leader (now, so markers keep
/// request order) and return the wait for its fsync.
async fn write_one(
    b: &Arc<Broker>,
    topic: &str,
    partition: i32,
    msg: WriteTxnMarker,
) -> BoxFuture<'static, i16> {
    let done = |code: i16| futures::future::ready(code).boxed();
    let leader = match locate(b, TopicRef::Name(topic), partition, -1) {
        Ok(l) => l,
        Err(e) => return done(e.code()),
    };
    let (pid, commit) = (msg.producer_id, msg.commit);
    let ticket = match leader.handle.addr.send(msg).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            tracing::debug!(topic, partition, producer_id = pid, error = %e, "marker refused");
            return done(ApiError::from(&e).code());
        }
        Err(_) => return done(ApiError::leader_gone().code()),
    };
    let topic = topic.to_owned();
    async move {
        let Some(rx) = ticket.durable else {
            return NONE;
        };
        match tokio::time::timeout(DURABLE_WAIT, rx).await {
            Ok(Ok(Ok(_))) => {
                tracing::debug!(topic = %topic, partition, producer_id = pid, commit, offset = ticket.base_offset, "marker durable");
                NONE
            }
            Ok(Ok(Err(e))) => ApiError::from(&e).code(),
            Ok(Err(_)) => ApiError::leader_gone().code(),
            Err(_) => ResponseError::RequestTimedOut.code(),
        }
    }
    .boxed()
}
