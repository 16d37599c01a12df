//! The power module (src/power, cpufreq + X-MAN) behind SetPowerPolicy/GetPowerState:
//! conversion between proto and module types, and honest errors when the node has no cpufreq
//! or no counters.

use cgloop_proto::v1::{CoreSample, GetPowerStateResponse, PowerPolicy, XmanMode as PXmanMode};

use crate::config::PowerSettings;
use crate::error::{AgentError, AgentResult};
use crate::power::{
    self, CorePolicy, Cpufreq, FunctionSpec, PinnedFnStats, PowerConfig, PowerError, PowerLoop,
    PowerManager, TraceSource, XmanMode,
};

pub struct Power {
    running: Result<PowerLoop, String>,
    /// Why X-MAN's load modes cannot run (no pinned counters), if so.
    no_counters: Option<String>,
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
        Self { running, no_counters }
    }

    fn running(&self) -> AgentResult<&PowerLoop> {
        self.running.as_ref().map_err(|why| AgentError::Precondition(why.clone()))
    }

    pub fn apply(&mut self, p: &PowerPolicy, dry: bool) -> AgentResult<(PowerPolicy, Vec<PowerPolicy>)> {
        let mode = to_mode(p.xman_mode)?;
        if p.cores.is_empty() {
            return Err(AgentError::Invalid("policy.cores is empty".into()));
        }
        if p.forbid_cstates {
            return Err(AgentError::Unimplemented(
                "policy.forbid_cstates: the agent does not manage cpuidle states yet".into(),
            ));
        }
        let running = self.running()?;
        if matches!(mode, XmanMode::Load | XmanMode::Feedback) {
            if let Some(why) = &self.no_counters {
                return Err(AgentError::Precondition(why.clone()));
            }
        }
        let policy = CorePolicy {
            cores: p.cores.clone(),
            governor: p.governor.clone(),
            min_khz: p.min_frequency_khz,
            max_khz: p.max_frequency_khz,
            mode,
        };
        let report = running.manager().apply_policy(&policy, dry).map_err(map_err)?;
        let mut applied = report.applied.first().map(to_proto).unwrap_or_else(|| p.clone());
        applied.cores = report.applied.iter().flat_map(|a| a.cores.iter().copied()).collect();
        applied.cores.sort_unstable();
        applied.cores.dedup();
        Ok((applied, report.previous.iter().map(to_proto).collect()))
    }

    pub fn policies(&self) -> Vec<PowerPolicy> {
        match &self.running {
            Ok(r) => r.manager().policies().iter().map(to_proto).collect(),
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
            policies: manager.policies().iter().map(to_proto).collect(),
            power_watts: None,
        })
    }
}
