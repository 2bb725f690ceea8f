//! CreatePartitions (key 37): grow a topic. The catalog rewrites the
//! topic's stamp with the new count (same id); the controller grants the
//! new partitions on its next pass like any other (they start above any
//! epoch found in their directories), and the handler waits (bounded by the
//! request timeout) until this broker's metadata shows them led.
//!
//! Only growth (INVALID_PARTITIONS for a count not above the current one),
//! within the partition limits (POLICY_VIOLATION), no manual assignment
//! (one copy on the shared volume: INVALID_REQUEST), validate_only honoured.

use super::{read_topic, Mutations};
use crate::api::error::ApiError;
use crate::api::{s, Reply};
use crate::state::Broker;
use kaas_actors::topic::GrowTopic;
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
        if t.assignments.as_ref().is_some_and(|a| !a.is_empty()) {
            fail(
                ResponseError::InvalidRequest.into(),
                "manual replica assignment is not supported: kaas keeps one copy on the shared volume"
                    .into(),
            );
            resp.results.push(tr);
            continue;
        }
        let Some(current) = read_topic(b, &name).await else {
            fail(
                ResponseError::UnknownTopicOrPartition.into(),
                format!("topic {name} does not exist"),
            );
            resp.results.push(tr);
            continue;
        };
        let added = t.count.saturating_sub(current.partitions);
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
