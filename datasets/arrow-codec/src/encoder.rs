//! The engine every ingest table shares: a [`Batch`] of columns is sized from its payloads,
//! filled record by record ([`for_each_record`]) and written as one IPC stream by an
//! [`Encoder`] that keeps its column vectors from call to call.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{ArrowError, DataType, Schema, SchemaRef};

use crate::column::Column;
use crate::error::{Check, CodecError};
use crate::ipc::{schema_message, write_batch_message, Piece, CONTINUATION};
use crate::wire::{key, skip, take_key, unknown, varint_at, FieldAt, WireError, LENGTH_DELIMITED};
use crate::{MAX_EXPANSION, MAX_TOTAL_BYTES, MIN_COLUMN_LIMIT};

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
    pub(crate) columns: C,
    /// The stream's schema message, written once.
    pub(crate) schema_message: Option<Vec<u8>>,
    /// The bytes a row takes in the fixed-width columns ([`fixed_row_bytes`]), found once.
    pub(crate) row_bytes: Option<usize>,
}

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
    pub(crate) fn decode<P: AsRef<[u8]>>(
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
pub(crate) fn fixed_row_bytes(schema: &Schema) -> usize {
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
pub(crate) fn to_record_batch<C: Batch>(columns: &C) -> Result<RecordBatch, CodecError> {
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

/// Why one record could not become a row.
pub(crate) enum RowError {
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
pub(crate) fn for_each_record<'p, C: Batch>(
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
