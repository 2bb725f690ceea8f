//! `kaas-operator`: watches `KafkaTopic` resources in one namespace and
//! converges the brokers to them (see the library docs and operator/README.md).
//!
//! One active operator per volume by construction: the chart runs one
//! replica with the Recreate strategy, so two never reconcile at once.

use clap::Parser;
use futures::StreamExt;
use kaas_operator::admin::KafkaAdmin;
use kaas_operator::crd::KafkaTopic;
use kaas_operator::metrics::{self, Metrics};
use kaas_operator::reconcile::{error_policy, reconcile, Context};
use kube::runtime::{watcher, Controller};
use kube::Api;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "kaas-operator",
    version,
    about = "KafkaTopic operator for kaas"
)]
struct Args {
    /// Namespace whose KafkaTopics are reconciled.
    #[arg(long, env = "KAAS_WATCH_NAMESPACE")]
    namespace: String,
    /// The brokers' client Service, host:port.
    #[arg(long, env = "KAAS_BOOTSTRAP")]
    bootstrap: String,
    /// The data volume (read-only): topic stamps are read here.
    #[arg(long, env = "KAAS_DATA_DIR")]
    data_dir: PathBuf,
    /// Cluster-state directory, when a separate volume. Accepted so the
    /// operator and brokers share one configuration; the operator reads
    /// nothing there yet.
    #[arg(long, env = "KAAS_CLUSTER_DIR")]
    cluster_dir: Option<PathBuf>,
    /// /metrics listener.
    #[arg(
        long,
        env = "KAAS_OPERATOR_METRICS_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    metrics_listen: std::net::SocketAddr,
    /// Reconcile every KafkaTopic at least this often.
    #[arg(long, env = "KAAS_OPERATOR_RESYNC_SECONDS", default_value_t = 300)]
    resync_seconds: u64,
    /// Timeout of one admin request to the brokers.
    #[arg(long, env = "KAAS_OPERATOR_ADMIN_TIMEOUT_MS", default_value_t = 30_000)]
    admin_timeout_ms: u64,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KAAS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await?;
    let metrics = Arc::new(Metrics::default());
    let listener = tokio::net::TcpListener::bind(args.metrics_listen).await?;
    tokio::spawn(metrics::serve(listener, metrics.clone()));
    let api: Api<KafkaTopic> = Api::namespaced(client.clone(), &args.namespace);
    let controller = Controller::new(api, watcher::Config::default());
    let ctx = Arc::new(Context {
        client,
        admin: Arc::new(KafkaAdmin::new(
            args.bootstrap.clone(),
            Duration::from_millis(args.admin_timeout_ms),
        )),
        data_dir: args.data_dir.clone(),
        store: controller.store(),
        metrics,
        resync: Duration::from_secs(args.resync_seconds.max(1)),
        failures: Default::default(),
    });
    tracing::info!(
        namespace = %args.namespace,
        bootstrap = %args.bootstrap,
        data_dir = %args.data_dir.display(),
        cluster_dir = ?args.cluster_dir,
        "kaas-operator started"
    );
    controller
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await;
    tracing::info!("kaas-operator stopped");
    Ok(())
}
