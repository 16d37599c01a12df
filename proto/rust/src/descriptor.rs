//! The few `descriptor.proto` fields the contract tables need (bus.proto's topic table, ops.proto's
//! metrics endpoints), with the enum value options both declare: read from the descriptor set
//! the build embeds, so the tables are the proto's and never a copy. Crate-private: `bus` and
//! `ops` expose the typed tables.

use prost::Message;

use crate::v1::{MetricsEndpoint, ProducerSettings, TopicSpec};

#[derive(Clone, PartialEq, prost::Message)]
pub struct FileDescriptorSet {
    #[prost(message, repeated, tag = "1")]
    pub file: Vec<FileDescriptor>,
}
#[derive(Clone, PartialEq, prost::Message)]
pub struct FileDescriptor {
    #[prost(string, tag = "2")]
    pub package: String,
    #[prost(message, repeated, tag = "4")]
    pub message_type: Vec<Named>,
    #[prost(message, repeated, tag = "5")]
    pub enum_type: Vec<Enum>,
}
#[derive(Clone, PartialEq, prost::Message)]
pub struct Named {
    #[prost(string, tag = "1")]
    pub name: String,
}
#[derive(Clone, PartialEq, prost::Message)]
pub struct Enum {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub value: Vec<EnumValue>,
}
#[derive(Clone, PartialEq, prost::Message)]
pub struct EnumValue {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    pub number: i32,
    #[prost(message, optional, tag = "3")]
    pub options: Option<EnumValueOptions>,
}
/// The enum value extensions of bus.proto (5010x) and ops.proto (50401), field numbers as
/// declared there.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EnumValueOptions {
    #[prost(message, optional, tag = "50101")]
    pub topic: Option<TopicSpec>,
    #[prost(string, optional, tag = "50102")]
    pub header_name: Option<String>,
    #[prost(message, optional, tag = "50103")]
    pub producer_settings: Option<ProducerSettings>,
    #[prost(message, optional, tag = "50401")]
    pub metrics: Option<MetricsEndpoint>,
}

/// The declared values (not the zero `…_UNSPECIFIED`) of enum `cgloop.v1.<name>`.
pub fn enum_values(bytes: &[u8], name: &str) -> Result<Vec<EnumValue>, String> {
    let set = FileDescriptorSet::decode(bytes)
        .map_err(|e| format!("decoding the embedded descriptor set: {e}"))?;
    set.file
        .iter()
        .filter(|f| f.package == "cgloop.v1")
        .flat_map(|f| f.enum_type.iter())
        .find(|e| e.name == name)
        .map(|e| e.value.iter().filter(|v| v.number != 0).cloned().collect())
        .ok_or(format!("no enum cgloop.v1.{name}"))
}
