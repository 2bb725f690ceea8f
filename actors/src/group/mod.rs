//! Consumer groups (in progress): the tested core of the group coordinator,
//! not yet wired to any API or actor.
//!
//! What owns what:
//!
//! * [`shard`] maps a group to one of a fixed number of coordinator shards
//!   (Kafka's `abs(groupId.hashCode()) % partitions`, fixed at cluster
//!   creation like `__consumer_offsets`' partition count).
//! * [`log::ShardLog`] is a shard's state on the volume:
//!   `<cluster>/groups/<shard>/<base>-e<E>.log` ([`names`]), an append-only,
//!   CRC32C-framed log of [`offsets::Record`]s (offset commits, tombstones,
//!   group metadata) that begins with a snapshot of the live state. Group
//!   commit (`append` → ticket, `sync_target` / `complete_sync`), recovery
//!   to the last valid frame, compaction (temp → fsync → rename → dir
//!   fsync), and fencing by the epoch in the name. [`offsets::expire`] is
//!   offset retention as a pure function.
//! * [`classic::ClassicGroups`] is the classic membership protocol of one
//!   shard's groups as a plain state machine on the `Clock` seam: requests
//!   in, responses out (deferred joins and syncs come back in an
//!   [`classic::Output`] with the records to persist before answering).
//!
//! How the next session drives these: one `GroupCoordinator` actor per
//! granted shard (started and stopped by the `OwnerRegistry` from the
//! controller's grants, like `PartitionLeader`), the single writer of the
//! shard's files. It opens `ShardLog` with the shard's grant epoch on the
//! blocking pool (answering COORDINATOR_LOAD_IN_PROGRESS meanwhile), loads
//! `ClassicGroups` from the durable group records, and then for each
//! request: feed the state machine; append its `persist` records and any
//! offset commits; run one fsync for everything appended meanwhile (group
//! commit); deliver the replies whose tickets are durable — after checking
//! the broker lease, as `CommitGate` does. Timers call `tick` at
//! `next_deadline`; an expiry pass appends `offsets::expire`'s tombstones;
//! `compaction_due` triggers `compact` between fsyncs. A failed write or
//! fsync poisons the log: stop, restart, reopen.
//!
//! Left for the next session: the APIs (FindCoordinator incl. transaction
//! keys, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
//! OffsetFetch, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete) and
//! their routes / ApiVersions entries; shard grants in the controller's
//! plan (epochs, two-phase moves, an O_EXCL per-epoch claim like
//! `leader-e<E>.claim`, so a stale listing cannot hide a newer owner); the
//! shard count recorded at cluster creation; lag metrics; moving
//! [`names`] into `kaas_volume::layout`; KIP-848 (ConsumerGroupHeartbeat,
//! server-side assignors).

pub mod classic;
pub mod coordinator;
pub mod log;
pub mod messages;
pub mod names;
pub mod offsets;
pub mod shard;
