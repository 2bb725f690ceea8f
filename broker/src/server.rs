//! Start-up and the listeners: substrate gate, cluster join (membership,
//! assignment watcher, controller election), topic catalog, partition arbiters, the Kafka listener with its connection cap,
//! and the telemetry HTTP listener (`/metrics`, `/actors`).

use crate::config::BrokerArgs;
use crate::conn;
use crate::state::Broker;
use crate::state::BrokerSink;
use anyhow::Context as _;
use kaas_actors::cluster::controller::{ControllerActor, HandoffPending, IsController, Resign};
use kaas_actors::cluster::membership::{self, HeartbeatNow, JoinConfig, Membership};
use kaas_actors::cluster::watcher::AssignmentWatcher;
use kaas_actors::producer_id_blocks::ProducerIdBlocks;
use kaas_actors::telemetry::Mailbox;
use kaas_actors::topic::TopicCatalog;
use kaas_volume::fs::{GuardedFs, RealFs, SharedFs};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Run a broker until SIGTERM/SIGINT.
pub fn run(args: BrokerArgs) -> anyhow::Result<()> {
    let fs: SharedFs = Arc::new(RealFs);
    fs.create_dir_all(&args.data_dir)
        .with_context(|| format!("creating data dir {}", args.data_dir.display()))?;
    let cluster_dir = args.cluster_dir();
    fs.create_dir_all(&cluster_dir)
        .with_context(|| format!("creating cluster dir {}", cluster_dir.display()))?;
    crate::substrate_cmd::startup_gate(
        &[&args.data_dir, &cluster_dir],
        args.allow_disqualified_substrate,
    )?;

    let timing = args.timing()?;
    let cluster_id = cluster_id(&fs, &cluster_dir)?;
    let shards = kaas_actors::group::shard::ShardCount::new(args.group_shards).unwrap_or_default();
    kaas_actors::group::shard::read_or_create_count(
        fs.as_ref(),
        &cluster_dir,
        shards,
        std::time::Duration::from_secs(10),
    )
    .context("recording the coordinator shard count")?;
    let threads = args
        .partition_threads
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
        })
        .max(1);
    // Blocking: after an unclean exit this waits until the previous
    // incarnation's lease has provably lapsed.
    let (shared, seq) = membership::join(
        &fs,
        JoinConfig {
            broker_id: args.broker_id,
            cluster_dir: cluster_dir.clone(),
            advertised: args.advertised(),
            timing,
            clock: kaas_actors::clock::real(),
        },
    )
    .context("joining the cluster")?;

    // The topic catalog (and its janitor) and the producer-id blocks write
    // only while this broker's lease is valid: the seam refuses otherwise.
    let leased_fs = GuardedFs::shared(fs.clone(), shared.lease.clone());
    let sys = actix_rt::System::new();
    sys.block_on(async move {
        let catalog = TopicCatalog::load(leased_fs.clone(), &args.data_dir)
            .map_err(|e| anyhow::anyhow!("loading topics: {e}"))?;
        // Topic creation and deletion do file I/O: keep it off the thread
        // that serves connections.
        let catalog_arbiter = actix::Arbiter::new();
        let catalog = catalog.start(&args.data_dir, &catalog_arbiter.handle());
        let arbiters: Vec<actix::Arbiter> = (0..threads).map(|_| actix::Arbiter::new()).collect();
        let handles = arbiters.iter().map(|a| a.handle()).collect();
        // Claiming a block is an O_EXCL create + fsync: its own thread.
        let pids = ProducerIdBlocks::start(leased_fs, cluster_dir.clone(), args.broker_id);
        let broker = Arc::new(Broker::new(
            args.clone(),
            fs.clone(),
            shared.clone(),
            cluster_id.clone(),
            catalog,
            pids,
            handles,
        ));
        // Heartbeats on their own thread: a slow assignment read or a
        // controller pass never delays them.
        let membership_arbiter = actix::Arbiter::new();
        let cluster_arbiter = actix::Arbiter::new();
        let membership = Membership::start(
            fs.clone(),
            shared.clone(),
            seq,
            &membership_arbiter.handle(),
        );
        let watcher = AssignmentWatcher::start(
            fs.clone(),
            shared.clone(),
            Arc::new(BrokerSink(broker.clone())),
            membership.clone(),
            &cluster_arbiter.handle(),
        );
        let controller = ControllerActor::start(
            fs.clone(),
            shared.clone(),
            args.data_dir.clone(),
            Some(watcher.clone()),
            &cluster_arbiter.handle(),
        );
        let _ = broker.controller.set(controller.clone());

        // Serve clients once this broker knows the cluster (a controller and
        // an assignment): a Metadata answer without a controller sends
        // admin clients into a long back-off. Bounded: an election may have
        // to wait out a dead controller's lease.
        let ready_by = std::time::Instant::now() + timing.dead_after() * 2 + timing.poll * 10;
        while broker.assignment().version == 0 && std::time::Instant::now() < ready_by {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let metrics = TcpListener::bind(args.metrics_listen)
            .await
            .with_context(|| format!("binding metrics {}", args.metrics_listen))?;
        tokio::task::spawn_local(serve_metrics(metrics));
        tracing::info!(
            listen = %args.listen,
            metrics = %args.metrics_listen,
            data_dir = %args.data_dir.display(),
            broker_id = args.broker_id,
            incarnation = shared.lease.incarnation(),
            cluster_id = %cluster_id,
            "kaas broker listening on {}",
            args.listen
        );
        eprintln!("kaas broker listening on {}", args.listen);

        let accept = accept_loop(broker.clone(), listener);
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = accept => {}
            _ = term.recv() => tracing::info!("SIGTERM: controlled shutdown"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: controlled shutdown"),
        }
        controlled_shutdown(&broker, &membership, &controller).await;
        for a in arbiters {
            a.stop();
        }
        catalog_arbiter.stop();
        cluster_arbiter.stop();
        membership_arbiter.stop();
        actix_rt::System::current().stop();
        tracing::info!("shutdown complete");
        Ok::<(), anyhow::Error>(())
    })
}

/// Hand every partition (and the controller role) to the other brokers
/// before exiting, so clients see NOT_LEADER and a quick move rather than
/// a lease-long stall. Bounded by --shutdown-timeout-ms; with no other
/// broker alive it just closes everything cleanly.
async fn controlled_shutdown(
    b: &Arc<Broker>,
    membership: &Mailbox<Membership>,
    controller: &Mailbox<ControllerActor>,
) {
    let me = b.args.broker_id;
    let poll = std::time::Duration::from_millis(b.args.poll_ms.max(10));
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_millis(b.args.shutdown_timeout_ms);
    let others = |b: &Broker| b.assignment().brokers.iter().any(|x| x.id != me);
    b.shared.state.lock().unwrap().shutting_down = true;
    let _ = membership.send(HeartbeatNow).await;
    if others(b) {
        // The controller vacates our partitions; the watcher stops them and
        // reports the version applied; the controller grants them elsewhere.
        while std::time::Instant::now() < deadline && others(b) {
            let a = b.assignment();
            let granted_to_me = a
                .topics
                .values()
                .flat_map(|t| t.partitions.iter())
                .any(|e| e.leader == me);
            if !granted_to_me && b.leading() == 0 {
                break;
            }
            tokio::time::sleep(poll).await;
        }
    }
    if let Ok(Some(epoch)) = controller.send(IsController).await {
        // Wait (briefly) until what we vacated is granted elsewhere, then
        // give the role up explicitly so a successor need not wait a lease.
        let until = deadline.min(std::time::Instant::now() + std::time::Duration::from_secs(5));
        while std::time::Instant::now() < until {
            if !controller.send(HandoffPending).await.unwrap_or(false) {
                break;
            }
            tokio::time::sleep(poll).await;
        }
        let _ = controller.send(Resign).await;
        b.shared.state.lock().unwrap().controller_released = Some(epoch);
        let _ = membership.send(HeartbeatNow).await;
        tracing::info!(epoch, "released the controller role");
    }
    // Flush, checkpoint and close whatever is still open, then end the
    // lease before saying "clean exit": once that is published the
    // controller re-grants at once, so nothing may acknowledge after it.
    b.stop_leaders(None).await;
    b.shared.lease.revoke();
    b.shared.state.lock().unwrap().clean_exit = true;
    let _ = membership.send(HeartbeatNow).await;
}

async fn accept_loop(b: Arc<Broker>, listener: TcpListener) {
    let t = kaas_actors::telemetry::global();
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let open = t.connections.load(Ordering::Relaxed);
        if open >= b.args.max_connections as i64 {
            tracing::warn!(%peer, open, max = b.args.max_connections, "connection limit reached; closing new connection");
            drop(sock);
            continue;
        }
        t.connections.fetch_add(1, Ordering::Relaxed);
        let b = b.clone();
        tokio::task::spawn_local(async move {
            conn::serve(b, sock, peer).await;
            kaas_actors::telemetry::global()
                .connections
                .fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// The cluster id, created once with the exclusive-create primitive (see
/// `kaas_volume::cluster_id`); an empty file left by a creator that died is
/// replaced after 5 s.
fn cluster_id(fs: &SharedFs, cluster_dir: &std::path::Path) -> anyhow::Result<String> {
    Ok(kaas_volume::cluster_id::read_or_create(
        fs.as_ref(),
        cluster_dir,
        std::time::Duration::from_secs(5),
    )?)
}

async fn serve_metrics(l: TcpListener) {
    loop {
        let Ok((mut sock, _)) = l.accept().await else {
            continue;
        };
        tokio::task::spawn_local(async move {
            let mut buf = vec![0u8; 4096];
            let n =
                match tokio::time::timeout(std::time::Duration::from_secs(5), sock.read(&mut buf))
                    .await
                {
                    Ok(Ok(n)) => n,
                    _ => return,
                };
            let req = String::from_utf8_lossy(&buf[..n]);
            let path = req.split_whitespace().nth(1).unwrap_or("/");
            let t = kaas_actors::telemetry::global();
            let (status, ctype, body) = match path {
                "/metrics" => ("200 OK", "text/plain; version=0.0.4", t.render_prometheus()),
                "/actors" => (
                    "200 OK",
                    "application/json",
                    serde_json::to_string(&t.actors()).unwrap_or_default(),
                ),
                _ => ("404 Not Found", "text/plain", "not found\n".to_string()),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(body.as_bytes()).await;
        });
    }
}
