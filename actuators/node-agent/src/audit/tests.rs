//! Records as the store and the engine read them, and the audit thread against a sink double.

use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use super::*;
use crate::guard::tests::flow;
use crate::guard::Rule;

fn promotion() -> Move {
    Move {
        kind: MoveKind::Promote,
        interface: "cpe".into(),
        flow: flow(1),
        to: Some(Rule {
            class_id: 0x10020,
            rewrite_dscp: Some(46),
        }),
        to_class: 0x10020,
        previous: None,
        cause: "class 1:10 queue delay 6.00 ms >= guard 5.00 ms".into(),
        seen_ns: 1_000_000_000,
        applied_ns: 1_002_000_000,
        apply_latency_ns: 30_000,
        dry_run: false,
    }
}

fn sanction(port: u32, packets: u64, score: f64) -> SanctionCount {
    SanctionCount {
        interface: "cpe".into(),
        flow: flow(port),
        from_class_id: 0x10040,
        to_class_id: 0x10010,
        packets,
        bytes: packets * 1000,
        max_score_us: score,
        max_queue_delay_ns: 1_500_000,
    }
}

#[test]
fn a_guard_move_is_a_node_level_reprioritise_with_its_rollback_state() {
    let (a, r) = Recorder::new("edge").guard_move(&promotion());
    assert_eq!(a.level, ActionLevel::Node as i32);
    assert_eq!(a.operation, ActionOperation::ReprioritiseFlow as i32);
    assert_eq!(
        a.header.as_ref().map(|h| h.source_id.as_str()),
        Some("edge/node-agent")
    );
    assert_eq!(
        (a.id.len(), &a.id[14..15], a.id.matches('-').count()),
        (36, "4", 4),
        "{}",
        a.id
    );
    assert_eq!(a.policy_id, GUARD_POLICY);
    assert!(a.cause.starts_with("promoted: class 1:10"), "{}", a.cause);
    let t = a.target.as_ref().unwrap();
    assert_eq!(
        (
            t.node_id.as_str(),
            t.interface_name.as_str(),
            t.flow.as_ref()
        ),
        ("edge", "cpe", Some(&flow(1)))
    );
    assert_eq!(
        a.spec,
        Some(Spec::ReprioritiseFlow(ReprioritiseFlowAction {
            class_id: 0x10020,
            rewrite_dscp: Some(46)
        }))
    );
    assert_eq!(
        (r.action_id.as_str(), r.state),
        (a.id.as_str(), ActionState::Applied as i32)
    );
    assert_eq!(
        (r.applied_ns, r.apply_latency_ns, r.detection_to_apply_ns),
        (1_002_000_000, 30_000, 2_000_000)
    );
    // No rule before: the rollback removes the rule (PreviousFlowClass without a class).
    let prev = PreviousState {
        state: Some(Previous::FlowClass(PreviousFlowClass::default())),
    };
    assert_eq!(r.previous, Some(prev));
    let (b, _) = Recorder::new("edge").guard_move(&promotion());
    assert_ne!(a.id, b.id);
}

#[test]
fn a_release_names_the_class_it_returns_to() {
    let release = Move {
        kind: MoveKind::Release,
        to: None,
        to_class: 0x10010,
        previous: Some(Rule {
            class_id: 0x10020,
            rewrite_dscp: Some(46),
        }),
        seen_ns: 0,
        ..promotion()
    };
    let (a, r) = Recorder::new("edge").guard_move(&release);
    assert_eq!(
        a.spec,
        Some(Spec::ReprioritiseFlow(ReprioritiseFlowAction {
            class_id: 0x10010,
            rewrite_dscp: None
        }))
    );
    let prev = PreviousFlowClass {
        class_id: Some(0x10020),
        rewrite_dscp: Some(46),
    };
    assert_eq!(
        r.previous.and_then(|p| p.state),
        Some(Previous::FlowClass(prev))
    );
    assert_eq!(r.detection_to_apply_ns, 0, "an expiry saw no tick");
    assert!(a.cause.starts_with("released: "));
}

#[test]
fn sanctions_are_summed_per_flow_and_recorded_with_their_interval() {
    let agg = aggregate(vec![
        sanction(1, 3, 4100.0),
        sanction(2, 0, 9000.0),
        sanction(1, 2, 5000.0),
    ]);
    assert_eq!(agg.len(), 1, "flow 2 had nothing: {agg:?}");
    assert_eq!(
        (agg[0].packets, agg[0].bytes, agg[0].max_score_us),
        (5, 5000, 5000.0)
    );
    let (a, r) = Recorder::new("edge").sanction(&agg[0], 10, 20);
    assert_eq!(a.operation, ActionOperation::QueueProtectionSanction as i32);
    let Some(Spec::QueueProtectionSanction(s)) = &a.spec else {
        panic!("{:?}", a.spec)
    };
    assert_eq!(
        (
            s.sanctioned_packets,
            s.interval_start_ns,
            s.interval_end_ns,
            s.from_class_id
        ),
        (5, 10, 20, 0x10040)
    );
    assert!(
        a.cause
            .contains("5 packets redirected from class 1:40 to 1:10"),
        "{}",
        a.cause
    );
    assert_eq!((r.applied_ns, r.previous), (20, None));
}

#[test]
fn an_xman_switch_is_a_core_frequency_action() {
    let c = CoreFrequencyChange {
        core: 2,
        from_khz: Some(3_000_000),
        to_khz: 1_500_000,
        mode: "load".into(),
        reason: "TrendDown".into(),
        at_ns: 5,
    };
    let (a, r) = Recorder::new("edge").core_frequency(&c);
    let Some(Spec::SetCoreFrequency(s)) = &a.spec else {
        panic!("{:?}", a.spec)
    };
    assert_eq!(
        (
            s.core,
            s.max_frequency_khz,
            s.previous_max_frequency_khz,
            s.xman_mode.as_str()
        ),
        (2, 1_500_000, 3_000_000, "load")
    );
    assert_eq!((a.policy_id.as_str(), r.applied_ns), (XMAN_POLICY, 5));
    assert!(
        a.cause.contains("3000000 kHz -> 1500000 kHz (TrendDown)"),
        "{}",
        a.cause
    );
}

/// Keeps what it is sent; optionally refuses, or blocks until released.
#[derive(Clone, Default)]
struct VecSink {
    sent: Arc<Mutex<Vec<(String, ActionBatch)>>>,
    refuse: bool,
    gate: Arc<Mutex<()>>,
    entered: Arc<AtomicBool>,
}

impl Sink for VecSink {
    fn send(&mut self, key: &str, batch: &ActionBatch) -> Result<()> {
        self.entered.store(true, Ordering::SeqCst);
        let _open = self.gate.lock().unwrap();
        if self.refuse {
            anyhow::bail!("Local: Queue full");
        }
        self.sent
            .lock()
            .unwrap()
            .push((key.to_string(), batch.clone()));
        Ok(())
    }
}

struct Sanctions(Mutex<Vec<SanctionCount>>);

impl SanctionSource for Sanctions {
    fn drain(&self) -> Vec<SanctionCount> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// Waits (without a time limit on what is measured) until `f` holds; fails after 10 s.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < until, "never: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn the_thread_sends_each_action_with_its_result_under_its_id_and_drains_sanctions() {
    let sink = VecSink::default();
    let sanctions = Arc::new(Sanctions(Mutex::new(vec![
        sanction(7, 4, 4500.0),
        sanction(7, 1, 100.0),
    ])));
    let audit = Audit::start(
        Recorder::new("edge"),
        Box::new(sink.clone()),
        64,
        Duration::from_millis(10),
        Some(sanctions.clone() as Arc<dyn SanctionSource>),
    )
    .unwrap();
    audit.guard_move(&promotion());
    eventually("two messages", || sink.sent.lock().unwrap().len() >= 2);
    let sent = sink.sent.lock().unwrap().clone();
    for (key, batch) in &sent {
        let decoded = ActionBatch::decode(batch.encode_to_vec().as_slice()).unwrap();
        let [ActionEvent {
            event: Some(Event::Action(a)),
        }, ActionEvent {
            event: Some(Event::Result(r)),
        }] = decoded.events.as_slice()
        else {
            panic!("{decoded:?}")
        };
        assert_eq!((key, &r.action_id), (&a.id, &a.id));
    }
    let ops: Vec<i32> = sent
        .iter()
        .filter_map(|(_, b)| match &b.events[0].event {
            Some(Event::Action(a)) => Some(a.operation),
            _ => None,
        })
        .collect();
    assert!(
        ops.contains(&(ActionOperation::QueueProtectionSanction as i32)),
        "{ops:?}"
    );
    assert!(
        ops.contains(&(ActionOperation::ReprioritiseFlow as i32)),
        "{ops:?}"
    );
    assert_eq!(audit.dropped(), 0);
}

#[test]
fn a_full_queue_or_a_refusing_kafka_drops_and_counts_without_blocking() {
    let sink = VecSink::default();
    let gate = sink.gate.lock().unwrap(); // the sink blocks: Kafka is stuck
    let audit = Audit::start(
        Recorder::new("edge"),
        Box::new(sink.clone()),
        1,
        Duration::from_secs(60),
        None,
    )
    .unwrap();
    audit.guard_move(&promotion());
    eventually("the worker is in send", || {
        sink.entered.load(Ordering::SeqCst)
    });
    audit.guard_move(&promotion()); // queued (capacity 1)
    audit.guard_move(&promotion()); // dropped, at once
    audit.guard_move(&promotion());
    assert_eq!(audit.dropped(), 2);
    drop(gate);
    eventually("both sent", || sink.sent.lock().unwrap().len() == 2);

    let refusing = VecSink {
        refuse: true,
        ..VecSink::default()
    };
    let audit = Audit::start(
        Recorder::new("edge"),
        Box::new(refusing),
        16,
        Duration::from_secs(60),
        None,
    )
    .unwrap();
    audit.guard_move(&promotion());
    eventually("counted", || audit.dropped() == 1);
}
