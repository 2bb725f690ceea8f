//! The one exclusive-create-with-identity primitive: every file whose
//! existence means "this name is taken, and by whom" — a leader-epoch claim,
//! a controller epoch, a producer-id block, the cluster id — is created
//! through [`create_with_identity`], with one lost-reply policy.
//!
//! The steps: O_CREAT|O_EXCL (guarantee 2: exactly one racer creates the
//! file), write the creator's identity, fsync the file, fsync the directory.
//! On EEXIST the file is read:
//!
//! * our own identity inside ⇒ [`Claimed::Ours`]: an earlier attempt of ours
//!   won (a restart re-driving the same claim, or a retry after a reply that
//!   was lost *after* our write). It is fsynced again before it counts;
//! * another identity ⇒ [`Claimed::Taken`]: someone else won;
//! * empty or torn ⇒ the winner may be between its create and its write, so
//!   the file is read again for a bounded short time (5, 10, 20, 40, 80 ms:
//!   155 ms by default). If it is still empty it is
//!   [`Claimed::Indeterminate`]: a creator that crashed before writing, *or a
//!   lost reply to our own create* (DESIGN §11: the NFS server created the
//!   file, the reply was lost, the client's retry saw EEXIST). Nobody can
//!   tell those apart from the file, so the primitive does not guess; the
//!   caller decides (a leader claim is fenced, a controller epoch is waited
//!   out like a dead holder, a producer-id block is skipped, the cluster id
//!   is read again).
//!
//! Four questions: (1) one exclusive create, then write + fsync of its
//! content; (2) a crash between create and write leaves an empty file that
//! is never taken for anybody's: every caller re-drives elsewhere (a higher
//! epoch, the next block) or waits it out — but a write or fsync that
//! *fails* (a full volume: the create needs an inode, the content a block;
//! an NFS client reports it at write-back) removes the file it just created
//! exclusively — nothing was done under the name yet — so no empty file is
//! left per attempt and the retry can win the same name once space returns;
//! (3) the exclusive create is the
//! single-writer decision itself; (4) the name is the thing claimed, the
//! content is who claimed it.

use crate::fs::Fs;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What identifies a creator inside the file it created.
pub trait Identity: PartialEq + Sized {
    /// Bytes written into the file.
    fn encode(&self) -> Vec<u8>;
    /// The identity in `bytes`, or `None` if they are empty or torn.
    fn decode(bytes: &[u8]) -> Option<Self>;
}

/// Marker for identities stored as JSON (every identity file but the cluster
/// id): implement this and [`Identity`] comes for free.
pub trait JsonIdentity: Serialize + DeserializeOwned + PartialEq {}

impl<T: JsonIdentity> Identity for T {
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("identity serializes")
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}

/// Outcome of [`create_with_identity`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed<T> {
    /// We created the file just now; our identity in it is durable.
    Won,
    /// The file already held our identity (an earlier attempt of ours won);
    /// it has been fsynced again.
    Ours,
    /// Somebody else's identity is in the file.
    Taken(T),
    /// The file exists but no identity could be read from it within the
    /// re-read window: see [`Unsettled`].
    Indeterminate(Unsettled),
}

impl<T> Claimed<T> {
    /// Won or Ours.
    pub fn is_ours(&self) -> bool {
        matches!(self, Claimed::Won | Claimed::Ours)
    }
}

/// Why an existing file named nobody.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsettled {
    /// Still empty or torn after the re-reads: a creator that crashed before
    /// its write, or a lost reply to our own create.
    Empty,
    /// EEXIST, then gone when read (removed by a sweep in between).
    Gone,
}

/// How long to wait for an empty file to name its creator, and whether the
/// win is made durable.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Delays before each re-read of an empty or torn file.
    pub rereads: &'static [Duration],
    /// fsync the file and its directory before reporting a win. Only the
    /// substrate probe turns this off (it races many creates per second and
    /// checks exclusivity, not durability).
    pub durable: bool,
}

impl Policy {
    /// Every identity file of the cluster: re-read an empty file for 155 ms.
    pub const DURABLE: Policy = Policy {
        rereads: &[
            Duration::from_millis(5),
            Duration::from_millis(10),
            Duration::from_millis(20),
            Duration::from_millis(40),
            Duration::from_millis(80),
        ],
        durable: true,
    };

    /// The substrate's exclusive-create probe: no fsync, short re-reads.
    pub const PROBE: Policy = Policy {
        rereads: &[Duration::from_millis(1); 5],
        durable: false,
    };
}

/// Which step of [`create_with_identity`] failed. Converts into the
/// underlying `io::Error` unchanged.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The exclusive create failed with something other than EEXIST: the
    /// file was (most likely) not created.
    #[error("exclusive create of {path}: {source}")]
    Create {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Writing our identity into the file we created failed: the file exists
    /// and may be empty or torn (indeterminate for everyone).
    #[error("writing identity to {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// fsync of the file or its directory failed: the win is not durable.
    #[error("syncing {path}: {source}")]
    Sync {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Reading the file after EEXIST failed.
    #[error("reading {path} after EEXIST: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl CreateError {
    /// The underlying error.
    pub fn io(&self) -> &io::Error {
        match self {
            CreateError::Create { source, .. }
            | CreateError::Write { source, .. }
            | CreateError::Sync { source, .. }
            | CreateError::Read { source, .. } => source,
        }
    }
}

impl From<CreateError> for io::Error {
    fn from(e: CreateError) -> Self {
        match e {
            CreateError::Create { source, .. }
            | CreateError::Write { source, .. }
            | CreateError::Sync { source, .. }
            | CreateError::Read { source, .. } => source,
        }
    }
}

/// What reading an identity file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found<T> {
    /// No such file.
    Absent,
    /// The file exists but names nobody (empty or torn).
    Empty,
    /// The identity inside.
    Identity(T),
}

/// Read the identity in `path` once. A read that fails with
/// `UnexpectedEof` (a length seen by fstat and then not there to read, as a
/// FUSE attribute cache can report while the creator writes) counts as
/// [`Found::Empty`].
pub fn read_identity<T: Identity>(fs: &dyn Fs, path: &Path) -> io::Result<Found<T>> {
    match fs.read(path) {
        Ok(b) => Ok(T::decode(&b).map_or(Found::Empty, Found::Identity)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Found::Absent),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(Found::Empty),
        Err(e) => Err(e),
    }
}

/// Read the identity in `path`, re-reading an empty or torn file after each
/// of `rereads` (the winner may be between its create and its write).
pub fn read_settled<T: Identity>(
    fs: &dyn Fs,
    path: &Path,
    rereads: &[Duration],
) -> io::Result<Found<T>> {
    let mut found = read_identity(fs, path)?;
    for d in rereads {
        if found != Found::Empty {
            break;
        }
        std::thread::sleep(*d);
        found = read_identity(fs, path)?;
    }
    Ok(found)
}

/// Create `path` exclusively with `me` inside (see the module docs). The
/// parent directory must exist.
pub fn create_with_identity<T: Identity>(
    fs: &dyn Fs,
    path: &Path,
    me: &T,
    policy: Policy,
) -> Result<Claimed<T>, CreateError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let at = || path.to_path_buf();
    match fs.create_exclusive(path) {
        Ok(f) => {
            if let Err(source) = f.write_all_at(&me.encode(), 0) {
                // Ours alone (the exclusive create said so), empty or torn:
                // take it back rather than leave a name nobody can prove
                // was theirs. Best effort: a crash here, or a refused
                // removal, leaves the empty file step (2) already covers.
                drop(f);
                let _ = fs.remove_file(path);
                return Err(CreateError::Write { path: at(), source });
            }
            if policy.durable {
                if let Err(source) = f.sync_data().and_then(|_| fs.sync_dir(dir)) {
                    // An NFS client reports a full volume here, at write-back
                    // (the buffered identity was dropped): take it back too.
                    drop(f);
                    let _ = fs.remove_file(path);
                    return Err(CreateError::Sync { path: at(), source });
                }
            }
            Ok(Claimed::Won)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let found = read_settled::<T>(fs, path, policy.rereads)
                .map_err(|source| CreateError::Read { path: at(), source })?;
            match found {
                Found::Identity(o) if o == *me => {
                    if policy.durable {
                        // Ours from an earlier attempt that may have died
                        // before its fsync: make sure it is durable now.
                        fs.open_write(path)
                            .and_then(|f| f.sync_data())
                            .and_then(|_| fs.sync_dir(dir))
                            .map_err(|source| CreateError::Sync { path: at(), source })?;
                    }
                    Ok(Claimed::Ours)
                }
                Found::Identity(o) => Ok(Claimed::Taken(o)),
                Found::Empty => Ok(Claimed::Indeterminate(Unsettled::Empty)),
                Found::Absent => Ok(Claimed::Indeterminate(Unsettled::Gone)),
            }
        }
        Err(source) => Err(CreateError::Create { path: at(), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::fault::FaultFs;
    use crate::fs::RealFs;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Me {
        id: i32,
        nonce: u64,
    }
    impl JsonIdentity for Me {}

    const A: Me = Me { id: 1, nonce: 11 };
    const B: Me = Me { id: 2, nonce: 22 };

    #[test]
    fn one_winner_then_ours_for_the_winner_and_taken_for_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.claim");
        let c = |me: &Me| create_with_identity(&RealFs, &p, me, Policy::DURABLE).unwrap();
        assert_eq!(c(&A), Claimed::Won);
        assert_eq!(c(&A), Claimed::Ours);
        assert_eq!(c(&B), Claimed::Taken(A));
        assert_eq!(
            read_identity::<Me>(&RealFs, &p).unwrap(),
            Found::Identity(A)
        );
    }

    /// Catches: a lost reply to our own create (the file exists, empty)
    /// being taken for a win — or for someone else's live claim.
    #[test]
    fn a_lost_reply_to_the_create_is_indeterminate_not_won() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.claim");
        let fs = FaultFs::new();
        fs.lose_create_reply(1);
        let t = std::time::Instant::now();
        assert_eq!(
            create_with_identity(&fs, &p, &A, Policy::DURABLE).unwrap(),
            Claimed::Indeterminate(Unsettled::Empty)
        );
        assert!(
            t.elapsed() >= Duration::from_millis(150),
            "an empty file is re-read for the whole window"
        );
        assert_eq!(std::fs::read(&p).unwrap(), b"", "nothing written into it");
        // Nobody can win it afterwards either.
        assert_eq!(
            create_with_identity(&RealFs, &p, &B, Policy::DURABLE).unwrap(),
            Claimed::Indeterminate(Unsettled::Empty)
        );
    }

    /// Catches: a full volume leaving an empty file per attempt (the
    /// create needs only an inode): each retry found its own earlier
    /// attempt "indeterminate", so a leader claimed a new epoch every time
    /// (62 empty claims in one partition directory after 30 s).
    #[test]
    fn a_write_refused_by_a_full_volume_leaves_no_file_and_the_retry_wins() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.claim");
        let fs = FaultFs::new();
        fs.full(true);
        for _ in 0..3 {
            let e = create_with_identity(&fs, &p, &A, Policy::DURABLE).unwrap_err();
            assert_eq!(e.io().raw_os_error(), Some(libc::ENOSPC), "{e}");
            assert!(!p.exists(), "no empty file left behind");
        }
        fs.full(false);
        assert_eq!(
            create_with_identity(&fs, &p, &A, Policy::DURABLE).unwrap(),
            Claimed::Won
        );
    }

    /// Catches: an fsync that fails after the write (how an NFS client
    /// reports a full volume: the buffered identity is dropped at
    /// write-back) leaving the created file behind.
    #[test]
    fn a_failed_fsync_of_the_identity_leaves_no_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.claim");
        let fs = FaultFs::new();
        fs.fail_nth(3); // create, write, *sync*, sync_dir
        assert!(create_with_identity(&fs, &p, &A, Policy::DURABLE).is_err());
        assert!(!p.exists(), "taken back");
        assert_eq!(
            create_with_identity(&fs, &p, &A, Policy::DURABLE).unwrap(),
            Claimed::Won
        );
    }

    /// Catches: a racer reading the winner's file between its create and
    /// its write and calling it empty (the re-read window).
    #[test]
    fn a_winner_still_writing_is_waited_for() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.claim");
        let f = RealFs.create_exclusive(&p).unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            f.write_all_at(&B.encode(), 0).unwrap();
        });
        assert_eq!(
            create_with_identity(&RealFs, &p, &A, Policy::DURABLE).unwrap(),
            Claimed::Taken(B)
        );
        writer.join().unwrap();
    }

    #[test]
    fn a_torn_identity_counts_as_empty() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.claim");
        let full = A.encode();
        RealFs
            .create_exclusive(&p)
            .unwrap()
            .write_all_at(&full[..full.len() / 2], 0)
            .unwrap();
        assert_eq!(
            create_with_identity(&RealFs, &p, &A, Policy::PROBE).unwrap(),
            Claimed::Indeterminate(Unsettled::Empty)
        );
    }

    /// Catches: a crash between any two steps leaving a file that a
    /// re-drive takes for someone else's, or a reported win that a power
    /// loss undoes.
    #[test]
    fn crash_at_every_step_of_a_claim_converges() {
        let steps = {
            let d = tempfile::tempdir().unwrap();
            let fs = FaultFs::new();
            create_with_identity(&fs, &d.path().join("x"), &A, Policy::DURABLE).unwrap();
            fs.ops()
        };
        assert_eq!(steps, 4, "create, write, sync, sync_dir");
        let mut saw = std::collections::BTreeSet::new();
        for n in 1..=steps + 1 {
            let d = tempfile::tempdir().unwrap();
            let p = d.path().join("x");
            let fs = FaultFs::new();
            fs.crash_at(n);
            let first = create_with_identity(&fs, &p, &A, Policy::DURABLE);
            let crashed = fs.crashed();
            fs.power_loss();
            let on_disk = read_identity::<Me>(&RealFs, &p).unwrap();
            if !crashed {
                assert_eq!(first.as_ref().unwrap(), &Claimed::Won);
            }
            if let Ok(Claimed::Won) = first {
                assert_eq!(
                    on_disk,
                    Found::Identity(A.clone()),
                    "step {n}: a win not durable"
                );
            }
            // The same creator re-drives: never told someone else holds it.
            let again = create_with_identity(&RealFs, &p, &A, Policy::DURABLE).unwrap();
            let expect = match &on_disk {
                Found::Absent => Claimed::Won,
                Found::Empty => Claimed::Indeterminate(Unsettled::Empty),
                Found::Identity(_) => Claimed::Ours,
            };
            assert_eq!(again, expect, "step {n}: {:?}", fs.log());
            // And another creator never gets it once anybody holds it.
            let other = create_with_identity(&RealFs, &p, &B, Policy::DURABLE).unwrap();
            assert!(!other.is_ours(), "step {n}: two owners");
            saw.insert(format!("{on_disk:?}"));
        }
        assert_eq!(
            saw.len(),
            3,
            "absent, empty and written were all reached: {saw:?}"
        );
    }
}
