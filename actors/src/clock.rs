//! The two clocks the state owners read, behind one seam so the plain logic
//! (commit gate, leases, membership, watcher, controller) can be driven by a
//! [`FakeClock`] in tests.
//!
//! * [`Clock::now`] is monotonic and is what leases are measured on. The
//!   real clock is CLOCK_BOOTTIME: unlike CLOCK_MONOTONIC it keeps counting
//!   through a suspended VM, so a suspended broker wakes with its lease
//!   lapsed (ARCHITECTURE.md, "Design decisions").
//! * [`Clock::now_ms`] is wall-clock milliseconds, used only for segment
//!   ages and retention. It is never compared across hosts and never used
//!   for a lease.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// See module docs.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Monotonic time (CLOCK_BOOTTIME on the real clock).
    fn now(&self) -> Duration;
    /// Wall-clock milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// A clock shared by every owner that needs one.
pub type SharedClock = Arc<dyn Clock>;

/// Nanoseconds on CLOCK_BOOTTIME.
pub fn boot_now() -> Duration {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Wall-clock milliseconds (segment ages and retention only).
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The host's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealClock;

impl Clock for RealClock {
    fn now(&self) -> Duration {
        boot_now()
    }
    fn now_ms(&self) -> i64 {
        wall_ms()
    }
}

/// The real clock, shared.
pub fn real() -> SharedClock {
    Arc::new(RealClock)
}

/// A clock that moves only when told to (tests). Both readings advance
/// together; it starts at a non-zero monotonic instant because 0 means
/// "never" in several places (a lease deadline, a poll tick).
#[derive(Debug)]
pub struct FakeClock {
    mono_ns: AtomicU64,
    wall_ms: AtomicI64,
}

impl Default for FakeClock {
    fn default() -> Self {
        Self {
            mono_ns: AtomicU64::new(1_000_000_000),
            wall_ms: AtomicI64::new(1_700_000_000_000),
        }
    }
}

impl FakeClock {
    /// A fake clock at an arbitrary fixed instant, shared.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Move both readings forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.mono_ns
            .fetch_add(d.as_nanos() as u64, Ordering::AcqRel);
        self.wall_ms
            .fetch_add(d.as_millis() as i64, Ordering::AcqRel);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.mono_ns.load(Ordering::Acquire))
    }
    fn now_ms(&self) -> i64 {
        self.wall_ms.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fake_clock_moves_only_when_advanced() {
        let c = FakeClock::new();
        let (t0, w0) = (c.now(), c.now_ms());
        assert_eq!((c.now(), c.now_ms()), (t0, w0));
        c.advance(Duration::from_millis(1500));
        assert_eq!(c.now() - t0, Duration::from_millis(1500));
        assert_eq!(c.now_ms() - w0, 1500);
    }

    #[test]
    fn the_real_monotonic_clock_does_not_go_back() {
        let a = RealClock.now();
        assert!(RealClock.now() >= a);
    }
}
