//! The binary's /metrics endpoint (on by default; --metrics-addr moves or disables it).
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::BIN;

fn get(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Refused sources and parsed reports show on /metrics while the collector runs.
#[test]
fn metrics_count_refused_and_parsed_reports() {
    let (mut child, listening) = common::start(&[
        "--listen", "127.0.0.1:0", "--workers", "1", "--duration", "5",
        "--allow-source", "127.0.0.1", "--metrics-addr", "127.0.0.1:0",
    ]);
    let addr: SocketAddr = listening["listen"].as_str().unwrap().parse().unwrap();
    let metrics: SocketAddr = listening["metrics"].as_str().expect("metrics address").parse().unwrap();
    let sender = common::send_reports(addr, 10);
    sender.send_to(&[0xff; 3], addr).unwrap(); // too short to be a report
    let deadline = Instant::now() + Duration::from_secs(4);
    let body = loop {
        let body = get(metrics);
        if body.contains("cgloop_int_collector_reports_parsed_total 10") || Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(body.contains("cgloop_int_collector_datagrams_received_total 11"), "{body}");
    assert!(body.contains("cgloop_int_collector_reports_parsed_total 10"), "{body}");
    assert!(body.contains("cgloop_int_collector_reports_refused_total{reason="), "{body}");
    assert!(body.contains("cgloop_int_collector_records_produced_total"), "{body}");
    assert!(body.contains("cgloop_int_collector_socket_drops_total 0"), "{body}");
}

/// A metrics port in use: one warning line, and the collector runs on.
#[test]
fn a_metrics_port_in_use_is_logged_and_the_collector_runs() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let out = Command::new(BIN)
        .args(["run", "--listen", "127.0.0.1:0", "--workers", "1", "--duration", "0.2"])
        .args(["--metrics-addr", &port, "--log-format", "json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warnings: Vec<serde_json::Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["level"] == "WARN")
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(warnings[0]["message"].as_str().unwrap().contains(&port), "{stderr}");
    // Disabled (here by the collector's variable): no endpoint, no warning.
    let out = Command::new(BIN)
        .args(["run", "--listen", "127.0.0.1:0", "--workers", "1", "--duration", "0.2"])
        .env("CGLOOP_INT_COLLECTOR_METRICS_ADDR", "off")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("WARN"), "{stderr}");
    assert!(stderr.contains("\"metrics\":null"), "{stderr}");
}

/// The default endpoint is the one proto/cgloop/v1/ops.proto declares for the collector.
#[test]
fn the_default_endpoint_is_the_declared_one() {
    let want = cgloop_proto::ops::default_metrics_addr(cgloop_proto::ops::Daemon::IntCollector);
    let out = Command::new(BIN).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains(&format!("[default: {want}]")), "{help}");
    assert!(help.contains("CGLOOP_LOG_FORMAT"), "{help}");
}

/// Logs to a closed stderr are dropped: the collector runs on (a refused source is logged).
#[test]
fn a_closed_log_pipe_does_not_stop_the_collector() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(BIN)
        .args(["run", "--listen", "127.0.0.1:0", "--workers", "1", "--duration", "1.5"])
        .args(["--allow-source", "192.0.2.0/24", "--metrics-addr", ""])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap()).read_line(&mut line).unwrap(); // then closed
    let listening: serde_json::Value = serde_json::from_str(&line).unwrap();
    let addr: SocketAddr = listening["listen"].as_str().unwrap().parse().unwrap();
    common::send_reports(addr, 3);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["refused_source"], 3, "{summary}");
}
