//! Per-flow and per-hop state, and the event rules that decide what leaves the collector.
//!
//! Rules (docs/int-collector.md "Event rules"):
//! * NEW_FLOW: first report of an unknown flow (INT-MD: at once; per-hop reports, where the
//!   path is assembled from several switches, after `settle` so the whole path is known).
//! * PATH_CHANGE: the switch ids of an INT-MD stack differ from the known path; for per-hop
//!   reports, a switch not on the known path reports the flow after it settled.
//! * LATENCY_CHANGE / QUEUE_CHANGE: a hop's value, quantised (fabric-tna style buckets, e.g.
//!   256 ns), moved from the last exported value by at least the absolute AND the relative
//!   threshold.
//! * Congestion (IntQueueRecord congested=true/false): per (switch, egress port, queue) with
//!   hysteresis: on when occupancy >= `congestion_on` or the report's Q flag is set for the
//!   reporting switch's queue, off when occupancy < `congestion_off` and Q is clear.
//! * Drops (IntDropRecord): the first drop of (flow, switch, reason) at once, then counts
//!   folded and flushed at most once per summary interval.
//! * PERIODIC: each flow with reports since its last record, every `summary_interval`.
//!   Flows idle for `flow_timeout` are forgotten.

use crate::parse::metadata::{CompactHop, HAS_LATENCY, HAS_QUEUE, HAS_TX_UTIL};
use crate::parse::{FlowKey, HopMetadata, Report};
use cgloop_proto::v1::{
    int_record, FiveTuple, IntDropRecord, IntEventReason, IntFlowRecord, IntHop, IntQueueRecord,
    IntRecord, RecordHeader,
};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

pub const MAX_HOPS: usize = 16;
/// Hop slots kept inside a flow's state; a longer path moves all its slots to the heap (one
/// allocation per flow). Measured (bench/int-collector/README.md): 4 inline beats 6 by ~1.2x
/// on 4-hop paths and is no slower on 6-hop paths (spilled) than 6 inline.
const INLINE_HOPS: usize = 4;

/// Thresholds of the event rules (CLI flags of `cgloop-int-collector run`).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct EventConfig {
    pub latency_quantum_ns: u32,
    pub latency_abs_ns: u32,
    pub latency_rel: f64,
    pub queue_quantum_cells: u32,
    pub queue_abs_cells: u32,
    pub queue_rel: f64,
    pub congestion_on_cells: u32,
    pub congestion_off_cells: u32,
    pub summary_interval_ns: u64,
    pub flow_timeout_ns: u64,
    pub settle_ns: u64,
    /// Raw egress TX utilization equal to 100 % (device-defined unit).
    pub tx_util_full_scale: u32,
    /// Also emit one IntHopRecord per hop with every flow record.
    pub hop_records: bool,
}

impl Default for EventConfig {
    fn default() -> Self {
        EventConfig {
            latency_quantum_ns: 256,
            latency_abs_ns: 1_024,
            latency_rel: 0.25,
            queue_quantum_cells: 16,
            queue_abs_cells: 256,
            queue_rel: 0.25,
            congestion_on_cells: 4_096,
            congestion_off_cells: 1_024,
            summary_interval_ns: 1_000_000_000,
            flow_timeout_ns: 10_000_000_000,
            settle_ns: 50_000_000,
            tx_util_full_scale: 10_000,
            hop_records: false,
        }
    }
}

/// One hop's latest metadata, compact, decoded straight from the stack by the parser's plan.
type Md = CompactHop;

/// Per-hop values the event rules compare on every report (24 B): switch id (the path), the
/// latest latency and queue occupancy, the quantised values last exported (the change
/// baseline; `EXP_*` bits of `has` say whether a baseline exists).
#[derive(Debug, Clone, Copy, Default)]
struct HotHop {
    node: u32,
    latency: u32,
    queue_occ: u32,
    exported_latency: u32,
    exported_queue: u32,
    has: u8,
}

/// The rest of a hop's latest metadata (40 B): written per report, read when a record leaves.
#[derive(Debug, Clone, Copy, Default)]
struct ColdHop {
    ingress_ts: u64,
    egress_ts: u64,
    tx_util: u32,
    l2_ingress_port: u32,
    l2_egress_port: u32,
    buffer_occ: u32,
    ingress_port: u16,
    egress_port: u16,
    queue_id: u8,
    buffer_id: u8,
}

impl ColdHop {
    #[inline]
    fn of(md: &Md) -> ColdHop {
        ColdHop {
            ingress_ts: md.ingress_ts,
            egress_ts: md.egress_ts,
            tx_util: md.tx_util,
            l2_ingress_port: md.l2_ingress_port,
            l2_egress_port: md.l2_egress_port,
            buffer_occ: md.buffer_occ,
            ingress_port: md.ingress_port,
            egress_port: md.egress_port,
            queue_id: md.queue_id,
            buffer_id: md.buffer_id,
        }
    }
}

const EXP_LATENCY: u8 = 0x40;
const EXP_QUEUE: u8 = 0x80;

impl HotHop {
    /// A hop first seen: its values, no baseline yet.
    #[inline]
    fn fresh(md: &Md) -> HotHop {
        HotHop {
            node: md.node,
            latency: md.latency,
            queue_occ: md.queue_occ,
            exported_latency: 0,
            exported_queue: 0,
            has: md.has & !(EXP_LATENCY | EXP_QUEUE),
        }
    }
    /// New latest values, keeping the exported baseline.
    #[inline]
    fn update(&mut self, md: &Md) {
        let exp = self.has & (EXP_LATENCY | EXP_QUEUE);
        self.node = md.node;
        self.latency = md.latency;
        self.queue_occ = md.queue_occ;
        self.has = (md.has & !(EXP_LATENCY | EXP_QUEUE)) | exp;
    }
    #[inline]
    fn exported_latency(&self) -> Option<u32> {
        (self.has & EXP_LATENCY != 0).then_some(self.exported_latency)
    }
    #[inline]
    fn exported_queue(&self) -> Option<u32> {
        (self.has & EXP_QUEUE != 0).then_some(self.exported_queue)
    }
    /// The current values become the baseline.
    #[inline]
    fn set_baseline(&mut self, lq: u32, qq: u32) {
        self.has &= !(EXP_LATENCY | EXP_QUEUE);
        if self.has & HAS_LATENCY != 0 {
            self.exported_latency = quantise(self.latency, lq);
            self.has |= EXP_LATENCY;
        }
        if self.has & HAS_QUEUE != 0 {
            self.exported_queue = quantise(self.queue_occ, qq);
            self.has |= EXP_QUEUE;
        }
    }
}

/// Per-flow state: the header every report touches, then one 64-byte slot per hop (the path
/// is their switch ids, no separate array). A report of a 4-hop flow touches ~5 cache lines,
/// contiguous (the profile's top cost is the first touch of a flow's state: 10 000 flows do
/// not fit the cache; see bench/int-collector/README.md).
#[derive(Debug, Clone)]
#[repr(C)]
struct FlowState {
    first_seen_ns: u64,
    last_seen_ns: u64,
    last_export_ns: u64,
    reports: u32,
    last_seq: u32,
    reporter: u32,
    /// Per-hop (postcard/MX/v0.5) flows are announced after `settle`.
    announced: bool,
    stacked: bool,
    /// The path's hops, source first: inline up to INLINE_HOPS (a flow's state is ~0.3 KB,
    /// was 1.1 KB with 16 inline slots: 10 000 flows then outgrow the cache and TLB reach),
    /// on the heap beyond, at most MAX_HOPS.
    hops: SmallVec<[HopSlot; INLINE_HOPS]>,
}

/// One hop of a flow: 64 bytes, a cache line's worth, the hop slots of a flow contiguous
/// after its header so the hardware prefetcher follows them.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
struct HopSlot {
    hot: HotHop,
    cold: ColdHop,
}

impl FlowState {
    #[inline]
    fn len(&self) -> usize {
        self.hops.len()
    }
    #[inline]
    fn push_hop(&mut self, md: &Md) {
        self.hops.push(HopSlot { hot: HotHop::fresh(md), cold: ColdHop::of(md) });
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct QueueKey {
    switch: u32,
    port: u16,
    queue: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct DropKey {
    flow: FlowKey,
    switch: u32,
    reason: u8,
}

#[derive(Debug, Clone, Copy, Default)]
struct DropState {
    pending: u64,
    last_export_ns: u64,
    md: HopMetadata,
}

/// Counters of one worker (summed for `stats`).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Counters {
    pub reports: u64,
    pub records: u64,
    pub flows: u64,
    pub flows_expired: u64,
}

/// State of one worker: flows, queues and drops, plus its record sequence.
pub struct State {
    cfg: EventConfig,
    source_id: String,
    sequence: u64,
    flows: FxHashMap<FlowKey, FlowState>,
    /// Queues currently congested (only those are kept).
    queues: FxHashMap<QueueKey, bool>,
    congested_queues: usize,
    drops: FxHashMap<DropKey, DropState>,
    pub counters: Counters,
}

fn quantise(v: u32, q: u32) -> u32 {
    if q <= 1 { v } else { v - v % q }
}

/// Beyond both thresholds (absolute AND relative to the old value)?
fn changed(old: Option<u32>, new: u32, abs: u32, rel: f64) -> bool {
    match old {
        None => false,
        Some(old) => {
            let d = old.abs_diff(new);
            d > 0 && d >= abs && f64::from(d) >= rel * f64::from(old.max(1))
        }
    }
}

impl State {
    pub fn new(cfg: EventConfig, source_id: impl Into<String>) -> Self {
        State {
            cfg,
            source_id: source_id.into(),
            sequence: 0,
            flows: FxHashMap::default(),
            queues: FxHashMap::default(),
            congested_queues: 0,
            drops: FxHashMap::default(),
            counters: Counters::default(),
        }
    }

    pub fn flow_count(&self) -> usize {
        self.flows.len()
    }

    fn header(&mut self, ts: u64) -> Option<RecordHeader> {
        self.sequence += 1;
        self.counters.records += 1;
        Some(RecordHeader {
            schema_version: cgloop_proto::SCHEMA_VERSION,
            source_id: self.source_id.clone(),
            sequence: self.sequence,
            timestamp_ns: ts,
        })
    }

    /// Fold one report into the state; records to export are appended to `out`.
    pub fn ingest(&mut self, r: &Report<'_>, now_ns: u64, out: &mut Vec<IntRecord>) {
        self.counters.reports += 1;
        // Hops in path order (source first): the embedded INT-MD stack (newest first on the
        // wire, INT v2.1 §5.7), then the reporting node's own metadata unless it is already the
        // top of the stack (sink option 1 vs 2 of INT v2.1 §5.7).
        // Stack hops are written backwards from the end of `buf` (so path order needs no second
        // pass), the reporter's own metadata goes into the last slot.
        let mut buf = [Md::default(); MAX_HOPS + 1];
        let mut start = MAX_HOPS;
        let mut stacked = false;
        if let Some(int) = &r.inner.int {
            for md in int.compact_hops().take(MAX_HOPS) {
                start -= 1;
                buf[start] = md;
            }
            stacked = start < MAX_HOPS;
        }
        let mut end = MAX_HOPS;
        if let Some(local) = &r.local {
            let dup = stacked && buf[MAX_HOPS - 1].node() == local.node_id;
            if !dup {
                buf[MAX_HOPS] = Md::from_metadata(local);
                end += 1;
            }
        }
        // Longer paths than MAX_HOPS keep their newest MAX_HOPS hops (found by fuzzing: a full
        // 16-hop stack plus the reporter's own metadata).
        let hops = &buf[start.max(end.saturating_sub(MAX_HOPS))..end];
        self.queue_events(r, hops, now_ns, out);
        let Some(flow) = r.inner.flow else { return };
        if r.dropped {
            // A drop report's stack ends where the packet died: not the flow's path.
            self.drop_event(r, flow, now_ns, out);
            return;
        }
        if !hops.is_empty() {
            self.flow_events(r, flow, hops, stacked, now_ns, out);
        }
    }

    fn queue_events(&mut self, r: &Report<'_>, hops: &[Md], now: u64, out: &mut Vec<IntRecord>) {
        for h in hops {
            let Some(switch) = h.node() else { continue };
            let is_reporter = switch == r.node_id && r.local.is_some();
            let q_flag = is_reporter && r.congested;
            if h.has & HAS_QUEUE == 0 && !q_flag {
                continue;
            }
            let occ_v = h.queue_occ;
            // Steady state: nothing congested anywhere and this queue below the threshold.
            if self.congested_queues == 0 && !q_flag && occ_v < self.cfg.congestion_on_cells {
                continue;
            }
            let key = QueueKey { switch, port: h.egress_port, queue: h.queue_id };
            let was = self.queues.get(&key).copied().unwrap_or(false);
            let now_congested = if was {
                q_flag || occ_v >= self.cfg.congestion_off_cells
            } else {
                q_flag || occ_v >= self.cfg.congestion_on_cells
            };
            if now_congested != was {
                if now_congested {
                    self.queues.insert(key, true);
                    self.congested_queues += 1;
                } else {
                    self.queues.remove(&key);
                    self.congested_queues -= 1;
                }
                let rec = IntQueueRecord {
                    header: self.header(now),
                    switch_id: switch,
                    egress_port: u32::from(key.port),
                    queue_id: u32::from(key.queue),
                    queue_occupancy_cells: occ_v,
                    queue_latency_ns: u64::from(h.latency),
                    congested: now_congested,
                    egress_tx_utilization: tx_util(h, self.cfg.tx_util_full_scale),
                };
                out.push(IntRecord { record: Some(int_record::Record::Queue(rec)) });
            }
        }
    }

    fn drop_event(&mut self, r: &Report<'_>, flow: FlowKey, now: u64, out: &mut Vec<IntRecord>) {
        let md = r.local.unwrap_or_default();
        let key = DropKey { flow, switch: r.node_id, reason: md.drop_reason.unwrap_or(0) };
        let interval = self.cfg.summary_interval_ns;
        let d = self.drops.entry(key).or_default();
        d.pending += 1;
        d.md = md;
        let first = d.last_export_ns == 0;
        if first || now.saturating_sub(d.last_export_ns) >= interval {
            let count = std::mem::take(&mut d.pending);
            d.last_export_ns = now.max(1);
            self.push_drop(key, md, count, now, out);
        }
    }

    fn push_drop(&mut self, key: DropKey, md: HopMetadata, count: u64, now: u64, out: &mut Vec<IntRecord>) {
        let rec = IntDropRecord {
            header: self.header(now),
            switch_id: key.switch,
            ingress_port: u32::from(md.l1_ingress_port.unwrap_or(0)),
            egress_port: u32::from(md.l1_egress_port.unwrap_or(0)),
            queue_id: u32::from(md.queue_id.unwrap_or(0)),
            drop_reason: u32::from(key.reason),
            drop_count: count,
            five_tuple: Some(five_tuple(&key.flow)),
        };
        out.push(IntRecord { record: Some(int_record::Record::Drop(rec)) });
    }

    fn flow_events(&mut self, r: &Report<'_>, key: FlowKey, hops: &[Md], stacked: bool, now: u64, out: &mut Vec<IntRecord>) {
        let cfg = self.cfg;
        let mut reason = None;
        let mut is_new = false;
        let fs = match self.flows.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                self.counters.flows += 1;
                is_new = true;
                e.insert(FlowState {
                    first_seen_ns: now,
                    last_seen_ns: now,
                    last_export_ns: now,
                    reports: 0,
                    last_seq: 0,
                    reporter: r.node_id,
                    announced: stacked,
                    stacked,
                    hops: SmallVec::new(),
                })
            }
        };
        fs.reports = fs.reports.saturating_add(1);
        fs.last_seen_ns = now;
        fs.last_seq = r.sequence;
        fs.reporter = r.node_id;
        if stacked {
            fs.stacked = true;
            let same = fs.len() == hops.len() && hops.iter().zip(&fs.hops[..fs.len()]).all(|(h, p)| h.node == p.hot.node);
            if !same {
                // `hops` holds at most MAX_HOPS (= 16) entries.
                fs.hops.clear();
                for h in hops {
                    fs.push_hop(h);
                }
                reason = Some(if is_new { IntEventReason::NewFlow } else { IntEventReason::PathChange });
                fs.announced = true;
            }
        } else {
            // Per-hop report: find (or append) its switch on the flow's path.
            let h = &hops[hops.len() - 1];
            let id = h.node;
            let n = fs.len();
            if !fs.hops[..n].iter().any(|p| p.hot.node == id) && n < MAX_HOPS {
                fs.push_hop(h);
                if fs.announced {
                    reason = Some(IntEventReason::PathChange);
                }
            }
        }
        // Hop values: update, and compare quantised values with the exported baseline.
        let lq = cfg.latency_quantum_ns;
        let qq = cfg.queue_quantum_cells;
        let n = fs.len();
        for (j, h) in hops.iter().enumerate() {
            // A stack is the path itself; a per-hop report is found by its switch id.
            let i = if stacked {
                j
            } else {
                match fs.hops[..n].iter().position(|p| Some(p.hot.node) == h.node()) {
                    Some(i) => i,
                    None => continue,
                }
            };
            fs.hops[i].cold = ColdHop::of(h);
            let st = &mut fs.hops[i].hot;
            st.update(h);
            if reason.is_some() {
                continue;
            }
            if let Some(l) = h.latency() {
                if changed(st.exported_latency(), quantise(l, lq), cfg.latency_abs_ns, cfg.latency_rel) {
                    reason = Some(IntEventReason::LatencyChange);
                }
            }
            if let Some(q) = h.queue() {
                if reason.is_none() && changed(st.exported_queue(), quantise(q, qq), cfg.queue_abs_cells, cfg.queue_rel) {
                    reason = Some(IntEventReason::QueueChange);
                }
            }
        }
        if !fs.announced {
            if now.saturating_sub(fs.first_seen_ns) >= cfg.settle_ns {
                fs.announced = true;
                reason = Some(IntEventReason::NewFlow);
            } else {
                // Baselines start from the first values seen.
                for st in &mut fs.hops[..n] {
                    st.hot.set_baseline(lq, qq);
                }
            }
        }
        if let Some(reason) = reason {
            let rec = self.flow_record(key, reason, now, out);
            out.extend(rec);
        }
    }

    /// The flow's record (and its hop records, pushed to `out` first); the current values
    /// become the change baseline.
    fn flow_record(&mut self, key: FlowKey, reason: IntEventReason, now: u64, out: &mut Vec<IntRecord>) -> Option<IntRecord> {
        let lq = self.cfg.latency_quantum_ns;
        let qq = self.cfg.queue_quantum_cells;
        let full = self.cfg.tx_util_full_scale;
        let hop_records = self.cfg.hop_records;
        let len = self.flows.get(&key)?.len();
        let header = self.header(now);
        let hop_headers: Vec<_> = if hop_records { (0..len).map(|_| self.header(now)).collect() } else { Vec::new() };
        let fs = self.flows.get_mut(&key)?;
        for st in &mut fs.hops[..len] {
            st.hot.set_baseline(lq, qq);
        }
        fs.last_export_ns = now;
        let hops: Vec<IntHop> = fs.hops[..len].iter().map(|h| int_hop(&h.hot, &h.cold, full)).collect();
        let e2e = end_to_end(&fs.hops[..len], fs.stacked);
        let tuple = five_tuple(&key);
        for (i, (h, header)) in hops.iter().zip(hop_headers).enumerate() {
            let rec = cgloop_proto::v1::IntHopRecord { header, five_tuple: Some(tuple.clone()), hop_index: i as u32, hop: Some(*h) };
            out.push(IntRecord { record: Some(int_record::Record::Hop(rec)) });
        }
        let rec = IntFlowRecord {
            header,
            five_tuple: Some(tuple),
            path_switch_ids: fs.hops[..len].iter().map(|h| h.hot.node).collect(),
            hops,
            end_to_end_latency_ns: e2e,
            reason: reason as i32,
            report_sequence: fs.last_seq,
            reporter_switch_id: fs.reporter,
            report_count: fs.reports,
        };
        fs.reports = 0;
        Some(IntRecord { record: Some(int_record::Record::Flow(rec)) })
    }

    /// Time-driven rules: periodic summaries, settling per-hop flows, drop flushes, expiry.
    pub fn tick(&mut self, now: u64, out: &mut Vec<IntRecord>) {
        let interval = self.cfg.summary_interval_ns;
        let timeout = self.cfg.flow_timeout_ns;
        let settle = self.cfg.settle_ns;
        let mut due: Vec<(FlowKey, IntEventReason)> = Vec::new();
        let mut expired = 0u64;
        self.flows.retain(|k, fs| {
            if now.saturating_sub(fs.last_seen_ns) >= timeout {
                expired += 1;
                return false;
            }
            if !fs.announced && now.saturating_sub(fs.first_seen_ns) >= settle {
                fs.announced = true;
                due.push((*k, IntEventReason::NewFlow));
            } else if fs.announced && fs.reports > 0 && now.saturating_sub(fs.last_export_ns) >= interval {
                due.push((*k, IntEventReason::Periodic));
            }
            true
        });
        self.counters.flows_expired += expired;
        for (k, reason) in due {
            let rec = self.flow_record(k, reason, now, out);
            out.extend(rec);
        }
        let mut flush = Vec::new();
        self.drops.retain(|k, d| {
            if d.pending > 0 && now.saturating_sub(d.last_export_ns) >= interval {
                flush.push((*k, d.md, std::mem::take(&mut d.pending)));
                d.last_export_ns = now;
            }
            now.saturating_sub(d.last_export_ns) < timeout
        });
        for (k, md, count) in flush {
            self.push_drop(k, md, count, now, out);
        }
    }

}

fn tx_util(h: &Md, full: u32) -> f64 {
    tx_util_of(h.has, h.tx_util, full)
}

fn tx_util_of(has: u8, raw: u32, full: u32) -> f64 {
    if has & HAS_TX_UTIL == 0 {
        return 0.0;
    }
    f64::from(raw) / f64::from(full.max(1))
}

fn int_hop(h: &HotHop, c: &ColdHop, full: u32) -> IntHop {
    IntHop {
        switch_id: h.node,
        ingress_port: u32::from(c.ingress_port),
        egress_port: u32::from(c.egress_port),
        hop_latency_ns: u64::from(h.latency),
        queue_id: u32::from(c.queue_id),
        queue_occupancy_cells: h.queue_occ,
        egress_tx_utilization: tx_util_of(h.has, c.tx_util, full),
        ingress_timestamp_ns: c.ingress_ts,
        egress_timestamp_ns: c.egress_ts,
        l2_ingress_port: c.l2_ingress_port,
        l2_egress_port: c.l2_egress_port,
        buffer_id: u32::from(c.buffer_id),
        buffer_occupancy_cells: c.buffer_occ,
        egress_tx_utilization_raw: c.tx_util,
    }
}

/// Source ingress to sink egress when one packet's stack carried both 64-bit timestamps and
/// they are ordered; otherwise (32-bit timestamps, or per-hop reports of different packets) the
/// sum of hop latencies (switch clocks need not be synchronised). An absent timestamp is 0,
/// which the 64-bit check below rejects.
fn end_to_end(hops: &[HopSlot], stacked: bool) -> u64 {
    let first = hops.first().map(|h| h.cold.ingress_ts).filter(|_| stacked);
    let last = hops.last().map(|h| h.cold.egress_ts);
    match (first, last) {
        (Some(a), Some(b)) if b > a && a > u64::from(u32::MAX) => b - a,
        _ => hops.iter().map(|h| u64::from(h.hot.latency)).sum(),
    }
}

pub fn five_tuple(k: &FlowKey) -> FiveTuple {
    FiveTuple {
        src_addr: k.src_addr().to_vec(),
        dst_addr: k.dst_addr().to_vec(),
        src_port: u32::from(k.src_port),
        dst_port: u32::from(k.dst_port),
        ip_protocol: u32::from(k.proto),
    }
}
