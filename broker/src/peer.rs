//! A small broker-to-broker Kafka client: the transaction coordinator sends
//! WriteTxnMarkers to the brokers that lead a transaction's partitions.
//!
//! One request per call on a pooled connection: connect to the peer's
//! advertised address (from the assignment's broker list), write one framed
//! request, read its response. Every step is bounded by a timeout; a
//! connection that failed or timed out is dropped, never reused (its
//! stream position is unknown). The pool keeps at most [`PER_PEER`] idle
//! connections per address and [`MAX_PEERS`] addresses.
//!
//! Nothing here retries: the caller (the marker re-drive) re-sends until
//! every partition acknowledged, and the requests it sends are idempotent.

use bytes::{Buf, BufMut, BytesMut};
use kaas_protocol::kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kaas_protocol::kafka_protocol::protocol::{
    Decodable, Encodable, HeaderVersion, Request, StrBytes,
};
use kaas_volume::fs::{FdBudget, Permit};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Idle connections kept per peer.
pub const PER_PEER: usize = 4;
/// Peers with idle connections kept.
pub const MAX_PEERS: usize = 64;
/// A response larger than this is refused (markers answers are small).
const MAX_RESPONSE: usize = 16 << 20;

/// Why a peer request failed (the caller re-sends later).
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// Connect, write or read failed.
    #[error("peer i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The step did not finish in time.
    #[error("peer request timed out")]
    Timeout,
    /// The peer answered something we cannot read.
    #[error("peer answered a malformed response: {0}")]
    Malformed(String),
}

/// A pooled connection and its descriptor's permit.
type Conn = (TcpStream, Permit);

/// The client: a bounded pool of idle connections by address.
pub struct PeerClient {
    idle: Mutex<HashMap<(String, i32), Vec<Conn>>>,
    budget: Arc<FdBudget>,
    next_correlation: AtomicI32,
    connect_timeout: Duration,
    request_timeout: Duration,
    client_id: String,
}

impl PeerClient {
    /// A client identifying itself as `client_id`.
    /// Its sockets are data-plane descriptors counted in `budget`.
    pub fn new(client_id: String, budget: Arc<FdBudget>) -> Self {
        Self {
            idle: Mutex::new(HashMap::new()),
            budget,
            next_correlation: AtomicI32::new(1),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(15),
            client_id,
        }
    }

    async fn connection(&self, host: &str, port: i32) -> Result<Conn, PeerError> {
        let pooled = self
            .idle
            .lock()
            .unwrap()
            .get_mut(&(host.to_owned(), port))
            .and_then(|v| v.pop());
        if let Some(c) = pooled {
            return Ok(c);
        }
        let port =
            u16::try_from(port).map_err(|_| PeerError::Malformed(format!("bad port {port}")))?;
        let permit = self.budget.try_acquire()?;
        let c = tokio::time::timeout(self.connect_timeout, TcpStream::connect((host, port)))
            .await
            .map_err(|_| PeerError::Timeout)??;
        c.set_nodelay(true)?;
        Ok((c, permit))
    }

    fn give_back(&self, host: &str, port: i32, c: Conn) {
        let mut idle = self.idle.lock().unwrap();
        let key = (host.to_owned(), port);
        if !idle.contains_key(&key) && idle.len() >= MAX_PEERS {
            return;
        }
        let v = idle.entry(key).or_default();
        if v.len() < PER_PEER {
            v.push(c);
        }
    }

    /// Send `req` at `version` to `host:port` and read its response.
    pub async fn send<R: Request>(
        &self,
        host: &str,
        port: i32,
        version: i16,
        req: &R,
    ) -> Result<R::Response, PeerError> {
        let correlation = self.next_correlation.fetch_add(1, Ordering::Relaxed);
        let frame = encode_request(req, version, correlation, &self.client_id)?;
        let mut conn = self.connection(host, port).await?;
        let c = &mut conn.0;
        let exchange = async {
            c.write_all(&frame).await?;
            let len = c.read_i32().await?;
            let len = usize::try_from(len)
                .ok()
                .filter(|l| *l <= MAX_RESPONSE)
                .ok_or_else(|| PeerError::Malformed(format!("response length {len}")))?;
            let mut body = vec![0u8; len];
            c.read_exact(&mut body).await?;
            Ok::<_, PeerError>(body)
        };
        let body = tokio::time::timeout(self.request_timeout, exchange)
            .await
            .map_err(|_| PeerError::Timeout)??;
        let resp = decode_response::<R>(&body, version, correlation)?;
        self.give_back(host, port, conn);
        Ok(resp)
    }
}

/// A length-prefixed request frame.
pub fn encode_request<R: Request>(
    req: &R,
    version: i16,
    correlation: i32,
    client_id: &str,
) -> Result<BytesMut, PeerError> {
    let mut h = RequestHeader::default();
    h.request_api_key = R::KEY;
    h.request_api_version = version;
    h.correlation_id = correlation;
    h.client_id = Some(StrBytes::from_string(client_id.to_owned()));
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    h.encode(&mut buf, R::header_version(version))
        .map_err(|e| PeerError::Malformed(format!("{e:#}")))?;
    req.encode(&mut buf, version)
        .map_err(|e| PeerError::Malformed(format!("{e:#}")))?;
    let len = i32::try_from(buf.len() - 4).map_err(|_| PeerError::Malformed("too large".into()))?;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf)
}

/// Decode a response body (without its length prefix).
pub fn decode_response<R: Request>(
    body: &[u8],
    version: i16,
    correlation: i32,
) -> Result<R::Response, PeerError> {
    let mut b = bytes::Bytes::copy_from_slice(body);
    let h = ResponseHeader::decode(&mut b, R::Response::header_version(version))
        .map_err(|e| PeerError::Malformed(format!("{e:#}")))?;
    if h.correlation_id != correlation {
        return Err(PeerError::Malformed(format!(
            "correlation {} for request {correlation}",
            h.correlation_id
        )));
    }
    let r =
        R::Response::decode(&mut b, version).map_err(|e| PeerError::Malformed(format!("{e:#}")))?;
    if b.has_remaining() {
        return Err(PeerError::Malformed("trailing bytes".into()));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_protocol::kafka_protocol::messages::{
        ApiKey, WriteTxnMarkersRequest, WriteTxnMarkersResponse,
    };

    #[test]
    fn a_request_frame_parses_as_the_broker_parses_it() {
        let req = WriteTxnMarkersRequest::default();
        let frame = encode_request(&req, 1, 7, "kaas-txn").unwrap();
        let mut body = frame.freeze().slice(4..);
        let h =
            kaas_protocol::kafka_protocol::protocol::decode_request_header_from_buffer(&mut body)
                .unwrap();
        assert_eq!(h.request_api_key, ApiKey::WriteTxnMarkers as i16);
        assert_eq!((h.request_api_version, h.correlation_id), (1, 7));
        let back = WriteTxnMarkersRequest::decode(&mut body, 1).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn a_response_with_another_correlation_is_refused() {
        let mut buf = BytesMut::new();
        let mut h = ResponseHeader::default();
        h.correlation_id = 3;
        h.encode(&mut buf, WriteTxnMarkersResponse::header_version(1))
            .unwrap();
        WriteTxnMarkersResponse::default()
            .encode(&mut buf, 1)
            .unwrap();
        assert!(decode_response::<WriteTxnMarkersRequest>(&buf, 1, 3).is_ok());
        assert!(matches!(
            decode_response::<WriteTxnMarkersRequest>(&buf, 1, 4),
            Err(PeerError::Malformed(_))
        ));
    }
}
