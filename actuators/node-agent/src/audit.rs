//! The micro-loop audit: what the node decides and applies alone becomes an `Action` (level
//! NODE) followed by its `ActionResult` (APPLIED) on the actions topic, like the policy
//! engine's own actions, so the store and the dashboards show which level acted and the engine
//! can take them as facts.
//!
//! - the latency guard's promotions and releases: REPRIORITISE_FLOW (with the rule it replaced,
//!   what a rollback restores);
//! - RFC 9957 queue protection: QUEUE_PROTECTION_SANCTION, one per flow per `audit_interval_ms`
//!   from `queue_view::SanctionSource::drain`;
//! - the X-MAN power manager's frequency switches: SET_CORE_FREQUENCY, one per core.
//!
//! Callers hand records over a bounded queue and never wait: when it is full, or Kafka refuses
//! a message, the record is dropped and counted ([`Audit::dropped`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cgloop_proto::bus::BusTopic;
use cgloop_proto::host::now_ns;
use cgloop_proto::v1::action::Spec;
use cgloop_proto::v1::action_event::Event;
use cgloop_proto::v1::previous_state::State as Previous;
use cgloop_proto::v1::{
    Action, ActionBatch, ActionEvent, ActionLevel, ActionOperation, ActionResult, ActionState,
    ActionTarget, PreviousFlowClass, PreviousState, QueueProtectionSanction, RecordHeader,
    ReprioritiseFlowAction, SetCoreFrequencyAction,
};
use prost::Message;
use rand::RngExt;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::guard::{Move, MoveKind};
use crate::power_glue::CoreFrequencyChange;
use crate::queue_view::{SanctionCount, SanctionSource};

/// Policy ids of the node's own mechanisms (`Action.policy_id`).
pub const GUARD_POLICY: &str = "node/latency-guard";
pub const PROTECTION_POLICY: &str = "node/queue-protection";
pub const XMAN_POLICY: &str = "node/xman";

/// An action and its result: one message on the actions topic.
pub type Record = (Action, ActionResult);

/// Where records go: Kafka in the agent, a vector in tests.
pub trait Sink: Send {
    /// Queues one action's events under its id (the engine's key: one action stays in order).
    fn send(&mut self, key: &str, batch: &ActionBatch) -> Result<()>;
    /// Serves delivery callbacks; called between sends.
    fn poll(&mut self) {}
    fn flush(&mut self) {}
}

/// The agent's producer path (`export::producer`, the bus table's settings and headers).
pub struct KafkaSink {
    producer: BaseProducer,
    topic: String,
}

impl KafkaSink {
    pub fn new(bootstrap: &str, topic: &str, node_id: &str) -> Result<Self> {
        let producer = crate::export::producer(bootstrap, &format!("{node_id}-actions"))?;
        Ok(Self {
            producer,
            topic: topic.to_string(),
        })
    }
}

impl Sink for KafkaSink {
    fn send(&mut self, key: &str, batch: &ActionBatch) -> Result<()> {
        let payload = batch.encode_to_vec();
        let record = BaseRecord::to(&self.topic)
            .key(key)
            .payload(&payload)
            .headers(crate::export::headers(BusTopic::Actions));
        self.producer
            .send(record)
            .map_err(|(e, _)| anyhow::anyhow!("{e}"))
    }
    fn poll(&mut self) {
        self.producer.poll(Duration::ZERO);
    }
    fn flush(&mut self) {
        let _ = self.producer.flush(Duration::from_secs(5));
    }
}

/// Builds the records (ids, headers with the node's source id and a sequence).
#[derive(Clone)]
pub struct Recorder {
    node_id: String,
    sequence: Arc<AtomicU64>,
}

/// A random (version 4) UUID in text form: the action's id and idempotency key.
fn uuid4() -> String {
    let mut b: [u8; 16] = rand::rng().random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

impl Recorder {
    pub fn new(node_id: &str) -> Self {
        Self {
            node_id: node_id.to_string(),
            sequence: Arc::new(AtomicU64::new(0)),
        }
    }

    fn header(&self, at_ns: u64) -> RecordHeader {
        RecordHeader {
            schema_version: cgloop_proto::SCHEMA_VERSION,
            source_id: format!("{}/node-agent", self.node_id),
            sequence: self.sequence.fetch_add(1, Ordering::Relaxed) + 1,
            timestamp_ns: at_ns,
        }
    }

    /// The decision (PROPOSED, as the engine writes its decisions) and its result (APPLIED).
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        policy: &str,
        operation: ActionOperation,
        target: ActionTarget,
        spec: Spec,
        cause: String,
        applied_ns: u64,
        apply_latency_ns: u64,
        seen_to_apply_ns: u64,
        previous: Option<PreviousState>,
        dry_run: bool,
    ) -> Record {
        let id = uuid4();
        let action = Action {
            header: Some(self.header(applied_ns)),
            id: id.clone(),
            policy_id: policy.to_string(),
            level: ActionLevel::Node as i32,
            target: Some(ActionTarget {
                node_id: self.node_id.clone(),
                ..target
            }),
            operation: operation as i32,
            state: ActionState::Proposed as i32,
            deadline_ns: applied_ns,
            dry_run,
            spec: Some(spec),
            cause,
            ..Default::default()
        };
        let result = ActionResult {
            header: Some(self.header(applied_ns)),
            action_id: id,
            state: ActionState::Applied as i32,
            message: if dry_run {
                "dry run: nothing written".into()
            } else {
                String::new()
            },
            applied_ns,
            apply_latency_ns,
            detection_to_apply_ns: seen_to_apply_ns,
            previous,
            ..Default::default()
        };
        (action, result)
    }

    /// A promotion or release of the latency guard: REPRIORITISE_FLOW.
    pub fn guard_move(&self, m: &Move) -> Record {
        let spec = Spec::ReprioritiseFlow(ReprioritiseFlowAction {
            class_id: m.to_class,
            rewrite_dscp: m.to.and_then(|r| r.rewrite_dscp),
        });
        let previous = PreviousState {
            state: Some(Previous::FlowClass(PreviousFlowClass {
                class_id: m.previous.map(|r| r.class_id),
                rewrite_dscp: m.previous.and_then(|r| r.rewrite_dscp),
            })),
        };
        let target = ActionTarget {
            interface_name: m.interface.clone(),
            flow: Some(m.flow.clone()),
            ..Default::default()
        };
        let kind = match m.kind {
            MoveKind::Promote => "promoted",
            MoveKind::Release => "released",
        };
        let seen = if m.seen_ns == 0 {
            0
        } else {
            m.applied_ns.saturating_sub(m.seen_ns)
        };
        self.record(
            GUARD_POLICY,
            ActionOperation::ReprioritiseFlow,
            target,
            spec,
            format!("{kind}: {}", m.cause),
            m.applied_ns,
            m.apply_latency_ns,
            seen,
            Some(previous),
            m.dry_run,
        )
    }

    /// One flow's RFC 9957 sanctions over one interval: QUEUE_PROTECTION_SANCTION.
    pub fn sanction(&self, s: &SanctionCount, start_ns: u64, end_ns: u64) -> Record {
        let spec = Spec::QueueProtectionSanction(QueueProtectionSanction {
            from_class_id: s.from_class_id,
            to_class_id: s.to_class_id,
            sanctioned_packets: s.packets,
            sanctioned_bytes: s.bytes,
            interval_start_ns: start_ns,
            interval_end_ns: end_ns,
            max_score_us: s.max_score_us,
            max_queue_delay_ns: s.max_queue_delay_ns,
        });
        let target = ActionTarget {
            interface_name: s.interface.clone(),
            flow: Some(s.flow.clone()),
            ..Default::default()
        };
        let cause = format!(
            "queue protection: {} packets redirected from class {} to {} (bucket score up to {:.0} µs, \
             low-latency queue delay up to {:.2} ms)",
            s.packets,
            crate::tc::handle_str(s.from_class_id),
            crate::tc::handle_str(s.to_class_id),
            s.max_score_us,
            s.max_queue_delay_ns as f64 / 1e6
        );
        let spec_op = ActionOperation::QueueProtectionSanction;
        self.record(
            PROTECTION_POLICY,
            spec_op,
            target,
            spec,
            cause,
            end_ns,
            0,
            0,
            None,
            false,
        )
    }

    /// A frequency switch of the X-MAN power manager on one core: SET_CORE_FREQUENCY (the
    /// switch sets scaling_setspeed: minimum and maximum are the frequency set).
    pub fn core_frequency(&self, c: &CoreFrequencyChange) -> Record {
        let from = c.from_khz.unwrap_or(0);
        let spec = Spec::SetCoreFrequency(SetCoreFrequencyAction {
            core: c.core,
            min_frequency_khz: c.to_khz,
            max_frequency_khz: c.to_khz,
            previous_min_frequency_khz: from,
            previous_max_frequency_khz: from,
            xman_mode: c.mode.clone(),
        });
        let cause = format!(
            "X-MAN ({}): {} kHz -> {} kHz ({})",
            c.mode, from, c.to_khz, c.reason
        );
        let op = ActionOperation::SetCoreFrequency;
        self.record(
            XMAN_POLICY,
            op,
            ActionTarget::default(),
            spec,
            cause,
            c.at_ns,
            0,
            0,
            None,
            false,
        )
    }
}

/// Per-flow sums of the sanctions drained in one interval.
pub fn aggregate(drained: Vec<SanctionCount>) -> Vec<SanctionCount> {
    let mut by_flow: BTreeMap<(String, Vec<u8>, u32, u32), SanctionCount> = BTreeMap::new();
    for s in drained {
        let k = (
            s.interface.clone(),
            s.flow.encode_to_vec(),
            s.from_class_id,
            s.to_class_id,
        );
        match by_flow.get_mut(&k) {
            Some(a) => {
                a.packets += s.packets;
                a.bytes += s.bytes;
                a.max_score_us = a.max_score_us.max(s.max_score_us);
                a.max_queue_delay_ns = a.max_queue_delay_ns.max(s.max_queue_delay_ns);
            }
            None => {
                by_flow.insert(k, s);
            }
        }
    }
    by_flow.into_values().filter(|s| s.packets > 0).collect()
}

/// The handle the micro loop records through; cheap to clone, never blocks.
#[derive(Clone)]
pub struct Audit {
    tx: SyncSender<Record>,
    recorder: Recorder,
    dropped: Arc<AtomicU64>,
}

impl Audit {
    /// Starts the audit thread: it sends what it is handed and, every `interval`, the
    /// sanctions drained from `sanctions` (if any), aggregated per flow.
    pub fn start(
        recorder: Recorder,
        sink: Box<dyn Sink>,
        capacity: usize,
        interval: Duration,
        sanctions: Option<Arc<dyn SanctionSource>>,
    ) -> Result<Self> {
        let (tx, rx) = mpsc::sync_channel(capacity);
        let dropped = Arc::new(AtomicU64::new(0));
        let worker = Worker {
            rx,
            sink,
            recorder: recorder.clone(),
            dropped: dropped.clone(),
            interval,
            sanctions,
        };
        std::thread::Builder::new()
            .name("micro-audit".into())
            .spawn(move || worker.run())
            .context("starting the micro-loop audit thread")?;
        Ok(Self {
            tx,
            recorder,
            dropped,
        })
    }

    fn push(&self, r: Record) {
        match self.tx.try_send(r) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                count_drop(&self.dropped, "the audit queue is full");
            }
        }
    }

    pub fn guard_move(&self, m: &Move) {
        self.push(self.recorder.guard_move(m));
    }

    pub fn core_frequency(&self, c: &CoreFrequencyChange) {
        self.push(self.recorder.core_frequency(c));
    }

    /// Records dropped so far (queue full, Kafka refused them).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

fn count_drop(dropped: &AtomicU64, why: &str) {
    let n = dropped.fetch_add(1, Ordering::Relaxed) + 1;
    if n == 1 || n % 1000 == 0 {
        tracing::warn!("micro-loop audit: {n} record(s) dropped so far ({why})");
    }
}

struct Worker {
    rx: Receiver<Record>,
    sink: Box<dyn Sink>,
    recorder: Recorder,
    dropped: Arc<AtomicU64>,
    interval: Duration,
    sanctions: Option<Arc<dyn SanctionSource>>,
}

impl Worker {
    fn run(mut self) {
        let mut due = Instant::now() + self.interval;
        let mut start_ns = now_ns();
        loop {
            match self
                .rx
                .recv_timeout(due.saturating_duration_since(Instant::now()))
            {
                Ok(r) => self.send(r),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.sink.flush();
                    return;
                }
            }
            if Instant::now() >= due {
                let end_ns = now_ns();
                if let Some(source) = &self.sanctions {
                    for s in aggregate(source.drain()) {
                        let r = self.recorder.sanction(&s, start_ns, end_ns);
                        self.send(r);
                    }
                }
                start_ns = end_ns;
                due += self.interval;
                if due < Instant::now() {
                    due = Instant::now() + self.interval; // overran: no burst of drains
                }
            }
            self.sink.poll();
        }
    }

    fn send(&mut self, (action, result): Record) {
        let key = action.id.clone();
        let batch = ActionBatch {
            events: vec![
                ActionEvent {
                    event: Some(Event::Action(action)),
                },
                ActionEvent {
                    event: Some(Event::Result(result)),
                },
            ],
        };
        if let Err(e) = self.sink.send(&key, &batch) {
            count_drop(&self.dropped, &format!("Kafka: {e}"));
        }
    }
}

#[cfg(test)]
mod tests;
