//! DescribeGroups (key 15): each group's state, protocol and members (with
//! their subscription and assignment bytes), from its coordinator. An
//! unknown group is `Dead` with no error up to v5, and from v6 (KIP-1043)
//! `Dead` with GROUP_ID_NOT_FOUND and a message, as in Kafka. A KIP-848 consumer
//! group is shown with protocol type `consumer`, its state and members.
//! From v3, the group's authorized operations when asked (`authorized`: no
//! authorizer, so every operation a group supports), for a group answered
//! without an error, as Kafka.

use super::super::error::NONE;
use super::super::{authorized, s, Reply};
use super::ask;
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::classic::GroupState;
use kaas_actors::group::messages::DescribeGroupsRequest as Describe;
use kaas_actors::group::messages::{ConsumerDescribed, DescribeConsumerGroups as DescribeConsumer};
use kaas_protocol::kafka_protocol::messages::describe_groups_response::{
    DescribedGroup, DescribedGroupMember,
};
use kaas_protocol::kafka_protocol::messages::{DescribeGroupsRequest, DescribeGroupsResponse};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Ask each group's coordinator.
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: DescribeGroupsRequest,
) -> Reply<DescribeGroupsResponse> {
    let b = b.clone();
    Reply::Later(
        async move {
            let mut resp = DescribeGroupsResponse::default();
            for id in &r.groups {
                let name = id.0.to_string();
                let mut g = DescribedGroup::default();
                g.group_id = id.clone();
                g.authorized_operations = i32::MIN;
                let ops = authorized::when_asked(
                    v >= 3 && r.include_authorized_operations,
                    authorized::GROUP,
                );
                // A KIP-848 group: its state and members (no protocol bytes:
                // the assignment is the coordinator's, by topic id).
                if let Ok(mut found) = ask(&b, &name, DescribeConsumer(vec![name.clone()])).await {
                    if let Some((_, ConsumerDescribed::Consumer(d))) = found.pop() {
                        g.group_state = s(d.state);
                        g.protocol_type = s("consumer");
                        g.protocol_data = s(&d.assignor);
                        g.members = d
                            .members
                            .iter()
                            .map(|m| {
                                let mut x = DescribedGroupMember::default();
                                x.member_id = s(&m.member_id);
                                if v >= 4 {
                                    x.group_instance_id = m.instance_id.as_deref().map(s);
                                }
                                x.client_id = s(&m.client_id);
                                x.client_host = s(&m.client_host);
                                x
                            })
                            .collect();
                        g.authorized_operations = ops;
                        resp.groups.push(g);
                        continue;
                    }
                }
                match ask(&b, &name, Describe(vec![name.clone()])).await {
                    Ok(mut found) => {
                        if let Some((_, state, rec)) = found.pop() {
                            g.group_state = s(state.kafka_name());
                            if v >= 6 && state == GroupState::Dead && rec.is_none() {
                                // KIP-1043: from v6 an unknown group is an error.
                                g.error_code = ResponseError::GroupIdNotFound.code();
                                g.error_message = Some(s(&format!("Group {name} not found.")));
                            }
                            if let Some(rec) = rec {
                                g.protocol_type = s(rec.protocol_type.as_deref().unwrap_or(""));
                                g.protocol_data = s(rec.protocol.as_deref().unwrap_or(""));
                                g.members = rec
                                    .members
                                    .into_iter()
                                    .map(|m| {
                                        let mut x = DescribedGroupMember::default();
                                        x.member_id = s(&m.member_id);
                                        if v >= 4 {
                                            x.group_instance_id = m.instance_id.as_deref().map(s);
                                        }
                                        x.client_id = s(&m.client_id);
                                        x.client_host = s(&m.client_host);
                                        x.member_metadata = m.subscription.into();
                                        x.member_assignment = m.assignment.into();
                                        x
                                    })
                                    .collect();
                            }
                        }
                    }
                    Err(e) => g.error_code = e.code(),
                }
                if g.error_code == NONE {
                    g.authorized_operations = ops;
                }
                resp.groups.push(g);
            }
            resp
        }
        .boxed(),
    )
}
