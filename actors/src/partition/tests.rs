//! Partition log tests: append/read round trips, and crash-at-every-step of
//! the multi-step operations (recovery's roll, segment roll, manifest
//! checkpoint, retention delete) through the fault-injecting seam. Each crash
//! test counts the operations of a clean run, then for every N crashes at N,
//! drops unsynced bytes (power loss), reopens with a clean seam and checks:
//! every record acknowledged (fsynced) before the operation is still there,
//! in order, exactly once, and no unlisted file is left behind.

#![allow(clippy::disallowed_methods)] // tests build fixtures and simulate other hosts with raw std::fs calls

use super::log::{Claimant, LogConfig, LogError, PartitionLog, SNAPSHOTS_KEPT};
use super::producers::{BatchMeta, Incoming, ProducerStates, SequenceError, Verdict};
use super::reader::PartitionReader;
use bytes::{Bytes, BytesMut};
use kaas_protocol::batch::{read_batch_header, validate_batches};
use kaas_protocol::kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kaas_volume::fs::fault::FaultFs;
use kaas_volume::fs::{ReadOnly, RealFs, SharedFs};
use std::path::Path;
use std::sync::Arc;

/// One record batch of `values` (keys `k<value>`), timestamps from `ts`.
pub(crate) fn batch(values: &[&str], ts: i64) -> Bytes {
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: -1,
            timestamp: ts + i as i64,
            key: Some(Bytes::from(format!("k{v}"))),
            value: Some(Bytes::copy_from_slice(v.as_bytes())),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf.freeze()
}

fn cfg() -> LogConfig {
    LogConfig {
        segment_bytes: 600,
        index_interval_bytes: 128,
        checkpoint_bytes: 300,
        ..LogConfig::default()
    }
}

fn append(log: &mut PartitionLog, vals: &[&str], ts: i64) -> i64 {
    let b = batch(vals, ts);
    let infos = validate_batches(&b).unwrap();
    log.append(&b, &infos).unwrap().base_offset
}

/// All (offset, value) pairs readable from the log.
fn read_all(fs: SharedFs, log: &PartitionLog) -> Vec<(i64, String)> {
    let r = PartitionReader::new(fs.read_only(), log.view());
    let (mut off, hw, _) = r.offsets();
    let mut out = Vec::new();
    let mut guard = 0;
    while off < hw {
        guard += 1;
        assert!(guard < 10_000, "read loop does not advance");
        let res = r.read(off, 1 << 20).unwrap();
        assert!(!res.records.is_empty(), "empty read below hw at {off}");
        let mut pos = 0;
        while pos + 61 <= res.records.len() {
            let h = read_batch_header(&res.records[pos..]).unwrap();
            if pos + h.batch_len > res.records.len() {
                break;
            }
            let mut b = res.records.slice(pos..pos + h.batch_len);
            let set = RecordBatchDecoderShim::decode(&mut b);
            for rec in set {
                if rec.0 >= off {
                    out.push(rec);
                }
            }
            off = h.last_offset() + 1;
            pos += h.batch_len;
        }
    }
    out
}

struct RecordBatchDecoderShim;
impl RecordBatchDecoderShim {
    fn decode(b: &mut Bytes) -> Vec<(i64, String)> {
        use kaas_protocol::kafka_protocol::records::RecordBatchDecoder;
        let set = RecordBatchDecoder::decode(b).unwrap();
        set.records
            .into_iter()
            .map(|r| {
                (
                    r.offset,
                    String::from_utf8(r.value.unwrap().to_vec()).unwrap(),
                )
            })
            .collect()
    }
}

fn open(fs: SharedFs, dir: &Path, epoch: i32) -> PartitionLog {
    PartitionLog::open(fs, dir, epoch, cfg(), 1_000).unwrap()
}

#[test]
fn append_sync_read_and_reopen() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    assert_eq!(append(&mut log, &["a", "b"], 100), 0);
    assert_eq!(append(&mut log, &["c"], 200), 2);
    // Not durable yet: invisible to readers.
    assert!(read_all(fs.clone(), &log).is_empty());
    assert_eq!(log.sync_now().unwrap(), 3);
    let want = vec![(0, "a".into()), (1, "b".into()), (2, "c".into())];
    assert_eq!(read_all(fs.clone(), &log), want);
    drop(log);
    let log = open(fs.clone(), d.path(), 1);
    assert_eq!(read_all(fs.clone(), &log), want);
    assert_eq!(log.next_offset(), 3);
    // A new epoch seals the old tail and writes its own segment.
    drop(log);
    let mut log = open(fs.clone(), d.path(), 2);
    assert_eq!(append(&mut log, &["d"], 300), 3);
    log.sync_now().unwrap();
    assert_eq!(read_all(fs.clone(), &log).len(), 4);
    let r = PartitionReader::new(fs.read_only(), log.view());
    assert_eq!(r.end_offset_for_epoch(1), (1, 3));
    assert_eq!(r.end_offset_for_epoch(2), (2, 4));
    let hit = r.offset_for_timestamp(150).unwrap().unwrap();
    assert_eq!((hit.offset, hit.timestamp), (2, 200));
    assert!(r.offset_for_timestamp(10_000).unwrap().is_none());
    assert_eq!(r.max_timestamp().unwrap().unwrap().offset, 3);
    // An older epoch is fenced.
    drop(log);
    assert!(matches!(
        PartitionLog::open(fs, d.path(), 1, cfg(), 0),
        Err(super::log::LogError::Fenced {
            ours: 1,
            found: 2,
            owner: None
        })
    ));
}

#[test]
fn torn_tail_is_ignored_and_never_served() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    append(&mut log, &["a"], 1);
    log.sync_now().unwrap();
    drop(log);
    // Append half a batch and garbage behind the valid data.
    let seg = d.path().join("00000000000000000000-e1.log");
    let mut bytes = std::fs::read(&seg).unwrap();
    let b = batch(&["zzz"], 5);
    bytes.extend_from_slice(&b[..b.len() / 2]);
    std::fs::write(&seg, &bytes).unwrap();
    let mut log = open(fs.clone(), d.path(), 1);
    assert_eq!(log.next_offset(), 1);
    append(&mut log, &["b"], 2);
    log.sync_now().unwrap();
    let got: Vec<String> = read_all(fs.clone(), &log)
        .into_iter()
        .map(|x| x.1)
        .collect();
    assert_eq!(got, vec!["a", "b"]);
}

#[test]
fn corrupt_crc_in_unchecked_tail_stops_recovery_there() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    append(&mut log, &["a"], 1);
    append(&mut log, &["b"], 1);
    log.sync_now().unwrap();
    drop(log); // no checkpoint: the whole active segment is the tail
    let seg = d.path().join("00000000000000000000-e1.log");
    let mut bytes = std::fs::read(&seg).unwrap();
    let n = bytes.len();
    bytes[n - 2] ^= 0xff; // corrupt the second batch's last record
    std::fs::write(&seg, &bytes).unwrap();
    let log = open(fs.clone(), d.path(), 1);
    assert_eq!(log.next_offset(), 1);
}

/// Runs `op` on a log holding acknowledged records, crashing at every step.
fn crash_every_step(
    name: &str,
    setup: impl Fn(&mut PartitionLog),
    op: impl Fn(&mut PartitionLog) -> Result<(), super::log::LogError>,
    expect_after: impl Fn(&PartitionLog, &[(i64, String)]),
) {
    let acked = |log: &mut PartitionLog| {
        for i in 0..12 {
            append(log, &[&format!("v{i:02}")], 1_000 + i);
            log.sync_now().unwrap();
        }
    };
    // Clean run to count steps.
    let d = tempfile::tempdir().unwrap();
    let clean = FaultFs::new();
    let fs: SharedFs = Arc::new(clean.clone());
    let mut log = open(fs.clone(), d.path(), 1);
    acked(&mut log);
    setup(&mut log);
    let before = clean.ops();
    op(&mut log).unwrap();
    let steps = clean.ops() - before;
    assert!(steps > 0, "{name}: operation did no file operations");
    let want: Vec<(i64, String)> = (0..12).map(|i| (i, format!("v{i:02}"))).collect();
    for n in 1..=steps + 1 {
        let d = tempfile::tempdir().unwrap();
        let ffs = FaultFs::new();
        let fs: SharedFs = Arc::new(ffs.clone());
        let mut log = open(fs.clone(), d.path(), 1);
        acked(&mut log);
        setup(&mut log);
        ffs.crash_at(ffs.ops() + n);
        let _ = op(&mut log);
        drop(log);
        ffs.power_loss();
        // Recovery converges: it may itself be re-driven, but a clean open
        // must succeed, keep every acked record and leave no stray files.
        let rfs: SharedFs = Arc::new(RealFs);
        let mut log = PartitionLog::open(rfs.clone(), d.path(), 1, cfg(), 2_000)
            .unwrap_or_else(|e| panic!("{name}: crash at step {n}: reopen failed: {e}"));
        let got = read_all(rfs.clone(), &log);
        let got_acked: Vec<_> = got.iter().filter(|(o, _)| *o < 12).cloned().collect();
        expect_after(&log, &got_acked);
        for w in &want {
            if w.0 >= log.log_start_offset() {
                assert!(
                    got_acked.contains(w),
                    "{name}: crash at step {n}: lost acked {w:?}; log: {:?}",
                    ffs.log()
                );
            }
        }
        let offsets: Vec<i64> = got.iter().map(|x| x.0).collect();
        let mut sorted = offsets.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(offsets, sorted, "{name}: step {n}: out of order or twice");
        // The log is writable after recovery.
        let o = append(&mut log, &["after"], 9_999);
        log.sync_now().unwrap();
        assert_eq!(o, log.next_offset() - 1);
        drop(log);
        let log = PartitionLog::open(rfs.clone(), d.path(), 1, cfg(), 3_000).unwrap();
        assert_eq!(read_all(rfs, &log).last().unwrap().1, "after");
        let names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with(".tmp-")),
            "{name}: step {n}: temp left: {names:?}"
        );
        assert_eq!(
            names.iter().filter(|n| n.starts_with("manifest-")).count(),
            1,
            "{name}: step {n}: {names:?}"
        );
    }
}

#[test]
fn crash_at_every_step_of_segment_roll() {
    crash_every_step("roll", |_| {}, |log| log.roll(5_000), |_, _| {});
}

#[test]
fn crash_at_every_step_of_manifest_checkpoint() {
    crash_every_step("checkpoint", |_| {}, |log| log.checkpoint(), |_, _| {});
}

#[test]
fn crash_at_every_step_of_retention_delete() {
    crash_every_step(
        "retention",
        |log| {
            log.roll(2_000).unwrap();
            append(log, &["x"], 50_000);
            log.sync_now().unwrap();
            log.roll(3_000).unwrap();
        },
        |log| log.enforce_retention(1_000_000_000).map(|_| ()),
        |log, got| {
            // Either nothing or everything before the newest segment went.
            assert!(log.log_start_offset() == 0 || log.log_start_offset() >= 12);
            if log.log_start_offset() == 0 {
                assert_eq!(got.len(), 12);
            }
        },
    );
}

#[test]
fn crash_at_every_step_of_open_with_new_epoch() {
    let seed_log = |dir: &Path| {
        let fs: SharedFs = Arc::new(RealFs);
        let mut log = open(fs, dir, 1);
        for i in 0..5 {
            append(&mut log, &[&format!("v{i}")], i);
        }
        log.sync_now().unwrap();
    };
    let d = tempfile::tempdir().unwrap();
    seed_log(d.path());
    let clean = FaultFs::new();
    let fs: SharedFs = Arc::new(clean.clone());
    drop(PartitionLog::open(fs, d.path(), 2, cfg(), 5).unwrap());
    let steps = clean.ops();
    for n in 1..=steps {
        let d = tempfile::tempdir().unwrap();
        seed_log(d.path());
        let ffs = FaultFs::new();
        ffs.crash_at(n);
        let fs: SharedFs = Arc::new(ffs.clone());
        assert!(PartitionLog::open(fs, d.path(), 2, cfg(), 5).is_err());
        ffs.power_loss();
        let rfs: SharedFs = Arc::new(RealFs);
        let log = PartitionLog::open(rfs.clone(), d.path(), 2, cfg(), 6).unwrap();
        let got: Vec<i64> = read_all(rfs, &log).iter().map(|x| x.0).collect();
        assert_eq!(got, vec![0, 1, 2, 3, 4], "step {n}");
    }
}

#[test]
fn retention_by_size_and_reads_after_it() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut c = cfg();
    c.retention_bytes = 700;
    c.retention_ms = -1;
    let mut log = PartitionLog::open(fs.clone(), d.path(), 1, c, 0).unwrap();
    for i in 0..40 {
        append(&mut log, &[&format!("value-{i:03}")], i);
        log.sync_now().unwrap();
        if log.roll_due(0) {
            log.roll(0).unwrap();
        }
    }
    let removed = log.enforce_retention(0).unwrap();
    assert!(removed > 0);
    let start = log.log_start_offset();
    assert!(start > 0);
    let r = PartitionReader::new(fs.read_only(), log.view());
    assert!(matches!(
        r.read(0, 1000),
        Err(super::reader::ReadError::OutOfRange { .. })
    ));
    let got = read_all(fs, &log);
    assert_eq!(got.first().unwrap().0, start);
    assert_eq!(got.last().unwrap().0, 39);
    let files = std::fs::read_dir(d.path()).unwrap().count();
    assert!(files < 20, "old segments unlinked: {files}");
}

/// Review finding: an empty sealed segment (a leader that opened but never
/// wrote) used to stop time retention forever.
#[test]
fn empty_sealed_segment_does_not_block_time_retention() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("0");
    let fs: SharedFs = Arc::new(RealFs);
    let mut c = cfg();
    c.retention_ms = 1_000;
    drop(PartitionLog::open(fs.clone(), &dir, 1, c.clone(), 0).unwrap());
    let mut log = PartitionLog::open(fs.clone(), &dir, 2, c, 0).unwrap();
    append(&mut log, &["old"], 10);
    log.sync_now().unwrap();
    log.roll(20).unwrap();
    append(&mut log, &["new"], 1_000_000);
    log.sync_now().unwrap();
    assert_eq!(log.enforce_retention(1_000_000).unwrap(), 2);
    assert_eq!(log.log_start_offset(), 1);
}

/// Review finding: a listing that shows segments but no manifest (stale NFS
/// listing, damage) must not start an empty log that would sweep them.
#[test]
fn segments_without_manifest_are_refused_not_swept() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("0");
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), &dir, 1);
    append(&mut log, &["a"], 1);
    log.sync_now().unwrap();
    drop(log);
    std::fs::remove_file(dir.join("manifest-e1.json")).unwrap();
    assert!(matches!(
        PartitionLog::open(fs, &dir, 2, cfg(), 0),
        Err(super::log::LogError::CorruptManifest { .. })
    ));
    assert!(dir.join("00000000000000000000-e1.log").exists());
}

/// Review finding: a leader restarted after its topic was deleted recreated
/// the partition directory under the old name.
#[test]
fn open_never_recreates_a_deleted_topic_directory() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let dir = d.path().join("gone-topic").join("0");
    assert!(PartitionLog::open(fs, &dir, 1, cfg(), 0).is_err());
    assert!(!d.path().join("gone-topic").exists());
}

/// Review finding: after its own fsync failure an owner must not trust
/// bytes past the last durable point (they may be clean pages of a failed
/// writeback); it seals there and starts a new file.
#[test]
fn reopen_after_failure_seals_at_the_durable_point() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("0");
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), &dir, 1);
    append(&mut log, &["durable"], 1);
    log.sync_now().unwrap();
    let point = log.durable_point();
    append(&mut log, &["unsynced"], 2); // written, fsync "failed"
    drop(log);
    let log = PartitionLog::open_with(fs.clone(), &dir, 1, cfg(), 0, Some(point)).unwrap();
    assert_eq!(log.next_offset(), 1);
    let got: Vec<String> = read_all(fs, &log).into_iter().map(|x| x.1).collect();
    assert_eq!(got, vec!["durable"]);
    assert!(dir.join("00000000000000000001-e1.log").exists());
}

/// A deposed leader (the zombie) keeps its epoch-1 handles after a new
/// leader of epoch 2 opened the partition and sealed epoch 1's tail. Its
/// late appends, fsyncs, roll and manifest writes must never be served: not
/// by the new leader, and not after a later takeover re-runs recovery.
fn zombie_after_takeover(zombie_rolls: bool) {
    let what = if zombie_rolls {
        "zombie rolls"
    } else {
        "zombie appends"
    };
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut zombie = open(fs.clone(), d.path(), 1);
    append(&mut zombie, &["a", "b"], 100);
    zombie.sync_now().unwrap(); // acked
    let mut leader = open(fs.clone(), d.path(), 2);

    append(&mut zombie, &["z1"], 200);
    append(&mut zombie, &["z2"], 201);
    zombie.sync_now().unwrap();
    if zombie_rolls {
        zombie.roll(3_000).unwrap();
        append(&mut zombie, &["z3"], 300);
        zombie.sync_now().unwrap();
    }
    // The zombie's writes really landed (else this test proves nothing).
    let zv: Vec<String> = read_all(fs.clone(), &zombie)
        .into_iter()
        .map(|x| x.1)
        .collect();
    assert!(zv.contains(&"z2".to_owned()), "{what}: zombie view {zv:?}");

    append(&mut leader, &["c"], 400);
    leader.sync_now().unwrap();
    let want: Vec<(i64, String)> = vec![(0, "a".into()), (1, "b".into()), (2, "c".into())];
    assert_eq!(read_all(fs.clone(), &leader), want, "{what}: new leader");
    let r = PartitionReader::new(fs.read_only(), leader.view());
    assert_eq!(r.end_offset_for_epoch(1), (1, 2), "{what}");
    // Nor through ListOffsets: z* timestamps (200..300) lie between b and c.
    let hit = r.offset_for_timestamp(150).unwrap().unwrap();
    assert_eq!((hit.offset, hit.timestamp), (2, 400), "{what}");

    if zombie_rolls {
        // Sync + checkpoint: the zombie rewrites its own epoch-1 manifest.
        zombie.close().unwrap();
        assert!(
            d.path().join("manifest-e1.json").exists(),
            "{what}: the zombie's manifest is on disk for the next open to ignore"
        );
    } else {
        drop(zombie);
    }
    drop(leader);

    // A later takeover re-runs recovery over everything the zombie left.
    let mut log = open(fs.clone(), d.path(), 3);
    assert_eq!(
        read_all(fs.clone(), &log),
        want,
        "{what}: after epoch 3 open"
    );
    assert_eq!(log.next_offset(), 3, "{what}");
    let r = PartitionReader::new(fs.read_only(), log.view());
    assert_eq!(r.end_offset_for_epoch(1), (1, 2), "{what}");
    assert_eq!(r.end_offset_for_epoch(2), (2, 3), "{what}");
    let hit = r.offset_for_timestamp(150).unwrap().unwrap();
    assert_eq!((hit.offset, hit.timestamp), (2, 400), "{what}");
    append(&mut log, &["d"], 500);
    log.sync_now().unwrap();
    let got: Vec<String> = read_all(fs, &log).into_iter().map(|x| x.1).collect();
    assert_eq!(got, vec!["a", "b", "c", "d"], "{what}");
}

/// Catches: a new leader that trusts the old epoch's segment length (or its
/// manifest) instead of the seal it recorded, and a recovery that rescans a
/// sealed older-epoch segment or prefers a zombie's lower-epoch manifest.
#[test]
fn zombie_writes_after_takeover_are_never_served() {
    zombie_after_takeover(false);
}

/// Catches: a zombie's roll (new `-e1` segment, rewritten `-e1` index files
/// and manifest) being adopted by the new leader or by a later recovery.
#[test]
fn zombie_roll_after_takeover_is_never_served() {
    zombie_after_takeover(true);
}

/// Catches: a late (zombie) open at an older epoch sweeping files of a newer
/// leader whose manifest it cannot see yet — the sweep deleted every segment
/// its own manifest did not list, whatever the epoch.
#[test]
fn an_older_epoch_open_never_deletes_a_newer_epochs_files() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    append(&mut log, &["a"], 100);
    log.sync_now().unwrap();
    log.close().unwrap();
    // A newer leader (epoch 3) has created its segment; its manifest is not
    // visible to us (not written yet, or hidden from this host).
    let newer = d.path().join("00000000000000000001-e3.log");
    std::fs::write(&newer, b"").unwrap();
    let log2 = open(fs.clone(), d.path(), 2);
    drop(log2);
    assert!(newer.exists(), "epoch 2 swept epoch 3's segment");
}

// ------------------------------------------------- leader-epoch claims

use super::claim::{claim, claim_name, ClaimOwner, Claimed};

const A: ClaimOwner = ClaimOwner {
    broker_id: 1,
    incarnation: 11,
};
const B: ClaimOwner = ClaimOwner {
    broker_id: 2,
    incarnation: 22,
};

fn open_as(
    fs: SharedFs,
    dir: &Path,
    epoch: i32,
    owner: ClaimOwner,
) -> Result<PartitionLog, LogError> {
    PartitionLog::open_as(
        fs,
        dir,
        epoch,
        Claimant {
            owner: Some(owner),
            guard: None,
            binding: None,
        },
        cfg(),
        1_000,
        None,
    )
}

/// Catches: two leaders granted the same epoch (a deposed controller's late
/// assignment write) both opening it — the second took the first's active
/// segment for its own and appended to it (or truncated it), two writers in
/// one file. Now the second is fenced, names the owner, and writes nothing.
#[test]
fn a_second_leader_granted_the_same_epoch_is_fenced_and_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut a = open_as(fs.clone(), d.path(), 3, A).unwrap();
    append(&mut a, &["a", "b"], 100);
    a.sync_now().unwrap();
    let before: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name(), e.metadata().unwrap().len())
        })
        .collect();
    match open_as(fs.clone(), d.path(), 3, B) {
        Err(LogError::Fenced {
            ours: 3,
            found: 3,
            owner: Some(o),
        }) => assert_eq!(o, A),
        Err(e) => panic!("expected fenced by A, got {e}"),
        Ok(_) => panic!("a second leader opened epoch 3"),
    }
    let mut after: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name(), e.metadata().unwrap().len())
        })
        .collect();
    let mut before = before;
    before.sort();
    after.sort();
    assert_eq!(before, after, "the fenced open touched the volume");
    // A keeps leading; its restart (same incarnation) re-opens its epoch.
    append(&mut a, &["c"], 200);
    a.sync_now().unwrap();
    drop(a);
    let a = open_as(fs.clone(), d.path(), 3, A).unwrap();
    let got: Vec<String> = read_all(fs.clone(), &a).into_iter().map(|x| x.1).collect();
    assert_eq!(got, vec!["a", "b", "c"]);
    drop(a);
    // The next epoch, granted to B, takes over normally.
    let b = open_as(fs.clone(), d.path(), 4, B).unwrap();
    assert_eq!(read_all(fs, &b).len(), 3);
}

/// Catches: a leader opening while the next epoch is already claimed (its
/// owner has not written a manifest yet) — it would acknowledge into files
/// the next leader is about to seal.
#[test]
fn a_leader_whose_next_epoch_is_claimed_is_fenced() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    drop(open_as(fs.clone(), d.path(), 2, A).unwrap());
    assert_eq!(claim(&RealFs, d.path(), 3, B).unwrap(), Claimed::Ours);
    assert!(matches!(
        open_as(fs.clone(), d.path(), 2, A),
        Err(LogError::Fenced {
            ours: 2,
            found: 3,
            owner: Some(B)
        })
    ));
    // Once B has opened (its manifest is on disk) the fence still names
    // it, so the controller can release B before granting above.
    drop(open_as(fs.clone(), d.path(), 3, B).unwrap());
    let before = std::fs::read_dir(d.path()).unwrap().count();
    assert!(matches!(
        open_as(fs.clone(), d.path(), 2, A),
        Err(LogError::Fenced {
            ours: 2,
            found: 3,
            owner: Some(B)
        })
    ));
    assert_eq!(
        std::fs::read_dir(d.path()).unwrap().count(),
        before,
        "a leader fenced by a newer manifest claims nothing"
    );
}

/// Lost reply: our exclusive create succeeded but reported EEXIST. The
/// claim is empty — not provably ours — so the open is fenced (the grant
/// moves to the next epoch); nothing is written under the epoch.
#[test]
fn a_lost_reply_to_the_claim_fences_rather_than_guesses() {
    let d = tempfile::tempdir().unwrap();
    let ffs = FaultFs::new();
    ffs.lose_create_reply(1);
    let fs: SharedFs = Arc::new(ffs);
    std::fs::create_dir_all(d.path().join("t")).unwrap();
    let dir = d.path().join("t").join("0");
    assert!(matches!(
        open_as(fs.clone(), &dir, 5, A),
        Err(LogError::Fenced {
            found: 5,
            owner: None,
            ..
        })
    ));
    assert!(!dir.join(super::manifest::manifest_name(5)).exists());
    assert!(open_as(fs, &dir, 6, A).is_ok());
}

/// Crash at every step of a claim (create, write, fsync, directory fsync),
/// then a power cut: whatever is left, at most one leader ever opens the
/// epoch, and the next epoch always opens (the grant converges).
#[test]
fn crash_at_every_step_of_a_leader_epoch_claim() {
    let clean = FaultFs::new();
    {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(claim(&clean, d.path(), 7, A).unwrap(), Claimed::Ours);
    }
    let steps = clean.ops();
    assert!(steps >= 3, "create, write, sync: {:?}", clean.log());
    for n in 1..=steps {
        let d = tempfile::tempdir().unwrap();
        let ffs = FaultFs::new();
        ffs.crash_at(n);
        let res = claim(&ffs, d.path(), 7, A);
        assert!(ffs.crashed(), "step {n} of {steps} did not crash");
        assert!(
            !matches!(res, Ok(Claimed::Ours)),
            "step {n}: a claimant that crashed was told it won"
        );
        ffs.power_loss();
        // A's process is gone; B (a later grant of the same epoch) and C
        // (the next epoch) open with a clean seam.
        let left = d.path().join(claim_name(7)).exists();
        let fs: SharedFs = Arc::new(RealFs);
        match open_as(fs.clone(), d.path(), 7, B) {
            Ok(_) => assert!(!left, "step {n}: B opened over A's claim"),
            Err(LogError::Fenced {
                found: 7, owner, ..
            }) => {
                assert!(left, "step {n}");
                assert!(owner.is_none() || owner == Some(A), "step {n}: {owner:?}");
            }
            Err(e) => panic!("step {n}: {e}"),
        }
        let c = ClaimOwner {
            broker_id: 3,
            incarnation: 33,
        };
        assert!(open_as(fs, d.path(), 8, c).is_ok(), "step {n}: epoch 8");
    }
}

/// Catches: a roll onto a segment file left by an earlier attempt of the
/// same roll truncating it without an fsync — after a power loss the stale
/// bytes come back past what the manifest records. The truncation and its
/// fsync are one step (`create_or_truncate_segment`), shared with recovery.
#[test]
#[allow(clippy::disallowed_methods)] // plants the leftover file behind the seam's back
fn a_roll_onto_a_leftover_segment_fsyncs_the_truncation() {
    let d = tempfile::tempdir().unwrap();
    let ffs = FaultFs::new();
    let fs: SharedFs = Arc::new(ffs.clone());
    let mut log = open(fs.clone(), d.path(), 1);
    append(&mut log, &["a", "b"], 1_000);
    log.sync_now().unwrap();
    let next = log.next_offset();
    let leftover = d.path().join(kaas_volume::layout::segment_log(next, 1));
    std::fs::write(&leftover, b"stale bytes of an earlier attempt").unwrap();
    log.roll(2_000).unwrap();
    assert_eq!(std::fs::metadata(&leftover).unwrap().len(), 0);
    let ops = ffs.log();
    let name = leftover.display().to_string();
    let truncate = ops
        .iter()
        .position(|o| o.contains(": set_len ") && o.ends_with(&name))
        .unwrap_or_else(|| panic!("no truncation: {ops:?}"));
    assert!(
        ops[truncate + 1..]
            .iter()
            .take_while(|o| !o.contains(": sync_dir "))
            .any(|o| o.contains(": sync ") && o.ends_with(&name)),
        "truncation not fsynced before the roll completed: {ops:?}"
    );
    let o = append(&mut log, &["c"], 3_000);
    log.sync_now().unwrap();
    assert_eq!(o, next);
}

/// Catches: DeleteRecords losing the new log start on a crash half-way
/// (manifest written, files not yet unlinked, or the reverse), or a
/// recovery that serves records below a start it had acknowledged.
#[test]
fn crash_at_every_step_of_delete_records() {
    crash_every_step(
        "delete_records",
        |log| {
            log.roll(2_000).unwrap();
            append(log, &["x"], 50_000);
            log.sync_now().unwrap();
            log.roll(3_000).unwrap();
        },
        |log| log.delete_records(12).map(|_| ()),
        |log, got| {
            let start = log.log_start_offset();
            assert!(start == 0 || start == 12, "start {start}");
            assert!(got.iter().all(|(o, _)| *o >= start), "{got:?}");
        },
    );
}

/// Catches: DeleteRecords moving the start without persisting it, dropping
/// a segment that still holds records at or above the new start, lowering
/// the start, or going past the high watermark.
#[test]
fn delete_records_moves_the_start_persists_it_and_drops_whole_segments() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    for i in 0..10 {
        append(&mut log, &[&format!("v{i}")], 1_000 + i);
        log.sync_now().unwrap();
    }
    log.roll(2_000).unwrap();
    for i in 10..20 {
        append(&mut log, &[&format!("v{i}")], 1_000 + i);
        log.sync_now().unwrap();
    }
    // Inside the first segment: nothing removed, start moves.
    assert_eq!(log.delete_records(5).unwrap(), 5);
    let r = PartitionReader::new(fs.read_only(), log.view());
    assert!(matches!(
        r.read(4, 1000),
        Err(super::reader::ReadError::OutOfRange { .. })
    ));
    assert!(r.read(5, 1000).is_ok());
    // Never lowered.
    assert_eq!(log.delete_records(3).unwrap(), 5);
    // At the second segment's base: the first segment goes.
    let logs = |d: &Path| {
        std::fs::read_dir(d)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".log")
            })
            .count()
    };
    let before = logs(d.path());
    assert_eq!(log.delete_records(10).unwrap(), 10);
    assert_eq!(logs(d.path()), before - 1);
    // Clamped to the high watermark.
    assert_eq!(log.delete_records(1_000).unwrap(), 20);
    drop(log);
    let log = open(fs.clone(), d.path(), 2);
    assert_eq!(log.log_start_offset(), 20);
    assert_eq!(read_all(fs, &log), vec![]);
}

// ---- idempotent producers ------------------------------------------------

/// One idempotent batch of `values` from producer `pid` at `epoch`, first
/// sequence `seq`.
pub(crate) fn idem_batch(values: &[&str], pid: i64, epoch: i16, seq: i32) -> Bytes {
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: pid,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: seq.wrapping_add(i as i32),
            timestamp: 1_000 + i as i64,
            key: None,
            value: Some(Bytes::copy_from_slice(v.as_bytes())),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf.freeze()
}

fn idem(
    log: &mut PartitionLog,
    vals: &[&str],
    pid: i64,
    epoch: i16,
    seq: i32,
) -> Result<super::log::Appended, super::log::LogError> {
    let b = idem_batch(vals, pid, epoch, seq);
    let infos = validate_batches(&b).unwrap();
    log.append_at(&b, &infos, 1_000)
}

/// The producer state without the times it was last seen (a rebuild
/// counts a producer as seen when it found it).
fn shape(s: &ProducerStates) -> Vec<(i64, i16, Vec<BatchMeta>)> {
    let mut v: Vec<_> = s
        .entries()
        .map(|(p, e)| (p, e.epoch, e.batches.iter().copied().collect()))
        .collect();
    v.sort_by_key(|x| x.0);
    v
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn snapshot_names(dir: &Path) -> Vec<String> {
    names_in(dir)
        .into_iter()
        .filter(|n| kaas_volume::layout::parse_producer_snapshot(n).is_some())
        .collect()
}

#[test]
fn a_retried_batch_is_a_duplicate_and_gaps_and_stale_epochs_write_nothing() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    let a = idem(&mut log, &["a", "b"], 5, 0, 0).unwrap();
    assert_eq!((a.base_offset, a.duplicate), (0, false));
    append(&mut log, &["plain"], 100);
    let dup = idem(&mut log, &["a", "b"], 5, 0, 0).unwrap();
    assert_eq!(
        (dup.base_offset, dup.last_offset, dup.duplicate),
        (0, 1, true)
    );
    assert_eq!(log.next_offset(), 3, "a duplicate writes nothing");
    assert!(matches!(
        idem(&mut log, &["c"], 5, 0, 3),
        Err(LogError::Sequence(SequenceError::OutOfOrder {
            found: 3,
            last: Some(1),
            ..
        }))
    ));
    assert_eq!(idem(&mut log, &["c"], 5, 1, 0).unwrap().base_offset, 3);
    assert!(matches!(
        idem(&mut log, &["d"], 5, 0, 3),
        Err(LogError::Sequence(SequenceError::StaleEpoch {
            current: 1,
            ..
        }))
    ));
    assert_eq!(log.next_offset(), 4);
    log.sync_now().unwrap();
    let got: Vec<String> = read_all(fs, &log).into_iter().map(|x| x.1).collect();
    assert_eq!(got, ["a", "b", "plain", "c"]);
}

/// Catches: state updated before the write, so a failed write leaves the
/// state claiming a batch the log does not hold (the retry would be
/// answered as a duplicate of nothing).
#[test]
fn a_failed_write_leaves_the_state_unchanged() {
    let d = tempfile::tempdir().unwrap();
    let ffs = FaultFs::new();
    let fs: SharedFs = Arc::new(ffs.clone());
    let mut log = open(fs, d.path(), 1);
    idem(&mut log, &["a"], 5, 0, 0).unwrap();
    let before = shape(log.producers());
    ffs.fail_nth(ffs.ops() + 1);
    assert!(matches!(
        idem(&mut log, &["b"], 5, 0, 1),
        Err(LogError::Io(_))
    ));
    assert_eq!(shape(log.producers()), before);
}

#[test]
fn producer_state_is_rebuilt_from_snapshot_and_tail_on_reopen_and_takeover() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    for i in 0..4 {
        idem(&mut log, &["x", "y"], 7, 0, 2 * i).unwrap();
        idem(&mut log, &["z"], 8, 3, i).unwrap();
    }
    log.sync_now().unwrap();
    let want = shape(log.producers());
    // A crash (no close, no roll, so no snapshot: a new partition writes
    // none at open): the tail is replayed.
    drop(log);
    assert!(snapshot_names(d.path()).is_empty());
    let mut log = open(fs.clone(), d.path(), 1);
    assert_eq!(shape(log.producers()), want);
    assert!(idem(&mut log, &["x", "y"], 7, 0, 6).unwrap().duplicate);
    // A roll snapshots; batches after it are replayed on top at takeover.
    log.roll(2_000).unwrap();
    let at_roll = log.next_offset();
    assert!(snapshot_names(d.path()).contains(&kaas_volume::layout::producer_snapshot(at_roll, 1)));
    idem(&mut log, &["w"], 7, 0, 8).unwrap();
    idem(&mut log, &["q"], 9, 0, 0).unwrap();
    log.sync_now().unwrap();
    let want = shape(log.producers());
    drop(log);
    let mut log = open(fs.clone(), d.path(), 2);
    assert_eq!(shape(log.producers()), want);
    assert!(idem(&mut log, &["w"], 7, 0, 8).unwrap().duplicate);
    assert!(matches!(
        idem(&mut log, &["w"], 7, 0, 10),
        Err(LogError::Sequence(SequenceError::OutOfOrder { .. }))
    ));
    // The takeover wrote a snapshot at its log end (it replayed batches),
    // and a clean close writes one too; at most SNAPSHOTS_KEPT stay.
    log.roll(3_000).unwrap();
    idem(&mut log, &["v"], 9, 0, 1).unwrap();
    log.roll(4_000).unwrap();
    log.close().unwrap();
    assert!(snapshot_names(d.path()).len() <= SNAPSHOTS_KEPT);
    let log = open(fs.clone(), d.path(), 3);
    assert_eq!(log.producers().get(9).unwrap().batches.len(), 2);
}

/// Catches: trusting a snapshot that does not describe the log — past the
/// log end (written before a crash lost the tail it describes), torn, or a
/// zombie's, written under an old epoch after a newer leader sealed it.
#[test]
fn unusable_snapshots_are_ignored_and_swept() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    idem(&mut log, &["a", "b"], 5, 0, 0).unwrap();
    log.sync_now().unwrap();
    drop(log);
    // Epoch 2 takes over at offset 2 and writes on.
    let mut log = open(fs.clone(), d.path(), 2);
    idem(&mut log, &["c", "d", "e"], 5, 0, 2).unwrap();
    log.sync_now().unwrap();
    let want = shape(log.producers());
    drop(log);
    let mut bogus = ProducerStates::new();
    let b = Incoming {
        producer_id: 5,
        epoch: 0,
        first_seq: 2,
        last_offset_delta: 0,
        base_offset: 2,
        timestamp: 0,
        transactional: false,
    };
    if let Verdict::Append(st) = bogus.check(&[b], 0).unwrap() {
        bogus.apply(st);
    }
    let l = kaas_volume::layout::producer_snapshot;
    // A zombie of epoch 1 snapshotting past epoch 2's start (offset 2).
    std::fs::write(d.path().join(l(3, 1)), bogus.encode(3)).unwrap();
    // Past the log end.
    std::fs::write(d.path().join(l(50, 2)), bogus.encode(50)).unwrap();
    // Torn.
    let torn = bogus.encode(4);
    std::fs::write(d.path().join(l(4, 2)), &torn[..torn.len() - 3]).unwrap();
    // A later epoch's file is never ours to judge or remove.
    std::fs::write(d.path().join(l(1, 9)), b"not ours").unwrap();
    let log = open(fs.clone(), d.path(), 3);
    assert_eq!(shape(log.producers()), want);
    let left = snapshot_names(d.path());
    for gone in [l(3, 1), l(50, 2), l(4, 2)] {
        assert!(!left.contains(&gone), "{gone} left: {left:?}");
    }
    assert!(left.contains(&l(1, 9)));
}

/// Catches: a snapshot write that can leave a torn or half-renamed file
/// the next open trusts, or a crash that loses producer state: after a
/// crash (and power loss) at every step of a roll's snapshot, a clean open
/// rebuilds exactly the state the log holds.
#[test]
fn crash_at_every_step_of_the_producer_snapshot() {
    let setup = |log: &mut PartitionLog| {
        for i in 0..3 {
            idem(log, &["x"], 7, 0, i).unwrap();
            idem(log, &["y", "z"], 8, 1, 2 * i).unwrap();
            log.sync_now().unwrap();
        }
        // An earlier snapshot exists, so pruning is exercised too.
        log.roll(1_500).unwrap();
        idem(log, &["w"], 9, 0, 0).unwrap();
        log.sync_now().unwrap();
        for i in 0..SNAPSHOTS_KEPT {
            log.snapshot_producers(1_600 + i as i64).unwrap();
            idem(log, &["u"], 9, 0, 1 + i as i32).unwrap();
            log.sync_now().unwrap();
        }
    };
    let d = tempfile::tempdir().unwrap();
    let clean = FaultFs::new();
    let fs: SharedFs = Arc::new(clean.clone());
    let mut log = open(fs.clone(), d.path(), 1);
    setup(&mut log);
    let want = shape(log.producers());
    let before = clean.ops();
    log.snapshot_producers(2_000).unwrap();
    let steps = clean.ops() - before;
    assert!(
        steps >= 4,
        "temp create, write, fsync, rename (+ dir fsync)"
    );
    for n in 1..=steps + 1 {
        let d = tempfile::tempdir().unwrap();
        let ffs = FaultFs::new();
        let fs: SharedFs = Arc::new(ffs.clone());
        let mut log = open(fs.clone(), d.path(), 1);
        setup(&mut log);
        ffs.crash_at(ffs.ops() + n);
        let _ = log.snapshot_producers(2_000);
        drop(log);
        ffs.power_loss();
        let rfs: SharedFs = Arc::new(RealFs);
        let mut log = PartitionLog::open(rfs.clone(), d.path(), 1, cfg(), 3_000)
            .unwrap_or_else(|e| panic!("crash at step {n}: reopen failed: {e}"));
        assert_eq!(shape(log.producers()), want, "crash at step {n}");
        assert!(
            idem(&mut log, &["u"], 9, 0, SNAPSHOTS_KEPT as i32)
                .unwrap()
                .duplicate,
            "step {n}: the last batch is still known"
        );
        drop(log);
        // And again after a takeover.
        let log = PartitionLog::open(rfs, d.path(), 2, cfg(), 4_000).unwrap();
        assert_eq!(shape(log.producers()), want, "takeover after step {n}");
        let names = names_in(d.path());
        assert!(
            !names.iter().any(|n| n.starts_with(".tmp-")),
            "step {n}: temp left: {names:?}"
        );
        assert!(
            snapshot_names(d.path()).len() <= SNAPSHOTS_KEPT,
            "{names:?}"
        );
    }
}

/// Catches: a rebuild that scans the whole log when no snapshot is left
/// (unbounded recovery): without snapshots only the last two segments are
/// replayed, as Kafka does.
#[test]
fn without_snapshots_only_the_last_two_segments_are_replayed() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    idem(&mut log, &["old"], 1, 0, 0).unwrap();
    log.roll(1_100).unwrap();
    idem(&mut log, &["mid"], 2, 0, 0).unwrap();
    log.roll(1_200).unwrap();
    idem(&mut log, &["new"], 3, 0, 0).unwrap();
    log.sync_now().unwrap();
    drop(log);
    for n in snapshot_names(d.path()) {
        std::fs::remove_file(d.path().join(n)).unwrap();
    }
    let log = open(fs, d.path(), 1);
    let ids: Vec<i64> = shape(log.producers()).iter().map(|x| x.0).collect();
    assert_eq!(ids, [2, 3]);
    // ... once: the open wrote a snapshot at the log end.
    assert_eq!(
        snapshot_names(d.path()),
        [kaas_volume::layout::producer_snapshot(log.next_offset(), 1)]
    );
}

/// A host whose view of a partition directory lags: its listing still
/// shows `manifest-e<old>` where the volume now holds `manifest-e<new>`
/// (the newer leader removed the old one), and a negative lookup entry
/// hides the new one from an open by name — an NFS client's cached
/// listing plus a cached "no such file".
struct LaggingView {
    inner: RealFs,
    old: String,
    new: String,
    on: std::sync::atomic::AtomicBool,
}

impl LaggingView {
    fn lagging(&self) -> bool {
        self.on.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl kaas_volume::fs::Fs for LaggingView {
    fn open_read(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::ReadFile>> {
        if self.lagging() && p.file_name().is_some_and(|n| n == self.new.as_str()) {
            return Err(std::io::ErrorKind::NotFound.into());
        }
        self.inner.open_read(p)
    }
    fn create_exclusive(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::WriteFile>> {
        self.inner.create_exclusive(p)
    }
    fn open_write(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::WriteFile>> {
        self.inner.open_write(p)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, p: &Path) -> std::io::Result<()> {
        self.inner.remove_file(p)
    }
    fn create_dir_all(&self, p: &Path) -> std::io::Result<()> {
        self.inner.create_dir_all(p)
    }
    fn create_dir(&self, p: &Path) -> std::io::Result<()> {
        self.inner.create_dir(p)
    }
    fn remove_dir(&self, p: &Path) -> std::io::Result<()> {
        self.inner.remove_dir(p)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        let names = self.inner.list(dir)?;
        if !self.lagging() {
            return Ok(names);
        }
        Ok(names
            .into_iter()
            .map(|n| if n == self.new { self.old.clone() } else { n })
            .collect())
    }
    fn is_dir(&self, p: &Path) -> bool {
        self.inner.is_dir(p)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

/// A host that cannot see topic directory `hidden`: a lookup says it is
/// not a directory and a listing of it fails with `list_errno` (ENOENT: a
/// cached "no such file"; ESTALE: a cached handle of the directory the
/// name had before; EIO: a volume cut off), or succeeds (0).
struct HiddenTopicDir {
    inner: RealFs,
    hidden: std::path::PathBuf,
    list_errno: i32,
}

impl kaas_volume::fs::Fs for HiddenTopicDir {
    fn open_read(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::ReadFile>> {
        self.inner.open_read(p)
    }
    fn create_exclusive(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::WriteFile>> {
        self.inner.create_exclusive(p)
    }
    fn open_write(&self, p: &Path) -> std::io::Result<Arc<dyn kaas_volume::fs::WriteFile>> {
        self.inner.open_write(p)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, p: &Path) -> std::io::Result<()> {
        self.inner.remove_file(p)
    }
    fn create_dir_all(&self, p: &Path) -> std::io::Result<()> {
        self.inner.create_dir_all(p)
    }
    fn create_dir(&self, p: &Path) -> std::io::Result<()> {
        self.inner.create_dir(p)
    }
    fn remove_dir(&self, p: &Path) -> std::io::Result<()> {
        self.inner.remove_dir(p)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        if dir == self.hidden && self.list_errno != 0 {
            return Err(std::io::Error::from_raw_os_error(self.list_errno));
        }
        self.inner.list(dir)
    }
    fn is_dir(&self, p: &Path) -> bool {
        p != self.hidden && self.inner.is_dir(p)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

/// Catches: a partition open that could not see its topic directory
/// reported "topic directory … does not exist" as a storage failure (ERROR,
/// a backoff growing to 6.4 s) whatever the cause — also while the volume
/// answered EIO, telling the on-call engineer the topic was gone. Now an
/// unseen directory is `TopicDirMissing` (re-driven like a stale view) and
/// a failing volume is the I/O error it is; nothing is created either way.
#[test]
fn an_unseen_topic_directory_is_missing_and_a_failing_volume_is_an_io_error() {
    let d = tempfile::tempdir().unwrap();
    let topic = d.path().join("t");
    std::fs::create_dir(&topic).unwrap();
    let open_with = |list_errno: i32| {
        let fs: SharedFs = Arc::new(HiddenTopicDir {
            inner: RealFs,
            hidden: topic.clone(),
            list_errno,
        });
        PartitionLog::open(fs, &topic.join("0"), 1, cfg(), 1_000)
    };
    for errno in [0, libc::ENOENT, libc::ESTALE] {
        match open_with(errno) {
            Err(LogError::TopicDirMissing { path }) => assert_eq!(path, topic),
            Err(e) => panic!("errno {errno}: want TopicDirMissing, got {e}"),
            Ok(_) => panic!("errno {errno}: opened under a directory it cannot see"),
        }
    }
    match open_with(libc::EIO) {
        Err(LogError::Io(e)) => {
            let eio = std::io::Error::from_raw_os_error(libc::EIO).to_string();
            assert!(e.to_string().contains(&eio), "{e}");
        }
        Err(e) => panic!("want the volume's EIO, got {e}"),
        Ok(_) => panic!("opened through a failing volume"),
    }
    assert!(
        !topic.join("0").exists(),
        "a partition directory was created"
    );
}

/// A takeover whose listing names a manifest that is gone (a stale view)
/// neither fails as a storage error nor opens from the old manifest: it is
/// refused as `StaleView`, writes nothing, and the re-drive, once the view
/// catches up, opens from the newest manifest with every record.
#[test]
fn takeover_through_a_stale_directory_view_is_refused_then_redriven() {
    let d = tempfile::tempdir().unwrap();
    let real: SharedFs = Arc::new(RealFs);
    let mut log = open(real.clone(), d.path(), 2);
    append(&mut log, &["a"], 100);
    log.sync_now().unwrap();
    drop(log);
    let mut log = open(real.clone(), d.path(), 3);
    append(&mut log, &["b"], 200);
    log.sync_now().unwrap();
    drop(log);
    let names = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert!(!d.path().join("manifest-e2.json").exists());
    let view = Arc::new(LaggingView {
        inner: RealFs,
        old: "manifest-e2.json".into(),
        new: "manifest-e3.json".into(),
        on: true.into(),
    });
    let fs: SharedFs = view.clone();
    let before = names(d.path());
    match PartitionLog::open(fs.clone(), d.path(), 4, cfg(), 1_000) {
        Err(LogError::StaleView { path }) => assert!(path.ends_with("manifest-e2.json")),
        Err(e) => panic!("want StaleView, got {e}"),
        Ok(_) => panic!("opened from a stale view"),
    }
    // Nothing written by the refused open but the epoch claim.
    let after: Vec<String> = names(d.path())
        .into_iter()
        .filter(|n| !n.ends_with(".claim"))
        .collect();
    let before: Vec<String> = before
        .into_iter()
        .filter(|n| !n.ends_with(".claim"))
        .collect();
    assert_eq!(before, after);
    view.on.store(false, std::sync::atomic::Ordering::SeqCst);
    let log = PartitionLog::open(fs.clone(), d.path(), 4, cfg(), 1_000).unwrap();
    assert_eq!(log.next_offset(), 2);
    let got: Vec<String> = read_all(real, &log).into_iter().map(|(_, v)| v).collect();
    assert_eq!(got, vec!["a".to_string(), "b".to_string()]);
}

// ---------------------------------------------------------------------------
// Transactions: last stable offset, markers, the aborted-transaction index.
// ---------------------------------------------------------------------------

/// One transactional batch of `values` from producer `pid` at `epoch`.
pub(crate) fn txn_batch(values: &[&str], pid: i64, epoch: i16, seq: i32) -> Bytes {
    let mut b = BytesMut::new();
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: true,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: pid,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: seq.wrapping_add(i as i32),
            timestamp: 1_000 + i as i64,
            key: None,
            value: Some(Bytes::copy_from_slice(v.as_bytes())),
            headers: Default::default(),
        })
        .collect();
    RecordBatchEncoder::encode(
        &mut b,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    b.freeze()
}

fn txn(log: &mut PartitionLog, vals: &[&str], pid: i64, seq: i32) -> i64 {
    let b = txn_batch(vals, pid, 0, seq);
    let infos = validate_batches(&b).unwrap();
    log.append_at(&b, &infos, 1_000).unwrap().base_offset
}

fn marker(log: &mut PartitionLog, pid: i64, commit: bool) -> i64 {
    log.append_marker(pid, 0, 3, commit, 1_000)
        .unwrap()
        .base_offset
}

fn reader(log: &PartitionLog) -> PartitionReader {
    let fs: SharedFs = Arc::new(RealFs);
    PartitionReader::new(fs.read_only(), log.view())
}

/// Offsets of the data records a read_committed consumer keeps from
/// `offset` on: the batches up to the LSO, minus control batches and the
/// records of the aborted transactions listed (as Kafka's consumer does).
fn committed_from(log: &PartitionLog, offset: i64) -> Vec<i64> {
    let r = reader(log);
    let res = r.read_committed(offset, 1 << 20).unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    let aborted = res.aborted.clone();
    let mut open_aborts: Vec<i64> = Vec::new();
    while let Some(h) = res.records.get(pos..).and_then(read_batch_header) {
        for (pid, first) in &aborted {
            if *first <= h.base_offset && !open_aborts.contains(pid) {
                open_aborts.push(*pid);
            }
        }
        if h.is_control() {
            open_aborts.retain(|p| *p != h.producer_id);
        } else if !(h.is_transactional() && open_aborts.contains(&h.producer_id)) {
            out.extend(h.base_offset..=h.last_offset());
        }
        pos += h.batch_len;
    }
    out
}

/// Catches: an LSO that ignores open transactions (read_committed would
/// serve uncommitted records), one that moves before the marker is durable,
/// or a marker that does not release it.
#[test]
fn the_last_stable_offset_is_held_by_an_open_transaction_until_its_marker_is_durable() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    append(&mut log, &["a", "b"], 100);
    let t0 = txn(&mut log, &["t1", "t2"], 7, 0);
    assert_eq!(t0, 2);
    append(&mut log, &["c"], 100);
    log.sync_now().unwrap();
    assert_eq!((log.high_watermark(), log.last_stable_offset()), (5, 2));
    let r = reader(&log);
    assert_eq!(r.last_stable_offset(), 2);
    // read_committed stops at the LSO; read_uncommitted does not.
    assert_eq!(committed_from(&log, 0), [0, 1]);
    assert!(r.read_committed(2, 1 << 20).unwrap().records.is_empty());
    assert!(!r.read(2, 1 << 20).unwrap().records.is_empty());
    let m = marker(&mut log, 7, true);
    assert_eq!(m, 5);
    assert_eq!(log.last_stable_offset(), 2, "not durable yet");
    log.sync_now().unwrap();
    assert_eq!(log.last_stable_offset(), 6);
    assert_eq!(committed_from(&log, 0), [0, 1, 2, 3, 4]);
    // The earliest of several open transactions holds it.
    let a = txn(&mut log, &["x"], 8, 0);
    let _b = txn(&mut log, &["y"], 9, 0);
    log.sync_now().unwrap();
    assert_eq!(log.last_stable_offset(), a);
    marker(&mut log, 9, false);
    log.sync_now().unwrap();
    assert_eq!(log.last_stable_offset(), a, "8 still open");
    marker(&mut log, 8, true);
    log.sync_now().unwrap();
    assert_eq!(log.last_stable_offset(), log.high_watermark());
}

/// Catches: aborted transactions missing from a read_committed answer (the
/// consumer would deliver aborted records), listed when they do not overlap
/// the range, or a re-sent marker that re-aborts or duplicates.
#[test]
fn read_committed_lists_the_aborted_transactions_and_markers_are_idempotent() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    let a = txn(&mut log, &["a1", "a2"], 1, 0); // 0..=1, aborted
    let c = txn(&mut log, &["c1"], 2, 0); // 2, committed
    append(&mut log, &["plain"], 100); // 3
    txn(&mut log, &["a3"], 1, 2); // 4, aborted too
    let abort_at = marker(&mut log, 1, false); // 5
    marker(&mut log, 2, true); // 6
                               // Re-sent markers: written, but close nothing.
    marker(&mut log, 1, false); // 7
    marker(&mut log, 2, true); // 8
    log.sync_now().unwrap();
    assert_eq!((a, c, abort_at), (0, 2, 5));
    assert_eq!(log.last_stable_offset(), log.high_watermark());
    let r = reader(&log);
    let res = r.read_committed(0, 1 << 20).unwrap();
    assert_eq!(res.aborted, [(1, 0)], "exactly one aborted transaction");
    assert_eq!(committed_from(&log, 0), [2, 3]);
    // Read from past the abort marker: nothing aborted overlaps.
    assert!(r.read_committed(6, 1 << 20).unwrap().aborted.is_empty());
    // Read from inside it: still listed.
    assert_eq!(r.read_committed(4, 1 << 20).unwrap().aborted, [(1, 0)]);
    // read_uncommitted lists nothing and serves everything.
    assert!(r.read(0, 1 << 20).unwrap().aborted.is_empty());
    // A stale epoch's marker is refused and writes nothing.
    let before = log.next_offset();
    assert!(matches!(
        log.append_marker(1, -1, 3, true, 1_000),
        Err(LogError::Sequence(SequenceError::StaleEpoch { .. }))
    ));
    assert_eq!(log.next_offset(), before);
}

/// Catches: an open transaction forgotten at takeover (the LSO would jump
/// past uncommitted records), or its aborted index lost with the segment
/// that held it (sealed by the takeover, so written by nobody).
#[test]
fn a_takeover_keeps_open_transactions_and_rebuilds_the_aborted_index() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    append(&mut log, &["p"], 100);
    txn(&mut log, &["a"], 1, 0); // 1, will abort
    marker(&mut log, 1, false); // 2
    log.roll(1_500).unwrap(); // snapshot at 3; segment 0 gets a txnindex
    assert!(names_in(d.path()).contains(&kaas_volume::layout::segment_txnindex(0, 1)));
    txn(&mut log, &["b"], 2, 0); // 3, will abort after takeover
    txn(&mut log, &["o"], 3, 0); // 4, stays open
    txn(&mut log, &["x"], 4, 0); // 5
    marker(&mut log, 4, false); // 6: aborted in the active segment
    log.sync_now().unwrap();
    assert_eq!(log.last_stable_offset(), 3);
    drop(log); // kill -9: no close, no snapshot of the tail
    let mut log = open(fs.clone(), d.path(), 2);
    assert_eq!(log.last_stable_offset(), 3, "open transactions survive");
    assert_eq!(
        log.producers().get(3).unwrap().txn_first_offset,
        Some(4),
        "rebuilt from snapshot + tail"
    );
    marker(&mut log, 2, false);
    log.sync_now().unwrap();
    assert_eq!(log.last_stable_offset(), 4);
    marker(&mut log, 3, true);
    log.sync_now().unwrap();
    assert_eq!(log.last_stable_offset(), log.high_watermark());
    // Every aborted transaction is known: segment 0 from its file, the
    // segment sealed at takeover from its own bytes, the active one live.
    let res = reader(&log).read_committed(0, 1 << 20).unwrap();
    assert_eq!(res.aborted, [(1, 1)]);
    let all: Vec<(i64, i64)> = {
        let r = reader(&log);
        let mut v = Vec::new();
        let mut off = 0;
        while off < log.high_watermark() {
            let res = r.read_committed(off, 1 << 20).unwrap();
            v.extend(res.aborted.iter().copied());
            let mut pos = 0;
            while let Some(h) = res.records.get(pos..).and_then(read_batch_header) {
                off = h.last_offset() + 1;
                pos += h.batch_len;
            }
            if pos == 0 {
                break;
            }
        }
        v.sort();
        v.dedup();
        v
    };
    assert_eq!(all, [(1, 1), (2, 3), (4, 5)]);
    let mut got = Vec::new();
    let mut off = 0;
    while off < log.high_watermark() {
        let c = committed_from(&log, off);
        let res = reader(&log).read_committed(off, 1 << 20).unwrap();
        let mut pos = 0;
        while let Some(h) = res.records.get(pos..).and_then(read_batch_header) {
            off = h.last_offset() + 1;
            pos += h.batch_len;
        }
        got.extend(c);
        if pos == 0 {
            break;
        }
    }
    assert_eq!(got, [0, 4], "the plain record and the committed one");
}

/// Catches: a stale `.txnindex` trusted (a roll that crashed after writing
/// it, then more appends to the same segment), or retention leaving index
/// files behind its segments.
#[test]
fn a_stale_txnindex_is_ignored_and_retention_removes_it() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    txn(&mut log, &["a"], 1, 0);
    marker(&mut log, 1, false);
    txn(&mut log, &["b"], 2, 0);
    marker(&mut log, 2, false);
    log.sync_now().unwrap();
    // A file describing only the first abort, as of offset 2.
    let stale = super::txn_index::encode(
        &[super::txn_index::AbortedTxn {
            producer_id: 1,
            first_offset: 0,
            last_offset: 1,
        }],
        2,
    );
    drop(log);
    let name = kaas_volume::layout::segment_txnindex(0, 1);
    std::fs::write(d.path().join(&name), stale).unwrap();
    let mut log = open(fs.clone(), d.path(), 2); // seals segment 0 at 4
    let res = reader(&log).read_committed(0, 1 << 20).unwrap();
    assert_eq!(res.aborted, [(1, 0), (2, 2)]);
    append(&mut log, &["z"], 100);
    log.sync_now().unwrap();
    log.roll(2_000).unwrap();
    log.delete_records(log.high_watermark()).unwrap();
    assert!(
        !names_in(d.path()).iter().any(|n| n.ends_with(".txnindex")),
        "{:?}",
        names_in(d.path())
    );
}

/// Crash (and power loss) at every step of writing a marker and of the
/// roll that writes its segment's `.txnindex`: after recovery the
/// transaction is either still open (marker lost, never acknowledged) or
/// closed and, if aborted, listed — never half of it.
#[test]
fn crash_at_every_step_of_the_marker_and_the_aborted_index() {
    for roll in [false, true] {
        let setup = |log: &mut PartitionLog| {
            append(log, &["p"], 100);
            txn(log, &["a", "b"], 1, 0);
            log.sync_now().unwrap();
        };
        let op = |log: &mut PartitionLog| -> Result<(), LogError> {
            log.append_marker(1, 0, 3, false, 1_000)?;
            log.sync_now()?;
            if roll {
                log.roll(2_000)?;
            }
            Ok(())
        };
        let d = tempfile::tempdir().unwrap();
        let clean = FaultFs::new();
        let fs: SharedFs = Arc::new(clean.clone());
        let mut log = open(fs.clone(), d.path(), 1);
        setup(&mut log);
        let before = clean.ops();
        op(&mut log).unwrap();
        let steps = clean.ops() - before;
        assert!(steps >= 2);
        for n in 1..=steps + 1 {
            let d = tempfile::tempdir().unwrap();
            let ffs = FaultFs::new();
            let fs: SharedFs = Arc::new(ffs.clone());
            let mut log = open(fs.clone(), d.path(), 1);
            setup(&mut log);
            ffs.crash_at(ffs.ops() + n);
            let acked = op(&mut log).is_ok();
            drop(log);
            ffs.power_loss();
            let rfs: SharedFs = Arc::new(RealFs);
            for epoch in [1, 2] {
                let log = PartitionLog::open(rfs.clone(), d.path(), epoch, cfg(), 3_000)
                    .unwrap_or_else(|e| panic!("roll {roll} step {n}: reopen: {e}"));
                let open_txn = log.producers().get(1).unwrap().txn_first_offset;
                let res = reader(&log).read_committed(0, 1 << 20).unwrap();
                match open_txn {
                    Some(first) => {
                        assert!(!acked, "roll {roll} step {n}: acked marker lost");
                        assert_eq!(first, 1);
                        assert_eq!(log.last_stable_offset(), 1);
                        assert!(res.aborted.is_empty());
                    }
                    None => {
                        assert_eq!(log.last_stable_offset(), log.high_watermark());
                        assert_eq!(res.aborted, [(1, 1)], "roll {roll} step {n}");
                        assert_eq!(committed_from(&log, 0), [0]);
                    }
                }
                let names = names_in(d.path());
                assert!(
                    !names.iter().any(|x| x.starts_with(".tmp-")),
                    "step {n}: {names:?}"
                );
            }
        }
    }
}

/// Catches: a read_committed fetch that walks segments which cannot hold a
/// marker (librdkafka consumers are read_committed by default: on a topic
/// without transactions that would be a walk of the whole log), or a roll
/// that writes an index for them.
#[test]
fn segments_without_markers_have_no_aborted_index_to_read() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    append(&mut log, &["a"], 100);
    log.sync_now().unwrap();
    log.roll(2_000).unwrap();
    append(&mut log, &["b"], 100);
    log.sync_now().unwrap();
    assert!(!names_in(d.path()).iter().any(|n| n.ends_with(".txnindex")));
    drop(log);
    // The segment's file is unreadable as a log: any walk of it would fail.
    let seg0 = d.path().join(kaas_volume::layout::segment_log(0, 1));
    let log = open(fs.clone(), d.path(), 2);
    let keep = std::fs::read(&seg0).unwrap();
    std::fs::write(&seg0, vec![0xffu8; keep.len()]).unwrap();
    let view = log.view();
    let segs = view.read().unwrap().segments.clone();
    assert!(!segs[0].markers());
    assert_eq!(segs[0].aborted_txns(&fs.read_only()).unwrap(), []);
    std::fs::write(&seg0, keep).unwrap();
    // A marker sets the flag, in memory and, at the next checkpoint, in the
    // manifest; recovery's walk sets it too.
    let mut log = log;
    txn(&mut log, &["t"], 1, 0);
    marker(&mut log, 1, false);
    log.sync_now().unwrap();
    drop(log);
    let log = open(fs.clone(), d.path(), 3);
    let segs = log.view().read().unwrap().segments.clone();
    assert!(segs[segs.len() - 2].markers(), "found by recovery's walk");
    assert!(!segs[0].markers());
}

/// Catches: a marker undone by a full volume's rewind (its fsync failed)
/// still counted: the transaction must be open again, the LSO held and the
/// abort unlisted, so the coordinator's re-sent marker is what closes it.
#[test]
fn a_rewind_reopens_the_transaction_its_marker_closed() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    txn(&mut log, &["a"], 1, 0);
    log.sync_now().unwrap();
    marker(&mut log, 1, false);
    log.rewind_to_durable().unwrap();
    assert_eq!(log.producers().get(1).unwrap().txn_first_offset, Some(0));
    log.sync_now().unwrap();
    assert_eq!(log.last_stable_offset(), 0);
    assert!(reader(&log)
        .read_committed(0, 1 << 20)
        .unwrap()
        .aborted
        .is_empty());
    marker(&mut log, 1, false);
    log.sync_now().unwrap();
    assert_eq!(log.last_stable_offset(), 2);
    assert_eq!(
        reader(&log).read_committed(0, 1 << 20).unwrap().aborted,
        [(1, 0)]
    );
}

#[test]
fn an_idle_log_closes_its_files_and_reopens_them_without_recovery() {
    let d = tempfile::tempdir().unwrap();
    let ffs = FaultFs::new();
    let fs: SharedFs = Arc::new(ffs.clone());
    let mut log = open(fs.clone(), d.path(), 1);
    append(&mut log, &["a", "b"], 100);
    log.sync_now().unwrap();
    assert_eq!(read_all(fs.clone(), &log).len(), 2);
    // Written but not fsynced: the write handle is never closed.
    append(&mut log, &["c"], 200);
    log.close_idle_files();
    assert!(log.active_open(), "a dirty active segment stays open");
    log.sync_now().unwrap();
    assert!(log.close_idle_files() >= 1, "the writer closes once clean");
    assert!(!log.active_open());
    // A reader reopens on demand; so does the next append, and nothing of
    // recovery runs again (no manifest, no seal, no truncation): only the
    // append's write and fsync touch the volume.
    assert_eq!(read_all(fs.clone(), &log).len(), 3);
    let before = ffs.log().len();
    append(&mut log, &["d"], 300);
    log.sync_now().unwrap();
    assert!(log.active_open());
    let ops: Vec<String> = ffs.log()[before..].to_vec();
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert!(
        ops[0].contains("write") && ops[1].contains("sync"),
        "{ops:?}"
    );
    assert_eq!(
        read_all(fs.clone(), &log),
        vec![
            (0, "a".into()),
            (1, "b".into()),
            (2, "c".into()),
            (3, "d".into())
        ]
    );
    // What was acknowledged through the reopened handle survives a power
    // loss, and a reopen of the log finds all of it.
    drop(log);
    ffs.power_loss();
    let log = open(Arc::new(RealFs), d.path(), 1);
    assert_eq!(read_all(Arc::new(RealFs), &log).len(), 4);
}

#[test]
fn a_segment_replaced_under_its_name_while_closed_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let mut log = open(fs.clone(), d.path(), 1);
    append(&mut log, &["a", "b"], 100);
    log.sync_now().unwrap();
    log.close_idle_files();
    // Another file now holds the name (shorter than what was durable).
    let seg = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "log"))
        .unwrap();
    std::fs::write(&seg, b"").unwrap();
    let b = batch(&["c"], 200);
    let infos = validate_batches(&b).unwrap();
    assert!(log.append(&b, &infos).is_err());
}

/// Catches: a partition open claiming an epoch in a data directory whose
/// stamp names another cluster (or none): the second-cluster-over-one-volume
/// data loss at the partition. Refused before the claim, nothing written.
#[test]
fn an_open_in_a_data_directory_bound_to_another_cluster_claims_nothing() {
    use kaas_volume::binding::{Binding, DataStamp};
    use kaas_volume::identity::Identity;
    let d = tempfile::tempdir().unwrap();
    let data = d.path();
    let dir = data.join("t").join("0");
    std::fs::create_dir_all(data.join("t")).unwrap();
    let stamp = data.join(kaas_volume::layout::DATA_STAMP);
    let ours = Arc::new(Binding {
        cluster_id: "ours".into(),
        stamp: stamp.clone(),
    });
    let open = |binding| {
        PartitionLog::open_as(
            Arc::new(RealFs),
            &dir,
            1,
            Claimant {
                owner: Some(A),
                guard: None,
                binding: Some(binding),
            },
            cfg(),
            1_000,
            None,
        )
    };
    for (content, want) in [(None, "none"), (Some("theirs"), "theirs")] {
        if let Some(id) = content {
            let s = DataStamp {
                cluster_id: id.to_owned(),
            };
            std::fs::write(&stamp, s.encode()).unwrap();
        }
        match open(ours.clone()) {
            Err(LogError::ForeignVolume { found, ours, .. }) => {
                assert_eq!((found.as_str(), ours.as_str()), (want, "ours"))
            }
            Err(e) => panic!("want ForeignVolume, got {e}"),
            Ok(_) => panic!("want ForeignVolume, got an open log"),
        }
        assert!(
            !dir.join(claim_name(1)).exists(),
            "nothing claimed in a foreign volume"
        );
    }
    let s = DataStamp {
        cluster_id: "ours".into(),
    };
    std::fs::write(&stamp, s.encode()).unwrap();
    assert!(open(ours).is_ok(), "our own stamp opens");
}

/// Catches: a grant that skips an epoch (epoch 3 after a leader of epoch 1)
/// opening the log while the old leader's successor probe, which looks
/// only at the next epoch's claim, sees nothing and goes on acknowledging
/// records the new leader's recovery never read.
#[test]
fn an_open_that_skips_epochs_claims_the_epoch_after_the_newest_manifest() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("t").join("0");
    std::fs::create_dir_all(d.path().join("t")).unwrap();
    let fs: SharedFs = Arc::new(RealFs);
    let _old = open_as(fs.clone(), &dir, 1, A).unwrap();
    assert!(!dir.join(claim_name(2)).exists());
    let _new = open_as(fs, &dir, 3, B).unwrap();
    assert!(
        dir.join(claim_name(2)).exists(),
        "epoch 2 left unclaimed: the leader of epoch 1 would never see its successor"
    );
}
