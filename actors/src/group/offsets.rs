//! What a coordinator shard remembers — committed offsets and group
//! metadata — as records, their on-disk encoding, the live state they fold
//! into, and offset expiry.
//!
//! A shard's file ([`super::log::ShardLog`]) is a sequence of frames:
//!
//! ```text
//! frame  = len:u32 BE | crc:u32 BE (CRC32C of body) | body (len bytes)
//! body   = type:u8 | fields…
//! ```
//!
//! Integers are big-endian; strings are `u16` length + UTF-8; optional
//! fields carry a `u8` presence flag; opaque bytes (subscriptions,
//! assignments) a `u32` length. The record types are Kafka's
//! `__consumer_offsets` keys and values in spirit (offset commit, offset
//! tombstone, group metadata, group tombstone, a transactional offset
//! pending for its producer, and the transaction marker that commits or
//! drops a producer's pending offsets) plus a header that opens
//! every file and names the shard, epoch and file number it was written as,
//! so a file can never be mistaken for another's.
//!
//! Decoding never panics and never allocates more than the frame it was
//! given: a frame that is short, fails its CRC, or does not parse ends the
//! valid prefix of the file (a torn tail).

use std::collections::{BTreeMap, BTreeSet};

/// A frame body never exceeds this on disk (a group of many members with
/// big subscriptions is the largest record); anything claiming more is a
/// torn or corrupt length.
pub const MAX_RECORD: usize = 64 << 20;

/// Bytes of a frame header (length + CRC).
pub const FRAME_HEADER: usize = 8;

/// A committed offset (Kafka's `OffsetAndMetadata` plus the commit record's
/// timestamps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetValue {
    /// The committed offset.
    pub offset: i64,
    /// The leader epoch the client saw at that offset (-1: none).
    pub leader_epoch: i32,
    /// The client's metadata string.
    pub metadata: Option<String>,
    /// Wall-clock ms when the coordinator accepted the commit.
    pub commit_ms: i64,
    /// OffsetCommit v1's explicit expiry (ms), when a client sent one.
    pub expire_ms: Option<i64>,
}

/// One member as persisted with its group (enough to rebuild a Stable
/// group after takeover: who is in it, with which assignment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberMetadata {
    /// The coordinator-issued member id.
    pub member_id: String,
    /// `group.instance.id` of a static member.
    pub instance_id: Option<String>,
    /// The client id it joined with.
    pub client_id: String,
    /// The client's host as the coordinator saw it.
    pub client_host: String,
    /// Its rebalance timeout (ms).
    pub rebalance_timeout_ms: i32,
    /// Its session timeout (ms).
    pub session_timeout_ms: i32,
    /// Its metadata for the selected protocol (opaque to the coordinator).
    pub subscription: Vec<u8>,
    /// Its assignment from the leader (opaque).
    pub assignment: Vec<u8>,
}

/// A classic group as persisted at the end of each rebalance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMetadata {
    /// The group id.
    pub group: String,
    /// `consumer`, `connect`, … (`None`: a group that never had members).
    pub protocol_type: Option<String>,
    /// Generation id.
    pub generation: i32,
    /// The selected protocol (assignor).
    pub protocol: Option<String>,
    /// The leader's member id.
    pub leader: Option<String>,
    /// Wall-clock ms of the state this record describes; for a group with
    /// no members, when it became empty (offset expiry counts from it).
    pub state_ms: i64,
    /// The members of this generation.
    pub members: Vec<MemberMetadata>,
}

/// A shard record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// An offset commit.
    Offset {
        /// The group.
        group: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// What was committed.
        value: OffsetValue,
    },
    /// An offset removed (OffsetDelete, DeleteGroups, expiry).
    OffsetTombstone {
        /// The group.
        group: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// A group's membership at the end of a rebalance (or when it emptied).
    Group(GroupMetadata),
    /// A group removed (DeleteGroups, or expired with no offsets left).
    GroupTombstone {
        /// The group.
        group: String,
    },
    /// A KIP-848 consumer-protocol record ([`super::consumer`]).
    Consumer(super::consumer::ConsumerRecord),
    /// A transactional offset commit (TxnOffsetCommit, KIP-98/447): held
    /// pending for the producer, invisible to OffsetFetch, until the
    /// transaction's marker commits or drops it ([`Record::TxnEnd`]).
    TxnOffset {
        /// The group.
        group: String,
        /// The transactional producer.
        producer_id: i64,
        /// Its epoch at the commit.
        producer_epoch: i16,
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// What was committed.
        value: OffsetValue,
    },
    /// The transaction coordinator's marker for this shard: the producer's
    /// pending offsets become committed offsets (`commit`) or are dropped.
    TxnEnd {
        /// The transactional producer.
        producer_id: i64,
        /// Commit (true) or abort.
        commit: bool,
    },
}

/// A producer's pending transactional offsets in one shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingTxn {
    /// The producer epoch of the latest TxnOffsetCommit.
    pub producer_epoch: i16,
    /// The offsets, by (group, topic, partition).
    pub offsets: BTreeMap<OffsetKey, OffsetValue>,
}

/// Where an offset is: (group, topic, partition).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OffsetKey {
    /// The group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
}

/// The live state of a shard: what the records fold into, and all a
/// compaction writes back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardState {
    /// Latest committed offset per (group, topic, partition).
    pub offsets: BTreeMap<OffsetKey, OffsetValue>,
    /// Latest metadata per live group.
    pub groups: BTreeMap<String, GroupMetadata>,
    /// KIP-848 consumer groups ([`super::consumer`]).
    pub consumer: super::consumer::StoredGroups,
    /// Transactional offsets not yet committed, by producer id.
    pub pending: BTreeMap<i64, PendingTxn>,
}

impl ShardState {
    /// Fold one record in (later records win, tombstones remove).
    pub fn apply(&mut self, r: &Record) {
        match r {
            Record::Offset {
                group,
                topic,
                partition,
                value,
            } => {
                self.offsets
                    .insert(key(group, topic, *partition), value.clone());
            }
            Record::OffsetTombstone {
                group,
                topic,
                partition,
            } => {
                let k = key(group, topic, *partition);
                // As Kafka's OffsetMetadataManager replay: a tombstone also
                // drops every producer's pending offset for the key, so a
                // deleted group (or offset) is not revived by a later commit
                // marker.
                for p in self.pending.values_mut() {
                    p.offsets.remove(&k);
                }
                self.offsets.remove(&k);
            }
            Record::Group(g) => {
                self.groups.insert(g.group.clone(), g.clone());
            }
            Record::GroupTombstone { group } => {
                self.groups.remove(group);
            }
            Record::Consumer(c) => super::consumer::apply(&mut self.consumer, c),
            Record::TxnOffset {
                group,
                producer_id,
                producer_epoch,
                topic,
                partition,
                value,
            } => {
                let p = self.pending.entry(*producer_id).or_default();
                p.producer_epoch = *producer_epoch;
                p.offsets
                    .insert(key(group, topic, *partition), value.clone());
            }
            Record::TxnEnd {
                producer_id,
                commit,
            } => {
                if let Some(p) = self.pending.remove(producer_id) {
                    if *commit {
                        self.offsets.extend(p.offsets);
                    }
                }
            }
        }
    }

    /// Whether any producer holds a pending offset for (group, topic,
    /// partition) (OffsetFetch with require_stable answers
    /// UNSTABLE_OFFSET_COMMIT for it).
    pub fn has_pending(&self, group: &str, topic: &str, partition: i32) -> bool {
        let k = key(group, topic, partition);
        self.pending.values().any(|p| p.offsets.contains_key(&k))
    }

    /// The keys of `group` that some producer holds a pending offset for
    /// and that have no committed offset (DeleteGroups tombstones these
    /// too, as Kafka's `deleteAllOffsets`).
    pub fn group_pending_only(&self, group: &str) -> BTreeSet<OffsetKey> {
        self.pending
            .values()
            .flat_map(|p| p.offsets.keys())
            .filter(|k| k.group == group && !self.offsets.contains_key(*k))
            .cloned()
            .collect()
    }

    /// Whether any producer holds a pending offset of `group`.
    pub fn group_has_pending(&self, group: &str) -> bool {
        self.pending
            .values()
            .any(|p| p.offsets.keys().any(|k| k.group == group))
    }

    /// The live state as records: replaying them into an empty state gives
    /// this state back (what a compaction writes).
    pub fn records(&self) -> impl Iterator<Item = Record> + '_ {
        let groups = self.groups.values().cloned().map(Record::Group);
        let offsets = self.offsets.iter().map(|(k, v)| Record::Offset {
            group: k.group.clone(),
            topic: k.topic.clone(),
            partition: k.partition,
            value: v.clone(),
        });
        let consumer = super::consumer::records(&self.consumer).map(Record::Consumer);
        let pending = self.pending.iter().flat_map(|(pid, p)| {
            p.offsets.iter().map(move |(k, v)| Record::TxnOffset {
                group: k.group.clone(),
                producer_id: *pid,
                producer_epoch: p.producer_epoch,
                topic: k.topic.clone(),
                partition: k.partition,
                value: v.clone(),
            })
        });
        groups.chain(consumer).chain(offsets).chain(pending)
    }

    /// The committed offsets of one group.
    pub fn group_offsets<'a>(
        &'a self,
        group: &'a str,
    ) -> impl Iterator<Item = (&'a OffsetKey, &'a OffsetValue)> + 'a {
        self.offsets
            .range(key(group, "", i32::MIN)..)
            .take_while(move |(k, _)| k.group == group)
    }
}

fn key(group: &str, topic: &str, partition: i32) -> OffsetKey {
    OffsetKey {
        group: group.to_string(),
        topic: topic.to_string(),
        partition,
    }
}

// ---------------------------------------------------------------- expiry

/// Whether an offset has expired, with Kafka's `offsets.retention.minutes`
/// rules (`GroupMetadata.removeExpiredOffsets`, KIP-211):
///
/// * an explicit expiry from an OffsetCommit v1 wins: expired at that time;
/// * a group with a protocol type and no members: `retention` after the
///   group became empty (its `state_ms`);
/// * a group that never had a protocol type (a standalone consumer using
///   the coordinator for offsets only), or no group record at all:
///   `retention` after the commit;
/// * a group with members: never. (Kafka also expires a Stable consumer
///   group's offsets of topics it no longer subscribes to; that needs the
///   subscriptions decoded, which this coordinator does not do yet.)
pub fn offset_expired(
    v: &OffsetValue,
    group: Option<&GroupMetadata>,
    now_ms: i64,
    retention_ms: i64,
) -> bool {
    if let Some(at) = v.expire_ms {
        return now_ms >= at;
    }
    let base = match group {
        Some(g) if !g.members.is_empty() => return false,
        Some(g) if g.protocol_type.is_some() => g.state_ms,
        _ => v.commit_ms,
    };
    // Wall clocks can step backwards; a negative age is simply not expired.
    now_ms
        .checked_sub(base)
        .is_some_and(|age| age >= retention_ms)
}

/// The records that expire what is due at `now_ms`: a tombstone per
/// expired offset, and a group tombstone for every empty group left with no
/// offsets (Kafka then marks it Dead). Pure; the owner appends them.
pub fn expire(state: &ShardState, now_ms: i64, retention_ms: i64) -> Vec<Record> {
    let mut out = Vec::new();
    let mut left: BTreeMap<&str, usize> = BTreeMap::new();
    for (k, v) in &state.offsets {
        let g = state.groups.get(&k.group);
        if offset_expired(v, g, now_ms, retention_ms) {
            out.push(Record::OffsetTombstone {
                group: k.group.clone(),
                topic: k.topic.clone(),
                partition: k.partition,
            });
        } else {
            *left.entry(&k.group).or_default() += 1;
        }
    }
    for g in state.groups.values() {
        if g.members.is_empty() && !left.contains_key(g.group.as_str()) {
            out.push(Record::GroupTombstone {
                group: g.group.clone(),
            });
        }
    }
    out
}

// -------------------------------------------------------------- encoding

/// Why a record could not be encoded (nothing was written).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    /// A string longer than the format allows (Kafka's own limit is the
    /// same `i16` length).
    #[error("{0} is longer than {max} bytes", max = u16::MAX)]
    TooLong(&'static str),
    /// The record is larger than [`MAX_RECORD`].
    #[error("record of {0} bytes is larger than the limit")]
    TooLarge(usize),
}

const T_HEADER: u8 = 0;
const T_OFFSET: u8 = 1;
const T_OFFSET_TOMBSTONE: u8 = 2;
const T_GROUP: u8 = 3;
const T_GROUP_TOMBSTONE: u8 = 4;
/// A consumer-protocol record: its body is JSON (self-describing, so
/// fields can be added; written once per membership change, never per
/// commit, so its size does not matter).
const T_CONSUMER: u8 = 5;
const T_TXN_OFFSET: u8 = 6;
const T_TXN_END: u8 = 7;

/// The first frame of every shard file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Shard number.
    pub shard: u32,
    /// The writer's epoch.
    pub epoch: i32,
    /// The file's number.
    pub base: u64,
}

/// A writer of a frame body (shared by the shard codecs).
pub(crate) struct W(pub(crate) Vec<u8>);

impl W {
    pub(crate) fn i16(&mut self, v: i16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(crate) fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(crate) fn str(&mut self, what: &'static str, s: &str) -> Result<(), EncodeError> {
        let n = u16::try_from(s.len()).map_err(|_| EncodeError::TooLong(what))?;
        self.0.extend_from_slice(&n.to_be_bytes());
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
    pub(crate) fn opt_str(
        &mut self,
        what: &'static str,
        s: Option<&str>,
    ) -> Result<(), EncodeError> {
        match s {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(what, s)?;
            }
        }
        Ok(())
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) -> Result<(), EncodeError> {
        if b.len() > MAX_RECORD {
            return Err(EncodeError::TooLarge(b.len()));
        }
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        Ok(())
    }
}

/// Append one framed record to `out`. On error `out` is unchanged.
pub fn encode(r: &Record, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let mut w = W(Vec::new());
    match r {
        Record::Offset {
            group,
            topic,
            partition,
            value,
        } => {
            w.u8(T_OFFSET);
            w.str("group id", group)?;
            w.str("topic", topic)?;
            w.i32(*partition);
            w.i64(value.offset);
            w.i32(value.leader_epoch);
            w.opt_str("offset metadata", value.metadata.as_deref())?;
            w.i64(value.commit_ms);
            match value.expire_ms {
                None => w.u8(0),
                Some(t) => {
                    w.u8(1);
                    w.i64(t);
                }
            }
        }
        Record::OffsetTombstone {
            group,
            topic,
            partition,
        } => {
            w.u8(T_OFFSET_TOMBSTONE);
            w.str("group id", group)?;
            w.str("topic", topic)?;
            w.i32(*partition);
        }
        Record::Group(g) => {
            w.u8(T_GROUP);
            w.str("group id", &g.group)?;
            w.opt_str("protocol type", g.protocol_type.as_deref())?;
            w.i32(g.generation);
            w.opt_str("protocol", g.protocol.as_deref())?;
            w.opt_str("leader", g.leader.as_deref())?;
            w.i64(g.state_ms);
            let n =
                u32::try_from(g.members.len()).map_err(|_| EncodeError::TooLarge(usize::MAX))?;
            w.u32(n);
            for m in &g.members {
                w.str("member id", &m.member_id)?;
                w.opt_str("group instance id", m.instance_id.as_deref())?;
                w.str("client id", &m.client_id)?;
                w.str("client host", &m.client_host)?;
                w.i32(m.rebalance_timeout_ms);
                w.i32(m.session_timeout_ms);
                w.bytes(&m.subscription)?;
                w.bytes(&m.assignment)?;
                if w.0.len() > MAX_RECORD {
                    return Err(EncodeError::TooLarge(w.0.len()));
                }
            }
        }
        Record::GroupTombstone { group } => {
            w.u8(T_GROUP_TOMBSTONE);
            w.str("group id", group)?;
        }
        Record::Consumer(c) => {
            w.u8(T_CONSUMER);
            let json =
                serde_json::to_vec(c).map_err(|_| EncodeError::TooLong("consumer record"))?;
            w.0.extend_from_slice(&json);
        }
        Record::TxnOffset {
            group,
            producer_id,
            producer_epoch,
            topic,
            partition,
            value,
        } => {
            w.u8(T_TXN_OFFSET);
            w.str("group id", group)?;
            w.i64(*producer_id);
            w.i16(*producer_epoch);
            w.str("topic", topic)?;
            w.i32(*partition);
            w.i64(value.offset);
            w.i32(value.leader_epoch);
            w.opt_str("offset metadata", value.metadata.as_deref())?;
            w.i64(value.commit_ms);
            match value.expire_ms {
                None => w.u8(0),
                Some(t) => {
                    w.u8(1);
                    w.i64(t);
                }
            }
        }
        Record::TxnEnd {
            producer_id,
            commit,
        } => {
            w.u8(T_TXN_END);
            w.i64(*producer_id);
            w.u8(u8::from(*commit));
        }
    }
    frame(&w.0, out)
}

/// Append the header frame to `out`.
pub fn encode_header(h: Header, out: &mut Vec<u8>) {
    let mut w = W(Vec::with_capacity(17));
    w.u8(T_HEADER);
    w.u32(h.shard);
    w.i32(h.epoch);
    w.u64(h.base);
    // A 17-byte body always fits.
    let _ = frame(&w.0, out);
}

pub(crate) fn frame(body: &[u8], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    if body.len() > MAX_RECORD {
        return Err(EncodeError::TooLarge(body.len()));
    }
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_be_bytes());
    out.extend_from_slice(body);
    Ok(())
}

/// A decoded frame (of the group records, or of another shard codec's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<R = Record> {
    /// The file header.
    Header(Header),
    /// A record.
    Record(R),
}

/// Decode the frame at the start of `buf`: the frame and its length, or
/// `None` if there is no whole, valid frame there (the end of the valid
/// prefix).
pub fn decode(buf: &[u8]) -> Option<(Frame, usize)> {
    decode_with(buf, decode_record)
}

/// The framing every shard codec shares: length, CRC32C, the header frame
/// (type 0); any other type is handed to `record` with the body after the
/// type byte. Trailing bytes inside a CRC-valid frame mean a format this
/// reader does not know: stop rather than misread.
pub(crate) fn decode_with<T>(
    buf: &[u8],
    record: impl FnOnce(u8, &mut R<'_>) -> Option<T>,
) -> Option<(Frame<T>, usize)> {
    let len = u32::from_be_bytes(buf.get(0..4)?.try_into().ok()?) as usize;
    if len > MAX_RECORD {
        return None;
    }
    let crc = u32::from_be_bytes(buf.get(4..8)?.try_into().ok()?);
    let body = buf.get(FRAME_HEADER..FRAME_HEADER.checked_add(len)?)?;
    if crc32c::crc32c(body) != crc {
        return None;
    }
    let mut r = R(body);
    let f = match r.u8()? {
        T_HEADER => Frame::Header(Header {
            shard: r.u32()?,
            epoch: r.i32()?,
            base: r.u64()?,
        }),
        tag => Frame::Record(record(tag, &mut r)?),
    };
    if !r.0.is_empty() {
        return None;
    }
    Some((f, FRAME_HEADER + len))
}

fn decode_record(tag: u8, r: &mut R<'_>) -> Option<Record> {
    Some(match tag {
        T_OFFSET => Record::Offset {
            group: r.str()?,
            topic: r.str()?,
            partition: r.i32()?,
            value: OffsetValue {
                offset: r.i64()?,
                leader_epoch: r.i32()?,
                metadata: r.opt_str()?,
                commit_ms: r.i64()?,
                expire_ms: match r.u8()? {
                    0 => None,
                    1 => Some(r.i64()?),
                    _ => return None,
                },
            },
        },
        T_OFFSET_TOMBSTONE => Record::OffsetTombstone {
            group: r.str()?,
            topic: r.str()?,
            partition: r.i32()?,
        },
        T_GROUP => {
            let group = r.str()?;
            let protocol_type = r.opt_str()?;
            let generation = r.i32()?;
            let protocol = r.opt_str()?;
            let leader = r.opt_str()?;
            let state_ms = r.i64()?;
            let n = r.u32()? as usize;
            // Each member takes at least 24 bytes: a count larger than the
            // body could hold is corrupt, and must not size an allocation.
            if n > r.0.len() / 24 {
                return None;
            }
            let mut members = Vec::with_capacity(n);
            for _ in 0..n {
                members.push(MemberMetadata {
                    member_id: r.str()?,
                    instance_id: r.opt_str()?,
                    client_id: r.str()?,
                    client_host: r.str()?,
                    rebalance_timeout_ms: r.i32()?,
                    session_timeout_ms: r.i32()?,
                    subscription: r.bytes()?,
                    assignment: r.bytes()?,
                });
            }
            Record::Group(GroupMetadata {
                group,
                protocol_type,
                generation,
                protocol,
                leader,
                state_ms,
                members,
            })
        }
        T_GROUP_TOMBSTONE => Record::GroupTombstone { group: r.str()? },
        T_CONSUMER => {
            let c = serde_json::from_slice(r.0).ok()?;
            r.0 = &[];
            Record::Consumer(c)
        }
        T_TXN_OFFSET => Record::TxnOffset {
            group: r.str()?,
            producer_id: r.i64()?,
            producer_epoch: r.i16()?,
            topic: r.str()?,
            partition: r.i32()?,
            value: decode_value(r)?,
        },
        T_TXN_END => Record::TxnEnd {
            producer_id: r.i64()?,
            commit: match r.u8()? {
                0 => false,
                1 => true,
                _ => return None,
            },
        },
        _ => return None,
    })
}

fn decode_value(r: &mut R<'_>) -> Option<OffsetValue> {
    Some(OffsetValue {
        offset: r.i64()?,
        leader_epoch: r.i32()?,
        metadata: r.opt_str()?,
        commit_ms: r.i64()?,
        expire_ms: match r.u8()? {
            0 => None,
            1 => Some(r.i64()?),
            _ => return None,
        },
    })
}

/// A reader over a frame body (shared by the shard codecs).
pub(crate) struct R<'a>(pub(crate) &'a [u8]);

impl R<'_> {
    pub(crate) fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    pub(crate) fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn i64(&mut self) -> Option<i64> {
        Some(i64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    pub(crate) fn str(&mut self) -> Option<String> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
    pub(crate) fn opt_str(&mut self) -> Option<Option<String>> {
        match self.u8()? {
            0 => Some(None),
            1 => Some(Some(self.str()?)),
            _ => None,
        }
    }
    pub(crate) fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.u32()? as usize;
        Some(self.take(n)?.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn offset(group: &str, topic: &str, p: i32, off: i64, commit_ms: i64) -> Record {
        Record::Offset {
            group: group.into(),
            topic: topic.into(),
            partition: p,
            value: OffsetValue {
                offset: off,
                leader_epoch: 3,
                metadata: Some("m".into()),
                commit_ms,
                expire_ms: None,
            },
        }
    }

    fn group(
        name: &str,
        members: usize,
        protocol_type: Option<&str>,
        state_ms: i64,
    ) -> GroupMetadata {
        GroupMetadata {
            group: name.into(),
            protocol_type: protocol_type.map(Into::into),
            generation: 4,
            protocol: Some("range".into()),
            leader: (members > 0).then(|| "m-0".into()),
            state_ms,
            members: (0..members)
                .map(|i| MemberMetadata {
                    member_id: format!("m-{i}"),
                    instance_id: (i == 0).then(|| "static-0".into()),
                    client_id: "c".into(),
                    client_host: "/127.0.0.1".into(),
                    rebalance_timeout_ms: 30_000,
                    session_timeout_ms: 10_000,
                    subscription: vec![1, 2, 3],
                    assignment: vec![],
                })
                .collect(),
        }
    }

    #[test]
    fn every_record_type_round_trips() {
        let records = vec![
            offset("g", "t", 0, 42, 1),
            Record::Offset {
                group: "g".into(),
                topic: "t".into(),
                partition: 1,
                value: OffsetValue {
                    offset: i64::MAX,
                    leader_epoch: -1,
                    metadata: None,
                    commit_ms: -5,
                    expire_ms: Some(99),
                },
            },
            Record::OffsetTombstone {
                group: "g".into(),
                topic: "t".into(),
                partition: 0,
            },
            Record::Group(group("g", 3, Some("consumer"), 7)),
            Record::Group(group("h", 0, None, 7)),
            Record::GroupTombstone { group: "g".into() },
            txn_offset("g", 7, 2, "t", 3, 11),
            Record::TxnEnd {
                producer_id: 7,
                commit: true,
            },
            Record::TxnEnd {
                producer_id: -1,
                commit: false,
            },
        ];
        let mut buf = Vec::new();
        encode_header(
            Header {
                shard: 3,
                epoch: 9,
                base: 2,
            },
            &mut buf,
        );
        for r in &records {
            encode(r, &mut buf).unwrap();
        }
        let mut pos = 0;
        let mut got = Vec::new();
        while let Some((f, n)) = decode(&buf[pos..]) {
            got.push(f);
            pos += n;
        }
        assert_eq!(pos, buf.len());
        assert_eq!(
            got[0],
            Frame::Header(Header {
                shard: 3,
                epoch: 9,
                base: 2
            })
        );
        let got: Vec<_> = got[1..]
            .iter()
            .map(|f| match f {
                Frame::Record(r) => r.clone(),
                f => panic!("{f:?}"),
            })
            .collect();
        assert_eq!(got, records);
    }

    #[test]
    fn a_torn_or_corrupt_frame_ends_the_valid_prefix() {
        let mut buf = Vec::new();
        encode(&offset("g", "t", 0, 1, 1), &mut buf).unwrap();
        let one = buf.len();
        encode(&offset("g", "t", 0, 2, 1), &mut buf).unwrap();
        for cut in one..buf.len() {
            assert!(decode(&buf[one..cut]).is_none(), "cut at {cut}");
        }
        let mut flipped = buf.clone();
        flipped[one + 10] ^= 1;
        assert!(decode(&flipped[one..]).is_none());
        // A length claiming more than the limit is not believed.
        let mut huge = vec![0xff; 8];
        huge.extend_from_slice(&[0; 32]);
        assert!(decode(&huge).is_none());
    }

    #[test]
    fn a_member_count_beyond_the_body_is_corrupt_not_an_allocation() {
        let mut w = W(Vec::new());
        w.u8(T_GROUP);
        w.str("g", "g").unwrap();
        w.u8(0);
        w.i32(1);
        w.u8(0);
        w.u8(0);
        w.i64(0);
        w.u32(u32::MAX);
        let mut buf = Vec::new();
        frame(&w.0, &mut buf).unwrap();
        assert!(decode(&buf).is_none());
    }

    #[test]
    fn over_long_strings_are_refused_and_nothing_is_written() {
        let mut buf = vec![7];
        let r = offset(&"g".repeat(70_000), "t", 0, 1, 1);
        assert_eq!(encode(&r, &mut buf), Err(EncodeError::TooLong("group id")));
        assert_eq!(buf, vec![7]);
    }

    fn txn_offset(group: &str, pid: i64, epoch: i16, topic: &str, p: i32, off: i64) -> Record {
        Record::TxnOffset {
            group: group.into(),
            producer_id: pid,
            producer_epoch: epoch,
            topic: topic.into(),
            partition: p,
            value: OffsetValue {
                offset: off,
                leader_epoch: -1,
                metadata: Some("m".into()),
                commit_ms: 4,
                expire_ms: None,
            },
        }
    }

    #[test]
    fn transactional_offsets_stay_pending_until_their_marker() {
        let mut s = ShardState::default();
        s.apply(&offset("g", "t", 0, 1, 1));
        s.apply(&txn_offset("g", 7, 0, "t", 0, 5));
        s.apply(&txn_offset("g", 7, 0, "t", 1, 6));
        s.apply(&txn_offset("g", 8, 3, "t", 2, 9));
        assert_eq!(s.offsets.len(), 1, "pending offsets are not committed");
        assert!(s.has_pending("g", "t", 0) && s.has_pending("g", "t", 2));
        assert!(!s.has_pending("g", "t", 3) && !s.has_pending("h", "t", 0));
        assert!(s.group_has_pending("g"));
        assert_eq!(
            s.group_pending_only("g").into_iter().collect::<Vec<_>>(),
            [key("g", "t", 1), key("g", "t", 2)]
        );
        // A tombstone drops the pending offsets of its key too (Kafka).
        let mut deleted = s.clone();
        deleted.apply(&Record::OffsetTombstone {
            group: "g".into(),
            topic: "t".into(),
            partition: 2,
        });
        assert!(!deleted.has_pending("g", "t", 2) && deleted.has_pending("g", "t", 1));
        deleted.apply(&Record::TxnEnd {
            producer_id: 8,
            commit: true,
        });
        assert!(!deleted.offsets.contains_key(&key("g", "t", 2)));
        // Compaction writes the pending offsets back.
        let mut again = ShardState::default();
        for r in s.records() {
            again.apply(&r);
        }
        assert_eq!(again, s);
        s.apply(&Record::TxnEnd {
            producer_id: 7,
            commit: true,
        });
        s.apply(&Record::TxnEnd {
            producer_id: 8,
            commit: false,
        });
        s.apply(&Record::TxnEnd {
            producer_id: 8,
            commit: true,
        });
        assert!(s.pending.is_empty());
        let got: Vec<(i32, i64)> = s
            .group_offsets("g")
            .map(|(k, v)| (k.partition, v.offset))
            .collect();
        assert_eq!(
            got,
            vec![(0, 5), (1, 6)],
            "8 aborted; a repeated marker is a no-op"
        );
    }

    #[test]
    fn state_folds_records_and_gives_them_back() {
        let mut s = ShardState::default();
        s.apply(&offset("g", "t", 0, 1, 1));
        s.apply(&offset("g", "t", 0, 5, 2));
        s.apply(&offset("g", "u", 1, 9, 2));
        s.apply(&offset("h", "t", 0, 3, 2));
        s.apply(&Record::OffsetTombstone {
            group: "g".into(),
            topic: "u".into(),
            partition: 1,
        });
        s.apply(&Record::Group(group("g", 1, Some("consumer"), 1)));
        s.apply(&Record::Group(group("x", 0, Some("consumer"), 1)));
        s.apply(&Record::GroupTombstone { group: "x".into() });
        assert_eq!(s.offsets.len(), 2);
        assert_eq!(s.group_offsets("g").count(), 1);
        assert_eq!(s.group_offsets("g").next().unwrap().1.offset, 5);
        assert_eq!(s.groups.keys().collect::<Vec<_>>(), vec!["g"]);
        let mut again = ShardState::default();
        for r in s.records() {
            again.apply(&r);
        }
        assert_eq!(again, s);
    }

    #[test]
    fn offsets_expire_with_kafkas_retention_rules() {
        let day = 24 * 3600 * 1000;
        let retention = 7 * day;
        let v = |commit_ms, expire_ms| OffsetValue {
            offset: 1,
            leader_epoch: -1,
            metadata: None,
            commit_ms,
            expire_ms,
        };
        // Standalone consumer (no group record / no protocol type): from the commit.
        assert!(!offset_expired(&v(0, None), None, retention - 1, retention));
        assert!(offset_expired(&v(0, None), None, retention, retention));
        let simple = group("s", 0, None, 5 * day);
        assert!(offset_expired(
            &v(0, None),
            Some(&simple),
            retention,
            retention
        ));
        // Empty group: from when it became empty, however old the commit.
        let empty = group("e", 0, Some("consumer"), 5 * day);
        assert!(!offset_expired(
            &v(0, None),
            Some(&empty),
            retention,
            retention
        ));
        assert!(offset_expired(
            &v(0, None),
            Some(&empty),
            12 * day,
            retention
        ));
        // A group with members: never.
        let live = group("l", 2, Some("consumer"), 0);
        assert!(!offset_expired(
            &v(0, None),
            Some(&live),
            100 * day,
            retention
        ));
        // An explicit expiry wins.
        assert!(offset_expired(&v(0, Some(10)), Some(&live), 10, retention));
        assert!(!offset_expired(&v(0, Some(10)), None, 9, retention));
        // A wall clock stepping backwards expires nothing.
        assert!(!offset_expired(
            &v(i64::MAX, None),
            None,
            i64::MIN,
            retention
        ));
    }

    #[test]
    fn expiry_tombstones_offsets_and_then_the_empty_group() {
        let mut s = ShardState::default();
        s.apply(&Record::Group(group("e", 0, Some("consumer"), 100)));
        s.apply(&offset("e", "t", 0, 1, 0));
        s.apply(&Record::Group(group("l", 2, Some("consumer"), 0)));
        s.apply(&offset("l", "t", 0, 1, 0));
        s.apply(&offset("s", "t", 0, 1, 100));
        assert!(expire(&s, 149, 50).is_empty());
        let out = expire(&s, 150, 50);
        assert_eq!(
            out,
            vec![
                Record::OffsetTombstone {
                    group: "e".into(),
                    topic: "t".into(),
                    partition: 0
                },
                Record::OffsetTombstone {
                    group: "s".into(),
                    topic: "t".into(),
                    partition: 0
                },
                Record::GroupTombstone { group: "e".into() },
            ]
        );
    }
}
