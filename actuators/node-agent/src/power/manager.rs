//! The power manager: per-core policies with hard bounds, and the X-MAN micro loop that reads
//! the function counters and sets `scaling_setspeed` (thesis §4.3.3: one loop for all functions
//! of a core; the core runs at the highest frequency its functions want).
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::config::PowerConfig;
use super::counters::CounterSource;
use super::cpufreq::{Cpufreq, PolicyInfo};
use super::error::{PowerError, Result};
use super::xman::{Algorithm, FunctionState, Reason};

/// How the agent drives a set of cores (proto `XmanMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XmanMode {
    /// Governor and limits only; the agent does not set frequencies.
    Off,
    /// X-MAN Algorithm 1.
    Load,
    /// X-MAN-FB.
    Feedback,
    /// Userspace governor at `max_khz`.
    PinnedMax,
}

impl XmanMode {
    fn algorithm(self) -> Option<Algorithm> {
        match self {
            XmanMode::Load => Some(Algorithm::Load),
            XmanMode::Feedback => Some(Algorithm::Feedback),
            XmanMode::Off | XmanMode::PinnedMax => None,
        }
    }
}

/// A policy for a set of cores (proto `PowerPolicy`). `min_khz`/`max_khz` of 0 mean "the lowest
/// / highest allowed"; an empty governor means `userspace` for the modes that drive setspeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorePolicy {
    pub cores: Vec<u32>,
    pub governor: String,
    pub min_khz: u32,
    pub max_khz: u32,
    pub mode: XmanMode,
}

/// Result of [`PowerManager::apply_policy`].
#[derive(Debug, Clone, PartialEq)]
pub struct ApplyReport {
    /// What was (or, in a dry run, would be) applied, per hardware policy: cores sharing a
    /// clock with a requested core are included, since the kernel sets them together.
    pub applied: Vec<CorePolicy>,
    /// The settings those cores had before.
    pub previous: Vec<CorePolicy>,
    pub dry_run: bool,
}

/// One frequency switch made by the loop.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Counter-read time (monotonic ns) that led to the switch.
    pub at_ns: u64,
    pub policy: u32,
    pub from_khz: Option<u32>,
    pub to_khz: u32,
    pub reason: Reason,
}

/// State of one core, read back from the kernel (not what was asked).
#[derive(Debug, Clone, PartialEq)]
pub struct CoreState {
    pub core: u32,
    pub policy: u32,
    pub governor: String,
    pub min_khz: u32,
    pub max_khz: u32,
    pub cur_khz: u32,
    pub setspeed_khz: Option<u32>,
    pub mode: XmanMode,
    /// The P-states X-MAN chooses from, highest first.
    pub pstates_khz: Vec<u32>,
    /// Functions on this core that are idle (at f_min, polling at T_m idle).
    pub idle_functions: Vec<u32>,
}

struct PolicyState {
    info: PolicyInfo,
    setting: Option<CorePolicy>,
    /// P-states inside the policy's limits, highest first.
    table: Vec<u32>,
    applied_khz: Option<u32>,
    last_switch_ns: Option<u64>,
    functions: Vec<FunctionState>,
}

/// Told of every frequency switch (the decision, the cores of its policy, their mode); called
/// on the loop's thread, so it must not block (the node micro-loop audit queues it).
pub type SwitchObserver = Box<dyn Fn(&Decision, &[u32], XmanMode) + Send>;

pub struct PowerManager {
    config: PowerConfig,
    observer: Option<SwitchObserver>,
    backend: Cpufreq,
    counters: Box<dyn CounterSource>,
    policies: Vec<PolicyState>,
    core_policy: BTreeMap<u32, usize>,
    decisions: VecDeque<Decision>,
    last_at_ns: u64,
    read_errors: u64,
    last_error: Option<String>,
}

impl PowerManager {
    /// Discover the cpufreq policies under the backend's root and attach the configured
    /// functions to their cores. Touches nothing until a policy is applied.
    pub fn new(
        config: PowerConfig,
        backend: Cpufreq,
        counters: Box<dyn CounterSource>,
    ) -> Result<Self> {
        config.xman.validate().map_err(PowerError::InvalidPolicy)?;
        let infos = backend.policies()?;
        let mut core_policy = BTreeMap::new();
        let mut policies = Vec::new();
        for info in infos {
            for &cpu in &info.cpus {
                core_policy.insert(cpu, policies.len());
            }
            policies.push(PolicyState {
                info,
                setting: None,
                table: Vec::new(),
                applied_khz: None,
                last_switch_ns: None,
                functions: Vec::new(),
            });
        }
        let mut manager = Self {
            config,
            observer: None,
            backend,
            counters,
            policies,
            core_policy,
            decisions: VecDeque::new(),
            last_at_ns: 0,
            read_errors: 0,
            last_error: None,
        };
        for spec in manager.config.functions.clone() {
            if !manager.is_managed(spec.core) {
                return Err(PowerError::InvalidPolicy(format!(
                    "function {} ({}) is on core {}, which has no cpufreq policy or is not managed",
                    spec.index, spec.name, spec.core
                )));
            }
            if !(spec.c_task_cycles.is_finite() && spec.c_task_cycles > 0.0) {
                return Err(PowerError::InvalidPolicy(format!(
                    "function {}: c_task_cycles must be > 0",
                    spec.index
                )));
            }
            let slot = manager.core_policy[&spec.core];
            manager.policies[slot]
                .functions
                .push(FunctionState::new(spec));
        }
        Ok(manager)
    }

    fn is_managed(&self, core: u32) -> bool {
        self.core_policy.contains_key(&core)
            && (self.config.managed_cores.is_empty() || self.config.managed_cores.contains(&core))
    }

    /// Allowed frequency range of a policy: hardware limits narrowed by the configured bounds.
    fn bounds(&self, info: &PolicyInfo) -> (u32, u32) {
        let lo = info.cpuinfo_min_khz.max(self.config.hard_min_khz);
        let hi = match self.config.hard_max_khz {
            0 => info.cpuinfo_max_khz,
            hard => info.cpuinfo_max_khz.min(hard),
        };
        (lo, hi)
    }

    fn pstates(&self, info: &PolicyInfo, min_khz: u32, max_khz: u32) -> Vec<u32> {
        let all: Vec<u32> = if info.available_khz.is_empty() {
            // Drivers without a frequency list accept any value in range: synthesise steps.
            let step = self.config.synthetic_step_khz.max(1);
            let mut v: Vec<u32> = (0..)
                .map(|i: u32| info.cpuinfo_max_khz.saturating_sub(i.saturating_mul(step)))
                .take_while(|&f| f > info.cpuinfo_min_khz)
                .collect();
            v.push(info.cpuinfo_min_khz);
            v
        } else {
            info.available_khz.clone()
        };
        all.into_iter()
            .filter(|&f| f >= min_khz && f <= max_khz)
            .collect()
    }

    /// Check `policy` against the configured bounds and the hardware; return it normalised
    /// (cores expanded to whole hardware policies, governor and limits filled in), one entry
    /// per hardware policy.
    pub fn validate_policy(&self, policy: &CorePolicy) -> Result<Vec<CorePolicy>> {
        let invalid = |msg: String| Err(PowerError::InvalidPolicy(msg));
        if policy.cores.is_empty() {
            return invalid("no cores given".into());
        }
        let mut slots: Vec<usize> = Vec::new();
        for &core in &policy.cores {
            if !self.is_managed(core) {
                return invalid(format!(
                    "core {core} has no cpufreq policy or is not managed"
                ));
            }
            let slot = self.core_policy[&core];
            if !slots.contains(&slot) {
                slots.push(slot);
            }
        }
        let mut out = Vec::new();
        for slot in slots {
            let info = &self.policies[slot].info;
            if let Some(&core) = info.cpus.iter().find(|&&c| !self.is_managed(c)) {
                return invalid(format!(
                    "core {core} shares policy{} with a requested core but is not managed",
                    info.id
                ));
            }
            let governor = match (policy.mode, policy.governor.as_str()) {
                (XmanMode::Off, "") => return invalid("mode off needs a governor".into()),
                (XmanMode::Off, g) => g.to_owned(),
                // The kernel's performance governor holds scaling_max_freq by itself: pinned to
                // the maximum without scaling_setspeed (what the policy engine's planner asks).
                (XmanMode::PinnedMax, "performance") => "performance".to_owned(),
                (_, "" | "userspace") => "userspace".to_owned(),
                (mode, g) => {
                    return invalid(format!("mode {mode:?} drives scaling_setspeed: governor must be \"userspace\", not {g:?}"))
                }
            };
            if !info.available_governors.contains(&governor) {
                return invalid(format!(
                    "governor {governor:?} not available on policy{} (has: {})",
                    info.id,
                    info.available_governors.join(" ")
                ));
            }
            let (lo, hi) = self.bounds(info);
            let min_khz = if policy.min_khz == 0 {
                lo
            } else {
                policy.min_khz
            };
            let max_khz = if policy.max_khz == 0 {
                hi
            } else {
                policy.max_khz
            };
            if min_khz < lo || max_khz > hi || min_khz > max_khz {
                return invalid(format!(
                    "limits {min_khz}..{max_khz} kHz outside the allowed {lo}..{hi} kHz of policy{} or inverted",
                    info.id
                ));
            }
            if policy.mode != XmanMode::Off && self.pstates(info, min_khz, max_khz).is_empty() {
                return invalid(format!(
                    "no P-state of policy{} lies within {min_khz}..{max_khz} kHz",
                    info.id
                ));
            }
            out.push(CorePolicy {
                cores: info.cpus.clone(),
                governor,
                min_khz,
                max_khz,
                mode: policy.mode,
            });
        }
        Ok(out)
    }

    /// Validate and apply `policy`; in a dry run only validate and report.
    pub fn apply_policy(&mut self, policy: &CorePolicy, dry_run: bool) -> Result<ApplyReport> {
        let applied = self.validate_policy(policy)?;
        let mut previous = Vec::new();
        for p in &applied {
            let slot = self.core_policy[&p.cores[0]];
            previous.push(match &self.policies[slot].setting {
                Some(s) => s.clone(),
                None => {
                    let r = self.backend.read_policy(self.policies[slot].info.id)?;
                    CorePolicy {
                        cores: p.cores.clone(),
                        governor: r.governor,
                        min_khz: r.min_khz,
                        max_khz: r.max_khz,
                        mode: XmanMode::Off,
                    }
                }
            });
        }
        if !dry_run {
            for p in &applied {
                self.apply_one(p)?;
            }
        }
        Ok(ApplyReport {
            applied,
            previous,
            dry_run,
        })
    }

    fn apply_one(&mut self, p: &CorePolicy) -> Result<()> {
        let slot = self.core_policy[&p.cores[0]];
        let id = self.policies[slot].info.id;
        let current = self.backend.read_policy(id)?;
        if current.governor != p.governor {
            self.backend.set_governor(id, &p.governor)?;
        }
        self.backend.set_limits(id, p.min_khz, p.max_khz)?;
        let table = self.pstates(&self.policies[slot].info, p.min_khz, p.max_khz);
        let state = &mut self.policies[slot];
        state.setting = Some(p.clone());
        state.table = table;
        state.applied_khz = None;
        state.last_switch_ns = None;
        for f in &mut state.functions {
            f.reset();
        }
        if p.mode != XmanMode::Off && p.governor == "userspace" {
            // f_cpu,0 = f_max (Algorithm 1 line 16); PinnedMax stays there.
            let to = state.table[0];
            self.switch(slot, to, Reason::Policy, self.last_at_ns)?;
        }
        Ok(())
    }

    fn switch(&mut self, slot: usize, to_khz: u32, reason: Reason, at_ns: u64) -> Result<()> {
        let state = &mut self.policies[slot];
        self.backend.set_speed(state.info.id, to_khz)?;
        let decision = Decision {
            at_ns,
            policy: state.info.id,
            from_khz: state.applied_khz,
            to_khz,
            reason,
        };
        state.applied_khz = Some(to_khz);
        state.last_switch_ns = Some(at_ns);
        if let Some(observe) = &self.observer {
            let mode = state.setting.as_ref().map_or(XmanMode::Off, |s| s.mode);
            observe(&decision, &state.info.cpus, mode);
        }
        self.decisions.push_back(decision);
        while self.decisions.len() > self.config.decision_log_len {
            self.decisions.pop_front();
        }
        Ok(())
    }

    /// Reports every later frequency switch to `observer`.
    pub fn observe_switches(&mut self, observer: SwitchObserver) {
        self.observer = Some(observer);
    }

    /// Current policies, one per hardware policy that has one.
    pub fn policies(&self) -> Vec<CorePolicy> {
        self.policies
            .iter()
            .filter_map(|p| p.setting.clone())
            .collect()
    }

    /// Read back the state of `cores` (all managed cores when empty) from the kernel.
    pub fn state(&self, cores: &[u32]) -> Result<Vec<CoreState>> {
        let wanted: Vec<u32> = if cores.is_empty() {
            self.core_policy
                .keys()
                .copied()
                .filter(|&c| self.is_managed(c))
                .collect()
        } else {
            cores.to_vec()
        };
        let mut out = Vec::new();
        for core in wanted {
            if !self.is_managed(core) {
                return Err(PowerError::InvalidPolicy(format!(
                    "core {core} has no cpufreq policy or is not managed"
                )));
            }
            let state = &self.policies[self.core_policy[&core]];
            let reading = self.backend.read_policy(state.info.id)?;
            out.push(CoreState {
                core,
                policy: state.info.id,
                governor: reading.governor,
                min_khz: reading.min_khz,
                max_khz: reading.max_khz,
                cur_khz: reading.cur_khz,
                setspeed_khz: reading.setspeed_khz,
                mode: state.setting.as_ref().map_or(XmanMode::Off, |s| s.mode),
                pstates_khz: state.table.clone(),
                idle_functions: state
                    .functions
                    .iter()
                    .filter(|f| f.spec.core == core && f.idle)
                    .map(|f| f.spec.index)
                    .collect(),
            });
        }
        Ok(out)
    }

    /// Frequency switches made so far (bounded by `decision_log_len`), oldest first.
    pub fn decisions(&self) -> impl Iterator<Item = &Decision> {
        self.decisions.iter()
    }

    /// Counter reads that failed, and the last error of the loop.
    pub fn errors(&self) -> (u64, Option<&str>) {
        (self.read_errors, self.last_error.as_deref())
    }

    /// One iteration of Algorithm 1 for every core under X-MAN: read the counters, update each
    /// function, set the core to the highest frequency its functions want when the dwell
    /// allows. Returns the period until the next read (T_m, or T_m idle when a core sleeps).
    pub fn step(&mut self) -> Result<Duration> {
        let params = self.config.xman.clone();
        let watched: Vec<u32> = self
            .policies
            .iter()
            .filter(|p| {
                p.setting
                    .as_ref()
                    .and_then(|s| s.mode.algorithm())
                    .is_some()
            })
            .flat_map(|p| p.functions.iter().map(|f| f.spec.index))
            .collect();
        if watched.is_empty() {
            return Ok(params.t_m_active);
        }
        let snapshot = match self.counters.read(&watched) {
            Ok(s) => s,
            Err(e) => {
                self.read_errors += 1;
                self.last_error = Some(e.to_string());
                return Err(e);
            }
        };
        self.last_at_ns = snapshot.at_ns;
        let mut any_idle = false;
        for slot in 0..self.policies.len() {
            let Some(algorithm) = self.policies[slot]
                .setting
                .as_ref()
                .and_then(|s| s.mode.algorithm())
            else {
                continue;
            };
            let state = &mut self.policies[slot];
            if state.functions.is_empty() {
                continue;
            }
            let mut woke = false;
            for f in &mut state.functions {
                let Some(counters) = snapshot.functions.get(&f.spec.index) else {
                    continue;
                };
                let event = f.observe(snapshot.at_ns, counters, &state.table, algorithm, &params);
                woke |= event == Some(Reason::Wake);
            }
            // Per-core maximum over functions = lowest index (§4.3.3, last paragraph).
            let Some(leader) = state.functions.iter().min_by_key(|f| f.wanted) else {
                continue;
            };
            let (index, reason) = (leader.wanted, leader.last_reason.unwrap_or(Reason::Policy));
            any_idle |= state.functions.iter().all(|f| f.idle);
            let to_khz = state.table[index.min(state.table.len() - 1)];
            if state.applied_khz == Some(to_khz) {
                continue;
            }
            let dwell_over = state
                .last_switch_ns
                .is_none_or(|t| snapshot.at_ns.saturating_sub(t) >= nanos(params.min_dwell));
            let reason = if woke { Reason::Wake } else { reason };
            if dwell_over || (woke && params.wake_ignores_dwell) {
                if let Err(e) = self.switch(slot, to_khz, reason, snapshot.at_ns) {
                    self.last_error = Some(e.to_string());
                    return Err(e);
                }
            }
        }
        Ok(if any_idle {
            params.t_m_idle
        } else {
            params.t_m_active
        })
    }

    /// Run the loop on its own thread (a timer thread, not a tokio task: tokio's timer has
    /// millisecond granularity and T_m idle is 100 µs).
    pub fn spawn(self) -> std::io::Result<PowerLoop> {
        let shared = Arc::new(Mutex::new(self));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, s) = (shared.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name("xman".into())
            .spawn(move || {
                let mut next = Instant::now();
                while !s.load(Ordering::Relaxed) {
                    let period = match m.lock() {
                        // Errors are kept in the manager (errors()); the loop never dies on them.
                        Ok(mut manager) => manager
                            .step()
                            .unwrap_or_else(|_| manager.config.xman.t_m_active),
                        Err(_) => break,
                    };
                    next += period;
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else {
                        next = now; // overran: do not try to catch up with a burst of reads
                    }
                }
            })?;
        Ok(PowerLoop {
            shared,
            stop,
            handle: Some(handle),
        })
    }
}

/// The running loop; the agent's RPCs reach the manager through [`PowerLoop::manager`].
pub struct PowerLoop {
    shared: Arc<Mutex<PowerManager>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl PowerLoop {
    pub fn manager(&self) -> MutexGuard<'_, PowerManager> {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn is_running(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for PowerLoop {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
