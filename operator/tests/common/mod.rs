//! Shared helpers of the operator tests: resources, a fake of the brokers'
//! admin API that changes a temp volume with the brokers' own
//! `kaas_volume::topic_dir` functions (what their controller would do).
#![allow(dead_code)]

use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kaas_operator::admin::{Admin, AdminError};
use kaas_operator::crd::{KafkaTopic, KafkaTopicSpec, KafkaTopicStatus, FINALIZER};
use kaas_protocol::kafka_protocol::messages::ApiKey;
use kaas_volume::fs::RealFs;
use kaas_volume::topic_dir;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// A KafkaTopic `name` in namespace "ns", created at second `created`.
pub fn kt(name: &str, created: i64, partitions: i32) -> KafkaTopic {
    let mut k = KafkaTopic::new(
        name,
        KafkaTopicSpec {
            topic_name: None,
            partitions,
            config: BTreeMap::new(),
        },
    );
    k.metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: Some("ns".into()),
        uid: Some(format!("uid-{name}")),
        generation: Some(1),
        resource_version: Some("1".into()),
        creation_timestamp: Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + created).unwrap(),
        )),
        ..Default::default()
    };
    k
}

/// `k` with the operator's finalizer.
pub fn finalized(mut k: KafkaTopic) -> KafkaTopic {
    k.metadata.finalizers = Some(vec![FINALIZER.into()]);
    k
}

/// `k` being deleted.
pub fn deleting(mut k: KafkaTopic) -> KafkaTopic {
    k.metadata.deletion_timestamp = k.metadata.creation_timestamp.clone();
    k
}

/// `k` with `status.topicId = id`.
pub fn owning(mut k: KafkaTopic, id: &str) -> KafkaTopic {
    k.status = Some(KafkaTopicStatus {
        topic_id: Some(id.into()),
        topic_name: Some(k.topic_name()),
        ..Default::default()
    });
    k
}

/// The brokers, as far as the operator can tell: their admin API over a
/// temp data directory, changed with the brokers' own topic_dir code.
pub struct FakeBrokers {
    pub data: PathBuf,
    pub calls: Mutex<Vec<String>>,
    /// APIs answered NotSupported.
    pub unsupported: Vec<ApiKey>,
    /// Next calls fail with a transport error while > 0.
    pub down: Mutex<u32>,
}

impl FakeBrokers {
    pub fn new(data: PathBuf) -> Self {
        Self {
            data,
            calls: Mutex::new(Vec::new()),
            unsupported: vec![ApiKey::CreatePartitions, ApiKey::IncrementalAlterConfigs],
            down: Mutex::new(0),
        }
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn enter(&self, call: String, key: ApiKey) -> Result<(), AdminError> {
        self.calls.lock().unwrap().push(call);
        let mut d = self.down.lock().unwrap();
        if *d > 0 {
            *d -= 1;
            return Err(AdminError::Transport("connection refused".into()));
        }
        if self.unsupported.contains(&key) {
            return Err(AdminError::NotSupported(key));
        }
        Ok(())
    }

    /// A topic as a client (CreateTopics) would have made it.
    pub fn client_creates(&self, name: &str, partitions: i32) -> String {
        let s =
            topic_dir::plan_create(&RealFs, &self.data, name, partitions, BTreeMap::new()).unwrap();
        topic_dir::create(&RealFs, &self.data, &s).unwrap();
        s.topic_id.to_string()
    }

    pub fn stamp_id(&self, name: &str) -> Option<String> {
        match topic_dir::read_stamp(&RealFs, &self.data.join(name)).unwrap() {
            Some(Ok(s)) => Some(s.topic_id.to_string()),
            _ => None,
        }
    }
}

fn kafka(e: topic_dir::TopicError) -> AdminError {
    AdminError::Kafka {
        code: match e {
            topic_dir::TopicError::AlreadyExists(_) => 36,
            topic_dir::TopicError::Unknown(_) => 3,
            topic_dir::TopicError::InvalidConfig(_) => 40,
            topic_dir::TopicError::InvalidPartitions(_) => 37,
            _ => 56,
        },
        message: e.to_string(),
    }
}

impl Admin for FakeBrokers {
    fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        configs: &BTreeMap<String, String>,
    ) -> BoxFuture<'_, Result<(), AdminError>> {
        let r = self
            .enter(
                format!("CreateTopics {name} {partitions}"),
                ApiKey::CreateTopics,
            )
            .and_then(|()| {
                match topic_dir::plan_create(&RealFs, &self.data, name, partitions, configs.clone())
                {
                    Ok(s) => topic_dir::create(&RealFs, &self.data, &s).map_err(kafka),
                    Err(topic_dir::TopicError::AlreadyExists(_)) => Ok(()),
                    Err(e) => Err(kafka(e)),
                }
            });
        Box::pin(async move { r })
    }

    fn create_partitions(
        &self,
        name: &str,
        partitions: i32,
    ) -> BoxFuture<'_, Result<(), AdminError>> {
        let r = self.enter(
            format!("CreatePartitions {name} {partitions}"),
            ApiKey::CreatePartitions,
        );
        Box::pin(async move { r })
    }

    fn delete_topic(&self, name: &str) -> BoxFuture<'_, Result<(), AdminError>> {
        let r = self
            .enter(format!("DeleteTopics {name}"), ApiKey::DeleteTopics)
            // The brokers' delete: the request, then (the controller, once
            // every partition is let go) the rename aside.
            .and_then(
                |()| match topic_dir::request_delete(&RealFs, &self.data, name, None) {
                    Ok(s) => topic_dir::delete_incarnation(&RealFs, &self.data, name, s.topic_id)
                        .map(|_| ())
                        .map_err(|e| kafka(topic_dir::TopicError::from(e))),
                    Err(topic_dir::TopicError::Unknown(_)) => Ok(()),
                    Err(e) => Err(kafka(e)),
                },
            );
        Box::pin(async move { r })
    }

    fn delete_incarnation(
        &self,
        name: &str,
        id: uuid::Uuid,
    ) -> BoxFuture<'_, Result<(), AdminError>> {
        let r = self
            .enter(format!("DeleteTopics {name} {id}"), ApiKey::DeleteTopics)
            .and_then(
                |()| match topic_dir::request_delete(&RealFs, &self.data, name, Some(id)) {
                    Ok(_) => topic_dir::delete_incarnation(&RealFs, &self.data, name, id)
                        .map(|_| ())
                        .map_err(|e| kafka(topic_dir::TopicError::from(e))),
                    Err(topic_dir::TopicError::Unknown(_)) => Ok(()),
                    Err(e) => Err(kafka(e)),
                },
            );
        Box::pin(async move { r })
    }

    fn alter_configs(
        &self,
        name: &str,
        _configs: &BTreeMap<String, String>,
        _removed: &[String],
    ) -> BoxFuture<'_, Result<(), AdminError>> {
        let r = self.enter(
            format!("IncrementalAlterConfigs {name}"),
            ApiKey::IncrementalAlterConfigs,
        );
        Box::pin(async move { r })
    }
}
