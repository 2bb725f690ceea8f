//! FindCoordinator (key 10): the broker that owns the key's coordinator
//! shard. Key type 0 (group) and 1 (transaction) both map to the shard of
//! the key's hash: the same broker runs a shard's group coordinator and
//! its transaction coordinator (one grant). v0-v3 carry one key; v4+ a
//! batch.

use super::super::error::{ApiError, NONE};
use super::super::{s, Reply};
use crate::state::Broker;
use kaas_protocol::kafka_protocol::messages::find_coordinator_response::Coordinator;
use kaas_protocol::kafka_protocol::messages::{
    BrokerId, FindCoordinatorRequest, FindCoordinatorResponse,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;

/// Where one key's coordinator is: (node, host, port) or an error.
fn locate(b: &Broker, key_type: i8, key: &str) -> Result<(i32, String, i32), ApiError> {
    if key_type != 0 && key_type != 1 {
        return Err(ResponseError::InvalidRequest.into());
    }
    let a = b.assignment();
    let (_, e) = b
        .coordinator_entry(key)
        .ok_or(ApiError::from(ResponseError::CoordinatorNotAvailable))?;
    a.brokers
        .iter()
        .find(|x| x.id == e.leader)
        .map(|x| (x.id, x.host.clone(), x.port))
        .ok_or(ResponseError::CoordinatorNotAvailable.into())
}

/// Answer from the metadata cache.
pub async fn handle(
    b: &Arc<Broker>,
    v: i16,
    r: FindCoordinatorRequest,
) -> Reply<FindCoordinatorResponse> {
    let mut resp = FindCoordinatorResponse::default();
    if v >= 4 {
        resp.coordinators = r
            .coordinator_keys
            .iter()
            .map(|k| {
                let mut c = Coordinator::default();
                c.key = k.clone();
                match locate(b, r.key_type, k) {
                    Ok((id, host, port)) => {
                        c.node_id = BrokerId(id);
                        c.host = s(&host);
                        c.port = port;
                        c.error_code = NONE;
                    }
                    Err(e) => {
                        c.node_id = BrokerId(-1);
                        c.port = -1;
                        c.error_code = e.code();
                    }
                }
                c
            })
            .collect();
    } else {
        match locate(b, r.key_type, &r.key) {
            Ok((id, host, port)) => {
                resp.node_id = BrokerId(id);
                resp.host = s(&host);
                resp.port = port;
            }
            Err(e) => {
                resp.error_code = e.code();
                resp.node_id = BrokerId(-1);
                resp.port = -1;
            }
        }
    }
    Reply::Now(resp)
}
