//! `kaas substrate-check <dir>...`: prove a mount honours the substrate
//! contract before any data goes on it, and the hidden `kaas
//! substrate-worker` that the check starts as its other "hosts".
//!
//! The probes live in [`kaas_volume::substrate`]; this module is the command
//! line around them and the start-up gate ([`startup_gate`]) the broker runs
//! on its data and cluster directories.
//!
//! With `--peer DIR2` (another mount of the volume DIR is on: a second
//! client) the full check adds the cross-mount probes
//! ([`kaas_volume::substrate::peer`]): close-to-open, sizes and exclusive
//! create across the mounts, and how long a rename, a negative lookup and a
//! listing stay stale on the peer, with the lease those figures suggest.
//!
//! Exit status of `substrate-check`: 0 usable, 1 disqualified, 2 the check
//! could not run (missing directory, not writable, worker failure, a
//! `--peer` that is not the same volume).

use anyhow::Context;
use clap::Args;
use kaas_volume::fs::RealFs;
use kaas_volume::substrate::{self, peer::PeerOptions, worker::WorkerCommand, FullOptions, Report};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The hidden subcommand name the check re-invokes this binary with.
pub const WORKER_SUBCOMMAND: &str = "substrate-worker";

/// Exit status: the mount is disqualified.
pub const EXIT_DISQUALIFIED: i32 = 1;
/// Exit status: the check could not be run.
pub const EXIT_ERROR: i32 = 2;

/// `kaas substrate-check`.
#[derive(Debug, Clone, Args)]
pub struct SubstrateCheckArgs {
    /// Directories to check: the data directory, the cluster directory, or
    /// any directory on the mount you mean to use. Only a scratch
    /// `.kaas-substrate-check-*` directory inside each is written.
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Print one JSON document instead of one line per property.
    #[arg(long)]
    pub json: bool,
    /// Only the sub-second start-up subset.
    #[arg(long)]
    pub quick: bool,
    /// Racing worker processes for the rename and exclusive-create probes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(2..=64))]
    pub processes: u16,
    /// Rounds of the exclusive-create race.
    #[arg(long, default_value_t = 100)]
    pub excl_rounds: usize,
    /// How long readers race the rename loop, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub rename_race_ms: u64,
    /// Size of the large file whose rename time gives copy+delete away, MiB.
    #[arg(long, default_value_t = 64)]
    pub large_file_mib: u64,
    /// A second mount of the same volume (the same directory seen through
    /// another client): adds the cross-mount probes. Needs exactly one DIR.
    #[arg(long, value_name = "DIR2", conflicts_with = "quick")]
    pub peer: Option<PathBuf>,
    /// How long a marker created under DIR may take to appear under DIR2
    /// before DIR2 is declared another volume, in milliseconds.
    #[arg(long, default_value_t = 30_000, requires = "peer")]
    pub peer_timeout_ms: u64,
    /// Rounds of the cross-mount close-to-open and exclusive-create probes.
    #[arg(long, default_value_t = 20, requires = "peer")]
    pub peer_rounds: usize,
    /// Rounds of each timed cross-mount visibility probe.
    #[arg(long, default_value_t = 10, requires = "peer")]
    pub visibility_rounds: usize,
    /// Per-round bound of the visibility probes, in milliseconds: a change
    /// not seen by then counts as "not seen" (at most 25,000: a worker's
    /// reply is awaited 30 s).
    #[arg(long, default_value_t = 10_000, requires = "peer")]
    pub visibility_deadline_ms: u64,
    /// How long the heartbeat-style replace under a reading peer runs
    /// (`cross-renewal`), in milliseconds (at most 20,000).
    #[arg(long, default_value_t = 10_000, requires = "peer")]
    pub renewal_ms: u64,
}

/// `kaas substrate-worker <role> <args>...` (hidden; started by the check).
#[derive(Debug, Clone, Args)]
pub struct SubstrateWorkerArgs {
    /// Role and its arguments, as the parent passes them.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 1..)]
    pub args: Vec<OsString>,
}

/// Run `substrate-check`; returns the process exit status.
pub fn run(args: &SubstrateCheckArgs) -> anyhow::Result<i32> {
    let worker = WorkerCommand::current_exe(WORKER_SUBCOMMAND)
        .context("cannot locate the kaas binary to start substrate workers")?;
    let mut opts = FullOptions::new(worker);
    opts.processes = args.processes as usize;
    opts.excl_rounds = args.excl_rounds;
    opts.rename_race = Duration::from_millis(args.rename_race_ms);
    opts.large_file_bytes = args.large_file_mib << 20;
    if let Some(dir2) = &args.peer {
        anyhow::ensure!(
            args.dirs.len() == 1,
            "--peer checks one directory against its second mount: give exactly one DIR"
        );
        let mut p = PeerOptions::new(dir2.clone());
        p.proof_timeout = Duration::from_millis(args.peer_timeout_ms);
        p.rounds = args.peer_rounds.max(1);
        p.visibility_rounds = args.visibility_rounds.max(1);
        p.renewal = Duration::from_millis(args.renewal_ms.clamp(100, 20_000));
        // A worker's reply is awaited at most REPLY_TIMEOUT: a round that
        // waits longer would be taken for a hung mount, not "not seen".
        let most = kaas_volume::substrate::worker::REPLY_TIMEOUT
            .saturating_sub(Duration::from_secs(5))
            .as_millis() as u64;
        p.deadline = Duration::from_millis(args.visibility_deadline_ms.clamp(1, most));
        opts.peer = Some(p);
    }

    let mut reports: Vec<Report> = Vec::new();
    let mut errors: Vec<(PathBuf, String)> = Vec::new();
    for dir in &args.dirs {
        let res = if args.quick {
            substrate::quick_check(&RealFs, dir)
        } else {
            substrate::full_check(&RealFs, dir, &opts)
        };
        match res {
            Ok(r) => reports.push(r),
            Err(e) => errors.push((dir.clone(), e.to_string())),
        }
    }
    let disqualified = reports.iter().any(|r| r.disqualified().is_some());
    if args.json {
        let doc = serde_json::json!({
            "usable": !disqualified && errors.is_empty(),
            "reports": reports,
            "errors": errors
                .iter()
                .map(|(d, e)| serde_json::json!({ "dir": d, "error": e }))
                .collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for r in &reports {
            println!("{r}\n");
        }
        for (d, e) in &errors {
            println!("substrate check of {}: could not run: {e}", d.display());
        }
    }
    Ok(if !errors.is_empty() {
        EXIT_ERROR
    } else if disqualified {
        EXIT_DISQUALIFIED
    } else {
        0
    })
}

/// Run the hidden worker; returns the process exit status.
pub fn run_worker(args: &SubstrateWorkerArgs) -> anyhow::Result<i32> {
    substrate::worker::run_worker(&RealFs, &args.args)?;
    Ok(0)
}

/// How many times the start-up gate runs a check that fails with an I/O
/// error (not a verdict) before the broker gives up.
const STARTUP_CHECK_ATTEMPTS: u32 = 5;

/// Start-up gate: the quick check on each directory (data and cluster; the
/// same mount twice is checked twice, which is cheap). Refuses to start on
/// a disqualified mount unless `allow_disqualified`, in which case it logs
/// the override at error level on every start.
pub fn startup_gate(dirs: &[&Path], allow_disqualified: bool) -> anyhow::Result<Vec<Report>> {
    let mut out = Vec::with_capacity(dirs.len());
    for dir in dirs {
        // An I/O error is not a verdict: re-drive the check a few times (a
        // volume can hiccup, a reply can be lost, another client's fresh
        // directory can take a moment to show on this one: seen once on
        // GlusterFS) before giving up, backing off 0.2 s → 1.6 s (~3 s).
        let mut attempt = 0;
        let mut backoff = std::time::Duration::from_millis(200);
        let report = loop {
            attempt += 1;
            match substrate::quick_check(&RealFs, dir) {
                Ok(r) => break Some(r),
                // A full volume is not a verdict on the substrate, and a
                // broker that does not start cannot run the retention or
                // the deletes that would free it, nor serve its reads.
                Err(e) if e.is_no_space() => {
                    tracing::error!(dir = %dir.display(), error = %e, "volume full: start-up substrate check skipped; starting so that reads, retention and deletes can run");
                    break None;
                }
                Err(e) if attempt < STARTUP_CHECK_ATTEMPTS => {
                    tracing::warn!(dir = %dir.display(), attempt, error = %e, "substrate check failed; retrying");
                    std::thread::sleep(backoff);
                    backoff *= 2;
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e))
                        .with_context(|| format!("substrate check of {}", dir.display()))
                }
            }
        };
        let Some(report) = report else { continue };
        for c in report
            .checks
            .iter()
            .filter(|c| c.status != substrate::Status::Pass)
        {
            tracing::warn!(dir = %dir.display(), property = c.property, status = %c.status, evidence = %c.evidence, "substrate check");
        }
        if let Some(why) = report.disqualified() {
            if allow_disqualified {
                tracing::error!(
                    dir = %dir.display(),
                    reason = %why,
                    "SUBSTRATE DISQUALIFIED — starting anyway because --allow-disqualified-substrate is set; \
                     acknowledged records may be lost or corrupted on this mount"
                );
            } else {
                anyhow::bail!(
                    "refusing to start: {} is on a disqualified substrate: {why} \
                     (run `kaas substrate-check {}` for details; override with --allow-disqualified-substrate)",
                    dir.display(),
                    dir.display()
                );
            }
        }
        out.push(report);
    }
    Ok(out)
}
