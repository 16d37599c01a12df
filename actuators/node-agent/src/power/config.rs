//! Configuration of the power module. Every X-MAN parameter is a named default here, with the
//! place in the Xiang thesis (ch. 4) it comes from, or, where the
//! thesis gives no value, why we chose ours (a named, documented default).
use std::path::PathBuf;
use std::time::Duration;

/// Where the kernel exposes cpufreq policies (`policyN/` directories).
pub const DEFAULT_CPUFREQ_ROOT: &str = "/sys/devices/system/cpu/cpufreq";
/// Where the kernel exposes cpuidle (`cpuN/cpuidle/stateK/`), used by `forbid_cstates`.
pub const DEFAULT_CPUIDLE_ROOT: &str = "/sys/devices/system/cpu";
/// The probe's pinned per-function counters (telemetry/bpf/include/cgloop_fn_stats.h).
pub const DEFAULT_FN_STATS_PIN: &str = "/sys/fs/bpf/cgloop/fn_stats";
/// The probe's pinned ifindex → function index map (same header).
pub const DEFAULT_IF_FN_PIN: &str = "/sys/fs/bpf/cgloop/if_fn";

/// T_m: map read period while traffic flows. Thesis §4.3.3, "T_m = 1 ms" (Algorithm 1 line 2).
pub const T_M_ACTIVE: Duration = Duration::from_millis(1);
/// Map read period once a core dropped to f_min for idleness. Thesis §4.3.3 feature (ii):
/// "the map read interval is automatically shortened to T_m = 100 µs".
pub const T_M_IDLE: Duration = Duration::from_micros(100);
/// n_s: samples of the SMA. Thesis §4.3.3, "n_s … is set to 50" (Algorithm 1 line 15).
pub const SMA_SAMPLES: usize = 50;
/// Samples of the WMA: "only half of the most recent samples, namely n_s/2" (§4.3.3).
pub const WMA_SAMPLES: usize = SMA_SAMPLES / 2;
/// ρ_up: "Two thresholds ρ_up and ρ_down are configured to 75% and 65%" (§4.3.3).
pub const RHO_UP: f64 = 0.75;
/// ρ_down, same place.
pub const RHO_DOWN: f64 = 0.65;
/// "In an up-trend, the up counter is increased by 3" (§4.3.3).
pub const UP_INCREMENT: u32 = 3;
/// "… and in a down-trend, the down counter is increased by 2" (§4.3.3).
pub const DOWN_INCREMENT: u32 = 2;
/// Minimum dwell between two P-state switches of one cpufreq policy: the Tic-Toc test (§4.5.1,
/// Fig. 4.6) shows effective frequency collapsing for switching periods below about 30 ms.
pub const MIN_DWELL: Duration = Duration::from_millis(30);
/// Counter threshold of get_scale_decision. The thesis gives no number, only the rule "it should
/// not be possible for the counter to exceed the threshold earlier than the transition time has
/// elapsed" (§4.3.3): with +3 per 1 ms read, 3 · (30 ms / 1 ms) = 90 cannot be exceeded sooner.
pub const COUNTER_THRESHOLD: u32 = UP_INCREMENT * 30;
/// n_z,max: consecutive empty reads before f_min (Algorithm 1 line 24). The thesis gives no
/// value. 30 reads = 30 ms at T_m, longer than the 16.7 ms between frames of a 60 fps game
/// stream, so a steady stream never looks idle, and equal to the dwell.
pub const N_Z_MAX: u32 = 30;
/// Target utilisation of get_target_freq (Algorithm 1 line 38), which the thesis does not spell
/// out: the middle of the 65–75 % band, so a new P-state lands inside the hysteresis band.
pub const TARGET_RHO: f64 = 0.70;
/// c_task: CPU cycles per packet of a function (Algorithm 1 line 1), "determined from the data
/// sheet … or via direct benchmarking" (§4.3.3). Our default is a placeholder for an XDP-speed
/// forwarding function; set the measured value per function.
pub const DEFAULT_C_TASK_CYCLES: f64 = 2000.0;
/// X-MAN-FB decides once per interval (§4.3.4 "at each iteration"); one decision is one switch,
/// so the interval is the dwell.
pub const FB_INTERVAL: Duration = MIN_DWELL;
/// Packets of ingress − egress difference tolerated as "no loss" (§4.3.4 says "any loss").
pub const FB_LOSS_TOLERANCE: u64 = 0;
/// Wake-up at the first packet after idle ignores the dwell: the thesis raises the frequency
/// "immediately … to avoid any loss of packets or increase in latency" (§4.3.3 feature (ii)).
pub const WAKE_IGNORES_DWELL: bool = true;
/// Step of the synthetic P-state table for drivers without `scaling_available_frequencies`
/// (intel_pstate, cppc): 100 MHz, the usual ratio step.
pub const SYNTHETIC_STEP_KHZ: u32 = 100_000;
/// Decisions kept in memory for `state()` and debugging.
pub const DECISION_LOG_LEN: usize = 1024;

/// Parameters of the X-MAN micro loop (Xiang thesis ch. 4).
#[derive(Debug, Clone, PartialEq)]
pub struct XmanParams {
    pub t_m_active: Duration,
    pub t_m_idle: Duration,
    pub sma_samples: usize,
    pub wma_samples: usize,
    pub rho_up: f64,
    pub rho_down: f64,
    pub up_increment: u32,
    pub down_increment: u32,
    pub counter_threshold: u32,
    pub n_z_max: u32,
    pub target_rho: f64,
    pub min_dwell: Duration,
    pub wake_ignores_dwell: bool,
    pub fb_interval: Duration,
    pub fb_loss_tolerance: u64,
}

impl Default for XmanParams {
    fn default() -> Self {
        Self {
            t_m_active: T_M_ACTIVE,
            t_m_idle: T_M_IDLE,
            sma_samples: SMA_SAMPLES,
            wma_samples: WMA_SAMPLES,
            rho_up: RHO_UP,
            rho_down: RHO_DOWN,
            up_increment: UP_INCREMENT,
            down_increment: DOWN_INCREMENT,
            counter_threshold: COUNTER_THRESHOLD,
            n_z_max: N_Z_MAX,
            target_rho: TARGET_RHO,
            min_dwell: MIN_DWELL,
            wake_ignores_dwell: WAKE_IGNORES_DWELL,
            fb_interval: FB_INTERVAL,
            fb_loss_tolerance: FB_LOSS_TOLERANCE,
        }
    }
}

impl XmanParams {
    /// Reject parameter sets the algorithm cannot work with.
    pub fn validate(&self) -> Result<(), String> {
        if self.t_m_idle.is_zero() || self.t_m_active < self.t_m_idle {
            return Err("t_m_idle must be > 0 and ≤ t_m_active".into());
        }
        if self.wma_samples == 0 || self.wma_samples > self.sma_samples {
            return Err("wma_samples must be in 1..=sma_samples".into());
        }
        let in_unit = |x: f64| x > 0.0 && x <= 1.0;
        if !(in_unit(self.rho_down) && in_unit(self.rho_up) && self.rho_down < self.rho_up) {
            return Err("need 0 < rho_down < rho_up ≤ 1".into());
        }
        if !in_unit(self.target_rho) {
            return Err("target_rho must be in (0, 1]".into());
        }
        if self.n_z_max == 0 {
            return Err("n_z_max must be ≥ 1".into());
        }
        Ok(())
    }
}

/// A network function watched by X-MAN: its index in the fn_stats map and the core it runs on.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionSpec {
    /// Index in `fn_stats` (the probe's `if_fn` maps interfaces to it; 0 is "unassigned").
    pub index: u32,
    pub name: String,
    /// Logical CPU the function's packet processing is pinned to.
    pub core: u32,
    /// c_task, see [`DEFAULT_C_TASK_CYCLES`].
    pub c_task_cycles: f64,
}

/// Everything the power module needs; `Default` is the production layout with no functions.
#[derive(Debug, Clone, PartialEq)]
pub struct PowerConfig {
    pub cpufreq_root: PathBuf,
    /// Cores the agent may touch; empty means every core with a cpufreq policy.
    pub managed_cores: Vec<u32>,
    /// Hard lower bound on any frequency the agent sets (kHz); 0 means the hardware minimum.
    pub hard_min_khz: u32,
    /// Hard upper bound (kHz); 0 means the hardware maximum.
    pub hard_max_khz: u32,
    pub functions: Vec<FunctionSpec>,
    pub xman: XmanParams,
    pub synthetic_step_khz: u32,
    pub decision_log_len: usize,
}

impl Default for PowerConfig {
    fn default() -> Self {
        Self {
            cpufreq_root: PathBuf::from(DEFAULT_CPUFREQ_ROOT),
            managed_cores: Vec::new(),
            hard_min_khz: 0,
            hard_max_khz: 0,
            functions: Vec::new(),
            xman: XmanParams::default(),
            synthetic_step_khz: SYNTHETIC_STEP_KHZ,
            decision_log_len: DECISION_LOG_LEN,
        }
    }
}
