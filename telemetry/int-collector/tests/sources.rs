//! Where reports may come from (issue 17, finding 3): the collector listens on loopback unless
//! told otherwise, refuses to listen beyond it without naming its sources, and drops (unparsed,
//! counted) every datagram from a source outside `--allow-source`.

use cgloop_int_collector::gen::{GenConfig, Generator};
use cgloop_int_collector::parse::IntDetect;
use cgloop_int_collector::recv::{self, Cidr, SourceFilter, Stats};
use cgloop_int_collector::state::EventConfig;
use std::net::{IpAddr, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::BIN;

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

#[test]
fn cidrs_parse_and_match_like_addresses_do() {
    let net: Cidr = "10.1.0.0/16".parse().unwrap();
    assert!(net.contains("10.1.200.3".parse().unwrap()));
    assert!(!net.contains("10.2.0.1".parse().unwrap()));
    assert!(net.contains("::ffff:10.1.0.9".parse().unwrap()), "an IPv4-mapped source is its IPv4 address");
    let host: Cidr = "192.0.2.7".parse().unwrap();
    assert_eq!(host.to_string(), "192.0.2.7/32");
    assert!(!host.contains("192.0.2.8".parse().unwrap()));
    let v6: Cidr = "2001:db8::/32".parse().unwrap();
    assert!(v6.contains("2001:db8:1::1".parse().unwrap()) && !v6.contains("10.1.0.1".parse().unwrap()));
    assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains("203.0.113.1".parse().unwrap()));
    for bad in ["10.0.0.0/33", "switch-1", "10.0.0.0/x", ""] {
        assert!(bad.parse::<Cidr>().is_err(), "{bad}");
    }
    let only = SourceFilter::only(vec![net, host]);
    assert!(only.allows(ip("192.0.2.7")) && !only.allows(ip("127.0.0.1")) && !only.allows(None));
    assert!(SourceFilter::any().allows(None));
}

/// Runs one filtered worker on a loopback socket, sends `n` generated reports from
/// 127.0.0.1, and returns the stats and the records exported.
fn collect(sources: SourceFilter, n: usize) -> (serde_json::Value, usize) {
    let sock = recv::bind_reuseport("127.0.0.1:0".parse().unwrap(), 1 << 20).unwrap();
    let addr = sock.local_addr().unwrap();
    let stats = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = crossbeam_channel::unbounded();
    let worker = {
        let (stats, stop) = (stats.clone(), stop.clone());
        std::thread::spawn(move || {
            recv::filtered_worker(sock, IntDetect::default(), EventConfig::default(), "t".into(), stats, stop, tx, 64, sources)
        })
    };
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut gen = Generator::new(GenConfig::default());
    let mut buf = Vec::new();
    for _ in 0..n {
        gen.next_packet(&mut buf);
        sender.send_to(&buf, addr).unwrap();
    }
    // Every datagram is either refused or received (the worker publishes every 10 ms).
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen = || stats.refused_source.load(Ordering::Relaxed) + stats.packets.load(Ordering::Relaxed);
    while seen() < n as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap().unwrap();
    let records = rx.try_iter().map(|b| b.len()).sum();
    (stats.snapshot(), records)
}

#[test]
fn reports_from_sources_outside_the_allow_list_are_dropped_unparsed_and_counted() {
    let (snap, records) = collect(SourceFilter::only(vec!["10.0.0.0/8".parse().unwrap()]), 50);
    assert_eq!(snap["refused_source"], 50, "{snap}");
    assert_eq!((snap["packets"].as_u64(), snap["reports"].as_u64(), records), (Some(0), Some(0), 0), "{snap}");

    let (snap, records) = collect(SourceFilter::only(vec!["127.0.0.0/8".parse().unwrap()]), 50);
    assert_eq!((snap["refused_source"].as_u64(), snap["packets"].as_u64()), (Some(0), Some(50)), "{snap}");
    assert!(records > 0, "{snap}");
}

#[test]
fn the_collector_listens_on_loopback_by_default() {
    let out = Command::new(BIN).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("[default: 127.0.0.1:32766]"), "{help}");
    assert!(help.contains("--allow-source <CIDR>") && help.contains("--allow-any-source"), "{help}");
}

#[test]
fn listening_beyond_loopback_needs_named_sources() {
    let out = Command::new(BIN).args(["run", "--listen", "0.0.0.0:0", "--duration", "0"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {err}");
    assert!(err.contains("--allow-source") && err.contains("0.0.0.0:0"), "{err}");
    // Explicitly open, or restricted: it starts (and stops at once with --duration 0).
    for extra in [["--allow-any-source"].as_slice(), ["--allow-source", "192.0.2.0/24"].as_slice()] {
        let out = Command::new(BIN)
            .args(["run", "--listen", "0.0.0.0:0", "--workers", "1", "--duration", "0"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// The binary end to end: reports from a source outside `--allow-source` create nothing.
#[test]
fn the_binary_drops_reports_from_unlisted_sources() {
    let (child, listening) =
        common::start(&["--listen", "127.0.0.1:0", "--workers", "1", "--allow-source", "192.0.2.0/24", "--duration", "3"]);
    assert_eq!(listening["allow_sources"], serde_json::json!(["192.0.2.0/24"]), "{listening}");
    let addr: std::net::SocketAddr = listening["listen"].as_str().unwrap().parse().unwrap();
    let sender = common::send_reports(addr, 20);
    sender.send_to(&[0xff; 64], addr).unwrap(); // random bytes, too
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["refused_source"], 21, "{summary}");
    assert_eq!((summary["packets"].as_u64(), summary["malformed"].as_u64()), (Some(0), Some(0)), "{summary}");
    assert_eq!(summary["exported"], 0, "{summary}");
}
