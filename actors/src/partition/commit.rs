//! `CommitGate`: the partition leader's logic without actix — the waiter
//! queue, the ack-only-under-lease gate, and the one path by which the
//! leader writes to its log.
//!
//! Two rules hold by construction here, because the open log is a private
//! field and only two methods reach it:
//!
//! * every write (append, the post-fsync bookkeeping, roll, checkpoint,
//!   retention, the final sync and close of a stop) goes through
//!   [`CommitGate::writable`], which checks the lease first and, if it has
//!   lapsed, fences: fails every waiter with NOT_LEADER and drops the log, so
//!   a deposed owner (a paused zombie that woke up) writes nothing more;
//! * every acknowledgement goes through `release`, which re-checks the lease
//!   *after* the fsync that made the bytes durable, and releases waiters in
//!   offset order up to the high watermark.
//!
//! A third keeps exactly-once across the leader's own refusals: a batch
//! refused *retriably without being written* (the log is not open, the
//! volume is full, a write parked during the open was given up) leaves its
//! producer owed a retry ([`RetryOwed`]). Until one of its batches is
//! accepted again, a later batch of that producer that skips ahead is
//! refused retriably too, not with OUT_OF_ORDER_SEQUENCE_NUMBER: a client
//! answered "out of order" behind a batch it must retry (librdkafka)
//! bumps its epoch and re-sends that batch under new sequence numbers —
//! stored twice if an earlier owner had written it.
//!
//! [`super::leader::PartitionLeader`] is the actix adapter: it runs the
//! fsync on the blocking pool and feeds the result back here, and turns a
//! [`Halt`] into a stop of the actor.

use super::log::{successor_claimed, LogError, PartitionLog, SuccessorClaimed, SyncTarget};
use super::messages::{AppendTicket, PartitionError, Placed};
use super::producers::SequenceError;
use crate::clock::SharedClock;
use crate::cluster::lease::Lease;
use kaas_volume::fs::is_fenced;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::{oneshot, watch};

/// Who is answered once an fsync covers an append (see [`Notify`]).
type Waiter = (i64, Notify);

/// How a waiter is answered.
pub enum Notify {
    /// With the high watermark: the caller had its offsets at append
    /// time ([`AppendTicket`]).
    Hw(oneshot::Sender<Result<i64, PartitionError>>),
    /// With its offsets: an append handed over to the writer loop, whose
    /// caller learns where it landed only with its durability.
    Placed(Placed, oneshot::Sender<Result<Placed, PartitionError>>),
}

impl Notify {
    fn send(self, r: Result<i64, PartitionError>) {
        match self {
            Notify::Hw(tx) => {
                let _ = tx.send(r);
            }
            Notify::Placed(p, tx) => {
                let _ = tx.send(r.map(|_| p));
            }
        }
    }
}

/// Why the gate stopped serving; the adapter stops the actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Halt {
    /// The lease lapsed: every waiter was failed with NOT_LEADER and the log
    /// dropped without another write. Stay down for good.
    Fenced,
    /// The volume failed: every waiter was failed with this error; restart
    /// and recover from what is durable (a failed fsync is never retried).
    Failed(PartitionError),
    /// A later epoch of the partition was claimed while we lead it (see
    /// [`super::log::SyncTarget::sync`]): every waiter was failed with
    /// NOT_LEADER and the log dropped without another write, as for
    /// [`Halt::Fenced`]. Stay down; report the claim so a grant above it
    /// can be asked for.
    Superseded(SuccessorClaimed),
}

/// Why an append was refused.
#[derive(Debug)]
pub enum Refused {
    /// No log open (recovering, fenced at open, stopped).
    NotOpen,
    /// The batch would overflow offsets or a segment; nothing was written.
    TooLarge,
    /// The volume is full; nothing was written (the partial write was
    /// undone) and the log stays open for reads and later appends.
    NoSpace(String),
    /// An idempotent batch failed its sequence or epoch check; nothing was
    /// written.
    Sequence(SequenceError),
    /// An idempotent batch skips ahead of its producer's last sequence
    /// while the producer is owed a retry of a batch refused here (see
    /// [`RetryOwed`]): nothing was written; answered retriably.
    RetryFirst(SequenceError),
    /// See [`Halt`].
    Halted(Halt),
}

/// See module docs.
pub struct CommitGate {
    log: Option<PartitionLog>,
    waiters: VecDeque<Waiter>,
    /// The broker lease and the incarnation this leadership was granted to.
    /// `None` only in unit tests of the log itself.
    lease: Option<(Arc<Lease>, u64)>,
    clock: SharedClock,
    hw_tx: watch::Sender<i64>,
    syncing: bool,
    /// Set when this owner failed mid-write: (base, durable size) of the
    /// active segment, so the next open never trusts bytes after it.
    failed_at: Option<(i64, u64)>,
    /// Bumped whenever the log is installed, dropped or reset: an fsync
    /// begun under an older generation is stale and its result ignored
    /// (see [`Self::generation`]).
    generation: u64,
    /// Whether a log is open, readable without the gate (see
    /// [`Self::open_flag`]).
    open: Arc<AtomicBool>,
    /// Producers told to retry a batch that was never written here.
    owed: RetryOwed,
}

/// Producers owed a retry: one of their idempotent batches was refused
/// retriably without being written (see module docs). Each entry holds
/// until one of the producer's batches is accepted (written, or answered
/// as a duplicate), or for [`RetryOwed::HOLD_MS`] — a producer that never
/// comes back gets OUT_OF_ORDER_SEQUENCE_NUMBER again after that. At most
/// [`RetryOwed::MAX`] producers per partition; beyond that (a stale
/// entry is dropped first) a refusal is not remembered, which costs only
/// the exactly-once of that producer's gap, as before this existed.
#[derive(Debug, Default)]
pub struct RetryOwed(std::collections::HashMap<i64, i64>);

impl RetryOwed {
    /// How long an entry holds without the producer coming back.
    pub const HOLD_MS: i64 = 60_000;
    /// Producers remembered per partition.
    pub const MAX: usize = 1024;

    /// The idempotent batches of `infos` were refused retriably, unwritten.
    pub fn owe(&mut self, infos: &[kaas_protocol::batch::BatchInfo], now_ms: i64) {
        for b in infos.iter().filter(|b| b.has_producer_id()) {
            if self.0.len() >= Self::MAX && !self.0.contains_key(&b.producer_id) {
                self.0.retain(|_, at| now_ms - *at < Self::HOLD_MS);
                if self.0.len() >= Self::MAX {
                    return;
                }
            }
            self.0.insert(b.producer_id, now_ms);
        }
    }

    /// The batches of `infos` were accepted: their producers are settled.
    pub fn settled(&mut self, infos: &[kaas_protocol::batch::BatchInfo]) {
        if self.0.is_empty() {
            return;
        }
        for b in infos.iter().filter(|b| b.has_producer_id()) {
            self.0.remove(&b.producer_id);
        }
    }

    /// Whether `e` is a gap of a producer owed a retry (a batch ahead of
    /// its last sequence, in its current epoch), to be refused retriably.
    /// A rewound sequence or a new epoch not starting at 0 stays an error.
    pub fn masks(&self, e: &SequenceError, now_ms: i64) -> bool {
        let SequenceError::OutOfOrder {
            producer_id,
            found,
            last: Some(last),
            ..
        } = e
        else {
            return false;
        };
        i64::from(*found) > i64::from(*last) + 1
            && self
                .0
                .get(producer_id)
                .is_some_and(|at| now_ms - *at < Self::HOLD_MS)
    }

    /// Producers currently owed a retry.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no producer is owed a retry.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether `e` is a write the [`super::claim::EpochWriter`] refused because
/// the lease lapsed: nothing reached the volume, and we are no longer the
/// leader (not a storage failure, not a reason to restart).
pub fn refused(e: &LogError) -> bool {
    matches!(e, LogError::Io(io) if is_fenced(io))
}

/// Map a log error to what a client is told.
pub fn storage(e: LogError) -> PartitionError {
    match e {
        LogError::Fenced { .. } => PartitionError::NotLeader(e.to_string()),
        LogError::Io(ref io) if is_fenced(io) => PartitionError::NotLeader(e.to_string()),
        LogError::Overflow => PartitionError::TooLarge,
        LogError::Sequence(e) => sequence(e),
        e => PartitionError::Storage(e.to_string()),
    }
}

/// Map a refused idempotent batch to what a client is told.
pub fn sequence(e: SequenceError) -> PartitionError {
    match e {
        SequenceError::OutOfOrder { .. } => PartitionError::OutOfOrderSequence(e.to_string()),
        SequenceError::StaleEpoch { .. } => PartitionError::InvalidProducerEpoch(e.to_string()),
        SequenceError::InvalidTxnState { .. } => PartitionError::InvalidTxnState(e.to_string()),
        SequenceError::CoordinatorFenced { .. } => PartitionError::CoordinatorFenced(e.to_string()),
    }
}

impl CommitGate {
    /// A gate with no log open yet.
    pub fn new(
        lease: Option<(Arc<Lease>, u64)>,
        clock: SharedClock,
        hw_tx: watch::Sender<i64>,
    ) -> Self {
        Self {
            log: None,
            waiters: VecDeque::new(),
            lease,
            clock,
            hw_tx,
            syncing: false,
            failed_at: None,
            generation: 0,
            open: Arc::default(),
            owed: RetryOwed::default(),
        }
    }

    /// The idempotent batches of `infos` were refused retriably without
    /// reaching the gate's log (a parked write given up, or refused behind
    /// one): their producers are owed a retry (see [`RetryOwed`]).
    pub fn owe_retry(&mut self, infos: &[kaas_protocol::batch::BatchInfo]) {
        if infos.iter().any(|b| b.has_producer_id()) {
            let now = self.clock.now_ms();
            self.owed.owe(infos, now);
        }
    }

    /// Producers owed a retry (see [`RetryOwed`]).
    pub fn retry_owed(&self) -> &RetryOwed {
        &self.owed
    }

    /// Whether a log is open, for a thread that must not wait for the
    /// gate (a connection handing an append over): a hint only — the
    /// append itself is refused as not open if the log went meanwhile.
    pub fn open_flag(&self) -> Arc<AtomicBool> {
        self.open.clone()
    }

    /// Drop the open log (fenced, failed, reset, stopped): nothing more is
    /// written to it, and an fsync begun on it proves nothing.
    fn take_log(&mut self) -> Option<PartitionLog> {
        self.syncing = false;
        self.generation += 1;
        self.open.store(false, Ordering::Release);
        self.log.take()
    }

    /// Which log the gate holds: changes whenever one is installed,
    /// dropped (fenced, failed) or reset. An fsync's result is handed to
    /// [`Self::synced`] only if the generation is still the one it began
    /// under; else the log it covered is gone and it proves nothing.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the lease this leadership was granted under is valid now.
    pub fn lease_valid(&self) -> bool {
        self.lease.as_ref().is_none_or(|(l, inc)| l.valid_for(*inc))
    }

    /// The clock (wall milliseconds for segment ages and retention).
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Where the previous owner of this gate failed mid-write, if it did.
    pub fn failed_at(&self) -> Option<(i64, u64)> {
        self.failed_at
    }

    /// A freshly opened (recovered) log becomes the one served.
    pub fn install(&mut self, log: PartitionLog) {
        self.failed_at = None;
        self.hw_tx.send_replace(log.high_watermark());
        self.log = Some(log);
        self.generation += 1;
        self.open.store(true, Ordering::Release);
    }

    /// Replace the open log's storage settings (writes nothing).
    pub fn set_config(&mut self, cfg: super::log::LogConfig) {
        if let Some(log) = self.log.as_mut() {
            log.set_config(cfg);
        }
    }

    /// Read-only access to the open log.
    pub fn log(&self) -> Option<&PartitionLog> {
        self.log.as_ref()
    }

    /// Waiters not yet answered.
    pub fn pending(&self) -> usize {
        self.waiters.len()
    }

    /// Whether an fsync is in flight.
    pub fn syncing(&self) -> bool {
        self.syncing
    }

    /// The choke point of every write: the log, only while the lease is
    /// valid. A lapsed lease fences here (see module docs). `Ok(None)`: no
    /// log open, nothing to write to.
    fn writable(&mut self) -> Result<Option<&mut PartitionLog>, Halt> {
        if !self.lease_valid() {
            return Err(self.fence());
        }
        Ok(self.log.as_mut())
    }

    /// The lease lapsed: another broker may own the partition by now. Drop
    /// everything unacknowledged (it may or may not survive in the file; it
    /// was never promised) and the log itself, without another write.
    fn fence(&mut self) -> Halt {
        self.fail_waiters(PartitionError::NotLeader("broker lease lapsed".into()));
        self.take_log();
        Halt::Fenced
    }

    /// A log operation failed: a write the capability refused (the lease
    /// lapsed between our check and the write) fences like a lapsed lease;
    /// anything else is a storage failure.
    fn failed(&mut self, e: LogError) -> Halt {
        if refused(&e) {
            return self.fence();
        }
        if let LogError::Io(io) = &e {
            if let Some(s) = successor_claimed(io) {
                return self.superseded(s.clone());
            }
        }
        self.fail(storage(e))
    }

    /// A successor claimed the partition: like a lapsed lease, nothing
    /// more is acknowledged or written (see [`Halt::Superseded`]).
    fn superseded(&mut self, s: SuccessorClaimed) -> Halt {
        self.fail_waiters(PartitionError::NotLeader(s.to_string()));
        self.take_log();
        Halt::Superseded(s)
    }

    /// Fail every waiter, remember where the file stopped being
    /// trustworthy and drop the log, so nothing more is written to it (an
    /// append arriving before the restart is refused as not open); the
    /// adapter stops and the restart recovers.
    pub fn fail(&mut self, err: PartitionError) -> Halt {
        self.fail_waiters(err.clone());
        if let Some(log) = self.take_log() {
            self.failed_at = Some(log.durable_point());
        }
        Halt::Failed(err)
    }

    /// Forget the log (a supervisor restart) and fail the waiters with `err`.
    pub fn reset(&mut self, err: PartitionError) {
        self.take_log();
        self.fail_waiters(err);
    }

    fn fail_waiters(&mut self, err: PartitionError) {
        for (_, n) in self.waiters.drain(..) {
            n.send(Err(err.clone()));
        }
    }

    /// Acknowledge what is durable. Every acknowledgement passes here, and
    /// none is sent unless the lease is valid *now* — after the fsync that
    /// made it durable, whichever path ran it (group commit, roll, stop).
    /// Returns false, releasing nothing, if the lease has lapsed.
    #[must_use]
    fn release(&mut self) -> bool {
        if !self.lease_valid() {
            return false;
        }
        let Some(log) = &self.log else { return true };
        let hw = log.high_watermark();
        while let Some((last, _)) = self.waiters.front() {
            if *last >= hw {
                break;
            }
            let (_, n) = self.waiters.pop_front().expect("front exists");
            n.send(Ok(hw));
        }
        self.hw_tx.send_replace(hw);
        true
    }

    /// Append validated batches; with `wait_durable` the ticket carries a
    /// receiver answered once an fsync covers them (under a valid lease).
    ///
    /// A duplicate of an idempotent batch already written is answered with
    /// the original's offsets, and only once the original is durable: its
    /// waiter carries the original's last offset, and `release` answers
    /// waiters in queue order only up to the high watermark — at once if
    /// nothing ahead of it is still waiting for an fsync, else with the
    /// fsync that releases those. If that fsync fails, all of them fail,
    /// and the retry after the restart finds a state rebuilt from the
    /// durable log.
    pub fn append(
        &mut self,
        records: &[u8],
        infos: &[kaas_protocol::batch::BatchInfo],
        wait_durable: bool,
    ) -> Result<AppendTicket, Refused> {
        let mut durable = None;
        let placed = self.place(records, infos, |_| {
            wait_durable.then(|| {
                let (tx, rx) = oneshot::channel();
                durable = Some(rx);
                Notify::Hw(tx)
            })
        })?;
        Ok(AppendTicket {
            base_offset: placed.base_offset,
            log_start_offset: placed.log_start_offset,
            durable,
        })
    }

    /// [`Self::append`] for an append handed over without an answer at
    /// append time: once written, `tx` (if any) is taken and answered with
    /// where the append landed once an fsync covers it; refused, it is
    /// left for the caller to answer with the error.
    pub fn append_handed(
        &mut self,
        records: &[u8],
        infos: &[kaas_protocol::batch::BatchInfo],
        tx: &mut Option<oneshot::Sender<Result<Placed, PartitionError>>>,
    ) -> Result<(), Refused> {
        self.place(records, infos, |p| {
            tx.take().map(|tx| Notify::Placed(p, tx))
        })
        .map(|_| ())
    }

    /// The append both of the above share: write, then queue the waiter
    /// `notify` makes (if any) behind the appended offsets.
    fn place(
        &mut self,
        records: &[u8],
        infos: &[kaas_protocol::batch::BatchInfo],
        notify: impl FnOnce(Placed) -> Option<Notify>,
    ) -> Result<Placed, Refused> {
        // Only idempotent producers need the time (expiry); the plain hot
        // path skips the clock read.
        let now = if infos.iter().any(|b| b.has_producer_id()) {
            self.clock.now_ms()
        } else {
            0
        };
        let Some(log) = self.writable().map_err(Refused::Halted)? else {
            self.owed.owe(infos, now);
            return Err(Refused::NotOpen);
        };
        let appended = match log.append_at(records, infos, now) {
            Ok(a) => a,
            Err(LogError::Overflow) => return Err(Refused::TooLarge),
            Err(LogError::NoSpace(e)) => {
                self.owed.owe(infos, now);
                return Err(Refused::NoSpace(e.to_string()));
            }
            Err(LogError::Sequence(e)) if self.owed.masks(&e, now) => {
                tracing::debug!(error = %e, "a gap behind a batch refused here: retriable");
                return Err(Refused::RetryFirst(e));
            }
            Err(LogError::Sequence(e)) => return Err(Refused::Sequence(e)),
            Err(e) => {
                self.owed.owe(infos, now);
                return Err(Refused::Halted(self.failed(e)));
            }
        };
        let placed = Placed {
            base_offset: appended.base_offset,
            log_start_offset: log.log_start_offset(),
        };
        self.owed.settled(infos);
        // A duplicate waits for its original's last offset: `release`
        // answers a waiter only once the high watermark passes it.
        let waits = match notify(placed) {
            Some(n) => {
                self.waiters.push_back((appended.last_offset, n));
                true
            }
            None => false,
        };
        // A duplicate of a durable batch is answered now, through the one
        // acknowledging path (it re-checks the lease).
        if appended.duplicate && waits && !self.release() {
            return Err(Refused::Halted(self.fence()));
        }
        Ok(placed)
    }

    /// Append a transaction marker (see [`PartitionLog::append_marker`]);
    /// the ticket's receiver is answered once an fsync covers it, under a
    /// valid lease, like an append's.
    pub fn append_marker(
        &mut self,
        m: &super::messages::WriteTxnMarker,
    ) -> Result<AppendTicket, Refused> {
        let now = self.clock.now_ms();
        let Some(log) = self.writable().map_err(Refused::Halted)? else {
            return Err(Refused::NotOpen);
        };
        let appended = match log.append_marker(
            m.producer_id,
            m.producer_epoch,
            m.coordinator_epoch,
            m.commit,
            now,
        ) {
            Ok(a) => a,
            Err(LogError::Overflow) => return Err(Refused::TooLarge),
            Err(LogError::NoSpace(e)) => return Err(Refused::NoSpace(e.to_string())),
            Err(LogError::Sequence(e)) => return Err(Refused::Sequence(e)),
            Err(e) => return Err(Refused::Halted(self.failed(e))),
        };
        let log_start_offset = log.log_start_offset();
        let (tx, rx) = oneshot::channel();
        self.waiters
            .push_back((appended.last_offset, Notify::Hw(tx)));
        Ok(AppendTicket {
            base_offset: appended.base_offset,
            log_start_offset,
            durable: Some(rx),
        })
    }

    /// The producers known at the open log (DescribeProducers).
    pub fn producers(&self) -> Option<Vec<super::messages::ProducerInfo>> {
        let log = self.log.as_ref()?;
        let mut v: Vec<_> = log
            .producers()
            .entries()
            .map(|(pid, e)| {
                let last = e.batches.back();
                super::messages::ProducerInfo {
                    producer_id: pid,
                    producer_epoch: e.epoch,
                    last_sequence: last.map_or(-1, |b| b.last_seq),
                    last_timestamp: last.map_or(-1, |b| b.timestamp),
                    coordinator_epoch: e.coordinator_epoch,
                    current_txn_start_offset: e.txn_first_offset.unwrap_or(-1),
                }
            })
            .collect();
        v.sort_by_key(|p| p.producer_id);
        Some(v)
    }

    /// What the next group-commit fsync must cover, if one is not already in
    /// flight and anything was written. The caller runs `sync_data` on it
    /// (off the actor's thread) and hands the result to [`Self::synced`].
    pub fn begin_sync(&mut self) -> Option<SyncTarget> {
        if self.syncing {
            return None;
        }
        let t = self.log.as_ref()?.sync_target()?;
        self.syncing = true;
        Some(t)
    }

    /// An fsync started by [`Self::begin_sync`] returned. On success (under
    /// a valid lease) the high watermark moves, a due roll runs, the
    /// waiters now durable are released, and a due checkpoint runs; the
    /// caller then starts
    /// the next fsync. An fsync that returns after the lease lapsed
    /// releases nothing.
    pub fn synced(&mut self, t: SyncTarget, res: io::Result<()>) -> Result<(), Halt> {
        self.syncing = false;
        if let Err(e) = res {
            // A refused fsync synced nothing and poisoned nothing: we lost
            // the right to write, the volume did not fail.
            if is_fenced(&e) {
                return Err(self.fence());
            }
            // The fsync succeeded, but a successor claimed the partition
            // before we could acknowledge it.
            if let Some(s) = successor_claimed(&e) {
                return Err(self.superseded(s.clone()));
            }
            // A full volume (NFS reports it at write-back, so at fsync):
            // nothing past the durable point is kept — its appends fail,
            // unacknowledged — and the partition stays up for reads and
            // for the next append once space returns.
            if crate::partition::log::is_no_space(&e) {
                if let Some(log) = self.writable()? {
                    if let Err(e) = log.rewind_to_durable() {
                        return Err(self.failed(e));
                    }
                    self.fail_waiters(PartitionError::Storage(format!("fsync: {e}")));
                    return Ok(());
                }
            }
            return Err(self.fail(PartitionError::Storage(format!("fsync: {e}"))));
        }
        if let Some(log) = self.writable()? {
            log.complete_sync(t);
        }
        // A segment due to roll (by size or age) rolls before the
        // acknowledgements this fsync completes are sent, as Kafka rolls
        // before the append that would overflow it: an acknowledged
        // produce finds the segments it filled sealed. (The roll fsyncs
        // inline; release() re-checks the lease after it.)
        let now = self.clock.now_ms();
        if let Some(log) = self.writable()? {
            let res = if log.roll_due(now) {
                log.roll(now)
            } else {
                Ok(())
            };
            self.bookkeeping(res)?;
        }
        if !self.release() {
            return Err(self.fence());
        }
        if let Some(log) = self.writable()? {
            let res = if log.checkpoint_due() && !log.dirty() {
                log.checkpoint()
            } else {
                Ok(())
            };
            self.bookkeeping(res)?;
        }
        Ok(())
    }

    /// The outcome of a roll or checkpoint after an fsync: a full volume
    /// changed nothing (the partition stays up for reads, and appends as
    /// space allows; it is tried again at the next sync), anything else
    /// fails the log.
    fn bookkeeping(&mut self, res: Result<(), LogError>) -> Result<(), Halt> {
        match res {
            Ok(()) => Ok(()),
            Err(LogError::NoSpace(e)) => {
                tracing::warn!(error = %e, "roll or checkpoint refused by a full volume; retried at the next sync");
                Ok(())
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    /// The periodic timer: roll a segment that is due by age. Only between
    /// fsyncs, and only under a valid lease.
    pub fn tick(&mut self) -> Result<(), Halt> {
        if self.syncing {
            return Ok(());
        }
        let now = self.clock.now_ms();
        let due = self
            .log
            .as_ref()
            .is_some_and(|l| !l.dirty() && l.roll_due(now));
        if !due {
            return Ok(());
        }
        if let Some(log) = self.writable()? {
            match log.roll(now) {
                Ok(()) => {}
                // Nothing changed; the next tick tries again.
                Err(LogError::NoSpace(e)) => {
                    tracing::warn!(error = %e, "roll refused by a full volume; retried at the next tick");
                }
                Err(e) => return Err(self.failed(e)),
            }
        }
        Ok(())
    }

    /// Delete segments past retention; the number removed.
    pub fn enforce_retention(&mut self) -> Result<Option<usize>, Halt> {
        let now = self.clock.now_ms();
        let Some(log) = self.writable()? else {
            return Ok(None);
        };
        match log.enforce_retention(now) {
            Ok(n) => Ok(Some(n)),
            // Nothing removed; the next pass tries again.
            Err(LogError::NoSpace(e)) => {
                tracing::warn!(error = %e, "retention refused by a full volume; retried at the next pass");
                Ok(Some(0))
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    /// DeleteRecords: raise the log start offset to `offset` (see
    /// [`PartitionLog::delete_records`]); the new log start offset.
    pub fn delete_records(&mut self, offset: i64) -> Result<Option<i64>, Halt> {
        let Some(log) = self.writable()? else {
            return Ok(None);
        };
        match log.delete_records(offset) {
            Ok(n) => Ok(Some(n)),
            Err(e) => Err(self.failed(e)),
        }
    }

    /// Stop for good: a final fsync, release what it covered (only under a
    /// valid lease), close (checkpoint) only if the lease still holds, and
    /// fail whatever is left with NOT_LEADER. Errors are logged by the
    /// caller; the next open recovers.
    pub fn stop(&mut self) -> Result<(), Halt> {
        let Some(log) = self.writable()? else {
            self.fail_waiters(PartitionError::NotLeader("partition leader stopped".into()));
            return Ok(());
        };
        let res = log.sync_now().map(|_| ());
        // Waiters covered by that sync are durable: release them (not if
        // the lease lapsed meanwhile: they are failed below).
        let valid = self.release();
        let log = self.take_log().expect("writable returned it");
        let res = if valid {
            res.and_then(|_| log.close())
        } else {
            // Dropped unclosed: the checkpoint would be a write by an owner
            // whose lease is gone. The next open recovers.
            res
        };
        self.fail_waiters(PartitionError::NotLeader("partition leader stopped".into()));
        if !valid {
            return Err(Halt::Fenced);
        }
        res.map_err(|e| {
            if refused(&e) {
                Halt::Fenced
            } else {
                Halt::Failed(storage(e))
            }
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::clock::{Clock, FakeClock};
    use crate::cluster::lease::LeaseGuard;
    use crate::partition::claim::ClaimOwner;
    use crate::partition::log::{Claimant, LogConfig};
    use bytes::Bytes;
    use kaas_protocol::batch::{validate_batches, BatchInfo};
    use kaas_volume::fs::fault::FaultFs;
    use kaas_volume::fs::{RealFs, SharedFs};
    use std::time::Duration;

    const LEASE: Duration = Duration::from_secs(3);

    pub(crate) fn batch(n: usize) -> (Bytes, Vec<BatchInfo>) {
        let b = crate::partition::tests::batch(&vec!["v"; n], 1_700_000_000_000);
        let infos = validate_batches(&b).unwrap();
        (b, infos)
    }

    struct Rig {
        _dir: tempfile::TempDir,
        clock: Arc<FakeClock>,
        fs: FaultFs,
        gate: CommitGate,
        hw: watch::Receiver<i64>,
    }

    fn rig(cfg: LogConfig) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let clock = FakeClock::new();
        let lease = Arc::new(Lease::with_clock(LEASE, 1, clock.clone()));
        assert!(lease.renewed(1, clock.now(), clock.now()));
        let fs = FaultFs::new();
        let shared: SharedFs = Arc::new(fs.clone());
        let pdir = dir.path().join("t").join("0");
        shared.create_dir_all(&pdir).unwrap();
        let log = open_guarded(shared, &pdir, &lease, cfg, clock.now_ms());
        let (hw_tx, hw) = watch::channel(-1);
        let mut gate = CommitGate::new(Some((lease, 1)), clock.clone(), hw_tx);
        gate.install(log);
        Rig {
            _dir: dir,
            clock,
            fs,
            gate,
            hw,
        }
    }

    /// Open as the claimant of epoch 1, writing under `lease` (incarnation 1).
    fn open_guarded(
        fs: SharedFs,
        pdir: &std::path::Path,
        lease: &Arc<Lease>,
        cfg: LogConfig,
        now_ms: i64,
    ) -> PartitionLog {
        let who = Claimant {
            owner: Some(ClaimOwner {
                broker_id: 1,
                incarnation: 1,
            }),
            guard: Some(Arc::new(LeaseGuard::new(lease.clone(), 1))),
            binding: None,
        };
        PartitionLog::open_as(fs, pdir, 1, who, cfg, now_ms, None).unwrap()
    }

    fn append(r: &mut Rig, n: usize) -> oneshot::Receiver<Result<i64, PartitionError>> {
        let (b, infos) = batch(n);
        r.gate.append(&b, &infos, true).unwrap().durable.unwrap()
    }

    fn fsync(r: &mut Rig) -> Result<(), Halt> {
        let t = r.gate.begin_sync().expect("something to sync");
        let res = t.sync();
        r.gate.synced(t, res)
    }

    /// The base offsets of the batches in the segment file `seg`, checking
    /// that the file ends exactly at a batch boundary (no half batch).
    fn batch_offsets(seg: &std::path::Path) -> Vec<i64> {
        #[allow(clippy::disallowed_methods)]
        let bytes = std::fs::read(seg).unwrap();
        let (mut pos, mut offsets) = (0usize, Vec::new());
        while pos + 12 <= bytes.len() {
            offsets.push(i64::from_be_bytes(bytes[pos..pos + 8].try_into().unwrap()));
            pos += 12 + i32::from_be_bytes(bytes[pos + 8..pos + 12].try_into().unwrap()) as usize;
        }
        assert_eq!(pos, bytes.len(), "the file ends at a batch boundary");
        offsets
    }

    /// Catches: a full volume that costs the partition its leader (a
    /// restart whose re-open cannot write either, so reads fail too), and a
    /// refused append that leaves half a batch in the log or shifts the
    /// offsets of the next one.
    #[test]
    fn a_full_volume_refuses_the_append_and_the_partition_carries_on() {
        let mut r = rig(LogConfig::default());
        let mut a = append(&mut r, 2);
        fsync(&mut r).unwrap();
        assert_eq!(a.try_recv().unwrap(), Ok(2));
        let len = |r: &Rig| r.gate.log().unwrap().durable_point();
        let before = len(&r);
        r.fs.full(true);
        let (b, infos) = batch(3);
        match r.gate.append(&b, &infos, true) {
            Err(Refused::NoSpace(_)) => {}
            other => panic!("want NoSpace, got {:?}", other.map(|t| t.base_offset)),
        }
        assert!(r.gate.log().is_some(), "still open: reads go on");
        assert!(r.gate.begin_sync().is_none(), "nothing was written");
        assert_eq!(len(&r), before);
        let seg = r._dir.path().join("t/0/00000000000000000000-e1.log");
        #[allow(clippy::disallowed_methods)]
        let on_disk = std::fs::metadata(&seg).unwrap().len();
        assert_eq!(on_disk, before.1, "the half that landed was cut off");
        r.fs.full(false);
        // Space is back: the next batch takes the offsets the refused one
        // would have had, at the position it would have had.
        let (b, infos) = batch(3);
        let t = r.gate.append(&b, &infos, true).unwrap();
        assert_eq!(t.base_offset, 2);
        fsync(&mut r).unwrap();
        assert_eq!(*r.hw.borrow(), 5);
        assert_eq!(
            batch_offsets(&seg),
            vec![0, 1, 2, 3, 4],
            "no half batch between them"
        );
    }

    /// Catches: a roll that hits a full volume restarting the leader (a
    /// re-open that cannot write either, reads lost meanwhile), or a roll
    /// half done in memory; and a roll never retried once space returns.
    #[test]
    fn a_roll_that_finds_the_volume_full_is_retried_without_a_restart() {
        let mut r = rig(LogConfig {
            segment_bytes: 1,
            ..LogConfig::default()
        });
        let seg = |r: &Rig, base: u64| {
            r._dir
                .path()
                .join(format!("t/0/{base:020}-e1.log"))
                .exists()
        };
        let mut a = append(&mut r, 2);
        let t = r.gate.begin_sync().unwrap();
        let res = t.file.sync_data();
        r.fs.full(true); // the roll after this fsync finds no space
        assert_eq!(r.gate.synced(t, res), Ok(()), "no restart");
        assert_eq!(
            a.try_recv().unwrap(),
            Ok(2),
            "the durable batch is acknowledged"
        );
        assert!(!seg(&r, 2), "no new segment");
        assert!(r.gate.log().is_some(), "still open: reads go on");
        assert_eq!(r.gate.log().unwrap().high_watermark(), 2);
        let (b, infos) = batch(1);
        assert!(matches!(
            r.gate.append(&b, &infos, true),
            Err(Refused::NoSpace(_))
        ));
        // The periodic timer tries again, and finds no space either.
        assert_eq!(r.gate.tick(), Ok(()));
        assert!(!seg(&r, 2));
        // Space is back: the next sync rolls.
        r.fs.full(false);
        let mut c = append(&mut r, 1);
        fsync(&mut r).unwrap();
        assert_eq!(c.try_recv().unwrap(), Ok(3));
        assert!(seg(&r, 3), "rolled once space returned");
    }

    /// Catches: an fsync that fails with ENOSPC (how NFS reports a full
    /// volume: at write-back) costing the partition a restart whose
    /// re-open cannot write either; or a rewind that keeps the unsynced
    /// tail, or acknowledges it.
    #[test]
    fn an_fsync_that_finds_the_volume_full_rewinds_to_the_durable_point() {
        let mut r = rig(LogConfig::default());
        let mut a = append(&mut r, 2);
        fsync(&mut r).unwrap();
        assert_eq!(a.try_recv().unwrap(), Ok(2));
        let mut b = append(&mut r, 3);
        let t = r.gate.begin_sync().unwrap();
        let mut c = append(&mut r, 1); // written while the fsync runs
        let enospc = Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(r.gate.synced(t, enospc), Ok(()), "no restart");
        assert!(matches!(
            b.try_recv().unwrap(),
            Err(PartitionError::Storage(_))
        ));
        assert!(matches!(
            c.try_recv().unwrap(),
            Err(PartitionError::Storage(_))
        ));
        assert_eq!(*r.hw.borrow(), 2);
        assert!(r.gate.begin_sync().is_none(), "nothing left to sync");
        let t = append(&mut r, 2);
        let mut t = t;
        fsync(&mut r).unwrap();
        assert_eq!(
            t.try_recv().unwrap(),
            Ok(4),
            "offsets 2, 3 reused: 2 was never acknowledged"
        );
        let seg = r._dir.path().join("t/0/00000000000000000000-e1.log");
        assert_eq!(batch_offsets(&seg), vec![0, 1, 2, 3]);
    }

    /// Catches: a rewind after an ENOSPC fsync that keeps the producer
    /// state of the batches it undid, so the producer's retry of the lost
    /// batch is answered "duplicate" with offsets that hold nothing.
    #[test]
    fn a_rewind_forgets_the_producer_state_of_what_it_undid() {
        let mut r = rig(LogConfig::default());
        let b0 = crate::partition::tests::idem_batch(&["a"], 7, 0, 0);
        let i0 = validate_batches(&b0).unwrap();
        let mut t0 = r.gate.append(&b0, &i0, true).unwrap().durable.unwrap();
        fsync(&mut r).unwrap();
        assert_eq!(t0.try_recv().unwrap(), Ok(1));
        let b1 = crate::partition::tests::idem_batch(&["b"], 7, 0, 1);
        let i1 = validate_batches(&b1).unwrap();
        let mut t1 = r.gate.append(&b1, &i1, true).unwrap().durable.unwrap();
        let t = r.gate.begin_sync().unwrap();
        let enospc = Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(r.gate.synced(t, enospc), Ok(()));
        assert!(t1.try_recv().unwrap().is_err());
        // The producer retries sequence 1: a new write at offset 1, not a
        // "duplicate" pointing at nothing.
        let again = r.gate.append(&b1, &i1, true).unwrap();
        assert_eq!(again.base_offset, 1);
        let mut d = again.durable.unwrap();
        fsync(&mut r).unwrap();
        assert_eq!(d.try_recv().unwrap(), Ok(2));
    }

    fn idem(seq: i32) -> (Bytes, Vec<BatchInfo>) {
        let b = crate::partition::tests::idem_batch(&["a"], 7, 0, seq);
        let infos = validate_batches(&b).unwrap();
        (b, infos)
    }

    /// Catches: a batch that skips ahead of one refused by a full volume
    /// answered OUT_OF_ORDER_SEQUENCE_NUMBER (librdkafka then bumps the
    /// epoch and re-sends under new sequences what may already be stored),
    /// or a real gap masked once the producer settled.
    #[test]
    fn a_gap_behind_a_batch_the_full_volume_refused_is_retriable_until_settled() {
        let mut r = rig(LogConfig::default());
        let (b0, i0) = idem(0);
        r.gate.append(&b0, &i0, true).unwrap();
        fsync(&mut r).unwrap();
        let (b2, i2) = idem(2);
        assert!(
            matches!(
                r.gate.append(&b2, &i2, true),
                Err(Refused::Sequence(SequenceError::OutOfOrder { .. }))
            ),
            "nothing owed: a gap is out of order"
        );
        r.fs.full(true);
        let (b1, i1) = idem(1);
        assert!(matches!(
            r.gate.append(&b1, &i1, true),
            Err(Refused::NoSpace(_))
        ));
        r.fs.full(false);
        assert_eq!(r.gate.retry_owed().len(), 1);
        assert!(
            matches!(r.gate.append(&b2, &i2, true), Err(Refused::RetryFirst(_))),
            "behind the refused batch: retriable"
        );
        assert_eq!(r.gate.append(&b1, &i1, true).unwrap().base_offset, 1);
        assert!(r.gate.retry_owed().is_empty(), "settled by the retry");
        assert_eq!(r.gate.append(&b2, &i2, true).unwrap().base_offset, 2);
        let (b9, i9) = idem(9);
        assert!(matches!(
            r.gate.append(&b9, &i9, true),
            Err(Refused::Sequence(SequenceError::OutOfOrder { .. }))
        ));
    }

    /// Catches: an owed producer masking a rewound sequence or a new epoch
    /// (errors of the client, not gaps of ours), an entry that never goes
    /// stale, or an unbounded table.
    #[test]
    fn retry_owed_masks_only_fresh_gaps_and_is_bounded() {
        let mut o = RetryOwed::default();
        let (_, i1) = idem(1);
        o.owe(&i1, 1_000);
        let gap = |found, last| SequenceError::OutOfOrder {
            producer_id: 7,
            epoch: 0,
            found,
            last,
        };
        assert!(o.masks(&gap(5, Some(3)), 1_000));
        assert!(!o.masks(&gap(2, Some(3)), 1_000), "rewound");
        assert!(
            !o.masks(&gap(5, None), 1_000),
            "a new epoch must start at 0"
        );
        assert!(
            !o.masks(&gap(5, Some(3)), 1_000 + RetryOwed::HOLD_MS),
            "stale"
        );
        for pid in 100..100 + RetryOwed::MAX as i64 * 2 {
            let b = crate::partition::tests::idem_batch(&["a"], pid, 0, 0);
            o.owe(&validate_batches(&b).unwrap(), 2_000);
        }
        assert_eq!(o.len(), RetryOwed::MAX);
    }

    #[test]
    fn waiters_are_released_in_offset_order_up_to_the_high_watermark() {
        let mut r = rig(LogConfig::default());
        let mut a = append(&mut r, 2); // offsets 0..=1
        let t = r.gate.begin_sync().unwrap(); // covers 0..=1 only
        assert!(r.gate.begin_sync().is_none(), "one fsync in flight");
        let mut b = append(&mut r, 3); // offsets 2..=4, after the fsync began
        let res = t.file.sync_data();
        r.gate.synced(t, res).unwrap();
        assert_eq!(a.try_recv().unwrap(), Ok(2));
        assert!(b.try_recv().is_err(), "not covered by that fsync");
        assert_eq!(*r.hw.borrow(), 2);
        fsync(&mut r).unwrap();
        assert_eq!(b.try_recv().unwrap(), Ok(5));
        assert_eq!(r.gate.pending(), 0);
    }

    /// Catches: a duplicate answered before its original is durable (the
    /// client would be told "stored" for bytes a crash can still lose), or
    /// answered with the duplicate's own offsets.
    #[test]
    fn a_duplicate_is_answered_with_the_original_offset_only_after_its_fsync() {
        let mut r = rig(LogConfig::default());
        let b = crate::partition::tests::idem_batch(&["a", "b"], 4, 0, 0);
        let infos = validate_batches(&b).unwrap();
        let (pb, pinfos) = batch(1);
        let mut plain = r.gate.append(&pb, &pinfos, true).unwrap().durable.unwrap(); // offset 0
        let orig = r.gate.append(&b, &infos, true).unwrap(); // offsets 1..=2
        assert_eq!(orig.base_offset, 1);
        let t = r.gate.begin_sync().unwrap(); // covers 0..=2
        let dup = r.gate.append(&b, &infos, true).unwrap();
        assert_eq!(dup.base_offset, 1, "the original's offset");
        let mut dup_rx = dup.durable.unwrap();
        assert!(
            dup_rx.try_recv().is_err(),
            "not before the original is durable"
        );
        let res = t.file.sync_data();
        r.gate.synced(t, res).unwrap();
        assert_eq!(plain.try_recv().unwrap(), Ok(3));
        assert_eq!(dup_rx.try_recv().unwrap(), Ok(3));
        // Once durable, a duplicate is answered at once and writes nothing.
        let ops = r.fs.ops();
        let mut again = r.gate.append(&b, &infos, true).unwrap();
        assert_eq!(again.base_offset, 1);
        assert_eq!(again.durable.as_mut().unwrap().try_recv().unwrap(), Ok(3));
        assert_eq!(r.fs.ops(), ops);
        assert!(r.gate.begin_sync().is_none(), "nothing was written");
        // A gap is refused, not halted.
        let gap = crate::partition::tests::idem_batch(&["c"], 4, 0, 5);
        let ginfos = validate_batches(&gap).unwrap();
        assert!(matches!(
            r.gate.append(&gap, &ginfos, true),
            Err(Refused::Sequence(SequenceError::OutOfOrder { .. }))
        ));
        assert!(r.gate.log().is_some());
    }

    /// Catches: a marker answered before its fsync (the coordinator would
    /// complete a transaction a crash can still reopen), answered after
    /// the lease lapsed, or an LSO that moves before the marker is durable.
    #[test]
    fn a_marker_is_answered_only_after_its_fsync_under_a_valid_lease() {
        let mut r = rig(LogConfig::default());
        let b = crate::partition::tests::txn_batch(&["t"], 9, 0, 0);
        let infos = validate_batches(&b).unwrap();
        r.gate.append(&b, &infos, true).unwrap();
        let t = r.gate.begin_sync().unwrap();
        let res = t.file.sync_data();
        r.gate.synced(t, res).unwrap();
        let lso = |g: &CommitGate| g.log().unwrap().last_stable_offset();
        assert_eq!(lso(&r.gate), 0, "held by the open transaction");
        let m = super::super::messages::WriteTxnMarker {
            producer_id: 9,
            producer_epoch: 0,
            coordinator_epoch: 1,
            commit: true,
        };
        let mut rx = r.gate.append_marker(&m).unwrap().durable.unwrap();
        assert!(rx.try_recv().is_err(), "not before the fsync");
        assert_eq!(lso(&r.gate), 0);
        let t = r.gate.begin_sync().unwrap();
        let res = t.file.sync_data();
        r.gate.synced(t, res).unwrap();
        assert_eq!(rx.try_recv().unwrap(), Ok(2));
        assert_eq!(lso(&r.gate), 2);
        // A stale epoch is refused without halting; the producers show it.
        let stale = super::super::messages::WriteTxnMarker {
            producer_epoch: -1,
            ..m.clone()
        };
        assert!(matches!(
            r.gate.append_marker(&stale),
            Err(Refused::Sequence(SequenceError::StaleEpoch { .. }))
        ));
        // A marker from an older coordinator epoch (a zombie coordinator
        // after its shard moved) is refused with 52, writing nothing.
        let zombie = super::super::messages::WriteTxnMarker {
            coordinator_epoch: 0,
            ..m.clone()
        };
        match r.gate.append_marker(&zombie) {
            Err(Refused::Sequence(e)) => assert!(matches!(
                super::sequence(e),
                PartitionError::CoordinatorFenced(_)
            )),
            other => panic!(
                "zombie marker not fenced: {:?}",
                other.map(|t| t.base_offset)
            ),
        }
        let p = r.gate.producers().unwrap();
        assert_eq!((p[0].producer_id, p[0].coordinator_epoch), (9, 1));
        assert_eq!(p[0].current_txn_start_offset, -1);
        // Written, then the lease lapses before the fsync: never answered.
        let mut rx = r.gate.append_marker(&m).unwrap().durable.unwrap();
        let t = r.gate.begin_sync().unwrap();
        r.clock.advance(LEASE * 2);
        let res = t.file.sync_data();
        assert_eq!(r.gate.synced(t, res), Err(Halt::Fenced));
        assert!(matches!(
            rx.try_recv(),
            Ok(Err(PartitionError::NotLeader(_)))
        ));
    }

    /// Catches: a duplicate whose original is lost with a failed fsync
    /// being answered as stored.
    #[test]
    fn a_failed_fsync_fails_the_duplicate_too() {
        let mut r = rig(LogConfig::default());
        let b = crate::partition::tests::idem_batch(&["a"], 4, 0, 0);
        let infos = validate_batches(&b).unwrap();
        let mut orig = r.gate.append(&b, &infos, true).unwrap().durable.unwrap();
        let mut dup = r.gate.append(&b, &infos, true).unwrap().durable.unwrap();
        let t = r.gate.begin_sync().unwrap();
        let res = Err(io::Error::other("injected"));
        assert!(matches!(r.gate.synced(t, res), Err(Halt::Failed(_))));
        assert!(matches!(
            orig.try_recv().unwrap(),
            Err(PartitionError::Storage(_))
        ));
        assert!(matches!(
            dup.try_recv().unwrap(),
            Err(PartitionError::Storage(_))
        ));
    }

    /// Catches: a leader whose lease is fine acknowledging records after
    /// the next epoch of its partition was claimed by a writer its own
    /// cluster does not know (a second cluster over the volume): the
    /// successor recovers our tail only as of its claim, so those
    /// acknowledgements would be lost. What an fsync before the claim
    /// covered is acknowledged; nothing after it is, and nothing more is
    /// written.
    #[test]
    fn a_successor_claim_stops_acknowledgements_at_the_next_fsync() {
        let mut r = rig(LogConfig::default());
        let pdir = r._dir.path().join("t").join("0");
        let mut a = append(&mut r, 1);
        fsync(&mut r).unwrap();
        assert_eq!(a.try_recv().unwrap(), Ok(1));
        let mut b = append(&mut r, 1);
        // Another cluster's broker claims epoch 2 (the rig leads epoch 1).
        let foreign = ClaimOwner {
            broker_id: 7,
            incarnation: 99,
        };
        assert_eq!(
            crate::partition::claim::claim(&RealFs, &pdir, 2, foreign).unwrap(),
            crate::partition::claim::Claimed::Ours
        );
        match fsync(&mut r) {
            Err(Halt::Superseded(s)) => {
                assert_eq!((s.epoch, s.owner), (2, Some(foreign)));
            }
            other => panic!("want Superseded, got {other:?}"),
        }
        assert!(matches!(
            b.try_recv().unwrap(),
            Err(PartitionError::NotLeader(_))
        ));
        assert_eq!(*r.hw.borrow(), 1, "the high watermark stopped at the claim");
        let ops = r.fs.ops();
        let (c, infos) = batch(1);
        assert!(r.gate.append(&c, &infos, true).is_err());
        assert_eq!(r.fs.ops(), ops, "nothing written after the claim was seen");
    }

    #[test]
    fn lease_expiry_releases_nothing() {
        let mut r = rig(LogConfig::default());
        let mut a = append(&mut r, 1);
        r.clock.advance(LEASE);
        let ops = r.fs.ops();
        let (b, infos) = batch(1);
        assert!(matches!(
            r.gate.append(&b, &infos, true),
            Err(Refused::Halted(Halt::Fenced))
        ));
        assert_eq!(r.fs.ops(), ops, "an append after the lease wrote nothing");
        assert!(matches!(
            a.try_recv().unwrap(),
            Err(PartitionError::NotLeader(_))
        ));
        assert!(r.gate.log().is_none());
        assert_eq!(*r.hw.borrow(), 0, "the high watermark never moved");
    }

    #[test]
    fn an_fsync_that_returns_after_the_lease_lapsed_releases_nothing() {
        let mut r = rig(LogConfig::default());
        let mut a = append(&mut r, 1);
        let mut b = append(&mut r, 1);
        let t = r.gate.begin_sync().unwrap();
        let res = t.file.sync_data();
        // The fsync stalled past the end of the lease.
        r.clock.advance(LEASE + Duration::from_millis(1));
        assert_eq!(r.gate.synced(t, res), Err(Halt::Fenced));
        for rx in [&mut a, &mut b] {
            assert!(matches!(
                rx.try_recv().unwrap(),
                Err(PartitionError::NotLeader(_))
            ));
        }
        assert_eq!(*r.hw.borrow(), 0, "nothing became visible either");
    }

    #[test]
    fn a_tick_after_the_lease_lapsed_writes_nothing() {
        // segment.ms elapsed and the lease lapsed while the leader was paused
        // (SIGSTOP): on waking, the time-based roll would write index files
        // and a manifest into a partition another leader may own now.
        let cfg = LogConfig {
            segment_ms: 1000,
            ..LogConfig::default()
        };
        let mut r = rig(cfg);
        let _rx = append(&mut r, 1);
        fsync(&mut r).unwrap();
        r.clock.advance(LEASE * 2);
        assert!(r.gate.log().unwrap().roll_due(r.clock.now_ms()));
        let ops = r.fs.ops();
        assert_eq!(r.gate.tick(), Err(Halt::Fenced));
        assert_eq!(r.fs.ops(), ops, "no write after the lease is gone");
        assert_eq!(r.gate.enforce_retention(), Err(Halt::Fenced));
        assert_eq!(r.gate.stop(), Err(Halt::Fenced));
        assert_eq!(r.fs.ops(), ops);
    }

    #[test]
    fn a_tick_under_a_valid_lease_rolls_a_due_segment() {
        let cfg = LogConfig {
            segment_ms: 1000,
            ..LogConfig::default()
        };
        let mut r = rig(cfg);
        let _rx = append(&mut r, 1);
        fsync(&mut r).unwrap();
        r.clock.advance(Duration::from_millis(1500));
        let ops = r.fs.ops();
        r.gate.tick().unwrap();
        assert!(r.fs.ops() > ops, "the roll wrote");
        assert!(!r.gate.log().unwrap().roll_due(r.clock.now_ms()));
    }

    #[test]
    fn stop_releases_what_the_final_sync_covered() {
        let mut r = rig(LogConfig::default());
        let mut a = append(&mut r, 2);
        r.gate.stop().unwrap();
        assert_eq!(a.try_recv().unwrap(), Ok(2));
        assert!(r.gate.log().is_none());
        assert_eq!(*r.hw.borrow(), 2);
    }

    #[test]
    fn a_failed_fsync_fails_the_waiters_and_remembers_the_durable_point() {
        let mut r = rig(LogConfig::default());
        let mut a = append(&mut r, 1);
        let t = r.gate.begin_sync().unwrap();
        let err = r.gate.synced(t, Err(io::Error::other("eio")));
        assert!(matches!(err, Err(Halt::Failed(PartitionError::Storage(_)))));
        assert!(matches!(
            a.try_recv().unwrap(),
            Err(PartitionError::Storage(_))
        ));
        assert!(r.gate.failed_at().is_some());
    }

    /// The capability, not the gate: a log driven directly (as a forgotten
    /// path would) after the lease lapsed writes nothing — roll, checkpoint,
    /// retention, append, fsync and close are all refused before they reach
    /// the volume, and the refusal is a fence, not a storage failure.
    #[test]
    fn the_epoch_writer_refuses_every_write_after_the_lease_lapsed() {
        let cfg = LogConfig {
            segment_ms: 1000,
            retention_ms: 1,
            ..LogConfig::default()
        };
        let r = rig(cfg);
        let Rig {
            clock,
            fs,
            mut gate,
            _dir,
            ..
        } = r;
        let (b, infos) = batch(1);
        gate.append(&b, &infos, false).unwrap();
        let t = gate.begin_sync().unwrap();
        let res = t.file.sync_data();
        gate.synced(t, res).unwrap();
        clock.advance(Duration::from_millis(1500));
        gate.tick().unwrap(); // rolled: one sealed segment for retention
        gate.append(&b, &infos, false).unwrap();
        let t = gate.begin_sync().unwrap();
        let active = t.file.clone();
        let res = t.file.sync_data();
        gate.synced(t, res).unwrap();
        let mut log = gate.log.take().unwrap();
        clock.advance(LEASE * 2);
        let now = clock.now_ms();
        assert!(log.roll_due(now));
        let ops = fs.ops();
        let fenced = |r: Result<(), LogError>, what: &str| {
            let e = r.expect_err(what);
            assert!(refused(&e), "{what}: {e}");
            assert!(matches!(storage(e), PartitionError::NotLeader(_)), "{what}");
        };
        fenced(log.roll(now), "roll");
        fenced(log.checkpoint(), "checkpoint");
        fenced(log.enforce_retention(now).map(|_| ()), "retention");
        fenced(log.append(&b, &infos).map(|_| ()), "append");
        fenced(active.sync_data().map_err(LogError::Io), "fsync");
        fenced(log.close(), "close");
        assert_eq!(
            fs.ops(),
            ops,
            "writes after the lease: {:?}",
            &fs.log()[ops as usize..]
        );
    }

    /// A write refused mid-path (the lease lapsed between the gate's check
    /// and the write) fences the gate: NOT_LEADER to the waiters, no restart.
    #[test]
    fn a_refused_fsync_fences_rather_than_fails() {
        let mut r = rig(LogConfig::default());
        let mut a = append(&mut r, 1);
        let t = r.gate.begin_sync().unwrap();
        r.clock.advance(LEASE * 2);
        let ops = r.fs.ops();
        let res = t.file.sync_data();
        assert!(res.as_ref().is_err_and(is_fenced));
        assert_eq!(r.gate.synced(t, res), Err(Halt::Fenced));
        assert_eq!(r.fs.ops(), ops);
        assert!(matches!(
            a.try_recv().unwrap(),
            Err(PartitionError::NotLeader(_))
        ));
        assert!(r.gate.failed_at().is_none(), "not a poisoned fsync");
    }
}
