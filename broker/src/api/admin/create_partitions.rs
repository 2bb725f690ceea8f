//! CreatePartitions (key 37): grow a topic. The catalog rewrites the
//! topic's stamp with the new count (same id); the controller grants the
//! new partitions on its next pass like any other (they start above any
//! epoch found in their directories), and the handler waits (bounded by the
//! request timeout) until this broker's metadata shows them led.
//!
//! Only growth (INVALID_PARTITIONS for a count not above the current one),
//! within the partition limits (POLICY_VIOLATION), validate_only honoured.
//! A manual assignment is checked as Kafka's controller checks it
//! (`ReplicationControlManager.createPartitions`): one list per added
//! partition, each naming registered brokers once, as many as the topic's
//! replication factor — 1 in kaas, so one broker per partition; anything
//! else is INVALID_REPLICA_ASSIGNMENT. Like CreateTopics' assignment it is
//! validated, not honoured: the controller places the new partitions.

use super::create_topics::{active, check_replicas, Refusal};
use super::{read_topic, Mutations};
use crate::api::error::ApiError;
use crate::api::{live_brokers, s, Reply};
use crate::state::Broker;
use kaas_actors::topic::GrowTopic;
use kaas_protocol::kafka_protocol::messages::create_partitions_request::CreatePartitionsAssignment;
use kaas_protocol::kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kaas_protocol::kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Answer inline (bounded by the request's timeout).
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: CreatePartitionsRequest,
) -> Reply<CreatePartitionsResponse> {
    let mut resp = CreatePartitionsResponse::default();
    let mut budget = b.partition_budget();
    // KIP-599: THROTTLING_QUOTA_EXCEEDED from v3.
    let mutations = Mutations::new(b, v, 3);
    let wait = Duration::from_millis(r.timeout_ms.clamp(0, 30_000) as u64);
    for t in r.topics {
        let name = t.name.0.to_string();
        let mut tr = CreatePartitionsTopicResult::default();
        tr.name = t.name.clone();
        let mut fail = |e: ApiError, msg: String| {
            tr.error_code = e.code();
            tr.error_message = Some(s(&msg));
        };
        let Some(current) = read_topic(b, &name).await else {
            fail(
                ResponseError::UnknownTopicOrPartition.into(),
                format!("topic {name} does not exist"),
            );
            resp.results.push(tr);
            continue;
        };
        let added = t.count.saturating_sub(current.partitions);
        // A count not above the current one is the catalog's refusal
        // (INVALID_PARTITIONS), which Kafka gives before the assignment's.
        if let (Some(lists), true) = (&t.assignments, added > 0) {
            let registered: Vec<i32> = live_brokers(b).0.into_iter().map(|x| x.0).collect();
            let first = current.partitions;
            if let Err(Refusal(e, msg)) =
                check_added(added, first, lists, &registered, |id| active(b, id))
            {
                tracing::info!(topic = %name, added, reason = %msg, "replica assignment refused");
                fail(e.into(), msg);
                resp.results.push(tr);
                continue;
            }
        }
        if added > 0 {
            let admitted = budget.admit(added).and_then(|()| {
                if r.validate_only {
                    Ok(())
                } else {
                    mutations.admit(i64::from(added))
                }
            });
            if let Err(e) = admitted {
                tracing::info!(topic = %name, added, reason = %e, "partition creation refused");
                fail(ApiError::from(&e), e.to_string());
                resp.results.push(tr);
                continue;
            }
        }
        let res = b
            .catalog
            .send(GrowTopic {
                name: name.clone(),
                partitions: t.count,
                validate_only: r.validate_only,
            })
            .await;
        match res {
            Ok(Ok((stamp, _))) => {
                if !r.validate_only
                    && !await_partitions(b, &name, stamp.topic_id, t.count, wait).await
                {
                    tracing::warn!(topic = %name, count = t.count, "partitions added; leaders not yet assigned");
                }
            }
            Ok(Err(e)) => fail(ApiError::from(&e), e.to_string()),
            Err(_) => tr.error_code = ApiError::catalog_gone().code(),
        }
        resp.results.push(tr);
    }
    resp.throttle_time_ms = mutations.throttle_ms();
    Reply::Now(resp)
}

/// Wait (bounded) until this broker's assignment shows `count` partitions
/// of the topic, all led.
async fn await_partitions(
    b: &Broker,
    name: &str,
    id: uuid::Uuid,
    count: i32,
    timeout: Duration,
) -> bool {
    if let Some(c) = b.controller.get() {
        c.do_send(kaas_actors::cluster::controller::ReconcileNow);
    }
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(t) = b.assignment().topics.get(name) {
            if t.topic_id == id
                && t.partitions.len() >= count as usize
                && t.partitions.iter().all(|e| e.leader >= 0)
            {
                return true;
            }
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Kafka's checks of a CreatePartitions assignment adding `added`
/// partitions from index `first`: one list per added partition, each
/// valid for a topic of replication factor 1, naming an active broker.
fn check_added(
    added: i32,
    first: i32,
    lists: &[CreatePartitionsAssignment],
    registered: &[i32],
    active: impl Fn(i32) -> bool,
) -> Result<(), Refusal> {
    if usize::try_from(added).ok() != Some(lists.len()) {
        return Err(Refusal(
            ResponseError::InvalidReplicaAssignment,
            format!(
                "Attempted to add {added} additional partition(s), but only {} assignment(s) \
                 were specified.",
                lists.len()
            ),
        ));
    }
    for (i, a) in lists.iter().enumerate() {
        let ids: Vec<i32> = a.broker_ids.iter().map(|x| x.0).collect();
        // Every kaas topic has replication factor 1.
        check_replicas(&ids, registered, Some(1))?;
        if !ids.iter().any(|&id| active(id)) {
            return Err(Refusal(
                ResponseError::InvalidReplicaAssignment,
                format!(
                    "All brokers specified in the manual partition assignment for partition {} \
                     are fenced or in controlled shutdown.",
                    i64::from(first) + i as i64
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_protocol::kafka_protocol::messages::BrokerId;

    fn lists(l: &[&[i32]]) -> Vec<CreatePartitionsAssignment> {
        l.iter()
            .map(|ids| {
                let mut a = CreatePartitionsAssignment::default();
                a.broker_ids = ids.iter().map(|&i| BrokerId(i)).collect();
                a
            })
            .collect()
    }

    fn code(added: i32, l: &[&[i32]]) -> Result<(), ResponseError> {
        check_added(added, 1, &lists(l), &[0, 1], |id| id == 0).map_err(|r| r.0)
    }

    #[test]
    fn one_active_broker_per_added_partition() {
        assert_eq!(code(1, &[&[0]]), Ok(()));
        assert_eq!(code(2, &[&[0], &[0]]), Ok(()));
    }

    #[test]
    fn kafkas_refusals() {
        let bad = Err(ResponseError::InvalidReplicaAssignment);
        // Too few or too many lists for the partitions added.
        assert_eq!(code(2, &[&[0]]), bad);
        assert_eq!(code(1, &[&[0], &[0]]), bad);
        assert_eq!(code(1, &[]), bad);
        // Empty, unknown broker, a broker twice.
        assert_eq!(code(1, &[&[]]), bad);
        assert_eq!(code(1, &[&[7]]), bad);
        assert_eq!(code(1, &[&[0, 0]]), bad);
        // Two replicas where the topic has one: Kafka's "not consistent
        // with previous partitions".
        assert_eq!(code(1, &[&[0, 1]]), bad);
        // Registered but fenced.
        assert_eq!(code(1, &[&[1]]), bad);
    }
}
