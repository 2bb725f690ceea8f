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
//! next frame only while the connection is below its limit, so a
//! connection whose answers are not being taken stops being read (TCP
//! back-pressure to the client), and a slow fsync releases every small
//! request queued behind it at once (librdkafka's defaults send many
//! one-record requests). A connection holds at most its limit, plus one
//! frame being read, plus one answer being written. A frame being read is
//! charged to the broker's budget before its bytes are read
//! ([`FrameReader`]: its whole size once its length prefix is in), so the
//! frames being read over every connection hold at most that budget,
//! whatever clients declare and however slowly they send it; the last
//! eighth of it is kept for frames of at most [`SMALL_FRAME`], so large
//! frames that never finish cannot stop small requests being read. The
//! writer never waits on a budget (the bytes it releases are what the
//! readers wait for), and an answer the client takes
//! none of for `--request-timeout-ms` closes the connection, so a client
//! that never reads cannot hold the broker's budget for ever.
//!
//! An answer is a sequence of [`Part`]s: encoded bytes, written with
//! `writev` (`sendmsg` with `MSG_MORE` ahead of a file range), and (a
//! Fetch's records) ranges of segment files, sent with
//! `sendfile` from the file to the socket, so record bytes are never
//! copied through the broker. The frame length is committed before the
//! first byte goes out, so a file that turns out shorter than its range
//! (never expected: the range is durable, segments are append-only) fails
//! the connection rather than sending anything else. `sendfile` may read
//! the volume (a page-cache miss, an NFS round trip), so it runs on the
//! blocking pool, as every other read does, waiting for the socket with
//! `poll`. Connections open no files: a range comes with the handle the
//! partition's reader took.
//!
//! Each connection has a [`Slot`]: when the accept loop is at its cap it
//! evicts the connection idle the longest (Kafka closes the least recently
//! used connection too, KIP-402), so a flood of idle sockets cannot lock
//! real clients out.

use crate::api::{self, Dispatched};
use crate::state::Broker;
use bytes::BufMut;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use kaas_actors::partition::reader::FileRange;
use kaas_protocol::kafka_protocol::messages::RequestKind;
use kaas_protocol::{
    parse_oversized_produce, parse_request, Frame, FrameCodec, FrameError, RequestError,
};
use kaas_volume::fs::{FdBudget, Permit};
use std::io::IoSlice;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};
use tokio_util::codec::Decoder;

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

    /// Grow `charge` (one of this budget's) to `to` bytes, waiting until
    /// the rest of the budget (what is held besides `charge`) plus `to` fits
    /// in `cap`, or, when `to` alone is larger than `cap`, until the rest
    /// is within an eighth of the limit. Never holds more than it
    /// was admitted for, so the bytes it admits stay within `cap`. Cancel
    /// safe: `charge` grows in one step or not at all.
    pub async fn admit(self: &Arc<Self>, charge: &mut Charge, to: usize, cap: usize) {
        debug_assert!(Arc::ptr_eq(&charge.budget, self));
        // Larger than the cap: admitted once the rest of the budget is
        // within an eighth of the limit (idle connections and small
        // requests always hold a little; waiting for nothing would starve).
        let cap = if to > cap { to + self.limit / 8 } else { cap };
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let mut used = self.used();
            loop {
                if charge.n >= to {
                    return;
                }
                let others = used.saturating_sub(charge.n);
                if others + to > cap {
                    break;
                }
                match self.used.compare_exchange_weak(
                    used,
                    others + to,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        charge.n = to;
                        return;
                    }
                    Err(now) => used = now,
                }
            }
            freed.await;
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

    /// Hold `n` bytes (more, never fewer), without waiting.
    pub fn grow_to(&mut self, n: usize) {
        if n > self.n {
            self.budget.used.fetch_add(n - self.n, Ordering::AcqRel);
            self.n = n;
        }
    }

    /// Give back all but `n` bytes (nothing when it holds `n` or fewer).
    pub fn shrink_to(&mut self, n: usize) {
        if n < self.n {
            self.budget.used.fetch_sub(self.n - n, Ordering::AcqRel);
            self.n = n;
            self.budget.freed.notify_waiters();
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.n, Ordering::AcqRel);
        self.budget.freed.notify_waiters();
    }
}

/// The most a read may take before the length of the frame it reads is
/// known (between frames, and through an oversized Produce, whose bytes are
/// dropped as they arrive): read while the broker's budget is below its
/// limit and charged once read, so an idle connection holds nothing and a
/// connection waiting for its frame to be admitted holds at most this.
pub const PREFIX_READ: usize = 8 * 1024;

/// Frames up to this size (prefix included) may use the whole broker
/// budget; larger ones only the first seven eighths of it, so requests a
/// client sends whole and small (a heartbeat, a produce of a few records)
/// are still read while large frames that arrive slowly, or never finish,
/// hold the rest.
pub const SMALL_FRAME: usize = 1 << 20;

/// Frames cut from a socket whose bytes are charged to the broker's budget
/// before they are read: a frame's whole size once its prefix is in (small
/// ones against the whole budget, large ones against seven eighths of it,
/// one larger than that once the rest is within an eighth), and reads of
/// at most [`PREFIX_READ`] while its length is unknown (charged as read,
/// only while the budget is below its limit). Time spent waiting for the
/// budget is the broker's: it never counts as the client stalling.
/// So the frames being read hold at most the budget, however many
/// connections send how much of whatever they declare, and a frame that
/// was admitted is never stopped half way for want of budget (the budget
/// is not spent by frames that all wait for more of it).
struct FrameReader {
    rd: tokio::net::tcp::OwnedReadHalf,
    codec: FrameCodec,
    buf: bytes::BytesMut,
    /// What `buf` holds and may still read into, in the broker's budget.
    room: Charge,
    /// How long the frame begun has been read for (waits for the budget
    /// excluded): the stall clock.
    reading: Duration,
}

/// Why [`FrameReader::next`] returned without a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quiet {
    /// Nothing arrived for the stall interval, and no frame is begun.
    Idle,
    /// A frame begun has been read for the stall interval in all.
    Stalled,
}

impl FrameReader {
    fn new(rd: tokio::net::tcp::OwnedReadHalf, max_frame: usize, budget: &Arc<ByteBudget>) -> Self {
        Self {
            rd,
            codec: FrameCodec::new(max_frame),
            buf: bytes::BytesMut::new(),
            room: budget.charge(0),
            reading: Duration::ZERO,
        }
    }

    /// Bytes read and not yet cut into a frame.
    fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next frame; Ok(None) at the end of the stream. Err when the
    /// client sent nothing for `stall` with no frame begun
    /// ([`Quiet::Idle`]: the caller decides), or when the frame begun has
    /// been read for `stall` in all without completing
    /// ([`Quiet::Stalled`]). Time spent waiting for the broker's budget is
    /// not the client's and does not count. Cancel safe.
    async fn next(&mut self, stall: Duration) -> Result<Option<Result<Frame, FrameError>>, Quiet> {
        use tokio::io::AsyncReadExt;
        loop {
            match self.codec.decode(&mut self.buf) {
                Ok(Some(frame)) => {
                    // The frame is charged as a request from here on.
                    self.room.shrink_to(self.buf.len());
                    self.reading = Duration::ZERO;
                    return Ok(Some(Ok(frame)));
                }
                Ok(None) => {}
                Err(e) => return Ok(Some(Err(e))),
            }
            let begun = !self.buf.is_empty() || self.codec.discarding();
            if !begun {
                self.reading = Duration::ZERO;
            }
            let budget = self.room.budget.clone();
            let limit = budget.limit();
            let want = match self.codec.frame_at_head(&self.buf) {
                Some(whole) => {
                    // Its whole size, before a byte more of it is read.
                    let cap = if whole <= SMALL_FRAME {
                        limit
                    } else {
                        limit - limit / 8
                    };
                    budget.admit(&mut self.room, whole, cap).await;
                    whole - self.buf.len()
                }
                None => {
                    // Its length is not in yet (or it is dropped as it
                    // arrives): a small read while the budget has room,
                    // charged once read, so an idle connection holds none.
                    budget.below_limit().await;
                    PREFIX_READ
                }
            };
            let t0 = Instant::now();
            let read = tokio::time::timeout(
                stall.saturating_sub(self.reading),
                self.rd.read_buf(&mut (&mut self.buf).limit(want.max(1))),
            )
            .await;
            if begun {
                self.reading += t0.elapsed();
            }
            match read {
                Err(_) if begun => return Err(Quiet::Stalled),
                Err(_) => return Err(Quiet::Idle),
                Ok(Ok(0)) => return Ok(None),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Ok(Some(Err(FrameError::Io(e)))),
            }
            // What the buffer holds, and what an oversized Produce keeps
            // of what it dropped, is held.
            let held = self.buf.len() + self.codec.kept();
            if held > self.room.bytes() {
                self.room.grow_to(held);
            }
        }
    }
}

/// `n` bytes charged to the connection's budget and the broker's.
fn charge_both(conn: &Arc<ByteBudget>, broker: &Arc<ByteBudget>, n: usize) -> [Charge; 2] {
    [conn.charge(n), broker.charge(n)]
}

/// The broker's in-flight bytes in Prometheus text.
pub fn prometheus(b: &Broker) -> String {
    format!(
        "# HELP kaas_inflight_bytes Bytes held by frames being read (their whole declared size), requests not yet answered and answers not yet written, over all connections.\n# TYPE kaas_inflight_bytes gauge\nkaas_inflight_bytes {}\n# HELP kaas_inflight_bytes_limit --broker-inflight-bytes: a frame is read only once its size fits under it (frames over 1 MiB: under seven eighths of it).\n# TYPE kaas_inflight_bytes_limit gauge\nkaas_inflight_bytes_limit {}\n",
        b.inflight.used(),
        b.inflight.limit()
    ) + &format!(
        "# HELP kaas_fd_data_plane Descriptors held by the data plane (files, connections, peer and HTTP sockets).\n# TYPE kaas_fd_data_plane gauge\nkaas_fd_data_plane {}\n# HELP kaas_fd_data_plane_cap The data plane's descriptor cap (the limit less the control plane's reserve and the runtime's own).\n# TYPE kaas_fd_data_plane_cap gauge\nkaas_fd_data_plane_cap {}\n# HELP kaas_fd_data_plane_refused_total Data-plane opens and accepts refused at the cap.\n# TYPE kaas_fd_data_plane_refused_total counter\nkaas_fd_data_plane_refused_total {}\n",
        b.fd_budget.held(),
        b.fd_budget.cap(),
        b.fd_budget.refused()
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

/// One piece of an answer's frame.
#[derive(Debug)]
pub enum Part {
    /// Encoded bytes.
    Bytes(Bytes),
    /// A range of a segment file, sent from the file.
    File(FileRange),
}

impl Part {
    /// Bytes this part puts on the wire.
    pub fn len(&self) -> usize {
        match self {
            Part::Bytes(b) => b.len(),
            Part::File(f) => f.len as usize,
        }
    }

    /// Whether it puts none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A queued answer: its future, the bytes its request holds until the
/// answer is written, and (a Produce) when its frame was read, for
/// `kaas_produce_seconds`.
type Queued = (
    BoxFuture<'static, Option<Vec<Part>>>,
    [Charge; 2],
    Option<Instant>,
);

/// Queue an answer already encoded (no handler ran): the ApiVersions
/// fallback, a refused version. Err when the writer is gone.
fn queue_ready(
    tx: &mpsc::UnboundedSender<Queued>,
    resp: bytes::Bytes,
    held: [Charge; 2],
) -> Result<(), ()> {
    tx.send((
        futures::future::ready(Some(vec![Part::Bytes(resp)])).boxed(),
        held,
        None,
    ))
    .map_err(|_| ())
}

/// Why an answer was not written whole.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    /// The socket failed (or the peer went away).
    #[error("socket: {0}")]
    Socket(#[from] std::io::Error),
    /// The client took none of the answer for the stall interval.
    #[error("answer not taken")]
    Stalled,
    /// A file range could not be sent whole (a failed read, or a file
    /// shorter than its range).
    #[error("file range at {pos}+{len}: {source}")]
    File {
        pos: u64,
        len: u64,
        source: std::io::Error,
    },
    /// The blocking task sending a range did not finish.
    #[error("blocking send task failed")]
    Task,
}

/// Write `parts` in order, whole. An answer of bytes only is written here
/// with vectored writes; one with file ranges is written by one task on
/// the blocking pool ([`send_parts`]: `writev` for the byte runs,
/// `sendfile` for the ranges, since reading a range may block on the
/// volume), through `sock`, a duplicate of the socket's descriptor made on
/// first use, so the task never outlives the descriptor it writes to.
///
/// The duplicate is a descriptor of the data plane: it takes a permit of
/// `budget` (kept with it), and a connection refused one is closed (the
/// client reconnects) rather than take the control plane's descriptors.
async fn write_answer(
    wr: &mut tokio::net::tcp::OwnedWriteHalf,
    sock: &mut Option<Arc<(OwnedFd, Permit)>>,
    budget: &Arc<FdBudget>,
    parts: Vec<Part>,
    stall: Duration,
) -> Result<(), WriteError> {
    if !parts.iter().any(|p| matches!(p, Part::File(_))) {
        let run: Vec<Bytes> = parts
            .into_iter()
            .filter_map(|p| match p {
                Part::Bytes(b) if !b.is_empty() => Some(b),
                _ => None,
            })
            .collect();
        return write_run(wr, &run, stall).await;
    }
    let fd = match sock {
        Some(fd) => fd.clone(),
        None => {
            let permit = budget.try_acquire()?;
            let fd = Arc::new((wr.as_ref().as_fd().try_clone_to_owned()?, permit));
            *sock = Some(fd.clone());
            fd
        }
    };
    tokio::task::spawn_blocking(move || send_parts(&fd.0, &parts, stall))
        .await
        .map_err(|_| WriteError::Task)?
}

/// Blocking: write `parts` whole to the non-blocking socket `sock`, byte
/// runs with `writev`, file ranges with [`send_range`], waiting with
/// `poll` for room.
fn send_parts(sock: &OwnedFd, parts: &[Part], stall: Duration) -> Result<(), WriteError> {
    let mut i = 0;
    while i < parts.len() {
        let run_end = parts[i..]
            .iter()
            .position(|p| matches!(p, Part::File(_)))
            .map_or(parts.len(), |n| i + n);
        let mut slices: Vec<IoSlice<'_>> = parts[i..run_end]
            .iter()
            .filter_map(|p| match p {
                Part::Bytes(b) if !b.is_empty() => Some(IoSlice::new(b)),
                _ => None,
            })
            .collect();
        // Bytes followed by a file range (a Fetch's headers): MSG_MORE
        // holds them back for the range's first bytes instead of pushing
        // the few header bytes on their own (TCP_NODELAY is set);
        // sendfile pushes as it ends (only ahead of a non-empty range:
        // nothing would push after an empty one).
        let flags = if parts.get(run_end).is_some_and(|p| !p.is_empty()) {
            rustix::net::SendFlags::MORE
        } else {
            rustix::net::SendFlags::empty()
        };
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let n = rest.len().min(512);
            let mut no_control = rustix::net::SendAncillaryBuffer::default();
            match rustix::net::sendmsg(sock, &rest[..n], &mut no_control, flags) {
                Ok(n) => IoSlice::advance_slices(&mut rest, n),
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => wait_writable(sock, stall)?,
                Err(e) => return Err(std::io::Error::from(e).into()),
            }
        }
        if let Some(Part::File(range)) = parts.get(run_end) {
            send_range(sock, range, stall)?;
        }
        i = run_end + 1;
    }
    Ok(())
}

/// Blocking: wait until `sock` has room, at most `stall`.
fn wait_writable(sock: &OwnedFd, stall: Duration) -> Result<(), WriteError> {
    let mut fds = [rustix::event::PollFd::new(
        sock,
        rustix::event::PollFlags::OUT,
    )];
    let timeout = rustix::event::Timespec {
        tv_sec: stall.as_secs() as _,
        tv_nsec: stall.subsec_nanos() as _,
    };
    match rustix::event::poll(&mut fds, Some(&timeout)) {
        Ok(0) => Err(WriteError::Stalled),
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(std::io::Error::from(e).into()),
    }
}

/// Write `run` whole with vectored writes.
async fn write_run(
    wr: &mut tokio::net::tcp::OwnedWriteHalf,
    run: &[Bytes],
    stall: Duration,
) -> Result<(), WriteError> {
    // (part, bytes of it already written)
    let (mut i, mut done) = (0usize, 0usize);
    while i < run.len() {
        let mut slices = Vec::with_capacity((run.len() - i).min(64));
        slices.push(IoSlice::new(&run[i][done..]));
        slices.extend(run[i + 1..].iter().take(63).map(|b| IoSlice::new(b)));
        let n = match tokio::time::timeout(stall, wr.write_vectored(&slices)).await {
            Ok(Ok(n)) if n > 0 => n,
            Ok(Ok(_)) => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into()),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(WriteError::Stalled),
        };
        let mut left = n;
        while left > 0 && i < run.len() {
            let rest = run[i].len() - done;
            if left >= rest {
                left -= rest;
                i += 1;
                done = 0;
            } else {
                done += left;
                left = 0;
            }
        }
    }
    Ok(())
}

/// Send `range` whole to the non-blocking socket `sock`, from the file's
/// descriptor with `sendfile` (the copy path, reads into one reused
/// buffer, for a handle without one), waiting with `poll` for room.
/// Blocking: run it on the blocking pool.
fn send_range(sock: &OwnedFd, range: &FileRange, stall: Duration) -> Result<(), WriteError> {
    use rustix::io::Errno;
    let file_err = |source: std::io::Error| WriteError::File {
        pos: range.pos,
        len: range.len,
        source,
    };
    let end = range.pos + range.len;
    let mut off = range.pos;
    let mut buf = Vec::new();
    let mut pending = 0..0;
    while off < end || !pending.is_empty() {
        let sent = if let Some(fd) = range.file.fd() {
            let want = (end - off).min(1 << 30) as usize;
            // The kernel moves `off` past what it sent.
            let r = rustix::fs::sendfile(sock, fd, Some(&mut off), want);
            if matches!(r, Ok(0)) {
                return Err(file_err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "segment file shorter than the range being sent",
                )));
            }
            r
        } else {
            if pending.is_empty() {
                let n = (end - off).min(256 << 10) as usize;
                buf.resize(n, 0);
                range
                    .file
                    .read_exact_at(&mut buf[..n], off)
                    .map_err(file_err)?;
                off += n as u64;
                pending = 0..n;
            }
            let r = rustix::io::write(sock, &buf[pending.clone()]);
            if let Ok(n) = r {
                pending.start += n;
            }
            r
        };
        match sent {
            Ok(_) | Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => wait_writable(sock, stall)?,
            // EPIPE, ECONNRESET...: the socket's; EIO and the like: the
            // file's. Either way the frame cannot be finished.
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    }
    Ok(())
}

/// Log a request refused for its version: WARN the first time a (client
/// id, client software) pair is refused, DEBUG after, so an old client
/// retrying on every connection is named once and not once per request.
/// Past the bound on pairs remembered, the per-peer rate limit applies.
fn warn_refused(
    b: &Broker,
    peer: std::net::SocketAddr,
    header: &kaas_protocol::RequestHeader,
    software: Option<&str>,
    answered: bool,
) {
    let client_id = header.client_id.as_deref().unwrap_or("");
    // Clients before KIP-511 (sarama before 1.29, kafka-python) send no
    // software name.
    let software = software.unwrap_or("unknown");
    let api = api_name(Some(header.api_key));
    let outcome = if answered {
        "answered UNSUPPORTED_VERSION"
    } else {
        "closing connection"
    };
    let first = b
        .refused_clients
        .first(client_id, software)
        .unwrap_or_else(|| {
            b.peer_warnings
                .hit(peer.ip(), "refused version", Instant::now())
                .is_some()
        });
    if first {
        tracing::warn!(%peer, client_id, client_software = software, api = %api, api_key = header.api_key, version = header.api_version, supported = ?kaas_protocol::versions::supported_range(header.api_key), outcome, "request version not served (logged once per client id and software)");
    } else {
        tracing::debug!(%peer, client_id, client_software = software, api = %api, api_key = header.api_key, version = header.api_version, outcome, "request version not served");
    }
}

/// Serve one connection until it closes, misbehaves or is evicted.
pub async fn serve(b: Arc<Broker>, sock: TcpStream, peer: std::net::SocketAddr, slot: Slot) {
    let _ = sock.set_nodelay(true);
    let (rd, mut wr) = sock.into_split();
    let mut frames = FrameReader::new(rd, b.args.max_request_bytes, &b.inflight);
    // Unbounded in count: the byte budgets bound it (every queued request
    // holds at least REQUEST_OVERHEAD of them).
    let (tx, mut rx) = mpsc::unbounded_channel::<Queued>();
    let conn_budget = Arc::new(ByteBudget::new(b.args.conn_inflight_bytes as usize));
    let broker_budget = b.inflight.clone();
    let request_timeout = Duration::from_millis(b.args.request_timeout_ms.max(1));

    let writer = {
        let (conn_budget, broker_budget) = (conn_budget.clone(), broker_budget.clone());
        let fd_budget = b.fd_budget.clone();
        async move {
            let mut sock = None;
            while let Some((f, _held, produce_read_at)) = rx.recv().await {
                let Some(parts) = f.await else { continue };
                let len: usize = parts.iter().map(Part::len).sum();
                // Charged while written, file ranges included: a client not
                // taking its answers keeps the connection at its limit, so
                // it is not read.
                let _answer = charge_both(&conn_budget, &broker_budget, len);
                if let Err(e) =
                    write_answer(&mut wr, &mut sock, &fd_budget, parts, request_timeout).await
                {
                    match e {
                        WriteError::File { .. } | WriteError::Task => {
                            tracing::warn!(%peer, bytes = len, error = %e, "answer not written whole; closing connection")
                        }
                        _ => {
                            tracing::debug!(%peer, bytes = len, error = %e, "answer not taken; closing connection")
                        }
                    }
                    return;
                }
                if let Some(t) = produce_read_at {
                    kaas_actors::telemetry::global()
                        .produce_seconds
                        .observe(t.elapsed());
                }
            }
        }
    };

    let idle_timeout = Duration::from_millis(b.args.idle_timeout_ms.max(1));
    let reader = async move {
        let mut last_activity = Instant::now();
        // The client software "name/version" from this connection's
        // ApiVersions v3+ (KIP-511), for the refused-version log line.
        let mut software: Option<String> = None;
        loop {
            // Read nothing more while this connection holds its limit of
            // unanswered requests and unwritten answers (the broker's
            // budget admits each read: `FrameReader`).
            tokio::select! {
                _ = conn_budget.below_limit() => {}
                _ = tx.closed() => return,
                _ = slot.evict.notified() => {
                    tracing::debug!(%peer, idle_ms = slot.idle().as_millis() as u64, "idle connection evicted for a new one");
                    return;
                }
            }
            let next = tokio::select! {
                n = frames.next(request_timeout) => n,
                _ = tx.closed() => return,
                _ = slot.evict.notified() => {
                    tracing::debug!(%peer, idle_ms = slot.idle().as_millis() as u64, "idle connection evicted for a new one");
                    return;
                }
            };
            let next = match next {
                Ok(n) => n,
                Err(Quiet::Stalled) => {
                    if let Some(count) = b.peer_warnings.hit(peer.ip(), "stalled", Instant::now()) {
                        tracing::warn!(%peer, buffered = frames.buffered(), count, "incomplete request stalled; closing connection");
                    }
                    return;
                }
                Err(Quiet::Idle) => {
                    if last_activity.elapsed() >= idle_timeout {
                        tracing::debug!(%peer, "idle connection closed");
                        return;
                    }
                    continue;
                }
            };
            last_activity = Instant::now();
            let read_at = last_activity;
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
                    if queue_ready(&tx, resp, held).is_err() {
                        return;
                    }
                    continue;
                }
                Err(RequestError::Refused { header, body }) => {
                    // A version we do not serve whose response the crate
                    // can encode: UNSUPPORTED_VERSION in its error fields.
                    let answer = api::refused::answer(header.api_version, *body)
                        .and_then(|r| kaas_protocol::encode_response(&header, &r).ok());
                    warn_refused(&b, peer, &header, software.as_deref(), answer.is_some());
                    let Some(resp) = answer else { return };
                    if queue_ready(&tx, resp, held).is_err() {
                        return;
                    }
                    continue;
                }
                Err(RequestError::UnsupportedVersion { header })
                    if kaas_protocol::supported_range(header.api_key).is_some() =>
                {
                    // An api we serve, below the crate's range (the
                    // versions Kafka 4.0 removed): nothing to answer
                    // with, so close, as Kafka does. (An api we do not
                    // serve at all is an unserviceable request, below.)
                    warn_refused(&b, peer, &header, software.as_deref(), false);
                    return;
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
            if let RequestKind::ApiVersions(r) = &req.body {
                if header.api_version >= 3 {
                    software = Some(format!(
                        "{}/{}",
                        r.client_software_name.as_str(),
                        r.client_software_version.as_str()
                    ));
                }
            }
            let (dispatched, hold) = match oversized {
                None => {
                    api::with_hold(api::with_peer(peer, api::dispatch(&b, &header, req.body))).await
                }
                Some(size) => {
                    if let Some(count) =
                        b.peer_warnings
                            .hit(peer.ip(), "produce too large", Instant::now())
                    {
                        tracing::warn!(%peer, size, max_request_bytes = b.args.max_request_bytes, count, "produce request over --max-request-bytes; answered MESSAGE_TOO_LARGE");
                    }
                    (api::dispatch_oversized(&header, req.body), Duration::ZERO)
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
            let produce_read_at = (header.api_key == 0).then_some(read_at);
            let f = async move {
                let answer = fut.await;
                match api::encode(&header, answer) {
                    Ok(parts) => Some(parts),
                    Err(e) => {
                        tracing::error!(api = %api_name(Some(header.api_key)), api_key = header.api_key, version = header.api_version, error = %e, "response encoding failed");
                        None
                    }
                }
            }
            .boxed();
            if tx.send((f, held, produce_read_at)).is_err() {
                return;
            }
            if !hold.is_zero() {
                // Muted (a throttled request): its answer goes out now, the
                // next request is read after.
                tokio::time::sleep(hold).await;
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
    async fn admission_holds_within_the_cap_and_waits_for_room() {
        let b = Arc::new(ByteBudget::new(100));
        let mut a = b.charge(0);
        b.admit(&mut a, 60, 100)
            .now_or_never()
            .expect("60 of 100 free");
        assert_eq!((a.bytes(), b.used()), (60, 60));
        // Growing a charge counts what it already holds.
        b.admit(&mut a, 90, 100)
            .now_or_never()
            .expect("30 more fit");
        assert_eq!(b.used(), 90);
        let mut c = b.charge(0);
        assert!(
            b.admit(&mut c, 20, 100).now_or_never().is_none(),
            "90 + 20 > 100: waits"
        );
        assert_eq!(b.used(), 90, "a waiting admission holds nothing");
        let waiting = tokio::spawn({
            let b = b.clone();
            async move {
                let mut c = b.charge(0);
                b.admit(&mut c, 20, 100).await;
                c
            }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        a.shrink_to(50);
        let c = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken by the shrink")
            .unwrap();
        assert_eq!((c.bytes(), b.used()), (20, 70));
        // A lower cap keeps room above it for others.
        let mut d = b.charge(0);
        assert!(
            b.admit(&mut d, 20, 80).now_or_never().is_none(),
            "70 + 20 > 80"
        );
        b.admit(&mut d, 10, 80)
            .now_or_never()
            .expect("70 + 10 <= 80");
        // Larger than the cap: admitted once the rest is within an eighth
        // of the limit (12 of 100).
        drop((a, c));
        let mut f = b.charge(5);
        let mut e = b.charge(0);
        assert!(
            b.admit(&mut e, 150, 100).now_or_never().is_none(),
            "d and f hold 15"
        );
        drop(d);
        b.admit(&mut e, 150, 100)
            .now_or_never()
            .expect("5 held: within an eighth");
        assert_eq!(b.used(), 155);
        f.grow_to(8);
        assert_eq!(b.used(), 158, "grow_to never waits");
        drop((e, f));
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

    /// A read handle of the real seam on a file holding `bytes`.
    fn real_file(dir: &std::path::Path, bytes: &[u8]) -> Arc<dyn kaas_volume::fs::ReadFile> {
        use kaas_volume::fs::Fs;
        let path = dir.join("seg");
        #[allow(clippy::disallowed_methods)] // a test fixture
        std::fs::write(&path, bytes).unwrap();
        kaas_volume::fs::RealFs.open_read(&path).unwrap()
    }

    /// The seam without a descriptor: the copy path.
    struct NoFd(Arc<dyn kaas_volume::fs::ReadFile>);
    impl kaas_volume::fs::ReadFile for NoFd {
        fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
            self.0.read_at(buf, pos)
        }
        fn len(&self) -> std::io::Result<u64> {
            self.0.len()
        }
    }

    /// Send `range` through a non-blocking socket whose reader takes small
    /// pieces slowly (so sends are partial and meet EAGAIN); what arrived.
    fn send_through_slow_reader(range: FileRange) -> (Result<(), WriteError>, Vec<u8>) {
        use std::io::Read;
        let (tx, mut rx) = std::os::unix::net::UnixStream::pair().unwrap();
        tx.set_nonblocking(true).unwrap();
        let reader = std::thread::spawn(move || {
            let (mut got, mut buf) = (Vec::new(), [0u8; 3000]);
            let mut reads = 0;
            loop {
                match rx.read(&mut buf) {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
                reads += 1;
                if reads % 64 == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        let sock: OwnedFd = tx.into();
        let r = send_range(&sock, &range, Duration::from_secs(10));
        drop(sock);
        (r, reader.join().unwrap())
    }

    #[test]
    fn a_file_range_is_sent_whole_across_partial_writes() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let file = real_file(dir.path(), &bytes);
        assert!(file.fd().is_some(), "the real seam has a descriptor");
        // sendfile, and the copy path for a handle without a descriptor.
        for file in [file.clone(), Arc::new(NoFd(file.clone())) as Arc<_>] {
            let range = FileRange {
                file,
                pos: 12_345,
                len: 2_500_000,
            };
            let (r, got) = send_through_slow_reader(range);
            r.unwrap();
            assert_eq!(got.len(), 2_500_000);
            assert!(
                got == bytes[12_345..12_345 + 2_500_000],
                "the range's bytes"
            );
        }
    }

    #[test]
    fn byte_runs_and_ranges_are_sent_in_order_across_partial_writes() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..2_000_000u32).map(|i| (i * 13 % 249) as u8).collect();
        let file = real_file(dir.path(), &bytes);
        let big = Bytes::from(vec![9u8; 1_500_000]);
        let parts = vec![
            Part::Bytes(Bytes::from_static(b"len!")),
            Part::Bytes(big.clone()),
            Part::Bytes(Bytes::new()),
            Part::File(FileRange {
                file: file.clone(),
                pos: 3,
                len: 1_000_000,
            }),
            Part::File(FileRange {
                file,
                pos: 1_000_003,
                len: 900_000,
            }),
            Part::Bytes(Bytes::from_static(b"tail")),
        ];
        let (tx, mut rx) = std::os::unix::net::UnixStream::pair().unwrap();
        tx.set_nonblocking(true).unwrap();
        let reader = std::thread::spawn(move || {
            let (mut got, mut buf) = (Vec::new(), [0u8; 5000]);
            while let Ok(n) = rx.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
                if got.len() % 7 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            got
        });
        let sock: OwnedFd = tx.into();
        send_parts(&sock, &parts, Duration::from_secs(10)).unwrap();
        drop(sock);
        let got = reader.join().unwrap();
        let mut want = b"len!".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(&bytes[3..1_900_003]);
        want.extend_from_slice(b"tail");
        assert_eq!(got.len(), want.len());
        assert!(got == want);
    }

    #[test]
    fn a_file_shorter_than_its_range_fails_the_send() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = vec![7u8; 100_000];
        let file = real_file(dir.path(), &bytes);
        for file in [file.clone(), Arc::new(NoFd(file.clone())) as Arc<_>] {
            let range = FileRange {
                file,
                pos: 50_000,
                len: 60_000,
            };
            let (r, got) = send_through_slow_reader(range);
            assert!(
                matches!(r, Err(WriteError::File { .. })),
                "short file: {r:?}"
            );
            // Nothing but the file's own bytes went out.
            assert!(got.len() <= 50_000 && got.iter().all(|b| *b == 7));
        }
    }

    #[test]
    fn a_range_the_client_does_not_take_stalls() {
        let dir = tempfile::tempdir().unwrap();
        let file = real_file(dir.path(), &vec![1u8; 8 << 20]);
        let (tx, _rx) = std::os::unix::net::UnixStream::pair().unwrap();
        tx.set_nonblocking(true).unwrap();
        let sock: OwnedFd = tx.into();
        let range = FileRange {
            file,
            pos: 0,
            len: 8 << 20,
        };
        let r = send_range(&sock, &range, Duration::from_millis(100));
        assert!(matches!(r, Err(WriteError::Stalled)), "{r:?}");
    }

    #[tokio::test]
    async fn an_answer_of_bytes_and_file_ranges_arrives_in_order() {
        use tokio::io::AsyncReadExt;
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
        let file = real_file(dir.path(), &bytes);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            got
        });
        let (sock, _) = listener.accept().await.unwrap();
        let (_rd, mut wr) = sock.into_split();
        let range = |pos, len| {
            Part::File(FileRange {
                file: file.clone(),
                pos,
                len,
            })
        };
        let parts = [
            Part::Bytes(Bytes::from_static(b"head")),
            Part::Bytes(Bytes::from_static(b"er")),
            range(10, 400_000),
            Part::Bytes(Bytes::from_static(b"|")),
            range(0, 0),
            range(500_000, 500_000),
            Part::Bytes(Bytes::from_static(b"tail")),
        ];
        let mut expected = b"header".to_vec();
        expected.extend_from_slice(&bytes[10..400_010]);
        expected.push(b'|');
        expected.extend_from_slice(&bytes[500_000..]);
        expected.extend_from_slice(b"tail");
        let mut dup = None;
        let budget = kaas_volume::fs::FdBudget::new(1);
        for _ in 0..3 {
            let parts = parts
                .iter()
                .map(|p| match p {
                    Part::Bytes(b) => Part::Bytes(b.clone()),
                    Part::File(f) => Part::File(f.clone()),
                })
                .collect();
            write_answer(&mut wr, &mut dup, &budget, parts, Duration::from_secs(10))
                .await
                .unwrap();
        }
        assert_eq!(budget.held(), 1, "the duplicate holds one permit");
        drop(wr);
        drop(dup);
        assert_eq!(budget.held(), 0);
        let got = client.await.unwrap();
        assert_eq!(got.len(), expected.len() * 3);
        assert!(got == expected.repeat(3));
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
