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
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use libbpf_rs::MapCore;

use crate::afxdp::Xsk;
use crate::datapath::Datapath;
use crate::netif::ifindex;
use crate::payload::{Counters, PayloadFn, Verdict};
use crate::tc::Rtnl;

/// One advanced function of a slot, with its counters.
pub struct AdvFn {
    pub f: Box<dyn PayloadFn>,
    pub counters: Counters,
}

/// The advanced suffix of one chain slot.
pub struct AdvChain {
    pub fns: Vec<AdvFn>,
}

/// Worker totals (GetState / debugging).
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub rx: AtomicU64,
    pub tx: AtomicU64,
    pub dropped: AtomicU64,
    /// Frames without a known slot tag (dropped).
    pub untagged: AtomicU64,
}

type Table = Arc<RwLock<HashMap<u32, Arc<AdvChain>>>>;

pub struct Advanced {
    pub port: u32,
    pub peer: u32,
    table: Table,
    pub stats: Arc<WorkerStats>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

/// Slot and interface index a tagged frame carries in its source MAC (bpf/agent.h).
pub fn tag_of(frame: &[u8]) -> Option<(u32, u32)> {
    let m = frame.get(6..12)?;
    if m[0] != 0xc6 || m[1] != 0x1a {
        return None;
    }
    Some((u16::from_be_bytes([m[2], m[3]]) as u32, u16::from_be_bytes([m[4], m[5]]) as u32))
}

/// Runs a slot's functions on a frame; None = dropped.
pub fn run_chain(chain: &AdvChain, frame: &mut [u8]) -> Option<u32> {
    for AdvFn { f, counters: c, .. } in &chain.fns {
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

impl Advanced {
    /// Creates (or recreates) the veth port, wires the BPF programs, binds the AF_XDP socket
    /// and starts the worker. `busy_poll_us`: how long the worker spins for the next frame
    /// before it sleeps in poll(2) (0 = always sleep).
    /// `rt_priority` > 0 runs the worker SCHED_FIFO at that priority, so a busy node's other
    /// processes cannot hold a frame in the ring for a whole time slice (a failure to get it is
    /// logged and the worker runs as a normal thread).
    pub fn start(dp: &Datapath, port_name: &str, busy_poll_us: u64, rt_priority: u32) -> Result<Self> {
        let peer_name = format!("{port_name}p");
        let mut rtnl = Rtnl::open().context("rtnetlink")?;
        if let Ok(old) = ifindex(port_name) {
            // A port left by an earlier agent: start clean.
            let _ = rtnl.delete_link(old);
        }
        rtnl.create_veth(port_name, &peer_name)?;
        let port = ifindex(port_name).map_err(|e| anyhow::anyhow!("{e}"))?;
        let peer = ifindex(&peer_name).map_err(|e| anyhow::anyhow!("{e}"))?;
        rtnl.set_up(port)?;
        rtnl.set_up(peer)?;
        dp.attach_adv_port(port, peer)?;
        let xsk = Xsk::bind(peer, 0).with_context(|| format!("AF_XDP socket on {peer_name}"))?;
        dp.xsks
            .update(&0u32.to_ne_bytes(), &(xsk.fd() as u32).to_ne_bytes(), libbpf_rs::MapFlags::ANY)
            .context("xsks update")?;
        let table: Table = Arc::default();
        let stats = Arc::new(WorkerStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let (table, stats, stop) = (table.clone(), stats.clone(), stop.clone());
            std::thread::Builder::new()
                .name("cgl-afxdp".into())
                .spawn(move || {
                    if rt_priority > 0 {
                        let param = libc::sched_param { sched_priority: rt_priority as i32 };
                        // SAFETY: plain syscall on the calling thread with a valid param.
                        if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
                            tracing::warn!(
                                "AF_XDP worker stays SCHED_OTHER: SCHED_FIFO {rt_priority}: {}",
                                std::io::Error::last_os_error()
                            );
                        }
                    }
                    worker(xsk, table, stats, stop, Duration::from_micros(busy_poll_us))
                })
                .context("starting the AF_XDP worker")?
        };
        Ok(Self { port, peer, table, stats, stop, worker: Some(worker) })
    }

    /// Publishes the advanced functions of `slot` (before the class is pointed at it).
    pub fn install(&self, slot: u32, chain: AdvChain) {
        self.table.write().unwrap_or_else(|p| p.into_inner()).insert(slot, Arc::new(chain));
    }

    pub fn chain(&self, slot: u32) -> Option<Arc<AdvChain>> {
        self.table.read().unwrap_or_else(|p| p.into_inner()).get(&slot).cloned()
    }
}

impl Drop for Advanced {
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

fn worker(mut xsk: Xsk, table: Table, stats: Arc<WorkerStats>, stop: Arc<AtomicBool>, spin: Duration) {
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let spinning = !spin.is_zero() && last.elapsed() < spin;
        match xsk.wait(if spinning { 0 } else { 100 }) {
            Ok(true) => {}
            Ok(false) => {
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
        let t = table.read().unwrap_or_else(|p| p.into_inner());
        let result = xsk.process(64, |frame| {
            let Some((slot, _)) = tag_of(frame) else {
                stats.untagged.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            let Some(chain) = t.get(&slot) else {
                stats.untagged.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            let out = run_chain(chain, frame);
            if out.is_none() {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
            out
        });
        drop(t);
        match result {
            Ok((rx, tx)) => {
                stats.rx.fetch_add(rx as u64, Ordering::Relaxed);
                stats.tx.fetch_add(tx as u64, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!("AF_XDP: {e}"),
        }
        last = Instant::now();
    }
}
