//! HTB hierarchies: validation against the bounds, the minimal kernel change from the current
//! tree to the desired one, and the read-back of what the kernel has.

use std::collections::{BTreeMap, BTreeSet};

use cgloop_proto::v1::{HtbClass, QueueHierarchy};

use crate::bounds::Guard;
use crate::config::Bounds;
use crate::error::{AgentError, AgentResult};
use crate::tc::{handle_str, ClassSpec, KernelClass, KernelHtbRoot};
use crate::{invalid, out_of_bounds};

/// HTB nests at most 8 levels (TC_HTB_MAXDEPTH).
const MAX_DEPTH: usize = 8;

pub fn major(handle: u32) -> u32 {
    handle >> 16
}

/// Checks a hierarchy and returns its classes parents-first with their depth.
pub fn validate(h: &QueueHierarchy, bounds: &Bounds) -> AgentResult<Vec<(usize, HtbClass)>> {
    if h.interface_name.is_empty() {
        invalid!("hierarchy.interface_name is empty");
    }
    if h.classes.len() > bounds.max_classes {
        out_of_bounds!("{} classes requested; the bound is {}", h.classes.len(), bounds.max_classes);
    }
    if h.classes.is_empty() {
        return Ok(Vec::new()); // removes the hierarchy
    }
    let qdisc_major = major(h.classes[0].class_id);
    let mut by_id: BTreeMap<u32, &HtbClass> = BTreeMap::new();
    let mut names = BTreeSet::new();
    for c in &h.classes {
        let id = handle_str(c.class_id);
        if c.name.is_empty() {
            invalid!("class {id} has no name");
        }
        if !names.insert(c.name.as_str()) {
            invalid!("class name {:?} is used twice", c.name);
        }
        if major(c.class_id) == 0 || c.class_id & 0xffff == 0 {
            invalid!("class {} ({id}): class_id needs a major and a non-zero minor, e.g. 1:10 = 0x00010010", c.name);
        }
        if major(c.class_id) != qdisc_major {
            invalid!("class {} ({id}): all classes must share the major {qdisc_major:x}", c.name);
        }
        if c.parent_class_id != 0 && major(c.parent_class_id) != qdisc_major {
            invalid!("class {} ({id}): parent {} is under another qdisc", c.name, handle_str(c.parent_class_id));
        }
        if by_id.insert(c.class_id, c).is_some() {
            invalid!("class_id {id} is used twice");
        }
        if c.priority > 7 {
            invalid!("class {} ({id}): priority {} is not within 0..7", c.name, c.priority);
        }
        for (what, v) in [("burst_bytes", c.burst_bytes), ("cburst_bytes", c.cburst_bytes)] {
            if v > bounds.max_burst_bytes {
                out_of_bounds!("class {} ({id}): {what} {v} exceeds the bound {}", c.name, bounds.max_burst_bytes);
            }
        }
    }
    // Depth of each class; refuses unknown parents and cycles.
    let mut out = Vec::new();
    for c in &h.classes {
        let mut depth = 0;
        let mut cur = c.parent_class_id;
        while cur != 0 {
            let Some(p) = by_id.get(&cur) else {
                invalid!("class {} ({}): parent {} is not in the hierarchy", c.name, handle_str(c.class_id), handle_str(cur));
            };
            depth += 1;
            if depth > MAX_DEPTH {
                invalid!("class {} ({}): deeper than HTB's {MAX_DEPTH} levels, or a cycle", c.name, handle_str(c.class_id));
            }
            cur = p.parent_class_id;
        }
        out.push((depth, c.clone()));
    }
    out.sort_by_key(|(d, c)| (*d, c.class_id));
    // Rates within the bounds and under each parent's ceil (once the tree is known sound).
    Guard::new(bounds).hierarchy_rates(h)?;
    let parents: BTreeSet<u32> = h.classes.iter().map(|c| c.parent_class_id).collect();
    let default = h.default_class_id;
    match by_id.get(&default) {
        None => invalid!("default_class_id {} is not a class of the hierarchy", handle_str(default)),
        Some(_) if parents.contains(&default) => {
            invalid!("default_class_id {} has children; HTB queues only in leaf classes", handle_str(default))
        }
        Some(_) => {}
    }
    Ok(out)
}

/// Leaf classes (those that can queue packets) of a hierarchy.
pub fn leaves(h: &QueueHierarchy) -> BTreeSet<u32> {
    let parents: BTreeSet<u32> = h.classes.iter().map(|c| c.parent_class_id).collect();
    h.classes.iter().map(|c| c.class_id).filter(|id| !parents.contains(id)).collect()
}

pub fn spec(c: &HtbClass) -> ClassSpec {
    let qdisc = c.class_id & 0xffff_0000;
    ClassSpec {
        handle: c.class_id,
        parent: if c.parent_class_id == 0 { qdisc } else { c.parent_class_id },
        rate_bytes: c.rate_bps / 8,
        ceil_bytes: c.ceil_bps / 8,
        // HTB needs some burst: default to what tc uses, rate/HZ with HZ = 1000 (>= one MTU).
        burst_bytes: if c.burst_bytes > 0 { c.burst_bytes } else { default_burst(c.rate_bps) },
        cburst_bytes: if c.cburst_bytes > 0 { c.cburst_bytes } else { default_burst(c.ceil_bps) },
        prio: c.priority,
    }
}

fn default_burst(rate_bps: u64) -> u32 {
    ((rate_bps / 8 / 1000) as u32).max(1600)
}

/// One step of moving the kernel from its classes to the desired ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Root(KernelHtbRoot),
    Delete(u32),
    Create(ClassSpec),
    Change(ClassSpec),
}

/// The steps, in an order the kernel accepts: root first, deletes children-first, then
/// creates and changes parents-first. A class that moves to another parent is recreated.
pub fn plan(
    root: Option<KernelHtbRoot>,
    kernel: &[KernelClass],
    desired: &[(usize, HtbClass)],
    default_class_id: u32,
) -> Vec<Step> {
    let Some((_, first)) = desired.first() else { return Vec::new() };
    let want_root =
        KernelHtbRoot { handle: first.class_id & 0xffff_0000, default_minor: default_class_id & 0xffff };
    let same_root = root.map(|r| r.handle) == Some(want_root.handle);
    let mut steps = Vec::new();
    if root != Some(want_root) {
        steps.push(Step::Root(want_root));
    }
    let kernel: BTreeMap<u32, &KernelClass> =
        if same_root { kernel.iter().map(|k| (k.handle, k)).collect() } else { BTreeMap::new() };
    let wanted: BTreeMap<u32, ClassSpec> = desired.iter().map(|(_, c)| (c.class_id, spec(c))).collect();
    let mut doomed: BTreeSet<u32> = kernel
        .values()
        .filter(|k| wanted.get(&k.handle).is_none_or(|w| w.parent != k.parent))
        .map(|k| k.handle)
        .collect();
    // Deleting a class needs its children gone: doom the whole subtree, deepest first.
    loop {
        let more: Vec<u32> = kernel
            .values()
            .filter(|k| doomed.contains(&k.parent) && !doomed.contains(&k.handle))
            .map(|k| k.handle)
            .collect();
        if more.is_empty() {
            break;
        }
        doomed.extend(more);
    }
    let depth = |mut h: u32| {
        let mut d = 0;
        while let Some(k) = kernel.get(&h) {
            h = k.parent;
            d += 1;
        }
        d
    };
    let mut deletes: Vec<u32> = doomed.iter().copied().collect();
    deletes.sort_by_key(|h| std::cmp::Reverse(depth(*h)));
    steps.extend(deletes.into_iter().map(Step::Delete));
    for (_, c) in desired {
        let s = wanted[&c.class_id];
        match kernel.get(&c.class_id) {
            Some(k) if !doomed.contains(&k.handle) => {
                if !same_params(k, &s) {
                    steps.push(Step::Change(s));
                }
            }
            _ => steps.push(Step::Create(s)),
        }
    }
    steps
}

fn same_params(k: &KernelClass, s: &ClassSpec) -> bool {
    let close = |a: u32, b: u32| (a as i64 - b as i64).abs() <= 64.max(b as i64 / 100);
    k.rate_bytes == s.rate_bytes
        && k.ceil_bytes == s.ceil_bytes
        && k.prio == s.prio
        && close(k.burst_bytes, s.burst_bytes)
        && close(k.cburst_bytes, s.cburst_bytes)
}

/// The kernel's view as a QueueHierarchy; names come from the desired tree (the kernel has
/// none).
pub fn from_kernel(
    interface_name: &str,
    root: KernelHtbRoot,
    classes: &[KernelClass],
    names: &BTreeMap<u32, String>,
) -> QueueHierarchy {
    QueueHierarchy {
        interface_name: interface_name.to_string(),
        default_class_id: root.handle | root.default_minor,
        classes: classes
            .iter()
            .map(|k| HtbClass {
                name: names.get(&k.handle).cloned().unwrap_or_default(),
                class_id: k.handle,
                parent_class_id: if k.parent == root.handle { 0 } else { k.parent },
                rate_bps: k.rate_bytes * 8,
                ceil_bps: k.ceil_bytes * 8,
                priority: k.prio,
                burst_bytes: k.burst_bytes,
                cburst_bytes: k.cburst_bytes,
                sent_packets: k.packets,
                sent_bytes: k.bytes,
                dropped_packets: k.drops as u64,
                backlog_bytes: k.backlog_bytes,
                backlog_packets: k.backlog_packets,
            })
            .collect(),
    }
}

pub fn not_found_class(iface: &str, class_id: u32) -> AgentError {
    AgentError::NotFound(format!("interface {iface} has no class {}", handle_str(class_id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, id: u32, parent: u32, rate: u64) -> HtbClass {
        HtbClass {
            name: name.into(),
            class_id: id,
            parent_class_id: parent,
            rate_bps: rate,
            ceil_bps: rate,
            priority: 0,
            ..Default::default()
        }
    }

    fn tree() -> QueueHierarchy {
        QueueHierarchy {
            interface_name: "eth0".into(),
            default_class_id: 0x10030,
            classes: vec![
                class("root", 0x10001, 0, 100_000_000),
                class("gaming", 0x10010, 0x10001, 50_000_000),
                class("bulk", 0x10030, 0x10001, 10_000_000),
            ],
        }
    }

    #[test]
    fn valid_tree_is_ordered_parents_first() {
        let v = validate(&tree(), &Bounds::default()).unwrap();
        assert_eq!(v[0].1.name, "root");
        assert_eq!(v[0].0, 0);
        assert_eq!(v[1].0, 1);
    }

    #[test]
    fn errors_name_the_field() {
        let b = Bounds::default();
        let mut t = tree();
        t.classes[1].rate_bps = 1;
        let e = validate(&t, &b).unwrap_err();
        assert!(matches!(e, AgentError::OutOfBounds(_)) && e.to_string().contains("rate_bps 1"), "{e}");
        let mut t = tree();
        t.classes[2].parent_class_id = 0x10099;
        assert!(validate(&t, &b).unwrap_err().to_string().contains("1:99"));
        let mut t = tree();
        t.default_class_id = 0x10001;
        assert!(validate(&t, &b).unwrap_err().to_string().contains("has children"));
        let mut t = tree();
        t.classes[0].parent_class_id = 0x10010; // cycle root <-> gaming
        assert!(validate(&t, &b).unwrap_err().to_string().contains("cycle"));
        let mut t = tree();
        t.classes[1].ceil_bps = 1_000_000;
        assert!(validate(&t, &b).unwrap_err().to_string().contains("ceil_bps"));
    }

    /// issue 17 finding 5: a child class at 500 Mbit/s under a 100 Mbit/s parent was accepted.
    #[test]
    fn a_child_class_faster_than_its_parent_is_refused() {
        let mut t = tree();
        t.classes[1].rate_bps = 500_000_000;
        t.classes[1].ceil_bps = 500_000_000;
        let e = validate(&t, &Bounds::default()).unwrap_err();
        assert!(matches!(e, AgentError::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains("class gaming (1:10): rate_bps 500000000 exceeds"), "{e}");
    }

    #[test]
    fn plan_creates_everything_on_a_bare_interface() {
        let t = tree();
        let v = validate(&t, &Bounds::default()).unwrap();
        let steps = plan(None, &[], &v, t.default_class_id);
        assert!(matches!(steps[0], Step::Root(KernelHtbRoot { handle: 0x10000, default_minor: 0x30 })));
        assert_eq!(steps.iter().filter(|s| matches!(s, Step::Create(_))).count(), 3);
    }

    #[test]
    fn plan_changes_only_what_differs_and_deletes_children_first() {
        let t = tree();
        let v = validate(&t, &Bounds::default()).unwrap();
        let as_kernel = |c: &HtbClass| {
            let s = spec(c);
            KernelClass {
                handle: s.handle,
                parent: s.parent,
                rate_bytes: s.rate_bytes,
                ceil_bytes: s.ceil_bytes,
                burst_bytes: s.burst_bytes,
                cburst_bytes: s.cburst_bytes,
                prio: s.prio,
                packets: 0,
                bytes: 0,
                drops: 0,
                overlimits: 0,
                backlog_bytes: 0,
                backlog_packets: 0,
            }
        };
        let mut kernel: Vec<KernelClass> = t.classes.iter().map(as_kernel).collect();
        let root = Some(KernelHtbRoot { handle: 0x10000, default_minor: 0x30 });
        assert!(plan(root, &kernel, &v, t.default_class_id).is_empty(), "already in place");
        // An extra subtree in the kernel goes, leaf first.
        kernel.push(as_kernel(&class("x", 0x10040, 0x10001, 1_000_000)));
        kernel.push(as_kernel(&class("y", 0x10041, 0x10040, 1_000_000)));
        kernel[1].rate_bytes += 1000;
        let steps = plan(root, &kernel, &v, t.default_class_id);
        assert_eq!(steps[0], Step::Delete(0x10041));
        assert_eq!(steps[1], Step::Delete(0x10040));
        assert!(matches!(steps[2], Step::Change(s) if s.handle == 0x10010));
        assert_eq!(steps.len(), 3);
    }
}
