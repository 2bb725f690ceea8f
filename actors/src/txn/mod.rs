//! Transactions (KIP-98, KIP-447), the coordinator side: one
//! [`coordinator::TxnCoordinator`] per coordinator shard, on the same
//! shards and grants as the group coordinators.
//!
//! * [`state`]: the records of `<cluster>/txns/<shard>/` (one per
//!   transactional id and transition), their codec for the shared
//!   `ShardLog`, and [`state::TxnMachine`], the transitions as plain Rust.
//! * [`coordinator`]: the actor (claim, log, group commit, marker re-drive,
//!   timeouts, expiry); [`messages`]: what the broker's transaction APIs
//!   send it.
//!
//! The partition side (control batches, LSO, aborted index) is the
//! partition leader's; the markers reach it as WriteTxnMarkers through the
//! [`coordinator::MarkerSink`] the broker supplies.

pub mod coordinator;
pub mod messages;
pub mod state;
