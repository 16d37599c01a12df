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

    /// The append-only action log next to the state file.
    fn actions_path(&self) -> PathBuf {
        self.path.with_extension("actions")
    }

    /// Reads the journal: the desired-state file, then the action log. A missing file is an
    /// empty journal; an unreadable state file is moved aside (kept for inspection) and
    /// reported, so the agent starts instead of crash-looping; a torn last action (crash
    /// mid-append) is dropped. The action log is compacted to the last `keep` actions.
    pub fn load(&self, keep: usize) -> Result<(AgentJournal, Option<String>)> {
        let (mut journal, warning) = self.load_state()?;
        let bytes = match std::fs::read(self.actions_path()) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(e).with_context(|| format!("reading {}", self.actions_path().display()))
            }
        };
        let mut buf = &bytes[..];
        while !buf.is_empty() {
            match JournalEntry::decode_length_delimited(&mut buf) {
                Ok(e) => journal.actions.push(e),
                Err(_) => break,
            }
        }
        if journal.actions.len() > keep {
            let drop = journal.actions.len() - keep;
            journal.actions.drain(..drop);
        }
        let mut compact = Vec::new();
        for e in &journal.actions {
            e.encode_length_delimited(&mut compact)?;
        }
        self.write_atomic(&self.actions_path(), &compact)?;
        Ok((journal, warning))
    }

    fn load_state(&self) -> Result<(AgentJournal, Option<String>)> {
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

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let tmp = path.with_extension("tmp");
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes).with_context(|| format!("writing {}", tmp.display()))?;
        if self.fsync {
            f.sync_all().with_context(|| format!("fsync {}", tmp.display()))?;
        }
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        Ok(())
    }

    /// Rewrites the desired state (temporary file + rename) and appends the action: the cost
    /// of a change grows with the desired state, not with the number of remembered actions.
    pub fn store(&self, desired: &NodeState, action: Option<&JournalEntry>) -> Result<()> {
        let journal = AgentJournal { desired: Some(desired.clone()), actions: Vec::new() };
        self.write_atomic(&self.path, &journal.encode_to_vec())?;
        if let Some(action) = action {
            let path = self.actions_path();
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            f.write_all(&action.encode_length_delimited_to_vec())
                .with_context(|| format!("appending to {}", path.display()))?;
            if self.fsync {
                f.sync_data().with_context(|| format!("fsync {}", path.display()))?;
            }
        }
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
        assert!(j.load(10).unwrap().0.desired.is_none());
        let state = NodeState { node_id: "n".into(), generation: 3, ..Default::default() };
        for id in ["a", "b", "c"] {
            j.store(&state, Some(&entry(id, "m", b"r"))).unwrap();
        }
        // A torn append (crash mid-write) loses only that action.
        let mut f = std::fs::OpenOptions::new().append(true).open(j.actions_path()).unwrap();
        f.write_all(&[0x40, 1, 2]).unwrap();
        let (back, warn) = j.load(2).unwrap();
        assert!(warn.is_none());
        assert_eq!(back.desired.unwrap().generation, 3);
        let ids: Vec<_> = back.actions.iter().map(|e| e.action_id.as_str()).collect();
        assert_eq!(ids, ["b", "c"], "compacted to the newest");
        assert_eq!(j.load(10).unwrap().0.actions.len(), 2);
        std::fs::write(j.path(), b"\xff\xff\xff garbage").unwrap();
        let (back, warn) = j.load(10).unwrap();
        assert!(back.desired.is_none());
        assert!(warn.unwrap().contains("not a valid AgentJournal"));
        assert!(!j.path().exists());
    }
}
