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
//!
//! Files by mechanism: [`error`](CodecError) · `encoder` (sizing, the call) · `ipc` (the stream's
//! bytes) · `column` (column vectors, `columns!`) · `wire` (the protobuf reader) · `flow` and
//! `int` (the two tables) · `python` (the binding).

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

#[macro_use]
mod column;
#[macro_use]
mod wire;
mod encoder;
mod error;
mod flow;
mod int;
mod ipc;
#[cfg(feature = "python")]
mod python;

pub use column::{Column, List};
pub use encoder::{Batch, Encoder};
pub use error::{Check, CodecError};
pub use flow::{flow_record_batch, flow_schema, flows_to_arrow, FlowColumns, FlowEncoder};
pub use int::{int_to_arrow, HopColumns, IntColumns, IntEncoder};
pub use ipc::Piece;
pub use wire::WireError;
