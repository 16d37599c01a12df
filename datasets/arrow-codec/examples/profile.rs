//! A harness for `perf record` on the codec alone (the Python extension is stripped): the
//! bench's records (the sample record, 5 000 a payload, 20 payloads a call) through one reused
//! `FlowEncoder`; with a second argument `int`, the INT sample's four kinds through an
//! `IntEncoder`. Not a benchmark (bench/datasets/bench_arrow_codec.py is, with its peers).
//!
//!     CARGO_PROFILE_RELEASE_DEBUG=true cargo build --release -p cgloop-arrow-codec --example profile
//!     perf record target/release/examples/profile 40 && perf report
//!
//! It prints the best and mean time a row over its calls.

use cgloop_arrow_codec::{CodecError, FlowEncoder, IntEncoder};
use cgloop_proto::samples;
use cgloop_proto::v1::FlowRecordBatch;
use prost::Message;

/// The sample's four INT kinds in turn, 5 000 a payload, 20 payloads (as the bench's).
fn int_payloads() -> Vec<Vec<u8>> {
    use cgloop_proto::v1::int_record::Record;
    use cgloop_proto::v1::IntRecordBatch;
    let sample = samples::sample_int_record_batch();
    (0..20u64)
        .map(|m| {
            let records = (0..5000u64)
                .map(|i| {
                    let mut r = sample.records[(i % 4) as usize].clone();
                    let header = match r.record.as_mut() {
                        Some(Record::Hop(x)) => x.header.as_mut(),
                        Some(Record::Flow(x)) => x.header.as_mut(),
                        Some(Record::Queue(x)) => x.header.as_mut(),
                        Some(Record::Drop(x)) => x.header.as_mut(),
                        None => None,
                    };
                    if let Some(h) = header {
                        h.sequence = m * 5000 + i;
                    }
                    r
                })
                .collect();
            IntRecordBatch { records }.encode_to_vec()
        })
        .collect()
}

fn main() {
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50);
    if std::env::args().nth(2).as_deref() == Some("int") {
        let payloads = int_payloads();
        let mut enc = IntEncoder::new();
        run(iters, |out| enc.encode_into(&payloads, out));
        return;
    }
    let template = samples::sample_flow_record_batch().records[0].clone();
    let payloads: Vec<Vec<u8>> = (0..20)
        .map(|m| {
            let records = (0..5000u64)
                .map(|i| {
                    let mut r = template.clone();
                    if let Some(h) = r.header.as_mut() {
                        h.sequence = m * 5000 + i;
                    }
                    r
                })
                .collect();
            FlowRecordBatch { records }.encode_to_vec()
        })
        .collect();
    let mut enc = FlowEncoder::new();
    run(iters, |out| enc.encode_into(&payloads, out));
}

/// Calls `encode` `iters` times (100 000 rows each) into one reused buffer; prints the times.
fn run(iters: usize, mut encode: impl FnMut(&mut Vec<u8>) -> Result<(), CodecError>) {
    let mut out = Vec::new();
    let mut best = f64::MAX;
    let mut total = 0.0;
    for _ in 0..iters {
        let t = std::time::Instant::now();
        encode(&mut out).expect("ok");
        let dt = t.elapsed().as_secs_f64();
        best = best.min(dt);
        total += dt;
    }
    println!(
        "best {:.3} us/row, mean {:.3}, {} bytes",
        best / 100_000.0 * 1e6,
        total / iters as f64 / 100_000.0 * 1e6,
        out.len()
    );
}
