//! Service chains: validation against the chain-function catalogue, the CALVIN placement rule,
//! and the translation of a chain to the datapath's `cgl_chain` (and back, for GetState).
//!
//! The catalogue (which functions exist, where each runs, its parameters and their accepted
//! values) is declared once in `proto/cgloop/v1/node_agent.proto` (`ChainFunction.function`,
//! `FunctionTraits`, `ParamRule`); `cgloop_proto::catalogue` is generated from it. This module
//! only says how each function is implemented: a BPF program (`datapath_fn`) or a user-space
//! function (`payload::build`); a test checks the two agree with the declared kinds.
//!
//! CALVIN (§III-B): header-only ("basic") functions run in BPF; functions that touch the
//! payload run in user space (AF_XDP), and a function never runs split across the two.

use cgloop_proto::catalogue;
use cgloop_proto::v1::chain_function::Function;
use cgloop_proto::v1::{Acl, ChainFunction, Forward, FunctionKind, Mark, Mirror, RateLimit, ServiceChain};

use crate::bounds::Guard;
use crate::datapath::{Chain, ChainFn, FnKind, KEEP, MAX_CHAIN_FNS};
use crate::error::{AgentError, AgentResult};
use crate::invalid;

/// Resolves interface names in function parameters (mirror targets) to ifindexes.
pub trait Interfaces {
    fn ifindex(&self, name: &str) -> AgentResult<u32>;
    fn name(&self, ifindex: u32) -> String;
}

/// A chain split by CALVIN: the BPF part (basic prefix, then a `ToUser` step when there are
/// advanced functions) and the advanced suffix, validated, for the AF_XDP worker.
pub struct Compiled {
    pub bpf: Chain,
    pub advanced: Vec<crate::advanced::AdvFn>,
    /// Natif's scale-out of the advanced suffix: the core of each instance (0: not pinned),
    /// one entry per instance; empty without advanced functions.
    pub instance_cores: Vec<u32>,
}

/// The instances a function asks for (0 or 1: one) and the core of each: `instance_cores`, or
/// `core` for every instance when it is empty (Guard::chain checked both).
pub fn instance_cores(f: &ChainFunction) -> Vec<u32> {
    let n = f.instances.max(1) as usize;
    if f.instance_cores.is_empty() { vec![f.core; n] } else { f.instance_cores.clone() }
}

fn kind_name(kind: FunctionKind) -> &'static str {
    kind.as_str_name()
}

/// Checks one function against the catalogue: a function is set, its parameters are within
/// their declared values, and the kind the request declares is the function's CALVIN kind
/// (unset: the catalogue's). Returns the function and its kind.
pub fn validate(pos: usize, f: &ChainFunction) -> AgentResult<(&Function, FunctionKind)> {
    let Some(func) = f.function.as_ref() else {
        invalid!(
            "chain function #{pos}: no function set; known functions: {}",
            catalogue::known()
        );
    };
    let spec = catalogue::spec(func);
    if let Err(v) = catalogue::check(func) {
        invalid!("chain function #{pos} {:?}: {v}", spec.name);
    }
    let asked = match FunctionKind::try_from(f.kind) {
        Ok(FunctionKind::Unspecified) => spec.kind,
        Ok(k) => k,
        Err(_) => invalid!(
            "chain function #{pos} {:?}: kind {} is not a FunctionKind (declare {} or leave it unset)",
            spec.name,
            f.kind,
            kind_name(spec.kind)
        ),
    };
    if asked != spec.kind {
        let why = if spec.kind == FunctionKind::Advanced {
            "touches the payload and is refused in BPF; it runs in user space"
        } else {
            "is header-only and runs in BPF; a function is never moved to (or split into) user space"
        };
        invalid!(
            "CALVIN: chain function #{pos} {:?} {why}: declare it {} (or leave kind unset), not {}",
            spec.name,
            kind_name(spec.kind),
            kind_name(asked)
        );
    }
    Ok((func, spec.kind))
}

/// Checks a chain against the bounds (every interface, core and rate its functions name), the
/// catalogue and CALVIN, and builds its datapath form.
pub fn compile(chain: &ServiceChain, guard: &Guard, ifs: &dyn Interfaces) -> AgentResult<Compiled> {
    if chain.traffic_class.is_empty() {
        invalid!("chain.traffic_class is empty: name the HTB class the chain serves");
    }
    guard.chain(chain)?;
    let mut checked = Vec::with_capacity(chain.functions.len());
    for (pos, f) in chain.functions.iter().enumerate() {
        checked.push(validate(pos, f)?);
    }
    let mut out = Chain { len: chain.functions.len() as u32, ..Default::default() };
    let mut advanced = Vec::new();
    let mut cores: Vec<u32> = Vec::new();
    for (pos, (func, kind)) in checked.into_iter().enumerate() {
        let name = catalogue::spec(func).name;
        if kind == FunctionKind::Advanced {
            if advanced.is_empty() {
                out.fns[pos] = ChainFn { kind: FnKind::ToUser as u32, ..Default::default() };
                out.len = pos as u32 + 1;
            }
            advanced.push(crate::advanced::AdvFn::new(crate::payload::build(func, pos)?));
            // The advanced functions of a chain run together on each instance (a frame goes to
            // user space once): the suffix runs on as many as the function asking most.
            let asked = instance_cores(&chain.functions[pos]);
            if asked.len() > cores.len() {
                cores = asked;
            }
            continue;
        }
        if !advanced.is_empty() {
            invalid!(
                "CALVIN: chain function #{pos} {name:?} is basic but follows an advanced one; basic \
                 functions run in BPF before the hand-over to user space, so put them first"
            );
        }
        let Some(bpf) = datapath_fn(func, ifs) else {
            return Err(AgentError::Unimplemented(format!(
                "chain function #{pos} {name:?}: declared {} but the agent has no BPF program for it",
                kind_name(kind)
            )));
        };
        out.fns[pos] = bpf?;
    }
    if let Some(i) = out.fns.iter().position(|f| f.kind == FnKind::ToUser as u32).filter(|_| !advanced.is_empty()) {
        out.fns[i].b = cores.len() as u32;
    }
    Ok(Compiled { bpf: out, advanced, instance_cores: cores })
}

/// The BPF form of a header-only function (parameters already checked against the catalogue);
/// None for a function that runs in user space.
fn datapath_fn(func: &Function, ifs: &dyn Interfaces) -> Option<AgentResult<ChainFn>> {
    let f = |kind: FnKind, a: u32, b: u32, c: u32, d: u64| ChainFn { kind: kind as u32, a, b, c, d };
    Some(Ok(match func {
        Function::Forward(Forward {}) => f(FnKind::Forward, 0, 0, 0, 0),
        Function::Acl(Acl { proto, dst_port, src_port }) => f(FnKind::Acl, *proto, *dst_port, *src_port, 0),
        Function::Mark(Mark { dscp, ecn }) => {
            f(FnKind::Mark, dscp.unwrap_or(KEEP), ecn.unwrap_or(KEEP), 0, 0)
        }
        // The datapath keeps bytes/s in 32 bits: the catalogue's bound on rate_bps fits.
        Function::RateLimit(RateLimit { rate_bps, burst_bytes }) => {
            f(FnKind::Rate, 0, 0, (rate_bps / 8) as u32, *burst_bytes)
        }
        // Within the bounds: Guard::chain checked it before any function was built.
        Function::Mirror(Mirror { interface }) => match ifs.ifindex(interface.trim()) {
            Ok(i) => f(FnKind::Mirror, i, 0, 0, 0),
            Err(e) => return Some(Err(e)),
        },
        Function::Dpi(_) => return None,
    }))
}

/// The hand-over step `decompile` reports where the BPF part ends and user space takes over
/// (no function set, kind advanced); GetState replaces it with the advanced functions.
pub fn is_hand_over(f: &ChainFunction) -> bool {
    f.function.is_none() && f.kind == FunctionKind::Advanced as i32
}

/// Reads a datapath chain back into functions (typed parameters, catalogue kinds); counters
/// are filled by the caller.
pub fn decompile(chain: &Chain, ifs: &dyn Interfaces) -> Vec<ChainFunction> {
    let mut out = Vec::new();
    for f in chain.fns.iter().take((chain.len as usize).min(MAX_CHAIN_FNS)) {
        let keep = |v: u32| (v != KEEP).then_some(v);
        let function = match f.kind {
            k if k == FnKind::Forward as u32 => Function::Forward(Forward {}),
            k if k == FnKind::Acl as u32 => Function::Acl(Acl { proto: f.a, dst_port: f.b, src_port: f.c }),
            k if k == FnKind::Mark as u32 => Function::Mark(Mark { dscp: keep(f.a), ecn: keep(f.b) }),
            k if k == FnKind::Rate as u32 => {
                Function::RateLimit(RateLimit { rate_bps: f.c as u64 * 8, burst_bytes: f.d })
            }
            k if k == FnKind::Mirror as u32 => Function::Mirror(Mirror { interface: ifs.name(f.a) }),
            k if k == FnKind::ToUser as u32 => {
                out.push(ChainFunction { kind: FunctionKind::Advanced as i32, ..Default::default() });
                continue;
            }
            _ => {
                out.push(ChainFunction::default()); // unknown program: reported as unset
                continue;
            }
        };
        out.push(ChainFunction {
            kind: catalogue::spec(&function).kind as i32,
            function: Some(function),
            ..Default::default()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Bounds;
    use cgloop_proto::v1::{Dpi, dpi};

    struct NoIfs;
    impl Interfaces for NoIfs {
        fn ifindex(&self, name: &str) -> AgentResult<u32> {
            if name == "mon0" {
                Ok(7)
            } else {
                Err(AgentError::NotFound(format!("no interface {name}")))
            }
        }
        fn name(&self, ifindex: u32) -> String {
            if ifindex == 7 { "mon0".into() } else { format!("if{ifindex}") }
        }
    }

    static ANY: std::sync::LazyLock<Bounds> = std::sync::LazyLock::new(Bounds::default);

    /// The default bounds (any interface, 8 functions) on a two-core machine.
    fn any() -> Guard<'static> {
        Guard::with_cpus(&ANY, vec![0, 1])
    }

    fn func(function: Function, kind: FunctionKind) -> ChainFunction {
        ChainFunction { function: Some(function), kind: kind as i32, ..Default::default() }
    }

    fn dpi_fn() -> Function {
        Function::Dpi(Dpi {
            pattern: Some(dpi::Pattern::Text("GAME".into())),
            depth: None,
            on_match: Some(dpi::OnMatch::MarkDscp(46)),
        })
    }

    fn acl(proto: u32) -> Function {
        Function::Acl(Acl { proto, ..Default::default() })
    }

    fn mark(dscp: Option<u32>) -> Function {
        Function::Mark(Mark { dscp, ecn: None })
    }

    fn chain(fns: Vec<ChainFunction>) -> ServiceChain {
        ServiceChain { chain_id: "c".into(), traffic_class: "gaming".into(), functions: fns }
    }

    fn refusal(c: &ServiceChain) -> String {
        compile(c, &any(), &NoIfs).err().map(|e| e.to_string()).unwrap_or_default()
    }

    /// Every function the proto declares has the implementation its declared kind calls for:
    /// a BPF program for elementary and basic ones, a user-space function for advanced ones.
    #[test]
    fn every_declared_function_is_implemented_where_its_kind_says() {
        let samples = [
            Function::Forward(Forward {}),
            acl(17),
            mark(Some(46)),
            Function::RateLimit(RateLimit { rate_bps: 8_000_000, burst_bytes: 3000 }),
            Function::Mirror(Mirror { interface: "mon0".into() }),
            dpi_fn(),
        ];
        let mut seen: Vec<&str> = samples.iter().map(|f| catalogue::spec(f).name).collect();
        seen.sort();
        let mut declared: Vec<&str> = catalogue::FUNCTIONS.iter().map(|s| s.name).collect();
        declared.sort();
        assert_eq!(seen, declared, "a sample per declared function");
        for f in samples {
            let spec = catalogue::spec(&f);
            catalogue::check(&f).unwrap_or_else(|v| panic!("{}: {v}", spec.name));
            let in_bpf = datapath_fn(&f, &NoIfs).is_some();
            let in_user = crate::payload::build(&f, 0).is_ok();
            assert_eq!(in_bpf, spec.kind != FunctionKind::Advanced, "{}", spec.name);
            assert_eq!(in_user, spec.kind == FunctionKind::Advanced, "{}", spec.name);
        }
    }

    #[test]
    fn a_function_is_refused_in_the_other_place_by_calvin() {
        let err = refusal(&chain(vec![func(dpi_fn(), FunctionKind::Basic)]));
        assert!(err.contains("CALVIN") && err.contains("FUNCTION_KIND_ADVANCED"), "{err}");
        let err = refusal(&chain(vec![func(acl(6), FunctionKind::Advanced)]));
        assert!(err.contains("CALVIN") && err.contains("FUNCTION_KIND_BASIC"), "{err}");
        // Unset: the catalogue's kind.
        let c = chain(vec![func(acl(6), FunctionKind::Unspecified), func(dpi_fn(), FunctionKind::Unspecified)]);
        assert_eq!(compile(&c, &any(), &NoIfs).unwrap().advanced.len(), 1);
        let mut bad = func(acl(6), FunctionKind::Basic);
        bad.kind = 9;
        assert!(refusal(&chain(vec![bad])).contains("kind 9 is not a FunctionKind"));
    }

    #[test]
    fn a_function_without_a_member_set_is_refused_naming_the_catalogue() {
        let err = refusal(&chain(vec![ChainFunction::default()]));
        assert!(err.contains("#0: no function set") && err.contains("rate_limit (basic)"), "{err}");
        assert!(err.contains("dpi (advanced)") && err.contains("forward (elementary)"), "{err}");
    }

    #[test]
    fn advanced_suffix_goes_to_user_space_after_the_basic_prefix() {
        let dpi = func(dpi_fn(), FunctionKind::Advanced);
        let acl = func(acl(6), FunctionKind::Basic);
        let compiled = compile(&chain(vec![acl.clone(), dpi.clone()]), &any(), &NoIfs).unwrap();
        assert_eq!(compiled.bpf.len, 2);
        assert_eq!(compiled.bpf.fns[1].kind, FnKind::ToUser as u32);
        assert_eq!(compiled.advanced.len(), 1);
        assert_eq!(compiled.advanced[0].f.function(), dpi_fn());
        let back = decompile(&compiled.bpf, &NoIfs);
        assert!(is_hand_over(&back[1]) && !is_hand_over(&back[0]));
        // A basic function after an advanced one would have to come back to BPF: refused.
        let err = refusal(&chain(vec![dpi, acl]));
        assert!(err.contains("CALVIN") && err.contains("follows an advanced"), "{err}");
    }

    /// Natif's scale-out: the hand-over step carries the instances (b), one core per instance,
    /// `core` for each when instance_cores is empty.
    #[test]
    fn the_advanced_suffix_runs_on_the_instances_asked() {
        let dpi = |instances, core, cores: Vec<u32>| ChainFunction {
            instances,
            core,
            instance_cores: cores,
            ..func(dpi_fn(), FunctionKind::Advanced)
        };
        let mark = func(mark(Some(46)), FunctionKind::Basic);
        for (f, cores) in [
            (dpi(0, 0, vec![]), vec![0]),
            (dpi(1, 1, vec![]), vec![1]),
            (dpi(2, 1, vec![]), vec![1, 1]),
            (dpi(2, 0, vec![1, 0]), vec![1, 0]),
        ] {
            let c = compile(&chain(vec![mark.clone(), f]), &any(), &NoIfs).unwrap();
            assert_eq!(c.bpf.fns[1].kind, FnKind::ToUser as u32);
            assert_eq!(c.bpf.fns[1].b as usize, cores.len());
            assert_eq!(c.instance_cores, cores);
        }
        // Two advanced functions: the suffix runs on the larger count, pinned as its function asks.
        let c = compile(&chain(vec![dpi(1, 1, vec![]), dpi(2, 0, vec![0, 1])]), &any(), &NoIfs).unwrap();
        assert_eq!((c.bpf.fns[0].b, c.instance_cores.clone()), (2, vec![0, 1]));
        assert!(compile(&chain(vec![mark]), &any(), &NoIfs).unwrap().instance_cores.is_empty());
    }

    #[test]
    fn chain_round_trips_through_the_datapath_form() {
        let c = chain(vec![
            func(Function::Acl(Acl { proto: 17, dst_port: 9, src_port: 0 }), FunctionKind::Basic),
            func(mark(Some(46)), FunctionKind::Basic),
            func(Function::RateLimit(RateLimit { rate_bps: 8_000_000, burst_bytes: 3000 }), FunctionKind::Basic),
            func(Function::Mirror(Mirror { interface: "mon0".into() }), FunctionKind::Basic),
            func(Function::Forward(Forward {}), FunctionKind::Elementary),
        ]);
        let compiled = compile(&c, &any(), &NoIfs).unwrap().bpf;
        assert_eq!(compiled.len, 5);
        assert_eq!(decompile(&compiled, &NoIfs), c.functions);
    }

    /// issue 17 finding 5: with `[bounds] interfaces = ["rt0"]` a mirror to `lo` (or to
    /// another interface the node has) compiled and was installed.
    #[test]
    fn a_mirror_outside_the_interface_bounds_is_forbidden() {
        let rt0 = Bounds { interfaces: vec!["rt0".into()], ..Bounds::default() };
        let guard = Guard::with_cpus(&rt0, vec![0, 1]);
        for target in ["lo", "mon0"] {
            let m = Function::Mirror(Mirror { interface: target.into() });
            let c = chain(vec![func(m, FunctionKind::Basic)]);
            let err = compile(&c, &guard, &NoIfs).err().expect("refused");
            assert!(matches!(err, AgentError::Forbidden(_)), "{target}: {err:?}");
            assert!(err.to_string().contains(&format!("interface \"{target}\"")), "{err}");
        }
    }

    /// issue 17 finding 5: an advanced function pinned to core 9999 was accepted.
    #[test]
    fn a_function_pinned_to_a_missing_core_is_refused() {
        let mut dpi = func(dpi_fn(), FunctionKind::Advanced);
        dpi.core = 9999;
        let err = compile(&chain(vec![dpi]), &any(), &NoIfs).err().expect("refused");
        assert!(matches!(err, AgentError::Invalid(_)), "{err:?}");
        assert!(err.to_string().contains("core 9999"), "{err}");
    }

    #[test]
    fn bad_parameters_are_named_with_the_accepted_values() {
        let cases = [
            (mark(Some(64)), "#0 \"mark\": dscp 64 is not within 0..63"),
            (mark(None), "#0 \"mark\": set dscp, ecn, or several"),
            (Function::Acl(Acl { dst_port: 70000, ..Default::default() }), "dst_port 70000 is not within 0..65535"),
            (Function::RateLimit(RateLimit { rate_bps: 1_000_000, burst_bytes: 10 }), "burst_bytes 10 is not within 64..67108864"),
            (Function::Mirror(Mirror { interface: "x".repeat(16) }), "is not within length 1..15"),
        ];
        for (f, needle) in cases {
            let err = refusal(&chain(vec![func(f, FunctionKind::Basic)]));
            assert!(err.contains(needle), "{needle}: {err}");
        }
        let c = chain(vec![func(Function::Forward(Forward {}), FunctionKind::Elementary); 9]);
        assert!(matches!(compile(&c, &any(), &NoIfs).err().expect("refused"), AgentError::OutOfBounds(_)));
    }
}
