//! SyncGroup (key 14): the leader's assignment in, each member's out;
//! answered once the assignment is durable.

use super::super::{s, Reply};
use super::{ask, code};
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::classic::SyncGroup;
use kaas_actors::group::messages::SyncGroupRequest as Sync;
use kaas_protocol::kafka_protocol::messages::{SyncGroupRequest, SyncGroupResponse};
use std::sync::Arc;

/// Forward to the coordinator; the answer may wait for the leader.
pub async fn handle(b: &Arc<Broker>, v: i16, r: SyncGroupRequest) -> Reply<SyncGroupResponse> {
    let b = b.clone();
    Reply::Later(async move { sync(&b, v, r).await }.boxed())
}

async fn sync(b: &Broker, v: i16, r: SyncGroupRequest) -> SyncGroupResponse {
    let group = r.group_id.0.to_string();
    let req = SyncGroup {
        group_id: group.clone(),
        generation_id: r.generation_id,
        member_id: r.member_id.to_string(),
        instance_id: r.group_instance_id.as_ref().map(|i| i.to_string()),
        protocol_type: r.protocol_type.as_ref().map(|p| p.to_string()),
        protocol_name: r.protocol_name.as_ref().map(|p| p.to_string()),
        assignments: r
            .assignments
            .iter()
            .map(|a| (a.member_id.to_string(), a.assignment.to_vec()))
            .collect(),
    };
    let mut resp = SyncGroupResponse::default();
    match ask(b, &group, Sync(req)).await {
        Ok(x) => {
            resp.error_code = code(x.error);
            if v >= 5 {
                resp.protocol_type = x.protocol_type.as_deref().map(s);
                resp.protocol_name = x.protocol_name.as_deref().map(s);
            }
            resp.assignment = x.assignment.into();
        }
        Err(e) => resp.error_code = e.code(),
    }
    resp
}
