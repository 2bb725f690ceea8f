//! Request handlers: one function per Kafka API, each turning a decoded
//! request into actor messages and reads, and the results into a response.
//!
//! Handlers run in two phases so pipelined requests keep their order: the
//! `dispatch` phase runs inline on the connection (it enqueues appends in
//! request order) and returns a future for the rest (waiting for fsync,
//! long-polling a fetch), which the connection resolves in order.

use crate::errors::{self, code};
use crate::state::{Broker, LookupError};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use kaas_actors::partition::leader::PartitionHandle;
use kaas_actors::partition::messages::{AppendBatches, AppendTicket, PartitionError};
use kaas_actors::partition::reader::PartitionReader;
use kaas_actors::topic::{CreateTopic, DeleteTopic, TopicStamp};
use kaas_protocol::batch::validate_batches;
use kaas_protocol::kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kaas_protocol::kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kaas_protocol::kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kaas_protocol::kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kaas_protocol::kafka_protocol::messages::fetch_response::{
    FetchableTopicResponse, PartitionData,
};
use kaas_protocol::kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kaas_protocol::kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kaas_protocol::kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kaas_protocol::kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, TopicProduceResponse,
};
use kaas_protocol::kafka_protocol::messages::*;
use kaas_protocol::kafka_protocol::protocol::StrBytes;
use kaas_protocol::RequestHeader;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// What dispatch produced: a response to await, or none (acks=0 produce).
pub type Pending = Option<BoxFuture<'static, ResponseKind>>;

fn s(x: &str) -> StrBytes {
    StrBytes::from_string(x.to_owned())
}

fn ready(r: ResponseKind) -> Pending {
    Some(futures::future::ready(r).boxed())
}

/// Route one request.
pub async fn dispatch(b: &Arc<Broker>, h: &RequestHeader, body: RequestKind) -> Pending {
    let v = h.api_version;
    match body {
        RequestKind::ApiVersions(_) => ready(ResponseKind::ApiVersions(
            kaas_protocol::api_versions_response(v),
        )),
        RequestKind::Metadata(r) => ready(ResponseKind::Metadata(metadata(b, r, v).await)),
        RequestKind::Produce(r) => produce(b, r, v).await,
        RequestKind::Fetch(r) => {
            let b = b.clone();
            Some(async move { ResponseKind::Fetch(fetch(&b, r, v).await) }.boxed())
        }
        RequestKind::ListOffsets(r) => {
            ready(ResponseKind::ListOffsets(list_offsets(b, r, v).await))
        }
        RequestKind::CreateTopics(r) => {
            ready(ResponseKind::CreateTopics(create_topics(b, r, v).await))
        }
        RequestKind::DeleteTopics(r) => {
            ready(ResponseKind::DeleteTopics(delete_topics(b, r, v).await))
        }
        RequestKind::DescribeConfigs(r) => {
            ready(ResponseKind::DescribeConfigs(describe_configs(b, r)))
        }
        RequestKind::DescribeCluster(_) => {
            ready(ResponseKind::DescribeCluster(describe_cluster(b)))
        }
        RequestKind::InitProducerId(r) => {
            // Claiming a block is an O_EXCL create + fsync: the
            // ProducerIdBlocks actor does it on its own thread.
            let b = b.clone();
            Some(async move { ResponseKind::InitProducerId(init_producer_id(&b, r).await) }.boxed())
        }
        RequestKind::OffsetForLeaderEpoch(r) => ready(ResponseKind::OffsetForLeaderEpoch(
            offset_for_leader_epoch(b, r).await,
        )),
        // parse_request refuses every API not in versions::SUPPORTED.
        _ => None,
    }
}

/// The handle of a partition and its reader, waiting (bounded) for a leader
/// that is still opening its files.
async fn reader_of(
    b: &Broker,
    topic: &str,
    p: i32,
) -> Result<(PartitionHandle, PartitionReader), i16> {
    let h = b.partition(topic, p).map_err(lookup_code)?.handle;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut hw = h.hw.clone();
    loop {
        if let Some(r) = h.reader.read().unwrap().clone() {
            return Ok((h.clone(), r));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || tokio::time::timeout(left, hw.changed()).await.is_err() {
            return Err(code::NOT_LEADER_OR_FOLLOWER);
        }
    }
}

fn lookup_code(e: LookupError) -> i16 {
    match e {
        LookupError::Unknown => code::UNKNOWN_TOPIC_OR_PARTITION,
        LookupError::NotLeader => code::NOT_LEADER_OR_FOLLOWER,
    }
}

/// KIP-320: compare the client's view of the leader epoch with the one the
/// assignment granted.
fn check_epoch(b: &Broker, topic: &str, p: i32, current: i32) -> i16 {
    let Some(e) = b.entry(topic, p) else {
        return code::NONE; // the lookup that follows reports it unknown
    };
    if current < 0 || current == e.epoch {
        code::NONE
    } else if current < e.epoch {
        code::FENCED_LEADER_EPOCH
    } else {
        code::UNKNOWN_LEADER_EPOCH
    }
}

async fn auto_create(b: &Broker, name: &str) -> Option<TopicStamp> {
    let r = b
        .catalog
        .send(CreateTopic {
            name: name.to_owned(),
            partitions: b.args.default_partitions,
            configs: BTreeMap::new(),
            validate_only: false,
        })
        .await;
    match r {
        Ok(Ok(t)) => {
            tracing::info!(topic = %name, partitions = t.partitions, "auto-created topic");
            await_topic_ready(b, name, t.topic_id, Duration::from_secs(5)).await;
            b.topic(name)
        }
        // Created meanwhile by another broker: wait for the assignment.
        _ => known_soon(b, name).await,
    }
}

/// A topic this broker's assignment does not list yet may exist on the
/// volume already (just created through another broker; assignments reach
/// each broker by polling). If its directory exists, wait (bounded) for the
/// assignment to catch up rather than answer "unknown topic" for a topic
/// that exists. The directory check is file I/O: off this thread.
async fn known_soon(b: &Broker, name: &str) -> Option<TopicStamp> {
    if let Some(t) = b.topic(name) {
        return Some(t);
    }
    if kaas_actors::topic::validate_name(name).is_err() {
        return None;
    }
    let fs = b.fs.clone();
    let dir = b.args.data_dir.join(name);
    let exists = tokio::task::spawn_blocking(move || fs.is_dir(&dir))
        .await
        .unwrap_or(false);
    if !exists {
        return None;
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if let Some(t) = b.topic(name) {
            return Some(t);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

async fn metadata(b: &Arc<Broker>, r: MetadataRequest, v: i16) -> MetadataResponse {
    let mut resp = MetadataResponse::default();
    let (brokers, controller) = live_brokers(b);
    resp.brokers = brokers
        .into_iter()
        .map(|(id, host, port)| {
            let mut x = MetadataResponseBroker::default();
            x.node_id = BrokerId(id);
            x.host = s(&host);
            x.port = port;
            x
        })
        .collect();
    resp.cluster_id = Some(s(&b.cluster_id));
    resp.controller_id = BrokerId(controller);
    let all = match &r.topics {
        None => true,
        Some(t) => t.is_empty() && v == 0,
    };
    let mut wanted: Vec<(Option<String>, Uuid)> = Vec::new();
    if all {
        for t in b.topics.read().unwrap().values() {
            wanted.push((Some(t.name.clone()), t.topic_id));
        }
    } else {
        for t in r.topics.iter().flatten() {
            wanted.push((t.name.as_ref().map(|n| n.0.to_string()), t.topic_id));
        }
    }
    let allow_create = b.args.auto_create_topics && (v < 4 || r.allow_auto_topic_creation);
    for (name, id) in wanted {
        let mut mt = MetadataResponseTopic::default();
        let stamp = match &name {
            Some(n) => match b.topic(n) {
                Some(t) => Some(t),
                None if allow_create && kaas_actors::topic::validate_name(n).is_ok() => {
                    auto_create(b, n).await
                }
                None => known_soon(b, n).await,
            },
            None => b.topic_by_id(&id),
        };
        mt.name = name.clone().map(|n| TopicName(s(&n)));
        mt.topic_id = id;
        match stamp {
            None => {
                mt.error_code = match &name {
                    Some(n) if kaas_actors::topic::validate_name(n).is_err() => {
                        code::INVALID_TOPIC_EXCEPTION
                    }
                    Some(_) => code::UNKNOWN_TOPIC_OR_PARTITION,
                    None => code::UNKNOWN_TOPIC_ID,
                };
            }
            Some(t) => {
                mt.name = Some(TopicName(s(&t.name)));
                mt.topic_id = t.topic_id;
                let a = b.assignment();
                let entries = a
                    .topics
                    .get(&t.name)
                    .filter(|x| x.topic_id == t.topic_id)
                    .map(|x| x.partitions.as_slice())
                    .unwrap_or(&[]);
                // A broker whose lease lapsed does not name itself leader
                // (clients re-query instead of looping on NOT_LEADER).
                let self_ok = b.shared.lease.valid();
                let advertised = |id: i32| {
                    a.brokers.iter().any(|x| x.id == id) && (id != b.args.broker_id || self_ok)
                };
                mt.partitions = (0..t.partitions)
                    .map(|p| {
                        let mut mp = MetadataResponsePartition::default();
                        mp.partition_index = p;
                        match entries.get(p as usize) {
                            Some(e) if e.leader >= 0 && advertised(e.leader) => {
                                mp.leader_id = BrokerId(e.leader);
                                mp.leader_epoch = e.epoch;
                                mp.replica_nodes = vec![BrokerId(e.leader)];
                                mp.isr_nodes = vec![BrokerId(e.leader)];
                            }
                            // Vacant (moving, no live broker) or led by a
                            // silent broker: retriable, and clients re-query
                            // quickly while a partition has no leader.
                            e => {
                                mp.error_code = code::LEADER_NOT_AVAILABLE;
                                mp.leader_id = BrokerId(-1);
                                mp.leader_epoch = e.map(|e| e.epoch).unwrap_or(-1);
                            }
                        }
                        mp
                    })
                    .collect();
            }
        }
        // No ACLs: every topic operation is allowed. Report the bit set
        // only when asked (KIP-430); i32::MIN means "not requested".
        mt.topic_authorized_operations = if r.include_topic_authorized_operations {
            TOPIC_OPS
        } else {
            i32::MIN
        };
        resp.topics.push(mt);
    }
    resp.cluster_authorized_operations = if r.include_cluster_authorized_operations {
        CLUSTER_OPS
    } else {
        i32::MIN
    };
    resp
}

/// READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS.
const TOPIC_OPS: i32 =
    (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 10) | (1 << 11);
/// CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE.
const CLUSTER_OPS: i32 =
    (1 << 5) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12);

fn part_resp(idx: i32, err: i16) -> PartitionProduceResponse {
    let mut p = PartitionProduceResponse::default();
    p.index = idx;
    p.error_code = err;
    p.base_offset = -1;
    p.log_append_time_ms = -1;
    p.log_start_offset = -1;
    p
}

enum Slot {
    Done(PartitionProduceResponse),
    Waiting(i32, AppendTicket),
}

async fn produce(b: &Arc<Broker>, r: ProduceRequest, v: i16) -> Pending {
    let acks = r.acks;
    let refuse_all = if !(-1..=1).contains(&acks) {
        Some(code::INVALID_REQUIRED_ACKS)
    } else if r.transactional_id.is_some() {
        // Transactions are not implemented: refuse, never fake them.
        Some(code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    } else {
        None
    };
    let mut topics: Vec<(TopicProduceResponse, Vec<Slot>)> = Vec::new();
    for td in r.topic_data {
        let mut tr = TopicProduceResponse::default();
        tr.name = td.name.clone();
        tr.topic_id = td.topic_id;
        let name = if v >= 13 {
            b.topic_by_id(&td.topic_id).map(|t| t.name)
        } else {
            Some(td.name.0.to_string())
        };
        let mut slots = Vec::new();
        for pd in td.partition_data {
            let fail = |c| Slot::Done(part_resp(pd.index, c));
            if let Some(c) = refuse_all {
                slots.push(fail(c));
                continue;
            }
            let Some(name) = name.as_deref() else {
                slots.push(fail(code::UNKNOWN_TOPIC_ID));
                continue;
            };
            let h = match b.partition(name, pd.index) {
                Ok(l) => l.handle,
                Err(e) => {
                    slots.push(fail(lookup_code(e)));
                    continue;
                }
            };
            let records = pd.records.unwrap_or_default();
            let infos = match validate_batches(&records) {
                Ok(i) => i,
                Err(e) => {
                    tracing::warn!(topic = %name, partition = pd.index, error = %e, "rejected produce batch");
                    slots.push(fail(e.kafka_error_code()));
                    continue;
                }
            };
            if infos.iter().any(|i| i.is_transactional() || i.is_control()) {
                slots.push(fail(code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED));
                continue;
            }
            let sent = h
                .addr
                .send(AppendBatches {
                    records,
                    infos,
                    wait_durable: acks != 0,
                    sent_at: Instant::now(),
                })
                .await;
            match sent {
                Ok(Ok(t)) => slots.push(Slot::Waiting(pd.index, t)),
                Ok(Err(e)) => slots.push(fail(errors::partition(&e))),
                Err(_) => slots.push(fail(code::NOT_LEADER_OR_FOLLOWER)),
            }
        }
        topics.push((tr, slots));
    }
    if acks == 0 {
        return None;
    }
    let timeout = Duration::from_millis(r.timeout_ms.max(0) as u64);
    Some(
        async move {
            let deadline = Instant::now() + timeout;
            let mut resp = ProduceResponse::default();
            for (mut tr, slots) in topics {
                for slot in slots {
                    let pr = match slot {
                        Slot::Done(p) => p,
                        Slot::Waiting(idx, t) => {
                            let mut p = part_resp(idx, code::NONE);
                            p.base_offset = t.base_offset;
                            p.log_start_offset = t.log_start_offset;
                            if let Some(rx) = t.durable {
                                let left = deadline.saturating_duration_since(Instant::now());
                                match tokio::time::timeout(left.max(Duration::from_millis(1)), rx)
                                    .await
                                {
                                    Ok(Ok(Ok(_))) => {}
                                    Ok(Ok(Err(e))) => p = part_resp(idx, errors::partition(&e)),
                                    Ok(Err(_)) => {
                                        p = part_resp(
                                            idx,
                                            errors::partition(&PartitionError::Storage(
                                                "leader restarted".into(),
                                            )),
                                        )
                                    }
                                    Err(_) => p = part_resp(idx, code::REQUEST_TIMED_OUT),
                                }
                            }
                            p
                        }
                    };
                    let mut pr = pr;
                    if v < 5 {
                        pr.log_start_offset = -1;
                    }
                    tr.partition_responses.push(pr);
                }
                resp.responses.push(tr);
            }
            ResponseKind::Produce(resp)
        }
        .boxed(),
    )
}

/// Broker-side cap on one fetch response (Kafka's fetch.max.bytes default
/// is 55 MiB): a client asking for i32::MAX must not make us read a segment.
const FETCH_MAX_BYTES: usize = 64 << 20;

struct FetchItem {
    topic_idx: usize,
    partition: i32,
    offset: i64,
    max: usize,
    target: Result<(PartitionHandle, PartitionReader), i16>,
}

async fn fetch(b: &Arc<Broker>, r: FetchRequest, v: i16) -> FetchResponse {
    let mut resp = FetchResponse::default();
    let mut items = Vec::new();
    for (ti, ft) in r.topics.iter().enumerate() {
        let mut tr = FetchableTopicResponse::default();
        tr.topic = ft.topic.clone();
        tr.topic_id = ft.topic_id;
        let name = if v >= 13 {
            b.topic_by_id(&ft.topic_id).map(|t| t.name)
        } else {
            Some(ft.topic.0.to_string())
        };
        for fp in &ft.partitions {
            let target = match &name {
                None => Err(code::UNKNOWN_TOPIC_ID),
                Some(n) => match check_epoch(b, n, fp.partition, fp.current_leader_epoch) {
                    code::NONE => reader_of(b, n, fp.partition).await,
                    c => Err(c),
                },
            };
            items.push(FetchItem {
                topic_idx: ti,
                partition: fp.partition,
                offset: fp.fetch_offset,
                max: fp.partition_max_bytes.max(0) as usize,
                target,
            });
        }
        resp.responses.push(tr);
    }
    let max_total = if r.max_bytes > 0 {
        (r.max_bytes as usize).min(FETCH_MAX_BYTES)
    } else {
        FETCH_MAX_BYTES
    };
    let deadline = Instant::now() + Duration::from_millis(r.max_wait_ms.max(0) as u64);
    let items = Arc::new(items);
    loop {
        let work = items.clone();
        let read = tokio::task::spawn_blocking(move || read_items(&work, max_total, v)).await;
        // Serve nothing read by a broker whose lease lapsed meanwhile (a
        // long poll spans many reads): another broker may lead by now, and
        // bytes past its seal must never reach a client.
        let lapsed = !b.shared.lease.valid();
        let parts = match read {
            Ok(p) if !lapsed => p,
            Ok(_) => items
                .iter()
                .map(|i| {
                    let mut p = PartitionData::default();
                    p.partition_index = i.partition;
                    p.error_code = code::NOT_LEADER_OR_FOLLOWER;
                    (i.topic_idx, p)
                })
                .collect(),
            Err(_) => items
                .iter()
                .map(|i| {
                    let mut p = PartitionData::default();
                    p.partition_index = i.partition;
                    p.error_code = code::KAFKA_STORAGE_ERROR;
                    (i.topic_idx, p)
                })
                .collect(),
        };
        let any_error = parts.iter().any(|(_, p)| p.error_code != code::NONE);
        let total: usize = parts
            .iter()
            .map(|(_, p)| p.records.as_ref().map(|x| x.len()).unwrap_or(0))
            .sum();
        let now = Instant::now();
        if total >= r.min_bytes.max(0) as usize || now >= deadline || parts.is_empty() || any_error
        {
            for (ti, p) in parts {
                resp.responses[ti].partitions.push(p);
            }
            let fetched = total as u64;
            kaas_actors::telemetry::global()
                .fetch_bytes
                .fetch_add(fetched, std::sync::atomic::Ordering::Relaxed);
            return resp;
        }
        // Long poll: wait for any partition's high watermark to move.
        let mut watches: Vec<_> = items
            .iter()
            .filter_map(|i| i.target.as_ref().ok().map(|(h, _)| h.hw.clone()))
            .collect();
        for w in watches.iter_mut() {
            w.borrow_and_update();
        }
        let any = futures::future::select_all(
            watches
                .into_iter()
                .map(|mut w| async move { w.changed().await }.boxed()),
        );
        let _ = tokio::time::timeout(deadline - now, any).await;
    }
}

fn read_items(items: &[FetchItem], max_total: usize, version: i16) -> Vec<(usize, PartitionData)> {
    let mut out = Vec::with_capacity(items.len());
    let mut budget = max_total;
    for it in items {
        let mut p = PartitionData::default();
        p.partition_index = it.partition;
        p.high_watermark = -1;
        p.last_stable_offset = -1;
        p.log_start_offset = -1;
        p.preferred_read_replica = BrokerId(-1);
        p.aborted_transactions = Some(Vec::new());
        match &it.target {
            Err(c) => p.error_code = *c,
            Ok(_) if budget == 0 => {
                // Budget spent: only the first partition with data may
                // overshoot (KIP-74). Report offsets, no records.
                if let Ok((_, reader)) = &it.target {
                    let (start, hw, _) = reader.offsets();
                    p.high_watermark = hw;
                    p.last_stable_offset = hw;
                    p.log_start_offset = start;
                }
                p.records = Some(Bytes::new());
            }
            Ok((_, reader)) => {
                // The first partition with data may exceed the request's
                // max_bytes by one batch (KIP-74); later ones fit the budget.
                let want = it.max.min(budget).min(FETCH_MAX_BYTES);
                match reader.read(it.offset, want) {
                    Ok(res) => {
                        p.high_watermark = res.high_watermark;
                        p.last_stable_offset = res.high_watermark;
                        p.log_start_offset = res.log_start_offset;
                        budget = budget.saturating_sub(res.records.len());
                        p.records = Some(res.records);
                    }
                    Err(e) => {
                        let (start, hw, _) = reader.offsets();
                        p.error_code = errors::read(&e);
                        p.high_watermark = hw;
                        p.last_stable_offset = hw;
                        p.log_start_offset = start;
                        p.records = Some(Bytes::new());
                    }
                }
            }
        }
        if version < 5 {
            p.log_start_offset = -1;
        }
        out.push((it.topic_idx, p));
    }
    out
}

async fn list_offsets(b: &Arc<Broker>, r: ListOffsetsRequest, v: i16) -> ListOffsetsResponse {
    let mut resp = ListOffsetsResponse::default();
    for t in r.topics {
        let mut tr = ListOffsetsTopicResponse::default();
        tr.name = t.name.clone();
        let name = t.name.0.to_string();
        for p in t.partitions {
            let mut pr = ListOffsetsPartitionResponse::default();
            pr.partition_index = p.partition_index;
            pr.timestamp = -1;
            pr.offset = -1;
            pr.leader_epoch = -1;
            let ec = check_epoch(b, &name, p.partition_index, p.current_leader_epoch);
            if ec != code::NONE {
                pr.error_code = ec;
                tr.partitions.push(pr);
                continue;
            }
            match reader_of(b, &name, p.partition_index).await {
                Err(c) => pr.error_code = c,
                Ok((_, reader)) => {
                    let (start, hw, epoch) = reader.offsets();
                    let ts = p.timestamp;
                    let res = tokio::task::spawn_blocking(move || match ts {
                        -1 => Ok(Some((hw, -1, epoch))),
                        -2 | -4 => Ok(Some((start, -1, epoch))),
                        -3 => reader
                            .max_timestamp()
                            .map(|h| h.map(|h| (h.offset, h.timestamp, h.leader_epoch))),
                        t if t >= 0 => reader
                            .offset_for_timestamp(t)
                            .map(|h| h.map(|h| (h.offset, h.timestamp, h.leader_epoch))),
                        _ => Ok(None),
                    })
                    .await;
                    match res {
                        Ok(Ok(Some((o, t, e)))) => {
                            pr.offset = o;
                            pr.timestamp = t;
                            if v >= 4 {
                                pr.leader_epoch = e;
                            }
                        }
                        Ok(Ok(None)) if ts < -4 => pr.error_code = code::UNSUPPORTED_VERSION,
                        Ok(Ok(None)) => {}
                        Ok(Err(e)) => pr.error_code = errors::read(&e),
                        Err(_) => pr.error_code = code::KAFKA_STORAGE_ERROR,
                    }
                }
            }
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    resp
}

async fn create_topics(b: &Arc<Broker>, r: CreateTopicsRequest, v: i16) -> CreateTopicsResponse {
    let mut resp = CreateTopicsResponse::default();
    for t in r.topics {
        let name = t.name.0.to_string();
        let mut tr = CreatableTopicResult::default();
        tr.name = t.name.clone();
        tr.num_partitions = -1;
        tr.replication_factor = -1;
        let partitions = if t.num_partitions == -1 {
            b.args.default_partitions
        } else {
            t.num_partitions
        };
        if !t.assignments.is_empty() {
            tr.error_code = code::INVALID_REQUEST;
            tr.error_message = Some(s("manual replica assignment is not supported"));
        } else if !matches!(t.replication_factor, -1 | 1) {
            tr.error_code = code::INVALID_REPLICATION_FACTOR;
            tr.error_message = Some(s(
                "kaas keeps one copy on the shared volume: use replication factor 1 or -1",
            ));
        } else {
            let configs: BTreeMap<String, String> = t
                .configs
                .iter()
                .filter_map(|c| Some((c.name.to_string(), c.value.as_ref()?.to_string())))
                .collect();
            let res = b
                .catalog
                .send(CreateTopic {
                    name: name.clone(),
                    partitions,
                    configs,
                    validate_only: r.validate_only,
                })
                .await;
            match res {
                Ok(Ok(stamp)) => {
                    if !r.validate_only {
                        let wait = Duration::from_millis(r.timeout_ms.clamp(0, 30_000) as u64);
                        if !await_topic_ready(b, &name, stamp.topic_id, wait).await {
                            tracing::warn!(topic = %name, "created; leaders not yet assigned");
                        }
                    }
                    tr.topic_id = if r.validate_only {
                        Uuid::nil()
                    } else {
                        stamp.topic_id
                    };
                    tr.num_partitions = stamp.partitions;
                    tr.replication_factor = 1;
                    tr.configs = Some(
                        topic_configs(b, &stamp)
                            .into_iter()
                            .map(|(k, v, _)| {
                                let mut c = CreatableTopicConfigs::default();
                                c.name = s(&k);
                                c.value = Some(s(&v));
                                c.config_source = 5;
                                c
                            })
                            .collect(),
                    );
                }
                Ok(Err(e)) => {
                    tr.error_code = errors::topic(&e);
                    tr.error_message = Some(s(&e.to_string()));
                }
                Err(_) => tr.error_code = code::KAFKA_STORAGE_ERROR,
            }
        }
        if v < 5 {
            tr.num_partitions = -1;
            tr.replication_factor = -1;
            tr.configs = None;
            tr.topic_config_error_code = 0;
        }
        if v < 7 {
            tr.topic_id = Uuid::nil();
        }
        if v < 1 {
            tr.error_message = None;
        }
        resp.topics.push(tr);
    }
    resp
}

async fn delete_topics(b: &Arc<Broker>, r: DeleteTopicsRequest, v: i16) -> DeleteTopicsResponse {
    let mut resp = DeleteTopicsResponse::default();
    let mut targets: Vec<(Option<String>, Uuid)> = r
        .topic_names
        .iter()
        .map(|n| (Some(n.0.to_string()), Uuid::nil()))
        .collect();
    for t in &r.topics {
        targets.push((t.name.as_ref().map(|n| n.0.to_string()), t.topic_id));
    }
    for (name, id) in targets {
        let mut tr = DeletableTopicResult::default();
        tr.name = name.clone().map(|n| TopicName(s(&n)));
        tr.topic_id = id;
        let name = match name {
            Some(n) => Some(n),
            None => b.topic_by_id(&id).map(|t| t.name),
        };
        match name {
            None => tr.error_code = code::UNKNOWN_TOPIC_ID,
            Some(n) => {
                tr.name = Some(TopicName(s(&n)));
                // No leader may (re)start for the topic while it goes away:
                // one that did would write into a renamed-aside directory.
                b.set_deleting(&n, true);
                if b.topic(&n).is_some() {
                    b.stop_leaders(Some(&n)).await;
                }
                let res = b.catalog.send(DeleteTopic { name: n.clone() }).await;
                b.set_deleting(&n, false);
                match res {
                    Ok(Ok(stamp)) => tr.topic_id = stamp.topic_id,
                    Ok(Err(e)) => {
                        tr.error_code = errors::topic(&e);
                        tr.error_message = Some(s(&e.to_string()));
                    }
                    Err(_) => tr.error_code = code::KAFKA_STORAGE_ERROR,
                }
            }
        }
        if v < 6 {
            tr.topic_id = Uuid::nil();
        }
        if v < 5 {
            tr.error_message = None;
        }
        resp.responses.push(tr);
    }
    resp
}

/// (name, value, is_default) for every topic config kaas implements.
fn topic_configs(b: &Broker, t: &TopicStamp) -> Vec<(String, String, bool)> {
    let cfg = b.log_config(t);
    let mut out = vec![
        ("cleanup.policy".to_string(), "delete".to_string()),
        ("segment.bytes".into(), cfg.segment_bytes.to_string()),
        ("segment.ms".into(), cfg.segment_ms.to_string()),
        ("retention.ms".into(), cfg.retention_ms.to_string()),
        ("retention.bytes".into(), cfg.retention_bytes.to_string()),
        ("message.timestamp.type".into(), "CreateTime".into()),
        (
            "max.message.bytes".into(),
            b.args.max_request_bytes.to_string(),
        ),
    ];
    for (k, v) in &t.configs {
        if !out.iter().any(|(n, _)| n == k) {
            out.push((k.clone(), v.clone()));
        }
    }
    out.into_iter()
        .map(|(k, v)| {
            let explicit = t.configs.contains_key(&k);
            (k, v, !explicit)
        })
        .collect()
}

fn describe_configs(b: &Arc<Broker>, r: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let mut resp = DescribeConfigsResponse::default();
    for res in r.resources {
        let mut rr = DescribeConfigsResult::default();
        rr.resource_type = res.resource_type;
        rr.resource_name = res.resource_name.clone();
        let entries: Option<Vec<(String, String, bool)>> = match res.resource_type {
            2 => b.topic(&res.resource_name).map(|t| topic_configs(b, &t)),
            4 => Some(vec![
                (
                    "log.dirs".into(),
                    b.args.data_dir.display().to_string(),
                    false,
                ),
                (
                    "auto.create.topics.enable".into(),
                    b.args.auto_create_topics.to_string(),
                    false,
                ),
                (
                    "num.partitions".into(),
                    b.args.default_partitions.to_string(),
                    false,
                ),
                (
                    "socket.request.max.bytes".into(),
                    b.args.max_request_bytes.to_string(),
                    false,
                ),
            ]),
            _ => None,
        };
        match entries {
            None if res.resource_type == 2 => {
                rr.error_code = code::UNKNOWN_TOPIC_OR_PARTITION;
            }
            None => {
                rr.error_code = code::INVALID_REQUEST;
                rr.error_message = Some(s("unsupported resource type"));
            }
            Some(list) => {
                for (k, v, dflt) in list {
                    if let Some(keys) = &res.configuration_keys {
                        if !keys.iter().any(|x| x.as_str() == k) {
                            continue;
                        }
                    }
                    let mut c = DescribeConfigsResourceResult::default();
                    c.name = s(&k);
                    c.value = Some(s(&v));
                    c.read_only = res.resource_type == 4;
                    // 1 = DYNAMIC_TOPIC_CONFIG, 5 = DEFAULT_CONFIG, 4 = STATIC_BROKER_CONFIG
                    c.config_source = match (res.resource_type, dflt) {
                        (4, _) => 4,
                        (_, true) => 5,
                        (_, false) => 1,
                    };
                    rr.configs.push(c);
                }
            }
        }
        resp.results.push(rr);
    }
    resp
}

/// Brokers to advertise (the assignment's live brokers; before the first
/// assignment, just this one) and the controller id.
fn live_brokers(b: &Broker) -> (Vec<(i32, String, i32)>, i32) {
    let a = b.assignment();
    let mut v: Vec<(i32, String, i32)> = a
        .brokers
        .iter()
        .map(|x| (x.id, x.host.clone(), x.port))
        .collect();
    if !v.iter().any(|x| x.0 == b.args.broker_id) {
        let (host, port) = b.args.advertised();
        v.push((b.args.broker_id, host, port));
    }
    let controller = if a.version == 0 { -1 } else { a.controller_id };
    (v, controller)
}

/// After a create: the controller picks the topic up from the volume; wait
/// (bounded) until this broker's metadata shows it with every partition
/// led, so a client's next request finds a leader.
async fn await_topic_ready(b: &Broker, name: &str, id: Uuid, timeout: Duration) -> bool {
    if let Some(c) = b.controller.get() {
        c.do_send(kaas_actors::cluster::controller::Poke);
    }
    let deadline = Instant::now() + timeout;
    loop {
        let a = b.assignment();
        if let Some(t) = a.topics.get(name) {
            if t.topic_id == id && t.partitions.iter().all(|e| e.leader >= 0) {
                return true;
            }
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn describe_cluster(b: &Arc<Broker>) -> DescribeClusterResponse {
    let mut resp = DescribeClusterResponse::default();
    let (brokers, controller) = live_brokers(b);
    resp.cluster_id = s(&b.cluster_id);
    resp.controller_id = BrokerId(controller);
    resp.brokers = brokers
        .into_iter()
        .map(|(id, host, port)| {
            let mut br = DescribeClusterBroker::default();
            br.broker_id = BrokerId(id);
            br.host = s(&host);
            br.port = port;
            br
        })
        .collect();
    resp.endpoint_type = 1;
    resp.cluster_authorized_operations = i32::MIN;
    resp
}

async fn init_producer_id(b: &Arc<Broker>, r: InitProducerIdRequest) -> InitProducerIdResponse {
    let mut resp = InitProducerIdResponse::default();
    resp.producer_id = ProducerId(-1);
    resp.producer_epoch = -1;
    resp.ongoing_txn_producer_id = ProducerId(-1);
    resp.ongoing_txn_producer_epoch = -1;
    if r.transactional_id.is_some() {
        // Transactions are a later issue: refuse with a fatal code rather
        // than hand out an id we cannot fence.
        resp.error_code = code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
        return resp;
    }
    match b
        .pids
        .send(kaas_actors::producer_id_blocks::AllocateProducerId)
        .await
    {
        Ok(Ok(id)) => {
            resp.producer_id = ProducerId(id);
            resp.producer_epoch = 0;
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "producer-id block claim failed");
            resp.error_code = code::KAFKA_STORAGE_ERROR;
        }
        Err(e) => {
            tracing::error!(error = %e, "producer-id owner unavailable");
            resp.error_code = code::KAFKA_STORAGE_ERROR;
        }
    }
    resp
}

async fn offset_for_leader_epoch(
    b: &Arc<Broker>,
    r: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let mut resp = OffsetForLeaderEpochResponse::default();
    for t in r.topics {
        let mut tr = OffsetForLeaderTopicResult::default();
        tr.topic = t.topic.clone();
        for p in t.partitions {
            let mut er = EpochEndOffset::default();
            er.partition = p.partition;
            er.leader_epoch = -1;
            er.end_offset = -1;
            let ec = check_epoch(b, &t.topic.0, p.partition, p.current_leader_epoch);
            if ec != code::NONE {
                er.error_code = ec;
            } else {
                match reader_of(b, &t.topic.0, p.partition).await {
                    Err(c) => er.error_code = c,
                    Ok((_, reader)) => {
                        let (e, o) = reader.end_offset_for_epoch(p.leader_epoch);
                        er.leader_epoch = e;
                        er.end_offset = o;
                    }
                }
            }
            tr.partitions.push(er);
        }
        resp.topics.push(tr);
    }
    resp
}
