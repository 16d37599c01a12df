//! The BPF program and the pcap twin on the same frames: thousands of seeded, mutated frames
//! (valid UDP/RTP, TCP, IPv6 with extension headers, VLAN, then truncated and bit-flipped) go
//! through the loaded XDP program (BPF_PROG_TEST_RUN) and through the twin's parser and
//! accounting; flow tables and failure reasons must agree exactly (timing fields aside).
//! Needs root; prints "skipped: needs root" otherwise.
use std::collections::HashMap;
use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, ProgramInput};

use crate::account::{account, new_flow, AccountConfig};
use crate::bpf_types::{key_bytes, FlowKey, FlowValue, KeyBytes, FIRST_ERROR_STAT, STAT_NAMES};
use crate::parse::parse_ethernet;
use crate::skel::FlowProbeSkelBuilder;

/// xorshift64*: a deterministic stream without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn base_frame(rng: &mut Rng, i: u64) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    if rng.below(4) == 0 {
        f.extend_from_slice(&[0x81, 0x00, 0x00, (rng.below(4) + 1) as u8]);
    }
    let flow = (rng.below(8)) as u8;
    let payload_len = 12 + rng.below(200) as usize;
    let mut l4 = Vec::new();
    let proto = match rng.below(3) {
        0 => {
            // TCP with random flags.
            l4.extend_from_slice(&[0x13, 0x88, 0x00, 80 + flow, 0, 0, 0, 1, 0, 0, 0, 0, 0x50]);
            l4.push(rng.below(256) as u8);
            l4.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]);
            l4.extend(std::iter::repeat_n(0x55u8, payload_len));
            6u8
        }
        _ => {
            // UDP carrying RTP, sequence = packet number (with occasional jumps).
            let len = (8 + payload_len) as u16;
            l4.extend_from_slice(&[0x13, 0x8c, 0x17, 0x70 + flow]);
            l4.extend_from_slice(&len.to_be_bytes());
            l4.extend_from_slice(&[0, 0, 0x80, 96 | if i % 7 == 0 { 0x80 } else { 0 }]);
            let seq = (i + rng.below(3)) as u16;
            l4.extend_from_slice(&seq.to_be_bytes());
            l4.extend_from_slice(&((i * 900) as u32).to_be_bytes());
            l4.extend_from_slice(&[0, 0, 0, flow]);
            l4.extend(std::iter::repeat_n(0u8, payload_len - 12));
            17u8
        }
    };
    if rng.below(3) == 0 {
        // IPv6 with 0-3 extension headers.
        f.extend_from_slice(&[0x86, 0xdd]);
        let exts = rng.below(4) as usize;
        let plen = (l4.len() + 8 * exts) as u16;
        f.extend_from_slice(&[0x60 | (rng.below(16) as u8), 0, 0, 0]);
        f.extend_from_slice(&plen.to_be_bytes());
        f.push(if exts > 0 { 60 } else { proto });
        f.push(64);
        f.extend_from_slice(&[0xfd; 15]);
        f.push(1);
        f.extend_from_slice(&[0xfd; 15]);
        f.push(2);
        for e in 0..exts {
            f.extend_from_slice(&[if e + 1 < exts { 60 } else { proto }, 0, 0, 0, 0, 0, 0, 0]);
        }
    } else {
        f.extend_from_slice(&[0x08, 0x00]);
        let total = (20 + l4.len()) as u16;
        f.extend_from_slice(&[0x45, rng.below(256) as u8]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    }
    f.extend_from_slice(&l4);
    f
}

fn mutate(rng: &mut Rng, f: &mut Vec<u8>) {
    match rng.below(6) {
        0 | 1 => {} // keep it valid
        2 => f.truncate(14 + rng.below(f.len() as u64 - 13) as usize),
        _ => {
            for _ in 0..1 + rng.below(3) {
                let at = 12 + rng.below(70.min(f.len() as u64 - 12)) as usize;
                f[at] ^= 1 << rng.below(8);
            }
        }
    }
}

/// The fields that do not depend on when a packet arrived.
fn comparable(v: &FlowValue) -> Vec<u64> {
    let r = &v.rtp;
    let mut out = vec![v.packets, v.bytes, v.size_sum_sq, v.tcp_flags_life as u64];
    out.push(v.last_dscp as u64);
    out.extend(v.ecn.iter().map(|x| *x as u64));
    out.extend(v.size_hist.iter().map(|x| *x as u64));
    out.extend([
        r.state as u64,
        r.received,
        r.reordered,
        r.gaps,
        r.duplicates,
        r.markers,
    ]);
    out.extend([
        r.max_seq as u64,
        r.cycles as u64,
        r.ssrc as u64,
        r.payload_type as u64,
    ]);
    out
}

fn normalise(mut k: FlowKey) -> KeyBytes {
    k.ifindex = 0;
    k.direction = 0;
    key_bytes(&k)
}

#[test]
fn bpf_program_and_twin_agree_on_mutated_frames() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let mut storage = MaybeUninit::uninit();
    let skel = FlowProbeSkelBuilder::default()
        .open(&mut storage)
        .unwrap()
        .load()
        .unwrap();
    let cfg = AccountConfig::default();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut twin: HashMap<KeyBytes, FlowValue> = HashMap::new();
    let mut twin_stats = [0u64; STAT_NAMES.len()];
    for i in 0..4000 {
        let mut frame = base_frame(&mut rng, i);
        mutate(&mut rng, &mut frame);
        let input = ProgramInput {
            data_in: Some(&frame),
            ..Default::default()
        };
        let out = skel.progs.cgloop_xdp_ingress.test_run(input).unwrap();
        assert_eq!(out.return_value, 2, "XDP_PASS for every frame");
        match parse_ethernet(&frame, frame.len() as u32) {
            Ok(p) => {
                let v = twin
                    .entry(normalise(p.key))
                    .or_insert_with(|| new_flow(i, 0, p.l3_len));
                account(v, &p, i, 0, &cfg);
            }
            Err(skip) => twin_stats[skip.0] += 1,
        }
    }
    let mut bpf: HashMap<KeyBytes, FlowValue> = HashMap::new();
    let mut reader = crate::probe::TableReader::new(1024);
    for (k, v) in reader.read(&skel.maps.flows).unwrap().drain(..) {
        bpf.insert(normalise(k), v);
    }
    assert_eq!(bpf.len(), twin.len(), "same number of flows");
    for (k, v) in &twin {
        let b = bpf.get(k).expect("the twin's flow exists in the BPF table");
        assert_eq!(comparable(b), comparable(v), "flow {k:?}");
    }
    for (i, name) in STAT_NAMES.iter().enumerate().skip(FIRST_ERROR_STAT) {
        let per_cpu = skel
            .maps
            .probe_stats
            .lookup_percpu(&(i as u32).to_ne_bytes(), MapFlags::ANY);
        let total: u64 = per_cpu
            .unwrap()
            .unwrap()
            .iter()
            .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap()))
            .sum();
        assert_eq!(total, twin_stats[i], "{name}");
    }
    assert!(
        twin_stats[FIRST_ERROR_STAT..].iter().sum::<u64>() > 100,
        "mutations hit the parser"
    );
}

/// The sweep's table read returns every flow, across many batches: a hash map hands out whole
/// buckets, so batches come back shorter than asked and the reader must go on until ENOENT.
#[test]
fn table_reader_returns_every_flow_across_batches() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let mut storage = MaybeUninit::uninit();
    let skel = FlowProbeSkelBuilder::default()
        .open(&mut storage)
        .unwrap()
        .load()
        .unwrap();
    let n = 10_000u32;
    for i in 0..n {
        let mut k = FlowKey::default();
        k.src_addr[..4].copy_from_slice(&i.to_be_bytes());
        k.family = 4;
        k.ip_proto = 17;
        let v = FlowValue {
            packets: i as u64 + 1,
            ..Default::default()
        };
        skel.maps
            .flows
            .update(
                &key_bytes(&k),
                unsafe { plain::as_bytes(&v) },
                MapFlags::ANY,
            )
            .unwrap();
    }
    for batch in [1000, 4096] {
        let mut reader = crate::probe::TableReader::new(batch);
        let entries = reader.read(&skel.maps.flows).unwrap();
        assert_eq!(entries.len(), n as usize, "batch {batch}");
        let mut seen: Vec<u32> = entries
            .iter()
            .map(|(k, v)| {
                let i = u32::from_be_bytes(k.src_addr[..4].try_into().unwrap());
                assert_eq!(v.packets, i as u64 + 1);
                i
            })
            .collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), n as usize, "batch {batch}: each flow once");
    }
}
