//! The datapath's classifier (cgl_classify in bpf/agent.bpf.c) on crafted frames through
//! BPF_PROG_TEST_RUN: flows behind VLAN tags and IPv6 extension headers are found by their
//! 5-tuple (the shared parser of telemetry/bpf/include/parse/), and a DSCP rewrite lands in the
//! IP header after the tags. Needs root; prints "skipped: needs root" otherwise.
use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, ProgramInput};

use crate::datapath::{FlowKey, FlowRule, KEEP};

mod skel {
    #![allow(clippy::all, dead_code, non_camel_case_types, unused_imports)]
    include!(concat!(env!("OUT_DIR"), "/agent.skel.rs"));
}

/// BPF_PROG_TEST_RUN runs tc programs on the loopback device.
const LO: u32 = 1;
/// Offset of `priority` in struct __sk_buff (len, pkt_type, mark, queue_mapping, protocol,
/// vlan_present, vlan_tci, vlan_proto, priority: the ninth u32).
const SKB_PRIORITY: usize = 32;
/// sizeof(struct __sk_buff) in the kernels the agent supports (6.x).
const SKB_SIZE: usize = 192;
const CLASS: u32 = 0x0001_0002;
const SRC6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const DST6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

fn bytes_of<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: the skeleton's #[repr(C)] integer structs, padded explicitly in bpf/agent.h.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

fn ethernet(vlan: Option<u16>, ethertype: u16) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    if let Some(vid) = vlan {
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&vid.to_be_bytes());
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

fn udp(sport: u16, dport: u16, payload: usize) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&((8 + payload) as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend(std::iter::repeat_n(0x5a, payload));
    u
}

/// 802.1Q-tagged IPv6 with a destination-options header and a (first) fragment header before
/// UDP: the classifier must walk both to reach the ports.
fn vlan_ipv6_ext_frame(sport: u16, dport: u16) -> Vec<u8> {
    let l4 = udp(sport, dport, 32);
    let mut f = ethernet(Some(7), 0x86dd);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&((16 + l4.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[60, 64]); // next: destination options; hop limit
    f.extend_from_slice(&SRC6);
    f.extend_from_slice(&DST6);
    f.extend_from_slice(&[44, 0, 1, 4, 0, 0, 0, 0]); // dest. options (PadN) -> fragment
    f.extend_from_slice(&[17, 0, 0, 1, 0, 0, 0, 9]); // fragment offset 0, M=1 -> UDP
    f.extend_from_slice(&l4);
    f
}

/// 802.1ad + 802.1Q (QinQ) tagged IPv4 UDP with a valid header checksum.
fn qinq_ipv4_frame(sport: u16, dport: u16) -> Vec<u8> {
    let l4 = udp(sport, dport, 32);
    let mut f = vec![
        2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x88, 0xa8, 0, 3, 0x81, 0, 0, 7, 8, 0,
    ];
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    let sum = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&l4);
    f
}

fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn key(family: u8, src: &[u8], dst: &[u8], sport: u16, dport: u16) -> FlowKey {
    let mut k = FlowKey {
        ifindex: LO,
        family,
        proto: 17,
        sport,
        dport,
        ..Default::default()
    };
    k.src[..src.len()].copy_from_slice(src);
    k.dst[..dst.len()].copy_from_slice(dst);
    k
}

/// Runs cgl_classify on `frame`: (tc verdict, skb->priority, the frame after the program).
fn classify(skel: &skel::AgentSkel<'_>, frame: &[u8]) -> (u32, u32, Vec<u8>) {
    let mut ctx_in = vec![0u8; SKB_SIZE];
    let mut ctx_out = vec![0u8; SKB_SIZE];
    let mut data_out = vec![0u8; frame.len() + 64];
    let input = ProgramInput {
        context_in: Some(&mut ctx_in),
        context_out: Some(&mut ctx_out),
        data_in: Some(frame),
        data_out: Some(&mut data_out),
        ..Default::default()
    };
    let out = skel
        .progs
        .cgl_classify
        .test_run(input)
        .expect("BPF_PROG_TEST_RUN");
    let verdict = out.return_value;
    let data = out.data.map(|d| d.to_vec()).unwrap_or_default();
    let ctx = out.context.expect("the kernel returns the __sk_buff");
    let priority = u32::from_ne_bytes(ctx[SKB_PRIORITY..SKB_PRIORITY + 4].try_into().unwrap());
    (verdict, priority, data)
}

#[test]
fn classifier_finds_flows_behind_vlan_tags_and_ipv6_extension_headers() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let mut storage = MaybeUninit::uninit();
    let skel = skel::AgentSkelBuilder::default()
        .open(&mut storage)
        .unwrap()
        .load()
        .unwrap();
    let set = |k: &FlowKey, rewrite_dscp: u32| {
        let rule = FlowRule {
            classid: CLASS,
            rewrite_dscp,
        };
        skel.maps
            .flow_class
            .update(bytes_of(k), bytes_of(&rule), MapFlags::ANY)
            .unwrap();
    };
    set(&key(6, &SRC6, &DST6, 5004, 6000), KEEP);
    set(&key(4, &[10, 0, 0, 1], &[10, 0, 0, 2], 5004, 6000), 46);

    let (verdict, priority, _) = classify(&skel, &vlan_ipv6_ext_frame(5004, 6000));
    assert_eq!(verdict, 0, "TC_ACT_OK");
    assert_eq!(
        priority, CLASS,
        "VLAN + IPv6 dest. options + fragment header: classified"
    );
    let (_, priority, _) = classify(&skel, &vlan_ipv6_ext_frame(5004, 6001));
    assert_eq!(priority, 0, "another port: no rule, no class");

    let frame = qinq_ipv4_frame(5004, 6000);
    let (_, priority, out) = classify(&skel, &frame);
    assert_eq!(priority, CLASS, "QinQ IPv4: classified");
    let ip = &out[22..42];
    assert_eq!(
        ip[1],
        46 << 2,
        "DSCP rewritten in the IP header after both tags"
    );
    assert_eq!(ipv4_checksum(ip), 0, "IPv4 header checksum still valid");
    assert_eq!(&out[..22], &frame[..22], "Ethernet and tags untouched");
}
