//! ConsumerGroupHeartbeat (key 68, KIP-848): the consumer protocol's one
//! membership API. Decoded into a `ConsumerHeartbeat`, answered by the
//! group's coordinator once the records it caused are durable; the
//! assignment goes back by topic id.

use super::super::{s, Reply};
use super::ask;
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::assignor::Assignment;
use kaas_actors::group::consumer::ConsumerHeartbeat;
use kaas_actors::group::messages::ConsumerHeartbeatRequest as Beat;
use kaas_protocol::kafka_protocol::messages::consumer_group_heartbeat_response::{
    Assignment as WireAssignment, TopicPartitions,
};
use kaas_protocol::kafka_protocol::messages::{
    ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Forward to the coordinator.
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: ConsumerGroupHeartbeatRequest,
) -> Reply<ConsumerGroupHeartbeatResponse> {
    let b = b.clone();
    let client_id = super::super::client_id()
        .as_deref()
        .unwrap_or("")
        .to_string();
    Reply::Later(
        async move {
            let group = r.group_id.0.to_string();
            let mut resp = ConsumerGroupHeartbeatResponse::default();
            // v1 (KIP-1082): the client issues its member id, even to join.
            if v >= 1 && r.member_id.is_empty() {
                resp.error_code = ResponseError::InvalidRequest.code();
                resp.error_message = Some(s("MemberId can't be empty."));
                return resp;
            }
            let owned = r.topic_partitions.as_ref().map(|tps| {
                let mut a = Assignment::new();
                for tp in tps {
                    a.entry(tp.topic_id)
                        .or_default()
                        .extend(tp.partitions.iter().copied());
                }
                a
            });
            let req = ConsumerHeartbeat {
                group_id: group.clone(),
                member_id: r.member_id.to_string(),
                member_epoch: r.member_epoch,
                instance_id: r.instance_id.as_ref().map(|x| x.to_string()),
                rack_id: r.rack_id.as_ref().map(|x| x.to_string()),
                rebalance_timeout_ms: r.rebalance_timeout_ms,
                topics: r
                    .subscribed_topic_names
                    .as_ref()
                    .map(|ts| ts.iter().map(|t| t.0.to_string()).collect()),
                regex: r.subscribed_topic_regex.as_ref().map(|x| x.to_string()),
                assignor: r.server_assignor.as_ref().map(|x| x.to_string()),
                owned,
                client_id,
                client_host: String::new(),
            };
            match ask(&b, &group, Beat(req)).await {
                Ok(Ok(a)) => {
                    resp.member_id = Some(s(&a.member_id));
                    resp.member_epoch = a.member_epoch;
                    resp.heartbeat_interval_ms = a.heartbeat_interval_ms;
                    resp.assignment = a.assignment.map(|x| {
                        let mut w = WireAssignment::default();
                        w.topic_partitions = x
                            .into_iter()
                            .map(|(id, ps)| {
                                let mut tp = TopicPartitions::default();
                                tp.topic_id = id;
                                tp.partitions = ps.into_iter().collect();
                                tp
                            })
                            .collect();
                        w
                    });
                }
                Ok(Err((e, msg))) => {
                    resp.error_code = e.code();
                    resp.error_message = msg.map(|m| s(&m));
                }
                Err(e) => resp.error_code = e.code(),
            }
            resp
        }
        .boxed(),
    )
}
