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
//!
//! Records are not read here: each partition's reader locates them (a
//! range of a segment file, bounded by what was durable when located) and
//! the connection sends the range from the file with `sendfile`
//! ([`Fetched`], [`encode_parts`], `crate::conn`), so the broker touches
//! no record byte. Below v10 (the zstd cut needs the batches) and on seams
//! without a descriptor, the range is read into memory: the copy path.

use super::error::{ApiError, NONE};
use super::{locate_reader, Answer, IntoAnswer, Reply, TopicRef};
use crate::conn::Part;
use crate::fetch_session::{Answered, Key, Plan, Want};
use crate::state::Broker;
use bytes::Bytes;
use futures::FutureExt;
use kaas_actors::partition::leader::PartitionHandle;
use kaas_actors::partition::reader::{FileRange, PartitionReader};
use kaas_protocol::kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kaas_protocol::kafka_protocol::messages::{
    BrokerId, FetchRequest, FetchResponse, ResponseKind, TopicName,
};
use kaas_protocol::kafka_protocol::protocol::StrBytes;
use kaas_protocol::kafka_protocol::ResponseError;
use kaas_protocol::{
    encode_response, first_zstd_batch, EncodeError, RequestHeader, FETCH_MIN_VERSION_ZSTD,
};
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

/// Where a partition's records are sent from: (topic index, partition
/// index) in the response, and the file range.
pub type FilePlace = ((usize, usize), FileRange);

/// A Fetch response whose records are (partly) in segment files: each
/// partition named in `files` carries empty records in `resp`, and its
/// records are the range's bytes.
pub struct Fetched {
    /// The response.
    pub resp: FetchResponse,
    /// The partitions served from files, in response order.
    pub files: Vec<FilePlace>,
}

impl Fetched {
    /// Record bytes in the answer, in memory and in files.
    fn record_bytes(&self) -> usize {
        let mem: usize = self
            .resp
            .responses
            .iter()
            .flat_map(|t| t.partitions.iter())
            .map(|p| p.records.as_ref().map_or(0, |x| x.len()))
            .sum();
        mem + self
            .files
            .iter()
            .map(|(_, r)| r.len as usize)
            .sum::<usize>()
    }
}

impl IntoAnswer<FetchResponse> for Fetched {
    fn into_answer(self, kind: fn(FetchResponse) -> ResponseKind) -> Answer {
        Answer {
            body: kind(self.resp),
            files: self.files,
        }
    }
}

struct FetchItem {
    topic_idx: usize,
    key: Key,
    partition: i32,
    offset: i64,
    max: usize,
    target: Result<(PartitionHandle, PartitionReader), ApiError>,
}

/// Everything runs in the completion phase: a fetch enqueues nothing.
pub async fn handle(b: &Arc<Broker>, v: i16, r: FetchRequest) -> Reply<Fetched> {
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
            let bytes = resp.record_bytes();
            let throttle = b.quotas.record(
                crate::quota::Kind::Fetch,
                &client,
                bytes as u64,
                Instant::now(),
            );
            if !throttle.is_zero() {
                resp.resp.throttle_time_ms = throttle.as_millis().min(i32::MAX as u128) as i32;
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

async fn fetch(b: &Arc<Broker>, r: FetchRequest, v: i16) -> Fetched {
    let mut resp = FetchResponse::default();
    let done = |resp| Fetched {
        resp,
        files: Vec::new(),
    };
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
            return done(resp);
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
        // Hold the answer's bytes in the broker's in-flight budget before
        // reading (the request frame's charge is a few dozen bytes): an
        // answer read into memory (below v10, or a filesystem without
        // descriptors) is held whole until written, so without this unread
        // answers could take any amount. Held until the answer is returned;
        // the writer then charges what it writes, file ranges included
        // (crate::conn).
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
                    (i.topic_idx, p, None)
                })
                .collect()
        };
        let parts = match read {
            Ok(p) if !lapsed => p,
            Ok(_) => all_failed(ResponseError::NotLeaderOrFollower.into()),
            Err(_) => all_failed(ApiError::blocking_task_failed()),
        };
        let any_error = parts.iter().any(|(_, p, _)| p.error_code != NONE);
        let total: usize = parts
            .iter()
            .map(|(_, p, f)| {
                p.records.as_ref().map(|x| x.len()).unwrap_or(0)
                    + f.as_ref().map_or(0, |f: &FileRange| f.len as usize)
            })
            .sum();
        let now = Instant::now();
        if total >= r.min_bytes.max(0) as usize || now >= deadline || parts.is_empty() || any_error
        {
            let mut sessions = (session_id != 0).then(|| b.fetch_sessions.lock().unwrap());
            let mut files = Vec::new();
            for ((ti, p, file), it) in parts.into_iter().zip(items.iter()) {
                if let Some(c) = sessions.as_mut() {
                    let now = Answered {
                        high_watermark: p.high_watermark,
                        last_stable_offset: p.last_stable_offset,
                        log_start_offset: p.log_start_offset,
                    };
                    let has_records =
                        p.records.as_ref().is_some_and(|r| !r.is_empty()) || file.is_some();
                    let must =
                        c.answered(session_id, &it.key, now, has_records, p.error_code != NONE);
                    if incremental && !must {
                        continue;
                    }
                }
                if let Some(f) = file {
                    files.push(((ti, resp.responses[ti].partitions.len()), f));
                }
                resp.responses[ti].partitions.push(p);
            }
            drop(sessions);
            if incremental {
                // Topics left without partitions go; those with a file
                // range stay, and their index moves down past the gone.
                let mut new_index = Vec::with_capacity(resp.responses.len());
                let mut kept = 0;
                for t in &resp.responses {
                    new_index.push(kept);
                    kept += usize::from(!t.partitions.is_empty());
                }
                for ((ti, _), _) in files.iter_mut() {
                    *ti = new_index[*ti];
                }
                resp.responses.retain(|t| !t.partitions.is_empty());
            }
            // Response order (topic by topic), as the encoder walks it.
            files.sort_by_key(|(at, _)| *at);
            let fetched = total as u64;
            kaas_actors::telemetry::global()
                .fetch_bytes
                .fetch_add(fetched, std::sync::atomic::Ordering::Relaxed);
            return Fetched { resp, files };
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
) -> Vec<(usize, PartitionData, Option<FileRange>)> {
    let mut out = Vec::with_capacity(items.len());
    let mut budget = max_total;
    for it in items {
        let mut p = PartitionData::default();
        let mut file = None;
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
                let located = reader
                    .locate(it.offset, want, committed)
                    .map_err(|e| ApiError::from(&e))
                    .and_then(|res| {
                        let (records, range) = match res.range.clone() {
                            Some(r) if r.len == 0 => (Bytes::new(), None),
                            // Sent from the file by the connection.
                            Some(r)
                                if version >= FETCH_MIN_VERSION_ZSTD && r.file.fd().is_some() =>
                            {
                                (Bytes::new(), Some(r))
                            }
                            Some(r) => {
                                let bytes = r.read().map_err(|e| {
                                    ApiError::from(&kaas_actors::partition::reader::ReadError::Io(
                                        e,
                                    ))
                                })?;
                                (servable(bytes, version)?, None)
                            }
                            None => (Bytes::new(), None),
                        };
                        Ok((records, range, res))
                    });
                match located {
                    Ok((records, range, res)) => {
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
                        budget = budget.saturating_sub(
                            records.len() + range.as_ref().map_or(0, |r| r.len as usize),
                        );
                        p.records = Some(records);
                        file = range;
                    }
                    Err(e) => {
                        offsets_only(&mut p, reader);
                        p.error_code = e.code();
                    }
                }
            }
        }
        for_version(&mut p, version);
        out.push((it.topic_idx, p, file));
    }
    out
}

/// Encode `resp` with the records of the partitions in `files` (in
/// response order; each carries empty records in `resp`) sent from their
/// file ranges: the frame as parts, exactly the bytes
/// `encode_response` would give with the records in memory.
///
/// Where each placeholder's records field sits is found by encoding the
/// response twice, once with the placeholders empty and once null: the
/// two encodings have the same length (a compact length is one byte
/// either way, a classic one four) and differ only in those fields, so
/// the generated encoder stays the only one that knows the layout.
pub fn encode_parts(
    header: &RequestHeader,
    resp: FetchResponse,
    files: Vec<FilePlace>,
) -> Result<Vec<Part>, EncodeError> {
    let mut body = ResponseKind::Fetch(resp);
    let empty = encode_response(header, &body)?;
    let ResponseKind::Fetch(resp) = &mut body else {
        unreachable!("built as a Fetch")
    };
    for ((t, p), _) in &files {
        if let Some(part) = resp
            .responses
            .get_mut(*t)
            .and_then(|t| t.partitions.get_mut(*p))
        {
            part.records = None;
        }
    }
    let null = encode_response(header, &body)?;
    match splice_ranges(&empty, &null, header.api_version >= 12, files) {
        Ok(parts) => Ok(parts),
        Err(files) => {
            // Never expected: the copy path, which cannot get it wrong.
            tracing::error!(
                version = header.api_version,
                "fetch placeholders not found; answering from memory"
            );
            let ResponseKind::Fetch(resp) = &mut body else {
                unreachable!("built as a Fetch")
            };
            for ((t, p), f) in files {
                let bytes = f.read().map_err(|e| EncodeError::Body {
                    api_key: header.api_key,
                    version: header.api_version,
                    reason: format!("reading records: {e}"),
                })?;
                if let Some(part) = resp
                    .responses
                    .get_mut(t)
                    .and_then(|t| t.partitions.get_mut(p))
                {
                    part.records = Some(bytes);
                }
            }
            encode_response(header, &body).map(|b| vec![Part::Bytes(b)])
        }
    }
}

/// The frame `empty` with each placeholder (found where `null` differs)
/// replaced by its range's length and the range; the ranges back when
/// the two do not line up.
fn splice_ranges(
    empty: &Bytes,
    null: &Bytes,
    compact: bool,
    files: Vec<FilePlace>,
) -> Result<Vec<Part>, Vec<FilePlace>> {
    let (empty_field, null_field): (&[u8], &[u8]) = if compact {
        (&[1], &[0])
    } else {
        (&[0, 0, 0, 0], &[0xff, 0xff, 0xff, 0xff])
    };
    let w = empty_field.len();
    if empty.len() != null.len() || empty.len() < 4 {
        return Err(files);
    }
    let mut parts = Vec::with_capacity(2 + files.len() * 3);
    let mut cursor = 4;
    let mut total = empty.len() - 4;
    let mut ranges = Vec::with_capacity(files.len());
    for (_, f) in &files {
        let Some(at) = (cursor..empty.len()).find(|&i| empty[i] != null[i]) else {
            return Err(files);
        };
        if empty.get(at..at + w) != Some(empty_field) || null.get(at..at + w) != Some(null_field) {
            return Err(files);
        }
        let len = f.len as usize;
        let prefix = if compact {
            let mut v = Vec::with_capacity(5);
            let mut x = len as u64 + 1;
            while x >= 0x80 {
                v.push((x as u8 & 0x7f) | 0x80);
                x >>= 7;
            }
            v.push(x as u8);
            v
        } else {
            match i32::try_from(len) {
                Ok(l) => l.to_be_bytes().to_vec(),
                Err(_) => return Err(files),
            }
        };
        total = total - w + prefix.len() + len;
        ranges.push((cursor, at, prefix));
        cursor = at + w;
    }
    if empty[cursor..] != null[cursor..] {
        return Err(files);
    }
    let Ok(total) = i32::try_from(total) else {
        return Err(files);
    };
    parts.push(Part::Bytes(Bytes::copy_from_slice(&total.to_be_bytes())));
    for ((from, at, prefix), (_, f)) in ranges.into_iter().zip(files) {
        if at > from {
            parts.push(Part::Bytes(empty.slice(from..at)));
        }
        parts.push(Part::Bytes(Bytes::from(prefix)));
        parts.push(Part::File(f));
    }
    if cursor < empty.len() {
        parts.push(Part::Bytes(empty.slice(cursor..)));
    }
    Ok(parts)
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

    /// A file holding `bytes`, as a read handle of the real seam.
    fn file_of(dir: &std::path::Path, name: &str, bytes: &[u8]) -> FileRange {
        use kaas_volume::fs::Fs;
        let path = dir.join(name);
        #[allow(clippy::disallowed_methods)] // a test fixture
        std::fs::write(&path, bytes).unwrap();
        FileRange {
            file: kaas_volume::fs::RealFs.open_read(&path).unwrap(),
            pos: 0,
            len: bytes.len() as u64,
        }
    }

    /// What the parts put on the wire, file ranges read.
    fn wire(parts: &[Part]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            match p {
                Part::Bytes(b) => out.extend_from_slice(b),
                Part::File(f) => out.extend_from_slice(&f.read().unwrap()),
            }
        }
        out
    }

    #[test]
    fn file_parts_encode_exactly_as_the_records_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        // Sizes around the compact-length varint's byte boundaries.
        let sizes = [1usize, 126, 127, 128, 16_383, 16_384, 70_000];
        for v in 4..=18i16 {
            let header = RequestHeader {
                api_key: 1,
                api_version: v,
                correlation_id: 77,
                client_id: None,
            };
            let mut resp = FetchResponse::default();
            resp.session_id = if v >= 7 { 5 } else { 0 };
            let mut files = Vec::new();
            let mut want = resp.clone();
            for t in 0..3usize {
                let mut tr = FetchableTopicResponse::default();
                if v >= 13 {
                    tr.topic_id = uuid::Uuid::from_u128(t as u128 + 1);
                } else {
                    tr.topic = TopicName(StrBytes::from_string(format!("t{t}")));
                }
                let mut wt = tr.clone();
                for (i, size) in sizes.iter().enumerate() {
                    let mut p = PartitionData::default();
                    p.partition_index = i as i32;
                    p.high_watermark = 1000 + i as i64;
                    p.aborted_transactions = Some(vec![AbortedTransaction::default()]);
                    let bytes: Vec<u8> = (0..*size).map(|x| (x * 7 + t + i) as u8).collect();
                    let mut w = p.clone();
                    w.records = Some(Bytes::from(bytes.clone()));
                    // Every third partition stays in memory, one empty.
                    match (t + i) % 3 {
                        0 => p.records = Some(Bytes::from(bytes)),
                        1 if i == 2 => {
                            p.records = Some(Bytes::new());
                            w.records = Some(Bytes::new());
                        }
                        _ => {
                            files.push((
                                (t, tr.partitions.len()),
                                file_of(dir.path(), &format!("{v}-{t}-{i}"), &bytes),
                            ));
                            p.records = Some(Bytes::new());
                        }
                    }
                    tr.partitions.push(p);
                    wt.partitions.push(w);
                }
                resp.responses.push(tr);
                want.responses.push(wt);
            }
            let expected = encode_response(&header, &ResponseKind::Fetch(want)).unwrap();
            let parts = encode_parts(&header, resp, files).unwrap();
            assert!(
                parts.iter().any(|p| matches!(p, Part::File(_))),
                "v{v}: served from files"
            );
            assert_eq!(wire(&parts), expected.to_vec(), "v{v}");
            assert_eq!(
                parts.iter().map(Part::len).sum::<usize>(),
                expected.len(),
                "v{v}: the length charged"
            );
        }
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
