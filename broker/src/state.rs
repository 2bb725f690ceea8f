//! The broker's shared context: configuration and the metadata cache fed by
//! the assignment. The partition leaders and the group coordinators (one per
//! coordinator shard) this broker runs live in [`OwnerRegistry`]s (in
//! `actors`), started and stopped by grant only by the assignment watcher
//! (through [`LeaderSink`]); this module says what a grant means for this
//! broker (which partitions and shards, with what settings) and requests
//! look owners up here, getting NOT_LEADER / NOT_COORDINATOR for anything
//! this incarnation was not granted.

use crate::config::BrokerArgs;
use futures::future::LocalBoxFuture;
use kaas_actors::cluster::controller::ControllerActor;
use kaas_actors::cluster::membership::Shared;
use kaas_actors::cluster::records::{
    Assignment, FencedAt, PartitionAssignment, COORDINATOR_SHARDS,
};
use kaas_actors::cluster::watcher::LeaderSink;
use kaas_actors::group::consumer::{ConsumerConfig, TopicMeta, TopicSource};
use kaas_actors::group::coordinator::consumer::Topics;
use kaas_actors::group::coordinator::{CoordinatorHandle, CoordinatorSpec, GroupCoordinator};
use kaas_actors::group::log::ShardLogConfig;
use kaas_actors::group::shard::{ShardCount, ShardId};
use kaas_actors::partition::claim::ClaimOwner;
use kaas_actors::partition::leader::{LeaderSpec, OnFenced, PartitionHandle, PartitionLeader};
use kaas_actors::partition::log::LogConfig;
use kaas_actors::partition::messages::SetLogConfig;
use kaas_actors::producer_id_blocks::ProducerIdBlocks;
use kaas_actors::registry::OwnerRegistry;
use kaas_actors::telemetry::Mailbox;
use kaas_actors::topic::{TopicCatalog, TopicStamp, TopicsView};
use kaas_actors::txn::coordinator::{
    MarkerSink, TxnCoordinator, TxnCoordinatorHandle, TxnCoordinatorSpec,
};
use kaas_volume::fs::{ReadFs, ReadOnly, SharedFs};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// A partition grant: the topic id and the leader epoch. A re-created topic
/// or a new grant never reuses a leader.
type Grant = (uuid::Uuid, i32);

/// A partition this broker leads.
#[derive(Clone)]
pub struct Led {
    /// The leader actor.
    pub handle: PartitionHandle,
}

/// Shared by every connection.
pub struct Broker {
    /// Flags.
    pub args: BrokerArgs,
    /// The volume, read-only: request handlers cannot open a file for
    /// writing through it.
    pub fs: ReadFs,
    /// The volume with write access, only handed to the partition leaders
    /// this broker starts (each the single writer of its partition).
    leader_fs: SharedFs,
    /// Membership: broker id, lease, incarnation, published state.
    pub shared: Arc<Shared>,
    /// Cluster id reported in Metadata / DescribeCluster.
    pub cluster_id: String,
    /// The data directory's binding to this cluster, verified by every
    /// partition open (`None` only under the test-only hook).
    binding: Option<Arc<kaas_volume::binding::Binding>>,
    /// Topics of the newest assignment applied.
    pub topics: TopicsView,
    /// The topic catalog actor (creates and deletes topic directories).
    pub catalog: Mailbox<TopicCatalog>,
    /// The owner of the producer-id blocks.
    pub pids: Mailbox<ProducerIdBlocks>,
    /// The newest assignment applied (metadata cache).
    meta: RwLock<Arc<Assignment>>,
    /// Leaders by (topic, partition), with the grant they run under. Topics
    /// being deleted are held: no leader may start for them meanwhile.
    leaders: OwnerRegistry<(String, i32), Grant, PartitionHandle>,
    /// Group coordinators by shard, with the epoch of their grant.
    coordinators: OwnerRegistry<ShardId, i32, CoordinatorHandle>,
    /// Transaction coordinators by shard (same grants as the groups').
    txn_coordinators: OwnerRegistry<ShardId, i32, TxnCoordinatorHandle>,
    /// Broker-to-broker requests (transaction markers).
    pub peers: Arc<crate::peer::PeerClient>,
    arbiters: Vec<actix::ArbiterHandle>,
    next_arbiter: AtomicUsize,
    /// This broker's controller actor (elected or not).
    pub controller: std::sync::OnceLock<Mailbox<ControllerActor>>,
    /// Rate of Metadata auto-creation (--auto-create-per-sec).
    pub auto_create: std::sync::Mutex<crate::limits::TokenBucket>,
    /// KIP-599 partition mutation quota (--controller-mutation-rate).
    pub mutations: std::sync::Mutex<crate::limits::MutationQuota>,
    /// Repeated warnings about one peer, logged once per interval.
    pub peer_warnings: crate::limits::PeerWarnings,
    /// Batches rebuilt to a topic's compression.type at once (one per
    /// core): each may hold up to its decompression cap, so this bounds
    /// the memory rebuilds take (see `api::produce`).
    pub recompress_slots: Arc<tokio::sync::Semaphore>,
    /// Clients already named in a refused-version WARN (see
    /// [`crate::api::refused`]).
    pub refused_clients: crate::api::refused::RefusedClients,
    /// The data volume's free-space reserve (see [`crate::reserve`]).
    pub reserve: Arc<crate::reserve::Reserve>,
    /// Client byte-rate quotas (see [`crate::quota`]).
    pub quotas: Arc<crate::quota::QuotaManager>,
    /// KIP-227 incremental fetch sessions (see [`crate::fetch_session`]).
    pub fetch_sessions: std::sync::Mutex<crate::fetch_session::FetchSessions>,
    /// Bytes held by every connection's requests and unwritten answers
    /// (see [`crate::conn::ByteBudget`]).
    pub inflight: Arc<crate::conn::ByteBudget>,
    /// The data plane's descriptors (files, connections, peer and HTTP
    /// sockets): at most its cap, so the control plane keeps its reserve
    /// (see [`crate::fd_budget`]).
    pub fd_budget: Arc<kaas_volume::fs::FdBudget>,
}

/// The topic configs a produce is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProduceLimits {
    /// max.message.bytes: the largest batch.
    pub max_message_bytes: i64,
    /// message.timestamp.before.max.ms
    pub before_max_ms: i64,
    /// message.timestamp.after.max.ms
    pub after_max_ms: i64,
    /// message.timestamp.type=LogAppendTime: batches are stamped with the
    /// leader's clock at append (and the bounds above do not apply).
    pub log_append_time: bool,
    /// compression.type other than `producer`, with its level: batches in
    /// another codec are rebuilt with this one before they are appended.
    pub compression: Option<kaas_protocol::batch::Codec>,
}

/// Why a coordinator shard cannot be served here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordinatorLookupError {
    /// No shards in the assignment yet (COORDINATOR_NOT_AVAILABLE).
    NoShards,
    /// Another broker owns it, or nobody yet (NOT_COORDINATOR).
    NotCoordinator,
}

/// Why a partition cannot be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupError {
    /// UNKNOWN_TOPIC_OR_PARTITION
    Unknown,
    /// NOT_LEADER_OR_FOLLOWER: another broker leads it, or nobody yet.
    NotLeader,
}

impl Broker {
    /// Assemble the context. `fs` counts its descriptors in `fd_budget`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        args: BrokerArgs,
        fs: SharedFs,
        fd_budget: Arc<kaas_volume::fs::FdBudget>,
        shared: Arc<Shared>,
        cluster_id: String,
        binding: Option<Arc<kaas_volume::binding::Binding>>,
        catalog: Mailbox<TopicCatalog>,
        pids: Mailbox<ProducerIdBlocks>,
        arbiters: Vec<actix::ArbiterHandle>,
    ) -> Self {
        Self {
            fs: fs.read_only(),
            leader_fs: fs,
            shared,
            cluster_id,
            binding,
            topics: Arc::default(),
            catalog,
            pids,
            meta: RwLock::new(Arc::default()),
            leaders: OwnerRegistry::new(),
            coordinators: OwnerRegistry::new(),
            txn_coordinators: OwnerRegistry::new(),
            peers: Arc::new(crate::peer::PeerClient::new(
                format!("kaas-broker-{}", args.broker_id),
                fd_budget.clone(),
            )),
            fd_budget,
            arbiters,
            next_arbiter: AtomicUsize::new(0),
            controller: std::sync::OnceLock::new(),
            auto_create: std::sync::Mutex::new(crate::limits::TokenBucket::new(
                args.auto_create_per_sec,
                args.auto_create_per_sec,
                std::time::Instant::now(),
            )),
            mutations: std::sync::Mutex::new(crate::limits::MutationQuota::new(
                args.controller_mutation_rate,
                std::time::Instant::now(),
            )),
            peer_warnings: crate::limits::PeerWarnings::new(Duration::from_secs(10)),
            recompress_slots: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, |n| n.get()),
            )),
            refused_clients: Default::default(),
            fetch_sessions: Default::default(),
            inflight: Arc::new(crate::conn::ByteBudget::new(
                args.broker_inflight_bytes as usize,
            )),
            quotas: Default::default(),
            reserve: Arc::new(crate::reserve::Reserve::new(
                &args.data_dir,
                &args.cluster_dir(),
                args.data_reserve_bytes,
            )),
            args,
        }
    }

    /// A topic's stamp, as the newest assignment knows it.
    pub fn topic(&self, name: &str) -> Option<TopicStamp> {
        self.topics.read().unwrap().get(name).cloned()
    }

    /// The partition limits for one request, over the cluster as this
    /// broker knows it (its topics, and the live brokers the assignment
    /// advertises).
    pub fn partition_budget(&self) -> crate::limits::PartitionBudget {
        crate::limits::PartitionBudget::new(
            &self.args,
            self.partition_count(),
            self.assignment().brokers.len(),
        )
    }

    /// Partitions of every topic this broker knows (the cluster's count
    /// for the partition limits).
    pub fn partition_count(&self) -> i64 {
        self.topics
            .read()
            .unwrap()
            .values()
            .map(|t| i64::from(t.partitions))
            .sum()
    }

    /// A topic's name by id (Fetch v13+, Produce v13, DeleteTopics v6).
    pub fn topic_by_id(&self, id: &uuid::Uuid) -> Option<TopicStamp> {
        self.topics
            .read()
            .unwrap()
            .values()
            .find(|t| &t.topic_id == id)
            .cloned()
    }

    /// Whether the volume has a directory for topic `name` (one another
    /// broker may have just created, before the assignment lists it). The
    /// probe is file I/O, so it runs on the blocking pool; a failed probe
    /// reads as "no". Request handlers ask this instead of holding the
    /// filesystem handle.
    pub async fn topic_dir_exists(&self, name: &str) -> bool {
        let fs = self.fs.clone();
        let dir = self.args.data_dir.join(name);
        tokio::task::spawn_blocking(move || fs.is_dir(&dir))
            .await
            .unwrap_or(false)
    }

    /// Whether the directory `name` on the volume holds incarnation `id`
    /// (by its stamp; a failed read counts as "still there").
    pub async fn topic_incarnation_on_volume(&self, name: &str, id: uuid::Uuid) -> bool {
        let fs = self.fs.clone();
        let stamp = self
            .args
            .data_dir
            .join(name)
            .join(kaas_actors::topic::STAMP);
        tokio::task::spawn_blocking(move || match fs.read(&stamp) {
            Ok(b) => serde_json::from_slice::<TopicStamp>(&b).map_or(true, |s| s.topic_id == id),
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        })
        .await
        .unwrap_or(true)
    }

    /// Storage settings for a topic: its configs over the broker defaults.
    pub fn log_config(&self, t: &TopicStamp) -> LogConfig {
        let get = |k: &str| kaas_volume::topic_config::get_i64(&t.configs, k);
        LogConfig {
            segment_bytes: get("segment.bytes")
                .map(|v| v as u64)
                .unwrap_or(self.args.segment_bytes),
            segment_ms: get("segment.ms").unwrap_or(self.args.segment_ms),
            retention_ms: get("retention.ms").unwrap_or(self.args.retention_ms),
            retention_bytes: get("retention.bytes").unwrap_or(self.args.retention_bytes),
            producer_id_expiration_ms: self.args.producer_id_expiration_ms,
            ..LogConfig::default()
        }
    }

    /// What a produce to `topic` must respect (its configs over the broker
    /// defaults), read under the view's lock without copying the topic.
    pub fn produce_limits(&self, topic: &str) -> ProduceLimits {
        let topics = self.topics.read().unwrap();
        let c = topics.get(topic).map(|t| &t.configs);
        let get = |k: &str| c.and_then(|c| kaas_volume::topic_config::get_i64(c, k));
        ProduceLimits {
            max_message_bytes: get("max.message.bytes").unwrap_or(self.args.message_max_bytes),
            before_max_ms: get("message.timestamp.before.max.ms").unwrap_or(i64::MAX),
            after_max_ms: get("message.timestamp.after.max.ms").unwrap_or(i64::MAX),
            log_append_time: c
                .and_then(|c| c.get("message.timestamp.type"))
                .is_some_and(|t| t == "LogAppendTime"),
            compression: c
                .and_then(|c| c.get("compression.type"))
                .and_then(|t| kaas_protocol::batch::Codec::from_topic_config(t))
                .map(|codec| {
                    use kaas_protocol::kafka_protocol::records::Compression;
                    let level_key = match codec.compression {
                        Compression::Gzip => "compression.gzip.level",
                        Compression::Lz4 => "compression.lz4.level",
                        Compression::Zstd => "compression.zstd.level",
                        Compression::None | Compression::Snappy => return codec,
                    };
                    match get(level_key).and_then(|l| i32::try_from(l).ok()) {
                        Some(level) => kaas_protocol::batch::Codec { level, ..codec },
                        None => codec,
                    }
                }),
        }
    }

    /// The newest assignment applied.
    pub fn assignment(&self) -> Arc<Assignment> {
        self.meta.read().unwrap().clone()
    }

    /// The assignment entry of (topic, partition).
    pub fn entry(&self, topic: &str, partition: i32) -> Option<PartitionAssignment> {
        self.meta.read().unwrap().entry(topic, partition).copied()
    }

    /// The leader of (topic, partition), if this broker holds it now: granted
    /// to this incarnation, lease valid, leader started.
    pub fn partition(&self, topic: &str, partition: i32) -> Result<Led, LookupError> {
        let e = self.entry(topic, partition).ok_or(LookupError::Unknown)?;
        if self.leaders.is_held(topic) {
            return Err(LookupError::Unknown);
        }
        let lease = &self.shared.lease;
        if e.leader != self.args.broker_id
            || e.incarnation != lease.incarnation()
            || !lease.valid_for(e.incarnation)
        {
            return Err(LookupError::NotLeader);
        }
        match self.leaders.get(&(topic.to_owned(), partition)) {
            Some(((_, epoch), handle)) if epoch == e.epoch => Ok(Led { handle }),
            _ => Err(LookupError::NotLeader),
        }
    }

    /// The cluster's coordinator shard count, as the assignment grants them.
    pub fn shard_count(&self) -> Option<ShardCount> {
        ShardCount::new(self.meta.read().unwrap().coordinators.len() as u32)
    }

    /// The shard of `group_id` and its entry in the assignment.
    pub fn coordinator_entry(&self, group_id: &str) -> Option<(ShardId, PartitionAssignment)> {
        let a = self.meta.read().unwrap();
        let shard = ShardCount::new(a.coordinators.len() as u32)?.shard_of(group_id);
        a.coordinator(shard.0).map(|e| (shard, *e))
    }

    /// The coordinator of `group_id`'s shard, if this broker owns it now:
    /// granted to this incarnation, lease valid, coordinator started.
    pub fn coordinator(&self, group_id: &str) -> Result<CoordinatorHandle, CoordinatorLookupError> {
        let (shard, e) = self
            .coordinator_entry(group_id)
            .ok_or(CoordinatorLookupError::NoShards)?;
        let lease = &self.shared.lease;
        if e.leader != self.args.broker_id
            || e.incarnation != lease.incarnation()
            || !lease.valid_for(e.incarnation)
        {
            return Err(CoordinatorLookupError::NotCoordinator);
        }
        match self.coordinators.get(&shard) {
            Some((epoch, handle)) if epoch == e.epoch => Ok(handle),
            _ => Err(CoordinatorLookupError::NotCoordinator),
        }
    }

    /// Whether this broker owns shard `shard` now (granted to this
    /// incarnation, lease valid).
    fn owns_shard(&self, shard: ShardId) -> Result<i32, CoordinatorLookupError> {
        let a = self.meta.read().unwrap();
        if a.coordinators.is_empty() {
            return Err(CoordinatorLookupError::NoShards);
        }
        let e = a
            .coordinator(shard.0)
            .ok_or(CoordinatorLookupError::NotCoordinator)?;
        let lease = &self.shared.lease;
        if e.leader != self.args.broker_id
            || e.incarnation != lease.incarnation()
            || !lease.valid_for(e.incarnation)
        {
            return Err(CoordinatorLookupError::NotCoordinator);
        }
        Ok(e.epoch)
    }

    /// The group coordinator of shard `shard`, if this broker owns it now
    /// (transaction markers for `__consumer_offsets`/shard).
    pub fn group_shard(&self, shard: ShardId) -> Result<CoordinatorHandle, CoordinatorLookupError> {
        let epoch = self.owns_shard(shard)?;
        match self.coordinators.get(&shard) {
            Some((e, handle)) if e == epoch => Ok(handle),
            _ => Err(CoordinatorLookupError::NotCoordinator),
        }
    }

    /// The transaction coordinator of `transactional_id`'s shard (the same
    /// hash and shards as groups), if this broker owns it now.
    pub fn txn_coordinator(
        &self,
        transactional_id: &str,
    ) -> Result<TxnCoordinatorHandle, CoordinatorLookupError> {
        let shard = self
            .shard_count()
            .ok_or(CoordinatorLookupError::NoShards)?
            .shard_of(transactional_id);
        let epoch = self.owns_shard(shard)?;
        match self.txn_coordinators.get(&shard) {
            Some((e, handle)) if e == epoch => Ok(handle),
            _ => Err(CoordinatorLookupError::NotCoordinator),
        }
    }

    /// Every transaction coordinator this broker runs (ListTransactions).
    pub fn txn_coordinators(&self) -> Vec<TxnCoordinatorHandle> {
        let a = self.assignment();
        (0..a.coordinators.len() as u32)
            .filter_map(|s| self.txn_coordinators.get(&ShardId(s)).map(|(_, h)| h))
            .collect()
    }

    fn start_txn_coordinator(
        self: &Arc<Self>,
        shard: ShardId,
        epoch: i32,
        inc: u64,
    ) -> TxnCoordinatorHandle {
        let i = self.next_arbiter.fetch_add(1, Ordering::Relaxed) % self.arbiters.len();
        let me = Arc::downgrade(self);
        let spec = TxnCoordinatorSpec {
            shard,
            cluster_dir: self.args.cluster_dir(),
            epoch,
            lease: Some((self.shared.lease.clone(), inc)),
            owner: Some(ClaimOwner {
                broker_id: self.shared.broker_id,
                incarnation: inc,
            }),
            on_fenced: Some(self.shard_fenced(shard)),
            log: ShardLogConfig::default(),
            expiration_ms: self.args.transactional_id_expiration_ms,
            markers: MarkerSink(Arc::new(move |job| {
                crate::txn_markers::send(me.clone(), job)
            })),
        };
        TxnCoordinator::start(
            spec,
            self.leader_fs.clone(),
            self.shared.lease.clock().clone(),
            &self.arbiters[i],
        )
    }

    /// How a shard's owner (group or transaction coordinator) reports being
    /// fenced: the controller reads it from this broker's record and
    /// re-grants the shard above the epoch found.
    fn shard_fenced(&self, shard: ShardId) -> OnFenced {
        let shared = self.shared.clone();
        OnFenced(Arc::new(move |found, owner| {
            let mut st = shared.state.lock().unwrap();
            let e = FencedAt {
                topic: COORDINATOR_SHARDS.to_owned(),
                partition: shard.0 as i32,
                found,
                owner,
            };
            if !st.fenced.contains(&e) {
                st.fenced.push(e);
            }
        }))
    }

    /// Every coordinator this broker runs (ListGroups).
    pub fn coordinators(&self) -> Vec<CoordinatorHandle> {
        let a = self.assignment();
        (0..a.coordinators.len() as u32)
            .filter_map(|s| self.coordinators.get(&ShardId(s)).map(|(_, h)| h))
            .collect()
    }

    fn start_coordinator(&self, shard: ShardId, epoch: i32, inc: u64) -> CoordinatorHandle {
        let i = self.next_arbiter.fetch_add(1, Ordering::Relaxed) % self.arbiters.len();
        let spec = CoordinatorSpec {
            shard,
            cluster_dir: self.args.cluster_dir(),
            epoch,
            lease: Some((self.shared.lease.clone(), inc)),
            owner: Some(ClaimOwner {
                broker_id: self.shared.broker_id,
                incarnation: inc,
            }),
            on_fenced: Some(self.shard_fenced(shard)),
            groups: self.args.group_config(),
            log: ShardLogConfig::default(),
            retention_ms: self.args.offsets_retention_minutes.saturating_mul(60_000),
            consumer: ConsumerConfig {
                session_timeout: Duration::from_millis(self.args.group_consumer_session_timeout_ms),
                heartbeat_interval: Duration::from_millis(
                    self.args.group_consumer_heartbeat_interval_ms,
                ),
                max_size: self.args.group_consumer_max_size,
                ..ConsumerConfig::default()
            },
            topics: Topics(Arc::new(BrokerTopics {
                topics: self.topics.clone(),
                regexes: Default::default(),
            })),
        };
        GroupCoordinator::start(
            spec,
            self.leader_fs.clone(),
            self.shared.lease.clock().clone(),
            &self.arbiters[i],
        )
    }

    /// Replace the metadata cache with `a`.
    fn publish(&self, a: &Arc<Assignment>) {
        *self.topics.write().unwrap() = a
            .topics
            .iter()
            // A topic being deleted is served as unknown (Kafka's answer).
            .filter(|(_, t)| !t.deleting)
            .map(|(name, t)| {
                let stamp = TopicStamp {
                    topic_id: t.topic_id,
                    name: name.clone(),
                    partitions: t.partitions.len() as i32,
                    configs: t.configs.clone(),
                    adopted: false,
                };
                (name.clone(), stamp)
            })
            .collect();
        *self.meta.write().unwrap() = a.clone();
    }

    /// How many partitions this broker leads.
    pub fn leading(&self) -> usize {
        self.leaders.len()
    }

    /// The leader of (topic, partition) running here, if any (any state:
    /// opening, serving or fenced), for the dashboard's per-partition view.
    pub fn local_leader(&self, topic: &str, partition: i32) -> Option<PartitionHandle> {
        self.leaders
            .get(&(topic.to_owned(), partition))
            .map(|(_, h)| h)
    }

    fn start_leader(
        &self,
        topic: &str,
        partition: i32,
        epoch: i32,
        inc: u64,
    ) -> Option<PartitionHandle> {
        let t = self.topic(topic)?;
        let i = self.next_arbiter.fetch_add(1, Ordering::Relaxed) % self.arbiters.len();
        let spec = LeaderSpec {
            topic: topic.to_owned(),
            partition,
            dir: kaas_volume::layout::partition_dir(&self.args.data_dir, topic, partition),
            epoch,
            cfg: self.log_config(&t),
            retention_check: Duration::from_millis(self.args.retention_check_interval_ms.max(10)),
            lease: Some((self.shared.lease.clone(), inc)),
            owner: Some(ClaimOwner {
                broker_id: self.shared.broker_id,
                incarnation: inc,
            }),
            binding: self.binding.clone(),
            park_max: kaas_actors::partition::leader::PARK_MAX,
            on_fenced: Some({
                let shared = self.shared.clone();
                let topic = topic.to_owned();
                OnFenced(Arc::new(move |found, owner| {
                    let mut st = shared.state.lock().unwrap();
                    let e = FencedAt {
                        topic: topic.clone(),
                        partition,
                        found,
                        owner,
                    };
                    if !st.fenced.contains(&e) {
                        st.fenced.push(e);
                    }
                }))
            }),
        };
        Some(PartitionLeader::start(
            spec,
            self.leader_fs.clone(),
            &self.arbiters[i],
        ))
    }

    /// Topic configs are altered live: every leader this broker runs of a
    /// topic (same incarnation) whose configs differ between the assignment
    /// applied before (`before`) and the new one (`a`) gets its new storage
    /// settings. Leaders started by this version already read them.
    fn apply_config_changes(&self, before: &Assignment, a: &Assignment) {
        for (name, t) in &a.topics {
            let changed = before
                .topics
                .get(name)
                .is_some_and(|o| o.topic_id == t.topic_id && o.configs != t.configs);
            if !changed {
                continue;
            }
            let Some(stamp) = self.topic(name) else {
                continue;
            };
            let cfg = self.log_config(&stamp);
            for p in 0..t.partitions.len() as i32 {
                if let Some(((id, _), h)) = self.leaders.get(&(name.clone(), p)) {
                    if id == t.topic_id {
                        h.addr.do_send(SetLogConfig { cfg: cfg.clone() });
                    }
                }
            }
        }
    }

    /// Stop the leaders of `topic` (before deletion) or of every topic (and
    /// then every group coordinator: shutdown).
    pub async fn stop_leaders(&self, topic: Option<&str>) {
        self.leaders.stop_group(topic).await;
        if topic.is_none() {
            self.coordinators.stop_group(None).await;
            self.txn_coordinators.stop_group(None).await;
        }
    }
}

/// The watcher's view of the broker.
pub struct BrokerSink(pub Arc<Broker>);

impl LeaderSink for BrokerSink {
    fn apply(&self, a: Arc<Assignment>, inc: u64, lead: bool) -> LocalBoxFuture<'static, ()> {
        let b = self.0.clone();
        Box::pin(async move {
            let me = b.args.broker_id;
            let before = b.assignment();
            if lead {
                b.publish(&a);
            }
            let mut wanted: HashMap<(String, i32), (uuid::Uuid, i32)> = HashMap::new();
            if lead {
                for (name, t) in &a.topics {
                    for (p, e) in t.partitions.iter().enumerate() {
                        if e.leader == me && e.incarnation == inc {
                            wanted.insert((name.clone(), p as i32), (t.topic_id, e.epoch));
                        }
                    }
                }
            }
            let mut shards: HashMap<ShardId, i32> = HashMap::new();
            if lead {
                for (s, e) in a.coordinators.iter().enumerate() {
                    if e.leader == me && e.incarnation == inc {
                        shards.insert(ShardId(s as u32), e.epoch);
                    }
                }
            }
            // Stop what we lost first, awaiting the final fsync and close: a
            // partition (or shard) whose epoch changed is stopped before the
            // owner of the new epoch opens its files.
            let stopped = b.leaders.stop_lost(&wanted).await
                + b.coordinators.stop_lost(&shards).await
                + b.txn_coordinators.stop_lost(&shards).await;
            // Fenced-at-open reports are answered once the grant is above
            // the epoch found (or gone).
            if lead {
                b.shared.state.lock().unwrap().fenced.retain(|f| {
                    let entry = if f.topic == COORDINATOR_SHARDS {
                        a.coordinator(f.partition as u32)
                    } else {
                        a.entry(&f.topic, f.partition)
                    };
                    entry.is_some_and(|e| {
                        e.leader == me && e.incarnation == inc && e.epoch <= f.found
                    })
                });
            }
            // A broker shutting down starts nothing: what it still holds is
            // being handed off or stopped. (A periodic re-apply after
            // `stop_leaders` restarted every partition of a lone broker
            // during its shutdown; their closes after the lease was revoked
            // logged ERROR "lease lapsed".)
            let started = if b.shared.state.lock().unwrap().shutting_down {
                0
            } else {
                b.leaders.start_granted(wanted, |(t, p), (_, epoch)| {
                    b.start_leader(t, *p, *epoch, inc)
                }) + b.coordinators.start_granted(shards.clone(), |s, epoch| {
                    Some(b.start_coordinator(*s, *epoch, inc))
                }) + b.txn_coordinators.start_granted(shards, |s, epoch| {
                    Some(b.start_txn_coordinator(*s, *epoch, inc))
                })
            };
            if lead {
                b.apply_config_changes(&before, &a);
            }
            if stopped + started > 0 {
                tracing::info!(
                    version = a.version,
                    controller_epoch = a.controller_epoch,
                    started,
                    stopped,
                    leading = b.leading(),
                    "applied assignment"
                );
            }
        })
    }
}

/// The broker's topics as a consumer-protocol coordinator reads them: the
/// newest assignment's view, so a CreatePartitions or a new topic reaches
/// the server-side assignors at the members' next heartbeats.
struct BrokerTopics {
    topics: TopicsView,
    /// Compiled subscription regexes (`None`: invalid), so a heartbeat does
    /// not compile one; cleared when it grows past a bound.
    regexes: std::sync::Mutex<HashMap<String, Option<regex::Regex>>>,
}

/// Distinct subscription regexes kept compiled.
const REGEX_CACHE: usize = 1024;

impl TopicSource for BrokerTopics {
    fn topic(&self, name: &str) -> Option<TopicMeta> {
        self.topics.read().ok()?.get(name).map(|t| TopicMeta {
            id: t.topic_id,
            partitions: t.partitions,
        })
    }

    /// Kafka matches a subscription regex against the whole name (Java's
    /// `Pattern.matches`), so the pattern is anchored at both ends.
    fn matching(&self, regex: &str) -> Option<Vec<String>> {
        let re = {
            let mut cache = self.regexes.lock().ok()?;
            if cache.len() >= REGEX_CACHE {
                cache.clear();
            }
            cache
                .entry(regex.to_owned())
                .or_insert_with(|| regex::Regex::new(&format!("^(?:{regex})$")).ok())
                .clone()?
        };
        let topics = self.topics.read().ok()?;
        Some(topics.keys().filter(|n| re.is_match(n)).cloned().collect())
    }

    fn name_of(&self, id: &uuid::Uuid) -> Option<String> {
        let topics = self.topics.read().ok()?;
        topics
            .values()
            .find(|t| &t.topic_id == id)
            .map(|t| t.name.clone())
    }
}

#[cfg(test)]
mod broker_topics_tests {
    use super::*;

    fn stamp(name: &str, n: i32) -> (String, TopicStamp) {
        (
            name.to_owned(),
            TopicStamp {
                topic_id: uuid::Uuid::new_v4(),
                name: name.to_owned(),
                partitions: n,
                configs: Default::default(),
                adopted: false,
            },
        )
    }

    #[test]
    fn subscription_regexes_match_whole_names_and_bad_ones_match_nothing() {
        let view: TopicsView = Arc::new(RwLock::new(
            [
                stamp("orders", 3),
                stamp("orders-eu", 2),
                stamp("my-orders", 1),
            ]
            .into_iter()
            .collect(),
        ));
        let t = BrokerTopics {
            topics: view,
            regexes: Default::default(),
        };
        let mut m = t.matching("orders.*").unwrap();
        m.sort();
        assert_eq!(m, vec!["orders", "orders-eu"], "anchored at the start");
        assert_eq!(t.matching("^orders$").unwrap(), vec!["orders"]);
        assert_eq!(
            t.matching("order").unwrap(),
            Vec::<String>::new(),
            "whole name"
        );
        assert_eq!(t.matching("(").map(|_| ()), None, "invalid");
        let o = t.topic("orders").unwrap();
        assert_eq!(o.partitions, 3);
        assert_eq!(t.name_of(&o.id).as_deref(), Some("orders"));
    }
}
