//! The partition log as a plain-Rust state machine (no actix): segments,
//! manifest, recovery, group-commit bookkeeping, roll and retention. The
//! [`super::leader::PartitionLeader`] actor is a thin adapter around it.
//!
//! On disk, under `<data>/<topic>/<partition>/`:
//! * `<base:020>-e<epoch>.log` — append-only RecordBatch v2 bytes, offsets and
//!   partition leader epoch assigned by the leader that owns the file;
//! * `<base:020>-e<epoch>.index` / `.timeindex` — sparse indexes, written once
//!   at seal;
//! * `manifest-e<epoch>.json` — the list of segments and their valid lengths;
//! * `<offset:020>-e<epoch>.producers` — idempotent-producer state as of
//!   `offset` ([`super::producers`]), written at each roll and clean close;
//!   open loads the newest usable one and replays the batch headers after it;
//! * `<base:020>-e<epoch>.txnindex` — the aborted transactions whose ABORT
//!   marker lies in the segment ([`super::txn_index`]), written at seal when
//!   the segment holds markers, rebuilt from the segment's bytes when missing.
//!
//! Transactions: the log tracks every open transaction (its first offset)
//! as of what is written, and publishes the last stable offset — the first
//! offset of the earliest transaction still open *as of the high
//! watermark*, or the high watermark — with each completed fsync, so a
//! marker counts only once it is durable.
//!
//! Invariants:
//! * Only the leader of epoch E writes files named `-e<E>`; a file of another
//!   epoch is never modified, only read up to the length the manifest records.
//! * The manifest is written (atomically) before a segment it names is
//!   created, and before a segment it drops is unlinked, so a crash between
//!   steps leaves only unlisted files, which the next open removes.
//! * Readers never see past the high watermark, which only moves after fsync.

use super::claim::{self, parse_claim_name, ClaimOwner, EpochWriter};
use super::files::{FileSlot, Handle, OpenFiles};
use super::index::{header_at, scan, Index, Scan, ScanStart};
use super::manifest::{manifest_name, parse_manifest_name, write_manifest, Manifest, SegmentEntry};
use super::producers::{self, Incoming, ProducerStates, SequenceError, Verdict};
use super::txn_index::{self, AbortedTxn};
use kaas_protocol::batch::{patch_batch, read_batch_header, BatchInfo, PATCHED_HEAD};
use kaas_volume::fs::{
    remove_if_exists, remove_stale_temps, write_atomic, Fs, GuardedFs, ReadFile, ReadFs, ReadOnly,
    SharedFs, WriteFile, WriteGuard,
};
use kaas_volume::layout::{self, SegmentKind};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// Who claimed `epoch` of the partition in `dir`, if readable: named in a
/// fence so the controller can release that leader before granting above.
fn claim_owner(fs: &dyn kaas_volume::fs::Fs, dir: &Path, epoch: i32) -> Option<ClaimOwner> {
    claim::owner_of(fs, dir, epoch).ok().flatten().flatten()
}

/// Create the log file `path` of a new active segment in `dir`. If it
/// already exists it was left by an earlier attempt of this same step (the
/// file carries our epoch, and the manifest naming it was written by us), so
/// it is ours: truncate it to empty and fsync the truncation, so that a
/// power loss cannot bring back bytes past what the manifest records. Then
/// fsync the directory so the new name is durable.
pub(crate) fn create_or_truncate_segment(
    fs: &dyn Fs,
    dir: &Path,
    path: &Path,
) -> io::Result<Arc<dyn WriteFile>> {
    let f = match fs.create_exclusive(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let f = fs.open_write(path)?;
            f.set_len(0)?;
            f.sync_data()?;
            f
        }
        Err(e) => return Err(e),
    };
    fs.sync_dir(dir)?;
    Ok(f)
}

/// Leader-epoch claims this many epochs below the current one are kept;
/// older ones are swept at open.
pub const CLAIMS_KEPT: i32 = 16;

/// Per-partition storage settings (Kafka topic config names in comments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// segment.bytes
    pub segment_bytes: u64,
    /// segment.ms
    pub segment_ms: i64,
    /// retention.ms (-1 = forever)
    pub retention_ms: i64,
    /// retention.bytes (-1 = unlimited)
    pub retention_bytes: i64,
    /// index.interval.bytes
    pub index_interval_bytes: u64,
    /// Write an active-segment checkpoint to the manifest after this many
    /// bytes, bounding how much recovery has to CRC-scan.
    pub checkpoint_bytes: u64,
    /// producer.id.expiration.ms: an idempotent producer not seen for this
    /// long is forgotten (at the next snapshot).
    pub producer_id_expiration_ms: i64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 3600 * 1000,
            retention_ms: 7 * 24 * 3600 * 1000,
            retention_bytes: -1,
            index_interval_bytes: 4096,
            checkpoint_bytes: 64 << 20,
            producer_id_expiration_ms: producers::DEFAULT_EXPIRATION_MS,
        }
    }
}

/// Errors of the log. The actor maps them to Kafka error codes.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A filesystem call failed; the actor stops and its restart recovers.
    #[error("storage i/o: {0}")]
    Io(#[from] io::Error),
    /// A newer leader epoch owns this partition: we are a zombie.
    #[error("fenced: partition owned by epoch {found}, ours is {ours}")]
    Fenced {
        /// Our epoch.
        ours: i32,
        /// The epoch found on disk.
        found: i32,
        /// Who claimed `found`, when that is what fenced us (another
        /// leader granted the same epoch) and the claim is readable.
        owner: Option<ClaimOwner>,
    },
    /// The manifest could not be parsed.
    #[error("corrupt manifest {path}: {reason}")]
    CorruptManifest {
        /// Manifest path.
        path: PathBuf,
        /// Parser error.
        reason: String,
    },
    /// The directory listing named a manifest that an open by exact name
    /// cannot find: this host's view of the directory is stale (an NFS
    /// client's cached listing, or a negative lookup entry hiding the
    /// newer manifest that replaced it). Nothing was written; the open is
    /// re-driven until the caches expire, and no partition state is at
    /// fault.
    #[error("stale directory view: {path} was listed but is gone")]
    StaleView {
        /// The manifest the listing named.
        path: PathBuf,
    },
    /// The partition's topic directory is not there: deleted, or not yet
    /// visible to this host (an NFS client's cached "no such file", or its
    /// stale handle of the directory the name had before, for a topic
    /// re-created under its name by another host). Nothing was written;
    /// not a storage fault.
    #[error("topic directory {path} not visible (deleted, or this host's view of it is stale)")]
    TopicDirMissing {
        /// The topic directory looked up.
        path: PathBuf,
    },
    /// The data directory's stamp does not name this broker's cluster
    /// (another cluster's, or none): nothing was claimed or written.
    #[error(
        "data directory stamp {stamp} names cluster {found}, not ours ({ours}): refusing to write"
    )]
    ForeignVolume {
        /// The stamp file.
        stamp: PathBuf,
        /// Our cluster id.
        ours: String,
        /// What the stamp names ("none" when absent or empty).
        found: String,
    },
    /// Offsets would overflow i64 / a segment would exceed u32 positions.
    #[error("offset overflow")]
    Overflow,
    /// The volume is full (ENOSPC / EDQUOT) and the append was rolled back:
    /// the log is exactly as before it, and the next append may succeed
    /// once space returns. Not a reason to restart.
    #[error("no space left on the data volume: {0}")]
    NoSpace(io::Error),
    /// An idempotent batch failed its sequence or epoch check; nothing was
    /// written (a client error, not a storage failure).
    #[error("{0}")]
    Sequence(#[from] SequenceError),
}

impl LogError {
    /// Whether the volume was full (ENOSPC / EDQUOT), whichever step met it.
    pub fn is_no_space(&self) -> bool {
        match self {
            LogError::NoSpace(_) => true,
            LogError::Io(e) => is_no_space(e),
            _ => false,
        }
    }
}

/// `e` as a [`LogError`]: [`LogError::NoSpace`] for a full volume.
fn no_space(e: io::Error) -> LogError {
    if is_no_space(&e) {
        LogError::NoSpace(e)
    } else {
        LogError::Io(e)
    }
}

/// Whether `e` says the volume (or the quota) is full.
pub fn is_no_space(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull
        || e.kind() == io::ErrorKind::QuotaExceeded
        || matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// A segment as readers see it.
pub struct SegView {
    /// First offset.
    pub base: i64,
    /// Owning leader epoch.
    pub epoch: i32,
    dir: PathBuf,
    /// The read handle, opened on demand and closed when idle or past
    /// the cap ([`super::files`]).
    file: Arc<FileSlot>,
    size: AtomicU64,
    next_offset: AtomicI64,
    max_ts: AtomicI64,
    max_ts_pos: AtomicU64,
    live_index: Mutex<Option<Index>>,
    sealed_index: OnceLock<Arc<Index>>,
    interval: u64,
    /// Aborted transactions whose marker lies in this segment: kept live
    /// for the active segment (entries past the high watermark are not yet
    /// durable: readers filter them), loaded on first use for a sealed one.
    aborted: RwLock<Option<Vec<AbortedTxn>>>,
    /// May hold transaction markers ([`SegmentEntry::markers`]).
    markers: std::sync::atomic::AtomicBool,
}

impl SegView {
    fn new(dir: &Path, e: &SegmentEntry, interval: u64, files: &Arc<OpenFiles>) -> Self {
        Self {
            base: e.base,
            epoch: e.epoch,
            dir: dir.to_path_buf(),
            file: FileSlot::new(files.clone()),
            size: AtomicU64::new(e.size),
            next_offset: AtomicI64::new(e.next_offset),
            max_ts: AtomicI64::new(e.max_ts),
            max_ts_pos: AtomicU64::new(e.max_ts_pos),
            live_index: Mutex::new(None),
            sealed_index: OnceLock::new(),
            interval,
            aborted: RwLock::new(None),
            markers: std::sync::atomic::AtomicBool::new(e.markers),
        }
    }

    /// Whether the segment may hold transaction markers.
    pub fn markers(&self) -> bool {
        self.markers.load(Ordering::Acquire)
    }

    /// The aborted transactions whose marker lies in this segment (see
    /// [`Self::aborted`]): for a sealed segment from its `.txnindex`, or,
    /// when that is missing, torn or describes another length, from the
    /// segment's own bytes (one pass over its batch headers), then kept.
    pub fn aborted_txns(&self, fs: &ReadFs) -> io::Result<Vec<AbortedTxn>> {
        if let Some(a) = self.aborted.read().unwrap().as_ref() {
            return Ok(a.clone());
        }
        if !self.markers() {
            // No marker was ever written into it: nothing to read.
            return Ok(Vec::new());
        }
        let path = self
            .dir
            .join(layout::segment_txnindex(self.base, self.epoch));
        let from_file = match fs.read(&path) {
            Ok(b) => txn_index::decode(&b, self.next_offset()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let list = match from_file {
            Some(l) => l,
            None => txn_index::scan_segment(self.file(fs)?.as_ref(), self.size())?,
        };
        let mut slot = self.aborted.write().unwrap();
        Ok(slot.get_or_insert(list).clone())
    }

    /// Durable valid bytes.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
    /// One past the last durable offset.
    pub fn next_offset(&self) -> i64 {
        self.next_offset.load(Ordering::Acquire)
    }
    /// Largest batch timestamp (-1 if empty).
    pub fn max_ts(&self) -> i64 {
        self.max_ts.load(Ordering::Acquire)
    }
    /// Position of the batch with the largest timestamp.
    pub fn max_ts_pos(&self) -> u64 {
        self.max_ts_pos.load(Ordering::Acquire)
    }
    /// Path of the `.log` file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(layout::segment_log(self.base, self.epoch))
    }

    /// A refcounted read handle, opened on demand (an idle partition holds
    /// no descriptor): the holder keeps the descriptor however long it
    /// holds the handle, even when the slot closes meanwhile (a sendfile
    /// from it stays valid).
    pub fn file(&self, fs: &ReadFs) -> io::Result<Arc<dyn ReadFile>> {
        let path = self.log_path();
        Ok(
            match self.file.get(|| fs.open_read(&path).map(Handle::Read))? {
                Handle::Read(f) => f,
                Handle::Write(f) => f as Arc<dyn ReadFile>,
            },
        )
    }

    fn index_of_sealed(&self, fs: &ReadFs) -> io::Result<Arc<Index>> {
        if let Some(ix) = self.sealed_index.get() {
            return Ok(ix.clone());
        }
        let idx = fs.read(&self.dir.join(layout::segment_index(self.base, self.epoch)));
        let tim = fs.read(
            &self
                .dir
                .join(layout::segment_timeindex(self.base, self.epoch)),
        );
        let ix = match (idx, tim) {
            (Ok(a), Ok(b)) => Index::decode(&a, &b, self.interval),
            _ => None,
        };
        let ix = match ix {
            Some(ix) => ix,
            None => {
                // Missing or torn index: rebuild from the log (always correct).
                let mut ix = Index::new(self.interval);
                let f = self.file(fs)?;
                let start = ScanStart {
                    pos: 0,
                    next_offset: self.base,
                    max_ts: -1,
                    max_ts_pos: 0,
                    verify_from: u64::MAX,
                };
                scan(f.as_ref(), self.base, start, self.size(), &mut ix)?;
                ix
            }
        };
        Ok(self.sealed_index.get_or_init(|| Arc::new(ix)).clone())
    }

    /// Position to start scanning for `offset`.
    pub fn lookup_offset(&self, fs: &ReadFs, offset: i64) -> io::Result<u64> {
        let rel = (offset - self.base).clamp(0, u32::MAX as i64) as u32;
        if let Some(ix) = self.live_index.lock().unwrap().as_ref() {
            return Ok(ix.lookup_offset(rel));
        }
        Ok(self.index_of_sealed(fs)?.lookup_offset(rel))
    }

    /// Position to start scanning for the first batch with max ts >= `ts`.
    pub fn lookup_time(&self, fs: &ReadFs, ts: i64) -> io::Result<u64> {
        if let Some(ix) = self.live_index.lock().unwrap().as_ref() {
            return Ok(ix.lookup_time(ts));
        }
        Ok(self.index_of_sealed(fs)?.lookup_time(ts))
    }

    fn entry(&self, sealed: bool, created_ms: i64) -> SegmentEntry {
        SegmentEntry {
            base: self.base,
            epoch: self.epoch,
            sealed,
            size: self.size(),
            next_offset: self.next_offset(),
            max_ts: self.max_ts(),
            max_ts_pos: self.max_ts_pos(),
            created_ms,
            markers: self.markers(),
        }
    }
}

/// The read-mostly state shared with fetch and list-offsets readers.
pub struct LogView {
    /// First offset still in the log.
    pub log_start_offset: i64,
    /// One past the last durable offset; readers never go past it.
    pub high_watermark: i64,
    /// Current leader epoch.
    pub epoch: i32,
    /// (epoch, start offset) ascending.
    pub epoch_history: Vec<(i32, i64)>,
    /// Segments in offset order, the last one active.
    pub segments: Vec<Arc<SegView>>,
    /// Last stable offset: the first offset of the earliest transaction
    /// open as of the high watermark, or the high watermark.
    pub last_stable_offset: i64,
}

/// What an fsync has to cover; taken by [`PartitionLog::sync_target`] and
/// handed back to [`PartitionLog::complete_sync`] once the fsync succeeded.
pub struct SyncTarget {
    /// The active segment's handle (held open until the fsync is done).
    pub file: Arc<dyn WriteFile>,
    /// The successor probe: the seam and the next epoch's claim.
    successor: Option<(SharedFs, PathBuf, i32)>,
    seg: Arc<SegView>,
    /// Bytes written when the target was taken.
    pub pos: u64,
    /// Next offset when the target was taken.
    pub next_offset: i64,
    max_ts: i64,
    max_ts_pos: u64,
}

impl SyncTarget {
    /// fsync the active segment, then look up the next epoch's claim by
    /// exact name: what this fsync made durable may only be acknowledged if
    /// no successor has claimed the partition yet. A successor (a leader
    /// of another cluster over the same volume, a bug, a hand-made file)
    /// reads our tail only after its claim, so everything fsynced before a
    /// probe that finds no claim is in the log it recovers. Found, it is
    /// the error [`successor_claimed`] recognises: the gate fails the
    /// waiters with NOT_LEADER and stops acknowledging for good.
    ///
    /// Cost: one exact-name lookup per group commit (at most one per
    /// fsync; an idle partition makes none), no listing: on NFS one LOOKUP
    /// round trip (a negative one, served by the server under
    /// `lookupcache=positive`), on a local disk a failed `lstat`. It holds
    /// no descriptor ([`kaas_volume::fs::Fs::lookup`]).
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()?;
        if let Some((fs, path, epoch)) = &self.successor {
            // A lookup, not an open: it holds no descriptor, so a data
            // plane out of descriptors cannot fail an fsync that worked.
            if fs.lookup(path)? {
                let dir = path.parent().unwrap_or(Path::new("."));
                let owner = claim_owner(fs.as_ref(), dir, *epoch);
                return Err(io::Error::other(SuccessorClaimed {
                    epoch: *epoch,
                    owner,
                    path: path.clone(),
                }));
            }
        }
        Ok(())
    }
}

/// The next epoch of the partition was claimed while we lead it (see
/// [`SyncTarget::sync`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("epoch {epoch} of this partition was claimed ({path}) by {owner:?}: a successor owns it")]
pub struct SuccessorClaimed {
    /// The claimed epoch (ours + 1).
    pub epoch: i32,
    /// Who claimed it, if readable.
    pub owner: Option<ClaimOwner>,
    /// The claim file.
    pub path: PathBuf,
}

/// The successor claim behind `e`, if that is what it is.
pub fn successor_claimed(e: &io::Error) -> Option<&SuccessorClaimed> {
    e.get_ref()
        .and_then(|i| i.downcast_ref::<SuccessorClaimed>())
}

/// Result of an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Offset of the first record appended.
    pub base_offset: i64,
    /// Offset of the last record appended.
    pub last_offset: i64,
    /// The append repeated an idempotent batch already written: nothing
    /// was written, and the offsets are the original batch's.
    pub duplicate: bool,
}

/// Producer-state snapshots kept per partition (the newest; older ones and
/// any a crash or a zombie left unusable are swept).
pub const SNAPSHOTS_KEPT: usize = 3;

/// Who opens a partition for writing (see [`PartitionLog::open_as`]).
#[derive(Clone, Default)]
pub struct Claimant {
    /// Who claims the epoch; `None` only in tests of a single process.
    pub owner: Option<ClaimOwner>,
    /// What every write of the log must pass (the broker lease); `None`
    /// only in tests.
    pub guard: Option<Arc<dyn WriteGuard>>,
    /// The data directory's binding to our cluster, verified before the
    /// claim; `None` only in tests (and the broker's test-only hook).
    pub binding: Option<Arc<kaas_volume::binding::Binding>>,
}

impl std::fmt::Debug for Claimant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claimant")
            .field("owner", &self.owner)
            .field("guarded", &self.guard.is_some())
            .field("bound", &self.binding.is_some())
            .finish()
    }
}

/// The single writer of one partition directory.
pub struct PartitionLog {
    /// The capability every write goes through (won with the claim).
    writer: EpochWriter,
    /// `leader-e<E+1>.claim`, looked up by exact name after every fsync
    /// and before the acknowledgements it covers ([`SyncTarget::sync`]);
    /// `None` for a log opened without a claim (tests of one process).
    successor_claim: Option<PathBuf>,

    dir: PathBuf,
    cfg: LogConfig,
    epoch: i32,
    view: Arc<RwLock<LogView>>,
    manifest: Manifest,
    /// The active segment's write handle: closed when idle and clean
    /// (everything written is fsynced), reopened on the next write.
    active: Arc<FileSlot>,
    files: Arc<OpenFiles>,
    active_seg: Arc<SegView>,
    active_created_ms: i64,
    write_pos: u64,
    next_offset: i64,
    written_max_ts: i64,
    written_max_ts_pos: u64,
    checkpoint_pos: u64,
    /// Idempotent-producer state, as of everything written (not only what
    /// is durable): updated at write-assign time, in write order.
    producers: ProducerStates,
    /// (offset, epoch) of the producer snapshots on disk that we trust,
    /// ascending.
    snapshots: Vec<(i64, i32)>,
    /// Open transactions as of everything written: first offset →
    /// (producer id, offset of the marker that closed it, once written and
    /// until it is durable). The last stable offset is derived from it at
    /// every completed fsync.
    ongoing: BTreeMap<i64, (i64, Option<i64>)>,
    /// The latest wall-clock time we were handed (expiry at close).
    now_ms: i64,
}

impl PartitionLog {
    /// Open (recover) the partition at `dir` as the leader of `epoch`.
    ///
    /// Recovery reads the highest manifest, CRC-scans only the active
    /// segment's bytes after its checkpoint, seals the previous writer's
    /// tail at its last valid batch (never truncating another epoch's file)
    /// and starts appending to a segment of our own epoch. Then it removes
    /// whatever a crash left unlisted. Every step is idempotent, so a crash
    /// anywhere in here is handled by simply opening again.
    pub fn open(
        fs: SharedFs,
        dir: &Path,
        epoch: i32,
        cfg: LogConfig,
        now_ms: i64,
    ) -> Result<Self, LogError> {
        Self::open_with(fs, dir, epoch, cfg, now_ms, None)
    }

    /// [`Self::open`] after this owner's own failure (a failed write or
    /// fsync). `durable` is the (base offset, size) of the active segment
    /// that was known durable: pages after it may sit in the page cache,
    /// marked clean after a failed fsync, and must never be trusted — the
    /// segment is sealed there and a new file is started.
    pub fn open_with(
        fs: SharedFs,
        dir: &Path,
        epoch: i32,
        cfg: LogConfig,
        now_ms: i64,
        durable: Option<(i64, u64)>,
    ) -> Result<Self, LogError> {
        Self::open_as(fs, dir, epoch, Claimant::default(), cfg, now_ms, durable)
    }

    /// [`Self::open_with`] by a leader that first claims `epoch` for
    /// `who.owner` ([`super::claim`]): if another leader holds that epoch, or
    /// the next one is claimed, nothing is written and the open is fenced.
    /// Winning the claim yields the [`EpochWriter`] every later write goes
    /// through, guarded by `who.guard` (the broker lease): once it refuses,
    /// nothing more reaches the volume. `owner` is `None` only in tests of
    /// a single process.
    pub fn open_as(
        fs: SharedFs,
        dir: &Path,
        epoch: i32,
        who: Claimant,
        cfg: LogConfig,
        now_ms: i64,
        durable: Option<(i64, u64)>,
    ) -> Result<Self, LogError> {
        let Claimant {
            owner,
            guard,
            binding,
        } = who;
        // Only the partition directory is created here, never its topic:
        // a topic directory that is gone was deleted, and must stay gone.
        match dir.parent() {
            Some(p) if fs.is_dir(p) => {}
            Some(p) => {
                // `is_dir` says no for any failure: the listing says why, so
                // a volume answering EIO is reported as a storage fault,
                // not as a topic that is gone. ESTALE is this host's cached
                // handle of an earlier directory of the name (a topic
                // deleted and re-created by another host: names are not
                // identities) — a view that lags, as is "no such file".
                return Err(match fs.list(p) {
                    Err(e)
                        if e.kind() != io::ErrorKind::NotFound
                            && e.raw_os_error() != Some(libc::ESTALE) =>
                    {
                        LogError::Io(at(e, "looking up the topic directory", p))
                    }
                    _ => LogError::TopicDirMissing {
                        path: p.to_path_buf(),
                    },
                });
            }
            None => {
                return Err(LogError::TopicDirMissing {
                    path: dir.to_path_buf(),
                })
            }
        }
        // Even this first write passes the guard: a lapsed lease writes nothing.
        match &guard {
            Some(g) => GuardedFs::new(fs.clone(), g.clone()).create_dir_all(dir)?,
            None => fs.create_dir_all(dir)?,
        }
        // Read-only checks first (a leader fenced by a newer manifest
        // claims nothing), then the claim, then the first write.
        let names = fs.list(dir)?;
        let mut found = names.iter().filter_map(|n| parse_manifest_name(n)).max();
        // A listing may be stale on NFS; an open by exact name is not
        // (close-to-open). Probe the epochs a stale listing could hide: the
        // next leader's, ours, and the ones just below ours (the previous
        // leader's is normally epoch - 1). Only NotFound means absent: any
        // other error fails the open (the supervisor retries), since
        // guessing "absent" could make us sweep a newer leader's files.
        if kaas_volume::fs::exists(
            fs.as_ref(),
            &dir.join(manifest_name(epoch.saturating_add(1))),
        )? {
            found = Some(epoch.saturating_add(1));
        } else {
            let floor = found.unwrap_or(0);
            for k in (floor.saturating_add(1)..=epoch).rev().take(64) {
                if kaas_volume::fs::exists(fs.as_ref(), &dir.join(manifest_name(k)))? {
                    found = Some(k);
                    break;
                }
            }
        }
        if found.is_none()
            && names
                .iter()
                .any(|n| matches!(layout::parse_segment(n), Some((_, _, SegmentKind::Log))))
        {
            // Segments but no manifest: a stale listing or damage. Starting
            // an empty log here would sweep them; refuse and let the
            // supervisor retry.
            return Err(LogError::CorruptManifest {
                path: dir.to_path_buf(),
                reason: "segment files present but no manifest found".into(),
            });
        }
        if let Some(found) = found {
            if found > epoch {
                return Err(LogError::Fenced {
                    ours: epoch,
                    found,
                    owner: claim_owner(fs.as_ref(), dir, found),
                });
            }
        }
        // One volume, one cluster: a data directory whose stamp names
        // another cluster (or none) is not ours to claim an epoch in.
        if let Some(b) = &binding {
            if let Err(found) = b
                .verify(fs.as_ref())
                .map_err(|e| at(e, "reading the data directory stamp", &b.stamp))?
            {
                return Err(LogError::ForeignVolume {
                    stamp: b.stamp.clone(),
                    ours: b.cluster_id.clone(),
                    found: found.unwrap_or_else(|| "none".into()),
                });
            }
        }
        // Before anything of our epoch is written: one leader per epoch.
        // Winning the claim is what hands out the writer; every write from
        // here on goes through its guarded seam.
        let writer = match claim::win(&fs, guard, dir, epoch, owner)? {
            Ok(w) => w,
            Err(by) => {
                return Err(LogError::Fenced {
                    ours: epoch,
                    found: epoch,
                    owner: by,
                })
            }
        };
        if owner.is_some() {
            let next = epoch.saturating_add(1);
            if let Some(by) = claim::owner_of(fs.as_ref(), dir, next)? {
                return Err(LogError::Fenced {
                    ours: epoch,
                    found: next,
                    owner: by,
                });
            }
        }
        // A grant may skip epochs (the controller grants above the epoch
        // it last assigned, not above what is on disk). The leader of the
        // highest manifest's epoch F probes only `leader-e<F+1>.claim`
        // after each fsync (`SyncTarget::sync`), so claim F+1 too before
        // reading its tail: from here it acknowledges nothing more. Ours or
        // someone else's, the claim exists either way; nothing is written
        // under F+1.
        if let (Some(owner), Some(f)) = (owner, found) {
            if f.saturating_add(1) < epoch {
                claim::claim(writer.fs(), dir, f.saturating_add(1), owner)?;
            }
        }
        let fs = writer.fs();
        remove_stale_temps(fs, dir)?;
        let prior = match found {
            Some(e) => {
                let path = dir.join(manifest_name(e));
                Some(parse_manifest(fs.read(&path), path)?)
            }
            None => None,
        };
        let mut manifest = prior.clone().unwrap_or(Manifest {
            version: 1,
            epoch,
            log_start_offset: 0,
            segments: Vec::new(),
            epoch_history: Vec::new(),
        });
        manifest.epoch = epoch;

        // Validate the tail of the last segment.
        let interval = cfg.index_interval_bytes;
        let mut tail_index = Index::new(interval);
        let mut reuse_active: Option<Arc<dyn WriteFile>> = None;
        if let Some(last) = manifest.segments.last_mut() {
            let path = dir.join(layout::segment_log(last.base, last.epoch));
            let scanned = if last.sealed {
                None
            } else {
                match fs.open_read(&path) {
                    Ok(f) => {
                        let mut len = f.len()?;
                        if let Some((base, size)) = durable {
                            if base == last.base && last.epoch == epoch {
                                len = len.min(size);
                            }
                        }
                        Some((
                            scan(
                                f.as_ref(),
                                last.base,
                                tail_start(last),
                                len,
                                &mut tail_index,
                            )?,
                            len,
                        ))
                    }
                    // Named by the manifest but never created: empty.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Some((
                        Scan {
                            end_pos: 0,
                            next_offset: last.base,
                            max_ts: -1,
                            max_ts_pos: 0,
                            batches: 0,
                            stopped: None,
                            markers: false,
                        },
                        u64::MAX,
                    )),
                    Err(e) => return Err(e.into()),
                }
            };
            if let Some((s, file_len)) = scanned {
                adopt_tail(last, &s, &path)?;
                if let Some(why) = &s.stopped {
                    tracing::warn!(dir = %dir.display(), reason = %why, valid = s.end_pos, "ignoring torn tail");
                }
                let clean_end = file_len == s.end_pos || file_len == u64::MAX;
                if s.end_pos > 0 && file_len != u64::MAX {
                    // What recovery found may be only in this host's page
                    // cache (the previous owner died before its fsync).
                    // Make it durable before a manifest records its length.
                    fs.open_write(&path)
                        .and_then(|f| f.sync_data())
                        .map_err(|e| at(e, "syncing the recovered tail of", &path))?;
                }
                if last.epoch == epoch && durable.is_none() && (clean_end || s.end_pos == 0) {
                    // Our own active file: keep appending to it. If it holds
                    // only garbage it is ours to truncate.
                    let f = if file_len == u64::MAX {
                        let f = match fs.create_exclusive(&path) {
                            Ok(f) => f,
                            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                                fs.open_write(&path)?
                            }
                            Err(e) => return Err(e.into()),
                        };
                        fs.sync_dir(dir)?;
                        f
                    } else {
                        fs.open_write(&path)?
                    };
                    if !clean_end {
                        f.set_len(0)?;
                        f.sync_data()?;
                    }
                    reuse_active = Some(f);
                } else {
                    last.sealed = true;
                }
            }
        }

        let next_offset = manifest.log_end();
        if manifest.epoch_history.last().map(|(e, _)| *e) != Some(epoch) {
            manifest.epoch_history.push((epoch, next_offset));
        }

        let (active, created_ms, write_pos) = match reuse_active {
            Some(f) => {
                let last = manifest.segments.last().expect("reuse implies a segment");
                (f, last.created_ms, last.size)
            }
            None => {
                // Roll onto a new segment of our epoch: manifest first, then
                // create. A crash in between leaves a manifest naming a file
                // that does not exist, which the branch above treats as empty.
                manifest.segments.push(SegmentEntry {
                    base: next_offset,
                    epoch,
                    sealed: false,
                    size: 0,
                    next_offset,
                    max_ts: -1,
                    max_ts_pos: 0,
                    created_ms: now_ms,
                    markers: false,
                });
                tail_index = Index::new(interval);
                write_manifest(fs, dir, epoch, &manifest)?;
                let path = dir.join(layout::segment_log(next_offset, epoch));
                let f = create_or_truncate_segment(fs, dir, &path)?;
                (f, now_ms, 0)
            }
        };
        // Make the recovered state the durable manifest (also records the
        // new epoch in the history), then sweep what is not listed.
        write_manifest(fs, dir, epoch, &manifest)?;
        // Last check before deleting anything: a leader of a later epoch
        // may have opened meanwhile (we may be a paused zombie).
        if kaas_volume::fs::exists(fs, &dir.join(manifest_name(epoch.saturating_add(1))))? {
            return Err(LogError::Fenced {
                ours: epoch,
                found: epoch.saturating_add(1),
                owner: claim_owner(fs, dir, epoch.saturating_add(1)),
            });
        }
        Self::sweep(fs, dir, &manifest, epoch)?;

        // Idempotent-producer state: the newest usable snapshot, then the
        // batch headers after it. Written back as a snapshot at the log end
        // if the replay found any, so the next open replays nothing of it.
        let log_end = manifest.log_end();
        let loaded = load_producers(
            &ReadOnly::read_only(&writer.shared()),
            Some(fs),
            dir,
            &manifest,
            epoch,
            log_end,
            now_ms,
        )?;
        let mut snapshots = loaded.snapshots;
        // Also when nothing usable was found in a log holding records (one
        // from before snapshots): the next open then starts from here, not
        // from the last two segments again. An empty log (a new partition)
        // writes nothing: its replay is free.
        let holds_records = log_end > manifest.log_start_offset;
        if loaded.replayed > 0 || (!loaded.from_snapshot && holds_records) {
            let path = dir.join(layout::producer_snapshot(log_end, epoch));
            write_atomic(fs, &path, &loaded.state.encode(log_end))?;
            snapshots.retain(|s| *s != (log_end, epoch));
            snapshots.push((log_end, epoch));
            snapshots.sort();
        }
        prune_snapshots(fs, dir, &mut snapshots)?;

        let files = OpenFiles::global();
        let segs: Vec<Arc<SegView>> = manifest
            .segments
            .iter()
            .map(|e| Arc::new(SegView::new(dir, e, interval, &files)))
            .collect();
        let active_seg = segs.last().expect("active segment").clone();
        *active_seg.live_index.lock().unwrap() = Some(tail_index);
        let active = {
            let slot = FileSlot::new(files.clone());
            slot.put(Handle::Write(active));
            slot
        };
        let last = manifest.segments.last().expect("active").clone();
        // The active segment's aborted transactions, from its own bytes
        // (bounded: one segment, headers only; empty for a new segment).
        let aborted = if last.size > 0 && last.markers {
            let f = fs.open_read(&dir.join(layout::segment_log(last.base, last.epoch)))?;
            txn_index::scan_segment(f.as_ref(), last.size)?
        } else {
            Vec::new()
        };
        *active_seg.aborted.write().unwrap() = Some(aborted);
        let ongoing = ongoing_of(&loaded.state);
        let view = LogView {
            log_start_offset: manifest.log_start_offset,
            high_watermark: last.next_offset,
            epoch,
            epoch_history: manifest.epoch_history.clone(),
            segments: segs,
            last_stable_offset: stable_offset(&ongoing, last.next_offset),
        };
        Ok(Self {
            writer,
            successor_claim: owner.map(|_| dir.join(claim::claim_name(epoch.saturating_add(1)))),
            dir: dir.to_path_buf(),
            cfg,
            epoch,
            view: Arc::new(RwLock::new(view)),
            active,
            files,
            active_seg,
            active_created_ms: created_ms,
            write_pos,
            next_offset: last.next_offset,
            written_max_ts: last.max_ts,
            written_max_ts_pos: last.max_ts_pos,
            checkpoint_pos: write_pos,
            manifest,
            producers: loaded.state,
            snapshots,
            ongoing,
            now_ms,
        })
    }

    /// The idempotent-producer state (as of everything written).
    pub fn producers(&self) -> &ProducerStates {
        &self.producers
    }

    /// Write the producer state as of the log end, `<next>-e<E>.producers`
    /// (temp → fsync → rename → dir fsync through our writer), after
    /// expiring idle producers and forgetting batches retention removed;
    /// then remove all but the newest [`SNAPSHOTS_KEPT`]. Called only with
    /// nothing unsynced (after the roll's or the close's fsync), so the
    /// snapshot never describes a batch that is not durable. Written even
    /// when empty: the next open then replays only what follows it, with
    /// or without producers.
    pub fn snapshot_producers(&mut self, now_ms: i64) -> Result<(), LogError> {
        self.now_ms = self.now_ms.max(now_ms);
        self.producers
            .expire(self.now_ms, self.cfg.producer_id_expiration_ms);
        self.producers.truncate_head(self.manifest.log_start_offset);
        let off = self.next_offset;
        let fs = self.writer.fs();
        let path = self.dir.join(layout::producer_snapshot(off, self.epoch));
        write_atomic(fs, &path, &self.producers.encode(off))?;
        self.snapshots.retain(|s| *s != (off, self.epoch));
        self.snapshots.push((off, self.epoch));
        self.snapshots.sort();
        prune_snapshots(fs, &self.dir, &mut self.snapshots)?;
        Ok(())
    }

    /// Remove older manifests and any segment file of our epoch or older
    /// that the manifest does not list.
    fn sweep(fs: &dyn kaas_volume::fs::Fs, dir: &Path, m: &Manifest, epoch: i32) -> io::Result<()> {
        for name in fs.list(dir)? {
            let stale = if let Some(e) = parse_manifest_name(&name) {
                e < epoch
            } else if let Some(e) = parse_claim_name(&name) {
                // Claims of long-past epochs: kept for a while (a stale grant
                // of a recent epoch must still find its claim taken), then
                // removed so they do not pile up with every leader change.
                e < epoch.saturating_sub(CLAIMS_KEPT)
            } else if let Some((base, e, _)) = layout::parse_segment(&name) {
                // Never a later epoch's file: that belongs to a newer leader.
                e <= epoch && !m.segments.iter().any(|s| s.base == base && s.epoch == e)
            } else {
                false
            };
            if stale {
                remove_if_exists(fs, &dir.join(&name))?;
            }
        }
        Ok(())
    }

    /// The partition in `dir` as its files stand, for readers only: for a
    /// leader of `epoch` whose open could not write (a full data volume —
    /// the claim, the seal and the manifest all need a block). Nothing is
    /// claimed, sealed, swept or written; the previous owner's manifest
    /// and the valid tail of its last segment (CRC-scanned, as an open
    /// does) are what fetch and ListOffsets see, and the producer state
    /// replayed from the newest usable snapshot gives the last stable
    /// offset. Reading files no leader writes any more is safe: the grant
    /// of `epoch` means every earlier owner is deposed, and a newer
    /// manifest than `epoch` fences (nothing is served). A partition with
    /// no manifest yet has nothing to read: `Ok(None)`.
    pub fn read_only_view(
        fs: &ReadFs,
        dir: &Path,
        epoch: i32,
        cfg: &LogConfig,
        now_ms: i64,
    ) -> Result<Option<LogView>, LogError> {
        let names = fs.list(dir)?;
        let Some(found) = names.iter().filter_map(|n| parse_manifest_name(n)).max() else {
            return Ok(None);
        };
        if found > epoch {
            return Err(LogError::Fenced {
                ours: epoch,
                found,
                owner: None,
            });
        }
        let path = dir.join(manifest_name(found));
        let mut manifest = parse_manifest(fs.read(&path), path)?;
        let interval = cfg.index_interval_bytes;
        let mut tail_index = None;
        if let Some(last) = manifest.segments.last_mut().filter(|l| !l.sealed) {
            let path = dir.join(layout::segment_log(last.base, last.epoch));
            match fs.open_read(&path) {
                Ok(f) => {
                    let len = f.len()?;
                    let mut ix = Index::new(interval);
                    let s = scan(f.as_ref(), last.base, tail_start(last), len, &mut ix)?;
                    adopt_tail(last, &s, &path)?;
                    tail_index = Some(ix);
                }
                // Named by the manifest but never created: empty.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(at(e, "reading the tail of", &path).into()),
            }
        }
        let log_end = manifest.log_end();
        let loaded = load_producers(fs, None, dir, &manifest, epoch, log_end, now_ms)?;
        let files = OpenFiles::global();
        let segments: Vec<Arc<SegView>> = manifest
            .segments
            .iter()
            .map(|e| Arc::new(SegView::new(dir, e, interval, &files)))
            .collect();
        if let (Some(seg), Some(ix)) = (segments.last(), tail_index) {
            *seg.live_index.lock().unwrap() = Some(ix);
        }
        let ongoing = ongoing_of(&loaded.state);
        Ok(Some(LogView {
            log_start_offset: manifest.log_start_offset,
            high_watermark: log_end,
            epoch,
            epoch_history: manifest.epoch_history,
            segments,
            last_stable_offset: stable_offset(&ongoing, log_end),
        }))
    }

    /// Shared read view for fetch / list-offsets.
    pub fn view(&self) -> Arc<RwLock<LogView>> {
        self.view.clone()
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Our leader epoch.
    pub fn epoch(&self) -> i32 {
        self.epoch
    }

    /// Next offset to be assigned.
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }

    /// One past the last durable offset.
    pub fn high_watermark(&self) -> i64 {
        self.active_seg.next_offset()
    }

    /// Replace the storage settings (a topic config altered live): the
    /// next roll and retention pass use them. Writes nothing.
    pub fn set_config(&mut self, cfg: LogConfig) {
        self.cfg = cfg;
    }

    /// The storage settings in force.
    pub fn config(&self) -> &LogConfig {
        &self.cfg
    }

    /// First offset in the log.
    pub fn log_start_offset(&self) -> i64 {
        self.manifest.log_start_offset
    }

    /// (base offset, durable size) of the active segment.
    pub fn durable_point(&self) -> (i64, u64) {
        (self.active_seg.base, self.active_seg.size())
    }

    /// Whether bytes were written that are not yet fsynced.
    pub fn dirty(&self) -> bool {
        self.write_pos > self.active_seg.size()
    }

    /// Append already-validated batches (`infos` from
    /// `kaas_protocol::batch::validate_batches` over `records`), assigning
    /// offsets and stamping our leader epoch. The bytes reach the page cache;
    /// they become readable only after [`Self::complete_sync`].
    pub fn append(&mut self, records: &[u8], infos: &[BatchInfo]) -> Result<Appended, LogError> {
        let now = self.now_ms;
        self.append_at(records, infos, now)
    }

    /// [`Self::append`] at wall-clock `now_ms` (when idempotent producers
    /// were last seen, for expiry). Idempotent batches (producer id >= 0)
    /// are checked first, in write order, against the state including
    /// every earlier write: a duplicate of one of a producer's last five
    /// batches writes nothing and returns the original offsets
    /// (`duplicate`), a sequence or epoch error writes nothing and is
    /// [`LogError::Sequence`]. The state moves only once the bytes are
    /// written.
    pub fn append_at(
        &mut self,
        records: &[u8],
        infos: &[BatchInfo],
        now_ms: i64,
    ) -> Result<Appended, LogError> {
        self.now_ms = self.now_ms.max(now_ms);
        let mut incoming = Vec::new();
        let mut off = self.next_offset;
        for b in infos {
            if b.producer_id >= 0 {
                incoming.push(Incoming {
                    producer_id: b.producer_id,
                    epoch: b.producer_epoch,
                    first_seq: b.base_sequence,
                    last_offset_delta: b.last_offset_delta,
                    base_offset: off,
                    timestamp: b.max_timestamp,
                    transactional: b.is_transactional(),
                });
            }
            off = off
                .checked_add(b.last_offset_delta as i64 + 1)
                .ok_or(LogError::Overflow)?;
        }
        let staged = if incoming.is_empty() {
            None
        } else {
            match self.producers.check(&incoming, self.now_ms)? {
                Verdict::Duplicate(m) => {
                    return Ok(Appended {
                        base_offset: m.base_offset,
                        last_offset: m.last_offset,
                        duplicate: true,
                    })
                }
                Verdict::Append(st) => Some(st),
            }
        };
        let (base_offset, next) = self.write_batches(records, infos)?;
        if let Some(st) = staged {
            for (first, pid) in st.opened() {
                self.ongoing.entry(first).or_insert((pid, None));
            }
            self.producers.apply(st);
        }
        Ok(Appended {
            base_offset,
            last_offset: next - 1,
            duplicate: false,
        })
    }

    /// Append a COMMIT (`commit`) or ABORT marker of `producer_id` at
    /// `producer_epoch`, closing its open transaction (see
    /// [`super::txn_index`] for the control batch). Refused, writing
    /// nothing, when the producer is known at a newer epoch or its last
    /// marker came from a newer coordinator epoch. A marker for a
    /// producer with no open transaction is written all the same (a
    /// re-sent marker: nothing changes for a reader). Like an append, it
    /// reaches the page cache; the high watermark, and with it the last
    /// stable offset, move once an fsync covers it.
    pub fn append_marker(
        &mut self,
        producer_id: i64,
        producer_epoch: i16,
        coordinator_epoch: i32,
        commit: bool,
        now_ms: i64,
    ) -> Result<Appended, LogError> {
        self.now_ms = self.now_ms.max(now_ms);
        self.producers
            .check_marker(producer_id, producer_epoch, coordinator_epoch)?;
        let first = self
            .producers
            .get(producer_id)
            .and_then(|e| e.txn_first_offset);
        let bytes = txn_index::control_batch(
            producer_id,
            producer_epoch,
            coordinator_epoch,
            commit,
            first,
            now_ms,
        );
        let h = read_batch_header(&bytes)
            .ok_or_else(|| LogError::Io(io::Error::other("control batch without a header")))?;
        let info = BatchInfo {
            pos: 0,
            len: bytes.len(),
            last_offset_delta: h.last_offset_delta,
            base_timestamp: h.base_timestamp,
            max_timestamp: h.max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence: h.base_sequence,
            records_count: h.records_count,
            attributes: h.attributes,
        };
        // Noted before the write: a flag that says "maybe" is harmless, one
        // that misses a marker is not.
        self.active_seg.markers.store(true, Ordering::Release);
        let (at, next) = self.write_batches(&bytes, std::slice::from_ref(&info))?;
        let closed = self.producers.apply_marker(
            producer_id,
            producer_epoch,
            coordinator_epoch,
            self.now_ms,
        );
        if let Some(first) = closed {
            if let Some(e) = self.ongoing.get_mut(&first) {
                e.1 = Some(at);
            }
            if !commit {
                let mut a = self.active_seg.aborted.write().unwrap();
                a.get_or_insert_with(Vec::new).push(AbortedTxn {
                    producer_id,
                    first_offset: first,
                    last_offset: at,
                });
            }
        }
        Ok(Appended {
            base_offset: at,
            last_offset: next - 1,
            duplicate: false,
        })
    }

    /// Write checked batches at the end of the active segment, assigning
    /// offsets and stamping our leader epoch: (base offset, next offset).
    /// A full volume undoes whatever landed ([`LogError::NoSpace`]).
    fn write_batches(
        &mut self,
        records: &[u8],
        infos: &[BatchInfo],
    ) -> Result<(i64, i64), LogError> {
        let total: usize = infos.iter().map(|b| b.len).sum();
        if self.write_pos + total as u64 > u32::MAX as u64 {
            // Positions are u32 in the index; a well-configured segment.bytes
            // rolls long before this.
            return Err(LogError::Overflow);
        }
        // Each batch goes out as its first bytes, patched with its offset
        // and epoch, then the rest of it as the client sent it: one
        // `pwritev`, no copy of the records (see `write_all_vectored_at`).
        let mut heads: Vec<[u8; PATCHED_HEAD]> = Vec::with_capacity(infos.len());
        let base_offset = self.next_offset;
        let mut next = self.next_offset;
        let mut pos = self.write_pos;
        let before_ts = (self.written_max_ts, self.written_max_ts_pos);
        let mut ix = self.active_seg.live_index.lock().unwrap();
        let ix = ix.as_mut().expect("active segment has a live index");
        let ix_mark = ix.mark();
        for b in infos {
            let mut head = [0u8; PATCHED_HEAD];
            let h = b.len.min(PATCHED_HEAD);
            head[..h].copy_from_slice(&records[b.pos..b.pos + h]);
            patch_batch(&mut head[..h], next, self.epoch);
            heads.push(head);
            let rel = (next - self.active_seg.base).clamp(0, u32::MAX as i64) as u32;
            ix.observe(rel, pos, self.written_max_ts);
            if b.max_timestamp > self.written_max_ts {
                self.written_max_ts = b.max_timestamp;
                self.written_max_ts_pos = pos;
            }
            next = next
                .checked_add(b.last_offset_delta as i64 + 1)
                .ok_or(LogError::Overflow)?;
            pos += b.len as u64;
        }
        // Dirty before the handle is taken: a dirty slot is never closed.
        self.active.set_dirty(true);
        let file = match self.active_file() {
            Ok(f) => f,
            Err(e) => {
                ix.rewind(ix_mark);
                (self.written_max_ts, self.written_max_ts_pos) = before_ts;
                self.active.set_dirty(self.dirty());
                // Out of descriptors (or past the open-file ceiling):
                // nothing was written, the log is intact; refuse this
                // append the way a full volume does (retriable, no leader
                // restart) instead of re-running recovery.
                if super::files::too_many_files(&e) {
                    return Err(LogError::NoSpace(e));
                }
                return Err(e.into());
            }
        };
        let parts: Vec<&[u8]> = infos
            .iter()
            .zip(&heads)
            .flat_map(|(b, head)| {
                let h = b.len.min(PATCHED_HEAD);
                [&head[..h], &records[b.pos + h..b.pos + b.len]]
            })
            .collect();
        if let Err(e) = file.write_all_vectored_at(&parts, self.write_pos) {
            if !is_no_space(&e) {
                return Err(e.into());
            }
            // A full volume: undo the part that may have landed (shrinking
            // needs no space) and what was noted for it, so the log is as if
            // the append never happened. Nothing past `write_pos` was ever
            // acknowledged or readable; if the undo fails, restart.
            ix.rewind(ix_mark);
            (self.written_max_ts, self.written_max_ts_pos) = before_ts;
            file.set_len(self.write_pos)?;
            self.active.set_dirty(self.dirty());
            return Err(LogError::NoSpace(e));
        }
        self.write_pos = pos;
        self.next_offset = next;
        Ok((base_offset, next))
    }

    /// What the next fsync must cover, if anything was written since the last.
    pub fn sync_target(&self) -> Option<SyncTarget> {
        if !self.dirty() {
            return None;
        }
        let file = match self.active_file() {
            Ok(f) => f,
            Err(e) => {
                // Unreachable while dirty (the slot stays open); logged.
                tracing::error!(dir = %self.dir.display(), error = %e, "active segment handle missing while dirty");
                return None;
            }
        };
        Some(SyncTarget {
            file,
            successor: self
                .successor_claim
                .clone()
                .map(|p| (self.writer.shared(), p, self.epoch.saturating_add(1))),
            seg: self.active_seg.clone(),
            pos: self.write_pos,
            next_offset: self.next_offset,
            max_ts: self.written_max_ts,
            max_ts_pos: self.written_max_ts_pos,
        })
    }

    /// Publish a completed fsync: the high watermark moves and readers see
    /// the bytes. Returns the new high watermark.
    pub fn complete_sync(&mut self, t: SyncTarget) -> i64 {
        let seg = &self.active_seg;
        if !Arc::ptr_eq(&t.seg, seg) || t.pos <= seg.size() {
            return self.high_watermark();
        }
        // Under the view lock, so a reader's snapshot of (high watermark,
        // segment sizes) is consistent: it never sees bytes past the HW.
        let mut v = self.view.write().unwrap();
        seg.max_ts.store(t.max_ts, Ordering::Release);
        seg.max_ts_pos.store(t.max_ts_pos, Ordering::Release);
        seg.size.store(t.pos, Ordering::Release);
        seg.next_offset.store(t.next_offset, Ordering::Release);
        v.high_watermark = t.next_offset;
        // Transactions whose marker is now durable are closed for readers.
        let hw = t.next_offset;
        self.ongoing
            .retain(|_, (_, closed_at)| closed_at.is_none_or(|m| m >= hw));
        v.last_stable_offset = stable_offset(&self.ongoing, hw);
        drop(v);
        // Everything written is durable: the handle may close when idle.
        self.active.set_dirty(self.dirty());
        t.next_offset
    }

    /// The last stable offset readers see now.
    pub fn last_stable_offset(&self) -> i64 {
        self.view.read().unwrap().last_stable_offset
    }

    /// Forget everything written since the last completed fsync: cut the
    /// active file back to its durable length (shrinking needs no space)
    /// and reset the write position, next offset, timestamps and index to
    /// it. For an fsync that failed because the volume is full (on NFS the
    /// client drops the pages it could not write back): none of those bytes
    /// was acknowledged or visible, and the next append rewrites the range,
    /// so the next fsync covers fresh pages.
    pub fn rewind_to_durable(&mut self) -> Result<(), LogError> {
        let seg = &self.active_seg;
        let size = seg.size();
        self.active_file()?.set_len(size)?;
        self.write_pos = size;
        self.active.set_dirty(false);
        self.next_offset = seg.next_offset();
        self.written_max_ts = seg.max_ts.load(Ordering::Acquire);
        self.written_max_ts_pos = seg.max_ts_pos.load(Ordering::Acquire);
        if let Some(ix) = seg.live_index.lock().unwrap().as_mut() {
            ix.truncate_from(size);
        }
        // The producer state moved with the writes now undone: rebuild it
        // as of the durable point, from the newest snapshot and the batch
        // headers after it (bounded: about one segment; a rare event).
        if !self.producers.is_empty() {
            let mut m = self.manifest.clone();
            if let Some(last) = m.segments.last_mut() {
                *last = self.active_seg.entry(false, self.active_created_ms);
            }
            let loaded = load_producers(
                &ReadOnly::read_only(&self.writer.shared()),
                Some(self.writer.fs()),
                &self.dir,
                &m,
                self.epoch,
                self.next_offset,
                self.now_ms,
            )?;
            self.producers = loaded.state;
        }
        // Markers undone re-open their transactions; aborts undone leave
        // the index.
        self.ongoing = ongoing_of(&self.producers);
        let durable_end = self.next_offset;
        if let Some(a) = self.active_seg.aborted.write().unwrap().as_mut() {
            a.retain(|t| t.last_offset < durable_end);
        }
        Ok(())
    }

    /// fsync inline (tests, roll, close).
    pub fn sync_now(&mut self) -> Result<i64, LogError> {
        if let Some(t) = self.sync_target() {
            t.sync()?;
            return Ok(self.complete_sync(t));
        }
        Ok(self.high_watermark())
    }

    /// Whether the active segment is due for a checkpoint in the manifest.
    pub fn checkpoint_due(&self) -> bool {
        self.active_seg.size() >= self.checkpoint_pos + self.cfg.checkpoint_bytes
    }

    /// Record the active segment's durable length in the manifest so that
    /// recovery need not CRC-scan it again.
    ///
    /// A full volume is [`LogError::NoSpace`] and changes nothing in memory
    /// (the manifest on disk is the old one or, if only the directory fsync
    /// failed, the new one: both describe the durable log); the next sync
    /// tries again.
    pub fn checkpoint(&mut self) -> Result<(), LogError> {
        let entry = self.active_seg.entry(false, self.active_created_ms);
        let size = entry.size;
        let mut next = self.manifest.clone();
        *next.segments.last_mut().expect("active") = entry;
        write_manifest(self.writer.fs(), &self.dir, self.epoch, &next).map_err(no_space)?;
        self.manifest = next;
        self.checkpoint_pos = size;
        Ok(())
    }

    /// Whether our manifest on disk is `m` (read back by exact name): after
    /// a manifest write failed, whether its rename did not happen.
    fn manifest_on_disk_is(&self, m: &Manifest) -> bool {
        self.writer
            .fs()
            .read(&self.dir.join(manifest_name(self.epoch)))
            .ok()
            .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok())
            .is_some_and(|d| &d == m)
    }

    /// Whether the active segment should roll now (size or age).
    pub fn roll_due(&self, now_ms: i64) -> bool {
        let size = self.active_seg.size();
        size > 0
            && (size >= self.cfg.segment_bytes
                || now_ms.saturating_sub(self.active_created_ms) >= self.cfg.segment_ms)
    }

    /// Seal the active segment at its durable end and start a new one.
    ///
    /// Steps: fsync the tail; write the sealed segment's index files (temp →
    /// rename); write the manifest that seals it and names the new segment;
    /// create the new segment; fsync the directory. A crash after the
    /// manifest leaves a named-but-missing segment (treated as empty); a
    /// crash before it leaves index files the sweep removes or rewrites.
    ///
    /// A full volume before the manifest is replaced (the index files, or
    /// a manifest write whose read-back shows the old manifest) is
    /// [`LogError::NoSpace`] and changes nothing: the active segment stays
    /// active (past its size for a while) and the roll is tried again at
    /// the next sync or tick. Past that point a failure restarts the leader.
    pub fn roll(&mut self, now_ms: i64) -> Result<(), LogError> {
        self.sync_now()?;
        let seg = self.active_seg.clone();
        let ix = seg
            .live_index
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_else(|| Index::new(self.cfg.index_interval_bytes));
        let (idx, tim) = ix.encode();
        write_atomic(
            self.writer.fs(),
            &self.dir.join(layout::segment_index(seg.base, seg.epoch)),
            &idx,
        )
        .map_err(no_space)?;
        write_atomic(
            self.writer.fs(),
            &self
                .dir
                .join(layout::segment_timeindex(seg.base, seg.epoch)),
            &tim,
        )
        .map_err(no_space)?;
        let aborted = seg.aborted.read().unwrap().clone().unwrap_or_default();
        if seg.markers() {
            write_atomic(
                self.writer.fs(),
                &self.dir.join(layout::segment_txnindex(seg.base, seg.epoch)),
                &txn_index::encode(&aborted, seg.next_offset()),
            )
            .map_err(no_space)?;
        }
        let next = self.next_offset;
        let mut manifest = self.manifest.clone();
        *manifest.segments.last_mut().expect("active") = seg.entry(true, self.active_created_ms);
        let new_entry = SegmentEntry {
            base: next,
            epoch: self.epoch,
            sealed: false,
            size: 0,
            next_offset: next,
            max_ts: -1,
            max_ts_pos: 0,
            created_ms: now_ms,
            markers: false,
        };
        manifest.segments.push(new_entry.clone());
        if let Err(e) = write_manifest(self.writer.fs(), &self.dir, self.epoch, &manifest) {
            // Indeterminate: the rename may have happened. Only if the old
            // manifest is provably still the one on disk is nothing changed.
            if is_no_space(&e) && self.manifest_on_disk_is(&self.manifest) {
                return Err(LogError::NoSpace(e));
            }
            return Err(e.into());
        }
        self.manifest = manifest;
        let path = self.dir.join(layout::segment_log(next, self.epoch));
        let f = create_or_truncate_segment(self.writer.fs(), &self.dir, &path)?;

        let _ = seg.sealed_index.set(Arc::new(ix));
        *seg.live_index.lock().unwrap() = None;
        let new_seg = Arc::new(SegView::new(
            &self.dir,
            &new_entry,
            self.cfg.index_interval_bytes,
            &self.files,
        ));
        *new_seg.live_index.lock().unwrap() = Some(Index::new(self.cfg.index_interval_bytes));
        *new_seg.aborted.write().unwrap() = Some(Vec::new());
        self.view.write().unwrap().segments.push(new_seg.clone());
        let slot = FileSlot::new(self.files.clone());
        slot.put(Handle::Write(f));
        self.active = slot;
        self.active_seg = new_seg;
        self.active_created_ms = now_ms;
        self.write_pos = 0;
        self.checkpoint_pos = 0;
        self.written_max_ts = -1;
        self.written_max_ts_pos = 0;
        // Everything is fsynced: the state is exactly the durable log's.
        // A crash before this leaves the older snapshot, and the next open
        // replays one more segment.
        self.snapshot_producers(now_ms)
    }

    /// Delete whole sealed segments past retention.ms / retention.bytes.
    /// Manifest first (readers stop seeing them), then unlink; a crash in
    /// between leaves unlisted files that the next open sweeps. Returns the
    /// number of segments removed.
    pub fn enforce_retention(&mut self, now_ms: i64) -> Result<usize, LogError> {
        let segs = self.manifest.segments.clone();
        let mut total: i64 = segs.iter().map(|s| s.size as i64).sum();
        let mut drop = 0;
        for s in segs.iter().take(segs.len().saturating_sub(1)) {
            if !s.sealed {
                break;
            }
            // An empty sealed segment (a leader that opened but never
            // wrote) holds nothing to keep; one without timestamps ages by
            // its creation time, so neither can block retention forever.
            let age_from = if s.max_ts >= 0 {
                s.max_ts
            } else {
                s.created_ms
            };
            let by_time = s.size == 0
                || (self.cfg.retention_ms >= 0
                    && now_ms.saturating_sub(age_from) > self.cfg.retention_ms);
            let by_size =
                self.cfg.retention_bytes >= 0 && total - s.size as i64 >= self.cfg.retention_bytes;
            if !(by_time || by_size) {
                break;
            }
            total -= s.size as i64;
            drop += 1;
        }
        if drop == 0 {
            return Ok(0);
        }
        let log_start = self
            .manifest
            .segments
            .get(drop)
            .map(|s| s.base)
            .unwrap_or(self.next_offset);
        self.drop_front(drop, log_start)?;
        Ok(drop)
    }

    /// DeleteRecords: move the log start offset up to `offset` (clamped to
    /// the high watermark; never down), persisted in the manifest, and
    /// remove every whole sealed segment below it. Returns the new log
    /// start offset. Manifest first, then unlink, as retention.
    pub fn delete_records(&mut self, offset: i64) -> Result<i64, LogError> {
        let target = offset.min(self.high_watermark());
        if target <= self.manifest.log_start_offset {
            return Ok(self.manifest.log_start_offset);
        }
        // A segment goes when the next one starts at or below the target
        // (so all of it is below); the active segment always stays.
        let segs = &self.manifest.segments;
        let drop = (0..segs.len().saturating_sub(1))
            .take_while(|&i| segs[i].sealed && segs[i + 1].base <= target)
            .count();
        self.drop_front(drop, target)?;
        Ok(self.manifest.log_start_offset)
    }

    /// Remove the first `drop` segments and raise the log start offset to
    /// `log_start` (never lower it): manifest first (readers stop seeing
    /// them), then the view, then unlink; a crash in between leaves
    /// unlisted files that the next open sweeps.
    ///
    /// A full volume is [`LogError::NoSpace`] and changes nothing in memory
    /// or in the files (if the rename happened and only the directory fsync
    /// failed, the manifest on disk lists fewer segments, whose files are
    /// all still there; the next manifest written lists them again).
    fn drop_front(&mut self, drop: usize, log_start: i64) -> Result<(), LogError> {
        let mut next = self.manifest.clone();
        let removed: Vec<SegmentEntry> = next.segments.drain(..drop).collect();
        next.log_start_offset = log_start.max(next.log_start_offset);
        write_manifest(self.writer.fs(), &self.dir, self.epoch, &next).map_err(no_space)?;
        self.manifest = next;
        {
            let mut v = self.view.write().unwrap();
            v.log_start_offset = self.manifest.log_start_offset;
            v.segments.drain(..drop);
        }
        for s in &removed {
            for kind in [
                SegmentKind::Log,
                SegmentKind::Index,
                SegmentKind::TimeIndex,
                SegmentKind::TxnIndex,
            ] {
                remove_if_exists(
                    self.writer.fs(),
                    &self.dir.join(layout::segment_file(s.base, s.epoch, kind)),
                )?;
            }
        }
        Ok(())
    }

    /// Clean shutdown: fsync and checkpoint so the next open scans nothing,
    /// and snapshot the producer state so it replays nothing either.
    pub fn close(mut self) -> Result<(), LogError> {
        self.sync_now()?;
        self.checkpoint()?;
        let now = self.now_ms;
        self.snapshot_producers(now)
    }

    /// The header of the batch at `pos` in the active segment (tests).
    pub fn active_header_at(
        &self,
        pos: u64,
    ) -> io::Result<Option<kaas_protocol::batch::BatchHeader>> {
        header_at(self.active_file()?.as_ref(), pos, self.write_pos)
    }

    /// The active segment's write handle, reopened if it was closed while
    /// idle. No scan: the positions are in memory; a file shorter than what
    /// was made durable is not ours any more (replaced under its name) and
    /// is refused, so the leader restarts and recovers.
    fn active_file(&self) -> io::Result<Arc<dyn WriteFile>> {
        let path = self.active_seg.log_path();
        let durable = self.active_seg.size();
        let fs = self.writer.fs();
        match self.active.get(|| {
            let f = fs.open_write(&path)?;
            let len = f.len()?;
            if len < durable {
                return Err(io::Error::other(format!(
                    "{} holds {len} bytes, fewer than the {durable} made durable",
                    path.display()
                )));
            }
            Ok(Handle::Write(f))
        })? {
            Handle::Write(f) => Ok(f),
            Handle::Read(_) => Err(io::Error::other("read handle in a write slot")),
        }
    }

    /// Close every clean handle of this log now (tests; the broker closes
    /// them through [`OpenFiles`] when idle). Returns how many closed.
    pub fn close_idle_files(&self) -> usize {
        let segs = self.view.read().unwrap().segments.clone();
        segs.iter().filter(|s| s.file.try_close()).count() + self.active.try_close() as usize
    }

    /// Whether the active segment's write handle is open.
    pub fn active_open(&self) -> bool {
        self.active.is_open()
    }
}

/// `e` with what we were doing and the path in its message, for the log
/// (kind kept; a lease refusal is passed through untouched, since
/// [`kaas_volume::fs::is_fenced`] must still recognise it).
fn at(e: io::Error, what: &str, path: &Path) -> io::Error {
    if kaas_volume::fs::is_fenced(&e) {
        return e;
    }
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// The manifest at `path` from `read` (its bytes, or why not): missing
/// means this host's view of the directory is stale.
fn parse_manifest(read: io::Result<Vec<u8>>, path: PathBuf) -> Result<Manifest, LogError> {
    let bytes = match read {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LogError::StaleView { path });
        }
        Err(e) => return Err(at(e, "reading manifest", &path).into()),
    };
    serde_json::from_slice(&bytes).map_err(|e| LogError::CorruptManifest {
        path,
        reason: e.to_string(),
    })
}

/// Where the CRC scan of an unsealed last segment starts: its first byte,
/// CRCs verified from the checkpointed size on.
fn tail_start(last: &SegmentEntry) -> ScanStart {
    ScanStart {
        pos: 0,
        next_offset: last.base,
        max_ts: -1,
        max_ts_pos: 0,
        verify_from: last.size,
    }
}

/// Take what the tail scan `s` of the segment at `path` found into its
/// entry. A scan shorter than the checkpoint promised is refused rather
/// than persisting a shorter log and reusing offsets that were
/// acknowledged.
fn adopt_tail(last: &mut SegmentEntry, s: &Scan, path: &Path) -> Result<(), LogError> {
    if s.end_pos < last.size {
        return Err(LogError::CorruptManifest {
            path: path.to_path_buf(),
            reason: format!(
                "segment holds {} valid bytes, checkpoint says {}",
                s.end_pos, last.size
            ),
        });
    }
    last.size = s.end_pos;
    last.next_offset = s.next_offset;
    last.max_ts = s.max_ts;
    last.max_ts_pos = s.max_ts_pos;
    last.markers |= s.markers;
    Ok(())
}

/// The open transactions of `p`, as the log tracks them (first offset →
/// producer id, no marker yet).
fn ongoing_of(p: &ProducerStates) -> BTreeMap<i64, (i64, Option<i64>)> {
    p.open_transactions()
        .map(|(first, pid)| (first, (pid, None)))
        .collect()
}

/// What [`load_producers`] found.
struct LoadedProducers {
    state: ProducerStates,
    /// Usable snapshots on disk (offset, epoch), ascending.
    snapshots: Vec<(i64, i32)>,
    /// Idempotent batches replayed from the log after the snapshot.
    replayed: u64,
    /// Whether a snapshot was loaded (else the last two segments were
    /// replayed).
    from_snapshot: bool,
}

/// Whether a snapshot written by epoch `e` as of offset `o` describes this
/// log: every offset below `o` must have been written by `e` or an earlier
/// epoch before any later epoch took over (a later epoch starts at or after
/// `o`). A zombie's late snapshot past the seal fails this and is swept.
fn snapshot_consistent(history: &[(i32, i64)], e: i32, o: i64) -> bool {
    history
        .iter()
        .find(|(h, _)| *h > e)
        .is_none_or(|(_, start)| o <= *start)
}

/// Load the producer state of the partition in `dir` after recovery (the
/// log ends at `log_end`): the newest snapshot of our epoch or earlier
/// that is at or below the log end, consistent with the epoch history and
/// intact (CRC), then the batch headers after it. Snapshots that are not
/// usable — past the log end, inconsistent, corrupt — are removed (never
/// one of a later epoch: that is a newer leader's). Without any snapshot
/// (a log written before snapshots existed, or none survived) the last two
/// segments are replayed, as Kafka does after an upgrade: recovery stays
/// bounded, and a producer known only from older segments is treated as
/// new (accepted at any sequence).
fn load_producers(
    fs: &ReadFs,
    sweep: Option<&dyn Fs>,
    dir: &Path,
    m: &Manifest,
    epoch: i32,
    log_end: i64,
    now_ms: i64,
) -> Result<LoadedProducers, LogError> {
    let mut found: Vec<(i64, i32)> = fs
        .list(dir)?
        .iter()
        .filter_map(|n| layout::parse_producer_snapshot(n))
        .filter(|(_, e)| *e <= epoch)
        .collect();
    found.sort();
    let mut usable = Vec::new();
    for (o, e) in found {
        if o <= log_end && snapshot_consistent(&m.epoch_history, e, o) {
            usable.push((o, e));
        } else {
            if let Some(fs) = sweep {
                tracing::info!(dir = %dir.display(), offset = o, epoch = e, log_end, "removing a producer snapshot past the log");
                remove_if_exists(fs, &dir.join(layout::producer_snapshot(o, e)))?;
            }
        }
    }
    let mut state = ProducerStates::new();
    let mut start = None;
    while let Some(&(o, e)) = usable.last() {
        let path = dir.join(layout::producer_snapshot(o, e));
        let decoded = match fs.read(&path) {
            Ok(b) => ProducerStates::decode(&b).filter(|(off, _)| *off == o),
            // A stale listing named it: nothing to load, nothing to remove.
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                usable.pop();
                continue;
            }
            Err(err) => return Err(err.into()),
        };
        match decoded {
            Some((_, s)) => {
                state = s;
                start = Some(o);
                break;
            }
            None => {
                if let Some(fs) = sweep {
                    tracing::warn!(dir = %dir.display(), offset = o, epoch = e, "removing a corrupt producer snapshot");
                    remove_if_exists(fs, &path)?;
                }
                usable.pop();
            }
        }
    }
    let from_snapshot = start.is_some();
    let start = start.unwrap_or_else(|| {
        let n = m.segments.len();
        m.segments
            .get(n.saturating_sub(2))
            .map(|s| s.base)
            .unwrap_or(m.log_start_offset)
    });
    let mut replayed = 0;
    for seg in m
        .segments
        .iter()
        .filter(|s| s.next_offset > start && s.size > 0)
    {
        let path = dir.join(layout::segment_log(seg.base, seg.epoch));
        let f = fs
            .open_read(&path)
            .map_err(|e| at(e, "replaying producer state from", &path))?;
        let mut pos = 0u64;
        while let Some(h) = header_at(f.as_ref(), pos, seg.size)? {
            if h.last_offset() >= start && h.producer_id >= 0 && h.is_control() {
                // A transaction marker: the one batch whose records are
                // read (it is small), for its coordinator epoch.
                if let Some(m) = txn_index::read_marker(f.as_ref(), pos, &h)? {
                    state.apply_marker(
                        h.producer_id,
                        h.producer_epoch,
                        m.coordinator_epoch,
                        now_ms,
                    );
                    replayed += 1;
                }
            } else if h.last_offset() >= start && h.producer_id >= 0 {
                state.replay(
                    &Incoming {
                        producer_id: h.producer_id,
                        epoch: h.producer_epoch,
                        first_seq: h.base_sequence,
                        last_offset_delta: h.last_offset_delta,
                        base_offset: h.base_offset,
                        timestamp: h.max_timestamp,
                        transactional: h.is_transactional(),
                    },
                    now_ms,
                );
                replayed += 1;
            }
            pos += h.batch_len as u64;
        }
    }
    Ok(LoadedProducers {
        state,
        snapshots: usable,
        replayed,
        from_snapshot,
    })
}

/// The last stable offset given the open transactions and the high
/// watermark: the earliest open transaction's first offset, capped by the
/// high watermark.
fn stable_offset(ongoing: &BTreeMap<i64, (i64, Option<i64>)>, hw: i64) -> i64 {
    ongoing.keys().next().map_or(hw, |first| (*first).min(hw))
}

/// Remove all but the newest [`SNAPSHOTS_KEPT`] of `snaps` (ascending).
fn prune_snapshots(fs: &dyn Fs, dir: &Path, snaps: &mut Vec<(i64, i32)>) -> io::Result<()> {
    while snaps.len() > SNAPSHOTS_KEPT {
        let (o, e) = snaps.remove(0);
        remove_if_exists(fs, &dir.join(layout::producer_snapshot(o, e)))?;
    }
    Ok(())
}
