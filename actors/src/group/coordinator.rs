//! `GroupCoordinator`: the actor that owns one coordinator shard's files —
//! one per shard granted to this broker, started and stopped by grant
//! through the broker's `OwnerRegistry`, like `PartitionLeader`.
//!
//! It is the thin actix adapter around [`ShardLog`] (the shard's state on
//! the volume) and [`ClassicGroups`] (the membership state machine):
//!
//! * **Open** on the blocking pool: win the shard's epoch claim
//!   (`leader-e<E>.claim` in the shard directory, O_EXCL, the same
//!   primitive as a partition's) through the lease-guarded seam — the only
//!   way to an [`EpochWriter`] — then [`ShardLog::open`] under that writer,
//!   and rebuild the groups from the durable group records. Requests
//!   meanwhile get [`CoordinatorError::Loading`]. A claim held by another
//!   owner, or a newer epoch on disk, fences us: reported through
//!   `on_fenced` so the controller re-grants above it; requests get
//!   [`CoordinatorError::NotCoordinator`].
//! * **Requests** feed the state machine; the group records it asks to
//!   persist and every offset commit are appended (page cache), and each
//!   answer waits for the ticket of the last append before it. One fsync on
//!   the blocking pool covers everything appended meanwhile (group commit);
//!   when it completes, the waiting answers whose tickets it covers are
//!   delivered — after checking the broker lease, so nothing is
//!   acknowledged by a coordinator that may have been replaced.
//! * **Timers**: session and rebalance deadlines, and KIP-848 regex
//!   resolutions a heartbeat asked for, call `tick` at `next_deadline`
//!   (its records go through the same append); a periodic pass appends
//!   offset expiry tombstones.
//!   Compaction runs between fsyncs when due.
//! * **Failure**: a failed write or fsync poisons the log: waiting answers
//!   get `Unavailable`, and the shard is reopened from its files after a
//!   pause (the re-drive); in-flight rebalances restart from the durable
//!   membership.
//! * **KIP-848**: the consumer protocol's state machine
//!   ([`ConsumerGroups`](super::consumer::ConsumerGroups)) lives beside the
//!   classic one in the same actor and log; its handlers are in
//!   `coordinator/consumer.rs`. A group id is one or the other.

pub mod consumer;

use super::classic::{ClassicGroups, GroupConfig, GroupState, Output, ReplyId, Response};
use super::log::{ShardLog, ShardLogConfig, ShardLogError, Ticket};
use super::messages::*;
use super::names::shard_dir;
use super::offsets::{expire, OffsetKey, OffsetValue, Record};
use super::shard::ShardId;
use crate::clock::SharedClock;
use crate::cluster::lease::{Lease, LeaseGuard};
use crate::partition::claim::{self, ClaimOwner, EpochWriter};
use crate::partition::leader::OnFenced;
use crate::telemetry::{ActorStats, Mailbox};
use actix::prelude::*;
use kaas_protocol::kafka_protocol::ResponseError;
use kaas_volume::fs::{GuardedFs, SharedFs, WriteGuard};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

const KIND: &str = "group_coordinator";

/// How long a failed shard waits before it is reopened.
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// How often expired offsets are looked for.
const EXPIRY_EVERY: Duration = Duration::from_secs(60);

/// Static description of one shard to own.
#[derive(Debug, Clone)]
pub struct CoordinatorSpec {
    /// The shard.
    pub shard: ShardId,
    /// The cluster directory (the shard lives in `groups/<shard>/`).
    pub cluster_dir: PathBuf,
    /// The grant's epoch, which every file we write carries.
    pub epoch: i32,
    /// The broker lease and the incarnation the grant is for (`None`: a
    /// single process's own files, tests).
    pub lease: Option<(Arc<Lease>, u64)>,
    /// Who claims the epoch (`None`: no claim file, tests).
    pub owner: Option<ClaimOwner>,
    /// Called when the open finds the epoch claimed by another owner or a
    /// newer epoch on disk.
    pub on_fenced: Option<OnFenced>,
    /// Group timeouts.
    pub groups: GroupConfig,
    /// Compaction thresholds.
    pub log: ShardLogConfig,
    /// `offsets.retention.minutes`, in ms.
    pub retention_ms: i64,
    /// KIP-848 consumer-protocol settings.
    pub consumer: super::consumer::ConsumerConfig,
    /// The broker's topics, for server-side assignment.
    pub topics: consumer::Topics,
}

/// Everything a connection needs to talk to one shard.
#[derive(Clone)]
pub struct CoordinatorHandle {
    /// The coordinator's mailbox, instrumented.
    pub addr: Mailbox<GroupCoordinator>,
}

struct Serving {
    log: ShardLog,
    groups: ClassicGroups,
    consumer: super::consumer::ConsumerGroups,
    /// Kept for the life of the open: the capability the log writes under.
    _writer: EpochWriter,
}

/// Who commits offsets, as OffsetCommit and TxnOffsetCommit name them.
struct Committer<'a> {
    group_id: &'a str,
    member_id: &'a str,
    instance_id: Option<&'a str>,
    /// The classic generation, or a KIP-848 member's epoch (clients put
    /// the member epoch in the same field, also in a transaction's group
    /// metadata); -1 when not given.
    generation_id: i32,
}

impl Serving {
    /// The one validation of a commit, OffsetCommit or (`transactional`)
    /// TxnOffsetCommit, on the group's type as Kafka's
    /// `OffsetMetadataManager` does: a KIP-848 group checks the member and
    /// its epoch ([`ConsumerGroups::validate_commit`](super::consumer::ConsumerGroups::validate_commit)),
    /// any other the classic member and generation
    /// ([`ClassicGroups::validate_commit`]). A TxnOffsetCommit without a
    /// member, an epoch and an instance id (before v3 it carries none) is
    /// not checked against a consumer group's members, as in Kafka.
    fn validate_commit(
        &self,
        c: &Committer<'_>,
        offsets: &[CommitOffset],
        transactional: bool,
    ) -> Result<(), ResponseError> {
        if self.consumer.contains(c.group_id) {
            if transactional
                && c.generation_id == -1
                && c.member_id.is_empty()
                && c.instance_id.is_none()
            {
                return Ok(());
            }
            let partitions: Vec<(&str, i32)> = offsets
                .iter()
                .map(|o| (o.topic.as_str(), o.partition))
                .collect();
            self.consumer
                .validate_commit(c.group_id, c.member_id, c.generation_id, &partitions)
        } else {
            self.groups.validate_commit(
                c.group_id,
                c.member_id,
                c.instance_id,
                c.generation_id,
                transactional,
            )
        }
    }
}

enum Phase {
    Opening,
    Serving(Box<Serving>),
    /// Fenced or lease lapsed: answers NOT_COORDINATOR until stopped.
    Fenced,
    /// Failed: reopening soon.
    Failed,
    Stopped,
}

enum PendingReply {
    Join(oneshot::Sender<CoordReply<super::classic::JoinResponse>>),
    Sync(oneshot::Sender<CoordReply<super::classic::SyncResponse>>),
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

struct Opened(Result<(EpochWriter, ShardLog), OpenError>);
impl Message for Opened {
    type Result = ();
}

/// See module docs.
pub struct GroupCoordinator {
    spec: CoordinatorSpec,
    fs: SharedFs,
    clock: SharedClock,
    stats: Arc<ActorStats>,
    phase: Phase,
    syncing: bool,
    last_ticket: Ticket,
    waiting: VecDeque<(Ticket, Deliver)>,
    replies: HashMap<ReplyId, PendingReply>,
    next_reply: ReplyId,
    timer: Option<SpawnHandle>,
    stop_waiters: Vec<oneshot::Sender<()>>,
    stopping: bool,
}

/// Open the shard as its owner of `epoch`: the claim first, then the log.
fn open_shard(
    fs: SharedFs,
    guard: Option<Arc<dyn WriteGuard>>,
    spec: &CoordinatorSpec,
) -> Result<(EpochWriter, ShardLog), OpenError> {
    let dir = shard_dir(&spec.cluster_dir, spec.shard);
    let guarded = match &guard {
        Some(g) => GuardedFs::shared(fs.clone(), g.clone()),
        None => fs.clone(),
    };
    guarded.create_dir_all(&dir)?;
    let writer = match claim::win(&fs, guard, &dir, spec.epoch, spec.owner)? {
        Ok(w) => w,
        Err(by) => return Err(OpenError::Claimed(by)),
    };
    let log = ShardLog::open(
        writer.shared(),
        &spec.cluster_dir,
        spec.shard,
        spec.epoch,
        spec.log,
    )?;
    Ok((writer, log))
}

impl GroupCoordinator {
    /// Start a coordinator of `spec` on `arbiter`, timing sessions on `clock`.
    pub fn start(
        spec: CoordinatorSpec,
        fs: SharedFs,
        clock: SharedClock,
        arbiter: &actix::ArbiterHandle,
    ) -> CoordinatorHandle {
        let stats = ActorStats::register(
            KIND,
            format!("shard-{}", spec.shard),
            shard_dir(&spec.cluster_dir, spec.shard)
                .display()
                .to_string(),
        );
        stats.set_epoch(spec.epoch as i64);
        let mine = stats.clone();
        let addr = GroupCoordinator::start_in_arbiter(arbiter, move |_| GroupCoordinator {
            spec,
            fs,
            clock,
            stats: mine,
            phase: Phase::Opening,
            syncing: false,
            last_ticket: Ticket(0),
            waiting: VecDeque::new(),
            replies: HashMap::new(),
            next_reply: 0,
            timer: None,
            stop_waiters: Vec::new(),
            stopping: false,
        });
        CoordinatorHandle {
            addr: Mailbox::new(addr, stats),
        }
    }

    fn lease_ok(&self) -> bool {
        self.spec
            .lease
            .as_ref()
            .is_none_or(|(l, inc)| l.valid_for(*inc))
    }

    fn open(&mut self, ctx: &mut Context<Self>) {
        if self.stopping {
            return;
        }
        if !self.lease_ok() {
            // Never open (and sweep) under a lapsed lease.
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
            "coordinator fenced"
        );
        self.stats.set_error(Some(why.to_owned()));
        self.phase = Phase::Fenced;
        self.fail_waiting(CoordinatorError::NotCoordinator);
    }

    fn fail_waiting(&mut self, e: CoordinatorError) {
        for (_, d) in self.waiting.drain(..) {
            d(Err(e));
        }
        for (_, r) in self.replies.drain() {
            match r {
                PendingReply::Join(tx) => drop(tx.send(Err(e))),
                PendingReply::Sync(tx) => drop(tx.send(Err(e))),
            }
        }
    }

    /// A write or fsync failed: the log is poisoned. Answer nothing more
    /// from it; reopen from the files after a pause.
    fn failed(&mut self, err: &dyn std::fmt::Display, ctx: &mut Context<Self>) {
        tracing::error!(shard = self.spec.shard.0, epoch = self.spec.epoch, error = %err, "coordinator shard failed; reopening");
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
            Phase::Opening => Err(CoordinatorError::Loading),
            Phase::Failed => Err(CoordinatorError::Unavailable),
            Phase::Fenced | Phase::Stopped => Err(CoordinatorError::NotCoordinator),
        }
    }

    /// Append `records` (if any); the ticket every answer computed from the
    /// state so far must wait for.
    fn append(&mut self, records: &[Record], ctx: &mut Context<Self>) -> Option<Ticket> {
        if records.is_empty() {
            return Some(self.last_ticket);
        }
        let Phase::Serving(s) = &mut self.phase else {
            return None;
        };
        match s.log.append(records) {
            Ok(t) => {
                self.last_ticket = t;
                self.kick_sync(ctx);
                Some(t)
            }
            Err(e) => {
                self.failed(&e, ctx);
                None
            }
        }
    }

    /// Run `d` once `ticket` is durable (now, if it is).
    fn after(&mut self, ticket: Ticket, d: Deliver) {
        self.waiting.push_back((ticket, d));
        self.deliver();
    }

    fn deliver(&mut self) {
        let durable = match &self.phase {
            Phase::Serving(s) => s.log.durable(),
            _ => return,
        };
        if self.waiting.front().is_none_or(|(t, _)| *t > durable) {
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
    }

    /// Persist `out.persist`, then deliver its replies once durable.
    fn process(&mut self, out: Output, ctx: &mut Context<Self>) {
        let records: Vec<Record> = out.persist.into_iter().map(Record::Group).collect();
        let Some(ticket) = self.append(&records, ctx) else {
            return;
        };
        for (id, resp) in out.replies {
            let Some(p) = self.replies.remove(&id) else {
                continue;
            };
            self.after(
                ticket,
                Box::new(move |r| match (p, resp) {
                    (PendingReply::Join(tx), Response::Join(j)) => drop(tx.send(r.map(|_| j))),
                    (PendingReply::Sync(tx), Response::Sync(s)) => drop(tx.send(r.map(|_| s))),
                    (PendingReply::Join(tx), _) => {
                        drop(tx.send(Err(CoordinatorError::Unavailable)))
                    }
                    (PendingReply::Sync(tx), _) => {
                        drop(tx.send(Err(CoordinatorError::Unavailable)))
                    }
                }),
            );
        }
        self.schedule(ctx);
    }

    /// Arm the timer for the state machine's next deadline.
    fn schedule(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.timer.take() {
            ctx.cancel_future(h);
        }
        let Phase::Serving(s) = &self.phase else {
            return;
        };
        let next = [s.groups.next_deadline(), s.consumer.next_deadline()]
            .into_iter()
            .flatten()
            .min();
        if let Some(at) = next {
            let wait = at.saturating_sub(self.clock.now());
            self.timer = Some(ctx.run_later(wait, |act, ctx| {
                act.timer = None;
                let topics = act.spec.topics.clone();
                if let Phase::Serving(s) = &mut act.phase {
                    let out = s.groups.tick();
                    let expired = s.consumer.tick(topics.source());
                    let records: Vec<Record> = expired.into_iter().map(Record::Consumer).collect();
                    act.append(&records, ctx);
                    act.process(out, ctx);
                }
            }));
        }
    }

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
            let start = std::time::Instant::now();
            let r = t.sync();
            (t, r, start.elapsed())
        });
        ctx.spawn(job.into_actor(self).map(|res, act, ctx| {
            act.syncing = false;
            let Phase::Serving(s) = &mut act.phase else {
                return;
            };
            match res {
                Ok((t, Ok(()), took)) => {
                    // Per actor (dashboard) and process-wide (fsync histogram).
                    act.stats.fsynced(took);
                    s.log.complete_sync(t);
                    if s.log.compaction_due() {
                        if let Err(e) = s.log.compact() {
                            act.failed(&e, ctx);
                            return;
                        }
                    }
                    act.deliver();
                    act.kick_sync(ctx);
                }
                Ok((_, Err(e), _)) => {
                    // A failed fsync poisons the file: never retried.
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

    fn expire(&mut self, ctx: &mut Context<Self>) {
        let now_ms = self.clock.now_ms();
        let Phase::Serving(s) = &mut self.phase else {
            return;
        };
        let mut records = expire(s.log.state(), now_ms, self.spec.retention_ms);
        // A group the state machine has members in is not removed, even if
        // its durable record is empty (it is being joined right now).
        records.retain(|r| match r {
            Record::GroupTombstone { group } => s
                .groups
                .get(group)
                .is_none_or(|g| g.state() == GroupState::Empty),
            // A consumer-protocol group with members keeps its offsets.
            Record::OffsetTombstone { group, .. } => !s.consumer.keeps_offsets(group),
            _ => true,
        });
        for r in &records {
            if let Record::GroupTombstone { group } = r {
                let _ = s.groups.delete(group);
            }
        }
        records.extend(consumer::expire_empty(
            s,
            &records,
            now_ms,
            self.spec.retention_ms,
        ));
        if !records.is_empty() {
            tracing::info!(
                shard = self.spec.shard.0,
                records = records.len(),
                "expiring offsets"
            );
            self.append(&records, ctx);
        }
    }

    fn opened(&mut self, res: Result<(EpochWriter, ShardLog), OpenError>, ctx: &mut Context<Self>) {
        if self.stopping {
            // Dropping the log closes the files; the stop was waiting for it.
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
                let groups = ClassicGroups::load(
                    log.state().groups.values(),
                    self.spec.groups.clone(),
                    self.clock.clone(),
                );
                // An empty shard (most of them, at every start) at DEBUG.
                if log.state().groups.is_empty() && log.state().offsets.is_empty() {
                    tracing::debug!(
                        shard = self.spec.shard.0,
                        epoch = self.spec.epoch,
                        "group coordinator loaded, empty"
                    );
                } else {
                    tracing::info!(
                        shard = self.spec.shard.0,
                        epoch = self.spec.epoch,
                        groups = log.state().groups.len(),
                        offsets = log.state().offsets.len(),
                        "group coordinator loaded"
                    );
                }
                self.last_ticket = log.durable();
                let consumer = super::consumer::ConsumerGroups::load(
                    log.state(),
                    self.spec.consumer.clone(),
                    self.clock.clone(),
                );
                self.phase = Phase::Serving(Box::new(Serving {
                    log,
                    groups,
                    consumer,
                    _writer: writer,
                }));
                self.stats.set_error(None);
                self.schedule(ctx);
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

    /// Publish the committed offsets for the lag metrics (see
    /// [`super::lag`]) when the durable state moved since the last copy;
    /// withdraw them while not serving.
    fn publish_lag(&mut self) {
        let board = super::lag::board();
        let (shard, epoch) = (self.spec.shard, self.spec.epoch);
        let Phase::Serving(s) = &self.phase else {
            board.remove(shard, epoch);
            return;
        };
        let ticket = s.log.durable().0;
        if board.ticket(shard, epoch) != Some(ticket) {
            let copy = super::lag::ShardOffsets::from_state(
                s.log.state(),
                epoch,
                ticket,
                crate::clock::wall_ms(),
            );
            board.publish(shard, copy);
        }
    }

    fn next_reply(&mut self) -> ReplyId {
        self.next_reply = self.next_reply.wrapping_add(1);
        self.next_reply
    }
}

impl Actor for GroupCoordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(1024);
        ctx.run_interval(EXPIRY_EVERY, |act, ctx| act.expire(ctx));
        ctx.run_interval(super::lag::PUBLISH_EVERY, |act, _| act.publish_lag());
        self.open(ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        super::lag::board().remove(self.spec.shard, self.spec.epoch);
        self.stats.deregister();
    }
}

impl Handler<Opened> for GroupCoordinator {
    type Result = ();
    fn handle(&mut self, m: Opened, ctx: &mut Context<Self>) {
        self.opened(m.0, ctx);
    }
}

fn ready<T: 'static>(r: CoordReply<T>) -> ResponseFuture<CoordReply<T>> {
    Box::pin(async move { r })
}

impl Handler<JoinGroupRequest> for GroupCoordinator {
    type Result = ResponseFuture<CoordReply<super::classic::JoinResponse>>;
    fn handle(&mut self, m: JoinGroupRequest, ctx: &mut Context<Self>) -> Self::Result {
        let id = self.next_reply();
        if let Err(e) = self.serving() {
            return ready(Err(e));
        }
        if let Some(refused) = self.join_meets_consumer_group(&m.0, ctx) {
            return ready(refused);
        }
        let Ok(s) = self.serving() else {
            return ready(Err(CoordinatorError::Unavailable));
        };
        let out = s.groups.join(m.0, id);
        let (tx, rx) = oneshot::channel();
        self.replies.insert(id, PendingReply::Join(tx));
        self.process(out, ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(CoordinatorError::Unavailable)) })
    }
}

impl Handler<SyncGroupRequest> for GroupCoordinator {
    type Result = ResponseFuture<CoordReply<super::classic::SyncResponse>>;
    fn handle(&mut self, m: SyncGroupRequest, ctx: &mut Context<Self>) -> Self::Result {
        let id = self.next_reply();
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        let out = s.groups.sync(m.0, id);
        let (tx, rx) = oneshot::channel();
        self.replies.insert(id, PendingReply::Sync(tx));
        self.process(out, ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(CoordinatorError::Unavailable)) })
    }
}

impl Handler<HeartbeatRequest> for GroupCoordinator {
    type Result =
        ResponseFuture<CoordReply<Result<(), kaas_protocol::kafka_protocol::ResponseError>>>;
    fn handle(&mut self, m: HeartbeatRequest, ctx: &mut Context<Self>) -> Self::Result {
        let r = match self.serving() {
            Ok(s) => Ok(s.groups.heartbeat(&m.0)),
            Err(e) => Err(e),
        };
        self.schedule(ctx);
        ready(r)
    }
}

impl Handler<LeaveGroupRequest> for GroupCoordinator {
    type Result = ResponseFuture<CoordReply<super::classic::LeaveResponse>>;
    fn handle(&mut self, m: LeaveGroupRequest, ctx: &mut Context<Self>) -> Self::Result {
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        let (resp, out) = s.groups.leave(&m.group_id, &m.members);
        let records: Vec<Record> = out.persist.iter().cloned().map(Record::Group).collect();
        let ticket = self.append(&records, ctx);
        let out = Output {
            replies: out.replies,
            persist: Vec::new(),
        };
        self.process(out, ctx);
        let Some(ticket) = ticket else {
            return ready(Err(CoordinatorError::Unavailable));
        };
        let (tx, rx) = oneshot::channel();
        self.after(ticket, Box::new(move |r| drop(tx.send(r.map(|_| resp)))));
        Box::pin(async move { rx.await.unwrap_or(Err(CoordinatorError::Unavailable)) })
    }
}

impl Handler<CommitOffsets> for GroupCoordinator {
    type Result =
        ResponseFuture<CoordReply<Result<(), kaas_protocol::kafka_protocol::ResponseError>>>;
    fn handle(&mut self, m: CommitOffsets, ctx: &mut Context<Self>) -> Self::Result {
        let now_ms = self.clock.now_ms();
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        let committer = Committer {
            group_id: &m.group_id,
            member_id: &m.member_id,
            instance_id: m.instance_id.as_deref(),
            generation_id: m.generation_id,
        };
        if let Err(e) = s.validate_commit(&committer, &m.offsets, false) {
            return ready(Ok(Err(e)));
        }
        let records: Vec<Record> = m
            .offsets
            .into_iter()
            .map(|o| Record::Offset {
                group: m.group_id.clone(),
                topic: o.topic,
                partition: o.partition,
                value: OffsetValue {
                    offset: o.offset,
                    leader_epoch: o.leader_epoch,
                    metadata: o.metadata,
                    commit_ms: now_ms,
                    expire_ms: m.retention_ms.and_then(|r| now_ms.checked_add(r)),
                },
            })
            .collect();
        let Some(ticket) = self.append(&records, ctx) else {
            return ready(Err(CoordinatorError::Unavailable));
        };
        let (tx, rx) = oneshot::channel();
        self.after(
            ticket,
            Box::new(move |r| {
                let _ = tx.send(r.map(|_| Ok(())));
            }),
        );
        Box::pin(async move { rx.await.unwrap_or(Err(CoordinatorError::Unavailable)) })
    }
}

impl Handler<TxnCommitOffsets> for GroupCoordinator {
    type Result =
        ResponseFuture<CoordReply<Result<(), kaas_protocol::kafka_protocol::ResponseError>>>;
    fn handle(&mut self, m: TxnCommitOffsets, ctx: &mut Context<Self>) -> Self::Result {
        let now_ms = self.clock.now_ms();
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        // Checked like an OffsetCommit, for either group type (v3+ carries
        // the member, KIP-447); a producer without one commits standalone.
        let committer = Committer {
            group_id: &m.group_id,
            member_id: &m.member_id,
            instance_id: m.instance_id.as_deref(),
            generation_id: m.generation_id,
        };
        if let Err(e) = s.validate_commit(&committer, &m.offsets, true) {
            return ready(Ok(Err(e)));
        }
        // A zombie of an older epoch must not add to a newer epoch's
        // pending offsets.
        if s.log
            .state()
            .pending
            .get(&m.producer_id)
            .is_some_and(|p| p.producer_epoch > m.producer_epoch)
        {
            return ready(Ok(Err(ResponseError::InvalidProducerEpoch)));
        }
        let records: Vec<Record> = m
            .offsets
            .into_iter()
            .map(|o| Record::TxnOffset {
                group: m.group_id.clone(),
                producer_id: m.producer_id,
                producer_epoch: m.producer_epoch,
                topic: o.topic,
                partition: o.partition,
                value: OffsetValue {
                    offset: o.offset,
                    leader_epoch: o.leader_epoch,
                    metadata: o.metadata,
                    commit_ms: now_ms,
                    expire_ms: None,
                },
            })
            .collect();
        let Some(ticket) = self.append(&records, ctx) else {
            return ready(Err(CoordinatorError::Unavailable));
        };
        let (tx, rx) = oneshot::channel();
        self.after(
            ticket,
            Box::new(move |r| {
                let _ = tx.send(r.map(|_| Ok(())));
            }),
        );
        Box::pin(async move { rx.await.unwrap_or(Err(CoordinatorError::Unavailable)) })
    }
}

impl Handler<CompleteTxnOffsets> for GroupCoordinator {
    type Result = ResponseFuture<CoordReply<()>>;
    fn handle(&mut self, m: CompleteTxnOffsets, ctx: &mut Context<Self>) -> Self::Result {
        let last = self.last_ticket;
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        // Appended even when nothing is durably pending: a TxnOffsetCommit
        // still in flight (appended, not yet synced) must be resolved by
        // this marker too, and the end record is idempotent.
        let pending = s.log.state().pending.contains_key(&m.producer_id);
        let records = if pending || last > s.log.durable() {
            vec![Record::TxnEnd {
                producer_id: m.producer_id,
                commit: m.commit,
            }]
        } else {
            Vec::new()
        };
        tracing::debug!(
            shard = self.spec.shard.0,
            producer_id = m.producer_id,
            producer_epoch = m.producer_epoch,
            commit = m.commit,
            pending,
            "transaction marker for group offsets"
        );
        let Some(ticket) = self.append(&records, ctx) else {
            return ready(Err(CoordinatorError::Unavailable));
        };
        let (tx, rx) = oneshot::channel();
        self.after(
            ticket,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        Box::pin(async move { rx.await.unwrap_or(Err(CoordinatorError::Unavailable)) })
    }
}

impl Handler<FetchOffsets> for GroupCoordinator {
    type Result = ResponseFuture<CoordReply<Vec<FetchedOffset>>>;
    fn handle(&mut self, m: FetchOffsets, _: &mut Context<Self>) -> Self::Result {
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        // The durable state only: what a successor would read too.
        let st = s.log.state();
        let out = match m.topics {
            None => st
                .group_offsets(&m.group_id)
                .map(|(k, v)| FetchedOffset {
                    topic: k.topic.clone(),
                    partition: k.partition,
                    value: Some(v.clone()),
                    pending: st.has_pending(&k.group, &k.topic, k.partition),
                })
                .collect(),
            Some(topics) => topics
                .into_iter()
                .flat_map(|(topic, parts)| parts.into_iter().map(move |p| (topic.clone(), p)))
                .map(|(topic, partition)| {
                    let k = OffsetKey {
                        group: m.group_id.clone(),
                        topic,
                        partition,
                    };
                    FetchedOffset {
                        value: st.offsets.get(&k).cloned(),
                        pending: st.has_pending(&k.group, &k.topic, partition),
                        topic: k.topic,
                        partition,
                    }
                })
                .collect(),
        };
        ready(Ok(out))
    }
}

impl Handler<ListGroupsRequest> for GroupCoordinator {
    type Result = ResponseFuture<CoordReply<Vec<GroupListing>>>;
    fn handle(&mut self, _: ListGroupsRequest, _: &mut Context<Self>) -> Self::Result {
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        let mut out: BTreeMap<String, GroupListing> = s
            .groups
            .iter()
            .filter(|g| g.state() != GroupState::Dead)
            .map(|g| {
                (
                    g.id().to_owned(),
                    GroupListing {
                        group_id: g.id().to_owned(),
                        protocol_type: g.protocol_type().unwrap_or_default().to_owned(),
                        state: g.state(),
                    },
                )
            })
            .collect();
        // Groups that only store offsets (standalone consumers) are listed
        // too, Empty with no protocol type, as Kafka does.
        for k in s.log.state().offsets.keys() {
            if s.consumer.contains(&k.group) {
                continue; // listed by ListConsumerGroups
            }
            out.entry(k.group.clone()).or_insert_with(|| GroupListing {
                group_id: k.group.clone(),
                protocol_type: String::new(),
                state: GroupState::Empty,
            });
        }
        ready(Ok(out.into_values().collect()))
    }
}

impl Handler<DescribeGroupsRequest> for GroupCoordinator {
    type Result = ResponseFuture<
        CoordReply<Vec<(String, GroupState, Option<super::offsets::GroupMetadata>)>>,
    >;
    fn handle(&mut self, m: DescribeGroupsRequest, _: &mut Context<Self>) -> Self::Result {
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        let out =
            m.0.into_iter()
                .map(|id| match s.groups.get(&id) {
                    Some(g) => {
                        let (state, rec) = (g.state(), g.to_record());
                        (id, state, Some(rec))
                    }
                    None if s.log.state().group_offsets(&id).next().is_some() => {
                        (id, GroupState::Empty, None)
                    }
                    None => (id, GroupState::Dead, None),
                })
                .collect();
        ready(Ok(out))
    }
}

impl GroupCoordinator {
    /// Append `records` and answer `ok` once they are durable.
    fn answer_when_durable<T: Send + 'static>(
        &mut self,
        records: &[Record],
        ok: T,
        ctx: &mut Context<Self>,
    ) -> ResponseFuture<CoordReply<T>> {
        let Some(ticket) = self.append(records, ctx) else {
            return ready(Err(CoordinatorError::Unavailable));
        };
        let (tx, rx) = oneshot::channel();
        self.after(ticket, Box::new(move |r| drop(tx.send(r.map(|_| ok)))));
        Box::pin(async move { rx.await.unwrap_or(Err(CoordinatorError::Unavailable)) })
    }
}

impl Handler<DeleteGroupRequest> for GroupCoordinator {
    type Result = ResponseFuture<CoordReply<Result<(), ResponseError>>>;
    fn handle(&mut self, m: DeleteGroupRequest, ctx: &mut Context<Self>) -> Self::Result {
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        let id = m.0;
        // Committed offsets and, as Kafka's `deleteAllOffsets`, the keys
        // only pending transactions hold: a tombstone drops those too, so
        // a later COMMIT marker does not revive a deleted group's offsets.
        let state = s.log.state();
        let offsets: Vec<Record> = state
            .group_offsets(&id)
            .map(|(k, _)| k.clone())
            .chain(state.group_pending_only(&id))
            .map(|k| Record::OffsetTombstone {
                group: id.clone(),
                topic: k.topic,
                partition: k.partition,
            })
            .collect();
        if s.consumer.contains(&id) {
            let mut records = match s.consumer.delete(&id) {
                Ok(r) => r.into_iter().map(Record::Consumer).collect::<Vec<_>>(),
                Err(e) => return ready(Ok(Err(e))),
            };
            records.extend(offsets);
            return self.answer_when_durable(&records, Ok(()), ctx);
        }
        // A group is members (the state machine) or offsets (a standalone
        // consumer's): either makes it exist; only an empty one goes.
        match s.groups.delete(&id) {
            Ok(()) => {}
            Err(ResponseError::GroupIdNotFound) if !offsets.is_empty() => {}
            Err(e) => return ready(Ok(Err(e))),
        }
        let mut records = offsets;
        records.push(Record::GroupTombstone { group: id });
        self.answer_when_durable(&records, Ok(()), ctx)
    }
}

impl Handler<DeleteOffsetsRequest> for GroupCoordinator {
    type Result = ResponseFuture<
        CoordReply<Result<Vec<(String, i32, Option<ResponseError>)>, ResponseError>>,
    >;
    fn handle(&mut self, m: DeleteOffsetsRequest, ctx: &mut Context<Self>) -> Self::Result {
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        let has_offsets = s.log.state().group_offsets(&m.group_id).next().is_some();
        // Kafka: a group with members may only lose the offsets of topics
        // none of its consumers subscribes to; a non-consumer group with
        // members keeps them all.
        let subscribed: Option<std::collections::BTreeSet<String>> = match s.groups.get(&m.group_id)
        {
            Some(g) if g.state() != GroupState::Empty && g.state() != GroupState::Dead => {
                let rec = g.to_record();
                if rec.protocol_type.as_deref() != Some("consumer") {
                    return ready(Ok(Err(ResponseError::NonEmptyGroup)));
                }
                Some(
                    rec.members
                        .iter()
                        .flat_map(|mm| subscribed_topics(&mm.subscription))
                        .collect(),
                )
            }
            Some(_) => None,
            None if s.consumer.has_members(&m.group_id) => {
                Some(s.consumer.subscribed_topics(&m.group_id))
            }
            None if has_offsets => None,
            None => return ready(Ok(Err(ResponseError::GroupIdNotFound))),
        };
        let mut records = Vec::new();
        let mut out = Vec::with_capacity(m.partitions.len());
        for (topic, partition) in m.partitions {
            if subscribed.as_ref().is_some_and(|t| t.contains(&topic)) {
                out.push((
                    topic,
                    partition,
                    Some(ResponseError::GroupSubscribedToTopic),
                ));
                continue;
            }
            let k = OffsetKey {
                group: m.group_id.clone(),
                topic,
                partition,
            };
            if s.log.state().offsets.contains_key(&k) {
                records.push(Record::OffsetTombstone {
                    group: k.group,
                    topic: k.topic.clone(),
                    partition,
                });
            }
            out.push((k.topic, partition, None));
        }
        if records.is_empty() {
            return ready(Ok(Ok(out)));
        }
        self.answer_when_durable(&records, Ok(out), ctx)
    }
}

/// The topics of a consumer-protocol subscription (`ConsumerProtocol`
/// Subscription v0+: version i16, then an array of strings; later versions
/// only append fields). Malformed bytes subscribe to nothing.
fn subscribed_topics(b: &[u8]) -> Vec<String> {
    fn parse(b: &[u8]) -> Option<Vec<String>> {
        let n = i32::from_be_bytes(b.get(2..6)?.try_into().ok()?);
        let mut pos = 6usize;
        let mut out = Vec::new();
        for _ in 0..n.clamp(0, 100_000) {
            let len = i16::from_be_bytes(b.get(pos..pos + 2)?.try_into().ok()?);
            pos += 2;
            let len = usize::try_from(len).ok()?;
            out.push(String::from_utf8(b.get(pos..pos + len)?.to_vec()).ok()?);
            pos += len;
        }
        Some(out)
    }
    parse(b).unwrap_or_default()
}

#[cfg(test)]
mod subscription_tests {
    use super::subscribed_topics;

    #[test]
    fn subscriptions_parse_and_garbage_subscribes_to_nothing() {
        // v1: version, topics ["a", "bc"], user data (ignored), owned partitions.
        let mut b = vec![0, 1, 0, 0, 0, 2, 0, 1, b'a', 0, 2, b'b', b'c'];
        b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
        assert_eq!(subscribed_topics(&b), vec!["a", "bc"]);
        for bad in [
            &b[..0],
            &b[..5],
            &b[..9],
            &[0, 0, 0x7f, 0xff, 0xff, 0xff][..],
        ] {
            assert!(subscribed_topics(bad).is_empty());
        }
        assert!(subscribed_topics(&[0, 0, 0, 0, 0, 1, 0xff, 0xff]).is_empty());
    }
}

impl Handler<StopCoordinator> for GroupCoordinator {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, _: StopCoordinator, ctx: &mut Context<Self>) -> Self::Result {
        self.stopping = true;
        if matches!(self.phase, Phase::Opening) {
            // The open is still writing (claim, snapshot, sweep): answer once
            // it is done and closed, so a successor never overlaps it.
            let (tx, rx) = oneshot::channel();
            self.stop_waiters.push(tx);
            return Box::pin(async move {
                let _ = rx.await;
            });
        }
        if let Phase::Serving(s) = &mut self.phase {
            // Whatever was appended becomes durable (and answered) before
            // the files close.
            if s.log.sync_now().is_ok() {
                self.deliver();
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
    GroupCoordinator: DeleteGroupRequest,
    DeleteOffsetsRequest,
    JoinGroupRequest,
    SyncGroupRequest,
    HeartbeatRequest,
    LeaveGroupRequest,
    CommitOffsets,
    TxnCommitOffsets,
    CompleteTxnOffsets,
    FetchOffsets,
    ListGroupsRequest,
    DescribeGroupsRequest,
    StopCoordinator
);

/// Shards are owned by grant like partitions; they belong to no topic, so
/// no topic deletion ever holds them.
impl crate::registry::GrantKey for ShardId {
    fn group(&self) -> &str {
        crate::cluster::records::COORDINATOR_SHARDS
    }
}

impl crate::registry::Owner for CoordinatorHandle {
    fn stop(self) -> futures::future::LocalBoxFuture<'static, ()> {
        Box::pin(async move {
            let _ = self.addr.send(StopCoordinator).await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::classic::{JoinGroup, SyncGroup};
    use super::*;
    use kaas_protocol::kafka_protocol::ResponseError;
    use kaas_volume::fs::RealFs;

    fn spec(dir: &std::path::Path, epoch: i32) -> CoordinatorSpec {
        CoordinatorSpec {
            shard: ShardId(3),
            cluster_dir: dir.to_path_buf(),
            epoch,
            lease: None,
            owner: Some(ClaimOwner {
                broker_id: 0,
                incarnation: 1,
            }),
            on_fenced: None,
            groups: GroupConfig {
                initial_rebalance_delay: Duration::ZERO,
                ..GroupConfig::default()
            },
            log: ShardLogConfig::default(),
            retention_ms: 7 * 24 * 3600 * 1000,
            consumer: Default::default(),
            topics: Default::default(),
        }
    }

    async fn until_loaded(h: &CoordinatorHandle) {
        for _ in 0..500 {
            match h.addr.send(ListGroupsRequest).await.unwrap() {
                Err(CoordinatorError::Loading) => {
                    actix_rt::time::sleep(Duration::from_millis(10)).await
                }
                _ => return,
            }
        }
        panic!("never loaded");
    }

    fn join(member: &str) -> JoinGroupRequest {
        JoinGroupRequest(JoinGroup {
            group_id: "g".into(),
            member_id: member.into(),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 10_000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), vec![1])],
            require_known_member_id: true,
            ..JoinGroup::default()
        })
    }

    fn commit(member: &str, generation_id: i32, offset: i64) -> CommitOffsets {
        CommitOffsets {
            group_id: "g".into(),
            member_id: member.into(),
            instance_id: None,
            generation_id,
            retention_ms: None,
            offsets: vec![CommitOffset {
                topic: "t".into(),
                partition: 0,
                offset,
                leader_epoch: 1,
                metadata: Some("m".into()),
            }],
        }
    }

    /// One member joins and syncs; its commit is answered once durable and
    /// a stale generation's commit is ILLEGAL_GENERATION. A successor of the
    /// next epoch reads the commit and the membership from the files; the
    /// old epoch's claim fences a second opener of the same epoch.
    #[actix_rt::test]
    async fn transactional_offsets_wait_for_their_marker_across_a_takeover() {
        let d = tempfile::tempdir().unwrap();
        let fs: SharedFs = Arc::new(RealFs);
        let arbiter = actix::Arbiter::new();
        let h = GroupCoordinator::start(
            spec(d.path(), 1),
            fs.clone(),
            crate::clock::real(),
            &arbiter.handle(),
        );
        until_loaded(&h).await;
        let txn = |epoch: i16, offset: i64| TxnCommitOffsets {
            group_id: "g".into(),
            producer_id: 7,
            producer_epoch: epoch,
            member_id: String::new(),
            instance_id: None,
            generation_id: -1,
            offsets: vec![CommitOffset {
                topic: "t".into(),
                partition: 0,
                offset,
                leader_epoch: -1,
                metadata: None,
            }],
        };
        let fetch = || FetchOffsets {
            group_id: "g".into(),
            topics: Some(vec![("t".into(), vec![0])]),
        };
        assert_eq!(h.addr.send(txn(3, 10)).await.unwrap(), Ok(Ok(())));
        assert_eq!(
            h.addr.send(txn(2, 11)).await.unwrap(),
            Ok(Err(ResponseError::InvalidProducerEpoch)),
            "an older epoch of the producer is refused"
        );
        let got = h.addr.send(fetch()).await.unwrap().unwrap();
        assert!(got[0].value.is_none() && got[0].pending, "{got:?}");
        h.addr.send(StopCoordinator).await.unwrap();
        // The pending offset survives a takeover, and the marker commits it.
        let next = GroupCoordinator::start(
            spec(d.path(), 2),
            fs.clone(),
            crate::clock::real(),
            &arbiter.handle(),
        );
        until_loaded(&next).await;
        let got = next.addr.send(fetch()).await.unwrap().unwrap();
        assert!(got[0].value.is_none() && got[0].pending, "{got:?}");
        let end = |commit| CompleteTxnOffsets {
            producer_id: 7,
            producer_epoch: 3,
            commit,
        };
        assert_eq!(next.addr.send(end(true)).await.unwrap(), Ok(()));
        assert_eq!(
            next.addr.send(end(true)).await.unwrap(),
            Ok(()),
            "idempotent"
        );
        let got = next.addr.send(fetch()).await.unwrap().unwrap();
        assert_eq!(got[0].value.as_ref().map(|v| v.offset), Some(10));
        assert!(!got[0].pending);
        // An aborted one is dropped.
        assert_eq!(next.addr.send(txn(4, 20)).await.unwrap(), Ok(Ok(())));
        assert_eq!(next.addr.send(end(false)).await.unwrap(), Ok(()));
        let got = next.addr.send(fetch()).await.unwrap().unwrap();
        assert_eq!(got[0].value.as_ref().map(|v| v.offset), Some(10));
        assert!(!got[0].pending);
        next.addr.send(StopCoordinator).await.unwrap();
    }

    #[actix_rt::test]
    async fn commits_survive_a_takeover_and_stale_generations_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let fs: SharedFs = Arc::new(RealFs);
        let arbiter = actix::Arbiter::new();
        let h = GroupCoordinator::start(
            spec(d.path(), 1),
            fs.clone(),
            crate::clock::real(),
            &arbiter.handle(),
        );
        until_loaded(&h).await;
        let first = h.addr.send(join("")).await.unwrap().unwrap();
        assert_eq!(first.error, Some(ResponseError::MemberIdRequired));
        let joined = h.addr.send(join(&first.member_id)).await.unwrap().unwrap();
        assert_eq!(joined.error, None);
        let (m, generation) = (joined.member_id.clone(), joined.generation_id);
        let synced = h
            .addr
            .send(SyncGroupRequest(SyncGroup {
                group_id: "g".into(),
                generation_id: generation,
                member_id: m.clone(),
                assignments: vec![(m.clone(), vec![9])],
                ..SyncGroup::default()
            }))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(synced.assignment, vec![9]);
        assert_eq!(
            h.addr.send(commit(&m, generation, 42)).await.unwrap(),
            Ok(Ok(()))
        );
        assert_eq!(
            h.addr.send(commit(&m, generation + 1, 43)).await.unwrap(),
            Ok(Err(ResponseError::IllegalGeneration))
        );
        h.addr.send(StopCoordinator).await.unwrap();

        let next = GroupCoordinator::start(
            spec(d.path(), 2),
            fs.clone(),
            crate::clock::real(),
            &arbiter.handle(),
        );
        until_loaded(&next).await;
        let got = next
            .addr
            .send(FetchOffsets {
                group_id: "g".into(),
                topics: None,
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].value.as_ref().unwrap().offset, 42);
        let listed = next.addr.send(ListGroupsRequest).await.unwrap().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].protocol_type, "consumer");

        // A second owner granted the same epoch (a deposed controller's
        // late write) is fenced by the claim.
        let mut other = spec(d.path(), 2);
        other.owner = Some(ClaimOwner {
            broker_id: 1,
            incarnation: 9,
        });
        let zombie = GroupCoordinator::start(other, fs, crate::clock::real(), &arbiter.handle());
        until_loaded(&zombie).await;
        assert_eq!(
            zombie.addr.send(ListGroupsRequest).await.unwrap().err(),
            Some(CoordinatorError::NotCoordinator)
        );
        next.addr.send(StopCoordinator).await.unwrap();
        arbiter.stop();
    }
}
