//! The local journal: desired state and recent actions, so a restarted agent restores what was
//! asked and still answers repeated action ids.
//!
//! Writes are off the RPC path: [`GroupCommit`] runs one writer thread that persists, per
//! commit, the latest desired state and every action recorded since the previous commit (in
//! the order they were applied). A change waits at most `delay` before its commit starts, so a
//! crash of the agent loses at most the changes acknowledged in the last `delay` + one write.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

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
        if self.fsync {
            // The rename itself is durable only once the directory is.
            if let Some(dir) = path.parent() {
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .with_context(|| format!("fsync {}", dir.display()))?;
            }
        }
        Ok(())
    }

    /// Rewrites the desired state (temporary file + rename) and appends the action: the cost
    /// of a change grows with the desired state, not with the number of remembered actions.
    pub fn store(&self, desired: &NodeState, action: Option<&JournalEntry>) -> Result<()> {
        self.store_batch(desired, action.map(std::slice::from_ref).unwrap_or(&[]))
    }

    /// One commit: the desired state, then the actions in order with one append (and one
    /// fsync each when configured). The state is written first: a crash between the two leaves
    /// a state that already contains the actions, and re-applying one of them (its id is not
    /// remembered) sets the same value again.
    pub fn store_batch(&self, desired: &NodeState, actions: &[JournalEntry]) -> Result<()> {
        let journal = AgentJournal { desired: Some(desired.clone()), actions: Vec::new() };
        self.write_atomic(&self.path, &journal.encode_to_vec())?;
        if !actions.is_empty() {
            let path = self.actions_path();
            let mut bytes = Vec::new();
            for a in actions {
                a.encode_length_delimited(&mut bytes)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            f.write_all(&bytes).with_context(|| format!("appending to {}", path.display()))?;
            if self.fsync {
                f.sync_data().with_context(|| format!("fsync {}", path.display()))?;
            }
        }
        Ok(())
    }
}

/// What one commit writes: the change sequence it covers, the desired state after it, and
/// the actions recorded since the previous snapshot, in the order they were applied.
pub struct Snapshot {
    pub seq: u64,
    pub state: NodeState,
    pub actions: Vec<JournalEntry>,
}

#[derive(Default)]
struct CommitState {
    /// Highest change sequence handed to the writer.
    requested: u64,
    /// Highest change sequence written (and fsynced when configured).
    durable: u64,
    /// The last commit's failure, cleared by the next successful one.
    error: Option<String>,
    stop: bool,
}

/// The journal's writer thread (group commit). Callers number their changes 1, 2, 3… and call
/// [`GroupCommit::request`]; the writer takes a [`Snapshot`] from `source`, writes it, and
/// marks its sequence durable. Changes made while a commit runs go into the next one.
pub struct GroupCommit {
    shared: Arc<(Mutex<CommitState>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
    path: PathBuf,
}

/// Pause between attempts after a failed write (disk full, permissions).
const RETRY: Duration = Duration::from_millis(100);

impl GroupCommit {
    /// `delay`: how long the writer waits after the first uncommitted change before writing,
    /// to gather more (the bound on what a crash can lose, plus one write).
    pub fn start(
        journal: Journal,
        delay: Duration,
        source: impl Fn() -> Snapshot + Send + 'static,
    ) -> Self {
        let shared = Arc::new((Mutex::new(CommitState::default()), Condvar::new()));
        let path = journal.path().to_path_buf();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("journal".into())
            .spawn(move || writer(journal, delay, source, s))
            .expect("spawning the journal writer thread");
        Self { shared, thread: Mutex::new(Some(thread)), path }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CommitState> {
        self.shared.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks for changes up to `seq` to be committed; returns at once.
    pub fn request(&self, seq: u64) {
        let mut st = self.lock();
        if seq > st.requested {
            st.requested = seq;
            self.shared.1.notify_all();
        }
    }

    /// Blocks until changes up to `seq` are committed, or a commit fails.
    pub fn wait_durable(&self, seq: u64) -> Result<()> {
        let mut st = self.lock();
        loop {
            if st.durable >= seq {
                return Ok(());
            }
            if let Some(e) = &st.error {
                anyhow::bail!("journal {} write failed: {e}", self.path.display());
            }
            if st.stop && st.requested < seq {
                anyhow::bail!("journal {} writer stopped", self.path.display());
            }
            st = self.shared.1.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits for everything requested so far.
    pub fn flush(&self) -> Result<()> {
        let seq = self.lock().requested;
        self.wait_durable(seq)
    }

    pub fn durable(&self) -> u64 {
        self.lock().durable
    }

    /// The last commit's failure, if the journal is failing now.
    pub fn error(&self) -> Option<String> {
        self.lock().error.clone()
    }

    /// Commits what is pending, then ends the writer thread.
    pub fn stop(&self) {
        {
            let mut st = self.lock();
            st.stop = true;
            self.shared.1.notify_all();
        }
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        self.stop();
    }
}

fn writer(
    journal: Journal,
    delay: Duration,
    source: impl Fn() -> Snapshot,
    shared: Arc<(Mutex<CommitState>, Condvar)>,
) {
    let (lock, cv) = &*shared;
    // Actions taken from the source whose write failed: written first next time.
    let mut unwritten: Vec<JournalEntry> = Vec::new();
    loop {
        let stopping = {
            let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
            while st.requested <= st.durable && !st.stop {
                st = cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.requested <= st.durable {
                return; // stopping with nothing left
            }
            st.stop
        };
        if !delay.is_zero() && !stopping {
            // Gather the changes that follow; a stop ends the wait at once.
            let st = lock.lock().unwrap_or_else(|p| p.into_inner());
            let _ = cv.wait_timeout_while(st, delay, |st| !st.stop);
        }
        let snap = source();
        unwritten.extend(snap.actions);
        let result = journal.store_batch(&snap.state, &unwritten);
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(()) => {
                unwritten.clear();
                st.durable = st.durable.max(snap.seq);
                st.error = None;
                cv.notify_all();
            }
            Err(e) => {
                tracing::error!("journal {}: {e:#}", journal.path().display());
                st.error = Some(format!("{e:#}"));
                cv.notify_all();
                if st.stop {
                    return;
                }
                drop(st);
                std::thread::sleep(RETRY);
            }
        }
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

    /// A stand-in for the agent's state: applied changes numbered 1, 2, 3… and the actions
    /// not yet handed to the writer.
    #[derive(Default)]
    struct Fake {
        seq: u64,
        pending: Vec<JournalEntry>,
        snapshots: u64,
    }

    fn commit(dir: &Path, delay_ms: u64) -> (GroupCommit, Arc<Mutex<Fake>>) {
        let fake = Arc::new(Mutex::new(Fake::default()));
        let f = fake.clone();
        let gc = GroupCommit::start(
            Journal::new(dir.join("journal.pb"), false),
            Duration::from_millis(delay_ms),
            move || {
                let mut f = f.lock().unwrap();
                f.snapshots += 1;
                Snapshot {
                    seq: f.seq,
                    state: NodeState { generation: f.seq, ..Default::default() },
                    actions: std::mem::take(&mut f.pending),
                }
            },
        );
        (gc, fake)
    }

    fn change(gc: &GroupCommit, fake: &Mutex<Fake>, id: &str) -> u64 {
        let seq = {
            let mut f = fake.lock().unwrap();
            f.seq += 1;
            f.pending.push(entry(id, "SetFlowClass", id.as_bytes()));
            f.seq
        };
        gc.request(seq);
        seq
    }

    fn on_disk(dir: &Path) -> (u64, Vec<String>) {
        let (j, warn) = Journal::new(dir.join("journal.pb"), false).load(100_000).unwrap();
        assert!(warn.is_none());
        (
            j.desired.map_or(0, |d| d.generation),
            j.actions.into_iter().map(|e| e.action_id).collect(),
        )
    }

    #[test]
    fn group_commit_persists_every_acknowledged_change_in_order_with_few_writes() {
        let dir = tempfile::tempdir().unwrap();
        let (gc, fake) = commit(dir.path(), 20);
        let ids: Vec<String> = (0..500).map(|i| format!("a{i}")).collect();
        let mut last = 0;
        for id in &ids {
            last = change(&gc, &fake, id);
        }
        gc.wait_durable(last).unwrap();
        assert_eq!(gc.durable(), 500);
        let (generation, got) = on_disk(dir.path());
        assert_eq!(generation, 500, "the state of the last change");
        assert_eq!(got, ids, "every action, in the order applied");
        // 500 changes within one 20 ms window: a handful of writes, not 500.
        let snapshots = fake.lock().unwrap().snapshots;
        assert!(snapshots < 50, "{snapshots} commits for 500 changes");
    }

    #[test]
    fn stop_commits_what_was_acknowledged_without_waiting_for_the_delay() {
        let dir = tempfile::tempdir().unwrap();
        // A delay far beyond the test's patience: stop must not sleep through it.
        let (gc, fake) = commit(dir.path(), 60_000);
        for i in 0..3 {
            change(&gc, &fake, &format!("s{i}"));
        }
        let t = std::time::Instant::now();
        gc.stop();
        assert!(t.elapsed() < Duration::from_secs(30));
        assert_eq!(on_disk(dir.path()), (3, vec!["s0".into(), "s1".into(), "s2".into()]));
    }

    #[test]
    fn restart_after_group_commit_keeps_state_and_actions_and_continues_appending() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (gc, fake) = commit(dir.path(), 1);
            let s = change(&gc, &fake, "x1");
            change(&gc, &fake, "x2");
            gc.wait_durable(s).unwrap();
            gc.flush().unwrap();
        }
        // "Restart": a new writer on the same files appends after what is there.
        let (gc, fake) = commit(dir.path(), 1);
        let s = change(&gc, &fake, "y1");
        gc.wait_durable(s).unwrap();
        assert_eq!(on_disk(dir.path()).1, ["x1", "x2", "y1"]);
    }

    #[test]
    fn a_failing_write_is_reported_to_waiters_and_recovers() {
        let dir = tempfile::tempdir().unwrap();
        // The journal's directory is a file: every write fails.
        let blocker = dir.path().join("d");
        std::fs::write(&blocker, b"").unwrap();
        let (gc, fake) = commit(&blocker, 0);
        let s = change(&gc, &fake, "e1");
        let err = gc.wait_durable(s).unwrap_err().to_string();
        assert!(err.contains("write failed"), "{err}");
        assert!(gc.error().is_some());
        // The disk comes back: the retry writes the action that failed, and the next one.
        std::fs::remove_file(&blocker).unwrap();
        let s = change(&gc, &fake, "e2");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while gc.durable() < s {
            assert!(std::time::Instant::now() < deadline, "never recovered: {:?}", gc.error());
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(gc.error().is_none());
        assert_eq!(on_disk(&blocker).1, ["e1", "e2"]);
    }
}
