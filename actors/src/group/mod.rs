//! Consumer groups (in progress). See the bottom of this file's docs.

pub mod classic;
pub mod log;
pub mod names;
pub mod offsets;
pub mod shard;
