//! Sparse offset + time index of one segment, and the batch scanner that
//! builds it and validates a segment's tail on recovery.
//!
//! In memory one entry carries (relative offset, position, max timestamp of
//! every batch before it). On disk, at seal, the same entries are written as
//! Kafka-shaped `.index` (rel offset u32 BE, position u32 BE) and
//! `.timeindex` (timestamp i64 BE, rel offset u32 BE) files; the time file
//! stores the running maximum *before* the entry so a lookup by timestamp can
//! never skip the first batch at or after the target.

use kaas_protocol::batch::{read_batch_header, BatchHeader, BATCH_HEADER_LEN, LOG_OVERHEAD};
use kaas_volume::fs::ReadFile;
use std::io;

/// One sparse index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Base offset of the batch at `pos`, relative to the segment base.
    pub rel_offset: u32,
    /// Byte position of the batch in the segment.
    pub pos: u32,
    /// Largest timestamp of any batch before `pos` in this segment (-1 if none).
    pub max_ts_before: i64,
}

/// Sparse index of one segment.
#[derive(Debug, Clone, Default)]
pub struct Index {
    /// Entries in position order.
    pub entries: Vec<IndexEntry>,
    last_pos: Option<u64>,
    interval: u64,
}

impl Index {
    /// An empty index that adds an entry every `interval` bytes.
    pub fn new(interval: u64) -> Self {
        Self {
            entries: Vec::new(),
            last_pos: None,
            interval: interval.max(1),
        }
    }

    /// Where the index stands now, to [`Self::rewind`] to if the write the
    /// next observations describe fails.
    pub fn mark(&self) -> (usize, Option<u64>) {
        (self.entries.len(), self.last_pos)
    }

    /// Forget every observation since `mark`.
    pub fn rewind(&mut self, mark: (usize, Option<u64>)) {
        self.entries.truncate(mark.0);
        self.last_pos = mark.1;
    }

    /// Forget every entry at or past byte `pos` (the file was cut there).
    pub fn truncate_from(&mut self, pos: u64) {
        let keep = self.entries.partition_point(|e| u64::from(e.pos) < pos);
        self.entries.truncate(keep);
        self.last_pos = self.entries.last().map(|e| u64::from(e.pos));
    }

    /// Record a batch starting at `pos`; adds an entry when due.
    pub fn observe(&mut self, rel_offset: u32, pos: u64, max_ts_before: i64) {
        let due = match self.last_pos {
            None => true,
            Some(p) => pos >= p + self.interval,
        };
        if due && pos <= u32::MAX as u64 {
            self.entries.push(IndexEntry {
                rel_offset,
                pos: pos as u32,
                max_ts_before,
            });
            self.last_pos = Some(pos);
        }
    }

    /// Position of the last indexed batch whose base offset is <= `rel`.
    pub fn lookup_offset(&self, rel: u32) -> u64 {
        let i = self.entries.partition_point(|e| e.rel_offset <= rel);
        if i == 0 {
            0
        } else {
            self.entries[i - 1].pos as u64
        }
    }

    /// Position from which to scan for the first batch with max timestamp
    /// >= `ts`: the last entry whose preceding batches are all older.
    pub fn lookup_time(&self, ts: i64) -> u64 {
        let i = self.entries.partition_point(|e| e.max_ts_before < ts);
        if i == 0 {
            0
        } else {
            self.entries[i - 1].pos as u64
        }
    }

    /// Encode as the `.index` and `.timeindex` files.
    pub fn encode(&self) -> (Vec<u8>, Vec<u8>) {
        let mut idx = Vec::with_capacity(self.entries.len() * 8);
        let mut tim = Vec::with_capacity(self.entries.len() * 12);
        for e in &self.entries {
            idx.extend_from_slice(&e.rel_offset.to_be_bytes());
            idx.extend_from_slice(&e.pos.to_be_bytes());
            tim.extend_from_slice(&e.max_ts_before.to_be_bytes());
            tim.extend_from_slice(&e.rel_offset.to_be_bytes());
        }
        (idx, tim)
    }

    /// Decode from the two files; `None` if they disagree or are torn (the
    /// caller then rebuilds by scanning, which is always correct).
    pub fn decode(idx: &[u8], tim: &[u8], interval: u64) -> Option<Self> {
        if !idx.len().is_multiple_of(8)
            || !tim.len().is_multiple_of(12)
            || idx.len() / 8 != tim.len() / 12
        {
            return None;
        }
        let mut entries = Vec::with_capacity(idx.len() / 8);
        for (a, b) in idx.chunks_exact(8).zip(tim.chunks_exact(12)) {
            let rel_offset = u32::from_be_bytes(a[0..4].try_into().ok()?);
            let pos = u32::from_be_bytes(a[4..8].try_into().ok()?);
            let max_ts_before = i64::from_be_bytes(b[0..8].try_into().ok()?);
            if u32::from_be_bytes(b[8..12].try_into().ok()?) != rel_offset {
                return None;
            }
            entries.push(IndexEntry {
                rel_offset,
                pos,
                max_ts_before,
            });
        }
        let last_pos = entries.last().map(|e| e.pos as u64);
        Some(Self {
            entries,
            last_pos,
            interval,
        })
    }
}

/// Result of scanning a run of batches.
#[derive(Debug, Clone)]
pub struct Scan {
    /// Position after the last valid batch.
    pub end_pos: u64,
    /// One past the last offset of the last valid batch.
    pub next_offset: i64,
    /// Largest batch max-timestamp seen, including `start_max_ts`.
    pub max_ts: i64,
    /// Position of the batch holding `max_ts`.
    pub max_ts_pos: u64,
    /// Number of valid batches scanned.
    pub batches: u64,
    /// Why the scan stopped before the end of the file, if it did.
    pub stopped: Option<String>,
    /// Whether a control batch (a transaction marker) was walked past.
    pub markers: bool,
}

/// Where a scan starts and what it already knows.
#[derive(Debug, Clone, Copy)]
pub struct ScanStart {
    /// Byte position of the first batch to scan.
    pub pos: u64,
    /// Offset expected at `pos` (the segment base, or a checkpoint).
    pub next_offset: i64,
    /// Running max timestamp before `pos`.
    pub max_ts: i64,
    /// Position of the batch holding `max_ts`.
    pub max_ts_pos: u64,
    /// Verify CRCs from this position on (the unsynced tail after a checkpoint).
    pub verify_from: u64,
}

/// Walk batches from `start` to `limit`, adding index entries for a segment
/// based at `base`. Stops at the first batch that is torn, fails its CRC
/// (at or after `verify_from`), or does not continue the offset sequence:
/// everything before that point is the valid log.
pub fn scan(
    file: &dyn ReadFile,
    base: i64,
    start: ScanStart,
    limit: u64,
    index: &mut Index,
) -> io::Result<Scan> {
    let mut s = Scan {
        end_pos: start.pos,
        next_offset: start.next_offset,
        max_ts: start.max_ts,
        max_ts_pos: start.max_ts_pos,
        batches: 0,
        stopped: None,
        markers: false,
    };
    let mut hdr = [0u8; BATCH_HEADER_LEN];
    let mut body = Vec::new();
    loop {
        let pos = s.end_pos;
        if pos + BATCH_HEADER_LEN as u64 > limit {
            if pos < limit {
                s.stopped = Some(format!("torn header at {pos}"));
            }
            return Ok(s);
        }
        file.read_exact_at(&mut hdr, pos)?;
        let Some(h) = read_batch_header(&hdr) else {
            s.stopped = Some(format!("invalid header at {pos}"));
            return Ok(s);
        };
        let len = h.batch_len as u64;
        if len < BATCH_HEADER_LEN as u64 || pos + len > limit {
            s.stopped = Some(format!("torn batch at {pos}"));
            return Ok(s);
        }
        if h.base_offset != s.next_offset {
            s.stopped = Some(format!(
                "offset gap at {pos}: expected {} found {}",
                s.next_offset, h.base_offset
            ));
            return Ok(s);
        }
        if pos >= start.verify_from {
            body.resize(len as usize, 0);
            file.read_exact_at(&mut body, pos)?;
            if !h.verify_crc(&body) {
                s.stopped = Some(format!("crc mismatch at {pos}"));
                return Ok(s);
            }
        }
        s.markers |= h.is_control();
        let rel = (h.base_offset - base).clamp(0, u32::MAX as i64) as u32;
        index.observe(rel, pos, s.max_ts);
        if h.max_timestamp > s.max_ts {
            s.max_ts = h.max_timestamp;
            s.max_ts_pos = pos;
        }
        s.next_offset = h.last_offset() + 1;
        s.end_pos = pos + len;
        s.batches += 1;
    }
}

/// Read the header of the batch at `pos`, if a whole header is there.
pub fn header_at(file: &dyn ReadFile, pos: u64, limit: u64) -> io::Result<Option<BatchHeader>> {
    if pos + BATCH_HEADER_LEN as u64 > limit {
        return Ok(None);
    }
    let mut hdr = [0u8; BATCH_HEADER_LEN];
    file.read_exact_at(&mut hdr, pos)?;
    Ok(read_batch_header(&hdr))
}

/// Bytes of framing before the batch body proper (offset + length).
pub const FRAMING: usize = LOG_OVERHEAD;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_lookup() {
        let mut ix = Index::new(100);
        ix.observe(0, 0, -1);
        ix.observe(5, 50, 10); // not due
        ix.observe(10, 120, 20);
        ix.observe(20, 260, 30);
        assert_eq!(ix.entries.len(), 3);
        assert_eq!(ix.lookup_offset(0), 0);
        assert_eq!(ix.lookup_offset(15), 120);
        assert_eq!(ix.lookup_offset(25), 260);
        assert_eq!(ix.lookup_time(5), 0);
        assert_eq!(ix.lookup_time(25), 120);
        let (a, b) = ix.encode();
        let back = Index::decode(&a, &b, 100).unwrap();
        assert_eq!(back.entries, ix.entries);
        assert!(Index::decode(&a[..7], &b, 100).is_none());
    }
}
