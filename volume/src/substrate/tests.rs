//! Unit tests of the in-process probes, on the real filesystem and on the
//! fault-injecting seam (silly rename, lost create replies, a broken
//! exclusive create).

#![allow(clippy::disallowed_methods)] // tests build fixtures and simulate other hosts with raw std::fs calls

use super::*;
use crate::fs::fault::FaultFs;
use crate::fs::RealFs;

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn quick_check_passes_on_local_disk_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("partition-data"), b"untouched").unwrap();
    let r = quick_check(&RealFs, dir.path()).unwrap();
    assert!(r.disqualified().is_none(), "{r}");
    for p in ["mount", "exclusive-create", "rename-identity", "fsync"] {
        let c = r.check(p).unwrap_or_else(|| panic!("{p} missing: {r}"));
        assert!(matches!(c.status, Status::Pass | Status::Warn), "{r}");
    }
    assert_eq!(leftovers(dir.path()), vec!["partition-data".to_owned()]);
    assert_eq!(
        std::fs::read(dir.path().join("partition-data")).unwrap(),
        b"untouched"
    );
}

#[test]
fn quick_check_runs_through_the_fault_seam() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultFs::new();
    let r = quick_check(&fs, dir.path()).unwrap();
    assert!(r.disqualified().is_none(), "{r}");
    assert!(fs.ops() > 0, "probes must go through the seam");
    assert!(leftovers(dir.path()).is_empty());
}

#[test]
fn exclusive_create_probe_passes_then_catches_a_broken_substrate() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultFs::new();
    let c = probes::exclusive_create_threads(&fs, dir.path(), 4, 10).unwrap();
    assert_eq!(c.status, Status::Pass, "{c:?}");

    let dir = tempfile::tempdir().unwrap();
    let fs = FaultFs::new();
    fs.break_exclusive_create(true);
    let c = probes::exclusive_create_threads(&fs, dir.path(), 4, 10).unwrap();
    assert_eq!(c.status, Status::Fail, "{c:?}");
    assert!(c.evidence.contains("not exclusive"), "{c:?}");
}

#[test]
fn exclusive_create_probe_reports_a_lost_reply() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultFs::new();
    fs.lose_create_reply(1);
    let c = probes::exclusive_create_threads(&fs, dir.path(), 3, 5).unwrap();
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(c.evidence.contains("reply was lost"), "{c:?}");
}

#[test]
fn silly_rename_probe_sees_nfs_behaviour_on_the_fault_seam() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultFs::new();
    fs.silly_rename(true);
    let c = probes::silly_rename(&fs, dir.path(), &|p: &Path| probes::hold_here(&fs, p)).unwrap();
    assert_eq!(c.status, Status::Pass, "{c:?}");
    assert!(c.evidence.contains(".nfs"), "{c:?}");
    assert!(
        c.evidence.contains("failed"),
        "directory must have been busy: {c:?}"
    );
    assert!(
        leftovers(dir.path()).is_empty(),
        "{:?}",
        leftovers(dir.path())
    );
}

#[test]
fn silly_rename_probe_on_local_semantics() {
    let dir = tempfile::tempdir().unwrap();
    let c = probes::silly_rename(&RealFs, dir.path(), &|p: &Path| {
        probes::hold_here(&RealFs, p)
    })
    .unwrap();
    assert_eq!(c.status, Status::Pass, "{c:?}");
    assert!(c.evidence.contains("clean"), "{c:?}");
    assert!(leftovers(dir.path()).is_empty());
}

#[test]
fn stale_scratch_dirs_are_swept_and_live_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let dead = dir.path().join(format!("{SCRATCH_PREFIX}1-dead"));
    std::fs::create_dir(&dead).unwrap();
    std::fs::write(dead.join("junk"), b"x").unwrap();
    let own = os::process_identity();
    let mut parts = own.split_whitespace();
    let boot = parts.next().unwrap();
    std::fs::write(dead.join("owner"), format!("{boot} 999999999 1")).unwrap();
    let live = dir.path().join(format!("{SCRATCH_PREFIX}2-live"));
    std::fs::create_dir(&live).unwrap();
    std::fs::write(live.join("owner"), &own).unwrap();
    let foreign = dir.path().join(format!("{SCRATCH_PREFIX}3-foreign"));
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("owner"), "other-boot 1 1").unwrap();

    let r = quick_check(&RealFs, dir.path()).unwrap();
    assert!(r.disqualified().is_none(), "{r}");
    let mut left = leftovers(dir.path());
    left.sort();
    assert_eq!(
        left,
        vec![
            format!("{SCRATCH_PREFIX}2-live"),
            format!("{SCRATCH_PREFIX}3-foreign")
        ],
        "dead owner swept; live and young foreign kept"
    );
}

#[test]
fn report_disqualified_lists_failures() {
    let mut r = Report {
        dir: PathBuf::from("/x"),
        mount: None,
        class: FsClass::Unknown,
        space: None,
        checks: vec![Check::new("mount", Status::Pass, "ext4")],
        quick: true,
        elapsed_ms: 1,
    };
    assert!(r.disqualified().is_none());
    r.checks
        .push(Check::new("rename-identity", Status::Fail, "copy+delete"));
    assert_eq!(
        r.disqualified().unwrap(),
        "rename-identity: copy+delete".to_owned()
    );
    assert!(r.to_string().contains("DISQUALIFIED"));
    let j = serde_json::to_value(&r).unwrap();
    assert_eq!(j["checks"][1]["status"], "fail");
}

#[test]
fn patterns_detect_torn_reads() {
    let a = probes::pattern(1, 64);
    let b = probes::pattern(2, 64);
    assert_eq!(probes::verify_pattern(&a, 64), probes::Verdict::Ok(1));
    let mut mixed = a[..32].to_vec();
    mixed.extend_from_slice(&b[32..]);
    assert!(matches!(
        probes::verify_pattern(&mixed, 64),
        probes::Verdict::Torn(_)
    ));
    assert!(matches!(
        probes::verify_pattern(&a[..40], 64),
        probes::Verdict::Torn(_)
    ));
}

/// CI flakes both ways: 3 brokers starting at once on 2 cores made an
/// honest weakfs mount fail the fsync heuristic once, and CPU/IO load made a
/// no-op daemon pass it once. The verdict is now the majority of 3 runs.
#[test]
fn a_timing_verdict_is_the_majority_of_three_runs() {
    use std::cell::{Cell, RefCell};
    let check = |pass: bool| {
        if pass {
            Check::new("fsync", Status::Pass, "calm")
        } else {
            Check::new("fsync", Status::Fail, "noisy")
        }
    };
    let run = |seq: &[bool]| {
        let runs = Cell::new(0);
        let pauses = RefCell::new(Vec::new());
        let c = probes::confirm_failure(
            3,
            |a| pauses.borrow_mut().push(a),
            |a| {
                runs.set(runs.get() + 1);
                Ok(check(seq[a]))
            },
        )
        .unwrap();
        (c, runs.get(), pauses.into_inner())
    };
    // One noisy failure among passes: passes, says what it outvoted.
    let (c, n, pauses) = run(&[false, true, true]);
    assert_eq!((c.status, n), (Status::Pass, 3), "{}", c.evidence);
    assert_eq!(pauses, vec![1, 2]);
    assert!(
        c.evidence.contains("2 of 3 attempts agree"),
        "{}",
        c.evidence
    );
    assert!(
        c.evidence.contains("outvoted as noise: noisy"),
        "{}",
        c.evidence
    );
    // One noisy pass among failures (a liar on a loaded machine): refused.
    let (c, n, _) = run(&[true, false, false]);
    assert_eq!((c.status, n), (Status::Fail, 3), "{}", c.evidence);
    // Two agreeing runs decide without a third.
    let (c, n, _) = run(&[false, false, true]);
    assert_eq!((c.status, n), (Status::Fail, 2));
    let (c, n, _) = run(&[true, true, false]);
    assert_eq!((c.status, n), (Status::Pass, 2));
    // Probe errors propagate.
    let e = probes::confirm_failure(
        3,
        |_| {},
        |_| {
            Err(SubstrateError::io("fsync", Path::new("x"))(
                std::io::Error::other("gone"),
            ))
        },
    );
    assert!(e.is_err());
}

#[test]
fn the_fuse_fsync_verdict_separates_a_no_op_daemon_from_a_loaded_honest_one() {
    use super::probes::fuse_fsync_lies;
    let us = std::time::Duration::from_micros;
    // Honest, quiet machine: 125 us more than a ~300 us clean call.
    assert!(!fuse_fsync_lies(us(125), us(300), us(60)));
    // Honest, loaded (three brokers starting on two cores): clean fsync
    // 4.0 ms, 4 KiB more 0.9 ms; round trips 100-300 us.
    assert!(!fuse_fsync_lies(us(904), us(4026), us(108)));
    // Honest, very busy host: the journal commit dominates both calls and
    // the paired difference vanishes, but the clean call costs ms.
    assert!(!fuse_fsync_lies(us(0), us(7966), us(304)));
    // A no-op daemon (with write-back: up to ~18 us copying 4 KiB) answers
    // the clean call in about one round trip, quiet or loaded.
    assert!(fuse_fsync_lies(us(6), us(47), us(60)));
    assert!(fuse_fsync_lies(us(18), us(90), us(90)));
    assert!(fuse_fsync_lies(us(18), us(600), us(300)));
}
