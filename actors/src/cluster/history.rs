//! The assignment as a linear history: `<cluster>/assignment/v-<n>.json`
//! holds version `n` — an [`AssignmentDelta`] on version `n - 1` — in the
//! CRC-headed envelope of [`kaas_volume::versioned`], and
//! `<cluster>/assignment.json` is a checkpoint: the whole [`Assignment`] as
//! of the version it carries.
//!
//! * **Publish** ([`publish`]): the controller creates `v-<n>` with
//!   O_CREAT|O_EXCL, writes and fsyncs it, and fsyncs the directory. Exactly
//!   one creator wins each number, so a deposed controller can only win a
//!   number its successor has not written — and the successor, finding it,
//!   folds it into its base and plans from there (it never writes past a
//!   version it has not read). Every version is therefore a delta on the
//!   one before it, and every reader folds the same sequence.
//! * **Read** ([`probe`], [`read_current`]): from the checkpoint (or from
//!   nothing), probe `v+1`, `v+2` … by exact name (close-to-open; a listing
//!   is never trusted to say "this is the newest"). A version whose bytes do
//!   not pass the envelope's check is torn — its creator is between create
//!   and write, or died there — and is never applied: readers stop before
//!   it and look again.
//! * **Repair** ([`repair`]): a torn version is completed by renaming a
//!   whole file over its name (same directory: atomic), by the controller
//!   only, and only when no one else can complete it (see the controller).
//!   A late write by its creator then lands in the replaced inode, not
//!   under the name.
//! * **Head** ([`write_head`], [`read_head`]): after each version is
//!   durable the controller rewrites `assignment/head` (temp → rename) with
//!   its number. Readers on other hosts poll that fixed name (close-to-open
//!   fresh) and open a version only once the head says it exists: on NFS a
//!   "no such file" answer is cached for the directory's attribute lifetime,
//!   so probing `v+1` before it exists would hide it for seconds. The head is
//!   only a hint — every version is still read by exact name and checked —
//!   and a stale head only delays.
//! * **Checkpoint** ([`write_checkpoint`]): temp → fsync → rename, written
//!   only after the version it carries is durable in the history, so it is
//!   never newer than the history. A file from before the history existed
//!   is simply the first checkpoint.
//! * **Prune** ([`prune`]): versions well below a checkpoint are removed
//!   lowest first, so a version that exists implies every later one still
//!   does: a reader that finds its own version gone knows it was pruned and
//!   restarts from the checkpoint.
//!
//! Four questions: (1) a version is one exclusive create (then write, fsync,
//! directory fsync); a repair and a checkpoint are each one same-directory
//! rename; (2) a crash leaves nothing, a torn version (repaired by the next
//! controller), a stray temp (swept), or the whole version; pruning is
//! idempotent and re-driven every pass; (3) one writer, the controller,
//! fenced twice: its seam refuses every syscall once its lease lapsed, and
//! the exclusive create refuses a number already taken; (4) a number names
//! one content forever: a version is never rewritten once complete, and a
//! pruned number is never created again (creates only go above the top).

use super::records::{Assignment, AssignmentDelta};
use kaas_volume::fs::{write_atomic, Fs};
use kaas_volume::layout::{
    assignment_version, parse_assignment_version, ASSIGNMENT, ASSIGNMENT_HEAD,
    ASSIGNMENT_HISTORY_DIR,
};
use kaas_volume::versioned::{decode, encode, Reader};
use std::io;
use std::path::{Path, PathBuf};

/// The history directory inside the cluster directory.
pub fn history_dir(cluster: &Path) -> PathBuf {
    cluster.join(ASSIGNMENT_HISTORY_DIR)
}

/// Version `n`'s file.
pub fn version_path(cluster: &Path, n: u64) -> PathBuf {
    history_dir(cluster).join(assignment_version(n))
}

/// The checkpoint file.
pub fn checkpoint_path(cluster: &Path) -> PathBuf {
    cluster.join(ASSIGNMENT)
}

/// What one exact-name look at a version found.
#[derive(Debug, Clone, PartialEq)]
pub enum Probe {
    /// Not created (or pruned).
    Absent,
    /// Created, but its bytes do not (yet) pass the check: never applied.
    Torn,
    /// The version.
    Found(AssignmentDelta),
}

/// Look at version `n` by exact name.
pub fn probe(r: &(impl Reader + ?Sized), cluster: &Path, n: u64) -> io::Result<Probe> {
    match r.read_file(&version_path(cluster, n)) {
        Ok(b) => Ok(match decode_version(n, &b) {
            Some(d) => Probe::Found(d),
            None => Probe::Torn,
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Probe::Absent),
        // No history directory at all (a cluster from before it).
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(Probe::Absent),
        Err(e) => Err(e),
    }
}

/// The version numbers a listing of the history names (none if there is
/// no history directory). A listing may be stale: it says which names may be
/// opened, never that nothing newer exists.
pub fn listed_versions(fs: &dyn Fs, cluster: &Path) -> io::Result<std::collections::BTreeSet<u64>> {
    match fs.list(&history_dir(cluster)) {
        Ok(names) => Ok(names
            .iter()
            .filter_map(|x| parse_assignment_version(x))
            .collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Default::default()),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(Default::default()),
        Err(e) => Err(e),
    }
}

/// [`probe`], and when that finds nothing, a look at the directory listing
/// for `n`: an NFS client caches "no such file" (`lookupcache=all`, the
/// default), so a version another host created can stay invisible to a
/// plain open until the directory's cached attributes expire; a listing
/// fetched from the server primes the name. The listing only makes the
/// exact open look again — it is never taken as "this is the newest".
pub fn probe_fresh(r: &(impl Reader + ?Sized), cluster: &Path, n: u64) -> io::Result<Probe> {
    match probe(r, cluster, n)? {
        Probe::Absent => {}
        found => return Ok(found),
    }
    let listed = match r.list_dir(&history_dir(cluster)) {
        Ok(names) => names.iter().any(|x| parse_assignment_version(x) == Some(n)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => false,
        Err(e) => return Err(e),
    };
    if listed {
        probe(r, cluster, n)
    } else {
        Ok(Probe::Absent)
    }
}

/// Version `n` from its bytes: only the enveloped format (a plain-JSON
/// file is not a version), and only if it names itself `n`.
fn decode_version(n: u64, b: &[u8]) -> Option<AssignmentDelta> {
    if !b.starts_with(b"kaas-versioned ") {
        return None;
    }
    decode::<AssignmentDelta>(n, b).filter(|d| d.version == n)
}

/// The bytes of version `d.version`.
pub fn encode_version(d: &AssignmentDelta) -> Vec<u8> {
    encode(d.version, d)
}

/// The checkpoint, if there is one (plain JSON, as `assignment.json` always
/// was).
pub fn read_checkpoint(r: &(impl Reader + ?Sized), cluster: &Path) -> io::Result<Option<Vec<u8>>> {
    match r.read_file(&checkpoint_path(cluster)) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Parse checkpoint bytes.
pub fn parse_checkpoint(cluster: &Path, b: &[u8]) -> io::Result<Assignment> {
    serde_json::from_slice(b).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", checkpoint_path(cluster).display()),
        )
    })
}

/// The newest assignment a reader can fold, and what stopped the fold.
#[derive(Debug, Clone, PartialEq)]
pub struct Current {
    /// The checkpoint with every complete version after it applied.
    pub assignment: Assignment,
    /// The version the fold started from (the checkpoint's; 0: none).
    pub checkpoint: u64,
    /// The version after the last applied one, if it exists but is torn.
    pub torn: Option<u64>,
}

/// Fold `a` forward: apply each complete version after it, in order, until
/// one is absent or torn (at most `limit` versions). Returns how many were
/// applied and the torn version met, if any.
pub fn fold_forward(
    r: &(impl Reader + ?Sized),
    cluster: &Path,
    a: &mut Assignment,
    limit: usize,
) -> io::Result<(usize, Option<u64>)> {
    let mut applied = 0;
    while applied < limit {
        match probe_fresh(r, cluster, a.version + 1)? {
            Probe::Found(d) => {
                d.apply_to(a);
                applied += 1;
            }
            Probe::Torn => return Ok((applied, Some(a.version + 1))),
            Probe::Absent => break,
        }
    }
    Ok((applied, None))
}

/// The newest assignment: the checkpoint (or an empty one at version 0)
/// folded forward through the history.
pub fn read_current(r: &(impl Reader + ?Sized), cluster: &Path) -> io::Result<Current> {
    let mut assignment = match read_checkpoint(r, cluster)? {
        Some(b) => parse_checkpoint(cluster, &b)?,
        None => Assignment::default(),
    };
    let checkpoint = assignment.version;
    let (_, torn) = fold_forward(r, cluster, &mut assignment, usize::MAX)?;
    Ok(Current {
        assignment,
        checkpoint,
        torn,
    })
}

/// What [`publish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// Created, written and durable.
    Won,
    /// The number was taken: read it and plan again.
    Taken,
}

/// Create version `d.version` exclusively and make it durable (see module
/// docs). On an error the version may or may not exist, torn or whole.
pub fn publish(fs: &dyn Fs, cluster: &Path, bytes: &[u8], version: u64) -> io::Result<Published> {
    let dir = history_dir(cluster);
    if !fs.is_dir(&dir) {
        fs.create_dir_all(&dir)?;
        fs.sync_dir(cluster)?;
    }
    let f = match fs.create_exclusive(&dir.join(assignment_version(version))) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(Published::Taken),
        Err(e) => return Err(e),
    };
    f.write_all_at(bytes, 0)?;
    f.sync_data()?;
    drop(f);
    fs.sync_dir(&dir)?;
    Ok(Published::Won)
}

/// Put a whole version `version` under its name, replacing a torn one
/// (temp → fsync → same-directory rename → directory fsync).
pub fn repair(fs: &dyn Fs, cluster: &Path, bytes: &[u8], version: u64) -> io::Result<()> {
    write_atomic(fs, &version_path(cluster, version), bytes)
}

/// Rewrite the head with `version` (temp → fsync → rename); only once that
/// version is durable.
pub fn write_head(fs: &dyn Fs, cluster: &Path, version: u64) -> io::Result<()> {
    write_atomic(
        fs,
        &history_dir(cluster).join(ASSIGNMENT_HEAD),
        format!("{version}\n").as_bytes(),
    )
}

/// The head's version number, if there is a (readable) head.
pub fn read_head(r: &(impl Reader + ?Sized), cluster: &Path) -> io::Result<Option<u64>> {
    match r.read_file(&history_dir(cluster).join(ASSIGNMENT_HEAD)) {
        Ok(b) => Ok(std::str::from_utf8(&b)
            .ok()
            .and_then(|s| s.trim().parse().ok())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Write the checkpoint (temp → fsync → rename). Only for an assignment
/// whose version is durable in the history.
pub fn write_checkpoint(fs: &dyn Fs, cluster: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic(fs, &checkpoint_path(cluster), bytes)
}

/// Remove every version below `below`, lowest first (so an existing version
/// implies every later one exists); stops at the first failure, which the
/// next pass retries. Returns how many were removed.
pub fn prune(fs: &dyn Fs, cluster: &Path, below: u64) -> io::Result<usize> {
    let dir = history_dir(cluster);
    let mut old: Vec<u64> = match fs.list(&dir) {
        Ok(names) => names
            .iter()
            .filter_map(|n| parse_assignment_version(n))
            .filter(|v| *v < below)
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    old.sort_unstable();
    let mut removed = 0;
    for v in old {
        match fs.remove_file(&dir.join(assignment_version(v))) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build fixtures with std::fs
mod tests {
    use super::*;
    use crate::cluster::records::{BrokerEndpoint, PartitionAssignment, TopicAssignment};
    use kaas_volume::fs::RealFs;

    fn topic(leader: i32) -> TopicAssignment {
        TopicAssignment {
            topic_id: uuid::Uuid::from_u128(leader as u128 + 1),
            configs: Default::default(),
            partitions: vec![PartitionAssignment {
                leader,
                incarnation: 1,
                epoch: 1,
                releasing: None,
            }],
            deleting: false,
        }
    }

    #[test]
    fn a_delta_turns_the_previous_version_into_the_next() {
        let mut a = Assignment::default();
        a.topics.insert("a".into(), topic(1));
        a.topics.insert("b".into(), topic(2));
        let mut b = a.clone();
        b.version = 1;
        b.controller_epoch = 3;
        b.topics.remove("a");
        b.topics.insert("c".into(), topic(3));
        b.brokers.push(BrokerEndpoint {
            id: 1,
            host: "h".into(),
            port: 1,
        });
        let d = AssignmentDelta::between(&a, &b);
        assert_eq!(d.removed, vec!["a".to_owned()]);
        assert_eq!(d.topics.keys().collect::<Vec<_>>(), vec!["c"]);
        assert!(d.coordinators.is_none());
        let mut folded = a.clone();
        d.apply_to(&mut folded);
        assert_eq!(folded, b);
    }

    #[test]
    fn readers_fold_from_the_checkpoint_and_stop_at_a_torn_version() {
        let d = tempfile::tempdir().unwrap();
        let c = d.path();
        // A legacy cluster: only the checkpoint.
        let mut a = Assignment {
            version: 4,
            controller_epoch: 1,
            ..Assignment::default()
        };
        write_checkpoint(&RealFs, c, &serde_json::to_vec(&a).unwrap()).unwrap();
        assert_eq!(read_current(&RealFs, c).unwrap().assignment, a);
        let mut next = a.clone();
        next.version = 5;
        next.topics.insert("t".into(), topic(1));
        let delta = AssignmentDelta::between(&a, &next);
        let bytes = encode_version(&delta);
        assert_eq!(publish(&RealFs, c, &bytes, 5).unwrap(), Published::Won);
        assert_eq!(publish(&RealFs, c, &bytes, 5).unwrap(), Published::Taken);
        let cur = read_current(&RealFs, c).unwrap();
        assert_eq!(
            (cur.assignment.clone(), cur.checkpoint, cur.torn),
            (next.clone(), 4, None)
        );
        // A torn version 6 stops the fold; a repaired one is applied.
        std::fs::write(version_path(c, 6), &b"kaas-versioned 6 "[..]).unwrap();
        assert_eq!(read_current(&RealFs, c).unwrap().torn, Some(6));
        a = next.clone();
        next.version = 6;
        next.topics.insert("u".into(), topic(2));
        let bytes = encode_version(&AssignmentDelta::between(&a, &next));
        repair(&RealFs, c, &bytes, 6).unwrap();
        assert_eq!(read_current(&RealFs, c).unwrap().assignment, next);
        // Pruned below a checkpoint: readers start from it.
        write_checkpoint(&RealFs, c, &serde_json::to_vec(&next).unwrap()).unwrap();
        assert_eq!(prune(&RealFs, c, 6).unwrap(), 1);
        assert_eq!(prune(&RealFs, c, 6).unwrap(), 0, "idempotent");
        let cur = read_current(&RealFs, c).unwrap();
        assert_eq!((cur.assignment, cur.checkpoint), (next, 6));
        // A version file naming another number is not that version.
        std::fs::copy(version_path(c, 6), version_path(c, 7)).unwrap();
        assert_eq!(probe(&RealFs, c, 7).unwrap(), Probe::Torn);
    }
}
