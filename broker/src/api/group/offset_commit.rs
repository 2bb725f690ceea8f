//! OffsetCommit (key 8): answered only after the fsync that makes the
//! commit durable (group commit in the coordinator), under a valid lease.
//! The request is validated as a whole (generation, member), so every
//! partition carries the same code.

use super::super::error::ApiError;
use super::super::Reply;
use super::ask_now;
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::messages::{CommitOffset, CommitOffsets};
use kaas_protocol::kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kaas_protocol::kafka_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse};
use std::sync::Arc;

/// Forward to the coordinator now (dispatch phase, so a connection's
/// pipelined commits share an fsync); the answer waits for the fsync.
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: OffsetCommitRequest,
) -> Reply<OffsetCommitResponse> {
    Reply::Later(commit(b, v, r).boxed())
}

fn commit(
    b: &Broker,
    v: i16,
    r: OffsetCommitRequest,
) -> impl std::future::Future<Output = OffsetCommitResponse> + Send + 'static {
    let group = r.group_id.0.to_string();
    let offsets = r
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| CommitOffset {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: if v >= 6 { p.committed_leader_epoch } else { -1 },
                metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
            })
        })
        .collect();
    let msg = CommitOffsets {
        group_id: group.clone(),
        member_id: r.member_id.to_string(),
        instance_id: r.group_instance_id.as_ref().map(|i| i.to_string()),
        generation_id: r.generation_id_or_member_epoch,
        // v2-v4 carry a retention; -1 is the broker default.
        retention_ms: (v <= 4 && r.retention_time_ms >= 0).then_some(r.retention_time_ms),
        offsets,
    };
    let answer = ask_now(b, &group, msg);
    async move {
        let code = match answer.await {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => ApiError::from(e).code(),
            Err(e) => e.code(),
        };
        let mut resp = OffsetCommitResponse::default();
        resp.topics = r
            .topics
            .iter()
            .map(|t| {
                let mut rt = OffsetCommitResponseTopic::default();
                rt.name = t.name.clone();
                rt.partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let mut rp = OffsetCommitResponsePartition::default();
                        rp.partition_index = p.partition_index;
                        rp.error_code = code;
                        rp
                    })
                    .collect();
                rt
            })
            .collect();
        resp
    }
}
