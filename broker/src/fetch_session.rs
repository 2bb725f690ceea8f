//! KIP-227 incremental fetch sessions: a bounded cache of what each
//! consumer fetches, so that a consumer of many partitions sends only the
//! partitions whose fetch position changed and gets back only the
//! partitions with something new.
//!
//! The protocol (Fetch v7+): `session_epoch = -1` is a sessionless full
//! fetch (closing `session_id` if one is named); `0` is a full fetch that
//! opens a session (its id comes back in the response, or 0 when the cache
//! has no room: the client then stays sessionless); `> 0` is an incremental
//! fetch of session `session_id` at exactly the next epoch: the request's
//! partitions are added or updated, `forgotten_topics_data` removed, and
//! the response carries only the partitions with records, an error, or a
//! high watermark / last stable / log start offset that changed since the
//! session last answered them. An unknown session is
//! FETCH_SESSION_ID_NOT_FOUND (70), a wrong epoch INVALID_FETCH_SESSION_EPOCH
//! (71); the client then starts over with a full fetch.
//!
//! Bounds: at most [`MAX_SESSIONS`] sessions and [`MAX_CACHED_PARTITIONS`]
//! partitions over all of them (about 100 bytes each); a full fetch that
//! does not fit evicts the least recently used sessions, and sessions idle
//! for [`IDLE_EXPIRY`] are dropped. Pure logic: no I/O, no clock of its own.

use kaas_protocol::kafka_protocol::ResponseError;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Most sessions one broker keeps (Kafka's
/// `max.incremental.fetch.session.cache.slots` default).
pub const MAX_SESSIONS: usize = 1000;
/// Most partitions cached over all sessions.
pub const MAX_CACHED_PARTITIONS: usize = 500_000;
/// A session unused this long is dropped.
pub const IDLE_EXPIRY: Duration = Duration::from_secs(120);

/// A partition as a fetch names it: by topic name (v7–v12) or id (v13+).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// Topic name ("" when named by id).
    pub topic: String,
    /// Topic id (nil when named by name).
    pub topic_id: Uuid,
    /// Partition.
    pub partition: i32,
}

/// What the client wants of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    /// Next offset to read.
    pub fetch_offset: i64,
    /// Per-partition byte limit.
    pub max_bytes: i32,
    /// KIP-320 epoch the client believes current (-1: unknown).
    pub current_leader_epoch: i32,
}

/// What a partition's last answer in the session said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answered {
    /// High watermark.
    pub high_watermark: i64,
    /// Last stable offset.
    pub last_stable_offset: i64,
    /// Log start offset.
    pub log_start_offset: i64,
}

/// Never answered yet: the first answer always carries the partition.
const UNANSWERED: Answered = Answered {
    high_watermark: i64::MIN,
    last_stable_offset: i64::MIN,
    log_start_offset: i64::MIN,
};

struct Session {
    next_epoch: i32,
    parts: BTreeMap<Key, (Want, Answered)>,
    used: Instant,
}

/// How a fetch is to be served.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Full fetch and full answer, `session_id` in the answer (0: none).
    Full {
        /// The session opened (0: sessionless).
        session_id: i32,
        /// The partitions, as the request named them.
        parts: Vec<(Key, Want)>,
    },
    /// Incremental: every partition of the session is read; the answer
    /// carries those [`FetchSessions::finish`] selects.
    Incremental {
        /// The session.
        session_id: i32,
        /// Every partition of the session.
        parts: Vec<(Key, Want)>,
    },
}

/// See module docs.
#[derive(Default)]
pub struct FetchSessions {
    sessions: HashMap<i32, Session>,
    cached: usize,
}

fn next_epoch(e: i32) -> i32 {
    if e == i32::MAX {
        1
    } else {
        e + 1
    }
}

impl FetchSessions {
    /// Sessions open.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Partitions cached over all sessions.
    pub fn cached_partitions(&self) -> usize {
        self.cached
    }

    fn remove(&mut self, id: i32) {
        if let Some(s) = self.sessions.remove(&id) {
            self.cached -= s.parts.len();
        }
    }

    fn expire(&mut self, now: Instant) {
        let idle: Vec<i32> = self
            .sessions
            .iter()
            .filter(|(_, s)| now.saturating_duration_since(s.used) >= IDLE_EXPIRY)
            .map(|(id, _)| *id)
            .collect();
        for id in idle {
            self.remove(id);
        }
    }

    /// Room for a session of `n` partitions, evicting the least recently
    /// used ones if need be; false if it can never fit.
    fn make_room(&mut self, n: usize) -> bool {
        if n > MAX_CACHED_PARTITIONS {
            return false;
        }
        while self.sessions.len() >= MAX_SESSIONS || self.cached + n > MAX_CACHED_PARTITIONS {
            let Some(lru) = self
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.used)
                .map(|(id, _)| *id)
            else {
                return false;
            };
            self.remove(lru);
        }
        true
    }

    /// Decide how to serve a fetch (see module docs). `parts` are the
    /// request's partitions, `forgotten` its `forgotten_topics_data`.
    pub fn begin(
        &mut self,
        session_id: i32,
        epoch: i32,
        parts: Vec<(Key, Want)>,
        forgotten: &[Key],
        now: Instant,
        new_id: impl FnOnce() -> i32,
    ) -> Result<Plan, ResponseError> {
        self.expire(now);
        if epoch <= 0 {
            if session_id != 0 {
                self.remove(session_id);
            }
            if epoch < 0 || !self.make_room(parts.len()) {
                return Ok(Plan::Full {
                    session_id: 0,
                    parts,
                });
            }
            let mut id = new_id();
            while id == 0 || self.sessions.contains_key(&id) {
                id = id.wrapping_add(1);
            }
            let cached: BTreeMap<Key, (Want, Answered)> = parts
                .iter()
                .map(|(k, w)| (k.clone(), (*w, UNANSWERED)))
                .collect();
            self.cached += cached.len();
            self.sessions.insert(
                id,
                Session {
                    next_epoch: 1,
                    parts: cached,
                    used: now,
                },
            );
            return Ok(Plan::Full {
                session_id: id,
                parts,
            });
        }
        let Some(s) = self.sessions.get_mut(&session_id) else {
            return Err(ResponseError::FetchSessionIdNotFound);
        };
        if s.next_epoch != epoch {
            return Err(ResponseError::InvalidFetchSessionEpoch);
        }
        let before = s.parts.len();
        for k in forgotten {
            s.parts.remove(k);
        }
        for (k, w) in parts {
            s.parts
                .entry(k)
                .and_modify(|(old, _)| *old = w)
                .or_insert((w, UNANSWERED));
        }
        let after = s.parts.len();
        s.next_epoch = next_epoch(epoch);
        s.used = now;
        let all = s.parts.iter().map(|(k, (w, _))| (k.clone(), *w)).collect();
        self.cached = self.cached + after - before;
        if self.cached > MAX_CACHED_PARTITIONS {
            // Grown past the bound: drop it; the client's next incremental
            // fetch gets FETCH_SESSION_ID_NOT_FOUND and starts over.
            self.remove(session_id);
        }
        Ok(Plan::Incremental {
            session_id,
            parts: all,
        })
    }

    /// Record what was answered for `key` in session `session_id` and say
    /// whether an incremental answer must carry it: it has records or an
    /// error, or an offset the client has not been told.
    pub fn answered(
        &mut self,
        session_id: i32,
        key: &Key,
        now: Answered,
        has_records: bool,
        error: bool,
    ) -> bool {
        let Some(s) = self.sessions.get_mut(&session_id) else {
            return true;
        };
        let Some((_, last)) = s.parts.get_mut(key) else {
            return true;
        };
        let changed = *last != now;
        *last = now;
        has_records || error || changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(p: i32) -> Key {
        Key {
            topic: "t".into(),
            topic_id: Uuid::nil(),
            partition: p,
        }
    }

    fn w(off: i64) -> Want {
        Want {
            fetch_offset: off,
            max_bytes: 1 << 20,
            current_leader_epoch: -1,
        }
    }

    fn at(hw: i64) -> Answered {
        Answered {
            high_watermark: hw,
            last_stable_offset: hw,
            log_start_offset: 0,
        }
    }

    #[test]
    fn a_session_opens_answers_incrementally_and_checks_its_epoch() {
        let mut c = FetchSessions::default();
        let now = Instant::now();
        let plan = c
            .begin(0, 0, vec![(k(0), w(0)), (k(1), w(0))], &[], now, || 7)
            .unwrap();
        assert_eq!(
            plan,
            Plan::Full {
                session_id: 7,
                parts: vec![(k(0), w(0)), (k(1), w(0))]
            }
        );
        assert!(c.answered(7, &k(0), at(5), true, false));
        assert!(c.answered(7, &k(1), at(0), false, false), "first answer");
        // Incremental: p0 moved on; nothing new anywhere.
        let plan = c.begin(7, 1, vec![(k(0), w(5))], &[], now, || 0).unwrap();
        let Plan::Incremental { parts, .. } = plan else {
            panic!("{plan:?}")
        };
        assert_eq!(parts, vec![(k(0), w(5)), (k(1), w(0))], "the whole session");
        assert!(!c.answered(7, &k(0), at(5), false, false), "nothing new");
        assert!(!c.answered(7, &k(1), at(0), false, false));
        assert!(c.answered(7, &k(1), at(3), false, false), "hw moved");
        assert!(c.answered(7, &k(0), at(5), false, true), "an error");
        // Wrong epochs and unknown sessions.
        assert_eq!(
            c.begin(7, 1, vec![], &[], now, || 0),
            Err(ResponseError::InvalidFetchSessionEpoch)
        );
        assert_eq!(
            c.begin(8, 1, vec![], &[], now, || 0),
            Err(ResponseError::FetchSessionIdNotFound)
        );
        // Forget p1: only p0 is left.
        let Plan::Incremental { parts, .. } = c.begin(7, 2, vec![], &[k(1)], now, || 0).unwrap()
        else {
            panic!()
        };
        assert_eq!(parts, vec![(k(0), w(5))]);
        assert_eq!(c.cached_partitions(), 1);
        // Epoch -1 closes it.
        let plan = c.begin(7, -1, vec![(k(0), w(9))], &[], now, || 0).unwrap();
        assert!(matches!(plan, Plan::Full { session_id: 0, .. }));
        assert!(c.is_empty());
        assert_eq!(c.cached_partitions(), 0);
    }

    /// Catches: a read_committed consumer in a session never told that the
    /// last stable offset moved (a COMMIT marker moves it with the high
    /// watermark already answered), so it waits at the old LSO forever.
    #[test]
    fn a_moved_last_stable_offset_alone_is_news() {
        let mut c = FetchSessions::default();
        let now = Instant::now();
        c.begin(0, 0, vec![(k(0), w(0))], &[], now, || 3).unwrap();
        let held = Answered {
            high_watermark: 10,
            last_stable_offset: 4,
            log_start_offset: 0,
        };
        assert!(c.answered(3, &k(0), held, false, false));
        c.begin(3, 1, vec![], &[], now, || 0).unwrap();
        assert!(!c.answered(3, &k(0), held, false, false), "nothing moved");
        c.begin(3, 2, vec![], &[], now, || 0).unwrap();
        let released = Answered {
            last_stable_offset: 10,
            ..held
        };
        assert!(
            c.answered(3, &k(0), released, false, false),
            "the LSO moved"
        );
    }

    #[test]
    fn the_cache_is_bounded_and_idle_sessions_expire() {
        let mut c = FetchSessions::default();
        let t0 = Instant::now();
        for i in 0..MAX_SESSIONS + 5 {
            let id = i as i32 + 1;
            c.begin(
                0,
                0,
                vec![(k(0), w(0))],
                &[],
                t0 + Duration::from_millis(i as u64),
                || id,
            )
            .unwrap();
        }
        assert_eq!(c.len(), MAX_SESSIONS, "least recently used evicted");
        assert!(
            c.begin(1, 1, vec![], &[], t0, || 0).is_err(),
            "the oldest went"
        );
        // Too many partitions for any session: sessionless.
        let huge: Vec<_> = (0..MAX_CACHED_PARTITIONS as i32 + 1)
            .map(|p| (k(p), w(0)))
            .collect();
        let plan = c.begin(0, 0, huge, &[], t0, || 99_999).unwrap();
        assert!(matches!(plan, Plan::Full { session_id: 0, .. }));
        // Idle sessions go.
        c.begin(
            0,
            0,
            vec![],
            &[],
            t0 + IDLE_EXPIRY + Duration::from_secs(5),
            || 123_456,
        )
        .unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c.cached_partitions(), 0);
    }
}
