//! Client quotas on the volume: `<cluster>/quotas/v-<n>.json`, one file
//! per version, each the complete set (entity → quota key → value).
//!
//! A change (AlterClientQuotas, through any broker) reads the newest
//! version `n`, applies its operations and creates `n + 1` with O_EXCL,
//! writes and fsyncs it; if another broker created `n + 1` first, it reads
//! again and re-applies (bounded). Versions are therefore a linear history
//! and no change is lost to a concurrent one. Readers take the newest
//! version that parses; an empty or torn newest version (its writer died
//! between create and fsync, so its change was never acknowledged) is
//! skipped, and the next writer goes past it. The oldest versions beyond
//! [`KEEP`] are swept by writers.
//!
//! Four questions: (1) a version is one exclusive create, then write and
//! fsync of its whole content, then a directory fsync, before the change
//! is acknowledged; (2) a crash leaves either nothing, an empty or torn
//! newest file that every reader skips, or the whole new version; (3) the
//! exclusive create decides which writer owns version `n + 1`; (4) the
//! version number names the content: a file is never rewritten.

use crate::fs::{exists, Fs};
use crate::layout;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io;
use std::path::Path;

/// Versions kept behind the newest.
pub const KEEP: u64 = 8;
/// Attempts of one change against concurrent writers.
const ATTEMPTS: usize = 8;

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
pub fn read_latest(fs: &dyn Fs, dir: &Path) -> io::Result<(u64, Quotas)> {
    let mut versions: Vec<u64> = match fs.list(dir) {
        Ok(names) => names
            .iter()
            .filter_map(|n| layout::parse_quotas_version(n))
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    versions.sort_unstable();
    // A listing may be stale (NFS): look past its end by exact name.
    let mut top = versions.last().copied().unwrap_or(0);
    while exists(fs, &dir.join(layout::quotas_version(top + 1)))? {
        top += 1;
        versions.push(top);
    }
    for &v in versions.iter().rev() {
        match fs.read(&dir.join(layout::quotas_version(v))) {
            Ok(b) => {
                // Empty or torn: its writer died before acknowledging it.
                if let Ok(q) = serde_json::from_slice::<Quotas>(&b) {
                    return Ok((top, q));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok((top, Quotas::default()))
}

/// Apply `change` to the newest quotas and publish the result as the next
/// version (see module docs); returns it. `change` may refuse (its error
/// is returned, nothing is written).
pub fn alter<E: From<io::Error>>(
    fs: &dyn Fs,
    dir: &Path,
    mut change: impl FnMut(&mut Quotas) -> Result<(), E>,
) -> Result<(u64, Quotas), E> {
    fs.create_dir_all(dir)?;
    for _ in 0..ATTEMPTS {
        let (top, mut q) = read_latest(fs, dir)?;
        change(&mut q)?;
        let n = top + 1;
        let path = dir.join(layout::quotas_version(n));
        let f = match fs.create_exclusive(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e.into()),
        };
        f.write_all_at(&serde_json::to_vec(&q).expect("quotas serialize"), 0)?;
        f.sync_data()?;
        drop(f);
        fs.sync_dir(dir)?;
        sweep(fs, dir, n);
        return Ok((n, q));
    }
    Err(io::Error::other("quotas: too many concurrent changes; try again").into())
}

/// Remove versions older than `newest - KEEP` (best effort).
fn sweep(fs: &dyn Fs, dir: &Path, newest: u64) {
    let Ok(names) = fs.list(dir) else { return };
    for n in names {
        if layout::parse_quotas_version(&n).is_some_and(|v| v + KEEP < newest) {
            let _ = fs.remove_file(&dir.join(&n));
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build fixtures with std::fs
mod tests {
    use super::*;
    use crate::fs::fault::FaultFs;
    use crate::fs::RealFs;

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
        let (_, q) = alter(&RealFs, d.path(), |q: &mut Quotas| {
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
            alter(&RealFs, d.path(), set(client(Some("a")), 1.0)).unwrap();
            let ffs = FaultFs::new();
            alter(&ffs, d.path(), set(client(Some("a")), 2.0)).unwrap();
            ffs.ops()
        };
        for n in 1..=base {
            let d = tempfile::tempdir().unwrap();
            alter(&RealFs, d.path(), set(client(Some("a")), 1.0)).unwrap();
            let ffs = FaultFs::new();
            ffs.crash_at(n);
            let acked = alter(&ffs, d.path(), set(client(Some("a")), 2.0)).is_ok();
            ffs.power_loss();
            let (_, q) = read_latest(&RealFs, d.path()).unwrap();
            let v = q.get(&client(Some("a"))).unwrap()["producer_byte_rate"];
            assert!(v == 1.0 || v == 2.0, "step {n}: {v}");
            assert!(
                !acked || v == 2.0,
                "step {n}: an acknowledged change was lost"
            );
            // The next change goes through whatever was left.
            let (_, q) = alter(&RealFs, d.path(), set(client(Some("a")), 3.0)).unwrap();
            assert_eq!(
                q.get(&client(Some("a"))).unwrap()["producer_byte_rate"],
                3.0
            );
            assert_eq!(read_latest(&RealFs, d.path()).unwrap().1, q, "step {n}");
        }
    }
}
