//! The fenced seam: every write checks a guard right before its syscall.
//!
//! [`GuardedFs`] wraps a [`SharedFs`] and a [`WriteGuard`]. Every mutating
//! operation (create, open for writing, rename, unlink, mkdir, rmdir,
//! directory sync) and every write on a handle it returned (write, fsync,
//! set_len) asks the guard first and, if refused, fails with
//! [`fenced`] without reaching the inner seam. Reads pass through.
//!
//! Why: the single-writer rule of the substrate contract (rule 3) holds only
//! while the writer's lease does. A lease check before each write in the
//! caller is a discipline that one forgotten path breaks (a timer's roll, a
//! sweep); here it is the only way to the volume. The volume crate knows no
//! lease: the owner of a file supplies the guard (the actors crate checks
//! the broker lease of the incarnation the write belongs to).
//!
//! What is left is one syscall wide: a process paused between the check and
//! the syscall it guards still issues that one syscall when it wakes.

use super::{Fs, ReadFile, SharedFs, WriteFile};
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Decides whether a write may reach the volume now.
pub trait WriteGuard: Send + Sync + 'static {
    /// `Ok` if the owner may write now; otherwise the error to fail the
    /// write with (normally [`fenced`]).
    fn may_write(&self) -> io::Result<()>;
}

/// The payload of a refused write, so [`is_fenced`] can tell it apart from
/// a storage failure that happens to be `PermissionDenied`.
#[derive(Debug)]
struct Fenced;

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("lease lapsed: write refused")
    }
}

impl std::error::Error for Fenced {}

/// The error of a write the guard refused: `PermissionDenied`, "lease
/// lapsed: write refused". Nothing reached the volume.
pub fn fenced() -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, Fenced)
}

/// Whether `e` is a refused write ([`fenced`]): the caller lost its right
/// to write (NOT_LEADER), the volume did not fail. A refused `sync_data` is
/// not a poisoned one — nothing was synced or lost by it — but either way
/// the caller stops writing.
pub fn is_fenced(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied && e.get_ref().is_some_and(|i| i.is::<Fenced>())
}

/// See module docs.
#[derive(Clone)]
pub struct GuardedFs {
    inner: SharedFs,
    guard: Arc<dyn WriteGuard>,
}

impl GuardedFs {
    /// `inner`, writable only while `guard` allows.
    pub fn new(inner: SharedFs, guard: Arc<dyn WriteGuard>) -> Self {
        Self { inner, guard }
    }

    /// As a shared seam.
    pub fn shared(inner: SharedFs, guard: Arc<dyn WriteGuard>) -> SharedFs {
        Arc::new(Self::new(inner, guard))
    }

    fn wrap(&self, f: Arc<dyn WriteFile>) -> Arc<dyn WriteFile> {
        Arc::new(GuardedFile {
            inner: f,
            guard: self.guard.clone(),
        })
    }
}

impl Fs for GuardedFs {
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn ReadFile>> {
        self.inner.open_read(path)
    }
    fn create_exclusive(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>> {
        self.guard.may_write()?;
        self.inner.create_exclusive(path).map(|f| self.wrap(f))
    }
    fn open_write(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>> {
        self.guard.may_write()?;
        self.inner.open_write(path).map(|f| self.wrap(f))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.guard.may_write()?;
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.guard.may_write()?;
        self.inner.remove_file(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.guard.may_write()?;
        self.inner.create_dir_all(path)
    }
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        self.guard.may_write()?;
        self.inner.create_dir(path)
    }
    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        self.guard.may_write()?;
        self.inner.remove_dir(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.inner.is_dir(path)
    }
    fn lookup(&self, path: &Path) -> io::Result<bool> {
        self.inner.lookup(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.guard.may_write()?;
        self.inner.sync_dir(dir)
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.inner.read(path)
    }
}

/// A handle opened through [`GuardedFs`]: its writes are guarded too.
struct GuardedFile {
    inner: Arc<dyn WriteFile>,
    guard: Arc<dyn WriteGuard>,
}

impl ReadFile for GuardedFile {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.inner.read_at(buf, pos)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.fd()
    }
}

impl WriteFile for GuardedFile {
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.guard.may_write()?;
        self.inner.write_all_at(buf, pos)
    }
    fn write_all_vectored_at(&self, bufs: &[&[u8]], mut pos: u64) -> io::Result<()> {
        // One check per `pwritev`'s worth of slices, so what is left stays
        // one syscall wide however many batches a request carries.
        for chunk in bufs.chunks(super::IOV_MAX) {
            self.guard.may_write()?;
            self.inner.write_all_vectored_at(chunk, pos)?;
            pos += chunk.iter().map(|b| b.len() as u64).sum::<u64>();
        }
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        self.guard.may_write()?;
        self.inner.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.guard.may_write()?;
        self.inner.set_len(len)
    }
}

/// A guard a test flips by hand.
#[derive(Debug, Default)]
pub struct ToggleGuard(std::sync::atomic::AtomicBool);

impl ToggleGuard {
    /// Allowing writes until [`Self::refuse`].
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    /// From now on every write is refused.
    pub fn refuse(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl WriteGuard for ToggleGuard {
    fn may_write(&self) -> io::Result<()> {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            Err(fenced())
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::fault::FaultFs;
    use crate::fs::{write_atomic, ReadOnly};

    fn setup() -> (tempfile::TempDir, FaultFs, Arc<ToggleGuard>, SharedFs) {
        let dir = tempfile::tempdir().unwrap();
        let ffs = FaultFs::new();
        let guard = ToggleGuard::new();
        let fs = GuardedFs::shared(Arc::new(ffs.clone()), guard.clone());
        (dir, ffs, guard, fs)
    }

    #[test]
    fn writes_pass_while_allowed_and_reads_always() {
        let (dir, ffs, guard, fs) = setup();
        let p = dir.path().join("a");
        write_atomic(fs.as_ref(), &p, b"hello").unwrap();
        assert!(ffs.ops() > 0);
        guard.refuse();
        assert_eq!(fs.read(&p).unwrap(), b"hello");
        assert_eq!(fs.read_only().read(&p).unwrap(), b"hello");
        assert_eq!(fs.list(dir.path()).unwrap(), vec!["a".to_string()]);
        assert!(fs.is_dir(dir.path()));
    }

    /// A guard that allows `n` checks, then refuses.
    struct Allow(std::sync::atomic::AtomicUsize);

    impl WriteGuard for Allow {
        fn may_write(&self) -> io::Result<()> {
            use std::sync::atomic::Ordering::SeqCst;
            match self.0.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)) {
                Ok(_) => Ok(()),
                Err(_) => Err(fenced()),
            }
        }
    }

    /// Catches: a vectored write of more slices than one `pwritev` takes
    /// checking the guard once and then issuing several system calls, so
    /// that a lease lapsing in between no longer stops the rest.
    #[test]
    fn a_vectored_write_checks_the_guard_before_every_system_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let guard = Arc::new(Allow(2.into())); // the create, then one chunk
        let fs = GuardedFs::shared(Arc::new(crate::fs::RealFs), guard);
        let f = fs.create_exclusive(&path).unwrap();
        let parts: Vec<[u8; 1]> = (0..crate::fs::IOV_MAX + 1).map(|i| [i as u8]).collect();
        let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        let e = f.write_all_vectored_at(&slices, 0).unwrap_err();
        assert!(is_fenced(&e), "{e}");
        // The first system call's worth landed, the rest was refused.
        assert_eq!(std::fs::read(&path).unwrap().len(), crate::fs::IOV_MAX);
    }

    #[test]
    fn every_mutation_is_refused_with_a_fenced_error() {
        let (dir, _ffs, guard, fs) = setup();
        let d = dir.path();
        let f = fs.create_exclusive(&d.join("f")).unwrap();
        fs.create_dir_all(&d.join("sub")).unwrap();
        guard.refuse();
        let results: Vec<io::Result<()>> = vec![
            fs.create_exclusive(&d.join("g")).map(|_| ()),
            fs.open_write(&d.join("f")).map(|_| ()),
            fs.rename(&d.join("f"), &d.join("h")),
            fs.remove_file(&d.join("f")),
            fs.create_dir_all(&d.join("x")),
            fs.remove_dir(&d.join("sub")),
            fs.sync_dir(d),
            f.write_all_at(b"x", 0),
            f.sync_data(),
            f.set_len(10),
        ];
        for (i, r) in results.into_iter().enumerate() {
            let e = r.expect_err(&format!("op {i} was not refused"));
            assert!(is_fenced(&e), "op {i}: {e}");
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
            assert_eq!(e.to_string(), "lease lapsed: write refused");
        }
        assert!(d.join("f").exists() && !d.join("g").exists() && d.join("sub").is_dir());
        assert_eq!(std::fs::metadata(d.join("f")).unwrap().len(), 0);
    }

    #[test]
    fn a_storage_permission_error_is_not_fenced() {
        assert!(!is_fenced(&io::Error::from(
            io::ErrorKind::PermissionDenied
        )));
        assert!(!is_fenced(&io::Error::other("x")));
    }

    /// Crash-style: once the guard flips, not one operation reaches the
    /// inner seam, whatever the caller goes on trying.
    #[test]
    fn nothing_reaches_the_inner_fs_after_the_guard_flips() {
        let (dir, ffs, guard, fs) = setup();
        let p = dir.path().join("m.json");
        let seg = fs.create_exclusive(&dir.path().join("s.log")).unwrap();
        seg.write_all_at(b"abc", 0).unwrap();
        write_atomic(fs.as_ref(), &p, b"1").unwrap();
        guard.refuse();
        let before = ffs.ops();
        let log = ffs.log();
        for i in 0..5u8 {
            let _ = write_atomic(fs.as_ref(), &p, &[i]);
            let _ = seg.write_all_at(&[i], 3);
            let _ = seg.sync_data();
            let _ = crate::fs::remove_tree(fs.as_ref(), dir.path());
            let _ = crate::fs::remove_stale_temps(fs.as_ref(), dir.path());
        }
        assert_eq!(ffs.ops(), before, "new ops: {:?}", &ffs.log()[log.len()..]);
        assert_eq!(std::fs::read(&p).unwrap(), b"1");
        assert_eq!(std::fs::read(dir.path().join("s.log")).unwrap(), b"abc");
    }
}
