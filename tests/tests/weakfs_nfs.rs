//! The NFS client behaviours of the `weakfs` test filesystem do what they
//! claim, so a broker test that passes on a weakfs mount means something.
//! Two mounts of one backing directory stand for two NFS clients ("hosts").
//!
//! If no FUSE mount can be made here, each test prints why and is skipped —
//! it never passes without checking.

#![allow(clippy::disallowed_methods)] // tests build fixtures and simulate other hosts with raw std::fs calls

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use weakfs::Behaviours;

/// Caches must stay stale for the whole "still stale" check, even on a slow
/// CI machine; the check itself takes microseconds.
const TTL: Duration = Duration::from_secs(3);

/// Linux errno values.
const EIO: i32 = 5;
const ENOTEMPTY: i32 = 39;
const ESTALE: i32 = 116;

struct Host {
    mounted: Option<weakfs::Mounted>,
    _mnt_dir: tempfile::TempDir,
}

impl Host {
    fn path(&self) -> &Path {
        self.mounted.as_ref().expect("mounted").mountpoint()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(m) = self.mounted.take() {
            if let Err(e) = m.unmount() {
                eprintln!("weakfs unmount: {e}");
            }
        }
    }
}

fn env_tmp() -> PathBuf {
    std::env::var_os("KAAS_TEST_DISK_TMP")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// A mount of `backing`, or `None` (with the reason printed).
fn host(backing: &Path, behaviours: Behaviours) -> Option<Host> {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIPPED: /dev/fuse does not exist, cannot build a FUSE mount");
        return None;
    }
    let mnt_dir = tempfile::tempdir_in(env_tmp()).expect("mount dir");
    match weakfs::mount_background(backing, mnt_dir.path(), behaviours) {
        Ok(m) => Some(Host {
            mounted: Some(m),
            _mnt_dir: mnt_dir,
        }),
        Err(e) => {
            eprintln!(
                "SKIPPED: cannot mount weakfs here: {e} (needs /dev/fuse and fusermount3 or root)"
            );
            None
        }
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn nfs() -> Behaviours {
    Behaviours {
        lost_reply_prob: 0.0,
        attr_ttl: TTL,
        ..Behaviours::nfs(1)
    }
}

#[test]
fn silly_rename_keeps_an_open_file_and_its_directory_busy() {
    let backing = tempfile::tempdir_in(env_tmp()).expect("backing");
    let Some(a) = host(backing.path(), nfs()) else {
        return;
    };
    let dir = a.path().join("d");
    fs::create_dir(&dir).expect("mkdir");
    fs::write(dir.join("f"), b"kept").expect("write");
    let mut held = File::open(dir.join("f")).expect("open");
    fs::remove_file(dir.join("f")).expect("unlink");
    let left = names(&dir);
    assert!(
        left.len() == 1 && left[0].starts_with(".nfs"),
        "expected one .nfsXXXX file, got {left:?}"
    );
    let err = fs::remove_dir(&dir).expect_err("rmdir of a dir holding a silly-renamed file");
    assert_eq!(err.raw_os_error(), Some(ENOTEMPTY), "{err}");
    let mut buf = String::new();
    held.read_to_string(&mut buf).expect("read after unlink");
    assert_eq!(buf, "kept");
    drop(held);
    // FUSE sends RELEASE after close(2) has returned, and the NFS client's
    // silly delete at last close is asynchronous too (`nfs_async_unlink`):
    // the name goes soon after the close, not during it. Wait, bounded.
    let closed_at = Instant::now();
    let mut left = names(&dir);
    while !left.is_empty() && closed_at.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
        left = names(&dir);
    }
    assert!(
        left.is_empty(),
        "silly-renamed file not removed within 5 s of the last close: {left:?}"
    );
    fs::remove_dir(&dir).expect("rmdir after close");
}

#[test]
fn another_hosts_changes_show_late_in_listings_and_lookups_but_open_revalidates() {
    let backing = tempfile::tempdir_in(env_tmp()).expect("backing");
    let (Some(a), Some(b)) = (host(backing.path(), nfs()), host(backing.path(), nfs())) else {
        return;
    };
    fs::write(a.path().join("f"), b"v1").expect("write v1");
    // B caches: a listing, a positive lookup of f, a negative one of x.
    assert_eq!(names(b.path()), ["f"]);
    assert_eq!(fs::read(b.path().join("f")).expect("read f"), b"v1");
    assert_eq!(
        fs::metadata(b.path().join("x")).map_err(|e| e.kind()).err(),
        Some(ErrorKind::NotFound)
    );
    let cached_at = Instant::now();

    // A creates x and replaces f (temp + rename).
    fs::write(a.path().join("x"), b"new").expect("write x");
    fs::write(a.path().join(".tmp-f"), b"v2").expect("write tmp");
    fs::rename(a.path().join(".tmp-f"), a.path().join("f")).expect("rename");

    // Within the cache lifetime, B's listing and negative lookup are stale...
    let stale_listing = names(b.path());
    let stale_lookup = fs::metadata(b.path().join("x")).is_err();
    // ...but opening f by name revalidates it (close-to-open).
    let reopened = fs::read(b.path().join("f")).expect("reopen f");
    assert!(
        cached_at.elapsed() < TTL,
        "test too slow to observe the cache"
    );
    assert_eq!(stale_listing, ["f"], "B's listing should still be cached");
    assert!(
        stale_lookup,
        "B's negative lookup of x should still be cached"
    );
    assert_eq!(
        reopened, b"v2",
        "open by name must see the closed new version"
    );

    // After the cache lifetime B sees everything.
    let deadline = Instant::now() + TTL * 3;
    while names(b.path()) != ["f", "x"] {
        assert!(
            Instant::now() < deadline,
            "B never saw x: {:?}",
            names(b.path())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(fs::read(b.path().join("x")).expect("read x"), b"new");
}

#[test]
fn lost_replies_report_failure_for_operations_that_happened() {
    let backing = tempfile::tempdir_in(env_tmp()).expect("backing");
    let Some(a) = host(
        backing.path(),
        Behaviours {
            lost_reply_prob: 1.0,
            ..Behaviours::default()
        },
    ) else {
        return;
    };
    let p = a.path();
    let err = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(p.join("c"))
        .expect_err("lost reply of an exclusive create");
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    assert!(backing.path().join("c").exists(), "the create did happen");

    let err = fs::rename(p.join("c"), p.join("d")).expect_err("lost reply of a rename");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(backing.path().join("d").exists() && !backing.path().join("c").exists());

    let err = fs::remove_file(p.join("d")).expect_err("lost reply of an unlink");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(!backing.path().join("d").exists(), "the unlink did happen");
}

#[test]
fn a_cut_off_host_gets_eio_until_healed() {
    let backing = tempfile::tempdir_in(env_tmp()).expect("backing");
    let control = tempfile::tempdir_in(env_tmp()).expect("control dir");
    let cut = control.path().join("cut");
    let Some(a) = host(
        backing.path(),
        Behaviours {
            cutoff_file: Some(cut.clone()),
            ..Behaviours::default()
        },
    ) else {
        return;
    };
    let f = a.path().join("f");
    let mut w = File::create(&f).expect("create");
    w.write_all(b"1").expect("write");
    File::create(&cut).expect("cut off");
    let err = w.write_all(b"2").and_then(|()| w.sync_all());
    assert_eq!(err.map_err(|e| e.raw_os_error()).err(), Some(Some(EIO)));
    let err = fs::read_dir(a.path())
        .map(|_| ())
        .expect_err("listing while cut off");
    assert_eq!(err.raw_os_error(), Some(EIO), "{err}");
    fs::remove_file(&cut).expect("heal");
    w.write_all(b"3").expect("write after heal");
    drop(w);
    assert_eq!(fs::read(&f).expect("read after heal"), b"13");
}

/// Negative lookup caching, as Linux NFS does it: a create of a name this
/// host believes absent goes to the server, and its EEXIST drops the stale
/// negative entry (fs/nfs/dir.c `d_drop` on a failed create), so creating
/// inside a directory another host just made works. weakfs first kept the
/// negative entry, and two brokers starting together on one volume failed
/// with "File exists" — a model weaker than NFS; fixed in weakfs, and
/// `RealFs::create_dir_all` no longer re-checks EEXIST with a stat.
#[test]
fn negative_lookup_cache_create_dir_all_of_a_dir_another_host_made() {
    use kaas_volume::fs::{Fs, RealFs};
    let backing = tempfile::tempdir_in(env_tmp()).expect("backing");
    let (Some(a), Some(b)) = (host(backing.path(), nfs()), host(backing.path(), nfs())) else {
        return;
    };
    // B caches "d does not exist"; A creates it.
    assert!(fs::metadata(b.path().join("d")).is_err());
    fs::create_dir(a.path().join("d")).expect("mkdir on A");
    assert!(
        fs::metadata(b.path().join("d")).is_err(),
        "B's negative lookup should still be cached (else this test checks nothing)"
    );
    RealFs
        .create_dir_all(&b.path().join("d"))
        .expect("create_dir_all of an existing dir on B");
    RealFs
        .create_dir_all(&b.path().join("d").join("e"))
        .expect("create_dir_all below it on B");
    assert!(a.path().join("d").join("e").is_dir());
}

fn read(p: &Path) -> Vec<u8> {
    fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Write-back: a host's writes reach the shared volume only at fsync, close
/// or truncate, as the NFS client's dirty pages do; the host itself sees
/// them at once. If the host is cut off when it writes back, the data is
/// lost (the write-back fails and the buffer is dropped, as a soft mount's
/// timed-out WRITEs are), even after the host heals.
#[test]
fn writes_are_invisible_to_another_host_until_fsync_or_close() {
    let backing = tempfile::tempdir_in(env_tmp()).expect("backing");
    let control = tempfile::tempdir_in(env_tmp()).expect("control dir");
    let cut = control.path().join("cut");
    let on_a = Behaviours {
        cutoff_file: Some(cut.clone()),
        ..nfs()
    };
    let (Some(a), Some(b)) = (host(backing.path(), on_a), host(backing.path(), nfs())) else {
        return;
    };
    let (fa, fb) = (a.path().join("f"), b.path().join("f"));

    let mut w = File::create(&fa).expect("create on A");
    w.write_all(b"abc").expect("write");
    assert_eq!(read(&fb), b"", "B must not see A's write before fsync");
    assert_eq!(read(&fa), b"abc", "A sees its own write");
    assert_eq!(fs::metadata(&fa).expect("stat on A").len(), 3);
    assert_eq!(fs::metadata(&fb).expect("stat on B").len(), 0);
    w.sync_all().expect("fsync");
    assert_eq!(read(&fb), b"abc", "B sees what A fsynced (re-open)");

    // Close writes back too.
    w.write_all(b"def").expect("write more");
    assert_eq!(read(&fb), b"abc", "B must not see A's write before close");
    drop(w);
    assert_eq!(read(&fb), b"abcdef", "B sees what A closed");

    // Positional writes, past the end too (a hole), then truncate: the
    // buffer is written back before the truncate.
    let w = OpenOptions::new().write(true).open(&fa).expect("open on A");
    w.write_all_at(b"XY", 1).expect("pwrite");
    w.write_all_at(b"Z", 8).expect("pwrite past the end");
    assert_eq!(read(&fa), b"aXYdef\0\0Z");
    assert_eq!(read(&fb), b"abcdef");
    w.set_len(4).expect("truncate");
    assert_eq!(read(&fb), b"aXYd", "truncate writes back, then truncates");
    assert_eq!(read(&fa), b"aXYd");

    // Cut off before fsync: the fsync fails and the data is lost.
    w.write_all_at(b"lost", 4).expect("write");
    File::create(&cut).expect("cut off");
    let err = w.sync_all().expect_err("fsync while cut off");
    assert_eq!(err.raw_os_error(), Some(EIO), "{err}");
    fs::remove_file(&cut).expect("heal");
    w.sync_all().expect("fsync after heal (nothing buffered)");
    drop(w);
    assert_eq!(read(&fb), b"aXYd", "data A failed to write back reached B");
    assert_eq!(
        read(&fa),
        b"aXYd",
        "A dropped the buffer it failed to write"
    );

    // Cut off before close: the same.
    let mut w = OpenOptions::new()
        .append(true)
        .open(&fa)
        .expect("open on A");
    w.write_all(b"gone").expect("append");
    assert_eq!(read(&fa), b"aXYdgone");
    File::create(&cut).expect("cut off");
    drop(w); // close fails with EIO (not visible through drop)
    fs::remove_file(&cut).expect("heal");
    assert_eq!(read(&fb), b"aXYd", "data A failed to write back reached B");
    assert_eq!(read(&fa), b"aXYd");

    // Past the buffer bound, data is written back without fsync or close
    // (background writeback of dirty pages).
    let w = OpenOptions::new().write(true).open(&fa).expect("open on A");
    let big = vec![7u8; weakfs::WRITE_BACK_LIMIT + 1];
    w.write_all_at(&big, 0).expect("big write");
    assert_eq!(
        fs::metadata(&fb).expect("stat on B").len(),
        big.len() as u64,
        "more than the bound stayed buffered"
    );
}

/// ESTALE: a handle to a file that another host removed (here: replaced
/// by renaming a new file over its name) answers ESTALE, as the NFS server
/// has freed the file; opening the name again finds the new file. The
/// host's own removals keep its handles valid: by silly rename, or (with
/// silly rename off) as on a local filesystem.
#[test]
fn a_handle_to_a_file_replaced_by_another_host_gets_estale() {
    let backing = tempfile::tempdir_in(env_tmp()).expect("backing");
    let no_silly = Behaviours {
        silly_rename: false,
        ..nfs()
    };
    let (Some(a), Some(b), Some(c)) = (
        host(backing.path(), nfs()),
        host(backing.path(), nfs()),
        host(backing.path(), no_silly),
    ) else {
        return;
    };
    fs::write(a.path().join("f"), b"old").expect("write f");
    let mut held = File::open(a.path().join("f")).expect("open f on A");
    fs::write(b.path().join(".f.tmp"), b"new").expect("write temp on B");
    fs::rename(b.path().join(".f.tmp"), b.path().join("f")).expect("rename on B");
    let mut buf = [0u8; 16];
    let err = held
        .read(&mut buf)
        .expect_err("read through a handle to a file B replaced");
    assert_eq!(err.raw_os_error(), Some(ESTALE), "{err}");
    let err = held.sync_all().expect_err("fsync of a stale handle");
    assert_eq!(err.raw_os_error(), Some(ESTALE), "{err}");
    let err = held.metadata().expect_err("fstat of a stale handle");
    assert_eq!(err.raw_os_error(), Some(ESTALE), "{err}");
    drop(held);
    assert_eq!(read(&a.path().join("f")), b"new", "re-open finds B's file");

    // A removal through the same mount keeps the handle: silly rename...
    let mut held = File::open(a.path().join("f")).expect("open f on A");
    fs::write(a.path().join(".f.tmp"), b"newer").expect("write temp on A");
    fs::rename(a.path().join(".f.tmp"), a.path().join("f")).expect("rename on A");
    let mut got = String::new();
    held.read_to_string(&mut got)
        .expect("read after A's own replace");
    assert_eq!(got, "new");
    drop(held);

    // ...or, without silly rename, this mount remembering what it removed.
    let mut held = File::open(c.path().join("f")).expect("open f on C");
    fs::remove_file(c.path().join("f")).expect("unlink on C");
    let mut got = String::new();
    held.read_to_string(&mut got)
        .expect("read after C's own unlink");
    assert_eq!(got, "newer");
    held.sync_all().expect("fsync after C's own unlink");
    assert_eq!(
        held.metadata().expect("fstat after C's own unlink").len(),
        5
    );
}
