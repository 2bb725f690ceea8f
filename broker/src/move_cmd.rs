//! `kaas move-cluster-dir --from A --to B`: move a stopped cluster's state
//! (its cluster directory) to another directory — from `<data>/__cluster`
//! to a dedicated control-plane volume, or back. The steps and their crash
//! safety are `kaas_volume::cluster_move`'s; this is the command line.

use clap::Args;
use kaas_volume::fs::RealFs;
use std::path::PathBuf;
use std::time::Duration;

/// `kaas move-cluster-dir`.
#[derive(Debug, Clone, Args)]
pub struct MoveClusterDirArgs {
    /// The cluster directory the state is in now (`<data>/__cluster` when
    /// no `--cluster-dir` was given).
    #[arg(long, value_name = "DIR")]
    pub from: PathBuf,
    /// The directory it moves to: empty, or holding an interrupted move of
    /// the same cluster (run the same command again to finish one).
    #[arg(long, value_name = "DIR")]
    pub to: PathBuf,
    /// How long every broker's liveness record must stand still before the
    /// cluster counts as stopped (longer than the heartbeat interval).
    #[arg(long, default_value_t = 7000)]
    pub wait_ms: u64,
}

/// Run the move; the exit code.
pub fn run(args: &MoveClusterDirArgs) -> anyhow::Result<i32> {
    eprintln!(
        "checking that the cluster is stopped ({} ms), then moving {} to {}",
        args.wait_ms,
        args.from.display(),
        args.to.display()
    );
    let m = kaas_volume::cluster_move::move_cluster_dir(
        &RealFs,
        &args.from,
        &args.to,
        Duration::from_millis(args.wait_ms),
    )?;
    println!(
        "moved cluster {} to {} ({} files copied); start the brokers with --cluster-dir {}",
        m.cluster_id,
        args.to.display(),
        m.files,
        args.to.display()
    );
    Ok(0)
}
