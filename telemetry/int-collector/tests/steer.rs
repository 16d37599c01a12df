//! `--steer flow`: per-hop reports (v0.5 postcards, v2.0 INT-MX) of one flow, sent by
//! different switches (different source ports), all reach the same SO_REUSEPORT socket, and
//! the flows spread over the sockets. Runs in a network namespace of its own (unshare of the
//! test thread); skipped without root.

use cgloop_int_collector::gen::{GenConfig, Generator, Mode};
use cgloop_int_collector::parse::{parse_packet, FlowKey, Format, IntDetect};
use cgloop_int_collector::{recv, steer};
use std::collections::{HashMap, HashSet};
use std::net::UdpSocket;

const SOCKETS: usize = 3;

/// Sends every report of `cfg` from the socket of its reporting switch; returns, per flow,
/// the receiving socket indexes.
fn deliveries(cfg: GenConfig, steered: bool) -> HashMap<FlowKey, HashSet<usize>> {
    // Without the program the kernel hashes by sender: one flow's switches split up.
    let first = recv::bind_reuseport("127.0.0.1:0".parse().unwrap(), 1 << 20).unwrap();
    let addr = first.local_addr().unwrap();
    let mut socks = vec![first];
    for _ in 1..SOCKETS {
        socks.push(recv::bind_reuseport(addr, 1 << 20).unwrap());
    }
    if steered {
        steer::attach(&socks[0], SOCKETS as u32).expect("attaching the steering program");
    }
    let mut senders: HashMap<u32, UdpSocket> = HashMap::new();
    let mut gen = Generator::new(cfg);
    let detect = IntDetect::default();
    let mut buf = Vec::new();
    for _ in 0..400 {
        gen.next_packet(&mut buf);
        let mut node = 0;
        parse_packet(&buf, &detect, &mut |r| node = r.unwrap().node_id).unwrap();
        let s = senders.entry(node).or_insert_with(|| {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.connect(addr).unwrap();
            s
        });
        s.send(&buf).unwrap();
    }
    let mut seen: HashMap<FlowKey, HashSet<usize>> = HashMap::new();
    let mut data = vec![0u8; recv::MAX_DATAGRAM];
    for (i, s) in socks.iter().enumerate() {
        // Read timeout 10 ms (bind_reuseport): drained once it times out.
        while let Ok(n) = s.recv(&mut data) {
            parse_packet(&data[..n], &detect, &mut |r| {
                if let Some(f) = r.unwrap().inner.flow {
                    seen.entry(f).or_default().insert(i);
                }
            })
            .unwrap();
        }
    }
    seen
}

fn in_own_netns(f: impl FnOnce() + Send + 'static) -> bool {
    std::thread::spawn(move || {
        // SAFETY: unshare affects only this thread (network namespaces are per task).
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return false;
        }
        // Children forked from this thread start in its namespace.
        let up = std::process::Command::new("ip").args(["link", "set", "lo", "up"]).status();
        if !matches!(up, Ok(s) if s.success()) {
            return false;
        }
        f();
        true
    })
    .join()
    .expect("steering test thread panicked")
}

#[test]
fn per_hop_reports_of_a_flow_meet_on_one_socket() {
    let ran = in_own_netns(|| {
        for (format, mode) in [(Format::V05, Mode::Md), (Format::V20, Mode::Mx)] {
            let cfg = GenConfig { format, mode, flows: 12, hops: 3, ..GenConfig::default() };
            let seen = deliveries(cfg, true);
            assert_eq!(seen.len(), 12, "{format:?}/{mode:?}: every flow arrived");
            for (flow, socks) in &seen {
                assert_eq!(socks.len(), 1, "{format:?}/{mode:?}: {flow:?} reached sockets {socks:?}");
            }
            let used: HashSet<usize> = seen.values().flatten().copied().collect();
            assert!(used.len() >= 2, "{format:?}/{mode:?}: flows spread over the sockets: {used:?}");
        }
    });
    if !ran {
        eprintln!("skipped: needs root for a private network namespace (unshare CLONE_NEWNET) and `ip`");
    }
}
