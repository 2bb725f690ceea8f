//! DescribeConfigs (key 32) as Kafka answers it (KIP-226, KIP-569): every
//! entry with its type, source, read-only flag, and — when asked — its
//! synonyms and documentation. Topics: the configs kaas implements, the
//! topic's overrides as DYNAMIC_TOPIC_CONFIG, the rest at the broker's
//! value (read from the volume, so an alter made through any broker is seen
//! at once). The broker resource: this broker's real configuration (all
//! static, so read-only); another broker's id is INVALID_REQUEST, as Kafka
//! answers a request sent to the wrong broker.

use super::{broker_entries, read_topic, topic_entries, Entry, BROKER, BROKER_LOGGER, TOPIC};
use crate::api::{s, Reply};
use crate::state::Broker;
use kaas_protocol::kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kaas_protocol::kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Answer inline (topic configs are two small reads by exact name).
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: DescribeConfigsRequest,
) -> Reply<DescribeConfigsResponse> {
    let mut resp = DescribeConfigsResponse::default();
    for res in r.resources {
        let mut rr = DescribeConfigsResult::default();
        rr.resource_type = res.resource_type;
        rr.resource_name = res.resource_name.clone();
        let name = res.resource_name.to_string();
        let entries = match res.resource_type {
            TOPIC => match read_topic(b, &name).await {
                Some(t) => Ok(topic_entries(b, &t.configs)),
                None => Err((
                    ResponseError::UnknownTopicOrPartition,
                    format!("topic {name} does not exist"),
                )),
            },
            BROKER => broker_resource(b.args.broker_id, &name).map(|()| broker_entries(b)),
            BROKER_LOGGER => Err((
                ResponseError::InvalidRequest,
                "broker loggers are not configurable in kaas".to_owned(),
            )),
            t => Err((
                ResponseError::InvalidRequest,
                format!("unsupported resource type {t}"),
            )),
        };
        match entries {
            Err((e, msg)) => {
                rr.error_code = e.code();
                rr.error_message = Some(s(&msg));
            }
            Ok(list) => {
                for e in list {
                    if let Some(keys) = &res.configuration_keys {
                        if !keys.iter().any(|x| x.as_str() == e.name) {
                            continue;
                        }
                    }
                    rr.configs
                        .push(to_wire(e, r.include_synonyms, r.include_documentation, v));
                }
            }
        }
        resp.results.push(rr);
    }
    Reply::Now(resp)
}

/// Whether the BROKER resource `name` is this broker: its id, or "" (the
/// cluster-wide default, which for kaas is the same static set). Anything
/// else is INVALID_REQUEST, as Kafka answers a broker resource sent to
/// another broker.
fn broker_resource(me: i32, name: &str) -> Result<(), (ResponseError, String)> {
    match name.parse::<i32>() {
        _ if name.is_empty() => Ok(()),
        Ok(id) if id == me => Ok(()),
        _ => Err((
            ResponseError::InvalidRequest,
            format!(
                "broker resource {name:?} is not this broker ({}); send it to that broker",
                me
            ),
        )),
    }
}

/// One entry on the wire: synonyms only when asked (v1+), documentation
/// only when asked (v3+); config_type (v3+) always. v0 (sarama 1.x sends
/// it whatever its configured version) has `is_default` in place of the
/// source: true for an entry at its default, as the field is documented.
/// (Kafka 3.x brokers left it false for every entry, a bug a client
/// cannot rely on either way.)
fn to_wire(e: Entry, synonyms: bool, doc: bool, v: i16) -> DescribeConfigsResourceResult {
    let mut c = DescribeConfigsResourceResult::default();
    c.name = s(&e.name);
    c.value = Some(s(&e.value));
    c.read_only = e.read_only;
    c.is_default = v == 0 && e.source == super::DEFAULT_CONFIG;
    c.config_source = e.source;
    c.is_sensitive = false;
    c.documentation = None;
    if synonyms {
        c.synonyms = e
            .synonyms
            .iter()
            .map(|(n, val, src)| {
                let mut y = DescribeConfigsSynonym::default();
                y.name = s(n);
                y.value = Some(s(val));
                y.source = *src;
                y
            })
            .collect();
    }
    if v >= 3 {
        c.config_type = e.kind.code();
        if doc {
            c.documentation = Some(s(e.doc));
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::super::{DEFAULT_CONFIG, DYNAMIC_TOPIC_CONFIG};
    use super::*;
    use kaas_volume::topic_config::ConfigType;

    fn entry() -> Entry {
        Entry {
            name: "retention.bytes".into(),
            value: "10".into(),
            source: DYNAMIC_TOPIC_CONFIG,
            kind: ConfigType::Long,
            read_only: false,
            synonyms: vec![
                ("retention.bytes".into(), "10".into(), DYNAMIC_TOPIC_CONFIG),
                ("log.retention.bytes".into(), "-1".into(), DEFAULT_CONFIG),
            ],
            doc: "d",
        }
    }

    /// Catches: another broker's id answered with this broker's config.
    #[test]
    fn another_brokers_resource_is_an_invalid_request() {
        assert!(broker_resource(2, "2").is_ok());
        assert!(broker_resource(2, "").is_ok());
        for other in ["0", "3", "x"] {
            assert_eq!(
                broker_resource(2, other).unwrap_err().0.code(),
                ResponseError::InvalidRequest.code()
            );
        }
    }

    /// Catches: config_type left UNKNOWN (kafka-python's describe_configs
    /// test wants retention.bytes as LONG), synonyms or documentation sent
    /// when not asked for.
    #[test]
    fn type_always_synonyms_and_docs_on_request() {
        let c = to_wire(entry(), false, false, 4);
        assert_eq!(c.config_type, 5);
        assert_eq!(c.config_source, 1);
        assert!(c.synonyms.is_empty() && c.documentation.is_none());
        let c = to_wire(entry(), true, true, 4);
        assert_eq!(c.synonyms.len(), 2);
        assert_eq!(c.synonyms[1].source, DEFAULT_CONFIG);
        assert_eq!(c.documentation.as_deref(), Some("d"));
        // v1-v2 carry neither the type nor documentation.
        let c = to_wire(entry(), true, true, 2);
        assert_eq!((c.config_type, c.documentation), (0, None));
    }
}
