//! The Arrow IPC stream, written straight from the columns: the schema message from
//! `arrow-ipc`, then the record batch message laid out as `arrow-ipc`'s `StreamWriter` lays it
//! (the tests check the bytes are identical).

use arrow_ipc::writer::StreamWriter;
use arrow_schema::{ArrowError, Schema};

use crate::encoder::Batch;
use crate::error::CodecError;

/// `arrow-ipc`'s default alignment (`IpcWriteOptions`): every buffer and the metadata padded to 64.
const ALIGNMENT: usize = 64;
pub(crate) const CONTINUATION: [u8; 4] = [0xff; 4];

fn padded(len: usize) -> usize {
    len.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// The stream's first message (the schema), as `arrow-ipc`'s `StreamWriter` writes it.
pub(crate) fn schema_message(schema: &Schema) -> Result<Vec<u8>, CodecError> {
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
    pub(crate) fn body_len(&self) -> usize {
        match self {
            Piece::Node(_) | Piece::NoValidity => 0,
            Piece::Bytes(b) => b.len(),
            Piece::Bits(b) => b.len().div_ceil(8),
        }
    }
}

/// Writes the record batch message (continuation, length, flatbuffer metadata, body) of
/// `columns` into `out`, copying each column once; `out` is reserved for all of it first.
pub(crate) fn write_batch_message<C: Batch>(
    columns: &C,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
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
