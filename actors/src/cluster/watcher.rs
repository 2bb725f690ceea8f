//! `AssignmentWatcher`: reads `<cluster>/assignment.json` by exact name
//! every poll (re-opening it each time is what gives close-to-open
//! freshness; there is no inotify across hosts), and makes this broker lead
//! exactly what the newest version grants to its current incarnation: it
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

use super::membership::{HeartbeatNow, Membership, Shared};
use super::records::{Assignment, ASSIGNMENT};
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
    /// The bytes last parsed and what they parsed to: an
    /// unchanged file is re-read every poll (that is what gives
    /// close-to-open freshness) but not re-parsed — at 10,000 partitions
    /// the parse was most of an idle broker's CPU.
    last: Option<(Vec<u8>, Arc<Assignment>)>,
    /// The assignment last applied (what a periodic re-apply applies).
    applied_assignment: Option<Arc<Assignment>>,
}

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
            applied_assignment: None,
        }
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
        let path = self.shared.cluster_dir.join(ASSIGNMENT);
        let a = match self.read(&path) {
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
        // Never what the file holds unless it is newer: that may be a
        // deposed controller's late, older write.
        if self.ticks.is_multiple_of(20) {
            if let Some(prev) = self.applied_assignment.clone() {
                return Some(self.start(prev, inc, true));
            }
        }
        None
    }

    /// The assignment file by exact name, parsed only when its bytes differ
    /// from the last parse.
    fn read(&mut self, path: &std::path::Path) -> std::io::Result<Option<Arc<Assignment>>> {
        let bytes = match self.fs.read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if let Some((lb, a)) = &self.last {
            if *lb == bytes {
                return Ok(Some(a.clone()));
            }
        }
        let a: Assignment = serde_json::from_slice(&bytes).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })?;
        let a = Arc::new(a);
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
            "(reads assignment.json)",
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
        self.tick(ctx);
    }
}
