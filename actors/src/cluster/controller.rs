//! `ControllerActor`: controller election, and — while elected — the only
//! writer of the assignment history ([`super::history`]).
//!
//! Election: every broker polls the highest claim `controller/epoch-<n>`.
//! When its holder is provably fenced — its broker record shows another
//! incarnation, says it exited or released epoch n, or its heartbeat `seq`
//! stood still for lease + grace on *our* clock — a candidate claims exactly
//! `epoch-<n+1>` with O_CREAT|O_EXCL. One racer wins; the others get EEXIST
//! and re-read. The controller's lease is its broker lease: it writes the
//! assignment only while that lease is valid, and steps down when it lapses
//! or when a higher claim appears.
//!
//! While elected it observes every broker's record (timing `seq` changes on
//! its own clock), scans topic stamps, folds every version it has not read
//! yet into its base (a deposed controller's late version included: it
//! plans from it, never past it), runs [`plan_moves`](super::plan::plan_moves), and publishes the change
//! as the next version (O_EXCL) when anything changed. It checkpoints the
//! whole map now and then and prunes versions well below the checkpoint. Nobody is declared dead before
//! *this host* has watched its heartbeat stand still for lease + grace — but
//! a candidate watches every broker record too, and carries that
//! observation into its first pass: the successor of a dead controller has
//! already timed the dead broker's silence (that is what elected it), so its
//! partitions are re-granted at once instead of after a second lease + grace.
//! The election judges a claim's holder on that same observation
//! (`Observed::dead` over `Sight`), never on a timing of its own.
//!
//! The logic lives in [`ControllerState`] (plain Rust: the clock and the
//! volume are inputs, a pass returns whether it published a version);
//! [`ControllerActor`] is the actix glue that polls it and nudges the
//! watcher.

use super::history::{self, Probe, Published};
use super::lease::LeaseGuard;
use super::membership::Shared;
use super::plan::{plan_moves, BrokerView, MovePolicy, TopicInfo};
use super::records::{
    read_json, Assignment, AssignmentDelta, BrokerRecord, ASSIGNMENT, BROKERS_DIR,
};
use super::watcher::{AssignmentWatcher, PollNow};
use crate::clock::SharedClock;
use crate::cluster::election::{
    controller_epoch_exists, highest_controller_epoch, win_controller_term, ControllerEpoch,
    ControllerTerm,
};
use crate::partition::claim::parse_claim_name;
use crate::partition::manifest::{parse_manifest_name, parse_segment_name};
use crate::telemetry::{ActorStats, Mailbox, MessageName};
use crate::topic::validate_name;
use actix::prelude::*;
use kaas_volume::fs::SharedFs;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Without a change notice ([`kaas_volume::topic_notice`]) a topic's files
/// are re-read after between half of this and all of it (spread by name, so
/// an idle controller reads a few topics per pass rather than all of them
/// at once). This only bounds how late a lost or late notice is made up
/// for; every change a broker makes posts a notice that is acted on the
/// next pass. 10,000 topics cost ~100 reads/s; 1,000 topics ~10.
pub(crate) const TOPIC_REFRESH: Duration = Duration::from_secs(300);

/// The data directory is listed at most this often (see
/// `ControllerState::scan_topics`): topics changed through the Kafka API
/// are announced by notices and planned the same pass; a directory made or
/// removed without one is seen within this.
pub(crate) const LIST_EVERY: Duration = Duration::from_secs(1);

/// The broker records and the change notices are listed at least this
/// often even when the bell ([`kaas_volume::topic_notice::BELL`]) stayed
/// quiet: the safety net for a ring lost to a crash between a change and
/// its ring. The history is listed this often too (see
/// `Leading::history_listed_at`).
pub(crate) const SAFETY_LIST_EVERY: Duration = Duration::from_secs(5);

/// After the bell changed, the broker records and the notices are listed
/// every pass for this long: a listing may be stale (an NFS client caches a
/// directory's listing for its attribute lifetime; weakfs for 3 s), so the
/// entry a ring announced may show up only in a later listing.
pub(crate) const AFTER_RING: Duration = Duration::from_secs(5);

/// When a topic read at `at` is due to be read again (see [`TOPIC_REFRESH`]).
fn refresh_due(name: &str, at: Duration) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    let half = TOPIC_REFRESH / 2;
    at + half + Duration::from_millis(h.finish() % half.as_millis().max(1) as u64)
}

/// The checkpoint is rewritten once the versions published since it add
/// up to its own size (at least this much): checkpoint bytes stay within a
/// constant factor of version bytes, so creating N topics costs O(N) bytes
/// in all, not O(N²).
const CHECKPOINT_MIN_BYTES: usize = 64 * 1024;
/// …or once nothing was published for this long (an idle cluster's
/// checkpoint is current, so a starting reader folds nothing).
const CHECKPOINT_QUIET: Duration = Duration::from_secs(2);
/// Versions are pruned only below a checkpoint that has been in place this
/// long, and only this many versions below it: a slow reader is never
/// stranded (and one that is restarts from the checkpoint).
const PRUNE_AFTER: Duration = Duration::from_secs(60);
/// See [`PRUNE_AFTER`].
const PRUNE_KEEP: u64 = 64;
/// Versions a pass folds at most before planning (the rest next pass).
const FOLD_LIMIT: usize = 100_000;

/// What the bell ([`kaas_volume::topic_notice::BELL`]) said, as candidate
/// or controller: `brokers/`, `topic-changes/` (elected) and `controller/`
/// (candidate) are listed only in passes within [`AFTER_RING`] of a change,
/// or once every [`SAFETY_LIST_EVERY`]. Listing them every pass was most of
/// an idle broker's volume operations.
#[derive(Default)]
struct Bell {
    /// The bytes last read (outer `None`: never read).
    seen: Option<Option<Vec<u8>>>,
    /// When they last changed (our clock).
    rang_at: Option<Duration>,
    /// When the directories were last listed (`None`: list next pass).
    listed_at: Option<Duration>,
}

impl Bell {
    /// Whether this pass lists: the bell is read by exact name
    /// (close-to-open: a ring made anywhere before this read is seen by
    /// it), and a change makes this pass and every pass for [`AFTER_RING`]
    /// list (a stale listing may not show the ringer's entry yet);
    /// otherwise the first pass and then once every [`SAFETY_LIST_EVERY`].
    /// An unreadable bell counts as rung.
    fn due(
        &mut self,
        fs: &dyn kaas_volume::fs::Fs,
        cluster: &std::path::Path,
        now: Duration,
    ) -> bool {
        let rang = match kaas_volume::topic_notice::read_bell(fs, cluster) {
            Ok(b) => {
                // The first read is no ring: the first pass lists anyway.
                let changed = self.seen.as_ref().is_some_and(|old| *old != b);
                self.seen = Some(b);
                changed
            }
            Err(e) => {
                tracing::debug!(error = %e, "change bell unreadable; listing");
                true
            }
        };
        if rang {
            self.rang_at = Some(now);
        }
        let due = self
            .rang_at
            .is_some_and(|t| now.saturating_sub(t) < AFTER_RING)
            || self
                .listed_at
                .is_none_or(|t| now.saturating_sub(t) >= SAFETY_LIST_EVERY);
        if due {
            self.listed_at = Some(now);
        }
        due
    }
}

struct Observed {
    record: BrokerRecord,
    /// When a read first returned this (seq, incarnation): after the read,
    /// so no earlier than the heartbeat's start.
    last_change: Duration,
    /// How long the record has provably stood still: from `last_change` to
    /// the *start* of the latest read that still showed it.
    still: Duration,
}

impl Observed {
    /// Stood still for more than lease + grace on our clock: its owner is
    /// fenced (the election and the plan both ask exactly this).
    fn dead(&self, dead_after: Duration) -> bool {
        self.still > dead_after
    }
}

struct Leading {
    /// The capability the history is written through; dropped on
    /// resignation.
    term: ControllerTerm,
    epoch: i32,
    incarnation: u64,
    /// The history folded up to its newest complete version.
    prev: Assignment,
    /// A version we tried to publish and got an error for: it may exist
    /// torn. If so it is completed with exactly these bytes (any reader
    /// sees the same content either way).
    pending: Option<(u64, Vec<u8>)>,
    /// A torn version someone else created, and since when (our clock).
    torn_since: Option<(u64, Duration)>,
    /// The checkpoint's version, as far as we know.
    checkpoint: u64,
    /// Its size, and the bytes of versions published since.
    checkpoint_len: usize,
    delta_bytes: usize,
    /// When we last published.
    last_publish: Duration,
    /// Checkpoints written (version, when), oldest first, not yet pruned
    /// below.
    checkpoints: std::collections::VecDeque<(u64, Duration)>,
    /// Versions below this are pruned.
    pruned_below: u64,
    /// The version the head was last written with.
    head: u64,
    /// Topic stamps read, and when each is due to be read again (see
    /// [`TOPIC_REFRESH`]).
    topics: HashMap<String, (TopicInfo, Duration)>,
    /// What the last [`ControllerState::scan_topics`] gave the plan; kept
    /// so a pass that read nothing new neither clones nor compares it.
    view: BTreeMap<String, TopicInfo>,
    /// Bumped whenever `view` changes.
    view_gen: u64,
    /// When the data directory was last listed (see
    /// [`ControllerState::scan_topics`]).
    listed_at: Option<Duration>,
    /// When the history was last listed to look past a cached "no such
    /// file" for the next version (our clock). A version this controller
    /// did not write (a deposed controller's, won before our first) is
    /// found by exact name at once, or — hidden by an NFS client's
    /// negative cache — by that listing within [`LIST_EVERY`], or by our
    /// own next publish meeting EEXIST; a listing is never taken for
    /// "nothing newer", so nothing is planned past it either way. Listed
    /// every pass it was a tenth of an idle broker's volume operations.
    history_listed_at: Option<Duration>,
    /// Every broker `prev` names (leaders, releases, endpoints), for the
    /// version it was computed at (so a pass does not walk every partition).
    named: (u64, i32, Vec<i32>),
    /// The inputs of the last plan that changed nothing: a pass whose
    /// inputs are equal would change nothing again, so it skips the plan.
    unchanged_plan: Option<PlanInputs>,
    /// Coordinator shards, once `group-shards.json` was read (0 before).
    shards: u32,
    /// The eligible brokers as of the last pass, and since when (our
    /// clock) they have been those: moves for balance wait for
    /// [`Rebalance::delay`](super::membership::Rebalance) of stability.
    eligible: (Vec<i32>, Duration),
    /// Moves for balance started and not finished: continued (whatever the
    /// threshold) until nothing is out of place or the brokers change.
    rebalancing: bool,
    /// When `controller/epoch-<ours + 1>` was last probed: at most every
    /// [`LIST_EVERY`] (a successor needs our record to stand still for
    /// lease + grace, by which time our own lease has lapsed and every
    /// write through the term is refused anyway; this only makes us step
    /// down sooner).
    epoch_probed_at: Option<Duration>,
    /// Probe the next history version on the next pass whatever the
    /// cadence (our publish met EEXIST: someone else's version to fold).
    probe_next: bool,
    /// When `group-shards.json` was last looked for (while not found).
    shards_probed_at: Option<Duration>,
}

/// What [`plan_moves`] decides from, without what does not matter to
/// it (a broker record's heartbeat `seq` changes every beat; the plan reads
/// only liveness, incarnation, applied version, shutdown and fences). The
/// plan is a pure function of these (a partition it would grant anew reads
/// the disk's epochs, but a plan that changed nothing granted nothing anew).
#[derive(Debug, PartialEq, Eq)]
struct PlanInputs {
    base: (i32, i32, u64),
    shards: u32,
    view_gen: u64,
    brokers: Vec<(i32, bool, bool, BrokerRecord)>,
    policy: MovePolicy,
}

impl PlanInputs {
    fn of(
        l: &Leading,
        shards: u32,
        brokers: &BTreeMap<i32, BrokerView>,
        policy: MovePolicy,
    ) -> Self {
        Self {
            policy,
            base: (
                l.prev.controller_epoch,
                l.prev.controller_id,
                l.prev.version,
            ),
            shards,
            view_gen: l.view_gen,
            brokers: brokers
                .iter()
                .map(|(id, b)| {
                    let record = BrokerRecord {
                        seq: 0,
                        ..b.record.clone()
                    };
                    (*id, b.alive, b.suspect, record)
                })
                .collect(),
        }
    }
}

/// Every broker record this host has watched, as candidate or controller,
/// timed on this host's own monotonic clock. Kept across elections: an
/// observation is evidence whoever made it on this host, and the first
/// pass of a new controller starts from it instead of from zero.
#[derive(Default)]
struct Sight {
    observed: BTreeMap<i32, Observed>,
    /// Brokers named in the assignment whose record was not found, since
    /// when (our clock). A live broker rewrites its record every heartbeat,
    /// so one missing for lease + grace is treated as gone for good.
    missing: HashMap<i32, Duration>,
}

/// The controller's logic without actix (see module docs).
pub struct ControllerState {
    fs: SharedFs,
    shared: Arc<Shared>,
    clock: SharedClock,
    data_dir: PathBuf,
    /// Candidate: an unowned claim (epoch) we are timing, since when.
    watching: Option<(i32, Duration)>,
    sight: Sight,
    leading: Option<Leading>,
    resigned: bool,
    bell: Bell,
    /// A candidate's highest controller claim as last read in full (a
    /// listing and exact probes above it): between listings a pass only
    /// probes the next epoch by exact name.
    claim: Option<ControllerEpoch>,
}

/// The moves for balance this pass may make: none until the eligible
/// brokers have been the same for `r.delay` (a change restarts the wait and
/// stops a rebalance under way); then up to `r.max_moves` in flight, started
/// only above `r.min_percent` out of place and finished once started.
fn rebalance_policy(
    l: &mut Leading,
    brokers: &BTreeMap<i32, BrokerView>,
    r: super::membership::Rebalance,
    now: Duration,
) -> MovePolicy {
    let eligible: Vec<i32> = brokers
        .iter()
        .filter(|(_, b)| b.eligible())
        .map(|(id, _)| *id)
        .collect();
    if eligible != l.eligible.0 {
        l.eligible = (eligible, now);
        l.rebalancing = false;
    }
    if l.rebalancing {
        MovePolicy {
            max_moves: r.max_moves,
            min_percent: 0,
        }
    } else if now.saturating_sub(l.eligible.1) >= r.delay {
        MovePolicy {
            max_moves: r.max_moves,
            min_percent: r.min_percent,
        }
    } else {
        MovePolicy::NONE
    }
}

/// A broker as the controller currently sees it (tests and the dashboard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// Not yet dead: its record moved within lease + grace of our clock.
    pub alive: bool,
    /// Silent for longer than a lease: not advertised, no new grants.
    pub suspect: bool,
}

impl ControllerState {
    /// A candidate that has observed nothing yet.
    pub fn new(fs: SharedFs, shared: Arc<Shared>, data_dir: PathBuf) -> Self {
        let clock = shared.clock().clone();
        Self {
            fs,
            shared,
            clock,
            data_dir,
            watching: None,
            sight: Sight::default(),
            leading: None,
            resigned: false,
            bell: Bell::default(),
            claim: None,
        }
    }

    /// The controller epoch we hold, if elected.
    pub fn epoch(&self) -> Option<i32> {
        self.leading.as_ref().map(|l| l.epoch)
    }

    /// How this controller judges broker `id` now, if it has observed it.
    pub fn liveness(&self, id: i32) -> Option<Liveness> {
        self.leading.as_ref()?;
        let o = self.sight.observed.get(&id)?;
        Some(Liveness {
            alive: !o.dead(self.shared.timing.dead_after()),
            suspect: o.still > self.shared.timing.lease,
        })
    }

    /// See [`HandoffPending`].
    pub fn handoff_pending(&self) -> bool {
        let Some(l) = &self.leading else { return false };
        let me = self.shared.broker_id;
        let dead_after = self.shared.timing.dead_after();
        let someone_eligible = self.sight.observed.iter().any(|(id, o)| {
            *id != me && !o.dead(dead_after) && !o.record.shutting_down && !o.record.clean_exit
        });
        let vacant = l
            .prev
            .topics
            .values()
            .flat_map(|t| t.partitions.iter())
            .any(|e| e.leader < 0);
        someone_eligible && vacant
    }

    /// See [`Resign`].
    pub fn resign_for_shutdown(&mut self) -> Option<i32> {
        self.resigned = true;
        let epoch = self.epoch();
        self.resign("controlled shutdown");
        self.shared
            .leading_controller
            .store(false, std::sync::atomic::Ordering::Release);
        epoch
    }

    fn cluster_dir(&self) -> &std::path::Path {
        &self.shared.cluster_dir
    }

    fn resign(&mut self, why: &str) {
        // A candidate again: its first pass reads and lists everything.
        self.claim = None;
        self.bell.listed_at = None;
        if let Some(l) = self.leading.take() {
            // A controlled shutdown is the expected way out: INFO. Any
            // other reason (a lapsed lease, a newer controller) is WARN.
            if self.resigned {
                tracing::info!(epoch = l.epoch, why, "stepping down as controller");
            } else {
                tracing::warn!(epoch = l.epoch, why, "stepping down as controller");
            }
        }
    }

    /// The checkpoint this controller writes while elected (beside the
    /// history directory).
    pub fn assignment_path(&self) -> PathBuf {
        self.cluster_dir().join(ASSIGNMENT)
    }

    /// One poll: campaign, or (while elected) observe and reconcile.
    /// Returns whether a new assignment version was written.
    pub fn tick(&mut self) -> bool {
        self.shared
            .controller_tick
            .store(self.shared.now_ns(), std::sync::atomic::Ordering::Release);
        let wrote = self.pass();
        self.shared
            .leading_controller
            .store(self.leading.is_some(), std::sync::atomic::Ordering::Release);
        wrote
    }

    fn pass(&mut self) -> bool {
        if self.resigned {
            return false;
        }
        let lease = &self.shared.lease;
        let inc = lease.incarnation();
        if !lease.valid_for(inc) {
            self.resign("lease not valid");
            return false;
        }
        let released = self.shared.state.lock().unwrap().controller_released;
        if let Some(l) = &self.leading {
            if l.incarnation != inc {
                self.resign("new incarnation");
            } else if released == Some(l.epoch) {
                self.resign("released for shutdown");
                return false;
            } else {
                let now = self.clock.now();
                let due = l
                    .epoch_probed_at
                    .is_none_or(|t| now.saturating_sub(t) >= LIST_EVERY);
                if due {
                    let higher = controller_epoch_exists(&self.fs, self.cluster_dir(), l.epoch + 1);
                    if let Some(l) = self.leading.as_mut() {
                        l.epoch_probed_at = Some(now);
                    }
                    if higher {
                        self.resign("a higher controller epoch exists");
                    }
                }
            }
        }
        if self.leading.is_some() {
            match self.lead() {
                Ok(wrote) => return wrote,
                Err(e) => {
                    tracing::warn!(error = %e, "controller pass failed; retrying next poll")
                }
            }
        } else if released.is_none() && !self.shared.state.lock().unwrap().shutting_down {
            match self.campaign(inc) {
                Ok(wrote) => return wrote,
                Err(e) => {
                    tracing::warn!(error = %e, "controller election pass failed; retrying next poll")
                }
            }
        }
        false
    }

    /// Whether a claim nobody owns (created, never written: its creator
    /// crashed between create and write) has been seen for lease + grace:
    /// from the read that first showed it (timed after it) to the start of
    /// the read that still shows it (`read_start`). A claim with an owner is
    /// judged on the owner's record instead ([`ControllerState::holder_fenced`]).
    fn unowned_for_long(&mut self, claim: &ControllerEpoch, read_start: Duration) -> bool {
        match self.watching {
            Some((e, since)) if e == claim.epoch => {
                read_start.saturating_sub(since) > self.shared.timing.dead_after()
            }
            _ => {
                self.watching = Some((claim.epoch, self.clock.now()));
                false
            }
        }
    }

    /// Whether the holder of `claim` is provably fenced, on the very
    /// observation the first pass plans from (`sight`): its record shows
    /// another incarnation, says it exited or released the epoch, or has
    /// stood still for lease + grace on our clock (a record missing that
    /// long is a gone broker in `sight`). The election and the plan read one
    /// `Observed`, so a successor elected on a dead holder's silence finds
    /// it dead in the pass that elected it — never a second timing of it.
    fn holder_fenced(&self, claim: &ControllerEpoch) -> bool {
        let Some(o) = self.sight.observed.get(&claim.broker_id) else {
            return false;
        };
        o.record.incarnation != claim.incarnation
            || o.record.clean_exit
            || o.record.controller_released == Some(claim.epoch)
            || o.dead(self.shared.timing.dead_after())
    }

    fn campaign(&mut self, inc: u64) -> std::io::Result<bool> {
        let me = self.shared.broker_id;
        let read_start = self.clock.now();
        // The bell first: a ring (a join, a claim won) follows its change.
        let list = self.listing_due();
        let claim = self.highest_claim(list)?;
        // Every broker record, the holder's included (by exact name, even
        // if a stale listing misses it), timed in `sight`: if we are
        // elected, our first pass already knows who has been silent, and
        // for how long on our clock.
        let mut ids = match self.broker_ids(list) {
            Ok(ids) => ids,
            Err(e) => {
                tracing::debug!(error = %e, "broker listing failed while a candidate");
                self.sight.observed.keys().copied().collect()
            }
        };
        ids.extend(claim.as_ref().map(|c| c.broker_id));
        // And every broker the assignment this broker applied names: a
        // stale listing (a record created within an NFS client's attribute
        // lifetime) must not hide a broker holding grants until our
        // election, after which it would be timed from zero.
        ids.extend(self.shared.named.lock().unwrap().iter().copied());
        self.read_records(ids);
        let (next, gone) = match &claim {
            None => (1, true),
            Some(c) if c.broker_id == me && c.incarnation == inc => {
                // Ours already (a lost reply to our own create).
                let guard = LeaseGuard::new(self.shared.lease.clone(), inc);
                let (cluster_dir, epoch) = (self.shared.cluster_dir.clone(), c.epoch);
                return match win_controller_term(&self.fs, guard, &cluster_dir, epoch, me, Some(c))?
                {
                    Some(term) => self.elected(term),
                    None => Ok(false),
                };
            }
            Some(c) if c.broker_id < 0 => (c.epoch + 1, self.unowned_for_long(c, read_start)),
            Some(c) => (c.epoch + 1, self.holder_fenced(c)),
        };
        if !gone {
            return Ok(false);
        }
        let guard = LeaseGuard::new(self.shared.lease.clone(), inc);
        // Whatever comes of it, read the claims in full next time.
        self.claim = None;
        if let Some(term) =
            win_controller_term(&self.fs, guard, self.cluster_dir(), next, me, None)?
        {
            // Tell the other candidates (they list `controller/` after a
            // ring, and otherwise only probe the next epoch by name).
            if let Err(e) =
                kaas_volume::topic_notice::ring(self.fs.as_ref(), &self.shared.cluster_dir)
            {
                tracing::debug!(error = %e, "election bell not rung");
            }
            self.elected(term)
        } else {
            tracing::info!(epoch = next, "lost the controller election");
            Ok(false)
        }
    }

    /// The highest controller claim: read in full (a listing of
    /// `controller/`, exact probes above it, the claim itself) when `list`,
    /// when none is known, or when the known one has no owner yet; between
    /// those, one exact-name probe of the next epoch (a claim is never
    /// rewritten once written, so the known one stays what it was).
    fn highest_claim(&mut self, list: bool) -> std::io::Result<Option<ControllerEpoch>> {
        if let Some(c) = self.claim.as_ref().filter(|c| !list && c.broker_id >= 0) {
            let next = self
                .cluster_dir()
                .join(kaas_volume::layout::CONTROLLER_DIR)
                .join(kaas_volume::layout::controller_epoch(c.epoch + 1));
            if !kaas_volume::fs::exists(self.fs.as_ref(), &next)? {
                return Ok(Some(c.clone()));
            }
        }
        let claim = highest_controller_epoch(&self.fs, self.cluster_dir())?;
        self.claim = claim.clone();
        Ok(claim)
    }

    fn elected(&mut self, term: ControllerTerm) -> std::io::Result<bool> {
        let (epoch, incarnation) = (term.epoch(), term.incarnation());
        // The checkpoint folded forward; a torn version at the end is
        // handled by the first pass.
        let current = history::read_current(self.fs.as_ref(), self.cluster_dir())?;
        let prev = current.assignment;
        tracing::info!(epoch, version = prev.version, "elected controller");
        // Temps of a repair or checkpoint that died before its rename.
        if let Err(e) = kaas_volume::fs::remove_stale_temps(
            term.fs(),
            &history::history_dir(self.cluster_dir()),
        ) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::debug!(error = %e, "stale assignment temps not removed");
            }
        }
        // Temps of notice posts that died before their rename (only the
        // controller removes anything there).
        if let Err(e) = kaas_volume::topic_notice::remove_stale_temps(term.fs(), self.cluster_dir())
        {
            tracing::debug!(error = %e, "stale topic notice temps not removed");
        }
        self.watching = None;
        // The first pass as controller lists everything.
        self.bell.listed_at = None;
        self.leading = Some(Leading {
            term,
            epoch,
            incarnation,
            prev,
            pending: None,
            torn_since: None,
            checkpoint: current.checkpoint,
            checkpoint_len: 0,
            delta_bytes: 0,
            last_publish: self.clock.now(),
            checkpoints: Default::default(),
            pruned_below: 0,
            head: 0,
            topics: HashMap::new(),
            view: BTreeMap::new(),
            view_gen: 0,
            listed_at: None,
            history_listed_at: None,
            named: (0, 0, Vec::new()),
            unchanged_plan: None,
            shards: 0,
            eligible: (Vec::new(), self.clock.now()),
            rebalancing: false,
            epoch_probed_at: Some(self.clock.now()),
            probe_next: false,
            shards_probed_at: None,
        });
        self.lead()
    }

    /// Every broker already watched and — with `list` — every one the
    /// listing shows, by exact name. A broker id never seen before is found
    /// only by the listing, and a join discovered late is granted late, so
    /// the partitions of topics created meanwhile would move twice (listed
    /// once a second, `test_cluster_balance` saw them move): while elected
    /// it is listed whenever the bell rang (a joining broker rings it after
    /// its first record is written) — see [`ControllerState::listing_due`].
    fn broker_ids(&self, list: bool) -> std::io::Result<Vec<i32>> {
        let mut ids: Vec<i32> = if list {
            let dir = self.cluster_dir().join(BROKERS_DIR);
            self.fs
                .list(&dir)?
                .iter()
                .filter_map(|n| kaas_volume::layout::parse_broker_record(n))
                .collect()
        } else {
            Vec::new()
        };
        ids.extend(self.sight.observed.keys().copied());
        Ok(ids)
    }

    /// Whether this pass lists (see [`Bell::due`]).
    fn listing_due(&mut self) -> bool {
        let now = self.clock.now();
        let cluster = self.shared.cluster_dir.clone();
        self.bell.due(self.fs.as_ref(), &cluster, now)
    }

    fn observe(&mut self, list: bool) -> std::io::Result<BTreeMap<i32, BrokerView>> {
        let mut ids = self.broker_ids(list)?;
        let l = self.leading.as_mut().expect("leading");
        // Also every broker the assignment names, by exact name: a stale
        // listing must not hide a broker that holds grants. Collected once
        // per version, not every pass (10,000 partitions each 100 ms).
        if (l.named.0, l.named.1) != (l.prev.version, l.prev.controller_epoch) {
            l.named = (
                l.prev.version,
                l.prev.controller_epoch,
                l.prev.named_brokers(),
            );
        }
        ids.extend_from_slice(&l.named.2);
        self.read_records(ids);
        let dead_after = self.shared.timing.dead_after();
        let lease = self.shared.timing.lease;
        Ok(self
            .sight
            .observed
            .iter()
            .map(|(id, o)| {
                (
                    *id,
                    BrokerView {
                        record: o.record.clone(),
                        alive: !o.dead(dead_after),
                        suspect: o.still > lease,
                    },
                )
            })
            .collect())
    }

    /// Read each broker's record by exact name and time its changes on our
    /// clock ("stood still" runs from the read that first showed a seq,
    /// timed after it, to the start of the latest read still showing it).
    fn read_records(&mut self, mut ids: Vec<i32>) {
        ids.retain(|id| *id >= 0);
        ids.sort_unstable();
        ids.dedup();
        let clock = self.clock.clone();
        let l = &mut self.sight;
        for id in ids {
            let path = super::records::broker_record_path(&self.shared.cluster_dir, id);
            let read_start = clock.now();
            // Our own record is what our heartbeat last wrote (its only
            // writer; see `Shared::written`): not re-read every pass.
            let own = (id == self.shared.broker_id)
                .then(|| self.shared.written.lock().unwrap().clone())
                .flatten();
            let read = match own {
                Some(r) => Ok(Some(r)),
                None => read_json::<BrokerRecord>(self.fs.as_ref(), &path),
            };
            let r = match read {
                Ok(Some(r)) => {
                    l.missing.remove(&id);
                    r
                }
                Ok(None) => {
                    if let Some(o) = l.observed.get_mut(&id) {
                        // No record is no new heartbeat either (a live
                        // broker rewrites its record every heartbeat): the
                        // stand-still goes on from the last one we saw.
                        if o.still != Duration::MAX {
                            o.still = read_start.saturating_sub(o.last_change);
                        }
                        continue;
                    }
                    // Named (by a grant, a release or a claim) but never
                    // seen: once that has lasted lease + grace, it is
                    // gone — its releases are complete, its grants void.
                    let since = *l.missing.entry(id).or_insert(read_start);
                    if read_start.saturating_sub(since) > self.shared.timing.dead_after() {
                        l.observed.insert(
                            id,
                            Observed {
                                record: BrokerRecord {
                                    broker_id: id,
                                    incarnation: 0,
                                    seq: 0,
                                    host: String::new(),
                                    port: 0,
                                    applied_controller_epoch: 0,
                                    applied_version: 0,
                                    shutting_down: false,
                                    clean_exit: true,
                                    controller_released: None,
                                    fenced: Vec::new(),
                                },
                                last_change: since,
                                still: Duration::MAX,
                            },
                        );
                    }
                    continue;
                }
                Err(e) => {
                    // One bad record must not stall the controller; its
                    // broker simply is not seen to move (nor declared dead
                    // on this evidence: `still` does not advance).
                    tracing::warn!(broker = id, error = %e, "broker record unreadable");
                    continue;
                }
            };
            // Timed after the read returned: no earlier than the write.
            let now = clock.now();
            match l.observed.get_mut(&id) {
                // An older heartbeat of the same incarnation than one we
                // already read: a stale read (a cache), not a change. It
                // neither restarts nor extends the stand-still (restarting
                // it timed a dead broker from zero again: a second lease +
                // grace before its partitions moved).
                Some(o)
                    if o.record.incarnation == r.incarnation
                        && r.seq < o.record.seq
                        && o.still != Duration::MAX => {}
                Some(o) if o.record.seq == r.seq && o.record.incarnation == r.incarnation => {
                    o.record = r;
                    o.still = read_start.saturating_sub(o.last_change);
                }
                Some(o) => {
                    o.record = r;
                    o.last_change = now;
                    o.still = Duration::ZERO;
                }
                None => {
                    l.observed.insert(
                        id,
                        Observed {
                            record: r,
                            last_change: now,
                            still: Duration::ZERO,
                        },
                    );
                }
            }
        }
        let lease = self.shared.timing.lease;
        *self.shared.silent.lock().unwrap() = l
            .observed
            .iter()
            .filter(|(id, o)| **id != self.shared.broker_id && o.still > lease)
            .map(|(id, _)| *id)
            .collect();
    }

    /// Topic stamps by exact name; the listing only discovers names. A
    /// topic is re-read when it is new, when a change notice names it, or
    /// when its slow refresh is due (see [`TOPIC_REFRESH`]). The result is
    /// `Leading::view`, and `view_gen` moves only when it changed: an idle
    /// pass reads no stamp and copies nothing.
    ///
    /// The data directory is listed at most every [`LIST_EVERY`]; a pass in
    /// between reads only the topics its notices name (every create, grow,
    /// alter and delete through any broker posts one, so it is planned in
    /// the same pass). The listing is the safety net for what comes without
    /// a notice (a directory made by the operator or removed by hand), and
    /// listing 1,000 names ten times a second was most of what an idle
    /// controller still cost.
    fn scan_topics(&mut self, list_notices: bool) -> std::io::Result<()> {
        let now = self.clock.now();
        let relist = self
            .leading
            .as_ref()
            .expect("leading")
            .listed_at
            .is_none_or(|t| now.saturating_sub(t) >= LIST_EVERY);
        let fs = self.fs.clone();
        let data_dir = self.data_dir.clone();
        let cluster_dir = self.cluster_dir().to_path_buf();
        // Notices before the listing: a notice is posted after its topic's
        // directory is complete, so the listing that follows shows every
        // topic whose notice this pass consumes (listed first, a topic made
        // in between would wait for the next listing).
        let read = if list_notices {
            kaas_volume::topic_notice::read_all(fs.as_ref(), &cluster_dir)
        } else {
            Ok(Vec::new())
        };
        let notices = match read {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "topic change notices unreadable; relying on the slow refresh");
                Vec::new()
            }
        };
        let listing = if relist {
            Some(self.fs.list(&self.data_dir)?)
        } else {
            None
        };
        let l = self.leading.as_mut().expect("leading");
        let mut out = std::mem::take(&mut l.view);
        let mut changed = false;
        let names: Vec<String> = match listing {
            Some(names) => {
                l.listed_at = Some(now);
                // A set, not the listing: `Vec::contains` per cached topic
                // made this O(topics²) string compares every pass.
                let listed: std::collections::HashSet<&str> =
                    names.iter().map(String::as_str).collect();
                l.topics.retain(|n, _| listed.contains(n.as_str()));
                let before = out.len();
                out.retain(|n, _| listed.contains(n.as_str()));
                changed = out.len() != before;
                names
            }
            None => {
                let mut named: Vec<String> = notices
                    .iter()
                    .filter_map(|(_, n)| n.as_ref().map(|n| n.topic.clone()))
                    .collect();
                named.sort_unstable();
                named.dedup();
                named
            }
        };
        // A delete request is trusted from its notice (see topic_notice);
        // every other change makes the topic be re-read now.
        let mut delete_noticed = std::collections::HashSet::new();
        for n in notices.iter().filter_map(|(_, n)| n.as_ref()) {
            if let (true, Some(id)) = (n.delete, n.topic_id) {
                delete_noticed.insert((n.topic.clone(), id));
            }
            l.topics.remove(&n.topic);
        }
        for name in names {
            if validate_name(&name).is_err() {
                continue;
            }
            if let Some((t, _)) = l.topics.get(&name).filter(|(_, due)| now < *due) {
                if out.get(&name) != Some(t) {
                    out.insert(name, t.clone());
                    changed = true;
                }
                continue;
            }
            let info = {
                // The stamp with the configs in force (an altered
                // set of this incarnation replaces the stamp's).
                match kaas_volume::topic_config::read_topic(fs.as_ref(), &data_dir.join(&name)) {
                    Ok(Some(s)) if !(1..=100_000).contains(&s.partitions) => {
                        tracing::warn!(topic = %name, partitions = s.partitions, "topic stamp has an impossible partition count; ignored");
                        None
                    }
                    Ok(Some(s)) => {
                        let dir = data_dir.join(&name);
                        let noticed = delete_noticed.contains(&(name.clone(), s.topic_id));
                        let deleting = match kaas_volume::topic_dir::delete_requested(
                            fs.as_ref(),
                            &dir,
                            s.topic_id,
                        ) {
                            Ok(d) => d || noticed,
                            // Not known: keep what we knew (a delete is
                            // never un-asked; a wrong "no" only waits).
                            Err(e) => {
                                tracing::warn!(topic = %name, error = %e, "delete request unreadable");
                                l.topics.get(&name).is_some_and(|(t, _)| t.deleting)
                            }
                        };
                        let t = TopicInfo {
                            topic_id: s.topic_id,
                            partitions: s.partitions,
                            configs: s.configs,
                            deleting,
                        };
                        l.topics
                            .insert(name.clone(), (t.clone(), refresh_due(&name, now)));
                        Some(t)
                    }
                    Ok(None) => {
                        l.topics.remove(&name);
                        None
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => None,
                    Err(e) => {
                        // Keep what we knew; one bad stamp must not
                        // stall the controller.
                        tracing::warn!(topic = %name, error = %e, "topic stamp unreadable");
                        l.topics.get(&name).map(|(t, _)| t.clone())
                    }
                }
            };
            match info {
                Some(t) if out.get(&name) != Some(&t) => {
                    out.insert(name, t);
                    changed = true;
                }
                Some(_) => {}
                None => changed |= out.remove(&name).is_some(),
            }
        }
        l.view = out;
        if changed {
            l.view_gen += 1;
        }
        // Acted on: the state they announced is in `l.topics` now. A failed
        // removal is retried next pass (acting twice only re-reads).
        for (file, _) in &notices {
            if let Err(e) = kaas_volume::topic_notice::remove(l.term.fs(), &cluster_dir, file) {
                tracing::debug!(file = %file, error = %e, "topic change notice not removed yet");
                break;
            }
        }
        Ok(())
    }

    /// Fold every complete version after `prev` into it (ours that landed
    /// despite an error, or a deposed controller's that won a number before
    /// our first version: we plan from it, never past it). Returns whether
    /// to plan now, and the torn version to complete by repair, if any.
    fn catch_up(&mut self) -> std::io::Result<CatchUp> {
        let cluster_dir = self.cluster_dir().to_path_buf();
        let dead_after = self.shared.timing.dead_after();
        let now = self.clock.now();
        let fs = self.fs.clone();
        let l = self.leading.as_mut().expect("leading");
        let mut folded = 0;
        loop {
            let n = l.prev.version + 1;
            // The listing that defeats a cached "no such file" at most every
            // LIST_EVERY (see `Leading::history_listed_at`); the exact name
            // every pass.
            let relist = l
                .history_listed_at
                .is_none_or(|t| now.saturating_sub(t) >= SAFETY_LIST_EVERY);
            // Probed by exact name only when there is a reason: a version
            // of ours to complete, a torn one to time, one just folded (the
            // next may follow), or our publish met EEXIST. Otherwise the
            // only versions we have not written are a deposed controller's
            // (won before our first): found by the listing, or by our next
            // publish meeting EEXIST — never planned past either way.
            let exact = l.pending.is_some() || l.torn_since.is_some() || l.probe_next || folded > 0;
            let probed = if relist {
                l.history_listed_at = Some(now);
                history::probe_fresh(fs.as_ref(), &cluster_dir, n)?
            } else if exact {
                history::probe(fs.as_ref(), &cluster_dir, n)?
            } else {
                Probe::Absent
            };
            l.probe_next = false;
            match probed {
                Probe::Found(d) => {
                    if d.controller_epoch > l.epoch {
                        return Ok(CatchUp::Deposed);
                    }
                    if d.controller_epoch < l.epoch {
                        tracing::warn!(
                            version = n,
                            controller_epoch = d.controller_epoch,
                            "a deposed controller's version landed; planning from it"
                        );
                    }
                    d.apply_to(&mut l.prev);
                    l.pending = None;
                    l.torn_since = None;
                    folded += 1;
                    if folded >= FOLD_LIMIT {
                        return Ok(CatchUp::Wait);
                    }
                }
                Probe::Torn => {
                    if let Some((_, bytes)) = l.pending.as_ref().filter(|(v, _)| *v == n) {
                        // Our own create that failed before its write
                        // completed: complete it with the same bytes.
                        history::repair(l.term.fs(), &cluster_dir, bytes, n)?;
                        continue;
                    }
                    // Someone else's create: a controller of an earlier
                    // epoch (a later one would have deposed us), whose lease
                    // had lapsed before we won. Give a write in flight lease
                    // + grace more on our clock, then complete it ourselves.
                    let since = match l.torn_since {
                        Some((v, s)) if v == n => s,
                        _ => {
                            l.torn_since = Some((n, now));
                            now
                        }
                    };
                    if now.saturating_sub(since) >= dead_after {
                        return Ok(CatchUp::Plan { repair: Some(n) });
                    }
                    return Ok(CatchUp::Wait);
                }
                Probe::Absent => return Ok(CatchUp::Plan { repair: None }),
            }
        }
    }

    fn lead(&mut self) -> std::io::Result<bool> {
        // The bell before the listings: a ring follows its change, so a
        // listing after a read that saw the ring can show the change.
        let list = self.listing_due();
        let brokers = self.observe(list)?;
        self.scan_topics(list)?;
        let repair_at = match self.catch_up()? {
            CatchUp::Deposed => {
                self.resign("a newer controller published a version");
                return Ok(false);
            }
            CatchUp::Wait => return Ok(false),
            CatchUp::Plan { repair } => repair,
        };
        let data_dir = self.data_dir.clone();
        let fs = self.fs.clone();
        let cluster_dir = self.cluster_dir().to_path_buf();
        let l = self.leading.as_mut().expect("leading");
        let now = self.clock.now();
        if l.shards == 0
            && l.shards_probed_at
                .is_none_or(|t| now.saturating_sub(t) >= LIST_EVERY)
        {
            // Recorded once at cluster creation by the first broker (looked
            // for once a second until then, not every pass).
            l.shards_probed_at = Some(now);
            l.shards =
                crate::group::shard::read_count(fs.as_ref(), &cluster_dir)?.map_or(0, |c| c.get());
        }
        // Never fewer shards than already granted (the count is immutable).
        let shards = l.shards.max(l.prev.coordinators.len() as u32);
        // Same inputs as a plan that changed nothing: it would change
        // nothing again (an idle controller of 10,000 partitions spent most
        // of its CPU re-planning every one of them each poll). A broker's
        // death, a new or changed topic, or a folded version changes the
        // inputs, so it is still planned in the same pass.
        let policy = rebalance_policy(l, &brokers, self.shared.timing.rebalance, now);
        let inputs = PlanInputs::of(l, shards, &brokers, policy);
        if repair_at.is_none() && l.unchanged_plan.as_ref() == Some(&inputs) {
            self.housekeeping();
            self.remove_vacated();
            return Ok(false);
        }
        let mut topics = l.view.clone();
        // A topic whose directory vanished without our delete (removed by
        // hand) still has leaders with files open: it leaves the assignment
        // only the way a deleted one does, every partition let go two-phase
        // first. If it comes back, it is granted again by the usual rules.
        // Missing from a listing is not gone: a listing is not fresh (an
        // NFS client's cached listing can predate a topic another host
        // made — a new controller's first listing, right after a failover,
        // vacated a live topic's every partition on weakfs), so the topic
        // is looked for by exact name first — every pass until a listing
        // shows it again (a plan kept by a probe is not remembered as
        // unchanged, or a topic removed by hand meanwhile would never be
        // let go).
        let mut probed = false;
        for (name, t) in &self.leading.as_ref().expect("leading").prev.topics {
            if !topics.contains_key(name) && !t.vacated() {
                if let Some(still) = still_there(fs.as_ref(), &data_dir.join(name), t) {
                    topics.insert(name.clone(), still);
                    probed = true;
                    continue;
                }
                if !t.deleting {
                    tracing::warn!(topic = %name, "topic directory gone without a delete; vacating its partitions");
                }
                topics.insert(
                    name.clone(),
                    TopicInfo {
                        topic_id: t.topic_id,
                        partitions: t.partitions.len() as i32,
                        configs: t.configs.clone(),
                        deleting: true,
                    },
                );
            }
        }
        let me = self.shared.broker_id;
        let now = self.clock.now();
        let l = self.leading.as_mut().expect("leading");
        let base = &l.prev;
        let list_failed = std::cell::Cell::new(false);
        let disk_epoch = |t: &str, p: i32| -> i32 {
            let dir = if t == super::records::COORDINATOR_SHARDS {
                crate::group::names::shard_dir(&cluster_dir, crate::group::shard::ShardId(p as u32))
            } else {
                kaas_volume::layout::partition_dir(&data_dir, t, p)
            };
            let names = match fs.list(&dir) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(_) => {
                    list_failed.set(true);
                    Vec::new()
                }
            };
            names
                .iter()
                .filter_map(|n| {
                    parse_manifest_name(n)
                        .or_else(|| parse_segment_name(n).map(|(_, e, _)| e))
                        .or_else(|| parse_claim_name(n))
                        .or_else(|| crate::group::names::parse_shard_log(n).map(|(_, e)| e))
                })
                .max()
                .unwrap_or(0)
        };
        let (planned, moves) = plan_moves(
            base, l.epoch, me, &brokers, &topics, shards, policy, disk_epoch,
        );
        if list_failed.get() {
            // A new partition's starting epoch must be above what is on disk;
            // without a listing we cannot know it. Try again next poll.
            return Err(std::io::Error::other("partition directory unreadable"));
        }
        let was = l.rebalancing;
        l.rebalancing = policy.max_moves > 0 && moves.wanted > 0 && (was || moves.vacated > 0);
        if l.rebalancing && !was {
            tracing::info!(
                out_of_place = moves.wanted,
                moving = moves.vacated,
                stable_for_ms = now.saturating_sub(l.eligible.1).as_millis() as u64,
                "rebalancing: moving partitions and coordinator shards to brokers below their share, a bounded number at a time"
            );
        } else if was && !l.rebalancing && moves.wanted == 0 {
            tracing::info!("rebalanced: every broker leads its share");
        }
        let next = match planned {
            Some(n) => n,
            // A torn version to complete and nothing to change: complete
            // it with a version that changes nothing.
            None if repair_at.is_some() => Assignment {
                controller_epoch: l.epoch,
                controller_id: me,
                version: base.version + 1,
                ..base.clone()
            },
            None => {
                if !probed {
                    l.unchanged_plan = Some(inputs);
                }
                self.housekeeping();
                self.remove_vacated();
                return Ok(false);
            }
        };
        // The controller's lease is its broker lease: check it right before
        // publishing the decision.
        if !self.shared.lease.valid_for(l.incarnation) {
            self.resign("lease lapsed before writing the assignment");
            return Ok(false);
        }
        let delta = AssignmentDelta::between(&l.prev, &next);
        let bytes = history::encode_version(&delta);
        // Through the term: the guard re-checks the lease before every
        // syscall of the write (create, write, fsync, rename, dir fsync).
        let published = match repair_at {
            Some(n) if n == next.version => {
                // Last look: completed meanwhile after all? Then fold it
                // next pass instead.
                if history::probe(fs.as_ref(), &cluster_dir, n)? != Probe::Torn {
                    return Ok(false);
                }
                tracing::warn!(version = n, "completing a torn assignment version");
                history::repair(l.term.fs(), &cluster_dir, &bytes, n).map(|_| Published::Won)
            }
            _ => history::publish(l.term.fs(), &cluster_dir, &bytes, next.version),
        };
        match published {
            Ok(Published::Won) => {}
            Ok(Published::Taken) => {
                // Someone else's version: fold it next pass, plan again.
                l.pending = None;
                l.probe_next = true;
                return Ok(false);
            }
            Err(e) => {
                l.pending = Some((next.version, bytes));
                return Err(e);
            }
        }
        tracing::info!(
            controller_epoch = next.controller_epoch,
            version = next.version,
            brokers = next.brokers.len(),
            bytes = bytes.len(),
            "assignment version published"
        );
        log_membership(&l.prev, &next, &brokers);
        l.pending = None;
        l.torn_since = None;
        l.delta_bytes += bytes.len();
        l.last_publish = now;
        l.prev = next;
        self.housekeeping();
        self.remove_vacated();
        Ok(true)
    }

    /// Write the checkpoint when it is due, and prune versions well below
    /// an old enough one (best effort: both are re-driven every pass).
    fn housekeeping(&mut self) {
        let cluster_dir = self.cluster_dir().to_path_buf();
        let now = self.clock.now();
        let l = self.leading.as_mut().expect("leading");
        if l.head < l.prev.version {
            // Every version up to `prev` is durable (published, or read).
            match history::write_head(l.term.fs(), &cluster_dir, l.prev.version) {
                Ok(()) => l.head = l.prev.version,
                Err(e) => tracing::debug!(error = %e, "assignment head not written; will retry"),
            }
        }
        let behind = l.prev.version > l.checkpoint;
        let due = behind
            && (l.delta_bytes >= l.checkpoint_len.max(CHECKPOINT_MIN_BYTES)
                || now.saturating_sub(l.last_publish) >= CHECKPOINT_QUIET);
        if due {
            // `prev` is durable in the history: the checkpoint is never
            // newer than it.
            let bytes = serde_json::to_vec(&l.prev).expect("serializes");
            match history::write_checkpoint(l.term.fs(), &cluster_dir, &bytes) {
                Ok(()) => {
                    l.checkpoint = l.prev.version;
                    l.checkpoint_len = bytes.len();
                    l.delta_bytes = 0;
                    l.checkpoints.push_back((l.prev.version, now));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "assignment checkpoint not written; will retry")
                }
            }
        }
        let mut floor = None;
        while let Some(&(v, at)) = l.checkpoints.front() {
            if now.saturating_sub(at) < PRUNE_AFTER {
                break;
            }
            floor = Some(v);
            l.checkpoints.pop_front();
        }
        if let Some(v) = floor {
            let below = v.saturating_sub(PRUNE_KEEP);
            if below > l.pruned_below {
                match history::prune(l.term.fs(), &cluster_dir, below) {
                    Ok(_) => l.pruned_below = below,
                    Err(e) => {
                        // Retried with the next checkpoint.
                        l.checkpoints.push_front((v, Duration::ZERO));
                        tracing::debug!(error = %e, "old assignment versions not pruned yet");
                    }
                }
            }
        }
    }

    /// The last step of a delete: rename aside (and start removing) every
    /// topic the published assignment shows deleting with no partition
    /// held or being let go of — every leader of it has stopped, fsynced
    /// and closed its files, or is fenced. Through the term, so a deposed
    /// controller removes nothing; a failure is retried on the next pass.
    fn remove_vacated(&mut self) {
        let data_dir = self.data_dir.clone();
        let l = self.leading.as_mut().expect("leading");
        let vacated: Vec<(String, uuid::Uuid)> = l
            .prev
            .topics
            .iter()
            .filter(|(_, t)| t.vacated())
            .map(|(n, t)| (n.clone(), t.topic_id))
            .collect();
        for (name, id) in vacated {
            match kaas_volume::topic_dir::delete_incarnation(l.term.fs(), &data_dir, &name, id) {
                Ok(removed) => {
                    if removed {
                        tracing::info!(topic = %name, topic_id = %id, "topic deleted");
                    }
                    // Seen afresh next pass: gone, or a new incarnation.
                    l.topics.remove(&name);
                }
                Err(e) => {
                    tracing::warn!(topic = %name, error = %e, "topic directory not yet renamed aside; will retry");
                }
            }
        }
    }
}

/// What [`ControllerState::catch_up`] found.
enum CatchUp {
    /// Plan from the folded base; `repair`: the torn version to complete.
    Plan { repair: Option<u64> },
    /// A torn version may still be completed by its creator: wait.
    Wait,
    /// A newer controller published: step down.
    Deposed,
}

/// Topic `t` of the published assignment, found by exact name in `dir`
/// although a listing missed it: its stamp names the same incarnation
/// (then `Some`, with a delete request seen the same way), or it could not
/// be read for another reason than absence (then kept as known: one bad
/// read must not vacate a topic). `None`: gone, or another incarnation.
fn still_there(
    fs: &dyn kaas_volume::fs::Fs,
    dir: &std::path::Path,
    t: &super::records::TopicAssignment,
) -> Option<TopicInfo> {
    let kept = |deleting: bool| TopicInfo {
        topic_id: t.topic_id,
        partitions: t.partitions.len() as i32,
        configs: t.configs.clone(),
        deleting,
    };
    match kaas_volume::topic_config::read_topic(fs, dir) {
        Ok(Some(s)) if s.topic_id == t.topic_id => {
            let asked =
                kaas_volume::topic_dir::delete_requested(fs, dir, t.topic_id).unwrap_or(false);
            Some(kept(t.deleting || asked))
        }
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => None,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "topic stamp unreadable; keeping the topic as known");
            Some(kept(t.deleting))
        }
    }
}

/// See module docs.
pub struct ControllerActor {
    state: ControllerState,
    watcher: Option<Mailbox<AssignmentWatcher>>,
    stats: Arc<ActorStats>,
}

impl ControllerActor {
    /// Start on `arbiter`.
    pub fn start(
        fs: SharedFs,
        shared: Arc<Shared>,
        data_dir: PathBuf,
        watcher: Option<Mailbox<AssignmentWatcher>>,
        arbiter: &ArbiterHandle,
    ) -> Mailbox<Self> {
        let stats =
            ActorStats::register("controller", shared.broker_id.to_string(), "(not elected)");
        let mine = stats.clone();
        let addr = ControllerActor::start_in_arbiter(arbiter, move |_| ControllerActor {
            state: ControllerState::new(fs, shared, data_dir),
            watcher,
            stats: mine,
        });
        Mailbox::new(addr, stats)
    }

    fn tick(&mut self) {
        let wrote = self.state.tick();
        // While elected it owns assignment.json under its controller epoch.
        match self.state.epoch() {
            Some(e) => {
                self.stats.set_epoch(e as i64);
                self.stats
                    .set_owns(self.state.assignment_path().display().to_string());
            }
            None => {
                self.stats.set_epoch(-1);
                self.stats.set_owns("(not elected)");
            }
        }
        if wrote {
            if let Some(w) = &self.watcher {
                w.do_send(PollNow);
            }
        }
    }
}

impl Actor for ControllerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.tick();
        ctx.run_interval(self.state.shared.timing.poll, |a, _| a.tick());
    }
}

/// Whether this broker is the controller, and under which epoch.
#[derive(Message)]
#[rtype(result = "Option<i32>")]
pub struct IsController;

impl MessageName for IsController {
    const NAME: &'static str = "is_controller";
}

impl Handler<IsController> for ControllerActor {
    type Result = Option<i32>;
    fn handle(&mut self, _: IsController, _: &mut Context<Self>) -> Option<i32> {
        self.state.epoch()
    }
}

/// What the on-call engineer asks first after a failure, one line each:
/// a broker that stopped being advertised (its heartbeat stood still for a
/// lease: WARN), a broker whose partitions and coordinator shards this
/// version moved away because it is gone (lease expired: WARN; after an
/// announced shutdown: INFO), and a broker advertised again or anew.
fn log_membership(
    prev: &Assignment,
    next: &Assignment,
    views: &std::collections::BTreeMap<i32, BrokerView>,
) {
    use std::collections::BTreeMap;
    let ids = |a: &Assignment| -> std::collections::BTreeSet<i32> {
        a.brokers.iter().map(|b| b.id).collect()
    };
    let (before, after) = (ids(prev), ids(next));
    let announced = |id: i32| {
        views
            .get(&id)
            .is_some_and(|v| v.record.shutting_down || v.record.clean_exit)
    };
    let alive = |id: i32| views.get(&id).is_some_and(|v| v.alive);
    for id in before.difference(&after) {
        if alive(*id) && !announced(*id) {
            tracing::warn!(broker = id, "broker not advertised: its heartbeat stood still for a lease; what it leads moves if it stays still past the grace");
        }
    }
    // (partitions, shards) taken from each broker by this version.
    let mut moved: BTreeMap<i32, (usize, usize)> = BTreeMap::new();
    let pairs = |a: &Assignment, b: &Assignment| {
        a.topics
            .iter()
            // The same topic, not a recreated one of the same name.
            .filter_map(|(name, t)| b.topics.get(name).map(|u| (t, u)))
            .filter(|(t, u)| t.topic_id == u.topic_id)
            .flat_map(|(t, u)| t.partitions.iter().zip(u.partitions.iter()))
            .map(|(x, y)| (x.leader, y.leader, false))
            .chain(
                a.coordinators
                    .iter()
                    .zip(b.coordinators.iter())
                    .map(|(x, y)| (x.leader, y.leader, true)),
            )
            .collect::<Vec<_>>()
    };
    for (from, to, shard) in pairs(prev, next) {
        if from >= 0 && from != to && (!alive(from) || announced(from)) {
            let e = moved.entry(from).or_default();
            if shard {
                e.1 += 1;
            } else {
                e.0 += 1;
            }
        }
    }
    for (id, (partitions, shards)) in moved {
        if announced(id) {
            tracing::info!(
                broker = id,
                partitions,
                shards,
                "broker shut down: its partitions and coordinator shards moved"
            );
        } else {
            tracing::warn!(
                broker = id,
                partitions,
                shards,
                "broker lost (lease expired): its partitions and coordinator shards moved"
            );
        }
    }
    for id in after.difference(&before) {
        tracing::info!(broker = id, "broker advertised");
    }
}

/// During a controlled shutdown of the controller's own broker: whether
/// vacated partitions are still waiting for a grant that can happen (some
/// other broker is eligible). False once they are granted, or if nobody
/// could take them (every other broker is gone or leaving too).
#[derive(Message)]
#[rtype(result = "bool")]
pub struct HandoffPending;

impl MessageName for HandoffPending {
    const NAME: &'static str = "handoff_pending";
}

impl Handler<HandoffPending> for ControllerActor {
    type Result = bool;
    fn handle(&mut self, _: HandoffPending, _: &mut Context<Self>) -> bool {
        self.state.handoff_pending()
    }
}

/// Step down for a controlled shutdown and never campaign again; replies
/// with the epoch given up. Processed between passes, so no assignment
/// write is in flight once it returns.
#[derive(Message)]
#[rtype(result = "Option<i32>")]
pub struct Resign;

impl MessageName for Resign {
    const NAME: &'static str = "resign";
}

impl Handler<Resign> for ControllerActor {
    type Result = Option<i32>;
    fn handle(&mut self, _: Resign, _: &mut Context<Self>) -> Option<i32> {
        self.state.resign_for_shutdown()
    }
}

/// Run a pass now (a topic was created here).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReconcileNow;

impl MessageName for ReconcileNow {
    const NAME: &'static str = "reconcile_now";
}

impl Handler<ReconcileNow> for ControllerActor {
    type Result = ();
    fn handle(&mut self, _: ReconcileNow, _: &mut Context<Self>) {
        self.tick();
    }
}

crate::instrumented!(ControllerActor: IsController, HandoffPending, Resign, ReconcileNow);
