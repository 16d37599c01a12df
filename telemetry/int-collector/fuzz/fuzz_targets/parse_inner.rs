//! The truncated data packet of a report: Ethernet/VLAN, IPv4, IPv6, TCP/UDP and INT in it.
//! The first byte picks the inner type.
#![no_main]
use cgloop_int_collector::parse::inner::{parse, InnerType, IntDetect};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&t, rest)) = data.split_first() else { return };
    let ty = match t % 3 {
        0 => InnerType::Ethernet,
        1 => InnerType::Ipv4,
        _ => InnerType::Ipv6,
    };
    let detect = IntDetect { udp_ports: vec![5900, 4789], dscp: Some((0x17, 0x3f)) };
    if let Ok(inner) = parse(rest, ty, &detect) {
        if let Some(int) = inner.int {
            for h in int.hops() {
                let _ = std::hint::black_box(h);
            }
        }
    }
});
