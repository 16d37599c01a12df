//! The served agent watches itself: grpc.health.v1 behind the same mutual TLS, and /metrics
//! counting the gRPC requests it answered (the binary, in dry run).
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use cgloop_proto::v1::node_agent_service_client::NodeAgentServiceClient;
use cgloop_proto::v1::GetStateRequest;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const BIN: &str = env!("CARGO_BIN_EXE_cgloop-node-agent");

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `serve --dry-run` on ephemeral ports; returns the gRPC and metrics addresses.
fn start(dir: &Path) -> (Agent, SocketAddr, SocketAddr) {
    let certs = dir.join("certs");
    let ok = Command::new(BIN).args(["certs", "--out"]).arg(&certs).output().unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let mut child = Command::new(BIN)
        .args(["serve", "--dry-run", "--listen", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
        .arg("--tls-dir")
        .arg(&certs)
        .arg("--journal")
        .arg(dir.join("journal"))
        .env("CGLOOP_LOG_FORMAT", "json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let agent = Agent(child);
    // The metrics line (JSON, from CGLOOP_LOG_FORMAT) comes before the server listens.
    let mut metrics = None;
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        if let Some(addr) = v["addr"].as_str().filter(|_| v["message"].as_str().unwrap().starts_with("metrics on")) {
            metrics = Some(addr.parse().unwrap());
            break;
        }
    }
    std::thread::spawn(move || lines.for_each(drop)); // keep the pipe drained
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let grpc = line.split_whitespace().nth(3).unwrap_or_else(|| panic!("{line}")).parse().unwrap();
    (agent, grpc, metrics.expect("a metrics line"))
}

async fn channel(addr: SocketAddr, certs: &Path) -> Channel {
    let read = |n: &str| std::fs::read(certs.join(n)).unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read("ca.pem")))
        .identity(Identity::from_pem(read("client.pem"), read("client.key")))
        .domain_name("localhost");
    Endpoint::from_shared(format!("https://{addr}")).unwrap().tls_config(tls).unwrap().connect().await.unwrap()
}

fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test]
async fn health_and_metrics_of_a_serving_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (_agent, grpc, metrics) = start(dir.path());
    let channel = channel(grpc, &dir.path().join("certs")).await;
    let mut health = HealthClient::new(channel.clone());
    for service in ["", "cgloop.v1.NodeAgentService"] {
        let r = health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }
    let unknown = health.check(HealthCheckRequest { service: "cgloop.v1.Nope".into() }).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    NodeAgentServiceClient::new(channel).get_state(GetStateRequest::default()).await.unwrap();
    let body = tokio::task::spawn_blocking(move || scrape(metrics)).await.unwrap();
    assert!(body.contains("cgloop_node_agent_grpc_requests_total{method=\"GetState\",code=\"OK\"} 1"), "{body}");
    assert!(body.contains("cgloop_node_agent_guard_moves_total{kind=\"promote\"} 0"), "{body}");
    assert!(body.contains("cgloop_node_agent_micro_loop_acting"), "{body}");
}

/// The default endpoint is the one proto/cgloop/v1/ops.proto declares for the agent.
#[test]
fn the_default_metrics_endpoint_is_the_declared_one() {
    let want = cgloop_proto::ops::default_metrics_addr(cgloop_proto::ops::Daemon::NodeAgent);
    let out = Command::new(BIN).args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains(&format!("[default: {want}]")), "{help}");
    assert!(help.contains("CGLOOP_LOG_FORMAT"), "{help}");
}
