//! X-MAN's per-function decision logic (Xiang thesis §4.3.3
//! Algorithm 1 and §4.3.4 X-MAN-FB; docs/sources.md). Pure: it sees counters and a P-state table and
//! says which P-state the function wants; the manager takes the maximum frequency over the
//! functions of a core and enforces the dwell.
//!
//! Choices where the thesis is silent or ambiguous (all documented in docs/power.md):
//! - Algorithm 1 line 22 tests `p_i == 0` on the cumulative counter; we test the difference
//!   `p_i − p_{i−1} == 0`, which is what the text means ("polling rounds with zero received
//!   packets", line 6).
//! - The window holds the demand in kHz (Δp·c_task/Δt, the numerator of Eq. 4.3), not ρ: ρ
//!   depends on the frequency, and keeping demand makes the window valid across switches. ρ is
//!   demand divided by the function's own P-state frequency.
//! - Only reads with packets enter the window (update_traffic_trend is on the non-empty branch,
//!   line 35); the window starts over at idle and at wake-up.
//! - An up hint needs WMA ≥ SMA (rising or steady), a down hint WMA ≤ SMA ("compared to each
//!   other to see if the traffic is currently following a trend", §4.3.3).
//! - get_target_freq (line 38): demand_WMA / target_rho, rounded up to the next P-state
//!   ("the P-state with the higher frequency is selected", §4.3.3).
use std::collections::VecDeque;

use super::config::{FunctionSpec, XmanParams};
use super::counters::FnCounters;

/// Why a function's wanted P-state changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No packets for n_z,max reads → f_min (Algorithm 1 lines 23–27).
    Idle,
    /// First packet after idle → f_max (lines 31–33).
    Wake,
    /// Up counter passed the threshold (lines 35–39).
    TrendUp,
    /// Down counter passed the threshold.
    TrendDown,
    /// X-MAN-FB: no loss in the last interval → index + 1 (slower).
    FeedbackProbe,
    /// X-MAN-FB: loss → index halved (faster).
    FeedbackLoss,
    /// A new policy was applied (f_cpu,0 = f_max, line 16, or pinned maximum).
    Policy,
}

/// Which of the two algorithms drives the function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Load,
    Feedback,
}

#[derive(Debug, Clone, Copy)]
struct Mark {
    at_ns: u64,
    rx: u64,
    tx: u64,
}

/// X-MAN state of one function (the variables of Algorithm 1 lines 4–11).
#[derive(Debug, Clone)]
pub struct FunctionState {
    pub spec: FunctionSpec,
    /// Index into the core's P-state table (0 = highest frequency) the function wants.
    pub wanted: usize,
    /// The core dropped this function to f_min for idleness (`freq_is_min`).
    pub idle: bool,
    pub last_reason: Option<Reason>,
    /// Last ρ_WMA at the function's own P-state, for state reports.
    pub rho_wma: Option<f64>,
    prev: Option<Mark>,
    fb_mark: Option<Mark>,
    n_z: u32,
    n_u: u32,
    n_d: u32,
    window: VecDeque<f64>,
}

impl FunctionState {
    pub fn new(spec: FunctionSpec) -> Self {
        Self {
            spec,
            wanted: 0,
            idle: false,
            last_reason: None,
            rho_wma: None,
            prev: None,
            fb_mark: None,
            n_z: 0,
            n_u: 0,
            n_d: 0,
            window: VecDeque::new(),
        }
    }

    /// Algorithm 1 lines 13–16: counters zero, f_cpu = f_max.
    pub fn reset(&mut self) {
        *self = Self::new(self.spec.clone());
    }

    /// Feed one read. `table` is the core's P-states in kHz, highest first. Returns the reason
    /// when the wanted P-state changed.
    pub fn observe(
        &mut self,
        at_ns: u64,
        counters: &FnCounters,
        table: &[u32],
        algorithm: Algorithm,
        params: &XmanParams,
    ) -> Option<Reason> {
        let now = Mark {
            at_ns,
            rx: counters.rx_packets,
            tx: counters.tx_packets,
        };
        let Some(prev) = self.prev else {
            self.prev = Some(now);
            return None;
        };
        if now.rx < prev.rx || now.tx < prev.tx || now.at_ns <= prev.at_ns {
            // Counters restarted (probe reloaded) or a stale read: take a new baseline.
            self.prev = Some(now);
            self.fb_mark = None;
            return None;
        }
        let packets = now.rx - prev.rx;
        if self.idle {
            // Every read is checked while idle (T_m = 100 µs, §4.3.3 feature (ii)).
            self.prev = Some(now);
            if packets == 0 {
                return None;
            }
            self.start_over();
            self.fb_mark = Some(now);
            return self.want(0, Reason::Wake);
        }
        // Active functions keep the thesis' sample period T_m even when the loop polls faster
        // for another core's idleness.
        let elapsed = now.at_ns - prev.at_ns;
        if elapsed + half(params.t_m_idle) < nanos(params.t_m_active) {
            return None;
        }
        self.prev = Some(now);
        if packets == 0 {
            self.n_z += 1;
            if self.n_z >= params.n_z_max {
                self.start_over();
                self.idle = true;
                return self.want(table.len().saturating_sub(1), Reason::Idle);
            }
            return None;
        }
        self.n_z = 0;
        match algorithm {
            Algorithm::Load => self.load_step(packets, elapsed, table, params),
            Algorithm::Feedback => self.feedback_step(now, table, params),
        }
    }

    /// Lines 21 and 35–39: ρ, trend counters, scale decision.
    fn load_step(
        &mut self,
        packets: u64,
        elapsed_ns: u64,
        table: &[u32],
        params: &XmanParams,
    ) -> Option<Reason> {
        // Eq. 4.3 numerator / t: cycles per second, in kHz like the table.
        let demand_khz = packets as f64 * self.spec.c_task_cycles * 1e6 / elapsed_ns as f64;
        self.window.push_back(demand_khz);
        while self.window.len() > params.sma_samples {
            self.window.pop_front();
        }
        if self.window.len() < params.wma_samples {
            return None;
        }
        let sma = self.window.iter().sum::<f64>() / self.window.len() as f64;
        // Linear weights 1..=n, the newest sample weighing most.
        let recent = self
            .window
            .iter()
            .skip(self.window.len() - params.wma_samples);
        let (mut num, mut den) = (0.0, 0.0);
        for (i, d) in recent.enumerate() {
            let w = (i + 1) as f64;
            num += w * d;
            den += w;
        }
        let wma = num / den;
        let f_khz = f64::from(*table.get(self.wanted)?);
        let rho_wma = wma / f_khz;
        self.rho_wma = Some(rho_wma);
        // update_traffic_trend: one counter grows, the other is zeroed (§4.3.3).
        if rho_wma > params.rho_up && wma >= sma {
            self.n_u += params.up_increment;
            self.n_d = 0;
        } else if rho_wma < params.rho_down && wma <= sma {
            self.n_d += params.down_increment;
            self.n_u = 0;
        }
        // get_scale_decision / get_target_freq.
        let direction = if self.n_u > params.counter_threshold {
            Reason::TrendUp
        } else if self.n_d > params.counter_threshold {
            Reason::TrendDown
        } else {
            return None;
        };
        self.n_u = 0;
        self.n_d = 0;
        let index = round_up_index(table, wma / params.target_rho);
        self.want(index, direction)
    }

    /// §4.3.4: AIMD on the P-state index from ingress vs egress counts, once per interval.
    fn feedback_step(&mut self, now: Mark, table: &[u32], params: &XmanParams) -> Option<Reason> {
        let Some(mark) = self.fb_mark else {
            self.fb_mark = Some(now);
            return None;
        };
        if now.at_ns - mark.at_ns < nanos(params.fb_interval) {
            return None;
        }
        self.fb_mark = Some(now);
        let ingress = now.rx - mark.rx;
        let egress = now.tx.saturating_sub(mark.tx);
        let loss = ingress.saturating_sub(egress);
        if loss > params.fb_loss_tolerance {
            self.want(self.wanted / 2, Reason::FeedbackLoss)
        } else {
            let last = table.len().saturating_sub(1);
            self.want((self.wanted + 1).min(last), Reason::FeedbackProbe)
        }
    }

    fn start_over(&mut self) {
        self.idle = false;
        self.n_z = 0;
        self.n_u = 0;
        self.n_d = 0;
        self.window.clear();
        self.rho_wma = None;
    }

    fn want(&mut self, index: usize, reason: Reason) -> Option<Reason> {
        if index == self.wanted {
            return None;
        }
        self.wanted = index;
        self.last_reason = Some(reason);
        Some(reason)
    }
}

/// Index of the lowest P-state whose frequency is ≥ `khz` (table highest first); 0 when even
/// the highest is too slow.
pub fn round_up_index(table: &[u32], khz: f64) -> usize {
    table
        .iter()
        .rposition(|&f| f64::from(f) >= khz)
        .unwrap_or(0)
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn half(d: std::time::Duration) -> u64 {
    nanos(d) / 2
}
