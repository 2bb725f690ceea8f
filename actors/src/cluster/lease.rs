//! This broker's lease on its own liveness, and the clock it is measured on.
//!
//! The lease is self-granted and self-enforced: it runs from the *start* of
//! the last heartbeat write that completed in time, for `lease` on this
//! host's CLOCK_BOOTTIME (monotonic, and it keeps counting through a
//! suspended VM, unlike CLOCK_MONOTONIC). Every acknowledgement of a write
//! and every controller write checks it; once it has lapsed it stays lapsed
//! for this incarnation — a later heartbeat never revives it, because the
//! controller may already have moved the partitions (see ARCHITECTURE.md,
//! "Leases").
//!
//! Why that is safe: the controller declares a broker dead only after it
//! has read the same heartbeat `seq` for lease + grace on its own clock.
//! A heartbeat that extends the lease must complete before the current lease
//! ends, so the controller (which re-reads every poll, poll < grace) would
//! have seen it. Hence the broker's last valid instant precedes the
//! controller's decision by at least `grace`, which absorbs clock-rate
//! differences between hosts. No two hosts' clocks are compared.

use crate::clock::{self, SharedClock};
use kaas_volume::fs::{fenced, GuardedFs, SharedFs, WriteGuard};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use crate::clock::boot_now;

/// A write guard's answer: go on, or the write is [`fenced`].
fn allowed(ok: bool) -> io::Result<()> {
    if ok {
        Ok(())
    } else {
        Err(fenced())
    }
}

/// The write guard of everything written under the lease of one
/// incarnation: a write may reach the volume only while
/// [`Lease::valid_for`] that incarnation holds, checked right before its
/// syscall ([`GuardedFs`]).
#[derive(Debug, Clone)]
pub struct LeaseGuard {
    lease: Arc<Lease>,
    incarnation: u64,
}

impl LeaseGuard {
    /// Writes of `incarnation`, allowed while its lease is valid.
    pub fn new(lease: Arc<Lease>, incarnation: u64) -> Self {
        Self { lease, incarnation }
    }

    /// The incarnation whose lease this checks.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// `fs`, writable only while this lease is valid.
    pub fn guard(self, fs: &SharedFs) -> SharedFs {
        GuardedFs::shared(fs.clone(), Arc::new(self))
    }
}

impl WriteGuard for LeaseGuard {
    fn may_write(&self) -> io::Result<()> {
        allowed(self.lease.valid_for(self.incarnation))
    }
}

/// The write guard of one heartbeat: every step of its temp → fsync →
/// rename passes only while [`Lease::may_heartbeat`] holds. A broker
/// paused in the middle of a heartbeat past its lease wakes with the write
/// refused instead of renaming it over the record of a replacement that
/// waited it out (which would then read a foreign incarnation and exit,
/// leaving the zombie in its place).
#[derive(Debug, Clone)]
pub struct HeartbeatGuard {
    lease: Arc<Lease>,
    incarnation: u64,
}

impl HeartbeatGuard {
    /// The heartbeat of `incarnation`.
    pub fn new(lease: Arc<Lease>, incarnation: u64) -> Self {
        Self { lease, incarnation }
    }
}

impl WriteGuard for HeartbeatGuard {
    fn may_write(&self) -> io::Result<()> {
        allowed(self.lease.may_heartbeat(self.incarnation))
    }
}

/// The broker-wide guard (the topic catalog, producer-id blocks): writes
/// pass while the *current* incarnation's lease is valid. Those owners
/// outlive an incarnation, so they follow whichever one is current; what an
/// incarnation owns alone (a partition epoch, a controller term) is guarded
/// by [`LeaseGuard`] instead.
impl WriteGuard for Lease {
    fn may_write(&self) -> io::Result<()> {
        allowed(self.valid())
    }
}

/// See module docs.
#[derive(Debug)]
pub struct Lease {
    /// Lease length.
    pub length: Duration,
    /// Current incarnation (changes after a lapse).
    incarnation: AtomicU64,
    /// End of the lease, boot-clock nanoseconds; 0 = never granted.
    deadline: AtomicU64,
    /// Set once the current incarnation's lease lapsed.
    lapsed: AtomicBool,
    /// Set by [`Lease::revoke`]: this process ended its lease on purpose
    /// (controlled shutdown, an impostor found) and never takes another.
    revoked: AtomicBool,
    /// The clock the lease is measured on (CLOCK_BOOTTIME outside tests).
    clock: SharedClock,
}

impl Lease {
    /// A lease not yet granted, on the real clock.
    pub fn new(length: Duration, incarnation: u64) -> Self {
        Self::with_clock(length, incarnation, clock::real())
    }

    /// A lease not yet granted, measured on `clock`.
    pub fn with_clock(length: Duration, incarnation: u64, clock: SharedClock) -> Self {
        Self {
            length,
            incarnation: AtomicU64::new(incarnation),
            deadline: AtomicU64::new(0),
            lapsed: AtomicBool::new(false),
            revoked: AtomicBool::new(false),
            clock,
        }
    }

    /// The clock this lease is measured on; everything that times a
    /// heartbeat or an observation against it must read the same clock.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Current incarnation.
    pub fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::Acquire)
    }

    /// Whether `incarnation` still holds a valid lease now.
    pub fn valid_for(&self, incarnation: u64) -> bool {
        if self.incarnation() != incarnation || self.lapsed.load(Ordering::Acquire) {
            return false;
        }
        let d = self.deadline.load(Ordering::Acquire);
        if d == 0 || self.incarnation() != incarnation {
            // (re-checked: a reincarnation between the loads would otherwise
            // lend the new incarnation's deadline to the old one)
            return false;
        }
        if (self.clock.now().as_nanos() as u64) < d {
            return true;
        }
        self.lapsed.store(true, Ordering::Release);
        false
    }

    /// Whether a heartbeat of `incarnation` may still land now: before the
    /// lease's deadline, or — never granted yet — as the first beat of a
    /// fresh incarnation. Unlike [`Lease::valid_for`] this ignores a
    /// [`Lease::revoke`] (the clean-exit record is written after it, while
    /// the deadline still stands) but not time: a heartbeat paused past its
    /// deadline (SIGSTOP, a VM stall) must not land afterwards, because by
    /// then a replacement may own the record (see [`HeartbeatGuard`]).
    pub fn may_heartbeat(&self, incarnation: u64) -> bool {
        let d = self.deadline.load(Ordering::Acquire);
        let ok = if d == 0 {
            !self.lapsed.load(Ordering::Acquire)
        } else {
            (self.clock.now().as_nanos() as u64) < d
        };
        // (re-checked: a reincarnation between the loads would otherwise
        // lend the new incarnation's deadline to the old one)
        ok && self.incarnation() == incarnation
    }

    /// Whether the current incarnation's lease is valid now.
    pub fn valid(&self) -> bool {
        self.valid_for(self.incarnation())
    }

    /// Whether the current incarnation lapsed (and must be replaced).
    pub fn lapsed(&self) -> bool {
        let _ = self.valid();
        self.lapsed.load(Ordering::Acquire) && self.deadline.load(Ordering::Acquire) != 0
    }

    /// A heartbeat that started at `started` completed at `finished`.
    /// Extends the lease only if the lease had not lapsed by `finished`
    /// (the first heartbeat of an incarnation grants it). Returns whether
    /// the lease is valid afterwards.
    pub fn renewed(&self, incarnation: u64, started: Duration, finished: Duration) -> bool {
        if self.incarnation() != incarnation || self.lapsed.load(Ordering::Acquire) {
            return false;
        }
        let d = self.deadline.load(Ordering::Acquire);
        if d != 0 && finished.as_nanos() as u64 >= d {
            self.lapsed.store(true, Ordering::Release);
            return false;
        }
        let new = (started + self.length).as_nanos() as u64;
        if new > d {
            self.deadline.store(new, Ordering::Release);
        }
        self.valid_for(incarnation)
    }

    /// End the lease now (controlled shutdown, before `clean_exit` is
    /// published): nothing acknowledges after this.
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
        self.lapsed.store(true, Ordering::Release);
    }

    /// Whether [`Lease::revoke`] ended the lease: a heartbeat landing after
    /// that is expected, not a fence, and no new incarnation follows.
    pub fn revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// Start a new incarnation (after every holder of the old one stopped).
    pub fn reincarnate(&self, incarnation: u64) {
        self.deadline.store(0, Ordering::Release);
        self.lapsed.store(false, Ordering::Release);
        self.incarnation.store(incarnation, Ordering::Release);
    }

    /// Time left on the lease (zero if lapsed).
    pub fn remaining(&self) -> Duration {
        if !self.valid() {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.deadline.load(Ordering::Acquire)).saturating_sub(self.clock.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lapsed_lease_is_never_revived() {
        let l = Lease::new(Duration::from_millis(50), 1);
        assert!(!l.valid(), "not granted before the first heartbeat");
        let t0 = boot_now();
        assert!(l.renewed(1, t0, boot_now()));
        assert!(l.valid());
        std::thread::sleep(Duration::from_millis(80));
        assert!(!l.valid());
        assert!(l.lapsed());
        let t1 = boot_now();
        assert!(
            !l.renewed(1, t1, boot_now()),
            "a late heartbeat does not revive it"
        );
        assert!(!l.valid());
        l.reincarnate(2);
        assert!(!l.valid_for(1));
        assert!(l.renewed(2, boot_now(), boot_now()));
        assert!(l.valid_for(2) && !l.valid_for(1));
    }

    #[test]
    fn a_lease_on_a_fake_clock_lapses_exactly_at_its_end() {
        use crate::clock::Clock;
        let c = crate::clock::FakeClock::new();
        let l = Lease::with_clock(Duration::from_secs(3), 7, c.clone());
        let t0 = c.now();
        assert!(l.renewed(7, t0, c.now()));
        c.advance(Duration::from_millis(2999));
        assert!(l.valid_for(7));
        assert_eq!(l.remaining(), Duration::from_millis(1));
        c.advance(Duration::from_millis(1));
        assert!(!l.valid_for(7));
        assert!(l.lapsed());
    }

    #[test]
    fn a_heartbeat_that_finishes_after_the_deadline_lapses_the_lease() {
        let l = Lease::new(Duration::from_millis(40), 1);
        let t0 = boot_now();
        assert!(l.renewed(1, t0, t0));
        // A heartbeat that started in time but finished late (a stall).
        let late = t0 + Duration::from_millis(41);
        assert!(!l.renewed(1, t0 + Duration::from_millis(30), late));
        assert!(!l.valid());
    }
}
