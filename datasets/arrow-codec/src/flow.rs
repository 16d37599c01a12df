//! Flow records (`cgloop.flows.v1`, each payload a `cgloop.v1.FlowRecordBatch`) into
//! `cgloop.flow_ingest`'s columns: the table ([`FlowColumns`]), its row and the decoder of one
//! `FlowRecord` body.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StructArray};
use arrow_schema::{ArrowError, DataType, Field, Fields, SchemaRef};
use cgloop_proto::v1::{Direction, RtpStats};

use crate::column::{Binary, Column, U64List, Utf8};
use crate::encoder::{for_each_record, Batch, Encoder, RowError};
use crate::error::{check_header, CodecError};
use crate::ipc::Piece;
use crate::wire::{key, take_key, unknown, FieldAt, WireError, LENGTH_DELIMITED, VARINT};

/// The longest `Direction` name (`DIRECTION_UNSPECIFIED`): bounds the `direction` column's bytes,
/// the one column that can outgrow the protobuf bytes (an empty record is 2 bytes on the wire).
const MAX_DIRECTION_NAME: usize = 21;

/// Decodes each payload as a `FlowRecordBatch`, concatenates their records in order and returns
/// ONE Arrow IPC stream (schema, then one record batch) shaped like `cgloop.flow_ingest`.
/// No payloads give a valid stream of zero rows. A [`FlowEncoder`] kept by the caller does the
/// same without allocating (and page-faulting) its columns afresh every call.
pub fn flows_to_arrow<P: AsRef<[u8]>>(payloads: &[P]) -> Result<Vec<u8>, CodecError> {
    FlowEncoder::stream(payloads)
}

/// The records of `payloads` as one Arrow record batch (the columns of [`flows_to_arrow`]'s
/// stream, built as `arrow-array` arrays: a copy; the stream is written without them).
pub fn flow_record_batch<P: AsRef<[u8]>>(payloads: &[P]) -> Result<RecordBatch, CodecError> {
    FlowEncoder::record_batch(payloads)
}

/// The Arrow schema of [`flows_to_arrow`]'s stream: `cgloop.flow_ingest`'s columns in order.
pub fn flow_schema() -> SchemaRef {
    FlowEncoder::schema()
}

/// Keeps `cgloop.flow_ingest`'s columns from call to call (see [`Encoder`]).
pub type FlowEncoder = Encoder<FlowColumns>;
columns! {
    /// `cgloop.flow_ingest`'s columns.
    pub struct FlowColumns {
    header_schema_version: Vec<u32>,
    header_source_id: Utf8 = Utf8::with_hint(32),
    header_sequence: Vec<u64>,
    header_timestamp_ns: Vec<u64>,
    five_tuple_src_addr: Binary = Binary::with_hint(16),
    five_tuple_dst_addr: Binary = Binary::with_hint(16),
    five_tuple_src_port: Vec<u32>,
    five_tuple_dst_port: Vec<u32>,
    five_tuple_ip_protocol: Vec<u32>,
    direction: Utf8 = Utf8::with_hint(MAX_DIRECTION_NAME),
    vlan_id: Vec<u32>,
    ifindex: Vec<u32>,
    interface_name: Utf8 = Utf8::with_hint(16),
    interval_start_ns: Vec<u64>,
    interval_end_ns: Vec<u64>,
    is_final: Vec<bool>,
    packets: Vec<u64>,
    bytes: Vec<u64>,
    first_seen_ns: Vec<u64>,
    last_seen_ns: Vec<u64>,
    size_min_bytes: Vec<u32>,
    size_max_bytes: Vec<u32>,
    size_sum_bytes: Vec<u64>,
    size_sum_squares_bytes2: Vec<u64>,
    size_histogram_bytes_buckets: U64List,
    inter_arrival_histogram_ns_buckets: U64List,
    max_burst_packets: Vec<u32>,
    burst_count: Vec<u32>,
    ecn_not_ect_packets: Vec<u64>,
    ecn_ect0_packets: Vec<u64>,
    ecn_ect1_packets: Vec<u64>,
    ecn_ce_packets: Vec<u64>,
    last_dscp: Vec<u32>,
    tcp_flags_seen: Vec<u32>,
    rtp_ssrc: Vec<u32>,
    rtp_payload_type: Vec<u32>,
    rtp_clock_rate_hz: Vec<u32>,
    rtp_jitter_ns: Vec<u64>,
    rtp_lost_packets: Vec<u64>,
    rtp_reordered_packets: Vec<u64>,
    rtp_sequence_gaps: Vec<u64>,
    rtp_duplicate_packets: Vec<u64>,
    rtp_marker_packets: Vec<u64>,
    rtp_extended_highest_sequence: Vec<u32>,
    }
}

impl FlowColumns {
    /// Appends one decoded record as one row (its histogram values are in the list columns
    /// already); `Err(value)` when its direction is no enum value.
    #[inline(always)]
    pub(crate) fn push_row(&mut self, r: &Row) -> Result<(), i32> {
        // An absent (0) direction is stored as its name too: ClickHouse writes the proto
        // default's name, "DIRECTION_UNSPECIFIED", for a field missing from the wire.
        let direction = Direction::try_from(r.direction).map_err(|_| r.direction)?;
        self.direction.push(direction.as_str_name().as_bytes());
        self.rows += 1;
        self.header_schema_version.push(r.header_schema_version);
        self.header_source_id.push(r.header_source_id);
        self.header_sequence.push(r.header_sequence);
        self.header_timestamp_ns.push(r.header_timestamp_ns);
        self.five_tuple_src_addr.push(r.five_tuple_src_addr);
        self.five_tuple_dst_addr.push(r.five_tuple_dst_addr);
        self.five_tuple_src_port.push(r.five_tuple_src_port);
        self.five_tuple_dst_port.push(r.five_tuple_dst_port);
        self.five_tuple_ip_protocol.push(r.five_tuple_ip_protocol);
        self.vlan_id.push(r.vlan_id);
        self.ifindex.push(r.ifindex);
        self.interface_name.push(r.interface_name);
        self.interval_start_ns.push(r.interval_start_ns);
        self.interval_end_ns.push(r.interval_end_ns);
        self.is_final.push(r.is_final);
        self.packets.push(r.packets);
        self.bytes.push(r.bytes);
        self.first_seen_ns.push(r.first_seen_ns);
        self.last_seen_ns.push(r.last_seen_ns);
        self.size_min_bytes.push(r.size_min_bytes);
        self.size_max_bytes.push(r.size_max_bytes);
        self.size_sum_bytes.push(r.size_sum_bytes);
        self.size_sum_squares_bytes2.push(r.size_sum_squares_bytes2);
        self.size_histogram_bytes_buckets.close();
        self.inter_arrival_histogram_ns_buckets.close();
        self.max_burst_packets.push(r.max_burst_packets);
        self.burst_count.push(r.burst_count);
        self.ecn_not_ect_packets.push(r.ecn_not_ect_packets);
        self.ecn_ect0_packets.push(r.ecn_ect0_packets);
        self.ecn_ect1_packets.push(r.ecn_ect1_packets);
        self.ecn_ce_packets.push(r.ecn_ce_packets);
        self.last_dscp.push(r.last_dscp);
        self.tcp_flags_seen.push(r.tcp_flags_seen);
        let rtp = &r.rtp;
        self.rtp_ssrc.push(rtp.ssrc);
        self.rtp_payload_type.push(rtp.payload_type);
        self.rtp_clock_rate_hz.push(rtp.clock_rate_hz);
        self.rtp_jitter_ns.push(rtp.jitter_ns);
        self.rtp_lost_packets.push(rtp.lost_packets);
        self.rtp_reordered_packets.push(rtp.reordered_packets);
        self.rtp_sequence_gaps.push(rtp.sequence_gaps);
        self.rtp_duplicate_packets.push(rtp.duplicate_packets);
        self.rtp_marker_packets.push(rtp.marker_packets);
        self.rtp_extended_highest_sequence
            .push(rtp.extended_highest_sequence);
        Ok(())
    }
}

impl Batch for FlowColumns {
    const MESSAGE: &'static str = "FlowRecordBatch";
    const ENUM: (&'static str, &'static str) = ("direction", "Direction");
    const MAX_ROW_EXTRA: usize = MAX_DIRECTION_NAME;

    fn append_payload(
        &mut self,
        index: usize,
        payload: &[u8],
        version: Option<u32>,
    ) -> Result<(), CodecError> {
        // A wire decoder for these messages, a record at a time straight into the columns
        // (prost's merge into a reused `FlowRecord` then a copy into the columns was ~70% of a
        // call).
        for_each_record::<Self>(index, payload, |body| {
            let row = decode_record(body, self)?;
            check_header(
                row.has_header,
                row.header_schema_version,
                row.header_source_id,
                version,
            )
            .map_err(|check| RowError::Refused("FlowRecord", check))?;
            self.push_row(&row).map_err(RowError::UnknownEnum)
        })
    }

    fn batch_pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>)) {
        self.column_pieces(f);
    }

    fn batch_arrays(&self) -> Result<Vec<ArrayRef>, ArrowError> {
        self.arrays()
    }
}

/// One `FlowRecord` as its row: scalars, and strings/bytes borrowed from the payload. Absent
/// fields and nested messages stay 0 / empty, as ClickHouse's decoder fills them; a field or
/// nested message that comes again is merged as protobuf merges (the last scalar wins).
#[derive(Default)]
pub(crate) struct Row<'a> {
    /// Field 1 came (even empty): the strict decoder's `HasField("header")`.
    pub(crate) has_header: bool,
    pub(crate) header_schema_version: u32,
    pub(crate) header_source_id: &'a [u8],
    pub(crate) header_sequence: u64,
    pub(crate) header_timestamp_ns: u64,
    pub(crate) five_tuple_src_addr: &'a [u8],
    pub(crate) five_tuple_dst_addr: &'a [u8],
    pub(crate) five_tuple_src_port: u32,
    pub(crate) five_tuple_dst_port: u32,
    pub(crate) five_tuple_ip_protocol: u32,
    pub(crate) direction: i32,
    pub(crate) vlan_id: u32,
    pub(crate) ifindex: u32,
    pub(crate) interface_name: &'a [u8],
    pub(crate) interval_start_ns: u64,
    pub(crate) interval_end_ns: u64,
    pub(crate) is_final: bool,
    pub(crate) packets: u64,
    pub(crate) bytes: u64,
    pub(crate) first_seen_ns: u64,
    pub(crate) last_seen_ns: u64,
    pub(crate) size_min_bytes: u32,
    pub(crate) size_max_bytes: u32,
    pub(crate) size_sum_bytes: u64,
    pub(crate) size_sum_squares_bytes2: u64,
    pub(crate) max_burst_packets: u32,
    pub(crate) burst_count: u32,
    pub(crate) ecn_not_ect_packets: u64,
    pub(crate) ecn_ect0_packets: u64,
    pub(crate) ecn_ect1_packets: u64,
    pub(crate) ecn_ce_packets: u64,
    pub(crate) last_dscp: u32,
    pub(crate) tcp_flags_seen: u32,
    pub(crate) rtp: RtpStats,
}

/// Decodes one `FlowRecord` message body into a row; its histogram buckets go straight into
/// the list columns' values (the row's offsets are closed by `FlowColumns::push_row`).
pub(crate) fn decode_record<'a>(
    mut buf: &'a [u8],
    cols: &mut FlowColumns,
) -> Result<Row<'a>, WireError> {
    let mut row = Row::default();
    let b = &mut buf;
    // Every encoder we know writes the fields in tag order, each once: taken in that order,
    // each check is a branch predicted right (a `match` on each key was a jump mispredicted
    // nearly every field). The rest, whatever its order, goes through the general loop.
    decode_fields!(b, |tag, wt, b| record_field(tag, wt, b, &mut row, cols);
        1 LENGTH_DELIMITED, 2 LENGTH_DELIMITED, 3 VARINT, 4 VARINT, 5 VARINT,
        6 LENGTH_DELIMITED, 7 VARINT, 8 VARINT, 9 VARINT, 10 VARINT, 11 VARINT, 12 VARINT,
        13 VARINT, 14 VARINT, 15 VARINT, 16 VARINT, 17 VARINT, 18 LENGTH_DELIMITED,
        19 LENGTH_DELIMITED, 20 VARINT, 21 VARINT, 22 VARINT, 23 VARINT, 24 VARINT, 25 VARINT,
        26 VARINT, 27 VARINT, 28 LENGTH_DELIMITED);
    Ok(row)
}

#[inline(always)]
fn record_field<'a>(
    tag: u32,
    wt: u8,
    b: &mut &'a [u8],
    row: &mut Row<'a>,
    cols: &mut FlowColumns,
) -> Result<(), WireError> {
    let at = |field, wire_type| FieldAt {
        message: "FlowRecord",
        field,
        wire_type,
    };
    match tag {
        1 => {
            decode_header(at("header", wt).bytes(b)?, row)?;
            row.has_header = true;
        }
        2 => decode_five_tuple(at("five_tuple", wt).bytes(b)?, row)?,
        3 => row.direction = at("direction", wt).u64(b)? as i32,
        4 => row.vlan_id = at("vlan_id", wt).u32(b)?,
        5 => row.ifindex = at("ifindex", wt).u32(b)?,
        6 => row.interface_name = at("interface_name", wt).string(b)?,
        7 => row.interval_start_ns = at("interval_start_ns", wt).u64(b)?,
        8 => row.interval_end_ns = at("interval_end_ns", wt).u64(b)?,
        9 => row.is_final = at("is_final", wt).u64(b)? != 0,
        10 => row.packets = at("packets", wt).u64(b)?,
        11 => row.bytes = at("bytes", wt).u64(b)?,
        12 => row.first_seen_ns = at("first_seen_ns", wt).u64(b)?,
        13 => row.last_seen_ns = at("last_seen_ns", wt).u64(b)?,
        14 => row.size_min_bytes = at("size_min_bytes", wt).u32(b)?,
        15 => row.size_max_bytes = at("size_max_bytes", wt).u32(b)?,
        16 => row.size_sum_bytes = at("size_sum_bytes", wt).u64(b)?,
        17 => row.size_sum_squares_bytes2 = at("size_sum_squares_bytes2", wt).u64(b)?,
        18 => decode_histogram(
            at("size_histogram_bytes", wt).bytes(b)?,
            &mut cols.size_histogram_bytes_buckets.values,
        )?,
        19 => decode_histogram(
            at("inter_arrival_histogram_ns", wt).bytes(b)?,
            &mut cols.inter_arrival_histogram_ns_buckets.values,
        )?,
        20 => row.max_burst_packets = at("max_burst_packets", wt).u32(b)?,
        21 => row.burst_count = at("burst_count", wt).u32(b)?,
        22 => row.ecn_not_ect_packets = at("ecn_not_ect_packets", wt).u64(b)?,
        23 => row.ecn_ect0_packets = at("ecn_ect0_packets", wt).u64(b)?,
        24 => row.ecn_ect1_packets = at("ecn_ect1_packets", wt).u64(b)?,
        25 => row.ecn_ce_packets = at("ecn_ce_packets", wt).u64(b)?,
        26 => row.last_dscp = at("last_dscp", wt).u32(b)?,
        27 => row.tcp_flags_seen = at("tcp_flags_seen", wt).u32(b)?,
        28 => decode_rtp(at("rtp", wt).bytes(b)?, &mut row.rtp)?,
        _ => return Err(unknown("FlowRecord", tag, wt, b)),
    }
    Ok(())
}

fn decode_header<'a>(mut buf: &'a [u8], row: &mut Row<'a>) -> Result<(), WireError> {
    let b = &mut buf;
    decode_fields!(b, |tag, wt, b| header_field(tag, wt, b, row);
        1 VARINT, 2 LENGTH_DELIMITED, 3 VARINT, 4 VARINT);
    Ok(())
}

#[inline(always)]
fn header_field<'a>(
    tag: u32,
    wt: u8,
    b: &mut &'a [u8],
    row: &mut Row<'a>,
) -> Result<(), WireError> {
    let at = |field, wire_type| FieldAt {
        message: "RecordHeader",
        field,
        wire_type,
    };
    match tag {
        1 => row.header_schema_version = at("schema_version", wt).u32(b)?,
        2 => row.header_source_id = at("source_id", wt).string(b)?,
        3 => row.header_sequence = at("sequence", wt).u64(b)?,
        4 => row.header_timestamp_ns = at("timestamp_ns", wt).u64(b)?,
        _ => return Err(unknown("RecordHeader", tag, wt, b)),
    }
    Ok(())
}

fn decode_five_tuple<'a>(mut buf: &'a [u8], row: &mut Row<'a>) -> Result<(), WireError> {
    let b = &mut buf;
    decode_fields!(b, |tag, wt, b| five_tuple_field(tag, wt, b, row);
        1 LENGTH_DELIMITED, 2 LENGTH_DELIMITED, 3 VARINT, 4 VARINT, 5 VARINT);
    Ok(())
}

#[inline(always)]
fn five_tuple_field<'a>(
    tag: u32,
    wt: u8,
    b: &mut &'a [u8],
    row: &mut Row<'a>,
) -> Result<(), WireError> {
    let at = |field, wire_type| FieldAt {
        message: "FiveTuple",
        field,
        wire_type,
    };
    match tag {
        1 => row.five_tuple_src_addr = at("src_addr", wt).bytes(b)?,
        2 => row.five_tuple_dst_addr = at("dst_addr", wt).bytes(b)?,
        3 => row.five_tuple_src_port = at("src_port", wt).u32(b)?,
        4 => row.five_tuple_dst_port = at("dst_port", wt).u32(b)?,
        5 => row.five_tuple_ip_protocol = at("ip_protocol", wt).u32(b)?,
        _ => return Err(unknown("FiveTuple", tag, wt, b)),
    }
    Ok(())
}

fn decode_histogram(mut buf: &[u8], values: &mut Vec<u64>) -> Result<(), WireError> {
    while !buf.is_empty() {
        let (tag, wt) = key(&mut buf)?;
        if tag == 1 {
            let at = FieldAt {
                message: "Log2Histogram",
                field: "buckets",
                wire_type: wt,
            };
            at.repeated_u64(&mut buf, values)?;
        } else {
            return Err(unknown("Log2Histogram", tag, wt, &mut buf));
        }
    }
    Ok(())
}

fn decode_rtp(mut buf: &[u8], rtp: &mut RtpStats) -> Result<(), WireError> {
    let b = &mut buf;
    decode_fields!(b, |tag, wt, b| rtp_field(tag, wt, b, rtp);
        1 VARINT, 2 VARINT, 3 VARINT, 4 VARINT, 5 VARINT, 6 VARINT, 7 VARINT, 8 VARINT, 9 VARINT, 10 VARINT);
    Ok(())
}

#[inline(always)]
fn rtp_field(tag: u32, wt: u8, b: &mut &[u8], rtp: &mut RtpStats) -> Result<(), WireError> {
    let at = |field, wire_type| FieldAt {
        message: "RtpStats",
        field,
        wire_type,
    };
    match tag {
        1 => rtp.ssrc = at("ssrc", wt).u32(b)?,
        2 => rtp.payload_type = at("payload_type", wt).u32(b)?,
        3 => rtp.clock_rate_hz = at("clock_rate_hz", wt).u32(b)?,
        4 => rtp.jitter_ns = at("jitter_ns", wt).u64(b)?,
        5 => rtp.lost_packets = at("lost_packets", wt).u64(b)?,
        6 => rtp.reordered_packets = at("reordered_packets", wt).u64(b)?,
        7 => rtp.sequence_gaps = at("sequence_gaps", wt).u64(b)?,
        8 => rtp.duplicate_packets = at("duplicate_packets", wt).u64(b)?,
        9 => rtp.marker_packets = at("marker_packets", wt).u64(b)?,
        10 => rtp.extended_highest_sequence = at("extended_highest_sequence", wt).u32(b)?,
        _ => return Err(unknown("RtpStats", tag, wt, b)),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
