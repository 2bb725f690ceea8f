//! `kaas dev --brokers N`: a local cluster in one command. Starts N broker
//! processes (ids 0..N, Kafka ports base..base+N, metrics ports
//! metrics-base..) on one shared data directory, exactly as N pods of the
//! StatefulSet share one volume. SIGINT/SIGTERM is forwarded as SIGTERM, so
//! each broker hands off and exits cleanly. A broker that dies is reported,
//! not restarted: that is the failover demo.

use clap::Args;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

/// `kaas dev` flags.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Number of brokers.
    #[arg(long, default_value_t = 3)]
    pub brokers: u16,
    /// Shared data directory.
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,
    /// Kafka port of broker 0; broker i listens on base + i.
    #[arg(long, default_value_t = 9092)]
    pub base_port: u16,
    /// Metrics port of broker 0.
    #[arg(long, default_value_t = 9644)]
    pub metrics_base_port: u16,
    /// Extra flags passed to every broker (e.g. --lease-ms 2000).
    #[arg(last = true)]
    pub broker_args: Vec<String>,
}

/// Run the cluster until a signal; returns the exit code.
pub fn run(a: &DevArgs) -> anyhow::Result<i32> {
    let exe = std::env::current_exe()?;
    let mut children: Vec<(u16, Child)> = Vec::new();
    let mut copiers = Vec::new();
    for i in 0..a.brokers {
        let child = Command::new(&exe)
            .arg("broker")
            .args(["--broker-id", &i.to_string()])
            .arg("--data-dir")
            .arg(&a.data_dir)
            .args(["--listen", &format!("127.0.0.1:{}", a.base_port + i)])
            .args([
                "--metrics-listen",
                &format!("127.0.0.1:{}", a.metrics_base_port + i),
            ])
            .args(&a.broker_args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        // Three brokers' lines interleave on one terminal: each is prefixed
        // with the broker's id.
        let mut child = child;
        for out in [
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|e| Box::new(e) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            copiers.push((i, std::thread::spawn(move || prefix_lines(i, out))));
        }
        eprintln!(
            "kaas dev: broker {i} (pid {}) on 127.0.0.1:{}",
            child.id(),
            a.base_port + i
        );
        children.push((i, child));
    }
    eprintln!(
        "kaas dev: bootstrap servers 127.0.0.1:{}..{}; Ctrl-C stops the cluster",
        a.base_port,
        a.base_port + a.brokers - 1
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {
                    for (i, c) in children.iter_mut() {
                        if let Ok(Some(st)) = c.try_wait() {
                            eprintln!("kaas dev: broker {i} exited ({st}); not restarting");
                        }
                    }
                    children.retain_mut(|(_, c)| !matches!(c.try_wait(), Ok(Some(_))));
                    if children.is_empty() {
                        break;
                    }
                }
            }
        }
        Ok::<(), anyhow::Error>(())
    })?;
    for (_, c) in &children {
        if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
    for (i, mut c) in children {
        let st = c.wait()?;
        // Its last lines first: its pipes end with it (bounded wait).
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while copiers.iter().any(|(id, t)| *id == i && !t.is_finished())
            && std::time::Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("kaas dev: broker {i} stopped ({st})");
    }
    Ok(0)
}

/// Copy `out` to our stderr line by line, each line prefixed `b<id> | `,
/// until it ends (the broker exited). Lines are written whole, so lines of
/// different brokers never mix within a line.
fn prefix_lines(id: u16, out: Box<dyn std::io::Read + Send>) {
    use std::io::{BufRead, Write};
    let mut r = std::io::BufReader::new(out);
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                let mut whole = format!("b{id} | ").into_bytes();
                whole.extend_from_slice(&line);
                let _ = std::io::stderr().lock().write_all(&whole);
            }
        }
    }
}
