//! cgloop's INT collector: parses switch telemetry reports (Telemetry Report v0.5, v1.0, v2.0
//! with INT-MD v1.0/v2.1 and INT-MX), keeps per-flow and per-hop state, and exports only what
//! changed (plus periodic summaries) to Kafka as `cgloop.v1.IntRecordBatch`.

pub mod parse;
pub mod gen;
pub mod state;
pub mod bench;
#[cfg(feature = "kafka")]
pub mod export;
pub mod metrics;
pub mod recv;
pub mod steer;
