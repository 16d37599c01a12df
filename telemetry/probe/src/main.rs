//! cgloop-probe: the XDP/tc flow probe's exporter (`run`) and its offline twin (`pcap`).
//!
//! Both write flow records as length-delimited `cgloop.v1.FlowRecordBatch` messages (one per
//! sweep) to a file or stdout, and/or produce them to Kafka topic `cgloop.flows.v1`.
#[cfg(test)]
mod agreement;
mod kafka;
mod metrics;
mod probe;

// The twin's modules live in the library (shared with cgloop.pcaprecords); imported at the root
// so `crate::sweep`, `crate::bpf_types` … read the same in the binary's own modules.
#[cfg(test)]
use cgloop_probe::{account, parse};
use cgloop_probe::{bpf_types, pcap, skel, sweep};

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use cgloop_proto::v1::{FlowRecord, FlowRecordBatch};
use clap::{Args, Parser, Subcommand};
use prost::Message;

use crate::kafka::{FlowProducer, KafkaConfig};
use crate::pcap::{defaults, FlowSettings};
use crate::sweep::SweepConfig;
use cgloop_probe::account::AccountConfig;

#[derive(Parser)]
#[command(
    name = "cgloop-probe",
    version,
    about = "cgloop's XDP flow probe and its pcap twin"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Flow records from a pcap/pcapng capture (gzip accepted), as the probe would export them.
    Pcap(PcapArgs),
    /// Load the BPF programs on interfaces and export flow records until SIGTERM/SIGINT.
    Run(probe::RunArgs),
}

/// Settings shared by the probe and the twin: they decide what a record contains.
#[derive(Args, Debug, Clone)]
pub struct FlowArgs {
    /// Packets closer than this (µs) to the previous packet of their flow extend a burst.
    #[arg(long, default_value_t = defaults::BURST_GAP_US)]
    burst_gap_us: u64,
    /// RTP clock for dynamic payload types (96-127), Hz.
    #[arg(long, default_value_t = defaults::RTP_CLOCK_HZ)]
    rtp_clock_hz: u32,
    /// Do not look for RTP headers in UDP payloads.
    #[arg(long)]
    no_rtp: bool,
    /// A flow idle this long (ms) gets its final record and leaves the table.
    #[arg(long, default_value_t = defaults::IDLE_TIMEOUT_MS)]
    idle_timeout_ms: u64,
    /// Idle timeout (ms) once FIN or RST was seen.
    #[arg(long, default_value_t = defaults::TCP_END_TIMEOUT_MS)]
    tcp_end_timeout_ms: u64,
    /// Producer id written into every record header.
    #[arg(long)]
    source_id: Option<String>,
}

/// Where records go.
#[derive(Args, Debug, Clone)]
pub struct SinkArgs {
    /// Write length-delimited FlowRecordBatch messages here ("-" = stdout).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Also produce to Kafka topic cgloop.flows.v1 at this bootstrap address.
    #[arg(long)]
    kafka: Option<String>,
    /// Memory budget of the Kafka send buffer, MiB.
    #[arg(long, default_value_t = 64)]
    kafka_buffer_mib: u64,
    /// Drop a batch the broker has not taken within this many seconds.
    #[arg(long, default_value_t = 300)]
    kafka_timeout_s: u64,
}

#[derive(Args)]
struct PcapArgs {
    /// Capture file (pcap or pcapng, optionally gzip-compressed).
    file: PathBuf,
    /// Sweep period on the capture's clock, ms (the probe's default); 0 = one record per flow.
    #[arg(long, default_value_t = defaults::INTERVAL_MS)]
    interval_ms: u64,
    /// Direction to write into the records: unspecified, ingress or egress.
    #[arg(long, default_value = "unspecified")]
    direction: String,
    #[command(flatten)]
    flow: FlowArgs,
    #[command(flatten)]
    sink: SinkArgs,
}

impl FlowArgs {
    fn settings(&self) -> FlowSettings {
        FlowSettings {
            burst_gap_us: self.burst_gap_us,
            rtp_clock_hz: self.rtp_clock_hz,
            rtp: !self.no_rtp,
            idle_timeout_ms: self.idle_timeout_ms,
            tcp_end_timeout_ms: self.tcp_end_timeout_ms,
            source_id: self.source_id.clone(),
        }
    }

    fn account(&self) -> AccountConfig {
        self.settings().account()
    }

    fn sweep(&self, default_source: String) -> SweepConfig {
        self.settings().sweep(default_source)
    }
}

/// File/stdout writer and Kafka producer behind one `emit`.
pub struct Sink {
    out: Option<Box<dyn Write>>,
    pub kafka: Option<FlowProducer>,
    pub records: u64,
}

impl Sink {
    pub fn open(args: &SinkArgs) -> Result<Self> {
        let out: Option<Box<dyn Write>> = match &args.output {
            None => None,
            Some(p) if p.as_os_str() == "-" => Some(Box::new(BufWriter::new(io::stdout().lock()))),
            Some(p) => Some(Box::new(BufWriter::new(
                File::create(p).with_context(|| format!("creating {}", p.display()))?,
            ))),
        };
        let kafka = match &args.kafka {
            None => None,
            Some(bootstrap) => Some(FlowProducer::new(&KafkaConfig {
                bootstrap: bootstrap.clone(),
                buffer_bytes: args.kafka_buffer_mib << 20,
                message_timeout: Duration::from_secs(args.kafka_timeout_s),
            })?),
        };
        Ok(Self {
            out,
            kafka,
            records: 0,
        })
    }

    pub fn emit(&mut self, records: Vec<FlowRecord>) -> Result<()> {
        self.records += records.len() as u64;
        if let Some(out) = &mut self.out {
            let batch = FlowRecordBatch { records };
            out.write_all(&batch.encode_length_delimited_to_vec())
                .context("writing records")?;
            if let Some(k) = &self.kafka {
                k.send(batch.records);
            }
        } else if let Some(k) = &self.kafka {
            k.send(records);
        }
        Ok(())
    }

    pub fn finish(&mut self) -> Result<()> {
        if let Some(out) = &mut self.out {
            out.flush().context("writing records")?;
        }
        if let Some(k) = &self.kafka {
            // Undelivered batches time out (and are counted dropped) within the message timeout.
            if let Err(e) =
                k.flush(k.message_timeout.min(Duration::from_secs(30)) + Duration::from_secs(2))
            {
                eprintln!(
                    "cgloop-probe: warning: {e:#}; {} messages left undelivered",
                    k.queue_depth()
                );
            }
        }
        Ok(())
    }
}

fn run_pcap(args: PcapArgs) -> Result<()> {
    let direction = pcap::direction_from_name(&args.direction).context("--direction")?;
    let name = args
        .file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let cfg = pcap::PcapConfig::new(&args.flow.settings(), args.interval_ms, direction, &name);
    let mut sink = Sink::open(&args.sink)?;
    let summary = pcap::run(&pcap::Capture::File(&args.file), &cfg, &mut |records| {
        sink.emit(records)
    })?;
    sink.finish()?;
    let mut stats = serde_json::Map::new();
    for (name, value) in summary.counters() {
        stats.insert(name.into(), value.into());
    }
    if let Some(k) = &sink.kafka {
        use std::sync::atomic::Ordering::Relaxed;
        stats.insert(
            "kafka_records_delivered".into(),
            k.stats.records_delivered.load(Relaxed).into(),
        );
        stats.insert(
            "kafka_records_dropped".into(),
            k.stats.records_dropped.load(Relaxed).into(),
        );
    }
    eprintln!("{}", serde_json::Value::Object(stats));
    Ok(())
}

fn main() {
    cgloop_obs::refuse_unknown_settings("cgloop-probe");
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Pcap(args) => run_pcap(args),
        Command::Run(args) => probe::run(args),
    };
    if let Err(e) = result {
        eprintln!("cgloop-probe: {e:#}");
        std::process::exit(1);
    }
}
