//! cgloop's node agent: the loop's hand on one node (queues, P-states, chains, probes).
//!
//! Modules are named after what they do; `power` is the cpufreq backend and the X-MAN micro loop.
pub mod power;
