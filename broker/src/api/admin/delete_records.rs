//! DeleteRecords (key 21): each partition's leader moves its log start
//! offset (persisted in its manifest through its `EpochWriter`) and removes
//! the whole segments below it; ListOffsets earliest then answers the new
//! start and a fetch below it gets OFFSET_OUT_OF_RANGE. An offset above the
//! high watermark (or below -1) is OFFSET_OUT_OF_RANGE; -1 means the high
//! watermark, as in Kafka.

use crate::api::error::ApiError;
use crate::api::{locate_reader, Reply, TopicRef};
use crate::state::Broker;
use kaas_actors::partition::messages::DeleteRecordsBefore;
use kaas_protocol::kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kaas_protocol::kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// The offset to delete before, given the request's `offset` and the
/// partition's high watermark, or OFFSET_OUT_OF_RANGE.
fn target(offset: i64, hw: i64) -> Result<i64, ApiError> {
    match offset {
        -1 => Ok(hw),
        o if (0..=hw).contains(&o) => Ok(o),
        _ => Err(ResponseError::OffsetOutOfRange.into()),
    }
}

/// Answer inline (each partition is one manifest write on its leader).
pub async fn handle(
    b: &Arc<Broker>,
    _v: i16,
    r: DeleteRecordsRequest,
) -> Reply<DeleteRecordsResponse> {
    let mut resp = DeleteRecordsResponse::default();
    for t in r.topics {
        let mut tr = DeleteRecordsTopicResult::default();
        tr.name = t.name.clone();
        for p in t.partitions {
            let mut pr = DeleteRecordsPartitionResult::default();
            pr.partition_index = p.partition_index;
            pr.low_watermark = -1;
            let res = async {
                let (h, reader) =
                    locate_reader(b, TopicRef::Name(&t.name.0), p.partition_index, -1).await?;
                let (_, hw, _) = reader.offsets();
                let offset = target(p.offset, hw)?;
                match h.addr.send(DeleteRecordsBefore { offset }).await {
                    Ok(Ok(start)) => Ok(start),
                    Ok(Err(e)) => Err(ApiError::from(&e)),
                    Err(_) => Err(ApiError::leader_gone()),
                }
            }
            .await;
            match res {
                Ok(start) => pr.low_watermark = start,
                Err(e) => pr.error_code = e.code(),
            }
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    Reply::Now(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: offsets above the high watermark accepted, or -1 not read
    /// as "up to the high watermark".
    #[test]
    fn offsets_beyond_the_high_watermark_are_out_of_range() {
        assert_eq!(target(-1, 10), Ok(10));
        assert_eq!(target(0, 10), Ok(0));
        assert_eq!(target(10, 10), Ok(10));
        for bad in [11, -2, i64::MIN] {
            assert_eq!(target(bad, 10).unwrap_err().code(), 1, "{bad}");
        }
    }
}
