//! Prometheus endpoint of the exporter (`GET /metrics`, text format).
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::bpf_types::{FIRST_ERROR_STAT, STAT_NAMES};

type Labels = Vec<(String, String)>;

pub struct Metrics {
    pub records: Counter,
    pub sweeps: Counter,
    pub sweep_seconds: Histogram,
    pub flows_live: Gauge,
    pub flow_capacity: Gauge,
    pub flow_fill: Gauge<f64, AtomicU64>,
    pub evictions: Counter,
    pub expired: Counter,
    pub packets: Family<Labels, Counter>,
    pub parse_failures: Family<Labels, Counter>,
    pub kafka_queue: Gauge,
    pub kafka_dropped: Counter,
    pub kafka_delivered: Counter,
    /// Totals at the previous observation: BPF and Kafka report totals, counters take deltas.
    last: Mutex<([u64; STAT_NAMES.len()], u64, u64)>,
    registry: Arc<Registry>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut m = Self {
            records: Counter::default(),
            sweeps: Counter::default(),
            sweep_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            flows_live: Gauge::default(),
            flow_capacity: Gauge::default(),
            flow_fill: Gauge::default(),
            evictions: Counter::default(),
            expired: Counter::default(),
            packets: Family::default(),
            parse_failures: Family::default(),
            kafka_queue: Gauge::default(),
            kafka_dropped: Counter::default(),
            kafka_delivered: Counter::default(),
            last: Mutex::new(([0; STAT_NAMES.len()], 0, 0)),
            registry: Arc::new(Registry::with_prefix("cgloop_probe")),
        };
        let mut r = Registry::with_prefix("cgloop_probe");
        r.register("records", "Flow records exported", m.records.clone());
        r.register("sweeps", "Flow-table sweeps", m.sweeps.clone());
        r.register(
            "sweep_duration_seconds",
            "Time of one sweep",
            m.sweep_seconds.clone(),
        );
        r.register(
            "flows_live",
            "Flows in the table at the last sweep",
            m.flows_live.clone(),
        );
        r.register(
            "flow_table_capacity",
            "Flow table size (--max-flows)",
            m.flow_capacity.clone(),
        );
        r.register(
            "flow_table_fill_ratio",
            "flows_live / capacity",
            m.flow_fill.clone(),
        );
        r.register(
            "evictions",
            "Flows the LRU table evicted before export",
            m.evictions.clone(),
        );
        r.register(
            "expired_flows",
            "Flows ended by idle timeout",
            m.expired.clone(),
        );
        r.register(
            "packets",
            "Packets seen by the BPF programs, by fate",
            m.packets.clone(),
        );
        r.register(
            "parse_failures",
            "Packets not accounted, by reason",
            m.parse_failures.clone(),
        );
        r.register(
            "kafka_queue_depth",
            "Messages waiting for the broker",
            m.kafka_queue.clone(),
        );
        r.register(
            "kafka_records_dropped",
            "Records dropped (buffer full/timeout)",
            m.kafka_dropped.clone(),
        );
        r.register(
            "kafka_records_delivered",
            "Records acknowledged by Kafka",
            m.kafka_delivered.clone(),
        );
        m.registry = Arc::new(r);
        m
    }

    /// Folds the BPF probe_stats totals into the counters (they only grow).
    pub fn observe_stats(&self, stats: &[u64; STAT_NAMES.len()]) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        for (i, name) in STAT_NAMES.iter().enumerate() {
            let d = stats[i].saturating_sub(last.0[i]);
            if d == 0 {
                continue;
            }
            let family = if i >= FIRST_ERROR_STAT {
                &self.parse_failures
            } else {
                &self.packets
            };
            let label = if i >= FIRST_ERROR_STAT {
                "reason"
            } else {
                "fate"
            };
            family
                .get_or_create(&vec![(label.into(), (*name).into())])
                .inc_by(d);
        }
        last.0 = *stats;
    }

    pub fn observe_kafka(&self, delivered: u64, dropped: u64, queue: i64) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        self.kafka_delivered
            .inc_by(delivered.saturating_sub(last.1));
        self.kafka_dropped.inc_by(dropped.saturating_sub(last.2));
        last.1 = last.1.max(delivered);
        last.2 = last.2.max(dropped);
        self.kafka_queue.set(queue);
    }

    /// The registry `/metrics` serves (cgloop_obs: one endpoint for every Rust daemon).
    pub fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }
}
