//! cgloop-probe: the XDP/tc flow probe's exporter (`run`) and its offline twin (`pcap`).
//!
//! Both write flow records as length-delimited `cgloop.v1.FlowRecordBatch` messages (one per
//! sweep) to a file or stdout, and/or produce them to Kafka topic `cgloop.flows.v1`.
mod account;
#[cfg(test)]
mod agreement;
mod bpf_types;
mod kafka;
mod metrics;
mod parse;
mod pcap;
mod probe;
mod sweep;

mod skel {
    #![allow(clippy::all, unused_imports, dead_code, non_camel_case_types)]
    include!(concat!(env!("OUT_DIR"), "/flow_probe.skel.rs"));
}

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use cgloop_proto::v1::{FlowRecord, FlowRecordBatch};
use clap::{Args, Parser, Subcommand};
use prost::Message;

use crate::account::AccountConfig;
use crate::kafka::{FlowProducer, KafkaConfig};
use crate::sweep::SweepConfig;

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
    #[arg(long, default_value_t = 1000)]
    burst_gap_us: u64,
    /// RTP clock for dynamic payload types (96-127), Hz.
    #[arg(long, default_value_t = 90_000)]
    rtp_clock_hz: u32,
    /// Do not look for RTP headers in UDP payloads.
    #[arg(long)]
    no_rtp: bool,
    /// A flow idle this long (ms) gets its final record and leaves the table.
    #[arg(long, default_value_t = 10_000)]
    idle_timeout_ms: u64,
    /// Idle timeout (ms) once FIN or RST was seen.
    #[arg(long, default_value_t = 1_000)]
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
    #[arg(long, default_value_t = 100)]
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
    fn account(&self) -> AccountConfig {
        AccountConfig {
            burst_gap_ns: self.burst_gap_us * 1000,
            rtp_default_clock_hz: self.rtp_clock_hz,
            rtp_enabled: !self.no_rtp,
        }
    }

    fn sweep(&self, default_source: String) -> SweepConfig {
        SweepConfig {
            source_id: self.source_id.clone().unwrap_or(default_source),
            idle_timeout_ns: self.idle_timeout_ms * 1_000_000,
            tcp_end_timeout_ns: self.tcp_end_timeout_ms * 1_000_000,
        }
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
    let direction = match args.direction.as_str() {
        "unspecified" => 0,
        "ingress" => bpf_types::DIR_INGRESS,
        "egress" => bpf_types::DIR_EGRESS,
        other => anyhow::bail!("--direction {other:?}: expected unspecified, ingress or egress"),
    };
    let name = args
        .file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let cfg = pcap::PcapConfig {
        account: args.flow.account(),
        sweep: args.flow.sweep(format!("pcap/{name}")),
        interval_ns: args.interval_ms * 1_000_000,
        direction,
    };
    let mut sink = Sink::open(&args.sink)?;
    let summary = pcap::run(&args.file, &cfg, &mut |records| sink.emit(records))?;
    sink.finish()?;
    let mut stats = serde_json::Map::new();
    for (name, value) in bpf_types::STAT_NAMES.iter().zip(summary.stats) {
        stats.insert((*name).into(), value.into());
    }
    stats.insert(
        "unsupported_link_frames".into(),
        summary.unsupported_link_frames.into(),
    );
    stats.insert("records".into(), summary.records.into());
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
