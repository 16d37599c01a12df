//! `cgloop-int-collector`: `run` (collect reports, export changes to Kafka), `gen` (send a
//! spec-conformant report stream), `bench` (throughput from memory and over loopback).

use anyhow::{bail, Context, Result};
use cgloop_int_collector::bench;
use cgloop_int_collector::export::{default_topic, KafkaSink};
use cgloop_int_collector::metrics::{self, Metrics};
use cgloop_int_collector::gen::{Episode, GenConfig, Generator, Mode};
use cgloop_int_collector::parse::inner::DEFAULT_INT_UDP_PORT;
use cgloop_int_collector::parse::{Format, IntDetect};
use cgloop_int_collector::recv::{self, Cidr, SourceFilter, Stats};
use cgloop_int_collector::steer;
use cgloop_int_collector::state::EventConfig;
use cgloop_proto::ops::Daemon;
use clap::{Args, Parser, Subcommand};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "cgloop-int-collector", about = "INT telemetry report collector and generator")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    log: cgloop_obs::LogArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Receive telemetry reports over UDP and export INT records to Kafka.
    Run(RunArgs),
    /// Send a spec-conformant telemetry report stream over UDP (or describe it).
    Gen(GenArgs),
    /// Measure reports/s per core: from memory and over loopback, with the filter ratio.
    Bench(bench::BenchArgs),
}

#[derive(Args)]
struct RunArgs {
    /// Address to listen on (fabric-tna/ONOS default port 32766). Loopback unless set; any
    /// other address needs --allow-source (or --allow-any-source).
    #[arg(long, default_value = "127.0.0.1:32766")]
    listen: SocketAddr,
    /// Accept reports only from this source, an address or CIDR (e.g. 10.0.0.0/24);
    /// repeatable. Datagrams from other sources are dropped unparsed and counted
    /// (`refused_source`).
    #[arg(long = "allow-source", value_name = "CIDR")]
    allow_sources: Vec<Cidr>,
    /// Accept reports from any source on a non-loopback --listen. INT reports carry no
    /// integrity check: anyone who can reach the port can create records.
    #[arg(long, conflicts_with = "allow_sources")]
    allow_any_source: bool,
    /// Worker threads, one SO_REUSEPORT socket each (default: one per core).
    #[arg(long)]
    workers: Option<usize>,
    /// Kafka bootstrap servers; without it records are counted and discarded.
    #[arg(long)]
    kafka: Option<String>,
    #[arg(long, default_value = default_topic())]
    topic: String,
    #[arg(long, default_value = "int-collector-1")]
    source_id: String,
    #[command(flatten)]
    detect: DetectArgs,
    #[command(flatten)]
    events: EventArgs,
    /// Stop after this many seconds (default: until SIGINT/SIGTERM).
    #[arg(long)]
    duration: Option<f64>,
    /// Print a JSON stats line to stderr this often (seconds; 0 = never).
    #[arg(long, default_value_t = 0.0)]
    stats_interval: f64,
    /// Socket receive buffer per socket (bytes); SO_RCVBUFFORCE when permitted, so it may
    /// exceed net.core.rmem_max.
    #[arg(long, default_value_t = 32 << 20)]
    rcvbuf: usize,
    /// How reports are spread over the workers: `sender` (the kernel's SO_REUSEPORT 4-tuple
    /// hash: one switch, one worker) or `flow` (a classic BPF program hashing the inner
    /// packet's addresses: one flow, one worker, so per-hop v0.5/INT-MX reports of a flow
    /// meet on one worker).
    #[arg(long, default_value = "sender", value_parser = ["sender", "flow"])]
    steer: String,
    /// Datagrams per recvmmsg(2) call (1..1024).
    #[arg(long, default_value_t = recv::DEFAULT_BATCH)]
    batch: usize,
    /// Serve Prometheus metrics (GET /metrics) on this host:port; `off` (or empty) disables
    /// them. Loopback by default; a port in use is logged and the collector runs without them.
    #[arg(long, env = "CGLOOP_INT_COLLECTOR_METRICS_ADDR", default_value_t = cgloop_obs::MetricsAddr::default_for(Daemon::IntCollector))]
    metrics_addr: cgloop_obs::MetricsAddr,
}

#[derive(Args, Clone)]
pub struct DetectArgs {
    /// UDP destination port(s) that mark INT inside the reported packet (INT_TBD).
    #[arg(long = "int-udp-port", default_values_t = [DEFAULT_INT_UDP_PORT])]
    int_udp_ports: Vec<u16>,
    /// DSCP value marking INT after TCP/UDP (INT v2.1 §5.6.2 option 2); negative disables.
    #[arg(long, default_value_t = 0x17, allow_negative_numbers = true)]
    int_dscp: i16,
}

impl DetectArgs {
    fn detect(&self) -> IntDetect {
        IntDetect {
            udp_ports: self.int_udp_ports.clone(),
            dscp: (self.int_dscp >= 0).then_some(((self.int_dscp & 0x3f) as u8, 0x3f)),
        }
    }
}

#[derive(Args, Clone)]
struct EventArgs {
    #[arg(long, default_value_t = EventConfig::default().latency_quantum_ns)]
    latency_quantum_ns: u32,
    #[arg(long, default_value_t = EventConfig::default().latency_abs_ns)]
    latency_abs_ns: u32,
    #[arg(long, default_value_t = EventConfig::default().latency_rel)]
    latency_rel: f64,
    #[arg(long, default_value_t = EventConfig::default().queue_quantum_cells)]
    queue_quantum_cells: u32,
    #[arg(long, default_value_t = EventConfig::default().queue_abs_cells)]
    queue_abs_cells: u32,
    #[arg(long, default_value_t = EventConfig::default().queue_rel)]
    queue_rel: f64,
    #[arg(long, default_value_t = EventConfig::default().congestion_on_cells)]
    congestion_on_cells: u32,
    #[arg(long, default_value_t = EventConfig::default().congestion_off_cells)]
    congestion_off_cells: u32,
    /// Periodic per-flow summary interval (seconds).
    #[arg(long, default_value_t = 1.0)]
    summary_interval: f64,
    /// Forget flows without reports for this long (seconds).
    #[arg(long, default_value_t = 10.0)]
    flow_timeout: f64,
    /// Per-hop (postcard) flows: wait this long for the whole path before NEW_FLOW (seconds).
    #[arg(long, default_value_t = 0.05)]
    settle: f64,
    #[arg(long, default_value_t = EventConfig::default().tx_util_full_scale)]
    tx_util_full_scale: u32,
    /// Also export one IntHopRecord per hop with each flow record.
    #[arg(long)]
    hop_records: bool,
}

impl EventArgs {
    fn config(&self) -> Result<EventConfig> {
        if self.congestion_off_cells > self.congestion_on_cells {
            bail!("--congestion-off-cells must not exceed --congestion-on-cells (hysteresis)");
        }
        let ns = |s: f64, name: &str| -> Result<u64> {
            if !(s.is_finite() && s >= 0.0) {
                bail!("--{name} must be a non-negative number of seconds, got {s}");
            }
            Ok((s * 1e9) as u64)
        };
        Ok(EventConfig {
            latency_quantum_ns: self.latency_quantum_ns,
            latency_abs_ns: self.latency_abs_ns,
            latency_rel: self.latency_rel,
            queue_quantum_cells: self.queue_quantum_cells,
            queue_abs_cells: self.queue_abs_cells,
            queue_rel: self.queue_rel,
            congestion_on_cells: self.congestion_on_cells,
            congestion_off_cells: self.congestion_off_cells,
            summary_interval_ns: ns(self.summary_interval, "summary-interval")?,
            flow_timeout_ns: ns(self.flow_timeout, "flow-timeout")?,
            settle_ns: ns(self.settle, "settle")?,
            tx_util_full_scale: self.tx_util_full_scale,
            hop_records: self.hop_records,
        })
    }
}

#[derive(Args)]
struct GenArgs {
    /// Where to send the reports.
    #[arg(long, default_value = "127.0.0.1:32766")]
    target: SocketAddr,
    #[command(flatten)]
    gen: GenOpts,
    /// Report packets to send (0 = until --duration).
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// Report packets per second (0 = as fast as possible).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    #[arg(long)]
    duration: Option<f64>,
    /// Print the flows, paths and steady-state hop values as JSON and exit.
    #[arg(long)]
    describe: bool,
    /// Write the packets as files into this folder instead of sending them (fuzz corpus).
    #[arg(long)]
    out_dir: Option<std::path::PathBuf>,
}

#[derive(Args, Clone)]
pub struct GenOpts {
    /// Report format: v2.0, v1.0 or v0.5.
    #[arg(long, default_value = "v2.0", value_parser = parse_format)]
    format: Format,
    /// INT mode of v2.0 reports: md or mx.
    #[arg(long, default_value = "md", value_parser = parse_mode)]
    mode: Mode,
    #[arg(long, default_value_t = 4)]
    flows: u32,
    #[arg(long, default_value_t = 3)]
    hops: usize,
    /// INT instruction bitmap (hex or decimal), INT v2.1 §5.7 bit order (bit 0 = MSB).
    #[arg(long, default_value = "0xff80", value_parser = parse_u16)]
    bitmap: u16,
    /// Individual reports per v2.0 packet.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    #[arg(long, default_value_t = DEFAULT_INT_UDP_PORT)]
    int_udp_port: u16,
    /// Congestion episode HOP:START:END (packet numbers per flow); repeatable.
    #[arg(long, value_parser = parse_episode)]
    congestion: Vec<Episode>,
    #[arg(long, default_value_t = 0)]
    drop_every: u64,
    #[arg(long, default_value_t = 1)]
    drop_hop: usize,
    #[arg(long, default_value_t = 71)]
    drop_reason: u8,
    #[arg(long)]
    path_change_at: Option<u64>,
    #[arg(long)]
    no_jitter: bool,
}

impl GenOpts {
    pub fn config(&self) -> GenConfig {
        GenConfig {
            format: self.format,
            mode: self.mode,
            flows: self.flows.max(1),
            hops: self.hops.clamp(1, 8),
            bitmap: self.bitmap,
            batch: self.batch.max(1),
            int_udp_port: self.int_udp_port,
            congestion: self.congestion.clone(),
            drop_every: self.drop_every,
            drop_hop: self.drop_hop,
            drop_reason: self.drop_reason,
            path_change_at: self.path_change_at,
            jitter: !self.no_jitter,
        }
    }
}

fn parse_format(s: &str) -> Result<Format, String> {
    match s {
        "v2.0" | "2" | "2.0" => Ok(Format::V20),
        "v1.0" | "1" | "1.0" => Ok(Format::V10),
        "v0.5" | "0.5" => Ok(Format::V05),
        _ => Err(format!("unknown report format {s:?} (v2.0, v1.0, v0.5)")),
    }
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    match s {
        "md" => Ok(Mode::Md),
        "mx" => Ok(Mode::Mx),
        _ => Err(format!("unknown INT mode {s:?} (md, mx)")),
    }
}

fn parse_u16(s: &str) -> Result<u16, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u16::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?}: {e}"))
}

fn parse_episode(s: &str) -> Result<Episode, String> {
    let p: Vec<&str> = s.split(':').collect();
    let n = |i: usize| p.get(i).and_then(|v| v.parse::<u64>().ok()).ok_or(format!("{s:?}: expected HOP:START:END"));
    if p.len() != 3 {
        return Err(format!("{s:?}: expected HOP:START:END"));
    }
    let e = Episode { hop: n(0)? as usize, start: n(1)?, end: n(2)? };
    if e.end <= e.start {
        return Err(format!("{s:?}: END must be after START"));
    }
    Ok(e)
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn install_signals() {
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// Who may send reports: loopback listeners accept local senders unless restricted; any other
/// listener must name its sources (or say, explicitly, that anyone may send).
fn source_filter(a: &RunArgs) -> Result<SourceFilter> {
    if !a.allow_sources.is_empty() {
        return Ok(SourceFilter::only(a.allow_sources.clone()));
    }
    if a.listen.ip().is_loopback() {
        return Ok(SourceFilter::any());
    }
    if !a.allow_any_source {
        bail!(
            "--listen {} is reachable beyond this host, and INT reports carry no integrity check: \
             name the switches' addresses with --allow-source CIDR (repeatable), or pass \
             --allow-any-source to accept reports from anyone who can reach the port",
            a.listen
        );
    }
    tracing::warn!(
        "--allow-any-source: every datagram reaching {} is parsed as a report; anyone who can \
         reach the port can create INT records",
        a.listen
    );
    Ok(SourceFilter::any())
}

fn run(a: RunArgs) -> Result<()> {
    let sources = source_filter(&a)?;
    let cfg = a.events.config()?;
    let detect = a.detect.detect();
    let workers = a.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let sink = match &a.kafka {
        Some(b) => Some(KafkaSink::new(b, &a.topic)?),
        None => None,
    };
    install_signals();
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Stats::default());
    let (tx, rx) = crossbeam_channel::bounded(1024);
    let mut handles = Vec::new();
    let batch = a.batch;
    // All sockets are bound before the workers start, so the steering program sees the whole
    // group (socket index = bind order). An ephemeral --listen port binds once, then reuses it.
    let mut socks = Vec::new();
    let mut listen = a.listen;
    for _ in 0..workers {
        let s = recv::bind_reuseport(listen, a.rcvbuf)?;
        listen = s.local_addr()?;
        socks.push(s);
    }
    if a.steer == "flow" {
        steer::attach(&socks[0], workers as u32).context("--steer flow")?;
    }
    // Handles on the same sockets, for their kernel drop counters.
    let drop_socks = socks.iter().map(|s| s.try_clone()).collect::<std::io::Result<Vec<_>>>()?;
    for (w, sock) in socks.into_iter().enumerate() {
        let (detect, cfg, stats, stop, tx) = (detect.clone(), cfg, stats.clone(), stop.clone(), tx.clone());
        let (source, sources) = (format!("{}/w{w}", a.source_id), sources.clone());
        handles.push(
            std::thread::Builder::new()
                .name(format!("int-w{w}"))
                .spawn(move || recv::filtered_worker(sock, detect, cfg, source, stats, stop, tx, batch, sources))?,
        );
    }
    drop(tx);
    let bound = listen;
    let allowed: Vec<String> = a.allow_sources.iter().map(|c| c.to_string()).collect();
    let metrics = Metrics::default();
    // The readiness line comes first (scripts wait for it); a metrics failure is logged after.
    let (metrics_bound, no_metrics) = cgloop_obs::try_serve(metrics.registry(), a.metrics_addr);
    eprintln!("{}", serde_json::json!({"event": "listening", "listen": bound.to_string(), "workers": workers, "steer": a.steer, "kafka": a.kafka, "topic": a.topic, "allow_sources": if allowed.is_empty() { serde_json::json!("any") } else { allowed.into() }, "metrics": metrics_bound.map(|m| m.to_string())}));
    if let Some(line) = no_metrics {
        tracing::warn!("{line}");
    }
    let observe = |m: &Metrics| {
        let drops = drop_socks.iter().filter_map(metrics::socket_drops).sum();
        m.observe(&stats, sink.as_ref().map_or(0, |s| s.delivery.errors()), drops);
    };
    let mut last_observed = Instant::now();
    let start = Instant::now();
    let mut last_stats = Instant::now();
    let mut exported = 0u64;
    loop {
        let done = STOP.load(Ordering::Relaxed) || a.duration.is_some_and(|d| start.elapsed().as_secs_f64() >= d);
        if done {
            stop.store(true, Ordering::Relaxed);
        }
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(batch) => {
                exported += batch.len() as u64;
                metrics.exported.inc_by(batch.len() as u64);
                if let Some(s) = &sink {
                    s.send(batch)?;
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
        }
        if last_observed.elapsed() >= Duration::from_millis(200) {
            last_observed = Instant::now();
            observe(&metrics);
        }
        if a.stats_interval > 0.0 && last_stats.elapsed().as_secs_f64() >= a.stats_interval {
            last_stats = Instant::now();
            eprintln!("{}", stats.snapshot());
        }
    }
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("worker panicked"))??;
    }
    if let Some(s) = &sink {
        s.flush()?;
    }
    let mut snap = stats.snapshot();
    snap["exported"] = exported.into();
    snap["seconds"] = start.elapsed().as_secs_f64().into();
    println!("{snap}");
    Ok(())
}

fn gen(a: GenArgs) -> Result<()> {
    let mut g = Generator::new(a.gen.config());
    if a.describe {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({"config": g.config(), "flows": g.describe()}))?);
        return Ok(());
    }
    if let Some(dir) = &a.out_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut buf = Vec::new();
        for i in 0..a.count {
            g.next_packet(&mut buf);
            let path = dir.join(format!("gen-{}-{i:05}", g.config().format.name()));
            std::fs::write(&path, &buf).with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(());
    }
    install_signals();
    let sock = UdpSocket::bind(if a.target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).context("binding sender")?;
    sock.connect(a.target).with_context(|| format!("connecting to {}", a.target))?;
    let start = Instant::now();
    let mut buf = Vec::new();
    let mut sent = 0u64;
    while (a.count == 0 || sent < a.count) && !STOP.load(Ordering::Relaxed) {
        if a.duration.is_some_and(|d| start.elapsed().as_secs_f64() >= d) {
            break;
        }
        if a.rate > 0.0 {
            let due = Duration::from_secs_f64(sent as f64 / a.rate);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        g.next_packet(&mut buf);
        match sock.send(&buf) {
            Ok(_) => sent += 1,
            // ECONNREFUSED from an earlier datagram: nobody listening yet; keep going.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => sent += 1,
            Err(e) => return Err(e).context("sending report"),
        }
    }
    println!("{}", serde_json::json!({"sent": sent, "seconds": start.elapsed().as_secs_f64()}));
    Ok(())
}

fn main() -> Result<()> {
    cgloop_obs::refuse_unknown_settings("cgloop-int-collector");
    let cli = Cli::parse();
    cli.log.init();
    match cli.cmd {
        Cmd::Run(a) => run(a),
        Cmd::Gen(a) => gen(a),
        Cmd::Bench(a) => bench::run(a),
    }
}
