//! ApiVersions (key 18): the advertised version table.
//!
//! The table itself lives in `kaas_protocol::versions`, the single source of
//! truth `parse_request` also checks against. A version we do not advertise
//! never reaches this handler: the connection answers it with the v0
//! fallback (KIP-511).

use super::Reply;
use crate::state::Broker;
use kaas_protocol::kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use std::sync::Arc;

/// Answer with the advertised table.
pub async fn handle(
    _b: &Arc<Broker>,
    v: i16,
    _r: ApiVersionsRequest,
) -> Reply<ApiVersionsResponse> {
    Reply::Now(kaas_protocol::api_versions_response(v))
}
