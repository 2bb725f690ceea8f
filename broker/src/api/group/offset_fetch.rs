//! OffsetFetch (key 9): the durable committed offsets of a group (v0-v7),
//! or of several groups (v8+, KIP-709). A partition with nothing committed
//! answers offset -1; a null topic list means every committed partition.
//! v9 carries a KIP-848 member id and epoch: a consumer-protocol group
//! answers UNKNOWN_MEMBER_ID / STALE_MEMBER_EPOCH for a stale one.
//! With `require_stable` (v7+, KIP-447) a partition a transaction holds a
//! pending offset for answers UNSTABLE_OFFSET_COMMIT (the consumer retries
//! until the transaction completes); without it, the committed offset.

use super::super::error::ApiError;
use super::super::error::NONE;
use super::super::{s, Reply};
use super::ask;
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::group::messages::{FetchOffsets, FetchedOffset, ValidateConsumerFetch};
use kaas_protocol::kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kaas_protocol::kafka_protocol::messages::{OffsetFetchRequest, OffsetFetchResponse, TopicName};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Ask each group's coordinator.
pub async fn handle(b: &Arc<Broker>, v: i16, r: OffsetFetchRequest) -> Reply<OffsetFetchResponse> {
    let b = b.clone();
    Reply::Later(async move { fetch(&b, v, r).await }.boxed())
}

type Fetched = Result<Vec<FetchedOffset>, i16>;

async fn one(b: &Broker, group: String, topics: Option<Vec<(String, Vec<i32>)>>) -> Fetched {
    ask(
        b,
        &group.clone(),
        FetchOffsets {
            group_id: group,
            topics,
        },
    )
    .await
    .map_err(|e| e.code())
}

/// Offsets grouped by topic, in request order where one was given.
fn by_topic(got: Vec<FetchedOffset>) -> BTreeMap<String, Vec<FetchedOffset>> {
    let mut m: BTreeMap<String, Vec<FetchedOffset>> = BTreeMap::new();
    for f in got {
        m.entry(f.topic.clone()).or_default().push(f);
    }
    m
}

/// UNSTABLE_OFFSET_COMMIT for a pending partition under `require_stable`.
fn stable_code(f: &FetchedOffset, require_stable: bool) -> i16 {
    if require_stable && f.pending {
        kaas_protocol::kafka_protocol::ResponseError::UnstableOffsetCommit.code()
    } else {
        NONE
    }
}

fn parts(v: &FetchedOffset, require_stable: bool) -> (i64, i32, Option<String>) {
    if require_stable && v.pending {
        return (-1, -1, Some(String::new()));
    }
    match &v.value {
        Some(o) => (o.offset, o.leader_epoch, o.metadata.clone()),
        None => (-1, -1, Some(String::new())),
    }
}

async fn fetch(b: &Broker, v: i16, r: OffsetFetchRequest) -> OffsetFetchResponse {
    let mut resp = OffsetFetchResponse::default();
    if v >= 8 {
        for g in &r.groups {
            let topics = g.topics.as_ref().map(|ts| {
                ts.iter()
                    .map(|t| (t.name.0.to_string(), t.partition_indexes.clone()))
                    .collect()
            });
            let mut rg = OffsetFetchResponseGroup::default();
            rg.group_id = g.group_id.clone();
            // v9 (KIP-848): a consumer-protocol member's epoch is checked.
            if v >= 9 && g.member_id.is_some() {
                let check = ValidateConsumerFetch {
                    group_id: g.group_id.0.to_string(),
                    member_id: g.member_id.as_ref().map(|m| m.to_string()),
                    member_epoch: g.member_epoch,
                };
                let code = match ask(b, &g.group_id.0.to_string(), check).await {
                    Ok(Ok(())) => NONE,
                    Ok(Err(e)) => ApiError::from(e).code(),
                    Err(e) => e.code(),
                };
                if code != NONE {
                    rg.error_code = code;
                    resp.groups.push(rg);
                    continue;
                }
            }
            match one(b, g.group_id.0.to_string(), topics).await {
                Ok(got) => {
                    rg.topics = by_topic(got)
                        .into_iter()
                        .map(|(name, ps)| {
                            let mut t = OffsetFetchResponseTopics::default();
                            t.name = TopicName(s(&name));
                            t.partitions = ps
                                .iter()
                                .map(|f| {
                                    let (o, e, m) = parts(f, r.require_stable);
                                    let mut p = OffsetFetchResponsePartitions::default();
                                    p.partition_index = f.partition;
                                    p.committed_offset = o;
                                    p.committed_leader_epoch = e;
                                    p.metadata = m.as_deref().map(s);
                                    p.error_code = stable_code(f, r.require_stable);
                                    p
                                })
                                .collect();
                            t
                        })
                        .collect();
                }
                Err(code) => rg.error_code = code,
            }
            resp.groups.push(rg);
        }
        return resp;
    }
    let topics = r.topics.as_ref().map(|ts| {
        ts.iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes.clone()))
            .collect::<Vec<_>>()
    });
    match one(b, r.group_id.0.to_string(), topics.clone()).await {
        Ok(got) => {
            resp.topics = by_topic(got)
                .into_iter()
                .map(|(name, ps)| {
                    let mut t = OffsetFetchResponseTopic::default();
                    t.name = TopicName(s(&name));
                    t.partitions = ps
                        .iter()
                        .map(|f| {
                            let stable = v >= 7 && r.require_stable;
                            let (o, e, m) = parts(f, stable);
                            let mut p = OffsetFetchResponsePartition::default();
                            p.partition_index = f.partition;
                            p.committed_offset = o;
                            p.committed_leader_epoch = if v >= 5 { e } else { -1 };
                            p.metadata = m.as_deref().map(s);
                            p.error_code = stable_code(f, stable);
                            p
                        })
                        .collect();
                    t
                })
                .collect();
        }
        Err(code) => {
            if v >= 2 {
                resp.error_code = code;
            }
            // Before v2 the error is per partition only.
            if let Some(ts) = topics {
                resp.topics = ts
                    .into_iter()
                    .map(|(name, ps)| {
                        let mut t = OffsetFetchResponseTopic::default();
                        t.name = TopicName(s(&name));
                        t.partitions = ps
                            .into_iter()
                            .map(|pi| {
                                let mut p = OffsetFetchResponsePartition::default();
                                p.partition_index = pi;
                                p.committed_offset = -1;
                                p.committed_leader_epoch = -1;
                                p.metadata = Some(s(""));
                                p.error_code = code;
                                p
                            })
                            .collect();
                        t
                    })
                    .collect();
            }
        }
    }
    resp
}
