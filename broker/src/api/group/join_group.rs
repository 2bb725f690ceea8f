//! JoinGroup (key 11): answered when the group's join phase completes
//! (and its record is durable), which may be a rebalance timeout later.

use super::super::{s, Reply};
use super::{ask, code};
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::classic::JoinGroup;
use kaas_actors::group::messages::JoinGroupRequest as Join;
use kaas_protocol::kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kaas_protocol::kafka_protocol::messages::{JoinGroupRequest, JoinGroupResponse};
use std::sync::Arc;

/// Forward to the coordinator; the answer comes after the join phase.
pub async fn handle(b: &Arc<Broker>, v: i16, r: JoinGroupRequest) -> Reply<JoinGroupResponse> {
    let b = b.clone();
    // Read in the dispatch phase: the task-locals are gone once the
    // completion future runs.
    let who = (
        super::super::client_id()
            .as_deref()
            .unwrap_or("")
            .to_string(),
        super::super::client_host(),
    );
    Reply::Later(async move { join(&b, v, r, who).await }.boxed())
}

fn request(v: i16, r: &JoinGroupRequest, (client_id, client_host): (String, String)) -> JoinGroup {
    JoinGroup {
        group_id: r.group_id.0.to_string(),
        member_id: r.member_id.to_string(),
        instance_id: r.group_instance_id.as_ref().map(|i| i.to_string()),
        client_id,
        client_host,
        session_timeout_ms: r.session_timeout_ms,
        // v0 has no rebalance timeout: Kafka uses the session timeout.
        rebalance_timeout_ms: if v == 0 {
            r.session_timeout_ms
        } else {
            r.rebalance_timeout_ms
        },
        protocol_type: r.protocol_type.to_string(),
        protocols: r
            .protocols
            .iter()
            .map(|p| (p.name.to_string(), p.metadata.to_vec()))
            .collect(),
        // KIP-394: v4+ clients take a member id from MEMBER_ID_REQUIRED.
        require_known_member_id: v >= 4,
    }
}

async fn join(b: &Broker, v: i16, r: JoinGroupRequest, who: (String, String)) -> JoinGroupResponse {
    let group = r.group_id.0.to_string();
    let mut resp = JoinGroupResponse::default();
    resp.generation_id = -1;
    match ask(b, &group, Join(request(v, &r, who))).await {
        Ok(j) => {
            resp.error_code = code(j.error);
            resp.generation_id = j.generation_id;
            if v >= 7 {
                resp.protocol_type = j.protocol_type.as_deref().map(s);
            }
            resp.protocol_name = j.protocol_name.as_deref().map(s);
            if v < 7 && resp.protocol_name.is_none() {
                // Not nullable before v7.
                resp.protocol_name = Some(s(""));
            }
            resp.leader = s(&j.leader);
            resp.member_id = s(&j.member_id);
            resp.members = j
                .members
                .into_iter()
                .map(|m| {
                    let mut x = JoinGroupResponseMember::default();
                    x.member_id = s(&m.member_id);
                    if v >= 5 {
                        x.group_instance_id = m.instance_id.as_deref().map(s);
                    }
                    x.metadata = m.metadata.into();
                    x
                })
                .collect();
        }
        Err(e) => {
            resp.error_code = e.code();
            resp.member_id = r.member_id.clone();
            if v < 7 {
                resp.protocol_name = Some(s(""));
            }
        }
    }
    resp
}
