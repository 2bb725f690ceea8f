//! `OwnerRegistry`: the owners (actors) this broker runs *by grant* — today
//! partition leaders; next, coordinator shards (consumer groups,
//! transactions), which the controller will grant the same way.
//!
//! A grant is a key (what is owned: a partition, a shard) plus a token
//! (what distinguishes one grant of that key from another: topic id and
//! leader epoch). The registry makes the set of running owners equal to the
//! set granted, in the order that keeps two owners of one key from
//! overlapping: it first stops every owner whose grant was lost or changed
//! — awaiting each one's final fsync and close — and only then starts the
//! owners of new grants. A group of keys (a topic being deleted) can be held
//! so that no owner starts in it meanwhile.
//!
//! What is owned, how an owner starts (its spec, its arbiter) and what
//! "granted" means are the caller's; the registry only keeps the map and the
//! order. It has no actix in it beyond the owner's own `stop` future.

use futures::future::LocalBoxFuture;
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Mutex;

/// A running owner that can be stopped for good.
pub trait Owner: Clone + 'static {
    /// Stop: resolves once the owner no longer writes (its files fsynced
    /// and closed).
    fn stop(self) -> LocalBoxFuture<'static, ()>;
}

/// What an owner owns. Keys belong to a group (a topic) that can be held.
pub trait GrantKey: Clone + Eq + Hash + Debug + 'static {
    /// The group this key belongs to.
    fn group(&self) -> &str;
}

/// Partitions: (topic, partition), grouped by topic.
impl GrantKey for (String, i32) {
    fn group(&self) -> &str {
        &self.0
    }
}

/// What one [`OwnerRegistry::start_granted`] or `stop_*` call changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changed {
    /// Owners stopped.
    pub stopped: usize,
    /// Owners started.
    pub started: usize,
}

struct Inner<K, G, H> {
    owners: HashMap<K, (G, H)>,
    held: HashSet<String>,
}

/// See module docs. `K` the key, `G` the grant token, `H` the owner handle.
pub struct OwnerRegistry<K, G, H> {
    inner: Mutex<Inner<K, G, H>>,
}

impl<K, G, H> Default for OwnerRegistry<K, G, H> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                owners: HashMap::new(),
                held: HashSet::new(),
            }),
        }
    }
}

impl<K: GrantKey, G: Clone + PartialEq + 'static, H: Owner> OwnerRegistry<K, G, H> {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The owner of `key` and the grant it runs under.
    pub fn get(&self, key: &K) -> Option<(G, H)> {
        self.inner.lock().unwrap().owners.get(key).cloned()
    }

    /// How many owners run.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().owners.len()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hold `group` (no owner of it starts) or release the hold. Taken
    /// under the same lock as [`Self::start_granted`], so a start in flight
    /// either finished before the hold or sees it.
    pub fn hold(&self, group: &str, on: bool) {
        let mut i = self.inner.lock().unwrap();
        if on {
            i.held.insert(group.to_owned());
        } else {
            i.held.remove(group);
        }
    }

    /// Whether `group` is held.
    pub fn is_held(&self, group: &str) -> bool {
        self.inner.lock().unwrap().held.contains(group)
    }

    /// Stop every owner whose key is not in `wanted` under the same grant,
    /// and wait until all of them stopped.
    pub async fn stop_lost(&self, wanted: &HashMap<K, G>) -> usize {
        self.stop_where(|k, g| wanted.get(k) != Some(g)).await
    }

    /// Stop the owners of `group`, or of every group, and wait.
    pub async fn stop_group(&self, group: Option<&str>) -> usize {
        self.stop_where(|k, _| group.is_none_or(|x| x == k.group()))
            .await
    }

    async fn stop_where(&self, pred: impl Fn(&K, &G) -> bool) -> usize {
        let stopping: Vec<H> = {
            let mut i = self.inner.lock().unwrap();
            let keys: Vec<K> = i
                .owners
                .iter()
                .filter(|(k, (g, _))| pred(k, g))
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| i.owners.remove(&k).map(|(_, h)| h))
                .collect()
        };
        let n = stopping.len();
        futures::future::join_all(stopping.into_iter().map(Owner::stop)).await;
        n
    }

    /// Start an owner for every key of `wanted` that has none and whose
    /// group is not held. `start` returns `None` when it cannot start one
    /// now (it is retried on the next application). Call after
    /// [`Self::stop_lost`]: an owner of a changed grant must be gone before
    /// the new one starts.
    pub fn start_granted(
        &self,
        wanted: HashMap<K, G>,
        mut start: impl FnMut(&K, &G) -> Option<H>,
    ) -> usize {
        let mut i = self.inner.lock().unwrap();
        let mut started = 0;
        for (k, g) in wanted {
            if i.owners.contains_key(&k) || i.held.contains(k.group()) {
                continue;
            }
            if let Some(h) = start(&k, &g) {
                i.owners.insert(k, (g, h));
                started += 1;
            }
        }
        started
    }

    /// Run exactly the owners granted in `wanted`: stop what was lost, then
    /// start what was gained.
    pub async fn apply(
        &self,
        wanted: HashMap<K, G>,
        start: impl FnMut(&K, &G) -> Option<H>,
    ) -> Changed {
        let stopped = self.stop_lost(&wanted).await;
        let started = self.start_granted(wanted, start);
        Changed { stopped, started }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    type Log = Rc<RefCell<Vec<String>>>;

    #[derive(Clone)]
    struct Fake(String, Log);

    impl Owner for Fake {
        fn stop(self) -> LocalBoxFuture<'static, ()> {
            Box::pin(async move { self.1.borrow_mut().push(format!("stop {}", self.0)) })
        }
    }

    fn key(t: &str, p: i32) -> (String, i32) {
        (t.to_owned(), p)
    }

    fn starter(log: &Log) -> impl FnMut(&(String, i32), &i32) -> Option<Fake> + '_ {
        move |k, e| {
            let name = format!("{}-{}@{e}", k.0, k.1);
            log.borrow_mut().push(format!("start {name}"));
            Some(Fake(name, log.clone()))
        }
    }

    #[test]
    fn a_changed_grant_stops_the_old_owner_before_the_new_one_starts() {
        let log: Log = Rc::default();
        let r: OwnerRegistry<(String, i32), i32, Fake> = OwnerRegistry::new();
        let wanted: HashMap<_, _> = [(key("t", 0), 1), (key("t", 1), 1)].into();
        let c = futures::executor::block_on(r.apply(wanted, starter(&log)));
        assert_eq!(
            c,
            Changed {
                stopped: 0,
                started: 2
            }
        );
        log.borrow_mut().clear();
        // t-0 re-granted at epoch 2, t-1 lost, u-0 gained.
        let wanted: HashMap<_, _> = [(key("t", 0), 2), (key("u", 0), 1)].into();
        let c = futures::executor::block_on(r.apply(wanted, starter(&log)));
        assert_eq!(
            c,
            Changed {
                stopped: 2,
                started: 2
            }
        );
        let l = log.borrow();
        let first_start = l.iter().position(|e| e.starts_with("start")).unwrap();
        assert!(
            l[..first_start].contains(&"stop t-0@1".to_owned()),
            "stops come first: {l:?}"
        );
        assert!(l.contains(&"start t-0@2".to_owned()));
        assert_eq!(r.get(&key("t", 0)).unwrap().0, 2);
        assert!(r.get(&key("t", 1)).is_none());
    }

    #[test]
    fn a_held_group_starts_nothing_and_can_be_stopped_alone() {
        let log: Log = Rc::default();
        let r: OwnerRegistry<(String, i32), i32, Fake> = OwnerRegistry::new();
        r.hold("t", true);
        let wanted: HashMap<_, _> = [(key("t", 0), 1), (key("u", 0), 1)].into();
        let c = futures::executor::block_on(r.apply(wanted.clone(), starter(&log)));
        assert_eq!(c.started, 1, "only u");
        assert!(r.get(&key("t", 0)).is_none());
        r.hold("t", false);
        futures::executor::block_on(r.apply(wanted, starter(&log)));
        assert_eq!(r.len(), 2);
        assert_eq!(futures::executor::block_on(r.stop_group(Some("t"))), 1);
        assert_eq!(r.len(), 1);
        assert_eq!(futures::executor::block_on(r.stop_group(None)), 1);
        assert!(r.is_empty());
    }
}
