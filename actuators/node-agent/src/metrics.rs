//! The agent's Prometheus metrics (served by `cgloop_obs::serve`): gRPC requests, actions,
//! the queue sampler's health and the micro loop's moves and sanctions.
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use cgloop_obs::TotalCounter;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tonic::{Response, Status};

use crate::agent::HasOutcome;
use crate::guard::{Move, MoveKind};
use crate::queue_view::{QueueTick, QueueView, SanctionCount, SanctionSource};

type Labels = Vec<(&'static str, String)>;

pub struct Metrics {
    pub requests: Family<Labels, Counter>,
    pub actions: Family<Labels, Counter>,
    pub sampler_ticks: TotalCounter,
    pub guard_stale_polls: Counter,
    pub last_tick_age: Gauge<f64, AtomicU64>,
    pub micro_loop_acting: Gauge,
    pub guard_moves: Family<Labels, Counter>,
    pub sanctioned_packets: Counter,
    pub sanctioned_flows: Counter,
    /// The INT source (`[int_export]`).
    pub int_export: Arc<crate::int_export::IntMetrics>,
    registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("cgloop_node_agent");
        let m = Self {
            requests: Family::default(),
            actions: Family::default(),
            sampler_ticks: TotalCounter::default(),
            guard_stale_polls: Counter::default(),
            last_tick_age: Gauge::default(),
            micro_loop_acting: Gauge::default(),
            guard_moves: Family::default(),
            sanctioned_packets: Counter::default(),
            sanctioned_flows: Counter::default(),
            int_export: Arc::default(),
            registry: Arc::new(Registry::default()),
        };
        r.register("grpc_requests", "gRPC requests, by method and status code", m.requests.clone());
        r.register(
            "actions",
            "Mutating requests by method and outcome (applied, unchanged, replayed, dry_run, refused)",
            m.actions.clone(),
        );
        r.register("queue_sampler_ticks", "Queue monitor ticks (queue samples taken)", m.sampler_ticks.clone());
        r.register(
            "queue_sampler_stale_polls",
            "Latency-guard polls that found no fresh queue tick (stale, faulted or none yet)",
            m.guard_stale_polls.clone(),
        );
        r.register(
            "queue_sampler_last_tick_age_seconds",
            "Age of the newest queue tick",
            m.last_tick_age.clone(),
        );
        r.register(
            "micro_loop_acting",
            "1 when the micro loop may act (the monitor reads its queues, the guard may move flows)",
            m.micro_loop_acting.clone(),
        );
        r.register("guard_moves", "Latency-guard moves, by kind (promote, release)", m.guard_moves.clone());
        r.register(
            "qprot_sanctioned_packets",
            "Packets sanctioned by queue protection (RFC 9957), as the audit drains them",
            m.sanctioned_packets.clone(),
        );
        r.register(
            "qprot_sanctions",
            "Per-flow sanction counts drained (one per flow and audit interval)",
            m.sanctioned_flows.clone(),
        );
        m.int_export.register(&mut r);
        for kind in ["promote", "release"] {
            let _ = m.guard_moves.get_or_create(&vec![("kind", kind.to_string())]);
        }
        Self { registry: Arc::new(r), ..m }
    }
}

impl Metrics {
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// One gRPC call's result; for a mutating call, its action outcome too.
    pub fn request<T>(&self, method: &'static str, result: &Result<Response<T>, Status>) {
        let code = match result {
            Ok(_) => "OK".to_string(),
            Err(s) => format!("{:?}", s.code()),
        };
        self.requests.get_or_create(&vec![("method", method.to_string()), ("code", code)]).inc();
    }

    pub fn action<T: HasOutcome>(&self, method: &'static str, result: &mut Result<Response<T>, Status>) {
        let outcome = match result {
            Err(_) => "refused",
            Ok(r) => match r.get_mut().outcome_mut() {
                Some(o) if o.replayed => "replayed",
                Some(o) if o.dry_run => "dry_run",
                Some(o) if o.changed => "applied",
                _ => "unchanged",
            },
        };
        self.actions.get_or_create(&vec![("method", method.to_string()), ("outcome", outcome.to_string())]).inc();
    }

    /// The sampler's tick total and the micro loop's status, as the agent reports them.
    pub fn observe_sampler(&self, ticks: u64, acting: bool, last_tick_age_ns: u64) {
        self.sampler_ticks.observe(ticks);
        self.micro_loop_acting.set(i64::from(acting));
        self.last_tick_age.set(last_tick_age_ns as f64 / 1e9);
    }

    pub fn guard_move(&self, m: &Move) {
        let kind = match m.kind {
            MoveKind::Promote => "promote",
            MoveKind::Release => "release",
        };
        self.guard_moves.get_or_create(&vec![("kind", kind.to_string())]).inc();
    }
}

/// The guard's view of the queues, counting the polls that found no fresh tick.
pub struct CountedView {
    pub inner: Arc<dyn QueueView>,
    pub metrics: Arc<Metrics>,
}

impl QueueView for CountedView {
    fn latest(&self) -> Option<Arc<QueueTick>> {
        let t = self.inner.latest();
        if t.is_none() {
            self.metrics.guard_stale_polls.inc();
        }
        t
    }

    fn fault(&self) -> String {
        self.inner.fault()
    }
}

/// The sanctions the audit drains, counted on the way.
pub struct CountedSanctions {
    pub inner: Arc<dyn SanctionSource>,
    pub metrics: Arc<Metrics>,
}

impl SanctionSource for CountedSanctions {
    fn drain(&self) -> Vec<SanctionCount> {
        let drained = self.inner.drain();
        self.metrics.sanctioned_flows.inc_by(drained.len() as u64);
        self.metrics.sanctioned_packets.inc_by(drained.iter().map(|s| s.packets).sum());
        drained
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cgloop_proto::v1::{ApplyOutcome, SetFlowClassResponse};

    #[test]
    fn requests_actions_and_the_sampler_show() {
        let m = Metrics::default();
        let applied = SetFlowClassResponse {
            outcome: Some(ApplyOutcome { changed: true, ..Default::default() }),
            ..Default::default()
        };
        let mut ok = Ok(Response::new(applied));
        m.request("SetFlowClass", &ok);
        m.action("SetFlowClass", &mut ok);
        let mut refused: Result<Response<SetFlowClassResponse>, Status> = Err(Status::invalid_argument("rule is missing"));
        m.request("SetFlowClass", &refused);
        m.action("SetFlowClass", &mut refused);
        m.observe_sampler(40, true, 2_000_000);
        m.observe_sampler(40, false, 9_000_000);
        let t = cgloop_obs::render(&m.registry()).unwrap();
        for want in [
            "cgloop_node_agent_grpc_requests_total{method=\"SetFlowClass\",code=\"OK\"} 1",
            "cgloop_node_agent_grpc_requests_total{method=\"SetFlowClass\",code=\"InvalidArgument\"} 1",
            "cgloop_node_agent_actions_total{method=\"SetFlowClass\",outcome=\"applied\"} 1",
            "cgloop_node_agent_actions_total{method=\"SetFlowClass\",outcome=\"refused\"} 1",
            "cgloop_node_agent_queue_sampler_ticks_total 40",
            "cgloop_node_agent_micro_loop_acting 0",
            "cgloop_node_agent_queue_sampler_last_tick_age_seconds 0.009",
        ] {
            assert!(t.contains(want), "{want} missing in\n{t}");
        }
    }
}
