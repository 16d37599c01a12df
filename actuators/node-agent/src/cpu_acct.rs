//! Per-node CPU accounting (`[cpu_accounting] cgroup`): the busy time of each CPU spent on
//! the tasks of one cgroup v2 subtree, measured by bpf/cpu_acct.bpf.c at every context switch.
//!
//! A node agent on its own machine reads `/proc/stat` (the default): the machine is the node.
//! Where several nodes share one machine's cores (the lab emulates every node in a network
//! namespace of one VM), `/proc/stat` charges each node with everyone's load, and a CPU hog
//! "on edge2" reads as an overload of every node. Each emulated node's processes then live in
//! a cgroup of their own and its agent reads only that cgroup's share of each core. cgroup v2
//! keeps no per-CPU usage (only `cpu.stat`'s total), so the split per core comes from BPF.
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, MapHandle};

use crate::advanced::now_monotonic_ns;
use crate::nodes::{CpuSource, CpuTimes};

mod skel {
    #![allow(clippy::all, dead_code, non_camel_case_types, unused_imports)]
    include!(concat!(env!("OUT_DIR"), "/cpu_acct.skel.rs"));
}

/// statfs(2) magic of a cgroup v2 mount.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// The id BPF knows a cgroup v2 directory by (its kernfs inode), after checking that `dir` is
/// one.
pub fn cgroup_id(dir: &Path) -> Result<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .with_context(|| format!("cgroup path {} has a NUL byte", dir.display()))?;
    // SAFETY: a zeroed statfs is valid and the kernel fills it; `c` is a valid C string.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut fs) } != 0 {
        anyhow::bail!("cgroup {}: {}", dir.display(), std::io::Error::last_os_error());
    }
    anyhow::ensure!(
        fs.f_type as i64 == CGROUP2_SUPER_MAGIC,
        "cgroup {} is not on a cgroup v2 file system (per-node accounting needs the unified \
         hierarchy: /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid machine)",
        dir.display()
    );
    let meta = std::fs::metadata(dir).with_context(|| format!("cgroup {}", dir.display()))?;
    anyhow::ensure!(meta.is_dir(), "cgroup {} is not a directory", dir.display());
    Ok(meta.ino())
}

/// The cgroup's level in its hierarchy (0: the root), from the cgroup v2 mounts (`/proc/self/
/// mounts`'s text): the path components below the deepest cgroup2 mount that contains it.
pub fn cgroup_level(dir: &Path, mounts: &str) -> Result<u32> {
    let dir = dir.canonicalize().with_context(|| format!("cgroup {}", dir.display()))?;
    let mount = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .filter(|m| dir.starts_with(m))
        .max_by_key(|m| m.components().count())
        .with_context(|| format!("cgroup {}: under no cgroup2 mount", dir.display()))?;
    Ok((dir.components().count() - mount.components().count()) as u32)
}

/// Decodes one CPU's `struct cpu_acct` (bpf/cpu_acct.bpf.c) into busy ns up to `now_ns`, the
/// slice still running included when its task is the node's.
pub fn busy_until(value: &[u8], now_ns: u64) -> Result<u64> {
    anyhow::ensure!(value.len() >= 20, "cpu_acct value of {} bytes, expected at least 20", value.len());
    let word = |at: usize| u64::from_ne_bytes(value[at..at + 8].try_into().unwrap_or([0; 8]));
    let (busy, since) = (word(0), word(8));
    let in_node = u32::from_ne_bytes(value[16..20].try_into().unwrap_or([0; 4])) != 0;
    let running = if in_node && since > 0 { now_ns.saturating_sub(since) } else { 0 };
    Ok(busy + running)
}

/// The attached program and its per-CPU map; readings are busy ns and monotonic ns per CPU.
pub struct CgroupCpu {
    cgroup: PathBuf,
    map: MapHandle,
    // The online CPUs (what /proc/stat lists): a machine's possible CPUs can be many more.
    cpus: Vec<u32>,
    _link: Link,
}

impl CgroupCpu {
    /// Loads and attaches the accounting for the tasks under `cgroup` (a cgroup v2 directory).
    pub fn attach(cgroup: &Path) -> Result<Self> {
        let id = cgroup_id(cgroup)?;
        let mounts = std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
        let level = cgroup_level(cgroup, &mounts)?;
        let cpus: Vec<u32> = crate::nodes::ProcStat.read()?.into_keys().collect();
        let mut storage = MaybeUninit::uninit();
        let mut open = skel::CpuAcctSkelBuilder::default()
            .open(&mut storage)
            .context("opening the CPU accounting BPF object")?;
        let rodata = open.maps.rodata_data.as_deref_mut().context("the object has no .rodata")?;
        rodata.node_cgroup_id = id;
        rodata.node_cgroup_level = level;
        let skel = open.load().context("loading the CPU accounting program (verifier or permissions)")?;
        let link = skel.progs.cgl_cpu_switch.attach().context("attaching tp_btf/sched_switch")?;
        let map = MapHandle::try_from(&skel.maps.cpu_acct).context("dup fd of map cpu_acct")?;
        tracing::info!("per-node CPU accounting: tasks under cgroup {} (id {id}, level {level})", cgroup.display());
        Ok(Self { cgroup: cgroup.to_path_buf(), map, cpus, _link: link })
    }
}

impl CpuSource for CgroupCpu {
    fn read(&self) -> Result<BTreeMap<u32, CpuTimes>> {
        let values = self
            .map
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .context("reading cpu_acct")?
            .context("cpu_acct has no entry 0")?;
        let now = now_monotonic_ns();
        let mut out = BTreeMap::new();
        for &cpu in &self.cpus {
            let Some(v) = values.get(cpu as usize) else { continue };
            out.insert(cpu, CpuTimes { busy: busy_until(v, now)?, total: now });
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        format!("cgroup {}", self.cgroup.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(busy: u64, since: u64, in_node: u32) -> Vec<u8> {
        [busy.to_ne_bytes().as_slice(), &since.to_ne_bytes(), &in_node.to_ne_bytes(), &[0; 4]].concat()
    }

    #[test]
    fn the_running_slice_counts_only_when_the_node_runs_it() {
        assert_eq!(busy_until(&value(100, 1_000, 1), 1_500).unwrap(), 600);
        assert_eq!(busy_until(&value(100, 1_000, 0), 1_500).unwrap(), 100);
        assert_eq!(busy_until(&value(100, 0, 1), 1_500).unwrap(), 100, "no switch seen yet");
        assert_eq!(busy_until(&value(100, 2_000, 1), 1_500).unwrap(), 100, "read before the switch's stamp");
        assert!(busy_until(&[0; 8], 1).unwrap_err().to_string().contains("8 bytes"));
    }

    #[test]
    fn a_cgroups_level_counts_from_its_mount() {
        let tmp = std::env::temp_dir().join(format!("cgl-level-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("lab/edge1")).unwrap();
        let root = tmp.canonicalize().unwrap();
        let mounts = format!("cgroup2 {} cgroup2 rw 0 0\ntmpfs /run tmpfs rw 0 0\n", root.display());
        assert_eq!(cgroup_level(&tmp, &mounts).unwrap(), 0, "the mount is the root cgroup");
        assert_eq!(cgroup_level(&tmp.join("lab/edge1"), &mounts).unwrap(), 2);
        let err = cgroup_level(&tmp.join("lab"), "tmpfs /run tmpfs rw 0 0\n").unwrap_err().to_string();
        assert!(err.contains("under no cgroup2 mount"), "{err}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn a_path_off_cgroup2_is_refused_by_name() {
        let err = cgroup_id(Path::new("/proc")).unwrap_err().to_string();
        assert!(err.contains("/proc") && err.contains("cgroup v2"), "{err}");
        let err = cgroup_id(Path::new("/no/such/cgroup")).unwrap_err().to_string();
        assert!(err.contains("/no/such/cgroup"), "{err}");
    }

    /// The unified hierarchy's mount point, if the machine has one.
    fn cgroup2_mount() -> Option<PathBuf> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
        mounts.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
    }

    /// Against the real kernel: a busy process pinned to the last CPU, alone in a fresh cgroup,
    /// reads as that core busy and the others idle, whatever else the machine runs. Needs root,
    /// a cgroup v2 mount and two online CPUs; prints "skipped: …" otherwise.
    #[test]
    fn a_cgroups_busy_process_is_charged_to_its_core_only() {
        let cpus: Vec<u32> = crate::nodes::ProcStat.read().unwrap().into_keys().collect();
        let (Some(mount), true, true) = (cgroup2_mount(), unsafe { libc::geteuid() } == 0, cpus.len() >= 2) else {
            eprintln!("skipped: needs root, a cgroup v2 mount and two CPUs");
            return;
        };
        let dir = mount.join(format!("cgl-acct-test-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let last = *cpus.last().unwrap();
        let mut child = std::process::Command::new("/bin/sh").args(["-c", "while :; do :; done"]).spawn().unwrap();
        let pid = child.id() as libc::pid_t;
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
        // SAFETY: a zeroed set with one CPU below CPU_SETSIZE, for the child.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(last as usize, &mut set);
            assert_eq!(libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
        }
        let acct = CgroupCpu::attach(&dir);
        let readings = acct.as_ref().map(|a| {
            let before = a.read().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(600));
            (before, a.read().unwrap())
        });
        child.kill().unwrap();
        child.wait().unwrap();
        std::fs::remove_dir(&dir).unwrap();
        let (before, after) = readings.unwrap();
        let util = crate::nodes::utilization(&before, &after);
        eprintln!("utilisation per core of the cgroup: {util:?}");
        assert!(util[&last] > 0.3, "the busy process's core: {util:?}");
        for c in cpus.iter().filter(|&&c| c != last) {
            assert!(util[c] < 0.05, "core {c} ran nothing of the cgroup: {util:?}");
        }
    }
}
