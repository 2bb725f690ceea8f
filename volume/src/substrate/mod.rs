//! `substrate-check`: prove a mount honours the substrate contract before any
//! data goes on it.
//!
//! The contract (see `seed/substrate-contract.txt`) rests on three
//! guarantees — atomic same-directory rename, exclusive O_CREAT|O_EXCL,
//! close-to-open consistency — and disqualifies SMB/CIFS, object-store FUSE
//! mounts whose rename is copy+delete, and anything that lies about fsync.
//! This module checks instead of hoping, with real operations through the
//! [`Fs`] seam:
//!
//! * [`quick_check`] is the sub-second subset the broker runs at start-up on
//!   its data and cluster directories: mount type and options, an exclusive
//!   create race between threads, rename semantics on a small file, and a
//!   few fsync timings.
//! * [`full_check`] adds the properties that are about *other hosts*, probed
//!   from several child processes of the same binary (the hidden worker
//!   subcommand, [`worker::run_worker`]): readers racing a rename loop,
//!   an exclusive-create race between processes, close-to-open both ways,
//!   rename timing on a large file, and deleting a file another process
//!   holds open (NFS silly rename).
//!
//! Every probe works in a scratch directory `<dir>/.kaas-substrate-check-*`
//! that it removes when done; a later run removes stale ones left by an
//! interrupted run (rule 2: re-driven to completion). Nothing else in `<dir>`
//! is ever touched, so partition data is safe.
//!
//! The fsync verdict is a heuristic and says so: honest durability cannot be
//! observed from a client, only implausibly fast fsyncs can. See
//! [`probes::fsync_probe`].

pub mod mount;
pub mod os;
pub mod peer;
pub mod probes;
pub mod worker;

use crate::fs::{remove_tree, Fs};
use mount::{FsClass, MountAssessment, MountInfo};
use serde::Serialize;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// Name prefix of every scratch directory the checker creates.
pub use crate::layout::SUBSTRATE_SCRATCH_PREFIX as SCRATCH_PREFIX;
/// A scratch directory this much older (by the volume's own clock) than a
/// fresh one is stale whoever made it: no probe runs this long.
pub const STALE_AFTER: Duration = Duration::from_secs(10 * 60);

/// Why a check could not be run at all (as opposed to a property failing).
#[derive(Debug, thiserror::Error)]
pub enum SubstrateError {
    /// The directory to check cannot be used for probing.
    #[error("cannot probe {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A probe step failed with an I/O error.
    #[error("{step} failed on {path}: {source}")]
    Io {
        /// What was being done.
        step: &'static str,
        /// On which path.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A worker process could not be started or misbehaved.
    #[error("substrate worker: {0}")]
    Worker(String),
    /// Malformed worker arguments.
    #[error("bad substrate-worker arguments: {0}")]
    Usage(String),
    /// `--peer` cannot be used as a second mount.
    #[error("--peer: {0}")]
    Peer(String),
    /// `--peer` is not another mount of the checked volume: a marker created
    /// under the checked directory never appeared under it.
    #[error(
        "{peer} is not the same volume as {dir}: a marker created at {marker} did not appear \
         at the same path under {peer} within {waited_ms} ms"
    )]
    NotSameVolume {
        /// The checked directory.
        dir: String,
        /// The claimed second mount.
        peer: String,
        /// The marker we created.
        marker: String,
        /// How long we looked.
        waited_ms: u64,
    },
}

impl SubstrateError {
    /// Whether the check could not run because the volume (or quota) is
    /// full: not a verdict on the substrate.
    pub fn is_no_space(&self) -> bool {
        match self {
            SubstrateError::Dir { source, .. } | SubstrateError::Io { source, .. } => {
                source.kind() == io::ErrorKind::StorageFull
                    || source.kind() == io::ErrorKind::QuotaExceeded
                    || matches!(
                        source.raw_os_error(),
                        Some(libc::ENOSPC) | Some(libc::EDQUOT)
                    )
            }
            _ => false,
        }
    }

    fn io<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Self + 'a {
        move |source| SubstrateError::Io {
            step,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Outcome of one property.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// The property holds as far as the probe can see.
    Pass,
    /// Holds, but something weakens it or needs attention.
    Warn,
    /// Broken: the mount is disqualified.
    Fail,
    /// The probe could not decide.
    CannotTell,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::CannotTell => "cannot-tell",
        })
    }
}

/// One property and the evidence for its verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Short stable name (`rename-atomic`, `exclusive-create`, ...).
    pub property: &'static str,
    /// Verdict.
    pub status: Status,
    /// What was done and seen.
    pub evidence: String,
    /// Wall time the probe took.
    pub elapsed_ms: u64,
}

impl Check {
    fn new(property: &'static str, status: Status, evidence: impl Into<String>) -> Self {
        Self {
            property,
            status,
            evidence: evidence.into(),
            elapsed_ms: 0,
        }
    }

    /// A probe that hit an I/O error mid-way: that is evidence too.
    fn errored(property: &'static str, e: &SubstrateError) -> Self {
        Self::new(property, Status::CannotTell, format!("probe error: {e}"))
    }
}

/// The result of a check run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The directory checked.
    pub dir: PathBuf,
    /// The mount it lives on, if found.
    pub mount: Option<MountInfo>,
    /// Device class of that mount.
    pub class: FsClass,
    /// Free space and inodes, when `stat -f` could tell.
    pub space: Option<os::Space>,
    /// One entry per property.
    pub checks: Vec<Check>,
    /// Whether this was the start-up subset.
    pub quick: bool,
    /// Total wall time.
    pub elapsed_ms: u64,
    /// The cross-mount figures, when checked with a peer mount.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<peer::PeerSummary>,
}

impl Report {
    /// Why the mount must not be used, if it must not: every failed
    /// property with its evidence.
    pub fn disqualified(&self) -> Option<String> {
        let reasons: Vec<String> = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .map(|c| format!("{}: {}", c.property, c.evidence))
            .collect();
        if reasons.is_empty() {
            None
        } else {
            Some(reasons.join("; "))
        }
    }

    /// Checks with a given status.
    pub fn with_status(&self, status: Status) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(move |c| c.status == status)
    }

    /// The check for a property, if it ran.
    pub fn check(&self, property: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.property == property)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "substrate check{} of {}",
            if self.quick { " (quick)" } else { "" },
            self.dir.display()
        )?;
        for c in &self.checks {
            writeln!(f, "{:<12} {:<22} {}", c.status, c.property, c.evidence)?;
        }
        if let Some(p) = &self.peer {
            writeln!(f, "{p}")?;
        }
        match self.disqualified() {
            Some(why) => write!(f, "DISQUALIFIED: {why}"),
            None => write!(f, "verdict: usable ({} ms)", self.elapsed_ms),
        }
    }
}

/// How [`full_check`] starts its worker processes and how hard it pushes.
#[derive(Debug, Clone)]
pub struct FullOptions {
    /// How to start a worker.
    pub worker: worker::WorkerCommand,
    /// Racing processes for the exclusive-create and rename probes.
    pub processes: usize,
    /// Rounds of the exclusive-create race.
    pub excl_rounds: usize,
    /// Rounds of the close-to-open probe.
    pub cto_rounds: usize,
    /// How long the rename loop races the readers.
    pub rename_race: Duration,
    /// Size of the large file in the rename-timing probe.
    pub large_file_bytes: u64,
    /// A second mount of the same volume, for the cross-mount probes.
    pub peer: Option<peer::PeerOptions>,
}

impl FullOptions {
    /// Defaults for a given worker command.
    pub fn new(worker: worker::WorkerCommand) -> Self {
        Self {
            worker,
            processes: 4,
            excl_rounds: 100,
            cto_rounds: 20,
            rename_race: Duration::from_secs(1),
            large_file_bytes: 64 << 20,
            peer: None,
        }
    }
}

/// A scratch directory under the checked directory, removed on [`Scratch::finish`].
pub struct Scratch<'a> {
    fs: &'a dyn Fs,
    path: PathBuf,
}

impl<'a> Scratch<'a> {
    /// Create `<dir>/.kaas-substrate-check-<pid>-<rand>/` with an owner
    /// file, after sweeping stale scratch directories of earlier runs.
    pub fn create(fs: &'a dyn Fs, dir: &Path) -> Result<Self, SubstrateError> {
        if !fs.is_dir(dir) {
            // Say why: the lookup's own error, a missing name, or another
            // kind of file (is_dir alone folds all three into "no").
            let source = match fs.lookup(dir) {
                Err(e) => e,
                Ok(false) => io::Error::new(io::ErrorKind::NotFound, "no such directory"),
                Ok(true) => io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
            };
            return Err(SubstrateError::Dir {
                path: dir.to_path_buf(),
                source,
            });
        }
        let name = format!(
            "{SCRATCH_PREFIX}{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        );
        let path = dir.join(&name);
        fs.create_dir_all(&path)
            .map_err(|source| SubstrateError::Dir {
                path: path.clone(),
                source,
            })?;
        let owner = path.join("owner");
        let made = probes::create_own(fs, &owner)
            .map_err(SubstrateError::io("create owner file", &owner))
            .and_then(|f| {
                f.write_all_at(os::process_identity().as_bytes(), 0)
                    .map_err(SubstrateError::io("write owner file", &owner))
            });
        if let Err(e) = made {
            // Leave nothing behind (a full volume fails here at every start).
            let _ = crate::fs::remove_tree(fs, &path);
            return Err(e);
        }
        let scratch = Self { fs, path };
        scratch.sweep_stale(dir, &name, &owner);
        Ok(scratch)
    }

    /// The scratch directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Remove stale scratch directories of earlier (interrupted) runs. A
    /// directory is stale when its owner process is known dead (same host
    /// and boot), or when it is older than [`STALE_AFTER`] measured against
    /// our own fresh owner file — both timestamps come from the volume's
    /// clock, so no two hosts' clocks are compared.
    fn sweep_stale(&self, dir: &Path, own: &str, own_owner: &Path) {
        let Ok(names) = self.fs.list(dir) else { return };
        let now = os::mtime(own_owner).ok();
        for name in names
            .iter()
            .filter(|n| n.starts_with(SCRATCH_PREFIX) && n.as_str() != own)
        {
            let p = dir.join(name);
            let owner = p.join("owner");
            let alive = self
                .fs
                .read(&owner)
                .ok()
                .and_then(|b| os::identity_alive(&String::from_utf8_lossy(&b)));
            let newest = newest_mtime(self.fs, &p);
            let old = match (now, newest) {
                (Some(now), Some(t)) => now.duration_since(t).is_ok_and(|age| age > STALE_AFTER),
                _ => false,
            };
            if alive == Some(false) || (alive.is_none() && old) {
                match remove_tree(self.fs, &p) {
                    Ok(()) => {
                        tracing::info!(path = %p.display(), "removed stale substrate-check scratch dir")
                    }
                    Err(e) => {
                        tracing::warn!(path = %p.display(), error = %e, "stale substrate-check scratch dir not removed yet; the next run retries")
                    }
                }
            }
        }
    }

    /// Remove the scratch directory, re-driving for a while: on NFS a
    /// `.nfsXXXX` file keeps it busy until the last handle closes.
    pub fn finish(self) -> Result<(), SubstrateError> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match remove_tree(self.fs, &self.path) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(path = %self.path.display(), error = %e, "scratch dir busy, retrying");
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    return Err(SubstrateError::Io {
                        step: "remove scratch dir (a later run removes it)",
                        path: self.path.clone(),
                        source: e,
                    })
                }
            }
        }
    }
}

fn newest_mtime(fs: &dyn Fs, dir: &Path) -> Option<SystemTime> {
    let mut newest = os::mtime(dir).ok()?;
    for n in fs.list(dir).unwrap_or_default() {
        if let Ok(t) = os::mtime(&dir.join(n)) {
            newest = newest.max(t);
        }
    }
    Some(newest)
}

fn mount_check(dir: &Path) -> (Option<MountInfo>, MountAssessment, Check) {
    let canon = os::canonical(dir).unwrap_or_else(|_| dir.to_path_buf());
    let Some(text) = os::read_system_file("/proc/self/mountinfo") else {
        let a = MountAssessment {
            class: FsClass::Unknown,
            disqualified: None,
            warnings: vec![],
            notes: vec![],
        };
        let c = Check::new(
            "mount",
            Status::CannotTell,
            "/proc/self/mountinfo unreadable: mount type unknown",
        );
        return (None, a, c);
    };
    let mounts = mount::parse_mountinfo(&text);
    let Some(m) = mount::mount_for(&mounts, &canon).cloned() else {
        let a = MountAssessment {
            class: FsClass::Unknown,
            disqualified: None,
            warnings: vec![],
            notes: vec![],
        };
        return (
            None,
            a,
            Check::new(
                "mount",
                Status::CannotTell,
                "no mount found for the directory",
            ),
        );
    };
    let exports = if m.fstype.starts_with("nfs") && mount::source_is_local(&m.source) {
        os::read_system_file("/var/lib/nfs/etab")
            .or_else(|| os::read_system_file("/proc/fs/nfsd/exports"))
    } else {
        None
    };
    let a = mount::assess(&m, exports.as_deref());
    let mut evidence = format!(
        "{} ({:?}) source={} on {} options={}",
        m.fstype,
        a.class,
        m.source,
        m.mount_point.display(),
        m.options().collect::<Vec<_>>().join(",")
    );
    for n in &a.notes {
        evidence.push_str(&format!("; {n}"));
    }
    for w in &a.warnings {
        evidence.push_str(&format!("; warning: {w}"));
    }
    let status = if let Some(why) = &a.disqualified {
        evidence = format!("{why} [{evidence}]");
        Status::Fail
    } else if a.warnings.is_empty() {
        Status::Pass
    } else {
        Status::Warn
    };
    (Some(m), a, Check::new("mount", status, evidence))
}

fn space_check(dir: &Path) -> (Option<os::Space>, Check) {
    match os::space(dir) {
        Ok(s) => {
            let (status, ev) = space_verdict(&s);
            (Some(s), Check::new("space", status, ev))
        }
        Err(e) => (
            None,
            Check::new(
                "space",
                Status::CannotTell,
                format!("statfs unavailable: {e}"),
            ),
        ),
    }
}

/// The verdict on free space and inodes. A field the filesystem does not
/// count (statfs -1, or 0 inodes in total) is said to be "not counted" and
/// never fails or warns: ceph-fuse reports free inodes as -1.
fn space_verdict(s: &os::Space) -> (Status, String) {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut status = Status::Pass;
    let mut ev = match (s.avail_bytes, s.total_bytes) {
        (Some(avail), Some(total)) if total > 0 => {
            let pct = 100.0 * avail as f64 / total as f64;
            let mut ev = format!(
                "{:.1} GiB free of {:.1} GiB ({pct:.0}%)",
                gib(avail),
                gib(total)
            );
            if pct < 10.0 || avail < 1 << 30 {
                status = Status::Warn;
                ev.push_str(" — low: a full volume turns produces into KAFKA_STORAGE_ERROR");
            }
            ev
        }
        (Some(avail), _) => format!("{:.1} GiB free; total size not counted", gib(avail)),
        (None, Some(total)) => format!("free space not counted; {:.1} GiB in total", gib(total)),
        (None, None) => "space not counted by this filesystem".to_owned(),
    };
    match (s.free_inodes, s.total_inodes) {
        (Some(free), Some(total)) if total > 0 => {
            let ipct = 100.0 * free as f64 / total as f64;
            ev.push_str(&format!("; {free} of {total} inodes free ({ipct:.0}%)"));
            if ipct < 5.0 {
                status = Status::Warn;
                ev.push_str(" — low");
            }
        }
        (None, Some(total)) if total > 0 => {
            ev.push_str(&format!("; {total} inodes, free inodes not counted"))
        }
        _ => ev.push_str("; inodes not counted by this filesystem"),
    }
    (status, ev)
}

fn timed(f: impl FnOnce() -> Check) -> Check {
    let t = Instant::now();
    let mut c = f();
    c.elapsed_ms = t.elapsed().as_millis() as u64;
    tracing::debug!(property = c.property, status = %c.status, elapsed_ms = c.elapsed_ms, evidence = %c.evidence, "substrate probe");
    c
}

/// The start-up subset: mount type and options, an exclusive-create race
/// between threads, rename semantics on a small file, and a few fsync
/// timings. Sub-second on any sane mount. Leaves nothing behind.
pub fn quick_check(fs: &dyn Fs, dir: &Path) -> Result<Report, SubstrateError> {
    let t = Instant::now();
    let (mount, assessment, mcheck) = mount_check(dir);
    let scratch = Scratch::create(fs, dir)?;
    let s = scratch.path();
    let mut checks = vec![mcheck];
    checks.push(timed(|| {
        probes::exclusive_create_threads(fs, s, 4, 16)
            .unwrap_or_else(|e| Check::errored("exclusive-create", &e))
    }));
    checks.push(timed(|| {
        probes::rename_identity(fs, s).unwrap_or_else(|e| Check::errored("rename-identity", &e))
    }));
    checks.push(timed(|| {
        probes::fsync_probe(fs, s, assessment.class, 8)
            .unwrap_or_else(|e| Check::errored("fsync", &e))
    }));
    if let Err(e) = scratch.finish() {
        tracing::warn!(error = %e, "substrate-check scratch dir left behind");
    }
    let report = Report {
        dir: dir.to_path_buf(),
        mount,
        class: assessment.class,
        space: None,
        checks,
        quick: true,
        elapsed_ms: t.elapsed().as_millis() as u64,
        peer: None,
    };
    log_report(&report);
    Ok(report)
}

/// Every property, including those about other hosts, probed from worker
/// processes started with `opts.worker`. Takes a few seconds.
pub fn full_check(fs: &dyn Fs, dir: &Path, opts: &FullOptions) -> Result<Report, SubstrateError> {
    let t = Instant::now();
    let (mount, assessment, mcheck) = mount_check(dir);
    let (space, scheck) = space_check(dir);
    let scratch = Scratch::create(fs, dir)?;
    let s = scratch.path();
    let w = &opts.worker;
    // The peer is proved first: a wrong --peer is refused before the
    // seconds of single-mount probing.
    let proved = match &opts.peer {
        Some(p) => match peer::prove_same_volume(fs, dir, s, &p.dir, p.proof_timeout) {
            Ok((theirs, took)) => Some((p, theirs, took)),
            Err(e) => {
                if let Err(c) = scratch.finish() {
                    tracing::warn!(error = %c, "substrate-check scratch dir left behind");
                }
                return Err(e);
            }
        },
        None => None,
    };
    let mut checks = vec![
        mcheck,
        timed(|| {
            probes::rename_atomic_processes(fs, s, w, opts.processes, opts.rename_race)
                .unwrap_or_else(|e| Check::errored("rename-atomic", &e))
        }),
        timed(|| {
            probes::exclusive_create_processes(fs, s, w, opts.processes, opts.excl_rounds)
                .unwrap_or_else(|e| Check::errored("exclusive-create", &e))
        }),
        timed(|| {
            probes::close_to_open(fs, s, w, opts.cto_rounds)
                .unwrap_or_else(|e| Check::errored("close-to-open", &e))
        }),
        timed(|| {
            probes::rename_identity(fs, s).unwrap_or_else(|e| Check::errored("rename-identity", &e))
        }),
        timed(|| {
            probes::rename_timing(fs, s, opts.large_file_bytes)
                .unwrap_or_else(|e| Check::errored("rename-timing", &e))
        }),
        timed(|| {
            probes::fsync_probe(fs, s, assessment.class, 32)
                .unwrap_or_else(|e| Check::errored("fsync", &e))
        }),
        timed(|| {
            probes::silly_rename(fs, s, &|p: &Path| probes::hold_in_worker(w, p))
                .unwrap_or_else(|e| Check::errored("silly-rename", &e))
        }),
        scheck,
    ];
    let peer_summary = match proved {
        Some((p, theirs, took)) => {
            let (summary, cross) = peer_checks(fs, s, &theirs, took, p, w, mount.as_ref());
            checks.extend(cross);
            Some(summary)
        }
        None => None,
    };
    let cleanup = scratch.finish();
    let mut report = Report {
        dir: dir.to_path_buf(),
        mount,
        class: assessment.class,
        space,
        checks,
        quick: false,
        elapsed_ms: t.elapsed().as_millis() as u64,
        peer: peer_summary,
    };
    if let Err(e) = cleanup {
        report
            .checks
            .push(Check::new("cleanup", Status::Warn, e.to_string()));
    }
    log_report(&report);
    Ok(report)
}

/// The cross-mount probes against a proved peer: its mount, then workers
/// on both mounts (see [`peer`]). A probe that cannot run is "cannot tell".
fn peer_checks(
    fs: &dyn Fs,
    ours: &Path,
    theirs: &Path,
    marker: Duration,
    opts: &peer::PeerOptions,
    w: &worker::WorkerCommand,
    our_mount: Option<&MountInfo>,
) -> (peer::PeerSummary, Vec<Check>) {
    let (peer_mount, _, mut pcheck) = mount_check(&opts.dir);
    pcheck.property = "peer-mount";
    let same_client = matches!(
        (os::identity(ours), os::identity(theirs)),
        (Ok(a), Ok(b)) if a.0 == b.0
    );
    let mut checks = vec![
        pcheck,
        Check::new(
            "peer",
            if same_client {
                Status::Warn
            } else {
                Status::Pass
            },
            format!(
                "{} is the same volume: a marker created here appeared there after {} ms{}",
                opts.dir.display(),
                marker.as_millis(),
                if same_client {
                    "; but both paths are on one device (one client seen twice, e.g. a bind \
                     mount): the cross-mount figures say nothing about a second client"
                } else {
                    ""
                }
            ),
        ),
    ];
    let hint = peer::cto_fix_hint([our_mount, peer_mount.as_ref()]);
    let t = Instant::now();
    let run = || -> Result<peer::CrossResult, SubstrateError> {
        let mut workers = Vec::new();
        for _ in 0..opts.racers_per_side.max(1) {
            workers.push(("here".to_owned(), peer::spawn(w, ours)?));
        }
        for _ in 0..opts.racers_per_side.max(1) {
            workers.push(("peer".to_owned(), peer::spawn(w, theirs)?));
        }
        let mut reader = peer::spawn(w, theirs)?;
        let mut racers: Vec<(String, &mut dyn peer::Peer)> = workers
            .iter_mut()
            .enumerate()
            .map(|(i, (side, wk))| (format!("{side}-{i}"), wk as &mut dyn peer::Peer))
            .collect();
        peer::cross_checks(fs, ours, &mut reader, &mut racers, opts, &hint)
    };
    let (visibility, fsync_p99, renewal) = match run() {
        Ok(r) => {
            checks.extend(r.checks);
            (r.visibility, r.fsync_p99, Some(r.renewal))
        }
        Err(e) => {
            let mut c = Check::errored("cross-mount", &e);
            c.elapsed_ms = t.elapsed().as_millis() as u64;
            checks.push(c);
            (Vec::new(), Duration::ZERO, None)
        }
    };
    let renew = peer::renewal_p99(renewal.as_ref(), fsync_p99);
    let summary = peer::PeerSummary {
        dir: opts.dir.clone(),
        mount: peer_mount,
        marker_ms: marker.as_millis() as u64,
        suggested_lease_ms: peer::suggest_lease(&visibility, renew),
        fsync_p99_ms: fsync_p99.as_secs_f64() * 1e3,
        renewal,
        visibility,
        lease_rule: peer::LEASE_RULE,
    };
    (summary, checks)
}

fn log_report(r: &Report) {
    match r.disqualified() {
        Some(why) => {
            tracing::error!(dir = %r.dir.display(), quick = r.quick, elapsed_ms = r.elapsed_ms, reason = %why, "substrate disqualified")
        }
        None => {
            tracing::info!(dir = %r.dir.display(), quick = r.quick, elapsed_ms = r.elapsed_ms, class = ?r.class, "substrate check passed")
        }
    }
}

#[cfg(test)]
mod tests;
