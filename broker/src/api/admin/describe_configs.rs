//! DescribeConfigs (key 32): topic configs (explicit ones as dynamic, the
//! rest as defaults) and a few read-only broker settings.

use crate::api::admin::topic_configs;
use crate::api::{s, Reply};
use crate::state::Broker;
use kaas_protocol::kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kaas_protocol::kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Resource types (ConfigResource.Type).
const TOPIC: i8 = 2;
const BROKER: i8 = 4;

/// Config sources.
const DYNAMIC_TOPIC_CONFIG: i8 = 1;
const STATIC_BROKER_CONFIG: i8 = 4;
const DEFAULT_CONFIG: i8 = 5;

/// Where a config value comes from, as DescribeConfigs reports it.
fn config_source(resource_type: i8, is_default: bool) -> i8 {
    match (resource_type, is_default) {
        (BROKER, _) => STATIC_BROKER_CONFIG,
        (_, true) => DEFAULT_CONFIG,
        (_, false) => DYNAMIC_TOPIC_CONFIG,
    }
}

/// Answer inline from the metadata cache and the flags.
pub async fn handle(
    b: &Arc<Broker>,
    _v: i16,
    r: DescribeConfigsRequest,
) -> Reply<DescribeConfigsResponse> {
    let mut resp = DescribeConfigsResponse::default();
    for res in r.resources {
        let mut rr = DescribeConfigsResult::default();
        rr.resource_type = res.resource_type;
        rr.resource_name = res.resource_name.clone();
        let entries: Option<Vec<(String, String, bool)>> = match res.resource_type {
            TOPIC => b.topic(&res.resource_name).map(|t| topic_configs(b, &t)),
            BROKER => Some(broker_configs(b)),
            _ => None,
        };
        match entries {
            None if res.resource_type == TOPIC => {
                rr.error_code = ResponseError::UnknownTopicOrPartition.code();
            }
            None => {
                rr.error_code = ResponseError::InvalidRequest.code();
                rr.error_message = Some(s("unsupported resource type"));
            }
            Some(list) => {
                for (k, v, dflt) in list {
                    if let Some(keys) = &res.configuration_keys {
                        if !keys.iter().any(|x| x.as_str() == k) {
                            continue;
                        }
                    }
                    let mut c = DescribeConfigsResourceResult::default();
                    c.name = s(&k);
                    c.value = Some(s(&v));
                    c.read_only = res.resource_type == BROKER;
                    c.config_source = config_source(res.resource_type, dflt);
                    rr.configs.push(c);
                }
            }
        }
        resp.results.push(rr);
    }
    Reply::Now(resp)
}

fn broker_configs(b: &Broker) -> Vec<(String, String, bool)> {
    vec![
        (
            "log.dirs".into(),
            b.args.data_dir.display().to_string(),
            false,
        ),
        (
            "auto.create.topics.enable".into(),
            b.args.auto_create_topics.to_string(),
            false,
        ),
        (
            "num.partitions".into(),
            b.args.default_partitions.to_string(),
            false,
        ),
        (
            "socket.request.max.bytes".into(),
            b.args.max_request_bytes.to_string(),
            false,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources() {
        assert_eq!(config_source(BROKER, true), 4);
        assert_eq!(config_source(BROKER, false), 4);
        assert_eq!(config_source(TOPIC, true), 5);
        assert_eq!(config_source(TOPIC, false), 1);
    }
}
