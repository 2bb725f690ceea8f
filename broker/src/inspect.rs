//! `kaas inspect <data-dir>`: the cluster's picture from the files alone,
//! for a stopped or broken cluster — the assignment, the brokers' records
//! and last heartbeats, the controller epochs, per partition its manifests,
//! segment files, sealed lengths and leader-epoch claims with their owners,
//! the producer-id blocks and the coordinator shards' files. `--json` for
//! machines; `segment <file>` dumps one segment's batches like Kafka's
//! `kafka-dump-log` (offsets, epochs, timestamps, CRC check).
//!
//! It only reads: every access goes through the read-only view
//! ([`ReadFs`]) or a plain metadata call, names are parsed by
//! `kaas_volume::layout` (never re-spelled here), and documents by the
//! types that write them (`Manifest`, `BrokerRecord`, `Assignment`,
//! `ControllerEpoch`, the claim reader). The dashboard's `/api/cluster`
//! reads brokers and controller epochs through the same functions.

use kaas_actors::cluster::election::ControllerEpoch;
use kaas_actors::cluster::records::{Assignment, BrokerRecord};
use kaas_actors::partition::claim::{owner_of, ClaimOwner};
use kaas_actors::partition::manifest::Manifest;
use kaas_protocol::batch::{read_batch_header, BATCH_HEADER_LEN};
use kaas_volume::fs::{ReadFs, ReadOnly, RealFs, SharedFs};
use kaas_volume::layout;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `kaas inspect` arguments.
#[derive(clap::Args, Debug, Clone)]
#[command(args_conflicts_with_subcommands = false)]
pub struct InspectArgs {
    /// The data directory (the shared volume's mount).
    pub data_dir: PathBuf,
    /// Cluster directory (default `<data-dir>/__cluster`, or
    /// `$KAAS_CLUSTER_DIR`).
    #[arg(long, env = "KAAS_CLUSTER_DIR")]
    pub cluster_dir: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Only this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// A sub-view.
    #[command(subcommand)]
    pub view: Option<InspectView>,
}

/// Sub-views of `kaas inspect`.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum InspectView {
    /// Dump the batches of one segment file (offsets, epochs, timestamps,
    /// CRC check), like `kafka-dump-log`.
    Segment {
        /// The `.log` file.
        file: PathBuf,
        /// Stop after this many batches.
        #[arg(long, default_value_t = 100_000)]
        max_batches: u64,
    },
}

/// Everything `inspect` found.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Data directory.
    pub data_dir: PathBuf,
    /// Cluster directory.
    pub cluster_dir: PathBuf,
    /// The cluster id, if written.
    pub cluster_id: Option<String>,
    /// The cluster the data directory's stamp (`.cluster-id.json`) names,
    /// if stamped: the one cluster that may write it.
    pub data_cluster_id: Option<String>,
    /// The assignment file.
    pub assignment: Option<Assignment>,
    /// Broker records.
    pub brokers: Vec<BrokerFile>,
    /// Controller epoch claims, ascending.
    pub controller_epochs: Vec<ControllerEpochFile>,
    /// Topics and their partitions.
    pub topics: Vec<TopicReport>,
    /// Producer-id blocks (content as written).
    pub producer_id_blocks: Vec<(i64, serde_json::Value)>,
    /// Coordinator shards: shard, files (name, length) and claims.
    pub coordinator_shards: Vec<ShardReport>,
    /// What could not be read, and why.
    pub problems: Vec<String>,
}

/// One `brokers/<id>.json`.
#[derive(Debug, Serialize)]
pub struct BrokerFile {
    /// Broker id (from the name).
    pub id: i32,
    /// The record, if it parsed.
    pub record: Option<BrokerRecord>,
    /// Seconds since the file was last rewritten (its last heartbeat), by
    /// this host's wall clock against the file's mtime.
    pub last_heartbeat_age_s: Option<f64>,
}

/// One `controller/epoch-<n>.json`.
#[derive(Debug, Serialize)]
pub struct ControllerEpochFile {
    /// Epoch (from the name).
    pub epoch: i32,
    /// Its claimant, if the file has one.
    pub claim: Option<ControllerEpoch>,
}

/// A topic directory.
#[derive(Debug, Serialize)]
pub struct TopicReport {
    /// Name.
    pub name: String,
    /// `.topic-id.json` as written.
    pub stamp: Option<serde_json::Value>,
    /// Partitions found.
    pub partitions: Vec<PartitionReport>,
}

/// A partition directory.
#[derive(Debug, Serialize)]
pub struct PartitionReport {
    /// Index.
    pub partition: i32,
    /// The assignment's entry: (leader, incarnation, epoch).
    pub assigned: Option<(i32, u64, i32)>,
    /// Manifests, ascending by epoch; the highest is the current one.
    pub manifests: Vec<(i32, Option<Manifest>)>,
    /// Leader-epoch claims, ascending: (epoch, owner; `None` if empty).
    pub claims: Vec<(i32, Option<ClaimOwner>)>,
    /// Segment files: (base, epoch, kind, length).
    pub segment_files: Vec<(i64, i32, String, u64)>,
    /// Other names in the directory.
    pub other_files: Vec<String>,
}

/// A coordinator shard directory.
#[derive(Debug, Serialize)]
pub struct ShardReport {
    /// Shard index.
    pub shard: u32,
    /// Log files: (base, epoch, length).
    pub logs: Vec<(u64, i32, u64)>,
    /// Claims: (epoch, owner).
    pub claims: Vec<(i32, Option<ClaimOwner>)>,
}

/// Run `kaas inspect`; the exit code.
pub fn run(args: &InspectArgs) -> anyhow::Result<i32> {
    let cluster = args
        .cluster_dir
        .clone()
        .unwrap_or_else(|| layout::default_cluster_dir(&args.data_dir));
    let shared: SharedFs = Arc::new(RealFs);
    let fs = shared.read_only();
    match &args.view {
        Some(InspectView::Segment { file, max_batches }) => {
            let dump = dump_segment(&fs, file, *max_batches)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&dump)?);
            } else {
                print!("{}", dump.to_text());
            }
            Ok(
                if dump.batches.iter().all(|b| b.crc_valid) && dump.stopped.is_none() {
                    0
                } else {
                    2
                },
            )
        }
        None => {
            if !fs.is_dir(&args.data_dir) {
                anyhow::bail!("{} is not a directory", args.data_dir.display());
            }
            let r = inspect(&fs, &args.data_dir, &cluster, args.topic.as_deref());
            if args.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", r.to_text());
            }
            Ok(0)
        }
    }
}

fn json_file<T: serde::de::DeserializeOwned>(
    fs: &ReadFs,
    path: &Path,
    problems: &mut Vec<String>,
) -> Option<T> {
    match fs.read(path) {
        Ok(b) if b.is_empty() => None,
        Ok(b) => match serde_json::from_slice(&b) {
            Ok(v) => Some(v),
            Err(e) => {
                problems.push(format!("{}: {e}", path.display()));
                None
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            problems.push(format!("{}: {e}", path.display()));
            None
        }
    }
}

fn sorted_list(fs: &ReadFs, dir: &Path) -> Vec<String> {
    let mut v = fs.list(dir).unwrap_or_default();
    v.sort();
    v
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The broker records in `<cluster>/brokers`, by id.
pub fn read_brokers(fs: &ReadFs, cluster: &Path, problems: &mut Vec<String>) -> Vec<BrokerFile> {
    let dir = cluster.join(layout::BROKERS_DIR);
    let mut ids: Vec<i32> = sorted_list(fs, &dir)
        .iter()
        .filter_map(|n| layout::parse_broker_record(n))
        .collect();
    ids.sort_unstable();
    ids.into_iter()
        .map(|id| {
            let path = layout::broker_record_path(cluster, id);
            let age = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
                .map(|d| d.as_secs_f64());
            BrokerFile {
                id,
                record: json_file(fs, &path, problems),
                last_heartbeat_age_s: age,
            }
        })
        .collect()
}

/// Every controller epoch claim: the listing, then exact-name probes above
/// its highest entry (a stale listing may miss the newest).
pub fn read_controller_epochs(
    fs: &ReadFs,
    cluster: &Path,
    problems: &mut Vec<String>,
) -> Vec<ControllerEpochFile> {
    let dir = cluster.join(layout::CONTROLLER_DIR);
    let mut epochs: Vec<i32> = sorted_list(fs, &dir)
        .iter()
        .filter_map(|n| layout::parse_controller_epoch(n))
        .collect();
    epochs.sort_unstable();
    let mut next = epochs.last().copied().unwrap_or(0);
    while next < i32::MAX
        && fs
            .exists(&dir.join(layout::controller_epoch(next + 1)))
            .unwrap_or(false)
    {
        next += 1;
        epochs.push(next);
    }
    epochs
        .into_iter()
        .map(|epoch| ControllerEpochFile {
            epoch,
            claim: json_file(fs, &dir.join(layout::controller_epoch(epoch)), problems),
        })
        .collect()
}

fn claims_in(dir: &Path, names: &[String]) -> Vec<(i32, Option<ClaimOwner>)> {
    let mut epochs: Vec<i32> = names
        .iter()
        .filter_map(|n| layout::parse_leader_claim(n))
        .collect();
    epochs.sort_unstable();
    epochs
        .into_iter()
        .map(|e| (e, owner_of(&RealFs, dir, e).ok().flatten().flatten()))
        .collect()
}

/// Read the whole picture (never writes).
pub fn inspect(fs: &ReadFs, data: &Path, cluster: &Path, only_topic: Option<&str>) -> Report {
    let mut problems = Vec::new();
    let cluster_id = fs
        .read(&cluster.join(layout::CLUSTER_ID))
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned());
    let data_cluster_id = fs
        .read(&data.join(layout::DATA_STAMP))
        .ok()
        .and_then(|b| serde_json::from_slice::<kaas_volume::binding::DataStamp>(&b).ok())
        .map(|s| s.cluster_id);
    if let (Some(d), Some(c)) = (&data_cluster_id, &cluster_id) {
        if d != c {
            problems.push(format!(
                "the data directory belongs to cluster {d}, but this cluster directory is cluster {c}: brokers refuse to start on this pair"
            ));
        }
    }
    // The checkpoint folded forward through the history (a torn newest
    // version is reported, not applied).
    let assignment: Option<Assignment> = match kaas_actors::cluster::history::read_current(
        fs, cluster,
    ) {
        Ok(c) => {
            if let Some(v) = c.torn {
                problems.push(format!(
                        "assignment version {v} is torn (being written, or its writer died; the controller completes it)"
                    ));
            }
            (c.assignment.version > 0 || c.assignment.controller_epoch > 0).then_some(c.assignment)
        }
        Err(e) => {
            problems.push(format!("assignment: {e}"));
            None
        }
    };
    let brokers = read_brokers(fs, cluster, &mut problems);
    let controller_epochs = read_controller_epochs(fs, cluster, &mut problems);
    let mut topics = Vec::new();
    for name in sorted_list(fs, data) {
        let tdir = data.join(&name);
        if tdir == cluster
            || name.starts_with('.')
            || layout::is_reserved_topic_name(&name)
            || !fs.is_dir(&tdir)
            || only_topic.is_some_and(|t| t != name)
        {
            continue;
        }
        let stamp = json_file(
            fs,
            &data.join(&name).join(layout::TOPIC_STAMP),
            &mut problems,
        );
        let mut parts: Vec<i32> = sorted_list(fs, &tdir)
            .iter()
            .filter_map(|n| layout::parse_partition(n))
            .collect();
        parts.sort_unstable();
        let partitions = parts
            .into_iter()
            .map(|p| {
                let dir = layout::partition_dir(data, &name, p);
                let names = sorted_list(fs, &dir);
                let mut manifests = Vec::new();
                let mut segment_files = Vec::new();
                let mut other_files = Vec::new();
                for n in &names {
                    if let Some(e) = layout::parse_manifest(n) {
                        manifests.push((e, json_file(fs, &dir.join(n), &mut problems)));
                    } else if let Some((base, epoch, ext)) = layout::parse_segment_any(n) {
                        segment_files.push((base, epoch, ext.to_owned(), file_len(&dir.join(n))));
                    } else if layout::parse_leader_claim(n).is_none() {
                        other_files.push(n.clone());
                    }
                }
                manifests.sort_by_key(|(e, _)| *e);
                segment_files.sort_by(|a, b| (a.0, a.1, &a.2).cmp(&(b.0, b.1, &b.2)));
                PartitionReport {
                    partition: p,
                    assigned: assignment
                        .as_ref()
                        .and_then(|a| a.entry(&name, p))
                        .map(|e| (e.leader, e.incarnation, e.epoch)),
                    manifests,
                    claims: claims_in(&dir, &names),
                    segment_files,
                    other_files,
                }
            })
            .collect();
        topics.push(TopicReport {
            name,
            stamp,
            partitions,
        });
    }
    let pid_dir = cluster.join(layout::PRODUCER_IDS_DIR);
    let mut producer_id_blocks: Vec<(i64, serde_json::Value)> = sorted_list(fs, &pid_dir)
        .iter()
        .filter_map(|n| layout::parse_producer_id_block(n).map(|b| (b, n)))
        .map(|(b, n)| {
            let v =
                json_file(fs, &pid_dir.join(n), &mut problems).unwrap_or(serde_json::Value::Null);
            (b, v)
        })
        .collect();
    producer_id_blocks.sort_by_key(|(b, _)| *b);
    let groups = cluster.join(layout::GROUPS_DIR);
    let mut shards: Vec<u32> = sorted_list(fs, &groups)
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    shards.sort_unstable();
    let coordinator_shards = shards
        .into_iter()
        .map(|s| {
            let dir = layout::shard_dir(cluster, s);
            let names = sorted_list(fs, &dir);
            let mut logs: Vec<(u64, i32, u64)> = names
                .iter()
                .filter_map(|n| {
                    layout::parse_shard_log(n).map(|(b, e)| (b, e, file_len(&dir.join(n))))
                })
                .collect();
            logs.sort_unstable();
            ShardReport {
                shard: s,
                logs,
                claims: claims_in(&dir, &names),
            }
        })
        .collect();
    Report {
        data_dir: data.to_owned(),
        cluster_dir: cluster.to_owned(),
        cluster_id,
        data_cluster_id,
        assignment,
        brokers,
        controller_epochs,
        topics,
        producer_id_blocks,
        coordinator_shards,
        problems,
    }
}

fn owner_text(o: &Option<ClaimOwner>) -> String {
    match o {
        Some(o) => format!("broker {} incarnation {}", o.broker_id, o.incarnation),
        None => "(empty: no owner)".into(),
    }
}

impl Report {
    /// The human-readable form.
    pub fn to_text(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "data dir     {}", self.data_dir.display());
        let _ = writeln!(o, "cluster dir  {}", self.cluster_dir.display());
        let _ = writeln!(
            o,
            "cluster id   {}",
            self.cluster_id.as_deref().unwrap_or("(none)")
        );
        let _ = writeln!(
            o,
            "data stamp   {}",
            self.data_cluster_id
                .as_deref()
                .unwrap_or("(none: not yet bound to a cluster)")
        );
        let _ = writeln!(o, "\n== controller epochs");
        for c in &self.controller_epochs {
            match &c.claim {
                Some(cl) => {
                    let _ = writeln!(
                        o,
                        "  epoch {:>4}  broker {} incarnation {}",
                        c.epoch, cl.broker_id, cl.incarnation
                    );
                }
                None => {
                    let _ = writeln!(o, "  epoch {:>4}  (empty claim)", c.epoch);
                }
            }
        }
        let _ = writeln!(o, "\n== brokers");
        for b in &self.brokers {
            let age = b
                .last_heartbeat_age_s
                .map_or("?".into(), |a| format!("{a:.1}s ago"));
            match &b.record {
                Some(r) => {
                    let _ = writeln!(
                        o,
                        "  broker {}  {}:{}  incarnation {}  seq {}  last heartbeat {age}  applied v{} (controller epoch {}){}{}{}",
                        b.id, r.host, r.port, r.incarnation, r.seq, r.applied_version, r.applied_controller_epoch,
                        if r.shutting_down { "  shutting-down" } else { "" },
                        if r.clean_exit { "  clean-exit" } else { "" },
                        r.controller_released.map_or(String::new(), |e| format!("  released controller epoch {e}")),
                    );
                    for f in &r.fenced {
                        let _ = writeln!(
                            o,
                            "      fenced at open: {}-{} found epoch {} ({})",
                            f.topic,
                            f.partition,
                            f.found,
                            owner_text(&f.owner)
                        );
                    }
                }
                None => {
                    let _ = writeln!(
                        o,
                        "  broker {}  (unreadable record)  last write {age}",
                        b.id
                    );
                }
            }
        }
        let _ = writeln!(o, "\n== assignment");
        match &self.assignment {
            Some(a) => {
                let _ = writeln!(
                    o,
                    "  version {}  written by controller {} (epoch {})",
                    a.version, a.controller_id, a.controller_epoch
                );
                let ids: Vec<String> = a
                    .brokers
                    .iter()
                    .map(|b| format!("{}@{}:{}", b.id, b.host, b.port))
                    .collect();
                let _ = writeln!(o, "  live brokers: {}", ids.join(", "));
                let applied: Vec<String> = self
                    .brokers
                    .iter()
                    .filter_map(|b| {
                        b.record
                            .as_ref()
                            .map(|r| format!("{}: v{}", b.id, r.applied_version))
                    })
                    .collect();
                let _ = writeln!(o, "  applied by:   {}", applied.join(", "));
                // Shards by leader, compactly: "leader 0: shards 0-24 (epochs 1..2)".
                let mut by: std::collections::BTreeMap<i32, Vec<(usize, i32)>> = Default::default();
                for (i, c) in a.coordinators.iter().enumerate() {
                    by.entry(c.leader).or_default().push((i, c.epoch));
                }
                for (leader, shards) in by {
                    let lo = shards.iter().map(|s| s.1).min().unwrap_or(0);
                    let hi = shards.iter().map(|s| s.1).max().unwrap_or(0);
                    let ids: Vec<String> = shards.iter().map(|s| s.0.to_string()).collect();
                    let _ = writeln!(
                        o,
                        "  coordinator shards led by {leader} (epochs {lo}..{hi}): {}",
                        ids.join(",")
                    );
                }
            }
            None => {
                let _ = writeln!(
                    o,
                    "  (no assignment: no assignment.json, no assignment/ history)"
                );
            }
        }
        let _ = writeln!(o, "\n== topics");
        for t in &self.topics {
            let id = t
                .stamp
                .as_ref()
                .and_then(|s| s.get("topic_id").cloned())
                .map_or("(unstamped)".into(), |v| v.to_string());
            let _ = writeln!(
                o,
                "topic {}  id {id}  partitions {}",
                t.name,
                t.partitions.len()
            );
            for p in &t.partitions {
                let assigned = p.assigned.map_or("unassigned".into(), |(l, inc, e)| {
                    format!("leader {l} (incarnation {inc}) epoch {e}")
                });
                let _ = writeln!(o, "  partition {}  {assigned}", p.partition);
                for (e, owner) in &p.claims {
                    let _ = writeln!(o, "    claim    epoch {e:>4}  {}", owner_text(owner));
                }
                for (e, m) in &p.manifests {
                    match m {
                        Some(m) => {
                            let _ = writeln!(
                                o,
                                "    manifest epoch {e:>4}  log start {}  epoch history {:?}",
                                m.log_start_offset, m.epoch_history
                            );
                            for s in &m.segments {
                                let _ = writeln!(
                                    o,
                                    "      segment base {:>10} epoch {:>4}  {}  size {:>10}  next offset {}",
                                    s.base,
                                    s.epoch,
                                    if s.sealed { "sealed" } else { "active" },
                                    s.size,
                                    s.next_offset
                                );
                            }
                        }
                        None => {
                            let _ = writeln!(o, "    manifest epoch {e:>4}  (unreadable)");
                        }
                    }
                }
                let newest = p.manifests.last().and_then(|(_, m)| m.as_ref());
                for (base, epoch, ext, len) in &p.segment_files {
                    // Bytes past a sealed length are a dead leader's unacknowledged tail.
                    let sealed = newest
                        .and_then(|m| {
                            m.segments
                                .iter()
                                .find(|s| s.base == *base && s.epoch == *epoch && s.sealed)
                        })
                        .filter(|_| ext == "log");
                    let note = match sealed {
                        Some(s) if *len > s.size => format!(
                            "  ({} bytes past the sealed length: not in the log)",
                            len - s.size
                        ),
                        Some(_) => "  (sealed)".into(),
                        None => String::new(),
                    };
                    let _ = writeln!(
                        o,
                        "    file     {}.{ext}  {len} bytes{note}",
                        layout::segment_stem(*base, *epoch)
                    );
                }
                for n in &p.other_files {
                    let _ = writeln!(o, "    other    {n}");
                }
            }
        }
        if !self.producer_id_blocks.is_empty() {
            let _ = writeln!(o, "\n== producer-id blocks");
            for (b, v) in &self.producer_id_blocks {
                let _ = writeln!(o, "  block {b}  {v}");
            }
        }
        if !self.coordinator_shards.is_empty() {
            let _ = writeln!(o, "\n== coordinator shards");
            for s in &self.coordinator_shards {
                let logs: Vec<String> = s
                    .logs
                    .iter()
                    .map(|(b, e, l)| format!("{b}-e{e} ({l} bytes)"))
                    .collect();
                let claims: Vec<String> = s
                    .claims
                    .iter()
                    .map(|(e, ow)| format!("e{e}: {}", owner_text(ow)))
                    .collect();
                let _ = writeln!(
                    o,
                    "  shard {}  logs [{}]  claims [{}]",
                    s.shard,
                    logs.join(", "),
                    claims.join("; ")
                );
            }
        }
        if !self.problems.is_empty() {
            let _ = writeln!(o, "\n== problems");
            for p in &self.problems {
                let _ = writeln!(o, "  {p}");
            }
        }
        o
    }
}

/// One batch of a segment dump.
#[derive(Debug, Serialize)]
pub struct DumpedBatch {
    /// Byte position in the file.
    pub position: u64,
    /// First offset.
    pub base_offset: i64,
    /// Last offset.
    pub last_offset: i64,
    /// Leader epoch stamped in the batch.
    pub leader_epoch: i32,
    /// Records.
    pub count: i32,
    /// Bytes, with the log overhead.
    pub size: usize,
    /// First timestamp.
    pub base_timestamp: i64,
    /// Largest timestamp.
    pub max_timestamp: i64,
    /// Producer id (-1: none).
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// First sequence.
    pub base_sequence: i32,
    /// Codec id (attributes & 7).
    pub compression: i16,
    /// Transactional / control flags.
    pub transactional: bool,
    /// Control batch.
    pub control: bool,
    /// Stored CRC.
    pub crc: u32,
    /// Whether the CRC32C matches.
    pub crc_valid: bool,
}

/// A segment dump.
#[derive(Debug, Serialize)]
pub struct SegmentDump {
    /// The file.
    pub file: PathBuf,
    /// Its length.
    pub length: u64,
    /// (base, epoch) from its name, if it is a segment name.
    pub name: Option<(i64, i32)>,
    /// Batches in file order.
    pub batches: Vec<DumpedBatch>,
    /// Why the walk stopped before the end of the file.
    pub stopped: Option<String>,
}

/// Walk the batches of one `.log` file (read-only).
pub fn dump_segment(fs: &ReadFs, path: &Path, max_batches: u64) -> anyhow::Result<SegmentDump> {
    let f = fs.open_read(path)?;
    let length = f.len()?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(layout::parse_segment)
        .map(|(b, e, _)| (b, e));
    let mut batches = Vec::new();
    let mut pos = 0u64;
    let mut stopped = None;
    let mut hdr = [0u8; BATCH_HEADER_LEN];
    while pos < length && (batches.len() as u64) < max_batches {
        if pos + BATCH_HEADER_LEN as u64 > length {
            stopped = Some(format!(
                "torn header at {pos} ({} bytes left)",
                length - pos
            ));
            break;
        }
        f.read_exact_at(&mut hdr, pos)?;
        let Some(h) = read_batch_header(&hdr) else {
            stopped = Some(format!("invalid header at {pos}"));
            break;
        };
        if pos + h.batch_len as u64 > length {
            stopped = Some(format!(
                "torn batch at {pos}: {} bytes declared, {} left",
                h.batch_len,
                length - pos
            ));
            break;
        }
        let mut body = vec![0u8; h.batch_len];
        f.read_exact_at(&mut body, pos)?;
        batches.push(DumpedBatch {
            position: pos,
            base_offset: h.base_offset,
            last_offset: h.last_offset(),
            leader_epoch: h.leader_epoch,
            count: h.records_count,
            size: h.batch_len,
            base_timestamp: h.base_timestamp,
            max_timestamp: h.max_timestamp,
            producer_id: h.producer_id,
            producer_epoch: h.producer_epoch,
            base_sequence: h.base_sequence,
            compression: h.attributes & 7,
            transactional: h.is_transactional(),
            control: h.is_control(),
            crc: h.crc,
            crc_valid: h.verify_crc(&body),
        });
        pos += h.batch_len as u64;
    }
    Ok(SegmentDump {
        file: path.to_owned(),
        length,
        name,
        batches,
        stopped,
    })
}

impl SegmentDump {
    /// The `kafka-dump-log`-like text.
    pub fn to_text(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "Dumping {}", self.file.display());
        if let Some((b, e)) = self.name {
            let _ = writeln!(
                o,
                "Segment base offset {b}, leader epoch {e}, {} bytes",
                self.length
            );
        }
        for b in &self.batches {
            let _ = writeln!(
                o,
                "baseOffset: {} lastOffset: {} count: {} baseSequence: {} producerId: {} producerEpoch: {} partitionLeaderEpoch: {} isTransactional: {} isControl: {} position: {} CreateTime: {} maxTimestamp: {} size: {} magic: 2 compresscodec: {} crc: {} isvalid: {}",
                b.base_offset, b.last_offset, b.count, b.base_sequence, b.producer_id, b.producer_epoch,
                b.leader_epoch, b.transactional, b.control, b.position, b.base_timestamp, b.max_timestamp,
                b.size, b.compression, b.crc, b.crc_valid
            );
        }
        if let Some(s) = &self.stopped {
            let _ = writeln!(o, "stopped: {s}");
        }
        o
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build fixtures with std::fs
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_yields_an_empty_report_without_writing() {
        let d = tempfile::tempdir().unwrap();
        let fs = (Arc::new(RealFs) as SharedFs).read_only();
        let r = inspect(&fs, d.path(), &d.path().join("__cluster"), None);
        assert!(r.topics.is_empty() && r.brokers.is_empty() && r.assignment.is_none());
        // Nothing was created (not even the cluster directory).
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }

    /// Catches: an on-call engineer not being told which cluster owns a
    /// volume, or that the cluster directory they point at is another's.
    #[test]
    fn the_data_stamp_is_shown_and_a_mismatch_is_a_problem() {
        let d = tempfile::tempdir().unwrap();
        let (data, cp) = (d.path().join("data"), d.path().join("cp"));
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&cp).unwrap();
        std::fs::write(data.join(layout::DATA_STAMP), br#"{"cluster_id":"aaa"}"#).unwrap();
        std::fs::write(cp.join(layout::CLUSTER_ID), "bbb").unwrap();
        let fs = (Arc::new(RealFs) as SharedFs).read_only();
        let r = inspect(&fs, &data, &cp, None);
        assert_eq!(r.data_cluster_id.as_deref(), Some("aaa"));
        assert!(r.to_text().contains("data stamp   aaa"), "{}", r.to_text());
        assert!(
            r.problems
                .iter()
                .any(|p| p.contains("belongs to cluster aaa")),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn a_torn_or_corrupt_segment_is_reported_not_trusted() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(layout::segment_log(0, 1));
        // Garbage shorter than a header.
        std::fs::write(&p, [0u8; 20]).unwrap();
        let fs = (Arc::new(RealFs) as SharedFs).read_only();
        let dump = dump_segment(&fs, &p, 10).unwrap();
        assert!(dump.batches.is_empty());
        assert!(dump.stopped.unwrap().contains("torn header"));
    }
}
