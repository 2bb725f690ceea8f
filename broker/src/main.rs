//! The `kaas` binary: `kaas broker` runs a broker (standalone on a local
//! directory by default, the same code as a cluster member on a shared
//! volume); `kaas substrate-check` vets a mount before data goes on it;
//! `kaas inspect` shows a cluster's files offline.
//!
//! Only argument parsing and exit codes live here; everything else is in
//! the `kaas_broker` library (`lib.rs`).

use clap::{Parser, Subcommand};
use kaas_broker::{config, dev, inspect, move_cmd, server, substrate_cmd};

#[derive(Parser)]
#[command(
    name = "kaas",
    version,
    about = "Kafka-compatible broker on a shared ReadWriteMany volume"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a broker.
    Broker(Box<config::BrokerArgs>),
    /// Run a local cluster: N brokers on one data directory.
    Dev(dev::DevArgs),
    /// Show a cluster's files offline (read-only): assignment, brokers,
    /// controller epochs, per partition manifests, segments and claims.
    Inspect(inspect::InspectArgs),
    /// Move a stopped cluster's state to another cluster directory
    /// (crash-safe: run it again after any failure to finish).
    MoveClusterDir(move_cmd::MoveClusterDirArgs),
    /// Check that a mount honours the substrate contract.
    SubstrateCheck(substrate_cmd::SubstrateCheckArgs),
    /// Internal: a probe process started by substrate-check.
    #[command(hide = true)]
    SubstrateWorker(substrate_cmd::SubstrateWorkerArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KAAS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: log files and collectors get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Dev(args) => match dev::run(&args) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("kaas dev: {e:#}");
                1
            }
        },
        Cmd::Broker(args) => match server::run(*args) {
            Ok(()) => 0,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "broker failed");
                1
            }
        },
        Cmd::Inspect(args) => match inspect::run(&args) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("kaas inspect: {e:#}");
                1
            }
        },
        Cmd::MoveClusterDir(args) => match move_cmd::run(&args) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("kaas move-cluster-dir: {e:#}");
                1
            }
        },
        Cmd::SubstrateCheck(args) => match substrate_cmd::run(&args) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("substrate-check: {e:#}");
                substrate_cmd::EXIT_ERROR
            }
        },
        Cmd::SubstrateWorker(args) => match substrate_cmd::run_worker(&args) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("substrate-worker: {e:#}");
                substrate_cmd::EXIT_ERROR
            }
        },
    };
    std::process::exit(code);
}
