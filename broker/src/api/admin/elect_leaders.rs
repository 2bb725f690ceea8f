//! ElectLeaders (key 43). A partition's only replica is the copy on the
//! shared volume and its leader is whoever holds the controller's grant, so
//! there is nothing to elect: a partition with a leader answers
//! ELECTION_NOT_NEEDED (Kafka's answer when the preferred replica already
//! leads, and for an unclean election of a partition that has a leader); a
//! vacant one (the controller is granting it) PREFERRED_LEADER_NOT_AVAILABLE
//! or, for an unclean election, ELIGIBLE_LEADERS_NOT_AVAILABLE — both
//! retriable in effect, as the grant follows within a poll. A request for
//! every partition (null) lists only partitions that are not led, as Kafka
//! leaves out the ones that needed no election.

use crate::api::{s, Reply};
use crate::state::Broker;
use kaas_actors::cluster::records::Assignment;
use kaas_protocol::kafka_protocol::messages::elect_leaders_response::{
    PartitionResult, ReplicaElectionResult,
};
use kaas_protocol::kafka_protocol::messages::{
    ElectLeadersRequest, ElectLeadersResponse, TopicName,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Election types.
const UNCLEAN: i8 = 1;

/// One partition's answer: (code, message); 0 never happens (no election).
fn answer(a: &Assignment, topic: &str, p: i32, election_type: i8) -> (i16, Option<String>) {
    match a.entry(topic, p) {
        None => (ResponseError::UnknownTopicOrPartition.code(), None),
        Some(e) if e.leader >= 0 => (
            ResponseError::ElectionNotNeeded.code(),
            Some(format!(
                "broker {} holds the grant: kaas partitions have one replica",
                e.leader
            )),
        ),
        Some(_) if election_type == UNCLEAN => (
            ResponseError::EligibleLeadersNotAvailable.code(),
            Some("the controller is granting this partition".into()),
        ),
        Some(_) => (
            ResponseError::PreferredLeaderNotAvailable.code(),
            Some("the controller is granting this partition".into()),
        ),
    }
}

/// Answer inline from the assignment.
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: ElectLeadersRequest,
) -> Reply<ElectLeadersResponse> {
    let a = b.assignment();
    let all = r.topic_partitions.is_none();
    let asked: Vec<(String, Vec<i32>)> = match r.topic_partitions {
        Some(tps) => tps
            .into_iter()
            .map(|t| (t.topic.0.to_string(), t.partitions))
            .collect(),
        None => a
            .topics
            .iter()
            .map(|(n, t)| (n.clone(), (0..t.partitions.len() as i32).collect()))
            .collect(),
    };
    let election_type = if v >= 1 { r.election_type } else { 0 };
    let mut resp = ElectLeadersResponse::default();
    for (topic, parts) in asked {
        let mut tr = ReplicaElectionResult::default();
        tr.topic = TopicName(s(&topic));
        for p in parts {
            let (code, msg) = answer(&a, &topic, p, election_type);
            if all && code == ResponseError::ElectionNotNeeded.code() {
                continue;
            }
            let mut pr = PartitionResult::default();
            pr.partition_id = p;
            pr.error_code = code;
            pr.error_message = msg.as_deref().map(s);
            tr.partition_result.push(pr);
        }
        if !(all && tr.partition_result.is_empty()) {
            resp.replica_election_results.push(tr);
        }
    }
    Reply::Now(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_actors::cluster::records::{PartitionAssignment, TopicAssignment};

    #[test]
    fn a_led_partition_needs_no_election_a_vacant_one_is_being_granted() {
        let mut a = Assignment::default();
        let mut led = PartitionAssignment::vacant(3);
        led.leader = 1;
        a.topics.insert(
            "t".into(),
            TopicAssignment {
                deleting: false,
                topic_id: uuid::Uuid::nil(),
                configs: Default::default(),
                partitions: vec![led, PartitionAssignment::vacant(2)],
            },
        );
        assert_eq!(answer(&a, "t", 0, 0).0, 84);
        assert_eq!(answer(&a, "t", 0, UNCLEAN).0, 84);
        assert_eq!(answer(&a, "t", 1, 0).0, 80);
        assert_eq!(answer(&a, "t", 1, UNCLEAN).0, 83);
        assert_eq!(answer(&a, "t", 2, 0).0, 3);
        assert_eq!(answer(&a, "x", 0, 0).0, 3);
    }
}
