//! The L4S low-latency class's configuration (`[queue_protection]`) in the datapath's maps
//! (bpf/qprot.bpf.h), and the per-flow RFC 9957 sanctions as a [`SanctionSource`].
use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use crate::config::QueueProtectionSettings;
use crate::datapath::{bytes_of, from_bytes, FlowKey, QmonMaps, QprotCfg, QprotFlow};
use crate::queue_view::{SanctionCount, SanctionSource};

#[cfg(test)]
mod datapath_tests;

/// DOCSIS' MINTH/MAXTH ratio (475 µs / 1000 µs): where probNative's ramp starts.
const MINTH_PER_MILLE: u64 = 475;
/// Cap of a bucket's score (keeps t_exp bounded; DOCSIS models use 5 s).
const MAX_SCORE_NS: u64 = 5_000_000_000;

/// The map value for `s` (salted flow hash).
pub fn cfg_of(s: &QueueProtectionSettings, salt: u32) -> QprotCfg {
    let critical = s.critical_qdelay_us * 1000;
    QprotCfg {
        ll_class: s.ll_class_id,
        classic_class: s.classic_class_id,
        critical_qdelay_ns: critical,
        minth_ns: critical * MINTH_PER_MILLE / 1000,
        critical_score_ns: s.critical_score_us * 1000,
        max_score_ns: MAX_SCORE_NS,
        ce_step_ns: s.ce_step_us * 1000,
        lg_aging: s.lg_aging,
        attempts: s.attempts,
        bi_size: s.buckets.trailing_zeros(),
        salt,
        protect: s.enabled as u32,
        pad: 0,
    }
}

pub struct Protection {
    maps: QmonMaps,
    settings: QueueProtectionSettings,
    salt: u32,
    /// ifindex each configured interface had when last written.
    written: Mutex<HashMap<String, u32>>,
    /// Cumulative (packets, bytes) per flow at the previous drain.
    drained: Mutex<HashMap<Vec<u8>, (u64, u64)>>,
}

impl Protection {
    pub fn new(maps: QmonMaps, settings: QueueProtectionSettings) -> Self {
        Self {
            maps,
            settings,
            salt: rand::random(),
            written: Mutex::new(HashMap::new()),
            drained: Mutex::new(HashMap::new()),
        }
    }

    /// Writes the configuration of every listed interface that exists (again when its ifindex
    /// changed: a recreated interface). Returns a warning per interface not found.
    pub fn apply(&self) -> Result<Vec<String>> {
        let cfg = cfg_of(&self.settings, self.salt);
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        let mut warnings = Vec::new();
        for name in &self.settings.interfaces {
            let ifindex = match crate::netif::ifindex(name) {
                Ok(i) => i,
                Err(e) => {
                    warnings.push(format!("queue_protection.interfaces: {name}: {e}"));
                    continue;
                }
            };
            if written.get(name) == Some(&ifindex) {
                continue;
            }
            let zero = vec![0u8; self.maps.qprot_state.value_size() as usize];
            self.maps
                .qprot_state
                .update(&ifindex.to_ne_bytes(), &zero, MapFlags::ANY)
                .with_context(|| format!("qprot_state of {name}"))?;
            self.maps
                .qprot_cfg
                .update(&ifindex.to_ne_bytes(), bytes_of(&cfg), MapFlags::ANY)
                .with_context(|| format!("qprot_cfg of {name}"))?;
            written.insert(name.clone(), ifindex);
        }
        Ok(warnings)
    }
}


impl SanctionSource for Protection {
    fn drain(&self) -> Vec<SanctionCount> {
        let mut drained = self.drained.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        let mut live = HashMap::new();
        for key in self.maps.qprot_flows.keys() {
            let Ok(Some(v)) = self.maps.qprot_flows.lookup(&key, MapFlags::ANY) else {
                continue;
            };
            let f: QprotFlow = from_bytes(&v);
            let (p0, b0) = drained.get(&key).copied().unwrap_or((0, 0));
            // An LRU-evicted and re-created entry restarts from 0.
            let (p0, b0) = if f.packets < p0 { (0, 0) } else { (p0, b0) };
            if f.packets > p0 {
                let k: FlowKey = from_bytes(&key);
                out.push(SanctionCount {
                    interface: crate::netif::ifname(k.ifindex),
                    flow: crate::datapath::key_tuple(&k),
                    from_class_id: f.from_class,
                    to_class_id: f.to_class,
                    packets: f.packets - p0,
                    bytes: f.bytes.saturating_sub(b0),
                    max_score_us: f.max_score_ns as f64 / 1000.0,
                    max_queue_delay_ns: f.max_qdelay_ns,
                });
            }
            live.insert(key, (f.packets, f.bytes));
        }
        *drained = live;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_maps_to_the_rfc_units() {
        let s = QueueProtectionSettings {
            ll_class_id: 0x10040,
            classic_class_id: 0x10010,
            interfaces: vec!["cpe".into()],
            ..Default::default()
        };
        let c = cfg_of(&s, 7);
        assert_eq!(
            (c.critical_qdelay_ns, c.minth_ns, c.critical_score_ns),
            (1_000_000, 475_000, 4_000_000)
        );
        assert_eq!(
            (c.bi_size, c.attempts, c.lg_aging, c.ce_step_ns, c.protect),
            (5, 2, 19, 1_000_000, 1)
        );
    }
}
