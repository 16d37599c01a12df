//! Parsed reports into the flow/queue/drop state and its timers: no panic, no overflow, for
//! any sequence of reports (the input is a list of packets, each with a 2-byte length prefix).
#![no_main]
use cgloop_int_collector::parse::{parse_packet, IntDetect};
use cgloop_int_collector::state::{EventConfig, State};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let detect = IntDetect::default();
    let mut state = State::new(EventConfig { settle_ns: 1_000, summary_interval_ns: 10_000, flow_timeout_ns: 50_000, ..EventConfig::default() }, "fuzz");
    let mut out = Vec::new();
    let mut now = 1u64;
    let mut rest = data;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let (packet, tail) = rest[2..].split_at(len);
        rest = tail;
        now += 3_000;
        let _ = parse_packet(packet, &detect, &mut |r| {
            if let Ok(r) = r {
                state.ingest(&r, now, &mut out);
            }
        });
        state.tick(now, &mut out);
        out.clear();
    }
    state.tick(u64::MAX, &mut out);
});
