//! The transaction coordinator's marker sink: one round of a transaction's
//! markers, sent where the assignment says each partition is served.
//!
//! * A data partition: WriteTxnMarkers (v1) to the broker leading it, one
//!   request per broker, all brokers at once; this broker's own partitions
//!   through the same handler, called directly (no loopback connection).
//! * `__consumer_offsets`/shard (the group offsets of AddOffsetsToTxn):
//!   [`complete_markers`] directly when this broker owns that shard,
//!   otherwise WriteTxnMarkers to the shard's owner, whose handler routes
//!   it to the same function.
//!
//! A round resolves to what is not acknowledged yet; the coordinator
//! re-sends that with back-off (the handlers are idempotent). A partition
//! of a topic that no longer exists (deleted meanwhile) counts as written:
//! no reader can see it any more.

use crate::api::group::txn_offsets::complete_markers;
use crate::api::txn::write_txn_markers;
use crate::api::Reply;
use crate::state::Broker;
use futures::future::BoxFuture;
use futures::FutureExt;
use kaas_actors::txn::coordinator::MarkerJob;
use kaas_actors::txn::state::GROUP_OFFSETS_TOPIC;
use kaas_protocol::kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kaas_protocol::kafka_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest};
use kaas_protocol::kafka_protocol::ResponseError;
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The WriteTxnMarkers version sent.
pub const MARKERS_VERSION: i16 = 1;

/// How long a round of markers to this broker's own partitions may take
/// before what is left is re-sent (as the peer client's request timeout).
const LOCAL_WAIT: Duration = Duration::from_secs(15);

/// Send one round of `job`'s markers; resolves to the partitions left.
pub fn send(b: Weak<Broker>, job: MarkerJob) -> BoxFuture<'static, Vec<(String, i32)>> {
    async move {
        let Some(b) = b.upgrade() else {
            return job.partitions;
        };
        round(&b, job).await
    }
    .boxed()
}

async fn round(b: &Arc<Broker>, job: MarkerJob) -> Vec<(String, i32)> {
    let a = b.assignment();
    let me = b.args.broker_id;
    let mut left = Vec::new();
    let mut local_groups = Vec::new();
    let mut by_broker: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
    for (t, p) in &job.partitions {
        let leader = if t == GROUP_OFFSETS_TOPIC {
            match u32::try_from(*p).ok().and_then(|s| a.coordinator(s)) {
                Some(e) => e.leader,
                None => continue,
            }
        } else {
            match a.topics.get(t) {
                None => continue,
                Some(topic) => match topic.partitions.get(*p as usize) {
                    Some(e) if !topic.deleting => e.leader,
                    _ => continue,
                },
            }
        };
        if leader < 0 {
            left.push((t.clone(), *p));
        } else if t == GROUP_OFFSETS_TOPIC && leader == me {
            local_groups.push(*p);
        } else {
            by_broker.entry(leader).or_default().push((t.clone(), *p));
        }
    }
    let groups = futures::future::join_all(local_groups.into_iter().map(|shard| {
        complete_markers(b, shard, job.producer_id, job.producer_epoch, job.commit)
            .map(move |code| (shard, code))
    }));
    let remote = futures::future::join_all(by_broker.into_iter().map(|(broker, parts)| {
        let dest = if broker == me {
            Some(Dest::Here)
        } else {
            a.brokers
                .iter()
                .find(|x| x.id == broker)
                .map(|x| Dest::Peer(x.host.clone(), x.port))
        };
        let job = &job;
        async move {
            match dest {
                Some(dest) => to_broker(b, dest, job, parts).await,
                None => parts,
            }
        }
    }));
    let (groups, remote) = futures::future::join(groups, remote).await;
    for (shard, code) in groups {
        if code != 0 {
            left.push((GROUP_OFFSETS_TOPIC.to_owned(), shard));
        }
    }
    left.extend(remote.into_iter().flatten());
    left
}

/// Where a WriteTxnMarkers request goes.
enum Dest {
    /// This broker leads the partitions: its handler is called directly,
    /// the same function a request from a peer reaches, without the
    /// encoding and the loopback round trip (one per transaction and
    /// broker on the path of every back-to-back transaction).
    Here,
    /// Another broker, over the peer client.
    Peer(String, i32),
}

/// One WriteTxnMarkers request: the partitions not answered NONE.
async fn to_broker(
    b: &Arc<Broker>,
    dest: Dest,
    job: &MarkerJob,
    parts: Vec<(String, i32)>,
) -> Vec<(String, i32)> {
    let req = request(job, &parts);
    let sent = match &dest {
        Dest::Here => {
            let answer = async {
                match write_txn_markers::handle(b, MARKERS_VERSION, req).await {
                    Reply::Now(r) => Some(r),
                    Reply::Later(f) => Some(f.await),
                    Reply::Nothing => None,
                }
            };
            tokio::time::timeout(LOCAL_WAIT, answer)
                .await
                .ok()
                .flatten()
                .ok_or_else(|| "not answered in time".to_owned())
        }
        Dest::Peer(host, port) => b
            .peers
            .send(host, *port, MARKERS_VERSION, &req)
            .await
            .map_err(|e| e.to_string()),
    };
    let resp = match sent {
        Ok(r) => r,
        Err(error) => {
            tracing::debug!(%error, "WriteTxnMarkers failed; re-sent later");
            return parts;
        }
    };
    let mut acked = std::collections::HashSet::new();
    for m in &resp.markers {
        if m.producer_id.0 != job.producer_id {
            continue;
        }
        for t in &m.topics {
            for p in &t.partitions {
                let ok = p.error_code == 0
                    // A newer epoch already wrote to the partition: this
                    // marker is superseded there.
                    || p.error_code == ResponseError::InvalidProducerEpoch.code();
                if p.error_code == ResponseError::InvalidProducerEpoch.code() {
                    tracing::warn!(
                        topic = %t.name.0,
                        partition = p.partition_index,
                        producer_id = job.producer_id,
                        producer_epoch = job.producer_epoch,
                        "marker below the producer's epoch at the partition; counted as written"
                    );
                }
                if ok {
                    acked.insert((t.name.0.to_string(), p.partition_index));
                }
            }
        }
    }
    parts.into_iter().filter(|x| !acked.contains(x)).collect()
}

/// The WriteTxnMarkers request of one job's partitions.
pub fn request(job: &MarkerJob, parts: &[(String, i32)]) -> WriteTxnMarkersRequest {
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in parts {
        topics.entry(t).or_default().push(*p);
    }
    let mut m = WritableTxnMarker::default();
    m.producer_id = ProducerId(job.producer_id);
    m.producer_epoch = job.producer_epoch;
    m.transaction_result = job.commit;
    m.coordinator_epoch = job.coordinator_epoch;
    m.topics = topics
        .into_iter()
        .map(|(t, ps)| {
            let mut x = WritableTxnMarkerTopic::default();
            x.name = TopicName(crate::api::s(t));
            x.partition_indexes = ps;
            x
        })
        .collect();
    let mut r = WriteTxnMarkersRequest::default();
    r.markers = vec![m];
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_marker_with_its_partitions_grouped_by_topic() {
        let job = MarkerJob {
            transactional_id: "t".into(),
            producer_id: 9,
            producer_epoch: 3,
            commit: true,
            coordinator_epoch: 5,
            partitions: vec![],
        };
        let r = request(&job, &[("a".into(), 1), ("b".into(), 0), ("a".into(), 0)]);
        assert_eq!(r.markers.len(), 1);
        let m = &r.markers[0];
        assert_eq!(
            (
                m.producer_id.0,
                m.producer_epoch,
                m.transaction_result,
                m.coordinator_epoch
            ),
            (9, 3, true, 5)
        );
        let got: Vec<(String, Vec<i32>)> = m
            .topics
            .iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes.clone()))
            .collect();
        assert_eq!(got, vec![("a".into(), vec![1, 0]), ("b".into(), vec![0])]);
    }
}
