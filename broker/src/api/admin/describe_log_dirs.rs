//! DescribeLogDirs (key 35): one log dir — the shared data directory — with
//! the size of every partition this broker leads (the bytes its leader
//! serves). Partitions led elsewhere are described by their own leader, as
//! each Kafka broker describes only its own replicas.

use crate::api::{s, Reply};
use crate::state::Broker;
use kaas_protocol::kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kaas_protocol::kafka_protocol::messages::{
    DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Answer inline from the leaders' views (no file I/O).
pub async fn handle(
    b: &Arc<Broker>,
    _v: i16,
    r: DescribeLogDirsRequest,
) -> Reply<DescribeLogDirsResponse> {
    let a = b.assignment();
    // The partitions asked for (None: all).
    let wanted: Option<BTreeMap<String, Vec<i32>>> = r.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.topic.0.to_string(), t.partitions))
            .collect()
    });
    let mut dir = DescribeLogDirsResult::default();
    dir.log_dir = s(&b.args.data_dir.display().to_string());
    dir.total_bytes = -1;
    dir.usable_bytes = -1;
    for (name, t) in &a.topics {
        let asked = wanted.as_ref().map(|w| w.get(name));
        if matches!(asked, Some(None)) {
            continue;
        }
        let mut tr = DescribeLogDirsTopic::default();
        tr.name = TopicName(s(name));
        for p in 0..t.partitions.len() as i32 {
            if asked.flatten().is_some_and(|ps| !ps.contains(&p)) {
                continue;
            }
            let Ok(led) = b.partition(name, p) else {
                continue;
            };
            let reader = led.handle.reader.read().unwrap().clone();
            let Some(reader) = reader else { continue };
            let mut pr = DescribeLogDirsPartition::default();
            pr.partition_index = p;
            pr.partition_size = reader.size_bytes() as i64;
            pr.offset_lag = 0;
            pr.is_future_key = false;
            tr.partitions.push(pr);
        }
        if !tr.partitions.is_empty() {
            dir.topics.push(tr);
        }
    }
    let mut resp = DescribeLogDirsResponse::default();
    resp.results.push(dir);
    Reply::Now(resp)
}
