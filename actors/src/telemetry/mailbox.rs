//! The one instrumented path every actor message takes.
//!
//! A sender holds a [`Mailbox`] instead of a bare `Addr`: each message it
//! sends is wrapped in a [`Traced`] envelope that counts in the mailbox depth
//! of its actor and of its kind from the moment it is enqueued until the
//! handler returns — or until it is dropped unhandled (the actor stopped),
//! so the depth never drifts. Work an actor accepts and finishes later is
//! counted on by an [`Owed`] its sender holds. The actor side is one generic handler per actor
//! type, written by [`instrumented!`](crate::instrumented): it records the
//! queue wait and the handling time by (kind, message type) and then calls
//! the actor's own `Handler<M>`. Nothing else in an actor is about telemetry.

use super::{global, Histogram, KindStats};
use actix::dev::{Request, ToEnvelope};
use actix::{Actor, Addr, Handler, MailboxError, Message};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A message's name in metrics (`message` label): a short snake_case noun.
pub trait MessageName {
    /// The label value.
    const NAME: &'static str;
}

/// What one actor reports: its kind and identity, the file it owns, its
/// epoch, mailbox depth, messages handled, restarts and last error. One per
/// live actor, registered in [`super::Telemetry::actors`] while it lives.
pub struct ActorStats {
    /// Actor kind, e.g. `partition_leader` (the Prometheus label).
    pub kind: &'static str,
    /// Identity within the kind, e.g. `orders-3`.
    pub id: String,
    kind_stats: Arc<KindStats>,
    depth: AtomicI64,
    handled: AtomicU64,
    restarts: AtomicU64,
    epoch: AtomicI64,
    /// Handling time of this actor's messages (all types): its p50/p99.
    handling: Histogram,
    /// fsyncs of the files this actor owns, and their latency.
    fsyncs: AtomicU64,
    fsync: Histogram,
    detail: Mutex<Detail>,
    /// Rates over the last sampling interval (see [`super::rates`]).
    pub(super) window: Mutex<super::rates::Window>,
}

#[derive(Default, Clone)]
struct Detail {
    owns: String,
    last_error: Option<String>,
}

impl ActorStats {
    /// Register a new actor (its row replaces any previous one of the same
    /// kind and id).
    pub fn register(
        kind: &'static str,
        id: impl Into<String>,
        owns: impl Into<String>,
    ) -> Arc<Self> {
        let t = global();
        let s = Arc::new(Self {
            kind,
            id: id.into(),
            kind_stats: t.kind(kind),
            depth: AtomicI64::new(0),
            handled: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            epoch: AtomicI64::new(-1),
            handling: Histogram::default(),
            fsyncs: AtomicU64::new(0),
            fsync: Histogram::default(),
            window: Mutex::default(),
            detail: Mutex::new(Detail {
                owns: owns.into(),
                last_error: None,
            }),
        });
        s.kind_stats.live.fetch_add(1, Ordering::Relaxed);
        t.register_actor(s.clone());
        s
    }

    /// Remove the actor's row (it stopped for good).
    pub fn deregister(self: &Arc<Self>) {
        if global().deregister_actor(self) {
            self.kind_stats.live.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Messages enqueued for this actor and not yet handled (or dropped).
    pub fn depth(&self) -> i64 {
        self.depth.load(Ordering::Relaxed)
    }

    /// Messages handled.
    pub fn handled(&self) -> u64 {
        self.handled.load(Ordering::Relaxed)
    }

    /// Count a supervisor restart.
    pub fn restarted(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        self.kind_stats.restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// Restarts so far.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Set the epoch (or term) the actor writes under.
    pub fn set_epoch(&self, epoch: i64) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    /// Set the file (or directory) the actor owns.
    pub fn set_owns(&self, owns: impl Into<String>) {
        self.detail.lock().unwrap().owns = owns.into();
    }

    /// Record the last error (None once healthy again). A new error counts
    /// in `kaas_actor_errors_total` of the kind.
    pub fn set_error(&self, e: Option<String>) {
        let mut d = self.detail.lock().unwrap();
        if e.is_some() && d.last_error != e {
            self.kind_stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        d.last_error = e;
    }

    /// Count one completed fsync of a file this actor owns, and its latency
    /// (per actor for the dashboard, process-wide for Prometheus).
    pub fn fsynced(&self, took: std::time::Duration) {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.fsync.observe(took);
        let t = global();
        t.fsyncs.fetch_add(1, Ordering::Relaxed);
        t.fsync_seconds.observe(took);
    }

    /// fsyncs completed.
    pub fn fsyncs(&self) -> u64 {
        self.fsyncs.load(Ordering::Relaxed)
    }

    /// Fold the counters since the previous call into the rates shown on
    /// the dashboard (messages/s, p50/p99 handling, fsyncs/s, fsync p99);
    /// `secs` is the time since that call.
    pub(super) fn sample(&self, secs: f64) {
        let handled = self.handled();
        let fsyncs = self.fsyncs();
        let h = self.handling.snapshot();
        let f = self.fsync.snapshot();
        self.window
            .lock()
            .unwrap()
            .advance(secs, handled, fsyncs, &h, &f);
    }

    /// The JSON row of this actor.
    pub fn info(&self) -> super::ActorRow {
        let d = self.detail.lock().unwrap().clone();
        let w = self.window.lock().unwrap().clone();
        super::ActorRow {
            kind: self.kind,
            id: self.id.clone(),
            supervisor: super::supervisor_of(self.kind),
            messages_per_sec: w.messages_per_sec,
            handle_p50_ms: w.handle_p50_ms,
            handle_p99_ms: w.handle_p99_ms,
            fsyncs: self.fsyncs(),
            fsyncs_per_sec: w.fsyncs_per_sec,
            fsync_p99_ms: w.fsync_p99_ms,
            owns: d.owns,
            epoch: self.epoch.load(Ordering::Relaxed),
            restarts: self.restarts(),
            handled: self.handled(),
            mailbox_depth: self.depth().max(0),
            last_error: d.last_error,
        }
    }

    fn enqueue(self: &Arc<Self>) -> DepthGuard {
        self.depth.fetch_add(1, Ordering::Relaxed);
        self.kind_stats
            .mailbox_depth
            .fetch_add(1, Ordering::Relaxed);
        DepthGuard(self.clone())
    }
}

/// Counts one message in its mailbox depth until dropped.
struct DepthGuard(Arc<ActorStats>);

impl Drop for DepthGuard {
    fn drop(&mut self) {
        self.0.depth.fetch_sub(1, Ordering::Relaxed);
        self.0
            .kind_stats
            .mailbox_depth
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// A message on its way to an actor (see the module docs).
pub struct Traced<M> {
    msg: M,
    sent_at: Instant,
    /// `None` once moved into an [`Owed`] ([`Self::owed`]).
    depth: Option<DepthGuard>,
    stats: Arc<ActorStats>,
}

impl<M: Message> Message for Traced<M>
where
    M::Result: 'static,
{
    type Result = M::Result;
}

impl<M> Traced<M> {
    /// Move this message's count in the depth into an [`Owed`] its sender
    /// keeps until the answer is complete (an append handed over to a
    /// writer loop, answered after its fsync): counted once, from the
    /// hand-over to the answer. `None` if already moved.
    pub fn owed(&mut self) -> Option<Owed> {
        self.depth.take().map(Owed)
    }
}

impl<M: MessageName> Traced<M> {
    /// Take the message out at the start of handling: its queue wait is
    /// recorded, and the returned timer records the handling time when
    /// dropped. The message stays in the depth until then: an actor stuck
    /// in a handler (a write to a hung volume) is backed up by that message
    /// even when its senders wait for it one at a time and its queue is
    /// empty.
    pub fn open(self) -> (M, HandlingTimer) {
        let stats = self.stats;
        let msg_stats = stats.kind_stats.message(M::NAME);
        let now = Instant::now();
        msg_stats
            .queue_wait
            .observe(now.saturating_duration_since(self.sent_at));
        (
            self.msg,
            HandlingTimer {
                actor: stats,
                stats: msg_stats,
                start: now,
                _depth: self.depth,
            },
        )
    }
}

/// Records handling time (and counts the message) when dropped.
pub struct HandlingTimer {
    actor: Arc<ActorStats>,
    stats: Arc<super::MessageStats>,
    start: Instant,
    /// Leaves the depth when handling ends.
    _depth: Option<DepthGuard>,
}

impl Drop for HandlingTimer {
    fn drop(&mut self) {
        let took = self.start.elapsed();
        self.actor.handled.fetch_add(1, Ordering::Relaxed);
        self.actor.handling.observe(took);
        self.stats.handled.fetch_add(1, Ordering::Relaxed);
        self.stats.handling.observe(took);
    }
}

/// Work an actor accepted but still owes its sender, counted in the
/// actor's (and its kind's) mailbox depth until dropped.
///
/// Why this exists: a partition leader answers an append at once with a
/// ticket and finishes it later (the group-commit fsync). Counting a
/// message only while it sits in the actix queue made the depth read 0 even
/// with thousands of appends waiting on a stuck fsync: the handler opens
/// every envelope within microseconds. A sender that waits on such a ticket
/// holds an `Owed` from the moment the actor accepted the message until the
/// answer is complete, so the depth is "sent and not yet done".
pub struct Owed(#[allow(dead_code)] DepthGuard);

/// The sending side of one actor: its address and its stats. Every message
/// to an instrumented actor goes through here.
pub struct Mailbox<A: Actor> {
    addr: Addr<A>,
    stats: Arc<ActorStats>,
}

impl<A: Actor> Clone for Mailbox<A> {
    fn clone(&self) -> Self {
        Self {
            addr: self.addr.clone(),
            stats: self.stats.clone(),
        }
    }
}

impl<A: Actor> Mailbox<A> {
    /// Wrap an actor's address with its stats.
    pub fn new(addr: Addr<A>, stats: Arc<ActorStats>) -> Self {
        Self { addr, stats }
    }

    /// The actor's stats.
    pub fn stats(&self) -> &Arc<ActorStats> {
        &self.stats
    }

    /// Count work the actor accepted and still owes (see [`Owed`]).
    pub fn owe(&self) -> Owed {
        Owed(self.stats.enqueue())
    }

    /// Whether the actor can still receive messages.
    pub fn connected(&self) -> bool {
        self.addr.connected()
    }

    /// A message for this actor handled off its mailbox (a queue the
    /// actor's work is shared through): counted in the depth from now,
    /// and, once [`Traced::open`]ed, by type like any message it handles.
    pub fn trace<M>(&self, msg: M) -> Traced<M> {
        Traced {
            msg,
            sent_at: Instant::now(),
            depth: Some(self.stats.enqueue()),
            stats: self.stats.clone(),
        }
    }

    /// Send and await the reply; back-pressure from a full mailbox reaches
    /// the caller.
    pub fn send<M>(&self, msg: M) -> Request<A, Traced<M>>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<Traced<M>>,
        A::Context: ToEnvelope<A, Traced<M>>,
    {
        self.addr.send(self.trace(msg))
    }

    /// Send without waiting for a reply; fails at once on a full or closed
    /// mailbox (the message is dropped and leaves the depth).
    pub fn try_send<M>(&self, msg: M) -> Result<(), MailboxError>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<Traced<M>>,
        A::Context: ToEnvelope<A, Traced<M>>,
    {
        self.addr.try_send(self.trace(msg)).map_err(|e| match e {
            actix::prelude::SendError::Full(_) => MailboxError::Timeout,
            actix::prelude::SendError::Closed(_) => MailboxError::Closed,
        })
    }

    /// Send ignoring the mailbox limit: only for rare control messages
    /// ("run a pass now"), never on a hot path (STYLE.md).
    pub fn do_send<M>(&self, msg: M)
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<Traced<M>>,
        A::Context: ToEnvelope<A, Traced<M>>,
    {
        self.addr.do_send(self.trace(msg))
    }
}

/// Route [`Traced`] messages of an actor type through its own `Handler<M>`,
/// instrumented. One line per actor type, naming its messages:
/// `kaas_actors::instrumented!(PartitionLeader: AppendBatches, StopLeader);`
/// (A blanket impl over every `M` sends the trait solver into a loop through
/// actix's `MessageResponse` impls; naming the messages also keeps the list
/// of what an actor accepts in one place.)
#[macro_export]
macro_rules! instrumented {
    ($actor:ty : $($msg:ty),+ $(,)?) => {
        $(
            impl ::actix::Handler<$crate::telemetry::mailbox::Traced<$msg>> for $actor {
                type Result = <$actor as ::actix::Handler<$msg>>::Result;

                fn handle(
                    &mut self,
                    traced: $crate::telemetry::mailbox::Traced<$msg>,
                    ctx: &mut <$actor as ::actix::Actor>::Context,
                ) -> Self::Result {
                    let (msg, _timer) = traced.open();
                    <$actor as ::actix::Handler<$msg>>::handle(self, msg, ctx)
                }
            }
        )+
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix::prelude::*;
    use std::time::Duration;

    struct Slow;
    impl Actor for Slow {
        type Context = Context<Self>;
    }

    #[derive(Message)]
    #[rtype(result = "u32")]
    struct Block(Duration);
    impl MessageName for Block {
        const NAME: &'static str = "block";
    }
    impl Handler<Block> for Slow {
        type Result = u32;
        fn handle(&mut self, m: Block, _: &mut Context<Self>) -> u32 {
            std::thread::sleep(m.0);
            7
        }
    }
    crate::instrumented!(Slow: Block);

    #[test]
    fn a_blocked_actor_shows_its_mailbox_depth_and_it_drains() {
        let sys = System::new();
        sys.block_on(async {
            let arbiter = Arbiter::new();
            let addr = Slow::start_in_arbiter(&arbiter.handle(), |_| Slow);
            let stats = ActorStats::register("test_slow", "slow-1", "nothing");
            let mb = Mailbox::new(addr, stats.clone());
            // The first message blocks the actor's thread; four more queue.
            let first = mb.send(Block(Duration::from_millis(300)));
            let rest: Vec<_> = (0..4).map(|_| mb.send(Block(Duration::ZERO))).collect();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let depth = stats.depth();
            // Four queued and the one being handled.
            assert_eq!(depth, 5, "depth while blocked");
            let kind_depth = global()
                .kind("test_slow")
                .mailbox_depth
                .load(Ordering::Relaxed);
            assert!(kind_depth >= 4, "kind depth while blocked: {kind_depth}");
            assert_eq!(first.await.unwrap(), 7);
            for r in rest {
                assert_eq!(r.await.unwrap(), 7);
            }
            assert_eq!(stats.depth(), 0);
            assert_eq!(stats.handled(), 5);
            let text = global().render_prometheus();
            assert!(
                text.contains("kaas_actor_messages_total{kind=\"test_slow\",message=\"block\"} 5"),
                "{text}"
            );
            assert!(text.contains("kaas_actor_mailbox_depth{kind=\"test_slow\"} 0"));
            stats.deregister();
            arbiter.stop();
        });
    }

    #[test]
    fn owed_work_counts_in_the_depth_until_done() {
        let sys = System::new();
        sys.block_on(async {
            let stats = ActorStats::register("test_owed", "o-1", "nothing");
            let mb = Mailbox::new(Slow.start(), stats.clone());
            // Answered at once (like an append's ticket) ...
            assert_eq!(mb.send(Block(Duration::ZERO)).await.unwrap(), 7);
            assert_eq!(stats.depth(), 0);
            // ... but owed until its fsync: counted meanwhile.
            let owed: Vec<_> = (0..3).map(|_| mb.owe()).collect();
            assert_eq!(stats.depth(), 3);
            assert_eq!(
                global()
                    .kind("test_owed")
                    .mailbox_depth
                    .load(Ordering::Relaxed),
                3
            );
            assert_eq!(stats.info().mailbox_depth, 3);
            drop(owed);
            assert_eq!(stats.depth(), 0);
            stats.deregister();
        });
    }

    #[test]
    fn a_message_dropped_unhandled_leaves_the_depth() {
        let sys = System::new();
        sys.block_on(async {
            let stats = ActorStats::register("test_dropped", "d-1", "nothing");
            let mb = Mailbox::new(Slow.start(), stats.clone());
            let traced = mb.trace(Block(Duration::ZERO));
            assert_eq!(stats.depth(), 1);
            // An actor that stopped drops its queued envelopes unhandled.
            drop(traced);
            assert_eq!(stats.depth(), 0);
            assert_eq!(stats.handled(), 0);
            stats.deregister();
        });
    }
}
