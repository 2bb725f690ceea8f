//! OffsetForLeaderEpoch (key 23): the end offset of a leader epoch
//! (KIP-101/KIP-320), so a consumer can detect log truncation.

use super::{locate_reader, Reply, TopicRef};
use crate::state::Broker;
use kaas_protocol::kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kaas_protocol::kafka_protocol::messages::{
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse,
};
use std::sync::Arc;

/// Answer inline from each partition's in-memory epoch history.
pub async fn handle(
    b: &Arc<Broker>,
    _v: i16,
    r: OffsetForLeaderEpochRequest,
) -> Reply<OffsetForLeaderEpochResponse> {
    let mut resp = OffsetForLeaderEpochResponse::default();
    for t in r.topics {
        let mut tr = OffsetForLeaderTopicResult::default();
        tr.topic = t.topic.clone();
        for p in t.partitions {
            let mut er = EpochEndOffset::default();
            er.partition = p.partition;
            er.leader_epoch = -1;
            er.end_offset = -1;
            let target = locate_reader(
                b,
                TopicRef::Name(&t.topic.0),
                p.partition,
                p.current_leader_epoch,
            )
            .await;
            match target {
                Err(e) => er.error_code = e.code(),
                Ok((_, reader)) => {
                    let (e, o) = reader.end_offset_for_epoch(p.leader_epoch);
                    er.leader_epoch = e;
                    er.end_offset = o;
                }
            }
            tr.partitions.push(er);
        }
        resp.topics.push(tr);
    }
    Reply::Now(resp)
}
