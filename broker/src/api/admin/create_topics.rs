//! CreateTopics (key 19): the catalog creates and stamps the directories,
//! then (bounded) the handler waits for the controller to grant leaders so
//! the client's next request finds one.
//!
//! kaas keeps one copy on the shared volume: replication factor 1 or -1
//! only. A manual replica assignment is checked as Kafka's controller
//! checks it (`ReplicationControlManager.createTopic`: replication factor
//! and partition count -1, each partition once, 0..n-1, every broker
//! registered, no broker twice, the same count everywhere) and may then
//! name one broker per partition (more → INVALID_REPLICATION_FACTOR, as a
//! replication factor above 1). The broker named is validated, not
//! honoured: which broker leads a partition is the controller's placement
//! (see `kaas_actors::cluster::balance`), which keeps no preferred replica.

use crate::api::admin::{topic_entries, Mutations};
use crate::api::error::ApiError;
use crate::api::{await_topic_ready, live_brokers, s, Reply};
use crate::state::Broker;
use kaas_actors::topic::CreateTopic;
use kaas_protocol::kafka_protocol::messages::create_topics_request::CreatableTopic;
use kaas_protocol::kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kaas_protocol::kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse};
use kaas_protocol::kafka_protocol::ResponseError;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Answer inline (the creation and the wait for leaders are bounded).
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: CreateTopicsRequest,
) -> Reply<CreateTopicsResponse> {
    Reply::Now(create_topics(b, r, v).await)
}

/// Blank what version `v` does not carry: partitions, replication factor
/// and configs from v5, the topic id from v7, the message from v1.
fn for_version(tr: &mut CreatableTopicResult, v: i16) {
    if v < 5 {
        tr.num_partitions = -1;
        tr.replication_factor = -1;
        tr.configs = None;
        tr.topic_config_error_code = 0;
    }
    if v < 7 {
        tr.topic_id = Uuid::nil();
    }
    if v < 1 {
        tr.error_message = None;
    }
}

async fn create_topics(b: &Arc<Broker>, r: CreateTopicsRequest, v: i16) -> CreateTopicsResponse {
    let mut resp = CreateTopicsResponse::default();
    // The partition limits count every topic of the request (and what the
    // cluster already holds), checked before anything touches the volume.
    let mut budget = b.partition_budget();
    // KIP-599: THROTTLING_QUOTA_EXCEEDED from v6.
    let mutations = Mutations::new(b, v, 6);
    for t in r.topics {
        let name = t.name.0.to_string();
        let mut tr = CreatableTopicResult::default();
        tr.name = t.name.clone();
        tr.num_partitions = -1;
        tr.replication_factor = -1;
        let fail = |tr: &mut CreatableTopicResult, e: ApiError, msg: Option<String>| {
            tr.error_code = e.code();
            tr.error_message = msg.as_deref().map(s);
        };
        let counted = if !t.assignments.is_empty() {
            let registered: Vec<i32> = live_brokers(b).0.into_iter().map(|x| x.0).collect();
            manual_partitions(&t, &registered, |id| active(b, id))
        } else if !matches!(t.replication_factor, -1 | 1) {
            Err(Refusal(
                ResponseError::InvalidReplicationFactor,
                "kaas keeps one copy on the shared volume: use replication factor 1 or -1".into(),
            ))
        } else if t.num_partitions == -1 {
            Ok(b.args.default_partitions)
        } else {
            Ok(t.num_partitions)
        };
        let partitions = counted.as_ref().copied().unwrap_or(0);
        if let Err(Refusal(e, msg)) = counted {
            fail(&mut tr, e.into(), Some(msg));
        } else if let Err(e) = budget.admit(partitions).and_then(|()| {
            if r.validate_only {
                Ok(())
            } else {
                mutations.admit(i64::from(partitions))
            }
        }) {
            tracing::info!(topic = %name, partitions, reason = %e, "topic creation refused");
            fail(&mut tr, ApiError::from(&e), Some(e.to_string()));
        } else {
            let configs: BTreeMap<String, String> = t
                .configs
                .iter()
                .filter_map(|c| Some((c.name.to_string(), c.value.as_ref()?.to_string())))
                .collect();
            let res = b
                .catalog
                .send(CreateTopic {
                    name: name.clone(),
                    partitions,
                    configs,
                    validate_only: r.validate_only,
                })
                .await;
            match res {
                Ok(Ok(stamp)) => {
                    if !r.validate_only {
                        tracing::info!(topic = %name, partitions = stamp.partitions, topic_id = %stamp.topic_id, "topic created");
                        let wait = Duration::from_millis(r.timeout_ms.clamp(0, 30_000) as u64);
                        if !await_topic_ready(b, &name, stamp.topic_id, wait).await {
                            tracing::warn!(topic = %name, "created; leaders not yet assigned");
                        }
                    }
                    tr.topic_id = if r.validate_only {
                        Uuid::nil()
                    } else {
                        stamp.topic_id
                    };
                    tr.num_partitions = stamp.partitions;
                    tr.replication_factor = 1;
                    tr.configs = Some(
                        topic_entries(b, &stamp.configs)
                            .into_iter()
                            .map(|e| {
                                let mut c = CreatableTopicConfigs::default();
                                c.name = s(&e.name);
                                c.value = Some(s(&e.value));
                                c.read_only = e.read_only;
                                c.config_source = e.source;
                                c
                            })
                            .collect(),
                    );
                }
                Ok(Err(e)) => fail(&mut tr, ApiError::from(&e), Some(e.to_string())),
                Err(_) => fail(&mut tr, ApiError::catalog_gone(), None),
            }
        }
        for_version(&mut tr, v);
        resp.topics.push(tr);
    }
    resp.throttle_time_ms = mutations.throttle_ms();
    resp
}

/// A refused assignment: the error and Kafka's sentence for it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Refusal(pub ResponseError, pub String);

/// Whether broker `id` may take a partition now: not standing still (it
/// has fenced itself, see `Shared::silent`), and this broker only under a
/// valid lease — Kafka's "fenced or in controlled shutdown".
pub(super) fn active(b: &Broker, id: i32) -> bool {
    !b.shared.is_silent(id) && (id != b.args.broker_id || b.shared.lease.valid())
}

/// The partition count of a CreateTopics topic with a manual assignment,
/// checked in the order of Kafka's `ReplicationControlManager.createTopic`;
/// `registered` lists the brokers the assignment may name.
fn manual_partitions(
    t: &CreatableTopic,
    registered: &[i32],
    active: impl Fn(i32) -> bool,
) -> Result<i32, Refusal> {
    let invalid = |m: &str| Refusal(ResponseError::InvalidRequest, m.into());
    if t.replication_factor != -1 {
        return Err(invalid(
            "A manual partition assignment was specified, but replication factor was not set to -1.",
        ));
    }
    if t.num_partitions != -1 {
        return Err(invalid(
            "A manual partition assignment was specified, but numPartitions was not set to -1.",
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut replicas_each = None;
    for a in &t.assignments {
        let p = a.partition_index;
        if !seen.insert(p) {
            return Err(Refusal(
                ResponseError::InvalidReplicaAssignment,
                format!("Found multiple manual partition assignments for partition {p}"),
            ));
        }
        let ids: Vec<i32> = a.broker_ids.iter().map(|x| x.0).collect();
        check_replicas(&ids, registered, replicas_each)?;
        replicas_each = Some(ids.len());
        if ids.len() > 1 {
            return Err(Refusal(
                ResponseError::InvalidReplicationFactor,
                format!(
                    "kaas keeps one copy on the shared volume: partition {p} names {} brokers, \
                     name one",
                    ids.len()
                ),
            ));
        }
        if !ids.iter().any(|&id| active(id)) {
            return Err(Refusal(
                ResponseError::InvalidReplicaAssignment,
                format!(
                    "All brokers specified in the manual partition assignment for partition {p} \
                     are fenced or in controlled shutdown."
                ),
            ));
        }
    }
    // The indices seen are distinct: they are 0..n-1 exactly when the
    // largest is n-1 and the smallest 0.
    let n = seen.len();
    if seen.first() != Some(&0) || seen.last().map(|&l| l as usize) != Some(n - 1) {
        return Err(Refusal(
            ResponseError::InvalidReplicaAssignment,
            "partitions should be a consecutive 0-based integer sequence".into(),
        ));
    }
    i32::try_from(n).map_err(|_| invalid("too many partitions"))
}

/// Kafka's `validateManualPartitionAssignment` for one partition's
/// replicas: not empty, every broker registered, none twice, and as many
/// as `replicas_each` (the other partitions') when that is known.
pub(super) fn check_replicas(
    ids: &[i32],
    registered: &[i32],
    replicas_each: Option<usize>,
) -> Result<(), Refusal> {
    let bad = |m: String| Err(Refusal(ResponseError::InvalidReplicaAssignment, m));
    if ids.is_empty() {
        return bad("The manual partition assignment includes an empty replica list.".into());
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    let mut prev = None;
    for &id in &sorted {
        if !registered.contains(&id) {
            return bad(format!(
                "The manual partition assignment includes broker {id}, but no such broker is \
                 registered."
            ));
        }
        if prev == Some(id) {
            return bad(format!(
                "The manual partition assignment includes the broker {id} more than once."
            ));
        }
        prev = Some(id);
    }
    match replicas_each {
        Some(n) if n != ids.len() => bad(format!(
            "The manual partition assignment includes a partition with {} replica(s), but this \
             is not consistent with previous partitions, which have {n} replica(s).",
            ids.len()
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_protocol::kafka_protocol::messages::create_topics_request::CreatableReplicaAssignment;
    use kaas_protocol::kafka_protocol::messages::BrokerId;

    fn topic(partitions: i32, rf: i16, lists: &[(i32, &[i32])]) -> CreatableTopic {
        let mut t = CreatableTopic::default();
        t.num_partitions = partitions;
        t.replication_factor = rf;
        t.assignments = lists
            .iter()
            .map(|(p, ids)| {
                let mut a = CreatableReplicaAssignment::default();
                a.partition_index = *p;
                a.broker_ids = ids.iter().map(|&i| BrokerId(i)).collect();
                a
            })
            .collect();
        t
    }

    fn code(t: &CreatableTopic, registered: &[i32]) -> Result<i32, ResponseError> {
        manual_partitions(t, registered, |_| true).map_err(|r| r.0)
    }

    #[test]
    fn one_live_broker_per_partition_is_accepted() {
        assert_eq!(code(&topic(-1, -1, &[(0, &[0]), (1, &[0])]), &[0]), Ok(2));
        // In any order, naming any registered broker.
        assert_eq!(
            code(&topic(-1, -1, &[(2, &[1]), (0, &[0]), (1, &[1])]), &[0, 1]),
            Ok(3)
        );
    }

    #[test]
    fn kafkas_refusals_in_kafkas_order() {
        use ResponseError::*;
        let cases: &[(CreatableTopic, ResponseError)] = &[
            (topic(-1, 1, &[(0, &[0])]), InvalidRequest),
            (topic(1, -1, &[(0, &[0])]), InvalidRequest),
            (
                topic(-1, -1, &[(0, &[0]), (0, &[0])]),
                InvalidReplicaAssignment,
            ),
            (topic(-1, -1, &[(0, &[])]), InvalidReplicaAssignment),
            (topic(-1, -1, &[(0, &[7])]), InvalidReplicaAssignment),
            (topic(-1, -1, &[(0, &[0, 0])]), InvalidReplicaAssignment),
            (
                topic(-1, -1, &[(0, &[0]), (1, &[0, 1])]),
                InvalidReplicaAssignment,
            ),
            (
                topic(-1, -1, &[(0, &[0]), (2, &[0])]),
                InvalidReplicaAssignment,
            ),
            (topic(-1, -1, &[(1, &[0])]), InvalidReplicaAssignment),
            (topic(-1, -1, &[(-1, &[0])]), InvalidReplicaAssignment),
            // Both brokers registered: what Kafka would accept, kaas cannot
            // keep (one copy), as with a replication factor of 2.
            (topic(-1, -1, &[(0, &[0, 1])]), InvalidReplicationFactor),
        ];
        for (t, want) in cases {
            assert_eq!(code(t, &[0, 1]), Err(*want), "{:?}", t.assignments);
        }
    }

    #[test]
    fn a_fenced_broker_cannot_take_a_partition() {
        let r = manual_partitions(&topic(-1, -1, &[(0, &[1])]), &[0, 1], |id| id == 0);
        assert_eq!(r.unwrap_err().0, ResponseError::InvalidReplicaAssignment);
    }

    fn full() -> CreatableTopicResult {
        let mut tr = CreatableTopicResult::default();
        tr.num_partitions = 3;
        tr.replication_factor = 1;
        tr.configs = Some(vec![CreatableTopicConfigs::default()]);
        tr.topic_config_error_code = 40;
        tr.topic_id = Uuid::from_u128(7);
        tr.error_message = Some(s("m"));
        tr
    }

    #[test]
    fn v5_and_up_keep_partitions_and_configs() {
        for v in 5..=7 {
            let mut tr = full();
            for_version(&mut tr, v);
            assert_eq!(tr.num_partitions, 3);
            assert_eq!(tr.replication_factor, 1);
            assert!(tr.configs.is_some());
            assert_eq!(tr.topic_config_error_code, 40);
            assert_eq!(tr.topic_id.is_nil(), v < 7, "v{v}");
        }
    }

    #[test]
    fn below_v5_blanks_partitions_configs_and_id() {
        for v in 0..5 {
            let mut tr = full();
            for_version(&mut tr, v);
            assert_eq!(tr.num_partitions, -1);
            assert_eq!(tr.replication_factor, -1);
            assert_eq!(tr.configs, None);
            assert_eq!(tr.topic_config_error_code, 0);
            assert!(tr.topic_id.is_nil());
            assert_eq!(tr.error_message.is_some(), v >= 1, "v{v}");
        }
    }
}
