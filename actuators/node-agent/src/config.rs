//! Agent configuration: identity, files, and the hard bounds every request is checked against.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cgloop_proto::bus::{self, BusTopic};
use serde::Deserialize;

/// Limits that no request may exceed, whoever sends it (the policy engine can be wrong).
/// Enforced by `crate::bounds::Guard`, which every request path calls.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Bounds {
    /// Interfaces the agent may touch, wherever a request names one (queues, flow rules,
    /// impairments, chain function targets such as a mirror's); `["*"]` allows any.
    pub interfaces: Vec<String>,
    /// Cores a request may name (chain functions, power policies); empty allows every online
    /// core. A core must be online on the node either way.
    pub cores: Vec<u32>,
    pub min_rate_bps: u64,
    pub max_rate_bps: u64,
    pub max_burst_bytes: u32,
    pub max_classes: usize,
    pub max_flow_rules: usize,
    pub max_chain_functions: usize,
    pub max_chains: usize,
    /// Most instances an advanced chain function may ask for (ChainFunction.instances; each
    /// one an AF_XDP port and a worker thread), 1..16.
    pub max_function_instances: u32,
    /// Largest drop fraction an impairment may set.
    pub max_drop_fraction: f64,
    pub max_impairments: usize,
    pub min_probe_interval_ns: u64,
    pub max_probes: usize,
    pub max_probe_bytes: u32,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            interfaces: vec!["*".into()],
            cores: Vec::new(),
            min_rate_bps: 8_000,
            max_rate_bps: 100_000_000_000,
            max_burst_bytes: 64 * 1024 * 1024,
            max_classes: 64,
            max_flow_rules: 65_536,
            max_chain_functions: 8,
            max_chains: 128,
            max_function_instances: 4,
            max_drop_fraction: 0.5,
            max_impairments: 1024,
            min_probe_interval_ns: 1_000_000,
            max_probes: 32,
            max_probe_bytes: 1472,
        }
    }
}

/// The power module's place on this node (see src/power).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PowerSettings {
    /// Directory laid out like /sys/devices/system/cpu/cpufreq (policyN/scaling_*).
    pub cpufreq_root: PathBuf,
    /// Cores the agent may touch; empty means every core with a cpufreq policy.
    pub managed_cores: Vec<u32>,
    pub hard_min_khz: u32,
    pub hard_max_khz: u32,
    /// Directory laid out like /sys/devices/system/cpu (cpuN/cpuidle/stateK/disable): where
    /// `forbid_cstates` writes.
    pub cpuidle_root: PathBuf,
    /// Hard bound: at most this many cores kept out of C-states at once (each one spins at
    /// full power when idle). Unset: every core with cpuidle but one.
    pub max_cstate_forbidden_cores: Option<u32>,
    /// The probe's pinned per-function counters (X-MAN input).
    pub fn_stats_pin: PathBuf,
    pub if_fn_pin: PathBuf,
    pub functions: Vec<PowerFunction>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PowerFunction {
    pub index: u32,
    pub name: String,
    pub core: u32,
    #[serde(default)]
    pub c_task_cycles: Option<f64>,
}

impl Default for PowerSettings {
    fn default() -> Self {
        Self {
            cpufreq_root: PathBuf::from(crate::power::config::DEFAULT_CPUFREQ_ROOT),
            managed_cores: Vec::new(),
            hard_min_khz: 0,
            hard_max_khz: 0,
            cpuidle_root: PathBuf::from(crate::power::config::DEFAULT_CPUIDLE_ROOT),
            max_cstate_forbidden_cores: None,
            fn_stats_pin: PathBuf::from(crate::power::config::DEFAULT_FN_STATS_PIN),
            if_fn_pin: PathBuf::from(crate::power::config::DEFAULT_IF_FN_PIN),
            functions: Vec::new(),
        }
    }
}

/// The queue monitor (src/qmon.rs): BPF sojourn per packet plus the kernel's class statistics,
/// sampled into queue ticks for the node micro loop.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueSettings {
    pub enabled: bool,
    /// The sampler's period (µs).
    pub sample_interval_us: u64,
    /// A tick older than this is never served (the micro loop stops and says why).
    pub stale_after_us: u64,
    /// How often the kernel's class statistics (drops, overlimits, sent, backlog) are dumped
    /// over rtnetlink; the BPF state is read every tick.
    pub class_stats_interval_us: u64,
    /// SCHED_FIFO priority of the sampler thread (1..99; 0 = a normal thread). A busy node
    /// would otherwise delay ticks past `stale_after_us` and stop the micro loop when it is
    /// needed most; the sampler uses a few % of one core.
    pub rt_priority: u32,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            sample_interval_us: 1000,
            stale_after_us: 5000,
            class_stats_interval_us: 10_000,
            rt_priority: 10,
        }
    }
}

/// The L4S low-latency class (bpf/qprot.bpf.h): the ECN rule, RFC 9957 queue protection and
/// step CE marking on each listed interface. Defaults: CableLabs' (RFC 9957) and Linux
/// DualPI2's step.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueProtectionSettings {
    /// Queue protection (sanctions). The ECN rule and CE marking apply on the listed interfaces
    /// whenever `ll_class_id` is set, so the LL class keeps its traffic with protection off.
    pub enabled: bool,
    pub ll_class_id: u32,
    pub classic_class_id: u32,
    pub critical_qdelay_us: u64,
    pub critical_score_us: u64,
    pub lg_aging: u32,
    pub attempts: u32,
    pub buckets: u32,
    /// 0 = no CE marking.
    pub ce_step_us: u64,
    pub interfaces: Vec<String>,
}

impl Default for QueueProtectionSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            ll_class_id: 0,
            classic_class_id: 0,
            critical_qdelay_us: 1000,
            critical_score_us: 4000,
            lg_aging: 19,
            attempts: 2,
            buckets: 32,
            ce_step_us: 1000,
            interfaces: Vec::new(),
        }
    }
}

/// `[guard]`: the node micro loop's latency guard of protected flows (src/guard.rs) and the
/// audit of what the micro loop does (src/audit.rs).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardSettings {
    /// Off: protections are still accepted and listed, but the guard never moves a flow.
    pub enabled: bool,
    /// Promote a protected flow when the queue delay of its class reaches this share of its SLO.
    pub guard_fraction: f64,
    /// Promote only when that many consecutive queue ticks pass the guard threshold (a burst
    /// that drains within a tick does not).
    pub promote_ticks: u32,
    /// Release it only when the class it came from is below this share of its SLO (hysteresis).
    pub release_fraction: f64,
    /// Least time a flow stays promoted before it may be released.
    pub hold_ms: u64,
    /// How long every tick must read the class it came from below the release threshold
    /// before it is released (one calm tick mid-flood is not enough).
    pub release_calm_ms: u64,
    /// Cap on the guard's promotions and releases together, per second, over all flows.
    pub max_changes_per_s: u32,
    /// Bound on the flows ProtectFlows may hold at once (RESOURCE_EXHAUSTED beyond it).
    pub max_protected_flows: usize,
    /// The guard looks for a new queue tick this often.
    pub poll_interval_us: u64,
    /// A queue tick older than this is stale: the guard does not act on it.
    pub max_tick_age_us: u64,
    /// Queue-protection sanctions are aggregated per flow over this interval before they are
    /// audited.
    pub audit_interval_ms: u64,
    /// Audit records waiting for Kafka at most; beyond it they are dropped and counted (the
    /// micro loop never waits for the audit).
    pub audit_queue: usize,
}

impl Default for GuardSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            guard_fraction: 0.25,
            promote_ticks: 2,
            release_fraction: 0.05,
            hold_ms: 2000,
            release_calm_ms: 500,
            max_changes_per_s: 20,
            max_protected_flows: 256,
            poll_interval_us: 1000,
            max_tick_age_us: 5000,
            audit_interval_ms: 100,
            audit_queue: 4096,
        }
    }
}

/// `key` within `lo..=hi`, or an error naming the key and the bounds.
fn within<T: PartialOrd + std::fmt::Display>(key: &str, v: T, lo: T, hi: T) -> Result<()> {
    anyhow::ensure!(v >= lo && v <= hi, "{key} = {v} is out of range {lo}..={hi}");
    Ok(())
}

impl QueueSettings {
    pub fn check(&self) -> Result<()> {
        within("queues.sample_interval_us", self.sample_interval_us, 100, 1_000_000)?;
        within("queues.stale_after_us", self.stale_after_us, self.sample_interval_us, 10_000_000)?;
        within("queues.class_stats_interval_us", self.class_stats_interval_us, self.sample_interval_us, 10_000_000)?;
        within("queues.rt_priority", self.rt_priority, 0, 99)
    }
}

impl QueueProtectionSettings {
    pub fn check(&self) -> Result<()> {
        let k = |n: &str| format!("queue_protection.{n}");
        if self.interfaces.is_empty() {
            return Ok(());
        }
        within(&k("ll_class_id"), self.ll_class_id, 1, u32::MAX)?;
        within(&k("classic_class_id"), self.classic_class_id, 1, u32::MAX)?;
        anyhow::ensure!(
            self.ll_class_id != self.classic_class_id,
            "queue_protection.ll_class_id and classic_class_id must differ (both {:#x})",
            self.ll_class_id
        );
        within(&k("critical_qdelay_us"), self.critical_qdelay_us, 50, 1_000_000)?;
        within(&k("critical_score_us"), self.critical_score_us, 50, 10_000_000)?;
        within(&k("lg_aging"), self.lg_aging, 1, 30)?;
        within(&k("attempts"), self.attempts, 1, 4)?;
        within(&k("buckets"), self.buckets, 2, 256)?;
        anyhow::ensure!(
            self.buckets.is_power_of_two(),
            "queue_protection.buckets = {} must be a power of two within 2..=256",
            self.buckets
        );
        within(&k("ce_step_us"), self.ce_step_us, 0, 1_000_000)?;
        Ok(())
    }
}

impl GuardSettings {
    /// Every key within its bounds; a refusal names the key and the bounds.
    pub fn check(&self) -> Result<()> {
        let g = self;
        within("guard.guard_fraction", g.guard_fraction, 0.01, 1.0)?;
        within("guard.release_fraction", g.release_fraction, 0.0, 1.0)?;
        within("guard.promote_ticks", g.promote_ticks, 1, 1000)?;
        anyhow::ensure!(
            g.release_fraction < g.guard_fraction,
            "guard.release_fraction {} must be below guard.guard_fraction {} (hysteresis)",
            g.release_fraction,
            g.guard_fraction
        );
        within("guard.hold_ms", g.hold_ms, 0, 600_000)?;
        within("guard.release_calm_ms", g.release_calm_ms, 0, 600_000)?;
        within("guard.max_changes_per_s", g.max_changes_per_s, 1, 10_000)?;
        within("guard.max_protected_flows", g.max_protected_flows, 1, 65_536)?;
        within("guard.poll_interval_us", g.poll_interval_us, 100, 100_000)?;
        within("guard.max_tick_age_us", g.max_tick_age_us, 1000, 1_000_000)?;
        within("guard.audit_interval_ms", g.audit_interval_ms, 10, 60_000)?;
        within("guard.audit_queue", g.audit_queue, 16, 1_000_000)
    }
}

/// `[cpu_accounting]`: where the node samples' per-core utilisation comes from.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CpuAccounting {
    /// A cgroup v2 directory holding this node's processes: utilisation is the share of each
    /// core its tasks ran (src/cpu_acct.rs), for nodes that share a machine (the lab). Unset:
    /// the machine's `/proc/stat`, for an agent that has its machine to itself.
    pub cgroup: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub node_id: String,
    /// The desired-state journal restored on start.
    pub journal_path: PathBuf,
    /// How many recent action ids the agent remembers for idempotency.
    pub remembered_actions: usize,
    /// Validate and report only: never touch the kernel.
    pub dry_run: bool,
    pub bounds: Bounds,
    /// Write the journal with fsync (survives power loss, costs milliseconds per change).
    pub journal_fsync: bool,
    /// Group commit: the journal writer waits this long after a change before writing, to
    /// batch the changes that follow. A crash of the agent loses at most the changes
    /// acknowledged in this window plus one write (0: write as soon as possible).
    pub journal_commit_delay_us: u64,
    /// Answer a change only after it is in the journal (write on the RPC path, as before
    /// group commit). Concurrent changes still share one write.
    pub journal_sync_ack: bool,
    pub power: PowerSettings,
    /// Kafka bootstrap servers for probe records; empty keeps them local (GetState only).
    pub kafka_bootstrap: String,
    pub probe_topic: String,
    /// The longest a probe record waits in the agent before it is sent to Kafka (ms). The loop
    /// reads latency from these records, so this delay is part of its reaction time; records
    /// that arrive together still share one message.
    pub probe_export_delay_ms: u64,
    /// Advanced (payload) functions: name of the AF_XDP veth port the agent creates (its peer
    /// is the name + "p"; at most 14 characters).
    pub advanced_port: String,
    /// How long the AF_XDP worker spins for the next frame before it sleeps in poll(2), in µs
    /// (0 = always sleep: least CPU, most wake-up latency).
    pub advanced_busy_poll_us: u64,
    /// SCHED_FIFO priority of the AF_XDP worker (1..99); 0 = a normal thread.
    pub advanced_rt_priority: u32,
    /// Node samples (CPU, power, chain function counters) to Kafka every this many ms when
    /// `kafka_bootstrap` is set; 0 = none.
    pub node_sample_interval_ms: u64,
    pub node_topic: String,
    pub cpu_accounting: CpuAccounting,
    pub queues: QueueSettings,
    pub queue_protection: QueueProtectionSettings,
    /// Where the node micro loop's actions go (`Action` records, level NODE), with Kafka.
    pub action_topic: String,
    pub guard: GuardSettings,
    /// `[int_export]`: the INT source, on when the section is present (src/int_export/settings.rs
    /// documents the keys).
    pub int_export: Option<crate::int_export::IntExportSettings>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            node_id: hostname(),
            journal_path: PathBuf::from("/var/lib/cgloop/node-agent/journal.pb"),
            remembered_actions: 4096,
            dry_run: false,
            bounds: Bounds::default(),
            journal_fsync: false,
            journal_commit_delay_us: 1000,
            journal_sync_ack: false,
            power: PowerSettings::default(),
            kafka_bootstrap: String::new(),
            probe_topic: bus::topic(BusTopic::Probes).name.clone(),
            probe_export_delay_ms: 10,
            advanced_port: "cglxdp0".into(),
            advanced_busy_poll_us: 200,
            advanced_rt_priority: 10,
            node_sample_interval_ms: 1000,
            node_topic: bus::topic(BusTopic::Nodes).name.clone(),
            cpu_accounting: CpuAccounting::default(),
            queues: QueueSettings::default(),
            queue_protection: QueueProtectionSettings::default(),
            action_topic: bus::topic(BusTopic::Actions).name.clone(),
            guard: GuardSettings::default(),
            int_export: None,
        }
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        let config: Config =
            toml::from_str(&text).with_context(|| format!("parsing config {}", path.display()))?;
        config.check()?;
        Ok(config)
    }

    pub fn check(&self) -> Result<()> {
        let b = &self.bounds;
        anyhow::ensure!(b.min_rate_bps > 0, "bounds.min_rate_bps must be > 0");
        anyhow::ensure!(b.min_rate_bps <= b.max_rate_bps, "bounds.min_rate_bps > max_rate_bps");
        anyhow::ensure!(
            (0.0..=1.0).contains(&b.max_drop_fraction),
            "bounds.max_drop_fraction must be within 0..1"
        );
        anyhow::ensure!(
            b.max_chain_functions <= crate::datapath::MAX_CHAIN_FNS,
            "bounds.max_chain_functions exceeds the datapath's {}",
            crate::datapath::MAX_CHAIN_FNS
        );
        anyhow::ensure!(
            (1..=crate::datapath::MAX_ADV_INSTANCES as u32).contains(&b.max_function_instances),
            "bounds.max_function_instances must be within 1..{}",
            crate::datapath::MAX_ADV_INSTANCES
        );
        anyhow::ensure!(!self.node_id.is_empty(), "node_id must not be empty");
        anyhow::ensure!(
            !self.advanced_port.is_empty() && self.advanced_port.len() <= 14,
            "advanced_port must have 1..14 characters (its peer adds \"p\")"
        );
        let last = crate::advanced::port_name(&self.advanced_port, b.max_function_instances as usize - 1);
        anyhow::ensure!(
            last.len() < 15,
            "advanced_port {:?}: the port of instance {} would be {last:?}p, beyond 15 characters; \
             shorten it or lower bounds.max_function_instances",
            self.advanced_port,
            b.max_function_instances - 1
        );
        anyhow::ensure!(
            self.node_sample_interval_ms == 0 || self.node_sample_interval_ms >= 10,
            "node_sample_interval_ms must be 0 (off) or ≥ 10"
        );
        anyhow::ensure!(self.advanced_rt_priority <= 99, "advanced_rt_priority must be 0..99");
        anyhow::ensure!(self.advanced_busy_poll_us <= 100_000, "advanced_busy_poll_us must be ≤ 100000");
        anyhow::ensure!(
            (1..=10_000).contains(&self.probe_export_delay_ms),
            "probe_export_delay_ms must be within 1..10000 (got {})",
            self.probe_export_delay_ms
        );
        anyhow::ensure!(
            self.journal_commit_delay_us <= 1_000_000,
            "journal_commit_delay_us {} is above 1000000 (1 s): a crash would lose too much",
            self.journal_commit_delay_us
        );
        self.queues.check()?;
        self.queue_protection.check()?;
        self.guard.check()?;
        if let Some(int) = &self.int_export {
            int.check(&self.bounds)?;
        }
        Ok(())
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "node".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let err = toml::from_str::<Config>("node_id = \"a\"\n[bounds]\nmax_rate = 5\n").unwrap_err();
        assert!(err.to_string().contains("max_rate"), "{err}");
    }

    #[test]
    fn function_instances_are_bounded_and_fit_the_port_names() {
        let mut c = Config::default();
        assert_eq!(c.bounds.max_function_instances, 4);
        c.check().unwrap();
        c.bounds.max_function_instances = 17;
        assert!(c.check().unwrap_err().to_string().contains("bounds.max_function_instances must be within 1..16"));
        c.bounds.max_function_instances = 10;
        c.advanced_port = "abcdefghijkl".into(); // "abcdefghijkl-9p": 15 characters, the most
        c.check().unwrap();
        c.advanced_port = "abcdefghijklm".into();
        assert!(c.check().unwrap_err().to_string().contains("\"abcdefghijklm-9\"p"));
        c.bounds.max_function_instances = 1;
        c.check().unwrap();
    }

    #[test]
    fn inverted_rate_bounds_are_refused() {
        let mut c = Config::default();
        c.bounds.min_rate_bps = 10;
        c.bounds.max_rate_bps = 5;
        assert!(c.check().unwrap_err().to_string().contains("min_rate_bps"));
    }

    #[test]
    fn queue_sections_refuse_out_of_range_values_by_key_and_bounds() {
        let ok = "[queue_protection]\nll_class_id = 0x10040\nclassic_class_id = 0x10010\ninterfaces = [\"cpe\"]\n";
        let c: Config = toml::from_str(ok).unwrap();
        c.check().unwrap();
        assert_eq!((c.queue_protection.critical_score_us, c.queue_protection.lg_aging), (4000, 19));
        for (bad, key, bounds) in [
            ("buckets = 48", "queue_protection.buckets", "power of two"),
            ("buckets = 512", "queue_protection.buckets", "2..=256"),
            ("lg_aging = 31", "queue_protection.lg_aging", "1..=30"),
            ("attempts = 0", "queue_protection.attempts", "1..=4"),
            ("critical_qdelay_us = 10", "queue_protection.critical_qdelay_us", "50..=1000000"),
            ("classic_class_id = 0x10040", "classic_class_id must differ", ""),
        ] {
            let text = ok.replace("classic_class_id = 0x10010\n", "");
            let text = if bad.starts_with("classic") { text } else { format!("{text}classic_class_id = 0x10010\n") };
            let c: Config = toml::from_str(&format!("{text}{bad}\n")).unwrap();
            let err = c.check().unwrap_err().to_string();
            assert!(err.contains(key) && err.contains(bounds), "{bad}: {err}");
        }
        let c: Config = toml::from_str("[queues]\nsample_interval_us = 10\n").unwrap();
        assert!(c.check().unwrap_err().to_string().contains("queues.sample_interval_us = 10 is out of range 100..="));
        let c: Config = toml::from_str("[queues]\nstale_after_us = 500\n").unwrap();
        assert!(c.check().unwrap_err().to_string().contains("queues.stale_after_us"));
    }

    #[test]
    fn guard_keys_are_bounded_and_named() {
        let c: Config = toml::from_str("[guard]\nguard_fraction = 0.3\nhold_ms = 500\n").unwrap();
        c.check().unwrap();
        assert_eq!((c.guard.guard_fraction, c.guard.hold_ms, c.guard.max_protected_flows), (0.3, 500, 256));
        for (toml, key) in [
            ("guard_fraction = 1.5", "guard.guard_fraction = 1.5 is out of range 0.01..=1"),
            ("guard_fraction = nan", "guard.guard_fraction = NaN is out of range"),
            ("release_fraction = 0.3", "guard.release_fraction 0.3 must be below"),
            ("max_changes_per_s = 0", "guard.max_changes_per_s"),
            ("max_protected_flows = 0", "guard.max_protected_flows"),
            ("audit_interval_ms = 1", "guard.audit_interval_ms = 1 is out of range 10..=60000"),
        ] {
            let c: Config = toml::from_str(&format!("[guard]\n{toml}\n")).unwrap();
            let e = c.check().unwrap_err().to_string();
            assert!(e.contains(key), "{toml}: {e}");
        }
        assert!(toml::from_str::<Config>("[guard]\nguard = 1\n").is_err());
    }

    #[test]
    fn probe_export_delay_is_bounded_and_named() {
        let c: Config = toml::from_str("probe_export_delay_ms = 0\n").unwrap();
        assert!(c.check().unwrap_err().to_string().contains("probe_export_delay_ms"));
        let c: Config = toml::from_str("probe_export_delay_ms = 25\n").unwrap();
        assert_eq!(c.probe_export_delay_ms, 25);
        c.check().unwrap();
    }
}
