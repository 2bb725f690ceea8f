//! Unit tests for record-batch validation, patching and timestamp decoding,
//! on batches built by kafka-protocol's own encoder (the same bytes a Rust
//! client would send).

use super::*;
use bytes::BytesMut;
use kafka_protocol::records::{
    Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

fn records(n: i64, producer_id: i64) -> Vec<Record> {
    (0..n)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id,
            producer_epoch: if producer_id >= 0 { 0 } else { -1 },
            timestamp_type: TimestampType::Creation,
            offset: i,
            // The encoder starts a new batch whenever offset - sequence changes,
            // so keep them in step even without a producer id.
            sequence: i as i32,
            timestamp: 1_700_000_000_000 + i * 10,
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(vec![b'v'; 20 + i as usize])),
            headers: [("h".into(), Some(Bytes::from_static(b"x")))].into(),
        })
        .collect()
}

fn batch_with(n: i64, compression: Compression) -> BytesMut {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records(n, -1),
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .unwrap();
    buf
}

fn batch(n: i64) -> Bytes {
    batch_with(n, Compression::None).freeze()
}

/// Recomputes the CRC after a deliberate edit to a covered field.
fn reseal(buf: &mut [u8]) {
    let crc = crc32c::crc32c(&buf[ATTRIBUTES_OFFSET..]);
    buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
}

#[test]
fn valid_batch_passes() {
    let b = batch(5);
    let infos = validate_batches(&b).unwrap();
    assert_eq!(infos.len(), 1);
    let i = &infos[0];
    assert_eq!((i.pos, i.len), (0, b.len()));
    assert_eq!(i.records_count, 5);
    assert_eq!(i.last_offset_delta, 4);
    assert_eq!(i.base_timestamp, 1_700_000_000_000);
    assert_eq!(i.max_timestamp, 1_700_000_000_040);
    assert_eq!(i.producer_id, -1);
    assert_eq!(i.compression(), Compression::None);
    assert!(!i.is_transactional() && !i.is_control());
}

#[test]
fn idempotent_batch_passes() {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records(3, 42),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    let infos = validate_batches(&buf.freeze()).unwrap();
    assert_eq!(infos[0].producer_id, 42);
    assert_eq!(infos[0].base_sequence, 0);
    assert!(infos[0].has_producer_id());
}

#[test]
fn compressed_batches_pass() {
    for c in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let b = batch_with(4, c).freeze();
        let infos = validate_batches(&b).unwrap();
        assert_eq!(infos[0].compression(), c);
    }
}

#[test]
fn every_flipped_byte_is_rejected_as_corrupt() {
    let b = batch(3);
    // Every byte from magic on is covered by either the magic check, the
    // length check or the CRC; bytes 0..8 (base offset) and 12..16 (leader
    // epoch) are deliberately outside the CRC.
    for at in (8..12).chain(16..b.len()) {
        let mut m = b.to_vec();
        m[at] ^= 0x01;
        let err = validate_batches(&Bytes::from(m)).unwrap_err();
        if at == MAGIC_OFFSET {
            assert_eq!(err, BatchError::UnsupportedMagic(3), "byte {at}");
        } else {
            assert_eq!(err.kafka_error_code(), 2, "byte {at}: {err}");
        }
    }
}

#[test]
fn magic_0_and_1_are_unsupported() {
    for magic in [0u8, 1] {
        let mut m = batch(1).to_vec();
        m[MAGIC_OFFSET] = magic;
        let err = validate_batches(&Bytes::from(m)).unwrap_err();
        assert_eq!(err, BatchError::UnsupportedMagic(magic as i8));
        assert_eq!(err.kafka_error_code(), 43);
    }
}

#[test]
fn empty_is_invalid_record() {
    let err = validate_batches(&Bytes::new()).unwrap_err();
    assert_eq!(err, BatchError::Empty);
    assert_eq!(err.kafka_error_code(), 87);
}

#[test]
fn truncation_anywhere_is_corrupt() {
    let b = batch(3);
    for cut in 1..b.len() {
        let err = validate_batches(&b.slice(..cut)).unwrap_err();
        assert_eq!(err.kafka_error_code(), 2, "cut {cut}: {err}");
    }
}

#[test]
fn multiple_batches_are_walked() {
    let mut all = BytesMut::new();
    all.extend_from_slice(&batch(2));
    all.extend_from_slice(&batch_with(3, Compression::Zstd));
    all.extend_from_slice(&batch(1));
    let all = all.freeze();
    let infos = validate_batches(&all).unwrap();
    assert_eq!(infos.len(), 3);
    assert_eq!(infos[1].pos, infos[0].len);
    assert_eq!(infos[2].pos, infos[0].len + infos[1].len);
    assert_eq!(infos[2].pos + infos[2].len, all.len());
    assert_eq!(
        infos.iter().map(|i| i.records_count).collect::<Vec<_>>(),
        [2, 3, 1]
    );
    // A bad CRC in the last batch fails the whole payload.
    let mut m = all.to_vec();
    let last = m.len() - 1;
    m[last] ^= 0xff;
    assert_eq!(
        validate_batches(&Bytes::from(m))
            .unwrap_err()
            .kafka_error_code(),
        2
    );
}

#[test]
fn negative_and_short_batch_lengths_are_corrupt() {
    for len in [-1i32, i32::MIN, 0, 48] {
        let mut m = batch(1).to_vec();
        m[8..12].copy_from_slice(&len.to_be_bytes());
        let err = validate_batches(&Bytes::from(m)).unwrap_err();
        assert!(matches!(err, BatchError::Corrupt(_)), "{len}: {err}");
    }
}

#[test]
fn count_rules_are_invalid_record() {
    // Count disagrees with lastOffsetDelta.
    let mut m = batch(3).to_vec();
    m[57..61].copy_from_slice(&4i32.to_be_bytes());
    reseal(&mut m);
    let err = validate_batches(&Bytes::from(m)).unwrap_err();
    assert!(matches!(err, BatchError::Invalid(_)), "{err}");
    assert_eq!(err.kafka_error_code(), 87);
    // Zero records, consistent delta -1: Kafka rejects count <= 0.
    let mut m = batch(1).to_vec();
    m.truncate(BATCH_HEADER_LEN);
    m[8..12].copy_from_slice(&((BATCH_HEADER_LEN - LOG_OVERHEAD) as i32).to_be_bytes());
    m[23..27].copy_from_slice(&(-1i32).to_be_bytes());
    m[57..61].copy_from_slice(&0i32.to_be_bytes());
    reseal(&mut m);
    let err = validate_batches(&Bytes::from(m)).unwrap_err();
    assert!(matches!(err, BatchError::Invalid(_)), "{err}");
}

#[test]
fn control_batches_and_unknown_codecs_are_invalid() {
    let mut m = batch(1).to_vec();
    m[22] |= CONTROL_BIT as u8;
    reseal(&mut m);
    assert!(matches!(
        validate_batches(&Bytes::from(m)).unwrap_err(),
        BatchError::Invalid(_)
    ));
    let mut m = batch(1).to_vec();
    m[22] |= 0x07;
    reseal(&mut m);
    assert!(matches!(
        validate_batches(&Bytes::from(m)).unwrap_err(),
        BatchError::Invalid(_)
    ));
}

#[test]
fn malformed_records_inside_a_valid_crc_are_invalid() {
    // Shrink the first record's key length by one: the CRC is resealed, so
    // only the record walk can notice.
    let mut m = batch(2).to_vec();
    // Record 0 starts at 61: size varint, attributes, ts delta 0, offset delta 0,
    // key length varint (zigzag 2 * 2 = 4 for "k0").
    assert_eq!(m[BATCH_HEADER_LEN + 4], 4);
    m[BATCH_HEADER_LEN + 4] = 2;
    reseal(&mut m);
    let err = validate_batches(&Bytes::from(m)).unwrap_err();
    assert!(matches!(err, BatchError::Invalid(_)), "{err}");
}

#[test]
fn patch_batch_keeps_crc_valid() {
    let mut m = batch(4).to_vec();
    patch_batch(&mut m, 1_000_000, 7);
    let b = Bytes::from(m.clone());
    validate_batches(&b).unwrap();
    let h = read_batch_header(&m).unwrap();
    assert_eq!(h.base_offset, 1_000_000);
    assert_eq!(h.leader_epoch, 7);
    assert_eq!(h.last_offset(), 1_000_003);
    assert_eq!(h.batch_len, m.len());
    assert!(h.verify_crc(&m));
    // kafka-protocol's own decoder agrees.
    let set = RecordBatchDecoder::decode(&mut b.clone()).unwrap();
    assert_eq!(set.records[3].offset, 1_000_003);
    assert_eq!(set.records[0].partition_leader_epoch, 7);
    // Short buffers are left alone rather than panicking.
    let mut short = [0u8; 5];
    patch_batch(&mut short, 1, 1);
    assert_eq!(short, [0u8; 5]);
}

#[test]
fn read_batch_header_fields() {
    let b = batch(3);
    let h = read_batch_header(&b).unwrap();
    assert_eq!(h.magic, 2);
    assert_eq!(h.records_count, 3);
    assert_eq!(h.base_timestamp, 1_700_000_000_000);
    assert_eq!(h.max_timestamp, 1_700_000_000_020);
    assert_eq!(h.producer_id, -1);
    assert_eq!(h.compression(), Some(Compression::None));
    assert!(h.verify_crc(&b));
    assert!(!h.verify_crc(&b[..b.len() - 1]));
    let mut m = b.to_vec();
    m[70] ^= 1;
    assert!(!h.verify_crc(&m));
    assert!(read_batch_header(&b[..60]).is_none());
}

#[test]
fn record_timestamps_for_every_codec() {
    for c in [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let mut m = batch_with(5, c).to_vec();
        patch_batch(&mut m, 100, 0);
        let ts = record_timestamps(&m).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        let want: Vec<(i64, i64)> = (0..5)
            .map(|i| (100 + i, 1_700_000_000_000 + i * 10))
            .collect();
        assert_eq!(ts, want, "{c:?}");
    }
}

#[test]
fn record_timestamps_use_max_timestamp_for_log_append_time() {
    let mut m = batch(3).to_vec();
    m[22] |= TIMESTAMP_TYPE_BIT as u8;
    reseal(&mut m);
    let ts = record_timestamps(&m).unwrap();
    assert!(ts.iter().all(|&(_, t)| t == 1_700_000_000_020));
}

/// Catches: a LogAppendTime stamp that leaves a CRC consumers reject, or
/// that does not reach every record (compressed or not).
#[test]
fn set_log_append_time_stamps_the_batch_and_keeps_its_crc_valid() {
    for c in [Compression::None, Compression::Gzip] {
        let mut m = batch_with(3, c).to_vec();
        set_log_append_time(&mut m, 42);
        let infos = validate_batches(&Bytes::from(m.clone())).unwrap();
        assert!(infos[0].is_log_append_time(), "{c:?}");
        assert_eq!(infos[0].max_timestamp, 42);
        assert!(record_timestamps(&m).unwrap().iter().all(|&(_, t)| t == 42));
        // Short buffers are left alone.
        let mut short = m[..20].to_vec();
        set_log_append_time(&mut short, 7);
        assert_eq!(short, m[..20]);
    }
}

#[test]
fn record_timestamps_rejects_damage() {
    let b = batch_with(3, Compression::Gzip);
    for cut in [0, 10, 60, 61, b.len() - 1] {
        assert!(record_timestamps(&b[..cut]).is_err(), "cut {cut}");
    }
    // A damaged gzip magic (first byte of the records section) cannot
    // inflate. The batch CRC is not checked here: callers use verify_crc.
    let mut m = b.to_vec();
    m[BATCH_HEADER_LEN] ^= 0xff;
    assert!(matches!(record_timestamps(&m), Err(BatchError::Corrupt(_))));
}

#[test]
fn decompression_bombs_hit_the_limit() {
    // 64 MiB of zeros compresses to a few KiB; a declared count of one with a
    // 64 MiB record size makes us inflate it all, which must stay bounded.
    let limit = 1 << 20;
    let raw = vec![0u8; 4 * limit];
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut enc, &raw).unwrap();
    let gz = enc.finish().unwrap();
    let mut r = Limited::new(Box::new(flate2::read::GzDecoder::new(&gz[..])), limit);
    let mut sink = Vec::new();
    assert!(r.read_to_end(&mut sink).is_err());
    assert!(sink.len() <= limit);
    let snappy = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
    assert!(snappy_decompress(&snappy, limit).is_err());
    assert_eq!(
        snappy_decompress(&snappy, 4 * limit).unwrap().len(),
        4 * limit
    );
}

#[test]
fn first_zstd_batch_finds_the_cut() {
    let plain = batch(2);
    let gzip = batch_with(2, Compression::Gzip).freeze();
    let zstd = batch_with(3, Compression::Zstd).freeze();
    assert_eq!(first_zstd_batch(&[]), None);
    assert_eq!(first_zstd_batch(&plain), None);
    assert_eq!(first_zstd_batch(&zstd), Some(0));
    let mut all = BytesMut::new();
    all.extend_from_slice(&plain);
    all.extend_from_slice(&gzip);
    assert_eq!(first_zstd_batch(&all), None);
    all.extend_from_slice(&zstd);
    all.extend_from_slice(&plain);
    assert_eq!(first_zstd_batch(&all), Some(plain.len() + gzip.len()));
    // A zstd batch cut short by the fetch size still counts once its
    // attributes are there; fewer bytes cannot be decoded as anything.
    let cut = plain.len() + gzip.len() + 23;
    assert_eq!(
        first_zstd_batch(&all[..cut]),
        Some(plain.len() + gzip.len())
    );
    assert_eq!(first_zstd_batch(&all[..cut - 1]), None);
    // Garbage lengths end the walk instead of looping or panicking.
    let mut bad = plain.to_vec();
    bad[8..12].copy_from_slice(&i32::MAX.to_be_bytes());
    assert_eq!(first_zstd_batch(&bad), None);
    bad[8..12].copy_from_slice(&(-5i32).to_be_bytes());
    assert_eq!(first_zstd_batch(&bad), None);
}
