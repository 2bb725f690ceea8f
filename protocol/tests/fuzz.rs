//! A short, seeded fuzz run over everything that parses client bytes:
//! `parse_request`, `validate_batches`, `read_batch_header` and
//! `record_timestamps` must return, never panic, on random and mutated input.
//!
//! No fuzz framework: a xorshift PRNG, a corpus of valid frames and batches,
//! and simple mutations, bounded so it runs in seconds as part of
//! `cargo test`. Reproduce a failure with `KAAS_FUZZ_SEED=<seed>`; run longer
//! with `KAAS_FUZZ_ITERS=<n>`.

use std::panic::{catch_unwind, AssertUnwindSafe};

use bytes::{Bytes, BytesMut};
use kaas_protocol::kafka_protocol::messages::produce_request::{
    PartitionProduceData, TopicProduceData,
};
use kaas_protocol::kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kaas_protocol::kafka_protocol::messages::*;
use kaas_protocol::kafka_protocol::protocol::{Encodable, StrBytes};
use kaas_protocol::kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kaas_protocol::{
    parse_request, read_batch_header, record_timestamps, validate_batches, RequestError, SUPPORTED,
};

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

fn seed() -> u64 {
    std::env::var("KAAS_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x9e37_79b9_7f4a_7c15)
                | 1
        })
}

fn iters(default: usize) -> usize {
    std::env::var("KAAS_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn batch(n: i64, compression: Compression, producer_id: i64) -> Bytes {
    let records: Vec<Record> = (0..n)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id,
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset: i,
            sequence: i as i32,
            timestamp: 1_000 + i,
            key: (i % 2 == 0).then(|| Bytes::from(format!("key-{i}"))),
            value: Some(Bytes::from(vec![b'a' + (i as u8 % 26); 8 + i as usize])),
            headers: [("hdr".into(), Some(Bytes::from_static(b"v")))].into(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .unwrap();
    buf.freeze()
}

fn batch_corpus() -> Vec<Bytes> {
    let mut out = Vec::new();
    for c in [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        out.push(batch(1, c, -1));
        out.push(batch(7, c, 12));
    }
    out
}

fn request_frame(key: ApiKey, version: i16, body: &RequestKind) -> Bytes {
    let mut buf = BytesMut::new();
    let hv = key.request_header_version(version);
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .with_client_id(Some(StrBytes::from_static_str("fuzz")))
        .encode(&mut buf, hv.max(1))
        .unwrap();
    body.encode(&mut buf, version).unwrap();
    buf.freeze()
}

fn request_corpus() -> Vec<Bytes> {
    let mut out = Vec::new();
    let records = batch(3, Compression::None, -1);
    for &(key, min, max) in SUPPORTED {
        for v in min..=max {
            let body = match key {
                ApiKey::Produce => {
                    RequestKind::Produce(ProduceRequest::default().with_acks(-1).with_topic_data(
                        vec![TopicProduceData::default()
                            .with_name(TopicName(StrBytes::from_static_str("t")))
                            .with_partition_data(vec![PartitionProduceData::default()
                                .with_index(0)
                                .with_records(Some(records.clone()))])],
                    ))
                }
                ApiKey::Fetch => RequestKind::Fetch(FetchRequest::default()),
                ApiKey::ListOffsets => RequestKind::ListOffsets(ListOffsetsRequest::default()),
                ApiKey::Metadata => RequestKind::Metadata(MetadataRequest::default().with_topics(
                    Some(
                        vec![metadata_request::MetadataRequestTopic::default()
                        .with_name(Some(TopicName(StrBytes::from_static_str("topic"))))],
                    ),
                )),
                ApiKey::ApiVersions => RequestKind::ApiVersions(
                    ApiVersionsRequest::default()
                        .with_client_software_name(StrBytes::from_static_str("rdkafka"))
                        .with_client_software_version(StrBytes::from_static_str("2.3.0")),
                ),
                ApiKey::CreateTopics => RequestKind::CreateTopics(CreateTopicsRequest::default()),
                ApiKey::DeleteTopics => RequestKind::DeleteTopics(DeleteTopicsRequest::default()),
                ApiKey::InitProducerId => {
                    RequestKind::InitProducerId(InitProducerIdRequest::default())
                }
                ApiKey::OffsetForLeaderEpoch => {
                    RequestKind::OffsetForLeaderEpoch(OffsetForLeaderEpochRequest::default())
                }
                ApiKey::DescribeConfigs => {
                    RequestKind::DescribeConfigs(DescribeConfigsRequest::default())
                }
                ApiKey::DescribeCluster => {
                    RequestKind::DescribeCluster(DescribeClusterRequest::default())
                }
                ApiKey::OffsetCommit => RequestKind::OffsetCommit(OffsetCommitRequest::default()),
                ApiKey::OffsetFetch => RequestKind::OffsetFetch(
                    OffsetFetchRequest::default().with_topics(Some(Vec::new())),
                ),
                ApiKey::FindCoordinator => {
                    RequestKind::FindCoordinator(FindCoordinatorRequest::default())
                }
                ApiKey::JoinGroup => RequestKind::JoinGroup(JoinGroupRequest::default()),
                ApiKey::Heartbeat => RequestKind::Heartbeat(HeartbeatRequest::default()),
                ApiKey::LeaveGroup => RequestKind::LeaveGroup(LeaveGroupRequest::default()),
                ApiKey::SyncGroup => RequestKind::SyncGroup(SyncGroupRequest::default()),
                ApiKey::DescribeGroups => {
                    RequestKind::DescribeGroups(DescribeGroupsRequest::default())
                }
                ApiKey::ListGroups => RequestKind::ListGroups(ListGroupsRequest::default()),
                ApiKey::DeleteGroups => RequestKind::DeleteGroups(
                    DeleteGroupsRequest::default()
                        .with_groups_names(vec![GroupId(StrBytes::from_static_str("g"))]),
                ),
                ApiKey::OffsetDelete => RequestKind::OffsetDelete(OffsetDeleteRequest::default()),
                ApiKey::CreatePartitions => {
                    RequestKind::CreatePartitions(CreatePartitionsRequest::default())
                }
                ApiKey::AlterConfigs => RequestKind::AlterConfigs(AlterConfigsRequest::default()),
                ApiKey::IncrementalAlterConfigs => {
                    RequestKind::IncrementalAlterConfigs(IncrementalAlterConfigsRequest::default())
                }
                ApiKey::DeleteRecords => {
                    RequestKind::DeleteRecords(DeleteRecordsRequest::default())
                }
                ApiKey::DescribeLogDirs => {
                    RequestKind::DescribeLogDirs(DescribeLogDirsRequest::default())
                }
                ApiKey::ElectLeaders => RequestKind::ElectLeaders(ElectLeadersRequest::default()),
                ApiKey::AlterPartitionReassignments => RequestKind::AlterPartitionReassignments(
                    AlterPartitionReassignmentsRequest::default(),
                ),
                ApiKey::ListPartitionReassignments => RequestKind::ListPartitionReassignments(
                    ListPartitionReassignmentsRequest::default(),
                ),
                ApiKey::DescribeClientQuotas => {
                    RequestKind::DescribeClientQuotas(DescribeClientQuotasRequest::default())
                }
                ApiKey::AlterClientQuotas => {
                    RequestKind::AlterClientQuotas(AlterClientQuotasRequest::default())
                }
                ApiKey::WriteTxnMarkers => {
                    RequestKind::WriteTxnMarkers(WriteTxnMarkersRequest::default().with_markers(
                        vec![WritableTxnMarker::default()
                            .with_producer_id(ProducerId(7))
                            .with_transaction_result(true)
                            .with_topics(vec![WritableTxnMarkerTopic::default()
                                .with_name(TopicName(StrBytes::from_static_str("t")))
                                .with_partition_indexes(vec![0])])],
                    ))
                }
                ApiKey::DescribeProducers => RequestKind::DescribeProducers(
                    DescribeProducersRequest::default().with_topics(vec![
                        describe_producers_request::TopicRequest::default()
                            .with_name(TopicName(StrBytes::from_static_str("t")))
                            .with_partition_indexes(vec![0]),
                    ]),
                ),
                ApiKey::ConsumerGroupHeartbeat => RequestKind::ConsumerGroupHeartbeat(
                    ConsumerGroupHeartbeatRequest::default()
                        .with_group_id(GroupId(StrBytes::from_static_str("g")))
                        .with_subscribed_topic_names(Some(vec![TopicName(
                            StrBytes::from_static_str("t"),
                        )]))
                        .with_topic_partitions(Some(Vec::new())),
                ),
                ApiKey::ConsumerGroupDescribe => RequestKind::ConsumerGroupDescribe(
                    ConsumerGroupDescribeRequest::default()
                        .with_group_ids(vec![GroupId(StrBytes::from_static_str("g"))]),
                ),
                ApiKey::AddPartitionsToTxn => {
                    RequestKind::AddPartitionsToTxn(AddPartitionsToTxnRequest::default())
                }
                ApiKey::AddOffsetsToTxn => {
                    RequestKind::AddOffsetsToTxn(AddOffsetsToTxnRequest::default())
                }
                ApiKey::EndTxn => RequestKind::EndTxn(EndTxnRequest::default()),
                ApiKey::TxnOffsetCommit => {
                    RequestKind::TxnOffsetCommit(TxnOffsetCommitRequest::default())
                }
                ApiKey::DescribeTransactions => {
                    RequestKind::DescribeTransactions(DescribeTransactionsRequest::default())
                }
                ApiKey::ListTransactions => {
                    RequestKind::ListTransactions(ListTransactionsRequest::default())
                }
                ApiKey::DescribeTopicPartitions => RequestKind::DescribeTopicPartitions(
                    DescribeTopicPartitionsRequest::default()
                        .with_topics(vec![
                            describe_topic_partitions_request::TopicRequest::default()
                                .with_name(TopicName(StrBytes::from_static_str("t"))),
                        ])
                        .with_response_partition_limit(2000)
                        .with_cursor(Some(
                            describe_topic_partitions_request::Cursor::default()
                                .with_topic_name(TopicName(StrBytes::from_static_str("t"))),
                        )),
                ),
                other => panic!("corpus lacks {other:?}"),
            };
            let frame = request_frame(key, v, &body);
            parse_request(frame.clone())
                .unwrap_or_else(|e| panic!("corpus frame {key:?} v{v} does not parse: {e}"));
            out.push(frame);
        }
    }
    out
}

const INTERESTING: &[u8] = &[0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff];

fn mutate(rng: &mut XorShift, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 if !v.is_empty() => {
                let cut = rng.below(v.len());
                v.truncate(cut);
            }
            3 => {
                let i = rng.below(v.len() + 1);
                v.insert(i, rng.byte());
            }
            4 if v.len() >= 4 => {
                // Overwrite a 4-byte window with an extreme length.
                let i = rng.below(v.len() - 3);
                let n: i32 = [i32::MAX, i32::MIN, -1, 0x7fff, 0x10000][rng.below(5)];
                v[i..i + 4].copy_from_slice(&n.to_be_bytes());
            }
            5 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.byte();
            }
            _ => {
                let n = rng.below(8);
                v.extend((0..n).map(|_| rng.byte()));
            }
        }
    }
    v
}

/// Recomputes the batch CRC so mutations reach the record walker and the
/// decompressors instead of stopping at the checksum.
fn reseal(v: &mut [u8]) {
    if v.len() > 21 {
        let crc = crc32c::crc32c(&v[21..]);
        v[17..21].copy_from_slice(&crc.to_be_bytes());
    }
}

#[test]
fn parse_request_never_panics() {
    let seed = seed();
    let n = iters(200_000);
    eprintln!("parse_request fuzz: seed {seed}, {n} iterations");
    let mut rng = XorShift(seed);
    let corpus = request_corpus();
    let mut parsed = 0usize;
    for i in 0..n {
        let input = if rng.below(4) == 0 {
            let len = rng.below(64);
            let mut v: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
            // Aim half the random frames at a real api and version.
            if v.len() >= 4 && rng.below(2) == 0 {
                let (key, min, max) = SUPPORTED[rng.below(SUPPORTED.len())];
                v[..2].copy_from_slice(&(key as i16).to_be_bytes());
                let ver = min + rng.below((max - min + 1) as usize) as i16;
                v[2..4].copy_from_slice(&ver.to_be_bytes());
            }
            v
        } else {
            let pick = rng.below(corpus.len());
            mutate(&mut rng, &corpus[pick])
        };
        let frame = Bytes::from(input);
        let result = catch_unwind(AssertUnwindSafe(|| parse_request(frame.clone())));
        match result {
            Err(_) => {
                panic!("parse_request panicked: seed {seed}, iteration {i}, input {frame:02x?}")
            }
            Ok(Err(RequestError::Malformed { reason, .. })) if reason.contains("panicked") => {
                panic!("decoder panic was caught: seed {seed}, iteration {i}, input {frame:02x?}")
            }
            Ok(Err(e)) if frame.len() >= 8 => {
                assert!(
                    e.correlation_id().is_some(),
                    "seed {seed} iteration {i}: {e}"
                )
            }
            Ok(r) => parsed += usize::from(r.is_ok()),
        }
    }
    eprintln!("parse_request fuzz: {parsed} of {n} parsed");
}

#[test]
fn batch_decoding_never_panics() {
    let seed = seed();
    let n = iters(100_000);
    eprintln!("batch fuzz: seed {seed}, {n} iterations");
    let mut rng = XorShift(seed ^ 0x5555_5555_5555_5555);
    let corpus = batch_corpus();
    // How deep the inputs reach, printed so a run that stops at the CRC is
    // visible: (validated, timestamps decoded).
    let (mut validated, mut decoded) = (0usize, 0usize);
    for i in 0..n {
        let mut input = if rng.below(8) == 0 {
            let len = rng.below(128);
            (0..len).map(|_| rng.byte()).collect()
        } else {
            let mut v = corpus[rng.below(corpus.len())].to_vec();
            if rng.below(4) == 0 {
                // Concatenate a second batch to exercise the walk.
                v.extend_from_slice(&corpus[rng.below(corpus.len())]);
            }
            mutate(&mut rng, &v)
        };
        if rng.below(2) == 0 {
            reseal(&mut input);
        }
        let bytes = Bytes::from(input);
        let target = kaas_protocol::batch::Codec::new(
            [
                Compression::None,
                Compression::Gzip,
                Compression::Snappy,
                Compression::Lz4,
                Compression::Zstd,
            ][rng.below(5)],
        );
        let result = catch_unwind(AssertUnwindSafe(|| {
            let infos = validate_batches(&bytes);
            let v = infos.is_ok();
            // What passes validation may be rebuilt with a topic's codec.
            if let Ok(infos) = infos {
                let _ = kaas_protocol::batch::recompress_batches(&bytes, infos, target, 1 << 20);
            }
            let _ = read_batch_header(&bytes);
            (v, record_timestamps(&bytes).is_ok())
        }));
        match result {
            Ok((v, d)) => {
                validated += usize::from(v);
                decoded += usize::from(d);
            }
            Err(_) => {
                panic!("batch decoding panicked: seed {seed}, iteration {i}, input {bytes:02x?}")
            }
        }
    }
    eprintln!("batch fuzz: {validated} validated, {decoded} decoded of {n}");
}
