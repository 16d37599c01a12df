//! The offline twin: flow records from a pcap or pcapng capture (gzip accepted), with the probe's
//! parser, accounting and sweeps, on the capture's own clock. The binary's `pcap` mode and the
//! Python module cgloop.pcaprecords (training, `cgloop analytics pcap`, the dataset importers)
//! both run `run`, so every packet → record path in cgloop is this one.
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context, Result};
use cgloop_proto::v1::FlowRecord;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgParser};
use pcap_file::{DataLink, PcapError};

use crate::account::{account, new_flow, AccountConfig};
use crate::bpf_types::{
    key_bytes, FlowKey, FlowValue, KeyBytes, DIR_EGRESS, DIR_INGRESS, STAT_ACCOUNTED,
    STAT_FLOWS_CREATED, STAT_NAMES, STAT_PACKETS, STAT_RTP_CONFIRMED,
};
use crate::parse::{parse_ethernet, parse_ip, PacketInfo, Skip};
use crate::sweep::{SweepConfig, Sweeper};

/// Defaults of the settings that decide what a record contains: the probe's own (its CLI uses
/// these), so records made offline are the records the deployed probe exports.
pub mod defaults {
    pub const INTERVAL_MS: u64 = 100;
    pub const BURST_GAP_US: u64 = 1000;
    pub const RTP_CLOCK_HZ: u32 = 90_000;
    pub const IDLE_TIMEOUT_MS: u64 = 10_000;
    pub const TCP_END_TIMEOUT_MS: u64 = 1_000;
}

/// The record-shaping settings shared by the live probe and the twin, in the units of the CLI.
#[derive(Debug, Clone)]
pub struct FlowSettings {
    pub burst_gap_us: u64,
    pub rtp_clock_hz: u32,
    pub rtp: bool,
    pub idle_timeout_ms: u64,
    pub tcp_end_timeout_ms: u64,
    pub source_id: Option<String>,
}

impl Default for FlowSettings {
    fn default() -> Self {
        Self {
            burst_gap_us: defaults::BURST_GAP_US,
            rtp_clock_hz: defaults::RTP_CLOCK_HZ,
            rtp: true,
            idle_timeout_ms: defaults::IDLE_TIMEOUT_MS,
            tcp_end_timeout_ms: defaults::TCP_END_TIMEOUT_MS,
            source_id: None,
        }
    }
}

impl FlowSettings {
    pub fn account(&self) -> AccountConfig {
        AccountConfig {
            burst_gap_ns: self.burst_gap_us * 1000,
            rtp_default_clock_hz: self.rtp_clock_hz,
            rtp_enabled: self.rtp,
        }
    }

    pub fn sweep(&self, default_source: String) -> SweepConfig {
        SweepConfig {
            source_id: self.source_id.clone().unwrap_or(default_source),
            idle_timeout_ns: self.idle_timeout_ms * 1_000_000,
            tcp_end_timeout_ns: self.tcp_end_timeout_ms * 1_000_000,
        }
    }
}

/// The direction value written into records, from its name (a capture does not know it).
pub fn direction_from_name(name: &str) -> Result<u8> {
    Ok(match name {
        "unspecified" => 0,
        "ingress" => DIR_INGRESS,
        "egress" => DIR_EGRESS,
        other => bail!("direction {other:?}: expected unspecified, ingress or egress"),
    })
}

#[derive(Debug, Clone)]
pub struct PcapConfig {
    pub account: AccountConfig,
    pub sweep: SweepConfig,
    /// Sweep period on the capture clock; 0 = one record per flow for the whole capture.
    pub interval_ns: u64,
    /// Direction written into every key (a capture does not know it): 0, 1 ingress, 2 egress.
    pub direction: u8,
}

impl PcapConfig {
    /// The twin's configuration for a capture called `name` (file name; default source id
    /// `pcap/<name>`).
    pub fn new(flow: &FlowSettings, interval_ms: u64, direction: u8, name: &str) -> Self {
        Self {
            account: flow.account(),
            sweep: flow.sweep(format!("pcap/{name}")),
            interval_ns: interval_ms * 1_000_000,
            direction,
        }
    }
}

/// A capture that is not sound: which packet (1-based, in capture order) and where its record
/// or block starts in the uncompressed stream. libpcap and Wireshark refuse these files too.
#[derive(Debug, thiserror::Error)]
#[error("{name}: packet {packet} at byte offset {offset}: {what}")]
pub struct Damaged {
    pub name: String,
    pub packet: u64,
    pub offset: u64,
    pub what: String,
}

/// Counters of one run, by probe_stats slot, plus what the twin alone can see.
#[derive(Debug, Default, Clone)]
pub struct PcapSummary {
    pub stats: [u64; STAT_NAMES.len()],
    pub unsupported_link_frames: u64,
    pub records: u64,
}

impl PcapSummary {
    /// Every counter by name (the probe's stat names, then the twin's own).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut out: Vec<_> = STAT_NAMES.iter().copied().zip(self.stats).collect();
        out.push(("unsupported_link_frames", self.unsupported_link_frames));
        out.push(("records", self.records));
        out
    }
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

    /// One captured frame: parsed by its link type, or counted as a link type we do not read.
    fn frame(
        &mut self,
        link: DataLink,
        ts: u64,
        data: &[u8],
        wire_len: u32,
        sink: &mut dyn FnMut(Vec<FlowRecord>) -> Result<()>,
    ) -> Result<()> {
        match parse_frame(link, data, wire_len) {
            Some(parsed) => self.packet(ts, parsed, sink),
            None => {
                self.summary.unsupported_link_frames += 1;
                Ok(())
            }
        }
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

/// Where a capture comes from: a file, or its bytes (pcap, pcapng, or either gzip-compressed).
pub enum Capture<'a> {
    File(&'a Path),
    Bytes { name: &'a str, data: &'a [u8] },
}

impl Capture<'_> {
    fn name(&self) -> String {
        match self {
            Capture::File(p) => p.display().to_string(),
            Capture::Bytes { name, .. } => (*name).to_string(),
        }
    }
}

/// The uncompressed capture. Read whole: offsets in errors are then exact, and the same code
/// reads files and bytes.
fn load<'a>(capture: &Capture<'a>, name: &str) -> Result<Cow<'a, [u8]>> {
    let raw: Cow<'a, [u8]> = match capture {
        Capture::File(p) => {
            Cow::Owned(std::fs::read(p).with_context(|| format!("reading {name}"))?)
        }
        Capture::Bytes { data, .. } => Cow::Borrowed(*data),
    };
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw);
    }
    let mut out = Vec::with_capacity(raw.len() * 4);
    if let Err(e) = flate2::read::MultiGzDecoder::new(&raw[..]).read_to_end(&mut out) {
        bail!(
            "{name}: damaged or unreadable capture near uncompressed byte offset {}: {e}",
            out.len()
        );
    }
    Ok(Cow::Owned(out))
}

/// Reads the whole capture, handing record batches (one a sweep, in export order) to `sink`;
/// returns the run's counters. A damaged capture is refused with a [`Damaged`] error.
pub fn run(
    capture: &Capture<'_>,
    cfg: &PcapConfig,
    sink: &mut dyn FnMut(Vec<FlowRecord>) -> Result<()>,
) -> Result<PcapSummary> {
    let name = capture.name();
    let data = load(capture, &name)?;
    let mut twin = Twin::new(cfg);
    if data.len() < 4 {
        bail!("{name}: too short for a capture ({} bytes)", data.len());
    }
    if data[..4] == [0x0a, 0x0d, 0x0d, 0x0a] {
        read_pcapng(&name, &data, &mut twin, sink)?;
    } else {
        read_pcap(&name, &data, &mut twin, sink)?;
    }
    let end = twin.last_ts;
    twin.sweep(end, true, sink)?;
    Ok(twin.summary)
}

fn read_pcapng(
    name: &str,
    data: &[u8],
    twin: &mut Twin<'_>,
    sink: &mut dyn FnMut(Vec<FlowRecord>) -> Result<()>,
) -> Result<()> {
    let (mut src, mut parser) =
        PcapNgParser::new(data).map_err(|e| anyhow::anyhow!("{name}: bad pcapng header ({e})"))?;
    // (link type, tsresol) of each interface, in order of appearance.
    let mut ifaces: Vec<(DataLink, u8)> = Vec::new();
    let mut packets = 0u64;
    while !src.is_empty() {
        let offset = (data.len() - src.len()) as u64;
        let (rest, block) = parser.next_block(src).map_err(|e| Damaged {
            name: name.into(),
            packet: packets + 1,
            offset,
            what: match e {
                PcapError::IncompleteBuffer => "truncated pcapng block".into(),
                e => format!("bad pcapng block ({e})"),
            },
        })?;
        src = rest;
        let (iface, ts, wire_len, frame) = match block {
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
                (iface, ts, epb.original_len, epb.data)
            }
            // Simple packets carry no time: they share the previous packet's.
            Block::SimplePacket(spb) => (0, twin.last_ts, spb.original_len, spb.data),
            _ => continue,
        };
        packets += 1;
        let Some(&(link, _)) = ifaces.get(iface) else {
            return Err(Damaged {
                name: name.into(),
                packet: packets,
                offset,
                what: format!("refers to interface {iface}, which the capture never described"),
            }
            .into());
        };
        twin.frame(link, ts, &frame, wire_len, sink)?;
    }
    Ok(())
}

/// Classic pcap, read by the rules libpcap applies: a record longer than the snap length, or
/// one cut short, makes the file damaged.
fn read_pcap(
    name: &str,
    data: &[u8],
    twin: &mut Twin<'_>,
    sink: &mut dyn FnMut(Vec<FlowRecord>) -> Result<()>,
) -> Result<()> {
    let (little, frac_ns) = match data[..4] {
        [0xd4, 0xc3, 0xb2, 0xa1] => (true, 1_000),
        [0xa1, 0xb2, 0xc3, 0xd4] => (false, 1_000),
        [0x4d, 0x3c, 0xb2, 0xa1] => (true, 1),
        [0xa1, 0xb2, 0x3c, 0x4d] => (false, 1),
        _ => bail!(
            "{name}: not a pcap or pcapng file (starts with {:02x?})",
            &data[..4]
        ),
    };
    let u32_at = |at: usize| {
        let b = [data[at], data[at + 1], data[at + 2], data[at + 3]];
        if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    if data.len() < 24 {
        bail!("{name}: truncated pcap header ({} of 24 bytes)", data.len());
    }
    let snaplen = u32_at(16);
    // The upper bits of the link-type field carry FCS information, not the type.
    let link = DataLink::from(u32_at(20) & 0x0fff_ffff);
    let (mut offset, mut packet) = (24usize, 0u64);
    while offset < data.len() {
        packet += 1;
        let damaged = |what: String| Damaged {
            name: name.into(),
            packet,
            offset: offset as u64,
            what,
        };
        let left = data.len() - offset;
        if left < 16 {
            return Err(damaged(format!("truncated record header ({left} of 16 bytes)")).into());
        }
        let (ts_sec, ts_frac) = (u32_at(offset), u32_at(offset + 4));
        let (incl, orig) = (u32_at(offset + 8), u32_at(offset + 12));
        if snaplen > 0 && incl > snaplen {
            return Err(damaged(format!(
                "record length {incl} is beyond the snaplen {snaplen}"
            ))
            .into());
        }
        if (incl as usize) > left - 16 {
            let what = format!(
                "truncated record: {incl} bytes announced, {} left in the file",
                left - 16
            );
            return Err(damaged(what).into());
        }
        let frame = &data[offset + 16..offset + 16 + incl as usize];
        let ts = ts_sec as u64 * 1_000_000_000 + ts_frac as u64 * frac_ns;
        twin.frame(link, ts, frame, orig.max(incl), sink)?;
        offset += 16 + incl as usize;
    }
    if twin.summary.unsupported_link_frames > 0 && twin.summary.stats[STAT_PACKETS] == 0 {
        bail!("{name}: link type {link:?} is not supported (Ethernet, raw IP, Linux SLL/SLL2, BSD loopback are)");
    }
    Ok(())
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

    /// A µs pcap (raw IP) of `n` 28-byte UDP packets, one a second.
    fn capture(n: u32) -> Vec<u8> {
        let mut out = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&65535u32.to_le_bytes());
        out.extend_from_slice(&101u32.to_le_bytes());
        for i in 0..n {
            for v in [1_700_000_000 + i, 0, 28, 28] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            let mut ip = [0u8; 28];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&28u16.to_be_bytes());
            ip[9] = 17;
            ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
            ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
            ip[20..22].copy_from_slice(&(1000 + i as u16).to_be_bytes());
            ip[24..26].copy_from_slice(&8u16.to_be_bytes());
            out.extend_from_slice(&ip);
        }
        out
    }

    fn records(data: &[u8]) -> Result<Vec<FlowRecord>> {
        let cfg = PcapConfig::new(&FlowSettings::default(), 100, 0, "t.pcap");
        let mut out = Vec::new();
        run(
            &Capture::Bytes {
                name: "t.pcap",
                data,
            },
            &cfg,
            &mut |r| {
                out.extend(r);
                Ok(())
            },
        )?;
        Ok(out)
    }

    #[test]
    fn a_sound_capture_gives_every_packet() {
        let recs = records(&capture(3)).expect("sound capture");
        assert_eq!(recs.iter().map(|r| r.packets).sum::<u64>(), 3);
    }

    #[test]
    fn damaged_captures_name_the_packet_and_offset() {
        let good = capture(3); // records of 16 + 28 bytes after a 24-byte header
        let cases: [(Vec<u8>, u64, u64, &str); 3] = [
            (
                [&good[..], &[0u8; 7][..]].concat(),
                4,
                156,
                "truncated record header (7 of 16",
            ),
            (
                good[..good.len() - 10].to_vec(),
                3,
                112,
                "28 bytes announced, 18 left",
            ),
            (
                [&good[..16], &20u32.to_le_bytes()[..], &good[20..]].concat(),
                1,
                24,
                "record length 28 is beyond the snaplen 20",
            ),
        ];
        for (data, packet, offset, what) in cases {
            let err = records(&data).expect_err("damaged capture accepted");
            let d = err.downcast_ref::<Damaged>().expect("a Damaged error");
            assert_eq!((d.packet, d.offset), (packet, offset), "{d}");
            assert!(d.to_string().contains(what), "{d}");
        }
        let err = records(b"nope").expect_err("no capture accepted");
        assert!(
            err.to_string().contains("not a pcap or pcapng file"),
            "{err}"
        );
    }
}
