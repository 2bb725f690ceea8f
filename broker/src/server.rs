//! Start-up and the listeners: substrate gate, cluster join (membership,
//! assignment watcher, controller election), topic catalog, partition arbiters, the Kafka listener with its connection cap,
//! and the telemetry HTTP listener (`crate::http`: `/metrics`, `/api/...`, the dashboard).

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
use kaas_volume::fs::{BudgetedFs, FdBudget, GuardedFs, ReadOnly, RealFs, SharedFs};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Run a broker until SIGTERM/SIGINT.
pub fn run(args: BrokerArgs) -> anyhow::Result<()> {
    args.validate_listeners()?;
    args.validate_groups()?;
    let fs: SharedFs = Arc::new(RealFs);
    let cluster_dir = args.cluster_dir();
    // One volume, one cluster: before anything is written to either
    // directory, a data directory that names another cluster (or a cluster
    // directory that names none while the data names one) is refused.
    let binding_on = !test_only_skip_binding();
    if binding_on {
        kaas_volume::binding::preflight(fs.as_ref(), &args.binding_dirs(&cluster_dir))?;
    }
    fs.create_dir_all(&args.data_dir)
        .with_context(|| format!("creating data dir {}", args.data_dir.display()))?;
    fs.create_dir_all(&cluster_dir)
        .with_context(|| format!("creating cluster dir {}", cluster_dir.display()))?;
    crate::substrate_cmd::startup_gate(
        &[&args.data_dir, &cluster_dir],
        args.allow_disqualified_substrate,
    )?;

    let timing = args.timing()?;
    // Before anything opens a file: a flood of connections must never take
    // the descriptors the heartbeat and the partition logs need.
    let fds = crate::fd_budget::apply(args.max_connections)?;
    let segment_files = args
        .max_open_segment_files
        .unwrap_or_else(|| crate::fd_budget::segment_file_cap(&fds));
    let mut args = args;
    let per_broker = *args
        .max_partitions_per_broker
        .get_or_insert_with(|| crate::limits::default_partitions_per_broker(segment_files));
    tracing::info!(
        max_partitions_per_broker = per_broker,
        max_partitions = args.max_partitions,
        controller_mutation_rate = args.controller_mutation_rate,
        "partition limits"
    );
    kaas_actors::partition::files::OpenFiles::configure(
        segment_files,
        std::time::Duration::from_millis(args.segment_idle_close_ms),
    );
    tracing::info!(
        max_open_segment_files = segment_files,
        idle_close_ms = args.segment_idle_close_ms,
        "segment files open on demand"
    );
    let (cluster_id, binding) = if binding_on {
        let b = kaas_volume::binding::bind(fs.as_ref(), &args.binding_dirs(&cluster_dir))?;
        tracing::info!(cluster_id = %b.cluster_id, data_dir = %args.data_dir.display(), cluster_dir = %cluster_dir.display(), "data directory bound to its cluster");
        (b.cluster_id.clone(), Some(Arc::new(b)))
    } else {
        tracing::warn!("KAAS_TEST_ONLY_SKIP_VOLUME_BINDING: the data directory is not bound to this cluster (a test hook; never in production)");
        (cluster_id(&fs, &cluster_dir)?, None)
    };
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
    // Bind before joining: a port in use must fail here, before this
    // broker publishes a liveness record or is granted a partition it could
    // never serve (it would strand them for a lease). Bound but not yet
    // listening: until the broker knows the cluster a connection is refused
    // (so a TCP readiness probe does not pass early), and no other process
    // can take the port meanwhile.
    let listener = bind(args.listen).with_context(|| format!("binding {}", args.listen))?;
    let metrics = bind(args.metrics_listen)
        .with_context(|| format!("binding metrics {}", args.metrics_listen))?;
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

    // Everything but the control plane (membership, watcher, controller,
    // which keep `fs`) opens through a seam whose descriptors are counted
    // in the data plane's budget, so no burst of it can take theirs.
    let fd_budget = crate::fd_budget::data_plane_budget(&fds);
    let data_fs = BudgetedFs::shared(fs.clone(), fd_budget.clone());
    // The topic catalog (and its janitor) and the producer-id blocks write
    // only while this broker's lease is valid: the seam refuses otherwise.
    let leased_fs = GuardedFs::shared(data_fs.clone(), shared.lease.clone());
    let sys = actix_rt::System::new();
    sys.block_on(async move {
        let catalog = TopicCatalog::load(leased_fs.clone(), &args.data_dir)
            .map_err(|e| anyhow::anyhow!("loading topics: {e}"))?
            .with_notices(&args.cluster_dir());
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
            data_fs.clone(),
            fd_budget.clone(),
            shared.clone(),
            cluster_id.clone(),
            binding,
            catalog,
            pids,
            handles,
        ));
        broker.reserve.start()?;
        broker.quotas.start_reload(
            data_fs.read_only(),
            cluster_dir.join(kaas_volume::layout::QUOTAS_DIR),
        )?;
        if broker.reserve.applies() {
            tracing::info!(
                reserve = args.data_reserve_bytes,
                free = broker.reserve.free_bytes(),
                "cluster files share the data volume: produce is refused below the reserve"
            );
        }
        // Heartbeats, the watcher and the controller each on their own
        // thread: a slow assignment read or a stuck controller write delays
        // neither the heartbeat nor the application of a new version.
        let membership_arbiter = actix::Arbiter::new();
        let watcher_arbiter = actix::Arbiter::new();
        let controller_arbiter = actix::Arbiter::new();
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
            &watcher_arbiter.handle(),
        );
        let controller = ControllerActor::start(
            fs.clone(),
            shared.clone(),
            args.data_dir.clone(),
            Some(watcher.clone()),
            &controller_arbiter.handle(),
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
        let listener = listener
            .listen(LISTEN_BACKLOG)
            .with_context(|| format!("listening on {}", args.listen))?;
        let metrics = metrics
            .listen(LISTEN_BACKLOG)
            .with_context(|| format!("listening on metrics {}", args.metrics_listen))?;
        let files = Arc::new(crate::http::ClusterFiles::new(
            broker.fs.clone(),
            cluster_dir.clone(),
            timing.dead_after(),
        ));
        crate::http::Sampler::start(
            files.clone(),
            shared.clone(),
            std::time::Duration::from_secs(1),
        );
        tokio::task::spawn_local(crate::http::serve(metrics, broker.clone(), files));
        crate::http::lag::start_remote_refresh(Arc::downgrade(&broker));
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

        // Every thread and listener is up: size the data plane exactly.
        crate::fd_budget::calibrate(&fds, &fd_budget);
        let accept = accept_loop(broker.clone(), listener, fds.connections, fd_budget);
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = accept => {}
            _ = term.recv() => tracing::info!("SIGTERM: controlled shutdown"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: controlled shutdown"),
        }
        let bound = std::time::Duration::from_millis(args.shutdown_timeout_ms) + SHUTDOWN_FLOOR;
        // A thread of its own keeps the bound: the shutdown's steps may
        // block this thread in a volume call (a hand-off check, a flush),
        // where no timer of this runtime would fire.
        let (finished, done) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("shutdown-bound".into())
            .spawn({
                let broker = broker.clone();
                move || shutdown_watchdog(&broker, &done, bound)
            })?;
        controlled_shutdown(&broker, &fs, &membership, &controller).await;
        drop(finished);
        for a in arbiters {
            a.stop();
        }
        catalog_arbiter.stop();
        controller_arbiter.stop();
        watcher_arbiter.stop();
        membership_arbiter.stop();
        actix_rt::System::current().stop();
        tracing::info!("shutdown complete");
        Ok::<(), anyhow::Error>(())
    })
}

/// What a SIGTERM may take beyond `--shutdown-timeout-ms` (the hand-off's
/// bound): closing what is still open and the last heartbeat. Past both,
/// the process exits anyway ([`SHUTDOWN_CUT_SHORT`]).
pub const SHUTDOWN_FLOOR: std::time::Duration = std::time::Duration::from_secs(3);

/// The exit code of a shutdown cut short at its bound.
pub const SHUTDOWN_CUT_SHORT: i32 = 4;

/// Sleep out the shutdown's bound; if it has not finished by then (a
/// hand-off, a flush or a heartbeat stuck on the volume, or thousands of
/// partitions to close), end the lease, so nothing of this process writes
/// again, and exit without a clean-exit record: the controller moves what
/// is left after the lease, as after a crash. Every acknowledged record is
/// already durable. Exits at once: threads stuck in a volume call would
/// hold up an orderly return.
fn shutdown_watchdog(b: &Broker, done: &std::sync::mpsc::Receiver<()>, bound: std::time::Duration) {
    // The sender is dropped when the shutdown finishes.
    if done.recv_timeout(bound) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
        return;
    }
    b.shared.lease.revoke();
    // try_lock: a thread stuck on the volume may hold it.
    let clean = b
        .shared
        .state
        .try_lock()
        .map(|s| s.clean_exit)
        .unwrap_or(false);
    if clean {
        tracing::warn!(
            bound_ms = bound.as_millis() as u64,
            "controlled shutdown did not finish within --shutdown-timeout-ms + {} s: every leader was closed, but the last heartbeat (the clean-exit record) may not have landed",
            SHUTDOWN_FLOOR.as_secs()
        );
    } else {
        tracing::warn!(
            bound_ms = bound.as_millis() as u64,
            leading = b.leading(),
            "controlled shutdown did not finish within --shutdown-timeout-ms + {} s; exiting without a clean exit: what this broker still leads moves after its lease",
            SHUTDOWN_FLOOR.as_secs()
        );
    }
    std::process::exit(SHUTDOWN_CUT_SHORT);
}

/// Hand every partition (and the controller role) to the other brokers
/// before exiting, so clients see NOT_LEADER and a quick move rather than
/// a lease-long stall. Bounded by --shutdown-timeout-ms; with no other
/// broker alive it just closes everything cleanly.
async fn controlled_shutdown(
    b: &Arc<Broker>,
    fs: &SharedFs,
    membership: &Mailbox<Membership>,
    controller: &Mailbox<ControllerActor>,
) {
    let me = b.args.broker_id;
    let poll = std::time::Duration::from_millis(b.args.poll_ms.max(10));
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_millis(b.args.shutdown_timeout_ms);
    let others = |b: &Broker| b.assignment().brokers.iter().any(|x| x.id != me);
    // Someone could still take what we lead: without one (every other
    // broker is leaving too) the hand-off would never come, and a leaving
    // broker does not campaign, so perhaps no controller is left to vacate.
    let taker = |b: &Broker| {
        membership::handoff_possible(
            fs.as_ref(),
            &b.shared.cluster_dir,
            me,
            b.assignment().brokers.iter().map(|x| x.id),
        )
    };
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
            if !taker(b) {
                tracing::info!("every other broker is leaving: no hand-off to wait for");
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

/// How often a repeated accept failure or refusal is logged (with a count).
const ACCEPT_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// A connection idle this long may be evicted for a new one at the cap.
const EVICT_IDLE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Accept connections, at most `max_connections` at once (the smaller of
/// `--max-connections` and the file-descriptor budget). At the cap the
/// connection idle the longest (at least [`EVICT_IDLE_AFTER`]) is closed to
/// make room, as Kafka closes its least recently used one; with none that
/// idle, the new connection is closed at once. Out of descriptors (EMFILE/ENFILE), the loop backs off
/// instead of spinning, and repeated failures are logged once per interval
/// with a count. A connection is a data-plane descriptor: one the
/// data plane's budget has no permit for is closed at once, so the control
/// plane keeps its descriptors (see `fd_budget`).
async fn accept_loop(
    b: Arc<Broker>,
    listener: TcpListener,
    max_connections: usize,
    budget: Arc<FdBudget>,
) {
    use crate::limits::EveryInterval;
    use std::time::{Duration, Instant};
    let t = kaas_actors::telemetry::global();
    let mut failed = EveryInterval::new(ACCEPT_LOG_INTERVAL);
    let mut refused = EveryInterval::new(ACCEPT_LOG_INTERVAL);
    let mut evicted = EveryInterval::new(ACCEPT_LOG_INTERVAL);
    let mut short = EveryInterval::new(ACCEPT_LOG_INTERVAL);
    // Every open connection's slot; only this thread touches it.
    let slots: Rc<RefCell<HashMap<u64, conn::Slot>>> = Rc::default();
    let mut next_id = 0u64;
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                let out_of_fds = matches!(
                    e.raw_os_error(),
                    Some(code) if code == rustix::io::Errno::MFILE.raw_os_error()
                        || code == rustix::io::Errno::NFILE.raw_os_error()
                );
                if let Some(count) = failed.hit(Instant::now()) {
                    tracing::warn!(error = %e, count, interval_s = ACCEPT_LOG_INTERVAL.as_secs(), "accept failed");
                }
                // Out of descriptors, the pending connection stays queued
                // and accept fails again at once: wait for some to close.
                let pause = if out_of_fds { 100 } else { 10 };
                tokio::time::sleep(Duration::from_millis(pause)).await;
                continue;
            }
        };
        let open = t.connections.load(Ordering::Relaxed);
        let Ok(permit) = budget.try_acquire() else {
            if let Some(count) = short.hit(Instant::now()) {
                tracing::warn!(%peer, open, data_plane_cap = budget.cap(), count, interval_s = ACCEPT_LOG_INTERVAL.as_secs(), "data-plane descriptor budget exhausted; closing new connections so the heartbeat keeps its own");
            }
            drop(sock);
            continue;
        };
        if open >= max_connections as i64 {
            let victim = slots
                .borrow()
                .iter()
                .map(|(id, s)| (s.idle(), *id))
                .filter(|(idle, _)| *idle >= EVICT_IDLE_AFTER)
                .max();
            match victim {
                Some((idle, id)) => {
                    if let Some(s) = slots.borrow_mut().remove(&id) {
                        s.evict();
                    }
                    if let Some(count) = evicted.hit(Instant::now()) {
                        tracing::warn!(open, max = max_connections, count, idle_ms = idle.as_millis() as u64, interval_s = ACCEPT_LOG_INTERVAL.as_secs(), "connection limit reached; closing the longest-idle connections for new ones");
                    }
                }
                None => {
                    if let Some(count) = refused.hit(Instant::now()) {
                        tracing::warn!(%peer, open, max = max_connections, count, interval_s = ACCEPT_LOG_INTERVAL.as_secs(), "connection limit reached; closing new connections");
                    }
                    drop(sock);
                    continue;
                }
            }
        }
        t.connections.fetch_add(1, Ordering::Relaxed);
        let b = b.clone();
        let slot = conn::Slot::new();
        let id = next_id;
        next_id += 1;
        slots.borrow_mut().insert(id, slot.clone());
        let slots = slots.clone();
        tokio::task::spawn_local(async move {
            conn::serve(b, sock, peer, slot).await;
            drop(permit);
            slots.borrow_mut().remove(&id);
            kaas_actors::telemetry::global()
                .connections
                .fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Pending connections the kernel queues for each listener (tokio's
/// default for `TcpListener::bind`).
const LISTEN_BACKLOG: u32 = 1024;

/// A socket bound to `addr` (outside any runtime), not yet listening: it
/// holds the port, and fails now if another process listens on it.
fn bind(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    let s = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restart need not wait out TIME_WAIT.
    s.set_reuseaddr(true)?;
    s.bind(addr)?;
    Ok(s)
}

/// The test-only hook that starts a broker without binding the data
/// directory to its cluster (no stamp check at start, none at partition
/// opens): the e2e test of the leaders' successor probe, which must hold
/// on its own, uses it to start a second cluster over one data directory.
fn test_only_skip_binding() -> bool {
    std::env::var_os("KAAS_TEST_ONLY_SKIP_VOLUME_BINDING").is_some_and(|v| v == "1")
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
