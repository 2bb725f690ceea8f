//! The file-descriptor budget: raise the soft `RLIMIT_NOFILE` to the hard
//! limit at start, then split the limit between files and connections so a
//! flood of connections can never take the descriptors the heartbeat, the
//! assignment watcher and the partition logs need.
//!
//! The rule, kept simple enough to state in one line: half the limit (at
//! least [`MIN_RESERVE`]) is reserved for files — segments of led
//! partitions, the cluster directory, listeners, the runtime — and
//! connections get the rest, never more than `--max-connections`. A
//! connection beyond the budget is closed at accept. Why warn rather than
//! refuse when `--max-connections` does not fit: the default (10,000) would
//! otherwise stop every broker on a host whose hard limit is 4,096; a
//! smaller cap that keeps the lease safe is what such an operator wants, and
//! the warning names both numbers. The broker refuses to start only when
//! the limit leaves fewer than [`MIN_CONNECTIONS`] connections: it could
//! not serve anyone.
//!
//! The split bounds what each side holds in the steady state, not in a
//! burst: a connection evicted for a new one keeps its socket until its
//! task runs, and a burst of accepts can run ahead of those closes. So the
//! accept loop also asks an [`FdGuard`] before keeping a connection: while
//! fewer than [`FdGuard::keep`] descriptors are free (counted in
//! `/proc/self/fd`, sampled at most every [`FdGuard::SAMPLE`], with every
//! accept since counted as taken), new connections are closed at once, so
//! the heartbeat, the watcher and the controller always find a descriptor.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Descriptors always kept for files, however small the limit.
pub const MIN_RESERVE: u64 = 64;
/// Fewest connections a broker must be able to serve to start at all.
pub const MIN_CONNECTIONS: u64 = 16;
/// Soft limit aimed for when the hard limit is "unlimited" (Linux refuses
/// an infinite `RLIMIT_NOFILE`; this is the kernel's default `nr_open`).
const UNLIMITED_TARGET: u64 = 1 << 20;

/// How the descriptor limit is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdPlan {
    /// The soft limit in force.
    pub limit: u64,
    /// Kept for files.
    pub reserve: u64,
    /// Connections served at most (`--max-connections` or less).
    pub connections: usize,
    /// Whether `--max-connections` had to be lowered to fit.
    pub capped: bool,
}

/// Why the broker cannot start with this limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the file-descriptor limit ({limit}) leaves {available} for connections after {reserve} kept for files; raise it (ulimit -n, LimitNOFILE=, or the container's nofile limit) to at least {needed}")]
pub struct FdBudgetError {
    /// The soft limit in force.
    pub limit: u64,
    /// Kept for files.
    pub reserve: u64,
    /// What is left for connections.
    pub available: u64,
    /// The smallest limit that would do.
    pub needed: u64,
}

/// Split `limit` descriptors between files and at most `max_connections`
/// connections (see the module docs).
pub fn plan(limit: u64, max_connections: usize) -> Result<FdPlan, FdBudgetError> {
    let reserve = (limit / 2).max(MIN_RESERVE);
    let available = limit.saturating_sub(reserve);
    if available < MIN_CONNECTIONS {
        return Err(FdBudgetError {
            limit,
            reserve,
            available,
            needed: (MIN_RESERVE + MIN_CONNECTIONS).max(2 * MIN_CONNECTIONS),
        });
    }
    let connections = (max_connections as u64).min(available) as usize;
    Ok(FdPlan {
        limit,
        reserve,
        connections,
        capped: connections < max_connections,
    })
}

/// Default cap on open segment files: half of what is kept for files (a
/// quarter of the limit), leaving the other half for the cluster directory,
/// index and snapshot writes, listeners and the runtime; within 32..4096,
/// since past a few thousand the open files only cost descriptors and
/// kernel memory, not speed (a reopen is one `open`).
pub fn segment_file_cap(p: &FdPlan) -> usize {
    (p.reserve / 2).clamp(32, 4096) as usize
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit. Returns (before,
/// after) soft limits; a refused raise keeps the old limit (logged).
pub fn raise_nofile() -> (u64, u64) {
    let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
    let before = current.unwrap_or(UNLIMITED_TARGET);
    let target = maximum.unwrap_or(UNLIMITED_TARGET);
    if target <= before {
        return (before, before);
    }
    match setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(target),
            maximum,
        },
    ) {
        Ok(()) => (before, target),
        Err(e) => {
            tracing::warn!(soft = before, hard = target, error = %e, "could not raise the file-descriptor limit");
            (before, before)
        }
    }
}

/// Raise the limit, plan the budget and log it at INFO (WARN when
/// `--max-connections` had to be lowered).
pub fn apply(max_connections: usize) -> Result<FdPlan, FdBudgetError> {
    let (before, after) = raise_nofile();
    let p = plan(after, max_connections)?;
    tracing::info!(
        soft_before = before,
        limit = p.limit,
        reserved_for_files = p.reserve,
        max_connections = p.connections,
        "file-descriptor budget"
    );
    if p.capped {
        tracing::warn!(
            requested = max_connections,
            serving = p.connections,
            limit = p.limit,
            "--max-connections does not fit in the file-descriptor limit; connections beyond the budget are closed at accept"
        );
    }
    Ok(p)
}

/// Keeps descriptors free for the control plane (see the module docs).
/// Used by the accept loop only (one thread): not `Sync`.
#[derive(Debug)]
pub struct FdGuard {
    limit: u64,
    keep: u64,
    /// Free at the last sample, and when it was taken.
    free: u64,
    sampled: Option<std::time::Instant>,
    /// Connections kept since the sample (each holds a descriptor).
    taken: u64,
}

impl FdGuard {
    /// How stale a sample may be.
    pub const SAMPLE: std::time::Duration = std::time::Duration::from_millis(100);

    /// A guard keeping [`Self::keep_for`]`(limit)` of `limit` descriptors free.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            keep: Self::keep_for(limit),
            free: limit,
            sampled: None,
            taken: 0,
        }
    }

    /// Descriptors always left free: a sixteenth of the limit, 16..=256
    /// (a heartbeat takes two at once; the watcher and controller one each).
    pub fn keep_for(limit: u64) -> u64 {
        (limit / 16).clamp(16, 256)
    }

    /// Descriptors kept free.
    pub fn keep(&self) -> u64 {
        self.keep
    }

    /// Whether a connection just accepted may be kept: `false` while fewer
    /// than `keep` descriptors would be free. With `/proc` unreadable
    /// every connection is kept (the budget still bounds them).
    pub fn admit(&mut self, now: std::time::Instant) -> bool {
        if self
            .sampled
            .is_none_or(|t| now.duration_since(t) >= Self::SAMPLE)
        {
            match open_fds() {
                Ok(open) => {
                    self.free = self.limit.saturating_sub(open);
                    self.taken = 0;
                    self.sampled = Some(now);
                }
                Err(_) => return true,
            }
        }
        if self.free.saturating_sub(self.taken) <= self.keep {
            return false;
        }
        self.taken += 1;
        true
    }
}

/// Descriptors this process has open now.
fn open_fds() -> std::io::Result<u64> {
    Ok(std::fs::read_dir("/proc/self/fd")?.count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_the_limit_is_kept_for_files() {
        let p = plan(1024, 10_000).unwrap();
        assert_eq!((p.reserve, p.connections, p.capped), (512, 512, true));
        let p = plan(1 << 20, 10_000).unwrap();
        assert_eq!((p.connections, p.capped), (10_000, false));
        let p = plan(256, 10_000).unwrap();
        assert_eq!((p.reserve, p.connections), (128, 128));
    }

    #[test]
    fn the_segment_file_cap_fits_in_the_files_reserve() {
        let p = plan(1024, 10_000).unwrap();
        assert_eq!(segment_file_cap(&p), 256);
        assert!(segment_file_cap(&p) < p.reserve as usize);
        assert_eq!(segment_file_cap(&plan(1 << 20, 10_000).unwrap()), 4096);
        assert_eq!(segment_file_cap(&plan(128, 10).unwrap()), 32);
    }

    #[test]
    fn a_limit_too_small_to_serve_is_refused() {
        let e = plan(70, 10_000).unwrap_err();
        assert_eq!((e.reserve, e.available), (64, 6));
        assert!(e.to_string().contains("ulimit -n"), "{e}");
        assert!(plan(e.needed, 10).is_ok());
    }

    /// Catches: connections accepted until the process runs out of
    /// descriptors (the heartbeat then fails with EMFILE).
    #[test]
    fn the_guard_keeps_descriptors_free() {
        use std::time::Instant;
        let open = open_fds().unwrap();
        let now = Instant::now();
        // Room for exactly 5 more before the 16 kept.
        let mut g = FdGuard::new(open + 16 + 5);
        assert_eq!(g.keep(), 16);
        // (other tests open files meanwhile: at most 5, at least one)
        let n = (0..10).filter(|_| g.admit(now)).count();
        assert!((1..=5).contains(&n), "{n}");
        // Within the sample period nothing more, whatever closes.
        assert!(!g.admit(now));
        // A new sample sees what is really open.
        let later = now + FdGuard::SAMPLE;
        let mut g = FdGuard::new(open + 100);
        assert!(g.admit(later));
        assert_eq!(FdGuard::keep_for(256), 16);
        assert_eq!(FdGuard::keep_for(1 << 20), 256);
    }

    #[test]
    fn raising_never_lowers_the_limit() {
        let (before, after) = raise_nofile();
        assert!(after >= before);
        assert_eq!(
            getrlimit(Resource::Nofile)
                .current
                .unwrap_or(UNLIMITED_TARGET),
            after
        );
    }
}
