//! The [`GroupCoordinator`]'s KIP-848 handlers: ConsumerGroupHeartbeat,
//! ConsumerGroupDescribe, the consumer half of ListGroups and the OffsetFetch
//! v9 member check, plus where the two protocols meet (a classic JoinGroup
//! on a consumer group). The state machine is
//! [`ConsumerGroups`](crate::group::consumer::ConsumerGroups); this is glue:
//! records it returns are appended to the shard log and every answer waits
//! until they are durable, like the classic answers.

use super::{ready, CoordinatorError, GroupCoordinator};
use crate::group::classic::{GroupState, JoinGroup, JoinResponse};
use crate::group::consumer::{HeartbeatAnswer, HeartbeatError, TopicMeta, TopicSource};
use crate::group::messages::*;
use crate::group::offsets::Record;
use actix::prelude::*;
use kaas_protocol::kafka_protocol::ResponseError;
use std::sync::Arc;
use tokio::sync::oneshot;

/// The broker's topics as the coordinator sees them (a live view).
#[derive(Clone)]
pub struct Topics(pub Arc<dyn TopicSource>);

impl Topics {
    /// The source.
    pub fn source(&self) -> &dyn TopicSource {
        self.0.as_ref()
    }
}

impl std::fmt::Debug for Topics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Topics")
    }
}

/// No topics at all (tests that never assign).
struct NoTopics;

impl TopicSource for NoTopics {
    fn topic(&self, _: &str) -> Option<TopicMeta> {
        None
    }
    fn matching(&self, _: &str) -> Option<Vec<String>> {
        Some(Vec::new())
    }
    fn name_of(&self, _: &uuid::Uuid) -> Option<String> {
        None
    }
}

impl Default for Topics {
    fn default() -> Self {
        Self(Arc::new(NoTopics))
    }
}

impl GroupCoordinator {
    /// A classic JoinGroup for a group id that is a consumer-protocol
    /// group: refused with INCONSISTENT_GROUP_PROTOCOL while it has members
    /// (Kafka's answer); an empty one is converted (its tombstone appended,
    /// the join goes on as classic). `None`: go on.
    pub(super) fn join_meets_consumer_group(
        &mut self,
        req: &JoinGroup,
        ctx: &mut Context<Self>,
    ) -> Option<CoordReply<JoinResponse>> {
        let s = self.serving().ok()?;
        if !s.consumer.contains(&req.group_id) {
            return None;
        }
        match s.consumer.delete(&req.group_id) {
            Ok(records) => {
                let records: Vec<Record> = records.into_iter().map(Record::Consumer).collect();
                // The join's own answer waits behind this append's ticket.
                if self.append(&records, ctx).is_none() {
                    return Some(Err(CoordinatorError::Unavailable));
                }
                None
            }
            Err(_) => Some(Ok(JoinResponse {
                error: Some(ResponseError::InconsistentGroupProtocol),
                generation_id: -1,
                protocol_type: None,
                protocol_name: None,
                leader: String::new(),
                member_id: req.member_id.clone(),
                members: Vec::new(),
            })),
        }
    }
}

/// Empty consumer-protocol groups that have been empty for the retention
/// and keep no offsets (after `expiring`) are removed, as Kafka deletes an
/// empty group once its offsets are gone: the shard's live state stays
/// bounded by live groups.
pub(super) fn expire_empty(
    s: &mut super::Serving,
    expiring: &[Record],
    now_ms: i64,
    retention_ms: i64,
) -> Vec<Record> {
    let gone: std::collections::BTreeSet<(&str, &str, i32)> = expiring
        .iter()
        .filter_map(|r| match r {
            Record::OffsetTombstone {
                group,
                topic,
                partition,
            } => Some((group.as_str(), topic.as_str(), *partition)),
            _ => None,
        })
        .collect();
    let state = s.log.state();
    let candidates = s.consumer.empty_since(now_ms.saturating_sub(retention_ms));
    let mut out = Vec::new();
    for g in candidates {
        let keeps = state
            .group_offsets(&g)
            .any(|(k, _)| !gone.contains(&(k.group.as_str(), k.topic.as_str(), k.partition)));
        if !keeps {
            if let Ok(recs) = s.consumer.delete(&g) {
                out.extend(recs.into_iter().map(Record::Consumer));
            }
        }
    }
    out
}

impl Handler<ConsumerHeartbeatRequest> for GroupCoordinator {
    type Result = ResponseFuture<CoordReply<Result<HeartbeatAnswer, HeartbeatError>>>;
    fn handle(&mut self, m: ConsumerHeartbeatRequest, ctx: &mut Context<Self>) -> Self::Result {
        let topics = self.spec.topics.clone();
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        let gid = m.0.group_id.clone();
        let mut records = Vec::new();
        let classic_conflict = match s.groups.get(&gid) {
            Some(g) if g.state() == GroupState::Empty || g.state() == GroupState::Dead => {
                // Upgrade of an empty classic group: it goes, the consumer
                // group takes the id (its offsets stay).
                if !s.consumer.contains(&gid) && s.groups.delete(&gid).is_ok() {
                    records.push(Record::GroupTombstone { group: gid.clone() });
                }
                false
            }
            Some(_) => true,
            None => false,
        };
        let out = s.consumer.heartbeat(m.0, topics.source(), classic_conflict);
        records.extend(out.persist.into_iter().map(Record::Consumer));
        let result = out
            .result
            .unwrap_or(Err((ResponseError::UnknownServerError, None)));
        let Some(ticket) = self.append(&records, ctx) else {
            return ready(Err(CoordinatorError::Unavailable));
        };
        self.schedule(ctx);
        let (tx, rx) = oneshot::channel();
        self.after(ticket, Box::new(move |r| drop(tx.send(r.map(|_| result)))));
        Box::pin(async move { rx.await.unwrap_or(Err(CoordinatorError::Unavailable)) })
    }
}

impl Handler<DescribeConsumerGroups> for GroupCoordinator {
    type Result = ResponseFuture<CoordReply<Vec<(String, ConsumerDescribed)>>>;
    fn handle(&mut self, m: DescribeConsumerGroups, _: &mut Context<Self>) -> Self::Result {
        let s = match self.serving() {
            Ok(s) => s,
            Err(e) => return ready(Err(e)),
        };
        let out =
            m.0.into_iter()
                .map(|id| {
                    let d = match s.consumer.describe(&id) {
                        Some(g) => ConsumerDescribed::Consumer(g),
                        None if s.groups.get(&id).is_some() => ConsumerDescribed::Classic,
                        None => ConsumerDescribed::Unknown,
                    };
                    (id, d)
                })
                .collect();
        ready(Ok(out))
    }
}

impl Handler<ListConsumerGroups> for GroupCoordinator {
    type Result = ResponseFuture<CoordReply<Vec<(String, &'static str)>>>;
    fn handle(&mut self, _: ListConsumerGroups, _: &mut Context<Self>) -> Self::Result {
        let r = self.serving().map(|s| s.consumer.list());
        ready(r)
    }
}

impl Handler<ValidateConsumerFetch> for GroupCoordinator {
    type Result = ResponseFuture<CoordReply<Result<(), ResponseError>>>;
    fn handle(&mut self, m: ValidateConsumerFetch, _: &mut Context<Self>) -> Self::Result {
        let r = self.serving().map(|s| {
            s.consumer
                .validate_fetch(&m.group_id, m.member_id.as_deref(), m.member_epoch)
        });
        ready(r)
    }
}

crate::instrumented!(
    GroupCoordinator: ConsumerHeartbeatRequest,
    DescribeConsumerGroups,
    ListConsumerGroups,
    ValidateConsumerFetch
);

#[cfg(test)]
mod tests {
    use super::super::{CoordinatorSpec, GroupCoordinator};
    use super::*;
    use crate::group::classic::GroupConfig;
    use crate::group::consumer::{ConsumerConfig, ConsumerHeartbeat};
    use crate::group::log::ShardLogConfig;
    use crate::group::shard::ShardId;
    use crate::partition::claim::ClaimOwner;
    use kaas_volume::fs::{RealFs, SharedFs};
    use std::time::Duration;

    struct OneTopic;
    impl TopicSource for OneTopic {
        fn topic(&self, name: &str) -> Option<TopicMeta> {
            (name == "t").then_some(TopicMeta {
                id: uuid::Uuid::from_bytes([7; 16]),
                partitions: 4,
            })
        }
        fn matching(&self, _: &str) -> Option<Vec<String>> {
            Some(vec!["t".into()])
        }
        fn name_of(&self, _: &uuid::Uuid) -> Option<String> {
            Some("t".into())
        }
    }

    fn spec(dir: &std::path::Path, epoch: i32) -> CoordinatorSpec {
        CoordinatorSpec {
            shard: ShardId(5),
            cluster_dir: dir.to_path_buf(),
            epoch,
            lease: None,
            owner: Some(ClaimOwner {
                broker_id: 0,
                incarnation: 1,
            }),
            on_fenced: None,
            groups: GroupConfig::default(),
            log: ShardLogConfig::default(),
            retention_ms: 7 * 24 * 3600 * 1000,
            consumer: ConsumerConfig::default(),
            topics: Topics(Arc::new(OneTopic)),
        }
    }

    async fn beat(
        h: &super::super::CoordinatorHandle,
        req: ConsumerHeartbeat,
    ) -> Result<HeartbeatAnswer, HeartbeatError> {
        for _ in 0..500 {
            match h
                .addr
                .send(ConsumerHeartbeatRequest(req.clone()))
                .await
                .unwrap()
            {
                Err(CoordinatorError::Loading) => {
                    actix_rt::time::sleep(Duration::from_millis(10)).await
                }
                Ok(r) => return r,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("never loaded");
    }

    fn join(member: &str) -> ConsumerHeartbeat {
        ConsumerHeartbeat {
            group_id: "g".into(),
            member_id: member.into(),
            member_epoch: 0,
            rebalance_timeout_ms: 30_000,
            topics: Some(vec!["t".into()]),
            owned: Some(Default::default()),
            ..Default::default()
        }
    }

    /// Two members join through the actor; the coordinator stops and a
    /// successor of the next epoch reads the group back from the shard log:
    /// the members heartbeat it with their epochs and keep their
    /// assignments (no rejoin), a classic join of the group is refused, and
    /// a commit at a stale epoch is STALE_MEMBER_EPOCH.
    #[actix_rt::test]
    async fn a_takeover_keeps_consumer_members_and_their_epochs() {
        let d = tempfile::tempdir().unwrap();
        let fs: SharedFs = Arc::new(RealFs);
        let arbiter = actix::Arbiter::new();
        let h = GroupCoordinator::start(
            spec(d.path(), 1),
            fs.clone(),
            crate::clock::real(),
            &arbiter.handle(),
        );
        let a = beat(&h, join("a")).await.unwrap();
        let b = beat(&h, join("b")).await.unwrap();
        assert_eq!(b.member_epoch, 2);
        // a revokes what b gets, then both are at epoch 2.
        let a2 = beat(
            &h,
            ConsumerHeartbeat {
                member_epoch: a.member_epoch,
                topics: None,
                owned: a.assignment.clone(),
                rebalance_timeout_ms: -1,
                ..join("a")
            },
        )
        .await
        .unwrap();
        let a3 = beat(
            &h,
            ConsumerHeartbeat {
                member_epoch: a2.member_epoch,
                topics: None,
                owned: a2.assignment.clone(),
                rebalance_timeout_ms: -1,
                ..join("a")
            },
        )
        .await
        .unwrap();
        assert_eq!(a3.member_epoch, 2);
        h.addr
            .send(crate::group::messages::StopCoordinator)
            .await
            .unwrap();

        let next = GroupCoordinator::start(
            spec(d.path(), 2),
            fs,
            crate::clock::real(),
            &arbiter.handle(),
        );
        let again = beat(
            &next,
            ConsumerHeartbeat {
                member_epoch: 2,
                topics: None,
                owned: a3.assignment.clone(),
                rebalance_timeout_ms: -1,
                ..join("a")
            },
        )
        .await
        .unwrap();
        assert_eq!(again.member_epoch, 2, "no rejoin after the takeover");
        assert_eq!(again.assignment, a3.assignment);
        let b2 = beat(
            &next,
            ConsumerHeartbeat {
                member_epoch: 2,
                topics: None,
                owned: Some(Default::default()),
                rebalance_timeout_ms: -1,
                ..join("b")
            },
        )
        .await
        .unwrap();
        let total: usize = [&again, &b2]
            .iter()
            .map(|x| {
                x.assignment
                    .as_ref()
                    .unwrap()
                    .values()
                    .map(|s| s.len())
                    .sum::<usize>()
            })
            .sum();
        assert_eq!(total, 4);
        // A partition a owns, at its epoch before the takeover: the new
        // owner knows no assignment epochs (KIP-1251), so the strict rule.
        let mine = *again
            .assignment
            .as_ref()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .iter()
            .next()
            .unwrap();
        let stale = next
            .addr
            .send(crate::group::messages::CommitOffsets {
                group_id: "g".into(),
                member_id: "a".into(),
                instance_id: None,
                generation_id: 1,
                retention_ms: None,
                offsets: vec![crate::group::messages::CommitOffset {
                    topic: "t".into(),
                    partition: mine,
                    offset: 1,
                    leader_epoch: -1,
                    metadata: None,
                }],
            })
            .await
            .unwrap();
        assert_eq!(stale, Ok(Err(ResponseError::StaleMemberEpoch)));
        let classic = next
            .addr
            .send(crate::group::messages::JoinGroupRequest(JoinGroup {
                group_id: "g".into(),
                protocol_type: "consumer".into(),
                protocols: vec![("range".into(), vec![1])],
                session_timeout_ms: 10_000,
                rebalance_timeout_ms: 10_000,
                ..JoinGroup::default()
            }))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            classic.error,
            Some(ResponseError::InconsistentGroupProtocol)
        );
        let listed = next.addr.send(ListConsumerGroups).await.unwrap().unwrap();
        assert_eq!(listed, vec![("g".to_string(), "Stable")]);
        next.addr
            .send(crate::group::messages::StopCoordinator)
            .await
            .unwrap();
        arbiter.stop();
    }

    /// TxnOffsetCommit to a KIP-848 group (exactly-once with
    /// `group.protocol=consumer`: librdkafka puts the member epoch in the
    /// transaction's group metadata) is validated like its OffsetCommit:
    /// the member at its epoch is taken and the offset is committed by the
    /// marker; a wrong epoch is STALE_MEMBER_EPOCH (the API maps it for
    /// TxnOffsetCommit), a stranger UNKNOWN_MEMBER_ID, and a producer
    /// without member fields commits standalone.
    #[actix_rt::test]
    async fn transactional_offsets_of_a_consumer_group_member_are_validated_by_epoch() {
        let d = tempfile::tempdir().unwrap();
        let fs: SharedFs = Arc::new(RealFs);
        let arbiter = actix::Arbiter::new();
        let h = GroupCoordinator::start(
            spec(d.path(), 1),
            fs,
            crate::clock::real(),
            &arbiter.handle(),
        );
        let a = beat(&h, join("a")).await.unwrap();
        assert_eq!(a.member_epoch, 1);
        let txn = |member: &str, epoch: i32, offset: i64| TxnCommitOffsets {
            group_id: "g".into(),
            producer_id: 9,
            producer_epoch: 0,
            member_id: member.into(),
            instance_id: None,
            generation_id: epoch,
            offsets: vec![CommitOffset {
                topic: "t".into(),
                partition: 0,
                offset,
                leader_epoch: -1,
                metadata: None,
            }],
        };
        assert_eq!(h.addr.send(txn("a", 1, 5)).await.unwrap(), Ok(Ok(())));
        assert_eq!(
            h.addr.send(txn("a", 2, 6)).await.unwrap(),
            Ok(Err(ResponseError::StaleMemberEpoch))
        );
        assert_eq!(
            h.addr.send(txn("stranger", 1, 6)).await.unwrap(),
            Ok(Err(ResponseError::UnknownMemberId))
        );
        assert_eq!(h.addr.send(txn("", -1, 5)).await.unwrap(), Ok(Ok(())));
        let end = CompleteTxnOffsets {
            producer_id: 9,
            producer_epoch: 0,
            commit: true,
        };
        assert_eq!(h.addr.send(end).await.unwrap(), Ok(()));
        let got = h
            .addr
            .send(FetchOffsets {
                group_id: "g".into(),
                topics: Some(vec![("t".into(), vec![0])]),
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got[0].value.as_ref().map(|v| v.offset), Some(5));
        h.addr.send(StopCoordinator).await.unwrap();
        arbiter.stop();
    }
}
