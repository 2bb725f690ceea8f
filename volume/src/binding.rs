//! One volume, one cluster: `<data>/.cluster-id.json` names the one cluster
//! whose brokers may write the data directory.
//!
//! Leases fence brokers *within* a cluster. Nothing fenced a second cluster:
//! a broker started over the same data directory with another cluster
//! directory (a `--cluster-dir` left out, a chart upgrade that moved the
//! control plane, a copied StatefulSet, a fresh cluster over a copied data
//! directory) elected itself, granted every partition at its own epochs, and
//! the next leader change of either cluster opened from the other's
//! manifest — acknowledged records dropped without an error. The data
//! directory was addressed by its path, and nothing on it said whose it was:
//! the contract's "names are not identities" at the scale of the volume.
//!
//! The binding is a file made with the exclusive-create-with-identity
//! primitive ([`crate::identity`]) holding the cluster id of the cluster
//! directory (`<cluster>/cluster-id`, [`crate::cluster_id`]):
//!
//! * both name the same cluster ⇒ bound;
//! * both name clusters, different ones ⇒ refused ([`BindError::Mismatch`]);
//! * the data names a cluster, the cluster directory none ⇒ refused
//!   ([`BindError::ClusterDirEmpty`]): this broker would found a second
//!   cluster over another's data;
//! * the data names none (a volume from before stamps, or a fresh one) and
//!   the cluster directory names one ⇒ the data is stamped with it: the first
//!   cluster to start on an unstamped volume adopts it, and the exclusive
//!   create decides a race between two clusters (exactly one creates the
//!   file; the other reads the winner's id and is refused);
//! * neither names a cluster ⇒ the cluster id is created first (the cluster
//!   directory is the cluster), then the data is stamped with it. A data
//!   directory that already holds topics, unstamped, with a cluster directory
//!   that never held a cluster is refused ([`BindError::UnstampedData`]):
//!   those topics were written by a cluster whose state is elsewhere, and a
//!   new cluster over them is the bug this module exists for. The
//!   `adopt_unstamped` option (`--adopt-unstamped-data-dir`) says "yes, a
//!   new cluster over these topics" explicitly.
//!
//! [`preflight`] is the read-only half, run at start before anything is
//! written to either volume; [`bind`] re-observes and makes the writes
//! (cluster id, stamp) until the state is bound or refused. A refusal is
//! only reported once it is seen on three observations 300 ms apart, so a
//! broker of a cluster that is being created right now (its peer between
//! creating the cluster id and the stamp, a negative lookup cached by NFS)
//! is not refused by a view that lags.
//!
//! After the start, every partition open re-reads the stamp by exact name
//! ([`Binding::verify`]): a data directory re-stamped under a running broker
//! (by hand, or by a lost race of the empty-stamp repair below) stops its
//! opens before they claim an epoch.
//!
//! Lost replies and crashes (DESIGN §11): an empty stamp is a creator that
//! died between its create and its write (or a lost reply). It is re-read
//! for [`EMPTY_ABANDON`]; then a broker that knows its cluster id replaces it
//! (temp → fsync → rename) and reads it back. Brokers of one cluster write
//! the same bytes, so their replacements agree; two *different* clusters
//! replacing the same empty stamp at the same moment is the one race the
//! primitives cannot decide, and the per-open verification and the
//! successor probe of every partition leader are the defence behind it.
//!
//! Four questions: (1) the stamp is one exclusive create (a replacement of
//! an empty one is one rename); (2) binding is re-driven from a fresh
//! observation after every step, and every step is idempotent (creating a
//! cluster id or a stamp that holds our id is `Ours`); (3) the exclusive
//! create is the single-writer decision: the stamp is never rewritten once
//! it names a cluster; (4) this module is the answer to question 4 for the
//! data directory itself: the path names the volume, the stamp its owner.

use crate::cluster_id::{self, ClusterId};
use crate::fs::{write_atomic, Fs};
use crate::identity::{self, create_with_identity, Claimed, Found, Identity, JsonIdentity, Policy};
use crate::layout;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long an empty stamp is waited out before it is replaced.
#[cfg(not(test))]
pub const EMPTY_ABANDON: Duration = Duration::from_secs(5);
#[cfg(test)]
pub const EMPTY_ABANDON: Duration = Duration::from_millis(300);

/// How long an empty `cluster-id` is waited out (see [`cluster_id`]).
#[cfg(not(test))]
const CLUSTER_ID_ABANDON: Duration = Duration::from_secs(5);
#[cfg(test)]
const CLUSTER_ID_ABANDON: Duration = Duration::from_millis(300);

/// How many consecutive observations must agree on a refusal.
const REFUSALS_TO_BELIEVE: u32 = 3;
/// The pause between two observations that refuse.
#[cfg(not(test))]
const REFUSAL_RECHECK: Duration = Duration::from_millis(300);
#[cfg(test)]
const REFUSAL_RECHECK: Duration = Duration::from_millis(10);
/// How long [`bind`] re-drives before it gives up.
const BIND_DEADLINE: Duration = Duration::from_secs(60);

/// The content of `<data>/.cluster-id.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataStamp {
    /// The cluster whose brokers may write this data directory.
    pub cluster_id: String,
}

impl JsonIdentity for DataStamp {}

/// Why a broker may not start on this pair of directories.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The data directory and the cluster directory name different clusters.
    #[error(
        "data directory {data} belongs to cluster {data_cluster}, but cluster directory \
         {cluster_dir} is cluster {cluster}: two clusters over one data volume lose \
         acknowledged records. Start this broker with the --cluster-dir (KAAS_CLUSTER_DIR; \
         the chart's storage.controlPlane) of cluster {data_cluster}, or give it its own \
         --data-dir"
    )]
    Mismatch {
        /// The data directory.
        data: PathBuf,
        /// The cluster its stamp names.
        data_cluster: String,
        /// The cluster directory.
        cluster_dir: PathBuf,
        /// The cluster its `cluster-id` names.
        cluster: String,
    },
    /// The data directory names a cluster; the cluster directory none.
    #[error(
        "data directory {data} belongs to cluster {data_cluster}, but cluster directory \
         {cluster_dir} holds no cluster (no {id_file}): starting here would found a second \
         cluster over cluster {data_cluster}'s data and lose acknowledged records. Start this \
         broker with the --cluster-dir (KAAS_CLUSTER_DIR; the chart's storage.controlPlane) \
         that cluster {data_cluster} uses; to move a cluster's state to another directory use \
         `kaas move-cluster-dir` with the cluster stopped"
    )]
    ClusterDirEmpty {
        /// The data directory.
        data: PathBuf,
        /// The cluster its stamp names.
        data_cluster: String,
        /// The cluster directory.
        cluster_dir: PathBuf,
        /// The cluster id file name, for the message.
        id_file: &'static str,
    },
    /// Topics in an unstamped data directory, and a cluster directory that
    /// never held a cluster.
    #[error(
        "data directory {data} holds topics ({topics}) but no cluster stamp ({stamp}), and \
         cluster directory {cluster_dir} holds no cluster: these topics were written by a \
         cluster whose state is elsewhere. Start a broker with that cluster's --cluster-dir \
         first (it adopts the data directory), or pass --adopt-unstamped-data-dir to found a \
         new cluster over them"
    )]
    UnstampedData {
        /// The data directory.
        data: PathBuf,
        /// A few of the topic names found, for the message.
        topics: String,
        /// The stamp file name, for the message.
        stamp: &'static str,
        /// The cluster directory.
        cluster_dir: PathBuf,
    },
    /// A read or write of the volume failed.
    #[error("binding {data} to its cluster: {source}")]
    Io {
        /// The data directory.
        data: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Still unbound after [`BIND_DEADLINE`] of re-driving.
    #[error("binding {data} to its cluster did not converge within {secs} s: {last}")]
    Unsettled {
        /// The data directory.
        data: PathBuf,
        /// The deadline.
        secs: u64,
        /// The last state seen.
        last: String,
    },
}

/// A data directory bound to a cluster: what partition opens verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The cluster id, in both directories.
    pub cluster_id: String,
    /// `<data>/.cluster-id.json`.
    pub stamp: PathBuf,
}

impl Binding {
    /// Whether the stamp still names our cluster, read by exact name
    /// (close-to-open fresh). `Ok(Err(found))` says what it names instead:
    /// `None` if absent, empty or unreadable.
    pub fn verify(&self, fs: &dyn Fs) -> io::Result<Result<(), Option<String>>> {
        Ok(
            match identity::read_identity::<DataStamp>(fs, &self.stamp)? {
                Found::Identity(s) if s.cluster_id == self.cluster_id => Ok(()),
                Found::Identity(s) => Err(Some(s.cluster_id)),
                Found::Absent | Found::Empty => Err(None),
            },
        )
    }
}

/// Where the two directories are, and what the operator allowed.
#[derive(Debug, Clone)]
pub struct Dirs<'a> {
    /// The data directory (topics).
    pub data: &'a Path,
    /// The cluster directory (coordination).
    pub cluster: &'a Path,
    /// Found a new cluster over an unstamped data directory that holds
    /// topics (`--adopt-unstamped-data-dir`).
    pub adopt_unstamped: bool,
}

/// One look at both directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// What `<data>/.cluster-id.json` holds.
    pub stamp: Found<DataStamp>,
    /// What `<cluster>/cluster-id` holds (`None`: absent or still empty).
    pub cluster: Option<String>,
    /// A few topic directories in the data directory (empty if none).
    pub topics: Vec<String>,
}

/// What to do next, given [`Seen`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Bound to this cluster id.
    Bound(String),
    /// Stamp the data directory with this cluster id.
    Stamp(String),
    /// Create the cluster id in the cluster directory.
    CreateClusterId,
    /// The stamp is empty: wait for its creator (or replace it, later).
    StampEmpty,
    /// Refuse to start.
    Refuse(Refusal),
}

/// Why [`decide`] refuses (the [`BindError`] without paths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// See [`BindError::Mismatch`].
    Mismatch {
        /// The stamp's cluster.
        data_cluster: String,
        /// The cluster directory's.
        cluster: String,
    },
    /// See [`BindError::ClusterDirEmpty`].
    ClusterDirEmpty {
        /// The stamp's cluster.
        data_cluster: String,
    },
    /// See [`BindError::UnstampedData`].
    UnstampedData {
        /// Topics found.
        topics: Vec<String>,
    },
}

/// The decision, plain logic: see the module docs for the table.
pub fn decide(seen: &Seen, adopt_unstamped: bool) -> Step {
    match (&seen.stamp, &seen.cluster) {
        (Found::Identity(s), Some(c)) if s.cluster_id == *c => Step::Bound(c.clone()),
        (Found::Identity(s), Some(c)) => Step::Refuse(Refusal::Mismatch {
            data_cluster: s.cluster_id.clone(),
            cluster: c.clone(),
        }),
        (Found::Identity(s), None) => Step::Refuse(Refusal::ClusterDirEmpty {
            data_cluster: s.cluster_id.clone(),
        }),
        // An empty stamp with no cluster here: another cluster's broker
        // died (or lost its reply) between creating the stamp and writing
        // it. Never found a cluster over it.
        (Found::Empty, None) => Step::Refuse(Refusal::ClusterDirEmpty {
            data_cluster: "(unknown: the stamp is empty, its creator died while making it)".into(),
        }),
        (Found::Empty, Some(_)) => Step::StampEmpty,
        (Found::Absent, Some(c)) => Step::Stamp(c.clone()),
        (Found::Absent, None) if !seen.topics.is_empty() && !adopt_unstamped => {
            Step::Refuse(Refusal::UnstampedData {
                topics: seen.topics.clone(),
            })
        }
        (Found::Absent, None) => Step::CreateClusterId,
    }
}

/// Look at both directories: the stamp first, then the topics, then the
/// cluster id. A peer founding the cluster creates the cluster id before the
/// stamp, so a stamp seen here has its cluster id visible to the read after
/// it (close-to-open: an exact-name open).
pub fn observe(fs: &dyn Fs, dirs: &Dirs<'_>) -> io::Result<Seen> {
    let stamp = identity::read_identity::<DataStamp>(fs, &dirs.data.join(layout::DATA_STAMP))?;
    let topics = match stamp {
        Found::Absent | Found::Empty => topics_in(fs, dirs.data, dirs.cluster)?,
        Found::Identity(_) => Vec::new(),
    };
    let read_cluster = || match fs.read(&dirs.cluster.join(layout::CLUSTER_ID)) {
        Ok(b) => Ok(ClusterId::decode(&b).map(|c| c.0)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    };
    let mut cluster = read_cluster()?;
    if cluster.is_none() && matches!(stamp, Found::Identity(_)) {
        // About to refuse: a "no such file" may be a negative lookup this
        // host cached (NFS `lookupcache=all`). A listing fetched from the
        // volume drops it (the client primes its entries from READDIRPLUS);
        // then ask again by name.
        let _ = fs.list(dirs.cluster);
        cluster = read_cluster()?;
    }
    Ok(Seen {
        stamp,
        cluster,
        topics,
    })
}

/// Up to 5 topic directories in `data`: a directory with a topic stamp or
/// a partition directory in it (a topic from before stamps). Never the
/// cluster directory itself (`--cluster-dir` may lie inside the data
/// directory), nor any other directory. A data directory that does not
/// exist yet holds none.
fn topics_in(fs: &dyn Fs, data: &Path, cluster: &Path) -> io::Result<Vec<String>> {
    let mut names = match fs.list(data) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    names.retain(|n| !layout::is_reserved_topic_name(n) && n != "lost+found");
    names.retain(|n| data.join(n) != cluster);
    names.retain(|n| {
        let dir = data.join(n);
        fs.is_dir(&dir)
            && (fs.lookup(&dir.join(layout::TOPIC_STAMP)).unwrap_or(false)
                || fs.list(&dir).is_ok_and(|ps| {
                    ps.iter()
                        .any(|p| layout::parse_partition(p).is_some() && fs.is_dir(&dir.join(p)))
                }))
    });
    names.sort();
    names.truncate(5);
    Ok(names)
}

fn error(dirs: &Dirs<'_>, r: Refusal) -> BindError {
    match r {
        Refusal::Mismatch {
            data_cluster,
            cluster,
        } => BindError::Mismatch {
            data: dirs.data.to_path_buf(),
            data_cluster,
            cluster_dir: dirs.cluster.to_path_buf(),
            cluster,
        },
        Refusal::ClusterDirEmpty { data_cluster } => BindError::ClusterDirEmpty {
            data: dirs.data.to_path_buf(),
            data_cluster,
            cluster_dir: dirs.cluster.to_path_buf(),
            id_file: layout::CLUSTER_ID,
        },
        Refusal::UnstampedData { topics } => BindError::UnstampedData {
            data: dirs.data.to_path_buf(),
            topics: topics.join(", "),
            stamp: layout::DATA_STAMP,
            cluster_dir: dirs.cluster.to_path_buf(),
        },
    }
}

/// The read-only check run at start, before anything is written to either
/// volume: `Err` only for a refusal seen [`REFUSALS_TO_BELIEVE`] times in a
/// row. Whatever [`bind`] would create is not created here.
pub fn preflight(fs: &dyn Fs, dirs: &Dirs<'_>) -> Result<(), BindError> {
    let io = |source| BindError::Io {
        data: dirs.data.to_path_buf(),
        source,
    };
    let mut refusals = 0;
    loop {
        match decide(&observe(fs, dirs).map_err(io)?, dirs.adopt_unstamped) {
            Step::Refuse(r) => {
                refusals += 1;
                if refusals >= REFUSALS_TO_BELIEVE {
                    return Err(error(dirs, r));
                }
                std::thread::sleep(REFUSAL_RECHECK);
            }
            _ => return Ok(()),
        }
    }
}

/// Bind the data directory to the cluster of the cluster directory,
/// creating the cluster id and the stamp as needed (see the module docs).
/// Both directories must exist.
pub fn bind(fs: &dyn Fs, dirs: &Dirs<'_>) -> Result<Binding, BindError> {
    let io = |source| BindError::Io {
        data: dirs.data.to_path_buf(),
        source,
    };
    let stamp_path = dirs.data.join(layout::DATA_STAMP);
    let started = Instant::now();
    let mut refusals = 0;
    let mut empty_since: Option<Instant> = None;
    loop {
        let seen = observe(fs, dirs).map_err(io)?;
        let step = decide(&seen, dirs.adopt_unstamped);
        if started.elapsed() > BIND_DEADLINE {
            return Err(BindError::Unsettled {
                data: dirs.data.to_path_buf(),
                secs: BIND_DEADLINE.as_secs(),
                last: format!("{step:?}"),
            });
        }
        if !matches!(step, Step::Refuse(_)) {
            refusals = 0;
        }
        if !matches!(step, Step::StampEmpty) {
            empty_since = None;
        }
        match step {
            Step::Bound(cluster_id) => {
                return Ok(Binding {
                    cluster_id,
                    stamp: stamp_path,
                })
            }
            Step::Stamp(cluster_id) => {
                let me = DataStamp { cluster_id };
                match create_with_identity(fs, &stamp_path, &me, Policy::DURABLE) {
                    // Re-observed next pass: Bound, or (another cluster won
                    // the race) Mismatch.
                    Ok(Claimed::Won | Claimed::Ours | Claimed::Taken(_)) => {}
                    Ok(Claimed::Indeterminate(_)) => {}
                    Err(e) => return Err(io(e.into())),
                }
            }
            Step::CreateClusterId => {
                cluster_id::read_or_create(fs, dirs.cluster, CLUSTER_ID_ABANDON).map_err(io)?;
            }
            Step::StampEmpty => {
                let since = *empty_since.get_or_insert_with(Instant::now);
                match &seen.cluster {
                    Some(c) if since.elapsed() >= EMPTY_ABANDON => {
                        // Its creator died between create and write. Our
                        // cluster's brokers all write the same bytes.
                        tracing::warn!(stamp = %stamp_path.display(), cluster_id = %c, "data directory stamp empty for {EMPTY_ABANDON:?}: replacing it");
                        let me = DataStamp {
                            cluster_id: c.clone(),
                        };
                        write_atomic(fs, &stamp_path, &me.encode()).map_err(io)?;
                        empty_since = None;
                    }
                    Some(_) => std::thread::sleep(Duration::from_millis(100)),
                    // `decide` refuses an empty stamp without a cluster id;
                    // nothing to do but observe again.
                    None => {}
                }
            }
            Step::Refuse(r) => {
                refusals += 1;
                if refusals >= REFUSALS_TO_BELIEVE {
                    return Err(error(dirs, r));
                }
                std::thread::sleep(REFUSAL_RECHECK);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build fixtures and play other hosts with std::fs
mod tests {
    use super::*;
    use crate::fs::fault::FaultFs;
    use crate::fs::RealFs;

    struct Two {
        _d: tempfile::TempDir,
        data: PathBuf,
        cluster: PathBuf,
    }

    fn two() -> Two {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("data");
        let cluster = d.path().join("cp");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&cluster).unwrap();
        Two {
            _d: d,
            data,
            cluster,
        }
    }

    fn dirs<'a>(data: &'a Path, cluster: &'a Path) -> Dirs<'a> {
        Dirs {
            data,
            cluster,
            adopt_unstamped: false,
        }
    }

    fn stamp(id: &str) -> Found<DataStamp> {
        Found::Identity(DataStamp {
            cluster_id: id.into(),
        })
    }

    /// Catches: any row of the table going the wrong way — above all a
    /// stamped data directory with an empty or different cluster directory
    /// being bound (the two-clusters-one-volume data loss).
    #[test]
    fn the_decision_table() {
        let seen = |stamp, cluster: Option<&str>, topics: &[&str]| Seen {
            stamp,
            cluster: cluster.map(str::to_owned),
            topics: topics.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(
            decide(&seen(stamp("a"), Some("a"), &[]), false),
            Step::Bound("a".into())
        );
        assert_eq!(
            decide(&seen(stamp("a"), Some("b"), &[]), true),
            Step::Refuse(Refusal::Mismatch {
                data_cluster: "a".into(),
                cluster: "b".into()
            })
        );
        assert_eq!(
            decide(&seen(stamp("a"), None, &[]), true),
            Step::Refuse(Refusal::ClusterDirEmpty {
                data_cluster: "a".into()
            })
        );
        assert_eq!(
            decide(&seen(Found::Absent, Some("a"), &["t"]), false),
            Step::Stamp("a".into()),
            "an unstamped volume is adopted by an existing cluster"
        );
        assert_eq!(
            decide(&seen(Found::Absent, None, &[]), false),
            Step::CreateClusterId
        );
        assert_eq!(
            decide(&seen(Found::Absent, None, &["orders"]), false),
            Step::Refuse(Refusal::UnstampedData {
                topics: vec!["orders".into()]
            })
        );
        assert_eq!(
            decide(&seen(Found::Absent, None, &["orders"]), true),
            Step::CreateClusterId
        );
        assert_eq!(
            decide(&seen(Found::Empty, Some("a"), &[]), false),
            Step::StampEmpty
        );
        assert!(
            matches!(
                decide(&seen(Found::Empty, None, &[]), true),
                Step::Refuse(Refusal::ClusterDirEmpty { .. })
            ),
            "an empty stamp is never taken over by a cluster founded here"
        );
    }

    /// Catches: a second cluster directory over a bound data directory
    /// being accepted, and the check writing anything before it refuses.
    #[test]
    fn a_second_cluster_directory_is_refused_and_nothing_is_written() {
        let t = two();
        let b = bind(&RealFs, &dirs(&t.data, &t.cluster)).unwrap();
        assert!(b.verify(&RealFs).unwrap().is_ok());
        let other = t.data.join("__cluster");
        // An empty cluster directory (none given): the default under data.
        match preflight(&RealFs, &dirs(&t.data, &other)) {
            Err(BindError::ClusterDirEmpty { data_cluster, .. }) => {
                assert_eq!(data_cluster, b.cluster_id)
            }
            r => panic!("want ClusterDirEmpty, got {r:?}"),
        }
        assert!(!other.exists(), "the refusal created nothing");
        // Another cluster's directory.
        let t2 = two();
        let b2 = bind(&RealFs, &dirs(&t2.data, &t2.cluster)).unwrap();
        match bind(&RealFs, &dirs(&t.data, &t2.cluster)) {
            Err(BindError::Mismatch {
                data_cluster,
                cluster,
                ..
            }) => {
                assert_eq!(
                    (data_cluster, cluster),
                    (b.cluster_id.clone(), b2.cluster_id)
                )
            }
            r => panic!("want Mismatch, got {r:?}"),
        }
        let msg = preflight(&RealFs, &dirs(&t.data, &t2.cluster))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(&b.cluster_id) && msg.contains("--cluster-dir"),
            "{msg}"
        );
    }

    /// Catches: a fresh cluster over a copied data directory binding the
    /// copy (the copy carries the stamp), and a new cluster directory over
    /// unstamped topics being accepted without the explicit option.
    #[test]
    fn copies_and_unstamped_topics_are_refused_unless_adopted() {
        let t = two();
        let b = bind(&RealFs, &dirs(&t.data, &t.cluster)).unwrap();
        let copy = t.data.parent().unwrap().join("copy");
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::copy(&b.stamp, copy.join(layout::DATA_STAMP)).unwrap();
        let fresh = t.data.parent().unwrap().join("fresh-cp");
        std::fs::create_dir_all(&fresh).unwrap();
        assert!(matches!(
            bind(&RealFs, &dirs(&copy, &fresh)),
            Err(BindError::ClusterDirEmpty { .. })
        ));

        let t = two();
        std::fs::create_dir_all(t.data.join("orders/0")).unwrap();
        std::fs::create_dir_all(t.data.join(".deleted-1/0")).unwrap();
        match bind(&RealFs, &dirs(&t.data, &t.cluster)) {
            Err(BindError::UnstampedData { topics, .. }) => assert_eq!(topics, "orders"),
            r => panic!("want UnstampedData, got {r:?}"),
        }
        assert!(!t.cluster.join(layout::CLUSTER_ID).exists());
        let adopt = Dirs {
            adopt_unstamped: true,
            ..dirs(&t.data, &t.cluster)
        };
        let b = bind(&RealFs, &adopt).unwrap();
        assert!(b.verify(&RealFs).unwrap().is_ok());
    }

    /// Catches: a fresh cluster whose `--cluster-dir` lies inside the data
    /// directory (or a stray directory beside the topics) taken for a topic
    /// of an unknown cluster, refused on every start.
    #[test]
    fn only_topic_directories_count_as_topics() {
        let t = two();
        let nested = t.data.join("cp");
        std::fs::create_dir_all(&nested).unwrap();
        std::fs::create_dir_all(t.data.join("stray/notes")).unwrap();
        let b = bind(&RealFs, &dirs(&t.data, &nested)).unwrap();
        assert!(b.verify(&RealFs).unwrap().is_ok());
        // A topic from before stamps (a partition directory) and a stamped
        // one both count.
        let t = two();
        std::fs::create_dir_all(t.data.join("old/0")).unwrap();
        std::fs::create_dir_all(t.data.join("new")).unwrap();
        std::fs::write(t.data.join("new").join(layout::TOPIC_STAMP), b"{}").unwrap();
        match preflight(&RealFs, &dirs(&t.data, &t.cluster)) {
            Err(BindError::UnstampedData { topics, .. }) => assert_eq!(topics, "new, old"),
            r => panic!("want UnstampedData, got {r:?}"),
        }
    }

    /// Catches: an existing cluster not adopting its own unstamped data
    /// directory (an upgrade), or two clusters both adopting one: the
    /// exclusive create decides, the loser is refused with the winner's id.
    #[test]
    fn an_unstamped_volume_is_adopted_by_exactly_one_cluster() {
        let t = two();
        std::fs::create_dir_all(t.data.join("orders/0")).unwrap();
        let mine = cluster_id::read_or_create(&RealFs, &t.cluster, Duration::ZERO).unwrap();
        let cp2 = t.data.parent().unwrap().join("cp2");
        std::fs::create_dir_all(&cp2).unwrap();
        let theirs = cluster_id::read_or_create(&RealFs, &cp2, Duration::ZERO).unwrap();
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| bind(&RealFs, &dirs(&t.data, &t.cluster)));
            let b = s.spawn(|| bind(&RealFs, &dirs(&t.data, &cp2)));
            (a.join().unwrap(), b.join().unwrap())
        });
        let won: Vec<_> = [&a, &b].into_iter().filter(|r| r.is_ok()).collect();
        assert_eq!(won.len(), 1, "exactly one cluster adopts: {a:?} {b:?}");
        let winner = won[0].as_ref().unwrap().cluster_id.clone();
        assert!(winner == mine || winner == theirs);
        let loser = if a.is_ok() { b } else { a };
        assert!(
            matches!(loser, Err(BindError::Mismatch { ref data_cluster, .. }) if *data_cluster == winner),
            "{loser:?}"
        );
    }

    /// Catches: brokers of one fresh cluster racing the first start ending
    /// on different ids, or one of them refused.
    #[test]
    fn brokers_of_one_fresh_cluster_agree() {
        let t = two();
        let ids: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| bind(&RealFs, &dirs(&t.data, &t.cluster)).unwrap()))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap().cluster_id)
                .collect()
        });
        assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    }

    /// Catches: a crash at any step of binding a fresh pair of directories
    /// (cluster id create/write/fsync, stamp create/write/fsync) leaving a
    /// state the next start cannot bind, or binding it to a different id
    /// than a later start sees.
    #[test]
    fn crash_at_every_step_of_binding_converges() {
        let mut crashed_somewhere = false;
        for n in 1..=30 {
            let t = two();
            let ffs = FaultFs::new();
            ffs.crash_at(ffs.ops() + n);
            let first = bind(&ffs, &dirs(&t.data, &t.cluster));
            let crashed = ffs.crashed();
            ffs.power_loss();
            // An empty stamp is replaced after EMPTY_ABANDON: a crash
            // between its create and its write costs that wait, once.
            let b = bind(&RealFs, &dirs(&t.data, &t.cluster))
                .unwrap_or_else(|e| panic!("step {n}: not bound after the crash: {e}"));
            assert_eq!(
                bind(&RealFs, &dirs(&t.data, &t.cluster)).unwrap(),
                b,
                "step {n}: a second start sees another binding"
            );
            assert!(b.verify(&RealFs).unwrap().is_ok());
            if !crashed {
                assert_eq!(first.unwrap(), b, "an uncrashed binding is durable");
                assert!(
                    crashed_somewhere,
                    "no step crashed: the test checks nothing"
                );
                return;
            }
            crashed_somewhere = true;
        }
        panic!("binding took more than 30 steps");
    }

    /// Catches: a stamp replaced under a running broker (by hand, or by
    /// another cluster) still passing the per-open verification.
    #[test]
    fn verify_reads_the_stamp_by_name_every_time() {
        let t = two();
        let b = bind(&RealFs, &dirs(&t.data, &t.cluster)).unwrap();
        assert_eq!(b.verify(&RealFs).unwrap(), Ok(()));
        write_atomic(
            &RealFs,
            &b.stamp,
            &DataStamp {
                cluster_id: "other".into(),
            }
            .encode(),
        )
        .unwrap();
        assert_eq!(b.verify(&RealFs).unwrap(), Err(Some("other".into())));
        std::fs::remove_file(&b.stamp).unwrap();
        assert_eq!(b.verify(&RealFs).unwrap(), Err(None));
    }
}
