//! `reconcile()` against a mocked Kubernetes API server (`tower-test` behind
//! `kube::Client`), one test per branch: which requests reach the API
//! server (method, path, body), which reach the brokers, and the Action.

mod common;

use common::*;
use http::{Request, Response};
use kaas_operator::crd::{KafkaTopic, FINALIZER};
use kaas_operator::lease::Fence;
use kaas_operator::metrics::Metrics;
use kaas_operator::reconcile::{error_policy, reconcile, Context, Error};
use kaas_protocol::kafka_protocol::messages::ApiKey;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::{reflector, watcher};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;
use tower_test::mock;

/// A request the API server received.
#[derive(Debug)]
struct Seen {
    method: String,
    path: String,
    query: String,
    body: serde_json::Value,
}

/// Run `reconcile(kt)` with `others` in the store; the API server answers
/// every request with the object, and records them.
async fn run(
    kt: KafkaTopic,
    others: Vec<KafkaTopic>,
    b: Arc<FakeBrokers>,
) -> (Result<Action, Error>, Vec<Seen>, Arc<Context>) {
    run_fenced(kt, others, b, Fence::unfenced()).await
}

/// [`run`], with the Events recorded (type, reason, action) apart from
/// the other requests.
async fn run_with_events(
    kt: KafkaTopic,
    others: Vec<KafkaTopic>,
    b: Arc<FakeBrokers>,
) -> (
    Result<Action, Error>,
    Vec<Seen>,
    Vec<(String, String, String)>,
) {
    let (r, seen, _) = run_all(kt, others, b, Fence::unfenced()).await;
    let (events, seen): (Vec<Seen>, Vec<Seen>) = seen.into_iter().partition(is_event);
    let events = events
        .iter()
        .map(|e| {
            let f = |k: &str| e.body[k].as_str().unwrap_or_default().to_owned();
            (f("type"), f("reason"), f("action"))
        })
        .collect();
    (r, seen, events)
}

fn is_event(s: &Seen) -> bool {
    s.path.starts_with("/apis/events.k8s.io/")
}

/// [`run`] with the leader-election fence `fence` (Events left out).
async fn run_fenced(
    kt: KafkaTopic,
    others: Vec<KafkaTopic>,
    b: Arc<FakeBrokers>,
    fence: Fence,
) -> (Result<Action, Error>, Vec<Seen>, Arc<Context>) {
    let (r, seen, ctx) = run_all(kt, others, b, fence).await;
    (r, seen.into_iter().filter(|s| !is_event(s)).collect(), ctx)
}

/// Every request the API server saw, Events included.
async fn run_all(
    kt: KafkaTopic,
    others: Vec<KafkaTopic>,
    b: Arc<FakeBrokers>,
    fence: Fence,
) -> (Result<Action, Error>, Vec<Seen>, Arc<Context>) {
    let (svc, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let obj = kt.clone();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let server = tokio::spawn(async move {
        let mut handle = pin!(handle);
        while let Some((req, send)) = handle.next_request().await {
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            let query = req.uri().query().unwrap_or_default().to_string();
            let bytes = http_body_util::BodyExt::collect(req.into_body())
                .await
                .unwrap()
                .to_bytes();
            let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            log.lock().unwrap().push(Seen {
                method,
                path,
                query,
                body,
            });
            let reply = serde_json::to_vec(&obj).unwrap();
            send.send_response(
                Response::builder()
                    .status(200)
                    .body(Body::from(reply))
                    .unwrap(),
            );
        }
    });
    let (store, mut writer) = reflector::store::<KafkaTopic>();
    for o in others.iter().chain(std::iter::once(&kt)) {
        writer.apply_watcher_event(&watcher::Event::Apply(o.clone()));
    }
    let client = kube::Client::new(svc, "ns");
    let ctx = Arc::new(Context {
        recorder: kube::runtime::events::Recorder::new(client.clone(), "kaas-operator".into()),
        client,
        data_dir: b.data.clone(),
        admin: b,
        store,
        metrics: Arc::new(Metrics::default()),
        resync: Duration::from_secs(300),
        failures: Default::default(),
        fence,
    });
    let r = reconcile(Arc::new(kt), ctx.clone()).await;
    server.abort();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    (r, seen, ctx)
}

fn setup() -> (tempfile::TempDir, Arc<FakeBrokers>) {
    let d = tempfile::tempdir().unwrap();
    let b = Arc::new(FakeBrokers::new(d.path().to_path_buf()));
    (d, b)
}

const KT_PATH: &str = "/apis/kaas.io/v1alpha1/namespaces/ns/kafkatopics/orders";

#[tokio::test]
async fn adds_the_finalizer_first() {
    let (_d, b) = setup();
    let (r, seen, _) = run(kt("orders", 0, 3), vec![], b.clone()).await;
    assert_eq!(r.unwrap(), Action::requeue(Duration::from_millis(500)));
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("PATCH", KT_PATH)
    );
    assert_eq!(
        seen[0].body["metadata"]["finalizers"],
        serde_json::json!([FINALIZER])
    );
    assert_eq!(
        seen[0].body["metadata"]["resourceVersion"], "1",
        "optimistic concurrency"
    );
    assert!(
        seen[0].query.contains("fieldManager=kaas-operator"),
        "{}",
        seen[0].query
    );
    assert!(b.calls().is_empty(), "nothing created before the finalizer");
}

#[tokio::test]
async fn creates_through_create_topics_without_touching_the_api() {
    let (_d, b) = setup();
    let (r, seen, events) = run_with_events(finalized(kt("orders", 0, 3)), vec![], b.clone()).await;
    assert_eq!(r.unwrap(), Action::requeue(Duration::from_millis(500)));
    assert!(seen.is_empty(), "{seen:?}");
    assert_eq!(b.calls(), vec!["CreateTopics orders 3"]);
    assert_eq!(
        events,
        vec![("Normal".into(), "Created".into(), "CreateTopics".into())]
    );
    assert!(b.stamp_id("orders").is_some());
}

#[tokio::test]
async fn records_the_stamp_in_status_once() {
    let (_d, b) = setup();
    let id = b.client_creates("orders", 3);
    let (r, seen, ctx) = run(finalized(kt("orders", 0, 3)), vec![], b.clone()).await;
    assert_eq!(r.unwrap(), Action::requeue(Duration::from_secs(300)));
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].method, "PATCH");
    assert_eq!(seen[0].path, format!("{KT_PATH}/status"));
    let st = &seen[0].body["status"];
    assert_eq!(st["topicId"], id.as_str());
    assert_eq!(st["partitions"], 3);
    assert_eq!(st["observedGeneration"], 1);
    assert_eq!(st["conditions"][0]["reason"], "Ready");
    assert!(ctx
        .metrics
        .render()
        .contains("kaas_operator_status_writes_total 1"));
    assert!(b.calls().is_empty());
}

#[tokio::test]
async fn unchanged_status_is_not_rewritten() {
    let (_d, b) = setup();
    b.client_creates("orders", 3);
    let k = finalized(kt("orders", 0, 3));
    // First pass writes the status; feed the result back as the object.
    let kaas_operator::reconcile::Step::Status(s) = kaas_operator::reconcile::decide(
        &k,
        &[Arc::new(k.clone())],
        &kaas_operator::reconcile::read_volume(&b.data, "orders").unwrap(),
    ) else {
        panic!()
    };
    let mut k2 = k.clone();
    k2.status = Some(kaas_operator::reconcile::settle(
        &Default::default(),
        s,
        "t0",
    ));
    let (r, seen, _) = run(k2, vec![], b).await;
    assert_eq!(r.unwrap(), Action::requeue(Duration::from_secs(300)));
    assert!(seen.is_empty(), "status rewritten: {seen:?}");
}

#[tokio::test]
async fn grow_not_supported_is_a_condition_not_an_error() {
    let (_d, b) = setup();
    let id = b.client_creates("orders", 3);
    let (r, seen, events) = run_with_events(
        owning(finalized(kt("orders", 0, 6)), &id),
        vec![],
        b.clone(),
    )
    .await;
    assert!(r.is_ok(), "NotSupported must not be an error loop: {r:?}");
    assert_eq!(b.calls(), vec!["CreatePartitions orders 6"]);
    assert_eq!(
        events,
        vec![("Warning".into(), "NotSupported".into(), "Reconcile".into())]
    );
    assert_eq!(seen.len(), 1);
    let c = &seen[0].body["status"]["conditions"][0];
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("NotSupported"))
    );
    assert!(c["message"].as_str().unwrap().contains("CreatePartitions"));
}

#[tokio::test]
async fn conflict_loser_gets_resource_conflict() {
    let (_d, b) = setup();
    let older = finalized(kt("first", 0, 1));
    let mut mine = finalized(kt("orders", 5, 1));
    mine.spec.topic_name = Some("first".into());
    let (r, seen, _) = run(mine, vec![older], b.clone()).await;
    assert!(r.is_ok());
    assert!(b.calls().is_empty());
    assert_eq!(
        seen[0].body["status"]["conditions"][0]["reason"],
        "ResourceConflict"
    );
}

#[tokio::test]
async fn deletion_goes_through_delete_topics_then_releases() {
    let (_d, b) = setup();
    let id = b.client_creates("orders", 3);
    let k = deleting(owning(finalized(kt("orders", 0, 3)), &id));
    let (r, seen, _) = run(k.clone(), vec![], b.clone()).await;
    assert_eq!(r.unwrap(), Action::requeue(Duration::from_millis(500)));
    assert!(seen.is_empty());
    assert_eq!(b.calls(), vec!["DeleteTopics orders"]);
    assert_eq!(b.stamp_id("orders"), None);
    // Re-driven: the topic is gone, the finalizer goes.
    let (r, seen, _) = run(k, vec![], b.clone()).await;
    assert_eq!(r.unwrap(), Action::await_change());
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].body["metadata"]["finalizers"],
        serde_json::json!([])
    );
    assert_eq!(b.calls().len(), 1, "no second DeleteTopics");
}

#[tokio::test]
async fn unreachable_brokers_are_an_error_with_backoff() {
    let (_d, b) = setup();
    *b.down.lock().unwrap() = 10;
    let k = finalized(kt("orders", 0, 3));
    let (r, seen, ctx) = run(k.clone(), vec![], b.clone()).await;
    let err = r.unwrap_err();
    assert_eq!(err.reason(), "kafka_transport");
    assert!(seen.is_empty());
    let k = Arc::new(k);
    let a1 = error_policy(k.clone(), &err, ctx.clone());
    let a2 = error_policy(k.clone(), &err, ctx.clone());
    assert_eq!(a1, Action::requeue(Duration::from_secs(1)));
    assert_eq!(a2, Action::requeue(Duration::from_secs(2)));
    let m = ctx.metrics.render();
    assert!(
        m.contains("kaas_operator_reconcile_errors_total{reason=\"kafka_transport\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn unmanaged_resource_loses_its_finalizer_and_nothing_else() {
    let (_d, b) = setup();
    b.client_creates("orders", 3);
    let mut k = finalized(kt("orders", 0, 3));
    k.metadata.annotations = Some(
        [(
            kaas_operator::crd::UNMANAGED_ANNOTATION.to_string(),
            "false".to_string(),
        )]
        .into(),
    );
    let (r, seen, _) = run(k, vec![], b.clone()).await;
    assert!(r.is_ok());
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].body["metadata"]["finalizers"],
        serde_json::json!([])
    );
    assert!(b.calls().is_empty());
    assert!(
        b.stamp_id("orders").is_some(),
        "an unmanaged topic is never deleted"
    );
}

#[tokio::test]
async fn alter_configs_not_served_is_not_supported() {
    let (_d, b) = setup();
    let id = b.client_creates("orders", 3);
    let mut k = owning(finalized(kt("orders", 0, 3)), &id);
    k.spec.config.insert("retention.ms".into(), "60000".into());
    let (r, seen, _) = run(k, vec![], b.clone()).await;
    assert!(r.is_ok());
    assert_eq!(b.calls(), vec!["IncrementalAlterConfigs orders"]);
    assert_eq!(
        seen[0].body["status"]["conditions"][0]["reason"],
        "NotSupported"
    );
    let _ = ApiKey::IncrementalAlterConfigs;
}

/// A replica whose lease ran out (or was never acquired) writes nothing:
/// no Kafka admin request, no API patch, for every kind of step.
#[tokio::test]
async fn a_replica_without_the_lease_writes_nothing() {
    let (_d, b) = setup();
    let id = b.client_creates("taken", 3);
    let expired = Fence::elected();
    expired.set(Some(std::time::Instant::now()));
    let cases = vec![
        kt("orders", 0, 3),                                  // AddFinalizer
        finalized(kt("orders", 0, 3)),                       // Create
        finalized(kt("taken", 0, 3)),                        // Status
        owning(finalized(kt("taken", 0, 6)), &id),           // Grow
        deleting(owning(finalized(kt("taken", 0, 3)), &id)), // Delete
        owning(
            finalized(kt("taken", 0, 3)),
            "00000000-0000-0000-0000-000000000001",
        ), // Reclaim
    ];
    for k in cases {
        for fence in [expired.clone(), Fence::elected()] {
            let (r, seen, ctx) = run_fenced(k.clone(), vec![], b.clone(), fence).await;
            let err = r.expect_err("a write went out without the lease");
            assert_eq!(err.reason(), "not_leader");
            assert!(seen.is_empty(), "{seen:?}");
            assert!(b.calls().is_empty(), "{:?}", b.calls());
            assert!(ctx
                .metrics
                .render()
                .contains("kaas_operator_reconcile_errors_total{reason=\"not_leader\"} 1"));
        }
    }
    assert_eq!(b.stamp_id("taken"), Some(id));
    assert_eq!(b.stamp_id("orders"), None);
}

#[tokio::test]
async fn reclaim_deletes_by_id_then_forgets_the_recorded_id() {
    let (_d, b) = setup();
    let outside = b.client_creates("orders", 3);
    let k = owning(
        finalized(kt("orders", 0, 3)),
        "00000000-0000-0000-0000-000000000001",
    );
    let (r, seen, _) = run(k, vec![], b.clone()).await;
    assert_eq!(r.unwrap(), Action::requeue(Duration::from_millis(500)));
    assert_eq!(b.calls(), vec![format!("DeleteTopics orders {outside}")]);
    assert_eq!(b.stamp_id("orders"), None);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("PATCH", format!("{KT_PATH}/status").as_str())
    );
    assert_eq!(
        seen[0].body["status"],
        serde_json::json!({"topicId": null, "partitions": null})
    );
}

/// The recorded incarnation is gone (deleted outside, or a reclaim killed
/// between its two writes): the id is forgotten before anything is created.
#[tokio::test]
async fn a_gone_incarnation_is_forgotten_before_a_create() {
    let (_d, b) = setup();
    let k = owning(
        finalized(kt("orders", 0, 3)),
        "00000000-0000-0000-0000-000000000001",
    );
    let (r, seen, _) = run(k, vec![], b.clone()).await;
    assert_eq!(r.unwrap(), Action::requeue(Duration::from_millis(500)));
    assert!(b.calls().is_empty(), "nothing created yet: {:?}", b.calls());
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].path, format!("{KT_PATH}/status"));
    assert_eq!(seen[0].body["status"]["topicId"], serde_json::Value::Null);
}
