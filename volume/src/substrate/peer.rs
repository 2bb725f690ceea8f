//! `substrate-check DIR --peer DIR2`: the properties only two clients of one
//! volume can see, and how long a change made through one stays invisible
//! or stale through the other.
//!
//! Two mounts of the same volume are two clients (two "hosts", even on one
//! machine): each has its own attribute, lookup, listing and data caches.
//! One mount alone cannot show a client serving cached data on open
//! (default GlusterFS did, for 1–2 s, in 198 of 200 rounds — issue 28), nor
//! how long a negative lookup or a directory listing stays stale.
//!
//! First the peer is proved to be the same volume: a marker created under
//! our scratch directory must appear at the same relative path under
//! `DIR2` within a bounded wait. Then worker processes serving `DIR2` (the
//! `peer <dir>` role, [`answer`]) race and read against this process
//! writing through `DIR`:
//!
//! * `cross-close-to-open`: a file written, fsynced and closed on one mount
//!   is complete and current on the other's next open — new files,
//!   in-place rewrites both ways, and the first open after a rename into
//!   place — and the opened file's size is the written size. Any violation
//!   disqualifies: it is guarantee 3 of the contract.
//! * `cross-exclusive-create`: racers on both mounts O_CREAT|O_EXCL the same
//!   name each round: exactly one winner (guarantee 2).
//! * `cross-rename`, `cross-negative-lookup`, `cross-listing`: after a
//!   rename over a name, the creation of a name the peer has just looked up
//!   and not found, and the creation of a file in a directory the peer has
//!   just listed: how long until the peer sees it, polled every
//!   [`PeerOptions::poll`] up to [`PeerOptions::deadline`] per round.
//!   Measured, not failed: NFS allows both caches (`actimeo`,
//!   `lookupcache`), and the broker's lease must outlast them. The figures
//!   give a suggested lease ([`suggest_lease`]).
//! * `cross-renewal`: the writer's side, as brokers beat: both mounts keep a
//!   record in one directory, re-read the other's by name and replace their
//!   own the way a heartbeat does ([`write_atomic`]: temp, fsync, rename,
//!   directory fsync) — the peer every [`RENEWAL_POLL`], we every 100 ms,
//!   for [`PeerOptions::renewal`] — and we time each of our replacements. A filesystem that must take back the
//!   readers' cached state of the directory before a rename completes pays
//!   it here, and nowhere else in the check: CephFS with its default 5 s MDS
//!   tick took up to 4.9 s per heartbeat this way (issue 28) while every
//!   other probe stayed under 0.5 s. Measured, not failed; it enters the
//!   suggested lease in place of the bare fsync.

use super::mount::MountInfo;
use super::probes::{create_own, excl_attempt, pattern, rewrite_in_place, verify_pattern, Verdict};
use super::worker::{Worker, WorkerCommand};
use super::{os, Check, Status, SubstrateError};
use crate::fs::{write_atomic, Fs};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How hard the cross-mount probes push.
#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// The second mount of the volume.
    pub dir: PathBuf,
    /// How long the marker may take to appear on the peer before it is
    /// declared another volume.
    pub proof_timeout: Duration,
    /// Rounds of the close-to-open and exclusive-create probes.
    pub rounds: usize,
    /// Rounds of each timed visibility probe.
    pub visibility_rounds: usize,
    /// Polling interval of the timed probes.
    pub poll: Duration,
    /// Per-round bound of the timed probes: past it the change is "not seen".
    pub deadline: Duration,
    /// Exclusive-create racers on each mount.
    pub racers_per_side: usize,
    /// How long `cross-renewal` runs: a stall that comes every few seconds
    /// (CephFS's MDS tick) needs seconds to show.
    pub renewal: Duration,
}

impl PeerOptions {
    /// Defaults for a peer directory.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            proof_timeout: Duration::from_secs(30),
            rounds: 20,
            visibility_rounds: 10,
            poll: Duration::from_millis(1),
            deadline: Duration::from_secs(10),
            racers_per_side: 2,
            renewal: Duration::from_secs(10),
        }
    }
}

/// How long a change made through one mount stayed invisible through the
/// other, over the rounds of one timed probe.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Visibility {
    /// The property (`cross-rename`, ...).
    pub property: &'static str,
    /// Rounds run.
    pub rounds: usize,
    /// Rounds in which the peer never saw the change within the deadline.
    pub not_seen: usize,
    /// Median, ms (over the rounds where it was seen).
    pub p50_ms: f64,
    /// 99th percentile (nearest rank), ms.
    pub p99_ms: f64,
    /// Slowest, ms.
    pub max_ms: f64,
    /// The per-round deadline, ms.
    pub deadline_ms: u64,
}

impl Visibility {
    /// Figures from per-round samples (`None`: not seen within `deadline`).
    pub fn from_samples(
        property: &'static str,
        samples: &[Option<Duration>],
        deadline: Duration,
    ) -> Self {
        let mut seen: Vec<f64> = samples
            .iter()
            .flatten()
            .map(|d| d.as_secs_f64() * 1e3)
            .collect();
        seen.sort_by(f64::total_cmp);
        let rank = |p: f64| -> f64 {
            if seen.is_empty() {
                return 0.0;
            }
            let i = ((p * seen.len() as f64).ceil() as usize).clamp(1, seen.len()) - 1;
            seen[i]
        };
        Self {
            property,
            rounds: samples.len(),
            not_seen: samples.iter().filter(|s| s.is_none()).count(),
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            max_ms: seen.last().copied().unwrap_or(0.0),
            deadline_ms: deadline.as_millis() as u64,
        }
    }

    /// The p99 the lease has to outlast: the deadline when any round was
    /// not seen at all.
    pub fn p99_bound_ms(&self) -> f64 {
        if self.not_seen > 0 {
            self.deadline_ms as f64
        } else {
            self.p99_ms
        }
    }
}

impl fmt::Display for Visibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invisible on the peer p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over {} rounds",
            self.p50_ms, self.p99_ms, self.max_ms, self.rounds
        )?;
        if self.not_seen > 0 {
            write!(
                f,
                "; {} not seen within {} ms",
                self.not_seen, self.deadline_ms
            )?;
        }
        Ok(())
    }
}

/// How long replacing a record took here while the peer kept reading it
/// (`cross-renewal`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Renewal {
    /// Replacements made.
    pub rounds: usize,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile (nearest rank), ms.
    pub p99_ms: f64,
    /// Slowest, ms.
    pub max_ms: f64,
    /// Reads the peer made meanwhile, and how many failed.
    pub peer_reads: u64,
    /// See `peer_reads`.
    pub peer_errors: u64,
}

impl Renewal {
    /// Figures from per-replacement durations.
    pub fn from_samples(samples: &[Duration], peer_reads: u64, peer_errors: u64) -> Self {
        let v = Visibility::from_samples(
            "cross-renewal",
            &samples.iter().copied().map(Some).collect::<Vec<_>>(),
            Duration::ZERO,
        );
        Self {
            rounds: samples.len(),
            p50_ms: v.p50_ms,
            p99_ms: v.p99_ms,
            max_ms: v.max_ms,
            peer_reads,
            peer_errors,
        }
    }

    /// The p99 as a duration.
    pub fn p99(&self) -> Duration {
        Duration::from_secs_f64(self.p99_ms / 1e3)
    }
}

impl fmt::Display for Renewal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "replacing a record the peer keeps reading (temp, fsync, rename, dir fsync) took \
             p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over {} rounds; the peer read it {} times ({} failed)",
            self.p50_ms, self.p99_ms, self.max_ms, self.rounds, self.peer_reads, self.peer_errors
        )
    }
}

/// The renewal half of [`LEASE_RULE`]: the heartbeat-style replace under
/// a reading peer (`cross-renewal`), never less than a bare fsync.
pub fn renewal_p99(renewal: Option<&Renewal>, fsync_p99: Duration) -> Duration {
    renewal.map_or(fsync_p99, |r| r.p99().max(fsync_p99))
}

/// How often the peer re-reads the record during `cross-renewal`: about
/// as often as a broker polls the others' liveness records.
pub const RENEWAL_POLL: Duration = Duration::from_millis(50);

/// The lease rule, stated where it is printed.
pub const LEASE_RULE: &str =
    "lease >= 3 x (cross-mount visibility p99 + renewal p99), and >= 3000 ms; a suggestion";

/// The lease [`LEASE_RULE`] suggests, in ms rounded up to 100 ms: three
/// times the worst visibility p99 plus the renewal p99 — a holder must be
/// able to renew (a heartbeat's replace while others read it, at least an
/// fsync) and the others must see the renewal (visibility) with room for
/// two misses — and never under 3 s.
pub fn suggest_lease(visibility: &[Visibility], renewal_p99: Duration) -> u64 {
    let vis = visibility
        .iter()
        .map(Visibility::p99_bound_ms)
        .fold(0.0, f64::max);
    let ms = 3.0 * (vis + renewal_p99.as_secs_f64() * 1e3);
    let ms = (ms.ceil() as u64).div_ceil(100) * 100;
    ms.max(3000)
}

/// What the cross-mount probes found, beside their checks.
#[derive(Debug, Clone, Serialize)]
pub struct PeerSummary {
    /// The peer directory.
    pub dir: PathBuf,
    /// The mount it lives on, if found.
    pub mount: Option<MountInfo>,
    /// How long the proof marker took to appear on the peer, ms.
    pub marker_ms: u64,
    /// The timed probes.
    pub visibility: Vec<Visibility>,
    /// fsync p99 on this mount (4 KiB append + fdatasync), ms.
    pub fsync_p99_ms: f64,
    /// The heartbeat-style replace of a record the peer keeps reading
    /// (`cross-renewal`), if it ran.
    pub renewal: Option<Renewal>,
    /// [`suggest_lease`].
    pub suggested_lease_ms: u64,
    /// [`LEASE_RULE`].
    pub lease_rule: &'static str,
}

impl fmt::Display for PeerSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "across mounts with {} (marker seen after {} ms):",
            self.dir.display(),
            self.marker_ms
        )?;
        for v in &self.visibility {
            writeln!(f, "  {:<22} {v}", v.property)?;
        }
        if let Some(r) = &self.renewal {
            writeln!(f, "  {:<22} {r}", "cross-renewal")?;
        }
        write!(
            f,
            "  fsync p99 {:.1} ms; suggested lease: at least {} ms ({})",
            self.fsync_p99_ms, self.suggested_lease_ms, self.lease_rule
        )
    }
}

// ------------------------------------------------------------ the proof

/// Prove `peer` is the same volume as `dir`: create a marker in our scratch
/// directory `scratch` (under `dir`) and wait, bounded, for it to appear
/// with the same contents at the same relative path under `peer`. Returns
/// the peer's scratch directory and how long the marker took.
pub fn prove_same_volume(
    fs: &dyn Fs,
    dir: &Path,
    scratch: &Path,
    peer: &Path,
    timeout: Duration,
) -> Result<(PathBuf, Duration), SubstrateError> {
    if !fs.is_dir(peer) {
        return Err(SubstrateError::Dir {
            path: peer.to_path_buf(),
            source: io::Error::new(io::ErrorKind::NotFound, "not a directory"),
        });
    }
    if let (Ok(a), Ok(b)) = (os::canonical(dir), os::canonical(peer)) {
        if a == b {
            return Err(SubstrateError::Peer(format!(
                "{} is {} itself: --peer needs a second mount of the same volume",
                peer.display(),
                dir.display()
            )));
        }
    }
    let rel = scratch
        .strip_prefix(dir)
        .map_err(|_| SubstrateError::Peer("scratch directory outside the checked one".into()))?;
    let token = format!("{} {:016x}", os::process_identity(), rand::random::<u64>());
    let marker = scratch.join("peer-marker");
    let f = create_own(fs, &marker).map_err(SubstrateError::io("create peer marker", &marker))?;
    f.write_all_at(token.as_bytes(), 0)
        .and_then(|_| f.sync_data())
        .map_err(SubstrateError::io("write peer marker", &marker))?;
    drop(f);
    let peer_scratch = peer.join(rel);
    let theirs = peer_scratch.join("peer-marker");
    let t = Instant::now();
    loop {
        if fs.read(&theirs).is_ok_and(|b| b == token.as_bytes()) {
            return Ok((peer_scratch, t.elapsed()));
        }
        if t.elapsed() >= timeout {
            return Err(SubstrateError::NotSameVolume {
                dir: dir.display().to_string(),
                peer: peer.display().to_string(),
                marker: marker.display().to_string(),
                waited_ms: t.elapsed().as_millis() as u64,
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ------------------------------------------------------------- the peer

/// One client of the volume that answers probe commands: a worker process
/// on the peer mount (or on ours), or, in tests, this process.
pub trait Peer {
    /// Send one command.
    fn send(&mut self, line: &str) -> Result<(), SubstrateError>;
    /// Its answer (bounded wait).
    fn recv(&mut self) -> Result<String, SubstrateError>;
    /// Send and wait for the answer.
    fn ask(&mut self, line: &str) -> Result<String, SubstrateError> {
        self.send(line)?;
        self.recv()
    }
}

impl Peer for Worker {
    fn send(&mut self, line: &str) -> Result<(), SubstrateError> {
        Worker::send(self, line)
    }
    fn recv(&mut self) -> Result<String, SubstrateError> {
        Worker::recv(self)
    }
}

/// A peer served by this process through `fs` (tests, and a stand-in where
/// no worker can be started).
pub struct InProcess<'a> {
    /// The seam.
    pub fs: &'a dyn Fs,
    /// The directory it serves.
    pub dir: PathBuf,
    /// Answers not yet received.
    pub pending: VecDeque<String>,
}

impl<'a> InProcess<'a> {
    /// Serve `dir` through `fs`.
    pub fn new(fs: &'a dyn Fs, dir: &Path) -> Self {
        Self {
            fs,
            dir: dir.to_path_buf(),
            pending: VecDeque::new(),
        }
    }
}

impl Peer for InProcess<'_> {
    fn send(&mut self, line: &str) -> Result<(), SubstrateError> {
        self.pending.push_back(answer(self.fs, &self.dir, line));
        Ok(())
    }
    fn recv(&mut self) -> Result<String, SubstrateError> {
        self.pending
            .pop_front()
            .ok_or_else(|| SubstrateError::Worker("no command pending".into()))
    }
}

/// Start a `peer <dir>` worker.
pub fn spawn(cmd: &WorkerCommand, dir: &Path) -> Result<Worker, SubstrateError> {
    Worker::spawn(cmd, "peer", &[dir])
}

/// What a `wait` command saw.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WaitOutcome {
    /// Seen before the deadline.
    pub seen: bool,
    /// Polls made.
    pub polls: u64,
    /// The first poll's answer (for `content`: the first open after the
    /// change, which close-to-open says must already be current).
    pub first: String,
    /// The last poll's answer.
    pub last: String,
}

/// One probe command, run by the client serving `dir`; names are relative
/// to `dir`. Commands and answers:
/// * `read <name> <len> <seed>`: open, fstat, read: `ok`, `size <n>
///   expected <len>`, `stale saw version <s>, expected <seed>`, `torn ..`,
///   `error ..`.
/// * `write <name> <len> <seed>`: rewrite in place and close: `done`.
/// * `create <name> <len> <seed>`: create, write, fsync, close: `done`.
/// * `exists <name>`: one lookup: `present` / `absent`.
/// * `list <subdir>`: one listing: `listed <n>`.
/// * `excl <name> <id>`: race an exclusive create: `won`, `lost ..`.
/// * `wait exists|listed|content <name> <deadline_ms> <poll_us> [<len> <seed>]`:
///   poll until the name exists / its directory lists it / it reads as
///   `seed`; one JSON [`WaitOutcome`].
/// * `watch <name> <own> <stop> <max_ms> <poll_us>`: every `poll_us`, read
///   `name` and replace `own` ([`write_atomic`]), until a file `stop`
///   exists (looked up every poll) or `max_ms` passed: `watched <reads>
///   <errors>` (errors of reads and replaces).
pub fn answer(fs: &dyn Fs, dir: &Path, line: &str) -> String {
    let parts: Vec<&str> = line.split_whitespace().collect();
    let num = |s: &str| s.parse::<u64>().ok();
    match parts.as_slice() {
        ["read", name, len, seed] => match (num(len), num(seed)) {
            (Some(len), Some(seed)) => read_answer(fs, &dir.join(name), len as usize, seed),
            _ => "error bad command".into(),
        },
        [op @ ("write" | "create"), name, len, seed] => match (num(len), num(seed)) {
            (Some(len), Some(seed)) => {
                let path = dir.join(name);
                let bytes = pattern(seed, len as usize);
                let r = if *op == "write" {
                    rewrite_in_place(fs, &path, &bytes)
                } else {
                    create_synced(fs, &path, &bytes)
                };
                match r {
                    Ok(()) => "done".into(),
                    Err(e) => format!("error {e}"),
                }
            }
            _ => "error bad command".into(),
        },
        ["exists", name] => exists_answer(fs, &dir.join(name)),
        ["list", sub] => match fs.list(&dir.join(sub)) {
            Ok(l) => format!("listed {}", l.len()),
            Err(e) => format!("error {e}"),
        },
        ["excl", name, id] => excl_attempt(fs, &dir.join(name), id),
        ["watch", name, own, stop, max_ms, poll_us] => match (num(max_ms), num(poll_us)) {
            (Some(max), Some(poll)) => watch(
                fs,
                &dir.join(name),
                &dir.join(own),
                &dir.join(stop),
                Duration::from_millis(max),
                Duration::from_micros(poll),
            ),
            _ => "error bad command".into(),
        },
        ["wait", kind, name, deadline_ms, poll_us, rest @ ..] => {
            let (Some(deadline), Some(poll)) = (num(deadline_ms), num(poll_us)) else {
                return "error bad command".into();
            };
            let path = dir.join(name);
            let probe: Box<dyn Fn() -> (bool, String)> = match (*kind, rest) {
                ("exists", []) => Box::new(|| {
                    let a = exists_answer(fs, &path);
                    (a == "present", a)
                }),
                ("listed", []) => {
                    let (parent, file) = (path.parent().unwrap_or(dir), path.file_name());
                    Box::new(move || match fs.list(parent) {
                        Ok(l) => {
                            let hit = file.is_some_and(|f| l.iter().any(|n| f == n.as_str()));
                            (hit, if hit { "listed" } else { "not listed" }.into())
                        }
                        Err(e) => (false, format!("error {e}")),
                    })
                }
                ("content", [len, seed]) => match (num(len), num(seed)) {
                    (Some(len), Some(seed)) => Box::new(move || {
                        let a = read_answer(fs, &path, len as usize, seed);
                        (a == "ok", a)
                    }),
                    _ => return "error bad command".into(),
                },
                _ => return "error bad command".into(),
            };
            let out = poll_until(
                &*probe,
                Duration::from_millis(deadline),
                Duration::from_micros(poll),
            );
            serde_json::to_string(&out).unwrap_or_else(|e| format!("error {e}"))
        }
        _ => "error bad command".into(),
    }
}

fn poll_until(
    probe: &dyn Fn() -> (bool, String),
    deadline: Duration,
    poll: Duration,
) -> WaitOutcome {
    let t = Instant::now();
    let mut out = WaitOutcome {
        seen: false,
        polls: 0,
        first: String::new(),
        last: String::new(),
    };
    loop {
        let (hit, what) = probe();
        out.polls += 1;
        if out.polls == 1 {
            out.first = what.clone();
        }
        out.last = what;
        if hit {
            out.seen = true;
            return out;
        }
        if t.elapsed() >= deadline {
            return out;
        }
        std::thread::sleep(poll);
    }
}

/// Every `poll`, re-read `path` and replace `own`, until `stop` exists or
/// `max` passed.
fn watch(
    fs: &dyn Fs,
    path: &Path,
    own: &Path,
    stop: &Path,
    max: Duration,
    poll: Duration,
) -> String {
    let t = Instant::now();
    let (mut reads, mut errors) = (0u64, 0u64);
    let body = pattern(4, 512);
    while t.elapsed() < max && !matches!(fs.lookup(stop), Ok(true)) {
        reads += 1;
        if fs.read(path).is_err() {
            errors += 1;
        }
        if write_atomic(fs, own, &body).is_err() {
            errors += 1;
        }
        std::thread::sleep(poll);
    }
    format!("watched {reads} {errors}")
}

fn exists_answer(fs: &dyn Fs, path: &Path) -> String {
    match fs.lookup(path) {
        Ok(true) => "present".into(),
        Ok(false) => "absent".into(),
        Err(e) => format!("error {e}"),
    }
}

/// Open by name, check the opened file's size, read it whole and compare
/// with the pattern `seed` of `len` bytes.
fn read_answer(fs: &dyn Fs, path: &Path, len: usize, seed: u64) -> String {
    let f = match fs.open_read(path) {
        Ok(f) => f,
        Err(e) => return format!("error {e}"),
    };
    let size = match f.len() {
        Ok(n) => n,
        Err(e) => return format!("error fstat: {e}"),
    };
    let mut buf = vec![0u8; len + 1];
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return format!("error read: {e}"),
        }
    }
    if n != len {
        let version = if n >= 8 {
            let mut w = [0u8; 8];
            w.copy_from_slice(&buf[..8]);
            format!(" of version {}", u64::from_le_bytes(w))
        } else {
            String::new()
        };
        let what = if n < len { "short file" } else { "long file" };
        return format!(
            "{what}: read {n} bytes{version}, expected {len} of version {seed} (fstat said {size})"
        );
    }
    match verify_pattern(&buf[..n], len) {
        Verdict::Ok(s) if s == seed && size == len as u64 => "ok".into(),
        Verdict::Ok(s) if s == seed => format!("size {size} expected {len}"),
        Verdict::Ok(s) => format!("stale saw version {s}, expected {seed}"),
        Verdict::Torn(why) => format!("torn {why}"),
    }
}

/// Create, write, fsync and close: how every persisted file is written.
fn create_synced(fs: &dyn Fs, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let f = create_own(fs, path)?;
    f.write_all_at(bytes, 0)?;
    f.sync_data()
}

// ---------------------------------------------------------- the probes

/// Everything the cross-mount probes produce.
pub struct CrossResult {
    /// One check per property.
    pub checks: Vec<Check>,
    /// The timed probes.
    pub visibility: Vec<Visibility>,
    /// fsync p99 on our mount.
    pub fsync_p99: Duration,
    /// `cross-renewal`.
    pub renewal: Renewal,
}

/// Our side of the cross-mount probes: `ours` is our scratch directory,
/// `reader` a peer serving the peer's scratch directory, `racers` the
/// exclusive-create racers (on both mounts; ours first), each labelled.
pub fn cross_checks(
    fs: &dyn Fs,
    ours: &Path,
    reader: &mut dyn Peer,
    racers: &mut [(String, &mut dyn Peer)],
    opts: &PeerOptions,
    hint: &str,
) -> Result<CrossResult, SubstrateError> {
    for sub in ["cto", "ren", "neg", "list", "excl", "beat"] {
        let p = ours.join(sub);
        fs.create_dir_all(&p)
            .map_err(SubstrateError::io("mkdir", &p))?;
    }
    let mut bad: Vec<String> = Vec::new();
    let mut handoffs = 0usize;
    let (rename, first_opens) = timed_rename(fs, ours, reader, opts)?;
    handoffs += first_opens.0;
    bad.extend(first_opens.1);
    let (n, b) = handoffs_both_ways(fs, ours, reader, opts.rounds)?;
    handoffs += n;
    bad.extend(b);
    let cto = if bad.is_empty() {
        Check::new(
            "cross-close-to-open",
            Status::Pass,
            format!(
                "{handoffs} hand-offs between the mounts (new files, in-place rewrites both \
                 ways, first open after a rename into place): every first open complete, \
                 current and of the written size"
            ),
        )
    } else {
        Check::new(
            "cross-close-to-open",
            Status::Fail,
            format!(
                "close-to-open broken between the mounts: {} of {handoffs} first opens after \
                 the writer's close saw old content, a short file or a wrong size; first: {}{hint}",
                bad.len(),
                bad[0]
            ),
        )
    };
    let excl = cross_exclusive_create(fs, &ours.join("excl"), racers, opts.rounds)?;
    let neg = timed_appearance(fs, ours, reader, opts, "neg", "cross-negative-lookup")?;
    let list = timed_appearance(fs, ours, reader, opts, "list", "cross-listing")?;
    let fsync_p99 = fsync_p99(fs, &ours.join("fsync-p99"), 20)?;
    let renewal = watched_renewal(fs, ours, reader, opts)?;
    let mut checks = vec![cto, excl];
    let mut visibility = Vec::new();
    for (v, what) in [
        (rename, "after a rename over a name the peer had open-read"),
        (neg, "after creating a name the peer had just looked up and not found (negative lookup cache)"),
        (list, "after creating a file in a directory the peer had just listed (listing cache)"),
    ] {
        let status = if v.not_seen > 0 {
            Status::Warn
        } else {
            Status::Pass
        };
        checks.push(Check::new(v.property, status, format!("{what}: {v}")));
        visibility.push(v);
    }
    checks.push(renewal_check(&renewal));
    Ok(CrossResult {
        checks,
        visibility,
        fsync_p99,
        renewal,
    })
}

/// A renewal this slow (p99) lapses the broker's default 3 s lease by the
/// lease rule: warn, and say so.
pub const SLOW_RENEWAL_MS: f64 = 1000.0;

/// The `cross-renewal` check: measured, warned when the peer's reads or
/// replaces failed or when the p99 reaches [`SLOW_RENEWAL_MS`].
pub fn renewal_check(r: &Renewal) -> Check {
    let slow = r.p99_ms >= SLOW_RENEWAL_MS;
    let status = if slow || r.peer_errors > 0 {
        Status::Warn
    } else {
        Status::Pass
    };
    let mut evidence = r.to_string();
    if slow {
        evidence.push_str(
            "; a heartbeat this slow lapses the default 3 s lease: set --lease-ms to the \
             suggested lease, or make the substrate answer faster (CephFS: a shorter \
             `mds tick interval`)",
        );
    }
    Check::new("cross-renewal", status, evidence)
}

fn wait_outcome(line: &str) -> Result<WaitOutcome, SubstrateError> {
    serde_json::from_str(line)
        .map_err(|e| SubstrateError::Worker(format!("peer wait answer {line:?}: {e}")))
}

/// Lengths vary per round so that a size cached from an earlier version
/// shows up; a multiple of 8 (the pattern's word).
fn round_len(r: usize) -> usize {
    16 * 1024 + 8 * (r % 97)
}

/// The peer reads `ren/target`; we write a new version to a temp name,
/// fsync, close and rename it over; the peer's first open must see it
/// (close-to-open), and we time how long until it does.
fn timed_rename(
    fs: &dyn Fs,
    ours: &Path,
    reader: &mut dyn Peer,
    opts: &PeerOptions,
) -> Result<(Visibility, (usize, Vec<String>)), SubstrateError> {
    let target = ours.join("ren/target");
    create_synced(fs, &target, &pattern(1, round_len(0)))
        .map_err(SubstrateError::io("create", &target))?;
    let mut samples = Vec::new();
    let mut bad = Vec::new();
    let mut prev = (1u64, round_len(0));
    for r in 1..=opts.visibility_rounds {
        // Prime the peer's caches with the current version.
        let a = reader.ask(&format!("read ren/target {} {}", prev.1, prev.0))?;
        if a != "ok" {
            bad.push(format!("rename round {r}, before the change: peer saw {a}"));
        }
        let (seed, len) = (r as u64 + 1, round_len(r));
        let tmp = ours.join(format!("ren/tmp-{r}"));
        create_synced(fs, &tmp, &pattern(seed, len)).map_err(SubstrateError::io("create", &tmp))?;
        fs.rename(&tmp, &target)
            .map_err(SubstrateError::io("rename", &tmp))?;
        let t = Instant::now();
        let line = reader.ask(&format!(
            "wait content ren/target {} {} {len} {seed}",
            opts.deadline.as_millis(),
            opts.poll.as_micros()
        ))?;
        let elapsed = t.elapsed();
        let w = wait_outcome(&line)?;
        if w.first != "ok" {
            bad.push(format!(
                "rename into place, round {r}: the peer's first open saw {} ({})",
                w.first,
                if w.seen {
                    format!("current after {:.0} ms", elapsed.as_secs_f64() * 1e3)
                } else {
                    format!("not current within {} ms", opts.deadline.as_millis())
                }
            ));
        }
        samples.push(w.seen.then_some(elapsed));
        prev = (seed, len);
    }
    let v = Visibility::from_samples("cross-rename", &samples, opts.deadline);
    Ok((v, (opts.visibility_rounds, bad)))
}

/// New files and in-place rewrites, written and closed on one mount and
/// read once on the other, both ways.
fn handoffs_both_ways(
    fs: &dyn Fs,
    ours: &Path,
    reader: &mut dyn Peer,
    rounds: usize,
) -> Result<(usize, Vec<String>), SubstrateError> {
    const SHARED_LEN: usize = 64 * 1024;
    let shared = ours.join("cto/shared");
    create_synced(fs, &shared, &pattern(1, SHARED_LEN))
        .map_err(SubstrateError::io("create", &shared))?;
    let mut bad = Vec::new();
    let mut n = 0;
    for r in 0..rounds {
        let (seed, len) = (100 + r as u64, round_len(r));
        let name = format!("cto/new-{r}");
        create_synced(fs, &ours.join(&name), &pattern(seed, len))
            .map_err(SubstrateError::io("create", &ours.join(&name)))?;
        let a = reader.ask(&format!("read {name} {len} {seed}"))?;
        if a != "ok" {
            bad.push(format!("new file {name} closed here: the peer saw {a}"));
        }
        let seed = 1000 + r as u64;
        rewrite_in_place(fs, &shared, &pattern(seed, SHARED_LEN))
            .map_err(SubstrateError::io("rewrite", &shared))?;
        let a = reader.ask(&format!("read cto/shared {SHARED_LEN} {seed}"))?;
        if a != "ok" {
            bad.push(format!(
                "file rewritten in place here, round {r}: the peer saw {a}"
            ));
        }
        let seed = 5000 + r as u64;
        let a = reader.ask(&format!("write cto/shared {SHARED_LEN} {seed}"))?;
        if a != "done" {
            bad.push(format!("the peer could not rewrite cto/shared: {a}"));
        } else {
            let a = read_answer(fs, &shared, SHARED_LEN, seed);
            if a != "ok" {
                bad.push(format!(
                    "file rewritten in place on the peer, round {r}: this mount saw {a}"
                ));
            }
        }
        n += 3;
    }
    Ok((n, bad))
}

/// Racers on both mounts create `excl/excl-<round>` exclusively each round.
fn cross_exclusive_create(
    fs: &dyn Fs,
    dir: &Path,
    racers: &mut [(String, &mut dyn Peer)],
    rounds: usize,
) -> Result<Check, SubstrateError> {
    let mut tally = super::probes::ExclTally::default();
    for r in 0..rounds {
        for (id, p) in racers.iter_mut() {
            p.send(&format!("excl excl/excl-{r} {id}"))?;
        }
        let mut answers = Vec::with_capacity(racers.len());
        for (id, p) in racers.iter_mut() {
            answers.push((id.clone(), p.recv()?));
        }
        tally.round(fs, &dir.join(format!("excl-{r}")), &answers);
    }
    Ok(tally.check_as(
        "cross-exclusive-create",
        racers.len(),
        "processes on both mounts",
    ))
}

/// The peer looks a name up (`neg`: must be absent) or lists its directory
/// (`list`); we create the file; how long until the peer sees it.
fn timed_appearance(
    fs: &dyn Fs,
    ours: &Path,
    reader: &mut dyn Peer,
    opts: &PeerOptions,
    sub: &str,
    property: &'static str,
) -> Result<Visibility, SubstrateError> {
    let mut samples = Vec::new();
    for r in 0..opts.visibility_rounds {
        let name = format!("{sub}/f-{r}");
        let primed = if sub == "neg" {
            reader.ask(&format!("exists {name}"))?
        } else {
            reader.ask(&format!("list {sub}"))?
        };
        if primed.starts_with("error") || primed == "present" {
            return Err(SubstrateError::Worker(format!(
                "{property}: priming the peer: {primed}"
            )));
        }
        let path = ours.join(&name);
        create_synced(fs, &path, &pattern(r as u64, 8))
            .map_err(SubstrateError::io("create", &path))?;
        let t = Instant::now();
        let kind = if sub == "neg" { "exists" } else { "listed" };
        let line = reader.ask(&format!(
            "wait {kind} {name} {} {}",
            opts.deadline.as_millis(),
            opts.poll.as_micros()
        ))?;
        let elapsed = t.elapsed();
        samples.push(wait_outcome(&line)?.seen.then_some(elapsed));
    }
    Ok(Visibility::from_samples(property, &samples, opts.deadline))
}

/// `cross-renewal`: until we create `beat/stop`, the peer re-reads our
/// `beat/record` and replaces its own `beat/peer` every [`RENEWAL_POLL`];
/// meanwhile, every 100 ms for [`PeerOptions::renewal`], we read its record
/// and replace ours as a heartbeat does, timing each replacement.
fn watched_renewal(
    fs: &dyn Fs,
    ours: &Path,
    watcher: &mut dyn Peer,
    opts: &PeerOptions,
) -> Result<Renewal, SubstrateError> {
    let record = ours.join("beat/record");
    let body = pattern(3, 512);
    write_atomic(fs, &record, &body).map_err(SubstrateError::io("replace", &record))?;
    // The peer stops by itself, bounded whatever happens here, and within
    // the parent's wait for any one answer.
    let max = (opts.renewal + opts.deadline)
        .min(super::worker::REPLY_TIMEOUT.saturating_sub(Duration::from_secs(5)));
    watcher.send(&format!(
        "watch beat/record beat/peer beat/stop {} {}",
        max.as_millis(),
        RENEWAL_POLL.as_micros()
    ))?;
    let mut samples = Vec::new();
    let started = Instant::now();
    let mut failed = None;
    while started.elapsed() < opts.renewal.min(max) {
        std::thread::sleep(Duration::from_millis(100));
        // The peer's record may not exist yet; what matters is the lookup.
        let _ = fs.read(&ours.join("beat/peer"));
        let t = Instant::now();
        if let Err(e) = write_atomic(fs, &record, &body) {
            failed = Some(e);
            break;
        }
        samples.push(t.elapsed());
    }
    let stop = ours.join("beat/stop");
    let stopped = create_synced(fs, &stop, b"stop");
    let answer = watcher.recv()?;
    if let Some(e) = failed {
        return Err(SubstrateError::io("replace", &record)(e));
    }
    stopped.map_err(SubstrateError::io("create", &stop))?;
    let (reads, errors) = match answer.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["watched", r, e] if r.parse::<u64>().is_ok() && e.parse::<u64>().is_ok() => {
            (r.parse().unwrap_or(0), e.parse().unwrap_or(0))
        }
        _ => {
            return Err(SubstrateError::Worker(format!(
                "cross-renewal: the peer answered {answer:?}"
            )))
        }
    };
    Ok(Renewal::from_samples(&samples, reads, errors))
}

/// p99 of a 4 KiB append + fdatasync on our mount (the floor of the
/// renewal half of the lease rule).
fn fsync_p99(fs: &dyn Fs, path: &Path, samples: usize) -> Result<Duration, SubstrateError> {
    let f = create_own(fs, path).map_err(SubstrateError::io("create", path))?;
    let buf = pattern(7, 4096);
    let mut v = Vec::with_capacity(samples);
    for i in 0..samples.max(1) {
        let t = Instant::now();
        f.write_all_at(&buf, (i * buf.len()) as u64)
            .and_then(|_| f.sync_data())
            .map_err(SubstrateError::io("fsync", path))?;
        v.push(t.elapsed());
    }
    v.sort();
    let i = ((0.99 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    Ok(v[i])
}

/// What to change when close-to-open fails across mounts, by filesystem.
pub fn cto_fix_hint<'a>(mounts: impl IntoIterator<Item = Option<&'a MountInfo>>) -> String {
    let types: Vec<&str> = mounts
        .into_iter()
        .flatten()
        .map(|m| m.fstype.as_str())
        .collect();
    if types.iter().any(|t| t.contains("glusterfs")) {
        " — GlusterFS serves cached data on open by default: turn off \
         performance.stat-prefetch, performance.quick-read, performance.io-cache, \
         performance.read-ahead, performance.open-behind, performance.readdir-ahead and \
         performance.flush-behind (gluster volume set <vol> <option> off), and mount with \
         attribute-timeout=0,entry-timeout=0,negative-timeout=0"
            .into()
    } else if types.iter().any(|t| t.starts_with("nfs")) {
        " — NFS: do not mount with `nocto`; check the server exports sync".into()
    } else {
        " — the client serves cached data or attributes on open: turn off client-side \
         caching that bypasses close-to-open"
            .into()
    }
}
