//! The broker's shared context: configuration, the topic catalog, and the
//! registry of partition leaders. Leaders start lazily on first use, so ten
//! thousand idle partitions cost a directory each and nothing in memory.

use crate::config::BrokerArgs;
use kaas_actors::fs::SharedFs;
use kaas_actors::partition::leader::{LeaderSpec, PartitionHandle, PartitionLeader};
use kaas_actors::partition::log::LogConfig;
use kaas_actors::partition::messages::StopLeader;
use kaas_actors::producer_ids::ProducerIdAllocator;
use kaas_actors::topic::{TopicCatalog, TopicStamp, TopicsView};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shared by every connection.
pub struct Broker {
    /// Flags.
    pub args: BrokerArgs,
    /// The volume.
    pub fs: SharedFs,
    /// Leader epoch this broker writes under (its controller epoch).
    pub epoch: i32,
    /// Cluster id reported in Metadata / DescribeCluster.
    pub cluster_id: String,
    /// Topics as last written by the catalog.
    pub topics: TopicsView,
    /// The topic catalog actor.
    pub catalog: actix::Addr<TopicCatalog>,
    /// Producer ids, from persisted blocks.
    pub pids: Mutex<ProducerIdAllocator>,
    /// Open leaders by (topic, partition), with the topic id they serve: a
    /// re-created topic of the same name never reuses an old leader.
    leaders: Mutex<HashMap<(String, i32), (uuid::Uuid, PartitionHandle)>>,
    /// Topics being deleted: no leader may start for them meanwhile.
    deleting: Mutex<std::collections::HashSet<String>>,
    arbiters: Vec<actix::ArbiterHandle>,
    next_arbiter: AtomicUsize,
}

/// Why a partition cannot be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupError {
    /// UNKNOWN_TOPIC_OR_PARTITION
    Unknown,
}

impl Broker {
    /// Assemble the context.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        args: BrokerArgs,
        fs: SharedFs,
        epoch: i32,
        cluster_id: String,
        topics: TopicsView,
        catalog: actix::Addr<TopicCatalog>,
        pids: ProducerIdAllocator,
        arbiters: Vec<actix::ArbiterHandle>,
    ) -> Self {
        Self {
            args,
            fs,
            epoch,
            cluster_id,
            topics,
            catalog,
            pids: Mutex::new(pids),
            leaders: Mutex::new(HashMap::new()),
            deleting: Mutex::new(Default::default()),
            arbiters,
            next_arbiter: AtomicUsize::new(0),
        }
    }

    /// A topic's stamp.
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

    /// The leader of (topic, partition), started on first use.
    pub fn partition(&self, topic: &str, partition: i32) -> Result<PartitionHandle, LookupError> {
        let t = self.topic(topic).ok_or(LookupError::Unknown)?;
        if partition < 0 || partition >= t.partitions {
            return Err(LookupError::Unknown);
        }
        let mut leaders = self.leaders.lock().unwrap();
        if self.deleting.lock().unwrap().contains(topic) {
            return Err(LookupError::Unknown);
        }
        if let Some((id, h)) = leaders.get(&(topic.to_owned(), partition)) {
            if *id == t.topic_id {
                return Ok(h.clone());
            }
        }
        let i = self.next_arbiter.fetch_add(1, Ordering::Relaxed) % self.arbiters.len();
        let spec = LeaderSpec {
            topic: topic.to_owned(),
            partition,
            dir: self.args.data_dir.join(topic).join(partition.to_string()),
            epoch: self.epoch,
            cfg: self.log_config(&t),
            retention_check: Duration::from_millis(self.args.retention_check_interval_ms.max(10)),
        };
        let h = PartitionLeader::start(spec, self.fs.clone(), &self.arbiters[i]);
        leaders.insert((topic.to_owned(), partition), (t.topic_id, h.clone()));
        Ok(h)
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
                .filter_map(|k| leaders.remove(&k).map(|(_, h)| h))
                .collect()
        };
        for h in stopping {
            let _ = h
                .addr
                .send(StopLeader {
                    sent_at: Instant::now(),
                })
                .await;
        }
    }
}
