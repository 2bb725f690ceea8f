//! The classic group membership protocol (JoinGroup / SyncGroup /
//! Heartbeat / LeaveGroup) as a plain state machine, after Kafka's
//! `GroupCoordinator` / `ClassicGroup`.
//!
//! States: `Empty` → (a join) `PreparingRebalance` → (every member rejoined,
//! or the rebalance timeout) `CompletingRebalance` → (the leader's
//! SyncGroup) `Stable`; any membership change in `CompletingRebalance` or
//! `Stable` goes back to `PreparingRebalance`; a group whose last member
//! left becomes `Empty` with a new generation; a deleted group is `Dead`.
//!
//! Inputs are requests plus the clock ([`Clock`]); a request whose answer
//! waits for the rebalance (JoinGroup until the join phase completes,
//! SyncGroup until the leader's assignment) is remembered by the caller's
//! [`ReplyId`] and answered later in an [`Output`]. Every [`Output`] that
//! carries `persist` records must have them appended to the shard log and
//! made durable *before* its replies are delivered (Kafka answers the
//! leader's SyncGroup only after the group record is written). Timers are
//! [`ClassicGroups::tick`] at [`ClassicGroups::next_deadline`].
//!
//! Errors are Kafka's codes ([`ResponseError`]) because they are the
//! protocol's semantics, not a mapping of internal failures: the broker's
//! API layer passes them through.
//!
//! Deliberate differences from Kafka: a static member that rejoins within
//! its session timeout replaces the old member without a rebalance only if
//! its protocol metadata is unchanged as well as the selected protocol
//! (Kafka checks only the protocol, so a restarted static member with a new
//! subscription keeps its stale assignment); ties in protocol selection are
//! broken by name, not by hash order; a group has at most
//! [`GroupConfig::max_size`] members (Kafka's default is unbounded).

use super::offsets::{GroupMetadata, MemberMetadata};
use crate::clock::SharedClock;
use kaas_protocol::kafka_protocol::ResponseError;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The caller's name for a request awaiting its response.
pub type ReplyId = u64;

/// Broker settings of the classic protocol.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// `group.min.session.timeout.ms`.
    pub min_session: Duration,
    /// `group.max.session.timeout.ms`.
    pub max_session: Duration,
    /// `group.initial.rebalance.delay.ms`: the first rebalance of an empty
    /// group waits this long (extended while members keep arriving) so a
    /// starting fleet lands in one generation.
    pub initial_rebalance_delay: Duration,
    /// `group.max.size`.
    pub max_size: usize,
    /// A new member that joined but never completed a join is removed
    /// after this (Kafka's NewMemberJoinTimeoutMs).
    pub new_member_join_timeout: Duration,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            min_session: Duration::from_secs(6),
            max_session: Duration::from_secs(1800),
            initial_rebalance_delay: Duration::from_secs(3),
            max_size: 1000,
            new_member_join_timeout: Duration::from_secs(300),
        }
    }
}

/// A group's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// No members.
    Empty,
    /// Waiting for members to (re)join.
    PreparingRebalance,
    /// Joined; waiting for the leader's assignment.
    CompletingRebalance,
    /// Assigned.
    Stable,
    /// Deleted.
    Dead,
}

impl GroupState {
    /// The name Kafka's ListGroups / DescribeGroups use.
    pub fn kafka_name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// A JoinGroup request, version differences already resolved.
#[derive(Debug, Clone, Default)]
pub struct JoinGroup {
    /// The group.
    pub group_id: String,
    /// Empty on a first join.
    pub member_id: String,
    /// `group.instance.id` (v5+).
    pub instance_id: Option<String>,
    /// The client id of the request header.
    pub client_id: String,
    /// The client's address.
    pub client_host: String,
    /// Session timeout (ms).
    pub session_timeout_ms: i32,
    /// Rebalance timeout (ms); v0 has none (-1: the session timeout).
    pub rebalance_timeout_ms: i32,
    /// `consumer`, `connect`, …
    pub protocol_type: String,
    /// (name, metadata) in the member's order of preference.
    pub protocols: Vec<(String, Vec<u8>)>,
    /// v4+: a first join gets MEMBER_ID_REQUIRED and a member id.
    pub require_known_member_id: bool,
}

/// One member as the leader sees it in its JoinGroup response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedMember {
    /// Member id.
    pub member_id: String,
    /// `group.instance.id`.
    pub instance_id: Option<String>,
    /// Its metadata for the selected protocol.
    pub metadata: Vec<u8>,
}

/// A JoinGroup response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinResponse {
    /// The error, if any.
    pub error: Option<ResponseError>,
    /// Generation (-1 on error).
    pub generation_id: i32,
    /// Protocol type.
    pub protocol_type: Option<String>,
    /// The selected protocol.
    pub protocol_name: Option<String>,
    /// The leader's member id.
    pub leader: String,
    /// The member's id (issued on a first join).
    pub member_id: String,
    /// For the leader only: every member and its metadata.
    pub members: Vec<JoinedMember>,
}

impl JoinResponse {
    fn error(member_id: &str, e: ResponseError) -> Self {
        Self {
            error: Some(e),
            generation_id: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            member_id: member_id.to_string(),
            members: Vec::new(),
        }
    }
}

/// A SyncGroup request.
#[derive(Debug, Clone, Default)]
pub struct SyncGroup {
    /// The group.
    pub group_id: String,
    /// The member's generation.
    pub generation_id: i32,
    /// Member id.
    pub member_id: String,
    /// `group.instance.id`.
    pub instance_id: Option<String>,
    /// v5+: must match the group's.
    pub protocol_type: Option<String>,
    /// v5+: must match the group's.
    pub protocol_name: Option<String>,
    /// The leader's assignment, (member id, assignment); empty for others.
    pub assignments: Vec<(String, Vec<u8>)>,
}

/// A SyncGroup response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncResponse {
    /// The error, if any.
    pub error: Option<ResponseError>,
    /// Protocol type.
    pub protocol_type: Option<String>,
    /// Selected protocol.
    pub protocol_name: Option<String>,
    /// This member's assignment.
    pub assignment: Vec<u8>,
}

impl SyncResponse {
    fn error(e: ResponseError) -> Self {
        Self {
            error: Some(e),
            protocol_type: None,
            protocol_name: None,
            assignment: Vec::new(),
        }
    }
}

/// A Heartbeat request.
#[derive(Debug, Clone, Default)]
pub struct Heartbeat {
    /// The group.
    pub group_id: String,
    /// The member's generation.
    pub generation_id: i32,
    /// Member id.
    pub member_id: String,
    /// `group.instance.id`.
    pub instance_id: Option<String>,
}

/// One member leaving (LeaveGroup v3+ batches them).
#[derive(Debug, Clone, Default)]
pub struct Leaving {
    /// Member id (may be empty for a static member named by instance id).
    pub member_id: String,
    /// `group.instance.id`.
    pub instance_id: Option<String>,
}

/// A LeaveGroup response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaveResponse {
    /// Top-level error.
    pub error: Option<ResponseError>,
    /// Per member: (member id, instance id, error).
    pub members: Vec<(String, Option<String>, Option<ResponseError>)>,
}

/// A deferred (or immediate) response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// To a JoinGroup.
    Join(JoinResponse),
    /// To a SyncGroup.
    Sync(SyncResponse),
}

/// What a step produced. Deliver `replies` only after `persist` is durable.
#[derive(Debug, Default)]
pub struct Output {
    /// Responses to deliver, by reply id.
    pub replies: Vec<(ReplyId, Response)>,
    /// Group records to append to the shard log first.
    pub persist: Vec<GroupMetadata>,
}

impl Output {
    fn join(&mut self, to: ReplyId, r: JoinResponse) {
        self.replies.push((to, Response::Join(r)));
    }
    fn sync(&mut self, to: ReplyId, r: SyncResponse) {
        self.replies.push((to, Response::Sync(r)));
    }
}

#[derive(Debug, Clone)]
struct Member {
    id: String,
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocols: Vec<(String, Vec<u8>)>,
    assignment: Vec<u8>,
    awaiting_join: Option<ReplyId>,
    awaiting_sync: Option<ReplyId>,
    heartbeat_deadline: Duration,
    is_new: bool,
    joined_at: Duration,
    seq: u64,
}

impl Member {
    fn metadata(&self, protocol: Option<&str>) -> Vec<u8> {
        self.protocols
            .iter()
            .find(|(n, _)| Some(n.as_str()) == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone, Copy)]
struct InitialDelay {
    until: Duration,
    remaining: Duration,
    new_member_added: bool,
}

/// One classic group.
#[derive(Debug, Clone)]
pub struct ClassicGroup {
    id: String,
    state: GroupState,
    protocol_type: Option<String>,
    protocol: Option<String>,
    generation: i32,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    static_members: BTreeMap<String, String>,
    /// Member ids handed out with MEMBER_ID_REQUIRED → expiry.
    pending: BTreeMap<String, Duration>,
    /// Members that have not sent SyncGroup in this generation.
    pending_sync: BTreeSet<String>,
    rebalance_deadline: Option<Duration>,
    initial: Option<InitialDelay>,
    sync_deadline: Option<Duration>,
    state_ms: i64,
    seq: u64,
    // The two settings a group needs at every step travel with it.
    initial_delay: Duration,
    new_member_join_timeout: Duration,
}

impl ClassicGroup {
    fn new(id: &str, now_ms: i64, cfg: &GroupConfig) -> Self {
        Self {
            id: id.to_string(),
            state: GroupState::Empty,
            protocol_type: None,
            protocol: None,
            generation: 0,
            leader: None,
            members: BTreeMap::new(),
            static_members: BTreeMap::new(),
            pending: BTreeMap::new(),
            pending_sync: BTreeSet::new(),
            rebalance_deadline: None,
            initial: None,
            sync_deadline: None,
            state_ms: now_ms,
            seq: 0,
            initial_delay: cfg.initial_rebalance_delay,
            new_member_join_timeout: cfg.new_member_join_timeout,
        }
    }

    /// Current state.
    pub fn state(&self) -> GroupState {
        self.state
    }
    /// Current generation.
    pub fn generation(&self) -> i32 {
        self.generation
    }
    /// The leader's member id.
    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }
    /// The selected protocol.
    pub fn protocol(&self) -> Option<&str> {
        self.protocol.as_deref()
    }
    /// Member ids.
    pub fn member_ids(&self) -> impl Iterator<Item = &str> {
        self.members.keys().map(String::as_str)
    }

    /// The group id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The protocol type (`consumer`, `connect`), once a member joined.
    pub fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }

    fn is_fenced(&self, instance_id: Option<&str>, member_id: &str) -> bool {
        instance_id
            .and_then(|i| self.static_members.get(i))
            .is_some_and(|m| m != member_id)
    }

    fn max_rebalance_timeout(&self) -> Duration {
        self.members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or_default()
    }

    /// Protocols every member supports.
    fn candidates(&self) -> Vec<&str> {
        let Some(first) = self.members.values().next() else {
            return Vec::new();
        };
        first
            .protocols
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(p, _)| p == n))
            })
            .collect()
    }

    fn supports(&self, protocol_type: &str, protocols: &[(String, Vec<u8>)]) -> bool {
        if self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        self.protocol_type.as_deref() == Some(protocol_type)
            && self
                .candidates()
                .iter()
                .any(|c| protocols.iter().any(|(p, _)| p == c))
    }

    /// Kafka's `selectProtocol`: each member votes for its most preferred
    /// protocol among those all members support; the most votes wins.
    fn select_protocol(&self) -> Option<String> {
        let candidates = self.candidates();
        let mut votes: BTreeMap<&str, usize> = candidates.iter().map(|c| (*c, 0)).collect();
        for m in self.members.values() {
            if let Some((p, _)) = m
                .protocols
                .iter()
                .find(|(p, _)| candidates.contains(&p.as_str()))
            {
                *votes.entry(p.as_str()).or_default() += 1;
            }
        }
        // max_by_key keeps the last of equals; iterate names in reverse so
        // a tie goes to the smallest name.
        votes
            .into_iter()
            .rev()
            .max_by_key(|(_, n)| *n)
            .map(|(p, _)| p.to_string())
    }

    fn members_for_leader(&self) -> Vec<JoinedMember> {
        let mut ms: Vec<&Member> = self.members.values().collect();
        ms.sort_by_key(|m| m.seq);
        ms.into_iter()
            .map(|m| JoinedMember {
                member_id: m.id.clone(),
                instance_id: m.instance_id.clone(),
                metadata: m.metadata(self.protocol.as_deref()),
            })
            .collect()
    }

    fn join_ok(&self, member_id: &str, leader_view: bool, leader: Option<&str>) -> JoinResponse {
        JoinResponse {
            error: None,
            generation_id: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader: leader
                .or(self.leader.as_deref())
                .unwrap_or_default()
                .to_string(),
            member_id: member_id.to_string(),
            members: if leader_view {
                self.members_for_leader()
            } else {
                Vec::new()
            },
        }
    }

    /// The record persisted at the end of a rebalance.
    pub fn to_record(&self) -> GroupMetadata {
        let mut ms: Vec<&Member> = self.members.values().collect();
        ms.sort_by_key(|m| m.seq);
        GroupMetadata {
            group: self.id.clone(),
            protocol_type: self.protocol_type.clone(),
            generation: self.generation,
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            state_ms: self.state_ms,
            members: ms
                .into_iter()
                .map(|m| MemberMetadata {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: duration_ms(m.rebalance_timeout),
                    session_timeout_ms: duration_ms(m.session_timeout),
                    subscription: m.metadata(self.protocol.as_deref()),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    /// Rebuild a group from its last durable record (takeover): members are
    /// given a fresh session, as Kafka does on load.
    pub fn from_record(r: &GroupMetadata, now: Duration, cfg: &GroupConfig) -> Self {
        let mut g = Self::new(&r.group, r.state_ms, cfg);
        g.protocol_type = r.protocol_type.clone();
        g.protocol = r.protocol.clone();
        g.generation = r.generation;
        g.leader = r.leader.clone();
        for (i, m) in r.members.iter().enumerate() {
            let session = ms_duration(m.session_timeout_ms);
            let member = Member {
                id: m.member_id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                session_timeout: session,
                rebalance_timeout: ms_duration(m.rebalance_timeout_ms),
                protocols: r
                    .protocol
                    .iter()
                    .map(|p| (p.clone(), m.subscription.clone()))
                    .collect(),
                assignment: m.assignment.clone(),
                awaiting_join: None,
                awaiting_sync: None,
                heartbeat_deadline: now + session,
                is_new: false,
                joined_at: now,
                seq: i as u64,
            };
            if let Some(i) = &m.instance_id {
                g.static_members.insert(i.clone(), m.member_id.clone());
            }
            g.members.insert(m.member_id.clone(), member);
        }
        g.seq = r.members.len() as u64;
        g.state = if g.members.is_empty() {
            GroupState::Empty
        } else {
            GroupState::Stable
        };
        g
    }

    fn add_member(&mut self, mut m: Member, now: Duration, now_ms: i64, out: &mut Output) {
        self.seq += 1;
        m.seq = self.seq;
        if let Some(i) = &m.instance_id {
            self.static_members.insert(i.clone(), m.id.clone());
        }
        if self.leader.is_none() {
            self.leader = Some(m.id.clone());
        }
        if let Some(d) = self.initial.as_mut() {
            d.new_member_added = true;
        }
        self.members.insert(m.id.clone(), m);
        self.prepare_rebalance(now, now_ms, out);
        self.try_complete_join(now, now_ms, out);
    }

    fn prepare_rebalance(&mut self, now: Duration, now_ms: i64, out: &mut Output) {
        match self.state {
            GroupState::PreparingRebalance | GroupState::Dead => return,
            GroupState::CompletingRebalance => {
                for m in self.members.values_mut() {
                    if let Some(r) = m.awaiting_sync.take() {
                        out.sync(r, SyncResponse::error(ResponseError::RebalanceInProgress));
                    }
                }
                self.pending_sync.clear();
                self.sync_deadline = None;
            }
            GroupState::Empty | GroupState::Stable => {}
        }
        let timeout = self.max_rebalance_timeout();
        if self.state == GroupState::Empty && !self.initial_delay.is_zero() {
            let first = self.initial_delay.min(timeout);
            self.initial = Some(InitialDelay {
                until: now + first,
                remaining: timeout.saturating_sub(first),
                new_member_added: false,
            });
            self.rebalance_deadline = None;
        } else {
            self.rebalance_deadline = Some(now + timeout);
        }
        self.state = GroupState::PreparingRebalance;
        self.state_ms = now_ms;
        self.try_complete_join(now, now_ms, out);
    }

    fn try_complete_join(&mut self, now: Duration, now_ms: i64, out: &mut Output) {
        if self.state == GroupState::PreparingRebalance
            && self.initial.is_none()
            && self.pending.is_empty()
            && self.members.values().all(|m| m.awaiting_join.is_some())
        {
            self.complete_join(now, now_ms, out);
        }
    }

    fn complete_join(&mut self, now: Duration, now_ms: i64, out: &mut Output) {
        self.rebalance_deadline = None;
        self.initial = None;
        // Dynamic members that did not rejoin in time are out; static ones
        // keep their place until their session expires (Kafka does the same).
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| m.awaiting_join.is_none() && m.instance_id.is_none())
            .map(|m| m.id.clone())
            .collect();
        for id in gone {
            self.drop_member(&id, out);
        }
        self.generation = self.generation.wrapping_add(1);
        self.state_ms = now_ms;
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.protocol = None;
            self.leader = None;
            out.persist.push(self.to_record());
            return;
        }
        self.protocol = self.select_protocol();
        let leader_ok = self
            .leader
            .as_ref()
            .and_then(|l| self.members.get(l))
            .is_some_and(|m| m.awaiting_join.is_some());
        if !leader_ok {
            let mut awaiting: Vec<&Member> = self
                .members
                .values()
                .filter(|m| m.awaiting_join.is_some())
                .collect();
            awaiting.sort_by_key(|m| m.seq);
            if let Some(m) = awaiting.first() {
                self.leader = Some(m.id.clone());
            } else if !self
                .leader
                .as_ref()
                .is_some_and(|l| self.members.contains_key(l))
            {
                self.leader = self
                    .members
                    .values()
                    .min_by_key(|m| m.seq)
                    .map(|m| m.id.clone());
            }
        }
        self.state = GroupState::CompletingRebalance;
        self.pending_sync = self.members.keys().cloned().collect();
        self.sync_deadline = Some(now + self.max_rebalance_timeout());
        let leader = self.leader.clone();
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let is_leader = leader.as_deref() == Some(id.as_str());
            let resp = self.join_ok(&id, is_leader, None);
            if let Some(m) = self.members.get_mut(&id) {
                if let Some(r) = m.awaiting_join.take() {
                    m.is_new = false;
                    m.heartbeat_deadline = now + m.session_timeout;
                    out.join(r, resp);
                }
            }
        }
    }

    /// Remove a member and answer whatever it was waiting for.
    fn drop_member(&mut self, id: &str, out: &mut Output) {
        let Some(m) = self.members.remove(id) else {
            return;
        };
        if let Some(i) = &m.instance_id {
            if self.static_members.get(i).map(String::as_str) == Some(id) {
                self.static_members.remove(i);
            }
        }
        if let Some(r) = m.awaiting_join {
            out.join(r, JoinResponse::error(id, ResponseError::UnknownMemberId));
        }
        if let Some(r) = m.awaiting_sync {
            out.sync(r, SyncResponse::error(ResponseError::UnknownMemberId));
        }
        self.pending_sync.remove(id);
        if self.leader.as_deref() == Some(id) {
            self.leader = self
                .members
                .values()
                .min_by_key(|m| m.seq)
                .map(|m| m.id.clone());
        }
    }

    fn remove_member(&mut self, id: &str, now: Duration, now_ms: i64, out: &mut Output) {
        self.drop_member(id, out);
        match self.state {
            GroupState::Dead | GroupState::Empty => {}
            GroupState::Stable | GroupState::CompletingRebalance => {
                self.prepare_rebalance(now, now_ms, out)
            }
            GroupState::PreparingRebalance => self.try_complete_join(now, now_ms, out),
        }
    }

    fn next_deadline(&self) -> Option<Duration> {
        let hb = self.members.values().map(|m| {
            if m.awaiting_join.is_some() && m.is_new {
                m.joined_at + self.new_member_join_timeout
            } else {
                m.heartbeat_deadline
            }
        });
        hb.chain(self.pending.values().copied())
            .chain(self.rebalance_deadline)
            .chain(self.initial.map(|d| d.until))
            .chain(self.sync_deadline)
            .min()
    }
}

fn duration_ms(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

fn ms_duration(ms: i32) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Every classic group of one shard, and the request entry points.
pub struct ClassicGroups {
    groups: BTreeMap<String, ClassicGroup>,
    cfg: GroupConfig,
    clock: SharedClock,
}

impl ClassicGroups {
    /// No groups yet.
    pub fn new(cfg: GroupConfig, clock: SharedClock) -> Self {
        Self {
            groups: BTreeMap::new(),
            cfg,
            clock,
        }
    }

    /// Rebuild from a shard's durable records (takeover).
    pub fn load<'a>(
        records: impl IntoIterator<Item = &'a GroupMetadata>,
        cfg: GroupConfig,
        clock: SharedClock,
    ) -> Self {
        let now = clock.now();
        let groups = records
            .into_iter()
            .map(|r| (r.group.clone(), ClassicGroup::from_record(r, now, &cfg)))
            .collect();
        Self { groups, cfg, clock }
    }

    /// A group, if it exists.
    pub fn get(&self, group_id: &str) -> Option<&ClassicGroup> {
        self.groups.get(group_id)
    }

    /// Every group.
    pub fn iter(&self) -> impl Iterator<Item = &ClassicGroup> {
        self.groups.values()
    }

    fn now(&self) -> (Duration, i64) {
        (self.clock.now(), self.clock.now_ms())
    }

    /// JoinGroup. The response to `reply` is in the output, now or later.
    pub fn join(&mut self, req: JoinGroup, reply: ReplyId) -> Output {
        let mut out = Output::default();
        let (now, now_ms) = self.now();
        let fail = |out: &mut Output, e| out.join(reply, JoinResponse::error(&req.member_id, e));
        if req.group_id.is_empty() {
            fail(&mut out, ResponseError::InvalidGroupId);
            return out;
        }
        let session = match u64::try_from(req.session_timeout_ms) {
            Ok(ms) => Duration::from_millis(ms),
            Err(_) => Duration::ZERO,
        };
        if session < self.cfg.min_session || session > self.cfg.max_session {
            fail(&mut out, ResponseError::InvalidSessionTimeout);
            return out;
        }
        let rebalance = if req.rebalance_timeout_ms <= 0 {
            session
        } else {
            ms_duration(req.rebalance_timeout_ms)
        };
        // Duplicate protocol names would count twice in selection: keep
        // the member's first (most preferred) entry.
        let mut seen = BTreeSet::new();
        let protocols: Vec<(String, Vec<u8>)> = req
            .protocols
            .iter()
            .filter(|(n, _)| seen.insert(n.clone()))
            .cloned()
            .collect();
        if !req.member_id.is_empty() && !self.groups.contains_key(&req.group_id) {
            fail(&mut out, ResponseError::UnknownMemberId);
            return out;
        }
        let cfg = self.cfg.clone();
        let g = self
            .groups
            .entry(req.group_id.clone())
            .or_insert_with(|| ClassicGroup::new(&req.group_id, now_ms, &cfg));
        if g.state == GroupState::Dead {
            fail(&mut out, ResponseError::CoordinatorNotAvailable);
            return out;
        }
        if !g.supports(&req.protocol_type, &protocols) {
            fail(&mut out, ResponseError::InconsistentGroupProtocol);
            if g.members.is_empty() && g.pending.is_empty() && g.generation == 0 {
                // Do not keep a group that a refused first join created.
                self.groups.remove(&req.group_id);
            }
            return out;
        }
        let member = |id: String| Member {
            id,
            instance_id: req.instance_id.clone(),
            client_id: req.client_id.clone(),
            client_host: req.client_host.clone(),
            session_timeout: session,
            rebalance_timeout: rebalance,
            protocols: protocols.clone(),
            assignment: Vec::new(),
            awaiting_join: Some(reply),
            awaiting_sync: None,
            heartbeat_deadline: now + session,
            is_new: true,
            joined_at: now,
            seq: 0,
        };
        let full = g.members.len() + g.pending.len() >= cfg.max_size;
        if req.member_id.is_empty() {
            let known_static = req
                .instance_id
                .as_ref()
                .and_then(|i| g.static_members.get(i))
                .cloned();
            if let Some(old_id) = known_static {
                let prefix = req.instance_id.as_deref().unwrap_or_default();
                let new_id = format!("{prefix}-{}", uuid::Uuid::new_v4());
                replace_static(g, &old_id, member(new_id), now, now_ms, &mut out);
                return out;
            }
            if full {
                fail(&mut out, ResponseError::GroupMaxSizeReached);
                return out;
            }
            let prefix = req.instance_id.as_deref().unwrap_or(&req.client_id);
            let new_id = format!("{prefix}-{}", uuid::Uuid::new_v4());
            if req.instance_id.is_none() && req.require_known_member_id {
                g.pending.insert(new_id.clone(), now + session);
                out.join(
                    reply,
                    JoinResponse::error(&new_id, ResponseError::MemberIdRequired),
                );
                return out;
            }
            if g.members.is_empty() {
                g.protocol_type = Some(req.protocol_type.clone());
            }
            g.add_member(member(new_id), now, now_ms, &mut out);
            return out;
        }
        if g.pending.remove(&req.member_id).is_some() {
            if g.members.is_empty() {
                g.protocol_type = Some(req.protocol_type.clone());
            }
            g.add_member(member(req.member_id.clone()), now, now_ms, &mut out);
            return out;
        }
        if g.is_fenced(req.instance_id.as_deref(), &req.member_id) {
            fail(&mut out, ResponseError::FencedInstanceId);
            return out;
        }
        let Some(m) = g.members.get_mut(&req.member_id) else {
            fail(&mut out, ResponseError::UnknownMemberId);
            return out;
        };
        let unchanged = m.protocols == protocols;
        let is_leader = g.leader.as_deref() == Some(req.member_id.as_str());
        match g.state {
            GroupState::Empty | GroupState::Dead => {
                fail(&mut out, ResponseError::UnknownMemberId);
                return out;
            }
            GroupState::CompletingRebalance | GroupState::Stable
                if unchanged && (g.state == GroupState::CompletingRebalance || !is_leader) =>
            {
                // Nothing changed: the member learns the current generation.
                m.heartbeat_deadline = now + m.session_timeout;
                let resp = g.join_ok(&req.member_id, is_leader, None);
                out.join(reply, resp);
                return out;
            }
            _ => {}
        }
        if let Some(old) = m.awaiting_join.replace(reply) {
            out.join(
                old,
                JoinResponse::error(&req.member_id, ResponseError::RebalanceInProgress),
            );
        }
        m.protocols = protocols;
        m.session_timeout = session;
        m.rebalance_timeout = rebalance;
        m.heartbeat_deadline = now + session;
        g.prepare_rebalance(now, now_ms, &mut out);
        g.try_complete_join(now, now_ms, &mut out);
        out
    }

    /// SyncGroup. The response to `reply` is in the output, now or later.
    pub fn sync(&mut self, req: SyncGroup, reply: ReplyId) -> Output {
        let mut out = Output::default();
        let (now, now_ms) = self.now();
        let _ = now_ms;
        let fail = |out: &mut Output, e| out.sync(reply, SyncResponse::error(e));
        let Some(g) = self.groups.get_mut(&req.group_id) else {
            fail(&mut out, ResponseError::UnknownMemberId);
            return out;
        };
        if g.state == GroupState::Dead {
            fail(&mut out, ResponseError::CoordinatorNotAvailable);
            return out;
        }
        if g.is_fenced(req.instance_id.as_deref(), &req.member_id) {
            fail(&mut out, ResponseError::FencedInstanceId);
            return out;
        }
        if !g.members.contains_key(&req.member_id) {
            fail(&mut out, ResponseError::UnknownMemberId);
            return out;
        }
        if req.generation_id != g.generation {
            fail(&mut out, ResponseError::IllegalGeneration);
            return out;
        }
        let mismatch =
            |want: &Option<String>, have: &Option<String>| want.is_some() && want != have;
        if mismatch(&req.protocol_type, &g.protocol_type)
            || mismatch(&req.protocol_name, &g.protocol)
        {
            fail(&mut out, ResponseError::InconsistentGroupProtocol);
            return out;
        }
        match g.state {
            GroupState::Empty | GroupState::Dead => fail(&mut out, ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => fail(&mut out, ResponseError::RebalanceInProgress),
            GroupState::Stable => {
                let resp = g.sync_ok(&req.member_id);
                if let Some(m) = g.members.get_mut(&req.member_id) {
                    m.heartbeat_deadline = now + m.session_timeout;
                }
                out.sync(reply, resp);
            }
            GroupState::CompletingRebalance => {
                if let Some(m) = g.members.get_mut(&req.member_id) {
                    if let Some(old) = m.awaiting_sync.replace(reply) {
                        out.sync(old, SyncResponse::error(ResponseError::RebalanceInProgress));
                    }
                    m.heartbeat_deadline = now + m.session_timeout;
                }
                g.pending_sync.remove(&req.member_id);
                if g.leader.as_deref() == Some(req.member_id.as_str()) {
                    // Unknown member ids are ignored; a member the leader
                    // left out gets an empty assignment (as in Kafka).
                    let mut assigned: BTreeMap<&str, &Vec<u8>> = BTreeMap::new();
                    for (id, a) in &req.assignments {
                        assigned.insert(id, a);
                    }
                    for m in g.members.values_mut() {
                        m.assignment = assigned
                            .get(m.id.as_str())
                            .map(|a| (*a).clone())
                            .unwrap_or_default();
                    }
                    g.state = GroupState::Stable;
                    g.sync_deadline = None;
                    g.pending_sync.clear();
                    let ids: Vec<String> = g.members.keys().cloned().collect();
                    for id in ids {
                        let resp = g.sync_ok(&id);
                        if let Some(r) = g.members.get_mut(&id).and_then(|m| m.awaiting_sync.take())
                        {
                            out.sync(r, resp);
                        }
                    }
                    out.persist.push(g.to_record());
                }
            }
        }
        out
    }

    /// Whether an OffsetCommit (or, `transactional`, a TxnOffsetCommit) by
    /// (`member_id`, `instance_id`, `generation_id`) may be written, with
    /// Kafka's rules (`ClassicGroup.validateOffsetCommit`): a commit with
    /// generation -1, no member and no instance id is an admin / standalone
    /// commit, taken only while the group has no members; any other commit
    /// must come from a current member of the current generation, and not
    /// while the group waits for its assignment. A commit during the join
    /// phase is taken (an eager member commits before it rejoins).
    ///
    /// A transactional commit is held to less, as in Kafka: without member
    /// fields (TxnOffsetCommit before v3 has none) it is taken whatever the
    /// group's state, and a member's is taken while the group completes a
    /// rebalance (the group state is not enforced for transactions).
    pub fn validate_commit(
        &self,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
        transactional: bool,
    ) -> Result<(), ResponseError> {
        let Some(g) = self.groups.get(group_id) else {
            return if generation_id < 0 {
                Ok(())
            } else {
                // Kafka: a generation for a group that does not exist.
                Err(ResponseError::IllegalGeneration)
            };
        };
        if g.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        if generation_id >= 0 || !member_id.is_empty() || instance_id.is_some() {
            if g.is_fenced(instance_id, member_id) {
                return Err(ResponseError::FencedInstanceId);
            }
            if !g.members.contains_key(member_id) {
                return Err(ResponseError::UnknownMemberId);
            }
            if generation_id != g.generation {
                return Err(ResponseError::IllegalGeneration);
            }
        } else if !transactional && g.state != GroupState::Empty {
            return Err(ResponseError::UnknownMemberId);
        }
        if !transactional && g.state == GroupState::CompletingRebalance {
            return Err(ResponseError::RebalanceInProgress);
        }
        Ok(())
    }

    /// Heartbeat: answered at once.
    pub fn heartbeat(&mut self, req: &Heartbeat) -> Result<(), ResponseError> {
        let now = self.clock.now();
        let g = self
            .groups
            .get_mut(&req.group_id)
            .ok_or(ResponseError::UnknownMemberId)?;
        if g.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        if g.is_fenced(req.instance_id.as_deref(), &req.member_id) {
            return Err(ResponseError::FencedInstanceId);
        }
        let m = g
            .members
            .get_mut(&req.member_id)
            .ok_or(ResponseError::UnknownMemberId)?;
        if req.generation_id != g.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        match g.state {
            GroupState::Empty | GroupState::Dead => Err(ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => {
                m.heartbeat_deadline = now + m.session_timeout;
                Err(ResponseError::RebalanceInProgress)
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                m.heartbeat_deadline = now + m.session_timeout;
                Ok(())
            }
        }
    }

    /// LeaveGroup (batched, v3+; earlier versions are a batch of one).
    pub fn leave(&mut self, group_id: &str, leaving: &[Leaving]) -> (LeaveResponse, Output) {
        let mut out = Output::default();
        let (now, now_ms) = self.now();
        let each = |e| {
            leaving
                .iter()
                .map(|l| (l.member_id.clone(), l.instance_id.clone(), e))
                .collect()
        };
        let Some(g) = self.groups.get_mut(group_id) else {
            let members = each(Some(ResponseError::UnknownMemberId));
            return (
                LeaveResponse {
                    error: None,
                    members,
                },
                out,
            );
        };
        if g.state == GroupState::Dead {
            let members = each(None);
            return (
                LeaveResponse {
                    error: Some(ResponseError::CoordinatorNotAvailable),
                    members,
                },
                out,
            );
        }
        let mut members = Vec::with_capacity(leaving.len());
        for l in leaving {
            let id = if l.member_id.is_empty() {
                l.instance_id
                    .as_ref()
                    .and_then(|i| g.static_members.get(i))
                    .cloned()
            } else {
                Some(l.member_id.clone())
            };
            let err = match id {
                None => Some(ResponseError::UnknownMemberId),
                Some(id) if g.is_fenced(l.instance_id.as_deref(), &id) => {
                    Some(ResponseError::FencedInstanceId)
                }
                Some(id) if g.pending.remove(&id).is_some() => {
                    g.try_complete_join(now, now_ms, &mut out);
                    None
                }
                Some(id) if !g.members.contains_key(&id) => Some(ResponseError::UnknownMemberId),
                Some(id) => {
                    g.remove_member(&id, now, now_ms, &mut out);
                    None
                }
            };
            members.push((l.member_id.clone(), l.instance_id.clone(), err));
        }
        (
            LeaveResponse {
                error: None,
                members,
            },
            out,
        )
    }

    /// Delete an empty group (DeleteGroups): it is Dead and gone. The
    /// caller appends the tombstones (group and offsets).
    pub fn delete(&mut self, group_id: &str) -> Result<(), ResponseError> {
        let g = self
            .groups
            .get_mut(group_id)
            .ok_or(ResponseError::GroupIdNotFound)?;
        if g.state != GroupState::Empty {
            return Err(ResponseError::NonEmptyGroup);
        }
        g.state = GroupState::Dead;
        self.groups.remove(group_id);
        Ok(())
    }

    /// The earliest instant a [`ClassicGroups::tick`] has work.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.groups
            .values()
            .filter_map(ClassicGroup::next_deadline)
            .min()
    }

    /// Run the timers due now: session expiry, pending member expiry, the
    /// initial delay, rebalance and sync timeouts.
    pub fn tick(&mut self) -> Output {
        let mut out = Output::default();
        let (now, now_ms) = self.now();
        for g in self.groups.values_mut() {
            let expired_pending: Vec<String> = g
                .pending
                .iter()
                .filter(|(_, d)| **d <= now)
                .map(|(id, _)| id.clone())
                .collect();
            for id in expired_pending {
                g.pending.remove(&id);
                g.try_complete_join(now, now_ms, &mut out);
            }
            let expired: Vec<String> = g
                .members
                .values()
                .filter(|m| {
                    if m.awaiting_join.is_some() {
                        m.is_new && now >= m.joined_at + g.new_member_join_timeout
                    } else {
                        m.awaiting_sync.is_none() && now >= m.heartbeat_deadline
                    }
                })
                .map(|m| m.id.clone())
                .collect();
            for id in expired {
                tracing::info!(group = %g.id, member = %id, "member session expired");
                g.remove_member(&id, now, now_ms, &mut out);
            }
            if let Some(d) = g.initial {
                if now >= d.until {
                    if d.new_member_added && !d.remaining.is_zero() {
                        let next = g.initial_delay.min(d.remaining);
                        g.initial = Some(InitialDelay {
                            until: now + next,
                            remaining: d.remaining.saturating_sub(next),
                            new_member_added: false,
                        });
                    } else {
                        g.initial = None;
                        g.complete_join(now, now_ms, &mut out);
                    }
                }
            }
            if g.rebalance_deadline.is_some_and(|d| now >= d)
                && g.state == GroupState::PreparingRebalance
            {
                g.complete_join(now, now_ms, &mut out);
            }
            if g.sync_deadline.is_some_and(|d| now >= d)
                && g.state == GroupState::CompletingRebalance
            {
                let late: Vec<String> = g.pending_sync.iter().cloned().collect();
                g.sync_deadline = None;
                for id in late {
                    g.remove_member(&id, now, now_ms, &mut out);
                }
            }
        }
        out
    }
}

impl ClassicGroup {
    fn sync_ok(&self, member_id: &str) -> SyncResponse {
        SyncResponse {
            error: None,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            assignment: self
                .members
                .get(member_id)
                .map(|m| m.assignment.clone())
                .unwrap_or_default(),
        }
    }
}

/// A known static member rejoined with a new member id: the new id takes
/// the old one's place (and assignment); the old id is fenced.
fn replace_static(
    g: &mut ClassicGroup,
    old_id: &str,
    mut new: Member,
    now: Duration,
    now_ms: i64,
    out: &mut Output,
) {
    let Some(old) = g.members.remove(old_id) else {
        return;
    };
    if let Some(r) = old.awaiting_join {
        out.join(
            r,
            JoinResponse::error(old_id, ResponseError::FencedInstanceId),
        );
    }
    if let Some(r) = old.awaiting_sync {
        out.sync(r, SyncResponse::error(ResponseError::FencedInstanceId));
    }
    let prior_leader = g.leader.clone();
    let unchanged = old.protocols == new.protocols;
    new.seq = old.seq;
    new.assignment = old.assignment;
    new.is_new = false;
    if let Some(i) = &new.instance_id {
        g.static_members.insert(i.clone(), new.id.clone());
    }
    if g.leader.as_deref() == Some(old_id) {
        g.leader = Some(new.id.clone());
    }
    if g.pending_sync.remove(old_id) {
        g.pending_sync.insert(new.id.clone());
    }
    let new_id = new.id.clone();
    g.members.insert(new_id.clone(), new);
    match g.state {
        GroupState::Stable if unchanged && g.select_protocol() == g.protocol => {
            // No rebalance. The old leader id is returned so a restarted
            // leader does not compute an assignment a Stable group would
            // never broadcast (Kafka does the same).
            let resp = g.join_ok(&new_id, false, prior_leader.as_deref());
            if let Some(r) = g
                .members
                .get_mut(&new_id)
                .and_then(|m| m.awaiting_join.take())
            {
                out.join(r, resp);
            }
            // The new member id must be durable before the member uses it.
            out.persist.push(g.to_record());
        }
        GroupState::Stable | GroupState::CompletingRebalance => {
            g.prepare_rebalance(now, now_ms, out);
        }
        _ => g.try_complete_join(now, now_ms, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use std::sync::Arc;

    const S: Duration = Duration::from_secs(1);

    fn groups(delay: Duration) -> (ClassicGroups, Arc<FakeClock>) {
        let clock = FakeClock::new();
        let cfg = GroupConfig {
            initial_rebalance_delay: delay,
            max_size: 5,
            ..GroupConfig::default()
        };
        (ClassicGroups::new(cfg, clock.clone()), clock)
    }

    fn join_req(member: &str, instance: Option<&str>, meta: &[u8]) -> JoinGroup {
        JoinGroup {
            group_id: "g".into(),
            member_id: member.into(),
            instance_id: instance.map(Into::into),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: vec![
                ("range".into(), meta.to_vec()),
                ("roundrobin".into(), vec![]),
            ],
            require_known_member_id: true,
        }
    }

    fn join_reply(out: &Output, to: ReplyId) -> JoinResponse {
        match out.replies.iter().find(|(r, _)| *r == to) {
            Some((_, Response::Join(j))) => j.clone(),
            other => panic!("no join reply to {to}: {other:?} in {out:?}"),
        }
    }

    fn sync_reply(out: &Output, to: ReplyId) -> SyncResponse {
        match out.replies.iter().find(|(r, _)| *r == to) {
            Some((_, Response::Sync(s))) => s.clone(),
            other => panic!("no sync reply to {to}: {other:?} in {out:?}"),
        }
    }

    fn sync_req(member: &str, generation: i32, assignments: Vec<(String, Vec<u8>)>) -> SyncGroup {
        SyncGroup {
            group_id: "g".into(),
            generation_id: generation,
            member_id: member.into(),
            assignments,
            ..SyncGroup::default()
        }
    }

    fn hb(gs: &mut ClassicGroups, member: &str, generation: i32) -> Result<(), ResponseError> {
        gs.heartbeat(&Heartbeat {
            group_id: "g".into(),
            generation_id: generation,
            member_id: member.into(),
            instance_id: None,
        })
    }

    /// OffsetCommit validation: a stale generation is ILLEGAL_GENERATION, a
    /// stranger UNKNOWN_MEMBER_ID, an admin commit to a live group refused,
    /// and a current member of the current generation accepted.
    #[test]
    fn offset_commits_are_validated_like_kafka() {
        let (mut gs, clock) = groups(3 * S);
        assert_eq!(gs.validate_commit("none", "", None, -1, false), Ok(()));
        let (ids, generation) = stable_three(&mut gs, &clock);
        assert_eq!(
            gs.validate_commit("g", &ids[1], None, generation, false),
            Ok(())
        );
        assert_eq!(
            gs.validate_commit("g", &ids[1], None, generation - 1, false),
            Err(ResponseError::IllegalGeneration)
        );
        assert_eq!(
            gs.validate_commit("g", "stranger", None, generation, false),
            Err(ResponseError::UnknownMemberId)
        );
        assert_eq!(
            gs.validate_commit("g", "", None, -1, false),
            Err(ResponseError::UnknownMemberId)
        );
        assert_eq!(gs.get("g").unwrap().id(), "g");
        assert_eq!(gs.get("g").unwrap().protocol_type(), Some("consumer"));
    }

    /// Three dynamic members through the v4 two-step join and one sync.
    /// Returns their member ids (leader first) and the generation.
    fn stable_three(gs: &mut ClassicGroups, clock: &FakeClock) -> (Vec<String>, i32) {
        let mut ids = Vec::new();
        for i in 0..3u64 {
            let out = gs.join(join_req("", None, &[i as u8]), 10 + i);
            let r = join_reply(&out, 10 + i);
            assert_eq!(r.error, Some(ResponseError::MemberIdRequired));
            let out = gs.join(join_req(&r.member_id, None, &[i as u8]), 20 + i);
            assert!(out.replies.is_empty(), "waits for the initial delay");
            ids.push(r.member_id);
        }
        // Members arrived during the initial delay, so it is extended once
        // (Kafka's InitialDelayedJoin), then the join completes.
        clock.advance(3 * S);
        assert!(gs.tick().replies.is_empty());
        clock.advance(3 * S);
        let out = gs.tick();
        let replies: Vec<JoinResponse> = (0..3).map(|i| join_reply(&out, 20 + i)).collect();
        let generation = replies[0].generation_id;
        assert_eq!(generation, 1);
        assert_eq!(replies[0].leader, ids[0]);
        assert_eq!(replies[0].protocol_name.as_deref(), Some("range"));
        assert_eq!(replies[0].members.len(), 3, "the leader gets every member");
        assert_eq!(replies[0].members[2].metadata, vec![2]);
        assert!(replies[1].members.is_empty() && replies[2].members.is_empty());
        assert_eq!(
            gs.get("g").unwrap().state(),
            GroupState::CompletingRebalance
        );
        // Followers sync first and wait; the leader's sync answers everyone.
        assert!(gs
            .sync(sync_req(&ids[1], generation, vec![]), 31)
            .replies
            .is_empty());
        assert!(gs
            .sync(sync_req(&ids[2], generation, vec![]), 32)
            .replies
            .is_empty());
        let assignments = ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.clone(), vec![100 + i as u8]))
            .collect();
        let out = gs.sync(sync_req(&ids[0], generation, assignments), 30);
        for i in 0..3 {
            let s = sync_reply(&out, 30 + i);
            assert_eq!((s.error, s.assignment), (None, vec![100 + i as u8]));
        }
        assert_eq!(
            out.persist.len(),
            1,
            "the generation is persisted before the answers"
        );
        assert_eq!(out.persist[0].members.len(), 3);
        assert_eq!(gs.get("g").unwrap().state(), GroupState::Stable);
        (ids, generation)
    }

    #[test]
    fn three_members_join_and_sync() {
        let (mut gs, clock) = groups(3 * S);
        stable_three(&mut gs, &clock);
    }

    #[test]
    fn a_silent_member_is_expelled_after_its_session_and_the_group_rebalances() {
        let (mut gs, clock) = groups(3 * S);
        let (ids, generation) = stable_three(&mut gs, &clock);
        for _ in 0..4 {
            clock.advance(3 * S);
            hb(&mut gs, &ids[0], generation).unwrap();
            hb(&mut gs, &ids[1], generation).unwrap();
            let out = gs.tick();
            assert!(out.replies.is_empty());
        }
        let g = gs.get("g").unwrap();
        assert_eq!(g.state(), GroupState::PreparingRebalance);
        assert!(!g.member_ids().any(|m| m == ids[2]));
        assert_eq!(
            hb(&mut gs, &ids[0], generation),
            Err(ResponseError::RebalanceInProgress)
        );
        assert_eq!(
            hb(&mut gs, &ids[2], generation),
            Err(ResponseError::UnknownMemberId)
        );
        gs.join(join_req(&ids[0], None, &[0]), 40);
        let out = gs.join(join_req(&ids[1], None, &[1]), 41);
        assert_eq!(join_reply(&out, 40).generation_id, generation + 1);
        assert_eq!(join_reply(&out, 40).members.len(), 2);
    }

    #[test]
    fn a_static_member_restarted_within_its_session_causes_no_rebalance() {
        let (mut gs, clock) = groups(Duration::ZERO);
        let a = join_reply(&gs.join(join_req("", Some("a"), &[1]), 1), 1);
        assert_eq!(
            a.generation_id, 1,
            "static members need no MEMBER_ID_REQUIRED"
        );
        gs.sync(sync_req(&a.member_id, 1, vec![]), 2);
        // b joins: a rebalance to generation 2 with both.
        let out = gs.join(join_req("", Some("b"), &[2]), 3);
        assert!(out.replies.is_empty());
        let out = gs.join(join_req(&a.member_id, Some("a"), &[1]), 4);
        let b = join_reply(&out, 3);
        assert_eq!(b.generation_id, 2);
        gs.sync(sync_req(&b.member_id, 2, vec![]), 5);
        let assignments = vec![
            (a.member_id.clone(), b"A".to_vec()),
            (b.member_id.clone(), b"B".to_vec()),
        ];
        let mut s = sync_req(&a.member_id, 2, assignments);
        s.instance_id = Some("a".into());
        gs.sync(s, 6);
        assert_eq!(gs.get("g").unwrap().state(), GroupState::Stable);
        // b restarts and rejoins with a new (empty) member id, same metadata.
        clock.advance(5 * S);
        let out = gs.join(join_req("", Some("b"), &[2]), 7);
        let b2 = join_reply(&out, 7);
        assert_eq!(b2.error, None);
        assert_ne!(b2.member_id, b.member_id);
        assert_eq!(b2.generation_id, 2, "no new generation");
        assert_eq!(b2.leader, a.member_id);
        assert_eq!(out.persist.len(), 1, "the new member id is persisted first");
        assert_eq!(gs.get("g").unwrap().state(), GroupState::Stable);
        let s = sync_reply(&gs.sync(sync_req(&b2.member_id, 2, vec![]), 8), 8);
        assert_eq!(s.assignment, b"B".to_vec(), "keeps its assignment");
        let fenced = gs.heartbeat(&Heartbeat {
            group_id: "g".into(),
            generation_id: 2,
            member_id: b.member_id.clone(),
            instance_id: Some("b".into()),
        });
        assert_eq!(fenced, Err(ResponseError::FencedInstanceId));
        // A restart with different metadata does rebalance.
        gs.join(join_req("", Some("b"), &[9]), 9);
        assert_eq!(gs.get("g").unwrap().state(), GroupState::PreparingRebalance);
    }

    #[test]
    fn a_stale_generation_is_an_illegal_generation() {
        let (mut gs, clock) = groups(3 * S);
        let (ids, generation) = stable_three(&mut gs, &clock);
        assert_eq!(
            hb(&mut gs, &ids[1], generation - 1),
            Err(ResponseError::IllegalGeneration)
        );
        let out = gs.sync(sync_req(&ids[1], generation + 1, vec![]), 50);
        assert_eq!(
            sync_reply(&out, 50).error,
            Some(ResponseError::IllegalGeneration)
        );
        assert_eq!(hb(&mut gs, &ids[1], generation), Ok(()));
    }

    /// TxnOffsetCommit is validated like an OffsetCommit but, as in Kafka,
    /// without member fields it is taken by a live group, and a member's is
    /// taken while the group completes a rebalance; a wrong generation or
    /// a stranger is refused all the same.
    #[test]
    fn transactional_commits_are_validated_like_kafka() {
        let (mut gs, _clock) = groups(Duration::ZERO);
        assert_eq!(gs.validate_commit("none", "", None, -1, true), Ok(()));
        assert_eq!(
            gs.validate_commit("none", "m", None, 3, true),
            Err(ResponseError::IllegalGeneration)
        );
        let r = join_reply(&gs.join(join_req("", None, &[0]), 1), 1);
        let a = join_reply(&gs.join(join_req(&r.member_id, None, &[0]), 2), 2);
        assert_eq!(
            gs.get("g").unwrap().state(),
            GroupState::CompletingRebalance
        );
        let (m, generation) = (a.member_id.as_str(), a.generation_id);
        assert_eq!(
            gs.validate_commit("g", m, None, generation, false),
            Err(ResponseError::RebalanceInProgress)
        );
        assert_eq!(gs.validate_commit("g", m, None, generation, true), Ok(()));
        assert_eq!(gs.validate_commit("g", "", None, -1, true), Ok(()));
        assert_eq!(
            gs.validate_commit("g", "", None, -1, false),
            Err(ResponseError::UnknownMemberId)
        );
        assert_eq!(
            gs.validate_commit("g", m, None, generation + 1, true),
            Err(ResponseError::IllegalGeneration)
        );
        assert_eq!(
            gs.validate_commit("g", "stranger", None, generation, true),
            Err(ResponseError::UnknownMemberId)
        );
    }

    #[test]
    fn a_join_during_completing_rebalance_restarts_it() {
        let (mut gs, _clock) = groups(Duration::ZERO);
        let r = join_reply(&gs.join(join_req("", None, &[0]), 1), 1);
        let a = join_reply(&gs.join(join_req(&r.member_id, None, &[0]), 2), 2);
        assert_eq!(
            gs.get("g").unwrap().state(),
            GroupState::CompletingRebalance
        );
        // A follower would wait here; the leader is waiting for its sync too.
        let newcomer = join_reply(&gs.join(join_req("", None, &[1]), 3), 3);
        gs.join(join_req(&newcomer.member_id, None, &[1]), 4);
        assert_eq!(gs.get("g").unwrap().state(), GroupState::PreparingRebalance);
        let out = gs.sync(sync_req(&a.member_id, a.generation_id, vec![]), 5);
        assert_eq!(
            sync_reply(&out, 5).error,
            Some(ResponseError::RebalanceInProgress)
        );
        let out = gs.join(join_req(&a.member_id, None, &[0]), 6);
        assert_eq!(join_reply(&out, 6).generation_id, a.generation_id + 1);
        assert_eq!(join_reply(&out, 4).generation_id, a.generation_id + 1);
    }

    #[test]
    fn a_pending_sync_is_told_to_rejoin_when_a_member_joins() {
        let (mut gs, clock) = groups(3 * S);
        let (ids, generation) = stable_three(&mut gs, &clock);
        // The leader rejoins (e.g. a new subscription): back to preparing.
        let out = gs.join(join_req(&ids[0], None, &[7]), 60);
        assert!(out.replies.is_empty());
        assert_eq!(
            hb(&mut gs, &ids[1], generation),
            Err(ResponseError::RebalanceInProgress)
        );
    }

    #[test]
    fn leave_group_of_the_leader_triggers_a_rebalance() {
        let (mut gs, clock) = groups(3 * S);
        let (ids, generation) = stable_three(&mut gs, &clock);
        let leaving = [
            Leaving {
                member_id: ids[0].clone(),
                instance_id: None,
            },
            Leaving {
                member_id: "nobody".into(),
                instance_id: None,
            },
        ];
        let (resp, _) = gs.leave("g", &leaving);
        assert_eq!(resp.members[0].2, None);
        assert_eq!(resp.members[1].2, Some(ResponseError::UnknownMemberId));
        assert_eq!(gs.get("g").unwrap().state(), GroupState::PreparingRebalance);
        gs.join(join_req(&ids[1], None, &[1]), 70);
        let out = gs.join(join_req(&ids[2], None, &[2]), 71);
        let r = join_reply(&out, 70);
        assert_eq!(r.generation_id, generation + 1);
        assert!(r.leader == ids[1] || r.leader == ids[2]);
        assert_ne!(r.leader, ids[0]);
    }

    #[test]
    fn members_that_do_not_rejoin_within_the_rebalance_timeout_are_removed() {
        let (mut gs, clock) = groups(3 * S);
        let (ids, generation) = stable_three(&mut gs, &clock);
        gs.join(join_req(&ids[0], None, &[5]), 80);
        clock.advance(5 * S);
        hb(&mut gs, &ids[1], generation).unwrap_err();
        gs.join(join_req(&ids[1], None, &[1]), 81);
        // ids[2] keeps heartbeating but never rejoins.
        for _ in 0..10 {
            clock.advance(3 * S);
            let _ = hb(&mut gs, &ids[2], generation);
            let out = gs.tick();
            if !out.replies.is_empty() {
                assert_eq!(join_reply(&out, 80).members.len(), 2);
                assert!(!gs.get("g").unwrap().member_ids().any(|m| m == ids[2]));
                return;
            }
        }
        panic!("the rebalance never completed");
    }

    #[test]
    fn client_input_is_refused_with_kafka_errors_never_a_panic() {
        let (mut gs, _clock) = groups(Duration::ZERO);
        let err = |gs: &mut ClassicGroups, req: JoinGroup| join_reply(&gs.join(req, 1), 1).error;
        let mut bad = join_req("", None, &[]);
        bad.protocols.clear();
        assert_eq!(
            err(&mut gs, bad),
            Some(ResponseError::InconsistentGroupProtocol)
        );
        assert!(
            gs.get("g").is_none(),
            "a refused first join leaves no group"
        );
        let mut bad = join_req("", None, &[]);
        bad.session_timeout_ms = -1;
        assert_eq!(
            err(&mut gs, bad),
            Some(ResponseError::InvalidSessionTimeout)
        );
        let mut bad = join_req("", None, &[]);
        bad.group_id.clear();
        assert_eq!(err(&mut gs, bad), Some(ResponseError::InvalidGroupId));
        assert_eq!(
            err(&mut gs, join_req("ghost", None, &[])),
            Some(ResponseError::UnknownMemberId)
        );
        // A group exists; another protocol type does not fit it.
        let first = join_reply(&gs.join(join_req("", None, &[0]), 1), 1);
        gs.join(join_req(&first.member_id, None, &[0]), 2);
        let mut other = join_req("", None, &[]);
        other.protocol_type = "connect".into();
        assert_eq!(
            err(&mut gs, other),
            Some(ResponseError::InconsistentGroupProtocol)
        );
        // A flood of first joins: at most max_size members + pending.
        let mut refused = 0;
        for i in 0..10_000 {
            let mut req = join_req("", None, &vec![0xff; i % 64]);
            req.protocols.push(("range".into(), vec![1])); // a duplicate name
            if err(&mut gs, req) == Some(ResponseError::GroupMaxSizeReached) {
                refused += 1;
            }
        }
        assert_eq!(refused, 10_000 - 4);
        let (resp, _) = gs.leave("nope", &[Leaving::default()]);
        assert_eq!(resp.members[0].2, Some(ResponseError::UnknownMemberId));
        assert_eq!(gs.delete("g"), Err(ResponseError::NonEmptyGroup));
    }

    #[test]
    fn a_group_survives_takeover_through_its_record() {
        let (mut gs, clock) = groups(3 * S);
        let (ids, generation) = stable_three(&mut gs, &clock);
        let rec = gs.get("g").unwrap().to_record();
        let mut loaded = ClassicGroups::load([&rec], GroupConfig::default(), clock.clone());
        assert_eq!(loaded.get("g").unwrap().state(), GroupState::Stable);
        assert_eq!(hb(&mut loaded, &ids[1], generation), Ok(()));
        let s = sync_reply(&loaded.sync(sync_req(&ids[2], generation, vec![]), 1), 1);
        assert_eq!(s.assignment, vec![102]);
    }
}
