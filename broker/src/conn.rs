//! One client connection: frames in, responses out, in request order.
//!
//! The reader half parses each frame and runs the handler's dispatch phase
//! inline (so appends reach partition leaders in request order), then queues
//! the completion future; the writer half resolves queued futures in order
//! and writes them. Outstanding requests per connection are bounded by their
//! bytes (`MAX_IN_FLIGHT_BYTES` of request frames, a larger frame taking the
//! whole budget) and, for the small ones, by count (`MAX_IN_FLIGHT`): that is
//! the back-pressure from slow fsyncs to the socket. Bounding by bytes rather
//! than by a small count lets one fsync release every small request queued
//! behind it (librdkafka's defaults send many one-record requests), without
//! letting a connection hold unbounded memory.
//! Connections never touch files.
//!
//! Each connection has a [`Slot`]: when the accept loop is at its cap it
//! evicts the connection idle the longest (Kafka closes the least recently
//! used connection too, KIP-402), so a flood of idle sockets cannot lock
//! real clients out.

use crate::api::{self, Dispatched};
use crate::state::Broker;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, SinkExt, StreamExt};
use kaas_protocol::{encode_response, parse_request, FrameCodec, FrameError, RequestError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};

/// Most requests outstanding on one connection.
const MAX_IN_FLIGHT: usize = 1024;
/// Most request bytes outstanding on one connection (a frame larger than
/// this waits until nothing else is outstanding, then takes it all).
const MAX_IN_FLIGHT_BYTES: usize = 32 << 20;

/// A connection as the accept loop sees it: when it last sent a request,
/// and the signal that closes it.
#[derive(Clone)]
pub struct Slot {
    born: Instant,
    /// Milliseconds after `born` of the last complete request (or accept).
    last: Arc<std::sync::atomic::AtomicU64>,
    evict: Arc<tokio::sync::Notify>,
}

impl Default for Slot {
    fn default() -> Self {
        Self::new()
    }
}

impl Slot {
    /// A slot for a connection accepted now.
    pub fn new() -> Self {
        Self {
            born: Instant::now(),
            last: Arc::default(),
            evict: Arc::default(),
        }
    }

    fn touch(&self) {
        let ms = self.born.elapsed().as_millis() as u64;
        self.last.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Time since the connection last sent a complete request.
    pub fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(std::sync::atomic::Ordering::Relaxed));
        self.born.elapsed().saturating_sub(last)
    }

    /// Ask the connection to close (it stops reading; queued answers are
    /// still written). A permit is stored if it is not waiting right now.
    pub fn evict(&self) {
        self.evict.notify_one();
    }
}

/// The protocol's name of an api key ("FindCoordinator"), or "unknown".
fn api_name(key: Option<i16>) -> String {
    key.and_then(|k| kaas_protocol::kafka_protocol::messages::ApiKey::try_from(k).ok())
        .map(|k| format!("{k:?}"))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Serve one connection until it closes, misbehaves or is evicted.
pub async fn serve(b: Arc<Broker>, sock: TcpStream, peer: std::net::SocketAddr, slot: Slot) {
    let _ = sock.set_nodelay(true);
    let (rd, wr) = sock.into_split();
    let mut frames = FramedRead::new(rd, FrameCodec::new(b.args.max_request_bytes));
    let mut out = FramedWrite::new(wr, FrameCodec::new(usize::MAX));
    let (tx, mut rx) = mpsc::channel::<BoxFuture<'static, Option<Bytes>>>(MAX_IN_FLIGHT);
    let budget = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT_BYTES));

    let writer = async move {
        while let Some(f) = rx.recv().await {
            if let Some(bytes) = f.await {
                if out.send(bytes).await.is_err() {
                    return;
                }
            }
        }
    };

    let request_timeout = Duration::from_millis(b.args.request_timeout_ms.max(1));
    let idle_timeout = Duration::from_millis(b.args.idle_timeout_ms.max(1));
    let reader = async move {
        let mut last_activity = Instant::now();
        loop {
            let next = tokio::select! {
                n = tokio::time::timeout(request_timeout, frames.next()) => n,
                _ = slot.evict.notified() => {
                    tracing::debug!(%peer, idle_ms = slot.idle().as_millis() as u64, "idle connection evicted for a new one");
                    return;
                }
            };
            let next = match next {
                Ok(n) => n,
                Err(_) => {
                    if !frames.read_buffer().is_empty() {
                        if let Some(count) =
                            b.peer_warnings.hit(peer.ip(), "stalled", Instant::now())
                        {
                            tracing::warn!(%peer, buffered = frames.read_buffer().len(), count, "incomplete request stalled; closing connection");
                        }
                        return;
                    }
                    if last_activity.elapsed() >= idle_timeout {
                        tracing::debug!(%peer, "idle connection closed");
                        return;
                    }
                    continue;
                }
            };
            last_activity = Instant::now();
            let frame = match next {
                Some(Ok(f)) => {
                    slot.touch();
                    Some(Ok(f))
                }
                other => other,
            };
            let frame = match frame {
                None => return,
                Some(Ok(f)) => f,
                Some(Err(FrameError::Io(_))) => return,
                Some(Err(e)) => {
                    if let Some(count) = b.peer_warnings.hit(peer.ip(), "bad frame", Instant::now())
                    {
                        tracing::warn!(%peer, error = %e, count, "bad frame; closing connection");
                    }
                    return;
                }
            };
            // Taken before the request is dispatched, given back once its
            // answer is written: the reader waits here while the
            // connection's outstanding requests hold the budget.
            let cost = frame.len().clamp(1, MAX_IN_FLIGHT_BYTES) as u32;
            let Ok(permit) = budget.clone().acquire_many_owned(cost).await else {
                return;
            };
            let req = match parse_request(frame) {
                Ok(r) => r,
                Err(RequestError::UnsupportedVersion { header }) if header.api_key == 18 => {
                    // KIP-511: answer ApiVersions v0 with the table.
                    let resp = kaas_protocol::api_versions_fallback_response(header.correlation_id);
                    if tx
                        .send(futures::future::ready(Some(resp)).boxed())
                        .await
                        .is_err()
                    {
                        return;
                    }
                    continue;
                }
                Err(e) => {
                    // Name the API: "unsupported version 0 of api key 10"
                    // says less than FindCoordinator.
                    let api = api_name(e.header().map(|h| h.api_key));
                    if let Some(count) =
                        b.peer_warnings
                            .hit(peer.ip(), "unserviceable", Instant::now())
                    {
                        tracing::warn!(%peer, api = %api, error = %e, count, "unserviceable request; closing connection");
                    }
                    return;
                }
            };
            let header = req.header;
            let fut = match api::with_peer(peer, api::dispatch(&b, &header, req.body)).await {
                Dispatched::Respond(fut) => fut,
                // acks=0 produce: Kafka sends no response at all.
                Dispatched::NoResponse => continue,
                Dispatched::NotAdvertised => {
                    if let Some(count) =
                        b.peer_warnings
                            .hit(peer.ip(), "not advertised", Instant::now())
                    {
                        tracing::warn!(%peer, api = %api_name(Some(header.api_key)), api_key = header.api_key, version = header.api_version, count, "api not advertised; closing connection");
                    }
                    return;
                }
            };
            let f = async move {
                let _permit = permit;
                let body = fut.await;
                match encode_response(&header, &body) {
                    Ok(bytes) => Some(bytes),
                    Err(e) => {
                        tracing::error!(api = %api_name(Some(header.api_key)), api_key = header.api_key, version = header.api_version, error = %e, "response encoding failed");
                        None
                    }
                }
            }
            .boxed();
            if tx.send(f).await.is_err() {
                return;
            }
        }
    };
    // When the reader stops, the writer drains what is queued, then ends.
    let writer = tokio::task::spawn_local(writer);
    reader.await;
    let _ = writer.await;
}
