//! Kafka TCP framing: every request and response is a 4-byte big-endian
//! length followed by that many bytes.
//!
//! This is the only piece of the protocol crate that touches the stream, and
//! only through `tokio_util::codec`: the connection owns the socket, this
//! codec only cuts it into frames. The decoder rejects a length before it
//! buffers the body, so an oversized or negative prefix costs four bytes of
//! memory, not `max_frame`; and the buffer of an accepted frame grows with
//! the bytes that arrive, never with the declared length, so a peer that
//! sends only a prefix declaring 100 MiB costs a few KiB, not 100 MiB.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

/// Length of the size prefix in front of every frame.
pub const SIZE_PREFIX_LEN: usize = 4;

/// The smallest request body a frame may carry: api key, api version and
/// correlation id. Anything shorter cannot even be answered.
pub const MIN_REQUEST_LEN: usize = 8;

/// The most the decoder reserves ahead of the bytes that have arrived. The
/// buffer grows by at most what it already holds (doubling, so a large frame
/// costs O(log n) reallocations) and at least by this, so small frames are
/// read in one go.
pub const RESERVE_AHEAD: usize = 64 * 1024;

/// Why a frame could not be cut from the stream. Every variant is fatal for
/// the connection: after a bad length prefix the stream has no recoverable
/// frame boundary.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {size} bytes exceeds the limit of {max} bytes")]
    TooLarge { size: i64, max: usize },
    #[error("frame length is negative")]
    Negative,
    #[error("frame is shorter than a request header ({MIN_REQUEST_LEN} bytes)")]
    TooShort,
    #[error("i/o error on the connection: {0}")]
    Io(#[from] std::io::Error),
}

/// Length-prefixed frame codec.
///
/// Decoding yields the frame body without its prefix. Encoding writes bytes
/// as-is: responses come from [`crate::request::encode_response`], which has
/// already written the prefix.
#[derive(Debug, Clone)]
pub struct FrameCodec {
    max_frame: usize,
}

impl FrameCodec {
    /// A codec that refuses frames whose body is longer than `max_frame`.
    pub fn new(max_frame: usize) -> Self {
        Self { max_frame }
    }

    /// The largest frame body this codec accepts.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }
}

impl Decoder for FrameCodec {
    type Item = Bytes;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, FrameError> {
        let Some(prefix) = src.get(..SIZE_PREFIX_LEN) else {
            return Ok(None);
        };
        let len = i32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        if len < 0 {
            return Err(FrameError::Negative);
        }
        // i32 -> usize is lossless on every platform we build for (>= 32 bit).
        let len = len as usize;
        if len > self.max_frame {
            return Err(FrameError::TooLarge {
                size: len as i64,
                max: self.max_frame,
            });
        }
        if len < MIN_REQUEST_LEN {
            return Err(FrameError::TooShort);
        }
        let total = SIZE_PREFIX_LEN + len;
        if src.len() < total {
            // Grow with what has arrived, not with the declared length: a
            // prefix alone must not cost `len` bytes of memory (hundreds of
            // such connections would exhaust the address space). Doubling
            // keeps a large honest frame at O(log len) reallocations.
            let ahead = src.len().max(RESERVE_AHEAD);
            src.reserve((total - src.len()).min(ahead));
            return Ok(None);
        }
        src.advance(SIZE_PREFIX_LEN);
        Ok(Some(src.split_to(len).freeze()))
    }
}

impl Encoder<Bytes> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, item: Bytes, dst: &mut BytesMut) -> Result<(), FrameError> {
        dst.extend_from_slice(&item);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(body: &[u8]) -> BytesMut {
        let mut b = BytesMut::new();
        b.extend_from_slice(&(body.len() as i32).to_be_bytes());
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn decodes_whole_frames_and_waits_for_partial_ones() {
        let mut codec = FrameCodec::new(1024);
        let mut buf = framed(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        buf.extend_from_slice(&framed(&[9; 10])[..7]);
        let first = codec.decode(&mut buf).unwrap().unwrap();
        assert_eq!(&first[..], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert!(codec.decode(&mut buf).unwrap().is_none());
        buf.extend_from_slice(&framed(&[9; 10])[7..]);
        assert_eq!(codec.decode(&mut buf).unwrap().unwrap().len(), 10);
        assert!(buf.is_empty());
    }

    #[test]
    fn rejects_negative_large_and_short_lengths() {
        let mut codec = FrameCodec::new(100);
        let mut neg = BytesMut::from(&(-5i32).to_be_bytes()[..]);
        assert!(matches!(codec.decode(&mut neg), Err(FrameError::Negative)));
        let mut big = BytesMut::from(&101i32.to_be_bytes()[..]);
        assert!(matches!(
            codec.decode(&mut big),
            Err(FrameError::TooLarge {
                size: 101,
                max: 100
            })
        ));
        let mut short = BytesMut::from(&7i32.to_be_bytes()[..]);
        assert!(matches!(
            codec.decode(&mut short),
            Err(FrameError::TooShort)
        ));
    }

    /// Catches: the decoder reserving the declared length as soon as the
    /// prefix arrives (300 such connections took 31 GB of address space).
    #[test]
    fn a_prefix_alone_does_not_reserve_the_declared_length() {
        let declared = 100 * 1024 * 1024;
        let mut codec = FrameCodec::new(declared);
        let mut buf = BytesMut::from(&(declared as i32).to_be_bytes()[..]);
        assert!(codec.decode(&mut buf).unwrap().is_none());
        assert!(
            buf.capacity() <= SIZE_PREFIX_LEN + 2 * RESERVE_AHEAD,
            "reserved {} bytes for a bare prefix",
            buf.capacity()
        );
        // An honest frame still decodes when its bytes do arrive, in pieces.
        let body = vec![7u8; 3 * RESERVE_AHEAD + 5];
        let whole = framed(&body);
        let mut buf = BytesMut::new();
        let mut got = None;
        for chunk in whole.chunks(1000) {
            buf.extend_from_slice(chunk);
            if let Some(f) = codec.decode(&mut buf).unwrap() {
                got = Some(f);
            }
        }
        assert_eq!(got.unwrap().len(), body.len());
    }

    #[test]
    fn encoder_writes_bytes_unchanged() {
        let mut codec = FrameCodec::new(100);
        let mut dst = BytesMut::new();
        codec
            .encode(Bytes::from_static(&[0, 0, 0, 1, 42]), &mut dst)
            .unwrap();
        assert_eq!(&dst[..], &[0, 0, 0, 1, 42]);
    }
}
