//! The ring buffer's events (`struct int_event`, bpf/int.bpf.h) as the exporter reads them.

use super::encode::MAX_INNER_BYTES;

/// Bytes of `struct int_event`: 48 of fields, then the header copy.
pub const EVENT_BYTES: usize = 48 + MAX_INNER_BYTES;

/// `INT_R_*` of bpf/int.bpf.h.
pub const REASON_SAMPLED: u8 = 1;
pub const REASON_LATENCY: u8 = 2;

/// One sampled packet as the datapath saw it (CLOCK_MONOTONIC times).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub enq_ns: u64,
    pub deq_ns: u64,
    pub backlog_bytes: i64,
    pub egress_ifindex: u32,
    pub ingress_ifindex: u32,
    pub slot: u32,
    pub len: u32,
    pub family: u8,
    pub reason: u8,
    /// IP + transport headers (at most 128 bytes).
    pub headers: Vec<u8>,
}

impl Event {
    /// The event in `b` (host byte order), or None when it is not one (short, or a header
    /// length beyond the copy).
    pub fn parse(b: &[u8]) -> Option<Event> {
        if b.len() < EVENT_BYTES {
            return None;
        }
        let u64_at = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().unwrap_or_default());
        let hdr_len = usize::from(u16::from_ne_bytes([b[42], b[43]]));
        if hdr_len == 0 || hdr_len > MAX_INNER_BYTES {
            return None;
        }
        Some(Event {
            enq_ns: u64_at(0),
            deq_ns: u64_at(8),
            backlog_bytes: u64_at(16) as i64,
            egress_ifindex: u32_at(24),
            ingress_ifindex: u32_at(28),
            slot: u32_at(32),
            len: u32_at(36),
            family: b[40],
            reason: b[41],
            headers: b[48..48 + hdr_len].to_vec(),
        })
    }

    /// The hop latency: the qdisc sojourn.
    pub fn sojourn_ns(&self) -> u64 {
        self.deq_ns.saturating_sub(self.enq_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_back_field_by_field_and_bad_lengths_are_refused() {
        let mut b = vec![0u8; EVENT_BYTES];
        b[0..8].copy_from_slice(&100u64.to_ne_bytes());
        b[8..16].copy_from_slice(&350u64.to_ne_bytes());
        b[16..24].copy_from_slice(&(-3i64).to_ne_bytes());
        b[24..28].copy_from_slice(&7u32.to_ne_bytes());
        b[28..32].copy_from_slice(&3u32.to_ne_bytes());
        b[32..36].copy_from_slice(&2u32.to_ne_bytes());
        b[36..40].copy_from_slice(&1500u32.to_ne_bytes());
        b[40] = 4;
        b[41] = REASON_SAMPLED | REASON_LATENCY;
        b[42..44].copy_from_slice(&28u16.to_ne_bytes());
        b[48] = 0x45;
        let e = Event::parse(&b).expect("an event");
        assert_eq!((e.enq_ns, e.deq_ns, e.sojourn_ns(), e.backlog_bytes), (100, 350, 250, -3));
        assert_eq!((e.egress_ifindex, e.ingress_ifindex, e.slot, e.len), (7, 3, 2, 1500));
        assert_eq!((e.family, e.reason, e.headers.len(), e.headers[0]), (4, 3, 28, 0x45));
        assert!(Event::parse(&b[..EVENT_BYTES - 1]).is_none());
        b[42..44].copy_from_slice(&129u16.to_ne_bytes());
        assert!(Event::parse(&b).is_none());
    }
}
