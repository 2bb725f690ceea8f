//! The data volume's free-space reserve: the control plane before the data.
//!
//! When the cluster directory (heartbeats, the assignment, controller
//! epochs, coordinator shards) lives on the same filesystem as the
//! partition logs, a producer that fills the volume would take the
//! broker's heartbeat with it: the lease lapses and every partition —
//! reads included — moves or goes dark. So while the volume's free space
//! is below `--data-reserve-bytes`, Produce is refused with
//! KAFKA_STORAGE_ERROR before anything is written, and the cluster files
//! can still be written from the reserve. With the cluster directory on a
//! filesystem of its own the reserve does not apply (the data volume may
//! fill to the last byte; a full write is refused and undone by the
//! partition, which stays up).
//!
//! Free space is sampled (`statvfs`) on a thread of its own every
//! [`SAMPLE`] while it is within [`FAST_WITHIN`] reserves of the reserve,
//! else every [`SLOW_SAMPLE`] (a `statvfs` is a round trip on NFS; an idle
//! broker far from full need not make ten a second). The slow period
//! covers the same write rate as the fast one: 16 reserves of headroom
//! in a second against one reserve in 100 ms. On a hard NFS mount a `statvfs` can block, and it must block
//! nobody but itself. A blocked sampler keeps its last answer. Between two
//! samples every admitted produce is counted against the last one, so a
//! fast producer on this broker cannot write through the reserve within a
//! sample period; other brokers' writes to the same volume are seen at the
//! next sample, so size the reserve above what the whole cluster writes in
//! [`SAMPLE`] plus what the cluster files need (the 64 MiB default covers
//! ~500 MB/s).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often free space is sampled near the reserve.
pub const SAMPLE: Duration = Duration::from_millis(100);
/// How often free space is sampled far from the reserve.
pub const SLOW_SAMPLE: Duration = Duration::from_secs(1);
/// "Near": free space below this many reserves (the reserve included).
pub const FAST_WITHIN: u64 = 17;

/// See module docs.
#[derive(Debug)]
pub struct Reserve {
    dir: PathBuf,
    bytes: u64,
    applies: bool,
    below: AtomicBool,
    free: AtomicU64,
    /// Bytes admitted since the last sample.
    since: AtomicU64,
}

impl Reserve {
    /// A reserve of `bytes` on the filesystem of `data`; it applies only if
    /// `cluster` is on that same filesystem (and `bytes` > 0).
    pub fn new(data: &Path, cluster: &Path, bytes: u64) -> Self {
        let applies = bytes > 0 && same_filesystem(data, cluster).unwrap_or(true);
        Self {
            dir: data.to_path_buf(),
            bytes,
            applies,
            below: AtomicBool::new(false),
            free: AtomicU64::new(u64::MAX),
            since: AtomicU64::new(0),
        }
    }

    /// Whether the reserve is enforced at all.
    pub fn applies(&self) -> bool {
        self.applies
    }

    /// Whether Produce must be refused now.
    pub fn below(&self) -> bool {
        self.below.load(Ordering::Relaxed)
    }

    /// Admit a produce of `len` bytes, or refuse it (false) because the
    /// volume would go below the reserve: counted against the last sample
    /// together with everything admitted since.
    pub fn admit(&self, len: u64) -> bool {
        if !self.applies {
            return true;
        }
        if self.below() {
            return false;
        }
        let used = self.since.fetch_add(len, Ordering::Relaxed) + len;
        if self.free.load(Ordering::Relaxed).saturating_sub(used) < self.bytes {
            self.since.fetch_sub(len, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Free bytes at the last sample (for /metrics).
    pub fn free_bytes(&self) -> u64 {
        self.free.load(Ordering::Relaxed)
    }

    /// Sample once. A failed `statvfs` keeps the previous answer.
    pub fn sample(&self) {
        // What was admitted before this sample is (about to be) in it.
        let admitted = self.since.load(Ordering::Relaxed);
        let Ok(st) = rustix::fs::statvfs(&self.dir) else {
            return;
        };
        self.since.fetch_sub(admitted, Ordering::Relaxed);
        let free = st.f_bavail.saturating_mul(st.f_frsize);
        self.free.store(free, Ordering::Relaxed);
        let below = self.applies && free < self.bytes;
        tracing::debug!(free, admitted, below, "reserve sample");
        if self.below.swap(below, Ordering::Relaxed) != below {
            if below {
                tracing::error!(dir = %self.dir.display(), free, reserve = self.bytes, "data volume below its reserve: produce refused (KAFKA_STORAGE_ERROR) so that the cluster files can still be written");
            } else {
                tracing::info!(dir = %self.dir.display(), free, reserve = self.bytes, "data volume above its reserve again: produce accepted");
            }
        }
    }

    /// The period until the next sample (see module docs).
    pub fn period(&self) -> Duration {
        let free = self
            .free_bytes()
            .saturating_sub(self.since.load(Ordering::Relaxed));
        if self.applies && free < self.bytes.saturating_mul(FAST_WITHIN) {
            SAMPLE
        } else {
            SLOW_SAMPLE
        }
    }

    /// Sample now and then every [`Self::period`] on a thread of its own,
    /// for the life of the process.
    pub fn start(self: &Arc<Self>) -> std::io::Result<()> {
        self.sample();
        let me = self.clone();
        std::thread::Builder::new()
            .name("kaas-reserve".into())
            .spawn(move || loop {
                std::thread::sleep(me.period());
                me.sample();
            })
            .map(|_| ())
    }
}

/// Whether `a` and `b` are on one filesystem (same device).
fn same_filesystem(a: &Path, b: &Path) -> std::io::Result<bool> {
    let (sa, sb) = (rustix::fs::stat(a)?, rustix::fs::stat(b)?);
    Ok(sa.st_dev == sb.st_dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applies_only_when_the_cluster_files_share_the_volume() {
        let d = tempfile::tempdir().unwrap();
        let r = Reserve::new(d.path(), d.path(), u64::MAX);
        assert!(r.applies());
        r.sample();
        assert!(r.below(), "no volume has u64::MAX bytes free");
        assert!(!r.admit(1));
        let r = Reserve::new(d.path(), d.path(), 0);
        r.sample();
        assert!(!r.applies() && !r.below(), "0 disables it");
        assert!(r.admit(u64::MAX));
        // Between samples, admitted bytes count against the last one.
        let r = Reserve::new(d.path(), d.path(), 1 << 20);
        r.sample();
        let free = r.free_bytes();
        assert!(free > 4 << 20, "test volume has room");
        let room = free - (1 << 20);
        assert!(r.admit(room / 2));
        assert!(!r.admit(room / 2 + 4096), "would cross the reserve");
        assert!(r.admit(room / 4));
        // Far from the reserve the slow period; near it (what was admitted
        // since the sample counted) the fast one.
        let r = Reserve::new(d.path(), d.path(), 1 << 20);
        r.sample();
        let free = r.free_bytes();
        if free > FAST_WITHIN << 20 {
            assert_eq!(r.period(), SLOW_SAMPLE, "far from the reserve");
        }
        assert!(r.admit(free - (8 << 20)));
        assert_eq!(r.period(), SAMPLE, "within 8 reserves");
        // /proc is another filesystem than any tempdir.
        let r = Reserve::new(d.path(), Path::new("/proc"), u64::MAX);
        assert!(!r.applies());
        r.sample();
        assert!(!r.below());
        assert!(r.free_bytes() < u64::MAX);
    }
}
