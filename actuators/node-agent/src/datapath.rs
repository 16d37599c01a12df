//! The tc datapath (bpf/agent.bpf.c): loading, attaching on clsact egress, and the map writes
//! that reclassify flows, set DSCP rules and impairments and swap service chains.
//!
//! The skeleton is only used to load; the agent then keeps owned map and program descriptors
//! (dup'ed fds), so the datapath is `Send` and lives as long as the agent.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, MapHandle, TcHookBuilder, TC_EGRESS, TC_INGRESS};

mod skel {
    #![allow(clippy::all, dead_code, non_camel_case_types, unused_imports)]
    include!(concat!(env!("OUT_DIR"), "/agent.skel.rs"));
}

pub use skel::types::{
    cgl_chain as Chain, cgl_chain_fn as ChainFn, cgl_flow_key as FlowKey,
    cgl_flow_rule as FlowRule, qmon_class as QmonClass, qmon_key as QmonKey,
    qprot_cfg as QprotCfg, qprot_flow as QprotFlow,
};
use skel::types::{cgl_class_key, cgl_dscp_key, cgl_fn_counters, cgl_flow_counters, cgl_impairment};

pub const KEEP: u32 = 0xff;
pub const MAX_CHAIN_FNS: usize = 8;
pub const MAX_CHAIN_SLOTS: u32 = 512;
/// Instances of the advanced functions (CGL_MAX_ADV_INSTANCES in bpf/agent.h).
pub const MAX_ADV_INSTANCES: usize = 16;
/// tc filter handle and priority of the classifier on clsact egress ("cgl").
const TC_HANDLE: u32 = 0xc61;
const TC_PRIORITY: u32 = 1;

/// Indices into the `fn_progs` program array (enum cgl_fn_kind in bpf/agent.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum FnKind {
    Forward = 0,
    Acl = 1,
    Mark = 2,
    Rate = 3,
    Mirror = 4,
    /// Hand-over to the user-space advanced functions (AF_XDP); a = instance 0's port ifindex,
    /// b = instances (a hash of the flow picks one; `adv_ports` has their ports).
    ToUser = 5,
}

/// Counters of one chain position, summed over CPUs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FnCounters {
    pub packets: u64,
    pub bytes: u64,
    pub dropped: u64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ImpairmentState {
    pub threshold: u32,
    pub seen: u64,
    pub dropped: u64,
}

pub struct Datapath {
    classify: OwnedFd,
    flow_class: MapHandle,
    dscp_class: MapHandle,
    flow_drop: MapHandle,
    if_default: MapHandle,
    class_chain: MapHandle,
    chains: MapHandle,
    fn_counters: MapHandle,
    buckets: MapHandle,
    flow_counters: MapHandle,
    /// Held so the tail-call targets stay in the program array (it is emptied when the last
    /// user-space reference goes).
    _fn_progs: MapHandle,
    _fn_prog_fds: Vec<OwnedFd>,
    /// AF_XDP: the XSKMAP, ifindex -> MAC for the return path, and the two port programs.
    pub xsks: MapHandle,
    adv_ports: MapHandle,
    xsk_of_if: MapHandle,
    adv_if_mac: MapHandle,
    xsk_rx: OwnedFd,
    adv_return: OwnedFd,
    attached: HashMap<u32, ()>,
    /// Queue monitor and L4S class maps (bpf/qmon.bpf.h, bpf/qprot.bpf.h), and the tracepoint
    /// links (the monitor's programs run while these live).
    qmon: QmonMaps,
    _qmon_links: Vec<libbpf_rs::Link>,
    /// Why the tracepoint programs are not attached (the monitor reports it).
    pub qmon_attach_error: Option<String>,
    /// The INT source's maps (bpf/int.bpf.h; src/int_export).
    int: crate::int_export::IntMaps,
}

/// Map handles the queue monitor (src/qmon.rs) and queue protection (src/qprot.rs) own a dup of.
pub struct QmonMaps {
    pub if_default: MapHandle,
    pub qmon_index: MapHandle,
    /// BPF_F_MMAPABLE array of `QmonClass`, indexed by the slot in `qmon_index`.
    pub qmon_stats: MapHandle,
    pub qprot_cfg: MapHandle,
    pub qprot_state: MapHandle,
    pub qprot_flows: MapHandle,
}

impl QmonMaps {
    pub fn try_clone(&self) -> Result<Self> {
        let dup = |m: &MapHandle| MapHandle::try_from(m).context("dup of a queue monitor map fd");
        Ok(Self {
            if_default: dup(&self.if_default)?,
            qmon_index: dup(&self.qmon_index)?,
            qmon_stats: dup(&self.qmon_stats)?,
            qprot_cfg: dup(&self.qprot_cfg)?,
            qprot_state: dup(&self.qprot_state)?,
            qprot_flows: dup(&self.qprot_flows)?,
        })
    }
}

/// Plain-old-data view of a `#[repr(C)]` skeleton type for map keys and values.
pub(crate) fn bytes_of<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: T is a #[repr(C)] struct of integers generated from bpf/agent.h, without padding
    // holes (the header pads explicitly), so every byte is initialised.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

pub(crate) fn from_bytes<T: Copy + Default>(b: &[u8]) -> T {
    let mut v = T::default();
    let n = b.len().min(std::mem::size_of::<T>());
    // SAFETY: as above; every bit pattern of these integer structs is valid.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), (&mut v as *mut T).cast::<u8>(), n) };
    v
}

impl Datapath {
    /// Loads the BPF object into the kernel (needs CAP_BPF/CAP_NET_ADMIN).
    pub fn load() -> Result<Self> {
        let mut storage = MaybeUninit::uninit();
        let open = skel::AgentSkelBuilder::default()
            .open(&mut storage)
            .context("opening the BPF object")?;
        let skel = open.load().context("loading the BPF programs (verifier or permissions)")?;
        let handle = |m: &libbpf_rs::MapMut<'_>, name: &str| {
            MapHandle::try_from(m).with_context(|| format!("dup fd of map {name}"))
        };
        let fn_progs = handle(&skel.maps.fn_progs, "fn_progs")?;
        let mut fn_prog_fds = Vec::new();
        for (kind, prog) in [
            (FnKind::Forward, &skel.progs.cgl_fn_forward),
            (FnKind::Acl, &skel.progs.cgl_fn_acl),
            (FnKind::Mark, &skel.progs.cgl_fn_mark),
            (FnKind::Rate, &skel.progs.cgl_fn_rate),
            (FnKind::Mirror, &skel.progs.cgl_fn_mirror),
            (FnKind::ToUser, &skel.progs.cgl_fn_to_user),
        ] {
            let fd = prog.as_fd().try_clone_to_owned().context("dup program fd")?;
            let raw = std::os::fd::AsRawFd::as_raw_fd(&fd) as u32;
            fn_progs
                .update(&(kind as u32).to_ne_bytes(), &raw.to_ne_bytes(), MapFlags::ANY)
                .with_context(|| format!("installing chain function {kind:?} in fn_progs"))?;
            fn_prog_fds.push(fd);
        }
        // The monitor's tracepoints: without them the agent still classifies; the monitor
        // then says why it has no queue ticks.
        let mut qmon_links = Vec::new();
        let mut qmon_attach_error = None;
        for prog in [&skel.progs.cgl_qmon_enqueue, &skel.progs.cgl_qmon_dequeue] {
            match prog.attach() {
                Ok(link) => qmon_links.push(link),
                Err(e) => {
                    qmon_attach_error = Some(format!("attaching the qdisc tracepoint programs: {e}"));
                    qmon_links.clear();
                    break;
                }
            }
        }
        let qmon = QmonMaps {
            if_default: handle(&skel.maps.if_default, "if_default")?,
            qmon_index: handle(&skel.maps.qmon_index, "qmon_index")?,
            qmon_stats: handle(&skel.maps.qmon_stats, "qmon_stats")?,
            qprot_cfg: handle(&skel.maps.qprot_cfg, "qprot_cfg")?,
            qprot_state: handle(&skel.maps.qprot_state, "qprot_state")?,
            qprot_flows: handle(&skel.maps.qprot_flows, "qprot_flows")?,
        };
        Ok(Self {
            classify: skel.progs.cgl_classify.as_fd().try_clone_to_owned().context("dup fd")?,
            flow_class: handle(&skel.maps.flow_class, "flow_class")?,
            dscp_class: handle(&skel.maps.dscp_class, "dscp_class")?,
            flow_drop: handle(&skel.maps.flow_drop, "flow_drop")?,
            if_default: handle(&skel.maps.if_default, "if_default")?,
            class_chain: handle(&skel.maps.class_chain, "class_chain")?,
            chains: handle(&skel.maps.chains, "chains")?,
            fn_counters: handle(&skel.maps.fn_counters, "fn_counters")?,
            buckets: handle(&skel.maps.buckets, "buckets")?,
            flow_counters: handle(&skel.maps.flow_counters, "flow_counters")?,
            _fn_progs: fn_progs,
            _fn_prog_fds: fn_prog_fds,
            xsks: handle(&skel.maps.xsks, "xsks")?,
            adv_ports: handle(&skel.maps.adv_ports, "adv_ports")?,
            xsk_of_if: handle(&skel.maps.xsk_of_if, "xsk_of_if")?,
            adv_if_mac: handle(&skel.maps.adv_if_mac, "adv_if_mac")?,
            xsk_rx: skel.progs.cgl_xsk_rx.as_fd().try_clone_to_owned().context("dup fd")?,
            adv_return: skel.progs.cgl_adv_return.as_fd().try_clone_to_owned().context("dup fd")?,
            attached: HashMap::new(),
            int: crate::int_export::IntMaps {
                cfg: handle(&skel.maps.int_cfg, "int_cfg")?,
                ifaces: handle(&skel.maps.int_ifaces, "int_ifaces")?,
                counters: handle(&skel.maps.int_counters, "int_counters")?,
                events: handle(&skel.maps.int_events, "int_events")?,
                qmon_index: handle(&skel.maps.qmon_index, "qmon_index")?,
            },
            qmon,
            _qmon_links: qmon_links,
            qmon_attach_error,
        })
    }

    /// Dups of the queue monitor's and queue protection's maps.
    pub fn qmon_maps(&self) -> Result<QmonMaps> {
        self.qmon.try_clone()
    }

    /// Dups of the INT source's maps.
    pub fn int_maps(&self) -> Result<crate::int_export::IntMaps> {
        self.int.try_clone()
    }

    /// Attaches the classifier on the interface's clsact egress hook (replacing an earlier
    /// agent's filter at the same handle, e.g. after a restart).
    pub fn attach(&mut self, ifindex: u32) -> Result<()> {
        if self.attached.contains_key(&ifindex) {
            return Ok(());
        }
        let mut hook = TcHookBuilder::new(self.classify.as_fd())
            .ifindex(ifindex as i32)
            .replace(true)
            .handle(TC_HANDLE)
            .priority(TC_PRIORITY)
            .hook(TC_EGRESS);
        hook.create().with_context(|| format!("creating clsact on ifindex {ifindex}"))?;
        hook.attach().with_context(|| format!("attaching cls_bpf on ifindex {ifindex} egress"))?;
        self.attached.insert(ifindex, ());
        Ok(())
    }

    /// Wires the AF_XDP port: XDP `cgl_xsk_rx` on `peer` (frames into the XSKMAP) and tc
    /// ingress `cgl_adv_return` on `port` (frames back from user space to their interface).
    pub fn attach_adv_port(&self, port: u32, peer: u32) -> Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: plain FFI call with a valid program fd; opts may be NULL.
        let rc = unsafe {
            libbpf_rs::libbpf_sys::bpf_xdp_attach(
                peer as i32,
                self.xsk_rx.as_raw_fd(),
                libbpf_rs::libbpf_sys::XDP_FLAGS_DRV_MODE,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            anyhow::bail!(
                "attaching XDP cgl_xsk_rx on ifindex {peer}: {}",
                std::io::Error::from_raw_os_error(-rc)
            );
        }
        let mut hook = TcHookBuilder::new(self.adv_return.as_fd())
            .ifindex(port as i32)
            .replace(true)
            .handle(TC_HANDLE)
            .priority(TC_PRIORITY)
            .hook(TC_INGRESS);
        hook.create().with_context(|| format!("creating clsact on ifindex {port}"))?;
        hook.attach().with_context(|| format!("attaching cgl_adv_return on ifindex {port} ingress"))?;
        Ok(())
    }

    /// Wires instance `i` of the advanced functions: its port (where `cgl_fn_to_user` sends the
    /// flows whose hash picks it), its peer and the AF_XDP socket bound to the peer's queue 0.
    pub fn set_adv_instance(&self, i: u32, port: u32, peer: u32, xsk_fd: i32) -> Result<()> {
        self.xsks
            .update(&i.to_ne_bytes(), &(xsk_fd as u32).to_ne_bytes(), MapFlags::ANY)
            .with_context(|| format!("xsks update (instance {i})"))?;
        self.xsk_of_if
            .update(&peer.to_ne_bytes(), &i.to_ne_bytes(), MapFlags::ANY)
            .with_context(|| format!("xsk_of_if update (instance {i})"))?;
        self.adv_ports
            .update(&i.to_ne_bytes(), &port.to_ne_bytes(), MapFlags::ANY)
            .with_context(|| format!("adv_ports update (instance {i})"))
    }

    /// Forgets instance `i` (its port is gone); no slot in use points at it.
    pub fn clear_adv_instance(&self, i: u32, peer: u32) {
        let _ = self.adv_ports.update(&i.to_ne_bytes(), &0u32.to_ne_bytes(), MapFlags::ANY);
        let _ = self.xsk_of_if.delete(&peer.to_ne_bytes());
        let _ = self.xsks.delete(&i.to_ne_bytes());
    }

    /// The MAC the return path restores on frames of `ifindex`.
    pub fn set_adv_if_mac(&self, ifindex: u32, mac: [u8; 6]) -> Result<()> {
        let mut v = [0u8; 8];
        v[..6].copy_from_slice(&mac);
        self.adv_if_mac
            .update(&ifindex.to_ne_bytes(), &v, MapFlags::ANY)
            .context("adv_if_mac update")
    }

    /// Id of the BPF program the kernel has at our filter slot, if any (GetState read-back).
    pub fn attached_prog_id(&self, ifindex: u32) -> Option<u32> {
        let mut hook = TcHookBuilder::new(self.classify.as_fd())
            .ifindex(ifindex as i32)
            .handle(TC_HANDLE)
            .priority(TC_PRIORITY)
            .hook(TC_EGRESS);
        hook.query().ok()
    }

    pub fn detach(&mut self, ifindex: u32) -> Result<()> {
        self.attached.remove(&ifindex);
        let mut hook = TcHookBuilder::new(self.classify.as_fd())
            .ifindex(ifindex as i32)
            .handle(TC_HANDLE)
            .priority(TC_PRIORITY)
            .hook(TC_EGRESS);
        hook.detach().with_context(|| format!("detaching cls_bpf from ifindex {ifindex}"))?;
        Ok(())
    }

    pub fn set_default_class(&self, ifindex: u32, classid: u32) -> Result<()> {
        self.if_default
            .update(&ifindex.to_ne_bytes(), &classid.to_ne_bytes(), MapFlags::ANY)
            .context("if_default update")
    }

    pub fn set_flow(&self, key: &FlowKey, rule: Option<FlowRule>) -> Result<()> {
        match rule {
            Some(rule) => {
                self.flow_class
                    .update(bytes_of(key), bytes_of(&rule), MapFlags::ANY)
                    .context("flow_class update")?;
                // Fresh per-CPU zeros so counters describe this rule only.
                let zero = vec![0u8; std::mem::size_of::<cgl_flow_counters>()];
                let cpus = libbpf_rs::num_possible_cpus()?;
                self.flow_counters
                    .update_percpu(bytes_of(key), &vec![zero; cpus], MapFlags::NO_EXIST)
                    .or_else(|_| Ok::<(), libbpf_rs::Error>(()))?;
            }
            None => {
                let _ = self.flow_class.delete(bytes_of(key));
                let _ = self.flow_counters.delete(bytes_of(key));
            }
        }
        Ok(())
    }

    /// Every flow rule in the kernel map, with its counters.
    pub fn flows(&self) -> Result<Vec<(FlowKey, FlowRule, FnCounters)>> {
        let mut out = Vec::new();
        for key in self.flow_class.keys() {
            let Some(value) = self.flow_class.lookup(&key, MapFlags::ANY)? else { continue };
            let mut counters = FnCounters::default();
            if let Some(per_cpu) = self.flow_counters.lookup_percpu(&key, MapFlags::ANY)? {
                for c in per_cpu {
                    let c: cgl_flow_counters = from_bytes(&c);
                    counters.packets += c.packets;
                    counters.bytes += c.bytes;
                }
            }
            out.push((from_bytes(&key), from_bytes(&value), counters));
        }
        Ok(out)
    }

    pub fn set_dscp_rule(&self, ifindex: u32, dscp: u32, rule: Option<FlowRule>) -> Result<()> {
        let key = cgl_dscp_key { ifindex, dscp };
        match rule {
            Some(rule) => self
                .dscp_class
                .update(bytes_of(&key), bytes_of(&rule), MapFlags::ANY)
                .context("dscp_class update"),
            None => {
                let _ = self.dscp_class.delete(bytes_of(&key));
                Ok(())
            }
        }
    }

    /// (ifindex, dscp, rule) for every DSCP rule in the kernel map.
    pub fn dscp_rules(&self) -> Result<Vec<(u32, u32, FlowRule)>> {
        let mut out = Vec::new();
        for key in self.dscp_class.keys() {
            let Some(value) = self.dscp_class.lookup(&key, MapFlags::ANY)? else { continue };
            let k: cgl_dscp_key = from_bytes(&key);
            out.push((k.ifindex, k.dscp, from_bytes(&value)));
        }
        Ok(out)
    }

    /// Sets the drop threshold of a flow (None removes the impairment).
    pub fn set_impairment(&self, key: &FlowKey, threshold: Option<u32>) -> Result<()> {
        match threshold {
            Some(threshold) => {
                let v = cgl_impairment { threshold, ..Default::default() };
                self.flow_drop
                    .update(bytes_of(key), bytes_of(&v), MapFlags::ANY)
                    .context("flow_drop update")
            }
            None => {
                let _ = self.flow_drop.delete(bytes_of(key));
                Ok(())
            }
        }
    }

    pub fn impairments(&self) -> Result<Vec<(FlowKey, ImpairmentState)>> {
        let mut out = Vec::new();
        for key in self.flow_drop.keys() {
            let Some(value) = self.flow_drop.lookup(&key, MapFlags::ANY)? else { continue };
            let v: cgl_impairment = from_bytes(&value);
            out.push((
                from_bytes(&key),
                ImpairmentState { threshold: v.threshold, seen: v.seen, dropped: v.dropped },
            ));
        }
        Ok(out)
    }

    /// Writes `chain` into `slot`, resets that slot's counters and buckets, then points
    /// (ifindex, classid) at it: packets see either the old chain or the new one, never a mix
    /// of their configuration.
    pub fn install_chain(&self, ifindex: u32, classid: u32, slot: u32, chain: &Chain) -> Result<()> {
        anyhow::ensure!(slot < MAX_CHAIN_SLOTS, "chain slot {slot} out of range");
        self.chains
            .update(&slot.to_ne_bytes(), bytes_of(chain), MapFlags::ANY)
            .context("chains update")?;
        let cpus = libbpf_rs::num_possible_cpus()?;
        let zero_counters = vec![vec![0u8; std::mem::size_of::<cgl_fn_counters>()]; cpus];
        let zero_bucket = vec![0u8; self.buckets.value_size() as usize];
        for pos in 0..MAX_CHAIN_FNS as u32 {
            let idx = (slot * MAX_CHAIN_FNS as u32 + pos).to_ne_bytes();
            self.fn_counters.update_percpu(&idx, &zero_counters, MapFlags::ANY)?;
            self.buckets.update(&idx, &zero_bucket, MapFlags::ANY)?;
        }
        self.link_chain(ifindex, classid, Some(slot))
    }

    /// Points a class at a chain slot (None unlinks the class from any chain).
    pub fn link_chain(&self, ifindex: u32, classid: u32, slot: Option<u32>) -> Result<()> {
        let key = cgl_class_key { ifindex, classid };
        match slot {
            Some(slot) => self
                .class_chain
                .update(bytes_of(&key), &slot.to_ne_bytes(), MapFlags::ANY)
                .context("class_chain update"),
            None => {
                let _ = self.class_chain.delete(bytes_of(&key));
                Ok(())
            }
        }
    }

    /// (ifindex, classid) -> slot links in the kernel.
    pub fn chain_links(&self) -> Result<Vec<(u32, u32, u32)>> {
        let mut out = Vec::new();
        for key in self.class_chain.keys() {
            let Some(value) = self.class_chain.lookup(&key, MapFlags::ANY)? else { continue };
            let k: cgl_class_key = from_bytes(&key);
            out.push((k.ifindex, k.classid, from_bytes::<u32>(&value)));
        }
        Ok(out)
    }

    pub fn chain(&self, slot: u32) -> Result<Chain> {
        let v = self.chains.lookup(&slot.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
        Ok(from_bytes(&v))
    }

    pub fn fn_counters(&self, slot: u32, pos: u32) -> Result<FnCounters> {
        let idx = (slot * MAX_CHAIN_FNS as u32 + pos).to_ne_bytes();
        let mut sum = FnCounters::default();
        if let Some(per_cpu) = self.fn_counters.lookup_percpu(&idx, MapFlags::ANY)? {
            for c in per_cpu {
                let c: cgl_fn_counters = from_bytes(&c);
                sum.packets += c.packets;
                sum.bytes += c.bytes;
                sum.dropped += c.dropped;
            }
        }
        Ok(sum)
    }
}

/// Builds the BPF flow key of an address pair (4 or 16 bytes each) and ports.
pub fn flow_key(
    ifindex: u32,
    src: &[u8],
    dst: &[u8],
    proto: u8,
    sport: u16,
    dport: u16,
) -> Option<FlowKey> {
    if src.len() != dst.len() || !(src.len() == 4 || src.len() == 16) {
        return None;
    }
    let mut key = FlowKey {
        ifindex,
        family: if src.len() == 4 { 4 } else { 6 },
        proto,
        sport,
        dport,
        ..Default::default()
    };
    key.src[..src.len()].copy_from_slice(src);
    key.dst[..dst.len()].copy_from_slice(dst);
    Some(key)
}

/// The addresses of a key, 4 or 16 bytes each.
pub fn key_addrs(key: &FlowKey) -> (Vec<u8>, Vec<u8>) {
    let n = if key.family == 4 { 4 } else { 16 };
    (key.src[..n].to_vec(), key.dst[..n].to_vec())
}

/// The flow a map key names, as the API carries it.
pub fn key_tuple(key: &FlowKey) -> cgloop_proto::v1::FiveTuple {
    let (src, dst) = key_addrs(key);
    cgloop_proto::v1::FiveTuple {
        src_addr: src,
        dst_addr: dst,
        src_port: key.sport as u32,
        dst_port: key.dport as u32,
        ip_protocol: key.proto as u32,
    }
}
