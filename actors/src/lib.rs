//! The state owners. Every actor that owns a writable file on the shared
//! volume lives here, with the on-disk format it owns. The filesystem seam,
//! the volume's names, the identity primitive and the substrate checker live
//! in `kaas-volume`, which the Kubernetes operator shares.

pub mod clock;
pub mod cluster;
pub mod group;
pub mod partition;
pub mod producer_id_blocks;
pub mod producer_ids;
pub mod registry;
pub mod telemetry;
pub mod topic;
pub mod txn;
