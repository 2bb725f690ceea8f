//! Topic administration APIs: CreateTopics, DeleteTopics, CreatePartitions,
//! DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, DeleteRecords,
//! DescribeLogDirs, ElectLeaders and the (refused / empty) partition
//! reassignment APIs. Topic directories and config files are written only
//! by the `TopicCatalog` actor; these handlers send it messages.
//!
//! Config entries are built here once ([`topic_entries`],
//! [`broker_entries`]) with what DescribeConfigs reports for each (KIP-569
//! type, source, synonyms, documentation) and CreateTopics reuses.

pub mod alter_configs;
pub mod client_quotas;
pub mod create_partitions;
pub mod create_topics;
pub mod delete_records;
pub mod delete_topics;
pub mod describe_configs;
pub mod describe_log_dirs;
pub mod elect_leaders;
pub mod reassignments;

use crate::state::Broker;
use kaas_actors::topic::TopicStamp;
use kaas_volume::topic_config::{ConfigType, TOPIC_KEYS};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Resource types (ConfigResource.Type).
pub(crate) const TOPIC: i8 = 2;
/// See [`TOPIC`].
pub(crate) const BROKER: i8 = 4;
/// See [`TOPIC`].
pub(crate) const BROKER_LOGGER: i8 = 8;

/// Config sources (DescribeConfigs v1+).
pub(crate) const DYNAMIC_TOPIC_CONFIG: i8 = 1;
/// See [`DYNAMIC_TOPIC_CONFIG`].
pub(crate) const STATIC_BROKER_CONFIG: i8 = 4;
/// See [`DYNAMIC_TOPIC_CONFIG`].
pub(crate) const DEFAULT_CONFIG: i8 = 5;

/// One config as DescribeConfigs reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub name: String,
    pub value: String,
    pub source: i8,
    pub kind: ConfigType,
    pub read_only: bool,
    /// (name, value, source), most specific first, the entry itself included.
    pub synonyms: Vec<(String, String, i8)>,
    pub doc: &'static str,
}

/// A broker-level value: STATIC_BROKER_CONFIG when the flags set it away
/// from Kafka's built-in default, DEFAULT_CONFIG otherwise.
fn broker_source(value: &str, kafka_default: &str) -> i8 {
    if value == kafka_default {
        DEFAULT_CONFIG
    } else {
        STATIC_BROKER_CONFIG
    }
}

/// The broker-level value a topic key falls back to, and Kafka's built-in
/// default for it.
fn topic_default(b: &Broker, key: &str) -> (String, &'static str) {
    let a = &b.args;
    match key {
        "cleanup.policy" => ("delete".into(), "delete"),
        "compression.type" => ("producer".into(), "producer"),
        "compression.gzip.level" => ("-1".into(), "-1"),
        "compression.lz4.level" => ("9".into(), "9"),
        "compression.zstd.level" => ("3".into(), "3"),
        "max.message.bytes" => (a.message_max_bytes.to_string(), "1048588"),
        "message.timestamp.after.max.ms" | "message.timestamp.before.max.ms" => {
            (i64::MAX.to_string(), "9223372036854775807")
        }
        "message.timestamp.type" => ("CreateTime".into(), "CreateTime"),
        "min.insync.replicas" => ("1".into(), "1"),
        "retention.bytes" => (a.retention_bytes.to_string(), "-1"),
        "retention.ms" => (a.retention_ms.to_string(), "604800000"),
        "segment.bytes" => (a.segment_bytes.to_string(), "1073741824"),
        "segment.ms" => (a.segment_ms.to_string(), "604800000"),
        _ => (String::new(), ""),
    }
}

/// Every topic config kaas implements for topic `configs` (the set in
/// force): overrides as DYNAMIC_TOPIC_CONFIG, the rest at the broker's
/// value.
pub(crate) fn topic_entries(b: &Broker, configs: &BTreeMap<String, String>) -> Vec<Entry> {
    TOPIC_KEYS
        .iter()
        .map(|k| {
            let (dflt, kafka_dflt) = topic_default(b, k.name);
            let dsource = broker_source(&dflt, kafka_dflt);
            let mut synonyms = Vec::new();
            let (value, source) = match configs.get(k.name) {
                Some(v) => {
                    synonyms.push((k.name.to_owned(), v.clone(), DYNAMIC_TOPIC_CONFIG));
                    (v.clone(), DYNAMIC_TOPIC_CONFIG)
                }
                None => (dflt.clone(), dsource),
            };
            synonyms.push((k.broker_key.to_owned(), dflt, dsource));
            Entry {
                name: k.name.to_owned(),
                value,
                source,
                kind: k.kind,
                read_only: false,
                synonyms,
                doc: k.doc,
            }
        })
        .collect()
}

/// The broker's configuration as DescribeConfigs reports it: everything
/// comes from flags (or their environment variables) and nothing can be
/// altered while it runs, so every entry is read-only.
pub(crate) fn broker_entries(b: &Broker) -> Vec<Entry> {
    use ConfigType::{Boolean, Int, List, Long, Short};
    let a = &b.args;
    let (host, port) = a.advertised();
    let rows: Vec<(&str, std::string::String, &str, ConfigType, &'static str)> = vec![
        ("broker.id", a.broker_id.to_string(), "-1", Int, "This broker's id (--broker-id)."),
        ("node.id", a.broker_id.to_string(), "-1", Int, "Same as broker.id."),
        ("listeners", format!("PLAINTEXT://{}", a.listen), "PLAINTEXT://:9092", List, "The address the Kafka listener binds (--listen)."),
        ("advertised.listeners", format!("PLAINTEXT://{host}:{port}"), "", List, "The address clients are told to connect to (--advertised-listener)."),
        ("log.dirs", a.data_dir.display().to_string(), "/tmp/kafka-logs", ConfigType::String, "The shared data directory holding every partition (--data-dir)."),
        ("kaas.cluster.dir", a.cluster_dir().display().to_string(), "", ConfigType::String, "The cluster-state directory: controller epochs, assignment, broker records, group offsets (--cluster-dir)."),
        ("num.partitions", a.default_partitions.to_string(), "1", Int, "Partitions of auto-created topics (--default-partitions)."),
        ("default.replication.factor", "1".into(), "1", Short, "kaas keeps one copy on the shared volume."),
        ("auto.create.topics.enable", a.auto_create_topics.to_string(), "true", Boolean, "Create a topic a Metadata request names (--auto-create-topics)."),
        ("log.retention.ms", a.retention_ms.to_string(), "604800000", Long, "Default retention.ms (--retention-ms)."),
        ("log.retention.bytes", a.retention_bytes.to_string(), "-1", Long, "Default retention.bytes (--retention-bytes)."),
        ("log.segment.bytes", a.segment_bytes.to_string(), "1073741824", Int, "Default segment.bytes (--segment-bytes)."),
        ("log.roll.ms", a.segment_ms.to_string(), "604800000", Long, "Default segment.ms (--segment-ms)."),
        ("log.retention.check.interval.ms", a.retention_check_interval_ms.to_string(), "300000", Long, "How often each leader checks retention (--retention-check-interval-ms)."),
        ("log.cleanup.policy", "delete".into(), "delete", List, "Only delete is implemented."),
        ("log.message.timestamp.type", "CreateTime".into(), "CreateTime", ConfigType::String, "CreateTime (the default of every topic; a topic may set LogAppendTime)."),
        ("message.max.bytes", a.message_max_bytes.to_string(), "1048588", Int, "Default max.message.bytes (--message-max-bytes)."),
        ("socket.request.max.bytes", a.max_request_bytes.to_string(), "104857600", Int, "Largest request frame accepted (--max-request-bytes)."),
        ("max.connections", a.max_connections.to_string(), "2147483647", Int, "Connections beyond this are refused (--max-connections)."),
        ("connections.max.idle.ms", a.idle_timeout_ms.to_string(), "600000", Long, "Idle connections are closed after this (--idle-timeout-ms)."),
        ("offsets.topic.num.partitions", a.group_shards.to_string(), "50", Int, "Consumer-group coordinator shards, fixed at cluster creation (--group-shards)."),
        ("offsets.retention.minutes", a.offsets_retention_minutes.to_string(), "10080", Int, "How long committed offsets of an empty group are kept (--offsets-retention-minutes)."),
        ("group.initial.rebalance.delay.ms", a.group_initial_rebalance_delay_ms.to_string(), "3000", Int, "How long a new group's first rebalance waits for members (--group-initial-rebalance-delay-ms)."),
        ("group.min.session.timeout.ms", a.group_min_session_timeout_ms.to_string(), "6000", Int, "The shortest session timeout a classic consumer may ask for (--group-min-session-timeout-ms)."),
        ("group.max.session.timeout.ms", a.group_max_session_timeout_ms.to_string(), "1800000", Int, "The longest session timeout a classic consumer may ask for (--group-max-session-timeout-ms)."),
        ("min.insync.replicas", "1".into(), "1", Int, "kaas keeps one copy on the shared volume."),
    ];
    rows.into_iter()
        .map(|(name, value, kafka_dflt, kind, doc)| {
            let source = if name == "broker.id" || name == "node.id" {
                STATIC_BROKER_CONFIG
            } else {
                broker_source(&value, kafka_dflt)
            };
            Entry {
                name: name.to_owned(),
                synonyms: vec![(name.to_owned(), value.clone(), source)],
                value,
                source,
                kind,
                read_only: true,
                doc,
            }
        })
        .collect()
}

/// The stamp of topic `name` with its configs in force, read from the
/// volume by exact name (so a client reads its own alter through any
/// broker), on the blocking pool; `None` if it has no stamp or the read
/// failed (then the assignment's view answers).
pub(crate) async fn read_topic(b: &Broker, name: &str) -> Option<TopicStamp> {
    if kaas_actors::topic::validate_name(name).is_err() {
        return None;
    }
    let fs = b.fs.clone();
    let dir = b.args.data_dir.join(name);
    let read =
        tokio::task::spawn_blocking(move || kaas_volume::topic_config::read_topic_with(&fs, &dir))
            .await;
    match read {
        Ok(Ok(s)) => s,
        _ => b.topic(name),
    }
}

/// After an alter: ask the controller to publish it, then wait (bounded)
/// until this broker has applied an assignment carrying `configs` for the
/// topic (only the `keys` the alter decided, when given: a concurrent alter
/// of other keys through another broker may be in the same set), so the
/// client's next produce through us sees them.
pub(crate) async fn await_topic_configs(
    b: &Broker,
    name: &str,
    id: Uuid,
    configs: &BTreeMap<String, String>,
    keys: Option<&[String]>,
    timeout: Duration,
) -> bool {
    if let Some(c) = b.controller.get() {
        c.do_send(kaas_actors::cluster::controller::ReconcileNow);
    }
    crate::api::poll_until(Instant::now() + timeout, || async {
        b.assignment().topics.get(name).is_some_and(|t| {
            t.topic_id == id
                && match keys {
                    None => &t.configs == configs,
                    Some(keys) => keys.iter().all(|k| t.configs.get(k) == configs.get(k)),
                }
        })
    })
    .await
}

/// KIP-599's partition mutation quota ([`crate::limits::MutationQuota`])
/// for one CreateTopics, CreatePartitions or DeleteTopics request. From
/// the version that knows THROTTLING_QUOTA_EXCEEDED (`strict`), a topic
/// asked for while the quota is in debt is refused with it; an older
/// version has no such error, so its topics are all served and the
/// connection is muted for the throttle time after the answer goes out, as
/// Kafka does. Either way the answer's throttle_time_ms says how long to
/// back off.
pub(crate) struct Mutations<'a> {
    b: &'a Broker,
    strict: bool,
}

impl<'a> Mutations<'a> {
    /// For a request of version `v`; `strict_from` is the first version
    /// that knows THROTTLING_QUOTA_EXCEEDED.
    pub(crate) fn new(b: &'a Broker, v: i16, strict_from: i16) -> Self {
        Self {
            b,
            strict: v >= strict_from,
        }
    }

    /// Count `partitions` mutations of one topic, or refuse them (strict).
    pub(crate) fn admit(&self, partitions: i64) -> Result<(), crate::limits::LimitError> {
        let mut q = self.b.mutations.lock().unwrap();
        if self.strict {
            q.admit(partitions, Instant::now())
        } else {
            q.record(partitions, Instant::now());
            Ok(())
        }
    }

    /// The answer's throttle_time_ms; for an older version the connection
    /// is also muted that long after the answer (at most
    /// [`crate::quota::MAX_THROTTLE`]).
    pub(crate) fn throttle_ms(&self) -> i32 {
        let wait = self.b.mutations.lock().unwrap().throttle(Instant::now());
        let wait = wait.min(crate::quota::MAX_THROTTLE);
        if !self.strict && !wait.is_zero() {
            if let Some(count) = super::warn_for_peer(self.b, "mutation rate exceeded") {
                tracing::info!(peer = %super::peer_name(), throttle_ms = crate::limits::throttle_ms(wait), count, "partition mutation rate exceeded by a client too old for THROTTLING_QUOTA_EXCEEDED; served, then muted");
            }
            super::hold_connection(wait);
        }
        crate::limits::throttle_ms(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_sources() {
        assert_eq!(broker_source("1", "1"), DEFAULT_CONFIG);
        assert_eq!(broker_source("2", "1"), STATIC_BROKER_CONFIG);
    }
}
