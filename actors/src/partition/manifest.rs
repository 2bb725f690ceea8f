//! The partition manifest: the durable pointer from a partition directory to
//! its segments, fenced by the writer's leader epoch in its file name
//! (`manifest-e<epoch>.json`). Readers take the highest epoch that parses;
//! a zombie of an older epoch can only rewrite its own, ignored, manifest.
//!
//! It is always written temp → fsync → rename → directory fsync
//! ([`kaas_volume::fs::write_atomic`]), never edited in place, and only through
//! [`write_manifest`].

use kaas_volume::fs::{write_atomic, Fs};
use kaas_volume::layout;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::Path;

/// One segment as recorded in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentEntry {
    /// Offset of the first batch in the segment (part of the file name).
    pub base: i64,
    /// Leader epoch of the writer that owns the file (part of the file name).
    pub epoch: i32,
    /// Sealed: `size`/`next_offset` are final. Active: they are a checkpoint;
    /// recovery scans forward from there.
    pub sealed: bool,
    /// Valid bytes (sealed) or checkpointed bytes (active).
    pub size: u64,
    /// One past the last offset in the valid bytes.
    pub next_offset: i64,
    /// Largest batch max-timestamp in the valid bytes (-1 if none).
    pub max_ts: i64,
    /// Position of the batch holding `max_ts`.
    pub max_ts_pos: u64,
    /// Wall-clock ms when the segment was created (for segment.ms rolls).
    pub created_ms: i64,
    /// The segment may hold transaction markers (so aborted transactions):
    /// set when a marker is written into it or recovery walks past one.
    /// Absent (false) in manifests of segments written before transactions,
    /// which cannot hold any: a read_committed fetch skips their index.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub markers: bool,
}

/// The manifest document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version.
    pub version: u32,
    /// Leader epoch of the writer (also in the file name).
    pub epoch: i32,
    /// First offset still in the log.
    pub log_start_offset: i64,
    /// Segments in offset order; the last one is active unless sealed.
    pub segments: Vec<SegmentEntry>,
    /// (leader epoch, first offset written in that epoch), ascending.
    pub epoch_history: Vec<(i32, i64)>,
}

impl Manifest {
    /// One past the last offset the segments hold (the log start offset
    /// when there is none).
    pub fn log_end(&self) -> i64 {
        self.segments
            .last()
            .map(|s| s.next_offset)
            .unwrap_or(self.log_start_offset)
    }
}

/// File name of the manifest written by `epoch`.
pub use layout::manifest as manifest_name;
/// Epoch encoded in a manifest file name.
pub use layout::parse_manifest as parse_manifest_name;
/// (base, epoch) encoded in a segment file name, with its extension.
pub use layout::parse_segment_any as parse_segment_name;
/// Stem shared by a segment's `.log`, `.index` and `.timeindex` files.
pub use layout::segment_stem;

/// Write `manifest` as epoch `epoch`'s manifest in the partition directory
/// `dir` (temp → fsync → rename → directory fsync). The one way a manifest
/// reaches the volume.
pub fn write_manifest(fs: &dyn Fs, dir: &Path, epoch: i32, manifest: &Manifest) -> io::Result<()> {
    write_atomic(
        fs,
        &dir.join(manifest_name(epoch)),
        &serde_json::to_vec(manifest).expect("manifest serializes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(parse_manifest_name(&manifest_name(7)), Some(7));
        let s = format!("{}.log", segment_stem(42, 3));
        assert_eq!(s, "00000000000000000042-e3.log");
        assert_eq!(parse_segment_name(&s), Some((42, 3, "log")));
        assert_eq!(parse_segment_name("manifest-e1.json"), None);
    }
}
