//! Rebuilding a validated batch with another codec, for a topic whose
//! `compression.type` is not `producer` (Kafka's `LogValidator` rebuilds
//! the batch when the producer's codec differs from the topic's).
//!
//! The records section of a v2 batch is the records laid end to end, each
//! self-delimiting and carrying only deltas, so a rebuild needs no record
//! to be decoded and re-encoded: the section is inflated, every record's
//! framing and offset delta is checked (what `validate_batches` checks of
//! an uncompressed batch, since the result may be stored uncompressed),
//! and the same bytes are deflated with the target codec. Keys, values,
//! headers and timestamp deltas are therefore byte-for-byte the
//! producer's; the header keeps baseTimestamp, producer id, epoch, base
//! sequence and the transactional flag, and only the codec bits,
//! maxTimestamp (recomputed from the records, as Kafka's builder does),
//! batchLength and the CRC change.
//!
//! Inflating is bounded by the caller's `max_decompressed`: a small batch
//! that inflates past it (a decompression bomb, or simply a batch larger
//! than the broker would accept uncompressed) is refused with
//! [`BatchError::TooLarge`] after at most that many bytes of work. The
//! codecs are written as Apache Kafka's clients write them: gzip, xerial
//! framed snappy in 32 KiB blocks, the lz4 frame format with independent
//! 64 KiB blocks and no checksums, a zstd frame with its content size.

use super::{
    be_i16, be_i64, corrupt, invalid, read_batch_header, snappy_decompress, walk_records,
    BatchError, BatchInfo, InPlace, ATTRIBUTES_OFFSET, BATCH_HEADER_LEN, COMPRESSION_MASK,
    CRC_OFFSET, LOG_OVERHEAD, MAX_TIMESTAMP_OFFSET,
};
use bytes::Bytes;
use kafka_protocol::records::Compression;
use std::borrow::Cow;
use std::io::{Read, Write};

/// Kafka's default gzip level (`Deflater.DEFAULT_COMPRESSION`, which is 6).
pub const GZIP_DEFAULT_LEVEL: i32 = -1;
/// Kafka's default lz4 level: lz4's fast mode.
pub const LZ4_DEFAULT_LEVEL: i32 = 9;
/// Kafka's default zstd level (`ZSTD_CLEVEL_DEFAULT`).
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

/// The codec batches are stored with, and its level (KIP-390), as a
/// topic's `compression.type` and `compression.<codec>.level` name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codec {
    pub compression: Compression,
    /// Kafka's level for `compression`; unused for none and snappy.
    pub level: i32,
}

impl Codec {
    /// `compression` at Kafka's default level.
    pub fn new(compression: Compression) -> Self {
        let level = match compression {
            Compression::Gzip => GZIP_DEFAULT_LEVEL,
            Compression::Lz4 => LZ4_DEFAULT_LEVEL,
            Compression::Zstd => ZSTD_DEFAULT_LEVEL,
            Compression::None | Compression::Snappy => 0,
        };
        Codec { compression, level }
    }

    /// A topic `compression.type` other than `producer` (Kafka's names).
    pub fn from_topic_config(name: &str) -> Option<Self> {
        Some(Self::new(match name {
            "uncompressed" => Compression::None,
            "gzip" => Compression::Gzip,
            "snappy" => Compression::Snappy,
            "lz4" => Compression::Lz4,
            "zstd" => Compression::Zstd,
            _ => return None,
        }))
    }

    /// The codec id of the batch attributes' low three bits.
    fn id(self) -> i16 {
        match self.compression {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }
}

/// Rebuilds the validated batch `batch` (exactly one batch, as
/// `validate_batches` delimits it) with codec `target`. A batch already in
/// `target`'s codec is returned as it is.
///
/// Errors: [`BatchError::TooLarge`] when the records inflate past
/// `max_decompressed` bytes or the rebuilt batch would not fit a
/// batchLength; [`BatchError::Corrupt`] when the compressed section does
/// not decompress; [`BatchError::Invalid`] when a record's framing or
/// offset delta is wrong (the same check as for an uncompressed batch).
pub fn recompress(
    batch: &[u8],
    target: Codec,
    max_decompressed: usize,
) -> Result<Vec<u8>, BatchError> {
    let Some(h) = read_batch_header(batch) else {
        return Err(corrupt("truncated or impossible batch header"));
    };
    if h.magic != 2 {
        return Err(BatchError::UnsupportedMagic(h.magic));
    }
    let Some(full) = batch.get(..h.batch_len) else {
        return Err(corrupt(format!(
            "batch declares {} bytes but only {} are present",
            h.batch_len,
            batch.len()
        )));
    };
    let Some(source) = h.compression() else {
        return Err(invalid(format!(
            "unknown compression codec {}",
            h.attributes & COMPRESSION_MASK
        )));
    };
    if source == target.compression {
        return Ok(full.to_vec());
    }
    let raw = decompress(source, &full[BATCH_HEADER_LEN..], max_decompressed)?;
    let max_timestamp = check_records(&raw, &h)?;
    let body = compress(target, &raw)?;
    let batch_length = i32::try_from(BATCH_HEADER_LEN - LOG_OVERHEAD + body.len())
        .map_err(|_| BatchError::TooLarge(format!("rebuilt batch of {} bytes", body.len())))?;
    let mut out = Vec::with_capacity(BATCH_HEADER_LEN + body.len());
    out.extend_from_slice(&full[..BATCH_HEADER_LEN]);
    out.extend_from_slice(&body);
    out[8..12].copy_from_slice(&batch_length.to_be_bytes());
    let attrs = (be_i16(&out, ATTRIBUTES_OFFSET) & !COMPRESSION_MASK) | target.id();
    out[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2].copy_from_slice(&attrs.to_be_bytes());
    out[MAX_TIMESTAMP_OFFSET..MAX_TIMESTAMP_OFFSET + 8]
        .copy_from_slice(&max_timestamp.to_be_bytes());
    let crc = crc32c::crc32c(&out[ATTRIBUTES_OFFSET..]);
    out[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// Checks the records of `raw` as an uncompressed batch's are checked
/// (framing, exact count, offset deltas 0, 1, 2...) and returns the batch's
/// maxTimestamp: the largest record timestamp for CreateTime (as Kafka's
/// batch builder computes it), the header's own for LogAppendTime.
fn check_records(raw: &[u8], h: &super::BatchHeader) -> Result<i64, BatchError> {
    let mut expected_delta = 0i32;
    let mut max_ts = i64::MIN;
    walk_records(InPlace(raw), h.records_count, true, |rec| {
        if rec.offset_delta != expected_delta {
            return Err(invalid(format!(
                "record offset delta {} where {expected_delta} was expected",
                rec.offset_delta
            )));
        }
        expected_delta = expected_delta.wrapping_add(1);
        // Java computes this in wrapping long arithmetic; match it.
        max_ts = max_ts.max(h.base_timestamp.wrapping_add(rec.timestamp_delta));
        Ok(())
    })
    .map_err(|e| match e {
        BatchError::Corrupt(r) => BatchError::Invalid(r),
        other => other,
    })?;
    Ok(if h.is_log_append_time() || max_ts == i64::MIN {
        h.max_timestamp
    } else {
        max_ts
    })
}

/// The records section `payload` inflated, at most `limit` bytes of it.
fn decompress(
    codec: Compression,
    payload: &[u8],
    limit: usize,
) -> Result<Cow<'_, [u8]>, BatchError> {
    let too_large =
        || BatchError::TooLarge(format!("records decompress to more than {limit} bytes"));
    let read_capped = |r: &mut dyn Read, what: &str| -> Result<Vec<u8>, BatchError> {
        let mut out = Vec::new();
        // One byte more than allowed, so overflow is seen, not truncated.
        r.take(limit as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| corrupt(format!("{what}: {e}")))?;
        if out.len() > limit {
            return Err(too_large());
        }
        Ok(out)
    };
    Ok(Cow::Owned(match codec {
        Compression::None if payload.len() > limit => return Err(too_large()),
        Compression::None => return Ok(Cow::Borrowed(payload)),
        Compression::Gzip => read_capped(&mut flate2::read::MultiGzDecoder::new(payload), "gzip")?,
        Compression::Lz4 => {
            let mut d = lz4::Decoder::new(payload).map_err(|e| corrupt(format!("lz4: {e}")))?;
            read_capped(&mut d, "lz4")?
        }
        Compression::Zstd => {
            let mut d = zstd::stream::read::Decoder::with_buffer(payload)
                .map_err(|e| corrupt(format!("zstd: {e}")))?;
            // A frame header may declare a window up to the library's
            // default maximum (128 MiB), allocated before any output: no
            // larger than the cap needs, but never below 8 MiB, which
            // streaming compressors (the Java client's) use whatever the
            // content size.
            let window_log = usize::BITS - limit.max(1).saturating_sub(1).leading_zeros();
            d.window_log_max(window_log.clamp(23, 27))
                .map_err(|e| corrupt(format!("zstd: {e}")))?;
            read_capped(&mut d, "zstd")?
        }
        Compression::Snappy => snappy_decompress(payload, limit)?,
    }))
}

/// `raw` compressed with `target`, framed as Kafka's clients frame it.
fn compress(target: Codec, raw: &[u8]) -> Result<Vec<u8>, BatchError> {
    // Writing into a Vec fails only if the codec library does.
    let failed =
        |e: std::io::Error| corrupt(format!("compressing with {:?}: {e}", target.compression));
    match target.compression {
        Compression::None => Ok(raw.to_vec()),
        Compression::Gzip => {
            let level = match target.level {
                GZIP_DEFAULT_LEVEL => flate2::Compression::default(),
                l => flate2::Compression::new(l.clamp(1, 9) as u32),
            };
            let mut e = flate2::write::GzEncoder::new(Vec::with_capacity(raw.len() / 2), level);
            e.write_all(raw).map_err(failed)?;
            e.finish().map_err(failed)
        }
        Compression::Snappy => snappy_xerial(raw),
        Compression::Lz4 => {
            // Kafka: its default level is lz4's fast compressor, any other
            // the high-compression one at that level (the C library caps
            // it at 12).
            let level = match target.level {
                LZ4_DEFAULT_LEVEL => 0,
                l => l.clamp(1, 17) as u32,
            };
            let mut e = lz4::EncoderBuilder::new()
                .level(level)
                .block_size(lz4::BlockSize::Max64KB)
                .block_mode(lz4::BlockMode::Independent)
                .checksum(lz4::ContentChecksum::NoChecksum)
                .block_checksum(lz4::liblz4::BlockChecksum::NoBlockChecksum)
                .build(Vec::with_capacity(raw.len() / 2))
                .map_err(failed)?;
            e.write_all(raw).map_err(failed)?;
            let (out, done) = e.finish();
            done.map_err(failed)?;
            Ok(out)
        }
        // One-shot, so the frame carries its content size (librdkafka
        // sizes its output buffer from it).
        Compression::Zstd => zstd::bulk::compress(raw, target.level).map_err(failed),
    }
}

/// Snappy as Kafka's Java client writes it (snappy-java's
/// `SnappyOutputStream`): the xerial header, then 32 KiB blocks, each a
/// big-endian length and a raw snappy block.
fn snappy_xerial(raw: &[u8]) -> Result<Vec<u8>, BatchError> {
    const HEADER: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";
    const BLOCK: usize = 32 * 1024;
    let mut out = Vec::with_capacity(HEADER.len() + raw.len() / 2 + 64);
    out.extend_from_slice(HEADER);
    let mut enc = snap::raw::Encoder::new();
    for chunk in raw.chunks(BLOCK) {
        let block = enc
            .compress_vec(chunk)
            .map_err(|e| corrupt(format!("snappy: {e}")))?;
        // A block of at most 32 KiB compresses to well under 4 GiB.
        out.extend_from_slice(&(block.len() as u32).to_be_bytes());
        out.extend_from_slice(&block);
    }
    Ok(out)
}

/// Rebuilds every batch of one partition's validated produce payload
/// whose codec is not `target`'s (see [`recompress`]) and returns the new
/// payload with its batches' infos. A payload with nothing to rebuild is
/// returned as it is, without a copy. `max_decompressed` bounds each
/// batch's inflated records and also the rebuilt payload as a whole (its
/// batches together), so many small bombs in one payload cannot add up
/// past it.
pub fn recompress_batches(
    records: &Bytes,
    infos: Vec<BatchInfo>,
    target: Codec,
    max_decompressed: usize,
) -> Result<(Bytes, Vec<BatchInfo>), BatchError> {
    if infos.iter().all(|i| i.compression() == target.compression) {
        return Ok((records.clone(), infos));
    }
    let mut out = Vec::with_capacity(records.len());
    let mut rebuilt = Vec::with_capacity(infos.len());
    for info in infos {
        let batch = records
            .get(info.pos..info.pos + info.len)
            .ok_or_else(|| corrupt("batch outside its payload"))?;
        let pos = out.len();
        if info.compression() == target.compression {
            out.extend_from_slice(batch);
            rebuilt.push(BatchInfo { pos, ..info });
            continue;
        }
        let left = max_decompressed.saturating_sub(pos);
        out.extend_from_slice(&recompress(batch, target, left)?);
        if out.len() > max_decompressed {
            return Err(BatchError::TooLarge(format!(
                "rebuilt batches over {max_decompressed} bytes"
            )));
        }
        let b = &out[pos..];
        rebuilt.push(BatchInfo {
            pos,
            len: b.len(),
            attributes: be_i16(b, ATTRIBUTES_OFFSET),
            max_timestamp: be_i64(b, MAX_TIMESTAMP_OFFSET),
            ..info
        });
    }
    Ok((Bytes::from(out), rebuilt))
}

#[cfg(test)]
mod tests {
    use super::super::validate_batches;
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::records::{
        Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    const CODECS: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    /// An idempotent, transactional producer's batch of `n` records with
    /// keys, headers, a null value and out-of-order timestamps.
    fn records(n: i64) -> Vec<Record> {
        (0..n)
            .map(|i| Record {
                transactional: true,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: 4242,
                producer_epoch: 3,
                timestamp_type: TimestampType::Creation,
                offset: i,
                sequence: 17 + i as i32,
                // The largest timestamp is not the last record's.
                timestamp: 1_700_000_000_000 + (i * 37) % 11,
                key: (i % 3 != 0).then(|| Bytes::from(format!("key-{i}"))),
                value: (i != 2).then(|| Bytes::from(format!("value {i} ").repeat(20))),
                headers: [
                    ("h".into(), Some(Bytes::from(format!("x{i}")))),
                    ("null".into(), None),
                ]
                .into(),
            })
            .collect()
    }

    fn encode(recs: &[Record], compression: Compression) -> Bytes {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            recs,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        buf.freeze()
    }

    fn with_payload(header_of: &Bytes, codec_id: i16, payload: &[u8]) -> Vec<u8> {
        let mut out = header_of[..BATCH_HEADER_LEN].to_vec();
        out.extend_from_slice(payload);
        let len = (out.len() - LOG_OVERHEAD) as i32;
        out[8..12].copy_from_slice(&len.to_be_bytes());
        let attrs = (be_i16(&out, ATTRIBUTES_OFFSET) & !COMPRESSION_MASK) | codec_id;
        out[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2].copy_from_slice(&attrs.to_be_bytes());
        let crc = crc32c::crc32c(&out[ATTRIBUTES_OFFSET..]);
        out[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
        out
    }

    /// Catches: a rebuilt batch that loses or alters a record field, the
    /// producer id/epoch/sequence or the transactional flag, keeps the old
    /// codec bits, a stale CRC or batchLength, or a codec framing another
    /// decoder cannot read (kafka-protocol's decoder reads every output).
    #[test]
    fn every_codec_to_every_codec_keeps_records_and_producer_state() {
        let recs = records(25);
        for from in CODECS {
            let src = encode(&recs, from);
            for to in CODECS {
                let out = recompress(&src, Codec::new(to), 1 << 20).unwrap();
                let out = Bytes::from(out);
                let infos =
                    validate_batches(&out).unwrap_or_else(|e| panic!("{from:?} -> {to:?}: {e}"));
                assert_eq!(infos.len(), 1);
                let i = &infos[0];
                assert_eq!(i.compression(), to, "{from:?} -> {to:?}");
                assert_eq!(
                    (i.producer_id, i.producer_epoch, i.base_sequence),
                    (4242, 3, 17)
                );
                assert!(i.is_transactional());
                assert_eq!(i.max_timestamp, 1_700_000_000_010);
                let set = RecordBatchDecoder::decode(&mut out.clone()).unwrap();
                assert_eq!(set.compression, to);
                assert_eq!(set.records.len(), recs.len());
                for (a, b) in set.records.iter().zip(&recs) {
                    assert_eq!(
                        (
                            &a.key,
                            &a.value,
                            &a.headers,
                            a.timestamp,
                            a.offset,
                            a.sequence
                        ),
                        (
                            &b.key,
                            &b.value,
                            &b.headers,
                            b.timestamp,
                            b.offset,
                            b.sequence
                        ),
                        "{from:?} -> {to:?}"
                    );
                    assert!(a.transactional && a.producer_id == 4242);
                }
                if from == to {
                    assert_eq!(out, src, "same codec: bytes unchanged");
                }
            }
        }
    }

    /// Catches: a LogAppendTime batch whose stamped maxTimestamp is
    /// replaced by the records' own on a rebuild.
    #[test]
    fn log_append_time_max_timestamp_is_kept() {
        let mut b = encode(&records(3), Compression::Gzip).to_vec();
        super::super::set_log_append_time(&mut b, 99);
        let out = recompress(&b, Codec::new(Compression::None), 1 << 20).unwrap();
        let i = &validate_batches(&Bytes::from(out)).unwrap()[0];
        assert!(i.is_log_append_time());
        assert_eq!(i.max_timestamp, 99);
    }

    /// Catches: a decompression bomb inflated without bound (the limit
    /// must stop it, with MESSAGE_TOO_LARGE, for every codec).
    #[test]
    fn a_batch_inflating_past_the_limit_is_refused_too_large() {
        let src = encode(&records(1), Compression::None);
        let zeros = vec![0u8; 8 << 20];
        let bombs = [
            (1, {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                e.write_all(&zeros).unwrap();
                e.finish().unwrap()
            }),
            (2, snappy_xerial(&zeros).unwrap()),
            (3, compress(Codec::new(Compression::Lz4), &zeros).unwrap()),
            (4, zstd::bulk::compress(&zeros, 19).unwrap()),
        ];
        for (id, payload) in bombs {
            assert!(payload.len() < 400 << 10, "codec {id}: {}", payload.len());
            let bomb = with_payload(&src, id, &payload);
            // A batch already in the target codec is stored as sent.
            let to = if id == 4 {
                Compression::Lz4
            } else {
                Compression::Zstd
            };
            let e = recompress(&bomb, Codec::new(to), 1 << 20).unwrap_err();
            assert!(matches!(e, BatchError::TooLarge(_)), "codec {id}: {e}");
            assert_eq!(e.kafka_error_code(), 10);
            let e = recompress(&bomb, Codec::new(Compression::None), 1 << 20).unwrap_err();
            assert_eq!(e.kafka_error_code(), 10, "codec {id}");
        }
        // An uncompressed batch is held to the same bound.
        let big = encode(&records(25), Compression::None);
        let e = recompress(&big, Codec::new(Compression::Lz4), 100).unwrap_err();
        assert_eq!(e.kafka_error_code(), 10);
    }

    /// Catches: damaged compressed bytes or bad record framing inside a
    /// compressed batch stored after a rebuild instead of refused with
    /// the code Kafka answers.
    #[test]
    fn damaged_payloads_and_bad_records_are_refused() {
        let src = encode(&records(4), Compression::None);
        // Not gzip at all: CORRUPT_MESSAGE.
        let junk = with_payload(&src, 1, b"definitely not gzip");
        let e = recompress(&junk, Codec::new(Compression::Lz4), 1 << 20).unwrap_err();
        assert_eq!(e.kafka_error_code(), 2, "{e}");
        // Well-formed gzip of records that stop short: INVALID_RECORD.
        let raw = &src[BATCH_HEADER_LEN..src.len() - 3];
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(raw).unwrap();
        let short = with_payload(&src, 1, &e.finish().unwrap());
        let e = recompress(&short, Codec::new(Compression::Zstd), 1 << 20).unwrap_err();
        assert_eq!(e.kafka_error_code(), 87, "{e}");
        // Records whose offset deltas skip (0, 1, 5): INVALID_RECORD.
        let mut raw = src[BATCH_HEADER_LEN..].to_vec();
        let mut c = super::super::Cursor { buf: &raw, pos: 0 };
        for _ in 0..2 {
            let size = c.varint().unwrap() as usize;
            c.pos += size;
        }
        c.varint().unwrap(); // record 2's size
        c.byte().unwrap(); // attributes
        c.varlong().unwrap(); // timestamp delta
        let at = c.pos;
        assert_eq!(raw[at], 4, "zigzag of offset delta 2");
        raw[at] = 10; // zigzag of 5
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&raw).unwrap();
        let skip = with_payload(&src, 1, &e.finish().unwrap());
        let e = recompress(&skip, Codec::new(Compression::None), 1 << 20).unwrap_err();
        assert_eq!(e.kafka_error_code(), 87, "{e}");
        assert!(e.to_string().contains("offset delta 5"), "{e}");
    }

    /// Catches: the level configs not reaching the codec (levels must
    /// change the output and every output must still decode).
    #[test]
    fn levels_reach_the_codec() {
        let recs = records(200);
        let src = encode(&recs, Compression::None);
        for (c, levels) in [
            (Compression::Gzip, [1, 9]),
            (Compression::Lz4, [LZ4_DEFAULT_LEVEL, 12]),
            (Compression::Zstd, [-5, 19]),
        ] {
            let outs: Vec<Bytes> = levels
                .iter()
                .map(|&level| {
                    Bytes::from(
                        recompress(
                            &src,
                            Codec {
                                compression: c,
                                level,
                            },
                            1 << 20,
                        )
                        .unwrap(),
                    )
                })
                .collect();
            assert_ne!(outs[0], outs[1], "{c:?}");
            for o in &outs {
                let set = RecordBatchDecoder::decode(&mut o.clone()).unwrap();
                assert_eq!(set.records.len(), recs.len());
            }
        }
    }

    /// Catches: a copy of every produce payload although nothing needs a
    /// rebuild, or infos that do not describe the rebuilt payload.
    #[test]
    fn recompress_batches_rebuilds_only_what_differs() {
        let a = encode(&records(3), Compression::Lz4);
        let infos = validate_batches(&a).unwrap();
        let (same, _) =
            recompress_batches(&a, infos, Codec::new(Compression::Lz4), 1 << 20).unwrap();
        assert_eq!(same.as_ptr(), a.as_ptr(), "no copy");

        let two: Bytes = [
            encode(&records(3), Compression::Gzip),
            encode(&records(4), Compression::Zstd),
        ]
        .concat()
        .into();
        let infos = validate_batches(&two).unwrap();
        let (out, got) =
            recompress_batches(&two, infos.clone(), Codec::new(Compression::Zstd), 1 << 20)
                .unwrap();
        assert_eq!(validate_batches(&out).unwrap(), got);
        assert_eq!(
            got[1].len, infos[1].len,
            "the zstd batch is copied as it is"
        );
        assert!(got.iter().all(|i| i.compression() == Compression::Zstd));
    }

    /// Catches: a cap applied per batch only, so a payload of many batches,
    /// each under it, rebuilds to many times the cap (gzip of zeros
    /// inflates ~1000x, so 1 MiB of request became gigabytes).
    #[test]
    fn the_cap_bounds_a_payloads_batches_together() {
        let one = |value: usize| Record {
            value: Some(Bytes::from(vec![0u8; value])),
            ..records(1).remove(0)
        };
        let batch = encode(&[one(300 << 10)], Compression::Gzip);
        assert!(batch.len() < 4 << 10, "{}", batch.len());
        let eight: Bytes = vec![batch; 8].concat().into();
        let infos = validate_batches(&eight).unwrap();
        let to = Codec::new(Compression::None);
        // Each batch alone fits 1 MiB; all eight rebuilt do not.
        let e = recompress_batches(&eight, infos.clone(), to, 1 << 20).unwrap_err();
        assert_eq!(e.kafka_error_code(), 10, "{e}");
        let (out, _) = recompress_batches(&eight, infos, to, 4 << 20).unwrap();
        assert!(out.len() > 8 * (300 << 10));
    }

    #[test]
    fn topic_config_names() {
        assert_eq!(Codec::from_topic_config("producer"), None);
        assert_eq!(Codec::from_topic_config("none"), None);
        assert_eq!(
            Codec::from_topic_config("uncompressed"),
            Some(Codec::new(Compression::None))
        );
        assert_eq!(Codec::from_topic_config("zstd").unwrap().level, 3);
    }
}
