//! OffsetDelete (key 47): remove a group's committed offsets of some
//! partitions, answered once the tombstones are durable. A group with
//! consumers keeps the offsets of topics they subscribe to
//! (GROUP_SUBSCRIBED_TO_TOPIC per partition); a non-consumer group with
//! members keeps all (NON_EMPTY_GROUP); an unknown group is
//! GROUP_ID_NOT_FOUND.

use super::super::Reply;
use super::{ask, code};
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::messages::DeleteOffsetsRequest;
use kaas_protocol::kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kaas_protocol::kafka_protocol::messages::{OffsetDeleteRequest, OffsetDeleteResponse};
use std::sync::Arc;

/// Forward to the coordinator.
pub async fn handle(
    b: &Arc<Broker>,
    _v: i16,
    r: OffsetDeleteRequest,
) -> Reply<OffsetDeleteResponse> {
    let b = b.clone();
    Reply::Later(
        async move {
            let group = r.group_id.0.to_string();
            let partitions: Vec<(String, i32)> = r
                .topics
                .iter()
                .flat_map(|t| {
                    t.partitions
                        .iter()
                        .map(move |p| (t.name.0.to_string(), p.partition_index))
                })
                .collect();
            let mut resp = OffsetDeleteResponse::default();
            let req = DeleteOffsetsRequest {
                group_id: group.clone(),
                partitions,
            };
            match ask(&b, &group, req).await {
                Err(e) => resp.error_code = e.code(),
                Ok(Err(e)) => resp.error_code = code(Some(e)),
                Ok(Ok(results)) => {
                    for t in r.topics {
                        let mut tr = OffsetDeleteResponseTopic::default();
                        tr.name = t.name.clone();
                        for p in &t.partitions {
                            let mut pr = OffsetDeleteResponsePartition::default();
                            pr.partition_index = p.partition_index;
                            pr.error_code = results
                                .iter()
                                .find(|(n, i, _)| *n == *t.name.0 && *i == p.partition_index)
                                .map_or(0, |(_, _, e)| code(*e));
                            tr.partitions.push(pr);
                        }
                        resp.topics.push(tr);
                    }
                }
            }
            resp
        }
        .boxed(),
    )
}
