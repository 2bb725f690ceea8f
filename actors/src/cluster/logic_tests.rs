//! The cluster actors' logic driven without actix: [`MembershipState`],
//! [`WatcherState`] and [`ControllerState`] on a [`FakeClock`], over the real
//! filesystem in a tempdir (or the fault-injecting seam where a write must
//! fail). Time moves only when a test advances it, so "lease + grace of the
//! controller's own observation" is checked to the millisecond.

#![allow(clippy::disallowed_methods)] // tests build fixtures with raw std::fs calls

use super::controller::{ControllerState, Liveness};
use super::lease::Lease;
use super::membership::{BeatOutcome, MembershipState, Rebalance, Shared, Timing};
use super::records::{
    broker_record_path, write_json, Assignment, BrokerRecord, ASSIGNMENT, BROKERS_DIR,
};
use super::watcher::WatcherState;
use crate::clock::{Clock, FakeClock};
use kaas_volume::fs::fault::FaultFs;
use kaas_volume::fs::{RealFs, SharedFs};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const TIMING: Timing = Timing {
    heartbeat: Duration::from_millis(500),
    lease: Duration::from_secs(3),
    grace: Duration::from_secs(1),
    poll: Duration::from_millis(100),
    rebalance: Rebalance::IMMEDIATE,
};

fn real() -> SharedFs {
    Arc::new(RealFs)
}

/// Broker `id` of incarnation `inc`, with a lease on `clock` not yet granted.
fn shared(cluster: &Path, id: i32, inc: u64, clock: &Arc<FakeClock>) -> Arc<Shared> {
    std::fs::create_dir_all(cluster.join(BROKERS_DIR)).unwrap();
    Arc::new(Shared::new(
        id,
        Arc::new(Lease::with_clock(TIMING.lease, inc, clock.clone())),
        cluster.to_path_buf(),
        ("127.0.0.1".into(), 9092 + id),
        TIMING,
    ))
}

fn record(id: i32, inc: u64, seq: u64) -> BrokerRecord {
    BrokerRecord {
        broker_id: id,
        incarnation: inc,
        seq,
        host: "127.0.0.1".into(),
        port: 9092 + id,
        applied_controller_epoch: 0,
        applied_version: 0,
        shutting_down: false,
        clean_exit: false,
        controller_released: None,
        fenced: Vec::new(),
    }
}

/// Broker `s` joins: its first heartbeat, then the bell rung (as
/// [`super::membership::join`] does).
fn beat(fs: SharedFs, s: &Arc<Shared>) -> MembershipState {
    let mut m = MembershipState::new(fs, s.clone(), 0);
    assert_eq!(m.beat(), BeatOutcome::Written { lease_valid: true });
    kaas_volume::topic_notice::ring(&RealFs, &s.cluster_dir).unwrap();
    m
}

#[test]
fn the_lease_lapses_when_heartbeats_stop_being_written() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let s = shared(d.path(), 1, 11, &clock);
    let ffs = FaultFs::new();
    let mut m = beat(Arc::new(ffs.clone()), &s);
    // Heartbeats keep it alive indefinitely.
    for _ in 0..20 {
        clock.advance(TIMING.heartbeat);
        assert_eq!(m.beat(), BeatOutcome::Written { lease_valid: true });
    }
    // The volume stops taking writes: the lease runs out one lease after the
    // start of the last heartbeat that landed, and not a moment earlier.
    ffs.crash_at(ffs.ops() + 1);
    let mut elapsed = Duration::ZERO;
    while elapsed + TIMING.heartbeat < TIMING.lease {
        clock.advance(TIMING.heartbeat);
        elapsed += TIMING.heartbeat;
        assert_eq!(m.beat(), BeatOutcome::WriteFailed);
        assert!(
            s.lease.valid(),
            "lapsed early, {elapsed:?} after the last heartbeat"
        );
    }
    clock.advance(TIMING.lease - elapsed);
    assert!(
        !s.lease.valid(),
        "still valid a full lease after the last heartbeat"
    );
    assert!(s.lease.lapsed());
    // Spent: no new incarnation until the watcher stopped every leader.
    assert_eq!(m.beat(), BeatOutcome::AwaitingFence);
}

#[test]
fn a_heartbeat_that_lands_with_under_a_third_of_the_lease_left_is_late() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let s = shared(d.path(), 1, 11, &clock);
    let mut m = beat(real(), &s);
    assert_eq!(m.late_beats(), 0, "the first beat renews nothing");
    // On time: half a second into a 3 s lease, 2.5 s left.
    for _ in 0..5 {
        clock.advance(TIMING.heartbeat);
        assert_eq!(m.beat(), BeatOutcome::Written { lease_valid: true });
    }
    assert_eq!(m.late_beats(), 0);
    // A volume that makes renewals land 2.2 s apart: 0.8 s left, under
    // a third of the lease, each time; still valid, so counted and not
    // failed.
    for i in 1..=3 {
        clock.advance(Duration::from_millis(2200));
        assert_eq!(m.beat(), BeatOutcome::Written { lease_valid: true });
        assert_eq!(m.late_beats(), i);
    }
    // Exactly a third left is not late.
    clock.advance(TIMING.lease - TIMING.lease / 3);
    assert_eq!(m.beat(), BeatOutcome::Written { lease_valid: true });
    assert_eq!(m.late_beats(), 3);
}

#[test]
fn a_spent_incarnation_is_replaced_only_after_the_watcher_fenced_it() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let s = shared(d.path(), 1, 11, &clock);
    let mut m = beat(real(), &s);
    let mut w = WatcherState::new(real(), s.clone());
    clock.advance(TIMING.lease);
    assert_eq!(m.beat(), BeatOutcome::AwaitingFence);
    // The watcher stops every leader of incarnation 11...
    let apply = w.poll().expect("stop everything");
    assert!(!apply.lead);
    assert_eq!(apply.incarnation, 11);
    assert!(w.poll().is_none(), "one application at a time");
    assert!(!w.done(&apply));
    assert_eq!(s.fenced_incarnation.load(Ordering::Acquire), 11);
    // ...and only then does membership take a new incarnation.
    assert_eq!(m.beat(), BeatOutcome::Written { lease_valid: true });
    assert_ne!(s.lease.incarnation(), 11);
    assert!(!s.lease.valid_for(11));
}

#[test]
fn a_record_of_an_incarnation_never_ours_is_an_impostor() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let s = shared(d.path(), 1, 11, &clock);
    let mut m = beat(real(), &s);
    write_json(
        real().as_ref(),
        &broker_record_path(d.path(), 1),
        &record(1, 99, 50),
    )
    .unwrap();
    assert_eq!(m.beat(), BeatOutcome::Impostor { theirs: 99 });
    assert!(!s.lease.valid(), "revoked");
}

#[test]
fn the_watcher_applies_only_newer_versions() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let s = shared(d.path(), 1, 11, &clock);
    let _m = beat(real(), &s);
    let mut w = WatcherState::new(real(), s.clone());
    assert!(w.poll().is_none(), "no assignment yet");
    let write = |epoch: i32, version: u64| {
        let a = Assignment {
            controller_epoch: epoch,
            version,
            ..Assignment::default()
        };
        write_json(real().as_ref(), &d.path().join(ASSIGNMENT), &a).unwrap();
    };
    write(2, 5);
    let a = w.poll().expect("first version applies");
    assert!(a.lead);
    assert!(w.done(&a), "heartbeat to report it");
    assert_eq!(s.state.lock().unwrap().applied, (2, 5));
    assert!(w.poll().is_none(), "the same version again");
    // A deposed controller's late write: an older epoch, or an older version.
    write(1, 9);
    assert!(w.poll().is_none(), "older controller epoch");
    write(2, 4);
    assert!(w.poll().is_none(), "older version");
    assert_eq!(w.applied(), Some((2, 5, 11)));
    write(2, 6);
    let a = w.poll().expect("newer version applies");
    assert_eq!(a.assignment.version, 6);
    assert!(w.poll().is_none(), "busy until the sink is done");
    w.done(&a);
    write(3, 1);
    let a = w
        .poll()
        .expect("a newer controller epoch applies at any version");
    w.done(&a);
    assert_eq!(w.applied(), Some((3, 1, 11)));
}

/// Catches: the watcher's periodic idempotent re-apply (every 20 polls)
/// applying whatever the file holds without the newer-than check, so a
/// deposed controller's late, older write reached the leaders (issue 12
/// item 3).
#[test]
fn the_periodic_re_apply_never_applies_a_stale_write() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let s = shared(d.path(), 1, 11, &clock);
    let _m = beat(real(), &s);
    let mut w = WatcherState::new(real(), s.clone());
    let write = |epoch: i32, version: u64| {
        let a = Assignment {
            controller_epoch: epoch,
            version,
            ..Assignment::default()
        };
        write_json(real().as_ref(), &d.path().join(ASSIGNMENT), &a).unwrap();
    };
    write(2, 5);
    let a = w.poll().expect("first version applies");
    w.done(&a);
    // A deposed controller's late write, older than what was applied.
    write(1, 9);
    for _ in 0..60 {
        if let Some(a) = w.poll() {
            assert_eq!(
                (a.assignment.controller_epoch, a.assignment.version),
                (2, 5),
                "a re-apply is of what was applied"
            );
            w.done(&a);
        }
    }
    assert_eq!(w.applied(), Some((2, 5, 11)));
}

/// Catches: a controller that counts a broker's silence from the broker's
/// own write time (which it cannot know) or from before it started
/// watching, instead of from its own first observation.
#[test]
fn the_controller_declares_no_broker_dead_before_lease_plus_grace_of_its_own_observation() {
    let d = tempfile::tempdir().unwrap();
    let cluster = d.path().join("__cluster");
    let data = d.path().to_path_buf();
    std::fs::create_dir_all(cluster.join(BROKERS_DIR)).unwrap();
    let clock = FakeClock::new();
    // Broker 2 wrote one heartbeat long ago and then went silent.
    write_json(
        real().as_ref(),
        &broker_record_path(&cluster, 2),
        &record(2, 22, 7),
    )
    .unwrap();
    clock.advance(Duration::from_secs(60));
    let s = shared(&cluster, 1, 11, &clock);
    let mut m = beat(real(), &s);
    let mut c = ControllerState::new(real(), s.clone(), data);
    assert!(
        c.tick(),
        "elected on an empty volume and published version 1"
    );
    assert_eq!(c.epoch(), Some(1));
    let first_seen = clock.now();
    assert_eq!(
        c.liveness(2),
        Some(Liveness {
            alive: true,
            suspect: false
        }),
        "a silence the controller has not timed itself counts for nothing"
    );
    let step = TIMING.poll;
    let mut suspect_at = None;
    while clock.now() - first_seen < TIMING.dead_after() {
        clock.advance(step);
        if (clock.now() - first_seen)
            .as_millis()
            .is_multiple_of(TIMING.heartbeat.as_millis())
        {
            m.beat();
        }
        c.tick();
        let l = c.liveness(2).unwrap();
        assert!(
            l.alive,
            "declared dead {:?} after the first observation",
            clock.now() - first_seen
        );
        if l.suspect && suspect_at.is_none() {
            suspect_at = Some(clock.now() - first_seen);
        }
    }
    assert_eq!(
        suspect_at,
        Some(TIMING.lease + step),
        "suspect (not advertised) once silent for more than a lease"
    );
    clock.advance(step);
    m.beat();
    c.tick();
    assert!(!c.liveness(2).unwrap().alive, "dead after lease + grace");
    // Its own record kept moving: the controller itself is alive.
    assert!(c.liveness(1).unwrap().alive);
}

/// Advance `d` in poll steps, heartbeating (which keeps the controller's own
/// lease) and running a controller pass at each.
fn run(clock: &FakeClock, m: &mut MembershipState, c: &mut ControllerState, d: Duration) {
    let mut t = Duration::ZERO;
    while t < d {
        let step = TIMING.poll.min(d - t);
        clock.advance(step);
        t += step;
        m.beat();
        c.tick();
    }
}

#[test]
fn a_heartbeat_seen_moving_restarts_the_controllers_count() {
    let d = tempfile::tempdir().unwrap();
    let cluster = d.path().join("__cluster");
    std::fs::create_dir_all(cluster.join(BROKERS_DIR)).unwrap();
    let clock = FakeClock::new();
    let s = shared(&cluster, 1, 11, &clock);
    let mut m = beat(real(), &s);
    let two = broker_record_path(&cluster, 2);
    write_json(real().as_ref(), &two, &record(2, 22, 1)).unwrap();
    let mut c = ControllerState::new(real(), s.clone(), d.path().to_path_buf());
    c.tick();
    // Nearly dead, then one heartbeat lands: a full lease + grace again.
    run(&clock, &mut m, &mut c, TIMING.dead_after());
    assert!(c.liveness(2).unwrap().alive);
    write_json(real().as_ref(), &two, &record(2, 22, 2)).unwrap();
    c.tick();
    run(&clock, &mut m, &mut c, TIMING.dead_after());
    assert!(c.liveness(2).unwrap().alive);
    run(&clock, &mut m, &mut c, Duration::from_millis(1));
    assert!(!c.liveness(2).unwrap().alive);
}

#[test]
fn a_controller_whose_lease_lapsed_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let cluster = d.path().join("__cluster");
    std::fs::create_dir_all(cluster.join(BROKERS_DIR)).unwrap();
    let clock = FakeClock::new();
    let s = shared(&cluster, 1, 11, &clock);
    let _m = beat(real(), &s);
    let ffs = FaultFs::new();
    let mut c = ControllerState::new(Arc::new(ffs.clone()), s.clone(), d.path().to_path_buf());
    assert!(c.tick());
    clock.advance(TIMING.lease);
    let ops = ffs.ops();
    assert!(!c.tick());
    assert_eq!(c.epoch(), None, "stepped down");
    assert_eq!(ffs.ops(), ops, "no write after the lease is gone");
}

fn id_of(id: u128) -> uuid::Uuid {
    uuid::Uuid::from_u128(id)
}

/// A change notice for `name`, posted to the cluster directory the tests
/// keep in `data`.
fn notice(data: &Path, name: &str, id: uuid::Uuid) {
    kaas_volume::topic_notice::post(
        real().as_ref(),
        &data.join("__cluster"),
        &kaas_volume::topic_notice::Notice {
            topic: name.into(),
            topic_id: Some(id),
            delete: false,
        },
    )
    .unwrap();
}

/// The topic `t` with `n` partitions, stamped in `data`.
fn stamp_topic(data: &Path, n: i32) {
    let stamp = crate::topic::TopicStamp {
        topic_id: uuid::Uuid::from_u128(7),
        name: "t".into(),
        partitions: n,
        configs: Default::default(),
        adopted: false,
    };
    std::fs::create_dir_all(data.join("t")).unwrap();
    write_json(
        real().as_ref(),
        &data.join("t").join(crate::topic::STAMP),
        &stamp,
    )
    .unwrap();
    // As the catalog does: announced, so the controller reads it the
    // next pass (it lists the directory only every LIST_EVERY).
    notice(data, "t", id_of(7));
}

fn on_disk(cluster: &Path) -> Assignment {
    let a = super::history::read_current(real().as_ref(), cluster)
        .unwrap()
        .assignment;
    assert!(a.version > 0, "no assignment published");
    a
}

/// (leader, epoch) of every partition of `t`.
fn grants(a: &Assignment) -> Vec<(i32, i32)> {
    a.topics["t"]
        .partitions
        .iter()
        .map(|e| (e.leader, e.epoch))
        .collect()
}

/// Catches: a successor that times the dead controller's brokers from zero
/// after winning the election (a second lease + grace before re-granting,
/// controller failover ~8–10 s), and — the other side of the invariant — a
/// successor that declares a broker dead on less than lease + grace of its
/// own observation.
#[test]
fn a_successor_regrants_the_dead_controllers_partitions_in_its_first_pass() {
    let d = tempfile::tempdir().unwrap();
    let cluster = d.path().join("__cluster");
    let data = d.path().to_path_buf();
    stamp_topic(&data, 6);
    let clock = FakeClock::new();
    let (s0, s1, s2) = (
        shared(&cluster, 0, 100, &clock),
        shared(&cluster, 1, 101, &clock),
        shared(&cluster, 2, 102, &clock),
    );
    let (mut m0, mut m1, mut m2) = (beat(real(), &s0), beat(real(), &s1), beat(real(), &s2));
    let mut c0 = ControllerState::new(real(), s0.clone(), data.clone());
    assert!(c0.tick());
    assert_eq!(c0.epoch(), Some(1));
    let mut c1 = ControllerState::new(real(), s1.clone(), data.clone());
    // All three alive for a while; broker 1 is a candidate watching.
    for _ in 0..10 {
        clock.advance(TIMING.poll);
        m0.beat();
        m1.beat();
        m2.beat();
        c0.tick();
        c1.tick();
    }
    assert_eq!(c1.epoch(), None);
    let before = on_disk(&cluster);
    let held = |a: &Assignment, b: i32| grants(a).iter().filter(|(l, _)| *l == b).count();
    assert_eq!(
        (held(&before, 0), held(&before, 1), held(&before, 2)),
        (2, 2, 2)
    );
    // kill -9 of the controller's broker; broker 2 dies 2.5 s later.
    let killed = clock.now();
    let two_dies = killed + Duration::from_millis(2500);
    let mut two_last_beat = killed;
    let step = |m1: &mut MembershipState, m2: &mut MembershipState, c1: &mut ControllerState| {
        clock.advance(TIMING.poll);
        m1.beat();
        let beat2 = clock.now() <= two_dies;
        if beat2 {
            m2.beat();
        }
        c1.tick();
        beat2
    };
    while c1.epoch().is_none() {
        if step(&mut m1, &mut m2, &mut c1) {
            two_last_beat = clock.now();
        }
        // Before anyone can re-grant, Metadata on this host already stops
        // naming the silent controller's broker once it has stood still for
        // a lease here (clients re-query quickly), and only then.
        let silent_for = clock.now() - killed;
        if silent_for > TIMING.lease + TIMING.poll {
            assert!(s1.is_silent(0), "still advertised after {silent_for:?}");
        } else if silent_for <= TIMING.lease {
            assert!(!s1.is_silent(0), "hidden after only {silent_for:?}");
        }
        assert!(!s1.is_silent(2) && !s1.is_silent(1));
        assert!(
            clock.now() - killed <= TIMING.dead_after() + 2 * TIMING.poll,
            "no election"
        );
    }
    let elected = clock.now();
    assert!(
        elected - killed >= TIMING.dead_after(),
        "elected {:?} after the kill",
        elected - killed
    );
    assert_eq!(c1.epoch(), Some(2));
    // The first pass, or at most one poll later: broker 0's grants are void.
    let mut after = on_disk(&cluster);
    if held(&after, 0) > 0 {
        if step(&mut m1, &mut m2, &mut c1) {
            two_last_beat = clock.now();
        }
        after = on_disk(&cluster);
    }
    assert!(clock.now() - elected <= TIMING.poll);
    assert_eq!(
        held(&after, 0),
        0,
        "the dead controller's partitions re-granted within a poll of the election: {:?}",
        grants(&after)
    );
    for ((l0, e0), (l1, e1)) in grants(&before).into_iter().zip(grants(&after)) {
        if l0 == 0 {
            assert!(l1 == 1 || l1 == 2, "granted to a live broker");
            assert_eq!(e1, e0 + 1, "at the next leader epoch");
        } else {
            assert_eq!((l1, e1), (l0, e0), "other grants stand");
        }
    }
    // Broker 2 has been silent too, but not for lease + grace of our own
    // observation: alive (its grants stand) until exactly that.
    assert!(c1.liveness(2).unwrap().alive);
    loop {
        step(&mut m1, &mut m2, &mut c1);
        let silent = clock.now() - two_last_beat;
        let alive = c1.liveness(2).unwrap().alive;
        if silent <= TIMING.dead_after() {
            assert!(alive, "broker 2 declared dead after {silent:?} of silence");
            assert_eq!(
                held(&on_disk(&cluster), 2),
                held(&after, 2),
                "its grants stand"
            );
        } else if !alive {
            break;
        }
        assert!(
            silent <= TIMING.dead_after() + 2 * TIMING.poll,
            "never dead"
        );
    }
    // Once dead, everything moves to broker 1 in the same pass.
    assert_eq!(held(&on_disk(&cluster), 1), 6);
}

/// Catches: a leaving broker that waits for a hand-off (to the shutdown
/// timeout) although every other broker is leaving too.
#[test]
fn no_handoff_is_possible_once_every_other_broker_is_leaving() {
    use super::membership::handoff_possible;
    let d = tempfile::tempdir().unwrap();
    let cluster = d.path();
    std::fs::create_dir_all(cluster.join(BROKERS_DIR)).unwrap();
    let fs = real();
    let put = |r: &BrokerRecord| {
        write_json(fs.as_ref(), &broker_record_path(cluster, r.broker_id), r).unwrap()
    };
    let mut me = record(0, 10, 1);
    me.shutting_down = true;
    put(&me);
    put(&record(1, 11, 1));
    let mut two = record(2, 12, 1);
    two.clean_exit = true;
    put(&two);
    assert!(
        handoff_possible(fs.as_ref(), cluster, 0, [0, 1, 2]),
        "1 can take it"
    );
    let mut one = record(1, 11, 2);
    one.shutting_down = true;
    put(&one);
    assert!(
        !handoff_possible(fs.as_ref(), cluster, 0, [0, 1, 2]),
        "1 is leaving, 2 left"
    );
    assert!(
        !handoff_possible(fs.as_ref(), cluster, 0, [0, 3]),
        "3 has no record"
    );
}

/// Brokers 1 (the controller's) and 2 on one volume holding topic `t` of
/// four partitions, driven a poll at a time.
struct TwoBrokers {
    d: tempfile::TempDir,
    clock: Arc<FakeClock>,
    s1: Arc<Shared>,
    s2: Arc<Shared>,
    m1: MembershipState,
    m2: MembershipState,
    c: ControllerState,
}

impl TwoBrokers {
    fn new() -> Self {
        Self::with_fs(real())
    }

    /// The controller reads the volume through `fs`.
    fn with_fs(fs: SharedFs) -> Self {
        let d = tempfile::tempdir().unwrap();
        let cluster = d.path().join("__cluster");
        stamp_topic(d.path(), 4);
        let clock = FakeClock::new();
        let (s1, s2) = (
            shared(&cluster, 1, 11, &clock),
            shared(&cluster, 2, 22, &clock),
        );
        let (m1, m2) = (beat(real(), &s1), beat(real(), &s2));
        let mut c = ControllerState::new(fs, s1.clone(), d.path().to_path_buf());
        c.tick();
        Self {
            d,
            clock,
            s1,
            s2,
            m1,
            m2,
            c,
        }
    }

    fn data(&self) -> std::path::PathBuf {
        self.d.path().to_path_buf()
    }

    /// One poll: broker 1 applies every version at once, broker 2 only
    /// when `apply2`; both heartbeat; the controller runs a pass. Returns
    /// the assignment on disk.
    fn pass(&mut self, apply2: bool) -> Assignment {
        let cluster = self.d.path().join("__cluster");
        self.clock.advance(TIMING.poll);
        let v = on_disk(&cluster);
        self.s1.state.lock().unwrap().applied = (v.controller_epoch, v.version);
        if apply2 {
            self.s2.state.lock().unwrap().applied = (v.controller_epoch, v.version);
        }
        self.m1.beat();
        self.m2.beat();
        self.c.tick();
        on_disk(&cluster)
    }
}

/// Catches: a topic directory renamed aside while a live leader of it still
/// has files open (it would keep acknowledging into a directory that
/// belongs to no topic), a deleting topic's partition granted again, and a
/// delete that never finishes.
#[test]
fn a_delete_renames_the_directory_aside_only_after_every_leader_let_go() {
    let mut t = TwoBrokers::new();
    let data = t.data();
    let mut pass = |apply2: bool| t.pass(apply2);
    let mut a = pass(true);
    for _ in 0..5 {
        a = pass(true);
    }
    let held = |a: &Assignment, b: i32| grants(a).iter().filter(|(l, _)| *l == b).count();
    assert_eq!((held(&a, 1), held(&a, 2)), (2, 2));
    let id = uuid::Uuid::from_u128(7);
    // Through the catalog, as DeleteTopics does: the request, then its
    // notice to the controller.
    crate::topic::TopicCatalog::load(real(), &data)
        .unwrap()
        .with_notices(&data.join("__cluster"))
        .request_delete("t", Some(id))
        .unwrap();
    // The controller acts on the notice; broker 2 does not apply the
    // vacating version yet.
    let mut vacating = None;
    for _ in 0..3 {
        let a = pass(false);
        if a.topics.get("t").is_some_and(|t| t.deleting) {
            vacating = Some(a);
            break;
        }
    }
    let v = vacating.expect("the controller never acted on the request");
    assert_eq!(held(&v, 1) + held(&v, 2), 0, "every grant withdrawn");
    for _ in 0..20 {
        let a = pass(false);
        assert!(
            data.join("t").is_dir(),
            "renamed aside while broker 2 may still write: {a:?}"
        );
        assert!(a.topics["t"].partitions.iter().all(|e| e.leader < 0));
    }
    // Broker 2 reports it let go: the directory goes aside, then the topic
    // leaves the assignment.
    let mut gone = false;
    for _ in 0..10 {
        let a = pass(true);
        if !a.topics.contains_key("t") {
            gone = true;
            break;
        }
    }
    assert!(gone, "the delete never finished");
    assert!(!data.join("t").exists());
    // A re-create of the name is a new incarnation, granted afresh.
    let b = kaas_volume::topic_dir::plan_create(real().as_ref(), &data, "t", 2, Default::default())
        .unwrap();
    kaas_volume::topic_dir::create(real().as_ref(), &data, &b).unwrap();
    let mut granted = false;
    for _ in 0..30 {
        let a = pass(true);
        if a.topics.get("t").is_some_and(|t| {
            t.topic_id == b.topic_id && !t.deleting && t.partitions.iter().all(|e| e.leader > 0)
        }) {
            granted = true;
            break;
        }
    }
    assert!(granted);
}

/// Catches: a topic whose directory vanished (removed by hand, or missing
/// from one listing) dropped from the assignment at once, so that its
/// leaders are not waited for and a re-appearance is granted to a second
/// leader while the first still has files open.
#[test]
fn a_vanished_topic_is_let_go_two_phase_like_a_deleted_one() {
    let mut t = TwoBrokers::new();
    let data = t.data();
    let mut pass = |apply2: bool| t.pass(apply2);
    for _ in 0..6 {
        pass(true);
    }
    std::fs::remove_dir_all(data.join("t")).unwrap();
    // Gone without a notice: seen at the next listing.
    let polls = (super::controller::LIST_EVERY.as_millis() / TIMING.poll.as_millis()) as usize;
    let mut seen = false;
    for _ in 0..=polls {
        if pass(false).topics.get("t").is_some_and(|t| t.deleting) {
            seen = true;
            break;
        }
    }
    assert!(seen, "a vanished topic not seen within a listing interval");
    for _ in 0..20 {
        let a = pass(false);
        let t = a.topics.get("t").expect("kept until broker 2 let go");
        assert!(t.deleting);
        assert!(t.partitions.iter().all(|e| e.leader < 0));
        assert!(t
            .partitions
            .iter()
            .any(|e| e.releasing.is_some_and(|r| r.0 == 2)));
    }
    let mut gone = false;
    for _ in 0..5 {
        if !pass(true).topics.contains_key("t") {
            gone = true;
            break;
        }
    }
    assert!(gone);
}

/// Catches: a topic missing from a stale listing of the data directory (an
/// NFS client's cached listing that predates it; on weakfs a new
/// controller's first listing after a failover) taken for vanished: every
/// partition of a live topic was let go and granted again, each leader
/// moved for nothing. Looked up by exact name it is kept; gone for real it
/// is still let go.
#[test]
fn a_topic_a_stale_listing_misses_is_looked_up_by_name_and_kept() {
    let seam = OnOpen::default();
    let mut t = TwoBrokers::with_fs(Arc::new(seam.clone()));
    let data = t.data();
    let mut before = t.pass(true);
    for _ in 0..6 {
        before = t.pass(true);
    }
    assert!(grants(&before).iter().all(|(l, _)| *l > 0), "{before:?}");
    seam.hide_name("t");
    let polls = (super::controller::LIST_EVERY.as_millis() / TIMING.poll.as_millis()) as usize;
    for _ in 0..=2 * polls {
        let a = t.pass(true);
        let got = a
            .topics
            .get("t")
            .expect("a listed-out topic left the assignment");
        assert!(
            !got.deleting,
            "a topic a stale listing missed is being let go"
        );
        assert_eq!(grants(&a), grants(&before), "its partitions moved");
    }
    // Gone for real (the listing still misses it): let go two-phase.
    std::fs::remove_dir_all(data.join("t")).unwrap();
    let mut seen = false;
    for _ in 0..=polls {
        if t.pass(false).topics.get("t").is_some_and(|t| t.deleting) {
            seen = true;
            break;
        }
    }
    assert!(seen, "a vanished topic not let go");
}

/// A delete request whose notice was lost (the poster died between the two)
/// is still acted on: by the slow refresh, not never. Fails if topics are
/// only ever re-read on a notice.
#[test]
fn a_delete_without_its_notice_is_seen_by_the_slow_refresh() {
    let mut t = TwoBrokers::new();
    let data = t.data();
    for _ in 0..6 {
        t.pass(true);
    }
    kaas_volume::topic_dir::request_delete(
        real().as_ref(),
        &data,
        "t",
        Some(uuid::Uuid::from_u128(7)),
    )
    .unwrap();
    for _ in 0..3 {
        assert!(
            !t.pass(true).topics["t"].deleting,
            "no notice: not seen at once"
        );
    }
    // Time passes with the brokers heartbeating (a jump would lapse them).
    let step = TIMING.lease / 3;
    let steps = (super::controller::TOPIC_REFRESH.as_millis() / step.as_millis()) as usize + 2;
    let mut seen = false;
    for _ in 0..steps {
        t.clock.advance(step);
        if t.pass(true).topics.get("t").is_some_and(|t| t.deleting) {
            seen = true;
            break;
        }
    }
    assert!(seen, "the slow refresh never re-read the topic");
}

/// An idle controller's volume traffic does not grow with the number of
/// topics: with 200 topics settled, 20 passes without a change notice cost
/// the same few operations per pass as with 1 (listings, broker records,
/// the assignment) — not three reads per topic per second, as it did.
#[test]
fn an_idle_controller_does_not_reread_every_topic() {
    let ops_per_idle_pass = |topics: usize| {
        let d = tempfile::tempdir().unwrap();
        let cluster = d.path().join("__cluster");
        for i in 0..topics {
            let name = format!("t{i}");
            let stamp = crate::topic::TopicStamp {
                topic_id: uuid::Uuid::from_u128(100 + i as u128),
                name: name.clone(),
                partitions: 1,
                configs: Default::default(),
                adopted: false,
            };
            std::fs::create_dir_all(d.path().join(&name)).unwrap();
            write_json(
                real().as_ref(),
                &d.path().join(&name).join(crate::topic::STAMP),
                &stamp,
            )
            .unwrap();
        }
        let clock = FakeClock::new();
        let s1 = shared(&cluster, 1, 11, &clock);
        let mut m1 = beat(real(), &s1);
        let counted = FaultFs::new();
        let mut c = ControllerState::new(
            Arc::new(counted.clone()),
            s1.clone(),
            d.path().to_path_buf(),
        );
        let mut pass = || {
            clock.advance(TIMING.poll);
            if let Ok(c) = super::history::read_current(real().as_ref(), &cluster) {
                let v = c.assignment;
                s1.state.lock().unwrap().applied = (v.controller_epoch, v.version);
            }
            m1.beat();
            c.tick();
        };
        for _ in 0..40 {
            pass();
        }
        let before = counted.ops();
        for _ in 0..20 {
            pass();
        }
        (counted.ops() - before) as f64 / 20.0
    };
    let one = ops_per_idle_pass(1);
    let many = ops_per_idle_pass(200);
    assert!(
        many <= one + 2.0,
        "idle pass: {one} ops with 1 topic, {many} with 200"
    );
}

/// The watcher re-reads the assignment every poll but parses it only when
/// its bytes changed: the periodic re-apply of an unchanged file hands out
/// the very assignment parsed before (at 10,000 partitions the parse was
/// most of an idle broker's CPU), and a changed file is parsed afresh.
#[test]
fn the_watcher_parses_the_assignment_only_when_it_changed() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let s = shared(d.path(), 1, 11, &clock);
    let _m = beat(real(), &s);
    let mut w = WatcherState::new(real(), s.clone());
    let write = |version: u64| {
        let a = Assignment {
            controller_epoch: 1,
            version,
            ..Assignment::default()
        };
        write_json(real().as_ref(), &d.path().join(ASSIGNMENT), &a).unwrap();
    };
    write(1);
    let first = w.poll().expect("applies");
    w.done(&first);
    let mut again = None;
    for _ in 0..25 {
        if let Some(a) = w.poll() {
            w.done(&a);
            again = Some(a);
            break;
        }
    }
    let again = again.expect("re-applied within 20 polls");
    assert!(
        Arc::ptr_eq(&first.assignment, &again.assignment),
        "re-parsed an unchanged file"
    );
    write(2);
    let next = w.poll().expect("a new version applies");
    assert_eq!(next.assignment.version, 2);
}

/// The topic `name` with `n` partitions and id `id`, stamped in `data`.
fn stamp_named(data: &Path, name: &str, id: u128, n: i32) {
    let stamp = crate::topic::TopicStamp {
        topic_id: uuid::Uuid::from_u128(id),
        name: name.into(),
        partitions: n,
        configs: Default::default(),
        adopted: false,
    };
    std::fs::create_dir_all(data.join(name)).unwrap();
    write_json(
        real().as_ref(),
        &data.join(name).join(crate::topic::STAMP),
        &stamp,
    )
    .unwrap();
    // As the catalog does: announced, so the controller reads it the
    // next pass (it lists the directory only every LIST_EVERY).
    notice(data, name, id_of(id));
}

/// A seam over the real filesystem that counts the bytes written through
/// it, and can hold the exclusive create of an assignment version (a
/// process paused inside that syscall, after its lease check) until told.
#[derive(Clone, Default)]
struct Tap {
    bytes: Arc<std::sync::atomic::AtomicU64>,
    gate: Arc<(std::sync::Mutex<Gate>, std::sync::Condvar)>,
}

/// (armed, arrived, released)
type Gate = (bool, bool, bool);

struct TapFile {
    inner: Arc<dyn kaas_volume::fs::WriteFile>,
    bytes: Arc<std::sync::atomic::AtomicU64>,
}

impl kaas_volume::fs::ReadFile for TapFile {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
        self.inner.read_at(buf, pos)
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
}

impl kaas_volume::fs::WriteFile for TapFile {
    fn write_all_at(&self, buf: &[u8], pos: u64) -> std::io::Result<()> {
        self.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.write_all_at(buf, pos)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
}

impl Tap {
    fn written(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
    fn arm(&self) {
        *self.gate.0.lock().unwrap() = (true, false, false);
    }
    fn wait_arrived(&self) {
        let (m, cv) = &*self.gate;
        let mut g = m.lock().unwrap();
        while !g.1 {
            g = cv.wait(g).unwrap();
        }
    }
    fn release(&self) {
        let (m, cv) = &*self.gate;
        m.lock().unwrap().2 = true;
        cv.notify_all();
    }
    fn wrap(&self, f: Arc<dyn kaas_volume::fs::WriteFile>) -> Arc<dyn kaas_volume::fs::WriteFile> {
        Arc::new(TapFile {
            inner: f,
            bytes: self.bytes.clone(),
        })
    }
}

impl kaas_volume::fs::Fs for Tap {
    fn open_read(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::ReadFile>> {
        RealFs.open_read(p)
    }
    fn create_exclusive(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::WriteFile>> {
        let held = p
            .parent()
            .is_some_and(|d| d.ends_with(kaas_volume::layout::ASSIGNMENT_HISTORY_DIR));
        if held {
            let (m, cv) = &*self.gate;
            let mut g = m.lock().unwrap();
            if g.0 {
                g.0 = false;
                g.1 = true;
                cv.notify_all();
                while !g.2 {
                    g = cv.wait(g).unwrap();
                }
            }
        }
        RealFs.create_exclusive(p).map(|f| self.wrap(f))
    }
    fn open_write(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::WriteFile>> {
        RealFs.open_write(p).map(|f| self.wrap(f))
    }
    fn rename(&self, a: &Path, b: &Path) -> std::io::Result<()> {
        RealFs.rename(a, b)
    }
    fn remove_file(&self, p: &Path) -> std::io::Result<()> {
        RealFs.remove_file(p)
    }
    fn create_dir_all(&self, p: &Path) -> std::io::Result<()> {
        RealFs.create_dir_all(p)
    }
    fn create_dir(&self, p: &Path) -> std::io::Result<()> {
        RealFs.create_dir(p)
    }
    fn remove_dir(&self, p: &Path) -> std::io::Result<()> {
        RealFs.remove_dir(p)
    }
    fn list(&self, d: &Path) -> std::io::Result<Vec<String>> {
        RealFs.list(d)
    }
    fn is_dir(&self, p: &Path) -> bool {
        RealFs.is_dir(p)
    }
    fn sync_dir(&self, d: &Path) -> std::io::Result<()> {
        RealFs.sync_dir(d)
    }
}

/// Every version in the history, in order: (number, delta).
fn history_of(cluster: &Path) -> Vec<(u64, super::records::AssignmentDelta)> {
    let mut out = Vec::new();
    let mut n = 1;
    loop {
        match super::history::probe(&RealFs, cluster, n).unwrap() {
            super::history::Probe::Found(d) => out.push((n, d)),
            super::history::Probe::Torn => panic!("version {n} torn"),
            super::history::Probe::Absent => return out,
        }
        n += 1;
    }
}

/// Catches: a history whose cost grows with its size — the whole map
/// rewritten per version (creating N topics wrote O(N²) bytes: 4,500
/// topics took 8 minutes, issue 13), or checkpoints written so often that
/// they do the same.
#[test]
fn creating_n_topics_writes_o_of_n_bytes() {
    // (bytes written through the seam, bytes of the versions themselves).
    let bytes_for = |n: usize| -> (f64, f64) {
        let d = tempfile::tempdir().unwrap();
        let cluster = d.path().join("__cluster");
        let clock = FakeClock::new();
        let s = shared(&cluster, 1, 11, &clock);
        let mut m = beat(real(), &s);
        let tap = Tap::default();
        let mut c = ControllerState::new(Arc::new(tap.clone()), s.clone(), d.path().to_path_buf());
        assert!(c.tick());
        let start = tap.written();
        for i in 0..n {
            stamp_named(d.path(), &format!("topic-{i:05}"), 1000 + i as u128, 3);
            clock.advance(TIMING.poll);
            m.beat();
            assert!(c.tick(), "topic {i} published");
        }
        // Quiet: the checkpoint catches up once.
        run(&clock, &mut m, &mut c, Duration::from_secs(3));
        let a = on_disk(&cluster);
        assert_eq!(a.topics.len(), n);
        let cp = super::history::read_checkpoint(&RealFs, &cluster)
            .unwrap()
            .unwrap();
        let cp = super::history::parse_checkpoint(&cluster, &cp).unwrap();
        assert_eq!(cp, a, "the idle checkpoint is current");
        let versions: u64 = std::fs::read_dir(cluster.join("assignment"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        ((tap.written() - start) as f64, versions as f64)
    };
    let (small, small_versions) = bytes_for(50);
    let (large, large_versions) = bytes_for(400);
    // A version costs what changed, whatever the map's size: the average
    // version does not grow with the number of topics…
    assert!(
        large_versions / 400.0 < 1.3 * small_versions / 50.0,
        "50 topics: {small_versions} bytes of versions, 400: {large_versions}"
    );
    // …and checkpoints add at most a constant factor (each is written once
    // the versions since the last add up to its size). Together: O(N).
    assert!(
        large < 4.0 * large_versions,
        "400 topics: {large} bytes written for {large_versions} bytes of versions"
    );
    assert!(
        small < 4.0 * small_versions + 70_000.0,
        "{small} for {small_versions}"
    );
}

/// Catches: a deposed controller's publish that lands after its
/// successor's takeover (issue 12 item 3: p1 granted at epoch 2 to one
/// broker while the successor had given it to another), and watchers
/// applying anything but the one linear history. The deposed controller
/// is paused *inside* the create of its next version — after every lease
/// check it makes — and resumes after the successor has published. Its
/// own clock stands still meanwhile, so its lease still looks valid to it:
/// the exclusive create alone must stop it.
#[test]
fn a_deposed_controllers_delayed_publish_never_reaches_a_watcher() {
    let d = tempfile::tempdir().unwrap();
    let cluster = d.path().join("__cluster");
    let data = d.path().to_path_buf();
    stamp_topic(&data, 6);
    let clock = FakeClock::new();
    let clock0 = FakeClock::new();
    let (s0, s1, s2) = (
        shared(&cluster, 0, 100, &clock0),
        shared(&cluster, 1, 101, &clock),
        shared(&cluster, 2, 102, &clock),
    );
    let (mut m0, mut m1, mut m2) = (beat(real(), &s0), beat(real(), &s1), beat(real(), &s2));
    let tap = Tap::default();
    let mut c0 = ControllerState::new(Arc::new(tap.clone()), s0.clone(), data.clone());
    let mut c1 = ControllerState::new(real(), s1.clone(), data.clone());
    let mut w1 = WatcherState::new(real(), s1.clone());
    let mut w2 = WatcherState::new(real(), s2.clone());
    // Every (controller epoch, version, grants) each watcher applied.
    type Seen = Vec<(i32, u64, Vec<(i32, i32)>)>;
    let (mut seen1, mut seen2): (Seen, Seen) = (Vec::new(), Vec::new());
    let watch = |w: &mut WatcherState, seen: &mut Seen| {
        if let Some(a) = w.poll() {
            if a.lead && a.assignment.topics.contains_key("t") {
                let x = &a.assignment;
                if seen
                    .last()
                    .is_none_or(|l| (l.0, l.1) != (x.controller_epoch, x.version))
                {
                    seen.push((x.controller_epoch, x.version, grants(x)));
                }
            }
            w.done(&a);
        }
    };
    assert!(c0.tick());
    for _ in 0..10 {
        clock.advance(TIMING.poll);
        clock0.advance(TIMING.poll);
        m0.beat();
        m1.beat();
        m2.beat();
        c0.tick();
        c1.tick();
        watch(&mut w1, &mut seen1);
        watch(&mut w2, &mut seen2);
    }
    assert_eq!((c0.epoch(), c1.epoch()), (Some(1), None));
    let last_of_0 = on_disk(&cluster).version;
    // Broker 2 asks to leave: controller 0 plans to move its partitions and
    // is paused inside the create of that version.
    s2.state.lock().unwrap().shutting_down = true;
    m2.beat();
    tap.arm();
    let paused = std::thread::spawn(move || {
        let wrote = c0.tick();
        (c0, wrote)
    });
    tap.wait_arrived();
    // Broker 0 is silent from here; broker 1 takes over and publishes.
    let mut published_by_1 = false;
    for _ in 0..200 {
        clock.advance(TIMING.poll);
        m1.beat();
        m2.beat();
        published_by_1 |= c1.tick();
        watch(&mut w1, &mut seen1);
        watch(&mut w2, &mut seen2);
        if published_by_1 {
            break;
        }
    }
    assert!(
        published_by_1 && c1.epoch() == Some(2),
        "successor took over"
    );
    let takeover = on_disk(&cluster);
    assert_eq!(
        takeover.version,
        last_of_0 + 1,
        "the successor took the next number"
    );
    // Controller 0 resumes inside its create: the number is taken.
    tap.release();
    let (mut c0, wrote) = paused.join().unwrap();
    assert!(!wrote, "the deposed controller published nothing");
    for _ in 0..30 {
        clock.advance(TIMING.poll);
        clock0.advance(TIMING.poll);
        m0.beat();
        m1.beat();
        m2.beat();
        c0.tick();
        c1.tick();
        watch(&mut w1, &mut seen1);
        watch(&mut w2, &mut seen2);
    }
    assert_eq!(c0.epoch(), None, "the deposed controller stepped down");
    // The history is linear: epoch 1 up to the takeover, epoch 2 after.
    let h = history_of(&cluster);
    for (n, v) in &h {
        let want = if *n <= last_of_0 { 1 } else { 2 };
        assert_eq!(v.controller_epoch, want, "version {n}: {v:?}");
    }
    // Every watcher applied versions of that history, in order, and
    // nothing of epoch 1 after the takeover.
    let mut folded = super::records::Assignment::default();
    let mut states = std::collections::BTreeMap::new();
    for (n, v) in &h {
        v.apply_to(&mut folded);
        if folded.topics.contains_key("t") {
            states.insert(*n, (folded.controller_epoch, grants(&folded)));
        }
    }
    for seen in [&seen1, &seen2] {
        assert!(
            seen.windows(2).all(|w| w[0].1 < w[1].1),
            "in order: {seen:?}"
        );
        for (e, v, g) in seen.iter() {
            assert_eq!(
                states.get(v),
                Some(&(*e, g.clone())),
                "version {v} as applied"
            );
        }
        assert!(seen.last().unwrap().0 == 2, "{seen:?}");
    }
}

/// Catches: a publish that readers can see torn or half-applied, that is
/// acknowledged but not durable, that leaves a version no later
/// controller gets past (a torn one is never completed), or a recovery
/// that rewrites a version some reader may already have applied.
#[test]
fn crash_at_every_step_of_an_assignment_publish() {
    // Broker 1 is controller over `ffs` and has published v1; broker 2
    // joins, and the next pass publishes v2 (crashing at step `crash`).
    struct Run {
        d: tempfile::TempDir,
        clock: Arc<FakeClock>,
        s2: Arc<Shared>,
        m2: MembershipState,
        ffs: FaultFs,
        acked: bool,
        steps: u64,
    }
    let scenario = |crash: Option<u64>| -> Run {
        let d = tempfile::tempdir().unwrap();
        let cluster = d.path().join("__cluster");
        stamp_topic(d.path(), 4);
        let clock = FakeClock::new();
        let s1 = shared(&cluster, 1, 11, &clock);
        let mut m1 = beat(real(), &s1);
        let ffs = FaultFs::new();
        let mut c1 =
            ControllerState::new(Arc::new(ffs.clone()), s1.clone(), d.path().to_path_buf());
        assert!(c1.tick(), "v1");
        let s2 = shared(&cluster, 2, 22, &clock);
        let m2 = beat(real(), &s2);
        let start = ffs.ops();
        if let Some(n) = crash {
            ffs.crash_at(start + n);
        }
        clock.advance(TIMING.poll);
        m1.beat();
        let acked = c1.tick();
        let steps = ffs.ops() - start;
        Run {
            d,
            clock,
            s2,
            m2,
            ffs,
            acked,
            steps,
        }
    };
    let clean = scenario(None);
    assert!(clean.acked, "the clean run publishes v2");
    let cl = clean.d.path().join("__cluster");
    let a2 = super::history::read_current(&RealFs, &cl)
        .unwrap()
        .assignment;
    assert_eq!(a2.version, 2);
    let mut a1 = super::records::Assignment::default();
    history_of(&cl)[0].1.apply_to(&mut a1);
    assert!(
        clean.steps >= 4,
        "create, write, fsync, dir fsync: {}",
        clean.steps
    );
    let (mut saw_old, mut saw_new, mut saw_torn) = (false, false, false);
    for n in 1..=clean.steps {
        let Run {
            d,
            clock,
            s2,
            mut m2,
            ffs,
            acked,
            ..
        } = scenario(Some(n));
        ffs.power_loss();
        let cluster = d.path().join("__cluster");
        let cur = super::history::read_current(&RealFs, &cluster).unwrap();
        assert!(
            cur.assignment == a1 || cur.assignment == a2,
            "step {n}: neither v1 nor v2: {:?}",
            cur.assignment
        );
        assert!(
            !acked || cur.assignment == a2,
            "step {n}: acknowledged, then lost"
        );
        saw_old |= cur.assignment == a1;
        saw_new |= cur.assignment == a2;
        saw_torn |= cur.torn.is_some();
        // A fresh watcher applies v1 or v2 whole, never a torn version (v2
        // only once the head names it: a crash before the head write leaves
        // it to the next controller).
        let mut w = WatcherState::new(real(), s2.clone());
        let a = w.poll().expect("applies");
        assert!(
            *a.assignment == a1 || *a.assignment == cur.assignment,
            "step {n}: {:?}",
            a.assignment
        );
        w.done(&a);
        let v2_before = std::fs::read(super::history::version_path(&cluster, 2)).ok();
        // Broker 1 is dead; broker 2 takes over and gets past whatever the
        // crash left.
        let mut c2 = ControllerState::new(real(), s2.clone(), d.path().to_path_buf());
        let mut done = false;
        for _ in 0..200 {
            clock.advance(TIMING.poll);
            m2.beat();
            c2.tick();
            let now = super::history::read_current(&RealFs, &cluster).unwrap();
            if now.torn.is_none()
                && now.assignment.controller_epoch == 2
                && now.assignment.topics["t"]
                    .partitions
                    .iter()
                    .all(|e| e.leader == 2)
            {
                done = true;
                break;
            }
        }
        assert!(done, "step {n}: no convergence; ops {:?}", ffs.log());
        let h = history_of(&cluster);
        assert!(
            h.len() >= 2 && h[1].1.controller_epoch >= 1,
            "step {n}: {h:?}"
        );
        // A version that was whole stays exactly what it was.
        if cur.assignment == a2 {
            assert_eq!(
                std::fs::read(super::history::version_path(&cluster, 2)).ok(),
                v2_before,
                "step {n}: a complete version rewritten"
            );
        }
        // The watcher follows to the end, in order.
        let mut last = a.assignment.version;
        for _ in 0..5 {
            if let Some(a) = w.poll() {
                assert!(a.assignment.version > last, "step {n}");
                last = a.assignment.version;
                w.done(&a);
            }
        }
        assert_eq!(last, h.last().unwrap().0, "step {n}");
    }
    assert!(
        saw_old && saw_new && saw_torn,
        "{saw_old} {saw_new} {saw_torn}"
    );
}

/// A seam over the real filesystem that remembers which version numbers a
/// read of `assignment/head` or a listing of the history has named, and
/// records every open of a version file no head or listing had named yet.
struct Witness {
    cluster: std::path::PathBuf,
    named: std::sync::Mutex<(u64, std::collections::BTreeSet<u64>)>,
    early: std::sync::Mutex<Vec<u64>>,
    opened: std::sync::Mutex<Vec<u64>>,
    /// Every directory listed, in order.
    listed: std::sync::Mutex<Vec<std::path::PathBuf>>,
}

impl kaas_volume::fs::Fs for Witness {
    fn open_read(&self, path: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::ReadFile>> {
        let dir = super::history::history_dir(&self.cluster);
        let f = RealFs.open_read(path)?;
        if path == dir.join(kaas_volume::layout::ASSIGNMENT_HEAD) {
            if let Some(h) = super::history::read_head(&RealFs, &self.cluster)? {
                let mut n = self.named.lock().unwrap();
                n.0 = n.0.max(h);
            }
        } else if path.parent() == Some(dir.as_path()) {
            let name = path.file_name().unwrap().to_string_lossy();
            if let Some(v) = kaas_volume::layout::parse_assignment_version(&name) {
                self.opened.lock().unwrap().push(v);
                let n = self.named.lock().unwrap();
                if v > n.0 && !n.1.contains(&v) {
                    self.early.lock().unwrap().push(v);
                }
            }
        }
        Ok(f)
    }
    fn create_exclusive(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::WriteFile>> {
        RealFs.create_exclusive(p)
    }
    fn open_write(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::WriteFile>> {
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
    fn create_dir(&self, p: &Path) -> std::io::Result<()> {
        RealFs.create_dir(p)
    }
    fn remove_dir(&self, p: &Path) -> std::io::Result<()> {
        RealFs.remove_dir(p)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        let names = RealFs.list(dir)?;
        self.listed.lock().unwrap().push(dir.to_path_buf());
        if dir == super::history::history_dir(&self.cluster) {
            let mut n = self.named.lock().unwrap();
            n.1.extend(
                names
                    .iter()
                    .filter_map(|x| kaas_volume::layout::parse_assignment_version(x)),
            );
        }
        Ok(names)
    }
    fn is_dir(&self, p: &Path) -> bool {
        RealFs.is_dir(p)
    }
    fn sync_dir(&self, p: &Path) -> std::io::Result<()> {
        RealFs.sync_dir(p)
    }
}

/// Catches: a watcher probing `v+1` by exact name before anything named it
/// — on NFS that caches "no such file" for the directory's attribute
/// lifetime and hides the version for seconds once it exists. With a head,
/// versions past it stay unopened even when they exist (the head is written
/// after the version is durable); without a head (a checkpoint-only
/// cluster, or a head write that failed) only what a listing shows is
/// opened.
#[test]
fn the_watcher_never_opens_a_version_before_the_head_or_a_listing_names_it() {
    use super::history::{encode_version, publish, write_head};
    use super::records::AssignmentDelta;
    let d = tempfile::tempdir().unwrap();
    let cluster = d.path().join("__cluster");
    let clock = FakeClock::new();
    let s = shared(&cluster, 1, 11, &clock);
    let _m = beat(real(), &s);
    let w_fs = Arc::new(Witness {
        cluster: cluster.clone(),
        named: Default::default(),
        early: Default::default(),
        opened: Default::default(),
        listed: Default::default(),
    });
    let version = |n: u64| {
        let prev = Assignment {
            controller_epoch: 1,
            version: n - 1,
            ..Assignment::default()
        };
        let next = Assignment {
            version: n,
            ..prev.clone()
        };
        encode_version(&AssignmentDelta::between(&prev, &next))
    };
    let put = |n: u64| {
        let r = publish(&RealFs, &cluster, &version(n), n).unwrap();
        assert!(matches!(r, super::history::Published::Won), "{r:?}");
    };
    let mut w = WatcherState::new(w_fs.clone(), s.clone());
    let poll = |w: &mut WatcherState| {
        let a = w.poll();
        if let Some(a) = &a {
            w.done(a);
        }
        a.map(|a| a.assignment.version)
    };
    // No head yet: v1 and v2 exist; only a listing may name them.
    put(1);
    put(2);
    assert_eq!(poll(&mut w), Some(2));
    // The head names 2; v3 exists but the head does not name it yet (and
    // the listing seen so far does not either).
    write_head(&RealFs, &cluster, 2).unwrap();
    put(3);
    for _ in 0..3 {
        assert_eq!(poll(&mut w), None);
    }
    write_head(&RealFs, &cluster, 3).unwrap();
    assert_eq!(poll(&mut w), Some(3));
    // Idle polls with a head open no version at all.
    let before = w_fs.opened.lock().unwrap().len();
    for _ in 0..5 {
        assert_eq!(poll(&mut w), None);
    }
    assert_eq!(
        w_fs.opened.lock().unwrap().len(),
        before,
        "idle polls opened a version"
    );
    assert!(
        w_fs.early.lock().unwrap().is_empty(),
        "opened before named: {:?} (all opens {:?})",
        w_fs.early.lock().unwrap(),
        w_fs.opened.lock().unwrap()
    );
}

#[test]
fn a_paused_process_is_not_taken_for_a_stuck_poller_but_a_stuck_one_is() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let s = shared(d.path(), 1, 11, &clock);
    let mut m = beat(real(), &s);
    s.watcher_tick.store(s.now_ns(), Ordering::Release);
    s.controller_tick.store(s.now_ns(), Ordering::Release);
    clock.advance(TIMING.heartbeat);
    assert_eq!(m.beat(), BeatOutcome::Written { lease_valid: true });
    // The whole process stopped for five leases (SIGSTOP): every actor is
    // equally late, and the missed beats run back to back on resume. That
    // is a lapse, not a stuck actor.
    clock.advance(TIMING.lease * 5);
    for _ in 0..20 {
        assert_ne!(m.beat(), BeatOutcome::Withheld);
    }
    // The controller polls on, the watcher never again, the heartbeat runs
    // on time: withheld once the watcher stood still two leases of it.
    let mut ran = Duration::ZERO;
    loop {
        clock.advance(TIMING.heartbeat);
        ran += TIMING.heartbeat;
        s.controller_tick.store(s.now_ns(), Ordering::Release);
        if m.beat() == BeatOutcome::Withheld {
            break;
        }
        assert!(ran < TIMING.lease * 10, "a stuck watcher was never noticed");
    }
    // (The pause counts as at most two heartbeat intervals of it.)
    assert!(
        ran + TIMING.heartbeat * 2 > TIMING.lease * 2,
        "withheld after {ran:?}"
    );
}

#[test]
fn pollers_ticking_out_of_phase_slower_than_the_heartbeat_are_not_stuck() {
    // `--poll-ms 400` with a 200 ms heartbeat: the watcher polls at 0, 400,
    // 800 ms …, the controller at 200, 600 …, and every beat falls between
    // two polls of one of them. Neither has stopped; timed together they
    // looked stalled at every beat and the heartbeat was withheld.
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let s = shared(d.path(), 1, 11, &clock);
    let mut m = beat(real(), &s);
    let poll = TIMING.heartbeat * 2;
    let mut t = Duration::ZERO;
    while t < TIMING.lease * 10 {
        clock.advance(TIMING.heartbeat / 2);
        t += TIMING.heartbeat / 2;
        // Ticks on the half beats, alternating between the two pollers.
        let phase = (t.as_nanos() / (TIMING.heartbeat / 2).as_nanos()) % 4;
        match phase {
            0 => s.watcher_tick.store(s.now_ns(), Ordering::Release),
            2 => s.controller_tick.store(s.now_ns(), Ordering::Release),
            _ => {}
        }
        if phase % 2 == 1 {
            assert_eq!(
                m.beat(),
                BeatOutcome::Written { lease_valid: true },
                "withheld at {t:?} with both pollers ticking every {poll:?}"
            );
        }
    }
}

/// What [`OnOpen`] calls on every open for reading: it may act (a
/// heartbeat landing in the middle of a pass) and may name another file to
/// serve instead (a stale cached copy).
type OpenHook = Box<dyn FnMut(&Path) -> Option<std::path::PathBuf> + Send>;

/// A seam over the real filesystem that hands every open for reading to a
/// hook first (the test decides what another host's write or a cache does
/// at exactly that syscall), and leaves the broker records of `hidden` and
/// the names of `hide_name` out of every listing (a stale NFS listing: a
/// record created within the client's attribute lifetime).
#[derive(Clone, Default)]
struct OnOpen(
    Arc<std::sync::Mutex<Option<OpenHook>>>,
    Arc<std::sync::Mutex<Vec<i32>>>,
    Arc<std::sync::Mutex<Option<WriteHook>>>,
    Arc<std::sync::Mutex<Vec<String>>>,
);

/// What [`OnOpen`] calls on every exclusive create (with the new file)
/// and every rename (with its target), before it happens: something else
/// happening while a write is in flight.
type WriteHook = Box<dyn FnMut(&Path) + Send>;

impl OnOpen {
    fn on_write(&self, h: impl FnMut(&Path) + Send + 'static) {
        *self.2.lock().unwrap() = Some(Box::new(h));
    }
    fn set(&self, h: impl FnMut(&Path) -> Option<std::path::PathBuf> + Send + 'static) {
        *self.0.lock().unwrap() = Some(Box::new(h));
    }
    fn hide_broker(&self, id: i32) {
        self.1.lock().unwrap().push(id);
    }
    fn hide_name(&self, name: &str) {
        self.3.lock().unwrap().push(name.to_owned());
    }
}

impl kaas_volume::fs::Fs for OnOpen {
    fn open_read(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::ReadFile>> {
        let instead = self.0.lock().unwrap().as_mut().and_then(|h| h(p));
        RealFs.open_read(instead.as_deref().unwrap_or(p))
    }
    fn create_exclusive(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::WriteFile>> {
        if let Some(h) = self.2.lock().unwrap().as_mut() {
            h(p);
        }
        RealFs.create_exclusive(p)
    }
    fn open_write(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::WriteFile>> {
        RealFs.open_write(p)
    }
    fn rename(&self, a: &Path, b: &Path) -> std::io::Result<()> {
        if let Some(h) = self.2.lock().unwrap().as_mut() {
            h(b);
        }
        RealFs.rename(a, b)
    }
    fn remove_file(&self, p: &Path) -> std::io::Result<()> {
        RealFs.remove_file(p)
    }
    fn create_dir_all(&self, p: &Path) -> std::io::Result<()> {
        RealFs.create_dir_all(p)
    }
    fn create_dir(&self, p: &Path) -> std::io::Result<()> {
        RealFs.create_dir(p)
    }
    fn remove_dir(&self, p: &Path) -> std::io::Result<()> {
        RealFs.remove_dir(p)
    }
    fn list(&self, d: &Path) -> std::io::Result<Vec<String>> {
        let hidden = self.1.lock().unwrap().clone();
        let hidden_names = self.3.lock().unwrap().clone();
        let mut names = RealFs.list(d)?;
        names.retain(|n| {
            kaas_volume::layout::parse_broker_record(n).is_none_or(|id| !hidden.contains(&id))
                && !hidden_names.contains(n)
        });
        Ok(names)
    }
    fn is_dir(&self, p: &Path) -> bool {
        RealFs.is_dir(p)
    }
    fn sync_dir(&self, d: &Path) -> std::io::Result<()> {
        RealFs.sync_dir(d)
    }
}

/// Three brokers on `clock`; broker 0 the controller, broker 1 a candidate
/// reading through `seam`, all three alive for a second (so broker 1 has
/// watched everyone). The controller's broker is then killed by the test:
/// it simply stops beating and ticking.
struct ControllerKill {
    _d: tempfile::TempDir,
    cluster: std::path::PathBuf,
    clock: Arc<FakeClock>,
    /// Broker 0's membership, shared with a hook that may beat it.
    m0: Arc<std::sync::Mutex<MembershipState>>,
    m1: MembershipState,
    m2: MembershipState,
    /// Broker 2 keeps beating (else it died with the controller).
    two_alive: bool,
    s1: Arc<Shared>,
    c1: ControllerState,
}

impl ControllerKill {
    fn new(seam: OnOpen) -> Self {
        let d = tempfile::tempdir().unwrap();
        let cluster = d.path().join("__cluster");
        let data = d.path().to_path_buf();
        stamp_topic(&data, 6);
        let clock = FakeClock::new();
        let (s0, s1, s2) = (
            shared(&cluster, 0, 100, &clock),
            shared(&cluster, 1, 101, &clock),
            shared(&cluster, 2, 102, &clock),
        );
        let (m0, mut m1, mut m2) = (beat(real(), &s0), beat(real(), &s1), beat(real(), &s2));
        let m0 = Arc::new(std::sync::Mutex::new(m0));
        let mut c0 = ControllerState::new(real(), s0, data.clone());
        assert!(c0.tick());
        assert_eq!(c0.epoch(), Some(1));
        let mut c1 = ControllerState::new(Arc::new(seam), s1.clone(), data);
        for _ in 0..10 {
            clock.advance(TIMING.poll);
            m0.lock().unwrap().beat();
            m1.beat();
            m2.beat();
            c0.tick();
            c1.tick();
        }
        assert_eq!(c1.epoch(), None);
        let held = |b| {
            grants(&on_disk(&cluster))
                .iter()
                .filter(|(l, _)| *l == b)
                .count()
        };
        assert_eq!((held(0), held(1), held(2)), (2, 2, 2));
        Self {
            _d: d,
            cluster,
            clock,
            m0,
            m1,
            m2,
            two_alive: true,
            s1,
            c1,
        }
    }

    /// How many partitions broker 0 holds in the published history.
    fn held_by_dead(&self) -> usize {
        grants(&on_disk(&self.cluster))
            .iter()
            .filter(|(l, _)| *l == 0)
            .count()
    }

    /// Poll (broker 1 and 2 beating, broker 0 silent) until broker 1 is
    /// elected; asserts that the pass that elected it also re-granted
    /// broker 0's partitions, more than lease + grace and at most a poll
    /// more after `last_beat`, when broker 1 read broker 0's last heartbeat.
    fn successor_regrants(&mut self, last_beat: Duration) {
        while self.c1.epoch().is_none() {
            self.clock.advance(TIMING.poll);
            self.m1.beat();
            if self.two_alive {
                self.m2.beat();
            }
            self.c1.tick();
            let since = self.clock.now() - last_beat;
            assert!(
                since <= TIMING.dead_after() + TIMING.poll,
                "not elected {since:?} after the dead controller's last heartbeat"
            );
        }
        let elected = self.clock.now() - last_beat;
        assert!(
            elected >= TIMING.dead_after(),
            "elected after only {elected:?}"
        );
        assert_eq!(
            self.held_by_dead(),
            0,
            "the pass that elected the successor re-grants the dead controller's partitions"
        );
    }
}

/// Catches: the election timing the dead holder's record apart from the
/// observation the first pass plans from. Its last heartbeat lands while
/// the candidate reads the claim (after the candidate's own read of the
/// record, before its read for the election): the election counted from the
/// newer `seq`, the plan from the older one — the first pass found the
/// holder alive and re-granted only on a later pass. Now one read feeds
/// both, so the pass that elects also re-grants.
#[test]
fn the_pass_that_elects_the_successor_plans_from_the_observation_that_elected_it() {
    let seam = OnOpen::default();
    let mut k = ControllerKill::new(seam.clone());
    // Broker 0's last heartbeat lands during broker 1's next look at the
    // controller claims (the claim itself, or — between listings — the
    // exact-name probe of the next epoch).
    let (m0, clock) = (k.m0.clone(), k.clock.clone());
    let last_beat = Arc::new(std::sync::Mutex::new(None));
    let at = last_beat.clone();
    seam.set(move |p| {
        let p = p.to_string_lossy();
        let claim = p.ends_with(&kaas_volume::layout::controller_epoch(1))
            || p.ends_with(&kaas_volume::layout::controller_epoch(2));
        if claim && at.lock().unwrap().is_none() {
            m0.lock().unwrap().beat();
            *at.lock().unwrap() = Some(clock.now());
        }
        None
    });
    k.clock.advance(TIMING.poll);
    k.c1.tick();
    let last = last_beat
        .lock()
        .unwrap()
        .expect("broker 0 beat during the pass");
    k.successor_regrants(last);
}

/// Catches: a stale read of the dead holder's record (an older `seq`, as an
/// NFS attribute or page cache can serve) taken for a change, restarting
/// its stand-still: the successor then timed the dead controller from zero
/// again — a second lease + grace, failover ~8 s.
#[test]
fn a_stale_read_of_an_older_heartbeat_does_not_restart_the_dead_holders_silence() {
    let seam = OnOpen::default();
    let mut k = ControllerKill::new(seam.clone());
    let rec = broker_record_path(&k.cluster, 0);
    let stale = k.cluster.join("stale-0.json");
    std::fs::copy(&rec, &stale).unwrap();
    k.clock.advance(TIMING.poll);
    k.m0.lock().unwrap().beat();
    k.c1.tick();
    let last_beat = k.clock.now();
    // Broker 0 is killed. 2 s later one read of its record by broker 1
    // serves the heartbeat before its last.
    let (clock, due) = (k.clock.clone(), last_beat + Duration::from_secs(2));
    let mut served = false;
    seam.set(move |p| {
        (p == rec && clock.now() >= due && !std::mem::replace(&mut served, true))
            .then(|| stale.clone())
    });
    k.successor_regrants(last_beat);
}

/// Catches: a holder whose record vanished. The election timed the
/// absence, but the plan kept the record it had last read with its
/// stand-still frozen — the elected successor kept the gone broker's grants
/// forever. A record missing for lease + grace is now a gone broker for the
/// election and the plan alike.
#[test]
fn a_holder_whose_record_vanished_is_gone_for_the_election_and_the_plan_alike() {
    let mut k = ControllerKill::new(OnOpen::default());
    // Killed after the heartbeat broker 1 read last; its record vanishes.
    let last_beat = k.clock.now();
    std::fs::remove_file(broker_record_path(&k.cluster, 0)).unwrap();
    k.successor_regrants(last_beat);
}

/// Catches: a broker that holds grants but that a stale listing hides from
/// the candidate (its record created within an NFS client's attribute
/// lifetime). The candidate never watched it, so the successor first read
/// it after its election and timed it from zero: when it died with the
/// controller, its partitions moved a second lease + grace later. A
/// candidate now also reads every broker its own applied assignment names.
#[test]
fn a_broker_a_stale_listing_hides_is_timed_from_before_the_election() {
    let seam = OnOpen::default();
    seam.hide_broker(2);
    let mut k = ControllerKill::new(seam);
    // Broker 1's watcher applies the assignment (which names broker 2).
    let mut w1 = WatcherState::new(real(), k.s1.clone());
    let a = w1.poll().expect("an assignment to apply");
    assert!(w1.done(&a));
    k.clock.advance(TIMING.poll);
    k.m0.lock().unwrap().beat();
    k.m1.beat();
    k.m2.beat();
    k.c1.tick();
    // The controller's broker and broker 2 die together.
    let last_beat = k.clock.now();
    k.two_alive = false;
    k.successor_regrants(last_beat);
    let held_by_2 = grants(&on_disk(&k.cluster))
        .iter()
        .filter(|(l, _)| *l == 2)
        .count();
    assert_eq!(
        held_by_2, 0,
        "broker 2, silent as long as the controller, is re-granted in the same pass"
    );
}

/// A seam over the real filesystem that records every operation (kind,
/// path), and can answer listings of one directory from a stale copy (an
/// NFS client's cached listing) for a number of listings.
#[derive(Default)]
struct Counting {
    ops: std::sync::Mutex<Vec<(&'static str, std::path::PathBuf)>>,
    /// (directory, names it lists, listings left to answer so).
    stale: std::sync::Mutex<Option<(std::path::PathBuf, Vec<String>, usize)>>,
}

impl Counting {
    fn note(&self, kind: &'static str, p: &Path) {
        self.ops.lock().unwrap().push((kind, p.to_path_buf()));
    }
    fn count(&self, kind: &str, p: &Path) -> usize {
        let ops = self.ops.lock().unwrap();
        ops.iter().filter(|(k, q)| *k == kind && q == p).count()
    }
}

impl kaas_volume::fs::Fs for Counting {
    fn open_read(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::ReadFile>> {
        self.note("open", p);
        RealFs.open_read(p)
    }
    fn create_exclusive(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::WriteFile>> {
        self.note("create", p);
        RealFs.create_exclusive(p)
    }
    fn open_write(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::WriteFile>> {
        self.note("open", p);
        RealFs.open_write(p)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.note("rename", to);
        RealFs.rename(from, to)
    }
    fn remove_file(&self, p: &Path) -> std::io::Result<()> {
        self.note("unlink", p);
        RealFs.remove_file(p)
    }
    fn create_dir_all(&self, p: &Path) -> std::io::Result<()> {
        self.note("mkdir", p);
        RealFs.create_dir_all(p)
    }
    fn create_dir(&self, p: &Path) -> std::io::Result<()> {
        self.note("mkdir", p);
        RealFs.create_dir(p)
    }
    fn remove_dir(&self, p: &Path) -> std::io::Result<()> {
        self.note("rmdir", p);
        RealFs.remove_dir(p)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        self.note("list", dir);
        let mut stale = self.stale.lock().unwrap();
        if let Some((d, names, left)) = stale.as_mut() {
            if d == dir && *left > 0 {
                *left -= 1;
                return Ok(names.clone());
            }
        }
        RealFs.list(dir)
    }
    fn is_dir(&self, p: &Path) -> bool {
        self.note("stat", p);
        RealFs.is_dir(p)
    }
    fn sync_dir(&self, p: &Path) -> std::io::Result<()> {
        self.note("fsync", p);
        RealFs.sync_dir(p)
    }
}

/// `n` controller passes, `TIMING.poll` apart, every broker heartbeating
/// on each `beat_every`-th (from the first). Returns how many passes
/// published a version.
fn passes(
    clock: &FakeClock,
    n: usize,
    beat_every: usize,
    ms: &mut [&mut MembershipState],
    cs: &mut [&mut ControllerState],
) -> usize {
    let mut published = 0;
    for i in 0..n {
        clock.advance(TIMING.poll);
        if i % beat_every == 0 {
            for m in ms.iter_mut() {
                m.beat();
            }
        }
        for c in cs.iter_mut() {
            published += usize::from(c.tick());
        }
    }
    published
}

/// Broker 1 alone, elected controller over a counting filesystem, settled
/// past the checkpoint, the head write and the listings after its ring.
struct CountedController {
    _d: tempfile::TempDir,
    cluster: std::path::PathBuf,
    clock: Arc<FakeClock>,
    m1: MembershipState,
    w: Arc<Counting>,
    c: ControllerState,
}

fn a_settled_counted_controller() -> CountedController {
    let d = tempfile::tempdir().unwrap();
    let cluster = d.path().join("__cluster");
    stamp_topic(d.path(), 4);
    let clock = FakeClock::new();
    let s1 = shared(&cluster, 1, 11, &clock);
    let mut m1 = beat(real(), &s1);
    let w = Arc::new(Counting::default());
    let mut c = ControllerState::new(w.clone(), s1, d.path().to_path_buf());
    assert!(c.tick(), "v1");
    passes(&clock, 60, 1, &mut [&mut m1], &mut [&mut c]);
    CountedController {
        _d: d,
        cluster,
        clock,
        m1,
        w,
        c,
    }
}

/// Catches: an idle controller going to the volume several times every
/// pass — listing `brokers/` and `topic-changes/`, reading its own broker
/// record, probing the next controller epoch and the next history version
/// (about 180 metadata operations a second for an idle broker). Idle, a
/// pass reads the bell by exact name and nothing else; the probes, the data
/// directory listing and the safety-net listings come once a second or
/// less.
#[test]
fn an_idle_controller_reads_one_file_per_pass() {
    let mut f = a_settled_counted_controller();
    let (cluster, clock, w) = (f.cluster.clone(), f.clock.clone(), f.w.clone());
    let (m1, c) = (&mut f.m1, &mut f.c);
    w.ops.lock().unwrap().clear();
    // Ten seconds of idle passes, 100 ms apart, heartbeats between.
    let n = 100;
    let published = passes(&clock, n, 5, &mut [m1], &mut [c]);
    assert_eq!(published, 0, "idle: nothing published");
    let passes = n;
    assert_eq!(c.epoch(), Some(1), "still the controller");
    let ops = w.ops.lock().unwrap().clone();
    let bell = cluster
        .join(kaas_volume::topic_notice::DIR)
        .join(kaas_volume::topic_notice::BELL);
    assert_eq!(w.count("open", &bell), passes, "the bell, once a pass");
    let rest: Vec<_> = ops.iter().filter(|(_, p)| *p != bell).collect();
    // Once a second: the next controller epoch, the data directory and
    // (this test cluster has none) `group-shards.json`; every 5 s:
    // brokers/, topic-changes/ and the history (with a probe). The code
    // before the bell: ~500.
    assert!(
        rest.len() <= 40,
        "{} other operations in {passes} idle passes: {rest:?}",
        rest.len()
    );
    let own = broker_record_path(&cluster, 1);
    assert_eq!(w.count("open", &own), 0, "own record from memory");
    for dir in [
        cluster.join(BROKERS_DIR),
        cluster.join(kaas_volume::topic_notice::DIR),
        super::history::history_dir(&cluster),
    ] {
        let n = w.count("list", &dir);
        assert!((1..=3).contains(&n), "{} listed {n} times", dir.display());
    }
}

/// Catches: an idle candidate (every broker but the controller) listing
/// `controller/` and `brokers/` and re-reading the claim every pass (about
/// 130 metadata operations a second for a broker of three). Idle, a pass
/// reads the bell, probes the next controller epoch by name and reads the
/// other brokers' records (failure detection keeps its 100 ms timing).
#[test]
fn an_idle_candidate_reads_the_bell_the_next_epoch_and_the_records() {
    let d = tempfile::tempdir().unwrap();
    let cluster = d.path().join("__cluster");
    stamp_topic(d.path(), 4);
    let clock = FakeClock::new();
    let s1 = shared(&cluster, 1, 11, &clock);
    let mut m1 = beat(real(), &s1);
    let mut c1 = ControllerState::new(real(), s1.clone(), d.path().to_path_buf());
    assert!(c1.tick(), "v1");
    let s2 = shared(&cluster, 2, 22, &clock);
    let mut m2 = beat(real(), &s2);
    let w = Arc::new(Counting::default());
    let mut c2 = ControllerState::new(w.clone(), s2.clone(), d.path().to_path_buf());
    let (ms, cs) = (&mut [&mut m1, &mut m2], &mut [&mut c1, &mut c2]);
    passes(&clock, 60, 1, ms, cs);
    w.ops.lock().unwrap().clear();
    let n = 100;
    passes(&clock, n, 5, ms, cs);
    let passes = n;
    assert_eq!(c2.epoch(), None, "still a candidate");
    let record1 = broker_record_path(&cluster, 1);
    assert_eq!(
        w.count("open", &record1),
        passes,
        "the controller's record, every pass"
    );
    let ops = w.ops.lock().unwrap().len();
    // Per pass: the bell, the next epoch, broker 1's record; every 5 s the
    // listings and the claim. The code before the bell: ~700.
    assert!(
        ops <= 3 * passes + 20,
        "{ops} operations in {passes} idle passes"
    );
    for dir in [
        cluster.join(BROKERS_DIR),
        cluster.join(kaas_volume::layout::CONTROLLER_DIR),
    ] {
        let n = w.count("list", &dir);
        assert!((1..=3).contains(&n), "{} listed {n} times", dir.display());
    }
}

/// Catches: a joining broker found only by the slow safety-net listing when
/// the listing right after its ring is stale (an NFS client's cached
/// directory): after a ring the controller keeps listing every pass for
/// AFTER_RING, so the join is seen as soon as a listing shows it.
#[test]
fn a_join_is_seen_through_a_stale_listing_after_the_ring() {
    let mut f = a_settled_counted_controller();
    let (cluster, clock, w) = (f.cluster.clone(), f.clock.clone(), f.w.clone());
    let (m1, c) = (&mut f.m1, &mut f.c);
    // The listing of brokers/ stays stale (only broker 1) for 15 listings.
    let brokers = cluster.join(BROKERS_DIR);
    *w.stale.lock().unwrap() = Some((brokers.clone(), vec!["1.json".into()], 15));
    let s2 = shared(&cluster, 2, 22, &clock);
    let mut m2 = beat(real(), &s2);
    let mut seen_after = None;
    for i in 1..=40 {
        clock.advance(TIMING.poll);
        if i % 5 == 0 {
            m1.beat();
            m2.beat();
        }
        c.tick();
        if c.liveness(2).is_some() {
            seen_after = Some(i);
            break;
        }
    }
    assert_eq!(
        seen_after,
        Some(16),
        "seen by the first listing that shows it (the 16th pass after the ring)"
    );
}

/// A controlled shutdown revokes the lease while a heartbeat write is in
/// flight: that write lands after the lease ended, on purpose — not a
/// fence (which logs ERROR, "someone must act"). Found in CI: a lone
/// broker's SIGTERM logged "heartbeat completed after the lease ended".
#[test]
fn a_heartbeat_landing_after_a_controlled_revoke_is_not_a_fence() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let s = shared(d.path(), 1, 11, &clock);
    let seam = OnOpen::default();
    let mut m = beat(Arc::new(seam.clone()), &s);
    let lease = s.lease.clone();
    let record = broker_record_path(d.path(), 1);
    seam.on_write(move |to| {
        if to == record {
            lease.revoke();
        }
    });
    clock.advance(TIMING.heartbeat);
    assert_eq!(m.beat(), BeatOutcome::Revoked);
}

/// Revoked but `clean_exit` not yet set (the shutdown sets it right after
/// revoking): the lapse path must not take a new incarnation — a broker on
/// its way out would rejoin and be granted partitions again.
#[test]
fn a_revoked_lease_never_rejoins_as_a_new_incarnation() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let s = shared(d.path(), 1, 11, &clock);
    let mut m = beat(Arc::new(RealFs), &s);
    s.lease.revoke();
    // Every leader of the incarnation stopped: a lapse would now rejoin.
    s.fenced_incarnation.store(11, Ordering::Release);
    clock.advance(TIMING.heartbeat);
    assert_eq!(m.beat(), BeatOutcome::Revoked);
    assert_eq!(s.lease.incarnation(), 11);
    assert!(!s.lease.valid());
}

/// A broker SIGSTOPped in the middle of a heartbeat (temp created, not yet
/// renamed) past lease + grace; a replacement started under its id waited
/// it out and wrote its own record. The zombie wakes: its in-flight write
/// must not land over the replacement's record (before: it did, the
/// replacement read a foreign incarnation and exited, and the zombie
/// rejoined in its place — seen under load in
/// test_a_paused_broker_replaced_under_its_id_exits_on_waking). It finds
/// the replacement's record and exits instead.
#[test]
fn a_heartbeat_paused_past_its_lease_never_lands_over_a_replacement() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let z = shared(d.path(), 1, 11, &clock);
    let seam = OnOpen::default();
    let mut zombie = beat(Arc::new(seam.clone()), &z);
    let path = broker_record_path(d.path(), 1);
    let (c, rec, mut paused) = (clock.clone(), path.clone(), false);
    seam.on_write(move |p| {
        if p != rec && !std::mem::replace(&mut paused, true) {
            // Paused right after creating the heartbeat's temp file.
            c.advance(TIMING.dead_after() + TIMING.heartbeat);
            write_json(&RealFs, &rec, &record(1, 22, 1)).unwrap();
        }
    });
    clock.advance(TIMING.heartbeat);
    assert_eq!(zombie.beat(), BeatOutcome::TooLate);
    let now: BrokerRecord = super::records::read_json(&RealFs, &path).unwrap().unwrap();
    assert_eq!(now.incarnation, 22, "the replacement's record stands");
    assert!(!z.lease.valid_for(11));
    clock.advance(TIMING.heartbeat);
    assert_eq!(zombie.beat(), BeatOutcome::Impostor { theirs: 22 });
}

/// A kill -9 between a heartbeat's create and its rename, or a late beat
/// refused by its guard, leaves a `.tmp-` of the broker's record that no one
/// will rename. The next incarnation of that id sweeps its own, and only its
/// own: another broker's temp may be a beat in flight.
#[test]
fn joining_sweeps_this_ids_heartbeat_temps_and_no_one_elses() {
    let d = tempfile::tempdir().unwrap();
    let brokers = d.path().join(BROKERS_DIR);
    std::fs::create_dir_all(&brokers).unwrap();
    let mut dead = record(1, 11, 7);
    dead.clean_exit = true;
    write_json(&RealFs, &broker_record_path(d.path(), 1), &dead).unwrap();
    let mine = [
        kaas_volume::layout::temp("1.json", 1),
        kaas_volume::layout::temp("1.json", u64::MAX),
    ];
    let others = [
        kaas_volume::layout::temp("11.json", 1),
        kaas_volume::layout::temp("2.json", 1),
    ];
    for n in mine.iter().chain(&others) {
        std::fs::write(brokers.join(n), b"{").unwrap();
    }
    let (s, seq) = super::membership::join(
        &real(),
        super::membership::JoinConfig {
            broker_id: 1,
            cluster_dir: d.path().to_path_buf(),
            advertised: ("127.0.0.1".into(), 9093),
            timing: TIMING,
            clock: Arc::new(crate::clock::RealClock),
        },
    )
    .unwrap();
    assert_eq!(seq, 8);
    assert!(s.lease.valid());
    let mut left: Vec<String> = std::fs::read_dir(&brokers)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    let mut want = vec!["1.json".to_owned()];
    want.extend(others.iter().cloned());
    want.sort();
    assert_eq!(left, want);
}
