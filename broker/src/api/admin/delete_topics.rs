//! DeleteTopics (key 20), through the controller: the catalog writes the
//! topic's `.delete-requested-<id>`; the controller vacates every partition
//! two-phase (each leader stops, fsyncs, closes and reports) and only then
//! renames the directory aside. The answer waits (up to the request's
//! timeout) until the directory no longer holds that incarnation, so once a
//! client is told "deleted", no leader of it acknowledges anything and a
//! re-create under the same name starts a new, empty incarnation. On
//! timeout the answer is REQUEST_TIMED_OUT and the delete goes on, as in
//! Kafka.

use crate::api::admin::Mutations;
use crate::api::error::ApiError;
use crate::api::{s, Reply};
use crate::state::Broker;
use kaas_actors::topic::RequestDelete;
use kaas_protocol::kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kaas_protocol::kafka_protocol::messages::{
    DeleteTopicsRequest, DeleteTopicsResponse, TopicName,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The longest a DeleteTopics answer waits for the removal.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Answer inline.
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: DeleteTopicsRequest,
) -> Reply<DeleteTopicsResponse> {
    Reply::Now(delete_topics(b, r, v).await)
}

/// Blank what version `v` does not carry: the topic id from v6, the
/// message from v5.
fn for_version(tr: &mut DeletableTopicResult, v: i16) {
    if v < 6 {
        tr.topic_id = Uuid::nil();
    }
    if v < 5 {
        tr.error_message = None;
    }
}

/// The topics a request names: by name (`topic_names`, v0-v5) and by name
/// or id (`topics`, v6+).
fn targets(r: &DeleteTopicsRequest) -> Vec<(Option<String>, Uuid)> {
    let mut targets: Vec<(Option<String>, Uuid)> = r
        .topic_names
        .iter()
        .map(|n| (Some(n.0.to_string()), Uuid::nil()))
        .collect();
    for t in &r.topics {
        targets.push((t.name.as_ref().map(|n| n.0.to_string()), t.topic_id));
    }
    targets
}

async fn delete_topics(b: &Arc<Broker>, r: DeleteTopicsRequest, v: i16) -> DeleteTopicsResponse {
    let mut resp = DeleteTopicsResponse::default();
    // Every request first, then one wait for all of them.
    let mut asked: Vec<(usize, String, Uuid)> = Vec::new();
    // KIP-599: a deleted topic's partitions count; THROTTLING_QUOTA_EXCEEDED from v5.
    let mutations = Mutations::new(b, v, 5);
    for (name, id) in targets(&r) {
        let mut tr = DeletableTopicResult::default();
        tr.name = name.clone().map(|n| TopicName(s(&n)));
        tr.topic_id = id;
        let name = match name {
            Some(n) => Some(n),
            None => b.topic_by_id(&id).map(|t| t.name),
        };
        match name {
            None => tr.error_code = ResponseError::UnknownTopicId.code(),
            Some(n) => {
                tr.name = Some(TopicName(s(&n)));
                let partitions = b.topic(&n).map_or(0, |t| i64::from(t.partitions));
                if let Err(e) = mutations.admit(partitions) {
                    tracing::info!(topic = %n, reason = %e, "topic deletion refused");
                    tr.error_code = ApiError::from(&e).code();
                    tr.error_message = Some(s(&e.to_string()));
                    resp.responses.push(tr);
                    continue;
                }
                let id = (!id.is_nil()).then_some(id);
                let res = b
                    .catalog
                    .send(RequestDelete {
                        name: n.clone(),
                        id,
                    })
                    .await;
                match res {
                    Ok(Ok(stamp)) => {
                        tr.topic_id = stamp.topic_id;
                        asked.push((resp.responses.len(), n, stamp.topic_id));
                    }
                    Ok(Err(e)) => {
                        tr.error_code = ApiError::from(&e).code();
                        tr.error_message = Some(s(&e.to_string()));
                    }
                    Err(_) => tr.error_code = ApiError::catalog_gone().code(),
                }
            }
        }
        resp.responses.push(tr);
    }
    if !asked.is_empty() {
        if let Some(c) = b.controller.get() {
            c.do_send(kaas_actors::cluster::controller::ReconcileNow);
        }
        let wait = Duration::from_millis(r.timeout_ms.max(0) as u64).min(MAX_WAIT);
        let deadline = Instant::now() + wait;
        for (i, name, id) in asked {
            if !removed(b, &name, id, deadline).await {
                let tr = &mut resp.responses[i];
                tr.error_code = ResponseError::RequestTimedOut.code();
                tr.error_message = Some(s("deletion in progress: partitions are being released"));
            }
        }
    }
    for tr in resp.responses.iter_mut() {
        for_version(tr, v);
    }
    resp.throttle_time_ms = mutations.throttle_ms();
    resp
}

/// Wait until the directory `name` no longer holds incarnation `id` (the
/// controller renamed it aside), or `deadline`.
async fn removed(b: &Broker, name: &str, id: Uuid, deadline: Instant) -> bool {
    crate::api::poll_until(deadline, || async {
        !b.topic_incarnation_on_volume(name, id).await
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_protocol::kafka_protocol::messages::delete_topics_request::DeleteTopicState;

    #[test]
    fn id_from_v6_message_from_v5() {
        let mut tr = DeletableTopicResult::default();
        tr.topic_id = Uuid::from_u128(9);
        tr.error_message = Some(s("m"));
        for_version(&mut tr, 6);
        assert!(!tr.topic_id.is_nil());
        assert!(tr.error_message.is_some());
        for_version(&mut tr, 5);
        assert!(tr.topic_id.is_nil());
        assert!(tr.error_message.is_some());
        for_version(&mut tr, 4);
        assert!(tr.error_message.is_none());
    }

    #[test]
    fn names_and_ids_are_both_targets() {
        let mut r = DeleteTopicsRequest::default();
        r.topic_names = vec![TopicName(s("a"))];
        let mut st = DeleteTopicState::default();
        st.topic_id = Uuid::from_u128(3);
        r.topics = vec![st];
        assert_eq!(
            targets(&r),
            vec![
                (Some("a".to_string()), Uuid::nil()),
                (None, Uuid::from_u128(3))
            ]
        );
    }
}
