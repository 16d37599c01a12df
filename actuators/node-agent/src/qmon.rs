//! The queue monitor: every `sample_interval_us` (1 ms) a sampler thread reads the per-class
//! state the BPF tracepoint programs keep (bpf/qmon.bpf.h: backlog, drain rate, sojourn
//! histogram and max, CE marks, queue-protection sanctions) from an mmapped array, and every
//! `class_stats_interval_us` the kernel's HTB class statistics over rtnetlink (drops,
//! overlimits, sent; also which leaves exist). The result is a [`QueueTick`] served through
//! [`QueueView`] to the micro loop, and per-export-interval [`QueueSample`]s for node samples.
//!
//! Queue delay estimate (`ClassQueue::queue_delay_ns`, the same arithmetic as the classifier's
//! `qmon_queue_delay_ns`): backlog bytes × measured drain time per byte (bytes dequeued over
//! ≥ 2 ms windows while the class stayed backlogged, EWMA ⅛); without a rate yet, the last
//! dequeued packet's sojourn.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use cgloop_proto::host::now_ns;
use cgloop_proto::v1::{MicroLoopStatus, QueueSample};

use crate::config::QueueSettings;
use crate::datapath::{QmonClass, QmonMaps};
use crate::queue_view::{QueueTick, QueueView};
use crate::tc::{KernelClass, Rtnl};

#[cfg(test)]
mod kernel_tests;
mod sampler;

use sampler::{Sampler, Stats};

/// Must match QMON_MAX_CLASSES / QMON_HIST_BUCKETS in bpf/qmon.bpf.h.
const MAX_CLASSES: usize = 256;
pub const HIST_BUCKETS: usize = 128;
const HIST_MIN_LOG2: u32 = 10;

/// Lower and upper bound (ns) of histogram bucket `i` (bpf/qmon.bpf.h's log-linear layout).
pub fn bucket_bounds(i: usize) -> (u64, u64) {
    if i == 0 {
        return (0, 1 << HIST_MIN_LOG2);
    }
    let shift = (i as u32 - 1) / 4 + HIST_MIN_LOG2 - 2;
    let lo = (4 + (i as u64 - 1) % 4) << shift;
    (lo, lo + (1u64 << shift))
}

/// The bucket of `v` ns, as the BPF program computes it (tests and doubles use it).
pub fn bucket_of(v: u64) -> usize {
    if v < 1 << HIST_MIN_LOG2 {
        return 0;
    }
    let msb = 63 - v.leading_zeros();
    let idx = (msb - HIST_MIN_LOG2) as usize * 4 + ((v >> (msb - 2)) & 3) as usize + 1;
    idx.min(HIST_BUCKETS - 1)
}

/// The `q` quantile (0..1) of a histogram, as its bucket's midpoint (0 when empty).
pub fn quantile(hist: &[u64], q: f64) -> u64 {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (i, &n) in hist.iter().enumerate() {
        seen += n;
        if seen >= rank {
            let (lo, hi) = bucket_bounds(i);
            return (lo + hi) / 2;
        }
    }
    0
}

/// The classifier's estimate, from one class's BPF state.
pub fn queue_delay_ns(c: &QmonClass) -> u64 {
    if c.backlog_bytes <= 0 {
        return 0;
    }
    if c.ns_per_kb > 0 {
        return ((c.backlog_bytes as u64).saturating_mul(c.ns_per_kb)) >> 10;
    }
    c.last_sojourn_ns
}

/// One class's accumulation over an export interval.
#[derive(Debug, Clone)]
struct Acc {
    interface: String,
    max_backlog_bytes: u64,
    hist: Vec<u64>,
    sojourn_max_ns: u64,
    ce: u64,
    sanctioned: u64,
    kernel: Option<KernelClass>,
    backlog_bytes: u64,
    backlog_packets: u64,
}

#[derive(Default)]
struct Shared {
    latest: Mutex<Option<Arc<QueueTick>>>,
    fault: Mutex<String>,
    export: Mutex<BTreeMap<(u32, u32), Acc>>,
    stop: AtomicBool,
    /// CPU time (ns) the sampler thread has used (bench/node-agent reads it via GetState logs).
    cpu_ns: AtomicU64,
    ticks: AtomicU64,
}

/// The running monitor; dropping it stops the sampler.
pub struct Monitor {
    shared: Arc<Shared>,
    stale_after_ns: u64,
    enabled: bool,
}

impl Monitor {
    /// A monitor that never samples (queues disabled, or no datapath): it says why.
    pub fn off(reason: &str) -> Self {
        let shared = Arc::new(Shared::default());
        *lock(&shared.fault) = reason.to_string();
        Self {
            shared,
            stale_after_ns: 0,
            enabled: false,
        }
    }

    /// Starts the sampler thread on the datapath's maps.
    /// `protection` is re-applied about once a second, so an interface created after the agent
    /// started (or recreated) gets its low-latency class configuration.
    pub fn start(
        settings: &QueueSettings,
        maps: QmonMaps,
        attach_error: Option<String>,
        protection: Option<Arc<crate::qprot::Protection>>,
    ) -> Result<Self> {
        if !settings.enabled {
            return Ok(Self::off(
                "queue monitor disabled ([queues] enabled = false)",
            ));
        }
        if let Some(e) = attach_error {
            return Ok(Self::off(&e));
        }
        let stats = Stats::map(&maps)?;
        let rtnl = Rtnl::open().context("opening rtnetlink for the queue monitor")?;
        let shared = Arc::new(Shared::default());
        *lock(&shared.fault) = "no queue tick yet".into();
        let mut sampler = Sampler::new(maps, stats, rtnl, shared.clone(), protection);
        let interval = Duration::from_micros(settings.sample_interval_us);
        let rt_priority = settings.rt_priority;
        let stats_every = (settings.class_stats_interval_us / settings.sample_interval_us).max(1);
        std::thread::Builder::new()
            .name("queue-monitor".into())
            .spawn(move || {
                realtime(rt_priority);
                sampler.run(interval, stats_every)
            })
            .context("starting the queue monitor thread")?;
        Ok(Self {
            shared,
            stale_after_ns: settings.stale_after_us * 1000,
            enabled: true,
        })
    }

    /// The node sample's view: per-class samples since the previous call, and the status.
    pub fn take_samples(&self) -> Vec<QueueSample> {
        let mut export = lock(&self.shared.export);
        let mut out = Vec::new();
        for ((_, class_id), acc) in export.iter_mut() {
            let k = acc.kernel.clone();
            out.push(QueueSample {
                interface_name: acc.interface.clone(),
                class_id: *class_id,
                class_name: String::new(),
                backlog_bytes: acc.backlog_bytes,
                backlog_packets: acc.backlog_packets,
                max_backlog_bytes: acc.max_backlog_bytes,
                drops: k.as_ref().map_or(0, |k| k.drops as u64),
                overlimits: k.as_ref().map_or(0, |k| k.overlimits as u64),
                sent_packets: k.as_ref().map_or(0, |k| k.packets),
                sent_bytes: k.as_ref().map_or(0, |k| k.bytes),
                sojourn_packets: acc.hist.iter().sum(),
                sojourn_p50_ns: quantile(&acc.hist, 0.50),
                sojourn_p99_ns: quantile(&acc.hist, 0.99),
                sojourn_max_ns: acc.sojourn_max_ns,
                qprot_sanctioned_packets: acc.sanctioned,
                ce_marked_packets: acc.ce,
            });
            acc.max_backlog_bytes = acc.backlog_bytes;
            acc.hist.iter_mut().for_each(|h| *h = 0);
            acc.sojourn_max_ns = 0;
            acc.ce = 0;
            acc.sanctioned = 0;
        }
        out
    }

    /// Whether the micro loop may act on the monitor's ticks, and why not.
    pub fn status(&self) -> MicroLoopStatus {
        let age = lock(&self.shared.latest)
            .as_ref()
            .map(|t| now_ns().saturating_sub(t.taken_ns));
        let reason = self.fault();
        MicroLoopStatus {
            acting: self.enabled && reason.is_empty(),
            reason,
            queue_sample_age_ns: age.unwrap_or(0),
            protected_flows: 0,
        }
    }

    /// Sampler CPU time (ns) and ticks so far (the benchmark's figures).
    pub fn cost(&self) -> (u64, u64) {
        (
            self.shared.cpu_ns.load(Ordering::Relaxed),
            self.shared.ticks.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

impl QueueView for Monitor {
    fn latest(&self) -> Option<Arc<QueueTick>> {
        let t = lock(&self.shared.latest).clone()?;
        (now_ns().saturating_sub(t.taken_ns) <= self.stale_after_ns
            && lock(&self.shared.fault).is_empty())
        .then_some(t)
    }

    fn fault(&self) -> String {
        let fault = lock(&self.shared.fault).clone();
        if !fault.is_empty() {
            return fault;
        }
        match lock(&self.shared.latest).as_ref() {
            Some(t) => {
                let age = now_ns().saturating_sub(t.taken_ns);
                if age > self.stale_after_ns {
                    format!(
                        "queue samples {} ms old (limit {} ms)",
                        age / 1_000_000,
                        self.stale_after_ns as f64 / 1e6
                    )
                } else {
                    String::new()
                }
            }
            None => "no queue tick yet".into(),
        }
    }
}

/// SCHED_FIFO at `priority` for the calling thread (0: stay a normal thread).
fn realtime(priority: u32) {
    if priority == 0 {
        return;
    }
    let param = libc::sched_param {
        sched_priority: priority as i32,
    };
    // SAFETY: plain syscall on the calling thread with a valid param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        tracing::warn!(
            "queue monitor stays SCHED_OTHER: SCHED_FIFO {priority}: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_match_the_bpf_layout_and_bound_their_values() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1023), 0);
        assert_eq!(bucket_of(1024), 1);
        for v in [
            1024u64,
            1500,
            100_000,
            999_999,
            1_000_000,
            20_000_000,
            100_000_000,
        ] {
            let (lo, hi) = bucket_bounds(bucket_of(v));
            assert!(lo <= v && v < hi, "{v} not in [{lo}, {hi})");
            assert!(
                (hi - lo) as f64 <= 0.25 * lo as f64 + 1.0,
                "bucket of {v} too wide"
            );
        }
    }

    #[test]
    fn quantiles_come_from_the_histogram_within_a_bucket() {
        let mut h = vec![0u64; HIST_BUCKETS];
        for _ in 0..98 {
            h[bucket_of(200_000)] += 1;
        }
        h[bucket_of(5_000_000)] += 2;
        let p50 = quantile(&h, 0.5) as f64;
        let p99 = quantile(&h, 0.99) as f64;
        assert!((p50 / 200_000.0 - 1.0).abs() < 0.13, "{p50}");
        assert!((p99 / 5_000_000.0 - 1.0).abs() < 0.13, "{p99}");
        assert_eq!(quantile(&vec![0; HIST_BUCKETS], 0.5), 0);
    }

    #[test]
    fn delay_estimate_is_backlog_over_drain_rate_else_last_sojourn() {
        let mut c = QmonClass {
            backlog_bytes: 15_000,
            ns_per_kb: 1024 * 800,
            ..Default::default()
        };
        assert_eq!(queue_delay_ns(&c), 12_000_000); // 15 kB at 10 Mbit/s (800 ns/B)
        c.ns_per_kb = 0;
        c.last_sojourn_ns = 7;
        assert_eq!(queue_delay_ns(&c), 7);
        c.backlog_bytes = -3;
        assert_eq!(queue_delay_ns(&c), 0);
    }

    #[test]
    fn an_off_monitor_serves_nothing_and_says_why() {
        let m = Monitor::off("queue monitor disabled");
        assert!(m.latest().is_none());
        assert_eq!(m.fault(), "queue monitor disabled");
        assert!(!m.status().acting);
    }
}
