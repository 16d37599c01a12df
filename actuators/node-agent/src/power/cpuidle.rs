//! C-states through the kernel's cpuidle sysfs (Documentation/admin-guide/pm/cpuidle.rst,
//! "Idle States Control Via sysfs") under a configurable root laid out like
//! `/sys/devices/system/cpu`: `cpuN/cpuidle/stateK/{name,latency,disable}`.
//!
//! "Forbidding C-states" on a core (Xiang thesis §4.4: C1 sleep added +137 % latency) writes `1` to
//! `disable` of every idle state of the core except the polling one (`POLL`, exit latency 0 on
//! x86), so the idle loop spins in C0. Where the core has no `POLL` state (e.g. arm64, whose
//! state0 is WFI), state0 is left enabled: it is the architecture's shallowest idle and the
//! kernel needs one usable state. The values found before the first forbid are kept, and lifting
//! the forbid writes them back (states an administrator had disabled stay disabled). Every write
//! is read back.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::{PowerError, Result};

/// One idle state of one core as the kernel reports it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleState {
    /// K of `stateK`.
    pub index: u32,
    pub name: String,
    /// Exit latency (µs).
    pub latency_us: u64,
    pub disabled: bool,
}

impl IdleState {
    fn is_poll(&self) -> bool {
        self.name.trim() == "POLL"
    }
}

/// The cpuidle tree of a node plus the values found before the agent forbade C-states.
#[derive(Debug)]
pub struct Cpuidle {
    root: PathBuf,
    /// Per forbidden core: `disable` of each state the forbid wrote, as found before.
    saved: BTreeMap<u32, Vec<(u32, bool)>>,
}

impl Cpuidle {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            saved: BTreeMap::new(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn dir(&self, cpu: u32) -> PathBuf {
        self.root.join(format!("cpu{cpu}")).join("cpuidle")
    }

    /// Cores with a `cpuN/cpuidle` directory, sorted.
    pub fn cores(&self) -> Result<Vec<u32>> {
        let entries = std::fs::read_dir(&self.root).map_err(|source| PowerError::Io {
            path: self.root.clone(),
            source,
        })?;
        let mut cores = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            if let Some(n) = name.to_str().and_then(|n| n.strip_prefix("cpu")) {
                if let Ok(n) = n.parse::<u32>() {
                    if self.dir(n).is_dir() {
                        cores.push(n);
                    }
                }
            }
        }
        cores.sort_unstable();
        Ok(cores)
    }

    /// The idle states of one core, by index. A core without cpuidle is an error naming it.
    pub fn states(&self, cpu: u32) -> Result<Vec<IdleState>> {
        let dir = self.dir(cpu);
        let entries = std::fs::read_dir(&dir).map_err(|source| PowerError::Io {
            path: dir.clone(),
            source,
        })?;
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| PowerError::Io {
                path: dir.clone(),
                source,
            })?;
            let Some(index) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("state"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let sdir = entry.path();
            out.push(IdleState {
                index,
                name: read(&sdir.join("name"))?.trim().to_owned(),
                latency_us: parse(&sdir.join("latency"))?,
                disabled: parse::<u8>(&sdir.join("disable"))? != 0,
            });
        }
        if out.is_empty() {
            return Err(PowerError::InvalidPolicy(format!(
                "{} has no stateN directories",
                dir.display()
            )));
        }
        out.sort_by_key(|s| s.index);
        Ok(out)
    }

    /// Indices of the states a forbid disables: all but POLL (or, without POLL, all but state0).
    fn targets(states: &[IdleState]) -> Vec<u32> {
        let has_poll = states.iter().any(IdleState::is_poll);
        states
            .iter()
            .filter(|s| if has_poll { !s.is_poll() } else { s.index != states[0].index })
            .map(|s| s.index)
            .collect()
    }

    /// Whether the kernel reports every C-state of `cpu` disabled (read back, not remembered).
    pub fn forbidden(&self, cpu: u32) -> Result<bool> {
        let states = self.states(cpu)?;
        let targets = Self::targets(&states);
        Ok(!targets.is_empty()
            && states
                .iter()
                .filter(|s| targets.contains(&s.index))
                .all(|s| s.disabled))
    }

    /// Whether this agent forbade C-states on `cpu` (and holds the values to restore).
    pub fn forbidden_by_us(&self, cpu: u32) -> bool {
        self.saved.contains_key(&cpu)
    }

    /// Forbid (`true`) or allow again (`false`) C-states on `cpu`. Allowing a core this agent
    /// did not forbid writes nothing: its idle states are someone else's settings.
    pub fn set(&mut self, cpu: u32, forbid: bool) -> Result<()> {
        if forbid {
            let states = self.states(cpu)?;
            let targets = Self::targets(&states);
            let before: Vec<(u32, bool)> = states
                .iter()
                .filter(|s| targets.contains(&s.index))
                .map(|s| (s.index, s.disabled))
                .collect();
            for &(index, _) in &before {
                if let Err(e) = self.write(cpu, index, true) {
                    // Undo what this call wrote so the core is never left half-forbidden.
                    for &(i, was) in &before {
                        if i == index {
                            break;
                        }
                        let _ = self.write(cpu, i, was);
                    }
                    return Err(e);
                }
            }
            self.saved.entry(cpu).or_insert(before);
        } else if let Some(before) = self.saved.get(&cpu).cloned() {
            for (index, was) in before {
                self.write(cpu, index, was)?;
            }
            self.saved.remove(&cpu);
        }
        Ok(())
    }

    /// Adopt a core found forbidden at start (a restarted agent restoring its journal): the
    /// values before are unknown, so allowing it again enables every state it disables (the
    /// kernel's default).
    pub fn adopt(&mut self, cpu: u32) -> Result<()> {
        if !self.saved.contains_key(&cpu) {
            let states = self.states(cpu)?;
            let targets = Self::targets(&states);
            self.saved.insert(cpu, targets.into_iter().map(|i| (i, false)).collect());
        }
        Ok(())
    }

    fn write(&self, cpu: u32, index: u32, disable: bool) -> Result<()> {
        let path = self.dir(cpu).join(format!("state{index}")).join("disable");
        let value = if disable { "1" } else { "0" };
        std::fs::write(&path, value).map_err(|source| PowerError::Io {
            path: path.clone(),
            source,
        })?;
        let read_back = read(&path)?;
        if read_back.trim() != value {
            return Err(PowerError::NotApplied {
                path,
                wrote: value.into(),
                read: read_back.trim().into(),
            });
        }
        Ok(())
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| PowerError::Io {
        path: path.to_owned(),
        source,
    })
}

fn parse<T: std::str::FromStr>(path: &Path) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    let text = read(path)?;
    text.trim().parse::<T>().map_err(|e| PowerError::Parse {
        path: path.to_owned(),
        value: text.trim().to_owned(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cpu0/cpu1 laid out like this VM's kernel (POLL + haltpoll) and cpu2 like arm64 (no POLL).
    fn fake(root: &Path) {
        let mk = |cpu: u32, k: u32, name: &str, lat: u64, dis: bool| {
            let d = root.join(format!("cpu{cpu}/cpuidle/state{k}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("name"), format!("{name}\n")).unwrap();
            std::fs::write(d.join("latency"), format!("{lat}\n")).unwrap();
            std::fs::write(d.join("disable"), if dis { "1\n" } else { "0\n" }).unwrap();
        };
        for cpu in 0..2 {
            mk(cpu, 0, "POLL", 0, false);
            mk(cpu, 1, "C1", 2, false);
            mk(cpu, 2, "C6", 133, cpu == 1); // an administrator disabled C6 on cpu1
        }
        mk(2, 0, "WFI", 1, false);
        mk(2, 1, "cpu-sleep", 150, false);
        std::fs::create_dir_all(root.join("cpufreq")).unwrap();
    }

    fn disabled(root: &Path, cpu: u32, k: u32) -> String {
        std::fs::read_to_string(root.join(format!("cpu{cpu}/cpuidle/state{k}/disable")))
            .unwrap()
            .trim()
            .to_owned()
    }

    #[test]
    fn forbid_disables_all_but_poll_and_allow_restores_what_was_there() {
        let dir = tempfile::tempdir().unwrap();
        fake(dir.path());
        let mut c = Cpuidle::new(dir.path());
        assert_eq!(c.cores().unwrap(), vec![0, 1, 2]);
        assert!(!c.forbidden(1).unwrap());
        c.set(1, true).unwrap();
        assert_eq!((disabled(dir.path(), 1, 0).as_str(), disabled(dir.path(), 1, 1).as_str()), ("0", "1"));
        assert!(c.forbidden(1).unwrap());
        assert!(!c.forbidden(0).unwrap(), "cpu0 untouched");
        c.set(1, true).unwrap(); // idempotent, keeps the first saved values
        c.set(1, false).unwrap();
        assert_eq!(disabled(dir.path(), 1, 1), "0");
        assert_eq!(disabled(dir.path(), 1, 2), "1", "the administrator's setting comes back");
        // Allowing a core the agent never forbade writes nothing.
        std::fs::write(dir.path().join("cpu0/cpuidle/state1/disable"), "1").unwrap();
        c.set(0, false).unwrap();
        assert_eq!(disabled(dir.path(), 0, 1), "1");
    }

    #[test]
    fn without_poll_state0_stays_enabled() {
        let dir = tempfile::tempdir().unwrap();
        fake(dir.path());
        let mut c = Cpuidle::new(dir.path());
        c.set(2, true).unwrap();
        assert_eq!(disabled(dir.path(), 2, 0), "0");
        assert_eq!(disabled(dir.path(), 2, 1), "1");
        assert!(c.forbidden(2).unwrap());
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        fake(dir.path());
        let c = Cpuidle::new(dir.path());
        let e = c.states(7).unwrap_err().to_string();
        assert!(e.contains("cpu7/cpuidle"), "{e}");
        std::fs::write(dir.path().join("cpu0/cpuidle/state1/latency"), "fast").unwrap();
        let e = c.states(0).unwrap_err().to_string();
        assert!(e.contains("state1/latency") && e.contains("fast"), "{e}");
    }

    #[test]
    fn an_unreadable_state_refuses_the_core_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        fake(dir.path());
        let p = dir.path().join("cpu0/cpuidle/state2/disable");
        std::fs::remove_file(&p).unwrap();
        std::fs::create_dir(&p).unwrap();
        let mut c = Cpuidle::new(dir.path());
        let e = c.set(0, true).unwrap_err().to_string();
        assert!(e.contains("state2/disable"), "{e}");
        assert_eq!(disabled(dir.path(), 0, 1), "0");
        assert!(!c.forbidden_by_us(0));
    }
}
