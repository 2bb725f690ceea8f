//! CreateTopics (key 19): the catalog creates and stamps the directories,
//! then (bounded) the handler waits for the controller to grant leaders so
//! the client's next request finds one.
//!
//! kaas keeps one copy on the shared volume: replication factor 1 or -1
//! only, no manual replica assignment.

use crate::api::admin::{topic_entries, Mutations};
use crate::api::error::ApiError;
use crate::api::{await_topic_ready, s, Reply};
use crate::state::Broker;
use kaas_actors::topic::CreateTopic;
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
        let partitions = if t.num_partitions == -1 {
            b.args.default_partitions
        } else {
            t.num_partitions
        };
        let fail = |tr: &mut CreatableTopicResult, e: ApiError, msg: Option<String>| {
            tr.error_code = e.code();
            tr.error_message = msg.as_deref().map(s);
        };
        if !t.assignments.is_empty() {
            fail(
                &mut tr,
                ResponseError::InvalidRequest.into(),
                Some("manual replica assignment is not supported".into()),
            );
        } else if !matches!(t.replication_factor, -1 | 1) {
            fail(
                &mut tr,
                ResponseError::InvalidReplicationFactor.into(),
                Some(
                    "kaas keeps one copy on the shared volume: use replication factor 1 or -1"
                        .into(),
                ),
            );
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

#[cfg(test)]
mod tests {
    use super::*;

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
