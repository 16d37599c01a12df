//! The live exporter: load and attach the BPF programs, pin the maps, sweep the flow table.
use std::ffi::CString;
use std::fs;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, TcHookBuilder, Xdp, XdpFlags, TC_EGRESS};

use crate::bpf_types::{
    key_from, value_from, FlowKey, FlowValue, FIRST_ERROR_STAT, KEY_SIZE, STAT_ACCOUNTED,
    STAT_FLOWS_CREATED, STAT_NAMES, STAT_NON_IP, STAT_PACKETS, VALUE_SIZE,
};
use crate::metrics::Metrics;
use crate::skel::{FlowProbeSkel, FlowProbeSkelBuilder};
use crate::sweep::Sweeper;
use crate::{FlowArgs, Sink, SinkArgs};

const BTF: &str = "/sys/kernel/btf/vmlinux";
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const BATCH: u32 = 4096;

#[derive(Args)]
pub struct RunArgs {
    /// Interface to observe (XDP on ingress, tc on egress); repeat for several.
    #[arg(long = "iface", short = 'i', required = true)]
    ifaces: Vec<String>,
    /// A network function and its interfaces, NAME=if1,if2 (repeatable; index = order, from 1).
    /// Interfaces of no function count under index 0.
    #[arg(long = "function")]
    functions: Vec<String>,
    /// bpffs folder for the pinned maps (flows, fn_stats, if_fn, if_stats, probe_stats).
    #[arg(long, default_value = "/sys/fs/bpf/cgloop")]
    pin_dir: PathBuf,
    /// Sweep period, ms (10 at least).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(10..))]
    interval_ms: u64,
    /// Flow table size (LRU: the least recently used flow is evicted when full).
    #[arg(long, default_value_t = 65536)]
    max_flows: u32,
    /// Flow table kind: `lru` (preallocated LRU hash: when full, the least recently used flow
    /// is evicted) or `hash` (hash map with entries allocated on insert, BPF_F_NO_PREALLOC:
    /// fewer TLB misses per packet at 10 k+ flows; when full, new flows are not tracked and
    /// count as map_update_failed until the sweep expires idle ones).
    #[arg(long, default_value = "lru")]
    flow_table: String,
    /// XDP attach mode: auto (native, else generic with a warning), native or generic.
    #[arg(long, default_value = "auto")]
    xdp_mode: String,
    /// Observe ingress only (no tc egress program).
    #[arg(long)]
    no_egress: bool,
    /// Serve Prometheus metrics (GET /metrics) on this host:port; `off` (or empty) disables
    /// them. Loopback by default; a port in use is logged and the probe runs without them.
    #[arg(
        long,
        env = "CGLOOP_PROBE_METRICS_ADDR",
        default_value_t = cgloop_obs::MetricsAddr::default_for(cgloop_proto::ops::Daemon::Probe)
    )]
    metrics_addr: cgloop_obs::MetricsAddr,
    /// Stop after this many seconds (default: until SIGTERM/SIGINT).
    #[arg(long)]
    duration_s: Option<f64>,
    #[command(flatten)]
    flow: FlowArgs,
    #[command(flatten)]
    sink: SinkArgs,
}

fn effective_caps() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Refuses early, naming what is missing, instead of failing inside libbpf.
fn preflight(ifaces: &[String]) -> Result<Vec<(String, u32)>> {
    if !Path::new(BTF).exists() {
        bail!("kernel BTF missing ({BTF} not found): the probe's CO-RE programs need a kernel built with CONFIG_DEBUG_INFO_BTF=y");
    }
    let caps = effective_caps();
    let has = |c: u32| caps & (1u64 << c) != 0;
    if !(has(CAP_NET_ADMIN) && (has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)))) {
        bail!("insufficient privileges: loading and attaching XDP/tc programs needs root, or CAP_BPF + CAP_PERFMON + CAP_NET_ADMIN (effective capabilities: {caps:#x})");
    }
    ifaces
        .iter()
        .map(|name| Ok((name.clone(), cgloop_proto::host::ifindex(name)?)))
        .collect()
}

fn clock_ns(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// What was attached, undone in reverse on drop (also on errors and panics).
struct Attachments {
    xdp: Vec<(i32, u32, Xdp<'static>)>,
    tc: Vec<(libbpf_rs::TcHook, bool)>,
    pins: Vec<PathBuf>,
}

impl Drop for Attachments {
    fn drop(&mut self) {
        for (hook, created) in self.tc.iter_mut().rev() {
            if let Err(e) = hook.detach() {
                eprintln!("cgloop-probe: detaching tc egress: {e}");
            }
            if *created {
                let _ = hook.destroy();
            }
        }
        for (ifindex, flags, xdp) in self.xdp.iter().rev() {
            if let Err(e) = xdp.detach(*ifindex, XdpFlags::from_bits_truncate(*flags)) {
                eprintln!("cgloop-probe: detaching XDP from ifindex {ifindex}: {e}");
            }
        }
        for p in &self.pins {
            let _ = fs::remove_file(p);
        }
    }
}

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Mounts bpffs at /sys/fs/bpf when the pin folder is under it and nothing is mounted there
/// (e.g. inside `ip netns exec`, which gives the command a fresh /sys).
fn ensure_bpffs(pin_dir: &Path) -> Result<()> {
    let root = Path::new("/sys/fs/bpf");
    if !pin_dir.starts_with(root) {
        return Ok(());
    }
    let c = CString::new("/sys/fs/bpf").expect("static path");
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0 && st.f_type as i64 == BPF_FS_MAGIC {
        return Ok(());
    }
    let fstype = CString::new("bpf").expect("static");
    if unsafe {
        libc::mount(
            fstype.as_ptr(),
            c.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error())
            .context("mounting bpffs at /sys/fs/bpf for the map pins");
    }
    eprintln!("cgloop-probe: mounted bpffs at /sys/fs/bpf");
    Ok(())
}

/// Creates clsact on `ifindex` if missing; true when this call created it (so we remove it).
fn ensure_clsact(ifindex: i32) -> Result<bool> {
    let mut hook = libbpf_sys::bpf_tc_hook {
        sz: std::mem::size_of::<libbpf_sys::bpf_tc_hook>() as _,
        ifindex,
        attach_point: libbpf_sys::BPF_TC_EGRESS,
        ..Default::default()
    };
    match unsafe { libbpf_sys::bpf_tc_hook_create(&mut hook) } {
        0 => Ok(true),
        e if e == -libc::EEXIST => Ok(false),
        e => Err(std::io::Error::from_raw_os_error(-e)).context("creating the clsact qdisc"),
    }
}

fn parse_functions(specs: &[String], ifaces: &[(String, u32)]) -> Result<Vec<(u32, u32)>> {
    let mut out = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let (name, list) = spec
            .split_once('=')
            .with_context(|| format!("--function {spec:?}: expected NAME=if1,if2"))?;
        if i + 1 >= 64 {
            bail!("--function {name}: at most 63 functions (index 0 is 'unassigned')");
        }
        for ifname in list.split(',').filter(|s| !s.is_empty()) {
            let idx = match ifaces.iter().find(|(n, _)| n == ifname) {
                Some((_, idx)) => *idx,
                None => bail!(
                    "--function {name}: interface {ifname:?} is not one of the --iface interfaces"
                ),
            };
            out.push((idx, i as u32 + 1));
        }
    }
    Ok(out)
}

/// Size of `struct if_state` and the offset of its function index (after six __u64 counters).
const IF_STATE_SIZE: usize = 56;
const IF_STATE_FN: usize = 48;
const _: () = assert!(std::mem::size_of::<crate::skel::types::if_state>() == IF_STATE_SIZE);

fn le_u64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .map_or(0, |s| u64::from_ne_bytes(s.try_into().unwrap_or([0; 8])))
}

/// probe_stats summed over CPUs; packets seen come from if_stats (rx + tx of every interface)
/// and accounted = seen - not IP - parse failures (the programs skip those two counters).
fn sum_stats(skel: &FlowProbeSkel<'_>) -> [u64; STAT_NAMES.len()] {
    let mut out = [0u64; STAT_NAMES.len()];
    for (i, slot) in out.iter_mut().enumerate() {
        let key = (i as u32).to_ne_bytes();
        if let Ok(Some(per_cpu)) = skel.maps.probe_stats.lookup_percpu(&key, MapFlags::ANY) {
            *slot = per_cpu.iter().map(|v| le_u64(v, 0)).sum();
        }
    }
    let mut seen = 0u64;
    for key in skel.maps.if_stats.keys() {
        if let Ok(Some(per_cpu)) = skel.maps.if_stats.lookup_percpu(&key, MapFlags::ANY) {
            seen += per_cpu
                .iter()
                .map(|v| le_u64(v, 0) + le_u64(v, 16))
                .sum::<u64>();
        }
    }
    let skipped: u64 = out[FIRST_ERROR_STAT..].iter().sum::<u64>() + out[STAT_NON_IP];
    out[STAT_PACKETS] = seen;
    out[STAT_ACCOUNTED] = seen.saturating_sub(skipped);
    out
}

pub fn run(args: RunArgs) -> Result<()> {
    let ifaces = preflight(&args.ifaces)?;
    let functions = parse_functions(&args.functions, &ifaces)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }

    let mut storage = MaybeUninit::uninit();
    let mut open = FlowProbeSkelBuilder::default()
        .open(&mut storage)
        .context("opening the BPF object")?;
    let acct = args.flow.account();
    if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
        ro.burst_gap_ns = acct.burst_gap_ns;
        ro.rtp_default_clock_hz = acct.rtp_default_clock_hz;
        ro.rtp_enabled = acct.rtp_enabled as u8;
    }
    open.maps
        .flows
        .set_max_entries(args.max_flows)
        .context("sizing the flow table")?;
    match args.flow_table.as_str() {
        "lru" => {}
        "hash" => {
            open.maps
                .flows
                .set_type(libbpf_rs::MapType::Hash)
                .context("flow table type")?;
            open.maps
                .flows
                .set_map_flags(libbpf_sys::BPF_F_NO_PREALLOC)
                .context("flow table flags")?;
        }
        other => bail!("--flow-table {other:?}: expected lru or hash"),
    }
    if args.no_egress {
        open.progs.cgloop_tc_egress.set_autoload(false);
    }
    let mut skel = open
        .load()
        .context("loading the BPF programs (verifier log above)")?;

    ensure_bpffs(&args.pin_dir)?;
    fs::create_dir_all(&args.pin_dir).with_context(|| {
        format!(
            "creating {} (is bpffs mounted at /sys/fs/bpf?)",
            args.pin_dir.display()
        )
    })?;
    let mut att = Attachments {
        xdp: Vec::new(),
        tc: Vec::new(),
        pins: Vec::new(),
    };
    {
        let maps = &mut skel.maps;
        for (name, map) in [
            ("flows", &mut maps.flows),
            ("fn_stats", &mut maps.fn_stats),
            ("if_fn", &mut maps.if_fn),
            ("if_stats", &mut maps.if_stats),
            ("probe_stats", &mut maps.probe_stats),
        ] {
            let path = args.pin_dir.join(name);
            let _ = fs::remove_file(&path); // a stale pin of a previous run
            map.pin(&path)
                .with_context(|| format!("pinning {}", path.display()))?;
            att.pins.push(path);
        }
    }
    for (ifindex, fn_idx) in &functions {
        skel.maps
            .if_fn
            .update(&ifindex.to_ne_bytes(), &fn_idx.to_ne_bytes(), MapFlags::ANY)
            .context("filling if_fn")?;
    }
    // Per-interface state carries the function index, so the programs need one lookup.
    let cpus = libbpf_rs::num_possible_cpus().context("counting CPUs")?;
    for (_, ifindex) in &ifaces {
        let fn_idx = functions
            .iter()
            .find(|(i, _)| i == ifindex)
            .map_or(0, |(_, f)| *f);
        let mut value = vec![0u8; IF_STATE_SIZE];
        value[IF_STATE_FN..IF_STATE_FN + 4].copy_from_slice(&fn_idx.to_ne_bytes());
        skel.maps
            .if_stats
            .update_percpu(&ifindex.to_ne_bytes(), &vec![value; cpus], MapFlags::ANY)
            .context("filling if_stats")?;
    }

    // SAFETY of 'static: the programs outlive `att`, which is dropped before `skel` below.
    let xdp_fd = unsafe {
        std::os::fd::BorrowedFd::borrow_raw(std::os::fd::AsRawFd::as_raw_fd(
            &skel.progs.cgloop_xdp_ingress.as_fd(),
        ))
    };
    for (name, ifindex) in &ifaces {
        let xdp = Xdp::new(xdp_fd);
        let idx = *ifindex as i32;
        let native = (XdpFlags::DRV_MODE | XdpFlags::UPDATE_IF_NOEXIST).bits();
        let generic = (XdpFlags::SKB_MODE | XdpFlags::UPDATE_IF_NOEXIST).bits();
        let attach = |bits: u32| {
            xdp.attach(idx, XdpFlags::from_bits_truncate(bits))
                .map(|_| bits)
        };
        let flags = match args.xdp_mode.as_str() {
            "native" => attach(native),
            "generic" => attach(generic),
            "auto" => attach(native).or_else(|e| {
                eprintln!("cgloop-probe: warning: native XDP refused on {name} ({e}); using generic (skb) mode, which costs more per packet");
                attach(generic)
            }),
            other => bail!("--xdp-mode {other:?}: expected auto, native or generic"),
        }
        .with_context(|| format!("attaching XDP to {name} (another XDP program there?)"))?;
        att.xdp.push((idx, flags, xdp));
        if !args.no_egress {
            let created = ensure_clsact(idx).with_context(|| format!("tc on {name}"))?;
            let mut hook = TcHookBuilder::new(skel.progs.cgloop_tc_egress.as_fd())
                .ifindex(idx)
                .replace(true)
                .handle(0xc91)
                .priority(1)
                .hook(TC_EGRESS);
            let hook = hook
                .attach()
                .with_context(|| format!("attaching tc egress to {name}"))?;
            att.tc.push((hook, created));
        }
    }

    let mut sink = Sink::open(&args.sink)?;
    let metrics = Arc::new(Metrics::new());
    metrics.flow_capacity.set(args.max_flows as i64);
    match cgloop_obs::try_serve(metrics.registry(), args.metrics_addr) {
        (Some(bound), _) => eprintln!("cgloop-probe: metrics on http://{bound}/metrics"),
        (None, Some(why)) => eprintln!("cgloop-probe: warning: {why}"),
        (None, None) => {}
    }
    let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut sweeper = Sweeper::new(args.flow.sweep(format!("{}/flow-probe", host.trim())));
    sweeper.clock_offset_ns = clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_MONOTONIC);
    for (name, idx) in &ifaces {
        sweeper.if_names.insert(*idx, name.clone());
    }
    eprintln!(
        "cgloop-probe: observing {} (pins in {}), sweeping every {} ms",
        ifaces
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        args.pin_dir.display(),
        args.interval_ms
    );

    let interval = Duration::from_millis(args.interval_ms);
    let deadline = args
        .duration_s
        .map(|s| Instant::now() + Duration::from_secs_f64(s));
    let mut deleted_total: u64 = 0;
    let mut reader = TableReader::new(BATCH);
    let mut next = Instant::now() + interval;
    loop {
        let finish = stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d);
        let started = Instant::now();
        let epoch = bump_epoch(&mut skel);
        let now = clock_ns(libc::CLOCK_MONOTONIC) as u64;
        let entries = reader.read(&skel.maps.flows)?;
        let swept = sweeper.sweep(now, epoch, entries.drain(..), finish);
        deleted_total += delete_flows(&skel, &swept.expired);
        metrics.expired.inc_by(swept.expired.len() as u64);
        let stats = sum_stats(&skel);
        // Flows the LRU dropped = created - deleted by us - still there.
        let evicted = stats[STAT_FLOWS_CREATED].saturating_sub(deleted_total + swept.live as u64);
        let seen = metrics.evictions.get();
        metrics.evictions.inc_by(evicted.saturating_sub(seen));
        metrics.observe_stats(&stats);
        metrics.flows_live.set(swept.live as i64);
        metrics
            .flow_fill
            .set(swept.live as f64 / args.max_flows.max(1) as f64);
        metrics.records.inc_by(swept.records.len() as u64);
        sink.emit(swept.records)?;
        if let Some(k) = &sink.kafka {
            let s = &k.stats;
            metrics.observe_kafka(
                s.records_delivered.load(Ordering::Relaxed),
                s.records_dropped.load(Ordering::Relaxed),
                k.queue_depth() as i64,
            );
        }
        metrics.sweeps.inc();
        metrics
            .sweep_seconds
            .observe(started.elapsed().as_secs_f64());
        if finish {
            break;
        }
        let now = Instant::now();
        if next > now {
            sleep_unless_stopped(next - now, &stop);
        }
        next += interval;
        if next < Instant::now() {
            next = Instant::now() + interval; // a slow sweep: do not try to catch up
        }
    }
    sink.finish()?;
    let stats = sum_stats(&skel);
    let mut summary: serde_json::Map<String, serde_json::Value> = STAT_NAMES
        .iter()
        .zip(stats)
        .map(|(n, v)| ((*n).to_string(), v.into()))
        .chain([("records".to_string(), sink.records.into())])
        .collect();
    if let Some(k) = &sink.kafka {
        let s = &k.stats;
        summary.insert(
            "kafka_records_delivered".into(),
            s.records_delivered.load(Ordering::Relaxed).into(),
        );
        summary.insert(
            "kafka_records_dropped".into(),
            s.records_dropped.load(Ordering::Relaxed).into(),
        );
    }
    eprintln!("{}", serde_json::Value::Object(summary));
    drop(att);
    Ok(())
}

fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    let end = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= end {
            break;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(10)));
    }
}

/// Starts a new interval; returns the epoch the finished interval's packets carried.
fn bump_epoch(skel: &mut FlowProbeSkel<'_>) -> u32 {
    match skel.maps.bss_data.as_deref_mut() {
        Some(bss) => {
            let old = unsafe { std::ptr::read_volatile(&bss.sweep_epoch) };
            unsafe { std::ptr::write_volatile(&mut bss.sweep_epoch, old.wrapping_add(1)) };
            old
        }
        None => 0,
    }
}

/// Reads the whole flow table with BPF_MAP_LOOKUP_BATCH into buffers kept between sweeps.
/// Not libbpf-rs's batch iterator, which allocates two Vecs per entry. The loop goes on until
/// the kernel says ENOENT (a hash map hands out whole buckets, so a batch may come back short).
pub(crate) struct TableReader {
    batch: u32,
    keys: Vec<u8>,
    values: Vec<u8>,
    entries: Vec<(FlowKey, FlowValue)>,
}

impl TableReader {
    pub(crate) fn new(batch: u32) -> Self {
        Self {
            batch: batch.max(1),
            keys: vec![0; batch.max(1) as usize * KEY_SIZE],
            values: vec![0; batch.max(1) as usize * VALUE_SIZE],
            entries: Vec::new(),
        }
    }

    /// Every entry of the flow table `map` (a `flows` map of this skeleton's layout).
    pub(crate) fn read(&mut self, map: &impl MapCore) -> Result<&mut Vec<(FlowKey, FlowValue)>> {
        use std::os::fd::AsRawFd;
        let fd = map.as_fd().as_raw_fd();
        let opts = libbpf_sys::bpf_map_batch_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_batch_opts>() as _,
            ..Default::default()
        };
        // The batch token of hash maps is a bucket index (u32); KEY_SIZE bytes are plenty.
        let mut token = [[0u8; KEY_SIZE]; 2];
        let mut first = true;
        self.entries.clear();
        loop {
            let mut count = self.batch;
            let (cur, next) = token.split_at_mut(1);
            let ret = unsafe {
                libbpf_sys::bpf_map_lookup_batch(
                    fd,
                    if first {
                        std::ptr::null_mut()
                    } else {
                        cur[0].as_mut_ptr().cast()
                    },
                    next[0].as_mut_ptr().cast(),
                    self.keys.as_mut_ptr().cast(),
                    self.values.as_mut_ptr().cast(),
                    &mut count,
                    &opts,
                )
            };
            let err = if ret < 0 { -ret } else { 0 };
            if err == libc::EINTR {
                continue;
            }
            if err != 0 && err != libc::ENOENT {
                return Err(std::io::Error::from_raw_os_error(err))
                    .context("reading the flow table (BPF_MAP_LOOKUP_BATCH)");
            }
            let n = (count as usize).min(self.batch as usize);
            for (k, v) in self.keys[..n * KEY_SIZE]
                .chunks_exact(KEY_SIZE)
                .zip(self.values[..n * VALUE_SIZE].chunks_exact(VALUE_SIZE))
            {
                if let (Some(k), Some(v)) = (key_from(k), value_from(v)) {
                    self.entries.push((k, v));
                }
            }
            if err == libc::ENOENT {
                return Ok(&mut self.entries);
            }
            token[0] = token[1];
            first = false;
        }
    }
}

/// Deletes expired flows in batches; falls back to one by one when a key is already gone.
fn delete_flows(skel: &FlowProbeSkel<'_>, keys: &[[u8; KEY_SIZE]]) -> u64 {
    let mut deleted = 0;
    for chunk in keys.chunks(BATCH as usize) {
        let flat: Vec<u8> = chunk.iter().flatten().copied().collect();
        if skel
            .maps
            .flows
            .delete_batch(&flat, chunk.len() as u32, MapFlags::ANY, MapFlags::ANY)
            .is_ok()
        {
            deleted += chunk.len() as u64;
        } else {
            deleted += chunk
                .iter()
                .filter(|k| skel.maps.flows.delete(&k[..]).is_ok())
                .count() as u64;
        }
    }
    deleted
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn metrics_are_on_by_default_at_the_declared_port_and_can_be_turned_off() {
        let cli = Cli::try_parse_from(["cgloop-probe", "-i", "eth0"]).unwrap();
        let declared = cgloop_proto::ops::default_metrics_addr(cgloop_proto::ops::Daemon::Probe);
        assert_eq!(cli.run.metrics_addr.0, Some(declared));
        assert!(declared.ip().is_loopback());
        let off = Cli::try_parse_from(["cgloop-probe", "-i", "eth0", "--metrics-addr", "off"]).unwrap();
        assert_eq!(off.run.metrics_addr.0, None);
    }
}
