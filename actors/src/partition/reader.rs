//! Read-only access to a partition for Fetch and ListOffsets.
//!
//! A [`PartitionReader`] is handed out by the partition's leader actor. It
//! sees only durable bytes (never past the high watermark), holds read
//! handles the leader opened, and does its positional reads on the caller's
//! thread — callers run it on the blocking pool, so a fetch never waits on
//! the leader's mailbox or its fsyncs, and never blocks produce.
//!
//! `read_committed` reads ([`PartitionReader::read_committed`]) stop at the
//! last stable offset and list the aborted transactions overlapping what
//! they return, from each segment's aborted-transaction index.

use super::index::header_at;
use super::log::{LogView, SegView};
use super::txn_index::AbortedTxn;
use bytes::Bytes;
use kaas_protocol::batch::record_timestamps;
use kaas_volume::fs::{ReadFile, ReadFs};
use std::io;
use std::sync::{Arc, RwLock};

/// Errors a read can meet.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The requested offset is below the log start or above the high watermark.
    #[error("offset {offset} out of range [{start}, {hw}]")]
    OutOfRange {
        /// Requested offset.
        offset: i64,
        /// Log start offset.
        start: i64,
        /// High watermark.
        hw: i64,
    },
    /// The volume failed.
    #[error("storage i/o: {0}")]
    Io(#[from] io::Error),
}

/// Records read for one fetch.
#[derive(Debug, Clone)]
pub struct ReadResult {
    /// Whole batches (the last may be cut at `max_bytes`, as Kafka does).
    pub records: Bytes,
    /// High watermark when read.
    pub high_watermark: i64,
    /// Log start offset when read.
    pub log_start_offset: i64,
    /// Last stable offset when read.
    pub last_stable_offset: i64,
    /// `read_committed` only: (producer id, first offset) of every aborted
    /// transaction overlapping the records returned, by first offset.
    pub aborted: Vec<(i64, i64)>,
}

/// A range of one segment file: `len` bytes at `pos`, read through (or
/// sent from) a handle that keeps the file open while it is held.
#[derive(Clone)]
pub struct FileRange {
    /// The segment's handle.
    pub file: Arc<dyn ReadFile>,
    /// Byte position in the file.
    pub pos: u64,
    /// Bytes in the range.
    pub len: u64,
}

impl std::fmt::Debug for FileRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileRange")
            .field("pos", &self.pos)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl FileRange {
    /// The range's bytes, read into memory (the copy path).
    pub fn read(&self) -> io::Result<Bytes> {
        let mut buf = vec![0u8; self.len as usize];
        self.file.read_exact_at(&mut buf, self.pos)?;
        Ok(Bytes::from(buf))
    }
}

/// Where a fetch's records are, and what its answer says besides
/// ([`PartitionReader::locate`]).
#[derive(Debug, Clone)]
pub struct Located {
    /// The records: whole batches (the last may be cut at `max_bytes`, as
    /// Kafka does); `None` when there are none.
    pub range: Option<FileRange>,
    /// High watermark when located.
    pub high_watermark: i64,
    /// Log start offset when located.
    pub log_start_offset: i64,
    /// Last stable offset when located.
    pub last_stable_offset: i64,
    /// `read_committed` only: (producer id, first offset) of every aborted
    /// transaction overlapping the records, by first offset.
    pub aborted: Vec<(i64, i64)>,
}

/// A record located by timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampHit {
    /// Record offset.
    pub offset: i64,
    /// Record timestamp.
    pub timestamp: i64,
    /// Leader epoch of the batch holding it.
    pub leader_epoch: i32,
}

/// See module docs.
#[derive(Clone)]
pub struct PartitionReader {
    fs: ReadFs,
    view: Arc<RwLock<LogView>>,
}

impl PartitionReader {
    /// A reader over a leader's view.
    pub fn new(fs: ReadFs, view: Arc<RwLock<LogView>>) -> Self {
        Self { fs, view }
    }

    /// (log start offset, high watermark, leader epoch).
    pub fn offsets(&self) -> (i64, i64, i32) {
        let v = self.view.read().unwrap();
        (v.log_start_offset, v.high_watermark, v.epoch)
    }

    /// The last stable offset (the high watermark when no transaction is
    /// open).
    pub fn last_stable_offset(&self) -> i64 {
        self.view.read().unwrap().last_stable_offset
    }

    /// Bytes of the log served now (every segment's durable size):
    /// DescribeLogDirs.
    pub fn size_bytes(&self) -> u64 {
        let v = self.view.read().unwrap();
        v.segments.iter().map(|s| s.size()).sum()
    }

    /// (log start offset, high watermark, end offset, segments, bytes) for
    /// the dashboard: the end offset and bytes include what is appended but
    /// not yet durable.
    pub fn summary(&self) -> (i64, i64, i64, usize, u64) {
        let v = self.view.read().unwrap();
        let end = v
            .segments
            .last()
            .map_or(v.high_watermark, |s| s.next_offset());
        let bytes = v.segments.iter().map(|s| s.size()).sum();
        (
            v.log_start_offset,
            v.high_watermark,
            end,
            v.segments.len(),
            bytes,
        )
    }

    fn snapshot(&self) -> (i64, i64, Vec<Arc<SegView>>) {
        let v = self.view.read().unwrap();
        (v.log_start_offset, v.high_watermark, v.segments.clone())
    }

    /// Like [`Self::snapshot`], with each segment's durable size captured
    /// under the same lock as the high watermark.
    fn sized_snapshot(&self) -> (i64, i64, i64, Vec<(Arc<SegView>, u64)>) {
        let v = self.view.read().unwrap();
        let segs = v.segments.iter().map(|s| (s.clone(), s.size())).collect();
        (
            v.log_start_offset,
            v.high_watermark,
            v.last_stable_offset,
            segs,
        )
    }

    /// Read batches starting at the one containing `offset`, up to
    /// `max_bytes` (but always the whole first batch, per KIP-74).
    pub fn read(&self, offset: i64, max_bytes: usize) -> Result<ReadResult, ReadError> {
        self.read_upto(offset, max_bytes, false)
    }

    /// [`Self::read`] for `isolation_level = read_committed`: only batches
    /// below the last stable offset, and the aborted transactions that
    /// overlap them.
    pub fn read_committed(&self, offset: i64, max_bytes: usize) -> Result<ReadResult, ReadError> {
        self.read_upto(offset, max_bytes, true)
    }

    /// Where [`Self::read`] (or, with `committed`, [`Self::read_committed`])
    /// would read, without reading the records: a range of a segment file
    /// to send from (`sendfile`), bounded by the segment's durable size
    /// when the view was taken, and the offsets and aborted transactions
    /// the answer carries. Reading the range gives exactly what `read`
    /// returns. The range's bytes never change while its handle is held:
    /// they are durable (below the high watermark), segments are
    /// append-only, and a deleted or closed segment keeps its bytes for the
    /// holder of the descriptor.
    pub fn locate(
        &self,
        offset: i64,
        max_bytes: usize,
        committed: bool,
    ) -> Result<Located, ReadError> {
        let (start, hw, lso, segs) = self.sized_snapshot();
        if offset < start || offset > hw {
            return Err(ReadError::OutOfRange { offset, start, hw });
        }
        // Batches never straddle the LSO: it is a batch's first offset or
        // the high watermark.
        let upto = if committed { lso.min(hw) } else { hw };
        let mut res = Located {
            range: None,
            high_watermark: hw,
            log_start_offset: start,
            last_stable_offset: lso,
            aborted: Vec::new(),
        };
        if offset >= upto {
            return Ok(res);
        }
        let first = segs
            .partition_point(|(s, _)| s.base <= offset)
            .saturating_sub(1);
        for (seg, limit) in &segs[first..] {
            let limit = *limit;
            if seg.next_offset() <= offset || limit == 0 {
                continue;
            }
            let file = seg.file(&self.fs)?;
            let mut pos = seg.lookup_offset(&self.fs, offset)?;
            while let Some(h) = header_at(file.as_ref(), pos, limit)? {
                let len = h.batch_len as u64;
                if h.last_offset() >= offset {
                    let want = (max_bytes as u64).max(len);
                    let mut end = limit.min(pos + want);
                    if committed {
                        // Every whole batch below the durable size is below
                        // the high watermark, so with no open transaction
                        // nothing is cut; the batch headers are walked only
                        // to cut at the LSO or to bound aborted
                        // transactions there are.
                        let candidates = self.aborted_between(&segs, offset, i64::MAX, hw)?;
                        if upto < hw || !candidates.is_empty() {
                            // Cut before the first batch at or past the
                            // LSO, and note where the batches returned end
                            // (a header wholly inside the range counts, as
                            // when the range was read into memory).
                            let (mut p, mut reach) = (pos, offset);
                            while let Some(b) = header_at(file.as_ref(), p, end)? {
                                if b.base_offset >= upto {
                                    end = p;
                                    break;
                                }
                                reach = b.last_offset() + 1;
                                p += b.batch_len as u64;
                            }
                            if reach > offset {
                                res.aborted = candidates
                                    .into_iter()
                                    .filter(|(_, first)| *first < reach)
                                    .collect();
                            }
                        }
                    }
                    res.range = Some(FileRange {
                        file,
                        pos,
                        len: end - pos,
                    });
                    return Ok(res);
                }
                pos += len;
            }
        }
        Ok(res)
    }

    fn read_upto(
        &self,
        offset: i64,
        max_bytes: usize,
        committed: bool,
    ) -> Result<ReadResult, ReadError> {
        let l = self.locate(offset, max_bytes, committed)?;
        let records = match &l.range {
            Some(r) => r.read()?,
            None => Bytes::new(),
        };
        Ok(ReadResult {
            records,
            high_watermark: l.high_watermark,
            log_start_offset: l.log_start_offset,
            last_stable_offset: l.last_stable_offset,
            aborted: l.aborted,
        })
    }

    /// (producer id, first offset) of the aborted transactions overlapping
    /// `[from, to)`: those whose marker is at or after `from` (so in the
    /// segment holding `from` or a later one) and that started before
    /// `to`, durable markers only.
    fn aborted_between(
        &self,
        segs: &[(Arc<SegView>, u64)],
        from: i64,
        to: i64,
        hw: i64,
    ) -> Result<Vec<(i64, i64)>, ReadError> {
        let mut out: Vec<AbortedTxn> = Vec::new();
        if to <= from {
            return Ok(Vec::new());
        }
        for (seg, _) in segs.iter().filter(|(s, _)| s.next_offset() > from) {
            for t in seg.aborted_txns(&self.fs)? {
                if t.last_offset >= from && t.first_offset < to && t.last_offset < hw {
                    out.push(t);
                }
            }
        }
        out.sort_by_key(|t| (t.first_offset, t.producer_id));
        Ok(out
            .into_iter()
            .map(|t| (t.producer_id, t.first_offset))
            .collect())
    }

    /// First record with timestamp >= `ts` (ListOffsets by time).
    pub fn offset_for_timestamp(&self, ts: i64) -> Result<Option<TimestampHit>, ReadError> {
        let (_, hw, segs) = self.snapshot();
        for seg in &segs {
            let limit = seg.size();
            if seg.max_ts() < ts || limit == 0 {
                continue;
            }
            let file = seg.file(&self.fs)?;
            let mut pos = seg.lookup_time(&self.fs, ts)?;
            while let Some(h) = header_at(file.as_ref(), pos, limit)? {
                let len = h.batch_len as u64;
                if h.max_timestamp >= ts && h.base_offset < hw {
                    let mut buf = vec![0u8; len as usize];
                    file.read_exact_at(&mut buf, pos)?;
                    if let Ok(recs) = record_timestamps(&buf) {
                        if let Some((o, t)) = recs.into_iter().find(|(_, t)| *t >= ts) {
                            return Ok(Some(TimestampHit {
                                offset: o,
                                timestamp: t,
                                leader_epoch: h.leader_epoch,
                            }));
                        }
                    }
                    // Undecodable records: answer at batch granularity.
                    return Ok(Some(TimestampHit {
                        offset: h.base_offset,
                        timestamp: h.max_timestamp,
                        leader_epoch: h.leader_epoch,
                    }));
                }
                pos += len;
            }
        }
        Ok(None)
    }

    /// The record with the largest timestamp (ListOffsets -3, KIP-734).
    pub fn max_timestamp(&self) -> Result<Option<TimestampHit>, ReadError> {
        let (_, _, segs) = self.snapshot();
        let Some(seg) = segs
            .iter()
            .filter(|s| s.size() > 0)
            .max_by_key(|s| (s.max_ts(), std::cmp::Reverse(s.base)))
        else {
            return Ok(None);
        };
        let file = seg.file(&self.fs)?;
        let pos = seg.max_ts_pos();
        let Some(h) = header_at(file.as_ref(), pos, seg.size())? else {
            return Ok(None);
        };
        let mut buf = vec![0u8; h.batch_len];
        file.read_exact_at(&mut buf, pos)?;
        let hit = record_timestamps(&buf)
            .ok()
            .and_then(|recs| recs.into_iter().find(|(_, t)| *t == h.max_timestamp));
        let (offset, timestamp) = hit.unwrap_or((h.last_offset(), h.max_timestamp));
        Ok(Some(TimestampHit {
            offset,
            timestamp,
            leader_epoch: h.leader_epoch,
        }))
    }

    /// End offset of `epoch` (OffsetForLeaderEpoch, KIP-101): the start of the
    /// next higher epoch, or the high watermark... (log end) for the current
    /// one. Returns (epoch, end offset); (-1, -1) if `epoch` predates history.
    pub fn end_offset_for_epoch(&self, epoch: i32) -> (i32, i64) {
        let v = self.view.read().unwrap();
        let h = &v.epoch_history;
        match h.iter().rposition(|(e, _)| *e <= epoch) {
            None => (-1, -1),
            Some(i) => {
                let end = h.get(i + 1).map(|(_, o)| *o).unwrap_or(v.high_watermark);
                (h[i].0, end)
            }
        }
    }
}
