//! ListTransactions (key 66), v0-v1: the transactions of every shard this
//! broker coordinates, filtered by state names, producer ids and (v1,
//! KIP-994) a minimum running time. A state filter Kafka does not know is
//! echoed in `unknown_state_filters`. v2's transactional-id pattern is not
//! advertised.

use super::super::{s, Reply};
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::clock::wall_ms;
use kaas_actors::txn::messages::ListTxns;
use kaas_actors::txn::state::TxnStatus;
use kaas_protocol::kafka_protocol::messages::list_transactions_response::TransactionState;
use kaas_protocol::kafka_protocol::messages::{
    ListTransactionsRequest, ListTransactionsResponse, ProducerId, TransactionalId,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

const STATES: &[TxnStatus] = &[
    TxnStatus::Empty,
    TxnStatus::Ongoing,
    TxnStatus::PrepareCommit,
    TxnStatus::PrepareAbort,
    TxnStatus::CompleteCommit,
    TxnStatus::CompleteAbort,
];

/// Ask every local transaction coordinator.
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: ListTransactionsRequest,
) -> Reply<ListTransactionsResponse> {
    let b = b.clone();
    Reply::Later(
        async move {
            let mut resp = ListTransactionsResponse::default();
            let known = |f: &str| {
                STATES.iter().any(|x| x.name() == f) || f == "PrepareEpochFence" || f == "Dead"
            };
            resp.unknown_state_filters = r
                .state_filters
                .iter()
                .filter(|f| !known(f))
                .cloned()
                .collect();
            let duration = if v >= 1 { r.duration_filter } else { -1 };
            let now = wall_ms();
            for h in b.txn_coordinators() {
                let txns = match h.addr.send(ListTxns).await {
                    Ok(Ok(t)) => t,
                    Ok(Err(kaas_actors::txn::messages::CoordinatorError::Loading)) => {
                        resp.error_code = ResponseError::CoordinatorLoadInProgress.code();
                        continue;
                    }
                    _ => continue,
                };
                for m in txns {
                    if !r.state_filters.is_empty()
                        && !r.state_filters.iter().any(|f| **f == *m.status.name())
                    {
                        continue;
                    }
                    if !r.producer_id_filters.is_empty()
                        && !r.producer_id_filters.contains(&ProducerId(m.producer_id))
                    {
                        continue;
                    }
                    if duration >= 0
                        && (m.status != TxnStatus::Ongoing
                            || now.saturating_sub(m.start_ms) < duration)
                    {
                        continue;
                    }
                    let mut t = TransactionState::default();
                    t.transactional_id = TransactionalId(s(&m.transactional_id));
                    t.producer_id = ProducerId(m.producer_id);
                    t.transaction_state = s(m.status.name());
                    resp.transaction_states.push(t);
                }
            }
            resp
        }
        .boxed(),
    )
}
