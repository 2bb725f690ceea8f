//! Consumer lag as this broker sees it: the committed offsets its
//! coordinators published (`kaas_actors::group::lag`) against the high
//! watermarks its own partition leaders publish. Nothing here waits on an
//! actor or a file: both are reads of published memory, so a scrape never
//! delays the coordinators or the data path.
//!
//! A partition led by another broker has no high watermark here and is
//! counted as unknown (`kaas_consumer_lag_unknown_partitions`): in a
//! cluster, a group's lag is complete on the broker that coordinates it for
//! the partitions that broker also leads.

use crate::state::Broker;
use kaas_actors::group::lag::{self, LagReport};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Groups listed per coordinator in `/api/actors` at most.
const MAX_GROUPS_PER_SHARD: usize = 20;
/// Partitions listed per (group, topic) in `/api/actors` at most.
const MAX_PARTITIONS: usize = 64;

/// The lag of every group coordinated here.
pub fn report(b: &Broker) -> LagReport {
    let hw = |topic: &str, partition: i32| {
        let h = b.local_leader(topic, partition)?;
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
