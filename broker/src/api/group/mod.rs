//! Consumer-group APIs (classic protocol), one module per API. Each handler
//! finds the group's coordinator shard (`Broker::coordinator`, by Kafka's
//! hash of the group id), sends it one message, and maps the answer; the
//! coordinator actor (`kaas_actors::group::coordinator`) does the rest.
//! Answers that wait for a rebalance or an fsync resolve in the second
//! phase, so a pipelined connection keeps its order.
//!
//! The KIP-848 consumer protocol: ConsumerGroupHeartbeat and
//! ConsumerGroupDescribe (`consumer_group_*`), served by the same
//! coordinator (`kaas_actors::group::consumer`).

pub mod consumer_group_describe;
pub mod consumer_group_heartbeat;
pub mod delete_groups;
pub mod describe_groups;
pub mod find_coordinator;
pub mod heartbeat;
pub mod join_group;
pub mod leave_group;
pub mod list_groups;
pub mod offset_commit;
pub mod offset_delete;
pub mod offset_fetch;
pub mod sync_group;
pub mod txn_offsets;

use super::error::ApiError;
use crate::state::Broker;
use kaas_actors::group::coordinator::GroupCoordinator;
use kaas_actors::group::messages::CoordReply;
use kaas_actors::telemetry::{MessageName, Traced};

/// Send `msg` to the coordinator of `group_id` and await its answer; any
/// reason it cannot answer is a Kafka error code.
pub(crate) async fn ask<M, T>(b: &Broker, group_id: &str, msg: M) -> Result<T, ApiError>
where
    M: actix::Message<Result = CoordReply<T>> + MessageName + Send + 'static,
    T: Send + 'static,
    GroupCoordinator: actix::Handler<Traced<M>>,
    <GroupCoordinator as actix::Actor>::Context:
        actix::dev::ToEnvelope<GroupCoordinator, Traced<M>>,
{
    ask_now(b, group_id, msg).await
}

/// Like [`ask`], but the message enters the coordinator's mailbox now, in
/// the connection's dispatch phase, and only the answer is awaited later.
/// Why: the connection resolves its answers one at a time in request order,
/// so a lazy `ask` inside the answer future let one connection have a
/// single commit at the coordinator at once — every pipelined commit paid
/// its own fsync. Sent eagerly, a connection's pipelined commits reach the
/// shard together (still in request order) and share one fsync.
pub(crate) fn ask_now<M, T>(
    b: &Broker,
    group_id: &str,
    msg: M,
) -> impl std::future::Future<Output = Result<T, ApiError>> + Send + 'static
where
    M: actix::Message<Result = CoordReply<T>> + MessageName + Send + 'static,
    T: Send + 'static,
    GroupCoordinator: actix::Handler<Traced<M>>,
    <GroupCoordinator as actix::Actor>::Context:
        actix::dev::ToEnvelope<GroupCoordinator, Traced<M>>,
{
    let sent = b.coordinator(group_id).map(|h| h.addr.send(msg));
    async move {
        match sent {
            Err(e) => Err(ApiError::from(e)),
            Ok(req) => match req.await {
                Ok(r) => r.map_err(ApiError::from),
                // Stopped between lookup and handling: the shard moved.
                Err(_) => Err(ApiError::coordinator_gone()),
            },
        }
    }
}

/// Kafka's check (`KafkaApis`) before an OffsetCommit or a TxnOffsetCommit
/// reaches the coordinator: a partition of a topic this broker's metadata
/// does not know (or is deleting), or beyond the topic's partition count,
/// is answered UNKNOWN_TOPIC_OR_PARTITION and not committed. Which of
/// `parts` are unknown now, from the view alone (no I/O, so the
/// dispatch-phase path stays synchronous); `None` when all are known.
pub(crate) fn unknown_now(b: &Broker, parts: &[(String, i32)]) -> Option<Vec<bool>> {
    let topics = b.topics.read().unwrap();
    let unknown: Vec<bool> = parts
        .iter()
        .map(|(t, p)| !topics.get(t).is_some_and(|s| (0..s.partitions).contains(p)))
        .collect();
    unknown.contains(&true).then_some(unknown)
}

/// [`unknown_now`], settled: a topic the view does not list yet but whose
/// directory exists (created through another broker a moment ago) is
/// waited for, bounded, as Metadata does, rather than refused.
pub(crate) async fn unknown_partitions(b: &Broker, parts: &[(String, i32)]) -> Vec<bool> {
    let Some(unknown) = unknown_now(b, parts) else {
        return vec![false; parts.len()];
    };
    let mut waited = std::collections::BTreeSet::new();
    for ((t, _), u) in parts.iter().zip(&unknown) {
        if *u && b.topic(t).is_none() && waited.insert(t.as_str()) {
            super::metadata::known_soon(b, t).await;
        }
    }
    if waited.is_empty() {
        return unknown;
    }
    unknown_now(b, parts).unwrap_or_else(|| vec![false; parts.len()])
}

/// An optional protocol error as a code.
pub(crate) fn code(e: Option<kaas_protocol::kafka_protocol::ResponseError>) -> i16 {
    e.map_or(super::error::NONE, |e| ApiError::from(e).code())
}
