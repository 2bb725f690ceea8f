//! The one place internal errors become Kafka error codes.
//!
//! Architecture invariant: only the broker crate maps errors to Kafka codes;
//! `actors` and `protocol` return typed errors.

use kaas_actors::partition::messages::PartitionError;
use kaas_actors::partition::reader::ReadError;
use kaas_actors::topic::TopicError;

/// Kafka error codes used by kaas (subset of the protocol's table).
pub mod code {
    pub const NONE: i16 = 0;
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const LEADER_NOT_AVAILABLE: i16 = 5;
    pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    pub const REQUEST_TIMED_OUT: i16 = 7;
    pub const RECORD_LIST_TOO_LARGE: i16 = 18;
    pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
    pub const INVALID_REQUIRED_ACKS: i16 = 21;
    pub const UNSUPPORTED_VERSION: i16 = 35;
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub const INVALID_PARTITIONS: i16 = 37;
    pub const INVALID_REPLICATION_FACTOR: i16 = 38;
    pub const INVALID_REQUEST: i16 = 42;
    pub const INVALID_CONFIG: i16 = 40;
    pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
    pub const KAFKA_STORAGE_ERROR: i16 = 56;
    pub const UNKNOWN_TOPIC_ID: i16 = 100;
    pub const UNKNOWN_LEADER_EPOCH: i16 = 75;
    pub const FENCED_LEADER_EPOCH: i16 = 74;
}

/// Code for a partition leader failure.
pub fn partition(e: &PartitionError) -> i16 {
    match e {
        PartitionError::Storage(_) => code::KAFKA_STORAGE_ERROR,
        PartitionError::NotLeader(_) => code::NOT_LEADER_OR_FOLLOWER,
        PartitionError::TooLarge => code::RECORD_LIST_TOO_LARGE,
    }
}

/// Code for a read failure.
pub fn read(e: &ReadError) -> i16 {
    match e {
        ReadError::OutOfRange { .. } => code::OFFSET_OUT_OF_RANGE,
        ReadError::Io(_) => code::KAFKA_STORAGE_ERROR,
    }
}

/// Code for a topic operation failure.
pub fn topic(e: &TopicError) -> i16 {
    match e {
        TopicError::AlreadyExists(_) => code::TOPIC_ALREADY_EXISTS,
        TopicError::Unknown(_) => code::UNKNOWN_TOPIC_OR_PARTITION,
        TopicError::InvalidName(..) => code::INVALID_TOPIC_EXCEPTION,
        TopicError::InvalidPartitions(_) => code::INVALID_PARTITIONS,
        TopicError::InvalidConfig(_) => code::INVALID_CONFIG,
        TopicError::Storage(_) => code::KAFKA_STORAGE_ERROR,
    }
}
