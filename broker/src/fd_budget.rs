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
//! The split bounds the connection count; what guarantees the control
//! plane its descriptors is a count of everything else. Every data-plane
//! descriptor — a segment, index, manifest or snapshot file, a coordinator
//! shard log, a listing or directory fsync of a recovery, a Kafka or HTTP
//! connection, the duplicate a sendfile writes through, a peer connection —
//! takes a permit of one broker-wide [`kaas_volume::fs::FdBudget`] before
//! its syscall and holds it as long as the descriptor lives (files through
//! [`kaas_volume::fs::BudgetedFs`]). The budget's cap is the limit less
//! [`control_reserve`] less what the runtime holds once started
//! ([`calibrate`]), so a burst of any of them is refused with a retriable
//! error (a produce answered KAFKA_STORAGE_ERROR, a partition open retried,
//! a connection closed) and the heartbeat, the watcher and the controller,
//! which open through the uncounted seam, always find theirs.

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

/// Descriptors kept for the control plane (the heartbeat, the watcher,
/// the controller) out of `limit`: a sixteenth, 16..=256. They use a few at
/// once (a heartbeat two, the watcher and the controller one or two each);
/// the rest covers the two sockets an accept holds before it can be
/// refused (Kafka and HTTP listeners, one each).
pub fn control_reserve(limit: u64) -> u64 {
    (limit / 16).clamp(16, 256)
}

/// Descriptors opened after the first estimate that are not the data
/// plane's (the event loops, two per arbiter, of the threads the broker
/// starts after it, and slack): 64, or an eighth of a small limit.
fn startup_margin(limit: u64) -> u64 {
    (limit / 8).min(64)
}

/// The data-plane budget's cap: the limit, less the control plane's
/// reserve, less every descriptor open now that is not the data plane's
/// (`held` of `open` are).
pub fn data_plane_cap(p: &FdPlan, open: u64, held: u64) -> usize {
    p.limit
        .saturating_sub(control_reserve(p.limit))
        .saturating_sub(open.saturating_sub(held)) as usize
}

/// The data plane's budget, sized for now: before the broker's threads and
/// listeners exist, with a margin for them; [`calibrate`] sets it exactly.
pub fn data_plane_budget(p: &FdPlan) -> std::sync::Arc<kaas_volume::fs::FdBudget> {
    let open = open_fds().unwrap_or(0) + startup_margin(p.limit);
    kaas_volume::fs::FdBudget::new(data_plane_cap(p, open, 0))
}

/// Once everything the broker runs is started: the cap is the limit less
/// the control plane's reserve less what the runtime itself holds now (every
/// open descriptor not counted in the budget). Logged at INFO.
pub fn calibrate(p: &FdPlan, budget: &kaas_volume::fs::FdBudget) {
    // The data plane may be opening files meanwhile (coordinator shards at
    // start): a permit is taken before its descriptor exists, so a count
    // read while permits rise would take the runtime for smaller than it
    // is. Read the permits on both sides of the count, subtract the
    // smaller, and keep the largest runtime of a few reads: never an
    // overestimate of the cap.
    let mut runtime = None;
    for i in 0..8 {
        if i > 0 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let before = budget.held() as u64;
        let Ok(open) = open_fds() else { break };
        let held = before.min(budget.held() as u64);
        runtime = runtime.max(Some(open.saturating_sub(held)));
    }
    let Some(runtime) = runtime else {
        tracing::warn!("cannot count open descriptors (/proc/self/fd); the data-plane budget keeps its start-up estimate");
        return;
    };
    let cap = data_plane_cap(p, runtime, 0);
    budget.set_cap(cap);
    tracing::info!(
        limit = p.limit,
        control_plane_reserve = control_reserve(p.limit),
        runtime,
        data_plane_cap = cap,
        "descriptor budget: data-plane files and sockets are refused past the cap"
    );
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

    #[test]
    fn the_control_plane_keeps_its_reserve() {
        let p = plan(256, 10_000).unwrap();
        assert_eq!(control_reserve(256), 16);
        assert_eq!(control_reserve(1 << 20), 256);
        // 40 open, 10 of them the data plane's: the runtime holds 30.
        assert_eq!(data_plane_cap(&p, 40, 10), 256 - 16 - 30);
        let b = data_plane_budget(&p);
        assert!(b.cap() < 256 - 16, "{}", b.cap());
        calibrate(&p, &b);
        let open = open_fds().unwrap();
        assert!(
            b.cap() as u64 + open <= 256 - 16 + 2,
            "{} + {open}",
            b.cap()
        );
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
