//! OffsetCommit (key 8): answered only after the fsync that makes the
//! commit durable (group commit in the coordinator), under a valid lease.
//! A partition this broker's metadata does not know (an unknown topic, an
//! index beyond its partition count) is UNKNOWN_TOPIC_OR_PARTITION and is
//! not committed, as Kafka's `KafkaApis` answers before its coordinator;
//! the rest is validated as a whole (generation, member), so every one of
//! them carries the same code.

use super::super::error::{ApiError, NONE};
use super::super::Reply;
use super::{ask_now, unknown_now, unknown_partitions};
use crate::state::Broker;
use futures::future::BoxFuture;
use futures::FutureExt;
use kaas_actors::group::messages::{CommitOffset, CommitOffsets};
use kaas_protocol::kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kaas_protocol::kafka_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Forward to the coordinator now (dispatch phase, so a connection's
/// pipelined commits share an fsync); the answer waits for the fsync.
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: OffsetCommitRequest,
) -> Reply<OffsetCommitResponse> {
    Reply::Later(commit(b, v, r))
}

fn commit(
    b: &Arc<Broker>,
    v: i16,
    r: OffsetCommitRequest,
) -> BoxFuture<'static, OffsetCommitResponse> {
    let parts: Vec<(String, i32)> = r
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.name.0.to_string(), p.partition_index))
        })
        .collect();
    if unknown_now(b, &parts).is_none() {
        // Every partition known: sent in the dispatch phase.
        let answer = ask_now(b, &r.group_id.0, message(v, &r, None));
        return async move {
            let code = code(answer.await);
            respond(&r, |_| code)
        }
        .boxed();
    }
    // Some unknown (rare): settle the view, then commit the known ones.
    let b = b.clone();
    async move {
        let unknown = unknown_partitions(&b, &parts).await;
        let code = if unknown.iter().all(|u| *u) {
            NONE
        } else {
            code(ask_now(&b, &r.group_id.0, message(v, &r, Some(&unknown))).await)
        };
        respond(&r, |i| {
            if unknown[i] {
                ResponseError::UnknownTopicOrPartition.code()
            } else {
                code
            }
        })
    }
    .boxed()
}

fn code(answer: Result<Result<(), ResponseError>, ApiError>) -> i16 {
    match answer {
        Ok(Ok(())) => NONE,
        Ok(Err(e)) => ApiError::from(e).code(),
        Err(e) => e.code(),
    }
}

/// The coordinator's message: every partition of the request, or those
/// `unknown` does not mark (by their index in request order).
fn message(v: i16, r: &OffsetCommitRequest, unknown: Option<&[bool]>) -> CommitOffsets {
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
        .enumerate()
        .filter(|(i, _)| !unknown.is_some_and(|u| u[*i]))
        .map(|(_, o)| o)
        .collect();
    CommitOffsets {
        group_id: r.group_id.0.to_string(),
        member_id: r.member_id.to_string(),
        instance_id: r.group_instance_id.as_ref().map(|i| i.to_string()),
        generation_id: r.generation_id_or_member_epoch,
        // v2-v4 carry a retention; -1 is the broker default.
        retention_ms: (v <= 4 && r.retention_time_ms >= 0).then_some(r.retention_time_ms),
        offsets,
    }
}

/// The response in request order; `code_of(i)` is the code of the i-th
/// partition of the request.
fn respond(r: &OffsetCommitRequest, code_of: impl Fn(usize) -> i16) -> OffsetCommitResponse {
    let mut i = 0;
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
                    rp.error_code = code_of(i);
                    i += 1;
                    rp
                })
                .collect();
            rt
        })
        .collect();
    resp
}
