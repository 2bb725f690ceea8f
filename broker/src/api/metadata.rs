//! Metadata (key 3): brokers, controller, and each topic's partitions with
//! their leader and epoch, from the newest assignment this broker applied.
//! May auto-create a topic (broker flag, and the client's
//! `allow_auto_topic_creation` from v4 on).

use super::error::{ApiError, NONE};
use super::{authorized, await_topic_ready, live_brokers, s, Reply};
use crate::limits::{LimitError, PartitionBudget};
use crate::state::Broker;
use kaas_actors::topic::{CreateTopic, TopicStamp};
use kaas_protocol::kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kaas_protocol::kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kaas_protocol::kafka_protocol::messages::{
    BrokerId, MetadataRequest, MetadataResponse, TopicName,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Whether the request asks for every topic: a null list, or (v0 only,
/// where the list is not nullable) an empty one.
fn wants_all(topics: &Option<Vec<MetadataRequestTopic>>, v: i16) -> bool {
    match topics {
        None => true,
        Some(t) => t.is_empty() && v == 0,
    }
}

/// Whether a missing topic may be created: the broker flag, and from v4 on
/// the client's `allow_auto_topic_creation` (before v4 the field does not
/// exist and clients expect the broker's setting alone).
fn may_auto_create(broker_allows: bool, v: i16, client_allows: bool) -> bool {
    broker_allows && (v < 4 || client_allows)
}

/// Answer inline (auto-creation waits, bounded, in the dispatch phase).
pub async fn handle(b: &Arc<Broker>, v: i16, r: MetadataRequest) -> Reply<MetadataResponse> {
    Reply::Now(metadata(b, r, v).await)
}

async fn metadata(b: &Arc<Broker>, r: MetadataRequest, v: i16) -> MetadataResponse {
    let mut resp = MetadataResponse::default();
    let (brokers, controller) = live_brokers(b);
    resp.brokers = brokers
        .into_iter()
        .map(|(id, host, port)| {
            let mut x = MetadataResponseBroker::default();
            x.node_id = BrokerId(id);
            x.host = s(&host);
            x.port = port;
            x
        })
        .collect();
    resp.cluster_id = Some(s(&b.cluster_id));
    resp.controller_id = BrokerId(controller);
    let mut wanted: Vec<(Option<String>, Uuid)> = Vec::new();
    if wants_all(&r.topics, v) {
        for t in b.topics.read().unwrap().values() {
            wanted.push((Some(t.name.clone()), t.topic_id));
        }
    } else {
        for t in r.topics.iter().flatten() {
            wanted.push((t.name.as_ref().map(|n| n.0.to_string()), t.topic_id));
        }
    }
    let allow_create = may_auto_create(b.args.auto_create_topics, v, r.allow_auto_topic_creation);
    let mut creates = AutoCreates {
        left: b.args.max_auto_create_per_request,
        budget: None,
    };
    for (name, id) in wanted {
        let mut mt = MetadataResponseTopic::default();
        let stamp = match &name {
            Some(n) => match b.topic(n) {
                Some(t) => Ok(Some(t)),
                None if allow_create && kaas_actors::topic::validate_name(n).is_ok() => {
                    auto_create(b, n, &mut creates).await
                }
                None => Ok(known_soon(b, n).await),
            },
            None => Ok(b.topic_by_id(&id)),
        };
        mt.name = name.clone().map(|n| TopicName(s(&n)));
        mt.topic_id = id;
        match stamp {
            Err(e) => mt.error_code = ApiError::from(&e).code(),
            Ok(None) => {
                mt.error_code = ApiError(match &name {
                    Some(n) if kaas_actors::topic::validate_name(n).is_err() => {
                        ResponseError::InvalidTopicException
                    }
                    Some(_) => ResponseError::UnknownTopicOrPartition,
                    None => ResponseError::UnknownTopicId,
                })
                .code();
            }
            Ok(Some(t)) => {
                mt.name = Some(TopicName(s(&t.name)));
                mt.topic_id = t.topic_id;
                mt.partitions = partitions(b, &t);
            }
        }
        mt.topic_authorized_operations =
            authorized::when_asked(r.include_topic_authorized_operations, authorized::TOPIC);
        resp.topics.push(mt);
    }
    resp.cluster_authorized_operations =
        authorized::when_asked(r.include_cluster_authorized_operations, authorized::CLUSTER);
    resp
}

/// Each partition's leader and epoch, as the newest assignment grants them
/// (also DescribeTopicPartitions').
pub(crate) fn partitions(b: &Broker, t: &TopicStamp) -> Vec<MetadataResponsePartition> {
    let a = b.assignment();
    let entries = a
        .topics
        .get(&t.name)
        .filter(|x| x.topic_id == t.topic_id)
        .map(|x| x.partitions.as_slice())
        .unwrap_or(&[]);
    // A broker whose lease lapsed does not name itself leader (clients
    // re-query instead of looping on NOT_LEADER), nor a broker this host has
    // watched stand still for a lease (it has fenced itself; see
    // `Shared::silent`) — also while no controller is left to say so.
    let self_ok = b.shared.lease.valid();
    let advertised = |id: i32| {
        a.brokers.iter().any(|x| x.id == id)
            && (id != b.args.broker_id || self_ok)
            && !b.shared.is_silent(id)
    };
    (0..t.partitions)
        .map(|p| {
            let mut mp = MetadataResponsePartition::default();
            mp.partition_index = p;
            mp.error_code = NONE;
            match entries.get(p as usize) {
                Some(e) if e.leader >= 0 && advertised(e.leader) => {
                    mp.leader_id = BrokerId(e.leader);
                    mp.leader_epoch = e.epoch;
                    mp.replica_nodes = vec![BrokerId(e.leader)];
                    mp.isr_nodes = vec![BrokerId(e.leader)];
                }
                // Vacant (moving, no live broker) or led by a silent broker:
                // retriable, and clients re-query quickly while a partition
                // has no leader.
                e => {
                    mp.error_code = ResponseError::LeaderNotAvailable.code();
                    mp.leader_id = BrokerId(-1);
                    mp.leader_epoch = e.map(|e| e.epoch).unwrap_or(-1);
                }
            }
            mp
        })
        .collect()
}

/// The auto-creation bounds of one Metadata request: how many more topics
/// it may create, and its partition budget (made on first use).
struct AutoCreates {
    left: usize,
    budget: Option<PartitionBudget>,
}

/// Why this request will not create `name` now, if it will not: the
/// per-request cap, the broker's rate, or the partition limits. Like Kafka
/// (whose auto-creation is asynchronous and only logs a refused create),
/// the topic is then answered LEADER_NOT_AVAILABLE: retriable, so a client
/// asking again later gets it created once the bound allows.
fn defer_auto_create(b: &Broker, name: &str, c: &mut AutoCreates) -> Option<LimitError> {
    if c.left == 0 {
        return Some(LimitError::AutoCreateDeferred(
            "too many topics in one request (--max-auto-create-per-request)",
        ));
    }
    let budget = c.budget.get_or_insert_with(|| b.partition_budget());
    if let Err(e) = budget.clone().admit(b.args.default_partitions) {
        if let Some(count) = super::warn_for_peer(b, "auto-creation refused") {
            tracing::warn!(peer = %super::peer_name(), topic = %name, reason = %e, count, "auto-creation refused");
        }
        return Some(LimitError::AutoCreateDeferred("partition limit reached"));
    }
    if !b.auto_create.lock().unwrap().try_take(Instant::now()) {
        return Some(LimitError::AutoCreateDeferred(
            "auto-creation rate exceeded (--auto-create-per-sec)",
        ));
    }
    c.left -= 1;
    let _ = budget.admit(b.args.default_partitions);
    None
}

async fn auto_create(
    b: &Broker,
    name: &str,
    c: &mut AutoCreates,
) -> Result<Option<TopicStamp>, LimitError> {
    if let Some(e) = defer_auto_create(b, name, c) {
        tracing::debug!(topic = %name, reason = %e, "auto-creation deferred");
        return Err(e);
    }
    let r = b
        .catalog
        .send(CreateTopic {
            name: name.to_owned(),
            partitions: b.args.default_partitions,
            configs: BTreeMap::new(),
            validate_only: false,
        })
        .await;
    match r {
        Ok(Ok(t)) => {
            tracing::info!(topic = %name, partitions = t.partitions, "auto-created topic");
            await_topic_ready(b, name, t.topic_id, Duration::from_secs(5)).await;
            Ok(b.topic(name))
        }
        // Created meanwhile by another broker: wait for the assignment.
        _ => Ok(known_soon(b, name).await),
    }
}

/// A topic this broker's assignment does not list yet may exist on the
/// volume already (just created through another broker; assignments reach
/// each broker by polling). If its directory exists, wait (bounded) for the
/// assignment to catch up rather than answer "unknown topic" for a topic
/// that exists.
pub(crate) async fn known_soon(b: &Broker, name: &str) -> Option<TopicStamp> {
    if let Some(t) = b.topic(name) {
        return Some(t);
    }
    if kaas_actors::topic::validate_name(name).is_err() {
        return None;
    }
    // Being deleted: its directory is still there, but it is not coming.
    if b.assignment().topics.get(name).is_some_and(|t| t.deleting) {
        return None;
    }
    if !b.topic_dir_exists(name).await {
        return None;
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if let Some(t) = b.topic(name) {
            return Some(t);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_list_means_all_only_in_v0() {
        assert!(wants_all(&None, 0));
        assert!(wants_all(&None, 12));
        assert!(wants_all(&Some(vec![]), 0));
        assert!(!wants_all(&Some(vec![]), 1));
        assert!(!wants_all(&Some(vec![MetadataRequestTopic::default()]), 0));
    }

    #[test]
    fn client_flag_counts_from_v4() {
        assert!(may_auto_create(true, 3, false));
        assert!(!may_auto_create(true, 4, false));
        assert!(may_auto_create(true, 4, true));
        assert!(!may_auto_create(false, 3, true));
    }
}
