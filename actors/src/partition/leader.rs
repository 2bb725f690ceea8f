//! `PartitionLeader`: the actor that owns one partition's writable files.
//!
//! It is a thin actix adapter around [`PartitionLog`]: appends go to the page
//! cache on the actor's arbiter, fsyncs run on the blocking pool (group
//! commit: whatever was appended while one fsync ran is covered by the next),
//! and acknowledgements are released only when the fsync covering them
//! returns. Any I/O error stops the actor; its [`actix::Supervisor`] restarts
//! it, and `started` re-opens the log, which re-runs recovery from the files:
//! that is the re-drive. Restarts are counted in telemetry.

use super::claim::ClaimOwner;
use super::log::{LogConfig, LogError, PartitionLog};
use super::messages::{AppendBatches, AppendTicket, EnforceRetention, PartitionError, StopLeader};
use super::reader::PartitionReader;
use crate::cluster::lease::Lease;
use crate::fs::SharedFs;
use crate::telemetry::{self, ActorInfo, HandleTimer, KindStats};
use actix::prelude::*;
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
    /// The leader's address (appends, control).
    pub addr: Addr<PartitionLeader>,
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
    log: Option<PartitionLog>,
    waiters: VecDeque<(i64, oneshot::Sender<Result<i64, PartitionError>>)>,
    syncing: bool,
    stopping: bool,
    hw_tx: watch::Sender<i64>,
    reader: ReaderSlot,
    kind: Arc<KindStats>,
    restarts: u64,
    failures: u32,
    last_error: Option<PartitionError>,
    handled: u64,
    /// Set when this owner failed mid-write: (base, durable size) of the
    /// active segment, so the restart never trusts bytes after it.
    failed_at: Option<(i64, u64)>,
}

/// Wall-clock milliseconds (segment ages and retention only; never compared
/// across hosts).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl PartitionLeader {
    /// Start a supervised leader on `arbiter`.
    pub fn start(
        spec: LeaderSpec,
        fs: SharedFs,
        arbiter: &actix::ArbiterHandle,
    ) -> PartitionHandle {
        let (hw_tx, hw) = watch::channel(-1);
        let reader: ReaderSlot = Arc::new(RwLock::new(None));
        let slot = reader.clone();
        let addr = Supervisor::start_in_arbiter(arbiter, move |_| PartitionLeader {
            spec,
            fs,
            log: None,
            waiters: VecDeque::new(),
            syncing: false,
            stopping: false,
            hw_tx,
            reader: slot,
            kind: telemetry::global().kind(KIND),
            restarts: 0,
            failures: 0,
            last_error: None,
            handled: 0,
            failed_at: None,
        });
        PartitionHandle { addr, reader, hw }
    }

    fn id(&self) -> String {
        format!("{}-{}", self.spec.topic, self.spec.partition)
    }

    fn publish_info(&self) {
        telemetry::global().upsert_actor(
            self.id(),
            ActorInfo {
                kind: KIND,
                owns: self.spec.dir.display().to_string(),
                epoch: self.spec.epoch as i64,
                restarts: self.restarts,
                handled: self.handled,
            },
        );
    }

    fn lease_valid(&self) -> bool {
        self.spec
            .lease
            .as_ref()
            .is_none_or(|(l, inc)| l.valid_for(*inc))
    }

    /// The lease lapsed: another broker may own the partition by now. Drop
    /// everything unacknowledged (it may or may not survive in the file;
    /// it was never promised) and go dormant; the watcher stops us.
    fn fenced(&mut self, ctx: &mut Context<Self>) {
        tracing::error!(topic = %self.spec.topic, partition = self.spec.partition, epoch = self.spec.epoch, "lease lapsed: acknowledging nothing more");
        let err = PartitionError::NotLeader("broker lease lapsed".into());
        for (_, tx) in self.waiters.drain(..) {
            let _ = tx.send(Err(err.clone()));
        }
        *self.reader.write().unwrap() = None;
        self.log = None;
        self.stopping = true;
        self.last_error = Some(err);
        ctx.stop();
    }

    fn unavailable(&self) -> PartitionError {
        self.last_error
            .clone()
            .unwrap_or_else(|| PartitionError::Storage("partition is recovering".into()))
    }

    /// Fail every waiter and stop: the supervisor restarts us, and the
    /// restart recovers from what is durable. Never retry a failed fsync.
    fn fail(&mut self, err: PartitionError, ctx: &mut Context<Self>) {
        tracing::error!(topic = %self.spec.topic, partition = self.spec.partition, error = %err, "partition leader failed; restarting");
        for (_, tx) in self.waiters.drain(..) {
            let _ = tx.send(Err(err.clone()));
        }
        if let Some(log) = &self.log {
            self.failed_at = Some(log.durable_point());
        }
        self.last_error = Some(err);
        ctx.stop();
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
            let (_, tx) = self.waiters.pop_front().expect("front exists");
            let _ = tx.send(Ok(hw));
        }
        self.hw_tx.send_replace(hw);
        true
    }

    fn kick_sync(&mut self, ctx: &mut Context<Self>) {
        if self.syncing {
            return;
        }
        let Some(t) = self.log.as_ref().and_then(|l| l.sync_target()) else {
            return;
        };
        self.syncing = true;
        let job = actix_rt::task::spawn_blocking(move || {
            let r = t.file.sync_data();
            (t, r)
        });
        ctx.spawn(job.into_actor(self).map(|res, act, ctx| {
            act.syncing = false;
            match res {
                Ok((_, Ok(()))) if !act.lease_valid() => act.fenced(ctx),
                Ok((t, Ok(()))) => {
                    telemetry::global().fsyncs.fetch_add(1, Ordering::Relaxed);
                    if let Some(log) = act.log.as_mut() {
                        log.complete_sync(t);
                    }
                    act.after_durable(ctx);
                }
                Ok((_, Err(e))) => act.fail(PartitionError::Storage(format!("fsync: {e}")), ctx),
                Err(e) => act.fail(PartitionError::Storage(format!("fsync task: {e}")), ctx),
            }
        }));
    }

    fn after_durable(&mut self, ctx: &mut Context<Self>) {
        if !self.release() {
            return self.fenced(ctx);
        }
        let now = now_ms();
        if let Some(log) = self.log.as_mut() {
            let res = if log.roll_due(now) {
                log.roll(now)
            } else if log.checkpoint_due() && !log.dirty() {
                log.checkpoint()
            } else {
                Ok(())
            };
            if let Err(e) = res {
                return self.fail(storage(e), ctx);
            }
        }
        // A roll fsyncs inline: release() re-checks the lease.
        if !self.release() {
            return self.fenced(ctx);
        }
        self.kick_sync(ctx);
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.syncing {
            return;
        }
        let now = now_ms();
        if let Some(log) = self.log.as_mut() {
            if !log.dirty() && log.roll_due(now) {
                if let Err(e) = log.roll(now) {
                    self.fail(storage(e), ctx);
                }
            }
        }
    }
}

fn storage(e: LogError) -> PartitionError {
    match e {
        LogError::Fenced { .. } => PartitionError::NotLeader(e.to_string()),
        LogError::Overflow => PartitionError::TooLarge,
        e => PartitionError::Storage(e.to_string()),
    }
}

impl Actor for PartitionLeader {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(256);
        self.kind.live.fetch_add(1, Ordering::Relaxed);
        if self.stopping {
            return;
        }
        if !self.lease_valid() {
            // Never open (and sweep) under a lapsed lease: a newer leader
            // may own the files by now.
            self.stopping = true;
            self.last_error = Some(PartitionError::NotLeader("broker lease lapsed".into()));
            return;
        }
        self.publish_info();
        match PartitionLog::open_as(
            self.fs.clone(),
            &self.spec.dir,
            self.spec.epoch,
            self.spec.owner,
            self.spec.cfg.clone(),
            now_ms(),
            self.failed_at,
        ) {
            Ok(log) => {
                self.failed_at = None;
                tracing::info!(topic = %self.spec.topic, partition = self.spec.partition, epoch = self.spec.epoch, hw = log.high_watermark(), "partition leader open");
                *self.reader.write().unwrap() =
                    Some(PartitionReader::new(self.fs.clone(), log.view()));
                self.hw_tx.send_replace(log.high_watermark());
                self.log = Some(log);
                self.failures = 0;
                self.last_error = None;
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
                self.last_error = Some(PartitionError::NotLeader(format!(
                    "epoch {found} owns this partition"
                )));
            }
            Err(e) => {
                // Re-drive: stop after a backoff; the supervisor restarts us.
                self.failures += 1;
                let backoff = Duration::from_millis(100u64 << self.failures.min(6));
                tracing::error!(topic = %self.spec.topic, partition = self.spec.partition, error = %e, ?backoff, "partition open failed");
                self.last_error = Some(storage(e));
                ctx.run_later(backoff, |_, ctx| ctx.stop());
                return;
            }
        }
        ctx.run_interval(Duration::from_millis(500), |a, ctx| a.tick(ctx));
        ctx.run_interval(self.spec.retention_check, |a, ctx| {
            let now = now_ms();
            if !a.lease_valid() {
                return a.fenced(ctx);
            }
            if let Some(log) = a.log.as_mut() {
                match log.enforce_retention(now) {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(topic = %a.spec.topic, partition = a.spec.partition, segments = n, log_start = log.log_start_offset(), "retention removed segments");
                    }
                    Err(e) => a.fail(storage(e), ctx),
                }
            }
        });
    }

    fn stopping(&mut self, _ctx: &mut Context<Self>) -> Running {
        Running::Stop
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.kind.live.fetch_sub(1, Ordering::Relaxed);
        if self.stopping {
            telemetry::global().remove_actor(&self.id());
        }
    }
}

impl Supervised for PartitionLeader {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        if self.stopping {
            return;
        }
        self.restarts += 1;
        self.kind.restarts.fetch_add(1, Ordering::Relaxed);
        *self.reader.write().unwrap() = None;
        self.log = None;
        self.syncing = false;
        let err = self.unavailable();
        for (_, tx) in self.waiters.drain(..) {
            let _ = tx.send(Err(err.clone()));
        }
    }
}

impl Handler<AppendBatches> for PartitionLeader {
    type Result = Result<AppendTicket, PartitionError>;

    fn handle(&mut self, msg: AppendBatches, ctx: &mut Context<Self>) -> Self::Result {
        let _t = HandleTimer::start(&self.kind, "append_batches", msg.sent_at);
        self.handled += 1;
        if !self.lease_valid() {
            self.fenced(ctx);
            return Err(self.unavailable());
        }
        let Some(log) = self.log.as_mut() else {
            return Err(self.unavailable());
        };
        let appended = match log.append(&msg.records, &msg.infos) {
            Ok(a) => a,
            Err(LogError::Overflow) => return Err(PartitionError::TooLarge),
            Err(e) => {
                let err = storage(e);
                self.fail(err.clone(), ctx);
                return Err(err);
            }
        };
        telemetry::global()
            .produce_bytes
            .fetch_add(msg.records.len() as u64, Ordering::Relaxed);
        let log_start_offset = log.log_start_offset();
        let durable = if msg.wait_durable {
            let (tx, rx) = oneshot::channel();
            self.waiters.push_back((appended.last_offset, tx));
            Some(rx)
        } else {
            None
        };
        self.kick_sync(ctx);
        Ok(AppendTicket {
            base_offset: appended.base_offset,
            log_start_offset,
            durable,
        })
    }
}

impl Handler<EnforceRetention> for PartitionLeader {
    type Result = Result<usize, PartitionError>;

    fn handle(&mut self, msg: EnforceRetention, ctx: &mut Context<Self>) -> Self::Result {
        let _t = HandleTimer::start(&self.kind, "enforce_retention", msg.sent_at);
        if !self.lease_valid() {
            self.fenced(ctx);
            return Err(self.unavailable());
        }
        let Some(log) = self.log.as_mut() else {
            return Err(self.unavailable());
        };
        match log.enforce_retention(now_ms()) {
            Ok(n) => Ok(n),
            Err(e) => {
                let err = storage(e);
                self.fail(err.clone(), ctx);
                Err(err)
            }
        }
    }
}

impl Handler<StopLeader> for PartitionLeader {
    type Result = ();

    fn handle(&mut self, msg: StopLeader, ctx: &mut Context<Self>) {
        let _t = HandleTimer::start(&self.kind, "stop_leader", msg.sent_at);
        if !self.lease_valid() {
            return self.fenced(ctx);
        }
        self.stopping = true;
        if let Some(mut log) = self.log.take() {
            let res = log.sync_now().map(|_| ());
            // Waiters covered by that sync are durable: release them (not
            // if the lease lapsed meanwhile: they are failed below).
            self.log = Some(log);
            let _ = self.release();
            let log = self.log.take().expect("just put back");
            if let Err(e) = res.and_then(|_| log.close()) {
                tracing::error!(topic = %self.spec.topic, partition = self.spec.partition, error = %e, "close failed; next open recovers");
            }
        }
        *self.reader.write().unwrap() = None;
        let err = PartitionError::NotLeader("partition leader stopped".into());
        for (_, tx) in self.waiters.drain(..) {
            let _ = tx.send(Err(err.clone()));
        }
        self.last_error = Some(err);
        // A supervised actor restarts while anyone holds its address; the
        // restart sees `stopping` and stays dormant, answering NOT_LEADER,
        // until the last address is dropped.
        ctx.stop();
    }
}
