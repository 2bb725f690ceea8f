//! weakfs: a FUSE passthrough filesystem over a backing directory whose
//! substrate-contract behaviours can be switched off one at a time.
//!
//! With no [`Behaviours`] switched on it is a plain, honest passthrough:
//! every operation is forwarded to the same operation on the backing
//! directory. Each switch makes it weaker in one way that a real
//! filesystem is weaker, so tests can show that kaas notices (or copes):
//!
//! * [`Behaviours::rename_copy_delete`]: rename of a regular file is done the
//!   way object-store FUSE mounts (s3fs, gcsfuse, Mountpoint for S3) do it —
//!   the target is removed, a new file is created and the bytes are copied
//!   in, then the source is unlinked. Not atomic, not identity-preserving,
//!   and O(size).
//! * [`Behaviours::fsync_noop`]: fsync returns at once without touching the
//!   backing file — a substrate that lies about durability (an async NFS
//!   export, a write-back cache with no battery).
//! * [`Behaviours::attr_ttl`]: attribute and directory caching per mount
//!   ("host"), modelled on the Linux NFS client's `actimeo` (nfs(5), "Data and
//!   metadata coherence" / "acregmin ... acdirmax"). Zero by default, so every
//!   access revalidates. When non-zero, this filesystem caches each name's
//!   lookup and each directory's listing for that long, so a host can keep
//!   seeing a file another host replaced or removed, and a listing can miss
//!   files another host created. Changes made through this mount invalidate
//!   its own cache, as the NFS client does for its own operations. Opening a
//!   file by name revalidates it (close-to-open, nfs(5) "Close-to-open cache
//!   consistency"): `open` checks the name still holds the cached file and
//!   answers ESTALE otherwise, after which the kernel looks the name up again
//!   (uncached). The kernel itself caches nothing (entry/attr timeouts 0, and
//!   no `FOPEN_KEEP_CACHE`, so its page cache is dropped on open); getattr
//!   is always fresh.
//! * [`Behaviours::negative_lookup_cache`]: "no such file" answers are cached
//!   for `attr_ttl` too (nfs(5) `lookupcache=all`, the default; `positive`
//!   and `none` turn it off). A file another host creates stays invisible to
//!   a plain open on this host until the negative entry expires (as on
//!   Linux NFS, where a negative dentry stays valid while the cached
//!   directory attributes do) or until a listing fetched from the backing
//!   directory names the file (the client primes its dentries from
//!   READDIRPLUS); an `O_CREAT|O_EXCL` open still creates exclusively on
//!   the backing directory.
//! * [`Behaviours::silly_rename`]: unlinking (or renaming over) a file that
//!   is open through this mount renames it to `.nfsXXXXXXXXXXXXXXXXXXXXXXXX`
//!   in the same directory and removes it at the last close, as the Linux
//!   NFS client does (fs/nfs/unlink.c `nfs_sillyrename`; nfs(5) and the NFS
//!   FAQ, "silly rename"). Meanwhile the directory is not empty, so `rmdir`
//!   fails with ENOTEMPTY. The removal follows the close, it is not part of
//!   it: FUSE sends RELEASE after close(2) has returned, as the NFS client's
//!   silly delete is an asynchronous RPC (`nfs_async_unlink`).
//! * [`Behaviours::lost_reply_prob`]: with this probability (from a seeded
//!   generator, [`Behaviours::seed`]) a successful exclusive create, unlink,
//!   rmdir or rename is reported as failed — EEXIST for the create, ENOENT
//!   for the others — while its effect stays. This is what a client sees
//!   when a non-idempotent request's reply is lost and the retransmission
//!   finds the work already done (RFC 8881 section 2.10.6, "Exactly Once
//!   Semantics", describes the reply cache that v4.1 added because v3/v4.0
//!   servers behaved this way; Linux NFSv3 and soft mounts still do).
//! * [`Behaviours::cutoff_file`]: while that file (outside the mount) exists,
//!   every operation fails with EIO, like a host cut off from the volume
//!   (nfs(5) `soft` mount after `retrans` timeouts) while its processes keep
//!   running. Delete the file to heal. Cached attributes and page-cache data
//!   may still be served by the kernel, as with NFS.
//!
//! * [`Behaviours::write_back`]: data written through this mount is held
//!   in this process and reaches the backing file only when it is written
//!   back: at fsync/fdatasync (of any handle of the file), at close of a
//!   handle open for writing (FUSE `flush`/`release`), before any setattr of
//!   the file (truncate, chmod, utimes), or when more than
//!   [`WRITE_BACK_LIMIT`] is buffered for it (background writeback of dirty
//!   pages). This is the Linux NFS client's page cache: writes dirty pages
//!   of the inode and are sent to the server later (nfs(5), "Data and
//!   metadata coherence": "When the application closes the file, the NFS
//!   client writes back any pending changes to the file so that the next
//!   opener can view the changes"; fs/nfs/file.c `nfs_file_flush` writes
//!   back the whole inode, and only for files open for writing;
//!   `nfs_file_fsync`; fs/nfs/inode.c `nfs_setattr` writes back all dirty
//!   data before the SETATTR; RFC 7530 and RFC 8881 section 10.3, "Data
//!   Caching", on flushing at CLOSE). The buffer is per file (node), as
//!   the page cache is per inode: every handle of this mount reads its own
//!   buffered data (laid over the backing file's), and sizes reported by
//!   getattr and lookup include it. Other mounts see only what was written
//!   back, from their next open or getattr. A write-back while the host is
//!   cut off fails with EIO, and the buffered data is dropped: it never
//!   reaches the backing file, not even after healing. That is what a soft
//!   mount does when its WRITEs time out (nfs(5) `soft`: "silent data
//!   corruption"; fs/nfs/write.c records the error on the mapping and
//!   drops the request, and fsync/close report it). An O_APPEND write goes
//!   at the end this host sees (backing size, or its buffered data's end),
//!   as the NFS client revalidates the size and simulates the append
//!   (fs/nfs/file.c `nfs_file_write`; open(2), O_APPEND: "the client kernel
//!   has to simulate it"), so appends of two hosts can overwrite each other.
//!   Unlike the kernel, nothing is written back on a timer
//!   (`dirty_expire_centisecs`): data a paused process wrote stays buffered
//!   until it syncs or closes — a timing a real client can also produce.
//! * [`Behaviours::estale`]: a handle whose backing file another host has
//!   removed — unlinked it, or renamed another file over its name — answers
//!   ESTALE to read, write, fsync, setattr and getattr through the handle,
//!   to fstat (which the kernel sends as a getattr of the node: answered
//!   from a handle open here once the name no longer leads to the file), and
//!   to the write-back of its buffered data. Once the server frees a
//!   file its filehandle is stale: NFSv4 answers NFS4ERR_STALE (RFC 7530
//!   section 13.1.2.7, RFC 8881 section 15.1.2.7: "The file system object
//!   referred to by that filehandle no longer exists"), NFSv3 NFS3ERR_STALE,
//!   and the Linux client returns ESTALE to the caller (fs/nfs/nfs4xdr.c
//!   `nfs4_stat_to_errno`). Silly rename (above) exists because of this, and
//!   it only protects files the removing host has open. A removal made
//!   through this mount keeps this mount's handles valid: with silly rename
//!   the file was only renamed; without, this mount remembers which open
//!   files it removed, as on a local filesystem. (Detected from the backing
//!   file's link count, so a file removed from one of several hard links is
//!   not stale.)
//!
//! * [`Behaviours::no_close_to_open`]: with `attr_ttl`, the contents of a
//!   file read through this mount are cached by name for `attr_ttl` and
//!   served to later opens of that name without revalidation, and an open
//!   through a cached lookup does not check that the name still holds the
//!   cached file (no ESTALE, no fresh lookup). A file another host rewrote
//!   or renamed into place reads as the old content (or, when the kernel
//!   holds the new size, a mix or a short file) until the entry expires.
//!   This breaks guarantee 3 of the substrate contract on purpose: it is
//!   GlusterFS with its default volume options (quick-read, io-cache,
//!   open-behind; issue 28 saw the old content or a short file for 1–2 s
//!   after a close on the other mount), and an NFS client mounted `nocto`.
//!   Changes made through this mount drop its own entries.
//!
//! [`Behaviours::nfs`] switches on the NFS set: caching (3 s), negative
//! lookup caching, silly rename, lost replies, write-back and ESTALE.
//!
//! Each mount is one "host": run one weakfs process per broker over the same
//! backing directory to model several NFS clients of one export.
//!
//! Node ids stand for backing files, one per (inode number, birth time) (the
//! backing root is node 1), so a file that is replaced on the backing side —
//! by another weakfs mount of the same directory or by a copy+delete rename —
//! gets a new node id, as it would on a network filesystem, and a new file
//! that reuses a freed inode number is never mistaken for the old one.

#![allow(clippy::disallowed_methods)] // a test filesystem: it implements the writes the seam forbids elsewhere

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What the kernel may cache. Always zero: the kernel's own dentry cache
/// misbehaved with inode-number reuse, so every cache lives in this
/// filesystem, where a mount's own changes can invalidate it exactly.
const KERNEL_TTL: Duration = Duration::ZERO;

/// One cached directory listing: (node, kind, name) per entry.
type Listing = Vec<(u64, FileType, std::ffi::OsString)>;

/// Cached contents of one name: when read, from which node, the bytes.
type CachedContents = (Instant, u64, Arc<Vec<u8>>);

/// Which weaknesses are switched on. `Default` is an honest passthrough.
#[derive(Debug, Clone, Default)]
pub struct Behaviours {
    /// Rename regular files by remove-target, create, copy, unlink-source.
    pub rename_copy_delete: bool,
    /// Make fsync/fdatasync (and directory fsync) return at once.
    pub fsync_noop: bool,
    /// Attribute, lookup and directory-listing cache lifetime (`actimeo`).
    pub attr_ttl: Duration,
    /// Cache "no such file" lookups for `attr_ttl` (`lookupcache=all`).
    pub negative_lookup_cache: bool,
    /// Unlink of a file open on this mount renames it to `.nfs...`.
    pub silly_rename: bool,
    /// Probability that a successful exclusive create / unlink / rmdir /
    /// rename is reported as EEXIST / ENOENT.
    pub lost_reply_prob: f64,
    /// Seed for the lost-reply generator.
    pub seed: u64,
    /// While this file exists every operation fails with EIO.
    pub cutoff_file: Option<PathBuf>,
    /// Hold written data in this process until fsync, close or setattr
    /// (the NFS client's dirty pages); see the crate docs.
    pub write_back: bool,
    /// A handle to a file another host removed or replaced answers ESTALE.
    pub estale: bool,
    /// Serve file contents cached by name for `attr_ttl` on open, without
    /// revalidation (close-to-open broken; see the crate docs).
    pub no_close_to_open: bool,
}

impl Behaviours {
    /// The NFS preset: `actimeo` 3 s with negative lookup caching, silly
    /// rename, 1% lost replies from `seed`, write-back and ESTALE.
    pub fn nfs(seed: u64) -> Self {
        Self {
            attr_ttl: Duration::from_secs(3),
            negative_lookup_cache: true,
            silly_rename: true,
            lost_reply_prob: 0.01,
            seed,
            write_back: true,
            estale: true,
            ..Self::default()
        }
    }
}

/// Errors setting up a mount.
#[derive(Debug, thiserror::Error)]
pub enum WeakFsError {
    /// The backing directory is missing or not a directory.
    #[error("backing directory {path}: {source}")]
    Backing {
        /// The backing path.
        path: PathBuf,
        /// Why it is unusable.
        source: io::Error,
    },
    /// The kernel refused the FUSE mount (no /dev/fuse, no fusermount3,
    /// not permitted in this container, ...).
    #[error("cannot mount FUSE filesystem at {mountpoint}: {source}")]
    Mount {
        /// Where the mount was attempted.
        mountpoint: PathBuf,
        /// The error from fuser.
        source: io::Error,
    },
}

/// Chunk size for the copy in a copy+delete rename. Small on purpose so a
/// racing reader has many chances to see the target half-written.
const COPY_CHUNK: usize = 64 * 1024;

/// With [`Behaviours::write_back`], the most data buffered for one file
/// before it is written back without waiting for fsync or close, like the
/// kernel's background writeback of dirty pages.
pub const WRITE_BACK_LIMIT: usize = 4 << 20;

/// One open file of this mount.
struct Handle {
    file: File,
    /// The node (backing file) it is open on.
    node: u64,
    /// Opened for writing: its close writes back the node's buffered data.
    writable: bool,
    /// Opened with O_APPEND (write-back only; otherwise the backing file
    /// is opened with O_APPEND).
    append: bool,
}

/// Data written through this mount and not yet written back, for one node
/// ([`Behaviours::write_back`]).
#[derive(Default)]
struct Dirty {
    /// A handle open for writing on the node, to write back through.
    via: Option<Arc<Handle>>,
    /// (offset, bytes) in write order; a later extent wins where two
    /// overlap. Sequential writes extend the last extent.
    extents: Vec<(u64, Vec<u8>)>,
    /// Total length of `extents`.
    bytes: usize,
}

impl Dirty {
    /// One past the last buffered byte (0 if nothing is buffered).
    fn end(&self) -> u64 {
        self.extents
            .iter()
            .map(|(o, b)| o + b.len() as u64)
            .max()
            .unwrap_or(0)
    }

    fn push(&mut self, offset: u64, data: &[u8]) {
        self.bytes += data.len();
        if let Some((o, b)) = self.extents.last_mut() {
            if *o + b.len() as u64 == offset {
                b.extend_from_slice(data);
                return;
            }
        }
        self.extents.push((offset, data.to_vec()));
    }

    /// Lay the buffered data over `buf`, which holds the file from `offset`.
    fn overlay(&self, offset: u64, buf: &mut [u8]) {
        let end = offset + buf.len() as u64;
        for (o, b) in &self.extents {
            let (from, to) = ((*o).max(offset), (o + b.len() as u64).min(end));
            if from < to {
                buf[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&b[(from - o) as usize..(to - o) as usize]);
            }
        }
    }

    fn clear(&mut self) {
        self.extents.clear();
        self.bytes = 0;
        self.via = None;
    }
}

/// The filesystem. Construct with [`WeakFs::new`], then mount with
/// [`mount_background`] or [`mount_foreground`].
pub struct WeakFs {
    backing: PathBuf,
    behaviours: Behaviours,
    /// node id -> path relative to the backing root ("" is the root).
    paths: Mutex<HashMap<u64, PathBuf>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    /// node id -> data written through this mount, not yet written back.
    dirty: Mutex<HashMap<u64, Arc<Mutex<Dirty>>>>,
    /// Nodes open on this mount whose backing file this mount removed
    /// (unlink, rename over): their handles stay valid.
    removed_here: Mutex<HashSet<u64>>,
    next_fh: AtomicU64,
    root_ino: u64,
    /// node id -> number of open handles on this mount.
    open_count: Mutex<HashMap<u64, u32>>,
    /// node id -> backing path of its silly-renamed file.
    silly: Mutex<HashMap<u64, PathBuf>>,
    silly_seq: AtomicU64,
    /// backing-relative path -> when looked up, and what was found
    /// (`None`: no such file).
    lookup_cache: Mutex<HashMap<PathBuf, (Instant, Option<FileAttr>)>>,
    /// directory node id -> when listed, and the listing.
    dir_cache: Mutex<HashMap<u64, (Instant, Listing)>>,
    /// backing-relative path -> when read, from which node, and the whole
    /// file as read ([`Behaviours::no_close_to_open`]).
    data_cache: Mutex<HashMap<PathBuf, CachedContents>>,
    /// handle -> the cached contents it was opened on (or first read),
    /// served whole to it so that one read never mixes versions
    /// ([`Behaviours::no_close_to_open`]).
    pinned: Mutex<HashMap<u64, Arc<Vec<u8>>>>,
    /// Held for writing across a multi-step unlink/rename (silly rename
    /// first) and for reading by lookups, so this mount's own lookups never
    /// see the middle, as the kernel's directory lock ensures on a real
    /// client. Other mounts ("hosts") can see it, as on NFS.
    namespace: RwLock<()>,
    /// (backing inode number, birth time in ns) -> node id.
    ids: Mutex<HashMap<(u64, u128), u64>>,
    next_node: AtomicU64,
    /// splitmix64 state of the lost-reply generator.
    rng: Mutex<u64>,
}

impl WeakFs {
    /// A filesystem serving `backing` with the given behaviours.
    pub fn new(backing: &Path, behaviours: Behaviours) -> Result<Self, WeakFsError> {
        if behaviours.lost_reply_prob > 0.0
            || behaviours.silly_rename
            || behaviours.write_back
            || behaviours.estale
        {
            tracing::info!(?behaviours, "weakfs NFS behaviours on");
        }
        let backing = backing
            .canonicalize()
            .map_err(|source| WeakFsError::Backing {
                path: backing.to_path_buf(),
                source,
            })?;
        let meta = std::fs::metadata(&backing).map_err(|source| WeakFsError::Backing {
            path: backing.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(WeakFsError::Backing {
                path: backing,
                source: io::Error::new(io::ErrorKind::InvalidInput, "not a directory"),
            });
        }
        let mut paths = HashMap::new();
        paths.insert(INodeNo::ROOT.0, PathBuf::new());
        Ok(Self {
            backing,
            paths: Mutex::new(paths),
            handles: Mutex::new(HashMap::new()),
            dirty: Mutex::new(HashMap::new()),
            removed_here: Mutex::new(HashSet::new()),
            next_fh: AtomicU64::new(1),
            root_ino: meta.ino(),
            open_count: Mutex::new(HashMap::new()),
            silly: Mutex::new(HashMap::new()),
            silly_seq: AtomicU64::new(0),
            dir_cache: Mutex::new(HashMap::new()),
            data_cache: Mutex::new(HashMap::new()),
            pinned: Mutex::new(HashMap::new()),
            lookup_cache: Mutex::new(HashMap::new()),
            namespace: RwLock::new(()),
            ids: Mutex::new(HashMap::new()),
            next_node: AtomicU64::new(INodeNo::ROOT.0 + 1),
            rng: Mutex::new(behaviours.seed),
            behaviours,
        })
    }

    /// Is this host cut off from the volume?
    fn cut_off(&self) -> bool {
        self.behaviours
            .cutoff_file
            .as_ref()
            .is_some_and(|p| p.exists())
    }

    /// Should the reply to this successful operation be "lost"?
    fn lose_reply(&self, what: &str, rel: &Path) -> bool {
        if self.behaviours.lost_reply_prob <= 0.0 {
            return false;
        }
        let Ok(mut state) = self.rng.lock() else {
            return false;
        };
        // splitmix64
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let lost = ((z >> 11) as f64 / (1u64 << 53) as f64) < self.behaviours.lost_reply_prob;
        if lost {
            tracing::info!(op = what, path = %rel.display(), "weakfs: losing the reply of a successful operation");
        }
        lost
    }

    /// This mount changed directory `parent`: drop its cached listing.
    fn dir_changed(&self, parent: INodeNo) {
        if let Ok(mut c) = self.dir_cache.lock() {
            c.remove(&parent.0);
        }
    }

    /// This mount changed what `rel` (and anything under it) names.
    /// A create (mkdir, O_CREAT open) reached the server and failed. A
    /// create-intent lookup does not revalidate a negative entry, but the
    /// failed create drops it (Linux fs/nfs/dir.c: `nfs_mkdir` and the
    /// create paths `d_drop` the dentry on error), so after an EEXIST this
    /// host looks the name up afresh.
    fn create_failed(&self, rel: &Path, e: std::io::Error) -> Errno {
        if e.raw_os_error() == Some(nix::libc::EEXIST) {
            self.name_changed(rel);
        }
        errno(e)
    }

    /// A listing of `dir` fetched from the server replaces this mount's
    /// negative entries for the names it returned, as the Linux NFS client
    /// does (fs/nfs/dir.c `nfs_prime_dcache` invalidates a negative dentry
    /// for each entry a READDIRPLUS reply names; and a directory whose
    /// change attribute moved fails the verifier check of every negative
    /// dentry under it). Without this a host could list a file and then be
    /// told it does not exist for a whole attribute timeout — weaker than
    /// the client this models. Positive entries and names the listing does
    /// not return are left as cached.
    fn prime_lookups(&self, dir: INodeNo, entries: &Listing) {
        let Ok(rel) = self.rel_path(dir) else { return };
        if let Ok(mut c) = self.lookup_cache.lock() {
            for (_, _, name) in entries {
                let child = rel.join(name);
                if matches!(c.get(&child), Some((_, None))) {
                    c.remove(&child);
                }
            }
        }
    }

    fn name_changed(&self, rel: &Path) {
        if let Ok(mut c) = self.lookup_cache.lock() {
            c.retain(|p, _| !p.starts_with(rel));
        }
        if let Ok(mut c) = self.data_cache.lock() {
            c.retain(|p, _| !p.starts_with(rel));
        }
    }

    /// Fresh contents cached for `rel` as read from `node`.
    fn cached_contents(&self, rel: &Path, node: u64) -> Option<Arc<Vec<u8>>> {
        let ttl = self.behaviours.attr_ttl;
        self.data_cache.lock().ok().and_then(|c| {
            c.get(rel)
                .filter(|(at, n, _)| at.elapsed() < ttl && *n == node)
                .map(|(_, _, b)| b.clone())
        })
    }

    /// Whether this mount's lookup cache holds a fresh entry naming node
    /// `ino` at `rel` (a stale one, when the name now holds another file).
    fn cached_lookup_is(&self, rel: &Path, ino: INodeNo) -> bool {
        self.lookup_cache.lock().ok().is_some_and(|c| {
            c.get(rel).is_some_and(|(at, a)| {
                at.elapsed() < self.behaviours.attr_ttl && a.is_some_and(|a| a.ino == ino)
            })
        })
    }

    /// This mount wrote to `node`: drop its cached contents.
    fn data_changed(&self, node: u64) {
        if !self.behaviours.no_close_to_open {
            return;
        }
        if let Ok(rel) = self.rel_path(INodeNo(node)) {
            if let Ok(mut c) = self.data_cache.lock() {
                c.remove(&rel);
            }
        }
    }

    /// [`Behaviours::no_close_to_open`]: the contents cached for the name
    /// `h` was opened by, read whole (up to a bound) on a miss. `None`:
    /// serve from the file.
    fn cached_data(&self, h: &Handle) -> Result<Option<Arc<Vec<u8>>>, Errno> {
        const MAX: u64 = 16 << 20;
        let ttl = self.behaviours.attr_ttl;
        if !self.behaviours.no_close_to_open || ttl.is_zero() || h.writable {
            return Ok(None);
        }
        let rel = self.rel_path(INodeNo(h.node))?;
        // Only for the node the entry was read from: a handle opened
        // through a fresh lookup (this mount's own change dropped the
        // stale one) reads the file it opened, as a client does for its
        // own changes. A handle opened through a stale lookup is the
        // violation: its node is the old one.
        if let Some(hit) = self.cached_contents(&rel, h.node) {
            return Ok(Some(hit));
        }
        let meta = h.file.metadata().map_err(errno)?;
        // Fill only from the file the handle's node stands for.
        if meta.len() > MAX || self.node_of(&meta) != h.node {
            return Ok(None);
        }
        let len = meta.len();
        let mut buf = vec![0u8; len as usize];
        let mut got = 0;
        while got < buf.len() {
            match h.file.read_at(&mut buf[got..], got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => return Err(errno(e)),
            }
        }
        buf.truncate(got);
        let bytes = Arc::new(buf);
        if let Ok(mut c) = self.data_cache.lock() {
            c.insert(rel, (Instant::now(), h.node, bytes.clone()));
        }
        Ok(Some(bytes))
    }

    /// How many handles of this mount are open on `node`.
    fn open_handles(&self, node: u64) -> Result<u32, Errno> {
        Ok(self
            .open_count
            .lock()
            .map_err(|_| Errno::EIO)?
            .get(&node)
            .copied()
            .unwrap_or(0))
    }

    /// This mount is about to remove the backing file of `node` (unlink,
    /// rename over it): handles open on it here stay valid ([`Behaviours::estale`]).
    fn removing(&self, node: u64) -> Result<(), Errno> {
        if self.behaviours.estale && self.open_handles(node)? > 0 {
            self.removed_here
                .lock()
                .map_err(|_| Errno::EIO)?
                .insert(node);
        }
        Ok(())
    }

    /// ESTALE if `h`'s backing file was removed by another host
    /// ([`Behaviours::estale`]).
    fn check_stale(&self, h: &Handle) -> Result<(), Errno> {
        if !self.behaviours.estale {
            return Ok(());
        }
        if h.file.metadata().map_err(errno)?.nlink() == 0
            && !self
                .removed_here
                .lock()
                .map_err(|_| Errno::EIO)?
                .contains(&h.node)
        {
            tracing::debug!(
                node = h.node,
                "weakfs: stale handle (file removed by another host)"
            );
            return Err(Errno::ESTALE);
        }
        Ok(())
    }

    /// `node`'s buffered data, if any ([`Behaviours::write_back`]).
    fn dirty(&self, node: u64) -> Option<Arc<Mutex<Dirty>>> {
        if !self.behaviours.write_back {
            return None;
        }
        self.dirty.lock().ok()?.get(&node).cloned()
    }

    /// Report the size of `attr`'s node including data buffered here.
    fn with_buffered_size(&self, mut attr: FileAttr) -> FileAttr {
        if let Some(d) = self.dirty(attr.ino.0) {
            if let Ok(d) = d.lock() {
                attr.size = attr.size.max(d.end());
            }
        }
        attr
    }

    /// Write back `node`'s buffered data (without syncing it).
    fn write_back(&self, node: u64) -> Result<(), Errno> {
        let Some(d) = self.dirty(node) else {
            return Ok(());
        };
        let mut d = d.lock().map_err(|_| Errno::EIO)?;
        self.write_back_locked(node, &mut d)
    }

    /// Write back the buffer `d` of `node`. If the host is cut off (EIO),
    /// the file is stale (ESTALE) or the backing write fails, the data is
    /// dropped and the error returned: a failed NFS write-back loses it.
    fn write_back_locked(&self, node: u64, d: &mut Dirty) -> Result<(), Errno> {
        if d.extents.is_empty() {
            return Ok(());
        }
        let res = (|| {
            if self.cut_off() {
                return Err(Errno::EIO);
            }
            let via = d.via.clone().ok_or(Errno::EIO)?;
            self.check_stale(&via)?;
            for (offset, bytes) in &d.extents {
                via.file.write_all_at(bytes, *offset).map_err(errno)?;
            }
            Ok(())
        })();
        if let Err(e) = res {
            tracing::warn!(node, bytes = d.bytes, error = ?e, "weakfs: write-back failed, buffered data dropped");
        }
        d.clear();
        res
    }

    /// Unlink `rel`, or silly-rename it if it is open on this mount.
    fn remove_or_silly_rename(&self, rel: &Path) -> Result<(), Errno> {
        let path = self.full(rel);
        if self.behaviours.silly_rename || self.behaviours.estale {
            let meta = std::fs::symlink_metadata(&path).map_err(errno)?;
            let node = self.node_of(&meta);
            let open = self.open_handles(node)?;
            if self.behaviours.silly_rename && open > 0 && meta.is_file() {
                let seq = self.silly_seq.fetch_add(1, Ordering::Relaxed);
                let name = format!(".nfs{:016x}{:08x}", meta.ino(), seq as u32);
                let silly_rel = rel.with_file_name(name);
                std::fs::rename(&path, self.full(&silly_rel)).map_err(errno)?;
                self.name_changed(rel);
                tracing::debug!(from = %rel.display(), to = %silly_rel.display(), "silly rename");
                self.paths
                    .lock()
                    .map_err(|_| Errno::EIO)?
                    .insert(node, silly_rel.clone());
                self.silly
                    .lock()
                    .map_err(|_| Errno::EIO)?
                    .insert(node, silly_rel);
                return Ok(());
            }
            self.removing(node)?;
        }
        std::fs::remove_file(&path).map_err(errno)
    }

    /// The node id of a backing file: one per (inode number, birth time),
    /// so a file that reuses a freed inode number is a different node.
    fn node_of(&self, meta: &std::fs::Metadata) -> u64 {
        if meta.ino() == self.root_ino {
            return INodeNo::ROOT.0;
        }
        let birth = meta
            .created()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        match self.ids.lock() {
            Ok(mut ids) => *ids
                .entry((meta.ino(), birth))
                .or_insert_with(|| self.next_node.fetch_add(1, Ordering::Relaxed)),
            Err(_) => 1 << 63 | meta.ino(),
        }
    }

    fn rel_path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.paths
            .lock()
            .map_err(|_| Errno::EIO)?
            .get(&ino.0)
            .cloned()
            .ok_or(Errno::ESTALE)
    }

    fn full(&self, rel: &Path) -> PathBuf {
        self.backing.join(rel)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.rel_path(parent)?.join(name))
    }

    /// lstat the backing path, remember node id -> path, and build the attr.
    fn entry_attr(&self, rel: &Path) -> Result<FileAttr, Errno> {
        let meta = std::fs::symlink_metadata(self.full(rel)).map_err(errno)?;
        let node = self.node_of(&meta);
        self.paths
            .lock()
            .map_err(|_| Errno::EIO)?
            .insert(node, rel.to_path_buf());
        Ok(attr_of(node, &meta))
    }

    fn attr_of_node(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let rel = self.rel_path(ino)?;
        let found = std::fs::symlink_metadata(self.full(&rel));
        let gone = match found {
            Ok(meta) if self.node_of(&meta) == ino.0 => return Ok(attr_of(ino.0, &meta)),
            // No close-to-open: the attributes cached with the stale
            // lookup are served (as GlusterFS's md-cache does).
            Ok(_) if self.behaviours.no_close_to_open => {
                let cached = self.lookup_cache.lock().ok().and_then(|c| {
                    c.get(&rel)
                        .filter(|(at, _)| at.elapsed() < self.behaviours.attr_ttl)
                        .and_then(|(_, a)| *a)
                        .filter(|a| a.ino == ino)
                });
                match cached {
                    Some(a) => return Ok(a),
                    None => Errno::ESTALE,
                }
            }
            // The name now holds a different file.
            Ok(_) => Errno::ESTALE,
            Err(e) => errno(e),
        };
        if self.behaviours.estale {
            // The kernel sends fstat(2) as a getattr without a handle. NFS
            // answers it by filehandle: a file renamed or removed by this
            // host, or renamed by another, is still there; one another
            // host removed is stale.
            let open = self
                .handles
                .lock()
                .map_err(|_| Errno::EIO)?
                .values()
                .find(|h| h.node == ino.0)
                .cloned();
            if let Some(h) = open {
                self.check_stale(&h)?;
                return h.file.metadata().map(|m| attr_of(ino.0, &m)).map_err(errno);
            }
        }
        Err(gone)
    }

    fn add_handle(&self, file: File, node: u64, flags: i32) -> Result<u64, Errno> {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().map_err(|_| Errno::EIO)?.insert(
            fh,
            Arc::new(Handle {
                file,
                node,
                writable: flags & nix::libc::O_ACCMODE != nix::libc::O_RDONLY,
                append: flags & nix::libc::O_APPEND != 0,
            }),
        );
        *self
            .open_count
            .lock()
            .map_err(|_| Errno::EIO)?
            .entry(node)
            .or_insert(0) += 1;
        Ok(fh)
    }

    /// Forget handle `fh`; at the last close of a silly-renamed file,
    /// remove it.
    fn drop_handle(&self, fh: u64) {
        if let Ok(mut p) = self.pinned.lock() {
            p.remove(&fh);
        }
        let Some(handle) = self.handles.lock().ok().and_then(|mut h| h.remove(&fh)) else {
            return;
        };
        let node = handle.node;
        drop(handle);
        let last = match self.open_count.lock() {
            Ok(mut c) => match c.get_mut(&node) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                _ => {
                    c.remove(&node);
                    true
                }
            },
            Err(_) => false,
        };
        if last {
            if let Some(d) = self.dirty.lock().ok().and_then(|mut d| d.remove(&node)) {
                // Written back by the flush/release of each writable handle.
                if let Ok(d) = d.lock() {
                    if !d.extents.is_empty() {
                        tracing::warn!(
                            node,
                            bytes = d.bytes,
                            "weakfs: buffered data left at last close, dropped"
                        );
                    }
                }
            }
            if let Ok(mut r) = self.removed_here.lock() {
                r.remove(&node);
            }
            let silly = self.silly.lock().ok().and_then(|mut s| s.remove(&node));
            if let Some(rel) = silly {
                if let Err(e) = std::fs::remove_file(self.full(&rel)) {
                    tracing::warn!(path = %rel.display(), error = %e, "removing silly-renamed file");
                }
                if let Some(parent) = rel.parent() {
                    // The listing changed under this mount.
                    let parent = parent.to_path_buf();
                    if let (Ok(paths), Ok(mut cache)) = (self.paths.lock(), self.dir_cache.lock()) {
                        for (n, p) in paths.iter() {
                            if *p == parent {
                                cache.remove(n);
                            }
                        }
                    }
                }
            }
        }
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        self.handles
            .lock()
            .map_err(|_| Errno::EIO)?
            .get(&fh.0)
            .cloned()
            .ok_or(Errno::EBADF)
    }

    fn rename_copy_delete(&self, from: &Path, to: &Path) -> io::Result<()> {
        let src = File::open(from)?;
        match std::fs::remove_file(to) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mode = src.metadata()?.permissions().mode();
        let dst = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode & 0o7777)
            .open(to)?;
        let mut buf = vec![0u8; COPY_CHUNK];
        let mut pos = 0u64;
        loop {
            let n = src.read_at(&mut buf, pos)?;
            if n == 0 {
                break;
            }
            dst.write_all_at(&buf[..n], pos)?;
            pos += n as u64;
        }
        // An object store copies at network speed, not page-cache speed:
        // charge ~1 ms per MiB (1 GiB/s) so the O(size) cost shows on a
        // fast local disk too.
        std::thread::sleep(Duration::from_micros(pos / 1024));
        std::fs::remove_file(from)
    }

    /// After a rename of a directory, rewrite the remembered paths under it.
    fn move_paths(&self, from: &Path, to: &Path) {
        if let Ok(mut paths) = self.paths.lock() {
            for p in paths.values_mut() {
                if let Ok(rest) = p.strip_prefix(from) {
                    *p = to.join(rest);
                }
            }
        }
    }

    fn open_options(&self, flags: i32) -> OpenOptions {
        let mut o = OpenOptions::new();
        match flags & nix::libc::O_ACCMODE {
            nix::libc::O_WRONLY => o.write(true),
            nix::libc::O_RDWR => o.read(true).write(true),
            _ => o.read(true),
        };
        // With write-back, appends are placed by `write` (the buffer is
        // written back with positional writes).
        if flags & nix::libc::O_APPEND != 0 && !self.behaviours.write_back {
            o.append(true);
        }
        if flags & nix::libc::O_TRUNC != 0 {
            o.truncate(true);
        }
        o
    }
}

/// Fail the operation with EIO while the host is cut off.
macro_rules! check_cut {
    ($fs:expr, $reply:expr) => {
        if $fs.cut_off() {
            $reply.error(Errno::EIO);
            return;
        }
    };
}

fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

fn system_time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs.clamp(0, 999_999_999) as u32)
    } else {
        UNIX_EPOCH
    }
}

fn attr_of(node: u64, m: &std::fs::Metadata) -> FileAttr {
    let ft = m.file_type();
    let kind = FileType::from_std(ft).unwrap_or(FileType::RegularFile);
    FileAttr {
        ino: INodeNo(node),
        size: m.size(),
        blocks: m.blocks(),
        atime: system_time(m.atime(), m.atime_nsec()),
        mtime: system_time(m.mtime(), m.mtime_nsec()),
        ctime: system_time(m.ctime(), m.ctime_nsec()),
        crtime: system_time(m.ctime(), m.ctime_nsec()),
        kind,
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: m.blksize() as u32,
        flags: 0,
    }
}

fn to_system_time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

impl Filesystem for WeakFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        check_cut!(self, reply);
        let ttl = self.behaviours.attr_ttl;
        let _ns = self.namespace.read();
        let res = self.child(parent, name).and_then(|rel| {
            if !ttl.is_zero() {
                let hit = self.lookup_cache.lock().ok().and_then(|c| {
                    c.get(&rel)
                        .filter(|(at, _)| at.elapsed() < ttl)
                        .map(|(_, a)| *a)
                });
                if let Some(cached) = hit {
                    return cached.ok_or(Errno::ENOENT);
                }
            }
            let res = self.entry_attr(&rel);
            if !ttl.is_zero() {
                let cached = match &res {
                    Ok(attr) => Some(Some(*attr)),
                    Err(Errno::ENOENT) if self.behaviours.negative_lookup_cache => Some(None),
                    Err(_) => None,
                };
                if let (Some(c), Ok(mut cache)) = (cached, self.lookup_cache.lock()) {
                    cache.insert(rel, (Instant::now(), c));
                }
            }
            res
        });
        match res.map(|a| self.with_buffered_size(a)) {
            Ok(attr) => reply.entry(&KERNEL_TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        check_cut!(self, reply);
        let ttl = KERNEL_TTL;
        let res = match fh {
            // An open handle keeps its file alive even after unlink/replace.
            Some(fh) => self.handle(fh).and_then(|h| {
                self.check_stale(&h)?;
                h.file.metadata().map(|m| attr_of(ino.0, &m)).map_err(errno)
            }),
            None => self.attr_of_node(ino),
        };
        match res.map(|a| self.with_buffered_size(a)) {
            Ok(attr) => reply.attr(&ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        check_cut!(self, reply);
        let ttl = KERNEL_TTL;
        let res = (|| -> Result<FileAttr, Errno> {
            let handle = fh.map(|fh| self.handle(fh)).transpose()?;
            if let Some(h) = &handle {
                self.check_stale(h)?;
            }
            // The NFS client writes back dirty data before any SETATTR
            // (nfs_setattr), so a truncate applies to the written data.
            self.write_back(ino.0)?;
            self.data_changed(ino.0);
            let rel = self.rel_path(ino)?;
            let path = self.full(&rel);
            if let Some(mode) = mode {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(errno)?;
            }
            if let Some(size) = size {
                match &handle {
                    Some(h) => h.file.set_len(size).map_err(errno)?,
                    None => OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .and_then(|f| f.set_len(size))
                        .map_err(errno)?,
                }
            }
            if atime.is_some() || mtime.is_some() {
                let mut times = std::fs::FileTimes::new();
                if let Some(a) = atime {
                    times = times.set_accessed(to_system_time(a));
                }
                if let Some(m) = mtime {
                    times = times.set_modified(to_system_time(m));
                }
                // Best effort on directories, which cannot be opened for write.
                if let Ok(f) = File::options().write(true).open(&path) {
                    f.set_times(times).map_err(errno)?;
                }
            }
            self.attr_of_node(ino)
        })();
        match res.map(|a| self.with_buffered_size(a)) {
            Ok(attr) => reply.attr(&ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        check_cut!(self, reply);
        let ttl = KERNEL_TTL;
        let res = self.child(parent, name).and_then(|rel| {
            let path = self.full(&rel);
            std::fs::create_dir(&path).map_err(|e| self.create_failed(&rel, e))?;
            std::fs::set_permissions(
                &path,
                std::fs::Permissions::from_mode(mode & !umask & 0o7777),
            )
            .map_err(errno)?;
            self.dir_changed(parent);
            self.name_changed(&rel);
            self.entry_attr(&rel)
        });
        match res {
            Ok(attr) => reply.entry(&ttl, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        check_cut!(self, reply);
        let _ns = self.namespace.write();
        let res = self.child(parent, name).and_then(|rel| {
            self.remove_or_silly_rename(&rel)?;
            self.dir_changed(parent);
            self.name_changed(&rel);
            if self.lose_reply("unlink", &rel) {
                return Err(Errno::ENOENT);
            }
            Ok(())
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        check_cut!(self, reply);
        let res = self.child(parent, name).and_then(|rel| {
            std::fs::remove_dir(self.full(&rel)).map_err(errno)?;
            self.dir_changed(parent);
            self.name_changed(&rel);
            if self.lose_reply("rmdir", &rel) {
                return Err(Errno::ENOENT);
            }
            Ok(())
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        check_cut!(self, reply);
        if !flags.is_empty() {
            // RENAME_NOREPLACE / RENAME_EXCHANGE: callers fall back to rename(2).
            reply.error(Errno::EINVAL);
            return;
        }
        let _ns = self.namespace.write();
        let res = (|| -> Result<(), Errno> {
            let from_rel = self.child(parent, name)?;
            let to_rel = self.child(newparent, newname)?;
            let (from, to) = (self.full(&from_rel), self.full(&to_rel));
            let is_file = std::fs::symlink_metadata(&from)
                .map_err(errno)?
                .file_type()
                .is_file();
            if self.behaviours.silly_rename
                && std::fs::symlink_metadata(&to).is_ok_and(|m| m.is_file())
            {
                // Renaming over a file open here: the client silly-renames
                // the target first (nfs_rename -> nfs_sillyrename).
                let node = std::fs::symlink_metadata(&to)
                    .map(|m| self.node_of(&m))
                    .map_err(errno)?;
                let open = self
                    .open_count
                    .lock()
                    .map_err(|_| Errno::EIO)?
                    .get(&node)
                    .copied()
                    .unwrap_or(0);
                if open > 0 {
                    self.remove_or_silly_rename(&to_rel)?;
                }
            }
            if self.behaviours.estale {
                // Handles here on a file this rename removes stay valid.
                if let Ok(m) = std::fs::symlink_metadata(&to) {
                    if m.is_file() {
                        self.removing(self.node_of(&m))?;
                    }
                }
                if self.behaviours.rename_copy_delete && is_file {
                    // The source file is copied, then unlinked.
                    let m = std::fs::symlink_metadata(&from).map_err(errno)?;
                    self.removing(self.node_of(&m))?;
                }
            }
            if self.behaviours.rename_copy_delete && is_file {
                self.rename_copy_delete(&from, &to).map_err(errno)?;
                tracing::debug!(from = %from.display(), to = %to.display(), "rename as copy+delete");
            } else {
                std::fs::rename(&from, &to).map_err(errno)?;
                self.move_paths(&from_rel, &to_rel);
            }
            self.dir_changed(parent);
            self.dir_changed(newparent);
            self.name_changed(&from_rel);
            self.name_changed(&to_rel);
            if self.lose_reply("rename", &from_rel) {
                return Err(Errno::ENOENT);
            }
            Ok(())
        })();
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        check_cut!(self, reply);
        let res = self.rel_path(ino).and_then(|rel| {
            let f = self
                .open_options(flags.0)
                .open(self.full(&rel))
                .map_err(|e| match errno(e) {
                    // The file this node stood for is gone (removed, or a
                    // silly-renamed file closed): a stale handle, as NFS
                    // says. The kernel then looks the name up again.
                    Errno::ENOENT => {
                        self.name_changed(&rel);
                        Errno::ESTALE
                    }
                    e => e,
                })?;
            // The name may have been renamed over since the kernel looked it
            // up: opening by path would then hand out a different file under
            // this node id. Say so, as NFS would; the kernel looks up again.
            // No close-to-open: a read-only open serves the contents
            // cached for this name and node, if any, without asking
            // whether the name still holds that file.
            let pin = self
                .behaviours
                .no_close_to_open
                .then(|| self.cached_contents(&rel, ino.0))
                .flatten()
                .filter(|_| flags.0 & nix::libc::O_ACCMODE == nix::libc::O_RDONLY);
            if self.node_of(&f.metadata().map_err(errno)?) != ino.0
                && !(pin.is_some() && self.cached_lookup_is(&rel, ino))
            {
                // Close-to-open: the cached lookup was stale; look up afresh.
                self.name_changed(&rel);
                return Err(Errno::ESTALE);
            }
            let fh = self.add_handle(f, ino.0, flags.0)?;
            if let (Some(pin), Ok(mut p)) = (pin, self.pinned.lock()) {
                p.insert(fh, pin);
            }
            Ok(fh)
        });
        match res {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        check_cut!(self, reply);
        let res = self.handle(fh).and_then(|h| {
            self.check_stale(&h)?;
            let pinned = self.pinned.lock().ok().and_then(|p| p.get(&fh.0).cloned());
            let cached = match pinned {
                Some(b) => Some(b),
                None => {
                    let b = self.cached_data(&h)?;
                    if let (Some(b), Ok(mut p)) = (&b, self.pinned.lock()) {
                        p.insert(fh.0, b.clone());
                    }
                    b
                }
            };
            if let Some(bytes) = cached {
                let from = (offset as usize).min(bytes.len());
                let to = from.saturating_add(size as usize).min(bytes.len());
                return Ok(bytes[from..to].to_vec());
            }
            // Hold the buffer (if any) so a write-back cannot run between
            // reading the backing file and laying the buffer over it.
            let dirty = self.dirty(h.node);
            let dirty = match &dirty {
                Some(d) => Some(d.lock().map_err(|_| Errno::EIO)?),
                None => None,
            };
            let dirty = dirty.as_deref().filter(|d| !d.extents.is_empty());
            let want = match dirty {
                Some(d) => {
                    let len = h.file.metadata().map_err(errno)?.len().max(d.end());
                    len.saturating_sub(offset).min(u64::from(size)) as usize
                }
                None => size as usize,
            };
            let mut buf = vec![0u8; want];
            let mut got = 0;
            while got < buf.len() {
                match h.file.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) => return Err(errno(e)),
                }
            }
            match dirty {
                // Past the backing file's end: zeros (a hole) or buffered data.
                Some(d) => d.overlay(offset, &mut buf),
                None => buf.truncate(got),
            }
            Ok(buf)
        });
        match res {
            Ok(buf) => reply.data(&buf),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        check_cut!(self, reply);
        let res = self.handle(fh).and_then(|h| {
            self.check_stale(&h)?;
            self.data_changed(h.node);
            if !self.behaviours.write_back {
                return h.file.write_all_at(data, offset).map_err(errno);
            }
            let d = self
                .dirty
                .lock()
                .map_err(|_| Errno::EIO)?
                .entry(h.node)
                .or_default()
                .clone();
            let mut d = d.lock().map_err(|_| Errno::EIO)?;
            // O_APPEND: the kernel's offset comes from its cached size,
            // which a cached lookup may have made stale. The NFS client
            // revalidates the size before an append (nfs_file_write ->
            // nfs_revalidate_file_size) and writes at the end it finds,
            // this host's buffered data included; not atomically.
            let offset = if h.append {
                h.file.metadata().map_err(errno)?.len().max(d.end())
            } else {
                offset
            };
            if d.via.is_none() {
                d.via = Some(h.clone());
            }
            d.push(offset, data);
            if d.bytes > WRITE_BACK_LIMIT {
                // Background writeback of dirty pages.
                self.write_back_locked(h.node, &mut d)?;
            }
            Ok(())
        });
        match res {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2): a handle open for writing writes back the file's
        // buffered data (nfs_file_flush), and reports a failure.
        let res = self.handle(fh).and_then(|h| {
            if h.writable {
                self.write_back(h.node)?;
            }
            if self.cut_off() {
                return Err(Errno::EIO);
            }
            Ok(())
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Normally written back by the flush of the last close already.
        if let Ok(h) = self.handle(fh) {
            if h.writable {
                if let Err(e) = self.write_back(h.node) {
                    tracing::debug!(node = h.node, error = ?e, "weakfs: write-back at release failed");
                }
            }
        }
        self.drop_handle(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let res = self.handle(fh).and_then(|h| {
            // Before the cut-off check: a write-back while cut off drops
            // the buffered data.
            self.write_back(h.node)?;
            if self.cut_off() {
                return Err(Errno::EIO);
            }
            self.check_stale(&h)?;
            if self.behaviours.fsync_noop {
                return Ok(());
            }
            if datasync {
                h.file.sync_data().map_err(errno)
            } else {
                h.file.sync_all().map_err(errno)
            }
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        check_cut!(self, reply);
        let ttl = self.behaviours.attr_ttl;
        if !ttl.is_zero() {
            let cached = self.dir_cache.lock().ok().and_then(|c| {
                c.get(&ino.0)
                    .filter(|(at, _)| at.elapsed() < ttl)
                    .map(|(_, l)| l.clone())
            });
            if let Some(entries) = cached {
                for (i, (node, kind, name)) in entries.into_iter().enumerate().skip(offset as usize)
                {
                    if reply.add(INodeNo(node), (i + 1) as u64, kind, &name) {
                        break;
                    }
                }
                reply.ok();
                return;
            }
        }
        let res = (|| -> Result<Listing, Errno> {
            let rel = self.rel_path(ino)?;
            let mut out = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ino.0, FileType::Directory, "..".into()),
            ];
            for e in std::fs::read_dir(self.full(&rel)).map_err(errno)? {
                let e = e.map_err(errno)?;
                let Ok(m) = e.metadata() else { continue };
                let kind = FileType::from_std(m.file_type()).unwrap_or(FileType::RegularFile);
                out.push((self.node_of(&m), kind, e.file_name()));
            }
            Ok(out)
        })();
        match res {
            Ok(entries) => {
                if !ttl.is_zero() {
                    if let Ok(mut c) = self.dir_cache.lock() {
                        c.insert(ino.0, (Instant::now(), entries.clone()));
                    }
                    self.prime_lookups(ino, &entries);
                }
                for (i, (node, kind, name)) in entries.into_iter().enumerate().skip(offset as usize)
                {
                    if reply.add(INodeNo(node), (i + 1) as u64, kind, &name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        check_cut!(self, reply);
        if self.behaviours.fsync_noop {
            reply.ok();
            return;
        }
        let res = self.rel_path(ino).and_then(|rel| {
            File::open(self.full(&rel))
                .and_then(|d| d.sync_all())
                .map_err(errno)
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        check_cut!(self, reply);
        match nix::sys::statvfs::statvfs(&self.backing) {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                s.block_size() as u32,
                s.name_max() as u32,
                s.fragment_size() as u32,
            ),
            Err(e) => reply.error(Errno::from_i32(e as i32)),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        check_cut!(self, reply);
        let ttl = KERNEL_TTL;
        let res = (|| -> Result<(FileAttr, u64), Errno> {
            let rel = self.child(parent, name)?;
            let mut o = self.open_options(flags);
            if flags & nix::libc::O_ACCMODE == nix::libc::O_RDONLY {
                // Creating needs write access on the backing side.
                o.write(true);
            }
            if flags & nix::libc::O_EXCL != 0 {
                o.create_new(true);
            } else {
                o.create(true);
            }
            o.mode(mode & !umask & 0o7777);
            let f = o
                .open(self.full(&rel))
                .map_err(|e| self.create_failed(&rel, e))?;
            self.dir_changed(parent);
            self.name_changed(&rel);
            if flags & nix::libc::O_EXCL != 0 && self.lose_reply("exclusive create", &rel) {
                return Err(Errno::EEXIST);
            }
            let attr = self.entry_attr(&rel)?;
            let fh = self.add_handle(f, attr.ino.0, flags)?;
            Ok((attr, fh))
        })();
        match res {
            Ok((attr, fh)) => reply.created(
                &ttl,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }
}

/// FUSE mount configuration shared by the background and foreground mounts.
fn config(auto_unmount: bool) -> Config {
    let mut cfg = Config::default();
    cfg.mount_options.push(MountOption::FSName("weakfs".into()));
    cfg.mount_options
        .push(MountOption::Subtype("weakfs".into()));
    cfg.mount_options.push(MountOption::RW);
    if auto_unmount {
        cfg.mount_options.push(MountOption::AutoUnmount);
        cfg.acl = fuser::SessionACL::RootAndOwner;
    }
    cfg.n_threads = Some(4);
    cfg
}

/// A mounted weakfs, served by background threads; unmounted on drop.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
}

impl Mounted {
    /// Where the filesystem is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmount and wait for the serving threads to finish.
    pub fn unmount(mut self) -> io::Result<()> {
        match self.session.take() {
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            if let Err(e) = s.umount_and_join() {
                tracing::warn!(mountpoint = %self.mountpoint.display(), error = %e, "weakfs unmount failed");
            }
        }
    }
}

/// Mount `backing` at `mountpoint` in this process, served by background
/// threads until the returned guard is dropped.
pub fn mount_background(
    backing: &Path,
    mountpoint: &Path,
    behaviours: Behaviours,
) -> Result<Mounted, WeakFsError> {
    let fs = WeakFs::new(backing, behaviours)?;
    let session = fuser::spawn_mount(fs, mountpoint, &config(false)).map_err(|source| {
        WeakFsError::Mount {
            mountpoint: mountpoint.to_path_buf(),
            source,
        }
    })?;
    Ok(Mounted {
        session: Some(session),
        mountpoint: mountpoint.to_path_buf(),
    })
}

/// Mount and serve in the calling thread until unmounted (`fusermount3 -u`);
/// with `auto_unmount` the mount also goes away when this process dies.
pub fn mount_foreground(
    backing: &Path,
    mountpoint: &Path,
    behaviours: Behaviours,
    auto_unmount: bool,
) -> Result<(), WeakFsError> {
    let fs = WeakFs::new(backing, behaviours)?;
    fuser::mount(fs, mountpoint, &config(auto_unmount)).map_err(|source| WeakFsError::Mount {
        mountpoint: mountpoint.to_path_buf(),
        source,
    })
}
