//! Requests at a version kaas does not serve: the answer that says so, and
//! the one log line per client that tells the operator who sent it.
//!
//! Kafka closes the connection on any request version it does not serve
//! (`SocketServer.parseRequestHeader` throws `InvalidRequestException` when
//! `ApiKeys.isVersionEnabled` is false; only ApiVersions is exempt, KIP-511),
//! so the client sees a bare disconnect and, typically, retries. kaas does
//! better where the protocol lets it: when the crate can decode the request
//! and encode the response at that version (a version of an api we serve,
//! inside the crate's range but outside ours: DescribeCluster v2, EndTxn
//! v5, TxnOffsetCommit v5…), the response carries UNSUPPORTED_VERSION in its error fields and the
//! connection stays open. Below the crate's range (the versions Kafka 4.0
//! removed, KIP-896, except those kaas serves again: OffsetCommit v0-1,
//! OffsetFetch v0) the response cannot be encoded, and the connection is
//! closed as Kafka does.

use super::s;
use kaas_protocol::kafka_protocol::messages::{
    add_offsets_to_txn_response::AddOffsetsToTxnResponse,
    add_partitions_to_txn_response::AddPartitionsToTxnResponse,
    alter_partition_reassignments_response::AlterPartitionReassignmentsResponse,
    describe_cluster_response::DescribeClusterResponse,
    end_txn_response::EndTxnResponse,
    init_producer_id_response::InitProducerIdResponse,
    list_transactions_response::ListTransactionsResponse,
    txn_offset_commit_response::{
        TxnOffsetCommitResponse, TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
    },
    RequestKind, ResponseKind,
};
use std::collections::HashSet;
use std::sync::Mutex;

/// UNSUPPORTED_VERSION (35).
const CODE: i16 = kaas_protocol::request::UNSUPPORTED_VERSION;

/// The message Kafka's `UnsupportedVersionException` carries, for the
/// responses with an error message field.
const MESSAGE: &str = "The version of API is not supported.";

/// The response to `body`, a request at version `v` that kaas does not
/// serve, with UNSUPPORTED_VERSION in every error field it has (each topic,
/// partition or group the request named, as Kafka's `getErrorResponse`
/// does), or `None` when there is none to give: then the connection closes.
///
/// Covers every api whose crate range reaches past ours (a unit test
/// checks that against `versions::SUPPORTED`).
pub fn answer(v: i16, body: RequestKind) -> Option<ResponseKind> {
    Some(match body {
        RequestKind::DescribeCluster(_) => {
            let mut resp = DescribeClusterResponse::default();
            resp.error_code = CODE;
            resp.error_message = Some(s(MESSAGE));
            ResponseKind::DescribeCluster(resp)
        }
        // v4+ has a top-level code; below it only per-partition results,
        // and every version below 4 is served.
        RequestKind::AddPartitionsToTxn(_) if v >= 4 => {
            let mut resp = AddPartitionsToTxnResponse::default();
            resp.error_code = CODE;
            ResponseKind::AddPartitionsToTxn(resp)
        }
        RequestKind::AddOffsetsToTxn(_) => {
            let mut resp = AddOffsetsToTxnResponse::default();
            resp.error_code = CODE;
            ResponseKind::AddOffsetsToTxn(resp)
        }
        RequestKind::EndTxn(_) => {
            let mut resp = EndTxnResponse::default();
            resp.error_code = CODE;
            ResponseKind::EndTxn(resp)
        }
        RequestKind::InitProducerId(_) => {
            let mut resp = InitProducerIdResponse::default();
            resp.error_code = CODE;
            ResponseKind::InitProducerId(resp)
        }
        RequestKind::ListTransactions(_) => {
            let mut resp = ListTransactionsResponse::default();
            resp.error_code = CODE;
            ResponseKind::ListTransactions(resp)
        }
        RequestKind::AlterPartitionReassignments(_) => {
            let mut resp = AlterPartitionReassignmentsResponse::default();
            resp.error_code = CODE;
            resp.error_message = Some(s(MESSAGE));
            ResponseKind::AlterPartitionReassignments(resp)
        }
        RequestKind::TxnOffsetCommit(r) => {
            let mut resp = TxnOffsetCommitResponse::default();
            resp.topics = r
                .topics
                .into_iter()
                .map(|t| {
                    let mut rt = TxnOffsetCommitResponseTopic::default();
                    rt.name = t.name;
                    rt.partitions = t
                        .partitions
                        .iter()
                        .map(|p| {
                            let mut rp = TxnOffsetCommitResponsePartition::default();
                            rp.partition_index = p.partition_index;
                            rp.error_code = CODE;
                            rp
                        })
                        .collect();
                    rt
                })
                .collect();
            ResponseKind::TxnOffsetCommit(resp)
        }
        _ => return None,
    })
}

/// Clients named in a refused-version WARN at most: past it, the per-peer
/// rate limit alone bounds the log.
const MAX_CLIENTS: usize = 1024;

/// Characters of a client id or software name remembered.
const MAX_NAME_CHARS: usize = 256;

/// The (client id, client software name) pairs already named in a
/// refused-version WARN: an old client repeats its request on every
/// connection, and one line per client says all there is to say.
#[derive(Debug, Default)]
pub struct RefusedClients {
    seen: Mutex<HashSet<(String, String)>>,
}

impl RefusedClients {
    /// Whether this is the first refusal of (`client_id`, `software`), to
    /// be logged at WARN. Past [`MAX_CLIENTS`] pairs, never (the caller
    /// falls back on the per-peer rate limit).
    pub fn first(&self, client_id: &str, software: &str) -> Option<bool> {
        // Both come from the client: bounded, so the set is too.
        let cut = |x: &str| x.chars().take(MAX_NAME_CHARS).collect::<String>();
        let key = (cut(client_id), cut(software));
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(&key) {
            return Some(false);
        }
        if seen.len() >= MAX_CLIENTS {
            return None;
        }
        seen.insert(key);
        Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kaas_protocol::kafka_protocol::messages::*;
    use kaas_protocol::versions::SUPPORTED;

    /// A request of `k` naming one topic, partition or group where the
    /// request has such a list, so the answer's nested codes are checked.
    fn request(k: ApiKey) -> Option<RequestKind> {
        use kaas_protocol::kafka_protocol::protocol::StrBytes;
        let name = || TopicName(StrBytes::from_static_str("t"));
        Some(match k {
            ApiKey::DescribeCluster => {
                RequestKind::DescribeCluster(DescribeClusterRequest::default())
            }
            ApiKey::AddPartitionsToTxn => {
                RequestKind::AddPartitionsToTxn(AddPartitionsToTxnRequest::default())
            }
            ApiKey::AddOffsetsToTxn => {
                RequestKind::AddOffsetsToTxn(AddOffsetsToTxnRequest::default())
            }
            ApiKey::EndTxn => RequestKind::EndTxn(EndTxnRequest::default()),
            ApiKey::ListTransactions => {
                RequestKind::ListTransactions(ListTransactionsRequest::default())
            }
            ApiKey::AlterPartitionReassignments => RequestKind::AlterPartitionReassignments(
                AlterPartitionReassignmentsRequest::default(),
            ),
            ApiKey::TxnOffsetCommit => {
                RequestKind::TxnOffsetCommit(TxnOffsetCommitRequest::default().with_topics(vec![
                    txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                        .with_name(name())
                        .with_partitions(vec![
                            txn_offset_commit_request::TxnOffsetCommitRequestPartition::default(),
                        ]),
                ]))
            }
            ApiKey::OffsetCommit => {
                RequestKind::OffsetCommit(OffsetCommitRequest::default().with_topics(vec![
                    offset_commit_request::OffsetCommitRequestTopic::default()
                        .with_name(name())
                        .with_partitions(vec![
                            offset_commit_request::OffsetCommitRequestPartition::default(),
                        ]),
                ]))
            }
            // In the crate's range up to v10, but its request schema
            // stops at v9: never decoded, so never answered.
            ApiKey::OffsetFetch => RequestKind::OffsetFetch(OffsetFetchRequest::default()),
            ApiKey::InitProducerId => RequestKind::InitProducerId(InitProducerIdRequest::default()),
            _ => return None,
        })
    }

    /// Every error code in an encoded answer, found by decoding it back
    /// and reading the fields `answer` sets.
    fn codes(resp: &ResponseKind) -> Vec<i16> {
        match resp {
            ResponseKind::DescribeCluster(r) => vec![r.error_code],
            ResponseKind::AddPartitionsToTxn(r) => vec![r.error_code],
            ResponseKind::AddOffsetsToTxn(r) => vec![r.error_code],
            ResponseKind::EndTxn(r) => vec![r.error_code],
            ResponseKind::InitProducerId(r) => vec![r.error_code],
            ResponseKind::ListTransactions(r) => vec![r.error_code],
            ResponseKind::AlterPartitionReassignments(r) => vec![r.error_code],
            ResponseKind::TxnOffsetCommit(r) => r
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
                .collect(),
            other => panic!("no codes for {other:?}"),
        }
    }

    /// Catches: a version the crate knows but we do not advertise (a
    /// newer Kafka's, or one a range was lowered from) closing the
    /// connection instead of answering UNSUPPORTED_VERSION, because
    /// `answer` lacks its api.
    #[test]
    fn every_refusable_version_is_answered_with_unsupported_version() {
        let mut checked = 0;
        for &(k, min, max) in SUPPORTED {
            let crate_range = k.valid_versions();
            for v in crate_range.min..=crate_range.max {
                if (min..=max).contains(&v) || k == ApiKey::ApiVersions {
                    continue;
                }
                let Some(req) = request(k) else {
                    panic!("{k:?} v{v} is refusable: add it to refused::answer")
                };
                // Only versions whose request the crate decodes reach
                // `answer` (OffsetCommit's and OffsetFetch's valid range
                // says 10, their request schemas stop at 9).
                let mut buf = BytesMut::new();
                if req.encode(&mut buf, v).is_err() {
                    continue;
                }
                let resp = answer(v, req).unwrap_or_else(|| panic!("{k:?} v{v}: no answer"));
                let mut buf = BytesMut::new();
                resp.encode(&mut buf, v)
                    .unwrap_or_else(|e| panic!("{k:?} v{v} answer does not encode: {e:#}"));
                let back = ResponseKind::decode(k, &mut buf.freeze(), v).unwrap();
                let codes = codes(&back);
                assert!(!codes.is_empty(), "{k:?} v{v}");
                assert!(codes.iter().all(|c| *c == CODE), "{k:?} v{v}: {codes:?}");
                checked += 1;
            }
        }
        assert!(checked > 0, "no refusable version checked");
    }

    #[test]
    fn each_client_is_named_once() {
        let r = RefusedClients::default();
        assert_eq!(r.first("sarama", ""), Some(true));
        assert_eq!(r.first("sarama", ""), Some(false));
        assert_eq!(r.first("sarama", "apache-kafka-java"), Some(true));
        for i in 0..MAX_CLIENTS {
            r.first(&format!("c{i}"), "");
        }
        assert_eq!(r.first("one too many", ""), None);
        assert_eq!(r.first("sarama", ""), Some(false));
    }
}
