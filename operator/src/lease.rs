//! Leader election over a Kubernetes `Lease` (coordination.k8s.io/v1), so
//! two operator replicas never reconcile at once.
//!
//! The protocol is client-go's: every replica reads the Lease every retry
//! period; the holder renews it (PUT with the `resourceVersion` it read, so
//! a concurrent writer makes it a 409 and exactly one write wins); a
//! candidate takes it over only once the record it observed has not changed
//! for `leaseDurationSeconds`, measured on the candidate's own monotonic
//! clock from the moment it first saw that record (so no two clocks are
//! ever compared, only their rates).
//!
//! Fencing: a holder counts itself leader only until `renew_deadline` after
//! it *started* the round whose write succeeded (the read, before the PUT).
//! Another replica can only have seen that write after it was sent, so its
//! takeover comes at least `duration` after it; `renew_deadline < duration`
//! makes the holder stop first, with `duration - renew_deadline` to spare
//! for a write already in flight. Every reconcile write checks [`Fence`]
//! first, and the controller is dropped (in-flight reconciles cancelled) as
//! soon as the deadline passes without a renewal.
//!
//! [`Elector`] is the pure state machine (time passed in, so the tests run
//! it on a fake clock); [`run`] drives it against the API server.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Timing and identity of one replica's election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Name of the Lease object (in the watched namespace).
    pub name: String,
    /// This replica's `holderIdentity` (the pod name).
    pub identity: String,
    /// `leaseDurationSeconds`: how long a silent holder keeps the lease.
    pub duration: Duration,
    /// How long a holder counts itself leader after a successful renewal
    /// round started; must be below `duration`.
    pub renew_deadline: Duration,
    /// Time between rounds (reads and renewals); below `renew_deadline`.
    pub retry: Duration,
}

/// A configuration that cannot be safe.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The holder would still act after another replica may take over.
    #[error("lease renew deadline {renew:?} must be below the lease duration {duration:?}")]
    RenewDeadline {
        /// renew deadline
        renew: Duration,
        /// lease duration
        duration: Duration,
    },
    /// A holder would lose the lease between two renewals.
    #[error("lease retry period {retry:?} must be below the renew deadline {renew:?}")]
    Retry {
        /// retry period
        retry: Duration,
        /// renew deadline
        renew: Duration,
    },
    /// `leaseDurationSeconds` is whole seconds.
    #[error("lease duration {0:?} must be a whole number of seconds, at least 1")]
    Duration(Duration),
}

impl LeaseConfig {
    /// Refuse timings under which two replicas could lead at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.duration.subsec_nanos() != 0 || self.duration.as_secs() == 0 {
            return Err(ConfigError::Duration(self.duration));
        }
        if self.renew_deadline >= self.duration {
            return Err(ConfigError::RenewDeadline {
                renew: self.renew_deadline,
                duration: self.duration,
            });
        }
        if self.retry >= self.renew_deadline {
            return Err(ConfigError::Retry {
                retry: self.retry,
                renew: self.renew_deadline,
            });
        }
        Ok(())
    }
}

/// What the elector wants written next.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// No Lease exists: create it, held by us (a 409 means another won).
    Create(Lease),
    /// Renew or take over: PUT with the `resourceVersion` read.
    Replace(Lease),
    /// Another replica holds a lease that has not expired.
    Wait,
}

/// The part of a Lease record whose change shows its holder is alive.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    holder: Option<String>,
    resource_version: Option<String>,
    renew_time: Option<String>,
}

fn seen(l: &Lease) -> Seen {
    let spec = l.spec.clone().unwrap_or_default();
    Seen {
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        resource_version: l.metadata.resource_version.clone(),
        renew_time: spec.renew_time.map(|t| t.0.to_string()),
    }
}

/// One replica's election state. Pure: every method takes the time.
#[derive(Debug)]
pub struct Elector {
    cfg: LeaseConfig,
    /// The record last seen and when (our monotonic clock) it was first seen.
    observed: Option<(Seen, Instant)>,
    /// Leader until then (exclusive); `None` when not leader.
    leading_until: Option<Instant>,
}

impl Elector {
    /// A candidate that holds nothing yet.
    pub fn new(cfg: LeaseConfig) -> Self {
        Self {
            cfg,
            observed: None,
            leading_until: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LeaseConfig {
        &self.cfg
    }

    /// Whether this replica may act at `now`.
    pub fn is_leader(&self, now: Instant) -> bool {
        self.leading_until.is_some_and(|d| now < d)
    }

    /// End of the current leadership, if leader at some point.
    pub fn deadline(&self) -> Option<Instant> {
        self.leading_until
    }

    /// Plan a round that started at `now` (monotonic; before the read) from
    /// the Lease as read (`None`: there is none); `wall` stamps renewTime.
    pub fn plan(&mut self, current: Option<&Lease>, now: Instant, wall: Timestamp) -> Plan {
        let Some(cur) = current else {
            return Plan::Create(self.record(None, wall, 0));
        };
        let s = seen(cur);
        if self.observed.as_ref().map(|(o, _)| o) != Some(&s) {
            self.observed = Some((s.clone(), now));
        }
        let spec = cur.spec.clone().unwrap_or_default();
        let transitions = spec.lease_transitions.unwrap_or(0);
        match s.holder.as_deref() {
            Some(h) if h == self.cfg.identity => {
                Plan::Replace(self.record(Some(cur), wall, transitions))
            }
            Some(_) => {
                // Someone else holds it: whatever we believed, we do not lead.
                self.leading_until = None;
                let held = Duration::from_secs(
                    spec.lease_duration_seconds
                        .map_or(self.cfg.duration.as_secs(), |d| d.max(0) as u64),
                );
                let since = self.observed.as_ref().map_or(now, |(_, t)| *t);
                if now.saturating_duration_since(since) >= held {
                    Plan::Replace(self.record(Some(cur), wall, transitions.saturating_add(1)))
                } else {
                    Plan::Wait
                }
            }
            // Released (or never held): free to take.
            None => Plan::Replace(self.record(Some(cur), wall, transitions.saturating_add(1))),
        }
    }

    fn record(&self, cur: Option<&Lease>, wall: Timestamp, transitions: i32) -> Lease {
        let prev = cur.and_then(|c| c.spec.clone()).unwrap_or_default();
        let ours = prev.holder_identity.as_deref() == Some(self.cfg.identity.as_str());
        Lease {
            metadata: ObjectMeta {
                name: Some(self.cfg.name.clone()),
                resource_version: cur.and_then(|c| c.metadata.resource_version.clone()),
                ..cur.map(|c| c.metadata.clone()).unwrap_or_default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.cfg.identity.clone()),
                lease_duration_seconds: Some(self.cfg.duration.as_secs() as i32),
                acquire_time: if ours {
                    prev.acquire_time.clone()
                } else {
                    Some(MicroTime(wall))
                },
                renew_time: Some(MicroTime(wall)),
                lease_transitions: Some(transitions),
                ..prev
            }),
        }
    }

    /// The write planned in the round that started at `started` succeeded
    /// and the API server stored `stored`: leader until
    /// `started + renew_deadline`.
    pub fn written(&mut self, started: Instant, stored: &Lease) {
        self.observed = Some((seen(stored), started));
        self.leading_until = Some(started + self.cfg.renew_deadline);
    }

    /// Plan a release (graceful stop): the lease handed back with no holder,
    /// so a standby need not wait for it to expire. `None` when not ours.
    pub fn release(&mut self, current: &Lease) -> Option<Lease> {
        self.leading_until = None;
        let mut l = current.clone();
        let spec = l.spec.as_mut()?;
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            return None;
        }
        spec.holder_identity = None;
        Some(l)
    }
}

/// What reconciles check before every write: "am I still the leader?".
#[derive(Clone, Debug)]
pub struct Fence(Option<Arc<Mutex<Option<Instant>>>>);

/// A write refused because this replica is not (or no longer) leader.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not the leader (lease lost or not yet acquired): write withheld")]
pub struct NotLeader;

impl Fence {
    /// No election (a single replica by construction, and the tests).
    pub fn unfenced() -> Self {
        Self(None)
    }

    /// A fence that admits writes until the deadline set by [`Fence::set`].
    pub fn elected() -> Self {
        Self(Some(Arc::new(Mutex::new(None))))
    }

    /// Publish the elector's deadline.
    pub fn set(&self, until: Option<Instant>) {
        if let Some(m) = &self.0 {
            *m.lock().unwrap_or_else(|p| p.into_inner()) = until;
        }
    }

    /// End of the leadership (`None`: not leader; unfenced: never ends).
    fn until(&self) -> Option<Option<Instant>> {
        self.0
            .as_ref()
            .map(|m| *m.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether a write may go now.
    pub fn is_leader(&self) -> bool {
        match self.until() {
            None => true,
            Some(d) => d.is_some_and(|d| Instant::now() < d),
        }
    }

    /// `Err(NotLeader)` unless a write may go now.
    pub fn check(&self) -> Result<(), NotLeader> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(NotLeader)
        }
    }

    /// Resolves when leadership is lost (the deadline passed unrenewed).
    pub async fn lost(&self) {
        loop {
            match self.until() {
                None => std::future::pending::<()>().await,
                Some(Some(d)) if Instant::now() < d => {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await
                }
                Some(_) => return,
            }
        }
    }

    /// Resolves when this replica leads.
    pub async fn acquired(&self) {
        while !self.is_leader() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// One round: read, plan, write. Returns whether this replica leads after it.
pub async fn round(api: &Api<Lease>, el: &mut Elector, fence: &Fence) -> bool {
    let started = Instant::now();
    let name = el.config().name.clone();
    let result = match api.get_opt(&name).await {
        Err(e) => Err(e),
        Ok(cur) => match el.plan(cur.as_ref(), started, Timestamp::now()) {
            Plan::Wait => Ok(None),
            Plan::Create(l) => api.create(&PostParams::default(), &l).await.map(Some),
            Plan::Replace(l) => api
                .replace(&name, &PostParams::default(), &l)
                .await
                .map(Some),
        },
    };
    let was = el.is_leader(started);
    match result {
        Ok(Some(stored)) => el.written(started, &stored),
        Ok(None) => {}
        Err(e) if is_conflict(&e) => {
            tracing::debug!(lease = %name, "lease write lost a race (409): another replica wrote first")
        }
        Err(e) => tracing::warn!(lease = %name, error = %e, "lease round failed"),
    }
    fence.set(el.deadline());
    let now_leader = el.is_leader(Instant::now());
    if now_leader && !was {
        tracing::info!(lease = %name, identity = %el.config().identity, "acquired the lease: leading");
    }
    now_leader
}

/// Drive `el` every retry period until `stop` resolves, publishing the
/// deadline through `fence`; then hand the lease back if we hold it.
pub async fn run(
    api: Api<Lease>,
    mut el: Elector,
    fence: Fence,
    stop: impl std::future::Future<Output = ()>,
) {
    let retry = el.config().retry;
    let mut stop = std::pin::pin!(stop);
    loop {
        round(&api, &mut el, &fence).await;
        tokio::select! {
            () = tokio::time::sleep(retry) => {}
            () = &mut stop => break,
        }
    }
    fence.set(None);
    let name = el.config().name.clone();
    if let Ok(Some(cur)) = api.get_opt(&name).await {
        if let Some(l) = el.release(&cur) {
            match api.replace(&name, &PostParams::default(), &l).await {
                Ok(_) => tracing::info!(lease = %name, "lease released"),
                Err(e) => {
                    tracing::warn!(lease = %name, error = %e, "lease release failed (it expires)")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(id: &str) -> LeaseConfig {
        LeaseConfig {
            name: "kaas-operator".into(),
            identity: id.into(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }

    fn wall() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    /// An API server holding one Lease: resourceVersion bumped on every
    /// write, a write naming a stale one (or a create of an existing one)
    /// refused — the optimistic concurrency the real one gives.
    #[derive(Default)]
    struct Server {
        lease: Option<Lease>,
        rv: u64,
    }

    impl Server {
        fn write(&mut self, plan: Plan) -> Option<Lease> {
            let (mut l, create) = match plan {
                Plan::Wait => return None,
                Plan::Create(l) => (l, true),
                Plan::Replace(l) => (l, false),
            };
            let have = self
                .lease
                .as_ref()
                .and_then(|c| c.metadata.resource_version.clone());
            if create != self.lease.is_none() || (!create && l.metadata.resource_version != have) {
                return None; // 409
            }
            self.rv += 1;
            l.metadata.resource_version = Some(self.rv.to_string());
            self.lease = Some(l.clone());
            Some(l)
        }
    }

    fn holder(s: &Server) -> Option<String> {
        s.lease
            .as_ref()
            .and_then(|l| l.spec.as_ref()?.holder_identity.clone())
    }

    #[test]
    fn timings_that_could_overlap_are_refused() {
        assert_eq!(cfg("a").validate(), Ok(()));
        let mut c = cfg("a");
        c.renew_deadline = c.duration;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::RenewDeadline { .. })
        ));
        let mut c = cfg("a");
        c.retry = c.renew_deadline;
        assert!(matches!(c.validate(), Err(ConfigError::Retry { .. })));
        let mut c = cfg("a");
        c.duration = Duration::from_millis(15_500);
        assert!(matches!(c.validate(), Err(ConfigError::Duration(_))));
    }

    #[test]
    fn first_replica_creates_and_leads_until_the_renew_deadline() {
        let t0 = Instant::now();
        let mut a = Elector::new(cfg("a"));
        let mut s = Server::default();
        assert!(!a.is_leader(t0));
        let p = a.plan(None, t0, wall());
        let Plan::Create(l) = &p else { panic!("{p:?}") };
        let spec = l.spec.clone().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, Some(0));
        let stored = s.write(p).unwrap();
        a.written(t0, &stored);
        assert!(a.is_leader(t0 + Duration::from_secs(9)));
        assert!(
            !a.is_leader(t0 + Duration::from_secs(10)),
            "fenced at the renew deadline"
        );
        // A renewal keeps the acquire time, names the version read, and
        // moves the deadline.
        let t1 = t0 + Duration::from_secs(2);
        let p = a.plan(s.lease.as_ref(), t1, wall());
        let Plan::Replace(l) = &p else {
            panic!("{p:?}")
        };
        assert_eq!(l.metadata.resource_version.as_deref(), Some("1"));
        assert_eq!(l.spec.as_ref().unwrap().acquire_time, spec.acquire_time);
        let stored = s.write(p).unwrap();
        a.written(t1, &stored);
        assert!(a.is_leader(t0 + Duration::from_secs(11)));
    }

    #[test]
    fn a_standby_waits_for_the_full_duration_of_an_unchanged_record() {
        let t0 = Instant::now();
        let mut s = Server::default();
        let mut a = Elector::new(cfg("a"));
        let stored = s.write(a.plan(None, t0, wall())).unwrap();
        a.written(t0, &stored);
        let mut b = Elector::new(cfg("b"));
        // b first sees a's record at t0+1: the clock starts then.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(b.plan(s.lease.as_ref(), t1, wall()), Plan::Wait);
        assert_eq!(
            b.plan(s.lease.as_ref(), t1 + Duration::from_millis(14_999), wall()),
            Plan::Wait
        );
        // a renews at t0+5: b's clock restarts when it sees the new record.
        let stored = s
            .write(a.plan(s.lease.as_ref(), t0 + Duration::from_secs(5), wall()))
            .unwrap();
        a.written(t0 + Duration::from_secs(5), &stored);
        let t2 = t0 + Duration::from_secs(6);
        assert_eq!(b.plan(s.lease.as_ref(), t2, wall()), Plan::Wait);
        assert_eq!(
            b.plan(s.lease.as_ref(), t2 + Duration::from_millis(14_999), wall()),
            Plan::Wait
        );
        // a is silent: a stops leading at t0+5+10 = t0+15, b takes over at
        // t2+15 = t0+21, after.
        assert!(!a.is_leader(t0 + Duration::from_secs(15)));
        let t3 = t2 + Duration::from_secs(15);
        let p = b.plan(s.lease.as_ref(), t3, wall());
        let Plan::Replace(l) = &p else {
            panic!("{p:?}")
        };
        let spec = l.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(1));
        assert_eq!(spec.acquire_time, Some(MicroTime(wall())));
        let stored = s.write(p).unwrap();
        b.written(t3, &stored);
        assert!(b.is_leader(t3));
        // a comes back: it sees b's holder and stops believing it leads.
        let mut a2 = a;
        a2.leading_until = Some(t3 + Duration::from_secs(100)); // a stale belief
        assert_eq!(a2.plan(s.lease.as_ref(), t3, wall()), Plan::Wait);
        assert!(!a2.is_leader(t3));
    }

    #[test]
    fn a_race_for_the_lease_has_one_winner() {
        let t0 = Instant::now();
        let mut s = Server::default();
        let mut a = Elector::new(cfg("a"));
        let mut b = Elector::new(cfg("b"));
        // Both read "no lease", both create: the second create is a 409.
        let pa = a.plan(None, t0, wall());
        let pb = b.plan(None, t0, wall());
        a.written(t0, &s.write(pa).unwrap());
        assert!(s.write(pb).is_none());
        assert!(a.is_leader(t0) && !b.is_leader(t0));
        // Both read a released lease, both take it: one PUT wins.
        let cur = s.lease.clone().unwrap();
        let released = a.release(&cur).unwrap();
        assert!(!a.is_leader(t0));
        s.write(Plan::Replace(released)).unwrap();
        let pa = a.plan(s.lease.as_ref(), t0, wall());
        let pb = b.plan(s.lease.as_ref(), t0, wall());
        b.written(t0, &s.write(pb).unwrap());
        assert!(s.write(pa).is_none(), "stale resourceVersion: 409");
        assert!(b.is_leader(t0) && !a.is_leader(t0));
        assert_eq!(holder(&s).as_deref(), Some("b"));
    }

    /// Two replicas on a fake clock, rounds at jittered times, writes lost
    /// at random (network), replicas paused for long stretches (a stalled
    /// process); at no instant do both count themselves leader, and after
    /// the leader is killed the other leads within duration + 2 retries.
    #[test]
    fn never_two_leaders_on_a_fake_clock() {
        let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for _run in 0..50 {
            let t0 = Instant::now();
            let mut s = Server::default();
            let mut el = [Elector::new(cfg("a")), Elector::new(cfg("b"))];
            let mut due = [t0, t0 + Duration::from_millis(next(2000))];
            let mut paused_until = [t0, t0];
            let killed_at = t0 + Duration::from_secs(120);
            let mut dead = [false, false];
            let mut took_over = None;
            let step = Duration::from_millis(50);
            let mut now = t0;
            while now < t0 + Duration::from_secs(200) {
                for i in 0..2 {
                    if dead[i] || now < due[i] || now < paused_until[i] {
                        continue;
                    }
                    let cur = s.lease.clone();
                    let plan = el[i].plan(cur.as_ref(), now, wall());
                    // 1 in 5 writes lost on the way (never reaches the
                    // server), 1 in 5 answers lost (stored, never known).
                    match next(5) {
                        0 => {}
                        1 => {
                            s.write(plan);
                        }
                        _ => {
                            if let Some(stored) = s.write(plan) {
                                el[i].written(now, &stored);
                            }
                        }
                    }
                    // 1 in 20 rounds followed by a long stall (until the kill).
                    if next(20) == 0 && !dead.contains(&true) {
                        paused_until[i] = now + Duration::from_millis(next(30_000));
                    }
                    due[i] = now + Duration::from_millis(1500 + next(1000));
                }
                assert!(
                    !(el[0].is_leader(now) && el[1].is_leader(now)),
                    "two leaders at {:?}",
                    now - t0
                );
                if now >= killed_at && !dead[0] && !dead[1] {
                    // kill -9 whichever leads (or a, if none does).
                    let k = usize::from(el[1].is_leader(now));
                    dead[k] = true;
                    paused_until[1 - k] = now;
                }
                if let Some(k) = dead.iter().position(|d| *d) {
                    if took_over.is_none() && el[1 - k].is_leader(now) {
                        took_over = Some(now - killed_at);
                    }
                }
                now += step;
            }
            let took = took_over.expect("the survivor never took over");
            // The duration after the last record it saw, plus rounds lost
            // to dropped writes: bounded.
            assert!(took <= Duration::from_secs(30), "takeover took {took:?}");
        }
    }
}
