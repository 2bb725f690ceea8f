//! The API version table kaas advertises in ApiVersions, and the single
//! source of truth `parse_request` checks incoming versions against.
//!
//! Every range is intersected with what the kafka-protocol crate can decode
//! and encode, so we never advertise a version we cannot parse. A client picks
//! the highest version both sides support, so each `max` here is a promise
//! that the broker implements every field of that version.

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

/// The advertised table: (api, min, max), in api-key order.
///
/// `supported_range` intersects each entry with the crate's
/// `ApiKey::valid_versions()` at lookup time, and a unit test asserts the
/// intersection is a no-op, so a crate upgrade that narrows a range fails our
/// tests instead of a client.
///
/// Notes on the upper bounds:
/// * Produce v13 and Fetch v13+ address topics by `topic_id` (the `name` /
///   `topic` field is empty on the wire); the broker must resolve ids.
/// * ListOffsets v10 only adds a request-level `timeout_ms` (KIP-1075), which
///   a broker without tiered storage may ignore.
/// * Metadata v13 only adds a top-level error code (KIP-1102, for
///   REBOOTSTRAP_REQUIRED), always 0 here. kafka-python 3 pinned to
///   `api_version=(4, 0)` sends v13 and was disconnected before bootstrap.
/// * Transaction APIs (coordinator side) stop below KIP-890 part 2
///   (transaction version 2, epoch bump per transaction): AddPartitionsToTxn
///   v5, AddOffsetsToTxn v5, EndTxn / TxnOffsetCommit v5; ListTransactions
///   v2 (id pattern). kaas finalizes no `transaction.version` feature, so a
///   client never asks for those. AddOffsetsToTxn / EndTxn / TxnOffsetCommit
///   v4 keep v3's schema and only allow the TRANSACTION_ABORTABLE error
///   (KIP-890 part 1, like InitProducerId v5 and Produce v11+), which kaas
///   never answers. AddPartitionsToTxn v4 is the broker-to-broker
///   `verify_only` batch of KIP-890 part 1, which the brokers send each
///   other and serve.
/// * Group APIs: OffsetCommit v9 / OffsetFetch v9 carry KIP-848 member
///   epochs (checked for consumer-protocol groups; librdkafka 2.16 sends v9
///   with `group.protocol=consumer`). DescribeGroups v6 (KIP-1043) answers
///   an unknown group GROUP_ID_NOT_FOUND with a message instead of a `Dead`
///   group without error. OffsetFetch v8 is the batched form.
///   FindCoordinator v5 and v6 keep v4's schema: v5 only allows the
///   TRANSACTION_ABORTABLE error (KIP-890), which kaas never answers
///   there; v6 allows key type 2 (share groups, KIP-932), which kaas
///   refuses per key with INVALID_REQUEST as a broker with share groups
///   disabled does. A client that has seen Produce v13 sends v6
///   (kafka-python pinned to (3, 9) or later did, and was disconnected).
/// * Notes on the lower bounds: Kafka 4.0 removed the versions KIP-896
///   deprecated, and the crate is generated without them. kaas serves two of
///   them again through a patch of the vendored crate (vendor/README.md),
///   because they cost almost nothing and old clients still send them
///   whatever version they are configured for (sarama 1.x):
///   OffsetCommit v0-1 (v0 carries no generation or member, so it is a
///   standalone commit, accepted while the group is empty, as Kafka did;
///   v1's per-partition commit timestamp is ignored, see
///   `offset_commit.rs`), OffsetFetch v0 (v1's schema; Kafka read
///   ZooKeeper offsets for it, kaas reads the one offset store),
///   DescribeConfigs v0 (`is_default` in place of the config source) and
///   CreateTopics v0-1 (no `validate_only` in v0, no error message in v0,
///   no throttle time before v2; sarama configured for 0.11.x sends v1).
///   The rest stay refused: Produce v0-2 and Fetch v0-3 need message
///   format v0/v1 (magic 0/1) converted both ways; ListOffsets v0,
///   DeleteTopics v0, OffsetForLeaderEpoch v0-1 and DescribeLogDirs v0
///   come from clients configured for a Kafka before 0.11, whose Fetch
///   (v3 or older) kaas refuses anyway.
///   A refused version the crate can encode an answer for is answered
///   UNSUPPORTED_VERSION (broker `api::refused`); below the crate's range
///   the connection closes, as Kafka closes it for every refused version.
/// * ConsumerGroupHeartbeat v1 (KIP-1082: client-issued member ids, regex
///   subscriptions) is the only version librdkafka 2.16 sends;
///   ConsumerGroupDescribe v1 adds the member type.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 13),
    (ApiKey::Fetch, 4, 18),
    (ApiKey::ListOffsets, 1, 10),
    (ApiKey::Metadata, 0, 13),
    (ApiKey::OffsetCommit, 0, 9),
    (ApiKey::OffsetFetch, 0, 9),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 6),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 0, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::DescribeConfigs, 0, 4),
    (ApiKey::DescribeCluster, 0, 1),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::AlterPartitionReassignments, 0, 0),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::WriteTxnMarkers, 1, 1),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    (ApiKey::AddPartitionsToTxn, 0, 4),
    (ApiKey::AddOffsetsToTxn, 0, 4),
    (ApiKey::EndTxn, 0, 4),
    (ApiKey::TxnOffsetCommit, 0, 4),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 1),
    (ApiKey::DescribeTopicPartitions, 0, 0),
];

/// The lowest Produce version that may carry zstd batches: Produce v7 came
/// with zstd (KIP-110), and Kafka refuses a zstd batch in an older request
/// with UNSUPPORTED_COMPRESSION_TYPE.
pub const PRODUCE_MIN_VERSION_ZSTD: i16 = 7;

/// The lowest Fetch version whose client can read zstd batches (KIP-110).
/// Below it the broker must never serve a zstd batch: Kafka answers the
/// partition with UNSUPPORTED_COMPRESSION_TYPE instead.
pub const FETCH_MIN_VERSION_ZSTD: i16 = 10;

/// The advertised `(min, max)` for a raw api key, or `None` when kaas does not
/// serve that api at all (whether or not kafka-protocol knows it).
pub fn supported_range(api_key: i16) -> Option<(i16, i16)> {
    SUPPORTED
        .iter()
        .find(|(k, _, _)| *k as i16 == api_key)
        .and_then(|&(k, min, max)| {
            let crate_range = k.valid_versions();
            let min = min.max(crate_range.min);
            let max = max.min(crate_range.max);
            (min <= max).then_some((min, max))
        })
}

/// Whether `version` of `api_key` is one we advertise.
pub fn is_supported(api_key: i16, version: i16) -> bool {
    supported_range(api_key).is_some_and(|(min, max)| (min..=max).contains(&version))
}

/// The advertised table as ApiVersions entries.
pub fn api_version_entries() -> Vec<ApiVersion> {
    SUPPORTED
        .iter()
        .filter_map(|&(k, _, _)| {
            let (min, max) = supported_range(k as i16)?;
            Some(
                ApiVersion::default()
                    .with_api_key(k as i16)
                    .with_min_version(min)
                    .with_max_version(max),
            )
        })
        .collect()
}

/// A successful ApiVersions response body for `version`: the full table,
/// throttle 0, error 0. From v3 on, supported and finalized features are left
/// empty (no KRaft feature levels to report) with finalized epoch -1, which is
/// what Kafka sends when no features are finalized.
pub fn api_versions_response(version: i16) -> ApiVersionsResponse {
    let mut resp = ApiVersionsResponse::default()
        .with_error_code(0)
        .with_throttle_time_ms(0)
        .with_api_keys(api_version_entries());
    if version >= 3 {
        resp = resp.with_finalized_features_epoch(-1);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::messages::*;
    use kafka_protocol::messages::{RequestKind, ResponseKind};

    #[test]
    fn table_lies_inside_crate_ranges() {
        for &(k, min, max) in SUPPORTED {
            let r = k.valid_versions();
            assert!(
                r.min <= min && max <= r.max,
                "{k:?} {min}-{max} outside crate {}-{}",
                r.min,
                r.max
            );
            assert_eq!(supported_range(k as i16), Some((min, max)));
        }
        assert_eq!(supported_range(ApiKey::ShareGroupHeartbeat as i16), None);
        assert_eq!(supported_range(-1), None);
        assert_eq!(supported_range(i16::MAX), None);
    }

    fn default_request(k: ApiKey) -> RequestKind {
        match k {
            ApiKey::Produce => RequestKind::Produce(ProduceRequest::default()),
            ApiKey::Fetch => RequestKind::Fetch(FetchRequest::default()),
            ApiKey::ListOffsets => RequestKind::ListOffsets(ListOffsetsRequest::default()),
            ApiKey::Metadata => RequestKind::Metadata(MetadataRequest::default()),
            ApiKey::ApiVersions => RequestKind::ApiVersions(ApiVersionsRequest::default()),
            ApiKey::CreateTopics => RequestKind::CreateTopics(CreateTopicsRequest::default()),
            ApiKey::DeleteTopics => RequestKind::DeleteTopics(DeleteTopicsRequest::default()),
            ApiKey::InitProducerId => RequestKind::InitProducerId(InitProducerIdRequest::default()),
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
            ApiKey::DescribeGroups => RequestKind::DescribeGroups(DescribeGroupsRequest::default()),
            ApiKey::ListGroups => RequestKind::ListGroups(ListGroupsRequest::default()),
            ApiKey::DeleteGroups => RequestKind::DeleteGroups(DeleteGroupsRequest::default()),
            ApiKey::OffsetDelete => RequestKind::OffsetDelete(OffsetDeleteRequest::default()),
            ApiKey::DescribeClientQuotas => {
                RequestKind::DescribeClientQuotas(DescribeClientQuotasRequest::default())
            }
            ApiKey::AlterClientQuotas => {
                RequestKind::AlterClientQuotas(AlterClientQuotasRequest::default())
            }
            ApiKey::CreatePartitions => {
                RequestKind::CreatePartitions(CreatePartitionsRequest::default())
            }
            ApiKey::AlterConfigs => RequestKind::AlterConfigs(AlterConfigsRequest::default()),
            ApiKey::IncrementalAlterConfigs => {
                RequestKind::IncrementalAlterConfigs(IncrementalAlterConfigsRequest::default())
            }
            ApiKey::DeleteRecords => RequestKind::DeleteRecords(DeleteRecordsRequest::default()),
            ApiKey::DescribeLogDirs => {
                RequestKind::DescribeLogDirs(DescribeLogDirsRequest::default())
            }
            ApiKey::ElectLeaders => RequestKind::ElectLeaders(ElectLeadersRequest::default()),
            ApiKey::AlterPartitionReassignments => RequestKind::AlterPartitionReassignments(
                AlterPartitionReassignmentsRequest::default(),
            ),
            ApiKey::ListPartitionReassignments => {
                RequestKind::ListPartitionReassignments(ListPartitionReassignmentsRequest::default())
            }
            ApiKey::WriteTxnMarkers => {
                RequestKind::WriteTxnMarkers(WriteTxnMarkersRequest::default())
            }
            ApiKey::DescribeProducers => {
                RequestKind::DescribeProducers(DescribeProducersRequest::default())
            }
            ApiKey::ConsumerGroupHeartbeat => {
                RequestKind::ConsumerGroupHeartbeat(ConsumerGroupHeartbeatRequest::default())
            }
            ApiKey::ConsumerGroupDescribe => {
                RequestKind::ConsumerGroupDescribe(ConsumerGroupDescribeRequest::default())
            }
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
            ApiKey::DescribeTopicPartitions => {
                RequestKind::DescribeTopicPartitions(DescribeTopicPartitionsRequest::default())
            }
            other => panic!("no default request for {other:?}"),
        }
    }

    fn default_response(k: ApiKey) -> ResponseKind {
        match k {
            ApiKey::Produce => ResponseKind::Produce(ProduceResponse::default()),
            ApiKey::Fetch => ResponseKind::Fetch(FetchResponse::default()),
            ApiKey::ListOffsets => ResponseKind::ListOffsets(ListOffsetsResponse::default()),
            ApiKey::Metadata => ResponseKind::Metadata(MetadataResponse::default()),
            ApiKey::ApiVersions => ResponseKind::ApiVersions(api_versions_response(0)),
            ApiKey::CreateTopics => ResponseKind::CreateTopics(CreateTopicsResponse::default()),
            ApiKey::DeleteTopics => ResponseKind::DeleteTopics(DeleteTopicsResponse::default()),
            ApiKey::InitProducerId => {
                ResponseKind::InitProducerId(InitProducerIdResponse::default())
            }
            ApiKey::OffsetForLeaderEpoch => {
                ResponseKind::OffsetForLeaderEpoch(OffsetForLeaderEpochResponse::default())
            }
            ApiKey::DescribeConfigs => {
                ResponseKind::DescribeConfigs(DescribeConfigsResponse::default())
            }
            ApiKey::DescribeCluster => {
                ResponseKind::DescribeCluster(DescribeClusterResponse::default())
            }
            ApiKey::OffsetCommit => ResponseKind::OffsetCommit(OffsetCommitResponse::default()),
            ApiKey::OffsetFetch => ResponseKind::OffsetFetch(OffsetFetchResponse::default()),
            ApiKey::FindCoordinator => {
                ResponseKind::FindCoordinator(FindCoordinatorResponse::default())
            }
            ApiKey::JoinGroup => ResponseKind::JoinGroup(
                JoinGroupResponse::default().with_protocol_name(Some(Default::default())),
            ),
            ApiKey::Heartbeat => ResponseKind::Heartbeat(HeartbeatResponse::default()),
            ApiKey::LeaveGroup => ResponseKind::LeaveGroup(LeaveGroupResponse::default()),
            ApiKey::SyncGroup => ResponseKind::SyncGroup(SyncGroupResponse::default()),
            ApiKey::DescribeGroups => {
                ResponseKind::DescribeGroups(DescribeGroupsResponse::default())
            }
            ApiKey::ListGroups => ResponseKind::ListGroups(ListGroupsResponse::default()),
            ApiKey::DeleteGroups => ResponseKind::DeleteGroups(DeleteGroupsResponse::default()),
            ApiKey::OffsetDelete => ResponseKind::OffsetDelete(OffsetDeleteResponse::default()),
            ApiKey::DescribeClientQuotas => {
                ResponseKind::DescribeClientQuotas(DescribeClientQuotasResponse::default())
            }
            ApiKey::AlterClientQuotas => {
                ResponseKind::AlterClientQuotas(AlterClientQuotasResponse::default())
            }
            ApiKey::CreatePartitions => {
                ResponseKind::CreatePartitions(CreatePartitionsResponse::default())
            }
            ApiKey::AlterConfigs => ResponseKind::AlterConfigs(AlterConfigsResponse::default()),
            ApiKey::IncrementalAlterConfigs => {
                ResponseKind::IncrementalAlterConfigs(IncrementalAlterConfigsResponse::default())
            }
            ApiKey::DeleteRecords => ResponseKind::DeleteRecords(DeleteRecordsResponse::default()),
            ApiKey::DescribeLogDirs => {
                ResponseKind::DescribeLogDirs(DescribeLogDirsResponse::default())
            }
            ApiKey::ElectLeaders => ResponseKind::ElectLeaders(ElectLeadersResponse::default()),
            ApiKey::AlterPartitionReassignments => ResponseKind::AlterPartitionReassignments(
                AlterPartitionReassignmentsResponse::default(),
            ),
            ApiKey::ListPartitionReassignments => ResponseKind::ListPartitionReassignments(
                ListPartitionReassignmentsResponse::default(),
            ),
            ApiKey::WriteTxnMarkers => {
                ResponseKind::WriteTxnMarkers(WriteTxnMarkersResponse::default())
            }
            ApiKey::DescribeProducers => {
                ResponseKind::DescribeProducers(DescribeProducersResponse::default())
            }
            ApiKey::ConsumerGroupHeartbeat => {
                ResponseKind::ConsumerGroupHeartbeat(ConsumerGroupHeartbeatResponse::default())
            }
            ApiKey::ConsumerGroupDescribe => {
                ResponseKind::ConsumerGroupDescribe(ConsumerGroupDescribeResponse::default())
            }
            ApiKey::AddPartitionsToTxn => {
                ResponseKind::AddPartitionsToTxn(AddPartitionsToTxnResponse::default())
            }
            ApiKey::AddOffsetsToTxn => {
                ResponseKind::AddOffsetsToTxn(AddOffsetsToTxnResponse::default())
            }
            ApiKey::EndTxn => ResponseKind::EndTxn(EndTxnResponse::default()),
            ApiKey::TxnOffsetCommit => {
                ResponseKind::TxnOffsetCommit(TxnOffsetCommitResponse::default())
            }
            ApiKey::DescribeTransactions => {
                ResponseKind::DescribeTransactions(DescribeTransactionsResponse::default())
            }
            ApiKey::ListTransactions => {
                ResponseKind::ListTransactions(ListTransactionsResponse::default())
            }
            ApiKey::DescribeTopicPartitions => {
                ResponseKind::DescribeTopicPartitions(DescribeTopicPartitionsResponse::default())
            }
            other => panic!("no default response for {other:?}"),
        }
    }

    #[test]
    fn every_advertised_version_round_trips() {
        for &(k, min, max) in SUPPORTED {
            for v in min..=max {
                let req = default_request(k);
                let mut buf = BytesMut::new();
                req.encode(&mut buf, v)
                    .unwrap_or_else(|e| panic!("encode {k:?} v{v}: {e:#}"));
                let mut bytes = buf.freeze();
                let back = RequestKind::decode(k, &mut bytes, v)
                    .unwrap_or_else(|e| panic!("decode {k:?} v{v}: {e:#}"));
                assert_eq!(back, req, "{k:?} v{v}");
                assert!(bytes.is_empty(), "{k:?} v{v} left bytes");

                let resp = default_response(k);
                let mut buf = BytesMut::new();
                resp.encode(&mut buf, v)
                    .unwrap_or_else(|e| panic!("encode response {k:?} v{v}: {e:#}"));
                let mut bytes = buf.freeze();
                let back = ResponseKind::decode(k, &mut bytes, v)
                    .unwrap_or_else(|e| panic!("decode response {k:?} v{v}: {e:#}"));
                assert_eq!(back, resp, "{k:?} v{v} response");
            }
        }
    }

    #[test]
    fn api_versions_response_lists_the_table() {
        for v in 0..=4 {
            let r = api_versions_response(v);
            assert_eq!(r.error_code, 0);
            assert_eq!(r.api_keys.len(), SUPPORTED.len());
            let produce = r
                .api_keys
                .iter()
                .find(|a| a.api_key == ApiKey::Produce as i16)
                .unwrap();
            assert_eq!((produce.min_version, produce.max_version), (3, 13));
        }
    }
}
