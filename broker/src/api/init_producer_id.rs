//! InitProducerId (key 22): idempotent producers get an id from a
//! persisted block; a transactional id goes to its shard's transaction
//! coordinator, which keeps (producer id, epoch) per transactional id,
//! bumps the epoch at every init (fencing the previous producer), aborts
//! an open transaction of the previous epoch first (the client gets
//! CONCURRENT_TRANSACTIONS and retries), accepts the KIP-360 re-init of the
//! current producer, and moves to a new producer id when the epoch is
//! exhausted. New producer ids come from the same blocks: the coordinator
//! answers "need an id", the handler allocates one and asks again.
//! PRODUCER_FENCED from v4 on (INVALID_PRODUCER_EPOCH before, KIP-588).
//!
//! Claiming a block is an O_EXCL create and fsync on the volume: the
//! `ProducerIdBlocks` actor, the blocks' single owner, does it on its own
//! thread; the handler only sends it a message.

use super::error::ApiError;
use super::Reply;
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::producer_id_blocks::AllocateProducerId;
use kaas_actors::txn::messages::{InitAnswer, InitTxnProducer};
use kaas_protocol::kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProducerId,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Ask the producer-id owner for an id.
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: InitProducerIdRequest,
) -> Reply<InitProducerIdResponse> {
    let b = b.clone();
    match r.transactional_id.as_ref().map(|t| t.0.to_string()) {
        // An empty id is no id (the Java client sends null, some send "").
        Some(id) if !id.is_empty() => {
            Reply::Later(async move { init_transactional(&b, v, id, &r).await }.boxed())
        }
        _ => Reply::Later(async move { allocate(&b).await }.boxed()),
    }
}

/// InitProducerId of a transactional id, at its coordinator.
async fn init_transactional(
    b: &Broker,
    v: i16,
    id: String,
    r: &InitProducerIdRequest,
) -> InitProducerIdResponse {
    let given = if v >= 3 {
        (r.producer_id.0, r.producer_epoch)
    } else {
        (-1, -1)
    };
    let mut fresh = None;
    // An idle shard opens on its first init (lazy open): wait for it here,
    // bounded, rather than send the client COORDINATOR_LOAD_IN_PROGRESS.
    let loading_until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut asks = 0;
    // At most: ask, allocate, ask again (and once more if a racing init
    // changed the state meanwhile).
    while asks < 3 {
        asks += 1;
        let msg = InitTxnProducer {
            transactional_id: id.clone(),
            timeout_ms: r.transaction_timeout_ms,
            given,
            fresh,
        };
        match super::txn::ask(b, &id, msg).await {
            Ok(Ok(InitAnswer::Ready(pid, epoch))) => {
                let mut resp = no_id();
                resp.producer_id = ProducerId(pid);
                resp.producer_epoch = epoch;
                return resp;
            }
            Ok(Ok(InitAnswer::NeedProducerId)) => match b.pids.send(AllocateProducerId).await {
                Ok(Ok(pid)) => fresh = Some(pid),
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "producer-id block claim failed");
                    return refused(ResponseError::KafkaStorageError.into());
                }
                Err(_) => return refused(ApiError::blocking_task_failed()),
            },
            Ok(Err(e)) => return refused(super::txn::fenced_for(e, v, 4).into()),
            Err(e)
                if e.code() == ResponseError::CoordinatorLoadInProgress.code()
                    && std::time::Instant::now() < loading_until =>
            {
                asks -= 1;
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            Err(e) => return refused(e),
        }
    }
    refused(ResponseError::ConcurrentTransactions.into())
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
        let r = refused(ResponseError::ProducerFenced.into());
        assert_eq!(r.error_code, 90);
        assert_eq!(r.producer_id, ProducerId(-1));
        assert_eq!(r.producer_epoch, -1);
        assert_eq!(r.ongoing_txn_producer_id, ProducerId(-1));
    }
}
