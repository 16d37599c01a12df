//! A harness for `perf record` on the codec alone (the Python extension is stripped): the
//! bench's records (the sample record, 5 000 a payload, 20 payloads a call) through one reused
//! `FlowEncoder`. Not a benchmark (bench/datasets/bench_arrow_codec.py is, with its peers).
//!
//!     CARGO_PROFILE_RELEASE_DEBUG=true cargo build --release -p cgloop-arrow-codec --example profile
//!     perf record target/release/examples/profile 40 && perf report
//!
//! It prints the best and mean time a row over its calls.

use cgloop_arrow_codec::FlowEncoder;
use cgloop_proto::samples;
use cgloop_proto::v1::FlowRecordBatch;
use prost::Message;

fn main() {
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
    let mut out = Vec::new();
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50);
    let mut best = f64::MAX;
    let mut total = 0.0;
    for _ in 0..iters {
        let t = std::time::Instant::now();
        enc.encode_into(&payloads, &mut out).expect("ok");
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
