//! LeaveGroup (key 13): v0-v2 one member, v3+ a batch (KIP-345); answered
//! once the membership change is durable.

use super::super::{s, Reply};
use super::{ask, code};
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::classic::Leaving;
use kaas_actors::group::messages::LeaveGroupRequest as Leave;
use kaas_protocol::kafka_protocol::messages::leave_group_response::MemberResponse;
use kaas_protocol::kafka_protocol::messages::{LeaveGroupRequest, LeaveGroupResponse};
use std::sync::Arc;

/// Forward to the coordinator.
pub async fn handle(b: &Arc<Broker>, v: i16, r: LeaveGroupRequest) -> Reply<LeaveGroupResponse> {
    let b = b.clone();
    Reply::Later(async move { leave(&b, v, r).await }.boxed())
}

async fn leave(b: &Broker, v: i16, r: LeaveGroupRequest) -> LeaveGroupResponse {
    let group = r.group_id.0.to_string();
    let members: Vec<Leaving> = if v >= 3 {
        r.members
            .iter()
            .map(|m| Leaving {
                member_id: m.member_id.to_string(),
                instance_id: m.group_instance_id.as_ref().map(|i| i.to_string()),
            })
            .collect()
    } else {
        vec![Leaving {
            member_id: r.member_id.to_string(),
            instance_id: None,
        }]
    };
    let mut resp = LeaveGroupResponse::default();
    match ask(
        b,
        &group,
        Leave {
            group_id: group.clone(),
            members,
        },
    )
    .await
    {
        Ok(x) => {
            // Before v3 the one member's error is the response's.
            let first = x.members.first().and_then(|m| m.2);
            resp.error_code = if v >= 3 {
                code(x.error)
            } else {
                code(x.error.or(first))
            };
            if v >= 3 {
                resp.members = x
                    .members
                    .into_iter()
                    .map(|(id, inst, e)| {
                        let mut m = MemberResponse::default();
                        m.member_id = s(&id);
                        m.group_instance_id = inst.as_deref().map(s);
                        m.error_code = code(e);
                        m
                    })
                    .collect();
            }
        }
        Err(e) => resp.error_code = e.code(),
    }
    resp
}
