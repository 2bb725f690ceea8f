//! A fault-injecting seam for crash-at-every-step tests.
//!
//! [`FaultFs`] wraps the real filesystem in a temp directory and counts every
//! mutating operation (create, write, sync, set_len, rename, unlink, mkdir,
//! rmdir, directory sync). A test can
//! * fail exactly the Nth operation with `EIO` ([`FaultFs::fail_nth`]), or
//! * "crash" at the Nth operation ([`FaultFs::crash_at`]): that operation and
//!   every later one fail as if the process were dead, and
//!   [`FaultFs::power_loss`] then truncates every file back to the length it
//!   had at its last successful fsync, so bytes that were written but never
//!   synced are gone, as after a real power cut.
//!
//! The usual loop: count the operations of a clean run, then for every N crash
//! at N, power-loss, reopen with a fresh seam and assert recovery converges
//! with no acknowledged record lost.

#![allow(clippy::disallowed_methods)] // the fault-injecting seam wraps the real one and simulates power loss with raw calls

use super::{Fs, ReadFile, RealFs, WriteFile};
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct State {
    ops: u64,
    crash_at: Option<u64>,
    crashed: bool,
    fail_nth: Option<u64>,
    next_id: u64,
    /// path -> file id, for files written through this seam.
    ids: HashMap<PathBuf, u64>,
    /// file id -> length at last successful sync_data.
    synced: HashMap<u64, u64>,
    log: Vec<String>,
    /// NFS-like substrate quirks (see [`FaultFs::silly_rename`] etc.).
    quirks: Quirks,
}

/// Substrate quirks a test can switch on, for the substrate-check probes.
#[derive(Default)]
struct Quirks {
    /// Deleting an open file renames it to `.nfsXXXX` until the last close.
    silly_rename: bool,
    /// Successful create_exclusive number N (1-based) creates the file but reports
    /// `AlreadyExists`, as a retried NFS create whose first reply was lost.
    lose_create_reply: Option<u64>,
    creates: u64,
    /// create_exclusive silently truncates an existing file (not exclusive).
    break_exclusive: bool,
    /// The volume is full: a write lands its first half, then ENOSPC.
    full: bool,
    next_handle: u64,
    /// open handle id -> current path of its file.
    open: HashMap<u64, PathBuf>,
    /// `.nfsXXXX` names waiting for their last handle to close.
    silly: Vec<PathBuf>,
}

/// See the module docs.
#[derive(Clone, Default)]
pub struct FaultFs {
    inner: RealFs,
    state: Arc<Mutex<State>>,
}

fn injected(kind: &str) -> io::Error {
    io::Error::other(format!("injected {kind}"))
}

impl FaultFs {
    /// A seam that injects nothing until told to.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fail operation number `n` (1-based) and everything after it.
    pub fn crash_at(&self, n: u64) {
        self.state.lock().unwrap().crash_at = Some(n);
    }

    /// Fail only operation number `n` (1-based) with an I/O error.
    pub fn fail_nth(&self, n: u64) {
        self.state.lock().unwrap().fail_nth = Some(n);
    }

    /// NFS silly rename: removing a file that is open through this seam
    /// renames it to `.nfsXXXX` in the same directory (so the directory
    /// cannot be removed) until its last handle closes.
    pub fn silly_rename(&self, on: bool) {
        self.state.lock().unwrap().quirks.silly_rename = on;
    }

    /// The `n`th (1-based) `create_exclusive` creates the file but reports
    /// `AlreadyExists`: a retried NFS create whose first reply was lost.
    pub fn lose_create_reply(&self, n: u64) {
        self.state.lock().unwrap().quirks.lose_create_reply = Some(n);
    }

    /// A full volume: while on, every write stores the first half of its
    /// buffer and then fails with ENOSPC (a short write, as a real full
    /// filesystem does it).
    pub fn full(&self, on: bool) {
        self.state.lock().unwrap().quirks.full = on;
    }

    /// Make `create_exclusive` non-exclusive (open-or-create): a substrate
    /// that breaks guarantee 2, for testing that the checker notices.
    pub fn break_exclusive_create(&self, on: bool) {
        self.state.lock().unwrap().quirks.break_exclusive = on;
    }

    fn opened(&self, path: &Path) -> u64 {
        let mut st = self.state.lock().unwrap();
        st.quirks.next_handle += 1;
        let h = st.quirks.next_handle;
        st.quirks.open.insert(h, path.to_path_buf());
        h
    }

    fn closed(&self, handle: u64) {
        let mut st = self.state.lock().unwrap();
        let Some(path) = st.quirks.open.remove(&handle) else {
            return;
        };
        let still_open = st.quirks.open.values().any(|p| *p == path);
        if !still_open {
            if let Some(i) = st.quirks.silly.iter().position(|p| *p == path) {
                st.quirks.silly.remove(i);
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    /// Mutating operations counted so far.
    pub fn ops(&self) -> u64 {
        self.state.lock().unwrap().ops
    }

    /// Whether the injected crash has happened.
    pub fn crashed(&self) -> bool {
        self.state.lock().unwrap().crashed
    }

    /// Human-readable list of the operations seen, for failure messages.
    pub fn log(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }

    /// Drop every byte not covered by a successful fsync, then forget all
    /// tracking. Call after a crash and before reopening with a new seam.
    pub fn power_loss(&self) {
        let mut st = self.state.lock().unwrap();
        for (path, id) in st.ids.iter() {
            let synced = st.synced.get(id).copied().unwrap_or(0);
            if let Ok(m) = std::fs::metadata(path) {
                if m.len() > synced {
                    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
                    f.set_len(synced).unwrap();
                }
            }
        }
        st.ids.clear();
        st.synced.clear();
    }

    fn step(&self, what: &str, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock().unwrap();
        if st.crashed {
            return Err(injected("crash (process dead)"));
        }
        st.ops += 1;
        let n = st.ops;
        st.log.push(format!("{n}: {what} {}", path.display()));
        if st.crash_at == Some(n) {
            st.crashed = true;
            return Err(injected("crash"));
        }
        if st.fail_nth == Some(n) {
            return Err(injected("eio"));
        }
        Ok(())
    }

    fn check_alive(&self) -> io::Result<()> {
        if self.state.lock().unwrap().crashed {
            return Err(injected("crash (process dead)"));
        }
        Ok(())
    }

    fn track(&self, path: &Path, synced_len: u64) -> u64 {
        let mut st = self.state.lock().unwrap();
        if let Some(id) = st.ids.get(path).copied() {
            return id;
        }
        st.next_id += 1;
        let id = st.next_id;
        st.ids.insert(path.to_path_buf(), id);
        st.synced.insert(id, synced_len);
        id
    }
}

struct FaultFile {
    fs: FaultFs,
    id: u64,
    path: PathBuf,
    inner: Arc<dyn WriteFile>,
    handle: u64,
}

impl Drop for FaultFile {
    fn drop(&mut self) {
        self.fs.closed(self.handle);
    }
}

/// A read handle, tracked so that silly rename knows the file is open.
struct FaultRead {
    fs: FaultFs,
    inner: Arc<dyn ReadFile>,
    handle: u64,
}

impl ReadFile for FaultRead {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.fs.check_alive()?;
        self.inner.read_at(buf, pos)
    }
    fn len(&self) -> io::Result<u64> {
        self.fs.check_alive()?;
        self.inner.len()
    }
}

impl Drop for FaultRead {
    fn drop(&mut self) {
        self.fs.closed(self.handle);
    }
}

impl ReadFile for FaultFile {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.fs.check_alive()?;
        self.inner.read_at(buf, pos)
    }
    fn len(&self) -> io::Result<u64> {
        self.fs.check_alive()?;
        self.inner.len()
    }
}

impl WriteFile for FaultFile {
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.fs.step("write", &self.path)?;
        if self.fs.state.lock().unwrap().quirks.full {
            self.inner.write_all_at(&buf[..buf.len() / 2], pos)?;
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.inner.write_all_at(buf, pos)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.fs.step("sync", &self.path)?;
        self.inner.sync_data()?;
        let len = self.inner.len()?;
        self.fs.state.lock().unwrap().synced.insert(self.id, len);
        Ok(())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.fs.step("set_len", &self.path)?;
        self.inner.set_len(len)?;
        // Truncation is metadata; treat it as durable only once synced, but
        // a shorter file can never resurrect bytes, so clamp the synced mark.
        let mut st = self.fs.state.lock().unwrap();
        let s = st.synced.entry(self.id).or_insert(0);
        *s = (*s).min(len);
        Ok(())
    }
}

impl Fs for FaultFs {
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn ReadFile>> {
        self.check_alive()?;
        let inner = self.inner.open_read(path)?;
        Ok(Arc::new(FaultRead {
            fs: self.clone(),
            inner,
            handle: self.opened(path),
        }))
    }
    fn create_exclusive(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>> {
        self.step("create_exclusive", path)?;
        let broken = self.state.lock().unwrap().quirks.break_exclusive;
        let inner = if broken {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)?;
            drop(f);
            self.inner.open_write(path)?
        } else {
            self.inner.create_exclusive(path)?
        };
        // Counted among the creates that succeeded: a racer that lost (a
        // real EEXIST) had no reply to lose.
        let lose_reply = {
            let mut st = self.state.lock().unwrap();
            st.quirks.creates += 1;
            st.quirks.lose_create_reply == Some(st.quirks.creates)
        };
        if lose_reply {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        let id = self.track(path, 0);
        Ok(Arc::new(FaultFile {
            fs: self.clone(),
            id,
            path: path.to_path_buf(),
            inner,
            handle: self.opened(path),
        }))
    }
    fn open_write(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>> {
        self.check_alive()?;
        let inner = self.inner.open_write(path)?;
        let id = self.track(path, inner.len()?);
        Ok(Arc::new(FaultFile {
            fs: self.clone(),
            id,
            path: path.to_path_buf(),
            inner,
            handle: self.opened(path),
        }))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.step("rename", from)?;
        self.inner.rename(from, to)?;
        // A renamed directory carries its files (and their open handles
        // and silly-renamed leftovers) to the new path.
        let moved = |p: &Path| -> Option<PathBuf> {
            p.strip_prefix(from).ok().map(|rest| {
                if rest.as_os_str().is_empty() {
                    to.to_path_buf()
                } else {
                    to.join(rest)
                }
            })
        };
        let mut st = self.state.lock().unwrap();
        let ids: Vec<(PathBuf, u64)> = st
            .ids
            .iter()
            .filter_map(|(p, id)| moved(p).map(|n| (n, *id)))
            .collect();
        st.ids.retain(|p, _| moved(p).is_none());
        st.ids.extend(ids);
        for p in st.quirks.open.values_mut() {
            if let Some(n) = moved(p) {
                *p = n;
            }
        }
        for p in st.quirks.silly.iter_mut() {
            if let Some(n) = moved(p) {
                *p = n;
            }
        }
        Ok(())
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.step("remove_file", path)?;
        {
            let mut st = self.state.lock().unwrap();
            let open = st.quirks.open.values().any(|p| p.as_path() == path);
            if st.quirks.silly_rename && open {
                if st.quirks.silly.iter().any(|p| p.as_path() == path) {
                    // NFS refuses to unlink a silly-renamed file still open.
                    return Err(io::Error::from_raw_os_error(libc::EBUSY));
                }
                let silly =
                    path.with_file_name(format!(".nfs{:024x}", rand::random::<u128>() >> 32));
                self.inner.rename(path, &silly)?;
                for p in st.quirks.open.values_mut().filter(|p| p.as_path() == path) {
                    *p = silly.clone();
                }
                st.quirks.silly.push(silly);
                st.ids.remove(path);
                return Ok(());
            }
        }
        self.inner.remove_file(path)?;
        self.state.lock().unwrap().ids.remove(path);
        Ok(())
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.step("create_dir_all", path)?;
        self.inner.create_dir_all(path)
    }
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        self.step("create_dir", path)?;
        self.inner.create_dir(path)
    }
    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        self.step("remove_dir", path)?;
        self.inner.remove_dir(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.check_alive()?;
        self.inner.list(dir)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.inner.is_dir(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.step("sync_dir", dir)?;
        self.inner.sync_dir(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::write_atomic;

    #[test]
    fn power_loss_drops_unsynced_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new();
        let p = dir.path().join("seg");
        let f = fs.create_exclusive(&p).unwrap();
        f.write_all_at(b"durable", 0).unwrap();
        f.sync_data().unwrap();
        f.write_all_at(b"-lost", 7).unwrap();
        fs.crash_at(fs.ops() + 1);
        assert!(f.sync_data().is_err());
        fs.power_loss();
        assert_eq!(std::fs::read(&p).unwrap(), b"durable");
    }

    #[test]
    fn write_atomic_crash_at_every_step_leaves_old_or_new() {
        let clean = FaultFs::new();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("manifest.json");
        write_atomic(&clean, &p, b"old").unwrap();
        let base = clean.ops();
        write_atomic(&clean, &p, b"new").unwrap();
        let steps = clean.ops() - base;
        assert!(steps >= 4, "create, write, sync, rename, sync_dir");
        for n in 1..=steps {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("manifest.json");
            let fs = FaultFs::new();
            write_atomic(&fs, &p, b"old").unwrap();
            fs.crash_at(fs.ops() + n);
            let _ = write_atomic(&fs, &p, b"new");
            fs.power_loss();
            let got = std::fs::read(&p).unwrap();
            assert!(got == b"old" || got == b"new", "step {n}: torn {got:?}");
            crate::fs::remove_stale_temps(&RealFs, dir.path()).unwrap();
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        }
    }
}
