//! The local journal: desired state and recent actions, rewritten atomically after each change
//! so a restarted agent restores what was asked and still answers repeated action ids.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cgloop_proto::v1::{AgentJournal, JournalEntry, NodeState};
use prost::Message;

/// Recent actions by id, oldest evicted first.
#[derive(Debug, Default)]
pub struct ActionLog {
    entries: HashMap<String, JournalEntry>,
    order: VecDeque<String>,
    capacity: usize,
}

/// What a known action id means for a new request.
pub enum Replay {
    /// Unknown id: apply.
    New,
    /// Same id, same request: answer with the recorded response.
    Same(Vec<u8>),
    /// Same id, different request or method.
    Conflict(String),
}

impl ActionLog {
    pub fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), ..Default::default() }
    }

    pub fn check(&self, action_id: &str, method: &str, request: &[u8]) -> Replay {
        match self.entries.get(action_id) {
            None => Replay::New,
            Some(e) if e.method == method && e.request == request => Replay::Same(e.response.clone()),
            Some(e) => Replay::Conflict(format!(
                "action_id {action_id:?} was already used for a different {} request; use a new \
                 action id for a new change",
                e.method
            )),
        }
    }

    pub fn record(&mut self, entry: JournalEntry) {
        if self.entries.insert(entry.action_id.clone(), entry.clone()).is_none() {
            self.order.push_back(entry.action_id);
        }
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.entries.remove(&old);
            }
        }
    }

    pub fn entries(&self) -> Vec<JournalEntry> {
        self.order.iter().filter_map(|id| self.entries.get(id).cloned()).collect()
    }
}

pub struct Journal {
    path: PathBuf,
    fsync: bool,
}

impl Journal {
    pub fn new(path: impl Into<PathBuf>, fsync: bool) -> Self {
        Self { path: path.into(), fsync }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the journal. A missing file is an empty journal; an unreadable one is moved aside
    /// (kept for inspection) and reported, so the agent starts instead of crash-looping.
    pub fn load(&self) -> Result<(AgentJournal, Option<String>)> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((AgentJournal::default(), None));
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.path.display())),
        };
        match AgentJournal::decode(&bytes[..]) {
            Ok(j) => Ok((j, None)),
            Err(e) => {
                let aside = self.path.with_extension(format!(
                    "corrupt-{}",
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0)
                ));
                std::fs::rename(&self.path, &aside)
                    .with_context(|| format!("moving corrupt journal to {}", aside.display()))?;
                Ok((
                    AgentJournal::default(),
                    Some(format!(
                        "journal {} is not a valid AgentJournal ({e}); moved to {} and starting \
                         with no desired state",
                        self.path.display(),
                        aside.display()
                    )),
                ))
            }
        }
    }

    /// Writes the journal to a temporary file and renames it over the old one.
    pub fn store(&self, desired: &NodeState, actions: Vec<JournalEntry>) -> Result<()> {
        let journal = AgentJournal { desired: Some(desired.clone()), actions };
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(&journal.encode_to_vec())
            .with_context(|| format!("writing {}", tmp.display()))?;
        if self.fsync {
            f.sync_all().with_context(|| format!("fsync {}", tmp.display()))?;
        }
        std::fs::rename(&tmp, &self.path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), self.path.display()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, method: &str, req: &[u8]) -> JournalEntry {
        JournalEntry {
            action_id: id.into(),
            method: method.into(),
            request: req.to_vec(),
            response: b"resp".to_vec(),
        }
    }

    #[test]
    fn same_id_same_request_replays_and_different_request_conflicts() {
        let mut log = ActionLog::new(2);
        log.record(entry("a", "SetFlowClass", b"x"));
        assert!(matches!(log.check("a", "SetFlowClass", b"x"), Replay::Same(r) if r == b"resp"));
        assert!(matches!(log.check("a", "SetFlowClass", b"y"), Replay::Conflict(_)));
        assert!(matches!(log.check("a", "SetChain", b"x"), Replay::Conflict(_)));
        log.record(entry("b", "SetChain", b"x"));
        log.record(entry("c", "SetChain", b"x"));
        assert!(matches!(log.check("a", "SetFlowClass", b"x"), Replay::New), "evicted");
    }

    #[test]
    fn journal_round_trips_and_moves_a_corrupt_file_aside() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::new(dir.path().join("journal.pb"), true);
        assert!(j.load().unwrap().0.desired.is_none());
        let state = NodeState { node_id: "n".into(), generation: 3, ..Default::default() };
        j.store(&state, vec![entry("a", "m", b"r")]).unwrap();
        let (back, warn) = j.load().unwrap();
        assert!(warn.is_none());
        assert_eq!(back.desired.unwrap().generation, 3);
        assert_eq!(back.actions.len(), 1);
        std::fs::write(j.path(), b"\xff\xff\xff garbage").unwrap();
        let (back, warn) = j.load().unwrap();
        assert!(back.desired.is_none());
        assert!(warn.unwrap().contains("not a valid AgentJournal"));
        assert!(!j.path().exists());
    }
}
