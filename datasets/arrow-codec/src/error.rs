//! What can go wrong: a call's errors ([`CodecError`]) and the strict checks of a record's
//! header ([`Check`], [`check_header`]), shared by the flow and INT decoders.

use arrow_schema::ArrowError;

use crate::wire::WireError;
use crate::{MAX_EXPANSION, MAX_TOTAL_BYTES, MIN_COLUMN_LIMIT};

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
pub(crate) fn check_header(
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
