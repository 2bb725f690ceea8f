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

use super::membership::{Beat, Membership, Shared};
use super::records::{read_json, Assignment, ASSIGNMENT};
use crate::fs::SharedFs;
use actix::prelude::*;
use futures::future::LocalBoxFuture;
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

/// See module docs.
pub struct AssignmentWatcher {
    fs: SharedFs,
    shared: Arc<Shared>,
    sink: Arc<dyn LeaderSink>,
    membership: Addr<Membership>,
    /// (controller epoch, version, incarnation) last applied.
    applied: Option<(i32, u64, u64)>,
    busy: bool,
    failures: u64,
    ticks: u64,
}

impl AssignmentWatcher {
    /// Start on `arbiter`.
    pub fn start(
        fs: SharedFs,
        shared: Arc<Shared>,
        sink: Arc<dyn LeaderSink>,
        membership: Addr<Membership>,
        arbiter: &ArbiterHandle,
    ) -> Addr<Self> {
        AssignmentWatcher::start_in_arbiter(arbiter, move |_| AssignmentWatcher {
            fs,
            shared,
            sink,
            membership,
            applied: None,
            busy: false,
            failures: 0,
            ticks: 0,
        })
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        self.shared.watcher_tick.store(
            super::lease::boot_now().as_nanos() as u64,
            Ordering::Release,
        );
        if self.busy {
            return;
        }
        let lease = self.shared.lease.clone();
        let inc = lease.incarnation();
        if !lease.valid_for(inc) {
            if lease.lapsed() && self.shared.fenced_incarnation.load(Ordering::Acquire) != inc {
                // Drop every leader of the spent incarnation (the metadata
                // cache is kept: the volume may be unreachable right now).
                self.run(ctx, Arc::default(), inc, false, None);
            }
            return;
        }
        let path = self.shared.cluster_dir.join(ASSIGNMENT);
        let a = match read_json::<Assignment>(self.fs.as_ref(), &path) {
            Ok(Some(a)) => a,
            Ok(None) => return,
            Err(e) => {
                self.failures += 1;
                if self.failures % 50 == 1 {
                    tracing::warn!(error = %e, "assignment unreadable; keeping the last applied one");
                }
                return;
            }
        };
        let newer = match self.applied {
            None => true,
            Some((e, v, i)) => a.newer_than(e, v) || i != inc,
        };
        // Re-apply the same version now and then: applying is idempotent,
        // and it restarts a leader that a failed topic deletion stopped.
        self.ticks += 1;
        if newer || self.ticks.is_multiple_of(20) {
            self.run(ctx, Arc::new(a), inc, true, Some(()));
        }
    }

    fn run(
        &mut self,
        ctx: &mut Context<Self>,
        a: Arc<Assignment>,
        inc: u64,
        lead: bool,
        report: Option<()>,
    ) {
        self.busy = true;
        let fut = self.sink.apply(a.clone(), inc, lead);
        ctx.spawn(fut.into_actor(self).map(move |_, act, ctx| {
            act.busy = false;
            if report.is_some() {
                act.applied = Some((a.controller_epoch, a.version, inc));
                act.shared.state.lock().unwrap().applied = (a.controller_epoch, a.version);
                act.membership.do_send(Beat);
            } else {
                act.shared.fenced_incarnation.store(inc, Ordering::Release);
                act.applied = None;
            }
            // Something newer may have arrived meanwhile.
            ctx.notify(Nudge);
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
pub struct Nudge;

impl Handler<Nudge> for AssignmentWatcher {
    type Result = ();
    fn handle(&mut self, _: Nudge, ctx: &mut Context<Self>) {
        self.tick(ctx);
    }
}
