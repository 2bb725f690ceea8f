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
//!
//! A Produce request over the limit is not fatal: Kafka's producers resend
//! a request whose connection closes, so closing would make them reconnect
//! in a loop. It is read through keeping only its skeleton — the header and
//! the topic/partition list, every records payload cut out as it arrives
//! (at most [`OVERSIZED_HEAD`] bytes of it; past that the rest is dropped
//! and the last partitions go unlisted) — and handed on as
//! [`Frame::Oversized`] so the broker can answer MESSAGE_TOO_LARGE per
//! partition and keep the connection. Every other oversized request closes
//! the connection, as Kafka does.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

/// Length of the size prefix in front of every frame.
pub const SIZE_PREFIX_LEN: usize = 4;

/// The smallest request body a frame may carry: api key, api version and
/// correlation id. Anything shorter cannot even be answered.
pub const MIN_REQUEST_LEN: usize = 8;

/// The least the decoder reserves ahead of the bytes that have arrived, so
/// small frames are read in one go. A large frame's buffer grows only when
/// it is nearly full ([`GROW_WHEN_SPARE_BELOW`]), to at most
/// [`GROWTH`] times what has arrived: each growth copies what arrived
/// (realloc), so a frame costs about a third of its size in copies, where
/// doubling on every read cost about its whole size.
pub const RESERVE_AHEAD: usize = 64 * 1024;

/// A growing frame's buffer is grown only once its spare room is below this.
pub const GROW_WHEN_SPARE_BELOW: usize = 16 * 1024;

/// A growing frame's buffer holds at most this many times the bytes that
/// have arrived (plus [`RESERVE_AHEAD`]): memory follows what a peer really
/// sent, never its declared length alone.
pub const GROWTH: usize = 4;

/// The most an oversized Produce keeps of its body (its skeleton: the
/// header and topic/partition list, a few thousand partitions).
pub const OVERSIZED_HEAD: usize = 64 * 1024;

/// The skeleton is searched for records payloads to cut out after every
/// this many bytes kept (and when full or complete), so the work stays
/// linear in the frame: one pass over at most [`OVERSIZED_HEAD`] bytes per
/// `SCAN_EVERY` bytes read.
const SCAN_EVERY: usize = 16 * 1024;

/// The Produce api key, the one request kept (in part) when over the limit.
const PRODUCE: i16 = 0;

/// One frame cut from the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A frame within the limit: its whole body, without the prefix.
    Whole(Bytes),
    /// A Produce frame over the limit, read through: its skeleton (the
    /// body with every records payload cut out, at most
    /// [`OVERSIZED_HEAD`] bytes; see `parse_oversized_produce`) and its
    /// declared body size.
    Oversized { head: Bytes, size: usize },
}

/// An oversized Produce being read through.
#[derive(Debug, Clone)]
struct Discard {
    head: BytesMut,
    size: usize,
    /// Body bytes not yet read (kept or dropped).
    remaining: usize,
    /// Bytes of a records payload still to drop.
    skip: usize,
    /// Records payloads cut out of `head` so far.
    elided: usize,
    /// `head.len()` at the last search for payloads.
    scanned: usize,
}

impl Discard {
    /// Read what `src` holds of the frame: structure into `head`, records
    /// payloads dropped.
    fn read(&mut self, src: &mut BytesMut) {
        while self.remaining > 0 && !src.is_empty() {
            if self.skip > 0 || self.head.len() >= OVERSIZED_HEAD {
                // A payload, or past a full skeleton: dropped.
                let budget = if self.skip > 0 { self.skip } else { usize::MAX };
                let n = budget.min(src.len()).min(self.remaining);
                src.advance(n);
                self.remaining -= n;
                self.skip = self.skip.saturating_sub(n);
                continue;
            }
            let n = (OVERSIZED_HEAD - self.head.len())
                .min(src.len())
                .min(self.remaining);
            self.head.extend_from_slice(&src.split_to(n));
            self.remaining -= n;
            if self.head.len() - self.scanned >= SCAN_EVERY
                || self.head.len() >= OVERSIZED_HEAD
                || self.remaining == 0
            {
                self.cut_payloads();
            }
        }
    }

    /// Cut the records payloads `head` holds out of it; one that runs past
    /// its end is dropped as it arrives (`skip`).
    fn cut_payloads(&mut self) {
        let payloads = crate::request::records_payloads(&self.head, self.elided);
        if payloads.is_empty() {
            self.scanned = self.head.len();
            return;
        }
        let mut kept = BytesMut::with_capacity(self.head.len());
        let mut from = 0;
        for (at, len) in payloads {
            kept.extend_from_slice(&self.head[from..at]);
            self.elided += 1;
            let held = self.head.len() - at;
            if held < len {
                self.skip = len - held;
                from = self.head.len();
                break;
            }
            from = at + len;
        }
        kept.extend_from_slice(&self.head[from..]);
        self.head = kept;
        self.scanned = self.head.len();
    }
}

/// Why a frame could not be cut from the stream. Every variant is fatal for
/// the connection: after a bad length prefix the stream has no recoverable
/// frame boundary.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {size} bytes (api key {api_key}) exceeds the limit of {max} bytes")]
    TooLarge { size: i64, max: usize, api_key: i16 },
    #[error("frame length is negative")]
    Negative,
    #[error("frame is shorter than a request header ({MIN_REQUEST_LEN} bytes)")]
    TooShort,
    #[error("i/o error on the connection: {0}")]
    Io(#[from] std::io::Error),
}

/// The length prefix `buf` starts with, once its four bytes are in.
fn declared_len(buf: &[u8]) -> Option<i32> {
    let prefix: [u8; SIZE_PREFIX_LEN] = buf.get(..SIZE_PREFIX_LEN)?.try_into().ok()?;
    Some(i32::from_be_bytes(prefix))
}

/// Length-prefixed frame codec.
///
/// Decoding yields the frame body without its prefix. Encoding writes bytes
/// as-is: responses come from [`crate::request::encode_response`], which has
/// already written the prefix.
#[derive(Debug, Clone)]
pub struct FrameCodec {
    max_frame: usize,
    discard: Option<Discard>,
}

impl FrameCodec {
    /// A codec that refuses frames whose body is longer than `max_frame`.
    pub fn new(max_frame: usize) -> Self {
        Self {
            max_frame,
            discard: None,
        }
    }

    /// The largest frame body this codec accepts.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Whether an oversized Produce is being read through.
    pub fn discarding(&self) -> bool {
        self.discard.is_some()
    }

    /// Bytes an oversized Produce being read through keeps of what it
    /// dropped from the read buffer (its skeleton); 0 otherwise.
    pub fn kept(&self) -> usize {
        self.discard.as_ref().map_or(0, |d| d.head.len())
    }

    /// The whole size (prefix included) of the frame `buf` starts with,
    /// once its prefix has arrived and the frame is one this codec will
    /// keep whole; None before the prefix, for a length it refuses, and
    /// while an oversized Produce is being read through (its bytes are
    /// dropped as they arrive). What a reader reserves before reading the
    /// rest of a frame.
    pub fn frame_at_head(&self, buf: &[u8]) -> Option<usize> {
        if self.discard.is_some() {
            return None;
        }
        let len = usize::try_from(declared_len(buf)?).ok()?;
        (MIN_REQUEST_LEN..=self.max_frame)
            .contains(&len)
            .then_some(SIZE_PREFIX_LEN + len)
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if let Some(d) = &mut self.discard {
            // Memory stays at the skeleton whatever the declared size.
            d.read(src);
            if d.remaining > 0 {
                return Ok(None);
            }
            let d = self.discard.take().expect("checked above");
            return Ok(Some(Frame::Oversized {
                head: d.head.freeze(),
                size: d.size,
            }));
        }
        let Some(len) = declared_len(src) else {
            return Ok(None);
        };
        if len < 0 {
            return Err(FrameError::Negative);
        }
        // i32 -> usize is lossless on every platform we build for (>= 32 bit).
        let len = len as usize;
        if len > self.max_frame {
            // The api key and version decide: wait for them (a bare prefix
            // costs nothing; a peer that stops here meets the request timeout).
            let Some(h) = src.get(SIZE_PREFIX_LEN..SIZE_PREFIX_LEN + 4) else {
                return Ok(None);
            };
            let api_key = i16::from_be_bytes([h[0], h[1]]);
            let version = i16::from_be_bytes([h[2], h[3]]);
            if api_key != PRODUCE || !crate::versions::is_supported(api_key, version) {
                return Err(FrameError::TooLarge {
                    size: len as i64,
                    max: self.max_frame,
                    api_key,
                });
            }
            src.advance(SIZE_PREFIX_LEN);
            self.discard = Some(Discard {
                head: BytesMut::new(),
                size: len,
                remaining: len,
                skip: 0,
                elided: 0,
                scanned: 0,
            });
            return self.decode(src);
        }
        if len < MIN_REQUEST_LEN {
            return Err(FrameError::TooShort);
        }
        let total = SIZE_PREFIX_LEN + len;
        if src.len() < total {
            // Grow with what has arrived, not with the declared length: a
            // prefix alone must not cost `len` bytes of memory (hundreds of
            // such connections would exhaust the address space). Growing
            // only when nearly full, by a factor of GROWTH, keeps a large
            // honest frame at O(log len) reallocations that copy about a
            // third of it.
            let spare = src.capacity() - src.len();
            if spare < GROW_WHEN_SPARE_BELOW.min(total - src.len()) {
                let ahead = (src.len() * (GROWTH - 1)).max(RESERVE_AHEAD);
                src.reserve((total - src.len()).min(ahead));
            }
            return Ok(None);
        }
        src.advance(SIZE_PREFIX_LEN);
        Ok(Some(Frame::Whole(src.split_to(len).freeze())))
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

    impl Frame {
        fn whole(self) -> Bytes {
            match self {
                Frame::Whole(b) => b,
                other => panic!("not whole: {other:?}"),
            }
        }
    }

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
        let first = codec.decode(&mut buf).unwrap().unwrap().whole();
        assert_eq!(&first[..], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert!(codec.decode(&mut buf).unwrap().is_none());
        buf.extend_from_slice(&framed(&[9; 10])[7..]);
        assert_eq!(codec.decode(&mut buf).unwrap().unwrap().whole().len(), 10);
        assert!(buf.is_empty());
    }

    #[test]
    fn the_frame_at_head_is_known_once_its_prefix_is() {
        let codec = FrameCodec::new(100);
        assert_eq!(codec.frame_at_head(&[0, 0, 0]), None, "prefix incomplete");
        assert_eq!(codec.frame_at_head(&framed(&[1; 10])[..4]), Some(14));
        assert_eq!(codec.frame_at_head(&framed(&[1; 100])), Some(104));
        assert_eq!(
            codec.frame_at_head(&framed(&[1; 101])[..4]),
            None,
            "over the limit"
        );
        assert_eq!(codec.frame_at_head(&framed(&[1; 7])), None, "too short");
        assert_eq!(
            codec.frame_at_head(&(-1i32).to_be_bytes()),
            None,
            "negative"
        );
    }

    #[test]
    fn rejects_negative_large_and_short_lengths() {
        let mut codec = FrameCodec::new(100);
        let mut neg = BytesMut::from(&(-5i32).to_be_bytes()[..]);
        assert!(matches!(codec.decode(&mut neg), Err(FrameError::Negative)));
        let mut big = BytesMut::from(&101i32.to_be_bytes()[..]);
        // The api key decides whether it is read through: wait for it.
        assert!(codec.decode(&mut big).unwrap().is_none());
        big.extend_from_slice(&[0, 3, 0, 0]); // Metadata v0
        assert!(matches!(
            codec.decode(&mut big),
            Err(FrameError::TooLarge {
                size: 101,
                max: 100,
                api_key: 3
            })
        ));
        // Produce at a version we do not serve is not read through either.
        let mut old = BytesMut::from(&101i32.to_be_bytes()[..]);
        old.extend_from_slice(&[0, 0, 0, 0]);
        assert!(matches!(
            codec.decode(&mut old),
            Err(FrameError::TooLarge { api_key: 0, .. })
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
                got = Some(f.whole());
            }
        }
        assert_eq!(got.unwrap().len(), body.len());
    }

    /// Catches: the buffer of a large frame grown on every read it
    /// outgrew, by doubling: each growth copies what has arrived, which
    /// added up to a second copy of every produced byte (4.5 % of the
    /// broker's CPU producing 1 KiB records to 6 partitions).
    #[test]
    fn a_large_frame_costs_a_fraction_of_its_size_in_copies_and_bounded_memory() {
        let body = vec![7u8; 4 << 20];
        let whole = framed(&body);
        let mut codec = FrameCodec::new(8 << 20);
        // As tokio-util's FramedRead: decode after every read; read into
        // the spare room only, reserving 1 byte first if there is none.
        let mut buf = BytesMut::with_capacity(8 * 1024);
        let (mut copied, mut at, mut got) = (0usize, 0usize, None);
        while got.is_none() {
            if buf.capacity() == buf.len() {
                let len = buf.len();
                buf.reserve(1);
                copied += len;
            }
            let n = (buf.capacity() - buf.len())
                .min(64 * 1024)
                .min(whole.len() - at);
            buf.extend_from_slice(&whole[at..at + n]);
            at += n;
            let (len, cap) = (buf.len(), buf.capacity());
            got = codec.decode(&mut buf).unwrap();
            if got.is_none() && buf.capacity() != cap {
                copied += len;
            }
            assert!(
                buf.capacity() <= GROWTH * len + 2 * RESERVE_AHEAD,
                "{} bytes reserved for {len} arrived",
                buf.capacity()
            );
        }
        assert_eq!(got.unwrap().whole().len(), body.len());
        assert!(
            copied <= body.len() / 2,
            "{copied} bytes copied growing the buffer of a {} byte frame",
            body.len()
        );
    }

    /// Catches: an oversized Produce closing the connection (the producer
    /// then reconnects and resends in a loop) or being buffered whole.
    #[test]
    fn an_oversized_produce_is_read_through_keeping_only_its_head() {
        let max = 1000;
        let mut codec = FrameCodec::new(max);
        let size = 5 * OVERSIZED_HEAD + 17;
        let mut body = vec![0u8, 0, 0, 9]; // Produce v9
                                           // A header that never parses (0xff.. is a varint too long): no
                                           // payload is found, so the first OVERSIZED_HEAD bytes are kept.
        body.extend(std::iter::repeat_n(0xffu8, size - 4));
        let mut stream = framed(&body);
        stream.extend_from_slice(&framed(&[1, 2, 3, 4, 5, 6, 7, 8])); // the next request
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for chunk in stream.chunks(4096) {
            buf.extend_from_slice(chunk);
            while let Some(f) = codec.decode(&mut buf).unwrap() {
                got.push(f);
            }
            assert!(
                buf.capacity() <= 2 * RESERVE_AHEAD,
                "buffered {} bytes",
                buf.capacity()
            );
        }
        assert_eq!(got.len(), 2, "{got:?}");
        let Frame::Oversized { head, size: s } = &got[0] else {
            panic!("{:?}", got[0])
        };
        assert_eq!(*s, size);
        assert_eq!(&head[..], &body[..OVERSIZED_HEAD]);
        // The frame boundary is kept: the next request decodes.
        assert_eq!(&got[1].clone().whole()[..], &[1, 2, 3, 4, 5, 6, 7, 8]);
        // A head shorter than OVERSIZED_HEAD when the frame is.
        let mut codec = FrameCodec::new(10);
        let mut buf = framed(&[0, 0, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8]);
        let f = codec.decode(&mut buf).unwrap().unwrap();
        assert_eq!(
            f,
            Frame::Oversized {
                head: Bytes::from_static(&[0, 0, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8]),
                size: 12
            }
        );
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
