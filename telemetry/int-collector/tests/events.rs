//! Event logic, driven by the generator through the real parsers: a planted congestion episode
//! gives exactly one congestion event and one clear; a path change is reported once; steady
//! state emits only summaries. Run for every report format.

use cgloop_int_collector::gen::{Episode, GenConfig, Generator, Mode};
use cgloop_int_collector::parse::{parse_packet, Format, IntDetect};
use cgloop_int_collector::state::{EventConfig, State};
use cgloop_proto::v1::{int_record::Record, IntEventReason, IntRecord};

const STEP_NS: u64 = 1_000_000; // one data packet per flow per ms

fn formats() -> Vec<(Format, Mode)> {
    vec![(Format::V20, Mode::Md), (Format::V20, Mode::Mx), (Format::V10, Mode::Md), (Format::V05, Mode::Md)]
}

/// Feed `packets` data packets' reports; returns (time of record, record).
fn run(cfg: GenConfig, packets: u64) -> Vec<(u64, IntRecord)> {
    let flows = u64::from(cfg.flows);
    let mut gen = Generator::new(cfg);
    let mut state = State::new(EventConfig::default(), "test");
    let detect = IntDetect::default();
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let mut seen = Vec::new();
    let mut last_tick = 0;
    loop {
        gen.next_packet(&mut buf);
        let data_packet = gen.data_packets() - 1;
        if data_packet >= packets * flows {
            break;
        }
        // Time of the data packet (per flow: packet n at n ms).
        let now = 1 + (data_packet / flows) * STEP_NS;
        parse_packet(&buf, &detect, &mut |r| state.ingest(&r.expect("generated report parses"), now, &mut out))
            .expect("generated packet parses");
        if now - last_tick >= 10 * STEP_NS {
            state.tick(now, &mut out);
            last_tick = now;
        }
        seen.extend(out.drain(..).map(|r| (now, r)));
    }
    seen
}

fn flow_reasons(recs: &[(u64, IntRecord)]) -> Vec<IntEventReason> {
    recs.iter()
        .filter_map(|(_, r)| match &r.record {
            Some(Record::Flow(f)) => Some(f.reason()),
            _ => None,
        })
        .collect()
}

#[test]
fn steady_state_emits_only_summaries() {
    for (format, mode) in formats() {
        let recs = run(GenConfig { format, mode, flows: 4, ..GenConfig::default() }, 3_000);
        let reasons = flow_reasons(&recs);
        let new = reasons.iter().filter(|r| **r == IntEventReason::NewFlow).count();
        let periodic = reasons.iter().filter(|r| **r == IntEventReason::Periodic).count();
        assert_eq!(new, 4, "{format:?}/{mode:?}: {reasons:?}");
        assert_eq!(new + periodic, reasons.len(), "{format:?}/{mode:?}: {reasons:?}");
        // ~3 s of traffic at 1 s summaries per flow.
        assert!((8..=12).contains(&periodic), "{format:?}/{mode:?}: {periodic} periodic");
        assert_eq!(recs.len(), reasons.len(), "{format:?}/{mode:?}: only flow records");
    }
}

#[test]
fn congestion_episode_gives_one_event_and_one_clear() {
    for (format, mode) in formats() {
        let cfg = GenConfig {
            format,
            mode,
            flows: 2,
            congestion: vec![Episode { hop: 1, start: 500, end: 1_500 }],
            ..GenConfig::default()
        };
        let recs = run(cfg, 2_500);
        let queue: Vec<(u64, bool, u32)> = recs
            .iter()
            .filter_map(|(t, r)| match &r.record {
                Some(Record::Queue(q)) => Some((*t, q.congested, q.switch_id)),
                _ => None,
            })
            .collect();
        assert_eq!(queue.len(), 2, "{format:?}/{mode:?}: {queue:?}");
        assert_eq!((queue[0].1, queue[0].2), (true, 2));
        assert_eq!((queue[1].1, queue[1].2), (false, 2));
        assert_eq!(queue[0].0, 1 + 500 * STEP_NS, "{format:?}: event at the episode's start");
        assert_eq!(queue[1].0, 1 + 1_500 * STEP_NS, "{format:?}: clear at its end");
        // Latency moves at start and end of the episode: one change record each per flow.
        let changes = flow_reasons(&recs)
            .into_iter()
            .filter(|r| matches!(r, IntEventReason::LatencyChange | IntEventReason::QueueChange))
            .count();
        assert_eq!(changes, 2 * 2, "{format:?}/{mode:?}");
    }
}

#[test]
fn path_change_is_reported_once() {
    for (format, mode) in formats() {
        let cfg = GenConfig { format, mode, flows: 1, path_change_at: Some(700), ..GenConfig::default() };
        let recs = run(cfg, 2_000);
        let changes: Vec<_> = recs
            .iter()
            .filter_map(|(t, r)| match &r.record {
                Some(Record::Flow(f)) if f.reason() == IntEventReason::PathChange => Some((*t, f.path_switch_ids.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(changes.len(), 1, "{format:?}/{mode:?}: {changes:?}");
        assert_eq!(changes[0].0, 1 + 700 * STEP_NS);
        assert!(changes[0].1.contains(&102), "{format:?}: new middle switch in {:?}", changes[0].1);
    }
}

#[test]
fn drops_are_reported_at_once_then_folded() {
    for (format, mode) in formats() {
        let cfg = GenConfig { format, mode, flows: 1, drop_every: 10, drop_hop: 1, ..GenConfig::default() };
        let recs = run(cfg, 2_000);
        let drops: Vec<(u64, u64, u32, u32)> = recs
            .iter()
            .filter_map(|(t, r)| match &r.record {
                Some(Record::Drop(d)) => Some((*t, d.drop_count, d.switch_id, d.drop_reason)),
                _ => None,
            })
            .collect();
        assert_eq!((drops[0].0, drops[0].1), (1 + 9 * STEP_NS, 1), "{format:?}: first drop at once");
        // The v1.0 report has only the D flag, no drop reason field.
        let reason = if format == Format::V10 { 0 } else { 71 };
        assert!(drops.iter().all(|d| d.2 == 2 && d.3 == reason), "{format:?}: {drops:?}");
        let total: u64 = drops.iter().map(|d| d.1).sum();
        // 200 drops; those of the last interval may still be pending.
        assert!((100..=200).contains(&total), "{format:?}: {total}");
        assert!(drops.len() <= 4, "{format:?}: drops folded per interval: {drops:?}");
        // Drop reports never look like path changes.
        let reasons = flow_reasons(&recs);
        assert!(!reasons.contains(&IntEventReason::PathChange), "{format:?}: {reasons:?}");
    }
}

#[test]
fn generator_round_trips_every_field_through_the_parser() {
    for (format, mode) in formats() {
        let cfg = GenConfig { format, mode, flows: 3, jitter: false, ..GenConfig::default() };
        let gen_truth = Generator::new(cfg.clone()).describe();
        // Per-hop formats announce a flow once its path settled (at the tick below).
        let mut state = State::new(EventConfig { settle_ns: 1, ..EventConfig::default() }, "t");
        let mut gen = Generator::new(cfg);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        for _ in 0..30 {
            gen.next_packet(&mut buf);
            parse_packet(&buf, &IntDetect::default(), &mut |r| state.ingest(&r.unwrap(), 1, &mut out)).unwrap();
        }
        state.tick(2, &mut out);
        for truth in &gen_truth {
            let rec = out
                .iter()
                .find_map(|r| match &r.record {
                    Some(Record::Flow(f)) if f.five_tuple.as_ref().unwrap().src_port == u32::from(truth.src_port) => Some(f),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("{format:?}: no record for {truth:?}"));
            let t = rec.five_tuple.as_ref().unwrap();
            assert_eq!((&t.src_addr[..], &t.dst_addr[..]), (&truth.src_addr[..], &truth.dst_addr[..]));
            assert_eq!((t.dst_port, t.ip_protocol), (u32::from(truth.dst_port), u32::from(truth.ip_protocol)));
            assert_eq!(rec.path_switch_ids, truth.path, "{format:?}");
            for (h, th) in rec.hops.iter().zip(&truth.hops) {
                assert_eq!(h.switch_id, th.switch_id);
                assert_eq!((h.ingress_port, h.egress_port), (u32::from(th.ingress_port), u32::from(th.egress_port)), "{format:?}");
                assert_eq!(h.hop_latency_ns, u64::from(th.hop_latency_ns), "{format:?}");
                assert_eq!((h.queue_id, h.queue_occupancy_cells), (u32::from(th.queue_id), th.queue_occupancy_cells), "{format:?}");
                if format != Format::V05 {
                    let want = f64::from(th.egress_tx_util) / 10_000.0;
                    assert!((h.egress_tx_utilization - want).abs() < 1e-9, "{format:?}");
                    assert_eq!(h.egress_tx_utilization_raw, th.egress_tx_util, "{format:?}");
                    // Bit 6 (level-2 interfaces): INT v1.0 and v2.x; v0.5 has no bitmap.
                    assert_eq!((h.l2_ingress_port, h.l2_egress_port), (th.l2_ingress_port, th.l2_egress_port), "{format:?}");
                } else {
                    assert_eq!((h.l2_ingress_port, h.egress_tx_utilization_raw), (0, 0));
                }
                // Bit 8 (buffer): v2.x only (the generator's v1.0 bitmap stops at bit 7).
                if format == Format::V20 {
                    assert_ne!(th.buffer_occupancy_cells, 0);
                    assert_eq!((h.buffer_id, h.buffer_occupancy_cells), (u32::from(th.buffer_id), th.buffer_occupancy_cells), "{format:?}");
                } else {
                    assert_eq!((h.buffer_id, h.buffer_occupancy_cells), (0, 0), "{format:?}");
                }
            }
            assert!(truth.path.contains(&rec.reporter_switch_id), "{format:?}: reporter {}", rec.reporter_switch_id);
            if mode == Mode::Md && format != Format::V05 {
                // INT-MD: the sink (last hop) reports the whole stack; one report per record here.
                assert_eq!(rec.reporter_switch_id, *truth.path.last().unwrap(), "{format:?}");
                assert_eq!(rec.report_count, 1, "{format:?}");
            } else {
                // Per-hop reports (INT-MX, v0.5): one per switch before the flow settles.
                assert!(rec.report_count >= truth.path.len() as u32, "{format:?}: {}", rec.report_count);
            }
        }
    }
}

#[test]
fn paths_longer_than_the_state_keep_their_newest_hops() {
    // Regression (cargo-fuzz, state_ingest): 17 stacked hops + the sink's own metadata.
    let recs = run(GenConfig { flows: 1, hops: 18, ..GenConfig::default() }, 5);
    let path = recs
        .iter()
        .find_map(|(_, r)| match &r.record {
            Some(Record::Flow(f)) => Some(f.path_switch_ids.clone()),
            _ => None,
        })
        .expect("a flow record");
    assert_eq!(path, (3..=18).collect::<Vec<u32>>());
}
