//! `weakfs <backing> <mountpoint> [flags]`: mount the weak passthrough
//! filesystem in the foreground until unmounted (`fusermount3 -u
//! <mountpoint>`) or killed (the mount is auto-unmounted).
//!
//! Run one process per "host" over the same backing directory to model
//! several NFS clients of one export. See the crate docs for what each
//! behaviour models and its source.

#![allow(clippy::disallowed_methods)] // a test filesystem: it implements the writes the seam forbids elsewhere

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// A FUSE passthrough with switchable weak-substrate behaviours.
#[derive(Debug, Parser)]
#[command(name = "weakfs", version)]
struct Args {
    /// Directory whose contents the mount serves.
    backing: PathBuf,
    /// Empty directory to mount on.
    mountpoint: PathBuf,
    /// Rename regular files by copy+delete, like object-store FUSE mounts.
    #[arg(long)]
    rename_copy_delete: bool,
    /// fsync returns at once without syncing: a substrate that lies.
    #[arg(long)]
    fsync_noop: bool,
    /// NFS preset: --actimeo-ms 3000 (unless given), --negative-lookup-cache,
    /// --silly-rename, --lost-reply-prob 0.01 (unless given), --write-back,
    /// --estale.
    #[arg(long)]
    nfs: bool,
    /// Attribute/lookup/listing cache lifetime in ms (NFS actimeo). Default
    /// 0, or 3000 with --nfs.
    #[arg(long, alias = "attr-ttl-ms")]
    actimeo_ms: Option<u64>,
    /// Cache "no such file" lookups too (NFS lookupcache=all).
    #[arg(long)]
    negative_lookup_cache: bool,
    /// Unlinking a file open on this mount renames it to .nfsXXXX until the
    /// last close (Linux NFS client silly rename).
    #[arg(long)]
    silly_rename: bool,
    /// Probability that a successful exclusive create / unlink / rmdir /
    /// rename reports EEXIST / ENOENT (lost reply). Default 0, or 0.01 with
    /// --nfs.
    #[arg(long)]
    lost_reply_prob: Option<f64>,
    /// Seed of the lost-reply generator.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Buffer written data in this process until fsync, close or truncate
    /// (NFS client dirty pages): other mounts do not see it before. A
    /// write-back while cut off fails and the data is lost.
    #[arg(long)]
    write_back: bool,
    /// Reads/writes/fsyncs through a handle whose file another mount removed
    /// or renamed over fail with ESTALE (NFS stale filehandle).
    #[arg(long)]
    estale: bool,
    /// While this file exists, every call fails with EIO (host cut off from
    /// the volume); remove it to heal. Put it outside the mount.
    #[arg(long)]
    cutoff_file: Option<PathBuf>,
    /// With --actimeo-ms: serve file contents cached by name on open,
    /// without revalidation (close-to-open broken, as default GlusterFS).
    #[arg(long)]
    no_close_to_open: bool,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut behaviours = if args.nfs {
        weakfs::Behaviours::nfs(args.seed)
    } else {
        weakfs::Behaviours {
            seed: args.seed,
            ..Default::default()
        }
    };
    behaviours.rename_copy_delete = args.rename_copy_delete;
    behaviours.fsync_noop = args.fsync_noop;
    if let Some(ms) = args.actimeo_ms {
        behaviours.attr_ttl = Duration::from_millis(ms);
    }
    behaviours.negative_lookup_cache |= args.negative_lookup_cache;
    behaviours.silly_rename |= args.silly_rename;
    behaviours.write_back |= args.write_back;
    behaviours.estale |= args.estale;
    behaviours.no_close_to_open = args.no_close_to_open;
    if let Some(p) = args.lost_reply_prob {
        anyhow::ensure!(
            (0.0..=1.0).contains(&p),
            "--lost-reply-prob must be in [0, 1]"
        );
        behaviours.lost_reply_prob = p;
    }
    behaviours.cutoff_file = args.cutoff_file;
    tracing::info!(backing = %args.backing.display(), mountpoint = %args.mountpoint.display(), ?behaviours, "mounting weakfs");
    weakfs::mount_foreground(&args.backing, &args.mountpoint, behaviours, true)?;
    Ok(())
}
