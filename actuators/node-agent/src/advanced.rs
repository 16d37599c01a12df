//! The user-space runtime of advanced (payload) chain functions (CALVIN §III).
//!
//! ```text
//! egress skb ─ cgl_classify ─ basic prefix (tail calls) ─ cgl_fn_to_user: src MAC := tag(slot, ifindex)
//!     │ bpf_redirect ─▶ <port> (veth) ─▶ <port>p: XDP cgl_xsk_rx ─▶ XSKMAP ─▶ AF_XDP socket (copy mode)
//!     │                                                                      │ worker thread:
//!     │                                                                      │ slot → payload functions
//!     │ tc ingress cgl_adv_return: MAC restored, mark ◀─ <port> ◀─ TX ◀──────┘ (drop or send on)
//!     ▼ bpf_redirect to the interface's egress ─ cgl_classify (mark: class only, no chain) ─ HTB
//! ```
//!
//! The agent creates the veth pair on the first chain with an advanced function. Chain swaps
//! stay atomic: the user-space functions of the new slot are in the table before the BPF
//! class→slot store, and a frame carries the slot it was classified with (the idle slot of a
//! pair is only rewritten by the next SetChain of the class).
//!
//! Natif's scale-out: a chain's advanced suffix may run on several instances, each a veth pair
//! of its own (`<port>`, `<port>-1`, … ; one queue each, see [`Advanced::scale`]) with its own
//! AF_XDP socket and worker thread pinned to its core. `cgl_fn_to_user` picks the instance from
//! a hash of the flow's 5-tuple, so a flow is never split. Every worker reads the same slot
//! table, so a swap that adds instances stays atomic: the new instances run before the class
//! points at the slot that uses them.
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::afxdp::{RxView, Xsk};
use crate::datapath::{Datapath, MAX_ADV_INSTANCES};
use crate::netif::ifindex;
use crate::payload::{Counters, PayloadFn, Verdict};
use crate::tc::Rtnl;

#[cfg(test)]
mod kernel_tests;

/// One advanced function of a slot, with its counters per instance.
pub struct AdvFn {
    pub f: Box<dyn PayloadFn>,
    /// Indexed by instance (MAX_ADV_INSTANCES entries).
    pub counters: Vec<Counters>,
}

impl AdvFn {
    pub fn new(f: Box<dyn PayloadFn>) -> Self {
        Self { f, counters: (0..MAX_ADV_INSTANCES).map(|_| Counters::default()).collect() }
    }

    /// Packets and drops over every instance.
    pub fn totals(&self) -> (u64, u64) {
        self.counters.iter().fold((0, 0), |(p, d), c| {
            (p + c.packets.load(Ordering::Relaxed), d + c.dropped.load(Ordering::Relaxed))
        })
    }
}

/// The advanced suffix of one chain slot.
pub struct AdvChain {
    pub fns: Vec<AdvFn>,
}

/// Worker totals (GetState / debugging / node samples).
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub rx: AtomicU64,
    pub tx: AtomicU64,
    pub dropped: AtomicU64,
    /// Frames without a known slot tag (dropped).
    pub untagged: AtomicU64,
    /// Time spent processing frames (from the first frame of a batch to its send), ns.
    pub busy_ns: AtomicU64,
    /// The worker's last progress (CLOCK_MONOTONIC ns): the end of its last batch taken from
    /// the ring, or its last look at an empty ring. A worker that cannot run leaves it behind.
    pub progress_ns: AtomicU64,
}

/// Longest a worker sleeps in poll(2) between two looks at an empty ring, ms. It bounds the
/// `stalled_ns` a worker that keeps up can read (frames that arrive while it sleeps wake it at
/// once; its last progress is then at most this old), well below the analytics' 50 ms stall
/// threshold, for about 100 wake-ups a second of an idle worker.
pub const PARK_MS: i32 = 10;

/// How long a worker has made no progress while frames wait: `now - progress` when `waiting`
/// > 0, else 0 (a worker with an empty ring is not stalled, however long it sleeps).
pub fn stalled_ns(waiting: u32, progress_ns: u64, now_ns: u64) -> u64 {
    if waiting == 0 { 0 } else { now_ns.saturating_sub(progress_ns) }
}

type Table = Arc<RwLock<HashMap<u32, Arc<AdvChain>>>>;

/// One instance: its veth pair, socket and pinned worker.
struct Instance {
    port: u32,
    peer: u32,
    stats: Arc<WorkerStats>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
    /// The worker's thread id (sched_setaffinity).
    tid: libc::pid_t,
    /// The core it is pinned to; 0 = not pinned.
    core: u32,
    /// A dup of the socket, for its statistics.
    xsk_fd: OwnedFd,
    /// Its RX ring, read-only: frames waiting for the worker.
    rx: RxView,
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        if let Ok(mut rtnl) = Rtnl::open() {
            let _ = rtnl.delete_link(self.port);
        }
    }
}

/// What one instance's worker has done so far (cumulative), for the node samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerReading {
    pub instance: u32,
    /// Core the worker is pinned to (0: not pinned).
    pub core: u32,
    pub busy_ns: u64,
    /// When it was read (CLOCK_MONOTONIC, ns).
    pub at_ns: u64,
    pub rx_dropped: u64,
    /// Frames in the RX ring the worker has not taken yet.
    pub rx_waiting: u32,
    /// How long the worker has made no progress while frames wait ([`stalled_ns`]).
    pub stalled_ns: u64,
    /// Per advanced function name of the slots asked for: (packets, dropped) on this instance.
    pub functions: Vec<(String, u64, u64)>,
}

/// What [`Advanced::scale`] changed, so a failed chain change can be undone.
#[derive(Debug, Default)]
pub struct Undo {
    /// Instances that existed before (those beyond were created by the change).
    kept: usize,
    /// Cores of existing instances before the change.
    cores: Vec<(usize, u32)>,
}

pub struct Advanced {
    port_name: String,
    busy_poll_us: u64,
    rt_priority: u32,
    table: Table,
    instances: Vec<Instance>,
}

/// Slot and interface index a tagged frame carries in its source MAC (bpf/agent.h).
pub fn tag_of(frame: &[u8]) -> Option<(u32, u32)> {
    let m = frame.get(6..12)?;
    if m[0] != 0xc6 || m[1] != 0x1a {
        return None;
    }
    Some((u16::from_be_bytes([m[2], m[3]]) as u32, u16::from_be_bytes([m[4], m[5]]) as u32))
}

/// Runs a slot's functions on a frame on `instance`; None = dropped.
pub fn run_chain(chain: &AdvChain, frame: &mut [u8], instance: usize) -> Option<u32> {
    for AdvFn { f, counters } in &chain.fns {
        let c = &counters[instance.min(counters.len() - 1)];
        c.packets.fetch_add(1, Ordering::Relaxed);
        match f.run(frame) {
            Verdict::Pass => {}
            Verdict::Matched => {
                c.matched.fetch_add(1, Ordering::Relaxed);
            }
            Verdict::Drop => {
                c.matched.fetch_add(1, Ordering::Relaxed);
                c.dropped.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
    }
    crate::payload::finish_l4_checksum(frame);
    Some(frame.len() as u32)
}

/// The veth port of instance `i`: the configured name for the first, `<name>-<i>` after.
pub fn port_name(base: &str, i: usize) -> String {
    if i == 0 { base.to_string() } else { format!("{base}-{i}") }
}

/// Pins thread `tid` to `core`, or lets it run on every online CPU (core 0: not pinned).
fn pin(tid: libc::pid_t, core: u32) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays within its bits (checked).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let cores = if core == 0 { crate::bounds::online_cpus() } else { vec![core] };
    for c in cores {
        anyhow::ensure!((c as usize) < libc::CPU_SETSIZE as usize, "core {c} beyond CPU_SETSIZE");
        // SAFETY: c < CPU_SETSIZE.
        unsafe { libc::CPU_SET(c as usize, &mut set) };
    }
    // SAFETY: a valid set of the size given, for a thread of this process.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        anyhow::bail!("sched_setaffinity(core {core}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn now_monotonic_ns() -> u64 {
    // SAFETY: a zeroed timespec is valid, and the kernel writes it.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
        ts
    };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Advanced {
    /// Creates the runtime and its first instance: the veth port, the BPF programs on it, the
    /// AF_XDP socket and the worker. `busy_poll_us`: how long a worker spins for the next
    /// frame before it sleeps in poll(2) (0 = always sleep). `rt_priority` > 0 runs the
    /// workers SCHED_FIFO at that priority, so a busy node's other processes cannot hold a
    /// frame in the ring for a whole time slice (a failure to get it is logged and the worker
    /// runs as a normal thread).
    pub fn start(dp: &Datapath, port_name: &str, busy_poll_us: u64, rt_priority: u32) -> Result<Self> {
        let mut adv = Self {
            port_name: port_name.to_string(),
            busy_poll_us,
            rt_priority,
            table: Arc::default(),
            instances: Vec::new(),
        };
        adv.add_instance(dp)?;
        Ok(adv)
    }

    /// Ifindex of instance 0's port (the chain's `ToUser` step names it).
    pub fn port(&self) -> u32 {
        self.instances.first().map_or(0, |i| i.port)
    }

    /// Instances running (never fewer than a chain in place uses).
    pub fn instances(&self) -> usize {
        self.instances.len()
    }

    /// Runs at least `cores.len()` instances and pins instance i to `cores[i]` (0: not
    /// pinned). On failure, whatever it changed is undone before the error returns; on
    /// success, [`Advanced::undo`] reverts it if a later step of the chain change fails.
    ///
    /// Why one veth pair per instance, not one multi-queue pair: in copy mode a socket only
    /// receives frames of the queue it is bound to (xsk_rcv_check), and the queue a frame
    /// lands in on a veth is chosen by the kernel's tx hash, not by the chain; a pair per
    /// instance lets `cgl_fn_to_user` pick the instance itself, from the flow's 5-tuple.
    pub fn scale(&mut self, dp: &Datapath, cores: &[u32]) -> Result<Undo> {
        let mut undo = Undo { kept: self.instances.len(), cores: Vec::new() };
        let result = (|| {
            while self.instances.len() < cores.len() {
                self.add_instance(dp)?;
            }
            for (i, &core) in cores.iter().enumerate() {
                let inst = &mut self.instances[i];
                if inst.core != core {
                    pin(inst.tid, core).with_context(|| format!("pinning AF_XDP instance {i}"))?;
                    if i < undo.kept {
                        undo.cores.push((i, inst.core));
                    }
                    inst.core = core;
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(undo),
            Err(e) => {
                self.undo(dp, undo);
                Err(e)
            }
        }
    }

    /// Reverts a [`Advanced::scale`]: stops the instances it created, re-pins the others.
    pub fn undo(&mut self, dp: &Datapath, undo: Undo) {
        while self.instances.len() > undo.kept.max(1) {
            if let Some(inst) = self.instances.pop() {
                dp.clear_adv_instance(self.instances.len() as u32, inst.peer);
            }
        }
        for (i, core) in undo.cores {
            if let Some(inst) = self.instances.get_mut(i) {
                if let Err(e) = pin(inst.tid, core) {
                    tracing::warn!("re-pinning AF_XDP instance {i} to core {core}: {e:#}");
                }
                inst.core = core;
            }
        }
    }

    fn add_instance(&mut self, dp: &Datapath) -> Result<()> {
        let i = self.instances.len();
        anyhow::ensure!(i < MAX_ADV_INSTANCES, "at most {MAX_ADV_INSTANCES} AF_XDP instances");
        let port_name = port_name(&self.port_name, i);
        let peer_name = format!("{port_name}p");
        let mut rtnl = Rtnl::open().context("rtnetlink")?;
        if let Ok(old) = ifindex(&port_name) {
            // A port left by an earlier agent: start clean.
            let _ = rtnl.delete_link(old);
        }
        rtnl.create_veth(&port_name, &peer_name).with_context(|| format!("creating veth {port_name}/{peer_name}"))?;
        let port = ifindex(&port_name).map_err(|e| anyhow::anyhow!("{e}"))?;
        let made = (|| {
            let peer = ifindex(&peer_name).map_err(|e| anyhow::anyhow!("{e}"))?;
            rtnl.set_up(port)?;
            rtnl.set_up(peer)?;
            dp.attach_adv_port(port, peer)?;
            let xsk = Xsk::bind(peer, 0).with_context(|| format!("AF_XDP socket on {peer_name}"))?;
            let xsk_fd = xsk.dup_fd().context("dup of the AF_XDP socket")?;
            let rx = RxView::map(xsk.fd()).with_context(|| format!("AF_XDP socket on {peer_name}"))?;
            dp.set_adv_instance(i as u32, port, peer, xsk.fd())?;
            Ok::<_, anyhow::Error>((peer, xsk, xsk_fd, rx))
        })();
        let (peer, xsk, xsk_fd, rx) = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = rtnl.delete_link(port);
                return Err(e);
            }
        };
        let stats = Arc::new(WorkerStats { progress_ns: AtomicU64::new(now_monotonic_ns()), ..Default::default() });
        let stop = Arc::new(AtomicBool::new(false));
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let worker = {
            let (table, stats, stop) = (self.table.clone(), stats.clone(), stop.clone());
            let (rt_priority, spin) = (self.rt_priority, Duration::from_micros(self.busy_poll_us));
            std::thread::Builder::new()
                .name(format!("cgl-afxdp{i}"))
                .spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    let _ = tid_tx.send(unsafe { libc::gettid() });
                    if rt_priority > 0 {
                        let param = libc::sched_param { sched_priority: rt_priority as i32 };
                        // SAFETY: plain syscall on the calling thread with a valid param.
                        if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
                            tracing::warn!(
                                "AF_XDP worker {i} stays SCHED_OTHER: SCHED_FIFO {rt_priority}: {}",
                                std::io::Error::last_os_error()
                            );
                        }
                    }
                    worker(xsk, i, table, stats, stop, spin)
                })
                .context("starting an AF_XDP worker")?
        };
        let tid = tid_rx.recv().context("the AF_XDP worker did not start")?;
        self.instances.push(Instance { port, peer, stats, stop, worker: Some(worker), tid, core: 0, xsk_fd, rx });
        Ok(())
    }

    /// Publishes the advanced functions of `slot` (before the class is pointed at it).
    pub fn install(&self, slot: u32, chain: AdvChain) {
        self.table.write().unwrap_or_else(|p| p.into_inner()).insert(slot, Arc::new(chain));
    }

    pub fn chain(&self, slot: u32) -> Option<Arc<AdvChain>> {
        self.table.read().unwrap_or_else(|p| p.into_inner()).get(&slot).cloned()
    }

    /// Cumulative readings of the first `n` instances, with the counters of the functions of
    /// `slots` (the slots the classes point at), summed per function name.
    pub fn readings(&self, slots: &[u32], n: usize) -> Vec<WorkerReading> {
        let chains: Vec<Arc<AdvChain>> = slots.iter().filter_map(|&s| self.chain(s)).collect();
        self.instances
            .iter()
            .take(n)
            .enumerate()
            .map(|(i, inst)| {
                let mut functions: Vec<(String, u64, u64)> = Vec::new();
                for f in chains.iter().flat_map(|c| c.fns.iter()) {
                    let name = cgloop_proto::catalogue::spec(&f.f.function()).name.to_string();
                    let c = &f.counters[i];
                    let (p, d) = (c.packets.load(Ordering::Relaxed), c.dropped.load(Ordering::Relaxed));
                    match functions.iter_mut().find(|(n, _, _)| *n == name) {
                        Some(e) => (e.1, e.2) = (e.1 + p, e.2 + d),
                        None => functions.push((name, p, d)),
                    }
                }
                let rx_dropped = crate::afxdp::rx_dropped(inst.xsk_fd.as_raw_fd()).unwrap_or_else(|e| {
                    tracing::warn!("AF_XDP instance {i}: {e}");
                    0
                });
                // The ring first, then the progress: a worker that takes the waiting frames
                // between the two reads shows its fresh progress (no stall) once stored.
                // Either way a worker that keeps up reads at most about PARK_MS.
                let rx_waiting = inst.rx.waiting();
                let progress_ns = inst.stats.progress_ns.load(Ordering::Relaxed);
                let at_ns = now_monotonic_ns();
                WorkerReading {
                    instance: i as u32,
                    core: inst.core,
                    busy_ns: inst.stats.busy_ns.load(Ordering::Relaxed),
                    at_ns,
                    rx_dropped,
                    rx_waiting,
                    stalled_ns: stalled_ns(rx_waiting, progress_ns, at_ns),
                    functions,
                }
            })
            .collect()
    }
}

impl Drop for Advanced {
    fn drop(&mut self) {
        // Instances stop their workers and delete their ports.
        self.instances.clear();
    }
}

fn worker(
    mut xsk: Xsk,
    instance: usize,
    table: Table,
    stats: Arc<WorkerStats>,
    stop: Arc<AtomicBool>,
    spin: Duration,
) {
    let spin_ns = spin.as_nanos() as u64;
    let mut last = now_monotonic_ns();
    while !stop.load(Ordering::Relaxed) {
        let t = now_monotonic_ns();
        let spinning = spin_ns > 0 && t.saturating_sub(last) < spin_ns;
        match xsk.wait(if spinning { 0 } else { PARK_MS }) {
            Ok(true) => {}
            Ok(false) => {
                // The ring was empty after `t` (after the sleep when not spinning): the worker
                // has kept up until then. One relaxed store per loop.
                let seen = if spinning { t } else { now_monotonic_ns() };
                stats.progress_ns.store(seen, Ordering::Relaxed);
                if spinning {
                    std::hint::spin_loop();
                }
                continue;
            }
            Err(e) => {
                tracing::warn!("AF_XDP poll: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        }
        let began = now_monotonic_ns();
        let table_now = table.read().unwrap_or_else(|p| p.into_inner());
        let result = xsk.process(64, |frame| {
            let Some((slot, _)) = tag_of(frame) else {
                stats.untagged.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            let Some(chain) = table_now.get(&slot) else {
                stats.untagged.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            let out = run_chain(chain, frame, instance);
            if out.is_none() {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
            out
        });
        drop(table_now);
        let done = now_monotonic_ns();
        match result {
            Ok((rx, tx)) => {
                stats.rx.fetch_add(rx as u64, Ordering::Relaxed);
                stats.tx.fetch_add(tx as u64, Ordering::Relaxed);
                if rx > 0 {
                    stats.busy_ns.fetch_add(done.saturating_sub(began), Ordering::Relaxed);
                    // A batch taken: progress, even when frames still wait behind it (a slow
                    // worker is overloaded, which busy_ns shows, not stalled). A batch of none
                    // (its TX ring full) is no progress.
                    stats.progress_ns.store(done, Ordering::Relaxed);
                }
            }
            Err(e) => tracing::warn!("AF_XDP: {e}"),
        }
        last = done;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_is_stalled_only_while_frames_wait() {
        assert_eq!(stalled_ns(0, 1_000, 900_000_000), 0, "an empty ring: idle, not stalled");
        assert_eq!(stalled_ns(3, 100_000_000, 175_000_000), 75_000_000);
        assert_eq!(stalled_ns(1, 200, 100), 0, "progress after the reading's clock: none");
    }
}
