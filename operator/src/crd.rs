//! The `KafkaTopic` custom resource (group `kaas.io`), laid out as Strimzi
//! users know it: `spec.partitions`, `spec.config`, optional
//! `spec.topicName`; `status.topicId`, `status.conditions`,
//! `status.observedGeneration`.
//!
//! The CRD YAML under `deploy/` and in the chart is generated from these
//! types by the `crdgen` binary; `tests/crd_drift.rs` fails when they differ.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Annotation that takes a resource out of the operator's hands: it is
/// neither reconciled nor deleted on the brokers (its finalizer is removed).
pub const UNMANAGED_ANNOTATION: &str = "kaas.io/managed";

/// Finalizer that drives a topic's deletion through DeleteTopics.
pub const FINALIZER: &str = "kaas.io/topic-deletion";

/// Desired state of a Kafka topic.
///
/// The API server refuses what the operator can never do (CEL transition
/// rules in the CRD): a partition count below the current one, and a
/// changed or removed `spec.topicName` (a rename is a new topic).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "kaas.io",
    version = "v1alpha1",
    kind = "KafkaTopic",
    namespaced,
    status = "KafkaTopicStatus",
    // Not `kt`: Strimzi's KafkaTopic has it, and both may be installed.
    shortname = "ktopic",
    category = "kaas",
    printcolumn = r#"{"name":"Topic","type":"string","jsonPath":".status.topicName"}"#,
    printcolumn = r#"{"name":"Partitions","type":"integer","jsonPath":".spec.partitions"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Topic ID","type":"string","priority":1,"jsonPath":".status.topicId"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.partitions >= oldSelf.partitions").message("partitions cannot be decreased: Kafka never removes partitions"),
    validation = Rule::new("has(self.topicName) == has(oldSelf.topicName) && (!has(self.topicName) || self.topicName == oldSelf.topicName)").message("topicName is immutable: a rename is a new topic (create a new resource)")
)]
pub struct KafkaTopicSpec {
    /// Kafka topic name; defaults to `metadata.name`. Immutable in effect:
    /// changing it is reported NotSupported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 249),
        regex(pattern = r"^[a-zA-Z0-9_-][a-zA-Z0-9._-]*$")
    )]
    pub topic_name: Option<String>,
    /// Partition count. Kafka never removes partitions: a decrease is
    /// reported NotSupported and the topic keeps its partitions.
    #[schemars(range(min = 1, max = 100000))]
    pub partitions: i32,
    /// Topic configs (Kafka names, string values), validated against what
    /// kaas implements (`kaas_volume::topic_dir::validate_configs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, String>,
}

/// Observed state, written by the operator only.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KafkaTopicStatus {
    /// The topic's KIP-516 id, read from the topic directory's stamp
    /// (`.topic-id.json`): the incarnation this resource owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<String>,
    /// The Kafka topic name this resource manages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_name: Option<String>,
    /// Partitions the topic has on the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<i32>,
    /// `metadata.generation` of the spec last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` with a reason (Ready, Creating, NotSupported,
    /// ResourceConflict, InvalidSpec, IncarnationMismatch, KafkaError,
    /// Unmanaged). A list-map keyed by `type`, as `metav1.Condition`
    /// lists are: server-side apply merges a condition by its type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A status condition (the shape of `metav1.Condition`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type; the operator writes `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable detail.
    #[serde(default)]
    pub message: String,
    /// RFC 3339 time of the last status change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

impl KafkaTopic {
    /// The Kafka topic name: `spec.topicName`, else `metadata.name`.
    pub fn topic_name(&self) -> String {
        self.spec
            .topic_name
            .clone()
            .unwrap_or_else(|| self.metadata.name.clone().unwrap_or_default())
    }

    /// Whether the `kaas.io/managed: "false"` annotation is set.
    pub fn unmanaged(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(UNMANAGED_ANNOTATION))
            .is_some_and(|v| v == "false")
    }
}

/// The CRD as YAML, exactly as committed under `deploy/crds/`.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let header = "# Generated by `cargo run -p kaas-operator --bin crdgen`; do not edit.\n\
                  # operator/tests/crd_drift.rs fails when this differs from the Rust types.\n";
    format!(
        "{header}{}",
        serde_yaml::to_string(&KafkaTopic::crd()).expect("CRD serializes")
    )
}
