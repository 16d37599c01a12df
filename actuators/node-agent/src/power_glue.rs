//! The power module (src/power, cpufreq + X-MAN) behind SetPowerPolicy/GetPowerState:
//! conversion between proto and module types, and honest errors when the node has no cpufreq
//! or no counters.

use cgloop_proto::v1::{CoreIdleState, CoreSample, GetPowerStateResponse, PowerPolicy, XmanMode as PXmanMode};

use crate::config::PowerSettings;
use crate::error::{AgentError, AgentResult};
use crate::power::{
    self, CorePolicy, Cpufreq, Cpuidle, FunctionSpec, PinnedFnStats, PowerConfig, PowerError, PowerLoop,
    PowerManager, TraceSource, XmanMode,
};

/// A frequency switch the X-MAN loop decided on one core (the node micro-loop audit's
/// SET_CORE_FREQUENCY).
#[derive(Debug, Clone, PartialEq)]
pub struct CoreFrequencyChange {
    pub core: u32,
    /// None: the loop had not set this core before.
    pub from_khz: Option<u32>,
    pub to_khz: u32,
    /// "load", "fb" or "pinned_max".
    pub mode: String,
    /// Why, e.g. "TrendUp" (xman::Reason).
    pub reason: String,
    /// When, ns since the Unix epoch.
    pub at_ns: u64,
}

fn mode_name(m: XmanMode) -> &'static str {
    match m {
        XmanMode::Off => "off",
        XmanMode::Load => "load",
        XmanMode::Feedback => "fb",
        XmanMode::PinnedMax => "pinned_max",
    }
}

pub struct Power {
    running: Result<PowerLoop, String>,
    /// Why X-MAN's load modes cannot run (no pinned counters), if so.
    no_counters: Option<String>,
    /// C-states (`forbid_cstates`) through cpuidle sysfs.
    cpuidle: Cpuidle,
    /// Cores `forbid_cstates` may touch (the power section's `managed_cores`; empty = any).
    managed_cores: Vec<u32>,
    max_cstate_forbidden_cores: Option<u32>,
    /// The trees are not the kernel's (GetPowerStateResponse.emulated).
    emulated: bool,
}

fn map_err(e: PowerError) -> AgentError {
    match e {
        PowerError::InvalidPolicy(m) => AgentError::Invalid(format!("power policy: {m}")),
        PowerError::Map { .. } | PowerError::Trace { .. } => AgentError::Precondition(e.to_string()),
        PowerError::Io { .. } | PowerError::Parse { .. } | PowerError::NotApplied { .. } => {
            AgentError::Kernel(anyhow::Error::new(e))
        }
    }
}

fn to_mode(m: i32) -> AgentResult<XmanMode> {
    Ok(match PXmanMode::try_from(m).unwrap_or(PXmanMode::Unspecified) {
        PXmanMode::Off => XmanMode::Off,
        PXmanMode::Load => XmanMode::Load,
        PXmanMode::Feedback => XmanMode::Feedback,
        PXmanMode::PinnedMax => XmanMode::PinnedMax,
        PXmanMode::Unspecified => {
            return Err(AgentError::Invalid(format!(
                "policy.xman_mode {m} is unspecified or unknown: choose OFF, LOAD, FEEDBACK or PINNED_MAX"
            )))
        }
    })
}

fn from_mode(m: XmanMode) -> PXmanMode {
    match m {
        XmanMode::Off => PXmanMode::Off,
        XmanMode::Load => PXmanMode::Load,
        XmanMode::Feedback => PXmanMode::Feedback,
        XmanMode::PinnedMax => PXmanMode::PinnedMax,
    }
}

fn to_proto(p: &CorePolicy) -> PowerPolicy {
    PowerPolicy {
        cores: p.cores.clone(),
        governor: p.governor.clone(),
        min_frequency_khz: p.min_khz,
        max_frequency_khz: p.max_khz,
        xman_mode: from_mode(p.mode) as i32,
        forbid_cstates: false,
    }
}

/// One proto policy per (cpufreq group × C-state setting): a group whose cores differ in
/// `forbid_cstates` becomes two policies, so a rollback re-sending them restores both.
fn split_by_cstates(p: &CorePolicy, forbidden: &dyn Fn(u32) -> bool) -> Vec<PowerPolicy> {
    let (on, off): (Vec<u32>, Vec<u32>) = p.cores.iter().partition(|&&c| forbidden(c));
    [(on, true), (off, false)]
        .into_iter()
        .filter(|(cores, _)| !cores.is_empty())
        .map(|(cores, forbid)| PowerPolicy { cores, forbid_cstates: forbid, ..to_proto(p) })
        .collect()
}

/// Whether either tree is not the kernel's sysfs: what the agent writes there changes no hardware.
fn is_emulated(settings: &PowerSettings) -> bool {
    settings.cpufreq_root != std::path::Path::new(power::config::DEFAULT_CPUFREQ_ROOT)
        || settings.cpuidle_root != std::path::Path::new(power::config::DEFAULT_CPUIDLE_ROOT)
}

impl Power {
    /// Starts the X-MAN loop over the configured cpufreq tree. A node without cpufreq keeps the
    /// reason, and SetPowerPolicy answers FAILED_PRECONDITION with it.
    pub fn start(settings: &PowerSettings) -> Self {
        let (counters, no_counters): (Box<dyn power::CounterSource>, Option<String>) =
            match PinnedFnStats::open(&settings.fn_stats_pin, Some(settings.if_fn_pin.as_path())) {
                Ok(c) => (Box::new(c), None),
                Err(e) => (
                    Box::new(TraceSource::new(Vec::new())),
                    Some(format!("X-MAN needs the probe's per-function counters: {e}")),
                ),
            };
        let config = PowerConfig {
            cpufreq_root: settings.cpufreq_root.clone(),
            managed_cores: settings.managed_cores.clone(),
            hard_min_khz: settings.hard_min_khz,
            hard_max_khz: settings.hard_max_khz,
            functions: settings
                .functions
                .iter()
                .map(|f| FunctionSpec {
                    index: f.index,
                    name: f.name.clone(),
                    core: f.core,
                    c_task_cycles: f.c_task_cycles.unwrap_or(power::config::DEFAULT_C_TASK_CYCLES),
                })
                .collect(),
            ..PowerConfig::default()
        };
        let backend = Cpufreq::new(settings.cpufreq_root.clone());
        let running = match backend.policies() {
            Ok(p) if p.is_empty() => Err(PowerError::InvalidPolicy("no policyN directories".into())),
            Ok(_) => PowerManager::new(config, backend, counters),
            Err(e) => Err(e),
        }
            .map_err(|e| {
                format!(
                    "no usable cpufreq under {} ({e}); this node cannot set P-states",
                    settings.cpufreq_root.display()
                )
            })
            .and_then(|m| m.spawn().map_err(|e| format!("starting the X-MAN thread: {e}")));
        Self {
            running,
            no_counters,
            cpuidle: Cpuidle::new(settings.cpuidle_root.clone()),
            managed_cores: settings.managed_cores.clone(),
            max_cstate_forbidden_cores: settings.max_cstate_forbidden_cores,
            emulated: is_emulated(settings),
        }
    }

    /// Calls `f` for every core of every frequency switch X-MAN decides from then on (not the
    /// switches a SetPowerPolicy makes: those are the caller's actions). `f` must not block.
    pub fn on_frequency_change(&self, f: impl Fn(CoreFrequencyChange) + Send + 'static) {
        let Ok(running) = &self.running else { return };
        running.manager().observe_switches(Box::new(move |d, cores, mode| {
            if d.reason == power::Reason::Policy {
                return;
            }
            let at_ns = cgloop_proto::host::now_ns();
            for &core in cores {
                f(CoreFrequencyChange {
                    core,
                    from_khz: d.from_khz,
                    to_khz: d.to_khz,
                    mode: mode_name(mode).to_string(),
                    reason: format!("{:?}", d.reason),
                    at_ns,
                });
            }
        }));
    }

    /// Checks a `forbid_cstates` change against the bounds; returns the cores to write.
    fn check_cstates(&self, cores: &[u32], forbid: bool) -> AgentResult<Vec<u32>> {
        if !forbid {
            return Ok(cores.iter().copied().filter(|&c| self.cpuidle.forbidden_by_us(c)).collect());
        }
        let available = self.cpuidle.cores().map_err(|e| {
            AgentError::Precondition(format!(
                "policy.forbid_cstates: no cpuidle under {} ({e})",
                self.cpuidle.root().display()
            ))
        })?;
        for &c in cores {
            if !self.managed_cores.is_empty() && !self.managed_cores.contains(&c) {
                return Err(AgentError::Forbidden(format!(
                    "policy.forbid_cstates: core {c} is not in [power] managed_cores {:?}",
                    self.managed_cores
                )));
            }
            if !available.contains(&c) {
                return Err(AgentError::NotFound(format!(
                    "policy.forbid_cstates: core {c} has no {}/cpu{c}/cpuidle",
                    self.cpuidle.root().display()
                )));
            }
        }
        let max = self
            .max_cstate_forbidden_cores
            .unwrap_or_else(|| (available.len() as u32).saturating_sub(1).max(1));
        let mut after: Vec<u32> = available.iter().copied().filter(|&c| self.cpuidle.forbidden_by_us(c)).collect();
        after.extend_from_slice(cores);
        after.sort_unstable();
        after.dedup();
        if after.len() as u32 > max {
            return Err(AgentError::OutOfBounds(format!(
                "policy.forbid_cstates: cores {after:?} would be kept out of C-states, more than \
                 max_cstate_forbidden_cores = {max}"
            )));
        }
        Ok(cores.to_vec())
    }

    /// Re-applies a journalled policy at start. Cores the journal kept out of C-states are
    /// adopted first: allowing them later enables their states again (the values before the
    /// first forbid were not journalled).
    pub fn restore(&mut self, p: &PowerPolicy) -> AgentResult<(PowerPolicy, Vec<PowerPolicy>)> {
        if p.forbid_cstates {
            for &c in &p.cores {
                if self.cpuidle.forbidden(c).unwrap_or(false) {
                    self.cpuidle.adopt(c).map_err(map_err)?;
                }
            }
        }
        self.apply(p, false)
    }

    fn running(&self) -> AgentResult<&PowerLoop> {
        self.running.as_ref().map_err(|why| AgentError::Precondition(why.clone()))
    }

    pub fn apply(&mut self, p: &PowerPolicy, dry: bool) -> AgentResult<(PowerPolicy, Vec<PowerPolicy>)> {
        let mode = to_mode(p.xman_mode)?;
        if p.cores.is_empty() {
            return Err(AgentError::Invalid("policy.cores is empty".into()));
        }
        self.running()?;
        if matches!(mode, XmanMode::Load | XmanMode::Feedback) {
            if let Some(why) = &self.no_counters {
                return Err(AgentError::Precondition(why.clone()));
            }
        }
        let writes = self.check_cstates(&p.cores, p.forbid_cstates)?;
        let was: Vec<(u32, bool)> = p.cores.iter().map(|&c| (c, self.cpuidle.forbidden_by_us(c))).collect();
        // C-states first: they can be undone exactly if the cpufreq change then fails.
        let mut done = Vec::new();
        if !dry {
            for &c in &writes {
                if let Err(e) = self.cpuidle.set(c, p.forbid_cstates) {
                    for &d in &done {
                        let _ = self.cpuidle.set(d, !p.forbid_cstates);
                    }
                    return Err(map_err(e));
                }
                done.push(c);
            }
        }
        let policy = CorePolicy {
            cores: p.cores.clone(),
            governor: p.governor.clone(),
            min_khz: p.min_frequency_khz,
            max_khz: p.max_frequency_khz,
            mode,
        };
        let result = self.running()?.manager().apply_policy(&policy, dry);
        let report = match result {
            Ok(r) => r,
            Err(e) => {
                for &d in &done {
                    let _ = self.cpuidle.set(d, !p.forbid_cstates);
                }
                return Err(map_err(e));
            }
        };
        let mut applied = report.applied.first().map(to_proto).unwrap_or_else(|| p.clone());
        applied.cores = report.applied.iter().flat_map(|a| a.cores.iter().copied()).collect();
        applied.cores.sort_unstable();
        applied.cores.dedup();
        applied.forbid_cstates = p.forbid_cstates;
        let before = |c: u32| was.iter().any(|&(k, f)| k == c && f);
        let previous = report.previous.iter().flat_map(|q| split_by_cstates(q, &before)).collect();
        Ok((applied, previous))
    }

    /// Module policies as proto, split by this agent's C-state setting.
    fn split(&self, policies: &[CorePolicy]) -> Vec<PowerPolicy> {
        let ours = |c: u32| self.cpuidle.forbidden_by_us(c);
        policies.iter().flat_map(|q| split_by_cstates(q, &ours)).collect()
    }

    pub fn policies(&self) -> Vec<PowerPolicy> {
        match &self.running {
            Ok(r) => self.split(&r.manager().policies()),
            Err(_) => Vec::new(),
        }
    }

    pub fn state(&self, cores: &[u32]) -> AgentResult<GetPowerStateResponse> {
        let running = self.running()?;
        let manager = running.manager();
        let states = manager.state(cores).map_err(map_err)?;
        Ok(GetPowerStateResponse {
            cores: states
                .iter()
                .map(|s| CoreSample {
                    core: s.core,
                    frequency_khz: s.cur_khz,
                    min_frequency_khz: s.min_khz,
                    max_frequency_khz: s.max_khz,
                    governor: s.governor.clone(),
                    utilization: 0.0,
                })
                .collect(),
            // Read back from the kernel, not from memory; a core without cpuidle is left out.
            idle: states
                .iter()
                .filter_map(|s| {
                    let idle = self.cpuidle.states(s.core).ok()?;
                    Some(CoreIdleState {
                        core: s.core,
                        cstates_forbidden: self.cpuidle.forbidden(s.core).unwrap_or(false),
                        enabled_idle_states: idle.iter().filter(|i| !i.disabled).map(|i| i.name.clone()).collect(),
                    })
                })
                .collect(),
            policies: self.split(&manager.policies()),
            power_watts: None,
            emulated: self.emulated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_other_than_the_kernels_is_reported_emulated() {
        let kernel = PowerSettings::default();
        assert!(!is_emulated(&kernel));
        let lab = PowerSettings { cpufreq_root: "/tmp/lab/cpufreq".into(), ..PowerSettings::default() };
        assert!(is_emulated(&lab));
        let idle_only = PowerSettings { cpuidle_root: "/tmp/lab/cpu".into(), ..PowerSettings::default() };
        assert!(is_emulated(&idle_only));
    }
}
