//! `TopicCatalog`: the actor that owns every topic's identity stamp,
//! `<data>/<topic>/.topic-id.json` (KIP-516 topic id, partition count,
//! topic configs), and the create/delete lifecycle of topic directories.
//!
//! Names are not identities: a topic is its id. Delete renames the directory
//! aside to `.deleted-<name>-<id>` (one same-directory rename: readers see the
//! topic or nothing) and then removes the tree; the removal is re-driven at
//! every start and every janitor tick until nothing is left. A re-created
//! topic of the same name therefore starts in an empty directory and never
//! inherits an earlier incarnation's segments. A directory with no stamp is
//! adopted (stamped), never reclaimed: unknown identity is not destructive.

use crate::fs::{remove_tree, write_atomic, SharedFs};
use actix::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use uuid::Uuid;

/// File name of the identity stamp inside a topic directory.
pub const STAMP: &str = ".topic-id.json";
const DELETED_PREFIX: &str = ".deleted-";
const CREATING_PREFIX: &str = ".creating-";

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
    /// INVALID_PARTITIONS (37)
    #[error("invalid partition count {0}")]
    InvalidPartitions(i32),
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
    if name == "__cluster" {
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
/// refused with INVALID_CONFIG rather than accepted and ignored.
pub fn validate_configs(configs: &BTreeMap<String, String>) -> Result<(), TopicError> {
    for (k, v) in configs {
        let int = |min: i64| -> Result<(), TopicError> {
            match v.parse::<i64>() {
                Ok(n) if n >= min => Ok(()),
                _ => Err(TopicError::InvalidConfig(format!(
                    "{k}={v}: expected an integer >= {min}"
                ))),
            }
        };
        match k.as_str() {
            "segment.bytes" => int(1024)?,
            "segment.ms" => int(1)?,
            "retention.ms" | "retention.bytes" => int(-1)?,
            "max.message.bytes" => int(0)?,
            "min.insync.replicas" => int(1)?,
            "cleanup.policy" if v == "delete" => {}
            "cleanup.policy" => {
                return Err(TopicError::InvalidConfig(format!(
                    "cleanup.policy={v}: only 'delete' is implemented"
                )))
            }
            "message.timestamp.type" if v == "CreateTime" => {}
            "message.timestamp.type" => {
                return Err(TopicError::InvalidConfig(format!(
                    "message.timestamp.type={v}: only CreateTime is implemented"
                )))
            }
            "compression.type" if v == "producer" => {}
            _ => {
                return Err(TopicError::InvalidConfig(format!(
                    "unknown or unsupported topic config {k}"
                )))
            }
        }
    }
    Ok(())
}

/// The read side shared with request handlers (metadata, produce routing).
pub type TopicsView = Arc<RwLock<BTreeMap<String, TopicStamp>>>;

/// See module docs.
pub struct TopicCatalog {
    fs: SharedFs,
    data_dir: PathBuf,
    view: TopicsView,
    /// `.creating-` directories seen by the previous janitor pass: only
    /// those are abandoned (another broker may be building one right now).
    creating_seen: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl TopicCatalog {
    /// Load every stamped topic, adopt unstamped ones, and re-drive pending
    /// deletions.
    pub fn load(fs: SharedFs, data_dir: &Path) -> Result<Self, TopicError> {
        fs.create_dir_all(data_dir)?;
        let cat = Self {
            fs,
            data_dir: data_dir.to_path_buf(),
            view: Arc::default(),
            creating_seen: Default::default(),
        };
        cat.reload()?;
        cat.janitor();
        Ok(cat)
    }

    /// Re-read the stamps from the volume.
    pub fn reload(&self) -> Result<(), TopicError> {
        let mut topics = BTreeMap::new();
        for name in self.fs.list(&self.data_dir)? {
            let dir = self.data_dir.join(&name);
            if validate_name(&name).is_err() || !self.fs.is_dir(&dir) {
                continue;
            }
            match self.fs.read(&dir.join(STAMP)) {
                Ok(bytes) => match serde_json::from_slice::<TopicStamp>(&bytes) {
                    Ok(s) => {
                        topics.insert(name, s);
                    }
                    Err(e) => {
                        // Stamps are written atomically, so this is not a
                        // torn write; refuse to guess and leave it alone.
                        tracing::error!(topic = %name, error = %e, "unreadable topic stamp; topic not served");
                    }
                },
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let partitions = self
                        .fs
                        .list(&dir)?
                        .iter()
                        .filter_map(|p| p.parse::<i32>().ok())
                        .max()
                        .map(|m| m + 1)
                        .unwrap_or(1);
                    let stamp = TopicStamp {
                        topic_id: Uuid::new_v4(),
                        name: name.clone(),
                        partitions,
                        configs: BTreeMap::new(),
                    };
                    tracing::warn!(topic = %name, partitions, "adopting unstamped topic directory");
                    self.write_stamp(&dir, &stamp)?;
                    topics.insert(name, stamp);
                }
                Err(e) => return Err(e.into()),
            }
        }
        *self.view.write().unwrap() = topics;
        Ok(())
    }

    /// Remove renamed-aside topic trees. Idempotent; failures are retried
    /// on the next tick, never forgotten.
    pub fn janitor(&self) {
        let Ok(names) = self.fs.list(&self.data_dir) else {
            return;
        };
        // A `.creating-` directory may be another broker's create in
        // progress: remove it only once it has survived a whole janitor
        // interval (timed by us; no clocks compared).
        let mut seen = self.creating_seen.lock().unwrap();
        let now: std::collections::HashSet<String> = names
            .iter()
            .filter(|n| n.starts_with(CREATING_PREFIX))
            .cloned()
            .collect();
        let abandoned: Vec<String> = now.intersection(&seen).cloned().collect();
        *seen = now;
        drop(seen);
        for name in names
            .iter()
            .filter(|n| n.starts_with(DELETED_PREFIX))
            .chain(abandoned.iter())
        {
            if let Err(e) = remove_tree(self.fs.as_ref(), &self.data_dir.join(name)) {
                tracing::warn!(dir = %name, error = %e, "deleted topic not yet removed; will retry");
            }
        }
    }

    /// Shared read view.
    pub fn view(&self) -> TopicsView {
        self.view.clone()
    }

    fn write_stamp(&self, dir: &Path, stamp: &TopicStamp) -> io::Result<()> {
        write_atomic(
            self.fs.as_ref(),
            &dir.join(STAMP),
            &serde_json::to_vec_pretty(stamp).expect("stamp serializes"),
        )
    }

    /// Create a topic: build `.creating-<name>-<id>/` holding the stamp, then
    /// rename it to `<name>` — one atomic step, so a crash never leaves a
    /// half-created topic to be adopted with the wrong shape; the janitor
    /// removes an abandoned `.creating-` directory.
    pub fn create(
        &self,
        name: &str,
        partitions: i32,
        configs: BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<TopicStamp, TopicError> {
        validate_name(name)?;
        if !(1..=100_000).contains(&partitions) {
            return Err(TopicError::InvalidPartitions(partitions));
        }
        validate_configs(&configs)?;
        // Another broker may have created (or deleted) it: ask the volume,
        // not our view. The final rename is what decides a race.
        if self.fs.is_dir(&self.data_dir.join(name)) {
            return Err(TopicError::AlreadyExists(name.to_owned()));
        }
        let stamp = TopicStamp {
            topic_id: Uuid::new_v4(),
            name: name.to_owned(),
            partitions,
            configs,
        };
        if validate_only {
            return Ok(stamp);
        }
        let dir = self.data_dir.join(name);
        let building = self
            .data_dir
            .join(format!("{CREATING_PREFIX}{name}-{}", stamp.topic_id));
        self.fs.create_dir_all(&building)?;
        self.write_stamp(&building, &stamp)?;
        let renamed = match self.fs.rename(&building, &dir) {
            // A lost reply to a rename that happened (DESIGN section 11) —
            // confirmed by our own topic id at the destination, not by the
            // temp name being gone (a janitor may have removed it).
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    && self
                        .fs
                        .read(&dir.join(STAMP))
                        .ok()
                        .and_then(|b| serde_json::from_slice::<TopicStamp>(&b).ok())
                        .is_some_and(|s| s.topic_id == stamp.topic_id) =>
            {
                Ok(())
            }
            r => r,
        };
        if let Err(e) = renamed {
            let _ = remove_tree(self.fs.as_ref(), &building);
            // An unstamped directory of that name appeared meanwhile.
            if self.fs.is_dir(&dir) && !self.fs.is_dir(&building) {
                return Err(TopicError::AlreadyExists(name.to_owned()));
            }
            return Err(e.into());
        }
        self.fs.sync_dir(&self.data_dir)?;
        self.view
            .write()
            .unwrap()
            .insert(name.to_owned(), stamp.clone());
        Ok(stamp)
    }

    /// Delete a topic (callers stop its partition leaders first).
    pub fn delete(&self, name: &str) -> Result<TopicStamp, TopicError> {
        // The stamp by exact name: another broker may have created it.
        let stamp = match self.fs.read(&self.data_dir.join(name).join(STAMP)) {
            Ok(b) => serde_json::from_slice::<TopicStamp>(&b)
                .map_err(|e| TopicError::Storage(format!("unreadable topic stamp: {e}")))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(TopicError::Unknown(name.to_owned()))
            }
            Err(e) => return Err(e.into()),
        };
        let aside = self
            .data_dir
            .join(format!("{DELETED_PREFIX}{name}-{}", stamp.topic_id));
        match self.fs.rename(&self.data_dir.join(name), &aside) {
            Ok(()) => {}
            // A lost reply to a rename that happened: check, don't assume.
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.fs.is_dir(&aside) => {}
            Err(e) => return Err(e.into()),
        }
        self.fs.sync_dir(&self.data_dir)?;
        self.view.write().unwrap().remove(name);
        if let Err(e) = remove_tree(self.fs.as_ref(), &aside) {
            tracing::warn!(topic = %name, error = %e, "topic tree removal incomplete; janitor will retry");
        }
        Ok(stamp)
    }
}

/// Create a topic.
#[derive(Message)]
#[rtype(result = "Result<TopicStamp, TopicError>")]
pub struct CreateTopic {
    /// Name.
    pub name: String,
    /// Partition count.
    pub partitions: i32,
    /// Configs.
    pub configs: BTreeMap<String, String>,
    /// CreateTopics validate_only.
    pub validate_only: bool,
}

/// Delete a topic.
#[derive(Message)]
#[rtype(result = "Result<TopicStamp, TopicError>")]
pub struct DeleteTopic {
    /// Name.
    pub name: String,
}

impl Actor for TopicCatalog {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(std::time::Duration::from_secs(30), |a, _| a.janitor());
    }
}

impl Handler<CreateTopic> for TopicCatalog {
    type Result = Result<TopicStamp, TopicError>;
    fn handle(&mut self, m: CreateTopic, _: &mut Context<Self>) -> Self::Result {
        self.create(&m.name, m.partitions, m.configs, m.validate_only)
    }
}

impl Handler<DeleteTopic> for TopicCatalog {
    type Result = Result<TopicStamp, TopicError>;
    fn handle(&mut self, m: DeleteTopic, _: &mut Context<Self>) -> Self::Result {
        self.delete(&m.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::fault::FaultFs;
    use crate::fs::RealFs;

    #[test]
    fn create_delete_recreate_gets_a_fresh_identity_and_directory() {
        let d = tempfile::tempdir().unwrap();
        let fs: SharedFs = Arc::new(RealFs);
        let cat = TopicCatalog::load(fs.clone(), d.path()).unwrap();
        let a = cat.create("t", 2, BTreeMap::new(), false).unwrap();
        std::fs::create_dir_all(d.path().join("t/0")).unwrap();
        std::fs::write(d.path().join("t/0/old.log"), b"old").unwrap();
        assert_eq!(
            cat.create("t", 1, BTreeMap::new(), false),
            Err(TopicError::AlreadyExists("t".into()))
        );
        cat.delete("t").unwrap();
        let b = cat.create("t", 1, BTreeMap::new(), false).unwrap();
        assert_ne!(a.topic_id, b.topic_id);
        assert!(!d.path().join("t/0/old.log").exists());
        let again = TopicCatalog::load(fs, d.path()).unwrap();
        assert_eq!(again.view().read().unwrap()["t"].topic_id, b.topic_id);
        assert_eq!(
            cat.delete("nope").unwrap_err(),
            TopicError::Unknown("nope".into())
        );
    }

    /// Catches: a janitor (of any broker) removing a `.creating-` directory
    /// that another broker is building right now — that broker's create then
    /// failed, or worse, was reported done for a topic that never appeared.
    #[test]
    fn janitor_spares_a_fresh_creating_dir_and_removes_an_abandoned_one() {
        let d = tempfile::tempdir().unwrap();
        let fs: SharedFs = Arc::new(RealFs);
        let cat = TopicCatalog::load(fs, d.path()).unwrap();
        let building = d
            .path()
            .join(".creating-x-00000000-0000-0000-0000-000000000001");
        std::fs::create_dir_all(&building).unwrap();
        cat.janitor();
        assert!(building.exists(), "removed a create in progress");
        cat.janitor();
        assert!(!building.exists(), "abandoned create never removed");
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
        let cat = TopicCatalog::load(Arc::new(RealFs), d.path()).unwrap();
        assert_eq!(cat.view().read().unwrap()["legacy"].partitions, 3);
        assert!(d.path().join("legacy/2/keep").exists());
    }

    #[test]
    fn crash_at_every_step_of_delete_converges() {
        let count = {
            let d = tempfile::tempdir().unwrap();
            let ffs = FaultFs::new();
            let cat = TopicCatalog::load(Arc::new(ffs.clone()), d.path()).unwrap();
            cat.create("t", 1, BTreeMap::new(), false).unwrap();
            std::fs::create_dir_all(d.path().join("t/0")).unwrap();
            std::fs::write(d.path().join("t/0/seg.log"), b"x").unwrap();
            let before = ffs.ops();
            cat.delete("t").unwrap();
            ffs.ops() - before
        };
        for n in 1..=count {
            let d = tempfile::tempdir().unwrap();
            let ffs = FaultFs::new();
            let cat = TopicCatalog::load(Arc::new(ffs.clone()), d.path()).unwrap();
            cat.create("t", 1, BTreeMap::new(), false).unwrap();
            std::fs::create_dir_all(d.path().join("t/0")).unwrap();
            std::fs::write(d.path().join("t/0/seg.log"), b"x").unwrap();
            ffs.crash_at(ffs.ops() + n);
            let _ = cat.delete("t");
            ffs.power_loss();
            // Restart: the topic is either fully present or gone, and a
            // pending removal is re-driven to completion.
            let cat = TopicCatalog::load(Arc::new(RealFs), d.path()).unwrap();
            let names: Vec<_> = std::fs::read_dir(d.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            let present = cat.view().read().unwrap().contains_key("t");
            if present {
                assert!(d.path().join("t/0/seg.log").exists(), "step {n}");
                cat.delete("t").unwrap();
            }
            let names_after: Vec<_> = std::fs::read_dir(d.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert!(
                names_after.is_empty(),
                "step {n}: {names:?} -> {names_after:?}"
            );
        }
    }
}
