//! Moving a stopped cluster's state from one cluster directory to another
//! (`kaas move-cluster-dir --from A --to B`): from `<data>/__cluster` to a
//! dedicated control-plane volume, and back.
//!
//! A cluster *is* its cluster directory (its `cluster-id`, which the data
//! directory's stamp names: [`crate::binding`]). Two directories that both
//! hold that id would be two clusters over one data volume, so the move
//! keeps an invariant at every step, crash or not: **at most one of A and B
//! holds `cluster-id`**, and the one that does holds the whole state.
//!
//! The steps, each re-driven from what the directories hold (run the same
//! command again after any failure):
//!
//! 1. B is marked `.move-in-progress.json` (exclusive create, naming the
//!    cluster id and A). B must be empty but for that marker (and
//!    `lost+found`): a destination holding anything else is refused.
//! 2. Every file of A but `cluster-id` is copied to the same relative path in
//!    B (temp → fsync → rename each; idempotent: a re-drive copies again).
//! 3. A's `cluster-id` is renamed to `cluster-id.moved` (one same-directory
//!    rename): from here no broker binds A (its data names the cluster, A
//!    names none).
//! 4. B's `cluster-id` is created (exclusive create with the id): from here
//!    brokers bind B. The marker is removed.
//! 5. A is emptied (`cluster-id.moved` last), so it can be the destination of
//!    a move back.
//!
//! Between 3 and 4 neither directory holds the cluster: a broker started
//! then refuses (it never founds a new one over the stamped data), and the
//! re-driven command finishes the move. The cluster must be stopped: the
//! command refuses while any broker's liveness record changes within the
//! observation window.
//!
//! Four questions: (1) the commit points are one rename (3) and one
//! exclusive create (4); everything else is copies made with rule 1; (2)
//! every step is idempotent and the command re-drives from the state it
//! reads; (3) one writer: the cluster is stopped and the marker names the
//! one move; (4) the marker and `cluster-id` carry the cluster id, so a
//! destination holding another cluster's marker or state is refused.

use crate::cluster_id::ClusterId;
use crate::fs::{remove_if_exists, remove_tree, write_atomic, Fs};
use crate::identity::{self, create_with_identity, Claimed, Found, Identity, JsonIdentity, Policy};
use crate::layout;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The destination's marker while a move is under way.
pub const MARKER: &str = ".move-in-progress.json";
/// What A's `cluster-id` is renamed to once the copy is complete.
pub const MOVED: &str = "cluster-id.moved";

/// The content of [`MARKER`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveMarker {
    /// The cluster being moved.
    pub cluster_id: String,
    /// Where from (as given; for the operator reading it).
    pub from: String,
}

impl JsonIdentity for MoveMarker {}

/// Why the move did not (or did not yet) happen.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// Neither A nor B holds a cluster, and no move is under way.
    #[error("{from} holds no cluster (no {id}) and no move to {to} is under way")]
    NoCluster {
        /// A.
        from: PathBuf,
        /// B.
        to: PathBuf,
        /// The file name.
        id: &'static str,
    },
    /// B holds files that are not this move's.
    #[error("destination {to} is not empty ({found}) and holds no move of cluster {cluster}: refusing to mix two clusters' state")]
    DestinationNotEmpty {
        /// B.
        to: PathBuf,
        /// A few names found.
        found: String,
        /// The cluster being moved.
        cluster: String,
    },
    /// A and B both hold a cluster id (not made by this command).
    #[error("both {from} ({a}) and {to} ({b}) hold a cluster: refusing")]
    BothHoldClusters {
        /// A.
        from: PathBuf,
        /// Its id.
        a: String,
        /// B.
        to: PathBuf,
        /// Its id.
        b: String,
    },
    /// A broker's liveness record changed: the cluster is running.
    #[error("the cluster is running: broker record {record} changed within {waited:?}; stop every broker (scale to 0) first")]
    Running {
        /// The record that changed.
        record: PathBuf,
        /// The observation window.
        waited: Duration,
    },
    /// One directory lies inside the other (or they are the same): the
    /// copy would land in the source and emptying the source would delete
    /// it.
    #[error("{from} and {to} are nested (one inside the other, or the same directory): refusing")]
    Nested {
        /// A.
        from: PathBuf,
        /// B.
        to: PathBuf,
    },
    /// A filesystem call failed; run the command again.
    #[error("{what} {path}: {source}; the move is re-driven by running the same command again")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

fn io_at(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> MoveError {
    let path = path.to_path_buf();
    move |source| MoveError::Io { what, path, source }
}

/// What the move did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// The cluster moved.
    pub cluster_id: String,
    /// Files copied by this run (0 when only finishing an earlier run).
    pub files: usize,
}

fn read_cluster_id(fs: &dyn Fs, path: &Path) -> Result<Option<String>, MoveError> {
    match fs.read(path) {
        Ok(b) => Ok(ClusterId::decode(&b).map(|c| c.0)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_at("reading", path)(e)),
    }
}

/// Whether any broker liveness record in `from` changes within `wait`
/// (both readings by exact name after one listing).
pub fn check_stopped(fs: &dyn Fs, from: &Path, wait: Duration) -> Result<(), MoveError> {
    let dir = from.join(layout::BROKERS_DIR);
    let names = match fs.list(&dir) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_at("listing", &dir)(e)),
    };
    let records: Vec<PathBuf> = names
        .iter()
        .filter(|n| n.ends_with(".json") && !layout::is_temp(n))
        .map(|n| dir.join(n))
        .collect();
    let read = |p: &Path| fs.read(p).ok();
    let before: Vec<_> = records.iter().map(|p| read(p)).collect();
    if wait.is_zero() {
        return Ok(());
    }
    std::thread::sleep(wait);
    for (p, b) in records.iter().zip(before) {
        if read(p) != b {
            return Err(MoveError::Running {
                record: p.clone(),
                waited: wait,
            });
        }
    }
    Ok(())
}

/// Every file under `dir`, as paths relative to it, directories first.
fn walk(fs: &dyn Fs, root: &Path, rel: &Path, out: &mut Vec<(PathBuf, bool)>) -> io::Result<()> {
    for name in fs.list(&root.join(rel))? {
        let r = rel.join(&name);
        if fs.is_dir(&root.join(&r)) {
            out.push((r.clone(), true));
            walk(fs, root, &r, out)?;
        } else {
            out.push((r, false));
        }
    }
    Ok(())
}

/// Move the cluster state in `from` to `to` (see the module docs); re-run
/// after any error to finish. `wait`: how long broker records must stand
/// still before the cluster counts as stopped.
/// `path` made absolute and resolved as far as it exists (symlinks,
/// `..`), the rest appended lexically.
fn resolved(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    };
    let mut head = abs.as_path();
    let mut tail = Vec::new();
    loop {
        if let Ok(c) = std::fs::canonicalize(head) {
            return tail.iter().rev().fold(c, |p: PathBuf, n| p.join(n));
        }
        match (head.parent(), head.file_name()) {
            (Some(p), Some(n)) => {
                tail.push(n.to_owned());
                head = p;
            }
            _ => return abs,
        }
    }
}

pub fn move_cluster_dir(
    fs: &dyn Fs,
    from: &Path,
    to: &Path,
    wait: Duration,
) -> Result<Moved, MoveError> {
    let (a, b) = (resolved(from), resolved(to));
    if a.starts_with(&b) || b.starts_with(&a) {
        return Err(MoveError::Nested {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
        });
    }
    let a_id = read_cluster_id(fs, &from.join(layout::CLUSTER_ID))?;
    let b_id = read_cluster_id(fs, &to.join(layout::CLUSTER_ID))?;
    let moved = read_cluster_id(fs, &from.join(MOVED))?;
    let cluster = match (&a_id, &b_id) {
        (Some(a), Some(b)) => {
            return Err(MoveError::BothHoldClusters {
                from: from.to_path_buf(),
                a: a.clone(),
                to: to.to_path_buf(),
                b: b.clone(),
            })
        }
        // Committed (step 4 done): only the clean-up may be left.
        (None, Some(b)) => {
            // Only a source this move retired is emptied: one holding the
            // retired id of the destination's cluster, or nothing at all.
            let empty = || {
                fs.list(from)
                    .map(|n| n.iter().all(|n| n == "lost+found"))
                    .unwrap_or(true)
            };
            if moved.as_ref() == Some(b) || (moved.is_none() && empty()) {
                finish(fs, to)?;
                clean_source(fs, from)?;
                return Ok(Moved {
                    cluster_id: b.clone(),
                    files: 0,
                });
            }
            return Err(MoveError::NoCluster {
                from: from.to_path_buf(),
                to: to.to_path_buf(),
                id: layout::CLUSTER_ID,
            });
        }
        (Some(a), None) => a.clone(),
        // Retired (step 3 done), not yet committed.
        (None, None) => match moved {
            Some(m) => m,
            None => {
                return Err(MoveError::NoCluster {
                    from: from.to_path_buf(),
                    to: to.to_path_buf(),
                    id: layout::CLUSTER_ID,
                })
            }
        },
    };
    if a_id.is_some() {
        check_stopped(fs, from, wait)?;
    }
    // 1. The destination's marker; nothing else of anyone's in it.
    fs.create_dir_all(to).map_err(io_at("creating", to))?;
    let marker = MoveMarker {
        cluster_id: cluster.clone(),
        from: from.display().to_string(),
    };
    let marker_path = to.join(MARKER);
    let mine = match identity::read_identity::<MoveMarker>(fs, &marker_path)
        .map_err(io_at("reading", &marker_path))?
    {
        Found::Identity(m) => m.cluster_id == cluster,
        Found::Absent | Found::Empty => false,
    };
    if !mine {
        let mut others = fs.list(to).map_err(io_at("listing", to))?;
        others.retain(|n| n != MARKER && n != "lost+found" && !layout::is_temp(n));
        if !others.is_empty() {
            others.sort();
            others.truncate(5);
            return Err(MoveError::DestinationNotEmpty {
                to: to.to_path_buf(),
                found: others.join(", "),
                cluster,
            });
        }
        match create_with_identity(fs, &marker_path, &marker, Policy::DURABLE)
            .map_err(|e| io_at("marking", &marker_path)(e.into()))?
        {
            Claimed::Won | Claimed::Ours => {}
            // An empty marker (a run that died between create and write,
            // with an empty destination otherwise): ours to replace.
            Claimed::Indeterminate(_) => write_atomic(fs, &marker_path, &marker.encode())
                .map_err(io_at("marking", &marker_path))?,
            Claimed::Taken(m) => {
                return Err(MoveError::DestinationNotEmpty {
                    to: to.to_path_buf(),
                    found: format!("{MARKER} of cluster {}", m.cluster_id),
                    cluster,
                })
            }
        }
    }
    // 2. Copy everything but the id (and the retired id, and temps).
    let mut entries = Vec::new();
    walk(fs, from, Path::new(""), &mut entries).map_err(io_at("listing", from))?;
    let mut files = 0;
    for (rel, is_dir) in &entries {
        let name = rel.to_string_lossy();
        if name == layout::CLUSTER_ID
            || name == MOVED
            || rel
                .file_name()
                .is_some_and(|n| layout::is_temp(&n.to_string_lossy()))
        {
            continue;
        }
        let (src, dst) = (from.join(rel), to.join(rel));
        if *is_dir {
            fs.create_dir_all(&dst).map_err(io_at("creating", &dst))?;
            continue;
        }
        let bytes = fs.read(&src).map_err(io_at("reading", &src))?;
        write_atomic(fs, &dst, &bytes).map_err(io_at("writing", &dst))?;
        files += 1;
    }
    // Temps of copies a crashed run left (only this move writes here).
    sweep_temps(fs, to)?;
    // 3. Retire the source: no broker binds it from here.
    if a_id.is_some() {
        let (id, moved) = (from.join(layout::CLUSTER_ID), from.join(MOVED));
        match fs.rename(&id, &moved) {
            Ok(()) => {}
            // A lost reply to a rename that happened (DESIGN §11).
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_at("retiring", &id)(e)),
        }
        fs.sync_dir(from).map_err(io_at("syncing", from))?;
        if read_cluster_id(fs, &moved)?.as_deref() != Some(cluster.as_str()) {
            return Err(io_at("retiring", &id)(io::Error::other(
                "the retired cluster id does not read back",
            )));
        }
    }
    // 4. Commit the destination.
    let id_path = to.join(layout::CLUSTER_ID);
    match create_with_identity(fs, &id_path, &ClusterId(cluster.clone()), Policy::DURABLE)
        .map_err(|e| io_at("committing", &id_path)(e.into()))?
    {
        Claimed::Won | Claimed::Ours => {}
        Claimed::Indeterminate(_) => {
            write_atomic(fs, &id_path, cluster.as_bytes()).map_err(io_at("committing", &id_path))?
        }
        Claimed::Taken(ClusterId(other)) => {
            return Err(MoveError::BothHoldClusters {
                from: from.to_path_buf(),
                a: cluster,
                to: to.to_path_buf(),
                b: other,
            })
        }
    }
    finish(fs, to)?;
    // 5. Empty the source.
    clean_source(fs, from)?;
    Ok(Moved {
        cluster_id: cluster,
        files,
    })
}

/// Remove every `.tmp-` file under `dir`.
fn sweep_temps(fs: &dyn Fs, dir: &Path) -> Result<(), MoveError> {
    let mut entries = Vec::new();
    walk(fs, dir, Path::new(""), &mut entries).map_err(io_at("listing", dir))?;
    for (rel, is_dir) in entries {
        let temp = rel
            .file_name()
            .is_some_and(|n| layout::is_temp(&n.to_string_lossy()));
        if !is_dir && temp {
            let p = dir.join(&rel);
            remove_if_exists(fs, &p).map_err(io_at("removing", &p))?;
        }
    }
    Ok(())
}

/// Remove the destination's marker (after the commit).
fn finish(fs: &dyn Fs, to: &Path) -> Result<(), MoveError> {
    let p = to.join(MARKER);
    remove_if_exists(fs, &p).map_err(io_at("removing", &p))?;
    fs.sync_dir(to).map_err(io_at("syncing", to))
}

/// Empty the source, its retired id last (a re-drive still knows the move
/// from it until then). The directory itself stays (it may be a mount).
fn clean_source(fs: &dyn Fs, from: &Path) -> Result<(), MoveError> {
    let names = match fs.list(from) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_at("listing", from)(e)),
    };
    for n in names.iter().filter(|n| *n != MOVED && *n != "lost+found") {
        let p = from.join(n);
        let r = if fs.is_dir(&p) {
            remove_tree(fs, &p)
        } else {
            remove_if_exists(fs, &p)
        };
        r.map_err(io_at("removing", &p))?;
    }
    let moved = from.join(MOVED);
    remove_if_exists(fs, &moved).map_err(io_at("removing", &moved))?;
    fs.sync_dir(from).map_err(io_at("syncing", from))
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build fixtures and play other hosts with std::fs
mod tests {
    use super::*;
    use crate::binding::{self, Dirs};
    use crate::fs::fault::FaultFs;
    use crate::fs::RealFs;
    use std::collections::BTreeMap;

    /// A bound cluster: data + cluster dir with a few state files.
    fn cluster(root: &Path) -> (PathBuf, PathBuf, String) {
        let data = root.join("data");
        let a = data.join(layout::CLUSTER_DIR);
        std::fs::create_dir_all(&a).unwrap();
        let b = binding::bind(
            &RealFs,
            &Dirs {
                data: &data,
                cluster: &a,
                adopt_unstamped: false,
            },
        )
        .unwrap();
        for (p, c) in [
            ("assignment.json", "{\"version\":3}"),
            ("brokers/0.json", "{\"seq\":9}"),
            ("groups/0007/00000000000000000002-e3.log", "group state"),
            ("controller/epoch-0000000002.json", "{\"epoch\":2}"),
        ] {
            let f = a.join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, c).unwrap();
        }
        (data, a, b.cluster_id)
    }

    fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
        let mut out = BTreeMap::new();
        let mut e = Vec::new();
        if dir.exists() {
            walk(&RealFs, dir, Path::new(""), &mut e).unwrap();
        }
        for (rel, is_dir) in e {
            if !is_dir {
                out.insert(
                    rel.display().to_string(),
                    std::fs::read(dir.join(&rel)).unwrap(),
                );
            }
        }
        out
    }

    fn binds(data: &Path, cluster: &Path) -> bool {
        let d = Dirs {
            data,
            cluster,
            adopt_unstamped: false,
        };
        binding::preflight(&RealFs, &d).is_ok()
            && RealFs.read(&cluster.join(layout::CLUSTER_ID)).is_ok()
    }

    /// Catches: a move that loses or changes a file, leaves the source
    /// bindable, or cannot be moved back.
    #[test]
    fn a_move_and_back_keeps_every_file_and_one_bindable_directory() {
        let d = tempfile::tempdir().unwrap();
        let (data, a, id) = cluster(d.path());
        let before = tree(&a);
        let b = d.path().join("cp");
        let m = move_cluster_dir(&RealFs, &a, &b, Duration::ZERO).unwrap();
        assert_eq!(m.cluster_id, id);
        assert_eq!(tree(&b), before, "every file, byte for byte");
        assert!(binds(&data, &b) && !binds(&data, &a));
        assert!(tree(&a).is_empty(), "the source is emptied");
        move_cluster_dir(&RealFs, &b, &a, Duration::ZERO).unwrap();
        assert_eq!(tree(&a), before);
        assert!(binds(&data, &a) && !binds(&data, &b));
    }

    /// Catches: a move into a directory holding someone else's state, and
    /// a move while a broker still heartbeats.
    #[test]
    fn a_busy_destination_and_a_running_cluster_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let (_, a, _) = cluster(d.path());
        let b = d.path().join("cp");
        std::fs::create_dir_all(b.join("assignment")).unwrap();
        assert!(matches!(
            move_cluster_dir(&RealFs, &a, &b, Duration::ZERO),
            Err(MoveError::DestinationNotEmpty { .. })
        ));
        std::fs::remove_dir(b.join("assignment")).unwrap();
        // Into a directory inside the source, or the source's parent: the
        // clean-up would delete the copy (or the copy land in the source).
        for nested in [a.join("new"), a.parent().unwrap().to_path_buf(), a.clone()] {
            let r = move_cluster_dir(&RealFs, &a, &nested, Duration::ZERO);
            assert!(matches!(r, Err(MoveError::Nested { .. })), "{r:?}");
        }
        assert!(RealFs.read(&a.join(layout::CLUSTER_ID)).is_ok());
        let rec = a.join("brokers/0.json");
        let beat = std::thread::spawn(move || {
            for i in 0..20 {
                // seq from 100: never the fixture's own 9.
                std::fs::write(&rec, format!("{{\"seq\":{}}}", 100 + i)).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let r = move_cluster_dir(&RealFs, &a, &b, Duration::from_millis(200));
        assert!(matches!(r, Err(MoveError::Running { .. })), "{r:?}");
        beat.join().unwrap();
        assert!(RealFs.read(&a.join(layout::CLUSTER_ID)).is_ok());
    }

    /// Catches: a crash at any step leaving both directories bindable (two
    /// clusters), a file lost or torn, or a state the re-driven command
    /// cannot finish.
    #[test]
    fn crash_at_every_step_of_a_move_converges_with_one_cluster() {
        let mut crashed_somewhere = false;
        for n in 1..=200 {
            let d = tempfile::tempdir().unwrap();
            let (data, a, id) = cluster(d.path());
            let before = tree(&a);
            let b = d.path().join("cp");
            let ffs = FaultFs::new();
            ffs.crash_at(ffs.ops() + n);
            let first = move_cluster_dir(&ffs, &a, &b, Duration::ZERO);
            let crashed = ffs.crashed();
            ffs.power_loss();
            // Never two clusters, whatever step the crash hit.
            assert!(
                !(binds(&data, &a) && binds(&data, &b)),
                "step {n}: both directories bind"
            );
            let m = move_cluster_dir(&RealFs, &a, &b, Duration::ZERO)
                .unwrap_or_else(|e| panic!("step {n}: the re-drive failed: {e}"));
            assert_eq!(m.cluster_id, id);
            assert_eq!(tree(&b), before, "step {n}: files differ after the move");
            assert!(binds(&data, &b) && !binds(&data, &a), "step {n}");
            if !crashed {
                first.unwrap();
                assert!(
                    crashed_somewhere,
                    "no step crashed: the test checks nothing"
                );
                return;
            }
            crashed_somewhere = true;
        }
        panic!("a move took more than 200 steps");
    }
}
