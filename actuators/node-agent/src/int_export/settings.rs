//! `[int_export]`: the INT source's keys, their defaults and bounds (docs/node-agent.md,
//! "INT source", has the same table).
use std::net::SocketAddr;

use anyhow::Result;
use serde::Deserialize;

use crate::config::Bounds;

/// The INT source: Telemetry Report v2.0 postcards of sampled packets leaving the agent's
/// queues, sent over UDP to an INT collector. On when the `[int_export]` section is present
/// (unless `enabled = false`); off without it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IntExportSettings {
    /// Default true (the section is present); false keeps the section but samples and sends
    /// nothing.
    pub enabled: bool,
    /// The collector's UDP address (host:port). Default 127.0.0.1:32766 (the INT collector's
    /// default listener).
    pub collector: String,
    /// TR v2.0 group header Node ID (the switch id the collector exports). 1..=u32::MAX when
    /// enabled (0 reads as "unset"); default 0.
    pub node_id: u32,
    /// TR v2.0 group header hw_id (6 bits): 0..=63, default 0.
    pub hw_id: u8,
    /// Egress interfaces whose queues are reported. Each must be allowed by `[bounds]
    /// interfaces`; it is reported while the agent holds a queue hierarchy on it (the monitor
    /// only sees the agent's HTB classes). Non-empty when enabled; at most 64.
    pub interfaces: Vec<String>,
    /// 1 in N dequeued packets of each class is reported (1..=1_000_000; 1 = every packet).
    /// Default 100.
    pub sample_every: u32,
    /// Every packet whose hop latency (qdisc sojourn) reaches this is reported too, within the
    /// rate cap (ns; 0 = sampling only; at most 10 s). Default 1_000_000 (1 ms).
    pub report_over_ns: u64,
    /// The report's Q flag (congested queue) is set when the hop latency reaches this (ns; 0 =
    /// never; at most 10 s). Default 5_000_000 (5 ms).
    pub congested_over_ns: u64,
    /// Cap on reports per second over all interfaces (1..=1_000_000), bursts of a tenth of a
    /// second; the excess is counted and not reported. Default 20_000.
    pub max_reports_per_s: u32,
    /// Individual reports coalesced into one UDP datagram (TR v2.0 §2.7) at most (1..=64).
    /// Default 16.
    pub max_reports_per_datagram: u32,
    /// Largest UDP payload sent (bytes, 256..=65507; one report is at most 216). Default 1400
    /// (fits a 1500-byte MTU with IPv4/IPv6 and UDP headers).
    pub max_datagram_bytes: u32,
    /// A partly filled datagram waits at most this long for more reports (ms, 1..=1000; the
    /// exporter wakes at least this often). Default 1.
    pub flush_interval_ms: u64,
    /// Queue occupancy unit: the class backlog is reported in cells of this many bytes
    /// (1..=65535; rounded up; saturates at 2^24 - 2). Default 80.
    pub cell_bytes: u32,
}

impl Default for IntExportSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            collector: "127.0.0.1:32766".into(),
            node_id: 0,
            hw_id: 0,
            interfaces: Vec::new(),
            sample_every: 100,
            report_over_ns: 1_000_000,
            congested_over_ns: 5_000_000,
            max_reports_per_s: 20_000,
            max_reports_per_datagram: 16,
            max_datagram_bytes: 1400,
            flush_interval_ms: 1,
            cell_bytes: 80,
        }
    }
}

/// `key` within `lo..=hi`, or an error naming the key and the bounds.
fn within<T: PartialOrd + std::fmt::Display>(key: &str, v: T, lo: T, hi: T) -> Result<()> {
    anyhow::ensure!(v >= lo && v <= hi, "int_export.{key} = {v} is out of range {lo}..={hi}");
    Ok(())
}

impl IntExportSettings {
    /// The collector's address, or an error naming the key.
    pub fn collector_addr(&self) -> Result<SocketAddr> {
        self.collector.parse().map_err(|e| {
            anyhow::anyhow!(
                "int_export.collector = {:?} is not a UDP address host:port ({e})",
                self.collector
            )
        })
    }

    /// Every key within its bounds, the interfaces within the agent's `[bounds]`; a refusal
    /// names the key (and the interfaces) at fault. Nothing is checked while disabled but the
    /// ranges, so a disabled section may stay half-written.
    pub fn check(&self, bounds: &Bounds) -> Result<()> {
        within("hw_id", self.hw_id, 0, 63)?;
        within("sample_every", self.sample_every, 1, 1_000_000)?;
        within("report_over_ns", self.report_over_ns, 0, 10_000_000_000)?;
        within("congested_over_ns", self.congested_over_ns, 0, 10_000_000_000)?;
        within("max_reports_per_s", self.max_reports_per_s, 1, 1_000_000)?;
        within("max_reports_per_datagram", self.max_reports_per_datagram, 1, 64)?;
        within("max_datagram_bytes", self.max_datagram_bytes, 256, 65_507)?;
        within("flush_interval_ms", self.flush_interval_ms, 1, 1000)?;
        within("cell_bytes", self.cell_bytes, 1, 65_535)?;
        if !self.enabled {
            return Ok(());
        }
        self.collector_addr()?;
        anyhow::ensure!(
            self.node_id != 0,
            "int_export.node_id must be set (1..={}) when int_export.enabled: it is the TR v2.0 \
             Node ID the collector names the switch by",
            u32::MAX
        );
        anyhow::ensure!(
            !self.interfaces.is_empty(),
            "int_export.interfaces is empty: name the egress interfaces whose queues are reported"
        );
        within("interfaces (count)", self.interfaces.len(), 1, 64)?;
        let guard = crate::bounds::Guard::new(bounds);
        let refused: Vec<&str> = self
            .interfaces
            .iter()
            .filter(|name| guard.interface("int_export.interfaces", name).is_err())
            .map(String::as_str)
            .collect();
        anyhow::ensure!(
            refused.is_empty(),
            "int_export.interfaces: {refused:?} not managed by this agent (not in [bounds] \
             interfaces {:?}, or empty)",
            bounds.interfaces
        );
        let mut seen = std::collections::BTreeSet::new();
        for name in &self.interfaces {
            anyhow::ensure!(seen.insert(name), "int_export.interfaces names {name:?} twice");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(toml_body: &str) -> Result<IntExportSettings> {
        let s: IntExportSettings = toml::from_str(&format!(
            "enabled = true\nnode_id = 1\ninterfaces = [\"edge1\"]\n{toml_body}"
        ))?;
        s.check(&Bounds { interfaces: vec!["edge1".into(), "edge2".into()], ..Bounds::default() })?;
        Ok(s)
    }

    #[test]
    fn a_present_section_is_on_and_a_disabled_one_may_stay_half_written() {
        let d: IntExportSettings = toml::from_str("node_id = 1\ninterfaces = [\"edge1\"]\n").unwrap();
        assert!(d.enabled);
        d.check(&Bounds::default()).unwrap();
        let off: IntExportSettings = toml::from_str("enabled = false\n").unwrap();
        off.check(&Bounds::default()).unwrap();
        assert!(IntExportSettings::default().check(&Bounds::default()).unwrap_err().to_string().contains("node_id"));
        let s = on("sample_every = 10\nmax_reports_per_s = 500\n").unwrap();
        assert_eq!((s.sample_every, s.max_reports_per_s, s.cell_bytes), (10, 500, 80));
        assert_eq!(s.collector_addr().unwrap(), "127.0.0.1:32766".parse().unwrap());
    }

    #[test]
    fn bad_values_are_refused_by_key_and_bounds() {
        for (body, want) in [
            ("sample_every = 0", "int_export.sample_every = 0 is out of range 1..=1000000"),
            ("hw_id = 64", "int_export.hw_id = 64 is out of range 0..=63"),
            ("max_reports_per_s = 0", "int_export.max_reports_per_s = 0"),
            ("max_reports_per_datagram = 65", "int_export.max_reports_per_datagram = 65"),
            ("max_datagram_bytes = 100", "int_export.max_datagram_bytes = 100 is out of range 256..=65507"),
            ("flush_interval_ms = 0", "int_export.flush_interval_ms = 0 is out of range 1..=1000"),
            ("cell_bytes = 0", "int_export.cell_bytes = 0"),
            ("collector = \"nowhere\"", "int_export.collector = \"nowhere\" is not a UDP address"),
            ("node_id = 0", "int_export.node_id must be set"),
            ("interfaces = []", "int_export.interfaces is empty"),
            ("interfaces = [\"edge1\", \"eth9\", \"wlan0\"]", "[\"eth9\", \"wlan0\"] not managed by this agent"),
            ("interfaces = [\"edge1\", \"edge1\"]", "names \"edge1\" twice"),
        ] {
            // A later key wins over the helper's defaults: rebuild the text with the key replaced.
            let text = if body.starts_with("node_id") || body.starts_with("interfaces") {
                let key = body.split(' ').next().unwrap_or_default();
                let base = "enabled = true\nnode_id = 1\ninterfaces = [\"edge1\"]\n";
                let kept: String = base.lines().filter(|l| !l.starts_with(key)).map(|l| format!("{l}\n")).collect();
                format!("{kept}{body}\n")
            } else {
                format!("enabled = true\nnode_id = 1\ninterfaces = [\"edge1\"]\n{body}\n")
            };
            let s: IntExportSettings = toml::from_str(&text).unwrap();
            let bounds = Bounds { interfaces: vec!["edge1".into(), "edge2".into()], ..Bounds::default() };
            let err = s.check(&bounds).unwrap_err().to_string();
            assert!(err.contains(want), "{body}: {err}");
        }
        assert!(toml::from_str::<IntExportSettings>("sample_rate = 3\n").is_err());
    }
}
