//! Open segment files, bounded: an idle partition holds no descriptor.
//!
//! Every segment file a partition reads or appends to sits in a
//! [`FileSlot`]: opened on demand, closed by the broker-wide [`OpenFiles`]
//! when it has not been used for the idle interval, or sooner when more
//! than the cap are open (least recently used first). Why a slot hands out
//! an `Arc` of the file rather than the file: a reader (or an fsync, or a
//! sendfile) that took the handle keeps its descriptor while a close races
//! it; the descriptor goes when the last holder drops it.
//!
//! Durability: a write slot is *dirty* while bytes written through it are
//! not yet covered by a completed fsync ([`FileSlot::set_dirty`]); a dirty
//! slot is never closed, so closing never loses or hides a write-back error.
//! Reopening needs no scan: the log keeps its positions in memory and only
//! checks that the file is still at least as long as what it made durable.
//!
//! Substrate contract: closing and reopening are no volume change (no
//! create, no rename, no unlink; `open_write` never creates), so the four
//! questions reduce to the fourth: a name is reopened only by its single
//! writer, the path carries the leader epoch, and a file shorter than the
//! durable length is refused (the leader restarts and recovers).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Default cap when none is configured (tests, tools).
pub const DEFAULT_CAP: usize = 4096;
/// Default idle interval after which an unused file is closed.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(30);

/// The broker-wide registry of open segment files (see module docs).
pub struct OpenFiles {
    cap: AtomicUsize,
    idle_ms: AtomicU64,
    start: Instant,
    open: AtomicUsize,
    slots: Mutex<Vec<Weak<FileSlot>>>,
    sweeper: AtomicBool,
    /// Opens refused for lack of descriptors (for the log's count).
    refused: AtomicU64,
}

static GLOBAL: OnceLock<Arc<OpenFiles>> = OnceLock::new();

impl OpenFiles {
    /// A registry with its own cap and idle interval (no sweeper thread:
    /// call [`Self::sweep`]).
    pub fn new(cap: usize, idle: Duration) -> Arc<Self> {
        Arc::new(Self {
            cap: AtomicUsize::new(cap.max(1)),
            idle_ms: AtomicU64::new(idle.as_millis() as u64),
            start: Instant::now(),
            open: AtomicUsize::new(0),
            slots: Mutex::new(Vec::new()),
            sweeper: AtomicBool::new(false),
            refused: AtomicU64::new(0),
        })
    }

    /// The broker's registry (defaults until [`Self::configure`]).
    pub fn global() -> Arc<Self> {
        let g = GLOBAL
            .get_or_init(|| Self::new(DEFAULT_CAP, DEFAULT_IDLE))
            .clone();
        g.start_sweeper();
        g
    }

    /// Set the cap and idle interval of the broker's registry (at start).
    pub fn configure(cap: usize, idle: Duration) {
        let g = Self::global();
        g.cap.store(cap.max(1), Ordering::Relaxed);
        g.idle_ms.store(idle.as_millis() as u64, Ordering::Relaxed);
    }

    /// One shared thread closes idle files (not one timer per partition).
    fn start_sweeper(self: &Arc<Self>) {
        if self.sweeper.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("kaas-idle-files".into())
            .spawn(move || loop {
                let Some(me) = weak.upgrade() else { return };
                let period = (me.idle_ms.load(Ordering::Relaxed) / 2).clamp(100, 5_000);
                me.sweep();
                drop(me);
                std::thread::sleep(Duration::from_millis(period));
            });
        if let Err(e) = spawned {
            self.sweeper.store(false, Ordering::Release);
            tracing::warn!(error = %e, "could not start the idle-file sweeper; files close only at the cap");
        }
    }

    /// Files open now.
    pub fn open_count(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// The cap in force.
    pub fn cap(&self) -> usize {
        self.cap.load(Ordering::Relaxed)
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }

    /// Close every clean file unused for the idle interval; forget dropped
    /// slots. Returns how many were closed.
    pub fn sweep(&self) -> usize {
        let idle = self.idle_ms.load(Ordering::Relaxed);
        let now = self.now();
        let live: Vec<Arc<FileSlot>> = {
            let mut slots = self.slots.lock().unwrap();
            slots.retain(|w| w.strong_count() > 0);
            slots.iter().filter_map(|w| w.upgrade()).collect()
        };
        live.iter()
            .filter(|s| now.saturating_sub(s.last_used.load(Ordering::Relaxed)) >= idle)
            .filter(|s| s.try_close())
            .count()
    }

    /// Make room for one more open: over the cap, close the least recently
    /// used clean files down to 90 % of it (in one pass, so the cost of the
    /// sort is spread over a tenth of the cap's opens). A cap that only
    /// dirty files fill is exceeded rather than failing a write.
    fn admit(&self) {
        let cap = self.cap();
        if self.open_count() < cap {
            return;
        }
        self.shrink_to(cap - cap / 10);
    }

    fn shrink_to(&self, target: usize) {
        let mut live: Vec<(u64, Arc<FileSlot>)> = {
            let slots = self.slots.lock().unwrap();
            slots
                .iter()
                .filter_map(|w| w.upgrade())
                .map(|s| (s.last_used.load(Ordering::Relaxed), s))
                .collect()
        };
        live.sort_by_key(|(t, _)| *t);
        for (_, s) in live {
            if self.open_count() <= target {
                break;
            }
            s.try_close();
        }
    }

    /// After EMFILE/ENFILE: close half of what is open, then retry once.
    fn relieve(&self) {
        self.shrink_to(self.open_count() / 2);
    }
}

/// An open handle of either kind.
#[derive(Clone)]
pub enum Handle {
    /// A read handle.
    Read(Arc<dyn kaas_volume::fs::ReadFile>),
    /// A read-write handle (the active segment's writer).
    Write(Arc<dyn kaas_volume::fs::WriteFile>),
}

/// One segment file's descriptor slot (see module docs).
pub struct FileSlot {
    files: Arc<OpenFiles>,
    state: Mutex<State>,
    last_used: AtomicU64,
    registered: AtomicBool,
}

struct State {
    file: Option<Handle>,
    dirty: bool,
}

/// Whether `e` is EMFILE/ENFILE or a refused permit of the data plane's
/// descriptor budget (out of descriptors: retriable, nothing opened).
pub fn too_many_files(e: &std::io::Error) -> bool {
    kaas_volume::fs::budget::out_of_descriptors(e)
}

impl FileSlot {
    /// An empty slot in `files`.
    pub fn new(files: Arc<OpenFiles>) -> Arc<Self> {
        Arc::new(Self {
            files,
            state: Mutex::new(State {
                file: None,
                dirty: false,
            }),
            last_used: AtomicU64::new(0),
            registered: AtomicBool::new(false),
        })
    }

    /// The open handle, opening it with `open` if closed. The caller keeps
    /// the descriptor for as long as it holds the returned handle.
    pub fn get(
        self: &Arc<Self>,
        open: impl FnOnce() -> std::io::Result<Handle>,
    ) -> std::io::Result<Handle> {
        self.last_used.store(self.files.now(), Ordering::Relaxed);
        if let Some(h) = self.state.lock().unwrap().file.clone() {
            return Ok(h);
        }
        self.files.admit();
        let mut st = self.state.lock().unwrap();
        if let Some(h) = st.file.clone() {
            return Ok(h);
        }
        // Dirty files (awaiting their fsync) cannot close: past twice the
        // cap the open is refused for now (the caller answers a retriable
        // error) rather than taking the descriptors kept for the lease,
        // the cluster directory and the connections.
        if self.files.open_count() >= self.files.cap().saturating_mul(2) {
            return Err(kaas_volume::fs::budget::exhausted());
        }
        let h = match open() {
            Ok(h) => h,
            Err(e) if too_many_files(&e) => {
                drop(st);
                let refused = self.files.refused.fetch_add(1, Ordering::Relaxed) + 1;
                if refused.is_power_of_two() {
                    tracing::warn!(
                        open = self.files.open_count(),
                        cap = self.files.cap(),
                        refused,
                        error = %e,
                        "out of file descriptors: closing idle segment files (logged at the 1st, 2nd, 4th... refusal)"
                    );
                }
                self.files.relieve();
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        self.install(&mut st, h.clone());
        Ok(h)
    }

    /// Put a handle just opened by the caller into the (closed) slot.
    pub fn put(self: &Arc<Self>, h: Handle) {
        self.last_used.store(self.files.now(), Ordering::Relaxed);
        self.files.admit();
        let mut st = self.state.lock().unwrap();
        if st.file.is_none() {
            self.install(&mut st, h);
        }
    }

    fn install(self: &Arc<Self>, st: &mut State, h: Handle) {
        st.file = Some(h);
        self.files.open.fetch_add(1, Ordering::AcqRel);
        if !self.registered.swap(true, Ordering::AcqRel) {
            self.files.slots.lock().unwrap().push(Arc::downgrade(self));
        }
    }

    /// Whether the slot holds an open handle.
    pub fn is_open(&self) -> bool {
        self.state.lock().unwrap().file.is_some()
    }

    /// Mark the slot dirty (written past the last completed fsync: never
    /// closed) or clean.
    pub fn set_dirty(&self, dirty: bool) {
        self.state.lock().unwrap().dirty = dirty;
    }

    /// Close the handle unless dirty or busy; true if one was closed.
    pub fn try_close(&self) -> bool {
        let Ok(mut st) = self.state.try_lock() else {
            return false;
        };
        if st.dirty || st.file.is_none() {
            return false;
        }
        st.file = None;
        self.files.open.fetch_sub(1, Ordering::AcqRel);
        true
    }
}

impl Drop for FileSlot {
    fn drop(&mut self) {
        if let Ok(st) = self.state.get_mut() {
            if st.file.is_some() {
                self.files.open.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::disallowed_methods)] // fixtures written with std::fs
    use super::*;
    use kaas_volume::fs::{Fs, RealFs};

    fn read(fs: &RealFs, p: &std::path::Path) -> std::io::Result<Handle> {
        fs.open_read(p).map(Handle::Read)
    }

    #[test]
    fn the_cap_closes_the_least_recently_used_clean_files() {
        let dir = tempfile::tempdir().unwrap();
        let fs = RealFs;
        let files = OpenFiles::new(10, Duration::from_secs(3600));
        let mut slots = Vec::new();
        for i in 0..30 {
            let p = dir.path().join(format!("{i}"));
            std::fs::write(&p, b"x").unwrap();
            let s = FileSlot::new(files.clone());
            s.get(|| read(&fs, &p)).unwrap();
            if i == 0 {
                s.set_dirty(true);
            }
            slots.push(s);
        }
        assert!(files.open_count() <= 11, "{}", files.open_count());
        // The dirty one was never closed; the newest is open.
        assert!(slots[0].is_open());
        assert!(slots[29].is_open());
        assert!(!slots[1].is_open());
    }

    #[test]
    fn a_holder_keeps_its_descriptor_across_a_close_and_idle_files_close() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seg");
        std::fs::write(&p, b"hello").unwrap();
        let fs = RealFs;
        let files = OpenFiles::new(10, Duration::ZERO);
        let s = FileSlot::new(files.clone());
        let Handle::Read(h) = s.get(|| read(&fs, &p)).unwrap() else {
            panic!("read handle")
        };
        assert_eq!(files.sweep(), 1);
        assert!(!s.is_open());
        assert_eq!(files.open_count(), 0);
        // The reader that took the handle still reads through it.
        let mut buf = [0u8; 5];
        h.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"hello");
        // Reopened on the next use.
        s.get(|| read(&fs, &p)).unwrap();
        assert_eq!(files.open_count(), 1);
        s.set_dirty(true);
        assert_eq!(files.sweep(), 0, "a dirty file is never closed");
        drop(s);
        assert_eq!(files.open_count(), 0);
    }
}
