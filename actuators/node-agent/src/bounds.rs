//! Every check of a request against the configured `[bounds]`, in one place: the interfaces,
//! cores and rates a request names, whichever request and function names them. Request
//! handlers call a [`Guard`] before they touch anything; a refusal names the field and the
//! bound, and the agent logs it (`Agent::mutate`).

use std::cell::OnceCell;
use std::collections::BTreeMap;

use cgloop_proto::catalogue::{self, Value};
use cgloop_proto::v1::{ChainFunction, FunctionKind, ProtectedFlow, QueueHierarchy, ServiceChain};

use crate::config::Bounds;
use crate::error::{AgentError, AgentResult};
use crate::tc::handle_str;
use crate::{invalid, out_of_bounds};

/// A protected flow's latency objective: 100 µs..10 s (ProtectFlowAction's param rules).
pub const SLO_NS: (u64, u64) = (100_000, 10_000_000_000);
/// A protection's time to live: 1 s..1 h (0 removes it).
pub const TTL_NS: (u64, u64) = (1_000_000_000, 3_600_000_000_000);

/// Where the kernel lists the online CPUs ("0-3,6").
const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// The bounds plus what the machine has (its online CPUs, read when a core is checked).
pub struct Guard<'a> {
    bounds: &'a Bounds,
    cpus: OnceCell<Vec<u32>>,
}

impl<'a> Guard<'a> {
    pub fn new(bounds: &'a Bounds) -> Self {
        Self { bounds, cpus: OnceCell::new() }
    }

    /// A guard for a machine with these CPUs (tests).
    pub fn with_cpus(bounds: &'a Bounds, cpus: Vec<u32>) -> Self {
        Self { bounds, cpus: OnceCell::from(cpus) }
    }

    pub fn bounds(&self) -> &Bounds {
        self.bounds
    }

    fn cpus(&self) -> &[u32] {
        self.cpus.get_or_init(online_cpus)
    }

    /// An interface the request names: in `[bounds] interfaces` (or `"*"`).
    pub fn interface(&self, field: &str, name: &str) -> AgentResult<()> {
        if name.is_empty() {
            invalid!("{field} is empty: name an interface");
        }
        if !self.bounds.interfaces.iter().any(|i| i == "*" || i == name) {
            return Err(AgentError::Forbidden(format!(
                "{field}: interface {name:?} is not in the agent's [bounds] interfaces {:?}",
                self.bounds.interfaces
            )));
        }
        Ok(())
    }

    /// A core the request names: online on this machine and in `[bounds] cores` when set.
    pub fn core(&self, field: &str, core: u32) -> AgentResult<()> {
        if !self.cpus().contains(&core) {
            invalid!(
                "{field}: core {core} does not exist on this node (online CPUs: {})",
                cpu_list(self.cpus())
            );
        }
        if !self.bounds.cores.is_empty() && !self.bounds.cores.contains(&core) {
            return Err(AgentError::Forbidden(format!(
                "{field}: core {core} is not in the agent's [bounds] cores {:?}",
                self.bounds.cores
            )));
        }
        Ok(())
    }

    pub fn cores(&self, field: &str, cores: &[u32]) -> AgentResult<()> {
        cores.iter().enumerate().try_for_each(|(i, &c)| self.core(&format!("{field}[{i}]"), c))
    }

    /// A rate in bit/s: within `[bounds] min_rate_bps..max_rate_bps`.
    pub fn rate(&self, field: &str, bps: u64) -> AgentResult<()> {
        let b = self.bounds;
        if bps < b.min_rate_bps || bps > b.max_rate_bps {
            out_of_bounds!("{field} {bps} is outside the bounds {}..{}", b.min_rate_bps, b.max_rate_bps);
        }
        Ok(())
    }

    /// Every class's rates within the bounds, and under its parent: a child's rate and ceil
    /// never exceed the parent's ceil (HTB would let the child borrow past what the parent
    /// may send, so the parent's bound would not hold).
    pub fn hierarchy_rates(&self, h: &QueueHierarchy) -> AgentResult<()> {
        let by_id: BTreeMap<u32, _> = h.classes.iter().map(|c| (c.class_id, c)).collect();
        for c in &h.classes {
            let id = handle_str(c.class_id);
            for (what, v) in [("rate_bps", c.rate_bps), ("ceil_bps", c.ceil_bps)] {
                self.rate(&format!("class {} ({id}): {what}", c.name), v)?;
            }
            if c.ceil_bps < c.rate_bps {
                invalid!("class {} ({id}): ceil_bps {} is below rate_bps {}", c.name, c.ceil_bps, c.rate_bps);
            }
            let Some(p) = (c.parent_class_id != 0).then(|| by_id.get(&c.parent_class_id)).flatten() else {
                continue; // a root class, or a parent the structural check names
            };
            for (what, v) in [("rate_bps", c.rate_bps), ("ceil_bps", c.ceil_bps)] {
                if v > p.ceil_bps {
                    invalid!(
                        "class {} ({id}): {what} {v} exceeds the ceil_bps {} of its parent {} ({})",
                        c.name,
                        p.ceil_bps,
                        p.name,
                        handle_str(p.class_id)
                    );
                }
            }
        }
        Ok(())
    }

    /// A protection a ProtectFlows request asks for (`field` names it, e.g. `flows[0]`): its
    /// interface within `[bounds] interfaces`, a flow, and (unless it removes the protection,
    /// ttl_ns 0) its SLO, TTL and DSCP re-mark within their bounds. Whether the class exists is
    /// the hierarchy's to say (the agent checks it).
    pub fn protected_flow(&self, field: &str, p: &ProtectedFlow) -> AgentResult<()> {
        self.interface(&format!("{field}.interface_name"), &p.interface_name)?;
        if p.flow.is_none() {
            invalid!("{field}.flow is missing: name the 5-tuple to protect");
        }
        if p.ttl_ns == 0 {
            return Ok(()); // a removal needs nothing else
        }
        let (lo, hi) = SLO_NS;
        if !(lo..=hi).contains(&p.latency_slo_ns) {
            invalid!("{field}.latency_slo_ns {} is outside {lo}..{hi} (100 µs..10 s)", p.latency_slo_ns);
        }
        let (lo, hi) = TTL_NS;
        if !(lo..=hi).contains(&p.ttl_ns) {
            invalid!("{field}.ttl_ns {} is outside {lo}..{hi} (1 s..1 h; 0 removes)", p.ttl_ns);
        }
        if p.class_id == 0 {
            invalid!("{field}.class_id is 0: name the class the guard moves the flow to");
        }
        if let Some(d) = p.rewrite_dscp.filter(|&d| d > 63) {
            invalid!("{field}.rewrite_dscp {d} is not within 0..63");
        }
        Ok(())
    }

    /// Every function of a chain: its core, every interface and rate its parameters name.
    pub fn chain(&self, chain: &ServiceChain) -> AgentResult<()> {
        let max = self.bounds.max_chain_functions.min(crate::datapath::MAX_CHAIN_FNS);
        if chain.functions.len() > max {
            out_of_bounds!("chain {} has {} functions; the bound is {max}", chain.chain_id, chain.functions.len());
        }
        for (pos, f) in chain.functions.iter().enumerate() {
            self.function(pos, f)?;
        }
        Ok(())
    }

    /// A function's core, and every parameter the catalogue declares an interface or a rate
    /// (ParamRule.interface / .rate), so a new function's targets are bounded as declared.
    fn function(&self, pos: usize, f: &ChainFunction) -> AgentResult<()> {
        let at = format!("chain function #{pos} {:?}", f.name());
        // 0 is the proto default: not pinned (it is a core every machine has).
        if f.core != 0 {
            self.core(&format!("{at}: core"), f.core)?;
        }
        let Some(func) = f.function.as_ref() else { return Ok(()) }; // chains::validate names it
        self.instances(&at, catalogue::spec(func).kind, f)?;
        for (param, value) in catalogue::values(func) {
            match value {
                Value::Str(name) if param.interface => {
                    self.interface(&format!("{at}: parameter {}", param.name), name.trim())?;
                }
                Value::Uint(bps) if param.rate => {
                    self.rate(&format!("{at}: parameter {}", param.name), bps)?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl Guard<'_> {
    /// Natif's scale-out of one function: `instances` only for an advanced function and within
    /// `[bounds] max_function_instances`, `instance_cores` empty or one core per instance, each
    /// core (0: not pinned) online and within `[bounds] cores`.
    fn instances(&self, at: &str, kind: FunctionKind, f: &ChainFunction) -> AgentResult<()> {
        let max = self.bounds.max_function_instances;
        if f.instances > 1 && kind != FunctionKind::Advanced {
            invalid!(
                "{at}: instances {} is not within 0..1: only advanced functions scale out (a \
                 basic function runs in BPF on every core that receives the packet)",
                f.instances
            );
        }
        if f.instances > max {
            invalid!(
                "{at}: instances {} is not within 0..{max} (the agent's [bounds] max_function_instances)",
                f.instances
            );
        }
        let n = f.instances.max(1) as usize;
        if !f.instance_cores.is_empty() && f.instance_cores.len() != n {
            invalid!(
                "{at}: instance_cores has {} entries; give one core per instance ({n}) or none",
                f.instance_cores.len()
            );
        }
        for (i, &core) in f.instance_cores.iter().enumerate() {
            if core != 0 {
                self.core(&format!("{at}: instance_cores[{i}]"), core)?;
            }
        }
        Ok(())
    }
}

/// The online CPUs, from sysfs; without it, 0..the configured count.
pub fn online_cpus() -> Vec<u32> {
    if let Some(cpus) = std::fs::read_to_string(ONLINE_CPUS).ok().and_then(|s| parse_cpu_list(&s)) {
        return cpus;
    }
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    (0..n.max(1) as u32).collect()
}

/// Parses the kernel's CPU list format ("0-3,6,8-9").
pub fn parse_cpu_list(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.trim().parse().ok()?),
        }
    }
    (!out.is_empty()).then_some(out)
}

/// "0-3,6" for messages.
fn cpu_list(cpus: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { cpus[i].to_string() } else { format!("{}-{}", cpus[i], cpus[j]) });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use cgloop_proto::v1::chain_function::Function;
    use cgloop_proto::v1::{Dpi, FunctionKind, HtbClass, Mirror, RateLimit, dpi};

    fn rt0() -> Bounds {
        Bounds { interfaces: vec!["rt0".into()], ..Bounds::default() }
    }

    fn func(function: Function, kind: FunctionKind, core: u32) -> ChainFunction {
        ChainFunction { function: Some(function), kind: kind as i32, core, ..Default::default() }
    }

    fn mirror(interface: &str) -> Function {
        Function::Mirror(Mirror { interface: interface.into() })
    }

    fn chain(fns: Vec<ChainFunction>) -> ServiceChain {
        ServiceChain { chain_id: "c".into(), traffic_class: "gaming".into(), functions: fns }
    }

    #[test]
    fn cpu_lists_parse_like_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-3,6\n"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert!(online_cpus().contains(&0));
    }

    #[test]
    fn interfaces_outside_the_bounds_are_forbidden_by_field() {
        let b = rt0();
        let g = Guard::new(&b);
        g.interface("rule.interface_name", "rt0").unwrap();
        let e = g.interface("rule.interface_name", "lo").unwrap_err();
        assert!(matches!(e, AgentError::Forbidden(_)), "{e:?}");
        assert!(e.to_string().contains("rule.interface_name") && e.to_string().contains("\"rt0\""), "{e}");
        assert!(matches!(g.interface("x", "").unwrap_err(), AgentError::Invalid(_)));
        let any = Bounds::default();
        Guard::new(&any).interface("x", "lo").unwrap();
    }

    #[test]
    fn cores_must_exist_and_be_within_the_core_bound() {
        let mut b = Bounds::default();
        let g = Guard::with_cpus(&b, vec![0, 1]);
        g.core("policy.cores[0]", 1).unwrap();
        let e = g.core("policy.cores[0]", 9999).unwrap_err();
        assert!(matches!(e, AgentError::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains("core 9999") && e.to_string().contains("0-1"), "{e}");
        b.cores = vec![1];
        let g = Guard::with_cpus(&b, vec![0, 1]);
        let e = g.core("policy.cores[0]", 0).unwrap_err();
        assert!(matches!(e, AgentError::Forbidden(_)) && e.to_string().contains("[1]"), "{e}");
    }

    /// issue 17 finding 5: `[bounds] interfaces = ["rt0"]` and a mirror to `lo` or to another
    /// interface was installed.
    #[test]
    fn a_mirror_to_an_interface_outside_the_bounds_is_forbidden() {
        let b = rt0();
        let g = Guard::new(&b);
        for target in ["lo", "eth1", " lo "] {
            let c = chain(vec![func(mirror(target), FunctionKind::Basic, 0)]);
            let e = g.chain(&c).unwrap_err();
            assert!(matches!(e, AgentError::Forbidden(_)), "{target}: {e:?}");
            assert!(e.to_string().contains("parameter interface") && e.to_string().contains("rt0"), "{e}");
        }
        let c = chain(vec![func(mirror("rt0"), FunctionKind::Basic, 0)]);
        g.chain(&c).unwrap();
    }

    /// issue 17 finding 5: an advanced function pinned to core 9999 was accepted.
    #[test]
    fn a_function_pinned_to_a_core_the_node_lacks_is_refused() {
        let b = Bounds::default();
        let g = Guard::with_cpus(&b, vec![0, 1]);
        let dpi = Function::Dpi(Dpi {
            pattern: Some(dpi::Pattern::Text("x".into())),
            depth: None,
            on_match: Some(dpi::OnMatch::MarkDscp(1)),
        });
        let dpi = func(dpi, FunctionKind::Advanced, 9999);
        let e = g.chain(&chain(vec![dpi.clone()])).unwrap_err();
        assert!(matches!(e, AgentError::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains("core 9999") && e.to_string().contains("\"dpi\""), "{e}");
        let pinned = ChainFunction { core: 1, ..dpi };
        g.chain(&chain(vec![pinned])).unwrap();
    }

    /// Natif's scale-out: instances only for advanced functions, within the bound, one core
    /// per instance, each core on the node and within the core bound.
    #[test]
    fn instances_and_their_cores_are_checked_by_field() {
        let b = Bounds { max_function_instances: 4, cores: vec![0, 1], ..Bounds::default() };
        let g = Guard::with_cpus(&b, vec![0, 1, 2]);
        let dpi = func(
            Function::Dpi(Dpi {
                pattern: Some(dpi::Pattern::Text("x".into())),
                depth: None,
                on_match: Some(dpi::OnMatch::MarkDscp(1)),
            }),
            FunctionKind::Advanced,
            0,
        );
        let rate = func(Function::RateLimit(RateLimit { rate_bps: 8_000_000, burst_bytes: 3000 }), FunctionKind::Basic, 0);
        let scaled = |f: &ChainFunction, instances, cores: Vec<u32>| ChainFunction { instances, instance_cores: cores, ..f.clone() };
        for ok in [scaled(&dpi, 2, vec![0, 1]), scaled(&dpi, 4, vec![]), scaled(&dpi, 0, vec![1]), scaled(&rate, 1, vec![])] {
            g.chain(&chain(vec![ok])).unwrap();
        }
        let cases = [
            (scaled(&rate, 2, vec![]), "#0 \"rate_limit\": instances 2 is not within 0..1: only advanced functions scale out"),
            (scaled(&dpi, 5, vec![]), "#0 \"dpi\": instances 5 is not within 0..4 (the agent's [bounds] max_function_instances)"),
            (scaled(&dpi, 2, vec![1]), "#0 \"dpi\": instance_cores has 1 entries; give one core per instance (2) or none"),
            (scaled(&dpi, 0, vec![0, 1]), "instance_cores has 2 entries; give one core per instance (1) or none"),
            (scaled(&dpi, 2, vec![1, 9]), "#0 \"dpi\": instance_cores[1]: core 9 does not exist on this node (online CPUs: 0-2)"),
        ];
        for (f, want) in cases {
            let e = g.chain(&chain(vec![f])).unwrap_err();
            assert!(matches!(e, AgentError::Invalid(_)) && e.to_string().contains(want), "{want}: {e}");
        }
        let e = g.chain(&chain(vec![scaled(&dpi, 2, vec![1, 2])])).unwrap_err();
        assert!(matches!(e, AgentError::Forbidden(_)) && e.to_string().contains("instance_cores[1]: core 2 is not in"), "{e}");
    }

    #[test]
    fn a_rate_limit_outside_the_rate_bounds_is_refused() {
        let b = Bounds { max_rate_bps: 1_000_000, ..Bounds::default() };
        let g = Guard::new(&b);
        let rate = Function::RateLimit(RateLimit { rate_bps: 2_000_000, burst_bytes: 3000 });
        let c = chain(vec![func(rate, FunctionKind::Basic, 0)]);
        let e = g.chain(&c).unwrap_err();
        assert!(matches!(e, AgentError::OutOfBounds(_)) && e.to_string().contains("rate_bps 2000000"), "{e}");
    }

    #[test]
    fn protected_flows_are_refused_by_field_and_bounds() {
        use cgloop_proto::v1::FiveTuple;
        let b = rt0();
        let g = Guard::new(&b);
        let ok = ProtectedFlow {
            interface_name: "rt0".into(),
            flow: Some(FiveTuple::default()),
            latency_slo_ns: 20_000_000,
            class_id: 0x10020,
            rewrite_dscp: Some(46),
            ttl_ns: 30_000_000_000,
            ..Default::default()
        };
        g.protected_flow("flows[0]", &ok).unwrap();
        type Change = fn(&mut ProtectedFlow);
        let cases: [(Change, &str); 7] = [
            (|p| p.latency_slo_ns = 99_999, "flows[0].latency_slo_ns 99999 is outside 100000..10000000000"),
            (|p| p.latency_slo_ns = 10_000_000_001, "flows[0].latency_slo_ns"),
            (|p| p.ttl_ns = 999_999_999, "flows[0].ttl_ns 999999999 is outside 1000000000..3600000000000"),
            (|p| p.ttl_ns = 3_600_000_000_001, "flows[0].ttl_ns"),
            (|p| p.rewrite_dscp = Some(64), "flows[0].rewrite_dscp 64 is not within 0..63"),
            (|p| p.class_id = 0, "flows[0].class_id is 0"),
            (|p| p.flow = None, "flows[0].flow is missing"),
        ];
        for (change, want) in cases {
            let mut p = ok.clone();
            change(&mut p);
            let e = g.protected_flow("flows[0]", &p).unwrap_err();
            assert!(matches!(e, AgentError::Invalid(_)) && e.to_string().contains(want), "{want}: {e}");
        }
        let e = g.protected_flow("flows[0]", &ProtectedFlow { interface_name: "lo".into(), ..ok.clone() }).unwrap_err();
        assert!(matches!(e, AgentError::Forbidden(_)) && e.to_string().contains("flows[0].interface_name"), "{e}");
        // A removal (ttl 0) is checked for its interface and flow only.
        g.protected_flow("flows[0]", &ProtectedFlow { ttl_ns: 0, latency_slo_ns: 0, class_id: 0, ..ok }).unwrap();
    }

    fn class(name: &str, id: u32, parent: u32, rate: u64, ceil: u64) -> HtbClass {
        HtbClass { name: name.into(), class_id: id, parent_class_id: parent, rate_bps: rate, ceil_bps: ceil, ..Default::default() }
    }

    /// issue 17 finding 5: a child class at 500 Mbit/s under a 100 Mbit/s parent was accepted.
    #[test]
    fn a_child_faster_than_its_parent_is_refused() {
        let b = Bounds::default();
        let g = Guard::new(&b);
        let mut h = QueueHierarchy {
            interface_name: "rt0".into(),
            default_class_id: 0x10010,
            classes: vec![
                class("root", 0x10001, 0, 100_000_000, 100_000_000),
                class("gaming", 0x10010, 0x10001, 500_000_000, 500_000_000),
            ],
        };
        let e = g.hierarchy_rates(&h).unwrap_err();
        assert!(matches!(e, AgentError::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains("gaming") && e.to_string().contains("100000000"), "{e}");
        h.classes[1].rate_bps = 50_000_000; // rate fine, ceil still above the parent's
        assert!(g.hierarchy_rates(&h).unwrap_err().to_string().contains("ceil_bps 500000000"));
        h.classes[1].ceil_bps = 100_000_000;
        g.hierarchy_rates(&h).unwrap();
    }
}
