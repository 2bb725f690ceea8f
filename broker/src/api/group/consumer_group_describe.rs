//! ConsumerGroupDescribe (key 69, KIP-848): a consumer-protocol group's
//! epochs, assignor and members with their current and target
//! assignments. A classic group or an unknown id is GROUP_ID_NOT_FOUND, as
//! Kafka answers (librdkafka's `describe_consumer_groups` then falls back to
//! DescribeGroups). The group's authorized operations when asked
//! (`authorized`, no authorizer), for a group found.

use super::super::error::NONE;
use super::super::{authorized, s, Reply};
use super::ask;
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::assignor::Assignment;
use kaas_actors::group::messages::{ConsumerDescribed, DescribeConsumerGroups};
use kaas_protocol::kafka_protocol::messages::consumer_group_describe_response::{
    Assignment as WireAssignment, DescribedGroup, Member, TopicPartitions,
};
use kaas_protocol::kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, TopicName,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

fn wire(b: &Broker, a: &Assignment) -> WireAssignment {
    let mut w = WireAssignment::default();
    w.topic_partitions = a
        .iter()
        .map(|(id, ps)| {
            let mut tp = TopicPartitions::default();
            tp.topic_id = *id;
            tp.topic_name = TopicName(s(&b.topic_by_id(id).map(|t| t.name).unwrap_or_default()));
            tp.partitions = ps.iter().copied().collect();
            tp
        })
        .collect();
    w
}

/// Ask each group's coordinator.
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: ConsumerGroupDescribeRequest,
) -> Reply<ConsumerGroupDescribeResponse> {
    let b = b.clone();
    Reply::Later(
        async move {
            let mut resp = ConsumerGroupDescribeResponse::default();
            for id in &r.group_ids {
                let name = id.0.to_string();
                let mut g = DescribedGroup::default();
                g.group_id = id.clone();
                g.authorized_operations = i32::MIN;
                match ask(&b, &name, DescribeConsumerGroups(vec![name.clone()])).await {
                    Ok(mut found) => match found.pop().map(|x| x.1) {
                        Some(ConsumerDescribed::Consumer(d)) => {
                            g.group_state = s(d.state);
                            g.group_epoch = d.epoch;
                            g.assignment_epoch = d.assignment_epoch;
                            g.assignor_name = s(&d.assignor);
                            g.members = d
                                .members
                                .iter()
                                .map(|m| {
                                    let mut x = Member::default();
                                    x.member_id = s(&m.member_id);
                                    x.instance_id = m.instance_id.as_deref().map(s);
                                    x.rack_id = m.rack_id.as_deref().map(s);
                                    x.member_epoch = m.epoch;
                                    x.client_id = s(&m.client_id);
                                    x.client_host = s(&m.client_host);
                                    x.subscribed_topic_names =
                                        m.topics.iter().map(|t| TopicName(s(t))).collect();
                                    x.subscribed_topic_regex = m.regex.as_deref().map(s);
                                    x.assignment = wire(&b, &m.assigned);
                                    x.target_assignment = wire(&b, &m.target);
                                    if v >= 1 {
                                        x.member_type = 1; // consumer protocol
                                    }
                                    x
                                })
                                .collect();
                        }
                        Some(ConsumerDescribed::Classic) => {
                            g.error_code = ResponseError::GroupIdNotFound.code();
                            g.error_message =
                                Some(s(&format!("Group {name} is not a consumer group.")));
                        }
                        Some(ConsumerDescribed::Unknown) | None => {
                            g.error_code = ResponseError::GroupIdNotFound.code();
                            g.error_message = Some(s(&format!("Group {name} not found.")));
                        }
                    },
                    Err(e) => g.error_code = e.code(),
                }
                if g.error_code == NONE {
                    g.authorized_operations =
                        authorized::when_asked(r.include_authorized_operations, authorized::GROUP);
                }
                resp.groups.push(g);
            }
            resp
        }
        .boxed(),
    )
}
