//! The telemetry HTTP listener: `/metrics` (Prometheus text), `/actors`
//! (the per-actor map, kept for existing scrapers), `/api/actors`,
//! `/api/cluster`, `/api/partitions`, `/api/series` (JSON behind the
//! dashboard) and `/` with its assets (the dashboard, embedded in the
//! binary).
//!
//! Read-only by construction: handlers see the in-memory telemetry, the
//! broker's applied assignment and a [`ClusterFiles`] snapshot that a
//! sampler thread refreshes from the shared files through the read-only
//! view. A request never touches the volume itself, so a hung filesystem
//! cannot hang the dashboard (it shows the snapshot's age instead).
//!
//! Bounded: a request is at most [`MAX_REQUEST`] bytes, lists are paged
//! (`offset`, `limit` ≤ [`MAX_LIMIT`]), at most [`MAX_CONNS`] requests are
//! served at once, and a malformed request or query string is a 400, never
//! a panic. Hand-rolled rather than a web framework: a handful of GET routes
//! do not justify its compile time (ARCHITECTURE.md).

mod api;
mod assets;
mod files;
pub(crate) mod lag;

pub use files::{ClusterFiles, Sampler};

use crate::state::Broker;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Largest request head read.
pub const MAX_REQUEST: usize = 8 * 1024;
/// Largest page of a list.
pub const MAX_LIMIT: usize = 1000;
/// Requests served at once; more wait in the listen backlog.
pub const MAX_CONNS: usize = 64;

/// A response: status line, content type, body.
#[derive(Debug)]
pub struct Response {
    /// e.g. `200 OK`.
    pub status: &'static str,
    /// Content type.
    pub ctype: &'static str,
    /// Body.
    pub body: String,
}

impl Response {
    fn ok(ctype: &'static str, body: String) -> Self {
        Self {
            status: "200 OK",
            ctype,
            body,
        }
    }

    fn json(v: &serde_json::Value) -> Self {
        Self::ok("application/json", v.to_string())
    }

    fn bad_request(why: &str) -> Self {
        Self {
            status: "400 Bad Request",
            ctype: "text/plain",
            body: format!("bad request: {why}\n"),
        }
    }

    fn not_found() -> Self {
        Self {
            status: "404 Not Found",
            ctype: "text/plain",
            body: "not found\n".into(),
        }
    }
}

/// A parsed query string: decoded `key=value` pairs.
#[derive(Debug, Default, PartialEq)]
pub struct Query(Vec<(String, String)>);

impl Query {
    /// Parse `a=1&b=x%20y`; a malformed escape is an error.
    pub fn parse(q: &str) -> Result<Self, String> {
        let mut v = Vec::new();
        for part in q.split('&').filter(|p| !p.is_empty()) {
            let (k, val) = part.split_once('=').unwrap_or((part, ""));
            v.push((decode(k)?, decode(val)?));
        }
        Ok(Self(v))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A non-negative integer parameter (default if absent, error if not a
    /// number).
    pub fn usize(&self, key: &str, default: usize) -> Result<usize, String> {
        match self.get(key) {
            None | Some("") => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("{key} must be a non-negative integer")),
        }
    }

    /// `offset` and `limit`, the limit capped at [`MAX_LIMIT`] (0 is an
    /// error: it would page forever).
    pub fn page(&self, default_limit: usize) -> Result<(usize, usize), String> {
        let offset = self.usize("offset", 0)?;
        let limit = self.usize("limit", default_limit)?;
        if limit == 0 {
            return Err("limit must be at least 1".into());
        }
        Ok((offset, limit.min(MAX_LIMIT)))
    }
}

fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| "malformed %-escape".to_string())?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "query is not UTF-8".to_string())
}

/// Route one request head. Pure: what it returns depends only on the
/// request and the state it reads.
pub fn route(head: &str, broker: &Broker, files: &ClusterFiles) -> Response {
    let mut line = head.lines().next().unwrap_or("").split(' ');
    let (method, target) = (line.next().unwrap_or(""), line.next().unwrap_or(""));
    if method != "GET" && method != "HEAD" {
        return Response {
            status: "405 Method Not Allowed",
            ctype: "text/plain",
            body: "read-only: GET only\n".into(),
        };
    }
    if !target.starts_with('/') {
        return Response::bad_request("request target must be a path");
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let q = match Query::parse(query) {
        Ok(q) => q,
        Err(e) => return Response::bad_request(&e),
    };
    let t = kaas_actors::telemetry::global();
    let r = match path {
        "/metrics" => Ok(Response::ok(
            "text/plain; version=0.0.4",
            t.render_prometheus()
                + &lag::prometheus(broker)
                + &crate::conn::prometheus(broker)
                + &api::cluster_prometheus(broker),
        )),
        "/actors" => Ok(Response::ok(
            "application/json",
            serde_json::to_string(&t.actors()).unwrap_or_default(),
        )),
        "/api/actors" => api::actors(broker, &q).map(|v| Response::json(&v)),
        "/api/cluster" => api::cluster(broker, files, &q).map(|v| Response::json(&v)),
        "/api/partitions" => api::partitions(broker, &q).map(|v| Response::json(&v)),
        "/api/series" => Ok(Response::json(&serde_json::json!({
            "broker_id": broker.shared.broker_id,
            "points": t.series.points(),
        }))),
        _ => return assets::get(path).unwrap_or_else(Response::not_found),
    };
    r.unwrap_or_else(|e| Response::bad_request(&e))
}

/// Serve the listener until the process ends.
pub async fn serve(l: TcpListener, broker: Arc<Broker>, files: Arc<ClusterFiles>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNS));
    loop {
        let Ok((mut sock, _)) = l.accept().await else {
            // Out of descriptors accept fails at once: do not spin.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        // A data-plane descriptor: refused when its budget is spent.
        let Ok(fd) = broker.fd_budget.try_acquire() else {
            drop(sock);
            continue;
        };
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (broker, files) = (broker.clone(), files.clone());
        tokio::task::spawn_local(async move {
            let _permit = (permit, fd);
            let Some(head) = read_head(&mut sock).await else {
                let r = Response::bad_request("malformed or oversized request");
                let _ = write(&mut sock, &r, false).await;
                return;
            };
            let head_only = head.starts_with("HEAD ");
            let r = route(&head, &broker, &files);
            let _ = write(&mut sock, &r, head_only).await;
        });
    }
}

/// Read up to the end of the request head (bounded in size and time).
async fn read_head(sock: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::with_capacity(1024);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut chunk = [0u8; 1024];
    loop {
        let n = tokio::time::timeout_at(deadline, sock.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            break;
        }
        if buf.len() > MAX_REQUEST {
            return None;
        }
    }
    if buf.is_empty() {
        return None;
    }
    String::from_utf8(buf).ok()
}

async fn write(
    sock: &mut tokio::net::TcpStream,
    r: &Response,
    head_only: bool,
) -> std::io::Result<()> {
    // Every /api answer may be read by another broker's dashboard page.
    let head = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nAccess-Control-Allow-Origin: *\r\nConnection: close\r\n\r\n",
        r.status,
        r.ctype,
        r.body.len()
    );
    sock.write_all(head.as_bytes()).await?;
    if !head_only {
        sock.write_all(r.body.as_bytes()).await?;
    }
    sock.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode_and_bad_ones_are_errors() {
        let q = Query::parse("topic=a%2Db&limit=5&x").unwrap();
        assert_eq!(q.get("topic"), Some("a-b"));
        assert_eq!(q.page(50).unwrap(), (0, 5));
        assert_eq!(q.get("x"), Some(""));
        assert!(Query::parse("a=%zz").is_err());
        assert!(Query::parse("a=%4").is_err());
        assert!(Query::parse("a=%ff").is_err(), "not UTF-8");
        let q = Query::parse("offset=-1").unwrap();
        assert!(q.page(10).is_err());
        let q = Query::parse("limit=0").unwrap();
        assert!(q.page(10).is_err());
        let q = Query::parse("limit=99999999999999999999999").unwrap();
        assert!(q.page(10).is_err());
        let q = Query::parse("limit=5000").unwrap();
        assert_eq!(q.page(10).unwrap(), (0, MAX_LIMIT));
    }
}
