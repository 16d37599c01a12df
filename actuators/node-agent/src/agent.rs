//! The agent: validates requests against the bounds, applies them to the kernel (netlink, BPF
//! maps, sysfs), keeps the desired state in the journal, answers repeated action ids, and reads
//! the applied state back from the kernel.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use cgloop_proto::host::now_ns;
use cgloop_proto::v1::*;
use prost::Message;
use tokio::sync::watch;

use crate::bounds::Guard;
use crate::chains;
use crate::config::Config;
use crate::datapath::{self, Datapath, FlowKey, FlowRule, KEEP};
use crate::error::{AgentError, AgentResult};
use crate::guard::{self as micro, Guard as MicroGuard};
use crate::journal::{ActionLog, GroupCommit, Journal, Replay, Snapshot};
use crate::netif::{ifindex, ifname, Ifs};
use crate::power_glue::Power;
use crate::probes::Probes;
use crate::queues;
use crate::tc::{handle_str, Rtnl};
use crate::{invalid, out_of_bounds};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Desired state: what callers asked for, keyed the way requests address it.
#[derive(Debug, Default, Clone)]
struct Desired {
    queues: BTreeMap<String, QueueHierarchy>,
    /// (interface, encoded FiveTuple) -> rule.
    flows: BTreeMap<(String, Vec<u8>), FlowClassRule>,
    dscp: BTreeMap<(String, u32), FlowClassRule>,
    /// traffic class -> chain.
    chains: BTreeMap<String, ServiceChain>,
    impairments: BTreeMap<(String, Vec<u8>), Impairment>,
    probes: BTreeMap<String, ProbeSpec>,
    power: Vec<PowerPolicy>,
}

impl Desired {
    fn to_state(&self, node_id: &str, generation: u64) -> NodeState {
        NodeState {
            node_id: node_id.to_string(),
            agent_version: VERSION.to_string(),
            generation,
            timestamp_ns: now_ns(),
            queues: self.queues.values().cloned().collect(),
            flow_classes: self.flows.values().chain(self.dscp.values()).cloned().collect(),
            power_policies: self.power.clone(),
            chains: self.chains.values().cloned().collect(),
            probes: self.probes.values().cloned().collect(),
            impairments: self.impairments.values().cloned().collect(),
            ..Default::default()
        }
    }
}

struct Inner {
    config: Config,
    rtnl: Rtnl,
    dp: Datapath,
    desired: Desired,
    /// traffic class -> (slot pair, which of the two is active).
    chain_slots: BTreeMap<String, (u32, u32)>,
    actions: ActionLog,
    /// Changes applied so far (1, 2, 3…): the journal's commit sequence.
    seq: u64,
    /// Actions applied but not yet handed to the journal writer, in order.
    pending: Vec<JournalEntry>,
    generation: u64,
    power: Power,
    probes: Probes,
    /// The AF_XDP runtime of advanced functions, started with the first chain that has one.
    advanced: Option<crate::advanced::Advanced>,
    /// The latency guard's protections (ProtectFlows); its thread steers through [`Inner`].
    micro: Arc<MicroGuard>,
}

pub struct Agent {
    inner: Arc<Mutex<Inner>>,
    /// The queue monitor (1 ms queue ticks) and the L4S class's queue protection.
    monitor: Arc<crate::qmon::Monitor>,
    protection: Option<Arc<crate::qprot::Protection>>,
    watch: watch::Sender<(NodeState, String)>,
    /// The journal writer: changes are persisted off the RPC path (group commit).
    commit: GroupCommit,
    /// Answer a change only once it is in the journal (the pre-group-commit behaviour).
    sync_ack: bool,
}

/// Result of one mutating call before it is wrapped in its response message.
struct Applied {
    changed: bool,
    message: String,
}

fn kernel<E: Into<anyhow::Error>>(what: &str) -> impl FnOnce(E) -> AgentError + '_ {
    move |e| AgentError::Kernel(e.into().context(what.to_string()))
}

/// Every refused or failed change is logged (a refusal of the bounds is what an operator
/// looks for when the loop misbehaves or someone probes the agent).
fn refused(method: &str, action_id: &str, e: &AgentError) {
    match e {
        AgentError::Kernel(_) => tracing::error!(method, action_id, "failed: {e}"),
        AgentError::Forbidden(_) | AgentError::OutOfBounds(_) => {
            tracing::warn!(method, action_id, "refused by the bounds: {e}")
        }
        _ => tracing::warn!(method, action_id, "refused: {e}"),
    }
}

fn require_action_id(id: &str) -> AgentResult<()> {
    if id.is_empty() {
        invalid!("action_id is empty: every change needs an idempotency key");
    }
    if id.len() > 256 {
        invalid!("action_id is {} bytes long; at most 256", id.len());
    }
    Ok(())
}

fn five_tuple_key(ifindex: u32, f: &FiveTuple) -> AgentResult<FlowKey> {
    if f.ip_protocol > 255 {
        invalid!("flow.ip_protocol {} is not within 0..255", f.ip_protocol);
    }
    for (what, p) in [("src_port", f.src_port), ("dst_port", f.dst_port)] {
        if p > 65535 {
            invalid!("flow.{what} {p} is not within 0..65535");
        }
    }
    datapath::flow_key(
        ifindex,
        &f.src_addr,
        &f.dst_addr,
        f.ip_protocol as u8,
        f.src_port as u16,
        f.dst_port as u16,
    )
    .ok_or_else(|| {
        AgentError::Invalid(format!(
            "flow addresses must both be 4 (IPv4) or 16 (IPv6) bytes; got {} and {}",
            f.src_addr.len(),
            f.dst_addr.len()
        ))
    })
}


fn strip_counters_rule(r: &FlowClassRule) -> FlowClassRule {
    FlowClassRule { matched_packets: 0, ..r.clone() }
}

impl Inner {
    /// The bounds of this agent (every request path checks through it).
    fn guard(&self) -> Guard<'_> {
        Guard::new(&self.config.bounds)
    }

    /// An interface a request names (`field`), within the bounds; its ifindex.
    fn check_interface(&self, field: &str, name: &str) -> AgentResult<u32> {
        self.guard().interface(field, name)?;
        ifindex(name)
    }

    fn hierarchy(&self, iface: &str) -> AgentResult<&QueueHierarchy> {
        self.desired.queues.get(iface).ok_or_else(|| {
            AgentError::Precondition(format!(
                "interface {iface} has no queue hierarchy from this agent; apply one first"
            ))
        })
    }

    /// What the journal writer commits next: the current desired state and the actions
    /// applied since its previous snapshot.
    fn snapshot(&mut self) -> Snapshot {
        let mut state = self.desired.to_state(&self.config.node_id, self.generation);
        state.protected_flows = self.micro.list();
        Snapshot { seq: self.seq, state, actions: std::mem::take(&mut self.pending) }
    }

    // --- queues -------------------------------------------------------------------------

    fn apply_hierarchy(&mut self, h: &QueueHierarchy, dry: bool) -> AgentResult<Applied> {
        let ifindex = self.check_interface("hierarchy.interface_name", &h.interface_name)?;
        let ordered = queues::validate(h, &self.config.bounds)?;
        let iface = h.interface_name.clone();
        // Flow and DSCP rules must keep pointing at leaves.
        let leaves = queues::leaves(h);
        for r in self.desired.flows.values().chain(self.desired.dscp.values()) {
            if r.interface_name == iface && !leaves.contains(&r.class_id) {
                return Err(AgentError::Precondition(format!(
                    "class {} is used by a flow/DSCP rule on {iface} and would no longer be a \
                     leaf class; move the rule first",
                    handle_str(r.class_id)
                )));
            }
        }
        let root = self.rtnl.htb_root(ifindex).map_err(kernel("reading the root qdisc"))?;
        let current = match root {
            Some(_) => self.rtnl.classes(ifindex).map_err(kernel("reading classes"))?,
            None => Vec::new(),
        };
        if ordered.is_empty() {
            let changed = root.is_some();
            if !dry {
                if changed {
                    self.rtnl.delete_root(ifindex).map_err(kernel("deleting the HTB root"))?;
                }
                let _ = self.dp.detach(ifindex);
                self.desired.queues.remove(&iface);
                self.desired.flows.retain(|(i, _), _| *i != iface);
                self.desired.dscp.retain(|(i, _), _| *i != iface);
            }
            return Ok(Applied { changed, message: format!("tc qdisc del dev {iface} root") });
        }
        let steps = queues::plan(root, &current, &ordered, h.default_class_id);
        let message = steps
            .iter()
            .map(|s| match s {
                queues::Step::Root(r) => {
                    format!("tc qdisc replace dev {iface} root handle {:x}: htb default {:x}", r.handle >> 16, r.default_minor)
                }
                queues::Step::Delete(c) => format!("tc class del dev {iface} classid {}", handle_str(*c)),
                queues::Step::Create(s) | queues::Step::Change(s) => format!(
                    "tc class {} dev {iface} parent {} classid {} htb rate {}bit ceil {}bit burst {} cburst {} prio {}",
                    if matches!(s_kind(s, &steps), true) { "add" } else { "change" },
                    handle_str(s.parent),
                    handle_str(s.handle),
                    s.rate_bytes * 8,
                    s.ceil_bytes * 8,
                    s.burst_bytes,
                    s.cburst_bytes,
                    s.prio
                ),
            })
            .collect::<Vec<_>>()
            .join("; ");
        let changed = !steps.is_empty();
        if dry {
            return Ok(Applied { changed, message });
        }
        for step in &steps {
            match step {
                queues::Step::Root(r) => self.rtnl.replace_htb_root(ifindex, *r),
                queues::Step::Delete(c) => self.rtnl.delete_class(ifindex, *c),
                queues::Step::Create(s) => self.rtnl.set_class(ifindex, s, true),
                queues::Step::Change(s) => self.rtnl.set_class(ifindex, s, false),
            }
            .map_err(kernel("applying the queue hierarchy"))?;
        }
        self.dp.attach(ifindex).map_err(kernel("attaching the classifier"))?;
        self.dp
            .set_default_class(ifindex, h.default_class_id)
            .map_err(kernel("setting the default class"))?;
        let mut stored = h.clone();
        for c in &mut stored.classes {
            c.sent_packets = 0;
            c.sent_bytes = 0;
            c.dropped_packets = 0;
        }
        self.desired.queues.insert(iface.clone(), stored);
        self.relink_chains(&iface, ifindex)?;
        Ok(Applied { changed, message })
    }

    fn read_hierarchy(&mut self, iface: &str) -> AgentResult<Option<QueueHierarchy>> {
        let ifindex = match ifindex(iface) {
            Ok(i) => i,
            Err(_) => return Ok(None),
        };
        let Some(root) = self.rtnl.htb_root(ifindex).map_err(kernel("reading the root qdisc"))? else {
            return Ok(None);
        };
        let classes = self.rtnl.classes(ifindex).map_err(kernel("reading classes"))?;
        let names: BTreeMap<u32, String> = self
            .desired
            .queues
            .get(iface)
            .map(|h| h.classes.iter().map(|c| (c.class_id, c.name.clone())).collect())
            .unwrap_or_default();
        Ok(Some(queues::from_kernel(iface, root, &classes, &names)))
    }

    fn set_class_rate(&mut self, r: &SetClassRateRequest, dry: bool) -> AgentResult<(Applied, HtbClass, HtbClass)> {
        let ifindex = self.check_interface("interface_name", &r.interface_name)?;
        let h = self.hierarchy(&r.interface_name)?.clone();
        let Some(class) = h.classes.iter().find(|c| c.class_id == r.class_id) else {
            return Err(queues::not_found_class(&r.interface_name, r.class_id));
        };
        {
            // The hierarchy as it would be: the same checks as a whole hierarchy (bounds, the
            // parent's ceil over this class, this class's ceil over its children).
            let mut changed = h.clone();
            for c in changed.classes.iter_mut().filter(|c| c.class_id == r.class_id) {
                c.rate_bps = r.rate_bps;
                c.ceil_bps = r.ceil_bps;
            }
            queues::validate(&changed, &self.config.bounds)?;
        }
        let previous = self
            .read_hierarchy(&r.interface_name)?
            .and_then(|k| k.classes.into_iter().find(|c| c.class_id == r.class_id))
            .ok_or_else(|| queues::not_found_class(&r.interface_name, r.class_id))?;
        let mut new = class.clone();
        new.rate_bps = r.rate_bps;
        new.ceil_bps = r.ceil_bps;
        let spec = queues::spec(&new);
        let changed = previous.rate_bps != r.rate_bps || previous.ceil_bps != r.ceil_bps;
        let message = format!(
            "tc class change dev {} classid {} htb rate {}bit ceil {}bit",
            r.interface_name,
            handle_str(r.class_id),
            r.rate_bps,
            r.ceil_bps
        );
        if !dry {
            self.rtnl.set_class(ifindex, &spec, false).map_err(kernel("changing the class rate"))?;
            if let Some(h) = self.desired.queues.get_mut(&r.interface_name) {
                if let Some(c) = h.classes.iter_mut().find(|c| c.class_id == r.class_id) {
                    *c = new.clone();
                }
            }
        }
        Ok((Applied { changed, message }, new, previous))
    }

    // --- flows --------------------------------------------------------------------------

    fn set_flow_class(&mut self, rule: &FlowClassRule, dry: bool) -> AgentResult<(Applied, Option<FlowClassRule>)> {
        let ifindex = self.check_interface("rule.interface_name", &rule.interface_name)?;
        let iface = rule.interface_name.clone();
        if rule.class_id != 0 {
            let h = self.hierarchy(&iface)?;
            if !queues::leaves(h).contains(&rule.class_id) {
                if h.classes.iter().any(|c| c.class_id == rule.class_id) {
                    invalid!("class {} on {iface} has children; steer flows into a leaf class", handle_str(rule.class_id));
                }
                return Err(queues::not_found_class(&iface, rule.class_id));
            }
        }
        if let Some(d) = rule.rewrite_dscp {
            if d > 63 {
                invalid!("rewrite_dscp {d} is not within 0..63");
            }
        }
        let bpf_rule = FlowRule { classid: rule.class_id, rewrite_dscp: rule.rewrite_dscp.unwrap_or(KEEP) };
        let stored = strip_counters_rule(rule);
        match (&rule.flow, rule.match_dscp) {
            (Some(_), Some(_)) => invalid!("set either flow or match_dscp, not both"),
            (None, None) => invalid!("rule needs a flow (5-tuple) or match_dscp"),
            (None, Some(dscp)) => {
                if dscp > 63 {
                    invalid!("match_dscp {dscp} is not within 0..63");
                }
                let key = (iface.clone(), dscp);
                let previous = self.desired.dscp.get(&key).cloned();
                let changed = previous.as_ref() != Some(&stored) && !(previous.is_none() && rule.class_id == 0);
                if !dry {
                    self.dp
                        .set_dscp_rule(ifindex, dscp, (rule.class_id != 0).then_some(bpf_rule))
                        .map_err(kernel("updating the DSCP rule map"))?;
                    if rule.class_id == 0 {
                        self.desired.dscp.remove(&key);
                    } else {
                        self.desired.dscp.insert(key, stored);
                    }
                }
                let message = format!("dscp {dscp} on {iface} -> class {}", handle_str(rule.class_id));
                Ok((Applied { changed, message }, previous))
            }
            (Some(flow), None) => {
                let bpf_key = five_tuple_key(ifindex, flow)?;
                let key = (iface.clone(), flow.encode_to_vec());
                let previous = self.desired.flows.get(&key).cloned();
                if previous.is_none() && rule.class_id != 0 && self.desired.flows.len() >= self.config.bounds.max_flow_rules {
                    out_of_bounds!("{} flow rules in place; the bound is {}", self.desired.flows.len(), self.config.bounds.max_flow_rules);
                }
                let changed = previous.as_ref() != Some(&stored) && !(previous.is_none() && rule.class_id == 0);
                if !dry {
                    self.dp
                        .set_flow(&bpf_key, (rule.class_id != 0).then_some(bpf_rule))
                        .map_err(kernel("updating the flow map"))?;
                    if rule.class_id == 0 {
                        self.desired.flows.remove(&key);
                    } else {
                        self.desired.flows.insert(key, stored);
                    }
                }
                let message = format!("bpf map flow_class update on {iface} -> class {}", handle_str(rule.class_id));
                Ok((Applied { changed, message }, previous))
            }
        }
    }

    // --- chains -------------------------------------------------------------------------

    /// Classes named `traffic_class` on every managed interface: (ifindex, classid).
    fn class_targets(&self, traffic_class: &str) -> Vec<(u32, u32)> {
        self.desired
            .queues
            .iter()
            .filter_map(|(iface, h)| {
                let c = h.classes.iter().find(|c| c.name == traffic_class)?;
                Some((ifindex(iface).ok()?, c.class_id))
            })
            .collect()
    }

    fn set_chain(&mut self, chain: &ServiceChain, dry: bool) -> AgentResult<(Applied, Option<ServiceChain>)> {
        let compiled = chains::compile(chain, &self.guard(), &Ifs)?;
        let targets = self.class_targets(&chain.traffic_class);
        if targets.is_empty() && !chain.functions.is_empty() {
            return Err(AgentError::Precondition(format!(
                "no queue hierarchy has a class named {:?}; apply one first",
                chain.traffic_class
            )));
        }
        let previous = self.desired.chains.get(&chain.traffic_class).cloned();
        let mut stored = chain.clone();
        for f in &mut stored.functions {
            f.packets = 0;
            f.dropped_packets = 0;
        }
        let changed = previous.as_ref() != Some(&stored) && !(previous.is_none() && chain.functions.is_empty());
        let message = format!(
            "chain {:?} for class {:?}: [{}] on {} interface(s)",
            chain.chain_id,
            chain.traffic_class,
            chain.functions.iter().map(|f| f.name()).collect::<Vec<_>>().join(" -> "),
            targets.len()
        );
        if dry {
            return Ok((Applied { changed, message }, previous));
        }
        if chain.functions.is_empty() {
            for (ifindex, classid) in targets {
                self.dp.link_chain(ifindex, classid, None).map_err(kernel("unlinking the chain"))?;
            }
            self.desired.chains.remove(&chain.traffic_class);
            self.chain_slots.remove(&chain.traffic_class);
            return Ok((Applied { changed, message }, previous));
        }
        let (pair, active) = match self.chain_slots.get(&chain.traffic_class) {
            Some(&(pair, active)) => (pair, active),
            None => {
                if self.chain_slots.len() >= self.config.bounds.max_chains {
                    out_of_bounds!("{} chains in place; the bound is {}", self.chain_slots.len(), self.config.bounds.max_chains);
                }
                let used: Vec<u32> = self.chain_slots.values().map(|(p, _)| *p).collect();
                let pair = (0..datapath::MAX_CHAIN_SLOTS / 2).find(|p| !used.contains(p)).unwrap_or(0);
                (pair, 1) // first install goes to slot 0 of the pair
            }
        };
        let next = 1 - active;
        let slot = pair * 2 + next;
        let chains::Compiled { bpf: mut compiled, advanced, instance_cores } = compiled;
        let mut undo = None;
        if !advanced.is_empty() {
            let started = self.advanced.is_none();
            if started {
                let adv = crate::advanced::Advanced::start(
                    &self.dp,
                    &self.config.advanced_port,
                    self.config.advanced_busy_poll_us,
                    self.config.advanced_rt_priority,
                )
                .map_err(|e| AgentError::Kernel(e.context("starting the AF_XDP runtime of advanced functions")))?;
                self.advanced = Some(adv);
            }
            let Some(adv) = self.advanced.as_mut() else { unreachable!("started above") };
            // Natif's scale-out: the instances run and are pinned before the class points at
            // the slot that uses them; a failure here or below leaves the previous chain.
            let scaled = adv.scale(&self.dp, &instance_cores).map_err(|e| {
                AgentError::Kernel(e.context(format!("running {} AF_XDP instance(s)", instance_cores.len())))
            });
            let scaled = match scaled {
                Ok(u) => u,
                Err(e) => {
                    if started {
                        self.advanced = None;
                    }
                    return Err(e);
                }
            };
            let to_user = (compiled.len as usize).saturating_sub(1).min(datapath::MAX_CHAIN_FNS - 1);
            compiled.fns[to_user].a = adv.port();
            undo = Some((scaled, started));
            let prepared = (|| {
                for &(ifindex, _) in &targets {
                    if ifindex > 0xffff {
                        return Err(AgentError::Precondition(format!(
                            "interface index {ifindex} does not fit the 16-bit tag of advanced functions"
                        )));
                    }
                    let mac = self.rtnl.mac(ifindex).map_err(|e| AgentError::Kernel(e.into()))?;
                    self.dp.set_adv_if_mac(ifindex, mac).map_err(kernel("recording the interface address"))?;
                }
                Ok(())
            })();
            if let Err(e) = prepared {
                self.undo_advanced(undo.take());
                return Err(e);
            }
            // Published before the class points at the slot: a frame tagged with the new slot
            // always finds its functions.
            if let Some(adv) = &self.advanced {
                adv.install(slot, crate::advanced::AdvChain { fns: advanced });
            }
        }
        // The class → slot stores, one per interface; if one fails, the interfaces already
        // switched go back to the previous slot (or none), so the chain is the previous one.
        let previous_slot = self.chain_slots.get(&chain.traffic_class).map(|&(p, a)| p * 2 + a);
        for (done, &(ifindex, classid)) in targets.iter().enumerate() {
            if let Err(e) = self.dp.install_chain(ifindex, classid, slot, &compiled) {
                for &(ifi, cid) in &targets[..done] {
                    if let Err(e) = self.dp.link_chain(ifi, cid, previous_slot) {
                        tracing::error!("rolling chain {:?} back on ifindex {ifi}: {e:#}", chain.chain_id);
                    }
                }
                self.undo_advanced(undo.take());
                return Err(AgentError::Kernel(e.context("installing the chain")));
            }
        }
        self.chain_slots.insert(chain.traffic_class.clone(), (pair, next));
        self.desired.chains.insert(chain.traffic_class.clone(), stored);
        Ok((Applied { changed, message }, previous))
    }

    /// Reverts what a failed chain change did to the AF_XDP runtime (instances it started or
    /// re-pinned; the runtime itself when it started it).
    fn undo_advanced(&mut self, undo: Option<(crate::advanced::Undo, bool)>) {
        let Some((undo, started)) = undo else { return };
        if started {
            self.advanced = None;
        } else if let Some(adv) = self.advanced.as_mut() {
            adv.undo(&self.dp, undo);
        }
    }

    /// The AF_XDP workers the chains in place use, with their functions' counters.
    fn worker_readings(&self) -> Vec<crate::advanced::WorkerReading> {
        let Some(adv) = &self.advanced else { return Vec::new() };
        let slots: Vec<u32> = self.chain_slots.values().map(|&(pair, active)| pair * 2 + active).collect();
        let used = self
            .desired
            .chains
            .values()
            .flat_map(|c| c.functions.iter().map(|f| chains::instance_cores(f).len()))
            .max()
            .unwrap_or(0);
        adv.readings(&slots, used)
    }

    /// Re-points the classes of one interface at their chains (after its hierarchy changed).
    fn relink_chains(&mut self, iface: &str, ifindex: u32) -> AgentResult<()> {
        for (ifi, classid, _) in self.dp.chain_links().map_err(kernel("reading chain links"))? {
            if ifi == ifindex {
                self.dp.link_chain(ifi, classid, None).map_err(kernel("unlinking chains"))?;
            }
        }
        let Some(h) = self.desired.queues.get(iface) else { return Ok(()) };
        for (class, &(pair, active)) in &self.chain_slots {
            if let Some(c) = h.classes.iter().find(|c| &c.name == class) {
                self.dp
                    .link_chain(ifindex, c.class_id, Some(pair * 2 + active))
                    .map_err(kernel("linking a chain"))?;
            }
        }
        Ok(())
    }

    // --- impairments --------------------------------------------------------------------

    fn set_impairment(&mut self, imp: &Impairment, dry: bool) -> AgentResult<(Applied, Option<Impairment>)> {
        let ifindex = self.check_interface("impairment.interface_name", &imp.interface_name)?;
        let Some(flow) = &imp.flow else { invalid!("impairment.flow is missing") };
        let bpf_key = five_tuple_key(ifindex, flow)?;
        let f = imp.drop_fraction;
        if !(0.0..=1.0).contains(&f) || f.is_nan() {
            invalid!("drop_fraction {f} is not within 0..1");
        }
        if f > self.config.bounds.max_drop_fraction {
            out_of_bounds!("drop_fraction {f} exceeds the bound {}", self.config.bounds.max_drop_fraction);
        }
        let key = (imp.interface_name.clone(), flow.encode_to_vec());
        let previous = self.desired.impairments.get(&key).cloned();
        if previous.is_none() && f > 0.0 && self.desired.impairments.len() >= self.config.bounds.max_impairments {
            out_of_bounds!("{} impairments in place; the bound is {}", self.desired.impairments.len(), self.config.bounds.max_impairments);
        }
        let stored = Impairment { seen_packets: 0, dropped_packets: 0, ..imp.clone() };
        let changed = previous.as_ref() != Some(&stored) && !(previous.is_none() && f == 0.0);
        // P(drop) = threshold / 2^32 with a uniform 32-bit random number per packet.
        let threshold = (f * 4_294_967_296.0).round().min(u32::MAX as f64) as u32;
        if !dry {
            self.dp
                .set_impairment(&bpf_key, (f > 0.0).then_some(threshold))
                .map_err(kernel("updating the impairment map"))?;
            if f > 0.0 {
                self.desired.impairments.insert(key, stored);
            } else {
                self.desired.impairments.remove(&key);
            }
        }
        let message = format!("drop {:.4} of the flow on {} (threshold {threshold})", f, imp.interface_name);
        Ok((Applied { changed, message }, previous))
    }

    // --- protected flows (the latency guard) ---------------------------------------------

    fn protect_flows(&mut self, req: &ProtectFlowsRequest, dry: bool) -> AgentResult<(Applied, micro::Protected)> {
        if req.flows.is_empty() {
            invalid!("flows is empty: name a flow to protect (or to release with ttl_ns 0)");
        }
        let mut ifindexes = Vec::with_capacity(req.flows.len());
        for (i, p) in req.flows.iter().enumerate() {
            let field = format!("flows[{i}]");
            self.guard().protected_flow(&field, p)?;
            let ifindex = ifindex(&p.interface_name)?;
            if let Some(f) = &p.flow {
                five_tuple_key(ifindex, f).map_err(|e| match e {
                    AgentError::Invalid(m) => AgentError::Invalid(format!("{field}: {m}")),
                    e => e,
                })?;
            }
            if p.ttl_ns > 0 {
                let iface = &p.interface_name;
                let h = self.hierarchy(iface)?;
                if !queues::leaves(h).contains(&p.class_id) {
                    let what = if h.classes.iter().any(|c| c.class_id == p.class_id) { "has children" } else { "does not exist" };
                    return Err(AgentError::Precondition(format!(
                        "{field}.class_id {}: the class {what} in {iface}'s hierarchy; name a leaf class",
                        handle_str(p.class_id)
                    )));
                }
            }
            ifindexes.push(ifindex);
        }
        let done = self.micro.protect(&req.flows, &ifindexes, now_ns(), dry)?;
        let (on, off) = req.flows.iter().partition::<Vec<_>, _>(|p| p.ttl_ns > 0);
        let message = format!("latency guard: {} flow(s) protected, {} released", on.len(), off.len());
        Ok((Applied { changed: done.changed, message }, done))
    }

    // --- read-back ----------------------------------------------------------------------

    fn read_state(&mut self) -> AgentResult<NodeState> {
        let mut state = NodeState {
            node_id: self.config.node_id.clone(),
            agent_version: VERSION.to_string(),
            generation: self.generation,
            timestamp_ns: now_ns(),
            ..Default::default()
        };
        let ifaces: Vec<String> = self.desired.queues.keys().cloned().collect();
        for iface in &ifaces {
            if let Some(h) = self.read_hierarchy(iface)? {
                state.queues.push(h);
            }
            let prog = ifindex(iface).ok().and_then(|i| self.dp.attached_prog_id(i)).unwrap_or(0);
            state.classifiers.push(ClassifierAttachment { interface_name: iface.clone(), bpf_prog_id: prog });
        }
        for (key, rule, counters) in self.dp.flows().map_err(kernel("reading the flow map"))? {
            state.flow_classes.push(FlowClassRule {
                interface_name: ifname(key.ifindex),
                flow: Some(datapath::key_tuple(&key)),
                class_id: rule.classid,
                rewrite_dscp: (rule.rewrite_dscp != KEEP).then_some(rule.rewrite_dscp),
                match_dscp: None,
                matched_packets: counters.packets,
            });
        }
        for (ifi, dscp, rule) in self.dp.dscp_rules().map_err(kernel("reading the DSCP map"))? {
            state.flow_classes.push(FlowClassRule {
                interface_name: ifname(ifi),
                flow: None,
                class_id: rule.classid,
                rewrite_dscp: (rule.rewrite_dscp != KEEP).then_some(rule.rewrite_dscp),
                match_dscp: Some(dscp),
                matched_packets: 0,
            });
        }
        // Chains: decoded from the slot each class points at, with the slot's counters.
        let links = self.dp.chain_links().map_err(kernel("reading chain links"))?;
        for (class, chain) in &self.desired.chains {
            let Some(&(pair, active)) = self.chain_slots.get(class) else { continue };
            let slot = pair * 2 + active;
            if !links.iter().any(|(_, _, s)| *s == slot) {
                continue; // not linked in the kernel: not applied
            }
            let compiled = self.dp.chain(slot).map_err(kernel("reading a chain"))?;
            let mut functions = chains::decompile(&compiled, &Ifs);
            for (pos, f) in functions.iter_mut().enumerate() {
                let c = self.dp.fn_counters(slot, pos as u32).map_err(kernel("reading chain counters"))?;
                f.packets = c.packets;
                f.dropped_packets = c.dropped;
                if let Some(asked) = chain.functions.get(pos) {
                    f.core = asked.core;
                    f.instances = asked.instances;
                    f.instance_cores = asked.instance_cores.clone();
                }
            }
            // The hand-over step stands for the advanced functions behind it (user space).
            if functions.last().is_some_and(chains::is_hand_over) {
                functions.pop();
                if let Some(adv) = self.advanced.as_ref().and_then(|a| a.chain(slot)) {
                    for a in &adv.fns {
                        let asked = chain.functions.get(functions.len());
                        let (packets, dropped_packets) = a.totals();
                        functions.push(ChainFunction {
                            function: Some(a.f.function()),
                            kind: cgloop_proto::v1::FunctionKind::Advanced as i32,
                            core: asked.map_or(0, |f| f.core),
                            instances: asked.map_or(0, |f| f.instances),
                            instance_cores: asked.map(|f| f.instance_cores.clone()).unwrap_or_default(),
                            packets,
                            dropped_packets,
                        });
                    }
                }
            }
            state.chains.push(ServiceChain {
                chain_id: chain.chain_id.clone(),
                traffic_class: class.clone(),
                functions,
            });
        }
        for (key, imp) in self.dp.impairments().map_err(kernel("reading the impairment map"))? {
            state.impairments.push(Impairment {
                interface_name: ifname(key.ifindex),
                flow: Some(datapath::key_tuple(&key)),
                drop_fraction: imp.threshold as f64 / 4_294_967_296.0,
                seen_packets: imp.seen,
                dropped_packets: imp.dropped,
            });
        }
        state.probes = self.probes.specs();
        state.probe_status = self.probes.status();
        state.power_policies = self.power.policies();
        state.protected_flows = self.micro.list();
        state.micro_loop = Some(self.micro.status());
        Ok(state)
    }
}

/// The guard's hands: the flow rules of the agent, under its lock.
impl micro::Steering for Inner {
    fn placement(&self, interface: &str, flow: &FiveTuple) -> Option<micro::Placement> {
        let h = self.desired.queues.get(interface)?;
        let rule = self.desired.flows.get(&(interface.to_string(), flow.encode_to_vec()));
        Some(micro::Placement {
            rule: rule.map(|r| micro::Rule { class_id: r.class_id, rewrite_dscp: r.rewrite_dscp }),
            default_class: h.default_class_id,
        })
    }

    /// The datapath write SetFlowClass makes, without the desired state (a promotion is not
    /// journalled: after a restart the flow has its own rule again).
    fn set_rule(&mut self, interface: &str, flow: &FiveTuple, rule: Option<micro::Rule>) -> AgentResult<()> {
        if let Some(r) = rule {
            if !queues::leaves(self.hierarchy(interface)?).contains(&r.class_id) {
                return Err(queues::not_found_class(interface, r.class_id));
            }
        }
        if self.config.dry_run {
            return Ok(());
        }
        let key = five_tuple_key(ifindex(interface)?, flow)?;
        let bpf = rule.map(|r| FlowRule { classid: r.class_id, rewrite_dscp: r.rewrite_dscp.unwrap_or(KEEP) });
        self.dp.set_flow(&key, bpf).map_err(kernel("updating the flow map"))
    }

    fn dry_run(&self) -> bool {
        self.config.dry_run
    }

    fn version(&self) -> u64 {
        self.generation
    }
}

/// Lends the locked agent to the guard's thread.
struct Locked(Arc<Mutex<Inner>>);

impl micro::Hands for Locked {
    fn with(&self, f: &mut dyn FnMut(&mut dyn micro::Steering)) {
        f(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Turns apply results into the common outcome.
fn outcome(a: &Applied, dry: bool, started: Instant) -> ApplyOutcome {
    ApplyOutcome {
        changed: a.changed && !dry,
        replayed: false,
        dry_run: dry,
        apply_latency_ns: started.elapsed().as_nanos() as u64,
        applied_ns: now_ns(),
        message: a.message.clone(),
    }
}

/// Fields every mutating request shares.
pub trait Mutation: Message + Default + Clone {
    const METHOD: &'static str;
    fn action_id(&self) -> &str;
    fn dry_run(&self) -> bool;
    fn clear_dry_run(&mut self);
}

macro_rules! mutation {
    ($t:ty, $m:literal) => {
        impl Mutation for $t {
            const METHOD: &'static str = $m;
            fn action_id(&self) -> &str {
                &self.action_id
            }
            fn dry_run(&self) -> bool {
                self.dry_run
            }
            fn clear_dry_run(&mut self) {
                self.dry_run = false;
            }
        }
    };
}
mutation!(ApplyQueueHierarchyRequest, "ApplyQueueHierarchy");
mutation!(SetFlowClassRequest, "SetFlowClass");
mutation!(SetClassRateRequest, "SetClassRate");
mutation!(SetPowerPolicyRequest, "SetPowerPolicy");
mutation!(SetChainRequest, "SetChain");
mutation!(StartProbeRequest, "StartProbe");
mutation!(StopProbeRequest, "StopProbe");
mutation!(SetImpairmentRequest, "SetImpairment");
mutation!(ProtectFlowsRequest, "ProtectFlows");

/// Responses that carry an ApplyOutcome.
pub trait HasOutcome: Message + Default {
    fn outcome_mut(&mut self) -> &mut Option<ApplyOutcome>;
}

macro_rules! has_outcome {
    ($($t:ty),*) => {$(
        impl HasOutcome for $t {
            fn outcome_mut(&mut self) -> &mut Option<ApplyOutcome> {
                &mut self.outcome
            }
        }
    )*};
}
has_outcome!(
    ApplyQueueHierarchyResponse,
    SetFlowClassResponse,
    SetClassRateResponse,
    SetPowerPolicyResponse,
    SetChainResponse,
    StartProbeResponse,
    StopProbeResponse,
    SetImpairmentResponse,
    ProtectFlowsResponse
);

impl Agent {
    /// Loads the datapath, opens netlink, and restores the journal's desired state.
    pub fn start(config: Config, power: Power, probes: Probes) -> anyhow::Result<(Self, Vec<String>)> {
        config.check()?;
        let rtnl = Rtnl::open().context("opening rtnetlink")?;
        let dp = Datapath::load()?;
        let (monitor, protection, qwarn) = start_queues(&config, &dp)?;
        let journal = Journal::new(config.journal_path.clone(), config.journal_fsync);
        let (saved, warning) = journal.load(config.remembered_actions)?;
        let delay = Duration::from_micros(config.journal_commit_delay_us);
        let sync_ack = config.journal_sync_ack;
        let mut warnings: Vec<String> = warning.into_iter().chain(qwarn).collect();
        let mut actions = ActionLog::new(config.remembered_actions);
        for e in saved.actions {
            actions.record(e);
        }
        let generation = saved.desired.as_ref().map_or(0, |d| d.generation);
        let micro = Arc::new(MicroGuard::new(config.guard.clone()));
        let mut inner = Inner {
            config,
            rtnl,
            dp,
            desired: Desired::default(),
            chain_slots: BTreeMap::new(),
            actions,
            seq: 0,
            pending: Vec::new(),
            generation,
            power,
            probes,
            advanced: None,
            micro,
        };
        if let Some(d) = saved.desired {
            warnings.extend(inner.restore(&d));
        }
        let state = inner.desired.to_state(&inner.config.node_id, inner.generation);
        let (tx, _) = watch::channel((state, String::new()));
        let inner = Arc::new(Mutex::new(inner));
        let source = inner.clone();
        let commit = GroupCommit::start(journal, delay, move || {
            source.lock().unwrap_or_else(|p| p.into_inner()).snapshot()
        });
        Ok((Self { inner, monitor, protection, watch: tx, commit, sync_ack }, warnings))
    }

    /// The queue monitor's ticks (the micro loop's eyes).
    pub fn queue_view(&self) -> Arc<dyn crate::queue_view::QueueView> {
        self.monitor.clone()
    }

    /// The INT source's datapath maps (src/int_export).
    pub fn int_maps(&self) -> anyhow::Result<crate::int_export::IntMaps> {
        self.lock().dp.int_maps()
    }

    /// The interfaces the agent holds a queue hierarchy on (what the INT source may report).
    pub fn managed_interfaces(&self) -> Vec<String> {
        self.lock().desired.queues.keys().cloned().collect()
    }

    /// RFC 9957 sanctions per flow (None: no `[queue_protection]` interfaces).
    pub fn sanctions(&self) -> Option<Arc<dyn crate::queue_view::SanctionSource>> {
        self.protection.clone().map(|p| p as Arc<dyn crate::queue_view::SanctionSource>)
    }

    /// Commits every acknowledged change to the journal and stops its writer (shutdown).
    pub fn shutdown(&self) {
        self.commit.stop();
    }

    /// Waits until every change acknowledged so far is in the journal.
    pub fn flush_journal(&self) -> anyhow::Result<()> {
        self.commit.flush()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn subscribe(&self) -> watch::Receiver<(NodeState, String)> {
        self.watch.subscribe()
    }

    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// The common path of every mutation: action id, replay, dry run, journal, watchers.
    fn mutate<Req: Mutation, Resp: HasOutcome>(
        &self,
        req: &Req,
        apply: impl FnOnce(&mut Inner, bool) -> AgentResult<(Applied, Resp)>,
    ) -> AgentResult<Resp> {
        let started = Instant::now();
        require_action_id(req.action_id()).inspect_err(|e| refused(Req::METHOD, "", e))?;
        if let Some(e) = self.commit.error() {
            // A change the journal cannot hold would silently vanish on restart.
            return Err(AgentError::Kernel(anyhow::anyhow!(
                "the journal is failing ({e}); refusing changes a restart could not restore"
            )));
        }
        let mut inner = self.lock();
        let dry = req.dry_run() || inner.config.dry_run;
        let mut canonical = req.clone();
        canonical.clear_dry_run();
        let request_bytes = canonical.encode_to_vec();
        match inner.actions.check(req.action_id(), Req::METHOD, &request_bytes) {
            Replay::Same(bytes) => {
                let mut resp = Resp::decode(&bytes[..])
                    .map_err(|e| AgentError::Kernel(anyhow::anyhow!("recorded response: {e}")))?;
                if let Some(o) = resp.outcome_mut() {
                    o.replayed = true;
                    o.changed = false;
                }
                return Ok(resp);
            }
            Replay::Conflict(msg) => return Err(AgentError::Conflict(msg)),
            Replay::New => {}
        }
        let (applied, mut resp) = apply(&mut inner, dry).inspect_err(|e| refused(Req::METHOD, req.action_id(), e))?;
        *resp.outcome_mut() = Some(outcome(&applied, dry, started));
        if dry {
            return Ok(resp);
        }
        if applied.changed {
            inner.generation += 1;
        }
        let entry = JournalEntry {
            action_id: req.action_id().to_string(),
            method: Req::METHOD.to_string(),
            request: request_bytes,
            response: resp.encode_to_vec(),
        };
        // Persisted by the journal writer (group commit), not on this path.
        inner.seq += 1;
        let seq = inner.seq;
        inner.pending.push(entry.clone());
        inner.actions.record(entry);
        // Reading the whole state back costs netlink dumps: only when someone watches.
        if applied.changed && self.watch.receiver_count() > 0 {
            if let Ok(state) = inner.read_state() {
                let _ = self.watch.send((state, req.action_id().to_string()));
            }
        }
        drop(inner);
        self.commit.request(seq);
        if self.sync_ack {
            self.commit.wait_durable(seq).map_err(|e| {
                AgentError::Kernel(e.context("the change is applied but the journal write failed"))
            })?;
        }
        if let Some(o) = resp.outcome_mut() {
            o.apply_latency_ns = started.elapsed().as_nanos() as u64;
        }
        Ok(resp)
    }

    pub fn apply_queue_hierarchy(&self, req: &ApplyQueueHierarchyRequest) -> AgentResult<ApplyQueueHierarchyResponse> {
        self.mutate(req, |inner, dry| {
            let Some(h) = &req.hierarchy else { invalid!("hierarchy is missing") };
            let previous = match inner.check_interface("hierarchy.interface_name", &h.interface_name) {
                Ok(_) => inner.read_hierarchy(&h.interface_name)?,
                Err(e) => return Err(e),
            };
            let applied = inner.apply_hierarchy(h, dry)?;
            let now = if dry { Some(h.clone()) } else { inner.read_hierarchy(&h.interface_name)? };
            Ok((applied, ApplyQueueHierarchyResponse { outcome: None, applied: now, previous }))
        })
    }

    pub fn set_flow_class(&self, req: &SetFlowClassRequest) -> AgentResult<SetFlowClassResponse> {
        self.mutate(req, |inner, dry| {
            let Some(rule) = &req.rule else { invalid!("rule is missing") };
            let (applied, previous) = inner.set_flow_class(rule, dry)?;
            Ok((applied, SetFlowClassResponse { outcome: None, applied: Some(rule.clone()), previous }))
        })
    }

    pub fn set_class_rate(&self, req: &SetClassRateRequest) -> AgentResult<SetClassRateResponse> {
        self.mutate(req, |inner, dry| {
            let (applied, new, previous) = inner.set_class_rate(req, dry)?;
            Ok((applied, SetClassRateResponse { outcome: None, applied: Some(new), previous: Some(previous) }))
        })
    }

    pub fn set_chain(&self, req: &SetChainRequest) -> AgentResult<SetChainResponse> {
        self.mutate(req, |inner, dry| {
            let Some(chain) = &req.chain else { invalid!("chain is missing") };
            let (applied, previous) = inner.set_chain(chain, dry)?;
            Ok((applied, SetChainResponse { outcome: None, applied: Some(chain.clone()), previous }))
        })
    }

    pub fn set_impairment(&self, req: &SetImpairmentRequest) -> AgentResult<SetImpairmentResponse> {
        self.mutate(req, |inner, dry| {
            let Some(imp) = &req.impairment else { invalid!("impairment is missing") };
            let (applied, previous) = inner.set_impairment(imp, dry)?;
            Ok((applied, SetImpairmentResponse { outcome: None, applied: Some(imp.clone()), previous }))
        })
    }

    pub fn set_power_policy(&self, req: &SetPowerPolicyRequest) -> AgentResult<SetPowerPolicyResponse> {
        self.mutate(req, |inner, dry| {
            let Some(policy) = &req.policy else { invalid!("policy is missing") };
            inner.guard().cores("policy.cores", &policy.cores)?;
            let (applied, previous) = inner.power.apply(policy, dry)?;
            if !dry {
                inner.desired.power = inner.power.policies();
            }
            let changed = previous.iter().all(|p| p != &applied);
            let message = format!(
                "cores {:?}: governor {}, {}..{} kHz, {:?}",
                applied.cores,
                applied.governor,
                applied.min_frequency_khz,
                applied.max_frequency_khz,
                XmanMode::try_from(applied.xman_mode).unwrap_or(XmanMode::Unspecified)
            );
            Ok((Applied { changed, message }, SetPowerPolicyResponse { outcome: None, applied: Some(applied), previous }))
        })
    }

    pub fn protect_flows(&self, req: &ProtectFlowsRequest) -> AgentResult<ProtectFlowsResponse> {
        self.mutate(req, |inner, dry| {
            let (applied, done) = inner.protect_flows(req, dry)?;
            Ok((applied, ProtectFlowsResponse { outcome: None, applied: done.applied, previous: done.previous }))
        })
    }

    /// Calls `f` for every frequency switch the X-MAN loop decides (the micro-loop audit).
    pub fn on_frequency_change(&self, f: impl Fn(crate::power_glue::CoreFrequencyChange) + Send + 'static) {
        self.lock().power.on_frequency_change(f);
    }

    /// The latency guard (its protections and status, for node samples).
    pub fn micro_loop(&self) -> Arc<MicroGuard> {
        self.lock().micro.clone()
    }

    /// Starts the latency guard's thread on `view`; each move goes to `on_move` (the audit),
    /// and watchers get the state it changed (without a cause: a local change).
    pub fn start_guard(
        self: &Arc<Self>,
        view: Arc<dyn crate::queue_view::QueueView>,
        on_move: impl Fn(&micro::Move) + Send + 'static,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let guard = self.micro_loop();
        let hands = Arc::new(Locked(self.inner.clone()));
        let me = Arc::downgrade(self);
        micro::spawn(guard, view, hands, move |m| {
            on_move(m);
            if let Some(agent) = me.upgrade().filter(|a| a.watch.receiver_count() > 0) {
                if let Ok(state) = agent.lock().read_state() {
                    let _ = agent.watch.send((state, String::new()));
                }
            }
        }, stop)
    }

    pub fn get_power_state(&self, req: &GetPowerStateRequest) -> AgentResult<GetPowerStateResponse> {
        self.lock().power.state(&req.cores)
    }

    pub fn start_probe(&self, req: &StartProbeRequest) -> AgentResult<StartProbeResponse> {
        self.mutate(req, |inner, dry| {
            let Some(spec) = &req.spec else { invalid!("spec is missing") };
            let bounds = inner.config.bounds.clone();
            let previous = inner.probes.start(spec, &bounds, dry)?;
            if !dry {
                inner.desired.probes.insert(spec.probe_id.clone(), spec.clone());
            }
            let message = format!("probe {} started", spec.probe_id);
            Ok((Applied { changed: true, message }, StartProbeResponse { outcome: None, applied: Some(spec.clone()), previous }))
        })
    }

    pub fn stop_probe(&self, req: &StopProbeRequest) -> AgentResult<StopProbeResponse> {
        self.mutate(req, |inner, dry| {
            if req.probe_id.is_empty() {
                invalid!("probe_id is empty");
            }
            let previous = inner.probes.stop(&req.probe_id, dry);
            if !dry {
                inner.desired.probes.remove(&req.probe_id);
            }
            let message = format!("probe {} stopped", req.probe_id);
            Ok((Applied { changed: previous.is_some(), message }, StopProbeResponse { outcome: None, previous }))
        })
    }

    /// The applied state, read back from the kernel. Answered once every change acknowledged
    /// before it is in the journal, so a caller that saw GetState knows those changes survive
    /// a crash of the agent.
    pub fn state(&self) -> AgentResult<NodeState> {
        if let Err(e) = self.commit.flush() {
            tracing::warn!("GetState: {e:#}");
        }
        self.lock().read_state()
    }
}

impl crate::nodes::Source for Agent {
    fn node_state(&self) -> Option<NodeState> {
        self.lock().read_state().map_err(|e| tracing::warn!("node sample: {e}")).ok()
    }

    fn power_cores(&self) -> Vec<CoreSample> {
        self.lock().power.state(&[]).map(|r| r.cores).unwrap_or_default()
    }

    fn workers(&self) -> Vec<crate::advanced::WorkerReading> {
        self.lock().worker_readings()
    }

    /// The micro loop acts when the monitor reads its queues and the guard may move flows; the
    /// guard's reason (stale ticks, the change cap, a failed write …) and protected flows, the
    /// monitor's live sample age.
    fn queues(&self) -> (Vec<QueueSample>, Option<MicroLoopStatus>) {
        let status = self.micro_loop_status();
        (self.monitor.take_samples(), Some(status))
    }
}

impl Agent {
    /// The micro loop's status as node samples report it (see `nodes::Source::queues`),
    /// without taking the queue samples.
    pub fn micro_loop_status(&self) -> MicroLoopStatus {
        let monitor = self.monitor.status();
        let mut status = self.micro_loop().status();
        status.acting &= monitor.acting;
        if status.reason.is_empty() {
            status.reason = monitor.reason;
        }
        status.queue_sample_age_ns = monitor.queue_sample_age_ns;
        status
    }

    /// Queue monitor ticks so far (the sampler's health on /metrics).
    pub fn sampler_ticks(&self) -> u64 {
        self.monitor.cost().1
    }
}

/// The queue monitor and the low-latency class's configuration; warnings for what is missing.
type Queues = (Arc<crate::qmon::Monitor>, Option<Arc<crate::qprot::Protection>>, Vec<String>);

fn start_queues(config: &Config, dp: &Datapath) -> anyhow::Result<Queues> {
    let mut warnings = Vec::new();
    let protection = if config.queue_protection.interfaces.is_empty() {
        None
    } else {
        let p = crate::qprot::Protection::new(dp.qmon_maps()?, config.queue_protection.clone());
        warnings.extend(p.apply()?);
        Some(Arc::new(p))
    };
    let monitor =
        crate::qmon::Monitor::start(&config.queues, dp.qmon_maps()?, dp.qmon_attach_error.clone(), protection.clone())?;
    Ok((Arc::new(monitor), protection, warnings))
}

impl Inner {
    /// Re-applies a journal's desired state; returns a warning per item that failed.
    fn restore(&mut self, d: &NodeState) -> Vec<String> {
        let mut warnings = Vec::new();
        for h in &d.queues {
            if let Err(e) = self.apply_hierarchy(h, false) {
                warnings.push(format!("restoring the hierarchy of {}: {e}", h.interface_name));
            }
        }
        for r in &d.flow_classes {
            if let Err(e) = self.set_flow_class(r, false) {
                warnings.push(format!("restoring a flow rule on {}: {e}", r.interface_name));
            }
        }
        for c in &d.chains {
            if let Err(e) = self.set_chain(c, false) {
                warnings.push(format!("restoring chain {}: {e}", c.chain_id));
            }
        }
        for i in &d.impairments {
            if let Err(e) = self.set_impairment(i, false) {
                warnings.push(format!("restoring an impairment on {}: {e}", i.interface_name));
            }
        }
        for p in &d.power_policies {
            let allowed = self.guard().cores("policy.cores", &p.cores);
            match allowed.and_then(|_| self.power.restore(p)) {
                Ok(_) => self.desired.power = self.power.policies(),
                Err(e) => warnings.push(format!("restoring power policy of cores {:?}: {e}", p.cores)),
            }
        }
        let now = now_ns();
        for p in &d.protected_flows {
            match ifindex(&p.interface_name) {
                Ok(i) => {
                    self.micro.restore(p, i, now);
                }
                Err(e) => warnings.push(format!("restoring the protection of a flow on {}: {e}", p.interface_name)),
            }
        }
        let bounds = self.config.bounds.clone();
        for p in &d.probes {
            match self.probes.start(p, &bounds, false) {
                Ok(_) => {
                    self.desired.probes.insert(p.probe_id.clone(), p.clone());
                }
                Err(e) => warnings.push(format!("restoring probe {}: {e}", p.probe_id)),
            }
        }
        warnings
    }
}

fn s_kind(s: &crate::tc::ClassSpec, steps: &[queues::Step]) -> bool {
    steps.iter().any(|x| matches!(x, queues::Step::Create(c) if c == s))
}
