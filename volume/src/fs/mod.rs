//! The filesystem seam: the only way any kaas code touches the shared volume.
//!
//! Every effect on the volume — open, append, fsync, rename, exclusive create,
//! unlink, list — goes through the [`Fs`] trait so that tests can swap in
//! [`fault::FaultFs`], which fails the Nth operation or "crashes" between two
//! steps (dropping every byte that was not fsynced), and then prove that
//! re-driving the operation converges. The substrate contract allows exactly
//! three atomic primitives (same-directory rename, exclusive create,
//! close-to-open); the helpers here are built from those and nothing else.
//!
//! Write access is a type: [`Fs`] (shared as [`SharedFs`]) can create,
//! write, rename and unlink, and belongs to the owners of files (the actors).
//! [`ReadFs`], obtained with [`ReadOnly::read_only`], can only open for
//! reading, list and stat; request handlers and anything else that must not
//! write hold that, so they cannot open a file for writing even by mistake.
//! Outside this module (and the substrate probes and tests), the workspace's
//! `clippy.toml` forbids the `std::fs` calls that write. An owner writes
//! through a [`GuardedFs`], which refuses every write once the owner's
//! guard (its lease) says no.

pub mod budget;
pub mod fault;
pub mod guarded;
pub mod real;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use budget::{BudgetedFs, FdBudget, Permit};
pub use guarded::{fenced, is_fenced, GuardedFs, WriteGuard};
pub use real::RealFs;

/// A file opened for reading. Reads are positional so one handle can serve
/// many concurrent fetches.
#[allow(clippy::len_without_is_empty)] // a file length, not a collection
pub trait ReadFile: Send + Sync {
    /// Read up to `buf.len()` bytes at `pos`; returns bytes read (0 at EOF).
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize>;
    /// Current length of the file.
    fn len(&self) -> io::Result<u64>;
    /// The descriptor, for `sendfile` straight from the file to a socket;
    /// `None` (the default) when reads must go through [`Self::read_at`]
    /// (fault-injecting and test seams), which keeps them on the copy path.
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
    /// Read exactly `buf.len()` bytes at `pos`, or fail with `UnexpectedEof`.
    fn read_exact_at(&self, mut buf: &mut [u8], mut pos: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, pos)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => {
                    buf = &mut buf[n..];
                    pos += n as u64;
                }
            }
        }
        Ok(())
    }
}

/// The most slices one `pwritev` takes (Linux's IOV_MAX): a vectored write
/// of more is several system calls, and [`guarded`] checks its guard before
/// each group of this many.
pub const IOV_MAX: usize = 1024;

/// A file opened for writing by its single owner. Writes are positional:
/// segments are append-only, and the owner always knows the append position.
pub trait WriteFile: ReadFile {
    /// Write all of `buf` at `pos`.
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()>;
    /// Write `bufs`, one after another, at `pos`: the same bytes and the
    /// same outcome as one `write_all_at` of their concatenation. The
    /// default concatenates and calls `write_all_at`, so a seam that does
    /// not override it keeps its one write step (and its checks); the real
    /// file writes them with `pwritev`, without the copy.
    fn write_all_vectored_at(&self, bufs: &[&[u8]], pos: u64) -> io::Result<()> {
        self.write_all_at(&bufs.concat(), pos)
    }
    /// fdatasync: after this returns, everything written is durable. A failed
    /// sync poisons the handle; callers must not retry it (see STYLE.md).
    fn sync_data(&self) -> io::Result<()>;
    /// Truncate or extend. Only used by an owner on a file of its own epoch
    /// that holds no valid data past `len`.
    fn set_len(&self, len: u64) -> io::Result<()>;
}

/// The volume. Paths are absolute (the seam does not hold a root) so one
/// `Fs` can serve the data directory and a separate cluster directory.
pub trait Fs: Send + Sync + 'static {
    /// Open an existing file read-only.
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn ReadFile>>;
    /// O_CREAT|O_EXCL: atomic, exactly one racer wins (`AlreadyExists` otherwise).
    fn create_exclusive(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>>;
    /// Open an existing file for writing (no create, no truncate).
    fn open_write(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>>;
    /// Rename; atomic only within one directory, which is all kaas relies on.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Unlink one file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Create a directory and its parents; succeeds if it already exists.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Create one directory whose parent must exist (`NotFound` otherwise:
    /// never resurrects a parent renamed aside meanwhile); succeeds if it
    /// already exists. Required of every seam: a wrapper that forgot it
    /// used to refuse every mkdir through it (`Unsupported`).
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    /// Remove an empty directory.
    fn remove_dir(&self, path: &Path) -> io::Result<()>;
    /// Names in a directory (not `.`/`..`). May be stale on NFS: callers use a
    /// listing only to discover candidates, then open by exact name.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Whether `path` is a directory (false when absent).
    fn is_dir(&self, path: &Path) -> bool;
    /// Whether a name exists, by one exact-name lookup that holds no
    /// descriptor (`lstat` on the real volume; with `lookupcache=positive`
    /// an NFS client asks the server about a name it has not seen). Only
    /// NotFound is `false`; any other error is returned. The default opens
    /// the file; seams that count descriptors forward it uncounted, so a
    /// probe on the hot path (a leader's successor probe after each fsync)
    /// never fails for want of a descriptor.
    fn lookup(&self, path: &Path) -> io::Result<bool> {
        match self.open_read(path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
    /// fsync a directory so that creates/renames/unlinks in it are durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Read a whole (small) file by exact name: the close-to-open read.
    /// ESTALE (another host replaced the file between our lookup and our
    /// read) is answered by opening the name again (DESIGN §11).
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        const ESTALE: i32 = 116;
        // Read to the end instead of asking the size first: no `fstat`
        // per read (the idle control plane reads small files by exact name
        // every poll, and each stat is a metadata operation on the volume).
        let once = || -> io::Result<Vec<u8>> {
            let f = self.open_read(path)?;
            let mut buf = vec![0u8; 4096];
            let mut len = 0;
            loop {
                if len == buf.len() {
                    buf.resize(len * 2, 0);
                }
                match f.read_at(&mut buf[len..], len as u64) {
                    Ok(0) => break,
                    Ok(n) => len += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            buf.truncate(len);
            Ok(buf)
        };
        let mut r = once();
        for _ in 0..3 {
            match &r {
                Err(e) if e.raw_os_error() == Some(ESTALE) => r = once(),
                _ => break,
            }
        }
        r
    }
}

/// Whether `path` exists, by an exact-name open (close-to-open fresh, unlike
/// a listing). Only NotFound means "no"; any other error is returned, since
/// guessing "absent" can make a caller act on a state that is not there.
pub fn exists(fs: &dyn Fs, path: &Path) -> io::Result<bool> {
    match fs.open_read(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Shared handle to the volume, with write access: for the owners of files.
pub type SharedFs = Arc<dyn Fs>;

/// Read-only access to the volume. It wraps the full seam but exposes no
/// method that creates, writes, renames or removes anything, so code that
/// holds only a `ReadFs` (request handlers, readers) cannot write a file.
/// Cheap to clone.
///
/// ```
/// use kaas_volume::fs::{ReadOnly, RealFs, SharedFs};
/// let fs: SharedFs = std::sync::Arc::new(RealFs);
/// let view = fs.read_only();
/// assert!(view.is_dir(std::path::Path::new("/")));
/// ```
///
/// Writing through it does not compile:
///
/// ```compile_fail
/// use kaas_volume::fs::{ReadOnly, RealFs, SharedFs};
/// let fs: SharedFs = std::sync::Arc::new(RealFs);
/// let view = fs.read_only();
/// view.create_exclusive(std::path::Path::new("/tmp/x"));
/// ```
#[derive(Clone)]
pub struct ReadFs(SharedFs);

impl ReadFs {
    /// Open an existing file read-only.
    pub fn open_read(&self, path: &Path) -> io::Result<Arc<dyn ReadFile>> {
        self.0.open_read(path)
    }
    /// Read a whole (small) file by exact name (see [`Fs::read`]).
    pub fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.0.read(path)
    }
    /// Names in a directory (possibly stale; see [`Fs::list`]).
    pub fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.0.list(dir)
    }
    /// Whether `path` is a directory (false when absent).
    pub fn is_dir(&self, path: &Path) -> bool {
        self.0.is_dir(path)
    }
    /// Whether `path` exists, by exact-name open (see [`exists`]).
    pub fn exists(&self, path: &Path) -> io::Result<bool> {
        exists(self.0.as_ref(), path)
    }
}

impl std::fmt::Debug for ReadFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadFs")
    }
}

/// Hands out the read-only view of a seam.
pub trait ReadOnly {
    /// The read-only view: same volume, no way to write.
    fn read_only(&self) -> ReadFs;
}

impl ReadOnly for SharedFs {
    fn read_only(&self) -> ReadFs {
        ReadFs(self.clone())
    }
}

/// Rule 1 of the contract: write `bytes` to a temp name in the same
/// directory, fsync it, rename it over `path`, fsync the directory. A reader
/// on any host sees the old contents or the new, never a mix. A crash at any
/// step leaves at worst a `.tmp-` file, which [`remove_stale_temps`] clears.
pub fn write_atomic(fs: &dyn Fs, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = parent(path)?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    // The temp name is random, so an EEXIST is a lost reply to our own
    // create (DESIGN section 11): take a fresh name rather than guess; the
    // stray is swept with the other temps.
    let mut attempt = 0;
    let (tmp, f) = loop {
        let tmp = dir.join(crate::layout::temp(name, rand::random::<u64>()));
        match fs.create_exclusive(&tmp) {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 8 => attempt += 1,
            Err(e) => return Err(e),
        }
    };
    let res = f
        .write_all_at(bytes, 0)
        .and_then(|_| f.sync_data())
        .and_then(|_| match fs.rename(&tmp, path) {
            // ENOENT after a rename may be a lost reply to one that
            // happened: only we know the temp name, so if it is gone the
            // rename is done.
            Err(e) if e.kind() == io::ErrorKind::NotFound && fs.open_read(&tmp).is_err() => Ok(()),
            r => r,
        });
    drop(f);
    if let Err(e) = res {
        // Best effort: a leftover temp is harmless and swept on recovery.
        let _ = fs.remove_file(&tmp);
        return Err(e);
    }
    fs.sync_dir(dir)
}

/// Prefix of every temp file written by [`write_atomic`].
pub use crate::layout::TEMP_PREFIX;

/// Remove temp files a crashed [`write_atomic`] left behind in `dir`. Only
/// the directory's owner calls this, so no live temp of another writer is hit.
pub fn remove_stale_temps(fs: &dyn Fs, dir: &Path) -> io::Result<()> {
    for name in fs.list(dir)? {
        if crate::layout::is_temp(&name) {
            match fs.remove_file(&dir.join(&name)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Remove a file; `NotFound` counts as done (it may be a retried remove whose
/// first reply was lost, see DESIGN.md section 11).
pub fn remove_if_exists(fs: &dyn Fs, path: &Path) -> io::Result<()> {
    match fs.remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Remove a directory tree, deepest first. Not atomic (nothing recursive
/// is); callers first rename the tree aside so that no reader sees it
/// half-deleted, then re-drive this until it reports success.
pub fn remove_tree(fs: &dyn Fs, dir: &Path) -> io::Result<()> {
    let names = match fs.list(dir) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    // Past a file that cannot go yet (an NFS silly-renamed `.nfsXXXX` a
    // reader still holds: EBUSY) to remove everything else; the first
    // error is reported and the caller re-drives.
    let mut first: Option<io::Error> = None;
    for name in names {
        let p = dir.join(&name);
        let r = if fs.is_dir(&p) {
            remove_tree(fs, &p)
        } else {
            remove_if_exists(fs, &p)
        };
        if let Err(e) = r {
            first.get_or_insert(e);
        }
    }
    if let Some(e) = first {
        return Err(e);
    }
    match fs.remove_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn parent(path: &Path) -> io::Result<&Path> {
    path.parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no parent"))
}

/// Join helper that keeps call sites short.
pub fn join(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}
