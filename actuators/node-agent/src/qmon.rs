//! The queue monitor: every `sample_interval_us` (1 ms) a sampler thread reads the per-class
//! state the BPF tracepoint programs keep (bpf/qmon.bpf.h: backlog, drain rate, sojourn
//! histogram and max, CE marks, queue-protection sanctions) from an mmapped array, and every
//! `class_stats_interval_us` the kernel's HTB class statistics over rtnetlink (drops,
//! overlimits, sent; also which leaves exist). The result is a [`QueueTick`] served through
//! [`QueueView`] to the micro loop, and per-export-interval [`QueueSample`]s for node samples.
//!
//! Queue delay estimate (`ClassQueue::queue_delay_ns`, the same arithmetic as the classifier's
//! `qmon_queue_delay_ns`): backlog bytes × measured drain time per byte (bytes dequeued over
//! ≥ 0.5 ms windows while the class stayed backlogged, EWMA ¼); without a rate yet, the last
//! dequeued packet's sojourn.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cgloop_proto::host::now_ns;
use cgloop_proto::v1::{MicroLoopStatus, QueueSample};
use libbpf_rs::{MapCore, MapFlags};

use crate::config::QueueSettings;
use crate::datapath::{bytes_of, from_bytes, QmonClass, QmonKey, QmonMaps};
use crate::queue_view::{ClassQueue, QueueTick, QueueView};
use crate::tc::{KernelClass, Rtnl};

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

/// The mmapped `qmon_stats` array (BPF_F_MMAPABLE): read without syscalls.
struct Stats {
    ptr: *mut QmonClass,
    len: usize,
}

// SAFETY: the mapping is process-wide shared memory; every access below is a volatile or
// atomic read/write of plain integers.
unsafe impl Send for Stats {}

impl Stats {
    fn map(maps: &QmonMaps) -> Result<Self> {
        use std::os::fd::{AsFd, AsRawFd};
        let page = 4096;
        let len = (MAX_CLASSES * std::mem::size_of::<QmonClass>()).div_ceil(page) * page;
        // SAFETY: mapping a BPF_F_MMAPABLE array fd shared, at offset 0, its own size.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                maps.qmon_stats.as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            anyhow::bail!(
                "mmap of the qmon_stats map: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    fn slot(&self, slot: u32) -> *mut QmonClass {
        assert!(
            (slot as usize) < MAX_CLASSES,
            "qmon slot {slot} out of range"
        );
        // SAFETY: in bounds of the mapping (asserted).
        unsafe { self.ptr.add(slot as usize) }
    }

    fn read(&self, slot: u32) -> QmonClass {
        // SAFETY: a valid, aligned QmonClass in the mapping; fields are integers.
        unsafe { std::ptr::read_volatile(self.slot(slot)) }
    }

    fn zero(&self, slot: u32) {
        // SAFETY: as above; the slot is not in qmon_index yet, so BPF does not write it.
        unsafe { std::ptr::write_volatile(self.slot(slot), QmonClass::default()) }
    }

    /// The max since the previous call (the BPF program raises it, this resets it).
    fn take_max(&self, slot: u32) -> u64 {
        // SAFETY: an aligned u64 inside the mapping, also written by BPF atomically or plainly.
        let a = unsafe {
            AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.slot(slot)).sojourn_max_ns))
        };
        a.swap(0, Ordering::Relaxed)
    }

    /// Zeroes a drifted backlog (only if it still reads `seen`).
    fn reset_backlog(&self, slot: u32, seen: &QmonClass) {
        // SAFETY: aligned i64 fields inside the mapping, updated by BPF with atomic adds.
        unsafe {
            let p = self.slot(slot);
            let _ = AtomicI64::from_ptr(std::ptr::addr_of_mut!((*p).backlog_packets))
                .compare_exchange(
                    seen.backlog_packets,
                    0,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            let _ = AtomicI64::from_ptr(std::ptr::addr_of_mut!((*p).backlog_bytes))
                .compare_exchange(seen.backlog_bytes, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}

impl Drop for Stats {
    fn drop(&mut self) {
        // SAFETY: unmapping what `map` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
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
        let mut sampler = Sampler {
            maps,
            stats,
            rtnl,
            slots: BTreeMap::new(),
            prev: BTreeMap::new(),
            kernel: BTreeMap::new(),
            shared: shared.clone(),
            names: BTreeMap::new(),
            protection,
        };
        let interval = Duration::from_micros(settings.sample_interval_us);
        let stats_every = (settings.class_stats_interval_us / settings.sample_interval_us).max(1);
        std::thread::Builder::new()
            .name("queue-monitor".into())
            .spawn(move || sampler.run(interval, stats_every))
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counters of a class at the previous tick (for deltas).
#[derive(Clone)]
struct Prev {
    hist: [u64; HIST_BUCKETS],
    ce: u64,
    sanctioned: u64,
    enq_packets: u64,
}

struct Sampler {
    maps: QmonMaps,
    stats: Stats,
    rtnl: Rtnl,
    /// (ifindex, class) -> slot in qmon_stats.
    slots: BTreeMap<(u32, u32), u32>,
    prev: BTreeMap<(u32, u32), Prev>,
    kernel: BTreeMap<(u32, u32), KernelClass>,
    shared: Arc<Shared>,
    names: BTreeMap<u32, String>,
    protection: Option<Arc<crate::qprot::Protection>>,
}

/// CPU time of the calling thread (ns).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Sampler {
    fn run(&mut self, interval: Duration, stats_every: u64) {
        let mut next = Instant::now();
        let mut n = 0u64;
        let mut reapplied = Instant::now();
        while !self.shared.stop.load(Ordering::Relaxed) {
            if let Some(p) = self
                .protection
                .as_ref()
                .filter(|_| reapplied.elapsed() >= Duration::from_secs(1))
            {
                reapplied = Instant::now();
                if let Err(e) = p.apply() {
                    tracing::warn!("queue protection: {e:#}");
                }
            }
            let result = if n % stats_every == 0 {
                self.refresh_classes()
            } else {
                Ok(())
            };
            match result.and_then(|_| self.tick()) {
                Ok(tick) => {
                    *lock(&self.shared.latest) = Some(Arc::new(tick));
                    lock(&self.shared.fault).clear();
                }
                Err(e) => *lock(&self.shared.fault) = format!("cannot read the queues: {e:#}"),
            }
            n += 1;
            self.shared.ticks.store(n, Ordering::Relaxed);
            self.shared.cpu_ns.store(thread_cpu_ns(), Ordering::Relaxed);
            next += interval;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now; // overran: no burst of catch-up ticks
            }
        }
    }

    /// The leaves of every interface the agent manages (if_default), their kernel statistics,
    /// and the BPF registration (qmon_index) kept in step with them.
    fn refresh_classes(&mut self) -> Result<()> {
        let mut seen = BTreeMap::new();
        for key in self.maps.if_default.keys() {
            let ifindex: u32 = from_bytes(&key);
            let classes = match self.rtnl.classes(ifindex) {
                Ok(c) => c,
                Err(e) if ifindex_gone(ifindex) => {
                    tracing::debug!("queue monitor: ifindex {ifindex} is gone: {e}");
                    continue;
                }
                // A known interface whose dump failed once keeps its classes (and their
                // deltas) until the next read; an unknown one is a fault.
                Err(e) if self.names.contains_key(&ifindex) => {
                    tracing::debug!("queue monitor: ifindex {ifindex}: {e}");
                    for (k, c) in self.kernel.iter().filter(|(k, _)| k.0 == ifindex) {
                        seen.insert(*k, c.clone());
                    }
                    continue;
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("class statistics of ifindex {ifindex}"))
                }
            };
            let parents: Vec<u32> = classes.iter().map(|c| c.parent).collect();
            for c in classes.into_iter().filter(|c| !parents.contains(&c.handle)) {
                seen.insert((ifindex, c.handle), c);
            }
        }
        // Unregister classes that went away, register new ones on a zeroed slot.
        let gone: Vec<(u32, u32)> = self
            .slots
            .keys()
            .filter(|k| !seen.contains_key(k))
            .copied()
            .collect();
        for k in gone {
            let key = QmonKey {
                ifindex: k.0,
                classid: k.1,
            };
            let _ = self.maps.qmon_index.delete(bytes_of(&key));
            self.slots.remove(&k);
            self.prev.remove(&k);
            lock(&self.shared.export).remove(&k);
        }
        for (&k, kc) in &seen {
            if !self.slots.contains_key(&k) {
                let Some(slot) =
                    (0..MAX_CLASSES as u32).find(|s| !self.slots.values().any(|v| v == s))
                else {
                    anyhow::bail!("more than {MAX_CLASSES} managed classes");
                };
                self.stats.zero(slot);
                let key = QmonKey {
                    ifindex: k.0,
                    classid: k.1,
                };
                self.maps
                    .qmon_index
                    .update(bytes_of(&key), &slot.to_ne_bytes(), MapFlags::ANY)
                    .context("qmon_index update")?;
                self.slots.insert(k, slot);
                self.names.insert(k.0, crate::netif::ifname(k.0));
            }
            // The BPF backlog drifts when the kernel drops a queued packet: reset it when the
            // kernel says the class is empty and nothing entered it since the previous tick.
            let slot = self.slots[&k];
            let c = self.stats.read(slot);
            let quiet = self
                .prev
                .get(&k)
                .is_some_and(|p| p.enq_packets == c.enq_packets);
            if kc.backlog_packets == 0 && c.backlog_packets != 0 && quiet {
                self.stats.reset_backlog(slot, &c);
            }
        }
        self.kernel = seen;
        Ok(())
    }

    fn tick(&mut self) -> Result<QueueTick> {
        let taken_ns = now_ns();
        let mut classes = Vec::with_capacity(self.slots.len());
        let mut export = lock(&self.shared.export);
        for (&(ifindex, class_id), &slot) in &self.slots {
            let c = self.stats.read(slot);
            let max = self.stats.take_max(slot);
            let interface = self.names.get(&ifindex).cloned().unwrap_or_default();
            let backlog_bytes = c.backlog_bytes.max(0) as u64;
            let backlog_packets = c.backlog_packets.max(0) as u64;
            classes.push(ClassQueue {
                interface: interface.clone(),
                ifindex,
                class_id,
                backlog_bytes,
                backlog_packets,
                queue_delay_ns: queue_delay_ns(&c),
                sojourn_max_ns: max,
            });
            let prev = self
                .prev
                .entry((ifindex, class_id))
                .or_insert_with(|| Prev {
                    hist: c.hist,
                    ce: c.ce_marked,
                    sanctioned: c.qprot_sanctioned,
                    enq_packets: c.enq_packets,
                });
            let acc = export.entry((ifindex, class_id)).or_insert_with(|| Acc {
                interface,
                max_backlog_bytes: 0,
                hist: vec![0; HIST_BUCKETS],
                sojourn_max_ns: 0,
                ce: 0,
                sanctioned: 0,
                kernel: None,
                backlog_bytes: 0,
                backlog_packets: 0,
            });
            for (i, h) in acc.hist.iter_mut().enumerate() {
                *h += c.hist[i].saturating_sub(prev.hist[i]);
            }
            acc.ce += c.ce_marked.saturating_sub(prev.ce);
            acc.sanctioned += c.qprot_sanctioned.saturating_sub(prev.sanctioned);
            acc.sojourn_max_ns = acc.sojourn_max_ns.max(max);
            acc.max_backlog_bytes = acc.max_backlog_bytes.max(backlog_bytes);
            acc.backlog_bytes = backlog_bytes;
            acc.backlog_packets = backlog_packets;
            acc.kernel = self.kernel.get(&(ifindex, class_id)).cloned();
            *prev = Prev {
                hist: c.hist,
                ce: c.ce_marked,
                sanctioned: c.qprot_sanctioned,
                enq_packets: c.enq_packets,
            };
        }
        Ok(QueueTick { taken_ns, classes })
    }
}

fn ifindex_gone(ifindex: u32) -> bool {
    // SAFETY: if_indextoname with a buffer of IF_NAMESIZE bytes; NULL means no such interface.
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) }.is_null()
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

/// The monitor against the real kernel: a private network namespace (this test's thread and the
/// sampler it starts), HTB on its loopback with one slow class, a burst of UDP through it.
/// Needs root; prints "skipped: needs root" otherwise.
#[cfg(test)]
mod kernel_tests {
    use std::sync::Arc;
    use std::time::Duration;

    use libbpf_rs::{MapCore, MapFlags};

    use super::Monitor;
    use crate::config::QueueSettings;
    use crate::datapath::Datapath;
    use crate::queue_view::QueueView;
    use crate::tc::{ClassSpec, KernelHtbRoot, Rtnl};

    const LO: u32 = 1;
    const ROOT: u32 = 0x10001;

    /// The newest tick, waiting for one (a loaded machine can hold the sampler past the
    /// staleness limit; that is the limit working, not what this test is about).
    fn fresh(m: &Monitor) -> Arc<crate::queue_view::QueueTick> {
        for _ in 0..2000 {
            if let Some(t) = m.latest() {
                return t;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("no fresh tick within ~2 s: {}", m.fault())
    }
    const SLOW: u32 = 0x10010;

    #[test]
    fn ticks_and_samples_see_a_queue_build_and_drain() {
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        // A thread of its own: unshare(CLONE_NEWNET) moves only the calling thread, and the
        // sampler thread it spawns inherits the namespace.
        std::thread::spawn(|| {
            // SAFETY: plain syscall; affects this thread only.
            assert_eq!(
                unsafe { libc::unshare(libc::CLONE_NEWNET) },
                0,
                "unshare(CLONE_NEWNET)"
            );
            run_in_namespace();
        })
        .join()
        .expect("the namespace thread");
    }

    fn run_in_namespace() {
        let mut rtnl = Rtnl::open().unwrap();
        rtnl.set_up(LO).unwrap();
        rtnl.replace_htb_root(
            LO,
            KernelHtbRoot {
                handle: 0x10000,
                default_minor: 0x10,
            },
        )
        .unwrap();
        let class = |handle, parent, rate: u64| ClassSpec {
            handle,
            parent,
            rate_bytes: rate,
            ceil_bytes: rate,
            burst_bytes: 1600,
            cburst_bytes: 1600,
            prio: 0,
        };
        rtnl.set_class(LO, &class(ROOT, 0x10000, 62_500), true)
            .unwrap();
        rtnl.set_class(LO, &class(SLOW, ROOT, 62_500), true)
            .unwrap(); // 0.5 Mbit/s
        let dp = Datapath::load().unwrap();
        let maps = dp.qmon_maps().unwrap();
        maps.if_default
            .update(&LO.to_ne_bytes(), &SLOW.to_ne_bytes(), MapFlags::ANY)
            .unwrap();
        let settings = QueueSettings {
            class_stats_interval_us: 1000,
            ..Default::default()
        };
        let m =
            Arc::new(Monitor::start(&settings, maps, dp.qmon_attach_error.clone(), None).unwrap());
        std::thread::sleep(Duration::from_millis(50));
        let t = fresh(&m);
        assert!(t.class(LO, SLOW).is_some(), "the leaf is monitored: {t:?}");
        assert!(t.class(LO, ROOT).is_none(), "inner classes are not");

        // 60 × 1000 bytes at 0.5 Mbit/s: ~1 s of queue (few enough for the socket's send buffer).
        // A bound receiver, so no ICMP port-unreachable joins the queue.
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..60 {
            s.send_to(&[0u8; 1000], rx.local_addr().unwrap()).unwrap();
        }
        std::thread::sleep(Duration::from_millis(150));
        let t = fresh(&m);
        let c = t.class(LO, SLOW).unwrap();
        assert!(c.backlog_packets > 10 && c.backlog_bytes > 10_000, "{c:?}");
        // The backlog ahead drains at the class's 0.5 Mbit/s.
        let expect = c.backlog_bytes as f64 * 8.0 / 0.5e6 * 1e9;
        let rel = (c.queue_delay_ns as f64 - expect).abs() / expect;
        assert!(
            rel < 0.3,
            "estimate {} ns vs backlog/rate {expect} ns",
            c.queue_delay_ns
        );

        std::thread::sleep(Duration::from_millis(1500));
        let t = fresh(&m);
        assert_eq!(t.class(LO, SLOW).unwrap().backlog_packets, 0, "drained");
        let samples = m.take_samples();
        let q = samples.iter().find(|q| q.class_id == SLOW).unwrap();
        // A loaded machine may still be sending the last packets (the socket buffer blocks).
        assert!(
            q.interface_name == "lo" && (50..=60).contains(&q.sojourn_packets),
            "{q:?}"
        );
        // The HTB rate sets the sojourns: the last of 60 packets waited ~1 s, the median ~0.5 s.
        assert!(
            q.sojourn_max_ns > 700_000_000 && q.sojourn_max_ns < 1_600_000_000,
            "{q:?}"
        );
        assert!(
            q.sojourn_p50_ns > 250_000_000 && q.sojourn_p50_ns < 800_000_000,
            "{q:?}"
        );
        assert!(
            q.sojourn_p99_ns >= q.sojourn_p50_ns && q.max_backlog_bytes > 10_000,
            "{q:?}"
        );
        assert!(q.sent_packets >= 60, "kernel counters read: {q:?}");
        let again = m.take_samples();
        assert_eq!(
            again
                .iter()
                .find(|q| q.class_id == SLOW)
                .unwrap()
                .sojourn_packets,
            0,
            "reset per interval"
        );
    }
}
