//! Heartbeat (key 12): keeps a member's session; tells it to rejoin when a
//! rebalance started (REBALANCE_IN_PROGRESS).

use super::super::Reply;
use super::{ask, code};
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::classic::Heartbeat;
use kaas_actors::group::messages::HeartbeatRequest as Beat;
use kaas_protocol::kafka_protocol::messages::{HeartbeatRequest, HeartbeatResponse};
use std::sync::Arc;

/// Forward to the coordinator.
pub async fn handle(b: &Arc<Broker>, _v: i16, r: HeartbeatRequest) -> Reply<HeartbeatResponse> {
    let b = b.clone();
    Reply::Later(
        async move {
            let group = r.group_id.0.to_string();
            let req = Heartbeat {
                group_id: group.clone(),
                generation_id: r.generation_id,
                member_id: r.member_id.to_string(),
                instance_id: r.group_instance_id.as_ref().map(|i| i.to_string()),
            };
            let mut resp = HeartbeatResponse::default();
            resp.error_code = match ask(&b, &group, Beat(req)).await {
                Ok(r) => code(r.err()),
                Err(e) => e.code(),
            };
            resp
        }
        .boxed(),
    )
}
