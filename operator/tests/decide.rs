//! `decide` branch by branch on temp volumes, and convergence when the
//! operator dies after any step (it keeps no state of its own: every step is
//! re-decided from the resource and the volume).

// Fixtures (bare directories, torn stamps) are made with std::fs on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use kaas_operator::crd::{KafkaTopic, KafkaTopicStatus, FINALIZER, UNMANAGED_ANNOTATION};
use kaas_operator::reconcile::{decide, read_volume, settle, Step, Volume};
use std::sync::Arc;

fn vol(b: &FakeBrokers, name: &str) -> Volume {
    read_volume(&b.data, name).unwrap()
}

fn reason(step: &Step) -> String {
    match step {
        Step::Status(s) => s.conditions[0].reason.clone(),
        other => panic!("expected a status, got {other:?}"),
    }
}

fn brokers() -> (tempfile::TempDir, FakeBrokers) {
    let d = tempfile::tempdir().unwrap();
    let b = FakeBrokers::new(d.path().to_path_buf());
    (d, b)
}

#[test]
fn new_resource_gets_its_finalizer_before_anything_is_created() {
    let (_d, b) = brokers();
    let k = kt("orders", 0, 3);
    assert_eq!(
        decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders")),
        Step::AddFinalizer
    );
}

#[test]
fn absent_topic_is_created() {
    let (_d, b) = brokers();
    let k = finalized(kt("orders", 0, 3));
    assert!(matches!(
        decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders")),
        Step::Create { partitions: 3, .. }
    ));
}

#[test]
fn stamped_topic_records_its_id_and_is_ready() {
    let (_d, b) = brokers();
    let id = b.client_creates("orders", 3);
    let k = finalized(kt("orders", 0, 3));
    match decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders")) {
        Step::Status(s) => {
            assert_eq!(s.topic_id.as_deref(), Some(id.as_str()));
            assert_eq!(s.partitions, Some(3));
            assert_eq!(s.observed_generation, Some(1));
            assert_eq!(
                (
                    s.conditions[0].status.as_str(),
                    s.conditions[0].reason.as_str()
                ),
                ("True", "Ready")
            );
        }
        s => panic!("{s:?}"),
    }
}

#[test]
fn unstamped_directory_is_not_created_over_and_not_claimed() {
    // A bare directory (pre-stamp data): the brokers adopt and stamp it on
    // their next scan; until then the operator sees no stamp. CreateTopics
    // answers TOPIC_ALREADY_EXISTS (the brokers' catalog), which is success:
    // nothing is destroyed, and the next pass records the stamp.
    let (_d, b) = brokers();
    std::fs::create_dir_all(b.data.join("legacy/0")).unwrap();
    let k = finalized(kt("legacy", 0, 1));
    assert!(matches!(
        decide(&k, &[Arc::new(k.clone())], &vol(&b, "legacy")),
        Step::Create { .. }
    ));
    let adopted =
        kaas_volume::topic_dir::adopt(&kaas_volume::fs::RealFs, &b.data, "legacy").unwrap();
    assert!(b.data.join("legacy/0").is_dir(), "adoption keeps the data");
    match decide(&k, &[Arc::new(k.clone())], &vol(&b, "legacy")) {
        Step::Status(s) => assert_eq!(s.topic_id, Some(adopted.topic_id.to_string())),
        s => panic!("{s:?}"),
    }
}

#[test]
fn grow_is_asked_and_shrink_is_not_supported() {
    let (_d, b) = brokers();
    let id = b.client_creates("orders", 3);
    let grow = owning(finalized(kt("orders", 0, 5)), &id);
    assert_eq!(
        decide(&grow, &[Arc::new(grow.clone())], &vol(&b, "orders")),
        Step::Grow {
            name: "orders".into(),
            partitions: 5
        }
    );
    let shrink = owning(finalized(kt("orders", 0, 2)), &id);
    let s = decide(&shrink, &[Arc::new(shrink.clone())], &vol(&b, "orders"));
    assert_eq!(reason(&s), "NotSupported");
}

#[test]
fn a_not_supported_answer_is_not_resent_for_the_same_generation() {
    let (_d, b) = brokers();
    let id = b.client_creates("orders", 3);
    let mut k = owning(finalized(kt("orders", 0, 5)), &id);
    k.status.as_mut().unwrap().conditions = vec![kaas_operator::crd::Condition {
        type_: "Ready".into(),
        status: "False".into(),
        reason: "NotSupported".into(),
        message: "the brokers do not serve CreatePartitions yet".into(),
        last_transition_time: Some("t0".into()),
    }];
    k.status.as_mut().unwrap().observed_generation = Some(1);
    assert_eq!(
        reason(&decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders"))),
        "NotSupported"
    );
    // A new generation of the spec asks again (a newer broker may serve it).
    k.metadata.generation = Some(2);
    assert!(matches!(
        decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders")),
        Step::Grow { .. }
    ));
}

#[test]
fn config_change_is_asked() {
    let (_d, b) = brokers();
    let id = b.client_creates("orders", 3);
    let mut k = owning(finalized(kt("orders", 0, 3)), &id);
    k.spec.config.insert("retention.ms".into(), "1000".into());
    assert!(matches!(
        decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders")),
        Step::Alter { .. }
    ));
}

#[test]
fn invalid_config_is_invalid_spec() {
    let (_d, b) = brokers();
    let mut k = finalized(kt("orders", 0, 3));
    k.spec
        .config
        .insert("cleanup.policy".into(), "compact".into());
    assert_eq!(
        reason(&decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders"))),
        "InvalidSpec"
    );
}

#[test]
fn two_resources_one_topic_oldest_wins() {
    let (_d, b) = brokers();
    let old = finalized(kt("a", 0, 1));
    let mut young = finalized(kt("b", 10, 1));
    young.spec.topic_name = Some("a".into());
    let all = [Arc::new(old.clone()), Arc::new(young.clone())];
    assert!(matches!(
        decide(&old, &all, &vol(&b, "a")),
        Step::Create { .. }
    ));
    assert_eq!(
        reason(&decide(&young, &all, &vol(&b, "a"))),
        "ResourceConflict"
    );
    // The loser's deletion never deletes the winner's topic.
    let id = b.client_creates("a", 1);
    let gone = deleting(owning(young, &id));
    let all = [Arc::new(old), Arc::new(gone.clone())];
    assert_eq!(decide(&gone, &all, &vol(&b, "a")), Step::RemoveFinalizer);
}

#[test]
fn unmanaged_is_left_alone_and_loses_its_finalizer() {
    let (_d, b) = brokers();
    let mut k = finalized(kt("orders", 0, 3));
    k.metadata.annotations = Some([(UNMANAGED_ANNOTATION.to_string(), "false".to_string())].into());
    assert_eq!(
        decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders")),
        Step::RemoveFinalizer
    );
    k.metadata.finalizers = None;
    assert_eq!(
        reason(&decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders"))),
        "Unmanaged"
    );
}

#[test]
fn deletion_deletes_only_the_incarnation_it_owns() {
    let (_d, b) = brokers();
    let id = b.client_creates("orders", 3);
    let k = deleting(owning(finalized(kt("orders", 0, 3)), &id));
    assert_eq!(
        decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders")),
        Step::Delete("orders".into())
    );
    // The directory now holds another incarnation: not ours to delete.
    let other = deleting(owning(
        finalized(kt("orders", 0, 3)),
        "00000000-0000-0000-0000-000000000001",
    ));
    assert_eq!(
        decide(&other, &[Arc::new(other.clone())], &vol(&b, "orders")),
        Step::RemoveFinalizer
    );
    // Already gone: just let the resource go.
    let d = tempfile::tempdir().unwrap();
    let empty = FakeBrokers::new(d.path().to_path_buf());
    assert_eq!(
        decide(&k, &[Arc::new(k.clone())], &vol(&empty, "orders")),
        Step::RemoveFinalizer
    );
}

/// Catches: a reclaim that does not converge (re-reclaiming the new
/// incarnation it created, or adopting the old one).
#[test]
fn a_reclaimed_topic_converges_to_a_new_incarnation() {
    let (_d, b) = brokers();
    let outside = b.client_creates("orders", 3);
    let mut world = Some(owning(
        finalized(kt("orders", 0, 3)),
        "00000000-0000-0000-0000-000000000001",
    ));
    let steps = run_until_stable(&mut world, &b, 10);
    assert!(matches!(steps[0], Step::Reclaim { .. }), "{steps:?}");
    let s = world.unwrap().status.unwrap();
    let now = match read_volume(&b.data, "orders").unwrap() {
        Volume::Stamped(st) => st.topic_id.to_string(),
        v => panic!("{v:?}"),
    };
    assert_ne!(now, outside);
    assert_eq!(s.topic_id.as_deref(), Some(now.as_str()));
    assert_eq!(s.conditions[0].reason, "Ready");
}

/// Catches: a directory of an incarnation this resource does not own
/// (deleted and re-created outside it) served as the resource's topic;
/// and an adopted directory (unknown history) being destroyed.
#[test]
fn a_stamp_of_a_previous_incarnation_is_reclaimed_an_adopted_one_reported() {
    let (_d, b) = brokers();
    let id = b.client_creates("orders", 3);
    let k = owning(
        finalized(kt("orders", 0, 3)),
        "00000000-0000-0000-0000-000000000001",
    );
    assert_eq!(
        decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders")),
        Step::Reclaim {
            name: "orders".into(),
            id: id.parse().unwrap(),
        }
    );
    // Unstamped, then adopted by the brokers: never reclaimed.
    std::fs::create_dir_all(b.data.join("legacy/0")).unwrap();
    kaas_volume::topic_dir::scan(&kaas_volume::fs::RealFs, &b.data).unwrap();
    let k = owning(
        finalized(kt("legacy", 0, 1)),
        "00000000-0000-0000-0000-000000000001",
    );
    assert_eq!(
        reason(&decide(&k, &[Arc::new(k.clone())], &vol(&b, "legacy"))),
        "IncarnationMismatch"
    );
}

#[test]
fn unreadable_stamp_is_reported() {
    let (_d, b) = brokers();
    std::fs::create_dir_all(b.data.join("orders")).unwrap();
    std::fs::write(b.data.join("orders/.topic-id.json"), b"{not json").unwrap();
    let k = finalized(kt("orders", 0, 3));
    assert_eq!(
        reason(&decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders"))),
        "StampUnreadable"
    );
}

#[test]
fn rename_is_not_supported() {
    let (_d, b) = brokers();
    let id = b.client_creates("orders", 3);
    let mut k = owning(finalized(kt("orders", 0, 3)), &id);
    k.spec.topic_name = Some("orders2".into());
    assert_eq!(
        reason(&decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders2"))),
        "NotSupported"
    );
}

#[test]
fn unchanged_status_keeps_its_transition_time() {
    let (_d, b) = brokers();
    let id = b.client_creates("orders", 3);
    let k = owning(finalized(kt("orders", 0, 3)), &id);
    let Step::Status(s) = decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders")) else {
        panic!()
    };
    let first = settle(&KafkaTopicStatus::default(), s.clone(), "t1");
    let again = settle(&first, s, "t2");
    assert_eq!(
        first, again,
        "nothing changed: the status must compare equal (no write)"
    );
}

/// Apply `step` to the simulated world; `lose_reply` models a crash after
/// the effect but before the operator saw the answer.
fn apply(world: &mut Option<KafkaTopic>, b: &FakeBrokers, step: &Step) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    use kaas_operator::admin::Admin;
    let k = world.as_mut().unwrap();
    match step {
        Step::AddFinalizer => k.metadata.finalizers = Some(vec![FINALIZER.into()]),
        Step::RemoveFinalizer => {
            k.metadata.finalizers = None;
            if k.metadata.deletion_timestamp.is_some() {
                *world = None;
            }
        }
        Step::Delete(n) => rt.block_on(b.delete_topic(n)).unwrap(),
        Step::Reclaim { name, id } => {
            rt.block_on(b.delete_incarnation(name, *id)).unwrap();
            let s = k.status.get_or_insert_with(Default::default);
            s.topic_id = None;
            s.partitions = None;
        }
        Step::Forget { .. } => {
            let s = k.status.get_or_insert_with(Default::default);
            s.topic_id = None;
            s.partitions = None;
        }
        Step::Create {
            name,
            partitions,
            configs,
        } => rt
            .block_on(b.create_topic(name, *partitions, configs))
            .unwrap(),
        Step::Grow { .. } | Step::Alter { .. } => {}
        Step::Status(s) => {
            let prev = k.status.clone().unwrap_or_default();
            k.status = Some(settle(&prev, s.clone(), "t"));
        }
    }
}

fn run_until_stable(world: &mut Option<KafkaTopic>, b: &FakeBrokers, max: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    for _ in 0..max {
        let Some(k) = world.clone() else { return steps };
        let step = decide(&k, &[Arc::new(k.clone())], &vol(b, &k.topic_name()));
        let before = world.clone();
        apply(world, b, &step);
        steps.push(step);
        if serde_json::to_value(&*world).unwrap() == serde_json::to_value(&before).unwrap()
            && matches!(steps.last(), Some(Step::Status(_)))
        {
            return steps;
        }
    }
    panic!("no convergence: {steps:?}");
}

#[test]
fn create_then_delete_converges_after_a_crash_at_every_step() {
    // The full life: create, become Ready, delete. For every prefix length
    // n, the operator "crashes" after n steps (its memory is gone; the
    // resource and the volume are what they are) and a fresh run finishes.
    let full = {
        let d = tempfile::tempdir().unwrap();
        let b = FakeBrokers::new(d.path().to_path_buf());
        let mut w = Some(kt("orders", 0, 3));
        let mut s = run_until_stable(&mut w, &b, 20);
        w = Some(deleting(w.unwrap()));
        s.extend(run_until_stable(&mut w, &b, 20));
        assert!(w.is_none(), "resource released");
        s.len()
    };
    for crash_after in 0..full {
        let d = tempfile::tempdir().unwrap();
        let b = FakeBrokers::new(d.path().to_path_buf());
        let mut w = Some(kt("orders", 0, 3));
        let mut n = 0;
        // Phase 1 with a crash: stop after `crash_after` steps, then resume.
        for _ in 0..crash_after.min(20) {
            let k = w.clone().unwrap();
            let step = decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders"));
            apply(&mut w, &b, &step);
            n += 1;
        }
        let _ = n;
        run_until_stable(&mut w, &b, 20);
        let k = w.clone().unwrap();
        let st = k.status.clone().unwrap();
        assert_eq!(
            st.topic_id,
            b.stamp_id("orders"),
            "crash after {crash_after}"
        );
        assert_eq!(st.conditions[0].reason, "Ready");
        w = Some(deleting(k));
        run_until_stable(&mut w, &b, 20);
        assert!(
            w.is_none(),
            "crash after {crash_after}: resource not released"
        );
        assert_eq!(b.stamp_id("orders"), None, "topic deleted");
        assert_eq!(
            b.calls()
                .iter()
                .filter(|c| c.starts_with("DeleteTopics"))
                .count(),
            1
        );
    }
}

#[test]
fn recreated_resource_gets_a_new_incarnation() {
    // Kafka Streams' reset, through resources: delete, re-apply. The new
    // resource's topic is a new incarnation (new id), never the old data.
    let d = tempfile::tempdir().unwrap();
    let b = FakeBrokers::new(d.path().to_path_buf());
    let mut w = Some(kt("orders", 0, 3));
    run_until_stable(&mut w, &b, 20);
    let first = w
        .as_ref()
        .unwrap()
        .status
        .clone()
        .unwrap()
        .topic_id
        .unwrap();
    std::fs::write(b.data.join("orders/0.marker"), b"old").ok();
    w = Some(deleting(w.unwrap()));
    run_until_stable(&mut w, &b, 20);
    let mut w: Option<KafkaTopic> = Some(kt("orders", 20, 3));
    run_until_stable(&mut w, &b, 20);
    let second = w.unwrap().status.unwrap().topic_id.unwrap();
    assert_ne!(first, second);
    assert!(
        !b.data.join("orders/0.marker").exists(),
        "old incarnation's files inherited"
    );
}

/// The writes one step makes, in order: a reclaim is two (DeleteTopics by
/// id, then the status patch forgetting the id), every other step one.
fn writes(step: &Step) -> usize {
    match step {
        Step::Reclaim { .. } => 2,
        _ => 1,
    }
}

/// Apply the first `n` writes of `step` (all of them when `n >= writes`).
fn apply_partly(world: &mut Option<KafkaTopic>, b: &FakeBrokers, step: &Step, n: usize) {
    match step {
        Step::Reclaim { name, id } if n < 2 => {
            if n == 1 {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                use kaas_operator::admin::Admin;
                rt.block_on(b.delete_incarnation(name, *id)).unwrap();
            }
        }
        _ if n == 0 => {}
        _ => apply(world, b, step),
    }
}

/// The ids DeleteTopics named (reclaims) and the plain deletes.
fn deletes(b: &FakeBrokers) -> Vec<String> {
    b.calls()
        .into_iter()
        .filter(|c| c.starts_with("DeleteTopics"))
        .collect()
}

/// Catches: a reclaim interrupted between its DeleteTopics and its status
/// patch (operator killed) leaving the old id in the status, so the
/// restarted operator creates a new incarnation and then reclaims — deletes
/// — that one too (clients may already have written to it).
#[test]
fn reclaim_converges_after_a_crash_between_every_write() {
    let start = |b: &FakeBrokers| {
        let outside = b.client_creates("orders", 3);
        let w = Some(owning(
            finalized(kt("orders", 0, 3)),
            "00000000-0000-0000-0000-000000000001",
        ));
        (outside, w)
    };
    // The writes of an uninterrupted run.
    let total = {
        let d = tempfile::tempdir().unwrap();
        let b = FakeBrokers::new(d.path().to_path_buf());
        let (_, mut w) = start(&b);
        run_until_stable(&mut w, &b, 20)
            .iter()
            .map(writes)
            .sum::<usize>()
    };
    assert!(total >= 4, "reclaim (2), create, status: {total}");
    for crash_after in 0..=total {
        let d = tempfile::tempdir().unwrap();
        let b = FakeBrokers::new(d.path().to_path_buf());
        let (outside, mut w) = start(&b);
        // Run until `crash_after` writes went out, possibly mid-step: the
        // process dies there, its memory is gone.
        let mut done = 0;
        while done < crash_after {
            let k = w.clone().unwrap();
            let step = decide(&k, &[Arc::new(k.clone())], &vol(&b, "orders"));
            let n = writes(&step).min(crash_after - done);
            apply_partly(&mut w, &b, &step, n);
            done += n;
        }
        // A restarted operator finishes.
        run_until_stable(&mut w, &b, 20);
        let st = w.unwrap().status.unwrap();
        let now = b.stamp_id("orders").expect("a topic");
        assert_ne!(now, outside, "crash after {crash_after}");
        assert_eq!(
            st.topic_id.as_deref(),
            Some(now.as_str()),
            "crash after {crash_after}"
        );
        assert_eq!(
            st.conditions[0].reason, "Ready",
            "crash after {crash_after}"
        );
        assert_eq!(
            deletes(&b),
            vec![format!("DeleteTopics orders {outside}")],
            "crash after {crash_after}: only the previous incarnation is deleted"
        );
    }
}

/// Catches: a topic deleted outside the operator (a client's DeleteTopics)
/// re-created by the resource and then reclaimed as "another incarnation".
#[test]
fn a_topic_deleted_outside_is_recreated_once_never_reclaimed() {
    let (_d, b) = brokers();
    let mut w = Some(kt("orders", 0, 3));
    run_until_stable(&mut w, &b, 20);
    let first = b.stamp_id("orders").unwrap();
    // A client deletes the topic.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    use kaas_operator::admin::Admin;
    rt.block_on(b.delete_topic("orders")).unwrap();
    let before = deletes(&b).len();
    run_until_stable(&mut w, &b, 20);
    let now = b.stamp_id("orders").expect("re-created");
    assert_ne!(now, first);
    assert_eq!(deletes(&b).len(), before, "{:?}", b.calls());
    let st = w.unwrap().status.unwrap();
    assert_eq!(st.topic_id.as_deref(), Some(now.as_str()));
    assert_eq!(st.conditions[0].reason, "Ready");
}
