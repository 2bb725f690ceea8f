//! `TopicCatalog`: the actor that owns every topic's identity stamp,
//! `<data>/<topic>/.topic-id.json` (KIP-516 topic id, partition count,
//! topic configs at creation) and versioned state
//! `<data>/<topic>/.topic-state/` (altered configs, partition count), and
//! the create / grow / delete
//! lifecycle of topic directories.
//!
//! The directory operations themselves (create via `.creating-` + rename,
//! stamp, rename-aside delete, re-driven removal, adoption of unstamped
//! directories) are plain functions in [`kaas_volume::topic_dir`], shared
//! with the operator; this actor serialises them for one broker, keeps the
//! read view request handlers use, and runs the janitor every 30 s.

use crate::telemetry::{ActorStats, Mailbox, MessageName};
use actix::prelude::*;
use kaas_volume::fs::SharedFs;
use kaas_volume::topic_config;
pub use kaas_volume::topic_config::AlterOp;
use kaas_volume::topic_dir::{self, Janitor};
pub use kaas_volume::topic_dir::{validate_configs, validate_name, TopicError, TopicStamp};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// File name of the identity stamp inside a topic directory.
pub const STAMP: &str = kaas_volume::layout::TOPIC_STAMP;

/// The read side shared with request handlers (metadata, produce routing).
pub type TopicsView = Arc<RwLock<BTreeMap<String, TopicStamp>>>;

/// See module docs.
pub struct TopicCatalog {
    fs: SharedFs,
    data_dir: PathBuf,
    view: TopicsView,
    janitor: std::sync::Mutex<Janitor>,
    /// The cluster directory, where change notices are posted for the
    /// controller ([`kaas_volume::topic_notice`]); `None` in tests of the
    /// catalog alone.
    notices: Option<PathBuf>,
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
            janitor: Default::default(),
            notices: None,
        };
        cat.reload()?;
        cat.janitor();
        Ok(cat)
    }

    /// Post a change notice to the controller in `cluster_dir` after every
    /// change this catalog makes.
    pub fn with_notices(mut self, cluster_dir: &Path) -> Self {
        self.notices = Some(cluster_dir.to_path_buf());
        self
    }

    /// Tell the controller that `stamp`'s topic changed (after the change is
    /// durable). Best effort: a notice only makes the controller notice
    /// sooner; its slow full re-read covers a lost one.
    fn notify(&self, stamp: &TopicStamp, delete: bool) {
        let Some(cluster) = &self.notices else { return };
        let n = kaas_volume::topic_notice::Notice {
            topic: stamp.name.clone(),
            topic_id: Some(stamp.topic_id),
            delete,
        };
        if let Err(e) = kaas_volume::topic_notice::post(self.fs.as_ref(), cluster, &n) {
            tracing::warn!(topic = %stamp.name, error = %e, "topic change notice not posted; the controller's full re-read will see the change");
        }
    }

    /// Re-read the stamps from the volume.
    pub fn reload(&self) -> Result<(), TopicError> {
        let topics = topic_dir::scan(self.fs.as_ref(), &self.data_dir)?;
        *self.view.write().unwrap() = topics;
        Ok(())
    }

    /// Remove renamed-aside topic trees and abandoned creates. Idempotent;
    /// failures are retried on the next tick, never forgotten.
    pub fn janitor(&self) {
        self.janitor
            .lock()
            .unwrap()
            .pass(self.fs.as_ref(), &self.data_dir);
    }

    /// Shared read view.
    pub fn view(&self) -> TopicsView {
        self.view.clone()
    }

    /// Create a topic (see [`topic_dir::create`]).
    pub fn create(
        &self,
        name: &str,
        partitions: i32,
        configs: BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<TopicStamp, TopicError> {
        let stamp =
            topic_dir::plan_create(self.fs.as_ref(), &self.data_dir, name, partitions, configs)?;
        if validate_only {
            return Ok(stamp);
        }
        topic_dir::create(self.fs.as_ref(), &self.data_dir, &stamp)?;
        self.notify(&stamp, false);
        self.view
            .write()
            .unwrap()
            .insert(name.to_owned(), stamp.clone());
        Ok(stamp)
    }

    /// Ask for a topic's deletion (see [`topic_dir::request_delete`]): the
    /// controller vacates its partitions and then removes the directory.
    pub fn request_delete(
        &self,
        name: &str,
        id: Option<uuid::Uuid>,
    ) -> Result<TopicStamp, TopicError> {
        let stamp = topic_dir::request_delete(self.fs.as_ref(), &self.data_dir, name, id)?;
        self.notify(&stamp, true);
        Ok(stamp)
    }

    /// Alter a topic's configs (see [`topic_config::alter`]): `ops` are
    /// applied to the set in force, or `replace` becomes the whole set
    /// (AlterConfigs). Returns the stamp with the new set.
    pub fn alter_configs(&self, m: AlterTopicConfigs) -> Result<TopicStamp, TopicError> {
        // Applied again to a newer set if another broker's change lands
        // first (see `kaas_volume::versioned`).
        let change = |cur: &BTreeMap<String, String>| match &m.change {
            ConfigChange::Incremental(ops) => topic_config::apply_ops(cur, ops),
            ConfigChange::Replace(all) => {
                for k in all.keys() {
                    if topic_config::key(k).is_none() {
                        return Err(TopicError::InvalidConfig(format!(
                            "unknown or unsupported topic config {k}"
                        )));
                    }
                }
                Ok(all.clone())
            }
        };
        let stamp = topic_config::alter(
            self.fs.as_ref(),
            &self.data_dir,
            &m.name,
            change,
            m.validate_only,
        )?;
        if !m.validate_only {
            tracing::info!(topic = %m.name, configs = ?stamp.configs, "topic configs altered");
            self.notify(&stamp, false);
        }
        Ok(stamp)
    }

    /// Grow a topic (see [`topic_dir::grow`]); the stamp and the old count.
    pub fn grow(
        &self,
        name: &str,
        partitions: i32,
        validate_only: bool,
    ) -> Result<(TopicStamp, i32), TopicError> {
        let (stamp, old) = topic_dir::grow(
            self.fs.as_ref(),
            &self.data_dir,
            name,
            partitions,
            validate_only,
        )?;
        if !validate_only {
            tracing::info!(topic = %name, from = old, to = partitions, "topic partitions added");
            self.notify(&stamp, false);
            self.view
                .write()
                .unwrap()
                .insert(name.to_owned(), stamp.clone());
        }
        Ok((stamp, old))
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

/// How an alter changes a topic's configs.
#[derive(Debug, Clone)]
pub enum ConfigChange {
    /// IncrementalAlterConfigs: changes to the set in force.
    Incremental(Vec<(String, AlterOp)>),
    /// AlterConfigs: the new complete set (keys not named revert to their
    /// defaults, as in Kafka).
    Replace(BTreeMap<String, String>),
}

/// Alter a topic's configs (AlterConfigs, IncrementalAlterConfigs).
#[derive(Message)]
#[rtype(result = "Result<TopicStamp, TopicError>")]
pub struct AlterTopicConfigs {
    /// Topic name.
    pub name: String,
    /// The change.
    pub change: ConfigChange,
    /// Validate only; write nothing.
    pub validate_only: bool,
}

/// Add partitions to a topic (CreatePartitions).
#[derive(Message)]
#[rtype(result = "Result<(TopicStamp, i32), TopicError>")]
pub struct GrowTopic {
    /// Topic name.
    pub name: String,
    /// The new total partition count.
    pub partitions: i32,
    /// Validate only; write nothing.
    pub validate_only: bool,
}

/// Change the client quotas (AlterClientQuotas): a new version in `dir`
/// (see [`kaas_volume::quotas`]), written through the catalog's
/// lease-guarded seam. `change` validates and applies the operations.
#[derive(Message)]
#[rtype(result = "Result<kaas_volume::quotas::Quotas, String>")]
pub struct AlterQuotas {
    /// `<cluster>/quotas`.
    pub dir: PathBuf,
    /// The operations, applied to the newest version (possibly again, if
    /// another broker's change lands first).
    #[allow(clippy::type_complexity)]
    pub change: Box<dyn FnMut(&mut kaas_volume::quotas::Quotas) -> Result<(), String> + Send>,
}

impl Handler<AlterQuotas> for TopicCatalog {
    type Result = Result<kaas_volume::quotas::Quotas, String>;
    fn handle(&mut self, mut m: AlterQuotas, _: &mut Context<Self>) -> Self::Result {
        #[derive(Debug)]
        struct E(String);
        impl From<std::io::Error> for E {
            fn from(e: std::io::Error) -> Self {
                E(format!("storage: {e}"))
            }
        }
        kaas_volume::quotas::alter(self.fs.as_ref(), &m.dir, |q| (m.change)(q).map_err(E))
            .map(|(_, q)| q)
            .map_err(|E(e)| e)
    }
}

impl MessageName for AlterQuotas {
    const NAME: &'static str = "alter_quotas";
}

/// Ask for a topic's deletion (by name; by id too when `id` is set).
#[derive(Message)]
#[rtype(result = "Result<TopicStamp, TopicError>")]
pub struct RequestDelete {
    /// Name.
    pub name: String,
    /// The incarnation asked for (DeleteTopics v6 by id).
    pub id: Option<uuid::Uuid>,
}

impl TopicCatalog {
    /// Start the loaded catalog on `arbiter` (its own: topic creation and
    /// deletion are file I/O).
    pub fn start(self, data_dir: &Path, arbiter: &ArbiterHandle) -> Mailbox<Self> {
        let stats = ActorStats::register("topic_catalog", "0", data_dir.display().to_string());
        Mailbox::new(Self::start_in_arbiter(arbiter, |_| self), stats)
    }
}

impl Actor for TopicCatalog {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(std::time::Duration::from_secs(30), |a, _| a.janitor());
    }
}

impl MessageName for CreateTopic {
    const NAME: &'static str = "create_topic";
}

impl MessageName for RequestDelete {
    const NAME: &'static str = "request_delete";
}

impl MessageName for AlterTopicConfigs {
    const NAME: &'static str = "alter_topic_configs";
}

impl MessageName for GrowTopic {
    const NAME: &'static str = "grow_topic";
}

crate::instrumented!(
    TopicCatalog: CreateTopic,
    RequestDelete,
    AlterTopicConfigs,
    GrowTopic,
    AlterQuotas
);

impl Handler<AlterTopicConfigs> for TopicCatalog {
    type Result = Result<TopicStamp, TopicError>;
    fn handle(&mut self, m: AlterTopicConfigs, _: &mut Context<Self>) -> Self::Result {
        self.alter_configs(m)
    }
}

impl Handler<GrowTopic> for TopicCatalog {
    type Result = Result<(TopicStamp, i32), TopicError>;
    fn handle(&mut self, m: GrowTopic, _: &mut Context<Self>) -> Self::Result {
        self.grow(&m.name, m.partitions, m.validate_only)
    }
}

impl Handler<CreateTopic> for TopicCatalog {
    type Result = Result<TopicStamp, TopicError>;
    fn handle(&mut self, m: CreateTopic, _: &mut Context<Self>) -> Self::Result {
        self.create(&m.name, m.partitions, m.configs, m.validate_only)
    }
}

impl Handler<RequestDelete> for TopicCatalog {
    type Result = Result<TopicStamp, TopicError>;
    fn handle(&mut self, m: RequestDelete, _: &mut Context<Self>) -> Self::Result {
        self.request_delete(&m.name, m.id)
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build fixtures with std::fs
mod tests {
    use super::*;
    use kaas_volume::fs::RealFs;
    use std::sync::Arc;

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
        assert_eq!(cat.request_delete("t", None).unwrap(), a);
        // Only asked: the directory stays until the controller removes it.
        assert!(d.path().join("t/0/old.log").exists());
        assert!(topic_dir::delete_incarnation(fs.as_ref(), d.path(), "t", a.topic_id).unwrap());
        let b = cat.create("t", 1, BTreeMap::new(), false).unwrap();
        assert_ne!(a.topic_id, b.topic_id);
        assert!(!d.path().join("t/0/old.log").exists());
        let again = TopicCatalog::load(fs, d.path()).unwrap();
        assert_eq!(again.view().read().unwrap()["t"].topic_id, b.topic_id);
        assert_eq!(
            cat.request_delete("nope", None).unwrap_err(),
            TopicError::Unknown("nope".into())
        );
    }
}
