//! `PartitionLeader`: the actor that owns one partition's writable files.
//!
//! It is a thin actix adapter around [`CommitGate`] (the waiter queue, the
//! ack-only-under-lease gate and the one lease-checked path of every write)
//! and [`PartitionLog`]. The gate sits behind a mutex in a [`Writer`]
//! shared by the actor and a writer loop on the blocking pool, so an
//! acknowledgement crosses as few threads as possible, and a connection's
//! thread never makes a filesystem call (a hung volume must not stall the
//! thread that serves every client and the dashboard):
//!
//! * a connection hands plain batches over to the writer loop
//!   ([`PartitionHandle::hand_over`]: a push on a queue, no mailbox round
//!   trip) while the log is open; anything else (acks=0, transactional
//!   batches, a partition opening or stopped) is sent to the actor,
//!   which first appends whatever was handed over before it (one
//!   connection's appends keep their order), then its own, on its arbiter;
//! * the writer loop runs on a blocking-pool thread while there is
//!   something to do: it appends what was handed over, in order, through
//!   the gate (the same lease check as every write), fsyncs (group commit:
//!   whatever was appended while one fsync ran is covered by the next) and
//!   hands each result to the gate, which answers the waiting requests
//!   from that thread: no round trip through the actor per append or per
//!   fsync, and no new task per fsync under load.
//!
//! Work handed over counts as the actor's in its telemetry: an
//! `append_batches` message (queue wait, handling time) when the loop
//! appends it, and in its mailbox depth from the hand-over until its
//! answer.
//!
//! Any I/O error stops the actor; its [`actix::Supervisor`]
//! restarts it, and `started` re-opens the log, which re-runs recovery from
//! the files: that is the re-drive. The open runs on the blocking pool, so a
//! long recovery never stalls the partitions sharing this arbiter; until it
//! returns, appends are held in order (bounded) and applied when it does,
//! reads wait (bounded) for the reader, and a stop waits for it. Restarts
//! are counted in telemetry.

use super::claim::ClaimOwner;
use super::commit::{refused, storage, CommitGate, Halt, Refused};
use super::log::{Claimant, LogConfig, LogError, LogView, PartitionLog};
use super::messages::{
    AppendBatches, AppendTicket, DeleteRecordsBefore, EnforceRetention, GetProducers,
    PartitionError, Placed, ProducerInfo, SetLogConfig, StopLeader, WriteTxnMarker,
};
use super::producers::{Admission, TxnVerifications};
use super::reader::PartitionReader;
use crate::clock::{self, SharedClock};
use crate::cluster::lease::{Lease, LeaseGuard};
use crate::telemetry::{self, ActorStats, Mailbox, Owed, Traced};
use actix::prelude::*;
use actix::WeakAddr;
use kaas_volume::fs::{ReadOnly, SharedFs};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::Duration;
use tokio::sync::{oneshot, watch};

const KIND: &str = "partition_leader";

/// Where readers find the current [`PartitionReader`] without a mailbox
/// round-trip; the leader replaces it on every (re)open.
pub type ReaderSlot = Arc<RwLock<Option<PartitionReader>>>;

/// Everything a connection needs to talk to one partition.
#[derive(Clone)]
pub struct PartitionHandle {
    /// The leader's mailbox (appends, control), instrumented.
    pub addr: Mailbox<PartitionLeader>,
    /// The gate and its writer loop, for appends without a mailbox hop
    /// ([`Self::hand_over`]).
    writer: Arc<Writer>,
    /// The current reader (fetch, list offsets); `None` while recovering.
    pub reader: ReaderSlot,
    /// High watermark notifications, for fetch long-polling.
    pub hw: watch::Receiver<i64>,
}

/// Static description of one partition to lead.
#[derive(Debug, Clone)]
pub struct LeaderSpec {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// Partition directory.
    pub dir: PathBuf,
    /// Leader epoch we write under.
    pub epoch: i32,
    /// Storage settings.
    pub cfg: LogConfig,
    /// How often retention runs.
    pub retention_check: Duration,
    /// The broker lease and the incarnation this leadership was granted to:
    /// nothing is acknowledged, and retention deletes nothing, unless it is
    /// valid. `None` only in unit tests.
    pub lease: Option<(Arc<Lease>, u64)>,
    /// Who claims the epoch before writing under it ([`super::claim`]).
    /// `None` only in unit tests.
    pub owner: Option<ClaimOwner>,
    /// The data directory's binding to this broker's cluster, re-read by
    /// every open before it claims an epoch. `None` only in unit tests and
    /// under the broker's test-only hook.
    pub binding: Option<Arc<kaas_volume::binding::Binding>>,
    /// Called when the open finds our epoch claimed by another leader, or a
    /// higher epoch on disk: with the epoch found and, if known, the leader
    /// that claimed it, so the broker can ask for a grant above it.
    pub on_fenced: Option<OnFenced>,
    /// The longest a write waits for the partition's open before it is
    /// answered with the retriable "recovering" error (and then never
    /// applied): an open that is quick serves the write, one that is slow
    /// (thousands of partitions opening at once) sends the client back to
    /// retry instead of holding its request. [`PARK_MAX`] in the broker.
    pub park_max: Duration,
}

/// [`LeaderSpec::park_max`] in the broker.
pub const PARK_MAX: Duration = Duration::from_millis(500);

/// See [`LeaderSpec::on_fenced`].
#[derive(Clone)]
#[allow(clippy::type_complexity)]
pub struct OnFenced(pub Arc<dyn Fn(i32, Option<ClaimOwner>) + Send + Sync>);

impl std::fmt::Debug for OnFenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnFenced")
    }
}

/// At most this many rounds (append what was handed over, fsync) run back
/// to back on one blocking-pool thread before the loop is queued again
/// behind other partitions' work, so a partition that is always busy
/// cannot keep a pool thread for ever.
const SYNCS_PER_TASK: usize = 64;

/// The partition's [`CommitGate`], shared by the actor and the writer loop,
/// and the queue connections hand appends over on (see module docs).
/// Every write still goes through the gate's lease check, and every
/// acknowledgement through its release after the fsync.
pub struct Writer {
    gate: Mutex<CommitGate>,
    /// Appends handed over and not yet appended; never held across a
    /// filesystem call (connections push here).
    queue: Mutex<Queue>,
    /// Whether the gate has a log open ([`CommitGate::open_flag`]).
    open: Arc<AtomicBool>,
    stats: Arc<ActorStats>,
    /// The actor, told when the writer loop halts the gate (set once,
    /// right after the start; weak, so that it does not keep a supervised
    /// actor alive).
    actor: OnceLock<WeakAddr<PartitionLeader>>,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Handed>,
    /// A writer loop is scheduled or running.
    running: bool,
    /// Something was handed over or written since the loop last drained.
    kicked: bool,
}

/// One append handed over: the message (counted as the actor's) and who
/// is told where it landed once it is durable.
struct Handed {
    msg: Traced<AppendBatches>,
    tx: Option<oneshot::Sender<Result<Placed, PartitionError>>>,
}

/// An append handed over ([`PartitionHandle::hand_over`]).
pub struct HandedOver {
    /// Where it landed, told once an fsync covers it (or why it failed).
    pub placed: oneshot::Receiver<Result<Placed, PartitionError>>,
    /// Its count in the actor's mailbox depth until the answer is
    /// complete.
    pub owed: Option<Owed>,
}

/// A halt seen off the actor's thread (a failed fsync, a lapsed lease):
/// the actor stops as if it had seen it itself — unless the gate has moved
/// on since (a restart already installed another log).
#[derive(Message)]
#[rtype(result = "()")]
struct Halted {
    halt: Halt,
    /// The gate's generation right after the halt.
    generation: u64,
}

impl Writer {
    fn gate(&self) -> MutexGuard<'_, CommitGate> {
        // A panic while holding the gate is a bug; the state is still
        // consistent enough to fail waiters and stop, so do not cascade.
        self.gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn halt(&self, halt: Halt, generation: u64) {
        if let Some(a) = self.actor.get().and_then(|a| a.upgrade()) {
            a.do_send(Halted { halt, generation });
        }
    }

    /// Queue `item` (if any) and make sure a writer loop runs: it appends
    /// what was handed over and fsyncs what is written. Called after every
    /// append and hand-over, on whichever thread did it; no filesystem
    /// call here.
    fn kick(self: &Arc<Self>, item: Option<Handed>) {
        let mut q = self.queue();
        q.items.extend(item);
        q.kicked = true;
        if q.running {
            return;
        }
        q.running = true;
        drop(q);
        let me = self.clone();
        actix_rt::task::spawn_blocking(move || me.run());
    }

    /// Append everything handed over, in hand-over order, through the gate
    /// `g` the caller holds. The actor drains before each of its own
    /// writes, so one connection's appends keep their order whichever
    /// path each took.
    fn drain(&self, g: &mut CommitGate) {
        let items = {
            let mut q = self.queue();
            q.kicked = false;
            std::mem::take(&mut q.items)
        };
        for Handed { msg, mut tx } in items {
            let (m, _handling) = msg.open();
            match g.append_handed(&m.records, &m.infos, &mut tx) {
                Ok(()) => {
                    telemetry::global()
                        .produce_bytes
                        .fetch_add(m.records.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    if let Refused::Halted(h) = &e {
                        self.halt(h.clone(), g.generation());
                    }
                    if let Some(tx) = tx {
                        let _ = tx.send(Err(refusal_error(e)));
                    }
                }
            }
        }
    }

    /// Blocking: the writer loop. Append what was handed over, fsync what
    /// is written, hand each result to the gate (which answers the waiters
    /// it covers, from this thread); go on while there is more, up to
    /// [`SYNCS_PER_TASK`] rounds.
    fn run(self: Arc<Self>) {
        for _ in 0..SYNCS_PER_TASK {
            let (t, generation) = {
                let mut g = self.gate();
                self.drain(&mut g);
                (g.begin_sync(), g.generation())
            };
            let Some(t) = t else {
                let mut q = self.queue();
                if q.items.is_empty() && !q.kicked {
                    q.running = false;
                    return;
                }
                continue;
            };
            let start = std::time::Instant::now();
            // The fsync, then the successor probe (see `SyncTarget::sync`).
            let r = t.sync();
            let took = start.elapsed();
            if r.is_ok() {
                self.stats.fsynced(took);
            }
            let mut g = self.gate();
            if g.generation() != generation {
                // The log this fsync covered was dropped or replaced (a
                // restart, a stop): its result proves nothing now.
                continue;
            }
            if let Err(h) = g.synced(t, r) {
                let generation = g.generation();
                drop(g);
                self.halt(h, generation);
            }
        }
        // Queue behind other partitions' work; `running` stays set, so
        // nobody else starts a loop meanwhile.
        let me = self.clone();
        actix_rt::task::spawn_blocking(move || me.run());
    }
}

/// What a client is told when the gate refused a write, for refusals that
/// do not depend on the actor's state (see [`PartitionLeader::refusal`]).
fn refusal_error(r: Refused) -> PartitionError {
    match r {
        Refused::NotOpen => PartitionError::Storage("partition is recovering".into()),
        Refused::TooLarge => PartitionError::TooLarge,
        Refused::NoSpace(e) => {
            telemetry::global()
                .no_space_refusals
                .fetch_add(1, Ordering::Relaxed);
            PartitionError::Storage(e)
        }
        Refused::Sequence(e) => super::commit::sequence(e),
        Refused::RetryFirst(e) => PartitionError::Storage(format!(
            "{e}, behind a batch of it refused here: retry that one first"
        )),
        Refused::Halted(Halt::Fenced) => PartitionError::NotLeader("broker lease lapsed".into()),
        Refused::Halted(Halt::Failed(e)) => e,
        Refused::Halted(Halt::Superseded(s)) => PartitionError::NotLeader(s.to_string()),
    }
}

impl PartitionHandle {
    /// Hand plain (non-transactional) batches over to the partition's
    /// writer loop, without a round trip through the actor's mailbox and
    /// without a filesystem call on the caller's thread: the same gate,
    /// the same lease check, the same waiter queue and fsync as
    /// [`AppendBatches`], in hand-over order. `Err(msg)`: not taken here —
    /// acks=0 (nobody waits for its answer, so nothing would hold its bytes
    /// in the in-flight budgets that bound the queue), transactional or
    /// verified batches, or the log not open (opening, stopped, failed) —
    /// send it to the actor instead (which appends what was handed over
    /// before it). Requests of any size are taken: each partition's writer
    /// loop runs on its own blocking-pool thread, so large writes still go
    /// on in parallel, one hop fewer than through the actor (11–14 % less
    /// broker CPU per 100 MB of 1 MiB requests, BENCHMARKS.md).
    pub fn hand_over(&self, msg: AppendBatches) -> Result<HandedOver, AppendBatches> {
        if !msg.wait_durable
            || msg.verified.is_some()
            || msg.infos.iter().any(|b| b.is_transactional())
            || !self.writer.open.load(Ordering::Acquire)
        {
            return Err(msg);
        }
        let mut msg = self.addr.trace(msg);
        let (tx, placed) = oneshot::channel();
        let owed = msg.owed();
        self.writer.kick(Some(Handed { msg, tx: Some(tx) }));
        Ok(HandedOver { placed, owed })
    }
}

/// See module docs.
pub struct PartitionLeader {
    spec: LeaderSpec,
    fs: SharedFs,
    writer: Arc<Writer>,
    stopping: bool,
    reader: ReaderSlot,
    stats: Arc<ActorStats>,
    failures: u32,
    last_error: Option<PartitionError>,
    /// An open (recovery) is running on the blocking pool; its result comes
    /// back as [`Opened`].
    opening: bool,
    /// [`StopLeader`] callers waiting for an open in flight to finish: a
    /// leader is stopped only once nothing of it can still touch the files.
    stop_waiters: Vec<oneshot::Sender<()>>,
    /// Appends that arrived while the open runs, in arrival order: they are
    /// applied (or failed) as soon as it returns, so a client sees the same
    /// answer it would have had the open run inline, never "recovering" for
    /// a partition that is about to serve. Bounded by [`MAX_PARKED`].
    parked: VecDeque<(Parked, ParkedReply)>,
    /// Transaction verifications in flight (KIP-890 part 1); in memory
    /// only: a new leader verifies again.
    verifications: TxnVerifications,
    /// The open could not write (a full data volume): readers are served
    /// from [`PartitionLog::read_only_view`] while the open is re-driven
    /// on its backoff; writes are refused retriably.
    read_only: bool,
}

/// A write held while the partition opens.
enum Parked {
    Append(AppendBatches),
    Marker(WriteTxnMarker),
}

type AppendResult = Result<AppendTicket, PartitionError>;

/// Where a parked write's answer goes: taken by the leader when it applies
/// the write, or by the caller when it stops waiting ([`LeaderSpec::park_max`]),
/// whichever comes first, under one lock: a write the caller was told
/// failed is never applied, and one the leader applied is answered.
type ParkedReply = Arc<Mutex<Option<oneshot::Sender<AppendResult>>>>;

impl PartitionLeader {
    /// Hold `msg` until the open in flight returns, at most `park_max`;
    /// then (if the leader has not taken it) answer `err` and drop it.
    fn park(&mut self, msg: Parked) -> ResponseFuture<AppendResult> {
        if self.parked.len() >= MAX_PARKED {
            // Writes whose callers stopped waiting hold no place.
            self.parked.retain(|(_, r)| r.lock().unwrap().is_some());
        }
        let err = self.unavailable();
        if self.parked.len() >= MAX_PARKED {
            self.owe_retry(&msg);
            return Box::pin(async move { Err(err) });
        }
        let (tx, mut rx) = oneshot::channel();
        let reply: ParkedReply = Arc::new(Mutex::new(Some(tx)));
        self.parked.push_back((msg, reply.clone()));
        let patience = self.spec.park_max;
        Box::pin(async move {
            match actix_rt::time::timeout(patience, &mut rx).await {
                Ok(r) => r.unwrap_or(Err(err)),
                Err(_) if reply.lock().unwrap().take().is_some() => Err(err),
                // The leader took it just now: its answer is on the way.
                Err(_) => rx.await.unwrap_or(Err(err)),
            }
        })
    }
}

/// Appends held while a partition opens (the mailbox capacity): beyond it
/// the client gets the retriable "recovering" storage error.
const MAX_PARKED: usize = 256;

/// The result of an open run on the blocking pool.
#[derive(Message)]
#[rtype(result = "()")]
struct Opened(
    Result<PartitionLog, LogError>,
    /// After an open the volume was too full for: what readers may see.
    Option<Result<Option<LogView>, LogError>>,
);

/// Partition opens (recoveries) running at once, at most.
const MAX_CONCURRENT_OPENS: usize = 16;

/// The open slots, taken *before* an open goes to the blocking pool: an
/// open waiting for a slot is a future on its arbiter, not a parked
/// blocking-pool thread (10,000 partitions created at once held 1,037
/// threads, each arbiter's pool growing toward its 512-thread cap).
static OPENS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_CONCURRENT_OPENS);

/// New partitions opened (first epoch, nothing written), summarised: one
/// INFO line per [`NewOpens::EVERY`] while any opened, by a thread started
/// at the first one (10,412 INFO lines for 10,000 partitions before).
static NEW_OPENS: NewOpens = NewOpens {
    count: std::sync::atomic::AtomicU64::new(0),
    started: std::sync::Once::new(),
};

struct NewOpens {
    count: std::sync::atomic::AtomicU64,
    started: std::sync::Once,
}

impl NewOpens {
    const EVERY: Duration = Duration::from_secs(2);

    fn note(&'static self) {
        self.count.fetch_add(1, Ordering::AcqRel);
        self.started.call_once(|| {
            let _ = std::thread::Builder::new()
                .name("open-summary".into())
                .spawn(move || loop {
                    std::thread::sleep(Self::EVERY);
                    let n = self.count.swap(0, Ordering::AcqRel);
                    if n > 0 {
                        tracing::info!(
                            partitions = n,
                            within_s = Self::EVERY.as_secs(),
                            "new partitions opened (empty, first epoch)"
                        );
                    }
                });
        });
    }
}

/// How often a lapse that halts partitions is logged, at most.
const LAPSE_LOG_MS: i64 = 10_000;
static LAPSE_LOG: Coalesce = Coalesce::new(LAPSE_LOG_MS);

/// A condition repeated across partitions, logged once per interval with
/// the number of hits since the last line.
struct Coalesce {
    every_ms: i64,
    last_ms: std::sync::atomic::AtomicI64,
    count: std::sync::atomic::AtomicU64,
}

impl Coalesce {
    const fn new(every_ms: i64) -> Self {
        Self {
            every_ms,
            last_ms: std::sync::atomic::AtomicI64::new(i64::MIN),
            count: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Count one hit; `Some(hits)` when a line is due now.
    fn hit(&self, now_ms: i64) -> Option<u64> {
        self.count.fetch_add(1, Ordering::AcqRel);
        let last = self.last_ms.load(Ordering::Acquire);
        if last != i64::MIN && now_ms.saturating_sub(last) < self.every_ms {
            return None;
        }
        self.last_ms
            .compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        Some(self.count.swap(0, Ordering::AcqRel))
    }
}

/// Wall-clock milliseconds (segment ages and retention only; never compared
/// across hosts).
pub fn now_ms() -> i64 {
    clock::wall_ms()
}

impl PartitionLeader {
    /// Start a supervised leader on `arbiter`, on the real clock.
    pub fn start(
        spec: LeaderSpec,
        fs: SharedFs,
        arbiter: &actix::ArbiterHandle,
    ) -> PartitionHandle {
        let clock = spec
            .lease
            .as_ref()
            .map(|(l, _)| l.clock().clone())
            .unwrap_or_else(clock::real);
        Self::start_with_clock(spec, fs, clock, arbiter)
    }

    /// Start a supervised leader on `arbiter`, timing segment ages on `clock`.
    pub fn start_with_clock(
        spec: LeaderSpec,
        fs: SharedFs,
        clock: SharedClock,
        arbiter: &actix::ArbiterHandle,
    ) -> PartitionHandle {
        let (hw_tx, hw) = watch::channel(-1);
        let reader: ReaderSlot = Arc::new(RwLock::new(None));
        let slot = reader.clone();
        let stats = ActorStats::register(
            KIND,
            format!("{}-{}", spec.topic, spec.partition),
            spec.dir.display().to_string(),
        );
        stats.set_epoch(spec.epoch as i64);
        let gate = CommitGate::new(spec.lease.clone(), clock, hw_tx);
        let writer = Arc::new(Writer {
            open: gate.open_flag(),
            gate: Mutex::new(gate),
            queue: Mutex::default(),
            stats: stats.clone(),
            actor: OnceLock::new(),
        });
        let mine = stats.clone();
        let shared = writer.clone();
        let addr = Supervisor::start_in_arbiter(arbiter, move |_| PartitionLeader {
            writer: shared,
            spec,
            fs,
            stopping: false,
            reader: slot,
            stats: mine,
            failures: 0,
            last_error: None,
            opening: false,
            stop_waiters: Vec::new(),
            parked: VecDeque::new(),
            verifications: TxnVerifications::new(),
            read_only: false,
        });
        let _ = writer.actor.set(addr.downgrade());
        PartitionHandle {
            addr: Mailbox::new(addr, stats),
            writer,
            reader,
            hw,
        }
    }

    fn set_error(&mut self, e: Option<PartitionError>) {
        self.stats.set_error(e.as_ref().map(|e| e.to_string()));
        self.last_error = e;
    }

    /// The gate halted: fenced (lease lapsed) stays down for good; a failure
    /// stops so that the supervisor restarts and recovery re-drives.
    fn halted(&mut self, h: Halt, ctx: &mut Context<Self>) {
        match h {
            Halt::Fenced => {
                // One line per lapse, not one per partition: every partition
                // of the broker halts at once.
                tracing::debug!(topic = %self.spec.topic, partition = self.spec.partition, epoch = self.spec.epoch, "lease lapsed: acknowledging nothing more");
                if let Some(count) = LAPSE_LOG.hit(clock::wall_ms()) {
                    tracing::error!(
                        partitions = count,
                        interval_s = LAPSE_LOG_MS / 1000,
                        "lease lapsed: these partitions acknowledge nothing more"
                    );
                }
                *self.reader.write().unwrap() = None;
                self.stopping = true;
                self.set_error(Some(PartitionError::NotLeader(
                    "broker lease lapsed".into(),
                )));
            }
            Halt::Failed(err) => {
                tracing::error!(topic = %self.spec.topic, partition = self.spec.partition, error = %err, "partition leader failed; restarting");
                self.set_error(Some(err));
            }
            Halt::Superseded(s) => {
                // Not a lease lapse: our lease is fine, but the next epoch
                // was claimed under us — by our own controller's next
                // grant (then the watcher stops us anyway), or by a writer
                // this cluster does not know (a second cluster over the
                // volume, a bug): loud, and reported so a grant above it
                // can be asked for.
                tracing::error!(topic = %self.spec.topic, partition = self.spec.partition, epoch = self.spec.epoch, claimed = s.epoch, owner = ?s.owner, "a later epoch of this partition was claimed while we lead it: acknowledging nothing more");
                if let Some(report) = &self.spec.on_fenced {
                    (report.0)(s.epoch, s.owner);
                }
                *self.reader.write().unwrap() = None;
                self.stopping = true;
                self.set_error(Some(PartitionError::NotLeader(s.to_string())));
            }
        }
        ctx.stop();
    }

    fn unavailable(&self) -> PartitionError {
        self.last_error
            .clone()
            .unwrap_or_else(|| PartitionError::Storage("partition is recovering".into()))
    }

    fn gate(&self) -> MutexGuard<'_, CommitGate> {
        self.writer.gate()
    }

    /// The gate, after appending whatever was handed over before this
    /// write (see [`Writer::drain`]).
    fn gate_drained(&self) -> MutexGuard<'_, CommitGate> {
        let mut g = self.writer.gate();
        self.writer.drain(&mut g);
        g
    }
}

impl Handler<Halted> for PartitionLeader {
    type Result = ();

    fn handle(&mut self, m: Halted, ctx: &mut Context<Self>) {
        let current = self.gate().generation();
        if current == m.generation {
            self.halted(m.halt, ctx);
        }
    }
}

impl Actor for PartitionLeader {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(256);
        if self.stopping {
            return;
        }
        if !self.gate().lease_valid() {
            // Never open (and sweep) under a lapsed lease: a newer leader
            // may own the files by now (nor serve a read-only view of them).
            self.stopping = true;
            *self.reader.write().unwrap() = None;
            self.set_error(Some(PartitionError::NotLeader(
                "broker lease lapsed".into(),
            )));
            return;
        }
        if self.opening {
            // A restart while an open is in flight: its result is on the way.
            return;
        }
        // Recovery (a CRC scan of up to a segment, a seal, a sweep) runs on
        // the blocking pool, not on this arbiter: the partitions sharing the
        // thread keep serving meanwhile, and appends to this one are held
        // until `Opened` arrives.
        self.opening = true;
        let (fs, dir, epoch, cfg) = (
            self.fs.clone(),
            self.spec.dir.clone(),
            self.spec.epoch,
            self.spec.cfg.clone(),
        );
        // The claim, and every write after it, pass the lease of the
        // incarnation this leadership was granted to.
        let who = Claimant {
            owner: self.spec.owner,
            binding: self.spec.binding.clone(),
            guard: self.spec.lease.clone().map(|(lease, inc)| {
                Arc::new(LeaseGuard::new(lease, inc)) as Arc<dyn kaas_volume::fs::WriteGuard>
            }),
        };
        let (now, failed_at) = {
            let g = self.gate();
            (g.clock().now_ms(), g.failed_at())
        };
        let addr = ctx.address();
        actix_rt::spawn(async move {
            // Bounded: each open holds a blocking-pool thread and a few
            // descriptors for a moment (the tail scan, the claim, the
            // manifest); 10,000 opens at once would take them all (EMFILE
            // under a small limit) and gain nothing on two cores.
            let Ok(permit) = OPENS.acquire().await else {
                unreachable!("the open slots are never closed")
            };
            let _ = actix_rt::task::spawn_blocking(move || {
                let _permit = permit;
                let read = fs.read_only();
                let res = PartitionLog::open_as(fs, &dir, epoch, who, cfg.clone(), now, failed_at);
                // Nothing could be written, not even the claim: serve what
                // the files hold to readers meanwhile.
                let view = match &res {
                    Err(e) if e.is_no_space() => {
                        Some(PartitionLog::read_only_view(&read, &dir, epoch, &cfg, now))
                    }
                    _ => None,
                };
                addr.do_send(Opened(res, view));
            })
            .await;
        });
    }

    fn stopping(&mut self, _ctx: &mut Context<Self>) -> Running {
        Running::Stop
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        if self.stopping {
            self.stats.deregister();
        }
    }
}

impl Drop for PartitionLeader {
    fn drop(&mut self) {
        // The supervisor gave up on us (every address dropped): the row goes.
        self.stats.deregister();
    }
}

impl PartitionLeader {
    fn opened(
        &mut self,
        res: Result<PartitionLog, LogError>,
        view: Option<Result<Option<LogView>, LogError>>,
        ctx: &mut Context<Self>,
    ) {
        match res {
            Ok(mut log) => {
                // A config altered while the open ran is in the spec.
                log.set_config(self.spec.cfg.clone());
                if std::mem::take(&mut self.read_only) {
                    tracing::warn!(topic = %self.spec.topic, partition = self.spec.partition, epoch = self.spec.epoch, "space returned: partition writable again");
                }
                if self.spec.epoch <= 1 && log.high_watermark() == 0 {
                    // A new partition's first open (10,000 of them at one
                    // CreateTopics): counted into one INFO line every few
                    // seconds; a takeover or a reopen with data is INFO.
                    tracing::debug!(topic = %self.spec.topic, partition = self.spec.partition, epoch = self.spec.epoch, hw = 0, "partition leader open");
                    NEW_OPENS.note();
                } else {
                    tracing::info!(topic = %self.spec.topic, partition = self.spec.partition, epoch = self.spec.epoch, hw = log.high_watermark(), "partition leader open");
                }
                *self.reader.write().unwrap() =
                    Some(PartitionReader::new(self.fs.read_only(), log.view()));
                self.gate().install(log);
                self.failures = 0;
                self.set_error(None);
            }
            Err(LogError::Fenced { ours, found, owner }) => {
                // Another leader owns the files: stay up, answer NOT_LEADER.
                if found > ours {
                    tracing::warn!(topic = %self.spec.topic, partition = self.spec.partition, ours, found, ?owner, "fenced by a newer epoch");
                } else {
                    tracing::warn!(topic = %self.spec.topic, partition = self.spec.partition, ours, ?owner, "fenced: our epoch is claimed by another leader");
                }
                if let Some(report) = &self.spec.on_fenced {
                    (report.0)(found, owner);
                }
                self.set_error(Some(PartitionError::NotLeader(format!(
                    "epoch {found} owns this partition"
                ))));
            }
            Err(e) if refused(&e) => {
                // The lease lapsed during the open: the claim or a write of
                // it was refused. Not a storage failure: stay down for good.
                return self.halted(Halt::Fenced, ctx);
            }
            Err(e @ LogError::ForeignVolume { .. }) => {
                // The data directory no longer names our cluster: writing
                // here would be a second cluster's writer. Nothing was
                // claimed. Re-driven on the growing backoff, loudly.
                self.failures += 1;
                let backoff = Duration::from_millis(100u64 << self.failures.min(6));
                tracing::error!(topic = %self.spec.topic, partition = self.spec.partition, error = %e, ?backoff, "partition open refused: the data directory is not bound to this cluster");
                self.set_error(Some(PartitionError::NotLeader(e.to_string())));
                ctx.run_later(backoff, |_, ctx| ctx.stop());
                return;
            }
            Err(e @ LogError::TopicDirMissing { .. }) => {
                // The topic's directory is not visible here yet (a topic
                // re-created by another host, NFS caches) or is gone while
                // we still hold a grant (the controller withdraws it): no
                // storage fault, clients retry as during any leader change.
                // On the growing backoff all the same: a data volume not
                // mounted at all makes every topic "missing", and 10,000
                // partitions retrying every 200 ms would flood the log and
                // the volume.
                self.failures += 1;
                let backoff = Duration::from_millis(100u64 << self.failures.min(6));
                tracing::warn!(topic = %self.spec.topic, partition = self.spec.partition, error = %e, ?backoff, "partition open: topic directory not visible; retrying");
                self.set_error(Some(PartitionError::NotLeader(e.to_string())));
                ctx.run_later(backoff, |_, ctx| ctx.stop());
                return;
            }
            Err(e @ LogError::StaleView { .. }) => {
                // Our view of the directory lags (NFS attribute caches):
                // no storage fault. Re-drive soon; clients are told to
                // retry as during any leader change.
                let backoff = Duration::from_millis(200);
                tracing::warn!(topic = %self.spec.topic, partition = self.spec.partition, error = %e, ?backoff, "partition open sees a stale directory; retrying");
                self.set_error(Some(PartitionError::NotLeader(e.to_string())));
                ctx.run_later(backoff, |_, ctx| ctx.stop());
                return;
            }
            Err(e) if e.is_no_space() => {
                // A full volume: nothing was claimed (a claim that could
                // not be written is taken back) and nothing written. Serve
                // reads from the files as they stand and re-drive the open
                // on the growing backoff until space returns: one WARN when
                // the partition turns read-only, the retries at debug.
                self.failures += 1;
                let backoff = Duration::from_millis(100u64 << self.failures.min(6));
                match view {
                    Some(Ok(Some(v))) => {
                        if !self.read_only {
                            tracing::warn!(topic = %self.spec.topic, partition = self.spec.partition, epoch = self.spec.epoch, hw = v.high_watermark, error = %e, "data volume full: partition serves reads only until space returns");
                        } else {
                            tracing::debug!(topic = %self.spec.topic, partition = self.spec.partition, error = %e, ?backoff, "data volume still full");
                        }
                        *self.reader.write().unwrap() = Some(PartitionReader::new(
                            self.fs.read_only(),
                            Arc::new(RwLock::new(v)),
                        ));
                        self.read_only = true;
                    }
                    other => {
                        let why = match other {
                            Some(Err(v)) => v.to_string(),
                            _ => "nothing written yet".into(),
                        };
                        tracing::warn!(topic = %self.spec.topic, partition = self.spec.partition, error = %e, read_only = %why, ?backoff, "data volume full: partition open failed, no read-only view");
                    }
                }
                self.set_error(Some(PartitionError::Storage(format!(
                    "the data volume is full ({e}): reads only until space returns"
                ))));
                ctx.run_later(backoff, |_, ctx| ctx.stop());
                return;
            }
            Err(e) => {
                // Re-drive: stop after a backoff; the supervisor restarts us.
                self.failures += 1;
                let backoff = Duration::from_millis(100u64 << self.failures.min(6));
                tracing::error!(topic = %self.spec.topic, partition = self.spec.partition, error = %e, ?backoff, "partition open failed");
                self.set_error(Some(storage(e)));
                ctx.run_later(backoff, |_, ctx| ctx.stop());
                return;
            }
        }
        // The tick only rolls a segment due by age: a quarter of segment.ms,
        // within 250 ms..60 s, so 10,000 idle partitions at the default
        // segment.ms (7 days) wake 167 times a second rather than 20,000. A
        // roll by age is then at most a minute late, and only for a segment
        // older than 4 minutes (Kafka rolls by age only at the next append).
        let tick =
            Duration::from_millis((self.spec.cfg.segment_ms.max(0) as u64 / 4).clamp(250, 60_000));
        ctx.run_interval(tick, |a, ctx| {
            let ticked = a.gate().tick();
            if let Err(h) = ticked {
                a.halted(h, ctx);
            }
        });
        ctx.run_interval(self.spec.retention_check, |a, ctx| {
            let removed = a.gate().enforce_retention();
            match removed {
                Ok(None | Some(0)) => {}
                Ok(Some(n)) => {
                    let log_start = a.gate().log().map(|l| l.log_start_offset());
                    tracing::info!(topic = %a.spec.topic, partition = a.spec.partition, segments = n, log_start, "retention removed segments");
                }
                Err(h) => a.halted(h, ctx),
            }
        });
    }

    /// Stop for good (see [`StopLeader`]); the gate checks the lease.
    fn stop_for_good(&mut self, ctx: &mut Context<Self>) {
        let stopped = self.gate_drained().stop();
        match stopped {
            Ok(()) => {}
            Err(h @ (Halt::Fenced | Halt::Superseded(_))) => return self.halted(h, ctx),
            Err(Halt::Failed(e)) => {
                tracing::error!(topic = %self.spec.topic, partition = self.spec.partition, error = %e, "close failed; next open recovers");
            }
        }
        self.stopping = true;
        *self.reader.write().unwrap() = None;
        self.set_error(Some(PartitionError::NotLeader(
            "partition leader stopped".into(),
        )));
        // A supervised actor restarts while anyone holds its address; the
        // restart sees `stopping` and stays dormant, answering NOT_LEADER,
        // until the last address is dropped.
        ctx.stop();
    }
}

impl Handler<Opened> for PartitionLeader {
    type Result = ();

    fn handle(&mut self, msg: Opened, ctx: &mut Context<Self>) {
        self.opening = false;
        let stops = std::mem::take(&mut self.stop_waiters);
        if self.stopping {
            // Stopped (or fenced) while recovering: drop what was opened
            // without another write; the next owner's open recovers it.
            drop(msg.0);
            self.unpark(ctx);
        } else {
            self.opened(msg.0, msg.1, ctx);
            // In arrival order, before a pending stop: its final fsync then
            // covers them.
            self.unpark(ctx);
            if !stops.is_empty() {
                self.stop_for_good(ctx);
            }
        }
        for tx in stops {
            let _ = tx.send(());
        }
    }
}

impl Supervised for PartitionLeader {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        if self.stopping {
            return;
        }
        self.stats.restarted();
        if !self.read_only {
            // A read-only view stays served across the re-driven open.
            *self.reader.write().unwrap() = None;
        }
        let err = self.unavailable();
        for (msg, reply) in std::mem::take(&mut self.parked) {
            self.owe_retry(&msg);
            if let Some(tx) = reply.lock().unwrap().take() {
                let _ = tx.send(Err(err.clone()));
            }
        }
        self.gate().reset(err);
    }
}

impl PartitionLeader {
    /// Apply (or, if the open failed, fail) the appends parked during it.
    fn unpark(&mut self, ctx: &mut Context<Self>) {
        // Once one write was given up, every later one is refused too: a
        // producer's later batch must not land ahead of an earlier one it
        // is about to retry (a sequence gap, or records out of order).
        // Their producers are owed a retry: a later batch of theirs that
        // skips ahead is refused retriably too (see `RetryOwed`).
        let mut gap = false;
        for (msg, reply) in std::mem::take(&mut self.parked) {
            // Taken before it is applied: a caller that gave up is never
            // written for.
            let Some(tx) = reply.lock().unwrap().take() else {
                self.owe_retry(&msg);
                gap = true;
                continue;
            };
            if gap {
                self.owe_retry(&msg);
                let _ = tx.send(Err(self.unavailable()));
                continue;
            }
            let r = match msg {
                Parked::Append(m) => self.append(m, ctx),
                Parked::Marker(m) => self.marker(m, ctx),
            };
            let _ = tx.send(r);
        }
    }

    /// `msg` was refused retriably without reaching the log: its
    /// producers are owed a retry (see [`super::commit::RetryOwed`]).
    fn owe_retry(&self, msg: &Parked) {
        if let Parked::Append(m) = msg {
            self.gate().owe_retry(&m.infos);
        }
    }

    fn append(&mut self, msg: AppendBatches, ctx: &mut Context<Self>) -> AppendResult {
        let txn = msg.infos.iter().any(|b| b.is_transactional());
        if txn {
            self.admit(&msg)?;
        }
        let r = self
            .gate_drained()
            .append(&msg.records, &msg.infos, msg.wait_durable);
        let ticket = self.refusal(r, ctx)?;
        if txn {
            self.verifications
                .appended(msg.infos.iter().map(|b| b.producer_id));
        }
        telemetry::global()
            .produce_bytes
            .fetch_add(msg.records.len() as u64, Ordering::Relaxed);
        self.writer.kick(None);
        Ok(ticket)
    }

    /// KIP-890 part 1: may these transactional batches be written, or
    /// must the caller verify with the coordinator first (see
    /// [`TxnVerifications`])? A partition not open yet admits nothing
    /// here; the append itself then answers why.
    fn admit(&mut self, msg: &AppendBatches) -> Result<(), PartitionError> {
        let gate = self.writer.gate();
        let Some(log) = gate.log() else {
            return Ok(());
        };
        let batches = msg
            .infos
            .iter()
            .map(|b| (b.producer_id, b.producer_epoch, b.is_transactional()));
        let admitted = self
            .verifications
            .admit(log.producers(), batches, msg.verified);
        drop(gate);
        match admitted {
            Admission::Go => Ok(()),
            Admission::Verify {
                producer_id,
                producer_epoch,
                token,
            } => Err(PartitionError::TxnUnverified {
                producer_id,
                producer_epoch,
                token,
            }),
            Admission::Refuse => Err(PartitionError::InvalidTxnState(
                "the partition's transaction could not be verified".into(),
            )),
        }
    }

    fn marker(&mut self, msg: WriteTxnMarker, ctx: &mut Context<Self>) -> AppendResult {
        let r = self.gate_drained().append_marker(&msg);
        let ticket = self.refusal(r, ctx)?;
        self.verifications.ended(msg.producer_id);
        tracing::debug!(topic = %self.spec.topic, partition = self.spec.partition, producer_id = msg.producer_id, commit = msg.commit, offset = ticket.base_offset, "transaction marker written");
        self.writer.kick(None);
        Ok(ticket)
    }

    /// What a client is told when the gate refused a write.
    fn refusal(
        &mut self,
        r: Result<AppendTicket, Refused>,
        ctx: &mut Context<Self>,
    ) -> AppendResult {
        match r {
            Ok(t) => Ok(t),
            Err(Refused::NotOpen) => Err(self.unavailable()),
            Err(Refused::Halted(h)) => {
                self.halted(h, ctx);
                Err(self.unavailable())
            }
            Err(e) => Err(refusal_error(e)),
        }
    }
}

impl Handler<AppendBatches> for PartitionLeader {
    type Result = ResponseFuture<AppendResult>;

    fn handle(&mut self, msg: AppendBatches, ctx: &mut Context<Self>) -> Self::Result {
        if self.opening && !self.stopping {
            return self.park(Parked::Append(msg));
        }
        let r = self.append(msg, ctx);
        Box::pin(async move { r })
    }
}

impl Handler<WriteTxnMarker> for PartitionLeader {
    type Result = ResponseFuture<AppendResult>;

    fn handle(&mut self, msg: WriteTxnMarker, ctx: &mut Context<Self>) -> Self::Result {
        if self.opening && !self.stopping {
            return self.park(Parked::Marker(msg));
        }
        let r = self.marker(msg, ctx);
        Box::pin(async move { r })
    }
}

impl Handler<GetProducers> for PartitionLeader {
    type Result = Result<Vec<ProducerInfo>, PartitionError>;

    fn handle(&mut self, _: GetProducers, _ctx: &mut Context<Self>) -> Self::Result {
        let producers = self.gate().producers();
        producers.ok_or_else(|| self.unavailable())
    }
}

impl Handler<EnforceRetention> for PartitionLeader {
    type Result = Result<usize, PartitionError>;

    fn handle(&mut self, _: EnforceRetention, ctx: &mut Context<Self>) -> Self::Result {
        let removed = self.gate().enforce_retention();
        match removed {
            Ok(Some(n)) => Ok(n),
            Ok(None) => Err(self.unavailable()),
            Err(h) => {
                self.halted(h, ctx);
                Err(self.unavailable())
            }
        }
    }
}

impl Handler<DeleteRecordsBefore> for PartitionLeader {
    type Result = Result<i64, PartitionError>;

    fn handle(&mut self, m: DeleteRecordsBefore, ctx: &mut Context<Self>) -> Self::Result {
        let deleted = self.gate().delete_records(m.offset);
        match deleted {
            Ok(Some(start)) => {
                tracing::info!(topic = %self.spec.topic, partition = self.spec.partition, log_start = start, "records deleted");
                Ok(start)
            }
            Ok(None) => Err(self.unavailable()),
            Err(h) => {
                self.halted(h, ctx);
                Err(self.unavailable())
            }
        }
    }
}

impl Handler<SetLogConfig> for PartitionLeader {
    type Result = ();

    fn handle(&mut self, m: SetLogConfig, ctx: &mut Context<Self>) {
        if m.cfg == self.spec.cfg {
            return;
        }
        tracing::info!(topic = %self.spec.topic, partition = self.spec.partition, cfg = ?m.cfg, "topic config applied");
        self.spec.cfg = m.cfg.clone();
        self.gate().set_config(m.cfg);
        if self.stopping || self.opening {
            return;
        }
        let removed = self.gate().enforce_retention();
        match removed {
            Ok(Some(n)) if n > 0 => {
                let log_start = self.gate().log().map(|l| l.log_start_offset());
                tracing::info!(topic = %self.spec.topic, partition = self.spec.partition, segments = n, log_start, "retention removed segments");
            }
            Ok(_) => {}
            Err(h) => self.halted(h, ctx),
        }
    }
}

impl Handler<StopLeader> for PartitionLeader {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: StopLeader, ctx: &mut Context<Self>) -> ResponseFuture<()> {
        if self.opening {
            // Recovery is still writing (claim, seal, manifest, sweep):
            // answer only once it is done and the log is closed, so a
            // successor never opens the files while we still touch them.
            let (tx, rx) = oneshot::channel();
            self.stop_waiters.push(tx);
            return Box::pin(async move {
                let _ = rx.await;
            });
        }
        self.stop_for_good(ctx);
        Box::pin(async {})
    }
}
crate::instrumented!(
    PartitionLeader: AppendBatches,
    WriteTxnMarker,
    GetProducers,
    EnforceRetention,
    DeleteRecordsBefore,
    SetLogConfig,
    StopLeader
);

impl crate::registry::Owner for PartitionHandle {
    fn stop(self) -> futures::future::LocalBoxFuture<'static, ()> {
        Box::pin(async move {
            let _ = self.addr.send(StopLeader).await;
        })
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build fixtures with raw std::fs calls
mod tests {
    use super::*;
    use kaas_volume::fs::{Fs, ReadFile, RealFs, WriteFile};
    use std::path::Path;
    use std::time::Instant;

    /// The real filesystem, with listings of any path containing "slow"
    /// taking `delay` (a long recovery: a CRC scan over a slow volume),
    /// every `sync_data` waiting while the fsync [`Hold`] is on (a stalled
    /// fsync) and every write while the write one is (a hung volume).
    struct SlowFs(Duration, std::sync::atomic::AtomicBool, Holds);

    /// The fsync and write holds of a [`SlowFs`].
    #[derive(Default, Clone)]
    struct Holds {
        sync: Arc<Hold>,
        write: Arc<Hold>,
    }

    /// While on, callers of [`Hold::wait`] wait (at most 10 s); how many
    /// wait is known, so a test can tell when a thread is stuck in it.
    #[derive(Default)]
    struct Hold(std::sync::Mutex<(bool, usize)>, std::sync::Condvar);

    impl Hold {
        fn set(&self, on: bool) {
            self.0.lock().unwrap().0 = on;
            self.1.notify_all();
        }
        fn wait(&self) {
            let mut g = self.0.lock().unwrap();
            g.1 += 1;
            self.1.notify_all();
            let (mut g, _) = self
                .1
                .wait_timeout_while(g, Duration::from_secs(10), |s| s.0)
                .unwrap();
            g.1 -= 1;
        }
        /// Block (at most 10 s) until a thread waits in the hold; whether
        /// one does.
        fn until_waited(&self) -> bool {
            let g = self.0.lock().unwrap();
            let (g, _) = self
                .1
                .wait_timeout_while(g, Duration::from_secs(10), |s| s.1 == 0)
                .unwrap();
            g.1 > 0
        }
    }

    /// A real file whose writes and `sync_data` wait for their [`Hold`]s.
    struct HeldFile(Arc<dyn WriteFile>, Holds);

    impl ReadFile for HeldFile {
        fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
            self.0.read_at(buf, pos)
        }
        fn len(&self) -> std::io::Result<u64> {
            self.0.len()
        }
    }

    impl WriteFile for HeldFile {
        fn write_all_at(&self, buf: &[u8], pos: u64) -> std::io::Result<()> {
            self.1.write.wait();
            self.0.write_all_at(buf, pos)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.1.sync.wait();
            self.0.sync_data()
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.0.set_len(len)
        }
    }

    impl Fs for SlowFs {
        fn open_read(&self, p: &Path) -> std::io::Result<Arc<dyn ReadFile>> {
            RealFs.open_read(p)
        }
        fn create_exclusive(&self, p: &Path) -> std::io::Result<Arc<dyn WriteFile>> {
            let f = RealFs.create_exclusive(p)?;
            Ok(Arc::new(HeldFile(f, self.2.clone())))
        }
        fn open_write(&self, p: &Path) -> std::io::Result<Arc<dyn WriteFile>> {
            let f = RealFs.open_write(p)?;
            Ok(Arc::new(HeldFile(f, self.2.clone())))
        }
        fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
            RealFs.rename(from, to)
        }
        fn remove_file(&self, p: &Path) -> std::io::Result<()> {
            RealFs.remove_file(p)
        }
        fn create_dir_all(&self, p: &Path) -> std::io::Result<()> {
            RealFs.create_dir_all(p)
        }
        fn create_dir(&self, p: &Path) -> std::io::Result<()> {
            RealFs.create_dir(p)
        }
        fn remove_dir(&self, p: &Path) -> std::io::Result<()> {
            RealFs.remove_dir(p)
        }
        fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
            if dir.to_string_lossy().contains("slow") && !self.1.swap(true, Ordering::AcqRel) {
                std::thread::sleep(self.0);
            }
            RealFs.list(dir)
        }
        fn is_dir(&self, p: &Path) -> bool {
            RealFs.is_dir(p)
        }
        fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
            RealFs.sync_dir(dir)
        }
    }

    fn spec(root: &Path, topic: &str) -> LeaderSpec {
        let dir = root.join(topic).join("0");
        std::fs::create_dir_all(&dir).unwrap();
        LeaderSpec {
            topic: topic.into(),
            partition: 0,
            dir,
            epoch: 1,
            cfg: LogConfig::default(),
            retention_check: Duration::from_secs(60),
            lease: None,
            owner: None,
            binding: None,
            on_fenced: None,
            park_max: Duration::from_secs(30),
        }
    }

    async fn produce(h: &PartitionHandle) -> Result<i64, PartitionError> {
        let (records, infos) = super::super::commit::tests::batch(1);
        send(h, records, infos).await
    }

    /// Append through the mailbox and wait for the fsync's answer.
    async fn send(
        h: &PartitionHandle,
        records: bytes::Bytes,
        infos: Vec<kaas_protocol::batch::BatchInfo>,
    ) -> Result<i64, PartitionError> {
        let t = h
            .addr
            .send(AppendBatches {
                records,
                infos,
                wait_durable: true,
                verified: None,
            })
            .await
            .unwrap()?;
        t.durable.unwrap().await.unwrap()
    }

    /// Catches: an altered topic config applied only at the next open (or
    /// the next periodic retention pass, an hour away here) instead of at
    /// once.
    #[test]
    fn a_lapse_is_logged_once_per_interval_with_a_count() {
        let c = Coalesce::new(10_000);
        assert_eq!(c.hit(1_000), Some(1));
        for i in 0..9_999 {
            assert_eq!(c.hit(1_001 + i % 9_000), None);
        }
        assert_eq!(c.hit(11_000), Some(10_000)); // the 9,999 held back and this one
        assert_eq!(c.hit(11_001), None);
    }

    #[actix_rt::test]
    async fn a_lowered_retention_applies_at_once() {
        let d = tempfile::tempdir().unwrap();
        let fs: SharedFs = Arc::new(RealFs);
        let arbiter = actix::Arbiter::new();
        let mut s = spec(d.path(), "t");
        s.cfg.segment_bytes = 256;
        s.retention_check = Duration::from_secs(3600);
        let h = PartitionLeader::start(s.clone(), fs, &arbiter.handle());
        let mut hw = Err(PartitionError::TooLarge);
        for _ in 0..40 {
            hw = produce(&h).await;
        }
        assert_eq!(hw, Ok(40));
        let start = |h: &PartitionHandle| h.reader.read().unwrap().as_ref().unwrap().offsets().0;
        assert_eq!(start(&h), 0);
        let mut cfg = s.cfg.clone();
        cfg.retention_bytes = 0;
        h.addr.send(SetLogConfig { cfg }).await.unwrap();
        assert!(start(&h) > 0, "sealed segments removed at once");
        assert_eq!(produce(&h).await, Ok(41), "still serving");
        h.addr.send(StopLeader).await.unwrap();
        arbiter.stop();
    }

    /// Catches: recovery run inline on the arbiter, where one partition's
    /// slow open stalls every partition sharing the thread.
    #[actix_rt::test]
    async fn a_slow_recovery_does_not_stall_a_partition_on_the_same_arbiter() {
        let d = tempfile::tempdir().unwrap();
        let delay = Duration::from_millis(1500);
        let fs: SharedFs = Arc::new(SlowFs(delay, Default::default(), Default::default()));
        let arbiter = actix::Arbiter::new();
        let slow = PartitionLeader::start(spec(d.path(), "slow"), fs.clone(), &arbiter.handle());
        let fast = PartitionLeader::start(spec(d.path(), "fast"), fs, &arbiter.handle());
        let t0 = Instant::now();
        let mut hw = Err(PartitionError::TooLarge);
        while t0.elapsed() < delay {
            hw = produce(&fast).await;
            if hw.is_ok() {
                break;
            }
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            hw,
            Ok(1),
            "the fast partition served while the slow one recovered"
        );
        assert!(t0.elapsed() < delay);
        // An append sent during recovery is held, not refused, and a stop
        // sent after it waits for the open too: the append is applied
        // first, in order, and the stop's final fsync acknowledges it.
        let (appended, stopped) = futures::join!(produce(&slow), slow.addr.send(StopLeader));
        stopped.unwrap();
        assert_eq!(
            appended,
            Ok(1),
            "the append waited for the open, then landed"
        );
        assert!(t0.elapsed() >= delay, "stop waited for the open in flight");
        arbiter.stop();
    }

    /// A leader whose open takes 1.5 s (the delay, returned), writes
    /// parked at most `park_max`.
    fn slow_leader(root: &Path, park_max: Duration) -> (PartitionHandle, actix::Arbiter, Duration) {
        let delay = Duration::from_millis(1500);
        let fs: SharedFs = Arc::new(SlowFs(delay, Default::default(), Default::default()));
        let arbiter = actix::Arbiter::new();
        let mut s = spec(root, "slow");
        s.park_max = park_max;
        let h = PartitionLeader::start(s, fs, &arbiter.handle());
        (h, arbiter, delay)
    }

    /// Catches: a write held for as long as the open takes (18 s behind
    /// 10,000 partitions opening), or one answered "recovering" and then
    /// applied anyway when the open returns (a duplicate on the client's
    /// retry).
    #[actix_rt::test]
    async fn a_write_parked_past_park_max_is_refused_and_never_applied() {
        let d = tempfile::tempdir().unwrap();
        let (h, arbiter, delay) = slow_leader(d.path(), Duration::from_millis(200));
        let t0 = Instant::now();
        let refused = produce(&h).await;
        assert!(
            matches!(&refused, Err(PartitionError::Storage(m)) if m.contains("recovering")),
            "{refused:?}"
        );
        assert!(t0.elapsed() < delay, "answered before the open returned");
        let mut hw = refused;
        while hw.is_err() && t0.elapsed() < delay * 4 {
            actix_rt::time::sleep(Duration::from_millis(50)).await;
            hw = produce(&h).await;
        }
        assert_eq!(
            hw,
            Ok(1),
            "the refused write was not applied after the open"
        );
        h.addr.send(StopLeader).await.unwrap();
        arbiter.stop();
    }

    /// Catches: a later parked write applied after an earlier one was
    /// given up (its producer retries the earlier batch behind the later:
    /// a sequence gap, or records out of order).
    #[actix_rt::test]
    async fn after_a_given_up_write_later_parked_writes_are_refused_too() {
        let d = tempfile::tempdir().unwrap();
        // The first write gives up at 1.2 s, before the open returns
        // (1.5 s); the second, sent at 1.0 s, would wait until 2.2 s.
        let (h, arbiter, _) = slow_leader(d.path(), Duration::from_millis(1200));
        let later = async {
            actix_rt::time::sleep(Duration::from_millis(1000)).await;
            produce(&h).await
        };
        let (first, second) = futures::join!(produce(&h), later);
        assert!(first.is_err(), "{first:?}");
        assert!(
            matches!(&second, Err(PartitionError::Storage(_))),
            "the later write was refused, not applied: {second:?}"
        );
        assert_eq!(produce(&h).await, Ok(1), "neither was applied");
        h.addr.send(StopLeader).await.unwrap();
        arbiter.stop();
    }

    /// Produce one record of idempotent producer 7 (epoch 0) at `seq`
    /// through the mailbox, waiting for its fsync.
    async fn produce_idem(h: &PartitionHandle, seq: i32) -> Result<i64, PartitionError> {
        let records = crate::partition::tests::idem_batch(&["v"], 7, 0, seq);
        let infos = kaas_protocol::batch::validate_batches(&records).unwrap();
        send(h, records, infos).await
    }

    /// Catches: a batch that skips ahead of one given up while parked
    /// answered OUT_OF_ORDER_SEQUENCE_NUMBER. librdkafka then bumps the
    /// producer epoch and re-sends the given-up batch under new sequence
    /// numbers: stored twice whenever an earlier owner had written it
    /// (seen as duplicates in the GlusterFS kill -9 and pause e2e test).
    #[actix_rt::test]
    async fn a_gap_behind_a_given_up_write_is_retriable_not_out_of_order() {
        let d = tempfile::tempdir().unwrap();
        // An earlier owner (epoch 1) wrote sequences 0 and 1.
        let arbiter = actix::Arbiter::new();
        let first =
            PartitionLeader::start(spec(d.path(), "slow"), Arc::new(RealFs), &arbiter.handle());
        assert_eq!(produce_idem(&first, 0).await, Ok(1));
        assert_eq!(produce_idem(&first, 1).await, Ok(2));
        first.addr.send(StopLeader).await.unwrap();
        arbiter.stop();
        // The next owner opens slowly; the retry of sequence 1 (already
        // written) is parked and given up.
        let d2 = d.path().to_path_buf();
        let fs: SharedFs = Arc::new(SlowFs(
            Duration::from_millis(1500),
            Default::default(),
            Default::default(),
        ));
        let arbiter = actix::Arbiter::new();
        let mut s = spec(&d2, "slow");
        s.epoch = 2;
        s.park_max = Duration::from_millis(200);
        let h = PartitionLeader::start(s, fs, &arbiter.handle());
        let given_up = produce_idem(&h, 1).await;
        assert!(
            matches!(&given_up, Err(PartitionError::Storage(_))),
            "{given_up:?}"
        );
        let t0 = Instant::now();
        while h.reader.read().unwrap().is_none() && t0.elapsed() < Duration::from_secs(10) {
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
        // Sequence 3 (2 was in flight behind the given-up 1) arrives once
        // the partition is open: retriable, never "out of order".
        let ahead = produce_idem(&h, 3).await;
        assert!(
            matches!(&ahead, Err(PartitionError::Storage(m)) if m.contains("retry that one first")),
            "{ahead:?}"
        );
        // The producer retries in order: 1 is answered as the duplicate it
        // is, 2 and 3 are written once each.
        assert_eq!(produce_idem(&h, 1).await, Ok(2));
        assert_eq!(produce_idem(&h, 2).await, Ok(3));
        assert_eq!(produce_idem(&h, 3).await, Ok(4));
        // Settled: a real gap is out of order again.
        assert!(matches!(
            produce_idem(&h, 9).await,
            Err(PartitionError::OutOfOrderSequence(_))
        ));
        h.addr.send(StopLeader).await.unwrap();
        arbiter.stop();
    }

    /// Catches: a partition that never opens on a full data volume (every
    /// open failing at its claim, a new epoch claimed per retry with an
    /// empty `leader-e<N>.claim` left each time, reads answered NOT_LEADER)
    /// and one that stays read-only once space returns.
    #[actix_rt::test]
    async fn a_full_volume_serves_reads_claims_nothing_and_writes_once_space_returns() {
        let d = tempfile::tempdir().unwrap();
        let fault = kaas_volume::fs::fault::FaultFs::new();
        let fs: SharedFs = Arc::new(fault.clone());
        let owner = Some(ClaimOwner {
            broker_id: 1,
            incarnation: 1,
        });
        let arbiter = actix::Arbiter::new();
        let mut s = spec(d.path(), "t");
        s.owner = owner;
        let first = PartitionLeader::start(s.clone(), fs.clone(), &arbiter.handle());
        for want in 1..=3 {
            assert_eq!(produce(&first).await, Ok(want));
        }
        first.addr.send(StopLeader).await.unwrap();
        // Restarted (epoch 2) on a volume with no byte free.
        fault.full(true);
        s.epoch = 2;
        let h = PartitionLeader::start(s, fs, &arbiter.handle());
        let t0 = Instant::now();
        while h.reader.read().unwrap().is_none() && t0.elapsed() < Duration::from_secs(10) {
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
        let reader = h.reader.read().unwrap().clone().expect("a read-only view");
        assert_eq!(
            reader.offsets(),
            (0, 3, 2),
            "what the files hold, at our epoch"
        );
        let got = reader.read(0, 1 << 20).unwrap();
        assert_eq!(got.high_watermark, 3);
        assert!(!got.records.is_empty(), "the records are read");
        let refused = produce(&h).await;
        assert!(
            matches!(&refused, Err(PartitionError::Storage(m)) if m.contains("full")),
            "{refused:?}"
        );
        // Several re-driven opens later: no claim was left behind, and
        // readers were served throughout.
        actix_rt::time::sleep(Duration::from_millis(800)).await;
        assert!(
            h.reader.read().unwrap().is_some(),
            "still served across retries"
        );
        let claims: Vec<String> = std::fs::read_dir(d.path().join("t/0"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".claim") && n != "leader-e1.claim")
            .collect();
        assert!(
            claims.is_empty(),
            "claims left by full-volume retries: {claims:?}"
        );
        // Space returns: the next retry opens for writing, at epoch 2.
        fault.full(false);
        let mut hw = refused;
        while hw.is_err() && t0.elapsed() < Duration::from_secs(20) {
            actix_rt::time::sleep(Duration::from_millis(100)).await;
            hw = produce(&h).await;
        }
        assert_eq!(hw, Ok(4), "writable again, after the three records");
        let epoch = h.reader.read().unwrap().as_ref().unwrap().offsets().2;
        assert_eq!(epoch, 2, "no epoch climbed");
        h.addr.send(StopLeader).await.unwrap();
        arbiter.stop();
    }

    /// Start a leader of `name` on `fs` and produce one record through
    /// the mailbox (the open is done when it is acknowledged).
    async fn opened(d: &Path, fs: SharedFs, arbiter: &actix::Arbiter) -> PartitionHandle {
        let h = PartitionLeader::start(spec(d, "t"), fs, &arbiter.handle());
        assert_eq!(produce(&h).await, Ok(1), "opened, through the mailbox");
        h
    }

    fn handed(h: &PartitionHandle) -> HandedOver {
        let (records, infos) = super::super::commit::tests::batch(1);
        let msg = AppendBatches {
            records,
            infos,
            wait_durable: true,
            verified: None,
        };
        // Deterministic: the log is open (the first produce was answered)
        // and nothing else decides; never "the gate is busy".
        h.hand_over(msg)
            .ok()
            .expect("a small plain batch is handed over while the log is open")
    }

    /// A leader opened on its own arbiter over a filesystem whose writes
    /// and fsyncs the test can hold.
    async fn opened_with_holds() -> (tempfile::TempDir, Holds, actix::Arbiter, PartitionHandle) {
        let d = tempfile::tempdir().unwrap();
        let holds = Holds::default();
        let fs: SharedFs = Arc::new(SlowFs(Duration::ZERO, Default::default(), holds.clone()));
        let arbiter = actix::Arbiter::new();
        let h = opened(d.path(), fs, &arbiter).await;
        (d, holds, arbiter, h)
    }

    /// The base offset a hand-over was placed at, within 5 s (`what`: the
    /// expectation a timeout breaks).
    async fn placed_at(
        placed: oneshot::Receiver<Result<Placed, PartitionError>>,
        what: &str,
    ) -> Result<i64, PartitionError> {
        tokio::time::timeout(Duration::from_secs(5), placed)
            .await
            .expect(what)
            .unwrap()
            .map(|p| p.base_offset)
    }

    /// Catches: an acknowledgement routed through the actor's arbiter (a
    /// thread hop per fsync on the produce path), or given before the
    /// fsync. An append handed over is written and acknowledged by the
    /// writer loop, while the arbiter is busy with something else, and
    /// only once its fsync has returned.
    #[actix_rt::test]
    async fn a_handed_over_append_is_acknowledged_by_its_fsync_without_the_arbiter() {
        let (_d, holds, arbiter, h) = opened_with_holds().await;
        // The arbiter is busy (at most 10 s) until the test lets it go.
        let (free, busy) = std::sync::mpsc::channel::<()>();
        arbiter.spawn_fn(move || {
            let _ = busy.recv_timeout(Duration::from_secs(10));
        });
        holds.sync.set(true);
        let mut placed = handed(&h).placed;
        assert!(holds.sync.until_waited(), "its fsync started");
        assert!(
            placed.try_recv().is_err(),
            "not acknowledged while its fsync has not returned"
        );
        holds.sync.set(false);
        assert_eq!(
            placed_at(placed, "acknowledged while the arbiter is busy").await,
            Ok(1)
        );
        free.send(()).unwrap();
        h.addr.send(StopLeader).await.unwrap();
        arbiter.stop();
    }

    /// Catches: a connection's thread writing to the volume itself (a hung
    /// volume would stall every client and the dashboard it serves), and
    /// work handed over missing from the actor's telemetry. The hand-over
    /// returns while the write hangs; the request counts in the actor's
    /// mailbox depth until it is answered, and as an `append_batches`
    /// message it handled.
    #[actix_rt::test]
    async fn a_hung_write_does_not_hold_the_caller_and_counts_as_the_actors_work() {
        let (_d, holds, arbiter, h) = opened_with_holds().await;
        let stats = h.addr.stats().clone();
        let handled = stats.handled();
        holds.write.set(true);
        let over = handed(&h);
        // Returned: the write is done (or hangs) on the writer loop.
        assert!(holds.write.until_waited(), "the writer loop writes");
        assert_eq!(stats.depth(), 1, "the request counts as the actor's");
        holds.write.set(false);
        assert_eq!(
            placed_at(over.placed, "acknowledged once the volume is back").await,
            Ok(1)
        );
        drop(over.owed);
        assert_eq!(stats.depth(), 0);
        assert_eq!(stats.handled(), handled + 1, "counted as a message handled");
        h.addr.send(StopLeader).await.unwrap();
        arbiter.stop();
    }
}
