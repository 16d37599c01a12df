//! Golden packets built by hand from the bit layouts and worked examples of the specifications
//! (Telemetry Report v2.0 "TR" §4.x examples, INT v2.1 "INT" §6.x examples, fabric-tna's v0.5
//! report headers, the v1.0 report + INT v1.0 headers). No byte here comes from the generator.

use cgloop_int_collector::parse::{
    parse_packet, Format, HopMetadata, IntDetect, IntKind, ParseError, Report,
};

const INT_PORT: u16 = 5900; // INT_TBD of the examples

fn detect() -> IntDetect {
    IntDetect { udp_ports: vec![INT_PORT], dscp: Some((0x17, 0x3f)) }
}

fn parse(buf: &[u8]) -> Vec<Report<'_>> {
    let mut out = Vec::new();
    let n = parse_packet(buf, &detect(), &mut |r| out.push(r.expect("report parses"))).unwrap();
    assert_eq!(n, out.len());
    out
}

/// Every strict prefix of a golden packet must fail cleanly or parse fewer reports: no panic.
fn prefixes_never_panic(buf: &[u8]) {
    for cut in 0..buf.len() {
        let mut seen = 0;
        let _ = parse_packet(&buf[..cut], &detect(), &mut |_| seen += 1);
    }
}

// --- hand-written headers (field by field, network byte order) --------------------------------

fn ipv4(dscp: u8, proto: u8, src: [u8; 4], dst: [u8; 4], payload_len: u16) -> Vec<u8> {
    let mut v = vec![0x45, dscp << 2];
    v.extend_from_slice(&(20 + payload_len).to_be_bytes()); // Total Length
    v.extend_from_slice(&[0x12, 0x34, 0x40, 0x00]); // Identification, DF, offset 0
    v.extend_from_slice(&[64, proto, 0, 0]); // TTL, Protocol, checksum (not checked)
    v.extend_from_slice(&src);
    v.extend_from_slice(&dst);
    v
}

fn udp(sport: u16, dport: u16, len: u16) -> Vec<u8> {
    let mut v = sport.to_be_bytes().to_vec();
    v.extend_from_slice(&dport.to_be_bytes());
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(&[0, 0]); // checksum 0 (INT §5.6.2 recommends zero)
    v
}

fn tcp(sport: u16, dport: u16) -> Vec<u8> {
    let mut v = sport.to_be_bytes().to_vec();
    v.extend_from_slice(&dport.to_be_bytes());
    v.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]); // seq, ack
    v.extend_from_slice(&[0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]); // offset 5, PSH|ACK, window
    v
}

fn be32(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// TR §3.2 group header: Ver 4 | hw_id 6 | Sequence 22 | Node ID 32.
fn group(hw_id: u32, seq: u32, node: u32) -> Vec<u8> {
    let mut v = be32((2 << 28) | (hw_id << 22) | seq).to_vec();
    v.extend_from_slice(&be32(node));
    v
}

// --- Telemetry Report v2.0 --------------------------------------------------------------------

/// TR §4.1 "Example with Baseline Metadata and Truncated IPv4": RepType 1, InType 4,
/// RepLength 14, MD Length 2, F=1, RepMdBits bits 1 and 3.
#[test]
fn tr_4_1_baseline_metadata_truncated_ipv4() {
    let mut p = group(5, 0x2_abcd, 3);
    p.extend_from_slice(&[0x14, 14, 2, 0b0010_0000]);
    p.extend_from_slice(&[0b0101_0000, 0, 0, 0, 0, 0, 0, 0]); // RepMdBits, DS id, DSMdBits, status
    p.extend_from_slice(&[0, 7, 0, 9]); // ingress 7, egress 9
    p.extend_from_slice(&be32((2 << 24) | 0xabc)); // queue id 2, occupancy 0xabc
    p.extend(ipv4(0, 6, [10, 0, 0, 1], [10, 0, 0, 2], 20));
    p.extend(tcp(40000, 443));
    assert_eq!(p.len(), 8 + 4 + 14 * 4);
    let r = parse(&p);
    assert_eq!(r.len(), 1);
    let r = &r[0];
    assert_eq!((r.format, r.node_id, r.hw_id, r.sequence), (Format::V20, 3, 5, 0x2_abcd));
    assert_eq!((r.dropped, r.congested, r.tracked, r.intermediate), (false, false, true, false));
    let l = r.local.unwrap();
    assert_eq!((l.l1_ingress_port, l.l1_egress_port), (Some(7), Some(9)));
    assert_eq!((l.queue_id, l.queue_occupancy), (Some(2), Some(0xabc)));
    assert_eq!(l.hop_latency, None);
    let f = r.inner.flow.unwrap();
    assert_eq!((f.src_addr(), f.dst_addr()), (&[10, 0, 0, 1][..], &[10, 0, 0, 2][..]));
    assert_eq!((f.src_port, f.dst_port, f.proto), (40000, 443, 6));
    assert!(r.inner.int.is_none());
    prefixes_never_panic(&p);
}

/// TR §4.2 "Baseline Metadata, Domain Specific Metadata, DS Extension Data and Truncated IPv4":
/// InType 1 (TLV), DSMdBits MSB, a TLV of type 0 then a TLV of type 2 (IPv4). The example's
/// MD Length = 2 leaves out its DS metadata word although §3.3 counts it; we use 3.
#[test]
fn tr_4_2_domain_specific_and_tlvs() {
    let mut p = group(0, 1, 0x0a0b0c0d);
    let body_words = 2 + 3 + 2 + (1 + 7);
    p.extend_from_slice(&[0x11, body_words, 3, 0x20]);
    p.extend_from_slice(&[0x50, 0x00, 0x00, 0x2a, 0x80, 0x00, 0x00, 0x05]); // DS id 42, status 5
    p.extend_from_slice(&[0, 1, 0, 2]);
    p.extend_from_slice(&be32((1 << 24) | 77));
    p.extend_from_slice(&be32(0xdead_beef)); // domain specific metadata
    p.extend_from_slice(&[0x00, 1, 0x00, 0x07]); // TLV type 0, 1 word, template 7
    p.extend_from_slice(&be32(0x1122_3344));
    p.extend_from_slice(&[0x20, 7, 0, 0]); // TLV type 2 (IPv4), 7 words
    p.extend(ipv4(0, 17, [192, 0, 2, 1], [192, 0, 2, 2], 8));
    p.extend(udp(1000, 2000, 8));
    let r = &parse(&p)[0];
    assert_eq!(r.node_id, 0x0a0b0c0d);
    assert_eq!((r.domain.id, r.domain.md_bits, r.domain.md_status), (42, 0x8000, 5));
    assert_eq!(r.domain.metadata, &be32(0xdead_beef)[..]);
    assert_eq!((r.domain.extension, r.domain.extension_template), (&be32(0x1122_3344)[..], 7));
    let l = r.local.unwrap();
    assert_eq!((l.queue_id, l.queue_occupancy), (Some(1), Some(77)));
    let f = r.inner.flow.unwrap();
    assert_eq!((f.src_port, f.dst_port, f.proto), (1000, 2000, 17));
    prefixes_never_panic(&p);
}

/// TR §4.3 "Example with Embedded INT-MD in a TCP Packet" (INT §6.3): the sink reports its
/// queue occupancy in RepMdBits bit 3; the truncated IPv4 packet carries a new UDP header to
/// INT_TBD, shim Type 1 NPT 2 (IP proto 6), HopML 2, RHC 6, bitmap bits 0 and 3, two hops.
#[test]
fn tr_4_3_embedded_int_md_tcp() {
    let mut p = group(0, 9, 3);
    p.extend_from_slice(&[0x14, 23, 1, 0x20]);
    p.extend_from_slice(&[0x10, 0, 0, 0, 0, 0, 0, 0]);
    p.extend_from_slice(&be32((0 << 24) | 300)); // queue of switch3
    p.extend(ipv4(0, 17, [10, 1, 1, 1], [10, 2, 2, 2], 8 + 32 + 20));
    p.extend(udp(0xbeef, INT_PORT, 8 + 32 + 20));
    p.extend_from_slice(&[0x18, 7, 0, 6]); // Type=1, NPT=2, Length=7, IP proto 6
    p.extend_from_slice(&[0x20, 0x00, 0x00 | 2, 6]); // Ver 2, HopML 2, RHC 6
    p.extend_from_slice(&[0x90, 0x00, 0, 0, 0, 0, 0, 0]); // bitmap 1001..., DS id/instr/flags 0
    p.extend_from_slice(&be32(2));
    p.extend_from_slice(&be32((1 << 24) | 200));
    p.extend_from_slice(&be32(1));
    p.extend_from_slice(&be32((1 << 24) | 100));
    p.extend(tcp(33000, 80));
    assert_eq!(p.len(), 8 + 4 + 23 * 4);
    let r = &parse(&p)[0];
    assert_eq!(r.local.unwrap().queue_occupancy, Some(300));
    let f = r.inner.flow.unwrap();
    // NPT 2: the original L4 header after the stack gives ports, the shim gives the protocol.
    assert_eq!((f.src_port, f.dst_port, f.proto), (33000, 80, 6));
    let int = r.inner.int.unwrap();
    assert_eq!((int.kind, int.version, int.npt, int.hop_ml, int.remaining_hop_count), (IntKind::Md, 2, 2, 2, 6));
    let hops: Vec<HopMetadata> = int.hops().map(|h| h.unwrap().0).collect();
    assert_eq!(hops.len(), 2);
    assert_eq!((hops[0].node_id, hops[0].queue_occupancy), (Some(2), Some(200)));
    assert_eq!((hops[1].node_id, hops[1].queue_id, hops[1].queue_occupancy), (Some(1), Some(1), Some(100)));
    prefixes_never_panic(&p);
}

/// TR §4.4 "Embedded INT-MD over UDP in a VXLAN Packet": RepType 0 (Inner Only), InType 4,
/// RepLength 33, shim NPT 1 carrying the original UDP port 4789, three hops of node id +
/// level-1 interface ids.
#[test]
fn tr_4_4_inner_only_vxlan() {
    let mut p = group(0, 10, 0x33);
    p.extend_from_slice(&[0x04, 33, 0, 0x20]);
    let int_len = 4 + 12 + 24;
    p.extend(ipv4(0, 17, [192, 168, 1, 1], [192, 168, 2, 2], 8 + int_len + 8 + 14 + 20 + 20));
    p.extend(udp(56789, INT_PORT, 0));
    p.extend_from_slice(&[0x14, 9, 0x12, 0xb5]); // Type=1, NPT=1, Length=9, port 4789
    p.extend_from_slice(&[0x20, 0, 2, 5, 0xc0, 0, 0, 0, 0, 0, 0, 0]);
    for hop in [3u32, 2, 1] {
        p.extend_from_slice(&be32(hop));
        p.extend_from_slice(&be32((hop * 10) << 16 | (hop * 10 + 1)));
    }
    p.extend_from_slice(&[0x08, 0, 0, 0, 0, 0, 0x2a, 0]); // VXLAN, VNI 42
    p.extend_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00]); // inner Ethernet
    p.extend(ipv4(0, 6, [10, 10, 1, 1], [10, 10, 2, 2], 20));
    p.extend(tcp(1234, 5678));
    p.extend_from_slice(&[0, 0]); // pad to a 4-byte multiple (the example draws 4 words)
    assert_eq!(p.len(), 8 + 4 + 33 * 4);
    let r = &parse(&p)[0];
    assert_eq!((r.rep_type, r.local), (0, None));
    let f = r.inner.flow.unwrap();
    assert_eq!(f.src_addr(), &[192, 168, 1, 1][..]);
    assert_eq!((f.src_port, f.dst_port, f.proto), (56789, 4789, 17));
    let int = r.inner.int.unwrap();
    assert_eq!((int.npt, int.shim_field, int.remaining_hop_count), (1, 4789, 5));
    let hops: Vec<HopMetadata> = int.hops().map(|h| h.unwrap().0).collect();
    let ids: Vec<_> = hops.iter().map(|h| h.node_id.unwrap()).collect();
    assert_eq!(ids, [3, 2, 1]);
    assert_eq!((hops[2].l1_ingress_port, hops[2].l1_egress_port), (Some(10), Some(11)));
    prefixes_never_panic(&p);
}

/// INT §6.1 "Example with INT-MD over TCP": DSCP 0x17 marks INT after the TCP header; shim
/// NPT 0, Length 7; two hops of node id + queue (the embedded packet of an Inner Only report).
#[test]
fn int_6_1_md_over_tcp_dscp() {
    let mut p = group(0, 1, 3);
    p.extend_from_slice(&[0x04, 5 + 5 + 1 + 7, 0, 0x20]);
    p.extend(ipv4(0x17, 6, [10, 0, 0, 1], [10, 0, 0, 2], 20 + 32));
    p.extend(tcp(5000, 6000));
    p.extend_from_slice(&[0x10, 7, 0, 0x17 << 2]); // Type=1 NPT=0 Length=7, DSCP 0x17
    p.extend_from_slice(&[0x20, 0, 2, 6, 0x90, 0, 0, 0, 0, 0, 0, 0]);
    for (id, q) in [(2u32, 20u32), (1, 10)] {
        p.extend_from_slice(&be32(id));
        p.extend_from_slice(&be32(q));
    }
    let r = &parse(&p)[0];
    let f = r.inner.flow.unwrap();
    assert_eq!((f.src_port, f.dst_port, f.proto), (5000, 6000, 6));
    let int = r.inner.int.unwrap();
    assert_eq!((int.npt, int.shim_field & 0xfc, int.hops().count()), (0, 0x17 << 2, 2));
    prefixes_never_panic(&p);
}

/// INT §6.2 "INT-MX over TCP" (shim Type 3, Length 3) with §6.20's domain-specific
/// source-inserted metadata (one extra word). The node's own metadata travels in RepMdBits;
/// INT §5.8: Node ID (instruction bit 0) is cleared from RepMdBits.
#[test]
fn int_6_2_mx_over_tcp_with_source_inserted() {
    let mut p = group(0, 2, 7);
    p.extend_from_slice(&[0x14, 2 + 2 + 5 + 5 + 5, 2, 0x20]);
    p.extend_from_slice(&[0x30, 0, 0, 1, 0, 0, 0, 0]); // RepMdBits bits 2,3; DS id 1
    p.extend_from_slice(&be32(1500)); // hop latency
    p.extend_from_slice(&be32((3 << 24) | 42));
    p.extend(ipv4(0x17, 6, [10, 0, 0, 1], [10, 0, 0, 2], 20 + 16));
    p.extend(tcp(5000, 6000));
    p.extend_from_slice(&[0x30, 4, 0, 0x17 << 2]); // Type=3, Length=3+1
    p.extend_from_slice(&[0x28, 0, 0, 0, 0xb0, 0, 0, 1, 0x80, 0, 0, 0]); // D=1, bits 0,2,3
    p.extend_from_slice(&be32(0xcafe));
    let r = &parse(&p)[0];
    let l = r.local.unwrap();
    assert_eq!((l.node_id, l.hop_latency, l.queue_id, l.queue_occupancy), (Some(7), Some(1500), Some(3), Some(42)));
    let int = r.inner.int.unwrap();
    assert_eq!((int.kind, int.discard, int.instruction_bitmap, int.domain_id), (IntKind::Mx, true, 0xb000, 1));
    assert_eq!((int.ds_instruction, int.stack), (0x8000, &be32(0xcafe)[..]));
    assert_eq!(int.hops().count(), 0);
    prefixes_never_panic(&p);
}

/// Every RepMdBits bit of TR §3.3.1 (1-8 and 15; bit 0 and 9-14 reserved but still one word
/// each) and every instruction bit of INT §5.7 (0-8 and 15), with 8-byte items for bits 4-6.
#[test]
fn every_metadata_bit() {
    let mut p = group(1, 1, 9);
    let rep_md_bits: u16 = 0xffff; // all, including reserved 0 and 9-14
    let md_words = 1 + 1 + 1 + 1 + 2 + 2 + 2 + 1 + 1 + 6 + 1;
    let stack_bitmap: u16 = 0xff81; // 0-8 and 15
    let hop_words = 1 + 1 + 1 + 1 + 2 + 2 + 2 + 1 + 1 + 1;
    p.extend_from_slice(&[0x15, 0, md_words, 0xf0]); // InType 5: IPv6 // length patched below; D Q F I all set
    p.extend_from_slice(&rep_md_bits.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    p.extend_from_slice(&be32(0)); // bit 0 reserved
    p.extend_from_slice(&be32((11 << 16) | 12)); // bit 1
    p.extend_from_slice(&be32(1300)); // bit 2
    p.extend_from_slice(&be32((4 << 24) | 0x12_3456)); // bit 3
    p.extend_from_slice(&0x1_0000_0001u64.to_be_bytes()); // bit 4
    p.extend_from_slice(&0x1_0000_0501u64.to_be_bytes()); // bit 5
    p.extend_from_slice(&be32(100_000)); // bit 6: L2 ingress
    p.extend_from_slice(&be32(200_000)); //        L2 egress
    p.extend_from_slice(&be32(7500)); // bit 7
    p.extend_from_slice(&be32((2 << 24) | 999)); // bit 8
    for _ in 9..15 {
        p.extend_from_slice(&be32(0)); // reserved
    }
    p.extend_from_slice(&be32((4 << 24) | (71 << 16))); // bit 15: queue 4, drop reason 71
    // Inner IPv6 + UDP to INT_TBD with one hop carrying every instruction.
    let int_len = 4 + 12 + hop_words * 4;
    let mut v6 = vec![0x60, 0, 0, 0];
    v6.extend_from_slice(&((8 + int_len) as u16).to_be_bytes());
    v6.extend_from_slice(&[17, 64]);
    v6.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    v6.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    p.extend(v6);
    p.extend(udp(7000, INT_PORT, 0));
    p.extend_from_slice(&[0x14, 3 + hop_words, 0x1f, 0x90]); // NPT 1: original port 8080
    p.extend_from_slice(&[0x20, 0, hop_words, 7]);
    p.extend_from_slice(&stack_bitmap.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    p.extend_from_slice(&be32(8)); // 0 node id
    p.extend_from_slice(&be32(u32::MAX)); // 1 unavailable (all ones, INT §5.7)
    p.extend_from_slice(&be32(800)); // 2
    p.extend_from_slice(&be32((1 << 24) | 5)); // 3
    p.extend_from_slice(&u64::MAX.to_be_bytes()); // 4 unavailable (8 bytes of ones)
    p.extend_from_slice(&77u64.to_be_bytes()); // 5
    p.extend_from_slice(&be32(5)); // 6
    p.extend_from_slice(&be32(6));
    p.extend_from_slice(&be32(250)); // 7
    p.extend_from_slice(&be32((3 << 24) | 44)); // 8
    p.extend_from_slice(&be32(0xabcd)); // 15 checksum complement
    let len_words = ((p.len() - 12) / 4) as u8;
    p[9] = len_words;
    let r = &parse(&p)[0];
    assert_eq!((r.dropped, r.congested, r.tracked, r.intermediate), (true, true, true, true));
    assert_eq!(
        r.local.unwrap(),
        HopMetadata {
            node_id: Some(9),
            l1_ingress_port: Some(11),
            l1_egress_port: Some(12),
            hop_latency: Some(1300),
            queue_id: Some(4),
            queue_occupancy: Some(0x12_3456),
            ingress_timestamp: Some(0x1_0000_0001),
            egress_timestamp: Some(0x1_0000_0501),
            l2_ingress_port: Some(100_000),
            l2_egress_port: Some(200_000),
            egress_tx_util: Some(7500),
            buffer_id: Some(2),
            buffer_occupancy: Some(999),
            drop_reason: Some(71),
            checksum_complement: None,
        }
    );
    let f = r.inner.flow.unwrap();
    assert!(f.v6);
    assert_eq!((f.src_port, f.dst_port, f.proto, f.dst_addr()[15]), (7000, 8080, 17, 2));
    let (hop, ds) = r.inner.int.unwrap().hops().next().unwrap().unwrap();
    assert!(ds.is_empty());
    assert_eq!(
        hop,
        HopMetadata {
            node_id: Some(8),
            hop_latency: Some(800),
            queue_id: Some(1),
            queue_occupancy: Some(5),
            egress_timestamp: Some(77),
            l2_ingress_port: Some(5),
            l2_egress_port: Some(6),
            egress_tx_util: Some(250),
            buffer_id: Some(3),
            buffer_occupancy: Some(44),
            checksum_complement: Some(0xabcd),
            ..HopMetadata::default()
        }
    );
    prefixes_never_panic(&p);
}

/// TR §3.3: several individual reports coalesced in one packet; the last uses Report Length
/// 0xFF ("to the end of the UDP payload").
#[test]
fn coalesced_reports_and_ff_length() {
    let mut p = group(0, 3, 1);
    for i in 0..3u8 {
        p.extend_from_slice(&[0x10, 3, 1, 0x20]);
        p.extend_from_slice(&[0x20, 0, 0, 0, 0, 0, 0, 0]);
        p.extend_from_slice(&be32(1000 + u32::from(i)));
    }
    p.extend_from_slice(&[0x10, 0xff, 1, 0x20]);
    p.extend_from_slice(&[0x20, 0, 0, 0, 0, 0, 0, 0]);
    p.extend_from_slice(&be32(2000));
    let r = parse(&p);
    let lat: Vec<_> = r.iter().map(|r| r.local.unwrap().hop_latency.unwrap()).collect();
    assert_eq!(lat, [1000, 1001, 1002, 2000]);
}

/// A report whose length lies is an error for that report only; good reports before it stay.
#[test]
fn bad_report_keeps_earlier_good_ones() {
    let mut p = group(0, 3, 1);
    p.extend_from_slice(&[0x10, 3, 1, 0x20, 0x20, 0, 0, 0, 0, 0, 0, 0]);
    p.extend_from_slice(&be32(5));
    p.extend_from_slice(&[0x10, 3, 9, 0x20, 0x20, 0, 0, 0, 0, 0, 0, 0]); // MD Length 9 > body
    p.extend_from_slice(&be32(6));
    let mut good = 0;
    let mut bad = Vec::new();
    parse_packet(&p, &detect(), &mut |r| match r {
        Ok(_) => good += 1,
        Err(e) => bad.push(e.reason()),
    })
    .unwrap();
    assert_eq!((good, bad), (1, vec![("truncated", "v2.0.md_length")]));
}

#[test]
fn unsupported_and_invalid_inputs_are_named() {
    let seen = |p: &[u8]| {
        let mut errs = Vec::new();
        let res = parse_packet(p, &detect(), &mut |r| {
            if let Err(e) = r {
                errs.push(e)
            }
        });
        (res.err(), errs)
    };
    assert_eq!(seen(&[0x30; 12]).0, Some(ParseError::Unsupported { what: "report.version", value: 3 }));
    assert_eq!(seen(&[]).0.unwrap().reason(), ("truncated", "report"));
    // v2.0 RepType 2 (IOAM: format not yet defined in TR §3.3).
    let mut p = group(0, 0, 1);
    p.extend_from_slice(&[0x20, 0, 0, 0]);
    assert_eq!(seen(&p).1, vec![ParseError::Unsupported { what: "v2.0.rep_type", value: 2 }]);
    // Hop ML smaller than the bitmap's metadata (INT §5.7).
    let mut p = group(0, 0, 1);
    p.extend_from_slice(&[0x04, 11, 0, 0]);
    p.extend(ipv4(0x17, 17, [1, 1, 1, 1], [2, 2, 2, 2], 8));
    p.extend(udp(1, 2, 8));
    p.extend_from_slice(&[0x10, 3, 0, 0, 0x20, 0, 1, 6, 0xf0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(seen(&p).1[0].reason(), ("invalid", "int_md.hop_ml"));
}

// --- Telemetry Report v0.5 (fabric-tna / ONOS) ------------------------------------------------

fn ethernet(ethertype: u16) -> Vec<u8> {
    let mut v = vec![0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 1];
    v.extend_from_slice(&ethertype.to_be_bytes());
    v
}

#[test]
fn v05_switch_local_report() {
    // ver 0, nproto 2 (switch local), F=1, Q=1, hw_id 1, seq 77, ingress ts 1_000_000
    let mut p = vec![0x02, 0x60, 0x00, 0x01];
    p.extend_from_slice(&be32(77));
    p.extend_from_slice(&be32(1_000_000));
    p.extend_from_slice(&be32(0x0102)); // switch id
    p.extend_from_slice(&[0, 3, 0, 4]); // ports 3 -> 4
    p.extend_from_slice(&be32((5 << 24) | 4096)); // queue 5, occupancy 4096
    p.extend_from_slice(&be32(1_000_700)); // egress ts
    let mut eth = ethernet(0x8100);
    eth.extend_from_slice(&[0, 10, 0x08, 0x00]); // VLAN 10, then IPv4
    p.extend(eth);
    p.extend(ipv4(0, 17, [10, 0, 1, 1], [10, 0, 2, 2], 8));
    p.extend(udp(9000, 9001, 8));
    let r = &parse(&p)[0];
    assert_eq!((r.format, r.node_id, r.hw_id, r.sequence), (Format::V05, 0x0102, 1, 77));
    assert_eq!((r.congested, r.tracked, r.dropped), (true, true, false));
    let l = r.local.unwrap();
    assert_eq!((l.l1_ingress_port, l.l1_egress_port, l.queue_id, l.queue_occupancy), (Some(3), Some(4), Some(5), Some(4096)));
    assert_eq!(l.hop_latency, Some(700));
    assert_eq!(r.inner.flow.unwrap().dst_port, 9001);
    prefixes_never_panic(&p);
}

#[test]
fn v05_drop_report_and_timestamp_wrap() {
    let mut p = vec![0x01, 0xa0, 0x00, 0x00]; // nproto 1 (drop), D=1, F=1
    p.extend_from_slice(&be32(1));
    p.extend_from_slice(&be32(0xffff_fff0));
    p.extend_from_slice(&be32(9)); // switch id
    p.extend_from_slice(&[0, 1, 0, 2, 7, 71, 0, 0]); // ports, queue 7, reason 71, pad
    p.extend(ethernet(0x0800));
    p.extend(ipv4(0, 6, [10, 0, 1, 1], [10, 0, 2, 2], 20));
    p.extend(tcp(1, 2));
    let r = &parse(&p)[0];
    assert!(r.dropped);
    let l = r.local.unwrap();
    assert_eq!((r.node_id, l.queue_id, l.drop_reason), (9, Some(7), Some(71)));
    prefixes_never_panic(&p);
    // Local report whose egress ts wrapped past 2^32.
    let mut p = vec![0x02, 0x20, 0, 0];
    p.extend_from_slice(&be32(2));
    p.extend_from_slice(&be32(0xffff_ff00));
    p.extend_from_slice(&be32(9));
    p.extend_from_slice(&[0, 1, 0, 2]);
    p.extend_from_slice(&be32(0));
    p.extend_from_slice(&be32(0x100));
    assert_eq!(parse(&p)[0].local.unwrap().hop_latency, Some(0x200));
}

// --- Telemetry Report v1.0 with INT-MD v1.0 (BMv2 programs) -----------------------------------

#[test]
fn v10_report_with_int_v1_stack() {
    // ver 1, len 4 | nproto 0, rep_md_bits 0 | rsvd, d q f | hw_id
    let mut p = vec![0x14, 0x00, 0x01, 0x02];
    p.extend_from_slice(&be32(3)); // switch id
    p.extend_from_slice(&be32(500)); // seq
    p.extend_from_slice(&be32(123_456)); // ingress ts
    p.extend(ethernet(0x0800));
    let hop_words = 6u8; // switch id, ports, hop latency, queue, ingress ts, egress ts
    let int_words = 1 + 2 + 2 * hop_words;
    p.extend(ipv4(0x17, 17, [10, 0, 0, 1], [10, 0, 0, 2], 8 + u16::from(int_words) * 4));
    p.extend(udp(4000, 4001, 8 + u16::from(int_words) * 4));
    p.extend_from_slice(&[0x01, 0, int_words, 0x17 << 2]); // v1 shim: type 1, len incl. shim
    p.extend_from_slice(&[0x10, 0x00, hop_words, 6]); // ver 1, hop ML 6, remaining 6
    p.extend_from_slice(&[0xfc, 0x00, 0, 0]); // bits 0-5
    for (id, lat) in [(3u32, 300u32), (2, 200)] {
        p.extend_from_slice(&be32(id));
        p.extend_from_slice(&be32((1 << 16) | 2));
        p.extend_from_slice(&be32(lat));
        p.extend_from_slice(&be32(10 * id));
        p.extend_from_slice(&be32(1000));
        p.extend_from_slice(&be32(1000 + lat));
    }
    let r = &parse(&p)[0];
    assert_eq!((r.format, r.node_id, r.sequence, r.hw_id, r.tracked), (Format::V10, 3, 500, 2, true));
    assert_eq!(r.ingress_timestamp, Some(123_456));
    let int = r.inner.int.unwrap();
    assert_eq!((int.version, int.hop_ml), (1, 6));
    let hops: Vec<HopMetadata> = int.hops().map(|h| h.unwrap().0).collect();
    assert_eq!(hops.len(), 2);
    assert_eq!((hops[1].node_id, hops[1].hop_latency, hops[1].queue_occupancy), (Some(2), Some(200), Some(20)));
    assert_eq!((hops[0].ingress_timestamp, hops[0].egress_timestamp), (Some(1000), Some(1300)));
    assert_eq!(r.inner.flow.unwrap().dst_port, 4001);
    prefixes_never_panic(&p);
}
