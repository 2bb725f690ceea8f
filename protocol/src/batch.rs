//! RecordBatch v2: validation of produce input, the in-place offset patch,
//! header parsing for the read path, and per-record timestamps.
//!
//! Batches are stored byte-for-byte as the client sent them, with only the
//! two fields outside the CRC (baseOffset, partitionLeaderEpoch) rewritten by
//! the leader, so a fetch can serve file bytes unchanged. The exceptions are
//! a LogAppendTime topic ([`set_log_append_time`]) and a topic whose
//! compression.type rebuilds the batch with its codec ([`recompress`]). That makes this
//! module the gate: whatever passes `validate_batches` will be handed to every
//! consumer, so it checks the layout, the CRC32C and the record framing of
//! uncompressed batches. All input is untrusted; nothing here panics or
//! allocates in proportion to a length field it has not checked against the
//! bytes actually present.
//!
//! Layout (big-endian):
//! ```text
//!  0 baseOffset i64         | outside the CRC, rewritten by the leader
//!  8 batchLength i32        | bytes after this field
//! 12 partitionLeaderEpoch   | outside the CRC, rewritten by the leader
//! 16 magic i8               |
//! 17 crc u32                | CRC32C of bytes 21..end
//! 21 attributes i16
//! 23 lastOffsetDelta i32
//! 27 baseTimestamp i64
//! 35 maxTimestamp i64
//! 43 producerId i64
//! 51 producerEpoch i16
//! 53 baseSequence i32
//! 57 recordsCount i32
//! 61 records...
//! ```

use std::io::{self, Read};

use bytes::Bytes;
use kafka_protocol::records::Compression;

/// Bytes of a v2 batch header, up to and including recordsCount.
pub const BATCH_HEADER_LEN: usize = 61;
/// baseOffset + batchLength: the prefix that batchLength does not count.
pub const LOG_OVERHEAD: usize = 12;
/// Upper bound on the decompressed records of one batch on the read path, so
/// a compression bomb that passed the CRC cannot exhaust memory or CPU.
pub const MAX_DECOMPRESSED_BATCH: usize = 256 * 1024 * 1024;

const MAGIC_OFFSET: usize = 16;
const CRC_OFFSET: usize = 17;
const ATTRIBUTES_OFFSET: usize = 21;
/// maxTimestamp: after attributes (2), lastOffsetDelta (4), baseTimestamp (8).
const MAX_TIMESTAMP_OFFSET: usize = 35;
/// The smallest legal batchLength: a header with no records.
const MIN_BATCH_LENGTH: i32 = (BATCH_HEADER_LEN - LOG_OVERHEAD) as i32;

const COMPRESSION_MASK: i16 = 0x07;
/// Codec id of zstd in the attributes' low three bits.
const ZSTD_CODEC: i16 = 4;
const TIMESTAMP_TYPE_BIT: i16 = 1 << 3;
const TRANSACTIONAL_BIT: i16 = 1 << 4;
const CONTROL_BIT: i16 = 1 << 5;
const NO_PRODUCER_ID: i64 = -1;

/// Kafka error codes this module's errors map to.
const CORRUPT_MESSAGE: i16 = 2;
const MESSAGE_TOO_LARGE: i16 = 10;
const UNSUPPORTED_FOR_MESSAGE_FORMAT: i16 = 43;
const INVALID_RECORD: i16 = 87;

/// Why a produce payload or stored batch was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// The bytes are damaged: bad CRC, truncation, impossible lengths.
    #[error("corrupt record batch: {0}")]
    Corrupt(String),
    /// A message set older than v2 (or an unknown magic).
    #[error("unsupported record batch magic {0}")]
    UnsupportedMagic(i8),
    /// No batch at all.
    #[error("no record batch in produce data")]
    Empty,
    /// The bytes are intact but break a rule Kafka enforces on client input
    /// (count vs offset range, control batch from a client, sequence without
    /// producer id, malformed record inside the batch).
    #[error("invalid record batch: {0}")]
    Invalid(String),
    /// Rebuilding the batch with the topic's codec would exceed a bound:
    /// its records inflate past the limit, or the result is too large.
    #[error("record batch too large: {0}")]
    TooLarge(String),
}

impl BatchError {
    /// The Kafka error code a produce response carries for this error.
    pub fn kafka_error_code(&self) -> i16 {
        match self {
            BatchError::Corrupt(_) => CORRUPT_MESSAGE,
            BatchError::UnsupportedMagic(_) => UNSUPPORTED_FOR_MESSAGE_FORMAT,
            BatchError::Empty | BatchError::Invalid(_) => INVALID_RECORD,
            BatchError::TooLarge(_) => MESSAGE_TOO_LARGE,
        }
    }
}

fn corrupt(reason: impl Into<String>) -> BatchError {
    BatchError::Corrupt(reason.into())
}

fn invalid(reason: impl Into<String>) -> BatchError {
    BatchError::Invalid(reason.into())
}

/// What the leader needs from one validated batch of a produce payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchInfo {
    /// Where the batch starts in the payload.
    pub pos: usize,
    /// Total bytes of the batch, including the 12-byte log overhead.
    pub len: usize,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
    pub attributes: i16,
}

impl BatchInfo {
    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_BIT != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_BIT != 0
    }

    /// The batch's codec. Validation rejects unknown codecs, so this is total.
    pub fn compression(&self) -> Compression {
        compression_of(self.attributes).unwrap_or(Compression::None)
    }

    /// Whether timestamps are LogAppendTime (set by the broker) rather than
    /// CreateTime.
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & TIMESTAMP_TYPE_BIT != 0
    }

    /// Whether the batch comes from an idempotent or transactional producer.
    pub fn has_producer_id(&self) -> bool {
        self.producer_id != NO_PRODUCER_ID
    }
}

fn compression_of(attributes: i16) -> Option<Compression> {
    Some(match attributes & COMPRESSION_MASK {
        0 => Compression::None,
        1 => Compression::Gzip,
        2 => Compression::Snappy,
        3 => Compression::Lz4,
        4 => Compression::Zstd,
        _ => return None,
    })
}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

/// A parsed v2 batch header, for the read path (recovery scans, fetch,
/// ListOffsets). It does not check the CRC; call [`BatchHeader::verify_crc`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// Total bytes of the batch including the 12-byte log overhead.
    pub batch_len: usize,
    pub leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

impl BatchHeader {
    /// The offset of the batch's last record.
    pub fn last_offset(&self) -> i64 {
        self.base_offset
            .saturating_add(i64::from(self.last_offset_delta))
    }

    /// Whether `full_batch` (starting at the batch, at least `batch_len`
    /// bytes) has this header's magic 2 and a matching CRC32C.
    pub fn verify_crc(&self, full_batch: &[u8]) -> bool {
        self.magic == 2
            && full_batch
                .get(ATTRIBUTES_OFFSET..self.batch_len)
                .is_some_and(|covered| crc32c::crc32c(covered) == self.crc)
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_BIT != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_BIT != 0
    }

    /// The codec, or `None` for a codec id Kafka does not define.
    pub fn compression(&self) -> Option<Compression> {
        compression_of(self.attributes)
    }

    pub fn is_log_append_time(&self) -> bool {
        self.attributes & TIMESTAMP_TYPE_BIT != 0
    }
}

/// Parses the 61-byte header at the start of `buf`. `None` if fewer than 61
/// bytes are present or batchLength is too small to hold a header: on a
/// recovery scan either means the log ends here.
pub fn read_batch_header(buf: &[u8]) -> Option<BatchHeader> {
    let h = buf.get(..BATCH_HEADER_LEN)?;
    let batch_length = be_i32(h, 8);
    if batch_length < MIN_BATCH_LENGTH {
        return None;
    }
    Some(BatchHeader {
        base_offset: be_i64(h, 0),
        batch_len: LOG_OVERHEAD + batch_length as usize,
        leader_epoch: be_i32(h, 12),
        magic: h[MAGIC_OFFSET] as i8,
        crc: be_u32(h, CRC_OFFSET),
        attributes: be_i16(h, 21),
        last_offset_delta: be_i32(h, 23),
        base_timestamp: be_i64(h, 27),
        max_timestamp: be_i64(h, 35),
        producer_id: be_i64(h, 43),
        producer_epoch: be_i16(h, 51),
        base_sequence: be_i32(h, 53),
        records_count: be_i32(h, 57),
    })
}

/// Validates every batch of one partition's produce payload and returns what
/// the leader needs to assign offsets and check sequences.
///
/// Checks, per batch: magic 2, complete header, batchLength consistent with
/// the bytes present, CRC32C, a known codec, recordsCount > 0 and equal to
/// lastOffsetDelta + 1, no control batch, a non-negative base sequence when a
/// producer id is set, and, for uncompressed batches, that the records parse
/// and are exactly recordsCount long with offset deltas 0, 1, 2...
/// Compressed batches are not inflated here (that would cost the hot path a
/// decompression per produce); their records are checked by the consumer's
/// own CRC and parser.
///
/// Apache Kafka (Produce v3+) accepts exactly one batch per partition and
/// answers INVALID_RECORD otherwise; this function accepts several
/// concatenated batches and leaves that policy to the caller (`len()` of the
/// result).
pub fn validate_batches(records: &Bytes) -> Result<Vec<BatchInfo>, BatchError> {
    let buf: &[u8] = records;
    if buf.is_empty() {
        return Err(BatchError::Empty);
    }
    let mut infos = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let info = validate_one(buf, pos)?;
        pos += info.len;
        infos.push(info);
    }
    Ok(infos)
}

fn validate_one(buf: &[u8], pos: usize) -> Result<BatchInfo, BatchError> {
    let rest = &buf[pos..];
    // The magic decides the layout, so look at it first: a v0/v1 message set
    // must be reported as such, not as a corrupt v2 batch.
    let Some(&magic) = rest.get(MAGIC_OFFSET) else {
        return Err(corrupt(format!(
            "truncated batch header at byte {pos}: {} bytes left",
            rest.len()
        )));
    };
    let magic = magic as i8;
    if magic != 2 {
        return Err(BatchError::UnsupportedMagic(magic));
    }
    if rest.len() < BATCH_HEADER_LEN {
        return Err(corrupt(format!(
            "truncated batch header at byte {pos}: {} bytes left",
            rest.len()
        )));
    }
    let batch_length = be_i32(rest, 8);
    if batch_length < 0 {
        return Err(corrupt(format!("negative batch length {batch_length}")));
    }
    if batch_length < MIN_BATCH_LENGTH {
        return Err(corrupt(format!(
            "batch length {batch_length} is shorter than a batch header"
        )));
    }
    let len = LOG_OVERHEAD + batch_length as usize;
    let Some(batch) = rest.get(..len) else {
        return Err(corrupt(format!(
            "batch at byte {pos} declares {len} bytes but only {} remain",
            rest.len()
        )));
    };
    let crc = be_u32(batch, CRC_OFFSET);
    let actual = crc32c::crc32c(&batch[ATTRIBUTES_OFFSET..]);
    if crc != actual {
        return Err(corrupt(format!(
            "crc mismatch at byte {pos}: stored {crc:#010x}, computed {actual:#010x}"
        )));
    }
    let info = BatchInfo {
        pos,
        len,
        attributes: be_i16(batch, 21),
        last_offset_delta: be_i32(batch, 23),
        base_timestamp: be_i64(batch, 27),
        max_timestamp: be_i64(batch, 35),
        producer_id: be_i64(batch, 43),
        producer_epoch: be_i16(batch, 51),
        base_sequence: be_i32(batch, 53),
        records_count: be_i32(batch, 57),
    };
    let Some(compression) = compression_of(info.attributes) else {
        return Err(invalid(format!(
            "unknown compression codec {}",
            info.attributes & COMPRESSION_MASK
        )));
    };
    if info.records_count <= 0 {
        return Err(invalid(format!(
            "invalid reported record count {}",
            info.records_count
        )));
    }
    if info.last_offset_delta < 0
        || info.last_offset_delta.checked_add(1) != Some(info.records_count)
    {
        return Err(invalid(format!(
            "last offset delta {} inconsistent with record count {}",
            info.last_offset_delta, info.records_count
        )));
    }
    if info.is_control() {
        return Err(invalid("clients may not write control batches"));
    }
    if info.has_producer_id() && info.base_sequence < 0 {
        return Err(invalid(format!(
            "negative base sequence {} with producer id {}",
            info.base_sequence, info.producer_id
        )));
    }
    if compression == Compression::None {
        let mut expected_delta = 0i32;
        walk_records(
            InPlace(&batch[BATCH_HEADER_LEN..]),
            info.records_count,
            true,
            |rec| {
                if rec.offset_delta != expected_delta {
                    return Err(invalid(format!(
                        "record offset delta {} where {expected_delta} was expected",
                        rec.offset_delta
                    )));
                }
                expected_delta = expected_delta.wrapping_add(1);
                Ok(())
            },
        )
        .map_err(|e| match e {
            BatchError::Corrupt(r) => BatchError::Invalid(r),
            other => other,
        })?;
    }
    Ok(info)
}

/// Where the first zstd-compressed batch starts in `records` (stored
/// batches as a fetch serves them), if any. Clients older than Fetch v10
/// cannot read zstd (KIP-110), so the fetch path serves them only the bytes
/// before it, or an error when it comes first.
///
/// Walks batch headers by batchLength without checking CRCs (the bytes were
/// validated on produce). A trailing batch cut short by the fetch size still
/// counts when its attributes are present; bytes too short to show them carry
/// no decodable record and are left as they are.
pub fn first_zstd_batch(records: &[u8]) -> Option<usize> {
    let mut pos = 0usize;
    while let Some(rest) = records.get(pos..) {
        if rest.len() < ATTRIBUTES_OFFSET + 2 {
            return None;
        }
        if be_i16(rest, ATTRIBUTES_OFFSET) & COMPRESSION_MASK == ZSTD_CODEC {
            return Some(pos);
        }
        let batch_length = be_i32(rest, 8);
        if batch_length < MIN_BATCH_LENGTH {
            return None;
        }
        pos = pos.checked_add(LOG_OVERHEAD + batch_length as usize)?;
    }
    None
}

/// How many of a batch's first bytes [`patch_batch`] may change (baseOffset,
/// batchLength, partitionLeaderEpoch): the rest of the batch goes to the log
/// exactly as the client sent it.
pub const PATCHED_HEAD: usize = MAGIC_OFFSET;

/// Writes baseOffset and partitionLeaderEpoch into the batch at the start of
/// `buf`. Both lie outside the CRC, so the batch stays valid. A buffer shorter
/// than the two fields is left untouched (callers pass validated batches).
pub fn patch_batch(buf: &mut [u8], base_offset: i64, leader_epoch: i32) {
    if let Some(head) = buf.get_mut(..MAGIC_OFFSET) {
        head[0..8].copy_from_slice(&base_offset.to_be_bytes());
        head[12..16].copy_from_slice(&leader_epoch.to_be_bytes());
    }
}

/// Makes the validated batch at the start of `buf` a LogAppendTime batch
/// stamped `now_ms`, as Kafka's leader does at append: the timestamp-type
/// attribute is set and maxTimestamp becomes `now_ms` (every record then
/// reads as `now_ms`; the records themselves are not touched, compressed
/// or not), and the batch CRC, which covers both, is recomputed. A buffer
/// shorter than its header or its declared length is left untouched
/// (callers pass validated batches).
pub fn set_log_append_time(buf: &mut [u8], now_ms: i64) {
    let Some(h) = read_batch_header(buf) else {
        return;
    };
    if h.magic != 2 || buf.len() < h.batch_len {
        return;
    }
    let attrs = (h.attributes | TIMESTAMP_TYPE_BIT).to_be_bytes();
    buf[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2].copy_from_slice(&attrs);
    buf[MAX_TIMESTAMP_OFFSET..MAX_TIMESTAMP_OFFSET + 8].copy_from_slice(&now_ms.to_be_bytes());
    let crc = crc32c::crc32c(&buf[ATTRIBUTES_OFFSET..h.batch_len]);
    buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
}

/// The absolute offset and timestamp of every record of one stored batch,
/// decompressing if needed, for ListOffsets by timestamp.
///
/// With LogAppendTime every record carries the batch's maxTimestamp, as in
/// Kafka. The batch CRC is not checked here (use [`BatchHeader::verify_crc`]);
/// reading stops after recordsCount records. Decompression is streamed and capped at
/// [`MAX_DECOMPRESSED_BATCH`] bytes.
pub fn record_timestamps(batch: &[u8]) -> Result<Vec<(i64, i64)>, BatchError> {
    let Some(header) = read_batch_header(batch) else {
        return Err(corrupt("truncated or impossible batch header"));
    };
    if header.magic != 2 {
        return Err(BatchError::UnsupportedMagic(header.magic));
    }
    let Some(full) = batch.get(..header.batch_len) else {
        return Err(corrupt(format!(
            "batch declares {} bytes but only {} are present",
            header.batch_len,
            batch.len()
        )));
    };
    if header.records_count < 0 {
        return Err(corrupt(format!(
            "negative record count {}",
            header.records_count
        )));
    }
    let Some(compression) = header.compression() else {
        return Err(corrupt(format!(
            "unknown compression codec {}",
            header.attributes & COMPRESSION_MASK
        )));
    };
    let payload = &full[BATCH_HEADER_LEN..];
    let log_append = header.is_log_append_time();
    // Reserve by what the bytes could hold, never by the declared count.
    let mut out = Vec::with_capacity((header.records_count as usize).min(payload.len() / 7 + 1));
    let mut push = |rec: RecordMeta| {
        let offset = header
            .base_offset
            .checked_add(i64::from(rec.offset_delta))
            .ok_or_else(|| corrupt("record offset overflows"))?;
        let ts = if log_append {
            header.max_timestamp
        } else {
            // Java computes this in wrapping long arithmetic; match it.
            header.base_timestamp.wrapping_add(rec.timestamp_delta)
        };
        out.push((offset, ts));
        Ok(())
    };
    let count = header.records_count;
    let limited = |r| Limited::new(r, MAX_DECOMPRESSED_BATCH);
    match compression {
        Compression::None => walk_records(InPlace(payload), count, true, &mut push)?,
        Compression::Gzip => walk_records(
            Copied::new(limited(Box::new(flate2::read::MultiGzDecoder::new(
                payload,
            )))),
            count,
            false,
            &mut push,
        )?,
        Compression::Lz4 => {
            let d = lz4::Decoder::new(payload).map_err(|e| corrupt(format!("lz4: {e}")))?;
            walk_records(Copied::new(limited(Box::new(d))), count, false, &mut push)?
        }
        Compression::Zstd => {
            let d = zstd::stream::read::Decoder::with_buffer(payload)
                .map_err(|e| corrupt(format!("zstd: {e}")))?;
            walk_records(Copied::new(limited(Box::new(d))), count, false, &mut push)?
        }
        Compression::Snappy => {
            let raw = snappy_decompress(payload, MAX_DECOMPRESSED_BATCH)?;
            walk_records(InPlace(raw.as_slice()), count, false, &mut push)?
        }
    }
    Ok(out)
}

/// The fields of one record the broker needs.
#[derive(Debug, Clone, Copy)]
struct RecordMeta {
    timestamp_delta: i64,
    offset_delta: i32,
}

/// Where [`walk_records`] takes records from. An uncompressed batch is a
/// slice and each record is parsed where it lies; a decompressing reader's
/// records are copied out one at a time.
trait RecordSource {
    /// The next record's size varint.
    fn size(&mut self) -> io::Result<i32>;
    /// The next `size` bytes; `Ok(Err(got))` if only `got` remain.
    fn body(&mut self, size: u64) -> io::Result<Result<&[u8], u64>>;
    /// Whether any byte remains.
    fn has_more(&mut self) -> io::Result<bool>;
}

/// Records parsed in place.
struct InPlace<'a>(&'a [u8]);

impl RecordSource for InPlace<'_> {
    fn size(&mut self) -> io::Result<i32> {
        read_varint_io(&mut self.0)
    }

    fn body(&mut self, size: u64) -> io::Result<Result<&[u8], u64>> {
        let have = self.0.len();
        match usize::try_from(size) {
            Ok(n) if n <= have => {
                let (body, rest) = self.0.split_at(n);
                self.0 = rest;
                Ok(Ok(body))
            }
            _ => {
                self.0 = &[];
                Ok(Err(have as u64))
            }
        }
    }

    fn has_more(&mut self) -> io::Result<bool> {
        Ok(!self.0.is_empty())
    }
}

/// Records copied out of a reader, one reused buffer.
struct Copied<R> {
    src: R,
    body: Vec<u8>,
}

impl<R: Read> Copied<R> {
    fn new(src: R) -> Self {
        Copied {
            src,
            body: Vec::new(),
        }
    }
}

impl<R: Read> RecordSource for Copied<R> {
    fn size(&mut self) -> io::Result<i32> {
        read_varint_io(&mut self.src)
    }

    fn body(&mut self, size: u64) -> io::Result<Result<&[u8], u64>> {
        self.body.clear();
        // `take` + `read_to_end` grows with the bytes actually produced, so a
        // huge declared size costs nothing unless the data is really there.
        let got = self.src.by_ref().take(size).read_to_end(&mut self.body)?;
        Ok(if got as u64 == size {
            Ok(&self.body)
        } else {
            Err(got as u64)
        })
    }

    fn has_more(&mut self) -> io::Result<bool> {
        let mut probe = [0u8; 1];
        Ok(self.src.read(&mut probe)? != 0)
    }
}

/// Parses `count` records from `src`, calling `f` for each. Every record's
/// framing is checked (size, key, value, headers). With `exact`, bytes left
/// after the last record are an error, as in Kafka's "records still remaining".
fn walk_records(
    mut src: impl RecordSource,
    count: i32,
    exact: bool,
    mut f: impl FnMut(RecordMeta) -> Result<(), BatchError>,
) -> Result<(), BatchError> {
    for i in 0..count {
        let size = src
            .size()
            .map_err(|e| corrupt(format!("record {i}: size: {e}")))?;
        let size = u64::try_from(size)
            .map_err(|_| corrupt(format!("record {i}: negative size {size}")))?;
        let body = match src.body(size) {
            Ok(Ok(body)) => body,
            Ok(Err(got)) => {
                return Err(corrupt(format!(
                    "record {i} declares {size} bytes but only {got} remain"
                )))
            }
            Err(e) => return Err(corrupt(format!("record {i}: {e}"))),
        };
        let meta = parse_record(body).map_err(|r| corrupt(format!("record {i}: {r}")))?;
        f(meta)?;
    }
    if exact {
        let more = src
            .has_more()
            .map_err(|e| corrupt(format!("after last record: {e}")))?;
        if more {
            return Err(corrupt("bytes remain after the declared record count"));
        }
    }
    Ok(())
}

/// Checks one record body (after its size varint) and returns its deltas.
fn parse_record(body: &[u8]) -> Result<RecordMeta, String> {
    let mut c = Cursor { buf: body, pos: 0 };
    let _attributes = c.byte().ok_or("truncated attributes")?;
    let timestamp_delta = c.varlong().ok_or("bad timestamp delta")?;
    let offset_delta = c.varint().ok_or("bad offset delta")?;
    c.bytes_field(true).ok_or("bad key")?;
    c.bytes_field(true).ok_or("bad value")?;
    let headers = c.varint().ok_or("bad header count")?;
    if headers < 0 {
        return Err(format!("negative header count {headers}"));
    }
    for _ in 0..headers {
        c.bytes_field(false).ok_or("bad header key")?;
        c.bytes_field(true).ok_or("bad header value")?;
    }
    if c.pos != body.len() {
        return Err(format!(
            "record size says {} bytes but fields end at {}",
            body.len(),
            c.pos
        ));
    }
    Ok(RecordMeta {
        timestamp_delta,
        offset_delta,
    })
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn uvarlong(&mut self, max_bytes: u32) -> Option<u64> {
        let mut value = 0u64;
        for i in 0..max_bytes {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << (i * 7);
            if b < 0x80 {
                return Some(value);
            }
        }
        None
    }

    fn varint(&mut self) -> Option<i32> {
        let z = u32::try_from(self.uvarlong(5)?).ok()?;
        Some(((z >> 1) as i32) ^ -((z & 1) as i32))
    }

    fn varlong(&mut self) -> Option<i64> {
        let z = self.uvarlong(10)?;
        Some(((z >> 1) as i64) ^ -((z & 1) as i64))
    }

    /// A varint length then that many bytes; -1 (null) if `nullable`.
    fn bytes_field(&mut self, nullable: bool) -> Option<()> {
        let len = self.varint()?;
        if len == -1 && nullable {
            return Some(());
        }
        let len = usize::try_from(len).ok()?;
        let end = self.pos.checked_add(len)?;
        if end > self.buf.len() {
            return None;
        }
        self.pos = end;
        Some(())
    }
}

/// A zigzag varint (at most 5 bytes) from a stream.
fn read_varint_io<R: Read>(src: &mut R) -> io::Result<i32> {
    let mut value = 0u64;
    for i in 0..5 {
        let mut b = [0u8; 1];
        src.read_exact(&mut b)?;
        value |= u64::from(b[0] & 0x7f) << (i * 7);
        if b[0] < 0x80 {
            let z = u32::try_from(value)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "varint overflows"))?;
            return Ok(((z >> 1) as i32) ^ -((z & 1) as i32));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "varint too long",
    ))
}

/// A reader that fails once more than `left` bytes have come out of it.
struct Limited<'a> {
    inner: Box<dyn Read + 'a>,
    left: usize,
}

impl<'a> Limited<'a> {
    fn new(inner: Box<dyn Read + 'a>, limit: usize) -> Self {
        Self { inner, left: limit }
    }
}

impl Read for Limited<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Ask for one byte more than allowed so overflow is detected rather
        // than silently truncated.
        let want = buf.len().min(self.left.saturating_add(1));
        let n = self.inner.read(&mut buf[..want])?;
        if n > self.left {
            return Err(io::Error::other(
                "decompressed batch exceeds the size limit",
            ));
        }
        self.left -= n;
        Ok(n)
    }
}

/// Kafka's snappy: the xerial framing (8-byte magic, version, compat, then
/// length-prefixed raw blocks) or, failing the magic, one raw block.
fn snappy_decompress(src: &[u8], limit: usize) -> Result<Vec<u8>, BatchError> {
    const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";
    const XERIAL_HEADER_LEN: usize = 16;
    let mut out = Vec::new();
    let decode_block = |block: &[u8], out: &mut Vec<u8>| -> Result<(), BatchError> {
        let n = snap::raw::decompress_len(block).map_err(|e| corrupt(format!("snappy: {e}")))?;
        if n > limit.saturating_sub(out.len()) {
            return Err(BatchError::TooLarge(format!(
                "records decompress to more than {limit} bytes"
            )));
        }
        let start = out.len();
        out.resize(start + n, 0);
        let written = snap::raw::Decoder::new()
            .decompress(block, &mut out[start..])
            .map_err(|e| corrupt(format!("snappy: {e}")))?;
        out.truncate(start + written);
        Ok(())
    };
    if !src.starts_with(XERIAL_MAGIC) {
        decode_block(src, &mut out)?;
        return Ok(out);
    }
    let mut rest = src
        .get(XERIAL_HEADER_LEN..)
        .ok_or_else(|| corrupt("snappy: truncated header"))?;
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| corrupt("snappy: truncated block length"))?;
        let len = u32::from_be_bytes(*len) as usize;
        let block = tail
            .get(..len)
            .ok_or_else(|| corrupt("snappy: truncated block"))?;
        decode_block(block, &mut out)?;
        rest = &tail[len..];
    }
    Ok(out)
}

mod recompress;
pub use recompress::{
    recompress, recompress_batches, Codec, GZIP_DEFAULT_LEVEL, LZ4_DEFAULT_LEVEL,
    ZSTD_DEFAULT_LEVEL,
};

#[cfg(test)]
mod tests;
