//! What a transaction coordinator shard remembers, and the transaction state
//! machine as plain Rust (no actix, no files, time passed in as ms).
//!
//! One record per transactional id, written whole at every transition —
//! Kafka's `__transaction_state` value in spirit: producer id and epoch,
//! timeout, status, the partitions of the open transaction, and the times.
//! The live state is the latest record per id (a tombstone removes it), so a
//! compaction writes one record per live id.
//!
//! The transitions are Kafka's (`TransactionCoordinator`):
//!
//! ```text
//! Empty/Complete* --AddPartitions--> Ongoing --EndTxn--> Prepare{Commit,Abort}
//!   ^                                  |                      | markers acked
//!   |                                  | timeout / re-init    v
//!   +------------------ Complete{Commit,Abort} <-- PrepareAbort (epoch bumped)
//! ```
//!
//! A `Prepare*` record is the decision: it is durable before any marker is
//! sent, and a coordinator that opens the shard and finds one re-sends the
//! markers and writes `Complete*` (the re-drive). Every method returns the
//! record to persist (if any) and the answer, which the actor delivers only
//! once that record is durable.

use crate::group::log::ShardCodec;
use crate::group::offsets::{decode_with, frame, EncodeError, Frame, W};
use crate::group::shard::ShardId;
use kaas_protocol::kafka_protocol::ResponseError;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The pseudo-topic naming a consumer-group coordinator shard inside a
/// transaction (AddOffsetsToTxn) and in WriteTxnMarkers; the partition is
/// the group's shard number.
pub const GROUP_OFFSETS_TOPIC: &str = "__consumer_offsets";

/// Kafka's `transaction.max.timeout.ms` default: a longer
/// `transaction.timeout.ms` is refused with INVALID_TRANSACTION_TIMEOUT.
pub const MAX_TIMEOUT_MS: i32 = 900_000;

/// An epoch at or above this is exhausted: the next bump takes a new
/// producer id (Kafka: `Short.MaxValue - 1`, one left for a fencing bump).
pub const EPOCH_EXHAUSTED: i16 = i16::MAX - 1;

/// A transaction's status (Kafka's `TransactionState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TxnStatus {
    /// No transaction open.
    Empty,
    /// Partitions were added; records may be in flight.
    Ongoing,
    /// Commit decided; markers being written.
    PrepareCommit,
    /// Abort decided; markers being written.
    PrepareAbort,
    /// The last transaction committed.
    CompleteCommit,
    /// The last transaction aborted.
    CompleteAbort,
}

impl TxnStatus {
    fn code(self) -> u8 {
        match self {
            TxnStatus::Empty => 0,
            TxnStatus::Ongoing => 1,
            TxnStatus::PrepareCommit => 2,
            TxnStatus::PrepareAbort => 3,
            TxnStatus::CompleteCommit => 4,
            TxnStatus::CompleteAbort => 5,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            0 => TxnStatus::Empty,
            1 => TxnStatus::Ongoing,
            2 => TxnStatus::PrepareCommit,
            3 => TxnStatus::PrepareAbort,
            4 => TxnStatus::CompleteCommit,
            5 => TxnStatus::CompleteAbort,
            _ => return None,
        })
    }

    /// Kafka's name, as DescribeTransactions / ListTransactions report it.
    pub fn name(self) -> &'static str {
        match self {
            TxnStatus::Empty => "Empty",
            TxnStatus::Ongoing => "Ongoing",
            TxnStatus::PrepareCommit => "PrepareCommit",
            TxnStatus::PrepareAbort => "PrepareAbort",
            TxnStatus::CompleteCommit => "CompleteCommit",
            TxnStatus::CompleteAbort => "CompleteAbort",
        }
    }

    /// Whether markers are being written (the decision is taken).
    pub fn preparing(self) -> bool {
        matches!(self, TxnStatus::PrepareCommit | TxnStatus::PrepareAbort)
    }
}

/// One transactional id's state, as persisted at every transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnMeta {
    /// The transactional id.
    pub transactional_id: String,
    /// The current producer id.
    pub producer_id: i64,
    /// The current epoch.
    pub producer_epoch: i16,
    /// The epoch before the last bump (-1: none): a KIP-360 re-init that
    /// names it is the same producer retrying.
    pub last_epoch: i16,
    /// `transaction.timeout.ms`.
    pub timeout_ms: i32,
    /// Status.
    pub status: TxnStatus,
    /// The partitions of the open (or deciding) transaction.
    pub partitions: BTreeSet<(String, i32)>,
    /// When the open transaction started (ms; -1: none).
    pub start_ms: i64,
    /// When this record was written (ms).
    pub update_ms: i64,
}

/// A transaction shard record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnRecord {
    /// The new state of one id.
    Txn(TxnMeta),
    /// The id expired (`transactional.id.expiration.ms`).
    Tombstone {
        /// The transactional id.
        transactional_id: String,
    },
}

/// The live state of a transaction shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnState {
    /// Latest state per transactional id.
    pub txns: BTreeMap<String, TxnMeta>,
}

impl TxnState {
    /// Fold one record in.
    pub fn apply(&mut self, r: &TxnRecord) {
        match r {
            TxnRecord::Txn(m) => {
                self.txns.insert(m.transactional_id.clone(), m.clone());
            }
            TxnRecord::Tombstone { transactional_id } => {
                self.txns.remove(transactional_id);
            }
        }
    }
}

// -------------------------------------------------------------- encoding

const T_TXN: u8 = 16;
const T_TXN_TOMBSTONE: u8 = 17;

/// `<cluster>/txns/<shard:04>`: one transaction coordinator shard's files
/// (state files and `leader-e<E>.claim`s), named like a group shard's.
pub fn txn_shard_dir(cluster: &Path, shard: ShardId) -> PathBuf {
    cluster
        .join(kaas_volume::layout::TXNS_DIR)
        .join(format!("{:04}", shard.0))
}

/// The transaction shard's codec for [`crate::group::log::ShardLog`].
pub struct TxnCodec;

/// A transaction shard's log.
pub type TxnLog = crate::group::log::ShardLog<TxnCodec>;

impl ShardCodec for TxnCodec {
    type Record = TxnRecord;
    type State = TxnState;

    fn dir(cluster: &Path, shard: ShardId) -> PathBuf {
        txn_shard_dir(cluster, shard)
    }

    fn encode(r: &TxnRecord, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let mut w = W(Vec::new());
        match r {
            TxnRecord::Txn(m) => {
                w.u8(T_TXN);
                w.str("transactional id", &m.transactional_id)?;
                w.i64(m.producer_id);
                w.i16(m.producer_epoch);
                w.i16(m.last_epoch);
                w.i32(m.timeout_ms);
                w.u8(m.status.code());
                w.i64(m.start_ms);
                w.i64(m.update_ms);
                let n = u32::try_from(m.partitions.len())
                    .map_err(|_| EncodeError::TooLarge(usize::MAX))?;
                w.u32(n);
                for (t, p) in &m.partitions {
                    w.str("topic", t)?;
                    w.i32(*p);
                }
            }
            TxnRecord::Tombstone { transactional_id } => {
                w.u8(T_TXN_TOMBSTONE);
                w.str("transactional id", transactional_id)?;
            }
        }
        frame(&w.0, out)
    }

    fn decode(buf: &[u8]) -> Option<(Frame<TxnRecord>, usize)> {
        decode_with(buf, |tag, r| {
            Some(match tag {
                T_TXN => {
                    let transactional_id = r.str()?;
                    let producer_id = r.i64()?;
                    let producer_epoch = r.i16()?;
                    let last_epoch = r.i16()?;
                    let timeout_ms = r.i32()?;
                    let status = TxnStatus::from_code(r.u8()?)?;
                    let start_ms = r.i64()?;
                    let update_ms = r.i64()?;
                    let n = r.u32()? as usize;
                    // Each partition takes at least 6 bytes.
                    if n > r.0.len() / 6 {
                        return None;
                    }
                    let mut partitions = BTreeSet::new();
                    for _ in 0..n {
                        partitions.insert((r.str()?, r.i32()?));
                    }
                    TxnRecord::Txn(TxnMeta {
                        transactional_id,
                        producer_id,
                        producer_epoch,
                        last_epoch,
                        timeout_ms,
                        status,
                        partitions,
                        start_ms,
                        update_ms,
                    })
                }
                T_TXN_TOMBSTONE => TxnRecord::Tombstone {
                    transactional_id: r.str()?,
                },
                _ => return None,
            })
        })
    }

    fn apply(state: &mut TxnState, r: &TxnRecord) {
        state.apply(r)
    }

    fn records(state: &TxnState) -> Vec<TxnRecord> {
        state.txns.values().cloned().map(TxnRecord::Txn).collect()
    }
}

// --------------------------------------------------------- state machine

/// Why a transactional request is refused (Kafka's codes; the broker maps
/// PRODUCER_FENCED to INVALID_PRODUCER_EPOCH for old request versions).
pub type TxnError = ResponseError;

/// InitProducerId with a transactional id: what the coordinator decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitOutcome {
    /// Persist `record`, then answer (producer id, epoch).
    Ready {
        /// The new state.
        record: TxnMeta,
    },
    /// A new producer id is needed (first init, or the epoch is
    /// exhausted): ask again with one.
    NeedProducerId,
    /// An ongoing transaction of the previous epoch is being aborted first
    /// (persist `record`, send its markers): answer CONCURRENT_TRANSACTIONS,
    /// the client retries.
    AbortFirst {
        /// The PrepareAbort state with the bumped epoch.
        record: TxnMeta,
    },
}

/// The transaction state machine of one shard over its durable state.
pub struct TxnMachine;

fn bumped(m: &TxnMeta) -> Option<i16> {
    (m.producer_epoch < EPOCH_EXHAUSTED).then_some(m.producer_epoch + 1)
}

impl TxnMachine {
    /// `transaction.timeout.ms` must be in 1..=[`MAX_TIMEOUT_MS`].
    pub fn check_timeout(timeout_ms: i32) -> Result<(), TxnError> {
        if timeout_ms <= 0 || timeout_ms > MAX_TIMEOUT_MS {
            return Err(ResponseError::InvalidTransactionTimeout);
        }
        Ok(())
    }

    /// InitProducerId (KIP-98, KIP-360): `given` is the (producer id,
    /// epoch) a client re-initialising after an error names (-1, -1: none);
    /// `fresh` a newly allocated producer id when one was asked for.
    pub fn init(
        state: &TxnState,
        txn_id: &str,
        timeout_ms: i32,
        given: (i64, i16),
        fresh: Option<i64>,
        now_ms: i64,
    ) -> Result<InitOutcome, TxnError> {
        Self::check_timeout(timeout_ms)?;
        let Some(cur) = state.txns.get(txn_id) else {
            if given.0 >= 0 {
                // The client names an id this coordinator has never seen
                // (expired, or never issued here).
                return Err(ResponseError::InvalidProducerIdMapping);
            }
            let Some(pid) = fresh else {
                return Ok(InitOutcome::NeedProducerId);
            };
            return Ok(InitOutcome::Ready {
                record: TxnMeta {
                    transactional_id: txn_id.to_owned(),
                    producer_id: pid,
                    producer_epoch: 0,
                    last_epoch: -1,
                    timeout_ms,
                    status: TxnStatus::Empty,
                    partitions: BTreeSet::new(),
                    start_ms: -1,
                    update_ms: now_ms,
                },
            });
        };
        if cur.status.preparing() {
            return Err(ResponseError::ConcurrentTransactions);
        }
        if given.0 >= 0 {
            // KIP-360: only the current producer (at its current or
            // previous epoch) may bump without being fenced.
            let same = given.0 == cur.producer_id
                && (given.1 == cur.producer_epoch || given.1 == cur.last_epoch);
            if !same {
                return Err(ResponseError::ProducerFenced);
            }
            if given.1 == cur.last_epoch && cur.status != TxnStatus::Ongoing {
                // A retry of the init that already bumped: same answer.
                return Ok(InitOutcome::Ready {
                    record: cur.clone(),
                });
            }
        }
        if cur.status == TxnStatus::Ongoing {
            let mut m = cur.clone();
            m.last_epoch = m.producer_epoch;
            // Fencing bump; an exhausted epoch aborts at the last value
            // and the retry then moves to a new producer id.
            m.producer_epoch = bumped(cur).unwrap_or(cur.producer_epoch);
            m.status = TxnStatus::PrepareAbort;
            m.update_ms = now_ms;
            return Ok(InitOutcome::AbortFirst { record: m });
        }
        let mut m = cur.clone();
        m.timeout_ms = timeout_ms;
        m.status = TxnStatus::Empty;
        m.partitions.clear();
        m.start_ms = -1;
        m.update_ms = now_ms;
        match bumped(cur) {
            Some(e) => {
                m.last_epoch = cur.producer_epoch;
                m.producer_epoch = e;
            }
            None => {
                let Some(pid) = fresh.filter(|p| *p != cur.producer_id) else {
                    return Ok(InitOutcome::NeedProducerId);
                };
                m.producer_id = pid;
                m.producer_epoch = 0;
                m.last_epoch = -1;
            }
        }
        Ok(InitOutcome::Ready { record: m })
    }

    /// The checks every in-transaction request shares.
    fn current<'a>(
        state: &'a TxnState,
        txn_id: &str,
        pid: i64,
        epoch: i16,
    ) -> Result<&'a TxnMeta, TxnError> {
        let cur = state
            .txns
            .get(txn_id)
            .ok_or(ResponseError::InvalidProducerIdMapping)?;
        if cur.producer_id != pid {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        if cur.producer_epoch != epoch {
            return Err(ResponseError::ProducerFenced);
        }
        Ok(cur)
    }

    /// AddPartitionsToTxn / AddOffsetsToTxn: `None` when nothing changes
    /// (every partition already in the open transaction).
    pub fn add_partitions(
        state: &TxnState,
        txn_id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[(String, i32)],
        now_ms: i64,
    ) -> Result<Option<TxnMeta>, TxnError> {
        let cur = Self::current(state, txn_id, pid, epoch)?;
        if cur.status.preparing() {
            return Err(ResponseError::ConcurrentTransactions);
        }
        if cur.status == TxnStatus::Ongoing && partitions.iter().all(|p| cur.partitions.contains(p))
        {
            return Ok(None);
        }
        let mut m = cur.clone();
        if m.status != TxnStatus::Ongoing {
            m.partitions.clear();
            m.start_ms = now_ms;
        }
        m.status = TxnStatus::Ongoing;
        m.partitions.extend(partitions.iter().cloned());
        m.update_ms = now_ms;
        Ok(Some(m))
    }

    /// AddPartitionsToTxn v4 `verify_only` (KIP-890 part 1, a partition
    /// leader asking before it writes a transaction's first batch): for
    /// each partition, whether it is in the producer's ongoing
    /// transaction (`false`: INVALID_TXN_STATE). Writes nothing. The
    /// request-wide errors are Kafka's `handleVerifyPartitionsInTransaction`:
    /// an unknown id or another producer id is INVALID_PRODUCER_ID_MAPPING,
    /// another epoch PRODUCER_FENCED, a transaction being decided
    /// CONCURRENT_TRANSACTIONS.
    pub fn verify(
        state: &TxnState,
        txn_id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[(String, i32)],
    ) -> Result<Vec<bool>, TxnError> {
        let cur = Self::current(state, txn_id, pid, epoch)?;
        if cur.status.preparing() {
            return Err(ResponseError::ConcurrentTransactions);
        }
        let ongoing = cur.status == TxnStatus::Ongoing;
        Ok(partitions
            .iter()
            .map(|p| ongoing && cur.partitions.contains(p))
            .collect())
    }

    /// EndTxn: `Ok(None)` answers success without a write (a retry of a
    /// completed end, or an empty transaction).
    pub fn end(
        state: &TxnState,
        txn_id: &str,
        pid: i64,
        epoch: i16,
        commit: bool,
        now_ms: i64,
    ) -> Result<Option<TxnMeta>, TxnError> {
        let cur = state
            .txns
            .get(txn_id)
            .ok_or(ResponseError::InvalidProducerIdMapping)?;
        if cur.producer_id != pid {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        // A retried EndTxn after a timeout abort bumped the epoch: Kafka
        // answers the retry of the same decision as success only at the
        // current epoch.
        if cur.producer_epoch != epoch {
            return Err(ResponseError::ProducerFenced);
        }
        match (cur.status, commit) {
            (TxnStatus::Ongoing, _) => {
                let mut m = cur.clone();
                m.status = if commit {
                    TxnStatus::PrepareCommit
                } else {
                    TxnStatus::PrepareAbort
                };
                m.update_ms = now_ms;
                Ok(Some(m))
            }
            (TxnStatus::CompleteCommit, true) | (TxnStatus::CompleteAbort, false) => Ok(None),
            (TxnStatus::PrepareCommit, true) | (TxnStatus::PrepareAbort, false) => {
                Err(ResponseError::ConcurrentTransactions)
            }
            // An abort of a transaction that never added a partition:
            // nothing to abort (the Java client sends none; librdkafka may).
            (TxnStatus::Empty, false) => Ok(None),
            _ => Err(ResponseError::InvalidTxnState),
        }
    }

    /// Every marker of a Prepare* state was acknowledged: the Complete*
    /// state to persist (`None` if `txn_id` is no longer in that state).
    pub fn markers_written(
        state: &TxnState,
        txn_id: &str,
        epoch: i16,
        now_ms: i64,
    ) -> Option<TxnMeta> {
        let cur = state.txns.get(txn_id)?;
        if cur.producer_epoch != epoch || !cur.status.preparing() {
            return None;
        }
        let mut m = cur.clone();
        m.status = if cur.status == TxnStatus::PrepareCommit {
            TxnStatus::CompleteCommit
        } else {
            TxnStatus::CompleteAbort
        };
        m.partitions.clear();
        m.start_ms = -1;
        m.update_ms = now_ms;
        Some(m)
    }

    /// Transactions open longer than their timeout: abort each with an
    /// epoch bump (the producer is fenced, as Kafka does).
    pub fn timed_out(state: &TxnState, now_ms: i64) -> Vec<TxnMeta> {
        state
            .txns
            .values()
            .filter(|m| {
                m.status == TxnStatus::Ongoing
                    && now_ms.saturating_sub(m.start_ms) > i64::from(m.timeout_ms)
            })
            .map(|cur| {
                let mut m = cur.clone();
                if let Some(e) = bumped(cur) {
                    m.last_epoch = cur.producer_epoch;
                    m.producer_epoch = e;
                }
                m.status = TxnStatus::PrepareAbort;
                m.update_ms = now_ms;
                m
            })
            .collect()
    }

    /// Ids idle (no open transaction) longer than
    /// `transactional.id.expiration.ms`: tombstones.
    pub fn expired(state: &TxnState, now_ms: i64, expiration_ms: i64) -> Vec<TxnRecord> {
        state
            .txns
            .values()
            .filter(|m| {
                matches!(
                    m.status,
                    TxnStatus::Empty | TxnStatus::CompleteCommit | TxnStatus::CompleteAbort
                ) && now_ms.saturating_sub(m.update_ms) >= expiration_ms
            })
            .map(|m| TxnRecord::Tombstone {
                transactional_id: m.transactional_id.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(st: &mut TxnState, m: TxnMeta) {
        st.apply(&TxnRecord::Txn(m));
    }

    fn init(st: &mut TxnState, id: &str, fresh: i64) -> TxnMeta {
        let r = match TxnMachine::init(st, id, 60_000, (-1, -1), None, 1).unwrap() {
            InitOutcome::NeedProducerId => {
                TxnMachine::init(st, id, 60_000, (-1, -1), Some(fresh), 1).unwrap()
            }
            o => o,
        };
        let InitOutcome::Ready { record } = r else {
            panic!("{r:?}")
        };
        apply(st, record.clone());
        record
    }

    fn tp(t: &str, p: i32) -> (String, i32) {
        (t.to_owned(), p)
    }

    #[test]
    fn first_init_takes_a_producer_id_and_reinit_bumps_the_epoch_and_fences() {
        let mut st = TxnState::default();
        let m = init(&mut st, "t", 7);
        assert_eq!(
            (m.producer_id, m.producer_epoch, m.status),
            (7, 0, TxnStatus::Empty)
        );
        let m = init(&mut st, "t", 99);
        assert_eq!(
            (m.producer_id, m.producer_epoch),
            (7, 1),
            "same id, epoch bumped"
        );
        // The old epoch is fenced.
        assert_eq!(
            TxnMachine::add_partitions(&st, "t", 7, 0, &[tp("a", 0)], 2),
            Err(ResponseError::ProducerFenced)
        );
        assert_eq!(
            TxnMachine::add_partitions(&st, "t", 8, 1, &[tp("a", 0)], 2),
            Err(ResponseError::InvalidProducerIdMapping)
        );
        assert_eq!(
            TxnMachine::add_partitions(&st, "nope", 7, 1, &[tp("a", 0)], 2),
            Err(ResponseError::InvalidProducerIdMapping)
        );
    }

    /// Catches: verification answering "added" for a partition the
    /// transaction never added, for a transaction already decided, or for
    /// a fenced epoch (KIP-890 part 1).
    #[test]
    fn verify_only_says_which_partitions_the_ongoing_transaction_holds() {
        let mut st = TxnState::default();
        init(&mut st, "t", 5);
        // Nothing added yet: no partition verifies.
        assert_eq!(
            TxnMachine::verify(&st, "t", 5, 0, &[tp("a", 0)]),
            Ok(vec![false])
        );
        let m = TxnMachine::add_partitions(&st, "t", 5, 0, &[tp("a", 0)], 10)
            .unwrap()
            .unwrap();
        apply(&mut st, m);
        assert_eq!(
            TxnMachine::verify(&st, "t", 5, 0, &[tp("a", 0), tp("a", 1)]),
            Ok(vec![true, false])
        );
        assert_eq!(
            TxnMachine::verify(&st, "t", 5, 1, &[tp("a", 0)]),
            Err(ResponseError::ProducerFenced)
        );
        assert_eq!(
            TxnMachine::verify(&st, "t", 6, 0, &[tp("a", 0)]),
            Err(ResponseError::InvalidProducerIdMapping)
        );
        assert_eq!(
            TxnMachine::verify(&st, "u", 5, 0, &[tp("a", 0)]),
            Err(ResponseError::InvalidProducerIdMapping)
        );
        let m = TxnMachine::end(&st, "t", 5, 0, true, 20).unwrap().unwrap();
        apply(&mut st, m);
        assert_eq!(
            TxnMachine::verify(&st, "t", 5, 0, &[tp("a", 0)]),
            Err(ResponseError::ConcurrentTransactions)
        );
    }

    #[test]
    fn timeouts_are_checked() {
        let st = TxnState::default();
        for t in [0, -1, MAX_TIMEOUT_MS + 1] {
            assert_eq!(
                TxnMachine::init(&st, "t", t, (-1, -1), Some(1), 0),
                Err(ResponseError::InvalidTransactionTimeout)
            );
        }
    }

    #[test]
    fn commit_cycle_and_idempotent_retries() {
        let mut st = TxnState::default();
        init(&mut st, "t", 5);
        let m = TxnMachine::add_partitions(&st, "t", 5, 0, &[tp("a", 0), tp("a", 1)], 10)
            .unwrap()
            .unwrap();
        assert_eq!((m.status, m.start_ms), (TxnStatus::Ongoing, 10));
        apply(&mut st, m);
        assert_eq!(
            TxnMachine::add_partitions(&st, "t", 5, 0, &[tp("a", 1)], 11),
            Ok(None),
            "already in: no write"
        );
        let m = TxnMachine::add_partitions(&st, "t", 5, 0, &[tp(GROUP_OFFSETS_TOPIC, 3)], 12)
            .unwrap()
            .unwrap();
        assert_eq!(m.partitions.len(), 3);
        assert_eq!(m.start_ms, 10, "start kept");
        apply(&mut st, m);
        let m = TxnMachine::end(&st, "t", 5, 0, true, 20).unwrap().unwrap();
        assert_eq!(m.status, TxnStatus::PrepareCommit);
        apply(&mut st, m);
        assert_eq!(
            TxnMachine::end(&st, "t", 5, 0, true, 21),
            Err(ResponseError::ConcurrentTransactions)
        );
        assert_eq!(
            TxnMachine::end(&st, "t", 5, 0, false, 21),
            Err(ResponseError::InvalidTxnState)
        );
        assert_eq!(
            TxnMachine::add_partitions(&st, "t", 5, 0, &[tp("b", 0)], 21),
            Err(ResponseError::ConcurrentTransactions)
        );
        assert_eq!(
            TxnMachine::init(&st, "t", 1000, (-1, -1), None, 21),
            Err(ResponseError::ConcurrentTransactions)
        );
        assert_eq!(
            TxnMachine::markers_written(&st, "t", 4, 22),
            None,
            "stale epoch"
        );
        let m = TxnMachine::markers_written(&st, "t", 0, 22).unwrap();
        assert_eq!(m.status, TxnStatus::CompleteCommit);
        assert!(m.partitions.is_empty());
        apply(&mut st, m);
        assert_eq!(TxnMachine::end(&st, "t", 5, 0, true, 23), Ok(None), "retry");
        assert_eq!(
            TxnMachine::end(&st, "t", 5, 0, false, 23),
            Err(ResponseError::InvalidTxnState)
        );
        // The next transaction starts afresh.
        let m = TxnMachine::add_partitions(&st, "t", 5, 0, &[tp("c", 0)], 30)
            .unwrap()
            .unwrap();
        assert_eq!(m.partitions.len(), 1);
        assert_eq!(m.start_ms, 30);
    }

    #[test]
    fn reinit_during_an_open_transaction_aborts_it_first_with_a_bumped_epoch() {
        let mut st = TxnState::default();
        init(&mut st, "t", 5);
        let m = TxnMachine::add_partitions(&st, "t", 5, 0, &[tp("a", 0)], 10)
            .unwrap()
            .unwrap();
        apply(&mut st, m);
        let InitOutcome::AbortFirst { record } =
            TxnMachine::init(&st, "t", 60_000, (-1, -1), None, 11).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (record.status, record.producer_epoch, record.last_epoch),
            (TxnStatus::PrepareAbort, 1, 0)
        );
        assert_eq!(
            record.partitions.len(),
            1,
            "markers go to the open partitions"
        );
        apply(&mut st, record);
        assert_eq!(
            TxnMachine::end(&st, "t", 5, 0, true, 12),
            Err(ResponseError::ProducerFenced),
            "the old producer is fenced at once"
        );
        let m = TxnMachine::markers_written(&st, "t", 1, 13).unwrap();
        apply(&mut st, m);
        let m = init(&mut st, "t", 9);
        assert_eq!((m.producer_id, m.producer_epoch), (5, 2));
    }

    #[test]
    fn kip_360_bump_with_the_current_producer_and_fencing_of_others() {
        let mut st = TxnState::default();
        init(&mut st, "t", 5);
        let InitOutcome::Ready { record } =
            TxnMachine::init(&st, "t", 60_000, (5, 0), None, 2).unwrap()
        else {
            panic!()
        };
        assert_eq!(record.producer_epoch, 1);
        apply(&mut st, record.clone());
        // A retry of that same init (it names the previous epoch).
        assert_eq!(
            TxnMachine::init(&st, "t", 60_000, (5, 0), None, 3),
            Ok(InitOutcome::Ready { record })
        );
        assert_eq!(
            TxnMachine::init(&st, "t", 60_000, (6, 1), None, 3),
            Err(ResponseError::ProducerFenced)
        );
        assert_eq!(
            TxnMachine::init(&st, "unknown", 60_000, (6, 1), None, 3),
            Err(ResponseError::InvalidProducerIdMapping)
        );
    }

    #[test]
    fn an_exhausted_epoch_moves_to_a_new_producer_id() {
        let mut st = TxnState::default();
        let mut m = init(&mut st, "t", 5);
        m.producer_epoch = EPOCH_EXHAUSTED;
        apply(&mut st, m);
        assert_eq!(
            TxnMachine::init(&st, "t", 60_000, (-1, -1), None, 2),
            Ok(InitOutcome::NeedProducerId)
        );
        let m = init(&mut st, "t", 77);
        assert_eq!((m.producer_id, m.producer_epoch), (77, 0));
    }

    #[test]
    fn timeouts_abort_with_a_bump_and_idle_ids_expire() {
        let mut st = TxnState::default();
        init(&mut st, "t", 5);
        init(&mut st, "idle", 6);
        let m = TxnMachine::add_partitions(&st, "t", 5, 0, &[tp("a", 0)], 100)
            .unwrap()
            .unwrap();
        apply(&mut st, m);
        assert!(TxnMachine::timed_out(&st, 100 + 60_000).is_empty());
        let out = TxnMachine::timed_out(&st, 100 + 60_001);
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].status, out[0].producer_epoch),
            (TxnStatus::PrepareAbort, 1)
        );
        let ex = TxnMachine::expired(&st, 1 + 1000, 1000);
        assert_eq!(
            ex,
            vec![TxnRecord::Tombstone {
                transactional_id: "idle".into()
            }],
            "an id in a transaction never expires"
        );
    }

    #[test]
    fn records_round_trip_and_torn_frames_end_the_prefix() {
        let mut st = TxnState::default();
        let mut m = init(&mut st, "t", 5);
        m.partitions.insert(tp("a", 3));
        m.partitions.insert(tp(GROUP_OFFSETS_TOPIC, 1));
        m.status = TxnStatus::PrepareCommit;
        for r in [
            TxnRecord::Txn(m),
            TxnRecord::Tombstone {
                transactional_id: "x".into(),
            },
        ] {
            let mut buf = Vec::new();
            TxnCodec::encode(&r, &mut buf).unwrap();
            let (f, n) = TxnCodec::decode(&buf).unwrap();
            assert_eq!((f, n), (Frame::Record(r), buf.len()));
            for cut in 0..buf.len() {
                assert!(TxnCodec::decode(&buf[..cut]).is_none());
            }
        }
    }

    /// The transaction states the crash scenario writes, in order, per id:
    /// init, add, prepare, complete; a second id interleaved.
    fn history() -> Vec<TxnMeta> {
        let mut st = TxnState::default();
        let mut out = Vec::new();
        for (id, pid) in [("t", 5), ("u", 6)] {
            out.push(init(&mut st, id, pid));
        }
        for (id, pid, commit) in [("t", 5, true), ("u", 6, false)] {
            let m = TxnMachine::add_partitions(&st, id, pid, 0, &[tp("a", 0)], 10)
                .unwrap()
                .unwrap();
            apply(&mut st, m.clone());
            out.push(m);
            let m = TxnMachine::end(&st, id, pid, 0, commit, 11)
                .unwrap()
                .unwrap();
            apply(&mut st, m.clone());
            out.push(m);
        }
        for id in ["t", "u"] {
            let m = TxnMachine::markers_written(&st, id, 0, 12).unwrap();
            apply(&mut st, m.clone());
            out.push(m);
        }
        out
    }

    /// Appends the history with group commits and a compaction in the
    /// middle; records which states were acknowledged (a sync returned).
    fn scenario(
        fs: kaas_volume::fs::SharedFs,
        cluster: &Path,
        acked: &mut BTreeMap<String, usize>,
    ) -> Result<(), crate::group::log::ShardLogError> {
        let mut log = TxnLog::open(fs, cluster, ShardId(1), 1, Default::default())?;
        let h = history();
        let mut unacked = Vec::new();
        for (i, m) in h.iter().enumerate() {
            log.append(&[TxnRecord::Txn(m.clone())])?;
            unacked.push((m.transactional_id.clone(), i));
            if i % 2 == 1 {
                if i == 3 {
                    log.compact()?;
                } else {
                    log.sync_now()?;
                }
                for (id, i) in unacked.drain(..) {
                    acked.insert(id, i);
                }
            }
        }
        Ok(())
    }

    #[test]
    fn crash_at_every_step_of_the_transaction_state_writes() {
        use kaas_volume::fs::fault::FaultFs;
        use std::sync::Arc;
        let h = history();
        let clean = FaultFs::new();
        let dir = tempfile::tempdir().unwrap();
        scenario(Arc::new(clean.clone()), dir.path(), &mut BTreeMap::new()).unwrap();
        let steps = clean.ops();
        assert!(steps > 10, "{:?}", clean.log());
        for n in 1..=steps + 1 {
            let dir = tempfile::tempdir().unwrap();
            let fs = FaultFs::new();
            fs.crash_at(n);
            let mut acked = BTreeMap::new();
            let _ = scenario(Arc::new(fs.clone()), dir.path(), &mut acked);
            fs.power_loss();
            let log = TxnLog::open(
                Arc::new(FaultFs::new()),
                dir.path(),
                ShardId(1),
                2,
                Default::default(),
            )
            .unwrap_or_else(|e| panic!("crash at {n}: reopen failed: {e}"));
            for (id, m) in &log.state().txns {
                let at = h
                    .iter()
                    .position(|x| x == m)
                    .unwrap_or_else(|| panic!("crash at {n}: {m:?} never written"));
                if let Some(&a) = acked.get(id) {
                    assert!(at >= a, "crash at {n}: {id} went back from #{a} to #{at}");
                }
            }
            for id in acked.keys() {
                assert!(
                    log.state().txns.contains_key(id),
                    "crash at {n}: acknowledged {id} lost"
                );
            }
        }
    }
}
