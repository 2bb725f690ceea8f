//! `PartitionLeader`: the actor that owns one partition's writable files.
//!
//! It is a thin actix adapter around [`CommitGate`] (the waiter queue, the
//! ack-only-under-lease gate and the one lease-checked path of every write)
//! and [`PartitionLog`]: appends go to the page cache on the actor's arbiter,
//! fsyncs run on the blocking pool (group commit: whatever was appended while
//! one fsync ran is covered by the next), and their results are fed back to
//! the gate. Any I/O error stops the actor; its [`actix::Supervisor`]
//! restarts it, and `started` re-opens the log, which re-runs recovery from
//! the files: that is the re-drive. The open runs on the blocking pool, so a
//! long recovery never stalls the partitions sharing this arbiter; until it
//! returns, appends are held in order (bounded) and applied when it does,
//! reads wait (bounded) for the reader, and a stop waits for it. Restarts
//! are counted in telemetry.

use super::claim::ClaimOwner;
use super::commit::{refused, storage, CommitGate, Halt, Refused};
use super::log::{Claimant, LogConfig, LogError, PartitionLog};
use super::messages::{
    AppendBatches, AppendTicket, DeleteRecordsBefore, EnforceRetention, GetProducers,
    PartitionError, ProducerInfo, SetLogConfig, StopLeader, WriteTxnMarker,
};
use super::producers::{Admission, TxnVerifications};
use super::reader::PartitionReader;
use crate::clock::{self, SharedClock};
use crate::cluster::lease::{Lease, LeaseGuard};
use crate::telemetry::{self, ActorStats, Mailbox};
use actix::prelude::*;
use kaas_volume::fs::{ReadOnly, SharedFs};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
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
    /// Called when the open finds our epoch claimed by another leader, or a
    /// higher epoch on disk: with the epoch found and, if known, the leader
    /// that claimed it, so the broker can ask for a grant above it.
    pub on_fenced: Option<OnFenced>,
}

/// See [`LeaderSpec::on_fenced`].
#[derive(Clone)]
#[allow(clippy::type_complexity)]
pub struct OnFenced(pub Arc<dyn Fn(i32, Option<ClaimOwner>) + Send + Sync>);

impl std::fmt::Debug for OnFenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnFenced")
    }
}

/// See module docs.
pub struct PartitionLeader {
    spec: LeaderSpec,
    fs: SharedFs,
    gate: CommitGate,
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
    parked: VecDeque<(Parked, oneshot::Sender<AppendResult>)>,
    /// Transaction verifications in flight (KIP-890 part 1); in memory
    /// only: a new leader verifies again.
    verifications: TxnVerifications,
}

/// A write held while the partition opens.
enum Parked {
    Append(AppendBatches),
    Marker(WriteTxnMarker),
}

type AppendResult = Result<AppendTicket, PartitionError>;

/// Appends held while a partition opens (the mailbox capacity): beyond it
/// the client gets the retriable "recovering" storage error.
const MAX_PARKED: usize = 256;

/// The result of an open run on the blocking pool.
#[derive(Message)]
#[rtype(result = "()")]
struct Opened(Result<PartitionLog, LogError>);

/// Partition opens (recoveries) running at once, at most.
const MAX_CONCURRENT_OPENS: usize = 16;
static OPENS: Permits = Permits::new(MAX_CONCURRENT_OPENS);

/// A counting semaphore for blocking-pool threads.
struct Permits {
    free: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
}

struct Permit(&'static Permits);

impl Permits {
    const fn new(n: usize) -> Self {
        Self {
            free: std::sync::Mutex::new(n),
            freed: std::sync::Condvar::new(),
        }
    }

    fn acquire(&'static self) -> Permit {
        let mut free = self.free.lock().unwrap();
        while *free == 0 {
            free = self.freed.wait(free).unwrap();
        }
        *free -= 1;
        Permit(self)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap() += 1;
        self.0.freed.notify_one();
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
        let mine = stats.clone();
        let addr = Supervisor::start_in_arbiter(arbiter, move |_| PartitionLeader {
            gate: CommitGate::new(spec.lease.clone(), clock, hw_tx),
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
        });
        PartitionHandle {
            addr: Mailbox::new(addr, stats),
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
        }
        ctx.stop();
    }

    fn unavailable(&self) -> PartitionError {
        self.last_error
            .clone()
            .unwrap_or_else(|| PartitionError::Storage("partition is recovering".into()))
    }

    fn kick_sync(&mut self, ctx: &mut Context<Self>) {
        let Some(t) = self.gate.begin_sync() else {
            return;
        };
        let job = actix_rt::task::spawn_blocking(move || {
            let start = std::time::Instant::now();
            let r = t.file.sync_data();
            (t, r, start.elapsed())
        });
        ctx.spawn(job.into_actor(self).map(|res, act, ctx| {
            let res = match res {
                Ok((t, r, took)) => {
                    if r.is_ok() {
                        act.stats.fsynced(took);
                    }
                    act.gate.synced(t, r)
                }
                Err(e) => Err(act
                    .gate
                    .fail(PartitionError::Storage(format!("fsync task: {e}")))),
            };
            match res {
                Ok(()) => act.kick_sync(ctx),
                Err(h) => act.halted(h, ctx),
            }
        }));
    }
}

impl Actor for PartitionLeader {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(256);
        if self.stopping {
            return;
        }
        if !self.gate.lease_valid() {
            // Never open (and sweep) under a lapsed lease: a newer leader
            // may own the files by now.
            self.stopping = true;
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
            guard: self.spec.lease.clone().map(|(lease, inc)| {
                Arc::new(LeaseGuard::new(lease, inc)) as Arc<dyn kaas_volume::fs::WriteGuard>
            }),
        };
        let (now, failed_at) = (self.gate.clock().now_ms(), self.gate.failed_at());
        let addr = ctx.address();
        actix_rt::task::spawn_blocking(move || {
            // Bounded: each open holds a few descriptors for a moment (the
            // tail scan, the claim, the manifest); 10,000 opens at once on
            // the blocking pool would take them all (EMFILE under a small
            // limit) and gain nothing on two cores.
            let _permit = OPENS.acquire();
            let res = PartitionLog::open_as(fs, &dir, epoch, who, cfg, now, failed_at);
            addr.do_send(Opened(res));
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
    fn opened(&mut self, res: Result<PartitionLog, LogError>, ctx: &mut Context<Self>) {
        match res {
            Ok(mut log) => {
                // A config altered while the open ran is in the spec.
                log.set_config(self.spec.cfg.clone());
                tracing::info!(topic = %self.spec.topic, partition = self.spec.partition, epoch = self.spec.epoch, hw = log.high_watermark(), "partition leader open");
                *self.reader.write().unwrap() =
                    Some(PartitionReader::new(self.fs.read_only(), log.view()));
                self.gate.install(log);
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
            if let Err(h) = a.gate.tick() {
                a.halted(h, ctx);
            }
        });
        ctx.run_interval(self.spec.retention_check, |a, ctx| {
            match a.gate.enforce_retention() {
                Ok(None | Some(0)) => {}
                Ok(Some(n)) => {
                    let log_start = a.gate.log().map(|l| l.log_start_offset());
                    tracing::info!(topic = %a.spec.topic, partition = a.spec.partition, segments = n, log_start, "retention removed segments");
                }
                Err(h) => a.halted(h, ctx),
            }
        });
    }

    /// Stop for good (see [`StopLeader`]); the gate checks the lease.
    fn stop_for_good(&mut self, ctx: &mut Context<Self>) {
        match self.gate.stop() {
            Ok(()) => {}
            Err(Halt::Fenced) => return self.halted(Halt::Fenced, ctx),
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
            self.opened(msg.0, ctx);
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
        *self.reader.write().unwrap() = None;
        let err = self.unavailable();
        for (_, tx) in self.parked.drain(..) {
            let _ = tx.send(Err(err.clone()));
        }
        self.gate.reset(err);
    }
}

impl PartitionLeader {
    /// Apply (or, if the open failed, fail) the appends parked during it.
    fn unpark(&mut self, ctx: &mut Context<Self>) {
        for (msg, tx) in std::mem::take(&mut self.parked) {
            let r = match msg {
                Parked::Append(m) => self.append(m, ctx),
                Parked::Marker(m) => self.marker(m, ctx),
            };
            let _ = tx.send(r);
        }
    }

    fn append(&mut self, msg: AppendBatches, ctx: &mut Context<Self>) -> AppendResult {
        let txn = msg.infos.iter().any(|b| b.is_transactional());
        if txn {
            self.admit(&msg)?;
        }
        let r = self.gate.append(&msg.records, &msg.infos, msg.wait_durable);
        let ticket = self.refusal(r, ctx)?;
        if txn {
            self.verifications
                .appended(msg.infos.iter().map(|b| b.producer_id));
        }
        telemetry::global()
            .produce_bytes
            .fetch_add(msg.records.len() as u64, Ordering::Relaxed);
        self.kick_sync(ctx);
        Ok(ticket)
    }

    /// KIP-890 part 1: may these transactional batches be written, or
    /// must the caller verify with the coordinator first (see
    /// [`TxnVerifications`])? A partition not open yet admits nothing
    /// here; the append itself then answers why.
    fn admit(&mut self, msg: &AppendBatches) -> Result<(), PartitionError> {
        let Some(log) = self.gate.log() else {
            return Ok(());
        };
        let batches = msg
            .infos
            .iter()
            .map(|b| (b.producer_id, b.producer_epoch, b.is_transactional()));
        match self
            .verifications
            .admit(log.producers(), batches, msg.verified)
        {
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
        let r = self.gate.append_marker(&msg);
        let ticket = self.refusal(r, ctx)?;
        self.verifications.ended(msg.producer_id);
        tracing::debug!(topic = %self.spec.topic, partition = self.spec.partition, producer_id = msg.producer_id, commit = msg.commit, offset = ticket.base_offset, "transaction marker written");
        self.kick_sync(ctx);
        Ok(ticket)
    }

    /// What a client is told when the gate refused a write.
    fn refusal(
        &mut self,
        r: Result<AppendTicket, Refused>,
        ctx: &mut Context<Self>,
    ) -> AppendResult {
        let ticket = match r {
            Ok(t) => t,
            Err(Refused::NotOpen) => return Err(self.unavailable()),
            Err(Refused::TooLarge) => return Err(PartitionError::TooLarge),
            Err(Refused::NoSpace(e)) => {
                telemetry::global()
                    .no_space_refusals
                    .fetch_add(1, Ordering::Relaxed);
                return Err(PartitionError::Storage(e));
            }
            Err(Refused::Sequence(e)) => return Err(super::commit::sequence(e)),
            Err(Refused::Halted(h)) => {
                self.halted(h, ctx);
                return Err(self.unavailable());
            }
        };
        Ok(ticket)
    }
}

impl Handler<AppendBatches> for PartitionLeader {
    type Result = ResponseFuture<AppendResult>;

    fn handle(&mut self, msg: AppendBatches, ctx: &mut Context<Self>) -> Self::Result {
        if self.opening && !self.stopping && self.parked.len() < MAX_PARKED {
            let (tx, rx) = oneshot::channel();
            self.parked.push_back((Parked::Append(msg), tx));
            let err = self.unavailable();
            return Box::pin(async move { rx.await.unwrap_or(Err(err)) });
        }
        let r = self.append(msg, ctx);
        Box::pin(async move { r })
    }
}

impl Handler<WriteTxnMarker> for PartitionLeader {
    type Result = ResponseFuture<AppendResult>;

    fn handle(&mut self, msg: WriteTxnMarker, ctx: &mut Context<Self>) -> Self::Result {
        if self.opening && !self.stopping && self.parked.len() < MAX_PARKED {
            let (tx, rx) = oneshot::channel();
            self.parked.push_back((Parked::Marker(msg), tx));
            let err = self.unavailable();
            return Box::pin(async move { rx.await.unwrap_or(Err(err)) });
        }
        let r = self.marker(msg, ctx);
        Box::pin(async move { r })
    }
}

impl Handler<GetProducers> for PartitionLeader {
    type Result = Result<Vec<ProducerInfo>, PartitionError>;

    fn handle(&mut self, _: GetProducers, _ctx: &mut Context<Self>) -> Self::Result {
        self.gate.producers().ok_or_else(|| self.unavailable())
    }
}

impl Handler<EnforceRetention> for PartitionLeader {
    type Result = Result<usize, PartitionError>;

    fn handle(&mut self, _: EnforceRetention, ctx: &mut Context<Self>) -> Self::Result {
        match self.gate.enforce_retention() {
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
        match self.gate.delete_records(m.offset) {
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
        self.gate.set_config(m.cfg);
        if self.stopping || self.opening {
            return;
        }
        match self.gate.enforce_retention() {
            Ok(Some(n)) if n > 0 => {
                let log_start = self.gate.log().map(|l| l.log_start_offset());
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
    /// taking `delay` (a long recovery: a CRC scan over a slow volume).
    struct SlowFs(Duration, std::sync::atomic::AtomicBool);

    impl Fs for SlowFs {
        fn open_read(&self, p: &Path) -> std::io::Result<Arc<dyn ReadFile>> {
            RealFs.open_read(p)
        }
        fn create_exclusive(&self, p: &Path) -> std::io::Result<Arc<dyn WriteFile>> {
            RealFs.create_exclusive(p)
        }
        fn open_write(&self, p: &Path) -> std::io::Result<Arc<dyn WriteFile>> {
            RealFs.open_write(p)
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
            on_fenced: None,
        }
    }

    async fn produce(h: &PartitionHandle) -> Result<i64, PartitionError> {
        let (records, infos) = super::super::commit::tests::batch(1);
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
        let fs: SharedFs = Arc::new(SlowFs(delay, Default::default()));
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
}
