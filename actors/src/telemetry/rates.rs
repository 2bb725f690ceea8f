//! Rates and short history for the dashboard: what the JSON endpoints show
//! beyond the raw counters Prometheus scrapes.
//!
//! A sampler (the broker runs [`super::Telemetry::sample`] about once a
//! second) folds each actor's counters since the previous sample into a
//! [`Window`] (messages/s, handling p50/p99, fsyncs/s, fsync p99), and
//! appends one [`Point`] of process-wide totals to a bounded [`Series`]
//! (the sparklines). Memory is fixed: one window per live actor, at most
//! [`SERIES_POINTS`] points. Plain logic, no clock of its own: the caller
//! passes the elapsed time, so tests drive it by hand.

use super::{Telemetry, BUCKETS};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// Points kept in the series: 5 minutes at one sample a second.
pub const SERIES_POINTS: usize = 300;

const NB: usize = BUCKETS.len() + 1;

/// One actor's rates over the last sampling interval.
#[derive(Debug, Clone, Default)]
pub struct Window {
    prev_handled: u64,
    prev_fsyncs: u64,
    prev_handling: Option<[u64; NB]>,
    prev_fsync: Option<[u64; NB]>,
    /// Messages handled per second.
    pub messages_per_sec: f64,
    /// Median handling time (ms).
    pub handle_p50_ms: f64,
    /// 99th percentile handling time (ms).
    pub handle_p99_ms: f64,
    /// fsyncs per second.
    pub fsyncs_per_sec: f64,
    /// 99th percentile fsync latency (ms).
    pub fsync_p99_ms: f64,
}

impl Window {
    /// Fold in the counters now, `secs` after the previous call.
    pub fn advance(
        &mut self,
        secs: f64,
        handled: u64,
        fsyncs: u64,
        handling: &[u64; NB],
        fsync: &[u64; NB],
    ) {
        let secs = if secs.is_finite() && secs > 0.0 {
            secs
        } else {
            1.0
        };
        self.messages_per_sec = handled.saturating_sub(self.prev_handled) as f64 / secs;
        self.fsyncs_per_sec = fsyncs.saturating_sub(self.prev_fsyncs) as f64 / secs;
        let dh = delta(handling, self.prev_handling.as_ref());
        let df = delta(fsync, self.prev_fsync.as_ref());
        self.handle_p50_ms = quantile_ms(&dh, 0.5);
        self.handle_p99_ms = quantile_ms(&dh, 0.99);
        self.fsync_p99_ms = quantile_ms(&df, 0.99);
        self.prev_handled = handled;
        self.prev_fsyncs = fsyncs;
        self.prev_handling = Some(*handling);
        self.prev_fsync = Some(*fsync);
    }
}

fn delta(now: &[u64; NB], prev: Option<&[u64; NB]>) -> [u64; NB] {
    std::array::from_fn(|i| now[i].saturating_sub(prev.map_or(0, |p| p[i])))
}

/// The `q` quantile of bucket counts, as the upper bound of the bucket it
/// falls in (ms); 0 with no observations. Above the last bound it reports
/// the last bound: "at least that".
pub fn quantile_ms(counts: &[u64; NB], q: f64) -> f64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut cum = 0;
    for (i, c) in counts.iter().enumerate() {
        cum += c;
        if cum >= rank {
            let bound = BUCKETS
                .get(i)
                .copied()
                .unwrap_or(BUCKETS[BUCKETS.len() - 1]);
            return bound * 1000.0;
        }
    }
    BUCKETS[BUCKETS.len() - 1] * 1000.0
}

/// Process-wide totals at one instant, as rates since the previous point.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Point {
    /// Wall-clock ms (for the chart's axis only).
    pub t_ms: i64,
    /// Actor messages handled per second, all kinds.
    pub messages_per_sec: f64,
    /// Bytes appended per second.
    pub produce_bytes_per_sec: f64,
    /// Bytes served by fetches per second.
    pub fetch_bytes_per_sec: f64,
    /// fsyncs per second.
    pub fsyncs_per_sec: f64,
    /// Mailbox depth summed over every kind.
    pub mailbox_depth: i64,
    /// Restarts so far, all kinds.
    pub restarts: u64,
    /// Open client connections.
    pub connections: i64,
    /// Lease headroom (ms).
    pub lease_headroom_ms: i64,
    /// Per kind: (messages/s, mailbox depth).
    pub kinds: BTreeMap<&'static str, (f64, i64)>,
}

#[derive(Default)]
struct Totals {
    messages: u64,
    produce: u64,
    fetch: u64,
    fsyncs: u64,
    per_kind: BTreeMap<&'static str, u64>,
}

/// The bounded history behind the sparklines.
#[derive(Default)]
pub struct Series {
    inner: Mutex<(Option<Totals>, VecDeque<Point>)>,
}

impl Series {
    /// The points, oldest first.
    pub fn points(&self) -> Vec<Point> {
        self.inner.lock().unwrap().1.iter().cloned().collect()
    }
}

impl Telemetry {
    /// One sampling pass: every live actor's [`Window`], then one point of
    /// the series. `secs` is the time since the previous pass.
    pub fn sample(&self, secs: f64, t_ms: i64) {
        let secs = if secs.is_finite() && secs > 0.0 {
            secs
        } else {
            1.0
        };
        for a in self.live() {
            a.sample(secs);
        }
        let mut per_kind: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut depth_by_kind: BTreeMap<&'static str, i64> = BTreeMap::new();
        let mut restarts = 0;
        let mut depth = 0;
        for (k, s) in self.kinds.lock().unwrap().iter() {
            let handled: u64 = s
                .messages
                .lock()
                .unwrap()
                .values()
                .map(|m| m.handled.load(Ordering::Relaxed))
                .sum();
            per_kind.insert(k, handled);
            let d = s.mailbox_depth.load(Ordering::Relaxed).max(0);
            depth_by_kind.insert(k, d);
            depth += d;
            restarts += s.restarts.load(Ordering::Relaxed);
        }
        let now = Totals {
            messages: per_kind.values().sum(),
            produce: self.produce_bytes.load(Ordering::Relaxed),
            fetch: self.fetch_bytes.load(Ordering::Relaxed),
            fsyncs: self.fsyncs.load(Ordering::Relaxed),
            per_kind,
        };
        let mut g = self.series.inner.lock().unwrap();
        let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
        let prev = g.0.take().unwrap_or_default();
        let kinds = now
            .per_kind
            .iter()
            .map(|(k, v)| {
                let before = prev.per_kind.get(k).copied().unwrap_or(*v);
                (
                    *k,
                    (rate(*v, before), depth_by_kind.get(k).copied().unwrap_or(0)),
                )
            })
            .collect();
        let first = g.1.is_empty() && prev.messages == 0 && prev.fsyncs == 0;
        let p = Point {
            t_ms,
            messages_per_sec: if first {
                0.0
            } else {
                rate(now.messages, prev.messages)
            },
            produce_bytes_per_sec: if first {
                0.0
            } else {
                rate(now.produce, prev.produce)
            },
            fetch_bytes_per_sec: if first {
                0.0
            } else {
                rate(now.fetch, prev.fetch)
            },
            fsyncs_per_sec: if first {
                0.0
            } else {
                rate(now.fsyncs, prev.fsyncs)
            },
            mailbox_depth: depth,
            restarts,
            connections: self.connections.load(Ordering::Relaxed),
            lease_headroom_ms: self.lease_headroom_ms.load(Ordering::Relaxed),
            kinds,
        };
        g.0 = Some(now);
        if g.1.len() == SERIES_POINTS {
            g.1.pop_front();
        }
        g.1.push_back(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Histogram;
    use std::time::Duration;

    #[test]
    fn a_window_reports_rates_and_quantiles_of_the_interval_only() {
        let h = Histogram::default();
        let f = Histogram::default();
        let mut w = Window::default();
        for _ in 0..99 {
            h.observe(Duration::from_micros(80));
        }
        h.observe(Duration::from_millis(200));
        w.advance(2.0, 100, 4, &h.snapshot(), &f.snapshot());
        assert_eq!(w.messages_per_sec, 50.0);
        assert_eq!(w.fsyncs_per_sec, 2.0);
        assert!((w.handle_p50_ms - 0.1).abs() < 1e-9, "{}", w.handle_p50_ms);
        assert!((w.handle_p99_ms - 0.1).abs() < 1e-9, "{}", w.handle_p99_ms);
        // Next interval: only slow messages; the old fast ones are gone.
        for _ in 0..10 {
            h.observe(Duration::from_millis(20));
        }
        w.advance(1.0, 110, 4, &h.snapshot(), &f.snapshot());
        assert_eq!(w.messages_per_sec, 10.0);
        assert_eq!(w.fsyncs_per_sec, 0.0);
        assert!((w.handle_p50_ms - 25.0).abs() < 1e-9, "{}", w.handle_p50_ms);
        // Idle: zeros, not stale numbers.
        w.advance(1.0, 110, 4, &h.snapshot(), &f.snapshot());
        assert_eq!((w.messages_per_sec, w.handle_p99_ms), (0.0, 0.0));
    }

    #[test]
    fn the_series_is_bounded() {
        let t = Telemetry::default();
        for i in 0..(SERIES_POINTS + 25) {
            t.produce_bytes.fetch_add(100, Ordering::Relaxed);
            t.sample(1.0, i as i64);
        }
        let pts = t.series.points();
        assert_eq!(pts.len(), SERIES_POINTS);
        assert_eq!(pts.last().unwrap().produce_bytes_per_sec, 100.0);
        assert_eq!(pts.first().unwrap().t_ms, 25);
    }
}
