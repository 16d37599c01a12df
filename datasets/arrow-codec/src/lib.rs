//! Decodes `cgloop.v1.FlowRecordBatch` Kafka payloads (prost) into one Arrow IPC stream whose
//! columns are exactly those of the store's Null table `cgloop.flow_ingest`: the protobuf paths
//! of `FlowRecord` joined with `_`, filled as ClickHouse's protobuf decoder fills them (missing
//! nested messages give 0 / empty, enums their proto name). The trace-store sink inserts the
//! stream with `FORMAT ArrowStream`, several times cheaper for ClickHouse than `ProtobufList`.
//!
//! The records are decoded into plain column vectors that a [`FlowEncoder`] keeps from call to
//! call (their memory is warm: no fresh page faults, no arrays built), and the IPC stream is
//! written straight from them: the schema message from `arrow-ipc`, then the record batch
//! message (its flatbuffer from `arrow-ipc`'s generated builders) and the columns, laid out as
//! `arrow-ipc`'s own `StreamWriter` lays them (the tests check the bytes are identical).
//!
//! The Python binding (`cgloop.arrowcodec`, feature `python`) is a thin layer over
//! [`FlowEncoder`]; everything here is plain Rust and tested with `cargo test`.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, Float64Array, ListArray, RecordBatch, StringArray,
    StructArray, UInt32Array, UInt64Array,
};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer, ToByteSlice};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{ArrowError, DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use cgloop_proto::v1::{Direction, RtpStats};
use prost::encoding::{skip_field, DecodeContext, WireType};

/// Most bytes one call may decode: Arrow's utf8/binary/list arrays use 32-bit offsets, and the
/// strings, addresses and histogram values of a batch never outgrow its protobuf encoding.
pub const MAX_TOTAL_BYTES: usize = i32::MAX as usize;

/// How many times its payloads' bytes a call's columns may take (at least
/// [`MIN_COLUMN_LIMIT`]). Real batches take 2-4x (flows ~2.1x, INT ~3.6x); a batch of empty
/// records (2 bytes on the wire, a few hundred bytes of fixed-width columns each) would take
/// ~200x: 6 GB for a 32 MiB sink chunk. Refused before the columns are sized, so the sink sets
/// the chunk aside message by message (its dead letters) instead of allocating that much.
pub const MAX_EXPANSION: usize = 32;
/// The column memory any call may take, whatever its payloads' size.
pub const MIN_COLUMN_LIMIT: usize = 64 << 20;

/// The longest `Direction` name (`DIRECTION_UNSPECIFIED`): bounds the `direction` column's bytes,
/// the one column that can outgrow the protobuf bytes (an empty record is 2 bytes on the wire).
const MAX_DIRECTION_NAME: usize = 21;

/// Why a set of payloads could not become an Arrow stream.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// A payload is not a valid encoding of its batch message (`FlowRecordBatch`,
    /// `IntRecordBatch`; `index` counts from 0; `record` is the record being decoded when it
    /// failed).
    #[error("payload {index}: not a cgloop.v1.{batch} (record {record}): {source}")]
    Decode {
        batch: &'static str,
        index: usize,
        record: usize,
        #[source]
        source: WireError,
    },
    /// A record's enum field (a flow record's `direction`, an INT flow record's `reason`) is no
    /// value of its enum. ClickHouse's protobuf decoder rejects it as well (it has no name to
    /// store), so no row of it can be stored as today.
    #[error(
        "payload {index}, record {record}: {field} {value} is not a cgloop.v1.{enumeration} value"
    )]
    UnknownEnum {
        index: usize,
        record: usize,
        field: &'static str,
        enumeration: &'static str,
        value: i32,
    },
    /// A record the strict decoder every consumer uses (`cgloop.bus.codec.decode_payload`)
    /// refuses: no header, a schema version this build cannot read or that disagrees with the
    /// message's `cgloop-schema-version` header, no source id, an empty envelope. Stored, such a
    /// row would be data no consumer accepts (and an INT row without a source id matches no
    /// view: it would vanish). The words after the payload are the strict decoder's.
    #[error("payload {index}: record {record} ({message}): {check}")]
    Refused {
        index: usize,
        record: usize,
        message: &'static str,
        check: Check,
    },
    /// A payload without a single record (the strict decoder refuses it too).
    #[error("payload {index}: cgloop.v1.{batch} with no records")]
    NoRecords { index: usize, batch: &'static str },
    /// The payloads together exceed what one Arrow record batch can hold.
    #[error(
        "payloads total {total} bytes, more than one Arrow record batch holds \
         ({MAX_TOTAL_BYTES}): insert them in smaller chunks"
    )]
    TooLarge { total: usize },
    /// So many records that their enum names (`direction`, `reason`) outgrow one Arrow
    /// batch's 32-bit offsets.
    #[error(
        "{records} records: their enum names outgrow one Arrow record batch \
         ({MAX_TOTAL_BYTES} bytes a column): insert them in smaller chunks"
    )]
    TooManyRecords { records: usize },
    /// The records are so many for their bytes (nearly empty records) that their fixed-width
    /// columns would take more than [`MAX_EXPANSION`] times the payloads.
    #[error(
        "{records} records in {total} bytes would take {columns} bytes of columns, more than \
         {limit} ({MAX_EXPANSION}x the payloads' bytes, at least {min_mib} MiB): nearly empty \
         records",
        min_mib = MIN_COLUMN_LIMIT >> 20
    )]
    Expands {
        records: usize,
        total: usize,
        columns: usize,
        limit: usize,
    },
    /// Building the Arrow arrays or the IPC stream failed (a bug, not bad input).
    #[error("building the Arrow stream: {0}")]
    Arrow(#[from] ArrowError),
}

impl CodecError {
    /// The index of the payload at fault, when one payload is (the caller can set it aside
    /// and convert the others).
    pub fn payload_index(&self) -> Option<usize> {
        match self {
            CodecError::Decode { index, .. }
            | CodecError::UnknownEnum { index, .. }
            | CodecError::Refused { index, .. }
            | CodecError::NoRecords { index, .. } => Some(*index),
            _ => None,
        }
    }
}

/// What is wrong with a record's header (or envelope), in the strict decoder's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Check {
    #[error("missing header")]
    NoHeader,
    #[error("empty envelope, none of its records is set")]
    EmptyEnvelope,
    #[error(
        "schema_version {0} not readable (this build reads 1..{max})",
        max = cgloop_proto::SCHEMA_VERSION
    )]
    Unreadable(u32),
    #[error("schema_version {version} disagrees with the cgloop-schema-version header {header}")]
    Disagrees { version: u32, header: u32 },
    #[error("header has no source_id")]
    NoSourceId,
}

/// The strict decoder's checks of one record header, in its order: present, a version this
/// build reads, the message's own version (`expected`, when the caller knows it), a source.
#[inline(always)]
fn check_header(
    present: bool,
    version: u32,
    source_id: &[u8],
    expected: Option<u32>,
) -> Result<(), Check> {
    if !present {
        return Err(Check::NoHeader);
    }
    if !(1..=cgloop_proto::SCHEMA_VERSION).contains(&version) {
        return Err(Check::Unreadable(version));
    }
    if let Some(header) = expected {
        if version != header {
            return Err(Check::Disagrees { version, header });
        }
    }
    if source_id.is_empty() {
        return Err(Check::NoSourceId);
    }
    Ok(())
}

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

/// The columns of one ingest table, filled from its topic's batch payloads (one record a row).
/// Each kind (flows, INT) implements it; [`Encoder`] does the rest (sizing, the IPC stream).
pub trait Batch: Column {
    /// The batch message's name, for errors (`FlowRecordBatch`).
    const MESSAGE: &'static str;
    /// The records' enum field and its enum, for errors (`("direction", "Direction")`).
    const ENUM: (&'static str, &'static str);
    /// The most bytes one row adds to a column with 32-bit offsets beyond the payload's own
    /// bytes (an enum's longest name: an absent enum is 0 bytes on the wire).
    const MAX_ROW_EXTRA: usize;
    /// Decodes one payload (payload `index` of the call), appending its records as rows.
    /// `version`: the schema version its Kafka header declares, which every record header must
    /// carry (None: any version this build reads).
    fn append_payload(
        &mut self,
        index: usize,
        payload: &[u8],
        version: Option<u32>,
    ) -> Result<(), CodecError>;
    /// The columns' pieces in IPC order, without the batch's own node (see [`Column::pieces`]).
    fn batch_pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>));
    /// The columns as `arrow-array` arrays (a copy).
    fn batch_arrays(&self) -> Result<Vec<ArrayRef>, ArrowError>;
}

/// Turns payloads into Arrow IPC streams, keeping its column vectors (and their capacity) from
/// one call to the next: after the first call of a size, decoding touches only warm memory.
/// Holds about as many bytes as the largest stream it wrote (the Python module keeps a small
/// pool of them, one taken by each call in flight).
#[derive(Default)]
pub struct Encoder<C> {
    columns: C,
    /// The stream's schema message, written once.
    schema_message: Option<Vec<u8>>,
    /// The bytes a row takes in the fixed-width columns ([`fixed_row_bytes`]), found once.
    row_bytes: Option<usize>,
}

/// Keeps `cgloop.flow_ingest`'s columns from call to call (see [`Encoder`]).
pub type FlowEncoder = Encoder<FlowColumns>;

impl<C: Batch> Encoder<C> {
    pub fn new() -> Self {
        Self::default()
    }

    /// The stream of `payloads` from a new encoder (see [`Encoder::encode_into`]).
    pub fn stream<P: AsRef<[u8]>>(payloads: &[P]) -> Result<Vec<u8>, CodecError> {
        let mut out = Vec::new();
        Self::new().encode_into(payloads, &mut out)?;
        Ok(out)
    }

    /// The records of `payloads` as one Arrow record batch (the stream's columns, built as
    /// `arrow-array` arrays: a copy; the stream is written without them).
    pub fn record_batch<P: AsRef<[u8]>>(payloads: &[P]) -> Result<RecordBatch, CodecError> {
        let mut encoder = Self::new();
        encoder.decode(payloads, None)?;
        to_record_batch(&encoder.columns)
    }

    /// The stream's schema: the ingest table's columns in order.
    pub fn schema() -> SchemaRef {
        batch_schema(&C::default())
    }

    /// Writes the stream of `payloads` (see [`flows_to_arrow`]) into `out`, replacing what it
    /// held; `out` grows only when the stream is larger than its capacity.
    pub fn encode_into<P: AsRef<[u8]>>(
        &mut self,
        payloads: &[P],
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        self.encode_versioned(payloads, None, out)
    }

    /// [`Encoder::encode_into`], each payload's records checked against the schema version
    /// its Kafka header declares (`versions[i]` for payload i; None: any this build reads).
    pub fn encode_versioned<P: AsRef<[u8]>>(
        &mut self,
        payloads: &[P],
        versions: Option<&[u32]>,
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        self.decode(payloads, versions)?;
        if self.schema_message.is_none() {
            self.schema_message = Some(schema_message(&batch_schema(&self.columns))?);
        }
        out.clear();
        let schema = self.schema_message.as_deref().unwrap_or_default();
        out.extend_from_slice(schema);
        write_batch_message(&self.columns, out)?;
        out.extend_from_slice(&CONTINUATION);
        out.extend_from_slice(&0i32.to_le_bytes()); // end of stream
        Ok(())
    }

    /// Decodes every payload into the columns (emptied first).
    fn decode<P: AsRef<[u8]>>(
        &mut self,
        payloads: &[P],
        versions: Option<&[u32]>,
    ) -> Result<(), CodecError> {
        let total: usize = payloads.iter().map(|p| p.as_ref().len()).sum();
        if total > MAX_TOTAL_BYTES {
            return Err(CodecError::TooLarge { total });
        }
        // Room for every record up front: growing the columns (reallocate, copy, fault the new
        // pages in) cost more than decoding into them. Malformed payloads are found by the
        // decode. Every column with offsets but the enum names is bounded by the payload bytes.
        let rows: usize = payloads.iter().map(|p| count_records(p.as_ref())).sum();
        if rows.saturating_mul(C::MAX_ROW_EXTRA) > MAX_TOTAL_BYTES {
            return Err(CodecError::TooManyRecords { records: rows });
        }
        let row_bytes = *self
            .row_bytes
            .get_or_insert_with(|| fixed_row_bytes(&batch_schema(&self.columns)));
        let columns = rows.saturating_mul(row_bytes);
        let limit = total.saturating_mul(MAX_EXPANSION).max(MIN_COLUMN_LIMIT);
        if columns > limit {
            return Err(CodecError::Expands {
                records: rows,
                total,
                columns,
                limit,
            });
        }
        self.columns.reset(rows);
        for (index, payload) in payloads.iter().enumerate() {
            let version = versions.and_then(|v| v.get(index).copied());
            self.columns
                .append_payload(index, payload.as_ref(), version)?;
        }
        Ok(())
    }
}

/// The bytes a row takes in the fixed-width part of `schema`'s columns: values, validity-free
/// booleans as a byte, a 32-bit offset for each string, binary and list (list elements and
/// string bytes come from the payload's own bytes and are not counted).
fn fixed_row_bytes(schema: &Schema) -> usize {
    fn width(t: &DataType) -> usize {
        match t {
            DataType::Utf8 | DataType::Binary | DataType::List(_) => 4,
            DataType::Struct(fields) => fields.iter().map(|f| width(f.data_type())).sum(),
            DataType::Boolean => 1,
            t => t.primitive_width().unwrap_or(8),
        }
    }
    schema.fields().iter().map(|f| width(f.data_type())).sum()
}

/// The columns as one record batch (a copy).
fn to_record_batch<C: Batch>(columns: &C) -> Result<RecordBatch, CodecError> {
    Ok(RecordBatch::try_new(
        batch_schema(columns),
        columns.batch_arrays()?,
    )?)
}

/// The stream's schema: the batch's columns, none nullable.
fn batch_schema<C: Batch>(columns: &C) -> SchemaRef {
    match columns.data_type() {
        DataType::Struct(fields) => Arc::new(Schema::new(fields)),
        _ => Arc::new(Schema::empty()),
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

/// Why one record could not become a row.
enum RowError {
    /// Its encoding (see [`WireError`]).
    Wire(WireError),
    /// Its enum field holds this value, no value of the enum ([`Batch::ENUM`]).
    UnknownEnum(i32),
    /// The strict decoder refuses it (the record's message name, and why).
    Refused(&'static str, Check),
}

impl From<WireError> for RowError {
    fn from(e: WireError) -> Self {
        RowError::Wire(e)
    }
}

/// Walks one batch payload (payload `index` of the call): `row` gets each record's body in
/// order (field 1); other fields are skipped, as protobuf decoders skip a newer producer's.
#[inline(always)]
fn for_each_record<'p, C: Batch>(
    index: usize,
    payload: &'p [u8],
    mut row: impl FnMut(&'p [u8]) -> Result<(), RowError>,
) -> Result<(), CodecError> {
    let mut buf = payload;
    let mut record = 0;
    let decode_error = |record, source| CodecError::Decode {
        batch: C::MESSAGE,
        index,
        record,
        source,
    };
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf).map_err(|e| decode_error(record, e))?;
        if tag == BATCH_RECORDS {
            let at = FieldAt {
                message: C::MESSAGE,
                field: "records",
                wire_type,
            };
            let body = at.bytes(&mut buf).map_err(|e| decode_error(record, e))?;
            row(body).map_err(|e| match e {
                RowError::Wire(source) => decode_error(record, source),
                RowError::UnknownEnum(value) => CodecError::UnknownEnum {
                    index,
                    record,
                    field: C::ENUM.0,
                    enumeration: C::ENUM.1,
                    value,
                },
                RowError::Refused(message, check) => CodecError::Refused {
                    index,
                    record,
                    message,
                    check,
                },
            })?;
            record += 1;
        } else {
            // The strict decoder refuses a field its batch type does not have (a batch of
            // another type often parses as this one otherwise).
            return Err(decode_error(
                record,
                unknown(C::MESSAGE, tag, wire_type, &mut buf),
            ));
        }
    }
    if record == 0 {
        return Err(CodecError::NoRecords {
            index,
            batch: C::MESSAGE,
        });
    }
    Ok(())
}

/// How many records a batch payload holds (its field-1 keys; stops quietly at
/// anything malformed, which the decode then reports). Only sizes the columns.
fn count_records(payload: &[u8]) -> usize {
    let mut buf = payload;
    let mut n = 0;
    while !buf.is_empty() {
        if take_key(&mut buf, BATCH_RECORDS, LENGTH_DELIMITED) {
            let (len, at) = varint_at(buf);
            match buf
                .get(at..)
                .and_then(|rest| rest.get(len.try_into().ok()?..))
            {
                Some(rest) if at > 0 => buf = rest,
                _ => break,
            }
            n += 1;
        } else {
            // Anything else, with the general rules.
            let Ok((tag, wire_type)) = key(&mut buf) else {
                break;
            };
            if skip(tag, wire_type, &mut buf).is_err() {
                break;
            }
            n += usize::from(tag == BATCH_RECORDS);
        }
    }
    n
}

/// The field number of a batch's records (`FlowRecordBatch.records`, `IntRecordBatch.records`).
const BATCH_RECORDS: u32 = 1;

// ---- The IPC stream, written from the columns -------------------------------------------------

/// `arrow-ipc`'s default alignment (`IpcWriteOptions`): every buffer and the metadata padded to 64.
const ALIGNMENT: usize = 64;
const CONTINUATION: [u8; 4] = [0xff; 4];

fn padded(len: usize) -> usize {
    len.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// The stream's first message (the schema), as `arrow-ipc`'s `StreamWriter` writes it.
fn schema_message(schema: &Schema) -> Result<Vec<u8>, CodecError> {
    let writer = StreamWriter::try_new(Vec::new(), schema)?;
    Ok(writer.get_ref().clone())
}

/// What one column is made of in IPC order: field nodes and buffers (V5, no nulls: each
/// validity buffer is empty, as `arrow-ipc` writes it when the null count is 0).
pub enum Piece<'a> {
    Node(usize),
    NoValidity,
    Bytes(&'a [u8]),
    /// A boolean column: one bit a value, least significant first.
    Bits(&'a [bool]),
}

impl Piece<'_> {
    fn body_len(&self) -> usize {
        match self {
            Piece::Node(_) | Piece::NoValidity => 0,
            Piece::Bytes(b) => b.len(),
            Piece::Bits(b) => b.len().div_ceil(8),
        }
    }
}

/// Writes the record batch message (continuation, length, flatbuffer metadata, body) of
/// `columns` into `out`, copying each column once; `out` is reserved for all of it first.
fn write_batch_message<C: Batch>(columns: &C, out: &mut Vec<u8>) -> Result<(), CodecError> {
    // Layout: where each buffer sits in the body.
    let mut nodes = Vec::with_capacity(48);
    let mut buffers = Vec::with_capacity(96);
    let mut offset = 0usize;
    // The 32-bit offsets were pushed unchecked: `decode` bounds every column by the payloads'
    // bytes (and `direction` by the record count), so this never fails; a bug if it does.
    if !columns.offsets_fit() {
        return Err(ArrowError::ComputeError("a column outgrew its 32-bit offsets".into()).into());
    }
    columns.batch_pieces(&mut |piece| match piece {
        Piece::Node(len) => nodes.push(arrow_ipc::FieldNode::new(len as i64, 0)),
        piece => {
            let len = piece.body_len();
            buffers.push(arrow_ipc::Buffer::new(offset as i64, len as i64));
            offset += padded(len);
        }
    });
    let body_len = offset;

    // The metadata, built as `arrow-ipc`'s writer builds it (same fields, same order).
    let mut fbb = flatbuffers::FlatBufferBuilder::new();
    let buffers = fbb.create_vector(&buffers);
    let nodes = fbb.create_vector(&nodes);
    let batch = {
        let mut b = arrow_ipc::RecordBatchBuilder::new(&mut fbb);
        b.add_length(columns.len() as i64);
        b.add_nodes(nodes);
        b.add_buffers(buffers);
        b.finish().as_union_value()
    };
    let root = {
        let mut m = arrow_ipc::MessageBuilder::new(&mut fbb);
        m.add_version(arrow_ipc::MetadataVersion::V5);
        m.add_header_type(arrow_ipc::MessageHeader::RecordBatch);
        m.add_bodyLength(body_len as i64);
        m.add_header(batch);
        m.finish()
    };
    fbb.finish(root, None);
    let metadata = fbb.finished_data();
    let header_len = padded(CONTINUATION.len() + 4 + metadata.len());

    // Sized exactly (with the end-of-stream marker): no reallocation while the columns are
    // copied in.
    out.reserve(header_len + body_len + 8);
    out.extend_from_slice(&CONTINUATION);
    out.extend_from_slice(&((header_len - 8) as i32).to_le_bytes());
    out.extend_from_slice(metadata);
    let body_start = out.len() + (header_len - 8 - metadata.len());
    out.resize(body_start, 0);
    columns.batch_pieces(&mut |piece| {
        match piece {
            Piece::Node(_) | Piece::NoValidity => return,
            Piece::Bytes(b) => out.extend_from_slice(b),
            Piece::Bits(bits) => out.extend(bits.chunks(8).map(|byte| {
                byte.iter()
                    .enumerate()
                    .fold(0u8, |acc, (i, &bit)| acc | (u8::from(bit) << i))
            })),
        }
        let end = body_start + padded(out.len() - body_start);
        out.resize(end, 0);
    });
    Ok(())
}

// ---- The columns ------------------------------------------------------------------------------

/// A column of an ingest table as plain vectors, emptied (capacity kept) between calls.
pub trait Column: Default {
    /// Empties the column and makes room for `rows` rows.
    fn reset(&mut self, rows: usize);
    /// Its rows.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Its Arrow type (never nullable).
    fn data_type(&self) -> DataType;
    /// Its field nodes and buffers, in IPC order.
    fn pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>));
    /// The column as an `arrow-array` array (a copy).
    fn to_array(&self) -> Result<ArrayRef, ArrowError>;
    /// Whether its 32-bit offsets (if it has any) stayed in range.
    fn offsets_fit(&self) -> bool {
        true
    }
}

/// A fixed-width column's values: their bytes as they are in memory (little-endian).
fn bytes<T>(values: &[T]) -> Piece<'_>
where
    [T]: ToByteSlice,
{
    Piece::Bytes(values.to_byte_slice())
}

/// A boolean column's values: one bit each.
fn bits(values: &[bool]) -> Piece<'_> {
    Piece::Bits(values)
}

/// Fixed-width columns: a vector of values, its data buffer made by `$piece`.
macro_rules! primitive_column {
    ($($t:ty => $data_type:ident, $array:ident, $piece:ident;)*) => {$(
        impl Column for Vec<$t> {
            fn reset(&mut self, rows: usize) {
                self.clear();
                self.reserve(rows);
            }
            fn len(&self) -> usize {
                Vec::len(self)
            }
            fn data_type(&self) -> DataType {
                DataType::$data_type
            }
            fn pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>)) {
                f(Piece::Node(Vec::len(self)));
                f(Piece::NoValidity);
                f($piece(self));
            }
            fn to_array(&self) -> Result<ArrayRef, ArrowError> {
                Ok(Arc::new($array::from(self.clone())))
            }
        }
    )*};
}

primitive_column! {
    u32 => UInt32, UInt32Array, bytes;
    u64 => UInt64, UInt64Array, bytes;
    f64 => Float64, Float64Array, bytes;
    bool => Boolean, BooleanArray, bits;
}

/// Variable-length values (`utf8` when `UTF8`, else `binary`): offsets and bytes.
struct Var<const UTF8: bool> {
    offsets: Vec<i32>,
    data: Vec<u8>,
    /// Bytes a row to make room for.
    hint: usize,
}

type Utf8 = Var<true>;
type Binary = Var<false>;

impl<const UTF8: bool> Default for Var<UTF8> {
    fn default() -> Self {
        Self {
            offsets: vec![0],
            data: Vec::new(),
            hint: 16,
        }
    }
}

impl<const UTF8: bool> Var<UTF8> {
    fn with_hint(hint: usize) -> Self {
        Self {
            hint,
            ..Self::default()
        }
    }
    /// Appends one value. The byte count fits the offsets: `decode` bounds every column by
    /// the payloads' bytes, and `write_batch_message` checks it again.
    fn push(&mut self, value: &[u8]) {
        self.data.extend_from_slice(value);
        self.offsets.push(self.data.len() as i32);
    }
}

impl<const UTF8: bool> Column for Var<UTF8> {
    fn len(&self) -> usize {
        self.offsets.len() - 1
    }
    fn reset(&mut self, rows: usize) {
        self.offsets.clear();
        self.offsets.reserve(rows + 1);
        self.offsets.push(0);
        self.data.clear();
        self.data.reserve(rows * self.hint);
    }
    fn data_type(&self) -> DataType {
        if UTF8 {
            DataType::Utf8
        } else {
            DataType::Binary
        }
    }
    fn pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>)) {
        f(Piece::Node(self.len()));
        f(Piece::NoValidity);
        f(Piece::Bytes(self.offsets.to_byte_slice()));
        f(Piece::Bytes(&self.data));
    }
    fn to_array(&self) -> Result<ArrayRef, ArrowError> {
        let offsets = OffsetBuffer::new(ScalarBuffer::from(self.offsets.clone()));
        let data = Buffer::from_vec(self.data.clone());
        Ok(if UTF8 {
            Arc::new(StringArray::try_new(offsets, data, None)?)
        } else {
            Arc::new(BinaryArray::try_new(offsets, data, None)?)
        })
    }
    fn offsets_fit(&self) -> bool {
        self.data.len() <= i32::MAX as usize
    }
}

/// `list<item>` of any column (histogram buckets, path switch ids, INT hops), never null:
/// offsets, then the items as a column of their own.
pub struct List<C> {
    offsets: Vec<i32>,
    values: C,
    /// Items a row to make room for.
    per_row: usize,
}

type U64List = List<Vec<u64>>;

impl<C: Column> Default for List<C> {
    fn default() -> Self {
        Self {
            offsets: vec![0],
            values: C::default(),
            // 32 buckets a row (2^32 ns, 4 GB): more only grows the values.
            per_row: 32,
        }
    }
}

impl<C: Column> List<C> {
    fn with_per_row(per_row: usize) -> Self {
        Self {
            per_row,
            ..Self::default()
        }
    }
    /// Ends the current row's list (its items were appended to `values`). The item count fits
    /// the offsets: `decode` bounds it by the payloads' bytes (`write_batch_message` checks).
    fn close(&mut self) {
        self.offsets.push(self.values.len() as i32);
    }
    fn item(&self) -> FieldRef {
        // Items are never null, as in ClickHouse's Array(UInt64) or Array(Tuple(...)).
        Arc::new(Field::new_list_field(self.values.data_type(), false))
    }
}

impl<C: Column> Column for List<C> {
    fn reset(&mut self, rows: usize) {
        self.offsets.clear();
        self.offsets.reserve(rows + 1);
        self.offsets.push(0);
        self.values.reset(rows * self.per_row);
    }
    fn len(&self) -> usize {
        self.offsets.len() - 1
    }
    fn data_type(&self) -> DataType {
        DataType::List(self.item())
    }
    fn pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>)) {
        f(Piece::Node(self.len()));
        f(Piece::NoValidity);
        f(Piece::Bytes(self.offsets.to_byte_slice()));
        self.values.pieces(f);
    }
    fn to_array(&self) -> Result<ArrayRef, ArrowError> {
        let offsets = OffsetBuffer::new(ScalarBuffer::from(self.offsets.clone()));
        Ok(Arc::new(ListArray::try_new(
            self.item(),
            offsets,
            self.values.to_array()?,
            None,
        )?))
    }
    fn offsets_fit(&self) -> bool {
        self.values.len() <= i32::MAX as usize && self.values.offsets_fit()
    }
}

/// Columns as one struct (a Rust struct of columns, in the table's order): a record batch's
/// columns, or a `struct` column (ClickHouse's named `Tuple`). The struct, its reset, its
/// fields and its IPC pieces all come from the one list.
macro_rules! columns {
    ($(#[$meta:meta])* $vis:vis struct $name:ident {
        $($col:ident: $ty:ty $(= $init:expr)?,)*
    }) => {
        $(#[$meta])*
        $vis struct $name {
            rows: usize,
            $($col: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    rows: 0,
                    $($col: columns!(@init $ty $(= $init)?),)*
                }
            }
        }

        impl $name {
            /// The columns' pieces, in order.
            fn column_pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>)) {
                $(self.$col.pieces(f);)*
            }

            fn fields(&self) -> Fields {
                Fields::from(vec![
                    $(Field::new(stringify!($col), self.$col.data_type(), false),)*
                ])
            }

            fn arrays(&self) -> Result<Vec<ArrayRef>, ArrowError> {
                Ok(vec![$(self.$col.to_array()?,)*])
            }
        }

        impl Column for $name {
            fn reset(&mut self, rows: usize) {
                self.rows = 0;
                $(self.$col.reset(rows);)*
            }
            fn len(&self) -> usize {
                self.rows
            }
            fn data_type(&self) -> DataType {
                DataType::Struct(self.fields())
            }
            fn pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>)) {
                f(Piece::Node(self.rows));
                f(Piece::NoValidity);
                self.column_pieces(f);
            }
            fn to_array(&self) -> Result<ArrayRef, ArrowError> {
                Ok(Arc::new(StructArray::try_new(self.fields(), self.arrays()?, None)?))
            }
            fn offsets_fit(&self) -> bool {
                true $(&& self.$col.offsets_fit())*
            }
        }
    };
    (@init $ty:ty = $init:expr) => { $init };
    (@init $ty:ty) => { <$ty>::default() };
}

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
    fn push_row(&mut self, r: &Row) -> Result<(), i32> {
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

// The INT records (after `columns!`, which they use).
mod int;
pub use int::{int_to_arrow, HopColumns, IntColumns, IntEncoder};

// ---- The protobuf wire decoder ----------------------------------------------------------------

/// What is wrong with a payload's protobuf encoding (the rules, and for the common faults the
/// words, of prost's decoder, which `record_at_a_time_decode_equals_prost` checks bit by bit).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("invalid varint")]
    Varint,
    #[error("invalid key value: {0}")]
    Key(u64),
    #[error("invalid tag value: 0")]
    Tag,
    #[error("{message}.{field}: invalid wire type {got} (expected {want})")]
    WireType {
        message: &'static str,
        field: &'static str,
        got: u8,
        want: u8,
    },
    #[error("{message}.{field}: buffer underflow")]
    Underflow {
        message: &'static str,
        field: &'static str,
    },
    #[error("{message}.{field}: invalid string value: data is not UTF-8 encoded")]
    Utf8 {
        message: &'static str,
        field: &'static str,
    },
    /// A field its message does not have: the strict decoder every consumer uses refuses it
    /// (a batch of another type shows up as such fields), so the sink does too.
    #[error("{message}: unknown field {tag}")]
    Unknown { message: &'static str, tag: u32 },
    /// prost's own decoder: skipping an unknown field (`skip_field`), or a message decoded
    /// with prost (the INT records).
    #[error(transparent)]
    Prost(#[from] prost::DecodeError),
}

const VARINT: u8 = 0;
const LENGTH_DELIMITED: u8 = 2;

/// A base-128 varint (prost's rules: at most 10 bytes, the 10th at most 1).
#[inline(always)]
fn varint(buf: &mut &[u8]) -> Result<u64, WireError> {
    let (value, len) = varint_at(buf);
    match buf.get(len..) {
        Some(rest) if len > 0 => {
            *buf = rest;
            Ok(value)
        }
        _ => Err(WireError::Varint),
    }
}

/// The varint at the front of `buf` and its length in bytes (0: not a valid varint). Inline,
/// returned in registers: the cursor stays in a register too (a call taking `&mut &[u8]` sent
/// it through memory on every field, one long chain of dependent loads and stores).
#[inline(always)]
fn varint_at(buf: &[u8]) -> (u64, usize) {
    if let Some(&b) = buf.first() {
        if b < 0x80 {
            return (u64::from(b), 1);
        }
    }
    // With 10 bytes left, the first 8 are read as one word and their 7-bit groups gathered
    // without a branch a byte; near the end, a byte at a time.
    if let (Some(word), true) = (buf.first_chunk::<8>(), buf.len() >= 10) {
        let word = u64::from_le_bytes(*word);
        let ends = !word & 0x8080_8080_8080_8080;
        if ends != 0 {
            let len = (ends.trailing_zeros() / 8 + 1) as usize;
            let kept = if len == 8 {
                word
            } else {
                word & ((1u64 << (8 * len)) - 1)
            };
            return (gather7(kept), len);
        }
        let value = gather7(word) | (u64::from(buf[8] & 0x7f) << 56);
        if buf[8] < 0x80 {
            return (value, 9);
        }
        if buf[9] > 1 {
            return (0, 0);
        }
        return (value | (u64::from(buf[9]) << 63), 10);
    }
    varint_bytewise(buf)
}

/// The 7-bit groups of up to 8 little-endian varint bytes, gathered into one value.
#[inline(always)]
fn gather7(word: u64) -> u64 {
    let x = word & 0x7f7f_7f7f_7f7f_7f7f;
    let x = (x & 0x007f_007f_007f_007f) | ((x & 0x7f00_7f00_7f00_7f00) >> 1);
    let x = (x & 0x0000_3fff_0000_3fff) | ((x & 0x3fff_0000_3fff_0000) >> 2);
    (x & 0x0000_0000_0fff_ffff) | ((x & 0x0fff_ffff_0000_0000) >> 4)
}

#[inline(never)]
fn varint_bytewise(buf: &[u8]) -> (u64, usize) {
    let mut value = 0u64;
    for (i, &b) in buf.iter().take(10).enumerate() {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            if i == 9 && b > 1 {
                return (0, 0);
            }
            return (value, i + 1);
        }
    }
    (0, 0)
}

/// A field key: (tag, wire type), checked as prost checks it.
#[inline(always)]
fn key(buf: &mut &[u8]) -> Result<(u32, u8), WireError> {
    let key = varint(buf)?;
    if key > u64::from(u32::MAX) {
        return Err(WireError::Key(key));
    }
    let tag = (key >> 3) as u32;
    if tag == 0 {
        return Err(WireError::Tag);
    }
    // Wire types 6 and 7 are no wire type: `skip` reports them (prost's error), as no known
    // field takes them.
    Ok((tag, (key & 7) as u8))
}

/// The error for field `tag` that `message` does not have: the field's own encoding error
/// first, as a decoder that skipped it would report (prost's rules), else `Unknown`.
#[inline(never)]
fn unknown(message: &'static str, tag: u32, wire_type: u8, buf: &mut &[u8]) -> WireError {
    match skip(tag, wire_type, buf) {
        Err(e) => e,
        Ok(()) => WireError::Unknown { message, tag },
    }
}

/// Skips a field's value with prost's own rules.
#[inline(never)]
fn skip(tag: u32, wire_type: u8, buf: &mut &[u8]) -> Result<(), WireError> {
    let wire_type = WireType::try_from(u64::from(wire_type))?;
    skip_field(wire_type, tag, buf, DecodeContext::default())?;
    Ok(())
}

/// One field's wire reader: its name (for errors) and the wire type it arrived with.
#[derive(Clone, Copy)]
struct FieldAt {
    message: &'static str,
    field: &'static str,
    wire_type: u8,
}

impl FieldAt {
    fn expect(self, want: u8) -> Result<(), WireError> {
        if self.wire_type == want {
            Ok(())
        } else {
            Err(WireError::WireType {
                message: self.message,
                field: self.field,
                got: self.wire_type,
                want,
            })
        }
    }

    #[inline(always)]
    fn u64(self, buf: &mut &[u8]) -> Result<u64, WireError> {
        self.expect(VARINT)?;
        varint(buf)
    }

    /// uint32, as prost reads it: the varint truncated.
    #[inline(always)]
    fn u32(self, buf: &mut &[u8]) -> Result<u32, WireError> {
        Ok(self.u64(buf)? as u32)
    }

    #[inline(always)]
    fn bytes<'a>(self, buf: &mut &'a [u8]) -> Result<&'a [u8], WireError> {
        self.expect(LENGTH_DELIMITED)?;
        let len = varint(buf)?;
        if len > buf.len() as u64 {
            return Err(WireError::Underflow {
                message: self.message,
                field: self.field,
            });
        }
        let (value, rest) = buf.split_at(len as usize);
        *buf = rest;
        Ok(value)
    }

    fn string<'a>(self, buf: &mut &'a [u8]) -> Result<&'a [u8], WireError> {
        let value = self.bytes(buf)?;
        // Names and ids are ASCII: checked a word at a time, the UTF-8 rules only otherwise.
        if value.is_ascii() {
            return Ok(value);
        }
        match std::str::from_utf8(value) {
            Ok(_) => Ok(value),
            Err(_) => Err(WireError::Utf8 {
                message: self.message,
                field: self.field,
            }),
        }
    }

    /// A repeated uint64, packed or not: its values are appended to `values`.
    fn repeated_u64(self, buf: &mut &[u8], values: &mut Vec<u64>) -> Result<(), WireError> {
        if self.wire_type == LENGTH_DELIMITED {
            let mut packed = self.bytes(buf)?;
            while !packed.is_empty() {
                values.push(varint(&mut packed)?);
            }
            Ok(())
        } else {
            values.push(self.u64(buf)?);
            Ok(())
        }
    }
}

/// One `FlowRecord` as its row: scalars, and strings/bytes borrowed from the payload. Absent
/// fields and nested messages stay 0 / empty, as ClickHouse's decoder fills them; a field or
/// nested message that comes again is merged as protobuf merges (the last scalar wins).
#[derive(Default)]
struct Row<'a> {
    /// Field 1 came (even empty): the strict decoder's `HasField("header")`.
    has_header: bool,
    header_schema_version: u32,
    header_source_id: &'a [u8],
    header_sequence: u64,
    header_timestamp_ns: u64,
    five_tuple_src_addr: &'a [u8],
    five_tuple_dst_addr: &'a [u8],
    five_tuple_src_port: u32,
    five_tuple_dst_port: u32,
    five_tuple_ip_protocol: u32,
    direction: i32,
    vlan_id: u32,
    ifindex: u32,
    interface_name: &'a [u8],
    interval_start_ns: u64,
    interval_end_ns: u64,
    is_final: bool,
    packets: u64,
    bytes: u64,
    first_seen_ns: u64,
    last_seen_ns: u64,
    size_min_bytes: u32,
    size_max_bytes: u32,
    size_sum_bytes: u64,
    size_sum_squares_bytes2: u64,
    max_burst_packets: u32,
    burst_count: u32,
    ecn_not_ect_packets: u64,
    ecn_ect0_packets: u64,
    ecn_ect1_packets: u64,
    ecn_ce_packets: u64,
    last_dscp: u32,
    tcp_flags_seen: u32,
    rtp: RtpStats,
}

/// Takes the key of field `tag` with wire type `wire_type` off the front of `buf` when it is
/// there, canonically encoded (tags below 2048); anything else is left to `key`.
#[inline(always)]
fn take_key(buf: &mut &[u8], tag: u32, wire_type: u8) -> bool {
    let key = (tag << 3) | u32::from(wire_type);
    let taken = if key < 0x80 {
        buf.first() == Some(&(key as u8))
    } else {
        buf.len() >= 2 && buf[0] == (key as u8 & 0x7f) | 0x80 && u32::from(buf[1]) == key >> 7
    };
    if taken {
        *buf = &buf[if key < 0x80 { 1 } else { 2 }..];
    }
    taken
}

/// Decodes a whole message body `$b` with `$field` (one field: its tag, wire type and the rest
/// of the body): first the fields listed, in that order, each when its key comes next (see
/// `decode_record`; an absent field is just not there), then whatever remains, in any order.
macro_rules! decode_fields {
    ($b:ident, |$tag:ident, $wt:ident, $bb:ident| $field:expr; $($t:literal $w:ident),* $(,)?) => {
        $(
            if take_key($b, $t, $w) {
                let ($tag, $wt, $bb) = ($t, $w, &mut *$b);
                $field?;
            }
        )*
        while !$b.is_empty() {
            let ($tag, $wt) = key($b)?;
            let $bb = &mut *$b;
            $field?;
        }
    };
}

/// Decodes one `FlowRecord` message body into a row; its histogram buckets go straight into
/// the list columns' values (the row's offsets are closed by `FlowColumns::push_row`).
fn decode_record<'a>(mut buf: &'a [u8], cols: &mut FlowColumns) -> Result<Row<'a>, WireError> {
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

#[cfg(feature = "python")]
mod python {
    //! `cgloop.arrowcodec`: the Python face of [`crate::FlowEncoder`] and [`crate::IntEncoder`].

    use std::os::raw::{c_int, c_void};
    use std::sync::{Mutex, PoisonError};

    use pyo3::create_exception;
    use pyo3::exceptions::{PyRuntimeError, PyValueError};
    use pyo3::ffi;
    use pyo3::prelude::*;
    use pyo3::pybacked::PyBackedBytes;
    use pyo3::types::PyMemoryView;

    use crate::{Batch, CodecError, Encoder, FlowEncoder, IntEncoder};

    /// Idle encoders (warm column vectors) and idle stream buffers, taken by the next calls: a
    /// call then touches no fresh memory (page faults of fresh buffers were ~40% of a call).
    /// At most `KEEP_IDLE` of each are kept; a stream buffer only up to `KEEP_MAX_BYTES`.
    static FLOW_ENCODERS: Mutex<Vec<FlowEncoder>> = Mutex::new(Vec::new());
    static INT_ENCODERS: Mutex<Vec<IntEncoder>> = Mutex::new(Vec::new());
    static STREAMS: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
    const KEEP_IDLE: usize = 2;
    const KEEP_MAX_BYTES: usize = 1 << 30;

    fn take<T>(pool: &Mutex<Vec<T>>) -> Option<T> {
        pool.lock().unwrap_or_else(PoisonError::into_inner).pop()
    }

    fn give<T>(pool: &Mutex<Vec<T>>, item: T) {
        let mut idle = pool.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < KEEP_IDLE {
            idle.push(item);
        }
    }

    /// The bytes of one stream, owned by Rust, read through the buffer protocol (read-only).
    /// Its buffer goes back to the pool when the last view of it is released.
    #[pyclass(frozen, module = "cgloop.arrowcodec")]
    struct ArrowStream {
        data: Vec<u8>,
    }

    #[pymethods]
    impl ArrowStream {
        unsafe fn __getbuffer__(
            slf: Bound<'_, Self>,
            view: *mut ffi::Py_buffer,
            flags: c_int,
        ) -> PyResult<()> {
            let data = &slf.get().data;
            // SAFETY: `data` is neither changed nor freed while the object lives (a frozen
            // class, no method takes it mutably), and the view holds a reference to the object
            // (`PyBuffer_FillInfo` sets `view.obj`), so the pointer stays valid for the view.
            // Read-only: a request for a writable buffer fails with BufferError.
            let filled = unsafe {
                ffi::PyBuffer_FillInfo(
                    view,
                    slf.as_ptr(),
                    data.as_ptr() as *mut c_void,
                    data.len() as ffi::Py_ssize_t,
                    1,
                    flags,
                )
            };
            if filled == -1 {
                Err(PyErr::fetch(slf.py()))
            } else {
                Ok(())
            }
        }

        fn __len__(&self) -> usize {
            self.data.len()
        }
    }

    impl Drop for ArrowStream {
        fn drop(&mut self) {
            let data = std::mem::take(&mut self.data);
            if data.capacity() <= KEEP_MAX_BYTES {
                give(&STREAMS, data);
            }
        }
    }

    create_exception!(
        arrowcodec,
        PayloadError,
        PyValueError,
        "One payload is refused: `index` is its position in the call (set it aside and \
         convert the others); the text names it and what is wrong."
    );

    /// Decode Kafka payloads of cgloop.flows.v1 (each a FlowRecordBatch) into one Arrow IPC
    /// stream shaped like cgloop.flow_ingest, returned as a read-only memoryview. Raises
    /// PayloadError (a ValueError) with the bad payload's index.
    #[pyfunction]
    #[pyo3(signature = (payloads, schema_versions=None))]
    fn flows_to_arrow<'py>(
        py: Python<'py>,
        payloads: Vec<PyBackedBytes>,
        schema_versions: Option<Vec<u32>>,
    ) -> PyResult<Bound<'py, PyMemoryView>> {
        to_stream(py, &payloads, schema_versions, &FLOW_ENCODERS)
    }

    /// Decode Kafka payloads of cgloop.int.v1 (each an IntRecordBatch) into one Arrow IPC
    /// stream shaped like cgloop.int_ingest, returned as a read-only memoryview. Raises
    /// PayloadError (a ValueError) with the bad payload's index.
    #[pyfunction]
    #[pyo3(signature = (payloads, schema_versions=None))]
    fn int_to_arrow<'py>(
        py: Python<'py>,
        payloads: Vec<PyBackedBytes>,
        schema_versions: Option<Vec<u32>>,
    ) -> PyResult<Bound<'py, PyMemoryView>> {
        to_stream(py, &payloads, schema_versions, &INT_ENCODERS)
    }

    /// One call: an idle encoder of the kind and an idle stream buffer from the pools, the
    /// stream written without the GIL, handed out as a memoryview over the buffer.
    fn to_stream<'py, C: Batch + Send>(
        py: Python<'py>,
        payloads: &[PyBackedBytes],
        versions: Option<Vec<u32>>,
        encoders: &'static Mutex<Vec<Encoder<C>>>,
    ) -> PyResult<Bound<'py, PyMemoryView>> {
        if let Some(v) = &versions {
            if v.len() != payloads.len() {
                return Err(PyValueError::new_err(format!(
                    "{} schema_versions for {} payloads: one a payload expected",
                    v.len(),
                    payloads.len()
                )));
            }
        }
        // The whole conversion holds no Python object: other threads run meanwhile.
        let data = py
            .detach(|| {
                let mut encoder = take(encoders).unwrap_or_default();
                let mut out = take(&STREAMS).unwrap_or_default();
                let written = encoder.encode_versioned(payloads, versions.as_deref(), &mut out);
                give(encoders, encoder);
                match written {
                    Ok(()) => Ok(out),
                    Err(e) => {
                        give(&STREAMS, out);
                        Err(e)
                    }
                }
            })
            .map_err(|e| to_py(py, e))?;
        let stream = Bound::new(py, ArrowStream { data })?;
        PyMemoryView::from(stream.as_any())
    }

    fn to_py(py: Python<'_>, e: CodecError) -> PyErr {
        if let CodecError::Arrow(_) = e {
            return PyRuntimeError::new_err(e.to_string());
        }
        let Some(index) = e.payload_index() else {
            return PyValueError::new_err(e.to_string());
        };
        let err = PayloadError::new_err(e.to_string());
        match err.value(py).setattr("index", index) {
            Ok(()) => err,
            Err(failed) => failed,
        }
    }

    #[pymodule]
    fn arrowcodec(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_class::<ArrowStream>()?;
        m.add("PayloadError", m.py().get_type::<PayloadError>())?;
        m.add_function(wrap_pyfunction!(flows_to_arrow, m)?)?;
        m.add_function(wrap_pyfunction!(int_to_arrow, m)?)?;
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
    use cgloop_proto::v1::{FiveTuple, FlowRecord, FlowRecordBatch, Log2Histogram, RecordHeader};
    use prost::Message;

    impl FlowColumns {
        /// The reference path: one record as prost decoded it, as one row.
        fn append(&mut self, r: &FlowRecord) -> Result<(), i32> {
            let h = r.header.clone().unwrap_or_default();
            let t = r.five_tuple.clone().unwrap_or_default();
            let none = Log2Histogram::default();
            let sizes = r.size_histogram_bytes.as_ref().unwrap_or(&none);
            let gaps = r.inter_arrival_histogram_ns.as_ref().unwrap_or(&none);
            self.size_histogram_bytes_buckets
                .values
                .extend(&sizes.buckets);
            self.inter_arrival_histogram_ns_buckets
                .values
                .extend(&gaps.buckets);
            let row = Row {
                has_header: r.header.is_some(),
                header_schema_version: h.schema_version,
                header_source_id: h.source_id.as_bytes(),
                header_sequence: h.sequence,
                header_timestamp_ns: h.timestamp_ns,
                five_tuple_src_addr: &t.src_addr,
                five_tuple_dst_addr: &t.dst_addr,
                five_tuple_src_port: t.src_port,
                five_tuple_dst_port: t.dst_port,
                five_tuple_ip_protocol: t.ip_protocol,
                direction: r.direction,
                vlan_id: r.vlan_id,
                ifindex: r.ifindex,
                interface_name: r.interface_name.as_bytes(),
                interval_start_ns: r.interval_start_ns,
                interval_end_ns: r.interval_end_ns,
                is_final: r.is_final,
                packets: r.packets,
                bytes: r.bytes,
                first_seen_ns: r.first_seen_ns,
                last_seen_ns: r.last_seen_ns,
                size_min_bytes: r.size_min_bytes,
                size_max_bytes: r.size_max_bytes,
                size_sum_bytes: r.size_sum_bytes,
                size_sum_squares_bytes2: r.size_sum_squares_bytes2,
                max_burst_packets: r.max_burst_packets,
                burst_count: r.burst_count,
                ecn_not_ect_packets: r.ecn_not_ect_packets,
                ecn_ect0_packets: r.ecn_ect0_packets,
                ecn_ect1_packets: r.ecn_ect1_packets,
                ecn_ce_packets: r.ecn_ce_packets,
                last_dscp: r.last_dscp,
                tcp_flags_seen: r.tcp_flags_seen,
                rtp: r.rtp.unwrap_or_default(),
            };
            self.push_row(&row)
        }
    }

    fn encode(records: Vec<FlowRecord>) -> Vec<u8> {
        FlowRecordBatch { records }.encode_to_vec()
    }

    /// A header the strict checks accept (version 1, a source id).
    fn header(sequence: u64) -> Option<RecordHeader> {
        Some(RecordHeader {
            schema_version: 1,
            source_id: "s".into(),
            sequence,
            ..Default::default()
        })
    }

    /// A record with nothing but its header.
    fn bare() -> FlowRecord {
        FlowRecord {
            header: header(0),
            ..Default::default()
        }
    }

    /// Ours refused what prost accepts for a reason prost does not check: the strict decoder's
    /// (a header, a version, a source id, records, no unknown field).
    fn strict_refusal(e: &CodecError) -> bool {
        matches!(
            e,
            CodecError::Refused { .. }
                | CodecError::NoRecords { .. }
                | CodecError::Decode {
                    source: WireError::Unknown { .. },
                    ..
                }
        )
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
            ..bare()
        };
        let stream = flows_to_arrow(&[encode(vec![bare])]).expect("decodes");
        let b = &read_stream(&stream)[0];
        assert_eq!(col(b, "header_source_id").as_string::<i32>().value(0), "s");
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
            header: header(seq),
            inter_arrival_histogram_ns: Some(Log2Histogram { buckets }),
            direction: Direction::Ingress as i32,
            ..Default::default()
        };
        let payloads = vec![
            encode(vec![rec(1, vec![1, 2, 3]), rec(2, vec![])]),
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
    fn nearly_empty_records_are_refused_before_the_columns_are_sized() {
        // 400 000 empty records: 800 kB on the wire, over 100 MB of fixed-width columns.
        let empty = [0x0a_u8, 0x00].repeat(400_000);
        let err = flows_to_arrow(&[empty]).expect_err("refused");
        assert!(
            matches!(
                err,
                CodecError::Expands {
                    records: 400_000,
                    total: 800_000,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().ends_with("nearly empty records"), "{err}");
        // The same records, fewer: within the floor, decoded, and refused for what they lack
        // (a small batch of empty records is odd, not dangerous).
        let few = [0x0a_u8, 0x00].repeat(1000);
        assert!(matches!(
            flows_to_arrow(&[few]),
            Err(CodecError::Refused {
                check: Check::NoHeader,
                ..
            })
        ));
        // Real records are far below the factor: 100 000 sample records pass.
        let sample = samples::sample_flow_record_batch().encode_to_vec();
        assert!(flows_to_arrow(&vec![sample; 100_000]).is_ok());
        assert!(
            fixed_row_bytes(&flow_schema()) > 200,
            "flows have ~40 fixed-width columns"
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
        let mut cols = FlowColumns::default();
        for p in payloads {
            let batch = FlowRecordBatch::decode(&p[..]).ok()?;
            for r in &batch.records {
                cols.append(r).ok()?;
            }
        }
        to_record_batch(&cols).ok()
    }

    /// A payload written by hand with what protobuf encoders may send but prost's own encoder
    /// never writes: a nested message and a scalar twice (merged, the last scalar wins),
    /// unpacked and packed buckets, a histogram twice (concatenated); with `unknown`, unknown
    /// fields of every wire type, a group among them, and an unknown field of the batch itself
    /// (which prost skips and the strict decoder refuses).
    fn hand_written_payload(unknown: bool) -> Vec<u8> {
        use prost::encoding::{encode_key, encode_varint, WireType::*};
        fn delimited(tag: u32, body: &[u8], out: &mut Vec<u8>) {
            encode_key(tag, LengthDelimited, out);
            encode_varint(body.len() as u64, out);
            out.extend_from_slice(body);
        }
        let mut r = Vec::new();
        let first = RecordHeader {
            schema_version: 1,
            source_id: "a".into(),
            sequence: 1,
            ..Default::default()
        };
        delimited(1, &first.encode_to_vec(), &mut r);
        let again = RecordHeader {
            sequence: 2,
            ..Default::default()
        };
        delimited(1, &again.encode_to_vec(), &mut r);
        for packets in [5, 6] {
            encode_key(10, Varint, &mut r);
            encode_varint(packets, &mut r);
        }
        let mut hist = Vec::new();
        encode_key(1, Varint, &mut hist);
        encode_varint(7, &mut hist);
        delimited(1, &[3, 4], &mut hist);
        delimited(18, &hist, &mut r);
        delimited(18, &hist, &mut r);
        if unknown {
            encode_key(99, Varint, &mut r);
            encode_varint(300, &mut r);
            delimited(100, b"xyz", &mut r);
            encode_key(101, ThirtyTwoBit, &mut r);
            r.extend_from_slice(&[1, 2, 3, 4]);
            encode_key(102, SixtyFourBit, &mut r);
            r.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
            encode_key(103, StartGroup, &mut r);
            encode_key(1, Varint, &mut r);
            encode_varint(1, &mut r);
            encode_key(103, EndGroup, &mut r);
        }
        let tuple = FiveTuple {
            src_addr: vec![10, 0, 0, 1],
            src_port: 9,
            ..Default::default()
        };
        delimited(2, &tuple.encode_to_vec(), &mut r);
        encode_key(3, Varint, &mut r);
        encode_varint(Direction::Egress as u64, &mut r);
        let mut batch = Vec::new();
        delimited(1, &r, &mut batch);
        if unknown {
            encode_key(5, Varint, &mut batch);
            encode_varint(1, &mut batch);
        }
        batch
    }

    #[test]
    fn record_at_a_time_decode_equals_prost() {
        // Records that leave out different parts, so one row must not leak into the next;
        // then every single-bit flip of the payloads, valid or not.
        let sample = samples::sample_flow_record_batch().records[0].clone();
        let mut no_rtp = sample.clone();
        no_rtp.rtp = None;
        no_rtp.header = header(9);
        let mut no_tuple = sample.clone();
        no_tuple.five_tuple = None;
        no_tuple.size_histogram_bytes = None;
        no_tuple.interface_name.clear();
        let payload = encode(vec![sample.clone(), no_rtp, bare(), no_tuple, sample]);
        let odd = hand_written_payload(false);
        // prost skips unknown fields; the strict decoder (and so this codec) refuses them.
        let unknown = [hand_written_payload(true)];
        assert!(reference(&unknown).is_some());
        let err = flow_record_batch(&unknown).expect_err("unknown fields");
        assert!(
            err.to_string()
                .ends_with("(record 0): FlowRecord: unknown field 99"),
            "{err}"
        );
        let b = flow_record_batch(std::slice::from_ref(&odd)).expect("valid");
        assert_eq!(col(&b, "header_source_id").as_string::<i32>().value(0), "a");
        let seq = col(&b, "header_sequence").as_primitive::<UInt64Type>();
        assert_eq!(seq.value(0), 2);
        let packets = col(&b, "packets").as_primitive::<UInt64Type>();
        assert_eq!(packets.value(0), 6);
        let sizes = col(&b, "size_histogram_bytes_buckets")
            .as_list::<i32>()
            .value(0);
        let sizes = sizes.as_primitive::<UInt64Type>().values().to_vec();
        assert_eq!(sizes, vec![7, 3, 4, 7, 3, 4]);
        for payload in [payload, odd] {
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
                    (Err(e), Some(_)) if strict_refusal(&e) => rejected += 1,
                    (got, want) => panic!("bit {bit}: {got:?} but prost gives {want:?}"),
                }
            }
            assert!(
                same > 100 && rejected > 10,
                "{same} equal, {rejected} rejected"
            );
            // Every truncation too (a payload cut anywhere).
            for cut in 0..payload.len() {
                let payloads = [payload[..cut].to_vec()];
                match (flow_record_batch(&payloads), reference(&payloads)) {
                    (Ok(got), Some(want)) => assert_eq!(got, want, "cut {cut}"),
                    (Err(_), None) => {}
                    (Err(e), Some(_)) if strict_refusal(&e) => {}
                    (got, want) => panic!("cut {cut}: {got:?} but prost gives {want:?}"),
                }
            }
        }
    }

    #[test]
    fn varints_decode_as_prosts() {
        use prost::encoding::{decode_varint, encode_varint};
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for shift in 0..64 {
            for v in [1u64 << shift, (1u64 << shift) - 1, u64::MAX >> shift] {
                let mut b = Vec::new();
                encode_varint(v, &mut b);
                cases.push(b);
            }
        }
        // Random bytes, mostly with the continuation bit: overlong, too long, 10th byte > 1.
        let mut x: u32 = 2463534242;
        for len in 0..14 {
            for _ in 0..2000 {
                cases.push(
                    (0..len)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 17;
                            x ^= x << 5;
                            (x as u8) | if x & 0x300 != 0 { 0x80 } else { 0 }
                        })
                        .collect(),
                );
            }
        }
        for case in cases {
            // Alone, and with bytes after it (the word-at-a-time path reads ahead).
            for tail in [
                &[][..],
                &[0x81, 0x01, 0xff, 0x00, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
            ] {
                let bytes = [&case[..], tail].concat();
                let (mut ours, mut theirs) = (&bytes[..], &bytes[..]);
                let got = varint(&mut ours).ok();
                let want = decode_varint(&mut theirs).ok();
                assert_eq!(got, want, "{bytes:02x?}");
                if want.is_some() {
                    assert_eq!(ours.len(), theirs.len(), "{bytes:02x?}");
                }
            }
        }
    }

    #[test]
    fn unknown_direction_is_an_error_not_a_row() {
        let bad = FlowRecord {
            direction: 7,
            ..bare()
        };
        let payload = encode(vec![bare(), bad]);
        let err = flows_to_arrow(&[payload]).expect_err("unknown enum value");
        assert!(
            matches!(
                err,
                CodecError::UnknownEnum {
                    index: 0,
                    record: 1,
                    field: "direction",
                    value: 7,
                    ..
                }
            ),
            "{err}"
        );
    }

    /// The stream as `arrow-ipc`'s own StreamWriter writes the same columns.
    fn arrow_writer_stream(batch: &RecordBatch) -> Vec<u8> {
        let mut w = StreamWriter::try_new(Vec::new(), batch.schema_ref()).expect("writer");
        w.write(batch).expect("write");
        w.finish().expect("finish");
        w.into_inner().expect("bytes")
    }

    fn varied_payloads() -> Vec<Vec<u8>> {
        let sample = samples::sample_flow_record_batch().records[0].clone();
        let mut v6 = sample.clone();
        if let Some(t) = v6.five_tuple.as_mut() {
            t.src_addr = vec![0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        }
        v6.is_final = false;
        v6.direction = Direction::Ingress as i32;
        v6.interface_name = "veth-gw1-\u{fc}".into();
        let mut no_rtp = sample.clone();
        no_rtp.rtp = None;
        no_rtp.header = header(3);
        // 9 rows in the second payload: the boolean column spans two bytes.
        let many: Vec<FlowRecord> = (0..9u64)
            .map(|i| {
                let mut r = sample.clone();
                r.packets = i;
                r.is_final = i % 3 == 0;
                r
            })
            .collect();
        vec![encode(vec![sample, v6, bare(), no_rtp]), encode(many)]
    }

    #[test]
    fn stream_is_byte_for_byte_arrows_own() {
        let payloads = varied_payloads();
        let want = arrow_writer_stream(&flow_record_batch(&payloads).expect("decodes"));
        assert_eq!(flows_to_arrow(&payloads).expect("decodes"), want);
        let none: [&[u8]; 0] = [];
        let empty = arrow_writer_stream(&flow_record_batch(&none).expect("empty"));
        assert_eq!(flows_to_arrow(&none).expect("empty"), empty);
    }

    #[test]
    fn a_reused_encoder_keeps_nothing_of_the_previous_call() {
        let payloads = varied_payloads();
        let small = [encode(vec![bare()])];
        let mut encoder = FlowEncoder::new();
        let mut out = Vec::new();
        encoder.encode_into(&payloads, &mut out).expect("decodes");
        let first = out.clone();
        // A failing call in between leaves nothing behind either.
        let bad = [payloads[0].clone(), vec![0x0a, 100, 1, 2]];
        assert!(encoder.encode_into(&bad, &mut out).is_err());
        encoder.encode_into(&small, &mut out).expect("decodes");
        assert_eq!(out, flows_to_arrow(&small).expect("decodes"));
        encoder.encode_into(&payloads, &mut out).expect("decodes");
        assert_eq!(out, first);
        let batches = read_stream(&out);
        assert_eq!(batches, vec![reference(&payloads).expect("valid")]);
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

    #[test]
    fn records_the_strict_decoder_refuses_are_refused_naming_payload_and_record() {
        use prost::encoding::{encode_key, encode_varint, WireType};
        let good = encode(vec![bare(), bare()]);
        let with = |r: FlowRecord| encode(vec![bare(), r]);
        let unreadable = RecordHeader {
            schema_version: 99,
            source_id: "s".into(),
            ..Default::default()
        };
        let anonymous = RecordHeader {
            schema_version: 1,
            ..Default::default()
        };
        let no_records = "payload 1: cgloop.v1.FlowRecordBatch with no records";
        // The words after "payload 1: " are those of cgloop.bus.codec.decode_payload.
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                with(FlowRecord {
                    header: None,
                    ..bare()
                }),
                "payload 1: record 1 (FlowRecord): missing header",
            ),
            (
                with(FlowRecord {
                    header: Some(unreadable),
                    ..bare()
                }),
                "payload 1: record 1 (FlowRecord): schema_version 99 not readable \
                 (this build reads 1..1)",
            ),
            (
                with(FlowRecord {
                    header: Some(anonymous),
                    ..bare()
                }),
                "payload 1: record 1 (FlowRecord): header has no source_id",
            ),
            (encode(vec![]), no_records),
            (Vec::new(), no_records),
        ];
        for (bad, want) in cases {
            let err = flows_to_arrow(&[good.clone(), bad, good.clone()]).expect_err(want);
            assert_eq!(err.to_string(), want);
            assert_eq!(err.payload_index(), Some(1));
        }
        // With the Kafka headers' versions, every record must carry its payload's.
        let mut encoder = FlowEncoder::new();
        let mut out = Vec::new();
        encoder
            .encode_versioned(std::slice::from_ref(&good), Some(&[1]), &mut out)
            .expect("agrees");
        let err = encoder
            .encode_versioned(&[good.clone(), good.clone()], Some(&[1, 2]), &mut out)
            .expect_err("disagrees");
        assert_eq!(
            err.to_string(),
            "payload 1: record 0 (FlowRecord): schema_version 1 disagrees with the \
             cgloop-schema-version header 2"
        );
        // An unknown field at any depth (here in the header), as the strict decoder.
        let mut h = header(1).expect("a header").encode_to_vec();
        encode_key(9, WireType::Varint, &mut h);
        encode_varint(1, &mut h);
        let mut r = Vec::new();
        encode_key(1, WireType::LengthDelimited, &mut r);
        encode_varint(h.len() as u64, &mut r);
        r.extend_from_slice(&h);
        let mut batch = Vec::new();
        encode_key(1, WireType::LengthDelimited, &mut batch);
        encode_varint(r.len() as u64, &mut batch);
        batch.extend_from_slice(&r);
        let err = flows_to_arrow(&[good, batch]).expect_err("unknown header field");
        assert_eq!(err.payload_index(), Some(1));
        assert!(
            err.to_string().ends_with("RecordHeader: unknown field 9"),
            "{err}"
        );
    }
}
