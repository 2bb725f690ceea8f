//! The production implementation of the seam: plain POSIX calls through std.

#![allow(clippy::disallowed_methods)] // this is the seam: the one place that calls std::fs to write

use super::{Fs, ReadFile, WriteFile};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

/// POSIX files on whatever the CSI driver (or the laptop) mounted.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

struct RealFile(File);

impl ReadFile for RealFile {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.0.read_at(buf, pos)
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        Some(self.0.as_fd())
    }
}

impl WriteFile for RealFile {
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.0.write_all_at(buf, pos)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

impl Fs for RealFs {
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn ReadFile>> {
        Ok(Arc::new(RealFile(File::open(path)?)))
    }
    fn create_exclusive(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(path)?;
        Ok(Arc::new(RealFile(f)))
    }
    fn open_write(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>> {
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Arc::new(RealFile(f)))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        // Not std::fs::create_dir_all: after EEXIST it asks `is_dir()`, a
        // lookup that a client cache may answer. EEXIST from mkdir is the
        // server's answer: the name exists (another host made it); if it is
        // not a directory, the next operation in it fails anyway.
        match std::fs::create_dir(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => self.create_dir_all(p)?,
                    _ => return Err(e),
                }
                match std::fs::create_dir(path) {
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
                    _ => Ok(()),
                }
            }
            Err(e) => Err(e),
        }
    }
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        match std::fs::create_dir(path) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            r => r,
        }
    }
    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            if let Some(n) = e.file_name().to_str() {
                out.push(n.to_owned());
            }
        }
        Ok(out)
    }
    fn is_dir(&self, path: &Path) -> bool {
        std::fs::symlink_metadata(path)
            .map(|m| m.is_dir())
            .unwrap_or(false)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}
