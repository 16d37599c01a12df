//! INT records (`cgloop.int.v1`, each payload a `cgloop.v1.IntRecordBatch`) into one Arrow IPC
//! stream whose columns are exactly those of the store's Null table `cgloop.int_ingest` after
//! all migrations: the four oneof kinds side by side (`hop_*`, `flow_*`, `queue_*`, `drop_*`),
//! filled as ClickHouse's protobuf decoder fills them. A record's other kinds are 0 / '' /
//! empty, and `flow_reason` is an enum name in every row (`INT_EVENT_REASON_UNSPECIFIED` where
//! the record is no flow record, as the decoder writes it).
//!
//! The batch and the `IntRecord` oneof are walked with the flows' wire reader (so an error
//! names its record); each kind's message is decoded with prost into the generated types. Like
//! ClickHouse's decoder, and unlike prost's oneof, a record carrying two kinds on the wire
//! fills both (no producer writes that; the rows stored stay the same either way).

use cgloop_proto::v1::{
    FiveTuple, IntDropRecord, IntEventReason, IntFlowRecord, IntHop, IntHopRecord, IntQueueRecord,
    RecordHeader,
};
use prost::Message;

use std::sync::{Arc, LazyLock};

// The names `columns!` expands to, besides the crate's own.
use arrow_array::{ArrayRef, StructArray};
use arrow_schema::{ArrowError, DataType, Field, Fields};

use crate::{
    check_header, for_each_record, key, skip, unknown, Batch, Binary, Check, CodecError, Column,
    Encoder, FieldAt, List, Piece, RowError, Utf8, WireError, LENGTH_DELIMITED,
};

/// The longest `IntEventReason` name (`INT_EVENT_REASON_LATENCY_CHANGE`): bounds `flow_reason`.
const MAX_REASON_NAME: usize = 31;

/// Decodes each payload as an `IntRecordBatch`, concatenates their records in order and returns
/// ONE Arrow IPC stream (schema, then one record batch) shaped like `cgloop.int_ingest`.
/// No payloads give a valid stream of zero rows. An [`IntEncoder`] kept by the caller reuses
/// its columns from call to call.
pub fn int_to_arrow<P: AsRef<[u8]>>(payloads: &[P]) -> Result<Vec<u8>, CodecError> {
    IntEncoder::stream(payloads)
}

/// Keeps `cgloop.int_ingest`'s columns from call to call (see [`Encoder`]).
pub type IntEncoder = Encoder<IntColumns>;

columns! {
    /// One `IntHop`: an item of `flow_hops`, `Array(Tuple(...))` in ClickHouse.
    pub struct HopColumns {
        switch_id: Vec<u32>,
        ingress_port: Vec<u32>,
        egress_port: Vec<u32>,
        hop_latency_ns: Vec<u64>,
        queue_id: Vec<u32>,
        queue_occupancy_cells: Vec<u32>,
        egress_tx_utilization: Vec<f64>,
        ingress_timestamp_ns: Vec<u64>,
        egress_timestamp_ns: Vec<u64>,
        l2_ingress_port: Vec<u32>,
        l2_egress_port: Vec<u32>,
        buffer_id: Vec<u32>,
        buffer_occupancy_cells: Vec<u32>,
        egress_tx_utilization_raw: Vec<u32>,
    }
}

columns! {
    /// `cgloop.int_ingest`'s columns, in the table's order after migration 0008 (which
    /// appended the hop's level-2 ports, buffer and raw utilization, and the flow's reporter).
    pub struct IntColumns {
        hop_header_schema_version: Vec<u32>,
        hop_header_source_id: Utf8 = Utf8::with_hint(24),
        hop_header_sequence: Vec<u64>,
        hop_header_timestamp_ns: Vec<u64>,
        hop_five_tuple_src_addr: Binary,
        hop_five_tuple_dst_addr: Binary,
        hop_five_tuple_src_port: Vec<u32>,
        hop_five_tuple_dst_port: Vec<u32>,
        hop_five_tuple_ip_protocol: Vec<u32>,
        hop_hop_index: Vec<u32>,
        hop_hop_switch_id: Vec<u32>,
        hop_hop_ingress_port: Vec<u32>,
        hop_hop_egress_port: Vec<u32>,
        hop_hop_hop_latency_ns: Vec<u64>,
        hop_hop_queue_id: Vec<u32>,
        hop_hop_queue_occupancy_cells: Vec<u32>,
        hop_hop_egress_tx_utilization: Vec<f64>,
        hop_hop_ingress_timestamp_ns: Vec<u64>,
        hop_hop_egress_timestamp_ns: Vec<u64>,
        flow_header_schema_version: Vec<u32>,
        flow_header_source_id: Utf8 = Utf8::with_hint(24),
        flow_header_sequence: Vec<u64>,
        flow_header_timestamp_ns: Vec<u64>,
        flow_five_tuple_src_addr: Binary,
        flow_five_tuple_dst_addr: Binary,
        flow_five_tuple_src_port: Vec<u32>,
        flow_five_tuple_dst_port: Vec<u32>,
        flow_five_tuple_ip_protocol: Vec<u32>,
        flow_path_switch_ids: List<Vec<u32>> = List::with_per_row(4),
        flow_hops: List<HopColumns> = List::with_per_row(4),
        flow_end_to_end_latency_ns: Vec<u64>,
        flow_reason: Utf8 = Utf8::with_hint(MAX_REASON_NAME),
        flow_report_sequence: Vec<u32>,
        queue_header_schema_version: Vec<u32>,
        queue_header_source_id: Utf8 = Utf8::with_hint(24),
        queue_header_sequence: Vec<u64>,
        queue_header_timestamp_ns: Vec<u64>,
        queue_switch_id: Vec<u32>,
        queue_egress_port: Vec<u32>,
        queue_queue_id: Vec<u32>,
        queue_queue_occupancy_cells: Vec<u32>,
        queue_queue_latency_ns: Vec<u64>,
        queue_congested: Vec<bool>,
        queue_egress_tx_utilization: Vec<f64>,
        drop_header_schema_version: Vec<u32>,
        drop_header_source_id: Utf8 = Utf8::with_hint(24),
        drop_header_sequence: Vec<u64>,
        drop_header_timestamp_ns: Vec<u64>,
        drop_switch_id: Vec<u32>,
        drop_ingress_port: Vec<u32>,
        drop_egress_port: Vec<u32>,
        drop_queue_id: Vec<u32>,
        drop_drop_reason: Vec<u32>,
        drop_drop_count: Vec<u64>,
        drop_five_tuple_src_addr: Binary,
        drop_five_tuple_dst_addr: Binary,
        drop_five_tuple_src_port: Vec<u32>,
        drop_five_tuple_dst_port: Vec<u32>,
        drop_five_tuple_ip_protocol: Vec<u32>,
        hop_hop_l2_ingress_port: Vec<u32>,
        hop_hop_l2_egress_port: Vec<u32>,
        hop_hop_buffer_id: Vec<u32>,
        hop_hop_buffer_occupancy_cells: Vec<u32>,
        hop_hop_egress_tx_utilization_raw: Vec<u32>,
        flow_reporter_switch_id: Vec<u32>,
        flow_report_count: Vec<u32>,
    }
}

impl Batch for IntColumns {
    const MESSAGE: &'static str = "IntRecordBatch";
    const ENUM: (&'static str, &'static str) = ("reason", "IntEventReason");
    const MAX_ROW_EXTRA: usize = MAX_REASON_NAME;

    fn append_payload(
        &mut self,
        index: usize,
        payload: &[u8],
        version: Option<u32>,
    ) -> Result<(), CodecError> {
        for_each_record::<Self>(index, payload, |body| {
            let kinds = Kinds::decode(body)?;
            kinds.check(version)?;
            self.push_row(&kinds).map_err(RowError::UnknownEnum)
        })
    }

    fn batch_pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>)) {
        self.column_pieces(f);
    }

    fn batch_arrays(&self) -> Result<Vec<ArrayRef>, ArrowError> {
        self.arrays()
    }
}

/// The kinds one `IntRecord` carries (one, from every producer; none for an empty record).
#[derive(Default)]
struct Kinds {
    hop: Option<IntHopRecord>,
    flow: Option<IntFlowRecord>,
    queue: Option<IntQueueRecord>,
    drop: Option<IntDropRecord>,
}

impl Kinds {
    /// Decodes one `IntRecord` body: a kind that comes again merges (as prost merges a oneof
    /// member); different kinds are all kept (as ClickHouse's decoder keeps them). A field no
    /// message here has is refused, at any depth, as the strict decoder refuses it (prost
    /// would drop it silently, so each kind's body is walked against [`KNOWN`] first).
    fn decode(mut buf: &[u8]) -> Result<Self, WireError> {
        fn merge<M: Message + Default>(
            slot: &mut Option<M>,
            field: &'static str,
            known: &'static Known,
            wire_type: u8,
            buf: &mut &[u8],
        ) -> Result<(), WireError> {
            let at = FieldAt {
                message: "IntRecord",
                field,
                wire_type,
            };
            let body = at.bytes(buf)?;
            // prost's errors first (its words for a malformed body), then the unknown fields.
            // prost drops those, so a body holding one re-encodes shorter; a body every field
            // of which prost kept re-encodes to its own length when it was written canonically,
            // as every encoder we know writes it: only a body that does not is walked field by
            // field (the walk alone cost ~20% of a call).
            let first = slot.is_none();
            let message = slot.get_or_insert_with(M::default);
            message.merge(body)?;
            if !first || message.encoded_len() != body.len() {
                known.check(body)?;
            }
            Ok(())
        }
        let mut kinds = Kinds::default();
        let b = &mut buf;
        while !b.is_empty() {
            let (tag, wt) = key(b)?;
            match tag {
                1 => merge(&mut kinds.hop, "hop", &KNOWN_HOP_RECORD, wt, b)?,
                2 => merge(&mut kinds.flow, "flow", &KNOWN_FLOW_RECORD, wt, b)?,
                3 => merge(&mut kinds.queue, "queue", &KNOWN_QUEUE_RECORD, wt, b)?,
                4 => merge(&mut kinds.drop, "drop", &KNOWN_DROP_RECORD, wt, b)?,
                _ => return Err(unknown("IntRecord", tag, wt, b)),
            }
        }
        Ok(kinds)
    }

    /// The strict decoder's checks of each kind's header (every kind present: ClickHouse's
    /// decoder would store each); none at all is an empty envelope. The rows' views pick a
    /// record's kind by a non-empty source id, so a record without one would be stored nowhere.
    fn check(&self, version: Option<u32>) -> Result<(), RowError> {
        fn one(
            message: &'static str,
            header: Option<&RecordHeader>,
            version: Option<u32>,
        ) -> Result<(), RowError> {
            let (present, h) = match header {
                Some(h) => (true, h),
                None => (false, &DEFAULTS.header),
            };
            check_header(present, h.schema_version, h.source_id.as_bytes(), version)
                .map_err(|check| RowError::Refused(message, check))
        }
        let mut any = false;
        if let Some(r) = &self.hop {
            one("IntHopRecord", r.header.as_ref(), version)?;
            any = true;
        }
        if let Some(r) = &self.flow {
            one("IntFlowRecord", r.header.as_ref(), version)?;
            any = true;
        }
        if let Some(r) = &self.queue {
            one("IntQueueRecord", r.header.as_ref(), version)?;
            any = true;
        }
        if let Some(r) = &self.drop {
            one("IntDropRecord", r.header.as_ref(), version)?;
            any = true;
        }
        if any {
            Ok(())
        } else {
            Err(RowError::Refused("IntRecord", Check::EmptyEnvelope))
        }
    }
}

/// The fields of one message of int.proto / common.proto: (number, nested message or None for
/// a scalar). Only the numbers matter here; prost has checked the wire types already.
struct Known {
    message: &'static str,
    fields: &'static [(u32, Option<&'static Known>)],
}

impl Known {
    /// Err(Unknown) for the first field, at any depth, that its message does not have.
    fn check(&'static self, mut buf: &[u8]) -> Result<(), WireError> {
        let b = &mut buf;
        while !b.is_empty() {
            let (tag, wt) = key(b)?;
            match self.fields.iter().find(|(n, _)| *n == tag) {
                Some((_, Some(nested))) if wt == LENGTH_DELIMITED => {
                    let at = FieldAt {
                        message: self.message,
                        field: nested.message,
                        wire_type: wt,
                    };
                    nested.check(at.bytes(b)?)?;
                }
                Some(_) => skip(tag, wt, b)?,
                None => {
                    return Err(WireError::Unknown {
                        message: self.message,
                        tag,
                    })
                }
            }
        }
        Ok(())
    }
}

const fn scalars<const N: usize>(first: u32) -> [(u32, Option<&'static Known>); N] {
    let mut out = [(0, None); N];
    let mut i = 0;
    while i < N {
        out[i] = (first + i as u32, None);
        i += 1;
    }
    out
}

static KNOWN_HEADER: Known = Known {
    message: "RecordHeader",
    fields: &scalars::<4>(1),
};
static KNOWN_FIVE_TUPLE: Known = Known {
    message: "FiveTuple",
    fields: &scalars::<5>(1),
};
static KNOWN_HOP: Known = Known {
    message: "IntHop",
    fields: &scalars::<14>(1),
};
static KNOWN_HOP_RECORD: Known = Known {
    message: "IntHopRecord",
    fields: &[
        (1, Some(&KNOWN_HEADER)),
        (2, Some(&KNOWN_FIVE_TUPLE)),
        (3, None),
        (4, Some(&KNOWN_HOP)),
    ],
};
static KNOWN_FLOW_RECORD: Known = Known {
    message: "IntFlowRecord",
    fields: &[
        (1, Some(&KNOWN_HEADER)),
        (2, Some(&KNOWN_FIVE_TUPLE)),
        (3, None),
        (4, Some(&KNOWN_HOP)),
        (5, None),
        (6, None),
        (7, None),
        (8, None),
        (9, None),
    ],
};
static KNOWN_QUEUE_RECORD: Known = Known {
    message: "IntQueueRecord",
    fields: &[
        (1, Some(&KNOWN_HEADER)),
        (2, None),
        (3, None),
        (4, None),
        (5, None),
        (6, None),
        (7, None),
        (8, None),
    ],
};
static KNOWN_DROP_RECORD: Known = Known {
    message: "IntDropRecord",
    fields: &[
        (1, Some(&KNOWN_HEADER)),
        (2, None),
        (3, None),
        (4, None),
        (5, None),
        (6, None),
        (7, None),
        (8, Some(&KNOWN_FIVE_TUPLE)),
    ],
};

/// Appends a `RecordHeader` (absent: zeros) to its four columns.
macro_rules! push_header {
    ($h:expr => $version:expr, $source:expr, $sequence:expr, $time:expr) => {{
        let h: Option<&RecordHeader> = $h;
        let h = h.map_or(&DEFAULTS.header, |h| h);
        $version.push(h.schema_version);
        $source.push(h.source_id.as_bytes());
        $sequence.push(h.sequence);
        $time.push(h.timestamp_ns);
    }};
}

/// Appends a `FiveTuple` (absent: zeros) to its five columns.
macro_rules! push_five_tuple {
    ($t:expr => $src:expr, $dst:expr, $sport:expr, $dport:expr, $proto:expr) => {{
        let t: Option<&FiveTuple> = $t;
        let t = t.map_or(&DEFAULTS.five_tuple, |t| t);
        $src.push(&t.src_addr);
        $dst.push(&t.dst_addr);
        $sport.push(t.src_port);
        $dport.push(t.dst_port);
        $proto.push(t.ip_protocol);
    }};
}

/// Appends an `IntHop`'s fields, in its field order, to the 14 columns named.
macro_rules! push_hop {
    ($h:expr => $c0:expr, $c1:expr, $c2:expr, $c3:expr, $c4:expr, $c5:expr, $c6:expr,
     $c7:expr, $c8:expr, $c9:expr, $c10:expr, $c11:expr, $c12:expr, $c13:expr) => {{
        let h: &IntHop = $h;
        $c0.push(h.switch_id);
        $c1.push(h.ingress_port);
        $c2.push(h.egress_port);
        $c3.push(h.hop_latency_ns);
        $c4.push(h.queue_id);
        $c5.push(h.queue_occupancy_cells);
        $c6.push(h.egress_tx_utilization);
        $c7.push(h.ingress_timestamp_ns);
        $c8.push(h.egress_timestamp_ns);
        $c9.push(h.l2_ingress_port);
        $c10.push(h.l2_egress_port);
        $c11.push(h.buffer_id);
        $c12.push(h.buffer_occupancy_cells);
        $c13.push(h.egress_tx_utilization_raw);
    }};
}

/// The messages a record lacks, read as ClickHouse's decoder reads them: all zero / empty.
#[derive(Default)]
struct Defaults {
    header: RecordHeader,
    five_tuple: FiveTuple,
    hop: IntHop,
    queue: IntQueueRecord,
    drop: IntDropRecord,
}

static DEFAULTS: LazyLock<Defaults> = LazyLock::new(Defaults::default);

impl HopColumns {
    fn push(&mut self, h: &IntHop) {
        push_hop!(h => self.switch_id, self.ingress_port, self.egress_port, self.hop_latency_ns,
            self.queue_id, self.queue_occupancy_cells, self.egress_tx_utilization,
            self.ingress_timestamp_ns, self.egress_timestamp_ns, self.l2_ingress_port,
            self.l2_egress_port, self.buffer_id, self.buffer_occupancy_cells,
            self.egress_tx_utilization_raw);
        self.rows += 1;
    }
}

impl IntColumns {
    /// Appends one record as one row: its kind's columns from it, every other kind's the
    /// decoder's defaults. `Err(value)` when a flow record's reason is no enum value.
    fn push_row(&mut self, k: &Kinds) -> Result<(), i32> {
        // The reason first: a record refused leaves no partial row behind. An absent flow (or
        // reason) is stored as the default's name, as ClickHouse's decoder stores it.
        let reason = k.flow.as_ref().map_or(0, |f| f.reason);
        let reason = IntEventReason::try_from(reason).map_err(|_| reason)?;
        self.flow_reason.push(reason.as_str_name().as_bytes());
        self.rows += 1;

        let hop = k.hop.as_ref();
        push_header!(hop.and_then(|r| r.header.as_ref()) => self.hop_header_schema_version,
            self.hop_header_source_id, self.hop_header_sequence, self.hop_header_timestamp_ns);
        push_five_tuple!(hop.and_then(|r| r.five_tuple.as_ref()) => self.hop_five_tuple_src_addr,
            self.hop_five_tuple_dst_addr, self.hop_five_tuple_src_port,
            self.hop_five_tuple_dst_port, self.hop_five_tuple_ip_protocol);
        self.hop_hop_index.push(hop.map_or(0, |r| r.hop_index));
        let h = hop.and_then(|r| r.hop.as_ref()).unwrap_or(&DEFAULTS.hop);
        push_hop!(h => self.hop_hop_switch_id, self.hop_hop_ingress_port,
            self.hop_hop_egress_port, self.hop_hop_hop_latency_ns, self.hop_hop_queue_id,
            self.hop_hop_queue_occupancy_cells, self.hop_hop_egress_tx_utilization,
            self.hop_hop_ingress_timestamp_ns, self.hop_hop_egress_timestamp_ns,
            self.hop_hop_l2_ingress_port, self.hop_hop_l2_egress_port, self.hop_hop_buffer_id,
            self.hop_hop_buffer_occupancy_cells, self.hop_hop_egress_tx_utilization_raw);

        let flow = k.flow.as_ref();
        push_header!(flow.and_then(|r| r.header.as_ref()) => self.flow_header_schema_version,
            self.flow_header_source_id, self.flow_header_sequence, self.flow_header_timestamp_ns);
        push_five_tuple!(flow.and_then(|r| r.five_tuple.as_ref()) => self.flow_five_tuple_src_addr,
            self.flow_five_tuple_dst_addr, self.flow_five_tuple_src_port,
            self.flow_five_tuple_dst_port, self.flow_five_tuple_ip_protocol);
        if let Some(f) = flow {
            self.flow_path_switch_ids
                .values
                .extend_from_slice(&f.path_switch_ids);
            for h in &f.hops {
                self.flow_hops.values.push(h);
            }
        }
        self.flow_path_switch_ids.close();
        self.flow_hops.close();
        self.flow_end_to_end_latency_ns
            .push(flow.map_or(0, |f| f.end_to_end_latency_ns));
        self.flow_report_sequence
            .push(flow.map_or(0, |f| f.report_sequence));
        self.flow_reporter_switch_id
            .push(flow.map_or(0, |f| f.reporter_switch_id));
        self.flow_report_count
            .push(flow.map_or(0, |f| f.report_count));

        let queue = k.queue.as_ref();
        push_header!(queue.and_then(|r| r.header.as_ref()) => self.queue_header_schema_version,
            self.queue_header_source_id, self.queue_header_sequence,
            self.queue_header_timestamp_ns);
        let q = queue.unwrap_or(&DEFAULTS.queue);
        self.queue_switch_id.push(q.switch_id);
        self.queue_egress_port.push(q.egress_port);
        self.queue_queue_id.push(q.queue_id);
        self.queue_queue_occupancy_cells
            .push(q.queue_occupancy_cells);
        self.queue_queue_latency_ns.push(q.queue_latency_ns);
        self.queue_congested.push(q.congested);
        self.queue_egress_tx_utilization
            .push(q.egress_tx_utilization);

        let drop = k.drop.as_ref();
        push_header!(drop.and_then(|r| r.header.as_ref()) => self.drop_header_schema_version,
            self.drop_header_source_id, self.drop_header_sequence, self.drop_header_timestamp_ns);
        let d = drop.unwrap_or(&DEFAULTS.drop);
        self.drop_switch_id.push(d.switch_id);
        self.drop_ingress_port.push(d.ingress_port);
        self.drop_egress_port.push(d.egress_port);
        self.drop_queue_id.push(d.queue_id);
        self.drop_drop_reason.push(d.drop_reason);
        self.drop_drop_count.push(d.drop_count);
        push_five_tuple!(drop.and_then(|r| r.five_tuple.as_ref()) => self.drop_five_tuple_src_addr,
            self.drop_five_tuple_dst_addr, self.drop_five_tuple_src_port,
            self.drop_five_tuple_dst_port, self.drop_five_tuple_ip_protocol);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, UInt32Type, UInt64Type};
    use arrow_array::{Array, RecordBatch};
    use arrow_ipc::reader::StreamReader;
    use arrow_ipc::writer::StreamWriter;
    use cgloop_proto::samples;
    use cgloop_proto::v1::int_record::Record;
    use cgloop_proto::v1::{IntRecord, IntRecordBatch};

    fn encode(records: Vec<IntRecord>) -> Vec<u8> {
        IntRecordBatch { records }.encode_to_vec()
    }

    /// The reference path: prost decodes the whole batch (its oneof keeps one kind a record),
    /// each record becomes a row. None where prost rejects the payloads.
    fn reference(payloads: &[Vec<u8>]) -> Option<Result<RecordBatch, i32>> {
        let mut columns = IntColumns::default();
        for p in payloads {
            for r in IntRecordBatch::decode(&p[..]).ok()?.records {
                let mut kinds = Kinds::default();
                match r.record {
                    Some(Record::Hop(m)) => kinds.hop = Some(m),
                    Some(Record::Flow(m)) => kinds.flow = Some(m),
                    Some(Record::Queue(m)) => kinds.queue = Some(m),
                    Some(Record::Drop(m)) => kinds.drop = Some(m),
                    None => {}
                }
                if let Err(value) = columns.push_row(&kinds) {
                    return Some(Err(value));
                }
            }
        }
        Some(Ok(crate::to_record_batch(&columns).expect("valid columns")))
    }

    fn col<'a>(batch: &'a RecordBatch, name: &str) -> &'a ArrayRef {
        batch
            .column_by_name(name)
            .unwrap_or_else(|| panic!("no column {name}"))
    }

    /// Every kind, records missing their nested messages (not their headers: the strict
    /// checks refuse those), IPv6.
    fn varied_payloads() -> Vec<Vec<u8>> {
        let sample = samples::sample_int_record_batch();
        let mut bare = vec![];
        for r in &sample.records {
            let mut r = r.clone();
            match r.record.as_mut() {
                Some(Record::Hop(h)) => {
                    h.hop = None;
                    h.five_tuple = None;
                }
                Some(Record::Flow(f)) => {
                    f.hops.push(IntHop::default());
                    f.path_switch_ids.clear();
                    if let Some(t) = f.five_tuple.as_mut() {
                        t.src_addr = vec![0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
                    }
                }
                Some(Record::Queue(q)) => q.queue_latency_ns = 0,
                Some(Record::Drop(d)) => d.five_tuple = None,
                None => {}
            }
            bare.push(r);
        }
        vec![sample.encode_to_vec(), encode(bare)]
    }

    #[test]
    fn rows_equal_prosts_decode_one_kind_a_row() {
        let payloads = varied_payloads();
        let got = IntEncoder::record_batch(&payloads).expect("valid");
        let want = reference(&payloads).expect("valid").expect("valid reasons");
        assert_eq!(got, want);
        assert_eq!(got.num_rows(), 8);
        // Spot checks against the sample itself.
        let sample = samples::sample_int_record_batch();
        let Some(Record::Flow(flow)) = &sample.records[1].record else {
            panic!("the sample's second record is a flow record")
        };
        let reason = col(&got, "flow_reason").as_string::<i32>();
        assert_eq!(reason.value(1), "INT_EVENT_REASON_LATENCY_CHANGE");
        // Not a flow record: the decoder's default name, as ClickHouse writes it.
        assert_eq!(reason.value(0), "INT_EVENT_REASON_UNSPECIFIED");
        let hops = col(&got, "flow_hops").as_list::<i32>();
        assert_eq!(hops.value_length(0), 0);
        assert_eq!(hops.value_length(1), 2);
        let hop = hops.value(1);
        let latency = hop
            .as_struct()
            .column_by_name("hop_latency_ns")
            .expect("field");
        let latency: Vec<u64> = latency.as_primitive::<UInt64Type>().values().to_vec();
        assert_eq!(
            latency,
            flow.hops
                .iter()
                .map(|h| h.hop_latency_ns)
                .collect::<Vec<_>>()
        );
        let raw = hop
            .as_struct()
            .column_by_name("egress_tx_utilization_raw")
            .expect("field");
        assert_eq!(
            raw.as_primitive::<UInt32Type>().value(1),
            flow.hops[1].egress_tx_utilization_raw
        );
        let ids = col(&got, "flow_path_switch_ids").as_list::<i32>();
        let ids = ids.value(1);
        assert_eq!(
            ids.as_primitive::<UInt32Type>().values().to_vec(),
            flow.path_switch_ids
        );
        let util = col(&got, "queue_egress_tx_utilization").as_primitive::<Float64Type>();
        assert_eq!(util.value(2), 0.875);
        assert!(col(&got, "queue_congested").as_boolean().value(2));
        let drops = col(&got, "drop_drop_count").as_primitive::<UInt64Type>();
        assert_eq!(drops.value(3), 17);
        // The second payload: the kinds without their nested messages.
        let source = col(&got, "hop_header_source_id").as_string::<i32>();
        assert_eq!(source.value(4), "int-collector-1");
        let switch = col(&got, "hop_hop_switch_id").as_primitive::<UInt32Type>();
        assert_eq!(switch.value(4), 0, "a hop record without its hop");
        assert_eq!(
            col(&got, "hop_five_tuple_src_addr")
                .as_binary::<i32>()
                .value(4),
            b""
        );
        assert_eq!(hops.value_length(5), 3, "two hops and an empty one");
        assert_eq!(ids.len(), 2);
        assert_eq!(
            col(&got, "flow_five_tuple_src_addr")
                .as_binary::<i32>()
                .value(5)
                .len(),
            16
        );
    }

    #[test]
    fn schema_is_int_ingests_columns() {
        let schema = IntEncoder::schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names.len(), 66);
        assert_eq!(names[0], "hop_header_schema_version");
        assert_eq!(names[29], "flow_hops");
        assert_eq!(
            names[59..],
            [
                "hop_hop_l2_ingress_port",
                "hop_hop_l2_egress_port",
                "hop_hop_buffer_id",
                "hop_hop_buffer_occupancy_cells",
                "hop_hop_egress_tx_utilization_raw",
                "flow_reporter_switch_id",
                "flow_report_count",
            ]
        );
        let DataType::List(item) = schema.field(29).data_type() else {
            panic!("flow_hops is a list")
        };
        let DataType::Struct(fields) = item.data_type() else {
            panic!("of structs")
        };
        assert_eq!(fields.len(), 14);
        assert!(schema.fields().iter().all(|f| !f.is_nullable()));
    }

    #[test]
    fn every_bit_flip_decodes_as_prost_or_is_rejected_by_both() {
        let payload = varied_payloads().swap_remove(1);
        let (mut same, mut rejected) = (0, 0);
        for bit in 0..payload.len() * 8 {
            let mut flipped = payload.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let payloads = [flipped];
            match (IntEncoder::record_batch(&payloads), reference(&payloads)) {
                (Ok(got), Some(Ok(want))) => {
                    assert_eq!(got, want, "bit {bit}");
                    same += 1;
                }
                (Err(CodecError::UnknownEnum { value, .. }), Some(Err(want))) => {
                    assert_eq!(value, want, "bit {bit}");
                    rejected += 1;
                }
                (Err(CodecError::Decode { .. }), None) => rejected += 1,
                // The strict decoder's refusals, which prost does not make.
                (
                    Err(
                        CodecError::Refused { .. }
                        | CodecError::Decode {
                            source: WireError::Unknown { .. },
                            ..
                        },
                    ),
                    Some(_),
                ) => rejected += 1,
                (got, want) => panic!(
                    "bit {bit}: ours {:?}, prost's {:?}",
                    got.map(|b| b.num_rows()),
                    want.map(|w| w.map(|b| b.num_rows()))
                ),
            }
        }
        assert!(same > 0 && rejected > 0, "{same} same, {rejected} rejected");
    }

    #[test]
    fn two_kinds_in_one_record_fill_both_as_clickhouse_does() {
        let sample = samples::sample_int_record_batch();
        let hop = IntRecord {
            record: sample.records[0].record.clone(),
        }
        .encode_to_vec();
        let flow = IntRecord {
            record: sample.records[1].record.clone(),
        }
        .encode_to_vec();
        let body = [hop, flow].concat();
        let payload = IntRecordBatch::default().encode_to_vec(); // empty
        let mut payload = payload;
        prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut payload);
        prost::encoding::encode_varint(body.len() as u64, &mut payload);
        payload.extend_from_slice(&body);
        let got = IntEncoder::record_batch(&[payload]).expect("valid");
        assert_eq!(got.num_rows(), 1);
        assert_eq!(
            col(&got, "hop_header_sequence")
                .as_primitive::<UInt64Type>()
                .value(0),
            7
        );
        assert_eq!(
            col(&got, "flow_header_sequence")
                .as_primitive::<UInt64Type>()
                .value(0),
            8
        );
    }

    #[test]
    fn errors_name_the_payload_and_record() {
        let good = samples::sample_int_record_batch().encode_to_vec();
        // The second record's body claims more bytes than there are.
        let first = samples::sample_int_record_batch().records[0].clone();
        let mut bad = encode(vec![first.clone()]);
        bad.extend_from_slice(&[0x0a, 0x05, 0x0a, 0x64, 0x01]);
        let err = int_to_arrow(&[good.clone(), bad]).expect_err("malformed");
        let text = err.to_string();
        assert!(
            text.starts_with("payload 1: not a cgloop.v1.IntRecordBatch (record 1): "),
            "{text}"
        );
        let flow = IntFlowRecord {
            header: Some(RecordHeader {
                schema_version: 1,
                source_id: "s".into(),
                ..Default::default()
            }),
            reason: 99,
            ..Default::default()
        };
        let unknown = encode(vec![
            first,
            IntRecord {
                record: Some(Record::Flow(flow)),
            },
        ]);
        let err = int_to_arrow(&[good, unknown]).expect_err("unknown reason");
        assert_eq!(
            err.to_string(),
            "payload 1, record 1: reason 99 is not a cgloop.v1.IntEventReason value"
        );
        assert!(
            matches!(
                err,
                CodecError::UnknownEnum {
                    index: 1,
                    record: 1,
                    field: "reason",
                    value: 99,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn stream_is_byte_for_byte_arrows_own() {
        let payloads = varied_payloads();
        let batch = IntEncoder::record_batch(&payloads).expect("valid");
        let mut w = StreamWriter::try_new(Vec::new(), batch.schema_ref()).expect("writer");
        w.write(&batch).expect("write");
        w.finish().expect("finish");
        let want = w.into_inner().expect("bytes");
        let mut encoder = IntEncoder::new();
        let mut out = Vec::new();
        encoder
            .encode_into(&payloads[..1], &mut out)
            .expect("valid");
        encoder.encode_into(&payloads, &mut out).expect("valid"); // reused
        assert_eq!(out, want);
        let read: Vec<RecordBatch> = StreamReader::try_new(&out[..], None)
            .expect("stream")
            .map(|b| b.expect("batch"))
            .collect();
        assert_eq!(read, vec![batch]);
        let none: [&[u8]; 0] = [];
        let empty = int_to_arrow(&none).expect("empty is fine");
        let reader = StreamReader::try_new(&empty[..], None).expect("stream");
        assert_eq!(reader.schema(), IntEncoder::schema());
    }

    #[test]
    fn records_the_strict_decoder_refuses_are_refused_naming_payload_and_record() {
        use prost::encoding::{encode_key, encode_varint, WireType};
        let sample = samples::sample_int_record_batch();
        let good = sample.encode_to_vec();
        let mut anonymous = sample.clone();
        if let Some(Record::Flow(f)) = anonymous.records[1].record.as_mut() {
            f.header.as_mut().expect("a header").source_id.clear();
        }
        let mut unreadable = sample.clone();
        if let Some(Record::Drop(d)) = unreadable.records[3].record.as_mut() {
            d.header.as_mut().expect("a header").schema_version = 99;
        }
        let mut headless = sample.clone();
        if let Some(Record::Queue(q)) = headless.records[2].record.as_mut() {
            q.header = None;
        }
        let mut empty = sample.clone();
        empty.records.insert(1, IntRecord::default());
        // The words after "payload 1: " are those of cgloop.bus.codec.decode_payload.
        let cases = [
            (
                anonymous.encode_to_vec(),
                "payload 1: record 1 (IntFlowRecord): header has no source_id",
            ),
            (
                unreadable.encode_to_vec(),
                "payload 1: record 3 (IntDropRecord): schema_version 99 not readable \
                 (this build reads 1..1)",
            ),
            (
                headless.encode_to_vec(),
                "payload 1: record 2 (IntQueueRecord): missing header",
            ),
            (
                empty.encode_to_vec(),
                "payload 1: record 1 (IntRecord): empty envelope, none of its records is set",
            ),
            (
                Vec::new(),
                "payload 1: cgloop.v1.IntRecordBatch with no records",
            ),
        ];
        for (bad, want) in cases {
            let err = int_to_arrow(&[good.clone(), bad]).expect_err(want);
            assert_eq!(err.to_string(), want);
            assert_eq!(err.payload_index(), Some(1));
        }
        // An unknown field deep inside a kind (prost drops it; the strict decoder refuses it):
        // field 15 of the hop of a hop record.
        let Some(Record::Hop(hop)) = sample.records[0].record.clone() else {
            panic!("the sample's first record is a hop record")
        };
        let mut inner = hop.hop.expect("a hop").encode_to_vec();
        encode_key(15, WireType::Varint, &mut inner);
        encode_varint(1, &mut inner);
        let mut body = IntHopRecord { hop: None, ..hop }.encode_to_vec();
        encode_key(4, WireType::LengthDelimited, &mut body);
        encode_varint(inner.len() as u64, &mut body);
        body.extend_from_slice(&inner);
        let mut record = Vec::new();
        encode_key(1, WireType::LengthDelimited, &mut record);
        encode_varint(body.len() as u64, &mut record);
        record.extend_from_slice(&body);
        let mut batch = Vec::new();
        encode_key(1, WireType::LengthDelimited, &mut batch);
        encode_varint(record.len() as u64, &mut batch);
        batch.extend_from_slice(&record);
        assert!(IntRecordBatch::decode(&batch[..]).is_ok(), "prost skips it");
        let err = int_to_arrow(&[good, batch]).expect_err("unknown field");
        assert!(
            err.to_string().ends_with("IntHop: unknown field 15"),
            "{err}"
        );
    }
}
