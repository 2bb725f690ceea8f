//! `AssignmentWatcher`: follows the assignment history
//! ([`super::history`]) by exact name every poll (re-opening each time is
//! what gives close-to-open freshness; there is no inotify across hosts):
//! it starts from the checkpoint, then folds versions `v+1`, `v+2` … strictly
//! in order up to the history's head, stopping before a torn one (never
//! applied). An idle poll costs one read of the tiny `assignment/head` (a
//! fixed name, close-to-open fresh; a version is opened only once the head
//! — or, while there is no head, a listing — names it, so an NFS client never
//! caches "no such file" for it). It makes this broker
//! lead exactly what the newest version grants to its current incarnation: it
//! stops leaders it lost (awaiting their final fsync and close), starts the
//! ones it gained, feeds the metadata cache, and only then reports the
//! version applied in its heartbeat — the controller's signal that a
//! partition taken away is released.
//!
//! When the lease lapses it stops every leader of the spent incarnation and
//! marks it fenced, which lets [`super::membership::Membership`] start a
//! new one.
//!
//! The decisions live in [`WatcherState`] (plain Rust: it reads the file and
//! says what to apply); [`AssignmentWatcher`] is the actix glue that runs
//! the [`LeaderSink`] and reports back.

use super::history::{self, Probe};
use super::membership::{HeartbeatNow, Membership, Shared};
use super::records::Assignment;
use crate::telemetry::{ActorStats, Mailbox, MessageName};
use actix::prelude::*;
use futures::future::LocalBoxFuture;
use kaas_volume::fs::SharedFs;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What the watcher drives: the broker's registry of partition leaders and
/// its metadata cache.
pub trait LeaderSink: Send + Sync + 'static {
    /// Publish `a` as the metadata view, and lead exactly the partitions it
    /// grants to `(broker_id, incarnation)`. With `lead` false (the lease
    /// lapsed) stop every leader and leave the metadata view as it was. The
    /// future resolves once every leader no longer granted has stopped.
    fn apply(
        &self,
        a: Arc<Assignment>,
        incarnation: u64,
        lead: bool,
    ) -> LocalBoxFuture<'static, ()>;
}

/// One application of an assignment to the [`LeaderSink`].
#[derive(Debug, Clone)]
pub struct Apply {
    /// The assignment (empty when `lead` is false).
    pub assignment: Arc<Assignment>,
    /// The incarnation it is applied for.
    pub incarnation: u64,
    /// False: the lease lapsed; stop every leader of `incarnation`.
    pub lead: bool,
}

/// The watcher's logic without actix: which assignment to apply, and what
/// applying it means for the broker's published state.
pub struct WatcherState {
    fs: SharedFs,
    shared: Arc<Shared>,
    /// (controller epoch, version, incarnation) last applied.
    applied: Option<(i32, u64, u64)>,
    busy: bool,
    failures: u64,
    ticks: u64,
    /// The checkpoint bytes last parsed and what they parsed to: a
    /// checkpoint is re-read only when the history cannot be followed
    /// (none yet, or pruned past us), and re-parsed only when it changed.
    last: Option<(Vec<u8>, Arc<Assignment>)>,
    /// The history folded as far as it is complete (may be ahead of what
    /// is applied while an application is in flight).
    current: Option<Arc<Assignment>>,
    /// The assignment last applied (what a periodic re-apply applies).
    applied_assignment: Option<Arc<Assignment>>,
    /// When the head was last read (our clock), and whether the next poll
    /// must read it (see [`WatcherState::nudge`]).
    head_read_at: Option<std::time::Duration>,
    nudged: bool,
}

/// While this host's controller is elected the head is read at least this
/// often (the controller nudges the watcher after each version it
/// publishes; this is the safety net for one it did not write).
pub const HEAD_EVERY_WHILE_CONTROLLER: std::time::Duration = std::time::Duration::from_secs(1);

impl WatcherState {
    /// Nothing applied yet.
    pub fn new(fs: SharedFs, shared: Arc<Shared>) -> Self {
        Self {
            fs,
            shared,
            applied: None,
            busy: false,
            failures: 0,
            ticks: 0,
            last: None,
            current: None,
            applied_assignment: None,
            head_read_at: None,
            nudged: false,
        }
    }

    /// Read the head on the next poll (this host's controller published,
    /// or an application just ended).
    pub fn nudge(&mut self) {
        self.nudged = true;
    }

    /// (controller epoch, version, incarnation) last applied.
    pub fn applied(&self) -> Option<(i32, u64, u64)> {
        self.applied
    }

    /// One poll: what to apply now, if anything. While an application is in
    /// flight nothing new starts; [`Self::done`] ends it.
    pub fn poll(&mut self) -> Option<Apply> {
        self.shared
            .watcher_tick
            .store(self.shared.now_ns(), Ordering::Release);
        if self.busy {
            return None;
        }
        let lease = self.shared.lease.clone();
        let inc = lease.incarnation();
        if !lease.valid_for(inc) {
            if lease.lapsed() && self.shared.fenced_incarnation.load(Ordering::Acquire) != inc {
                // Drop every leader of the spent incarnation (the metadata
                // cache is kept: the volume may be unreachable right now).
                return Some(self.start(Arc::default(), inc, false));
            }
            return None;
        }
        let a = match self.follow() {
            Ok(Some(a)) => a,
            Ok(None) => return None,
            Err(e) => {
                self.failures += 1;
                if self.failures % 50 == 1 {
                    tracing::warn!(error = %e, "assignment unreadable; keeping the last applied one");
                }
                return None;
            }
        };
        let newer = match self.applied {
            None => true,
            Some((e, v, i)) => a.newer_than(e, v) || i != inc,
        };
        self.ticks += 1;
        if newer {
            return Some(self.start(a, inc, true));
        }
        // Re-apply what was applied now and then: applying is idempotent,
        // and it restarts a leader that a failed topic deletion stopped.
        // Never anything not newer than what was applied.
        if self.ticks.is_multiple_of(20) {
            if let Some(prev) = self.applied_assignment.clone() {
                return Some(self.start(prev, inc, true));
            }
        }
        None
    }

    /// The newest assignment the history gives: the one folded so far,
    /// moved forward through every complete version up to the head (in
    /// order; a torn one stops the fold until it is complete). A version is
    /// opened only once the head (or, without a head, a listing) names it,
    /// so no "no such file" for it is
    /// ever cached (NFS). Falls back to the checkpoint when there is nothing
    /// folded yet, or when the next version is gone (pruned past us:
    /// versions are removed lowest first) or the history has no head (a
    /// checkpoint-only cluster) — taking the checkpoint only if newer.
    fn follow(&mut self) -> std::io::Result<Option<Arc<Assignment>>> {
        let cluster = self.shared.cluster_dir.clone();
        let fs = self.fs.clone();
        let mut cur = match self.current.clone() {
            Some(c) => c,
            None => match self.checkpoint()? {
                Some(c) => c,
                None => Arc::new(Assignment::default()),
            },
        };
        // While this host's controller is elected, every version it
        // publishes nudges us: between nudges the head is read only now and
        // then (an idle controller's broker read it ten times a second).
        let now = self.shared.clock().now();
        let skip = self.current.is_some()
            && !std::mem::take(&mut self.nudged)
            && self.shared.leading_controller.load(Ordering::Acquire)
            && self
                .head_read_at
                .is_some_and(|t| now.saturating_sub(t) < HEAD_EVERY_WHILE_CONTROLLER);
        if skip {
            return Ok(Some(cur));
        }
        self.head_read_at = Some(now);
        let head = history::read_head(fs.as_ref(), &cluster)?;
        let mut stuck = false;
        match head {
            Some(h) if h > cur.version => {
                let mut a = (*cur).clone();
                let from = a.version;
                while a.version < h {
                    match history::probe(fs.as_ref(), &cluster, a.version + 1)? {
                        Probe::Found(d) => d.apply_to(&mut a),
                        Probe::Torn => break,
                        Probe::Absent => {
                            stuck = a.version == from;
                            break;
                        }
                    }
                }
                if a.version > from {
                    cur = Arc::new(a);
                }
            }
            Some(_) => {}
            // No head (yet): a checkpoint-only cluster, or a head write
            // that failed. Then a listing names the versions: open only
            // those (an exact-name probe of one not created yet would cache
            // "no such file" on NFS), and check the checkpoint.
            None => {
                let listed = history::listed_versions(fs.as_ref(), &cluster)?;
                let mut a = (*cur).clone();
                let from = a.version;
                while listed.contains(&(a.version + 1)) {
                    match history::probe(fs.as_ref(), &cluster, a.version + 1)? {
                        Probe::Found(d) => d.apply_to(&mut a),
                        Probe::Torn | Probe::Absent => break,
                    }
                }
                if a.version > from {
                    cur = Arc::new(a);
                } else {
                    stuck = cur.version == 0 || !listed.contains(&cur.version);
                }
            }
        }
        if stuck {
            if let Some(c) = self.checkpoint()? {
                if c.newer_than(cur.controller_epoch, cur.version) {
                    cur = c;
                }
            }
        }
        if cur.version == 0 && cur.controller_epoch == 0 {
            return Ok(None);
        }
        self.current = Some(cur.clone());
        Ok(Some(cur))
    }

    /// The checkpoint by exact name, parsed only when its bytes differ from
    /// the last parse.
    fn checkpoint(&mut self) -> std::io::Result<Option<Arc<Assignment>>> {
        let cluster = self.shared.cluster_dir.clone();
        let Some(bytes) = history::read_checkpoint(self.fs.as_ref(), &cluster)? else {
            return Ok(None);
        };
        if let Some((lb, a)) = &self.last {
            if *lb == bytes {
                return Ok(Some(a.clone()));
            }
        }
        let a = Arc::new(history::parse_checkpoint(&cluster, &bytes)?);
        self.last = Some((bytes, a.clone()));
        Ok(Some(a))
    }

    fn start(&mut self, assignment: Arc<Assignment>, incarnation: u64, lead: bool) -> Apply {
        self.busy = true;
        Apply {
            assignment,
            incarnation,
            lead,
        }
    }

    /// The sink finished applying `a`: record it (and publish it for the
    /// next heartbeat), or — after a lapse — mark the incarnation fenced so
    /// Membership may start a new one. Returns whether to heartbeat now.
    pub fn done(&mut self, a: &Apply) -> bool {
        self.busy = false;
        if a.lead {
            let (e, v) = (a.assignment.controller_epoch, a.assignment.version);
            if self.applied.is_none_or(|(pe, pv, _)| (pe, pv) != (e, v)) {
                *self.shared.named.lock().unwrap() = a.assignment.named_brokers();
            }
            self.applied = Some((e, v, a.incarnation));
            self.applied_assignment = Some(a.assignment.clone());
            self.shared.state.lock().unwrap().applied = (e, v);
            true
        } else {
            self.shared
                .fenced_incarnation
                .store(a.incarnation, Ordering::Release);
            self.applied = None;
            self.applied_assignment = None;
            false
        }
    }
}

/// See module docs.
pub struct AssignmentWatcher {
    state: WatcherState,
    shared: Arc<Shared>,
    sink: Arc<dyn LeaderSink>,
    membership: Mailbox<Membership>,
}

impl AssignmentWatcher {
    /// Start on `arbiter`.
    pub fn start(
        fs: SharedFs,
        shared: Arc<Shared>,
        sink: Arc<dyn LeaderSink>,
        membership: Mailbox<Membership>,
        arbiter: &ArbiterHandle,
    ) -> Mailbox<Self> {
        // It writes nothing: it reads the assignment file by exact name.
        let stats = ActorStats::register(
            "assignment_watcher",
            shared.broker_id.to_string(),
            "(reads the assignment history)",
        );
        let addr = AssignmentWatcher::start_in_arbiter(arbiter, move |_| AssignmentWatcher {
            state: WatcherState::new(fs, shared.clone()),
            shared,
            sink,
            membership,
        });
        Mailbox::new(addr, stats)
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        let Some(apply) = self.state.poll() else {
            return;
        };
        let fut = self
            .sink
            .apply(apply.assignment.clone(), apply.incarnation, apply.lead);
        ctx.spawn(fut.into_actor(self).map(move |_, act, ctx| {
            if act.state.done(&apply) {
                act.membership.do_send(HeartbeatNow);
            }
            // Something newer may have arrived meanwhile.
            ctx.notify(PollNow);
        }));
    }
}

impl Actor for AssignmentWatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.shared.timing.poll, |a, ctx| a.tick(ctx));
    }
}

/// Poll now (the in-process controller just wrote).
#[derive(Message)]
#[rtype(result = "()")]
pub struct PollNow;

impl MessageName for PollNow {
    const NAME: &'static str = "poll_now";
}

crate::instrumented!(AssignmentWatcher: PollNow);

impl Handler<PollNow> for AssignmentWatcher {
    type Result = ();
    fn handle(&mut self, _: PollNow, ctx: &mut Context<Self>) {
        self.state.nudge();
        self.tick(ctx);
    }
}
