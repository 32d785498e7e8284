//! The exporter's HTTP side: `GET /metrics` and `GET /healthz`, nothing else.
//!
//! Read-only by construction: requests are parsed only for their method and path, bodies are
//! never read, and every response is built from the last refresh's cached text. Requests are
//! bounded in size and time so a slow or hostile client cannot hold the daemon.

use std::{sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::watch,
};

use super::exporter::Exporter;

/// What `/metrics` serves: the last encoded text, and whether the exporter is healthy.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub metrics: Arc<String>,
    pub healthy: bool,
}

impl Snapshot {
    /// What is served before the first refresh: the exporter's own series (build info, no
    /// refresh yet), and not healthy until a refresh has read the counters, as `/healthz` says.
    pub fn starting(exporter: &Exporter) -> Self {
        let metrics = exporter.encode().unwrap_or_else(|err| {
            log::warn!("encoding metrics: {err}");
            String::new()
        });
        Self {
            metrics: Arc::new(metrics),
            healthy: false,
        }
    }
}

/// `topdown_up` in the text exposition format 0.0.4
/// (<https://prometheus.io/docs/instrumenting/exposition_formats/>): 1 exactly when `/healthz`
/// answers 200. It is written from the same flag `/healthz` reads, so the two never disagree,
/// and a failed refresh (which keeps the last series) shows as 0 without re-encoding them.
fn up_series(healthy: bool) -> &'static str {
    if healthy {
        concat!(
            "# HELP topdown_up Whether the last refresh read the counters (1) or failed or has not run yet (0)\n",
            "# TYPE topdown_up gauge\n",
            "topdown_up 1\n"
        )
    } else {
        concat!(
            "# HELP topdown_up Whether the last refresh read the counters (1) or failed or has not run yet (0)\n",
            "# TYPE topdown_up gauge\n",
            "topdown_up 0\n"
        )
    }
}

const MAX_REQUEST: usize = 8 * 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The Prometheus text exposition format the `prometheus` crate's encoder writes.
const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The first line's method and path, once the header is complete.
fn request_target(head: &[u8]) -> Option<(&str, &str)> {
    let text = std::str::from_utf8(head).ok()?;
    let line = text.lines().next()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?;
    let target = parts.next()?;
    let path = target.split('?').next().unwrap_or(target);
    Some((method, path))
}

/// The status line, content type and body for a request.
pub fn respond(
    method: &str,
    path: &str,
    snapshot: &Snapshot,
) -> (&'static str, &'static str, String) {
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => (
            "200 OK",
            EXPOSITION,
            format!("{}{}", snapshot.metrics, up_series(snapshot.healthy)),
        ),
        ("GET" | "HEAD", "/healthz") if snapshot.healthy => {
            ("200 OK", "text/plain; charset=utf-8", "ok\n".to_owned())
        }
        ("GET" | "HEAD", "/healthz") => (
            "503 Service Unavailable",
            "text/plain; charset=utf-8",
            "not counting\n".to_owned(),
        ),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "topdown serves /metrics and /healthz\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "read-only: GET /metrics or /healthz\n".to_owned(),
        ),
    }
}

async fn handle(mut stream: TcpStream, snapshots: watch::Receiver<Snapshot>) -> Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buffer = [0u8; 1024];
    let complete = tokio::time::timeout(REQUEST_TIMEOUT, async {
        loop {
            let read = stream.read(&mut buffer).await?;
            if read == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            head.extend_from_slice(&buffer[..read]);
            if head.windows(4).any(|window| window == b"\r\n\r\n") {
                return Ok(true);
            }
            if head.len() > MAX_REQUEST {
                return Ok(false);
            }
        }
    })
    .await;
    let (status, content_type, body) = match complete {
        Ok(Ok(true)) => match request_target(&head) {
            Some((method, path)) => {
                let snapshot = snapshots.borrow().clone();
                let (status, content_type, body) = respond(method, path, &snapshot);
                let body = if method == "HEAD" {
                    String::new()
                } else {
                    body
                };
                (status, content_type, body)
            }
            None => ("400 Bad Request", "text/plain", "bad request\n".to_owned()),
        },
        Ok(Ok(false)) => ("400 Bad Request", "text/plain", "bad request\n".to_owned()),
        Ok(Err(_)) | Err(_) => return Ok(()),
    };
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(header.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await.ok();
    Ok(())
}

/// Accepts connections until the task is dropped; each is served on its own task.
pub async fn serve(listener: TcpListener, snapshots: watch::Receiver<Snapshot>) -> Result<()> {
    loop {
        let (stream, _) = listener.accept().await.context("accepting a connection")?;
        let snapshots = snapshots.clone();
        tokio::spawn(async move {
            if let Err(err) = handle(stream, snapshots).await {
                log::debug!("serving a request: {err:#}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_two_paths_and_only_reads() {
        let snapshot = Snapshot {
            metrics: Arc::new("# EOF\n".to_owned()),
            healthy: true,
        };
        assert_eq!(respond("GET", "/metrics", &snapshot).0, "200 OK");
        assert_eq!(
            respond("GET", "/metrics", &snapshot).2,
            "# EOF\n# HELP topdown_up Whether the last refresh read the counters (1) or failed or has not run yet (0)\n# TYPE topdown_up gauge\ntopdown_up 1\n"
        );
        assert_eq!(respond("GET", "/healthz", &snapshot).0, "200 OK");
        assert_eq!(respond("GET", "/", &snapshot).0, "404 Not Found");
        assert_eq!(
            respond("POST", "/metrics", &snapshot).0,
            "405 Method Not Allowed"
        );
        let unhealthy = Snapshot::default();
        assert_eq!(
            respond("GET", "/healthz", &unhealthy).0,
            "503 Service Unavailable"
        );
        assert_eq!(
            request_target(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(request_target(b"\xff\xfe"), None);
    }

    /// Before the first refresh `/metrics` already describes the exporter, and says down
    /// exactly while `/healthz` says unavailable.
    #[test]
    fn the_starting_snapshot_serves_the_exporters_own_series_and_down() {
        let exporter = Exporter::new(
            "intel-icl".into(),
            true,
            crate::commands::serve::exporter::Limits {
                max_series: 10,
                ttl: Duration::from_secs(60),
            },
        );
        let starting = Snapshot::starting(&exporter);
        assert_eq!(
            respond("GET", "/healthz", &starting).0,
            "503 Service Unavailable"
        );
        let (status, content_type, body) = respond("GET", "/metrics", &starting);
        assert_eq!((status, content_type), ("200 OK", EXPOSITION));
        let lines: Vec<&str> = body.lines().collect();
        let info = format!(
            r#"topdown_build_info{{model="intel-icl",synthetic="true",version="{}"}} 1"#,
            env!("CARGO_PKG_VERSION")
        );
        assert!(lines.contains(&info.as_str()), "{body}");
        assert!(lines.contains(&"topdown_refreshes_total 0"), "{body}");
        assert!(lines.contains(&"topdown_up 0"), "{body}");
        assert!(!lines.contains(&"topdown_up 1"), "{body}");
        let healthy = Snapshot {
            healthy: true,
            ..starting
        };
        let body = respond("GET", "/metrics", &healthy).2;
        assert!(body.lines().any(|line| line == "topdown_up 1"), "{body}");
        assert_eq!(respond("GET", "/healthz", &healthy).0, "200 OK");
    }
}
