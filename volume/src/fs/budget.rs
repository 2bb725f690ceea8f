//! The data plane's descriptor budget: a hard ceiling on the descriptors
//! everything but the control plane may hold, so the heartbeat, the
//! assignment watcher and the controller always find theirs.
//!
//! Why a count and not a check of what is free: the process limit is one
//! pool, and any thread that opens a file or accepts a socket takes from
//! it. A data-plane burst (partition recoveries, segment reopens, coordinator
//! shard logs, sendfile handles, connections) that ran the process out of
//! descriptors made the next heartbeat or controller pass fail with EMFILE.
//! Here every data-plane descriptor is a [`Permit`] taken *before* the
//! syscall that creates it and held by whatever holds the descriptor (a
//! file handle, a socket), so the data plane holds at most [`FdBudget::cap`]
//! at any instant. The broker sets the cap to the limit minus what it keeps
//! for the control plane minus what the runtime holds (listeners, event
//! loops): the control plane's reserve is left by construction, not by a
//! sampled guess. A refused open is [`exhausted`] — retriable, nothing
//! reached the volume — never EMFILE.
//!
//! [`BudgetedFs`] is the seam wrapper: every open (read, write, exclusive
//! create) takes a permit that its handle keeps; a listing, a directory
//! fsync and a whole-file read take one for their duration. Metadata calls
//! without a descriptor (rename, unlink, mkdir, stat) pass through.

use super::{Fs, ReadFile, SharedFs, WriteFile};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// See module docs.
#[derive(Debug)]
pub struct FdBudget {
    cap: AtomicUsize,
    held: AtomicUsize,
    refused: AtomicU64,
}

/// One descriptor's place in the budget; given back on drop.
#[derive(Debug)]
pub struct Permit(Arc<FdBudget>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::AcqRel);
    }
}

impl FdBudget {
    /// A budget of `cap` descriptors.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: AtomicUsize::new(cap),
            held: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// A permit, or [`exhausted`] when `cap` are held.
    pub fn try_acquire(self: &Arc<Self>) -> io::Result<Permit> {
        let cap = self.cap.load(Ordering::Acquire);
        let mut held = self.held.load(Ordering::Acquire);
        loop {
            if held >= cap {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return Err(exhausted());
            }
            match self.held.compare_exchange_weak(
                held,
                held + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(Permit(self.clone())),
                Err(now) => held = now,
            }
        }
    }

    /// Descriptors the data plane may hold at once.
    pub fn cap(&self) -> usize {
        self.cap.load(Ordering::Acquire)
    }

    /// Set the cap (at start, once the runtime's own descriptors are
    /// known). Lowering it below what is held refuses new permits until
    /// enough are given back; nothing held is taken away.
    pub fn set_cap(&self, cap: usize) {
        self.cap.store(cap, Ordering::Release);
    }

    /// Permits held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Permits refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// The payload of a refused permit, so [`is_exhausted`] can tell it apart.
#[derive(Debug)]
struct Exhausted;

impl std::fmt::Display for Exhausted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("data-plane descriptor budget exhausted (the rest is kept for the control plane); retry")
    }
}

impl std::error::Error for Exhausted {}

/// The error of a refused permit: nothing was opened, try again later.
pub fn exhausted() -> io::Error {
    io::Error::new(io::ErrorKind::ResourceBusy, Exhausted)
}

/// Whether `e` is a refused permit ([`exhausted`]).
pub fn is_exhausted(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Exhausted>())
}

/// Whether `e` means "out of descriptors": a refused permit, EMFILE or
/// ENFILE. Retriable: nothing was opened.
pub fn out_of_descriptors(e: &io::Error) -> bool {
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    is_exhausted(e) || matches!(e.raw_os_error(), Some(EMFILE) | Some(ENFILE))
}

/// A seam whose every descriptor is counted in an [`FdBudget`] (see
/// module docs).
pub struct BudgetedFs {
    inner: SharedFs,
    budget: Arc<FdBudget>,
}

impl BudgetedFs {
    /// `inner`, its descriptors counted in `budget`.
    pub fn shared(inner: SharedFs, budget: Arc<FdBudget>) -> SharedFs {
        Arc::new(Self { inner, budget })
    }
}

/// A handle and its permit: the permit goes when the last holder of the
/// handle drops it, with the descriptor.
struct Held<F: ?Sized> {
    inner: Arc<F>,
    _permit: Permit,
}

macro_rules! delegate_read {
    () => {
        fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
            self.inner.read_at(buf, pos)
        }
        fn len(&self) -> io::Result<u64> {
            self.inner.len()
        }
        fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
            self.inner.fd()
        }
    };
}

impl ReadFile for Held<dyn ReadFile> {
    delegate_read!();
}

impl ReadFile for Held<dyn WriteFile> {
    delegate_read!();
}

impl WriteFile for Held<dyn WriteFile> {
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, pos)
    }
    fn write_all_vectored_at(&self, bufs: &[&[u8]], pos: u64) -> io::Result<()> {
        self.inner.write_all_vectored_at(bufs, pos)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

impl BudgetedFs {
    fn writer(
        &self,
        open: impl FnOnce() -> io::Result<Arc<dyn WriteFile>>,
    ) -> io::Result<Arc<dyn WriteFile>> {
        let permit = self.budget.try_acquire()?;
        let inner = open()?;
        Ok(Arc::new(Held {
            inner,
            _permit: permit,
        }))
    }
}

impl Fs for BudgetedFs {
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn ReadFile>> {
        let permit = self.budget.try_acquire()?;
        let inner = self.inner.open_read(path)?;
        Ok(Arc::new(Held {
            inner,
            _permit: permit,
        }))
    }
    fn create_exclusive(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>> {
        self.writer(|| self.inner.create_exclusive(path))
    }
    fn open_write(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>> {
        self.writer(|| self.inner.open_write(path))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir(path)
    }
    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_dir(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let _permit = self.budget.try_acquire()?;
        self.inner.list(dir)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.inner.is_dir(path)
    }
    fn lookup(&self, path: &Path) -> io::Result<bool> {
        // No descriptor is held: nothing to count.
        self.inner.lookup(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let _permit = self.budget.try_acquire()?;
        self.inner.sync_dir(dir)
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let _permit = self.budget.try_acquire()?;
        self.inner.read(path)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::disallowed_methods)] // fixtures written with std::fs
    use super::*;
    use crate::fs::{write_atomic, RealFs};

    /// Catches: a data-plane open that takes a descriptor beyond its
    /// budget (the process then runs out and the heartbeat fails with
    /// EMFILE). Every kind of descriptor the seam creates is counted while
    /// it exists and given back when it goes.
    #[test]
    fn the_seam_never_holds_more_than_its_budget() {
        let d = tempfile::tempdir().unwrap();
        let budget = FdBudget::new(3);
        let fs = BudgetedFs::shared(Arc::new(RealFs), budget.clone());
        for i in 0..5 {
            std::fs::write(d.path().join(format!("f{i}")), b"x").unwrap();
        }
        let a = fs.open_read(&d.path().join("f0")).unwrap();
        let b = fs.open_write(&d.path().join("f1")).unwrap();
        let c = fs.create_exclusive(&d.path().join("new")).unwrap();
        assert_eq!(budget.held(), 3);
        // Everything that needs a descriptor is refused, retriably.
        let e = fs.open_read(&d.path().join("f2")).err().unwrap();
        assert!(is_exhausted(&e) && out_of_descriptors(&e), "{e}");
        assert!(is_exhausted(&fs.list(d.path()).unwrap_err()));
        assert!(is_exhausted(&fs.sync_dir(d.path()).unwrap_err()));
        assert!(is_exhausted(&fs.read(&d.path().join("f2")).unwrap_err()));
        assert!(is_exhausted(
            &write_atomic(fs.as_ref(), &d.path().join("w"), b"y").unwrap_err()
        ));
        assert!(fs.create_exclusive(&d.path().join("never")).is_err());
        assert!(
            !d.path().join("never").exists(),
            "nothing reached the volume"
        );
        // What needs none passes.
        fs.rename(&d.path().join("f3"), &d.path().join("f4"))
            .unwrap();
        assert!(fs.is_dir(d.path()));
        // A holder keeps its permit as long as it holds the handle.
        let a2 = a.clone();
        drop(a);
        assert_eq!(budget.held(), 3);
        drop((a2, b, c));
        assert_eq!(budget.held(), 0);
        write_atomic(fs.as_ref(), &d.path().join("w"), b"y").unwrap();
        assert_eq!(fs.read(&d.path().join("w")).unwrap(), b"y");
        assert_eq!(budget.held(), 0);
        assert!(budget.refused() >= 6);
        // A failed open gives its permit back.
        assert!(fs.open_read(&d.path().join("absent")).is_err());
        assert_eq!(budget.held(), 0);
    }
}
