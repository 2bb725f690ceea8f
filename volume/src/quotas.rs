//! Client quotas on the volume: `<cluster>/quotas/v-<n>.json`, a
//! [`versioned`] document (each version the complete set: entity → quota
//! key → value).
//!
//! A change (AlterClientQuotas, through any broker) reads the newest
//! version `n`, applies its operations and creates `n + 1` exclusively; if
//! another broker created `n + 1` first, it reads again and re-applies.
//! Versions are therefore a linear history and no acknowledged change is
//! lost to a concurrent one; a torn newest version is waited out, then gone
//! past, as [`versioned`] explains. Versions written before the chain had
//! a header (plain JSON) are still read.
//!
//! Four questions: see [`versioned`] — (1) one exclusive create, then write,
//! fsync and directory fsync before acknowledging; (2) a crash leaves
//! nothing, a torn newest file every reader skips, or the whole version;
//! (3) the exclusive create of `n + 1` is the compare-and-set between
//! brokers; (4) a version number names one content forever.

use crate::fs::Fs;
use crate::versioned::{self, Reader, Timing, UpdateError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io;
use std::path::Path;

/// Versions kept behind the newest.
pub const KEEP: u64 = versioned::KEEP;

/// An entity: (entity type, name — `None` is the type's default), sorted
/// by type. Kafka's types: `user`, `client-id` (and `ip`).
pub type Entity = Vec<(String, Option<String>)>;

/// The whole set of quotas.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Quotas {
    /// Per entity, quota key → value.
    pub entries: Vec<(Entity, BTreeMap<String, f64>)>,
}

impl Quotas {
    /// The values of `entity`, if any.
    pub fn get(&self, entity: &Entity) -> Option<&BTreeMap<String, f64>> {
        self.entries
            .iter()
            .find(|(e, _)| e == entity)
            .map(|(_, v)| v)
    }

    /// Set (`Some`) or remove (`None`) `key` of `entity`.
    pub fn set(&mut self, entity: &Entity, key: &str, value: Option<f64>) {
        let i = match self.entries.iter().position(|(e, _)| e == entity) {
            Some(i) => i,
            None => {
                if value.is_none() {
                    return;
                }
                self.entries.push((entity.clone(), BTreeMap::new()));
                self.entries.len() - 1
            }
        };
        match value {
            Some(v) => {
                self.entries[i].1.insert(key.to_owned(), v);
            }
            None => {
                self.entries[i].1.remove(key);
                if self.entries[i].1.is_empty() {
                    self.entries.remove(i);
                }
            }
        }
    }
}

/// The newest version present (readable or not; 0 when there is none) and
/// the quotas of the newest readable one (empty when none is). A change
/// read at version `n` is published as `n + 1`, exclusively: it is based on
/// everything acknowledged before it.
pub fn read_latest(r: &(impl Reader + ?Sized), dir: &Path) -> io::Result<(u64, Quotas)> {
    let l = versioned::read_latest::<Quotas>(r, dir)?;
    Ok((l.top, l.newest.map(|(_, q)| q).unwrap_or_default()))
}

/// Apply `change` to the newest quotas and publish the result as the next
/// version (see module docs); returns it. `change` may refuse (its error
/// is returned, nothing is written).
pub fn alter<E: From<io::Error>>(
    fs: &dyn Fs,
    dir: &Path,
    change: impl FnMut(&mut Quotas) -> Result<(), E>,
) -> Result<(u64, Quotas), E> {
    alter_with(fs, dir, Timing::default(), change)
}

/// [`alter`] with explicit [`Timing`] (tests).
pub fn alter_with<E: From<io::Error>>(
    fs: &dyn Fs,
    dir: &Path,
    timing: Timing,
    change: impl FnMut(&mut Quotas) -> Result<(), E>,
) -> Result<(u64, Quotas), E> {
    versioned::update(fs, dir, timing, |q| Ok(q.unwrap_or_default()), change).map_err(|e| match e {
        UpdateError::Refused(e) => e,
        UpdateError::Io(e) => e.into(),
    })
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build fixtures with std::fs
mod tests {
    use super::*;
    use crate::fs::fault::FaultFs;
    use crate::fs::RealFs;
    use crate::layout;
    use std::time::Duration;

    // A deadline generous enough to mean "hung", not "slow": a test's own
    // writes acknowledge within it on a loaded machine (100 ms failed a
    // fresh-clone CI run once, one fsync being slow), and a torn version
    // is waited out in about a second.
    const SHORT: Timing = Timing {
        deadline: Duration::from_secs(1),
        grace: Duration::from_millis(10),
    };

    fn client(c: Option<&str>) -> Entity {
        vec![("client-id".into(), c.map(str::to_owned))]
    }

    fn set(e: Entity, v: f64) -> impl FnMut(&mut Quotas) -> Result<(), io::Error> {
        move |q| {
            q.set(&e, "producer_byte_rate", Some(v));
            Ok(())
        }
    }

    #[test]
    fn versions_are_linear_and_concurrent_changes_both_land() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            read_latest(&RealFs, d.path()).unwrap(),
            (0, Quotas::default())
        );
        let (n, _) = alter(&RealFs, d.path(), set(client(Some("a")), 100.0)).unwrap();
        assert_eq!(n, 1);
        // Another broker's write of version 2 lands between our read and
        // our create: we go to 3 with both changes.
        let mut raced = false;
        let (n, q) = alter(&RealFs, d.path(), |q: &mut Quotas| {
            if !raced {
                raced = true;
                alter(&RealFs, d.path(), set(client(None), 7.0)).unwrap();
            }
            q.set(&client(Some("b")), "consumer_byte_rate", Some(5.0));
            Ok::<_, io::Error>(())
        })
        .unwrap();
        assert_eq!(n, 3);
        assert_eq!(
            q.get(&client(Some("a"))).unwrap()["producer_byte_rate"],
            100.0
        );
        assert_eq!(q.get(&client(None)).unwrap()["producer_byte_rate"], 7.0);
        assert_eq!(
            q.get(&client(Some("b"))).unwrap()["consumer_byte_rate"],
            5.0
        );
        assert_eq!(read_latest(&RealFs, d.path()).unwrap(), (3, q.clone()));
        // A torn newest version (its writer died) is skipped by readers and
        // gone past by the next writer.
        std::fs::write(d.path().join(layout::quotas_version(4)), b"{\"entr").unwrap();
        assert_eq!(read_latest(&RealFs, d.path()).unwrap(), (4, q.clone()));
        // Removing the last key removes the entity.
        let (_, q) = alter_with(&RealFs, d.path(), SHORT, |q: &mut Quotas| {
            q.set(&client(Some("b")), "consumer_byte_rate", None);
            Ok::<_, io::Error>(())
        })
        .unwrap();
        assert!(q.get(&client(Some("b"))).is_none());
        // Old versions are swept.
        for i in 0..20 {
            alter(&RealFs, d.path(), set(client(Some("a")), i as f64)).unwrap();
        }
        assert!(std::fs::read_dir(d.path()).unwrap().count() <= KEEP as usize + 1);
    }

    /// Catches: a crash mid-write leaving a newest version that readers
    /// take for "no quotas", or one that blocks every later change.
    #[test]
    fn crash_at_every_step_of_a_change_converges() {
        let base = {
            let d = tempfile::tempdir().unwrap();
            alter_with(&RealFs, d.path(), SHORT, set(client(Some("a")), 1.0)).unwrap();
            let ffs = FaultFs::new();
            alter_with(&ffs, d.path(), SHORT, set(client(Some("a")), 2.0)).unwrap();
            ffs.ops()
        };
        for n in 1..=base {
            let d = tempfile::tempdir().unwrap();
            alter_with(&RealFs, d.path(), SHORT, set(client(Some("a")), 1.0)).unwrap();
            let ffs = FaultFs::new();
            ffs.crash_at(n);
            let acked = alter_with(&ffs, d.path(), SHORT, set(client(Some("a")), 2.0)).is_ok();
            ffs.power_loss();
            let (_, q) = read_latest(&RealFs, d.path()).unwrap();
            let v = q.get(&client(Some("a"))).unwrap()["producer_byte_rate"];
            assert!(v == 1.0 || v == 2.0, "step {n}: {v}");
            assert!(
                !acked || v == 2.0,
                "step {n}: an acknowledged change was lost"
            );
            // The next change goes through whatever was left.
            let (_, q) = alter_with(&RealFs, d.path(), SHORT, set(client(Some("a")), 3.0)).unwrap();
            assert_eq!(
                q.get(&client(Some("a"))).unwrap()["producer_byte_rate"],
                3.0
            );
            assert_eq!(read_latest(&RealFs, d.path()).unwrap().1, q, "step {n}");
        }
    }
}
