//! The committed CRD YAML (deploy/crds/ and the chart's crds/) is exactly
//! what `crdgen` prints from the Rust types. Regenerate with
//! `cargo run -p kaas-operator --bin crdgen > deploy/crds/kafkatopic.yaml`
//! and copy it to deploy/helm/kaas/crds/.

use std::path::Path;

#[test]
fn committed_crds_match_crdgen() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let want = kaas_operator::crd::crd_yaml();
    for p in [
        "deploy/crds/kafkatopic.yaml",
        "deploy/helm/kaas/crds/kafkatopic.yaml",
    ] {
        let have = std::fs::read_to_string(root.join(p)).unwrap_or_default();
        assert!(
            have == want,
            "{p} differs from `crdgen` output: regenerate it (see this test's header)"
        );
    }
}
