//! The controller's decision, as a pure function of what it observed: which
//! broker leads which partition in the next assignment version. No files,
//! no clocks — every rule here is unit-tested in isolation.
//!
//! Rules:
//! * A grant stands while its broker is alive in the same incarnation and
//!   not shutting down.
//! * A grant whose broker is dead (no heartbeat for lease + grace), exited
//!   cleanly, or came back in a new incarnation is void: that owner is
//!   fenced, so the partition is granted again at once, with epoch + 1.
//! * A partition taken from a *live* owner (shutdown, rebalance) goes through
//!   two phases: first it is vacated (`releasing` names the owner and the
//!   version), and only once that owner reports the version applied — its
//!   leader stopped, its files closed — or is fenced, is it granted again.
//!   Two live leaders of one partition therefore never overlap.
//! * Balance ([`super::balance`]): each eligible broker leads at most
//!   ceil(partitions / brokers), and of each topic at most
//!   ceil(topic's partitions / brokers); a partition moves only when a cap
//!   (or its owner gone) forces it, so a joining broker takes no more than
//!   its share, and the placement is a fixed point: planned again, it
//!   changes nothing.
//! * Moves for balance alone are limited by a [`MovePolicy`]: the
//!   controller allows them only once the eligible brokers have been the
//!   same for a while, only when enough of a class is out of place, and at
//!   most so many in flight at once (see `Rebalance` in the controller). A
//!   grant of a partition nobody holds (failover, a new partition) is
//!   never limited, and goes where the balanced placement has room, so a
//!   broker that comes back first receives what is free.
//! * Consumer-group coordinator shards follow every rule above, exactly as
//!   partitions of one more topic (named [`COORDINATOR_SHARDS`] inside the
//!   plan, which no real topic can be); they are balanced apart from the
//!   partitions, so every broker gets its share of each.

use super::balance;
use super::records::{
    Assignment, BrokerEndpoint, BrokerRecord, PartitionAssignment, TopicAssignment,
    COORDINATOR_SHARDS,
};
use std::collections::BTreeMap;

/// What the controller knows of one broker.
#[derive(Debug, Clone)]
pub struct BrokerView {
    /// Its latest record.
    pub record: BrokerRecord,
    /// Whether its heartbeat moved within lease + grace (controller's clock).
    pub alive: bool,
    /// Its heartbeat stood still for more than a lease: it has fenced itself
    /// (or is about to), so it is not advertised, and clients looking for its
    /// partitions see "no leader" and re-query quickly; its grants stand
    /// until it is dead (lease + grace).
    pub suspect: bool,
}

impl BrokerView {
    fn live(&self) -> bool {
        self.alive && !self.record.clean_exit
    }
    /// May be granted partitions: live, not suspect, not leaving.
    pub fn eligible(&self) -> bool {
        self.live() && !self.suspect && !self.record.shutting_down
    }
}

/// A topic as read from its identity stamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    /// KIP-516 id.
    pub topic_id: uuid::Uuid,
    /// Partition count.
    pub partitions: i32,
    /// Configs.
    pub configs: BTreeMap<String, String>,
    /// Its deletion was asked for (`.delete-requested-<id>`).
    pub deleting: bool,
}

/// Whether the grant (leader, incarnation) is still held by a live owner.
/// A broker the controller has not observed (yet) holds its grants: absence
/// from a listing is never evidence of death.
fn holds(brokers: &BTreeMap<i32, BrokerView>, leader: i32, inc: u64) -> bool {
    brokers
        .get(&leader)
        .is_none_or(|b| b.live() && b.record.incarnation == inc)
}

/// Whether a release from (broker, incarnation) at `version` of this
/// controller's (`controller_epoch`) is complete. A broker never observed
/// has not released anything.
fn released(
    brokers: &BTreeMap<i32, BrokerView>,
    b: i32,
    inc: u64,
    controller_epoch: i32,
    version: u64,
) -> bool {
    match brokers.get(&b) {
        None => false,
        Some(v) => {
            !v.live()
                || v.record.incarnation != inc
                || v.record.has_applied(controller_epoch, version)
        }
    }
}

/// What each eligible broker holds: (topic, partition index).
type Load = BTreeMap<i32, Vec<(String, usize)>>;

/// How many held partitions one plan may take from their live owners for
/// balance alone, per class (partitions; shards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MovePolicy {
    /// Moves in flight at most (vacated, not yet granted again — any
    /// vacated partition of the class counts); 0: none this pass.
    pub max_moves: usize,
    /// Start only when at least this percentage of the class is out of
    /// place (0: any imbalance). Moves already started are finished.
    pub min_percent: u32,
}

impl MovePolicy {
    /// Every move at once, at any imbalance (the plan's own rule).
    pub const ALL: MovePolicy = MovePolicy {
        max_moves: usize::MAX,
        min_percent: 0,
    };
    /// No move for balance.
    pub const NONE: MovePolicy = MovePolicy {
        max_moves: 0,
        min_percent: 0,
    };
}

/// What a plan found out of place, and did about it (both classes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moves {
    /// Held partitions the balanced placement would move.
    pub wanted: usize,
    /// Of those, vacated by this plan.
    pub vacated: usize,
}

/// Balance one class of grants (partitions, or shards) with
/// [`balance::place`]: each eligible broker ends with at most
/// ceil(total / brokers) of the class and ceil(partitions / brokers) of each
/// topic, moving as few held partitions as that allows. A held partition the
/// placement takes away is vacated (two-phase move, highest indices first);
/// free ones are granted at once, with epoch + 1, round-robin over the
/// brokers with room for them; a vacated one is granted by a later pass,
/// once released.
fn balance(
    next: &mut BTreeMap<String, TopicAssignment>,
    load: &Load,
    free: &[(String, usize)],
    brokers: &BTreeMap<i32, BrokerView>,
    version: u64,
    shards: bool,
    policy: MovePolicy,
) -> Moves {
    if load.is_empty() {
        return Moves::default();
    }
    let ids: Vec<i32> = load.keys().copied().collect();
    let class: Vec<String> = next
        .iter()
        .filter(|(n, t)| (n.as_str() == COORDINATOR_SHARDS) == shards && !t.deleting)
        .map(|(n, _)| n.clone())
        .collect();
    let index: BTreeMap<&str, usize> = class
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    // Per topic, per broker: the partitions it holds, in index order.
    let mut held: Vec<Vec<Vec<usize>>> = vec![vec![Vec::new(); ids.len()]; class.len()];
    for (b, (_, parts)) in load.iter().enumerate() {
        for (t, i) in parts {
            if let Some(&ti) = index.get(t.as_str()) {
                held[ti][b].push(*i);
            }
        }
    }
    let mut free_of: Vec<Vec<usize>> = vec![Vec::new(); class.len()];
    for (t, i) in free {
        if let Some(&ti) = index.get(t.as_str()) {
            free_of[ti].push(*i);
        }
    }
    let topics: Vec<balance::TopicLoad> = class
        .iter()
        .enumerate()
        .map(|(ti, n)| {
            let parts = &next[n].partitions;
            let releasing = parts
                .iter()
                .filter(|e| e.leader < 0 && e.releasing.is_some())
                .count();
            held[ti].iter_mut().for_each(|h| h.sort_unstable());
            free_of[ti].sort_unstable();
            balance::TopicLoad {
                partitions: parts.len(),
                held: held[ti].iter().map(Vec::len).collect(),
                unplaced: free_of[ti].len() + releasing,
            }
        })
        .collect();
    let total: usize = topics.iter().map(|t| t.partitions).sum();
    let placed = balance::place(&topics, ids.len(), total);
    // The moves for balance alone, and how many this pass may start.
    let wanted: usize = (0..class.len())
        .flat_map(|ti| (0..ids.len()).map(move |b| (ti, b)))
        .map(|(ti, b)| held[ti][b].len().saturating_sub(placed[ti][b]))
        .sum();
    let in_flight: usize = class
        .iter()
        .map(|n| {
            next[n]
                .partitions
                .iter()
                .filter(|e| e.leader < 0 && e.releasing.is_some())
                .count()
        })
        .sum();
    let worth = (wanted as u128) * 100 >= u128::from(policy.min_percent) * (total as u128);
    let mut budget = if worth {
        policy.max_moves.saturating_sub(in_flight)
    } else {
        0
    };
    let mut vacated = 0usize;
    for (ti, name) in class.iter().enumerate() {
        let parts = &mut next.get_mut(name).expect("topic").partitions;
        let mut room = vec![0usize; ids.len()];
        for (b, &id) in ids.iter().enumerate() {
            let h = &held[ti][b];
            let keep = placed[ti][b].min(h.len());
            let go = (h.len() - keep).min(budget);
            budget -= go;
            vacated += go;
            // Highest indices first; what the budget leaves stays (over
            // its share) until a later pass.
            for &i in h[h.len() - go..].iter() {
                let e = &mut parts[i];
                e.releasing = Some((id, e.incarnation, version));
                e.leader = -1;
                e.incarnation = 0;
            }
            room[b] = placed[ti][b] - keep;
        }
        // Free partitions first (they can be led now), round-robin over
        // the brokers with room; what room is left waits for the vacated.
        let mut b = 0;
        for &i in &free_of[ti] {
            let Some(k) = (0..ids.len())
                .map(|k| (b + k) % ids.len())
                .find(|&k| room[k] > 0)
            else {
                break;
            };
            room[k] -= 1;
            b = k + 1;
            let e = &mut parts[i];
            e.leader = ids[k];
            e.incarnation = brokers[&ids[k]].record.incarnation;
            e.epoch += 1;
        }
    }
    Moves { wanted, vacated }
}

/// Compute the next assignment, or `None` if nothing changes, keeping the
/// previous assignment's number of coordinator shards, every move for
/// balance allowed. The tests' shorthand: the controller calls
/// [`plan_moves`] with its rebalance policy.
#[cfg(test)]
pub fn plan(
    prev: &Assignment,
    controller_epoch: i32,
    controller_id: i32,
    brokers: &BTreeMap<i32, BrokerView>,
    topics: &BTreeMap<String, TopicInfo>,
    disk_epoch: impl FnMut(&str, i32) -> i32,
) -> Option<Assignment> {
    let shards = prev.coordinators.len() as u32;
    plan_with_shards(
        prev,
        controller_epoch,
        controller_id,
        brokers,
        topics,
        shards,
        disk_epoch,
    )
}

/// Compute the next assignment with `shards` coordinator shards, or `None`
/// if nothing changes. `disk_epoch(topic, partition)` is the highest leader
/// epoch already on disk for a partition the previous assignment does not
/// know (`(COORDINATOR_SHARDS, shard)` for a shard). Every move for balance
/// allowed: the tests' shorthand for [`plan_moves`].
#[cfg(test)]
pub fn plan_with_shards(
    prev: &Assignment,
    controller_epoch: i32,
    controller_id: i32,
    brokers: &BTreeMap<i32, BrokerView>,
    topics: &BTreeMap<String, TopicInfo>,
    shards: u32,
    disk_epoch: impl FnMut(&str, i32) -> i32,
) -> Option<Assignment> {
    plan_moves(
        prev,
        controller_epoch,
        controller_id,
        brokers,
        topics,
        shards,
        MovePolicy::ALL,
        disk_epoch,
    )
    .0
}

/// The next assignment with `shards` coordinator shards (`None`: nothing
/// changes), moves for balance limited by `policy`; also says what was out
/// of place and what this plan moved. `disk_epoch(topic, partition)` is the
/// highest leader epoch already on disk for a partition the previous
/// assignment does not know (`(COORDINATOR_SHARDS, shard)` for a shard).
#[allow(clippy::too_many_arguments)]
pub fn plan_moves(
    prev: &Assignment,
    controller_epoch: i32,
    controller_id: i32,
    brokers: &BTreeMap<i32, BrokerView>,
    topics: &BTreeMap<String, TopicInfo>,
    shards: u32,
    policy: MovePolicy,
    mut disk_epoch: impl FnMut(&str, i32) -> i32,
) -> (Option<Assignment>, Moves) {
    let version = prev.version + 1;
    let mut next: BTreeMap<String, TopicAssignment> = BTreeMap::new();
    // Partitions to grant: (topic, index).
    let mut free: Vec<(String, usize)> = Vec::new();
    let mut load: Load = brokers
        .iter()
        .filter(|(_, b)| b.eligible())
        .map(|(id, _)| (*id, Vec::new()))
        .collect();

    // The shards, as one more topic (see module docs).
    let shard_info = TopicInfo {
        topic_id: uuid::Uuid::nil(),
        partitions: i32::try_from(shards).unwrap_or(i32::MAX),
        configs: BTreeMap::new(),
        deleting: false,
    };
    let shard_prev = TopicAssignment {
        topic_id: uuid::Uuid::nil(),
        configs: BTreeMap::new(),
        partitions: prev.coordinators.clone(),
        deleting: false,
    };
    let all = std::iter::once((COORDINATOR_SHARDS, &shard_info, Some(&shard_prev)))
        .filter(|_| shards > 0)
        .chain(
            topics
                .iter()
                .map(|(n, i)| (n.as_str(), i, prev.topics.get(n))),
        );
    for (name, info, old) in all {
        let old = old.filter(|t| t.topic_id == info.topic_id);
        let mut parts = Vec::with_capacity(info.partitions.max(0) as usize);
        for p in 0..info.partitions.max(0) {
            let i = p as usize;
            let mut e = match old.and_then(|t| t.partitions.get(i)) {
                Some(e) => *e,
                None => PartitionAssignment::vacant(disk_epoch(name, p)),
            };
            // The holder was fenced at open: its epoch is claimed by another
            // leader (granted by a deposed controller's late write), or a
            // higher epoch is on disk. Re-grant above it — after that other
            // leader, if it is alive, has let go (two-phase, as any move).
            let fenced_at = brokers.get(&e.leader).and_then(|b| {
                b.record
                    .fenced
                    .iter()
                    .filter(|f| f.topic == name && f.partition == p && f.found >= e.epoch)
                    .max_by_key(|f| f.found)
            });
            if info.deleting {
                // Being deleted: every holder lets go (two-phase, so the
                // directory is renamed aside only once no leader has a file
                // open in it), and nothing is granted again.
                if e.leader >= 0 {
                    if holds(brokers, e.leader, e.incarnation) {
                        e.releasing = Some((e.leader, e.incarnation, version));
                    }
                    e.leader = -1;
                    e.incarnation = 0;
                } else if let Some((b, inc, v)) = e.releasing {
                    if released(brokers, b, inc, controller_epoch, v) {
                        e.releasing = None;
                    }
                }
            } else if e.leader >= 0 {
                if let Some(f) = fenced_at {
                    let grantee = (e.leader, e.incarnation);
                    e = PartitionAssignment::vacant(f.found);
                    if let Some(o) = f
                        .owner
                        .filter(|o| o.broker_id >= 0 && (o.broker_id, o.incarnation) != grantee)
                    {
                        if !released(
                            brokers,
                            o.broker_id,
                            o.incarnation,
                            controller_epoch,
                            version,
                        ) {
                            e.releasing = Some((o.broker_id, o.incarnation, version));
                        }
                    }
                } else if !holds(brokers, e.leader, e.incarnation) {
                    e = PartitionAssignment::vacant(e.epoch);
                } else if brokers
                    .get(&e.leader)
                    .is_some_and(|b| b.record.shutting_down)
                {
                    e.releasing = Some((e.leader, e.incarnation, version));
                    e.leader = -1;
                    e.incarnation = 0;
                } else if let Some(held) = load.get_mut(&e.leader) {
                    held.push((name.to_owned(), i));
                }
                // (else: held by a broker not observed yet, or suspect —
                // it keeps the grant and takes no new ones)
            } else if let Some((b, inc, v)) = e.releasing {
                if released(brokers, b, inc, controller_epoch, v) {
                    e.releasing = None;
                }
            }
            if e.leader < 0 && e.releasing.is_none() && !info.deleting {
                free.push((name.to_owned(), i));
            }
            parts.push(e);
        }
        next.insert(
            name.to_owned(),
            TopicAssignment {
                topic_id: info.topic_id,
                configs: info.configs.clone(),
                partitions: parts,
                deleting: info.deleting,
            },
        );
    }

    // Partitions and shards are balanced each on their own: a broker's
    // share of partitions does not depend on how many shards it holds.
    let mut shard_load: Load = BTreeMap::new();
    for (b, held) in load.iter_mut() {
        let (shards, parts): (Vec<_>, Vec<_>) =
            held.drain(..).partition(|(t, _)| t == COORDINATOR_SHARDS);
        *held = parts;
        shard_load.insert(*b, shards);
    }
    let (free_shards, free): (Vec<_>, Vec<_>) =
        free.into_iter().partition(|(t, _)| t == COORDINATOR_SHARDS);
    let a = balance(&mut next, &load, &free, brokers, version, false, policy);
    let b = balance(
        &mut next,
        &shard_load,
        &free_shards,
        brokers,
        version,
        true,
        policy,
    );
    let moves = Moves {
        wanted: a.wanted + b.wanted,
        vacated: a.vacated + b.vacated,
    };

    let endpoints: Vec<BrokerEndpoint> = brokers
        .iter()
        .filter(|(_, b)| b.live() && !b.suspect)
        .map(|(id, b)| BrokerEndpoint {
            id: *id,
            host: b.record.host.clone(),
            port: b.record.port,
        })
        .collect();
    let coordinators = next
        .remove(COORDINATOR_SHARDS)
        .map(|t| t.partitions)
        .unwrap_or_default();
    let same = prev.controller_epoch == controller_epoch
        && prev.controller_id == controller_id
        && prev.brokers == endpoints
        && prev.topics == next
        && prev.coordinators == coordinators;
    if same {
        return (None, moves);
    }
    let next = Assignment {
        controller_epoch,
        controller_id,
        version,
        brokers: endpoints,
        topics: next,
        coordinators,
    };
    (Some(next), moves)
}

#[cfg(test)]
mod tests {
    use super::super::records::FencedAt;
    use super::*;
    use crate::partition::claim::ClaimOwner;

    fn rec(id: i32, inc: u64) -> BrokerRecord {
        BrokerRecord {
            broker_id: id,
            incarnation: inc,
            seq: 1,
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

    fn applied(r: &mut BrokerRecord, a: &Assignment) {
        r.applied_controller_epoch = a.controller_epoch;
        r.applied_version = a.version;
    }

    fn fenced_at(p: i32, found: i32, owner: Option<(i32, u64)>) -> FencedAt {
        FencedAt {
            topic: "t".into(),
            partition: p,
            found,
            owner: owner.map(|(broker_id, incarnation)| ClaimOwner {
                broker_id,
                incarnation,
            }),
        }
    }

    /// A deposed controller's late write granted partition 1 to broker 1
    /// at the epoch we then granted to broker 0: broker 1 won the claim,
    /// broker 0's open was fenced and names it. Broker 1 may be leading, so
    /// it must let go (apply a version without the grant) before anyone
    /// leads at a higher epoch — else the new leader would seal a live
    /// leader's tail and lose what it acknowledges after.
    #[test]
    fn a_claim_taken_by_a_live_leader_is_released_before_a_new_grant() {
        let b = live(&[0, 1]);
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(2), |_, _| 0).unwrap();
        let held = |a: &Assignment, p: usize| a.topics["t"].partitions[p];
        let p = (0..2).find(|&p| held(&a, p).leader == 0).unwrap();
        let e = held(&a, p).epoch;
        let mut b2 = b.clone();
        let inc1 = b2[&1].record.incarnation;
        b2.get_mut(&0).unwrap().record.fenced = vec![fenced_at(p as i32, e, Some((1, inc1)))];
        let v2 = plan(&a, 1, 0, &b2, &topic(2), |_, _| 0).unwrap();
        assert_eq!(
            held(&v2, p).leader,
            -1,
            "not granted while broker 1 may lead it"
        );
        assert_eq!(held(&v2, p).releasing, Some((1, inc1, v2.version)));
        // Broker 1 applied an older controller's version with the same
        // number: not a release of ours.
        let mut b3 = b2.clone();
        b3.get_mut(&1).unwrap().record.applied_controller_epoch = 0;
        b3.get_mut(&1).unwrap().record.applied_version = v2.version;
        assert!(plan(&v2, 1, 0, &b3, &topic(2), |_, _| 0).is_none());
        // Applied ours: granted again, above the claimed epoch.
        applied(&mut b3.get_mut(&1).unwrap().record, &v2);
        let v3 = plan(&v2, 1, 0, &b3, &topic(2), |_, _| 0).unwrap();
        assert!(held(&v3, p).leader >= 0);
        assert_eq!(held(&v3, p).epoch, e + 1);
        assert_eq!(held(&v3, p).releasing, None);
    }

    /// The claim is empty (its writer crashed, or a lost reply), or names an
    /// incarnation of broker 1 that is not its live one: no wait.
    #[test]
    fn an_empty_claim_or_an_old_incarnations_claim_is_regranted_at_once() {
        let b = live(&[0, 1]);
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(2), |_, _| 0).unwrap();
        let p = (0..2)
            .find(|&p| a.topics["t"].partitions[p].leader == 0)
            .unwrap();
        let e = a.topics["t"].partitions[p].epoch;
        for owner in [None, Some((1, 12345))] {
            let mut b2 = b.clone();
            b2.get_mut(&0).unwrap().record.fenced = vec![fenced_at(p as i32, e, owner)];
            let v2 = plan(&a, 1, 0, &b2, &topic(2), |_, _| 0).unwrap();
            let n = v2.topics["t"].partitions[p];
            assert!(n.leader >= 0, "{owner:?}: {n:?}");
            assert_eq!(n.epoch, e + 1, "{owner:?}");
        }
    }

    fn live(ids: &[i32]) -> BTreeMap<i32, BrokerView> {
        ids.iter()
            .map(|&i| {
                (
                    i,
                    BrokerView {
                        record: rec(i, 100 + i as u64),
                        alive: true,
                        suspect: false,
                    },
                )
            })
            .collect()
    }

    fn topic(n: i32) -> BTreeMap<String, TopicInfo> {
        let mut m = BTreeMap::new();
        m.insert(
            "t".to_string(),
            TopicInfo {
                topic_id: uuid::Uuid::from_u128(7),
                partitions: n,
                configs: BTreeMap::new(),
                deleting: false,
            },
        );
        m
    }

    fn leaders(a: &Assignment) -> Vec<i32> {
        a.topics["t"].partitions.iter().map(|p| p.leader).collect()
    }

    #[test]
    fn new_partitions_are_spread_and_start_above_the_disk_epoch() {
        let a = plan(
            &Assignment::default(),
            1,
            0,
            &live(&[0, 1, 2]),
            &topic(6),
            |_, p| p,
        )
        .unwrap();
        let mut l = leaders(&a);
        l.sort();
        assert_eq!(l, vec![0, 0, 1, 1, 2, 2]);
        for (p, e) in a.topics["t"].partitions.iter().enumerate() {
            assert_eq!(e.epoch, p as i32 + 1);
            assert_eq!(e.incarnation, 100 + e.leader as u64);
        }
        assert_eq!(a.version, 1);
        assert!(
            plan(&a, 1, 0, &live(&[0, 1, 2]), &topic(6), |_, _| 0).is_none(),
            "stable"
        );
    }

    #[test]
    fn a_dead_brokers_partitions_move_at_once_with_a_new_epoch() {
        let b = live(&[0, 1, 2]);
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(6), |_, _| 0).unwrap();
        let mut b2 = b.clone();
        b2.get_mut(&1).unwrap().alive = false;
        let n = plan(&a, 1, 0, &b2, &topic(6), |_, _| 0).unwrap();
        for (old, new) in a.topics["t"]
            .partitions
            .iter()
            .zip(&n.topics["t"].partitions)
        {
            if old.leader == 1 {
                assert_ne!(new.leader, 1);
                assert!(new.leader >= 0);
                assert_eq!(new.epoch, old.epoch + 1);
            } else {
                assert_eq!(old, new, "live owners keep their partitions");
            }
        }
        assert!(!n.brokers.iter().any(|e| e.id == 1));
    }

    #[test]
    fn a_grant_fenced_at_open_is_renewed_above_the_epoch_on_disk() {
        let b = live(&[0]);
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(2), |_, _| 0).unwrap();
        let mut b2 = b.clone();
        b2.get_mut(&0).unwrap().record.fenced = vec![fenced_at(1, 50, None)];
        let n = plan(&a, 1, 0, &b2, &topic(2), |_, _| 0).unwrap();
        assert_eq!(n.topics["t"].partitions[0], a.topics["t"].partitions[0]);
        assert_eq!(n.topics["t"].partitions[1].epoch, 51);
        assert_eq!(n.topics["t"].partitions[1].leader, 0);
        // Once re-granted above it, the stale report changes nothing.
        assert!(plan(&n, 1, 0, &b2, &topic(2), |_, _| 0).is_none());
    }

    #[test]
    fn an_unobserved_broker_keeps_its_grants() {
        let b = live(&[0, 1]);
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(4), |_, _| 0).unwrap();
        // A new controller whose (stale) view lacks broker 1.
        let only0 = live(&[0]);
        let n = plan(&a, 2, 0, &only0, &topic(4), |_, _| 0).unwrap();
        assert_eq!(n.topics, a.topics, "absence is not death");
    }

    #[test]
    fn a_suspect_broker_gets_no_new_grants() {
        let mut b = live(&[0, 1]);
        b.get_mut(&1).unwrap().suspect = true;
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(2), |_, _| 0).unwrap();
        assert_eq!(leaders(&a), vec![0, 0]);
    }

    #[test]
    fn a_suspect_broker_keeps_its_grants_but_is_not_advertised() {
        let b = live(&[0, 1]);
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(2), |_, _| 0).unwrap();
        let mut b2 = b.clone();
        b2.get_mut(&1).unwrap().suspect = true;
        let n = plan(&a, 1, 0, &b2, &topic(2), |_, _| 0).unwrap();
        assert_eq!(n.topics, a.topics, "grants stand until lease + grace");
        assert_eq!(n.brokers.iter().map(|e| e.id).collect::<Vec<_>>(), vec![0]);
    }

    #[test]
    fn a_new_incarnation_voids_the_old_grant() {
        let b = live(&[0]);
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(2), |_, _| 0).unwrap();
        let mut b2 = b.clone();
        b2.get_mut(&0).unwrap().record.incarnation = 999;
        let n = plan(&a, 1, 0, &b2, &topic(2), |_, _| 0).unwrap();
        for e in &n.topics["t"].partitions {
            assert_eq!((e.leader, e.incarnation, e.epoch), (0, 999, 2));
        }
    }

    #[test]
    fn shutdown_moves_in_two_phases() {
        let b = live(&[0, 1]);
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(4), |_, _| 0).unwrap();
        let mut b2 = b.clone();
        b2.get_mut(&1).unwrap().record.shutting_down = true;
        let v2 = plan(&a, 1, 0, &b2, &topic(4), |_, _| 0).unwrap();
        for e in &v2.topics["t"].partitions {
            assert_ne!(e.leader, 1);
        }
        let vacated: Vec<_> = v2.topics["t"]
            .partitions
            .iter()
            .filter(|e| e.releasing.is_some())
            .collect();
        assert_eq!(vacated.len(), 2);
        assert!(
            vacated.iter().all(|e| e.leader == -1),
            "not granted before the release"
        );
        // Not yet applied: nothing changes.
        assert!(plan(&v2, 1, 0, &b2, &topic(4), |_, _| 0).is_none());
        // Applied: granted to broker 0 with a new epoch.
        applied(&mut b2.get_mut(&1).unwrap().record, &v2);
        let v3 = plan(&v2, 1, 0, &b2, &topic(4), |_, _| 0).unwrap();
        assert_eq!(leaders(&v3), vec![0, 0, 0, 0]);
        assert!(v3.topics["t"]
            .partitions
            .iter()
            .all(|e| e.releasing.is_none()));
        assert_eq!(
            v3.topics["t"]
                .partitions
                .iter()
                .filter(|e| e.epoch == 2)
                .count(),
            2
        );
    }

    /// Catches: a deleted topic's directory renamed aside while a live
    /// leader still writes into it (acknowledged records that belong to no
    /// topic), or a deleting topic's partition granted again.
    #[test]
    fn a_deleted_topic_is_vacated_in_two_phases_and_never_regranted() {
        let mut b = live(&[0, 1, 2]);
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(6), |_, _| 0).unwrap();
        let mut deleting = topic(6);
        deleting.get_mut("t").unwrap().deleting = true;
        // Broker 2 dies as the delete is asked for: its grants are void at
        // once (it is fenced); the live holders must let go first.
        b.get_mut(&2).unwrap().alive = false;
        let v2 = plan(&a, 1, 0, &b, &deleting, |_, _| 0).unwrap();
        let t = &v2.topics["t"];
        assert!(t.deleting && !t.vacated());
        for (old, new) in a.topics["t"].partitions.iter().zip(&t.partitions) {
            assert_eq!(new.leader, -1, "nothing led");
            assert_eq!(new.epoch, old.epoch);
            if old.leader == 2 {
                assert_eq!(new.releasing, None, "a dead holder is fenced");
            } else {
                assert_eq!(new.releasing, Some((old.leader, old.incarnation, 2)));
            }
        }
        // Not yet applied: nothing changes, nothing is granted.
        assert!(plan(&v2, 1, 0, &b, &deleting, |_, _| 0).is_none());
        applied(&mut b.get_mut(&0).unwrap().record, &v2);
        let v3 = plan(&v2, 1, 0, &b, &deleting, |_, _| 0).unwrap();
        assert!(!v3.topics["t"].vacated(), "broker 1 still holds its files");
        applied(&mut b.get_mut(&1).unwrap().record, &v2);
        let v4 = plan(&v3, 1, 0, &b, &deleting, |_, _| 0).unwrap();
        assert!(v4.topics["t"].vacated());
        assert!(v4.topics["t"].partitions.iter().all(|e| e.leader == -1));
        // Once the directory is gone the topic leaves the assignment; a
        // re-create (new id) starts above the epochs on disk.
        let v5 = plan(&v4, 1, 0, &b, &BTreeMap::new(), |_, _| 0).unwrap();
        assert!(v5.topics.is_empty());
    }

    #[test]
    fn a_joining_broker_takes_only_its_share() {
        let b = live(&[0, 1]);
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(6), |_, _| 0).unwrap();
        let b3 = live(&[0, 1, 2]);
        let v2 = plan(&a, 1, 0, &b3, &topic(6), |_, _| 0).unwrap();
        let moved = v2.topics["t"]
            .partitions
            .iter()
            .filter(|e| e.releasing.is_some())
            .count();
        assert_eq!(moved, 2, "3+3 -> 2+2+2 moves exactly two");
        let mut b3a = b3.clone();
        for id in [0, 1] {
            applied(&mut b3a.get_mut(&id).unwrap().record, &v2);
        }
        let v3 = plan(&v2, 1, 0, &b3a, &topic(6), |_, _| 0).unwrap();
        let mut l = leaders(&v3);
        l.sort();
        assert_eq!(l, vec![0, 0, 1, 1, 2, 2]);
    }

    fn vacated(a: &Assignment) -> usize {
        a.topics["t"]
            .partitions
            .iter()
            .filter(|e| e.releasing.is_some())
            .count()
    }

    #[test]
    fn moves_for_balance_are_limited_by_the_policy_and_failover_is_not() {
        // 0 and 1 hold 3 + 3 (2 was away); 2 is back: two are out of place.
        let b = live(&[0, 1]);
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(6), |_, _| 0).unwrap();
        let b3 = live(&[0, 1, 2]);
        let run = |policy| plan_moves(&a, 1, 0, &b3, &topic(6), 0, policy, |_, _| 0);
        // None allowed: 2 is advertised again, nothing moves.
        let (n, m) = run(MovePolicy::NONE);
        assert_eq!(
            m,
            Moves {
                wanted: 2,
                vacated: 0
            }
        );
        let n = n.expect("the broker list changed");
        assert_eq!(vacated(&n), 0);
        assert_eq!(n.topics, a.topics);
        // One at a time.
        let one = MovePolicy {
            max_moves: 1,
            min_percent: 0,
        };
        let (n, m) = run(one);
        assert_eq!(
            m,
            Moves {
                wanted: 2,
                vacated: 1
            }
        );
        let n = n.unwrap();
        assert_eq!(vacated(&n), 1);
        // The one in flight counts: the next pass starts none until it lands.
        let mut b3a = b3.clone();
        let (again, m) = plan_moves(&n, 1, 0, &b3a, &topic(6), 0, one, |_, _| 0);
        assert_eq!((again, m.vacated), (None, 0));
        for id in [0, 1] {
            applied(&mut b3a.get_mut(&id).unwrap().record, &n);
        }
        let (n2, m) = plan_moves(&n, 1, 0, &b3a, &topic(6), 0, one, |_, _| 0);
        let n2 = n2.unwrap();
        assert_eq!(m.vacated, 1, "the landed one is granted, the next vacated");
        assert_eq!(leaders(&n2).iter().filter(|&&l| l == 2).count(), 1);
        // Below the threshold: 2 of 6 is 33%, so 34% starts nothing.
        let (_, m) = run(MovePolicy {
            max_moves: 100,
            min_percent: 34,
        });
        assert_eq!(
            m,
            Moves {
                wanted: 2,
                vacated: 0
            }
        );
        let (_, m) = run(MovePolicy {
            max_moves: 100,
            min_percent: 33,
        });
        assert_eq!(
            m,
            Moves {
                wanted: 2,
                vacated: 2
            }
        );

        // A failover is never limited: 1 dies, its partitions go at once
        // (to 2 first, which has room), with no move for balance allowed.
        let mut dead = b3.clone();
        dead.get_mut(&1).unwrap().alive = false;
        let (n, m) = plan_moves(&a, 1, 0, &dead, &topic(6), 0, MovePolicy::NONE, |_, _| 0);
        let n = n.unwrap();
        assert_eq!(m.vacated, 0);
        let mut l = leaders(&n);
        l.sort();
        assert_eq!(l, vec![0, 0, 0, 2, 2, 2], "one failure, one move");
    }

    #[test]
    fn no_eligible_broker_leaves_partitions_vacant() {
        let mut b = live(&[0]);
        b.get_mut(&0).unwrap().alive = false;
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(2), |_, _| 3).unwrap();
        assert!(a.topics["t"]
            .partitions
            .iter()
            .all(|e| e.leader == -1 && e.epoch == 3));
    }

    #[test]
    fn a_recreated_topic_starts_over() {
        let b = live(&[0]);
        let a = plan(&Assignment::default(), 1, 0, &b, &topic(1), |_, _| 5).unwrap();
        assert_eq!(a.topics["t"].partitions[0].epoch, 6);
        let mut t2 = topic(1);
        t2.get_mut("t").unwrap().topic_id = uuid::Uuid::from_u128(8);
        let n = plan(&a, 1, 0, &b, &t2, |_, _| 0).unwrap();
        assert_eq!(
            n.topics["t"].partitions[0].epoch, 1,
            "new id, new directory, epochs from disk"
        );
    }

    /// Coordinator shards are granted like partitions: every shard gets a
    /// leader and epoch 1 (above what is on disk), shards and partitions are
    /// each balanced on their own, and a plan of the same inputs changes
    /// nothing.
    #[test]
    fn coordinator_shards_are_granted_and_balanced_with_partitions() {
        let b = live(&[0, 1]);
        let a = plan_with_shards(&Assignment::default(), 1, 0, &b, &topic(2), 4, |t, p| {
            if t == COORDINATOR_SHARDS && p == 3 {
                5
            } else {
                0
            }
        })
        .unwrap();
        assert_eq!(a.coordinators.len(), 4);
        assert!(a.coordinators.iter().all(|e| e.leader >= 0));
        assert_eq!(a.coordinator(3).unwrap().epoch, 6, "above the disk epoch");
        assert_eq!(a.coordinator(0).unwrap().epoch, 1);
        let per = |id: i32| {
            a.coordinators.iter().filter(|e| e.leader == id).count()
                + a.topics["t"]
                    .partitions
                    .iter()
                    .filter(|e| e.leader == id)
                    .count()
        };
        assert_eq!((per(0), per(1)), (3, 3));
        assert!(plan(&a, 1, 0, &b, &topic(2), |_, _| 0).is_none(), "stable");
    }

    /// A shard held by a broker that shuts down is vacated first and
    /// granted elsewhere, at a higher epoch, only once that broker applied
    /// the release; a dead holder's shard is granted again at once.
    #[test]
    fn coordinator_shards_move_in_two_phases_and_fail_over() {
        let mut b = live(&[0, 1]);
        let a = plan_with_shards(
            &Assignment::default(),
            1,
            0,
            &b,
            &BTreeMap::new(),
            2,
            |_, _| 0,
        )
        .unwrap();
        let s = a.coordinators.iter().position(|e| e.leader == 1).unwrap();
        let e = a.coordinators[s].epoch;
        b.get_mut(&1).unwrap().record.shutting_down = true;
        let v2 = plan(&a, 1, 0, &b, &BTreeMap::new(), |_, _| 0).unwrap();
        let inc1 = b[&1].record.incarnation;
        assert_eq!(v2.coordinators[s].leader, -1);
        assert_eq!(v2.coordinators[s].releasing, Some((1, inc1, v2.version)));
        applied(&mut b.get_mut(&1).unwrap().record, &v2);
        let v3 = plan(&v2, 1, 0, &b, &BTreeMap::new(), |_, _| 0).unwrap();
        assert_eq!(v3.coordinators[s].leader, 0);
        assert_eq!(v3.coordinators[s].epoch, e + 1);

        let mut d = live(&[0, 1]);
        d.get_mut(&1).unwrap().alive = false;
        let v4 = plan(&a, 1, 0, &d, &BTreeMap::new(), |_, _| 0).unwrap();
        assert_eq!(v4.coordinators[s].leader, 0, "re-granted at once");
        assert_eq!(v4.coordinators[s].epoch, e + 1);
    }

    /// A broker joining a one-broker cluster takes its share of partitions
    /// and of shards alike (not, say, every partition and no shard).
    #[test]
    fn a_joining_broker_gets_its_share_of_each_class() {
        let one = live(&[0]);
        let a =
            plan_with_shards(&Assignment::default(), 1, 0, &one, &topic(4), 4, |_, _| 0).unwrap();
        let both = live(&[0, 1]);
        let v2 = plan(&a, 1, 0, &both, &topic(4), |_, _| 0).unwrap();
        let moving =
            |es: &[PartitionAssignment]| es.iter().filter(|e| e.releasing.is_some()).count();
        assert_eq!(moving(&v2.coordinators), 2);
        assert_eq!(moving(&v2.topics["t"].partitions), 2);
    }

    /// A shard whose holder was fenced at open (its claim taken) is
    /// re-granted above the epoch found, like a partition.
    #[test]
    fn a_fenced_coordinator_shard_is_regranted_above_the_epoch_found() {
        let b = live(&[0]);
        let a = plan_with_shards(
            &Assignment::default(),
            1,
            0,
            &b,
            &BTreeMap::new(),
            1,
            |_, _| 0,
        )
        .unwrap();
        let mut b2 = b.clone();
        b2.get_mut(&0).unwrap().record.fenced = vec![FencedAt {
            topic: COORDINATOR_SHARDS.into(),
            partition: 0,
            found: 7,
            owner: None,
        }];
        let v2 = plan(&a, 1, 0, &b2, &BTreeMap::new(), |_, _| 0).unwrap();
        assert_eq!(v2.coordinators[0].leader, 0);
        assert_eq!(v2.coordinators[0].epoch, 8);
    }

    /// Assignment files written before shards existed still read.
    #[test]
    fn an_assignment_without_coordinators_reads() {
        let mut a = plan(
            &Assignment::default(),
            1,
            0,
            &live(&[0]),
            &topic(1),
            |_, _| 0,
        )
        .unwrap();
        let mut v: serde_json::Value = serde_json::to_value(&a).unwrap();
        v.as_object_mut().unwrap().remove("coordinators");
        let back: Assignment = serde_json::from_value(v).unwrap();
        a.coordinators.clear();
        assert_eq!(back, a);
    }

    /// Both caps of a class, for every eligible broker, in `a`.
    fn assert_caps(a: &Assignment, b: &BTreeMap<i32, BrokerView>, ctx: &str) {
        let eligible: Vec<i32> = b
            .iter()
            .filter(|(_, v)| v.eligible())
            .map(|(i, _)| *i)
            .collect();
        if eligible.is_empty() {
            return;
        }
        let e = eligible.len();
        let classes: [Vec<&[PartitionAssignment]>; 2] = [
            a.topics
                .values()
                .filter(|t| !t.deleting)
                .map(|t| t.partitions.as_slice())
                .collect(),
            vec![a.coordinators.as_slice()],
        ];
        for class in classes {
            let total: usize = class.iter().map(|p| p.len()).sum();
            for &id in &eligible {
                let mut n = 0;
                for parts in &class {
                    let here = parts.iter().filter(|p| p.leader == id).count();
                    assert!(
                        here <= parts.len().div_ceil(e),
                        "{ctx}: broker {id} leads {here} of a topic of {} over {e} brokers",
                        parts.len()
                    );
                    n += here;
                }
                assert!(
                    n <= total.div_ceil(e),
                    "{ctx}: broker {id} leads {n} of {total}"
                );
            }
            for parts in &class {
                for p in parts.iter() {
                    assert!(p.leader >= 0 && p.releasing.is_none(), "{ctx}: {p:?} unled");
                }
            }
        }
    }

    /// The fewest held partitions any placement meeting both caps moves,
    /// by enumeration; `None` if the instance is too big to enumerate.
    fn fewest_moves(
        a: &Assignment,
        b: &BTreeMap<i32, BrokerView>,
        topics: &BTreeMap<String, TopicInfo>,
        shards: u32,
    ) -> Option<usize> {
        let eligible: Vec<i32> = b
            .iter()
            .filter(|(_, v)| v.eligible())
            .map(|(i, _)| *i)
            .collect();
        let e = eligible.len();
        // Topics new to `a` are all vacant.
        let of = |have: Option<&Vec<PartitionAssignment>>, n: usize| -> Vec<PartitionAssignment> {
            (0..n)
                .map(|i| {
                    have.and_then(|h| h.get(i))
                        .copied()
                        .unwrap_or(PartitionAssignment::vacant(0))
                })
                .collect()
        };
        let owned: [Vec<Vec<PartitionAssignment>>; 2] = [
            topics
                .iter()
                .map(|(n, t)| {
                    of(
                        a.topics.get(n).map(|t| &t.partitions),
                        t.partitions as usize,
                    )
                })
                .collect(),
            vec![of(Some(&a.coordinators), shards as usize)],
        ];
        let classes: [Vec<&[PartitionAssignment]>; 2] = owned
            .each_ref()
            .map(|c| c.iter().map(Vec::as_slice).collect());
        let mut sum = 0;
        for class in classes {
            let total: usize = class.iter().map(|p| p.len()).sum();
            // Units to place: (topic, current eligible owner index).
            let mut units: Vec<(usize, Option<usize>)> = Vec::new();
            for (t, parts) in class.iter().enumerate() {
                for p in parts.iter() {
                    let fixed = p.leader >= 0
                        && holds(b, p.leader, p.incarnation)
                        && b.get(&p.leader)
                            .is_none_or(|v| !v.eligible() && !v.record.shutting_down);
                    if !fixed {
                        let owner = eligible
                            .iter()
                            .position(|&id| id == p.leader && holds(b, p.leader, p.incarnation));
                        units.push((t, owner));
                    }
                }
            }
            if units.is_empty() {
                continue;
            }
            if e == 0 {
                return None;
            }
            if (e as f64).powi(units.len() as i32) > 200_000.0 {
                return None;
            }
            let cap = total.div_ceil(e);
            let mut best = usize::MAX;
            let mut choice = vec![0usize; units.len()];
            loop {
                let mut per = vec![vec![0usize; e]; class.len()];
                let mut load = vec![0usize; e];
                let mut moves = 0;
                for (u, &c) in units.iter().zip(&choice) {
                    per[u.0][c] += 1;
                    load[c] += 1;
                    if u.1.is_some_and(|o| o != c) {
                        moves += 1;
                    }
                }
                let ok = load.iter().all(|&l| l <= cap)
                    && per
                        .iter()
                        .enumerate()
                        .all(|(t, row)| row.iter().all(|&n| n <= class[t].len().div_ceil(e)));
                if ok {
                    best = best.min(moves);
                }
                // Next choice (odometer).
                let mut k = 0;
                while k < choice.len() {
                    choice[k] += 1;
                    if choice[k] < e {
                        break;
                    }
                    choice[k] = 0;
                    k += 1;
                }
                if k == choice.len() {
                    break;
                }
            }
            sum += best;
        }
        Some(sum)
    }

    /// Plan until nothing changes, every live broker applying each version
    /// at once. Returns every version published.
    fn settle(
        a: &Assignment,
        b: &mut BTreeMap<i32, BrokerView>,
        topics: &BTreeMap<String, TopicInfo>,
        shards: u32,
        ctx: &str,
    ) -> Vec<Assignment> {
        let mut out = Vec::new();
        let mut cur = a.clone();
        for _ in 0..3 {
            let Some(n) = plan_with_shards(&cur, 1, 0, b, topics, shards, |_, _| 0) else {
                return out;
            };
            for v in b.values_mut() {
                if v.live() {
                    applied(&mut v.record, &n);
                }
            }
            out.push(n.clone());
            cur = n;
        }
        panic!("{ctx}: not settled after {} versions: {out:#?}", out.len());
    }

    /// Property: for random clusters (live, dead, suspect, unobserved and
    /// shutting-down brokers), topics, shards and current owners, then
    /// random joins, deaths, restarts, shutdowns and new topics — planning
    /// until nothing changes (every live broker applying each version)
    /// takes at most two versions (vacate, then grant what was released);
    /// both caps then hold; planning again changes nothing; no partition
    /// is granted twice on the way; and a held partition moves only as
    /// often as the fewest moves any placement meeting both caps needs
    /// (by enumeration, where small enough to enumerate).
    #[test]
    fn balance_settles_with_both_caps_met() {
        use rand::{Rng, SeedableRng};
        let mut enumerated = 0;
        let mut moved_total = 0;
        for seed in 0..600u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let big = seed % 10 == 9;
            let n_brokers: i32 = rng.gen_range(1..=if big { 8 } else { 4 });
            let mut b = live(&(0..n_brokers).collect::<Vec<_>>());
            for v in b.values_mut() {
                match rng.gen_range(0..12) {
                    0 => v.alive = false,
                    1 => v.suspect = true,
                    2 => v.record.shutting_down = true,
                    _ => {}
                }
            }
            let mut topics = BTreeMap::new();
            let mut a = Assignment {
                controller_epoch: 1,
                controller_id: 0,
                version: 1,
                ..Assignment::default()
            };
            let random_owner = |rng: &mut rand::rngs::StdRng, b: &BTreeMap<i32, BrokerView>| {
                let l: i32 = rng.gen_range(-1..=n_brokers);
                let inc = b.get(&l).map_or(7, |v| v.record.incarnation);
                let stale = rng.gen_range(0..10) == 0;
                PartitionAssignment {
                    leader: l,
                    incarnation: if stale { inc + 1 } else { inc },
                    epoch: rng.gen_range(1..5),
                    releasing: None,
                }
            };
            let n_topics = rng.gen_range(1..=if big { 40 } else { 4 });
            for t in 0..n_topics {
                let n = rng.gen_range(1..=if big { 24 } else { 4 });
                let name = format!("t{t}");
                let info = TopicInfo {
                    topic_id: uuid::Uuid::from_u128(1000 + t as u128),
                    partitions: n,
                    configs: BTreeMap::new(),
                    deleting: false,
                };
                a.topics.insert(
                    name.clone(),
                    TopicAssignment {
                        topic_id: info.topic_id,
                        configs: BTreeMap::new(),
                        partitions: (0..n).map(|_| random_owner(&mut rng, &b)).collect(),
                        deleting: false,
                    },
                );
                topics.insert(name, info);
            }
            let shards: u32 = rng.gen_range(0..=if big { 50 } else { 3 });
            a.coordinators = (0..shards).map(|_| random_owner(&mut rng, &b)).collect();
            let mut next_id = n_brokers + 1;
            for step in 0..5 {
                let ctx = format!("seed {seed} step {step}");
                let fewest = fewest_moves(&a, &b, &topics, shards);
                let versions = settle(&a, &mut b, &topics, shards, &ctx);
                let end = versions.last().unwrap_or(&a).clone();
                assert_caps(&end, &b, &ctx);
                assert!(
                    plan_with_shards(&end, 1, 0, &b, &topics, shards, |_, _| 0).is_none(),
                    "{ctx}: a fixed point"
                );
                // Per partition: the grants along the way, and whether a
                // held partition left its (eligible) owner.
                let entries = |a: &Assignment| -> BTreeMap<(String, usize), PartitionAssignment> {
                    a.topics
                        .iter()
                        .flat_map(|(n, t)| {
                            t.partitions
                                .iter()
                                .enumerate()
                                .map(|(i, e)| ((n.clone(), i), *e))
                        })
                        .chain(
                            a.coordinators
                                .iter()
                                .enumerate()
                                .map(|(i, e)| ((String::new(), i), *e)),
                        )
                        .collect()
                };
                let before = entries(&a);
                let after = entries(&end);
                let mut moves = 0;
                for (k, last) in &after {
                    let first = before
                        .get(k)
                        .copied()
                        .unwrap_or(PartitionAssignment::vacant(0));
                    let grants: std::collections::BTreeSet<(i32, u64, i32)> = versions
                        .iter()
                        .map(|v| entries(v)[k])
                        .filter(|e| e.leader >= 0 && *e != first)
                        .map(|e| (e.leader, e.incarnation, e.epoch))
                        .collect();
                    assert!(grants.len() <= 1, "{ctx}: {k:?} granted twice: {grants:?}");
                    let held = first.leader >= 0
                        && holds(&b, first.leader, first.incarnation)
                        && b.get(&first.leader).is_some_and(|v| v.live());
                    if held && (last.leader, last.incarnation) != (first.leader, first.incarnation)
                    {
                        moves += 1;
                    }
                }
                if let Some(f) = fewest {
                    // Shutting-down owners must give everything up; they
                    // are not eligible, so `fewest_moves` counts those as
                    // units without an owner, and they are added here.
                    let forced = before
                        .values()
                        .filter(|e| {
                            e.leader >= 0
                                && holds(&b, e.leader, e.incarnation)
                                && b.get(&e.leader)
                                    .is_some_and(|v| v.live() && v.record.shutting_down)
                        })
                        .count();
                    assert_eq!(moves, f + forced, "{ctx}: more moves than needed");
                    enumerated += 1;
                }
                moved_total += moves;
                a = end;
                // A random change of the cluster.
                let ids: Vec<i32> = b.keys().copied().collect();
                let pick = ids[rng.gen_range(0..ids.len())];
                match rng.gen_range(0..7) {
                    0 | 1 => {
                        b.insert(
                            next_id,
                            BrokerView {
                                record: rec(next_id, 100 + next_id as u64),
                                alive: true,
                                suspect: false,
                            },
                        );
                        next_id += 1;
                    }
                    2 => b.get_mut(&pick).unwrap().alive = false,
                    3 => {
                        let v = b.get_mut(&pick).unwrap();
                        v.record.incarnation += 1000;
                        v.alive = true;
                        v.suspect = false;
                        v.record.shutting_down = false;
                    }
                    4 => b.get_mut(&pick).unwrap().record.shutting_down = true,
                    5 => {
                        let v = b.get_mut(&pick).unwrap();
                        v.suspect = !v.suspect;
                    }
                    _ => {
                        let t = topics.len();
                        topics.insert(
                            format!("t{t}"),
                            TopicInfo {
                                topic_id: uuid::Uuid::from_u128(1000 + t as u128),
                                partitions: rng.gen_range(1..=if big { 24 } else { 3 }),
                                configs: BTreeMap::new(),
                                deleting: false,
                            },
                        );
                    }
                }
            }
        }
        assert!(enumerated > 500, "enumerated only {enumerated}");
        assert!(moved_total > 100, "moved only {moved_total}");
    }

    /// At scale (1,000 topics of 1–19 partitions plus 50 shards; 3 brokers,
    /// then a 4th joins, then one dies): both caps hold after each change,
    /// and the join moves exactly the joiner's share — every partition that
    /// moved ended on the joiner.
    #[test]
    fn a_join_at_10_000_partitions_moves_only_the_joiners_share() {
        let mut topics = BTreeMap::new();
        for t in 0..1000u32 {
            topics.insert(
                format!("t{t:04}"),
                TopicInfo {
                    topic_id: uuid::Uuid::from_u128(u128::from(t) + 1),
                    partitions: 1 + (t % 19) as i32,
                    configs: BTreeMap::new(),
                    deleting: false,
                },
            );
        }
        let mut b = live(&[0, 1, 2]);
        let started = std::time::Instant::now();
        let a = plan_with_shards(&Assignment::default(), 1, 0, &b, &topics, 50, |_, _| 0).unwrap();
        eprintln!("first placement: {:?}", started.elapsed());
        assert_caps(&a, &b, "three brokers");
        b.insert(
            3,
            BrokerView {
                record: rec(3, 103),
                alive: true,
                suspect: false,
            },
        );
        let started = std::time::Instant::now();
        let versions = settle(&a, &mut b, &topics, 50, "join");
        eprintln!(
            "join: {:?} for {} versions",
            started.elapsed(),
            versions.len()
        );
        let end = versions.last().unwrap();
        assert_caps(end, &b, "join");
        let mut moved = 0;
        for (n, t) in &a.topics {
            for (old, new) in t.partitions.iter().zip(&end.topics[n].partitions) {
                if old.leader != new.leader {
                    assert_eq!(new.leader, 3, "{n}: moved between old brokers");
                    moved += 1;
                }
            }
        }
        let joiner: usize = end
            .topics
            .values()
            .map(|t| t.partitions.iter().filter(|e| e.leader == 3).count())
            .sum();
        assert_eq!(moved, joiner);
        b.get_mut(&1).unwrap().alive = false;
        let started = std::time::Instant::now();
        let versions = settle(end, &mut b, &topics, 50, "death");
        eprintln!("death: {:?}", started.elapsed());
        assert_caps(versions.last().unwrap(), &b, "death");
    }
}
