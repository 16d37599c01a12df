//! Per-hop INT metadata selected by a 16-bit instruction bitmap (bit 0 is the MSB).
//!
//! The same bitmap shape appears in three places with small differences, captured by
//! [`Layout`]:
//! * INT v2.1 §5.7 "INT-MD Metadata Header Format", *Instruction Bitmap* (also §5.8 INT-MX):
//!   bit 0 node id, bits 4-6 are 8 bytes, bit 15 checksum complement.
//! * Telemetry Report v2.0 §3.3.1 "Individual Report Main Contents for RepType 1 (INT)",
//!   *RepMdBits*: bit 0 reserved (node id is in the group header), bits 4-6 are 8 bytes,
//!   bit 15 is Queue ID (8) + Drop Reason (8) + padding (16).
//! * INT v1.0 (stack inside v1.0 reports): every item is 4 bytes (32-bit timestamps) except
//!   bit 6 (two 32-bit level-2 interface ids).
//!
//! INT v2.1 §5.7: a hop that cannot provide an item writes the all-ones value (4 or 8 bytes of
//! 0xFF); such items decode as `None` ("unavailable"), never as a number.

use super::wire::{take, ParseError, Result};

/// Which specification's bit meanings and item sizes apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// INT v2.1 §5.7 instruction bitmap (metadata stack of INT-MD).
    IntV2,
    /// Telemetry Report v2.0 §3.3.1 RepMdBits (a node's own metadata in a report).
    ReportV2,
    /// INT v1.0 instruction bitmap (metadata stack inside v1.0 reports).
    IntV1,
}

/// One node's metadata. `None` = not requested, or requested but all-ones (unavailable).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HopMetadata {
    /// bit 0: Node ID (32b). In reports it comes from the group header instead.
    pub node_id: Option<u32>,
    /// bit 1: Level 1 Ingress Interface ID (16b) + Egress Interface ID (16b).
    pub l1_ingress_port: Option<u16>,
    pub l1_egress_port: Option<u16>,
    /// bit 2: Hop latency (32b, device units; ns on the pipelines cgloop knows).
    pub hop_latency: Option<u32>,
    /// bit 3: Queue ID (8b) + Queue occupancy (24b).
    pub queue_id: Option<u8>,
    pub queue_occupancy: Option<u32>,
    /// bit 4: Ingress timestamp (64b in v2.x, 32b in v1.0).
    pub ingress_timestamp: Option<u64>,
    /// bit 5: Egress timestamp (64b in v2.x, 32b in v1.0).
    pub egress_timestamp: Option<u64>,
    /// bit 6: Level 2 Ingress Interface ID (32b) + Egress Interface ID (32b).
    pub l2_ingress_port: Option<u32>,
    pub l2_egress_port: Option<u32>,
    /// bit 7: Egress interface TX utilization (32b, device units).
    pub egress_tx_util: Option<u32>,
    /// bit 8: Buffer ID (8b) + Buffer occupancy (24b).
    pub buffer_id: Option<u8>,
    pub buffer_occupancy: Option<u32>,
    /// RepMdBits bit 15 (Report v2.0 §3.3.1): Queue ID (8b) + Drop Reason (8b) + pad (16b).
    pub drop_reason: Option<u8>,
    /// Instruction bit 15 (INT v2.1 §5.7): Checksum Complement (32b).
    pub checksum_complement: Option<u32>,
}

const ALL_ONES_32: u32 = u32::MAX;

/// Bytes one node writes for `bitmap` under `layout` (baseline items only): 4 bytes per set
/// bit, plus 4 more for each 8-byte item (see `item_len`). Popcounts: this runs per hop.
#[inline]
pub fn baseline_len(bitmap: u16, layout: Layout) -> usize {
    let wide = match layout {
        Layout::IntV2 | Layout::ReportV2 => 0x0e00, // bits 4, 5, 6
        Layout::IntV1 => 0x0200,                    // bit 6
    };
    4 * (bitmap.count_ones() + (bitmap & wide).count_ones()) as usize
}

fn item_len(bit: u32, layout: Layout) -> usize {
    match (layout, bit) {
        (Layout::IntV2 | Layout::ReportV2, 4..=6) => 8,
        (Layout::IntV1, 6) => 8,
        // Reserved bits still occupy one 4-byte word each (INT v2.1 §5.7: "Each instruction bit
        // that is set requests 4 bytes ... except for bits 4-6").
        _ => 4,
    }
}

/// Decode one node's baseline metadata from the front of `buf`; returns it and the bytes used.
pub fn decode(bitmap: u16, buf: &[u8], layout: Layout) -> Result<(HopMetadata, usize)> {
    let plan = Plan::new(bitmap, layout);
    Ok((plan.decode(buf)?, plan.size()))
}

const ABSENT: u8 = 0xff;

/// Where each item of one bitmap sits in a node's metadata, computed once per stack (every hop
/// of an INT-MD stack has the same layout), so decoding a hop is straight-line loads instead
/// of a loop with a jump table per item (the collector's hottest function before).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Byte offset of each bit's item, ABSENT when the bit is clear. At most 16 items of 4
    /// bytes plus 3 of 8, so offsets fit in a byte.
    off: [u8; 16],
    len: u8,
    layout: Layout,
}

impl Plan {
    pub fn new(bitmap: u16, layout: Layout) -> Plan {
        let mut off = [ABSENT; 16];
        let mut at = 0u32;
        for bit in 0..16u32 {
            if bitmap & (0x8000 >> bit) != 0 {
                off[bit as usize] = at as u8;
                at += item_len(bit, layout) as u32;
            }
        }
        Plan { off, len: at as u8, layout }
    }

    /// Bytes one node writes (`baseline_len`).
    #[inline]
    pub fn size(&self) -> usize {
        usize::from(self.len)
    }

    /// One node's metadata from the front of `buf`.
    #[inline]
    pub fn decode(&self, buf: &[u8]) -> Result<HopMetadata> {
        let body = take(buf, 0, self.size(), "metadata")?;
        // The word at `bit`'s offset (+ `plus`), None if the bit is clear or the value is
        // all-ones ("unavailable", INT v2.1 §5.7).
        let word = |bit: usize, plus: usize| -> Option<u32> {
            let o = self.off[bit];
            if o == ABSENT {
                return None;
            }
            let w = be32(body, usize::from(o) + plus);
            (w != ALL_ONES_32).then_some(w)
        };
        let present = |bit: usize| self.off[bit] != ABSENT;
        let mut md = HopMetadata::default();
        if self.layout != Layout::ReportV2 {
            md.node_id = word(0, 0);
        }
        if let Some(w) = word(1, 0) {
            md.l1_ingress_port = Some((w >> 16) as u16);
            md.l1_egress_port = Some(w as u16);
        }
        md.hop_latency = word(2, 0);
        if let Some(w) = word(3, 0) {
            md.queue_id = Some((w >> 24) as u8);
            md.queue_occupancy = Some(w & 0x00ff_ffff);
        }
        if self.layout == Layout::IntV1 {
            // v1.0: 32-bit timestamps.
            md.ingress_timestamp = word(4, 0).map(u64::from);
            md.egress_timestamp = word(5, 0).map(u64::from);
        } else {
            let ts = |bit: usize| -> Option<u64> {
                if !present(bit) {
                    return None;
                }
                let o = usize::from(self.off[bit]);
                let v = (u64::from(be32(body, o)) << 32) | u64::from(be32(body, o + 4));
                (v != u64::MAX).then_some(v)
            };
            md.ingress_timestamp = ts(4);
            md.egress_timestamp = ts(5);
        }
        // bit 6: two 32-bit level-2 interface ids, each all-ones on its own (both layouts).
        md.l2_ingress_port = word(6, 0);
        md.l2_egress_port = word(6, 4);
        md.egress_tx_util = word(7, 0);
        if let Some(w) = word(8, 0) {
            md.buffer_id = Some((w >> 24) as u8);
            md.buffer_occupancy = Some(w & 0x00ff_ffff);
        }
        // Bits 9-14 are reserved: their words are skipped.
        if let Some(w) = word(15, 0) {
            if self.layout == Layout::ReportV2 {
                // Queue ID (8) + Drop Reason (8) + Padding (16); the queue id may also come
                // from bit 3, which wins when both are present.
                md.queue_id = md.queue_id.or(Some((w >> 24) as u8));
                md.drop_reason = Some((w >> 16) as u8);
            } else {
                md.checksum_complement = Some(w);
            }
        }
        Ok(md)
    }
}

/// The values the collector's state keeps of one hop: absent values are 0 (what a record
/// carries for them anyway) plus presence bits for those the event rules must tell apart from
/// 0. 56 bytes instead of [`HopMetadata`]'s ~120.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactHop {
    pub ingress_ts: u64,
    pub egress_ts: u64,
    pub node: u32,
    pub latency: u32,
    pub queue_occ: u32,
    pub tx_util: u32,
    /// Bit 6: level-2 interface ids.
    pub l2_ingress_port: u32,
    pub l2_egress_port: u32,
    /// Bit 8: buffer occupancy (24 bits) and buffer id.
    pub buffer_occ: u32,
    pub ingress_port: u16,
    pub egress_port: u16,
    pub queue_id: u8,
    pub buffer_id: u8,
    /// HAS_* bits (the state uses the two high bits for its own baseline flags).
    pub has: u8,
}

pub const HAS_NODE: u8 = 1;
pub const HAS_LATENCY: u8 = 2;
pub const HAS_QUEUE: u8 = 4;
pub const HAS_TX_UTIL: u8 = 8;

impl CompactHop {
    pub fn from_metadata(h: &HopMetadata) -> CompactHop {
        let bit = |o: bool, b: u8| if o { b } else { 0 };
        CompactHop {
            ingress_ts: h.ingress_timestamp.unwrap_or(0),
            egress_ts: h.egress_timestamp.unwrap_or(0),
            node: h.node_id.unwrap_or(0),
            latency: h.hop_latency.unwrap_or(0),
            queue_occ: h.queue_occupancy.unwrap_or(0),
            tx_util: h.egress_tx_util.unwrap_or(0),
            ingress_port: h.l1_ingress_port.unwrap_or(0),
            egress_port: h.l1_egress_port.unwrap_or(0),
            queue_id: h.queue_id.unwrap_or(0),
            l2_ingress_port: h.l2_ingress_port.unwrap_or(0),
            l2_egress_port: h.l2_egress_port.unwrap_or(0),
            buffer_occ: h.buffer_occupancy.unwrap_or(0),
            buffer_id: h.buffer_id.unwrap_or(0),
            has: bit(h.node_id.is_some(), HAS_NODE)
                | bit(h.hop_latency.is_some(), HAS_LATENCY)
                | bit(h.queue_occupancy.is_some(), HAS_QUEUE)
                | bit(h.egress_tx_util.is_some(), HAS_TX_UTIL),
        }
    }
    #[inline]
    pub fn node(&self) -> Option<u32> {
        (self.has & HAS_NODE != 0).then_some(self.node)
    }
    #[inline]
    pub fn latency(&self) -> Option<u32> {
        (self.has & HAS_LATENCY != 0).then_some(self.latency)
    }
    #[inline]
    pub fn queue(&self) -> Option<u32> {
        (self.has & HAS_QUEUE != 0).then_some(self.queue_occ)
    }
}

impl Plan {
    /// Only what [`CompactHop`] keeps, straight from the wire (the collector's per-hop path);
    /// equal to `CompactHop::from_metadata(&self.decode(buf)?)`.
    #[inline]
    pub fn decode_compact(&self, buf: &[u8]) -> Result<CompactHop> {
        let body = take(buf, 0, self.size(), "metadata")?;
        let word_at = |bit: usize, plus: usize| -> Option<u32> {
            let o = self.off[bit];
            if o == ABSENT {
                return None;
            }
            let w = be32(body, usize::from(o) + plus);
            (w != ALL_ONES_32).then_some(w)
        };
        let word = |bit: usize| word_at(bit, 0);
        let mut c = CompactHop::default();
        if self.layout != Layout::ReportV2 {
            if let Some(w) = word(0) {
                c.node = w;
                c.has |= HAS_NODE;
            }
        }
        if let Some(w) = word(1) {
            c.ingress_port = (w >> 16) as u16;
            c.egress_port = w as u16;
        }
        if let Some(w) = word(2) {
            c.latency = w;
            c.has |= HAS_LATENCY;
        }
        let queue = word(3);
        if let Some(w) = queue {
            c.queue_id = (w >> 24) as u8;
            c.queue_occ = w & 0x00ff_ffff;
            c.has |= HAS_QUEUE;
        }
        if self.layout == Layout::IntV1 {
            c.ingress_ts = word(4).map_or(0, u64::from);
            c.egress_ts = word(5).map_or(0, u64::from);
        } else {
            let ts = |bit: usize| -> u64 {
                let o = self.off[bit];
                if o == ABSENT {
                    return 0;
                }
                let o = usize::from(o);
                let v = (u64::from(be32(body, o)) << 32) | u64::from(be32(body, o + 4));
                if v == u64::MAX { 0 } else { v }
            };
            c.ingress_ts = ts(4);
            c.egress_ts = ts(5);
        }
        // Bit 6: two level-2 interface ids, each all-ones on its own.
        c.l2_ingress_port = word_at(6, 0).unwrap_or(0);
        c.l2_egress_port = word_at(6, 4).unwrap_or(0);
        if let Some(w) = word(7) {
            c.tx_util = w;
            c.has |= HAS_TX_UTIL;
        }
        if let Some(w) = word(8) {
            c.buffer_id = (w >> 24) as u8;
            c.buffer_occ = w & 0x00ff_ffff;
        }
        if self.layout == Layout::ReportV2 && queue.is_none() {
            // RepMdBits bit 15 carries a queue id too (bit 3 wins when both are present).
            if let Some(w) = word(15) {
                c.queue_id = (w >> 24) as u8;
            }
        }
        Ok(c)
    }
}

/// Big-endian word at `at`; all-ones ("unavailable") if out of range, which `decode`'s length
/// check rules out.
#[inline(always)]
fn be32(b: &[u8], at: usize) -> u32 {
    match b.get(at..at.wrapping_add(4)) {
        Some(&[w0, w1, w2, w3]) => u32::from_be_bytes([w0, w1, w2, w3]),
        _ => ALL_ONES_32,
    }
}

/// Encode `md` for `bitmap` (the generator's side of [`decode`]); `None` items become
/// all-ones, as a hop that cannot provide them writes (INT v2.1 §5.7).
pub fn encode(bitmap: u16, md: &HopMetadata, layout: Layout, out: &mut Vec<u8>) {
    let w32 = |v: Option<u32>| v.unwrap_or(ALL_ONES_32);
    for bit in 0..16u32 {
        if bitmap & (0x8000 >> bit) == 0 {
            continue;
        }
        match (bit, item_len(bit, layout)) {
            (4, 8) => out.extend_from_slice(&md.ingress_timestamp.unwrap_or(u64::MAX).to_be_bytes()),
            (5, 8) => out.extend_from_slice(&md.egress_timestamp.unwrap_or(u64::MAX).to_be_bytes()),
            (6, _) => {
                out.extend_from_slice(&w32(md.l2_ingress_port).to_be_bytes());
                out.extend_from_slice(&w32(md.l2_egress_port).to_be_bytes());
            }
            _ => {
                let w = match bit {
                    0 => w32(md.node_id),
                    1 => match (md.l1_ingress_port, md.l1_egress_port) {
                        (Some(i), Some(e)) => (u32::from(i) << 16) | u32::from(e),
                        _ => ALL_ONES_32,
                    },
                    2 => w32(md.hop_latency),
                    3 => match (md.queue_id, md.queue_occupancy) {
                        (Some(q), Some(o)) => (u32::from(q) << 24) | (o & 0x00ff_ffff),
                        _ => ALL_ONES_32,
                    },
                    4 => w32(md.ingress_timestamp.map(|t| t as u32)),
                    5 => w32(md.egress_timestamp.map(|t| t as u32)),
                    7 => w32(md.egress_tx_util),
                    8 => match (md.buffer_id, md.buffer_occupancy) {
                        (Some(b), Some(o)) => (u32::from(b) << 24) | (o & 0x00ff_ffff),
                        _ => ALL_ONES_32,
                    },
                    15 if layout == Layout::ReportV2 => match md.drop_reason {
                        Some(r) => {
                            (u32::from(md.queue_id.unwrap_or(0)) << 24) | (u32::from(r) << 16)
                        }
                        None => ALL_ONES_32,
                    },
                    15 => w32(md.checksum_complement),
                    _ => 0, // reserved: zero on transmission
                };
                out.extend_from_slice(&w.to_be_bytes());
            }
        }
    }
}

/// An error for a stack whose per-hop length disagrees with its bitmap.
pub(crate) fn hop_ml_error(hop_ml_words: u8) -> ParseError {
    ParseError::Invalid {
        what: "int_md.hop_ml",
        detail: "smaller than the instruction bitmap's metadata",
        value: u32::from(hop_ml_words),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_len_counts_every_item_of_every_bitmap() {
        for layout in [Layout::IntV2, Layout::ReportV2, Layout::IntV1] {
            for bitmap in 0..=u16::MAX {
                let by_item: usize =
                    (0..16u32).filter(|b| bitmap & (0x8000 >> b) != 0).map(|b| item_len(b, layout)).sum();
                assert_eq!(baseline_len(bitmap, layout), by_item, "{layout:?} {bitmap:#06x}");
            }
        }
    }

    #[test]
    fn compact_decoding_equals_full_decoding() {
        // Every bitmap of every layout over a buffer mixing all-ones words and values.
        let buf: Vec<u8> = (0..96u32).map(|i| if i % 12 < 4 { 0xff } else { (i * 37 + 5) as u8 }).collect();
        for layout in [Layout::IntV2, Layout::ReportV2, Layout::IntV1] {
            for bitmap in 0..=u16::MAX {
                let plan = Plan::new(bitmap, layout);
                for start in [0usize, 4, 8] {
                    let b = &buf[start..];
                    let full = plan.decode(b).map(|md| CompactHop::from_metadata(&md));
                    assert_eq!(plan.decode_compact(b), full, "{layout:?} {bitmap:#06x} at {start}");
                }
            }
        }
    }

    #[test]
    fn decode_reads_items_in_bit_order() {
        // Bits 1, 3 and 15 (ReportV2): ports, queue, queue id + drop reason.
        let bitmap = 0x4000 | 0x1000 | 0x0001;
        let words: [u32; 3] = [0x0001_0002, 0x0700_0100, 0x0947_0000];
        let buf: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
        let (md, used) = decode(bitmap, &buf, Layout::ReportV2).unwrap();
        assert_eq!(used, 12);
        assert_eq!((md.l1_ingress_port, md.l1_egress_port), (Some(1), Some(2)));
        assert_eq!((md.queue_id, md.queue_occupancy), (Some(7), Some(0x100)));
        assert_eq!(md.drop_reason, Some(0x47));
    }
}
