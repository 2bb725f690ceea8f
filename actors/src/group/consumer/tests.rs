//! Tests of the consumer-protocol state machine: reconciliation never gives
//! a partition to two members at once, epochs and fencing, timeouts, static
//! members, and the records rebuilding the same groups after a takeover.

use super::*;
use crate::clock::{Clock, FakeClock};
use std::sync::{Arc, Mutex};

struct FakeTopics(Mutex<BTreeMap<String, TopicMeta>>);

impl FakeTopics {
    fn new(topics: &[(&str, u8, i32)]) -> Arc<Self> {
        Arc::new(Self(Mutex::new(
            topics
                .iter()
                .map(|&(n, id, p)| {
                    (
                        n.to_owned(),
                        TopicMeta {
                            id: Uuid::from_bytes([id; 16]),
                            partitions: p,
                        },
                    )
                })
                .collect(),
        )))
    }
    fn set_partitions(&self, name: &str, n: i32) {
        self.0.lock().unwrap().get_mut(name).unwrap().partitions = n;
    }
    fn create(&self, name: &str, id: u8, partitions: i32) {
        self.0.lock().unwrap().insert(
            name.to_owned(),
            TopicMeta {
                id: Uuid::from_bytes([id; 16]),
                partitions,
            },
        );
    }
}

impl TopicSource for FakeTopics {
    fn topic(&self, name: &str) -> Option<TopicMeta> {
        self.0.lock().unwrap().get(name).copied()
    }
    fn matching(&self, regex: &str) -> Option<Vec<String>> {
        // Enough of a regex for the tests: a literal prefix and ".*".
        let prefix = regex.strip_suffix(".*")?;
        Some(
            self.0
                .lock()
                .unwrap()
                .keys()
                .filter(|n| n.starts_with(prefix))
                .cloned()
                .collect(),
        )
    }
    fn name_of(&self, id: &Uuid) -> Option<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|(_, t)| &t.id == id)
            .map(|(n, _)| n.clone())
    }
}

fn tid(n: u8) -> Uuid {
    Uuid::from_bytes([n; 16])
}

struct Fixture {
    clock: Arc<FakeClock>,
    topics: Arc<FakeTopics>,
    groups: ConsumerGroups,
    /// Every record persisted, in order (what the shard log would hold).
    log: Vec<ConsumerRecord>,
}

impl Fixture {
    fn new(partitions: i32) -> Self {
        let clock = FakeClock::new();
        let groups = ConsumerGroups::load(
            &ShardState::default(),
            ConsumerConfig::default(),
            clock.clone(),
        );
        Self {
            clock,
            topics: FakeTopics::new(&[("t", 1, partitions), ("u", 2, 3), ("other", 3, 2)]),
            groups,
            log: Vec::new(),
        }
    }

    fn hb(&mut self, req: ConsumerHeartbeat) -> Result<HeartbeatAnswer, HeartbeatError> {
        let out = self.groups.heartbeat(req, self.topics.as_ref(), false);
        self.log.extend(out.persist);
        out.result.unwrap()
    }

    fn join(&mut self, id: &str) -> HeartbeatAnswer {
        self.hb(join_req(id, &["t"])).unwrap()
    }

    /// A member's steady heartbeat, reporting `owned`.
    fn beat(&mut self, id: &str, epoch: i32, owned: &Assignment) -> HeartbeatAnswer {
        self.hb(ConsumerHeartbeat {
            group_id: "g".into(),
            member_id: id.into(),
            member_epoch: epoch,
            rebalance_timeout_ms: -1,
            owned: Some(owned.clone()),
            ..Default::default()
        })
        .unwrap()
    }

    fn tick(&mut self) {
        let recs = self.groups.tick(self.topics.as_ref());
        self.log.extend(recs);
    }

    fn group(&self) -> DescribedGroup {
        self.groups.describe("g").unwrap()
    }

    fn group_record(&self) -> GroupRecord {
        self.groups.groups["g"].rec.clone()
    }

    /// No partition owned (or being revoked) by two members.
    fn check_exclusive(&self) {
        let mut seen: BTreeMap<(Uuid, i32), String> = BTreeMap::new();
        let Some(g) = self.groups.describe("g") else {
            return;
        };
        for m in g.members {
            for a in [&m.assigned, &m.revoking] {
                for (t, ps) in a {
                    for p in ps {
                        if let Some(o) = seen.insert((*t, *p), m.member_id.clone()) {
                            panic!("{t}/{p} held by {o} and {}", m.member_id);
                        }
                    }
                }
            }
        }
    }
}

fn join_req(id: &str, topics: &[&str]) -> ConsumerHeartbeat {
    ConsumerHeartbeat {
        group_id: "g".into(),
        member_id: id.into(),
        member_epoch: 0,
        rebalance_timeout_ms: 30_000,
        topics: Some(topics.iter().map(|t| t.to_string()).collect()),
        owned: Some(Assignment::new()),
        client_id: "c".into(),
        ..Default::default()
    }
}

fn count(a: &Assignment) -> usize {
    a.values().map(BTreeSet::len).sum()
}

/// Members that ack at once: heartbeat until nothing changes.
fn converge(f: &mut Fixture, members: &mut BTreeMap<String, (i32, Assignment)>) {
    for _ in 0..20 {
        let mut changed = false;
        for (id, (epoch, owned)) in members.iter_mut() {
            let a = f.beat(id, *epoch, owned);
            let now = a.assignment.unwrap();
            if a.member_epoch != *epoch || now != *owned {
                changed = true;
            }
            *epoch = a.member_epoch;
            *owned = now;
            f.check_exclusive();
        }
        if !changed {
            return;
        }
    }
    panic!("never converged: {:#?}", f.group());
}

#[test]
fn three_members_converge_to_a_balanced_exclusive_assignment() {
    let mut f = Fixture::new(6);
    let mut members = BTreeMap::new();
    for id in ["a", "b", "c"] {
        let a = f.join(id);
        assert!(a.member_epoch >= 1);
        assert_eq!(a.heartbeat_interval_ms, 5000);
        members.insert(id.to_string(), (a.member_epoch, a.assignment.unwrap()));
        f.check_exclusive();
    }
    converge(&mut f, &mut members);
    let g = f.group();
    assert_eq!(g.state, "Stable");
    assert_eq!(g.epoch, 3, "one bump per join");
    assert_eq!(g.assignment_epoch, 3);
    for (epoch, owned) in members.values() {
        assert_eq!(*epoch, 3);
        assert_eq!(count(owned), 2);
    }
}

#[test]
fn a_partition_moves_only_after_its_owner_revoked_it() {
    let mut f = Fixture::new(2);
    let a = f.join("a");
    assert_eq!(count(a.assignment.as_ref().unwrap()), 2);
    let a_owned = a.assignment.unwrap();
    // b joins: the target gives it one of a's partitions, but a still owns it.
    let b = f.join("b");
    assert_eq!(b.member_epoch, 2);
    assert!(b.assignment.unwrap().is_empty(), "not before a revokes");
    f.check_exclusive();
    // a's heartbeat (still owning both) is told to keep one: epoch stays.
    let a2 = f.beat("a", 1, &a_owned);
    assert_eq!(a2.member_epoch, 1, "epoch waits for the revocation");
    assert_eq!(count(a2.assignment.as_ref().unwrap()), 1);
    // b asks again: still nothing, a has not acknowledged.
    let b2 = f.beat("b", 2, &Assignment::new());
    assert!(b2.assignment.unwrap().is_empty());
    // a acknowledges: it moves to epoch 2; then b gets the partition.
    let a3 = f.beat("a", 1, a2.assignment.as_ref().unwrap());
    assert_eq!(a3.member_epoch, 2);
    let b3 = f.beat("b", 2, &Assignment::new());
    assert_eq!(count(b3.assignment.as_ref().unwrap()), 1);
    f.check_exclusive();
    assert_eq!(f.group().state, "Stable");
}

#[test]
fn random_histories_never_assign_a_partition_twice() {
    use rand::{Rng, SeedableRng};
    for seed in 0..40u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut f = Fixture::new(7);
        // Client view: epoch and what it owns (it may lag in acking).
        let mut clients: BTreeMap<String, (i32, Assignment)> = BTreeMap::new();
        let mut next = 0;
        for _ in 0..200 {
            match rng.gen_range(0..10) {
                0 if clients.len() < 6 => {
                    next += 1;
                    let id = format!("m{next}");
                    let topics: &[&str] = if rng.gen_bool(0.5) {
                        &["t"]
                    } else {
                        &["t", "u"]
                    };
                    let a = f.hb(join_req(&id, topics)).unwrap();
                    clients.insert(id, (a.member_epoch, a.assignment.unwrap()));
                }
                1 if !clients.is_empty() => {
                    let id = clients
                        .keys()
                        .nth(rng.gen_range(0..clients.len()))
                        .unwrap()
                        .clone();
                    clients.remove(&id);
                    let _ = f.hb(ConsumerHeartbeat {
                        group_id: "g".into(),
                        member_id: id,
                        member_epoch: -1,
                        ..Default::default()
                    });
                }
                2 => {
                    let n = rng.gen_range(7..12);
                    f.topics
                        .set_partitions("t", n.max(f.topics.topic("t").unwrap().partitions));
                }
                _ if !clients.is_empty() => {
                    let id = clients
                        .keys()
                        .nth(rng.gen_range(0..clients.len()))
                        .unwrap()
                        .clone();
                    let (epoch, owned) = clients[&id].clone();
                    // Sometimes the client has not finished revoking: it
                    // reports what it owned before.
                    match f.hb(ConsumerHeartbeat {
                        group_id: "g".into(),
                        member_id: id.clone(),
                        member_epoch: epoch,
                        rebalance_timeout_ms: -1,
                        owned: Some(owned.clone()),
                        ..Default::default()
                    }) {
                        Ok(a) => {
                            let new = a.assignment.unwrap();
                            // The client gives up what it is told to drop
                            // at once, and takes what it is given only if
                            // it would not then overlap another client.
                            let lag = rng.gen_bool(0.3) && !subset(&owned, &new);
                            if !lag {
                                clients.insert(id, (a.member_epoch, new));
                            }
                        }
                        Err((ResponseError::UnknownMemberId, _))
                        | Err((ResponseError::FencedMemberEpoch, _)) => {
                            clients.remove(&id);
                        }
                        Err(e) => panic!("seed {seed}: {e:?}"),
                    }
                }
                _ => {}
            }
            f.check_exclusive();
            // What clients believe they own never overlaps either.
            let mut seen = BTreeSet::new();
            for (id, (_, owned)) in &clients {
                for (t, ps) in owned {
                    for p in ps {
                        assert!(seen.insert((*t, *p)), "seed {seed}: {t}/{p} twice ({id})");
                    }
                }
            }
        }
        // Everyone acks from here on: the group converges, every partition
        // of a subscribed topic owned exactly once.
        if !clients.is_empty() {
            converge(&mut f, &mut clients);
            let g = f.group();
            assert_eq!(g.state, "Stable", "seed {seed}");
            let total: usize = clients.values().map(|c| count(&c.1)).sum();
            let subscribed_u = g
                .members
                .iter()
                .any(|m| m.topics.contains(&"u".to_string()));
            let want =
                f.topics.topic("t").unwrap().partitions as usize + if subscribed_u { 3 } else { 0 };
            assert_eq!(total, want, "seed {seed}");
        }
    }
}

#[test]
fn epochs_are_fenced_and_a_lost_response_is_tolerated() {
    let mut f = Fixture::new(4);
    let a = f.join("a");
    let owned = a.assignment.unwrap();
    assert_eq!(
        f.hb(ConsumerHeartbeat {
            group_id: "g".into(),
            member_id: "a".into(),
            member_epoch: 5,
            rebalance_timeout_ms: -1,
            ..Default::default()
        })
        .unwrap_err()
        .0,
        ResponseError::FencedMemberEpoch
    );
    assert_eq!(
        f.hb(ConsumerHeartbeat {
            group_id: "g".into(),
            member_id: "zz".into(),
            member_epoch: 1,
            rebalance_timeout_ms: -1,
            ..Default::default()
        })
        .unwrap_err()
        .0,
        ResponseError::UnknownMemberId
    );
    // b joins; a gets epoch 2 after revoking; a response lost: a retries
    // with epoch 1 owning a subset of what it has — accepted.
    let _b = f.join("b");
    let a2 = f.beat("a", 1, &owned);
    let a3 = f.beat("a", 1, a2.assignment.as_ref().unwrap());
    assert_eq!(a3.member_epoch, 2);
    let again = f.beat("a", 1, a3.assignment.as_ref().unwrap());
    assert_eq!(again.member_epoch, 2);
    // …but not with partitions it does not own.
    let mut bogus = a3.assignment.clone().unwrap();
    bogus.entry(tid(1)).or_default().extend(0..4);
    assert_eq!(
        f.hb(ConsumerHeartbeat {
            group_id: "g".into(),
            member_id: "a".into(),
            member_epoch: 1,
            rebalance_timeout_ms: -1,
            owned: Some(bogus),
            ..Default::default()
        })
        .unwrap_err()
        .0,
        ResponseError::FencedMemberEpoch
    );
    // Offset commits: the current epoch, or (KIP-1251) an older one at
    // which the member already owned every partition committed: a's commit
    // sent before the answer that moved it from epoch 1 to 2.
    let kept: Vec<i32> = a3.assignment.as_ref().unwrap()[&tid(1)]
        .iter()
        .copied()
        .collect();
    let not_a: i32 = (0..4).find(|p| !kept.contains(p)).unwrap();
    assert_eq!(f.groups.validate_commit("g", "a", 2, &[]), Ok(()));
    assert_eq!(
        f.groups.validate_commit("g", "a", 2, &[("t", not_a)]),
        Ok(()),
        "the current epoch is not checked per partition (Kafka's case 1)"
    );
    assert_eq!(
        f.groups.validate_commit("g", "a", 1, &[("t", kept[0])]),
        Ok(())
    );
    assert_eq!(
        f.groups
            .validate_commit("g", "a", 1, &[("t", kept[0]), ("t", not_a)]),
        Err(ResponseError::StaleMemberEpoch),
        "an old epoch for a partition the member does not own"
    );
    assert_eq!(
        f.groups.validate_commit("g", "a", 1, &[("other", 0)]),
        Err(ResponseError::StaleMemberEpoch),
        "an old epoch for a topic outside the group"
    );
    assert_eq!(
        f.groups.validate_commit("g", "a", 0, &[("t", kept[0])]),
        Err(ResponseError::StaleMemberEpoch),
        "an epoch older than the partition's assignment"
    );
    assert_eq!(
        f.groups.validate_commit("g", "a", 3, &[]),
        Err(ResponseError::StaleMemberEpoch)
    );
    assert_eq!(
        f.groups.validate_commit("g", "x", 2, &[]),
        Err(ResponseError::UnknownMemberId)
    );
    assert_eq!(
        f.groups.validate_commit("g", "", -1, &[]),
        Err(ResponseError::UnknownMemberId),
        "an admin commit only while the group is empty"
    );
    assert_eq!(
        f.groups.validate_fetch("g", Some("a"), 1),
        Err(ResponseError::StaleMemberEpoch)
    );
    assert_eq!(f.groups.validate_fetch("g", None, -1), Ok(()));
}

#[test]
fn a_silent_member_is_expired_and_its_partitions_move() {
    let mut f = Fixture::new(4);
    let a = f.join("a");
    let b = f.join("b");
    let mut members = BTreeMap::from([
        ("a".to_string(), (a.member_epoch, a.assignment.unwrap())),
        ("b".to_string(), (b.member_epoch, b.assignment.unwrap())),
    ]);
    converge(&mut f, &mut members);
    // b goes silent; a keeps beating.
    let (ea, oa) = members["a"].clone();
    for _ in 0..10 {
        f.clock.advance(Duration::from_secs(5));
        f.beat("a", ea, &oa);
        f.tick();
    }
    assert_eq!(f.group().members.len(), 1, "b expired after 45 s");
    let epoch = f.group().epoch;
    let a2 = f.beat("a", ea, &oa);
    assert_eq!(a2.member_epoch, epoch);
    assert_eq!(count(a2.assignment.as_ref().unwrap()), 4);
    assert!(f.log.iter().any(
        |r| matches!(r, ConsumerRecord::MemberTombstone { member_id, .. } if member_id == "b")
    ));
}

#[test]
fn a_member_that_never_revokes_is_removed_after_its_rebalance_timeout() {
    let mut f = Fixture::new(2);
    let a = f.join("a");
    let owned = a.assignment.unwrap();
    f.join("b");
    let a2 = f.beat("a", 1, &owned);
    assert_eq!(a2.member_epoch, 1);
    // a keeps reporting both partitions (never revokes) for 31 s.
    for _ in 0..7 {
        f.clock.advance(Duration::from_secs(5));
        let _ = f.hb(ConsumerHeartbeat {
            group_id: "g".into(),
            member_id: "a".into(),
            member_epoch: 1,
            rebalance_timeout_ms: -1,
            owned: Some(owned.clone()),
            ..Default::default()
        });
        let _ = f.beat("b", 2, &Assignment::new());
        f.tick();
    }
    let g = f.group();
    assert_eq!(g.members.len(), 1);
    assert_eq!(g.members[0].member_id, "b");
    let b = f.beat("b", g.epoch, &Assignment::new());
    assert_eq!(count(b.assignment.as_ref().unwrap()), 2);
}

#[test]
fn a_static_member_comes_back_without_a_rebalance() {
    let mut f = Fixture::new(4);
    let mut req = join_req("a1", &["t"]);
    req.instance_id = Some("i".into());
    let a = f.hb(req.clone()).unwrap();
    f.join("b");
    let g = f.group();
    // Another member id with the same instance id while a1 is active.
    let mut dup = join_req("a2", &["t"]);
    dup.instance_id = Some("i".into());
    assert_eq!(
        f.hb(dup.clone()).unwrap_err().0,
        ResponseError::UnreleasedInstanceId
    );
    // A heartbeat of a1 with another instance id is fenced.
    let mut wrong = ConsumerHeartbeat {
        group_id: "g".into(),
        member_id: "a1".into(),
        member_epoch: a.member_epoch,
        instance_id: Some("j".into()),
        rebalance_timeout_ms: -1,
        ..Default::default()
    };
    assert_eq!(
        f.hb(wrong.clone()).unwrap_err().0,
        ResponseError::FencedInstanceId
    );
    // a1 leaves temporarily (-2) and comes back as a2: same assignment, no
    // new group epoch.
    wrong.instance_id = Some("i".into());
    wrong.member_epoch = -2;
    assert_eq!(f.hb(wrong).unwrap().member_epoch, -2);
    let before = f
        .group()
        .members
        .into_iter()
        .find(|m| m.member_id == "a1")
        .unwrap();
    let back = f.hb(dup).unwrap();
    // It rejoins owning nothing, so what its target took away is released
    // at once and it keeps the rest: its target.
    assert_eq!(back.assignment.unwrap(), before.target);
    assert_eq!(back.member_epoch, before.previous_epoch);
    assert_eq!(f.group().epoch, g.epoch, "no rebalance");
    assert!(f.group().members.iter().all(|m| m.member_id != "a1"));
}

#[test]
fn bad_requests_and_bounds() {
    let mut f = Fixture::new(2);
    let mut r = join_req("a", &["t"]);
    r.assignor = Some("sticky".into());
    assert_eq!(f.hb(r).unwrap_err().0, ResponseError::UnsupportedAssignor);
    let mut r = join_req("a", &["t"]);
    r.rebalance_timeout_ms = -1;
    assert_eq!(f.hb(r).unwrap_err().0, ResponseError::InvalidRequest);
    let mut r = join_req("a", &["t"]);
    r.topics = None;
    assert_eq!(f.hb(r).unwrap_err().0, ResponseError::InvalidRequest);
    let mut r = join_req("a", &["t"]);
    r.member_epoch = -3;
    assert_eq!(f.hb(r).unwrap_err().0, ResponseError::InvalidRequest);
    let mut r = join_req("a", &["t"]);
    r.group_id = String::new();
    assert_eq!(f.hb(r).unwrap_err().0, ResponseError::InvalidRequest);
    assert!(f.groups.describe("g").is_none(), "nothing created");
    // A group of another type.
    let out = f
        .groups
        .heartbeat(join_req("a", &["t"]), f.topics.as_ref(), true);
    assert_eq!(
        out.result.unwrap().unwrap_err().0,
        ResponseError::GroupIdNotFound
    );

    let clock = FakeClock::new();
    let cfg = ConsumerConfig {
        max_size: 2,
        ..ConsumerConfig::default()
    };
    f.groups = ConsumerGroups::load(&ShardState::default(), cfg, clock);
    f.join("a");
    f.join("b");
    assert_eq!(
        f.hb(join_req("c", &["t"])).unwrap_err().0,
        ResponseError::GroupMaxSizeReached
    );
    // range is served and chosen when asked for.
    let mut r = join_req("a", &["t"]);
    r.member_epoch = 0;
    r.assignor = Some("range".into());
    f.hb(r).unwrap();
    assert_eq!(f.group().assignor, "range");
}

/// A member's join with literal names and a regex.
fn join_regex(id: &str, topics: &[&str], regex: &str) -> ConsumerHeartbeat {
    let mut r = join_req(id, topics);
    r.regex = Some(regex.into());
    r
}

/// The regex resolution runs after the heartbeat, from the tick (due at
/// once here).
fn resolve(f: &mut Fixture) {
    assert_eq!(
        f.groups.next_deadline(),
        Some(f.clock.now()),
        "a resolution is due now"
    );
    f.tick();
}

#[test]
fn new_partitions_and_regex_subscriptions_rebalance() {
    let mut f = Fixture::new(2);
    let mut r = join_regex("a", &[], "t.*");
    r.topics = Some(Vec::new());
    let a = f.hb(r).unwrap();
    assert_eq!(count(a.assignment.as_ref().unwrap()), 0, "not resolved yet");
    resolve(&mut f);
    let a = f.beat("a", a.member_epoch, &Assignment::new());
    assert_eq!(count(a.assignment.as_ref().unwrap()), 2);
    let e = f.group().epoch;
    f.topics.set_partitions("t", 5);
    let a2 = f.beat("a", a.member_epoch, a.assignment.as_ref().unwrap());
    assert_eq!(
        f.group().epoch,
        e + 1,
        "CreatePartitions bumps the group epoch"
    );
    assert_eq!(count(a2.assignment.as_ref().unwrap()), 5);
    assert_eq!(a2.member_epoch, e + 1);
}

/// Kafka's order (librdkafka 0045 `resubscribe_with_regex`): the heartbeat
/// that brings a new regex is answered from what the group knows, the
/// literal topics; the regex is resolved afterwards, which bumps the group
/// epoch, and the matches come with the next heartbeat.
#[test]
fn a_new_regex_is_resolved_after_the_heartbeat_literal_topics_first() {
    let mut f = Fixture::new(2);
    let a = f.hb(join_regex("a", &["u"], "t.*")).unwrap();
    let first = a.assignment.clone().unwrap();
    assert_eq!(first.keys().copied().collect::<Vec<_>>(), vec![tid(2)]);
    assert_eq!(count(&first), 3, "the literal topic's partitions only");
    let e = f.group().epoch;
    assert!(f.group_record().regexes.is_empty());
    resolve(&mut f);
    assert_eq!(f.group().epoch, e + 1, "the resolution bumps the epoch");
    let g = f.group_record();
    assert_eq!(g.regexes["t.*"], BTreeSet::from(["t".to_owned()]));
    assert!(
        matches!(f.log.last(), Some(ConsumerRecord::Member { .. }))
            && f.log
                .iter()
                .any(|r| matches!(r, ConsumerRecord::Group(g) if !g.regexes.is_empty())),
        "the resolution is persisted with the group"
    );
    let a = f.beat("a", a.member_epoch, &first);
    assert_eq!(a.member_epoch, e + 1);
    assert_eq!(count(a.assignment.as_ref().unwrap()), 5);
    // Nothing left to resolve: no deadline but the session.
    assert_eq!(
        f.groups.next_deadline(),
        Some(f.clock.now() + ConsumerConfig::default().session_timeout)
    );
}

/// A second member subscribing to a regex the group already resolved gets
/// its matches at once (Kafka bumps the epoch for a resolved regex).
#[test]
fn an_already_resolved_regex_is_assigned_at_once() {
    let mut f = Fixture::new(2);
    let mut a = f.hb(join_regex("a", &[], "t.*")).unwrap();
    resolve(&mut f);
    a = f.beat("a", a.member_epoch, a.assignment.as_ref().unwrap());
    assert_eq!(count(a.assignment.as_ref().unwrap()), 2);
    // b changes from a literal subscription to the same regex.
    let b = f.hb(join_req("b", &["u"])).unwrap();
    let e = f.group().epoch;
    let mut r = join_req("b", &[]);
    r.member_epoch = b.member_epoch;
    r.owned = b.assignment.clone();
    r.regex = Some("t.*".into());
    f.hb(r).unwrap();
    assert_eq!(f.group().epoch, e + 1, "rebalanced by the heartbeat itself");
    let target: usize = f.group().members.iter().map(|m| count(&m.target)).sum();
    assert_eq!(target, 2, "t's partitions shared, u no longer subscribed");
}

/// A topic created later that matches: not seen by heartbeats within the
/// refresh interval of the last resolution; the first heartbeat after it
/// asks for a resolution, which assigns the new topic.
#[test]
fn a_topic_created_later_is_picked_up_by_the_periodic_refresh() {
    let mut f = Fixture::new(2);
    let a = f.hb(join_regex("a", &[], "t.*")).unwrap();
    resolve(&mut f);
    let mut a = f.beat("a", a.member_epoch, &Assignment::new());
    f.topics.create("t2", 9, 4);
    let e = f.group().epoch;
    f.clock.advance(Duration::from_secs(5));
    a = f.beat("a", a.member_epoch, a.assignment.as_ref().unwrap());
    assert_eq!(
        f.group().epoch,
        e,
        "within the interval nothing is resolved"
    );
    assert!(f.groups.next_deadline() > Some(f.clock.now()));
    f.clock.advance(Duration::from_secs(5));
    a = f.beat("a", a.member_epoch, a.assignment.as_ref().unwrap());
    assert_eq!(f.group().epoch, e);
    resolve(&mut f);
    assert_eq!(f.group().epoch, e + 1);
    a = f.beat("a", a.member_epoch, a.assignment.as_ref().unwrap());
    assert_eq!(count(a.assignment.as_ref().unwrap()), 6);
    // A refresh that finds the same topics changes nothing.
    f.clock.advance(Duration::from_secs(10));
    let logged = f.log.len();
    f.beat("a", a.member_epoch, a.assignment.as_ref().unwrap());
    resolve(&mut f);
    assert_eq!(f.group().epoch, e + 1);
    assert_eq!(f.log.len(), logged, "no records");
}

/// A second new regex within the refresh interval of the last resolution
/// waits for it (Kafka batches the group's resolutions), then is resolved
/// without another heartbeat.
#[test]
fn a_new_regex_within_the_interval_is_resolved_when_it_ends() {
    let mut f = Fixture::new(2);
    let a = f.hb(join_regex("a", &[], "t.*")).unwrap();
    resolve(&mut f);
    f.clock.advance(Duration::from_secs(3));
    f.hb(join_regex("b", &[], "o.*")).unwrap();
    let due = f.groups.next_deadline();
    assert_eq!(due, Some(f.clock.now() + Duration::from_secs(7)));
    f.clock.advance(Duration::from_secs(7));
    let e = f.group().epoch;
    f.tick();
    assert_eq!(f.group().epoch, e + 1);
    assert_eq!(
        f.group_record().regexes["o.*"],
        BTreeSet::from(["other".to_owned()])
    );
    drop(a);
}

/// The last subscriber gone, the resolution goes too (Kafka's tombstone):
/// subscribing again resolves it again, after the heartbeat (0045
/// unsubscribes and subscribes to the regex and a literal topic).
#[test]
fn a_regex_nobody_subscribes_to_is_forgotten() {
    let mut f = Fixture::new(2);
    let a = f.hb(join_regex("a", &[], "t.*")).unwrap();
    resolve(&mut f);
    f.hb(ConsumerHeartbeat {
        group_id: "g".into(),
        member_id: "a".into(),
        member_epoch: a.member_epoch,
        ..Default::default()
    })
    .unwrap();
    f.hb(ConsumerHeartbeat {
        group_id: "g".into(),
        member_id: "a".into(),
        member_epoch: -1,
        ..Default::default()
    })
    .unwrap();
    assert!(f.group_record().regexes.is_empty());
    assert_eq!(f.groups.next_deadline(), None);
    let a = f.hb(join_regex("a", &["u"], "t.*")).unwrap();
    assert_eq!(count(a.assignment.as_ref().unwrap()), 3, "u only");
    resolve(&mut f);
    let a = f.beat("a", a.member_epoch, a.assignment.as_ref().unwrap());
    assert_eq!(count(a.assignment.as_ref().unwrap()), 5);
}

/// The resolutions are part of the group record: a new owner assigns the
/// same topics (a heartbeat does not drop the regex's matches) and
/// resolves again at the first heartbeat, which changes nothing.
#[test]
fn resolutions_survive_a_takeover() {
    let mut f = Fixture::new(2);
    let a = f.hb(join_regex("a", &["u"], "t.*")).unwrap();
    resolve(&mut f);
    let a = f.beat("a", a.member_epoch, a.assignment.as_ref().unwrap());
    assert_eq!(count(a.assignment.as_ref().unwrap()), 5);
    let mut durable = StoredGroups::new();
    for r in &f.log {
        apply(&mut durable, r);
    }
    let state = ShardState {
        consumer: durable,
        ..ShardState::default()
    };
    f.groups = ConsumerGroups::load(&state, ConsumerConfig::default(), f.clock.clone());
    let e = f.group().epoch;
    let logged = f.log.len();
    let again = f.beat("a", a.member_epoch, a.assignment.as_ref().unwrap());
    assert_eq!(again.assignment, a.assignment);
    resolve(&mut f);
    assert_eq!(f.group().epoch, e);
    assert_eq!(f.log.len(), logged);
}

#[test]
fn records_rebuild_the_same_groups_after_a_takeover() {
    let mut f = Fixture::new(6);
    let mut members = BTreeMap::new();
    for id in ["a", "b", "c"] {
        let a = f.join(id);
        members.insert(id.to_string(), (a.member_epoch, a.assignment.unwrap()));
    }
    converge(&mut f, &mut members);
    // b is mid-revocation when the coordinator dies: d joined.
    f.join("d");
    let (eb, ob) = members["b"].clone();
    f.beat("b", eb, &ob);
    let mut durable = StoredGroups::new();
    for r in &f.log {
        apply(&mut durable, r);
    }
    // Compaction writes `records`; replaying them is the same state.
    let mut again = StoredGroups::new();
    for r in records(&durable) {
        apply(&mut again, &r);
    }
    assert_eq!(again, durable);
    let state = ShardState {
        consumer: durable,
        ..ShardState::default()
    };
    let next = ConsumerGroups::load(&state, ConsumerConfig::default(), f.clock.clone());
    let (old, new) = (f.group(), next.describe("g").unwrap());
    assert_eq!(old.epoch, new.epoch);
    assert_eq!(old.state, new.state);
    assert_eq!(old.members, new.members);
    // The members carry on against the new owner with their epochs.
    f.groups = next;
    members.insert("d".into(), (old.epoch, Assignment::new()));
    converge(&mut f, &mut members);
    assert_eq!(f.group().state, "Stable");
}

#[test]
fn leave_releases_and_delete_needs_an_empty_group() {
    let mut f = Fixture::new(2);
    let a = f.join("a");
    assert_eq!(f.groups.delete("g"), Err(ResponseError::NonEmptyGroup));
    let left = f
        .hb(ConsumerHeartbeat {
            group_id: "g".into(),
            member_id: "a".into(),
            member_epoch: -1,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(left.member_epoch, -1);
    assert!(a.member_epoch > 0);
    assert_eq!(f.group().state, "Empty");
    assert_eq!(f.groups.validate_commit("g", "", -1, &[]), Ok(()));
    assert!(f.groups.delete("g").is_ok());
    assert!(!f.groups.contains("g"));
}

/// KIP-1251 assignment epochs: after b leaves, a takes b's partitions at a
/// new epoch; a commit a sent with its previous epoch is taken for what it
/// owned then and refused for what it was given only at the new epoch. A
/// new owner of the shard knows no assignment epochs: it takes the current
/// epoch only (Kafka's strict rule), never less than before.
#[test]
fn a_commit_with_the_previous_epoch_is_taken_for_partitions_owned_then() {
    let mut f = Fixture::new(4);
    let mut members = BTreeMap::new();
    for id in ["a", "b"] {
        let j = f.join(id);
        members.insert(id.to_string(), (j.member_epoch, j.assignment.unwrap()));
    }
    converge(&mut f, &mut members);
    let (ea, owned_a) = members["a"].clone();
    let (eb, owned_b) = members["b"].clone();
    assert_eq!(count(&owned_a), 2);
    let mine = *owned_a[&tid(1)].iter().next().unwrap();
    let bs = *owned_b[&tid(1)].iter().next().unwrap();
    f.hb(ConsumerHeartbeat {
        group_id: "g".into(),
        member_id: "b".into(),
        member_epoch: -1,
        ..Default::default()
    })
    .unwrap();
    let now = f.beat("a", ea, &owned_a);
    assert!(now.member_epoch > ea && now.member_epoch > eb);
    assert_eq!(count(now.assignment.as_ref().unwrap()), 4);
    let e = now.member_epoch;
    let g = f.groups.validate_commit("g", "a", ea, &[("t", mine)]);
    assert_eq!(g, Ok(()), "owned at the previous epoch");
    assert_eq!(
        f.groups
            .validate_commit("g", "a", ea, &[("t", mine), ("t", bs)]),
        Err(ResponseError::StaleMemberEpoch),
        "b's partition was given to a only at epoch {e}"
    );
    assert_eq!(f.groups.validate_commit("g", "a", e, &[("t", bs)]), Ok(()));
    assert_eq!(
        f.groups.validate_commit("g", "a", e + 1, &[("t", mine)]),
        Err(ResponseError::StaleMemberEpoch),
        "an epoch from the future"
    );
    // A takeover: the new owner rebuilds the member without assignment
    // epochs, so only the current epoch commits.
    let mut durable = StoredGroups::new();
    for r in &f.log {
        apply(&mut durable, r);
    }
    let state = ShardState {
        consumer: durable,
        ..ShardState::default()
    };
    f.groups = ConsumerGroups::load(&state, ConsumerConfig::default(), f.clock.clone());
    assert_eq!(
        f.groups.validate_commit("g", "a", ea, &[("t", mine)]),
        Err(ResponseError::StaleMemberEpoch)
    );
    assert_eq!(
        f.groups.validate_commit("g", "a", e, &[("t", mine)]),
        Ok(())
    );
}

/// The consumer records through the shard log with a crash at every
/// filesystem step (append, group commit, compaction): the reopened state
/// is always the fold of a prefix of the batches, at least every
/// acknowledged (synced) one, and `ConsumerGroups::load` rebuilds it.
#[test]
#[allow(clippy::disallowed_methods)] // a temp dir for the fixture
fn crash_at_every_step_keeps_acknowledged_consumer_records() {
    use crate::group::log::ShardLog;
    use crate::group::offsets::Record;
    use crate::group::shard::ShardId;
    use kaas_volume::fs::fault::FaultFs;
    use kaas_volume::fs::SharedFs;

    // The batches a coordinator would append: joins, reconciliation,
    // a leave.
    let mut f = Fixture::new(4);
    let mut batches: Vec<Vec<ConsumerRecord>> = Vec::new();
    let mark = |f: &Fixture, batches: &mut Vec<Vec<ConsumerRecord>>| {
        let done: usize = batches.iter().map(Vec::len).sum();
        batches.push(f.log[done..].to_vec());
    };
    let a = f.join("a");
    mark(&f, &mut batches);
    f.join("b");
    mark(&f, &mut batches);
    f.beat("a", a.member_epoch, a.assignment.as_ref().unwrap());
    mark(&f, &mut batches);
    let _ = f.hb(ConsumerHeartbeat {
        group_id: "g".into(),
        member_id: "b".into(),
        member_epoch: -1,
        ..Default::default()
    });
    mark(&f, &mut batches);
    batches.retain(|b| !b.is_empty());
    assert!(batches.len() >= 4);
    let fold = |n: usize| {
        let mut s = StoredGroups::new();
        for r in batches[..n].iter().flatten() {
            apply(&mut s, r);
        }
        s
    };

    let shard = ShardId(1);
    // Appends every batch; syncs after some, compacts in the middle.
    // Returns how many batches were acknowledged before the crash.
    let run = |fs: SharedFs, dir: &std::path::Path, acked: &mut usize| -> Result<(), ()> {
        let mut log: ShardLog =
            ShardLog::open(fs, dir, shard, 1, Default::default()).map_err(|_| ())?;
        for (i, b) in batches.iter().enumerate() {
            let recs: Vec<Record> = b.iter().cloned().map(Record::Consumer).collect();
            log.append(&recs).map_err(|_| ())?;
            if i == 1 {
                log.compact().map_err(|_| ())?;
                *acked = i + 1;
            } else if i % 2 == 0 || i + 1 == batches.len() {
                log.sync_now().map_err(|_| ())?;
                *acked = i + 1;
            }
        }
        Ok(())
    };
    let clean = FaultFs::new();
    let d = tempfile::tempdir().unwrap();
    let mut acked = 0;
    run(Arc::new(clean.clone()), d.path(), &mut acked).unwrap();
    assert_eq!(acked, batches.len());
    let steps = clean.ops();
    for n in 1..=steps + 1 {
        let d = tempfile::tempdir().unwrap();
        let fs = FaultFs::new();
        fs.crash_at(n);
        let mut acked = 0;
        let _ = run(Arc::new(fs.clone()), d.path(), &mut acked);
        fs.power_loss();
        let log: ShardLog = ShardLog::open(
            Arc::new(FaultFs::new()),
            d.path(),
            shard,
            2,
            Default::default(),
        )
        .unwrap_or_else(|e| panic!("crash at {n}: reopen failed: {e}"));
        let got = &log.state().consumer;
        let k = (acked..=batches.len()).find(|&k| &fold(k) == got);
        assert!(
            k.is_some(),
            "crash at {n}: state is not a prefix of at least {acked} batches: {got:#?}"
        );
        // The state machine rebuilds from whatever survived.
        let g = ConsumerGroups::load(log.state(), ConsumerConfig::default(), f.clock.clone());
        if let Some(sg) = got.get("g") {
            assert_eq!(g.describe("g").unwrap().members.len(), sg.members.len());
        }
    }
}

#[test]
fn empty_groups_are_candidates_for_expiry_after_the_retention() {
    let mut f = Fixture::new(2);
    f.join("a");
    let t0 = f.clock.now_ms();
    assert!(f.groups.empty_since(t0).is_empty(), "a group with members");
    let _ = f.hb(ConsumerHeartbeat {
        group_id: "g".into(),
        member_id: "a".into(),
        member_epoch: -1,
        ..Default::default()
    });
    let emptied = f.clock.now_ms();
    assert!(f.groups.empty_since(emptied - 1).is_empty(), "not yet");
    f.clock.advance(Duration::from_secs(60));
    assert_eq!(f.groups.empty_since(f.clock.now_ms() - 60_000), vec!["g"]);
}
