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
    fn write_all_vectored_at(&self, bufs: &[&[u8]], mut pos: u64) -> io::Result<()> {
        // At most IOV_MAX slices per call; a short write resumes inside the
        // slice it stopped in.
        use super::IOV_MAX;
        let mut at = 0; // the first slice not wholly written
        let mut skip = 0; // bytes of bufs[at] already written
        while at < bufs.len() {
            let iov: Vec<io::IoSlice<'_>> = bufs[at..]
                .iter()
                .take(IOV_MAX)
                .enumerate()
                .map(|(i, b)| io::IoSlice::new(if i == 0 { &b[skip..] } else { b }))
                .collect();
            let mut n = match rustix::io::pwritev(&self.0, &iov, pos) {
                Ok(0) if iov.iter().any(|s| !s.is_empty()) => {
                    return Err(io::ErrorKind::WriteZero.into())
                }
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            };
            pos += n as u64;
            while at < bufs.len() && n >= bufs[at].len() - skip {
                n -= bufs[at].len() - skip;
                at += 1;
                skip = 0;
            }
            skip += n;
        }
        Ok(())
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
    fn lookup(&self, path: &Path) -> io::Result<bool> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a vectored write that loses or repeats bytes where it
    /// splits into IOV_MAX-sized calls, skips empty slices wrongly, or
    /// writes anywhere but at `pos`.
    #[test]
    fn a_vectored_write_lands_as_its_concatenation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = RealFs.create_exclusive(&path).unwrap();
        f.write_all_at(b"0123456789", 0).unwrap();
        // 3,001 slices (over two IOV_MAX splits), empty ones among them,
        // and one large one, written over the file's tail and past it.
        let big = vec![b'x'; 300_000];
        let mut parts: Vec<Vec<u8>> = (0..3000u32)
            .map(|i| vec![(i % 251) as u8; (i % 7) as usize])
            .collect();
        parts.insert(1500, big);
        let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        f.write_all_vectored_at(&slices, 4).unwrap();
        let mut want = b"0123".to_vec();
        want.extend(slices.concat());
        assert_eq!(std::fs::read(&path).unwrap(), want);
        // Nothing at all is a no-op.
        f.write_all_vectored_at(&[&[], &[]], 2).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), want);
    }
}
