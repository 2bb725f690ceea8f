//! One client connection: frames in, responses out, in request order.
//!
//! The reader half parses each frame and runs the handler's dispatch phase
//! inline (so appends reach partition leaders in request order), then queues
//! the completion future; the writer half resolves queued futures in order
//! and writes them. What a connection holds is bounded by bytes, not by a
//! count of requests: each request read is charged its frame (plus
//! [`REQUEST_OVERHEAD`] for its queued future) to the connection's
//! [`ByteBudget`] (`--conn-inflight-bytes`) and to the broker's
//! (`--broker-inflight-bytes`) until its answer is written, and an answer
//! is charged its own bytes while it is being written. The reader reads the
//! next frame only while both are below their limits, so a connection whose
//! answers are not being taken stops being read (TCP back-pressure to the
//! client), and a slow fsync releases every small request queued behind it
//! at once (librdkafka's defaults send many one-record requests). A
//! connection holds at most its limit, plus one frame being read, plus one
//! answer being written. The writer never waits on a budget (the bytes it
//! releases are what the readers wait for), and an answer the client takes
//! none of for `--request-timeout-ms` closes the connection, so a client
//! that never reads cannot hold the broker's budget for ever.
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
use futures::{FutureExt, StreamExt};
use kaas_protocol::{
    encode_response, parse_oversized_produce, parse_request, Frame, FrameCodec, FrameError,
    RequestError,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};
use tokio_util::codec::FramedRead;

/// What a request costs beyond its frame while it is outstanding: its
/// queued completion future and the answer's small allocations. Also what
/// bounds the number of tiny requests one connection can queue.
pub const REQUEST_OVERHEAD: usize = 1024;

/// Bytes held for requests read and answers not yet written, against a
/// limit. Charging never waits (an answer must be written whatever it
/// costs); reading waits for [`ByteBudget::below_limit`]. So the bytes
/// held stay under the limit plus what was charged after the last check.
#[derive(Debug)]
pub struct ByteBudget {
    limit: usize,
    used: AtomicUsize,
    freed: Notify,
}

impl ByteBudget {
    /// A budget of `limit` bytes (at least 1).
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            used: AtomicUsize::new(0),
            freed: Notify::new(),
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Hold `n` more bytes until the returned [`Charge`] is dropped.
    pub fn charge(self: &Arc<Self>, n: usize) -> Charge {
        self.used.fetch_add(n, Ordering::AcqRel);
        Charge {
            budget: self.clone(),
            n,
        }
    }

    /// Hold up to `want` bytes for something about to be built (a Fetch
    /// answer): as much of `want` as is free, waiting up to `patience` for
    /// at least `min(want, floor)` to be free. Never waits longer, and may
    /// grant 0: whoever holds the budget may be queued behind the caller on
    /// its own connection, so waiting for ever could deadlock; a smaller
    /// (or empty) answer is always allowed.
    pub async fn take_up_to(
        self: &Arc<Self>,
        want: usize,
        floor: usize,
        patience: Duration,
    ) -> Charge {
        let need = want.min(floor);
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let timed_out = tokio::time::Instant::now() >= deadline;
            let mut used = self.used();
            loop {
                let free = self.limit.saturating_sub(used);
                if free < need && !timed_out {
                    break;
                }
                let n = want.min(free);
                match self.used.compare_exchange_weak(
                    used,
                    used + n,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        return Charge {
                            budget: self.clone(),
                            n,
                        }
                    }
                    Err(now) => used = now,
                }
            }
            let _ = tokio::time::timeout_at(deadline, freed).await;
        }
    }

    /// Wait until fewer than `limit` bytes are held.
    pub async fn below_limit(&self) {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so a release between the check
            // and the await still wakes us.
            freed.as_mut().enable();
            if self.used() < self.limit {
                return;
            }
            freed.await;
        }
    }
}

/// Bytes held in a [`ByteBudget`], given back on drop.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<ByteBudget>,
    n: usize,
}

impl Charge {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.n
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.n, Ordering::AcqRel);
        self.budget.freed.notify_waiters();
    }
}

/// `n` bytes charged to the connection's budget and the broker's.
fn charge_both(conn: &Arc<ByteBudget>, broker: &Arc<ByteBudget>, n: usize) -> [Charge; 2] {
    [conn.charge(n), broker.charge(n)]
}

/// The broker's in-flight bytes in Prometheus text.
pub fn prometheus(b: &Broker) -> String {
    format!(
        "# HELP kaas_inflight_bytes Bytes held by requests not yet answered and answers not yet written, over all connections.\n# TYPE kaas_inflight_bytes gauge\nkaas_inflight_bytes {}\n# HELP kaas_inflight_bytes_limit --broker-inflight-bytes: no connection is read while kaas_inflight_bytes is at it.\n# TYPE kaas_inflight_bytes_limit gauge\nkaas_inflight_bytes_limit {}\n",
        b.inflight.used(),
        b.inflight.limit()
    )
}

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

/// A queued answer: its future and the bytes its request holds until the
/// answer is written.
type Queued = (BoxFuture<'static, Option<Bytes>>, [Charge; 2]);

/// Write `bytes` whole; `false` when the socket failed or took none of
/// them for `stall`.
async fn write_answer(
    wr: &mut tokio::net::tcp::OwnedWriteHalf,
    mut bytes: &[u8],
    stall: Duration,
) -> bool {
    while !bytes.is_empty() {
        match tokio::time::timeout(stall, wr.write(bytes)).await {
            Ok(Ok(n)) if n > 0 => bytes = &bytes[n..],
            _ => return false,
        }
    }
    true
}

/// Serve one connection until it closes, misbehaves or is evicted.
pub async fn serve(b: Arc<Broker>, sock: TcpStream, peer: std::net::SocketAddr, slot: Slot) {
    let _ = sock.set_nodelay(true);
    let (rd, mut wr) = sock.into_split();
    let mut frames = FramedRead::new(rd, FrameCodec::new(b.args.max_request_bytes));
    // Unbounded in count: the byte budgets bound it (every queued request
    // holds at least REQUEST_OVERHEAD of them).
    let (tx, mut rx) = mpsc::unbounded_channel::<Queued>();
    let conn_budget = Arc::new(ByteBudget::new(b.args.conn_inflight_bytes as usize));
    let broker_budget = b.inflight.clone();
    let request_timeout = Duration::from_millis(b.args.request_timeout_ms.max(1));

    let writer = {
        let (conn_budget, broker_budget) = (conn_budget.clone(), broker_budget.clone());
        async move {
            while let Some((f, _held)) = rx.recv().await {
                let Some(bytes) = f.await else { continue };
                // Charged while written: a client not taking its answers
                // keeps the connection at its limit, so it is not read.
                let _answer = charge_both(&conn_budget, &broker_budget, bytes.len());
                if !write_answer(&mut wr, &bytes, request_timeout).await {
                    tracing::debug!(%peer, bytes = bytes.len(), "answer not taken; closing connection");
                    return;
                }
            }
        }
    };

    let idle_timeout = Duration::from_millis(b.args.idle_timeout_ms.max(1));
    let reader = async move {
        let mut last_activity = Instant::now();
        loop {
            // Read nothing more while this connection, or the broker, holds
            // its limit of unanswered requests and unwritten answers.
            tokio::select! {
                _ = async {
                    conn_budget.below_limit().await;
                    broker_budget.below_limit().await;
                } => {}
                _ = tx.closed() => return,
                _ = slot.evict.notified() => {
                    tracing::debug!(%peer, idle_ms = slot.idle().as_millis() as u64, "idle connection evicted for a new one");
                    return;
                }
            }
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
                Some(Err(FrameError::TooLarge { size, max, api_key })) => {
                    // Kafka closes too; only Produce is answered (below).
                    if let Some(count) =
                        b.peer_warnings
                            .hit(peer.ip(), "request too large", Instant::now())
                    {
                        tracing::warn!(%peer, api = %api_name(Some(api_key)), api_key, size, max_request_bytes = max, count, "request over --max-request-bytes; closing connection");
                    }
                    return;
                }
                Some(Err(e)) => {
                    if let Some(count) = b.peer_warnings.hit(peer.ip(), "bad frame", Instant::now())
                    {
                        tracing::warn!(%peer, error = %e, count, "bad frame; closing connection");
                    }
                    return;
                }
            };
            // An oversized Produce: only its head was kept (see `Frame`).
            let (frame, oversized) = match frame {
                Frame::Whole(f) => (f, None),
                Frame::Oversized { head, size } => (head, Some(size)),
            };
            // Held until the answer is written (or, with no answer, until
            // dispatch is done).
            let held = charge_both(&conn_budget, &broker_budget, frame.len() + REQUEST_OVERHEAD);
            let parsed = match oversized {
                None => parse_request(frame),
                Some(_) => parse_oversized_produce(&frame),
            };
            let req = match parsed {
                Ok(r) => r,
                Err(RequestError::UnsupportedVersion { header }) if header.api_key == 18 => {
                    // KIP-511: answer ApiVersions v0 with the table.
                    let resp = kaas_protocol::api_versions_fallback_response(header.correlation_id);
                    if tx
                        .send((futures::future::ready(Some(resp)).boxed(), held))
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
            let dispatched = match oversized {
                None => api::with_peer(peer, api::dispatch(&b, &header, req.body)).await,
                Some(size) => {
                    if let Some(count) =
                        b.peer_warnings
                            .hit(peer.ip(), "produce too large", Instant::now())
                    {
                        tracing::warn!(%peer, size, max_request_bytes = b.args.max_request_bytes, count, "produce request over --max-request-bytes; answered MESSAGE_TOO_LARGE");
                    }
                    api::dispatch_oversized(&header, req.body)
                }
            };
            let fut = match dispatched {
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
            if tx.send((f, held)).is_err() {
                return;
            }
        }
    };
    // When the reader stops, the writer drains what is queued, then ends.
    let writer = tokio::task::spawn_local(writer);
    reader.await;
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn budget_charges_without_waiting_and_reads_wait_below_limit() {
        let b = Arc::new(ByteBudget::new(100));
        // Under the limit: a read may proceed at once.
        b.below_limit()
            .now_or_never()
            .expect("empty budget is below its limit");
        let small = b.charge(60);
        b.below_limit().now_or_never().expect("60 < 100");
        // A charge never waits, even past the limit (an answer must go out).
        let big = b.charge(500);
        assert_eq!(b.used(), 560);
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.below_limit().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "at the limit: no read");
        drop(small);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "500 still held");
        drop(big);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken by the release")
            .unwrap();
        assert_eq!(b.used(), 0);
    }

    #[tokio::test]
    async fn a_release_between_check_and_wait_is_not_lost() {
        let b = Arc::new(ByteBudget::new(1));
        for _ in 0..200 {
            let c = b.charge(1);
            let w = tokio::spawn({
                let b = b.clone();
                async move { b.below_limit().await }
            });
            let r = tokio::spawn(async move { drop(c) });
            r.await.unwrap();
            tokio::time::timeout(Duration::from_secs(5), w)
                .await
                .expect("no lost wake-up")
                .unwrap();
        }
    }

    #[test]
    fn charges_add_up_on_both_budgets() {
        let conn = Arc::new(ByteBudget::new(10));
        let broker = Arc::new(ByteBudget::new(1000));
        let h1 = charge_both(&conn, &broker, 7);
        let h2 = charge_both(&conn, &broker, 5);
        assert_eq!((conn.used(), broker.used()), (12, 12));
        drop(h1);
        assert_eq!((conn.used(), broker.used()), (5, 5));
        drop(h2);
        assert_eq!((conn.used(), broker.used()), (0, 0));
        assert_eq!(ByteBudget::new(0).limit(), 1);
    }

    #[tokio::test]
    async fn take_up_to_grants_what_is_free_and_waits_only_for_the_floor() {
        let b = Arc::new(ByteBudget::new(100));
        // Free: all of it, capped at the limit.
        let a = b.take_up_to(60, 10, Duration::from_secs(1)).await;
        assert_eq!((a.bytes(), b.used()), (60, 60));
        // Less free than wanted but at least the floor: granted at once.
        let c = b.take_up_to(60, 10, Duration::from_secs(1)).await;
        assert_eq!((c.bytes(), b.used()), (40, 100));
        // Nothing free: waits for a release, then takes what was freed.
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.take_up_to(50, 10, Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "granted with nothing free");
        drop(a);
        let w = waiter.await.unwrap();
        assert_eq!((w.bytes(), b.used()), (50, 90));
        // Less than the floor free: waits its patience, then takes what is
        // free rather than wait for ever.
        let t0 = std::time::Instant::now();
        let z = b.take_up_to(50, 20, Duration::from_millis(300)).await;
        assert!(t0.elapsed() >= Duration::from_millis(290));
        assert_eq!((z.bytes(), b.used()), (10, 100));
        // Nothing free at all: an empty grant, not a deadlock.
        let e = b.take_up_to(5, 5, Duration::from_millis(50)).await;
        assert_eq!((e.bytes(), b.used()), (0, 100));
        drop((c, w, z, e));
        assert_eq!(b.used(), 0);
    }
}
