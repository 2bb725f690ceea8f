//! Declared bounds on what one request may make the broker do: partitions
//! per CreateTopics request, per broker and in the whole cluster, the rate
//! of partition mutations (KIP-599), topics auto-created per Metadata
//! request and per second, and the helper that logs a repeated condition
//! once per interval with a count.
//!
//! Why bounds at all: every partition costs the broker files, timers and a
//! share of the assignment the controller rewrites, so a single request for
//! 100,000 partitions (or a Metadata request naming 10,000 unknown topics)
//! used to take the broker down for everyone. The checks here are plain
//! logic over numbers the handlers pass in (no actix, no files), so they are
//! unit-tested with a fake clock; `api/error.rs` maps [`LimitError`] to the
//! Kafka codes.

use crate::config::BrokerArgs;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A request refused by a declared bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// POLICY_VIOLATION (44): one request asks for too many partitions.
    #[error("the request asks for {asked} partitions in total; at most {max} per request are allowed (--max-partitions-per-request)")]
    PartitionsPerRequest {
        /// Partitions of the request so far, this topic included.
        asked: i64,
        /// The bound.
        max: i64,
    },
    /// POLICY_VIOLATION (44): the cluster would hold too many partitions.
    #[error("the cluster has {existing} partitions; {asked} more would exceed the limit of {max} (--max-partitions)")]
    ClusterPartitions {
        /// Partitions the cluster holds (as this broker knows it).
        existing: i64,
        /// Partitions of this topic.
        asked: i64,
        /// The bound.
        max: i64,
    },
    /// POLICY_VIOLATION (44): the brokers would lead too many partitions
    /// each (KIP-578's `max.broker.partitions`; Kafka has no code of its
    /// own for it, and refuses a too large operation with POLICY_VIOLATION).
    #[error("the cluster has {existing} partitions; {asked} more would exceed {brokers} broker(s) × {per_broker} partitions per broker (--max-partitions-per-broker)")]
    BrokerPartitions {
        /// Partitions the cluster holds (as this broker knows it).
        existing: i64,
        /// Partitions of this topic.
        asked: i64,
        /// Live brokers (at least one).
        brokers: i64,
        /// The bound per broker.
        per_broker: i64,
    },
    /// THROTTLING_QUOTA_EXCEEDED (89, retriable): the partition mutation
    /// rate (KIP-599) is spent; the client may retry after the throttle.
    #[error("the partition mutation rate is exceeded (--controller-mutation-rate); retry after {throttle_ms} ms")]
    Throttled {
        /// How long until the quota has credit again.
        throttle_ms: i32,
    },
    /// LEADER_NOT_AVAILABLE (5, retriable): the topic was not auto-created
    /// by this request (too many in one request, or the per-broker rate is
    /// spent); a client retrying later gets it created.
    #[error("auto-creation deferred: {0}")]
    AutoCreateDeferred(&'static str),
}

/// Partition accounting for one CreateTopics request (or one Metadata
/// request's auto-creations).
///
/// The cluster-wide count is this broker's view of the assignment plus what
/// this request created; concurrent creates through other brokers are not
/// seen, so the cap can be overshot by at most one request per broker — a
/// soft bound, which is what it needs to be (it protects resources, not an
/// invariant).
#[derive(Debug, Clone)]
pub struct PartitionBudget {
    per_request: i64,
    cluster: i64,
    /// (live brokers, partitions per broker).
    per_broker: Option<(i64, i64)>,
    existing: i64,
    requested: i64,
}

impl PartitionBudget {
    /// A budget for one request; `existing` is the cluster's partition
    /// count, `brokers` how many brokers are live (at least one counts).
    pub fn new(args: &BrokerArgs, existing: i64, brokers: usize) -> Self {
        let mut b = Self::with_limits(
            args.max_partitions_per_request,
            args.max_partitions,
            existing,
        );
        if let Some(per_broker) = args.max_partitions_per_broker {
            b.per_broker = Some(((brokers as i64).max(1), per_broker));
        }
        b
    }

    /// A budget with explicit limits (no per-broker bound).
    pub fn with_limits(per_request: i64, cluster: i64, existing: i64) -> Self {
        Self {
            per_request,
            cluster,
            per_broker: None,
            existing,
            requested: 0,
        }
    }

    /// The same with a per-broker bound over `brokers` brokers.
    pub fn with_broker_limit(mut self, brokers: i64, per_broker: i64) -> Self {
        self.per_broker = Some((brokers.max(1), per_broker));
        self
    }

    /// Admit a topic of `partitions` partitions, or say which bound refuses
    /// it. An admitted topic counts against the rest of the request even if
    /// its creation then fails: the bound is on what was asked.
    pub fn admit(&mut self, partitions: i32) -> Result<(), LimitError> {
        let p = i64::from(partitions.max(0));
        let asked = self.requested + p;
        if asked > self.per_request {
            return Err(LimitError::PartitionsPerRequest {
                asked,
                max: self.per_request,
            });
        }
        let existing = self.existing + self.requested;
        if existing + p > self.cluster {
            return Err(LimitError::ClusterPartitions {
                existing,
                asked: p,
                max: self.cluster,
            });
        }
        if let Some((brokers, per_broker)) = self.per_broker {
            if existing + p > brokers.saturating_mul(per_broker) {
                return Err(LimitError::BrokerPartitions {
                    existing,
                    asked: p,
                    brokers,
                    per_broker,
                });
            }
        }
        self.requested = asked;
        Ok(())
    }
}

/// Default `--max-partitions-per-broker`: four partitions per segment file
/// the broker may hold open (`--max-open-segment-files`, itself a quarter
/// of the descriptor limit), within 1,000..10,000 — 10,000 being what one
/// broker was measured to serve idle within its budgets (BENCHMARKS.md).
pub fn default_partitions_per_broker(open_segment_files: usize) -> i64 {
    (open_segment_files as i64)
        .saturating_mul(4)
        .clamp(1_000, 10_000)
}

/// KIP-599's controller mutation quota, for this broker: a token bucket of
/// partition mutations (partitions created, added or deleted) refilled at
/// `rate` per second, holding at most `rate` × [`MUTATION_BURST_SECS`]
/// (Kafka's quota window: 11 one-second samples). A request is admitted
/// while the bucket is not in debt and may overdraw it; then the next ones
/// wait until the debt is repaid: the throttle is debt / rate.
#[derive(Debug, Clone)]
pub struct MutationQuota {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

/// See [`MutationQuota`].
pub const MUTATION_BURST_SECS: f64 = 11.0;

impl MutationQuota {
    /// A full bucket; `rate` ≤ 0 means no quota.
    pub fn new(rate: f64, now: Instant) -> Self {
        let burst = (rate * MUTATION_BURST_SECS).max(1.0);
        Self {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
    }

    /// How long a client is to wait now (zero while not in debt).
    pub fn throttle(&mut self, now: Instant) -> Duration {
        if self.rate <= 0.0 {
            return Duration::ZERO;
        }
        self.refill(now);
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((-self.tokens / self.rate).min(3600.0))
        }
    }

    /// Strict (CreateTopics v6+, CreatePartitions v3+, DeleteTopics v5+):
    /// take `partitions` mutations, or refuse them while in debt.
    pub fn admit(&mut self, partitions: i64, now: Instant) -> Result<(), LimitError> {
        let wait = self.throttle(now);
        if !wait.is_zero() {
            return Err(LimitError::Throttled {
                throttle_ms: throttle_ms(wait),
            });
        }
        self.tokens -= partitions.max(0) as f64;
        Ok(())
    }

    /// Permissive (older versions, which have no error for it): take them
    /// whatever the debt; the request is throttled afterwards instead.
    pub fn record(&mut self, partitions: i64, now: Instant) {
        if self.rate > 0.0 {
            self.refill(now);
            self.tokens -= partitions.max(0) as f64;
        }
    }
}

/// A throttle as the protocol's `throttle_time_ms`.
pub fn throttle_ms(d: Duration) -> i32 {
    d.as_millis().min(i32::MAX as u128) as i32
}

/// A token bucket: `rate` tokens per second, holding at most `burst`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: f64, burst: f64, now: Instant) -> Self {
        let burst = burst.max(1.0);
        Self {
            rate: rate.max(0.0),
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Take one token if there is one.
    pub fn try_take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Log a repeated condition once per interval, with how many times it
/// happened since the last line: 2,000 identical `accept failed` lines in
/// two minutes say less than one line with a count.
#[derive(Debug, Clone)]
pub struct EveryInterval {
    interval: Duration,
    last: Option<Instant>,
    count: u64,
}

impl EveryInterval {
    /// Log at most once per `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: None,
            count: 0,
        }
    }

    /// Count one occurrence; `Some(n)` when it is time to log, `n` being the
    /// occurrences since the last line (this one included).
    pub fn hit(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.interval => None,
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.count))
            }
        }
    }
}

/// Peers whose repeated warnings are tracked at most; beyond it the table
/// is cleared (a burst of lines, then quiet again) rather than grown.
const MAX_PEER_KEYS: usize = 4096;

/// [`EveryInterval`] per (peer address, kind of warning): a client that
/// reconnects in a loop with the same bad request is logged once per
/// interval with a count, and one noisy peer does not silence the others.
#[derive(Debug)]
pub struct PeerWarnings {
    interval: Duration,
    seen: Mutex<HashMap<(IpAddr, &'static str), EveryInterval>>,
}

impl PeerWarnings {
    /// At most one line per (peer, kind) per `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            seen: Mutex::default(),
        }
    }

    /// Count one `kind` warning from `peer`; `Some(n)` when it is to be
    /// logged (see [`EveryInterval::hit`]).
    pub fn hit(&self, peer: IpAddr, kind: &'static str, now: Instant) -> Option<u64> {
        let mut seen = self.seen.lock().unwrap();
        if seen.len() >= MAX_PEER_KEYS && !seen.contains_key(&(peer, kind)) {
            seen.clear();
        }
        seen.entry((peer, kind))
            .or_insert_with(|| EveryInterval::new(self.interval))
            .hit(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_request_bound_counts_every_topic_of_the_request() {
        let mut b = PartitionBudget::with_limits(10, 1_000, 0);
        assert_eq!(b.admit(6), Ok(()));
        assert_eq!(
            b.admit(5),
            Err(LimitError::PartitionsPerRequest { asked: 11, max: 10 })
        );
        // A refused topic does not use the budget up.
        assert_eq!(b.admit(4), Ok(()));
        assert!(b.admit(1).is_err());
    }

    #[test]
    fn cluster_bound_counts_existing_and_this_request() {
        let mut b = PartitionBudget::with_limits(100, 10, 7);
        assert_eq!(b.admit(2), Ok(()));
        assert_eq!(
            b.admit(2),
            Err(LimitError::ClusterPartitions {
                existing: 9,
                asked: 2,
                max: 10
            })
        );
        assert_eq!(b.admit(1), Ok(()));
        let mut one = PartitionBudget::with_limits(10_000, 20_000, 0);
        assert!(matches!(
            one.admit(100_000),
            Err(LimitError::PartitionsPerRequest { .. })
        ));
    }

    #[test]
    fn broker_bound_is_brokers_times_the_limit() {
        let mut b = PartitionBudget::with_limits(100, 1_000, 5).with_broker_limit(2, 5);
        assert_eq!(b.admit(4), Ok(()));
        assert_eq!(
            b.admit(2),
            Err(LimitError::BrokerPartitions {
                existing: 9,
                asked: 2,
                brokers: 2,
                per_broker: 5
            })
        );
        assert_eq!(b.admit(1), Ok(()));
        // No live broker known yet still counts as one.
        let mut none = PartitionBudget::with_limits(100, 1_000, 0).with_broker_limit(0, 3);
        assert!(matches!(
            none.admit(4),
            Err(LimitError::BrokerPartitions { brokers: 1, .. })
        ));
        assert_eq!(default_partitions_per_broker(32), 1_000);
        assert_eq!(default_partitions_per_broker(1_000), 4_000);
        assert_eq!(default_partitions_per_broker(4_096), 10_000);
    }

    #[test]
    fn mutation_quota_admits_until_in_debt_then_throttles() {
        let t0 = Instant::now();
        // 10/s: a burst of 110.
        let mut q = MutationQuota::new(10.0, t0);
        assert_eq!(q.admit(100, t0), Ok(()));
        // Not in debt (10 left): admitted, and overdraws to -40.
        assert_eq!(q.admit(50, t0), Ok(()));
        assert_eq!(
            q.admit(1, t0),
            Err(LimitError::Throttled { throttle_ms: 4000 })
        );
        assert_eq!(
            q.throttle(t0 + Duration::from_secs(1)),
            Duration::from_secs(3)
        );
        assert_eq!(q.admit(1, t0 + Duration::from_secs(4)), Ok(()));
        // Permissive: always taken, the throttle says how long to wait.
        q.record(99, t0 + Duration::from_secs(4));
        assert_eq!(
            q.throttle(t0 + Duration::from_secs(4)),
            Duration::from_secs(10)
        );
        // No quota.
        let mut off = MutationQuota::new(0.0, t0);
        for _ in 0..10 {
            assert_eq!(off.admit(1_000_000, t0), Ok(()));
        }
        assert_eq!(off.throttle(t0), Duration::ZERO);
    }

    #[test]
    fn token_bucket_refills_at_its_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(2.0, 2.0, t0);
        assert!(b.try_take(t0));
        assert!(b.try_take(t0));
        assert!(!b.try_take(t0));
        assert!(!b.try_take(t0 + Duration::from_millis(400)));
        assert!(b.try_take(t0 + Duration::from_millis(500)));
        // Never more than the burst, however long it was idle.
        let later = t0 + Duration::from_secs(3600);
        assert!(b.try_take(later));
        assert!(b.try_take(later));
        assert!(!b.try_take(later));
        // A slow rate still allows one.
        let mut slow = TokenBucket::new(0.1, 0.1, t0);
        assert!(slow.try_take(t0));
        assert!(!slow.try_take(t0 + Duration::from_secs(5)));
        assert!(slow.try_take(t0 + Duration::from_secs(10)));
    }

    #[test]
    fn peer_warnings_are_counted_per_peer_and_kind() {
        let t0 = Instant::now();
        let w = PeerWarnings::new(Duration::from_secs(10));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(w.hit(a, "bad frame", t0), Some(1));
        assert_eq!(w.hit(a, "bad frame", t0), None);
        assert_eq!(w.hit(a, "not advertised", t0), Some(1));
        assert_eq!(w.hit(b, "bad frame", t0), Some(1));
        assert_eq!(w.hit(a, "bad frame", t0 + Duration::from_secs(10)), Some(2));
    }

    #[test]
    fn every_interval_logs_once_with_a_count() {
        let t0 = Instant::now();
        let mut e = EveryInterval::new(Duration::from_secs(10));
        assert_eq!(e.hit(t0), Some(1));
        for i in 1..=99 {
            assert_eq!(e.hit(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(e.hit(t0 + Duration::from_secs(10)), Some(100));
        assert_eq!(e.hit(t0 + Duration::from_secs(11)), None);
    }
}
