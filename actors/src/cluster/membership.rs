//! `Membership`: the actor that owns this broker's liveness record,
//! `<cluster>/brokers/<id>.json`, and keeps its [`Lease`].
//!
//! Every heartbeat interval it rewrites the record (temp → fsync → rename)
//! with a higher `seq` and renews the lease from the heartbeat's start. It
//! runs on its own arbiter: a volume that hangs blocks only this actor, the
//! lease lapses, and every partition leader stops acknowledging by itself.
//!
//! After a lapse the incarnation is spent. Membership waits until the
//! [`super::watcher::AssignmentWatcher`] has stopped every leader of the
//! spent incarnation, then takes a new random incarnation, so the controller
//! may re-grant those partitions at once: nothing of the old one still runs.
//!
//! The decisions live in [`MembershipState`] (plain Rust, driven by a
//! [`crate::clock::Clock`] and the filesystem seam, tested below);
//! [`Membership`] is the actix glue around it.

use super::lease::{HeartbeatGuard, Lease};
use super::records::{broker_record_path, read_json, write_json, BrokerRecord, FencedAt};
use crate::clock::SharedClock;
use crate::telemetry::{ActorStats, Mailbox, MessageName};
use actix::prelude::*;
use kaas_volume::fs::{is_fenced, GuardedFs, SharedFs};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Timing of the cluster protocol.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Lease length.
    pub lease: Duration,
    /// Extra wait before another host acts on a lapsed lease (absorbs clock
    /// rate differences and the poll interval).
    pub grace: Duration,
    /// Assignment / controller poll interval.
    pub poll: Duration,
    /// When the controller moves partitions for balance alone.
    pub rebalance: Rebalance,
}

/// When the controller moves held partitions (and coordinator shards) from
/// their live owners for balance alone — a broker that came back, or joined
/// — rather than because an owner is gone (a failover is never delayed).
/// Each move pauses its partition for about a second, so one failure
/// should cost one move: the survivors keep what they took over until the
/// brokers have been stable for `delay`, and then only when enough is out
/// of place, a bounded number at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rebalance {
    /// Moves start once the set of eligible brokers has not changed for
    /// this long (any join, death, shutdown or return restarts it).
    pub delay: Duration,
    /// Moves in flight at once per class (partitions; coordinator shards).
    pub max_moves: usize,
    /// Moves start only when at least this percentage of a class is out of
    /// its balanced place; once started they run to balance.
    pub min_percent: u32,
}

impl Rebalance {
    /// Every move as soon as it is seen (unit tests' default).
    pub const IMMEDIATE: Rebalance = Rebalance {
        delay: Duration::ZERO,
        max_moves: usize::MAX,
        min_percent: 0,
    };
}

impl Timing {
    /// lease + grace: how long a heartbeat must stand still before another
    /// host treats its writer as fenced.
    pub fn dead_after(&self) -> Duration {
        self.lease + self.grace
    }
}

/// What this broker publishes about itself, shared with the other actors.
#[derive(Debug, Default, Clone)]
pub struct SelfState {
    /// Newest assignment fully applied: (controller epoch, version).
    pub applied: (i32, u64),
    /// Leaving.
    pub shutting_down: bool,
    /// Gone.
    pub clean_exit: bool,
    /// Controller epoch given up.
    pub controller_released: Option<i32>,
    /// Grants found fenced at open.
    pub fenced: Vec<FencedAt>,
}

/// Shared between Membership, the watcher and the controller.
#[derive(Debug)]
pub struct Shared {
    /// This broker's id.
    pub broker_id: i32,
    /// The lease.
    pub lease: Arc<Lease>,
    /// Published state.
    pub state: Mutex<SelfState>,
    /// Incarnation whose leaders the watcher has all stopped.
    pub fenced_incarnation: AtomicU64,
    /// Boot-clock nanoseconds of the watcher's and the controller's latest
    /// poll. Membership heartbeats only while both are alive: a broker whose
    /// watcher (or controller actor) died must not keep its grants, or the
    /// controller role, alive by heartbeating alone.
    pub watcher_tick: AtomicU64,
    /// See `watcher_tick`.
    pub controller_tick: AtomicU64,
    /// Cluster directory.
    pub cluster_dir: PathBuf,
    /// Advertised host and port.
    pub advertised: (String, i32),
    /// Timing.
    pub timing: Timing,
    /// Brokers this host (its controller actor, candidate or elected) has
    /// watched stand still for more than a lease: they have fenced
    /// themselves. Metadata does not name them leader, so clients re-query
    /// quickly instead of waiting for their periodic refresh — also while no
    /// controller is left to stop advertising them (the controller's own
    /// broker died). A hint for answers only; nothing is written on it.
    pub silent: Mutex<Vec<i32>>,
    /// Every broker the assignment this broker applied last names
    /// (`Assignment::named_brokers`; set by the watcher): a candidate reads
    /// their records by exact name too, so a stale listing cannot hide a
    /// broker that holds grants until after the election.
    pub named: Mutex<Vec<i32>>,
    /// The record this process last wrote (its heartbeat is the record's
    /// only writer): the controller on this host takes its own record from
    /// here instead of re-reading the file every poll. A record another
    /// process wrote under our id is the heartbeat's impostor check's
    /// business, which reads the file before every write.
    pub written: Mutex<Option<BrokerRecord>>,
    /// Whether this host's controller actor is elected: the watcher then
    /// learns of every version it publishes in-process (`PollNow`) and
    /// reads the history head only as a safety net.
    pub leading_controller: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// Shared state around `lease` (which carries the clock every cluster
    /// actor times itself on).
    pub fn new(
        broker_id: i32,
        lease: Arc<Lease>,
        cluster_dir: PathBuf,
        advertised: (String, i32),
        timing: Timing,
    ) -> Self {
        Self {
            broker_id,
            lease,
            state: Mutex::new(SelfState::default()),
            fenced_incarnation: AtomicU64::new(0),
            watcher_tick: AtomicU64::new(0),
            controller_tick: AtomicU64::new(0),
            cluster_dir,
            advertised,
            timing,
            silent: Mutex::new(Vec::new()),
            named: Mutex::new(Vec::new()),
            written: Mutex::new(None),
            leading_controller: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// See [`Shared::silent`].
    pub fn is_silent(&self, id: i32) -> bool {
        self.silent.lock().unwrap().contains(&id)
    }

    /// The clock leases and observations are timed on.
    pub fn clock(&self) -> &SharedClock {
        self.lease.clock()
    }

    /// Monotonic nanoseconds now, for the poll ticks.
    pub fn now_ns(&self) -> u64 {
        self.clock().now().as_nanos() as u64
    }
}

fn incarnation() -> u64 {
    // Never 0 (0 means "nobody" in the assignment).
    rand::random::<u64>() | 1
}

/// Join the cluster: wait until any earlier incarnation of this broker id is
/// provably fenced (exited cleanly, or its heartbeat stood still for lease +
/// grace on our clock), then write the first heartbeat of a new incarnation.
/// Returns the shared state with a granted lease. Blocking.
pub fn join(fs: &SharedFs, shared_cfg: JoinConfig) -> io::Result<(Arc<Shared>, u64)> {
    let JoinConfig {
        broker_id,
        cluster_dir,
        advertised,
        timing,
        clock,
    } = shared_cfg;
    let boot_now = || clock.now();
    let path = broker_record_path(&cluster_dir, broker_id);
    fs.create_dir_all(path.parent().expect("has parent"))?;
    let mut seq = 0;
    if let Some(prev) = read_json::<BrokerRecord>(fs.as_ref(), &path)? {
        seq = prev.seq;
        if !prev.clean_exit {
            tracing::warn!(
                broker_id,
                wait_ms = timing.dead_after().as_millis() as u64,
                "previous incarnation did not exit cleanly; waiting until its lease has provably lapsed"
            );
            let mut last = prev.seq;
            let mut since = boot_now();
            let give_up = since + timing.dead_after() * 4;
            loop {
                std::thread::sleep(timing.heartbeat.min(Duration::from_millis(200)));
                let now_rec = read_json::<BrokerRecord>(fs.as_ref(), &path)?;
                let now = boot_now();
                match now_rec {
                    Some(r) if r.seq != last => {
                        last = r.seq;
                        seq = r.seq;
                        since = now;
                        if r.clean_exit {
                            break;
                        }
                    }
                    _ => {}
                }
                if now.saturating_sub(since) >= timing.dead_after() {
                    break;
                }
                if now > give_up {
                    return Err(io::Error::other(format!(
                        "broker id {broker_id} is heartbeating from another live process; refusing to start a second one"
                    )));
                }
            }
        }
    }
    // Any earlier incarnation of this id is fenced now: its heartbeat temps
    // (a kill -9 or a refused late beat between create and rename) are
    // leftovers nobody will rename. Only ours — other brokers write here too.
    sweep_own_temps(fs.as_ref(), &path);
    let inc = incarnation();
    let shared = Arc::new(Shared::new(
        broker_id,
        Arc::new(Lease::with_clock(timing.lease, inc, clock.clone())),
        cluster_dir,
        advertised,
        timing,
    ));
    let seq = seq + 1;
    let started = boot_now();
    let first = record(&shared, inc, seq);
    write_json(fs.as_ref(), &path, &first)?;
    *shared.written.lock().unwrap() = Some(first);
    // Tell the controller a broker joined: it lists the broker records
    // only when this bell rang (or as a slow safety net).
    if let Err(e) = kaas_volume::topic_notice::ring(fs.as_ref(), &shared.cluster_dir) {
        tracing::warn!(error = %e, "join bell not rung; the controller's periodic listing will find this broker");
    }
    if !shared.lease.renewed(inc, started, boot_now()) {
        return Err(io::Error::other(
            "first heartbeat took longer than the lease",
        ));
    }
    tracing::info!(broker_id, incarnation = inc, "joined the cluster");
    Ok((shared, seq))
}

/// Remove the `write_atomic` temps of `record` (this broker's own record)
/// from its directory; best effort, since a leftover costs one directory
/// entry. Should a paused predecessor still be mid-beat, its rename then
/// fails: it was fenced already, and this is one more reason it cannot land.
fn sweep_own_temps(fs: &dyn kaas_volume::fs::Fs, record: &std::path::Path) {
    let (Some(dir), Some(target)) = (record.parent(), record.file_name()) else {
        return;
    };
    let target = target.to_string_lossy();
    let names = match fs.list(dir) {
        Ok(n) => n,
        Err(e) => {
            tracing::debug!(error = %e, "brokers directory not listed; own heartbeat temps left");
            return;
        }
    };
    for name in names {
        if kaas_volume::layout::is_temp_of(&name, &target) {
            if let Err(e) = kaas_volume::fs::remove_if_exists(fs, &dir.join(&name)) {
                tracing::debug!(error = %e, name, "own heartbeat temp not removed");
            }
        }
    }
}

/// Inputs of [`join`].
#[derive(Debug, Clone)]
pub struct JoinConfig {
    /// Broker id.
    pub broker_id: i32,
    /// Cluster directory.
    pub cluster_dir: PathBuf,
    /// Advertised host and port.
    pub advertised: (String, i32),
    /// Timing.
    pub timing: Timing,
    /// The clock the lease is measured on ([`crate::clock::RealClock`]
    /// outside tests).
    pub clock: SharedClock,
}

/// During a controlled shutdown: whether any broker of `ids` other than
/// `me` could still take a hand-off — its record exists and says neither
/// shutting down nor exited. When every other broker is leaving too, nobody
/// can be granted what we lead (and a shutting-down broker does not campaign,
/// so there may be no controller left to vacate it): waiting for a hand-off
/// would only run out the shutdown timeout. An unreadable record counts as
/// a possible taker (keep waiting, bounded by the timeout); a missing one
/// does not (a live broker rewrites its record every heartbeat).
pub fn handoff_possible(
    fs: &dyn kaas_volume::fs::Fs,
    cluster_dir: &std::path::Path,
    me: i32,
    ids: impl IntoIterator<Item = i32>,
) -> bool {
    ids.into_iter()
        .filter(|id| *id != me && *id >= 0)
        .any(
            |id| match read_json::<BrokerRecord>(fs, &broker_record_path(cluster_dir, id)) {
                Ok(Some(r)) => !r.shutting_down && !r.clean_exit,
                Ok(None) => false,
                Err(_) => true,
            },
        )
}

fn record(shared: &Shared, inc: u64, seq: u64) -> BrokerRecord {
    let st = shared.state.lock().unwrap().clone();
    BrokerRecord {
        broker_id: shared.broker_id,
        incarnation: inc,
        seq,
        host: shared.advertised.0.clone(),
        port: shared.advertised.1,
        applied_controller_epoch: st.applied.0,
        applied_version: st.applied.1,
        shutting_down: st.shutting_down,
        clean_exit: st.clean_exit,
        controller_released: st.controller_released,
        fenced: st.fenced,
    }
}

/// What one heartbeat pass decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeatOutcome {
    /// The record was rewritten; `lease_valid` is the lease afterwards.
    Written {
        /// Whether the lease is valid after the heartbeat.
        lease_valid: bool,
    },
    /// The write failed; the lease runs down unless a later one lands.
    WriteFailed,
    /// The watcher or the controller actor stopped polling: no heartbeat,
    /// so the lease lapses and the broker is fenced rather than half-alive.
    Withheld,
    /// The lease lapsed and the watcher has not yet stopped every leader of
    /// the spent incarnation: wait before taking a new one.
    AwaitingFence,
    /// The lease ended while the heartbeat was being written, so the write
    /// was refused before it could land: the lease stays lapsed.
    TooLate,
    /// The record was rewritten after [`Lease::revoke`] ended the lease on
    /// purpose (a controlled shutdown): not a renewal, not a fence.
    Revoked,
    /// Our record shows an incarnation this process never used: another
    /// process has our broker id. The lease is revoked; the caller exits.
    Impostor {
        /// The incarnation found in the record.
        theirs: u64,
    },
}

/// The heartbeat logic of [`Membership`], without actix: it reads the clock
/// through the lease and the volume through the seam, and returns what it
/// decided.
pub struct MembershipState {
    fs: SharedFs,
    shared: Arc<Shared>,
    seq: u64,
    failures: u64,
    /// Every incarnation this process has used: a record showing any other
    /// means a second process runs with our broker id.
    mine: Vec<u64>,
    new_incarnation: fn() -> u64,
    /// The poll actors' last ticks (watcher, controller) as the previous
    /// beat saw them, how long each has stood still *while this heartbeat
    /// ran*, and when it last ran (see [`MembershipState::stalled`]).
    ticks_seen: (u64, u64),
    stalled_for: (Duration, Duration),
    last_beat: Option<Duration>,
    /// Whether the stall was already logged.
    stall_logged: bool,
    /// Renewals that landed with less than [`LATE_BEAT_FRACTION`] of the
    /// lease left, all told, and how many since the last warning (and
    /// when that was).
    late_beats: u64,
    late_unlogged: u64,
    late_logged_at: Option<Duration>,
}

/// A renewal that lands with less than this fraction of the lease left
/// is late: the substrate (or this host) is slower than the lease allows,
/// and one more such delay lapses it. Warned and counted before anything
/// lapses.
pub const LATE_BEAT_FRACTION: u32 = 3;

/// At most one late-heartbeat warning per this long (the count since the
/// last one is in it).
const LATE_BEAT_LOG_EVERY: Duration = Duration::from_secs(30);

impl MembershipState {
    /// State after [`join`] wrote heartbeat `seq`.
    pub fn new(fs: SharedFs, shared: Arc<Shared>, seq: u64) -> Self {
        let mine = vec![shared.lease.incarnation()];
        Self {
            fs,
            shared,
            seq,
            failures: 0,
            mine,
            new_incarnation: incarnation,
            ticks_seen: (0, 0),
            stalled_for: (Duration::ZERO, Duration::ZERO),
            last_beat: None,
            stall_logged: false,
            late_beats: 0,
            late_unlogged: 0,
            late_logged_at: None,
        }
    }

    /// Renewals so far that landed with less than a
    /// [`LATE_BEAT_FRACTION`]th of the lease left.
    pub fn late_beats(&self) -> u64 {
        self.late_beats
    }

    /// A renewal landed at `now` with `left` of the lease it renewed:
    /// count and (rate-limited) warn when that is under a
    /// [`LATE_BEAT_FRACTION`]th of the lease.
    fn note_headroom(&mut self, left: Duration, took: Duration, now: Duration) {
        let length = self.shared.lease.length;
        if left >= length / LATE_BEAT_FRACTION {
            return;
        }
        self.late_beats += 1;
        self.late_unlogged += 1;
        crate::telemetry::global()
            .heartbeat_late
            .fetch_add(1, Ordering::Relaxed);
        if self
            .late_logged_at
            .is_none_or(|at| now.saturating_sub(at) >= LATE_BEAT_LOG_EVERY)
        {
            tracing::warn!(
                broker_id = self.shared.broker_id,
                left_ms = left.as_millis() as u64,
                heartbeat_ms = took.as_millis() as u64,
                lease_ms = length.as_millis() as u64,
                late_since_last_warning = self.late_unlogged,
                "heartbeat landed with less than a third of the lease left: the volume (or this host) \
                 is slower than the lease allows; one more such delay lapses it \
                 (kaas substrate-check --peer suggests a lease)"
            );
            self.late_logged_at = Some(now);
            self.late_unlogged = 0;
        }
    }

    /// Whether the watcher or the controller actor has stopped polling: its
    /// tick stood still for two leases *of this heartbeat's own running
    /// time*. Each gap between beats counts for at most two heartbeat
    /// intervals, so a pause of the whole process (SIGSTOP, a VM stall, a
    /// saturated host) — after which every actor is equally late and the
    /// missed beats run back to back — is not taken for a stuck actor:
    /// only beats that kept running while a tick stood still are.
    ///
    /// Each poller is timed on its own: a beat between two polls of one
    /// (the poll interval is longer than the heartbeat's) must not count
    /// toward the other's stall. Timed together, two pollers ticking out of
    /// phase kept one of them "still" at every beat, and a healthy broker
    /// withheld its heartbeats (seen with `--poll-ms 400`, heartbeat 200).
    fn stalled(&mut self, now: Duration) -> bool {
        let ticks = (
            self.shared.watcher_tick.load(Ordering::Acquire),
            self.shared.controller_tick.load(Ordering::Acquire),
        );
        let gap = self
            .last_beat
            .map_or(Duration::ZERO, |t| now.saturating_sub(t))
            .min(self.shared.timing.heartbeat * 2);
        self.last_beat = Some(now);
        // Polled once at least, and not since the last beat.
        let step = |tick: u64, seen: u64, stalled: Duration| {
            if tick != 0 && tick == seen {
                stalled + gap
            } else {
                Duration::ZERO
            }
        };
        self.stalled_for = (
            step(ticks.0, self.ticks_seen.0, self.stalled_for.0),
            step(ticks.1, self.ticks_seen.1, self.stalled_for.1),
        );
        self.ticks_seen = ticks;
        let limit = self.shared.timing.lease * 2;
        let stalled = self.stalled_for.0 > limit || self.stalled_for.1 > limit;
        if !stalled {
            self.stall_logged = false;
        }
        stalled
    }

    /// The last heartbeat sequence number written (or attempted).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// One heartbeat pass.
    pub fn beat(&mut self) -> BeatOutcome {
        let shared = self.shared.clone();
        let lease = &shared.lease;
        let clock = lease.clock().clone();
        let path = broker_record_path(&self.shared.cluster_dir, self.shared.broker_id);
        // Only we write our record. If it shows an incarnation we never
        // used, another process has our broker id (a replacement started
        // while we were paused or cut off): stop at once — never heartbeat
        // over it, never lead again.
        if let Ok(Some(r)) = read_json::<BrokerRecord>(self.fs.as_ref(), &path) {
            if !self.mine.contains(&r.incarnation) {
                lease.revoke();
                return BeatOutcome::Impostor {
                    theirs: r.incarnation,
                };
            }
        }
        if self.stalled(clock.now()) {
            // Once per stall: every beat after it is withheld the same way.
            if !std::mem::replace(&mut self.stall_logged, true) {
                tracing::error!(
                    broker_id = self.shared.broker_id,
                    watcher_still = ?self.stalled_for.0,
                    controller_still = ?self.stalled_for.1,
                    "assignment watcher or controller actor stopped polling; withholding heartbeats so the lease lapses"
                );
            }
            return BeatOutcome::Withheld;
        }
        let mut inc = lease.incarnation();
        // Revoked on purpose (a controlled shutdown revokes before it sets
        // `clean_exit`): this process never rejoins.
        let leaving = lease.revoked() || self.shared.state.lock().unwrap().clean_exit;
        if lease.lapsed() && !leaving {
            // Spent: wait until the watcher stopped every leader of it.
            if self.shared.fenced_incarnation.load(Ordering::Acquire) != inc {
                return BeatOutcome::AwaitingFence;
            }
            let new = (self.new_incarnation)();
            crate::telemetry::global()
                .lease_lapses
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                broker_id = self.shared.broker_id,
                old = inc,
                new,
                "lease lapsed: all leadership dropped; rejoining as a new incarnation"
            );
            // The controller re-grants by incarnation; start from scratch.
            self.shared.state.lock().unwrap().applied = (0, 0);
            self.mine.push(new);
            lease.reincarnate(new);
            inc = new;
        }
        self.seq += 1;
        let started = clock.now();
        let guarded = GuardedFs::new(
            self.fs.clone(),
            Arc::new(HeartbeatGuard::new(self.shared.lease.clone(), inc)),
        );
        let rec = record(&self.shared, inc, self.seq);
        let outcome = match write_json(&guarded, &path, &rec) {
            Err(e) if is_fenced(&e) && (leaving || lease.revoked()) => {
                tracing::info!(
                    broker_id = self.shared.broker_id,
                    "clean exit not published: the lease had ended; the others wait it out"
                );
                BeatOutcome::Revoked
            }
            Err(e) if is_fenced(&e) => {
                // Paused or stalled past the lease mid-write: nothing landed
                // (a late rename could clobber a replacement's record).
                crate::telemetry::global()
                    .heartbeat_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    broker_id = self.shared.broker_id,
                    "heartbeat could not complete before the lease ended: fenced"
                );
                BeatOutcome::TooLate
            }
            Ok(()) => {
                *self.shared.written.lock().unwrap() = Some(rec);
                self.failures = 0;
                // What was left of the lease this renewal extends (zero
                // for the first beat of an incarnation: nothing granted).
                let granted = lease.valid_for(inc);
                let left = lease.remaining();
                let now = clock.now();
                let t = crate::telemetry::global();
                t.heartbeat_seconds.observe(now.saturating_sub(started));
                let lease_valid = lease.renewed(inc, started, now);
                if granted && lease_valid {
                    self.note_headroom(left, now.saturating_sub(started), now);
                }
                // Re-read: a controlled shutdown may have revoked the lease
                // while this write was in flight.
                let leaving = leaving || lease.revoked();
                if !lease_valid && !leaving {
                    t.heartbeat_failures.fetch_add(1, Ordering::Relaxed);
                }
                if leaving {
                    // The shutdown revoked the lease first, on purpose: this
                    // record is not a renewal, and once `clean_exit` is in
                    // it, it tells the others we are gone.
                    if self.shared.state.lock().unwrap().clean_exit {
                        tracing::info!(broker_id = self.shared.broker_id, "clean exit published");
                    }
                    return BeatOutcome::Revoked;
                } else if !lease_valid {
                    tracing::error!(
                        broker_id = self.shared.broker_id,
                        "heartbeat completed after the lease ended: fenced"
                    );
                }
                BeatOutcome::Written { lease_valid }
            }
            Err(e) => {
                self.failures += 1;
                crate::telemetry::global()
                    .heartbeat_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, failures = self.failures, remaining_ms = lease.remaining().as_millis() as u64, "heartbeat write failed");
                BeatOutcome::WriteFailed
            }
        };
        outcome
    }
}

/// See module docs.
pub struct Membership {
    state: MembershipState,
    shared: Arc<Shared>,
    stats: Arc<ActorStats>,
}

impl Membership {
    /// Start on `arbiter` after [`join`].
    pub fn start(
        fs: SharedFs,
        shared: Arc<Shared>,
        seq: u64,
        arbiter: &ArbiterHandle,
    ) -> Mailbox<Membership> {
        let stats = ActorStats::register(
            "membership",
            shared.broker_id.to_string(),
            broker_record_path(&shared.cluster_dir, shared.broker_id)
                .display()
                .to_string(),
        );
        let mine = stats.clone();
        let addr = Membership::start_in_arbiter(arbiter, move |_| Membership {
            state: MembershipState::new(fs, shared.clone(), seq),
            shared,
            stats: mine,
        });
        Mailbox::new(addr, stats)
    }

    fn beat(&mut self) {
        let outcome = self.state.beat();
        // The record's sequence is the "epoch" a dashboard shows for it.
        self.stats.set_epoch(self.state.seq() as i64);
        self.stats.set_error(match outcome {
            BeatOutcome::WriteFailed => Some("heartbeat write failed".into()),
            _ => None,
        });
        if let BeatOutcome::Impostor { theirs } = outcome {
            tracing::error!(
                broker_id = self.shared.broker_id,
                theirs,
                "another process heartbeats as this broker id; exiting"
            );
            std::process::exit(3);
        }
    }
}

impl Actor for Membership {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.shared.timing.heartbeat, |a, _| a.beat());
    }
}

/// Write a heartbeat now (state changed: applied a version, shutting down).
#[derive(Message)]
#[rtype(result = "()")]
pub struct HeartbeatNow;

impl MessageName for HeartbeatNow {
    const NAME: &'static str = "heartbeat_now";
}

crate::instrumented!(Membership: HeartbeatNow);

impl Handler<HeartbeatNow> for Membership {
    type Result = ();
    fn handle(&mut self, _: HeartbeatNow, _: &mut Context<Self>) {
        self.beat();
    }
}
