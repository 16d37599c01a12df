//! cgloop's wire contracts: the `cgloop.v1` protobuf messages (prost), the `NodeAgentService`
//! gRPC client and server (tonic), and canonical sample records shared with the Python side
//! (`cgloop.contracts.samples`) to check that both languages produce identical bytes.

/// Version of the record schemas written into every `RecordHeader.schema_version`.
/// Mirrors `cgloop.contracts.SCHEMA_VERSION` in Python.
pub const SCHEMA_VERSION: u32 = 1;

/// Generated from `proto/cgloop/v1/*.proto`.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("cgloop.v1");
}

pub mod bus;
pub mod catalogue;
mod descriptor;
pub mod host;
pub mod kafka_security;
pub mod ops;
pub mod samples;
pub mod vectors;

pub use prost::Message;

/// The `FileDescriptorSet` of every proto file, as the build compiled them: for code and tests
/// that must agree with the contract without a copy of it (e.g. the Arrow codec's tables of the
/// fields it knows).
pub fn descriptor_set() -> &'static [u8] {
    include_bytes!(concat!(env!("OUT_DIR"), "/cgloop_descriptors.bin"))
}
