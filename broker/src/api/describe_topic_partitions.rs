//! DescribeTopicPartitions (key 75, KIP-966): how Kafka 3.8+ admin clients
//! describe topics, paged. Topics sorted by name (every topic for an empty
//! list), each partition as Metadata shows it (leader, epoch, the one
//! replica), at most `response_partition_limit` partitions per answer —
//! capped at Kafka's broker default, 2000 (`max.request.partition.size.limit`)
//! — and a `next_cursor` (topic, partition) where the next page starts,
//! null once everything is answered.
//!
//! Paging follows Kafka's `DescribeTopicPartitionsRequestHandler` and
//! `KRaftMetadataCache.describeTopicResponse`:
//! * topics whose names sort before the cursor's topic are skipped; a
//!   request that lists topics must list the cursor's, else every topic of
//!   the request is answered INVALID_REQUEST;
//! * the cursor's partition applies to its own topic; later topics start at
//!   partition 0;
//! * the limit counts partitions across topics: a topic cut short puts the
//!   cursor inside it, and a limit used up exactly at a topic's end puts it
//!   at the next topic's partition 0 (whether that topic exists or not);
//! * a requested topic this broker does not know is answered
//!   UNKNOWN_TOPIC_OR_PARTITION (INVALID_TOPIC_EXCEPTION for an illegal
//!   name) and takes no room; with an empty list only known topics appear.
//!
//! kaas keeps one copy of each partition: no eligible leader replicas, no
//! last known ELR, no offline replica. There is no authorizer, so every
//! topic carries every topic operation, as Kafka without one.

use super::error::NONE;
use super::{authorized, metadata, s, Reply};
use crate::state::Broker;
use kaas_actors::topic::TopicStamp;
use kaas_protocol::kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kaas_protocol::kafka_protocol::messages::{
    DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, TopicName,
};
use kaas_protocol::kafka_protocol::ResponseError;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Kafka's broker-side bound on partitions per answer
/// (`max.request.partition.size.limit`, default 2000).
const MAX_PARTITIONS_PER_RESPONSE: i32 = 2000;

/// One topic of a page.
#[derive(Debug, PartialEq, Eq)]
enum Slot {
    /// A topic this broker knows: its partitions `from..to`.
    Known { name: String, from: i32, to: i32 },
    /// A requested topic it does not know.
    Unknown(String),
}

/// What one answer holds, and where the next starts.
#[derive(Debug, PartialEq, Eq)]
struct Page {
    slots: Vec<Slot>,
    next: Option<(String, i32)>,
}

/// The request's cursor names a topic its topic list does not hold.
#[derive(Debug, PartialEq, Eq)]
struct CursorNotListed;

/// Lay out one page. `requested` is the request's topic list (empty: every
/// topic), `known` each known topic's partition count, `cursor` where to
/// start, `limit` the client's partition limit.
fn page(
    requested: &[String],
    known: &BTreeMap<&str, i32>,
    cursor: Option<(&str, i32)>,
    limit: i32,
) -> Result<Page, CursorNotListed> {
    let all = requested.is_empty();
    let from_topic = cursor.map_or("", |c| c.0);
    let names: BTreeSet<&str> = if all {
        known.keys().copied().filter(|n| *n >= from_topic).collect()
    } else {
        let listed: BTreeSet<&str> = requested
            .iter()
            .map(String::as_str)
            .filter(|n| *n >= from_topic)
            .collect();
        if cursor.is_some() && !listed.contains(from_topic) {
            return Err(CursorNotListed);
        }
        listed
    };
    // Kafka skips partitions below a negative index without counting them;
    // starting at 0 pages the same partitions.
    let first = cursor.map_or(0, |c| c.1.max(0));
    let mut remaining = i64::from(limit.min(MAX_PARTITIONS_PER_RESPONSE));
    let mut out = Page {
        slots: Vec::new(),
        next: None,
    };
    for name in names {
        if remaining == 0 {
            out.next = Some((name.to_owned(), 0));
            break;
        }
        if remaining < 0 {
            // Kafka's answer to a negative limit: nothing, and no cursor.
            break;
        }
        let Some(&count) = known.get(name) else {
            if !all {
                out.slots.push(Slot::Unknown(name.to_owned()));
            }
            continue;
        };
        let from = if name == from_topic { first } else { 0 };
        let to = i64::from(count).min(i64::from(from) + remaining);
        let to = i32::try_from(to).unwrap_or(count);
        out.slots.push(Slot::Known {
            name: name.to_owned(),
            from,
            to: to.max(from),
        });
        if to < count {
            out.next = Some((name.to_owned(), to));
            break;
        }
        remaining -= i64::from(to.max(from) - from);
    }
    Ok(out)
}

/// Answer inline (a topic just created through another broker is waited
/// for, bounded, as Metadata does).
pub async fn handle(
    b: &Arc<Broker>,
    _v: i16,
    r: DescribeTopicPartitionsRequest,
) -> Reply<DescribeTopicPartitionsResponse> {
    Reply::Now(describe(b, r).await)
}

async fn describe(
    b: &Broker,
    r: DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    let requested: Vec<String> = r.topics.iter().map(|t| t.name.0.to_string()).collect();
    let cursor = r
        .cursor
        .as_ref()
        .map(|c| (c.topic_name.0.to_string(), c.partition_index));
    let from_topic = cursor.as_ref().map_or("", |c| c.0.as_str());
    let listed: BTreeSet<&str> = requested.iter().map(String::as_str).collect();
    for name in listed.into_iter().filter(|n| *n >= from_topic) {
        if b.topic(name).is_none() {
            metadata::known_soon(b, name).await;
        }
    }
    let (laid, stamps) = {
        let topics = b.topics.read().unwrap();
        let known: BTreeMap<&str, i32> = topics
            .iter()
            .map(|(n, t)| (n.as_str(), t.partitions))
            .collect();
        let laid = page(
            &requested,
            &known,
            cursor.as_ref().map(|c| (c.0.as_str(), c.1)),
            r.response_partition_limit,
        );
        let stamps: BTreeMap<String, TopicStamp> = match &laid {
            Ok(p) => p
                .slots
                .iter()
                .filter_map(|slot| match slot {
                    Slot::Known { name, .. } => Some((name.clone(), topics.get(name)?.clone())),
                    Slot::Unknown(_) => None,
                })
                .collect(),
            Err(_) => BTreeMap::new(),
        };
        (laid, stamps)
    };
    let mut resp = DescribeTopicPartitionsResponse::default();
    let Ok(laid) = laid else {
        // Kafka throws InvalidRequestException, answered per listed topic.
        tracing::debug!(cursor = %from_topic, "describe topic partitions: cursor topic not listed");
        for name in &requested {
            let mut t = DescribeTopicPartitionsResponseTopic::default();
            t.error_code = ResponseError::InvalidRequest.code();
            t.name = Some(TopicName(s(name)));
            resp.topics.push(t);
        }
        return resp;
    };
    for slot in laid.slots {
        let mut t = DescribeTopicPartitionsResponseTopic::default();
        t.topic_authorized_operations = authorized::TOPIC;
        match slot {
            Slot::Known { name, from, to } => {
                let Some(stamp) = stamps.get(&name) else {
                    continue;
                };
                t.topic_id = stamp.topic_id;
                t.partitions = metadata::partitions(b, stamp)
                    .get(from as usize..to as usize)
                    .unwrap_or_default()
                    .iter()
                    .map(|m| {
                        let mut p = DescribeTopicPartitionsResponsePartition::default();
                        // Kafka sets no partition error here: a vacant
                        // partition is a leader of -1.
                        p.error_code = NONE;
                        p.partition_index = m.partition_index;
                        p.leader_id = m.leader_id;
                        p.leader_epoch = m.leader_epoch;
                        p.replica_nodes = m.replica_nodes.clone();
                        p.isr_nodes = m.isr_nodes.clone();
                        p.eligible_leader_replicas = Some(Vec::new());
                        p.last_known_elr = Some(Vec::new());
                        p.offline_replicas = Vec::new();
                        p
                    })
                    .collect();
                t.name = Some(TopicName(s(&name)));
            }
            Slot::Unknown(name) => {
                t.error_code = if kaas_actors::topic::validate_name(&name).is_err() {
                    ResponseError::InvalidTopicException.code()
                } else {
                    ResponseError::UnknownTopicOrPartition.code()
                };
                t.name = Some(TopicName(s(&name)));
            }
        }
        resp.topics.push(t);
    }
    resp.next_cursor = laid.next.map(|(name, partition)| {
        let mut c = Cursor::default();
        c.topic_name = TopicName(s(&name));
        c.partition_index = partition;
        c
    });
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known<'a>(t: &[(&'a str, i32)]) -> BTreeMap<&'a str, i32> {
        t.iter().copied().collect()
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|x| x.to_string()).collect()
    }

    fn k(name: &str, from: i32, to: i32) -> Slot {
        Slot::Known {
            name: name.into(),
            from,
            to,
        }
    }

    fn at(name: &str, p: i32) -> Option<(String, i32)> {
        Some((name.into(), p))
    }

    #[test]
    fn everything_fits_no_cursor() {
        let kn = known(&[("b", 2), ("a", 1)]);
        let p = page(&[], &kn, None, 2000).unwrap();
        assert_eq!(p.slots, vec![k("a", 0, 1), k("b", 0, 2)]);
        assert_eq!(p.next, None);
    }

    #[test]
    fn the_limit_spans_topics_and_the_cursor_resumes() {
        // Three topics of 3, 1 and 2 partitions, two partitions a page.
        let kn = known(&[("a", 3), ("b", 1), ("c", 2)]);
        let p = page(&[], &kn, None, 2).unwrap();
        assert_eq!((p.slots, p.next), (vec![k("a", 0, 2)], at("a", 2)));
        let p = page(&[], &kn, Some(("a", 2)), 2).unwrap();
        assert_eq!(
            (p.slots, p.next),
            (vec![k("a", 2, 3), k("b", 0, 1)], at("c", 0))
        );
        let p = page(&[], &kn, Some(("c", 0)), 2).unwrap();
        assert_eq!((p.slots, p.next), (vec![k("c", 0, 2)], None));
    }

    #[test]
    fn a_limit_used_up_at_a_topic_end_points_at_the_next_topic() {
        let kn = known(&[("a", 2)]);
        let req = names(&["a", "zz"]);
        let p = page(&req, &kn, None, 2).unwrap();
        // "zz" does not exist; the cursor still names it, as Kafka's does.
        assert_eq!((p.slots, p.next), (vec![k("a", 0, 2)], at("zz", 0)));
        let p = page(&req, &kn, Some(("zz", 0)), 2).unwrap();
        assert_eq!((p.slots, p.next), (vec![Slot::Unknown("zz".into())], None));
    }

    #[test]
    fn listed_topics_sorted_deduplicated_unknown_reported() {
        let kn = known(&[("a", 1), ("c", 1)]);
        let p = page(&names(&["c", "b", "a", "c"]), &kn, None, 10).unwrap();
        assert_eq!(
            p.slots,
            vec![k("a", 0, 1), Slot::Unknown("b".into()), k("c", 0, 1)]
        );
        // With an empty list only known topics appear.
        let p = page(&[], &kn, Some(("b", 0)), 10).unwrap();
        assert_eq!(p.slots, vec![k("c", 0, 1)]);
    }

    #[test]
    fn the_cursor_topic_must_be_listed() {
        let kn = known(&[("a", 1), ("b", 1)]);
        assert_eq!(
            page(&names(&["a"]), &kn, Some(("b", 0)), 10),
            Err(CursorNotListed)
        );
        // Topics before the cursor are skipped.
        let p = page(&names(&["a", "b"]), &kn, Some(("b", 0)), 10).unwrap();
        assert_eq!(p.slots, vec![k("b", 0, 1)]);
    }

    #[test]
    fn odd_limits_and_cursors_never_panic() {
        let kn = known(&[("a", 3), ("b", 1)]);
        // Beyond the topic's end: the topic with no partitions, then on.
        let p = page(&[], &kn, Some(("a", i32::MAX)), i32::MAX).unwrap();
        assert_eq!(
            (p.slots, p.next),
            (vec![k("a", i32::MAX, i32::MAX), k("b", 0, 1)], None)
        );
        let p = page(&[], &kn, Some(("a", -5)), 1).unwrap();
        assert_eq!((p.slots, p.next), (vec![k("a", 0, 1)], at("a", 1)));
        // A limit of 0 answers nothing and points at the first topic; a
        // negative one answers nothing at all (Kafka's loop does the same).
        let p = page(&[], &kn, None, 0).unwrap();
        assert_eq!((p.slots, p.next), (vec![], at("a", 0)));
        let p = page(&[], &kn, None, -1).unwrap();
        assert_eq!((p.slots, p.next), (vec![], None));
        // The broker's cap bounds a larger limit.
        let kn = known(&[("big", 5000)]);
        let p = page(&[], &kn, None, i32::MAX).unwrap();
        assert_eq!(
            (p.slots, p.next),
            (vec![k("big", 0, 2000)], at("big", 2000))
        );
    }
}
