//! Turns cumulative flow-table values into interval records: deltas since the previous sweep,
//! interval-scoped fields (min/max size, longest burst, TCP flags) checked by epoch, and a final
//! record for every flow that went idle. The live probe and the pcap twin share this code.
use std::collections::HashMap;

/// foldhash with a per-process random seed: cheaper than SipHash on 48-byte keys
/// (SipHash was a fifth of a sweep's CPU), and unlike Fx not predictable from outside.
/// Each flow's value at the previous sweep, with the sweep generation that last saw it.
type FlowMap = HashMap<KeyBytes, (FlowValue, u64), foldhash::fast::RandomState>;

use cgloop_proto::v1::{Direction, FiveTuple, FlowRecord, Log2Histogram, RecordHeader, RtpStats};

use crate::account::rtp_expected;
use crate::bpf_types::{key_bytes, FlowKey, FlowValue, KeyBytes, RTP_CONFIRMED};

const TCP_FIN: u8 = 0x01;
const TCP_RST: u8 = 0x04;

#[derive(Debug, Clone)]
pub struct SweepConfig {
    pub source_id: String,
    /// A flow without packets for this long gets its final record and leaves the table.
    pub idle_timeout_ns: u64,
    /// Shorter timeout once FIN or RST was seen.
    pub tcp_end_timeout_ns: u64,
}

impl Default for SweepConfig {
    fn default() -> Self {
        Self {
            source_id: "flow-probe".into(),
            idle_timeout_ns: 10_000_000_000,
            tcp_end_timeout_ns: 1_000_000_000,
        }
    }
}

/// Result of one sweep.
#[derive(Debug, Default)]
pub struct Swept {
    pub records: Vec<FlowRecord>,
    /// Flows to delete from the table (they got their final record).
    pub expired: Vec<KeyBytes>,
    /// Flows in the table at sweep time.
    pub live: usize,
}

pub struct Sweeper {
    cfg: SweepConfig,
    /// Value of each flow at the previous sweep: the base of the next deltas. Updated in place
    /// (one hash lookup per flow and sweep); flows the table no longer holds are dropped by
    /// generation.
    prev: FlowMap,
    generation: u64,
    last_sweep_ns: Option<u64>,
    sequence: u64,
    /// Added to table timestamps to get ns since the Unix epoch (0 for pcap times).
    pub clock_offset_ns: i64,
    /// Interface names by ifindex, filled by the caller.
    pub if_names: HashMap<u32, String>,
}

fn delta(now: u64, before: u64) -> u64 {
    now.wrapping_sub(before)
}

fn histogram<const N: usize>(now: &[u32; N], before: &[u32; N]) -> Option<Log2Histogram> {
    let mut buckets: Vec<u64> = now
        .iter()
        .zip(before)
        .map(|(a, b)| a.wrapping_sub(*b) as u64)
        .collect();
    while buckets.last() == Some(&0) {
        buckets.pop();
    }
    Some(Log2Histogram { buckets })
}

fn addr(bytes: &[u8; 16], family: u8) -> Vec<u8> {
    if family == 4 {
        bytes[..4].to_vec()
    } else {
        bytes.to_vec()
    }
}

/// Stable 64-bit FNV-1a hash of the five-tuple: the Kafka key that keeps a flow on one partition.
pub fn five_tuple_hash(k: &FlowKey) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for x in b {
            h ^= *x as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(&k.src_addr);
    eat(&k.dst_addr);
    eat(&k.src_port.to_be_bytes());
    eat(&k.dst_port.to_be_bytes());
    eat(&[k.ip_proto]);
    h
}

/// The same hash from a record's five-tuple (addresses padded to 16 bytes as in the key).
pub fn five_tuple_hash_of_record(r: &FlowRecord) -> u64 {
    let mut k = FlowKey::default();
    if let Some(t) = &r.five_tuple {
        let n = t.src_addr.len().min(16);
        k.src_addr[..n].copy_from_slice(&t.src_addr[..n]);
        let n = t.dst_addr.len().min(16);
        k.dst_addr[..n].copy_from_slice(&t.dst_addr[..n]);
        k.src_port = t.src_port as u16;
        k.dst_port = t.dst_port as u16;
        k.ip_proto = t.ip_protocol as u8;
    }
    five_tuple_hash(&k)
}

impl Sweeper {
    pub fn new(cfg: SweepConfig) -> Self {
        Self {
            cfg,
            prev: FlowMap::default(),
            generation: 0,
            last_sweep_ns: None,
            sequence: 0,
            clock_offset_ns: 0,
            if_names: HashMap::new(),
        }
    }

    fn wall(&self, t: u64) -> u64 {
        (t as i64).saturating_add(self.clock_offset_ns).max(0) as u64
    }

    /// One sweep at table time `now`. `epoch` is the sweep epoch the interval's packets carried
    /// (the value before the bump). `finish` turns every flow's record into its final one.
    pub fn sweep<I>(&mut self, now: u64, epoch: u32, entries: I, finish: bool) -> Swept
    where
        I: IntoIterator<Item = (FlowKey, FlowValue)>,
    {
        let mut out = Swept::default();
        self.generation += 1;
        let generation = self.generation;
        let mut prev = std::mem::take(&mut self.prev);
        let mut kept = 0usize;
        for (key, value) in entries {
            out.live += 1;
            let kb = key_bytes(&key);
            let slot = prev
                .entry(kb)
                .or_insert_with(|| (FlowValue::default(), generation));
            let idle = now.saturating_sub(value.last_ns);
            let ended = value.tcp_flags_life & (TCP_FIN | TCP_RST) != 0;
            let expired = finish
                || idle >= self.cfg.idle_timeout_ns
                || (ended && idle >= self.cfg.tcp_end_timeout_ns);
            if value.packets != slot.0.packets || expired {
                let record = self.record(&key, &value, &slot.0, now, epoch, expired);
                out.records.push(record);
            }
            if expired {
                prev.remove(&kb);
                out.expired.push(kb);
            } else {
                *slot = (value, generation);
                kept += 1;
            }
        }
        // Flows missing from the table were evicted (LRU) or deleted by someone else.
        if prev.len() != kept {
            prev.retain(|_, (_, g)| *g == generation);
        }
        self.prev = prev;
        self.last_sweep_ns = Some(now);
        out
    }

    fn record(
        &mut self,
        k: &FlowKey,
        v: &FlowValue,
        b: &FlowValue,
        now: u64,
        epoch: u32,
        is_final: bool,
    ) -> FlowRecord {
        self.sequence += 1;
        // Interval-scoped fields are valid when the flow saw a packet in this interval's epoch
        // (or just after the bump, which the next interval would otherwise lose).
        let current = (v.epoch.wrapping_sub(epoch) as i32) >= 0 && v.packets != b.packets;
        let start = self.last_sweep_ns.map_or(v.first_ns, |s| s.max(v.first_ns));
        let end = now.max(v.last_ns);
        let rtp = (v.rtp.state == RTP_CONFIRMED).then(|| {
            let (r, p) = (&v.rtp, &b.rtp);
            let expected = rtp_expected(r);
            let lost_now = expected.saturating_sub(r.received);
            let lost_before = if p.state == RTP_CONFIRMED {
                rtp_expected(p).saturating_sub(p.received)
            } else {
                0
            };
            RtpStats {
                ssrc: r.ssrc,
                payload_type: r.payload_type as u32,
                clock_rate_hz: r.clock_rate_hz,
                jitter_ns: r.jitter_ns_x16 >> 4,
                lost_packets: lost_now.saturating_sub(lost_before),
                reordered_packets: delta(r.reordered, p.reordered),
                sequence_gaps: delta(r.gaps, p.gaps),
                duplicate_packets: delta(r.duplicates, p.duplicates),
                marker_packets: delta(r.markers, p.markers),
                extended_highest_sequence: r.cycles.wrapping_add(r.max_seq as u32),
            }
        });
        FlowRecord {
            header: Some(RecordHeader {
                schema_version: cgloop_proto::SCHEMA_VERSION,
                source_id: self.cfg.source_id.clone(),
                sequence: self.sequence,
                timestamp_ns: self.wall(end),
            }),
            five_tuple: Some(FiveTuple {
                src_addr: addr(&k.src_addr, k.family),
                dst_addr: addr(&k.dst_addr, k.family),
                src_port: k.src_port as u32,
                dst_port: k.dst_port as u32,
                ip_protocol: k.ip_proto as u32,
            }),
            direction: match k.direction {
                1 => Direction::Ingress as i32,
                2 => Direction::Egress as i32,
                _ => Direction::Unspecified as i32,
            },
            vlan_id: k.vlan_id as u32,
            ifindex: k.ifindex,
            interface_name: self.if_names.get(&k.ifindex).cloned().unwrap_or_default(),
            interval_start_ns: self.wall(start),
            interval_end_ns: self.wall(end),
            is_final,
            packets: delta(v.packets, b.packets),
            bytes: delta(v.bytes, b.bytes),
            first_seen_ns: self.wall(v.first_ns),
            last_seen_ns: self.wall(v.last_ns),
            size_min_bytes: if current { v.size_min } else { 0 },
            size_max_bytes: if current { v.size_max } else { 0 },
            size_sum_bytes: delta(v.bytes, b.bytes),
            size_sum_squares_bytes2: delta(v.size_sum_sq, b.size_sum_sq),
            size_histogram_bytes: histogram(&v.size_hist, &b.size_hist),
            inter_arrival_histogram_ns: histogram(&v.iat_hist, &b.iat_hist),
            max_burst_packets: if current { v.max_burst } else { 0 },
            burst_count: delta(v.burst_count, b.burst_count) as u32,
            ecn_not_ect_packets: v.ecn[0].wrapping_sub(b.ecn[0]) as u64,
            ecn_ect0_packets: v.ecn[2].wrapping_sub(b.ecn[2]) as u64,
            ecn_ect1_packets: v.ecn[1].wrapping_sub(b.ecn[1]) as u64,
            ecn_ce_packets: v.ecn[3].wrapping_sub(b.ecn[3]) as u64,
            last_dscp: v.last_dscp as u32,
            // The interval's flags, plus any flag first seen since this flow's last record: a
            // packet racing the epoch bump can reset the interval's flags before the read (a
            // SYN was lost so), but the lifetime OR keeps it.
            tcp_flags_seen: (if current { v.tcp_flags } else { 0 }
                | (v.tcp_flags_life & !b.tcp_flags_life)) as u32,
            rtp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::{account, new_flow, AccountConfig};
    use crate::parse::parse_ethernet;

    fn frame(tos: u8, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&0x0800u16.to_be_bytes());
        f.extend_from_slice(&[0x45, tos]);
        f.extend_from_slice(&((28 + len) as u16).to_be_bytes());
        f.extend_from_slice(&[
            0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, 0x13, 0x8c,
        ]);
        f.extend_from_slice(&[0x17, 0x70]);
        f.extend_from_slice(&((8 + len) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend(std::iter::repeat_n(0u8, len));
        f
    }

    #[test]
    fn deltas_and_final_record() {
        let cfg = AccountConfig::default();
        let mut sweeper = Sweeper::new(SweepConfig::default());
        let mut table: HashMap<KeyBytes, (FlowKey, FlowValue)> = HashMap::new();
        let mut epoch = 0;
        let feed = |table: &mut HashMap<KeyBytes, (FlowKey, FlowValue)>, t, tos, len, epoch| {
            let f = frame(tos, len);
            let p = parse_ethernet(&f, f.len() as u32).unwrap();
            let e = table
                .entry(key_bytes(&p.key))
                .or_insert_with(|| (p.key, new_flow(t, epoch, p.l3_len)));
            account(&mut e.1, &p, t, epoch, &cfg);
        };
        feed(&mut table, 1_000, 1, 100, epoch);
        feed(&mut table, 2_000, 3, 200, epoch);
        let s = sweeper.sweep(100_000_000, epoch, table.values().copied(), false);
        epoch += 1;
        assert_eq!(s.records.len(), 1);
        let r = &s.records[0];
        assert_eq!(
            (r.packets, r.bytes, r.size_min_bytes, r.size_max_bytes),
            (2, 356, 128, 228)
        );
        assert_eq!(
            (
                r.ecn_ect1_packets,
                r.ecn_ce_packets,
                r.burst_count,
                r.max_burst_packets
            ),
            (1, 1, 1, 2)
        );
        feed(&mut table, 150_000_000, 0, 10, epoch);
        let s = sweeper.sweep(200_000_000, epoch, table.values().copied(), false);
        let r = &s.records[0];
        assert_eq!(
            (r.packets, r.bytes, r.size_min_bytes, r.size_max_bytes),
            (1, 38, 38, 38)
        );
        assert_eq!(
            (r.ecn_not_ect_packets, r.max_burst_packets, r.is_final),
            (1, 1, false)
        );
        assert_eq!(r.interval_start_ns, 100_000_000);
        // Idle for 10 s: one final record without packets, and the flow leaves the table.
        let s = sweeper.sweep(10_200_000_000, epoch + 1, table.values().copied(), false);
        assert_eq!(s.records.len(), 1);
        assert!(s.records[0].is_final);
        assert_eq!(s.records[0].packets, 0);
        assert_eq!(s.expired.len(), 1);
        assert_eq!(s.records[0].header.as_ref().unwrap().sequence, 3);
    }

    const TCP_SYN: u8 = 0x02;
    const TCP_ACK: u8 = 0x10;

    #[test]
    fn a_flag_reset_by_a_packet_racing_the_epoch_bump_is_still_reported() {
        let f = frame(0, 100);
        let p = parse_ethernet(&f, f.len() as u32).unwrap();
        let mut v = new_flow(1_000, 0, p.l3_len);
        // SYN in epoch 0; the sweep bumps to 1; an ACK lands before the read and resets the
        // interval's flags (epoch 1): only the lifetime OR still holds the SYN.
        v.packets = 2;
        v.epoch = 1;
        v.tcp_flags = TCP_ACK;
        v.tcp_flags_life = TCP_SYN | TCP_ACK;
        let mut sweeper = Sweeper::new(SweepConfig::default());
        let s = sweeper.sweep(10_000, 0, [(p.key, v)], false);
        assert_eq!(s.records[0].tcp_flags_seen, u32::from(TCP_SYN | TCP_ACK));
        // Next interval: only an ACK, and the SYN is not reported again.
        v.packets = 3;
        v.epoch = 2;
        let s = sweeper.sweep(20_000, 2, [(p.key, v)], false);
        assert_eq!(s.records[0].tcp_flags_seen, u32::from(TCP_ACK));
    }

    #[test]
    fn an_expired_or_evicted_flow_returning_counts_from_zero() {
        let cfg = AccountConfig::default();
        let mut sweeper = Sweeper::new(SweepConfig::default());
        let flow = |sport: u16, t: u64, n: u32| {
            let mut f = frame(0, 100);
            f[34..36].copy_from_slice(&sport.to_be_bytes());
            let p = parse_ethernet(&f, f.len() as u32).unwrap();
            let mut v = new_flow(t, 0, p.l3_len);
            for i in 0..n {
                account(&mut v, &p, t + i as u64, 0, &cfg);
            }
            (p.key, v)
        };
        let (a, b, c) = (
            flow(1, 1_000, 3),
            flow(2, 1_000, 5),
            flow(3, 20_000_000_000, 7),
        );
        let s = sweeper.sweep(10_000, 0, [a, b], false);
        assert_eq!(s.records.iter().map(|r| r.packets).sum::<u64>(), 8);
        // a goes idle (expires, its slot is freed) and c arrives after it in the same sweep:
        // c counts from zero; b (unchanged, not idle yet) gets no record.
        let mut b2 = b.1;
        b2.last_ns = 15_000_000_000;
        let s = sweeper.sweep(20_000_000_000, 1, [a, (b.0, b2), c], false);
        let got: Vec<_> = s
            .records
            .iter()
            .map(|r| {
                (
                    r.five_tuple.as_ref().unwrap().src_port,
                    r.packets,
                    r.is_final,
                )
            })
            .collect();
        assert_eq!(got, vec![(1, 0, true), (3, 7, false)]);
        // b is evicted (missing from a sweep); a returns and counts from zero again.
        let s = sweeper.sweep(20_000_000_100, 2, [c], false);
        assert!(s.records.is_empty());
        let s = sweeper.sweep(20_000_000_200, 3, [a, c], false);
        let got: Vec<_> = s
            .records
            .iter()
            .map(|r| (r.five_tuple.as_ref().unwrap().src_port, r.packets))
            .collect();
        assert_eq!(got, vec![(1, 3)]);
        assert_eq!(s.live, 2);
    }

    #[test]
    fn a_flow_gone_from_the_table_starts_over_when_it_returns() {
        let cfg = AccountConfig::default();
        let mut sweeper = Sweeper::new(SweepConfig::default());
        let f = frame(0, 100);
        let p = parse_ethernet(&f, f.len() as u32).unwrap();
        let mut v = new_flow(1_000, 0, p.l3_len);
        account(&mut v, &p, 1_000, 0, &cfg);
        account(&mut v, &p, 2_000, 0, &cfg);
        let s = sweeper.sweep(10_000, 0, [(p.key, v)], false);
        assert_eq!(s.records[0].packets, 2);
        // Unchanged: no record; then evicted (missing from one sweep): forgotten.
        assert!(sweeper
            .sweep(20_000, 1, [(p.key, v)], false)
            .records
            .is_empty());
        assert_eq!(sweeper.sweep(30_000, 2, [], false).live, 0);
        // Back with the same cumulative value: everything counts again, from a zero base.
        let s = sweeper.sweep(40_000, 3, [(p.key, v)], false);
        assert_eq!((s.records.len(), s.records[0].packets), (1, 2));
        assert_eq!(s.records[0].size_sum_bytes, s.records[0].bytes);
    }
}
