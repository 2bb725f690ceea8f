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
        peer: None,
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

/// ceph-fuse reports free inodes as -1 (issue 28): "not counted", shown as
/// such, never a warning or a failure.
#[test]
fn space_not_counted_is_said_and_passes() {
    let s = os::Space {
        total_bytes: Some(100 << 30),
        avail_bytes: Some(50 << 30),
        total_inodes: Some(1000),
        free_inodes: None,
    };
    let (status, ev) = space_verdict(&s);
    assert_eq!(status, Status::Pass, "{ev}");
    assert!(ev.contains("free inodes not counted"), "{ev}");
    let s = os::Space {
        total_inodes: None,
        ..s
    };
    let (status, ev) = space_verdict(&s);
    assert_eq!(status, Status::Pass, "{ev}");
    assert!(ev.contains("inodes not counted"), "{ev}");
}

// ------------------------------------------------------------ --peer

fn quick_peer_opts(dir: &Path) -> peer::PeerOptions {
    let mut o = peer::PeerOptions::new(dir.to_path_buf());
    o.rounds = 4;
    o.visibility_rounds = 3;
    o.deadline = Duration::from_millis(200);
    o.proof_timeout = Duration::from_millis(300);
    o.renewal = Duration::from_millis(600);
    o
}

#[test]
fn a_peer_that_is_another_volume_is_refused_by_name() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let scratch = Scratch::create(&RealFs, a.path()).unwrap();
    let e = peer::prove_same_volume(
        &RealFs,
        a.path(),
        scratch.path(),
        b.path(),
        Duration::from_millis(200),
    )
    .unwrap_err();
    assert!(matches!(e, SubstrateError::NotSameVolume { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "{} is not the same volume as {}",
            b.path().display(),
            a.path().display()
        )),
        "{msg}"
    );
    // The same directory twice is one client, not two.
    let e = peer::prove_same_volume(
        &RealFs,
        a.path(),
        scratch.path(),
        a.path(),
        Duration::from_millis(200),
    )
    .unwrap_err();
    assert!(matches!(e, SubstrateError::Peer(_)), "{e}");
    scratch.finish().unwrap();
    assert!(leftovers(a.path()).is_empty());
}

#[test]
fn a_second_path_to_the_same_directory_is_one_client() {
    // A second path to the same directory stands for a second mount.
    let root = tempfile::tempdir().unwrap();
    let a = root.path().join("a");
    std::fs::create_dir(&a).unwrap();
    let b = root.path().join("b");
    std::os::unix::fs::symlink(&a, &b).unwrap();
    let b = b.join(".");
    let scratch = Scratch::create(&RealFs, &a).unwrap();
    // Canonically equal: refused as one client.
    let e = peer::prove_same_volume(&RealFs, &a, scratch.path(), &b, Duration::from_millis(200))
        .unwrap_err();
    assert!(matches!(e, SubstrateError::Peer(_)), "{e}");
    scratch.finish().unwrap();
}

#[test]
fn cross_checks_pass_on_one_honest_directory_and_measure_visibility() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = Scratch::create(&RealFs, dir.path()).unwrap();
    let s = scratch.path().to_path_buf();
    let opts = quick_peer_opts(dir.path());
    let mut reader = peer::InProcess::new(&RealFs, &s);
    let (mut r1, mut r2) = (
        peer::InProcess::new(&RealFs, &s),
        peer::InProcess::new(&RealFs, &s),
    );
    let mut racers: Vec<(String, &mut dyn peer::Peer)> =
        vec![("here-0".into(), &mut r1), ("peer-1".into(), &mut r2)];
    let r = peer::cross_checks(&RealFs, &s, &mut reader, &mut racers, &opts, "").unwrap();
    for c in &r.checks {
        assert_eq!(c.status, Status::Pass, "{c:?}");
    }
    let names: Vec<&str> = r.checks.iter().map(|c| c.property).collect();
    assert_eq!(
        names,
        [
            "cross-close-to-open",
            "cross-exclusive-create",
            "cross-rename",
            "cross-negative-lookup",
            "cross-listing",
            "cross-renewal"
        ]
    );
    assert_eq!(r.visibility.len(), 3);
    // The heartbeat-style replace ran for its 600 ms, 100 ms apart (the
    // in-process peer reads before it, not during: it answers
    // synchronously).
    assert!((2..=6).contains(&r.renewal.rounds), "{:?}", r.renewal);
    assert!(r.renewal.peer_reads > 0, "{:?}", r.renewal);
    assert_eq!(r.renewal.peer_errors, 0, "{:?}", r.renewal);
    assert!(
        r.checks[5].evidence.contains("rename, dir fsync"),
        "{:?}",
        r.checks[5]
    );
    for v in &r.visibility {
        assert_eq!((v.rounds, v.not_seen), (3, 0), "{v:?}");
        assert!(v.max_ms < 200.0, "{v:?}");
    }
    assert!(r.checks[2].evidence.contains("p99"), "{:?}", r.checks[2]);
    scratch.finish().unwrap();
    assert!(leftovers(dir.path()).is_empty());
}

/// A peer whose client serves the old file on the first open after a
/// rename into place (default GlusterFS, issue 28), and whose negative
/// lookups never expire.
struct StalePeer<'a>(peer::InProcess<'a>);

impl peer::Peer for StalePeer<'_> {
    fn send(&mut self, line: &str) -> Result<(), SubstrateError> {
        if line.starts_with("wait content") {
            let w = peer::WaitOutcome {
                seen: true,
                polls: 1500,
                first: "stale saw version 1, expected 2".into(),
                last: "ok".into(),
            };
            self.0.pending.push_back(serde_json::to_string(&w).unwrap());
            return Ok(());
        }
        if line.starts_with("wait exists") {
            let w = peer::WaitOutcome {
                seen: false,
                polls: 200,
                first: "absent".into(),
                last: "absent".into(),
            };
            self.0.pending.push_back(serde_json::to_string(&w).unwrap());
            return Ok(());
        }
        self.0.send(line)
    }
    fn recv(&mut self) -> Result<String, SubstrateError> {
        self.0.recv()
    }
}

#[test]
fn a_stale_first_open_across_mounts_disqualifies_and_names_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = Scratch::create(&RealFs, dir.path()).unwrap();
    let s = scratch.path().to_path_buf();
    let opts = quick_peer_opts(dir.path());
    let mut reader = StalePeer(peer::InProcess::new(&RealFs, &s));
    let (mut r1, mut r2) = (
        peer::InProcess::new(&RealFs, &s),
        peer::InProcess::new(&RealFs, &s),
    );
    let mut racers: Vec<(String, &mut dyn peer::Peer)> =
        vec![("here-0".into(), &mut r1), ("peer-1".into(), &mut r2)];
    let gluster = mount::parse_mountinfo(
        "60 22 0:50 / /mnt/gv rw,relatime - fuse.glusterfs host:/gv rw,user_id=0\n",
    );
    let hint = peer::cto_fix_hint([gluster.first()]);
    let r = peer::cross_checks(&RealFs, &s, &mut reader, &mut racers, &opts, &hint).unwrap();
    let cto = &r.checks[0];
    assert_eq!(
        (cto.property, cto.status),
        ("cross-close-to-open", Status::Fail),
        "{cto:?}"
    );
    assert!(cto.evidence.contains("close-to-open broken"), "{cto:?}");
    assert!(cto.evidence.contains("stale saw version 1"), "{cto:?}");
    assert!(cto.evidence.contains("performance.quick-read"), "{cto:?}");
    assert!(cto.evidence.contains("negative-timeout=0"), "{cto:?}");
    let neg = r
        .checks
        .iter()
        .find(|c| c.property == "cross-negative-lookup")
        .unwrap();
    assert_eq!(neg.status, Status::Warn, "{neg:?}");
    assert!(neg.evidence.contains("3 not seen within 200 ms"), "{neg:?}");
    // Not seen at all: the lease has to outlast the deadline.
    assert_eq!(peer::suggest_lease(&r.visibility, Duration::ZERO), 3000);
    scratch.finish().unwrap();
}

#[test]
fn visibility_percentiles_and_the_lease_rule() {
    let ms = Duration::from_millis;
    let samples: Vec<Option<Duration>> = (1..=100).map(|i| Some(ms(i * 10))).collect();
    let v = peer::Visibility::from_samples("cross-listing", &samples, ms(10_000));
    assert_eq!((v.p50_ms, v.p99_ms, v.max_ms), (500.0, 990.0, 1000.0));
    // 3 x (990 + 10) = 3000 -> the 3 s floor; 3 x (2000 + 20) = 6060 -> 6100.
    assert_eq!(peer::suggest_lease(&[v], ms(10)), 3000);
    let stale = peer::Visibility::from_samples(
        "cross-negative-lookup",
        &[Some(ms(1990)), Some(ms(2000)), None],
        ms(10_000),
    );
    assert_eq!((stale.not_seen, stale.p99_ms), (1, 2000.0));
    assert_eq!(stale.p99_bound_ms(), 10_000.0);
    let seen = peer::Visibility::from_samples(
        "cross-negative-lookup",
        &[Some(ms(1990)), Some(ms(2000))],
        ms(10_000),
    );
    assert_eq!(peer::suggest_lease(&[seen], ms(20)), 6100);
    assert_eq!(peer::suggest_lease(&[stale], ms(20)), 30_100);
    assert!(peer::LEASE_RULE.contains("3 x"));
}

#[test]
fn a_slow_renewal_under_a_reading_peer_sets_the_lease() {
    // Default-tick CephFS (issue 28): every visibility p99 under 0.5 s, but
    // a heartbeat's rename while the others read the record took 4.9 s.
    let ms = Duration::from_millis;
    let vis = peer::Visibility::from_samples("cross-rename", &[Some(ms(440))], ms(10_000));
    let slow: Vec<Duration> = [20, 30, 4900, 25].into_iter().map(ms).collect();
    let r = peer::Renewal::from_samples(&slow, 200, 0);
    assert_eq!((r.rounds, r.max_ms, r.p99_ms), (4, 4900.0, 4900.0));
    let renew = peer::renewal_p99(Some(&r), ms(2));
    assert_eq!(renew, ms(4900));
    // 3 x (440 + 4900) = 16020 -> 16100, where the fsync alone said 3000.
    assert_eq!(
        peer::suggest_lease(std::slice::from_ref(&vis), renew),
        16_100
    );
    assert_eq!(peer::suggest_lease(&[vis], ms(2)), 3000);
    // Never below the bare fsync; without the probe, the fsync.
    let fast = peer::Renewal::from_samples(&[ms(1)], 10, 0);
    assert_eq!(peer::renewal_p99(Some(&fast), ms(5)), ms(5));
    assert_eq!(peer::renewal_p99(None, ms(5)), ms(5));
    assert!(r.to_string().contains("max 4900.0 ms over 4 rounds"), "{r}");
    let c = peer::renewal_check(&r);
    assert_eq!(
        (c.property, c.status),
        ("cross-renewal", Status::Warn),
        "{c:?}"
    );
    assert!(c.evidence.contains("mds tick interval"), "{c:?}");
    let c = peer::renewal_check(&fast);
    assert_eq!(c.status, Status::Pass, "{c:?}");
    let c = peer::renewal_check(&peer::Renewal::from_samples(&[ms(1)], 10, 2));
    assert_eq!(c.status, Status::Warn, "{c:?}");
}
