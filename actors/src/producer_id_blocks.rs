//! `ProducerIdBlocks`: the actor that owns this broker's producer-id block
//! files (`<cluster>/producer-ids/block-<n>.json`) and hands out ids from
//! them.
//!
//! Claiming a block is an O_EXCL create, a write and two fsyncs on the
//! shared volume: that belongs to a single owner, not to whichever request
//! handler holds a lock. The actor runs on a [`SyncArbiter`] of exactly one
//! thread — the file is owned by one instance, and a slow volume blocks
//! only this thread, never a connection's. The claim and the file format are
//! [`ProducerIdAllocator`]'s; this module is only its home.

use crate::producer_ids::ProducerIdAllocator;
use crate::telemetry::{ActorStats, Mailbox, MessageName};
use actix::prelude::*;
use kaas_volume::fs::SharedFs;
use std::io;
use std::path::PathBuf;

/// See module docs.
pub struct ProducerIdBlocks {
    alloc: ProducerIdAllocator,
}

impl ProducerIdBlocks {
    /// Start the owner on its own thread. One thread only: a multi-thread
    /// `SyncArbiter` would run several owners of the same files.
    pub fn start(fs: SharedFs, cluster_dir: PathBuf, broker_id: i32) -> Mailbox<Self> {
        let stats = ActorStats::register(
            "producer_id_blocks",
            broker_id.to_string(),
            cluster_dir
                .join(kaas_volume::layout::PRODUCER_IDS_DIR)
                .display()
                .to_string(),
        );
        let addr = SyncArbiter::start(1, move || ProducerIdBlocks {
            alloc: ProducerIdAllocator::new(fs.clone(), &cluster_dir, broker_id),
        });
        Mailbox::new(addr, stats)
    }
}

impl Actor for ProducerIdBlocks {
    type Context = SyncContext<Self>;
}

/// Hand out the next producer id (durably reserved in a claimed block
/// before it is returned).
#[derive(Message)]
#[rtype(result = "io::Result<i64>")]
pub struct AllocateProducerId;

impl MessageName for AllocateProducerId {
    const NAME: &'static str = "allocate_producer_id";
}

crate::instrumented!(ProducerIdBlocks: AllocateProducerId);

impl Handler<AllocateProducerId> for ProducerIdBlocks {
    type Result = io::Result<i64>;

    fn handle(&mut self, _: AllocateProducerId, _: &mut SyncContext<Self>) -> io::Result<i64> {
        self.alloc.allocate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer_ids::BLOCK_SIZE;
    use kaas_volume::fs::RealFs;
    use std::sync::Arc;

    #[actix_rt::test]
    async fn ids_are_unique_across_a_restart_of_the_owner() {
        let d = tempfile::tempdir().unwrap();
        let fs: SharedFs = Arc::new(RealFs);
        let a = ProducerIdBlocks::start(fs.clone(), d.path().to_path_buf(), 3);
        let first = a.send(AllocateProducerId).await.unwrap().unwrap();
        assert_eq!(
            a.send(AllocateProducerId).await.unwrap().unwrap(),
            first + 1
        );
        let b = ProducerIdBlocks::start(fs, d.path().to_path_buf(), 3);
        let next = b.send(AllocateProducerId).await.unwrap().unwrap();
        assert!(
            next >= first + BLOCK_SIZE,
            "a new owner claims a fresh block"
        );
    }
}
