//! Request handling: one module per Kafka API, one route table, one error
//! type.
//!
//! Each API module holds its handler (`handle`), the version-specific field
//! handling of its response as pure functions, and their unit tests. Adding
//! an API is one new module plus one line in [`routes!`] below (and its entry
//! in `kaas_protocol::versions::SUPPORTED`): a compile-time assertion ties
//! the route table to the advertised table, so an advertised API without a
//! handler does not build, and a request for an API we do not advertise
//! closes the connection, as Kafka does.
//!
//! Grouping: topic administration lives in `admin/`; consumer-group APIs
//! (FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
//! OffsetCommit, OffsetFetch, OffsetDelete, ListGroups, DescribeGroups,
//! DeleteGroups, ConsumerGroupHeartbeat, ConsumerGroupDescribe) in `group/`;
//! transaction APIs (AddPartitionsToTxn, EndTxn, TxnOffsetCommit, ...) go in
//! `txn/`.
//!
//! Handlers run in two phases so pipelined requests keep their order: the
//! dispatch phase runs inline on the connection (it enqueues appends in
//! request order) and returns a future for the rest (waiting for fsync,
//! long-polling a fetch), which the connection resolves in order.
//!
//! Architecture invariant: only this module tree maps errors to Kafka codes
//! (see [`error`]); handlers hold no filesystem handle.

pub mod admin;
pub mod api_versions;
pub(crate) mod authorized;
pub mod describe_cluster;
pub mod describe_topic_partitions;
pub mod error;
pub mod fetch;
pub mod group;
pub mod init_producer_id;
pub mod list_offsets;
pub mod metadata;
pub mod offset_for_leader_epoch;
pub mod produce;
pub mod refused;
pub mod txn;

use crate::state::Broker;
use error::ApiError;
use futures::future::BoxFuture;
use futures::FutureExt;
use kaas_actors::partition::leader::PartitionHandle;
use kaas_actors::partition::reader::PartitionReader;
use kaas_protocol::kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use kaas_protocol::kafka_protocol::protocol::StrBytes;
use kaas_protocol::kafka_protocol::ResponseError;
use kaas_protocol::{RequestHeader, SUPPORTED};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// What a handler's dispatch phase produced.
pub enum Reply<T> {
    /// The response is ready.
    Now(T),
    /// The response resolves later (fsync, long poll); the connection
    /// awaits it in request order.
    Later(BoxFuture<'static, T>),
    /// No response at all: only Produce with acks=0.
    Nothing,
}

impl<T: Send + 'static> Reply<T> {
    fn into_dispatched<U: 'static>(self, kind: fn(U) -> ResponseKind) -> Dispatched
    where
        T: IntoAnswer<U>,
    {
        let answer = move |t: T| t.into_answer(kind);
        match self {
            Reply::Now(t) => Dispatched::Respond(futures::future::ready(answer(t)).boxed()),
            Reply::Later(f) => Dispatched::Respond(f.map(answer).boxed()),
            Reply::Nothing => Dispatched::NoResponse,
        }
    }
}

/// A response as the connection writes it: the body, and the ranges of
/// segment files its records are sent from (a Fetch's; none for the other
/// APIs). See [`fetch::Fetched`].
pub struct Answer {
    /// The body; a partition whose records are in `files` carries empty
    /// records here.
    pub body: ResponseKind,
    /// ((topic index, partition index) in the body, file range), in body
    /// order.
    pub files: Vec<fetch::FilePlace>,
}

/// What a handler's response becomes: most are the body alone.
pub trait IntoAnswer<U> {
    /// The answer, with the body wrapped by `kind`.
    fn into_answer(self, kind: fn(U) -> ResponseKind) -> Answer;
}

impl<U> IntoAnswer<U> for U {
    fn into_answer(self, kind: fn(U) -> ResponseKind) -> Answer {
        Answer {
            body: kind(self),
            files: Vec::new(),
        }
    }
}

/// Encode `answer` for `header`: the frame as parts, byte runs and file
/// ranges, in order.
pub fn encode(
    header: &kaas_protocol::RequestHeader,
    answer: Answer,
) -> Result<Vec<crate::conn::Part>, kaas_protocol::EncodeError> {
    if answer.files.is_empty() {
        return kaas_protocol::encode_response(header, &answer.body)
            .map(|b| vec![crate::conn::Part::Bytes(b)]);
    }
    match answer.body {
        ResponseKind::Fetch(resp) => fetch::encode_parts(header, resp, answer.files),
        body => {
            kaas_protocol::encode_response(header, &body).map(|b| vec![crate::conn::Part::Bytes(b)])
        }
    }
}

/// What the connection does with one request.
pub enum Dispatched {
    /// Write this response once it resolves, in request order.
    Respond(BoxFuture<'static, Answer>),
    /// acks=0 produce: Kafka sends nothing.
    NoResponse,
    /// Not an API we advertise: close the connection, as Kafka does.
    NotAdvertised,
}

/// The route table. Each line maps a `RequestKind`/`ApiKey` variant to its
/// module's `handle(&Arc<Broker>, version, request) -> Reply<Response>`;
/// the response is wrapped in the `ResponseKind` variant of the same name.
macro_rules! routes {
    ($($key:ident => $handler:path),* $(,)?) => {
        /// Every API with a handler, in table order.
        pub const ROUTED: &[ApiKey] = &[$(ApiKey::$key),*];

        async fn route(b: &Arc<Broker>, v: i16, body: RequestKind) -> Dispatched {
            match body {
                $(RequestKind::$key(r) => $handler(b, v, r).await.into_dispatched(ResponseKind::$key),)*
                _ => Dispatched::NotAdvertised,
            }
        }
    };
}

routes! {
    Produce => produce::handle,
    Fetch => fetch::handle,
    ListOffsets => list_offsets::handle,
    Metadata => metadata::handle,
    ApiVersions => api_versions::handle,
    CreateTopics => admin::create_topics::handle,
    DeleteTopics => admin::delete_topics::handle,
    InitProducerId => init_producer_id::handle,
    OffsetForLeaderEpoch => offset_for_leader_epoch::handle,
    DescribeConfigs => admin::describe_configs::handle,
    DescribeCluster => describe_cluster::handle,
    DescribeTopicPartitions => describe_topic_partitions::handle,
    FindCoordinator => group::find_coordinator::handle,
    DescribeClientQuotas => admin::client_quotas::describe,
    AlterClientQuotas => admin::client_quotas::alter,
    DeleteGroups => group::delete_groups::handle,
    OffsetDelete => group::offset_delete::handle,
    JoinGroup => group::join_group::handle,
    SyncGroup => group::sync_group::handle,
    Heartbeat => group::heartbeat::handle,
    LeaveGroup => group::leave_group::handle,
    OffsetCommit => group::offset_commit::handle,
    OffsetFetch => group::offset_fetch::handle,
    ListGroups => group::list_groups::handle,
    DescribeGroups => group::describe_groups::handle,
    CreatePartitions => admin::create_partitions::handle,
    AlterConfigs => admin::alter_configs::handle,
    IncrementalAlterConfigs => admin::alter_configs::handle_incremental,
    DeleteRecords => admin::delete_records::handle,
    DescribeLogDirs => admin::describe_log_dirs::handle,
    ElectLeaders => admin::elect_leaders::handle,
    AlterPartitionReassignments => admin::reassignments::handle_alter,
    ListPartitionReassignments => admin::reassignments::handle_list,
    WriteTxnMarkers => txn::write_txn_markers::handle,
    DescribeProducers => txn::describe_producers::handle,
    ConsumerGroupHeartbeat => group::consumer_group_heartbeat::handle,
    ConsumerGroupDescribe => group::consumer_group_describe::handle,
    AddPartitionsToTxn => txn::add_partitions_to_txn::handle,
    AddOffsetsToTxn => txn::add_offsets_to_txn::handle,
    EndTxn => txn::end_txn::handle,
    TxnOffsetCommit => txn::txn_offset_commit::handle,
    DescribeTransactions => txn::describe_transactions::handle,
    ListTransactions => txn::list_transactions::handle,
}

/// Whether `routed` has exactly the api keys of `advertised` (no more, no
/// fewer), as a `const fn` so the check runs at compile time.
const fn same_keys(advertised: &[(ApiKey, i16, i16)], routed: &[ApiKey]) -> bool {
    if advertised.len() != routed.len() {
        return false;
    }
    let mut i = 0;
    while i < advertised.len() {
        let mut found = false;
        let mut j = 0;
        while j < routed.len() {
            if advertised[i].0 as i16 == routed[j] as i16 {
                found = true;
            }
            j += 1;
        }
        if !found {
            return false;
        }
        i += 1;
    }
    true
}

// An advertised API without a handler would leave clients waiting forever;
// a handler for an API we do not advertise is dead code. Neither builds.
const _: () = assert!(
    same_keys(SUPPORTED, ROUTED),
    "api::ROUTED and versions::SUPPORTED must list the same APIs"
);

/// Route one request: run its dispatch phase inline.
pub async fn dispatch(b: &Arc<Broker>, h: &RequestHeader, body: RequestKind) -> Dispatched {
    // parse_request already refuses these; checked again so the rule does
    // not depend on the caller.
    if !kaas_protocol::versions::is_supported(h.api_key, h.api_version) {
        return Dispatched::NotAdvertised;
    }
    // Quotas read the client id, and the group APIs that record a member's
    // (JoinGroup, ConsumerGroupHeartbeat): for the hot path with no quota
    // configured, no allocation.
    let wanted = b.quotas.active()
        || h.api_key == ApiKey::JoinGroup as i16
        || h.api_key == ApiKey::ConsumerGroupHeartbeat as i16;
    let client: Option<Arc<str>> = wanted.then(|| Arc::from(h.client_id.as_deref().unwrap_or("")));
    CLIENT_ID.scope(client, route(b, h.api_version, body)).await
}

/// Dispatch a Produce whose frame was over `--max-request-bytes` (parsed
/// by `kaas_protocol::parse_oversized_produce`): answered
/// MESSAGE_TOO_LARGE per partition, nothing appended.
pub fn dispatch_oversized(h: &RequestHeader, body: RequestKind) -> Dispatched {
    match body {
        RequestKind::Produce(r) => {
            produce::too_large(h.api_version, r).into_dispatched(ResponseKind::Produce)
        }
        _ => Dispatched::NotAdvertised,
    }
}

tokio::task_local! {
    /// The request header's client id, for the dispatch phase of a handler
    /// (quotas): read it with [`client_id`] before the handler returns its
    /// completion future. `None` when nothing needs it (no quota configured
    /// and not an API that records a member).
    static CLIENT_ID: Option<Arc<str>>;
}

/// The client id of the request being dispatched, if quotas need it
/// (`None` outside a request or with no quota configured).
pub(crate) fn client_id() -> Option<Arc<str>> {
    CLIENT_ID.try_with(|c| c.clone()).ok().flatten()
}

tokio::task_local! {
    /// The connection's peer address, for the dispatch phase of a handler
    /// (DescribeGroups' client host, per-peer rate-limited warnings).
    static PEER: std::net::SocketAddr;
}

/// Run `f` (a request's [`dispatch`]) with `peer` readable through [`peer`].
pub async fn with_peer<F: std::future::Future>(peer: std::net::SocketAddr, f: F) -> F::Output {
    PEER.scope(peer, f).await
}

tokio::task_local! {
    /// How long the connection is to read nothing more after the answer of
    /// the request being dispatched is queued (see [`hold_connection`]).
    static HOLD: std::cell::Cell<std::time::Duration>;
}

/// Run `f` (a request's [`dispatch`]) and say how long the connection is
/// to hold its next read afterwards ([`hold_connection`]).
pub async fn with_hold<F: std::future::Future>(f: F) -> (F::Output, std::time::Duration) {
    HOLD.scope(std::cell::Cell::new(std::time::Duration::ZERO), async {
        let out = f.await;
        (out, HOLD.with(std::cell::Cell::get))
    })
    .await
}

/// Mute the connection of the request being dispatched for `d` once its
/// answer is queued, as Kafka mutes a throttled channel after sending the
/// response: the client gets its answer (and throttle_time_ms) at once, and
/// its next request waits. Outside a request (tests) nothing is held.
pub(crate) fn hold_connection(d: std::time::Duration) {
    let _ = HOLD.try_with(|h| h.set(h.get().max(d)));
}

/// The peer address of the request being dispatched (`None` outside one).
pub(crate) fn peer() -> Option<std::net::SocketAddr> {
    PEER.try_with(|p| *p).ok()
}

/// Count one `kind` warning from the peer of the request being dispatched:
/// `Some(count)` when it is to be logged (once per interval per peer and
/// kind, see `limits::PeerWarnings`), so a client repeating a refused
/// request does not write a WARN line per request. Outside a request every
/// warning is logged.
pub(crate) fn warn_for_peer(b: &Broker, kind: &'static str) -> Option<u64> {
    match peer() {
        Some(p) => b.peer_warnings.hit(p.ip(), kind, Instant::now()),
        None => Some(1),
    }
}

/// The request's peer for a log line ("" outside a request).
pub(crate) fn peer_name() -> String {
    peer().map_or_else(String::new, |p| p.to_string())
}

/// A member's client host as Kafka shows it (`/127.0.0.1`: Java's
/// `InetAddress.toString()` with an empty host name), "" when unknown.
pub(crate) fn client_host() -> String {
    peer().map_or_else(String::new, |p| format!("/{}", p.ip()))
}

/// A protocol string.
pub(crate) fn s(x: &str) -> StrBytes {
    StrBytes::from_string(x.to_owned())
}

/// How a request names a topic: by name, or by id (Produce v13, Fetch v13+).
#[derive(Debug, Clone, Copy)]
pub(crate) enum TopicRef<'a> {
    Name(&'a str),
    Id(Uuid),
}

impl<'a> TopicRef<'a> {
    /// The id when `by_id` (the request version addresses topics by id),
    /// else the name.
    pub(crate) fn pick(by_id: bool, name: &'a str, id: Uuid) -> Self {
        if by_id {
            TopicRef::Id(id)
        } else {
            TopicRef::Name(name)
        }
    }

    fn resolve(self, b: &Broker) -> Result<String, ApiError> {
        match self {
            TopicRef::Name(n) => Ok(n.to_owned()),
            TopicRef::Id(id) => b
                .topic_by_id(&id)
                .map(|t| t.name)
                .ok_or(ApiError(ResponseError::UnknownTopicId)),
        }
    }
}

/// KIP-320: compare the client's view of the leader epoch (`current`, -1
/// when the client sends none) with the epoch the assignment granted
/// (`granted`, `None` when the assignment does not list the partition: the
/// lookup that follows reports it unknown).
pub(crate) fn check_epoch(granted: Option<i32>, current: i32) -> Result<(), ApiError> {
    match granted {
        Some(g) if current >= 0 && current < g => Err(ResponseError::FencedLeaderEpoch.into()),
        Some(g) if current >= 0 && current > g => Err(ResponseError::UnknownLeaderEpoch.into()),
        _ => Ok(()),
    }
}

/// A partition this broker leads, found for a request.
pub(crate) struct Located {
    /// The topic's name (resolved from its id if the request used one).
    pub name: String,
    /// The leader.
    pub handle: PartitionHandle,
}

/// The steps every partition-addressed API shares: resolve the topic by
/// name or id, check the client's leader epoch (KIP-320; pass -1 for APIs
/// without one), and find this broker's leader of the partition.
pub(crate) fn locate(
    b: &Broker,
    topic: TopicRef<'_>,
    partition: i32,
    current_epoch: i32,
) -> Result<Located, ApiError> {
    let name = topic.resolve(b)?;
    check_epoch(b.entry(&name, partition).map(|e| e.epoch), current_epoch)?;
    let handle = b.partition(&name, partition)?.handle;
    Ok(Located { name, handle })
}

/// [`locate`], then the partition's reader, waiting (bounded) for a leader
/// that is still opening its files.
pub(crate) async fn locate_reader(
    b: &Broker,
    topic: TopicRef<'_>,
    partition: i32,
    current_epoch: i32,
) -> Result<(PartitionHandle, PartitionReader), ApiError> {
    let h = locate(b, topic, partition, current_epoch)?.handle;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut hw = h.hw.clone();
    loop {
        let reader = h.reader.read().unwrap().clone();
        if let Some(r) = reader {
            return Ok((h, r));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || tokio::time::timeout(left, hw.changed()).await.is_err() {
            return Err(ResponseError::NotLeaderOrFollower.into());
        }
    }
}

/// Brokers to advertise (the assignment's live brokers; before the first
/// assignment, just this one) and the controller id.
pub(crate) fn live_brokers(b: &Broker) -> (Vec<(i32, String, i32)>, i32) {
    let a = b.assignment();
    let mut v: Vec<(i32, String, i32)> = a
        .brokers
        .iter()
        .map(|x| (x.id, x.host.clone(), x.port))
        .collect();
    if !v.iter().any(|x| x.0 == b.args.broker_id) {
        let (host, port) = b.args.advertised();
        v.push((b.args.broker_id, host, port));
    }
    let controller = if a.version == 0 { -1 } else { a.controller_id };
    (v, controller)
}

/// After a create: the controller picks the topic up from the volume; wait
/// (bounded) until this broker's metadata shows it with every partition
/// led, so a client's next request finds a leader.
pub(crate) async fn await_topic_ready(b: &Broker, name: &str, id: Uuid, timeout: Duration) -> bool {
    if let Some(c) = b.controller.get() {
        c.do_send(kaas_actors::cluster::controller::ReconcileNow);
    }
    poll_until(Instant::now() + timeout, || async {
        b.assignment()
            .topics
            .get(name)
            .is_some_and(|t| t.topic_id == id && t.partitions.iter().all(|e| e.leader >= 0))
    })
    .await
}

/// Ask `ready` every 10 ms until it holds (true) or `deadline` passes
/// (false): the bounded wait of an admin answer for what the controller
/// or the volume will show.
pub(crate) async fn poll_until<F, Fut>(deadline: Instant, mut ready: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        if ready().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_advertised_api_has_a_route_and_no_more() {
        assert!(same_keys(SUPPORTED, ROUTED));
        for (k, _, _) in SUPPORTED {
            assert_eq!(
                ROUTED.iter().filter(|r| *r == k).count(),
                1,
                "{k:?} must have exactly one route"
            );
        }
        assert_eq!(ROUTED.len(), SUPPORTED.len());
    }

    #[test]
    fn key_check_catches_a_missing_or_extra_route() {
        let adv = [(ApiKey::Produce, 3, 13), (ApiKey::Fetch, 4, 18)];
        assert!(same_keys(&adv, &[ApiKey::Fetch, ApiKey::Produce]));
        assert!(!same_keys(&adv, &[ApiKey::Produce]));
        assert!(!same_keys(&adv, &[ApiKey::Produce, ApiKey::JoinGroup]));
        assert!(!same_keys(
            &adv,
            &[ApiKey::Produce, ApiKey::Fetch, ApiKey::JoinGroup]
        ));
    }

    #[tokio::test]
    async fn the_peer_is_known_only_inside_a_request() {
        assert_eq!(peer(), None);
        assert_eq!(client_host(), "");
        let addr: std::net::SocketAddr = "10.1.2.3:4567".parse().unwrap();
        let (p, host) = with_peer(addr, async { (peer(), client_host()) }).await;
        assert_eq!(p, Some(addr));
        // As Kafka shows a member's host: "/" and the address, no port.
        assert_eq!(host, "/10.1.2.3");
    }

    #[test]
    fn kip_320_epoch_check() {
        assert_eq!(check_epoch(Some(5), -1), Ok(()));
        assert_eq!(check_epoch(Some(5), 5), Ok(()));
        assert_eq!(
            check_epoch(Some(5), 4).unwrap_err().code(),
            ResponseError::FencedLeaderEpoch.code()
        );
        assert_eq!(
            check_epoch(Some(5), 6).unwrap_err().code(),
            ResponseError::UnknownLeaderEpoch.code()
        );
        // Unknown partition: the lookup after the check reports it.
        assert_eq!(check_epoch(None, 3), Ok(()));
    }
}
