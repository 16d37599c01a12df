//! The pcap twin's flow update: `cgloop_account()` and `cgloop_rtp_update()` of
//! telemetry/bpf/flow_probe.bpf.c, line for line, on the same structures.
use crate::bpf_types::{
    FlowValue, RtpState, IAT_BUCKETS, RTP_CONFIRMED, RTP_MAX_DROPOUT, RTP_MAX_MISORDER,
    RTP_MIN_SEQUENTIAL, RTP_PROBATION, SIZE_BUCKETS,
};
use crate::parse::PacketInfo;

const NSEC_PER_SEC: u64 = 1_000_000_000;

/// The BPF programs' load-time settings (rodata), shared by probe and twin.
#[derive(Debug, Clone, Copy)]
pub struct AccountConfig {
    pub burst_gap_ns: u64,
    pub rtp_default_clock_hz: u32,
    pub rtp_enabled: bool,
}

impl Default for AccountConfig {
    fn default() -> Self {
        Self {
            burst_gap_ns: 1_000_000,
            rtp_default_clock_hz: 90_000,
            rtp_enabled: true,
        }
    }
}

fn log2_u64(v: u64) -> usize {
    if v == 0 {
        0
    } else {
        63 - v.leading_zeros() as usize
    }
}

/// RFC 3551 static payload types; dynamic ones use the configured default.
pub fn rtp_clock_hz(pt: u8, default_hz: u32) -> u32 {
    match pt {
        10 | 11 => 44_100,
        6 => 16_000,
        16 => 11_025,
        17 => 22_050,
        14 | 25 | 26 | 28 | 31 | 32 | 33 | 34 => 90_000,
        pt if pt < 24 => 8_000,
        _ => default_hz,
    }
}

/// A new flow's value, as the BPF program initialises it from the zeroed template.
pub fn new_flow(now: u64, epoch: u32, l3_len: u32) -> FlowValue {
    FlowValue {
        first_ns: now,
        last_ns: now,
        epoch,
        size_min: l3_len,
        ..Default::default()
    }
}

/// Adds one packet to its flow. Returns true when this packet confirmed an RTP stream.
pub fn account(
    v: &mut FlowValue,
    p: &PacketInfo,
    now: u64,
    epoch: u32,
    cfg: &AccountConfig,
) -> bool {
    let l3 = p.l3_len;
    v.packets += 1;
    v.bytes += l3 as u64;
    v.size_sum_sq += l3 as u64 * l3 as u64;
    let e = &mut v.ecn[(p.tos & 3) as usize];
    *e = e.wrapping_add(1); // u32 in the table: deltas wrap
    v.last_dscp = p.tos >> 2;
    v.size_hist[log2_u64(l3 as u64).min(SIZE_BUCKETS - 1)] += 1;
    if v.epoch != epoch {
        v.epoch = epoch;
        v.size_min = l3;
        v.size_max = 0;
        v.max_burst = 0;
        v.tcp_flags = 0;
    }
    v.size_min = v.size_min.min(l3);
    v.size_max = v.size_max.max(l3);
    v.tcp_flags |= p.tcp_flags;
    v.tcp_flags_life |= p.tcp_flags;
    if v.packets > 1 {
        let iat = now.saturating_sub(v.last_ns);
        v.iat_hist[log2_u64(iat).min(IAT_BUCKETS - 1)] += 1;
        if iat <= cfg.burst_gap_ns {
            v.cur_burst += 1;
            if v.cur_burst == 2 {
                v.burst_count += 1;
            }
        } else {
            v.cur_burst = 1;
        }
    } else {
        v.cur_burst = 1;
    }
    v.max_burst = v.max_burst.max(v.cur_burst);
    v.last_ns = now;
    match (cfg.rtp_enabled, p.rtp) {
        (true, Some(h)) => rtp_update(&mut v.rtp, &h, now, cfg.rtp_default_clock_hz),
        _ => false,
    }
}

/// RFC 3550 A.1 (sequence) and A.8 (jitter). Returns true when the stream got confirmed.
pub fn rtp_update(r: &mut RtpState, h: &[u8; 12], now: u64, default_hz: u32) -> bool {
    let ssrc = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
    let ts = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    let seq = u16::from_be_bytes([h[2], h[3]]);
    let pt = h[1] & 0x7f;
    if h[0] >> 6 != 2 || (72..=76).contains(&pt) {
        return false;
    }
    if r.state != RTP_CONFIRMED {
        if r.state == RTP_PROBATION && ssrc == r.ssrc && seq == r.max_seq.wrapping_add(1) {
            r.max_seq = seq;
            r.probation -= 1;
            if r.probation == 0 {
                r.state = RTP_CONFIRMED;
                r.base_seq = seq as u32;
                r.cycles = 0;
                r.received = 1;
                r.window = 1;
                r.payload_type = pt;
                r.clock_rate_hz = rtp_clock_hz(pt, default_hz);
                r.jitter_ns_x16 = 0;
                r.last_arrival_ns = now;
                r.last_rtp_ts = ts;
                return true;
            }
            return false;
        }
        r.state = RTP_PROBATION;
        r.ssrc = ssrc;
        r.max_seq = seq;
        r.probation = RTP_MIN_SEQUENTIAL - 1;
        return false;
    }
    if ssrc != r.ssrc {
        return false;
    }
    if h[1] & 0x80 != 0 {
        r.markers += 1;
    }
    let dts = ts.wrapping_sub(r.last_rtp_ts) as i32;
    let clock = if r.clock_rate_hz != 0 {
        r.clock_rate_hz as u64
    } else {
        90_000
    };
    let mag = (dts.unsigned_abs() as u64) * NSEC_PER_SEC / clock;
    let sent = if dts < 0 { -(mag as i64) } else { mag as i64 };
    let d = (now.wrapping_sub(r.last_arrival_ns) as i64)
        .wrapping_sub(sent)
        .unsigned_abs();
    r.jitter_ns_x16 = r
        .jitter_ns_x16
        .wrapping_add(d)
        .wrapping_sub((r.jitter_ns_x16 + 8) >> 4);
    r.last_arrival_ns = now;
    r.last_rtp_ts = ts;

    let udelta = seq.wrapping_sub(r.max_seq);
    if udelta == 0 {
        r.duplicates += 1;
    } else if udelta < RTP_MAX_DROPOUT {
        if seq < r.max_seq {
            r.cycles = r.cycles.wrapping_add(1 << 16);
        }
        if udelta > 1 {
            r.gaps += 1;
        }
        r.window = if udelta >= 64 {
            1
        } else {
            (r.window << udelta) | 1
        };
        r.max_seq = seq;
        r.received += 1;
    } else if udelta as u32 <= 65536 - RTP_MAX_MISORDER {
        r.expected_prior += (r
            .cycles
            .wrapping_add(r.max_seq as u32)
            .wrapping_sub(r.base_seq))
        .wrapping_add(1) as u64;
        r.cycles = 0;
        r.base_seq = seq as u32;
        r.max_seq = seq;
        r.window = 1;
        r.received += 1;
    } else {
        let back = r.max_seq.wrapping_sub(seq);
        if back < 64 && (r.window >> back) & 1 == 1 {
            r.duplicates += 1;
        } else {
            if back < 64 {
                r.window |= 1 << back;
            }
            r.reordered += 1;
            r.received += 1;
        }
    }
    false
}

/// Packets the RTP stream should have delivered so far (RFC 3550 A.3), all runs included.
pub fn rtp_expected(r: &RtpState) -> u64 {
    r.expected_prior
        + (r.cycles
            .wrapping_add(r.max_seq as u32)
            .wrapping_sub(r.base_seq))
        .wrapping_add(1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rtp(seq: u16, ts: u32, marker: bool) -> [u8; 12] {
        let mut h = [0u8; 12];
        h[0] = 0x80;
        h[1] = 96 | if marker { 0x80 } else { 0 };
        h[2..4].copy_from_slice(&seq.to_be_bytes());
        h[4..8].copy_from_slice(&ts.to_be_bytes());
        h[8..12].copy_from_slice(&0xfeed_beefu32.to_be_bytes());
        h
    }

    #[test]
    fn sequence_loss_reorder_duplicates_and_wrap() {
        let mut r = RtpState::default();
        // 65530.. wraps to 0..; 3 lost (seq 2,3,4), 7 and 8 swapped, 9 duplicated.
        let mut order: Vec<u16> = (65530..=65535).collect();
        order.extend([0, 1, 5, 6, 8, 7, 9, 9, 10]);
        let mut confirmed = 0;
        for (i, seq) in order.iter().enumerate() {
            if rtp_update(&mut r, &rtp(*seq, 0, i % 3 == 0), i as u64 * 1000, 90_000) {
                confirmed += 1;
            }
        }
        assert_eq!(confirmed, 1);
        assert_eq!(r.state, RTP_CONFIRMED);
        // Counting starts at the 4th in-order packet (65533).
        assert_eq!(r.received, 11);
        assert_eq!(rtp_expected(&r), 14); // 65533..=65535, 0..=10
        assert_eq!((r.gaps, r.reordered, r.duplicates), (2, 1, 1));
        assert_eq!(r.cycles, 1 << 16);
    }

    #[test]
    fn jitter_follows_rfc3550() {
        let mut r = RtpState::default();
        // 90 kHz clock, one packet every 10 ms (900 ticks); arrivals alternate +-1 ms.
        let mut j_ref = 0f64;
        let mut prev_transit: Option<f64> = None;
        for i in 0..200u64 {
            let send_ns = i * 10_000_000;
            let arrival = send_ns + if i % 2 == 0 { 0 } else { 1_000_000 };
            rtp_update(
                &mut r,
                &rtp(i as u16, (i * 900) as u32, false),
                arrival,
                90_000,
            );
            if i >= 3 {
                let transit = arrival as f64 - send_ns as f64;
                if let Some(p) = prev_transit {
                    j_ref += ((transit - p).abs() - j_ref) / 16.0;
                }
                prev_transit = Some(transit);
            }
        }
        let j = (r.jitter_ns_x16 >> 4) as f64;
        assert!((j - j_ref).abs() < 1000.0, "jitter {j} vs {j_ref}");
    }

    #[test]
    fn rtcp_and_non_v2_are_ignored() {
        let mut r = RtpState::default();
        let mut h = rtp(1, 0, false);
        h[1] = 200; // RTCP SR: 0xc8 & 0x7f = 72
        assert!(!rtp_update(&mut r, &h, 0, 90_000));
        h[0] = 0x40;
        assert!(!rtp_update(&mut r, &h, 0, 90_000));
        assert_eq!(r.state, 0);
    }
}
