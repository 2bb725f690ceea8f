//! InitProducerId (key 22): idempotent producers get an id from a
//! persisted block; transactional ids are refused (transactions are not
//! implemented yet, and an id we cannot fence must not be handed out).
//!
//! Claiming a block is an O_EXCL create and fsync on the volume: the
//! `ProducerIdBlocks` actor, the blocks' single owner, does it on its own
//! thread; the handler only sends it a message.

use super::error::ApiError;
use super::Reply;
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::producer_id_blocks::AllocateProducerId;
use kaas_protocol::kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProducerId,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Ask the producer-id owner for an id.
pub async fn handle(
    b: &Arc<Broker>,
    _v: i16,
    r: InitProducerIdRequest,
) -> Reply<InitProducerIdResponse> {
    if r.transactional_id.is_some() {
        // Transactions are a later issue: refuse with a fatal code rather
        // than hand out an id we cannot fence.
        return Reply::Now(refused(
            ResponseError::TransactionalIdAuthorizationFailed.into(),
        ));
    }
    let b = b.clone();
    Reply::Later(async move { allocate(&b).await }.boxed())
}

/// A response carrying no id yet (-1 everywhere, error 0).
fn no_id() -> InitProducerIdResponse {
    let mut resp = InitProducerIdResponse::default();
    resp.producer_id = ProducerId(-1);
    resp.producer_epoch = -1;
    resp.ongoing_txn_producer_id = ProducerId(-1);
    resp.ongoing_txn_producer_epoch = -1;
    resp
}

/// A response carrying no id and `e`.
fn refused(e: ApiError) -> InitProducerIdResponse {
    let mut resp = no_id();
    resp.error_code = e.code();
    resp
}

async fn allocate(b: &Broker) -> InitProducerIdResponse {
    match b.pids.send(AllocateProducerId).await {
        Ok(Ok(id)) => {
            let mut resp = no_id();
            resp.producer_id = ProducerId(id);
            resp.producer_epoch = 0;
            resp
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "producer-id block claim failed");
            refused(ResponseError::KafkaStorageError.into())
        }
        Err(e) => {
            // The owner stopped mid-claim: whether a block was claimed is
            // unknown (it is never reissued either way).
            tracing::error!(error = %e, "producer-id owner unavailable");
            refused(ApiError::blocking_task_failed())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_carries_no_id() {
        let r = refused(ResponseError::TransactionalIdAuthorizationFailed.into());
        assert_eq!(r.error_code, 53);
        assert_eq!(r.producer_id, ProducerId(-1));
        assert_eq!(r.producer_epoch, -1);
        assert_eq!(r.ongoing_txn_producer_id, ProducerId(-1));
    }
}
