//! ListPartitionReassignments (key 46) and AlterPartitionReassignments (key
//! 45). kaas keeps one copy of each partition on the shared volume and the
//! controller moves leadership by grant, so there are no replicas to
//! reassign: the list is always empty, and a reassignment is refused per
//! partition — INVALID_REPLICA_ASSIGNMENT with the reason, or, for a
//! cancellation (null replicas), NO_REASSIGNMENT_IN_PROGRESS as Kafka
//! answers when there is nothing to cancel.

use crate::api::{s, Reply};
use crate::state::Broker;
use kaas_protocol::kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kaas_protocol::kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Why a reassignment is refused.
const NO_REPLICAS: &str = "kaas keeps one copy of each partition on the shared volume: there are no replicas to reassign (the controller moves leadership by grant)";

/// ListPartitionReassignments: nothing is ever in progress.
pub async fn handle_list(
    _b: &Arc<Broker>,
    _v: i16,
    _r: ListPartitionReassignmentsRequest,
) -> Reply<ListPartitionReassignmentsResponse> {
    Reply::Now(ListPartitionReassignmentsResponse::default())
}

/// The per-partition answer to a reassignment: (code, message).
fn refusal(known: bool, cancel: bool) -> (i16, &'static str) {
    if !known {
        (
            ResponseError::UnknownTopicOrPartition.code(),
            "unknown topic or partition",
        )
    } else if cancel {
        (
            ResponseError::NoReassignmentInProgress.code(),
            "no reassignment in progress (there are no replicas)",
        )
    } else {
        (ResponseError::InvalidReplicaAssignment.code(), NO_REPLICAS)
    }
}

/// AlterPartitionReassignments: refused per partition.
pub async fn handle_alter(
    b: &Arc<Broker>,
    _v: i16,
    r: AlterPartitionReassignmentsRequest,
) -> Reply<AlterPartitionReassignmentsResponse> {
    let a = b.assignment();
    let mut resp = AlterPartitionReassignmentsResponse::default();
    for t in r.topics {
        let mut tr = ReassignableTopicResponse::default();
        tr.name = t.name.clone();
        for p in t.partitions {
            let known = a.entry(&t.name.0, p.partition_index).is_some();
            let (code, msg) = refusal(known, p.replicas.is_none());
            let mut pr = ReassignablePartitionResponse::default();
            pr.partition_index = p.partition_index;
            pr.error_code = code;
            pr.error_message = Some(s(msg));
            tr.partitions.push(pr);
        }
        resp.responses.push(tr);
    }
    Reply::Now(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reassignments_are_refused_with_a_reason() {
        assert_eq!(refusal(true, false).0, 39);
        assert_eq!(refusal(true, true).0, 85);
        assert_eq!(refusal(false, false).0, 3);
    }
}
