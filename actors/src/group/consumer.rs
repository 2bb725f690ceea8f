//! The KIP-848 consumer group protocol (`group.protocol=consumer`) of one
//! shard's groups, as a plain state machine on the `Clock` seam, next to
//! [`super::classic`] and driven by the same
//! [`GroupCoordinator`](super::coordinator::GroupCoordinator).
//!
//! The protocol, as KIP-848 specifies and Kafka 4 implements it:
//!
//! * **One API.** A member sends ConsumerGroupHeartbeat every
//!   `heartbeat_interval` with its member epoch (0 to join, -1 to leave,
//!   -2 for a static member's temporary leave) and, when they changed, its
//!   subscription and the partitions it owns. The answer carries its
//!   member epoch and the assignment it should own now.
//! * **Epochs.** The *group epoch* rises on every change of membership,
//!   subscriptions or the subscribed topics' partition counts; each rise
//!   recomputes the *target assignment* with the group's server-side
//!   assignor ([`super::assignor`]) at once, so the assignment epoch always
//!   equals the group epoch. A member's *member epoch* reaches the target
//!   epoch only once it has released what the target takes away.
//! * **Revoke before assign** (reconciliation, [`reconcile`]): a member
//!   owning partitions its target no longer has is first told to drop them
//!   (state `UnrevokedPartitions`, old epoch); only when a heartbeat shows
//!   they are gone does it move to the target epoch. A partition is given
//!   to a member only when no other member owns it or is still revoking it
//!   (state `UnreleasedPartitions` until then). So no partition is ever
//!   assigned to two members at once (tested below on random histories).
//! * **Fencing.** An epoch above the member's is FENCED_MEMBER_EPOCH; one
//!   below is too, unless it is the previous epoch and the owned partitions
//!   are a subset of the current assignment (a lost response). An unknown
//!   member is UNKNOWN_MEMBER_ID. A member silent for the session timeout,
//!   or not revoking within its rebalance timeout, is removed and its
//!   partitions released.
//! * **Static members** (`group.instance.id`): leaving with epoch -2 keeps
//!   the member and its assignment for the session timeout; a new member id
//!   joining with the same instance id takes both over without a
//!   rebalance. Joining while the instance id is held by an active member
//!   is UNRELEASED_INSTANCE_ID; a heartbeat of an instance id from another
//!   member id is FENCED_INSTANCE_ID.
//! * **Bounded**: at most [`ConsumerConfig::max_size`] members per group
//!   (GROUP_MAX_SIZE_REACHED beyond).
//! * **Regex subscriptions are resolved asynchronously**, as Kafka does
//!   (`GroupMetadataManager.maybeUpdateRegularExpressions` schedules
//!   `refreshRegularExpressions` on an executor; `handleRegularExpressionsResult`
//!   bumps the group epoch). A heartbeat never matches a regex: it computes
//!   the target from the literal names and the group's *resolved* regexes
//!   ([`GroupRecord::regexes`]); a regex no member had subscribed to yet
//!   only asks for a resolution, which [`ConsumerGroups::tick`] runs after
//!   the heartbeat was answered and which rebalances if the matches changed.
//!   So a member subscribing to `[literal, regex]` gets the literal topic in
//!   one heartbeat and the matches in a later one (librdkafka's 0045
//!   `resubscribe_with_regex` expects that order). The group's regexes are
//!   resolved again at most every [`ConsumerConfig::regex_refresh_min_interval`]
//!   (Kafka's `REGEX_BATCH_REFRESH_MIN_INTERVAL_MS`, 10 s) when a heartbeat
//!   comes, which is how a topic created later that matches is picked up.
//!
//! Durability: every change is returned as [`ConsumerRecord`]s (the group's
//! epochs and assignor, each member with its epoch, subscription, current
//! and target assignment) for the owner to persist before answering, so a
//! coordinator takeover rebuilds the group from the shard log
//! ([`ConsumerGroups::load`]) and members carry on with their epochs
//! instead of rejoining. Deadlines are not persisted: a new owner gives
//! every member a fresh session.

use super::assignor::{self, Assignment, AssignorMember};
use super::offsets::ShardState;
use crate::clock::SharedClock;
use kaas_protocol::kafka_protocol::ResponseError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use uuid::Uuid;

/// Consumer-protocol settings (Kafka's `group.consumer.*`).
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// `group.consumer.session.timeout.ms` (Kafka's default 45 s).
    pub session_timeout: Duration,
    /// `group.consumer.heartbeat.interval.ms` (Kafka's default 5 s).
    pub heartbeat_interval: Duration,
    /// `group.consumer.max.size`: members per group (Kafka: unbounded; here
    /// 1000, so one group's records stay small).
    pub max_size: usize,
    /// The least time between two resolutions of a group's regexes (Kafka's
    /// `REGEX_BATCH_REFRESH_MIN_INTERVAL_MS`, 10 s): a new regex waits for it
    /// only if another was resolved within it; a heartbeat after it resolves
    /// them all again (new topics).
    pub regex_refresh_min_interval: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            session_timeout: Duration::from_secs(45),
            heartbeat_interval: Duration::from_secs(5),
            max_size: 1000,
            regex_refresh_min_interval: Duration::from_secs(10),
        }
    }
}

/// A topic as the metadata knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMeta {
    /// Topic id.
    pub id: Uuid,
    /// Partition count.
    pub partitions: i32,
}

/// The broker's topics, as the state machine asks for them.
pub trait TopicSource: Send + Sync {
    /// A topic by name, if it exists.
    fn topic(&self, name: &str) -> Option<TopicMeta>;
    /// The names of the topics matching `regex`; `None` if it is not a
    /// valid regular expression.
    fn matching(&self, regex: &str) -> Option<Vec<String>>;
    /// A topic's name by id (for answers that name topics).
    fn name_of(&self, id: &Uuid) -> Option<String>;
}

/// Where a member is in its reconciliation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    /// At the target epoch with all of its target.
    Stable,
    /// Must release partitions before it moves to the target epoch.
    UnrevokedPartitions,
    /// At the target epoch, waiting for partitions others still own.
    UnreleasedPartitions,
}

/// One member as persisted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Member id.
    pub member_id: String,
    /// `group.instance.id`.
    pub instance_id: Option<String>,
    /// `client.rack`.
    pub rack_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
    /// Subscribed topic names.
    pub topics: Vec<String>,
    /// Subscribed topic regex.
    pub regex: Option<String>,
    /// The assignor it asked for.
    pub assignor: Option<String>,
    /// Rebalance timeout (ms): how long it may take to revoke.
    pub rebalance_timeout_ms: i32,
    /// Member epoch (-2: a static member temporarily gone).
    pub epoch: i32,
    /// The epoch before the last bump (lost-response tolerance).
    pub previous_epoch: i32,
    /// Reconciliation state.
    pub state: MemberState,
    /// What it owns now.
    pub assigned: Assignment,
    /// What it must release before moving on.
    pub revoking: Assignment,
    /// Its target assignment (of the group's assignment epoch).
    pub target: Assignment,
}

/// A group's own fields as persisted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// Group id.
    pub group: String,
    /// Group epoch.
    pub epoch: i32,
    /// Epoch of the target assignment (equals `epoch` once assigned).
    pub assignment_epoch: i32,
    /// The assignor the target was computed with.
    pub assignor: String,
    /// The subscribed topics the target was computed from.
    pub topics: BTreeMap<String, TopicMeta>,
    /// Wall-clock ms of the last change (offset expiry of an empty group).
    pub state_ms: i64,
    /// The members' regexes as last resolved: regex → the topic names it
    /// matched (Kafka's ConsumerGroupRegularExpression records). A regex a
    /// member subscribes to but absent here is not resolved yet and counts
    /// as matching nothing. Absent in records written before regexes were
    /// resolved asynchronously: read as empty, resolved at the next
    /// heartbeat.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub regexes: BTreeMap<String, BTreeSet<String>>,
}

/// A consumer-protocol shard record (stored inside
/// [`super::offsets::Record::Consumer`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConsumerRecord {
    /// The group's epochs and assignor.
    Group(GroupRecord),
    /// One member (upsert).
    Member {
        /// Group id.
        group: String,
        /// The member (boxed: a record is mostly a small one).
        member: Box<MemberRecord>,
    },
    /// A member gone.
    MemberTombstone {
        /// Group id.
        group: String,
        /// Member id.
        member_id: String,
    },
    /// The group gone (deleted, or converted to a classic group).
    GroupTombstone {
        /// Group id.
        group: String,
    },
}

/// A consumer group as the shard's durable state holds it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredGroup {
    /// The group record (absent only for a torn history).
    pub group: Option<GroupRecord>,
    /// Its members.
    pub members: BTreeMap<String, MemberRecord>,
}

/// The consumer groups of a shard's durable state.
pub type StoredGroups = BTreeMap<String, StoredGroup>;

/// Fold one record into the durable state.
pub fn apply(state: &mut StoredGroups, r: &ConsumerRecord) {
    match r {
        ConsumerRecord::Group(g) => {
            state.entry(g.group.clone()).or_default().group = Some(g.clone());
        }
        ConsumerRecord::Member { group, member } => {
            state
                .entry(group.clone())
                .or_default()
                .members
                .insert(member.member_id.clone(), (**member).clone());
        }
        ConsumerRecord::MemberTombstone { group, member_id } => {
            if let Some(g) = state.get_mut(group) {
                g.members.remove(member_id);
            }
        }
        ConsumerRecord::GroupTombstone { group } => {
            state.remove(group);
        }
    }
}

/// The durable state as records (what a compaction writes).
pub fn records(state: &StoredGroups) -> impl Iterator<Item = ConsumerRecord> + '_ {
    state.iter().flat_map(|(id, g)| {
        let head = g.group.clone().map(ConsumerRecord::Group);
        head.into_iter()
            .chain(g.members.values().map(move |m| ConsumerRecord::Member {
                group: id.clone(),
                member: Box::new(m.clone()),
            }))
    })
}

/// A ConsumerGroupHeartbeat, decoded.
#[derive(Debug, Clone, Default)]
pub struct ConsumerHeartbeat {
    /// Group id.
    pub group_id: String,
    /// Member id ("" on a v0 join: the coordinator issues one).
    pub member_id: String,
    /// Member epoch (0 join, -1 leave, -2 static leave).
    pub member_epoch: i32,
    /// `group.instance.id`.
    pub instance_id: Option<String>,
    /// `client.rack` (`None`: unchanged).
    pub rack_id: Option<String>,
    /// Rebalance timeout (-1: unchanged).
    pub rebalance_timeout_ms: i32,
    /// Subscribed names (`None`: unchanged).
    pub topics: Option<Vec<String>>,
    /// Subscribed regex (`None`: unchanged).
    pub regex: Option<String>,
    /// Requested assignor (`None`: unchanged).
    pub assignor: Option<String>,
    /// Owned partitions (`None`: unchanged).
    pub owned: Option<Assignment>,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
}

/// A successful heartbeat's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatAnswer {
    /// The member id (issued on a v0 join).
    pub member_id: String,
    /// Its epoch now.
    pub member_epoch: i32,
    /// When to heartbeat next (ms).
    pub heartbeat_interval_ms: i32,
    /// What it should own now (`None`: unchanged / leaving).
    pub assignment: Option<Assignment>,
}

/// A heartbeat's error: code and message.
pub type HeartbeatError = (ResponseError, Option<String>);

/// What a heartbeat or a tick produced: the answer and the records to make
/// durable before it is given.
#[derive(Debug)]
pub struct Outcome<T> {
    /// The answer.
    pub result: Option<Result<T, HeartbeatError>>,
    /// Records to persist first.
    pub persist: Vec<ConsumerRecord>,
}

impl<T> Default for Outcome<T> {
    fn default() -> Self {
        Self {
            result: None,
            persist: Vec::new(),
        }
    }
}

/// A group as ConsumerGroupDescribe shows it.
#[derive(Debug, Clone)]
pub struct DescribedGroup {
    /// Group id.
    pub group: String,
    /// Kafka's state name (Empty, Reconciling, Stable, …).
    pub state: &'static str,
    /// Group epoch.
    pub epoch: i32,
    /// Assignment epoch.
    pub assignment_epoch: i32,
    /// Assignor.
    pub assignor: String,
    /// Members.
    pub members: Vec<MemberRecord>,
}

struct Member {
    rec: MemberRecord,
    /// Session deadline (clock time).
    session_until: Duration,
    /// Revocation deadline while `UnrevokedPartitions`.
    revoke_until: Option<Duration>,
    /// KIP-1251 assignment epochs: the member epoch at which each partition
    /// it owns was given to it. Runtime only: after a takeover every
    /// partition counts as given at the loaded epoch (commits must then
    /// carry that epoch, Kafka's strict rule, until the member moves on).
    assigned_since: BTreeMap<(Uuid, i32), i32>,
}

impl Member {
    /// Bring `assigned_since` in line with `rec.assigned`: partitions given
    /// just now are given at the current epoch, those kept keep theirs.
    fn sync_assigned_since(&mut self) {
        let assigned = &self.rec.assigned;
        self.assigned_since
            .retain(|(t, p), _| assigned.get(t).is_some_and(|s| s.contains(p)));
        for (t, ps) in assigned {
            for &p in ps {
                self.assigned_since.entry((*t, p)).or_insert(self.rec.epoch);
            }
        }
    }
}

struct Group {
    rec: GroupRecord,
    members: BTreeMap<String, Member>,
    /// The target read back is not one assignment (a torn, never
    /// acknowledged batch can leave a group record without all of its
    /// members' targets): recompute it at the next heartbeat.
    dirty: bool,
    /// When `rec.regexes` were last resolved (clock time; `None`: not by
    /// this owner, or the group has none). Runtime only: a new owner
    /// resolves them again at the first heartbeat.
    regexes_resolved_at: Option<Duration>,
    /// A resolution of the regexes is due at this time (Kafka's scheduled
    /// `<group>-regex` task): run by [`ConsumerGroups::tick`].
    regex_refresh_due: Option<Duration>,
}

impl Group {
    /// The regexes the members subscribe to.
    fn subscribed_regexes(&self) -> BTreeSet<&str> {
        self.members
            .values()
            .filter_map(|m| m.rec.regex.as_deref())
            .collect()
    }

    /// Kafka's refresh conditions (`maybeUpdateRegularExpressions`), asked
    /// at every heartbeat: the group subscribes to regexes, none is being
    /// resolved, and either one is not resolved yet (due once the last
    /// resolution is `min_interval` old) or the last resolution is that
    /// old (a periodic refresh, which finds topics created since).
    fn maybe_schedule_refresh(&mut self, now: Duration, min_interval: Duration) {
        let regexes = self.subscribed_regexes();
        if regexes.is_empty() {
            self.regex_refresh_due = None;
            return;
        }
        if self.regex_refresh_due.is_some() {
            return;
        }
        let unresolved = regexes.iter().any(|r| !self.rec.regexes.contains_key(*r));
        let earliest = self
            .regexes_resolved_at
            .map_or(now, |t| t.saturating_add(min_interval));
        if unresolved {
            self.regex_refresh_due = Some(earliest.max(now));
        } else if earliest <= now {
            self.regex_refresh_due = Some(now);
        }
    }

    /// Forget the resolutions of regexes no member subscribes to any more
    /// (Kafka tombstones them when the last subscriber goes).
    fn prune_regexes(&mut self) {
        let subscribed: BTreeSet<String> = self
            .subscribed_regexes()
            .into_iter()
            .map(str::to_owned)
            .collect();
        self.rec.regexes.retain(|r, _| subscribed.contains(r));
        if self.rec.regexes.is_empty() {
            self.regexes_resolved_at = None;
        }
        if subscribed.is_empty() {
            self.regex_refresh_due = None;
        }
    }

    fn state_name(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.rec.assignment_epoch != self.rec.epoch {
            "Assigning"
        } else if self
            .members
            .values()
            .any(|m| m.rec.state != MemberState::Stable || m.rec.epoch != self.rec.assignment_epoch)
        {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    /// Who owns or is still revoking each partition.
    fn owners(&self) -> BTreeMap<(Uuid, i32), &str> {
        let mut out = BTreeMap::new();
        for m in self.members.values() {
            for a in [&m.rec.assigned, &m.rec.revoking] {
                for (t, ps) in a {
                    for p in ps {
                        out.insert((*t, *p), m.rec.member_id.as_str());
                    }
                }
            }
        }
        out
    }

    fn member_record(&self, id: &str) -> Option<ConsumerRecord> {
        self.members.get(id).map(|m| ConsumerRecord::Member {
            group: self.rec.group.clone(),
            member: Box::new(m.rec.clone()),
        })
    }
}

fn subset(a: &Assignment, b: &Assignment) -> bool {
    a.iter()
        .all(|(t, ps)| ps.is_empty() || b.get(t).is_some_and(|q| ps.is_subset(q)))
}

fn intersects(a: &Assignment, b: &Assignment) -> bool {
    a.iter()
        .any(|(t, ps)| b.get(t).is_some_and(|q| !ps.is_disjoint(q)))
}

fn minus(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (t, ps) in a {
        let left: BTreeSet<i32> = match b.get(t) {
            Some(q) => ps.difference(q).copied().collect(),
            None => ps.clone(),
        };
        if !left.is_empty() {
            out.insert(*t, left);
        }
    }
    out
}

fn and(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (t, ps) in a {
        if let Some(q) = b.get(t) {
            let both: BTreeSet<i32> = ps.intersection(q).copied().collect();
            if !both.is_empty() {
                out.insert(*t, both);
            }
        }
    }
    out
}

/// One reconciliation step of a member towards its target (Kafka's
/// `CurrentAssignmentBuilder`): `owned` is what its heartbeat says it owns
/// (if it said), `free` tells whether a partition may be given to it (no
/// other member owns or revokes it). Returns whether the member changed.
pub fn reconcile(
    m: &mut MemberRecord,
    target_epoch: i32,
    owned: Option<&Assignment>,
    free: impl Fn(Uuid, i32) -> bool,
) -> bool {
    let before = (m.epoch, m.state, m.assigned.clone(), m.revoking.clone());
    if m.state == MemberState::UnrevokedPartitions {
        match owned {
            // Revocation acknowledged: what it had to drop is gone.
            Some(o) if !intersects(o, &m.revoking) => m.revoking.clear(),
            _ => return false,
        }
    }
    if m.epoch != target_epoch || m.state != MemberState::Stable {
        let revoke = minus(&m.assigned, &m.target);
        if !revoke.is_empty() {
            m.assigned = and(&m.assigned, &m.target);
            m.revoking = revoke;
            m.state = MemberState::UnrevokedPartitions;
        } else {
            let mut next = m.assigned.clone();
            let mut waiting = false;
            for (t, ps) in &m.target {
                for &p in ps {
                    if next.get(t).is_some_and(|s| s.contains(&p)) {
                        continue;
                    }
                    if free(*t, p) {
                        next.entry(*t).or_default().insert(p);
                    } else {
                        waiting = true;
                    }
                }
            }
            if m.epoch != target_epoch {
                m.previous_epoch = m.epoch;
                m.epoch = target_epoch;
            }
            m.assigned = next;
            m.state = if waiting {
                MemberState::UnreleasedPartitions
            } else {
                MemberState::Stable
            };
        }
    }
    before != (m.epoch, m.state, m.assigned.clone(), m.revoking.clone())
}

/// The consumer groups of one shard. See module docs.
pub struct ConsumerGroups {
    cfg: ConsumerConfig,
    clock: SharedClock,
    groups: BTreeMap<String, Group>,
}

fn err<T>(e: ResponseError, msg: impl Into<String>) -> Option<Result<T, HeartbeatError>> {
    Some(Err((e, Some(msg.into()))))
}

impl ConsumerGroups {
    /// Rebuild from the durable state: every member keeps its epoch and
    /// assignment and gets a fresh session.
    pub fn load(state: &ShardState, cfg: ConsumerConfig, clock: SharedClock) -> Self {
        let now = clock.now();
        let groups = state
            .consumer
            .iter()
            .filter_map(|(id, g)| {
                let rec = g.group.clone()?;
                let members = g
                    .members
                    .iter()
                    .map(|(mid, m)| {
                        let revoke_until = (m.state == MemberState::UnrevokedPartitions)
                            .then(|| now + rebalance_timeout(m));
                        (
                            mid.clone(),
                            Member {
                                rec: m.clone(),
                                session_until: now + cfg.session_timeout,
                                revoke_until,
                                assigned_since: BTreeMap::new(),
                            },
                        )
                    })
                    .collect();
                let mut g = Group {
                    rec,
                    members,
                    dirty: false,
                    regexes_resolved_at: None,
                    regex_refresh_due: None,
                };
                g.dirty = !target_is_whole(&g);
                Some((id.clone(), g))
            })
            .collect();
        Self { cfg, clock, groups }
    }

    /// The settings.
    pub fn config(&self) -> &ConsumerConfig {
        &self.cfg
    }

    /// Whether `group` is a consumer group here.
    pub fn contains(&self, group: &str) -> bool {
        self.groups.contains_key(group)
    }

    /// Whether `group` is a consumer group with members.
    pub fn has_members(&self, group: &str) -> bool {
        self.groups
            .get(group)
            .is_some_and(|g| !g.members.is_empty())
    }

    /// (group id, Kafka state name) of every group.
    pub fn list(&self) -> Vec<(String, &'static str)> {
        self.groups
            .iter()
            .map(|(id, g)| (id.clone(), g.state_name()))
            .collect()
    }

    /// ConsumerGroupDescribe of one group.
    pub fn describe(&self, group: &str) -> Option<DescribedGroup> {
        self.groups.get(group).map(|g| DescribedGroup {
            group: group.to_owned(),
            state: g.state_name(),
            epoch: g.rec.epoch,
            assignment_epoch: g.rec.assignment_epoch,
            assignor: g.rec.assignor.clone(),
            members: g.members.values().map(|m| m.rec.clone()).collect(),
        })
    }

    /// Remove an empty group (DeleteGroups, or a classic JoinGroup
    /// converting it). NON_EMPTY_GROUP while it has members.
    pub fn delete(&mut self, group: &str) -> Result<Vec<ConsumerRecord>, ResponseError> {
        let g = self
            .groups
            .get(group)
            .ok_or(ResponseError::GroupIdNotFound)?;
        if !g.members.is_empty() {
            return Err(ResponseError::NonEmptyGroup);
        }
        self.groups.remove(group);
        Ok(vec![ConsumerRecord::GroupTombstone {
            group: group.to_owned(),
        }])
    }

    /// Kafka's `ConsumerGroup.validateOffsetCommit` with KIP-1251's
    /// assignment epochs: a commit with epoch < 0 is an admin commit, taken
    /// only while the group is empty; otherwise the member must exist
    /// (UNKNOWN_MEMBER_ID) and its epoch be the current one, or an older one
    /// at which it already owned every partition committed
    /// (`assignment epoch <= epoch <= member epoch`), else STALE_MEMBER_EPOCH.
    ///
    /// Why the older epoch: the member's epoch moves when the coordinator
    /// answers a heartbeat, and a commit the client sent before that answer
    /// arrived carries the old one. Kafka's Java client (4.x) fails a
    /// `commitSync` on STALE_MEMBER_EPOCH instead of retrying, so the strict
    /// rule broke every rebalance of a Java consumer that commits after
    /// each poll (tests/e2e/test_java_client.py).
    pub fn validate_commit(
        &self,
        group: &str,
        member_id: &str,
        epoch: i32,
        partitions: &[(&str, i32)],
    ) -> Result<(), ResponseError> {
        let Some(g) = self.groups.get(group) else {
            return Ok(());
        };
        if epoch < 0 && g.members.is_empty() {
            return Ok(());
        }
        let m = g
            .members
            .get(member_id)
            .ok_or(ResponseError::UnknownMemberId)?;
        if epoch == m.rec.epoch {
            return Ok(());
        }
        if epoch > m.rec.epoch || epoch < 0 {
            return Err(ResponseError::StaleMemberEpoch);
        }
        for &(topic, p) in partitions {
            let since = g
                .rec
                .topics
                .get(topic)
                .filter(|t| m.rec.assigned.get(&t.id).is_some_and(|s| s.contains(&p)))
                .map(|t| {
                    m.assigned_since
                        .get(&(t.id, p))
                        .copied()
                        .unwrap_or(m.rec.epoch)
                });
            match since {
                Some(since) if since <= epoch => {}
                _ => return Err(ResponseError::StaleMemberEpoch),
            }
        }
        Ok(())
    }

    /// The earliest deadline a [`ConsumerGroups::tick`] acts on.
    pub fn next_deadline(&self) -> Option<Duration> {
        let members = self
            .groups
            .values()
            .flat_map(|g| g.members.values())
            .flat_map(|m| std::iter::once(m.session_until).chain(m.revoke_until));
        let refreshes = self.groups.values().filter_map(|g| g.regex_refresh_due);
        members.chain(refreshes).min()
    }

    /// Expire sessions and revocations that are due: those members are
    /// removed (their partitions freed) and their groups rebalance. Then run
    /// the regex resolutions that are due.
    pub fn tick(&mut self, topics: &dyn TopicSource) -> Vec<ConsumerRecord> {
        let now = self.clock.now();
        let now_ms = self.clock.now_ms();
        let mut out = Vec::new();
        let ids: Vec<String> = self.groups.keys().cloned().collect();
        for id in ids {
            let Some(g) = self.groups.get_mut(&id) else {
                continue;
            };
            let gone: Vec<String> = g
                .members
                .values()
                .filter(|m| m.session_until <= now || m.revoke_until.is_some_and(|t| t <= now))
                .map(|m| m.rec.member_id.clone())
                .collect();
            if gone.is_empty() {
                continue;
            }
            for mid in &gone {
                tracing::info!(group = %id, member = %mid, "consumer group member expired");
                g.members.remove(mid);
                out.push(ConsumerRecord::MemberTombstone {
                    group: id.clone(),
                    member_id: mid.clone(),
                });
            }
            Self::rebalance(g, topics, now_ms, &mut out);
        }
        for g in self.groups.values_mut() {
            if g.regex_refresh_due.is_some_and(|t| t <= now) {
                Self::resolve_regexes(g, topics, now, now_ms, &mut out);
            }
        }
        out
    }

    /// Resolve every regex the group subscribes to against the topics now
    /// (Kafka's `refreshRegularExpressions`) and, if what one matches
    /// changed, rebalance (`handleRegularExpressionsResult` bumps the group
    /// epoch; the members get the new target at their next heartbeats).
    fn resolve_regexes(
        g: &mut Group,
        topics: &dyn TopicSource,
        now: Duration,
        now_ms: i64,
        out: &mut Vec<ConsumerRecord>,
    ) {
        g.regex_refresh_due = None;
        let regexes: Vec<String> = g
            .subscribed_regexes()
            .into_iter()
            .map(str::to_owned)
            .collect();
        if regexes.is_empty() {
            return;
        }
        let mut changed = false;
        for r in regexes {
            // An invalid regex matches nothing (Kafka logs and ignores it).
            let matched: BTreeSet<String> = topics
                .matching(&r)
                .unwrap_or_default()
                .into_iter()
                .collect();
            if g.rec.regexes.get(&r) != Some(&matched) {
                tracing::info!(
                    group = %g.rec.group,
                    regex = %r,
                    topics = matched.len(),
                    "consumer group regex resolved"
                );
                g.rec.regexes.insert(r, matched);
                changed = true;
            }
        }
        g.regexes_resolved_at = Some(now);
        if changed {
            Self::rebalance(g, topics, now_ms, out);
        }
    }

    /// Bump the group epoch and recompute the target assignment; appends
    /// the group record and every member whose target changed.
    fn rebalance(
        g: &mut Group,
        topics: &dyn TopicSource,
        now_ms: i64,
        out: &mut Vec<ConsumerRecord>,
    ) {
        g.dirty = false;
        g.prune_regexes();
        g.rec.epoch = g.rec.epoch.saturating_add(1);
        g.rec.topics = subscribed_metadata(g, topics);
        g.rec.assignor = choose_assignor(g);
        g.rec.state_ms = now_ms;
        let parts: BTreeMap<Uuid, i32> = g
            .rec
            .topics
            .values()
            .map(|t| (t.id, t.partitions))
            .collect();
        let new_target = {
            let ms: Vec<AssignorMember<'_>> = g
                .members
                .values()
                .map(|m| AssignorMember {
                    id: &m.rec.member_id,
                    topics: member_topics(&m.rec, &g.rec.topics, &g.rec.regexes),
                    previous: Some(&m.rec.target),
                })
                .collect();
            assignor::assign(&g.rec.assignor, &ms, &parts)
        };
        g.rec.assignment_epoch = g.rec.epoch;
        out.push(ConsumerRecord::Group(g.rec.clone()));
        for (mid, target) in new_target {
            if let Some(m) = g.members.get_mut(&mid) {
                if m.rec.target != target {
                    m.rec.target = target;
                    out.push(ConsumerRecord::Member {
                        group: g.rec.group.clone(),
                        member: Box::new(m.rec.clone()),
                    });
                }
            }
        }
    }

    /// ConsumerGroupHeartbeat. `classic_conflict`: the group id is a
    /// classic group with members (GROUP_ID_NOT_FOUND, as Kafka answers a
    /// group of the other type); an empty classic group is the caller's to
    /// remove first (the upgrade).
    pub fn heartbeat(
        &mut self,
        req: ConsumerHeartbeat,
        topics: &dyn TopicSource,
        classic_conflict: bool,
    ) -> Outcome<HeartbeatAnswer> {
        let mut out = Outcome::default();
        if let Err(e) = validate(&req) {
            out.result = Some(Err(e));
            return out;
        }
        if classic_conflict {
            out.result = err(
                ResponseError::GroupIdNotFound,
                format!("group {} is not a consumer group", req.group_id),
            );
            return out;
        }
        let now = self.clock.now();
        let now_ms = self.clock.now_ms();
        let cfg = self.cfg.clone();
        let interval = i32::try_from(cfg.heartbeat_interval.as_millis()).unwrap_or(i32::MAX);
        let gid = req.group_id.clone();

        if req.member_epoch == -1 || req.member_epoch == -2 {
            let Some(g) = self.groups.get_mut(&gid) else {
                out.result = err(ResponseError::UnknownMemberId, "unknown member");
                return out;
            };
            let Some(m) = g.members.get_mut(&req.member_id) else {
                out.result = err(ResponseError::UnknownMemberId, "unknown member");
                return out;
            };
            if req.member_epoch == -2 && m.rec.instance_id.is_some() {
                // Static leave: kept, with its assignment, for the session;
                // its epoch waits in `previous_epoch` for its return.
                if m.rec.epoch != -2 {
                    m.rec.previous_epoch = m.rec.epoch;
                    m.rec.epoch = -2;
                }
                out.persist.extend(g.member_record(&req.member_id));
            } else {
                g.members.remove(&req.member_id);
                out.persist.push(ConsumerRecord::MemberTombstone {
                    group: gid.clone(),
                    member_id: req.member_id.clone(),
                });
                Self::rebalance(g, topics, now_ms, &mut out.persist);
            }
            out.result = Some(Ok(HeartbeatAnswer {
                member_id: req.member_id,
                member_epoch: req.member_epoch,
                heartbeat_interval_ms: 0,
                assignment: None,
            }));
            return out;
        }

        let is_new_group = !self.groups.contains_key(&gid);
        if is_new_group && req.member_epoch != 0 {
            out.result = err(ResponseError::UnknownMemberId, "unknown member");
            return out;
        }
        let g = self.groups.entry(gid.clone()).or_insert_with(|| Group {
            rec: GroupRecord {
                group: gid.clone(),
                epoch: 0,
                assignment_epoch: 0,
                assignor: assignor::UNIFORM.to_owned(),
                topics: BTreeMap::new(),
                state_ms: now_ms,
                regexes: BTreeMap::new(),
            },
            members: BTreeMap::new(),
            dirty: false,
            regexes_resolved_at: None,
            regex_refresh_due: None,
        });
        let mut changed_group = false;
        let member_id = if req.member_id.is_empty() {
            Uuid::new_v4().simple().to_string()
        } else {
            req.member_id.clone()
        };

        if req.member_epoch == 0 {
            // A static member's instance id held by another member id.
            let holder = req.instance_id.as_ref().and_then(|iid| {
                g.members
                    .values()
                    .find(|m| {
                        m.rec.instance_id.as_ref() == Some(iid) && m.rec.member_id != member_id
                    })
                    .map(|m| (m.rec.member_id.clone(), m.rec.epoch))
            });
            match holder {
                Some((_, e)) if e != -2 => {
                    if is_new_group {
                        self.groups.remove(&gid);
                    }
                    out.result = err(
                        ResponseError::UnreleasedInstanceId,
                        "instance id is still in use by another member",
                    );
                    return out;
                }
                Some((old, _)) => {
                    // The static member is back under a new member id: it
                    // takes over assignment and epoch, no rebalance.
                    if let Some(mut m) = g.members.remove(&old) {
                        out.persist.push(ConsumerRecord::MemberTombstone {
                            group: gid.clone(),
                            member_id: old,
                        });
                        m.rec.member_id = member_id.clone();
                        m.rec.epoch = m.rec.previous_epoch.max(0);
                        g.members.insert(member_id.clone(), m);
                    }
                }
                None => {
                    // Rejoining with epoch 0: it lost its state; what it
                    // owned is released and it joins afresh.
                    g.members.remove(&member_id);
                    if g.members.len() >= cfg.max_size {
                        if is_new_group {
                            self.groups.remove(&gid);
                        }
                        out.result = err(
                            ResponseError::GroupMaxSizeReached,
                            format!("the group has reached its maximum size of {}", cfg.max_size),
                        );
                        return out;
                    }
                    g.members.insert(
                        member_id.clone(),
                        Member {
                            rec: MemberRecord {
                                member_id: member_id.clone(),
                                instance_id: req.instance_id.clone(),
                                rack_id: None,
                                client_id: req.client_id.clone(),
                                client_host: req.client_host.clone(),
                                topics: Vec::new(),
                                regex: None,
                                assignor: None,
                                rebalance_timeout_ms: req.rebalance_timeout_ms,
                                epoch: 0,
                                previous_epoch: -1,
                                state: MemberState::Stable,
                                assigned: Assignment::new(),
                                revoking: Assignment::new(),
                                target: Assignment::new(),
                            },
                            session_until: now + cfg.session_timeout,
                            revoke_until: None,
                            assigned_since: BTreeMap::new(),
                        },
                    );
                    changed_group = true;
                }
            }
        } else {
            let Some(m) = g.members.get(&member_id) else {
                out.result = err(ResponseError::UnknownMemberId, "unknown member");
                return out;
            };
            // A heartbeat need not repeat its instance id (Kafka looks the
            // member up by id then); one that names another is fenced.
            if req.instance_id.is_some() && m.rec.instance_id != req.instance_id {
                out.result = err(ResponseError::FencedInstanceId, "instance id mismatch");
                return out;
            }
            let e = m.rec.epoch;
            let lost_response = req.member_epoch == m.rec.previous_epoch
                && req
                    .owned
                    .as_ref()
                    .is_some_and(|o| subset(o, &m.rec.assigned));
            if req.member_epoch > e || (req.member_epoch < e && !lost_response) {
                out.result = err(
                    ResponseError::FencedMemberEpoch,
                    format!(
                        "member epoch {} does not match the expected {e}",
                        req.member_epoch
                    ),
                );
                return out;
            }
        }
        // A static member reusing its own member id after a -2 leave.
        let Some(m) = g.members.get_mut(&member_id) else {
            out.result = err(ResponseError::UnknownMemberId, "unknown member");
            return out;
        };
        if m.rec.epoch == -2 {
            m.rec.epoch = m.rec.previous_epoch.max(0);
        }
        m.session_until = now + cfg.session_timeout;
        // Subscription and metadata fields the request changes.
        let mut member_changed = false;
        if let Some(t) = &req.topics {
            let mut t = t.clone();
            t.sort();
            t.dedup();
            if t != m.rec.topics {
                m.rec.topics = t;
                changed_group = true;
            }
        }
        if let Some(r) = &req.regex {
            let r = (!r.is_empty()).then(|| r.clone());
            if r != m.rec.regex {
                // Kafka's rule: a change rebalances at once only if what the
                // member's regexes resolve to changes now, i.e. the old
                // regex or the new one is resolved already; a new regex
                // waits for its resolution (the tick), which rebalances.
                let resolved =
                    |x: &Option<String>| x.as_ref().is_some_and(|x| g.rec.regexes.contains_key(x));
                if resolved(&m.rec.regex) || resolved(&r) {
                    changed_group = true;
                } else {
                    member_changed = true;
                }
                m.rec.regex = r;
            }
        }
        if let Some(a) = &req.assignor {
            if m.rec.assignor.as_ref() != Some(a) {
                m.rec.assignor = Some(a.clone());
                changed_group = true;
            }
        }
        if req.rack_id.is_some() && req.rack_id != m.rec.rack_id {
            m.rec.rack_id = req.rack_id.clone();
            member_changed = true;
        }
        if req.rebalance_timeout_ms >= 0 && req.rebalance_timeout_ms != m.rec.rebalance_timeout_ms {
            m.rec.rebalance_timeout_ms = req.rebalance_timeout_ms;
            member_changed = true;
        }
        if !req.client_id.is_empty() && req.client_id != m.rec.client_id {
            m.rec.client_id = req.client_id.clone();
            member_changed = true;
        }
        // A metadata change (new partitions, a topic created or deleted)
        // of the subscribed topics rebalances too.
        if !changed_group && (g.dirty || subscribed_metadata(g, topics) != g.rec.topics) {
            changed_group = true;
        }
        // After the answer: resolve a new regex, or all of them again.
        g.maybe_schedule_refresh(now, cfg.regex_refresh_min_interval);
        if changed_group {
            Self::rebalance(g, topics, now_ms, &mut out.persist);
        }
        // Reconcile the member towards its target.
        let owners: BTreeMap<(Uuid, i32), String> = g
            .owners()
            .into_iter()
            .map(|(k, v)| (k, v.to_owned()))
            .collect();
        let target_epoch = g.rec.assignment_epoch;
        let Some(m) = g.members.get_mut(&member_id) else {
            out.result = err(ResponseError::UnknownMemberId, "unknown member");
            return out;
        };
        let was_unrevoked = m.rec.state == MemberState::UnrevokedPartitions;
        let owned = if req.member_epoch == 0 {
            // A joining member owns nothing the coordinator gave it.
            Some(Assignment::new())
        } else {
            req.owned.clone()
        };
        let reconciled = reconcile(&mut m.rec, target_epoch, owned.as_ref(), |t, p| {
            owners.get(&(t, p)).is_none_or(|o| *o == member_id)
        });
        m.sync_assigned_since();
        if m.rec.state == MemberState::UnrevokedPartitions {
            if !was_unrevoked || m.revoke_until.is_none() {
                m.revoke_until = Some(now + rebalance_timeout(&m.rec));
            }
        } else {
            m.revoke_until = None;
        }
        if reconciled || member_changed || req.member_epoch == 0 {
            out.persist.extend(g.member_record(&member_id));
        }
        let m = &g.members[&member_id];
        out.result = Some(Ok(HeartbeatAnswer {
            member_id,
            member_epoch: m.rec.epoch,
            heartbeat_interval_ms: interval,
            assignment: Some(m.rec.assigned.clone()),
        }));
        out
    }

    /// Member epoch validation of an OffsetFetch v9+ (Kafka's
    /// `validateOffsetFetch`): no member (admin) is always allowed.
    pub fn validate_fetch(
        &self,
        group: &str,
        member_id: Option<&str>,
        epoch: i32,
    ) -> Result<(), ResponseError> {
        let Some(member_id) = member_id else {
            return Ok(());
        };
        if epoch < 0 && member_id.is_empty() {
            return Ok(());
        }
        let Some(g) = self.groups.get(group) else {
            return Ok(());
        };
        let m = g
            .members
            .get(member_id)
            .ok_or(ResponseError::UnknownMemberId)?;
        if epoch != m.rec.epoch {
            return Err(ResponseError::StaleMemberEpoch);
        }
        Ok(())
    }

    /// The topic names the members of `group` subscribe to (OffsetDelete's
    /// GROUP_SUBSCRIBED_TO_TOPIC); regexes count as their last matches.
    pub fn subscribed_topics(&self, group: &str) -> BTreeSet<String> {
        self.groups
            .get(group)
            .map(|g| {
                g.members
                    .values()
                    .flat_map(|m| m.rec.topics.iter().cloned())
                    .chain(g.rec.topics.keys().cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The groups with no members whose last change is at or before
    /// `before_ms` (offset retention counts from then).
    pub fn empty_since(&self, before_ms: i64) -> Vec<String> {
        self.groups
            .iter()
            .filter(|(_, g)| g.members.is_empty() && g.rec.state_ms <= before_ms)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Whether an offset of `group` is kept from expiry (a group with
    /// members keeps all its offsets, as Kafka's Stable groups do).
    pub fn keeps_offsets(&self, group: &str) -> bool {
        self.has_members(group)
    }
}

/// Whether a group's targets read back form one assignment: assigned at
/// the group's epoch, no partition in two targets, every partition of the
/// subscribed topics in one.
fn target_is_whole(g: &Group) -> bool {
    if g.members.is_empty() {
        return true;
    }
    if g.rec.assignment_epoch != g.rec.epoch {
        return false;
    }
    let mut seen = BTreeSet::new();
    for m in g.members.values() {
        for (t, ps) in &m.rec.target {
            for p in ps {
                if !seen.insert((*t, *p)) {
                    return false;
                }
            }
        }
    }
    let subscribed = subscribed_names(g);
    g.rec
        .topics
        .iter()
        .filter(|(n, _)| subscribed.contains(n))
        .all(|(_, t)| (0..t.partitions).all(|p| seen.contains(&(t.id, p))))
}

fn rebalance_timeout(m: &MemberRecord) -> Duration {
    Duration::from_millis(u64::try_from(m.rebalance_timeout_ms).unwrap_or(0).max(1000))
}

/// Kafka's request checks (`throwIfConsumerGroupHeartbeatRequestIsInvalid`).
fn validate(req: &ConsumerHeartbeat) -> Result<(), HeartbeatError> {
    let invalid = |m: &str| Err((ResponseError::InvalidRequest, Some(m.to_owned())));
    if req.group_id.is_empty() {
        return invalid("GroupId can't be empty.");
    }
    if req.instance_id.as_deref() == Some("") {
        return invalid("InstanceId can't be empty.");
    }
    if req.rack_id.as_deref() == Some("") {
        return invalid("RackId can't be empty.");
    }
    match req.member_epoch {
        0 => {
            if req.rebalance_timeout_ms == -1 {
                return invalid("RebalanceTimeoutMs must be provided in first request.");
            }
            if req.owned.as_ref().is_some_and(|o| !o.is_empty()) {
                return invalid("TopicPartitions must be empty when (re-)joining.");
            }
            if req.topics.is_none() && req.regex.is_none() {
                return invalid(
                    "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.",
                );
            }
        }
        -1 | -2 => {
            if req.member_id.is_empty() {
                return invalid("MemberId can't be empty.");
            }
            if req.member_epoch == -2 && req.instance_id.is_none() {
                return invalid("InstanceId can't be null when leaving temporarily.");
            }
        }
        e if e > 0 => {
            if req.member_id.is_empty() {
                return invalid("MemberId can't be empty.");
            }
        }
        _ => return invalid("MemberEpoch is invalid."),
    }
    if let Some(a) = &req.assignor {
        if !assignor::ASSIGNORS.contains(&a.as_str()) {
            return Err((
                ResponseError::UnsupportedAssignor,
                Some(format!(
                    "ServerAssignor {a} is not supported. Supported assignors: uniform, range."
                )),
            ));
        }
    }
    Ok(())
}

/// The most requested assignor among the members, else the default.
fn choose_assignor(g: &Group) -> String {
    let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
    for m in g.members.values() {
        if let Some(a) = &m.rec.assignor {
            *votes.entry(a.as_str()).or_default() += 1;
        }
    }
    votes
        .into_iter()
        .max_by_key(|(name, n)| (*n, std::cmp::Reverse(*name)))
        .map_or_else(|| assignor::UNIFORM.to_owned(), |(n, _)| n.to_owned())
}

/// The topics one member subscribes to: its names plus its regex's
/// resolved matches, as ids (topics that do not exist are left out).
fn member_topics(
    m: &MemberRecord,
    meta: &BTreeMap<String, TopicMeta>,
    resolved: &BTreeMap<String, BTreeSet<String>>,
) -> BTreeSet<Uuid> {
    let matched = m
        .regex
        .as_ref()
        .and_then(|r| resolved.get(r))
        .into_iter()
        .flatten();
    m.topics
        .iter()
        .chain(matched)
        .filter_map(|n| meta.get(n).map(|t| t.id))
        .collect()
}

/// The names the group subscribes to: literal names and what the resolved
/// regexes matched (an unresolved regex adds nothing yet).
fn subscribed_names(g: &Group) -> BTreeSet<&String> {
    let mut names: BTreeSet<&String> = BTreeSet::new();
    for m in g.members.values() {
        names.extend(m.rec.topics.iter());
        if let Some(matched) = m.rec.regex.as_ref().and_then(|r| g.rec.regexes.get(r)) {
            names.extend(matched.iter());
        }
    }
    names
}

/// The metadata of every topic the group subscribes to.
fn subscribed_metadata(g: &Group, topics: &dyn TopicSource) -> BTreeMap<String, TopicMeta> {
    subscribed_names(g)
        .into_iter()
        .filter_map(|n| topics.topic(n).map(|t| (n.clone(), t)))
        .collect()
}

#[cfg(test)]
mod tests;
