//! Rust gRPC client for bench/node-agent: the same SetFlowClass calls as the Python client,
//! without the Python gRPC stack, so the agent's own share of the latency is visible.
//!
//! `bench_client <unix socket> <tls dir> <interface> <src ip> <dst ip>`, then one command per
//! stdin line, one answer line each:
//! * `F <action id> <class id> <sport> <dport> <dscp>`: one SetFlowClass rewriting to `dscp`;
//!   answers `<send time, CLOCK_REALTIME ns> <round trip ns> <apply_latency_ns>`.
//! * `T <n> <class id> <first action number>`: n sequential SetFlowClass on distinct flows;
//!   answers the n round trips in ns, space separated.

use std::io::BufRead;
use std::net::Ipv4Addr;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use cgloop_proto::host::now_ns;
use cgloop_proto::v1::node_agent_service_client::NodeAgentServiceClient;
use cgloop_proto::v1::{FiveTuple, FlowClassRule, SetFlowClassRequest};
use hyper_util::rt::TokioIo;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

async fn connect(socket: String, tls_dir: &str) -> Result<NodeAgentServiceClient<Channel>> {
    let read = |n: &str| std::fs::read(format!("{tls_dir}/{n}")).with_context(|| format!("reading {tls_dir}/{n}"));
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read("ca.pem")?))
        .identity(Identity::from_pem(read("client.pem")?, read("client.key")?))
        .domain_name("localhost");
    let channel = Endpoint::from_static("https://localhost")
        .tls_config(tls)?
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
        }))
        .await
        .context("connecting to the agent")?;
    Ok(NodeAgentServiceClient::new(channel))
}

fn arg<T: std::str::FromStr>(it: &mut std::str::SplitWhitespace<'_>, what: &str) -> Result<T> {
    it.next().and_then(|s| s.parse().ok()).with_context(|| format!("missing or bad {what}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 6 {
        bail!("usage: bench_client <unix socket> <tls dir> <interface> <src ip> <dst ip>");
    }
    let mut client = connect(args[1].clone(), &args[2]).await?;
    let iface = args[3].clone();
    let src: Ipv4Addr = args[4].parse().context("src ip")?;
    let dst: Ipv4Addr = args[5].parse().context("dst ip")?;
    let rule = |class_id: u32, sport: u32, dport: u32, dscp: Option<u32>| FlowClassRule {
        interface_name: iface.clone(),
        flow: Some(FiveTuple {
            src_addr: src.octets().to_vec(),
            dst_addr: dst.octets().to_vec(),
            src_port: sport,
            dst_port: dport,
            ip_protocol: 17,
        }),
        class_id,
        rewrite_dscp: dscp,
        ..Default::default()
    };
    println!("ready");
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line?;
        let mut it = line.split_whitespace();
        match it.next() {
            Some("F") => {
                let id: String = arg(&mut it, "action id")?;
                let class: u32 = arg(&mut it, "class id")?;
                let sport: u32 = arg(&mut it, "sport")?;
                let dport: u32 = arg(&mut it, "dport")?;
                let dscp: u32 = arg(&mut it, "dscp")?;
                let req = SetFlowClassRequest { action_id: id, rule: Some(rule(class, sport, dport, Some(dscp))), dry_run: false };
                let t0 = now_ns();
                let started = Instant::now();
                let resp = client.set_flow_class(req).await?.into_inner();
                let rtt = started.elapsed().as_nanos();
                let inside = resp.outcome.map_or(0, |o| o.apply_latency_ns);
                println!("{t0} {rtt} {inside}");
            }
            Some("T") => {
                let n: u32 = arg(&mut it, "n")?;
                let class: u32 = arg(&mut it, "class id")?;
                let first: u32 = arg(&mut it, "first action number")?;
                let mut out = Vec::with_capacity(n as usize);
                for k in 0..n {
                    let req = SetFlowClassRequest {
                        action_id: format!("rt{}", first + k),
                        rule: Some(rule(class, 46000 + (first + k) % 1000, 9600, None)),
                        dry_run: false,
                    };
                    let started = Instant::now();
                    client.set_flow_class(req).await?;
                    out.push(started.elapsed().as_nanos().to_string());
                }
                println!("{}", out.join(" "));
            }
            Some(other) => bail!("unknown command {other:?}"),
            None => {}
        }
    }
    Ok(())
}
