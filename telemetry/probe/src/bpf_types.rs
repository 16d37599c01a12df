//! The BPF programs' own types (generated from BTF into the skeleton), shared by the live probe
//! and the pcap twin so both fill exactly the same structures.
pub use crate::skel::types::{flow_key as FlowKey, flow_value as FlowValue, rtp_stats as RtpState};

// SAFETY: plain-old-data structs generated with #[repr(C)]; every bit pattern is valid.
unsafe impl plain::Plain for FlowKey {}
unsafe impl plain::Plain for FlowValue {}

pub const KEY_SIZE: usize = std::mem::size_of::<FlowKey>();
pub type KeyBytes = [u8; KEY_SIZE];
pub const VALUE_SIZE: usize = std::mem::size_of::<FlowValue>();

pub const DIR_INGRESS: u8 = 1;
pub const DIR_EGRESS: u8 = 2;
pub const RTP_PROBATION: u8 = 1;
pub const RTP_CONFIRMED: u8 = 2;
// Mirrors of cgloop_flow.h.
pub const SIZE_BUCKETS: usize = 16;
pub const IAT_BUCKETS: usize = 32;
pub const RTP_MIN_SEQUENTIAL: u8 = 4;
pub const RTP_MAX_DROPOUT: u16 = 3000;
pub const RTP_MAX_MISORDER: u32 = 100;

pub fn key_bytes(key: &FlowKey) -> KeyBytes {
    let mut out = [0u8; KEY_SIZE];
    out.copy_from_slice(unsafe { plain::as_bytes(key) });
    out
}

/// Reads a key from map bytes; None when the size does not match (a stale pinned map).
pub fn key_from(bytes: &[u8]) -> Option<FlowKey> {
    let mut key = FlowKey::default();
    plain::copy_from_bytes(&mut key, bytes).ok()?;
    Some(key)
}

pub fn value_from(bytes: &[u8]) -> Option<FlowValue> {
    let mut value = FlowValue::default();
    plain::copy_from_bytes(&mut value, bytes).ok()?;
    Some(value)
}

/// Names of the probe_stats slots, in enum cgloop_stat order (telemetry/bpf/include/cgloop_stat.h).
pub const STAT_NAMES: [&str; 22] = [
    "packets",
    "accounted",
    "non_ip",
    "flows_created",
    "map_update_failed",
    "rtp_confirmed",
    "eth_truncated",
    "vlan_truncated",
    "vlan_too_deep",
    "ipv4_truncated",
    "ipv4_bad_ihl",
    "ip_bad_length",
    "ipv6_truncated",
    "ipv6_ext_truncated",
    "ipv6_ext_too_deep",
    "ip_version_mismatch",
    "fragment",
    "tcp_truncated",
    "tcp_bad_offset",
    "udp_truncated",
    "udp_bad_length",
    "icmp_truncated",
];
/// First parse-failure slot; the ones before it are packet fates, not failures.
pub const FIRST_ERROR_STAT: usize = 6;
pub const STAT_PACKETS: usize = 0;
pub const STAT_ACCOUNTED: usize = 1;
pub const STAT_NON_IP: usize = 2;
pub const STAT_FLOWS_CREATED: usize = 3;
pub const STAT_RTP_CONFIRMED: usize = 5;
