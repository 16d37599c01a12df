//! The collector's Prometheus metrics (served by `cgloop_obs::serve`): the workers' [`Stats`]
//! folded into counters, plus what only the main thread sees (records exported, Kafka delivery
//! errors, datagrams the kernel dropped on full socket buffers).
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use cgloop_obs::TotalCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::recv::Stats;

type Labels = Vec<(String, String)>;

/// The workers, the producer and the kernel count totals: the counters follow them.
pub struct Metrics {
    pub datagrams: TotalCounter,
    pub reports: TotalCounter,
    pub refused: Family<Labels, TotalCounter>,
    pub records: TotalCounter,
    pub flows: TotalCounter,
    pub exported: Counter,
    pub kafka_delivery_errors: TotalCounter,
    pub socket_drops: TotalCounter,
    registry: Arc<Registry>,
}

/// Kernel drops of a socket (SO_MEMINFO's SK_MEMINFO_DROPS: datagrams lost on a full receive
/// buffer); None when the kernel does not say.
pub fn socket_drops(sock: &UdpSocket) -> Option<u64> {
    let mut info = [0u32; libc::SK_MEMINFO_DROPS as usize + 1];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `info`.
    let rc = unsafe {
        libc::getsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_MEMINFO, info.as_mut_ptr().cast(), &mut len)
    };
    (rc == 0 && len as usize >= std::mem::size_of_val(&info)).then(|| u64::from(info[libc::SK_MEMINFO_DROPS as usize]))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("cgloop_int_collector");
        let m = Self {
            datagrams: TotalCounter::default(),
            reports: TotalCounter::default(),
            refused: Family::default(),
            records: TotalCounter::default(),
            flows: TotalCounter::default(),
            exported: Counter::default(),
            kafka_delivery_errors: TotalCounter::default(),
            socket_drops: TotalCounter::default(),
            registry: Arc::new(Registry::default()),
        };
        r.register("datagrams_received", "Report datagrams received (all sources)", m.datagrams.clone());
        r.register("reports_parsed", "Telemetry reports parsed", m.reports.clone());
        r.register(
            "reports_refused",
            "Datagrams or reports refused, by reason (refused_source: sender not in --allow-source; \
             otherwise the parser's kind:what)",
            m.refused.clone(),
        );
        r.register("records_produced", "INT records produced by the flow state", m.records.clone());
        r.register("flows", "Flows created in the flow state", m.flows.clone());
        r.register("records_exported", "Records handed to the Kafka producer (or discarded without --kafka)", m.exported.clone());
        r.register("kafka_delivery_errors", "Kafka messages whose delivery failed (their records are lost)", m.kafka_delivery_errors.clone());
        r.register("socket_drops", "Datagrams the kernel dropped on full socket receive buffers", m.socket_drops.clone());
        Self { registry: Arc::new(r), ..m }
    }
}

impl Metrics {
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// Folds the workers' totals, the producer's delivery errors and the sockets' kernel drops
    /// (all totals) into the counters.
    pub fn observe(&self, stats: &Stats, kafka_errors: u64, socket_drops: u64) {
        let refused_source = stats.refused_source.load(Ordering::Relaxed);
        self.datagrams.observe(stats.packets.load(Ordering::Relaxed) + refused_source);
        self.reports.observe(stats.reports.load(Ordering::Relaxed));
        self.records.observe(stats.records.load(Ordering::Relaxed));
        self.flows.observe(stats.flows.load(Ordering::Relaxed));
        self.kafka_delivery_errors.observe(kafka_errors);
        self.socket_drops.observe(socket_drops);
        let refused = |reason: &str| self.refused.get_or_create(&vec![("reason".into(), reason.into())]).clone();
        refused("refused_source").observe(refused_source);
        let by_reason = stats.by_reason.lock().map(|m| m.clone()).unwrap_or_default();
        for (reason, n) in by_reason {
            refused(&reason).observe(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workers_totals_become_counters_once() {
        let (m, stats) = (Metrics::default(), Stats::default());
        stats.packets.store(10, Ordering::Relaxed);
        stats.refused_source.store(2, Ordering::Relaxed);
        stats.reports.store(9, Ordering::Relaxed);
        stats.records.store(4, Ordering::Relaxed);
        stats.by_reason.lock().unwrap().insert("report:truncated".into(), 1);
        m.observe(&stats, 3, 5);
        m.observe(&stats, 3, 5); // the same totals again add nothing
        let t = cgloop_obs::render(&m.registry()).unwrap();
        for want in [
            "cgloop_int_collector_datagrams_received_total 12",
            "cgloop_int_collector_reports_parsed_total 9",
            "cgloop_int_collector_records_produced_total 4",
            "cgloop_int_collector_reports_refused_total{reason=\"refused_source\"} 2",
            "cgloop_int_collector_reports_refused_total{reason=\"report:truncated\"} 1",
            "cgloop_int_collector_kafka_delivery_errors_total 3",
            "cgloop_int_collector_socket_drops_total 5",
        ] {
            assert!(t.contains(want), "{want} missing in\n{t}");
        }
    }

    #[test]
    fn a_bound_socket_reports_its_drops() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(socket_drops(&s), Some(0));
    }
}
