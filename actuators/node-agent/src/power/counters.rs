//! Per-function packet counters, read from the probe's pinned maps or replayed from a trace.
//!
//! Contract: telemetry/bpf/include/cgloop_fn_stats.h (ABI 1). `fn_stats` is a PERCPU_ARRAY keyed
//! by function index whose value is six `__u64` (rx/tx packets and bytes, rx/tx last ns); the
//! reader sums counters over CPUs and takes the maximum of the timestamps. `if_fn` (HASH,
//! ifindex → function index) says which interfaces serve a function.
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Instant;

use libbpf_rs::{MapCore as _, MapFlags, MapHandle, MapType};

use super::error::{PowerError, Result};

/// `CGLOOP_MAX_FUNCTIONS` of the header.
pub const MAX_FUNCTIONS: u32 = 64;
/// `sizeof(struct cgloop_fn_stats)` for `CGLOOP_FN_STATS_ABI 1`.
pub const FN_STATS_VALUE_SIZE: u32 = 6 * 8;

/// One function's counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FnCounters {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_last_ns: u64,
    pub tx_last_ns: u64,
}

impl FnCounters {
    /// Decode one CPU's value (native endian, as the kernel stores it).
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let word = |i: usize| -> Option<u64> {
            Some(u64::from_ne_bytes(
                bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        Some(Self {
            rx_packets: word(0)?,
            rx_bytes: word(1)?,
            tx_packets: word(2)?,
            tx_bytes: word(3)?,
            rx_last_ns: word(4)?,
            tx_last_ns: word(5)?,
        })
    }

    fn merge_cpu(&mut self, cpu: &FnCounters) {
        self.rx_packets = self.rx_packets.wrapping_add(cpu.rx_packets);
        self.rx_bytes = self.rx_bytes.wrapping_add(cpu.rx_bytes);
        self.tx_packets = self.tx_packets.wrapping_add(cpu.tx_packets);
        self.tx_bytes = self.tx_bytes.wrapping_add(cpu.tx_bytes);
        self.rx_last_ns = self.rx_last_ns.max(cpu.rx_last_ns);
        self.tx_last_ns = self.tx_last_ns.max(cpu.tx_last_ns);
    }
}

/// One read of the counters of the watched functions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CounterSnapshot {
    /// Monotonic time of the read in ns (Δt of Algorithm 1 line 21 is between two reads).
    pub at_ns: u64,
    /// Function index → counters.
    pub functions: BTreeMap<u32, FnCounters>,
}

/// Where the power manager gets its counters: the pinned maps in production, a trace in tests.
pub trait CounterSource: Send {
    /// Read the counters of `functions` (indices in `fn_stats`).
    fn read(&mut self, functions: &[u32]) -> Result<CounterSnapshot>;
}

/// The probe's pinned `fn_stats` (and optionally `if_fn`), opened read-only.
pub struct PinnedFnStats {
    path: PathBuf,
    stats: MapHandle,
    if_fn: Option<MapHandle>,
    epoch: Instant,
}

impl PinnedFnStats {
    /// Open `fn_stats` at `stats_path` and check it has the layout of ABI 1.
    pub fn open(stats_path: impl AsRef<Path>, if_fn_path: Option<&Path>) -> Result<Self> {
        let path = stats_path.as_ref().to_owned();
        let map_err = |path: &Path, reason: String| PowerError::Map {
            path: path.to_owned(),
            reason,
        };
        let stats =
            MapHandle::from_pinned_path_with_file_flags(&path, libbpf_rs::libbpf_sys::BPF_F_RDONLY)
                .map_err(|e| map_err(&path, format!("cannot open pinned map: {e}")))?;
        if stats.map_type() != MapType::PercpuArray {
            return Err(map_err(
                &path,
                format!("is a {:?}, expected PercpuArray", stats.map_type()),
            ));
        }
        if stats.key_size() != 4 || stats.value_size() != FN_STATS_VALUE_SIZE {
            return Err(map_err(
                &path,
                format!(
                    "key/value size {}/{} bytes, expected 4/{} (cgloop_fn_stats ABI 1)",
                    stats.key_size(),
                    stats.value_size(),
                    FN_STATS_VALUE_SIZE
                ),
            ));
        }
        let if_fn = match if_fn_path {
            Some(p) => Some(
                MapHandle::from_pinned_path_with_file_flags(p, libbpf_rs::libbpf_sys::BPF_F_RDONLY)
                    .map_err(|e| map_err(p, format!("cannot open pinned map: {e}")))?,
            ),
            None => None,
        };
        Ok(Self {
            path,
            stats,
            if_fn,
            epoch: Instant::now(),
        })
    }

    /// ifindex → function index, from `if_fn` (empty when it was not opened).
    pub fn interfaces(&self) -> Result<BTreeMap<u32, u32>> {
        let mut out = BTreeMap::new();
        let Some(map) = &self.if_fn else {
            return Ok(out);
        };
        for key in map.keys() {
            let value = map
                .lookup(&key, MapFlags::ANY)
                .map_err(|e| PowerError::Map {
                    path: self.path.clone(),
                    reason: format!("if_fn lookup: {e}"),
                })?;
            if let (Ok(k), Some(Ok(v))) = (
                <[u8; 4]>::try_from(key.as_slice()),
                value.map(|v| <[u8; 4]>::try_from(v.as_slice())),
            ) {
                out.insert(u32::from_ne_bytes(k), u32::from_ne_bytes(v));
            }
        }
        Ok(out)
    }
}

impl CounterSource for PinnedFnStats {
    fn read(&mut self, functions: &[u32]) -> Result<CounterSnapshot> {
        let mut snapshot = CounterSnapshot {
            at_ns: u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX),
            functions: BTreeMap::new(),
        };
        for &index in functions {
            if index >= self.stats.max_entries() {
                return Err(PowerError::Map {
                    path: self.path.clone(),
                    reason: format!(
                        "function {index} ≥ max_entries {}",
                        self.stats.max_entries()
                    ),
                });
            }
            let per_cpu = self
                .stats
                .lookup_percpu(&index.to_ne_bytes(), MapFlags::ANY)
                .map_err(|e| PowerError::Map {
                    path: self.path.clone(),
                    reason: format!("lookup of function {index}: {e}"),
                })?
                .unwrap_or_default();
            let mut sum = FnCounters::default();
            for cpu in &per_cpu {
                let value = FnCounters::from_bytes(cpu).ok_or_else(|| PowerError::Map {
                    path: self.path.clone(),
                    reason: format!(
                        "function {index}: short per-CPU value ({} bytes)",
                        cpu.len()
                    ),
                })?;
                sum.merge_cpu(&value);
            }
            snapshot.functions.insert(index, sum);
        }
        Ok(snapshot)
    }
}

/// Replays recorded counters. Text format, one row per function per read:
/// `at_ns fn rx_packets tx_packets [rx_bytes tx_bytes rx_last_ns tx_last_ns]`, `#` comments;
/// consecutive rows with the same `at_ns` form one read.
#[derive(Debug, Clone, Default)]
pub struct TraceSource {
    reads: VecDeque<CounterSnapshot>,
}

impl TraceSource {
    pub fn new(reads: impl IntoIterator<Item = CounterSnapshot>) -> Self {
        Self {
            reads: reads.into_iter().collect(),
        }
    }

    pub fn parse(text: &str) -> Result<Self> {
        let mut reads: Vec<CounterSnapshot> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() != 4 && fields.len() != 8 {
                return Err(PowerError::Trace {
                    line: n + 1,
                    reason: format!("expected 4 or 8 fields, found {}", fields.len()),
                });
            }
            let num = |i: usize, what: &str| -> Result<u64> {
                fields[i].parse::<u64>().map_err(|e| PowerError::Trace {
                    line: n + 1,
                    reason: format!("{what} {:?}: {e}", fields[i]),
                })
            };
            let at_ns = num(0, "at_ns")?;
            let index = u32::try_from(num(1, "fn")?).map_err(|_| PowerError::Trace {
                line: n + 1,
                reason: "fn out of range".into(),
            })?;
            let mut c = FnCounters {
                rx_packets: num(2, "rx_packets")?,
                ..Default::default()
            };
            c.tx_packets = num(3, "tx_packets")?;
            if fields.len() == 8 {
                c.rx_bytes = num(4, "rx_bytes")?;
                c.tx_bytes = num(5, "tx_bytes")?;
                c.rx_last_ns = num(6, "rx_last_ns")?;
                c.tx_last_ns = num(7, "tx_last_ns")?;
            }
            match reads.last_mut() {
                Some(last) if last.at_ns == at_ns => {
                    last.functions.insert(index, c);
                }
                Some(last) if last.at_ns > at_ns => {
                    return Err(PowerError::Trace {
                        line: n + 1,
                        reason: format!("at_ns {at_ns} goes back in time"),
                    })
                }
                _ => reads.push(CounterSnapshot {
                    at_ns,
                    functions: BTreeMap::from([(index, c)]),
                }),
            }
        }
        Ok(Self::new(reads))
    }

    pub fn remaining(&self) -> usize {
        self.reads.len()
    }
}

impl CounterSource for TraceSource {
    fn read(&mut self, functions: &[u32]) -> Result<CounterSnapshot> {
        let mut snapshot = self.reads.pop_front().ok_or(PowerError::Trace {
            line: 0,
            reason: "trace exhausted".into(),
        })?;
        snapshot.functions.retain(|k, _| functions.contains(k));
        Ok(snapshot)
    }
}
