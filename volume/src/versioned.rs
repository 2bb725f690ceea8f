//! A versioned document: a small JSON document kept as a linear chain of
//! versions `<dir>/v-<n:012>.json`, each the whole document, each created
//! with O_CREAT|O_EXCL. It is how state that any broker may change (client
//! quotas, a topic's configs and partition count) gets a compare-and-set
//! without a single writer: a change reads the newest version `n`, applies
//! itself, and creates `n + 1` exclusively; if another writer created
//! `n + 1` first, it reads again and re-applies. Every acknowledged change
//! is therefore based on the newest durable version, and two concurrent
//! changes both land (or the second is re-judged against the first: a grow
//! to a count the first already reached is refused, as Kafka's controller
//! would).
//!
//! Each file is `kaas-versioned <n> <crc32c-hex> <len>\n<json>`: the header
//! names the version (a copied or misplaced file is recognised) and checks
//! the body, so a torn file (its writer died between the create and the
//! fsync, or is still writing) is never mistaken for a version. A file
//! without the header is the previous on-disk format (plain JSON) and still
//! read; the next change writes the new format.
//!
//! **A torn newest version.** The exclusive create claims `n + 1` before
//! its content exists, so a newest version that does not parse is either
//! a dead writer's (never acknowledged) or a live writer's in progress. A
//! reader that only wants the document takes the newest one that parses
//! either way: what is in progress is not acknowledged yet. A *writer* must
//! not build on the older one while the torn one may still be acknowledged,
//! or that acknowledged change would be lost. Two bounds on two clocks
//! close this without comparing clocks (the lease argument): a writer
//! acknowledges only if its create, write, fsync and directory fsync took
//! less than [`Timing::deadline`] on its own monotonic clock (started
//! before the create), and another writer goes past a torn newest version
//! only after it has seen it torn for `deadline + grace` on its own clock
//! (its first look is after the create). So a version that is gone past was
//! never acknowledged, and a writer that overran its deadline answers an
//! error (its change may or may not be in force: indeterminate, never
//! acknowledged). A crashed writer delays the next change by
//! `deadline + grace` once.
//!
//! Old versions are pruned by writers: at most [`KEEP`] behind the one just
//! written (never the newest readable one, which is the one just written).
//!
//! Four questions: (1) a version is one exclusive create, then write and
//! fsync of its whole content and a directory fsync, before the change is
//! acknowledged; (2) a crash leaves nothing, a torn newest version every
//! reader skips and the next writer goes past, or the whole version
//! (crash-at-every-step tests below and in the users); (3) there is no
//! single writer: the exclusive create of `n + 1` is the compare-and-set
//! that orders writers, and the deadline keeps a slow one from
//! acknowledging a version another went past; (4) a version number names
//! one content forever: a file is never rewritten, and the document itself
//! carries the identity it belongs to where that matters (a topic's id).

use crate::fs::{Fs, ReadFs};
use crate::layout;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// Versions kept behind the newest.
pub const KEEP: u64 = 8;
/// Collisions (another writer took our version) tolerated by one change.
const ATTEMPTS: usize = 16;
/// How often a writer waiting on a torn newest version looks again.
const POLL: Duration = Duration::from_millis(50);
/// The header's magic word.
const MAGIC: &str = "kaas-versioned";

/// How long a write may take to be acknowledged, and how long a torn
/// newest version is presumed in progress (see module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// A writer acknowledges only within this of starting its create.
    pub deadline: Duration,
    /// Slack for clock rates: others wait `deadline + grace`.
    pub grace: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(5),
            grace: Duration::from_secs(1),
        }
    }
}

/// The one reading surface the chain needs (the writable seam and the
/// read-only view both have it).
pub trait Reader {
    /// Read a whole small file by exact name.
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// List a directory (possibly stale).
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
}

impl<F: Fs + ?Sized> Reader for F {
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.read(path)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.list(dir)
    }
}

impl Reader for ReadFs {
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.read(path)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.list(dir)
    }
}

/// `v-<n:012>.json`: version `n` ([`layout::doc_version`]).
pub fn version_name(n: u64) -> String {
    layout::doc_version(n)
}

/// Inverse of [`version_name`].
pub fn parse_version_name(name: &str) -> Option<u64> {
    layout::parse_doc_version(name)
}

/// The bytes of version `n` of `doc`.
pub fn encode<T: Serialize>(n: u64, doc: &T) -> Vec<u8> {
    let body = serde_json::to_vec(doc).expect("versioned document serializes");
    let mut out =
        format!("{MAGIC} {n} {:08x} {}\n", crc32c::crc32c(&body), body.len()).into_bytes();
    out.extend_from_slice(&body);
    out
}

/// The document in the bytes of version `n`, or `None` when they are torn,
/// fail their check or name another version. A file without the header is
/// the previous format (plain JSON), taken if it parses.
pub fn decode<T: DeserializeOwned>(n: u64, bytes: &[u8]) -> Option<T> {
    if !bytes.starts_with(MAGIC.as_bytes()) {
        return serde_json::from_slice(bytes).ok();
    }
    let nl = bytes.iter().position(|&b| b == b'\n')?;
    let header = std::str::from_utf8(&bytes[..nl]).ok()?;
    let body = &bytes[nl + 1..];
    let mut it = header.split(' ').skip(1);
    let v: u64 = it.next()?.parse().ok()?;
    let crc = u32::from_str_radix(it.next()?, 16).ok()?;
    let len: usize = it.next()?.parse().ok()?;
    if v != n || len != body.len() || crc32c::crc32c(body) != crc {
        return None;
    }
    serde_json::from_slice(body).ok()
}

/// What a read of a chain found.
#[derive(Debug, Clone, PartialEq)]
pub struct Latest<T> {
    /// The newest version present, readable or not (0: none).
    pub top: u64,
    /// The newest readable version and its document.
    pub newest: Option<(u64, T)>,
}

impl<T> Latest<T> {
    /// The newest readable version's number (0: none).
    pub fn newest_version(&self) -> u64 {
        self.newest.as_ref().map_or(0, |(v, _)| *v)
    }
}

/// Read the chain in `dir` (absent: empty). The listing only discovers
/// candidates; versions past its end are probed by exact name, and each is
/// read by exact name (close-to-open).
pub fn read_latest<T: DeserializeOwned>(
    r: &(impl Reader + ?Sized),
    dir: &Path,
) -> io::Result<Latest<T>> {
    let mut versions: Vec<u64> = match r.list_dir(dir) {
        Ok(names) => names.iter().filter_map(|n| parse_version_name(n)).collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    versions.sort_unstable();
    let mut top = versions.last().copied().unwrap_or(0);
    // A listing may be stale (NFS): look past its end by exact name.
    loop {
        match r.read_file(&dir.join(version_name(top + 1))) {
            Ok(_) => {
                top += 1;
                versions.push(top);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => break,
            // Absent directory: no chain.
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => break,
            Err(e) => return Err(e),
        }
    }
    for &v in versions.iter().rev() {
        match r.read_file(&dir.join(version_name(v))) {
            Ok(b) => {
                if let Some(doc) = decode(v, &b) {
                    return Ok(Latest {
                        top,
                        newest: Some((v, doc)),
                    });
                }
            }
            // Pruned meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Latest { top, newest: None })
}

/// Why [`update`] did not write.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError<E> {
    /// The change refused.
    #[error("{0}")]
    Refused(E),
    /// The volume failed, the writer overran its deadline, or too many
    /// writers collided: nothing acknowledged (the change may or may not
    /// be in force).
    #[error("versioned document: {0}")]
    Io(#[from] io::Error),
}

/// Apply `change` to the newest version and publish the result as the
/// next one (see module docs); returns the version written and the
/// document. `base` turns the newest readable document (`None` when there
/// is none) into the one the change applies to: a user falls back to its
/// previous on-disk format there, or refuses a document of another
/// identity. `change` may refuse (nothing is written), and it is applied
/// again from scratch whenever another writer got in first.
pub fn update<T, E>(
    fs: &dyn Fs,
    dir: &Path,
    timing: Timing,
    mut base: impl FnMut(Option<T>) -> Result<T, E>,
    mut change: impl FnMut(&mut T) -> Result<(), E>,
) -> Result<(u64, T), UpdateError<E>>
where
    T: Serialize + DeserializeOwned,
{
    // Only the chain's own directory: its parent (a topic directory) may
    // have been renamed aside meanwhile, and must not come back empty.
    if !fs.is_dir(dir) {
        fs.create_dir(dir)?;
        if let Some(parent) = dir.parent() {
            fs.sync_dir(parent)?;
        }
    }
    // The torn newest version we are waiting out, and since when.
    let mut torn: Option<(u64, Instant)> = None;
    let mut collisions = 0;
    loop {
        let latest: Latest<T> = read_latest(fs, dir)?;
        if latest.top > latest.newest_version() {
            match torn {
                Some((v, since)) if v == latest.top => {
                    if since.elapsed() < timing.deadline + timing.grace {
                        std::thread::sleep(POLL);
                        continue;
                    }
                    // Its writer can no longer acknowledge it: go past.
                    tracing::warn!(dir = %dir.display(), version = v, "going past a torn version (its writer died or overran)");
                }
                _ => {
                    torn = Some((latest.top, Instant::now()));
                    std::thread::sleep(POLL);
                    continue;
                }
            }
        }
        let mut doc = base(latest.newest.map(|(_, d)| d)).map_err(UpdateError::Refused)?;
        change(&mut doc).map_err(UpdateError::Refused)?;
        let n = latest.top + 1;
        let path = dir.join(version_name(n));
        let started = Instant::now();
        let f = match fs.create_exclusive(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                collisions += 1;
                if collisions >= ATTEMPTS {
                    return Err(io::Error::other("too many concurrent changes; try again").into());
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        f.write_all_at(&encode(n, &doc), 0)?;
        f.sync_data()?;
        drop(f);
        fs.sync_dir(dir)?;
        if started.elapsed() >= timing.deadline {
            // Another writer may have gone past this version meanwhile.
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "version {n} took longer than {:?} to write; not acknowledged",
                    timing.deadline
                ),
            )
            .into());
        }
        prune(fs, dir, n);
        return Ok((n, doc));
    }
}

/// Remove versions more than [`KEEP`] behind `newest` (best effort; the
/// next writer retries).
fn prune(fs: &dyn Fs, dir: &Path, newest: u64) {
    let Ok(names) = fs.list(dir) else { return };
    for n in names {
        if parse_version_name(&n).is_some_and(|v| v + KEEP < newest) {
            let _ = fs.remove_file(&dir.join(&n));
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build fixtures with std::fs
mod tests {
    use super::*;
    use crate::fs::fault::FaultFs;
    use crate::fs::RealFs;
    use std::sync::{Arc, Barrier};

    const FAST: Timing = Timing {
        deadline: Duration::from_secs(5),
        grace: Duration::from_millis(1),
    };
    /// Short enough for tests to wait out a torn version.
    // A deadline generous enough to mean "hung", not "slow": a test's own
    // writes acknowledge within it on a loaded machine (100 ms failed a
    // fresh-clone CI run once, one fsync being slow), and a torn version
    // is waited out in about a second.
    const SHORT: Timing = Timing {
        deadline: Duration::from_secs(1),
        grace: Duration::from_millis(20),
    };

    fn add(k: u32) -> impl FnMut(&mut Vec<u32>) -> Result<(), io::Error> {
        move |d| {
            if !d.contains(&k) {
                d.push(k);
            }
            Ok(())
        }
    }

    fn plain(d: Option<Vec<u32>>) -> Result<Vec<u32>, io::Error> {
        Ok(d.unwrap_or_default())
    }

    #[test]
    fn names_and_envelopes_round_trip_and_torn_bytes_are_refused() {
        assert_eq!(parse_version_name(&version_name(7)), Some(7));
        assert_eq!(parse_version_name("v-7.json"), None);
        assert_eq!(parse_version_name("v-00000000000x.json"), None);
        let b = encode(3, &vec![1u32, 2]);
        assert_eq!(decode::<Vec<u32>>(3, &b), Some(vec![1, 2]));
        // Another version's file, any strict prefix, a flipped byte.
        assert_eq!(decode::<Vec<u32>>(4, &b), None);
        for cut in 0..b.len() {
            assert_eq!(decode::<Vec<u32>>(3, &b[..cut]), None, "prefix {cut}");
        }
        let mut bad = b.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(decode::<Vec<u32>>(3, &bad), None);
        // The previous format: plain JSON.
        assert_eq!(decode::<Vec<u32>>(9, b"[5]"), Some(vec![5]));
        assert_eq!(decode::<Vec<u32>>(9, b"[5"), None);
    }

    /// Catches: a change based on a version another writer has already
    /// superseded (last writer wins, the first change lost).
    #[test]
    fn a_writer_that_loses_the_race_re_applies_on_the_winner() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("c");
        assert_eq!(read_latest::<Vec<u32>>(&RealFs, &dir).unwrap().top, 0);
        update(&RealFs, &dir, FAST, plain, add(1)).unwrap();
        let mut raced = false;
        let (n, doc) = update(&RealFs, &dir, FAST, plain, |d: &mut Vec<u32>| {
            if !raced {
                raced = true;
                update(&RealFs, &dir, FAST, plain, add(2)).unwrap();
            }
            add(3)(d)
        })
        .unwrap();
        assert_eq!((n, doc.clone()), (3, vec![1, 2, 3]));
        let l = read_latest::<Vec<u32>>(&RealFs, &dir).unwrap();
        assert_eq!(l.newest, Some((3, doc)));
    }

    /// Catches: lost changes when writers on several threads (brokers)
    /// change one document at the same instant.
    #[test]
    fn concurrent_writers_all_land() {
        let d = tempfile::tempdir().unwrap();
        let dir = Arc::new(d.path().join("c"));
        let go = Arc::new(Barrier::new(6));
        let hs: Vec<_> = (0..6u32)
            .map(|i| {
                let (dir, go) = (dir.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    for j in 0..5 {
                        update(&RealFs, &dir, FAST, plain, add(i * 10 + j)).unwrap();
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        let (_, mut doc) = read_latest::<Vec<u32>>(&RealFs, &dir)
            .unwrap()
            .newest
            .unwrap();
        doc.sort_unstable();
        let want: Vec<u32> = (0..6)
            .flat_map(|i| (0..5).map(move |j| i * 10 + j))
            .collect();
        assert_eq!(doc, want);
        // Pruned behind the newest.
        assert!(std::fs::read_dir(&*dir).unwrap().count() <= KEEP as usize + 1);
    }

    /// Catches: a writer building on the older version while the torn
    /// newest one's writer may still acknowledge it; and a torn version
    /// blocking every later change forever.
    #[test]
    fn a_torn_newest_version_is_waited_out_then_gone_past() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("c");
        update(&RealFs, &dir, SHORT, plain, add(1)).unwrap();
        std::fs::write(dir.join(version_name(2)), b"kaas-versioned 2 ").unwrap();
        // Readers take the newest readable one at once.
        let l = read_latest::<Vec<u32>>(&RealFs, &dir).unwrap();
        assert_eq!((l.top, l.newest), (2, Some((1, vec![1]))));
        let t = Instant::now();
        let (n, doc) = update(&RealFs, &dir, SHORT, plain, add(2)).unwrap();
        assert!(
            t.elapsed() >= SHORT.deadline + SHORT.grace,
            "{:?}",
            t.elapsed()
        );
        assert_eq!((n, doc), (3, vec![1, 2]));
        // A torn version that completes within the wait is built on.
        std::fs::write(dir.join(version_name(4)), b"").unwrap();
        let done = dir.join(version_name(4));
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            std::fs::write(done, encode(4, &vec![1u32, 2, 9])).unwrap();
        });
        let (n, doc) = update(&RealFs, &dir, SHORT, plain, add(3)).unwrap();
        h.join().unwrap();
        assert_eq!((n, doc), (5, vec![1, 2, 9, 3]));
    }

    /// Catches: a crash at any step losing an acknowledged change, leaving a
    /// state readers misread, or one no later change gets through.
    #[test]
    fn crash_at_every_step_converges() {
        let base = {
            let d = tempfile::tempdir().unwrap();
            let dir = d.path().join("c");
            update(&RealFs, &dir, SHORT, plain, add(1)).unwrap();
            let ffs = FaultFs::new();
            update(&ffs, &dir, SHORT, plain, add(2)).unwrap();
            ffs.ops()
        };
        assert!(base >= 4, "{base}");
        for n in 1..=base {
            let d = tempfile::tempdir().unwrap();
            let dir = d.path().join("c");
            update(&RealFs, &dir, SHORT, plain, add(1)).unwrap();
            let ffs = FaultFs::new();
            ffs.crash_at(n);
            let acked = update(&ffs, &dir, SHORT, plain, add(2)).is_ok();
            ffs.power_loss();
            let (_, got) = read_latest::<Vec<u32>>(&RealFs, &dir)
                .unwrap()
                .newest
                .unwrap();
            assert!(got == [1] || got == [1, 2], "step {n}: {got:?}");
            assert!(!acked || got == [1, 2], "step {n}: acknowledged, then lost");
            let (_, got) = update(&RealFs, &dir, SHORT, plain, add(3)).unwrap();
            assert!(
                got.ends_with(&[3]) && got.starts_with(&[1]),
                "step {n}: {got:?}"
            );
            assert_eq!(
                read_latest::<Vec<u32>>(&RealFs, &dir)
                    .unwrap()
                    .newest
                    .unwrap()
                    .1,
                got,
                "step {n}"
            );
        }
    }

    /// Catches: a change racing a topic delete recreating the topic's
    /// directory (renamed aside meanwhile), which would then be adopted as
    /// a new, empty topic.
    #[test]
    fn a_chain_whose_parent_is_gone_is_not_recreated() {
        let d = tempfile::tempdir().unwrap();
        let parent = d.path().join("topic");
        let r = update(&RealFs, &parent.join("state"), FAST, plain, add(1));
        assert!(
            matches!(&r, Err(UpdateError::Io(e)) if e.kind() == io::ErrorKind::NotFound),
            "{r:?}"
        );
        assert!(!parent.exists());
    }

    /// Catches: a writer that stalled past its deadline acknowledging a
    /// version another writer may have gone past.
    #[test]
    fn a_writer_past_its_deadline_does_not_acknowledge() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("c");
        let none = Timing {
            deadline: Duration::ZERO,
            grace: Duration::ZERO,
        };
        let r = update(&RealFs, &dir, none, plain, add(1));
        assert!(
            matches!(&r, Err(UpdateError::Io(e)) if e.kind() == io::ErrorKind::TimedOut),
            "{r:?}"
        );
    }
}
