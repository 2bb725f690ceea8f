//! ListGroups (key 16): the groups of every shard this broker coordinates
//! (clients ask every broker and merge), with v4 state filters and v5
//! type filters (`classic`, or `consumer` for KIP-848 groups).

use super::super::{s, Reply};
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::messages::ListConsumerGroups as ListConsumer;
use kaas_actors::group::messages::ListGroupsRequest as List;
use kaas_protocol::kafka_protocol::messages::list_groups_response::ListedGroup;
use kaas_protocol::kafka_protocol::messages::{GroupId, ListGroupsRequest, ListGroupsResponse};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Ask every local coordinator.
pub async fn handle(b: &Arc<Broker>, v: i16, r: ListGroupsRequest) -> Reply<ListGroupsResponse> {
    let b = b.clone();
    Reply::Later(
        async move {
            let mut resp = ListGroupsResponse::default();
            let states: Vec<String> = r.states_filter.iter().map(|x| x.to_lowercase()).collect();
            let types: Vec<String> = r.types_filter.iter().map(|x| x.to_lowercase()).collect();
            let want_classic = types.is_empty() || types.iter().any(|t| t == "classic");
            let want_consumer = types.is_empty() || types.iter().any(|t| t == "consumer");
            for h in b.coordinators() {
                if want_consumer {
                    if let Ok(Ok(groups)) = h.addr.send(ListConsumer).await {
                        for (id, state) in groups {
                            if !states.is_empty() && !states.contains(&state.to_lowercase()) {
                                continue;
                            }
                            let mut x = ListedGroup::default();
                            x.group_id = GroupId(s(&id));
                            x.protocol_type = s("consumer");
                            if v >= 4 {
                                x.group_state = s(state);
                            }
                            if v >= 5 {
                                x.group_type = s("consumer");
                            }
                            resp.groups.push(x);
                        }
                    }
                }
                if !want_classic {
                    continue;
                }
                match h.addr.send(List).await {
                    Ok(Ok(groups)) => {
                        for g in groups {
                            let state = g.state.kafka_name();
                            if !states.is_empty() && !states.contains(&state.to_lowercase()) {
                                continue;
                            }
                            let mut x = ListedGroup::default();
                            x.group_id = GroupId(s(&g.group_id));
                            x.protocol_type = s(&g.protocol_type);
                            // Fields of v4+ (state) and v5+ (type) only.
                            if v >= 4 {
                                x.group_state = s(state);
                            }
                            if v >= 5 {
                                x.group_type = s("classic");
                            }
                            resp.groups.push(x);
                        }
                    }
                    // A shard still loading: Kafka answers the whole request
                    // with the error, so the client retries.
                    Ok(Err(kaas_actors::group::messages::CoordinatorError::Loading)) => {
                        resp.error_code = ResponseError::CoordinatorLoadInProgress.code();
                    }
                    _ => {}
                }
            }
            resp
        }
        .boxed(),
    )
}
