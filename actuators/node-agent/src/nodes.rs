//! Node samples to Kafka (`cgloop.nodes.v1`, one `NodeSampleBatch` per message, key = node
//! id): every `node_sample_interval_ms` the agent reads per-core CPU time from `/proc/stat`, or
//! from the node's cgroup where nodes share a machine (`[cpu_accounting]`, src/cpu_acct.rs)
//! (utilization = busy share of the interval), the cpufreq/cpuidle state of the cores where the
//! node has them, and the packet counters of every chain function (BPF and AF_XDP) from its own
//! state: a BPF function once, an advanced (AF_XDP) function once per instance, with the
//! share of the interval its worker spent processing frames (`busy_ratio`), the frames its
//! socket lost to a full ring (`rx_dropped`), the frames waiting in its ring (`rx_waiting`) and
//! how long its worker has made no progress while they wait (`stalled_ns`). The analytics overload detector reads
//! `cores[].utilization` and `functions[].packets`.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use cgloop_proto::v1::{
    CoreSample, FunctionCounters, MicroLoopStatus, NodeSample, NodeSampleBatch, NodeState, QueueSample, RecordHeader,
};
use prost::Message;
use rdkafka::producer::BaseRecord;

use crate::advanced::WorkerReading;

/// Busy and total jiffies of one CPU (`cpuN` line of /proc/stat).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub busy: u64,
    pub total: u64,
}

/// Parses the `cpuN` lines of /proc/stat (the aggregate `cpu` line is skipped). idle and
/// iowait count as not busy; guest time is already inside user/nice.
pub fn parse_proc_stat(text: &str) -> Result<BTreeMap<u32, CpuTimes>> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let mut it = line.split_whitespace();
        let Some(name) = it.next() else { continue };
        let Some(cpu) = name.strip_prefix("cpu").filter(|s| !s.is_empty()) else { continue };
        let cpu: u32 = cpu.parse().with_context(|| format!("/proc/stat line {}: cpu {cpu:?}", n + 1))?;
        let v: Vec<u64> = it
            .take(8)
            .map(|x| x.parse::<u64>())
            .collect::<Result<_, _>>()
            .with_context(|| format!("/proc/stat line {}: {line:?}", n + 1))?;
        anyhow::ensure!(v.len() >= 4, "/proc/stat line {}: fewer than 4 times in {line:?}", n + 1);
        let total: u64 = v.iter().sum();
        let idle = v[3] + v.get(4).copied().unwrap_or(0);
        out.insert(cpu, CpuTimes { busy: total - idle.min(total), total });
    }
    anyhow::ensure!(!out.is_empty(), "/proc/stat has no cpuN lines");
    Ok(out)
}

/// Where a node's per-core busy time comes from.
pub trait CpuSource: Send + 'static {
    /// Cumulative busy and total time per online CPU (any unit, the same for both).
    fn read(&self) -> Result<BTreeMap<u32, CpuTimes>>;
    /// What is read, for the log.
    fn describe(&self) -> String;
}

/// The machine's CPU time (`/proc/stat`): the node is the machine.
pub struct ProcStat;

impl CpuSource for ProcStat {
    fn read(&self) -> Result<BTreeMap<u32, CpuTimes>> {
        std::fs::read_to_string("/proc/stat").context("reading /proc/stat").and_then(|t| parse_proc_stat(&t))
    }

    fn describe(&self) -> String {
        "/proc/stat".into()
    }
}

/// Busy share of each CPU between two readings (0..1; a CPU without progress reads 0).
pub fn utilization(prev: &BTreeMap<u32, CpuTimes>, cur: &BTreeMap<u32, CpuTimes>) -> BTreeMap<u32, f64> {
    cur.iter()
        .map(|(&cpu, c)| {
            let p = prev.get(&cpu).copied().unwrap_or_default();
            let total = c.total.saturating_sub(p.total);
            let busy = c.busy.saturating_sub(p.busy);
            (cpu, if total == 0 { 0.0 } else { (busy as f64 / total as f64).clamp(0.0, 1.0) })
        })
        .collect()
}

/// Busy share of an AF_XDP worker between two readings (busy ns, monotonic ns): 0..1; None
/// without a previous reading or without time between them.
pub fn busy_ratio(prev: Option<(u64, u64)>, busy_ns: u64, at_ns: u64) -> Option<f64> {
    let (prev_busy, prev_at) = prev?;
    let wall = at_ns.checked_sub(prev_at).filter(|&w| w > 0)?;
    Some((busy_ns.saturating_sub(prev_busy) as f64 / wall as f64).clamp(0.0, 1.0))
}

/// Previous busy readings per AF_XDP instance: (busy ns, monotonic ns).
pub type BusyHistory = BTreeMap<u32, (u64, u64)>;

/// Chain functions of a node state as counters, summed per function name (the detector's
/// capacities are per name); an advanced function the workers report appears once per
/// instance instead (instance, core, busy_ratio since the previous call, rx_dropped,
/// rx_waiting, stalled_ns).
pub fn functions(state: &NodeState, workers: &[WorkerReading], history: &mut BusyHistory) -> Vec<FunctionCounters> {
    let per_instance: Vec<&str> =
        workers.iter().flat_map(|w| w.functions.iter().map(|(n, _, _)| n.as_str())).collect();
    let mut by_name: BTreeMap<(String, u32), FunctionCounters> = BTreeMap::new();
    for chain in &state.chains {
        for f in &chain.functions {
            if per_instance.contains(&f.name()) {
                continue;
            }
            let e = by_name.entry((f.name().to_string(), 0)).or_insert_with(|| FunctionCounters {
                function_name: f.name().to_string(),
                core: f.core,
                ..Default::default()
            });
            e.packets += f.packets;
            e.forwarded_packets += f.packets.saturating_sub(f.dropped_packets);
        }
    }
    for w in workers {
        let ratio = busy_ratio(history.get(&w.instance).copied(), w.busy_ns, w.at_ns);
        history.insert(w.instance, (w.busy_ns, w.at_ns));
        for (name, packets, dropped) in &w.functions {
            let e = by_name.entry((name.clone(), w.instance)).or_insert_with(|| FunctionCounters {
                function_name: name.clone(),
                core: w.core,
                instance: w.instance,
                busy_ratio: ratio,
                rx_dropped: w.rx_dropped,
                rx_waiting: w.rx_waiting,
                stalled_ns: w.stalled_ns,
                ..Default::default()
            });
            e.packets += packets;
            e.forwarded_packets += packets.saturating_sub(*dropped);
        }
    }
    by_name.into_values().collect()
}

/// Builds one sample from the CPU utilization, the power module's cores (may be empty) and the
/// agent's state.
pub fn sample(
    node_id: &str,
    sequence: u64,
    util: &BTreeMap<u32, f64>,
    power_cores: &[CoreSample],
    state: &NodeState,
    workers: &[WorkerReading],
    history: &mut BusyHistory,
) -> NodeSample {
    let now = cgloop_proto::host::now_ns();
    let cores = util
        .iter()
        .map(|(&core, &u)| {
            let mut c = power_cores.iter().find(|p| p.core == core).cloned().unwrap_or(CoreSample {
                core,
                ..Default::default()
            });
            c.utilization = u;
            c
        })
        .collect();
    NodeSample {
        header: Some(RecordHeader {
            schema_version: cgloop_proto::SCHEMA_VERSION,
            source_id: format!("{node_id}/node-agent"),
            sequence,
            timestamp_ns: now,
        }),
        node_id: node_id.to_string(),
        cores,
        functions: functions(state, workers, history),
        power_watts: None,
        energy_joules: None,
        queues: Vec::new(),
        micro_loop: None,
    }
}

/// What the sampler needs from the agent.
pub trait Source: Send + Sync + 'static {
    fn node_state(&self) -> Option<NodeState>;
    fn power_cores(&self) -> Vec<CoreSample>;
    /// Cumulative readings of the AF_XDP workers the chains use (src/advanced.rs).
    fn workers(&self) -> Vec<WorkerReading> {
        Vec::new()
    }
    /// Queue samples since the previous call and the micro loop's status (src/qmon.rs).
    fn queues(&self) -> (Vec<QueueSample>, Option<MicroLoopStatus>) {
        (Vec::new(), None)
    }
}

/// Names each queue sample's class after the hierarchy the agent applied.
pub fn name_classes(queues: &mut [QueueSample], state: &NodeState) {
    for q in queues {
        let h = state.queues.iter().find(|h| h.interface_name == q.interface_name);
        if let Some(c) = h.and_then(|h| h.classes.iter().find(|c| c.class_id == q.class_id)) {
            q.class_name = c.name.clone();
        }
    }
}

/// Starts the sampler thread: one sample every `interval` to `topic`.
pub fn start(
    bootstrap: &str,
    topic: &str,
    node_id: &str,
    interval: Duration,
    source: Arc<dyn Source>,
    cpu: Box<dyn CpuSource>,
) -> Result<()> {
    let producer = crate::export::producer(bootstrap, &format!("{node_id}-nodes"))?;
    let (topic, node_id) = (topic.to_string(), node_id.to_string());
    std::thread::Builder::new()
        .name("node-samples".into())
        .spawn(move || {
            let read = || cpu.read();
            let mut prev = read().unwrap_or_default();
            let mut seq = 0u64;
            let mut history = BusyHistory::new();
            loop {
                std::thread::sleep(interval);
                let cur = match read() {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!("node sample ({}): {e:#}", cpu.describe());
                        continue;
                    }
                };
                let util = utilization(&prev, &cur);
                prev = cur;
                let state = source.node_state().unwrap_or_default();
                seq += 1;
                let workers = source.workers();
                let mut s = sample(&node_id, seq, &util, &source.power_cores(), &state, &workers, &mut history);
                (s.queues, s.micro_loop) = source.queues();
                name_classes(&mut s.queues, &state);
                let payload = NodeSampleBatch { records: vec![s] }.encode_to_vec();
                let record = BaseRecord::to(&topic)
                    .key(node_id.as_str())
                    .payload(&payload)
                    .headers(crate::export::headers(cgloop_proto::bus::BusTopic::Nodes));
                if let Err((e, _)) = producer.send(record) {
                    tracing::warn!("node sample {seq} not queued for Kafka: {e}");
                }
                producer.poll(Duration::ZERO);
            }
        })
        .context("starting the node sampler thread")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cgloop_proto::v1::{ChainFunction, ServiceChain};

    const STAT: &str = "cpu  10 0 10 80 0 0 0 0 0 0\n\
                        cpu0 5 0 5 40 0 0 0 0 0 0\n\
                        cpu1 5 0 5 40 0 0 0 0 0 0\n\
                        intr 1 2 3\nctxt 99\n";

    #[test]
    fn utilization_is_the_busy_share_of_the_interval() {
        let a = parse_proc_stat(STAT).unwrap();
        assert_eq!(a[&0], CpuTimes { busy: 10, total: 50 });
        let b = parse_proc_stat(&STAT.replace("cpu1 5 0 5 40", "cpu1 35 0 5 50")).unwrap();
        let u = utilization(&a, &b);
        assert_eq!(u[&0], 0.0);
        assert!((u[&1] - 0.75).abs() < 1e-9, "{u:?}"); // 30 busy of 40
        assert!(parse_proc_stat("cpu0 1 x 3 4").unwrap_err().to_string().contains("line 1"));
        assert!(parse_proc_stat("intr 1").is_err());
    }

    #[test]
    fn queue_samples_are_named_after_the_applied_hierarchy() {
        use cgloop_proto::v1::{HtbClass, QueueHierarchy};
        let state = NodeState {
            queues: vec![QueueHierarchy {
                interface_name: "cpe".into(),
                classes: vec![HtbClass { name: "l4s".into(), class_id: 0x10040, ..Default::default() }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let q = |iface: &str, class_id| QueueSample { interface_name: iface.into(), class_id, ..Default::default() };
        let mut queues = vec![q("cpe", 0x10040), q("cpe", 0x10010), q("wan", 0x10040)];
        name_classes(&mut queues, &state);
        let names: Vec<&str> = queues.iter().map(|q| q.class_name.as_str()).collect();
        assert_eq!(names, ["l4s", "", ""]);
    }

    #[test]
    fn functions_are_summed_per_name_with_forwarded_packets() {
        use cgloop_proto::v1::chain_function::Function;
        use cgloop_proto::v1::{Acl, Dpi};
        let f = |name: &str, packets, dropped| ChainFunction {
            function: Some(if name == "dpi" {
                Function::Dpi(Dpi::default())
            } else {
                Function::Acl(Acl::default())
            }),
            packets,
            dropped_packets: dropped,
            ..Default::default()
        };
        let state = NodeState {
            chains: vec![
                ServiceChain { functions: vec![f("acl", 10, 4), f("dpi", 6, 1)], ..Default::default() },
                ServiceChain { functions: vec![f("dpi", 4, 0)], ..Default::default() },
            ],
            ..Default::default()
        };
        let s = sample("n1", 7, &BTreeMap::from([(0, 0.5)]), &[], &state, &[], &mut BusyHistory::new());
        assert_eq!(s.header.as_ref().map(|h| (h.sequence, h.source_id.as_str())), Some((7, "n1/node-agent")));
        assert_eq!(s.cores[0].utilization, 0.5);
        let dpi = s.functions.iter().find(|f| f.function_name == "dpi").unwrap();
        assert_eq!((dpi.packets, dpi.forwarded_packets), (10, 9));
    }

    #[test]
    fn busy_ratio_is_the_busy_share_of_the_interval() {
        assert_eq!(busy_ratio(None, 5, 10), None, "no previous reading");
        assert_eq!(busy_ratio(Some((0, 10)), 5, 10), None, "no time between readings");
        assert_eq!(busy_ratio(Some((0, 20)), 5, 10), None, "the clock went back");
        let r = busy_ratio(Some((1_000_000, 0)), 251_000_000, 1_000_000_000).unwrap();
        assert!((r - 0.25).abs() < 1e-12, "{r}");
        assert_eq!(busy_ratio(Some((0, 0)), 3_000, 1_000), Some(1.0), "capped at 1");
        assert_eq!(busy_ratio(Some((9, 0)), 5, 1_000), Some(0.0), "a counter reset reads idle");
    }

    #[test]
    fn advanced_functions_are_reported_per_instance() {
        use cgloop_proto::v1::chain_function::Function;
        use cgloop_proto::v1::{Dpi, Mark};
        let f = |function, packets, dropped| ChainFunction {
            function: Some(function),
            packets,
            dropped_packets: dropped,
            ..Default::default()
        };
        let state = NodeState {
            chains: vec![ServiceChain {
                functions: vec![f(Function::Mark(Mark::default()), 30, 0), f(Function::Dpi(Dpi::default()), 30, 3)],
                ..Default::default()
            }],
            ..Default::default()
        };
        let w = |instance, core, busy_ns, at_ns, packets, dropped| WorkerReading {
            instance,
            core,
            busy_ns,
            at_ns,
            rx_dropped: 7 * instance as u64,
            rx_waiting: 5 * instance,
            stalled_ns: 60_000_000 * instance as u64,
            functions: vec![("dpi".into(), packets, dropped)],
        };
        let mut history = BusyHistory::new();
        let first = functions(&state, &[w(0, 0, 100, 1_000, 10, 1), w(1, 1, 0, 1_000, 20, 2)], &mut history);
        let names: Vec<(&str, u32)> = first.iter().map(|c| (c.function_name.as_str(), c.instance)).collect();
        assert_eq!(names, [("dpi", 0), ("dpi", 1), ("mark", 0)]);
        assert_eq!((first[1].packets, first[1].forwarded_packets, first[1].core, first[1].rx_dropped), (20, 18, 1, 7));
        assert_eq!((first[1].rx_waiting, first[1].stalled_ns), (5, 60_000_000), "the worker's stall");
        assert_eq!((first[0].rx_waiting, first[0].stalled_ns), (0, 0));
        assert_eq!((first[2].rx_waiting, first[2].stalled_ns), (0, 0), "BPF functions have none");
        assert_eq!(first[0].busy_ratio, None, "no interval yet");
        assert_eq!(first[2].busy_ratio, None, "BPF functions have none");
        let second = functions(&state, &[w(0, 0, 600, 2_000, 15, 1), w(1, 1, 250, 2_000, 40, 2)], &mut history);
        assert_eq!(second[0].busy_ratio, Some(0.5));
        assert_eq!(second[1].busy_ratio, Some(0.25));
    }
}
