//! Client byte-rate quotas, enforced per broker as Kafka does:
//! `producer_byte_rate` and `consumer_byte_rate` for `user` and
//! `client-id` entities (and their defaults), persisted as a linear history
//! of versions in the cluster directory ([`kaas_volume::quotas`]) and
//! reloaded every [`RELOAD`] by a thread of this module.
//!
//! Matching follows Kafka's precedence (kaas has no authentication, so the
//! user is always `ANONYMOUS`): `user + client-id`, `user + default
//! client-id`, `user`, `default user + client-id`, `default user + default
//! client-id`, `default user`, `client-id`, `default client-id`. The rate is
//! measured per matched entity with its defaults filled in (so a default
//! client-id quota applies to each client id on its own), over a window of
//! [`SAMPLES`] one-second samples (never counted as less than ten seconds,
//! as in Kafka, so a burst of ten seconds' worth passes); beyond the quota a
//! request is answered with `throttle_time_ms = (rate - quota) / quota ×
//! window` (at most
//! [`MAX_THROTTLE`]) and the connection is held for that long (a produce
//! before its next request is read, a fetch before its answer is sent), so
//! a client that ignores the field slows down too.

use kaas_volume::fs::ReadFs;
use kaas_volume::quotas::{Entity, Quotas};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How often the quotas are re-read from the volume.
pub const RELOAD: Duration = Duration::from_secs(1);
/// One-second samples in the measuring window (Kafka's quota.window.num).
pub const SAMPLES: usize = 11;
/// The longest throttle.
pub const MAX_THROTTLE: Duration = Duration::from_secs(30);
/// Most rate windows kept (one per matched entity); beyond it the oldest go.
const MAX_WINDOWS: usize = 10_000;
/// The principal of every connection (no authentication).
pub const USER: &str = "ANONYMOUS";

/// Which quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `producer_byte_rate`.
    Produce,
    /// `consumer_byte_rate`.
    Fetch,
}

impl Kind {
    /// The quota key.
    pub fn key(self) -> &'static str {
        match self {
            Kind::Produce => "producer_byte_rate",
            Kind::Fetch => "consumer_byte_rate",
        }
    }
}

/// The quota keys served; others are refused.
pub const KEYS: &[&str] = &["producer_byte_rate", "consumer_byte_rate"];

struct Window {
    start: Instant,
    samples: [u64; SAMPLES],
    last: Instant,
}

impl Window {
    fn new(now: Instant) -> Self {
        Self {
            start: now,
            samples: [0; SAMPLES],
            last: now,
        }
    }

    fn slot(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.start).as_secs()
    }

    /// Add `bytes` at `now`; the rate (bytes/s) over the window.
    fn record(&mut self, bytes: u64, now: Instant) -> f64 {
        let (from, to) = (self.slot(self.last), self.slot(now));
        for s in (from + 1)..=to.min(from + SAMPLES as u64) {
            self.samples[(s % SAMPLES as u64) as usize] = 0;
        }
        self.samples[(to % SAMPLES as u64) as usize] += bytes;
        self.last = now;
        let total: u64 = self.samples.iter().sum();
        total as f64 / self.window(now)
    }

    /// Kafka's measuring window: the time the samples cover, but never less
    /// than all samples but one (so a fresh client's first burst is spread
    /// over the window rather than judged on its first instant).
    fn window(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.start).as_secs_f64();
        elapsed.clamp((SAMPLES - 1) as f64, SAMPLES as f64)
    }
}

/// See module docs.
pub struct QuotaManager {
    quotas: RwLock<Arc<Quotas>>,
    /// Whether any quota is configured: requests skip all quota work
    /// (client id, byte counts) otherwise.
    active: std::sync::atomic::AtomicBool,
    windows: Mutex<HashMap<(Kind, Entity), Window>>,
}

impl Default for QuotaManager {
    fn default() -> Self {
        Self {
            quotas: RwLock::new(Arc::new(Quotas::default())),
            active: Default::default(),
            windows: Mutex::default(),
        }
    }
}

/// The entity whose quota applies to (`user`, `client`) for `key`, with
/// the value, by Kafka's precedence.
pub fn matching(q: &Quotas, key: &str, user: &str, client: &str) -> Option<(Entity, f64)> {
    let u = |n: Option<&str>| ("user".to_owned(), n.map(str::to_owned));
    let c = |n: Option<&str>| ("client-id".to_owned(), n.map(str::to_owned));
    let order: [Entity; 8] = [
        vec![c(Some(client)), u(Some(user))],
        vec![c(None), u(Some(user))],
        vec![u(Some(user))],
        vec![c(Some(client)), u(None)],
        vec![c(None), u(None)],
        vec![u(None)],
        vec![c(Some(client))],
        vec![c(None)],
    ];
    for e in order {
        if let Some(v) = q.get(&e).and_then(|m| m.get(key)) {
            // Measured per entity with its defaults filled in.
            let filled = e
                .iter()
                .map(|(t, n)| {
                    let n = n.clone().unwrap_or_else(|| {
                        if t == "user" {
                            user.to_owned()
                        } else {
                            client.to_owned()
                        }
                    });
                    (t.clone(), Some(n))
                })
                .collect();
            return Some((filled, *v));
        }
    }
    None
}

/// Kafka's throttle: how long until the rate over `window` seconds falls
/// back to the quota, `(rate - quota) / quota × window`.
fn throttle(rate: f64, quota: f64, window: f64) -> Duration {
    if quota <= 0.0 {
        return MAX_THROTTLE;
    }
    if rate <= quota {
        return Duration::ZERO;
    }
    let secs = (rate - quota) / quota * window;
    Duration::from_secs_f64(secs.min(MAX_THROTTLE.as_secs_f64()))
}

impl QuotaManager {
    /// The quotas in force.
    pub fn current(&self) -> Arc<Quotas> {
        self.quotas.read().unwrap().clone()
    }

    /// Replace the quotas in force (a reload, or this broker's own change).
    pub fn install(&self, q: Quotas) {
        self.active
            .store(!q.entries.is_empty(), std::sync::atomic::Ordering::Relaxed);
        *self.quotas.write().unwrap() = Arc::new(q);
    }

    /// Whether any quota is configured (cheap; checked per request).
    pub fn active(&self) -> bool {
        self.active.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Count `bytes` of `kind` for `client` at `now`; how long to throttle.
    pub fn record(&self, kind: Kind, client: &str, bytes: u64, now: Instant) -> Duration {
        let q = self.current();
        if q.entries.is_empty() {
            return Duration::ZERO;
        }
        let Some((entity, quota)) = matching(&q, kind.key(), USER, client) else {
            return Duration::ZERO;
        };
        let mut w = self.windows.lock().unwrap();
        if w.len() >= MAX_WINDOWS && !w.contains_key(&(kind, entity.clone())) {
            if let Some(oldest) = w.iter().min_by_key(|(_, v)| v.last).map(|(k, _)| k.clone()) {
                w.remove(&oldest);
            }
        }
        let win = w.entry((kind, entity)).or_insert_with(|| Window::new(now));
        let rate = win.record(bytes, now);
        throttle(rate, quota, win.window(now))
    }

    /// Re-read the quotas every [`RELOAD`] on a thread of its own (a read
    /// that blocks on a hard mount blocks nobody else; the last quotas
    /// stay in force).
    pub fn start_reload(self: &Arc<Self>, fs: ReadFs, dir: PathBuf) -> std::io::Result<()> {
        let me = self.clone();
        let mut seen = 0u64;
        std::thread::Builder::new()
            .name("kaas-quotas".into())
            .spawn(move || loop {
                match kaas_volume::quotas::read_latest(&fs, &dir) {
                    Ok((v, q)) if v != seen => {
                        seen = v;
                        tracing::info!(version = v, entities = q.entries.len(), "client quotas loaded");
                        me.install(q);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "client quotas unreadable; keeping the last ones"),
                }
                std::thread::sleep(RELOAD);
            })
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(entries: &[(Entity, f64)]) -> Quotas {
        let mut q = Quotas::default();
        for (e, v) in entries {
            q.set(e, "producer_byte_rate", Some(*v));
        }
        q
    }

    fn client(n: Option<&str>) -> Entity {
        vec![("client-id".into(), n.map(str::to_owned))]
    }

    /// Catches: quota work (client id, byte counts) done per request with
    /// no quota configured, or skipped with one.
    #[test]
    fn active_follows_the_installed_quotas() {
        let m = QuotaManager::default();
        assert!(!m.active());
        m.install(q(&[(client(Some("a")), 10.0)]));
        assert!(m.active());
        m.install(Quotas::default());
        assert!(!m.active());
    }

    #[test]
    fn kafka_precedence_and_defaults_per_client() {
        let quotas = q(&[(client(None), 100.0), (client(Some("a")), 10.0)]);
        let (e, v) = matching(&quotas, "producer_byte_rate", USER, "a").unwrap();
        assert_eq!((e, v), (client(Some("a")), 10.0));
        let (e, v) = matching(&quotas, "producer_byte_rate", USER, "b").unwrap();
        assert_eq!(
            (e, v),
            (client(Some("b")), 100.0),
            "default, measured per client id"
        );
        assert!(matching(&quotas, "consumer_byte_rate", USER, "a").is_none());
        let user_default = vec![("user".to_owned(), None)];
        let quotas = q(&[(client(Some("a")), 10.0), (user_default, 5.0)]);
        let (_, v) = matching(&quotas, "producer_byte_rate", USER, "a").unwrap();
        assert_eq!(v, 5.0, "a user quota comes before a client-id one");
    }

    #[test]
    fn throttle_grows_with_the_excess_and_only_the_quota_holder_is_throttled() {
        let m = QuotaManager::default();
        m.install(q(&[(client(Some("slow")), 100.0)]));
        let t0 = Instant::now();
        // A burst of up to quota × 10 s passes (Kafka's window).
        assert_eq!(m.record(Kind::Produce, "slow", 1000, t0), Duration::ZERO);
        let d = m.record(Kind::Produce, "slow", 1000, t0);
        // 2000 B over a 10 s window against 100 B/s: (200-100)/100 × 10 s.
        assert_eq!(d, Duration::from_secs(10));
        assert_eq!(m.record(Kind::Produce, "fast", 1 << 30, t0), Duration::ZERO);
        assert_eq!(m.record(Kind::Fetch, "slow", 1 << 30, t0), Duration::ZERO);
        // Eleven quiet seconds later the window has forgotten it.
        assert_eq!(
            m.record(Kind::Produce, "slow", 10, t0 + Duration::from_secs(23)),
            Duration::ZERO
        );
        assert_eq!(throttle(10.0, 0.0, 10.0), MAX_THROTTLE);
    }
}
