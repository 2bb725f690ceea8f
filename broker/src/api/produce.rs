//! Produce (key 0): validate each partition's batches, enqueue them on the
//! partition leader in request order (dispatch phase), then wait for the
//! fsync that covers them (completion phase). acks=0 gets no response.
//!
//! A topic whose compression.type is not `producer` gets every batch in
//! its codec: a batch sent with another one is rebuilt here, in the
//! dispatch phase (see [`recompress`]), before the leader sees it.
//!
//! Version rules handled here: topics by id from v13; zstd batches only
//! from v7 (KIP-110: older requests get UNSUPPORTED_COMPRESSION_TYPE for
//! that partition, as Kafka answers); `log_start_offset` from v5.
//!
//! Transactional batches (KIP-98) are accepted from a producer with an id
//! in a request naming its transactional id (else
//! TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka): the partition's
//! producer state opens its transaction at the first one and the last
//! stable offset stays there until the coordinator's marker
//! (WriteTxnMarkers). KIP-890 part 1: when a batch would open a
//! transaction at the partition, the leader answers `TxnUnverified`, this
//! handler asks the coordinator whether the partition is in the
//! transaction (`txn::verify`) and appends again with the leader's
//! token; not in it is INVALID_TXN_STATE and nothing is written. The
//! verification runs in the dispatch phase, so the appends of one
//! connection stay in request order.

use super::error::{ApiError, NONE};
use super::{locate, Reply, TopicRef};
use crate::state::{Broker, ProduceLimits};
use futures::FutureExt;
use kaas_actors::partition::leader::HandedOver;
use kaas_actors::partition::messages::{AppendBatches, AppendTicket, PartitionError, Placed};
use kaas_protocol::batch::{recompress_batches, validate_batches, Codec, MAX_DECOMPRESSED_BATCH};
use kaas_protocol::kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, TopicProduceResponse,
};
use kaas_protocol::kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kaas_protocol::kafka_protocol::records::Compression;
use kaas_protocol::kafka_protocol::ResponseError;
use kaas_protocol::{BatchInfo, PRODUCE_MIN_VERSION_ZSTD};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One partition's answer: known at dispatch, or waiting for durability.
enum Slot {
    Done(PartitionProduceResponse),
    /// Accepted: the ticket, and the leader's depth count of the work it
    /// still owes (until the fsync answers; see `telemetry::Owed`).
    /// The last field is the LogAppendTime stamped (-1: CreateTime).
    Waiting(i32, AppendTicket, kaas_actors::telemetry::Owed, i64),
    /// Handed over to the leader's writer loop (no answer at append time):
    /// where it landed comes with its durability. Same fields otherwise.
    Handed(i32, HandedOver, i64),
}

fn part_resp(idx: i32, err: i16) -> PartitionProduceResponse {
    let mut p = PartitionProduceResponse::default();
    p.index = idx;
    p.error_code = err;
    p.base_offset = -1;
    p.log_append_time_ms = -1;
    p.log_start_offset = -1;
    p
}

/// Blank what version `v` does not carry.
fn for_version(p: &mut PartitionProduceResponse, v: i16) {
    if v < 5 {
        p.log_start_offset = -1;
    }
}

/// Request-wide refusals: a bad acks value.
fn refuse_all(r: &ProduceRequest) -> Option<ApiError> {
    if !(-1..=1).contains(&r.acks) {
        Some(ResponseError::InvalidRequiredAcks.into())
    } else {
        None
    }
}

/// What the batches of one partition may not carry at version `v`.
fn check_batches(infos: &[BatchInfo], v: i16) -> Result<(), ApiError> {
    if v < PRODUCE_MIN_VERSION_ZSTD && infos.iter().any(|i| i.compression() == Compression::Zstd) {
        return Err(ResponseError::UnsupportedCompressionType.into());
    }
    // Control batches are the leader's alone (validation refuses them
    // first; kept here so the rule does not depend on it). A transactional
    // batch needs a producer id: its transaction is tracked per producer.
    if infos.iter().any(|i| i.is_control()) {
        return Err(ResponseError::TransactionalIdAuthorizationFailed.into());
    }
    if infos
        .iter()
        .any(|i| i.is_transactional() && !i.has_producer_id())
    {
        return Err(ResponseError::InvalidRecord.into());
    }
    Ok(())
}

/// What the topic's configs refuse (checked per batch, as Kafka's log
/// validator does): a batch larger than max.message.bytes
/// (MESSAGE_TOO_LARGE), a CreateTime timestamp further in the past than
/// message.timestamp.before.max.ms or further in the future than
/// message.timestamp.after.max.ms (INVALID_TIMESTAMP). Timestamps checked
/// are the batch's first and max ones: records in between are not decoded
/// (compressed batches stay as sent). With LogAppendTime the producer's
/// timestamps are replaced, so they are not judged (as in Kafka).
fn check_limits(infos: &[BatchInfo], l: &ProduceLimits, now_ms: i64) -> Result<(), ApiError> {
    for i in infos {
        if i.len as i64 > l.max_message_bytes {
            return Err(ResponseError::MessageTooLarge.into());
        }
        if l.log_append_time {
            continue;
        }
        for ts in [i.base_timestamp, i.max_timestamp] {
            if ts < 0 {
                continue; // NO_TIMESTAMP
            }
            if now_ms.saturating_sub(ts) > l.before_max_ms
                || ts.saturating_sub(now_ms) > l.after_max_ms
            {
                return Err(ResponseError::InvalidTimestamp.into());
            }
        }
    }
    Ok(())
}

/// Stamp every batch LogAppendTime `now_ms` (message.timestamp.type of the
/// topic): the leader's clock at the moment it takes the batches, as
/// Kafka's leader stamps them at append. Only the batch headers change
/// (attribute, maxTimestamp, batch CRC); the partition sees the stamped
/// max timestamp, so its time index and ListOffsets by timestamp use it.
fn log_append_time(
    records: &bytes::Bytes,
    mut infos: Vec<BatchInfo>,
    now_ms: i64,
) -> (bytes::Bytes, Vec<BatchInfo>) {
    let mut buf = records.to_vec();
    for i in &mut infos {
        kaas_protocol::batch::set_log_append_time(&mut buf[i.pos..i.pos + i.len], now_ms);
        i.max_timestamp = now_ms;
        i.attributes |= 1 << 3;
    }
    (bytes::Bytes::from(buf), infos)
}

/// Rebuild the batches whose codec is not the topic's compression.type
/// `codec` (Kafka's log validator does it at append). The work is on this
/// connection's task, never in the partition leader (the single writer
/// only appends bytes), and off the runtime's threads unless it is
/// bounded by the input: a compressed batch may inflate to anything up to
/// the cap, so it is always rebuilt on the blocking pool. The cap on the
/// inflated records is what one uncompressed request could carry
/// (--max-request-bytes), and max.message.bytes when the result is stored
/// uncompressed; beyond it, and for a rebuilt batch over
/// max.message.bytes, the answer is MESSAGE_TOO_LARGE (as Kafka checks the
/// rebuilt batch against max.message.bytes). Rebuilds off the connection's
/// task take one of `Broker::recompress_slots` (one per core), so their
/// memory is at most cores x the cap.
async fn recompress(
    b: &Broker,
    records: bytes::Bytes,
    infos: Vec<BatchInfo>,
    codec: Codec,
    limits: &ProduceLimits,
    request_left: usize,
) -> Result<(bytes::Bytes, Vec<BatchInfo>), (ApiError, String)> {
    if infos.iter().all(|i| i.compression() == codec.compression) {
        return Ok((records, infos));
    }
    let max_message = usize::try_from(limits.max_message_bytes.max(0)).unwrap_or(usize::MAX);
    let mut cap = b
        .args
        .max_request_bytes
        .min(MAX_DECOMPRESSED_BATCH)
        .min(request_left);
    if codec.compression == Compression::None {
        cap = cap.min(max_message);
    }
    let inline = records.len() <= INLINE_RECOMPRESS_BYTES
        && codec.compression != Compression::Gzip
        && infos.iter().all(|i| i.compression() == Compression::None);
    let work = move || recompress_batches(&records, infos, codec, cap);
    let rebuilt = if inline {
        work()
    } else {
        // One rebuild per core at a time: the rest wait here, so memory
        // for rebuilds is bounded by cores x cap whatever the clients send.
        // The permit moves into the task: it is held while the work runs,
        // even if this future is dropped.
        let slot = b
            .recompress_slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| {
                (
                    ApiError::from(ResponseError::UnknownServerError),
                    "recompression slots closed".to_owned(),
                )
            })?;
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            work()
        })
        .await
        .map_err(|e| {
            (
                ApiError::from(ResponseError::UnknownServerError),
                format!("recompression task failed: {e}"),
            )
        })?
    };
    let (records, infos) = rebuilt.map_err(|e| (ApiError::from(&e), e.to_string()))?;
    if let Some(i) = infos.iter().find(|i| i.len > max_message) {
        return Err((
            ResponseError::MessageTooLarge.into(),
            format!(
                "rebuilt batch of {} bytes is over max.message.bytes {max_message}",
                i.len
            ),
        ));
    }
    Ok((records, infos))
}

/// Uncompressed input up to this size is compressed on the connection's
/// own task (every connection shares one thread): the work is bounded by
/// the input, under 0.1 ms for lz4, snappy and zstd at 16 KiB, cheaper
/// than a hop to the blocking pool. gzip (about 20 MB/s) always hops.
const INLINE_RECOMPRESS_BYTES: usize = 16 << 10;

/// Dispatch phase: validate and enqueue every partition, in request order.
pub async fn handle(b: &Arc<Broker>, v: i16, r: ProduceRequest) -> Reply<ProduceResponse> {
    let acks = r.acks;
    // Counted only when a quota is configured (`client` is then set).
    let client = super::client_id();
    let bytes: usize = if client.is_some() {
        r.topic_data
            .iter()
            .flat_map(|t| t.partition_data.iter())
            .map(|p| p.records.as_ref().map_or(0, |x| x.len()))
            .sum()
    } else {
        0
    };
    let refuse_all = refuse_all(&r);
    let txn_id: Option<String> = r.transactional_id.as_ref().map(|t| t.0.to_string());
    let mut topics: Vec<(TopicProduceResponse, Vec<Slot>)> = Vec::new();
    // Batches rebuilt to a topic's codec: at most what one uncompressed
    // request could carry, over the whole request, and what they grew by
    // is held in the broker's in-flight budget until the answer.
    let mut rebuild_left = b.args.max_request_bytes;
    let mut grown_charges: Vec<crate::conn::Charge> = Vec::new();
    for td in r.topic_data {
        let mut tr = TopicProduceResponse::default();
        tr.name = td.name.clone();
        tr.topic_id = td.topic_id;
        let topic = TopicRef::pick(v >= 13, &td.name.0, td.topic_id);
        let mut slots = Vec::new();
        for pd in td.partition_data {
            let fail = |e: ApiError| Slot::Done(part_resp(pd.index, e.code()));
            if let Some(e) = refuse_all {
                slots.push(fail(e));
                continue;
            }
            // Produce carries no leader epoch (KIP-320 is for reads).
            let leader = match locate(b, topic, pd.index, -1) {
                Ok(l) => l,
                Err(e) => {
                    slots.push(fail(e));
                    continue;
                }
            };
            let records = pd.records.unwrap_or_default();
            let infos = match validate_batches(&records) {
                Ok(i) => i,
                Err(e) => {
                    if let Some(count) = super::warn_for_peer(b, "rejected produce batch") {
                        tracing::warn!(peer = %super::peer_name(), topic = %leader.name, partition = pd.index, error = %e, count, "rejected produce batch");
                    }
                    slots.push(fail(ApiError::from(&e)));
                    continue;
                }
            };
            if !b.reserve.admit(records.len() as u64) {
                // The cluster files share this volume: keep its last bytes
                // for them (see `crate::reserve`).
                kaas_actors::telemetry::global()
                    .no_space_refusals
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                slots.push(fail(ResponseError::KafkaStorageError.into()));
                continue;
            }
            if let Err(e) = check_batches(&infos, v) {
                tracing::debug!(topic = %leader.name, partition = pd.index, version = v, error = %e.0, "refused produce batch");
                slots.push(fail(e));
                continue;
            }
            let limits = b.produce_limits(&leader.name);
            let now_ms = kaas_actors::clock::wall_ms();
            if let Err(e) = check_limits(&infos, &limits, now_ms) {
                tracing::debug!(topic = %leader.name, partition = pd.index, error = %e.0, "produce refused by topic config");
                slots.push(fail(e));
                continue;
            }
            let sent_len = records.len();
            let (records, infos) = match limits.compression {
                Some(codec) => {
                    match recompress(b, records, infos, codec, &limits, rebuild_left).await {
                        Ok((rebuilt, infos)) if rebuilt.len() > sent_len => {
                            // What a rebuild added is held like the request's
                            // own bytes (the in-flight budget, until answered),
                            // is taken from what one request may rebuild, and
                            // must fit the volume's reserve.
                            let grown = rebuilt.len() - sent_len;
                            rebuild_left = rebuild_left.saturating_sub(rebuilt.len());
                            if !b.reserve.admit(grown as u64) {
                                slots.push(fail(ResponseError::KafkaStorageError.into()));
                                continue;
                            }
                            // The rebuilt header carries the records' true
                            // maximum timestamp: check the topic's bounds on it.
                            if let Err(e) = check_limits(&infos, &limits, now_ms) {
                                slots.push(fail(e));
                                continue;
                            }
                            grown_charges.push(b.inflight.charge(grown));
                            (rebuilt, infos)
                        }
                        Ok((rebuilt, infos)) => {
                            rebuild_left = rebuild_left.saturating_sub(rebuilt.len());
                            if let Err(e) = check_limits(&infos, &limits, now_ms) {
                                slots.push(fail(e));
                                continue;
                            }
                            (rebuilt, infos)
                        }
                        Err((e, why)) => {
                            if let Some(count) = super::warn_for_peer(b, "batch not recompressed") {
                                tracing::warn!(peer = %super::peer_name(), topic = %leader.name, partition = pd.index, codec = ?codec.compression, error = %why, count, "batch not recompressed to the topic's compression.type");
                            }
                            slots.push(fail(e));
                            continue;
                        }
                    }
                }
                None => (records, infos),
            };
            let (records, infos, append_time) = if limits.log_append_time {
                let (r, i) = log_append_time(&records, infos, now_ms);
                (r, i, now_ms)
            } else {
                (records, infos, -1)
            };
            if txn_id.is_none() && infos.iter().any(|i| i.is_transactional()) {
                slots.push(fail(
                    ResponseError::TransactionalIdAuthorizationFailed.into(),
                ));
                continue;
            }
            let append = |verified| AppendBatches {
                records: records.clone(),
                infos: infos.clone(),
                wait_durable: acks != 0,
                verified,
            };
            // Small plain batches are handed over to the leader's writer
            // loop, without a round trip through its mailbox (and without
            // a file call on this thread); anything else (or a partition
            // not open) goes to the leader, which appends what was handed
            // over first, so the order holds.
            let mut sent = match leader.handle.hand_over(append(None)) {
                Ok(h) => {
                    slots.push(Slot::Handed(pd.index, h, append_time));
                    continue;
                }
                Err(msg) => leader.handle.addr.send(msg).await,
            };
            if let Ok(Err(PartitionError::TxnUnverified {
                producer_id,
                producer_epoch,
                token,
            })) = sent
            {
                let id = txn_id.as_deref().unwrap_or_default();
                let checked = if b.args.transaction_partition_verification_enable {
                    super::txn::verify::verify(
                        b,
                        id,
                        producer_id,
                        producer_epoch,
                        &leader.name,
                        pd.index,
                    )
                    .await
                } else {
                    Ok(())
                };
                if let Err(e) = checked {
                    slots.push(fail(e.into()));
                    continue;
                }
                sent = leader.handle.addr.send(append(Some(token))).await;
            }
            match sent {
                Ok(Ok(t)) => slots.push(Slot::Waiting(
                    pd.index,
                    t,
                    leader.handle.addr.owe(),
                    append_time,
                )),
                Ok(Err(e)) => slots.push(fail(ApiError::from(&e))),
                Err(_) => slots.push(fail(ApiError::leader_gone())),
            }
        }
        topics.push((tr, slots));
    }
    // Over its quota, the connection is held here, before its next request
    // is read (Kafka mutes the channel), and the answer says for how long.
    let throttle = client.map_or(Duration::ZERO, |client| {
        b.quotas.record(
            crate::quota::Kind::Produce,
            &client,
            bytes as u64,
            Instant::now(),
        )
    });
    if !throttle.is_zero() {
        tokio::time::sleep(throttle).await;
    }
    if acks == 0 {
        return Reply::Nothing;
    }
    let timeout = Duration::from_millis(r.timeout_ms.max(0) as u64);
    let throttle_ms = throttle.as_millis().min(i32::MAX as u128) as i32;
    Reply::Later(
        complete(topics, timeout, v)
            .map(move |mut resp| {
                drop(grown_charges);
                resp.throttle_time_ms = throttle_ms;
                resp
            })
            .boxed(),
    )
}

/// A Produce whose frame was over `--max-request-bytes` (its records were
/// dropped unread, see `kaas_protocol::Frame::Oversized`): every partition
/// it lists is answered MESSAGE_TOO_LARGE, which producers report to the
/// application instead of resending, so the connection is kept. acks=0
/// gets no answer, as for any produce.
pub fn too_large(v: i16, r: ProduceRequest) -> Reply<ProduceResponse> {
    if r.acks == 0 {
        return Reply::Nothing;
    }
    let mut resp = ProduceResponse::default();
    for td in r.topic_data {
        let mut tr = TopicProduceResponse::default();
        tr.name = td.name;
        tr.topic_id = td.topic_id;
        for pd in td.partition_data {
            let mut p = part_resp(pd.index, ResponseError::MessageTooLarge.code());
            for_version(&mut p, v);
            tr.partition_responses.push(p);
        }
        resp.responses.push(tr);
    }
    Reply::Now(resp)
}

/// Wait (until `deadline`) for the fsync covering an append, if `rx`,
/// and answer with where it landed: `known` at append time (a ticket,
/// whose answer is the high watermark) or told with its durability (an
/// append handed over, answered with [`Placed`]).
async fn durable<T: Landed>(
    idx: i32,
    rx: Option<tokio::sync::oneshot::Receiver<Result<T, PartitionError>>>,
    known: Option<Placed>,
    deadline: Instant,
    append_time: i64,
) -> PartitionProduceResponse {
    let placed = match rx {
        None => known,
        Some(rx) => {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left.max(Duration::from_millis(1)), rx).await {
                Ok(Ok(Ok(x))) => x.placed().or(known),
                Ok(Ok(Err(e))) => return part_resp(idx, ApiError::from(&e).code()),
                // The leader dropped the ticket: it stopped.
                Ok(Err(_)) => return part_resp(idx, ApiError::leader_gone().code()),
                Err(_) => return part_resp(idx, ResponseError::RequestTimedOut.code()),
            }
        }
    };
    let mut p = part_resp(idx, NONE);
    if let Some(placed) = placed {
        p.base_offset = placed.base_offset;
        p.log_append_time_ms = append_time;
        p.log_start_offset = placed.log_start_offset;
    }
    p
}

/// What a durability answer says about where the append landed.
trait Landed {
    /// `None`: the caller knew it at append time.
    fn placed(self) -> Option<Placed>;
}

impl Landed for i64 {
    fn placed(self) -> Option<Placed> {
        None
    }
}

impl Landed for Placed {
    fn placed(self) -> Option<Placed> {
        Some(self)
    }
}

/// Completion phase: wait (bounded by the request timeout) for each
/// partition's fsync, and answer.
async fn complete(
    topics: Vec<(TopicProduceResponse, Vec<Slot>)>,
    timeout: Duration,
    v: i16,
) -> ProduceResponse {
    let deadline = Instant::now() + timeout;
    let mut resp = ProduceResponse::default();
    for (mut tr, slots) in topics {
        for slot in slots {
            let mut pr = match slot {
                Slot::Done(p) => p,
                Slot::Waiting(idx, t, _owed, append_time) => {
                    let known = Placed {
                        base_offset: t.base_offset,
                        log_start_offset: t.log_start_offset,
                    };
                    durable(idx, t.durable, Some(known), deadline, append_time).await
                }
                Slot::Handed(idx, h, append_time) => {
                    let _owed = h.owed;
                    durable(idx, Some(h.placed), None, deadline, append_time).await
                }
            };
            for_version(&mut pr, v);
            tr.partition_responses.push(pr);
        }
        resp.responses.push(tr);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(attributes: i16) -> BatchInfo {
        BatchInfo {
            pos: 0,
            len: 61,
            last_offset_delta: 0,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            records_count: 1,
            attributes,
        }
    }

    #[test]
    fn zstd_needs_v7() {
        let zstd = [info(0), info(4)];
        for v in 3..7 {
            assert_eq!(check_batches(&zstd, v).unwrap_err().code(), 76, "v{v}");
        }
        for v in 7..=13 {
            assert_eq!(check_batches(&zstd, v), Ok(()), "v{v}");
        }
        // Every other codec is fine at every version.
        for codec in 0..4 {
            assert_eq!(check_batches(&[info(codec)], 3), Ok(()));
        }
    }

    #[test]
    fn control_batches_and_transactional_ones_without_producer_are_refused() {
        assert_eq!(check_batches(&[info(1 << 4)], 9).unwrap_err().code(), 87);
        assert_eq!(check_batches(&[info(1 << 5)], 9).unwrap_err().code(), 53);
        let txn = BatchInfo {
            producer_id: 7,
            producer_epoch: 0,
            base_sequence: 0,
            ..info(1 << 4)
        };
        assert_eq!(check_batches(&[txn], 9), Ok(()));
    }

    /// Catches: max.message.bytes and the timestamp bounds not enforced
    /// (or enforced with the wrong code).
    #[test]
    fn topic_limits_refuse_large_batches_and_far_timestamps() {
        let l = ProduceLimits {
            max_message_bytes: 61,
            before_max_ms: 1000,
            after_max_ms: 500,
            log_append_time: false,
            compression: None,
        };
        let now = 10_000;
        let at = |ts: i64, len: usize| BatchInfo {
            base_timestamp: ts,
            max_timestamp: ts,
            len,
            ..info(0)
        };
        assert_eq!(check_limits(&[at(now, 61)], &l, now), Ok(()));
        assert_eq!(check_limits(&[at(-1, 61)], &l, now), Ok(()));
        assert_eq!(
            check_limits(&[at(now, 62)], &l, now).unwrap_err().code(),
            10
        );
        assert_eq!(
            check_limits(&[at(now - 1001, 61)], &l, now)
                .unwrap_err()
                .code(),
            32
        );
        assert_eq!(
            check_limits(&[at(now + 501, 61)], &l, now)
                .unwrap_err()
                .code(),
            32
        );
        assert_eq!(
            check_limits(&[at(now - 1000, 61), at(now + 500, 61)], &l, now),
            Ok(())
        );
        let open = ProduceLimits {
            max_message_bytes: i64::MAX,
            before_max_ms: i64::MAX,
            after_max_ms: i64::MAX,
            log_append_time: false,
            compression: None,
        };
        assert_eq!(
            check_limits(&[at(0, 1 << 30), at(i64::MAX, 1)], &open, now),
            Ok(())
        );
        // LogAppendTime replaces the producer's timestamps: not judged.
        let append = ProduceLimits {
            log_append_time: true,
            ..l
        };
        assert_eq!(check_limits(&[at(now - 1001, 61)], &append, now), Ok(()));
        assert_eq!(
            check_limits(&[at(now, 62)], &append, now)
                .unwrap_err()
                .code(),
            10
        );
    }

    /// Catches: a LogAppendTime topic storing the producer's timestamps, or
    /// a partition told a max timestamp other than the stamped one.
    #[test]
    fn log_append_time_stamps_every_batch_header() {
        let rec = |ts: i64| kaas_protocol::kafka_protocol::records::Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: kaas_protocol::kafka_protocol::records::TimestampType::Creation,
            offset: ts - 5,
            sequence: -1,
            timestamp: ts,
            key: None,
            value: Some(bytes::Bytes::from_static(b"v")),
            headers: Default::default(),
        };
        let mut buf = bytes::BytesMut::new();
        kaas_protocol::kafka_protocol::records::RecordBatchEncoder::encode(
            &mut buf,
            &[rec(5), rec(6)],
            &kaas_protocol::kafka_protocol::records::RecordEncodeOptions {
                version: 2,
                compression: kaas_protocol::kafka_protocol::records::Compression::None,
            },
        )
        .unwrap();
        let records = buf.freeze();
        let infos = validate_batches(&records).unwrap();
        let (stamped, infos) = log_append_time(&records, infos, 777);
        assert_eq!(infos[0].max_timestamp, 777);
        let again = validate_batches(&stamped).unwrap();
        assert!(again[0].is_log_append_time());
        assert_eq!(again[0].max_timestamp, 777);
        assert_eq!(again[0].base_timestamp, 5);
    }

    /// Catches: an oversized produce answered for fewer partitions than
    /// it listed, or with another error than MESSAGE_TOO_LARGE.
    #[test]
    fn too_large_answers_every_listed_partition() {
        use kaas_protocol::kafka_protocol::messages::produce_request::{
            PartitionProduceData, TopicProduceData,
        };
        let t = |parts: &[i32]| {
            TopicProduceData::default().with_partition_data(
                parts
                    .iter()
                    .map(|&i| PartitionProduceData::default().with_index(i))
                    .collect(),
            )
        };
        let r = ProduceRequest::default()
            .with_acks(1)
            .with_topic_data(vec![t(&[0, 3]), t(&[7])]);
        let Reply::Now(resp) = too_large(9, r.clone()) else {
            panic!("answered at once")
        };
        let got: Vec<Vec<(i32, i16)>> = resp
            .responses
            .iter()
            .map(|t| {
                t.partition_responses
                    .iter()
                    .map(|p| (p.index, p.error_code))
                    .collect()
            })
            .collect();
        let e = ResponseError::MessageTooLarge.code();
        assert_eq!(got, vec![vec![(0, e), (3, e)], vec![(7, e)]]);
        assert!(matches!(too_large(9, r.with_acks(0)), Reply::Nothing));
    }

    #[test]
    fn log_start_offset_from_v5() {
        let mut p = part_resp(0, NONE);
        p.log_start_offset = 42;
        for_version(&mut p, 5);
        assert_eq!(p.log_start_offset, 42);
        for_version(&mut p, 4);
        assert_eq!(p.log_start_offset, -1);
    }

    #[test]
    fn request_wide_refusals() {
        let mut r = ProduceRequest::default();
        r.acks = 2;
        assert_eq!(refuse_all(&r).unwrap().code(), 21);
        r.acks = -1;
        assert_eq!(refuse_all(&r), None);
        r.transactional_id = Some(Default::default());
        assert_eq!(refuse_all(&r), None, "transactional producers are served");
    }
}
