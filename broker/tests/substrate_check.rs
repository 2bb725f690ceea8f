//! `kaas substrate-check` on the local disk and on tmpfs: both pass, the
//! JSON is machine-readable, nothing is left behind, partition data is never
//! touched, and a stale probe directory of an interrupted run is removed.

#![allow(clippy::disallowed_methods)] // tests build fixtures and simulate other hosts with raw std::fs calls

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn kaas() -> PathBuf {
    std::env::var_os("KAAS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kaas")))
}

/// A scratch directory under `base`, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(base: &Path, tag: &str) -> Self {
        let p = base.join(format!(
            "kaas-substrate-test-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&p).expect("create test dir");
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(args: &[&str], dir: &Path) -> (i32, Value) {
    let out = Command::new(kaas())
        .arg("substrate-check")
        .arg("--json")
        .args(args)
        .arg(dir)
        .output()
        .expect("run kaas");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "kaas substrate-check printed no JSON ({e}); is it wired into main.rs?\nstdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), doc)
}

fn check_passes_on(base: &Path, tag: &str, fstype_hint: &str) {
    let d = Dir::new(base, tag);
    std::fs::create_dir_all(d.0.join("topic/0")).unwrap();
    std::fs::write(d.0.join("topic/0/00000000000000000000-e1.log"), b"records").unwrap();
    let stale = d.0.join(".kaas-substrate-check-1-interrupted");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("rename-target"), b"x").unwrap();
    // An owner on this boot whose process is gone.
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    std::fs::write(stale.join("owner"), format!("{} 999999999 1", boot.trim())).unwrap();

    let (code, doc) = run(&["--large-file-mib", "16"], &d.0);
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["usable"], true);
    let report = &doc["reports"][0];
    let fstype = report["mount"]["fstype"].as_str().unwrap_or("");
    assert!(fstype.contains(fstype_hint), "{report:#}");
    for c in report["checks"].as_array().unwrap() {
        let s = c["status"].as_str().unwrap();
        assert!(s == "pass" || s == "warn", "{c:#}");
    }
    for p in [
        "mount",
        "rename-atomic",
        "exclusive-create",
        "close-to-open",
        "rename-identity",
        "rename-timing",
        "fsync",
        "silly-rename",
        "space",
    ] {
        assert!(
            report["checks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["property"] == p),
            "missing {p}"
        );
    }
    let mut left: Vec<String> = std::fs::read_dir(&d.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        vec!["topic".to_owned()],
        "probe dirs (own and stale) removed"
    );
    assert_eq!(
        std::fs::read(d.0.join("topic/0/00000000000000000000-e1.log")).unwrap(),
        b"records"
    );

    let (code, doc) = run(&["--quick"], &d.0);
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["reports"][0]["quick"], true);
}

#[test]
fn passes_on_local_disk() {
    check_passes_on(&std::env::temp_dir(), "disk", "");
}

#[test]
fn passes_on_tmpfs() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("SKIPPED: no /dev/shm here");
        return;
    }
    check_passes_on(shm, "shm", "tmpfs");
}

#[test]
fn missing_directory_is_an_error_not_a_pass() {
    let out = Command::new(kaas())
        .args(["substrate-check", "/nonexistent/kaas/substrate/dir"])
        .output()
        .expect("run kaas");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
