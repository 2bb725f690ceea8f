//! The kaas Kubernetes operator: `KafkaTopic` resources converged through
//! the brokers' Kafka admin API, with topic identity read from the volume's
//! stamps by the `kaas-volume` crate (never a second copy of that code).
//!
//! Architecture invariant: the operator writes no file on the shared
//! volume. Topic directories have one writer, the brokers' controller; the
//! operator asks it (CreateTopics, CreatePartitions, DeleteTopics,
//! IncrementalAlterConfigs) and reads `.topic-id.json` to learn the result.

pub mod admin;
pub mod crd;
pub mod lease;
pub mod metrics;
pub mod reconcile;
