//! The INT source (`[int_export]`): Telemetry Report v2.0 postcards of sampled packets leaving
//! the agent's queues, sent over UDP to an INT collector (docs/node-agent.md, "INT source").
//!
//! The datapath (bpf/int.bpf.h, called by the queue monitor's dequeue tracepoint) decides which
//! packets are reported and hands each one to this module through a BPF ring buffer; the
//! `int-export` thread turns events into postcards ([`encode`]), coalesces them into datagrams
//! and sends them ([`sender`]), keeps the datapath's interface set equal to the configured
//! interfaces that have a queue hierarchy, and folds the datapath's counters into /metrics.
pub mod encode;
pub mod event;
pub mod sender;
mod settings;

pub use settings::IntExportSettings;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cgloop_obs::TotalCounter;
use libbpf_rs::{MapCore, MapFlags, MapHandle, RingBufferBuilder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use encode::Postcard;
use event::Event;
use sender::{Batcher, Sent, Udp};

/// The datapath's INT maps (dups of the loaded object's fds; bpf/int.bpf.h says who writes
/// what), plus the queue monitor's slot index to name a slot's class.
pub struct IntMaps {
    pub cfg: MapHandle,
    pub ifaces: MapHandle,
    pub counters: MapHandle,
    pub events: MapHandle,
    pub qmon_index: MapHandle,
}

impl IntMaps {
    pub fn try_clone(&self) -> Result<Self> {
        let dup = |m: &MapHandle| MapHandle::try_from(m).context("dup of an INT map fd");
        Ok(Self {
            cfg: dup(&self.cfg)?,
            ifaces: dup(&self.ifaces)?,
            counters: dup(&self.counters)?,
            events: dup(&self.events)?,
            qmon_index: dup(&self.qmon_index)?,
        })
    }
}

/// The INT source on /metrics (prefix `cgloop_node_agent_int_`).
#[derive(Default)]
pub struct IntMetrics {
    pub reports_sent: Counter,
    pub datagrams_sent: Counter,
    pub send_errors: Counter,
    pub candidates: TotalCounter,
    pub capped: TotalCounter,
    pub ringbuf_lost: TotalCounter,
    pub unparsed: TotalCounter,
    pub interfaces: Gauge,
}

impl IntMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register("int_reports_sent", "INT postcards (TR v2.0 individual reports) sent to the collector", self.reports_sent.clone());
        r.register("int_datagrams_sent", "INT report datagrams sent to the collector", self.datagrams_sent.clone());
        r.register(
            "int_send_errors",
            "INT report datagrams the socket refused (their reports are lost)",
            self.send_errors.clone(),
        );
        r.register(
            "int_candidates",
            "Packets chosen for an INT report (sampled or over the latency threshold), before the rate cap",
            self.candidates.clone(),
        );
        r.register("int_reports_capped", "INT reports dropped by max_reports_per_s", self.capped.clone());
        r.register(
            "int_ringbuf_lost",
            "INT reports lost because the ring buffer to user space was full",
            self.ringbuf_lost.clone(),
        );
        r.register(
            "int_unparsed",
            "Packets chosen for an INT report whose IP/transport headers could not be read (not IP, a fragment, non-linear headers)",
            self.unparsed.clone(),
        );
        r.register(
            "int_interfaces",
            "[int_export] interfaces being reported (those with a queue hierarchy)",
            self.interfaces.clone(),
        );
    }

    fn sent(&self, s: Sent) {
        self.reports_sent.inc_by(s.reports);
        self.datagrams_sent.inc_by(s.datagrams);
        self.send_errors.inc_by(s.errors);
    }
}

/// The running exporter; dropping it stops the thread and the datapath's reporting.
pub struct Exporter {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `struct int_cfg` of bpf/int.bpf.h.
fn cfg_bytes(s: &IntExportSettings, enabled: bool) -> Vec<u8> {
    let interval_ns = 1_000_000_000 / u64::from(s.max_reports_per_s.max(1));
    // Bursts of a tenth of a second's reports (at least one).
    let burst_ns = interval_ns * u64::from((s.max_reports_per_s / 10).max(1));
    let mut b = Vec::with_capacity(32);
    b.extend_from_slice(&s.report_over_ns.to_ne_bytes());
    b.extend_from_slice(&interval_ns.to_ne_bytes());
    b.extend_from_slice(&burst_ns.to_ne_bytes());
    b.extend_from_slice(&s.sample_every.to_ne_bytes());
    b.extend_from_slice(&u32::from(enabled).to_ne_bytes());
    b
}

/// The interfaces the agent holds a queue hierarchy on (`Agent::managed_interfaces`).
pub type Managed = Box<dyn Fn() -> Vec<String> + Send>;

/// Starts the exporter (None when `[int_export]` is off). `managed` names the interfaces with
/// a queue hierarchy (read about twice a second: only those are reported).
pub fn start(
    settings: &IntExportSettings,
    maps: IntMaps,
    managed: Managed,
    metrics: Arc<IntMetrics>,
) -> Result<Option<Exporter>> {
    if !settings.enabled {
        return Ok(None);
    }
    let collector = settings.collector_addr()?;
    let udp = Udp::connect(collector)?;
    let cfg = cfg_bytes(settings, true);
    anyhow::ensure!(
        maps.cfg.value_size() as usize == cfg.len(),
        "int_cfg map value is {} bytes, the agent writes {} (bpf/int.bpf.h and src/int_export disagree)",
        maps.cfg.value_size(),
        cfg.len()
    );
    maps.cfg
        .update(&0u32.to_ne_bytes(), &cfg, MapFlags::ANY)
        .context("writing int_cfg")?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut run = Run::new(settings.clone(), maps, managed, metrics, udp);
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("int-export".into())
        .spawn(move || {
            if let Err(e) = run.run(&flag) {
                tracing::error!("INT export stopped: {e:#}");
            }
            run.disable();
        })
        .context("starting the int-export thread")?;
    tracing::info!(collector = %collector, node_id = settings.node_id, "INT source on: TR v2.0 postcards");
    Ok(Some(Exporter { stop, thread: Some(thread) }))
}

struct Run {
    s: IntExportSettings,
    maps: IntMaps,
    managed: Managed,
    metrics: Arc<IntMetrics>,
    batcher: Batcher<Udp>,
    /// Interface name -> ifindex currently in int_ifaces.
    active: BTreeMap<String, u32>,
    /// Configured interfaces last seen without a hierarchy (warned once per episode).
    waiting: Vec<String>,
    /// qmon slot -> class id.
    classes: HashMap<u32, u32>,
    classes_read: Option<Instant>,
    /// CLOCK_REALTIME - CLOCK_MONOTONIC (ns), to put the datapath's times on the Unix epoch.
    clock_offset: i64,
}

fn clock_ns(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn clock_offset() -> i64 {
    clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_MONOTONIC)
}

impl Run {
    fn new(
        s: IntExportSettings,
        maps: IntMaps,
        managed: Managed,
        metrics: Arc<IntMetrics>,
        udp: Udp,
    ) -> Self {
        let batcher = Batcher::new(
            udp,
            s.node_id,
            s.hw_id,
            s.max_reports_per_datagram as usize,
            s.max_datagram_bytes as usize,
            Duration::from_millis(s.flush_interval_ms),
        );
        Self {
            s,
            maps,
            managed,
            metrics,
            batcher,
            active: BTreeMap::new(),
            waiting: Vec::new(),
            classes: HashMap::new(),
            classes_read: None,
            clock_offset: clock_offset(),
        }
    }

    fn run(&mut self, stop: &AtomicBool) -> Result<()> {
        let events: Rc<RefCell<Vec<Event>>> = Rc::default();
        let lost_parse = Rc::new(RefCell::new(0u64));
        let ring = {
            let (events, lost_parse) = (events.clone(), lost_parse.clone());
            let mut b = RingBufferBuilder::new();
            b.add(&self.maps.events, move |data: &[u8]| {
                match Event::parse(data) {
                    Some(e) => events.borrow_mut().push(e),
                    None => *lost_parse.borrow_mut() += 1,
                }
                0
            })
            .context("INT ring buffer")?;
            b.build().context("INT ring buffer")?
        };
        let tick = Duration::from_millis(self.s.flush_interval_ms);
        let mut housekeeping = Instant::now() - Duration::from_secs(1);
        let mut rounds = 0u64;
        self.sync_interfaces()?;
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let wait = self.batcher.due_in(now).unwrap_or(tick).min(tick).max(Duration::from_millis(1));
            if let Err(e) = ring.poll(wait) {
                tracing::warn!("polling the INT ring buffer: {e}");
                std::thread::sleep(tick);
            }
            let batch = std::mem::take(&mut *events.borrow_mut());
            let now = Instant::now();
            for e in &batch {
                let p = self.postcard(e, now);
                let sent = self.batcher.push(&p, now);
                self.metrics.sent(sent);
            }
            let sent = self.batcher.flush_if_due(now);
            self.metrics.sent(sent);
            if let Some(e) = self.batcher.take_error() {
                tracing::warn!(collector = %self.s.collector, "sending INT reports: {e}");
            }
            if now.duration_since(housekeeping) >= Duration::from_millis(200) {
                housekeeping = now;
                rounds += 1;
                if rounds % 3 == 0 {
                    self.sync_interfaces()?;
                }
                self.read_counters();
                self.clock_offset = clock_offset();
                let unparsed = *lost_parse.borrow();
                if unparsed > 0 {
                    tracing::warn!("{unparsed} INT events of an unexpected size were ignored");
                    *lost_parse.borrow_mut() = 0;
                }
            }
        }
        let sent = self.batcher.flush();
        self.metrics.sent(sent);
        Ok(())
    }

    /// Stops the datapath's reporting (the thread is going away).
    fn disable(&mut self) {
        let _ = self.maps.cfg.update(&0u32.to_ne_bytes(), &cfg_bytes(&self.s, false), MapFlags::ANY);
        for ifindex in self.active.values() {
            let _ = self.maps.ifaces.delete(&ifindex.to_ne_bytes());
        }
    }

    fn postcard(&mut self, e: &Event, now: Instant) -> Postcard {
        let sojourn = e.sojourn_ns();
        let classid = self.class_of(e.slot, now);
        let cell = i64::from(self.s.cell_bytes.max(1));
        let cells = e.backlog_bytes.max(0).saturating_add(cell - 1) / cell;
        let wall = |mono: u64| (mono as i64).saturating_add(self.clock_offset).max(0) as u64;
        Postcard {
            ingress_ifindex: e.ingress_ifindex,
            egress_ifindex: e.egress_ifindex,
            hop_latency_ns: u32::try_from(sojourn).unwrap_or(u32::MAX),
            queue_id: classid.map_or(u8::MAX, |c| u8::try_from(c & 0xffff).unwrap_or(u8::MAX)),
            queue_occupancy: u32::try_from(cells).unwrap_or(u32::MAX),
            ingress_ts_ns: wall(e.enq_ns),
            egress_ts_ns: wall(e.deq_ns),
            congested: self.s.congested_over_ns > 0 && sojourn >= self.s.congested_over_ns,
            inner: e.headers.clone(),
            inner_v6: e.family == 6,
        }
    }

    /// The class id of a qmon slot (qmon_index re-read on a miss, at most every 100 ms).
    fn class_of(&mut self, slot: u32, now: Instant) -> Option<u32> {
        if let Some(c) = self.classes.get(&slot) {
            return Some(*c);
        }
        if self.classes_read.is_some_and(|t| now.duration_since(t) < Duration::from_millis(100)) {
            return None;
        }
        self.classes_read = Some(now);
        self.classes.clear();
        for key in self.maps.qmon_index.keys() {
            let Ok(Some(v)) = self.maps.qmon_index.lookup(&key, MapFlags::ANY) else { continue };
            // struct qmon_key { ifindex, classid } -> slot
            if key.len() >= 8 && v.len() >= 4 {
                let classid = u32::from_ne_bytes([key[4], key[5], key[6], key[7]]);
                self.classes.insert(u32::from_ne_bytes([v[0], v[1], v[2], v[3]]), classid);
            }
        }
        self.classes.get(&slot).copied()
    }

    /// int_ifaces := the configured interfaces that have a queue hierarchy (by their current
    /// ifindex); a configured interface without one is named in a warning.
    fn sync_interfaces(&mut self) -> Result<()> {
        let managed = (self.managed)();
        let mut want = BTreeMap::new();
        let mut waiting = Vec::new();
        for name in &self.s.interfaces {
            if !managed.contains(name) {
                waiting.push(name.clone());
                continue;
            }
            match crate::netif::ifindex(name) {
                Ok(i) => {
                    want.insert(name.clone(), i);
                }
                Err(e) => {
                    tracing::warn!("int_export.interfaces: {name}: {e}");
                    waiting.push(name.clone());
                }
            }
        }
        if want == self.active && waiting == self.waiting {
            return Ok(());
        }
        for (name, ifindex) in &self.active {
            if want.get(name) != Some(ifindex) {
                let _ = self.maps.ifaces.delete(&ifindex.to_ne_bytes());
            }
        }
        for (name, ifindex) in &want {
            if self.active.get(name) != Some(ifindex) {
                self.maps
                    .ifaces
                    .update(&ifindex.to_ne_bytes(), &1u32.to_ne_bytes(), MapFlags::ANY)
                    .with_context(|| format!("int_ifaces: adding {name}"))?;
                tracing::info!(interface = %name, "INT source reports the queues of {name}");
            }
        }
        let fresh: Vec<&String> = waiting.iter().filter(|n| !self.waiting.contains(n)).collect();
        if !fresh.is_empty() {
            tracing::warn!(
                "int_export.interfaces {fresh:?} have no queue hierarchy from this agent: not reported \
                 until ApplyQueueHierarchy creates one"
            );
        }
        self.waiting = waiting;
        self.metrics.interfaces.set(want.len() as i64);
        self.active = want;
        // Slots may have moved with the hierarchies.
        self.classes.clear();
        self.classes_read = None;
        Ok(())
    }

    /// The datapath's counters (summed over CPUs) into /metrics.
    fn read_counters(&self) {
        let read = |idx: u32| -> u64 {
            match self.maps.counters.lookup_percpu(&idx.to_ne_bytes(), MapFlags::ANY) {
                Ok(Some(per_cpu)) => per_cpu
                    .iter()
                    .map(|v| u64::from_ne_bytes(v.get(..8).and_then(|b| b.try_into().ok()).unwrap_or_default()))
                    .sum(),
                _ => 0,
            }
        };
        // enum int_counter of bpf/int.bpf.h.
        self.metrics.candidates.observe(read(0));
        self.metrics.capped.observe(read(1));
        self.metrics.ringbuf_lost.observe(read(2));
        self.metrics.unparsed.observe(read(3));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_datapath_settings_follow_the_keys() {
        let s = IntExportSettings { max_reports_per_s: 20_000, report_over_ns: 7, sample_every: 9, ..Default::default() };
        let b = cfg_bytes(&s, true);
        let u64_at = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().unwrap());
        assert_eq!(b.len(), 32);
        assert_eq!((u64_at(0), u64_at(8), u64_at(16)), (7, 50_000, 100_000_000));
        assert_eq!((u32_at(24), u32_at(28)), (9, 1));
        let b = cfg_bytes(&IntExportSettings { max_reports_per_s: 5, ..Default::default() }, false);
        assert_eq!(u64::from_ne_bytes(b[16..24].try_into().unwrap()), 200_000_000, "burst of at least one");
        assert_eq!(u32::from_ne_bytes(b[28..32].try_into().unwrap()), 0);
    }
}
