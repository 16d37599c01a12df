//! INT shim + MD/MX header + metadata stack (v1.0 and v2.1) on their own.
#![no_main]
use cgloop_int_collector::parse::inner::parse_int;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = parse_int(data) {
        assert!(h.total_len <= data.len());
        for hop in h.hops() {
            let _ = std::hint::black_box(hop);
        }
    }
});
