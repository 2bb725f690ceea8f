//! Actor telemetry: mailbox depth, messages handled by type, queue wait and
//! handling-time histograms, restarts. Prometheus labels are the actor kind
//! and the message type only — never a partition (cardinality rule); the
//! per-actor detail (file owned, epoch, depth) is kept in [`Telemetry::actors`]
//! for the JSON endpoint behind the dashboard.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

pub mod mailbox;
pub mod rates;
pub use mailbox::{ActorStats, Mailbox, MessageName, Owed, Traced};

/// Upper bounds (seconds) of the latency histogram buckets.
pub const BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
    5.0,
];

/// A fixed-bucket histogram of durations.
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    /// Record one observation.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// The per-bucket counts (not cumulative; the last is above every bound).
    pub fn snapshot(&self) -> [u64; BUCKETS.len() + 1] {
        std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed))
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        // Unlabelled series have no leading comma.
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cum = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cum += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cum}");
        }
        cum += self.counts[BUCKETS.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cum}");
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let (open, close) = if labels.is_empty() {
            ("", "")
        } else {
            ("{", "}")
        };
        let _ = writeln!(out, "{name}_sum{open}{labels}{close} {sum}");
        let _ = writeln!(out, "{name}_count{open}{labels}{close} {cum}");
    }
}

/// Per (actor kind, message type) counters.
#[derive(Default)]
pub struct MessageStats {
    /// Messages handled.
    pub handled: AtomicU64,
    /// Time from send to the start of handling.
    pub queue_wait: Histogram,
    /// Time spent in the handler.
    pub handling: Histogram,
}

/// Per actor-kind state.
#[derive(Default)]
pub struct KindStats {
    /// Messages sent but not yet handled, over all actors of the kind.
    pub mailbox_depth: AtomicI64,
    /// Supervisor restarts.
    pub restarts: AtomicU64,
    /// Errors recorded by actors of the kind (a new `last_error`).
    pub errors: AtomicU64,
    /// Live actors of this kind.
    pub live: AtomicI64,
    messages: Mutex<BTreeMap<&'static str, Arc<MessageStats>>>,
}

impl KindStats {
    /// Stats for one message type (created on first use).
    pub fn message(&self, msg: &'static str) -> Arc<MessageStats> {
        self.messages
            .lock()
            .unwrap()
            .entry(msg)
            .or_default()
            .clone()
    }
}

/// What the dashboard shows for one actor (see [`mailbox::ActorStats`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActorRow {
    /// Actor kind, e.g. `partition_leader`.
    pub kind: &'static str,
    /// Identity within the kind, e.g. `orders-3`.
    pub id: String,
    /// Who restarts it when it stops (see [`supervisor_of`]).
    pub supervisor: &'static str,
    /// Messages handled per second over the last sampling interval.
    pub messages_per_sec: f64,
    /// Median handling time over the last interval (ms; 0 if idle).
    pub handle_p50_ms: f64,
    /// 99th percentile handling time over the last interval (ms).
    pub handle_p99_ms: f64,
    /// fsyncs of the files it owns.
    pub fsyncs: u64,
    /// fsyncs per second over the last interval.
    pub fsyncs_per_sec: f64,
    /// 99th percentile fsync latency over the last interval (ms).
    pub fsync_p99_ms: f64,
    /// The file (or directory) it owns.
    pub owns: String,
    /// Epoch it writes under (-1: none).
    pub epoch: i64,
    /// Restarts of this actor.
    pub restarts: u64,
    /// Messages handled by this actor.
    pub handled: u64,
    /// Messages enqueued and not yet handled.
    pub mailbox_depth: i64,
    /// The last error, while it is not recovered from.
    pub last_error: Option<String>,
}

/// Who restarts an actor of `kind`: the dashboard's actor tree hangs each
/// kind under it. Partition leaders and coordinators are actix
/// `Supervisor`s started by grant through the `OwnerRegistry`; the cluster
/// actors run on their own arbiters and are not restarted.
pub fn supervisor_of(kind: &str) -> &'static str {
    match kind {
        "partition_leader" | "group_coordinator" => "owner_registry",
        "membership" | "assignment_watcher" | "controller" => "broker (own arbiter)",
        "topic_catalog" | "producer_id_blocks" => "broker",
        _ => "broker",
    }
}

/// Process-wide registry.
#[derive(Default)]
pub struct Telemetry {
    kinds: Mutex<BTreeMap<&'static str, Arc<KindStats>>>,
    /// Live actors, by (kind, id).
    live: Mutex<BTreeMap<(&'static str, String), Arc<ActorStats>>>,
    /// fsync calls that completed.
    pub fsyncs: AtomicU64,
    /// Bytes appended to partition logs.
    pub produce_bytes: AtomicU64,
    /// Bytes served by fetches.
    pub fetch_bytes: AtomicU64,
    /// Appends refused because the data volume is full or below its
    /// reserve (KAFKA_STORAGE_ERROR; the partition stays up).
    pub no_space_refusals: AtomicU64,
    /// Open client connections.
    pub connections: AtomicI64,
    /// Latency of every completed fsync of a partition or shard file.
    pub fsync_seconds: Histogram,
    /// Produce requests answered: from the frame read off the socket to
    /// the answer written to it (the broker's share of a produce's
    /// latency; the client's queueing and the network are outside it).
    pub produce_seconds: Histogram,
    /// This broker's lease headroom (ms left before it lapses; negative or
    /// 0 once lapsed), refreshed by the sampler.
    pub lease_headroom_ms: AtomicI64,
    /// Duration of each heartbeat write (the record rewrite that renews
    /// the lease): what the lease must out-last under load.
    pub heartbeat_seconds: Histogram,
    /// Heartbeats that completed after the lease had already ended, or
    /// failed: each one lapsed (or risked) this broker's membership.
    pub heartbeat_failures: AtomicU64,
    /// Heartbeats that renewed the lease with less than a third of it left
    /// (`cluster::membership::LATE_BEAT_FRACTION`): the warning before a lapse.
    pub heartbeat_late: AtomicU64,
    /// Lease lapses of this process (each one drops every leadership and
    /// rejoins as a new incarnation), however the lapse came about: a
    /// frozen process fails no heartbeat, it wakes with its lease gone.
    pub lease_lapses: AtomicU64,
    /// The last minutes, for the dashboard's sparklines.
    pub series: rates::Series,
}

/// The process-wide telemetry registry.
pub fn global() -> &'static Telemetry {
    static T: OnceLock<Telemetry> = OnceLock::new();
    T.get_or_init(Telemetry::default)
}

impl Telemetry {
    /// Stats of one actor kind (created on first use).
    pub fn kind(&self, kind: &'static str) -> Arc<KindStats> {
        self.kinds.lock().unwrap().entry(kind).or_default().clone()
    }

    /// Snapshot of per-actor rows.
    pub fn actors(&self) -> BTreeMap<String, ActorRow> {
        self.live
            .lock()
            .unwrap()
            .iter()
            .map(|((kind, id), s)| (format!("{kind}/{id}"), s.info()))
            .collect()
    }

    /// The live actors' stats (a snapshot of the registry).
    pub fn live(&self) -> Vec<Arc<ActorStats>> {
        self.live.lock().unwrap().values().cloned().collect()
    }

    /// Per-kind totals: (kind, live actors, mailbox depth, restarts).
    pub fn kinds(&self) -> Vec<(&'static str, i64, i64, u64)> {
        self.kinds
            .lock()
            .unwrap()
            .iter()
            .map(|(k, s)| {
                (
                    *k,
                    s.live.load(Ordering::Relaxed),
                    s.mailbox_depth.load(Ordering::Relaxed).max(0),
                    s.restarts.load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    fn register_actor(&self, s: Arc<ActorStats>) {
        self.live.lock().unwrap().insert((s.kind, s.id.clone()), s);
    }

    /// Remove `s` if it is still the registered row of its (kind, id).
    fn deregister_actor(&self, s: &Arc<ActorStats>) -> bool {
        let mut live = self.live.lock().unwrap();
        let key = (s.kind, s.id.clone());
        if live.get(&key).is_some_and(|x| Arc::ptr_eq(x, s)) {
            live.remove(&key);
            true
        } else {
            false
        }
    }

    /// Prometheus text exposition.
    pub fn render_prometheus(&self) -> String {
        let mut out = String::new();
        let kinds: Vec<_> = self
            .kinds
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let _ = writeln!(
            out,
            "# HELP kaas_build_info The broker's version (always 1).\n# TYPE kaas_build_info gauge\nkaas_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        out.push_str("# HELP kaas_actor_mailbox_depth Messages waiting in the mailboxes of one actor kind.\n# TYPE kaas_actor_mailbox_depth gauge\n");
        for (k, s) in &kinds {
            let d = s.mailbox_depth.load(Ordering::Relaxed).max(0);
            let _ = writeln!(out, "kaas_actor_mailbox_depth{{kind=\"{k}\"}} {d}");
        }
        out.push_str("# HELP kaas_actors Live actors of one kind.\n# TYPE kaas_actors gauge\n");
        for (k, s) in &kinds {
            let _ = writeln!(
                out,
                "kaas_actors{{kind=\"{k}\"}} {}",
                s.live.load(Ordering::Relaxed)
            );
        }
        out.push_str("# HELP kaas_actor_restarts_total Supervisor restarts of actors of one kind (a failed open or write re-driven).\n# TYPE kaas_actor_restarts_total counter\n");
        for (k, s) in &kinds {
            let _ = writeln!(
                out,
                "kaas_actor_restarts_total{{kind=\"{k}\"}} {}",
                s.restarts.load(Ordering::Relaxed)
            );
        }
        out.push_str("# HELP kaas_actor_errors_total Errors recorded by actors (a new last error).\n# TYPE kaas_actor_errors_total counter\n");
        for (k, s) in &kinds {
            let _ = writeln!(
                out,
                "kaas_actor_errors_total{{kind=\"{k}\"}} {}",
                s.errors.load(Ordering::Relaxed)
            );
        }
        out.push_str("# HELP kaas_actor_messages_total Messages handled, by actor kind and message.\n# TYPE kaas_actor_messages_total counter\n");
        for (k, s) in &kinds {
            for (m, st) in s.messages.lock().unwrap().iter() {
                let _ = writeln!(
                    out,
                    "kaas_actor_messages_total{{kind=\"{k}\",message=\"{m}\"}} {}",
                    st.handled.load(Ordering::Relaxed)
                );
            }
        }
        out.push_str("# HELP kaas_actor_handle_seconds Time an actor spent handling one message.\n# TYPE kaas_actor_handle_seconds histogram\n");
        for (k, s) in &kinds {
            for (m, st) in s.messages.lock().unwrap().iter() {
                st.handling.render(
                    &mut out,
                    "kaas_actor_handle_seconds",
                    &format!("kind=\"{k}\",message=\"{m}\""),
                );
            }
        }
        out.push_str("# HELP kaas_actor_queue_wait_seconds Time a message waited in its actor's mailbox.\n# TYPE kaas_actor_queue_wait_seconds histogram\n");
        for (k, s) in &kinds {
            for (m, st) in s.messages.lock().unwrap().iter() {
                st.queue_wait.render(
                    &mut out,
                    "kaas_actor_queue_wait_seconds",
                    &format!("kind=\"{k}\",message=\"{m}\""),
                );
            }
        }
        let counters = [
            (
                "kaas_fsyncs_total",
                "Partition and shard fsyncs.",
                self.fsyncs.load(Ordering::Relaxed),
            ),
            (
                "kaas_produce_bytes_total",
                "Record bytes appended by produce.",
                self.produce_bytes.load(Ordering::Relaxed),
            ),
            (
                "kaas_fetch_bytes_total",
                "Record bytes answered to fetches.",
                self.fetch_bytes.load(Ordering::Relaxed),
            ),
            (
                "kaas_produce_refused_no_space_total",
                "Appends refused with KAFKA_STORAGE_ERROR because the data volume was full.",
                self.no_space_refusals.load(Ordering::Relaxed),
            ),
            (
                "kaas_lease_lapses_total",
                "Times this process's lease lapsed: every leadership dropped, rejoined as a new incarnation.",
                self.lease_lapses.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP kaas_connections Open Kafka client connections.\n# TYPE kaas_connections gauge\nkaas_connections {}",
            self.connections.load(Ordering::Relaxed)
        );
        out.push_str("# HELP kaas_fsync_seconds Latency of partition and shard fsyncs.\n# TYPE kaas_fsync_seconds histogram\n");
        self.fsync_seconds
            .render(&mut out, "kaas_fsync_seconds", "");
        out.push_str("# HELP kaas_produce_seconds Produce requests, frame read to answer written.\n# TYPE kaas_produce_seconds histogram\n");
        self.produce_seconds
            .render(&mut out, "kaas_produce_seconds", "");
        out.push_str("# HELP kaas_heartbeat_seconds Duration of each heartbeat write (the lease renewal).\n# TYPE kaas_heartbeat_seconds histogram\n");
        self.heartbeat_seconds
            .render(&mut out, "kaas_heartbeat_seconds", "");
        let _ = writeln!(
            out,
            "# HELP kaas_heartbeat_failures_total Heartbeats that failed or completed after the lease ended.\n# TYPE kaas_heartbeat_failures_total counter\nkaas_heartbeat_failures_total {}",
            self.heartbeat_failures.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP kaas_heartbeat_late_total Heartbeats that renewed the lease with less than a third of it left.\n# TYPE kaas_heartbeat_late_total counter\nkaas_heartbeat_late_total {}",
            self.heartbeat_late.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP kaas_lease_headroom_seconds Time left before this broker's lease lapses.\n# TYPE kaas_lease_headroom_seconds gauge\nkaas_lease_headroom_seconds {}",
            self.lease_headroom_ms.load(Ordering::Relaxed) as f64 / 1000.0
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_histograms_and_depth_by_kind_and_message() {
        let t = Telemetry::default();
        let k = t.kind("partition_leader");
        let m = k.message("append_batches");
        m.handled.fetch_add(1, Ordering::Relaxed);
        m.handling.observe(Duration::from_micros(300));
        let text = t.render_prometheus();
        assert!(text.contains("kaas_actor_mailbox_depth{kind=\"partition_leader\"} 0"));
        assert!(text.contains(
            "kaas_actor_messages_total{kind=\"partition_leader\",message=\"append_batches\"} 1"
        ));
        assert!(text.contains("kaas_actor_handle_seconds_bucket{kind=\"partition_leader\",message=\"append_batches\",le=\"0.0005\"} 1"));
        assert!(text.contains("kaas_actor_handle_seconds_count{kind=\"partition_leader\",message=\"append_batches\"} 1"));
    }
}
