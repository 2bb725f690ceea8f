//! AlterConfigs (key 33) and IncrementalAlterConfigs (key 44) for topics:
//! the catalog rewrites the topic's config file (validate_only honoured),
//! the controller publishes the new set in the next assignment and every
//! leader of the topic applies it live (see `state::apply_config_changes`);
//! the handler waits (bounded) until this broker has applied it, so the
//! client's next request through us sees it.
//!
//! BROKER resources: every kaas broker setting is a flag read at start, so
//! none can be altered dynamically: INVALID_REQUEST with a message, as Kafka
//! answers a key that is not dynamically updatable. BROKER_LOGGER likewise.

use super::{await_topic_configs, BROKER, BROKER_LOGGER, TOPIC};
use crate::api::error::ApiError;
use crate::api::{s, Reply};
use crate::state::Broker;
use kaas_actors::topic::{AlterOp, AlterTopicConfigs, ConfigChange};
use kaas_protocol::kafka_protocol::messages::{
    alter_configs_response, incremental_alter_configs_response, AlterConfigsRequest,
    AlterConfigsResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How long an alter waits for this broker to apply the new configs.
const APPLY_WAIT: Duration = Duration::from_secs(5);

/// One resource's outcome: (error code, message).
type Outcome = (i16, Option<String>);

fn refused(e: ResponseError, msg: impl Into<String>) -> Outcome {
    (e.code(), Some(msg.into()))
}

/// The incremental changes of one resource, or why they are malformed
/// (INVALID_REQUEST: an unknown operation, a null value to SET, a key
/// named twice — Kafka's rules).
fn incremental_ops(
    configs: &[(String, i8, Option<String>)],
) -> Result<Vec<(String, AlterOp)>, Outcome> {
    let mut ops = Vec::new();
    for (name, op, value) in configs {
        if ops.iter().any(|(n, _)| n == name) {
            return Err(refused(
                ResponseError::InvalidRequest,
                format!("config {name} appears more than once"),
            ));
        }
        let need = |v: &Option<String>| {
            v.clone().ok_or_else(|| {
                refused(
                    ResponseError::InvalidRequest,
                    format!("null value not supported for {name}"),
                )
            })
        };
        let op = match op {
            0 => AlterOp::Set(need(value)?),
            1 => AlterOp::Delete,
            2 => AlterOp::Append(need(value)?),
            3 => AlterOp::Subtract(need(value)?),
            o => {
                return Err(refused(
                    ResponseError::InvalidRequest,
                    format!("unknown config operation {o} for {name}"),
                ))
            }
        };
        ops.push((name.clone(), op));
    }
    Ok(ops)
}

/// The new complete set of an AlterConfigs resource.
fn replace_set(configs: &[(String, Option<String>)]) -> Result<BTreeMap<String, String>, Outcome> {
    let mut out = BTreeMap::new();
    for (name, value) in configs {
        let Some(v) = value else {
            return Err(refused(
                ResponseError::InvalidRequest,
                format!("null value not supported for {name}"),
            ));
        };
        if out.insert(name.clone(), v.clone()).is_some() {
            return Err(refused(
                ResponseError::InvalidRequest,
                format!("config {name} appears more than once"),
            ));
        }
    }
    Ok(out)
}

/// Apply one resource's change.
async fn alter_one(
    b: &Broker,
    resource_type: i8,
    name: &str,
    change: Result<ConfigChange, Outcome>,
    validate_only: bool,
) -> Outcome {
    match resource_type {
        TOPIC => {}
        BROKER | BROKER_LOGGER => {
            return refused(
                ResponseError::InvalidRequest,
                "kaas broker configs are static (flags or environment, read at start): none can be altered dynamically",
            )
        }
        t => return refused(ResponseError::InvalidRequest, format!("unsupported resource type {t}")),
    }
    let change = match change {
        Ok(c) => c,
        Err(o) => return o,
    };
    // What this change decides: every key for AlterConfigs, the keys named
    // for IncrementalAlterConfigs (another broker's concurrent alter of
    // other keys lands in the same set; see `kaas_volume::versioned`).
    let decided: Option<Vec<String>> = match &change {
        ConfigChange::Incremental(ops) => Some(ops.iter().map(|(k, _)| k.clone()).collect()),
        ConfigChange::Replace(_) => None,
    };
    let res = b
        .catalog
        .send(AlterTopicConfigs {
            name: name.to_owned(),
            change,
            validate_only,
        })
        .await;
    match res {
        Ok(Ok(stamp)) => {
            if !validate_only
                && !await_topic_configs(
                    b,
                    name,
                    stamp.topic_id,
                    &stamp.configs,
                    decided.as_deref(),
                    APPLY_WAIT,
                )
                .await
            {
                tracing::warn!(topic = %name, "configs altered; not yet applied here");
            }
            (0, None)
        }
        Ok(Err(e)) => (ApiError::from(&e).code(), Some(e.to_string())),
        Err(_) => (ApiError::catalog_gone().code(), None),
    }
}

/// IncrementalAlterConfigs: answer inline (bounded by [`APPLY_WAIT`]).
pub async fn handle_incremental(
    b: &Arc<Broker>,
    _v: i16,
    r: IncrementalAlterConfigsRequest,
) -> Reply<IncrementalAlterConfigsResponse> {
    let mut resp = IncrementalAlterConfigsResponse::default();
    for res in r.resources {
        let configs: Vec<(String, i8, Option<String>)> = res
            .configs
            .iter()
            .map(|c| {
                (
                    c.name.to_string(),
                    c.config_operation,
                    c.value.as_ref().map(|v| v.to_string()),
                )
            })
            .collect();
        let change = incremental_ops(&configs).map(ConfigChange::Incremental);
        let name = res.resource_name.to_string();
        let (code, msg) = alter_one(b, res.resource_type, &name, change, r.validate_only).await;
        let mut rr = incremental_alter_configs_response::AlterConfigsResourceResponse::default();
        rr.error_code = code;
        rr.error_message = msg.as_deref().map(s);
        rr.resource_type = res.resource_type;
        rr.resource_name = res.resource_name;
        resp.responses.push(rr);
    }
    Reply::Now(resp)
}

/// AlterConfigs: the named configs become the topic's whole set (the
/// others revert to their defaults, as in Kafka). Answer inline.
pub async fn handle(
    b: &Arc<Broker>,
    _v: i16,
    r: AlterConfigsRequest,
) -> Reply<AlterConfigsResponse> {
    let mut resp = AlterConfigsResponse::default();
    for res in r.resources {
        let configs: Vec<(String, Option<String>)> = res
            .configs
            .iter()
            .map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string())))
            .collect();
        let change = replace_set(&configs).map(ConfigChange::Replace);
        let name = res.resource_name.to_string();
        let (code, msg) = alter_one(b, res.resource_type, &name, change, r.validate_only).await;
        let mut rr = alter_configs_response::AlterConfigsResourceResponse::default();
        rr.error_code = code;
        rr.error_message = msg.as_deref().map(s);
        rr.resource_type = res.resource_type;
        rr.resource_name = res.resource_name;
        resp.responses.push(rr);
    }
    Reply::Now(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_incremental_changes_are_invalid_requests() {
        let ok = incremental_ops(&[
            ("retention.ms".into(), 0, Some("1".into())),
            ("segment.ms".into(), 1, None),
        ])
        .unwrap();
        assert_eq!(ok[0].1, AlterOp::Set("1".into()));
        assert_eq!(ok[1].1, AlterOp::Delete);
        for bad in [
            vec![("a".to_string(), 0i8, None)],
            vec![("a".to_string(), 9, Some("1".to_string()))],
            vec![
                ("a".to_string(), 1, None),
                ("a".to_string(), 0, Some("1".to_string())),
            ],
        ] {
            assert_eq!(
                incremental_ops(&bad).unwrap_err().0,
                ResponseError::InvalidRequest.code()
            );
        }
    }

    #[test]
    fn alter_configs_needs_values_and_unique_names() {
        let set = replace_set(&[("retention.ms".into(), Some("5".into()))]).unwrap();
        assert_eq!(set["retention.ms"], "5");
        assert_eq!(
            replace_set(&[("retention.ms".into(), None)]).unwrap_err().0,
            ResponseError::InvalidRequest.code()
        );
        assert_eq!(
            replace_set(&[
                ("retention.ms".into(), Some("5".into())),
                ("retention.ms".into(), Some("6".into()))
            ])
            .unwrap_err()
            .0,
            ResponseError::InvalidRequest.code()
        );
    }
}
