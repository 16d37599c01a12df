//! The kernel's cpufreq sysfs interface (Documentation/admin-guide/pm/cpufreq.rst) under a
//! configurable root: one `policyN/` directory per group of CPUs that share a clock.
//!
//! Every write is read back: the kernel may clamp or silently ignore a value (e.g. a minimum
//! above the maximum, `scaling_setspeed` without the userspace governor), and GetPowerState
//! must report what is applied, not what was asked.
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::error::{PowerError, Result};

/// Static facts of one cpufreq policy.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyInfo {
    /// N of `policyN`.
    pub id: u32,
    /// CPUs the policy drives (`affected_cpus`: online ones).
    pub cpus: Vec<u32>,
    pub cpuinfo_min_khz: u32,
    pub cpuinfo_max_khz: u32,
    /// `scaling_available_frequencies`, highest first; empty when the driver has none.
    pub available_khz: Vec<u32>,
    pub available_governors: Vec<String>,
}

/// What one policy reports right now.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyReading {
    pub governor: String,
    pub min_khz: u32,
    pub max_khz: u32,
    pub cur_khz: u32,
    /// `scaling_setspeed`, only meaningful with the userspace governor.
    pub setspeed_khz: Option<u32>,
}

/// One write the backend made, for audit and for tests that check every write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysfsWrite {
    /// Path relative to the cpufreq root, e.g. `policy0/scaling_setspeed`.
    pub file: String,
    pub value: String,
}

#[derive(Debug, Clone)]
pub struct Cpufreq {
    root: PathBuf,
    journal: Option<Arc<Mutex<Vec<SysfsWrite>>>>,
}

impl Cpufreq {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            journal: None,
        }
    }

    /// Record every write in `journal` (tests; an audit trail in the agent).
    pub fn with_journal(mut self, journal: Arc<Mutex<Vec<SysfsWrite>>>) -> Self {
        self.journal = Some(journal);
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// All `policyN` directories, sorted by N.
    pub fn policies(&self) -> Result<Vec<PolicyInfo>> {
        let entries = std::fs::read_dir(&self.root).map_err(|source| PowerError::Io {
            path: self.root.clone(),
            source,
        })?;
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| PowerError::Io {
                path: self.root.clone(),
                source,
            })?;
            let name = entry.file_name();
            if let Some(id) = name.to_str().and_then(|n| n.strip_prefix("policy")) {
                if let Ok(id) = id.parse::<u32>() {
                    ids.push(id);
                }
            }
        }
        ids.sort_unstable();
        ids.into_iter().map(|id| self.policy(id)).collect()
    }

    pub fn policy(&self, id: u32) -> Result<PolicyInfo> {
        let mut available_khz = match self.read_opt(id, "scaling_available_frequencies")? {
            Some(text) => parse_list(&self.file(id, "scaling_available_frequencies"), &text)?,
            None => Vec::new(),
        };
        available_khz.sort_unstable_by(|a, b| b.cmp(a));
        available_khz.dedup();
        let cpus_file = self.file(id, "affected_cpus");
        Ok(PolicyInfo {
            id,
            cpus: parse_list(&cpus_file, &self.read(id, "affected_cpus")?)?,
            cpuinfo_min_khz: self.read_u32(id, "cpuinfo_min_freq")?,
            cpuinfo_max_khz: self.read_u32(id, "cpuinfo_max_freq")?,
            available_khz,
            available_governors: self
                .read(id, "scaling_available_governors")?
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
        })
    }

    pub fn read_policy(&self, id: u32) -> Result<PolicyReading> {
        // `<unsupported>` unless the userspace governor is active.
        let setspeed = self
            .read_opt(id, "scaling_setspeed")?
            .and_then(|text| text.trim().parse::<u32>().ok());
        Ok(PolicyReading {
            governor: self.read(id, "scaling_governor")?.trim().to_owned(),
            min_khz: self.read_u32(id, "scaling_min_freq")?,
            max_khz: self.read_u32(id, "scaling_max_freq")?,
            cur_khz: self.read_u32(id, "scaling_cur_freq")?,
            setspeed_khz: setspeed,
        })
    }

    pub fn set_governor(&self, id: u32, governor: &str) -> Result<()> {
        self.write_checked(id, "scaling_governor", governor)
    }

    /// Set both limits in the order the kernel accepts: raising, the maximum first; lowering,
    /// the minimum first, so that min ≤ max holds after each write.
    pub fn set_limits(&self, id: u32, min_khz: u32, max_khz: u32) -> Result<()> {
        if min_khz > max_khz {
            return Err(PowerError::InvalidPolicy(format!(
                "policy{id}: min {min_khz} kHz > max {max_khz} kHz"
            )));
        }
        let current_max = self.read_u32(id, "scaling_max_freq")?;
        if min_khz > current_max {
            self.write_checked(id, "scaling_max_freq", &max_khz.to_string())?;
            self.write_checked(id, "scaling_min_freq", &min_khz.to_string())
        } else {
            self.write_checked(id, "scaling_min_freq", &min_khz.to_string())?;
            self.write_checked(id, "scaling_max_freq", &max_khz.to_string())
        }
    }

    /// `scaling_setspeed` (userspace governor only).
    pub fn set_speed(&self, id: u32, khz: u32) -> Result<()> {
        self.write_checked(id, "scaling_setspeed", &khz.to_string())
    }

    fn file(&self, id: u32, name: &str) -> PathBuf {
        self.root.join(format!("policy{id}")).join(name)
    }

    fn read(&self, id: u32, name: &str) -> Result<String> {
        let path = self.file(id, name);
        std::fs::read_to_string(&path).map_err(|source| PowerError::Io { path, source })
    }

    fn read_opt(&self, id: u32, name: &str) -> Result<Option<String>> {
        match self.read(id, name) {
            Ok(text) => Ok(Some(text)),
            Err(PowerError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn read_u32(&self, id: u32, name: &str) -> Result<u32> {
        let text = self.read(id, name)?;
        parse_u32(&self.file(id, name), &text)
    }

    fn write_checked(&self, id: u32, name: &str, value: &str) -> Result<()> {
        let path = self.file(id, name);
        // No `create`: a missing attribute is an error, never a new file.
        let mut file = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .map_err(|source| PowerError::Io {
                path: path.clone(),
                source,
            })?;
        file.write_all(value.as_bytes())
            .map_err(|source| PowerError::Io {
                path: path.clone(),
                source,
            })?;
        drop(file);
        if let Some(journal) = &self.journal {
            if let Ok(mut journal) = journal.lock() {
                journal.push(SysfsWrite {
                    file: format!("policy{id}/{name}"),
                    value: value.to_owned(),
                });
            }
        }
        let read = self.read(id, name)?;
        if read.trim() != value {
            return Err(PowerError::NotApplied {
                path,
                wrote: value.to_owned(),
                read: read.trim().to_owned(),
            });
        }
        Ok(())
    }
}

fn parse_u32(path: &Path, text: &str) -> Result<u32> {
    text.trim().parse::<u32>().map_err(|e| PowerError::Parse {
        path: path.to_owned(),
        value: text.trim().to_owned(),
        reason: e.to_string(),
    })
}

fn parse_list(path: &Path, text: &str) -> Result<Vec<u32>> {
    text.split_whitespace()
        .map(|word| parse_u32(path, word))
        .collect()
}
