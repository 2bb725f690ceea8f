//! Fetch (key 1): durable bytes from each partition's reader, on the
//! blocking pool, with a long poll on the high watermarks. Nothing read by a
//! broker whose lease lapsed meanwhile is served.
//!
//! Version rules handled here: topics by id from v13; `log_start_offset`
//! from v5; below v10 a client cannot read zstd (KIP-110), so zstd batches
//! are never served to it: the bytes before the first zstd batch are, and a
//! partition whose next batch is zstd answers UNSUPPORTED_COMPRESSION_TYPE.
//! From v7, incremental fetch sessions (KIP-227, [`crate::fetch_session`]).
//! `isolation_level = 1` (read_committed): records only below the last
//! stable offset, with the aborted transactions overlapping them; the last
//! stable offset is answered at both levels (a session counts its move as
//! news, like the high watermark's).

use super::error::{ApiError, NONE};
use super::{locate_reader, Reply, TopicRef};
use crate::fetch_session::{Answered, Key, Plan, Want};
use crate::state::Broker;
use bytes::Bytes;
use futures::FutureExt;
use kaas_actors::partition::leader::PartitionHandle;
use kaas_actors::partition::reader::PartitionReader;
use kaas_protocol::kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kaas_protocol::kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use kaas_protocol::kafka_protocol::protocol::StrBytes;
use kaas_protocol::kafka_protocol::ResponseError;
use kaas_protocol::{first_zstd_batch, FETCH_MIN_VERSION_ZSTD};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Broker-side cap on one fetch response (Kafka's fetch.max.bytes default
/// is 55 MiB): a client asking for i32::MAX must not make us read a segment.
const FETCH_MAX_BYTES: usize = 64 << 20;
/// A Fetch waits (up to [`FETCH_GRANT_PATIENCE`]) for this much of the
/// broker's in-flight budget before it reads; past that it reads what is
/// free, possibly nothing (an answer with offsets and no records).
const FETCH_GRANT_FLOOR: usize = 1 << 20;
const FETCH_GRANT_PATIENCE: Duration = Duration::from_millis(500);

struct FetchItem {
    topic_idx: usize,
    key: Key,
    partition: i32,
    offset: i64,
    max: usize,
    target: Result<(PartitionHandle, PartitionReader), ApiError>,
}

/// Everything runs in the completion phase: a fetch enqueues nothing.
pub async fn handle(b: &Arc<Broker>, v: i16, r: FetchRequest) -> Reply<FetchResponse> {
    let b = b.clone();
    let client = super::client_id();
    Reply::Later(
        async move {
            let mut resp = fetch(&b, r, v).await;
            // No quota configured at dispatch: nothing to count.
            let Some(client) = client else {
                return resp;
            };
            // Over its quota, the answer is held back (and says for how
            // long), so the consumer's next fetch comes that much later.
            let bytes: usize = resp
                .responses
                .iter()
                .flat_map(|t| t.partitions.iter())
                .map(|p| p.records.as_ref().map_or(0, |x| x.len()))
                .sum();
            let throttle = b.quotas.record(
                crate::quota::Kind::Fetch,
                &client,
                bytes as u64,
                Instant::now(),
            );
            if !throttle.is_zero() {
                resp.throttle_time_ms = throttle.as_millis().min(i32::MAX as u128) as i32;
                tokio::time::sleep(throttle).await;
            }
            resp
        }
        .boxed(),
    )
}

/// The bytes of `records` a client at fetch version `v` may be served: all
/// of them from v10; below, those before the first zstd batch, or
/// UNSUPPORTED_COMPRESSION_TYPE when the first batch is zstd.
fn servable(records: Bytes, v: i16) -> Result<Bytes, ApiError> {
    if v >= FETCH_MIN_VERSION_ZSTD {
        return Ok(records);
    }
    match first_zstd_batch(&records) {
        None => Ok(records),
        Some(0) => Err(ResponseError::UnsupportedCompressionType.into()),
        Some(cut) => Ok(records.slice(..cut)),
    }
}

/// Blank what version `v` does not carry.
fn for_version(p: &mut PartitionData, v: i16) {
    if v < 5 {
        p.log_start_offset = -1;
    }
}

async fn fetch(b: &Arc<Broker>, r: FetchRequest, v: i16) -> FetchResponse {
    let mut resp = FetchResponse::default();
    let asked: Vec<(Key, Want)> = r
        .topics
        .iter()
        .flat_map(|ft| {
            ft.partitions.iter().map(move |fp| {
                (
                    Key {
                        topic: ft.topic.0.to_string(),
                        topic_id: ft.topic_id,
                        partition: fp.partition,
                    },
                    Want {
                        fetch_offset: fp.fetch_offset,
                        max_bytes: fp.partition_max_bytes,
                        current_leader_epoch: fp.current_leader_epoch,
                    },
                )
            })
        })
        .collect();
    let plan = if v >= 7 {
        let forgotten: Vec<Key> = r
            .forgotten_topics_data
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(move |p| Key {
                    topic: t.topic.0.to_string(),
                    topic_id: t.topic_id,
                    partition: *p,
                })
            })
            .collect();
        b.fetch_sessions.lock().unwrap().begin(
            r.session_id,
            r.session_epoch,
            asked,
            &forgotten,
            Instant::now(),
            rand::random::<i32>,
        )
    } else {
        Ok(Plan::Full {
            session_id: 0,
            parts: asked,
        })
    };
    let (session_id, incremental, parts) = match plan {
        Ok(Plan::Full { session_id, parts }) => (session_id, false, parts),
        Ok(Plan::Incremental { session_id, parts }) => (session_id, true, parts),
        Err(e) => {
            resp.error_code = ApiError::from(e).code();
            return resp;
        }
    };
    resp.session_id = session_id;
    let mut items = Vec::with_capacity(parts.len());
    let mut topic_idx: std::collections::HashMap<(String, uuid::Uuid), usize> =
        std::collections::HashMap::new();
    for (key, want) in parts {
        let ti = *topic_idx
            .entry((key.topic.clone(), key.topic_id))
            .or_insert_with(|| {
                let mut tr = FetchableTopicResponse::default();
                tr.topic = TopicName(StrBytes::from_string(key.topic.clone()));
                tr.topic_id = key.topic_id;
                resp.responses.push(tr);
                resp.responses.len() - 1
            });
        let topic = TopicRef::pick(v >= 13, &key.topic, key.topic_id);
        let target = locate_reader(b, topic, key.partition, want.current_leader_epoch).await;
        items.push(FetchItem {
            topic_idx: ti,
            partition: key.partition,
            offset: want.fetch_offset,
            max: want.max_bytes.max(0) as usize,
            target,
            key,
        });
    }
    // Also within one connection's in-flight budget: the answer is held
    // whole while it is written (see crate::conn).
    let cap = FETCH_MAX_BYTES.min(b.args.conn_inflight_bytes as usize);
    let max_total = if r.max_bytes > 0 {
        (r.max_bytes as usize).min(cap)
    } else {
        cap
    };
    let deadline = Instant::now() + Duration::from_millis(r.max_wait_ms.max(0) as u64);
    let items = Arc::new(items);
    loop {
        let work = items.clone();
        let committed = r.isolation_level == 1;
        // The answer is built whole in memory: hold its bytes in the
        // broker's in-flight budget before reading, so unread answers
        // cannot take more than --broker-inflight-bytes (a charge on the
        // request frame alone is a few dozen bytes). Held until the answer
        // is returned; the writer charges what it writes (crate::conn).
        let grant = b
            .inflight
            .take_up_to(max_total, FETCH_GRANT_FLOOR, FETCH_GRANT_PATIENCE)
            .await;
        let cap = grant.bytes();
        let read = tokio::task::spawn_blocking(move || read_items(&work, cap, v, committed)).await;
        // Serve nothing read by a broker whose lease lapsed meanwhile (a
        // long poll spans many reads): another broker may lead by now, and
        // bytes past its seal must never reach a client.
        let lapsed = !b.shared.lease.valid();
        let all_failed = |e: ApiError| {
            items
                .iter()
                .map(|i| {
                    let mut p = PartitionData::default();
                    p.partition_index = i.partition;
                    p.error_code = e.code();
                    (i.topic_idx, p)
                })
                .collect()
        };
        let parts = match read {
            Ok(p) if !lapsed => p,
            Ok(_) => all_failed(ResponseError::NotLeaderOrFollower.into()),
            Err(_) => all_failed(ApiError::blocking_task_failed()),
        };
        let any_error = parts.iter().any(|(_, p)| p.error_code != NONE);
        let total: usize = parts
            .iter()
            .map(|(_, p)| p.records.as_ref().map(|x| x.len()).unwrap_or(0))
            .sum();
        let now = Instant::now();
        if total >= r.min_bytes.max(0) as usize || now >= deadline || parts.is_empty() || any_error
        {
            let mut sessions = (session_id != 0).then(|| b.fetch_sessions.lock().unwrap());
            for ((ti, p), it) in parts.into_iter().zip(items.iter()) {
                if let Some(c) = sessions.as_mut() {
                    let now = Answered {
                        high_watermark: p.high_watermark,
                        last_stable_offset: p.last_stable_offset,
                        log_start_offset: p.log_start_offset,
                    };
                    let has_records = p.records.as_ref().is_some_and(|r| !r.is_empty());
                    let must =
                        c.answered(session_id, &it.key, now, has_records, p.error_code != NONE);
                    if incremental && !must {
                        continue;
                    }
                }
                resp.responses[ti].partitions.push(p);
            }
            drop(sessions);
            if incremental {
                resp.responses.retain(|t| !t.partitions.is_empty());
            }
            let fetched = total as u64;
            kaas_actors::telemetry::global()
                .fetch_bytes
                .fetch_add(fetched, std::sync::atomic::Ordering::Relaxed);
            return resp;
        }
        drop(grant);
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

fn read_items(
    items: &[FetchItem],
    max_total: usize,
    version: i16,
    committed: bool,
) -> Vec<(usize, PartitionData)> {
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
        let offsets_only = |p: &mut PartitionData, reader: &PartitionReader| {
            let (start, hw, _) = reader.offsets();
            p.high_watermark = hw;
            p.last_stable_offset = reader.last_stable_offset().min(hw);
            p.log_start_offset = start;
            p.records = Some(Bytes::new());
        };
        match &it.target {
            Err(e) => p.error_code = e.code(),
            Ok((_, reader)) if budget == 0 => {
                // Budget spent: only the first partition with data may
                // overshoot (KIP-74). Report offsets, no records.
                offsets_only(&mut p, reader);
            }
            Ok((_, reader)) => {
                // The first partition with data may exceed the request's
                // max_bytes by one batch (KIP-74); later ones fit the budget.
                let want = it.max.min(budget).min(FETCH_MAX_BYTES);
                let read = if committed {
                    reader.read_committed(it.offset, want)
                } else {
                    reader.read(it.offset, want)
                };
                match read
                    .map_err(|e| ApiError::from(&e))
                    .and_then(|res| Ok((servable(res.records.clone(), version)?, res)))
                {
                    Ok((records, res)) => {
                        p.high_watermark = res.high_watermark;
                        p.last_stable_offset = res.last_stable_offset.min(res.high_watermark);
                        p.log_start_offset = res.log_start_offset;
                        if committed {
                            p.aborted_transactions = Some(
                                res.aborted
                                    .iter()
                                    .map(|(pid, first)| {
                                        let mut a = AbortedTransaction::default();
                                        a.producer_id = (*pid).into();
                                        a.first_offset = *first;
                                        a
                                    })
                                    .collect(),
                            );
                        }
                        budget = budget.saturating_sub(records.len());
                        p.records = Some(records);
                    }
                    Err(e) => {
                        offsets_only(&mut p, reader);
                        p.error_code = e.code();
                    }
                }
            }
        }
        for_version(&mut p, version);
        out.push((it.topic_idx, p));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header-only batch (61 bytes) with `codec` in its attributes.
    fn batch(codec: i16) -> Vec<u8> {
        let mut b = vec![0u8; 61];
        b[8..12].copy_from_slice(&49i32.to_be_bytes());
        b[16] = 2;
        b[21..23].copy_from_slice(&codec.to_be_bytes());
        b
    }

    #[test]
    fn no_zstd_below_v10() {
        let plain = batch(0);
        let zstd = batch(4);
        let mixed = Bytes::from([plain.clone(), zstd.clone()].concat());
        // Below v10: the prefix before the zstd batch, or the error first.
        for v in 4..10 {
            assert_eq!(
                servable(mixed.clone(), v).unwrap(),
                Bytes::from(plain.clone())
            );
            assert_eq!(
                servable(Bytes::from(zstd.clone()), v).unwrap_err().code(),
                76,
                "v{v}"
            );
        }
        // From v10: everything.
        for v in 10..=18 {
            assert_eq!(servable(mixed.clone(), v).unwrap(), mixed);
        }
        assert_eq!(servable(Bytes::new(), 4).unwrap(), Bytes::new());
    }

    #[test]
    fn log_start_offset_from_v5() {
        let mut p = PartitionData::default();
        p.log_start_offset = 7;
        for_version(&mut p, 5);
        assert_eq!(p.log_start_offset, 7);
        for_version(&mut p, 4);
        assert_eq!(p.log_start_offset, -1);
    }
}
