//! [`ManifestSet`]: the manifests under a set of paths, re-read as they change, where a file
//! being edited never opens a pod.
//!
//! # Contract
//!
//! The set holds, per file, the objects *in effect*: the ones the last [`ManifestSet::refresh`]
//! settled on. A refresh lists the paths again (directories walked as [`crate::load_paths`]
//! does), reads the files whose fingerprint changed, and decides per file:
//!
//! | what the file is now | objects in effect afterwards | problems |
//! | --- | --- | --- |
//! | gone: `NotFound`, or no longer listed in its directory | none (a clean removal) | — |
//! | not readable (other IO errors, not UTF-8), a YAML/JSON syntax error, or a document whose identity (kind + namespace/name) cannot be read | all of the previous ones | the error, and a warning "keeping N objects from its last good version until it parses again" |
//! | empty (nothing but comments or whitespace) while it had objects | all of the previous ones | a warning: the file is probably being written; delete it to remove them |
//! | parsed cleanly | the objects read now; an object rejected now (an error dropped it) whose previous version existed keeps that version | the new problems, and a warning on each kept object |
//!
//! An object absent from a file that parses cleanly is removed: that is the only way, besides
//! removing the file, to remove one. A directory that cannot be listed keeps every file found
//! under it before. The first time a file is seen there is no previous version: it loads as
//! [`crate::load_paths`] would load it (valid objects load, invalid ones are reported, the good
//! documents of a file with a broken one are salvaged). The same holds for a file whose
//! previous version had no object.
//!
//! The second pass (duplicates, DanmEps to pods, EndpointSlices to Services, implicit
//! namespaces) runs over all files together, so when every file is good,
//! [`ManifestSet::inventory`] equals what [`crate::load_paths`] returns for the same paths.
//!
//! # Noticing changes
//!
//! A file's fingerprint is its size, modification time, status-change time (ctime), inode and
//! device. A file whose fingerprint is unchanged and whose last change is older than its last
//! read by more than [`RACY_WINDOW`] is not read again. Any other file is read and its content
//! hash compared with the last one, and parsed only when the hash differs. So an edit that
//! keeps size and modification time is still seen: within the same timestamp tick the file is
//! still in the racy window and gets hashed, and a modification time restored afterwards
//! (`touch -d`, `cp -p`) moves the ctime, which no user can set.
//!
//! The per-file decision is a pure function (`merge`, unit-tested); the I/O (listing, stat,
//! reading) is kept thin around it.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::assemble::{assemble, Part};
use crate::files::{self, Listed};
use crate::read::{Entry, FileRead, ObjectId, Outcome, ReadObject};
use crate::{warn_if_nothing_loaded, Inventory, LoadOptions, Problem, Severity};

/// How long after its modification time a file is still read again on every refresh, even
/// with an unchanged fingerprint: longer than the coarsest timestamp granularity of the file
/// systems in use (2 s on FAT; ext4 and xfs stamp with the kernel tick).
pub const RACY_WINDOW: Duration = Duration::from_secs(2);

/// How a file changed in a refresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Added,
    Modified,
    Removed,
}

/// One changed file, for the agent's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    pub path: PathBuf,
    pub change: Change,
}

/// What identifies a file's version without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: Option<SystemTime>,
    /// Status change time (seconds, nanoseconds): moves on every write and every `utimes`.
    ctime: (i64, i64),
    inode: u64,
    device: u64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            len: meta.len(),
            mtime: meta.modified().ok(),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            inode: meta.ino(),
            device: meta.dev(),
        }
    }

    /// The later of the modification and status change times (`None` if unknown, or before
    /// 1970: such a file is always read).
    fn changed_at(&self) -> Option<SystemTime> {
        let (secs, nanos) = self.ctime;
        let ctime = SystemTime::UNIX_EPOCH.checked_add(Duration::new(
            u64::try_from(secs).ok()?,
            u32::try_from(nanos).ok()?,
        ))?;
        Some(self.mtime?.max(ctime))
    }
}

/// One tracked file: how it looked when last read, and its objects in effect.
#[derive(Debug)]
struct Tracked {
    stamp: Option<Stamp>,
    /// Content hash of the last read; `None` when it could not be read.
    hash: Option<u64>,
    /// When the last read started.
    read_at: SystemTime,
    state: FileRead,
}

impl Tracked {
    /// Whether the file can be taken as unchanged without reading it.
    fn unchanged(&self, stamp: &Stamp, racy_window: Duration) -> bool {
        let settled = stamp
            .changed_at()
            .and_then(|t| t.checked_add(racy_window))
            .is_some_and(|t| t < self.read_at);
        self.hash.is_some() && self.stamp.as_ref() == Some(stamp) && settled
    }
}

/// The manifests under a set of paths, re-read as they change; a file that is broken (mid-edit)
/// keeps its last good objects. See the [module documentation](self) for the contract.
#[derive(Debug)]
pub struct ManifestSet {
    paths: Vec<PathBuf>,
    opts: LoadOptions,
    files: HashMap<PathBuf, Tracked>,
    /// The last listing, in load order, with kept files expanded.
    order: Vec<Slot>,
    inventory: Inventory,
    /// [`RACY_WINDOW`], shortened by tests.
    racy_window: Duration,
    /// Files read so far (not counting those skipped as unchanged), for tests.
    pub(crate) reads: usize,
}

/// One step of the load order.
#[derive(Debug, Clone, PartialEq)]
enum Slot {
    Problem(Problem),
    File(PathBuf),
}

impl ManifestSet {
    /// A set over `paths` (files and directories); nothing is read before the first
    /// [`ManifestSet::refresh`].
    pub fn new(paths: Vec<PathBuf>, opts: LoadOptions) -> Self {
        Self {
            paths,
            opts,
            files: HashMap::new(),
            order: Vec::new(),
            inventory: Inventory::default(),
            racy_window: RACY_WINDOW,
            reads: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn with_racy_window(mut self, window: Duration) -> Self {
        self.racy_window = window;
        self
    }

    /// The objects in effect and the problems of the last refresh.
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Lists and reads again (see the module documentation); returns the files that changed.
    /// The inventory is rebuilt only when something changed.
    pub fn refresh(&mut self) -> Vec<FileChange> {
        let first = self.order.is_empty() && self.files.is_empty();
        let (order, kept) = self.list();
        let listed: HashSet<&PathBuf> = order
            .iter()
            .filter_map(|s| match s {
                Slot::File(p) => Some(p),
                Slot::Problem(_) => None,
            })
            .collect();
        let mut changes = Vec::new();
        let mut gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !listed.contains(p))
            .cloned()
            .collect();
        let mut visited: HashSet<&PathBuf> = HashSet::new();
        let mut dirty = false;
        for slot in &order {
            let Slot::File(path) = slot else { continue };
            // A file under a directory that cannot be listed now is not examined either.
            if !visited.insert(path) || kept.contains(path) {
                continue;
            }
            match self.observe(path) {
                Observed::Unchanged => {}
                Observed::Gone => gone.push(path.clone()),
                Observed::Touched { stamp, read_at } => {
                    if let Some(t) = self.files.get_mut(path) {
                        (t.stamp, t.read_at) = (Some(stamp), read_at);
                    }
                }
                Observed::Read(tracked) => {
                    let previous = self.files.remove(path);
                    let change = match &previous {
                        None => Some(Change::Added),
                        Some(p) if p.hash != tracked.hash => Some(Change::Modified),
                        Some(_) => None,
                    };
                    let label = path.display().to_string();
                    let previous_state = previous.map(|p| p.state);
                    let state = merge(&label, previous_state.clone(), tracked.state);
                    dirty |= previous_state.as_ref() != Some(&state);
                    self.files
                        .insert(path.clone(), Tracked { state, ..tracked });
                    if let Some(change) = change {
                        changes.push(FileChange {
                            path: path.clone(),
                            change,
                        });
                    }
                }
            }
        }
        gone.sort();
        gone.dedup();
        for path in gone {
            if self.files.remove(&path).is_some() {
                changes.push(FileChange {
                    path,
                    change: Change::Removed,
                });
            }
        }
        let order: Vec<Slot> = order
            .into_iter()
            .filter(|s| !matches!(s, Slot::File(p) if !self.files.contains_key(p)))
            .collect();
        if first || dirty || !changes.is_empty() || order != self.order {
            self.order = order;
            self.inventory = self.assemble();
        }
        changes
    }

    /// The load order now: files as listed, and under a directory that cannot be listed the
    /// files tracked there before (also returned apart: they are kept as they are).
    fn list(&self) -> (Vec<Slot>, HashSet<PathBuf>) {
        let mut out = Vec::new();
        let mut kept_all = HashSet::new();
        for listed in files::list(&self.paths) {
            match listed {
                Listed::File(p) => out.push(Slot::File(p)),
                Listed::Missing { problem, .. } | Listed::Note(problem) => {
                    out.push(Slot::Problem(problem))
                }
                Listed::Unlistable { path, problem } => {
                    out.push(Slot::Problem(problem));
                    let mut kept: Vec<&PathBuf> =
                        self.files.keys().filter(|p| p.starts_with(&path)).collect();
                    kept.sort();
                    for p in kept {
                        kept_all.insert(p.clone());
                        out.push(Slot::File(p.clone()));
                    }
                }
            }
        }
        (out, kept_all)
    }

    /// Stats and, unless clearly unchanged, reads one listed file.
    fn observe(&mut self, path: &Path) -> Observed {
        let observed = self.stat_and_read(path);
        if matches!(observed, Observed::Touched { .. } | Observed::Read(_)) {
            self.reads += 1;
        }
        observed
    }

    fn stat_and_read(&self, path: &Path) -> Observed {
        let previous = self.files.get(path);
        let label = path.display().to_string();
        let read_at = SystemTime::now();
        let unreadable = |e: std::io::Error| {
            if e.kind() == std::io::ErrorKind::NotFound {
                return Observed::Gone;
            }
            let problem = Problem::untyped(
                Severity::Error,
                label.clone(),
                "",
                "",
                crate::LoadError::Io(e).to_string(),
            );
            Observed::Read(Tracked {
                stamp: None,
                hash: None,
                read_at,
                state: FileRead::unreadable(problem),
            })
        };
        let stamp = match std::fs::metadata(path) {
            Ok(meta) => Stamp::of(&meta),
            Err(e) => return unreadable(e),
        };
        if previous.is_some_and(|p| p.unchanged(&stamp, self.racy_window)) {
            return Observed::Unchanged;
        }
        let bytes = match files::read_regular(path) {
            Ok(b) => b,
            Err(e) => return unreadable(e),
        };
        let hash = netwarden_engine::hash::hash_bytes(&bytes);
        if previous.is_some_and(|p| p.hash == Some(hash)) {
            // Same content (touched, or rewritten identically): only remember the new stamp.
            return Observed::Touched { stamp, read_at };
        }
        Observed::Read(Tracked {
            stamp: Some(stamp),
            hash: Some(hash),
            read_at,
            state: files::read_bytes(&label, bytes),
        })
    }

    fn assemble(&self) -> Inventory {
        let parts = self.order.iter().filter_map(|slot| match slot {
            Slot::Problem(p) => Some(Part::Problem(p)),
            Slot::File(path) => self.files.get(path).map(|t| Part::File(&t.state)),
        });
        let mut inventory = assemble(parts, &self.opts);
        warn_if_nothing_loaded(&self.paths, &mut inventory);
        inventory
    }
}

enum Observed {
    /// Fingerprint unchanged and settled: not read.
    Unchanged,
    /// Not found any more.
    Gone,
    /// Read, with the same content as before.
    Touched { stamp: Stamp, read_at: SystemTime },
    /// Read (or failed to read) with new content.
    Read(Tracked),
}

/// The per-file decision (see the module documentation): the objects in effect before
/// (`previous`, `None` the first time the file is seen) and what the file holds now (`seen`)
/// give the new state, carrying this pass's problems. Pure.
pub(crate) fn merge(file: &str, previous: Option<FileRead>, seen: FileRead) -> FileRead {
    let Some(previous) = previous.filter(|p| p.objects().next().is_some()) else {
        return seen;
    };
    let unidentified = seen
        .entries
        .iter()
        .any(|e| e.outcome == Outcome::Unidentified);
    if !seen.parsed_cleanly() || unidentified {
        let n = previous.objects().count();
        let note =
            format!("keeping {n} object(s) from its last good version until it parses again");
        return keep_all(file, previous, seen, note);
    }
    if seen.documents == 0 {
        let n = previous.objects().count();
        let note = format!(
            "the file is empty (still being written?): keeping {n} object(s) from its last \
             good version; delete the file to remove them"
        );
        return keep_all(file, previous, seen, note);
    }
    let mut last_good: HashMap<ObjectId, ReadObject> = HashMap::new();
    for entry in previous.entries {
        if let Outcome::Loaded(object) = entry.outcome {
            if !object.fail_closed {
                last_good.entry(object.id.clone()).or_insert(*object);
            }
        }
    }
    let entries = seen
        .entries
        .into_iter()
        .map(|mut entry| {
            // Rejected now, or only readable in its fail-closed form: the last good version
            // is what its author wrote last that could be read.
            let id = match &entry.outcome {
                Outcome::Rejected(id) => Some(id),
                Outcome::Loaded(object) if object.fail_closed => Some(&object.id),
                _ => None,
            };
            if let Some(id) = id {
                if let Some(old) = last_good.remove(id) {
                    entry.problems.push(Problem {
                        file: old.file.clone(),
                        kind: id.kind.to_string(),
                        object: old.label.clone(),
                        field: String::new(),
                        reason: "keeping its last good version until it is valid again".into(),
                        severity: Severity::Warning,
                    });
                    entry.outcome = Outcome::Loaded(Box::new(old));
                }
            }
            entry
        })
        .collect();
    FileRead {
        file_problems: seen.file_problems,
        entries,
        documents: seen.documents,
    }
}

/// The previous objects, unchanged and without their old problems; this pass's problems
/// (which say what is wrong now) and `note` become the file's problems.
fn keep_all(file: &str, previous: FileRead, seen: FileRead, note: String) -> FileRead {
    let mut file_problems = seen.file_problems;
    file_problems.extend(seen.entries.into_iter().flat_map(|e| e.problems));
    file_problems.push(Problem::untyped(
        Severity::Warning,
        file.to_string(),
        "",
        "",
        note,
    ));
    let entries = previous
        .entries
        .into_iter()
        .filter(|e| matches!(e.outcome, Outcome::Loaded(_)))
        .map(|e| Entry {
            problems: Vec::new(),
            outcome: e.outcome,
        })
        .collect();
    FileRead {
        file_problems,
        entries,
        documents: previous.documents,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "f.yaml";

    fn read(text: &str) -> FileRead {
        crate::stream::read_text(FILE, text)
    }

    /// `Kind ns/name` of the objects in effect.
    fn objects(state: &FileRead) -> Vec<String> {
        state
            .objects()
            .map(|o| format!("{} {}/{}", o.id.kind, o.id.namespace, o.id.name))
            .collect()
    }

    fn reasons(state: &FileRead) -> Vec<(Severity, String)> {
        state
            .file_problems
            .iter()
            .chain(state.entries.iter().flat_map(|e| &e.problems))
            .map(|p| (p.severity, p.reason.clone()))
            .collect()
    }

    fn pod(name: &str, extra: &str) -> String {
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: ns{extra}}}\n"
        )
    }

    const POLICY: &str = "---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: ns}\nspec: {podSelector: {}}\n";

    fn good() -> FileRead {
        read(&format!("{}{POLICY}", pod("a", "")))
    }

    #[test]
    fn first_load_is_what_load_paths_does() {
        // No previous version: the good documents of a broken file are salvaged.
        let seen = read(&format!("{}---\nkind: [broken\n{POLICY}", pod("a", "")));
        let state = merge(FILE, None, seen.clone());
        assert_eq!(state, seen);
        assert_eq!(objects(&state), ["Pod ns/a", "NetworkPolicy ns/deny"]);
        assert_eq!(reasons(&state).len(), 1);
    }

    #[test]
    fn a_file_that_does_not_parse_keeps_all_its_objects() {
        for broken in [
            // Truncated mid-document.
            format!("{}---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: deny, namesp", pod("a", "")),
            // A JSON file cut short.
            "{\"apiVersion\": \"v1\", \"kind\": \"Pod\", \"metadata\": {\"name\": \"a\"".into(),
            // A document whose identity cannot be read: missing name, unquoted `y`, a
            // misspelled kind.
            format!("{}---\napiVersion: v1\nkind: Pod\nmetadata: {{namespace: ns}}\n", pod("a", "")),
            format!("{}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: b, namespace: y}}\n", pod("a", "")),
            format!("{}---\napiVersion: networking.k8s.io/v1\nkind: Networkpolicy\nmetadata: {{name: deny, namespace: ns}}\n", pod("a", "")),
        ] {
            let state = merge(FILE, Some(good()), read(&broken));
            assert_eq!(
                objects(&state),
                ["Pod ns/a", "NetworkPolicy ns/deny"],
                "{broken}"
            );
            let reasons = reasons(&state);
            assert!(
                reasons.iter().any(|(s, _)| *s == Severity::Error),
                "{broken}: the cause is reported"
            );
            assert_eq!(
                reasons.last().unwrap(),
                &(
                    Severity::Warning,
                    "keeping 2 object(s) from its last good version until it parses again".into()
                ),
                "{broken}"
            );
        }
        // Unreadable (an IO error, not UTF-8) is the same.
        let unreadable = crate::files::read_bytes(FILE, vec![b'a', 0xff, b'\n']);
        let state = merge(FILE, Some(good()), unreadable);
        assert_eq!(objects(&state).len(), 2);
    }

    #[test]
    fn broken_again_and_again_still_keeps_the_last_good_version() {
        let once = merge(FILE, Some(good()), read("kind: [\n"));
        let twice = merge(
            FILE,
            Some(once),
            read("apiVersion: v1\nkind: Pod\nmetadata: {name: [\n"),
        );
        assert_eq!(objects(&twice), ["Pod ns/a", "NetworkPolicy ns/deny"]);
        // Only this pass's problems, not an accumulation.
        assert_eq!(reasons(&twice).len(), 2, "{:?}", reasons(&twice));
    }

    #[test]
    fn an_empty_file_is_taken_as_being_written() {
        for empty in ["", "\n\n", "# about to add things\n", "---\n"] {
            let state = merge(FILE, Some(good()), read(empty));
            assert_eq!(objects(&state).len(), 2, "{empty:?}");
            let reasons = reasons(&state);
            assert_eq!(reasons.len(), 1);
            assert_eq!(reasons[0].0, Severity::Warning);
            assert!(
                reasons[0].1.contains("delete the file to remove them"),
                "{reasons:?}"
            );
        }
    }

    #[test]
    fn a_rejected_object_keeps_its_last_good_version() {
        // The policy's podSelector gets a wrong type; the pod is fine and changes; a new pod
        // appears; a rejected newcomer has no last good version and stays out.
        let seen = read(&format!(
            "{}{}---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: deny, namespace: ns}}\nspec: {{podSelector: []}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: c, namespace: ns}}\nspec: [x]\n",
            pod("a", ""),
            pod("b", ""),
        ));
        let state = merge(FILE, Some(good()), seen);
        assert_eq!(
            objects(&state),
            ["Pod ns/a", "Pod ns/b", "NetworkPolicy ns/deny"]
        );
        let kept = state
            .entries
            .iter()
            .find(|e| matches!(&e.outcome, Outcome::Loaded(o) if o.id.name == "deny"))
            .unwrap();
        let Outcome::Loaded(policy) = &kept.outcome else {
            unreachable!()
        };
        let previous = good();
        assert_eq!(policy.as_ref(), previous.objects().nth(1).unwrap());
        assert!(kept.problems.iter().any(|p| p.severity == Severity::Warning
            && p.reason.contains("keeping its last good version")));
        assert!(kept.problems.iter().any(|p| p.severity == Severity::Error));
    }

    #[test]
    fn only_a_clean_file_removes_objects() {
        // The policy is gone from a file that parses cleanly: removed.
        let state = merge(FILE, Some(good()), read(&pod("a", "")));
        assert_eq!(objects(&state), ["Pod ns/a"]);
        assert_eq!(reasons(&state), vec![]);
        // A file whose objects are all of other kinds parses cleanly too.
        let state = merge(
            FILE,
            Some(good()),
            read("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n"),
        );
        assert_eq!(objects(&state), Vec::<String>::new());
    }

    #[test]
    fn without_a_last_good_object_a_broken_file_is_salvaged() {
        let empty_before = read("# nothing\n");
        let seen = read(&format!("{}---\nkind: [broken\n", pod("a", "")));
        let state = merge(FILE, Some(empty_before), seen.clone());
        assert_eq!(state, seen);
    }
}
