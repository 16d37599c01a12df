//! Telemetry Report v2.0 (p4.org, 2020-10-08) postcards: one individual report per sampled
//! packet, RepType 1 (INT), the hop's own metadata in RepMdBits, the packet's IP + transport
//! headers as the inner contents (InType 4 IPv4 / 5 IPv6). Pure byte layout, no I/O.
//!
//! Group header (§3.2): Ver 4 | hw_id 6 | Sequence Number 22 | Node ID 32.
//! Individual report header (§3.3): RepType 4 | InType 4 | Report Length 8 | MD Length 8 |
//! D Q F I | Rsvd 4; Report Length and MD Length in 4-byte words, Report Length excluding
//! this first word.
//! INT main contents (§3.3.1): RepMdBits 16 | Domain Specific ID 16 | DSMdBits 16 |
//! DSMdstatus 16, then the baseline metadata in bit order.

/// RepMdBits (bit 0 = MSB) this source fills: bit 1 level-1 ingress/egress interface ids,
/// bit 2 hop latency, bit 3 queue id + occupancy, bit 4 ingress timestamp (64 b), bit 5
/// egress timestamp (64 b), bit 6 level-2 ingress/egress interface ids (32 b each).
pub const REP_MD_BITS: u16 = 0x7e00;
/// Baseline metadata of [`REP_MD_BITS`] in words: 1 + 1 + 1 + 2 + 2 + 2.
pub const MD_WORDS: u8 = 9;
/// RepType 1: INT (§3.3).
const REP_TYPE_INT: u8 = 1;
/// InType 4: IPv4, 5: IPv6 (§3.3).
const IN_TYPE_IPV4: u8 = 4;
const IN_TYPE_IPV6: u8 = 5;
/// Group header Ver (§3.2).
const VERSION: u8 = 2;
/// Sequence numbers are 22 bits wide (§3.2).
pub const SEQ_MASK: u32 = 0x003f_ffff;
/// Bytes of the group header.
pub const GROUP_HEADER_BYTES: usize = 8;
/// The longest inner contents (bpf/int.bpf.h INT_HDR_BYTES).
pub const MAX_INNER_BYTES: usize = 128;
/// The longest individual report: header word, 2 fixed words, metadata, inner contents.
pub const MAX_REPORT_BYTES: usize = 4 + 8 + MD_WORDS as usize * 4 + MAX_INNER_BYTES;

/// One hop's view of one packet, in the units the report carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Postcard {
    /// Level 1 and level 2 interface ids: the interfaces' ifindexes (16 bits at level 1,
    /// saturated; the full 32 bits at level 2). Ingress 0: the node sent the packet itself.
    pub ingress_ifindex: u32,
    pub egress_ifindex: u32,
    /// Hop latency, ns (saturated below the all-ones "unavailable" value).
    pub hop_latency_ns: u32,
    /// The HTB class's minor number (saturated at 255).
    pub queue_id: u8,
    /// The class backlog in cells (24 bits, saturated at 2^24 - 2).
    pub queue_occupancy: u32,
    /// Ingress (qdisc enqueue) and egress (qdisc dequeue) timestamps, ns since the Unix epoch.
    pub ingress_ts_ns: u64,
    pub egress_ts_ns: u64,
    /// Q: the queue is congested (§3.3).
    pub congested: bool,
    /// The packet from its IP header on (IP + transport headers), at most 128 bytes.
    pub inner: Vec<u8>,
    pub inner_v6: bool,
}

/// Appends the group header (§3.2).
pub fn group_header(out: &mut Vec<u8>, hw_id: u8, sequence: u32, node_id: u32) {
    let w0 = (u32::from(VERSION) << 28) | (u32::from(hw_id & 0x3f) << 22) | (sequence & SEQ_MASK);
    out.extend_from_slice(&w0.to_be_bytes());
    out.extend_from_slice(&node_id.to_be_bytes());
}

/// Bytes `p` takes as an individual report.
pub fn report_len(p: &Postcard) -> usize {
    4 + 8 + usize::from(MD_WORDS) * 4 + padded(p.inner.len().min(MAX_INNER_BYTES))
}

fn padded(n: usize) -> usize {
    n.div_ceil(4) * 4
}

/// Appends one individual report (§3.3, §3.3.1): RepType INT, F set (the packet matched this
/// node's local watchlist, INT-XD), D and I clear, Q as `p.congested`; the inner contents
/// zero-padded to a whole word.
pub fn individual_report(out: &mut Vec<u8>, p: &Postcard) {
    let inner = &p.inner[..p.inner.len().min(MAX_INNER_BYTES)];
    let inner_words = padded(inner.len()) / 4;
    let in_type = if p.inner_v6 { IN_TYPE_IPV6 } else { IN_TYPE_IPV4 };
    // 2 fixed words of INT main contents + metadata + inner; at most 2 + 9 + 32 = 43 < 0xFF.
    let report_words = 2 + usize::from(MD_WORDS) + inner_words;
    let flags = if p.congested { 0x40 } else { 0 } | 0x20; // D Q F I | Rsvd
    out.extend_from_slice(&[(REP_TYPE_INT << 4) | in_type, report_words as u8, MD_WORDS, flags]);
    out.extend_from_slice(&REP_MD_BITS.to_be_bytes());
    out.extend_from_slice(&[0; 6]); // Domain Specific ID 0 (default), DSMdBits 0, DSMdstatus 0
    let l1 = |ifindex: u32| u16::try_from(ifindex).unwrap_or(u16::MAX);
    out.extend_from_slice(&l1(p.ingress_ifindex).to_be_bytes());
    out.extend_from_slice(&l1(p.egress_ifindex).to_be_bytes());
    out.extend_from_slice(&p.hop_latency_ns.min(u32::MAX - 1).to_be_bytes());
    let q = (u32::from(p.queue_id) << 24) | p.queue_occupancy.min(0x00ff_fffe);
    out.extend_from_slice(&q.to_be_bytes());
    out.extend_from_slice(&p.ingress_ts_ns.to_be_bytes());
    out.extend_from_slice(&p.egress_ts_ns.to_be_bytes());
    out.extend_from_slice(&p.ingress_ifindex.to_be_bytes());
    out.extend_from_slice(&p.egress_ifindex.to_be_bytes());
    out.extend_from_slice(inner);
    out.resize(out.len() + padded(inner.len()) - inner.len(), 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use cgloop_int_collector::parse::{parse_packet, IntDetect, Report};

    /// IPv4 (20 bytes, 10.0.0.1 -> 10.0.0.2, UDP) + UDP 5000 -> 6000, length 8 + 100.
    fn ipv4_udp() -> Vec<u8> {
        let mut ip = vec![
            0x45, 0x00, 0x00, 0x80, 0x12, 0x34, 0x40, 0x00, 0x40, 17, 0x00, 0x00, 10, 0, 0, 1, 10, 0,
            0, 2,
        ];
        ip.extend_from_slice(&[0x13, 0x88, 0x17, 0x70, 0x00, 0x6c, 0x00, 0x00]);
        ip
    }

    fn postcard() -> Postcard {
        Postcard {
            ingress_ifindex: 3,
            egress_ifindex: 7,
            hop_latency_ns: 2_500_000,
            queue_id: 0x20,
            queue_occupancy: 4000,
            ingress_ts_ns: 1_700_000_000_000_000_000,
            egress_ts_ns: 1_700_000_000_002_500_000,
            congested: true,
            inner: ipv4_udp(),
            inner_v6: false,
        }
    }

    #[test]
    fn golden_bytes_follow_the_spec_layout() {
        let mut out = Vec::new();
        group_header(&mut out, 5, 0x12_3456, 1);
        individual_report(&mut out, &postcard());
        #[rustfmt::skip]
        let want: Vec<u8> = [
            // §3.2: Ver 2 | hw_id 5 | seq 0x123456 -> 0010 000101 0100100011010001010110
            &[0x21, 0x52, 0x34, 0x56], &[0, 0, 0, 1][..],
            // §3.3: RepType 1 | InType 4 | Report Length 2 + 9 + 7 = 18 | MD Length 9 | D0 Q1 F1 I0
            &[0x14, 18, 9, 0x60],
            // §3.3.1: RepMdBits 0x7e00 | DS ID 0 | DSMdBits 0 | DSMdstatus 0
            &[0x7e, 0x00, 0, 0, 0, 0, 0, 0],
            // bit 1: ingress 3 | egress 7; bit 2: 2_500_000 ns; bit 3: queue 0x20 | 4000 cells
            &[0, 3, 0, 7], &2_500_000u32.to_be_bytes(), &[0x20, 0x00, 0x0f, 0xa0],
            // bits 4, 5: 64-bit timestamps; bit 6: level-2 interface ids
            &1_700_000_000_000_000_000u64.to_be_bytes(), &1_700_000_000_002_500_000u64.to_be_bytes(),
            &[0, 0, 0, 3], &[0, 0, 0, 7],
            &ipv4_udp(),
        ].concat();
        assert_eq!(out, want);
        assert_eq!(out.len(), GROUP_HEADER_BYTES + report_len(&postcard()));
    }

    #[test]
    fn inner_contents_are_padded_to_a_word_and_saturate_what_does_not_fit() {
        let mut p = postcard();
        p.inner.truncate(26);
        p.hop_latency_ns = u32::MAX;
        p.queue_id = 0xff;
        p.queue_occupancy = 0x0100_0000;
        p.ingress_ifindex = 70_000;
        let mut out = Vec::new();
        individual_report(&mut out, &p);
        assert_eq!(out.len(), report_len(&p));
        assert_eq!(out[1], 2 + 9 + 7, "26 bytes pad to 7 words");
        assert_eq!(&out[out.len() - 2..], &[0, 0]);
        assert_eq!(&out[12..14], &[0xff, 0xff], "level-1 id saturates at 16 bits");
        assert_eq!(&out[16..20], &(u32::MAX - 1).to_be_bytes(), "never the all-ones 'unavailable'");
        assert_eq!(&out[20..24], &[0xff, 0xff, 0xff, 0xfe]);
        assert_eq!(&out[40..44], &70_000u32.to_be_bytes(), "level 2 keeps the whole ifindex");
    }

    /// The decisive check: the INT collector's own parser reads what this encoder writes.
    #[test]
    fn the_int_collectors_parser_decodes_the_postcards() {
        let mut v6 = postcard();
        v6.inner_v6 = true;
        v6.congested = false;
        let mut inner = vec![0x60, 0, 0, 0, 0, 20, 6, 64];
        inner.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8].repeat(4));
        inner.extend_from_slice(&[0xfd, 0, 0, 0].repeat(4));
        // TCP 443 -> 50000, data offset 5.
        inner.extend_from_slice(&[0x01, 0xbb, 0xc3, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
        v6.inner = inner;
        let mut out = Vec::new();
        group_header(&mut out, 0, 41, 1);
        individual_report(&mut out, &postcard());
        individual_report(&mut out, &v6);
        let mut reports: Vec<Report<'_>> = Vec::new();
        let n = parse_packet(&out, &IntDetect::default(), &mut |r| reports.push(r.expect("report parses")))
            .expect("packet parses");
        assert_eq!(n, 2);
        let (a, b) = (&reports[0], &reports[1]);
        for r in [a, b] {
            assert_eq!((r.node_id, r.sequence, r.rep_type, r.tracked, r.dropped), (1, 41, 1, true, false));
            let m = r.local.expect("the hop's metadata");
            assert_eq!(m.node_id, Some(1));
            assert_eq!((m.l1_ingress_port, m.l1_egress_port), (Some(3), Some(7)));
            assert_eq!((m.l2_ingress_port, m.l2_egress_port), (Some(3), Some(7)));
            assert_eq!(m.hop_latency, Some(2_500_000));
            assert_eq!((m.queue_id, m.queue_occupancy), (Some(0x20), Some(4000)));
            assert_eq!(m.ingress_timestamp, Some(1_700_000_000_000_000_000));
            assert_eq!(m.egress_timestamp, Some(1_700_000_000_002_500_000));
            assert_eq!((m.egress_tx_util, m.buffer_occupancy, m.drop_reason), (None, None, None));
        }
        assert!(a.congested && !b.congested);
        let f = a.inner.flow.expect("IPv4 flow");
        assert_eq!((f.src_addr(), f.dst_addr()), (&[10, 0, 0, 1][..], &[10, 0, 0, 2][..]));
        assert_eq!((f.src_port, f.dst_port, f.proto, f.v6), (5000, 6000, 17, false));
        let f = b.inner.flow.expect("IPv6 flow");
        assert_eq!((f.src_port, f.dst_port, f.proto, f.v6), (443, 50000, 6, true));
        assert_eq!(f.src_addr(), &[0x20, 0x01, 0x0d, 0xb8].repeat(4)[..]);
    }
}
