//! cgloop's node agent: the loop's hand on one node (queues, P-states, chains, probes).
//!
//! Modules are named after what they do; `power` is the cpufreq backend and the X-MAN micro loop.
//! Public: what the binary (src/main.rs) wires together and the types its API carries (error),
//! plus five modules whose test-only constructors and accessors (Guard::with_cpus,
//! GroupCommit::durable, power's readers …) would read as dead code from a private module.
//! Private: the datapath and its helpers, reached only through `agent`.
pub mod agent;
pub mod audit;
pub mod config;
pub mod cpu_acct;
pub mod error;
pub mod export;
pub mod guard;
pub mod int_export;
pub mod metrics;
pub mod nodes;
pub mod power_glue;
pub mod probes;
pub mod reflect;
pub mod service;
pub mod tls;

pub mod advanced;
pub mod afxdp;
pub mod bounds;
pub mod journal;
pub mod power;
pub mod qmon;
pub mod qprot;
pub mod queue_view;

mod chains;
mod datapath;
mod netif;
mod payload;
mod queues;
mod tc;

#[cfg(test)]
mod classify_tests;
