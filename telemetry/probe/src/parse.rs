//! Packet parser of the pcap twin: the same rules, bounds and failure reasons as `handle()` in
//! telemetry/bpf/flow_probe.bpf.c, so a capture yields the flows the probe would have seen.
use crate::bpf_types::FlowKey;

/// What a frame contributes to the flow table.
#[derive(Debug, Clone, Copy)]
pub struct PacketInfo {
    pub key: FlowKey,
    pub l3_len: u32,
    pub tos: u8,
    pub tcp_flags: u8,
    /// First 12 bytes of the UDP payload, when captured: an RTP header candidate.
    pub rtp: Option<[u8; 12]>,
}

/// Why a frame was not added to a flow: an index into probe_stats (see bpf_types::STAT_NAMES).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skip(pub usize);

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const MAX_VLAN_TAGS: usize = 2;
const MAX_IPV6_EXT: usize = 6;

mod stat {
    pub const NON_IP: usize = 2;
    pub const ETH_TRUNCATED: usize = 6;
    pub const VLAN_TRUNCATED: usize = 7;
    pub const VLAN_TOO_DEEP: usize = 8;
    pub const IPV4_TRUNCATED: usize = 9;
    pub const IPV4_BAD_IHL: usize = 10;
    pub const IP_BAD_LENGTH: usize = 11;
    pub const IPV6_TRUNCATED: usize = 12;
    pub const IPV6_EXT_TRUNCATED: usize = 13;
    pub const IPV6_EXT_TOO_DEEP: usize = 14;
    pub const IP_VERSION_MISMATCH: usize = 15;
    pub const FRAGMENT: usize = 16;
    pub const TCP_TRUNCATED: usize = 17;
    pub const TCP_BAD_OFFSET: usize = 18;
    pub const UDP_TRUNCATED: usize = 19;
    pub const UDP_BAD_LENGTH: usize = 20;
    pub const ICMP_TRUNCATED: usize = 21;
}

fn is_ipv6_ext(proto: u8) -> bool {
    matches!(proto, 0 | 43 | 44 | 51 | 60 | 135)
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Parses an Ethernet frame. `data` is what was captured, `wire_len` the frame's length on the
/// wire (a capture's snap length may cut payload, never the lengths the headers promise).
pub fn parse_ethernet(data: &[u8], wire_len: u32) -> Result<PacketInfo, Skip> {
    if data.len() < 14 {
        return Err(Skip(stat::ETH_TRUNCATED));
    }
    let mut proto = be16(data, 12);
    let mut at = 14;
    let mut vlan_id = 0u16;
    for _ in 0..MAX_VLAN_TAGS {
        if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
            break;
        }
        if data.len() < at + 4 {
            return Err(Skip(stat::VLAN_TRUNCATED));
        }
        if vlan_id == 0 {
            vlan_id = be16(data, at) & 0x0fff;
        }
        proto = be16(data, at + 2);
        at += 4;
    }
    if proto == ETH_P_8021Q || proto == ETH_P_8021AD {
        return Err(Skip(stat::VLAN_TOO_DEEP));
    }
    let mut info = parse_ip(proto, &data[at..], wire_len.saturating_sub(at as u32))?;
    info.key.vlan_id = vlan_id;
    Ok(info)
}

/// Parses from the IP header on; `proto` is the EtherType, `l3_avail` the wire bytes from here.
pub fn parse_ip(proto: u16, d: &[u8], l3_avail: u32) -> Result<PacketInfo, Skip> {
    let mut key = FlowKey::default();
    let (l3_len, tos, mut l4, mut at, mut avail);
    match proto {
        ETH_P_IP => {
            if d.len() < 20 {
                return Err(Skip(stat::IPV4_TRUNCATED));
            }
            if d[0] >> 4 != 4 {
                return Err(Skip(stat::IP_VERSION_MISMATCH));
            }
            let ihl = ((d[0] & 0x0f) as u32) * 4;
            if ihl < 20 {
                return Err(Skip(stat::IPV4_BAD_IHL));
            }
            l3_len = be16(d, 2) as u32;
            if l3_len < ihl || l3_len > l3_avail {
                return Err(Skip(stat::IP_BAD_LENGTH));
            }
            if d.len() < ihl as usize {
                return Err(Skip(stat::IPV4_TRUNCATED));
            }
            if be16(d, 6) & 0x1fff != 0 {
                return Err(Skip(stat::FRAGMENT));
            }
            key.src_addr[..4].copy_from_slice(&d[12..16]);
            key.dst_addr[..4].copy_from_slice(&d[16..20]);
            key.family = 4;
            tos = d[1];
            l4 = d[9];
            at = ihl as usize;
            avail = l3_len - ihl;
        }
        ETH_P_IPV6 => {
            if d.len() < 40 {
                return Err(Skip(stat::IPV6_TRUNCATED));
            }
            if d[0] >> 4 != 6 {
                return Err(Skip(stat::IP_VERSION_MISMATCH));
            }
            l3_len = 40 + be16(d, 4) as u32;
            if l3_len > l3_avail {
                return Err(Skip(stat::IP_BAD_LENGTH));
            }
            key.src_addr.copy_from_slice(&d[8..24]);
            key.dst_addr.copy_from_slice(&d[24..40]);
            key.family = 6;
            tos = (d[0] << 4) | (d[1] >> 4);
            l4 = d[6];
            at = 40;
            avail = l3_len - 40;
            for _ in 0..MAX_IPV6_EXT {
                if !is_ipv6_ext(l4) {
                    break;
                }
                if d.len() < at + 8 {
                    return Err(Skip(stat::IPV6_EXT_TRUNCATED));
                }
                let ext = &d[at..];
                let len = match l4 {
                    44 => {
                        if be16(ext, 2) & 0xfff8 != 0 {
                            return Err(Skip(stat::FRAGMENT));
                        }
                        8
                    }
                    51 => (ext[1] as u32 + 2) * 4,
                    _ => (ext[1] as u32 + 1) * 8,
                };
                if len > avail {
                    return Err(Skip(stat::IPV6_EXT_TRUNCATED));
                }
                l4 = ext[0];
                at += len as usize;
                avail -= len;
            }
            if is_ipv6_ext(l4) {
                return Err(Skip(stat::IPV6_EXT_TOO_DEEP));
            }
        }
        _ => return Err(Skip(stat::NON_IP)),
    }
    key.ip_proto = l4;
    let t = d.get(at..).unwrap_or(&[]);
    let mut tcp_flags = 0;
    let mut rtp = None;
    match l4 {
        6 => {
            if t.len() < 20 || avail < 20 {
                return Err(Skip(stat::TCP_TRUNCATED));
            }
            let doff = (t[12] >> 4) as u32;
            if doff < 5 || doff * 4 > avail {
                return Err(Skip(stat::TCP_BAD_OFFSET));
            }
            key.src_port = be16(t, 0);
            key.dst_port = be16(t, 2);
            tcp_flags = t[13];
        }
        17 => {
            if t.len() < 8 || avail < 8 {
                return Err(Skip(stat::UDP_TRUNCATED));
            }
            let ulen = be16(t, 4) as u32;
            if ulen < 8 || ulen > avail {
                return Err(Skip(stat::UDP_BAD_LENGTH));
            }
            key.src_port = be16(t, 0);
            key.dst_port = be16(t, 2);
            if ulen >= 20 && t.len() >= 20 {
                let mut h = [0u8; 12];
                h.copy_from_slice(&t[8..20]);
                rtp = Some(h);
            }
        }
        1 | 58 => {
            if t.len() < 4 || avail < 4 {
                return Err(Skip(stat::ICMP_TRUNCATED));
            }
        }
        _ => {}
    }
    Ok(PacketInfo {
        key,
        l3_len,
        tos,
        tcp_flags,
        rtp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eth(ethertype: u16) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f
    }

    fn udp4(payload: &[u8], tos: u8) -> Vec<u8> {
        let mut f = eth(ETH_P_IP);
        let total = 20 + 8 + payload.len();
        f.extend_from_slice(&[0x45, tos]);
        f.extend_from_slice(&(total as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(&5004u16.to_be_bytes());
        f.extend_from_slice(&6000u16.to_be_bytes());
        f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn udp_with_rtp_header() {
        let f = udp4(&[0x80; 20], 0x01);
        let p = parse_ethernet(&f, f.len() as u32).unwrap();
        assert_eq!(
            (p.key.src_port, p.key.dst_port, p.key.ip_proto),
            (5004, 6000, 17)
        );
        assert_eq!(p.l3_len, 48);
        assert_eq!(p.tos & 3, 1);
        assert!(p.rtp.is_some());
        assert_eq!(&p.key.src_addr[..4], &[10, 0, 0, 1]);
    }

    #[test]
    fn snaplen_cut_keeps_wire_length() {
        let f = udp4(&[0; 1000], 0);
        let p = parse_ethernet(&f[..60], f.len() as u32).unwrap();
        assert_eq!(p.l3_len, 1028);
        assert!(p.rtp.is_some());
    }

    #[test]
    fn malformed_frames_name_their_reason() {
        assert_eq!(
            parse_ethernet(&[0; 10], 10).unwrap_err(),
            Skip(stat::ETH_TRUNCATED)
        );
        let mut f = udp4(&[], 0);
        f[14] = 0x44; // IHL 4
        assert_eq!(
            parse_ethernet(&f, f.len() as u32).unwrap_err(),
            Skip(stat::IPV4_BAD_IHL)
        );
        let mut f = udp4(&[], 0);
        f[38..40].copy_from_slice(&0u16.to_be_bytes()); // UDP length 0
        assert_eq!(
            parse_ethernet(&f, f.len() as u32).unwrap_err(),
            Skip(stat::UDP_BAD_LENGTH)
        );
        let mut f = udp4(&[], 0);
        f[20..22].copy_from_slice(&0x0010u16.to_be_bytes()); // fragment offset 16
        assert_eq!(
            parse_ethernet(&f, f.len() as u32).unwrap_err(),
            Skip(stat::FRAGMENT)
        );
        let f = udp4(&[], 0);
        assert_eq!(
            parse_ethernet(&f[..40], 40).unwrap_err(),
            Skip(stat::IP_BAD_LENGTH)
        );
        assert_eq!(
            parse_ethernet(&f[..30], f.len() as u32).unwrap_err(),
            Skip(stat::IPV4_TRUNCATED)
        );
        assert_eq!(
            parse_ethernet(&eth(0x0806), 60).unwrap_err(),
            Skip(stat::NON_IP)
        );
    }

    #[test]
    fn vlan_and_ipv6_extension_chain() {
        let mut f = eth(ETH_P_8021Q);
        f.extend_from_slice(&[0x00, 0x2a]);
        f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
        let payload_len: u16 = 8 + 8 + 8;
        f.extend_from_slice(&[0x60, 0x10, 0, 0]); // traffic class 0x01: ECT(1)
        f.extend_from_slice(&payload_len.to_be_bytes());
        f.extend_from_slice(&[0, 64]); // next header: hop-by-hop
        f.extend_from_slice(&[0xfe; 32]);
        f.extend_from_slice(&[60, 0, 0, 0, 0, 0, 0, 0]); // hop-by-hop -> dstopts
        f.extend_from_slice(&[17, 0, 0, 0, 0, 0, 0, 0]); // dstopts -> UDP
        f.extend_from_slice(&[0, 1, 0, 2, 0, 8, 0, 0]);
        let p = parse_ethernet(&f, f.len() as u32).unwrap();
        assert_eq!((p.key.vlan_id, p.key.ip_proto, p.key.family), (42, 17, 6));
        assert_eq!(
            (p.key.src_port, p.key.dst_port, p.l3_len, p.tos),
            (1, 2, 64, 0x01)
        );
        // Seven chained extension headers: more than the parser walks.
        let mut f = eth(ETH_P_IPV6);
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&(7u16 * 8).to_be_bytes());
        f.extend_from_slice(&[0, 64]);
        f.extend_from_slice(&[0xfe; 32]);
        for _ in 0..7 {
            f.extend_from_slice(&[60, 0, 0, 0, 0, 0, 0, 0]);
        }
        assert_eq!(
            parse_ethernet(&f, f.len() as u32).unwrap_err(),
            Skip(stat::IPV6_EXT_TOO_DEEP)
        );
    }
}
