//! Topic administration APIs: CreateTopics, DeleteTopics, DescribeConfigs
//! (and next AlterConfigs, CreatePartitions, DeleteRecords...). Topic
//! directories are written only by the `TopicCatalog` actor; these handlers
//! send it messages.

pub mod create_topics;
pub mod delete_topics;
pub mod describe_configs;

use crate::state::Broker;
use kaas_actors::topic::TopicStamp;

/// (name, value, is_default) for every topic config kaas implements.
pub(crate) fn topic_configs(b: &Broker, t: &TopicStamp) -> Vec<(String, String, bool)> {
    let cfg = b.log_config(t);
    let mut out = vec![
        ("cleanup.policy".to_string(), "delete".to_string()),
        ("segment.bytes".into(), cfg.segment_bytes.to_string()),
        ("segment.ms".into(), cfg.segment_ms.to_string()),
        ("retention.ms".into(), cfg.retention_ms.to_string()),
        ("retention.bytes".into(), cfg.retention_bytes.to_string()),
        ("message.timestamp.type".into(), "CreateTime".into()),
        (
            "max.message.bytes".into(),
            b.args.max_request_bytes.to_string(),
        ),
    ];
    for (k, v) in &t.configs {
        if !out.iter().any(|(n, _)| n == k) {
            out.push((k.clone(), v.clone()));
        }
    }
    out.into_iter()
        .map(|(k, v)| {
            let explicit = t.configs.contains_key(&k);
            (k, v, !explicit)
        })
        .collect()
}
