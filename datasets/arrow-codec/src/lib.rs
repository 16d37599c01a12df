//! Decodes `cgloop.v1.FlowRecordBatch` Kafka payloads (prost) into one Arrow IPC stream whose
//! columns are exactly those of the store's Null table `cgloop.flow_ingest`: the protobuf paths
//! of `FlowRecord` joined with `_`, filled as ClickHouse's protobuf decoder fills them (missing
//! nested messages give 0 / empty, enums their proto name). The trace-store sink inserts the
//! stream with `FORMAT ArrowStream`, several times cheaper for ClickHouse than `ProtobufList`.
//!
//! The Python binding (`cgloop.arrowcodec`, feature `python`) is a thin layer over
//! [`flows_to_arrow`]; everything here is plain Rust and tested with `cargo test`.

use std::io::Write;
use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, ListBuilder, StringBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use cgloop_proto::v1::{Direction, FiveTuple, FlowRecord, Log2Histogram, RecordHeader, RtpStats};
use prost::encoding::{decode_key, message, skip_field, DecodeContext};
use prost::Message;

/// Most bytes one call may decode: Arrow's utf8/binary/list arrays use 32-bit offsets, and the
/// strings, addresses and histogram values of a batch never outgrow its protobuf encoding.
pub const MAX_TOTAL_BYTES: usize = i32::MAX as usize;

/// Why a set of payloads could not become an Arrow stream.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// A payload is not a valid `FlowRecordBatch` encoding (`index` counts from 0; `record`
    /// is the record being decoded when it failed).
    #[error("payload {index}: not a cgloop.v1.FlowRecordBatch (record {record}): {source}")]
    Decode {
        index: usize,
        record: usize,
        #[source]
        source: prost::DecodeError,
    },
    /// A record's `direction` is no value of the `Direction` enum. ClickHouse's protobuf decoder
    /// rejects it as well (it has no name to store), so no row of it can be stored as today.
    #[error(
        "payload {index}, record {record}: direction {value} is not a cgloop.v1.Direction value"
    )]
    UnknownDirection {
        index: usize,
        record: usize,
        value: i32,
    },
    /// The payloads together exceed what one Arrow record batch can hold.
    #[error(
        "payloads total {total} bytes, more than one Arrow record batch holds \
         ({MAX_TOTAL_BYTES}): insert them in smaller chunks"
    )]
    TooLarge { total: usize },
    /// Building the Arrow arrays or the IPC stream failed (a bug, not bad input).
    #[error("building the Arrow stream: {0}")]
    Arrow(#[from] ArrowError),
}

/// Decodes each payload as a `FlowRecordBatch`, concatenates their records in order and returns
/// ONE Arrow IPC stream (schema, then one record batch) shaped like `cgloop.flow_ingest`.
/// No payloads give a valid stream of zero rows.
pub fn flows_to_arrow<P: AsRef<[u8]>>(payloads: &[P]) -> Result<Vec<u8>, CodecError> {
    let batch = flow_record_batch(payloads)?;
    // Sized exactly: no reallocation (and no page faults) while the buffers are copied in.
    let mut out = Vec::with_capacity(stream_len(&batch)?);
    write_stream(&batch, &mut out)?;
    Ok(out)
}

/// Writes `batch` as one Arrow IPC stream (schema, the batch, end-of-stream marker).
pub fn write_stream<W: Write>(batch: &RecordBatch, out: W) -> Result<(), CodecError> {
    let mut writer = StreamWriter::try_new(out, batch.schema_ref())?;
    writer.write(batch)?;
    writer.finish()?;
    Ok(())
}

/// The exact size of [`write_stream`]'s output for `batch` (a dry run that copies nothing).
pub fn stream_len(batch: &RecordBatch) -> Result<usize, CodecError> {
    let mut counter = ByteCounter(0);
    write_stream(batch, &mut counter)?;
    Ok(counter.0)
}

struct ByteCounter(usize);

impl Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The records of `payloads` as one Arrow record batch (see [`flows_to_arrow`]).
pub fn flow_record_batch<P: AsRef<[u8]>>(payloads: &[P]) -> Result<RecordBatch, CodecError> {
    let total: usize = payloads.iter().map(|p| p.as_ref().len()).sum();
    if total > MAX_TOTAL_BYTES {
        return Err(CodecError::TooLarge { total });
    }
    // Sized for every record up front: growing the columns (reallocate, copy, fault the new
    // pages in) cost more than decoding into them. Malformed payloads are found by the decode.
    let rows = payloads.iter().map(|p| count_records(p.as_ref())).sum();
    let mut columns = FlowColumns::with_capacity(rows);
    let mut scratch = FlowRecord::default();
    for (index, payload) in payloads.iter().enumerate() {
        append_payload(&mut columns, &mut scratch, index, payload.as_ref())?;
    }
    columns.finish()
}

/// Decodes one `FlowRecordBatch` a record at a time into `scratch` (prost's own message merge,
/// reusing the record's allocations: decoding a fresh `FlowRecordBatch` per payload, six heap
/// allocations a record, made the conversion ~1.5x slower) and appends each to `columns`.
fn append_payload(
    columns: &mut FlowColumns,
    scratch: &mut FlowRecord,
    index: usize,
    payload: &[u8],
) -> Result<(), CodecError> {
    let mut buf = payload;
    let mut record = 0;
    let decode_error = |record, source| CodecError::Decode {
        index,
        record,
        source,
    };
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| decode_error(record, e))?;
        if tag == FLOW_RECORD_BATCH_RECORDS {
            reset(scratch);
            message::merge(wire_type, scratch, &mut buf, DecodeContext::default())
                .map_err(|e| decode_error(record, e))?;
            columns
                .append(scratch)
                .map_err(|value| CodecError::UnknownDirection {
                    index,
                    record,
                    value,
                })?;
            record += 1;
        } else {
            // An unknown field (a newer producer): skipped, as protobuf decoders do.
            skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| decode_error(record, e))?;
        }
    }
    Ok(())
}

/// How many records a `FlowRecordBatch` payload holds (its field-1 keys; stops quietly at
/// anything malformed, which the decode then reports). Only sizes the columns.
fn count_records(payload: &[u8]) -> usize {
    let mut buf = payload;
    let mut n = 0;
    while let Ok((tag, wire_type)) = decode_key(&mut buf) {
        if skip_field(wire_type, tag, &mut buf, DecodeContext::default()).is_err() {
            break;
        }
        n += usize::from(tag == FLOW_RECORD_BATCH_RECORDS);
    }
    n
}

/// `FlowRecordBatch.records`' field number.
const FLOW_RECORD_BATCH_RECORDS: u32 = 1;

/// Empties `r` for the next record but keeps its nested messages' allocations: an absent nested
/// message then reads as a present, empty one, which gives the same row (the decoder's defaults).
fn reset(r: &mut FlowRecord) {
    fn cleared<M: Message>(m: Option<M>) -> Option<M> {
        m.map(|mut m| {
            m.clear();
            m
        })
    }
    let header = cleared(r.header.take());
    let five_tuple = cleared(r.five_tuple.take());
    let sizes = cleared(r.size_histogram_bytes.take());
    let gaps = cleared(r.inter_arrival_histogram_ns.take());
    let rtp = cleared(r.rtp.take());
    r.clear();
    r.header = header;
    r.five_tuple = five_tuple;
    r.size_histogram_bytes = sizes;
    r.inter_arrival_histogram_ns = gaps;
    r.rtp = rtp;
}

/// The Arrow schema of [`flows_to_arrow`]'s stream: `cgloop.flow_ingest`'s columns in order.
pub fn flow_schema() -> SchemaRef {
    match FlowColumns::with_capacity(0).finish() {
        Ok(batch) => batch.schema(),
        // Empty arrays of the builders' own types always form a batch; keep a schema anyway.
        Err(_) => Arc::new(Schema::empty()),
    }
}

fn u64_list(capacity: usize) -> ListBuilder<UInt64Builder> {
    // Histogram buckets never hold nulls: a non-nullable item, as Array(UInt64) is.
    // Room for 32 buckets a row (2^32 ns, 4 GB): more only grows the values.
    ListBuilder::with_capacity(UInt64Builder::with_capacity(capacity * 32), capacity)
        .with_field(Arc::new(Field::new_list_field(DataType::UInt64, false)))
}

/// One builder per `cgloop.flow_ingest` column, in the table's column order.
struct FlowColumns {
    header_schema_version: UInt32Builder,
    header_source_id: StringBuilder,
    header_sequence: UInt64Builder,
    header_timestamp_ns: UInt64Builder,
    five_tuple_src_addr: BinaryBuilder,
    five_tuple_dst_addr: BinaryBuilder,
    five_tuple_src_port: UInt32Builder,
    five_tuple_dst_port: UInt32Builder,
    five_tuple_ip_protocol: UInt32Builder,
    direction: StringBuilder,
    vlan_id: UInt32Builder,
    ifindex: UInt32Builder,
    interface_name: StringBuilder,
    interval_start_ns: UInt64Builder,
    interval_end_ns: UInt64Builder,
    is_final: BooleanBuilder,
    packets: UInt64Builder,
    bytes: UInt64Builder,
    first_seen_ns: UInt64Builder,
    last_seen_ns: UInt64Builder,
    size_min_bytes: UInt32Builder,
    size_max_bytes: UInt32Builder,
    size_sum_bytes: UInt64Builder,
    size_sum_squares_bytes2: UInt64Builder,
    size_histogram_bytes_buckets: ListBuilder<UInt64Builder>,
    inter_arrival_histogram_ns_buckets: ListBuilder<UInt64Builder>,
    max_burst_packets: UInt32Builder,
    burst_count: UInt32Builder,
    ecn_not_ect_packets: UInt64Builder,
    ecn_ect0_packets: UInt64Builder,
    ecn_ect1_packets: UInt64Builder,
    ecn_ce_packets: UInt64Builder,
    last_dscp: UInt32Builder,
    tcp_flags_seen: UInt32Builder,
    rtp_ssrc: UInt32Builder,
    rtp_payload_type: UInt32Builder,
    rtp_clock_rate_hz: UInt32Builder,
    rtp_jitter_ns: UInt64Builder,
    rtp_lost_packets: UInt64Builder,
    rtp_reordered_packets: UInt64Builder,
    rtp_sequence_gaps: UInt64Builder,
    rtp_duplicate_packets: UInt64Builder,
    rtp_marker_packets: UInt64Builder,
    rtp_extended_highest_sequence: UInt32Builder,
    // Defaults for absent nested messages, as ClickHouse's decoder fills them.
    no_header: RecordHeader,
    no_five_tuple: FiveTuple,
    no_histogram: Log2Histogram,
    no_rtp: RtpStats,
}

impl FlowColumns {
    fn with_capacity(n: usize) -> Self {
        let u32s = || UInt32Builder::with_capacity(n);
        let u64s = || UInt64Builder::with_capacity(n);
        Self {
            header_schema_version: u32s(),
            header_source_id: StringBuilder::with_capacity(n, n * 32),
            header_sequence: u64s(),
            header_timestamp_ns: u64s(),
            five_tuple_src_addr: BinaryBuilder::with_capacity(n, n * 16),
            five_tuple_dst_addr: BinaryBuilder::with_capacity(n, n * 16),
            five_tuple_src_port: u32s(),
            five_tuple_dst_port: u32s(),
            five_tuple_ip_protocol: u32s(),
            direction: StringBuilder::with_capacity(n, n * 17),
            vlan_id: u32s(),
            ifindex: u32s(),
            interface_name: StringBuilder::with_capacity(n, n * 16),
            interval_start_ns: u64s(),
            interval_end_ns: u64s(),
            is_final: BooleanBuilder::with_capacity(n),
            packets: u64s(),
            bytes: u64s(),
            first_seen_ns: u64s(),
            last_seen_ns: u64s(),
            size_min_bytes: u32s(),
            size_max_bytes: u32s(),
            size_sum_bytes: u64s(),
            size_sum_squares_bytes2: u64s(),
            size_histogram_bytes_buckets: u64_list(n),
            inter_arrival_histogram_ns_buckets: u64_list(n),
            max_burst_packets: u32s(),
            burst_count: u32s(),
            ecn_not_ect_packets: u64s(),
            ecn_ect0_packets: u64s(),
            ecn_ect1_packets: u64s(),
            ecn_ce_packets: u64s(),
            last_dscp: u32s(),
            tcp_flags_seen: u32s(),
            rtp_ssrc: u32s(),
            rtp_payload_type: u32s(),
            rtp_clock_rate_hz: u32s(),
            rtp_jitter_ns: u64s(),
            rtp_lost_packets: u64s(),
            rtp_reordered_packets: u64s(),
            rtp_sequence_gaps: u64s(),
            rtp_duplicate_packets: u64s(),
            rtp_marker_packets: u64s(),
            rtp_extended_highest_sequence: u32s(),
            no_header: RecordHeader::default(),
            no_five_tuple: FiveTuple::default(),
            no_histogram: Log2Histogram::default(),
            no_rtp: RtpStats::default(),
        }
    }

    /// Appends one record as one row; `Err(value)` when its direction is no enum value (then
    /// nothing is appended, so the columns stay aligned).
    fn append(&mut self, r: &FlowRecord) -> Result<(), i32> {
        // An absent (0) direction is stored as its name too: ClickHouse writes the proto
        // default's name, "DIRECTION_UNSPECIFIED", for a field missing from the wire.
        let direction = Direction::try_from(r.direction).map_err(|_| r.direction)?;
        self.direction.append_value(direction.as_str_name());

        let h = r.header.as_ref().unwrap_or(&self.no_header);
        self.header_schema_version.append_value(h.schema_version);
        self.header_source_id.append_value(&h.source_id);
        self.header_sequence.append_value(h.sequence);
        self.header_timestamp_ns.append_value(h.timestamp_ns);

        let t = r.five_tuple.as_ref().unwrap_or(&self.no_five_tuple);
        self.five_tuple_src_addr.append_value(&t.src_addr);
        self.five_tuple_dst_addr.append_value(&t.dst_addr);
        self.five_tuple_src_port.append_value(t.src_port);
        self.five_tuple_dst_port.append_value(t.dst_port);
        self.five_tuple_ip_protocol.append_value(t.ip_protocol);

        self.vlan_id.append_value(r.vlan_id);
        self.ifindex.append_value(r.ifindex);
        self.interface_name.append_value(&r.interface_name);
        self.interval_start_ns.append_value(r.interval_start_ns);
        self.interval_end_ns.append_value(r.interval_end_ns);
        self.is_final.append_value(r.is_final);
        self.packets.append_value(r.packets);
        self.bytes.append_value(r.bytes);
        self.first_seen_ns.append_value(r.first_seen_ns);
        self.last_seen_ns.append_value(r.last_seen_ns);
        self.size_min_bytes.append_value(r.size_min_bytes);
        self.size_max_bytes.append_value(r.size_max_bytes);
        self.size_sum_bytes.append_value(r.size_sum_bytes);
        self.size_sum_squares_bytes2
            .append_value(r.size_sum_squares_bytes2);

        let sizes = r
            .size_histogram_bytes
            .as_ref()
            .unwrap_or(&self.no_histogram);
        self.size_histogram_bytes_buckets
            .values()
            .append_slice(&sizes.buckets);
        self.size_histogram_bytes_buckets.append(true);
        let gaps = r
            .inter_arrival_histogram_ns
            .as_ref()
            .unwrap_or(&self.no_histogram);
        self.inter_arrival_histogram_ns_buckets
            .values()
            .append_slice(&gaps.buckets);
        self.inter_arrival_histogram_ns_buckets.append(true);

        self.max_burst_packets.append_value(r.max_burst_packets);
        self.burst_count.append_value(r.burst_count);
        self.ecn_not_ect_packets.append_value(r.ecn_not_ect_packets);
        self.ecn_ect0_packets.append_value(r.ecn_ect0_packets);
        self.ecn_ect1_packets.append_value(r.ecn_ect1_packets);
        self.ecn_ce_packets.append_value(r.ecn_ce_packets);
        self.last_dscp.append_value(r.last_dscp);
        self.tcp_flags_seen.append_value(r.tcp_flags_seen);

        let rtp = r.rtp.as_ref().unwrap_or(&self.no_rtp);
        self.rtp_ssrc.append_value(rtp.ssrc);
        self.rtp_payload_type.append_value(rtp.payload_type);
        self.rtp_clock_rate_hz.append_value(rtp.clock_rate_hz);
        self.rtp_jitter_ns.append_value(rtp.jitter_ns);
        self.rtp_lost_packets.append_value(rtp.lost_packets);
        self.rtp_reordered_packets
            .append_value(rtp.reordered_packets);
        self.rtp_sequence_gaps.append_value(rtp.sequence_gaps);
        self.rtp_duplicate_packets
            .append_value(rtp.duplicate_packets);
        self.rtp_marker_packets.append_value(rtp.marker_packets);
        self.rtp_extended_highest_sequence
            .append_value(rtp.extended_highest_sequence);
        Ok(())
    }

    /// The columns as one record batch; column names are the ingest table's, none nullable.
    fn finish(mut self) -> Result<RecordBatch, CodecError> {
        let columns: Vec<(&str, ArrayRef)> = vec![
            (
                "header_schema_version",
                Arc::new(self.header_schema_version.finish()),
            ),
            ("header_source_id", Arc::new(self.header_source_id.finish())),
            ("header_sequence", Arc::new(self.header_sequence.finish())),
            (
                "header_timestamp_ns",
                Arc::new(self.header_timestamp_ns.finish()),
            ),
            (
                "five_tuple_src_addr",
                Arc::new(self.five_tuple_src_addr.finish()),
            ),
            (
                "five_tuple_dst_addr",
                Arc::new(self.five_tuple_dst_addr.finish()),
            ),
            (
                "five_tuple_src_port",
                Arc::new(self.five_tuple_src_port.finish()),
            ),
            (
                "five_tuple_dst_port",
                Arc::new(self.five_tuple_dst_port.finish()),
            ),
            (
                "five_tuple_ip_protocol",
                Arc::new(self.five_tuple_ip_protocol.finish()),
            ),
            ("direction", Arc::new(self.direction.finish())),
            ("vlan_id", Arc::new(self.vlan_id.finish())),
            ("ifindex", Arc::new(self.ifindex.finish())),
            ("interface_name", Arc::new(self.interface_name.finish())),
            (
                "interval_start_ns",
                Arc::new(self.interval_start_ns.finish()),
            ),
            ("interval_end_ns", Arc::new(self.interval_end_ns.finish())),
            ("is_final", Arc::new(self.is_final.finish())),
            ("packets", Arc::new(self.packets.finish())),
            ("bytes", Arc::new(self.bytes.finish())),
            ("first_seen_ns", Arc::new(self.first_seen_ns.finish())),
            ("last_seen_ns", Arc::new(self.last_seen_ns.finish())),
            ("size_min_bytes", Arc::new(self.size_min_bytes.finish())),
            ("size_max_bytes", Arc::new(self.size_max_bytes.finish())),
            ("size_sum_bytes", Arc::new(self.size_sum_bytes.finish())),
            (
                "size_sum_squares_bytes2",
                Arc::new(self.size_sum_squares_bytes2.finish()),
            ),
            (
                "size_histogram_bytes_buckets",
                Arc::new(self.size_histogram_bytes_buckets.finish()),
            ),
            (
                "inter_arrival_histogram_ns_buckets",
                Arc::new(self.inter_arrival_histogram_ns_buckets.finish()),
            ),
            (
                "max_burst_packets",
                Arc::new(self.max_burst_packets.finish()),
            ),
            ("burst_count", Arc::new(self.burst_count.finish())),
            (
                "ecn_not_ect_packets",
                Arc::new(self.ecn_not_ect_packets.finish()),
            ),
            ("ecn_ect0_packets", Arc::new(self.ecn_ect0_packets.finish())),
            ("ecn_ect1_packets", Arc::new(self.ecn_ect1_packets.finish())),
            ("ecn_ce_packets", Arc::new(self.ecn_ce_packets.finish())),
            ("last_dscp", Arc::new(self.last_dscp.finish())),
            ("tcp_flags_seen", Arc::new(self.tcp_flags_seen.finish())),
            ("rtp_ssrc", Arc::new(self.rtp_ssrc.finish())),
            ("rtp_payload_type", Arc::new(self.rtp_payload_type.finish())),
            (
                "rtp_clock_rate_hz",
                Arc::new(self.rtp_clock_rate_hz.finish()),
            ),
            ("rtp_jitter_ns", Arc::new(self.rtp_jitter_ns.finish())),
            ("rtp_lost_packets", Arc::new(self.rtp_lost_packets.finish())),
            (
                "rtp_reordered_packets",
                Arc::new(self.rtp_reordered_packets.finish()),
            ),
            (
                "rtp_sequence_gaps",
                Arc::new(self.rtp_sequence_gaps.finish()),
            ),
            (
                "rtp_duplicate_packets",
                Arc::new(self.rtp_duplicate_packets.finish()),
            ),
            (
                "rtp_marker_packets",
                Arc::new(self.rtp_marker_packets.finish()),
            ),
            (
                "rtp_extended_highest_sequence",
                Arc::new(self.rtp_extended_highest_sequence.finish()),
            ),
        ];
        let fields: Vec<Field> = columns
            .iter()
            .map(|(name, array)| Field::new(*name, array.data_type().clone(), false))
            .collect();
        let arrays = columns.into_iter().map(|(_, array)| array).collect();
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
    }
}

#[cfg(feature = "python")]
mod python {
    //! `cgloop.arrowcodec`: the Python face of [`crate::flows_to_arrow`].

    use pyo3::exceptions::{PyRuntimeError, PyValueError};
    use pyo3::prelude::*;
    use pyo3::pybacked::PyBackedBytes;
    use pyo3::types::PyBytes;

    use crate::CodecError;

    /// Decode Kafka payloads of cgloop.flows.v1 (each a FlowRecordBatch) into one Arrow IPC
    /// stream shaped like cgloop.flow_ingest. Raises ValueError naming the bad payload's index.
    #[pyfunction]
    fn flows_to_arrow<'py>(
        py: Python<'py>,
        payloads: Vec<PyBackedBytes>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        // The decode holds no Python object: other threads run meanwhile.
        let (batch, len) = py
            .detach(|| {
                let batch = crate::flow_record_batch(&payloads)?;
                let len = crate::stream_len(&batch)?;
                Ok((batch, len))
            })
            .map_err(to_py)?;
        // The stream is written straight into the bytes object: one copy of the columns.
        PyBytes::new_with(py, len, |buf| {
            let mut rest: &mut [u8] = buf;
            crate::write_stream(&batch, &mut rest).map_err(to_py)?;
            if rest.is_empty() {
                Ok(())
            } else {
                Err(PyRuntimeError::new_err(
                    "Arrow stream shorter than its dry run",
                ))
            }
        })
    }

    fn to_py(e: CodecError) -> PyErr {
        match e {
            CodecError::Arrow(_) => PyRuntimeError::new_err(e.to_string()),
            _ => PyValueError::new_err(e.to_string()),
        }
    }

    #[pymodule]
    fn arrowcodec(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_function(wrap_pyfunction!(flows_to_arrow, m)?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{UInt32Type, UInt64Type};
    use arrow_array::Array;
    use arrow_ipc::reader::StreamReader;
    use cgloop_proto::samples;
    use cgloop_proto::v1::FlowRecordBatch;

    fn encode(records: Vec<FlowRecord>) -> Vec<u8> {
        FlowRecordBatch { records }.encode_to_vec()
    }

    fn read_stream(bytes: &[u8]) -> Vec<RecordBatch> {
        let reader = StreamReader::try_new(bytes, None).expect("a valid IPC stream");
        reader.map(|b| b.expect("a valid batch")).collect()
    }

    fn col<'a>(batch: &'a RecordBatch, name: &str) -> &'a ArrayRef {
        batch
            .column_by_name(name)
            .unwrap_or_else(|| panic!("no column {name}"))
    }

    #[test]
    fn sample_round_trips_through_the_stream() {
        let sample = samples::sample_flow_record_batch();
        let record = sample.records[0].clone();
        let stream = flows_to_arrow(&[sample.encode_to_vec()]).expect("decodes");
        let batches = read_stream(&stream);
        assert_eq!(batches.len(), 1, "one record batch");
        let b = &batches[0];
        assert_eq!(b.num_rows(), 1);
        assert_eq!(b.num_columns(), 44);
        let h = record.header.as_ref().expect("sample has a header");
        assert_eq!(
            col(b, "header_source_id").as_string::<i32>().value(0),
            h.source_id
        );
        assert_eq!(
            col(b, "header_sequence")
                .as_primitive::<UInt64Type>()
                .value(0),
            h.sequence
        );
        let t = record.five_tuple.as_ref().expect("sample has a five-tuple");
        assert_eq!(
            col(b, "five_tuple_src_addr").as_binary::<i32>().value(0),
            &t.src_addr[..]
        );
        assert_eq!(
            col(b, "five_tuple_dst_port")
                .as_primitive::<UInt32Type>()
                .value(0),
            t.dst_port
        );
        let direction = Direction::try_from(record.direction)
            .expect("valid")
            .as_str_name();
        assert_eq!(col(b, "direction").as_string::<i32>().value(0), direction);
        assert_eq!(
            col(b, "packets").as_primitive::<UInt64Type>().value(0),
            record.packets
        );
        assert_eq!(col(b, "is_final").as_boolean().value(0), record.is_final);
        let hist = col(b, "size_histogram_bytes_buckets")
            .as_list::<i32>()
            .value(0);
        let want = &record
            .size_histogram_bytes
            .as_ref()
            .expect("histogram")
            .buckets;
        assert_eq!(
            hist.as_primitive::<UInt64Type>().values().as_ref(),
            &want[..]
        );
        let rtp = record.rtp.as_ref().expect("sample has RTP");
        assert_eq!(
            col(b, "rtp_jitter_ns")
                .as_primitive::<UInt64Type>()
                .value(0),
            rtp.jitter_ns
        );
        assert_eq!(b.schema().as_ref(), flow_schema().as_ref());
    }

    #[test]
    fn absent_parts_take_the_decoders_defaults() {
        let bare = FlowRecord {
            packets: 3,
            ..Default::default()
        };
        let stream = flows_to_arrow(&[encode(vec![bare])]).expect("decodes");
        let b = &read_stream(&stream)[0];
        assert_eq!(col(b, "header_source_id").as_string::<i32>().value(0), "");
        assert_eq!(
            col(b, "header_sequence")
                .as_primitive::<UInt64Type>()
                .value(0),
            0
        );
        assert_eq!(
            col(b, "five_tuple_src_addr").as_binary::<i32>().value(0),
            b""
        );
        assert_eq!(
            col(b, "direction").as_string::<i32>().value(0),
            "DIRECTION_UNSPECIFIED"
        );
        let sizes = col(b, "size_histogram_bytes_buckets").as_list::<i32>();
        assert!(sizes.is_valid(0), "an empty list, not a null");
        assert_eq!(sizes.value(0).len(), 0);
        assert_eq!(col(b, "rtp_ssrc").as_primitive::<UInt32Type>().value(0), 0);
        assert_eq!(col(b, "packets").as_primitive::<UInt64Type>().value(0), 3);
        assert!(b.columns().iter().all(|c| c.null_count() == 0));
    }

    #[test]
    fn payloads_concatenate_in_order_with_repeated_histograms() {
        let rec = |seq: u64, buckets: Vec<u64>| FlowRecord {
            header: Some(RecordHeader {
                sequence: seq,
                ..Default::default()
            }),
            inter_arrival_histogram_ns: Some(Log2Histogram { buckets }),
            direction: Direction::Ingress as i32,
            ..Default::default()
        };
        let payloads = vec![
            encode(vec![rec(1, vec![1, 2, 3]), rec(2, vec![])]),
            encode(vec![]),
            encode(vec![rec(3, vec![0, 0, 0, 0, 9])]),
        ];
        let b = flow_record_batch(&payloads).expect("decodes");
        let seqs = col(&b, "header_sequence").as_primitive::<UInt64Type>();
        assert_eq!(seqs.values().as_ref(), &[1, 2, 3]);
        let gaps = col(&b, "inter_arrival_histogram_ns_buckets").as_list::<i32>();
        let lists: Vec<Vec<u64>> = (0..3)
            .map(|i| gaps.value(i).as_primitive::<UInt64Type>().values().to_vec())
            .collect();
        assert_eq!(lists, vec![vec![1, 2, 3], vec![], vec![0, 0, 0, 0, 9]]);
        assert_eq!(
            col(&b, "direction").as_string::<i32>().value(2),
            "DIRECTION_INGRESS"
        );
    }

    #[test]
    fn malformed_payload_is_an_error_naming_its_index() {
        let good = samples::sample_flow_record_batch().encode_to_vec();
        // Field 1, wire type 2, length 100 with only 2 bytes behind it.
        let truncated = vec![0x0a, 100, 1, 2];
        let err = flows_to_arrow(&[good.clone(), good.clone(), truncated]).expect_err("bad");
        let text = err.to_string();
        assert!(matches!(err, CodecError::Decode { index: 2, .. }), "{text}");
        assert!(
            text.starts_with("payload 2: not a cgloop.v1.FlowRecordBatch (record 0): "),
            "{text}"
        );
        // Random bytes never panic, whatever they decode to.
        let mut x: u32 = 12345;
        for len in 0..300usize {
            let junk: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            let _ = flows_to_arrow(&[good.as_slice(), junk.as_slice()]);
        }
    }

    /// The reference: prost decodes the whole batch into fresh messages, appended one by one.
    fn reference(payloads: &[Vec<u8>]) -> Option<RecordBatch> {
        let mut cols = FlowColumns::with_capacity(0);
        for p in payloads {
            let batch = FlowRecordBatch::decode(&p[..]).ok()?;
            for r in &batch.records {
                cols.append(r).ok()?;
            }
        }
        cols.finish().ok()
    }

    #[test]
    fn record_at_a_time_decode_equals_whole_batch_decode() {
        // Records that leave out different parts, so a reused record must not leak the
        // previous one's fields; then every single-bit flip of the payload, valid or not.
        let sample = samples::sample_flow_record_batch().records[0].clone();
        let mut no_rtp = sample.clone();
        no_rtp.rtp = None;
        no_rtp.header = None;
        let mut no_tuple = sample.clone();
        no_tuple.five_tuple = None;
        no_tuple.size_histogram_bytes = None;
        no_tuple.interface_name.clear();
        let payload = encode(vec![
            sample.clone(),
            no_rtp,
            FlowRecord::default(),
            no_tuple,
            sample,
        ]);
        let want = reference(std::slice::from_ref(&payload)).expect("valid");
        assert_eq!(
            flow_record_batch(std::slice::from_ref(&payload)).expect("valid"),
            want
        );
        let (mut same, mut rejected) = (0, 0);
        for bit in 0..payload.len() * 8 {
            let mut flipped = payload.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let payloads = [flipped];
            match (flow_record_batch(&payloads), reference(&payloads)) {
                (Ok(got), Some(want)) => {
                    assert_eq!(got, want, "bit {bit}");
                    same += 1;
                }
                (Err(_), None) => rejected += 1,
                (got, want) => panic!("bit {bit}: {got:?} but prost gives {want:?}"),
            }
        }
        assert!(
            same > 100 && rejected > 10,
            "{same} equal, {rejected} rejected"
        );
    }

    #[test]
    fn unknown_direction_is_an_error_not_a_row() {
        let bad = FlowRecord {
            direction: 7,
            ..Default::default()
        };
        let payload = encode(vec![FlowRecord::default(), bad]);
        let err = flows_to_arrow(&[payload]).expect_err("unknown enum value");
        assert!(
            matches!(
                err,
                CodecError::UnknownDirection {
                    index: 0,
                    record: 1,
                    value: 7
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn no_payloads_give_an_empty_stream() {
        let none: [&[u8]; 0] = [];
        let stream = flows_to_arrow(&none).expect("empty is fine");
        let batches = read_stream(&stream);
        assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 0);
        let reader = StreamReader::try_new(&stream[..], None).expect("valid stream");
        assert_eq!(reader.schema().as_ref(), flow_schema().as_ref());
    }
}
