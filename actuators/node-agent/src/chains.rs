//! Service chains: the catalogue of functions, the CALVIN placement rule, and the translation
//! of a chain to the datapath's `cgl_chain` (and back, for GetState).
//!
//! CALVIN (domain.md §4): header-only ("basic") functions run in BPF; functions that touch the
//! payload run in user space (AF_XDP), and a function never runs split across the two.

use std::collections::BTreeMap;

use cgloop_proto::v1::{ChainFunction, FunctionKind, ServiceChain};

use crate::bounds::Guard;
use crate::datapath::{Chain, ChainFn, FnKind, KEEP, MAX_CHAIN_FNS};
use crate::error::{AgentError, AgentResult};
use crate::invalid;

/// Where the catalogue says a function must run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Header-only: a BPF program in the tail-call chain.
    Bpf(FnKind),
    /// Reads or rewrites the payload: user space only.
    Payload,
}

/// Function names the agent knows and where each runs.
pub fn placement(name: &str) -> Option<Placement> {
    Some(match name {
        "forward" => Placement::Bpf(FnKind::Forward),
        "acl" | "firewall" => Placement::Bpf(FnKind::Acl),
        "mark" | "dscp_ecn_marker" => Placement::Bpf(FnKind::Mark),
        "rate_limit" | "token_bucket" => Placement::Bpf(FnKind::Rate),
        "mirror" => Placement::Bpf(FnKind::Mirror),
        "encrypt" | "decrypt" | "compress" | "decompress" | "transcode" | "fec_encode"
        | "fec_decode" | "dpi" | "redundancy_eliminator" => Placement::Payload,
        _ => return None,
    })
}

const KNOWN: &str = "forward, acl, mark, rate_limit, mirror (BPF); encrypt, decrypt, compress, \
                     decompress, transcode, fec_encode, fec_decode, dpi, redundancy_eliminator \
                     (payload, user space)";

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
}

/// Checks a chain against the bounds (every interface, core and rate its functions name), the
/// catalogue and CALVIN, and builds its datapath form.
pub fn compile(chain: &ServiceChain, guard: &Guard, ifs: &dyn Interfaces) -> AgentResult<Compiled> {
    if chain.traffic_class.is_empty() {
        invalid!("chain.traffic_class is empty: name the HTB class the chain serves");
    }
    guard.chain(chain)?;
    let mut out = Chain { len: chain.functions.len() as u32, ..Default::default() };
    let mut advanced = Vec::new();
    for (pos, f) in chain.functions.iter().enumerate() {
        let Some(place) = placement(&f.name) else {
            invalid!("chain function #{pos} {:?} is unknown; known functions: {KNOWN}", f.name);
        };
        let kind = FunctionKind::try_from(f.kind).unwrap_or(FunctionKind::Unspecified);
        let fn_kind = match (place, kind) {
            (Placement::Payload, FunctionKind::Advanced) => {
                if advanced.is_empty() {
                    out.fns[pos] = ChainFn { kind: FnKind::ToUser as u32, ..Default::default() };
                    out.len = pos as u32 + 1;
                }
                advanced.push(crate::advanced::AdvFn {
                    name: f.name.clone(),
                    f: crate::payload::build(f, pos)?,
                    counters: Default::default(),
                });
                continue;
            }
            (Placement::Payload, _) => {
                invalid!(
                    "CALVIN: chain function #{pos} {:?} touches the payload and is refused in \
                     BPF; declare it FUNCTION_KIND_ADVANCED to run it in user space",
                    f.name
                );
            }
            (Placement::Bpf(_), FunctionKind::Advanced) => {
                invalid!(
                    "CALVIN: chain function #{pos} {:?} is header-only and runs in BPF; a \
                     function is never moved to (or split into) user space",
                    f.name
                );
            }
            (Placement::Bpf(k), _) => k,
        };
        if !advanced.is_empty() {
            invalid!(
                "CALVIN: chain function #{pos} {:?} is basic but follows an advanced one; basic \
                 functions run in BPF before the hand-over to user space, so put them first",
                f.name
            );
        }
        out.fns[pos] = function_params(fn_kind, f, pos, ifs)?;
    }
    Ok(Compiled { bpf: out, advanced })
}

fn param<T: std::str::FromStr>(
    f: &ChainFunction,
    pos: usize,
    key: &str,
    default: Option<T>,
) -> AgentResult<T> {
    match f.params.get(key) {
        Some(v) => v.trim().parse::<T>().map_err(|_| {
            AgentError::Invalid(format!(
                "chain function #{pos} {:?}: parameter {key}={v:?} is not a valid number",
                f.name
            ))
        }),
        None => default.ok_or_else(|| {
            AgentError::Invalid(format!(
                "chain function #{pos} {:?}: parameter {key} is required",
                f.name
            ))
        }),
    }
}

fn function_params(
    kind: FnKind,
    f: &ChainFunction,
    pos: usize,
    ifs: &dyn Interfaces,
) -> AgentResult<ChainFn> {
    let allowed: &[&str] = match kind {
        FnKind::Forward => &[],
        FnKind::Acl => &["proto", "dst_port", "src_port"],
        FnKind::Mark => &["dscp", "ecn"],
        FnKind::Rate => &["rate_bps", "burst_bytes"],
        FnKind::Mirror => &["interface"],
        FnKind::ToUser => &[],
    };
    if let Some(k) = f.params.keys().find(|k| !allowed.contains(&k.as_str())) {
        invalid!("chain function #{pos} {:?}: unknown parameter {k:?} (takes {allowed:?})", f.name);
    }
    let mut out = ChainFn { kind: kind as u32, ..Default::default() };
    match kind {
        FnKind::Forward => {}
        FnKind::Acl => {
            out.a = param::<u8>(f, pos, "proto", Some(0))? as u32;
            out.b = param::<u16>(f, pos, "dst_port", Some(0))? as u32;
            out.c = param::<u16>(f, pos, "src_port", Some(0))? as u32;
        }
        FnKind::Mark => {
            out.a = match f.params.get("dscp") {
                None => KEEP,
                Some(_) => param::<u8>(f, pos, "dscp", None)? as u32,
            };
            out.b = match f.params.get("ecn") {
                None => KEEP,
                Some(_) => param::<u8>(f, pos, "ecn", None)? as u32,
            };
            if out.a != KEEP && out.a > 63 {
                invalid!("chain function #{pos} mark: dscp {} is not within 0..63", out.a);
            }
            if out.b != KEEP && out.b > 3 {
                invalid!("chain function #{pos} mark: ecn {} is not within 0..3", out.b);
            }
            if out.a == KEEP && out.b == KEEP {
                invalid!("chain function #{pos} mark: set dscp, ecn or both");
            }
        }
        FnKind::Rate => {
            let rate_bps = param::<u64>(f, pos, "rate_bps", None)?;
            let burst = param::<u64>(f, pos, "burst_bytes", None)?;
            if rate_bps < 8 || rate_bps / 8 > u32::MAX as u64 {
                invalid!("chain function #{pos} rate_limit: rate_bps {rate_bps} is not within 8..34e9");
            }
            if !(64..=64 * 1024 * 1024).contains(&burst) {
                invalid!("chain function #{pos} rate_limit: burst_bytes {burst} is not within 64..64MiB");
            }
            out.c = (rate_bps / 8) as u32;
            out.d = burst;
        }
        FnKind::Mirror => {
            let Some(name) = f.params.get("interface") else {
                invalid!("chain function #{pos} mirror: parameter interface is required");
            };
            // Within the bounds: Guard::chain checked it before any function was built.
            out.a = ifs.ifindex(name.trim())?;
        }
        FnKind::ToUser => {}
    }
    Ok(out)
}

/// Reads a datapath chain back into functions (names, parameters); counters are filled by the
/// caller.
pub fn decompile(chain: &Chain, ifs: &dyn Interfaces) -> Vec<ChainFunction> {
    let mut out = Vec::new();
    for f in chain.fns.iter().take((chain.len as usize).min(MAX_CHAIN_FNS)) {
        let mut params = BTreeMap::new();
        let name = match f.kind {
            k if k == FnKind::Forward as u32 => "forward",
            k if k == FnKind::Acl as u32 => {
                for (key, v) in [("proto", f.a), ("dst_port", f.b), ("src_port", f.c)] {
                    if v != 0 {
                        params.insert(key.to_string(), v.to_string());
                    }
                }
                "acl"
            }
            k if k == FnKind::Mark as u32 => {
                if f.a != KEEP {
                    params.insert("dscp".into(), f.a.to_string());
                }
                if f.b != KEEP {
                    params.insert("ecn".into(), f.b.to_string());
                }
                "mark"
            }
            k if k == FnKind::Rate as u32 => {
                params.insert("rate_bps".into(), (f.c as u64 * 8).to_string());
                params.insert("burst_bytes".into(), f.d.to_string());
                "rate_limit"
            }
            k if k == FnKind::Mirror as u32 => {
                params.insert("interface".into(), ifs.name(f.a));
                "mirror"
            }
            k if k == FnKind::ToUser as u32 => "to_user",
            _ => "unknown",
        };
        out.push(ChainFunction {
            name: name.into(),
            kind: FunctionKind::Basic as i32,
            params,
            ..Default::default()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Bounds;

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

    fn func(name: &str, kind: FunctionKind, params: &[(&str, &str)]) -> ChainFunction {
        ChainFunction {
            name: name.into(),
            kind: kind as i32,
            params: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        }
    }

    fn chain(fns: Vec<ChainFunction>) -> ServiceChain {
        ServiceChain { chain_id: "c".into(), traffic_class: "gaming".into(), functions: fns }
    }

    #[test]
    fn payload_function_in_bpf_is_refused_by_calvin() {
        let c = chain(vec![func("encrypt", FunctionKind::Basic, &[])]);
        let err = compile(&c, &any(), &NoIfs).err().expect("refused");
        assert!(matches!(err, AgentError::Invalid(_)));
        assert!(err.to_string().contains("CALVIN"), "{err}");
    }

    #[test]
    fn header_function_is_never_moved_to_user_space() {
        let c = chain(vec![func("acl", FunctionKind::Advanced, &[])]);
        assert!(compile(&c, &any(), &NoIfs).err().expect("refused").to_string().contains("CALVIN"));
    }

    #[test]
    fn advanced_function_without_an_implementation_says_so() {
        let c = chain(vec![func("transcode", FunctionKind::Advanced, &[])]);
        assert!(matches!(compile(&c, &any(), &NoIfs).err(), Some(AgentError::Unimplemented(_))));
    }

    #[test]
    fn advanced_suffix_goes_to_user_space_after_the_basic_prefix() {
        let dpi = func("dpi", FunctionKind::Advanced, &[("pattern", "GAME"), ("dscp", "46")]);
        let acl = func("acl", FunctionKind::Basic, &[("proto", "6")]);
        let compiled = compile(&chain(vec![acl.clone(), dpi.clone()]), &any(), &NoIfs).unwrap();
        assert_eq!(compiled.bpf.len, 2);
        assert_eq!(compiled.bpf.fns[1].kind, FnKind::ToUser as u32);
        assert_eq!(compiled.advanced.len(), 1);
        assert_eq!(compiled.advanced[0].name, "dpi");
        // A basic function after an advanced one would have to come back to BPF: refused.
        let err = compile(&chain(vec![dpi, acl]), &any(), &NoIfs).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("CALVIN") && err.contains("follows an advanced"), "{err}");
    }

    #[test]
    fn chain_round_trips_through_the_datapath_form() {
        let c = chain(vec![
            func("acl", FunctionKind::Basic, &[("proto", "17"), ("dst_port", "9")]),
            func("mark", FunctionKind::Basic, &[("dscp", "46")]),
            func("rate_limit", FunctionKind::Basic, &[("rate_bps", "8000000"), ("burst_bytes", "3000")]),
            func("mirror", FunctionKind::Basic, &[("interface", "mon0")]),
            func("forward", FunctionKind::Elementary, &[]),
        ]);
        let compiled = compile(&c, &any(), &NoIfs).unwrap().bpf;
        assert_eq!(compiled.len, 5);
        let back = decompile(&compiled, &NoIfs);
        let names: Vec<_> = back.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["acl", "mark", "rate_limit", "mirror", "forward"]);
        assert_eq!(back[0].params["dst_port"], "9");
        assert_eq!(back[1].params["dscp"], "46");
        assert!(!back[1].params.contains_key("ecn"));
        assert_eq!(back[2].params["rate_bps"], "8000000");
        assert_eq!(back[3].params["interface"], "mon0");
    }

    /// issue 17 finding 5: with `[bounds] interfaces = ["rt0"]` a mirror to `lo` (or to
    /// another interface the node has) compiled and was installed.
    #[test]
    fn a_mirror_outside_the_interface_bounds_is_forbidden() {
        let rt0 = Bounds { interfaces: vec!["rt0".into()], ..Bounds::default() };
        let guard = Guard::with_cpus(&rt0, vec![0, 1]);
        for target in ["lo", "mon0"] {
            let c = chain(vec![func("mirror", FunctionKind::Basic, &[("interface", target)])]);
            let err = compile(&c, &guard, &NoIfs).err().expect("refused");
            assert!(matches!(err, AgentError::Forbidden(_)), "{target}: {err:?}");
            assert!(err.to_string().contains(&format!("interface \"{target}\"")), "{err}");
        }
    }

    /// issue 17 finding 5: an advanced function pinned to core 9999 was accepted.
    #[test]
    fn a_function_pinned_to_a_missing_core_is_refused() {
        let mut dpi = func("dpi", FunctionKind::Advanced, &[("pattern", "GAME"), ("dscp", "46")]);
        dpi.core = 9999;
        let err = compile(&chain(vec![dpi]), &any(), &NoIfs).err().expect("refused");
        assert!(matches!(err, AgentError::Invalid(_)), "{err:?}");
        assert!(err.to_string().contains("core 9999"), "{err}");
    }

    #[test]
    fn bad_parameters_are_named() {
        let c = chain(vec![func("mark", FunctionKind::Basic, &[("dscp", "64")])]);
        assert!(compile(&c, &any(), &NoIfs).err().expect("refused").to_string().contains("dscp 64"));
        let c = chain(vec![func("acl", FunctionKind::Basic, &[("port", "1")])]);
        assert!(compile(&c, &any(), &NoIfs).err().expect("refused").to_string().contains("\"port\""));
        let c = chain(vec![func("rate_limit", FunctionKind::Basic, &[("rate_bps", "x1")])]);
        assert!(compile(&c, &any(), &NoIfs).err().expect("refused").to_string().contains("rate_bps"));
        let c = chain(vec![func("forward", FunctionKind::Basic, &[]); 9]);
        assert!(matches!(compile(&c, &any(), &NoIfs).err().expect("refused"), AgentError::OutOfBounds(_)));
    }
}
