//! The broker's shared context: configuration, the metadata cache fed by
//! the assignment, and the registry of partition leaders this broker runs.
//! Leaders are started and stopped only by the assignment watcher (through
//! [`LeaderSink`]); requests look them up and get NOT_LEADER for anything
//! this incarnation was not granted.

use crate::config::BrokerArgs;
use futures::future::LocalBoxFuture;
use kaas_actors::cluster::controller::ControllerActor;
use kaas_actors::cluster::membership::Shared;
use kaas_actors::cluster::records::{Assignment, FencedAt, PartitionAssignment};
use kaas_actors::cluster::watcher::LeaderSink;
use kaas_actors::partition::claim::ClaimOwner;
use kaas_actors::partition::leader::{LeaderSpec, OnFenced, PartitionHandle, PartitionLeader};
use kaas_actors::partition::log::LogConfig;
use kaas_actors::partition::messages::StopLeader;
use kaas_actors::producer_ids::ProducerIdAllocator;
use kaas_actors::topic::{TopicCatalog, TopicStamp, TopicsView};
use kaas_volume::fs::{ReadFs, ReadOnly, SharedFs};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// A partition this broker leads.
#[derive(Clone)]
pub struct Led {
    /// The leader actor.
    pub handle: PartitionHandle,
    /// Its leader epoch.
    pub epoch: i32,
    topic_id: uuid::Uuid,
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
    /// Topics of the newest assignment applied.
    pub topics: TopicsView,
    /// The topic catalog actor (creates and deletes topic directories).
    pub catalog: actix::Addr<TopicCatalog>,
    /// Producer ids, from persisted blocks.
    pub pids: Mutex<ProducerIdAllocator>,
    /// The newest assignment applied (metadata cache).
    meta: RwLock<Arc<Assignment>>,
    /// Leaders by (topic, partition), with the topic id and epoch they were
    /// granted: a re-created topic or a new grant never reuses a leader.
    leaders: Mutex<HashMap<(String, i32), Led>>,
    /// Topics being deleted: no leader may start for them meanwhile.
    deleting: Mutex<HashSet<String>>,
    arbiters: Vec<actix::ArbiterHandle>,
    next_arbiter: AtomicUsize,
    /// This broker's controller actor (elected or not).
    pub controller: std::sync::OnceLock<actix::Addr<ControllerActor>>,
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
    /// Assemble the context.
    pub fn new(
        args: BrokerArgs,
        fs: SharedFs,
        shared: Arc<Shared>,
        cluster_id: String,
        catalog: actix::Addr<TopicCatalog>,
        pids: ProducerIdAllocator,
        arbiters: Vec<actix::ArbiterHandle>,
    ) -> Self {
        Self {
            args,
            fs: fs.read_only(),
            leader_fs: fs,
            shared,
            cluster_id,
            topics: Arc::default(),
            catalog,
            pids: Mutex::new(pids),
            meta: RwLock::new(Arc::default()),
            leaders: Mutex::new(HashMap::new()),
            deleting: Mutex::new(Default::default()),
            arbiters,
            next_arbiter: AtomicUsize::new(0),
            controller: std::sync::OnceLock::new(),
        }
    }

    /// A topic's stamp, as the newest assignment knows it.
    pub fn topic(&self, name: &str) -> Option<TopicStamp> {
        self.topics.read().unwrap().get(name).cloned()
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

    /// Storage settings for a topic: its configs over the broker defaults.
    pub fn log_config(&self, t: &TopicStamp) -> LogConfig {
        let get = |k: &str| t.configs.get(k).and_then(|v| v.parse::<i64>().ok());
        LogConfig {
            segment_bytes: get("segment.bytes")
                .map(|v| v as u64)
                .unwrap_or(self.args.segment_bytes),
            segment_ms: get("segment.ms").unwrap_or(self.args.segment_ms),
            retention_ms: get("retention.ms").unwrap_or(self.args.retention_ms),
            retention_bytes: get("retention.bytes").unwrap_or(self.args.retention_bytes),
            ..LogConfig::default()
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
        if self.deleting.lock().unwrap().contains(topic) {
            return Err(LookupError::Unknown);
        }
        let lease = &self.shared.lease;
        if e.leader != self.args.broker_id
            || e.incarnation != lease.incarnation()
            || !lease.valid_for(e.incarnation)
        {
            return Err(LookupError::NotLeader);
        }
        match self
            .leaders
            .lock()
            .unwrap()
            .get(&(topic.to_owned(), partition))
        {
            Some(l) if l.epoch == e.epoch => Ok(l.clone()),
            _ => Err(LookupError::NotLeader),
        }
    }

    /// Replace the metadata cache with `a`.
    fn publish(&self, a: &Arc<Assignment>) {
        *self.topics.write().unwrap() = a
            .topics
            .iter()
            .map(|(name, t)| {
                let stamp = TopicStamp {
                    topic_id: t.topic_id,
                    name: name.clone(),
                    partitions: t.partitions.len() as i32,
                    configs: t.configs.clone(),
                };
                (name.clone(), stamp)
            })
            .collect();
        *self.meta.write().unwrap() = a.clone();
    }

    /// How many partitions this broker leads.
    pub fn leading(&self) -> usize {
        self.leaders.lock().unwrap().len()
    }

    fn start_leader(&self, topic: &str, partition: i32, epoch: i32, inc: u64) -> Option<Led> {
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
        let handle = PartitionLeader::start(spec, self.leader_fs.clone(), &self.arbiters[i]);
        Some(Led {
            handle,
            epoch,
            topic_id: t.topic_id,
        })
    }

    /// Mark `topic` as being deleted (no new leaders) or clear the mark.
    pub fn set_deleting(&self, topic: &str, on: bool) {
        let _leaders = self.leaders.lock().unwrap();
        let mut d = self.deleting.lock().unwrap();
        if on {
            d.insert(topic.to_owned());
        } else {
            d.remove(topic);
        }
    }

    /// Stop the leaders of `topic` (before deletion) or of every topic.
    pub async fn stop_leaders(&self, topic: Option<&str>) {
        let stopping: Vec<PartitionHandle> = {
            let mut leaders = self.leaders.lock().unwrap();
            let keys: Vec<_> = leaders
                .keys()
                .filter(|(t, _)| topic.is_none_or(|x| x == t))
                .cloned()
                .collect();
            keys.into_iter()
                .filter_map(|k| leaders.remove(&k).map(|l| l.handle))
                .collect()
        };
        stop_all(stopping).await;
    }
}

async fn stop_all(handles: Vec<PartitionHandle>) {
    let stops = handles.into_iter().map(|h| async move {
        let _ = h
            .addr
            .send(StopLeader {
                sent_at: Instant::now(),
            })
            .await;
    });
    futures::future::join_all(stops).await;
}

/// The watcher's view of the broker.
pub struct BrokerSink(pub Arc<Broker>);

impl LeaderSink for BrokerSink {
    fn apply(&self, a: Arc<Assignment>, inc: u64, lead: bool) -> LocalBoxFuture<'static, ()> {
        let b = self.0.clone();
        Box::pin(async move {
            let me = b.args.broker_id;
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
            // Stop what we lost first, awaiting the final fsync and close: a
            // partition whose epoch changed is stopped before the leader of
            // the new epoch opens its files.
            let stopping: Vec<PartitionHandle> = {
                let mut leaders = b.leaders.lock().unwrap();
                let lost: Vec<(String, i32)> = leaders
                    .iter()
                    .filter(|(k, l)| wanted.get(*k) != Some(&(l.topic_id, l.epoch)))
                    .map(|(k, _)| k.clone())
                    .collect();
                lost.into_iter()
                    .filter_map(|k| leaders.remove(&k).map(|l| l.handle))
                    .collect()
            };
            let stopped = stopping.len();
            stop_all(stopping).await;
            // Fenced-at-open reports are answered once the grant is above
            // the epoch found (or gone).
            if lead {
                b.shared.state.lock().unwrap().fenced.retain(|f| {
                    a.entry(&f.topic, f.partition).is_some_and(|e| {
                        e.leader == me && e.incarnation == inc && e.epoch <= f.found
                    })
                });
            }
            let mut started = 0;
            {
                let mut leaders = b.leaders.lock().unwrap();
                let deleting = b.deleting.lock().unwrap();
                for ((t, p), (_, epoch)) in wanted {
                    if leaders.contains_key(&(t.clone(), p)) || deleting.contains(&t) {
                        continue;
                    }
                    if let Some(l) = b.start_leader(&t, p, epoch, inc) {
                        leaders.insert((t, p), l);
                        started += 1;
                    }
                }
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
