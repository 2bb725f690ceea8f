//! Consumer lag as this broker sees it: the committed offsets its
//! coordinators published (`kaas_actors::group::lag`) against high
//! watermarks. Nothing here waits on an actor, a file or a peer: each is a
//! read of published memory, so a scrape never delays the coordinators or
//! the data path.
//!
//! High watermarks come from two places:
//! * a partition this broker leads: its leader's published high watermark;
//! * a partition led by another broker (the coordinator of a group rarely
//!   leads all of its partitions in a cluster): [`RemoteHw`], refreshed in
//!   the background every [`REFRESH_EVERY`] by one ListOffsets (latest,
//!   read_uncommitted: the high watermark) per leader broker over the
//!   broker-to-broker client. A value is used for at most [`REMOTE_TTL`]
//!   after it was read; past that (the leader is unreachable) the partition
//!   counts as unknown (`kaas_consumer_lag_unknown_partitions`), not
//!   guessed. So a remote partition's lag is at most about
//!   `REFRESH_EVERY` + one round trip staler than a local one's.
//!
//! Before the refresher, every remote partition was unknown: in a 3-broker
//! cluster about two thirds of a group's partitions had no lag at all.

use crate::state::Broker;
use kaas_actors::group::lag::{self, LagReport};
use kaas_protocol::kafka_protocol::messages::list_offsets_request::{
    ListOffsetsPartition, ListOffsetsTopic,
};
use kaas_protocol::kafka_protocol::messages::{BrokerId, ListOffsetsRequest, TopicName};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Groups listed per coordinator in `/api/actors` at most.
const MAX_GROUPS_PER_SHARD: usize = 20;
/// Partitions listed per (group, topic) in `/api/actors` at most.
const MAX_PARTITIONS: usize = 64;

/// How often the high watermarks of remote partitions are re-read.
pub const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// How long a remote high watermark is used after it was read.
pub const REMOTE_TTL: Duration = Duration::from_secs(10);
/// Partitions asked of one leader in one round at most (bounds a request).
const MAX_PER_ROUND: usize = 10_000;
/// ListOffsets version sent to peers (v2+: isolation level; v4: leader
/// epoch; every kaas broker serves it).
const LIST_OFFSETS_VERSION: i16 = 4;
/// ListOffsets "latest" timestamp.
const LATEST: i64 = -1;

/// High watermarks of partitions led by other brokers, as last read.
#[derive(Debug, Default)]
pub struct RemoteHw {
    hw: Mutex<HashMap<(String, i32), (i64, Instant)>>,
}

impl RemoteHw {
    /// The process-wide table (the lag board is process-wide too).
    pub fn get() -> &'static RemoteHw {
        static R: OnceLock<RemoteHw> = OnceLock::new();
        R.get_or_init(RemoteHw::default)
    }

    /// `(topic, partition)`'s high watermark if read within [`REMOTE_TTL`].
    pub fn fresh(&self, topic: &str, partition: i32, now: Instant) -> Option<i64> {
        let m = self.hw.lock().unwrap();
        let (hw, at) = m.get(&(topic.to_owned(), partition))?;
        (now.saturating_duration_since(*at) <= REMOTE_TTL).then_some(*hw)
    }

    fn store(&self, topic: String, partition: i32, hw: i64, at: Instant) {
        self.hw.lock().unwrap().insert((topic, partition), (hw, at));
    }

    /// Forget what is no longer wanted or too old to be used.
    fn retain(&self, wanted: &BTreeSet<(String, i32)>, now: Instant) {
        self.hw.lock().unwrap().retain(|k, (_, at)| {
            wanted.contains(k) && now.saturating_duration_since(*at) <= REMOTE_TTL
        });
    }
}

/// Keep [`RemoteHw`] fresh for the committed partitions this broker's
/// coordinators published and does not lead; ends with the broker.
pub fn start_remote_refresh(b: Weak<Broker>) {
    tokio::task::spawn_local(async move {
        let mut tick = tokio::time::interval(REFRESH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(b) = b.upgrade() else { return };
            refresh(&b).await;
        }
    });
}

/// One round: group the remote partitions by leader, one ListOffsets each.
async fn refresh(b: &Arc<Broker>) {
    let board = lag::board().snapshot();
    if board.is_empty() {
        return;
    }
    let a = b.assignment();
    let me = b.args.broker_id;
    let mut wanted: BTreeSet<(String, i32)> = BTreeSet::new();
    let mut by_leader: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
    for (_, copy) in &board {
        for c in &copy.offsets {
            if b.local_leader(&c.topic, c.partition).is_some() {
                continue;
            }
            let key = (c.topic.clone(), c.partition);
            if !wanted.insert(key.clone()) {
                continue;
            }
            let leader = a
                .topics
                .get(&c.topic)
                .filter(|t| !t.deleting)
                .and_then(|t| t.partitions.get(usize::try_from(c.partition).ok()?))
                .map(|e| e.leader);
            match leader {
                Some(l) if l >= 0 && l != me => {
                    let v = by_leader.entry(l).or_default();
                    if v.len() < MAX_PER_ROUND {
                        v.push(key);
                    }
                }
                _ => {}
            }
        }
    }
    let rounds = by_leader.into_iter().filter_map(|(id, parts)| {
        let x = a.brokers.iter().find(|x| x.id == id)?;
        Some(ask_leader(b, x.host.clone(), x.port, parts))
    });
    futures::future::join_all(rounds).await;
    RemoteHw::get().retain(&wanted, Instant::now());
}

/// The ListOffsets (latest, read_uncommitted) of `parts` from one leader.
pub fn list_latest(parts: &[(String, i32)]) -> ListOffsetsRequest {
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in parts {
        topics.entry(t).or_default().push(*p);
    }
    let mut r = ListOffsetsRequest::default();
    r.replica_id = BrokerId(-1);
    r.isolation_level = 0;
    r.topics = topics
        .into_iter()
        .map(|(t, ps)| {
            let mut x = ListOffsetsTopic::default();
            x.name = TopicName(crate::api::s(t));
            x.partitions = ps
                .into_iter()
                .map(|p| {
                    let mut q = ListOffsetsPartition::default();
                    q.partition_index = p;
                    q.current_leader_epoch = -1;
                    q.timestamp = LATEST;
                    q
                })
                .collect();
            x
        })
        .collect();
    r
}

async fn ask_leader(b: &Broker, host: String, port: i32, parts: Vec<(String, i32)>) {
    let req = list_latest(&parts);
    let at = Instant::now();
    let resp = match b.peers.send(&host, port, LIST_OFFSETS_VERSION, &req).await {
        Ok(r) => r,
        Err(e) => {
            // Debug only: a dead leader is reported by the cluster code;
            // its partitions fall back to unknown after REMOTE_TTL.
            tracing::debug!(host, port, error = %e, "lag: ListOffsets to the leader failed");
            return;
        }
    };
    let remote = RemoteHw::get();
    for t in &resp.topics {
        for p in &t.partitions {
            // An error (NOT_LEADER after a move, …): keep the last value
            // until it ages out; the next round asks the new leader.
            if p.error_code == 0 && p.offset >= 0 {
                remote.store(t.name.0.to_string(), p.partition_index, p.offset, at);
            }
        }
    }
}

/// The lag of every group coordinated here.
pub fn report(b: &Broker) -> LagReport {
    let now = Instant::now();
    let hw = |topic: &str, partition: i32| {
        let Some(h) = b.local_leader(topic, partition) else {
            return RemoteHw::get().fresh(topic, partition, now);
        };
        // Still recovering: its high watermark is not known yet.
        h.reader.read().unwrap().as_ref()?;
        let hw = *h.hw.borrow();
        Some(hw)
    };
    lag::compute(&lag::board().snapshot(), hw, kaas_actors::clock::wall_ms())
}

/// The bounded `/metrics` lag series.
pub fn prometheus(b: &Broker) -> String {
    lag::render_prometheus(
        &report(b),
        b.args.lag_metrics_groups,
        b.args.lag_metrics_partitions,
    )
}

/// Per coordinator actor id (`shard-<n>`), its groups' lag per topic,
/// largest first, at most [`MAX_GROUPS_PER_SHARD`] entries.
pub fn by_coordinator(r: &LagReport) -> BTreeMap<String, Value> {
    let mut per: BTreeMap<u32, Vec<&lag::TopicLag>> = BTreeMap::new();
    for t in &r.topics {
        per.entry(t.shard).or_default().push(t);
    }
    per.into_iter()
        .map(|(shard, mut ts)| {
            ts.sort_by_key(|t| std::cmp::Reverse(t.lag));
            let total = ts.len();
            let rows: Vec<Value> = ts
                .into_iter()
                .take(MAX_GROUPS_PER_SHARD)
                .map(|t| {
                    json!({
                        "group": t.group,
                        "topic": t.topic,
                        "lag": t.lag,
                        "partitions": &t.partitions[..t.partitions.len().min(MAX_PARTITIONS)],
                        "unknown_partitions": t.unknown,
                    })
                })
                .collect();
            (
                format!("shard-{shard}"),
                json!({"topics": rows, "total": total, "staleness_ms": r.oldest_ms}),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_latest_groups_partitions_by_topic() {
        let r = list_latest(&[("a".into(), 1), ("b".into(), 0), ("a".into(), 0)]);
        assert_eq!(r.isolation_level, 0);
        let got: Vec<(String, Vec<(i32, i64)>)> = r
            .topics
            .iter()
            .map(|t| {
                (
                    t.name.0.to_string(),
                    t.partitions
                        .iter()
                        .map(|p| (p.partition_index, p.timestamp))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), vec![(1, LATEST), (0, LATEST)]),
                ("b".into(), vec![(0, LATEST)])
            ]
        );
    }

    #[test]
    fn a_remote_high_watermark_is_used_until_it_is_too_old() {
        let r = RemoteHw::default();
        let t0 = Instant::now();
        r.store("t".into(), 0, 42, t0);
        assert_eq!(r.fresh("t", 0, t0), Some(42));
        assert_eq!(r.fresh("t", 0, t0 + REMOTE_TTL), Some(42));
        assert_eq!(
            r.fresh("t", 0, t0 + REMOTE_TTL + Duration::from_millis(1)),
            None
        );
        assert_eq!(r.fresh("t", 1, t0), None);
        let wanted: BTreeSet<(String, i32)> = [("u".to_string(), 0)].into();
        r.retain(&wanted, t0);
        assert_eq!(r.fresh("t", 0, t0), None, "no longer committed: forgotten");
    }
}
