//! Transaction markers and the aborted-transaction index of a segment.
//!
//! A COMMIT or ABORT marker is a control batch in Kafka's format
//! (attributes transactional + control, base sequence -1, one record whose
//! key is `version: i16 = 0, type: i16` — 0 abort, 1 commit — and whose value
//! is `version: i16 = 0, coordinator_epoch: i32`). An ABORT marker that
//! closes an open transaction also carries, in a record header named
//! [`FIRST_OFFSET_HEADER`], the offset where that transaction started:
//! clients ignore the headers of control records, and with it a segment
//! describes its own aborted transactions, so the index of any one segment
//! can be rebuilt from that segment's bytes alone (recovery stays bounded:
//! no replay from the start of the transaction, which may lie segments
//! earlier).
//!
//! `<base>-e<E>.txnindex` lists the aborted transactions whose marker lies
//! in the segment: written at seal when the segment holds markers (temp → fsync →
//! rename through the epoch-fenced writer), it carries the segment's end
//! offset so that a file describing an older length of the segment (a roll
//! that crashed before its manifest, then more appends) is never trusted.
//! A missing, torn or stale file is rebuilt from the segment by
//! [`scan_segment`].

use super::index::header_at;
use bytes::{Bytes, BytesMut};
use kaas_protocol::batch::BatchHeader;
use kaas_protocol::kafka_protocol::protocol::StrBytes;
use kaas_protocol::kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kaas_volume::fs::ReadFile;
use std::io;

/// The record header of an ABORT marker naming the first offset of the
/// transaction it closes (8 bytes, big-endian).
pub const FIRST_OFFSET_HEADER: &str = "kaas.txn.first_offset";

/// One aborted transaction: Kafka's `AbortedTxn` without the LSO field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    /// The producer.
    pub producer_id: i64,
    /// Offset of the transaction's first batch.
    pub first_offset: i64,
    /// Offset of its ABORT marker.
    pub last_offset: i64,
}

/// What a control batch says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    /// COMMIT (true) or ABORT.
    pub commit: bool,
    /// The coordinator epoch in the value.
    pub coordinator_epoch: i32,
    /// The first offset of the transaction it closed, when it closed one
    /// (ABORT markers only; see module docs).
    pub first_offset: Option<i64>,
}

/// The control batch of a COMMIT/ABORT marker (offsets relative: the log
/// assigns them). `first_offset` is written only into an ABORT marker.
pub fn control_batch(
    producer_id: i64,
    producer_epoch: i16,
    coordinator_epoch: i32,
    commit: bool,
    first_offset: Option<i64>,
    timestamp: i64,
) -> Bytes {
    let mut key = Vec::with_capacity(4);
    key.extend_from_slice(&0i16.to_be_bytes());
    key.extend_from_slice(&i16::from(commit).to_be_bytes());
    let mut value = Vec::with_capacity(6);
    value.extend_from_slice(&0i16.to_be_bytes());
    value.extend_from_slice(&coordinator_epoch.to_be_bytes());
    let mut rec = Record {
        transactional: true,
        control: true,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id,
        producer_epoch,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp,
        key: Some(Bytes::from(key)),
        value: Some(Bytes::from(value)),
        headers: Default::default(),
    };
    if let (false, Some(f)) = (commit, first_offset) {
        rec.headers.insert(
            StrBytes::from_static_str(FIRST_OFFSET_HEADER),
            Some(Bytes::copy_from_slice(&f.to_be_bytes())),
        );
    }
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        std::slice::from_ref(&rec),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .expect("a control batch of one small record always encodes");
    buf.freeze()
}

/// Decode a whole control batch (`None`: not one, or unreadable).
pub fn parse_control_batch(batch: &[u8]) -> Option<Marker> {
    let mut b = Bytes::copy_from_slice(batch);
    let set = RecordBatchDecoder::decode(&mut b).ok()?;
    let rec = set.records.into_iter().find(|r| r.control)?;
    let key = rec.key?;
    if key.len() < 4 {
        return None;
    }
    let kind = i16::from_be_bytes([key[2], key[3]]);
    let commit = match kind {
        0 => false,
        1 => true,
        _ => return None,
    };
    let coordinator_epoch = rec
        .value
        .filter(|v| v.len() >= 6)
        .map_or(-1, |v| i32::from_be_bytes([v[2], v[3], v[4], v[5]]));
    let first_offset = rec
        .headers
        .iter()
        .find(|(k, _)| k.as_str() == FIRST_OFFSET_HEADER)
        .and_then(|(_, v)| v.as_ref())
        .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
        .map(i64::from_be_bytes);
    Some(Marker {
        commit,
        coordinator_epoch,
        first_offset,
    })
}

/// Read and decode the control batch whose header is `h`, at `pos`.
pub fn read_marker(file: &dyn ReadFile, pos: u64, h: &BatchHeader) -> io::Result<Option<Marker>> {
    let mut buf = vec![0u8; h.batch_len];
    file.read_exact_at(&mut buf, pos)?;
    Ok(parse_control_batch(&buf))
}

/// The aborted transactions of one segment, from its bytes (`size` valid
/// bytes of the file): one header read per batch, and a decode of each
/// control batch only.
pub fn scan_segment(file: &dyn ReadFile, size: u64) -> io::Result<Vec<AbortedTxn>> {
    let mut out = Vec::new();
    let mut pos = 0u64;
    while let Some(h) = header_at(file, pos, size)? {
        if h.is_control() && h.producer_id >= 0 {
            if let Some(Marker {
                commit: false,
                first_offset: Some(first),
                ..
            }) = read_marker(file, pos, &h)?
            {
                out.push(AbortedTxn {
                    producer_id: h.producer_id,
                    first_offset: first,
                    last_offset: h.base_offset,
                });
            }
        }
        pos += h.batch_len as u64;
    }
    Ok(out)
}

const MAGIC: &[u8; 4] = b"KTX1";

/// The `.txnindex` bytes of a segment ending at `next_offset`: magic, the
/// segment's end offset, the count, the entries (producer id, first
/// offset, marker offset), CRC32C of everything before it. Big-endian.
pub fn encode(entries: &[AbortedTxn], next_offset: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + entries.len() * 24);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&next_offset.to_be_bytes());
    out.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for e in entries {
        out.extend_from_slice(&e.producer_id.to_be_bytes());
        out.extend_from_slice(&e.first_offset.to_be_bytes());
        out.extend_from_slice(&e.last_offset.to_be_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// Inverse of [`encode`], only if the file describes a segment ending at
/// `next_offset` (else it is stale, or torn, and the caller rescans).
pub fn decode(bytes: &[u8], next_offset: i64) -> Option<Vec<AbortedTxn>> {
    let body_len = bytes.len().checked_sub(4)?;
    let (body, crc) = bytes.split_at(body_len);
    if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().ok()?) {
        return None;
    }
    if body.len() < 16 || &body[..4] != MAGIC {
        return None;
    }
    let at = |i: usize| i64::from_be_bytes(body[i..i + 8].try_into().expect("8 bytes"));
    if at(4) != next_offset {
        return None;
    }
    let n = u32::from_be_bytes(body[12..16].try_into().ok()?) as usize;
    if body.len() != 16 + n.checked_mul(24)? {
        return None;
    }
    Some(
        (0..n)
            .map(|i| {
                let p = 16 + i * 24;
                AbortedTxn {
                    producer_id: at(p),
                    first_offset: at(p + 8),
                    last_offset: at(p + 16),
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_protocol::batch::read_batch_header;

    #[test]
    fn a_marker_round_trips_in_kafkas_control_format() {
        let b = control_batch(42, 3, 7, false, Some(100), 1_000);
        let h = read_batch_header(&b).unwrap();
        assert!(h.is_control() && h.is_transactional());
        assert_eq!((h.producer_id, h.producer_epoch), (42, 3));
        assert_eq!(h.base_sequence, -1);
        // Kafka's layout: key = version 0, type 0 (abort); value = version
        // 0, coordinator epoch.
        let mut bb = b.clone();
        let set = RecordBatchDecoder::decode(&mut bb).unwrap();
        let r = &set.records[0];
        assert_eq!(r.key.as_deref(), Some(&[0u8, 0, 0, 0][..]));
        assert_eq!(r.value.as_deref(), Some(&[0u8, 0, 0, 0, 0, 7][..]));
        assert_eq!(
            parse_control_batch(&b),
            Some(Marker {
                commit: false,
                coordinator_epoch: 7,
                first_offset: Some(100)
            })
        );
        let c = control_batch(42, 3, 7, true, Some(100), 1_000);
        assert_eq!(
            parse_control_batch(&c),
            Some(Marker {
                commit: true,
                coordinator_epoch: 7,
                first_offset: None
            })
        );
    }

    #[test]
    fn the_index_file_round_trips_and_refuses_stale_or_torn_bytes() {
        let e = [
            AbortedTxn {
                producer_id: 1,
                first_offset: 3,
                last_offset: 9,
            },
            AbortedTxn {
                producer_id: i64::MAX,
                first_offset: 0,
                last_offset: 12,
            },
        ];
        let b = encode(&e, 13);
        assert_eq!(decode(&b, 13).unwrap(), e);
        assert_eq!(decode(&encode(&[], 5), 5).unwrap(), []);
        assert!(decode(&b, 14).is_none(), "describes another length");
        for cut in 0..b.len() {
            assert!(decode(&b[..cut], 13).is_none(), "cut {cut}");
        }
        for i in 0..b.len() {
            let mut x = b.clone();
            x[i] ^= 1;
            assert!(decode(&x, 13).is_none(), "flip {i}");
        }
    }
}
