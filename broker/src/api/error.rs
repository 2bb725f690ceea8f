//! The one error type handlers answer with, and the one place internal
//! errors become Kafka error codes.
//!
//! [`ApiError`] wraps the vendored kafka-protocol crate's
//! [`ResponseError`], whose table is the protocol's own (code, name,
//! retriable), so no code is written by hand here. Every conversion from an
//! internal error (`PartitionError`, `ReadError`, `TopicError`, a lookup
//! miss, a mailbox or blocking-task failure) is a `From` impl or a named
//! constructor in this file: the same failure maps to the same code in every
//! API.
//!
//! Architecture invariant: only `broker/src/api` maps errors to Kafka codes;
//! `actors` and `protocol` return typed errors (the one exception,
//! `BatchError::kafka_error_code`, is the batch validator's own table and is
//! routed through here too).
//!
//! Mailbox and task failures, chosen once:
//! * a partition leader whose mailbox is gone (or that dropped an append's
//!   durability ticket) has stopped or moved: NOT_LEADER_OR_FOLLOWER, which
//!   tells a client to refresh metadata and retry — nothing was acknowledged;
//! * a blocking-pool task that failed (panicked or was cancelled) is a
//!   storage-side failure of this broker: KAFKA_STORAGE_ERROR (retriable);
//! * the topic catalog's mailbox gone means the single writer of topic
//!   directories stopped mid-operation, whose effect on the volume is
//!   unknown: KAFKA_STORAGE_ERROR, not a leadership change.

use crate::limits::LimitError;
use crate::state::{CoordinatorLookupError, LookupError};
use kaas_actors::group::messages::CoordinatorError;
use kaas_actors::partition::messages::PartitionError;
use kaas_actors::partition::reader::ReadError;
use kaas_actors::topic::TopicError;
use kaas_protocol::kafka_protocol::ResponseError;
use kaas_protocol::BatchError;

/// Error code 0: no error.
pub const NONE: i16 = 0;

/// A Kafka error a handler answers with (never "no error").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiError(pub ResponseError);

impl ApiError {
    /// The wire code.
    pub const fn code(self) -> i16 {
        self.0.code()
    }

    /// A partition leader's mailbox is gone, or it dropped the durability
    /// ticket of an append: the leader stopped or moved.
    pub const fn leader_gone() -> Self {
        Self(ResponseError::NotLeaderOrFollower)
    }

    /// A task on the blocking pool failed (panicked or was cancelled).
    pub const fn blocking_task_failed() -> Self {
        Self(ResponseError::KafkaStorageError)
    }

    /// A group coordinator stopped between lookup and answer: the shard
    /// moved, so the client looks for the coordinator again.
    pub const fn coordinator_gone() -> Self {
        Self(ResponseError::NotCoordinator)
    }

    /// The topic catalog's mailbox is gone (see the module docs).
    pub const fn catalog_gone() -> Self {
        Self(ResponseError::KafkaStorageError)
    }
}

impl From<CoordinatorError> for ApiError {
    fn from(e: CoordinatorError) -> Self {
        Self(match e {
            CoordinatorError::Loading => ResponseError::CoordinatorLoadInProgress,
            CoordinatorError::NotCoordinator => ResponseError::NotCoordinator,
            CoordinatorError::Unavailable => ResponseError::CoordinatorNotAvailable,
        })
    }
}

impl From<CoordinatorLookupError> for ApiError {
    fn from(e: CoordinatorLookupError) -> Self {
        Self(match e {
            CoordinatorLookupError::NoShards => ResponseError::CoordinatorNotAvailable,
            CoordinatorLookupError::NotCoordinator => ResponseError::NotCoordinator,
        })
    }
}

impl From<ResponseError> for ApiError {
    fn from(e: ResponseError) -> Self {
        Self(e)
    }
}

impl From<&PartitionError> for ApiError {
    fn from(e: &PartitionError) -> Self {
        Self(match e {
            PartitionError::Storage(_) => ResponseError::KafkaStorageError,
            PartitionError::NotLeader(_) => ResponseError::NotLeaderOrFollower,
            PartitionError::TooLarge => ResponseError::RecordListTooLarge,
            PartitionError::OutOfOrderSequence(_) => ResponseError::OutOfOrderSequenceNumber,
            PartitionError::InvalidProducerEpoch(_) => ResponseError::InvalidProducerEpoch,
            PartitionError::InvalidTxnState(_) => ResponseError::InvalidTxnState,
            PartitionError::CoordinatorFenced(_) => ResponseError::TransactionCoordinatorFenced,
            // Only seen by a caller that did not verify (the produce path
            // verifies and appends again): the partition is not known to
            // be in the transaction.
            PartitionError::TxnUnverified { .. } => ResponseError::InvalidTxnState,
        })
    }
}

impl From<&ReadError> for ApiError {
    fn from(e: &ReadError) -> Self {
        Self(match e {
            ReadError::OutOfRange { .. } => ResponseError::OffsetOutOfRange,
            ReadError::Io(_) => ResponseError::KafkaStorageError,
        })
    }
}

impl From<&TopicError> for ApiError {
    fn from(e: &TopicError) -> Self {
        Self(match e {
            TopicError::AlreadyExists(_) => ResponseError::TopicAlreadyExists,
            TopicError::Unknown(_) => ResponseError::UnknownTopicOrPartition,
            TopicError::InvalidName(..) | TopicError::Collides { .. } => {
                ResponseError::InvalidTopicException
            }
            TopicError::InvalidPartitions(_) | TopicError::InvalidPartitionCount(_) => {
                ResponseError::InvalidPartitions
            }
            TopicError::InvalidConfig(_) => ResponseError::InvalidConfig,
            TopicError::Storage(_) => ResponseError::KafkaStorageError,
        })
    }
}

impl From<&LimitError> for ApiError {
    fn from(e: &LimitError) -> Self {
        Self(match e {
            // What Kafka answers when a CreateTopicPolicy refuses a create.
            LimitError::PartitionsPerRequest { .. }
            | LimitError::ClusterPartitions { .. }
            | LimitError::BrokerPartitions { .. } => ResponseError::PolicyViolation,
            // KIP-599, only to the versions that know it (see
            // `api::admin::mutation_quota`).
            LimitError::Throttled { .. } => ResponseError::ThrottlingQuotaExceeded,
            // What Kafka answers for a topic whose auto-creation has not
            // (yet) happened: retriable, so the client asks again later
            // instead of failing (Metadata has no throttling error).
            LimitError::AutoCreateDeferred(_) => ResponseError::LeaderNotAvailable,
        })
    }
}

impl From<LookupError> for ApiError {
    fn from(e: LookupError) -> Self {
        Self(match e {
            LookupError::Unknown => ResponseError::UnknownTopicOrPartition,
            LookupError::NotLeader => ResponseError::NotLeaderOrFollower,
        })
    }
}

impl From<&BatchError> for ApiError {
    fn from(e: &BatchError) -> Self {
        // The validator keeps its own small table (protocol stays free of
        // the broker's error type); it is a subset of the crate's codes.
        Self(
            ResponseError::try_from_code(e.kafka_error_code())
                .unwrap_or(ResponseError::InvalidRecord),
        )
    }
}

/// The code for a result: 0 on success.
pub fn code_of<T>(r: &Result<T, ApiError>) -> i16 {
    match r {
        Ok(_) => NONE,
        Err(e) => e.code(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_protocols() {
        assert_eq!(ApiError::leader_gone().code(), 6);
        assert_eq!(ApiError::blocking_task_failed().code(), 56);
        assert_eq!(ApiError::catalog_gone().code(), 56);
        assert_eq!(ApiError::from(LookupError::Unknown).code(), 3);
        assert_eq!(ApiError::from(LookupError::NotLeader).code(), 6);
        assert_eq!(ApiError::from(&PartitionError::TooLarge).code(), 18);
        assert_eq!(
            ApiError::from(&PartitionError::Storage("x".into())).code(),
            56
        );
        assert_eq!(
            ApiError::from(&ReadError::OutOfRange {
                offset: 9,
                start: 0,
                hw: 1
            })
            .code(),
            1
        );
        assert_eq!(
            ApiError::from(&TopicError::InvalidConfig("x".into())).code(),
            40
        );
        assert_eq!(
            ApiError::from(&TopicError::InvalidName("x".into(), "y")).code(),
            17
        );
        assert_eq!(
            ApiError::from(&TopicError::Collides {
                name: "a_b".into(),
                existing: "a.b".into()
            })
            .code(),
            17
        );
        assert_eq!(ApiError::from(&BatchError::Corrupt("x".into())).code(), 2);
        assert_eq!(ApiError::from(&BatchError::UnsupportedMagic(1)).code(), 43);
        assert_eq!(ApiError::from(&BatchError::Empty).code(), 87);
        assert_eq!(
            ApiError::from(&LimitError::PartitionsPerRequest { asked: 2, max: 1 }).code(),
            44
        );
        assert_eq!(
            ApiError::from(&LimitError::ClusterPartitions {
                existing: 1,
                asked: 2,
                max: 2
            })
            .code(),
            44
        );
        assert_eq!(
            ApiError::from(&LimitError::AutoCreateDeferred("x")).code(),
            5
        );
        assert_eq!(
            ApiError::from(&LimitError::BrokerPartitions {
                existing: 1,
                asked: 2,
                brokers: 1,
                per_broker: 2
            })
            .code(),
            44
        );
        assert_eq!(
            ApiError::from(&LimitError::Throttled { throttle_ms: 5 }).code(),
            89
        );
    }

    /// A leader's mailbox failure is the same code whichever API met it.
    #[test]
    fn coordinator_errors_are_kafkas() {
        assert_eq!(ApiError::from(CoordinatorError::Loading).code(), 14);
        assert_eq!(ApiError::from(CoordinatorError::Unavailable).code(), 15);
        assert_eq!(ApiError::from(CoordinatorError::NotCoordinator).code(), 16);
        assert_eq!(ApiError::from(CoordinatorLookupError::NoShards).code(), 15);
        assert_eq!(
            ApiError::from(CoordinatorLookupError::NotCoordinator).code(),
            16
        );
        assert_eq!(ApiError::coordinator_gone().code(), 16);
        assert_eq!(ApiError::from(ResponseError::IllegalGeneration).code(), 22);
    }

    #[test]
    fn leader_gone_is_not_leader_like_a_lookup_miss() {
        assert_eq!(
            ApiError::leader_gone(),
            ApiError::from(LookupError::NotLeader)
        );
        assert!(ApiError::leader_gone().0.is_retriable());
        assert!(ApiError::blocking_task_failed().0.is_retriable());
    }
}
