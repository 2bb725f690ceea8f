//! The Kafka wire protocol for kaas: framing, request/response codec on the
//! kafka-protocol crate, the advertised API version table, and RecordBatch v2
//! validation.
//!
//! Architecture invariant: this crate is pure. It knows nothing of actix,
//! files or sockets beyond a `tokio_util` codec, and it never panics on input
//! bytes: everything a client sends is untrusted.

pub mod batch;
pub mod frame;
pub mod request;
pub mod versions;

/// Re-exported so the broker speaks the exact same crate version.
pub use kafka_protocol;

pub use batch::{
    first_zstd_batch, patch_batch, read_batch_header, record_timestamps, validate_batches,
    BatchError, BatchHeader, BatchInfo, BATCH_HEADER_LEN, LOG_OVERHEAD, PATCHED_HEAD,
};
pub use frame::{Frame, FrameCodec, FrameError};
pub use request::{
    api_versions_fallback_response, encode_response, parse_oversized_produce, parse_request,
    EncodeError, ParsedRequest, RequestError, RequestHeader,
};
pub use versions::{
    api_versions_response, supported_range, FETCH_MIN_VERSION_ZSTD, PRODUCE_MIN_VERSION_ZSTD,
    SUPPORTED,
};
