//! `weakfs <backing> <mountpoint> [--rename-copy-delete] [--fsync-noop]`:
//! mount the weak passthrough filesystem in the foreground until unmounted
//! (`fusermount3 -u <mountpoint>`) or killed (the mount is auto-unmounted).

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
    /// Kernel attribute/entry cache lifetime in milliseconds (NFS actimeo).
    #[arg(long, default_value_t = 0)]
    attr_ttl_ms: u64,
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
    let behaviours = weakfs::Behaviours {
        rename_copy_delete: args.rename_copy_delete,
        fsync_noop: args.fsync_noop,
        attr_ttl: Duration::from_millis(args.attr_ttl_ms),
    };
    tracing::info!(backing = %args.backing.display(), mountpoint = %args.mountpoint.display(), ?behaviours, "mounting weakfs");
    weakfs::mount_foreground(&args.backing, &args.mountpoint, behaviours, true)?;
    Ok(())
}
