//! The state owners. Every actor that owns a writable file on the shared
//! volume lives here, with the on-disk format it owns, and the filesystem seam
//! ([`fs`]) that is the only code allowed to touch the volume.

pub mod clock;
pub mod cluster;
pub mod controller;
pub mod fs;
pub mod partition;
pub mod producer_id_blocks;
pub mod producer_ids;
pub mod registry;
pub mod substrate;
pub mod telemetry;
pub mod topic;
