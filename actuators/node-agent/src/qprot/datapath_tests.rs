//! RFC 9957's decisions replayed on crafted packet sequences through the real classifier
//! (cgl_classify, BPF_PROG_TEST_RUN on loopback), with the LL queue delay set through the
//! monitor's state. Needs root; prints "skipped: needs root" otherwise.
use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, ProgramInput};

use super::cfg_of;
use crate::config::QueueProtectionSettings;
use crate::datapath::{bytes_of, from_bytes, FlowKey, QmonClass, QmonKey, QprotFlow};

mod skel {
    #![allow(clippy::all, dead_code, non_camel_case_types, unused_imports)]
    include!(concat!(env!("OUT_DIR"), "/agent.skel.rs"));
}

const LO: u32 = 1;
const SKB_PRIORITY: usize = 32;
const SKB_SIZE: usize = 192;
const LL: u32 = 0x10040;
const CLASSIC: u32 = 0x10010;
const ECT1: u8 = 1;
const ECT0: u8 = 2;
/// Frame length of `frame(_, _, 1000)`: Ethernet 14 + IPv4 20 + UDP 8 + 1000.
const LEN: u64 = 1042;

fn frame(sport: u16, tos: u8, payload: usize) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 8, 0];
    let mut ip = vec![0x45, tos];
    ip.extend_from_slice(&((28 + payload) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    let sum = checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&9000u16.to_be_bytes());
    f.extend_from_slice(&((8 + payload) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend(std::iter::repeat_n(0u8, payload));
    f
}

fn checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

struct Bed<'a> {
    skel: skel::AgentSkel<'a>,
}

impl Bed<'_> {
    /// The LL class's queue delay as the classifier will read it: 1 ns per byte of backlog.
    fn set_qdelay(&self, ns: u64) {
        let c = QmonClass {
            backlog_bytes: ns as i64,
            ns_per_kb: 1024,
            ..Default::default()
        };
        self.skel
            .maps
            .qmon_stats
            .update(&0u32.to_ne_bytes(), bytes_of(&c), MapFlags::ANY)
            .unwrap();
    }

    /// (class the packet went to, its TOS byte after the classifier).
    fn send(&self, sport: u16, tos: u8) -> (u32, u8) {
        let f = frame(sport, tos, 1000);
        let mut ctx_in = vec![0u8; SKB_SIZE];
        let mut ctx_out = vec![0u8; SKB_SIZE];
        let mut data_out = vec![0u8; f.len() + 64];
        let input = ProgramInput {
            context_in: Some(&mut ctx_in),
            context_out: Some(&mut ctx_out),
            data_in: Some(&f),
            data_out: Some(&mut data_out),
            ..Default::default()
        };
        let out = self
            .skel
            .progs
            .cgl_classify
            .test_run(input)
            .expect("BPF_PROG_TEST_RUN");
        let ctx = out.context.expect("__sk_buff back");
        let data = out.data.expect("frame back");
        assert_eq!(checksum(&data[14..34]), 0, "IPv4 checksum still valid");
        (
            u32::from_ne_bytes(ctx[SKB_PRIORITY..SKB_PRIORITY + 4].try_into().unwrap()),
            data[15],
        )
    }

    fn sanctions(&self, sport: u16) -> QprotFlow {
        let mut k = FlowKey {
            ifindex: LO,
            family: 4,
            proto: 17,
            sport,
            dport: 9000,
            ..Default::default()
        };
        k.src[..4].copy_from_slice(&[10, 0, 0, 1]);
        k.dst[..4].copy_from_slice(&[10, 0, 0, 2]);
        let v = self
            .skel
            .maps
            .qprot_flows
            .lookup(bytes_of(&k), MapFlags::ANY)
            .unwrap();
        v.map(|v| from_bytes(&v)).unwrap_or_default()
    }

    fn counters(&self) -> QmonClass {
        from_bytes(
            &self
                .skel
                .maps
                .qmon_stats
                .lookup(&0u32.to_ne_bytes(), MapFlags::ANY)
                .unwrap()
                .unwrap(),
        )
    }
}

fn bed<'a>(
    storage: &'a mut MaybeUninit<libbpf_rs::OpenObject>,
    s: &QueueProtectionSettings,
) -> Bed<'a> {
    let skel = skel::AgentSkelBuilder::default()
        .open(storage)
        .unwrap()
        .load()
        .unwrap();
    let m = &skel.maps;
    m.if_default
        .update(&LO.to_ne_bytes(), &CLASSIC.to_ne_bytes(), MapFlags::ANY)
        .unwrap();
    m.qprot_cfg
        .update(&LO.to_ne_bytes(), bytes_of(&cfg_of(s, 0)), MapFlags::ANY)
        .unwrap();
    let zero = vec![0u8; m.qprot_state.value_size() as usize];
    m.qprot_state
        .update(&LO.to_ne_bytes(), &zero, MapFlags::ANY)
        .unwrap();
    let key = QmonKey {
        ifindex: LO,
        classid: LL,
    };
    m.qmon_index
        .update(bytes_of(&key), &0u32.to_ne_bytes(), MapFlags::ANY)
        .unwrap();
    Bed { skel }
}

fn settings() -> QueueProtectionSettings {
    QueueProtectionSettings {
        ll_class_id: LL,
        classic_class_id: CLASSIC,
        interfaces: vec!["lo".into()],
        ..Default::default()
    }
}

fn root() -> bool {
    let ok = unsafe { libc::geteuid() } == 0;
    if !ok {
        eprintln!("skipped: needs root");
    }
    ok
}

#[test]
fn ecn_rule_and_step_marking() {
    if !root() {
        return;
    }
    let mut storage = MaybeUninit::uninit();
    let b = bed(&mut storage, &settings());
    b.set_qdelay(500_000); // below the 1 ms step
    assert_eq!(
        b.send(5000, ECT1),
        (LL, ECT1),
        "ECT(1): LL class, not marked below the step"
    );
    assert_eq!(b.send(5001, 3), (LL, 3), "CE: LL class");
    // Priority 0: left to HTB's default class (the classic one here).
    assert_eq!(b.send(5002, 0), (0, 0), "not-ECT: the default class");
    assert_eq!(
        b.send(5003, ECT0),
        (0, ECT0),
        "ECT(0) is classic ECN: the default class"
    );
    b.set_qdelay(1_000_000);
    assert_eq!(b.send(5004, ECT1), (LL, 3), "at the step: marked CE");
    assert_eq!(b.counters().ce_marked, 1);
}

#[test]
fn rfc9957_sanctions_a_flow_only_over_both_thresholds_and_ages_its_score() {
    if !root() {
        return;
    }
    let mut storage = MaybeUninit::uninit();
    // LG_AGING 17 and CRITICALqLSCORE 10 ms instead of CableLabs' 19 and 4 ms: the same
    // decisions with a margin of milliseconds, so a loaded machine's delay between two test
    // runs (the score drains meanwhile) cannot flip them.
    let scaled = QueueProtectionSettings {
        lg_aging: 17,
        critical_score_us: 10_000,
        ..settings()
    };
    let b = bed(&mut storage, &scaled);
    // probNative = 1 above 1 ms: each 1042-byte packet adds 1042 × 2^(30-17) ns ≈ 8.5 ms of
    // score (AGING 2^17 B/s), so the 2nd back-to-back packet passes CRITICALqLSCORE (10 ms).
    let per_packet_ns = LEN << 13;
    b.set_qdelay(2_000_000);
    assert_eq!(
        b.send(6000, ECT1).0,
        LL,
        "score {per_packet_ns} ns: passes (marked)"
    );
    assert_eq!(
        b.send(6000, ECT1).0,
        CLASSIC,
        "score ~17 ms > 10 ms while qdelay 2 ms > 1 ms: sanctioned"
    );
    assert_eq!(b.send(6000, ECT1).0, CLASSIC, "still over both thresholds");
    let f = b.sanctions(6000);
    assert_eq!(
        (f.packets, f.bytes, f.from_class, f.to_class),
        (2, 2 * LEN, LL, CLASSIC)
    );
    assert!(
        f.max_score_ns > 15_000_000 && f.max_qdelay_ns == 2_000_000,
        "{f:?}"
    );
    assert_eq!(b.counters().qprot_sanctioned, 2);
    // Another flow has its own bucket: its first packet passes at the same queue delay.
    assert_eq!(
        b.send(6001, ECT1).0,
        LL,
        "an innocent flow is not sanctioned for another's score"
    );
    // Below the critical delay nobody is sanctioned, whatever the score.
    b.set_qdelay(900_000);
    assert_eq!(
        b.send(6000, ECT1).0,
        LL,
        "qdelay 0.9 ms <= 1 ms: no sanction"
    );
    // The score ages at 2^17 B/s (1 ns per ns): < 35 ms of score has drained 60 ms later.
    std::thread::sleep(std::time::Duration::from_millis(60));
    b.set_qdelay(2_000_000);
    assert_eq!(b.send(6000, ECT1).0, LL, "score drained: passes again");
    assert_eq!(b.sanctions(6001).packets, 0);
}

#[test]
fn below_the_ramp_a_flow_scores_nothing_and_protection_off_never_sanctions() {
    if !root() {
        return;
    }
    let mut storage = MaybeUninit::uninit();
    let b = bed(&mut storage, &settings());
    b.set_qdelay(400_000); // under MINTH (475 µs): probNative 0, no score however many packets
    for _ in 0..50 {
        assert_eq!(b.send(7000, ECT1).0, LL);
    }
    b.set_qdelay(2_000_000);
    assert_eq!(
        b.send(7000, ECT1).0,
        LL,
        "no score built below the ramp: the first packet passes"
    );

    let mut storage = MaybeUninit::uninit();
    let off = bed(
        &mut storage,
        &QueueProtectionSettings {
            enabled: false,
            ..settings()
        },
    );
    off.set_qdelay(5_000_000);
    for _ in 0..20 {
        assert_eq!(
            off.send(7001, ECT1),
            (LL, 3),
            "protection off: LL class, marked"
        );
    }
    assert_eq!(off.sanctions(7001).packets, 0);
}
