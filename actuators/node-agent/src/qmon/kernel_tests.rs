//! The monitor against the real kernel: a private network namespace (this test's thread and the
//! sampler it starts), HTB on its loopback with one slow class, a burst of UDP through it.
//! Needs root; prints "skipped: needs root" otherwise.
use std::sync::Arc;
use std::time::Duration;

use libbpf_rs::{MapCore, MapFlags};

use super::Monitor;
use crate::config::QueueSettings;
use crate::datapath::Datapath;
use crate::queue_view::QueueView;
use crate::tc::{ClassSpec, KernelHtbRoot, Rtnl};

const LO: u32 = 1;
const ROOT: u32 = 0x10001;

/// The newest tick, waiting for one (a loaded machine can hold the sampler past the
/// staleness limit; that is the limit working, not what this test is about).
fn fresh(m: &Monitor) -> Arc<crate::queue_view::QueueTick> {
    for _ in 0..2000 {
        if let Some(t) = m.latest() {
            return t;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no fresh tick within ~2 s: {}", m.fault())
}
const SLOW: u32 = 0x10010;

#[test]
fn ticks_and_samples_see_a_queue_build_and_drain() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    // A thread of its own: unshare(CLONE_NEWNET) moves only the calling thread, and the
    // sampler thread it spawns inherits the namespace.
    std::thread::spawn(|| {
        // SAFETY: plain syscall; affects this thread only.
        assert_eq!(
            unsafe { libc::unshare(libc::CLONE_NEWNET) },
            0,
            "unshare(CLONE_NEWNET)"
        );
        run_in_namespace();
    })
    .join()
    .expect("the namespace thread");
}

fn run_in_namespace() {
    let mut rtnl = Rtnl::open().unwrap();
    rtnl.set_up(LO).unwrap();
    rtnl.replace_htb_root(
        LO,
        KernelHtbRoot {
            handle: 0x10000,
            default_minor: 0x10,
        },
    )
    .unwrap();
    let class = |handle, parent, rate: u64| ClassSpec {
        handle,
        parent,
        rate_bytes: rate,
        ceil_bytes: rate,
        burst_bytes: 1600,
        cburst_bytes: 1600,
        prio: 0,
    };
    rtnl.set_class(LO, &class(ROOT, 0x10000, 62_500), true)
        .unwrap();
    rtnl.set_class(LO, &class(SLOW, ROOT, 62_500), true)
        .unwrap(); // 0.5 Mbit/s
    let dp = Datapath::load().unwrap();
    let maps = dp.qmon_maps().unwrap();
    maps.if_default
        .update(&LO.to_ne_bytes(), &SLOW.to_ne_bytes(), MapFlags::ANY)
        .unwrap();
    let settings = QueueSettings {
        class_stats_interval_us: 1000,
        ..Default::default()
    };
    let m = Arc::new(Monitor::start(&settings, maps, dp.qmon_attach_error.clone(), None).unwrap());
    std::thread::sleep(Duration::from_millis(50));
    let t = fresh(&m);
    assert!(t.class(LO, SLOW).is_some(), "the leaf is monitored: {t:?}");
    assert!(t.class(LO, ROOT).is_none(), "inner classes are not");

    // 60 × 1000 bytes at 0.5 Mbit/s: ~1 s of queue (few enough for the socket's send buffer).
    // A bound receiver, so no ICMP port-unreachable joins the queue.
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..60 {
        s.send_to(&[0u8; 1000], rx.local_addr().unwrap()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(150));
    let t = fresh(&m);
    let c = t.class(LO, SLOW).unwrap();
    assert!(c.backlog_packets > 10 && c.backlog_bytes > 10_000, "{c:?}");
    // The backlog ahead drains at the class's 0.5 Mbit/s.
    let expect = c.backlog_bytes as f64 * 8.0 / 0.5e6 * 1e9;
    let rel = (c.queue_delay_ns as f64 - expect).abs() / expect;
    assert!(
        rel < 0.3,
        "estimate {} ns vs backlog/rate {expect} ns",
        c.queue_delay_ns
    );

    std::thread::sleep(Duration::from_millis(1500));
    let t = fresh(&m);
    assert_eq!(t.class(LO, SLOW).unwrap().backlog_packets, 0, "drained");
    let samples = m.take_samples();
    let q = samples.iter().find(|q| q.class_id == SLOW).unwrap();
    // A loaded machine may still be sending the last packets (the socket buffer blocks).
    assert!(
        q.interface_name == "lo" && (50..=60).contains(&q.sojourn_packets),
        "{q:?}"
    );
    // The HTB rate sets the sojourns: the last of 60 packets waited ~1 s, the median ~0.5 s.
    assert!(
        q.sojourn_max_ns > 700_000_000 && q.sojourn_max_ns < 1_600_000_000,
        "{q:?}"
    );
    assert!(
        q.sojourn_p50_ns > 250_000_000 && q.sojourn_p50_ns < 800_000_000,
        "{q:?}"
    );
    assert!(
        q.sojourn_p99_ns >= q.sojourn_p50_ns && q.max_backlog_bytes > 10_000,
        "{q:?}"
    );
    assert!(q.sent_packets >= 60, "kernel counters read: {q:?}");
    let again = m.take_samples();
    assert_eq!(
        again
            .iter()
            .find(|q| q.class_id == SLOW)
            .unwrap()
            .sojourn_packets,
        0,
        "reset per interval"
    );
}
