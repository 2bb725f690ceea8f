//! DeleteTopics (key 20): stop this broker's leaders of the topic, then
//! have the catalog rename its directory aside (the removal is re-driven).
//! No leader may (re)start for the topic meanwhile: one that did would
//! write into a renamed-aside directory.

use crate::api::error::ApiError;
use crate::api::{s, Reply};
use crate::state::Broker;
use kaas_actors::topic::DeleteTopic;
use kaas_protocol::kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kaas_protocol::kafka_protocol::messages::{
    DeleteTopicsRequest, DeleteTopicsResponse, TopicName,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;
use uuid::Uuid;

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
                b.set_deleting(&n, true);
                if b.topic(&n).is_some() {
                    b.stop_leaders(Some(&n)).await;
                }
                let res = b.catalog.send(DeleteTopic { name: n.clone() }).await;
                b.set_deleting(&n, false);
                match res {
                    Ok(Ok(stamp)) => tr.topic_id = stamp.topic_id,
                    Ok(Err(e)) => {
                        tr.error_code = ApiError::from(&e).code();
                        tr.error_message = Some(s(&e.to_string()));
                    }
                    Err(_) => tr.error_code = ApiError::catalog_gone().code(),
                }
            }
        }
        for_version(&mut tr, v);
        resp.responses.push(tr);
    }
    resp
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
