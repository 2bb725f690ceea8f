//! The tiny admin client against a real `kaas broker` process on loopback:
//! CreateTopics (twice: idempotent), DeleteTopics (twice: idempotent), and
//! NotSupported — not an error — for the APIs the broker does not serve.
//! The binary is `$KAAS_BIN`, else target/{release,debug}/kaas; CI builds it
//! before `cargo test`. Without one the test says so and passes.

use kaas_operator::admin::{Admin, AdminError, KafkaAdmin};
use kaas_volume::topic_dir;
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn kaas_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KAAS_BIN") {
        return Some(PathBuf::from(p));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    ["release", "debug"]
        .iter()
        .map(|p| target.join(p).join("kaas"))
        .find(|p| p.exists())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn admin_client_against_a_real_broker() {
    let Some(bin) = kaas_bin() else {
        eprintln!("no kaas binary (set KAAS_BIN or build -p kaas): skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (port, mport) = (free_port(), free_port());
    let _broker = Kill(
        Command::new(bin)
            .args(["broker", "--data-dir"])
            .arg(&data)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{mport}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let addr = format!("127.0.0.1:{port}");
    let until = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < until, "broker not serving");
        std::thread::sleep(Duration::from_millis(50));
    }
    let admin = KafkaAdmin::new(addr, Duration::from_secs(10));
    let fs = kaas_volume::fs::RealFs;
    admin
        .create_topic("live", 3, &BTreeMap::new())
        .await
        .unwrap();
    let stamp = topic_dir::read_stamp(&fs, &data.join("live"))
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(stamp.partitions, 3);
    admin
        .create_topic("live", 3, &BTreeMap::new())
        .await
        .unwrap();
    let bad = [("cleanup.policy".to_string(), "compact".to_string())].into();
    assert!(matches!(
        admin.create_topic("bad", 1, &bad).await,
        Err(AdminError::Kafka { code: 40, .. })
    ));
    // Served since the topic-administration work: the brokers grow the
    // topic and alter its configs through the catalog.
    admin.create_partitions("live", 6).await.unwrap();
    // The count in force (the stamp keeps the count at creation; grows
    // are versions of the topic's state).
    let grown = kaas_volume::topic_config::read_topic(&fs, &data.join("live"))
        .unwrap()
        .unwrap();
    assert_eq!(grown.partitions, 6);
    let retention = [("retention.ms".to_string(), "60000".to_string())].into();
    admin.alter_configs("live", &retention, &[]).await.unwrap();
    let cfg = kaas_volume::topic_config::read_topic(&fs, &data.join("live"))
        .unwrap()
        .unwrap();
    assert_eq!(cfg.configs["retention.ms"], "60000");
    admin.delete_topic("live").await.unwrap();
    assert!(topic_dir::read_stamp(&fs, &data.join("live"))
        .unwrap()
        .is_none());
    admin.delete_topic("live").await.unwrap();
}
