//! The JSON documents behind the dashboard. Each is built from memory (the
//! telemetry registry, the applied assignment, the leaders' published log
//! views, the [`ClusterFiles`] snapshot) and is bounded: per-actor and
//! per-partition lists are paged; the cluster document carries per-broker
//! and per-topic aggregates, the topic list itself capped.

use super::{ClusterFiles, Query};
use crate::state::Broker;
use kaas_actors::telemetry::{self, supervisor_of};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A mailbox this deep is highlighted as backing up.
pub const BACKLOG: i64 = 32;
/// Highlighted actors listed at most.
const MAX_HIGHLIGHTED: usize = 100;
/// Topics listed in `/api/cluster` at most (the rest are counted).
const MAX_TOPICS: usize = 200;

/// `/api/actors?kind=&offset=&limit=`: per-kind totals, the highlighted
/// actors (restarted, failed or fenced, backing up) and one page of rows.
pub fn actors(broker: &Broker, q: &Query) -> Result<Value, String> {
    let (offset, limit) = q.page(200)?;
    let kind = q.get("kind").filter(|k| !k.is_empty());
    let t = telemetry::global();
    let live = t.live();
    let mut highlighted = Vec::new();
    let mut rate_by_kind: BTreeMap<&str, f64> = BTreeMap::new();
    let mut matching = Vec::new();
    for a in &live {
        let row = a.info();
        *rate_by_kind.entry(a.kind).or_default() += row.messages_per_sec;
        let hot = row.restarts > 0 || row.last_error.is_some() || row.mailbox_depth >= BACKLOG;
        if hot && highlighted.len() < MAX_HIGHLIGHTED {
            let why: Vec<&str> = [
                (row.restarts > 0, "restarted"),
                (
                    row.last_error.as_deref().is_some_and(|e| {
                        e.contains("epoch") || e.contains("lease") || e.contains("not leader")
                    }),
                    "fenced",
                ),
                (row.last_error.is_some(), "error"),
                (row.mailbox_depth >= BACKLOG, "backlog"),
            ]
            .into_iter()
            .filter_map(|(c, w)| c.then_some(w))
            .collect();
            highlighted.push(json!({"why": why, "actor": row}));
        }
        if kind.is_none_or(|k| k == a.kind) {
            matching.push(a);
        }
    }
    let total = matching.len();
    // Coordinators carry their groups' consumer lag.
    let lag = super::lag::by_coordinator(&super::lag::report(broker));
    let rows: Vec<Value> = matching
        .into_iter()
        .skip(offset)
        .take(limit)
        .map(|a| {
            let mut v = json!(a.info());
            if a.kind == "group_coordinator" {
                v["consumer_lag"] = lag
                    .get(&a.id)
                    .cloned()
                    .unwrap_or_else(|| json!({"topics": [], "total": 0, "staleness_ms": 0}));
            }
            v
        })
        .collect();
    let kinds: Vec<Value> = t
        .kinds()
        .into_iter()
        .map(|(k, n, depth, restarts)| {
            json!({
                "kind": k,
                "supervisor": supervisor_of(k),
                "live": n,
                "mailbox_depth": depth,
                "restarts": restarts,
                "messages_per_sec": rate_by_kind.get(k).copied().unwrap_or(0.0),
            })
        })
        .collect();
    Ok(json!({
        "broker_id": broker.shared.broker_id,
        "total": total,
        "offset": offset,
        "limit": limit,
        "kinds": kinds,
        "highlighted": highlighted,
        "actors": rows,
    }))
}

/// `/api/cluster`: brokers with liveness and lease age, the controller and
/// its epoch, the assignment summarised per broker and per topic (leader
/// epochs), coordinator shards.
pub fn cluster(broker: &Broker, files: &ClusterFiles, q: &Query) -> Result<Value, String> {
    let (offset, limit) = q.page(MAX_TOPICS)?;
    let a = broker.assignment();
    let (seen, controller, epochs, problems, read_ms_ago) = files.view();
    let mut led: BTreeMap<i32, (usize, usize)> = BTreeMap::new();
    let mut partitions_total = 0usize;
    let mut topics = Vec::new();
    for (i, (name, t)) in a.topics.iter().enumerate() {
        let mut by_leader: BTreeMap<i32, usize> = BTreeMap::new();
        let (mut lo, mut hi) = (i32::MAX, i32::MIN);
        for p in &t.partitions {
            *by_leader.entry(p.leader).or_default() += 1;
            led.entry(p.leader).or_default().0 += 1;
            lo = lo.min(p.epoch);
            hi = hi.max(p.epoch);
        }
        partitions_total += t.partitions.len();
        if i >= offset && topics.len() < limit {
            topics.push(json!({
                "name": name,
                "topic_id": t.topic_id,
                "partitions": t.partitions.len(),
                "leaders": by_leader,
                "min_epoch": if t.partitions.is_empty() { None } else { Some(lo) },
                "max_epoch": if t.partitions.is_empty() { None } else { Some(hi) },
            }));
        }
    }
    let coordinators: Vec<Value> = a
        .coordinators
        .iter()
        .enumerate()
        .map(|(s, c)| {
            led.entry(c.leader).or_default().1 += 1;
            json!({"shard": s, "leader": c.leader, "epoch": c.epoch, "incarnation": c.incarnation.to_string()})
        })
        .collect();
    let timing = broker.shared.timing;
    let brokers: Vec<Value> = seen
        .iter()
        .map(|b| {
            let (parts, shards) = led.get(&b.id).copied().unwrap_or_default();
            let r = b.record.as_ref();
            json!({
                "id": b.id,
                "host": r.map(|r| r.host.clone()),
                "port": r.map(|r| r.port),
                // A u64 as a decimal string: a JSON number loses its low
                // bits in JavaScript (…5000 for …500b); the logs and
                // `kaas inspect` print the same digits.
                "incarnation": r.map(|r| r.incarnation.to_string()),
                "seq": r.map(|r| r.seq),
                "alive": b.alive,
                "lease_age_ms": b.lease_age_ms,
                "lease_headroom_ms": (timing.lease.as_millis() as i64) - b.lease_age_ms as i64,
                "shutting_down": r.is_some_and(|r| r.shutting_down),
                "clean_exit": r.is_some_and(|r| r.clean_exit),
                "applied_version": r.map(|r| r.applied_version),
                "fenced": r.map(|r| r.fenced.len()).unwrap_or(0),
                "partitions_led": parts,
                "coordinators_led": shards,
                "is_controller": controller.as_ref().and_then(|c| c.get("broker_id").cloned()) == Some(json!(b.id)),
                "self": b.id == broker.shared.broker_id,
            })
        })
        .collect();
    Ok(json!({
        "broker_id": broker.shared.broker_id,
        "cluster_id": broker.cluster_id,
        "now_ms": kaas_actors::clock::wall_ms(),
        "files_read_ms_ago": read_ms_ago,
        "lease": {
            "length_ms": timing.lease.as_millis() as u64,
            "grace_ms": timing.grace.as_millis() as u64,
            "headroom_ms": broker.shared.lease.remaining().as_millis() as u64,
        },
        "controller": controller,
        "controller_epochs": epochs,
        "assignment": {
            "controller_epoch": a.controller_epoch,
            "controller_id": a.controller_id,
            "version": a.version,
            "topics_total": a.topics.len(),
            "partitions_total": partitions_total,
            "unassigned": led.get(&-1).map_or(0, |x| x.0),
            "offset": offset,
            "limit": limit,
            "topics": topics,
        },
        "brokers": brokers,
        "coordinators": coordinators,
        "problems": problems,
        // Every group in the cluster, with its coordinator: this broker's
        // and, while a page looks, its peers' (read over Kafka).
        "consumer_lag": super::lag::cluster_view(broker),
        // What changed since this broker's page was first looked at,
        // newest last, with its age: a lapse that is over, a dead broker,
        // a controller change.
        "events": files.events().into_iter().map(|e| json!({
            "age_ms": (kaas_actors::clock::wall_ms() - e.at_ms).max(0),
            "kind": e.kind,
            "broker": e.broker,
            "text": e.text,
        })).collect::<Vec<_>>(),
    }))
}

/// `/api/partitions?topic=&offset=&limit=&local=1`: one page of partitions
/// in (topic, index) order, each with its assignment entry and — if this
/// broker leads it — its log (start, high watermark, end, segments, bytes)
/// and its leader's rates.
pub fn partitions(broker: &Broker, q: &Query) -> Result<Value, String> {
    let (offset, limit) = q.page(50)?;
    let topic = q.get("topic").filter(|t| !t.is_empty());
    let local_only = matches!(q.get("local"), Some("1" | "true"));
    let me = broker.shared.broker_id;
    let a = broker.assignment();
    let mut total = 0usize;
    let mut rows = Vec::new();
    let now = std::time::Instant::now();
    let remote_hw = super::lag::RemoteHw::get();
    let mut remote_rows = Vec::new();
    for (name, t) in a.topics.iter() {
        if topic.is_some_and(|x| x != name) {
            continue;
        }
        for (i, p) in t.partitions.iter().enumerate() {
            if local_only && p.leader != me {
                continue;
            }
            total += 1;
            if total <= offset || rows.len() >= limit {
                continue;
            }
            let idx = i as i32;
            let local = broker.local_leader(name, idx).map(|h| {
                let row = h.addr.stats().info();
                let log = h.reader.read().unwrap().as_ref().map(|r| r.summary());
                json!({
                    "log_start_offset": log.map(|l| l.0),
                    "high_watermark": log.map(|l| l.1),
                    "end_offset": log.map(|l| l.2),
                    "segments": log.map(|l| l.3),
                    "bytes": log.map(|l| l.4),
                    "epoch": row.epoch,
                    "appends_per_sec": row.messages_per_sec,
                    "fsyncs_per_sec": row.fsyncs_per_sec,
                    "fsync_p99_ms": row.fsync_p99_ms,
                    "mailbox_depth": row.mailbox_depth,
                    "restarts": row.restarts,
                    "last_error": row.last_error,
                    "owns": row.owns,
                })
            });
            // Led elsewhere: its log start and high watermark as read from
            // its leader (asked from the next refresh on, while the page
            // lists it); the rest of its detail is on the leader's page.
            let remote = local.is_none().then(|| {
                remote_rows.push((name.clone(), idx));
                json!({
                    "log_start_offset": remote_hw.fresh_start(name, idx, now),
                    "high_watermark": remote_hw.fresh(name, idx, now),
                })
            });
            rows.push(json!({
                "topic": name,
                "partition": idx,
                "leader": p.leader,
                "epoch": p.epoch,
                "local": local,
                "remote": remote,
            }));
        }
    }
    if !remote_rows.is_empty() {
        remote_hw.want_page(remote_rows, now);
    }
    Ok(json!({
        "broker_id": me,
        "total": total,
        "offset": offset,
        "limit": limit,
        "partitions": rows,
    }))
}

/// The cluster as this broker's watcher last applied it, for `/metrics`:
/// live brokers, the controller, and partitions and coordinator shards
/// with no live leader (vacant, or granted to a broker the assignment no
/// longer lists as live). Every broker exports its own view; alert on
/// `max` over them.
pub fn cluster_prometheus(broker: &Broker) -> String {
    let a = broker.assignment();
    let live: std::collections::BTreeSet<i32> = a.brokers.iter().map(|b| b.id).collect();
    let leaderless =
        |it: &mut dyn Iterator<Item = &kaas_actors::cluster::records::PartitionAssignment>| {
            it.filter(|p| p.leader < 0 || !live.contains(&p.leader))
                .count()
        };
    let partitions = leaderless(&mut a.topics.values().flat_map(|t| t.partitions.iter()));
    let shards = leaderless(&mut a.coordinators.iter());
    format!(
        "# HELP kaas_cluster_brokers_live Brokers the applied assignment lists as live.\n# TYPE kaas_cluster_brokers_live gauge\nkaas_cluster_brokers_live {}\n\
         # HELP kaas_cluster_controller_id Broker id of the controller that wrote the applied assignment.\n# TYPE kaas_cluster_controller_id gauge\nkaas_cluster_controller_id {}\n\
         # HELP kaas_cluster_controller_epoch Epoch of the controller that wrote the applied assignment.\n# TYPE kaas_cluster_controller_epoch gauge\nkaas_cluster_controller_epoch {}\n\
         # HELP kaas_cluster_assignment_version Version of the assignment this broker applied.\n# TYPE kaas_cluster_assignment_version gauge\nkaas_cluster_assignment_version {}\n\
         # HELP kaas_cluster_partitions_leaderless Partitions with no live leader in the applied assignment.\n# TYPE kaas_cluster_partitions_leaderless gauge\nkaas_cluster_partitions_leaderless {partitions}\n\
         # HELP kaas_cluster_shards_leaderless Coordinator shards with no live leader in the applied assignment.\n# TYPE kaas_cluster_shards_leaderless gauge\nkaas_cluster_shards_leaderless {shards}\n",
        live.len(),
        a.controller_id,
        a.controller_epoch,
        a.version,
    )
}
