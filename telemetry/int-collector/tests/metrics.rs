//! The binary's /metrics endpoint (on by default; --metrics-addr moves or disables it).
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cgloop_int_collector::gen::{GenConfig, Generator};

const BIN: &str = env!("CARGO_BIN_EXE_cgloop-int-collector");

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
    let mut child = Command::new(BIN)
        .args(["run", "--listen", "127.0.0.1:0", "--workers", "1", "--duration", "5"])
        .args(["--allow-source", "127.0.0.1", "--metrics-addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let listening: serde_json::Value = serde_json::from_str(&line).unwrap();
    let addr: SocketAddr = listening["listen"].as_str().unwrap().parse().unwrap();
    let metrics: SocketAddr = listening["metrics"].as_str().expect("metrics address").parse().unwrap();
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut gen = Generator::new(GenConfig::default());
    let mut buf = Vec::new();
    for _ in 0..10 {
        gen.next_packet(&mut buf);
        sender.send_to(&buf, addr).unwrap();
    }
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
    // Disabled: no endpoint, no warning.
    let out = Command::new(BIN)
        .args(["run", "--listen", "127.0.0.1:0", "--workers", "1", "--duration", "0.2", "--metrics-addr", ""])
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
