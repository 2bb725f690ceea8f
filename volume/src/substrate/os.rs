//! Read-only facts the [`Fs`](crate::fs::Fs) seam does not model: inode
//! numbers, modification times, free space and inodes, this process's
//! identity. None of these opens, creates or changes anything on the volume;
//! every mutation the checker makes still goes through the seam.
//!
//! The workspace forbids `unsafe`, so free space comes from `stat -f`
//! (coreutils or busybox) rather than a raw `statvfs(2)`; where that tool is
//! missing the space check reports "cannot tell".

use serde::Serialize;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// Free space and inode headroom of the filesystem holding a directory.
/// A field is `None` when the filesystem does not count it: statfs reports
/// -1 there (ceph-fuse does for free inodes), which is "not counted", never
/// a failure of the check.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Space {
    /// Total bytes.
    pub total_bytes: Option<u64>,
    /// Bytes available to an unprivileged writer.
    pub avail_bytes: Option<u64>,
    /// Total inodes (`Some(0)` on filesystems that report 0: not counted either).
    pub total_inodes: Option<u64>,
    /// Free inodes.
    pub free_inodes: Option<u64>,
}

/// `stat -f` on `dir`.
pub fn space(dir: &Path) -> io::Result<Space> {
    let out = Command::new("stat")
        .args(["-f", "-c", "%S %b %a %c %d"])
        .arg(dir)
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "stat -f failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    parse_space(&String::from_utf8_lossy(&out.stdout))
        .ok_or_else(|| io::Error::other("unexpected `stat -f` output"))
}

/// One `stat -f` field: a number, or -1 (`u64::MAX` as unsigned), which
/// statfs uses for "not counted".
fn statfs_field(x: &str) -> Option<Option<u64>> {
    match x.parse::<u64>() {
        Ok(u64::MAX) => Some(None),
        Ok(v) => Some(Some(v)),
        Err(_) => match x.parse::<i64>() {
            Ok(-1) => Some(None),
            _ => None,
        },
    }
}

fn parse_space(s: &str) -> Option<Space> {
    let v: Vec<Option<u64>> = s
        .split_whitespace()
        .map(statfs_field)
        .collect::<Option<_>>()?;
    let [bsize, blocks, avail, files, ffree] = v.as_slice() else {
        return None;
    };
    let bytes = |n: Option<u64>| Some(bsize.unwrap_or(0).saturating_mul(n?));
    Some(Space {
        total_bytes: bytes(*blocks),
        avail_bytes: bytes(*avail),
        total_inodes: *files,
        free_inodes: *ffree,
    })
}

/// (device, inode) of a path.
pub fn identity(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// Modification time of a path, as the filesystem (on NFS: the server)
/// stamped it.
pub fn mtime(path: &Path) -> io::Result<SystemTime> {
    std::fs::metadata(path)?.modified()
}

/// Resolve symlinks and `..` so the path can be matched against mounts.
pub fn canonical(path: &Path) -> io::Result<PathBuf> {
    std::fs::canonicalize(path)
}

/// Text of a small system file, if readable.
pub fn read_system_file(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Who is probing: `boot-id pid start-time`. Unique on a host across
/// restarts (a restarted pod may reuse pid 1, never the start time).
pub fn process_identity() -> String {
    let pid = std::process::id();
    format!(
        "{} {} {}",
        boot_id(),
        pid,
        start_time(pid).unwrap_or_default()
    )
}

fn boot_id() -> String {
    read_system_file("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Start time of a process in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`), if it exists.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process named by a [`process_identity`] string is still
/// running. `None` when it ran on another host or another boot: then only
/// age can tell.
pub fn identity_alive(identity: &str) -> Option<bool> {
    let mut it = identity.split_whitespace();
    let (boot, pid, start) = (it.next()?, it.next()?, it.next()?);
    let own_boot = boot_id();
    if own_boot.is_empty() || boot != own_boot {
        return None;
    }
    let pid: u32 = pid.parse().ok()?;
    let start: u64 = start.parse().ok()?;
    Some(start_time(pid) == Some(start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_parses_stat_output() {
        let s = parse_space("4096 100 50 1000 900\n").unwrap();
        assert_eq!(s.total_bytes, Some(409_600));
        assert_eq!(s.avail_bytes, Some(204_800));
        assert_eq!(s.free_inodes, Some(900));
        assert!(parse_space("garbage").is_none());
        assert!(parse_space("4096 100 50 -2 900").is_none());
    }

    /// ceph-fuse reports free inodes as -1 (issue 28): the space probe gave
    /// up on the whole line. -1 means "not counted".
    #[test]
    fn a_statfs_field_of_minus_one_is_not_counted() {
        let s = parse_space("4096 100 50 -1 -1\n").unwrap();
        assert_eq!(s.total_bytes, Some(409_600));
        assert_eq!(s.total_inodes, None);
        assert_eq!(s.free_inodes, None);
        let s = parse_space("4096 100 18446744073709551615 1000 -1\n").unwrap();
        assert_eq!(s.avail_bytes, None);
        assert_eq!(s.total_inodes, Some(1000));
        assert_eq!(s.free_inodes, None);
    }

    #[test]
    fn own_identity_is_alive() {
        let me = process_identity();
        assert_eq!(identity_alive(&me), Some(true));
        let b = boot_id();
        assert_eq!(identity_alive(&format!("{b} 999999999 1")), Some(false));
        assert_eq!(identity_alive("other-boot 1 1"), None);
    }
}
