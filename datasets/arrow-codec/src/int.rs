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
    FiveTuple, IntDropRecord, IntEventReason, IntHop, IntQueueRecord, RecordHeader,
};

use std::sync::{Arc, LazyLock};

// The names `columns!` expands to, besides the crate's own.
use arrow_array::{ArrayRef, StructArray};
use arrow_schema::{ArrowError, DataType, Field, Fields};

use crate::column::{Binary, Column, List, Utf8};
use crate::encoder::{for_each_record, Batch, Encoder, RowError};
use crate::error::CodecError;
use crate::ipc::Piece;

mod kinds;
use kinds::Kinds;

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
mod tests;
