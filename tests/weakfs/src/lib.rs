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
//! * [`Behaviours::attr_ttl`]: how long the kernel may cache attributes and
//!   lookups (NFS `actimeo`); zero by default, so every access revalidates.
//!
//! The crate is meant to grow into an NFS-semantics test filesystem (silly
//! rename, ESTALE after a rename from another "host", lost replies), each as
//! one more switch; the passthrough core stays as it is.
//!
//! Node ids are the backing files' inode numbers (the backing root is node
//! 1), so a file that is replaced on the backing side — by another weakfs
//! mount of the same directory or by a copy+delete rename — gets a new node
//! id, as it would on a network filesystem.

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Which weaknesses are switched on. `Default` is an honest passthrough.
#[derive(Debug, Clone, Default)]
pub struct Behaviours {
    /// Rename regular files by remove-target, create, copy, unlink-source.
    pub rename_copy_delete: bool,
    /// Make fsync/fdatasync (and directory fsync) return at once.
    pub fsync_noop: bool,
    /// Kernel attribute and entry cache lifetime.
    pub attr_ttl: Duration,
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

/// The filesystem. Construct with [`WeakFs::new`], then mount with
/// [`mount_background`] or [`mount_foreground`].
pub struct WeakFs {
    backing: PathBuf,
    behaviours: Behaviours,
    /// node id -> path relative to the backing root ("" is the root).
    paths: Mutex<HashMap<u64, PathBuf>>,
    handles: Mutex<HashMap<u64, File>>,
    next_fh: AtomicU64,
    root_ino: u64,
}

impl WeakFs {
    /// A filesystem serving `backing` with the given behaviours.
    pub fn new(backing: &Path, behaviours: Behaviours) -> Result<Self, WeakFsError> {
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
            behaviours,
            paths: Mutex::new(paths),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            root_ino: meta.ino(),
        })
    }

    fn node_of(&self, backing_ino: u64) -> u64 {
        if backing_ino == self.root_ino {
            INodeNo::ROOT.0
        } else if backing_ino == INodeNo::ROOT.0 {
            // Would collide with the FUSE root id; move it out of the way.
            1 << 63 | backing_ino
        } else {
            backing_ino
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
        let node = self.node_of(meta.ino());
        self.paths
            .lock()
            .map_err(|_| Errno::EIO)?
            .insert(node, rel.to_path_buf());
        Ok(attr_of(node, &meta))
    }

    fn attr_of_node(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let rel = self.rel_path(ino)?;
        let meta = std::fs::symlink_metadata(self.full(&rel)).map_err(errno)?;
        if self.node_of(meta.ino()) != ino.0 {
            // The name now holds a different file: this node is gone.
            return Err(Errno::ESTALE);
        }
        Ok(attr_of(ino.0, &meta))
    }

    fn add_handle(&self, f: File) -> Result<u64, Errno> {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().map_err(|_| Errno::EIO)?.insert(fh, f);
        Ok(fh)
    }

    fn with_handle<T>(
        &self,
        fh: FileHandle,
        f: impl FnOnce(&File) -> io::Result<T>,
    ) -> Result<T, Errno> {
        let handles = self.handles.lock().map_err(|_| Errno::EIO)?;
        let file = handles.get(&fh.0).ok_or(Errno::EBADF)?;
        f(file).map_err(errno)
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

    fn open_options(flags: i32) -> OpenOptions {
        let mut o = OpenOptions::new();
        match flags & nix::libc::O_ACCMODE {
            nix::libc::O_WRONLY => o.write(true),
            nix::libc::O_RDWR => o.read(true).write(true),
            _ => o.read(true),
        };
        if flags & nix::libc::O_APPEND != 0 {
            o.append(true);
        }
        if flags & nix::libc::O_TRUNC != 0 {
            o.truncate(true);
        }
        o
    }
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
        let ttl = self.behaviours.attr_ttl;
        match self
            .child(parent, name)
            .and_then(|rel| self.entry_attr(&rel))
        {
            Ok(attr) => reply.entry(&ttl, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let ttl = self.behaviours.attr_ttl;
        let res = match fh {
            // An open handle keeps its file alive even after unlink/replace.
            Some(fh) => self
                .with_handle(fh, |f| f.metadata())
                .map(|m| attr_of(ino.0, &m)),
            None => self.attr_of_node(ino),
        };
        match res {
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
        let ttl = self.behaviours.attr_ttl;
        let res = (|| -> Result<FileAttr, Errno> {
            let rel = self.rel_path(ino)?;
            let path = self.full(&rel);
            if let Some(mode) = mode {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(errno)?;
            }
            if let Some(size) = size {
                match fh {
                    Some(fh) => self.with_handle(fh, |f| f.set_len(size))?,
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
        match res {
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
        let ttl = self.behaviours.attr_ttl;
        let res = self.child(parent, name).and_then(|rel| {
            let path = self.full(&rel);
            std::fs::create_dir(&path).map_err(errno)?;
            std::fs::set_permissions(
                &path,
                std::fs::Permissions::from_mode(mode & !umask & 0o7777),
            )
            .map_err(errno)?;
            self.entry_attr(&rel)
        });
        match res {
            Ok(attr) => reply.entry(&ttl, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self
            .child(parent, name)
            .and_then(|rel| std::fs::remove_file(self.full(&rel)).map_err(errno))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self
            .child(parent, name)
            .and_then(|rel| std::fs::remove_dir(self.full(&rel)).map_err(errno))
        {
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
        if !flags.is_empty() {
            // RENAME_NOREPLACE / RENAME_EXCHANGE: callers fall back to rename(2).
            reply.error(Errno::EINVAL);
            return;
        }
        let res = (|| -> Result<(), Errno> {
            let from_rel = self.child(parent, name)?;
            let to_rel = self.child(newparent, newname)?;
            let (from, to) = (self.full(&from_rel), self.full(&to_rel));
            let is_file = std::fs::symlink_metadata(&from)
                .map_err(errno)?
                .file_type()
                .is_file();
            if self.behaviours.rename_copy_delete && is_file {
                self.rename_copy_delete(&from, &to).map_err(errno)?;
                tracing::debug!(from = %from.display(), to = %to.display(), "rename as copy+delete");
            } else {
                std::fs::rename(&from, &to).map_err(errno)?;
                self.move_paths(&from_rel, &to_rel);
            }
            Ok(())
        })();
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let res = self.rel_path(ino).and_then(|rel| {
            let f = Self::open_options(flags.0)
                .open(self.full(&rel))
                .map_err(errno)?;
            // The name may have been renamed over since the kernel looked it
            // up: opening by path would then hand out a different file under
            // this node id. Say so, as NFS would; the kernel looks up again.
            if self.node_of(f.metadata().map_err(errno)?.ino()) != ino.0 {
                return Err(Errno::ESTALE);
            }
            self.add_handle(f)
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
        let res = self.with_handle(fh, |f| {
            let mut buf = vec![0u8; size as usize];
            let mut got = 0;
            while got < buf.len() {
                match f.read_at(&mut buf[got..], offset + got as u64)? {
                    0 => break,
                    n => got += n,
                }
            }
            buf.truncate(got);
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
        match self.with_handle(fh, |f| f.write_all_at(data, offset)) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
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
        if let Ok(mut h) = self.handles.lock() {
            h.remove(&fh.0);
        }
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
        if self.behaviours.fsync_noop {
            reply.ok();
            return;
        }
        let res = self.with_handle(fh, |f| {
            if datasync {
                f.sync_data()
            } else {
                f.sync_all()
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
        let res = (|| -> Result<Vec<(u64, FileType, std::ffi::OsString)>, Errno> {
            let rel = self.rel_path(ino)?;
            let mut out = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ino.0, FileType::Directory, "..".into()),
            ];
            for e in std::fs::read_dir(self.full(&rel)).map_err(errno)? {
                let e = e.map_err(errno)?;
                let Ok(m) = e.metadata() else { continue };
                let kind = FileType::from_std(m.file_type()).unwrap_or(FileType::RegularFile);
                out.push((self.node_of(m.ino()), kind, e.file_name()));
            }
            Ok(out)
        })();
        match res {
            Ok(entries) => {
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
        let ttl = self.behaviours.attr_ttl;
        let res = (|| -> Result<(FileAttr, u64), Errno> {
            let rel = self.child(parent, name)?;
            let mut o = Self::open_options(flags);
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
            let f = o.open(self.full(&rel)).map_err(errno)?;
            let attr = self.entry_attr(&rel)?;
            Ok((attr, self.add_handle(f)?))
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
