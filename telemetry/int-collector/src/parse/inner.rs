//! The (truncated) data packet a report carries, and the INT headers embedded in it.
//!
//! Telemetry Report v2.0 §3.3 *InType* 3/4/5 (Ethernet, IPv4, IPv6) and §3.3.2 TLV types 1-3
//! carry "L2/L3/ESP/L4 of the packet for flow details"; with INT-MD the metadata stack of the
//! previous hops is embedded in it (§3.4 "Embedded Telemetry Metadata In Stacked Reports").
//! INT v2.1 §5.6.2 "INT over TCP/UDP" places the shim after the L4 header, signalled by a UDP
//! destination port (INT_TBD) or by a DSCP value; v1.0 programs use the DSCP option.

use super::metadata::{self, hop_ml_error, CompactHop, HopMetadata, Layout, Plan};
use super::wire::{rest, take, u16_at, u8_at, ParseError, Result};

/// Header at the start of the truncated packet (Report v2.0 §3.3 InType / §3.3.2 TLVType).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InnerType {
    Ethernet,
    Ipv4,
    Ipv6,
}

/// How INT is recognised inside the data packet (INT v2.1 §5.6.2 options 1 and 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntDetect {
    /// UDP destination ports meaning "INT follows" (INT_TBD has no IANA number: deployment
    /// configuration).
    pub udp_ports: Vec<u16>,
    /// DSCP value and mask meaning "INT follows the TCP/UDP header" (v1.0 BMv2 programs and the
    /// INT v2.1 §6.1 example use 0x17).
    pub dscp: Option<(u8, u8)>,
}

impl Default for IntDetect {
    fn default() -> Self {
        IntDetect { udp_ports: vec![DEFAULT_INT_UDP_PORT], dscp: Some((0x17, 0x3f)) }
    }
}

/// cgloop's default INT_TBD port (configurable; the spec leaves it to the deployment).
pub const DEFAULT_INT_UDP_PORT: u16 = 5900;

/// The inner flow (5-tuple). IPv4 addresses sit in the first 4 bytes of `src`/`dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub v6: bool,
    pub src_port: u16,
    pub dst_port: u16,
    pub proto: u8,
}

/// Hashed as five 64-bit words (the derived impl feeds the hasher field by field, with length
/// prefixes for the arrays: 3x the work per lookup on the per-report path).
impl std::hash::Hash for FlowKey {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let w = |b: &[u8; 16], i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_ne_bytes(a)
        };
        state.write_u64(w(&self.src, 0));
        state.write_u64(w(&self.src, 8));
        state.write_u64(w(&self.dst, 0));
        state.write_u64(w(&self.dst, 8));
        state.write_u64(
            u64::from(self.src_port)
                | u64::from(self.dst_port) << 16
                | u64::from(self.proto) << 32
                | u64::from(self.v6) << 40,
        );
    }
}

impl FlowKey {
    pub fn src_addr(&self) -> &[u8] {
        if self.v6 { &self.src } else { &self.src[..4] }
    }
    pub fn dst_addr(&self) -> &[u8] {
        if self.v6 { &self.dst } else { &self.dst[..4] }
    }
}

/// INT header type (INT v2.1 §5.1 "INT Header Types").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntKind {
    Md,
    Destination,
    Mx,
}

/// A parsed INT shim + metadata header; `stack` borrows the packet (zero-copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntHeader<'a> {
    /// INT version from the metadata header (1 or 2).
    pub version: u8,
    pub kind: IntKind,
    /// Shim NPT (v2.1 §5.6.2): 0 DSCP/other, 1 original UDP payload, 2 original L4 header.
    pub npt: u8,
    /// Shim's last 16 bits: original UDP port (NPT 1), IP proto (NPT 2) or DSCP (NPT 0).
    pub shim_field: u16,
    /// D (discard), E (max hop count exceeded), M (MTU exceeded) (v2.1 §5.7).
    pub discard: bool,
    pub hop_count_exceeded: bool,
    pub mtu_exceeded: bool,
    /// Hop ML: per-hop metadata length in 4-byte words.
    pub hop_ml: u8,
    pub remaining_hop_count: u8,
    pub instruction_bitmap: u16,
    pub domain_id: u16,
    pub ds_instruction: u16,
    pub ds_flags: u16,
    /// INT-MD: the metadata stack (newest hop first). INT-MX: source-inserted DS metadata.
    pub stack: &'a [u8],
    /// Bytes from the shim to the end of the INT headers.
    pub total_len: usize,
}

impl<'a> IntHeader<'a> {
    fn layout(&self) -> Layout {
        if self.version == 1 { Layout::IntV1 } else { Layout::IntV2 }
    }

    /// Hops of an INT-MD stack, newest (closest to the sink) first. Bytes left after the last
    /// whole hop are the source's 'source-only' domain-specific metadata (v2.1 §5.7).
    pub fn hops(&self) -> Hops<'a> {
        let stride = usize::from(self.hop_ml) * 4;
        let stack = if self.kind == IntKind::Md { self.stack } else { &[][..] };
        Hops { stack, stride, plan: Plan::new(self.instruction_bitmap, self.layout()), at: 0 }
    }
}

impl<'a> IntHeader<'a> {
    /// The stack's hops as the collector's compact records, newest first; stops at the first
    /// hop that cannot be decoded (as `hops().flatten()` does).
    pub fn compact_hops(&self) -> impl Iterator<Item = CompactHop> + 'a {
        let stride = usize::from(self.hop_ml) * 4;
        let stack = if self.kind == IntKind::Md && stride > 0 { self.stack } else { &[][..] };
        let plan = Plan::new(self.instruction_bitmap, self.layout());
        stack.chunks_exact(stride.max(1)).map_while(move |hop| plan.decode_compact(hop).ok())
    }
}

/// Iterator over a metadata stack; yields each hop's baseline metadata and its domain-specific
/// bytes (Hop ML minus the baseline length).
pub struct Hops<'a> {
    stack: &'a [u8],
    stride: usize,
    /// Item offsets of the bitmap, computed once for all hops.
    plan: Plan,
    at: usize,
}

impl<'a> Iterator for Hops<'a> {
    type Item = Result<(HopMetadata, &'a [u8])>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.stride == 0 || self.stack.len().saturating_sub(self.at) < self.stride {
            return None;
        }
        let hop = &self.stack[self.at..self.at + self.stride];
        self.at += self.stride;
        Some(match self.plan.decode(hop) {
            Ok(md) => Ok((md, hop.get(self.plan.size()..).unwrap_or(&[]))),
            Err(_) => {
                self.at = self.stack.len();
                Err(hop_ml_error((self.stride / 4) as u8))
            }
        })
    }
}

/// The data packet of a report: its flow and the INT headers it carries, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Inner<'a> {
    pub flow: Option<FlowKey>,
    pub int: Option<IntHeader<'a>>,
}

const ETH_P_IPV4: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_VLAN: u16 = 0x8100;
const ETH_P_QINQ: u16 = 0x88a8;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

/// Parse the truncated packet. A packet cut short after the IP header still yields its flow
/// with ports 0; a malformed INT header is an error.
pub fn parse<'a>(buf: &'a [u8], ty: InnerType, detect: &IntDetect) -> Result<Inner<'a>> {
    match ty {
        InnerType::Ethernet => {
            let mut at = 12;
            let mut ethertype = u16_at(buf, at, "inner.ethernet")?;
            // Up to two VLAN tags (802.1Q / 802.1ad).
            for _ in 0..2 {
                if ethertype == ETH_P_VLAN || ethertype == ETH_P_QINQ {
                    at += 4;
                    ethertype = u16_at(buf, at, "inner.vlan")?;
                }
            }
            let l3 = rest(buf, at + 2, "inner.ethernet")?;
            match ethertype {
                ETH_P_IPV4 => parse_ipv4(l3, detect),
                ETH_P_IPV6 => parse_ipv6(l3, detect),
                _ => Ok(Inner::default()),
            }
        }
        InnerType::Ipv4 => parse_ipv4(buf, detect),
        InnerType::Ipv6 => parse_ipv6(buf, detect),
    }
}

fn parse_ipv4<'a>(buf: &'a [u8], detect: &IntDetect) -> Result<Inner<'a>> {
    let vihl = u8_at(buf, 0, "inner.ipv4")?;
    if vihl >> 4 != 4 {
        return Err(ParseError::Invalid { what: "inner.ipv4", detail: "version is not 4", value: u32::from(vihl >> 4) });
    }
    let ihl = usize::from(vihl & 0x0f) * 4;
    if ihl < 20 {
        return Err(ParseError::Invalid { what: "inner.ipv4", detail: "IHL below 5", value: ihl as u32 / 4 });
    }
    let hdr = take(buf, 0, 20, "inner.ipv4")?;
    let dscp = hdr[1] >> 2;
    let frag_off = u16::from_be_bytes([hdr[6], hdr[7]]) & 0x1fff;
    let mut key = FlowKey { proto: hdr[9], ..FlowKey::default() };
    key.src[..4].copy_from_slice(&hdr[12..16]);
    key.dst[..4].copy_from_slice(&hdr[16..20]);
    if frag_off != 0 {
        return Ok(Inner { flow: Some(key), int: None });
    }
    let l4 = buf.get(ihl..).unwrap_or(&[]);
    parse_l4(key, dscp, l4, detect)
}

fn parse_ipv6<'a>(buf: &'a [u8], detect: &IntDetect) -> Result<Inner<'a>> {
    let hdr = take(buf, 0, 40, "inner.ipv6")?;
    if hdr[0] >> 4 != 6 {
        return Err(ParseError::Invalid { what: "inner.ipv6", detail: "version is not 6", value: u32::from(hdr[0] >> 4) });
    }
    let traffic_class = (hdr[0] << 4) | (hdr[1] >> 4);
    let mut key = FlowKey { v6: true, proto: hdr[6], ..FlowKey::default() };
    key.src.copy_from_slice(&hdr[8..24]);
    key.dst.copy_from_slice(&hdr[24..40]);
    parse_l4(key, traffic_class >> 2, &buf[40..], detect)
}

fn parse_l4<'a>(mut key: FlowKey, dscp: u8, l4: &'a [u8], detect: &IntDetect) -> Result<Inner<'a>> {
    let l4_len = match key.proto {
        IPPROTO_TCP if l4.len() >= 13 => usize::from(l4[12] >> 4) * 4,
        IPPROTO_UDP => 8,
        _ => return Ok(Inner { flow: Some(key), int: None }),
    };
    if l4.len() < 4 {
        // Truncated before the ports: the flow is still known by addresses and protocol.
        return Ok(Inner { flow: Some(key), int: None });
    }
    key.src_port = u16::from_be_bytes([l4[0], l4[1]]);
    key.dst_port = u16::from_be_bytes([l4[2], l4[3]]);
    let udp_int = key.proto == IPPROTO_UDP && detect.udp_ports.contains(&key.dst_port);
    let dscp_int = matches!(detect.dscp, Some((v, m)) if dscp & m == v & m);
    if !udp_int && !dscp_int {
        return Ok(Inner { flow: Some(key), int: None });
    }
    if key.proto == IPPROTO_TCP && l4_len < 20 {
        return Err(ParseError::Invalid { what: "inner.tcp", detail: "data offset below 5", value: l4_len as u32 / 4 });
    }
    let shim = rest(l4, l4_len, "int.shim")?;
    let int = parse_int(shim)?;
    if udp_int {
        match int.npt {
            // Original UDP destination port carried in the shim.
            1 => key.dst_port = int.shim_field,
            // A UDP header was inserted; the original L4 header follows the INT stack.
            2 => {
                key.proto = int.shim_field as u8;
                key.src_port = 0;
                key.dst_port = 0;
                let orig = shim.get(int.total_len..).unwrap_or(&[]);
                if orig.len() >= 4 {
                    key.src_port = u16::from_be_bytes([orig[0], orig[1]]);
                    key.dst_port = u16::from_be_bytes([orig[2], orig[3]]);
                }
            }
            _ => {}
        }
    }
    Ok(Inner { flow: Some(key), int: Some(int) })
}

/// Parse an INT shim (v1.0 or v2.1 §5.6.2) and the MD/MX header after it.
pub fn parse_int(buf: &[u8]) -> Result<IntHeader<'_>> {
    let shim = take(buf, 0, 4, "int.shim")?;
    // A v1.0 shim starts with an 8-bit type (1 = hop-by-hop); a v2.x shim with a 4-bit type in
    // the high nibble, so 0x01 is never a valid v2 shim.
    if shim[0] == 0x01 {
        return parse_int_v1(buf);
    }
    let ty = shim[0] >> 4;
    let npt = (shim[0] >> 2) & 0x3;
    let len = usize::from(shim[1]) * 4; // excludes the shim since INT 2.0
    let shim_field = u16::from_be_bytes([shim[2], shim[3]]);
    let kind = match ty {
        1 => IntKind::Md,
        2 => IntKind::Destination,
        3 => IntKind::Mx,
        _ => return Err(ParseError::Unsupported { what: "int.shim.type", value: u32::from(ty) }),
    };
    let body = take(buf, 4, len, "int.shim.length")?;
    let base = IntHeader {
        version: 2, kind, npt, shim_field, discard: false, hop_count_exceeded: false,
        mtu_exceeded: false, hop_ml: 0, remaining_hop_count: 0, instruction_bitmap: 0,
        domain_id: 0, ds_instruction: 0, ds_flags: 0, stack: &[], total_len: 4 + len,
    };
    if kind == IntKind::Destination {
        // Format "will be defined in a future revision" (v2.1 §5.1): kept opaque.
        return Ok(IntHeader { stack: body, ..base });
    }
    let h = take(body, 0, 12, "int.md_header")?;
    let version = h[0] >> 4;
    if version != 2 {
        return Err(ParseError::Unsupported { what: "int.md_header.version", value: u32::from(version) });
    }
    let w = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
    let mut out = IntHeader {
        version,
        discard: h[0] & 0x08 != 0,
        instruction_bitmap: w(4),
        domain_id: w(6),
        ds_instruction: w(8),
        ds_flags: w(10),
        stack: &body[12..],
        ..base
    };
    if kind == IntKind::Md {
        out.hop_count_exceeded = h[0] & 0x04 != 0;
        out.mtu_exceeded = h[0] & 0x02 != 0;
        out.hop_ml = h[2] & 0x1f;
        out.remaining_hop_count = h[3];
        check_hop_ml(&out)?;
    }
    Ok(out)
}

/// INT v1.0: shim {type 8, rsvd 8, length 8 (words, shim included), DSCP 6 + rsvd 2} and an
/// 8-byte header {ver 4, rep 2, c 1, e 1, m 1, rsvd 10, hop ML 5, remaining hops 8,
/// instruction mask 16, rsvd 16}.
fn parse_int_v1(buf: &[u8]) -> Result<IntHeader<'_>> {
    let shim = take(buf, 0, 4, "int_v1.shim")?;
    let len = usize::from(shim[2]) * 4;
    if len < 12 {
        return Err(ParseError::Invalid { what: "int_v1.shim.length", detail: "shorter than shim + header", value: u32::from(shim[2]) });
    }
    let all = take(buf, 0, len, "int_v1.shim.length")?;
    let h = &all[4..12];
    let version = h[0] >> 4;
    if version != 1 {
        return Err(ParseError::Unsupported { what: "int_v1.header.version", value: u32::from(version) });
    }
    let out = IntHeader {
        version: 1,
        kind: IntKind::Md,
        npt: 0,
        shim_field: u16::from(shim[3] >> 2),
        discard: false,
        hop_count_exceeded: h[0] & 0x01 != 0,
        mtu_exceeded: h[1] & 0x80 != 0,
        hop_ml: h[2] & 0x1f,
        remaining_hop_count: h[3],
        instruction_bitmap: u16::from_be_bytes([h[4], h[5]]),
        domain_id: 0,
        ds_instruction: 0,
        ds_flags: 0,
        stack: &all[12..],
        total_len: len,
    };
    check_hop_ml(&out)?;
    Ok(out)
}

fn check_hop_ml(h: &IntHeader<'_>) -> Result<()> {
    if metadata::baseline_len(h.instruction_bitmap, h.layout()) > usize::from(h.hop_ml) * 4 {
        return Err(hop_ml_error(h.hop_ml));
    }
    Ok(())
}
