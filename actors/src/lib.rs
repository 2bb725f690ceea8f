//! The state owners. Every actor that owns a writable file on the shared
//! volume lives here, with the on-disk format it owns. The filesystem seam,
//! the volume's names and the substrate checker live in `kaas-volume`; they
//! are re-exported here so existing `crate::fs::…` paths keep resolving.

pub mod clock;
pub mod cluster;
pub mod controller;
pub mod partition;
pub mod producer_id_blocks;
pub mod producer_ids;
pub mod registry;
pub mod telemetry;
pub mod topic;

pub use kaas_volume::{fs, layout, substrate};
