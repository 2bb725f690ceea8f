//! ListOffsets (key 2): the earliest, latest or max-timestamp offset, or
//! the first offset at or after a timestamp, from each partition's reader.
//!
//! Version rules handled here: `leader_epoch` in the answer from v4;
//! `isolation_level = 1` (read_committed, v2+) answers "latest" with the
//! last stable offset.

use super::error::ApiError;
use super::{locate_reader, Reply, TopicRef};
use crate::state::Broker;
use kaas_protocol::kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kaas_protocol::kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Special timestamps (KIP-734, KIP-1005): latest, earliest, max timestamp,
/// earliest local.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL: i64 = -4;

/// Answer inline (the reads run on the blocking pool).
pub async fn handle(b: &Arc<Broker>, v: i16, r: ListOffsetsRequest) -> Reply<ListOffsetsResponse> {
    Reply::Now(list_offsets(b, r, v).await)
}

/// Blank what version `v` does not carry.
fn for_version(p: &mut ListOffsetsPartitionResponse, v: i16) {
    if v < 4 {
        p.leader_epoch = -1;
    }
}

async fn list_offsets(b: &Arc<Broker>, r: ListOffsetsRequest, v: i16) -> ListOffsetsResponse {
    let mut resp = ListOffsetsResponse::default();
    let committed = v >= 2 && r.isolation_level == 1;
    for t in r.topics {
        let mut tr = ListOffsetsTopicResponse::default();
        tr.name = t.name.clone();
        for p in t.partitions {
            let mut pr = ListOffsetsPartitionResponse::default();
            pr.partition_index = p.partition_index;
            pr.timestamp = -1;
            pr.offset = -1;
            pr.leader_epoch = -1;
            let target = locate_reader(
                b,
                TopicRef::Name(&t.name.0),
                p.partition_index,
                p.current_leader_epoch,
            )
            .await;
            match target {
                Err(e) => pr.error_code = e.code(),
                Ok((_, reader)) => {
                    let (start, hw, epoch) = reader.offsets();
                    let latest = if committed {
                        reader.last_stable_offset()
                    } else {
                        hw
                    };
                    let ts = p.timestamp;
                    let res = tokio::task::spawn_blocking(move || match ts {
                        LATEST => Ok(Some((latest, -1, epoch))),
                        EARLIEST | EARLIEST_LOCAL => Ok(Some((start, -1, epoch))),
                        MAX_TIMESTAMP => reader
                            .max_timestamp()
                            .map(|h| h.map(|h| (h.offset, h.timestamp, h.leader_epoch))),
                        t if t >= 0 => reader
                            .offset_for_timestamp(t)
                            .map(|h| h.map(|h| (h.offset, h.timestamp, h.leader_epoch))),
                        _ => Ok(None),
                    })
                    .await;
                    match res {
                        Ok(Ok(Some((o, t, e)))) => {
                            pr.offset = o;
                            pr.timestamp = t;
                            pr.leader_epoch = e;
                        }
                        Ok(Ok(None)) if ts < EARLIEST_LOCAL => {
                            pr.error_code = ResponseError::UnsupportedVersion.code()
                        }
                        Ok(Ok(None)) => {}
                        Ok(Err(e)) => pr.error_code = ApiError::from(&e).code(),
                        Err(_) => pr.error_code = ApiError::blocking_task_failed().code(),
                    }
                }
            }
            for_version(&mut pr, v);
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leader_epoch_from_v4() {
        let mut p = ListOffsetsPartitionResponse::default();
        p.leader_epoch = 3;
        for_version(&mut p, 4);
        assert_eq!(p.leader_epoch, 3);
        for_version(&mut p, 3);
        assert_eq!(p.leader_epoch, -1);
    }
}
