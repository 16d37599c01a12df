//! The sampler thread of the queue monitor and its view of the BPF per-class state.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cgloop_proto::host::now_ns;
use libbpf_rs::{MapCore, MapFlags};

use super::{lock, queue_delay_ns, Acc, Shared, HIST_BUCKETS, MAX_CLASSES};
use crate::datapath::{bytes_of, from_bytes, QmonClass, QmonKey, QmonMaps};
use crate::queue_view::{ClassQueue, QueueTick};
use crate::tc::{KernelClass, Rtnl};

/// The mmapped `qmon_stats` array (BPF_F_MMAPABLE): read without syscalls.
pub(super) struct Stats {
    ptr: *mut QmonClass,
    len: usize,
}

// SAFETY: the mapping is process-wide shared memory; every access below is a volatile or
// atomic read/write of plain integers.
unsafe impl Send for Stats {}

impl Stats {
    pub(super) fn map(maps: &QmonMaps) -> Result<Self> {
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

/// Counters of a class at the previous tick (for deltas).
#[derive(Clone)]
struct Prev {
    hist: [u64; HIST_BUCKETS],
    ce: u64,
    sanctioned: u64,
    enq_packets: u64,
}

pub(super) struct Sampler {
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
    pub(super) fn new(
        maps: QmonMaps,
        stats: Stats,
        rtnl: Rtnl,
        shared: Arc<Shared>,
        protection: Option<Arc<crate::qprot::Protection>>,
    ) -> Self {
        Self {
            maps,
            stats,
            rtnl,
            slots: BTreeMap::new(),
            prev: BTreeMap::new(),
            kernel: BTreeMap::new(),
            shared,
            names: BTreeMap::new(),
            protection,
        }
    }

    pub(super) fn run(&mut self, interval: Duration, stats_every: u64) {
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
