//! Any UDP payload: v0.5, v1.0 and v2.0 reports with everything inside them.
#![no_main]
use cgloop_int_collector::parse::{parse_packet, IntDetect};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let detect = IntDetect::default();
    let _ = parse_packet(data, &detect, &mut |r| {
        if let Ok(r) = r {
            // Walk every lazily parsed part too.
            if let Some(int) = r.inner.int {
                for h in int.hops() {
                    let _ = std::hint::black_box(h);
                }
            }
        }
    });
});
