//! KIP-430 authorized operations (Metadata, DescribeCluster,
//! DescribeGroups, ConsumerGroupDescribe). kaas has no authorizer, so it
//! answers what Kafka answers without one (`AuthHelper.authorizedOperations`
//! with no authorizer): every operation the resource type supports
//! (`AclEntry.supportedOperations`), as a bit field whose bit positions are
//! the `AclOperation` codes. Not requested, the field keeps the schema's
//! default, `i32::MIN`, which clients read as "not provided" (reporting it
//! regardless breaks kafka-python: bit 31 is no operation).

/// `AclOperation` codes (`org.apache.kafka.common.acl.AclOperation`).
const READ: i32 = 3;
const WRITE: i32 = 4;
const CREATE: i32 = 5;
const DELETE: i32 = 6;
const ALTER: i32 = 7;
const DESCRIBE: i32 = 8;
const CLUSTER_ACTION: i32 = 9;
const DESCRIBE_CONFIGS: i32 = 10;
const ALTER_CONFIGS: i32 = 11;
const IDEMPOTENT_WRITE: i32 = 12;

const fn bits(ops: &[i32]) -> i32 {
    let mut out = 0;
    let mut i = 0;
    while i < ops.len() {
        out |= 1 << ops[i];
        i += 1;
    }
    out
}

/// A topic: READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER,
/// DESCRIBE_CONFIGS, ALTER_CONFIGS.
pub(crate) const TOPIC: i32 = bits(&[
    READ,
    WRITE,
    CREATE,
    DESCRIBE,
    DELETE,
    ALTER,
    DESCRIBE_CONFIGS,
    ALTER_CONFIGS,
]);

/// A group: READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS (the
/// last two since Kafka 3.8's group configs, KIP-848).
pub(crate) const GROUP: i32 = bits(&[READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS]);

/// The cluster: CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS,
/// IDEMPOTENT_WRITE, ALTER, DESCRIBE (the token operations belong to the
/// USER resource, not the cluster).
pub(crate) const CLUSTER: i32 = bits(&[
    CREATE,
    CLUSTER_ACTION,
    DESCRIBE_CONFIGS,
    ALTER_CONFIGS,
    IDEMPOTENT_WRITE,
    ALTER,
    DESCRIBE,
]);

/// The field's value: `ops` when the request asked for it, else Kafka's
/// "not requested" default.
pub(crate) fn when_asked(requested: bool, ops: i32) -> i32 {
    if requested {
        ops
    } else {
        i32::MIN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(field: i32) -> Vec<i32> {
        (0..32).filter(|b| field & (1 << b) != 0).collect()
    }

    #[test]
    fn the_sets_kafka_reports_without_an_authorizer() {
        assert_eq!(ops(TOPIC), vec![3, 4, 5, 6, 7, 8, 10, 11]);
        assert_eq!(ops(GROUP), vec![3, 6, 8, 10, 11]);
        assert_eq!(ops(CLUSTER), vec![5, 7, 8, 9, 10, 11, 12]);
        assert_eq!(when_asked(false, GROUP), i32::MIN);
        assert_eq!(when_asked(true, GROUP), GROUP);
    }
}
