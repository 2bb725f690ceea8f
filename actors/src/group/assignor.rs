//! The server-side assignors of the KIP-848 consumer protocol
//! (`group.remote.assignor`): `uniform` and `range`, as pure functions from
//! the members' subscriptions and the topics' partition counts to a target
//! assignment.
//!
//! * `uniform` balances every member's partition count (at most one apart
//!   when subscriptions are the same) and is sticky: a partition stays with
//!   its previous target owner while that owner is subscribed and not above
//!   its share, so a join or a leave moves as few partitions as it can.
//! * `range` is Kafka's range per topic: the members subscribed to a topic,
//!   sorted by member id, each take a contiguous range of its partitions,
//!   the first `partitions % members` one more. Not sticky (like Kafka's).
//!
//! Both give every partition of a subscribed topic to exactly one
//! subscribed member, and none to anyone else (tested below).

use std::collections::{BTreeMap, BTreeSet};
use uuid::Uuid;

/// A member's assignment: topic id → partitions.
pub type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

/// The default assignor (Kafka's first of `group.consumer.assignors`).
pub const UNIFORM: &str = "uniform";
/// The range assignor.
pub const RANGE: &str = "range";
/// Every assignor served, default first.
pub const ASSIGNORS: &[&str] = &[UNIFORM, RANGE];

/// What an assignor sees of one member.
#[derive(Debug, Clone)]
pub struct AssignorMember<'a> {
    /// Member id.
    pub id: &'a str,
    /// The topic ids it subscribes to (resolved; unknown topics left out).
    pub topics: BTreeSet<Uuid>,
    /// Its current target assignment (stickiness).
    pub previous: Option<&'a Assignment>,
}

/// Run assignor `name` (one of [`ASSIGNORS`]; anything else is uniform).
pub fn assign(
    name: &str,
    members: &[AssignorMember<'_>],
    partitions: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    if name == RANGE {
        range(members, partitions)
    } else {
        uniform(members, partitions)
    }
}

/// Kafka's range assignor, per topic.
pub fn range(
    members: &[AssignorMember<'_>],
    partitions: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .iter()
        .map(|m| (m.id.to_owned(), Assignment::new()))
        .collect();
    for (&topic, &n) in partitions {
        let mut subs: Vec<&str> = members
            .iter()
            .filter(|m| m.topics.contains(&topic))
            .map(|m| m.id)
            .collect();
        if subs.is_empty() || n <= 0 {
            continue;
        }
        subs.sort_unstable();
        let count = subs.len() as i32;
        let (each, extra) = (n / count, n % count);
        let mut next = 0;
        for (i, id) in subs.iter().enumerate() {
            let take = each + i32::from((i as i32) < extra);
            if take > 0 {
                let set = out
                    .entry((*id).to_owned())
                    .or_default()
                    .entry(topic)
                    .or_default();
                set.extend(next..next + take);
            }
            next += take;
        }
    }
    out
}

/// The sticky, balanced `uniform` assignor.
pub fn uniform(
    members: &[AssignorMember<'_>],
    partitions: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .iter()
        .map(|m| (m.id.to_owned(), Assignment::new()))
        .collect();
    if members.is_empty() {
        return out;
    }
    // Every partition someone subscribes to.
    let all: Vec<(Uuid, i32)> = partitions
        .iter()
        .filter(|(t, _)| members.iter().any(|m| m.topics.contains(t)))
        .flat_map(|(&t, &n)| (0..n.max(0)).map(move |p| (t, p)))
        .collect();
    // A member's share: an even split of what it could take. With equal
    // subscriptions this is ceil(total / members); with unequal ones it is
    // a cap that keeps the sticky pass from hoarding.
    let share = |m: &AssignorMember<'_>| {
        let eligible = all.iter().filter(|(t, _)| m.topics.contains(t)).count();
        let sharing = members.len().max(1);
        eligible.div_ceil(sharing)
    };
    let floor = all.len() / members.len();
    let mut extra = all.len() % members.len();
    let mut count: BTreeMap<&str, usize> = members.iter().map(|m| (m.id, 0)).collect();
    let mut taken: BTreeSet<(Uuid, i32)> = BTreeSet::new();
    // Sticky pass: keep previous partitions up to the floor, then one more
    // for as many members as there are extras.
    for pass in 0..2 {
        for m in members {
            let Some(prev) = m.previous else { continue };
            let cap = if pass == 0 {
                floor.min(share(m))
            } else if extra > 0 {
                (floor + 1).min(share(m).max(floor))
            } else {
                continue;
            };
            let before = count[m.id];
            for (&t, ps) in prev {
                if !m.topics.contains(&t) {
                    continue;
                }
                let n = partitions.get(&t).copied().unwrap_or(0);
                for &p in ps {
                    if count[m.id] >= cap {
                        break;
                    }
                    if p < n && taken.insert((t, p)) {
                        give(&mut out, &mut count, m.id, t, p);
                    }
                }
            }
            if pass == 1 && count[m.id] > before && count[m.id] > floor {
                extra -= 1;
            }
        }
    }
    // Everything else to the least-loaded subscribed member (ties by id).
    for &(t, p) in &all {
        if taken.contains(&(t, p)) {
            continue;
        }
        let best = members
            .iter()
            .filter(|m| m.topics.contains(&t))
            .min_by_key(|m| (count[m.id], m.id));
        if let Some(m) = best {
            give(&mut out, &mut count, m.id, t, p);
            taken.insert((t, p));
        }
    }
    out
}

fn give(
    out: &mut BTreeMap<String, Assignment>,
    count: &mut BTreeMap<&str, usize>,
    id: &str,
    t: Uuid,
    p: i32,
) {
    if let Some(a) = out.get_mut(id) {
        a.entry(t).or_default().insert(p);
    }
    if let Some(c) = count.get_mut(id) {
        *c += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u8) -> Uuid {
        Uuid::from_bytes([n; 16])
    }

    fn members<'a>(ids: &[&'a str], topics: &[Uuid]) -> Vec<AssignorMember<'a>> {
        ids.iter()
            .map(|id| AssignorMember {
                id,
                topics: topics.iter().copied().collect(),
                previous: None,
            })
            .collect()
    }

    fn sizes(a: &BTreeMap<String, Assignment>) -> Vec<usize> {
        a.values()
            .map(|x| x.values().map(BTreeSet::len).sum())
            .collect()
    }

    /// Every subscribed partition exactly once, and only to subscribers.
    fn check_exact(
        a: &BTreeMap<String, Assignment>,
        ms: &[AssignorMember<'_>],
        parts: &BTreeMap<Uuid, i32>,
    ) {
        let mut seen = BTreeSet::new();
        for (id, x) in a {
            let m = ms.iter().find(|m| m.id == id).unwrap();
            for (topic, ps) in x {
                assert!(m.topics.contains(topic), "{id} got an unsubscribed topic");
                for p in ps {
                    assert!(seen.insert((*topic, *p)), "{topic}/{p} twice");
                }
            }
        }
        let want: usize = parts
            .iter()
            .filter(|(t, _)| ms.iter().any(|m| m.topics.contains(t)))
            .map(|(_, n)| *n as usize)
            .sum();
        assert_eq!(seen.len(), want);
    }

    #[test]
    fn range_splits_each_topic_contiguously_by_member_id() {
        let parts = BTreeMap::from([(t(1), 7), (t(2), 2)]);
        let ms = members(&["b", "a", "c"], &[t(1), t(2)]);
        let a = range(&ms, &parts);
        check_exact(&a, &ms, &parts);
        assert_eq!(a["a"][&t(1)], BTreeSet::from([0, 1, 2]));
        assert_eq!(a["b"][&t(1)], BTreeSet::from([3, 4]));
        assert_eq!(a["c"][&t(1)], BTreeSet::from([5, 6]));
        assert_eq!(a["a"][&t(2)], BTreeSet::from([0]));
        assert_eq!(a["b"][&t(2)], BTreeSet::from([1]));
        assert!(!a["c"].contains_key(&t(2)));
    }

    #[test]
    fn uniform_balances_and_is_sticky_across_a_join_and_a_leave() {
        let parts = BTreeMap::from([(t(1), 6), (t(2), 5)]);
        let ms = members(&["a", "b", "c"], &[t(1), t(2)]);
        let first = uniform(&ms, &parts);
        check_exact(&first, &ms, &parts);
        let s = sizes(&first);
        assert!(
            s.iter().max().unwrap() - s.iter().min().unwrap() <= 1,
            "{s:?}"
        );

        // d joins: every partition it gets came from someone; nobody else
        // loses more than it has to.
        let mut ms2 = members(&["a", "b", "c", "d"], &[t(1), t(2)]);
        for m in &mut ms2 {
            m.previous = first.get(m.id);
        }
        let second = uniform(&ms2, &parts);
        check_exact(&second, &ms2, &parts);
        let s = sizes(&second);
        assert!(
            s.iter().max().unwrap() - s.iter().min().unwrap() <= 1,
            "{s:?}"
        );
        for id in ["a", "b", "c"] {
            for (topic, ps) in &second[id] {
                assert!(
                    ps.is_subset(&first[id][topic]),
                    "{id} gained a partition on a join"
                );
            }
        }

        // b leaves: a, c, d keep everything they had.
        let mut ms3 = members(&["a", "c", "d"], &[t(1), t(2)]);
        for m in &mut ms3 {
            m.previous = second.get(m.id);
        }
        let third = uniform(&ms3, &parts);
        check_exact(&third, &ms3, &parts);
        for id in ["a", "c", "d"] {
            for (topic, ps) in &second[id] {
                assert!(ps.is_subset(&third[id][topic]), "{id} lost on a leave");
            }
        }
    }

    #[test]
    fn uniform_with_unequal_subscriptions_gives_only_subscribed_topics() {
        let parts = BTreeMap::from([(t(1), 4), (t(2), 4), (t(3), 1)]);
        let mut ms = members(&["a", "b"], &[t(1)]);
        ms.push(AssignorMember {
            id: "c",
            topics: BTreeSet::from([t(1), t(2)]),
            previous: None,
        });
        let a = uniform(&ms, &parts);
        check_exact(&a, &ms, &parts);
        assert_eq!(a["c"][&t(2)].len(), 4);
        // t(3) has no subscriber: nobody gets it.
        assert!(a.values().all(|x| !x.contains_key(&t(3))));
    }

    #[test]
    fn more_members_than_partitions_and_no_members() {
        let parts = BTreeMap::from([(t(1), 2)]);
        let ms = members(&["a", "b", "c"], &[t(1)]);
        for name in ASSIGNORS {
            let a = assign(name, &ms, &parts);
            check_exact(&a, &ms, &parts);
            assert_eq!(a.len(), 3);
        }
        assert!(uniform(&[], &parts).is_empty());
        assert!(range(&[], &parts).is_empty());
    }
}
