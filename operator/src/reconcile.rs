//! Reconcile one `KafkaTopic`: a pure decision ([`decide`]) from the
//! resource, the other resources naming the same topic and the topic
//! directory's stamp, then its execution ([`reconcile`]): at most one Kafka
//! admin request, then a status patch only when the status changed.
//!
//! Division of labour (see ARCHITECTURE.md, "Operator"): the brokers own
//! topic directories — their controller creates, stamps, deletes (rename
//! aside, re-driven removal) and adopts unstamped ones, all in
//! `kaas_volume::topic_dir`. The operator only *reads* stamps, with that
//! same crate, to learn a topic's id and incarnation; every change goes to
//! the brokers as a Kafka admin request. So the substrate review is short:
//! the operator writes no file (its mount is read-only), and a stamp is
//! written atomically by its one writer, so a read sees a whole one or none.
//!
//! Every step is idempotent and re-driven by the controller's requeue:
//! CreateTopics treats TOPIC_ALREADY_EXISTS as done, DeleteTopics treats
//! UNKNOWN_TOPIC as done, the finalizer goes only after the delete
//! succeeded, and the status records the stamp only after reading it.

use crate::admin::{Admin, AdminError};
use crate::crd::{Condition, KafkaTopic, KafkaTopicStatus, FINALIZER};
use crate::lease::{Fence, NotLeader};
use crate::metrics::Metrics;
use kaas_volume::topic_dir::{self, TopicStamp};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Field manager of every patch the operator sends.
pub const MANAGER: &str = "kaas-operator";

/// Everything a reconcile needs.
pub struct Context {
    /// Kubernetes API client.
    pub client: kube::Client,
    /// The brokers' admin API.
    pub admin: Arc<dyn Admin>,
    /// The data volume (mounted read-only).
    pub data_dir: PathBuf,
    /// Every KafkaTopic the controller watches (conflict detection).
    pub store: Store<KafkaTopic>,
    /// Counters for /metrics.
    pub metrics: Arc<Metrics>,
    /// How often a Ready topic is looked at again (drift repair).
    pub resync: Duration,
    /// Consecutive failures per resource (uid), for the back-off.
    pub failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// Checked before every write (Kafka admin request or API patch): a
    /// replica whose lease ran out writes nothing (see `lease`).
    pub fence: Fence,
    /// Kubernetes Events on the resources (`kubectl describe ktopic`).
    pub recorder: Recorder,
}

/// Record an Event on `kt` (`kubectl describe ktopic`): best effort — a
/// refused Event is logged, never fails the reconcile — and, like every
/// write, only under the lease. Repeats of one (reason, action) within
/// a few minutes become one Event with a count (kube's Recorder).
pub async fn record(
    ctx: &Context,
    kt: &KafkaTopic,
    warning: bool,
    reason: &str,
    action: &str,
    note: String,
) {
    if ctx.fence.check().is_err() {
        return;
    }
    let ev = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_owned(),
        // The Events API caps a note at 1 kB.
        note: Some(note.chars().take(1000).collect()),
        action: action.to_owned(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &kt.object_ref(&())).await {
        tracing::warn!(resource = %kt.name_any(), reason, error = %e, "recording an Event failed");
    }
}

/// Back-off after the `n`th consecutive failure: 1 s doubling, capped at 5 min.
pub fn backoff(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.saturating_sub(1).min(8)).min(Duration::from_secs(300))
}

/// The controller's error policy: requeue with per-resource back-off.
pub fn error_policy(kt: Arc<KafkaTopic>, err: &Error, ctx: Arc<Context>) -> Action {
    let uid = kt.metadata.uid.clone().unwrap_or_default();
    let n = {
        let mut f = ctx.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = f.entry(uid).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let wait = backoff(n);
    tracing::warn!(resource = %kt.name_any(), error = %err, attempt = n, wait_ms = wait.as_millis() as u64, "reconcile failed");
    // Not when the lease is gone (nothing may be written then).
    if !matches!(err, Error::NotLeader(_)) {
        let note = format!("{err}; retrying in {} s (attempt {n})", wait.as_secs());
        tokio::spawn(async move {
            record(&ctx, &kt, true, "ReconcileFailed", "Reconcile", note).await;
        });
    }
    Action::requeue(wait)
}

/// What the volume says about the topic's directory.
#[derive(Debug, Clone, PartialEq)]
pub enum Volume {
    /// No directory (or no stamp in it yet: the brokers stamp every
    /// directory they create or adopt).
    Absent,
    /// A stamped directory.
    Stamped(TopicStamp),
    /// A stamp that does not parse: reported, never guessed at.
    Unreadable(String),
}

/// What one reconcile does.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Add the finalizer before anything is created.
    AddFinalizer,
    /// Remove the finalizer: the resource may go.
    RemoveFinalizer,
    /// DeleteTopics, then look again.
    Delete(String),
    /// Reclaim the directory of a previous incarnation: DeleteTopics by
    /// its id (the controller vacates, renames aside and removes it,
    /// re-driven), forget the id this resource recorded, then look again
    /// (the next reconcile creates a new incarnation).
    Reclaim {
        /// topic
        name: String,
        /// the incarnation on the volume
        id: uuid::Uuid,
    },
    /// The incarnation this resource recorded (`status.topicId`) is gone
    /// from the volume (deleted outside, or a reclaim interrupted between
    /// its DeleteTopics and its status patch): forget the id, then look
    /// again. Before any create, so the incarnation created next is
    /// recorded as this resource's own and never reclaimed as another's.
    Forget {
        /// the recorded id that is gone
        id: String,
    },
    /// CreateTopics, then look again.
    Create {
        /// topic
        name: String,
        /// partitions
        partitions: i32,
        /// configs
        configs: BTreeMap<String, String>,
    },
    /// CreatePartitions, then look again.
    Grow {
        /// topic
        name: String,
        /// new count
        partitions: i32,
    },
    /// IncrementalAlterConfigs, then look again.
    Alter {
        /// topic
        name: String,
        /// set
        set: BTreeMap<String, String>,
        /// delete
        removed: Vec<String>,
    },
    /// Nothing to send: write `status` (if it changed) and wait.
    Status(KafkaTopicStatus),
}

fn ready(status: &str, reason: &str, message: impl Into<String>) -> Condition {
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: None,
    }
}

/// The resource that owns `topic` among `all`: the oldest by creation time
/// (uid breaks ties), skipping resources being deleted and unmanaged ones.
pub fn owner_of<'a>(topic: &str, all: &'a [Arc<KafkaTopic>]) -> Option<&'a KafkaTopic> {
    all.iter()
        .map(|k| k.as_ref())
        .filter(|k| k.topic_name() == topic && !k.unmanaged())
        .filter(|k| k.metadata.deletion_timestamp.is_none())
        .min_by(|a, b| {
            let key = |k: &KafkaTopic| {
                (
                    k.metadata.creation_timestamp.clone().map(|t| t.0),
                    k.metadata.uid.clone(),
                )
            };
            key(a).cmp(&key(b))
        })
}

/// Decide the next step for `kt`. Pure: the tests drive every branch.
pub fn decide(kt: &KafkaTopic, all: &[Arc<KafkaTopic>], vol: &Volume) -> Step {
    let name = kt.topic_name();
    let has_finalizer = kt.finalizers().iter().any(|f| f == FINALIZER);
    let prev = kt.status.clone().unwrap_or_default();
    let base = KafkaTopicStatus {
        topic_name: Some(name.clone()),
        observed_generation: kt.metadata.generation,
        ..prev.clone()
    };
    let status = |cond: Condition, s: KafkaTopicStatus| {
        Step::Status(KafkaTopicStatus {
            conditions: vec![cond],
            ..s
        })
    };
    let owner = owner_of(&name, all);
    let is_owner = owner.is_some_and(|o| o.metadata.uid == kt.metadata.uid);

    // Deletion: delete the topic only if this resource owned it and the
    // directory is still the incarnation it recorded.
    if kt.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Step::Status(prev);
        }
        let ours = match (vol, &prev.topic_id) {
            (Volume::Stamped(s), Some(id)) => s.topic_id.to_string() == *id,
            _ => false,
        };
        let others_own = owner.is_some_and(|o| o.metadata.uid != kt.metadata.uid);
        if ours && !kt.unmanaged() && !others_own {
            return Step::Delete(name);
        }
        return Step::RemoveFinalizer;
    }
    if kt.unmanaged() {
        if has_finalizer {
            return Step::RemoveFinalizer;
        }
        return status(
            ready("Unknown", "Unmanaged", "kaas.io/managed=false: left alone"),
            base,
        );
    }
    if !is_owner {
        let o = owner.map(|o| o.name_any()).unwrap_or_default();
        return status(
            ready(
                "False",
                "ResourceConflict",
                format!("topic {name} is managed by the older KafkaTopic {o}"),
            ),
            KafkaTopicStatus {
                topic_id: None,
                partitions: None,
                ..base
            },
        );
    }
    if let Err(e) = topic_dir::validate_name(&name) {
        return status(ready("False", "InvalidSpec", e.to_string()), base);
    }
    if let Err(e) = topic_dir::validate_configs(&kt.spec.config) {
        return status(ready("False", "InvalidSpec", e.to_string()), base);
    }
    if let Some(old) = &prev.topic_name {
        if *old != name && prev.topic_id.is_some() {
            return status(
                ready(
                    "False",
                    "NotSupported",
                    format!("renaming topic {old} to {name} is not supported"),
                ),
                KafkaTopicStatus {
                    topic_name: Some(old.clone()),
                    ..base
                },
            );
        }
    }
    if !has_finalizer {
        return Step::AddFinalizer;
    }
    match vol {
        Volume::Unreadable(e) => status(
            ready(
                "False",
                "StampUnreadable",
                format!("{}: {e}", kaas_volume::layout::TOPIC_STAMP),
            ),
            base,
        ),
        Volume::Absent => match prev.topic_id {
            Some(id) => Step::Forget { id },
            None => Step::Create {
                name,
                partitions: kt.spec.partitions,
                configs: kt.spec.config.clone(),
            },
        },
        Volume::Stamped(s) => {
            let id = s.topic_id.to_string();
            match &prev.topic_id {
                // An adopted directory (nobody had stamped it) has an
                // unknown history: never reclaimed, only reported.
                Some(mine) if *mine != id && s.adopted => {
                    return status(
                        ready(
                            "False",
                            "IncarnationMismatch",
                            format!(
                                "directory {name} was adopted by the brokers (stamped {id}) \
                                 while this resource owned {mine}; an adopted directory is \
                                 never reclaimed: delete and re-apply the KafkaTopic to adopt it"
                            ),
                        ),
                        base,
                    )
                }
                // The resource is the source of truth: the incarnation it
                // owned is gone, and the one in the directory was made
                // outside it (a delete and re-create by a client): the
                // directory of a previous incarnation, reclaimed.
                Some(mine) if *mine != id => {
                    return Step::Reclaim {
                        name,
                        id: s.topic_id,
                    }
                }
                _ => {}
            }
            // Adoption (a topic made by a client, or a directory the
            // brokers adopted and stamped): record its id.
            let have = KafkaTopicStatus {
                topic_id: Some(id),
                partitions: Some(s.partitions),
                ..base
            };
            if kt.spec.partitions < s.partitions {
                return status(
                    ready(
                        "False",
                        "NotSupported",
                        format!(
                            "partitions cannot decrease ({} -> {})",
                            s.partitions, kt.spec.partitions
                        ),
                    ),
                    have,
                );
            }
            if kt.spec.partitions > s.partitions {
                if prev_not_supported(kt, &prev, "CreatePartitions") {
                    return status(prev_ready(&prev), have);
                }
                return Step::Grow {
                    name,
                    partitions: kt.spec.partitions,
                };
            }
            if kt.spec.config != s.configs {
                if prev_not_supported(kt, &prev, "IncrementalAlterConfigs") {
                    return status(prev_ready(&prev), have);
                }
                let removed = s
                    .configs
                    .keys()
                    .filter(|k| !kt.spec.config.contains_key(*k))
                    .cloned()
                    .collect();
                return Step::Alter {
                    name,
                    set: kt.spec.config.clone(),
                    removed,
                };
            }
            status(ready("True", "Ready", ""), have)
        }
    }
}

/// A NotSupported answer for `api` is remembered in the condition, so the
/// same unsupported request is not re-sent on every resync of the same
/// generation (no error loop); a new generation tries again.
fn prev_not_supported(kt: &KafkaTopic, prev: &KafkaTopicStatus, api: &str) -> bool {
    prev.observed_generation == kt.metadata.generation
        && prev
            .conditions
            .iter()
            .any(|c| c.reason == "NotSupported" && c.message.contains(api))
}

fn prev_ready(prev: &KafkaTopicStatus) -> Condition {
    prev.conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .cloned()
        .unwrap_or_else(|| ready("Unknown", "Unknown", ""))
}

/// Read the stamp of `topic` under `data` with the volume crate, with the
/// configs in force (altered ones from `.topic-config.json` when it belongs
/// to this incarnation), so a config the brokers applied reads as applied.
pub fn read_volume(data: &std::path::Path, topic: &str) -> std::io::Result<Volume> {
    // The operator's mount is read-only: RealFs here only ever reads.
    let fs = kaas_volume::fs::RealFs;
    let dir = data.join(topic);
    Ok(match topic_dir::read_stamp(&fs, &dir)? {
        None => Volume::Absent,
        Some(Ok(_)) => match kaas_volume::topic_config::read_topic(&fs, &dir) {
            Ok(Some(s)) => Volume::Stamped(s),
            Ok(None) => Volume::Absent,
            Err(e) => Volume::Unreadable(e.to_string()),
        },
        Some(Err(e)) => Volume::Unreadable(e),
    })
}

/// Errors that requeue with back-off.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Kubernetes API.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// Brokers' admin API.
    #[error("kafka admin: {0}")]
    Admin(#[from] AdminError),
    /// Reading a stamp.
    #[error("volume: {0}")]
    Volume(#[from] std::io::Error),
    /// The lease ran out: the write was withheld.
    #[error("{0}")]
    NotLeader(#[from] NotLeader),
}

impl Error {
    /// Label for the errors metric.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kubernetes",
            Error::Admin(AdminError::Transport(_)) => "kafka_transport",
            Error::Admin(_) => "kafka",
            Error::Volume(_) => "volume",
            Error::NotLeader(_) => "not_leader",
        }
    }
}

/// Carry over `lastTransitionTime` when a condition did not change, and set
/// it now when it did: the status is then equal to the old one whenever
/// nothing changed, and is not rewritten.
pub fn settle(prev: &KafkaTopicStatus, mut next: KafkaTopicStatus, now: &str) -> KafkaTopicStatus {
    for c in &mut next.conditions {
        let old = prev.conditions.iter().find(|o| o.type_ == c.type_);
        c.last_transition_time = match old {
            Some(o) if o.status == c.status && o.reason == c.reason => {
                o.last_transition_time.clone()
            }
            _ => Some(now.to_owned()),
        };
    }
    next
}

/// One reconcile of `kt`.
pub async fn reconcile(kt: Arc<KafkaTopic>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let r = reconcile_inner(&kt, &ctx).await;
    ctx.metrics
        .observe(started.elapsed(), r.as_ref().err().map(Error::reason));
    if r.is_ok() {
        if let Some(uid) = &kt.metadata.uid {
            ctx.failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(uid);
        }
    }
    r
}

async fn reconcile_inner(kt: &KafkaTopic, ctx: &Context) -> Result<Action, Error> {
    let ns = kt.namespace().unwrap_or_default();
    let api: Api<KafkaTopic> = Api::namespaced(ctx.client.clone(), &ns);
    let name = kt.topic_name();
    let vol = if topic_dir::validate_name(&name).is_ok() {
        read_volume(&ctx.data_dir, &name)?
    } else {
        Volume::Absent
    };
    let all = ctx.store.state();
    let step = decide(kt, &all, &vol);
    tracing::debug!(resource = %kt.name_any(), topic = %name, ?step, "reconcile");
    let again = Action::requeue(Duration::from_millis(500));
    match step {
        Step::AddFinalizer => {
            let mut fins = kt.finalizers().to_vec();
            fins.push(FINALIZER.to_owned());
            ctx.fence.check()?;
            patch_finalizers(&api, kt, fins).await?;
            Ok(again)
        }
        Step::RemoveFinalizer => {
            let fins = kt
                .finalizers()
                .iter()
                .filter(|f| *f != FINALIZER)
                .cloned()
                .collect();
            ctx.fence.check()?;
            patch_finalizers(&api, kt, fins).await?;
            Ok(Action::await_change())
        }
        Step::Delete(topic) => {
            ctx.fence.check()?;
            ctx.admin.delete_topic(&topic).await?;
            tracing::info!(topic = %topic, "deleted through DeleteTopics");
            let note = format!("topic {topic} deleted on the brokers (DeleteTopics)");
            record(ctx, kt, false, "Deleted", "DeleteTopics", note).await;
            Ok(again)
        }
        Step::Reclaim { name, id } => {
            // Answered once the directory no longer holds `id` (or an
            // error, and the reconcile is retried with back-off).
            ctx.fence.check()?;
            ctx.admin.delete_incarnation(&name, id).await?;
            tracing::warn!(topic = %name, %id, "reclaimed a previous incarnation's directory through DeleteTopics");
            let note = format!("topic {name}: the directory of a previous incarnation ({id}) was deleted through DeleteTopics; a new one is created next");
            record(ctx, kt, true, "Reclaimed", "DeleteTopics", note).await;
            // Killed here, the next reconcile finds the directory absent
            // and the old id recorded: Step::Forget finishes this.
            forget_id(&api, kt, ctx).await?;
            Ok(again)
        }
        Step::Forget { id } => {
            tracing::info!(topic = %name, %id, "the recorded incarnation is gone: forgetting its id before creating anew");
            forget_id(&api, kt, ctx).await?;
            Ok(again)
        }
        Step::Create {
            name,
            partitions,
            configs,
        } => {
            ctx.fence.check()?;
            match ctx.admin.create_topic(&name, partitions, &configs).await {
                Ok(()) => {
                    tracing::info!(topic = %name, partitions, "created through CreateTopics");
                    let note =
                        format!("topic {name} created with {partitions} partitions (CreateTopics)");
                    record(ctx, kt, false, "Created", "CreateTopics", note).await;
                }
                Err(AdminError::Kafka { code, message }) if is_spec_error(code) => {
                    return write_status(
                        &api,
                        kt,
                        failed(kt, "InvalidSpec", format!("kafka error {code}: {message}")),
                        ctx,
                    )
                    .await;
                }
                Err(e) => return Err(e.into()),
            }
            Ok(again)
        }
        Step::Grow { name, partitions } => {
            ctx.fence.check()?;
            match ctx.admin.create_partitions(&name, partitions).await {
                Ok(()) => {
                    let note =
                        format!("topic {name} grown to {partitions} partitions (CreatePartitions)");
                    record(
                        ctx,
                        kt,
                        false,
                        "PartitionsIncreased",
                        "CreatePartitions",
                        note,
                    )
                    .await;
                    Ok(again)
                }
                Err(AdminError::NotSupported(k)) => {
                    write_status(&api, kt, not_supported(kt, &vol, k), ctx).await
                }
                Err(e) => Err(e.into()),
            }
        }
        Step::Alter { name, set, removed } => {
            ctx.fence.check()?;
            match ctx.admin.alter_configs(&name, &set, &removed).await {
                Ok(()) => {
                    let set: Vec<String> = set.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    let note = format!(
                        "topic {name}: set [{}], removed [{}] (IncrementalAlterConfigs)",
                        set.join(", "),
                        removed.join(", ")
                    );
                    record(
                        ctx,
                        kt,
                        false,
                        "ConfigsAltered",
                        "IncrementalAlterConfigs",
                        note,
                    )
                    .await;
                    Ok(again)
                }
                Err(AdminError::NotSupported(k)) => {
                    write_status(&api, kt, not_supported(kt, &vol, k), ctx).await
                }
                Err(e) => Err(e.into()),
            }
        }
        Step::Status(s) => write_status(&api, kt, s, ctx).await,
    }
}

/// Clear `status.topicId` (and the partition count read with it).
async fn forget_id(api: &Api<KafkaTopic>, kt: &KafkaTopic, ctx: &Context) -> Result<(), Error> {
    let patch = serde_json::json!({ "status": { "topicId": null, "partitions": null } });
    ctx.fence.check()?;
    api.patch_status(&kt.name_any(), &patch_params(), &Patch::Merge(&patch))
        .await?;
    ctx.metrics.status_write();
    Ok(())
}

/// Every patch names the operator as its field manager.
fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

fn is_spec_error(code: i16) -> bool {
    use crate::admin::code::*;
    [
        INVALID_PARTITIONS,
        INVALID_CONFIG,
        INVALID_TOPIC,
        POLICY_VIOLATION,
    ]
    .contains(&code)
}

fn failed(kt: &KafkaTopic, reason: &str, message: String) -> KafkaTopicStatus {
    KafkaTopicStatus {
        topic_name: Some(kt.topic_name()),
        observed_generation: kt.metadata.generation,
        conditions: vec![ready("False", reason, message)],
        ..kt.status.clone().unwrap_or_default()
    }
}

fn not_supported(
    kt: &KafkaTopic,
    vol: &Volume,
    api: kaas_protocol::kafka_protocol::messages::ApiKey,
) -> KafkaTopicStatus {
    let mut s = failed(
        kt,
        "NotSupported",
        format!("the brokers do not serve {api:?} yet; the change waits for a newer broker"),
    );
    if let Volume::Stamped(st) = vol {
        s.topic_id = Some(st.topic_id.to_string());
        s.partitions = Some(st.partitions);
    }
    s
}

async fn patch_finalizers(
    api: &Api<KafkaTopic>,
    kt: &KafkaTopic,
    fins: Vec<String>,
) -> Result<(), Error> {
    // resourceVersion in the patch: a concurrent change makes it a 409 and
    // the next reconcile sees the new object.
    let patch = serde_json::json!({
        "metadata": {"finalizers": fins, "resourceVersion": kt.resource_version()}
    });
    api.patch(&kt.name_any(), &patch_params(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn write_status(
    api: &Api<KafkaTopic>,
    kt: &KafkaTopic,
    next: KafkaTopicStatus,
    ctx: &Context,
) -> Result<Action, Error> {
    let prev = kt.status.clone().unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let next = settle(&prev, next, &now);
    if next != prev {
        let patch = serde_json::json!({ "status": next });
        ctx.fence.check()?;
        api.patch_status(&kt.name_any(), &patch_params(), &Patch::Merge(&patch))
            .await?;
        ctx.metrics.status_write();
        // A Ready transition is an Event too: Warning unless it is Ready
        // or on its way (Creating).
        let old = prev_ready(&prev);
        if let Some(c) = next.conditions.iter().find(|c| c.type_ == "Ready") {
            if (c.status.as_str(), c.reason.as_str()) != (old.status.as_str(), old.reason.as_str())
            {
                let warning = c.status != "True" && c.reason != "Creating";
                record(ctx, kt, warning, &c.reason, "Reconcile", c.message.clone()).await;
            }
        }
    }
    let ready = next
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    Ok(if ready {
        Action::requeue(ctx.resync)
    } else {
        // Not ready for a reason only a spec change or the brokers can
        // clear: look again, slowly.
        Action::requeue(ctx.resync.min(Duration::from_secs(60)))
    })
}
