//! The seam between the node micro loop's eyes and its hands.
//!
//! The queue monitor (`qmon`: BPF at the qdisc enqueue/dequeue tracepoints plus the kernel's
//! class statistics, sampled every millisecond) and the RFC 9957 queue protection in the
//! classifier produce what is declared here; the latency guard of protected flows and the
//! micro-loop audit (Action records on the actions topic) consume it. Both sides depend on these
//! two traits only, so each is tested against a double of the other.

use std::sync::Arc;

use cgloop_proto::v1::FiveTuple;

/// One managed HTB class at one tick.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClassQueue {
    pub interface: String,
    pub ifindex: u32,
    pub class_id: u32,
    /// Waiting in the class now.
    pub backlog_bytes: u64,
    pub backlog_packets: u64,
    /// The queue delay a packet enqueued now would see: the estimate the guard judges by (the
    /// monitor documents its method and error).
    pub queue_delay_ns: u64,
    /// Largest sojourn of a packet dequeued from the class since the previous tick (0: none).
    pub sojourn_max_ns: u64,
}

/// Every managed class, read at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueTick {
    /// When it was read, ns since the Unix epoch (`cgloop_proto::host::now_ns`).
    pub taken_ns: u64,
    pub classes: Vec<ClassQueue>,
}

impl QueueTick {
    pub fn class(&self, ifindex: u32, class_id: u32) -> Option<&ClassQueue> {
        self.classes.iter().find(|c| c.ifindex == ifindex && c.class_id == class_id)
    }
}

/// The newest tick of the queue monitor. `None` while it has none, or when it cannot read its
/// queues: then the reason says why, and the micro loop must not act.
pub trait QueueView: Send + Sync {
    fn latest(&self) -> Option<Arc<QueueTick>>;
    /// Why there is no fresh tick (empty when the monitor is reading).
    fn fault(&self) -> String;
}

/// What RFC 9957 queue protection did to one flow since the previous drain.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SanctionCount {
    pub interface: String,
    pub flow: FiveTuple,
    /// Low-latency class the packets were meant for, classic class they were sent to.
    pub from_class_id: u32,
    pub to_class_id: u32,
    pub packets: u64,
    pub bytes: u64,
    /// Highest bucket score (µs) and low-latency queue delay (ns) seen at a sanction.
    pub max_score_us: f64,
    pub max_queue_delay_ns: u64,
}

/// Per-flow sanction counts since the previous call (each sanction reported once).
pub trait SanctionSource: Send + Sync {
    fn drain(&self) -> Vec<SanctionCount>;
}
