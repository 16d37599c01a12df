//! The guard against a fake agent (flow rules in a map) and crafted queue ticks: no root.

use std::collections::BTreeMap;

use super::*;
use crate::queue_view::ClassQueue;

const BE: u32 = 0x10010;
const GAMING: u32 = 0x10020;
const IFX: u32 = 7;
const MS: u64 = 1_000_000;
const SLO: u64 = 20 * MS;

#[derive(Default)]
struct Fake {
    rules: BTreeMap<Vec<u8>, Rule>,
    /// The datapath as the guard wrote it (promotions are not in `rules`).
    written: BTreeMap<Vec<u8>, Option<Rule>>,
    no_hierarchy: bool,
    fail: bool,
    /// Bumped by a test that changes `rules` or `no_hierarchy` between steps.
    version: u64,
    lookups: std::cell::Cell<u32>,
}

impl Steering for Fake {
    fn placement(&self, _interface: &str, flow: &FiveTuple) -> Option<Placement> {
        self.lookups.set(self.lookups.get() + 1);
        (!self.no_hierarchy).then(|| Placement {
            rule: self.rules.get(&flow.encode_to_vec()).copied(),
            default_class: BE,
        })
    }
    fn set_rule(
        &mut self,
        _interface: &str,
        flow: &FiveTuple,
        rule: Option<Rule>,
    ) -> AgentResult<()> {
        if self.fail {
            return Err(AgentError::Kernel(anyhow::anyhow!("flow map full")));
        }
        self.written.insert(flow.encode_to_vec(), rule);
        Ok(())
    }
    fn dry_run(&self) -> bool {
        false
    }
    fn version(&self) -> u64 {
        self.version
    }
}

struct FakeHands(Mutex<Fake>);

impl Hands for FakeHands {
    fn with(&self, f: &mut dyn FnMut(&mut dyn Steering)) {
        f(&mut *self.0.lock().unwrap())
    }
}

fn hands() -> FakeHands {
    FakeHands(Mutex::new(Fake::default()))
}

pub(crate) fn flow(port: u32) -> FiveTuple {
    FiveTuple {
        src_addr: vec![10, 0, 0, 1],
        dst_addr: vec![10, 0, 0, 2],
        src_port: port,
        dst_port: 5000,
        ip_protocol: 17,
    }
}

fn protection(port: u32) -> ProtectedFlow {
    ProtectedFlow {
        interface_name: "cpe".into(),
        flow: Some(flow(port)),
        latency_slo_ns: SLO,
        class_id: GAMING,
        rewrite_dscp: Some(46),
        ttl_ns: 30_000 * MS,
        ..Default::default()
    }
}

fn tick(at: u64, be_delay: u64) -> QueueTick {
    let class = |class_id, queue_delay_ns| ClassQueue {
        interface: "cpe".into(),
        ifindex: IFX,
        class_id,
        queue_delay_ns,
        ..Default::default()
    };
    QueueTick {
        taken_ns: at,
        classes: vec![class(BE, be_delay), class(GAMING, 0)],
    }
}

/// A guard that promotes on one tick over the threshold (the tests reason tick by tick; the
/// default of two ticks has a test of its own).
fn guard(settings: GuardSettings) -> Guard {
    Guard::new(GuardSettings {
        promote_ticks: 1,
        ..settings
    })
}

const T0: u64 = 1_000_000_000_000;

#[test]
fn a_flow_is_promoted_when_its_class_passes_the_guard_and_only_then() {
    let g = guard(GuardSettings::default());
    let h = hands();
    g.protect(&[protection(1)], &[IFX; 5], T0, false).unwrap();
    // 4.9 ms < 0.25 × 20 ms: nothing.
    assert!(g.step(Some(&tick(T0, 4_900_000)), "", T0, &h).is_empty());
    assert!(h.0.lock().unwrap().written.is_empty());
    let moves = g.step(Some(&tick(T0 + MS, 5 * MS)), "", T0 + MS, &h);
    assert_eq!(moves.len(), 1, "{moves:?}");
    let m = &moves[0];
    assert_eq!(
        (m.kind, m.to, m.previous, m.seen_ns),
        (
            MoveKind::Promote,
            Some(Rule {
                class_id: GAMING,
                rewrite_dscp: Some(46)
            }),
            None,
            T0 + MS
        )
    );
    assert!(
        m.cause
            .contains("class 1:10 queue delay 5.00 ms >= guard 5.00 ms"),
        "{}",
        m.cause
    );
    assert_eq!(
        h.0.lock().unwrap().written[&flow(1).encode_to_vec()],
        Some(Rule {
            class_id: GAMING,
            rewrite_dscp: Some(46)
        })
    );
    let listed = g.list();
    assert!(
        listed[0].promoted && listed[0].promotions == 1,
        "{listed:?}"
    );
    assert!(
        g.status().acting && g.status().reason.is_empty(),
        "{:?}",
        g.status()
    );
}

#[test]
fn no_move_on_a_missing_or_stale_tick_and_the_status_says_why() {
    let g = guard(GuardSettings::default());
    let h = hands();
    g.protect(&[protection(1)], &[IFX; 5], T0, false).unwrap();
    assert!(g
        .step(None, "reading class stats of cpe: EPERM", T0, &h)
        .is_empty());
    let s = g.status();
    assert!(
        !s.acting && s.reason.contains("EPERM") && s.protected_flows == 1,
        "{s:?}"
    );
    // 6 ms old, limit 5 ms, however high the delay.
    assert!(g
        .step(Some(&tick(T0, 50 * MS)), "", T0 + 6 * MS, &h)
        .is_empty());
    let s = g.status();
    assert!(
        !s.acting
            && s.reason.contains("6.0 ms old (limit 5.0 ms)")
            && s.queue_sample_age_ns == 6 * MS,
        "{s:?}"
    );
    assert!(h.0.lock().unwrap().written.is_empty());
    // The same tick twice is acted on once.
    let t = tick(T0 + 10 * MS, 6 * MS);
    assert_eq!(g.step(Some(&t), "", T0 + 10 * MS, &h).len(), 1);
    g.protect(&[protection(2)], &[IFX; 5], T0, false).unwrap();
    assert!(g.step(Some(&t), "", T0 + 11 * MS, &h).is_empty());
}

#[test]
fn release_waits_for_the_hold_the_hysteresis_and_a_calm_class() {
    let g = guard(GuardSettings::default()); // hold 2 s, release below 1 ms for 500 ms
    let h = hands();
    g.protect(&[protection(1)], &[IFX; 5], T0, false).unwrap();
    assert_eq!(g.step(Some(&tick(T0, 8 * MS)), "", T0, &h).len(), 1);
    // Queue gone at once: still held.
    assert!(g
        .step(Some(&tick(T0 + 1000 * MS, 0)), "", T0 + 1000 * MS, &h)
        .is_empty());
    // Hold over, but 2 ms ≥ 1 ms release threshold: stays.
    assert!(g
        .step(Some(&tick(T0 + 2500 * MS, 2 * MS)), "", T0 + 2500 * MS, &h)
        .is_empty());
    // Calm from 2.6 s on, except one queued tick at 2.7 s: the 500 ms of calm start again.
    let at = |ms: u64, delay: u64| (tick(T0 + ms * MS, delay), T0 + ms * MS);
    for (ms, delay) in [(2600, 900_000), (2700, 8 * MS), (2800, 0), (3200, 500_000)] {
        let (t, now) = at(ms, delay);
        assert!(
            g.step(Some(&t), "", now, &h).is_empty(),
            "released at {ms} ms"
        );
    }
    let (t, now) = at(3300, 500_000);
    let moves = g.step(Some(&t), "", now, &h);
    assert_eq!(moves.len(), 1);
    assert_eq!(
        (moves[0].kind, moves[0].to, moves[0].to_class),
        (MoveKind::Release, None, BE)
    );
    assert_eq!(
        moves[0].previous,
        Some(Rule {
            class_id: GAMING,
            rewrite_dscp: Some(46)
        })
    );
    assert!(
        moves[0]
            .cause
            .contains("< release 1.00 ms (0.05 × SLO 20.0 ms) for 0.50 s"),
        "{}",
        moves[0].cause
    );
    assert_eq!(h.0.lock().unwrap().written[&flow(1).encode_to_vec()], None);
    assert!(!g.list()[0].promoted);
}

#[test]
fn a_flow_with_its_own_rule_goes_back_to_it_and_one_in_the_protected_class_stays() {
    let g = guard(GuardSettings {
        hold_ms: 0,
        release_calm_ms: 0,
        ..Default::default()
    });
    let h = hands();
    let own = Rule {
        class_id: 0x10030,
        rewrite_dscp: None,
    };
    h.0.lock()
        .unwrap()
        .rules
        .insert(flow(1).encode_to_vec(), own);
    h.0.lock().unwrap().rules.insert(
        flow(2).encode_to_vec(),
        Rule {
            class_id: GAMING,
            rewrite_dscp: None,
        },
    );
    g.protect(&[protection(1), protection(2)], &[IFX; 5], T0, false)
        .unwrap();
    let mut t = tick(T0, 0);
    t.classes.push(ClassQueue {
        ifindex: IFX,
        class_id: 0x10030,
        queue_delay_ns: 9 * MS,
        ..Default::default()
    });
    let moves = g.step(Some(&t), "", T0, &h);
    assert_eq!(
        moves.len(),
        1,
        "flow 2 is already in the gaming class: {moves:?}"
    );
    assert_eq!(moves[0].previous, Some(own));
    t.taken_ns += MS;
    t.classes[2].queue_delay_ns = 0;
    let moves = g.step(Some(&t), "", T0 + MS, &h);
    assert_eq!((moves.len(), moves[0].to), (1, Some(own)));
}

#[test]
fn a_rule_set_by_the_global_loop_wins_over_a_promotion() {
    let g = guard(GuardSettings {
        hold_ms: 0,
        release_calm_ms: 0,
        ..Default::default()
    });
    let h = hands();
    g.protect(&[protection(1)], &[IFX; 5], T0, false).unwrap();
    assert_eq!(g.step(Some(&tick(T0, 8 * MS)), "", T0, &h).len(), 1);
    // SetFlowClass moved the flow meanwhile: the guard forgets its promotion, writes nothing.
    h.0.lock().unwrap().rules.insert(
        flow(1).encode_to_vec(),
        Rule {
            class_id: 0x10030,
            rewrite_dscp: None,
        },
    );
    h.0.lock().unwrap().written.clear();
    assert!(g.step(Some(&tick(T0 + MS, 0)), "", T0 + MS, &h).is_empty());
    assert!(h.0.lock().unwrap().written.is_empty());
    assert!(!g.list()[0].promoted);
}

#[test]
fn moves_are_capped_per_second() {
    let g = guard(GuardSettings {
        max_changes_per_s: 3,
        ..Default::default()
    });
    let h = hands();
    let flows: Vec<_> = (1..=5).map(protection).collect();
    g.protect(&flows, &[IFX; 5], T0, false).unwrap();
    assert_eq!(g.step(Some(&tick(T0, 9 * MS)), "", T0, &h).len(), 3);
    assert!(
        g.status()
            .reason
            .contains("change cap reached (3 a second)"),
        "{:?}",
        g.status()
    );
    assert!(g
        .step(Some(&tick(T0 + 500 * MS, 9 * MS)), "", T0 + 500 * MS, &h)
        .is_empty());
    assert_eq!(
        g.step(Some(&tick(T0 + 1001 * MS, 9 * MS)), "", T0 + 1001 * MS, &h)
            .len(),
        2
    );
}

#[test]
fn expiry_and_removal_move_a_promoted_flow_back() {
    let g = guard(GuardSettings::default());
    let h = hands();
    g.protect(
        &[
            protection(1),
            ProtectedFlow {
                ttl_ns: 1000 * MS,
                ..protection(2)
            },
        ],
        &[IFX; 5],
        T0,
        false,
    )
    .unwrap();
    assert_eq!(g.step(Some(&tick(T0, 8 * MS)), "", T0, &h).len(), 2);
    // Flow 2 expires; flow 1 is removed (ttl 0): both go back even without a tick, hold or not.
    let r = g
        .protect(
            &[ProtectedFlow {
                ttl_ns: 0,
                ..protection(1)
            }],
            &[IFX; 5],
            T0 + MS,
            false,
        )
        .unwrap();
    assert!(
        r.changed && r.previous.len() == 1 && r.previous[0].promoted,
        "{r:?}"
    );
    let moves = g.step(None, "monitor stopped", T0 + 1000 * MS, &h);
    assert_eq!(moves.len(), 2, "{moves:?}");
    assert!(moves
        .iter()
        .all(|m| m.kind == MoveKind::Release && m.to.is_none()));
    assert!(moves
        .iter()
        .any(|m| m.cause.starts_with("protection expired")));
    assert!(moves
        .iter()
        .any(|m| m.cause.starts_with("protection removed")));
    assert!(g.list().is_empty());
}

#[test]
fn protect_upserts_bounded_and_renewal_keeps_the_promotion() {
    let g = guard(GuardSettings {
        max_protected_flows: 2,
        ..Default::default()
    });
    let h = hands();
    let r = g
        .protect(&[protection(1), protection(2)], &[IFX; 5], T0, false)
        .unwrap();
    assert!(r.changed && r.previous.is_empty() && r.applied[0].expires_ns == T0 + 30_000 * MS);
    let e = g
        .protect(&[protection(3)], &[IFX; 5], T0, false)
        .unwrap_err();
    assert!(
        matches!(e, AgentError::Exhausted(_)) && e.to_string().contains("max_protected_flows is 2"),
        "{e}"
    );
    // Replacing one by another in one request fits.
    g.protect(
        &[
            ProtectedFlow {
                ttl_ns: 0,
                ..protection(2)
            },
            protection(3),
        ],
        &[IFX; 5],
        T0,
        true,
    )
    .unwrap();
    assert_eq!(g.list().len(), 2, "dry run changes nothing");
    assert_eq!(g.step(Some(&tick(T0, 8 * MS)), "", T0, &h).len(), 2);
    let r = g
        .protect(&[protection(1)], &[IFX; 5], T0 + 5000 * MS, false)
        .unwrap();
    assert!(!r.changed, "a renewal changes nothing but the expiry");
    let p = g
        .list()
        .into_iter()
        .find(|p| p.flow == Some(flow(1)))
        .unwrap();
    assert!(
        p.promoted && p.promotions == 1 && p.expires_ns == T0 + 35_000 * MS,
        "{p:?}"
    );
    let r = g
        .protect(
            &[ProtectedFlow {
                latency_slo_ns: 50 * MS,
                ..protection(1)
            }],
            &[IFX; 5],
            T0,
            false,
        )
        .unwrap();
    assert!(r.changed);
}

#[test]
fn failures_and_blind_spots_are_in_the_status() {
    let g = guard(GuardSettings::default());
    let h = hands();
    g.protect(&[protection(1)], &[IFX; 5], T0, false).unwrap();
    h.0.lock().unwrap().fail = true;
    assert!(g.step(Some(&tick(T0, 8 * MS)), "", T0, &h).is_empty());
    assert!(
        g.status().reason.contains("flow map full"),
        "{:?}",
        g.status()
    );
    assert!(!g.list()[0].promoted);
    let mut t = tick(T0 + MS, 8 * MS);
    t.classes.retain(|c| c.class_id != BE);
    assert!(g.step(Some(&t), "", T0 + MS, &h).is_empty());
    assert!(
        g.status()
            .reason
            .contains("class 1:10 on cpe is not in the queue ticks"),
        "{:?}",
        g.status()
    );
    h.0.lock().unwrap().no_hierarchy = true;
    h.0.lock().unwrap().version += 1;
    assert!(g
        .step(Some(&tick(T0 + 2 * MS, 8 * MS)), "", T0 + 2 * MS, &h)
        .is_empty());
    assert!(g.status().reason.contains("cpe has no queue hierarchy"));
}

#[test]
fn a_disabled_guard_keeps_protections_but_moves_nothing() {
    let g = guard(GuardSettings {
        enabled: false,
        ..Default::default()
    });
    let h = hands();
    g.protect(&[protection(1)], &[IFX; 5], T0, false).unwrap();
    assert!(g.step(Some(&tick(T0, 50 * MS)), "", T0, &h).is_empty());
    let s = g.status();
    assert!(
        !s.acting && s.reason.contains("enabled = false") && s.protected_flows == 1,
        "{s:?}"
    );
}

#[test]
fn placements_are_looked_up_again_only_when_the_agent_changed() {
    let g = guard(GuardSettings::default());
    let h = hands();
    let gaming = Rule {
        class_id: GAMING,
        rewrite_dscp: None,
    };
    h.0.lock()
        .unwrap()
        .rules
        .insert(flow(1).encode_to_vec(), gaming);
    g.protect(&[protection(1)], &[IFX; 5], T0, false).unwrap();
    for i in 0..5 {
        assert!(g
            .step(Some(&tick(T0 + i * MS, 9 * MS)), "", T0 + i * MS, &h)
            .is_empty());
    }
    assert_eq!(
        h.0.lock().unwrap().lookups.get(),
        1,
        "one lookup for five ticks"
    );
    // SetFlowClass removed the flow's rule: the agent's generation moved on.
    h.0.lock().unwrap().rules.clear();
    h.0.lock().unwrap().version += 1;
    assert_eq!(
        g.step(Some(&tick(T0 + 9 * MS, 9 * MS)), "", T0 + 9 * MS, &h)
            .len(),
        1
    );
}

#[test]
fn a_burst_over_the_guard_for_one_tick_does_not_promote() {
    let g = Guard::new(GuardSettings::default()); // two ticks
    let h = hands();
    g.protect(&[protection(1)], &[IFX; 5], T0, false).unwrap();
    // A frame's burst: one tick at 6 ms, then drained; again later.
    for (i, delay) in [6 * MS, MS, 6 * MS, 0, 7 * MS].into_iter().enumerate() {
        let now = T0 + i as u64 * MS;
        assert!(
            g.step(Some(&tick(now, delay)), "", now, &h).is_empty(),
            "tick {i}"
        );
    }
    // Congestion: the second tick in a row over it promotes.
    let moves = g.step(Some(&tick(T0 + 5 * MS, 8 * MS)), "", T0 + 5 * MS, &h);
    assert_eq!(moves.len(), 1);
    assert!(
        moves[0].cause.ends_with("for 2 tick(s)"),
        "{}",
        moves[0].cause
    );
}

#[test]
fn a_measured_sojourn_over_the_guard_promotes_when_the_estimate_reads_low() {
    // Mid-flood the estimate read 0.00 ms in the lab while packets left the class after tens
    // of ms: the measured sojourn alone must promote (and keep a promoted flow from release).
    let g = guard(GuardSettings {
        hold_ms: 0,
        release_calm_ms: 0,
        ..Default::default()
    });
    let h = hands();
    g.protect(&[protection(1)], &[IFX; 5], T0, false).unwrap();
    let mut t = tick(T0, 0);
    t.classes[0].sojourn_max_ns = 30 * MS;
    let moves = g.step(Some(&t), "", T0, &h);
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(moves[0].kind, MoveKind::Promote);
    // Still 30 ms leaving the class it came from: not calm, no release.
    t.taken_ns += MS;
    assert!(g.step(Some(&t), "", T0 + MS, &h).is_empty());
    // Both calm: released.
    t.taken_ns += MS;
    t.classes[0].sojourn_max_ns = 0;
    let moves = g.step(Some(&t), "", T0 + 2 * MS, &h);
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(moves[0].kind, MoveKind::Release);
}
