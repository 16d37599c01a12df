//! Power module tests: a fake sysfs tree laid out like the kernel's, every write checked, and
//! X-MAN decisions on counter traces (Xiang thesis ch. 4).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::config::{FunctionSpec, PowerConfig, XmanParams};
use super::counters::{CounterSnapshot, CounterSource, FnCounters, TraceSource};
use super::cpufreq::{Cpufreq, SysfsWrite};
use super::error::PowerError;
use super::manager::{CorePolicy, PowerManager, XmanMode};
use super::xman::{round_up_index, Reason};

const GHZ: u32 = 1_000_000;
/// 3.0 … 1.2 GHz in 300 MHz steps, as acpi-cpufreq lists them.
const FREQS: [u32; 7] = [
    3_000_000, 2_700_000, 2_400_000, 2_100_000, 1_800_000, 1_500_000, 1_200_000,
];
const MS: u64 = 1_000_000;

/// `<tmp>/sys/devices/system/cpu/cpufreq/policyN/…` plus the `cpuN/cpufreq` links.
struct FakeSysfs {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

fn put(dir: &Path, name: &str, value: &str) {
    std::fs::write(dir.join(name), format!("{value}\n")).expect("write fake sysfs");
}

impl FakeSysfs {
    /// policy0 → cpu0, policy1 → cpu1 (both with a frequency table), policy2 → cpus 2 and 3
    /// (no table, like intel_pstate).
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let cpu = dir.path().join("sys/devices/system/cpu");
        let root = cpu.join("cpufreq");
        let table: Vec<String> = FREQS.iter().map(u32::to_string).collect();
        for (id, cpus, with_table) in [(0, "0", true), (1, "1", true), (2, "2 3", false)] {
            let p = root.join(format!("policy{id}"));
            std::fs::create_dir_all(&p).expect("mkdir");
            put(&p, "affected_cpus", cpus);
            put(&p, "related_cpus", cpus);
            let (lo, hi) = if with_table {
                (1_200_000, 3_000_000)
            } else {
                (800_000, 1_200_000)
            };
            put(&p, "cpuinfo_min_freq", &lo.to_string());
            put(&p, "cpuinfo_max_freq", &hi.to_string());
            put(&p, "cpuinfo_transition_latency", "10000");
            if with_table {
                put(&p, "scaling_available_frequencies", &table.join(" "));
            }
            put(
                &p,
                "scaling_available_governors",
                "performance powersave userspace schedutil",
            );
            put(&p, "scaling_driver", "acpi-cpufreq");
            put(&p, "scaling_governor", "schedutil");
            put(&p, "scaling_min_freq", &lo.to_string());
            put(&p, "scaling_max_freq", &hi.to_string());
            put(&p, "scaling_cur_freq", &hi.to_string());
            put(&p, "scaling_setspeed", "<unsupported>");
            for c in cpus.split_whitespace() {
                let d = cpu.join(format!("cpu{c}"));
                std::fs::create_dir_all(&d).expect("mkdir cpu");
                std::os::unix::fs::symlink(format!("../cpufreq/policy{id}"), d.join("cpufreq"))
                    .expect("symlink");
            }
        }
        Self { _dir: dir, root }
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.root.join(file))
            .expect("read")
            .trim()
            .to_owned()
    }
}

fn w(file: &str, value: u32) -> SysfsWrite {
    SysfsWrite {
        file: file.into(),
        value: value.to_string(),
    }
}

fn ws(file: &str, value: &str) -> SysfsWrite {
    SysfsWrite {
        file: file.into(),
        value: value.into(),
    }
}

/// One function per entry: (fn index, core); c_task = 1000 cycles so that packets per ms equal
/// the demand in MHz (1000 packets/ms = 1 GHz of work).
fn config(sysfs: &FakeSysfs, functions: &[(u32, u32)]) -> PowerConfig {
    PowerConfig {
        cpufreq_root: sysfs.root.clone(),
        functions: functions
            .iter()
            .map(|&(index, core)| FunctionSpec {
                index,
                name: format!("fn{index}"),
                core,
                c_task_cycles: 1000.0,
            })
            .collect(),
        ..PowerConfig::default()
    }
}

fn manager(
    sysfs: &FakeSysfs,
    config: PowerConfig,
    reads: Vec<CounterSnapshot>,
) -> (PowerManager, Arc<Mutex<Vec<SysfsWrite>>>) {
    let journal = Arc::new(Mutex::new(Vec::new()));
    let backend = Cpufreq::new(&sysfs.root).with_journal(journal.clone());
    let m = PowerManager::new(config, backend, Box::new(TraceSource::new(reads))).expect("manager");
    (m, journal)
}

fn policy(cores: &[u32], mode: XmanMode, min_khz: u32, max_khz: u32) -> CorePolicy {
    CorePolicy {
        cores: cores.to_vec(),
        governor: String::new(),
        min_khz,
        max_khz,
        mode,
    }
}

fn take(journal: &Arc<Mutex<Vec<SysfsWrite>>>) -> Vec<SysfsWrite> {
    std::mem::take(&mut *journal.lock().expect("journal"))
}

/// Builds counter reads: per segment (reads, period, packets per read per function, egress
/// shortfall per read).
#[derive(Default)]
struct Trace {
    at_ns: u64,
    totals: BTreeMap<u32, FnCounters>,
    reads: Vec<CounterSnapshot>,
}

impl Trace {
    fn segment(&mut self, reads: usize, period_ns: u64, per_read: &[(u32, u64, u64)]) -> &mut Self {
        for _ in 0..reads {
            self.at_ns += period_ns;
            for &(index, packets, lost) in per_read {
                let c = self.totals.entry(index).or_default();
                c.rx_packets += packets;
                c.tx_packets += packets - lost;
                if packets > 0 {
                    c.rx_last_ns = self.at_ns;
                }
            }
            self.reads.push(CounterSnapshot {
                at_ns: self.at_ns,
                functions: self.totals.clone(),
            });
        }
        self
    }

    fn build(&mut self) -> Vec<CounterSnapshot> {
        std::mem::take(&mut self.reads)
    }
}

/// Run every read; return (at_ns, period) per step.
fn run(m: &mut PowerManager, reads: usize) -> Vec<Duration> {
    (0..reads).map(|_| m.step().expect("step")).collect()
}

fn switches(m: &PowerManager) -> Vec<(u64, u32, Reason)> {
    m.decisions()
        .map(|d| (d.at_ns, d.to_khz, d.reason))
        .collect()
}

#[test]
fn discovers_policies_and_synthesises_a_table_without_one() {
    let sysfs = FakeSysfs::new();
    let infos = Cpufreq::new(&sysfs.root).policies().expect("policies");
    assert_eq!(
        infos.iter().map(|p| p.id).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(infos[0].available_khz, FREQS.to_vec());
    assert_eq!(infos[2].cpus, vec![2, 3]);
    assert!(infos[2].available_khz.is_empty());
    let (mut m, _) = manager(&sysfs, config(&sysfs, &[]), vec![]);
    let report = m
        .apply_policy(&policy(&[2], XmanMode::PinnedMax, 0, 0), false)
        .expect("apply");
    // Cores sharing the clock are reported as applied too.
    assert_eq!(report.applied[0].cores, vec![2, 3]);
    let state = m.state(&[3]).expect("state");
    assert_eq!(
        state[0].pstates_khz,
        vec![1_200_000, 1_100_000, 1_000_000, 900_000, 800_000]
    );
    assert_eq!(state[0].setspeed_khz, Some(1_200_000));
}

#[test]
fn apply_policy_writes_governor_limits_and_setspeed_in_order() {
    let sysfs = FakeSysfs::new();
    let (mut m, journal) = manager(&sysfs, config(&sysfs, &[]), vec![]);

    let off = CorePolicy {
        cores: vec![0],
        governor: "performance".into(),
        min_khz: 1_200_000,
        max_khz: 1_500_000,
        mode: XmanMode::Off,
    };
    let report = m.apply_policy(&off, false).expect("off");
    assert_eq!(report.previous[0].governor, "schedutil");
    assert_eq!(
        (report.previous[0].min_khz, report.previous[0].max_khz),
        (1_200_000, 3 * GHZ)
    );
    assert_eq!(
        take(&journal),
        vec![
            ws("policy0/scaling_governor", "performance"),
            w("policy0/scaling_min_freq", 1_200_000),
            w("policy0/scaling_max_freq", 1_500_000),
        ]
    );

    // Raising above the current maximum: the maximum must go first.
    let report = m.apply_policy(&policy(&[0], XmanMode::Load, 2_400_000, 3 * GHZ), false);
    assert_eq!(report.expect("load").previous[0], off);
    assert_eq!(
        take(&journal),
        vec![
            ws("policy0/scaling_governor", "userspace"),
            w("policy0/scaling_max_freq", 3 * GHZ),
            w("policy0/scaling_min_freq", 2_400_000),
            // f_cpu,0 = f_max (Algorithm 1 line 16).
            w("policy0/scaling_setspeed", 3 * GHZ),
        ]
    );
    assert_eq!(sysfs.read("policy0/scaling_setspeed"), "3000000");
    assert_eq!(
        sysfs.read("policy1/scaling_governor"),
        "schedutil",
        "other policies untouched"
    );

    let state = &m.state(&[0]).expect("state")[0];
    assert_eq!(state.governor, "userspace");
    assert_eq!((state.min_khz, state.max_khz), (2_400_000, 3 * GHZ));
    assert_eq!(state.pstates_khz, vec![3 * GHZ, 2_700_000, 2_400_000]);
    assert_eq!(state.mode, XmanMode::Load);
}

#[test]
fn invalid_policies_are_refused_without_writes() {
    let sysfs = FakeSysfs::new();
    let mut cfg = config(&sysfs, &[]);
    cfg.hard_max_khz = 2_700_000;
    cfg.managed_cores = vec![0, 1, 2];
    let (mut m, journal) = manager(&sysfs, cfg, vec![]);
    let cases = [
        (
            policy(&[0], XmanMode::Load, 0, 3 * GHZ),
            "outside the allowed 1200000..2700000",
        ),
        (
            policy(&[0], XmanMode::Load, 1_200_000, 1_100_000),
            "outside the allowed",
        ),
        (
            policy(&[0], XmanMode::Load, 1_000_000, 0),
            "outside the allowed",
        ),
        (
            policy(&[7], XmanMode::Load, 0, 0),
            "core 7 has no cpufreq policy",
        ),
        (policy(&[], XmanMode::Load, 0, 0), "no cores"),
        (policy(&[2], XmanMode::Load, 0, 0), "core 3 shares policy2"),
        (
            policy(&[0], XmanMode::Load, 1_900_000, 2_000_000),
            "no P-state",
        ),
        (
            CorePolicy {
                governor: "performance".into(),
                ..policy(&[1], XmanMode::Feedback, 0, 0)
            },
            "governor must be \"userspace\"",
        ),
        (
            CorePolicy {
                governor: "ondemand".into(),
                ..policy(&[1], XmanMode::Off, 0, 0)
            },
            "governor \"ondemand\" not available",
        ),
        (
            policy(&[1], XmanMode::Off, 0, 0),
            "mode off needs a governor",
        ),
    ];
    for (p, expected) in cases {
        match m.apply_policy(&p, false) {
            Err(PowerError::InvalidPolicy(msg)) => {
                assert!(msg.contains(expected), "{p:?}: {msg:?} lacks {expected:?}")
            }
            other => panic!("{p:?} accepted: {other:?}"),
        }
    }
    // A dry run validates and reports but writes nothing.
    let report = m
        .apply_policy(&policy(&[1], XmanMode::Load, 0, 0), true)
        .expect("dry run");
    assert!(report.dry_run);
    assert_eq!(
        report.applied[0].max_khz, 2_700_000,
        "0 means the highest allowed"
    );
    assert!(take(&journal).is_empty());
    assert_eq!(sysfs.read("policy1/scaling_governor"), "schedutil");
}

#[test]
fn a_write_the_kernel_does_not_keep_is_reported() {
    let sysfs = FakeSysfs::new();
    let backend = Cpufreq::new(&sysfs.root);
    // An attribute that swallows writes, like a kernel ignoring setspeed under another governor.
    let setspeed = sysfs.root.join("policy0/scaling_setspeed");
    std::fs::remove_file(&setspeed).expect("rm");
    std::os::unix::fs::symlink("/dev/null", &setspeed).expect("symlink");
    match backend.set_speed(0, 1_500_000) {
        Err(PowerError::NotApplied { wrote, read, .. }) => {
            assert_eq!((wrote.as_str(), read.as_str()), ("1500000", ""))
        }
        other => panic!("an ignored write must be reported, got {other:?}"),
    }
    std::fs::remove_file(sysfs.root.join("policy1/scaling_setspeed")).expect("rm");
    match backend.set_speed(1, 1_500_000) {
        Err(PowerError::Io { path, .. }) => assert!(path.ends_with("policy1/scaling_setspeed")),
        other => panic!("missing attribute must fail, got {other:?}"),
    }
    assert!(
        !sysfs.root.join("policy1/scaling_setspeed").exists(),
        "never creates attributes"
    );
    put(&sysfs.root.join("policy1"), "scaling_cur_freq", "fast");
    match backend.read_policy(1) {
        Err(PowerError::Parse { value, .. }) => assert_eq!(value, "fast"),
        other => panic!("garbage must fail to parse, got {other:?}"),
    }
}

#[test]
fn idle_drops_to_f_min_then_first_packet_restores_f_max() {
    let sysfs = FakeSysfs::new();
    let mut trace = Trace::default();
    let params = XmanParams::default();
    // 10 ms of traffic, n_z,max empty reads at 1 ms, then idle polling at 100 µs, then a packet.
    trace
        .segment(10, MS, &[(1, 500, 0)])
        .segment(params.n_z_max as usize, MS, &[(1, 0, 0)])
        .segment(20, MS / 10, &[(1, 0, 0)])
        .segment(1, MS / 10, &[(1, 1, 0)]);
    let reads = trace.build();
    let n = reads.len();
    let (mut m, journal) = manager(&sysfs, config(&sysfs, &[(1, 0)]), reads);
    m.apply_policy(&policy(&[0], XmanMode::Load, 0, 0), false)
        .expect("apply");
    take(&journal);
    let periods = run(&mut m, n);

    let idle_at = (10 + params.n_z_max as u64) * MS;
    let wake_at = idle_at + 21 * MS / 10;
    assert_eq!(
        switches(&m)[1..],
        [
            (idle_at, 1_200_000, Reason::Idle),
            (wake_at, 3 * GHZ, Reason::Wake)
        ],
        "the wake-up 2.1 ms after the idle switch ignores the 30 ms dwell"
    );
    // Read period: T_m while active, 100 µs once idle, T_m again after the wake-up.
    let idle_step = 10 + params.n_z_max as usize - 1;
    assert!(periods[..idle_step].iter().all(|p| *p == params.t_m_active));
    assert!(periods[idle_step..n - 1]
        .iter()
        .all(|p| *p == params.t_m_idle));
    assert_eq!(periods[n - 1], params.t_m_active);
    assert_eq!(
        take(&journal),
        vec![
            w("policy0/scaling_setspeed", 1_200_000),
            w("policy0/scaling_setspeed", 3 * GHZ)
        ]
    );
}

#[test]
fn sustained_load_scales_down_then_up_with_the_trend_rules() {
    let sysfs = FakeSysfs::new();
    let mut trace = Trace::default();
    // Phase A: 1.0 GHz of work (ρ = 0.33 at 3 GHz); phase B: 1.35 GHz (ρ = 0.9 at 1.5 GHz).
    trace
        .segment(100, MS, &[(1, 1000, 0)])
        .segment(60, MS, &[(1, 1350, 0)]);
    let reads = trace.build();
    let (mut m, journal) = manager(&sysfs, config(&sysfs, &[(1, 0)]), reads);
    m.apply_policy(&policy(&[0], XmanMode::Load, 0, 0), false)
        .expect("apply");
    take(&journal);
    run(&mut m, 160);
    // Read 1 is the baseline; reads 2..=26 fill the WMA window; the down counter grows by 2
    // from sample 25 (read 26) and passes 90 at its 46th hint (read 71): 1.0/0.7 = 1.43 GHz
    // rounds up to 1.5 GHz.
    // Phase B (reads 101..): ρ_WMA passes 0.75 once 6 of the 25 WMA samples are new (linear
    // weights: 135/325 of the weight → WMA 1.145 GHz > 0.75 · 1.5 GHz), at read 106; the up
    // counter grows by 3 per read and passes 90 at the 31st hint (read 136), when the 25 newest
    // samples are all 1.35 GHz: 1.35/0.7 = 1.93 → 2.1 GHz.
    assert_eq!(
        switches(&m)[1..],
        [
            (71 * MS, 1_500_000, Reason::TrendDown),
            (136 * MS, 2_100_000, Reason::TrendUp)
        ]
    );
    assert_eq!(
        take(&journal),
        vec![
            w("policy0/scaling_setspeed", 1_500_000),
            w("policy0/scaling_setspeed", 2_100_000)
        ]
    );
}

#[test]
fn core_runs_at_the_maximum_its_functions_want() {
    let sysfs = FakeSysfs::new();
    let mut trace = Trace::default();
    // fn1 needs 1.0 GHz (→ 1.5 GHz), fn2 1.8 GHz (ρ 0.6 at 3 GHz → 1.8/0.7 = 2.57 → 2.7 GHz),
    // fn3 lives on core 1 and is idle. Then fn2 stops: the core follows fn1 alone, at f_min of
    // fn2's idleness being lower than fn1's 1.5 GHz.
    trace
        .segment(100, MS, &[(1, 1000, 0), (2, 1800, 0), (3, 0, 0)])
        .segment(40, MS, &[(1, 1000, 0), (2, 0, 0), (3, 0, 0)]);
    let reads = trace.build();
    let (mut m, _) = manager(&sysfs, config(&sysfs, &[(1, 0), (2, 0), (3, 1)]), reads);
    m.apply_policy(&policy(&[0, 1], XmanMode::Load, 0, 0), false)
        .expect("apply");
    run(&mut m, 100);
    assert_eq!(sysfs.read("policy0/scaling_setspeed"), "2700000");
    assert_eq!(
        sysfs.read("policy1/scaling_setspeed"),
        "1200000",
        "idle core at f_min"
    );
    run(&mut m, 40);
    assert_eq!(sysfs.read("policy0/scaling_setspeed"), "1500000");
    let state = m.state(&[0, 1]).expect("state");
    assert_eq!(state[0].idle_functions, vec![2]);
    assert_eq!(state[1].idle_functions, vec![3]);
    let to: Vec<(u32, u32)> = m.decisions().map(|d| (d.policy, d.to_khz)).collect();
    // fn1 alone would have pulled the core to 1.5 GHz at read 71; fn2 held it at 2.7 GHz.
    assert_eq!(
        to,
        vec![
            (0, 3 * GHZ),
            (1, 3 * GHZ),
            (1, 1_200_000),
            (0, 2_700_000),
            (0, 1_500_000)
        ]
    );
}

#[test]
fn feedback_steps_down_without_loss_and_halves_the_index_on_loss() {
    let sysfs = FakeSysfs::new();
    let mut trace = Trace::default();
    trace
        .segment(122, MS, &[(1, 100, 0)])
        .segment(100, MS, &[(1, 100, 3)]);
    let reads = trace.build();
    let (mut m, _) = manager(&sysfs, config(&sysfs, &[(1, 0)]), reads);
    m.apply_policy(&policy(&[0], XmanMode::Feedback, 0, 0), false)
        .expect("apply");
    run(&mut m, 222);
    use Reason::{FeedbackLoss as Loss, FeedbackProbe as Probe};
    // The FB interval starts at read 2 (first sample with packets) and lasts 30 ms.
    assert_eq!(
        switches(&m)[1..],
        [
            (32 * MS, 2_700_000, Probe),  // index 1
            (62 * MS, 2_400_000, Probe),  // 2
            (92 * MS, 2_100_000, Probe),  // 3
            (122 * MS, 1_800_000, Probe), // 4
            (152 * MS, 2_400_000, Loss),  // 4 / 2 = 2
            (182 * MS, 2_700_000, Loss),  // 1
            (212 * MS, 3 * GHZ, Loss),    // 0
        ]
    );
}

#[test]
fn dwell_spaces_switches_and_bounds_limit_every_write() {
    let sysfs = FakeSysfs::new();
    let mut cfg = config(&sysfs, &[(1, 0)]);
    // FB wants a new P-state every 5 ms; the 30 ms dwell must hold the core back.
    cfg.xman.fb_interval = Duration::from_millis(5);
    let mut trace = Trace::default();
    trace.segment(40, MS, &[(1, 100, 0)]);
    for _ in 0..8 {
        // Loss and no loss alternate every 10 ms: FB wants a different index every 5 ms.
        trace
            .segment(10, MS, &[(1, 100, 3)])
            .segment(10, MS, &[(1, 100, 0)]);
    }
    trace
        .segment(40, MS, &[(1, 0, 0)])
        .segment(3, MS / 10, &[(1, 5, 0)]);
    let reads = trace.build();
    let n = reads.len();
    let (mut m, journal) = manager(&sysfs, cfg, reads);
    m.apply_policy(
        &policy(&[0], XmanMode::Feedback, 1_500_000, 2_400_000),
        false,
    )
    .expect("apply");
    run(&mut m, n);
    let s = switches(&m);
    assert!(
        s.len() >= 6,
        "the trace must make the loop switch often: {s:?}"
    );
    for pair in s.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(
            pair[1].2 == Reason::Wake || gap >= 30 * MS,
            "switches {pair:?} only {gap} ns apart"
        );
    }
    // By the end of the first dwell FB had stepped down 4 times (reads 7, 12, 17, 22, 27):
    // the table holds 4 P-states, so the core lands on the lowest one.
    assert_eq!(s[1], (30 * MS, 1_500_000, Reason::FeedbackProbe));
    assert!(s.iter().any(|d| d.2 == Reason::FeedbackLoss), "{s:?}");
    assert!(s.iter().any(|d| d.2 == Reason::Idle), "{s:?}");
    assert_eq!(
        s.last().map(|d| (d.1, d.2)),
        Some((2_400_000, Reason::Wake)),
        "f_max = policy max"
    );
    let written: Vec<u32> = take(&journal)
        .iter()
        .filter(|w| w.file.ends_with("scaling_setspeed"))
        .map(|w| w.value.parse().expect("kHz"))
        .collect();
    assert!(
        written.contains(&1_500_000),
        "idle → the policy's minimum, {written:?}"
    );
    assert!(
        written.iter().all(|f| (1_500_000..=2_400_000).contains(f)),
        "{written:?}"
    );
}

#[test]
fn trace_text_round_trip_and_errors() {
    let text = "# at_ns fn rx tx\n1000 1 10 10\n1000 2 5 4\n2000 1 20 19 100 90 1999 1998\n";
    let mut t = TraceSource::parse(text).expect("parse");
    assert_eq!(t.remaining(), 2);
    let first = t.read(&[1, 2]).expect("read");
    assert_eq!(first.functions[&2].tx_packets, 4);
    let second = t.read(&[1]).expect("read");
    assert_eq!(second.functions[&1].rx_last_ns, 1999);
    assert!(t.read(&[1]).is_err(), "exhausted");
    for (bad, line, what) in [
        ("1 1 1\n", 1, "expected 4 or 8 fields"),
        ("1 1 1 1\nx 1 1 1\n", 2, "at_ns \"x\""),
        ("5 1 1 1\n4 1 1 1\n", 2, "back in time"),
    ] {
        match TraceSource::parse(bad) {
            Err(PowerError::Trace { line: l, reason }) => {
                assert_eq!(l, line);
                assert!(reason.contains(what), "{reason}")
            }
            other => panic!("{bad:?} parsed: {other:?}"),
        }
    }
}

#[test]
fn round_up_picks_the_next_higher_pstate() {
    assert_eq!(round_up_index(&FREQS, 1_428_571.0), 5); // → 1.5 GHz
    assert_eq!(round_up_index(&FREQS, 1_500_000.0), 5);
    assert_eq!(round_up_index(&FREQS, 100.0), 6);
    assert_eq!(round_up_index(&FREQS, 9e9), 0);
}

#[test]
fn spawned_loop_runs_and_survives_counter_errors() {
    let sysfs = FakeSysfs::new();
    let mut trace = Trace::default();
    trace
        .segment(5, MS, &[(1, 10, 0)])
        .segment(40, MS, &[(1, 0, 0)]);
    let (mut m, _) = manager(&sysfs, config(&sysfs, &[(1, 0)]), trace.build());
    m.apply_policy(&policy(&[0], XmanMode::Load, 0, 0), false)
        .expect("apply");
    let running = m.spawn().expect("spawn");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while running.manager().errors().0 < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        running.is_running(),
        "an exhausted source must not stop the loop"
    );
    let manager = running.manager();
    let (errors, last) = manager.errors();
    assert!(errors >= 3, "trace exhausted errors counted: {errors}");
    assert!(last.is_some_and(|e| e.contains("exhausted")));
    drop(manager);
    assert_eq!(
        sysfs.read("policy0/scaling_setspeed"),
        "1200000",
        "went idle on the way"
    );
    running.stop();
}

/// Reads a real pinned PERCPU_ARRAY (and if_fn HASH) created here; needs root for bpf().
#[test]
fn pinned_fn_stats_are_summed_over_cpus() {
    use libbpf_rs::{MapCore as _, MapFlags, MapHandle, MapType};
    if unsafe_geteuid() != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let bpffs = BpfFs::at(dir.path());
    let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _,
        ..Default::default()
    };
    let mut stats = MapHandle::create(MapType::PercpuArray, Some("fn_stats"), 4, 48, 64, &opts)
        .expect("create fn_stats");
    let ncpu = libbpf_rs::num_possible_cpus().expect("cpus");
    let values: Vec<Vec<u8>> = (0..ncpu)
        .map(|cpu| {
            let c = cpu as u64;
            [10 + c, 1000, 9 + c, 900, 100 + c, 50 + c]
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect()
        })
        .collect();
    stats
        .update_percpu(&3u32.to_ne_bytes(), &values, MapFlags::ANY)
        .expect("update");
    let stats_pin = bpffs.path.join("fn_stats");
    stats.pin(&stats_pin).expect("pin fn_stats");
    let mut if_fn = MapHandle::create(MapType::Hash, Some("if_fn"), 4, 4, 16, &opts).expect("hash");
    if_fn
        .update(&7u32.to_ne_bytes(), &3u32.to_ne_bytes(), MapFlags::ANY)
        .expect("update");
    let if_fn_pin = bpffs.path.join("if_fn");
    if_fn.pin(&if_fn_pin).expect("pin if_fn");

    let mut source =
        super::counters::PinnedFnStats::open(&stats_pin, Some(&if_fn_pin)).expect("open");
    let snapshot = source.read(&[0, 3]).expect("read");
    let n = ncpu as u64;
    let sum = |base: u64| base * n + n * (n - 1) / 2;
    assert_eq!(snapshot.functions[&0], FnCounters::default());
    let c = snapshot.functions[&3];
    assert_eq!(
        (c.rx_packets, c.rx_bytes, c.tx_packets),
        (sum(10), 1000 * n, sum(9))
    );
    assert_eq!(
        (c.rx_last_ns, c.tx_last_ns),
        (100 + n - 1, 50 + n - 1),
        "max over CPUs"
    );
    assert_eq!(
        source.interfaces().expect("if_fn"),
        BTreeMap::from([(7, 3)])
    );
    assert!(source.read(&[64]).is_err(), "index beyond max_entries");
    match super::counters::PinnedFnStats::open(&if_fn_pin, None) {
        Err(PowerError::Map { reason, .. }) => assert!(reason.contains("PercpuArray"), "{reason}"),
        other => panic!("a hash map is not fn_stats: {:?}", other.err()),
    }
    stats.unpin(&stats_pin).expect("unpin");
    if_fn.unpin(&if_fn_pin).expect("unpin");
}

fn unsafe_geteuid() -> u32 {
    // /proc/self/status "Uid: real effective …" avoids a libc dependency for one call.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).and_then(|u| u.parse().ok()))
        })
        .unwrap_or(u32::MAX)
}

/// A private bpffs for the test (never the production /sys/fs/bpf/cgloop), unmounted on drop.
struct BpfFs {
    path: PathBuf,
    mounted: bool,
}

impl BpfFs {
    fn at(dir: &Path) -> Self {
        let path = dir.join("bpffs");
        std::fs::create_dir_all(&path).expect("mkdir");
        let ok = std::process::Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&path)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mount -t bpf failed");
        Self {
            path,
            mounted: true,
        }
    }
}

impl Drop for BpfFs {
    fn drop(&mut self) {
        if self.mounted {
            let _ = std::process::Command::new("umount")
                .arg(&self.path)
                .status();
        }
    }
}

#[test]
fn pinned_max_with_the_performance_governor_sets_limits_and_no_setspeed() {
    let sysfs = FakeSysfs::new();
    let (mut m, journal) = manager(&sysfs, config(&sysfs, &[]), vec![]);
    let p = CorePolicy {
        governor: "performance".into(),
        ..policy(&[0], XmanMode::PinnedMax, 3_000_000, 3_000_000)
    };
    m.apply_policy(&p, false).expect("apply");
    assert_eq!(sysfs.read("policy0/scaling_governor"), "performance");
    assert_eq!(sysfs.read("policy0/scaling_min_freq"), "3000000");
    assert!(take(&journal).iter().all(|w| !w.file.ends_with("scaling_setspeed")));
    // Other X-MAN modes still need userspace.
    let load = CorePolicy { governor: "performance".into(), ..policy(&[0], XmanMode::Load, 0, 0) };
    assert!(m.apply_policy(&load, true).is_err());
}

/// The node micro-loop audit hears of every switch, with the policy's cores and mode.
#[test]
fn switches_are_reported_to_the_observer() {
    let sysfs = FakeSysfs::new();
    let mut trace = Trace::default();
    trace.segment(100, MS, &[(1, 1000, 0), (3, 0, 0)]);
    let (mut m, _) = manager(&sysfs, config(&sysfs, &[(1, 0), (3, 1)]), trace.build());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    m.observe_switches(Box::new(move |d, cores, mode| {
        sink.lock().unwrap().push((d.policy, d.to_khz, d.reason, cores.to_vec(), mode));
    }));
    m.apply_policy(&policy(&[0, 1], XmanMode::Load, 0, 0), false).expect("apply");
    run(&mut m, 100);
    let seen = seen.lock().unwrap();
    let decided: Vec<_> = m.decisions().map(|d| (d.policy, d.to_khz, d.reason)).collect();
    let heard: Vec<_> = seen.iter().map(|(p, k, r, _, _)| (*p, *k, *r)).collect();
    assert_eq!(heard, decided, "every switch is reported once");
    assert!(seen.iter().any(|(_, _, r, _, _)| *r != Reason::Policy), "{seen:?}");
    assert!(seen.iter().all(|(p, _, _, cores, mode)| cores == &vec![*p] && *mode == XmanMode::Load));
}
