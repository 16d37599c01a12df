//! The latency guard of protected flows: the node micro loop's hand on flows.
//!
//! The global loop names the flows to protect (ProtectFlows: a flow, its SLO, the class to move
//! it to, a time to live). Every queue tick (`queue_view::QueueView`, 1 ms) the guard looks at
//! the class each protected flow is in now (its flow rule, else its interface's default class):
//! when that class's queue delay reaches `guard_fraction × SLO` it moves the flow to the
//! protected class with the DSCP re-mark, writing the same datapath rule SetFlowClass writes.
//! It moves the flow back (to the rule it had) only after `hold_ms` and once the class it came
//! from is below `release_fraction × SLO`; all moves together are capped per second. A stale or
//! missing tick never leads to a move: the status says why instead.
//!
//! Promotions are transient: the agent's desired state (journal) keeps the flow's own rule, so
//! a restart or a SetFlowClass from the global loop wins over a promotion (the guard notices the
//! rule changed under it and forgets the promotion without writing).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cgloop_proto::host::now_ns;
use cgloop_proto::v1::{FiveTuple, MicroLoopStatus, ProtectedFlow};
use prost::Message;

use crate::config::GuardSettings;
use crate::error::{AgentError, AgentResult};
use crate::queue_view::{QueueTick, QueueView};
use crate::tc::handle_str;

#[cfg(test)]
pub(crate) mod tests;

/// A flow rule as the guard reads and writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub class_id: u32,
    pub rewrite_dscp: Option<u32>,
}

/// Where the agent's rules steer a flow now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The flow's own rule (desired state); None: the interface's default class.
    pub rule: Option<Rule>,
    pub default_class: u32,
}

impl Placement {
    pub fn class(&self) -> u32 {
        self.rule.map_or(self.default_class, |r| r.class_id)
    }
}

/// The guard's hands on the agent's flow rules, used while the agent is locked.
pub trait Steering {
    /// The flow's placement; None when its interface has no queue hierarchy from the agent.
    fn placement(&self, interface: &str, flow: &FiveTuple) -> Option<Placement>;
    /// Changes whenever a placement may have (the agent's generation): the guard keeps each
    /// flow's placement until it does, so a tick costs no lookups.
    fn version(&self) -> u64;
    /// Writes the flow's datapath rule (None: no rule) without changing the desired state.
    fn set_rule(
        &mut self,
        interface: &str,
        flow: &FiveTuple,
        rule: Option<Rule>,
    ) -> AgentResult<()>;
    /// The agent validates and reports only (`dry_run`): nothing is written.
    fn dry_run(&self) -> bool;
}

/// Locks the agent and lends its [`Steering`] (the agent's lock is always taken before the
/// guard's: the RPC path holds the agent's lock when it calls [`Guard::protect`]).
pub trait Hands: Send + Sync {
    fn with(&self, f: &mut dyn FnMut(&mut dyn Steering));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveKind {
    Promote,
    Release,
}

/// One move the guard made: what the audit records.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    pub kind: MoveKind,
    pub interface: String,
    pub flow: FiveTuple,
    /// The rule written (None: removed, the flow is in `to_class`, the default class).
    pub to: Option<Rule>,
    pub to_class: u32,
    /// The rule it replaced (what a rollback restores).
    pub previous: Option<Rule>,
    pub cause: String,
    /// The queue tick it acted on (ns since the epoch; 0 for an expiry).
    pub seen_ns: u64,
    pub applied_ns: u64,
    pub apply_latency_ns: u64,
    pub dry_run: bool,
}

type Key = (String, Vec<u8>);

fn key(p: &ProtectedFlow) -> Key {
    (
        p.interface_name.clone(),
        p.flow
            .as_ref()
            .map(|f| f.encode_to_vec())
            .unwrap_or_default(),
    )
}

#[derive(Debug, Clone)]
struct Promotion {
    since_ns: u64,
    /// Since when every tick has read the class it came from below the release threshold.
    calm_since: Option<u64>,
    ifindex: u32,
    /// The flow's rule before, and the class it was in.
    from: Option<Rule>,
    from_class: u32,
    to: Rule,
}

#[derive(Debug, Clone)]
struct Entry {
    spec: ProtectedFlow,
    /// Its interface's index, resolved when it was protected (ticks are keyed by it).
    ifindex: u32,
    /// Its placement as of a [`Steering::version`] (None: not looked up, or no hierarchy).
    placed: Option<(u64, Option<Placement>)>,
    /// Consecutive ticks its class has read at or above the guard threshold.
    over: u32,
    promotion: Option<Promotion>,
}

impl Entry {
    fn view(&self) -> ProtectedFlow {
        ProtectedFlow {
            promoted: self.promotion.is_some(),
            ..self.spec.clone()
        }
    }
}

#[derive(Default)]
struct State {
    flows: BTreeMap<Key, Entry>,
    /// Removed or expired while promoted: moved back at the next step.
    retiring: Vec<(Entry, &'static str)>,
    /// When the moves of the last second were made (the cap).
    changes: VecDeque<u64>,
    last_tick_ns: u64,
    acting: bool,
    reason: String,
    tick_age_ns: u64,
}

/// What ProtectFlows did.
#[derive(Debug, Clone, PartialEq)]
pub struct Protected {
    pub changed: bool,
    pub applied: Vec<ProtectedFlow>,
    pub previous: Vec<ProtectedFlow>,
}

pub struct Guard {
    settings: GuardSettings,
    state: Mutex<State>,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

impl Guard {
    pub fn new(settings: GuardSettings) -> Self {
        let reason = "no queue tick yet".to_string();
        Self {
            settings,
            state: Mutex::new(State {
                reason,
                ..State::default()
            }),
        }
    }

    pub fn settings(&self) -> &GuardSettings {
        &self.settings
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Upserts (ttl_ns > 0) or removes (ttl_ns 0) protections, each already checked against
    /// the bounds and the hierarchy. Refused as a whole when the count bound would be passed.
    /// A renewal keeps a promotion; a removal of a promoted flow moves it back at the next step.
    /// `ifindexes` are the flows' interfaces' indexes, in order.
    pub fn protect(
        &self,
        flows: &[ProtectedFlow],
        ifindexes: &[u32],
        now: u64,
        dry: bool,
    ) -> AgentResult<Protected> {
        let mut st = self.lock();
        let mut keys: std::collections::BTreeSet<Key> = st.flows.keys().cloned().collect();
        for p in flows {
            if p.ttl_ns == 0 {
                keys.remove(&key(p));
            } else {
                keys.insert(key(p));
            }
        }
        let max = self.settings.max_protected_flows;
        if keys.len() > max {
            return Err(AgentError::Exhausted(format!(
                "{} protected flows would be in place; [guard] max_protected_flows is {max}",
                keys.len()
            )));
        }
        let previous = flows
            .iter()
            .filter_map(|p| st.flows.get(&key(p)).map(Entry::view))
            .collect();
        let mut changed = false;
        let mut applied = Vec::with_capacity(flows.len());
        for (i, p) in flows.iter().enumerate() {
            let ifindex = ifindexes.get(i).copied().unwrap_or(0);
            let k = key(p);
            let spec = ProtectedFlow {
                expires_ns: if p.ttl_ns == 0 {
                    0
                } else {
                    now.saturating_add(p.ttl_ns)
                },
                promoted: false,
                promotions: 0,
                ..p.clone()
            };
            if p.ttl_ns == 0 {
                changed |= st.flows.contains_key(&k);
                if !dry {
                    if let Some(e) = st.flows.remove(&k).filter(|e| e.promotion.is_some()) {
                        st.retiring.push((e, "protection removed"));
                    }
                }
                applied.push(spec);
                continue;
            }
            let entry = match st.flows.get(&k) {
                Some(e) => {
                    let same = e.spec.latency_slo_ns == p.latency_slo_ns
                        && e.spec.class_id == p.class_id
                        && e.spec.rewrite_dscp == p.rewrite_dscp;
                    changed |= !same;
                    let spec = ProtectedFlow {
                        promotions: e.spec.promotions,
                        ..spec
                    };
                    Entry {
                        spec,
                        ifindex,
                        placed: None,
                        over: 0,
                        promotion: e.promotion.clone(),
                    }
                }
                None => {
                    changed = true;
                    Entry {
                        spec,
                        ifindex,
                        placed: None,
                        over: 0,
                        promotion: None,
                    }
                }
            };
            applied.push(entry.view());
            if !dry {
                st.flows.insert(k, entry);
            }
        }
        Ok(Protected {
            changed,
            applied,
            previous,
        })
    }

    /// A protection restored from the journal, unless it has expired; never promoted.
    pub fn restore(&self, p: &ProtectedFlow, ifindex: u32, now: u64) -> bool {
        if p.expires_ns <= now || p.flow.is_none() {
            return false;
        }
        let spec = ProtectedFlow {
            promoted: false,
            ..p.clone()
        };
        let entry = Entry {
            spec,
            ifindex,
            placed: None,
            over: 0,
            promotion: None,
        };
        self.lock().flows.insert(key(p), entry);
        true
    }

    /// Every protection, as GetState and the journal show it.
    pub fn list(&self) -> Vec<ProtectedFlow> {
        self.lock().flows.values().map(Entry::view).collect()
    }

    /// Whether the micro loop acts and why not, as of its last step.
    pub fn status(&self) -> MicroLoopStatus {
        let st = self.lock();
        MicroLoopStatus {
            acting: st.acting,
            reason: st.reason.clone(),
            queue_sample_age_ns: st.tick_age_ns,
            protected_flows: st.flows.len() as u32,
        }
    }

    /// The tick the guard may act on, or why there is none.
    fn judge<'t>(
        &self,
        tick: Option<&'t QueueTick>,
        fault: &str,
        now: u64,
    ) -> (Option<&'t QueueTick>, String, u64) {
        let age = tick.map_or(0, |t| now.saturating_sub(t.taken_ns));
        let reason = match tick {
            _ if !self.settings.enabled => {
                "[guard] enabled = false: the guard moves no flow".to_string()
            }
            None if fault.is_empty() => "no queue tick yet".to_string(),
            None => format!("no queue tick: {fault}"),
            Some(_) if age > self.settings.max_tick_age_us * 1000 => format!(
                "queue tick {:.1} ms old (limit {:.1} ms)",
                ms(age),
                self.settings.max_tick_age_us as f64 / 1000.0
            ),
            Some(t) => return (Some(t), String::new(), age),
        };
        (None, reason, age)
    }

    /// One step of the guard: expiries, then (on a fresh tick it has not seen) promotions and
    /// releases. Returns the moves made, for the audit.
    pub fn step(
        &self,
        tick: Option<&QueueTick>,
        fault: &str,
        now: u64,
        hands: &dyn Hands,
    ) -> Vec<Move> {
        let (fresh, reason, age) = self.judge(tick, fault, now);
        let fresh = {
            let mut st = self.lock();
            st.acting = fresh.is_some();
            st.reason = reason;
            st.tick_age_ns = age;
            let expired = st.flows.values().any(|e| e.spec.expires_ns <= now);
            let new = fresh.filter(|t| t.taken_ns != st.last_tick_ns);
            if st.retiring.is_empty() && !expired && (st.flows.is_empty() || new.is_none()) {
                return Vec::new();
            }
            new
        };
        let mut moves = Vec::new();
        hands.with(&mut |s| moves = self.act(fresh, now, s));
        moves
    }

    fn act(&self, tick: Option<&QueueTick>, now: u64, s: &mut dyn Steering) -> Vec<Move> {
        let mut st = self.lock();
        let st = &mut *st;
        let mut moves = Vec::new();
        let expired: Vec<Key> = st
            .flows
            .iter()
            .filter(|(_, e)| e.spec.expires_ns <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in expired {
            if let Some(e) = st.flows.remove(&k).filter(|e| e.promotion.is_some()) {
                st.retiring.push((e, "protection expired"));
            }
        }
        for (e, why) in std::mem::take(&mut st.retiring) {
            let Some(p) = &e.promotion else { continue };
            let cause = format!("{why}: moved back to class {}", handle_str(p.from_class));
            match release(s, &e, p, cause, 0) {
                Ok(Some(m)) => moves.push(m),
                Ok(None) => {}
                Err(err) => {
                    st.reason = format!("moving back a flow on {}: {err}", e.spec.interface_name)
                }
            }
        }
        let Some(tick) = tick else { return moves };
        st.last_tick_ns = tick.taken_ns;
        let g = &self.settings;
        let window_start = now.saturating_sub(1_000_000_000);
        while st.changes.front().is_some_and(|&t| t < window_start) {
            st.changes.pop_front();
        }
        let mut notes: Vec<String> = Vec::new();
        let version = s.version();
        for e in st.flows.values_mut() {
            let slo = e.spec.latency_slo_ns;
            let (ifindex, class) = match &e.promotion {
                Some(p) => (p.ifindex, p.from_class),
                None => {
                    let place = match e.placed {
                        Some((v, place)) if v == version => place,
                        _ => {
                            let flow = e.spec.flow.as_ref();
                            let place = s.placement(
                                &e.spec.interface_name,
                                flow.unwrap_or(&FiveTuple::default()),
                            );
                            e.placed = Some((version, place));
                            place
                        }
                    };
                    let Some(place) = place else {
                        notes.push(format!("{} has no queue hierarchy", e.spec.interface_name));
                        continue;
                    };
                    if place.class() == e.spec.class_id {
                        continue; // already where the guard would move it
                    }
                    (e.ifindex, place.class())
                }
            };
            let Some(q) = tick.class(ifindex, class) else {
                notes.push(format!(
                    "class {} on {} is not in the queue ticks",
                    handle_str(class),
                    e.spec.interface_name
                ));
                continue;
            };
            // The monitor's estimate (backlog ÷ drain rate) leads but can read low when its
            // backlog count drifts or the rate swings; the sojourn packets just measured
            // leaving the class lags but is what they saw: judge by the larger.
            let delay = q.queue_delay_ns.max(q.sojourn_max_ns);
            let move_now = if let Some(p) = e.promotion.as_mut() {
                let held = now.saturating_sub(p.since_ns);
                let limit = (g.release_fraction * slo as f64) as u64;
                // One calm tick is not enough: a queue that drains for a moment mid-flood
                // would release the flow into it.
                p.calm_since = if delay < limit {
                    p.calm_since.or(Some(now))
                } else {
                    None
                };
                let calm = p.calm_since.map_or(0, |t| now.saturating_sub(t));
                // Calm now, and for long enough (with release_calm_ms 0, calm now suffices).
                let released = p.calm_since.is_some()
                    && held >= g.hold_ms * 1_000_000
                    && calm >= g.release_calm_ms * 1_000_000;
                released.then(|| {
                    format!(
                        "class {} queue delay {:.2} ms < release {:.2} ms ({} × SLO {:.1} ms) for {:.2} s, after {:.1} s promoted",
                        handle_str(class),
                        ms(delay),
                        ms(limit),
                        g.release_fraction,
                        ms(slo),
                        calm as f64 / 1e9,
                        held as f64 / 1e9
                    )
                })
            } else {
                let limit = (g.guard_fraction * slo as f64) as u64;
                // A queue over the threshold for a single tick is a burst draining (e.g. the
                // flow's own frame), not congestion: it must last `promote_ticks` ticks.
                e.over = if delay >= limit {
                    e.over.saturating_add(1)
                } else {
                    0
                };
                (e.over >= g.promote_ticks).then(|| {
                    format!(
                        "class {} queue delay {:.2} ms >= guard {:.2} ms ({} × SLO {:.1} ms) for {} tick(s)",
                        handle_str(class),
                        ms(delay),
                        ms(limit),
                        g.guard_fraction,
                        ms(slo),
                        e.over
                    )
                })
            };
            let Some(cause) = move_now else { continue };
            if st.changes.len() >= g.max_changes_per_s as usize {
                notes.push(format!(
                    "change cap reached ({} a second)",
                    g.max_changes_per_s
                ));
                break;
            }
            let result = match e.promotion.clone() {
                // Moved back, or superseded by another rule: no longer promoted either way.
                Some(p) => release(s, e, &p, cause, tick.taken_ns).inspect(|_| e.promotion = None),
                None => promote(s, e, ifindex, class, cause, tick.taken_ns, now),
            };
            match result {
                Ok(Some(m)) => {
                    st.changes.push_back(now);
                    moves.push(m);
                }
                Ok(None) => {}
                Err(err) => {
                    notes.push(format!("moving a flow on {}: {err}", e.spec.interface_name))
                }
            }
        }
        if !notes.is_empty() {
            notes.dedup();
            st.reason = notes.join("; ");
        }
        moves
    }
}

fn promote(
    s: &mut dyn Steering,
    e: &mut Entry,
    ifindex: u32,
    from_class: u32,
    cause: String,
    seen_ns: u64,
    now: u64,
) -> AgentResult<Option<Move>> {
    let flow = e.spec.flow.clone().unwrap_or_default();
    let from = s
        .placement(&e.spec.interface_name, &flow)
        .and_then(|p| p.rule);
    let to = Rule {
        class_id: e.spec.class_id,
        rewrite_dscp: e.spec.rewrite_dscp,
    };
    let started = Instant::now();
    s.set_rule(&e.spec.interface_name, &flow, Some(to))?;
    let latency = started.elapsed().as_nanos() as u64;
    e.over = 0;
    e.promotion = Some(Promotion {
        since_ns: now,
        calm_since: None,
        ifindex,
        from,
        from_class,
        to,
    });
    e.spec.promotions += 1;
    Ok(Some(Move {
        kind: MoveKind::Promote,
        interface: e.spec.interface_name.clone(),
        flow,
        to: Some(to),
        to_class: to.class_id,
        previous: from,
        cause,
        seen_ns,
        applied_ns: now_ns(),
        apply_latency_ns: latency,
        dry_run: s.dry_run(),
    }))
}

/// Moves a promoted flow back to its rule, unless that rule changed since the promotion (the
/// global loop set another one: it wins, nothing is written).
fn release(
    s: &mut dyn Steering,
    e: &Entry,
    p: &Promotion,
    cause: String,
    seen_ns: u64,
) -> AgentResult<Option<Move>> {
    let flow = e.spec.flow.clone().unwrap_or_default();
    let Some(place) = s.placement(&e.spec.interface_name, &flow) else {
        return Ok(None);
    };
    if place.rule != p.from {
        return Ok(None);
    }
    let started = Instant::now();
    s.set_rule(&e.spec.interface_name, &flow, p.from)?;
    let latency = started.elapsed().as_nanos() as u64;
    Ok(Some(Move {
        kind: MoveKind::Release,
        interface: e.spec.interface_name.clone(),
        flow,
        to: p.from,
        to_class: place.class(),
        previous: Some(p.to),
        cause,
        seen_ns,
        applied_ns: now_ns(),
        apply_latency_ns: latency,
        dry_run: s.dry_run(),
    }))
}

/// The queue view of an agent without a queue monitor: the guard never acts, and says why.
pub struct NoQueues(pub String);

impl QueueView for NoQueues {
    fn latest(&self) -> Option<Arc<QueueTick>> {
        None
    }
    fn fault(&self) -> String {
        self.0.clone()
    }
}

/// The guard's thread: a step every `poll_interval_us`; the moves go to `on_move` (the audit).
/// Stops when `stop` is set.
pub fn spawn(
    guard: Arc<Guard>,
    view: Arc<dyn QueueView>,
    hands: Arc<dyn Hands>,
    on_move: impl Fn(&Move) + Send + 'static,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let period = Duration::from_micros(guard.settings.poll_interval_us);
    std::thread::Builder::new().name("latency-guard".into()).spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(period);
            let tick = view.latest();
            let fault = if tick.is_none() { view.fault() } else { String::new() };
            for m in guard.step(tick.as_deref(), &fault, now_ns(), hands.as_ref()) {
                tracing::info!(interface = m.interface, kind = ?m.kind, "latency guard: {}", m.cause);
                on_move(&m);
            }
        }
    })
}
