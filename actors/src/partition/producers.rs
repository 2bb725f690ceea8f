//! Idempotent-producer state of one partition, as a pure state machine (no
//! actix, no files): per producer id its epoch and its last
//! [`BATCHES_KEPT`] batches (first/last sequence, base/last offset, batch
//! timestamp), the checks Kafka makes before an idempotent batch is written
//! (duplicate, sequence gap, stale epoch, epoch bump, wrap at `i32::MAX`),
//! expiry of idle producers, and the snapshot encoding.
//!
//! The partition leader owns one [`ProducerStates`] inside its
//! [`super::log::PartitionLog`]. Appends are pipelined (written now, fsynced
//! later), so the state moves at write-assign time: a batch is checked with
//! [`ProducerStates::check`] against the state *including* every batch
//! written before it, and [`ProducerStates::apply`] runs only once the
//! bytes reached the file. A write that fails applies nothing; a failed
//! fsync stops the leader, and its reopen rebuilds the state from what is
//! durable, so the state never claims a batch the log does not hold.
//!
//! The rules follow Apache Kafka's `ProducerAppendInfo` (3.x):
//! * a batch whose (epoch, first sequence, last sequence) equals one of the
//!   producer's last five is a duplicate: nothing is written and the client
//!   gets success with the original offsets;
//! * an epoch below the producer's current one is INVALID_PRODUCER_EPOCH;
//! * a higher epoch (KIP-360 bump) must start at sequence 0;
//! * in the same epoch the first sequence must follow the last one
//!   (`last + 1`, or 0 after `i32::MAX`), else OUT_OF_ORDER_SEQUENCE_NUMBER;
//! * a producer id with no state here (new, expired, or its records
//!   removed by retention) is accepted at any sequence: since KIP-360
//!   (Kafka 2.5) the broker no longer answers UNKNOWN_PRODUCER_ID for that,
//!   it starts tracking the producer from the batch it sees.
//!
//! Transactions (KIP-98) add, per producer, the first offset of its open
//! transaction at this partition and the coordinator epoch of its last
//! marker: a transactional batch opens a transaction if none is open; a
//! COMMIT/ABORT marker ([`ProducerStates::check_marker`],
//! [`ProducerStates::apply_marker`]) closes it; a non-transactional batch
//! while one is open is INVALID_TXN_STATE, as in Kafka. A producer with an
//! open transaction never expires and is never forgotten by retention: it
//! holds the last stable offset until its marker arrives.

use std::collections::{HashMap, VecDeque};

/// How many of a producer's most recent batches are kept for duplicate
/// detection (the client's `max.in.flight.requests.per.connection` bound).
pub const BATCHES_KEPT: usize = 5;

/// Default `producer.id.expiration.ms` (one day, as in Kafka).
pub const DEFAULT_EXPIRATION_MS: i64 = 86_400_000;

/// One written batch of a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMeta {
    /// Sequence of the batch's first record.
    pub first_seq: i32,
    /// Sequence of the batch's last record (wraps after `i32::MAX`).
    pub last_seq: i32,
    /// Offset assigned to the first record.
    pub base_offset: i64,
    /// Offset assigned to the last record.
    pub last_offset: i64,
    /// The batch's max timestamp.
    pub timestamp: i64,
}

/// What is known of one producer id in this partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerEntry {
    /// The producer's current epoch.
    pub epoch: i16,
    /// Its last batches, oldest first, at most [`BATCHES_KEPT`].
    pub batches: VecDeque<BatchMeta>,
    /// Broker wall-clock time of its last write (or of the rebuild that
    /// found it), for expiry. Never compared with another host's clock for
    /// anything but expiry, where a skew only moves it by the skew.
    pub last_seen_ms: i64,
    /// Coordinator epoch of the last transaction marker (-1: none yet).
    pub coordinator_epoch: i32,
    /// First offset of the producer's open transaction here, if any.
    pub txn_first_offset: Option<i64>,
}

impl ProducerEntry {
    fn fresh(epoch: i16, now_ms: i64) -> Self {
        Self {
            epoch,
            batches: VecDeque::with_capacity(BATCHES_KEPT),
            last_seen_ms: now_ms,
            coordinator_epoch: -1,
            txn_first_offset: None,
        }
    }
}

/// An idempotent batch about to be written, with the offsets it would get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Incoming {
    /// Producer id (>= 0).
    pub producer_id: i64,
    /// Producer epoch.
    pub epoch: i16,
    /// Base sequence (>= 0; validated by the protocol crate).
    pub first_seq: i32,
    /// `last_offset_delta` of the batch.
    pub last_offset_delta: i32,
    /// Offset the first record would get.
    pub base_offset: i64,
    /// The batch's max timestamp.
    pub timestamp: i64,
    /// Whether the batch belongs to a transaction (attribute bit 4).
    pub transactional: bool,
}

impl Incoming {
    /// The batch's last sequence, wrapping after `i32::MAX` as Kafka's
    /// `DefaultRecordBatch.incrementSequence` does.
    pub fn last_seq(&self) -> i32 {
        increment_sequence(self.first_seq, self.last_offset_delta)
    }

    fn meta(&self) -> BatchMeta {
        BatchMeta {
            first_seq: self.first_seq,
            last_seq: self.last_seq(),
            base_offset: self.base_offset,
            last_offset: self.base_offset + i64::from(self.last_offset_delta),
            timestamp: self.timestamp,
        }
    }
}

/// `seq + delta` wrapping past `i32::MAX` to 0.
pub fn increment_sequence(seq: i32, delta: i32) -> i32 {
    if seq > i32::MAX - delta {
        delta - (i32::MAX - seq) - 1
    } else {
        seq + delta
    }
}

/// Whether `next` follows `last` (wrapping after `i32::MAX`).
fn in_sequence(last: i32, next: i32) -> bool {
    i64::from(next) == i64::from(last) + 1 || (next == 0 && last == i32::MAX)
}

/// Why an idempotent batch is refused (nothing is written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SequenceError {
    /// OUT_OF_ORDER_SEQUENCE_NUMBER (45).
    #[error(
        "out of order sequence for producer {producer_id} epoch {epoch}: {found} after {last:?}"
    )]
    OutOfOrder {
        /// The producer.
        producer_id: i64,
        /// The batch's epoch.
        epoch: i16,
        /// The batch's first sequence.
        found: i32,
        /// The producer's last sequence in its current epoch (`None`: the
        /// batch opens a new epoch and must start at 0).
        last: Option<i32>,
    },
    /// INVALID_PRODUCER_EPOCH (47).
    #[error("producer {producer_id} epoch {epoch} is older than its current epoch {current}")]
    StaleEpoch {
        /// The producer.
        producer_id: i64,
        /// The batch's epoch.
        epoch: i16,
        /// The epoch already seen.
        current: i16,
    },
    /// INVALID_TXN_STATE (48): a non-transactional batch from a producer
    /// whose transaction is open here.
    #[error("producer {producer_id} has an open transaction from offset {first_offset}")]
    InvalidTxnState {
        /// The producer.
        producer_id: i64,
        /// Where its open transaction starts.
        first_offset: i64,
    },
    /// TRANSACTION_COORDINATOR_FENCED (52): a marker from a coordinator
    /// epoch older than the one last accepted for the producer.
    #[error(
        "marker for producer {producer_id} from coordinator epoch {coordinator_epoch}, \
         older than {current}"
    )]
    CoordinatorFenced {
        /// The producer.
        producer_id: i64,
        /// The marker's coordinator epoch.
        coordinator_epoch: i32,
        /// The coordinator epoch last accepted.
        current: i32,
    },
}

/// What to do with the idempotent batches of one append.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Write them; then [`ProducerStates::apply`] the staged entries.
    Append(Staged),
    /// The first duplicate found: write nothing, answer with its offsets
    /// (as Kafka, which stops at the first duplicate of a request).
    Duplicate(BatchMeta),
}

/// The entries an append will leave behind, applied once it is written.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Staged(Vec<(i64, ProducerEntry)>);

impl Staged {
    /// Whether no idempotent batch is involved.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The transactions the staged entries hold open: (first offset,
    /// producer id), including those opened by this append.
    pub fn opened(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.0
            .iter()
            .filter_map(|(p, e)| e.txn_first_offset.map(|f| (f, *p)))
    }
}

/// See module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerStates {
    producers: HashMap<i64, ProducerEntry>,
}

impl ProducerStates {
    /// No producer known.
    pub fn new() -> Self {
        Self::default()
    }

    /// Producers tracked.
    pub fn len(&self) -> usize {
        self.producers.len()
    }

    /// Whether no producer is tracked.
    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// The entry of `producer_id`, if tracked.
    pub fn get(&self, producer_id: i64) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    /// Every tracked producer, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (i64, &ProducerEntry)> {
        self.producers.iter().map(|(p, e)| (*p, e))
    }

    /// Check the idempotent batches of one append, in write order, each
    /// against the state left by the ones before it. Pure: nothing changes
    /// until [`Self::apply`].
    pub fn check(&self, batches: &[Incoming], now_ms: i64) -> Result<Verdict, SequenceError> {
        let mut staged: Vec<(i64, ProducerEntry)> = Vec::new();
        for b in batches {
            let cur = match staged.iter().position(|(p, _)| *p == b.producer_id) {
                Some(i) => Some(&staged[i].1),
                None => self.producers.get(&b.producer_id),
            };
            if let Some(e) = cur {
                if e.epoch == b.epoch {
                    if let Some(dup) = e
                        .batches
                        .iter()
                        .find(|m| m.first_seq == b.first_seq && m.last_seq == b.last_seq())
                    {
                        return Ok(Verdict::Duplicate(*dup));
                    }
                }
                check_one(e, b)?;
                if let (false, Some(first)) = (b.transactional, e.txn_first_offset) {
                    return Err(SequenceError::InvalidTxnState {
                        producer_id: b.producer_id,
                        first_offset: first,
                    });
                }
            }
            let mut next = match cur {
                Some(e) if e.epoch == b.epoch => e.clone(),
                // A bumped epoch restarts the sequences; the transaction
                // and coordinator epoch carry over (as Kafka's
                // `maybeUpdateProducerEpoch`).
                Some(e) => ProducerEntry {
                    coordinator_epoch: e.coordinator_epoch,
                    txn_first_offset: e.txn_first_offset,
                    ..ProducerEntry::fresh(b.epoch, now_ms)
                },
                None => ProducerEntry::fresh(b.epoch, now_ms),
            };
            if next.batches.len() == BATCHES_KEPT {
                next.batches.pop_front();
            }
            next.batches.push_back(b.meta());
            next.last_seen_ms = now_ms;
            if b.transactional && next.txn_first_offset.is_none() {
                next.txn_first_offset = Some(b.base_offset);
            }
            match staged.iter().position(|(p, _)| *p == b.producer_id) {
                Some(i) => staged[i].1 = next,
                None => staged.push((b.producer_id, next)),
            }
        }
        Ok(Verdict::Append(Staged(staged)))
    }

    /// The checked batches were written: make them the state.
    pub fn apply(&mut self, staged: Staged) {
        for (pid, e) in staged.0 {
            self.producers.insert(pid, e);
        }
    }

    /// Record a batch read back from the log (rebuild after a snapshot):
    /// no checks, the log is the truth. A batch of an older epoch than
    /// the one known cannot follow it in a valid log and is ignored.
    pub fn replay(&mut self, b: &Incoming, seen_ms: i64) {
        let e = self
            .producers
            .entry(b.producer_id)
            .or_insert_with(|| ProducerEntry::fresh(b.epoch, seen_ms));
        if b.epoch < e.epoch {
            return;
        }
        if b.epoch > e.epoch {
            e.epoch = b.epoch;
            e.batches.clear();
        }
        if e.batches.len() == BATCHES_KEPT {
            e.batches.pop_front();
        }
        e.batches.push_back(b.meta());
        e.last_seen_ms = e.last_seen_ms.max(seen_ms);
        if b.transactional && e.txn_first_offset.is_none() {
            e.txn_first_offset = Some(b.base_offset);
        }
    }

    /// Whether a COMMIT/ABORT marker of `producer_id` at `epoch` may be
    /// written: not if the producer is known here at a newer epoch
    /// (INVALID_PRODUCER_EPOCH, as Kafka's `appendEndTxnMarker`). A marker
    /// for a producer with no open transaction (a re-sent marker, or one
    /// for a partition the producer never wrote) is allowed: it changes
    /// nothing a reader sees.
    ///
    /// A marker from a coordinator epoch older than the last one accepted
    /// for this producer is refused (TRANSACTION_COORDINATOR_FENCED, as
    /// Kafka's `ProducerAppendInfo.checkCoordinatorEpoch`): the shard moved
    /// to a newer owner, whose decision may differ from the zombie's.
    pub fn check_marker(
        &self,
        producer_id: i64,
        epoch: i16,
        coordinator_epoch: i32,
    ) -> Result<(), SequenceError> {
        match self.producers.get(&producer_id) {
            Some(e) if epoch < e.epoch => Err(SequenceError::StaleEpoch {
                producer_id,
                epoch,
                current: e.epoch,
            }),
            Some(e) if coordinator_epoch < e.coordinator_epoch => {
                Err(SequenceError::CoordinatorFenced {
                    producer_id,
                    coordinator_epoch,
                    current: e.coordinator_epoch,
                })
            }
            _ => Ok(()),
        }
    }

    /// A marker of `producer_id` was written (or read back from the log):
    /// close its open transaction and return where it started. A newer
    /// epoch becomes the producer's (sequences restart); a marker of an
    /// older epoch than the one known (only in a replay) changes nothing.
    pub fn apply_marker(
        &mut self,
        producer_id: i64,
        epoch: i16,
        coordinator_epoch: i32,
        now_ms: i64,
    ) -> Option<i64> {
        let e = self
            .producers
            .entry(producer_id)
            .or_insert_with(|| ProducerEntry::fresh(epoch, now_ms));
        if epoch < e.epoch {
            return None;
        }
        if epoch > e.epoch {
            e.epoch = epoch;
            e.batches.clear();
        }
        e.coordinator_epoch = coordinator_epoch;
        e.last_seen_ms = e.last_seen_ms.max(now_ms);
        e.txn_first_offset.take()
    }

    /// Every open transaction: (first offset, producer id).
    pub fn open_transactions(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.producers
            .iter()
            .filter_map(|(p, e)| e.txn_first_offset.map(|f| (f, *p)))
    }

    /// Forget producers not seen for `expiration_ms` (Kafka's
    /// `producer.id.expiration.ms`); returns how many were removed.
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        // A producer with an open transaction holds the last stable
        // offset: it stays until its marker (the coordinator's timeout
        // aborts it), as in Kafka.
        self.producers.retain(|_, e| {
            e.txn_first_offset.is_some() || now_ms.saturating_sub(e.last_seen_ms) < expiration_ms
        });
        before - self.producers.len()
    }

    /// Forget batches below `log_start` (retention removed them); a
    /// producer left with none is forgotten, as Kafka does.
    pub fn truncate_head(&mut self, log_start: i64) {
        self.producers.retain(|_, e| {
            e.batches.retain(|m| m.last_offset >= log_start);
            !e.batches.is_empty() || e.txn_first_offset.is_some()
        });
    }

    /// The snapshot of this state as of `offset` (every batch below it
    /// is included): magic, offset, entries in producer-id order, CRC32C
    /// of everything before it. Big-endian throughout. Format 2 (`KPS2`)
    /// adds, after each entry's last-seen time, the coordinator epoch (i32)
    /// and the open transaction's first offset (i64, -1: none); format 1
    /// (`KPS1`, before transactions) still decodes.
    pub fn encode(&self, offset: i64) -> Vec<u8> {
        let mut ids: Vec<&i64> = self.producers.keys().collect();
        ids.sort();
        let mut out = Vec::with_capacity(16 + ids.len() * (31 + BATCHES_KEPT * 32));
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&(ids.len() as u32).to_be_bytes());
        for pid in ids {
            let e = &self.producers[pid];
            out.extend_from_slice(&pid.to_be_bytes());
            out.extend_from_slice(&e.epoch.to_be_bytes());
            out.extend_from_slice(&e.last_seen_ms.to_be_bytes());
            out.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
            out.extend_from_slice(&e.txn_first_offset.unwrap_or(-1).to_be_bytes());
            out.push(e.batches.len() as u8);
            for m in &e.batches {
                out.extend_from_slice(&m.first_seq.to_be_bytes());
                out.extend_from_slice(&m.last_seq.to_be_bytes());
                out.extend_from_slice(&m.base_offset.to_be_bytes());
                out.extend_from_slice(&m.last_offset.to_be_bytes());
                out.extend_from_slice(&m.timestamp.to_be_bytes());
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    /// Inverse of [`Self::encode`]: `(offset, state)`, or `None` if the
    /// bytes are torn, corrupt or not a snapshot (the caller falls back to
    /// an older one).
    pub fn decode(bytes: &[u8]) -> Option<(i64, Self)> {
        let body_len = bytes.len().checked_sub(4)?;
        let (body, crc) = bytes.split_at(body_len);
        if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().ok()?) {
            return None;
        }
        let mut r = Reader(body);
        let v2 = match r.take(4)? {
            m if m == SNAPSHOT_MAGIC => true,
            m if m == SNAPSHOT_MAGIC_V1 => false,
            _ => return None,
        };
        let offset = r.i64()?;
        let count = r.u32()? as usize;
        let mut producers = HashMap::with_capacity(count.min(1 << 16));
        for _ in 0..count {
            let pid = r.i64()?;
            let epoch = r.i16()?;
            let last_seen_ms = r.i64()?;
            let (coordinator_epoch, txn_first_offset) = if v2 {
                let c = r.i32()?;
                let f = r.i64()?;
                (c, (f >= 0).then_some(f))
            } else {
                (-1, None)
            };
            let n = r.take(1)?[0] as usize;
            if n > BATCHES_KEPT {
                return None;
            }
            let mut batches = VecDeque::with_capacity(BATCHES_KEPT);
            for _ in 0..n {
                batches.push_back(BatchMeta {
                    first_seq: r.i32()?,
                    last_seq: r.i32()?,
                    base_offset: r.i64()?,
                    last_offset: r.i64()?,
                    timestamp: r.i64()?,
                });
            }
            producers.insert(
                pid,
                ProducerEntry {
                    epoch,
                    batches,
                    last_seen_ms,
                    coordinator_epoch,
                    txn_first_offset,
                },
            );
        }
        if !r.0.is_empty() {
            return None;
        }
        Some((offset, Self { producers }))
    }
}

/// First bytes of a producer-state snapshot (format version 2: with
/// transactions).
const SNAPSHOT_MAGIC: &[u8; 4] = b"KPS2";
/// Format version 1 (idempotence only): still read, never written.
const SNAPSHOT_MAGIC_V1: &[u8; 4] = b"KPS1";

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// KIP-890 part 1 at the partition leader: a transactional batch that
/// would *open* a transaction here (its producer has none open) is written
/// only after the transaction coordinator confirmed that the partition is
/// in the producer's ongoing transaction. Without that check a produce
/// request delayed past its transaction's marker opens a transaction no
/// coordinator knows of, which holds the last stable offset forever (a
/// "hanging transaction").
///
/// Kafka keeps a `VerificationGuard` per producer in its producer state
/// manager; this is the same idea, in memory only (a new leader has none
/// and verifies again): [`Self::admit`] hands out a token for the producer
/// when verification is needed, the caller asks the coordinator and
/// retries the append with the token, and the token is honoured only while
/// it is still the producer's — a marker for the producer in between
/// ([`Self::ended`]) withdraws it, so a verification that predates the end
/// of the transaction it verified cannot open a new one. Batches of a
/// producer whose transaction is already open here are admitted without
/// asking (the common path: only a transaction's first batch per partition
/// pays the round trip).
#[derive(Debug, Default)]
pub struct TxnVerifications {
    /// Producer id → the token of its verification in flight.
    pending: HashMap<i64, u64>,
    next: u64,
}

/// Tokens kept at most; beyond, the oldest are not told apart and all are
/// withdrawn (their appends are refused INVALID_TXN_STATE, which a client
/// answers by aborting; only reachable with this many producers verifying
/// at once on one partition).
pub const MAX_PENDING_VERIFICATIONS: usize = 4096;

/// What [`TxnVerifications::admit`] decided for one append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Write it: no batch opens a transaction, or the one that does was
    /// verified under a token still valid.
    Go,
    /// Ask the coordinator whether the partition is in the transaction of
    /// (`producer_id`, `producer_epoch`), then append again with `token`.
    Verify {
        /// The producer opening a transaction here.
        producer_id: i64,
        /// The epoch its batch carries.
        producer_epoch: i16,
        /// Pass it back with the retried append.
        token: u64,
    },
    /// The token given is no longer the producer's (a marker came in
    /// between, or a newer verification replaced it), or more than one
    /// producer would open a transaction in one append: INVALID_TXN_STATE.
    Refuse,
}

impl TxnVerifications {
    /// No verification in flight.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decide for the batches of one append, `(producer id, epoch,
    /// transactional)` in write order, against `states`; `verified` is the
    /// token of a verification the caller completed for this append.
    pub fn admit(
        &mut self,
        states: &ProducerStates,
        batches: impl Iterator<Item = (i64, i16, bool)>,
        verified: Option<u64>,
    ) -> Admission {
        let mut opening: Option<(i64, i16)> = None;
        for (pid, epoch, transactional) in batches {
            if !transactional || pid < 0 {
                continue;
            }
            if states
                .get(pid)
                .is_some_and(|e| e.txn_first_offset.is_some())
            {
                continue;
            }
            match opening {
                None => opening = Some((pid, epoch)),
                Some((p, _)) if p == pid => {}
                Some(_) => return Admission::Refuse,
            }
        }
        let Some((producer_id, producer_epoch)) = opening else {
            return Admission::Go;
        };
        match verified {
            Some(t) if self.pending.get(&producer_id) == Some(&t) => Admission::Go,
            Some(_) => Admission::Refuse,
            None => {
                if !self.pending.contains_key(&producer_id)
                    && self.pending.len() >= MAX_PENDING_VERIFICATIONS
                {
                    self.pending.clear();
                }
                let next = &mut self.next;
                let token = *self.pending.entry(producer_id).or_insert_with(|| {
                    *next += 1;
                    *next
                });
                Admission::Verify {
                    producer_id,
                    producer_epoch,
                    token,
                }
            }
        }
    }

    /// An append admitted with [`Admission::Go`] was written: its
    /// producers' transactions are open here now, their tokens are spent.
    pub fn appended(&mut self, producer_ids: impl Iterator<Item = i64>) {
        if self.pending.is_empty() {
            return;
        }
        for p in producer_ids {
            self.pending.remove(&p);
        }
    }

    /// A marker of `producer_id` was written: a verification in flight
    /// for it predates the end of the transaction it checked.
    pub fn ended(&mut self, producer_id: i64) {
        self.pending.remove(&producer_id);
    }

    /// Verifications in flight.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether none is in flight.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

/// The sequence checks of a batch that is not a duplicate, against the
/// producer's current entry (Kafka's `checkProducerEpoch` + `checkSequence`).
fn check_one(e: &ProducerEntry, b: &Incoming) -> Result<(), SequenceError> {
    if b.epoch < e.epoch {
        return Err(SequenceError::StaleEpoch {
            producer_id: b.producer_id,
            epoch: b.epoch,
            current: e.epoch,
        });
    }
    if b.epoch > e.epoch {
        // KIP-360: a bumped epoch restarts the sequence at 0.
        if b.first_seq != 0 {
            return Err(SequenceError::OutOfOrder {
                producer_id: b.producer_id,
                epoch: b.epoch,
                found: b.first_seq,
                last: None,
            });
        }
        return Ok(());
    }
    match e.batches.back() {
        // Known epoch but no batch left (cannot happen from `check`, kept
        // total): any sequence, as for an unknown producer.
        None => Ok(()),
        Some(last) if in_sequence(last.last_seq, b.first_seq) => Ok(()),
        Some(last) => Err(SequenceError::OutOfOrder {
            producer_id: b.producer_id,
            epoch: b.epoch,
            found: b.first_seq,
            last: Some(last.last_seq),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inc(pid: i64, epoch: i16, seq: i32, n: i32, base: i64) -> Incoming {
        Incoming {
            producer_id: pid,
            epoch,
            first_seq: seq,
            last_offset_delta: n - 1,
            base_offset: base,
            timestamp: 1_000 + base,
            transactional: false,
        }
    }

    fn txn(pid: i64, epoch: i16, seq: i32, n: i32, base: i64) -> Incoming {
        Incoming {
            transactional: true,
            ..inc(pid, epoch, seq, n, base)
        }
    }

    /// Check and apply one batch; its verdict.
    fn put(s: &mut ProducerStates, b: Incoming) -> Result<Option<BatchMeta>, SequenceError> {
        match s.check(&[b], 10)? {
            Verdict::Append(st) => {
                s.apply(st);
                Ok(None)
            }
            Verdict::Duplicate(m) => Ok(Some(m)),
        }
    }

    #[test]
    fn in_order_batches_are_accepted_and_a_retry_is_a_duplicate_with_its_offsets() {
        let mut s = ProducerStates::new();
        assert_eq!(put(&mut s, inc(7, 0, 0, 3, 0)), Ok(None));
        assert_eq!(put(&mut s, inc(7, 0, 3, 2, 3)), Ok(None));
        // The retry of the first batch arrives with other offsets assigned.
        let dup = put(&mut s, inc(7, 0, 0, 3, 99)).unwrap().unwrap();
        assert_eq!((dup.base_offset, dup.last_offset), (0, 2));
        let dup = put(&mut s, inc(7, 0, 3, 2, 99)).unwrap().unwrap();
        assert_eq!((dup.base_offset, dup.last_offset), (3, 4));
        assert_eq!(s.get(7).unwrap().batches.len(), 2);
    }

    #[test]
    fn only_the_last_five_batches_are_remembered() {
        let mut s = ProducerStates::new();
        for i in 0..6 {
            assert_eq!(put(&mut s, inc(1, 0, i, 1, i as i64)), Ok(None));
        }
        assert!(put(&mut s, inc(1, 0, 1, 1, 50)).unwrap().is_some());
        // Sequence 0 fell out of the window: no longer a duplicate, and not
        // in sequence either.
        assert!(matches!(
            put(&mut s, inc(1, 0, 0, 1, 50)),
            Err(SequenceError::OutOfOrder {
                found: 0,
                last: Some(5),
                ..
            })
        ));
    }

    #[test]
    fn a_gap_is_out_of_order_and_changes_nothing() {
        let mut s = ProducerStates::new();
        put(&mut s, inc(1, 0, 0, 2, 0)).unwrap();
        let before = s.clone();
        assert_eq!(
            put(&mut s, inc(1, 0, 5, 1, 2)),
            Err(SequenceError::OutOfOrder {
                producer_id: 1,
                epoch: 0,
                found: 5,
                last: Some(1)
            })
        );
        assert_eq!(s, before);
        assert_eq!(put(&mut s, inc(1, 0, 2, 1, 2)), Ok(None));
    }

    #[test]
    fn an_older_epoch_is_fenced_a_newer_one_restarts_at_zero() {
        let mut s = ProducerStates::new();
        put(&mut s, inc(1, 3, 0, 1, 0)).unwrap();
        put(&mut s, inc(1, 3, 1, 1, 1)).unwrap();
        assert!(matches!(
            put(&mut s, inc(1, 2, 2, 1, 2)),
            Err(SequenceError::StaleEpoch {
                epoch: 2,
                current: 3,
                ..
            })
        ));
        // KIP-360 bump: a new epoch must start at 0.
        assert!(matches!(
            put(&mut s, inc(1, 4, 2, 1, 2)),
            Err(SequenceError::OutOfOrder {
                epoch: 4,
                last: None,
                ..
            })
        ));
        assert_eq!(put(&mut s, inc(1, 4, 0, 1, 2)), Ok(None));
        let e = s.get(1).unwrap();
        assert_eq!((e.epoch, e.batches.len()), (4, 1));
        // The old epoch's batches are no duplicates any more: fenced.
        assert!(matches!(
            put(&mut s, inc(1, 3, 0, 1, 3)),
            Err(SequenceError::StaleEpoch { .. })
        ));
    }

    #[test]
    fn an_unknown_producer_is_accepted_at_any_sequence() {
        let mut s = ProducerStates::new();
        assert_eq!(put(&mut s, inc(9, 2, 1234, 1, 0)), Ok(None));
        assert_eq!(put(&mut s, inc(9, 2, 1235, 1, 1)), Ok(None));
    }

    #[test]
    fn sequences_wrap_after_i32_max() {
        assert_eq!(increment_sequence(i32::MAX, 0), i32::MAX);
        assert_eq!(increment_sequence(i32::MAX, 1), 0);
        assert_eq!(increment_sequence(i32::MAX - 1, 3), 1);
        let mut s = ProducerStates::new();
        put(&mut s, inc(1, 0, i32::MAX - 1, 2, 0)).unwrap();
        assert_eq!(s.get(1).unwrap().batches[0].last_seq, i32::MAX);
        assert_eq!(put(&mut s, inc(1, 0, 0, 3, 2)), Ok(None));
        // A batch straddling the wrap.
        let mut s = ProducerStates::new();
        put(&mut s, inc(1, 0, i32::MAX - 1, 4, 0)).unwrap();
        assert_eq!(s.get(1).unwrap().batches[0].last_seq, 1);
        assert!(put(&mut s, inc(1, 0, i32::MAX - 1, 4, 9))
            .unwrap()
            .is_some());
        assert_eq!(put(&mut s, inc(1, 0, 2, 1, 4)), Ok(None));
    }

    #[test]
    fn batches_of_one_append_are_checked_in_write_order() {
        let s = ProducerStates::new();
        // Two in-order batches of one producer in one append: both fine.
        let v = s
            .check(
                &[inc(1, 0, 0, 2, 0), inc(1, 0, 2, 1, 2), inc(2, 0, 0, 1, 3)],
                5,
            )
            .unwrap();
        let Verdict::Append(st) = v else { panic!() };
        let mut s2 = s.clone();
        s2.apply(st);
        assert_eq!(s2.get(1).unwrap().batches.len(), 2);
        // A gap inside the append refuses all of it.
        assert!(s
            .check(&[inc(1, 0, 0, 2, 0), inc(1, 0, 3, 1, 2)], 5)
            .is_err());
        // A batch repeated inside one append is a duplicate of the first.
        assert!(matches!(
            s.check(&[inc(1, 0, 0, 2, 0), inc(1, 0, 0, 2, 2)], 5),
            Ok(Verdict::Duplicate(BatchMeta { base_offset: 0, .. }))
        ));
    }

    #[test]
    fn idle_producers_expire() {
        let mut s = ProducerStates::new();
        let Verdict::Append(st) = s.check(&[inc(1, 0, 0, 1, 0)], 1_000).unwrap() else {
            panic!()
        };
        s.apply(st);
        let Verdict::Append(st) = s.check(&[inc(2, 0, 0, 1, 1)], 5_000).unwrap() else {
            panic!()
        };
        s.apply(st);
        assert_eq!(s.expire(10_999, 10_000), 0);
        assert_eq!(s.expire(11_000, 10_000), 1);
        assert!(s.get(1).is_none() && s.get(2).is_some());
        // An expired producer is unknown again: any sequence is accepted.
        assert_eq!(put(&mut s, inc(1, 0, 77, 1, 2)), Ok(None));
    }

    #[test]
    fn retention_forgets_batches_below_the_log_start() {
        let mut s = ProducerStates::new();
        put(&mut s, inc(1, 0, 0, 2, 0)).unwrap();
        put(&mut s, inc(2, 0, 0, 2, 2)).unwrap();
        s.truncate_head(2);
        assert!(s.get(1).is_none());
        assert!(s.get(2).is_some());
    }

    #[test]
    fn snapshot_round_trip_and_corruption_is_detected() {
        let mut s = ProducerStates::new();
        for i in 0..7 {
            put(&mut s, inc(1, 2, i, 1, i as i64)).unwrap();
        }
        put(&mut s, inc(i64::MAX, i16::MAX, i32::MAX, 1, 20)).unwrap();
        let bytes = s.encode(21);
        let (off, back) = ProducerStates::decode(&bytes).unwrap();
        assert_eq!((off, &back), (21, &s));
        let empty = ProducerStates::new().encode(0);
        assert_eq!(
            ProducerStates::decode(&empty),
            Some((0, ProducerStates::new()))
        );
        for cut in 0..bytes.len() {
            assert!(ProducerStates::decode(&bytes[..cut]).is_none(), "cut {cut}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(ProducerStates::decode(&b).is_none(), "flip {i}");
        }
    }

    /// Catches: a transaction that is not tracked (the LSO would not be
    /// held), a marker that does not close it, a stale marker accepted, or
    /// a plain batch accepted in the middle of a transaction.
    #[test]
    fn a_transaction_opens_at_its_first_batch_and_a_marker_closes_it() {
        let mut s = ProducerStates::new();
        assert_eq!(put(&mut s, txn(1, 0, 0, 2, 10)), Ok(None));
        assert_eq!(put(&mut s, txn(1, 0, 2, 1, 15)), Ok(None));
        assert_eq!(s.get(1).unwrap().txn_first_offset, Some(10));
        assert_eq!(s.open_transactions().collect::<Vec<_>>(), [(10, 1)]);
        // A plain batch of the same producer mid-transaction: refused.
        let before = s.clone();
        assert_eq!(
            put(&mut s, inc(1, 0, 3, 1, 16)),
            Err(SequenceError::InvalidTxnState {
                producer_id: 1,
                first_offset: 10
            })
        );
        assert_eq!(s, before);
        // An older epoch's marker is refused; the current one closes.
        assert!(matches!(
            s.check_marker(1, -1, 7),
            Err(SequenceError::StaleEpoch { current: 0, .. })
        ));
        assert_eq!(s.check_marker(1, 0, 7), Ok(()));
        assert_eq!(s.apply_marker(1, 0, 7, 20), Some(10));
        let e = s.get(1).unwrap();
        assert_eq!((e.txn_first_offset, e.coordinator_epoch), (None, 7));
        // Re-sent: nothing to close, still allowed (idempotent for readers).
        assert_eq!(s.check_marker(1, 0, 7), Ok(()));
        // From a coordinator older than the one accepted: fenced (52).
        assert_eq!(
            s.check_marker(1, 0, 6),
            Err(SequenceError::CoordinatorFenced {
                producer_id: 1,
                coordinator_epoch: 6,
                current: 7
            })
        );
        assert_eq!(s.check_marker(1, 0, 8), Ok(()));
        assert_eq!(s.apply_marker(1, 0, 7, 21), None);
        // The next transaction opens at its own first batch.
        assert_eq!(put(&mut s, txn(1, 0, 3, 1, 30)), Ok(None));
        assert_eq!(s.get(1).unwrap().txn_first_offset, Some(30));
        // A marker with a bumped epoch (the coordinator aborting a timed-out
        // transaction) moves the producer to it: the old epoch is fenced.
        assert_eq!(s.apply_marker(1, 1, 8, 40), Some(30));
        assert!(matches!(
            put(&mut s, txn(1, 0, 4, 1, 41)),
            Err(SequenceError::StaleEpoch { current: 1, .. })
        ));
        assert_eq!(put(&mut s, txn(1, 1, 0, 1, 41)), Ok(None));
        // A marker for a producer never seen here creates its entry.
        assert_eq!(s.apply_marker(9, 3, 2, 50), None);
        assert_eq!(s.get(9).unwrap().epoch, 3);
    }

    #[test]
    fn an_open_transaction_neither_expires_nor_goes_with_retention() {
        let mut s = ProducerStates::new();
        put(&mut s, txn(1, 0, 0, 1, 0)).unwrap();
        put(&mut s, inc(2, 0, 0, 1, 1)).unwrap();
        assert_eq!(s.expire(i64::MAX, 10), 1);
        assert!(s.get(1).is_some());
        s.truncate_head(100);
        assert_eq!(s.get(1).unwrap().txn_first_offset, Some(0));
        s.apply_marker(1, 0, 0, 5);
        s.truncate_head(100);
        assert!(s.get(1).is_none());
    }

    /// The format-1 encoding (before transactions), as written by the
    /// previous version.
    fn encode_v1(s: &ProducerStates, offset: i64) -> Vec<u8> {
        let mut ids: Vec<&i64> = s.producers.keys().collect();
        ids.sort();
        let mut out = Vec::new();
        out.extend_from_slice(b"KPS1");
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&(ids.len() as u32).to_be_bytes());
        for pid in ids {
            let e = &s.producers[pid];
            out.extend_from_slice(&pid.to_be_bytes());
            out.extend_from_slice(&e.epoch.to_be_bytes());
            out.extend_from_slice(&e.last_seen_ms.to_be_bytes());
            out.push(e.batches.len() as u8);
            for m in &e.batches {
                out.extend_from_slice(&m.first_seq.to_be_bytes());
                out.extend_from_slice(&m.last_seq.to_be_bytes());
                out.extend_from_slice(&m.base_offset.to_be_bytes());
                out.extend_from_slice(&m.last_offset.to_be_bytes());
                out.extend_from_slice(&m.timestamp.to_be_bytes());
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    /// Catches: the transaction fields lost in a snapshot (a takeover
    /// would release the LSO of an open transaction), or a format-1
    /// snapshot of the previous version no longer loading.
    #[test]
    fn snapshot_v2_carries_transactions_and_v1_still_loads() {
        let mut s = ProducerStates::new();
        put(&mut s, txn(1, 2, 0, 3, 5)).unwrap();
        put(&mut s, inc(2, 0, 0, 1, 8)).unwrap();
        put(&mut s, txn(3, 0, 0, 1, 9)).unwrap();
        s.apply_marker(3, 0, 11, 0);
        let bytes = s.encode(10);
        assert_eq!(&bytes[..4], b"KPS2");
        let (off, back) = ProducerStates::decode(&bytes).unwrap();
        assert_eq!((off, &back), (10, &s));
        assert_eq!(back.get(1).unwrap().txn_first_offset, Some(5));
        assert_eq!(back.get(3).unwrap().coordinator_epoch, 11);
        // Format 1: the same producers, no transaction, no coordinator epoch.
        let mut plain = ProducerStates::new();
        put(&mut plain, inc(1, 2, 0, 3, 5)).unwrap();
        put(&mut plain, inc(2, 0, 0, 1, 8)).unwrap();
        let (off, old) = ProducerStates::decode(&encode_v1(&plain, 9)).unwrap();
        assert_eq!((off, &old), (9, &plain));
        assert_eq!(old.get(1).unwrap().coordinator_epoch, -1);
        let v1 = encode_v1(&plain, 9);
        for cut in 0..v1.len() {
            assert!(ProducerStates::decode(&v1[..cut]).is_none(), "cut {cut}");
        }
    }

    #[test]
    fn replay_rebuilds_what_check_and_apply_built() {
        let batches = [
            inc(1, 0, 0, 2, 0),
            inc(2, 0, 0, 1, 2),
            inc(1, 0, 2, 1, 3),
            inc(1, 1, 0, 1, 4),
            inc(2, 0, 1, 1, 5),
        ];
        let mut live = ProducerStates::new();
        let mut rebuilt = ProducerStates::new();
        for b in batches {
            assert_eq!(put(&mut live, b), Ok(None));
            rebuilt.replay(&b, 10);
        }
        assert_eq!(live, rebuilt);
        let t = txn(4, 0, 0, 1, 6);
        assert_eq!(put(&mut live, t), Ok(None));
        rebuilt.replay(&t, 10);
        assert_eq!(live, rebuilt);
        assert_eq!(live.apply_marker(4, 0, 1, 10), Some(6));
        assert_eq!(rebuilt.apply_marker(4, 0, 1, 10), Some(6));
        assert_eq!(live, rebuilt);
    }

    /// Catches: a transactional produce for a partition never added to
    /// the transaction written without asking the coordinator (KIP-890
    /// part 1), a verification honoured after the marker that ended its
    /// transaction, and the common path (transaction already open here)
    /// paying a verification.
    #[test]
    fn opening_a_transaction_needs_a_verification_that_no_marker_outdated() {
        let mut s = ProducerStates::new();
        let mut v = TxnVerifications::new();
        // Plain and idempotent batches never need one.
        assert_eq!(
            v.admit(&s, [(-1, -1, false), (3, 0, false)].into_iter(), None),
            Admission::Go
        );
        // The first transactional batch of producer 1 here: verify.
        let Admission::Verify {
            producer_id: 1,
            producer_epoch: 0,
            token,
        } = v.admit(&s, [(1, 0, true)].into_iter(), None)
        else {
            panic!("a batch opening a transaction must be verified");
        };
        // A concurrent request shares the verification in flight.
        assert_eq!(
            v.admit(&s, [(1, 0, true)].into_iter(), None),
            Admission::Verify {
                producer_id: 1,
                producer_epoch: 0,
                token
            }
        );
        // A forged or stale token is refused.
        assert_eq!(
            v.admit(&s, [(1, 0, true)].into_iter(), Some(token + 100)),
            Admission::Refuse
        );
        // Verified: written, and the transaction is open here.
        assert_eq!(
            v.admit(&s, [(1, 0, true)].into_iter(), Some(token)),
            Admission::Go
        );
        put(&mut s, txn(1, 0, 0, 1, 10)).unwrap();
        v.appended([1].into_iter());
        assert!(v.is_empty());
        // The common path: the open transaction needs no second look.
        assert_eq!(v.admit(&s, [(1, 0, true)].into_iter(), None), Admission::Go);
        // The marker closes it; a verification obtained before the marker
        // no longer opens a new one.
        s.apply_marker(1, 0, 0, 20);
        let Admission::Verify { token, .. } = v.admit(&s, [(1, 0, true)].into_iter(), None) else {
            panic!("a closed transaction must be verified again");
        };
        v.ended(1);
        assert_eq!(
            v.admit(&s, [(1, 0, true)].into_iter(), Some(token)),
            Admission::Refuse
        );
        // Two producers opening transactions in one append: refused.
        assert_eq!(
            v.admit(&s, [(5, 0, true), (6, 0, true)].into_iter(), None),
            Admission::Refuse
        );
    }
}

#[cfg(test)]
mod cost {
    use super::*;

    /// The per-batch cost of the check on the hot path (run with
    /// `cargo test --release -p kaas-actors producers::cost -- --ignored
    /// --nocapture`): 1,000 producers, in-order batches.
    #[test]
    #[ignore]
    fn check_and_apply_cost_per_batch() {
        let mut s = ProducerStates::new();
        let n = 2_000_000u32;
        let t = std::time::Instant::now();
        for i in 0..n {
            let pid = i64::from(i % 1000);
            let b = Incoming {
                producer_id: pid,
                epoch: 0,
                first_seq: (i / 1000) as i32,
                last_offset_delta: 0,
                base_offset: i64::from(i),
                timestamp: 0,
                transactional: false,
            };
            match s.check(&[b], 0).unwrap() {
                Verdict::Append(st) => s.apply(st),
                Verdict::Duplicate(_) => panic!(),
            }
        }
        let ns = t.elapsed().as_nanos() as f64 / f64::from(n);
        println!("check + apply: {ns:.0} ns per batch");
    }
}
