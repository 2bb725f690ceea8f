//! The operator's `/metrics` (Prometheus text): reconcile counts by result,
//! errors by reason, status writes and a reconcile-duration histogram.
//! Labels are results and reasons only, never resource names (cardinality).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the duration histogram, seconds.
const BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Default)]
struct Inner {
    ok: u64,
    errors: BTreeMap<&'static str, u64>,
    status_writes: u64,
    leader: bool,
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// Counters shared by every reconcile.
#[derive(Default)]
pub struct Metrics(Mutex<Inner>);

impl Metrics {
    /// Record one reconcile: its duration and, if it failed, the reason.
    pub fn observe(&self, took: Duration, error: Option<&'static str>) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match error {
            None => m.ok += 1,
            Some(r) => *m.errors.entry(r).or_insert(0) += 1,
        }
        let s = took.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if s <= *b {
                m.buckets[i] += 1;
            }
        }
        m.count += 1;
        m.sum += s;
    }

    /// One status patch sent.
    pub fn status_write(&self) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .status_writes += 1;
    }

    /// Whether this replica holds the lease (reconciles) now.
    pub fn set_leader(&self, leader: bool) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).leader = leader;
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let failed: u64 = m.errors.values().sum();
        let mut out = String::new();
        out += "# HELP kaas_operator_reconciles_total Reconciles by result.\n";
        out += "# TYPE kaas_operator_reconciles_total counter\n";
        out += &format!("kaas_operator_reconciles_total{{result=\"ok\"}} {}\n", m.ok);
        out += &format!("kaas_operator_reconciles_total{{result=\"error\"}} {failed}\n");
        out += "# HELP kaas_operator_reconcile_errors_total Failed reconciles by reason.\n";
        out += "# TYPE kaas_operator_reconcile_errors_total counter\n";
        for (r, n) in &m.errors {
            out += &format!("kaas_operator_reconcile_errors_total{{reason=\"{r}\"}} {n}\n");
        }
        out += "# HELP kaas_operator_status_writes_total Status patches sent (only on change).\n";
        out += "# TYPE kaas_operator_status_writes_total counter\n";
        out += &format!("kaas_operator_status_writes_total {}\n", m.status_writes);
        out += "# HELP kaas_operator_leader 1 while this replica holds the lease and reconciles.\n";
        out += "# TYPE kaas_operator_leader gauge\n";
        out += &format!("kaas_operator_leader {}\n", u8::from(m.leader));
        out += "# HELP kaas_operator_reconcile_duration_seconds Reconcile duration.\n";
        out += "# TYPE kaas_operator_reconcile_duration_seconds histogram\n";
        for (i, b) in BUCKETS.iter().enumerate() {
            out += &format!(
                "kaas_operator_reconcile_duration_seconds_bucket{{le=\"{b}\"}} {}\n",
                m.buckets[i]
            );
        }
        out += &format!(
            "kaas_operator_reconcile_duration_seconds_bucket{{le=\"+Inf\"}} {}\n",
            m.count
        );
        out += &format!("kaas_operator_reconcile_duration_seconds_sum {}\n", m.sum);
        out += &format!(
            "kaas_operator_reconcile_duration_seconds_count {}\n",
            m.count
        );
        out
    }
}

/// Serve `GET /metrics` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, metrics: std::sync::Arc<Metrics>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let n = match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let req = String::from_utf8_lossy(&buf[..n]);
            let path = req.split_whitespace().nth(1).unwrap_or("/");
            let (status, body) = if path == "/metrics" {
                ("200 OK", metrics.render())
            } else {
                ("404 Not Found", "not found\n".to_string())
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(body.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_errors_by_reason_and_durations() {
        let m = Metrics::default();
        m.observe(Duration::from_millis(3), None);
        m.observe(Duration::from_millis(30), Some("kafka"));
        m.status_write();
        let t = m.render();
        assert!(t.contains("kaas_operator_reconciles_total{result=\"ok\"} 1"));
        assert!(t.contains("kaas_operator_reconciles_total{result=\"error\"} 1"));
        assert!(t.contains("kaas_operator_reconcile_errors_total{reason=\"kafka\"} 1"));
        assert!(t.contains("kaas_operator_reconcile_duration_seconds_bucket{le=\"0.005\"} 1"));
        assert!(t.contains("kaas_operator_reconcile_duration_seconds_count 2"));
        assert!(t.contains("kaas_operator_status_writes_total 1"));
        assert!(t.contains("kaas_operator_leader 0"));
        m.set_leader(true);
        assert!(m.render().contains("kaas_operator_leader 1"));
    }
}
