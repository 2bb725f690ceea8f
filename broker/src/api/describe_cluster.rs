//! DescribeCluster (key 60): the live brokers and the controller, and the
//! cluster's authorized operations when asked (`authorized`).

use super::{authorized, live_brokers, s, Reply};
use crate::state::Broker;
use kaas_protocol::kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kaas_protocol::kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse,
};
use std::sync::Arc;

/// Answer from the newest assignment.
pub async fn handle(
    b: &Arc<Broker>,
    _v: i16,
    r: DescribeClusterRequest,
) -> Reply<DescribeClusterResponse> {
    let mut resp = DescribeClusterResponse::default();
    let (brokers, controller) = live_brokers(b);
    resp.cluster_id = s(&b.cluster_id);
    resp.controller_id = BrokerId(controller);
    resp.brokers = brokers
        .into_iter()
        .map(|(id, host, port)| {
            let mut br = DescribeClusterBroker::default();
            br.broker_id = BrokerId(id);
            br.host = s(&host);
            br.port = port;
            br
        })
        .collect();
    // 1 = brokers (KIP-919).
    resp.endpoint_type = 1;
    resp.cluster_authorized_operations =
        authorized::when_asked(r.include_cluster_authorized_operations, authorized::CLUSTER);
    Reply::Now(resp)
}
