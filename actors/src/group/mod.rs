//! Consumer groups: the group coordinator, one actor per coordinator shard.
//!
//! What owns what:
//!
//! * [`shard`] maps a group to one of a fixed number of coordinator shards
//!   (Kafka's `abs(groupId.hashCode()) % partitions`, fixed at cluster
//!   creation like `__consumer_offsets`' partition count, recorded once in
//!   `<cluster>/group-shards.json`). The controller grants shards like
//!   partitions (`Assignment::coordinators`).
//! * [`log::ShardLog`] is a shard's state on the volume:
//!   `<cluster>/groups/<shard>/<base>-e<E>.log` ([`names`]), an append-only,
//!   CRC32C-framed log of [`offsets::Record`]s (offset commits, tombstones,
//!   group metadata) that begins with a snapshot of the live state. Group
//!   commit (`append` → ticket, `sync_target` / `complete_sync`), recovery
//!   to the last valid frame, compaction (temp → fsync → rename → dir
//!   fsync), and fencing by the epoch in the name. [`offsets::expire`] is
//!   offset retention as a pure function. The log is generic over a
//!   [`log::ShardCodec`]; the transaction coordinator (`crate::txn`) uses
//!   it for its own shard files. Transactional offsets (TxnOffsetCommit)
//!   wait in [`offsets::ShardState::pending`] for their marker.
//! * [`classic::ClassicGroups`] is the classic membership protocol of one
//!   shard's groups as a plain state machine on the `Clock` seam: requests
//!   in, responses out (deferred joins and syncs come back in an
//!   [`classic::Output`] with the records to persist before answering).
//! * [`consumer::ConsumerGroups`] is the KIP-848 consumer protocol
//!   (`group.protocol=consumer`) of the same shard's groups, with the
//!   server-side assignors of [`assignor`]; its records travel in the same
//!   log ([`offsets::Record::Consumer`]).
//! * [`coordinator::GroupCoordinator`] is the actor per granted shard that
//!   drives them all (see its docs); [`messages`] are what the broker's
//!   group APIs send it.
//!
//! Left: lag metrics, moving [`names`] into `kaas_volume::layout`.

pub mod assignor;
pub mod classic;
pub mod consumer;
pub mod coordinator;
pub mod lag;
pub mod log;
pub mod messages;
pub mod names;
pub mod offsets;
pub mod shard;
