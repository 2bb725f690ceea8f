//! TxnOffsetCommit (key 28), v0-v3: offsets committed inside a transaction
//! (`send_offsets_to_transaction`). They are stored durably in the group's
//! coordinator shard, pending for the producer id: OffsetFetch does not
//! return them (and answers UNSTABLE_OFFSET_COMMIT to `require_stable`)
//! until the transaction's marker commits them, or drops them on abort.
//! v3 carries the member's generation and id (KIP-447), checked like an
//! OffsetCommit's. PRODUCER_FENCED from v3 on.

use super::super::error::ApiError;
use super::super::group::ask;
use super::super::Reply;
use super::fenced_for;
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::messages::{CommitOffset, TxnCommitOffsets};
use kaas_protocol::kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kaas_protocol::kafka_protocol::messages::{TxnOffsetCommitRequest, TxnOffsetCommitResponse};
use std::sync::Arc;

/// Forward to the group's coordinator; the answer waits for the fsync.
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: TxnOffsetCommitRequest,
) -> Reply<TxnOffsetCommitResponse> {
    let b = b.clone();
    Reply::Later(async move { commit(&b, v, r).await }.boxed())
}

async fn commit(b: &Broker, v: i16, r: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse {
    let group = r.group_id.0.to_string();
    let offsets = r
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| CommitOffset {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: if v >= 2 { p.committed_leader_epoch } else { -1 },
                metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
            })
        })
        .collect();
    let msg = TxnCommitOffsets {
        group_id: group.clone(),
        producer_id: r.producer_id.0,
        producer_epoch: r.producer_epoch,
        member_id: if v >= 3 {
            r.member_id.to_string()
        } else {
            String::new()
        },
        instance_id: if v >= 3 {
            r.group_instance_id.as_ref().map(|i| i.to_string())
        } else {
            None
        },
        generation_id: if v >= 3 { r.generation_id } else { -1 },
        offsets,
    };
    let code = match ask(b, &group, msg).await {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => fenced_for(e, v, 3).code(),
        Err(e) => ApiError::code(e),
    };
    let mut resp = TxnOffsetCommitResponse::default();
    resp.topics = r
        .topics
        .iter()
        .map(|t| {
            let mut rt = TxnOffsetCommitResponseTopic::default();
            rt.name = t.name.clone();
            rt.partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let mut rp = TxnOffsetCommitResponsePartition::default();
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
