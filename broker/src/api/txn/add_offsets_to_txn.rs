//! AddOffsetsToTxn (key 25), v0-v3: the group's coordinator shard joins the
//! transaction (as `__consumer_offsets`/shard), so EndTxn sends it a marker
//! that commits or drops the TxnOffsetCommit offsets. PRODUCER_FENCED from
//! v2 on.

use super::super::Reply;
use super::{ask, code_of};
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::txn::messages::AddTxnPartitions;
use kaas_actors::txn::state::GROUP_OFFSETS_TOPIC;
use kaas_protocol::kafka_protocol::messages::{AddOffsetsToTxnRequest, AddOffsetsToTxnResponse};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Forward to the coordinator; the answer waits for the fsync.
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: AddOffsetsToTxnRequest,
) -> Reply<AddOffsetsToTxnResponse> {
    let b = b.clone();
    Reply::Later(
        async move {
            let mut resp = AddOffsetsToTxnResponse::default();
            resp.error_code = match b.shard_count() {
                None => ResponseError::CoordinatorNotAvailable.code(),
                Some(c) => {
                    let shard = c.shard_of(&r.group_id.0);
                    let id = r.transactional_id.0.to_string();
                    let msg = AddTxnPartitions {
                        transactional_id: id.clone(),
                        producer_id: r.producer_id.0,
                        producer_epoch: r.producer_epoch,
                        partitions: vec![(GROUP_OFFSETS_TOPIC.to_owned(), shard.0 as i32)],
                    };
                    code_of(ask(&b, &id, msg).await, v, 2)
                }
            };
            resp
        }
        .boxed(),
    )
}
