//! The offline twin: flow records from a pcap or pcapng capture (gzip accepted), with the probe's
//! parser, accounting and sweeps, on the capture's own clock.
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};
use cgloop_proto::v1::FlowRecord;
use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, TsResolution};

use crate::account::{account, new_flow, AccountConfig};
use crate::bpf_types::{
    key_bytes, FlowKey, FlowValue, KeyBytes, STAT_ACCOUNTED, STAT_FLOWS_CREATED, STAT_NAMES,
    STAT_PACKETS, STAT_RTP_CONFIRMED,
};
use crate::parse::{parse_ethernet, parse_ip, PacketInfo, Skip};
use crate::sweep::{SweepConfig, Sweeper};

#[derive(Debug, Clone)]
pub struct PcapConfig {
    pub account: AccountConfig,
    pub sweep: SweepConfig,
    /// Sweep period on the capture clock; 0 = one record per flow for the whole capture.
    pub interval_ns: u64,
    /// Direction written into every key (a capture does not know it): 0, 1 ingress, 2 egress.
    pub direction: u8,
}

/// Counters of one run, by probe_stats slot, plus what the twin alone can see.
#[derive(Debug, Default, Clone)]
pub struct PcapSummary {
    pub stats: [u64; STAT_NAMES.len()],
    pub unsupported_link_frames: u64,
    pub records: u64,
}

/// The flow table and clock of one capture.
struct Twin<'a> {
    cfg: &'a PcapConfig,
    table: HashMap<KeyBytes, (FlowKey, FlowValue)>,
    sweeper: Sweeper,
    epoch: u32,
    next_sweep: Option<u64>,
    last_ts: u64,
    summary: PcapSummary,
}

impl<'a> Twin<'a> {
    fn new(cfg: &'a PcapConfig) -> Self {
        Self {
            cfg,
            table: HashMap::new(),
            sweeper: Sweeper::new(cfg.sweep.clone()),
            epoch: 0,
            next_sweep: None,
            last_ts: 0,
            summary: PcapSummary::default(),
        }
    }

    fn sweep(
        &mut self,
        now: u64,
        finish: bool,
        sink: &mut dyn FnMut(Vec<FlowRecord>) -> Result<()>,
    ) -> Result<()> {
        // Table order (HashMap) is random per process: sort so a capture always gives the same
        // records with the same sequence numbers.
        let mut entries: Vec<_> = self.table.iter().map(|(k, e)| (*k, *e)).collect();
        entries.sort_unstable_by(|a, b| (a.1 .1.first_ns, a.0).cmp(&(b.1 .1.first_ns, b.0)));
        let entries: Vec<_> = entries.into_iter().map(|(_, e)| e).collect();
        let swept = self.sweeper.sweep(now, self.epoch, entries, finish);
        self.epoch = self.epoch.wrapping_add(1);
        for k in &swept.expired {
            self.table.remove(k);
        }
        self.summary.records += swept.records.len() as u64;
        if !swept.records.is_empty() {
            sink(swept.records)?;
        }
        Ok(())
    }

    fn packet(
        &mut self,
        ts: u64,
        parsed: Result<PacketInfo, Skip>,
        sink: &mut dyn FnMut(Vec<FlowRecord>) -> Result<()>,
    ) -> Result<()> {
        // Captures may step back in time (merged files): never let the clock run backwards.
        let ts = ts.max(self.last_ts);
        self.last_ts = ts;
        if self.cfg.interval_ns > 0 {
            let next = *self.next_sweep.get_or_insert(ts + self.cfg.interval_ns);
            if ts >= next {
                self.sweep(ts, false, sink)?;
                // Skip empty periods instead of sweeping each one.
                let periods = (ts - next) / self.cfg.interval_ns + 1;
                self.next_sweep = Some(next + periods * self.cfg.interval_ns);
            }
        }
        self.summary.stats[STAT_PACKETS] += 1;
        let mut p = match parsed {
            Ok(p) => p,
            Err(Skip(reason)) => {
                self.summary.stats[reason] += 1;
                return Ok(());
            }
        };
        p.key.direction = self.cfg.direction;
        let kb = key_bytes(&p.key);
        let epoch = self.epoch;
        let entry = self.table.entry(kb).or_insert_with(|| {
            self.summary.stats[STAT_FLOWS_CREATED] += 1;
            (p.key, new_flow(ts, epoch, p.l3_len))
        });
        if account(&mut entry.1, &p, ts, epoch, &self.cfg.account) {
            self.summary.stats[STAT_RTP_CONFIRMED] += 1;
        }
        self.summary.stats[STAT_ACCOUNTED] += 1;
        Ok(())
    }
}

/// Parses one frame of the given link type.
fn parse_frame(link: DataLink, data: &[u8], wire_len: u32) -> Option<Result<PacketInfo, Skip>> {
    let ip = |d: &[u8], off: usize| -> Result<PacketInfo, Skip> {
        let d = d.get(off..).unwrap_or(&[]);
        let wire = wire_len.saturating_sub(off as u32);
        match d.first().map(|b| b >> 4) {
            Some(6) => parse_ip(0x86dd, d, wire),
            _ => parse_ip(0x0800, d, wire),
        }
    };
    Some(match link {
        DataLink::ETHERNET => parse_ethernet(data, wire_len),
        DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => ip(data, 0),
        DataLink::NULL | DataLink::LOOP => ip(data, 4),
        DataLink::LINUX_SLL if data.len() >= 16 => {
            let proto = u16::from_be_bytes([data[14], data[15]]);
            parse_ip(proto, &data[16..], wire_len.saturating_sub(16))
        }
        DataLink::LINUX_SLL2 if data.len() >= 20 => {
            let proto = u16::from_be_bytes([data[0], data[1]]);
            parse_ip(proto, &data[20..], wire_len.saturating_sub(20))
        }
        DataLink::LINUX_SLL | DataLink::LINUX_SLL2 => Err(Skip(6)),
        _ => return None,
    })
}

fn open(path: &Path) -> Result<Box<dyn Read>> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut magic = [0u8; 2];
    let n = file
        .read(&mut magic)
        .with_context(|| format!("reading {}", path.display()))?;
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    if n == 2 && magic == [0x1f, 0x8b] {
        Ok(Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(
            BufReader::new(file),
        ))))
    } else {
        Ok(Box::new(BufReader::new(file)))
    }
}

/// pcapng timestamp units per second from if_tsresol (default microseconds).
fn ticks_to_ns(raw: u64, tsresol: u8) -> u64 {
    if tsresol & 0x80 == 0 {
        let exp = (tsresol & 0x7f) as u32;
        if exp <= 9 {
            raw.saturating_mul(10u64.pow(9 - exp))
        } else {
            raw / 10u64.pow((exp - 9).min(19))
        }
    } else {
        let exp = (tsresol & 0x7f) as u32;
        ((raw as u128 * 1_000_000_000u128) >> exp.min(127)) as u64
    }
}

/// Reads the whole capture, handing record batches to `sink`; returns the run's counters.
pub fn run(
    path: &Path,
    cfg: &PcapConfig,
    sink: &mut dyn FnMut(Vec<FlowRecord>) -> Result<()>,
) -> Result<PcapSummary> {
    let mut input = open(path)?;
    let mut head = [0u8; 4];
    input
        .read_exact(&mut head)
        .with_context(|| format!("{}: too short for a capture", path.display()))?;
    let input = std::io::Cursor::new(head).chain(input);
    let mut twin = Twin::new(cfg);
    let name = path.display();
    if head == [0x0a, 0x0d, 0x0d, 0x0a] {
        let mut reader =
            PcapNgReader::new(input).with_context(|| format!("{name}: bad pcapng header"))?;
        // (link type, tsresol) of each interface, in order of appearance.
        let mut ifaces: Vec<(DataLink, u8)> = Vec::new();
        while let Some(block) = reader.next_block() {
            let block = block.with_context(|| format!("{name}: bad pcapng block"))?;
            let (iface, ts, wire_len, data) = match block {
                Block::SectionHeader(_) => {
                    ifaces.clear();
                    continue;
                }
                Block::InterfaceDescription(idb) => {
                    let res = idb.options.iter().find_map(|o| match o {
                        InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
                        _ => None,
                    });
                    ifaces.push((idb.linktype, res.unwrap_or(6)));
                    continue;
                }
                Block::EnhancedPacket(epb) => {
                    let iface = epb.interface_id as usize;
                    // pcap-file hands the raw 64-bit tick count as ns: scale by the unit.
                    let res = ifaces.get(iface).map_or(6, |i| i.1);
                    let ts = ticks_to_ns(epb.timestamp.as_nanos() as u64, res);
                    (iface, ts, epb.original_len, epb.data.into_owned())
                }
                // Simple packets carry no time: they share the previous packet's.
                Block::SimplePacket(spb) => {
                    (0, twin.last_ts, spb.original_len, spb.data.into_owned())
                }
                _ => continue,
            };
            let Some(&(link, _)) = ifaces.get(iface) else {
                bail!(
                    "{name}: packet refers to interface {iface}, which the capture never described"
                );
            };
            match parse_frame(link, &data, wire_len) {
                Some(parsed) => twin.packet(ts, parsed, sink)?,
                None => twin.summary.unsupported_link_frames += 1,
            }
        }
    } else {
        let mut reader =
            PcapReader::new(input).with_context(|| format!("{name}: not a pcap or pcapng file"))?;
        let header = reader.header();
        let link = header.datalink;
        let frac_ns = match header.ts_resolution {
            TsResolution::MicroSecond => 1_000,
            TsResolution::NanoSecond => 1,
        };
        // Raw records: pcap-file 2.0 rejects orig_len > snaplen, i.e. every snaplen-cut packet.
        while let Some(pkt) = reader.next_raw_packet() {
            let pkt = pkt.with_context(|| format!("{name}: bad pcap record"))?;
            let ts = pkt.ts_sec as u64 * 1_000_000_000 + pkt.ts_frac as u64 * frac_ns;
            match parse_frame(link, &pkt.data, pkt.orig_len.max(pkt.incl_len)) {
                Some(parsed) => twin.packet(ts, parsed, sink)?,
                None => twin.summary.unsupported_link_frames += 1,
            }
        }
        if twin.summary.unsupported_link_frames > 0 && twin.summary.stats[STAT_PACKETS] == 0 {
            bail!("{name}: link type {link:?} is not supported (Ethernet, raw IP, Linux SLL/SLL2, BSD loopback are)");
        }
    }
    let end = twin.last_ts;
    twin.sweep(end, true, sink)?;
    Ok(twin.summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsresol_units() {
        assert_eq!(ticks_to_ns(5, 6), 5_000);
        assert_eq!(ticks_to_ns(5, 9), 5);
        assert_eq!(ticks_to_ns(1024, 0x80 | 10), 1_000_000_000);
    }
}
