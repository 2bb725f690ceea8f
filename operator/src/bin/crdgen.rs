//! Prints the KafkaTopic CRD YAML generated from the Rust types; its output
//! is committed as deploy/crds/kafkatopic.yaml and the chart's crds/.

fn main() {
    print!("{}", kaas_operator::crd::crd_yaml());
}
