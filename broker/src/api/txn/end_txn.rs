//! EndTxn (key 26), v0-v3: commit or abort. Answered once the decision
//! (PrepareCommit / PrepareAbort) is durable; the coordinator then writes
//! the markers and completes the transaction on its own, and the producer's
//! next transactional request gets CONCURRENT_TRANSACTIONS until it has.
//! PRODUCER_FENCED from v2 on. v5 (KIP-890 part 2: an epoch bump per
//! transaction, returned here) is not advertised.

use super::super::Reply;
use super::{ask, code_of};
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::txn::messages::EndTxn;
use kaas_protocol::kafka_protocol::messages::{EndTxnRequest, EndTxnResponse, ProducerId};
use std::sync::Arc;

/// Forward to the coordinator; the answer waits for the fsync.
pub async fn handle(b: &Arc<Broker>, v: i16, r: EndTxnRequest) -> Reply<EndTxnResponse> {
    let b = b.clone();
    Reply::Later(
        async move {
            let id = r.transactional_id.0.to_string();
            let msg = EndTxn {
                transactional_id: id.clone(),
                producer_id: r.producer_id.0,
                producer_epoch: r.producer_epoch,
                commit: r.committed,
            };
            let mut resp = EndTxnResponse::default();
            resp.error_code = code_of(ask(&b, &id, msg).await, v, 2);
            resp.producer_id = ProducerId(-1);
            resp.producer_epoch = -1;
            resp
        }
        .boxed(),
    )
}
