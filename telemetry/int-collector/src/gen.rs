//! Spec-conformant telemetry report generator: for tests, the demo and the benchmark.
//!
//! Flows cross a path of `hops` switches. Per data packet it emits what real switches would:
//! * v2.0 INT-MD: the sink's report (TR §4.3 shape): sink metadata in RepMdBits, the stack of
//!   the previous hops embedded in the truncated IPv4 packet (INT over UDP, NPT 1).
//! * v2.0 INT-MX: one report per switch (TR §3.3.1), the INT-MX header in the inner packet.
//! * v1.0: the sink's report with the whole INT v1.0 stack (DSCP 0x17 marking).
//! * v0.5: one switch-local report per switch (fabric-tna postcards).
//!
//! Congestion episodes raise one switch's queue and latency (and set Q on its reports); drops
//! turn every n-th packet into a drop report at a chosen switch; a path change swaps the
//! middle switch. Values carry small jitter below the collector's default thresholds.

use crate::parse::inner::DEFAULT_INT_UDP_PORT;
use crate::parse::metadata::{self, HopMetadata, Layout};
use crate::parse::{FlowKey, Format};
use serde::Serialize;

/// Which INT mode the v2.0 reports use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mode {
    Md,
    Mx,
}

/// A switch whose queue is congested between two packet numbers (per flow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Episode {
    pub hop: usize,
    pub start: u64,
    pub end: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct GenConfig {
    pub format: Format,
    pub mode: Mode,
    pub flows: u32,
    pub hops: usize,
    /// INT instruction bitmap (INT v2.1 §5.7); RepMdBits are derived from it (bit 0 cleared).
    pub bitmap: u16,
    /// Individual reports coalesced per v2.0 packet (TR §2.7).
    pub batch: usize,
    pub int_udp_port: u16,
    pub congestion: Vec<Episode>,
    /// Every n-th packet of a flow is dropped at `drop_hop` (0 = never).
    pub drop_every: u64,
    pub drop_hop: usize,
    pub drop_reason: u8,
    /// Packet number (per flow) at which the middle switch is replaced (None = never).
    pub path_change_at: Option<u64>,
    pub jitter: bool,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            format: Format::V20,
            mode: Mode::Md,
            flows: 4,
            hops: 3,
            bitmap: 0xff80,
            batch: 1,
            int_udp_port: DEFAULT_INT_UDP_PORT,
            congestion: Vec::new(),
            drop_every: 0,
            drop_hop: 1,
            drop_reason: 71,
            path_change_at: None,
            jitter: true,
        }
    }
}

/// Base values the generator uses (also what `describe` reports), so tests can compare.
pub const BASE_LATENCY_NS: u32 = 2_000;
pub const CONGESTED_LATENCY_NS: u32 = 80_000;
pub const BASE_QUEUE_CELLS: u32 = 40;
pub const CONGESTED_QUEUE_CELLS: u32 = 20_000;
pub const QUEUE_ID: u8 = 2;

pub struct Generator {
    cfg: GenConfig,
    /// Packet number of the next packet of each flow; flows take turns.
    packet: u64,
    /// Per reporting switch (index) sequence numbers.
    seq: Vec<u32>,
    pending: Vec<Vec<u8>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FlowTruth {
    pub src_addr: [u8; 4],
    pub dst_addr: [u8; 4],
    pub src_port: u16,
    pub dst_port: u16,
    pub ip_protocol: u8,
    pub path: Vec<u32>,
    pub hops: Vec<HopTruth>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HopTruth {
    pub switch_id: u32,
    pub ingress_port: u16,
    pub egress_port: u16,
    pub hop_latency_ns: u32,
    pub queue_id: u8,
    pub queue_occupancy_cells: u32,
    pub l2_ingress_port: u32,
    pub l2_egress_port: u32,
    pub egress_tx_util: u32,
    pub buffer_id: u8,
    pub buffer_occupancy_cells: u32,
}

impl Generator {
    pub fn new(cfg: GenConfig) -> Self {
        let hops = cfg.hops.max(1);
        Generator { cfg: GenConfig { hops, batch: cfg.batch.max(1), ..cfg }, packet: 0, seq: vec![0; 256], pending: Vec::new() }
    }

    /// Data packets generated so far (over all flows); the report returned last belongs to
    /// data packet `data_packets() - 1`.
    pub fn data_packets(&self) -> u64 {
        self.packet
    }

    pub fn config(&self) -> &GenConfig {
        &self.cfg
    }

    pub fn flow_key(&self, flow: u32) -> FlowKey {
        let mut k = FlowKey { proto: 17, src_port: 10_000 + (flow % 50_000) as u16, dst_port: 3478, ..FlowKey::default() };
        k.src[..4].copy_from_slice(&[10, 0, (flow >> 8) as u8, flow as u8]);
        k.dst[..4].copy_from_slice(&[10, 1, 0, 1]);
        k
    }

    /// Switch ids on the path of a flow at packet `n` (source first).
    pub fn path(&self, n: u64) -> Vec<u32> {
        let changed = self.cfg.path_change_at.is_some_and(|at| n >= at);
        (0..self.cfg.hops)
            .map(|i| {
                let id = i as u32 + 1;
                if changed && i == self.cfg.hops / 2 { 100 + id } else { id }
            })
            .collect()
    }

    fn congested(&self, hop: usize, n: u64) -> bool {
        self.cfg.congestion.iter().any(|e| e.hop == hop && (e.start..e.end).contains(&n))
    }

    /// Metadata switch `hop` writes for packet `n` of `flow`.
    pub fn hop_metadata(&self, flow: u32, hop: usize, n: u64) -> HopMetadata {
        let congested = self.congested(hop, n);
        let jitter = if self.cfg.jitter { ((n.wrapping_mul(2654435761) ^ u64::from(flow)) % 64) as u32 } else { 0 };
        let latency = if congested { CONGESTED_LATENCY_NS } else { BASE_LATENCY_NS + 100 * hop as u32 } + jitter;
        let occupancy = if congested { CONGESTED_QUEUE_CELLS } else { BASE_QUEUE_CELLS + hop as u32 } + jitter % 8;
        let ingress_ts = 1_700_000_000_000_000_000u64 + n * 1_000_000 + hop as u64 * 10_000;
        HopMetadata {
            node_id: Some(self.path(n)[hop]),
            l1_ingress_port: Some(hop as u16 + 1),
            l1_egress_port: Some(hop as u16 + 2),
            hop_latency: Some(latency),
            queue_id: Some(QUEUE_ID),
            queue_occupancy: Some(occupancy),
            ingress_timestamp: Some(ingress_ts),
            egress_timestamp: Some(ingress_ts + u64::from(latency)),
            l2_ingress_port: Some(1000 + hop as u32),
            l2_egress_port: Some(2000 + hop as u32),
            egress_tx_util: Some(if congested { 9_900 } else { 1_000 + 10 * hop as u32 }),
            buffer_id: Some(1),
            buffer_occupancy: Some(occupancy * 2),
            drop_reason: None,
            checksum_complement: Some(0),
        }
    }

    /// What the collector should see for a flow in steady state (no jitter, packet 0).
    pub fn describe(&self) -> Vec<FlowTruth> {
        let quiet = Generator::new(GenConfig { jitter: false, congestion: vec![], ..self.cfg.clone() });
        (0..self.cfg.flows)
            .map(|f| {
                let k = self.flow_key(f);
                let hops = (0..self.cfg.hops)
                    .map(|h| {
                        let m = quiet.hop_metadata(f, h, 0);
                        HopTruth {
                            switch_id: m.node_id.unwrap_or(0),
                            ingress_port: m.l1_ingress_port.unwrap_or(0),
                            egress_port: m.l1_egress_port.unwrap_or(0),
                            hop_latency_ns: m.hop_latency.unwrap_or(0),
                            queue_id: m.queue_id.unwrap_or(0),
                            queue_occupancy_cells: m.queue_occupancy.unwrap_or(0),
                            l2_ingress_port: m.l2_ingress_port.unwrap_or(0),
                            l2_egress_port: m.l2_egress_port.unwrap_or(0),
                            egress_tx_util: m.egress_tx_util.unwrap_or(0),
                            buffer_id: m.buffer_id.unwrap_or(0),
                            buffer_occupancy_cells: m.buffer_occupancy.unwrap_or(0),
                        }
                    })
                    .collect();
                FlowTruth {
                    src_addr: k.src[..4].try_into().unwrap_or_default(),
                    dst_addr: k.dst[..4].try_into().unwrap_or_default(),
                    src_port: k.src_port,
                    dst_port: k.dst_port,
                    ip_protocol: k.proto,
                    path: quiet.path(0),
                    hops,
                }
            })
            .collect()
    }

    /// Write the next report packet (UDP payload) into `out`.
    pub fn next_packet(&mut self, out: &mut Vec<u8>) {
        out.clear();
        while self.pending.is_empty() {
            self.emit_data_packet();
        }
        let first = self.pending.remove(0);
        if self.cfg.format == Format::V20 {
            // Group header of the reporting node comes first in each pending item; coalesce the
            // following individual reports of the same node.
            out.extend_from_slice(&first);
            let node = &first[4..8];
            let mut n = 1;
            while n < self.cfg.batch {
                match self.pending.first() {
                    Some(p) if &p[4..8] == node => {
                        let p = self.pending.remove(0);
                        out.extend_from_slice(&p[8..]);
                        n += 1;
                    }
                    _ => break,
                }
            }
        } else {
            out.extend_from_slice(&first);
        }
    }

    fn next_seq(&mut self, hop: usize) -> u32 {
        let s = &mut self.seq[hop % 256];
        *s = s.wrapping_add(1);
        *s
    }

    fn emit_data_packet(&mut self) {
        let flow = (self.packet % u64::from(self.cfg.flows.max(1))) as u32;
        let n = self.packet / u64::from(self.cfg.flows.max(1));
        self.packet += 1;
        let hops: Vec<HopMetadata> = (0..self.cfg.hops).map(|h| self.hop_metadata(flow, h, n)).collect();
        let drop_at = (self.cfg.drop_every > 0 && n % self.cfg.drop_every == self.cfg.drop_every - 1)
            .then_some(self.cfg.drop_hop.min(self.cfg.hops - 1));
        let sink = self.cfg.hops - 1;
        match (self.cfg.format, self.cfg.mode) {
            (Format::V20, Mode::Md) => {
                let last = drop_at.unwrap_or(sink);
                let p = self.v20_report(flow, last, &hops[..last], &hops[last], drop_at.is_some(), n);
                self.pending.push(p);
            }
            (Format::V20, Mode::Mx) => {
                for h in 0..=drop_at.unwrap_or(sink) {
                    let p = self.v20_report(flow, h, &[], &hops[h], drop_at == Some(h), n);
                    self.pending.push(p);
                }
            }
            (Format::V10, _) => {
                let last = drop_at.unwrap_or(sink);
                let p = self.v10_report(flow, &hops[..=last], drop_at.is_some(), last);
                self.pending.push(p);
            }
            (Format::V05, _) => {
                for h in 0..=drop_at.unwrap_or(sink) {
                    let p = self.v05_report(flow, &hops[h], drop_at == Some(h), h, n);
                    self.pending.push(p);
                }
            }
        }
    }

    fn inner_udp(&self, flow: u32, dscp: u8, int: &[u8], dport: u16) -> Vec<u8> {
        let k = self.flow_key(flow);
        let l4_len = 8 + int.len() as u16;
        let mut v = vec![0x45, dscp << 2];
        v.extend_from_slice(&(20 + l4_len).to_be_bytes());
        v.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
        v.extend_from_slice(&k.src[..4]);
        v.extend_from_slice(&k.dst[..4]);
        v.extend_from_slice(&k.src_port.to_be_bytes());
        v.extend_from_slice(&dport.to_be_bytes());
        v.extend_from_slice(&l4_len.to_be_bytes());
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(int);
        v
    }

    fn v20_report(&mut self, flow: u32, hop: usize, stack: &[HopMetadata], local: &HopMetadata, dropped: bool, n: u64) -> Vec<u8> {
        let k = self.flow_key(flow);
        let bitmap = self.cfg.bitmap;
        // INT-MD/MX shim (INT §5.6.2, NPT 1: original UDP port) + header + stack.
        let mut int = Vec::with_capacity(128);
        let hop_ml = (metadata::baseline_len(bitmap, Layout::IntV2) / 4) as u8;
        let mut body = Vec::new();
        if self.cfg.mode == Mode::Md {
            body.extend_from_slice(&[0x20, 0, hop_ml, (8 - stack.len().min(8)) as u8]);
        } else {
            body.extend_from_slice(&[0x20, 0, 0, 0]);
        }
        body.extend_from_slice(&bitmap.to_be_bytes());
        body.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        for h in stack.iter().rev() {
            metadata::encode(bitmap, h, Layout::IntV2, &mut body);
        }
        let ty = if self.cfg.mode == Mode::Md { 1 } else { 3 };
        int.push((ty << 4) | (1 << 2));
        int.push((body.len() / 4) as u8);
        int.extend_from_slice(&k.dst_port.to_be_bytes());
        int.extend(body);
        let inner = self.inner_udp(flow, 0, &int, self.cfg.int_udp_port);
        // The node's own metadata: RepMdBits = bitmap without bit 0 (INT §5.8) and without the
        // checksum complement (INT §5.7); bit 15 = queue id + drop reason on drop reports.
        let mut rep_bits = bitmap & 0x7ffe;
        let mut local = *local;
        if dropped {
            rep_bits |= 0x0001;
            local.drop_reason = Some(self.cfg.drop_reason);
        }
        let mut md = Vec::new();
        metadata::encode(rep_bits, &local, Layout::ReportV2, &mut md);
        let congested = self.congested(hop, n);
        let mut p = Vec::with_capacity(16 + md.len() + inner.len());
        let node = local.node_id.unwrap_or(0);
        let seq = self.next_seq(hop) & 0x003f_ffff;
        p.extend_from_slice(&((2u32 << 28) | seq).to_be_bytes());
        p.extend_from_slice(&node.to_be_bytes());
        let rep_len = (8 + md.len() + inner.len()).div_ceil(4);
        let flags = (u8::from(dropped) << 7) | (u8::from(congested) << 6) | 0x20;
        p.extend_from_slice(&[0x14, rep_len as u8, (md.len() / 4) as u8, flags]);
        p.extend_from_slice(&rep_bits.to_be_bytes());
        p.extend_from_slice(&[0; 6]);
        p.extend(md);
        p.extend(inner);
        p.resize(8 + 4 + rep_len * 4, 0);
        p
    }

    fn v10_report(&mut self, flow: u32, hops: &[HopMetadata], dropped: bool, last: usize) -> Vec<u8> {
        // INT v1.0 items are 4 bytes (32-bit timestamps); bit 15 has no v1 meaning here.
        let bitmap = self.cfg.bitmap & 0xff00;
        let hop_ml = (metadata::baseline_len(bitmap, Layout::IntV1) / 4) as u8;
        let mut stack = Vec::new();
        for h in hops.iter().rev() {
            metadata::encode(bitmap, h, Layout::IntV1, &mut stack);
        }
        let mut int = vec![0x01, 0, (3 + stack.len() / 4) as u8, 0x17 << 2];
        int.extend_from_slice(&[0x10, 0, hop_ml, (8 - hops.len().min(8)) as u8]);
        int.extend_from_slice(&bitmap.to_be_bytes());
        int.extend_from_slice(&[0, 0]);
        int.extend(stack);
        let k = self.flow_key(flow);
        let inner = self.inner_udp(flow, 0x17, &int, k.dst_port);
        let node = hops[last].node_id.unwrap_or(0);
        let seq = self.next_seq(last);
        let mut p = vec![0x14, 0, (u8::from(dropped) << 2) | 0x01, 0];
        p.extend_from_slice(&node.to_be_bytes());
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(&(hops[last].ingress_timestamp.unwrap_or(0) as u32).to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 1, 0x08, 0x00]);
        p.extend(inner);
        p
    }

    fn v05_report(&mut self, flow: u32, h: &HopMetadata, dropped: bool, hop: usize, n: u64) -> Vec<u8> {
        let congested = self.congested(hop, n);
        let seq = self.next_seq(hop);
        let ig = h.ingress_timestamp.unwrap_or(0) as u32;
        let nproto = if dropped { 1 } else { 2 };
        let flags = (u8::from(dropped) << 7) | (u8::from(congested) << 6) | 0x20;
        let mut p = vec![nproto, flags, 0, 0];
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(&ig.to_be_bytes());
        p.extend_from_slice(&h.node_id.unwrap_or(0).to_be_bytes());
        p.extend_from_slice(&h.l1_ingress_port.unwrap_or(0).to_be_bytes());
        p.extend_from_slice(&h.l1_egress_port.unwrap_or(0).to_be_bytes());
        if dropped {
            p.extend_from_slice(&[h.queue_id.unwrap_or(0), self.cfg.drop_reason, 0, 0]);
        } else {
            let q = (u32::from(h.queue_id.unwrap_or(0)) << 24) | h.queue_occupancy.unwrap_or(0);
            p.extend_from_slice(&q.to_be_bytes());
            p.extend_from_slice(&ig.wrapping_add(h.hop_latency.unwrap_or(0)).to_be_bytes());
        }
        p.extend_from_slice(&[0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 1, 0x08, 0x00]);
        let k = self.flow_key(flow);
        p.extend(self.inner_udp(flow, 0, &[], k.dst_port));
        p
    }
}
