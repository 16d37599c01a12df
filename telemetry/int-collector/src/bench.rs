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

/// Run `f` over the pool until `seconds` pass; returns (reports/s, reports, records).
fn timed(pool: &[Vec<u8>], seconds: f64, mut f: impl FnMut(&[u8], u64) -> (u64, u64)) -> (f64, u64, u64) {
    let start = Instant::now();
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
            if start.elapsed().as_secs_f64() >= seconds {
                break 'outer;
            }
        }
    }
    (reports as f64 / start.elapsed().as_secs_f64(), reports, records)
}

fn memory(pool: &[Vec<u8>], seconds: f64) -> serde_json::Value {
    let detect = IntDetect::default();
    let (parse_rps, _, _) = timed(pool, seconds, |p, _| {
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
    let (coll_rps, reports, records) = timed(pool, seconds, |p, t| {
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
    let (all_rps, _, _) = timed(pool, seconds, |p, t| {
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
        "filter_ratio": if records > 0 { reports as f64 / records as f64 } else { f64::INFINITY },
        "reports": reports,
        "records": records,
    })
}

/// Blast the pool at `target` with sendmmsg from one thread until `stop`.
fn blaster(pool: Arc<Vec<Vec<u8>>>, target: SocketAddr, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) -> Result<()> {
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    sock.connect(target)?;
    let mut i = 0usize;
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

/// One receiver thread fed by one blaster; `collector` selects the real worker or a bare
/// recvmmsg counting loop. Returns (datagrams received/s, reports/s, filter ratio, sent/s).
fn loopback(pool: Arc<Vec<Vec<u8>>>, seconds: f64, collector: bool) -> Result<(f64, f64, f64, f64)> {
    let sock = recv::bind_reuseport("127.0.0.1:0".parse()?, 32 << 20)?;
    let addr = sock.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let stats = Arc::new(Stats::default());
    let (tx, rx) = crossbeam_channel::unbounded();
    let rx_thread = {
        let (stop, stats) = (stop.clone(), stats.clone());
        std::thread::spawn(move || -> Result<()> {
            if collector {
                recv::worker(sock, IntDetect::default(), EventConfig::default(), "bench".into(), stats, stop, tx)
            } else {
                let mut b = Batch::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(k) = b.recv(&sock) {
                        n += k as u64;
                    }
                }
                stats.packets.store(n, Ordering::Relaxed);
                Ok(())
            }
        })
    };
    let drain = std::thread::spawn(move || rx.iter().map(|v: Vec<IntRecord>| v.len()).sum::<usize>());
    let tx_thread = {
        let (stop, sent) = (stop.clone(), sent.clone());
        std::thread::spawn(move || blaster(pool, addr, stop, sent))
    };
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    tx_thread.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
    rx_thread.join().map_err(|_| anyhow::anyhow!("receiver panicked"))??;
    let _ = drain.join();
    let pk = stats.packets.load(Ordering::Relaxed) as f64 / seconds;
    let reports = stats.reports.load(Ordering::Relaxed) as f64;
    let records = stats.records.load(Ordering::Relaxed) as f64;
    let ratio = if records > 0.0 { reports / records } else { f64::INFINITY };
    Ok((pk, reports / seconds, ratio, sent.load(Ordering::Relaxed) as f64 / seconds))
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
        let (kern_pk, _, _, kern_sent) = loopback(pool.clone(), a.seconds, false)?;
        let (coll_pk, coll_rps, ratio, coll_sent) = loopback(pool, a.seconds, true)?;
        result["loopback"] = serde_json::json!({
            "kernel_udp_datagrams_per_s": kern_pk,
            "kernel_sender_datagrams_per_s": kern_sent,
            "collector_datagrams_per_s": coll_pk,
            "collector_reports_per_s": coll_rps,
            "collector_sender_datagrams_per_s": coll_sent,
            "filter_ratio": ratio,
            "ratio_vs_kernel_udp_limit": coll_pk / kern_pk.max(1.0),
            "ratio_vs_intcollector_1_2M": coll_rps / INTCOLLECTOR_RPS,
            "ratio_vs_af_xdp_3M": coll_rps / AF_XDP_RPS,
        });
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
    println!("from memory, 1 core:");
    println!("  collector (parse+state+filter): {:>6.2} M reports/s   filter ratio {:.0} reports/record", f(&m["collector_reports_per_s"]) / 1e6, f(&m["filter_ratio"]));
    println!("  peer: parse only               {:>6.2} M reports/s   collector/parse-only = {:.2}", f(&m["parse_only_reports_per_s"]) / 1e6, f(&m["ratio_vs_parse_only"]));
    println!("  peer: export every report      {:>6.2} M reports/s   collector/export-all = {:.2}", f(&m["export_every_report_reports_per_s"]) / 1e6, f(&m["ratio_vs_export_every_report"]));
    println!("  anchors: vs INTCollector 1.2 M/s = {:.2}x   vs AF_XDP collector 3 M/s/core = {:.2}x", f(&m["ratio_vs_intcollector_1_2M"]), f(&m["ratio_vs_af_xdp_3M"]));
    if let Some(l) = r.get("loopback") {
        println!("over loopback, 1 sender thread + 1 receiver thread (2 cores):");
        println!("  kernel UDP limit (bare recvmmsg): {:>6.3} M datagrams/s (sender {:.3} M/s)", f(&l["kernel_udp_datagrams_per_s"]) / 1e6, f(&l["kernel_sender_datagrams_per_s"]) / 1e6);
        println!("  collector receive path:           {:>6.3} M datagrams/s = {:.3} M reports/s (sender {:.3} M/s)", f(&l["collector_datagrams_per_s"]) / 1e6, f(&l["collector_reports_per_s"]) / 1e6, f(&l["collector_sender_datagrams_per_s"]) / 1e6);
        println!("  collector/kernel limit = {:.2}   filter ratio {:.0}   vs INTCollector = {:.2}x   vs AF_XDP = {:.2}x",
            f(&l["ratio_vs_kernel_udp_limit"]), f(&l["filter_ratio"]), f(&l["ratio_vs_intcollector_1_2M"]), f(&l["ratio_vs_af_xdp_3M"]));
    }
}
