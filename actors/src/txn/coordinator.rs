//! `TxnCoordinator`: the actor that owns one coordinator shard's
//! transaction state files — one per shard granted to this broker, next to
//! the shard's `GroupCoordinator`, started and stopped by the same grant.
//!
//! It is the thin actix adapter around a [`TxnLog`] (the shard's
//! `txns/<shard>/` files, a `ShardLog` with the transaction codec) and
//! [`TxnMachine`] (the transitions):
//!
//! * **Lazy open**: most shards never see a transaction, and an open shard
//!   holds a descriptor (its log) for as long as it is granted. So the
//!   start only lists the shard directory: a shard with no state file stays
//!   *idle* — no claim, no file — and answers DescribeTransactions /
//!   ListTransactions from the empty state it provably has (only the
//!   grant's owner writes there); the first request that changes state
//!   opens it (COORDINATOR_LOAD_IN_PROGRESS meanwhile; clients retry). A
//!   shard with files is opened at once, so its decisions are re-driven.
//! * **Open** on the blocking pool: win the epoch claim
//!   (`txns/<shard>/leader-e<E>.claim`, O_EXCL) through the lease-guarded
//!   seam, then open the log under that writer (fenced by the epoch in the
//!   file names, compacted to live state). Requests meanwhile get
//!   COORDINATOR_LOAD_IN_PROGRESS; a claim of another owner or a newer
//!   epoch fences us (NOT_COORDINATOR). Every transaction found in
//!   `Prepare*` has its markers re-sent and is then completed: a decision
//!   taken by a previous owner is always finished.
//! * **Requests** run the state machine on the view (durable state plus
//!   what was appended since); the record it returns is appended and the
//!   answer waits for the fsync that covers it (group commit, one fsync on
//!   the blocking pool for everything appended meanwhile), and for a valid
//!   broker lease. A record nothing waits for (a completion) is not synced
//!   on its own: the next fsync covers it (see `append`).
//! * **Markers**: once a `Prepare*` record is durable, the markers go out
//!   through the [`MarkerSink`] the broker gave (WriteTxnMarkers to each
//!   partition's leader, the group offsets to their shard's owner), re-sent
//!   with back-off until every partition acknowledged, then `Complete*` is
//!   appended. Only then may the producer start its next transaction (it
//!   gets CONCURRENT_TRANSACTIONS meanwhile).
//! * **Timers**: once a second, transactions open past their timeout are
//!   aborted with an epoch bump; every minute, ids idle past
//!   `transactional.id.expiration.ms` are tombstoned.
//! * **Failure**: a failed write or fsync poisons the log; waiting answers
//!   get COORDINATOR_NOT_AVAILABLE and the shard is reopened after a pause.

use super::messages::*;
use super::state::{txn_shard_dir, InitOutcome, TxnLog, TxnMachine, TxnMeta, TxnRecord, TxnState};
use crate::clock::SharedClock;
use crate::cluster::lease::{Lease, LeaseGuard};
use crate::group::log::{ShardLogConfig, ShardLogError, Ticket};
use crate::group::shard::ShardId;
use crate::partition::claim::{self, ClaimOwner, EpochWriter};
use crate::partition::leader::OnFenced;
use crate::telemetry::{self, ActorStats, Mailbox};
use actix::prelude::*;
use futures::future::BoxFuture;
use kaas_protocol::kafka_protocol::ResponseError;
use kaas_volume::fs::{GuardedFs, SharedFs, WriteGuard};
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

const KIND: &str = "txn_coordinator";

/// How long a failed shard waits before it is reopened.
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// How often transaction timeouts are checked.
const TIMEOUT_EVERY: Duration = Duration::from_millis(500);

/// The longest a record nothing waits for stays unsynced (see
/// [`TxnCoordinator::append`]).
const LAZY_SYNC_WITHIN: Duration = TIMEOUT_EVERY;

/// How often idle transactional ids are looked for.
const EXPIRY_EVERY: Duration = Duration::from_secs(60);

/// One transaction's markers to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerJob {
    /// The transactional id.
    pub transactional_id: String,
    /// Producer id.
    pub producer_id: i64,
    /// The epoch the decision was taken at (markers carry it).
    pub producer_epoch: i16,
    /// Commit (true) or abort.
    pub commit: bool,
    /// This coordinator's epoch (the shard grant's).
    pub coordinator_epoch: i32,
    /// The partitions still to acknowledge (the group offsets as
    /// `__consumer_offsets`/shard).
    pub partitions: Vec<(String, i32)>,
}

/// One round of a job's markers: resolves to the partitions left.
pub type SendMarkers = dyn Fn(MarkerJob) -> BoxFuture<'static, Vec<(String, i32)>> + Send + Sync;

/// Sends one round of a job's markers; resolves to the partitions that are
/// not acknowledged yet (empty: done). Must be idempotent.
#[derive(Clone)]
pub struct MarkerSink(pub Arc<SendMarkers>);

impl std::fmt::Debug for MarkerSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MarkerSink")
    }
}

/// Static description of one transaction shard to own.
#[derive(Debug, Clone)]
pub struct TxnCoordinatorSpec {
    /// The shard.
    pub shard: ShardId,
    /// The cluster directory (the shard lives in `txns/<shard>/`).
    pub cluster_dir: PathBuf,
    /// The grant's epoch, which every file we write carries.
    pub epoch: i32,
    /// The broker lease and the incarnation the grant is for.
    pub lease: Option<(Arc<Lease>, u64)>,
    /// Who claims the epoch (`None`: no claim file, tests).
    pub owner: Option<ClaimOwner>,
    /// Called when the open finds the epoch claimed or a newer one on disk.
    pub on_fenced: Option<OnFenced>,
    /// Compaction thresholds.
    pub log: ShardLogConfig,
    /// `transactional.id.expiration.ms`.
    pub expiration_ms: i64,
    /// Where markers go.
    pub markers: MarkerSink,
}

/// Everything a connection needs to talk to one transaction shard.
#[derive(Clone)]
pub struct TxnCoordinatorHandle {
    /// The coordinator's mailbox, instrumented.
    pub addr: Mailbox<TxnCoordinator>,
}

struct Serving {
    log: TxnLog,
    /// The durable state plus every record appended since (what the state
    /// machine decides on; answers still wait for durability).
    view: TxnState,
    _writer: EpochWriter,
}

enum Phase {
    /// Listing the shard directory to decide whether to open now.
    Probing,
    /// No state on disk and nothing asked to change it: nothing open.
    Idle,
    Opening,
    Serving(Box<Serving>),
    Fenced,
    Failed,
    Stopped,
}

type Deliver = Box<dyn FnOnce(CoordReply<()>)>;

#[derive(Debug)]
enum OpenError {
    Claimed(Option<ClaimOwner>),
    Log(ShardLogError),
}

impl From<ShardLogError> for OpenError {
    fn from(e: ShardLogError) -> Self {
        OpenError::Log(e)
    }
}

impl From<std::io::Error> for OpenError {
    fn from(e: std::io::Error) -> Self {
        OpenError::Log(e.into())
    }
}

struct Opened(Result<(EpochWriter, TxnLog), OpenError>);

/// Whether the shard directory holds a state file.
struct Probed(std::io::Result<bool>);
impl Message for Probed {
    type Result = ();
}
impl Message for Opened {
    type Result = ();
}

/// How long an AddPartitionsToTxn may wait for its id's previous
/// transaction to complete (its markers to be acknowledged) before it is
/// answered CONCURRENT_TRANSACTIONS. The client's answer to that error is
/// a retry after its back-off (librdkafka: ~20 ms and up), which made the
/// p99 of back-to-back transactions ~10x their p50 (BENCHMARKS.md); the
/// markers of a transaction usually take a few milliseconds, so waiting
/// for them here turns the back-off into that wait. Bounded, so a
/// partition whose marker cannot be written does not hold requests for
/// longer than the client would wait between its own retries anyway.
pub const PARK_ADDS_FOR: Duration = Duration::from_millis(500);

/// Where a parked add's answer goes.
type AddReply = oneshot::Sender<CoordReply<Result<(), ResponseError>>>;

/// Every marker of (id, epoch) was acknowledged.
struct MarkersWritten {
    transactional_id: String,
    producer_epoch: i16,
}
impl Message for MarkersWritten {
    type Result = ();
}

/// See module docs.
pub struct TxnCoordinator {
    spec: TxnCoordinatorSpec,
    fs: SharedFs,
    clock: SharedClock,
    stats: Arc<ActorStats>,
    phase: Phase,
    syncing: bool,
    last_ticket: Ticket,
    waiting: VecDeque<(Ticket, Deliver)>,
    /// Decisions appended, whose markers go out once durable.
    to_drive: VecDeque<(Ticket, TxnMeta)>,
    /// (id, epoch) whose markers are being sent.
    driving: HashSet<(String, i16)>,
    /// AddPartitionsToTxn / AddOffsetsToTxn that came while their id's
    /// previous transaction was being completed, by id: retried as soon
    /// as it completes (see [`PARK_ADDS_FOR`]).
    parked_adds: HashMap<String, Vec<(AddTxnPartitions, AddReply)>>,
    /// The ticket of each id's last state record appended by this owner:
    /// a verification (KIP-890) answers at once when it is durable, and
    /// otherwise waits for the fsync like every answer.
    written: HashMap<String, Ticket>,
    stop_waiters: Vec<oneshot::Sender<()>>,
    stopping: bool,
    /// A state-changing request came while probing: open when done.
    open_wanted: bool,
}

fn open_shard(
    fs: SharedFs,
    guard: Option<Arc<dyn WriteGuard>>,
    spec: &TxnCoordinatorSpec,
) -> Result<(EpochWriter, TxnLog), OpenError> {
    let dir = txn_shard_dir(&spec.cluster_dir, spec.shard);
    let guarded = match &guard {
        Some(g) => GuardedFs::shared(fs.clone(), g.clone()),
        None => fs.clone(),
    };
    guarded.create_dir_all(&dir)?;
    let writer = match claim::win(&fs, guard, &dir, spec.epoch, spec.owner)? {
        Ok(w) => w,
        Err(by) => return Err(OpenError::Claimed(by)),
    };
    let log = TxnLog::open(
        writer.shared(),
        &spec.cluster_dir,
        spec.shard,
        spec.epoch,
        spec.log,
    )?;
    Ok((writer, log))
}

impl TxnCoordinator {
    /// Start a coordinator of `spec` on `arbiter`.
    pub fn start(
        spec: TxnCoordinatorSpec,
        fs: SharedFs,
        clock: SharedClock,
        arbiter: &actix::ArbiterHandle,
    ) -> TxnCoordinatorHandle {
        let stats = ActorStats::register(
            KIND,
            format!("txn-shard-{}", spec.shard),
            txn_shard_dir(&spec.cluster_dir, spec.shard)
                .display()
                .to_string(),
        );
        stats.set_epoch(spec.epoch as i64);
        let mine = stats.clone();
        let addr = TxnCoordinator::start_in_arbiter(arbiter, move |_| TxnCoordinator {
            spec,
            fs,
            clock,
            stats: mine,
            phase: Phase::Probing,
            syncing: false,
            last_ticket: Ticket(0),
            waiting: VecDeque::new(),
            to_drive: VecDeque::new(),
            driving: HashSet::new(),
            parked_adds: HashMap::new(),
            written: HashMap::new(),
            stop_waiters: Vec::new(),
            stopping: false,
            open_wanted: false,
        });
        TxnCoordinatorHandle {
            addr: Mailbox::new(addr, stats),
        }
    }

    fn lease_ok(&self) -> bool {
        self.spec
            .lease
            .as_ref()
            .is_none_or(|(l, inc)| l.valid_for(*inc))
    }

    /// List the shard directory (read only) to decide whether to open.
    fn probe(&mut self, ctx: &mut Context<Self>) {
        let dir = txn_shard_dir(&self.spec.cluster_dir, self.spec.shard);
        let (fs, addr) = (self.fs.clone(), ctx.address());
        actix_rt::task::spawn_blocking(move || {
            let r = match fs.list(&dir) {
                Ok(names) => Ok(names
                    .iter()
                    .any(|n| kaas_volume::layout::parse_shard_log(n).is_some())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(e),
            };
            addr.do_send(Probed(r));
        });
    }

    /// A state-changing request: open an idle shard. `Some(error)` when
    /// the request cannot be served now.
    fn wake(&mut self, ctx: &mut Context<Self>) -> Option<CoordinatorError> {
        match self.phase {
            Phase::Idle if !self.stopping => {
                self.open(ctx);
                Some(CoordinatorError::Loading)
            }
            Phase::Probing => {
                self.open_wanted = true;
                Some(CoordinatorError::Loading)
            }
            _ => None,
        }
    }

    fn open(&mut self, ctx: &mut Context<Self>) {
        if self.stopping {
            return;
        }
        if !self.lease_ok() {
            self.fence("broker lease lapsed");
            return;
        }
        self.phase = Phase::Opening;
        let guard = self
            .spec
            .lease
            .clone()
            .map(|(lease, inc)| Arc::new(LeaseGuard::new(lease, inc)) as Arc<dyn WriteGuard>);
        let (fs, spec, addr) = (self.fs.clone(), self.spec.clone(), ctx.address());
        actix_rt::task::spawn_blocking(move || {
            addr.do_send(Opened(open_shard(fs, guard, &spec)));
        });
    }

    fn fence(&mut self, why: &str) {
        tracing::warn!(
            shard = self.spec.shard.0,
            epoch = self.spec.epoch,
            why,
            "transaction coordinator fenced"
        );
        self.stats.set_error(Some(why.to_owned()));
        self.phase = Phase::Fenced;
        self.fail_waiting(CoordinatorError::NotCoordinator);
    }

    fn fail_waiting(&mut self, e: CoordinatorError) {
        for (_, d) in self.waiting.drain(..) {
            d(Err(e));
        }
        for (_, tx) in self.parked_adds.drain().flat_map(|(_, v)| v) {
            let _ = tx.send(Err(e));
        }
        self.to_drive.clear();
    }

    fn failed(&mut self, err: &dyn std::fmt::Display, ctx: &mut Context<Self>) {
        tracing::error!(shard = self.spec.shard.0, epoch = self.spec.epoch, error = %err, "transaction shard failed; reopening");
        self.stats.set_error(Some(err.to_string()));
        self.stats.restarted();
        self.phase = Phase::Failed;
        self.fail_waiting(CoordinatorError::Unavailable);
        ctx.run_later(REOPEN_AFTER, |act, ctx| {
            if matches!(act.phase, Phase::Failed) {
                act.open(ctx);
            }
        });
    }

    fn serving(&mut self) -> Result<&mut Serving, CoordinatorError> {
        if self.stopping {
            return Err(CoordinatorError::NotCoordinator);
        }
        match &mut self.phase {
            Phase::Serving(s) => Ok(s),
            Phase::Opening | Phase::Probing | Phase::Idle => Err(CoordinatorError::Loading),
            Phase::Failed => Err(CoordinatorError::Unavailable),
            Phase::Fenced | Phase::Stopped => Err(CoordinatorError::NotCoordinator),
        }
    }

    /// Append `records` and fold them into the view; the ticket every
    /// answer computed so far must wait for.
    ///
    /// The fsync is started by what waits for it — an answer
    /// ([`Self::after`]) or a decision whose markers follow
    /// ([`Self::persist`]) — and covers everything appended by then (group
    /// commit). A record nothing waits for (a completion, a tombstone)
    /// rides on the next fsync, at the latest [`LAZY_SYNC_WITHIN`] later;
    /// losing it in a crash loses nothing acknowledged: the successor
    /// re-drives the decision before it (idempotent markers), and no later
    /// record can be durable without it.
    fn append(&mut self, records: &[TxnRecord], ctx: &mut Context<Self>) -> Option<Ticket> {
        if records.is_empty() {
            return Some(self.last_ticket);
        }
        let Phase::Serving(s) = &mut self.phase else {
            return None;
        };
        match s.log.append(records) {
            Ok(t) => {
                for r in records {
                    s.view.apply(r);
                }
                self.last_ticket = t;
                Some(t)
            }
            Err(e) => {
                self.failed(&e, ctx);
                None
            }
        }
    }

    /// Append one new state; markers follow once it is durable if it is a
    /// decision.
    fn persist(&mut self, m: TxnMeta, ctx: &mut Context<Self>) -> Option<Ticket> {
        let preparing = m.status.preparing();
        let t = self.append(&[TxnRecord::Txn(m.clone())], ctx)?;
        self.written.insert(m.transactional_id.clone(), t);
        if self.written.len() > 4096 {
            // Only tickets not yet durable matter; the rest go.
            if let Phase::Serving(s) = &self.phase {
                let durable = s.log.durable();
                self.written.retain(|_, t| *t > durable);
            }
        }
        if preparing {
            self.to_drive.push_back((t, m));
            self.kick_sync(ctx);
        }
        Some(t)
    }

    fn after(&mut self, ticket: Ticket, d: Deliver, ctx: &mut Context<Self>) {
        self.waiting.push_back((ticket, d));
        self.deliver(ctx);
        self.kick_sync(ctx);
    }

    fn deliver(&mut self, ctx: &mut Context<Self>) {
        let durable = match &self.phase {
            Phase::Serving(s) => s.log.durable(),
            _ => return,
        };
        let due = self.waiting.front().is_some_and(|(t, _)| *t <= durable)
            || self.to_drive.front().is_some_and(|(t, _)| *t <= durable);
        if !due {
            return;
        }
        if !self.lease_ok() {
            self.fence("broker lease lapsed");
            return;
        }
        while self.waiting.front().is_some_and(|(t, _)| *t <= durable) {
            if let Some((_, d)) = self.waiting.pop_front() {
                d(Ok(()));
            }
        }
        while self.to_drive.front().is_some_and(|(t, _)| *t <= durable) {
            if let Some((_, m)) = self.to_drive.pop_front() {
                self.drive(m, ctx);
            }
        }
    }

    /// Send a durable decision's markers until all are acknowledged, then
    /// complete it.
    fn drive(&mut self, m: TxnMeta, ctx: &mut Context<Self>) {
        let key = (m.transactional_id.clone(), m.producer_epoch);
        if !self.driving.insert(key.clone()) {
            return;
        }
        let job = MarkerJob {
            transactional_id: m.transactional_id.clone(),
            producer_id: m.producer_id,
            producer_epoch: m.producer_epoch,
            commit: m.status == super::state::TxnStatus::PrepareCommit,
            coordinator_epoch: self.spec.epoch,
            partitions: m.partitions.iter().cloned().collect(),
        };
        tracing::debug!(
            shard = self.spec.shard.0,
            transactional_id = %job.transactional_id,
            producer_id = job.producer_id,
            producer_epoch = job.producer_epoch,
            commit = job.commit,
            partitions = job.partitions.len(),
            "writing transaction markers"
        );
        let sink = self.spec.markers.clone();
        let fut = async move {
            let mut job = job;
            let mut backoff = Duration::from_millis(20);
            let mut rounds = 0u32;
            while !job.partitions.is_empty() {
                let left = (sink.0)(job.clone()).await;
                if left.is_empty() {
                    break;
                }
                rounds += 1;
                if rounds.is_multiple_of(50) {
                    tracing::warn!(
                        transactional_id = %job.transactional_id,
                        left = left.len(),
                        rounds,
                        "transaction markers not yet acknowledged; re-sending"
                    );
                }
                job.partitions = left;
                actix_rt::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            MarkersWritten {
                transactional_id: job.transactional_id,
                producer_epoch: job.producer_epoch,
            }
        };
        ctx.spawn(fut.into_actor(self).map(|done, act, ctx| {
            act.driving
                .remove(&(done.transactional_id.clone(), done.producer_epoch));
            act.markers_written(done, ctx);
        }));
    }

    /// The markers are acknowledged: append `Complete*` and retry the adds
    /// that waited for it. Nothing waits for the completion itself (see
    /// [`Self::append`]): it is made durable by the fsync of the next
    /// transaction's AddPartitionsToTxn — one fsync in that add's path,
    /// not the completion's and then its own.
    fn markers_written(&mut self, m: MarkersWritten, ctx: &mut Context<Self>) {
        let now = self.clock.now_ms();
        let Phase::Serving(s) = &self.phase else {
            return;
        };
        let next = TxnMachine::markers_written(&s.view, &m.transactional_id, m.producer_epoch, now);
        if let Some(next) = next {
            tracing::debug!(
                shard = self.spec.shard.0,
                transactional_id = %m.transactional_id,
                status = next.status.name(),
                "transaction completed"
            );
            self.persist(next, ctx);
        }
        self.unpark_adds(&m.transactional_id, ctx);
    }

    /// Whether an answer or a decision waits for a record not yet durable.
    fn sync_waited(&self) -> bool {
        let Phase::Serving(s) = &self.phase else {
            return false;
        };
        let durable = s.log.durable();
        self.waiting.back().is_some_and(|(t, _)| *t > durable)
            || self.to_drive.back().is_some_and(|(t, _)| *t > durable)
    }

    /// Start an fsync of everything appended, unless one is running (its
    /// completion starts the next if [`Self::sync_waited`]).
    fn kick_sync(&mut self, ctx: &mut Context<Self>) {
        if self.syncing {
            return;
        }
        let Phase::Serving(s) = &self.phase else {
            return;
        };
        let Some(t) = s.log.sync_target() else {
            return;
        };
        self.syncing = true;
        let job = actix_rt::task::spawn_blocking(move || {
            let r = t.sync();
            (t, r)
        });
        ctx.spawn(job.into_actor(self).map(|res, act, ctx| {
            act.syncing = false;
            let Phase::Serving(s) = &mut act.phase else {
                return;
            };
            match res {
                Ok((t, Ok(()))) => {
                    telemetry::global().fsyncs.fetch_add(1, Ordering::Relaxed);
                    s.log.complete_sync(t);
                    if s.log.compaction_due() {
                        if let Err(e) = s.log.compact() {
                            act.failed(&e, ctx);
                            return;
                        }
                    }
                    act.deliver(ctx);
                    // What was appended meanwhile: at once if waited for.
                    if act.sync_waited() {
                        act.kick_sync(ctx);
                    }
                }
                Ok((_, Err(e))) => {
                    s.log.sync_failed();
                    act.failed(&e, ctx);
                }
                Err(e) => {
                    s.log.sync_failed();
                    act.failed(&e, ctx);
                }
            }
        }));
    }

    fn check_timeouts(&mut self, ctx: &mut Context<Self>) {
        let now = self.clock.now_ms();
        let Phase::Serving(s) = &self.phase else {
            return;
        };
        for m in TxnMachine::timed_out(&s.view, now) {
            tracing::info!(
                shard = self.spec.shard.0,
                transactional_id = %m.transactional_id,
                producer_id = m.producer_id,
                producer_epoch = m.producer_epoch,
                "transaction timed out; aborting"
            );
            if self.persist(m, ctx).is_none() {
                return;
            }
        }
    }

    fn expire(&mut self, ctx: &mut Context<Self>) {
        let now = self.clock.now_ms();
        let Phase::Serving(s) = &self.phase else {
            return;
        };
        let records = TxnMachine::expired(&s.view, now, self.spec.expiration_ms);
        if !records.is_empty() {
            tracing::info!(
                shard = self.spec.shard.0,
                ids = records.len(),
                "expiring idle transactional ids"
            );
            self.append(&records, ctx);
        }
    }

    fn opened(&mut self, res: Result<(EpochWriter, TxnLog), OpenError>, ctx: &mut Context<Self>) {
        if self.stopping {
            drop(res);
            self.phase = Phase::Stopped;
            for tx in self.stop_waiters.drain(..) {
                let _ = tx.send(());
            }
            self.stats.deregister();
            ctx.stop();
            return;
        }
        match res {
            Ok((writer, log)) => {
                let view = log.state().clone();
                let preparing: Vec<TxnMeta> = view
                    .txns
                    .values()
                    .filter(|m| m.status.preparing())
                    .cloned()
                    .collect();
                // An empty shard (most of them, at every start) at DEBUG.
                if view.txns.is_empty() {
                    tracing::debug!(
                        shard = self.spec.shard.0,
                        epoch = self.spec.epoch,
                        "transaction coordinator loaded, empty"
                    );
                } else {
                    tracing::info!(
                        shard = self.spec.shard.0,
                        epoch = self.spec.epoch,
                        txns = view.txns.len(),
                        preparing = preparing.len(),
                        "transaction coordinator loaded"
                    );
                }
                self.last_ticket = log.durable();
                self.phase = Phase::Serving(Box::new(Serving {
                    log,
                    view,
                    _writer: writer,
                }));
                self.stats.set_error(None);
                // Decisions a previous owner took are finished here.
                for m in preparing {
                    self.drive(m, ctx);
                }
            }
            Err(OpenError::Claimed(owner)) => {
                if let Some(f) = &self.spec.on_fenced {
                    (f.0)(self.spec.epoch, owner);
                }
                self.fence("epoch claimed by another coordinator");
            }
            Err(OpenError::Log(ShardLogError::Fenced { found, .. })) => {
                if let Some(f) = &self.spec.on_fenced {
                    (f.0)(found, None);
                }
                self.fence("a newer epoch owns this shard");
            }
            Err(OpenError::Log(e)) => self.failed(&e, ctx),
        }
    }

    /// Persist `m` (if any) and answer `ok` once durable.
    fn answer<T: Send + 'static>(
        &mut self,
        m: Option<TxnMeta>,
        ok: T,
        ctx: &mut Context<Self>,
    ) -> ResponseFuture<CoordReply<T>> {
        let ticket = match m {
            Some(m) => self.persist(m, ctx),
            None => Some(self.last_ticket),
        };
        let Some(ticket) = ticket else {
            return ready(Err(CoordinatorError::Unavailable));
        };
        let (tx, rx) = oneshot::channel();
        self.after(
            ticket,
            Box::new(move |r| {
                let _ = tx.send(r.map(|_| ok));
            }),
            ctx,
        );
        Box::pin(async move { rx.await.unwrap_or(Err(CoordinatorError::Unavailable)) })
    }
}

fn ready<T: 'static>(r: CoordReply<T>) -> ResponseFuture<CoordReply<T>> {
    Box::pin(async move { r })
}

impl Actor for TxnCoordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(1024);
        ctx.run_interval(TIMEOUT_EVERY, |act, ctx| act.check_timeouts(ctx));
        ctx.run_interval(LAZY_SYNC_WITHIN, |act, ctx| act.kick_sync(ctx));
        // A short expiration (tests) is checked often enough to matter.
        let quarter = u64::try_from(self.spec.expiration_ms / 4).unwrap_or(0);
        let every = EXPIRY_EVERY.min(Duration::from_millis(quarter.max(100)));
        ctx.run_interval(every, |act, ctx| act.expire(ctx));
        self.probe(ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.stats.deregister();
    }
}

impl Handler<Opened> for TxnCoordinator {
    type Result = ();
    fn handle(&mut self, m: Opened, ctx: &mut Context<Self>) {
        self.opened(m.0, ctx);
    }
}

impl Handler<Probed> for TxnCoordinator {
    type Result = ();
    fn handle(&mut self, m: Probed, ctx: &mut Context<Self>) {
        if self.stopping {
            self.phase = Phase::Stopped;
            for tx in self.stop_waiters.drain(..) {
                let _ = tx.send(());
            }
            self.stats.deregister();
            ctx.stop();
            return;
        }
        match m.0 {
            Ok(false) if !self.open_wanted => {
                tracing::debug!(shard = self.spec.shard.0, "transaction shard idle");
                self.phase = Phase::Idle;
            }
            Ok(_) => self.open(ctx),
            Err(e) => self.failed(&e, ctx),
        }
    }
}

impl Handler<InitTxnProducer> for TxnCoordinator {
    type Result = ResponseFuture<CoordReply<Result<InitAnswer, ResponseError>>>;
    fn handle(&mut self, m: InitTxnProducer, ctx: &mut Context<Self>) -> Self::Result {
        let now = self.clock.now_ms();
        // A refusal that needs no state is answered without opening.
        if let Err(e) = TxnMachine::check_timeout(m.timeout_ms) {
            return ready(Ok(Err(e)));
        }
        if let Some(e) = self.wake(ctx) {
            return ready(Err(e));
        }
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        let out = TxnMachine::init(
            &s.view,
            &m.transactional_id,
            m.timeout_ms,
            m.given,
            m.fresh,
            now,
        );
        match out {
            Err(e) => ready(Ok(Err(e))),
            Ok(InitOutcome::NeedProducerId) => ready(Ok(Ok(InitAnswer::NeedProducerId))),
            Ok(InitOutcome::Ready { record }) => {
                let ok = InitAnswer::Ready(record.producer_id, record.producer_epoch);
                // A retry that changes nothing writes nothing.
                let unchanged = s.view.txns.get(&m.transactional_id) == Some(&record);
                let rec = (!unchanged).then_some(record);
                self.answer(rec, Ok(ok), ctx)
            }
            Ok(InitOutcome::AbortFirst { record }) => {
                tracing::info!(
                    shard = self.spec.shard.0,
                    transactional_id = %m.transactional_id,
                    "re-init during an open transaction: aborting it first"
                );
                self.answer(
                    Some(record),
                    Err(ResponseError::ConcurrentTransactions),
                    ctx,
                )
            }
        }
    }
}

impl TxnCoordinator {
    /// AddPartitionsToTxn against the view: `Err(m)` back when it has to
    /// wait for the id's previous transaction to complete (its decision
    /// is being carried out by this coordinator now).
    fn add(
        &mut self,
        m: AddTxnPartitions,
        ctx: &mut Context<Self>,
    ) -> Result<ResponseFuture<CoordReply<Result<(), ResponseError>>>, AddTxnPartitions> {
        let now = self.clock.now_ms();
        if matches!(self.phase, Phase::Idle) {
            // Nothing on disk: no producer id is mapped here.
            return Ok(ready(Ok(Err(ResponseError::InvalidProducerIdMapping))));
        }
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return Ok(ready(Err(e))),
        };
        match TxnMachine::add_partitions(
            &s.view,
            &m.transactional_id,
            m.producer_id,
            m.producer_epoch,
            &m.partitions,
            now,
        ) {
            Err(ResponseError::ConcurrentTransactions)
                if s.view.txns.get(&m.transactional_id).is_some_and(|t| {
                    t.status.preparing()
                        && t.producer_id == m.producer_id
                        && t.producer_epoch == m.producer_epoch
                }) =>
            {
                Err(m)
            }
            Err(e) => Ok(ready(Ok(Err(e)))),
            Ok(rec) => Ok(self.answer(rec, Ok(()), ctx)),
        }
    }

    /// The transaction of `id` completed: retry the adds that waited for
    /// it, in arrival order (each answered once its own record is
    /// durable). One whose caller gave up is dropped unapplied.
    fn unpark_adds(&mut self, id: &str, ctx: &mut Context<Self>) {
        let Some(parked) = self.parked_adds.remove(id) else {
            return;
        };
        for (m, tx) in parked {
            if tx.is_closed() {
                continue;
            }
            let fut = match self.add(m, ctx) {
                Ok(f) => f,
                // Preparing again (cannot happen before the add that
                // would open a transaction): let the client retry.
                Err(_) => ready(Ok(Err(ResponseError::ConcurrentTransactions))),
            };
            actix::spawn(async move {
                let _ = tx.send(fut.await);
            });
        }
    }
}

impl Handler<AddTxnPartitions> for TxnCoordinator {
    type Result = ResponseFuture<CoordReply<Result<(), ResponseError>>>;
    fn handle(&mut self, m: AddTxnPartitions, ctx: &mut Context<Self>) -> Self::Result {
        match self.add(m, ctx) {
            Ok(f) => f,
            Err(m) => {
                let (tx, rx) = oneshot::channel();
                let waiting = self
                    .parked_adds
                    .entry(m.transactional_id.clone())
                    .or_default();
                // Callers that gave up (timed out, and retried) go first:
                // a transaction whose markers take long keeps one entry
                // per caller still waiting, not one per retry.
                waiting.retain(|(_, tx)| !tx.is_closed());
                waiting.push((m, tx));
                Box::pin(async move {
                    match actix_rt::time::timeout(PARK_ADDS_FOR, rx).await {
                        Ok(Ok(r)) => r,
                        // Stopped or failed meanwhile: dropped unanswered.
                        Ok(Err(_)) => Err(CoordinatorError::Unavailable),
                        Err(_) => Ok(Err(ResponseError::ConcurrentTransactions)),
                    }
                })
            }
        }
    }
}

impl Handler<VerifyTxnPartitions> for TxnCoordinator {
    type Result = ResponseFuture<CoordReply<Result<Vec<bool>, ResponseError>>>;
    fn handle(&mut self, m: VerifyTxnPartitions, ctx: &mut Context<Self>) -> Self::Result {
        if matches!(self.phase, Phase::Idle) {
            return ready(Ok(Err(ResponseError::InvalidProducerIdMapping)));
        }
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        match TxnMachine::verify(
            &s.view,
            &m.transactional_id,
            m.producer_id,
            m.producer_epoch,
            &m.partitions,
        ) {
            Err(e) => ready(Ok(Err(e))),
            // The view may hold an AddPartitions not yet fsynced: "added"
            // is said only once it is durable, as AddPartitionsToTxn's
            // own answer. Usually it is (the client produces after that
            // answer): then at once, not after the fsync of whatever else
            // the shard is writing.
            Ok(v) => {
                let durable = s.log.durable();
                let pending = self
                    .written
                    .get(&m.transactional_id)
                    .is_some_and(|t| *t > durable);
                if pending {
                    self.answer(None, Ok(v), ctx)
                } else if self.lease_ok() {
                    ready(Ok(Ok(v)))
                } else {
                    ready(Err(CoordinatorError::NotCoordinator))
                }
            }
        }
    }
}

impl Handler<EndTxn> for TxnCoordinator {
    type Result = ResponseFuture<CoordReply<Result<(), ResponseError>>>;
    fn handle(&mut self, m: EndTxn, ctx: &mut Context<Self>) -> Self::Result {
        let now = self.clock.now_ms();
        if matches!(self.phase, Phase::Idle) {
            return ready(Ok(Err(ResponseError::InvalidProducerIdMapping)));
        }
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        match TxnMachine::end(
            &s.view,
            &m.transactional_id,
            m.producer_id,
            m.producer_epoch,
            m.commit,
            now,
        ) {
            Err(e) => ready(Ok(Err(e))),
            Ok(rec) => self.answer(rec, Ok(()), ctx),
        }
    }
}

impl Handler<DescribeTxns> for TxnCoordinator {
    type Result = ResponseFuture<CoordReply<Vec<(String, Option<TxnMeta>)>>>;
    fn handle(&mut self, m: DescribeTxns, _: &mut Context<Self>) -> Self::Result {
        if matches!(self.phase, Phase::Idle) {
            return ready(Ok(m.0.into_iter().map(|id| (id, None)).collect()));
        }
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        let out =
            m.0.into_iter()
                .map(|id| {
                    let v = s.view.txns.get(&id).cloned();
                    (id, v)
                })
                .collect();
        ready(Ok(out))
    }
}

impl Handler<ListTxns> for TxnCoordinator {
    type Result = ResponseFuture<CoordReply<Vec<TxnMeta>>>;
    fn handle(&mut self, _: ListTxns, _: &mut Context<Self>) -> Self::Result {
        if matches!(self.phase, Phase::Idle) {
            return ready(Ok(Vec::new()));
        }
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        ready(Ok(s.view.txns.values().cloned().collect()))
    }
}

impl Handler<StopTxnCoordinator> for TxnCoordinator {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, _: StopTxnCoordinator, ctx: &mut Context<Self>) -> Self::Result {
        self.stopping = true;
        if matches!(self.phase, Phase::Opening | Phase::Probing) {
            let (tx, rx) = oneshot::channel();
            self.stop_waiters.push(tx);
            return Box::pin(async move {
                let _ = rx.await;
            });
        }
        if let Phase::Serving(s) = &mut self.phase {
            if s.log.sync_now().is_ok() {
                // Answer what became durable (under the lease check);
                // markers are the successor's to send (it re-drives every
                // Prepare* it reads), so nothing new is driven here.
                self.to_drive.clear();
                self.deliver(ctx);
            }
        }
        self.fail_waiting(CoordinatorError::NotCoordinator);
        self.phase = Phase::Stopped;
        self.stats.deregister();
        ctx.stop();
        Box::pin(async {})
    }
}

crate::instrumented!(
    TxnCoordinator: InitTxnProducer,
    AddTxnPartitions,
    VerifyTxnPartitions,
    EndTxn,
    DescribeTxns,
    ListTxns,
    StopTxnCoordinator
);

impl crate::registry::Owner for TxnCoordinatorHandle {
    fn stop(self) -> futures::future::LocalBoxFuture<'static, ()> {
        Box::pin(async move {
            let _ = self.addr.send(StopTxnCoordinator).await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::state::{TxnStatus, GROUP_OFFSETS_TOPIC};
    use super::*;
    use futures::FutureExt;
    use kaas_volume::fs::RealFs;
    use std::sync::Mutex;

    type Sent = Arc<Mutex<Vec<MarkerJob>>>;

    /// A sink that acknowledges everything after `fail_rounds` failed
    /// rounds, recording each round.
    fn sink(sent: Sent, fail_rounds: usize) -> MarkerSink {
        MarkerSink(Arc::new(move |job: MarkerJob| {
            let sent = sent.clone();
            async move {
                let mut v = sent.lock().unwrap();
                v.push(job.clone());
                if v.len() <= fail_rounds {
                    job.partitions
                } else {
                    Vec::new()
                }
            }
            .boxed()
        }))
    }

    fn spec(dir: &std::path::Path, epoch: i32, markers: MarkerSink) -> TxnCoordinatorSpec {
        TxnCoordinatorSpec {
            shard: ShardId(2),
            cluster_dir: dir.to_path_buf(),
            epoch,
            lease: None,
            owner: Some(ClaimOwner {
                broker_id: 0,
                incarnation: epoch as u64,
            }),
            on_fenced: None,
            log: ShardLogConfig::default(),
            expiration_ms: 7 * 24 * 3600 * 1000,
            markers,
        }
    }

    fn start(dir: &std::path::Path, epoch: i32, markers: MarkerSink) -> TxnCoordinatorHandle {
        TxnCoordinator::start(
            spec(dir, epoch, markers),
            Arc::new(RealFs),
            crate::clock::real(),
            &actix::Arbiter::current(),
        )
    }

    async fn loaded(h: &TxnCoordinatorHandle) {
        for _ in 0..500 {
            match h.addr.send(ListTxns).await.unwrap() {
                Err(CoordinatorError::Loading) => {
                    actix_rt::time::sleep(Duration::from_millis(10)).await
                }
                _ => return,
            }
        }
        panic!("never loaded");
    }

    async fn init(h: &TxnCoordinatorHandle, id: &str) -> (i64, i16) {
        let mut fresh = None;
        loop {
            let r = h
                .addr
                .send(InitTxnProducer {
                    transactional_id: id.into(),
                    timeout_ms: 60_000,
                    given: (-1, -1),
                    fresh,
                })
                .await
                .unwrap();
            let Ok(r) = r else {
                // An idle shard opens on its first init.
                actix_rt::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            match r {
                Ok(InitAnswer::Ready(p, e)) => return (p, e),
                Ok(InitAnswer::NeedProducerId) => fresh = Some(1000),
                Err(ResponseError::ConcurrentTransactions) => {
                    actix_rt::time::sleep(Duration::from_millis(10)).await
                }
                Err(e) => panic!("{e:?}"),
            }
        }
    }

    /// fsyncs of a shard's log file so far, from the fault seam's log.
    fn shard_syncs(fs: &kaas_volume::fs::fault::FaultFs) -> usize {
        fs.log()
            .iter()
            .filter(|l| l.contains(": sync ") && l.ends_with(".log"))
            .count()
    }

    /// AddPartitionsToTxn for transactional id "t".
    fn add_t((producer_id, producer_epoch): (i64, i16), parts: &[(&str, i32)]) -> AddTxnPartitions {
        AddTxnPartitions {
            transactional_id: "t".into(),
            producer_id,
            producer_epoch,
            partitions: parts.iter().map(|(t, p)| (t.to_string(), *p)).collect(),
        }
    }

    /// EndTxn for transactional id "t".
    fn end_t((producer_id, producer_epoch): (i64, i16), commit: bool) -> EndTxn {
        EndTxn {
            transactional_id: "t".into(),
            producer_id,
            producer_epoch,
            commit,
        }
    }

    async fn status(h: &TxnCoordinatorHandle, id: &str) -> Option<TxnMeta> {
        let mut v = h
            .addr
            .send(DescribeTxns(vec![id.into()]))
            .await
            .unwrap()
            .unwrap();
        v.pop().and_then(|x| x.1)
    }

    #[actix_rt::test]
    async fn commit_sends_markers_after_the_decision_and_completes() {
        let dir = tempfile::tempdir().unwrap();
        let sent: Sent = Arc::default();
        let h = start(dir.path(), 1, sink(sent.clone(), 2));
        loaded(&h).await;
        let (pid, epoch) = init(&h, "t").await;
        assert_eq!((pid, epoch), (1000, 0));
        h.addr
            .send(add_t((pid, epoch), &[("a", 0), (GROUP_OFFSETS_TOPIC, 4)]))
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let end = end_t((pid, epoch), true);
        h.addr.send(end).await.unwrap().unwrap().unwrap();
        for _ in 0..200 {
            if status(&h, "t").await.unwrap().status == TxnStatus::CompleteCommit {
                break;
            }
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            status(&h, "t").await.unwrap().status,
            TxnStatus::CompleteCommit
        );
        let v = sent.lock().unwrap().clone();
        assert_eq!(v.len(), 3, "two failed rounds re-sent, then acked");
        assert!(v.iter().all(|j| j.commit && j.coordinator_epoch == 1));
        assert_eq!(v[0].partitions.len(), 2);
        // Fencing: a second init bumps the epoch; the first is fenced.
        let (pid2, epoch2) = init(&h, "t").await;
        assert_eq!((pid2, epoch2), (pid, 1));
        let r = h
            .addr
            .send(add_t((pid, epoch), &[("b", 0)]))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r, Err(ResponseError::ProducerFenced));
    }

    /// Catches: the next transaction's AddPartitionsToTxn answered
    /// CONCURRENT_TRANSACTIONS while the previous one's markers are still
    /// being written — the client then backs off (~20 ms+), the p99 of
    /// back-to-back transactions (BENCHMARKS.md). It waits for the
    /// completion instead, bounded by PARK_ADDS_FOR.
    #[actix_rt::test]
    async fn an_add_during_the_previous_commit_waits_for_its_completion() {
        for (fail_rounds, expect) in [
            (2, Ok(())),
            // 20+40+80+160+320 ms of re-sends: past PARK_ADDS_FOR.
            (6, Err(ResponseError::ConcurrentTransactions)),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let h = start(dir.path(), 1, sink(Arc::default(), fail_rounds));
            loaded(&h).await;
            let (pid, epoch) = init(&h, "t").await;
            let add = |p: &str| add_t((pid, epoch), &[(p, 0)]);
            h.addr.send(add("a")).await.unwrap().unwrap().unwrap();
            let end = end_t((pid, epoch), true);
            h.addr.send(end).await.unwrap().unwrap().unwrap();
            let r = h.addr.send(add("b")).await.unwrap().unwrap();
            assert_eq!(r, expect, "fail_rounds {fail_rounds}");
            if expect.is_ok() {
                let m = status(&h, "t").await.unwrap();
                assert_eq!(m.status, TxnStatus::Ongoing);
                assert!(m.partitions.contains(&("b".to_string(), 0)), "{m:?}");
                assert!(!m.partitions.contains(&("a".to_string(), 0)), "{m:?}");
            }
        }
    }

    /// Catches: the completion of a transaction and the next one's parked
    /// AddPartitionsToTxn written under two fsyncs one after the other (the
    /// completion's fsync started at once, the add's had to wait for it):
    /// two fsyncs of the shard in the path of every back-to-back
    /// transaction instead of one.
    #[actix_rt::test]
    async fn a_completion_and_the_parked_add_share_one_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let fs = kaas_volume::fs::fault::FaultFs::new();
        let h = TxnCoordinator::start(
            spec(dir.path(), 1, sink(Arc::default(), 1)),
            Arc::new(fs.clone()),
            crate::clock::real(),
            &actix::Arbiter::current(),
        );
        loaded(&h).await;
        let (pid, epoch) = init(&h, "t").await;
        let add = |p: &str| add_t((pid, epoch), &[(p, 0)]);
        h.addr.send(add("a")).await.unwrap().unwrap().unwrap();
        let end = end_t((pid, epoch), true);
        h.addr.send(end).await.unwrap().unwrap().unwrap();
        let syncs = || shard_syncs(&fs);
        let before = syncs();
        // Parked: the first marker round fails, the second comes 20 ms later.
        h.addr.send(add("b")).await.unwrap().unwrap().unwrap();
        assert_eq!(syncs() - before, 1, "{:#?}", fs.log());
        let m = status(&h, "t").await.unwrap();
        assert_eq!(m.status, TxnStatus::Ongoing);
        assert!(m.partitions.contains(&("b".to_string(), 0)), "{m:?}");
    }

    /// Catches: a completion synced on its own — an fsync per transaction
    /// that no answer waits for, started just before the next
    /// transaction's AddPartitionsToTxn, which then waits for it and for
    /// its own. The completion rides on the add's fsync instead, and when
    /// nothing follows it is synced within LAZY_SYNC_WITHIN.
    #[actix_rt::test]
    async fn a_completion_waits_for_the_next_fsync_or_the_lazy_sync() {
        let dir = tempfile::tempdir().unwrap();
        let fs = kaas_volume::fs::fault::FaultFs::new();
        let started = std::time::Instant::now();
        let h = TxnCoordinator::start(
            spec(dir.path(), 1, sink(Arc::default(), 0)),
            Arc::new(fs.clone()),
            crate::clock::real(),
            &actix::Arbiter::current(),
        );
        loaded(&h).await;
        let (pid, epoch) = init(&h, "t").await;
        let syncs = || shard_syncs(&fs);
        let add = |p: &str| add_t((pid, epoch), &[(p, 0)]);
        let end = || end_t((pid, epoch), true);
        let completed = |h: TxnCoordinatorHandle| async move {
            for _ in 0..200 {
                if status(&h, "t").await.unwrap().status == TxnStatus::CompleteCommit {
                    return;
                }
                actix_rt::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("never completed");
        };
        h.addr.send(add("a")).await.unwrap().unwrap().unwrap();
        h.addr.send(end()).await.unwrap().unwrap().unwrap();
        let before = syncs();
        completed(h.clone()).await;
        h.addr.send(add("b")).await.unwrap().unwrap().unwrap();
        // The first lazy sync is due LAZY_SYNC_WITHIN after the start: on
        // a machine too slow to get here before it, it may have synced
        // the completion alone.
        if started.elapsed() < LAZY_SYNC_WITHIN * 9 / 10 {
            assert_eq!(syncs() - before, 1, "{:#?}", fs.log());
        }
        // Nothing follows this completion: the lazy sync covers it.
        h.addr.send(end()).await.unwrap().unwrap().unwrap();
        completed(h.clone()).await;
        let pending = syncs();
        for _ in 0..100 {
            if syncs() > pending {
                break;
            }
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(syncs(), pending + 1, "{:#?}", fs.log());
    }

    /// A commit through the actor with a crash (and power loss) at every
    /// step of its writes: the successor never loses an acknowledged
    /// decision or add, and finishes a decision whose completion was lost
    /// (the completion is synced lazily, so a crash after its markers were
    /// acknowledged loses it: the successor sends them again).
    #[actix_rt::test]
    async fn crash_at_every_step_of_a_commit_through_the_coordinator() {
        use kaas_volume::fs::fault::FaultFs;
        #[derive(Default, Debug)]
        struct Acked {
            add_a: bool,
            end: bool,
            completed: bool,
            add_b: bool,
        }
        async fn scenario(fs: FaultFs, dir: &std::path::Path) -> Acked {
            let mut acked = Acked::default();
            let h = TxnCoordinator::start(
                spec(dir, 1, sink(Arc::default(), 0)),
                Arc::new(fs),
                crate::clock::real(),
                &actix::Arbiter::current(),
            );
            let mut ids = None;
            let mut fresh = None;
            for _ in 0..100 {
                let r = h
                    .addr
                    .send(InitTxnProducer {
                        transactional_id: "t".into(),
                        timeout_ms: 60_000,
                        given: (-1, -1),
                        fresh,
                    })
                    .await
                    .unwrap();
                match r {
                    Ok(Ok(InitAnswer::Ready(p, e))) => {
                        ids = Some((p, e));
                        break;
                    }
                    Ok(Ok(InitAnswer::NeedProducerId)) => fresh = Some(1000),
                    Err(CoordinatorError::Loading) => {
                        actix_rt::time::sleep(Duration::from_millis(10)).await
                    }
                    _ => break,
                }
            }
            let Some((pid, epoch)) = ids else {
                return acked;
            };
            let add = |p: &str| add_t((pid, epoch), &[(p, 0)]);
            let ok =
                |r: Result<CoordReply<Result<(), ResponseError>>, _>| matches!(r, Ok(Ok(Ok(()))));
            acked.add_a = ok(h.addr.send(add("a")).await);
            if acked.add_a {
                let end = end_t((pid, epoch), true);
                acked.end = ok(h.addr.send(end).await);
            }
            if acked.end {
                for _ in 0..200 {
                    match h.addr.send(DescribeTxns(vec!["t".into()])).await {
                        Ok(Ok(v))
                            if v[0]
                                .1
                                .as_ref()
                                .is_some_and(|m| m.status == TxnStatus::CompleteCommit) =>
                        {
                            acked.completed = true;
                            break;
                        }
                        Ok(Ok(_)) => actix_rt::time::sleep(Duration::from_millis(5)).await,
                        _ => break,
                    }
                }
            }
            if acked.completed {
                acked.add_b = ok(h.addr.send(add("b")).await);
            }
            let _ = h.addr.send(StopTxnCoordinator).await;
            acked
        }
        let clean = FaultFs::new();
        let dir = tempfile::tempdir().unwrap();
        let a = scenario(clean.clone(), dir.path()).await;
        assert!(a.add_b, "{a:?}");
        let steps = clean.ops();
        for n in 1..=steps + 1 {
            let dir = tempfile::tempdir().unwrap();
            let fs = FaultFs::new();
            fs.crash_at(n);
            let acked = scenario(fs.clone(), dir.path()).await;
            fs.power_loss();
            let sent: Sent = Arc::default();
            let h = start(dir.path(), 2, sink(sent.clone(), 0));
            loaded(&h).await;
            let mut m = status(&h, "t").await;
            for _ in 0..200 {
                if !m.as_ref().is_some_and(|m| m.status.preparing()) {
                    break;
                }
                actix_rt::time::sleep(Duration::from_millis(5)).await;
                m = status(&h, "t").await;
            }
            let st = m.as_ref().map(|m| m.status);
            let parts = m.as_ref().map(|m| m.partitions.clone()).unwrap_or_default();
            let why = format!("crash at {n}: {acked:?} -> {m:?}, {:#?}", fs.log());
            if acked.add_b {
                assert_eq!(st, Some(TxnStatus::Ongoing), "{why}");
                assert!(parts.contains(&("b".to_string(), 0)), "{why}");
            } else if acked.end {
                assert!(
                    st == Some(TxnStatus::CompleteCommit)
                        || (st == Some(TxnStatus::Ongoing)
                            && parts.contains(&("b".to_string(), 0))),
                    "{why}"
                );
            } else if acked.add_a {
                assert!(
                    st == Some(TxnStatus::Ongoing) || st == Some(TxnStatus::CompleteCommit),
                    "{why}"
                );
            }
            // Whatever the successor re-drove is the decision taken.
            for job in sent.lock().unwrap().iter() {
                assert!(job.commit, "{why}");
                assert_eq!(job.partitions, vec![("a".to_string(), 0)], "{why}");
            }
            if acked.end && !acked.add_b && st == Some(TxnStatus::CompleteCommit) {
                // Completed by us or durable before the crash.
                assert!(sent.lock().unwrap().len() <= 1, "{why}");
            }
            h.addr.send(StopTxnCoordinator).await.unwrap();
        }
    }

    #[actix_rt::test]
    async fn an_unused_shard_stays_idle_until_a_transaction_needs_it() {
        let dir = tempfile::tempdir().unwrap();
        let h = start(dir.path(), 1, sink(Arc::default(), 0));
        loaded(&h).await;
        let txn_dir = txn_shard_dir(dir.path(), ShardId(2));
        assert!(!txn_dir.exists(), "no claim, no file for an idle shard");
        assert_eq!(status(&h, "t").await, None);
        let r = h
            .addr
            .send(InitTxnProducer {
                transactional_id: "t".into(),
                timeout_ms: 0,
                given: (-1, -1),
                fresh: None,
            })
            .await
            .unwrap();
        assert_eq!(r, Ok(Err(ResponseError::InvalidTransactionTimeout)));
        assert_eq!(init(&h, "t").await, (1000, 0));
        assert!(txn_dir.join("leader-e1.claim").exists());
    }

    #[actix_rt::test]
    async fn a_successor_finishes_a_decision_the_previous_owner_took() {
        let dir = tempfile::tempdir().unwrap();
        // The first owner never gets its markers acknowledged.
        let h = start(dir.path(), 1, sink(Arc::default(), usize::MAX));
        loaded(&h).await;
        let (pid, epoch) = init(&h, "t").await;
        h.addr
            .send(add_t((pid, epoch), &[("a", 1)]))
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        h.addr
            .send(end_t((pid, epoch), false))
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(
            status(&h, "t").await.unwrap().status,
            TxnStatus::PrepareAbort
        );
        h.addr.send(StopTxnCoordinator).await.unwrap();
        let sent: Sent = Arc::default();
        let h2 = start(dir.path(), 2, sink(sent.clone(), 0));
        loaded(&h2).await;
        for _ in 0..200 {
            if status(&h2, "t").await.unwrap().status == TxnStatus::CompleteAbort {
                break;
            }
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            status(&h2, "t").await.unwrap().status,
            TxnStatus::CompleteAbort
        );
        let v = sent.lock().unwrap().clone();
        assert_eq!(v.len(), 1);
        assert_eq!(
            (v[0].commit, v[0].coordinator_epoch, v[0].partitions.clone()),
            (false, 2, vec![("a".to_string(), 1)])
        );
    }
}
