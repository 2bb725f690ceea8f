//! DescribeTransactions (key 65), v0: each id's state from its shard's
//! coordinator (NOT_COORDINATOR for ids of shards this broker does not own,
//! TRANSACTIONAL_ID_NOT_FOUND for unknown ids).

use super::super::error::ApiError;
use super::super::{s, Reply};
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::txn::messages::DescribeTxns;
use kaas_protocol::kafka_protocol::messages::describe_transactions_response::{
    TopicData, TransactionState,
};
use kaas_protocol::kafka_protocol::messages::{
    DescribeTransactionsRequest, DescribeTransactionsResponse, ProducerId, TopicName,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Ask each id's coordinator.
pub async fn handle(
    b: &Arc<Broker>,
    _v: i16,
    r: DescribeTransactionsRequest,
) -> Reply<DescribeTransactionsResponse> {
    let b = b.clone();
    Reply::Later(
        async move {
            let mut resp = DescribeTransactionsResponse::default();
            for id in &r.transactional_ids {
                let mut st = TransactionState::default();
                st.transactional_id = id.clone();
                st.producer_id = ProducerId(-1);
                st.producer_epoch = -1;
                st.transaction_timeout_ms = 0;
                st.transaction_start_time_ms = -1;
                st.transaction_state = s("");
                let got = super::ask(&b, &id.0, DescribeTxns(vec![id.0.to_string()])).await;
                match got.map(|mut v| v.pop().and_then(|x| x.1)) {
                    Ok(Some(m)) => {
                        st.transaction_state = s(m.status.name());
                        st.transaction_timeout_ms = m.timeout_ms;
                        st.transaction_start_time_ms = m.start_ms;
                        st.producer_id = ProducerId(m.producer_id);
                        st.producer_epoch = m.producer_epoch;
                        let mut topics: BTreeMap<String, Vec<i32>> = BTreeMap::new();
                        for (t, p) in &m.partitions {
                            topics.entry(t.clone()).or_default().push(*p);
                        }
                        st.topics = topics
                            .into_iter()
                            .map(|(t, ps)| {
                                let mut d = TopicData::default();
                                d.topic = TopicName(s(&t));
                                d.partitions = ps;
                                d
                            })
                            .collect();
                    }
                    Ok(None) => st.error_code = ResponseError::TransactionalIdNotFound.code(),
                    Err(e) => st.error_code = ApiError::code(e),
                }
                resp.transaction_states.push(st);
            }
            resp
        }
        .boxed(),
    )
}
