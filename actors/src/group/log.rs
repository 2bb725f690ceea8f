//! `ShardLog`: a coordinator shard's state on the volume — one append-only,
//! epoch-stamped file of [`Record`]s, written by a single owner with group
//! commit, recovered to its last valid record, and compacted to its live
//! state.
//!
//! The log is generic over a [`ShardCodec`] (the record type, the live state
//! it folds into, and the shard directory): [`GroupCodec`] is the consumer
//! groups' (the default type parameter, so `ShardLog` alone is the group
//! log), `crate::txn::state::TxnCodec` the transaction coordinator's. The
//! framing (length, CRC32C, header frame) is shared.
//!
//! Files: `<cluster>/groups/<shard>/<base>-e<E>.log` ([`super::names`]). A
//! file always begins with a complete snapshot of the live state (a header,
//! then one record per live group and offset) and continues with appended
//! records, so recovery reads exactly one file: the highest (epoch, base).
//!
//! * **Open** (takeover or restart, epoch `E`): list the shard directory;
//!   a file of an epoch above `E` means a newer owner exists and the open
//!   fails with [`ShardLogError::Fenced`] (like `PartitionLog::open_as`).
//!   Otherwise read the highest file up to its first torn or corrupt frame,
//!   then *compact*: the state read is written as a new file of epoch `E`
//!   one number above every file seen. The new owner never appends to a file
//!   a previous owner (or a zombie of it) may still hold, and its recovery
//!   never scans more than live state plus one compaction interval.
//! * **Append** ([`ShardLog::append`]) writes records at the end of the file
//!   and returns a [`Ticket`]; nothing is durable, nor visible in
//!   [`ShardLog::state`], until a sync covering it completes. Group commit
//!   is the caller's loop, as in `partition/log.rs`: take a
//!   [`ShardLog::sync_target`], fsync it off the actor
//!   ([`SyncTarget::sync`]), feed it back to [`ShardLog::complete_sync`],
//!   which returns the durable ticket — every commit whose ticket is at or
//!   below it may be answered. A failed write or fsync poisons the log
//!   (never retried); the owner stops and reopens.
//! * **Compact** ([`ShardLog::compact`]): sync, then write the live state to
//!   a temp file, fsync, rename to the next name, fsync the directory
//!   (`kaas_volume::fs::write_atomic`), switch appends to it, remove older
//!   files. A crash at any step leaves either the old file (complete) or the
//!   new one (complete) as the highest; a failure of any step poisons the
//!   log, since the rename may or may not have happened.

use super::names::{parse_shard_log, shard_dir, shard_log};
use super::offsets::{
    decode, encode, encode_header, EncodeError, Frame, Header, Record, ShardState,
};

/// What a [`ShardLog`] stores: its records, the live state they fold into
/// (what a compaction writes back), and where the shard's files live.
pub trait ShardCodec: 'static {
    /// One record.
    type Record: Clone;
    /// The live state.
    type State: Default;
    /// The shard's directory in the cluster directory.
    fn dir(cluster: &Path, shard: ShardId) -> PathBuf;
    /// Append one framed record to `out` (unchanged on error).
    fn encode(r: &Self::Record, out: &mut Vec<u8>) -> Result<(), EncodeError>;
    /// Decode the frame at the start of `buf` (`None`: end of the valid
    /// prefix).
    fn decode(buf: &[u8]) -> Option<(Frame<Self::Record>, usize)>;
    /// Fold one record into the state.
    fn apply(state: &mut Self::State, r: &Self::Record);
    /// The live state as records.
    fn records(state: &Self::State) -> Vec<Self::Record>;
}

/// The consumer groups' shard log: offsets and group metadata.
pub struct GroupCodec;

impl ShardCodec for GroupCodec {
    type Record = Record;
    type State = ShardState;
    fn dir(cluster: &Path, shard: ShardId) -> PathBuf {
        shard_dir(cluster, shard)
    }
    fn encode(r: &Record, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        encode(r, out)
    }
    fn decode(buf: &[u8]) -> Option<(Frame, usize)> {
        decode(buf)
    }
    fn apply(state: &mut ShardState, r: &Record) {
        state.apply(r)
    }
    fn records(state: &ShardState) -> Vec<Record> {
        state.records().collect()
    }
}
use super::shard::ShardId;
use kaas_volume::fs::{remove_if_exists, remove_stale_temps, write_atomic, SharedFs, WriteFile};
use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// When compaction is due.
#[derive(Debug, Clone, Copy)]
pub struct ShardLogConfig {
    /// Compact once the file is at least this long…
    pub compact_min_bytes: u64,
    /// …and at least this many times the snapshot it started with.
    pub compact_ratio: u64,
}

impl Default for ShardLogConfig {
    fn default() -> Self {
        Self {
            compact_min_bytes: 16 << 20,
            compact_ratio: 2,
        }
    }
}

/// Names one [`ShardLog::append`]; durable once the durable ticket reaches
/// it. Tickets rise by one per append within one open log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub u64);

/// Why the log refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ShardLogError {
    /// A file of a newer epoch exists: another owner holds this shard.
    #[error("shard fenced: epoch {found} on disk is above ours ({epoch})")]
    Fenced {
        /// Our epoch.
        epoch: i32,
        /// The highest epoch found.
        found: i32,
    },
    /// The chosen file does not start with its own header.
    #[error("shard file {file} is corrupt: {reason}")]
    Corrupt {
        /// The file name.
        file: String,
        /// What was wrong.
        reason: &'static str,
    },
    /// A record that cannot be stored (nothing was written).
    #[error("invalid record: {0}")]
    Invalid(#[from] EncodeError),
    /// An earlier write or fsync failed; reopen.
    #[error("shard log poisoned by an earlier failure")]
    Poisoned,
    /// A file position or number would overflow.
    #[error("shard log position overflow")]
    Overflow,
    /// The volume failed.
    #[error("shard log i/o: {0}")]
    Io(#[from] io::Error),
}

/// A pending fsync: run [`SyncTarget::sync`] off the actor, then hand the
/// target to [`ShardLog::complete_sync`].
pub struct SyncTarget {
    file: Arc<dyn WriteFile>,
    pos: u64,
}

impl SyncTarget {
    /// The fsync (blocking). On error call [`ShardLog::sync_failed`].
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

struct Pending<R> {
    ticket: u64,
    end: u64,
    records: Vec<R>,
}

/// See module docs.
pub struct ShardLog<C: ShardCodec = GroupCodec> {
    fs: SharedFs,
    dir: PathBuf,
    shard: ShardId,
    epoch: i32,
    base: u64,
    file: Arc<dyn WriteFile>,
    write_pos: u64,
    /// Length of the snapshot the current file started with.
    snapshot_len: u64,
    state: C::State,
    pending: VecDeque<Pending<C::Record>>,
    last_ticket: u64,
    durable: u64,
    poisoned: bool,
    cfg: ShardLogConfig,
}

/// The shard files in a listing: (base, epoch, name).
fn shard_files(names: &[String]) -> Vec<(u64, i32, &str)> {
    names
        .iter()
        .filter_map(|n| parse_shard_log(n).map(|(b, e)| (b, e, n.as_str())))
        .collect()
}

impl<C: ShardCodec> ShardLog<C> {
    /// Open shard `shard` of the cluster directory `cluster` as its owner
    /// of epoch `epoch` (see module docs).
    pub fn open(
        fs: SharedFs,
        cluster: &Path,
        shard: ShardId,
        epoch: i32,
        cfg: ShardLogConfig,
    ) -> Result<Self, ShardLogError> {
        let dir = C::dir(cluster, shard);
        fs.create_dir_all(&dir)?;
        let names = fs.list(&dir)?;
        let files = shard_files(&names);
        if let Some(found) = files.iter().map(|f| f.1).filter(|e| *e > epoch).max() {
            return Err(ShardLogError::Fenced { epoch, found });
        }
        let state = match files.iter().max_by_key(|f| (f.1, f.0)) {
            Some(&(base, e, name)) => read_file::<C>(fs.as_ref(), &dir, shard, base, e, name)?,
            None => C::State::default(),
        };
        let max_base = files.iter().map(|f| f.0).max().unwrap_or(0);
        remove_stale_temps(fs.as_ref(), &dir)?;
        let base = max_base.checked_add(1).ok_or(ShardLogError::Overflow)?;
        let (file, len) = write_snapshot::<C>(fs.as_ref(), &dir, shard, epoch, base, &state)?;
        let log = Self {
            fs,
            dir,
            shard,
            epoch,
            base,
            file,
            write_pos: len,
            snapshot_len: len,
            state,
            pending: VecDeque::new(),
            last_ticket: 0,
            durable: 0,
            poisoned: false,
            cfg,
        };
        log.sweep(&names);
        // Every shard opens at every start (50 by default): DEBUG; the
        // coordinator's "loaded" line says what it found.
        tracing::debug!(
            shard = shard.0,
            epoch,
            base,
            dir = %log.dir.display(),
            "coordinator shard opened"
        );
        Ok(log)
    }

    /// The durable state: every record whose sync completed, nothing else.
    pub fn state(&self) -> &C::State {
        &self.state
    }

    /// The highest durable ticket.
    pub fn durable(&self) -> Ticket {
        Ticket(self.durable)
    }

    /// Our epoch.
    pub fn epoch(&self) -> i32 {
        self.epoch
    }

    /// The current file's number.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Bytes in the current file.
    pub fn len(&self) -> u64 {
        self.write_pos
    }

    /// Whether the current file holds nothing but its header and snapshot.
    pub fn is_empty(&self) -> bool {
        self.write_pos == self.snapshot_len
    }

    /// Write `records` at the end of the file (one write). Nothing is
    /// durable until a sync covering the returned ticket completes. A record
    /// that cannot be encoded refuses the whole call and writes nothing.
    pub fn append(&mut self, records: &[C::Record]) -> Result<Ticket, ShardLogError> {
        if self.poisoned {
            return Err(ShardLogError::Poisoned);
        }
        let mut buf = Vec::new();
        for r in records {
            C::encode(r, &mut buf)?;
        }
        let end = self
            .write_pos
            .checked_add(buf.len() as u64)
            .ok_or(ShardLogError::Overflow)?;
        let ticket = self
            .last_ticket
            .checked_add(1)
            .ok_or(ShardLogError::Overflow)?;
        if let Err(e) = self.file.write_all_at(&buf, self.write_pos) {
            self.poisoned = true;
            return Err(e.into());
        }
        self.write_pos = end;
        self.last_ticket = ticket;
        self.pending.push_back(Pending {
            ticket,
            end,
            records: records.to_vec(),
        });
        Ok(Ticket(ticket))
    }

    /// What an fsync now would cover, if anything is pending.
    pub fn sync_target(&self) -> Option<SyncTarget> {
        if self.poisoned || self.pending.is_empty() {
            return None;
        }
        Some(SyncTarget {
            file: self.file.clone(),
            pos: self.write_pos,
        })
    }

    /// Publish a completed fsync: the records it covers join the state.
    /// Returns the durable ticket. A target of a file since replaced by a
    /// compaction is ignored (the compaction made everything durable).
    pub fn complete_sync(&mut self, t: SyncTarget) -> Ticket {
        if self.poisoned || !Arc::ptr_eq(&t.file, &self.file) {
            return self.durable();
        }
        while self.pending.front().is_some_and(|p| p.end <= t.pos) {
            if let Some(p) = self.pending.pop_front() {
                for r in &p.records {
                    C::apply(&mut self.state, r);
                }
                self.durable = p.ticket;
            }
        }
        self.durable()
    }

    /// An fsync failed: the file is poisoned (its durable length unknown).
    /// Nothing more is written; the owner stops and reopens.
    pub fn sync_failed(&mut self) {
        self.poisoned = true;
    }

    /// Sync inline (tests, compaction, close).
    pub fn sync_now(&mut self) -> Result<Ticket, ShardLogError> {
        if self.poisoned {
            return Err(ShardLogError::Poisoned);
        }
        if let Some(t) = self.sync_target() {
            if let Err(e) = t.sync() {
                self.poisoned = true;
                return Err(e.into());
            }
            return Ok(self.complete_sync(t));
        }
        Ok(self.durable())
    }

    /// Whether the file has grown enough past its snapshot to compact.
    pub fn compaction_due(&self) -> bool {
        self.write_pos >= self.cfg.compact_min_bytes
            && self.write_pos >= self.snapshot_len.saturating_mul(self.cfg.compact_ratio)
    }

    /// Rewrite the live state as a new file and append there from now on
    /// (see module docs). Everything appended so far is durable when this
    /// returns; the returned ticket says so.
    pub fn compact(&mut self) -> Result<Ticket, ShardLogError> {
        self.sync_now()?;
        match self.compact_inner() {
            Ok(()) => Ok(self.durable()),
            Err(e) => {
                // The rename may have happened: appending to the old file
                // now could write records the new file hides.
                self.poisoned = true;
                Err(e)
            }
        }
    }

    fn compact_inner(&mut self) -> Result<(), ShardLogError> {
        let names = self.fs.list(&self.dir)?;
        let files = shard_files(&names);
        // A zombie must not compact over a successor's files.
        if let Some(found) = files.iter().map(|f| f.1).filter(|e| *e > self.epoch).max() {
            return Err(ShardLogError::Fenced {
                epoch: self.epoch,
                found,
            });
        }
        let max_base = files.iter().map(|f| f.0).max().unwrap_or(0).max(self.base);
        let base = max_base.checked_add(1).ok_or(ShardLogError::Overflow)?;
        let (file, len) = write_snapshot::<C>(
            self.fs.as_ref(),
            &self.dir,
            self.shard,
            self.epoch,
            base,
            &self.state,
        )?;
        self.file = file;
        self.base = base;
        self.write_pos = len;
        self.snapshot_len = len;
        self.sweep(&names);
        tracing::debug!(
            shard = self.shard.0,
            epoch = self.epoch,
            base,
            bytes = len,
            "coordinator shard compacted"
        );
        Ok(())
    }

    /// Remove every shard file of this listing older than the current one
    /// and not of a newer epoch. Best effort: a leftover is harmless (it is
    /// never the highest) and is removed again by the next open or
    /// compaction.
    fn sweep(&self, names: &[String]) {
        for (base, e, name) in shard_files(names) {
            if e <= self.epoch && (e, base) < (self.epoch, self.base) {
                if let Err(err) = remove_if_exists(self.fs.as_ref(), &self.dir.join(name)) {
                    tracing::warn!(shard = self.shard.0, file = name, error = %err, "old shard file not removed; retried at the next compaction");
                }
            }
        }
    }
}

/// Read one shard file up to its first torn or corrupt frame.
fn read_file<C: ShardCodec>(
    fs: &dyn kaas_volume::fs::Fs,
    dir: &Path,
    shard: ShardId,
    base: u64,
    epoch: i32,
    name: &str,
) -> Result<C::State, ShardLogError> {
    let bytes = fs.read(&dir.join(name))?;
    let corrupt = |reason| ShardLogError::Corrupt {
        file: name.to_string(),
        reason,
    };
    // The file was renamed into place whole and fsynced, so its header is
    // always there; without it we cannot know whose file this is, and
    // guessing could drop a group's offsets.
    let Some((Frame::Header(h), mut pos)) = C::decode(&bytes) else {
        return Err(corrupt("no header"));
    };
    if h != (Header {
        shard: shard.0,
        epoch,
        base,
    }) {
        return Err(corrupt("header does not match the file name"));
    }
    let mut state = C::State::default();
    while let Some((f, n)) = bytes.get(pos..).and_then(C::decode) {
        match f {
            Frame::Record(r) => C::apply(&mut state, &r),
            Frame::Header(_) => break,
        }
        pos += n;
    }
    if pos < bytes.len() {
        tracing::info!(
            shard = shard.0,
            file = name,
            valid = pos,
            len = bytes.len(),
            "torn tail ignored"
        );
    }
    Ok(state)
}

/// Write `state` as file `base` of `epoch` (temp → fsync → rename → dir
/// fsync) and open it for appending.
fn write_snapshot<C: ShardCodec>(
    fs: &dyn kaas_volume::fs::Fs,
    dir: &Path,
    shard: ShardId,
    epoch: i32,
    base: u64,
    state: &C::State,
) -> Result<(Arc<dyn WriteFile>, u64), ShardLogError> {
    let mut buf = Vec::new();
    encode_header(
        Header {
            shard: shard.0,
            epoch,
            base,
        },
        &mut buf,
    );
    for r in C::records(state) {
        C::encode(&r, &mut buf)?;
    }
    let path = dir.join(shard_log(base, epoch));
    write_atomic(fs, &path, &buf)?;
    let file = fs.open_write(&path)?;
    Ok((file, buf.len() as u64))
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests tear files by hand
mod tests {
    use super::*;
    use crate::group::offsets::OffsetValue;
    use kaas_volume::fs::fault::FaultFs;
    use kaas_volume::fs::RealFs;
    use std::collections::{BTreeMap, BTreeSet};

    const SHARD: ShardId = ShardId(3);

    fn commit(topic: &str, p: i32, offset: i64) -> Record {
        Record::Offset {
            group: "g".into(),
            topic: topic.into(),
            partition: p,
            value: OffsetValue {
                offset,
                leader_epoch: 1,
                metadata: None,
                commit_ms: 1,
                expire_ms: None,
            },
        }
    }

    fn offsets(log: &ShardLog) -> BTreeMap<(String, i32), i64> {
        log.state()
            .offsets
            .iter()
            .map(|(k, v)| ((k.topic.clone(), k.partition), v.offset))
            .collect()
    }

    fn shard_names(cluster: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(shard_dir(cluster, SHARD))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    fn real() -> SharedFs {
        Arc::new(RealFs)
    }

    #[test]
    fn commits_round_trip_and_only_synced_ones_are_state() {
        let dir = tempfile::tempdir().unwrap();
        let mut log: ShardLog =
            ShardLog::open(real(), dir.path(), SHARD, 1, Default::default()).unwrap();
        let t1 = log.append(&[commit("a", 0, 5), commit("a", 1, 7)]).unwrap();
        let t2 = log.append(&[commit("a", 0, 6)]).unwrap();
        assert!(t2 > t1);
        assert!(log.state().offsets.is_empty(), "not durable yet");
        let target = log.sync_target().unwrap();
        let t3 = log.append(&[commit("b", 0, 1)]).unwrap();
        target.sync().unwrap();
        assert_eq!(
            log.complete_sync(target),
            t2,
            "one fsync covers both, not the later one"
        );
        assert_eq!(offsets(&log).len(), 2);
        assert_eq!(log.sync_now().unwrap(), t3);
        drop(log);
        let log: ShardLog =
            ShardLog::open(real(), dir.path(), SHARD, 1, Default::default()).unwrap();
        assert_eq!(
            offsets(&log),
            BTreeMap::from([
                (("a".into(), 0), 6),
                (("a".into(), 1), 7),
                (("b".into(), 0), 1)
            ])
        );
        assert_eq!(
            shard_names(dir.path()),
            vec![shard_log(2, 1)],
            "reopen compacted and swept"
        );
    }

    #[test]
    fn a_torn_tail_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let mut log: ShardLog =
            ShardLog::open(real(), dir.path(), SHARD, 1, Default::default()).unwrap();
        log.append(&[commit("a", 0, 1)]).unwrap();
        log.sync_now().unwrap();
        log.append(&[commit("a", 0, 2)]).unwrap();
        log.sync_now().unwrap();
        let path = shard_dir(dir.path(), SHARD).join(shard_log(1, 1));
        let len = log.len();
        drop(log);
        // Cut the last record short, and also try garbage after a whole one.
        for (cut, tail) in [(len - 3, &b""[..]), (len, &b"\x00\x00\x00\x09garbage!"[..])] {
            let d2 = tempfile::tempdir().unwrap();
            let p2 = shard_dir(d2.path(), SHARD);
            std::fs::create_dir_all(&p2).unwrap();
            let mut bytes = std::fs::read(&path).unwrap();
            bytes.truncate(cut as usize);
            bytes.extend_from_slice(tail);
            std::fs::write(p2.join(shard_log(1, 1)), bytes).unwrap();
            let log: ShardLog =
                ShardLog::open(real(), d2.path(), SHARD, 2, Default::default()).unwrap();
            let want = if tail.is_empty() { 1 } else { 2 };
            assert_eq!(offsets(&log), BTreeMap::from([(("a".into(), 0), want)]));
        }
    }

    #[test]
    fn a_newer_epoch_fences_an_older_opener_and_a_zombie_is_never_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut old: ShardLog =
            ShardLog::open(real(), dir.path(), SHARD, 1, Default::default()).unwrap();
        old.append(&[commit("a", 0, 1)]).unwrap();
        old.sync_now().unwrap();
        let new: ShardLog =
            ShardLog::open(real(), dir.path(), SHARD, 2, Default::default()).unwrap();
        assert_eq!(offsets(&new).len(), 1);
        // The zombie's late commit lands in a file the new owner left behind.
        old.append(&[commit("zombie", 0, 9)]).unwrap();
        old.sync_now().unwrap();
        assert!(matches!(
            old.compact(),
            Err(ShardLogError::Fenced { epoch: 1, found: 2 })
        ));
        assert!(matches!(
            ShardLog::<GroupCodec>::open(real(), dir.path(), SHARD, 1, Default::default()),
            Err(ShardLogError::Fenced { epoch: 1, found: 2 })
        ));
        drop(new);
        let next: ShardLog =
            ShardLog::open(real(), dir.path(), SHARD, 3, Default::default()).unwrap();
        assert_eq!(offsets(&next), BTreeMap::from([(("a".into(), 0), 1)]));
    }

    #[test]
    fn a_failed_fsync_poisons_and_a_bad_record_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new();
        let mut log: ShardLog = ShardLog::open(
            Arc::new(fs.clone()),
            dir.path(),
            SHARD,
            1,
            Default::default(),
        )
        .unwrap();
        let len = log.len();
        let long = Record::GroupTombstone {
            group: "g".repeat(70_000),
        };
        assert!(matches!(
            log.append(&[commit("a", 0, 1), long]),
            Err(ShardLogError::Invalid(_))
        ));
        assert_eq!(log.len(), len);
        log.append(&[commit("a", 0, 1)]).unwrap();
        fs.fail_nth(fs.ops() + 1);
        assert!(matches!(log.sync_now(), Err(ShardLogError::Io(_))));
        assert!(matches!(
            log.append(&[commit("a", 0, 2)]),
            Err(ShardLogError::Poisoned)
        ));
        assert!(log.sync_target().is_none());
        assert!(log.state().offsets.is_empty(), "never durable, never state");
    }

    #[test]
    fn compaction_bounds_the_file_by_live_state() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = ShardLogConfig {
            compact_min_bytes: 4096,
            compact_ratio: 2,
        };
        let mut log: ShardLog = ShardLog::open(real(), dir.path(), SHARD, 1, cfg).unwrap();
        let mut i = 0;
        while !log.compaction_due() {
            log.append(&[commit("a", i % 4, i as i64)]).unwrap();
            i += 1;
        }
        log.sync_now().unwrap();
        let before = log.len();
        let base = log.base();
        log.compact().unwrap();
        assert!(log.len() < before / 4, "{} vs {before}", log.len());
        assert_eq!(log.base(), base + 1);
        assert_eq!(offsets(&log).len(), 4);
        assert_eq!(shard_names(dir.path()), vec![shard_log(base + 1, 1)]);
    }

    type Key = (String, i32);

    /// The scenario of the crash test: appends, group commits, a compaction,
    /// unsynced tails. Records what was appended and what was acknowledged
    /// (a sync that returned), stopping at the first error (the crash).
    fn scenario(
        fs: SharedFs,
        cluster: &Path,
        appended: &mut BTreeSet<(Key, i64)>,
        acked: &mut BTreeMap<Key, i64>,
    ) -> Result<(), ShardLogError> {
        let cfg = ShardLogConfig::default();
        let mut log: ShardLog = ShardLog::open(fs, cluster, SHARD, 1, cfg)?;
        let mut unacked: Vec<(Key, i64)> = Vec::new();
        let mut append =
            |log: &mut ShardLog, rs: &[(&str, i32, i64)], unacked: &mut Vec<(Key, i64)>| {
                let recs: Vec<Record> = rs.iter().map(|&(t, p, o)| commit(t, p, o)).collect();
                log.append(&recs)?;
                for &(t, p, o) in rs {
                    appended.insert(((t.into(), p), o));
                    unacked.push(((t.into(), p), o));
                }
                Ok::<_, ShardLogError>(())
            };
        let ack = |unacked: &mut Vec<(Key, i64)>, acked: &mut BTreeMap<Key, i64>| {
            for (k, o) in unacked.drain(..) {
                acked.insert(k, o);
            }
        };
        append(&mut log, &[("a", 0, 1), ("a", 1, 1)], &mut unacked)?;
        log.sync_now()?;
        ack(&mut unacked, acked);
        append(&mut log, &[("a", 0, 2)], &mut unacked)?;
        append(&mut log, &[("b", 0, 1)], &mut unacked)?;
        log.sync_now()?;
        ack(&mut unacked, acked);
        append(&mut log, &[("c", 0, 1)], &mut unacked)?;
        log.compact()?;
        ack(&mut unacked, acked);
        append(&mut log, &[("a", 0, 3), ("d", 0, 1)], &mut unacked)?;
        log.sync_now()?;
        ack(&mut unacked, acked);
        append(&mut log, &[("e", 0, 1)], &mut unacked)?;
        append(&mut log, &[("a", 1, 2)], &mut unacked)?;
        log.sync_now()?;
        ack(&mut unacked, acked);
        append(&mut log, &[("f", 0, 1)], &mut unacked)?;
        Ok(())
    }

    #[test]
    fn crash_at_every_step_of_append_sync_and_compaction() {
        let clean = FaultFs::new();
        let dir = tempfile::tempdir().unwrap();
        let (mut appended, mut acked) = (BTreeSet::new(), BTreeMap::new());
        scenario(
            Arc::new(clean.clone()),
            dir.path(),
            &mut appended,
            &mut acked,
        )
        .unwrap();
        let steps = clean.ops();
        assert!(steps > 15, "{:?}", clean.log());
        for n in 1..=steps + 1 {
            let dir = tempfile::tempdir().unwrap();
            let fs = FaultFs::new();
            fs.crash_at(n);
            let (mut appended, mut acked) = (BTreeSet::new(), BTreeMap::new());
            let _ = scenario(Arc::new(fs.clone()), dir.path(), &mut appended, &mut acked);
            fs.power_loss();
            // A fresh seam: the takeover (or restart) of a new owner.
            let epoch = if n % 2 == 0 { 2 } else { 1 };
            let log: ShardLog = ShardLog::open(
                Arc::new(FaultFs::new()),
                dir.path(),
                SHARD,
                epoch,
                Default::default(),
            )
            .unwrap_or_else(|e| panic!("crash at {n}: reopen failed: {e}\n{:#?}", fs.log()));
            let got = offsets(&log);
            for (k, o) in &acked {
                let have = got.get(k).copied();
                assert!(
                    have >= Some(*o),
                    "crash at {n}: acked {k:?}={o} lost (have {have:?})\n{:#?}",
                    fs.log()
                );
            }
            for (k, o) in &got {
                assert!(
                    appended.contains(&(k.clone(), *o)),
                    "crash at {n}: {k:?}={o} never appended"
                );
            }
            let names = shard_names(dir.path());
            assert_eq!(names.len(), 1, "crash at {n}: {names:?}");
        }
    }

    #[test]
    fn crash_at_every_step_of_a_compaction_keeps_every_synced_commit() {
        let run = |fs: SharedFs, cluster: &Path, crash: Option<(&FaultFs, u64)>| {
            let mut log: ShardLog =
                ShardLog::open(fs, cluster, SHARD, 4, Default::default()).unwrap();
            for i in 0..20 {
                log.append(&[commit("t", i % 5, i64::from(i))]).unwrap();
            }
            log.sync_now().unwrap();
            if let Some((f, n)) = crash {
                f.crash_at(f.ops() + n);
            }
            log.compact().map(|_| ())
        };
        let clean = FaultFs::new();
        let dir = tempfile::tempdir().unwrap();
        let before = clean.ops();
        run(Arc::new(clean.clone()), dir.path(), None).unwrap();
        let mut steps = 0;
        for n in 1.. {
            let dir = tempfile::tempdir().unwrap();
            let fs = FaultFs::new();
            let done = run(Arc::new(fs.clone()), dir.path(), Some((&fs, n))).is_ok();
            fs.power_loss();
            let log: ShardLog = ShardLog::open(
                Arc::new(FaultFs::new()),
                dir.path(),
                SHARD,
                4,
                Default::default(),
            )
            .unwrap();
            let want: BTreeMap<Key, i64> = (15..20)
                .map(|i| (("t".to_string(), i % 5), i64::from(i)))
                .collect();
            assert_eq!(offsets(&log), want, "crash at compaction step {n}");
            if done {
                break;
            }
            steps += 1;
        }
        assert!(
            steps >= 5,
            "create, write, sync, rename, sync_dir: {steps} (clean run took {})",
            clean.ops() - before
        );
    }
}
