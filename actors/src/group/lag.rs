//! Consumer lag: a group's committed offset against the partition's high
//! watermark, so on-call needs no separate lag exporter.
//!
//! Two halves that never wait on each other:
//!
//! * Each serving [`GroupCoordinator`](super::coordinator::GroupCoordinator)
//!   publishes a copy of its shard's committed offsets to the process-wide
//!   [`board`] — from a timer, at most once per [`PUBLISH_EVERY`] and only
//!   when its durable state moved, so the copy (O(live offsets)) never runs
//!   per commit and never touches a file.
//! * Whoever renders (`/metrics`, `/api/actors`) reads the board and the
//!   high watermarks it can see without waiting (a lookup closure: the
//!   broker passes its local partition leaders' published high watermarks)
//!   and computes the lag with [`compute`], a pure function.
//!
//! Staleness: a committed offset is at most [`PUBLISH_EVERY`] old (plus one
//! group-commit fsync); high watermarks are read live. A partition whose
//! high watermark is not known here (led by another broker) is counted as
//! unknown, not guessed.
//!
//! Cardinality: [`render_prometheus`] exports at most `max_groups` groups
//! (those with the largest lag) per (group, topic), and per-partition series
//! only up to `max_partition_series`, largest lag first; what is left out
//! is counted in `kaas_consumer_lag_groups_omitted`.

use super::offsets::ShardState;
use super::shard::ShardId;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How often a coordinator republishes its committed offsets (when they
/// changed): the staleness bound of a committed offset in the lag.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// One committed offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The committed offset (the next record the group will read).
    pub offset: i64,
}

/// What one coordinator published.
#[derive(Debug, Clone, Default)]
pub struct ShardOffsets {
    /// The epoch the coordinator owns the shard under.
    pub epoch: i32,
    /// The durable ticket the copy was taken at (republish only on change).
    pub ticket: u64,
    /// Wall clock (ms) of the copy.
    pub published_ms: i64,
    /// The committed offsets, in (group, topic, partition) order.
    pub offsets: Vec<Committed>,
}

impl ShardOffsets {
    /// A copy of `state`'s committed offsets.
    pub fn from_state(state: &ShardState, epoch: i32, ticket: u64, now_ms: i64) -> Self {
        Self {
            epoch,
            ticket,
            published_ms: now_ms,
            offsets: state
                .offsets
                .iter()
                .map(|(k, v)| Committed {
                    group: k.group.clone(),
                    topic: k.topic.clone(),
                    partition: k.partition,
                    offset: v.offset,
                })
                .collect(),
        }
    }
}

/// The published committed offsets of every shard this process owns.
#[derive(Debug, Default)]
pub struct Board {
    shards: Mutex<BTreeMap<ShardId, Arc<ShardOffsets>>>,
}

/// The process-wide board.
pub fn board() -> &'static Board {
    static B: OnceLock<Board> = OnceLock::new();
    B.get_or_init(Board::default)
}

impl Board {
    /// The ticket of `shard`'s copy under `epoch`, if one is published.
    pub fn ticket(&self, shard: ShardId, epoch: i32) -> Option<u64> {
        let s = self.shards.lock().unwrap();
        s.get(&shard).filter(|o| o.epoch == epoch).map(|o| o.ticket)
    }

    /// Replace `shard`'s copy.
    pub fn publish(&self, shard: ShardId, offsets: ShardOffsets) {
        self.shards.lock().unwrap().insert(shard, Arc::new(offsets));
    }

    /// Forget `shard`'s copy if it is the one published under `epoch` (a
    /// newer owner's copy in this process stays).
    pub fn remove(&self, shard: ShardId, epoch: i32) {
        let mut s = self.shards.lock().unwrap();
        if s.get(&shard).is_some_and(|o| o.epoch == epoch) {
            s.remove(&shard);
        }
    }

    /// Every published copy.
    pub fn snapshot(&self) -> Vec<(ShardId, Arc<ShardOffsets>)> {
        let s = self.shards.lock().unwrap();
        s.iter().map(|(k, v)| (*k, v.clone())).collect()
    }
}

/// One partition's lag.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionLag {
    /// The partition.
    pub partition: i32,
    /// The committed offset.
    pub committed: i64,
    /// The high watermark.
    pub high_watermark: i64,
    /// `high_watermark - committed`, never below 0.
    pub lag: i64,
}

/// A group's lag on one topic: the partitions whose high watermark is known.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TopicLag {
    /// The group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The coordinator shard of the group.
    pub shard: u32,
    /// Sum of the partitions' lags.
    pub lag: i64,
    /// Per partition, in partition order.
    pub partitions: Vec<PartitionLag>,
    /// Committed partitions whose high watermark is not known here.
    pub unknown: usize,
}

/// The lag of everything published, for rendering.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LagReport {
    /// Per (group, topic), in (group, topic) order.
    pub topics: Vec<TopicLag>,
    /// Oldest copy's age (ms): the committed offsets' staleness.
    pub oldest_ms: i64,
}

impl LagReport {
    /// Each group's total lag, largest first (ties by name).
    pub fn groups_by_lag(&self) -> Vec<(&str, i64)> {
        let mut m: BTreeMap<&str, i64> = BTreeMap::new();
        for t in &self.topics {
            let e = m.entry(t.group.as_str()).or_default();
            *e = e.saturating_add(t.lag);
        }
        let mut v: Vec<(&str, i64)> = m.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v
    }
}

/// The lag of the published `shards`, with the high watermark of
/// (topic, partition) from `hw` (`None`: not known here).
pub fn compute(
    shards: &[(ShardId, Arc<ShardOffsets>)],
    hw: impl Fn(&str, i32) -> Option<i64>,
    now_ms: i64,
) -> LagReport {
    let mut topics: Vec<TopicLag> = Vec::new();
    let mut oldest_ms = 0i64;
    for (shard, copy) in shards {
        oldest_ms = oldest_ms.max(now_ms.saturating_sub(copy.published_ms));
        for c in &copy.offsets {
            let fresh = topics
                .last()
                .is_none_or(|t| t.group != c.group || t.topic != c.topic || t.shard != shard.0);
            if fresh {
                topics.push(TopicLag {
                    group: c.group.clone(),
                    topic: c.topic.clone(),
                    shard: shard.0,
                    lag: 0,
                    partitions: Vec::new(),
                    unknown: 0,
                });
            }
            let Some(t) = topics.last_mut() else { continue };
            match hw(&c.topic, c.partition) {
                Some(h) => {
                    // A committed offset past the end (a truncated or
                    // recreated topic) is no lag, not a negative one.
                    let lag = h.saturating_sub(c.offset).max(0);
                    t.lag = t.lag.saturating_add(lag);
                    t.partitions.push(PartitionLag {
                        partition: c.partition,
                        committed: c.offset,
                        high_watermark: h,
                        lag,
                    });
                }
                None => t.unknown += 1,
            }
        }
    }
    topics.sort_by(|a, b| (&a.group, &a.topic).cmp(&(&b.group, &b.topic)));
    LagReport { topics, oldest_ms }
}

/// Prometheus label value escaping (backslash, quote, newline).
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The lag series, bounded: the `max_groups` groups with the largest lag
/// per (group, topic), and of those at most `max_partition_series`
/// per-partition series, largest lag first.
pub fn render_prometheus(r: &LagReport, max_groups: usize, max_partition_series: usize) -> String {
    let mut out = String::new();
    let groups = r.groups_by_lag();
    let kept: std::collections::BTreeSet<&str> =
        groups.iter().take(max_groups).map(|g| g.0).collect();
    out.push_str("# HELP kaas_consumer_group_lag Records between a group's committed offset and the high watermark, summed over a topic's partitions whose high watermark this broker knows.\n# TYPE kaas_consumer_group_lag gauge\n");
    for t in r.topics.iter().filter(|t| kept.contains(t.group.as_str())) {
        let _ = writeln!(
            out,
            "kaas_consumer_group_lag{{group=\"{}\",topic=\"{}\"}} {}",
            esc(&t.group),
            esc(&t.topic),
            t.lag
        );
    }
    let mut parts: Vec<(&TopicLag, &PartitionLag)> = r
        .topics
        .iter()
        .filter(|t| kept.contains(t.group.as_str()))
        .flat_map(|t| t.partitions.iter().map(move |p| (t, p)))
        .collect();
    parts.sort_by(|a, b| {
        b.1.lag
            .cmp(&a.1.lag)
            .then((&a.0.group, &a.0.topic, a.1.partition).cmp(&(
                &b.0.group,
                &b.0.topic,
                b.1.partition,
            )))
    });
    parts.truncate(max_partition_series);
    out.push_str("# HELP kaas_consumer_group_partition_lag Records between a group's committed offset and a partition's high watermark (largest lags only, see kaas_consumer_lag_partition_series_max).\n# TYPE kaas_consumer_group_partition_lag gauge\n");
    for (t, p) in parts {
        let _ = writeln!(
            out,
            "kaas_consumer_group_partition_lag{{group=\"{}\",topic=\"{}\",partition=\"{}\"}} {}",
            esc(&t.group),
            esc(&t.topic),
            p.partition,
            p.lag
        );
    }
    let unknown: usize = r.topics.iter().map(|t| t.unknown).sum();
    let _ = writeln!(
        out,
        "# HELP kaas_consumer_lag_groups_omitted Groups with committed offsets not exported (beyond the largest kaas_consumer_lag_groups_max).\n# TYPE kaas_consumer_lag_groups_omitted gauge\nkaas_consumer_lag_groups_omitted {}",
        groups.len().saturating_sub(kept.len())
    );
    let _ = writeln!(
        out,
        "# HELP kaas_consumer_lag_groups_max Groups whose lag is exported, at most (the largest first).\n# TYPE kaas_consumer_lag_groups_max gauge\nkaas_consumer_lag_groups_max {max_groups}\n# HELP kaas_consumer_lag_partition_series_max Per-partition lag series exported, at most (the largest first).\n# TYPE kaas_consumer_lag_partition_series_max gauge\nkaas_consumer_lag_partition_series_max {max_partition_series}"
    );
    let _ = writeln!(
        out,
        "# HELP kaas_consumer_lag_unknown_partitions Committed partitions whose high watermark this broker does not know (led elsewhere).\n# TYPE kaas_consumer_lag_unknown_partitions gauge\nkaas_consumer_lag_unknown_partitions {unknown}"
    );
    let _ = writeln!(
        out,
        "# HELP kaas_consumer_lag_staleness_seconds Age of the oldest published copy of committed offsets.\n# TYPE kaas_consumer_lag_staleness_seconds gauge\nkaas_consumer_lag_staleness_seconds {}",
        r.oldest_ms as f64 / 1000.0
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(epoch: i32, offsets: &[(&str, &str, i32, i64)]) -> ShardOffsets {
        ShardOffsets {
            epoch,
            ticket: 1,
            published_ms: 1_000,
            offsets: offsets
                .iter()
                .map(|(g, t, p, o)| Committed {
                    group: (*g).into(),
                    topic: (*t).into(),
                    partition: *p,
                    offset: *o,
                })
                .collect(),
        }
    }

    fn hw(t: &str, p: i32) -> Option<i64> {
        match (t, p) {
            ("a", 0) => Some(100),
            ("a", 1) => Some(50),
            ("b", 0) => Some(10),
            _ => None,
        }
    }

    #[test]
    fn lag_is_high_watermark_minus_committed_summed_per_topic() {
        let shards = vec![
            (
                ShardId(0),
                Arc::new(copy(
                    1,
                    &[("g1", "a", 0, 90), ("g1", "a", 1, 50), ("g1", "c", 0, 3)],
                )),
            ),
            (ShardId(1), Arc::new(copy(1, &[("g2", "b", 0, 20)]))),
        ];
        let r = compute(&shards, hw, 3_500);
        assert_eq!(r.oldest_ms, 2_500);
        let ga = &r.topics[0];
        assert_eq!(
            (ga.group.as_str(), ga.topic.as_str(), ga.lag),
            ("g1", "a", 10)
        );
        assert_eq!(ga.partitions.len(), 2);
        // Led elsewhere: unknown, not zero.
        let gc = &r.topics[1];
        assert_eq!(
            (gc.topic.as_str(), gc.unknown, gc.partitions.len()),
            ("c", 1, 0)
        );
        // Committed past the end: no negative lag.
        assert_eq!(r.topics[2].lag, 0);
        assert_eq!(r.groups_by_lag(), vec![("g1", 10), ("g2", 0)]);
    }

    #[test]
    fn rendering_is_bounded_to_the_largest_groups_and_partitions() {
        let shards = vec![(
            ShardId(0),
            Arc::new(copy(
                1,
                &[
                    ("small", "a", 0, 99),
                    ("big", "a", 0, 0),
                    ("big", "a", 1, 0),
                    ("zero", "b", 0, 10),
                ],
            )),
        )];
        let r = compute(&shards, hw, 1_000);
        let text = render_prometheus(&r, 2, 2);
        assert!(text.contains("kaas_consumer_group_lag{group=\"big\",topic=\"a\"} 150"));
        assert!(text.contains("kaas_consumer_group_lag{group=\"small\",topic=\"a\"} 1"));
        assert!(!text.contains("group=\"zero\""), "beyond the group bound");
        assert!(text.contains("kaas_consumer_lag_groups_omitted 1"));
        assert!(text.contains(
            "kaas_consumer_group_partition_lag{group=\"big\",topic=\"a\",partition=\"0\"} 100"
        ));
        assert!(text.contains(
            "kaas_consumer_group_partition_lag{group=\"big\",topic=\"a\",partition=\"1\"} 50"
        ));
        assert!(!text.contains("kaas_consumer_group_partition_lag{group=\"small\""));
        assert_eq!(
            text.matches("kaas_consumer_group_partition_lag{").count(),
            2
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn board_forgets_only_its_own_epoch() {
        let b = Board::default();
        b.publish(ShardId(3), copy(2, &[]));
        assert_eq!(b.ticket(ShardId(3), 2), Some(1));
        assert_eq!(b.ticket(ShardId(3), 1), None);
        b.remove(ShardId(3), 1);
        assert_eq!(b.snapshot().len(), 1);
        b.remove(ShardId(3), 2);
        assert!(b.snapshot().is_empty());
    }
}
