//! DescribeProducers (key 61, v0): per partition led here, the producers its
//! leader tracks — id, epoch, last sequence, last timestamp, coordinator
//! epoch of the last marker, first offset of the open transaction (-1:
//! none) — from the leader's producer state (as of everything written).
//!
//! Errors per partition: UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER,
//! KAFKA_STORAGE_ERROR while the leader recovers.

use super::super::error::ApiError;
use super::super::{locate, Reply, TopicRef};
use crate::state::Broker;
use kaas_actors::partition::messages::GetProducers;
use kaas_protocol::kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kaas_protocol::kafka_protocol::messages::{
    DescribeProducersRequest, DescribeProducersResponse,
};
use std::sync::Arc;

/// Ask each partition's leader (a mailbox round trip each).
pub async fn handle(
    b: &Arc<Broker>,
    _v: i16,
    r: DescribeProducersRequest,
) -> Reply<DescribeProducersResponse> {
    let mut resp = DescribeProducersResponse::default();
    for t in r.topics {
        let mut tr = TopicResponse::default();
        tr.name = t.name.clone();
        for p in t.partition_indexes {
            let mut pr = PartitionResponse::default();
            pr.partition_index = p;
            let answer = match locate(b, TopicRef::Name(&t.name.0), p, -1) {
                Err(e) => Err(e),
                Ok(l) => match l.handle.addr.send(GetProducers).await {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(ApiError::from(&e)),
                    Err(_) => Err(ApiError::leader_gone()),
                },
            };
            match answer {
                Ok(v) => {
                    pr.active_producers = v
                        .into_iter()
                        .map(|x| {
                            let mut s = ProducerState::default();
                            s.producer_id = x.producer_id.into();
                            s.producer_epoch = i32::from(x.producer_epoch);
                            s.last_sequence = x.last_sequence;
                            s.last_timestamp = x.last_timestamp;
                            s.coordinator_epoch = x.coordinator_epoch;
                            s.current_txn_start_offset = x.current_txn_start_offset;
                            s
                        })
                        .collect();
                }
                Err(e) => pr.error_code = e.code(),
            }
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    Reply::Now(resp)
}
