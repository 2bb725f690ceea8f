//! A tiny Kafka admin client on the workspace's codec (`kafka-protocol`,
//! re-exported by `kaas-protocol`): the four requests the operator sends to
//! the brokers' client Service — CreateTopics, CreatePartitions,
//! DeleteTopics, IncrementalAlterConfigs — plus ApiVersions to learn which
//! of them the brokers serve. Any broker routes them through the
//! controller, which is the single writer of topic directories; the
//! operator never touches them itself.
//!
//! One connection per call: reconciles are rare and a fresh connection
//! never carries a half-read response from a timed-out call.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::future::BoxFuture;
use kaas_protocol::kafka_protocol::messages::{
    create_partitions_request::CreatePartitionsTopic,
    create_topics_request::{CreatableTopic, CreatableTopicConfig},
    delete_topics_request::DeleteTopicState,
    incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig},
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, CreatePartitionsRequest,
    CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
    RequestHeader, ResponseHeader, TopicName,
};
use kaas_protocol::kafka_protocol::protocol::{
    Decodable, Encodable, HeaderVersion, Request, StrBytes,
};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Kafka error codes the operator tells apart.
pub mod code {
    /// UNKNOWN_TOPIC_OR_PARTITION
    pub const UNKNOWN_TOPIC: i16 = 3;
    /// UNKNOWN_TOPIC_ID
    pub const UNKNOWN_TOPIC_ID: i16 = 100;
    /// TOPIC_ALREADY_EXISTS
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    /// INVALID_PARTITIONS
    pub const INVALID_PARTITIONS: i16 = 37;
    /// INVALID_CONFIG
    pub const INVALID_CONFIG: i16 = 40;
    /// UNSUPPORTED_VERSION
    pub const UNSUPPORTED_VERSION: i16 = 35;
    /// INVALID_TOPIC_EXCEPTION
    pub const INVALID_TOPIC: i16 = 17;
    /// POLICY_VIOLATION
    pub const POLICY_VIOLATION: i16 = 44;
}

/// What an admin call can fail with.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum AdminError {
    /// The brokers do not serve this API (or no version we speak).
    #[error("{0:?} is not served by the brokers")]
    NotSupported(ApiKey),
    /// The brokers answered with a Kafka error code.
    #[error("kafka error {code}: {message}")]
    Kafka {
        /// Kafka error code.
        code: i16,
        /// Error message, if the broker sent one.
        message: String,
    },
    /// Connection, framing or codec trouble: retried with back-off.
    #[error("transport: {0}")]
    Transport(String),
}

/// The admin operations reconcile needs; a trait so tests can fake the
/// brokers.
pub trait Admin: Send + Sync {
    /// Create `name`; TOPIC_ALREADY_EXISTS is `Ok`.
    fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        configs: &BTreeMap<String, String>,
    ) -> BoxFuture<'_, Result<(), AdminError>>;
    /// Grow `name` to `partitions`.
    fn create_partitions(
        &self,
        name: &str,
        partitions: i32,
    ) -> BoxFuture<'_, Result<(), AdminError>>;
    /// Delete `name`; UNKNOWN_TOPIC_OR_PARTITION is `Ok` (idempotent).
    fn delete_topic(&self, name: &str) -> BoxFuture<'_, Result<(), AdminError>>;
    /// Delete incarnation `id` of `name` only (DeleteTopics v6 by id, so a
    /// newer incarnation created meanwhile is never touched);
    /// UNKNOWN_TOPIC_ID / UNKNOWN_TOPIC_OR_PARTITION are `Ok`.
    fn delete_incarnation(
        &self,
        name: &str,
        id: uuid::Uuid,
    ) -> BoxFuture<'_, Result<(), AdminError>>;
    /// Set `configs` on `name` and delete the keys in `removed`.
    fn alter_configs(
        &self,
        name: &str,
        configs: &BTreeMap<String, String>,
        removed: &[String],
    ) -> BoxFuture<'_, Result<(), AdminError>>;
}

/// The real client: one TCP connection per call to `bootstrap`.
#[derive(Debug, Clone)]
pub struct KafkaAdmin {
    bootstrap: String,
    timeout: Duration,
}

/// Largest response frame accepted.
const MAX_FRAME: usize = 64 << 20;

impl KafkaAdmin {
    /// A client for `bootstrap` (host:port, the brokers' client Service).
    pub fn new(bootstrap: impl Into<String>, timeout: Duration) -> Self {
        Self {
            bootstrap: bootstrap.into(),
            timeout,
        }
    }

    async fn call<R: Request>(
        &self,
        conn: &mut tokio::net::TcpStream,
        req: &R,
        version: i16,
        correlation: i32,
    ) -> Result<R::Response, AdminError> {
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation)
            .with_client_id(Some(StrBytes::from_static_str("kaas-operator")));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, R::header_version(version))
            .map_err(|e| AdminError::Transport(format!("encode header: {e}")))?;
        req.encode(&mut body, version)
            .map_err(|e| AdminError::Transport(format!("encode request: {e}")))?;
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_i32(body.len() as i32);
        frame.extend_from_slice(&body);
        let io = async {
            conn.write_all(&frame).await?;
            let len = conn.read_i32().await?;
            let len = usize::try_from(len)
                .ok()
                .filter(|l| *l <= MAX_FRAME)
                .ok_or_else(|| std::io::Error::other(format!("bad frame length {len}")))?;
            let mut buf = vec![0u8; len];
            conn.read_exact(&mut buf).await?;
            Ok::<_, std::io::Error>(Bytes::from(buf))
        };
        let mut resp = tokio::time::timeout(self.timeout, io)
            .await
            .map_err(|_| AdminError::Transport("timed out".into()))?
            .map_err(|e| AdminError::Transport(e.to_string()))?;
        let rh = ResponseHeader::decode(
            &mut resp,
            <R::Response as HeaderVersion>::header_version(version),
        )
        .map_err(|e| AdminError::Transport(format!("decode header: {e}")))?;
        if rh.correlation_id != correlation {
            return Err(AdminError::Transport("correlation id mismatch".into()));
        }
        let out = R::Response::decode(&mut resp, version)
            .map_err(|e| AdminError::Transport(format!("decode response: {e}")))?;
        if resp.has_remaining() {
            tracing::debug!(left = resp.remaining(), "trailing bytes in response");
        }
        Ok(out)
    }

    /// Connect, ask ApiVersions, and pick the highest version of `key` both
    /// sides speak (our side: `ours`).
    async fn open(
        &self,
        key: ApiKey,
        ours: (i16, i16),
    ) -> Result<(tokio::net::TcpStream, i16), AdminError> {
        let mut conn = tokio::time::timeout(
            self.timeout,
            tokio::net::TcpStream::connect(&self.bootstrap),
        )
        .await
        .map_err(|_| AdminError::Transport(format!("connect {}: timed out", self.bootstrap)))?
        .map_err(|e| AdminError::Transport(format!("connect {}: {e}", self.bootstrap)))?;
        let versions: ApiVersionsResponse = self
            .call(&mut conn, &ApiVersionsRequest::default(), 0, 1)
            .await?;
        let theirs = versions
            .api_keys
            .iter()
            .find(|k| k.api_key == key as i16)
            .map(|k| (k.min_version, k.max_version));
        let version = pick_version(ours, theirs).ok_or(AdminError::NotSupported(key))?;
        Ok((conn, version))
    }
}

/// The highest version in both ranges.
pub fn pick_version(ours: (i16, i16), theirs: Option<(i16, i16)>) -> Option<i16> {
    let (lo, hi) = theirs?;
    let v = hi.min(ours.1);
    (v >= lo.max(ours.0)).then_some(v)
}

fn check(code: i16, message: Option<&StrBytes>, ok: &[i16]) -> Result<(), AdminError> {
    if code == 0 || ok.contains(&code) {
        return Ok(());
    }
    if code == code::UNSUPPORTED_VERSION {
        return Err(AdminError::Kafka {
            code,
            message: "unsupported version".into(),
        });
    }
    Err(AdminError::Kafka {
        code,
        message: message.map(|m| m.to_string()).unwrap_or_default(),
    })
}

fn topic(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_owned()))
}

impl Admin for KafkaAdmin {
    fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        configs: &BTreeMap<String, String>,
    ) -> BoxFuture<'_, Result<(), AdminError>> {
        let t = CreatableTopic::default()
            .with_name(topic(name))
            .with_num_partitions(partitions)
            .with_replication_factor(-1)
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfig::default()
                            .with_name(StrBytes::from_string(k.clone()))
                            .with_value(Some(StrBytes::from_string(v.clone())))
                    })
                    .collect(),
            );
        Box::pin(async move {
            let (mut c, v) = self.open(ApiKey::CreateTopics, (2, 7)).await?;
            let req = CreateTopicsRequest::default()
                .with_topics(vec![t])
                .with_timeout_ms(self.timeout.as_millis() as i32);
            let r: CreateTopicsResponse = self.call(&mut c, &req, v, 2).await?;
            let res = r
                .topics
                .first()
                .ok_or_else(|| AdminError::Transport("empty CreateTopics response".into()))?;
            check(
                res.error_code,
                res.error_message.as_ref(),
                &[code::TOPIC_ALREADY_EXISTS],
            )
        })
    }

    fn create_partitions(
        &self,
        name: &str,
        partitions: i32,
    ) -> BoxFuture<'_, Result<(), AdminError>> {
        // No manual assignment: null, as Kafka's admin clients send (the
        // crate's default is an empty list, which a broker refuses as
        // "0 assignments for N new partitions", as Kafka does).
        let t = CreatePartitionsTopic::default()
            .with_name(topic(name))
            .with_count(partitions)
            .with_assignments(None);
        Box::pin(async move {
            let (mut c, v) = self.open(ApiKey::CreatePartitions, (0, 3)).await?;
            let req = CreatePartitionsRequest::default()
                .with_topics(vec![t])
                .with_timeout_ms(self.timeout.as_millis() as i32);
            let r: CreatePartitionsResponse = self.call(&mut c, &req, v, 2).await?;
            let res = r
                .results
                .first()
                .ok_or_else(|| AdminError::Transport("empty CreatePartitions response".into()))?;
            check(res.error_code, res.error_message.as_ref(), &[])
        })
    }

    fn delete_topic(&self, name: &str) -> BoxFuture<'_, Result<(), AdminError>> {
        let name = name.to_owned();
        Box::pin(async move {
            let (mut c, v) = self.open(ApiKey::DeleteTopics, (1, 6)).await?;
            let mut req =
                DeleteTopicsRequest::default().with_timeout_ms(self.timeout.as_millis() as i32);
            if v >= 6 {
                req.topics = vec![DeleteTopicState::default().with_name(Some(topic(&name)))];
            } else {
                req.topic_names = vec![topic(&name)];
            }
            let r: DeleteTopicsResponse = self.call(&mut c, &req, v, 2).await?;
            let res = r
                .responses
                .first()
                .ok_or_else(|| AdminError::Transport("empty DeleteTopics response".into()))?;
            check(
                res.error_code,
                res.error_message.as_ref(),
                &[code::UNKNOWN_TOPIC],
            )
        })
    }

    fn delete_incarnation(
        &self,
        name: &str,
        id: uuid::Uuid,
    ) -> BoxFuture<'_, Result<(), AdminError>> {
        let name = name.to_owned();
        Box::pin(async move {
            let (mut c, v) = self.open(ApiKey::DeleteTopics, (6, 6)).await?;
            let req = DeleteTopicsRequest::default()
                .with_timeout_ms(self.timeout.as_millis() as i32)
                .with_topics(vec![DeleteTopicState::default().with_topic_id(id)]);
            let r: DeleteTopicsResponse = self.call(&mut c, &req, v, 2).await?;
            let res = r
                .responses
                .first()
                .ok_or_else(|| AdminError::Transport("empty DeleteTopics response".into()))?;
            tracing::debug!(topic = %name, %id, code = res.error_code, "DeleteTopics by id");
            check(
                res.error_code,
                res.error_message.as_ref(),
                &[code::UNKNOWN_TOPIC, code::UNKNOWN_TOPIC_ID],
            )
        })
    }

    fn alter_configs(
        &self,
        name: &str,
        configs: &BTreeMap<String, String>,
        removed: &[String],
    ) -> BoxFuture<'_, Result<(), AdminError>> {
        // Operation 0 = SET, 1 = DELETE; resource type 2 = TOPIC.
        let mut ops: Vec<AlterableConfig> = configs
            .iter()
            .map(|(k, v)| {
                AlterableConfig::default()
                    .with_name(StrBytes::from_string(k.clone()))
                    .with_config_operation(0)
                    .with_value(Some(StrBytes::from_string(v.clone())))
            })
            .collect();
        ops.extend(removed.iter().map(|k| {
            AlterableConfig::default()
                .with_name(StrBytes::from_string(k.clone()))
                .with_config_operation(1)
        }));
        let res = AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_string(name.to_owned()))
            .with_configs(ops);
        Box::pin(async move {
            let (mut c, v) = self.open(ApiKey::IncrementalAlterConfigs, (0, 1)).await?;
            let req = IncrementalAlterConfigsRequest::default().with_resources(vec![res]);
            let r: IncrementalAlterConfigsResponse = self.call(&mut c, &req, v, 2).await?;
            let res = r.responses.first().ok_or_else(|| {
                AdminError::Transport("empty IncrementalAlterConfigs response".into())
            })?;
            check(res.error_code, res.error_message.as_ref(), &[])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_negotiation() {
        assert_eq!(pick_version((2, 7), Some((2, 7))), Some(7));
        assert_eq!(pick_version((2, 7), Some((0, 5))), Some(5));
        assert_eq!(pick_version((2, 7), Some((8, 9))), None);
        assert_eq!(pick_version((0, 3), None), None);
    }

    #[test]
    fn already_exists_and_unknown_are_success_where_asked() {
        assert_eq!(check(36, None, &[code::TOPIC_ALREADY_EXISTS]), Ok(()));
        assert!(matches!(
            check(37, None, &[]),
            Err(AdminError::Kafka { code: 37, .. })
        ));
    }
}
