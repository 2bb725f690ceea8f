//! Which mount a directory lives on, what kind of filesystem it is, and what
//! its options say about the substrate contract.
//!
//! Read from `/proc/self/mountinfo` (the kernel's view, including the
//! per-superblock options an NFS client really uses). This is configuration,
//! not the volume: nothing here touches the shared volume itself.

use serde::Serialize;
use std::path::{Path, PathBuf};

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MountInfo {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Root of the mount within its filesystem.
    pub root: String,
    /// Filesystem type (`nfs4`, `ext4`, `fuse.s3fs`, ...).
    pub fstype: String,
    /// Mount source (`server:/export`, `/dev/vda`, `s3fs`, ...).
    pub source: String,
    /// Per-mount options (`rw,relatime,...`).
    pub mount_options: Vec<String>,
    /// Per-superblock options (for NFS: `vers=4.1,hard,...`).
    pub super_options: Vec<String>,
}

impl MountInfo {
    /// Every option, per-mount then per-superblock.
    pub fn options(&self) -> impl Iterator<Item = &str> {
        self.mount_options
            .iter()
            .chain(self.super_options.iter())
            .map(String::as_str)
    }

    fn option_value(&self, key: &str) -> Option<&str> {
        self.options()
            .find_map(|o| o.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
    }

    fn has_option(&self, name: &str) -> bool {
        self.options().any(|o| o == name)
    }
}

/// Device class, which decides what fsync latency is plausible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FsClass {
    /// A local block filesystem (ext4, xfs, btrfs, overlay, ...).
    Local,
    /// Memory (tmpfs, ramfs): no durability at all, so none to lie about.
    Memory,
    /// A network filesystem (NFS, CephFS, GlusterFS, Lustre, ...).
    Network,
    /// A FUSE filesystem: a user-space daemon, usually talking to a network.
    Fuse,
    /// Not recognised.
    Unknown,
}

/// What the mount's type and options say, before any probing.
#[derive(Debug, Clone, Serialize)]
pub struct MountAssessment {
    /// Device class.
    pub class: FsClass,
    /// Why the mount is disqualified whatever the probes show, if it is.
    pub disqualified: Option<String>,
    /// Options that weaken the contract or its performance; not fatal.
    pub warnings: Vec<String>,
    /// Facts worth printing.
    pub notes: Vec<String>,
}

/// Parse the text of `/proc/self/mountinfo`. Malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountInfo> {
    // 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    let (left, right) = line.split_once(" - ")?;
    let left: Vec<&str> = left.split(' ').collect();
    let right: Vec<&str> = right.split(' ').collect();
    if left.len() < 6 || right.len() < 3 {
        return None;
    }
    Some(MountInfo {
        root: unescape(left[3]),
        mount_point: PathBuf::from(unescape(left[4])),
        mount_options: split_opts(left[5]),
        fstype: right[0].to_owned(),
        source: unescape(right[1]),
        super_options: split_opts(right[2]),
    })
}

fn split_opts(s: &str) -> Vec<String> {
    s.split(',')
        .filter(|o| !o.is_empty())
        .map(str::to_owned)
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount holding `path` (already canonical): the longest mount point
/// that is a prefix of it; among equal mount points the last one listed,
/// which is the one on top.
pub fn mount_for<'a>(mounts: &'a [MountInfo], path: &Path) -> Option<&'a MountInfo> {
    let mut best: Option<&MountInfo> = None;
    for m in mounts {
        if path.starts_with(&m.mount_point) {
            let better = match best {
                None => true,
                Some(b) => m.mount_point.components().count() >= b.mount_point.components().count(),
            };
            if better {
                best = Some(m);
            }
        }
    }
    best
}

const LOCAL: &[&str] = &[
    "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "overlay", "jfs", "reiserfs",
    "bcachefs", "vfat", "exfat",
];
const MEMORY: &[&str] = &["tmpfs", "ramfs", "shm", "devtmpfs"];
const NETWORK: &[&str] = &[
    "nfs",
    "nfs4",
    "ceph",
    "glusterfs",
    "lustre",
    "gpfs",
    "beegfs",
    "9p",
    "virtiofs",
    "ocfs2",
    "gfs2",
    "afs",
];
const SMB: &[&str] = &["cifs", "smb3", "smbfs", "smb2"];
/// Object-store FUSE mounts whose rename is copy+delete.
const OBJECT_STORE_FUSE: &[&str] = &[
    "s3fs",
    "gcsfuse",
    "mountpoint-s3",
    "goofys",
    "blobfuse",
    "blobfuse2",
];

fn classify(fstype: &str) -> FsClass {
    if MEMORY.contains(&fstype) {
        FsClass::Memory
    } else if LOCAL.contains(&fstype) {
        FsClass::Local
    } else if NETWORK.contains(&fstype) || SMB.contains(&fstype) {
        FsClass::Network
    } else if fstype == "fuse" || fstype == "fuseblk" || fstype.starts_with("fuse.") {
        FsClass::Fuse
    } else {
        FsClass::Unknown
    }
}

/// Judge a mount by its type and options. `exports` is the text of the NFS
/// server's export table (`/var/lib/nfs/etab` or `/proc/fs/nfsd/exports`)
/// when the server is this host; an `async` export is only visible there.
pub fn assess(m: &MountInfo, exports: Option<&str>) -> MountAssessment {
    let class = classify(&m.fstype);
    let mut disqualified = None;
    let mut warnings = Vec::new();
    let mut notes = Vec::new();

    if SMB.contains(&m.fstype.as_str()) {
        disqualified = Some(format!(
            "fstype {} is SMB/CIFS: its open/rename/locking semantics diverge from the contract",
            m.fstype
        ));
    }
    if class == FsClass::Fuse {
        let sub = m.fstype.strip_prefix("fuse.").unwrap_or("");
        let src = m.source.rsplit('/').next().unwrap_or("");
        if let Some(name) = OBJECT_STORE_FUSE
            .iter()
            .find(|n| **n == sub || m.source == **n || src == **n)
        {
            disqualified = Some(format!(
                "{name} is an object-store FUSE mount: rename is copy+delete, not atomic"
            ));
        }
        if sub == "juicefs" {
            notes.push("JuiceFS-class: meets the contract; fsync is an object PUT (slow)".into());
        }
    }
    if m.has_option("async") {
        warnings.push(
            "mount option `async`: client-side write-back is normal (flushed at fsync/close), \
             but make sure the export is not `async` — that is disqualifying and invisible here"
                .into(),
        );
    }
    if m.has_option("nobarrier") || m.option_value("barrier") == Some("0") {
        warnings.push(
            "write barriers disabled (`nobarrier`): fsync may not reach stable storage".into(),
        );
    }
    if m.fstype.starts_with("nfs") {
        assess_nfs(m, exports, &mut disqualified, &mut warnings, &mut notes);
    }
    MountAssessment {
        class,
        disqualified,
        warnings,
        notes,
    }
}

fn assess_nfs(
    m: &MountInfo,
    exports: Option<&str>,
    disqualified: &mut Option<String>,
    warnings: &mut Vec<String>,
    notes: &mut Vec<String>,
) {
    if let Some(v) = m.option_value("vers") {
        notes.push(format!("NFS version {v}"));
        if v.starts_with('2') || v.starts_with('3') {
            warnings.push(format!(
                "NFSv{v}: the contract was debugged against NFSv4.1; v3 exclusive create relies on the server's verifier support"
            ));
        }
    }
    if m.has_option("soft") || m.has_option("softerr") {
        warnings.push(
            "`soft` mount: a slow server turns into EIO mid-write instead of a stall; use `hard`"
                .into(),
        );
    }
    if m.has_option("nocto") {
        *disqualified =
            Some("NFS mounted `nocto`: close-to-open consistency is switched off".into());
    }
    match m.option_value("lookupcache") {
        Some("pos") | Some("positive") | Some("none") => {}
        other => warnings.push(format!(
            "lookupcache={} (negative lookups cached): kaas opens known names and tolerates a stale \
             \"not found\", but `lookupcache=positive` shortens failover discovery",
            other.unwrap_or("all (default)")
        )),
    }
    for key in ["actimeo", "acregmax", "acdirmax"] {
        if let Some(v) = m.option_value(key).and_then(|v| v.parse::<u64>().ok()) {
            if v > 60 {
                warnings.push(format!(
                    "{key}={v}s: attributes and listings may be stale for longer than the 60 s kaas plans for"
                ));
            }
        }
    }
    if m.has_option("nolock") || m.option_value("local_lock") == Some("all") {
        notes
            .push("locking is local only (`nolock`): fine, kaas never relies on file locks".into());
    }
    if let Some(exports) = exports {
        let export_path = m.source.split_once(':').map(|(_, p)| p).unwrap_or("");
        if let Some(opts) = export_options(exports, export_path) {
            if opts.split(',').any(|o| o == "async") {
                *disqualified = Some(format!(
                    "the NFS export {export_path} is `async`: the server acknowledges writes before they are stable"
                ));
            } else {
                notes.push(format!(
                    "export {export_path} options visible on this host: {opts}"
                ));
            }
        }
    }
}

/// Options of `path` in an exports table (`/path<ws>client(opts)`), if listed.
fn export_options(table: &str, path: &str) -> Option<String> {
    if path.is_empty() {
        return None;
    }
    for line in table.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let Some(p) = parts.next() else { continue };
        if p.trim_end_matches('/') != path.trim_end_matches('/') {
            continue;
        }
        for client in parts {
            if let Some((_, rest)) = client.split_once('(') {
                return Some(rest.trim_end_matches(')').to_owned());
            }
        }
    }
    None
}

/// Whether an NFS source names this host (so the server's export table,
/// if present, is the one serving the mount).
pub fn source_is_local(source: &str) -> bool {
    let host = source.split_once(':').map(|(h, _)| h).unwrap_or("");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let own = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    host == "localhost" || host.starts_with("127.") || host == "::1" || host == own.trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 22 0:25 / /dev/shm rw,nosuid,nodev - tmpfs tmpfs rw,size=65536k
41 22 0:40 / /mnt/nfs rw,relatime - nfs4 127.0.0.1:/srv/export rw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,soft,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=127.0.0.1,local_lock=none,addr=127.0.0.1
42 22 0:41 / /mnt/s3 rw,nosuid,nodev,relatime - fuse.s3fs s3fs rw,user_id=0,group_id=0
43 22 0:42 / /mnt/smb rw,relatime - cifs //srv/share rw,vers=3.1.1
44 22 0:43 / /mnt/with\\040space rw - fuse mountpoint-s3 rw,user_id=0
45 22 0:44 / /mnt/nfs/sub rw,relatime - nfs4 srv:/x rw,vers=4.1,hard,nocto,lookupcache=pos
";

    #[test]
    fn parses_and_picks_longest_prefix() {
        let ms = parse_mountinfo(SAMPLE);
        assert_eq!(ms.len(), 7);
        let m = mount_for(&ms, Path::new("/mnt/nfs/data/topic")).unwrap();
        assert_eq!(m.fstype, "nfs4");
        assert_eq!(m.source, "127.0.0.1:/srv/export");
        let m = mount_for(&ms, Path::new("/mnt/nfs/sub/x")).unwrap();
        assert_eq!(m.source, "srv:/x");
        let m = mount_for(&ms, Path::new("/mnt/with space/a")).unwrap();
        assert_eq!(m.source, "mountpoint-s3");
        assert_eq!(mount_for(&ms, Path::new("/var/x")).unwrap().fstype, "ext4");
    }

    #[test]
    fn classifies_and_disqualifies() {
        let ms = parse_mountinfo(SAMPLE);
        let get = |p: &str| mount_for(&ms, Path::new(p)).unwrap().clone();
        assert_eq!(assess(&get("/x"), None).class, FsClass::Local);
        assert!(assess(&get("/x"), None).disqualified.is_none());
        assert_eq!(assess(&get("/dev/shm/a"), None).class, FsClass::Memory);
        let s3 = assess(&get("/mnt/s3/a"), None);
        assert!(s3.disqualified.unwrap().contains("copy+delete"));
        assert!(assess(&get("/mnt/smb/a"), None)
            .disqualified
            .unwrap()
            .contains("SMB"));
        assert!(assess(&get("/mnt/with space/a"), None)
            .disqualified
            .is_some());
        let nocto = assess(&get("/mnt/nfs/sub/a"), None);
        assert!(nocto.disqualified.unwrap().contains("nocto"));
    }

    #[test]
    fn nfs_warnings_and_async_export() {
        let ms = parse_mountinfo(SAMPLE);
        let m = mount_for(&ms, Path::new("/mnt/nfs/a")).unwrap();
        let a = assess(m, None);
        assert_eq!(a.class, FsClass::Network);
        assert!(a.disqualified.is_none());
        assert!(a.warnings.iter().any(|w| w.contains("soft")));
        assert!(a.warnings.iter().any(|w| w.contains("lookupcache")));
        let etab = "/srv/export\t*(rw,async,wdelay,no_root_squash)\n";
        let a = assess(m, Some(etab));
        assert!(a.disqualified.unwrap().contains("async"));
        let etab = "/srv/export\t*(rw,sync,wdelay)\n";
        assert!(assess(m, Some(etab)).disqualified.is_none());
        assert!(source_is_local("127.0.0.1:/srv/export"));
        assert!(!source_is_local("nfs.example:/srv/export"));
    }
}
