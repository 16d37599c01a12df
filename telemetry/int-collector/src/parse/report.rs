//! Telemetry report packets (the UDP payload a switch sends to the collector), three formats:
//!
//! * v2.0 — Telemetry Report Format v2.0 (2020-10-08), §3.2 group header, §3.3 individual
//!   report header, §3.3.1 INT main contents, §3.3.2 TLVs.
//! * v1.0 — Telemetry Report v1.0 as emitted by the BMv2 INT programs: a 16-byte fixed header
//!   {ver 4, len 4, nproto 3, rep_md_bits 6, rsvd 6, d 1, q 1, f 1, hw_id 6, switch id 32,
//!   sequence 32, ingress timestamp 32} then the Ethernet frame with its INT v1.0 stack.
//! * v0.5 — Telemetry Report v0.5 as emitted by ONOS/Stratum fabric pipelines: a 12-byte fixed
//!   header {ver 4, nproto 4, d 1, q 1, f 1, rsvd 15, hw_id 6, sequence 32, ingress ts 32},
//!   then (nproto 1) a 12-byte drop report header {switch id 32, ingress port 16, egress port
//!   16, queue id 8, drop reason 8, pad 16} or (nproto 2) a 16-byte switch-local header
//!   {switch id 32, ingress port 16, egress port 16, queue id 8, queue occupancy 24, egress
//!   ts 32}, then the Ethernet frame.
//!
//! The version nibble of the first byte picks the format (0, 1 or 2).

use super::inner::{self, Inner, InnerType, IntDetect};
use super::metadata::{self, HopMetadata, Layout};
use super::wire::{rest, take, u16_at, u32_at, ParseError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Format {
    V05,
    V10,
    V20,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::V05 => "v0.5",
            Format::V10 => "v1.0",
            Format::V20 => "v2.0",
        }
    }
}

/// Domain-specific part of a v2.0 INT report (§3.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DomainData<'a> {
    pub id: u16,
    pub md_bits: u16,
    pub md_status: u16,
    /// Variable Optional Domain Specific Metadata (format known only to the domain).
    pub metadata: &'a [u8],
    /// Additional DS Extension Data (InType 2, or the first TLV of type 0).
    pub extension: &'a [u8],
    /// TLV Data Template of that TLV (0 for InType 2).
    pub extension_template: u16,
}

/// One individual report: one data packet seen by one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report<'a> {
    pub format: Format,
    /// Reporting node (v2.0 group header Node ID; v1.0 switch id; v0.5 local/drop header).
    pub node_id: u32,
    pub hw_id: u8,
    /// 22 bits in v2.0, 32 bits in v0.5/v1.0.
    pub sequence: u32,
    /// D: a packet of a watched flow was dropped.
    pub dropped: bool,
    /// Q: congestion on a monitored queue.
    pub congested: bool,
    /// F: tracked flow.
    pub tracked: bool,
    /// I: intermediate report (v2.0 only).
    pub intermediate: bool,
    /// v2.0 RepType (0 inner only, 1 INT); v0.5/v1.0 next-protocol value.
    pub rep_type: u8,
    /// 32-bit ingress timestamp of the v0.5/v1.0 fixed header.
    pub ingress_timestamp: Option<u32>,
    /// The reporting node's own metadata (v2.0 RepMdBits; v0.5 local/drop header).
    pub local: Option<HopMetadata>,
    pub domain: DomainData<'a>,
    /// The data packet and its embedded INT stack.
    pub inner: Inner<'a>,
}

/// Parse one report packet; `visit` gets each individual report (or why it failed). Returns
/// the number of individual reports seen, or the error that stopped the packet (reports
/// visited before it are good and kept).
pub fn parse_packet<'a>(
    buf: &'a [u8],
    detect: &IntDetect,
    visit: &mut dyn FnMut(Result<Report<'a>>),
) -> Result<usize> {
    let first = *buf.first().ok_or(ParseError::Truncated { what: "report", need: 1, have: 0 })?;
    match first >> 4 {
        0 => parse_v05(buf, detect).map(|r| {
            visit(Ok(r));
            1
        }),
        1 => parse_v10(buf, detect).map(|r| {
            visit(Ok(r));
            1
        }),
        2 => parse_v20(buf, detect, visit),
        v => Err(ParseError::Unsupported { what: "report.version", value: u32::from(v) }),
    }
}

fn parse_v05<'a>(buf: &'a [u8], detect: &IntDetect) -> Result<Report<'a>> {
    let h = take(buf, 0, 12, "v0.5.fixed_header")?;
    let nproto = h[0] & 0x0f;
    let mut r = Report {
        format: Format::V05,
        node_id: 0,
        hw_id: h[3] & 0x3f,
        sequence: u32_at(h, 4, "v0.5.seq")?,
        dropped: h[1] & 0x80 != 0,
        congested: h[1] & 0x40 != 0,
        tracked: h[1] & 0x20 != 0,
        intermediate: false,
        rep_type: nproto,
        ingress_timestamp: Some(u32_at(h, 8, "v0.5.ig_tstamp")?),
        local: None,
        domain: DomainData::default(),
        inner: Inner::default(),
    };
    let frame = match nproto {
        0 => rest(buf, 12, "v0.5.ethernet")?,
        1 => {
            let d = take(buf, 12, 12, "v0.5.drop_header")?;
            r.node_id = u32_at(d, 0, "v0.5.drop_header")?;
            r.local = Some(HopMetadata {
                node_id: Some(r.node_id),
                l1_ingress_port: Some(u16_at(d, 4, "v0.5.drop_header")?),
                l1_egress_port: Some(u16_at(d, 6, "v0.5.drop_header")?),
                queue_id: Some(d[8]),
                drop_reason: Some(d[9]),
                ..HopMetadata::default()
            });
            rest(buf, 24, "v0.5.ethernet")?
        }
        2 => {
            let l = take(buf, 12, 16, "v0.5.local_header")?;
            r.node_id = u32_at(l, 0, "v0.5.local_header")?;
            let q = u32_at(l, 8, "v0.5.local_header")?;
            let eg = u32_at(l, 12, "v0.5.local_header")?;
            let ig = r.ingress_timestamp.unwrap_or(0);
            r.local = Some(HopMetadata {
                node_id: Some(r.node_id),
                l1_ingress_port: Some(u16_at(l, 4, "v0.5.local_header")?),
                l1_egress_port: Some(u16_at(l, 6, "v0.5.local_header")?),
                queue_id: Some((q >> 24) as u8),
                queue_occupancy: Some(q & 0x00ff_ffff),
                ingress_timestamp: Some(u64::from(ig)),
                egress_timestamp: Some(u64::from(eg)),
                // 32-bit ns timestamps of the same switch: the difference is the hop latency
                // (wrapping, as the counters do every ~4.3 s).
                hop_latency: Some(eg.wrapping_sub(ig)),
                ..HopMetadata::default()
            });
            rest(buf, 28, "v0.5.ethernet")?
        }
        n => return Err(ParseError::Unsupported { what: "v0.5.nproto", value: u32::from(n) }),
    };
    if !frame.is_empty() {
        r.inner = inner::parse(frame, InnerType::Ethernet, detect)?;
    }
    Ok(r)
}

fn parse_v10<'a>(buf: &'a [u8], detect: &IntDetect) -> Result<Report<'a>> {
    let h = take(buf, 0, 16, "v1.0.fixed_header")?;
    let len = usize::from(h[0] & 0x0f) * 4;
    if len < 16 {
        return Err(ParseError::Invalid { what: "v1.0.len", detail: "below the 4-word fixed header", value: u32::from(h[0] & 0x0f) });
    }
    let nproto = h[1] >> 5;
    if nproto != 0 {
        return Err(ParseError::Unsupported { what: "v1.0.nproto", value: u32::from(nproto) });
    }
    let frame = rest(buf, len, "v1.0.ethernet")?;
    Ok(Report {
        format: Format::V10,
        node_id: u32_at(h, 4, "v1.0.switch_id")?,
        hw_id: h[3] & 0x3f,
        sequence: u32_at(h, 8, "v1.0.seq")?,
        dropped: h[2] & 0x04 != 0,
        congested: h[2] & 0x02 != 0,
        tracked: h[2] & 0x01 != 0,
        intermediate: false,
        rep_type: nproto,
        ingress_timestamp: Some(u32_at(h, 12, "v1.0.ingress_tstamp")?),
        local: None,
        domain: DomainData::default(),
        inner: if frame.is_empty() { Inner::default() } else { inner::parse(frame, InnerType::Ethernet, detect)? },
    })
}

fn parse_v20<'a>(
    buf: &'a [u8],
    detect: &IntDetect,
    visit: &mut dyn FnMut(Result<Report<'a>>),
) -> Result<usize> {
    // §3.2 Telemetry Report Group Header: Ver 4 | hw_id 6 | Sequence Number 22 | Node ID 32.
    let g = take(buf, 0, 8, "v2.0.group_header")?;
    let w0 = u32_at(g, 0, "v2.0.group_header")?;
    let hw_id = ((w0 >> 22) & 0x3f) as u8;
    let sequence = w0 & 0x003f_ffff;
    let node_id = u32_at(g, 4, "v2.0.group_header")?;
    let mut at = 8;
    let mut count = 0;
    while at < buf.len() {
        // §3.3 Individual Report Header: RepType 4 | InType 4 | Report Length 8 | MD Length 8 |
        // D Q F I | Rsvd 4. Report Length counts words after this first word; 0xFF means
        // "to the end of the UDP payload".
        let h = take(buf, at, 4, "v2.0.report_header")?;
        let rep_len = if h[1] == 0xff { buf.len() - at - 4 } else { usize::from(h[1]) * 4 };
        let body = take(buf, at + 4, rep_len, "v2.0.report_length")?;
        at += 4 + rep_len;
        count += 1;
        visit(parse_individual(h, body, node_id, hw_id, sequence, detect));
    }
    if count == 0 {
        return Err(ParseError::Truncated { what: "v2.0.report_header", need: 4, have: 0 });
    }
    Ok(count)
}

fn parse_individual<'a>(
    h: &[u8],
    body: &'a [u8],
    node_id: u32,
    hw_id: u8,
    sequence: u32,
    detect: &IntDetect,
) -> Result<Report<'a>> {
    let rep_type = h[0] >> 4;
    let in_type = h[0] & 0x0f;
    let md_len = usize::from(h[2]) * 4;
    let mut r = Report {
        format: Format::V20,
        node_id,
        hw_id,
        sequence,
        dropped: h[3] & 0x80 != 0,
        congested: h[3] & 0x40 != 0,
        tracked: h[3] & 0x20 != 0,
        intermediate: h[3] & 0x10 != 0,
        rep_type,
        ingress_timestamp: None,
        local: None,
        domain: DomainData::default(),
        inner: Inner::default(),
    };
    let inner_at = match rep_type {
        // Inner Only: no main contents; MD Length "ignored upon reception".
        0 => 0,
        // §3.3.1: RepMdBits 16 | Domain Specific ID 16 | DSMdBits 16 | DSMdstatus 16, then
        // MD Length words of baseline metadata followed by domain-specific metadata.
        1 => {
            let m = take(body, 0, 8, "v2.0.int_main")?;
            let rep_md_bits = u16::from_be_bytes([m[0], m[1]]);
            let md = take(body, 8, md_len, "v2.0.md_length")?;
            let (mut local, used) = metadata::decode(rep_md_bits, md, Layout::ReportV2)
                .map_err(|_| ParseError::Invalid {
                    what: "v2.0.md_length",
                    detail: "shorter than RepMdBits metadata",
                    value: u32::from(h[2]),
                })?;
            local.node_id = Some(node_id);
            r.local = Some(local);
            r.domain.id = u16::from_be_bytes([m[2], m[3]]);
            r.domain.md_bits = u16::from_be_bytes([m[4], m[5]]);
            r.domain.md_status = u16::from_be_bytes([m[6], m[7]]);
            r.domain.metadata = &md[used..];
            8 + md_len
        }
        t => return Err(ParseError::Unsupported { what: "v2.0.rep_type", value: u32::from(t) }),
    };
    let contents = rest(body, inner_at, "v2.0.inner_contents")?;
    match in_type {
        0 => {}
        1 => parse_tlvs(contents, &mut r, detect)?,
        2 => r.domain.extension = contents,
        3 => r.inner = inner::parse(contents, InnerType::Ethernet, detect)?,
        4 => r.inner = inner::parse(contents, InnerType::Ipv4, detect)?,
        5 => r.inner = inner::parse(contents, InnerType::Ipv6, detect)?,
        t => return Err(ParseError::Unsupported { what: "v2.0.in_type", value: u32::from(t) }),
    }
    Ok(r)
}

/// §3.3.2 TLVs: TLVType 4 | Rsvd 4 | TLVLength 8 (words after the first) | Template 16.
fn parse_tlvs<'a>(mut buf: &'a [u8], r: &mut Report<'a>, detect: &IntDetect) -> Result<()> {
    while !buf.is_empty() {
        let h = take(buf, 0, 4, "v2.0.tlv")?;
        let ty = h[0] >> 4;
        let len = usize::from(h[1]) * 4;
        let template = u16::from_be_bytes([h[2], h[3]]);
        let data = take(buf, 4, len, "v2.0.tlv.length")?;
        match ty {
            0 if r.domain.extension.is_empty() => {
                r.domain.extension = data;
                r.domain.extension_template = template;
            }
            0 => {}
            1 => r.inner = inner::parse(data, InnerType::Ethernet, detect)?,
            2 => r.inner = inner::parse(data, InnerType::Ipv4, detect)?,
            3 => r.inner = inner::parse(data, InnerType::Ipv6, detect)?,
            t => return Err(ParseError::Unsupported { what: "v2.0.tlv.type", value: u32::from(t) }),
        }
        buf = &buf[4 + len..];
    }
    Ok(())
}
