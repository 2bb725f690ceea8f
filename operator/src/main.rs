//! `kaas-operator`: watches `KafkaTopic` resources in one namespace and
//! converges the brokers to them (see the library docs and operator/README.md).
//!
//! One active operator per volume: replicas elect a leader through a
//! Kubernetes Lease (`kaas_operator::lease`); only the holder runs the
//! controller, and it stops (controller dropped, writes fenced) before its
//! lease can expire for another replica.

use clap::Parser;
use futures::StreamExt;
use kaas_operator::admin::KafkaAdmin;
use kaas_operator::crd::KafkaTopic;
use kaas_operator::lease::{self, Elector, Fence, LeaseConfig};
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
    /// Elect one active replica through a Lease. Off only for a single
    /// replica by construction (then there is no fence).
    #[arg(long, env = "KAAS_OPERATOR_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// This replica's holderIdentity: the pod name (downward API).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Name of the Lease, in the watched namespace.
    #[arg(
        long,
        env = "KAAS_OPERATOR_LEASE_NAME",
        default_value = "kaas-operator"
    )]
    lease_name: String,
    /// leaseDurationSeconds: a silent holder's lease expires after this.
    #[arg(
        long,
        env = "KAAS_OPERATOR_LEASE_DURATION_SECONDS",
        default_value_t = 15
    )]
    lease_duration_seconds: u64,
    /// A holder stops reconciling this long after its last successful
    /// renewal round started (below the lease duration).
    #[arg(
        long,
        env = "KAAS_OPERATOR_LEASE_RENEW_DEADLINE_MS",
        default_value_t = 10_000
    )]
    lease_renew_deadline_ms: u64,
    /// Time between lease rounds (below the renew deadline).
    #[arg(long, env = "KAAS_OPERATOR_LEASE_RETRY_MS", default_value_t = 2_000)]
    lease_retry_ms: u64,
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
    let lease_cfg = LeaseConfig {
        name: args.lease_name.clone(),
        identity: args
            .identity
            .clone()
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| format!("kaas-operator-{}", uuid::Uuid::new_v4())),
        duration: Duration::from_secs(args.lease_duration_seconds),
        renew_deadline: Duration::from_millis(args.lease_renew_deadline_ms),
        retry: Duration::from_millis(args.lease_retry_ms),
    };
    if args.leader_election {
        lease_cfg.validate()?;
    }
    let client = kube::Client::try_default().await?;
    let metrics = Arc::new(Metrics::default());
    let listener = tokio::net::TcpListener::bind(args.metrics_listen).await?;
    tokio::spawn(metrics::serve(listener, metrics.clone()));
    let api: Api<KafkaTopic> = Api::namespaced(client.clone(), &args.namespace);
    let admin = Arc::new(KafkaAdmin::new(
        args.bootstrap.clone(),
        Duration::from_millis(args.admin_timeout_ms),
    ));
    tracing::info!(
        namespace = %args.namespace,
        bootstrap = %args.bootstrap,
        data_dir = %args.data_dir.display(),
        cluster_dir = ?args.cluster_dir,
        leader_election = args.leader_election,
        identity = %lease_cfg.identity,
        lease = %lease_cfg.name,
        "kaas-operator started"
    );

    // SIGTERM / ctrl-c: stop reconciling (gracefully), then release the lease.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(error = %e, "cannot handle SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = stop_tx.send(true);
    });
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    // The elector stops only once the controller has stopped, so the lease
    // is never handed back while a reconcile is still running.
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let fence = if args.leader_election {
        Fence::elected()
    } else {
        Fence::unfenced()
    };
    let elector = args.leader_election.then(|| {
        let mut done = done_rx.clone();
        tokio::spawn(lease::run(
            Api::namespaced(client.clone(), &args.namespace),
            Elector::new(lease_cfg.clone()),
            fence.clone(),
            async move {
                let _ = done.wait_for(|d| *d).await;
            },
        ))
    });

    loop {
        tokio::select! {
            () = fence.acquired() => {}
            () = stopped() => break,
        }
        metrics.set_leader(true);
        let controller = Controller::new(api.clone(), watcher::Config::default());
        let ctx = Arc::new(Context {
            client: client.clone(),
            admin: admin.clone(),
            data_dir: args.data_dir.clone(),
            store: controller.store(),
            metrics: metrics.clone(),
            resync: Duration::from_secs(args.resync_seconds.max(1)),
            failures: Default::default(),
            fence: fence.clone(),
            recorder: kube::runtime::events::Recorder::new(
                client.clone(),
                kube::runtime::events::Reporter {
                    controller: kaas_operator::reconcile::MANAGER.to_owned(),
                    instance: Some(lease_cfg.identity.clone()),
                },
            ),
        });
        tracing::info!(identity = %lease_cfg.identity, "leading: reconciling");
        let reconciling = controller
            .graceful_shutdown_on(stopped())
            .run(reconcile, error_policy, ctx)
            .for_each(|r| async move {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "controller event");
                }
            });
        // Dropping the controller on a lost lease cancels in-flight
        // reconciles at their next await; the fence already withholds
        // every write past the deadline.
        let lost = tokio::select! {
            () = reconciling => false,
            () = fence.lost() => true,
        };
        metrics.set_leader(false);
        if !lost {
            break;
        }
        tracing::warn!(identity = %lease_cfg.identity, "lease not renewed in time: stopped reconciling, standing by");
    }
    let _ = done_tx.send(true);
    if let Some(e) = elector {
        let _ = e.await;
    }
    tracing::info!("kaas-operator stopped");
    Ok(())
}
