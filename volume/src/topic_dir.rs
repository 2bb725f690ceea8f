//! Topic directories on the data volume: create, stamp, rename-aside delete
//! and re-driven removal, as plain functions over the [`Fs`] seam. The
//! broker's `TopicCatalog` actor and the Kubernetes operator both call these.
//!
//! Names are not identities: a topic is its id (KIP-516), stamped in
//! `<data>/<topic>/.topic-id.json`. Delete is asked for with a
//! `.delete-requested-<id>` file in the directory; the controller vacates
//! every partition, then renames the directory aside to
//! `.deleted-<id>` (one same-directory rename: readers see the topic
//! or nothing) and then removes the tree; the removal is re-driven by every
//! [`Janitor`] pass until nothing is left. A re-created topic of the same
//! name therefore starts in an empty directory and never inherits an earlier
//! incarnation's segments. A directory with no stamp is adopted (stamped),
//! never reclaimed: unknown identity is not destructive.
//!
//! Four questions: create is one rename of a fully built `.creating-`
//! directory (1); delete is one rename, then an idempotent re-driven removal
//! (2); the catalog of one broker (or the operator) is the writer of a stamp,
//! and a stamp is written only into a directory being built or an unstamped
//! one (3); the stamp's id, not the name, identifies the topic (4).

use crate::fs::{remove_tree, write_atomic, Fs};
use crate::layout;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::Path;
use uuid::Uuid;

/// A topic's identity and configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicStamp {
    /// KIP-516 topic id.
    pub topic_id: Uuid,
    /// Topic name (also the directory name).
    pub name: String,
    /// Number of partitions.
    pub partitions: i32,
    /// Topic-level configs as given at creation (Kafka names).
    pub configs: BTreeMap<String, String>,
    /// Stamped by adoption of a directory nobody had stamped (its history
    /// is unknown): such a directory is never reclaimed, only reported.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
}

/// Errors of topic operations, each mapping to one Kafka code.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum TopicError {
    /// TOPIC_ALREADY_EXISTS (36)
    #[error("topic {0} already exists")]
    AlreadyExists(String),
    /// UNKNOWN_TOPIC_OR_PARTITION (3)
    #[error("unknown topic {0}")]
    Unknown(String),
    /// INVALID_TOPIC_EXCEPTION (17)
    #[error("invalid topic name {0:?}: {1}")]
    InvalidName(String, &'static str),
    /// INVALID_TOPIC_EXCEPTION (17): differs from an existing topic only
    /// in '.' versus '_' (their metric names would clash; Kafka refuses it).
    #[error("topic {name} collides with existing topic {existing}: '.' and '_' are interchangeable in metric names")]
    Collides {
        /// The name asked for.
        name: String,
        /// The existing topic it collides with.
        existing: String,
    },
    /// INVALID_PARTITIONS (37)
    #[error("invalid partition count {0}")]
    InvalidPartitions(i32),
    /// INVALID_PARTITIONS (37), with Kafka's explanation.
    #[error("{0}")]
    InvalidPartitionCount(String),
    /// INVALID_CONFIG (40)
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// KAFKA_STORAGE_ERROR (56)
    #[error("storage: {0}")]
    Storage(String),
}

impl From<io::Error> for TopicError {
    fn from(e: io::Error) -> Self {
        TopicError::Storage(e.to_string())
    }
}

/// Kafka's topic-name rule plus ours: no leading dot (our own scratch and
/// trash names start with one) and not the cluster directory.
pub fn validate_name(name: &str) -> Result<(), TopicError> {
    let bad = |why| Err(TopicError::InvalidName(name.to_owned(), why));
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > 249 {
        return bad("longer than 249 characters");
    }
    if name.starts_with('.') {
        return bad("names starting with '.' are reserved");
    }
    if name == layout::CLUSTER_DIR {
        return bad("reserved for cluster state");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return bad("only ASCII alphanumerics, '.', '_' and '-' are allowed");
    }
    Ok(())
}

/// Validate topic configs against what kaas implements; anything else is
/// refused with INVALID_CONFIG rather than accepted and ignored (see
/// [`crate::topic_config`]).
pub fn validate_configs(configs: &BTreeMap<String, String>) -> Result<(), TopicError> {
    crate::topic_config::validate_configs(configs)
}

/// Write `stamp` into the topic directory `dir` (temp → fsync → rename).
pub fn write_stamp(fs: &dyn Fs, dir: &Path, stamp: &TopicStamp) -> io::Result<()> {
    write_atomic(
        fs,
        &dir.join(layout::TOPIC_STAMP),
        &serde_json::to_vec_pretty(stamp).expect("stamp serializes"),
    )
}

/// The stamp of the topic directory `dir`: `Ok(None)` if it has none.
/// Stamps are written atomically, so an unparsable one is not a torn write:
/// it is reported, never guessed at.
pub fn read_stamp(fs: &dyn Fs, dir: &Path) -> io::Result<Option<Result<TopicStamp, String>>> {
    match fs.read(&dir.join(layout::TOPIC_STAMP)) {
        Ok(b) => Ok(Some(
            serde_json::from_slice::<TopicStamp>(&b).map_err(|e| e.to_string()),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Stamp an unstamped topic directory with a fresh id; the partition count
/// is one past the highest partition directory found (at least 1).
pub fn adopt(fs: &dyn Fs, data: &Path, name: &str) -> io::Result<TopicStamp> {
    let dir = data.join(name);
    let partitions = fs
        .list(&dir)?
        .iter()
        .filter_map(|p| layout::parse_partition(p))
        .max()
        .map(|m| m + 1)
        .unwrap_or(1);
    let stamp = TopicStamp {
        topic_id: Uuid::new_v4(),
        name: name.to_owned(),
        partitions,
        configs: BTreeMap::new(),
        adopted: true,
    };
    tracing::warn!(topic = %name, partitions, "adopting unstamped topic directory");
    write_stamp(fs, &dir, &stamp)?;
    Ok(stamp)
}

/// Every topic in `data` (with the partition count and configs in force):
/// stamped directories are read, unstamped ones
/// adopted; a directory with an unreadable stamp is logged and left alone.
pub fn scan(fs: &dyn Fs, data: &Path) -> Result<BTreeMap<String, TopicStamp>, TopicError> {
    let mut topics = BTreeMap::new();
    for name in fs.list(data)? {
        let dir = data.join(&name);
        if validate_name(&name).is_err() || !fs.is_dir(&dir) {
            continue;
        }
        match read_stamp(fs, &dir)? {
            Some(Ok(s)) => {
                // With the partition count and configs in force.
                let s = match crate::topic_config::read_topic(fs, &dir) {
                    Ok(Some(t)) if t.topic_id == s.topic_id => t,
                    Ok(_) => s,
                    Err(e) => {
                        tracing::warn!(topic = %name, error = %e, "topic state unreadable; the stamp's values are used");
                        s
                    }
                };
                topics.insert(name, s);
            }
            Some(Err(e)) => {
                tracing::error!(topic = %name, error = %e, "unreadable topic stamp; topic not served");
            }
            None => {
                let stamp = adopt(fs, data, &name)?;
                topics.insert(name, stamp);
            }
        }
    }
    Ok(topics)
}

/// The name with '.' and '_' made equal: two topics with the same key have
/// the same metric names, so Kafka refuses the second.
pub fn collision_key(name: &str) -> String {
    name.replace('.', "_")
}

/// The existing topic `name` collides with, if any. Only names with a '.'
/// or '_' can collide, so only they pay for listing the data directory.
/// A check-then-act, not a guarantee: two brokers creating `a.b` and `a_b`
/// at the same instant can both succeed (the clash is in metric names, not
/// in the data, so a best-effort check is what it needs).
fn colliding_topic(fs: &dyn Fs, data: &Path, name: &str) -> io::Result<Option<String>> {
    if !name.contains(['.', '_']) {
        return Ok(None);
    }
    let key = collision_key(name);
    Ok(fs.list(data)?.into_iter().find(|other| {
        other != name
            && other.contains(['.', '_'])
            && validate_name(other).is_ok()
            && collision_key(other) == key
    }))
}

/// Validate a create request and make the stamp it would write, without
/// touching the volume beyond one existence check (and, for a name with a
/// '.' or '_', one listing for the collision check).
pub fn plan_create(
    fs: &dyn Fs,
    data: &Path,
    name: &str,
    partitions: i32,
    configs: BTreeMap<String, String>,
) -> Result<TopicStamp, TopicError> {
    validate_name(name)?;
    if !(1..=100_000).contains(&partitions) {
        return Err(TopicError::InvalidPartitions(partitions));
    }
    validate_configs(&configs)?;
    // Another broker may have created (or deleted) it: ask the volume, not
    // a cached view. The final rename is what decides a race.
    if fs.is_dir(&data.join(name)) {
        return Err(TopicError::AlreadyExists(name.to_owned()));
    }
    if let Some(existing) = colliding_topic(fs, data, name)? {
        return Err(TopicError::Collides {
            name: name.to_owned(),
            existing,
        });
    }
    Ok(TopicStamp {
        topic_id: Uuid::new_v4(),
        name: name.to_owned(),
        partitions,
        configs,
        adopted: false,
    })
}

/// Create the topic `stamp` describes: build `.creating-<id>/`
/// holding the stamp, then rename it to `<name>` — one atomic step, so a
/// crash never leaves a half-created topic to be adopted with the wrong
/// shape; a [`Janitor`] removes an abandoned `.creating-` directory.
pub fn create(fs: &dyn Fs, data: &Path, stamp: &TopicStamp) -> Result<(), TopicError> {
    let name = stamp.name.as_str();
    let dir = data.join(name);
    let building = data.join(layout::creating_topic(stamp.topic_id));
    fs.create_dir_all(&building)?;
    write_stamp(fs, &building, stamp)?;
    let renamed = match fs.rename(&building, &dir) {
        // A lost reply to a rename that happened (DESIGN section 11) —
        // confirmed by our own topic id at the destination, not by the temp
        // name being gone (a janitor may have removed it).
        Err(e)
            if e.kind() == io::ErrorKind::NotFound
                && matches!(read_stamp(fs, &dir), Ok(Some(Ok(s))) if s.topic_id == stamp.topic_id) =>
        {
            Ok(())
        }
        r => r,
    };
    if let Err(e) = renamed {
        let _ = remove_tree(fs, &building);
        // An unstamped directory of that name appeared meanwhile.
        if fs.is_dir(&dir) && !fs.is_dir(&building) {
            return Err(TopicError::AlreadyExists(name.to_owned()));
        }
        return Err(e.into());
    }
    fs.sync_dir(data)?;
    Ok(())
}

/// Ask that topic `name` be deleted: create `.delete-requested-<id>` in its
/// directory (O_EXCL; an existing request is the same request). The
/// controller acts on it: it vacates every partition two-phase and only
/// then renames the directory aside ([`delete_incarnation`]). `expected`
/// (DeleteTopics by id) must match the stamp. Returns the stamp.
///
/// The request names the incarnation it deletes, so it is safe against
/// every interleaving with a delete and re-create of the same name: a
/// request landing in a newer incarnation's directory names the old id,
/// and the controller ignores a request whose id is not the stamp's.
pub fn request_delete(
    fs: &dyn Fs,
    data: &Path,
    name: &str,
    expected: Option<Uuid>,
) -> Result<TopicStamp, TopicError> {
    let dir = data.join(name);
    let stamp = match read_stamp(fs, &dir)? {
        Some(Ok(s)) => s,
        Some(Err(e)) => return Err(TopicError::Storage(format!("unreadable topic stamp: {e}"))),
        None => return Err(TopicError::Unknown(name.to_owned())),
    };
    if expected.is_some_and(|id| id != stamp.topic_id) {
        return Err(TopicError::Unknown(name.to_owned()));
    }
    match fs.create_exclusive(&dir.join(layout::delete_request(stamp.topic_id))) {
        // Existence is the whole request: nothing to write into it.
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        // Renamed aside meanwhile: already being deleted.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(stamp),
        Err(e) => return Err(e.into()),
    }
    fs.sync_dir(&dir)?;
    Ok(stamp)
}

/// Whether the incarnation `id` of the topic in `dir` was asked to be
/// deleted. A read error other than "absent" is an error, never a "no".
pub fn delete_requested(fs: &dyn Fs, dir: &Path, id: Uuid) -> io::Result<bool> {
    crate::fs::exists(fs, &dir.join(layout::delete_request(id)))
}

/// Delete incarnation `id` of topic `name` once nothing leads any of its
/// partitions (the controller's last step of a delete): rename the
/// directory aside to `.deleted-<id>`, then try once to remove the tree; a
/// [`Janitor`] pass re-drives an unfinished removal. `Ok(false)` if the
/// directory holds another incarnation or none (already renamed aside: a
/// lost reply, or a re-drive), or if its delete was never requested.
pub fn delete_incarnation(fs: &dyn Fs, data: &Path, name: &str, id: Uuid) -> io::Result<bool> {
    // The stamp by exact name: the directory may be another incarnation.
    match read_stamp(fs, &data.join(name))? {
        Some(Ok(s)) if s.topic_id == id => {}
        _ => return Ok(false),
    }
    // Only a delete that was asked for removes anything: a topic the
    // controller merely failed to see (a stale listing) is let go, never
    // destroyed.
    if !delete_requested(fs, &data.join(name), id)? {
        return Ok(false);
    }
    let aside = data.join(layout::deleted_topic(id));
    match fs.rename(&data.join(name), &aside) {
        Ok(()) => {}
        // A lost reply to a rename that happened: check, don't assume.
        Err(e) if e.kind() == io::ErrorKind::NotFound && fs.is_dir(&aside) => {}
        Err(e) => return Err(e),
    }
    fs.sync_dir(data)?;
    if let Err(e) = remove_tree(fs, &aside) {
        tracing::warn!(topic = %name, error = %e, "topic tree removal incomplete; janitor will retry");
    }
    Ok(true)
}

/// Grow topic `name` to `partitions` (CreatePartitions): publish the new
/// count as the topic's next state version ([`crate::topic_config::update`],
/// a compare-and-set on the version, so a grow is judged against the
/// newest count even when another broker grew the topic an instant
/// before); the controller grants the new partitions on its next pass like
/// any other. Only growth: a count not above the current one is
/// INVALID_PARTITIONS. Returns the new stamp and the old count.
pub fn grow(
    fs: &dyn Fs,
    data: &Path,
    name: &str,
    partitions: i32,
    validate_only: bool,
) -> Result<(TopicStamp, i32), TopicError> {
    grow_with(
        fs,
        data,
        name,
        partitions,
        validate_only,
        crate::versioned::Timing::default(),
    )
}

/// [`grow`] with explicit timing (tests).
pub fn grow_with(
    fs: &dyn Fs,
    data: &Path,
    name: &str,
    partitions: i32,
    validate_only: bool,
    timing: crate::versioned::Timing,
) -> Result<(TopicStamp, i32), TopicError> {
    validate_name(name).map_err(|_| TopicError::Unknown(name.to_owned()))?;
    let mut old = 0;
    let change = |st: &mut crate::topic_config::TopicState| {
        old = st.partitions;
        if partitions <= old {
            return Err(TopicError::InvalidPartitionCount(format!(
                "topic {name} has {old} partitions; the new count must be greater (partitions can only be added), got {partitions}"
            )));
        }
        if partitions > 100_000 {
            return Err(TopicError::InvalidPartitions(partitions));
        }
        st.partitions = partitions;
        Ok(())
    };
    let stamp = crate::topic_config::update(fs, data, name, timing, change, validate_only)?;
    Ok((stamp, old))
}

/// Re-drives the removal of renamed-aside topics and abandoned creates.
/// Keeps the `.creating-` directories seen by its previous pass: only those
/// are abandoned (another broker may be building one right now).
#[derive(Debug, Default)]
pub struct Janitor {
    creating_seen: HashSet<String>,
}

impl Janitor {
    /// One pass. Idempotent; failures are retried on the next pass, never
    /// forgotten.
    pub fn pass(&mut self, fs: &dyn Fs, data: &Path) {
        let Ok(names) = fs.list(data) else {
            return;
        };
        // A `.creating-` directory may be another broker's create in
        // progress: remove it only once it has survived a whole pass
        // interval (timed by us; no clocks compared).
        let now: HashSet<String> = names
            .iter()
            .filter(|n| layout::is_creating_topic(n))
            .cloned()
            .collect();
        let abandoned: Vec<String> = now.intersection(&self.creating_seen).cloned().collect();
        self.creating_seen = now;
        for name in names
            .iter()
            .filter(|n| layout::is_deleted_topic(n))
            .chain(abandoned.iter())
        {
            if let Err(e) = remove_tree(fs, &data.join(name)) {
                tracing::warn!(dir = %name, error = %e, "deleted topic not yet removed; will retry");
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build fixtures with std::fs
mod tests {
    use super::*;
    use crate::fs::fault::FaultFs;
    use crate::fs::RealFs;

    fn create_named(fs: &dyn Fs, data: &Path, name: &str) -> TopicStamp {
        let s = plan_create(fs, data, name, 1, BTreeMap::new()).unwrap();
        create(fs, data, &s).unwrap();
        s
    }

    /// A requested delete and the controller's last step, for whatever
    /// incarnation `name` holds.
    fn delete(fs: &dyn Fs, data: &Path, name: &str) -> Result<TopicStamp, TopicError> {
        let s = request_delete(fs, data, name, None)?;
        delete_incarnation(fs, data, name, s.topic_id)?;
        Ok(s)
    }

    /// Catches: a delete request that lands in (and so deletes) a newer
    /// incarnation of the same name, or one that is lost in a crash after
    /// it was answered.
    #[test]
    fn a_delete_request_names_its_incarnation_and_survives_a_crash_at_every_step() {
        let d = tempfile::tempdir().unwrap();
        let a = create_named(&RealFs, d.path(), "t");
        let dir = d.path().join("t");
        assert!(!delete_requested(&RealFs, &dir, a.topic_id).unwrap());
        assert_eq!(
            request_delete(&RealFs, d.path(), "t", Some(Uuid::from_u128(1))),
            Err(TopicError::Unknown("t".into())),
            "by id: another incarnation's id is unknown"
        );
        assert!(
            !delete_incarnation(&RealFs, d.path(), "t", a.topic_id).unwrap(),
            "never removed unless asked for (a topic missing from a listing is not deleted)"
        );
        assert!(dir.is_dir());
        assert_eq!(request_delete(&RealFs, d.path(), "t", None).unwrap(), a);
        // Idempotent: asking again is the same request.
        assert_eq!(
            request_delete(&RealFs, d.path(), "t", Some(a.topic_id)).unwrap(),
            a
        );
        assert!(delete_requested(&RealFs, &dir, a.topic_id).unwrap());
        assert_eq!(
            request_delete(&RealFs, d.path(), "nope", None),
            Err(TopicError::Unknown("nope".into()))
        );
        // The request moves aside with its directory; a re-created topic
        // starts with none, and the old one's request would not name it.
        assert!(delete_incarnation(&RealFs, d.path(), "t", a.topic_id).unwrap());
        assert!(!delete_incarnation(&RealFs, d.path(), "t", a.topic_id).unwrap());
        let b = create_named(&RealFs, d.path(), "t");
        assert!(!delete_requested(&RealFs, &dir, b.topic_id).unwrap());
        std::fs::write(dir.join(layout::delete_request(a.topic_id)), b"").unwrap();
        assert!(!delete_requested(&RealFs, &dir, b.topic_id).unwrap());
        assert!(
            !delete_incarnation(&RealFs, d.path(), "t", a.topic_id).unwrap(),
            "the old incarnation's delete never removes the new one"
        );
        assert!(dir.is_dir());

        // Crash at every step of the request: once answered it is durable;
        // unanswered, a retry completes it.
        let count = {
            let d = tempfile::tempdir().unwrap();
            create_named(&RealFs, d.path(), "t");
            let ffs = FaultFs::new();
            request_delete(&ffs, d.path(), "t", None).unwrap();
            ffs.ops()
        };
        assert!(count >= 2, "create and directory sync");
        for n in 1..=count {
            let d = tempfile::tempdir().unwrap();
            let s = create_named(&RealFs, d.path(), "t");
            let ffs = FaultFs::new();
            ffs.crash_at(n);
            assert!(
                request_delete(&ffs, d.path(), "t", None).is_err(),
                "step {n}"
            );
            ffs.power_loss();
            request_delete(&RealFs, d.path(), "t", None).unwrap();
            assert!(delete_requested(&RealFs, &d.path().join("t"), s.topic_id).unwrap());
        }
    }

    /// Catches: a removal that gives up on an NFS silly-renamed file (a
    /// reader still had a segment open) and leaves the tree forever, or one
    /// that stops at the first busy file.
    #[test]
    fn a_silly_renamed_file_delays_the_removal_but_never_stops_it() {
        let d = tempfile::tempdir().unwrap();
        let ffs = FaultFs::new();
        ffs.silly_rename(true);
        let s = create_named(&ffs, d.path(), "t");
        request_delete(&ffs, d.path(), "t", None).unwrap();
        ffs.create_dir_all(&d.path().join("t/0")).unwrap();
        for f in ["a.log", "b.log"] {
            let w = ffs.create_exclusive(&d.path().join("t/0").join(f)).unwrap();
            w.write_all_at(b"x", 0).unwrap();
        }
        let reader = ffs.open_read(&d.path().join("t/0/a.log")).unwrap();
        assert!(delete_incarnation(&ffs, d.path(), "t", s.topic_id).unwrap());
        let aside = d.path().join(layout::deleted_topic(s.topic_id));
        let left = |p: &Path| std::fs::read_dir(p).unwrap().count();
        assert!(
            aside.is_dir(),
            "busy: the tree stays until the reader closes"
        );
        assert_eq!(left(&aside.join("0")), 1, "everything else is gone");
        let mut j = Janitor::default();
        j.pass(&ffs, d.path());
        assert!(aside.is_dir());
        drop(reader);
        j.pass(&ffs, d.path());
        assert!(!aside.exists());
        assert_eq!(left(d.path()), 0);
    }

    #[test]
    fn names_and_configs_are_validated() {
        assert!(validate_name("a.b_c-1").is_ok());
        for bad in ["", ".x", "..", "__cluster", "a/b", "a b"] {
            assert!(matches!(
                validate_name(bad),
                Err(TopicError::InvalidName(..))
            ));
        }
        let mut c = BTreeMap::new();
        c.insert("cleanup.policy".to_string(), "compact".to_string());
        assert!(matches!(
            validate_configs(&c),
            Err(TopicError::InvalidConfig(_))
        ));
    }

    #[test]
    fn unstamped_directory_is_adopted_not_reclaimed() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("legacy/2")).unwrap();
        std::fs::write(d.path().join("legacy/2/keep"), b"x").unwrap();
        let topics = scan(&RealFs, d.path()).unwrap();
        assert_eq!(topics["legacy"].partitions, 3);
        assert!(d.path().join("legacy/2/keep").exists());
        // Adopted once: the next scan reads the same id back.
        assert_eq!(scan(&RealFs, d.path()).unwrap()["legacy"], topics["legacy"]);
    }

    /// Catches: a crash in the middle of a create leaving a topic directory
    /// without its stamp (adopted later with the wrong shape and id), or a
    /// `.creating-` directory the janitor never removes.
    #[test]
    fn crash_at_every_step_of_create_converges() {
        let count = {
            let d = tempfile::tempdir().unwrap();
            let ffs = FaultFs::new();
            create_named(&ffs, d.path(), "t");
            ffs.ops()
        };
        for n in 1..=count {
            let d = tempfile::tempdir().unwrap();
            let ffs = FaultFs::new();
            let s = plan_create(&ffs, d.path(), "t", 4, BTreeMap::new()).unwrap();
            ffs.crash_at(n);
            let _ = create(&ffs, d.path(), &s);
            ffs.power_loss();
            let topics = scan(&RealFs, d.path()).unwrap();
            if let Some(t) = topics.get("t") {
                assert_eq!(t, &s, "step {n}: a present topic has its own stamp");
            }
            let mut j = Janitor::default();
            j.pass(&RealFs, d.path());
            j.pass(&RealFs, d.path());
            let left: Vec<_> = std::fs::read_dir(d.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert!(
                left.is_empty() || left == ["t"],
                "step {n}: {left:?} ({:?})",
                ffs.log()
            );
        }
    }

    #[test]
    fn crash_at_every_step_of_delete_converges() {
        let count = {
            let d = tempfile::tempdir().unwrap();
            let ffs = FaultFs::new();
            create_named(&ffs, d.path(), "t");
            std::fs::create_dir_all(d.path().join("t/0")).unwrap();
            std::fs::write(d.path().join("t/0/seg.log"), b"x").unwrap();
            let before = ffs.ops();
            delete(&ffs, d.path(), "t").unwrap();
            ffs.ops() - before
        };
        for n in 1..=count {
            let d = tempfile::tempdir().unwrap();
            let ffs = FaultFs::new();
            create_named(&ffs, d.path(), "t");
            std::fs::create_dir_all(d.path().join("t/0")).unwrap();
            std::fs::write(d.path().join("t/0/seg.log"), b"x").unwrap();
            ffs.crash_at(ffs.ops() + n);
            let _ = delete(&ffs, d.path(), "t");
            ffs.power_loss();
            // Restart: the topic is either fully present or gone, and a
            // pending removal is re-driven to completion.
            let present = scan(&RealFs, d.path()).unwrap().contains_key("t");
            Janitor::default().pass(&RealFs, d.path());
            if present {
                assert!(d.path().join("t/0/seg.log").exists(), "step {n}");
                delete(&RealFs, d.path(), "t").unwrap();
            }
            let left: Vec<_> = std::fs::read_dir(d.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert!(left.is_empty(), "step {n}: {left:?}");
        }
    }

    /// Catches: `.creating-<name>-<id>` / `.deleted-<name>-<id>` passing the
    /// 255-byte file-name limit for names of 209-249 characters (valid in
    /// Kafka), which failed with "File name too long".
    #[test]
    fn longest_valid_name_is_created_deleted_and_recreated() {
        let d = tempfile::tempdir().unwrap();
        let name = "n".repeat(249);
        let a = create_named(&RealFs, d.path(), &name);
        assert_eq!(scan(&RealFs, d.path()).unwrap()[&name], a);
        assert_eq!(delete(&RealFs, d.path(), &name).unwrap(), a);
        let b = create_named(&RealFs, d.path(), &name);
        assert_ne!(a.topic_id, b.topic_id);
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![name]);
    }

    /// Catches: `a.b` and `a_b` coexisting (their metric names clash).
    #[test]
    fn names_differing_only_in_dot_and_underscore_collide() {
        let d = tempfile::tempdir().unwrap();
        create_named(&RealFs, d.path(), "a.b");
        assert_eq!(
            plan_create(&RealFs, d.path(), "a_b", 1, BTreeMap::new()),
            Err(TopicError::Collides {
                name: "a_b".into(),
                existing: "a.b".into()
            })
        );
        create_named(&RealFs, d.path(), "x_y.z");
        assert!(matches!(
            plan_create(&RealFs, d.path(), "x.y_z", 1, BTreeMap::new()),
            Err(TopicError::Collides { .. })
        ));
        // Same name: already exists, not a collision; others are fine.
        assert_eq!(
            plan_create(&RealFs, d.path(), "a.b", 1, BTreeMap::new()),
            Err(TopicError::AlreadyExists("a.b".into()))
        );
        for ok in ["a-b", "ab", "a.b.c", "b.a"] {
            plan_create(&RealFs, d.path(), ok, 1, BTreeMap::new()).unwrap();
        }
    }

    /// Catches: CreatePartitions shrinking a topic, or writing anything
    /// under validate_only.
    #[test]
    fn grow_only_grows_and_keeps_the_identity() {
        let d = tempfile::tempdir().unwrap();
        let s = create_named(&RealFs, d.path(), "t");
        for n in [0, 1] {
            assert!(matches!(
                grow(&RealFs, d.path(), "t", n, false),
                Err(TopicError::InvalidPartitionCount(_))
            ));
        }
        let (v, old) = grow(&RealFs, d.path(), "t", 3, true).unwrap();
        assert_eq!((v.partitions, old), (3, 1));
        assert_eq!(scan(&RealFs, d.path()).unwrap()["t"].partitions, 1);
        grow(&RealFs, d.path(), "t", 3, false).unwrap();
        let now = &scan(&RealFs, d.path()).unwrap()["t"];
        assert_eq!((now.partitions, now.topic_id), (3, s.topic_id));
        assert_eq!(
            grow(&RealFs, d.path(), "nope", 3, false),
            Err(TopicError::Unknown("nope".into()))
        );
    }

    /// Leftovers of an older version, named with the topic, are still
    /// removed.
    #[test]
    fn janitor_removes_old_form_leftovers() {
        let d = tempfile::tempdir().unwrap();
        let id = "00000000-0000-0000-0000-000000000002";
        let deleted = d.path().join(format!(".deleted-t-{id}"));
        let creating = d.path().join(format!(".creating-t-{id}"));
        std::fs::create_dir_all(deleted.join("0")).unwrap();
        std::fs::create_dir_all(&creating).unwrap();
        let mut j = Janitor::default();
        j.pass(&RealFs, d.path());
        assert!(!deleted.exists());
        j.pass(&RealFs, d.path());
        assert!(!creating.exists());
    }

    #[test]
    fn janitor_spares_a_fresh_creating_dir_and_removes_an_abandoned_one() {
        let d = tempfile::tempdir().unwrap();
        let building = d.path().join(layout::creating_topic(
            "00000000-0000-0000-0000-000000000001",
        ));
        std::fs::create_dir_all(&building).unwrap();
        let mut j = Janitor::default();
        j.pass(&RealFs, d.path());
        assert!(building.exists(), "removed a create in progress");
        j.pass(&RealFs, d.path());
        assert!(!building.exists(), "abandoned create never removed");
    }
}
