//! Topic configs: the keys kaas implements (with their KIP-569 types, the
//! broker setting each falls back to, and their documentation), their
//! validation, and the topic's versioned state
//! `<data>/<topic>/.topic-state/v-<n>.json` that AlterConfigs,
//! IncrementalAlterConfigs and CreatePartitions write.
//!
//! The configs and partition count given at creation live in the topic's
//! stamp, which is born with the directory and never rewritten for a
//! change. Changes go to a [`versioned`] document of their own,
//! [`TopicState`]: the complete set of topic-level overrides and the
//! partition count, with the topic id they belong to. It replaces the
//! stamp's values only when that id matches, so a state left by a dead
//! incarnation of the name (an adopted directory, an operator's copy) is
//! never inherited by a new topic: the new id makes it inert. Before the
//! state existed, altered configs were a single `.topic-config.json`
//! (temp → rename) and a grow rewrote the stamp; both are still read, and
//! the first change writes version 1 from them (migration on first write).
//!
//! Four questions: (1) a change is one exclusive create of version `n + 1`
//! (then write, fsync, directory fsync before it is acknowledged), so a
//! reader sees the old state or the new one; (2) a crash leaves the old
//! state or the new one (a torn newest version is skipped by readers and
//! gone past by the next writer), and a re-sent change is applied again to
//! whatever is newest (crash-at-every-step test below); (3) there is no
//! single writer — any broker's catalog may change a topic, through its
//! lease-guarded seam — but the exclusive create of `n + 1` after reading
//! `n` is a compare-and-set: two alters of one topic through two brokers at
//! the same instant both land, and a grow is judged against the newest
//! count (the loser of two equal grows gets INVALID_PARTITIONS, as from
//! Kafka's controller); (4) the name does not identify the state: the topic
//! id inside does, checked on every read.

use crate::fs::{write_atomic, Fs};
use crate::layout;
use crate::topic_dir::{TopicError, TopicStamp};
use crate::versioned::{self, Reader, Timing, UpdateError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use uuid::Uuid;

/// A config's type as DescribeConfigs reports it (KIP-569 `config_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i8)]
pub enum ConfigType {
    /// BOOLEAN
    Boolean = 1,
    /// STRING
    String = 2,
    /// INT
    Int = 3,
    /// SHORT
    Short = 4,
    /// LONG
    Long = 5,
    /// DOUBLE
    Double = 6,
    /// LIST
    List = 7,
    /// CLASS
    Class = 8,
    /// PASSWORD
    Password = 9,
}

impl ConfigType {
    /// The wire code.
    pub fn code(self) -> i8 {
        self as i8
    }
}

/// One topic-level config kaas implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicKey {
    /// Kafka's topic-level name.
    pub name: &'static str,
    /// Its type.
    pub kind: ConfigType,
    /// The broker-level setting it falls back to (its synonym).
    pub broker_key: &'static str,
    /// Documentation, as DescribeConfigs returns it on request.
    pub doc: &'static str,
}

/// Every topic-level config kaas implements; anything else is refused
/// with INVALID_CONFIG rather than accepted and ignored.
pub const TOPIC_KEYS: &[TopicKey] = &[
    TopicKey {
        name: "cleanup.policy",
        kind: ConfigType::List,
        broker_key: "log.cleanup.policy",
        doc: "The retention policy of old log segments. Only \"delete\" is implemented: whole segments past retention.ms or retention.bytes are removed (compaction is not).",
    },
    TopicKey {
        name: "compression.gzip.level",
        kind: ConfigType::Int,
        broker_key: "compression.gzip.level",
        doc: "The gzip level (1..9, or -1 for the codec's default, 6) batches are recompressed with when compression.type is gzip.",
    },
    TopicKey {
        name: "compression.lz4.level",
        kind: ConfigType::Int,
        broker_key: "compression.lz4.level",
        doc: "The lz4 level (1..17) batches are recompressed with when compression.type is lz4: 9, the default, is lz4's fast mode, any other level its high-compression mode (levels above 12 compress as 12).",
    },
    TopicKey {
        name: "compression.type",
        kind: ConfigType::String,
        broker_key: "compression.type",
        doc: "The codec batches are stored with: \"producer\" keeps the producer's; \"uncompressed\", \"gzip\", \"snappy\", \"lz4\" or \"zstd\" makes the broker decompress a batch sent with any other codec and recompress it with this one before it is appended (records, keys, headers, timestamps, producer id and sequence unchanged).",
    },
    TopicKey {
        name: "compression.zstd.level",
        kind: ConfigType::Int,
        broker_key: "compression.zstd.level",
        doc: "The zstd level (-131072..22) batches are recompressed with when compression.type is zstd.",
    },
    TopicKey {
        name: "max.message.bytes",
        kind: ConfigType::Int,
        broker_key: "message.max.bytes",
        doc: "The largest record batch size allowed; a larger batch is refused with MESSAGE_TOO_LARGE.",
    },
    TopicKey {
        name: "message.timestamp.after.max.ms",
        kind: ConfigType::Long,
        broker_key: "log.message.timestamp.after.max.ms",
        doc: "How far in the future (in ms, against the broker's clock) a batch's timestamps may be; beyond it the produce is refused with INVALID_TIMESTAMP.",
    },
    TopicKey {
        name: "message.timestamp.before.max.ms",
        kind: ConfigType::Long,
        broker_key: "log.message.timestamp.before.max.ms",
        doc: "How far in the past (in ms, against the broker's clock) a batch's timestamps may be; beyond it the produce is refused with INVALID_TIMESTAMP.",
    },
    TopicKey {
        name: "message.timestamp.type",
        kind: ConfigType::String,
        broker_key: "log.message.timestamp.type",
        doc: "Whether record timestamps are the producer's (CreateTime) or the leader's clock when it appends the batch (LogAppendTime: the batch's max timestamp and timestamp type are set, every record reads that time).",
    },
    TopicKey {
        name: "min.insync.replicas",
        kind: ConfigType::Int,
        broker_key: "min.insync.replicas",
        doc: "Accepted for compatibility: kaas keeps one copy on the shared volume, so every acknowledged write is on all (one) replicas.",
    },
    TopicKey {
        name: "retention.bytes",
        kind: ConfigType::Long,
        broker_key: "log.retention.bytes",
        doc: "The most bytes a partition keeps before whole old segments are removed (-1: no limit).",
    },
    TopicKey {
        name: "retention.ms",
        kind: ConfigType::Long,
        broker_key: "log.retention.ms",
        doc: "How long a segment is kept after its newest record before it is removed (-1: forever).",
    },
    TopicKey {
        name: "segment.bytes",
        kind: ConfigType::Int,
        broker_key: "log.segment.bytes",
        doc: "The segment file size at which the leader rolls to a new segment.",
    },
    TopicKey {
        name: "segment.ms",
        kind: ConfigType::Long,
        broker_key: "log.roll.ms",
        doc: "The age at which the leader rolls the active segment even if it is not full.",
    },
];

/// The key `name`, if kaas implements it.
pub fn key(name: &str) -> Option<&'static TopicKey> {
    TOPIC_KEYS.iter().find(|k| k.name == name)
}

/// Validate one topic config value.
pub fn validate(k: &str, v: &str) -> Result<(), TopicError> {
    let bad = |why: String| Err(TopicError::InvalidConfig(format!("{k}={v}: {why}")));
    let Some(key) = key(k) else {
        return Err(TopicError::InvalidConfig(format!(
            "unknown or unsupported topic config {k}"
        )));
    };
    let min = match k {
        "segment.bytes" => 1024,
        "segment.ms" | "min.insync.replicas" => 1,
        "retention.ms" | "retention.bytes" => -1,
        "compression.gzip.level" => -1,
        "compression.lz4.level" => 1,
        "compression.zstd.level" => -131_072,
        _ => 0,
    };
    let max = match k {
        "compression.gzip.level" => 9,
        "compression.lz4.level" => 17,
        "compression.zstd.level" => 22,
        _ => i64::from(i32::MAX),
    };
    // gzip's -1 (the codec's default) is the one value below 1 it takes.
    let hole = (k == "compression.gzip.level").then_some(0);
    match key.kind {
        ConfigType::Int => match v.trim().parse::<i32>() {
            Ok(n) if (min..=max).contains(&i64::from(n)) && hole != Some(n) => Ok(()),
            _ if hole.is_some() => bad(format!("expected {min} or an integer between 1 and {max}")),
            _ => bad(format!("expected an integer between {min} and {max}")),
        },
        ConfigType::Long => match v.trim().parse::<i64>() {
            Ok(n) if n >= min => Ok(()),
            _ => bad(format!("expected an integer >= {min}")),
        },
        _ => match k {
            "cleanup.policy" => {
                let items: Vec<&str> = v.split(',').map(str::trim).collect();
                if items.contains(&"compact") {
                    bad("compaction is not implemented; only 'delete' is".into())
                } else if items == ["delete"] {
                    Ok(())
                } else {
                    bad("expected 'delete'".into())
                }
            }
            "message.timestamp.type" => match v {
                "CreateTime" | "LogAppendTime" => Ok(()),
                _ => bad("expected CreateTime or LogAppendTime".into()),
            },
            // Kafka's names, case-sensitive as its validator is.
            "compression.type" => match v {
                "producer" | "uncompressed" | "gzip" | "snappy" | "lz4" | "zstd" => Ok(()),
                _ => bad("expected one of uncompressed, zstd, lz4, snappy, gzip, producer".into()),
            },
            _ => Ok(()),
        },
    }
}

/// Validate a whole set of topic configs.
pub fn validate_configs(configs: &BTreeMap<String, String>) -> Result<(), TopicError> {
    configs.iter().try_for_each(|(k, v)| validate(k, v))
}

/// An integer config of `configs`, if set and valid.
pub fn get_i64(configs: &BTreeMap<String, String>, k: &str) -> Option<i64> {
    configs.get(k).and_then(|v| v.trim().parse().ok())
}

/// The content of `<data>/<topic>/.topic-config.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfigFile {
    /// The topic incarnation these configs belong to.
    pub topic_id: Uuid,
    /// The complete set of topic-level overrides (not a delta).
    pub configs: BTreeMap<String, String>,
}

/// The config file of topic directory `dir`: `Ok(None)` if there is none.
/// It is written atomically, so an unparsable one is reported
/// (`InvalidData`), never guessed at.
pub fn read_file(fs: &dyn Fs, dir: &Path) -> io::Result<Option<TopicConfigFile>> {
    match fs.read(&dir.join(layout::TOPIC_CONFIG)) {
        Ok(b) => parse_file(&b).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Parse the bytes of a config file.
pub fn parse_file(bytes: &[u8]) -> io::Result<TopicConfigFile> {
    serde_json::from_slice(bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", layout::TOPIC_CONFIG),
        )
    })
}

/// Write the config file of topic directory `dir` (temp → fsync → rename
/// → dir fsync).
pub fn write_file(fs: &dyn Fs, dir: &Path, file: &TopicConfigFile) -> io::Result<()> {
    write_atomic(
        fs,
        &dir.join(layout::TOPIC_CONFIG),
        &serde_json::to_vec_pretty(file).expect("config file serializes"),
    )
}

/// The configs in force for `stamp`: the config file's set if it belongs
/// to this incarnation, else the stamp's (creation-time) set.
pub fn effective(stamp: &TopicStamp, file: Option<TopicConfigFile>) -> BTreeMap<String, String> {
    match file {
        Some(f) if f.topic_id == stamp.topic_id => f.configs,
        _ => stamp.configs.clone(),
    }
}

/// A topic's versioned state (see module docs): what changes after
/// creation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicState {
    /// The topic incarnation this state belongs to.
    pub topic_id: Uuid,
    /// The partition count (grows only).
    pub partitions: i32,
    /// The complete set of topic-level overrides (not a delta).
    pub configs: BTreeMap<String, String>,
}

/// The directory of the versioned state of topic directory `dir`.
pub fn state_dir(dir: &Path) -> std::path::PathBuf {
    dir.join(layout::TOPIC_STATE_DIR)
}

/// The stamp of topic directory `dir` with its partition count and configs
/// in force: the newest state of this incarnation, else (before the first
/// change) the stamp's with an older version's config file applied (see
/// [`effective`]). What the controller publishes in the assignment.
/// `Ok(None)` if the directory has no stamp; an unparsable stamp or config
/// file is `InvalidData`.
pub fn read_topic(fs: &dyn Fs, dir: &Path) -> io::Result<Option<TopicStamp>> {
    read_topic_with(fs, dir)
}

/// [`read_topic`] through any reader (the read-only view too).
pub fn read_topic_with(r: &(impl Reader + ?Sized), dir: &Path) -> io::Result<Option<TopicStamp>> {
    let mut stamp: TopicStamp = match r.read_file(&dir.join(layout::TOPIC_STAMP)) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", layout::TOPIC_STAMP),
            )
        })?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let state = versioned::read_latest::<TopicState>(r, &state_dir(dir))?;
    match state.newest {
        Some((_, st)) if st.topic_id == stamp.topic_id => {
            stamp.partitions = st.partitions;
            stamp.configs = st.configs;
        }
        _ => {
            let file = match r.read_file(&dir.join(layout::TOPIC_CONFIG)) {
                Ok(b) => Some(parse_file(&b)?),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            stamp.configs = effective(&stamp, file);
        }
    }
    Ok(Some(stamp))
}

/// One change of an IncrementalAlterConfigs request (op codes 0-3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlterOp {
    /// SET (0)
    Set(String),
    /// DELETE (1): back to the default.
    Delete,
    /// APPEND (2): to a LIST config.
    Append(String),
    /// SUBTRACT (3): from a LIST config.
    Subtract(String),
}

/// Apply incremental changes to `current`; the result is not yet
/// validated (see [`validate_configs`]).
pub fn apply_ops(
    current: &BTreeMap<String, String>,
    ops: &[(String, AlterOp)],
) -> Result<BTreeMap<String, String>, TopicError> {
    let mut out = current.clone();
    for (k, op) in ops {
        let Some(key) = key(k) else {
            return Err(TopicError::InvalidConfig(format!(
                "unknown or unsupported topic config {k}"
            )));
        };
        match op {
            AlterOp::Set(v) => {
                out.insert(k.clone(), v.clone());
            }
            AlterOp::Delete => {
                out.remove(k);
            }
            AlterOp::Append(_) | AlterOp::Subtract(_) if key.kind != ConfigType::List => {
                return Err(TopicError::InvalidConfig(format!(
                    "{k}: APPEND and SUBTRACT apply only to LIST configs"
                )));
            }
            AlterOp::Append(v) => {
                let mut items: Vec<String> = out
                    .get(k)
                    .map(|c| c.split(',').map(|s| s.trim().to_owned()).collect())
                    .unwrap_or_else(|| vec!["delete".to_owned()]);
                for i in v.split(',').map(str::trim) {
                    if !items.iter().any(|x| x == i) {
                        items.push(i.to_owned());
                    }
                }
                out.insert(k.clone(), items.join(","));
            }
            AlterOp::Subtract(v) => {
                let drop: Vec<&str> = v.split(',').map(str::trim).collect();
                let items: Vec<String> = out
                    .get(k)
                    .map(|c| c.split(',').map(|s| s.trim().to_owned()).collect())
                    .unwrap_or_else(|| vec!["delete".to_owned()])
                    .into_iter()
                    .filter(|i| !drop.contains(&i.as_str()))
                    .collect();
                out.insert(k.clone(), items.join(","));
            }
        }
    }
    Ok(out)
}

/// Alter the configs of topic `name` in `data`: `change` computes the new
/// complete set from the set in force, which is validated and (unless
/// `validate_only`) published as the topic's next state version (see
/// [`update`]). Returns the stamp with the new set.
pub fn alter(
    fs: &dyn Fs,
    data: &Path,
    name: &str,
    change: impl FnMut(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, TopicError>,
    validate_only: bool,
) -> Result<TopicStamp, TopicError> {
    alter_with(fs, data, name, change, validate_only, Timing::default())
}

/// [`alter`] with explicit timing (tests).
pub fn alter_with(
    fs: &dyn Fs,
    data: &Path,
    name: &str,
    mut change: impl FnMut(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, TopicError>,
    validate_only: bool,
    timing: Timing,
) -> Result<TopicStamp, TopicError> {
    update(
        fs,
        data,
        name,
        timing,
        |st| {
            let next = change(&st.configs)?;
            validate_configs(&next)?;
            st.configs = next;
            Ok(())
        },
        validate_only,
    )
}

/// Change the state of topic `name` in `data`: read the stamp and the
/// newest state by exact name (another broker may have written either),
/// apply `change` to the state in force and (unless `validate_only`)
/// publish it as the next version, exclusively; `change` is applied again
/// to the newer state whenever another broker's change landed first, so it
/// must judge (and may refuse) against what it is given. Returns the stamp
/// with the new partition count and configs.
pub fn update(
    fs: &dyn Fs,
    data: &Path,
    name: &str,
    timing: Timing,
    mut change: impl FnMut(&mut TopicState) -> Result<(), TopicError>,
    validate_only: bool,
) -> Result<TopicStamp, TopicError> {
    crate::topic_dir::validate_name(name).map_err(|_| TopicError::Unknown(name.to_owned()))?;
    let dir = data.join(name);
    let mut stamp = read_topic(fs, &dir)?.ok_or_else(|| TopicError::Unknown(name.to_owned()))?;
    let in_force = TopicState {
        topic_id: stamp.topic_id,
        partitions: stamp.partitions,
        configs: stamp.configs.clone(),
    };
    let st = if validate_only {
        let mut st = in_force;
        change(&mut st)?;
        st
    } else {
        // The base of a change: the newest state of this incarnation; when
        // there is none (never changed, or only by an older version, or the
        // newest belongs to a dead incarnation of the name) the values in
        // force as read above, which already include an older version's
        // config file and grown stamp: the migration.
        let base = |newest: Option<TopicState>| match newest {
            Some(st) if st.topic_id == stamp.topic_id => Ok(st),
            _ => Ok(in_force.clone()),
        };
        versioned::update(fs, &state_dir(&dir), timing, base, &mut change)
            .map_err(|e| match e {
                UpdateError::Refused(e) => e,
                UpdateError::Io(e) => TopicError::from(e),
            })?
            .1
    };
    stamp.partitions = st.partitions;
    stamp.configs = st.configs;
    Ok(stamp)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build fixtures with std::fs
mod tests {
    use super::*;
    use crate::fs::fault::FaultFs;
    use crate::fs::RealFs;
    use crate::topic_dir::{create, grow_with, plan_create, write_stamp};
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    // A deadline generous enough to mean "hung", not "slow": a test's own
    // writes acknowledge within it on a loaded machine (100 ms failed a
    // fresh-clone CI run once, one fsync being slow), and a torn version
    // is waited out in about a second.
    const SHORT: Timing = Timing {
        deadline: Duration::from_secs(1),
        grace: Duration::from_millis(10),
    };

    fn m(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn invalid(k: &str, v: &str) -> bool {
        matches!(validate(k, v), Err(TopicError::InvalidConfig(_)))
    }

    #[test]
    fn values_are_validated_by_type_and_range() {
        for (k, v) in [
            ("retention.ms", "-1"),
            ("retention.ms", "1000"),
            ("retention.bytes", "-1"),
            ("segment.bytes", "1024"),
            ("segment.ms", "1"),
            ("max.message.bytes", "2000000"),
            ("message.timestamp.type", "CreateTime"),
            ("compression.type", "producer"),
            ("compression.type", "uncompressed"),
            ("compression.type", "gzip"),
            ("compression.type", "snappy"),
            ("compression.type", "lz4"),
            ("compression.type", "zstd"),
            ("compression.gzip.level", "-1"),
            ("compression.gzip.level", "9"),
            ("compression.lz4.level", "1"),
            ("compression.lz4.level", "17"),
            ("compression.zstd.level", "-131072"),
            ("compression.zstd.level", "22"),
            ("message.timestamp.type", "LogAppendTime"),
            ("message.timestamp.before.max.ms", "0"),
            ("message.timestamp.after.max.ms", "3600000"),
            ("cleanup.policy", "delete"),
            ("compression.type", "producer"),
            ("min.insync.replicas", "1"),
        ] {
            assert_eq!(validate(k, v), Ok(()), "{k}={v}");
        }
        for (k, v) in [
            ("retention.ms", "-2"),
            ("retention.ms", "soon"),
            ("segment.bytes", "100"),
            // INT configs must fit 32 bits (Kafka's type).
            ("segment.bytes", "4294967296"),
            ("max.message.bytes", "-1"),
            ("message.timestamp.type", "Whenever"),
            ("message.timestamp.before.max.ms", "-5"),
            ("cleanup.policy", "compact"),
            ("cleanup.policy", "compact,delete"),
            ("cleanup.policy", "nope"),
            ("compression.type", "none"),
            ("compression.type", "GZIP"),
            ("compression.type", ""),
            ("compression.gzip.level", "0"),
            ("compression.gzip.level", "00"),
            ("compression.gzip.level", "10"),
            ("compression.gzip.level", "-2"),
            ("compression.lz4.level", "0"),
            ("compression.lz4.level", "18"),
            ("compression.zstd.level", "23"),
            ("compression.zstd.level", "-131073"),
            ("unclean.leader.election.enable", "true"),
            ("no.such.key", "1"),
        ] {
            assert!(invalid(k, v), "{k}={v} accepted");
        }
        assert!(validate("cleanup.policy", "compact")
            .unwrap_err()
            .to_string()
            .contains("compaction is not implemented"));
    }

    #[test]
    fn every_key_has_a_type_a_synonym_and_documentation() {
        for k in TOPIC_KEYS {
            assert!(!k.doc.is_empty() && !k.broker_key.is_empty(), "{}", k.name);
        }
        assert_eq!(key("retention.bytes").unwrap().kind.code(), 5);
        assert_eq!(key("segment.bytes").unwrap().kind.code(), 3);
        assert_eq!(key("cleanup.policy").unwrap().kind.code(), 7);
        assert_eq!(key("message.timestamp.type").unwrap().kind.code(), 2);
    }

    #[test]
    fn incremental_ops_set_delete_append_subtract() {
        let cur = m(&[("retention.ms", "1000"), ("segment.ms", "5")]);
        let out = apply_ops(
            &cur,
            &[
                ("retention.ms".into(), AlterOp::Set("2000".into())),
                ("segment.ms".into(), AlterOp::Delete),
                ("retention.bytes".into(), AlterOp::Set("10".into())),
            ],
        )
        .unwrap();
        assert_eq!(
            out,
            m(&[("retention.ms", "2000"), ("retention.bytes", "10")])
        );
        // APPEND of compact to the LIST: the result is refused when validated.
        let out = apply_ops(
            &cur,
            &[("cleanup.policy".into(), AlterOp::Append("compact".into()))],
        )
        .unwrap();
        assert_eq!(out["cleanup.policy"], "delete,compact");
        assert!(validate_configs(&out).is_err());
        let out = apply_ops(
            &m(&[("cleanup.policy", "delete,compact")]),
            &[("cleanup.policy".into(), AlterOp::Subtract("compact".into()))],
        )
        .unwrap();
        assert_eq!(out["cleanup.policy"], "delete");
        assert!(matches!(
            apply_ops(
                &cur,
                &[("retention.ms".into(), AlterOp::Append("1".into()))]
            ),
            Err(TopicError::InvalidConfig(_))
        ));
        assert!(matches!(
            apply_ops(&cur, &[("bogus".into(), AlterOp::Delete)]),
            Err(TopicError::InvalidConfig(_))
        ));
    }

    fn topic(fs: &dyn Fs, data: &Path, configs: BTreeMap<String, String>) -> TopicStamp {
        let s = plan_create(fs, data, "t", 1, configs).unwrap();
        create(fs, data, &s).unwrap();
        s
    }

    #[test]
    fn altered_configs_replace_the_stamps_and_validate_only_writes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let s = topic(&RealFs, d.path(), m(&[("retention.ms", "1000")]));
        let dir = d.path().join("t");
        assert_eq!(read_topic(&RealFs, &dir).unwrap().unwrap(), s);
        let set = |c: &BTreeMap<String, String>| {
            apply_ops(c, &[("segment.ms".into(), AlterOp::Set("7".into()))])
        };
        let v = alter(&RealFs, d.path(), "t", set, true).unwrap();
        assert_eq!(
            v.configs,
            m(&[("retention.ms", "1000"), ("segment.ms", "7")])
        );
        assert!(
            read_file(&RealFs, &dir).unwrap().is_none(),
            "validate_only wrote"
        );
        alter(&RealFs, d.path(), "t", set, false).unwrap();
        assert_eq!(
            read_topic(&RealFs, &dir).unwrap().unwrap().configs,
            m(&[("retention.ms", "1000"), ("segment.ms", "7")])
        );
        let bad = |c: &BTreeMap<String, String>| {
            apply_ops(
                c,
                &[("cleanup.policy".into(), AlterOp::Set("compact".into()))],
            )
        };
        assert!(matches!(
            alter(&RealFs, d.path(), "t", bad, false),
            Err(TopicError::InvalidConfig(_))
        ));
        assert_eq!(
            alter(&RealFs, d.path(), "nope", set, false),
            Err(TopicError::Unknown("nope".into()))
        );
    }

    /// Catches: a recreated topic (new id) inheriting the altered configs of
    /// a dead incarnation whose config file is still in the directory.
    #[test]
    fn a_config_file_of_another_incarnation_is_inert() {
        let d = tempfile::tempdir().unwrap();
        let s = topic(&RealFs, d.path(), BTreeMap::new());
        let dir = d.path().join("t");
        write_file(
            &RealFs,
            &dir,
            &TopicConfigFile {
                topic_id: Uuid::from_u128(1),
                configs: m(&[("retention.ms", "5")]),
            },
        )
        .unwrap();
        assert_eq!(
            read_topic(&RealFs, &dir).unwrap().unwrap().configs,
            s.configs
        );
    }

    /// Catches: a torn or missing config file after a crash in the middle
    /// of an alter (a reader must see the old set or the new one).
    #[test]
    fn crash_at_every_step_of_an_alter_leaves_old_or_new() {
        let old = m(&[("retention.ms", "1000")]);
        let new = m(&[("retention.ms", "1000"), ("retention.bytes", "4096")]);
        let change = |c: &BTreeMap<String, String>| {
            apply_ops(
                c,
                &[("retention.bytes".into(), AlterOp::Set("4096".into()))],
            )
        };
        let count = {
            let d = tempfile::tempdir().unwrap();
            let ffs = FaultFs::new();
            topic(&ffs, d.path(), old.clone());
            let before = ffs.ops();
            alter_with(&ffs, d.path(), "t", change, false, SHORT).unwrap();
            ffs.ops() - before
        };
        assert!(count >= 4, "{count}");
        for n in 1..=count {
            let d = tempfile::tempdir().unwrap();
            let ffs = FaultFs::new();
            topic(&ffs, d.path(), old.clone());
            ffs.crash_at(ffs.ops() + n);
            let _ = alter_with(&ffs, d.path(), "t", change, false, SHORT);
            ffs.power_loss();
            let got = read_topic(&RealFs, &d.path().join("t"))
                .unwrap_or_else(|e| panic!("step {n}: {e}"))
                .unwrap()
                .configs;
            assert!(got == old || got == new, "step {n}: {got:?}");
            // Re-driving converges.
            alter_with(&RealFs, d.path(), "t", change, false, SHORT).unwrap();
            assert_eq!(
                read_topic(&RealFs, &d.path().join("t"))
                    .unwrap()
                    .unwrap()
                    .configs,
                new,
                "step {n}"
            );
        }
    }

    /// Catches: an alter or a grow made by an older version (config file,
    /// grown stamp) lost when the first versioned change is written.
    #[test]
    fn the_first_change_migrates_the_old_formats() {
        let d = tempfile::tempdir().unwrap();
        let mut s = topic(&RealFs, d.path(), m(&[("retention.ms", "1000")]));
        let dir = d.path().join("t");
        // What an older version left: a grown stamp and a config file.
        s.partitions = 4;
        write_stamp(&RealFs, &dir, &s).unwrap();
        write_file(
            &RealFs,
            &dir,
            &TopicConfigFile {
                topic_id: s.topic_id,
                configs: m(&[("segment.ms", "9")]),
            },
        )
        .unwrap();
        let t = read_topic(&RealFs, &dir).unwrap().unwrap();
        assert_eq!(
            (t.partitions, t.configs.clone()),
            (4, m(&[("segment.ms", "9")]))
        );
        let set = |c: &BTreeMap<String, String>| {
            apply_ops(c, &[("retention.bytes".into(), AlterOp::Set("5".into()))])
        };
        alter_with(&RealFs, d.path(), "t", set, false, SHORT).unwrap();
        let t = read_topic(&RealFs, &dir).unwrap().unwrap();
        assert_eq!(
            (t.partitions, t.configs),
            (4, m(&[("segment.ms", "9"), ("retention.bytes", "5")]))
        );
        assert!(state_dir(&dir).join(layout::doc_version(1)).exists());
    }

    /// Catches: a state of another incarnation (an adopted directory)
    /// inherited by the topic, or used as the base of its first change.
    #[test]
    fn a_state_of_another_incarnation_is_inert() {
        let d = tempfile::tempdir().unwrap();
        let s = topic(&RealFs, d.path(), m(&[("retention.ms", "1000")]));
        let dir = d.path().join("t");
        std::fs::create_dir_all(state_dir(&dir)).unwrap();
        let foreign = TopicState {
            topic_id: Uuid::from_u128(1),
            partitions: 9,
            configs: m(&[("retention.ms", "5")]),
        };
        std::fs::write(
            state_dir(&dir).join(layout::doc_version(1)),
            versioned::encode(1, &foreign),
        )
        .unwrap();
        assert_eq!(read_topic(&RealFs, &dir).unwrap().unwrap(), s);
        let (t, old) = grow_with(&RealFs, d.path(), "t", 2, false, SHORT).unwrap();
        assert_eq!((t.partitions, old, t.configs), (2, 1, s.configs));
    }

    /// Catches: last-writer-wins between brokers: two alters of different
    /// keys at the same instant must both be in force afterwards, and of
    /// two equal grows exactly one succeeds (the other is
    /// INVALID_PARTITIONS, as Kafka's controller answers) — never a lost
    /// change or a lost grow.
    #[test]
    fn concurrent_alters_and_grows_through_two_brokers_all_land() {
        type Job = Box<dyn FnOnce(&Path) -> Result<i32, TopicError> + Send>;
        for round in 0..20 {
            let d = tempfile::tempdir().unwrap();
            topic(&RealFs, d.path(), BTreeMap::new());
            let data = Arc::new(d.path().to_path_buf());
            let go = Arc::new(Barrier::new(4));
            let run = |f: Job| {
                let (data, go) = (data.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    f(&data)
                })
            };
            let key = |k: &'static str| {
                Box::new(move |data: &Path| {
                    alter_with(
                        &RealFs,
                        data,
                        "t",
                        |c| apply_ops(c, &[(k.into(), AlterOp::Set("77".into()))]),
                        false,
                        SHORT,
                    )
                    .map(|_| 0)
                }) as Job
            };
            let grow6 = || {
                Box::new(|data: &Path| {
                    grow_with(&RealFs, data, "t", 6, false, SHORT).map(|(_, old)| old)
                }) as Job
            };
            let hs = vec![
                run(key("retention.ms")),
                run(key("segment.ms")),
                run(grow6()),
                run(grow6()),
            ];
            let r: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            assert!(r[0].is_ok() && r[1].is_ok(), "round {round}: {r:?}");
            let grows: Vec<_> = r[2..].to_vec();
            assert_eq!(
                grows.iter().filter(|g| g.is_ok()).count(),
                1,
                "round {round}: {grows:?}"
            );
            assert!(
                grows
                    .iter()
                    .any(|g| matches!(g, Err(TopicError::InvalidPartitionCount(_)))),
                "round {round}: {grows:?}"
            );
            let t = read_topic(&RealFs, &data.join("t")).unwrap().unwrap();
            assert_eq!(t.partitions, 6, "round {round}");
            assert_eq!(
                t.configs,
                m(&[("retention.ms", "77"), ("segment.ms", "77")]),
                "round {round}"
            );
        }
    }
}
