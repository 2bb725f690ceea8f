//! Broker configuration: CLI flags, each also settable by environment.

use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;

/// `kaas broker` flags.
#[derive(Debug, Clone, Args)]
pub struct BrokerArgs {
    /// Data directory (partition logs). On Kubernetes, the shared RWX volume.
    #[arg(long, env = "KAAS_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
    /// Cluster-state directory (controller epochs, producer-id blocks...).
    /// Defaults to <data-dir>/__cluster; may be a separate volume.
    #[arg(long, env = "KAAS_CLUSTER_DIR")]
    pub cluster_dir: Option<PathBuf>,
    /// This broker's id (the StatefulSet ordinal on Kubernetes).
    #[arg(long, env = "KAAS_BROKER_ID", default_value_t = 0)]
    pub broker_id: i32,
    /// Kafka listener address.
    #[arg(long, env = "KAAS_LISTEN", default_value = "127.0.0.1:9092")]
    pub listen: SocketAddr,
    /// host:port clients are told to connect to (default: the listen address).
    #[arg(long, env = "KAAS_ADVERTISED_LISTENER")]
    pub advertised_listener: Option<String>,
    /// Prometheus /metrics and /actors (JSON) listener.
    #[arg(long, env = "KAAS_METRICS_LISTEN", default_value = "127.0.0.1:9644")]
    pub metrics_listen: SocketAddr,
    /// Create an unknown topic when a Metadata request names it (Kafka's
    /// auto.create.topics.enable); Produce never creates topics.
    #[arg(long, env = "KAAS_AUTO_CREATE_TOPICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub auto_create_topics: bool,
    /// Consumer-group coordinator shards (offsets.topic.num.partitions):
    /// recorded by the first broker of a cluster, then fixed for its life.
    #[arg(long, env = "KAAS_GROUP_SHARDS", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub group_shards: u32,
    /// group.initial.rebalance.delay.ms: how long a new group's first
    /// rebalance waits for more members.
    #[arg(
        long,
        env = "KAAS_GROUP_INITIAL_REBALANCE_DELAY_MS",
        default_value_t = 3000
    )]
    pub group_initial_rebalance_delay_ms: u64,
    /// group.min.session.timeout.ms: the shortest session timeout a classic
    /// JoinGroup may ask for (shorter: INVALID_SESSION_TIMEOUT).
    #[arg(
        long,
        env = "KAAS_GROUP_MIN_SESSION_TIMEOUT_MS",
        default_value_t = 6_000
    )]
    pub group_min_session_timeout_ms: u64,
    /// group.max.session.timeout.ms: the longest session timeout a classic
    /// JoinGroup may ask for (longer: INVALID_SESSION_TIMEOUT).
    #[arg(
        long,
        env = "KAAS_GROUP_MAX_SESSION_TIMEOUT_MS",
        default_value_t = 1_800_000
    )]
    pub group_max_session_timeout_ms: u64,
    /// offsets.retention.minutes.
    #[arg(long, env = "KAAS_OFFSETS_RETENTION_MINUTES", default_value_t = 10080)]
    pub offsets_retention_minutes: i64,
    /// group.consumer.session.timeout.ms (KIP-848 consumer protocol).
    #[arg(
        long,
        env = "KAAS_GROUP_CONSUMER_SESSION_TIMEOUT_MS",
        default_value_t = 45_000
    )]
    pub group_consumer_session_timeout_ms: u64,
    /// group.consumer.heartbeat.interval.ms (KIP-848 consumer protocol).
    #[arg(
        long,
        env = "KAAS_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS",
        default_value_t = 5_000
    )]
    pub group_consumer_heartbeat_interval_ms: u64,
    /// group.consumer.max.size: members of one consumer-protocol group
    /// (GROUP_MAX_SIZE_REACHED beyond).
    #[arg(long, env = "KAAS_GROUP_CONSUMER_MAX_SIZE", default_value_t = 1000)]
    pub group_consumer_max_size: usize,
    /// transactional.id.expiration.ms: a transactional id idle this long
    /// (no open transaction) is forgotten.
    #[arg(
        long,
        env = "KAAS_TRANSACTIONAL_ID_EXPIRATION_MS",
        default_value_t = 604_800_000
    )]
    pub transactional_id_expiration_ms: i64,
    /// transaction.partition.verification.enable (KIP-890 part 1): a
    /// partition leader asks the transaction coordinator whether the
    /// partition is in the producer's transaction before writing the
    /// transaction's first batch there. `false` only for tests that play
    /// the coordinator themselves (as Kafka's flag).
    #[arg(
        long,
        env = "KAAS_TRANSACTION_PARTITION_VERIFICATION_ENABLE",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub transaction_partition_verification_enable: bool,
    /// Partitions of auto-created topics (num.partitions).
    #[arg(long, env = "KAAS_DEFAULT_PARTITIONS", default_value_t = 1)]
    pub default_partitions: i32,
    /// Most partitions one CreateTopics request may create, over all its
    /// topics (refused with POLICY_VIOLATION). 10,000 is the bound Kafka's
    /// own controller puts on one user operation (MAX_RECORDS_PER_USER_OP).
    #[arg(
        long,
        env = "KAAS_MAX_PARTITIONS_PER_REQUEST",
        default_value_t = 10_000
    )]
    pub max_partitions_per_request: i64,
    /// Most partitions the whole cluster may hold (creates beyond it are
    /// refused with POLICY_VIOLATION). 20,000: one broker served 10,000
    /// partitions in the measurements of issue 13 and fell over near
    /// 20,000; raise it with the broker count.
    #[arg(long, env = "KAAS_MAX_PARTITIONS", default_value_t = 20_000)]
    pub max_partitions: i64,
    /// Most partitions per live broker: a create that would take the
    /// cluster past live brokers × this is refused with POLICY_VIOLATION
    /// (KIP-578's max.broker.partitions). Default: four per segment file the
    /// broker may hold open, within 1,000..10,000 (see fd_budget).
    #[arg(long, env = "KAAS_MAX_PARTITIONS_PER_BROKER", value_parser = clap::value_parser!(i64).range(1..))]
    pub max_partitions_per_broker: Option<i64>,
    /// Partition mutations (partitions created, added or deleted) this
    /// broker admits per second (KIP-599's controller_mutation_rate, with a
    /// burst of 11 seconds' worth); beyond it CreateTopics v6+,
    /// CreatePartitions v3+ and DeleteTopics v5+ answer
    /// THROTTLING_QUOTA_EXCEEDED with the throttle time, older versions are
    /// served and then throttled. 0: no quota.
    #[arg(long, env = "KAAS_CONTROLLER_MUTATION_RATE", default_value_t = 1_000.0)]
    pub controller_mutation_rate: f64,
    /// Most topics one Metadata request may auto-create; the others are
    /// answered LEADER_NOT_AVAILABLE (retriable) without being created.
    #[arg(long, env = "KAAS_MAX_AUTO_CREATE_PER_REQUEST", default_value_t = 100)]
    pub max_auto_create_per_request: usize,
    /// Topics this broker auto-creates per second at most (a token bucket,
    /// burst of one second's worth); beyond it topics are answered
    /// LEADER_NOT_AVAILABLE without being created.
    #[arg(long, env = "KAAS_AUTO_CREATE_PER_SEC", default_value_t = 50.0)]
    pub auto_create_per_sec: f64,
    /// Largest request frame accepted (socket.request.max.bytes).
    #[arg(long, env = "KAAS_MAX_REQUEST_BYTES", default_value_t = 104_857_600)]
    pub max_request_bytes: usize,
    /// Bytes one connection may hold in requests read but not yet
    /// answered and answers not yet written (each request counts its frame
    /// plus 1 KiB); at the limit the connection is not read until answers
    /// go out. One frame and one answer may exceed it.
    #[arg(long, env = "KAAS_CONN_INFLIGHT_BYTES", default_value_t = 32 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub conn_inflight_bytes: u64,
    /// The same bound over every connection of the broker (Kafka's
    /// queued.max.request.bytes), frames being read included: a frame is
    /// charged its whole size once its length arrives and read only when
    /// that fits (frames over 1 MiB: within seven eighths of it).
    #[arg(long, env = "KAAS_BROKER_INFLIGHT_BYTES", default_value_t = 256 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub broker_inflight_bytes: u64,
    /// Consumer lag in `/metrics`: at most this many groups (those with
    /// the largest lag) get per-topic series — the bound on the metrics'
    /// label cardinality.
    #[arg(long, env = "KAAS_LAG_METRICS_GROUPS", default_value_t = 100)]
    pub lag_metrics_groups: usize,
    /// Consumer lag in `/metrics`: at most this many per-partition series
    /// (largest lag first) over the exported groups.
    #[arg(long, env = "KAAS_LAG_METRICS_PARTITIONS", default_value_t = 1000)]
    pub lag_metrics_partitions: usize,
    /// Default max.message.bytes (Kafka's message.max.bytes): the largest
    /// record batch a produce may carry; larger ones get MESSAGE_TOO_LARGE.
    #[arg(long, env = "KAAS_MESSAGE_MAX_BYTES", default_value_t = 1_048_588)]
    pub message_max_bytes: i64,
    /// Connections beyond this are closed on accept.
    #[arg(long, env = "KAAS_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,
    /// Segment files open at once, at most (least recently used closed
    /// first; a file with unfsynced bytes is never closed). Default: a
    /// quarter of the descriptor limit, within 32..4096 (see fd_budget).
    #[arg(long, env = "KAAS_MAX_OPEN_SEGMENT_FILES")]
    pub max_open_segment_files: Option<usize>,
    /// A segment file unused this long is closed (an idle partition holds
    /// no descriptor); the next read or append reopens it.
    #[arg(long, env = "KAAS_SEGMENT_IDLE_CLOSE_MS", default_value_t = 30_000)]
    pub segment_idle_close_ms: u64,
    /// A frame started but not completed within this time closes the connection.
    #[arg(long, env = "KAAS_REQUEST_TIMEOUT_MS", default_value_t = 30_000)]
    pub request_timeout_ms: u64,
    /// Idle connections are closed after this (connections.max.idle.ms).
    #[arg(long, env = "KAAS_IDLE_TIMEOUT_MS", default_value_t = 600_000)]
    pub idle_timeout_ms: u64,
    /// Default segment.bytes.
    #[arg(long, env = "KAAS_SEGMENT_BYTES", default_value_t = 1 << 30)]
    pub segment_bytes: u64,
    /// Default segment.ms.
    #[arg(long, env = "KAAS_SEGMENT_MS", default_value_t = 604_800_000)]
    pub segment_ms: i64,
    /// Default retention.ms (-1: forever).
    #[arg(
        long,
        env = "KAAS_RETENTION_MS",
        default_value_t = 604_800_000,
        allow_hyphen_values = true
    )]
    pub retention_ms: i64,
    /// Default retention.bytes per partition (-1: unlimited).
    #[arg(long, env = "KAAS_RETENTION_BYTES", default_value_t = -1, allow_hyphen_values = true)]
    pub retention_bytes: i64,
    /// How often each partition checks retention.
    #[arg(
        long,
        env = "KAAS_RETENTION_CHECK_INTERVAL_MS",
        default_value_t = 300_000
    )]
    pub retention_check_interval_ms: u64,
    /// producer.id.expiration.ms: an idempotent producer a partition has not
    /// seen for this long is forgotten (its next batch is accepted at any
    /// sequence, as for a new producer). Expiry runs when the partition
    /// snapshots its producer state (at each roll and clean close).
    #[arg(
        long,
        env = "KAAS_PRODUCER_ID_EXPIRATION_MS",
        default_value_t = 86_400_000
    )]
    pub producer_id_expiration_ms: i64,
    /// Arbiters (threads) that run partition leaders; default: one per core.
    #[arg(long, env = "KAAS_PARTITION_THREADS")]
    pub partition_threads: Option<usize>,
    /// Heartbeat interval: each broker rewrites its liveness record this often.
    #[arg(long, env = "KAAS_HEARTBEAT_MS", default_value_t = 500)]
    pub heartbeat_ms: u64,
    /// Lease: a broker whose last timely heartbeat is older than this stops
    /// acknowledging writes and leading (it fences itself).
    #[arg(long, env = "KAAS_LEASE_MS", default_value_t = 3000)]
    pub lease_ms: u64,
    /// Grace added to the lease before another broker acts on a silent one
    /// (absorbs clock-rate differences and the poll interval).
    #[arg(long, env = "KAAS_LEASE_GRACE_MS", default_value_t = 1000)]
    pub lease_grace_ms: u64,
    /// How often the controller and the assignment watcher poll their files.
    #[arg(long, env = "KAAS_POLL_MS", default_value_t = 100)]
    pub poll_ms: u64,
    /// Moves for balance alone (to a broker that came back or joined)
    /// start only after the live brokers have been the same for this long;
    /// a failover is never delayed (Kafka: leader.imbalance.check.interval.seconds).
    #[arg(long, env = "KAAS_REBALANCE_DELAY_MS", default_value_t = 60_000)]
    pub rebalance_delay_ms: u64,
    /// Moves for balance alone start only when at least this percentage of
    /// the partitions (or of the coordinator shards) is out of its balanced
    /// place (Kafka: leader.imbalance.per.broker.percentage).
    #[arg(long, env = "KAAS_REBALANCE_THRESHOLD_PERCENT", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub rebalance_threshold_percent: u32,
    /// Partitions (and, separately, coordinator shards) moved for balance at
    /// once: each pauses for about a second, the next starts as one lands.
    #[arg(long, env = "KAAS_REBALANCE_MAX_MOVES", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub rebalance_max_moves: u64,
    /// On SIGTERM, how long to wait for the partitions to be handed off;
    /// the whole shutdown gives up 3 s after it (exit code 4).
    #[arg(long, env = "KAAS_SHUTDOWN_TIMEOUT_MS", default_value_t = 15_000)]
    pub shutdown_timeout_ms: u64,
    /// Produce is refused (KAFKA_STORAGE_ERROR) while the data volume has
    /// less than this many bytes free, so the cluster files on the same
    /// volume (heartbeats, assignment, group commits) can still be written.
    /// Applies only when the cluster directory is on the data volume's
    /// filesystem; 0 disables it.
    #[arg(long, env = "KAAS_DATA_RESERVE_BYTES", default_value_t = 64 << 20)]
    pub data_reserve_bytes: u64,
    /// Start even if the substrate check disqualifies the volume (logged loudly).
    #[arg(
        long,
        env = "KAAS_ALLOW_DISQUALIFIED_SUBSTRATE",
        default_value_t = false
    )]
    pub allow_disqualified_substrate: bool,
    /// Found a new cluster over a data directory that holds topics but no
    /// cluster stamp (`.cluster-id.json`), when the cluster directory holds
    /// no cluster either. Without it such a start is refused: those topics
    /// were written by a cluster whose state is elsewhere.
    #[arg(long, env = "KAAS_ADOPT_UNSTAMPED_DATA_DIR", default_value_t = false)]
    pub adopt_unstamped_data_dir: bool,
}

impl BrokerArgs {
    /// Timing of the cluster protocol, validated: the grace must exceed the
    /// poll interval and the lease must exceed a few heartbeats.
    pub fn timing(&self) -> anyhow::Result<kaas_actors::cluster::membership::Timing> {
        use std::time::Duration;
        let t = kaas_actors::cluster::membership::Timing {
            heartbeat: Duration::from_millis(self.heartbeat_ms.max(10)),
            lease: Duration::from_millis(self.lease_ms),
            grace: Duration::from_millis(self.lease_grace_ms),
            poll: Duration::from_millis(self.poll_ms.max(10)),
            rebalance: kaas_actors::cluster::membership::Rebalance {
                delay: Duration::from_millis(self.rebalance_delay_ms),
                max_moves: usize::try_from(self.rebalance_max_moves).unwrap_or(usize::MAX),
                min_percent: self.rebalance_threshold_percent,
            },
        };
        if t.lease < t.heartbeat * 2 {
            anyhow::bail!("--lease-ms must be at least twice --heartbeat-ms");
        }
        if t.grace <= t.poll {
            anyhow::bail!("--lease-grace-ms must exceed --poll-ms");
        }
        Ok(t)
    }

    /// Refuse a configuration clients could not use: a wildcard listen
    /// address (`0.0.0.0`, `[::]`) advertised as is would send every client
    /// to itself. Kafka refuses the same ("advertised.listeners cannot use
    /// the nonroutable meta-address").
    pub fn validate_listeners(&self) -> anyhow::Result<()> {
        if self.advertised_listener.is_none() && self.listen.ip().is_unspecified() {
            anyhow::bail!(
                "--listen {} is a wildcard address, which clients cannot connect to: \
                 set --advertised-listener host:port (KAAS_ADVERTISED_LISTENER) to the \
                 address clients should use",
                self.listen
            );
        }
        Ok(())
    }

    /// Refuse a classic-group session range no member could join: the
    /// minimum above the maximum (Kafka requires min <= max too).
    pub fn validate_groups(&self) -> anyhow::Result<()> {
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms {
            anyhow::bail!(
                "--group-min-session-timeout-ms ({}) must not exceed \
                 --group-max-session-timeout-ms ({})",
                self.group_min_session_timeout_ms,
                self.group_max_session_timeout_ms
            );
        }
        Ok(())
    }

    /// The classic groups' settings for each coordinator shard.
    pub fn group_config(&self) -> kaas_actors::group::classic::GroupConfig {
        use std::time::Duration;
        kaas_actors::group::classic::GroupConfig {
            min_session: Duration::from_millis(self.group_min_session_timeout_ms),
            max_session: Duration::from_millis(self.group_max_session_timeout_ms),
            initial_rebalance_delay: Duration::from_millis(self.group_initial_rebalance_delay_ms),
            ..Default::default()
        }
    }

    /// The two directories, for [`kaas_volume::binding`].
    pub fn binding_dirs<'a>(
        &'a self,
        cluster: &'a std::path::Path,
    ) -> kaas_volume::binding::Dirs<'a> {
        kaas_volume::binding::Dirs {
            data: &self.data_dir,
            cluster,
            adopt_unstamped: self.adopt_unstamped_data_dir,
        }
    }

    /// The cluster directory actually used.
    pub fn cluster_dir(&self) -> PathBuf {
        self.cluster_dir
            .clone()
            .unwrap_or_else(|| kaas_volume::layout::default_cluster_dir(&self.data_dir))
    }

    /// (host, port) advertised to clients.
    pub fn advertised(&self) -> (String, i32) {
        if let Some(a) = &self.advertised_listener {
            if let Some((h, p)) = a.rsplit_once(':') {
                if let Ok(p) = p.parse() {
                    return (h.to_owned(), p);
                }
            }
        }
        (self.listen.ip().to_string(), self.listen.port() as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BrokerArgs,
    }

    fn args(extra: &[&str]) -> BrokerArgs {
        let mut argv = vec!["kaas"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn transaction_verification_is_on_unless_turned_off() {
        assert!(args(&[]).transaction_partition_verification_enable);
        assert!(
            !args(&["--transaction-partition-verification-enable", "false"])
                .transaction_partition_verification_enable
        );
    }

    #[test]
    fn producer_id_expiration_defaults_to_a_day_like_kafka() {
        assert_eq!(args(&[]).producer_id_expiration_ms, 86_400_000);
        assert_eq!(
            args(&["--producer-id-expiration-ms", "60000"]).producer_id_expiration_ms,
            60_000
        );
    }

    #[test]
    fn group_session_timeouts_default_to_kafkas_and_are_flags() {
        let d = args(&[]).group_config();
        assert_eq!(d.min_session, std::time::Duration::from_millis(6_000));
        assert_eq!(d.max_session, std::time::Duration::from_millis(1_800_000));
        let a = args(&[
            "--group-min-session-timeout-ms",
            "1000",
            "--group-max-session-timeout-ms",
            "60000",
        ]);
        a.validate_groups().unwrap();
        let c = a.group_config();
        assert_eq!(c.min_session, std::time::Duration::from_millis(1_000));
        assert_eq!(c.max_session, std::time::Duration::from_millis(60_000));
        let e = args(&["--group-min-session-timeout-ms", "2000000"])
            .validate_groups()
            .unwrap_err();
        assert!(e.to_string().contains("must not exceed"), "{e}");
    }

    #[test]
    fn a_wildcard_listen_address_needs_an_advertised_listener() {
        for wild in ["0.0.0.0:9092", "[::]:9092"] {
            let e = args(&["--listen", wild]).validate_listeners().unwrap_err();
            assert!(e.to_string().contains("--advertised-listener"), "{e}");
            args(&[
                "--listen",
                wild,
                "--advertised-listener",
                "kaas-0.kaas:9092",
            ])
            .validate_listeners()
            .unwrap();
        }
        args(&["--listen", "127.0.0.1:9092"])
            .validate_listeners()
            .unwrap();
    }
}
