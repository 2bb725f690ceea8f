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
//!
//! The cluster view (`/api/cluster` `consumer_lag`, on every broker's page)
//! adds the groups other brokers coordinate: while a page is open (asked
//! within [`VIEW_TTL`]), each round also reads every live peer's groups and
//! their committed offsets over Kafka (ListGroups, then one OffsetFetch v8
//! for at most [`MAX_REMOTE_GROUPS`] of them), [`RemoteGroups`]; their
//! partitions' high watermarks join the same refresh. The partitions the
//! page lists and this broker does not lead get their log start and high
//! watermark the same way ([`RemoteHw::fresh_start`]). Nothing is read from peers when
//! no page is open: `/metrics` exports only the groups coordinated here, so
//! a group is never counted twice across brokers.

use crate::state::Broker;
use kaas_actors::group::lag::{self, Committed, LagReport, ShardOffsets};
use kaas_actors::group::shard::ShardId;
use kaas_protocol::kafka_protocol::messages::list_offsets_request::{
    ListOffsetsPartition, ListOffsetsTopic,
};
use kaas_protocol::kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
use kaas_protocol::kafka_protocol::messages::{
    BrokerId, GroupId, ListGroupsRequest, ListOffsetsRequest, OffsetFetchRequest, TopicName,
};
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
/// ListOffsets "earliest" timestamp.
const EARLIEST: i64 = -2;
/// How long after a page last asked the peers are still read.
pub const VIEW_TTL: Duration = Duration::from_secs(30);
/// Groups read from one peer per round at most (bounds the OffsetFetch).
pub const MAX_REMOTE_GROUPS: usize = 500;
/// Committed offsets kept from one peer at most.
const MAX_REMOTE_OFFSETS: usize = 100_000;
/// Groups listed in the cluster view at most (largest lag first).
const MAX_VIEW_GROUPS: usize = 50;
/// Partitions of one page read from their leaders at most.
const MAX_PAGE_PARTITIONS: usize = 200;
/// One peer exchange in a round gives up after this (a hung peer must not
/// hold up the round; the peer client's own timeout is 15 s).
const PEER_ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// Versions sent to peers for the cluster view.
const LIST_GROUPS_VERSION: i16 = 4;
const OFFSET_FETCH_VERSION: i16 = 8;

/// High watermarks (and, for the page's partitions, log start offsets) of
/// partitions led by other brokers, as last read.
#[derive(Debug, Default)]
pub struct RemoteHw {
    hw: Mutex<HashMap<(String, i32), (i64, Instant)>>,
    start: Mutex<HashMap<(String, i32), (i64, Instant)>>,
    /// The remote partitions the page listed last, and when.
    page: Mutex<PageWanted>,
}

/// Partitions a page listed (led elsewhere), and when it asked.
type PageWanted = (Vec<(String, i32)>, Option<Instant>);

/// One coordinator's published offsets, as `lag::compute` takes them.
type Published = (ShardId, Arc<ShardOffsets>);

/// One group in the cluster view: total lag, unknown partitions, topics.
type GroupRow<'a> = (i64, usize, Vec<&'a lag::TopicLag>);

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

    /// `(topic, partition)`'s log start offset if read within [`REMOTE_TTL`]
    /// (only the partitions a page listed are read).
    pub fn fresh_start(&self, topic: &str, partition: i32, now: Instant) -> Option<i64> {
        let m = self.start.lock().unwrap();
        let (o, at) = m.get(&(topic.to_owned(), partition))?;
        (now.saturating_duration_since(*at) <= REMOTE_TTL).then_some(*o)
    }

    fn store(&self, topic: String, partition: i32, hw: i64, at: Instant) {
        self.hw.lock().unwrap().insert((topic, partition), (hw, at));
    }

    fn store_start(&self, topic: String, partition: i32, start: i64, at: Instant) {
        self.start
            .lock()
            .unwrap()
            .insert((topic, partition), (start, at));
    }

    /// A page listed these partitions led elsewhere: read them for a while.
    pub fn want_page(&self, parts: Vec<(String, i32)>, now: Instant) {
        let mut parts = parts;
        parts.truncate(MAX_PAGE_PARTITIONS);
        *self.page.lock().unwrap() = (parts, Some(now));
    }

    /// The partitions a page listed within [`VIEW_TTL`].
    fn page_wanted(&self, now: Instant) -> Vec<(String, i32)> {
        let p = self.page.lock().unwrap();
        match p.1 {
            Some(at) if now.saturating_duration_since(at) <= VIEW_TTL => p.0.clone(),
            _ => Vec::new(),
        }
    }

    /// Forget what is no longer wanted or too old to be used.
    fn retain(&self, wanted: &BTreeSet<(String, i32)>, now: Instant) {
        let keep = |k: &(String, i32), at: &Instant| {
            wanted.contains(k) && now.saturating_duration_since(*at) <= REMOTE_TTL
        };
        self.hw.lock().unwrap().retain(|k, (_, at)| keep(k, at));
        self.start.lock().unwrap().retain(|k, (_, at)| keep(k, at));
    }
}

/// What one peer coordinates, as last read from it.
#[derive(Debug, Clone)]
struct PeerGroups {
    /// Committed offsets in (group, topic, partition) order.
    offsets: Vec<Committed>,
    /// When they were read (monotonic, for the TTL) and the wall clock.
    at: Instant,
    at_ms: i64,
}

/// Committed offsets of the groups other brokers coordinate, read only
/// while a page shows the cluster view.
#[derive(Debug, Default)]
pub struct RemoteGroups {
    by_peer: Mutex<BTreeMap<i32, PeerGroups>>,
    viewed: Mutex<Option<Instant>>,
}

impl RemoteGroups {
    /// The process-wide table.
    pub fn get() -> &'static RemoteGroups {
        static R: OnceLock<RemoteGroups> = OnceLock::new();
        R.get_or_init(RemoteGroups::default)
    }

    /// A page showed the cluster view: keep reading the peers a while.
    pub fn viewed(&self, now: Instant) {
        *self.viewed.lock().unwrap() = Some(now);
    }

    fn wanted(&self, now: Instant) -> bool {
        self.viewed
            .lock()
            .unwrap()
            .is_some_and(|at| now.saturating_duration_since(at) <= VIEW_TTL)
    }

    fn store(&self, peer: i32, offsets: Vec<Committed>, at: Instant) {
        let g = PeerGroups {
            offsets,
            at,
            at_ms: kaas_actors::clock::wall_ms(),
        };
        self.by_peer.lock().unwrap().insert(peer, g);
    }

    /// Per peer, its offsets if read within [`REMOTE_TTL`], freshest first;
    /// forgets older ones.
    fn fresh(&self, now: Instant) -> Vec<(i32, PeerGroups)> {
        let mut m = self.by_peer.lock().unwrap();
        m.retain(|_, g| now.saturating_duration_since(g.at) <= REMOTE_TTL);
        let mut v: Vec<(i32, PeerGroups)> = m.iter().map(|(p, g)| (*p, g.clone())).collect();
        v.sort_by_key(|(_, g)| std::cmp::Reverse(g.at));
        v
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

/// One round: while a page is open, the peers' groups first; then the
/// remote partitions (committed here or there, or listed by the page)
/// grouped by leader, one ListOffsets (latest) each, and one more
/// (earliest) for the page's.
async fn refresh(b: &Arc<Broker>) {
    let now = Instant::now();
    let groups = RemoteGroups::get();
    if groups.wanted(now) {
        read_peer_groups(b).await;
    }
    let page = RemoteHw::get().page_wanted(now);
    let board = lag::board().snapshot();
    let remote = groups.fresh(now);
    if board.is_empty() && remote.is_empty() && page.is_empty() {
        return;
    }
    let a = b.assignment();
    let me = b.args.broker_id;
    let leader_of = |topic: &str, partition: i32| -> Option<i32> {
        if b.local_leader(topic, partition).is_some() {
            return None;
        }
        a.topics
            .get(topic)
            .filter(|t| !t.deleting)
            .and_then(|t| t.partitions.get(usize::try_from(partition).ok()?))
            .map(|e| e.leader)
            .filter(|l| *l >= 0 && *l != me)
    };
    let mut wanted: BTreeSet<(String, i32)> = BTreeSet::new();
    let mut latest: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
    let mut earliest: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
    let committed = board
        .iter()
        .flat_map(|(_, c)| c.offsets.iter())
        .chain(remote.iter().flat_map(|(_, g)| g.offsets.iter()))
        .map(|c| (c.topic.as_str(), c.partition));
    for (topic, partition) in committed {
        let Some(l) = leader_of(topic, partition) else {
            continue;
        };
        let key = (topic.to_owned(), partition);
        if wanted.insert(key.clone()) {
            let v = latest.entry(l).or_default();
            if v.len() < MAX_PER_ROUND {
                v.push(key);
            }
        }
    }
    for key in page {
        let Some(l) = leader_of(&key.0, key.1) else {
            continue;
        };
        if wanted.insert(key.clone()) {
            latest.entry(l).or_default().push(key.clone());
        }
        earliest.entry(l).or_default().push(key);
    }
    let addr = |id: i32| {
        let x = a.brokers.iter().find(|x| x.id == id)?;
        Some((x.host.clone(), x.port))
    };
    let rounds = latest
        .into_iter()
        .map(|(id, parts)| (id, parts, LATEST))
        .chain(
            earliest
                .into_iter()
                .map(|(id, parts)| (id, parts, EARLIEST)),
        )
        .filter_map(|(id, parts, ts)| {
            let (host, port) = addr(id)?;
            Some(ask_leader(b, host, port, parts, ts))
        });
    futures::future::join_all(rounds).await;
    RemoteHw::get().retain(&wanted, Instant::now());
}

/// Every live peer's groups and committed offsets, each peer bounded by
/// [`PEER_ASK_TIMEOUT`].
async fn read_peer_groups(b: &Arc<Broker>) {
    let a = b.assignment();
    let me = b.args.broker_id;
    let asks = a.brokers.iter().filter(|x| x.id != me).map(|x| {
        let (id, host, port) = (x.id, x.host.clone(), x.port);
        async move {
            match tokio::time::timeout(PEER_ASK_TIMEOUT, peer_groups(b, &host, port)).await {
                Ok(Ok(offsets)) => RemoteGroups::get().store(id, offsets, Instant::now()),
                // Debug only: a dead peer is reported by the cluster code;
                // its groups drop out of the view after REMOTE_TTL.
                Ok(Err(e)) => {
                    tracing::debug!(host, port, error = %e, "lag: reading a peer's groups failed")
                }
                Err(_) => tracing::debug!(host, port, "lag: a peer's groups not read in time"),
            }
        }
    });
    futures::future::join_all(asks).await;
}

/// One peer's groups (ListGroups) and their committed offsets (one
/// OffsetFetch v8 for at most [`MAX_REMOTE_GROUPS`] of them).
async fn peer_groups(b: &Broker, host: &str, port: i32) -> Result<Vec<Committed>, String> {
    let list = b
        .peers
        .send(
            host,
            port,
            LIST_GROUPS_VERSION,
            &ListGroupsRequest::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
    if list.error_code != 0 && list.groups.is_empty() {
        return Err(format!("ListGroups error code {}", list.error_code));
    }
    let mut ids: Vec<String> = list
        .groups
        .iter()
        .map(|g| g.group_id.0.to_string())
        .collect();
    ids.sort();
    ids.dedup();
    ids.truncate(MAX_REMOTE_GROUPS);
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut req = OffsetFetchRequest::default();
    req.groups = ids
        .iter()
        .map(|g| {
            let mut x = OffsetFetchRequestGroup::default();
            x.group_id = GroupId(crate::api::s(g));
            x.topics = None;
            x
        })
        .collect();
    let resp = b
        .peers
        .send(host, port, OFFSET_FETCH_VERSION, &req)
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for g in resp.groups.iter().filter(|g| g.error_code == 0) {
        for t in &g.topics {
            for p in t.partitions.iter().filter(|p| p.error_code == 0) {
                if p.committed_offset >= 0 {
                    out.push(Committed {
                        group: g.group_id.0.to_string(),
                        topic: t.name.0.to_string(),
                        partition: p.partition_index,
                        offset: p.committed_offset,
                    });
                }
            }
        }
    }
    out.sort_by(|x, y| (&x.group, &x.topic, x.partition).cmp(&(&y.group, &y.topic, y.partition)));
    out.truncate(MAX_REMOTE_OFFSETS);
    Ok(out)
}

/// The ListOffsets at `timestamp` (latest or earliest; read_uncommitted,
/// so latest is the high watermark) of `parts` from one leader.
fn list_at(parts: &[(String, i32)], timestamp: i64) -> ListOffsetsRequest {
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
                    q.timestamp = timestamp;
                    q
                })
                .collect();
            x
        })
        .collect();
    r
}

async fn ask_leader(b: &Broker, host: String, port: i32, parts: Vec<(String, i32)>, ts: i64) {
    let req = list_at(&parts, ts);
    let at = Instant::now();
    let sent = b.peers.send(&host, port, LIST_OFFSETS_VERSION, &req);
    let resp = match tokio::time::timeout(PEER_ASK_TIMEOUT, sent).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            // Debug only: a dead leader is reported by the cluster code;
            // its partitions fall back to unknown after REMOTE_TTL.
            tracing::debug!(host, port, error = %e, "lag: ListOffsets to the leader failed");
            return;
        }
        Err(_) => {
            tracing::debug!(
                host,
                port,
                "lag: ListOffsets to the leader not answered in time"
            );
            return;
        }
    };
    let remote = RemoteHw::get();
    for t in &resp.topics {
        for p in &t.partitions {
            // An error (NOT_LEADER after a move, …): keep the last value
            // until it ages out; the next round asks the new leader.
            if p.error_code == 0 && p.offset >= 0 {
                let (topic, partition) = (t.name.0.to_string(), p.partition_index);
                if ts == EARLIEST {
                    remote.store_start(topic, partition, p.offset, at);
                } else {
                    remote.store(topic, partition, p.offset, at);
                }
            }
        }
    }
}

/// A partition's high watermark as this broker knows it now: its own
/// leader's, or a fresh remote read.
fn hw_of(b: &Broker, topic: &str, partition: i32, now: Instant) -> Option<i64> {
    let Some(h) = b.local_leader(topic, partition) else {
        return RemoteHw::get().fresh(topic, partition, now);
    };
    // Still recovering: its high watermark is not known yet.
    h.reader.read().unwrap().as_ref()?;
    let hw = *h.hw.borrow();
    Some(hw)
}

/// The lag of every group coordinated here.
pub fn report(b: &Broker) -> LagReport {
    let now = Instant::now();
    lag::compute(
        &lag::board().snapshot(),
        |t, p| hw_of(b, t, p, now),
        kaas_actors::clock::wall_ms(),
    )
}

/// This broker's published offsets (coordinator `me`) and the peers'
/// (freshest first), each group taken from one coordinator only: this
/// broker's, else the freshest peer read that has it (a shard that just
/// moved is still in its old coordinator's last answer).
fn merge(
    mut shards: Vec<Published>,
    me: i32,
    remote: Vec<(i32, PeerGroups)>,
) -> (Vec<Published>, HashMap<String, i32>) {
    let mut coordinator: HashMap<String, i32> = HashMap::new();
    for (_, c) in &shards {
        for o in &c.offsets {
            coordinator.entry(o.group.clone()).or_insert(me);
        }
    }
    for (peer, g) in remote {
        let theirs: Vec<Committed> = g
            .offsets
            .into_iter()
            .filter(|o| coordinator.get(&o.group).is_none_or(|c| *c == peer))
            .collect();
        for o in &theirs {
            coordinator.entry(o.group.clone()).or_insert(peer);
        }
        let copy = ShardOffsets {
            published_ms: g.at_ms,
            offsets: theirs,
            ..ShardOffsets::default()
        };
        shards.push((ShardId(u32::MAX), Arc::new(copy)));
    }
    (shards, coordinator)
}

/// The cluster view of consumer lag (`/api/cluster` `consumer_lag`): the
/// groups coordinated here and those read from the peers, per group with
/// its coordinator, largest lag first, at most [`MAX_VIEW_GROUPS`]. Marks
/// the view as looked at, so the next rounds read the peers.
pub fn cluster_view(b: &Broker) -> Value {
    let now = Instant::now();
    let groups = RemoteGroups::get();
    groups.viewed(now);
    let me = b.args.broker_id;
    let remote = groups.fresh(now);
    let peers_read: Vec<Value> = remote
        .iter()
        .map(|(peer, g)| json!({"broker": peer, "read_ms_ago": now.saturating_duration_since(g.at).as_millis() as u64}))
        .collect();
    let (shards, coordinator) = merge(lag::board().snapshot(), me, remote);
    let r = lag::compute(
        &shards,
        |t, p| hw_of(b, t, p, now),
        kaas_actors::clock::wall_ms(),
    );
    // Per group: total lag, unknown partitions, its topics largest first.
    let mut per: BTreeMap<&str, GroupRow> = BTreeMap::new();
    for t in &r.topics {
        let e = per.entry(t.group.as_str()).or_default();
        e.0 = e.0.saturating_add(t.lag);
        e.1 += t.unknown;
        e.2.push(t);
    }
    let total = per.len();
    let mut rows: Vec<(&str, GroupRow)> = per.into_iter().collect();
    rows.sort_by(|x, y| y.1 .0.cmp(&x.1 .0).then(x.0.cmp(y.0)));
    let groups: Vec<Value> = rows
        .into_iter()
        .take(MAX_VIEW_GROUPS)
        .map(|(g, (lag, unknown, mut ts))| {
            ts.sort_by_key(|t| std::cmp::Reverse(t.lag));
            json!({
                "group": g,
                "coordinator": coordinator.get(g),
                "lag": lag,
                "unknown_partitions": unknown,
                "topics": ts.iter().map(|t| json!({
                    "topic": t.topic,
                    "lag": t.lag,
                    "unknown_partitions": t.unknown,
                    "partitions": &t.partitions[..t.partitions.len().min(MAX_PARTITIONS)],
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "groups_total": total,
        "groups": groups,
        "staleness_ms": r.oldest_ms,
        "peers_read": peers_read,
    })
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
        let r = list_at(&[("a".into(), 1), ("b".into(), 0), ("a".into(), 0)], LATEST);
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

    fn committed(group: &str, partition: i32, offset: i64) -> Committed {
        Committed {
            group: group.into(),
            topic: "t".into(),
            partition,
            offset,
        }
    }

    #[test]
    fn a_group_is_taken_from_one_coordinator_only() {
        let local = ShardOffsets {
            offsets: vec![committed("mine", 0, 5)],
            ..ShardOffsets::default()
        };
        let now = Instant::now();
        let peer = |offsets, at| PeerGroups {
            offsets,
            at,
            at_ms: 0,
        };
        // Freshest first: broker 2 just took "moved" over from broker 1.
        let remote = vec![
            (2, peer(vec![committed("moved", 0, 9)], now)),
            (
                1,
                peer(
                    vec![
                        committed("mine", 0, 1),
                        committed("moved", 0, 3),
                        committed("theirs", 0, 7),
                        committed("theirs", 1, 8),
                    ],
                    now - Duration::from_millis(500),
                ),
            ),
        ];
        let (shards, coordinator) = merge(vec![(ShardId(3), Arc::new(local))], 0, remote);
        let want: HashMap<String, i32> = [
            ("mine".into(), 0),
            ("moved".into(), 2),
            ("theirs".into(), 1),
        ]
        .into();
        assert_eq!(coordinator, want);
        let r = lag::compute(&shards, |_, _| Some(10), 0);
        let got: Vec<(&str, i64)> = r.topics.iter().map(|t| (t.group.as_str(), t.lag)).collect();
        assert_eq!(got, vec![("mine", 5), ("moved", 1), ("theirs", 5)]);
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
