//! What the dashboard knows of the other brokers: their records and the
//! controller epochs, read from the shared files about once a second by a
//! thread of its own through the read-only view (with `kaas inspect`'s
//! readers), and the liveness this host observes from them — a record whose
//! `seq` has not changed for lease + grace on this host's clock is shown as
//! not alive, the same rule the controller uses. Requests only read the
//! snapshot, so a hung volume makes it stale, never a request slow.
//!
//! The same module runs the telemetry sampler (rates, sparklines, lease
//! headroom): on its own thread too, since it never touches the volume it
//! keeps ticking when the volume hangs.

use crate::inspect::{read_brokers, read_controller_epochs, BrokerFile, ControllerEpochFile};
use kaas_actors::cluster::membership::Shared;
use kaas_volume::fs::ReadFs;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One broker as this host sees it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BrokerSeen {
    /// The file as read.
    pub id: i32,
    /// Host, port, incarnation, seq, flags (the record).
    pub record: Option<kaas_actors::cluster::records::BrokerRecord>,
    /// Time since this host last saw its `seq` change (ms).
    pub lease_age_ms: u64,
    /// Heartbeating within lease + grace, and not exited.
    pub alive: bool,
}

/// A change in the cluster this host noticed between two reads of the
/// files: what an on-call engineer must see even once it is over (a broker
/// that lapsed and rejoined looks healthy a second later).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClusterEvent {
    /// Wall-clock ms when this host noticed it.
    pub at_ms: i64,
    /// `broker_dead`, `broker_back`, `incarnation`, `controller`.
    pub kind: &'static str,
    /// The broker concerned (for `controller`: the new controller).
    pub broker: Option<i32>,
    /// One line for a human.
    pub text: String,
}

/// Cluster events kept, newest last (older ones drop off).
pub const EVENTS_KEPT: usize = 64;

#[derive(Default)]
struct Snapshot {
    /// What changed between reads (bounded: [`EVENTS_KEPT`]).
    events: std::collections::VecDeque<ClusterEvent>,
    brokers: Vec<BrokerSeen>,
    controller: Option<ControllerEpochFile>,
    epochs_seen: usize,
    problems: Vec<String>,
    read_at: Option<Instant>,
    /// (seq, when this host first saw it) per broker.
    seen: HashMap<i32, (u64, Instant)>,
    /// When the snapshot was last asked for: the sampler re-reads the files
    /// only while someone looks (see [`ClusterFiles::refresh_if_viewed`]).
    viewed_at: Option<Instant>,
}

/// The sampler re-reads the cluster files while the snapshot was asked for
/// within this long (so the first look after a quiet spell answers from an
/// old or empty snapshot, and the next ones, a second later, from a fresh
/// one); an unwatched broker reads none (it was a dozen
/// metadata operations a second on the volume, for a page nobody had open).
pub const VIEWED_FOR: Duration = Duration::from_secs(60);

/// The shared-files snapshot behind `/api/cluster`.
pub struct ClusterFiles {
    fs: ReadFs,
    cluster_dir: PathBuf,
    dead_after: Duration,
    snap: Mutex<Snapshot>,
}

impl ClusterFiles {
    /// A snapshot of `cluster_dir`, read through `fs`; a broker is shown
    /// dead after `dead_after` (lease + grace) without a new `seq`.
    pub fn new(fs: ReadFs, cluster_dir: PathBuf, dead_after: Duration) -> Self {
        Self {
            fs,
            cluster_dir,
            dead_after,
            snap: Mutex::default(),
        }
    }

    /// [`Self::refresh`] if the snapshot was asked for within
    /// [`VIEWED_FOR`] (called by the sampler thread).
    pub fn refresh_if_viewed(&self) {
        let viewed = self
            .snap
            .lock()
            .unwrap()
            .viewed_at
            .is_some_and(|t| t.elapsed() < VIEWED_FOR);
        if viewed {
            self.refresh();
        }
    }

    /// Re-read the files (blocking).
    pub fn refresh(&self) {
        let mut problems = Vec::new();
        let files: Vec<BrokerFile> = read_brokers(&self.fs, &self.cluster_dir, &mut problems);
        let mut epochs = read_controller_epochs(&self.fs, &self.cluster_dir, &mut problems);
        let now = Instant::now();
        let mut s = self.snap.lock().unwrap();
        let brokers: Vec<BrokerSeen> = files
            .into_iter()
            .map(|f| {
                let seq = f.record.as_ref().map_or(0, |r| r.seq);
                let since = match s.seen.get(&f.id) {
                    Some((old, at)) if *old == seq => *at,
                    _ => {
                        s.seen.insert(f.id, (seq, now));
                        now
                    }
                };
                let age = now.saturating_duration_since(since);
                let exited = f.record.as_ref().is_none_or(|r| r.clean_exit);
                BrokerSeen {
                    id: f.id,
                    alive: !exited && age < self.dead_after,
                    lease_age_ms: age.as_millis() as u64,
                    record: f.record,
                }
            })
            .collect();
        let controller = epochs.pop();
        let at_ms = kaas_actors::clock::wall_ms();
        let mut found = changes(&s.brokers, &brokers, at_ms);
        if let Some(e) = controller_change(s.controller.as_ref(), controller.as_ref(), at_ms) {
            found.push(e);
        }
        for e in found {
            if s.events.len() == EVENTS_KEPT {
                s.events.pop_front();
            }
            s.events.push_back(e);
        }
        s.brokers = brokers;
        s.epochs_seen = epochs.len();
        s.controller = controller;
        s.problems = problems;
        s.read_at = Some(now);
    }

    /// The cluster events noticed so far, oldest first.
    pub(super) fn events(&self) -> Vec<ClusterEvent> {
        self.snap.lock().unwrap().events.iter().cloned().collect()
    }

    /// The snapshot as JSON parts: (brokers, controller claim, number of
    /// controller epochs, problems, ms since the read).
    pub(super) fn view(
        &self,
    ) -> (
        Vec<BrokerSeen>,
        Option<serde_json::Value>,
        usize,
        Vec<String>,
        Option<u64>,
    ) {
        let mut s = self.snap.lock().unwrap();
        // The sampler thread reads the files from its next tick on (never
        // this handler: the volume may hang); until then the snapshot is
        // the last one, or empty (`read_ms_ago` says how old).
        s.viewed_at = Some(Instant::now());
        // Ages were taken at the read; they have grown since.
        let since_read = s.read_at.map_or(0, |t| t.elapsed().as_millis() as u64);
        let brokers = s
            .brokers
            .iter()
            .map(|b| BrokerSeen {
                lease_age_ms: b.lease_age_ms + since_read,
                ..b.clone()
            })
            .collect();
        let controller = s.controller.as_ref().map(|c| {
            serde_json::json!({
                "epoch": c.epoch,
                "broker_id": c.claim.as_ref().map(|x| x.broker_id),
                "incarnation": c.claim.as_ref().map(|x| x.incarnation.to_string()),
            })
        });
        (
            brokers,
            controller,
            s.epochs_seen,
            s.problems.clone(),
            s.read_at.map(|t| t.elapsed().as_millis() as u64),
        )
    }
}

/// What changed for each broker between two reads: it stopped
/// heartbeating (not a clean exit), came back, or runs as a new
/// incarnation (a restart, or a lease lapse it rejoined from).
fn changes(before: &[BrokerSeen], now: &[BrokerSeen], at_ms: i64) -> Vec<ClusterEvent> {
    let mut out = Vec::new();
    for b in now {
        let Some(old) = before.iter().find(|o| o.id == b.id) else {
            continue;
        };
        let inc = |x: &BrokerSeen| x.record.as_ref().map(|r| r.incarnation);
        let event = |kind, text: String| ClusterEvent {
            at_ms,
            kind,
            broker: Some(b.id),
            text,
        };
        let clean_exit = b.record.as_ref().is_some_and(|r| r.clean_exit);
        if let (Some(a), Some(n)) = (inc(old), inc(b)) {
            if a != n {
                out.push(event(
                    "incarnation",
                    format!("broker {} runs as a new incarnation {n} (was {a}): it restarted, or its lease lapsed and it rejoined; what it led moved", b.id),
                ));
                continue;
            }
        }
        if old.alive && !b.alive && !clean_exit {
            out.push(event(
                "broker_dead",
                format!(
                    "broker {} stopped heartbeating ({} ms without a new heartbeat): dead, frozen or cut off from the volume",
                    b.id, b.lease_age_ms
                ),
            ));
        } else if !old.alive && b.alive {
            out.push(event(
                "broker_back",
                format!("broker {} heartbeats again", b.id),
            ));
        }
    }
    out
}

/// A new controller epoch between two reads.
fn controller_change(
    before: Option<&ControllerEpochFile>,
    now: Option<&ControllerEpochFile>,
    at_ms: i64,
) -> Option<ClusterEvent> {
    let (old, new) = (before?, now?);
    if old.epoch == new.epoch {
        return None;
    }
    let id = new.claim.as_ref().map(|c| c.broker_id);
    Some(ClusterEvent {
        at_ms,
        kind: "controller",
        broker: id,
        text: format!(
            "controller changed: epoch {} → {}, now broker {}",
            old.epoch,
            new.epoch,
            id.map_or("?".to_string(), |i| i.to_string())
        ),
    })
}

/// The background work behind the dashboard.
pub struct Sampler;

impl Sampler {
    /// Start the telemetry sampler and the cluster-files reader, each on a
    /// thread of its own, every `every`.
    pub fn start(files: Arc<ClusterFiles>, shared: Arc<Shared>, every: Duration) {
        let spawn = |name: &str, f: Box<dyn FnMut() + Send>| {
            let mut f = f;
            let _ = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || loop {
                    f();
                    std::thread::sleep(every);
                });
        };
        let mut last = Instant::now();
        spawn(
            "telemetry-sampler",
            Box::new(move || {
                let t = kaas_actors::telemetry::global();
                let headroom = shared.lease.remaining().as_millis() as i64;
                t.lease_headroom_ms.store(headroom, Ordering::Relaxed);
                let now = Instant::now();
                t.sample(
                    now.saturating_duration_since(last).as_secs_f64(),
                    kaas_actors::clock::wall_ms(),
                );
                last = now;
            }),
        );
        spawn("cluster-files", Box::new(move || files.refresh_if_viewed()));
    }
}
