//! Topic change notices: how the controller learns that a topic changed
//! without re-reading every topic's files on every pass.
//!
//! A broker that changes a topic (create, grow, alter configs, request a
//! delete) makes the change durable first, then posts a notice:
//! `<cluster>/topic-changes/<nonce>.json` holding the topic's name, id and
//! whether a delete was requested, written temp → fsync → rename
//! ([`write_atomic`]) under a fresh random name, so posters never collide
//! and a reader never sees half a notice; then it rings the [`BELL`]. The
//! controller reads the bell by exact name every pass and lists the
//! directory when the bell changed (and for a few seconds after, and once
//! in a while anyway), reads each notice, re-reads only the topics named,
//! and then removes the notices it acted on.
//!
//! The four questions: a post is one rename of a uniquely named file
//! (atomic, no second writer of that name); a ring is one rename over the
//! bell (atomic; many writers, but each only replaces random bytes, and a
//! lost ring — a crash between a post and its ring, or a ring that failed —
//! leaves the notice to the controller's periodic listing); the controller is the only
//! remover and acting on a notice twice is harmless (it only makes a topic
//! be re-read), so a crash anywhere is re-driven by the next pass; notices
//! name a topic *and its id*, so a notice about an old incarnation never
//! marks a new one deleting. A notice can be lost (a poster crashing
//! between its change and its notice, whose client then sees no answer and
//! retries) or seen late (a stale listing): the controller's slow full
//! re-read of every topic covers both, so notices only make changes fast,
//! never correct.
//!
//! A delete request is trusted from the notice itself: the request file is
//! a new name the controller may have probed before (and an NFS client can
//! cache that "no such file"), while the notice is a name it has never
//! looked up.

use crate::fs::{remove_if_exists, write_atomic, Fs};
use crate::layout::is_temp;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};

/// Directory of notices inside the cluster directory.
pub const DIR: &str = "topic-changes";

/// One change of one topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// The topic's name.
    pub topic: String,
    /// The incarnation changed (`None`: unknown to the poster).
    pub topic_id: Option<uuid::Uuid>,
    /// A delete of that incarnation was requested (durably) before this
    /// notice was posted.
    #[serde(default)]
    pub delete: bool,
}

fn dir(cluster: &Path) -> PathBuf {
    cluster.join(DIR)
}

/// The bell: `<cluster>/topic-changes/bell`, one fixed name that every
/// poster of a notice — and every broker that joins — rewrites after its
/// change is in place ([`ring`]). The controller reads it by exact name
/// each pass (close-to-open fresh: one open and a read) and lists this
/// directory and the broker records only when its bytes changed, instead
/// of listing both every pass.
pub const BELL: &str = "bell";

/// Post a notice (after the change itself is durable), then ring the bell.
pub fn post(fs: &dyn Fs, cluster: &Path, n: &Notice) -> io::Result<()> {
    let d = dir(cluster);
    fs.create_dir_all(&d)?;
    let name = format!("{:032x}.json", rand::random::<u128>());
    write_atomic(
        fs,
        &d.join(name),
        &serde_json::to_vec(n).expect("serializes"),
    )?;
    ring(fs, cluster)
}

/// Ring the bell (see [`BELL`]): rewrite it, temp → rename, with fresh
/// random bytes, so any ring after a reader's last read changes what
/// the next read returns. Rings by several hosts at once are several
/// renames over one name: the last one stays, and every one of them
/// differs from what the reader saw before — the reader lists once and
/// sees them all (a listing may be stale: it keeps listing for a while
/// after a ring, and lists now and then anyway). Call it after the change
/// it announces is in place.
///
/// Not fsynced: the bell is a hint whose bytes nobody interprets, so a
/// ring lost or emptied by a power failure is only a ring not heard (the
/// periodic listing covers it) or an extra one (a listing). Two fsyncs per
/// ring made creating 1,000 topics about a third slower.
pub fn ring(fs: &dyn Fs, cluster: &Path) -> io::Result<()> {
    let d = dir(cluster);
    fs.create_dir_all(&d)?;
    let tmp = d.join(crate::layout::temp(BELL, rand::random::<u64>()));
    let f = fs.create_exclusive(&tmp)?;
    let bytes = format!("{:032x}\n", rand::random::<u128>());
    // Closed before the rename: a host that opens the new bell reads its
    // bytes (close-to-open), not a file still being written.
    let res = f.write_all_at(bytes.as_bytes(), 0);
    drop(f);
    let res = res.and_then(|_| fs.rename(&tmp, &d.join(BELL)));
    if res.is_err() {
        // Best effort: a leftover temp is swept with the others.
        let _ = fs.remove_file(&tmp);
    }
    res
}

/// The bell's bytes by exact name (`None`: never rung).
pub fn read_bell(fs: &dyn Fs, cluster: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs.read(&dir(cluster).join(BELL)) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Every complete notice now listed, with its file name. Unreadable or
/// foreign files are skipped (returned with `None`, so the controller
/// removes them too); temps of posts in progress are not listed.
pub fn read_all(fs: &dyn Fs, cluster: &Path) -> io::Result<Vec<(String, Option<Notice>)>> {
    let d = dir(cluster);
    let names = match fs.list(&d) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for name in names {
        if is_temp(&name) || !name.ends_with(".json") {
            continue;
        }
        match fs.read(&d.join(&name)) {
            Ok(b) => out.push((name, serde_json::from_slice(&b).ok())),
            // Removed meanwhile (a stale listing): nothing to act on.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Remove a notice that was acted on (the controller, through its term).
pub fn remove(fs: &dyn Fs, cluster: &Path, file: &str) -> io::Result<()> {
    remove_if_exists(fs, &dir(cluster).join(file))
}

/// Remove temps of posts that died before their rename. Only the
/// controller calls this, and rarely: a live poster whose temp it removes
/// gets an error, and its notice is then covered by the full re-read.
pub fn remove_stale_temps(fs: &dyn Fs, cluster: &Path) -> io::Result<()> {
    match crate::fs::remove_stale_temps(fs, &dir(cluster)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::fault::FaultFs;
    use crate::fs::RealFs;

    fn notice(t: &str) -> Notice {
        Notice {
            topic: t.into(),
            topic_id: Some(uuid::Uuid::from_u128(7)),
            delete: true,
        }
    }

    #[test]
    fn posted_notices_are_read_and_removed() {
        let d = tempfile::tempdir().unwrap();
        assert!(read_all(&RealFs, d.path()).unwrap().is_empty());
        post(&RealFs, d.path(), &notice("a")).unwrap();
        post(&RealFs, d.path(), &notice("a")).unwrap();
        let got = read_all(&RealFs, d.path()).unwrap();
        assert_eq!(got.len(), 2, "two posts never collide");
        assert!(got.iter().all(|(_, n)| n.as_ref() == Some(&notice("a"))));
        for (f, _) in &got {
            remove(&RealFs, d.path(), f).unwrap();
            remove(&RealFs, d.path(), f).unwrap(); // idempotent
        }
        assert!(read_all(&RealFs, d.path()).unwrap().is_empty());
    }

    /// A crash at every step of a post (the notice, then the bell) leaves
    /// either no notice or a whole one (never a torn one a reader would act
    /// on), a bell that is the old one or a whole new one, and temps that
    /// the cleanup removes. A completed post always changed the bell.
    #[test]
    fn crash_at_every_step_of_a_post_leaves_nothing_torn() {
        let mut done = false;
        for n in 1..60u64 {
            let d = tempfile::tempdir().unwrap();
            ring(&RealFs, d.path()).unwrap();
            let before = read_bell(&RealFs, d.path()).unwrap().unwrap();
            let fs = FaultFs::new();
            fs.crash_at(n);
            let res = post(&fs, d.path(), &notice("t"));
            let got = read_all(&RealFs, d.path()).unwrap();
            if res.is_ok() {
                assert_eq!(got.len(), 1, "step {n}");
            }
            for (_, body) in &got {
                assert_eq!(body.as_ref(), Some(&notice("t")), "step {n}: torn notice");
            }
            let bell = read_bell(&RealFs, d.path()).unwrap().unwrap();
            assert_eq!(bell.len(), 33, "step {n}: torn bell {bell:?}");
            if res.is_ok() {
                assert_ne!(bell, before, "step {n}: a post that returned did not ring");
            }
            if bell != before {
                assert_eq!(
                    got.len(),
                    1,
                    "step {n}: rang before its notice was in place"
                );
            }
            remove_stale_temps(&RealFs, d.path()).unwrap();
            let left: Vec<_> = match std::fs::read_dir(d.path().join(DIR)) {
                Ok(r) => r
                    .map(|e| e.unwrap().file_name().into_string().unwrap())
                    .filter(|n| n != BELL)
                    .collect(),
                Err(_) => Vec::new(),
            };
            assert!(left.len() <= 1, "step {n}: {left:?}");
            if !fs.crashed() {
                done = true;
                break;
            }
        }
        assert!(done, "every step crashed once");
    }
}
