//! TxnOffsetCommit (key 28), v0-v3: offsets committed inside a transaction
//! (`send_offsets_to_transaction`). They are stored durably in the group's
//! coordinator shard, pending for the producer id: OffsetFetch does not
//! return them (and answers UNSTABLE_OFFSET_COMMIT to `require_stable`)
//! until the transaction's marker commits them, or drops them on abort.
//! v3 carries the member's generation and id (KIP-447), checked by the
//! coordinator's one commit validation, for a classic group or a KIP-848
//! one (whose member epoch the client sends as the generation); a stale
//! epoch is ILLEGAL_GENERATION here, as Kafka answers (TxnOffsetCommit has
//! no STALE_MEMBER_EPOCH). A partition this broker's metadata does not
//! know is UNKNOWN_TOPIC_OR_PARTITION and not committed, as for
//! OffsetCommit. PRODUCER_FENCED from v3 on.

use super::super::error::{ApiError, NONE};
use super::super::group::{ask, unknown_partitions};
use super::super::Reply;
use super::fenced_for;
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::messages::{CommitOffset, TxnCommitOffsets};
use kaas_protocol::kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kaas_protocol::kafka_protocol::messages::{TxnOffsetCommitRequest, TxnOffsetCommitResponse};
use kaas_protocol::kafka_protocol::ResponseError;
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

/// The code of the coordinator's answer at request version `v`.
fn txn_code(e: ResponseError, v: i16) -> i16 {
    match fenced_for(e, v, 3) {
        ResponseError::StaleMemberEpoch => ResponseError::IllegalGeneration.code(),
        e => e.code(),
    }
}

async fn commit(b: &Broker, v: i16, r: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse {
    let group = r.group_id.0.to_string();
    let parts: Vec<(String, i32)> = r
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.name.0.to_string(), p.partition_index))
        })
        .collect();
    let unknown = unknown_partitions(b, &parts).await;
    let offsets: Vec<CommitOffset> = r
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
        .zip(&unknown)
        .filter(|(_, u)| !**u)
        .map(|(o, _)| o)
        .collect();
    let code = if offsets.is_empty() && !parts.is_empty() {
        // Nothing known to commit: the coordinator is not asked (Kafka).
        NONE
    } else {
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
        match ask(b, &group, msg).await {
            Ok(Ok(())) => NONE,
            Ok(Err(e)) => txn_code(e, v),
            Err(e) => ApiError::code(e),
        }
    };
    let mut i = 0;
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
                    rp.error_code = if unknown[i] {
                        ResponseError::UnknownTopicOrPartition.code()
                    } else {
                        code
                    };
                    i += 1;
                    rp
                })
                .collect();
            rt
        })
        .collect();
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_member_epoch_is_an_illegal_generation() {
        assert_eq!(
            txn_code(ResponseError::StaleMemberEpoch, 3),
            ResponseError::IllegalGeneration.code()
        );
        assert_eq!(
            txn_code(ResponseError::ProducerFenced, 2),
            ResponseError::InvalidProducerEpoch.code()
        );
        assert_eq!(
            txn_code(ResponseError::UnknownMemberId, 3),
            ResponseError::UnknownMemberId.code()
        );
    }
}
