//! Throughput benchmark (`cgloop-int-collector bench`, wrapped by bench/int-collector/run.sh).
//!
//! From memory (one core): the collector path (parse + state + event filter) over a pool of
//! generated report packets, side by side with two peers measured in the same run: parse only
//! (the parser's ceiling) and "export every report" (parse + one protobuf record per report,
//! what a store-everything collector does). Over loopback: the generator blasts the pool with
//! sendmmsg to (a) the collector's receive path and (b) a bare recvmmsg loop that only counts
//! datagrams: the kernel's UDP receive limit on this machine. Published anchors (INTCollector,
//! CNSM 2018: 1.2 M reports/s; AF_XDP collector, Vestin et al. 2019: ~3 M reports/s per core)
//! are printed as ratios.

use crate::gen::{GenConfig, Generator, Mode};
use crate::parse::{parse_packet, Format, IntDetect};
use crate::recv::{self, Batch, Stats};
use crate::state::{five_tuple, EventConfig, State};
use anyhow::{Context, Result};
use cgloop_proto::v1::{int_record, IntFlowRecord, IntRecord};
use prost::Message;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const INTCOLLECTOR_RPS: f64 = 1.2e6;
const AF_XDP_RPS: f64 = 3.0e6;

#[derive(clap::Args, Clone)]
pub struct BenchArgs {
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    #[arg(long, default_value_t = 10_000)]
    flows: u32,
    #[arg(long, default_value_t = 4)]
    hops: usize,
    /// Report packets in the pool (cycled).
    #[arg(long, default_value_t = 200_000)]
    pool: usize,
    /// Report format of the pool: v2.0 (INT-MD), v1.0, v0.5.
    #[arg(long, default_value = "v2.0")]
    format: String,
    /// Skip the loopback part.
    #[arg(long)]
    memory_only: bool,
    /// Collector workers (SO_REUSEPORT sockets) and sender threads in the loopback run.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Output JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn pool(a: &BenchArgs) -> Result<Vec<Vec<u8>>> {
    let format = match a.format.as_str() {
        "v2.0" => Format::V20,
        "v1.0" => Format::V10,
        "v0.5" => Format::V05,
        f => anyhow::bail!("unknown format {f:?}"),
    };
    let cfg = GenConfig { format, mode: Mode::Md, flows: a.flows, hops: a.hops, ..GenConfig::default() };
    let mut g = Generator::new(cfg);
    Ok((0..a.pool)
        .map(|_| {
            let mut b = Vec::new();
            g.next_packet(&mut b);
            b
        })
        .collect())
}

/// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), in seconds.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Run `f` over the pool until the thread used `seconds` of CPU; returns (reports per
/// CPU-second, reports per wall second, reports, records). "Per core" is per CPU-second of
/// the measuring thread: on a shared machine wall time also counts the time other processes
/// held the core (both are printed).
fn timed(pool: &[Vec<u8>], seconds: f64, mut f: impl FnMut(&[u8], u64) -> (u64, u64)) -> (f64, f64, u64, u64) {
    let start = Instant::now();
    let cpu0 = thread_cpu_s();
    let (mut reports, mut records) = (0u64, 0u64);
    // Simulated clock: 1 µs per packet, so periodic rules fire as in a 1 M reports/s stream.
    let mut t = 1_000_000_000u64;
    'outer: loop {
        for chunk in pool.chunks(4096) {
            for p in chunk {
                t += 1_000;
                let (a, b) = f(p, t);
                reports += a;
                records += b;
            }
            if thread_cpu_s() - cpu0 >= seconds {
                break 'outer;
            }
        }
    }
    let cpu = (thread_cpu_s() - cpu0).max(1e-9);
    (reports as f64 / cpu, reports as f64 / start.elapsed().as_secs_f64(), reports, records)
}

fn memory(pool: &[Vec<u8>], seconds: f64) -> serde_json::Value {
    let detect = IntDetect::default();
    let (parse_rps, parse_wall, _, _) = timed(pool, seconds, |p, _| {
        let mut n = 0;
        let _ = parse_packet(p, &detect, &mut |r| {
            if let Ok(r) = r {
                n += 1;
                // Decode the stack too, as the collector does.
                for h in r.inner.int.iter().flat_map(|i| i.hops()) {
                    std::hint::black_box(&h);
                }
                std::hint::black_box(&r);
            }
        });
        (n, 0)
    });
    let mut state = State::new(EventConfig::default(), "bench");
    let mut out: Vec<IntRecord> = Vec::new();
    let mut last_tick = 0u64;
    let (coll_rps, coll_wall, reports, records) = timed(pool, seconds, |p, t| {
        let mut n = 0;
        let _ = parse_packet(p, &detect, &mut |r| {
            if let Ok(r) = r {
                n += 1;
                state.ingest(&r, t, &mut out);
            }
        });
        if t - last_tick >= 10_000_000 {
            state.tick(t, &mut out);
            last_tick = t;
        }
        let recs = out.len() as u64;
        for r in out.drain(..) {
            std::hint::black_box(r.encode_to_vec());
        }
        (n, recs)
    });
    let (all_rps, all_wall, _, _) = timed(pool, seconds, |p, t| {
        let mut n = 0;
        let _ = parse_packet(p, &detect, &mut |r| {
            if let Ok(r) = r {
                n += 1;
                let rec = IntFlowRecord {
                    five_tuple: r.inner.flow.as_ref().map(five_tuple),
                    path_switch_ids: r.inner.int.iter().flat_map(|i| i.hops()).flatten().filter_map(|h| h.0.node_id).collect(),
                    report_sequence: r.sequence,
                    end_to_end_latency_ns: t,
                    ..IntFlowRecord::default()
                };
                std::hint::black_box(IntRecord { record: Some(int_record::Record::Flow(rec)) }.encode_to_vec());
            }
        });
        (n, n)
    });
    serde_json::json!({
        "collector_reports_per_s": coll_rps,
        "parse_only_reports_per_s": parse_rps,
        "export_every_report_reports_per_s": all_rps,
        "wall_clock": {"collector_reports_per_s": coll_wall, "parse_only_reports_per_s": parse_wall, "export_every_report_reports_per_s": all_wall},
        "filter_ratio": if records > 0 { reports as f64 / records as f64 } else { f64::INFINITY },
        "reports": reports,
        "records": records,
    })
}

/// Blast the pool at `target` with sendmmsg from one thread until `stop`.
fn blaster(pool: Arc<Vec<Vec<u8>>>, target: SocketAddr, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>, k: usize) -> Result<()> {
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    sock.connect(target)?;
    let mut i = k * pool.len() / 2;
    while !stop.load(Ordering::Relaxed) {
        let mut iov: Vec<libc::iovec> = (0..64)
            .map(|k| {
                let p = &pool[(i + k) % pool.len()];
                libc::iovec { iov_base: p.as_ptr() as *mut _, iov_len: p.len() }
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = iov
            .iter_mut()
            .map(|v| {
                // SAFETY: plain data, zero is its initial state.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_iov = v;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        // SAFETY: msgs point into iov and pool, both alive for the call.
        let n = unsafe { libc::sendmmsg(sock.as_raw_fd(), msgs.as_mut_ptr(), 64, 0) };
        if n > 0 {
            i += n as usize;
            sent.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// What receives on the loopback sockets.
#[derive(Debug, Clone, Copy)]
enum Rx {
    /// One recv(2) per datagram: the plain loop most collectors start with (named baseline).
    PlainRecv,
    /// recvmmsg(2) of `batch`, counting datagrams only: the kernel's UDP receive limit.
    Recvmmsg(usize),
    /// The collector's worker (recvmmsg of `batch` + parse + state + events).
    Collector(usize),
}

struct Loop {
    datagrams_per_s: f64,
    reports_per_s: f64,
    filter_ratio: f64,
    sent_per_s: f64,
}

/// `sockets` SO_REUSEPORT sockets on one port, one receiver thread each, fed by `senders`
/// blaster threads (each its own source port, so the kernel's 4-tuple hash spreads them).
fn loopback(pool: Arc<Vec<Vec<u8>>>, seconds: f64, rx: Rx, sockets: usize, senders: usize) -> Result<Loop> {
    let first = recv::bind_reuseport("127.0.0.1:0".parse()?, 32 << 20)?;
    let addr = first.local_addr()?;
    let mut socks = vec![first];
    for _ in 1..sockets {
        socks.push(recv::bind_reuseport(addr, 32 << 20)?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let stats = Arc::new(Stats::default());
    let (tx, rxc) = crossbeam_channel::unbounded();
    let mut receivers = Vec::new();
    for (w, sock) in socks.into_iter().enumerate() {
        let (stop, stats, tx) = (stop.clone(), stats.clone(), tx.clone());
        receivers.push(std::thread::spawn(move || -> Result<()> {
            let count = |n: u64| stats.packets.fetch_add(n, Ordering::Relaxed);
            match rx {
                Rx::Collector(batch) => {
                    recv::worker(sock, IntDetect::default(), EventConfig::default(), format!("bench/w{w}"), stats.clone(), stop, tx, batch)?;
                }
                Rx::Recvmmsg(batch) => {
                    let mut b = Batch::new(batch);
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(k) = b.recv(&sock) {
                            n += k as u64;
                        }
                    }
                    count(n);
                }
                Rx::PlainRecv => {
                    let mut buf = vec![0u8; recv::MAX_DATAGRAM];
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        if sock.recv(&mut buf).is_ok() {
                            n += 1;
                        }
                    }
                    count(n);
                }
            }
            Ok(())
        }));
    }
    drop(tx);
    let drain = std::thread::spawn(move || rxc.iter().map(|v: Vec<IntRecord>| v.len()).sum::<usize>());
    let blasters: Vec<_> = (0..senders)
        .map(|k| {
            let (stop, sent, pool) = (stop.clone(), sent.clone(), pool.clone());
            std::thread::spawn(move || blaster(pool, addr, stop, sent, k))
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    for t in blasters {
        t.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
    }
    for t in receivers {
        t.join().map_err(|_| anyhow::anyhow!("receiver panicked"))??;
    }
    let _ = drain.join();
    let reports = stats.reports.load(Ordering::Relaxed) as f64;
    let records = stats.records.load(Ordering::Relaxed) as f64;
    Ok(Loop {
        datagrams_per_s: stats.packets.load(Ordering::Relaxed) as f64 / seconds,
        reports_per_s: reports / seconds,
        filter_ratio: if records > 0.0 { reports / records } else { f64::INFINITY },
        sent_per_s: sent.load(Ordering::Relaxed) as f64 / seconds,
    })
}

pub fn run(a: BenchArgs) -> Result<()> {
    let pool = pool(&a).context("generating the report pool")?;
    let bytes: usize = pool.iter().map(Vec::len).sum();
    let mem = memory(&pool, a.seconds);
    let mut result = serde_json::json!({
        "format": a.format, "flows": a.flows, "hops": a.hops, "pool_packets": pool.len(),
        "mean_packet_bytes": bytes as f64 / pool.len() as f64,
        "memory": mem,
    });
    let coll = mem["collector_reports_per_s"].as_f64().unwrap_or(0.0);
    result["memory"]["ratio_vs_parse_only"] = (coll / mem["parse_only_reports_per_s"].as_f64().unwrap_or(1.0)).into();
    result["memory"]["ratio_vs_export_every_report"] = (coll / mem["export_every_report_reports_per_s"].as_f64().unwrap_or(1.0)).into();
    result["memory"]["ratio_vs_intcollector_1_2M"] = (coll / INTCOLLECTOR_RPS).into();
    result["memory"]["ratio_vs_af_xdp_3M"] = (coll / AF_XDP_RPS).into();
    if !a.memory_only {
        let pool = Arc::new(pool);
        let workers = a.workers.max(1);
        // Side by side, same pool, same machine state: the plain recv loop (baseline), bare
        // recvmmsg at the former and the new batch size, then the collector as it was (1
        // worker, batch 64) and as it runs now (N SO_REUSEPORT workers, batch 256, N senders).
        let cases = [
            ("plain_recv_1sock", Rx::PlainRecv, 1, 1),
            ("recvmmsg64_1sock", Rx::Recvmmsg(64), 1, 1),
            ("recvmmsg256_1sock", Rx::Recvmmsg(recv::DEFAULT_BATCH), 1, 1),
            ("collector_batch64_1worker", Rx::Collector(64), 1, 1),
            // The kernel's UDP receive limit for the collector's set-up: bare recvmmsg(256)
            // on the same N SO_REUSEPORT sockets fed by the same N senders.
            ("recvmmsg256_nsock", Rx::Recvmmsg(recv::DEFAULT_BATCH), workers, workers),
            ("collector_batch256_nworkers", Rx::Collector(recv::DEFAULT_BATCH), workers, workers),
        ];
        let mut lb = serde_json::Map::new();
        for (name, rx, socks, senders) in cases {
            let l = loopback(pool.clone(), a.seconds, rx, socks, senders)?;
            lb.insert(name.into(), serde_json::json!({
                "sockets": socks, "senders": senders,
                "datagrams_per_s": l.datagrams_per_s,
                "sender_datagrams_per_s": l.sent_per_s,
                "reports_per_s": l.reports_per_s,
                "filter_ratio": if l.filter_ratio.is_finite() { serde_json::json!(l.filter_ratio) } else { serde_json::Value::Null },
            }));
        }
        let dg = |k: &str| lb[k]["datagrams_per_s"].as_f64().unwrap_or(0.0);
        let base = dg("plain_recv_1sock").max(1.0);
        let ratios = [
            ("ratio_recvmmsg256_vs_plain_recv", dg("recvmmsg256_1sock") / base),
            ("ratio_collector_now_vs_plain_recv", dg("collector_batch256_nworkers") / base),
            ("ratio_collector_now_vs_before", dg("collector_batch256_nworkers") / dg("collector_batch64_1worker").max(1.0)),
            ("ratio_collector_now_vs_kernel_limit", dg("collector_batch256_nworkers") / dg("recvmmsg256_nsock").max(1.0)),
        ];
        for (k, v) in ratios {
            lb.insert(k.into(), v.into());
        }
        let now_rps = lb["collector_batch256_nworkers"]["reports_per_s"].as_f64().unwrap_or(0.0);
        lb.insert("ratio_vs_intcollector_1_2M".into(), (now_rps / INTCOLLECTOR_RPS).into());
        lb.insert("ratio_vs_af_xdp_3M".into(), (now_rps / AF_XDP_RPS).into());
        result["loopback"] = serde_json::Value::Object(lb);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print_text(&result);
    }
    Ok(())
}

fn print_text(r: &serde_json::Value) {
    let m = &r["memory"];
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    println!("INT collector benchmark: {} reports, {} flows x {} hops, {:.0} B/packet, pool {} packets",
        r["format"].as_str().unwrap_or(""), r["flows"], r["hops"], f(&r["mean_packet_bytes"]), r["pool_packets"]);
    println!("from memory, 1 core (reports per CPU-second of the measuring thread; wall-clock rate in brackets):");
    let w = &m["wall_clock"];
    println!("  collector (parse+state+filter): {:>6.2} M reports/s ({:.2})  filter ratio {:.0} reports/record", f(&m["collector_reports_per_s"]) / 1e6, f(&w["collector_reports_per_s"]) / 1e6, f(&m["filter_ratio"]));
    println!("  peer: parse only               {:>6.2} M reports/s ({:.2})  collector/parse-only = {:.2}", f(&m["parse_only_reports_per_s"]) / 1e6, f(&w["parse_only_reports_per_s"]) / 1e6, f(&m["ratio_vs_parse_only"]));
    println!("  peer: export every report      {:>6.2} M reports/s ({:.2})  collector/export-all = {:.2}", f(&m["export_every_report_reports_per_s"]) / 1e6, f(&w["export_every_report_reports_per_s"]) / 1e6, f(&m["ratio_vs_export_every_report"]));
    println!("  anchors: vs INTCollector 1.2 M/s = {:.2}x   vs AF_XDP collector 3 M/s/core = {:.2}x", f(&m["ratio_vs_intcollector_1_2M"]), f(&m["ratio_vs_af_xdp_3M"]));
    if let Some(l) = r.get("loopback") {
        println!("over loopback (sender threads share the 2 cores with the receivers; datagrams received/s):");
        for (k, v) in l.as_object().into_iter().flatten() {
            if let Some(dg) = v.get("datagrams_per_s") {
                println!("  {k:<28} {} sock/{} send  {:>6.3} M datagrams/s  (sent {:.3} M/s){}", v["sockets"], v["senders"], f(dg) / 1e6, f(&v["sender_datagrams_per_s"]) / 1e6,
                    if v["reports_per_s"].as_f64().unwrap_or(0.0) > 0.0 { format!("  filter ratio {:.0}", f(&v["filter_ratio"])) } else { String::new() });
            }
        }
        println!("  recvmmsg(256)/plain recv = {:.2}   collector now/plain recv = {:.2}   collector now/before (1 worker, batch 64) = {:.2}",
            f(&l["ratio_recvmmsg256_vs_plain_recv"]), f(&l["ratio_collector_now_vs_plain_recv"]), f(&l["ratio_collector_now_vs_before"]));
        println!("  collector now / kernel receive limit (bare recvmmsg(256), same sockets and senders) = {:.2}", f(&l["ratio_collector_now_vs_kernel_limit"]));
        println!("  vs INTCollector 1.2 M/s = {:.2}x   vs AF_XDP 3 M/s/core = {:.2}x", f(&l["ratio_vs_intcollector_1_2M"]), f(&l["ratio_vs_af_xdp_3M"]));
    }
}
