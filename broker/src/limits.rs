//! Declared bounds on what one request may make the broker do: partitions
//! per CreateTopics request and in the whole cluster, topics auto-created
//! per Metadata request and per second, and the helper that logs a repeated
//! condition once per interval with a count.
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
    existing: i64,
    requested: i64,
}

impl PartitionBudget {
    /// A budget for one request; `existing` is the cluster's partition count.
    pub fn new(args: &BrokerArgs, existing: i64) -> Self {
        Self::with_limits(
            args.max_partitions_per_request,
            args.max_partitions,
            existing,
        )
    }

    /// A budget with explicit limits.
    pub fn with_limits(per_request: i64, cluster: i64, existing: i64) -> Self {
        Self {
            per_request,
            cluster,
            existing,
            requested: 0,
        }
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
        self.requested = asked;
        Ok(())
    }
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
