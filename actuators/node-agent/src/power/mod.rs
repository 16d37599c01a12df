//! CPU P-states: the cpufreq sysfs backend and the X-MAN power manager (Xiang thesis
//! ch. 4; docs/sources.md). docs/power.md explains the design and defaults.
//!
//! ```text
//! probe (XDP/tc) ──pinned fn_stats──▶ CounterSource ──▶ PowerManager::step (every T_m)
//!                                                          │ per function: xman::FunctionState
//!                                                          ▼ per core: max over functions, dwell
//!                                     Cpufreq (sysfs) ◀── scaling_setspeed
//! ```
//!
//! Use: `PowerManager::new(config, Cpufreq::new(root), Box::new(PinnedFnStats::open(..)?))`,
//! `apply_policy(&CorePolicy { .. }, dry_run)`, `state(&cores)`, then `spawn()` for the loop.
pub mod config;
pub mod counters;
pub mod cpufreq;
pub mod cpuidle;
pub mod error;
pub mod manager;
pub mod xman;

pub use config::{FunctionSpec, PowerConfig, XmanParams};
pub use counters::{CounterSnapshot, CounterSource, FnCounters, PinnedFnStats, TraceSource};
pub use cpufreq::{Cpufreq, PolicyInfo, PolicyReading, SysfsWrite};
pub use cpuidle::{Cpuidle, IdleState};
pub use error::PowerError;
pub use manager::{
    ApplyReport, CorePolicy, CoreState, Decision, PowerLoop, PowerManager, SwitchObserver, XmanMode,
};
pub use xman::Reason;

#[cfg(test)]
mod tests;
