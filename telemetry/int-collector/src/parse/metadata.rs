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

use super::wire::{take, u32_at, u64_at, ParseError, Result};

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

/// Bytes one node writes for `bitmap` under `layout` (baseline items only).
pub fn baseline_len(bitmap: u16, layout: Layout) -> usize {
    (0..16u32)
        .filter(|bit| bitmap & (0x8000 >> bit) != 0)
        .map(|bit| item_len(bit, layout))
        .sum()
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
    let need = baseline_len(bitmap, layout);
    let body = take(buf, 0, need, "metadata")?;
    let mut md = HopMetadata::default();
    let mut at = 0usize;
    for bit in 0..16u32 {
        if bitmap & (0x8000 >> bit) == 0 {
            continue;
        }
        let len = item_len(bit, layout);
        if len == 8 && !(layout == Layout::IntV1 && bit == 6) {
            let v = u64_at(body, at, "metadata")?;
            let v = (v != u64::MAX).then_some(v);
            match bit {
                4 => md.ingress_timestamp = v,
                5 => md.egress_timestamp = v,
                _ => {
                    // bit 6 (v2.x): two 32-bit level-2 interface ids.
                    let hi = (v.unwrap_or(u64::MAX) >> 32) as u32;
                    let lo = v.unwrap_or(u64::MAX) as u32;
                    md.l2_ingress_port = (hi != ALL_ONES_32).then_some(hi);
                    md.l2_egress_port = (lo != ALL_ONES_32).then_some(lo);
                }
            }
        } else if len == 8 {
            // INT v1.0 bit 6: two 32-bit level-2 interface ids.
            let i = u32_at(body, at, "metadata")?;
            let e = u32_at(body, at + 4, "metadata")?;
            md.l2_ingress_port = (i != ALL_ONES_32).then_some(i);
            md.l2_egress_port = (e != ALL_ONES_32).then_some(e);
        } else {
            let w = u32_at(body, at, "metadata")?;
            if w != ALL_ONES_32 {
                apply_word(&mut md, bit, w, layout);
            }
        }
        at += len;
    }
    Ok((md, need))
}

fn apply_word(md: &mut HopMetadata, bit: u32, w: u32, layout: Layout) {
    match bit {
        0 if layout != Layout::ReportV2 => md.node_id = Some(w),
        1 => {
            md.l1_ingress_port = Some((w >> 16) as u16);
            md.l1_egress_port = Some(w as u16);
        }
        2 => md.hop_latency = Some(w),
        3 => {
            md.queue_id = Some((w >> 24) as u8);
            md.queue_occupancy = Some(w & 0x00ff_ffff);
        }
        4 => md.ingress_timestamp = Some(u64::from(w)), // v1.0: 32-bit timestamps
        5 => md.egress_timestamp = Some(u64::from(w)),
        7 => md.egress_tx_util = Some(w),
        8 => {
            md.buffer_id = Some((w >> 24) as u8);
            md.buffer_occupancy = Some(w & 0x00ff_ffff);
        }
        15 => match layout {
            Layout::ReportV2 => {
                // Queue ID (8) + Drop Reason (8) + Padding (16); the queue id may also come
                // from bit 3, which wins when both are present.
                md.queue_id = md.queue_id.or(Some((w >> 24) as u8));
                md.drop_reason = Some((w >> 16) as u8);
            }
            _ => md.checksum_complement = Some(w),
        },
        // Reserved bits (report bit 0, bits 9-14): skipped, their words are consumed.
        _ => {}
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
