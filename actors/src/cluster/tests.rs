//! Crash-at-every-step tests of the two cluster-level multi-step writes:
//! claiming a controller epoch (O_EXCL create → write → fsync → dir fsync)
//! and rewriting the assignment file (temp → fsync → rename → dir fsync).
//! Each runs the operation on the fault-injecting seam crashing at step N,
//! drops unsynced bytes (power loss), then checks on the real filesystem that
//! the state is one a reader may see and that the cluster can move on.

use super::records::{
    read_json, write_json, Assignment, BrokerEndpoint, PartitionAssignment, TopicAssignment,
    ASSIGNMENT,
};
use crate::cluster::election::{
    controller_epoch_exists, highest_controller_epoch, try_win_controller_epoch,
};
use kaas_volume::fs::fault::FaultFs;
use kaas_volume::fs::{remove_stale_temps, RealFs, SharedFs, TEMP_PREFIX};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const INC0: u64 = 0xA0A0;
const INC1: u64 = 0xB1B1;
const INC2: u64 = 0xC2C2;

fn real() -> SharedFs {
    Arc::new(RealFs)
}

fn epoch_path(cluster: &Path, epoch: i32) -> PathBuf {
    cluster
        .join("controller")
        .join(format!("epoch-{epoch:010}.json"))
}

/// A cluster directory whose controller epoch 1 is held by broker 0.
fn cluster_with_epoch_1() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    assert!(try_win_controller_epoch(&real(), d.path(), 1, 0, INC0).unwrap());
    d
}

/// Catches: a claim that is not O_EXCL (a retry or a racer overwriting an
/// existing epoch file: two winners of one epoch), a claim acknowledged
/// before it is durable, and a reader that errors on (instead of reporting
/// "no owner" for) an epoch file whose content was lost, which would wedge
/// every candidate.
#[test]
fn crash_at_every_step_of_controller_takeover() {
    let clean = FaultFs::new();
    {
        let d = cluster_with_epoch_1();
        assert!(try_win_controller_epoch(
            &(Arc::new(clean.clone()) as SharedFs),
            d.path(),
            2,
            1,
            INC1
        )
        .unwrap());
    }
    let steps = clean.ops();
    assert!(
        steps >= 4,
        "create, write, sync, dir sync: {:?}",
        clean.log()
    );
    let mut outcomes = BTreeSet::new();
    for n in 1.. {
        let d = cluster_with_epoch_1();
        let dir = d.path();
        let ffs = FaultFs::new();
        ffs.crash_at(n);
        let res = try_win_controller_epoch(&(Arc::new(ffs.clone()) as SharedFs), dir, 2, 1, INC1);
        if !ffs.crashed() {
            assert!(res.unwrap(), "clean run of step count {n} must win");
            assert_eq!(n, steps + 1, "step count changed between runs");
            // A won claim is durable: it survives a power cut right after.
            ffs.power_loss();
            let h = highest_controller_epoch(&real(), dir).unwrap().unwrap();
            assert_eq!((h.epoch, h.broker_id, h.incarnation), (2, 1, INC1));
            break;
        }
        assert!(
            !matches!(res, Ok(true)),
            "step {n}: a claimant that crashed reported a win; ops: {:?}",
            ffs.log()
        );
        ffs.power_loss();

        let rfs = real();
        let h = highest_controller_epoch(&rfs, dir)
            .unwrap_or_else(|e| panic!("step {n}: highest_controller_epoch failed: {e}"))
            .unwrap_or_else(|| panic!("step {n}: epoch 1 vanished"));
        match (h.epoch, h.broker_id) {
            // Crashed before the create: epoch 1 still rules.
            (1, 0) => {
                assert_eq!(h.incarnation, INC0, "step {n}: {h:?}");
                assert!(!controller_epoch_exists(&rfs, dir, 2), "step {n}");
            }
            // The claim made it to disk whole.
            (2, 1) => assert_eq!(h.incarnation, INC1, "step {n}: {h:?}"),
            // Created, content lost: owned by nobody (candidates wait it out).
            (2, -1) => assert!(controller_epoch_exists(&rfs, dir, 2), "step {n}"),
            _ => panic!("step {n}: impossible highest claim {h:?}"),
        }
        outcomes.insert((h.epoch, h.broker_id));

        // Convergence: a third broker claims the epoch after the highest.
        let next = h.epoch + 1;
        assert!(
            try_win_controller_epoch(&rfs, dir, next, 2, INC2).unwrap(),
            "step {n}: broker 2 could not claim epoch {next} over {h:?}"
        );
        let now = highest_controller_epoch(&rfs, dir).unwrap().unwrap();
        assert_eq!(
            (now.epoch, now.broker_id, now.incarnation),
            (next, 2, INC2),
            "step {n}"
        );
        // One winner per epoch: neither a late racer of `next`...
        assert!(
            !try_win_controller_epoch(&rfs, dir, next, 3, 7).unwrap(),
            "step {n}"
        );
        // ...nor broker 1 retrying epoch 2 (which exists in every case now)
        // can win or rewrite a claim that is not its own.
        let e2 = epoch_path(dir, 2);
        let before = std::fs::read(&e2).unwrap();
        let owner = claim_owner(&before);
        let retry = try_win_controller_epoch(&rfs, dir, 2, 1, INC1).unwrap();
        if owner != Some((1, INC1)) {
            assert!(!retry, "step {n}: broker 1 won epoch 2 owned by {owner:?}");
        }
        assert_eq!(
            std::fs::read(&e2).unwrap(),
            before,
            "step {n}: retry rewrote epoch 2"
        );
        assert_eq!(
            highest_controller_epoch(&rfs, dir).unwrap().unwrap(),
            now,
            "step {n}"
        );
    }
    // The loop reached every state a crash can leave.
    assert_eq!(
        outcomes,
        BTreeSet::from([(1, 0), (2, -1), (2, 1)]),
        "crash outcomes seen"
    );
}

/// (broker, incarnation) of an epoch file's content, if it parses.
fn claim_owner(bytes: &[u8]) -> Option<(i32, u64)> {
    serde_json::from_slice::<crate::cluster::election::ControllerEpoch>(bytes)
        .ok()
        .map(|c| (c.broker_id, c.incarnation))
}

/// Catches: a lost create reply letting a second broker win the same epoch,
/// or leaving an epoch file that readers cannot get past.
#[test]
fn lost_create_reply_to_a_claim_never_yields_a_second_winner() {
    let d = cluster_with_epoch_1();
    let dir = d.path();
    let ffs = FaultFs::new();
    ffs.lose_create_reply(1);
    // The create happened but reported EEXIST, so the body was never
    // written: the claimant must not believe it won (it cannot tell its own
    // empty file from another claimant's crashed create), the claim reads as
    // ownerless (broker -1, waited out like a dead holder), and the next
    // epoch is claimable. NFSv4.1 exclusive create carries a verifier, so a
    // retransmitted create normally succeeds; this is the rare remainder,
    // and it costs one lease + grace without a controller, never two.
    let won = try_win_controller_epoch(&(Arc::new(ffs) as SharedFs), dir, 2, 1, INC1).unwrap();
    assert!(!won, "a claim with no body must not count as won");
    let rfs = real();
    assert!(controller_epoch_exists(&rfs, dir, 2));
    assert_eq!(
        highest_controller_epoch(&rfs, dir)
            .unwrap()
            .unwrap()
            .broker_id,
        -1
    );
    assert!(
        !try_win_controller_epoch(&rfs, dir, 2, 2, INC2).unwrap(),
        "two winners"
    );
    let h = highest_controller_epoch(&rfs, dir).unwrap().unwrap();
    assert_eq!(h.epoch, 2);
    assert!(try_win_controller_epoch(&rfs, dir, 3, 2, INC2).unwrap());
}

fn assignment(version: u64) -> Assignment {
    let v = version as i32;
    Assignment {
        controller_epoch: v,
        controller_id: v % 3,
        version,
        brokers: (0..3)
            .map(|id| BrokerEndpoint {
                id,
                host: format!("broker-{id}.example"),
                port: 9092 + id,
            })
            .collect(),
        topics: BTreeMap::from([(
            format!("topic-v{version}"),
            TopicAssignment {
                topic_id: uuid::Uuid::from_u128(version as u128),
                configs: BTreeMap::from([("retention.ms".into(), format!("{}", version * 1000))]),
                partitions: (0..(4 + version as i32))
                    .map(|p| PartitionAssignment {
                        leader: (p + v) % 3,
                        incarnation: version * 100 + p as u64,
                        epoch: v + p,
                        releasing: None,
                    })
                    .collect(),
                deleting: false,
            },
        )]),
        coordinators: vec![PartitionAssignment::vacant(v)],
    }
}

/// Catches: an assignment written in place (truncate + write) or renamed
/// before its temp is fsynced, either of which leaves readers a torn or
/// empty `assignment.json` after a crash; an acknowledged write that is not
/// durable; and a leftover temp that blocks the next controller's write.
#[test]
fn crash_at_every_step_of_assignment_rewrite() {
    let (a1, a2, a3) = (assignment(1), assignment(2), assignment(3));
    let steps = {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(ASSIGNMENT);
        write_json(&RealFs, &path, &a1).unwrap();
        let clean = FaultFs::new();
        write_json(&clean, &path, &a2).unwrap();
        clean.ops()
    };
    assert!(steps > 1, "a multi-step write: {steps}");
    let (mut saw_old, mut saw_new) = (false, false);
    for n in 1..=steps + 1 {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(ASSIGNMENT);
        write_json(&RealFs, &path, &a1).unwrap();
        let ffs = FaultFs::new();
        ffs.crash_at(n);
        let res = write_json(&ffs, &path, &a2);
        assert_eq!(res.is_ok(), !ffs.crashed(), "step {n}: {res:?}");
        ffs.power_loss();

        let got = read_json::<Assignment>(&RealFs, &path)
            .unwrap_or_else(|e| panic!("step {n}: torn assignment: {e}; ops {:?}", ffs.log()))
            .unwrap_or_else(|| panic!("step {n}: assignment vanished"));
        assert!(
            got == a1 || got == a2,
            "step {n}: neither A1 nor A2: {got:?}"
        );
        if res.is_ok() {
            assert_eq!(got, a2, "step {n}: acknowledged write not durable");
        }
        saw_old |= got == a1;
        saw_new |= got == a2;

        // The next writer is not blocked by whatever the crash left.
        write_json(&RealFs, &path, &a3)
            .unwrap_or_else(|e| panic!("step {n}: rewrite after crash failed: {e}"));
        assert_eq!(
            read_json::<Assignment>(&RealFs, &path).unwrap(),
            Some(a3.clone()),
            "step {n}"
        );
        // Only temps are left besides the file, and the sweep clears them.
        let names = |p: &Path| -> Vec<String> {
            std::fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        };
        let left = names(d.path());
        assert!(
            left.iter()
                .all(|x| x == ASSIGNMENT || x.starts_with(TEMP_PREFIX)),
            "step {n}: {left:?}"
        );
        remove_stale_temps(&RealFs, d.path()).unwrap();
        assert_eq!(names(d.path()), vec![ASSIGNMENT.to_owned()], "step {n}");
    }
    assert!(saw_old && saw_new, "the crash loop saw both outcomes");
}
