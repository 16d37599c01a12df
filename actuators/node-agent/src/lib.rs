//! cgloop's node agent: the loop's hand on one node (queues, P-states, chains, probes).
//!
//! Modules are named after what they do; `power` is the cpufreq backend and the X-MAN micro loop.
pub mod power;

pub mod advanced;
pub mod afxdp;
pub mod agent;
pub mod bounds;
pub mod chains;
pub mod config;
pub mod datapath;
pub mod error;
pub mod export;
pub mod journal;
pub mod nodes;
pub mod payload;
pub mod power_glue;
pub mod probes;
pub mod queues;
pub mod reflect;
pub mod service;
pub mod tc;
pub mod tls;

#[cfg(test)]
mod classify_tests;
