//! DeleteGroups (key 42): remove empty groups — their membership record
//! and every committed offset — answered per group once the tombstones are
//! durable. A group with members gets NON_EMPTY_GROUP, an unknown one
//! GROUP_ID_NOT_FOUND, one this broker does not coordinate NOT_COORDINATOR
//! (clients send each group to its coordinator).

use super::super::{s, Reply};
use super::{ask, code};
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::messages::DeleteGroupRequest;
use kaas_protocol::kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kaas_protocol::kafka_protocol::messages::{DeleteGroupsRequest, DeleteGroupsResponse, GroupId};
use std::sync::Arc;

/// Ask each group's coordinator.
pub async fn handle(
    b: &Arc<Broker>,
    _v: i16,
    r: DeleteGroupsRequest,
) -> Reply<DeleteGroupsResponse> {
    let b = b.clone();
    Reply::Later(
        async move {
            let mut resp = DeleteGroupsResponse::default();
            for g in r.groups_names {
                let id = g.0.to_string();
                let mut gr = DeletableGroupResult::default();
                gr.group_id = GroupId(s(&id));
                gr.error_code = match ask(&b, &id, DeleteGroupRequest(id.clone())).await {
                    Ok(r) => code(r.err()),
                    Err(e) => e.code(),
                };
                resp.results.push(gr);
            }
            resp
        }
        .boxed(),
    )
}
