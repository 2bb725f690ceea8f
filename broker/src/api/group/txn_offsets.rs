//! The group side of a transaction marker: a WriteTxnMarkers entry for the
//! pseudo-topic `__consumer_offsets`, partition = a coordinator shard,
//! commits or drops the producer's pending TxnOffsetCommit offsets in that
//! shard. The WriteTxnMarkers handler routes such entries here; the
//! transaction coordinator calls it directly when it owns the shard too.

use super::super::error::{ApiError, NONE};
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::messages::CompleteTxnOffsets;
use kaas_actors::group::shard::ShardId;
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Commit (or drop) the producer's pending transactional offsets in one
/// coordinator shard; resolves to the Kafka error code for that (topic,
/// partition) entry once the result is durable (NOT_COORDINATOR when this
/// broker does not own the shard).
pub fn complete_markers(
    b: &Arc<Broker>,
    shard: i32,
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
) -> futures::future::BoxFuture<'static, i16> {
    let b = b.clone();
    async move {
        let Ok(shard) = u32::try_from(shard) else {
            return ResponseError::UnknownTopicOrPartition.code();
        };
        if b.shard_count().is_some_and(|c| shard >= c.get()) {
            return ResponseError::UnknownTopicOrPartition.code();
        }
        let h = match b.group_shard(ShardId(shard)) {
            Ok(h) => h,
            Err(e) => return ApiError::from(e).code(),
        };
        let msg = CompleteTxnOffsets {
            producer_id,
            producer_epoch,
            commit,
        };
        match h.addr.send(msg).await {
            Ok(Ok(())) => NONE,
            Ok(Err(e)) => ApiError::from(e).code(),
            Err(_) => ApiError::coordinator_gone().code(),
        }
    }
    .boxed()
}
