//! Request decoding and response encoding on top of the kafka-protocol crate.
//!
//! Owns the request header (v0/v1/v2), the check against the advertised
//! version table, and the response frame layout (size prefix, response
//! header, body). Request bytes come from untrusted clients: every path here
//! returns an error instead of panicking, and the correlation id is recovered
//! whenever the first eight bytes exist so the broker can still answer.

use std::panic::{catch_unwind, AssertUnwindSafe};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;

use crate::versions;

/// Kafka's UNSUPPORTED_VERSION error code.
pub const UNSUPPORTED_VERSION: i16 = 35;

/// The request header fields the broker needs, whatever the header version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    pub client_id: Option<String>,
}

/// A request whose header and body decoded at a version we advertise.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    pub header: RequestHeader,
    pub body: RequestKind,
}

/// Why a request frame could not be turned into a [`ParsedRequest`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// The api key is not one kafka-protocol knows.
    #[error("unknown api key {}", header.api_key)]
    UnknownApiKey { header: RequestHeader },
    /// The api is known but this version is outside what we advertise (or we
    /// do not serve the api at all: then `supported_range` is `None`). For
    /// ApiVersions the broker answers with [`api_versions_fallback_response`]
    /// (KIP-511); for anything else Kafka closes the connection.
    #[error("unsupported version {} of api key {}", header.api_version, header.api_key)]
    UnsupportedVersion { header: RequestHeader },
    /// A version we do not advertise, of an api we serve, but one the crate
    /// can decode and whose response it can encode (Metadata v13, say): the
    /// broker answers it with UNSUPPORTED_VERSION in the response's error
    /// fields rather than closing the connection.
    #[error("refused version {} of api key {}", header.api_version, header.api_key)]
    Refused {
        header: RequestHeader,
        body: Box<RequestKind>,
    },
    /// The bytes do not decode. `header` is present whenever the first eight
    /// bytes were there, with `client_id` filled only if it decoded.
    #[error("malformed request: {reason}")]
    Malformed {
        header: Option<RequestHeader>,
        reason: String,
    },
}

impl RequestError {
    /// The header, as far as it could be read.
    pub fn header(&self) -> Option<&RequestHeader> {
        match self {
            RequestError::UnknownApiKey { header }
            | RequestError::UnsupportedVersion { header }
            | RequestError::Refused { header, .. } => Some(header),
            RequestError::Malformed { header, .. } => header.as_ref(),
        }
    }

    /// The correlation id to answer with, if the frame carried one.
    pub fn correlation_id(&self) -> Option<i32> {
        self.header().map(|h| h.correlation_id)
    }
}

/// Why a response could not be encoded. Always a broker bug, never client input.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("cannot encode a response for unknown api key {0}")]
    UnknownApiKey(i16),
    #[error("failed to encode response for api key {api_key} v{version}: {reason}")]
    Body {
        api_key: i16,
        version: i16,
        reason: String,
    },
    #[error("response of {0} bytes does not fit a frame")]
    TooLarge(usize),
}

/// `s` on one line (a decoder's message may end with a newline, which
/// broke the fields logged after it onto a line of their own).
fn one_line(s: &str) -> String {
    s.split(['\n', '\r'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Parses one frame body (without its size prefix) into header and request.
pub fn parse_request(frame: Bytes) -> Result<ParsedRequest, RequestError> {
    let (header, key, pos) = match parse_header(&frame) {
        Err(RequestError::UnsupportedVersion { header }) => return Err(refused(&frame, header)),
        other => other?,
    };
    decode_body(&frame, header, key, pos).map_err(|(header, reason)| RequestError::Malformed {
        header: Some(header),
        reason,
    })
}

/// An unsupported request, as [`RequestError::Refused`] when we serve the
/// api and the crate decodes this version of it, else as it came.
fn refused(frame: &Bytes, header: RequestHeader) -> RequestError {
    let unsupported = |header| RequestError::UnsupportedVersion { header };
    let Ok(key) = ApiKey::try_from(header.api_key) else {
        return unsupported(header);
    };
    let known = key.valid_versions();
    let served = versions::supported_range(header.api_key).is_some();
    // ApiVersions keeps its KIP-511 fallback (a v0 answer with our table).
    if !served
        || key == ApiKey::ApiVersions
        || !(known.min..=known.max).contains(&header.api_version)
    {
        return unsupported(header);
    }
    let mut r = Reader::new(frame);
    r.pos = 8;
    if read_header_rest(&mut r, key.request_header_version(header.api_version)).is_err() {
        return unsupported(header);
    }
    match decode_body(frame, header, key, r.pos) {
        Ok(p) => RequestError::Refused {
            header: p.header,
            body: Box::new(p.body),
        },
        Err((header, _)) => unsupported(header),
    }
}

/// Decodes the body of `frame` from `pos` at the header's version.
fn decode_body(
    frame: &Bytes,
    header: RequestHeader,
    key: ApiKey,
    pos: usize,
) -> Result<ParsedRequest, (RequestHeader, String)> {
    let mut body = frame.slice(pos..);
    // The crate returns errors for bad input; catch_unwind is defence in
    // depth against a panic we have not found (an arithmetic overflow, an
    // index), so one hostile client cannot take the connection task down.
    let decoded = catch_unwind(AssertUnwindSafe(|| {
        RequestKind::decode(key, &mut body, header.api_version)
    }));
    match decoded {
        Ok(Ok(body)) => Ok(ParsedRequest { header, body }),
        Ok(Err(e)) => Err((header, one_line(&format!("{e:#}")))),
        Err(_) => Err((header, "request decoder panicked".to_owned())),
    }
}

/// The request header of `frame` at a version we serve, its api, and where
/// the body starts.
fn parse_header(frame: &[u8]) -> Result<(RequestHeader, ApiKey, usize), RequestError> {
    let mut r = Reader::new(frame);
    let (Some(api_key), Some(api_version), Some(correlation_id)) = (r.i16(), r.i16(), r.i32())
    else {
        return Err(RequestError::Malformed {
            header: None,
            reason: format!("frame of {} bytes has no request header", frame.len()),
        });
    };
    let mut header = RequestHeader {
        api_key,
        api_version,
        correlation_id,
        client_id: None,
    };

    let Ok(key) = ApiKey::try_from(api_key) else {
        // Best effort: every header version from 1 on puts the client id
        // next, and it helps the log line say who sent this.
        header.client_id = r.nullable_string().ok().flatten();
        return Err(RequestError::UnknownApiKey { header });
    };
    let header_version = key.request_header_version(api_version);
    let rest = read_header_rest(&mut r, header_version);

    if !versions::is_supported(api_key, api_version) {
        header.client_id = rest.ok().flatten();
        return Err(RequestError::UnsupportedVersion { header });
    }
    match rest {
        Ok(client_id) => header.client_id = client_id,
        Err(reason) => {
            return Err(RequestError::Malformed {
                header: Some(header),
                reason,
            })
        }
    }
    Ok((header, key, r.pos))
}

/// Parses the skeleton of a Produce frame that was over the size limit
/// (see [`crate::Frame::Oversized`]: the frame with its records payloads
/// cut out): the header, acks, timeout and every topic and partition it
/// lists, all with `records: None`. Fails only when the header or
/// acks/timeout are not there.
pub fn parse_oversized_produce(skeleton: &[u8]) -> Result<ParsedRequest, RequestError> {
    walk_produce(skeleton, usize::MAX).map(|(p, _)| p)
}

/// The records payloads in a Produce skeleton whose first `elided`
/// (non-empty) payloads are already cut out: (start, length) of each later
/// one, in order; the last may run past the end of `skel`. Empty when the
/// header does not parse yet.
pub(crate) fn records_payloads(skel: &[u8], elided: usize) -> Vec<(usize, usize)> {
    walk_produce(skel, elided).map_or_else(|_| Vec::new(), |(_, p)| p)
}

/// Walks a Produce skeleton (see [`records_payloads`]): the request as far
/// as it goes, and the payloads present after the first `elided`.
fn walk_produce(
    skel: &[u8],
    elided: usize,
) -> Result<(ParsedRequest, Vec<(usize, usize)>), RequestError> {
    let (header, key, pos) = parse_header(skel)?;
    let malformed = |header: &RequestHeader, reason: &str| RequestError::Malformed {
        header: Some(header.clone()),
        reason: reason.to_owned(),
    };
    if key != ApiKey::Produce {
        return Err(malformed(&header, "not a Produce request"));
    }
    let v = header.api_version;
    let flexible = v >= 9;
    let mut r = Reader::new(skel);
    r.pos = pos;
    let mut req = ProduceRequest::default();
    // transactional_id (v3+: every version we serve)
    let tx = if flexible {
        r.compact_len().map(|n| n.map(|n| r.take(n)))
    } else {
        r.i16().map(|n| usize::try_from(n).ok().map(|n| r.take(n)))
    };
    let (Some(_), Some(acks), Some(timeout)) = (tx, r.i16(), r.i32()) else {
        return Err(malformed(&header, "produce head too short"));
    };
    req.acks = acks;
    req.timeout_ms = timeout;
    let mut payloads = Vec::new();
    let mut seen = 0usize;
    // The rest: as far as the skeleton goes. Every `?` below is "the
    // skeleton ends here".
    let _ = (|| -> Option<()> {
        let topics = r.array_len(flexible)?;
        for _ in 0..topics {
            let mut t = TopicProduceData::default();
            if v >= 13 {
                t.topic_id = uuid::Uuid::from_slice(r.take(16)?).ok()?;
            } else {
                let n = if flexible {
                    r.compact_len()?
                } else {
                    usize::try_from(r.i16()?).ok()
                }?;
                let name = String::from_utf8_lossy(r.take(n)?).into_owned();
                t.name = StrBytes::from_string(name).into();
            }
            let parts = r.array_len(flexible);
            req.topic_data.push(t);
            let t = req.topic_data.last_mut().expect("just pushed");
            for _ in 0..parts? {
                let index = r.i32()?;
                t.partition_data.push(
                    PartitionProduceData::default()
                        .with_index(index)
                        .with_records(None),
                );
                let len = if flexible {
                    r.compact_len()?
                } else {
                    usize::try_from(r.i32()?).ok()
                };
                let len = len.unwrap_or(0);
                if len > 0 {
                    if seen < elided {
                        // Cut out already: nothing to skip.
                        seen += 1;
                    } else {
                        payloads.push((r.pos, len));
                        r.skip(len)?;
                    }
                }
                if flexible {
                    r.skip_tagged()?;
                }
            }
            if flexible {
                r.skip_tagged()?;
            }
        }
        Some(())
    })();
    Ok((
        ParsedRequest {
            header,
            body: RequestKind::Produce(req),
        },
        payloads,
    ))
}

/// Reads what follows the correlation id: the client id (header v1+) and the
/// tagged fields (header v2), which we skip.
fn read_header_rest(r: &mut Reader<'_>, header_version: i16) -> Result<Option<String>, String> {
    if header_version < 1 {
        return Ok(None);
    }
    let client_id = r.nullable_string()?;
    if header_version >= 2 {
        let n = r.uvarint().ok_or("truncated header tagged field count")?;
        for _ in 0..n {
            let _tag = r.uvarint().ok_or("truncated header tag")?;
            let size = r.uvarint().ok_or("truncated header tag size")?;
            r.skip(size as usize).ok_or("truncated header tag value")?;
        }
    }
    Ok(client_id)
}

/// Encodes a response frame: size prefix, response header, body at
/// `header.api_version`.
///
/// The response header version comes from the api and version, except that
/// ApiVersions always uses header v0 so a client that sent a version we do not
/// know can still read the correlation id.
pub fn encode_response(header: &RequestHeader, body: &ResponseKind) -> Result<Bytes, EncodeError> {
    let key = ApiKey::try_from(header.api_key)
        .map_err(|()| EncodeError::UnknownApiKey(header.api_key))?;
    let header_version = if key == ApiKey::ApiVersions {
        0
    } else {
        key.response_header_version(header.api_version)
    };
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i32(0);
    buf.put_i32(header.correlation_id);
    if header_version >= 1 {
        // Empty tagged-field section.
        buf.put_u8(0);
    }
    body.encode(&mut buf, header.api_version)
        .map_err(|e| EncodeError::Body {
            api_key: header.api_key,
            version: header.api_version,
            reason: one_line(&format!("{e:#}")),
        })?;
    let len = buf.len() - 4;
    let len_i32 = i32::try_from(len).map_err(|_| EncodeError::TooLarge(len))?;
    buf[..4].copy_from_slice(&len_i32.to_be_bytes());
    Ok(buf.freeze())
}

/// The full length-prefixed ApiVersions v0 response carrying
/// UNSUPPORTED_VERSION (35) and our table, sent when a client asks for an
/// ApiVersions version newer than ours (KIP-511). The client reads our
/// ApiVersions range from it and retries. Written by hand: v0 is a fixed
/// layout and this path must not be able to fail.
pub fn api_versions_fallback_response(correlation_id: i32) -> Bytes {
    let entries = versions::api_version_entries();
    let mut buf = BytesMut::with_capacity(14 + entries.len() * 6);
    let len = 4 + 2 + 4 + entries.len() * 6;
    buf.put_i32(len as i32);
    buf.put_i32(correlation_id);
    buf.put_i16(UNSUPPORTED_VERSION);
    buf.put_i32(entries.len() as i32);
    for e in entries {
        buf.put_i16(e.api_key);
        buf.put_i16(e.min_version);
        buf.put_i16(e.max_version);
    }
    buf.freeze()
}

/// A bounds-checked big-endian reader: every read is `None` past the end.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    pub(crate) fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }

    pub(crate) fn i16(&mut self) -> Option<i16> {
        self.take(2).map(|b| i16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn i32(&mut self) -> Option<i32> {
        self.take(4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn uvarint(&mut self) -> Option<u32> {
        let mut value: u32 = 0;
        for i in 0..5 {
            let b = *self.take(1)?.first()?;
            value |= u32::from(b & 0x7f) << (i * 7);
            if b < 0x80 {
                return Some(value);
            }
        }
        // A fifth continuation bit means more than 32 bits: malformed.
        None
    }

    /// A compact (flexible-version) length: `None` inside for null; the
    /// outer `None` past the end.
    fn compact_len(&mut self) -> Option<Option<usize>> {
        let n = self.uvarint()?;
        Some(n.checked_sub(1).map(|n| n as usize))
    }

    /// An array length, compact in flexible versions; null counts as 0.
    fn array_len(&mut self, flexible: bool) -> Option<usize> {
        if flexible {
            Some(self.compact_len()?.unwrap_or(0))
        } else {
            Some(usize::try_from(self.i32()?).unwrap_or(0))
        }
    }

    /// A tagged-field section, skipped.
    fn skip_tagged(&mut self) -> Option<()> {
        let n = self.uvarint()?;
        for _ in 0..n {
            let _tag = self.uvarint()?;
            let size = self.uvarint()?;
            self.skip(size as usize)?;
        }
        Some(())
    }

    /// A Kafka nullable STRING: i16 length, -1 for null. Decoded lossily as
    /// the Java broker does, so an odd client id never fails a request.
    fn nullable_string(&mut self) -> Result<Option<String>, String> {
        let len = self.i16().ok_or("truncated client id length")?;
        if len == -1 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| format!("negative client id length {len}"))?;
        let bytes = self.take(len).ok_or("truncated client id")?;
        Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{
        ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse,
        OffsetFetchRequest, ProduceRequest, RequestHeader as KpRequestHeader,
    };
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    fn request_frame(key: ApiKey, version: i16, corr: i32, body: &RequestKind) -> Bytes {
        let hv = key.request_header_version(version);
        let mut buf = BytesMut::new();
        if hv == 0 {
            buf.put_i16(key as i16);
            buf.put_i16(version);
            buf.put_i32(corr);
        } else {
            KpRequestHeader::default()
                .with_request_api_key(key as i16)
                .with_request_api_version(version)
                .with_correlation_id(corr)
                .with_client_id(Some(StrBytes::from_static_str("test-client")))
                .encode(&mut buf, hv)
                .unwrap();
        }
        body.encode(&mut buf, version).unwrap();
        buf.freeze()
    }

    #[test]
    fn parses_v1_and_v2_headers() {
        for v in [1, 8, 9, 12] {
            let body = RequestKind::Metadata(MetadataRequest::default());
            let frame = request_frame(ApiKey::Metadata, v, 77, &body);
            let parsed = parse_request(frame).unwrap();
            assert_eq!(parsed.header.correlation_id, 77);
            assert_eq!(parsed.header.api_version, v);
            assert_eq!(parsed.header.client_id.as_deref(), Some("test-client"));
            assert_eq!(parsed.body, body);
        }
    }

    #[test]
    fn skips_header_tagged_fields() {
        let mut buf = BytesMut::new();
        buf.put_i16(ApiKey::ApiVersions as i16);
        buf.put_i16(3);
        buf.put_i32(5);
        buf.put_i16(-1); // null client id
        buf.put_u8(1); // one tagged field
        buf.put_u8(0); // tag 0
        buf.put_u8(2); // 2 bytes
        buf.put_slice(&[0xaa, 0xbb]);
        ApiVersionsRequest::default().encode(&mut buf, 3).unwrap();
        let parsed = parse_request(buf.freeze()).unwrap();
        assert_eq!(parsed.header.client_id, None);
        assert!(matches!(parsed.body, RequestKind::ApiVersions(_)));
    }

    /// Catches: an oversized Produce answered without its partitions (the
    /// producer's batches would wait for their timeout) or refused whole.
    #[test]
    fn oversized_produce_head_lists_what_it_holds() {
        use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
        use kafka_protocol::messages::TopicName;
        let id = uuid::Uuid::from_u128(7);
        for v in [3, 8, 9, 12, 13] {
            let part = |i: i32, n: usize| {
                PartitionProduceData::default()
                    .with_index(i)
                    .with_records(Some(Bytes::from(vec![1u8; n])))
            };
            let topic = |name: &'static str, parts| {
                TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_static_str(name)))
                    .with_topic_id(id)
                    .with_partition_data(parts)
            };
            let req = ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(1234)
                .with_transactional_id(Some(StrBytes::from_static_str("tx").into()))
                .with_topic_data(vec![
                    topic("a", vec![part(0, 10), part(1, 20)]),
                    topic("b", vec![part(5, 200_000), part(6, 3)]),
                ]);
            let frame = request_frame(ApiKey::Produce, v, 99, &RequestKind::Produce(req));
            let listed = |frame: &[u8], max: usize| {
                use tokio_util::codec::Decoder;
                // Through the codec, as the broker reads it.
                let mut codec = crate::FrameCodec::new(max);
                let mut buf = BytesMut::new();
                buf.extend_from_slice(&(frame.len() as i32).to_be_bytes());
                buf.extend_from_slice(frame);
                let Some(crate::Frame::Oversized { head, .. }) = codec.decode(&mut buf).unwrap()
                else {
                    panic!("not oversized")
                };
                let p = parse_oversized_produce(&head).unwrap();
                assert_eq!((p.header.correlation_id, p.header.api_version), (99, v));
                let RequestKind::Produce(r) = p.body else {
                    panic!()
                };
                assert_eq!((r.acks, r.timeout_ms), (-1, 1234));
                r.topic_data
                    .iter()
                    .map(|t| {
                        let name = if v >= 13 {
                            assert_eq!(t.topic_id, id);
                            "id".to_owned()
                        } else {
                            t.name.0.to_string()
                        };
                        assert!(t.partition_data.iter().all(|p| p.records.is_none()));
                        (
                            name,
                            t.partition_data.iter().map(|p| p.index).collect::<Vec<_>>(),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            let n = |s: &str| {
                if v >= 13 {
                    "id".to_owned()
                } else {
                    s.to_owned()
                }
            };
            // Every partition is listed, the ones after a large payload too.
            let all = vec![(n("a"), vec![0, 1]), (n("b"), vec![5, 6])];
            assert_eq!(listed(&frame, 100), all, "v{v}");
            // Every cut parses or fails cleanly.
            for cut in (0..400).chain((400..frame.len()).step_by(4999)) {
                let _ = parse_oversized_produce(&frame[..cut]);
                let _ = records_payloads(&frame[..cut], 0);
            }
        }
        // Not a Produce: refused.
        let body = RequestKind::Metadata(MetadataRequest::default());
        assert!(parse_oversized_produce(&request_frame(ApiKey::Metadata, 9, 1, &body)).is_err());
    }

    /// Catches: partitions after the first large payload going unlisted,
    /// or the skeleton search turning quadratic on many small partitions.
    #[test]
    fn oversized_produce_with_thousands_of_partitions_lists_them_all() {
        use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
        use kafka_protocol::messages::TopicName;
        use tokio_util::codec::Decoder;
        let parts = (0..5000)
            .map(|i| {
                PartitionProduceData::default()
                    .with_index(i)
                    .with_records(Some(Bytes::from(vec![9u8; 100 + (i as usize % 7)])))
            })
            .collect();
        let req = ProduceRequest::default().with_acks(1).with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partition_data(parts),
        ]);
        for v in [8, 9] {
            let frame = request_frame(ApiKey::Produce, v, 5, &RequestKind::Produce(req.clone()));
            let mut stream = BytesMut::new();
            stream.extend_from_slice(&(frame.len() as i32).to_be_bytes());
            stream.extend_from_slice(&frame);
            let mut codec = crate::FrameCodec::new(1000);
            let mut buf = BytesMut::new();
            let mut got = None;
            for chunk in stream.chunks(1500) {
                buf.extend_from_slice(chunk);
                if let Some(f) = codec.decode(&mut buf).unwrap() {
                    got = Some(f);
                }
            }
            let Some(crate::Frame::Oversized { head, size }) = got else {
                panic!("{got:?}")
            };
            assert_eq!(size, frame.len());
            assert!(head.len() < 64 * 1024, "{}", head.len());
            let RequestKind::Produce(r) = parse_oversized_produce(&head).unwrap().body else {
                panic!()
            };
            let idx: Vec<i32> = r.topic_data[0]
                .partition_data
                .iter()
                .map(|p| p.index)
                .collect();
            assert_eq!(idx, (0..5000).collect::<Vec<_>>(), "v{v}");
        }
    }

    #[test]
    fn short_frames_have_no_header() {
        for n in 0..8 {
            let err = parse_request(Bytes::from(vec![0u8; n])).unwrap_err();
            assert!(
                matches!(err, RequestError::Malformed { header: None, .. }),
                "{n}"
            );
        }
    }

    #[test]
    fn truncated_body_keeps_correlation_id() {
        let body = RequestKind::Produce(ProduceRequest::default().with_acks(-1));
        let frame = request_frame(ApiKey::Produce, 9, 1234, &body);
        for cut in 8..frame.len() {
            let err = parse_request(frame.slice(..cut)).unwrap_err();
            assert!(matches!(err, RequestError::Malformed { .. }), "cut {cut}");
            assert_eq!(err.correlation_id(), Some(1234), "cut {cut}");
            // Logged with fields after it: one line.
            let text = err.to_string();
            assert!(!text.contains(['\n', '\r']), "cut {cut}: {text:?}");
        }
    }

    #[test]
    fn a_reason_is_kept_on_one_line() {
        assert_eq!(one_line("a: b\n"), "a: b");
        assert_eq!(one_line("x\r\n  y\n\nz"), "x y z");
    }

    #[test]
    fn unknown_api_key() {
        let mut buf = BytesMut::new();
        buf.put_i16(999);
        buf.put_i16(0);
        buf.put_i32(42);
        buf.put_i16(2);
        buf.put_slice(b"me");
        let err = parse_request(buf.freeze()).unwrap_err();
        let RequestError::UnknownApiKey { header } = err else {
            panic!("{err:?}")
        };
        assert_eq!(header.correlation_id, 42);
        assert_eq!(header.client_id.as_deref(), Some("me"));
    }

    #[test]
    fn unadvertised_versions_are_unsupported() {
        // Produce v2 exists in Kafka but not in our table (nor in the crate).
        let mut buf = BytesMut::new();
        buf.put_i16(ApiKey::Produce as i16);
        buf.put_i16(2);
        buf.put_i32(9);
        buf.put_i16(-1);
        let err = parse_request(buf.freeze()).unwrap_err();
        assert!(
            matches!(err, RequestError::UnsupportedVersion { .. }),
            "{err:?}"
        );
        // A version in the crate but above our max (whichever of these
        // still has one): refused with its body, so the broker can answer
        // UNSUPPORTED_VERSION.
        let candidates = [
            RequestKind::DescribeCluster(Default::default()),
            RequestKind::ListTransactions(Default::default()),
            RequestKind::EndTxn(Default::default()),
            RequestKind::AlterPartitionReassignments(Default::default()),
        ];
        let keys = [
            ApiKey::DescribeCluster,
            ApiKey::ListTransactions,
            ApiKey::EndTxn,
            ApiKey::AlterPartitionReassignments,
        ];
        let gap = keys.iter().zip(candidates).find_map(|(&k, body)| {
            let (_, max) = versions::supported_range(k as i16)?;
            (max < k.valid_versions().max).then_some((k, max + 1, body))
        });
        if let Some((k, v, body)) = gap {
            let err = parse_request(request_frame(k, v, 1, &body)).unwrap_err();
            let RequestError::Refused { header, body: got } = err else {
                panic!("{k:?} v{v}: {err:?}")
            };
            assert_eq!((header.api_version, header.correlation_id), (v, 1));
            assert_eq!(header.client_id.as_deref(), Some("test-client"));
            assert_eq!(*got, body);
        }
        // ShareGroupHeartbeat (KIP-932) is a known api we do not serve.
        let mut buf = BytesMut::new();
        buf.put_i16(ApiKey::ShareGroupHeartbeat as i16);
        buf.put_i16(1);
        buf.put_i32(9);
        let err = parse_request(buf.freeze()).unwrap_err();
        assert!(
            matches!(err, RequestError::UnsupportedVersion { .. }),
            "{err:?}"
        );
    }

    /// Catches: OffsetCommit v0/v1 or OffsetFetch v0 (Kafka's pre-4.0
    /// versions, which sarama 1.x sends) refused, or decoded with v2's
    /// layout (v0 has no generation or member; v1 has a commit timestamp
    /// per partition and no retention).
    #[test]
    fn pre_kip896_offset_versions_decode() {
        let mut buf = BytesMut::new();
        buf.put_i16(ApiKey::OffsetCommit as i16);
        buf.put_i16(1);
        buf.put_i32(3);
        buf.put_i16(6);
        buf.put_slice(b"sarama");
        buf.put_i16(1);
        buf.put_slice(b"g");
        buf.put_i32(-1); // generation
        buf.put_i16(0); // member id ""
        buf.put_i32(1); // one topic
        buf.put_i16(1);
        buf.put_slice(b"t");
        buf.put_i32(1); // one partition
        buf.put_i32(0);
        buf.put_i64(42); // offset
        buf.put_i64(-1); // commit timestamp
        buf.put_i16(2);
        buf.put_slice(b"md");
        let parsed = parse_request(buf.freeze()).unwrap();
        let RequestKind::OffsetCommit(r) = parsed.body else {
            panic!("{:?}", parsed.body)
        };
        assert_eq!(r.group_id.0.as_str(), "g");
        assert_eq!(r.generation_id_or_member_epoch, -1);
        assert_eq!(r.retention_time_ms, -1);
        let p = &r.topics[0].partitions[0];
        assert_eq!((p.committed_offset, p.commit_timestamp), (42, -1));
        assert_eq!(p.committed_metadata.as_deref(), Some("md"));

        // v0: group, then topics at once.
        let mut buf = BytesMut::new();
        buf.put_i16(ApiKey::OffsetCommit as i16);
        buf.put_i16(0);
        buf.put_i32(4);
        buf.put_i16(-1);
        buf.put_i16(1);
        buf.put_slice(b"g");
        buf.put_i32(1);
        buf.put_i16(1);
        buf.put_slice(b"t");
        buf.put_i32(1);
        buf.put_i32(2);
        buf.put_i64(7);
        buf.put_i16(-1); // null metadata
        let parsed = parse_request(buf.freeze()).unwrap();
        let RequestKind::OffsetCommit(r) = parsed.body else {
            panic!("{:?}", parsed.body)
        };
        assert_eq!(r.generation_id_or_member_epoch, -1);
        assert_eq!(r.member_id.as_str(), "");
        let p = &r.topics[0].partitions[0];
        assert_eq!((p.partition_index, p.committed_offset), (2, 7));
        assert_eq!(p.committed_metadata, None);

        // OffsetFetch v0 has v1's layout.
        let body =
            RequestKind::OffsetFetch(OffsetFetchRequest::default().with_topics(Some(Vec::new())));
        let parsed = parse_request(request_frame(ApiKey::OffsetFetch, 0, 5, &body)).unwrap();
        assert_eq!(parsed.body, body);
    }

    #[test]
    fn future_api_versions_gets_the_kip511_fallback() {
        // A client newer than us sends ApiVersions v7 with a body we cannot
        // know; we must still recover the header.
        let mut buf = BytesMut::new();
        buf.put_i16(ApiKey::ApiVersions as i16);
        buf.put_i16(7);
        buf.put_i32(31337);
        buf.put_i16(3);
        buf.put_slice(b"new");
        buf.put_u8(0);
        buf.put_slice(&[0xde, 0xad, 0xbe, 0xef]);
        let err = parse_request(buf.freeze()).unwrap_err();
        let RequestError::UnsupportedVersion { header } = err else {
            panic!("{err:?}")
        };
        assert_eq!(header.api_key, ApiKey::ApiVersions as i16);
        assert_eq!(header.client_id.as_deref(), Some("new"));

        let mut resp = api_versions_fallback_response(header.correlation_id);
        let len = i32::from_be_bytes(resp[..4].try_into().unwrap()) as usize;
        assert_eq!(len, resp.len() - 4);
        let mut body = resp.split_off(8);
        assert_eq!(&resp[4..8], &31337i32.to_be_bytes());
        let decoded = ApiVersionsResponse::decode(&mut body, 0).unwrap();
        assert!(body.is_empty());
        assert_eq!(decoded.error_code, UNSUPPORTED_VERSION);
        let av = decoded
            .api_keys
            .iter()
            .find(|a| a.api_key == ApiKey::ApiVersions as i16)
            .unwrap();
        assert_eq!((av.min_version, av.max_version), (0, 4));
        assert_eq!(decoded.api_keys.len(), versions::SUPPORTED.len());
    }

    #[test]
    fn encodes_response_frames_with_the_right_header() {
        // Metadata v9+ uses a flexible response header (v1): one tag byte.
        for (v, hv) in [(8, 0), (9, 1)] {
            let header = RequestHeader {
                api_key: ApiKey::Metadata as i16,
                api_version: v,
                correlation_id: 5,
                client_id: None,
            };
            let body = MetadataResponse::default();
            let frame = encode_response(&header, &ResponseKind::Metadata(body.clone())).unwrap();
            let len = i32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
            assert_eq!(len, frame.len() - 4);
            assert_eq!(&frame[4..8], &5i32.to_be_bytes());
            let mut rest = frame.slice(8 + hv..);
            assert_eq!(MetadataResponse::decode(&mut rest, v).unwrap(), body);
            assert!(rest.is_empty());
        }
        // ApiVersions v3 body is flexible but its response header stays v0.
        let header = RequestHeader {
            api_key: ApiKey::ApiVersions as i16,
            api_version: 3,
            correlation_id: 6,
            client_id: None,
        };
        let body = versions::api_versions_response(3);
        let frame = encode_response(&header, &ResponseKind::ApiVersions(body.clone())).unwrap();
        let mut rest = frame.slice(8..);
        assert_eq!(ApiVersionsResponse::decode(&mut rest, 3).unwrap(), body);
    }

    #[test]
    fn encode_errors_are_errors() {
        let header = RequestHeader {
            api_key: 999,
            api_version: 0,
            correlation_id: 0,
            client_id: None,
        };
        let body = ResponseKind::Metadata(MetadataResponse::default());
        assert!(matches!(
            encode_response(&header, &body),
            Err(EncodeError::UnknownApiKey(999))
        ));
        let header = RequestHeader {
            api_key: ApiKey::Metadata as i16,
            api_version: 99,
            ..header
        };
        assert!(matches!(
            encode_response(&header, &body),
            Err(EncodeError::Body { .. })
        ));
    }
}
